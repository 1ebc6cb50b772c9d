/* http/gw_broker.c: the gateway's DEALER to the broker (see gw_broker.h). ZMQ_IMMEDIATE: with no connection,
 * a send fails at once instead of queueing, so the gateway can answer 503. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "gw_broker.h"

struct gw_broker {
    void *ctx, *sock;
    proto_buf buf;
    proto_msg msg;
    zmq_msg_t frame;
    int has_frame;
};

gw_broker *gw_broker_new(const char *endpoint, char *err, size_t errlen) {
    gw_broker *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->ctx = zmq_ctx_new();
    if (!b->ctx) goto fail;
    b->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    if (!b->sock) goto fail;
    int zero = 0, one = 1, hwm = 200000, rivl = 100, rmax = 1000;
    int64_t maxmsg = PROTO_WORKER_MAX_FRAME;
    zmq_setsockopt(b->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(b->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(b->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(b->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(b->sock, ZMQ_RECONNECT_IVL, &rivl, sizeof rivl);
    zmq_setsockopt(b->sock, ZMQ_RECONNECT_IVL_MAX, &rmax, sizeof rmax);
    if (zmq_connect(b->sock, endpoint) != 0) goto fail;
    return b;
fail:
    snprintf(err, errlen, "connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
    gw_broker_destroy(&b);
    return NULL;
}

void gw_broker_destroy(gw_broker **pb) {
    if (!pb || !*pb) return;
    gw_broker *b = *pb;
    if (b->has_frame) zmq_msg_close(&b->frame);
    if (b->sock) zmq_close(b->sock);
    if (b->ctx) zmq_ctx_term(b->ctx);
    proto_buf_free(&b->buf);
    proto_msg_free(&b->msg);
    free(b);
    *pb = NULL;
}

int gw_broker_fd(gw_broker *b) {
    int fd = -1;
    size_t n = sizeof fd;
    zmq_getsockopt(b->sock, ZMQ_FD, &fd, &n);
    return fd;
}

static int s_send(gw_broker *b, int rc) {
    if (rc != 0 || b->buf.failed) return -1;
    return zmq_send(b->sock, b->buf.data, b->buf.len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

int gw_broker_submit(gw_broker *b, const proto_generate *g) {
    if (proto_encode_generate(&b->buf, g) != 0 || b->buf.failed) return -1;
    if (b->buf.len > PROTO_CLIENT_MAX_FRAME) return -2; /* the broker would drop the connection */
    return s_send(b, 0);
}
int gw_broker_cancel(gw_broker *b, const char *id) { return s_send(b, proto_encode_cancel(&b->buf, proto_cstr(id))); }
int gw_broker_status(gw_broker *b) { return s_send(b, proto_encode_status_request(&b->buf, proto_cstr("gw"))); }

const void *gw_broker_frame(gw_broker *b, size_t *len) {
    *len = b->has_frame ? zmq_msg_size(&b->frame) : 0;
    return b->has_frame ? zmq_msg_data(&b->frame) : NULL;
}

int gw_broker_recv(gw_broker *b, const proto_msg **m) {
    for (;;) {
        if (b->has_frame) zmq_msg_close(&b->frame);
        zmq_msg_init(&b->frame);
        b->has_frame = 1;
        if (zmq_msg_recv(&b->frame, b->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            return e == EAGAIN || e == EINTR ? 0 : -1;
        }
        if (zmq_msg_more(&b->frame)) { /* one frame per message: drop the rest */
            int more = 1;
            while (more) {
                zmq_msg_t x;
                zmq_msg_init(&x);
                more = zmq_msg_recv(&x, b->sock, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&x);
                zmq_msg_close(&x);
            }
            continue;
        }
        char derr[128];
        if (proto_decode(zmq_msg_data(&b->frame), zmq_msg_size(&b->frame), &b->msg, derr, sizeof derr) != 0) continue;
        *m = &b->msg;
        return 1;
    }
}
