/* http/gw_server.c: zllm-http's HTTP side and event loop. libmicrohttpd runs without threads of its own
 * (MHD_USE_EPOLL, driven by MHD_run): one epoll set waits on libmicrohttpd's epoll descriptor, the broker's
 * ZeroMQ descriptor and, for every request in flight, its client socket (EPOLLRDHUP), so a client that hangs up
 * has its request cancelled at the broker at once, even while its connection is suspended waiting for tokens.
 *
 * A generate request is validated (http/gw_request.c), sent to the broker under a gateway-made id, and its
 * connection suspended; broker messages resume it: the first token starts a 200 text/event-stream (streaming)
 * or the final gives the whole body; a broker error before the first token gives its HTTP status (400, 404,
 * 429, 503 ...), after it an SSE error event and [DONE]. */
#ifndef ZLLM_GW_SERVER_H
#define ZLLM_GW_SERVER_H
#include <signal.h>
#include <stddef.h>
#include "gw_broker.h"

#define GW_MAX_ALIASES 32

typedef struct {
    const char *host;                   /* address to listen on ("0.0.0.0", "127.0.0.1", "::") */
    int port;                           /* 0: any free port (gw_server_port tells) */
    const char *broker;                 /* the broker's client endpoint */
    const gw_curve *curve;              /* CURVE keys for it, or NULL */
    const char *api_key;                /* NULL: no authentication; else every /v1/ and /tokenize request needs it */
    const char *alias[GW_MAX_ALIASES];  /* --served-model-name: names clients use ... */
    const char *target[GW_MAX_ALIASES]; /* ... and the broker models they stand for ("" = the only one) */
    int n_alias;
    const char *vocab_name[16]; /* --model NAME=PATH: vocabularies for /tokenize and /detokenize */
    const char *vocab_path[16];
    int n_vocab;
    size_t max_body;   /* bytes of a request body (413 beyond) */
    size_t max_header; /* bytes of the request line and headers (libmicrohttpd answers beyond) */
    unsigned max_connections;
    unsigned idle_timeout_s;  /* a connection that sends nothing for this long is closed (slow clients) */
    size_t max_stream_buffer; /* SSE bytes held for a client that does not read; beyond, its request is cancelled */
    /* --stream-write-rate: writes of streams' later tokens per second, all streams together, at most (0: no
     * limit). Each stream gets an equal share: with R requests in flight its later tokens leave at most every
     * R / rate seconds, tokens that come faster in one write together. First tokens and finals are never held. */
    double stream_write_rate;
    int verbose;
} gw_config;

void gw_config_defaults(gw_config *c);

typedef struct gw_server gw_server;

/* Binds and connects; NULL with a message. */
gw_server *gw_server_new(const gw_config *c, char *err, size_t errlen);
int gw_server_port(const gw_server *s);
/* Waits up to ms for the broker's first status reply (so that the first requests do not meet "broker
 * unreachable" while the connection is still being made), less when the handshake fails; 0 when it came, -1
 * otherwise. */
int gw_server_wait_broker(gw_server *s, int ms);
/* why the broker's connection does not come up, when known (a refused CURVE key ...), else "" */
const char *gw_server_broker_problem(const gw_server *s);
/* Runs the event loop until *stop is set; 0, or -1 with a message on a fatal error. */
int gw_server_run(gw_server *s, volatile sig_atomic_t *stop, char *err, size_t errlen);
void gw_server_destroy(gw_server **s);
#endif
