/* broker/broker.c: the zllm broker's state and single-threaded event loop (see broker.h).
 * ---------------------------------------------------------------------------------------------------------
 * Layout: state structs -> hash maps -> sockets and sends -> request lifecycle (finish, text) -> workers
 * (register, death) -> client messages -> worker messages -> dispatch -> timers -> loop.
 *
 * Requests live in two intrusive hash maps (by client identity + request id, and by rid), in one global list
 * (deadline scan), and either in their model's FIFO queue or in their worker's list. The hot path (an `out`
 * entry -> detokenize -> `token` to the client) reuses one decoded message, one encode buffer and one text
 * scratch; only a request's own text buffer grows (amortised). */
#include "broker.h"
#include "bk_route.h"
#include "bk_stop.h"
#include "bk_zap.h"
#include "zkey.h"
#include "gguf.h"
#include "grammar.h"
#include "kv_hash.h"
#include "proto.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define BK_CID_MAX 255                   /* bytes of a routing identity: libzmq's own limit (ZMQ_ROUTING_ID is 1..255 */
#define BK_WID_MAX 255                   /* bytes), so every peer a ROUTER accepts fits and gets its replies */
#define BK_MAX_WORKERS PROTO_MAX_WORKERS /* all models together; each model has its own cap (max_workers) */
#define BK_CLIENT_SOCKET_MAX                                                                                           \
    (8u * PROTO_CLIENT_MAX_FRAME) /* the client socket's ZMQ_MAXMSGSIZE: frames over
                                   PROTO_CLIENT_MAX_FRAME up to this get a too_large answer from the broker's own
                                   check; only larger ones make libzmq drop the connection */
#define BK_RECV_BATCH   512     /* messages read from one socket per loop turn */
#define BK_TICK_MS      20      /* timer granularity */
#define BK_MAX_LOST 256         /* clients found gone in one loop turn */
#define BK_ASSIGN_TOKENS (1u << 20) /* prompt tokens per `assign` (<= 5 bytes each: < 16 MiB frames) */
#define BK_ASSIGN_FORMAT_BYTES (4u << 20) /* response_format text per `assign` (with the tokens: < 16 MiB) */
#define BK_GRAMMAR_CACHE 64 /* compiled response_format grammars kept (a repeated schema is checked at no cost) */

enum { RQ_QUEUED = 1, RQ_RUNNING = 2 };

typedef struct bk_model bk_model;
typedef struct bk_worker bk_worker;

/* one generated token's logprobs, kept for a non-streaming final */
typedef struct {
    float logprob;
    int present;
    uint32_t n_top;
    int32_t top_id[PROTO_MAX_TOP_LOGPROBS];
    float top_logprob[PROTO_MAX_TOP_LOGPROBS];
} bk_lp;

typedef struct bk_req {
    /* identity */
    uint64_t rid;                 /* broker sequence id, unique for the broker's lifetime */
    uint8_t cid[BK_CID_MAX];      /* client routing identity */
    uint32_t cid_len;
    char id[PROTO_ID_MAX];        /* client request id (not NUL-terminated) */
    uint32_t id_len;
    uint64_t hkey;                /* hash of (cid, id) */
    /* request */
    bk_model *model;
    int32_t *prompt;              /* [n_prompt] token ids (owned) */
    uint32_t n_prompt;
    uint32_t max_tokens;
    proto_sampling sampling;
    int32_t stop_ids[PROTO_MAX_STOP_IDS];
    uint32_t n_stop_ids;
    bk_stops stops;               /* points into stop_text */
    char *stop_text;              /* owned copy of the stop strings */
    int format_kind;              /* PROTO_FORMAT_* (structured output), NONE without */
    char *format_text;            /* owned copy of its text (format_len bytes), NULL for none */
    uint32_t format_len;
    int stream;
    proto_bias *bias;      /* [sampling.n_bias] owned copy (sampling.bias points here) */
    uint32_t index;        /* its completion among the generate's n (0..n_choices-1) */
    uint32_t n_choices;    /* the generate's n: each completion is a request of its own, same id */
    uint64_t share_rid;    /* rid of completion 0 (index > 0): the worker may copy its prompt KV; 0: none */
    int32_t priority;      /* PROTO_PRIORITY_MIN..MAX: the queue admits higher first, FIFO within one */
    uint64_t *bhash;       /* [n_bhash] chained block hashes of the prompt (routing), for block size bhash_bs */
    int n_bhash, bhash_bs; /* bhash_bs 0: not computed yet */
    /* progress */
    int state;                    /* RQ_QUEUED / RQ_RUNNING */
    bk_worker *worker;            /* when running */
    double t_recv, t_admit, t_first, deadline; /* ms, monotonic */
    uint32_t n_gen;               /* tokens generated */
    uint32_t n_sent;              /* tokens sent to the client in `token` messages */
    uint32_t plp_next;            /* prompt logprobs (sampling.prompt_lp): the next prompt position to send; rows
                                   * below it that a worker sends again (after a requeue) are dropped */
    int32_t *gen;                 /* [n_gen] all ids (non-streaming only), cap gen_cap */
    bk_lp *lps;                   /* [n_gen] their logprobs (non-streaming with logprobs only), cap gen_cap */
    uint32_t gen_cap;
    zl_detok detok;
    char *text;                   /* [text_len] text not yet sent (streaming: held back; else all) */
    size_t text_len, text_cap;
    size_t scan_from;             /* stop-string search restarts here */
    uint64_t out_mark;            /* serial of the last `out` that named it (one entry per message) */
    /* links */
    struct bk_req *h_next;        /* (cid,id) map chain */
    struct bk_req *r_next;        /* rid map chain */
    struct bk_req *prev, *next;   /* queue or worker list */
    struct bk_req *all_prev, *all_next; /* global list */
} bk_req;

struct bk_model {
    char name[PROTO_NAME_MAX + 1];
    zl_tokenizer *tok;
    char *piece;                  /* [piece_cap] scratch for one token's text (req_token) */
    size_t piece_cap;             /* tokenizer_stream_cap: the longest piece never runs short */
    uint32_t n_ctx;               /* the model's trained context (0 = unknown) */
    int32_t n_vocab;
    uint64_t kv_key;         /* kv_hash_model(name): the key of its block hashes */
    uint32_t kv_block;       /* block size routing hashes prompts with: the first one a worker registered (a
                                worker with another size is routed as if it cached nothing) */
    bk_req *q_head, *q_tail; /* queued requests: by priority, FIFO within one */
    uint32_t n_queued;
    uint32_t n_workers; /* registered workers of this model (its cap: cfg.max_workers) */
    uint64_t refused;   /* registrations refused: the table was full of workers that served */
};

struct bk_worker {
    uint8_t wid[BK_WID_MAX];      /* routing identity */
    uint32_t wid_len;
    char name[PROTO_NAME_MAX + 1];
    char device[PROTO_NAME_MAX + 1];
    bk_model *model;
    uint32_t max_batch, n_slots, n_ctx, hb_ms;
    uint32_t used;                /* slots reserved by the broker */
    uint32_t hb_free, hb_running; /* as last reported */
    uint64_t step;
    double last_seen, last_step_change;
    bk_req *head, *tail;          /* its running requests */
    int failed;                   /* found dead/unreachable: removed at the next safe point */
    uint64_t served;              /* requests it brought to stop/length: a worker that served is never evicted */
    double t_reg;                 /* registration time: eviction takes the oldest worker that never served */
    uint64_t prefills_shared;     /* its heartbeat's count, as last reported */
    /* KV blocks (docs/kv-cache.md): kv_block 0 when it reports none */
    uint32_t kv_block, kv_blocks; /* as registered */
    proto_kv kv;                  /* its last KV report (counters only: hashes go to summary) */
    bk_summary *summary;          /* block hashes it holds (cache-aware routing); NULL until it has kv_block */
};

/* event counts since start, reported by `status` (docs/protocol.md lists their meaning) */
typedef struct {
    uint64_t bad_messages;        /* undecodable / wrong-frame-count / wrong-direction messages */
    uint64_t dropped;             /* sends that failed (peer gone or its HWM full) */
    uint64_t requeued;            /* requests put back in the queue after their worker failed */
    uint64_t worker_deaths;       /* workers removed as dead, hung or unreachable */
    uint64_t unknown_ids;         /* cancels for ids not in flight */
    uint64_t duplicate_ids;       /* generates reusing an id in flight */
    uint64_t overloaded, timeouts, cancelled, completed, errors; /* finals by kind */
    uint64_t accepted;            /* generates that became requests */
    uint64_t tokens_out;          /* tokens received from workers for live requests */
    uint64_t clients_lost;        /* clients found gone or not reading: their requests cancelled */
    uint64_t late_outputs;        /* `out` entries for rids no longer known (after cancel, or another worker's) */
    uint64_t bad_workers;         /* registrations refused (unknown model, vocabulary, too many) */
    uint64_t reregisters;         /* `reregister` sent to unknown workers */
    uint64_t worker_errors;       /* `out` entries with fin = 4 */
    uint64_t lying_workers;       /* workers forgotten for an `out` the protocol forbids (id outside the vocabulary,
                                     a rid twice, a rid not assigned to it) */
    uint64_t evicted_workers;     /* idle workers that never served, evicted for a new registration */
    uint64_t too_large;           /* client frames over PROTO_CLIENT_MAX_FRAME */
    uint64_t prefills_shared;     /* completions of a generate with n > 1 whose prompt KV a worker copied from a
                                     sibling instead of prefilling it (the workers' heartbeats) */
    uint64_t cache_routed;        /* requests sent to a worker holding a prefix of their prompt */
    uint64_t cache_balanced;      /* requests sent elsewhere than the longest prefix because of load */
} bk_counters;

struct broker {
    bk_config cfg;
    void *ctx, *cs, *ws;          /* zmq context, client ROUTER, worker ROUTER */
    bk_zap *zap;
    char cs_ep[256], ws_ep[256];
    bk_model models[BK_MAX_MODELS];
    int n_models;
    bk_worker *workers[BK_MAX_WORKERS];
    int n_workers;
    bk_req **hmap, **rmap;        /* [nbuckets] chains */
    uint32_t nbuckets, n_reqs, n_queued, n_running;
    uint64_t queued_tokens;       /* prompt tokens of the queued requests */
    bk_req *all;                  /* global list head */
    uint64_t next_rid;
    uint64_t out_serial;          /* counts `out` messages (duplicate-rid check) */
    char inst[17];                /* this broker instance's id (16 hex digits), on every client-bound message */
    proto_msg msg;                /* reused decode target */
    proto_buf out;                /* reused encode buffer */
    proto_seq *seqs;              /* [seqs_cap] assign scratch */
    uint32_t seqs_cap;
    zg_cache *grammars; /* response_format texts already compiled (validation before queuing) */
    uint8_t lost[BK_MAX_LOST][BK_CID_MAX];
    uint32_t lost_len[BK_MAX_LOST];
    int n_lost;
    int draining;
    double drain_end, last_tick, last_hb;
    bk_counters c;
};

