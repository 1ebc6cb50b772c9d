/* http/gw_server.c: zllm-http's HTTP side and event loop (see gw_server.h). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "gw_internal.h"

#define TAG_MHD 1
#define TAG_BROKER 2
#define TAG_MONITOR 4 /* the broker socket's monitor: read only when signalled (each read costs syscalls) */
#define TAG_LISTEN 3
#define ACCEPT_BATCH 1024 /* connections accepted per loop turn at most */
#define TAG_CONN_BASE 16  /* epoll data at or above: a watched client socket's gw_sock * */
/* streams whose later tokens are written per loop turn at most: a turn that writes every running stream's
 * token (a thousand writes, milliseconds of CPU) would hold a request that arrives meanwhile, and the first
 * tokens that come back, until it ends; between batches the loop reads new requests and writes first tokens */
#define RESUME_BATCH 128

const char *const gw_route_name[] = {"chat",     "completions", "models",  "health",
                                     "tokenize", "detokenize",  "metrics", "other"};

double gw_now(void) {
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
    c->stream_write_rate = 25000;
}

void gw_conn_resume(gw_conn *c) {
    if (!c->suspended) return;
    c->suspended = 0;
    c->srv->resume_pending = 1;
    MHD_resume_connection(c->conn);
}

/* libmicrohttpd takes up resumed connections inside MHD_run only, and without threads of its own nothing wakes
 * the loop for them: a resumption after the turn's last MHD_run (a first token or a final that the turn's last
 * drain reads) is run by a turn that does not wait (gw_server_run), not one worker step later */
static void s_mhd_run(gw_server *s) {
    s->resume_pending = 0;
    MHD_run(s->mhd);
}

void gw_conn_unwatch(gw_conn *c) {
    if (!c->sock) return;
    c->sock->cur = NULL;
    c->sock = NULL;
}

void gw_conn_watch(gw_conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gw_sock *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    if (!k->watched) {
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = k};
        if (epoll_ctl(c->srv->ep, EPOLL_CTL_ADD, k->fd, &ev) != 0) return;
        k->watched = 1;
    }
    k->cur = c;
    c->sock = k;
}

/* A stream's first token goes out as libmicrohttpd's write of the headers and its write of the first chunk, and
 * its end as the last chunk and the closing zero-length chunk: each write on a TCP_NODELAY socket is a segment,
 * delivered on loopback in the writer's system call, and a wake-up of the client. Corking the socket for the
 * turn's urgent passes (s_run_urgent) sends each pair as one segment: a socket is uncorked as soon as its writes
 * are done (gw_conn_uncork: the SSE callback finds nothing more, or the response completed), and whatever is
 * still corked once the passes end (s_uncork). */
void gw_conn_cork(gw_conn *c) {
    gw_server *s = c->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gw_sock *k = ci ? ci->socket_context : NULL;
    if (!k || k->cork_ix) return;
    if (s->n_cork == s->cap_cork) {
        int n = s->cap_cork ? s->cap_cork * 2 : 1024;
        gw_sock **a = realloc(s->cork, (size_t)n * sizeof *a);
        if (!a) return;
        s->cork = a;
        s->cap_cork = n;
    }
    int one = 1;
    if (setsockopt(k->fd, IPPROTO_TCP, TCP_CORK, &one, sizeof one) != 0) return;
    s->cork[s->n_cork++] = k;
    k->cork_ix = s->n_cork;
}

