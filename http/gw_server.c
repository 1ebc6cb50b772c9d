/* http/gw_server.c: zllm-http's HTTP side and event loop (see gw_server.h). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <microhttpd.h>
#include <jansson.h>
#include "gw_broker.h"
#include "gw_encode.h"
#include "gw_metrics.h"
#include "gw_request.h"
#include "gw_server.h"
#include "gw_vocab.h"
#include "tokenizer.h"

#define STATUS_EVERY_MS 500 /* status requests to the broker */
#define BROKER_DOWN_MS 3000 /* no status reply for this long: the broker counts as unreachable */
#define BROKER_FAIL_MS 6000 /* ... and requests in flight end with 503 after this long */
#define TAG_MHD 1
#define TAG_BROKER 2
#define TAG_LISTEN 3
#define ACCEPT_BATCH 1024 /* connections accepted per loop turn at most */
#define TAG_CONN_BASE 16  /* epoll data of a watched client socket: TAG_CONN_BASE + slot */

typedef enum { R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_TOKENIZE, R_DETOKENIZE, R_METRICS, R_NONE } route;
static const char *s_route_name[] = {"chat",     "completions", "models",  "health",
                                     "tokenize", "detokenize",  "metrics", "other"};

typedef enum {
    S_NEW,    /* reading the request */
    S_WAIT,   /* at the broker, suspended until its first message */
    S_REPLY,  /* a complete response is ready to queue */
    S_STREAM, /* an SSE response is queued */
} conn_state;

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
    int fd;   /* the client socket while watched for hang-ups, else -1 */
    int gone; /* the client hung up */
    int stream, include_usage, started;
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
    uint64_t next_uid;
    char instance[12];
    /* the broker's last status reply (a copy of the frame and its decode) */
    uint8_t *st_frame;
    size_t st_len;
    proto_msg st_msg;
    int has_status;
    uint64_t last_accepted; /* the broker's `accepted` counter in its last status */
    double t_status_sent, t_status_recv, t_start;
};

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void gw_config_defaults(gw_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->max_body = 4u << 20;
    c->max_header = 64u << 10;
    c->max_connections = 16384;
    c->idle_timeout_s = 30;
    c->max_stream_buffer = 1u << 20;
}

/* ---- broker state ---- */

static const proto_status *s_status(const gw_server *s) { return s->has_status ? &s->st_msg.status : NULL; }

static int s_broker_up(const gw_server *s) {
    return s->has_status && s_now() - s->t_status_recv < BROKER_DOWN_MS / 1e3;
}

static int s_broker_has_model(const gw_server *s, const char *name) {
    const proto_status *st = s_status(s);
    for (uint32_t i = 0; st && i < st->n_models; i++)
        if (proto_str_eq(st->models[i], name)) return 1;
    return 0;
}

static int s_alive_workers(const gw_server *s, const char *model) {
    const proto_status *st = s_status(s);
    int n = 0;
    for (uint32_t i = 0; st && i < st->n_workers; i++)
        if (st->workers[i].alive && proto_str_eq(st->workers[i].model, model)) n++;
    return n;
}

/* the broker model behind the client's name, into out; 0, or -1 with e (404) */
static int s_resolve_model(const gw_server *s, const char *name, char *out, size_t cap, gw_error *e) {
    const proto_status *st = s_status(s);
    if (s->cfg.n_alias > 0) {
        for (int i = 0; i < s->cfg.n_alias; i++) {
            if (name[0] && strcmp(s->cfg.alias[i], name)) continue;
            const char *t = s->cfg.target[i];
            if (!t[0] && st && st->n_models >= 1) {
                proto_str_copy(st->models[0], out, cap);
                return 0;
            }
            snprintf(out, cap, "%s", t);
            return 0;
        }
    } else if (!name[0]) {
        if (st && st->n_models >= 1) proto_str_copy(st->models[0], out, cap);
        else out[0] = 0;
        return 0;
    } else if (!st || s_broker_has_model(s, name)) {
        snprintf(out, cap, "%s", name);
        return 0;
    }
    return gw_error_set(e, 404, "not_found_error", "model", "model_not_found", "The model '%.128s' does not exist",
                        name);
}

/* ---- request slots ---- */