static volatile sig_atomic_t s_stop;
static void on_signal(int sig) { (void)sig; s_stop = 1; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void berr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void logf_(broker *b, const char *fmt, ...) {
    if (!b->cfg.verbose) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zllm-broker: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------------------
 * hash maps */

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ull; }
    return h;
}
static uint64_t hash_cid_id(const uint8_t *cid, size_t cn, const char *id, size_t in) {
    uint64_t h = hash_bytes(0xcbf29ce484222325ull, cid, cn);
    h = hash_bytes(h ^ 0xff, &cn, sizeof cn);
    return hash_bytes(h, id, in);
}
static uint64_t hash_rid(uint64_t rid) {
    rid ^= rid >> 33; rid *= 0xff51afd7ed558ccdull; rid ^= rid >> 33;
    return rid;
}

static int maps_grow(broker *b) {
    uint32_t nb = b->nbuckets ? b->nbuckets * 2 : 1024;
    bk_req **h = calloc(nb, sizeof *h), **r = calloc(nb, sizeof *r);
    if (!h || !r) { free(h); free(r); return -1; }
    for (bk_req *q = b->all; q; q = q->all_next) {
        uint32_t i = (uint32_t)(q->hkey & (nb - 1));
        q->h_next = h[i]; h[i] = q;
        uint32_t j = (uint32_t)(hash_rid(q->rid) & (nb - 1));
        q->r_next = r[j]; r[j] = q;
    }
    free(b->hmap); free(b->rmap);
    b->hmap = h; b->rmap = r; b->nbuckets = nb;
    return 0;
}

static bk_req *find_by_id(broker *b, const uint8_t *cid, uint32_t cn, const char *id, uint32_t in) {
    uint64_t h = hash_cid_id(cid, cn, id, in);
    for (bk_req *q = b->hmap[h & (b->nbuckets - 1)]; q; q = q->h_next)
        if (q->hkey == h && q->cid_len == cn && q->id_len == in && memcmp(q->cid, cid, cn) == 0 &&
            memcmp(q->id, id, in) == 0) return q;
    return NULL;
}

static bk_req *find_by_rid(broker *b, uint64_t rid) {
    for (bk_req *q = b->rmap[hash_rid(rid) & (b->nbuckets - 1)]; q; q = q->r_next)
        if (q->rid == rid) return q;
    return NULL;
}

static int req_insert(broker *b, bk_req *q) {
    if (b->n_reqs + 1 > b->nbuckets && maps_grow(b) != 0) return -1;
    uint32_t i = (uint32_t)(q->hkey & (b->nbuckets - 1));
    q->h_next = b->hmap[i]; b->hmap[i] = q;
    uint32_t j = (uint32_t)(hash_rid(q->rid) & (b->nbuckets - 1));
    q->r_next = b->rmap[j]; b->rmap[j] = q;
    q->all_prev = NULL; q->all_next = b->all;
    if (b->all) b->all->all_prev = q;
    b->all = q;
    b->n_reqs++;
    return 0;
}

static void req_unlink_maps(broker *b, bk_req *q) {
    bk_req **pp = &b->hmap[q->hkey & (b->nbuckets - 1)];
    while (*pp && *pp != q) pp = &(*pp)->h_next;
    if (*pp) *pp = q->h_next;
    pp = &b->rmap[hash_rid(q->rid) & (b->nbuckets - 1)];
    while (*pp && *pp != q) pp = &(*pp)->r_next;
    if (*pp) *pp = q->r_next;
    if (q->all_prev) q->all_prev->all_next = q->all_next; else b->all = q->all_next;
    if (q->all_next) q->all_next->all_prev = q->all_prev;
    b->n_reqs--;
}

static void req_free(bk_req *q) {
    if (!q) return;
    free(q->prompt);
    free(q->gen);
    free(q->lps);
    free(q->bias);
    free(q->text);
    free(q->stop_text);
    free(q->format_text);
    free(q->bhash);
    free(q);
}

/* queue / worker list links */
/* The queue is ordered by priority (highest first), FIFO within a priority: a new request goes after the last
 * one of its priority or above; front (a requeued request) goes before the first one of its priority or below.
 * The scan starts from the end it is nearest to in the common case (all priorities equal: O(1)). */
static void queue_push(broker *b, bk_model *m, bk_req *q, int front) {
    q->state = RQ_QUEUED;
    q->worker = NULL;
    bk_req *after; /* q goes right after this one (NULL: at the head) */
    if (front) {
        bk_req *x = m->q_head;
        while (x && x->priority > q->priority) x = x->next;
        after = x ? x->prev : m->q_tail;
    } else {
        after = m->q_tail;
        while (after && after->priority < q->priority) after = after->prev;
    }
    q->prev = after;
    q->next = after ? after->next : m->q_head;
    if (q->next) q->next->prev = q;
    else m->q_tail = q;
    if (after) after->next = q;
    else m->q_head = q;
    m->n_queued++;
    b->n_queued++;
    b->queued_tokens += q->n_prompt;
}

static void queue_remove(broker *b, bk_req *q) {
    bk_model *m = q->model;
    if (q->prev) q->prev->next = q->next; else m->q_head = q->next;
    if (q->next) q->next->prev = q->prev; else m->q_tail = q->prev;
    q->prev = q->next = NULL;
    m->n_queued--;
    b->n_queued--;
    b->queued_tokens -= q->n_prompt;
}

static void worker_attach(broker *b, bk_worker *w, bk_req *q) {
    q->state = RQ_RUNNING;
    q->worker = w;
    q->next = NULL; q->prev = w->tail;
    if (w->tail) w->tail->next = q; else w->head = q;
    w->tail = q;
    w->used++;
    b->n_running++;
}

static void worker_detach(broker *b, bk_req *q) {
    bk_worker *w = q->worker;
    if (q->prev) q->prev->next = q->next; else w->head = q->next;
    if (q->next) q->next->prev = q->prev; else w->tail = q->prev;
    q->prev = q->next = NULL;
    w->used--;
    q->worker = NULL;
    b->n_running--;
}

/* ---------------------------------------------------------------------------------------------------------
 * sends: never block. A failed send to a client marks it lost (handled at the next safe point). */

static void mark_lost(broker *b, const uint8_t *cid, uint32_t cn) {
    for (int i = 0; i < b->n_lost; i++)
        if (b->lost_len[i] == cn && memcmp(b->lost[i], cid, cn) == 0) return;
    if (b->n_lost >= BK_MAX_LOST) return;
    memcpy(b->lost[b->n_lost], cid, cn);
    b->lost_len[b->n_lost++] = cn;
}

