/* http/gw_internal.h: what the gateway's own files share (not an interface of the layer): a connection's
 * request state, the server, and the functions one file gives the others. gw_server.c is the HTTP side and the
 * event loop, gw_session.c the requests at the broker, gw_routes.c the endpoints answered at once. */
#ifndef ZLLM_GW_INTERNAL_H
#define ZLLM_GW_INTERNAL_H
#include <stdint.h>
#include <microhttpd.h>
#include <jansson.h>
#include "gw_broker.h"
#include "gw_encode.h"
#include "gw_metrics.h"
#include "gw_request.h"
#include "gw_server.h"
#include "gw_vocab.h"

#define STATUS_EVERY_MS 500 /* status requests to the broker */
#define BROKER_DOWN_MS 3000 /* no status reply for this long: the broker counts as unreachable */
#define BROKER_FAIL_MS 6000 /* ... and requests in flight end with 503 after this long */

typedef enum { R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_TOKENIZE, R_DETOKENIZE, R_METRICS, R_NONE } route;
extern const char *const gw_route_name[]; /* metrics label of each route */

typedef enum {
    S_NEW,    /* reading the request */
    S_WAIT,   /* at the broker, suspended until its first message */
    S_REPLY,  /* a complete response is ready to queue */
    S_STREAM, /* an SSE response is queued */
} conn_state;

/* a client connection (libmicrohttpd's socket context): its socket, registered for hang-ups (EPOLLRDHUP) in the
 * gateway's epoll set once for the connection's life (not per request), and the request it carries now */
typedef struct gw_sock {
    int fd;
    int watched;         /* in the epoll set */
    struct gw_conn *cur; /* the request watched for a hang-up, or NULL */
    int cork_ix;         /* its index in srv->cork + 1 while corked (gw_conn_cork), else 0 */
} gw_sock;

typedef struct gw_conn {
    struct gw_server *srv;
    struct MHD_Connection *conn;
    route rt;
    conn_state state;
    gw_buf body;   /* request body */
    gw_error err;  /* err.status != 0: answer with it once the request is read */
    int slot;      /* index in srv->slots while at the broker or streaming, else -1 */
    char bid[24];  /* the id of the request at the broker */
    int at_broker; /* a generate sent, its final not yet received */
    int suspended;
    int deferred;  /* its resumption waits in srv->defer (gw_session_resume_deferred) */
    gw_sock *sock; /* the connection while the request is watched for hang-ups, else NULL */
    int gone; /* the client hung up */
    int stream, include_usage, started;
    uint32_t n_choices;           /* the request's n (1..PROTO_MAX_N) */
    uint32_t choice_started;      /* bit i: choice i's first chunk is out (chat: it carried the role) */
    int logprobs;                 /* the request asked for logprobs */
    const void *tok;              /* the model's vocabulary (a zl_tokenizer *) for token texts, or NULL */
    size_t text_off[PROTO_MAX_N]; /* completions' text_offset: each choice's text bytes so far */
    json_t *choices;              /* non-streamed n > 1: the choices ended so far (a JSON array) */
    int echo;                     /* completions echo: each choice starts with the prompt */
    int echo_top;                 /* with echo: alternatives per prompt token in its logprobs, -1: no logprobs */
    int plp_ext;                  /* the prompt_logprobs extension's alternatives, -1: not asked for */
    char *echo_text;              /* with echo: the prompt's text (owned) */
    size_t echo_len;
    json_t *echo_lp[PROTO_MAX_N]; /* with echo and logprobs: each choice's prompt logprobs (completions shape) */
    json_t *plp_list;             /* with prompt_logprobs: vLLM's list for the prompt (choice 0's messages) */
    uint32_t usage_completion;    /* completion tokens of the choices ended so far */
    gw_resp resp;
    char model[PROTO_NAME_MAX + 1]; /* the metrics label: the model name as resolved */
    gw_buf out;                     /* SSE bytes not yet handed to libmicrohttpd */
    size_t out_off;
    int eof;          /* nothing follows out */
    int reply_status; /* S_REPLY: status and body */
    char *reply_body;
    const char *reply_type;
    int retry_after;
    int http_status; /* what the client was told (metrics) */
    double t0, t_last;
    double t_wrote; /* when its later tokens were last let out (or its first token), monotonic seconds */
} gw_conn;