static int s_slot_take(gw_server *s, gw_conn *c) {
    if (s->n_free == 0) {
        int n = s->n_slots ? s->n_slots * 2 : 1024;
        gw_conn **sl = realloc(s->slots, (size_t)n * sizeof *sl);
        if (!sl) return -1;
        s->slots = sl;
        uint32_t *g = realloc(s->gens, (size_t)n * sizeof *g);
        if (!g) return -1;
        s->gens = g;
        int *f = realloc(s->free_slots, (size_t)n * sizeof *f);
        if (!f) return -1;
        s->free_slots = f;
        for (int i = n - 1; i >= s->n_slots; i--) {
            s->slots[i] = NULL;
            s->gens[i] = 0;
            s->free_slots[s->n_free++] = i;
        }
        s->n_slots = n;
    }
    int i = s->free_slots[--s->n_free];
    s->slots[i] = c;
    s->gens[i]++;
    c->slot = i;
    snprintf(c->bid, sizeof c->bid, "g%d.%u", i, s->gens[i]);
    return 0;
}

static void s_slot_give(gw_server *s, gw_conn *c) {
    if (c->slot < 0) return;
    s->slots[c->slot] = NULL;
    s->free_slots[s->n_free++] = c->slot;
    c->slot = -1;
}

/* the request a broker id names, or NULL (finished, or not ours) */
static gw_conn *s_slot_find(gw_server *s, proto_str id) {
    char tmp[32];
    if (id.n < 2 || id.n >= sizeof tmp || id.p[0] != 'g') return NULL;
    proto_str_copy(id, tmp, sizeof tmp);
    char *end;
    long i = strtol(tmp + 1, &end, 10);
    if (*end != '.' || i < 0 || i >= s->n_slots) return NULL;
    unsigned long g = strtoul(end + 1, &end, 10);
    if (*end || !s->slots[i] || s->gens[i] != g) return NULL;
    return s->slots[i];
}

/* ---- connection helpers ---- */

static void s_resume(gw_conn *c) {
    if (!c->suspended) return;
    c->suspended = 0;
    MHD_resume_connection(c->conn);
}

static void s_unwatch(gw_conn *c) {
    if (c->fd < 0) return;
    epoll_ctl(c->srv->ep, EPOLL_CTL_DEL, c->fd, NULL);
    c->fd = -1;
}

static void s_watch(gw_conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = TAG_CONN_BASE + (uint64_t)c->slot};
    if (epoll_ctl(c->srv->ep, EPOLL_CTL_ADD, ci->connect_fd, &ev) == 0) c->fd = ci->connect_fd;
}

/* the request leaves the broker (final received, or cancelled by us) */
static void s_leave_broker(gw_conn *c) {
    if (!c->at_broker) return;
    c->at_broker = 0;
    gw_metrics_inflight(c->srv->metrics, -1);
}

/* counts the request's outcome once (the first status decided is the one the client saw) */
static void s_count(gw_conn *c, int status) {
    if (c->http_status) return;
    c->http_status = status;
    gw_metrics_request(c->srv->metrics, c->model, s_route_name[c->rt], status);
}

static enum MHD_Result s_queue(struct MHD_Connection *conn, int status, const char *type, const char *body,
                               int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_queue_error(gw_conn *c, const gw_error *e) {
    char *body = gw_encode_error(e);
    s_count(c, e->status);
    enum MHD_Result rc = s_queue(c->conn, e->status, "application/json", body ? body : "{}", e->status == 429 ? 1 : 0);
    free(body);
    return rc;
}

static enum MHD_Result s_queue_json(gw_conn *c, int status, json_t *o) {
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!body) {
        gw_error e;
        gw_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return s_queue_error(c, &e);
    }
    s_count(c, status);
    enum MHD_Result rc = s_queue(c->conn, status, "application/json", body, 0);
    free(body);
    return rc;
}

/* ---- broker finals -> HTTP ---- */