/* m is one freshly encoded message: the broker's instance id is added to it here */
static int send_client(broker *b, const uint8_t *cid, uint32_t cn, proto_buf *m) {
    if (m->failed || proto_buf_add_str(m, "inst", (proto_str){b->inst, 16}) != 0) {
        b->c.dropped++;
        return -1;
    }
    if (zmq_send(b->cs, cid, cn, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        /* EHOSTUNREACH: the client is gone; EAGAIN: its HWM is full (slow consumer): both cancel its streams */
        b->c.dropped++;
        mark_lost(b, cid, cn);
        return -1;
    }
    if (zmq_send(b->cs, m->data, m->len, ZMQ_DONTWAIT) < 0) { b->c.dropped++; return -1; }
    return 0;
}

static int send_worker(broker *b, bk_worker *w, const proto_buf *m) {
    if (m->failed) { b->c.dropped++; return -1; }
    if (zmq_send(b->ws, w->wid, w->wid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(b->ws, m->data, m->len, ZMQ_DONTWAIT) < 0) {
        b->c.dropped++;
        w->failed = 1;        /* unreachable or not reading: treated as dead */
        return -1;
    }
    return 0;
}

static void send_to_ident(broker *b, void *sock, const void *id, size_t idn, const proto_buf *m) {
    if (m->failed) return;
    if (zmq_send(sock, id, idn, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, m->data, m->len, ZMQ_DONTWAIT) < 0) b->c.dropped++;
}

static void send_bad_message(broker *b, const uint8_t *cid, uint32_t cn, proto_code code, const char *msg) {
    proto_encode_error(&b->out, code, proto_cstr(msg));
    send_client(b, cid, cn, &b->out);
}

static void cancel_on_worker(broker *b, bk_worker *w, uint64_t rid) {
    proto_buf cb = {0};
    /* rare path (cancel, stop string, timeout): its own small buffer keeps b->out free for the caller */
    if (proto_encode_cancel_rids(&cb, &rid, 1) == 0) send_worker(b, w, &cb);
    proto_buf_free(&cb);
}

/* ---------------------------------------------------------------------------------------------------------
 * request end: exactly one final, then the request is gone from every map and list */

static int text_append(bk_req *q, const char *s, size_t n) {
    if (q->text_len + n + 1 > q->text_cap) {
        size_t nc = q->text_cap ? q->text_cap : 256;
        while (nc < q->text_len + n + 1) nc *= 2;
        char *t = realloc(q->text, nc);
        if (!t) return -1;
        q->text = t;
        q->text_cap = nc;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    return 0;
}

/* forwards the prompt logprobs of positions [start, start + n) (lps[n], from a worker's `out`) to the client in
 * `prompt_logprobs` messages of at most PROTO_PLP_CHUNK positions, position 0 (nil: nothing precedes it) first;
 * rows already sent are skipped, rows that do not continue what was sent are dropped */
static void req_plp(broker *b, bk_req *q, uint32_t start, uint32_t n, const proto_logprob *lps) {
    if (!q->sampling.prompt_lp || start > (q->plp_next ? q->plp_next : 1)) return;
    uint32_t from = q->plp_next, end = start + n;
    if (end > q->n_prompt) end = q->n_prompt; /* out_check refused longer ones */
    proto_logprob chunk[PROTO_PLP_CHUNK];
    while (from < end || from == 0) {
        uint32_t k = 0, p0 = from;
        for (; k < PROTO_PLP_CHUNK && (from < end || from == 0); k++, from++)
            if (from == 0) memset(&chunk[k], 0, sizeof chunk[k]);
            else chunk[k] = lps[from - start];
        proto_plps m = {{q->id, q->id_len}, p0, q->prompt + p0, k, chunk, q->index};
        proto_encode_plps(&b->out, &m);
        send_client(b, q->cid, q->cid_len, &b->out);
    }
    q->plp_next = from;
}

/* before the first token or the final: position 0 of the prompt logprobs when nothing was sent (a prompt of one
 * token has no other) */
static void req_plp_head(broker *b, bk_req *q) {
    if (q->sampling.prompt_lp && q->plp_next == 0) req_plp(b, q, 1, 0, NULL);
}

/* send: 0 when the client is known to be gone (no final can reach it) */
static void req_finish(broker *b, bk_req *q, proto_finish fin, proto_code code, const char *message, int send,
                       int cancel_worker) {
    double t = now_ms();
    if (q->state == RQ_QUEUED) queue_remove(b, q);
    else if (q->state == RQ_RUNNING) {
        if ((fin == PROTO_FINISH_STOP || fin == PROTO_FINISH_LENGTH) && q->worker) q->worker->served++;
        if (cancel_worker && q->worker && !q->worker->failed) cancel_on_worker(b, q->worker, q->rid);
        /* the slot is reusable at once: the worker handles our cancel before any later assign */
        worker_detach(b, q);
    }
    q->state = 0;
    if (send) {
        if (fin == PROTO_FINISH_STOP || fin == PROTO_FINISH_LENGTH) {
            req_plp_head(b, q);
            char tail[64];
            int n = tokenizer_decode_flush(q->model->tok, &q->detok, tail, sizeof tail);
            if (n > 0 && fin == PROTO_FINISH_LENGTH) text_append(q, tail, (size_t)n);
        }
        proto_final f;
        memset(&f, 0, sizeof f);
        f.id.p = q->id; f.id.n = q->id_len;
        f.finish = fin;
        f.code = code;
        if (message) f.message = proto_cstr(message);
        f.text.p = q->text ? q->text : ""; f.text.n = (uint32_t)q->text_len;
        proto_logprob *lps = NULL;
        if (!q->stream) {
            f.has_ids = 1;
            f.ids = q->gen;
            f.n_ids = q->n_gen;
            if (q->sampling.logprobs && q->n_gen && q->lps) {
                lps = calloc(q->n_gen, sizeof *lps);
                for (uint32_t i = 0; lps && i < q->n_gen; i++) {
                    const bk_lp *x = &q->lps[i];
                    lps[i] = (proto_logprob){x->present, x->logprob, x->n_top, x->top_id, x->top_logprob};
                }
                f.lps = lps;
            } else if (q->sampling.logprobs) {
                static const proto_logprob none = {0};
                f.lps = q->n_gen ? NULL : &none; /* an empty array for no tokens */
            }
        }
        f.index = q->index;
        for (bk_req *o = b->hmap[q->hkey & (b->nbuckets - 1)]; o; o = o->h_next) /* its siblings still running */
            f.left += o != q && o->hkey == q->hkey && o->cid_len == q->cid_len && o->id_len == q->id_len &&
                      memcmp(o->cid, q->cid, q->cid_len) == 0 && memcmp(o->id, q->id, q->id_len) == 0;
        f.prompt_tokens = q->n_prompt;
        f.completion_tokens = q->n_gen;
        double admit = q->t_admit > 0 ? q->t_admit : t;
        f.queue_ms = admit - q->t_recv;
        f.ttft_ms = q->t_first > 0 ? q->t_first - q->t_recv : 0;
        f.total_ms = t - q->t_recv;
        proto_encode_final(&b->out, &f);
        free(lps);
        send_client(b, q->cid, q->cid_len, &b->out);
    }
    switch (fin) {
    case PROTO_FINISH_STOP: case PROTO_FINISH_LENGTH: b->c.completed++; break;
    case PROTO_FINISH_CANCELLED: b->c.cancelled++; break;
    case PROTO_FINISH_TIMEOUT: b->c.timeouts++; break;
    case PROTO_FINISH_OVERLOADED: b->c.overloaded++; break;
    default: b->c.errors++; break;
    }
    req_unlink_maps(b, q);
    req_free(q);
}

/* a final for a generate that never became a request (validation failures) */
static void final_reject(broker *b, const uint8_t *cid, uint32_t cn, proto_str id, proto_finish fin, proto_code code,
                         const char *message, uint32_t prompt_tokens) {
    proto_final f;
    memset(&f, 0, sizeof f);
    f.id = id;
    f.finish = fin;
    f.code = code;
    f.message = proto_cstr(message);
    f.text = proto_cstr("");
    f.prompt_tokens = prompt_tokens;
    proto_encode_final(&b->out, &f);
    send_client(b, cid, cn, &b->out);
    if (fin == PROTO_FINISH_OVERLOADED) b->c.overloaded++; else b->c.errors++;
}

/* one generated token: detokenize, stop strings, stream. Returns 1 when a stop string ended the request. */
static int req_token(broker *b, bk_req *q, int32_t tok, const proto_logprob *lp, double t) {
    char *piece = q->model->piece; /* tokenizer_stream_cap bytes: the decode below cannot run short */
    if (q->n_gen == 0) q->t_first = t;
    req_plp_head(b, q);
    proto_logprob none = {0};
    if (!lp) lp = &none;
    if (!q->stream) {
        if (q->n_gen + 1 > q->gen_cap) {
            uint32_t nc = q->gen_cap ? q->gen_cap * 2 : 64;
            int32_t *g = realloc(q->gen, (size_t)nc * sizeof *g);
            if (!g) return 0;
            q->gen = g;
            if (q->sampling.logprobs) {
                bk_lp *l = realloc(q->lps, (size_t)nc * sizeof *l);
                if (!l) return 0;
                q->lps = l;
            }
            q->gen_cap = nc;
        }
        q->gen[q->n_gen] = tok;
        if (q->sampling.logprobs) {
            bk_lp *x = &q->lps[q->n_gen];
            memset(x, 0, sizeof *x);
            x->present = lp->present;
            x->logprob = lp->logprob;
            x->n_top = lp->n_top > PROTO_MAX_TOP_LOGPROBS ? PROTO_MAX_TOP_LOGPROBS : lp->n_top;
            if (x->n_top) {
                memcpy(x->top_id, lp->top_id, x->n_top * sizeof *x->top_id);
                memcpy(x->top_logprob, lp->top_logprob, x->n_top * sizeof *x->top_logprob);
            }
        }
    }
    q->n_gen++;
    b->c.tokens_out++;
    int n = tokenizer_decode_stream(q->model->tok, &q->detok, tok, 0, piece, q->model->piece_cap);
    if (n > 0) text_append(q, piece, (size_t)n);
    int stopped = 0;
    size_t release = q->text_len;
    if (q->stops.count) {
        long at = bk_stop_find(&q->stops, q->text ? q->text : "", q->text_len, q->scan_from);
        if (at >= 0) {
            q->text_len = (size_t)at;
            release = q->text_len;
            stopped = 1;
        } else {
            release = bk_stop_releasable(&q->stops, q->text, q->text_len);
            size_t back = q->stops.max_len > 1 ? q->stops.max_len - 1 : 0;
            q->scan_from = q->text_len > back ? q->text_len - back : 0;
        }
    }
    if (q->stream) {
        proto_str text = { q->text ? q->text : "", (uint32_t)release };
        if (stopped) text.n = 0;  /* everything before the stop goes out with the final */
        proto_encode_token_ex(&b->out, (proto_str){q->id, q->id_len}, &tok, 1, text, q->sampling.logprobs ? lp : NULL,
                              q->index);
        if (send_client(b, q->cid, q->cid_len, &b->out) == 0) q->n_sent++;
        if (!stopped && release) {
            memmove(q->text, q->text + release, q->text_len - release);
            q->text_len -= release;
            q->scan_from = q->scan_from > release ? q->scan_from - release : 0;
        }
    }
    return stopped;
}

/* ---------------------------------------------------------------------------------------------------------
 * workers */

static bk_worker *worker_find(broker *b, const uint8_t *wid, uint32_t n) {
    for (int i = 0; i < b->n_workers; i++)
        if (b->workers[i]->wid_len == n && memcmp(b->workers[i]->wid, wid, n) == 0) return b->workers[i];
    return NULL;
}

static bk_model *model_find(broker *b, proto_str name) {
    if (!name.p) return b->n_models ? &b->models[0] : NULL;
    for (int i = 0; i < b->n_models; i++)
        if (proto_str_eq(name, b->models[i].name)) return &b->models[i];
    return NULL;
}

/* the worker is gone: requeue what sent no token yet, fail the rest, forget the worker */
static void worker_remove(broker *b, bk_worker *w, const char *why) {
    logf_(b, "worker %s (%s) removed: %s", w->name, w->model ? w->model->name : "?", why);
    while (w->head) {
        bk_req *q = w->head;
        worker_detach(b, q);
        if (q->n_sent == 0) {
            /* restart from scratch: nothing reached the client */
            q->n_gen = 0;
            q->text_len = 0;
            q->scan_from = 0;
            q->t_first = 0;
            memset(&q->detok, 0, sizeof q->detok);
            /* the rid is kept: a late `out` from the old worker is ignored (it is unknown: it gets reregister) */
            queue_push(b, q->model, q, 1);
            b->c.requeued++;
        } else {
            q->state = 0;
            req_finish(b, q, PROTO_FINISH_ERROR, PROTO_CODE_WORKER_FAILED, "the worker serving this request failed",
                       1, 0);
        }
    }
    for (int i = 0; i < b->n_workers; i++)
        if (b->workers[i] == w) { b->workers[i] = b->workers[--b->n_workers]; break; }
    if (w->model) w->model->n_workers--;
    bk_summary_destroy(&w->summary);
    free(w);
}

/* ---------------------------------------------------------------------------------------------------------
 * client messages */

static int prompt_tokens(broker *b, bk_model *m, const proto_generate *g, int32_t **out, uint32_t *n_out,
                         proto_code *code, char *msg, size_t msglen) {
    (void)b;
    int32_t *ids = NULL;
    char *rendered = NULL;
    if (g->prompt_kind == PROTO_PROMPT_TOKENS) {
        ids = malloc((size_t)g->n_tokens * sizeof *ids);
        if (!ids) goto oom;
        for (uint32_t i = 0; i < g->n_tokens; i++) {
            if (g->tokens[i] >= m->n_vocab) {
                *code = PROTO_CODE_BAD_REQUEST;
                snprintf(msg, msglen, "tokens[%u] = %d is outside the vocabulary (%d)", i, g->tokens[i], m->n_vocab);
                goto fail;
            }
            ids[i] = g->tokens[i];
        }
        *out = ids;
        *n_out = g->n_tokens;
        return 0;
    }
    const char *text;
    size_t len;
    int add_bos, special;
    if (g->prompt_kind == PROTO_PROMPT_MESSAGES) {
        zl_chat_msg *cm = calloc(g->n_messages, sizeof *cm);
        char *store = NULL;
        size_t total = 0;
        for (uint32_t i = 0; i < g->n_messages; i++) {
            const proto_chat *pm = &g->messages[i];
            total += pm->role.n + pm->content.n + pm->tool_call_id.n + pm->tool_calls.n + 4;
        }
        if (cm) store = malloc(total);
        if (!cm || !store) { free(cm); free(store); goto oom; }
        char *p = store;
        for (uint32_t i = 0; i < g->n_messages; i++) {
            proto_str r = g->messages[i].role, c = g->messages[i].content;
            proto_str ti = g->messages[i].tool_call_id, tc = g->messages[i].tool_calls;
            if (memchr(r.p, 0, r.n) || memchr(c.p, 0, c.n) || (ti.p && memchr(ti.p, 0, ti.n)) ||
                (tc.p && memchr(tc.p, 0, tc.n))) {
                free(cm); free(store);
                *code = PROTO_CODE_BAD_REQUEST;
                snprintf(msg, msglen, "messages[%u] contains a NUL byte", i);
                goto fail;
            }
            memcpy(p, r.p, r.n); p[r.n] = 0; cm[i].role = p; p += r.n + 1;
            memcpy(p, c.p, c.n); p[c.n] = 0; cm[i].content = p; p += c.n + 1;
            if (ti.p) {
                memcpy(p, ti.p, ti.n);
                p[ti.n] = 0;
                cm[i].tool_call_id = p;
                p += ti.n + 1;
            }
            if (tc.p) {
                memcpy(p, tc.p, tc.n);
                p[tc.n] = 0;
                cm[i].tool_calls = p;
                p += tc.n + 1;
            }
        }
        char terr[256] = "";
        rendered = chat_apply(m->tok, cm, (int)g->n_messages, 1, terr, sizeof terr);
        free(cm);
        free(store);
        if (rendered && terr[0]) logf_(b, "%s", terr); /* the built-in template stood in for the file's */
        if (!rendered) {
            *code = PROTO_CODE_TEMPLATE_ERROR;
            snprintf(msg, msglen, "%s", terr[0] ? terr : "the model has no usable chat template");
            goto fail;
        }
        text = rendered;
        len = strlen(rendered);
        add_bos = 0;
        special = 1;
    } else {
        text = g->prompt.p ? g->prompt.p : "";
        len = g->prompt.n;
        add_bos = g->add_bos >= 0 ? g->add_bos : tokenizer_add_bos(m->tok);
        special = g->special;
    }
    int cap = (int)(len + 16 < 4096 ? len + 16 : 4096);
    for (int attempt = 0; attempt < 2; attempt++) {
        free(ids);
        ids = malloc((size_t)cap * sizeof *ids);
        if (!ids) goto oom;
        int n = tokenizer_encode(m->tok, text, len, add_bos, special, ids, cap);
        if (n < 0) {
            *code = PROTO_CODE_BAD_REQUEST;
            snprintf(msg, msglen, "the prompt could not be tokenized");
            goto fail;
        }
        if (n <= cap) { *out = ids; *n_out = (uint32_t)n; free(rendered); return 0; }
        cap = n;
    }
    *code = PROTO_CODE_INTERNAL;
    snprintf(msg, msglen, "tokenizer count changed between calls");
    goto fail;
oom:
    *code = PROTO_CODE_INTERNAL;
    snprintf(msg, msglen, "out of memory");
fail:
    free(ids);
    free(rendered);
    return -1;
}

static uint32_t model_max_worker_ctx(broker *b, bk_model *m, int *n_workers) {
    uint32_t best = 0;
    *n_workers = 0;
    for (int i = 0; i < b->n_workers; i++) {
        bk_worker *w = b->workers[i];
        if (w->model != m || w->failed) continue;
        (*n_workers)++;
        if (w->n_ctx > best) best = w->n_ctx;
    }
    return best;
}

/* completion `index` of n_choices of generate g (prompt ids copied), not yet inserted or queued; NULL when out of
 * memory */
static bk_req *req_make(broker *b, const uint8_t *cid, uint32_t cn, const proto_generate *g, bk_model *m,
                        const int32_t *ids, uint32_t n_ids, uint32_t index, uint32_t n_choices, uint64_t seed) {
    bk_req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->rid = ++b->next_rid;
    memcpy(q->cid, cid, cn);
    q->cid_len = cn;
    memcpy(q->id, g->id.p, g->id.n);
    q->id_len = g->id.n;
    q->hkey = hash_cid_id(cid, cn, g->id.p, g->id.n);
    q->model = m;
    q->prompt = malloc((size_t)n_ids * sizeof *q->prompt);
    if (!q->prompt) {
        req_free(q);
        return NULL;
    }
    memcpy(q->prompt, ids, (size_t)n_ids * sizeof *q->prompt);
    q->n_prompt = n_ids;
    q->max_tokens = g->max_tokens;
    q->sampling = g->sampling;
    q->sampling.seed = seed + index; /* completion i of n: seed + i (wrapping) */
    q->sampling.has_seed = 1;
    q->index = index;
    q->n_choices = n_choices;
    q->sampling.bias = NULL;
    if (g->sampling.n_bias) {
        q->bias = malloc(g->sampling.n_bias * sizeof *q->bias);
        if (!q->bias) {
            req_free(q);
            return NULL;
        }
        memcpy(q->bias, g->sampling.bias, g->sampling.n_bias * sizeof *q->bias);
        q->sampling.bias = q->bias;
    }
    q->n_stop_ids = g->n_stop_ids;
    if (g->n_stop_ids) memcpy(q->stop_ids, g->stop_ids, g->n_stop_ids * sizeof *g->stop_ids);
    if (g->format.kind != PROTO_FORMAT_NONE) {
        q->format_kind = g->format.kind;
        q->format_len = g->format.text.n;
        q->format_text = malloc(q->format_len + 1);
        if (!q->format_text) {
            req_free(q);
            return NULL;
        }
        if (q->format_len) memcpy(q->format_text, g->format.text.p, q->format_len);
        q->format_text[q->format_len] = 0;
    }
    if (g->n_stop) {
        size_t tot = 0;
        for (uint32_t i = 0; i < g->n_stop; i++) tot += g->stop[i].n;
        q->stop_text = malloc(tot);
        if (!q->stop_text) {
            req_free(q);
            return NULL;
        }
        size_t off = 0;
        for (uint32_t i = 0; i < g->n_stop; i++) {
            memcpy(q->stop_text + off, g->stop[i].p, g->stop[i].n);
            q->stops.s[i] = q->stop_text + off;
            q->stops.n[i] = g->stop[i].n;
            if (g->stop[i].n > q->stops.max_len) q->stops.max_len = g->stop[i].n;
            off += g->stop[i].n;
        }
        q->stops.count = (int)g->n_stop;
    }
    q->stream = g->stream;
    q->priority = g->priority;
    q->t_recv = now_ms();
    q->deadline = q->t_recv + g->deadline_ms;
    return q;
}

static void on_generate(broker *b, const uint8_t *cid, uint32_t cn, const proto_generate *g) {
    char msg[320];
    proto_code code = PROTO_CODE_NONE;
    if (b->draining) {
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_SHUTTING_DOWN, "the broker is shutting down", 0);
        return;
    }
    if (find_by_id(b, cid, cn, g->id.p, g->id.n)) {
        /* not a final: that would end the running request in the client's eyes */
        b->c.duplicate_ids++;
        char m2[160];
        snprintf(m2, sizeof m2, "request id '%.*s' is already in flight", (int)g->id.n, g->id.p);
        proto_encode_error_id(&b->out, PROTO_CODE_DUPLICATE_ID, g->id, proto_cstr(m2));
        send_client(b, cid, cn, &b->out);
        return;
    }
    bk_model *m = model_find(b, g->model);
    if (!m) {
        snprintf(msg, sizeof msg, "model '%.*s' is not served here", (int)g->model.n, g->model.p);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_UNKNOWN_MODEL, msg, 0);
        return;
    }
    if (g->format.kind != PROTO_FORMAT_NONE) {
        /* an invalid or unsatisfiable schema, regex or grammar is refused before anything is queued; the
         * compiled grammar stays in the cache, so the worker's own compile of a repeated text is the only cost */
        char gerr[256];
        zg_grammar *gr = b->grammars ? grammar_cache_get(b->grammars, g->format.kind, g->format.text.p,
                                                         g->format.text.n, gerr, sizeof gerr)
                                     : NULL;
        if (!gr) {
            snprintf(msg, sizeof msg, "response_format: %s", b->grammars ? gerr : "out of memory");
            final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_BAD_REQUEST, msg, 0);
            return;
        }
        grammar_unref(&gr);
    }
    int32_t *ids = NULL;
    uint32_t n_ids = 0;
    if (prompt_tokens(b, m, g, &ids, &n_ids, &code, msg, sizeof msg) != 0) {
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, code, msg, 0);
        return;
    }
    if (n_ids == 0) {
        free(ids);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_BAD_REQUEST, "empty prompt", 0);
        return;
    }
    uint64_t need = (uint64_t)n_ids + (g->max_tokens ? g->max_tokens : 1); /* 0 (scoring) still needs the slot */
    int nw;
    uint32_t wctx = model_max_worker_ctx(b, m, &nw);
    if (m->n_ctx && need > m->n_ctx) {
        snprintf(msg, sizeof msg, "prompt (%u tokens) + max_tokens (%u) exceeds the model's context (%u)", n_ids,
                 g->max_tokens, m->n_ctx);
        free(ids);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_PROMPT_TOO_LONG, msg, n_ids);
        return;
    }
    if (nw > 0 && need > wctx) {
        /* the model could take it; the workers registered now cannot (a capacity problem, not the prompt's) */
        snprintf(msg, sizeof msg,
                 "prompt (%u tokens) + max_tokens (%u) exceeds the context of every worker of "
                 "model %s (largest %u tokens, %d workers)",
                 n_ids, g->max_tokens, m->name, wctx, nw);
        free(ids);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_NO_CAPACITY, msg, n_ids);
        return;
    }
    /* what comes back besides the token: checked here, before anything is queued */
    const proto_sampling *gs = &g->sampling;
    const uint32_t n_choices = g->n ? g->n : 1;
    const char *bad = NULL;
    if (gs->top_logprobs && !gs->logprobs) bad = "top_logprobs needs logprobs";
    for (uint32_t i = 0; !bad && i < gs->n_bias; i++)
        if (m->n_vocab > 0 && gs->bias[i].id >= m->n_vocab) {
            snprintf(msg, sizeof msg, "logit_bias id %d is outside the vocabulary (%d)", gs->bias[i].id, m->n_vocab);
            bad = msg;
        }
    if (bad) {
        free(ids);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_BAD_REQUEST, bad, n_ids);
        return;
    }
    if (b->n_queued + n_choices > b->cfg.queue_max ||
        b->queued_tokens + (uint64_t)n_ids * n_choices > b->cfg.queue_tokens) {
        free(ids);
        final_reject(b, cid, cn, g->id, PROTO_FINISH_OVERLOADED, PROTO_CODE_OVERLOADED,
                     b->n_queued + n_choices > b->cfg.queue_max ? "the request queue is full"
                                                                : "the queued prompt tokens are at their limit",
                     n_ids);
        return;
    }
    /* n completions: n requests of the same id, seeds seed + i, queued together so that one assign takes them and
     * the worker copies the prompt KV of completion 0 (share_rid) instead of prefilling it n times */
    bk_req *qs[PROTO_MAX_N] = {0};
    uint64_t seed = g->sampling.has_seed ? g->sampling.seed : hash_rid((b->next_rid + 1) ^ (uint64_t)time(NULL));
    for (uint32_t c = 0; c < n_choices; c++) {
        bk_req *q = req_make(b, cid, cn, g, m, ids, n_ids, c, n_choices, seed);
        if (!q) {
            for (uint32_t k = 0; k < c; k++) req_free(qs[k]);
            free(ids);
            final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_INTERNAL, "out of memory", 0);
            return;
        }
        qs[c] = q;
    }
    free(ids);
    for (uint32_t c = 0; c < n_choices; c++) {
        if (c > 0) qs[c]->share_rid = qs[0]->rid;
        if (req_insert(b, qs[c]) != 0) { /* the ones inserted end with a final each; the rest get none */
            for (uint32_t k = c; k < n_choices; k++) req_free(qs[k]);
            if (c == 0) final_reject(b, cid, cn, g->id, PROTO_FINISH_ERROR, PROTO_CODE_INTERNAL, "out of memory", 0);
            for (uint32_t k = 0; k < c; k++)
                req_finish(b, qs[k], PROTO_FINISH_ERROR, PROTO_CODE_INTERNAL, "out of memory", 1, 0);
            return;
        }
    }
    for (uint32_t c = 0; c < n_choices; c++) {
        queue_push(b, m, qs[c], 0);
        b->c.accepted++;
    }
}