struct gw_server {
    gw_config cfg;
    struct MHD_Daemon *mhd;
    gw_broker *broker;
    gw_metrics *metrics;
    gw_vocab *vocab;
    int ep;  /* epoll */
    int lfd; /* the listening socket (accepted here, handed to libmicrohttpd) */
    int port;
    gw_conn **slots; /* requests by slot (broker id "g<slot>.<gen>") */
    uint32_t *gens;
    int *free_slots, n_free, n_slots;
    int *defer, n_defer, cap_defer; /* slots of streams whose later tokens wait (gw_session_resume_deferred) */
    int resume_pending;             /* a connection was resumed since MHD_run last ran (s_mhd_run) */
    double t_defer_due;             /* the earliest time a waiting stream's turn comes (when none is due now) */
    gw_sock **cork;                 /* sockets corked for the turn's urgent writes (NULL: closed since) */
    int n_cork, cap_cork;
    uint64_t next_uid;
    char instance[12];
    /* the broker's last status reply (a copy of the frame and its decode) */
    uint8_t *st_frame;
    size_t st_len;
    proto_msg st_msg;
    int has_status;
    int monitor_ready;                    /* the monitor's descriptor was signalled (or at start): read its events */
    int link_down;                        /* the connection dropped and no status reply came over a new one yet */
    char broker_inst[PROTO_NAME_MAX + 1]; /* the broker instance that answered last ("" before any reply) */
    uint64_t broker_restarts;             /* other instances seen (metrics) */
    double t_status_sent, t_status_recv, t_start;
};


/* gw_server.c: connection helpers */
double gw_now(void);             /* monotonic seconds */
void gw_conn_resume(gw_conn *c); /* resumes c if it is suspended */
void gw_conn_watch(gw_conn *c);  /* watches c's socket for a hang-up (c->slot set) */
void gw_conn_unwatch(gw_conn *c);
void gw_conn_cork(gw_conn *c);   /* holds c's writes of this turn's urgent passes back, to leave as one segment */
void gw_conn_uncork(gw_conn *c); /* ... and lets them go once c's writes are done */
void gw_conn_count(gw_conn *c, int status); /* counts c's outcome once */
enum MHD_Result gw_reply(struct MHD_Connection *conn, int status, const char *type, const char *body, int retry_after);
enum MHD_Result gw_reply_error(gw_conn *c, const gw_error *e);
enum MHD_Result gw_reply_json(gw_conn *c, int status, json_t *o); /* takes o */

/* gw_session.c: the requests at the broker */
const proto_status *gw_session_status(const gw_server *s); /* the broker's last status, or NULL */
int gw_session_broker_up(const gw_server *s);
void gw_session_unreachable(const gw_server *s, gw_error *e); /* the 503 for a broker that does not answer */
int gw_session_alive_workers(const gw_server *s, const char *model);
enum MHD_Result gw_session_generate(gw_conn *c);  /* validates, submits, suspends */
void gw_session_cancel(gw_conn *c, int status);   /* the client left: cancel at the broker */
void gw_session_release(gw_conn *c);              /* gives back c's slot */
gw_conn *gw_session_slot(gw_server *s, int slot); /* the request in a slot, or NULL */
void gw_session_drain(gw_server *s);              /* handles every message the broker sent */
/* resumes at most max of the streams whose later tokens wait and whose turn has come (cfg.stream_write_rate),
 * oldest first; returns how many of those whose turn has come still wait, and sets s->t_defer_due to the
 * earliest time another one's turn comes (HUGE_VAL when none waits) */
int gw_session_resume_deferred(gw_server *s, int max, double now);
void gw_session_fail_all(gw_server *s, int code, const char *msg);
ssize_t gw_session_sse_read(void *cls, uint64_t pos, char *buf, size_t max); /* the SSE body callback */

/* gw_routes.c: the endpoints answered at once */
enum MHD_Result gw_routes_models(gw_conn *c);
enum MHD_Result gw_routes_health(gw_conn *c);
enum MHD_Result gw_routes_tokenize(gw_conn *c); /* /tokenize and /detokenize */
enum MHD_Result gw_routes_metrics(gw_conn *c);
#endif