static void s_final_error(const proto_final *f, gw_error *e) {
    char msg[256];
    proto_str_copy(f->message, msg, sizeof msg);
    const char *code = proto_code_name(f->code);
    int status = 500;
    const char *type = "server_error";
    switch (f->code) {
    case PROTO_CODE_BAD_REQUEST:
    case PROTO_CODE_PROMPT_TOO_LONG:
    case PROTO_CODE_TEMPLATE_ERROR: status = 400, type = "invalid_request_error"; break;
    case PROTO_CODE_UNKNOWN_MODEL: status = 404, type = "not_found_error", code = "model_not_found"; break;
    case PROTO_CODE_OVERLOADED: status = 429, type = "rate_limit_error"; break;
    case PROTO_CODE_TIMEOUT: status = 504, type = "timeout_error"; break;
    case PROTO_CODE_WORKER_FAILED:
    case PROTO_CODE_SHUTTING_DOWN: status = 503, type = "service_unavailable"; break;
    default:
        if (f->finish == PROTO_FINISH_OVERLOADED) status = 429, type = "rate_limit_error", code = "overloaded";
        else if (f->finish == PROTO_FINISH_TIMEOUT) status = 504, type = "timeout_error", code = "timeout";
        else if (f->finish == PROTO_FINISH_CANCELLED) status = 503, type = "service_unavailable", code = "cancelled";
        break;
    }
    gw_error_set(e, status, type, NULL, code[0] ? code : NULL, "%s", msg[0] ? msg : (code[0] ? code : "error"));
}

/* the SSE stream starts: a 200 is queued when libmicrohttpd next calls the handler */
static void s_start_stream(gw_conn *c) {
    if (c->started) return;
    c->started = 1;
    c->state = S_STREAM;
    double t = s_now();
    gw_metrics_ttft(c->srv->metrics, c->model, t - c->t0);
    c->t_last = t;
}

/* a client that does not read its stream: the request is cancelled and the connection closed, so that the
 * gateway's memory stays bounded (the kernel's send buffer is bounded too, see s_accept) */
static void s_slow_reader(gw_conn *c) {
    gw_server *s = c->srv;
    gw_broker_cancel(s->broker, c->bid);
    s_leave_broker(c);
    s_count(c, 499);
    s_unwatch(c);
    c->gone = 1;
    s_slot_give(s, c);
    gw_buf_free(&c->out);
    c->out_off = 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) shutdown(ci->connect_fd, SHUT_RDWR); /* libmicrohttpd sees the error and closes it */
    s_resume(c);
}

static void s_on_token(gw_conn *c, const proto_token *t) {
    if (!c->stream) return;
    if (c->out.n - c->out_off > c->srv->cfg.max_stream_buffer) {
        s_slow_reader(c);
        return;
    }
    int first = !c->started;
    if (!first) {
        double now = s_now();
        gw_metrics_itl(c->srv->metrics, c->model, now - c->t_last);
        c->t_last = now;
    }
    s_start_stream(c);
    if (first || t->text.n) gw_sse_delta(&c->out, &c->resp, t->text.p ? t->text.p : "", t->text.n, first);
    s_resume(c);
}

static void s_on_final(gw_conn *c, const proto_final *f) {
    gw_server *s = c->srv;
    s_leave_broker(c);
    s_unwatch(c);
    int ok = f->finish == PROTO_FINISH_STOP || f->finish == PROTO_FINISH_LENGTH;
    const char *finish = f->finish == PROTO_FINISH_LENGTH ? "length" : "stop";
    if (ok) gw_metrics_tokens(s->metrics, c->model, f->prompt_tokens, f->completion_tokens);
    if (!ok) {
        gw_error e;
        s_final_error(f, &e);
        if (c->started) { /* after the first event: an error event, then [DONE] */
            gw_sse_error(&c->out, &e);
            gw_sse_done(&c->out);
            c->eof = 1;
            s_count(c, e.status);
        } else {
            c->reply_status = e.status;
            c->reply_body = gw_encode_error(&e);
            c->reply_type = "application/json";
            c->retry_after = e.status == 429 ? 1 : 0;
            c->state = S_REPLY;
        }
    } else if (c->stream) {
        int first = !c->started;
        s_start_stream(c);
        if (first || f->text.n) gw_sse_delta(&c->out, &c->resp, f->text.p ? f->text.p : "", f->text.n, first);
        gw_sse_finish(&c->out, &c->resp, finish);
        if (c->include_usage) gw_sse_usage(&c->out, &c->resp, f->prompt_tokens, f->completion_tokens);
        gw_sse_done(&c->out);
        c->eof = 1;
        s_count(c, 200);
    } else {
        gw_metrics_ttft(s->metrics, c->model, s_now() - c->t0);
        c->reply_status = 200;
        c->reply_body = gw_encode_full(&c->resp, f->text.p ? f->text.p : "", f->text.n, finish, f->prompt_tokens,
                                       f->completion_tokens);
        c->reply_type = "application/json";
        c->state = S_REPLY;
    }
    if (c->eof || c->state == S_REPLY) gw_metrics_e2e(s->metrics, c->model, s_now() - c->t0);
    s_slot_give(s, c);
    s_resume(c);
}

