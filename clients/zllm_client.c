/* clients/zllm_client.c: the C client library (see zllm_client.h). A DEALER with linger 0 and ZMQ_IMMEDIATE,
 * so a send with no broker connected fails after the send timeout instead of queueing forever; every receive
 * is bounded by the caller's timeout. Replies are decoded with the hostile-input decoder of common/proto.c.
 *
 * Liveness: ZMTP heartbeats (1 s, 3 s timeout) on the socket and a socket monitor for disconnects. While
 * generates are in flight, a dropped connection (the broker died, was restarted, or went silent for 3 s) or a
 * reply from another broker instance ends zllm_client_recv with -1 and a message starting with the code
 * (broker_unreachable / broker_restarted): a restarted broker knows nothing of the old requests. After a
 * drop the next send opens a fresh socket, so a request sent then never rides the dead connection. */
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
    void *mon;                     /* PAIR receiving the DEALER's disconnect events */
    unsigned inflight;             /* generates submitted whose final has not come */
    unsigned lost;                 /* requests lost to a drop seen at submit, reported by the next recv */
    char inst[65];                 /* the broker instance that answered last ("" before any reply) */
    char *endpoint;                /* the broker's endpoint (owned) */
    int sndtimeo;                  /* send timeout, ms */
    unsigned generation;           /* sockets opened so far (names each monitor endpoint) */
    int reopen;                    /* 1 after a drop: the next send opens a fresh socket first */
};

/* Opens the DEALER and its disconnect monitor and connects them: 0, or -1 with zmq_errno set. */
static int s_open(zllm_client *c) {
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) return -1;
    int zero = 0, one = 1, hwm = 100000, rivl = 100, rmax = 1000, hb_ivl = 1000, hb_to = 3000;
    int64_t maxmsg = PROTO_WORKER_MAX_FRAME;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &c->sndtimeo, sizeof c->sndtimeo);
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &rivl, sizeof rivl);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL_MAX, &rmax, sizeof rmax);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
    char mon_ep[80];
    snprintf(mon_ep, sizeof mon_ep, "inproc://zllm-client-mon-%p-%u", (void *)c, c->generation++);
    if (zmq_socket_monitor(c->sock, mon_ep, ZMQ_EVENT_DISCONNECTED) != 0) return -1;
    c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
    if (!c->mon) return -1;
    zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(c->mon, mon_ep) != 0) return -1;
    return zmq_connect(c->sock, c->endpoint);
}

static void s_close(zllm_client *c) {
    if (c->mon) zmq_close(c->mon);
    if (c->sock) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->sock);
    }
    c->mon = c->sock = NULL;
}

zllm_client *zllm_client_new(const char *endpoint, char *err, size_t errlen) {
    zllm_client *c = calloc(1, sizeof *c);
    if (!c || !(c->endpoint = strdup(endpoint))) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->sndtimeo = 5000;
    c->ctx = zmq_ctx_new();
    if (!c->ctx || s_open(c) != 0) goto fail;
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
    s_close(c);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->endpoint);
    proto_buf_free(&c->buf);
    proto_msg_free(&c->msg);
    free(c);
    *pc = NULL;
}

void zllm_client_set_send_timeout(zllm_client *c, int ms) {
    c->sndtimeo = ms;
    if (c->sock) zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

/* Reads the monitor's pending events: 1 when the connection dropped since the last call, else 0. */
static int s_disconnected(zllm_client *c) {
    int dropped = 0;
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return dropped;
        }
        if (zmq_msg_size(&ev) >= 2) {
            uint16_t e;
            memcpy(&e, zmq_msg_data(&ev), 2);
            if (e == ZMQ_EVENT_DISCONNECTED) {
                dropped = 1;
                c->reopen = 1;
                c->inst[0] = 0;
            } /* the next broker is new */
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the event's address frame */
            zmq_msg_init(&addr);
            if (zmq_msg_recv(&addr, c->mon, ZMQ_DONTWAIT) < 0) more = 0;
            else more = zmq_msg_more(&addr);
            zmq_msg_close(&addr);
        }
    }
}

/* After a drop, replaces the socket before its next use: the dropped connection's pipe can still take a
 * message for a short while and lose it. 0, or -1 with err. */