static void on_status(broker *b, const uint8_t *cid, uint32_t cn, proto_str id) {
    static proto_worker_info wi[BK_MAX_WORKERS]; /* single-threaded loop: too large for the stack */
    proto_model_info cap[BK_MAX_MODELS];
    proto_str models[BK_MAX_MODELS];
    proto_counter ct[32];
    proto_status s;
    memset(&s, 0, sizeof s);
    double t = now_ms();
    s.id = id;
    for (int i = 0; i < b->n_models; i++) models[i] = proto_cstr(b->models[i].name);
    s.models = models;
    s.n_models = (uint32_t)b->n_models;
    for (int i = 0; i < b->n_workers; i++) {
        bk_worker *w = b->workers[i];
        proto_worker_info *x = &wi[i];
        x->name = proto_cstr(w->name);
        x->model = proto_cstr(w->model->name);
        x->device = proto_cstr(w->device);
        x->max_batch = w->max_batch; x->n_slots = w->n_slots; x->n_ctx = w->n_ctx;
        x->free_slots = w->n_slots - w->used;
        x->running = w->hb_running;
        x->step = w->step;
        x->kv_block = w->kv_block;
        x->kv_used = w->kv.used;
        x->kv_free = w->kv.free;
        x->kv_cached = w->kv.cached;
        x->kv_hit_tokens = w->kv.hit_tokens;
        x->kv_prompt_tokens = w->kv.prompt_tokens;
        x->kv_preemptions = w->kv.preemptions;
        x->kv_evictions = w->kv.evictions;
        x->kv_summary = bk_summary_size(w->summary);
        /* alive: heard from recently, and progressing (or idle) */
        x->alive = !w->failed && t - w->last_seen < b->cfg.dead_ms &&
                   (w->used == 0 || t - w->last_step_change < b->cfg.hang_ms);
        if (x->alive) s.ready = 1;
    }
    /* per model: why it cannot take work now, if it cannot */
    for (int k = 0; k < b->n_models; k++) {
        bk_model *m = &b->models[k];
        proto_model_info *c = &cap[k];
        memset(c, 0, sizeof *c);
        c->model = proto_cstr(m->name);
        c->queued = m->n_queued;
        c->refused = m->refused;
        for (int i = 0; i < b->n_workers; i++)
            if (b->workers[i]->model == m && wi[i].alive) {
                c->workers++;
                c->free_slots += wi[i].free_slots;
            }
        c->reason = proto_cstr(c->workers == 0 ? "no_worker" : c->free_slots == 0 ? "no_capacity" : "");
    }
    s.capacity = cap;
    s.n_capacity = (uint32_t)b->n_models;
    s.workers = wi;
    s.n_workers = (uint32_t)b->n_workers;
    s.queue = b->n_queued;
    s.active = b->n_running;
    uint32_t n = 0;
#define CT(f) do { ct[n].name = proto_cstr(#f); ct[n++].value = b->c.f; } while (0)
    CT(bad_messages); CT(dropped); CT(requeued); CT(worker_deaths); CT(unknown_ids); CT(duplicate_ids);
    CT(overloaded); CT(timeouts); CT(cancelled); CT(completed); CT(errors); CT(accepted); CT(tokens_out);
    CT(clients_lost); CT(late_outputs); CT(bad_workers); CT(reregisters); CT(worker_errors);
    CT(lying_workers);
    CT(evicted_workers);
    CT(too_large);
    CT(prefills_shared);
    CT(cache_routed);
    CT(cache_balanced);
#undef CT
    ct[n].name = proto_cstr("zap_refused"); ct[n++].value = bk_zap_refused(b->zap);
    ct[n].name = proto_cstr("draining"); ct[n++].value = (uint64_t)b->draining;
    s.counters = ct;
    s.n_counters = n;
    proto_encode_status(&b->out, &s);
    send_client(b, cid, cn, &b->out);
}