/* every request in flight ends with e (the broker went away) */
static void s_fail_all(gw_server *s, int code, const char *msg) {
    proto_final f = {0};
    f.finish = PROTO_FINISH_ERROR;
    f.code = code;
    f.message = proto_cstr(msg);
    for (int i = 0; i < s->n_slots; i++) {
        gw_conn *c = s->slots[i];
        if (c && c->at_broker) {
            gw_broker_cancel(s->broker, c->bid);
            s_on_final(c, &f);
        }
    }
}

static void s_broker_drain(gw_server *s) {
    const proto_msg *m;
    while (gw_broker_recv(s->broker, &m) == 1) {
        gw_conn *c;
        switch (m->type) {
        case PROTO_TOKEN:
            if ((c = s_slot_find(s, m->token.id))) s_on_token(c, &m->token);
            break;
        case PROTO_FINAL:
            if ((c = s_slot_find(s, m->final.id)) && c->at_broker) s_on_final(c, &m->final);
            break;
        case PROTO_ERROR:
            if (m->error.id.p && (c = s_slot_find(s, m->error.id)) && c->at_broker) {
                proto_final f = {0};
                f.finish = PROTO_FINISH_ERROR;
                f.code = PROTO_CODE_INTERNAL;
                f.message = m->error.message;
                s_on_final(c, &f);
            }
            break;
        case PROTO_STATUS: {
            size_t n;
            const void *fr = gw_broker_frame(s->broker, &n);
            uint8_t *copy = malloc(n ? n : 1);
            if (!copy) break;
            memcpy(copy, fr, n);
            char derr[64];
            proto_msg_free(&s->st_msg);
            if (proto_decode(copy, n, &s->st_msg, derr, sizeof derr) == 0) {
                free(s->st_frame);
                s->st_frame = copy;
                s->st_len = n;
                s->has_status = 1;
                s->t_status_recv = s_now();
                /* a broker whose `accepted` counter went back is a restarted one: what was in flight is lost */
                uint64_t acc = 0;
                for (uint32_t i = 0; i < s->st_msg.status.n_counters; i++)
                    if (proto_str_eq(s->st_msg.status.counters[i].name, "accepted"))
                        acc = s->st_msg.status.counters[i].value;
                if (acc < s->last_accepted) s_fail_all(s, PROTO_CODE_SHUTTING_DOWN, "the broker restarted");
                s->last_accepted = acc;
            } else {
                free(copy);
                s->has_status = 0;
            }
            break;
        }
        default: break;
        }
    }
}

/* ---- SSE body ---- */

static ssize_t s_sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gw_conn *c = cls;
    if (c->gone || c->out.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t have = c->out.n - c->out_off;
    if (have) {
        size_t n = have < max ? have : max;
        memcpy(buf, c->out.p + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out.n) c->out_off = c->out.n = 0;
        return (ssize_t)n;
    }
    if (c->eof) return MHD_CONTENT_READER_END_OF_STREAM;
    MHD_suspend_connection(c->conn); /* resumed by s_on_token / s_on_final / a hang-up */
    c->suspended = 1;
    return 0;
}

/* ---- routes ---- */