static void s_uncork_sock(gw_server *s, gw_sock *k) {
    int zero = 0;
    s->cork[k->cork_ix - 1] = NULL;
    k->cork_ix = 0;
    setsockopt(k->fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
}

/* c's writes are done (libmicrohttpd asks for more than there is, or completed the response): they leave now,
 * not when the turn's other urgent writes are done too */
void gw_conn_uncork(gw_conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gw_sock *k = ci ? ci->socket_context : NULL;
    if (k && k->cork_ix) s_uncork_sock(c->srv, k);
}

/* uncorks every socket still corked this turn: what libmicrohttpd wrote leaves now */
static void s_uncork(gw_server *s) {
    int zero = 0;
    for (int i = 0; i < s->n_cork; i++) {
        gw_sock *k = s->cork[i];
        if (!k) continue; /* closed since */
        k->cork_ix = 0;
        setsockopt(k->fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
    }
    s->n_cork = 0;
}

/* counts the request's outcome once (the first status decided is the one the client saw) */
void gw_conn_count(gw_conn *c, int status) {
    if (c->http_status) return;
    c->http_status = status;
    gw_metrics_request(c->srv->metrics, c->model, gw_route_name[c->rt], status);
}

enum MHD_Result gw_reply(struct MHD_Connection *conn, int status, const char *type, const char *body, int retry_after) {
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

enum MHD_Result gw_reply_error(gw_conn *c, const gw_error *e) {
    char *body = gw_encode_error(e);
    gw_conn_count(c, e->status);
    enum MHD_Result rc = gw_reply(c->conn, e->status, "application/json", body ? body : "{}", e->status == 429 ? 1 : 0);
    free(body);
    return rc;
}

enum MHD_Result gw_reply_json(gw_conn *c, int status, json_t *o) {
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!body) {
        gw_error e;
        gw_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return gw_reply_error(c, &e);
    }
    gw_conn_count(c, status);
    enum MHD_Result rc = gw_reply(c->conn, status, "application/json", body, 0);
    free(body);
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
        c->sock = NULL;
        c->t0 = gw_now();
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
        if (c->err.status == 413) return gw_reply_error(c, &c->err); /* answered before the body is read */
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!c->err.status && c->body.n + *upload_data_size > s->cfg.max_body) {
            gw_error_set(&c->err, 413, "invalid_request_error", NULL, "body_too_large",
                         "the request body exceeds %zu bytes", s->cfg.max_body);
            gw_buf_free(&c->body);
            *upload_data_size = 0;
            return gw_reply_error(c, &c->err);
        }
        if (!c->err.status && gw_buf_add(&c->body, upload_data, *upload_data_size) != 0)
            gw_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->gone) return MHD_NO;
    switch (c->state) {
    case S_NEW:
        if (c->err.status) return gw_reply_error(c, &c->err);
        switch (c->rt) {
        case R_CHAT:
        case R_COMPLETIONS: return gw_session_generate(c);
        case R_MODELS: return gw_routes_models(c);
        case R_HEALTH: return gw_routes_health(c);
        case R_TOKENIZE:
        case R_DETOKENIZE: return gw_routes_tokenize(c);
        case R_METRICS: return gw_routes_metrics(c);
        default: return MHD_NO;
        }
    case S_WAIT: return MHD_YES; /* not reached: a suspended connection is not called */
    case S_REPLY: {
        gw_conn_count(c, c->reply_status);
        if (!c->reply_body) return MHD_NO;
        return gw_reply(conn, c->reply_status, c->reply_type, c->reply_body, c->retry_after);
    }
    case S_STREAM: {
        /* libmicrohttpd allocates and clears a block of this size per response: SSE events are a few hundred
         * bytes, and a larger backlog is handed over in several calls */
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, gw_session_sse_read, c, NULL);
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
    (void)cls;
    gw_conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    gw_conn_uncork(c);
    if (c->at_broker) { /* the client left first: the worker's slot is freed now */
        gw_session_cancel(c, 499);
    } else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->state == S_STREAM) {
        gw_conn_count(c, 499); /* unless the stream's outcome was counted already */
    }
    gw_conn_unwatch(c);
    gw_session_release(c);
    gw_resp_free(&c->resp);
    json_decref(c->choices);
    gw_buf_free(&c->body);
    gw_buf_free(&c->out);
    free(c->reply_body);
    free(c);
}

static void s_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    gw_server *s = cls;
    gw_metrics_connections(s->metrics, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        gw_sock *k = ci ? calloc(1, sizeof *k) : NULL; /* without one, requests go unwatched */
        if (k) k->fd = ci->connect_fd;
        *socket_context = k;
        return;
    }
    gw_sock *k = *socket_context;
    if (!k) return;
    if (k->watched) epoll_ctl(s->ep, EPOLL_CTL_DEL, k->fd, NULL);
    if (k->cur) k->cur->sock = NULL;
    if (k->cork_ix) s->cork[k->cork_ix - 1] = NULL;
    free(k);
    *socket_context = NULL;
}

/* a watched client socket hung up: its request (if any) is cancelled at the broker at once; the socket leaves
 * the epoll set (a hang-up stays signalled), and libmicrohttpd closes it when it next reads or writes */
