/* http/gw_broker.c: the gateway's DEALER to the broker (see gw_broker.h). ZMQ_IMMEDIATE: with no connection,
 * a send fails at once instead of queueing, so the gateway can answer 503. ZMTP heartbeats (1 s, 3 s timeout)
 * turn a broker that went silent into a dropped connection, as in clients/zllm_client.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "gw_broker.h"

#define MON_EVENTS                                                                                                     \
    (ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |                        \
     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)

struct gw_broker {
    void *ctx, *sock, *mon;
    proto_buf buf;
    proto_msg msg;
    zmq_msg_t frame;
    int has_frame;
    int curve;         /* CURVE keys set */
    int handshaken;    /* a handshake succeeded on the current connection */
    char problem[256]; /* gw_broker_problem */
};

gw_broker *gw_broker_new(const char *endpoint, const gw_curve *curve, char *err, size_t errlen) {
    gw_broker *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const char *what = "connect";
    b->ctx = zmq_ctx_new();
    if (!b->ctx) goto fail;
    b->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    if (!b->sock) goto fail;
    int zero = 0, one = 1, hwm = 200000, rivl = 100, rmax = 1000, hb_ivl = 1000, hb_to = 3000;
    int64_t maxmsg = PROTO_WORKER_MAX_FRAME;
    zmq_setsockopt(b->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(b->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(b->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(b->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(b->sock, ZMQ_RECONNECT_IVL, &rivl, sizeof rivl);
    zmq_setsockopt(b->sock, ZMQ_RECONNECT_IVL_MAX, &rmax, sizeof rmax);
    zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
    if (curve) {
        what = "CURVE keys";
        if (zmq_setsockopt(b->sock, ZMQ_CURVE_SERVERKEY, curve->server_pub, 40) != 0 ||
            zmq_setsockopt(b->sock, ZMQ_CURVE_PUBLICKEY, curve->pub, 40) != 0 ||
            zmq_setsockopt(b->sock, ZMQ_CURVE_SECRETKEY, curve->sec, 40) != 0)
            goto fail;
        b->curve = 1;
    }
    what = "monitor";
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://zllm-http-mon-%p", (void *)b);
    if (zmq_socket_monitor(b->sock, mon_ep, MON_EVENTS) != 0) goto fail;
    b->mon = zmq_socket(b->ctx, ZMQ_PAIR);
    if (!b->mon) goto fail;
    zmq_setsockopt(b->mon, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(b->mon, mon_ep) != 0) goto fail;
    what = "connect";
    if (zmq_connect(b->sock, endpoint) != 0) goto fail;
    return b;
fail:
    snprintf(err, errlen, "%s %s: %s", what, endpoint, zmq_strerror(zmq_errno()));
    gw_broker_destroy(&b);
    return NULL;
}

void gw_broker_destroy(gw_broker **pb) {
    if (!pb || !*pb) return;
    gw_broker *b = *pb;
    if (b->has_frame) zmq_msg_close(&b->frame);
    if (b->mon) zmq_close(b->mon);
    if (b->sock) {
        zmq_socket_monitor(b->sock, NULL, 0);
        zmq_close(b->sock);
    }
    if (b->ctx) zmq_ctx_term(b->ctx);
    proto_buf_free(&b->buf);
    proto_msg_free(&b->msg);
    free(b);
    *pb = NULL;
}

static int s_fd(void *sock) {
    int fd = -1;
    size_t n = sizeof fd;
    zmq_getsockopt(sock, ZMQ_FD, &fd, &n);
    return fd;
}
int gw_broker_fd(gw_broker *b) { return s_fd(b->sock); }
int gw_broker_monitor_fd(gw_broker *b) { return s_fd(b->mon); }

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

/* the sentence for a failed handshake (event ev, its value v: a ZAP status or a ZMTP protocol error) */
static void s_explain(gw_broker *b, uint16_t ev, uint32_t v) {
    const char *key = b->curve ? "this gateway's --curve-key" : "a gateway without CURVE keys";
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        snprintf(b->problem, sizeof b->problem,
                 "the broker refuses %s (ZAP status %u: its public key is not in the broker's --curve-allow "
                 "directory)",
                 key, (unsigned)v);
    else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && v == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        snprintf(b->problem, sizeof b->problem, "%s",
                 b->curve ? "the broker does not use CURVE (drop --curve-server-key and --curve-key)"
                          : "the broker requires CURVE (give --curve-server-key BROKER.pub and --curve-key KEY)");
    else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        snprintf(b->problem, sizeof b->problem, "the handshake with the broker fails (ZMTP protocol error 0x%x)%s",
                 (unsigned)v, b->curve ? ": check --curve-server-key against the broker's --curve-secret" : "");
    else if (!b->problem[0]) /* no detail (the broker hung up): a specific reason seen before stays */
        snprintf(b->problem, sizeof b->problem, "the handshake with the broker fails%s",
                 b->curve ? ": check --curve-server-key against the broker's --curve-secret"
                          : " (a broker that requires CURVE hangs up: give --curve-server-key BROKER.pub and "
                            "--curve-key KEY)");
}

int gw_broker_events(gw_broker *b) {
    int seen = 0;
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, b->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return seen;
        }
        uint16_t e = 0;
        uint32_t v = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&e, zmq_msg_data(&ev), 2);
            memcpy(&v, (char *)zmq_msg_data(&ev) + 2, 4);
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the event's address frame */
            zmq_msg_t addr;
            zmq_msg_init(&addr);
            more = zmq_msg_recv(&addr, b->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&addr);
            zmq_msg_close(&addr);
        }
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            b->handshaken = 1;
            b->problem[0] = 0;
        } else if (e == ZMQ_EVENT_DISCONNECTED) {
            /* a connection closed before its handshake completed: with CURVE, what a wrong server key looks
             * like from this side (the broker cannot read the greeting and hangs up) */
            if (!b->handshaken && b->curve && !b->problem[0]) s_explain(b, 0, 0);
            if (!b->handshaken) seen |= GW_BROKER_REFUSED;
            b->handshaken = 0;
            seen |= GW_BROKER_DROPPED;
        } else if (e) {
            s_explain(b, e, v);
            seen |= GW_BROKER_REFUSED;
        }
    }
}

const char *gw_broker_problem(const gw_broker *b) { return b->problem; }