/* reads one ROUTER message: identity + exactly one payload frame. Returns 1 with id and body set (caller closes),
 * 0 when nothing is pending, -1 for a malformed multipart (consumed and counted). */
static int recv_routed(broker *b, void *sock, zmq_msg_t *id, zmq_msg_t *body) {
    zmq_msg_init(id);
    if (zmq_msg_recv(id, sock, ZMQ_DONTWAIT) < 0) { zmq_msg_close(id); return 0; }
    int frames = 1, more = zmq_msg_more(id);
    zmq_msg_init(body);
    int have_body = 0;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) { zmq_msg_close(&f); break; }
        frames++;
        more = zmq_msg_more(&f);
        if (frames == 2) { zmq_msg_move(body, &f); have_body = 1; }
        zmq_msg_close(&f);
    }
    if (frames != 2 || !have_body) {
        b->c.bad_messages++;
        zmq_msg_close(body);
        /* reply to a client that sent a wrong frame count (it may be using REQ or multipart by mistake) */
        if (sock == b->cs && zmq_msg_size(id) <= BK_CID_MAX)
            send_bad_message(b, zmq_msg_data(id), (uint32_t)zmq_msg_size(id), PROTO_CODE_BAD_MESSAGE,
                             "a message is exactly one frame holding one msgpack map");
        zmq_msg_close(id);
        return -1;
    }
    return 1;
}

