/* clients/zllm_client.c: the C client library (see zllm_client.h). A DEALER with linger 0 and ZMQ_IMMEDIATE,
 * so a send with no broker connected fails after the send timeout instead of queueing forever; every receive
 * is bounded by the caller's timeout. Replies are decoded with the hostile-input decoder of common/proto.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "zllm_client.h"

struct zllm_client {
    void *ctx;                     /* ZeroMQ context (owned) */
    void *sock;                    /* DEALER connected to the broker */
    proto_buf buf;                 /* encode buffer */
    proto_msg msg;                 /* last decoded message (its strings point into frame) */
    zmq_msg_t frame;               /* last received frame, kept alive for msg */
    int has_frame;                 /* 1 when frame must be closed */
    unsigned long bad;             /* malformed messages skipped */
};

zllm_client *zllm_client_new(const char *endpoint, char *err, size_t errlen) {
    zllm_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->ctx = zmq_ctx_new();
    if (!c->ctx) goto fail;
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) goto fail;
    int zero = 0, one = 1, sndto = 5000, hwm = 100000, rivl = 100, rmax = 1000;
    int64_t maxmsg = PROTO_WORKER_MAX_FRAME;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &sndto, sizeof sndto);
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &rivl, sizeof rivl);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &rmax, sizeof rmax);
    if (zmq_connect(c->sock, endpoint) != 0) goto fail;
    return c;
fail:
    snprintf(err, errlen, "connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
    zllm_client_destroy(&c);
    return NULL;
}

void zllm_client_destroy(zllm_client **pc) {
    if (!pc || !*pc) return;
    zllm_client *c = *pc;
    if (c->has_frame) zmq_msg_close(&c->frame);
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    proto_buf_free(&c->buf);
    proto_msg_free(&c->msg);
    free(c);
    *pc = NULL;
}

void zllm_client_set_send_timeout(zllm_client *c, int ms) {
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

static int s_send(zllm_client *c, int rc, char *err, size_t errlen) {
    if (rc != 0 || c->buf.failed) {
        snprintf(err, errlen, "encoding failed (out of memory or a field out of range)");
        return -1;
    }
    if (zmq_send(c->sock, c->buf.data, c->buf.len, 0) < 0) {
        int e = zmq_errno();
        snprintf(err, errlen, "%s", e == EAGAIN ? "broker unreachable" : zmq_strerror(e));
        return -1;
    }
    return 0;
}

int zllm_client_submit(zllm_client *c, const proto_generate *g, char *err, size_t errlen) {
    if (!g->id.p || g->id.n < 1 || g->id.n > PROTO_ID_MAX) {
        snprintf(err, errlen, "request id must be 1..%d bytes", PROTO_ID_MAX);
        return -1;
    }
    return s_send(c, proto_encode_generate(&c->buf, g), err, errlen);
}

int zllm_client_cancel(zllm_client *c, const char *id, char *err, size_t errlen) {
    return s_send(c, proto_encode_cancel(&c->buf, proto_cstr(id)), err, errlen);
}

int zllm_client_status(zllm_client *c, const char *id, char *err, size_t errlen) {
    return s_send(c, proto_encode_status_request(&c->buf, proto_cstr(id)), err, errlen);
}

unsigned long zllm_client_bad_messages(const zllm_client *c) { return c->bad; }

int zllm_client_recv(zllm_client *c, int timeout_ms, const proto_msg **msg, char *err, size_t errlen) {
    for (;;) {
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, timeout_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR) return 0;
            snprintf(err, errlen, "poll: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        if (n == 0) return 0;
        if (c->has_frame) zmq_msg_close(&c->frame);
        zmq_msg_init(&c->frame);
        c->has_frame = 1;
        if (zmq_msg_recv(&c->frame, c->sock, ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) continue;
            snprintf(err, errlen, "recv: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        int more = zmq_msg_more(&c->frame);
        if (more) {   /* one frame per message: drop the rest */
            c->bad++;
            while (more) {
                zmq_msg_t x;
                zmq_msg_init(&x);
                if (zmq_msg_recv(&x, c->sock, ZMQ_DONTWAIT) < 0) more = 0;
                else more = zmq_msg_more(&x);
                zmq_msg_close(&x);
            }
            continue;
        }
        char derr[128];
        if (proto_decode(zmq_msg_data(&c->frame), zmq_msg_size(&c->frame), &c->msg, derr, sizeof derr) != 0) {
            c->bad++;
            continue;
        }
        *msg = &c->msg;
        return 1;
    }
}