static enum MHD_Result s_generate(gw_conn *c) {
    gw_server *s = c->srv;
    gw_request r;
    gw_error e;
    if (gw_request_parse(c->rt == R_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS, c->body.p ? c->body.p : "", c->body.n, &r,
                         &e) != 0)
        return s_queue_error(c, &e);
    char bmodel[PROTO_NAME_MAX + 1];
    if (s_resolve_model(s, r.model, bmodel, sizeof bmodel, &e) != 0) goto fail;
    snprintf(c->model, sizeof c->model, "%s", r.model[0] ? r.model : bmodel);
    if (!s_broker_up(s)) {
        gw_error_set(&e, 503, "service_unavailable", NULL, "broker_unreachable", "the broker is unreachable");
        goto fail;
    }
    if (bmodel[0] && s_alive_workers(s, bmodel) == 0) {
        gw_error_set(&e, 503, "service_unavailable", NULL, "no_worker", "no worker serves the model '%s' now", bmodel);
        goto fail;
    }
    char uid[40];
    snprintf(uid, sizeof uid, "%s%llx", s->instance, (unsigned long long)++s->next_uid);
    if (s_slot_take(s, c) != 0 || gw_resp_init(&c->resp, r.ep, uid, c->model) != 0) {
        gw_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    r.gen.id = proto_cstr(c->bid);
    r.gen.model = bmodel[0] ? proto_cstr(bmodel) : (proto_str){0};
    int rc = gw_broker_submit(s->broker, &r.gen);
    if (rc != 0) {
        s_slot_give(s, c);
        if (rc == -2)
            gw_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "the request exceeds the broker's %u-byte message limit", PROTO_CLIENT_MAX_FRAME);
        else gw_error_set(&e, 503, "service_unavailable", NULL, "broker_unreachable", "the broker is unreachable");
        goto fail;
    }
    c->stream = r.stream;
    c->include_usage = r.include_usage;
    c->at_broker = 1;
    gw_metrics_inflight(s->metrics, 1);
    gw_request_free(&r);
    c->state = S_WAIT;
    s_watch(c);
    MHD_suspend_connection(c->conn);
    c->suspended = 1;
    return MHD_YES;
fail:
    gw_request_free(&r);
    return s_queue_error(c, &e);
}

static enum MHD_Result s_models(gw_conn *c) {
    gw_server *s = c->srv;
    const proto_status *st = s_status(s);
    json_t *data = json_array();
    long long created = (long long)time(NULL);
    if (s->cfg.n_alias > 0) {
        for (int i = 0; i < s->cfg.n_alias; i++)
            json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", s->cfg.alias[i], "object", "model",
                                                  "created", (json_int_t)created, "owned_by", "zllm"));
    } else if (st && s_broker_up(s)) {
        for (uint32_t i = 0; i < st->n_models; i++)
            json_array_append_new(data,
                                  json_pack("{s:s%, s:s, s:I, s:s}", "id", st->models[i].p, (size_t)st->models[i].n,
                                            "object", "model", "created", (json_int_t)created, "owned_by", "zllm"));
    } else {
        json_decref(data);
        gw_error e;
        gw_error_set(&e, 503, "service_unavailable", NULL, "broker_unreachable", "the broker is unreachable");
        return s_queue_error(c, &e);
    }
    return s_queue_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static enum MHD_Result s_health(gw_conn *c) {
    gw_server *s = c->srv;
    const proto_status *st = s_status(s);
    if (!s_broker_up(s))
        return s_queue_json(c, 503,
                            json_pack("{s:s, s:s}", "status", "unavailable", "reason", "the broker is unreachable"));
    for (uint32_t i = 0; i < st->n_models; i++) {
        char name[PROTO_NAME_MAX + 1];
        proto_str_copy(st->models[i], name, sizeof name);
        if (s_alive_workers(s, name) == 0)
            return s_queue_json(c, 503,
                                json_pack("{s:s, s:s, s:s}", "status", "unavailable", "reason",
                                          "no worker serves a model", "model", name));
    }
    if (st->n_models == 0)
        return s_queue_json(c, 503, json_pack("{s:s, s:s}", "status", "unavailable", "reason", "no model"));
    return s_queue_json(c, 200, json_pack("{s:s}", "status", "ok"));
}