static int s_ready(zllm_client *c, char *err, size_t errlen) {
    if (!c->reopen) return 0;
    s_close(c);
    if (s_open(c) != 0) {
        snprintf(err, errlen, "reconnect %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        s_close(c);
        return -1;
    }
    c->reopen = 0;
    return 0;
}

static int s_send(zllm_client *c, int rc, char *err, size_t errlen) {
    if (rc != 0 || c->buf.failed) {
        snprintf(err, errlen, "encoding failed (out of memory or a field out of range)");
        return -1;
    }
    if (c->buf.len > PROTO_CLIENT_MAX_FRAME) {
        snprintf(err, errlen, "too_large: the message is %zu bytes; the broker accepts at most %u", c->buf.len,
                 PROTO_CLIENT_MAX_FRAME);
        return -1;
    }
    if (s_ready(c, err, errlen) != 0) return -1;
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
    /* a drop before this request concerns only the older ones: the next recv reports them */
    if (s_disconnected(c)) {
        c->lost += c->inflight;
        c->inflight = 0;
    }
    if (s_send(c, proto_encode_generate(&c->buf, g), err, errlen) != 0) return -1;
    c->inflight++;
    return 0;
}

int zllm_client_cancel(zllm_client *c, const char *id, char *err, size_t errlen) {
    return s_send(c, proto_encode_cancel(&c->buf, proto_cstr(id)), err, errlen);
}

int zllm_client_status(zllm_client *c, const char *id, char *err, size_t errlen) {
    return s_send(c, proto_encode_status_request(&c->buf, proto_cstr(id)), err, errlen);
}

unsigned long zllm_client_bad_messages(const zllm_client *c) { return c->bad; }

const char *zllm_client_broker_instance(const zllm_client *c) { return c->inst; }

/* the broker's instance id of a decoded reply: 0, or -1 when another instance answers while requests of the
 * previous one are in flight (they are lost: the in-flight count restarts) */
static int s_check_instance(zllm_client *c, const proto_msg *m, char *err, size_t errlen) {
    if (!m->inst.p) return 0;
    int same = strlen(c->inst) == m->inst.n && memcmp(c->inst, m->inst.p, m->inst.n) == 0;
    if (same) return 0;
    int had = c->inst[0] != 0;
    proto_str_copy(m->inst, c->inst, sizeof c->inst);
    if (!had || c->inflight == 0) return 0;
    snprintf(err, errlen, "broker_restarted: a new broker instance (%s) answers; %u request(s) in flight were lost",
             c->inst, c->inflight);
    c->inflight = 0;
    return -1;
}

int zllm_client_recv(zllm_client *c, int timeout_ms, const proto_msg **msg, char *err, size_t errlen) {
    if (c->lost) {
        snprintf(err, errlen,
                 "broker_unreachable: the connection to the broker dropped; %u request(s) in flight "
                 "are lost",
                 c->lost);
        c->lost = 0;
        return -1;
    }
    if (!c->sock && s_ready(c, err, errlen) != 0) return -1;
    for (;;) {
        zmq_pollitem_t it[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, 2, timeout_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR) return 0;
            snprintf(err, errlen, "poll: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        if (!(it[0].revents & ZMQ_POLLIN)) { /* replies already here go first, then a drop counts */
            if (s_disconnected(c) && c->inflight > 0) {
                snprintf(err, errlen,
                         "broker_unreachable: the connection to the broker dropped; %u request(s) in "
                         "flight are lost",
                         c->inflight);
                c->inflight = 0;
                return -1;
            }
            if (n == 0 || timeout_ms == 0) return 0;
            continue; /* a drop with nothing in flight: wait again (the timeout restarts) */
        }
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
        if (s_check_instance(c, &c->msg, err, errlen) != 0) return -1;
        if (c->inflight > 0 && ((c->msg.type == PROTO_FINAL && c->msg.final.left == 0) ||
                                (c->msg.type == PROTO_ERROR && c->msg.error.code == PROTO_CODE_DUPLICATE_ID)))
            c->inflight--;
        *msg = &c->msg;
        return 1;
    }
}