static void s_on_hangup(gw_server *s, gw_sock *k) {
    epoll_ctl(s->ep, EPOLL_CTL_DEL, k->fd, NULL);
    k->watched = 0;
    gw_conn *c = k->cur;
    if (!c) return;
    gw_conn_unwatch(c);
    c->gone = 1;
    gw_session_cancel(c, 499);
    gw_session_release(c);
    gw_conn_resume(c);
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
    s->monitor_ready = 1;
    s->t_start = gw_now();
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
    s->broker = gw_broker_new(cfg->broker, cfg->curve, err, errlen);
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
    struct epoll_event evm = {.events = EPOLLIN, .data.u64 = TAG_MONITOR};
    struct epoll_event evl = {.events = EPOLLIN, .data.u64 = TAG_LISTEN};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, di->epoll_fd, &ev) != 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, gw_broker_fd(s->broker), &evb) != 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, gw_broker_monitor_fd(s->broker), &evm) != 0 ||
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
    double end = gw_now() + ms / 1e3, sent = 0;
    while (!s->has_status && !gw_broker_problem(s->broker)[0] && gw_now() < end) {
        if (gw_now() - sent > 0.1) {
            gw_broker_status(s->broker);
            sent = gw_now();
        }
        struct pollfd p = {.fd = gw_broker_fd(s->broker), .events = POLLIN};
        poll(&p, 1, 10);
        s->monitor_ready = 1; /* at startup, every turn: a refused handshake ends the wait */
        gw_session_drain(s);
    }
    return s->has_status ? 0 : -1;
}

const char *gw_server_broker_problem(const gw_server *s) { return gw_broker_problem(s->broker); }

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

/* libmicrohttpd takes one pass over its ready connections per MHD_run, and a stream's first token needs three:
 * its handler queues the response, the next pass writes the headers and fills the first chunk, the one after
 * writes it. Running the passes back to back, while only the turn's urgent connections (requests read, first
 * tokens, finals) are ready, gives the first token in the same turn instead of three turns later. */
static void s_run_urgent(gw_server *s) {
    for (int pass = 0; pass < 4; pass++) {
        s_mhd_run(s);
        MHD_UNSIGNED_LONG_LONG t;
        if (MHD_get_timeout(s->mhd, &t) != MHD_YES || t != 0) return;
    }
}

int gw_server_run(gw_server *s, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    struct epoll_event evs[256];
    s->t_status_sent = 0;
    s->t_defer_due = HUGE_VAL;
    int ready = 0; /* streams whose turn to write has come, still waiting (more than a turn writes) */
    while (!*stop) {
        double now = gw_now();
        if (now - s->t_status_sent >= STATUS_EVERY_MS / 1e3) {
            gw_broker_status(s->broker);
            s->t_status_sent = now;
        }
        /* a broker that stopped answering fails the requests waiting on it */
        double since = s->has_status ? now - s->t_status_recv : now - s->t_start;
        if (since > BROKER_FAIL_MS / 1e3)
            gw_session_fail_all(s, PROTO_CODE_BROKER_UNREACHABLE, "the broker has not answered for 6 s");
        int timeout = STATUS_EVERY_MS;
        if (ready || s->resume_pending) timeout = 0;
        else if (s->t_defer_due - now < timeout / 1e3) /* a held stream's turn: rounded up, never a busy wait */
            timeout = (int)ceil((s->t_defer_due - now) * 1e3);
        if (timeout < 0) timeout = 0;
        MHD_UNSIGNED_LONG_LONG mt;
        if (MHD_get_timeout(s->mhd, &mt) == MHD_YES && mt < (MHD_UNSIGNED_LONG_LONG)timeout) timeout = (int)mt;
        int n = epoll_wait(s->ep, evs, 256, timeout);
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "epoll_wait: %s", strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 >= TAG_CONN_BASE) s_on_hangup(s, evs[i].data.ptr);
            else if (evs[i].data.u64 == TAG_LISTEN) s_accept(s);
            else if (evs[i].data.u64 == TAG_MONITOR) s->monitor_ready = 1;
        }
        gw_session_drain(s);
        s_run_urgent(s);
        s_uncork(s);
        ready = gw_session_resume_deferred(s, RESUME_BATCH, gw_now());
        s_mhd_run(s);
        gw_session_drain(s); /* sends inside MHD_run may have consumed the descriptor's edge */
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
            gw_conn_resume(c);
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
    free(s->defer);
    free(s->cork);
    free(s);
    *ps = NULL;
}