static enum MHD_Result s_tokenize(gw_conn *c) {
    gw_error e;
    const zl_tokenizer *t = gw_vocab_get(c->srv->vocab, NULL);
    if (!t) {
        gw_error_set(&e, 501, "not_implemented", NULL, "no_vocabulary",
                     "start zllm-http with --model NAME=PATH to tokenize and detokenize");
        return s_queue_error(c, &e);
    }
    if (c->rt == R_DETOKENIZE) {
        int32_t *ids;
        size_t n;
        if (gw_detokenize_parse(c->body.p ? c->body.p : "", c->body.n, &ids, &n, &e) != 0) return s_queue_error(c, &e);
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= tokenizer_n_vocab(t)) {
                free(ids);
                gw_error_set(&e, 400, "invalid_request_error", "tokens", NULL, "tokens[%zu] is outside the vocabulary",
                             i);
                return s_queue_error(c, &e);
            }
        size_t len = 0;
        char *text = n ? tokenizer_decode_len(t, ids, (int)n, 0, &len) : strdup("");
        free(ids);
        json_t *o = text ? json_stringn(text, len) : NULL;
        if (text && !o) { /* not valid UTF-8 on its own (a partial character): replace as the stream does */
            gw_buf b = {0};
            gw_buf_json_str(&b, text, len);
            json_error_t je;
            o = b.failed ? NULL : json_loadb(b.p, b.n, JSON_DECODE_ANY, &je);
            gw_buf_free(&b);
        }
        free(text);
        return s_queue_json(c, 200, o ? json_pack("{s:o}", "content", o) : NULL);
    }
    void *root;
    const char *content;
    size_t len;
    int add_special, parse_special;
    if (gw_tokenize_parse(c->body.p ? c->body.p : "", c->body.n, &root, &content, &len, &add_special, &parse_special,
                          &e) != 0)
        return s_queue_error(c, &e);
    int n = tokenizer_encode(t, content, len, add_special && tokenizer_add_bos(t), parse_special, NULL, 0);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n > 0 && ids) n = tokenizer_encode(t, content, len, add_special && tokenizer_add_bos(t), parse_special, ids, n);
    json_decref(root);
    json_t *arr = json_array();
    for (int i = 0; ids && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return s_queue_json(c, 200, json_pack("{s:o}", "tokens", arr));
}

static enum MHD_Result s_metrics(gw_conn *c) {
    gw_buf b = {0};
    gw_metrics_request(c->srv->metrics, "", "metrics", 200);
    c->http_status = 200;
    gw_metrics_render(c->srv->metrics, s_broker_up(c->srv) ? s_status(c->srv) : NULL, s_broker_up(c->srv), &b);
    enum MHD_Result rc =
        s_queue(c->conn, b.failed ? 500 : 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", 0);
    gw_buf_free(&b);
    return rc;
}

/* ---- libmicrohttpd callbacks ---- */

static route s_route(const char *method, const char *url, int *bad_method) {
    static const struct {
        const char *path, *method;
        route rt;
    } t[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/completions", "POST", R_COMPLETIONS},
        {"/v1/models", "GET", R_MODELS},          {"/health", "GET", R_HEALTH},
        {"/tokenize", "POST", R_TOKENIZE},        {"/detokenize", "POST", R_DETOKENIZE},
        {"/metrics", "GET", R_METRICS},
    };
    *bad_method = 0;
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        if (strcmp(url, t[i].path)) continue;
        if (strcmp(method, t[i].method) && !(t[i].method[0] == 'G' && !strcmp(method, "HEAD"))) *bad_method = 1;
        return t[i].rt;
    }
    return R_NONE;
}

static int s_key_ok(const gw_server *s, struct MHD_Connection *conn) {
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->cfg.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->cfg.api_key[i % (b ? b : 1)];
    return diff == 0;
}