static void on_client_msg(broker *b, const uint8_t *cid, uint32_t cn, const void *data, size_t len) {
    char err[256];
    proto_msg *m = &b->msg;
    if (cn == 0 || cn > BK_CID_MAX) { b->c.bad_messages++; return; }
    if (len > PROTO_CLIENT_MAX_FRAME) {
        /* an answer, not a disconnect: the client's other requests go on */
        proto_str type, id;
        b->c.too_large++;
        snprintf(err, sizeof err, "a message of %zu bytes exceeds the limit of %u bytes", len, PROTO_CLIENT_MAX_FRAME);
        if (proto_peek_id(data, len, &type, &id) == 0 && proto_str_eq(type, "generate") &&
            !find_by_id(b, cid, cn, id.p, id.n)) {
            final_reject(b, cid, cn, id, PROTO_FINISH_ERROR, PROTO_CODE_TOO_LARGE, err, 0);
            return;
        }
        send_bad_message(b, cid, cn, PROTO_CODE_TOO_LARGE, err);
        return;
    }
    if (proto_decode(data, len, m, err, sizeof err) != 0) {
        proto_str type, id;
        b->c.bad_messages++;
        /* a generate with a usable id gets its final (bad_request), unless that id is in flight */
        if (proto_peek_id(data, len, &type, &id) == 0 && proto_str_eq(type, "generate") &&
            !find_by_id(b, cid, cn, id.p, id.n)) {
            final_reject(b, cid, cn, id, PROTO_FINISH_ERROR, PROTO_CODE_BAD_REQUEST, err, 0);
            return;
        }
        send_bad_message(b, cid, cn, PROTO_CODE_BAD_MESSAGE, err);
        return;
    }
    switch (m->type) {
    case PROTO_GENERATE: on_generate(b, cid, cn, &m->generate); break;
    case PROTO_CANCEL: {
        bk_req *q = m->cancel.id.p ? find_by_id(b, cid, cn, m->cancel.id.p, m->cancel.id.n) : NULL;
        if (!q) { b->c.unknown_ids++; break; }
        do { /* every completion of the id (n > 1) */
            req_finish(b, q, PROTO_FINISH_CANCELLED, PROTO_CODE_NONE, NULL, 1, 1);
        } while ((q = find_by_id(b, cid, cn, m->cancel.id.p, m->cancel.id.n)) != NULL);
        break;
    }
    case PROTO_STATUS: on_status(b, cid, cn, m->status.id); break;
    default:
        b->c.bad_messages++;
        snprintf(err, sizeof err, "type '%s' is not accepted from clients", proto_type_name(m->type));
        send_bad_message(b, cid, cn, PROTO_CODE_BAD_MESSAGE, err);
        break;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * worker messages */

static void reregister(broker *b, const uint8_t *wid, uint32_t wn) {
    proto_encode_reregister(&b->out);
    send_to_ident(b, b->ws, wid, wn, &b->out);
    b->c.reregisters++;
}

/* Worker admission per model: each model holds at most cfg.max_workers workers. When its table is full, the
 * new registration evicts the oldest of the model's workers that holds no sequence and has never served a
 * request (a flood of registrations that never serve cannot lock out a worker that does: the real worker's
 * registration gets in, and once it has served it is never evicted); when every worker there has served or
 * holds work, the registration is refused and counted in the model's `refused` (status `capacity`). An evicted
 * worker is forgotten: its next message gets `reregister`. */
static int worker_admit(broker *b, bk_model *m) {
    if (m->n_workers < b->cfg.max_workers && b->n_workers < BK_MAX_WORKERS) return 0;
    bk_worker *victim = NULL;
    for (int i = 0; i < b->n_workers; i++) {
        bk_worker *w = b->workers[i];
        if (w->model != m || w->served || w->used) continue;
        if (!victim || w->t_reg < victim->t_reg) victim = w;
    }
    if (!victim) return -1;
    b->c.evicted_workers++;
    worker_remove(b, victim, "evicted for a new registration (it never served)");
    return 0;
}

static void on_register(broker *b, const uint8_t *wid, uint32_t wn, const proto_register *r) {
    bk_worker *old = worker_find(b, wid, wn);
    if (old) worker_remove(b, old, "registered again (it dropped its sequences)");
    bk_model *m = model_find(b, r->model);
    if (!m || (m->n_vocab > 0 && r->vocab_size && (int32_t)r->vocab_size < m->n_vocab)) {
        b->c.bad_workers++;
        logf_(b, "refused worker %.*s: model '%.*s' %s", (int)r->name.n, r->name.p, (int)r->model.n, r->model.p,
              !m ? "is not configured" : "has a smaller vocabulary");
        return;
    }
    if (worker_admit(b, m) != 0) {
        b->c.bad_workers++;
        m->refused++;
        logf_(b, "refused worker %.*s: model %s has %u workers, all of which served or hold work", (int)r->name.n,
              r->name.p, m->name, m->n_workers);
        return;
    }
    bk_worker *w = calloc(1, sizeof *w);
    if (!w) return;
    memcpy(w->wid, wid, wn); w->wid_len = wn;
    proto_str_copy(r->name, w->name, sizeof w->name);
    proto_str_copy(r->device, w->device, sizeof w->device);
    w->model = m;
    w->max_batch = r->max_batch; w->n_slots = r->n_slots; w->n_ctx = r->n_ctx; w->hb_ms = r->heartbeat_ms;
    w->hb_free = r->n_slots;
    if (r->kv_block) { /* a summary only for a worker that reports blocks: none costs nothing */
        w->kv_block = r->kv_block;
        w->kv_blocks = r->kv_blocks;
        w->summary = bk_summary_new(); /* NULL (no memory): it is just never preferred */
        if (!m->kv_block) m->kv_block = r->kv_block;
    }
    w->last_seen = w->last_step_change = w->t_reg = now_ms();
    b->workers[b->n_workers++] = w;
    m->n_workers++;
    proto_encode_registered(&b->out, b->cfg.heartbeat_ms);
    send_worker(b, w, &b->out);
    logf_(b, "worker %s registered: model %s, %u slots of %u tokens, device %s", w->name, m->name, w->n_slots,
          w->n_ctx, w->device);
}

static void note_step(bk_worker *w, uint64_t step, double t) {
    if (step != w->step) { w->step = step; w->last_step_change = t; }
}

/* Checks a whole `out` before any of it reaches a client. A worker may name a rid at most once per message,
 * only a rid assigned to it (or one that ended: a late output), with a token id inside the model's vocabulary
 * (or -1). Returns NULL, or what it lied about. */
static const char *out_check(broker *b, bk_worker *w, const proto_out *o, char *why, size_t whylen) {
    int32_t n_vocab = w->model->n_vocab;
    uint64_t serial = ++b->out_serial;
    for (uint32_t i = 0; i < o->n; i++) {
        uint64_t rid = o->rids[i];
        int32_t tok = o->toks[i];
        if (tok < -1 || (n_vocab > 0 && tok >= n_vocab)) {
            snprintf(why, whylen, "token id %d for rid %llu is outside the vocabulary (%d)", tok,
                     (unsigned long long)rid, n_vocab);
            return why;
        }
        const proto_logprob *lp = o->lps ? &o->lps[i] : NULL;
        for (uint32_t k = 0; lp && lp->present && k < lp->n_top; k++)
            if (n_vocab > 0 && lp->top_id[k] >= n_vocab) {
                snprintf(why, whylen, "top logprob id %d for rid %llu is outside the vocabulary (%d)", lp->top_id[k],
                         (unsigned long long)rid, n_vocab);
                return why;
            }
        const proto_plp *pl = o->plp ? &o->plp[i] : NULL;
        for (uint32_t j = 0; pl && j < pl->n; j++)
            for (uint32_t k = 0; k < pl->lps[j].n_top; k++)
                if (n_vocab > 0 && pl->lps[j].top_id[k] >= n_vocab) {
                    snprintf(why, whylen, "prompt logprob id %d for rid %llu is outside the vocabulary (%d)",
                             pl->lps[j].top_id[k], (unsigned long long)rid, n_vocab);
                    return why;
                }
        bk_req *q = find_by_rid(b, rid);
        if (q && pl && pl->n && (!q->sampling.prompt_lp || (uint64_t)pl->start + pl->n > q->n_prompt)) {
            snprintf(why, whylen, "prompt logprobs of positions %u..%u for rid %llu (prompt of %u, %s)", pl->start,
                     pl->start + pl->n - 1, (unsigned long long)rid, q->n_prompt,
                     q->sampling.prompt_lp ? "asked" : "not asked");
            return why;
        }
        if (!q) {
            if (rid == 0 || rid > b->next_rid) {
                snprintf(why, whylen, "rid %llu was never assigned", (unsigned long long)rid);
                return why;
            }
            continue; /* ended here (cancel, stop string, deadline): a late output */
        }
        if (q->worker != w) {
            snprintf(why, whylen, "rid %llu is not assigned to it", (unsigned long long)rid);
            return why;
        }
        if (q->out_mark == serial) {
            snprintf(why, whylen, "rid %llu appears twice in one out", (unsigned long long)rid);
            return why;
        }
        q->out_mark = serial;
    }
    return NULL;
}

static void on_out(broker *b, bk_worker *w, const proto_out *o, double t) {
    char why[160];
    if (out_check(b, w, o, why, sizeof why)) {
        /* nothing of a lying message reaches a client; its requests go back to the queue (or fail if they
         * streamed already) and the worker is forgotten (its next message gets reregister) */
        b->c.lying_workers++;
        fprintf(stderr, "zllm-broker: worker %s (model %s) forgotten: %s\n", w->name, w->model->name, why);
        worker_remove(b, w, why);
        return;
    }
    note_step(w, o->step, t);
    for (uint32_t i = 0; i < o->n; i++) {
        bk_req *q = find_by_rid(b, o->rids[i]);
        if (!q || q->worker != w) { b->c.late_outputs++; continue; }
        int fin = o->fin[i];
        int stopped = 0;
        if (o->plp && o->plp[i].n && fin != PROTO_FIN_ERROR && fin != PROTO_FIN_CANCELLED)
            req_plp(b, q, o->plp[i].start, o->plp[i].n, o->plp[i].lps);
        if (o->toks[i] >= 0 && fin != PROTO_FIN_ERROR && fin != PROTO_FIN_CANCELLED)
            stopped = req_token(b, q, o->toks[i], o->lps ? &o->lps[i] : NULL, t);
        if (stopped) {
            req_finish(b, q, PROTO_FINISH_STOP, PROTO_CODE_NONE, NULL, 1, fin == PROTO_FIN_RUNNING);
        } else if (fin == PROTO_FIN_STOP || fin == PROTO_FIN_LENGTH) {
            req_finish(b, q, fin == PROTO_FIN_STOP ? PROTO_FINISH_STOP : PROTO_FINISH_LENGTH, PROTO_CODE_NONE, NULL, 1, 0);
        } else if (fin == PROTO_FIN_CANCELLED) {
            /* the worker dropped it without our asking (e.g. it restarted its batch) */
            req_finish(b, q, PROTO_FINISH_ERROR, PROTO_CODE_WORKER_FAILED, "the worker dropped the sequence", 1, 0);
        } else if (fin == PROTO_FIN_ERROR) {
            b->c.worker_errors++;
            req_finish(b, q, PROTO_FINISH_ERROR, PROTO_CODE_WORKER_FAILED, "the worker could not run the sequence", 1, 0);
        } else if (o->toks[i] >= 0 && q->n_gen >= q->max_tokens) {
            /* the worker should have said fin=2; enforce max_tokens anyway */
            req_finish(b, q, PROTO_FINISH_LENGTH, PROTO_CODE_NONE, NULL, 1, 1);
        }
    }
}

static void on_worker_msg(broker *b, const uint8_t *wid, uint32_t wn, const void *data, size_t len) {
    char err[256];
    proto_msg *m = &b->msg;
    double t = now_ms();
    if (wn == 0 || wn > BK_WID_MAX) { b->c.bad_messages++; return; }
    if (proto_decode(data, len, m, err, sizeof err) != 0) {
        b->c.bad_messages++;
        logf_(b, "bad worker message: %s", err);
        bk_worker *w = worker_find(b, wid, wn);
        if (w) { /* a registered worker that breaks the protocol is not trusted with requests */
            b->c.lying_workers++;
            fprintf(stderr, "zllm-broker: worker %s (model %s) forgotten: %s\n", w->name, w->model->name, err);
            worker_remove(b, w, err);
        }
        return;
    }
    if (m->type == PROTO_REGISTER) { on_register(b, wid, wn, &m->reg); return; }
    bk_worker *w = worker_find(b, wid, wn);
    if (!w) {
        if (m->type == PROTO_HB || m->type == PROTO_OUT) reregister(b, wid, wn);
        else b->c.bad_messages++;
        return;
    }
    w->last_seen = t;
    switch (m->type) {
    case PROTO_HB:
        if (m->hb.has_step) {
            note_step(w, m->hb.step, t);
            if (m->hb.prefills_shared > w->prefills_shared)
                b->c.prefills_shared += m->hb.prefills_shared - w->prefills_shared;
            w->prefills_shared = m->hb.prefills_shared;
            w->hb_free = m->hb.free_slots;
            w->hb_running = m->hb.running;
            if (m->hb.kv.has_kv) {
                w->kv = m->hb.kv;
                w->kv.hashes = NULL; /* they point into the decode arena */
                w->kv.n_hashes = 0;
            }
            if (m->hb.kv.has_hashes && w->summary) bk_summary_report(w->summary, m->hb.kv.hashes, m->hb.kv.n_hashes, t);
        }
        break;
    case PROTO_OUT: on_out(b, w, &m->out, t); break;
    default: b->c.bad_messages++; break;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * dispatch: per model, in queue order (priority, then FIFO); each request goes to the worker bk_route_pick
 * chooses (cache-aware routing, docs/kv-cache.md) or, without it, to the worker with the most free slots; runs
 * of requests for one worker share one `assign` */

static int req_fits(const bk_req *q, const bk_worker *w) {
    return (uint64_t)q->n_prompt + (q->max_tokens ? q->max_tokens : 1) <= w->n_ctx;
}

/* the prompt's chained block hashes for block size bs (computed once per request and block size) */
static int req_hashes(bk_req *q, uint32_t bs) {
    if (bs == 0 || bs > KV_BLOCK_MAX) return 0;
    if (q->bhash_bs == (int)bs) return q->n_bhash;
    int nb = (int)(q->n_prompt / bs);
    if (nb > BK_ROUTE_MAX_BLOCKS) nb = BK_ROUTE_MAX_BLOCKS;
    if (nb > q->n_bhash || !q->bhash) {
        uint64_t *h = realloc(q->bhash, (size_t)(nb ? nb : 1) * sizeof *h);
        if (!h) return 0;
        q->bhash = h;
    }
    kv_hash_prompt(q->model->kv_key, q->prompt, nb * (int)bs, (int)bs, q->bhash, nb);
    q->n_bhash = nb;
    q->bhash_bs = (int)bs;
    return nb;
}

/* the worker for q, or NULL (it waits); *no_fit set when no worker's context fits it at all, *how to 1 when the
 * worker holds a prefix of the prompt, 2 when a longer prefix elsewhere was passed over for load, else 0 */
static bk_worker *route(broker *b, bk_model *m, bk_req *q, double t, int slack, int *no_fit, int *how) {
    static bk_cand cand[BK_MAX_WORKERS];
    static bk_worker *who[BK_MAX_WORKERS];
    int n = 0, any_fit = 0;
    uint32_t most_slots = 0;
    for (int i = 0; i < b->n_workers; i++) {
        bk_worker *w = b->workers[i];
        if (w->model != m || w->failed) continue;
        if (w->n_slots > most_slots) most_slots = w->n_slots;
        bk_cand *c = &cand[n];
        c->fits = req_fits(q, w);
        any_fit |= c->fits;
        c->load = (int)w->used;
        c->free = w->used < w->n_slots ? (int)(w->n_slots - w->used) : 0;
        c->match = 0;
        if (c->fits && b->cfg.route_cache && w->summary && w->kv_block == m->kv_block) {
            int nb = req_hashes(q, w->kv_block);
            c->match = bk_summary_match(w->summary, q->bhash, nb, t);
        }
        who[n++] = w;
    }
    *no_fit = !any_fit;
    int balanced = 0;
    if (slack < 0) slack = most_slots / 4 > 1 ? (int)(most_slots / 4) : 1;
    int k = bk_route_pick(cand, n, slack, &balanced);
    if (k < 0) return NULL;
    *how = balanced ? 2 : cand[k].match > 0;
    return who[k];
}

/* 1 when some worker of m has a free slot */
static int model_has_room(const broker *b, const bk_model *m) {
    for (int i = 0; i < b->n_workers; i++) {
        const bk_worker *w = b->workers[i];
        if (w->model == m && !w->failed && w->used < w->n_slots) return 1;
    }
    return 0;
}

/* Picks the next request to send and its worker. Affinity first: the first request, among the first
 * BK_ROUTE_WINDOW queued ones of the head's priority, whose longest-prefix worker (or, with no prefix anywhere, the
 * worker with the most free slots) has a free slot. Only when none of them has, the head goes where
 * bk_route_pick's load rule (--route-slack) sends it, or waits. NULL when nothing can go now; the head is ended
 * with no_capacity when no worker's context fits it any more. */
static bk_req *dispatch_pick(broker *b, bk_model *m, double t, bk_worker **best, int *how) {
    int nf = 0;
    if (!model_has_room(b, m)) return NULL;
    if (b->cfg.route_cache) {
        int scanned = 0;
        for (bk_req *x = m->q_head; x && scanned < BK_ROUTE_WINDOW && x->priority == m->q_head->priority;
             x = x->next, scanned++) {
            *best = route(b, m, x, t, INT32_MAX, &nf, how);
            if (*best) return x;
        }
    }
    while (m->q_head) {
        bk_req *head = m->q_head;
        *best = route(b, m, head, t, b->cfg.route_slack, &nf, how);
        if (*best) return head;
        int nw;
        model_max_worker_ctx(b, m, &nw);
        if (!(nw > 0 && nf)) return NULL; /* wait for capacity (or for a worker to register) */
        /* workers changed since validation: it can never fit now */
        req_finish(b, head, PROTO_FINISH_ERROR, PROTO_CODE_NO_CAPACITY,
                   "prompt + max_tokens exceeds the context of every worker of its model", 1, 0);
    }
    return NULL;
}

static void dispatch_model(broker *b, bk_model *m, double t) {
    bk_worker *best;
    int how;
    bk_req *q;
    while ((q = dispatch_pick(b, m, t, &best, &how)) != NULL) {
        uint32_t room = best->n_slots - best->used, n = 0;
        uint64_t batch_tokens = 0, batch_format = 0;
        if (room > PROTO_MAX_SEQS) room = PROTO_MAX_SEQS;
        if (room > b->seqs_cap) {
            proto_seq *s = realloc(b->seqs, (size_t)room * sizeof *s);
            if (!s) return;
            b->seqs = s;
            b->seqs_cap = room;
        }
        if (best->used == 0) best->last_step_change = t;  /* the hang clock starts when it gets work */
        /* one assign stays well under the worker frame limit: at most BK_ASSIGN_TOKENS prompt tokens (one
         * request always goes, whatever its size: its prompt fits the client frame limit). The requests queued
         * right behind the first join it while routing sends them to the same worker. */
        while (q && n < room && req_fits(q, best) &&
               (n == 0 || (batch_tokens + q->n_prompt <= BK_ASSIGN_TOKENS &&
                           batch_format + q->format_len <= BK_ASSIGN_FORMAT_BYTES))) {
            int nf;
            /* with cache routing over workers that report KV blocks, each request goes where routing sends it;
             * otherwise the batch takes the queue's head run, as FIFO dispatch to the least loaded worker always
             * did (one assign for the run) */
            if (n > 0 && b->cfg.route_cache && m->kv_block && route(b, m, q, t, INT32_MAX, &nf, &how) != best) break;
            bk_req *next = q->next;
            b->c.cache_routed += how == 1;
            b->c.cache_balanced += how == 2;
            batch_tokens += q->n_prompt;
            batch_format += q->format_len;
            queue_remove(b, q);
            worker_attach(b, best, q);
            if (best->summary && b->cfg.route_cache &&
                best->kv_block == m->kv_block) { /* its blocks count as there until the worker reports */
                int nb = req_hashes(q, best->kv_block);
                bk_summary_note(best->summary, q->bhash, nb, t);
            }
            q->t_admit = t > q->t_recv ? t : q->t_recv;
            proto_seq *s = &b->seqs[n++];
            memset(s, 0, sizeof *s);
            s->rid = q->rid;
            s->tokens = q->prompt;
            s->n_tokens = q->n_prompt;
            s->max_tokens = q->max_tokens;
            s->sampling = q->sampling;
            s->stop_ids = q->stop_ids;
            s->n_stop_ids = q->n_stop_ids;
            s->format.kind = q->format_kind;
            s->format.text = (proto_str){q->format_text, q->format_len};
            for (uint32_t k = 0; q->share_rid && k + 1 < n; k++) /* its sibling 0 in this same assign */
                if (b->seqs[k].rid == q->share_rid) s->share = q->share_rid;
            s->priority = q->priority;
            q = next;
        }
        proto_encode_assign(&b->out, b->seqs, n);
        send_worker(b, best, &b->out);
        if (best->failed) return;  /* handled (requeue) at the next safe point */
    }
}

static void dispatch(broker *b, double t) {
    for (int i = 0; i < b->n_models; i++)
        if (b->models[i].q_head) dispatch_model(b, &b->models[i], t);
}

/* ---------------------------------------------------------------------------------------------------------
 * safe points and timers */

static void process_lost(broker *b) {
    for (int k = 0; k < b->n_lost; k++) {
        b->c.clients_lost++;
        bk_req *q = b->all;
        while (q) {
            bk_req *nx = q->all_next;
            if (q->cid_len == b->lost_len[k] && memcmp(q->cid, b->lost[k], q->cid_len) == 0)
                req_finish(b, q, PROTO_FINISH_CANCELLED, PROTO_CODE_NONE, NULL, 0, 1);
            q = nx;
        }
    }
    b->n_lost = 0;
}

static void process_failed_workers(broker *b) {
    for (int i = 0; i < b->n_workers;) {
        bk_worker *w = b->workers[i];
        if (w->failed) { b->c.worker_deaths++; worker_remove(b, w, "unreachable"); }
        else i++;
    }
}

static void tick(broker *b, double t) {
    /* workers: dead (silent) or hung (step counter still while holding work) */
    for (int i = 0; i < b->n_workers;) {
        bk_worker *w = b->workers[i];
        const char *why = NULL;
        if (t - w->last_seen > b->cfg.dead_ms) why = "no heartbeat";
        else if (w->used > 0 && t - w->last_step_change > b->cfg.hang_ms) why = "step counter stalled (hung)";
        if (why) { b->c.worker_deaths++; worker_remove(b, w, why); }
        else i++;
    }
    /* heartbeats to workers */
    if (t - b->last_hb >= b->cfg.heartbeat_ms) {
        b->last_hb = t;
        proto_encode_hb_broker(&b->out);
        for (int i = 0; i < b->n_workers; i++) send_worker(b, b->workers[i], &b->out);
    }
    /* deadlines */
    bk_req *q = b->all;
    while (q) {
        bk_req *nx = q->all_next;
        if (t >= q->deadline)
            req_finish(b, q, PROTO_FINISH_TIMEOUT, PROTO_CODE_TIMEOUT, "the request's deadline passed", 1, 1);
        q = nx;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * setup */

void broker_config_defaults(bk_config *c) {
    memset(c, 0, sizeof *c);
    c->queue_max = 1024;
    c->drain_ms = 10000;
    c->heartbeat_ms = 500;
    c->dead_ms = 2500;
    c->hang_ms = 2500;
    c->client_hwm = 10000;
    c->queue_tokens = 1u << 22;
    c->max_workers = 64;
    c->route_cache = 1;
    c->route_slack = -1;
}

/* 16 hex digits from /dev/urandom (time and pid when it cannot be read): tells clients one broker process
 * from the next */
static void instance_id(char out[17]) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = hash_rid((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ hash_rid((uint64_t)getpid());
    }
    if (fd >= 0) close(fd);
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* The worker socket's ipc://PATH: the socket file is 0600 (connecting needs write access to it), whatever the
 * umask; its directory is created 0700 when missing. An existing directory that others may write to is refused
 * unless it has the sticky bit (/tmp): they could swap the socket file. Returns 0 or -1 with a message. */
static int ipc_prepare(const char *ep, char *err, size_t errlen) {
    if (strncmp(ep, "ipc://", 6) != 0) return 0;
    const char *path = ep + 6;
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    char dir[256];
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) {
        berr(err, errlen, "%s: directory path too long", ep);
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = 0;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, 0700) != 0) {
            berr(err, errlen, "%s: directory %s: %s", ep, dir, strerror(errno));
            return -1;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        berr(err, errlen, "%s: %s is not a directory", ep, dir);
        return -1;
    } else if ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)) {
        /* others could replace the socket file with their own and stand in for the broker */
        berr(err, errlen, "%s: directory %s is writable by other users (mode %03o) without the sticky bit", ep, dir,
             (unsigned)(st.st_mode & 0777));
        return -1;
    }
    return 0;
}

static void ipc_restrict(const char *bound) {
    if (strncmp(bound, "ipc://", 6) == 0) chmod(bound + 6, 0600);
}

static int load_model(bk_model *m, const char *name, const char *path, char *err, size_t errlen) {
    char gerr[256];
    gguf *g = gguf_open(path, gerr, sizeof gerr);
    if (!g) { berr(err, errlen, "%s", gerr); return -1; }
    m->tok = tokenizer_new(g, gerr, sizeof gerr);
    if (!m->tok) { berr(err, errlen, "%s: %s", path, gerr); gguf_close(&g); return -1; }
    m->n_vocab = tokenizer_n_vocab(m->tok);
    m->piece_cap = tokenizer_stream_cap(m->tok);
    m->piece = malloc(m->piece_cap);
    if (!m->piece) {
        berr(err, errlen, "%s: out of memory", path);
        gguf_close(&g);
        return -1;
    }
    char *arch = gguf_get_cstr(g, "general.architecture");
    if (arch) {
        char key[160];
        snprintf(key, sizeof key, "%s.context_length", arch);
        int64_t n = gguf_get_int(g, key, 0);
        m->n_ctx = n > 0 && n < (1 << 30) ? (uint32_t)n : 0;
        free(arch);
    }
    gguf_close(&g);
    if (name) snprintf(m->name, sizeof m->name, "%s", name);
    else {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        size_t n = strlen(base);
        if (n > 5 && strcmp(base + n - 5, ".gguf") == 0) n -= 5;
        if (n > PROTO_NAME_MAX) n = PROTO_NAME_MAX;
        memcpy(m->name, base, n);
        m->name[n] = 0;
    }
    if (!m->name[0]) { berr(err, errlen, "%s: empty model name", path); return -1; }
    m->kv_key = kv_hash_model(m->name, strlen(m->name));
    return 0;
}

static int setup_socket(broker *b, void *s, int max_frame, int hwm, const char *ep, char *bound, size_t boundlen,
                        int curve, char *err, size_t errlen) {
    int one = 1, zero = 0;
    int64_t maxmsg = max_frame; /* the socket's limit: above it libzmq drops the connection */
    int hs = 5000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    if (curve) {
        char sec[41], cerr[256];
        /* curve 2: the worker socket with its own allow-list (its own ZAP domain) */
        const char *dom = curve == 2 ? BK_ZAP_DOMAIN_WORKERS : BK_ZAP_DOMAIN;
        if (zkey_read(b->cfg.curve_secret, sec, cerr, sizeof cerr) != 0) {
            berr(err, errlen, "%s", cerr);
            return -1;
        }
        if (zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
            zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40) != 0 ||
            zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, dom, strlen(dom)) != 0) {
            berr(err, errlen, "CURVE setup: %s", zmq_strerror(errno));
            return -1;
        }
        /* draft option in libzmq 4.3: refuse handshakes when the ZAP handler does not answer. Our handler
         * always answers and checks the domain itself, so a libzmq without the option still fails closed. */
        zmq_setsockopt(s, 93 /* ZMQ_ZAP_ENFORCE_DOMAIN */, &one, sizeof one);
    }
    int is_ws = s == b->ws; /* the worker socket: ipc protections (clients may be other local users) */
    if (is_ws && ipc_prepare(ep, err, errlen) != 0) return -1;
    /* the ipc socket file is created by this thread inside zmq_bind: a 077 umask leaves no moment when another
     * user could connect; ipc_restrict repeats it for the record */
    mode_t um = is_ws ? umask(077) : 0;
    int brc = zmq_bind(s, ep);
    int berrno = errno;
    if (is_ws) umask(um);
    if (brc != 0) {
        berr(err, errlen, "bind %s: %s", ep, zmq_strerror(berrno));
        return -1;
    }
    size_t n = boundlen;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, bound, &n) != 0) bound[0] = 0;
    if (is_ws) ipc_restrict(bound);
    return 0;
}

