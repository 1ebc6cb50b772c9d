/* tests/test_client_limits.c: the C client library's limits and liveness against a stand-in broker (a ROUTER
 * socket in this process, over ipc): a generate over PROTO_CLIENT_MAX_FRAME is refused before sending
 * ("too_large"); a reply from another broker instance while a request is in flight ends zllm_client_recv with
 * "broker_restarted"; a dropped connection with a request in flight ends it with "broker_unreachable" within
 * seconds; after that a new broker's replies are delivered normally. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "test.h"
#include "zllm_client.h"

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *s_router(void *ctx, const char *ep) {
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(r, ep) != 0) {
        zmq_close(r);
        return NULL;
    }
    return r;
}

/* receives one routed message; keeps the identity in id[*idn] */
static int s_take(void *r, uint8_t *id, size_t *idn) {
    zmq_pollitem_t it = {r, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 5000) != 1) return -1;
    int n = zmq_recv(r, id, 255, 0);
    if (n < 0) return -1;
    *idn = (size_t)n;
    char body[4096];
    int more = 1;
    while (more) {
        if (zmq_recv(r, body, sizeof body, 0) < 0) return -1;
        size_t ms = sizeof more;
        zmq_getsockopt(r, ZMQ_RCVMORE, &more, &ms);
    }
    return 0;
}

static void s_reply_token(void *r, const uint8_t *id, size_t idn, const char *rid, const char *inst) {
    proto_buf b = {0};
    int32_t tok = 5;
    proto_encode_token(&b, proto_cstr(rid), &tok, 1, proto_cstr("x"));
    proto_buf_add_str(&b, "inst", proto_cstr(inst));
    zmq_send(r, id, idn, ZMQ_SNDMORE);
    zmq_send(r, b.data, b.len, 0);
    proto_buf_free(&b);
}

static int s_submit(zllm_client *c, const char *id, const char *prompt, char *err, size_t errlen) {
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr(id);
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr(prompt);
    return zllm_client_submit(c, &g, err, errlen);
}

int main(void) {
    char ep[128], err[256];
    snprintf(ep, sizeof ep, "ipc:///tmp/zllm-test-client-%d", (int)getpid());
    void *ctx = zmq_ctx_new();
    void *r = s_router(ctx, ep);
    CHECK(r != NULL, "bind %s", ep);
    zllm_client *c = zllm_client_new(ep, err, sizeof err);
    CHECK(c != NULL, "client: %s", err);
    if (!r || !c) return test_report();

    /* too large: refused before sending */
    size_t big_n = (2u << 20);
    char *big = malloc(big_n + 1);
    memset(big, 'a', big_n);
    big[big_n] = 0;
    int rc = s_submit(c, "big", big, err, sizeof err);
    CHECK(rc == -1 && strncmp(err, "too_large", 9) == 0 && strstr(err, "1048576"), "2 MiB prompt: %d %s", rc, err);
    free(big);

    /* first instance answers, then another one while the request is in flight */
    uint8_t id[256];
    size_t idn = 0;
    CHECK(s_submit(c, "r1", "hello", err, sizeof err) == 0, "submit r1: %s", err);
    CHECK(s_take(r, id, &idn) == 0, "the stand-in broker got r1");
    s_reply_token(r, id, idn, "r1", "aaaaaaaaaaaaaaaa");
    const proto_msg *m = NULL;
    rc = zllm_client_recv(c, 3000, &m, err, sizeof err);
    CHECK(rc == 1 && m->type == PROTO_TOKEN && strcmp(zllm_client_broker_instance(c), "aaaaaaaaaaaaaaaa") == 0,
          "token from instance a: rc %d inst '%s'", rc, zllm_client_broker_instance(c));
    s_reply_token(r, id, idn, "r1", "bbbbbbbbbbbbbbbb");
    rc = zllm_client_recv(c, 3000, &m, err, sizeof err);
    CHECK(rc == -1 && strncmp(err, "broker_restarted", 16) == 0, "another instance: %d %s", rc, err);

    /* the connection drops with a request in flight */
    CHECK(s_submit(c, "r2", "hello", err, sizeof err) == 0, "submit r2: %s", err);
    CHECK(s_take(r, id, &idn) == 0, "the stand-in broker got r2");
    zmq_close(r);
    double t0 = s_now();
    rc = 0;
    while (rc == 0 && s_now() - t0 < 10) rc = zllm_client_recv(c, 200, &m, err, sizeof err);
    double dt = s_now() - t0;
    CHECK(rc == -1 && strncmp(err, "broker_unreachable", 18) == 0 && dt < 5, "drop: %d after %.2f s: %s", rc, dt, err);

    /* a new broker on the same endpoint: its replies are delivered (no second loss reported) */
    r = s_router(ctx, ep);
    CHECK(r != NULL, "rebind %s", ep);
    zllm_client_set_send_timeout(c, 5000);
    CHECK(s_submit(c, "r3", "hello", err, sizeof err) == 0, "submit r3: %s", err);
    CHECK(r && s_take(r, id, &idn) == 0, "the new broker got r3");
    if (r) s_reply_token(r, id, idn, "r3", "cccccccccccccccc");
    rc = zllm_client_recv(c, 3000, &m, err, sizeof err);
    CHECK(rc == 1 && m->type == PROTO_TOKEN && proto_str_eq(m->token.id, "r3"), "r3's token delivered: %d %s", rc,
          rc < 0 ? err : "");

    zllm_client_destroy(&c);
    if (r) zmq_close(r);
    zmq_ctx_term(ctx);
    return test_report();
}