static enum MHD_Result s_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
    (void)version;
    gw_server *s = cls;
    gw_conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->srv = s;
        c->conn = conn;
        c->slot = -1;
        c->fd = -1;
        c->t0 = s_now();
        *con_cls = c;
        int bad_method;
        c->rt = s_route(method, url, &bad_method);
        if (c->rt == R_NONE)
            gw_error_set(&c->err, 404, "not_found_error", NULL, "not_found", "no route %.6s %.200s", method, url);
        else if (bad_method)
            gw_error_set(&c->err, 405, "invalid_request_error", NULL, "method_not_allowed",
                         "%.10s is not allowed on %.64s", method, url);
        else if (s->cfg.api_key &&
                 (c->rt == R_CHAT || c->rt == R_COMPLETIONS || c->rt == R_MODELS || c->rt == R_TOKENIZE ||
                  c->rt == R_DETOKENIZE) &&
                 !s_key_ok(s, conn))
            gw_error_set(&c->err, 401, "authentication_error", NULL, "invalid_api_key",
                         "a missing or wrong API key (Authorization: Bearer KEY)");
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (!c->err.status && cl && strtoull(cl, NULL, 10) > s->cfg.max_body)
            gw_error_set(&c->err, 413, "invalid_request_error", NULL, "body_too_large",
                         "the request body exceeds %zu bytes", s->cfg.max_body);
        if (c->err.status == 413) return s_queue_error(c, &c->err); /* answered before the body is read */
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!c->err.status && c->body.n + *upload_data_size > s->cfg.max_body) {
            gw_error_set(&c->err, 413, "invalid_request_error", NULL, "body_too_large",
                         "the request body exceeds %zu bytes", s->cfg.max_body);
            gw_buf_free(&c->body);
            *upload_data_size = 0;
            return s_queue_error(c, &c->err);
        }
        if (!c->err.status && gw_buf_add(&c->body, upload_data, *upload_data_size) != 0)
            gw_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->gone) return MHD_NO;
    switch (c->state) {
    case S_NEW:
        if (c->err.status) return s_queue_error(c, &c->err);
        switch (c->rt) {
        case R_CHAT:
        case R_COMPLETIONS: return s_generate(c);
        case R_MODELS: return s_models(c);
        case R_HEALTH: return s_health(c);
        case R_TOKENIZE:
        case R_DETOKENIZE: return s_tokenize(c);
        case R_METRICS: return s_metrics(c);
        default: return MHD_NO;
        }
    case S_WAIT: return MHD_YES; /* not reached: a suspended connection is not called */
    case S_REPLY: {
        s_count(c, c->reply_status);
        if (!c->reply_body) return MHD_NO;
        return s_queue(conn, c->reply_status, c->reply_type, c->reply_body, c->retry_after);
    }
    case S_STREAM: {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, s_sse_read, c, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result rc = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    }
    return MHD_NO;
}

static void s_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    gw_server *s = cls;
    gw_conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (c->at_broker) { /* the client left first: the worker's slot is freed now */
        gw_broker_cancel(s->broker, c->bid);
        s_leave_broker(c);
        s_count(c, 499);
    } else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->state == S_STREAM) {
        s_count(c, 499); /* unless the stream's outcome was counted already */
    }
    s_unwatch(c);
    s_slot_give(s, c);
    gw_resp_free(&c->resp);
    gw_buf_free(&c->body);
    gw_buf_free(&c->out);
    free(c->reply_body);
    free(c);
}

static void s_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)conn;
    (void)socket_context;
    gw_metrics_connections(((gw_server *)cls)->metrics, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* a watched client socket hung up: cancel at the broker at once */
static void s_on_hangup(gw_server *s, int slot) {
    if (slot < 0 || slot >= s->n_slots || !s->slots[slot]) return;
    gw_conn *c = s->slots[slot];
    s_unwatch(c);
    c->gone = 1;
    if (c->at_broker) {
        gw_broker_cancel(s->broker, c->bid);
        s_leave_broker(c);
        s_count(c, 499);
    }
    s_slot_give(s, c);
    s_resume(c);
}

/* ---- setup and loop ---- */

gw_server *gw_server_new(const gw_config *cfg, char *err, size_t errlen) {
    gw_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->ep = -1;
    s->lfd = -1;
    s->t_start = s_now();
    unsigned r = (unsigned)getpid() ^ (unsigned)time(NULL) * 2654435761u;
    int ufd = open("/dev/urandom", O_RDONLY);
    if (ufd >= 0) {
        if (read(ufd, &r, sizeof r) != (ssize_t)sizeof r) r ^= (unsigned)clock();
        close(ufd);
    }
    snprintf(s->instance, sizeof s->instance, "%08x", r);
    s->metrics = gw_metrics_new();
    s->vocab = gw_vocab_new();
    if (!s->metrics || !s->vocab) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->n_vocab; i++)
        if (gw_vocab_add(s->vocab, cfg->vocab_name[i], cfg->vocab_path[i], err, errlen) != 0) goto fail;
    s->broker = gw_broker_new(cfg->broker, err, errlen);
    if (!s->broker) goto fail;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "listen address %s: %s", cfg->host, gai_strerror(gai));
        goto fail;
    }
    int one = 1;
    s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0 || setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s->lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s->lfd, 4096) != 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        freeaddrinfo(ai);
        goto fail;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    if (getsockname(s->lfd, (struct sockaddr *)&sa, &salen) == 0)
        s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    /* connections are accepted by the loop (as many as are waiting, see s_accept) and handed over with
     * MHD_add_connection: libmicrohttpd's own listener takes at most 10 a turn */
    unsigned flags =
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_NO_LISTEN_SOCKET | (cfg->verbose ? MHD_USE_ERROR_LOG : 0);
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, s_handler, s, MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, cfg->idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                              cfg->max_header, MHD_OPTION_NOTIFY_COMPLETED, s_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, s_conn_notify, s, MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "libmicrohttpd did not start: %s", strerror(errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    if (!di || s->ep < 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_MHD};
    struct epoll_event evb = {.events = EPOLLIN, .data.u64 = TAG_BROKER};
    struct epoll_event evl = {.events = EPOLLIN, .data.u64 = TAG_LISTEN};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, di->epoll_fd, &ev) != 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, gw_broker_fd(s->broker), &evb) != 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &evl) != 0) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    return s;