broker *broker_new(const bk_config *c, char *err, size_t errlen) {
    broker *b = calloc(1, sizeof *b);
    if (!b) { berr(err, errlen, "out of memory"); return NULL; }
    b->cfg = *c;
    b->grammars = grammar_cache_new(BK_GRAMMAR_CACHE);
    if (!b->grammars) {
        berr(err, errlen, "out of memory");
        goto fail;
    }
    if (c->n_models < 1) { berr(err, errlen, "at least one --model is needed"); goto fail; }
    for (int i = 0; i < c->n_models && i < BK_MAX_MODELS; i++) {
        if (load_model(&b->models[i], c->model_names[i], c->model_paths[i], err, errlen) != 0) goto fail;
        for (int j = 0; j < i; j++)
            if (strcmp(b->models[j].name, b->models[i].name) == 0) {
                berr(err, errlen, "model name '%s' given twice", b->models[i].name);
                b->n_models = i + 1;
                goto fail;
            }
        b->n_models = i + 1;
    }
    if (maps_grow(b) != 0) { berr(err, errlen, "out of memory"); goto fail; }
    b->ctx = zmq_ctx_new();
    if (!b->ctx) { berr(err, errlen, "zmq_ctx_new failed"); goto fail; }
    int curve = c->curve_secret != NULL;
    /* fail closed: asking for CURVE on the worker socket without keys must not silently serve plain text */
    if (c->curve_workers && !curve) { berr(err, errlen, "--curve-workers needs --curve-secret and --curve-allow"); goto fail; }
    if (c->curve_allow_workers && !c->curve_workers) { berr(err, errlen, "--curve-allow-workers needs --curve-workers"); goto fail; }
    /* fail closed: a worker receives every prompt's token ids and its answers reach clients */
    if (c->workers_ep && strncmp(c->workers_ep, "tcp://", 6) == 0 && !c->curve_workers && !c->insecure_tcp_workers) {
        berr(err, errlen,
             "the workers endpoint %s is tcp:// without CURVE: any process that reaches it could register "
             "as a worker and read every prompt; use --curve-workers (with --curve-secret, --curve-allow), an ipc:// "
             "endpoint, or --insecure-tcp-workers for a loopback test setup",
             c->workers_ep);
        goto fail;
    }
    if (c->max_workers < 1 || c->max_workers > BK_MAX_WORKERS) {
        berr(err, errlen, "max_workers %u outside 1..%d", c->max_workers, BK_MAX_WORKERS);
        goto fail;
    }
    instance_id(b->inst);
    if (curve) {
        if (!c->curve_allow) { berr(err, errlen, "--curve-secret needs --curve-allow DIR"); goto fail; }
        b->zap = bk_zap_new(b->ctx, c->curve_allow, err, errlen);
        if (!b->zap) goto fail;
        if (c->curve_allow_workers && bk_zap_add_workers(b->zap, c->curve_allow_workers, err, errlen) != 0) goto fail;
    }
    b->cs = zmq_socket(b->ctx, ZMQ_ROUTER);
    b->ws = zmq_socket(b->ctx, ZMQ_ROUTER);
    if (!b->cs || !b->ws) { berr(err, errlen, "zmq_socket: %s", zmq_strerror(errno)); goto fail; }
    int handover = 1;
    zmq_setsockopt(b->ws, ZMQ_ROUTER_HANDOVER, &handover, sizeof handover);
    if (setup_socket(b, b->cs, BK_CLIENT_SOCKET_MAX, (int)c->client_hwm, c->clients_ep, b->cs_ep, sizeof b->cs_ep,
                     curve, err, errlen) ||
        setup_socket(b, b->ws, PROTO_WORKER_MAX_FRAME, 100000, c->workers_ep, b->ws_ep, sizeof b->ws_ep,
                     curve && c->curve_workers ? (c->curve_allow_workers ? 2 : 1) : 0, err, errlen))
        goto fail;
    return b;
fail:
    broker_destroy(&b);
    return NULL;
}