fail:
    gw_server_destroy(&s);
    return NULL;
}

int gw_server_port(const gw_server *s) { return s->port; }

int gw_server_wait_broker(gw_server *s, int ms) {
    double end = s_now() + ms / 1e3, sent = 0;
    while (!s->has_status && s_now() < end) {
        if (s_now() - sent > 0.1) {
            gw_broker_status(s->broker);
            sent = s_now();
        }
        struct pollfd p = {.fd = gw_broker_fd(s->broker), .events = POLLIN};
        poll(&p, 1, 10);
        s_broker_drain(s);
    }
    return s->has_status ? 0 : -1;
}

/* accepts the waiting connections and hands them to libmicrohttpd (which closes them when over its limit) */
static void s_accept(gw_server *s) {
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;             /* EAGAIN, or out of descriptors: the rest wait in the backlog */
        int one = 1, sndbuf = 64 << 10; /* the kernel doubles it; SSE events are small */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        MHD_add_connection(s->mhd, fd, (struct sockaddr *)&sa, len);
    }
}

int gw_server_run(gw_server *s, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    struct epoll_event evs[256];
    s->t_status_sent = 0;
    while (!*stop) {
        double now = s_now();
        if (now - s->t_status_sent >= STATUS_EVERY_MS / 1e3) {
            gw_broker_status(s->broker);
            s->t_status_sent = now;
        }
        /* a broker that stopped answering fails the requests waiting on it */
        double since = s->has_status ? now - s->t_status_recv : now - s->t_start;
        if (since > BROKER_FAIL_MS / 1e3) s_fail_all(s, PROTO_CODE_SHUTTING_DOWN, "the broker is unreachable");
        int timeout = STATUS_EVERY_MS;
        MHD_UNSIGNED_LONG_LONG mt;
        if (MHD_get_timeout(s->mhd, &mt) == MHD_YES && mt < (MHD_UNSIGNED_LONG_LONG)timeout) timeout = (int)mt;
        int n = epoll_wait(s->ep, evs, 256, timeout);
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "epoll_wait: %s", strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 >= TAG_CONN_BASE) s_on_hangup(s, (int)(evs[i].data.u64 - TAG_CONN_BASE));
            else if (evs[i].data.u64 == TAG_LISTEN) s_accept(s);
        }
        s_broker_drain(s);
        MHD_run(s->mhd);
        s_broker_drain(s); /* sends inside MHD_run may have consumed the descriptor's edge */
    }
    return 0;
}

void gw_server_destroy(gw_server **ps) {
    if (!ps || !*ps) return;
    gw_server *s = *ps;
    if (s->mhd) {
        for (int i = 0; i < s->n_slots; i++) {
            gw_conn *c = s->slots[i];
            if (!c) continue;
            if (c->at_broker) gw_broker_cancel(s->broker, c->bid);
            c->gone = 1;
            s_resume(c);
        }
        MHD_run(s->mhd);
        MHD_stop_daemon(s->mhd);
    }
    if (s->ep >= 0) close(s->ep);
    if (s->lfd >= 0) close(s->lfd);
    gw_broker_destroy(&s->broker);
    gw_metrics_destroy(&s->metrics);
    gw_vocab_destroy(&s->vocab);
    proto_msg_free(&s->st_msg);
    free(s->st_frame);
    free(s->slots);
    free(s->gens);
    free(s->free_slots);
    free(s);
    *ps = NULL;
}