const char *broker_clients_endpoint(const broker *b) { return b->cs_ep; }
const char *broker_workers_endpoint(const broker *b) { return b->ws_ep; }

/* ---------------------------------------------------------------------------------------------------------
 * loop */

static void drain_socket(broker *b, void *sock, int is_client) {
    for (int k = 0; k < BK_RECV_BATCH; k++) {
        zmq_msg_t id, body;
        int r = recv_routed(b, sock, &id, &body);
        if (r == 0) break;
        if (r < 0) continue;
        if (is_client)
            on_client_msg(b, zmq_msg_data(&id), (uint32_t)zmq_msg_size(&id), zmq_msg_data(&body), zmq_msg_size(&body));
        else
            on_worker_msg(b, zmq_msg_data(&id), (uint32_t)zmq_msg_size(&id), zmq_msg_data(&body), zmq_msg_size(&body));
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}

int broker_run(broker *b, char *err, size_t errlen) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    b->last_tick = b->last_hb = now_ms();
    for (;;) {
        zmq_pollitem_t items[3] = {
            { b->cs, 0, ZMQ_POLLIN, 0 }, { b->ws, 0, ZMQ_POLLIN, 0 }, { b->zap ? bk_zap_socket(b->zap) : NULL, 0, ZMQ_POLLIN, 0 },
        };
        int n_items = b->zap ? 3 : 2;
        int rc = zmq_poll(items, n_items, BK_TICK_MS);
        if (rc < 0 && errno != EINTR) { berr(err, errlen, "zmq_poll: %s", zmq_strerror(errno)); return -1; }
        double t = now_ms();
        if (s_stop && !b->draining) {
            b->draining = 1;
            b->drain_end = t + b->cfg.drain_ms;
            logf_(b, "draining: %u queued, %u running, deadline %u ms", b->n_queued, b->n_running, b->cfg.drain_ms);
        }
        if (rc > 0) {
            if (b->zap && (items[2].revents & ZMQ_POLLIN)) bk_zap_handle(b->zap);
            if (items[1].revents & ZMQ_POLLIN) drain_socket(b, b->ws, 0);
            if (items[0].revents & ZMQ_POLLIN) drain_socket(b, b->cs, 1);
        }
        process_lost(b);
        process_failed_workers(b);
        if (t - b->last_tick >= BK_TICK_MS) {
            b->last_tick = t;
            tick(b, t);
            process_lost(b);
            process_failed_workers(b);
        }
        dispatch(b, now_ms());
        if (b->draining) {
            if (b->n_reqs == 0) break;
            if (t >= b->drain_end) {
                bk_req *q = b->all;
                while (q) {
                    bk_req *nx = q->all_next;
                    req_finish(b, q, PROTO_FINISH_ERROR, PROTO_CODE_SHUTTING_DOWN, "the broker shut down", 1, 1);
                    q = nx;
                }
                break;
            }
        }
    }
    logf_(b, "drained: %llu completed, %llu errors", (unsigned long long)b->c.completed, (unsigned long long)b->c.errors);
    return 0;
}

void broker_destroy(broker **pb) {
    if (!pb || !*pb) return;
    broker *b = *pb;
    while (b->all) { bk_req *q = b->all; b->all = q->all_next; req_free(q); }
    for (int i = 0; i < b->n_workers; i++) {
        bk_summary_destroy(&b->workers[i]->summary);
        free(b->workers[i]);
    }
    for (int i = 0; i < b->n_models; i++) tokenizer_destroy(&b->models[i].tok);
    for (int i = 0; i < BK_MAX_MODELS; i++) {
        if (b->models[i].tok) tokenizer_destroy(&b->models[i].tok);
        free(b->models[i].piece);
    }
    /* unbinding removes ipc socket files */
    if (b->cs) { if (b->cs_ep[0]) zmq_unbind(b->cs, b->cs_ep); zmq_close(b->cs); }
    if (b->ws) { if (b->ws_ep[0]) zmq_unbind(b->ws, b->ws_ep); zmq_close(b->ws); }
    bk_zap_destroy(&b->zap);
    if (b->ctx) zmq_ctx_term(b->ctx);
    free(b->hmap);
    free(b->rmap);
    free(b->seqs);
    grammar_cache_destroy(&b->grammars);
    proto_msg_free(&b->msg);
    proto_buf_free(&b->out);
    free(b);
    *pb = NULL;
}
