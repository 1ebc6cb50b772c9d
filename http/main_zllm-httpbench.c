/* http/main_zllm-httpbench.c: zllm-httpbench, a closed-loop load generator for zllm-http: CONCURRENCY streamed
 * /v1/completions requests in flight at once (prompt as random token ids, ignore_eos, temperature 0), one epoll
 * thread, a small chunked-transfer and SSE reader. Prints the same summary as `zllm bench` (requests, output
 * tokens/s, time to first token and inter-token percentiles), so the two can be compared in one run
 * (tests/bench_http.py).
 *
 * By default the CONCURRENCY connections are opened before the clock starts and each carries its requests one
 * after the other (HTTP/1.1 keep-alive, as every client pool does), just as `zllm bench` connects its socket
 * before it sends: time to first token runs from the request's first byte to its first token. --new-connection
 * opens a connection per request instead, and the time then includes connecting.
 *
 * The output lengths (--out-len LO:HI with --bench-seed) and the streams' start times (--ramp-ms) are
 * common/benchload.h's, as in `zllm bench`, so that both tools apply the same load.
 *
 *   zllm-httpbench --url HOST:PORT [-N REQUESTS] [-c CONCURRENCY] [--prompt-len L] [--out-len M] [--vocab V]
 *                  [--model NAME] [--bench-seed S] [--ramp-ms MS] [--new-connection] */
#include "benchload.h"
#include "version.h"
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    int id;    /* request index, -1 when idle */
    char *req; /* the request bytes */
    size_t req_len, req_off;
    int state; /* 0 headers, 1 chunk size, 2 chunk data, 3 chunk CRLF, 4 the last chunk's trailer */
    size_t chunk_left;
    char hdr[4096]; /* header bytes / chunk-size line */
    size_t hdr_n;
    char ev[65536]; /* the SSE event being read */
    size_t ev_n;
    int status;
    double t_start, t_first, t_last, t_sent;
    long tokens; /* usage.completion_tokens */
    int n_events;
    int done_event; /* data: [DONE] came */
    int want_out;   /* registered for EPOLLOUT: the request did not fit the socket at once */
} bconn;

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, long n, double p) {
    if (n == 0) return NAN;
    long i = (long)ceil(p / 100.0 * (double)n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

static struct sockaddr_in s_addr;
static int s_new_conn; /* --new-connection */
static double *s_ttft, *s_itl, *s_sent, *s_t_send; /* s_t_send: each request's first byte, from the start */
static long s_n_sent;
static double s_t0; /* the clock's start */
static long s_n_ttft, s_n_itl, s_itl_cap, s_tokens, s_ok, s_failed;

/* one complete SSE event ("data: ...") */
static int s_event(bconn *c, double now) {
    c->ev[c->ev_n] = 0;
    if (!strncmp(c->ev, "data: [DONE]", 12)) {
        c->done_event = 1;
        return 0;
    }
    if (strstr(c->ev, "\"finish_reason\":null")) { /* a token (its text cannot hold the quotes unescaped) */
        if (c->n_events == 0) {
            c->t_first = now;
            s_ttft[s_n_ttft++] = now - c->t_start;
        } else if (s_n_itl < s_itl_cap) {
            s_itl[s_n_itl++] = now - c->t_last;
        }
        c->t_last = now;
        c->n_events++;
        return 0;
    }
    if (strstr(c->ev, "\"error\"")) {
        fprintf(stderr, "zllm-httpbench: %.200s\n", c->ev);
        c->status = 599;
        return 1;
    }
    const char *u = strstr(c->ev, "\"completion_tokens\":");
    if (u) c->tokens = atol(u + 20);
    return 0;
}

/* feeds decoded body bytes, a line at a time (the client's CPU shares the cores with what it measures); 1 on an
 * error event */
static int s_body(bconn *c, const char *p, size_t n, double now) {
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) + 1 : n;
        size_t room = sizeof c->ev - 1 - c->ev_n;
        memcpy(c->ev + c->ev_n, p, k < room ? k : room);
        c->ev_n += k < room ? k : room;
        p += k;
        n -= k;
        if (nl && c->ev_n >= 2 && c->ev[c->ev_n - 2] == '\n') { /* an empty line ends the event */
            c->ev_n -= 2;
            int end = s_event(c, now);
            c->ev_n = 0;
            if (end) return 1;
        }
    }
    return 0;
}

/* feeds received bytes (HTTP/1.1 response, chunked); 1 when the response ended (its last chunk and trailer
 * read, so that the connection can carry the next request), -1 on a protocol error */
static int s_feed(bconn *c, const char *p, size_t n, double now) {
    size_t i = 0;
    while (i < n) {
        if (c->state == 0 || c->state == 1 || c->state == 3 || c->state == 4) {
            if (c->hdr_n + 1 >= sizeof c->hdr) return -1;
            c->hdr[c->hdr_n++] = p[i++];
            c->hdr[c->hdr_n] = 0;
            if (c->state == 0 && c->hdr_n >= 4 && !memcmp(c->hdr + c->hdr_n - 4, "\r\n\r\n", 4)) {
                c->status = atoi(c->hdr + 9);
                if (c->status != 200 || !strcasestr(c->hdr, "transfer-encoding: chunked")) return -1;
                c->state = 1;
                c->hdr_n = 0;
            } else if (c->state == 1 && c->hdr_n >= 2 && !memcmp(c->hdr + c->hdr_n - 2, "\r\n", 2)) {
                c->chunk_left = strtoul(c->hdr, NULL, 16);
                c->hdr_n = 0;
                c->state = c->chunk_left == 0 ? 4 : 2;
            } else if (c->state == 3 && c->hdr_n == 2) {
                c->hdr_n = 0;
                c->state = 1;
            } else if (c->state == 4 && c->hdr_n >= 2 && !memcmp(c->hdr + c->hdr_n - 2, "\r\n", 2)) {
                if (c->hdr_n == 2) return i == n && c->done_event ? 1 : -1; /* the empty line ends the trailer */
                c->hdr_n = 0;                                               /* a trailer field */
            }
        } else if (c->state == 2) {
            size_t k = n - i < c->chunk_left ? n - i : c->chunk_left;
            if (s_body(c, p + i, k, now)) return -1;
            i += k;
            c->chunk_left -= k;
            if (c->chunk_left == 0) c->state = 3;
        }
    }
    return 0;
}

/* c's events: EPOLLIN, and EPOLLOUT while a request waits for room in the socket (out) */
static int s_want_out(int ep, bconn *c, int out) {
    if (c->want_out == out) return 0;
    c->want_out = out;
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* opens c's connection (its events: EPOLLIN, and EPOLLOUT until it is connected and the request written) */
static int s_connect(int ep, bconn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&s_addr, sizeof s_addr) != 0 && errno != EINPROGRESS) return -1;
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
    c->want_out = 1;
    return epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
}

/* writes what is left of c's request, waiting for EPOLLOUT only when the socket has no room (a request on an
 * open connection costs one send and no epoll_ctl, as a request on `zllm bench`'s socket costs one send);
 * 0, or -1 on a socket error */
static int s_write(int ep, bconn *c, double now) {
    while (c->req_off < c->req_len) {
        ssize_t w = send(c->fd, c->req + c->req_off, c->req_len - c->req_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->req_off += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == ENOTCONN)) return s_want_out(ep, c, 1); /* EPOLLOUT comes back */
        return -1;
    }
    s_sent[s_n_sent++] = now - c->t_start;
    return s_want_out(ep, c, 0);
}

/* starts request id on c: on its open connection (keep-alive), else on a new one; its output length is
 * benchload_out_len's for (seed, id) */
static int s_start(int ep, bconn *c, int id, const char *model, int plen, const int olen[2], int vocab, uint64_t *rng,
                   uint64_t seed) {
    char body[65536];
    int o = snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":[", model);
    for (int i = 0; i < plen && o < (int)sizeof body - 32; i++) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        o += snprintf(body + o, sizeof body - (size_t)o, "%s%d", i ? "," : "", 3 + (int)(*rng % (uint64_t)(vocab - 3)));
    }
    o += snprintf(body + o, sizeof body - (size_t)o,
                  "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                  "\"stream_options\":{\"include_usage\":true}}",
                  benchload_out_len(seed, id, olen[0], olen[1]));
    free(c->req);
    c->req = malloc((size_t)o + 256);
    if (!c->req) return -1;
    c->req_len = (size_t)sprintf(c->req,
                                 "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
                                 "application/json\r\nContent-Length: %d\r\n\r\n%s",
                                 o, body);
    c->req_off = 0;
    c->id = id;
    c->state = 0;
    c->hdr_n = c->ev_n = 0;
    c->status = 0;
    c->tokens = 0;
    c->n_events = 0;
    c->done_event = 0;
    c->t_start = s_now();
    s_t_send[id] = c->t_start - s_t0;
    if (c->fd < 0) return s_connect(ep, c);
    return s_write(ep, c, c->t_start);
}

/* ends c's request; its connection stays open for the next one when the response ended cleanly */
static void s_finish(bconn *c, int ok) {
    if (!ok || s_new_conn) {
        close(c->fd);
        c->fd = -1;
    }
    c->id = -1;
    if (ok && c->status == 200) {
        s_ok++;
        s_tokens += c->tokens;
    } else {
        s_failed++;
    }
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-httpbench --url HOST:PORT [-N REQUESTS] [-c CONCURRENCY] [--prompt-len L]\n"
               "                      [--out-len M] [--vocab V] [--model NAME]\n"
               "Streams completions through zllm-http and reports time to first token and inter-token latency.\n"
               "  --url HOST:PORT    the gateway (default 127.0.0.1:8000)\n"
               "  -N REQUESTS        requests in all, 1..10000000 (default 1000)\n"
               "  -c CONCURRENCY     requests at once, 1..100000 (default 100)\n"
               "  --prompt-len L     prompt tokens (random ids), 1..4096 (default 16)\n"
               "  --out-len M|LO:HI  max_tokens of each request, or drawn from LO..HI (default 64)\n"
               "  --vocab V          ids are drawn from [0, V) (default 512)\n"
               "  --model NAME       the request's model (default: the gateway's only one)\n"
               "  --bench-seed S     the prompts' and output lengths' seed (default 1); request i's output\n"
               "                     length depends on S and i only, as in `zllm bench`\n"
               "  --ramp-ms MS       start the CONCURRENCY streams spread over MS ms (stream k at\n"
               "                     k*MS/CONCURRENCY), 0..3600000 (default 0: all at once)\n"
               "  --new-connection   a new connection per request (default: CONCURRENCY connections opened\n"
               "                     before the clock starts, each carrying its requests in turn)\n"
               "  -h, --help         this text;  --version  print the version\n"
               "Environment: none read.\n");
}

/* a whole decimal number in [lo, hi]; 0, or -1 with a message naming the option */
static int s_int(const char *opt, const char *v, long lo, long hi, int *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "zllm-httpbench: %s: expected a whole number in %ld..%ld, got '%s'\n", opt, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    const char *url = "127.0.0.1:8000", *model = "";
    int N = 1000, conc = 100, plen = 16, olen[2] = {64, 64}, vocab = 512, ramp_ms = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--new-connection")) {
            s_new_conn = 1;
            for (int j = i; j + 1 < argc; j++) argv[j] = argv[j + 1];
            argc--, i--;
            continue;
        }
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
            s_usage(stdout);
            return 0;
        }
        if (!strcmp(k, "--version")) {
            printf("zllm-httpbench %s\n", ZLLM_VERSION);
            return 0;
        }
    }
    for (int i = 1; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!v) {
            fprintf(stderr, "zllm-httpbench: %s needs a value\n", k);
            return 2;
        }
        if (!strcmp(k, "--url")) url = v;
        else if (!strcmp(k, "-N")) bad = s_int(k, v, 1, 10000000, &N);
        else if (!strcmp(k, "-c")) bad = s_int(k, v, 1, 100000, &conc);
        else if (!strcmp(k, "--prompt-len")) bad = s_int(k, v, 1, 4096, &plen);
        else if (!strcmp(k, "--out-len")) { /* M, or LO:HI drawn per request */ char lo[32];
            const char *colon = strchr(v, ':');
            snprintf(lo, sizeof lo, "%.*s", colon ? (int)(colon - v) : (int)strlen(v), v);
            bad = s_int(k, lo, 1, 1 << 20, &olen[0]) || s_int(k, colon ? colon + 1 : v, 1, 1 << 20, &olen[1]);
            if (!bad && olen[1] < olen[0]) {
                fprintf(stderr, "zllm-httpbench: --out-len LO:HI needs LO <= HI\n");
                return 2;
            }
        } else if (!strcmp(k, "--vocab")) bad = s_int(k, v, 4, 1 << 24, &vocab);
        else if (!strcmp(k, "--model")) model = v;
        else if (!strcmp(k, "--ramp-ms")) bad = s_int(k, v, 0, 3600000, &ramp_ms);
        else if (!strcmp(k, "--bench-seed")) {
            char *end = NULL;
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (!(*v >= '0' && *v <= '9') || *end || errno) {
                fprintf(stderr, "zllm-httpbench: --bench-seed: expected a whole number in 0..2^64-1, got '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "zllm-httpbench: unknown option %s\n", k);
            s_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (N < 1 || conc < 1 || plen < 1 || plen > 4096 || olen[0] < 1 || vocab < 4) {
        fprintf(stderr, "zllm-httpbench: bad arguments\n");
        return 2;
    }
    if (conc > N) conc = N;
    char host[256];
    snprintf(host, sizeof host, "%s", url);
    char *colon = strrchr(host, ':');
    if (!colon) return 2;
    *colon = 0;
    s_addr.sin_family = AF_INET;
    s_addr.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &s_addr.sin_addr) != 1) {
        fprintf(stderr, "zllm-httpbench: %s is not an IPv4 address\n", host);
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    s_itl_cap = 1 << 22;
    s_ttft = malloc((size_t)N * sizeof *s_ttft);
    s_sent = malloc((size_t)N * sizeof *s_sent);
    s_t_send = malloc((size_t)N * sizeof *s_t_send);
    s_itl = malloc((size_t)s_itl_cap * sizeof *s_itl);
    bconn *cs = calloc((size_t)conc, sizeof *cs);
    int ep = epoll_create1(0);
    if (!s_ttft || !s_sent || !s_t_send || !s_itl || !cs || ep < 0) return 1;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    int next = 0, done = 0, n_up = 0; /* n_up: streams started (cs[0..n_up) carry requests) */
    struct epoll_event evs[512];
    for (int i = 0; i < conc; i++) cs[i].fd = cs[i].id = -1;
    if (!s_new_conn) { /* the connections first, outside the clock */
        int up = 0;
        for (int i = 0; i < conc; i++)
            if (s_connect(ep, &cs[i]) != 0) {
                perror("zllm-httpbench: connect");
                return 1;
            }
        while (up < conc) {
            int n = epoll_wait(ep, evs, 512, 10000);
            if (n <= 0) {
                fprintf(stderr, "zllm-httpbench: %d of %d connections up after 10 s\n", up, conc);
                return 1;
            }
            for (int i = 0; i < n; i++) {
                bconn *c = evs[i].data.ptr;
                if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
                    fprintf(stderr, "zllm-httpbench: a connection failed\n");
                    return 1;
                }
                s_want_out(ep, c, 0);
                up++;
            }
        }
    }
    double t0 = s_now();
    s_t0 = t0;
    static char buf[1 << 16];
    while (done < N) {
        int wait_ms = 60000;
        while (n_up < conc && next < N) { /* the streams' first requests, each at its start time */
            double due = t0 + benchload_start(n_up, conc, ramp_ms) - s_now();
            if (due > 0) {
                wait_ms = (int)ceil(due * 1e3);
                break;
            }
            if (s_start(ep, &cs[n_up++], next++, model, plen, olen, vocab, &rng, seed) != 0) {
                perror("zllm-httpbench: connect");
                return 1;
            }
        }
        int n = epoll_wait(ep, evs, 512, wait_ms);
        if (n == 0 && wait_ms < 60000) continue;
        if (n <= 0) {
            fprintf(stderr, "zllm-httpbench: no progress for 60 s\n");
            break;
        }
        double now = s_now();
        for (int i = 0; i < n; i++) {
            bconn *c = evs[i].data.ptr;
            if (c->id < 0) continue;
            int end = 0;
            if ((evs[i].events & EPOLLOUT) && c->req_off < c->req_len && s_write(ep, c, now) != 0) end = -1;
            if (!end && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                for (;;) {
                    ssize_t r = recv(c->fd, buf, sizeof buf, 0);
                    if (r > 0) {
                        end = s_feed(c, buf, (size_t)r, now);
                        if (end || (size_t)r < sizeof buf) break; /* level-triggered: more data signals again */
                        continue;
                    }
                    if (r == 0 || (errno != EAGAIN && errno != EINTR)) end = -1;
                    break;
                }
            }
            if (end) {
                if (end < 0 && c->status != 200)
                    fprintf(stderr, "zllm-httpbench: request %d: status %d\n", c->id, c->status);
                s_finish(c, end > 0);
                done++;
                if (next < N && s_start(ep, c, next++, model, plen, olen, vocab, &rng, seed) != 0) {
                    perror("zllm-httpbench: connect");
                    return 1;
                }
            }
        }
    }
    double wall = s_now() - t0;
    qsort(s_ttft, (size_t)s_n_ttft, sizeof *s_ttft, s_cmp);
    qsort(s_itl, (size_t)s_n_itl, sizeof *s_itl, s_cmp);
    qsort(s_sent, (size_t)s_n_sent, sizeof *s_sent, s_cmp);
    printf("requests: %d (%ld ok, %ld failed), concurrency %d, prompt %d, output %d..%d tokens\n", N, s_ok, s_failed,
           conc, plen, olen[0], olen[1]);
    printf("wall %.2f s, %.1f requests/s, %.1f output tokens/s, %ld tokens\n", wall, s_ok / wall, s_tokens / wall,
           s_tokens);
    printf("ttft ms: p50 %.2f p90 %.2f p99 %.2f\n", s_pct(s_ttft, s_n_ttft, 50) * 1e3,
           s_pct(s_ttft, s_n_ttft, 90) * 1e3, s_pct(s_ttft, s_n_ttft, 99) * 1e3);
    printf("itl ms:  p50 %.2f p90 %.2f p99 %.2f\n", s_pct(s_itl, s_n_itl, 50) * 1e3, s_pct(s_itl, s_n_itl, 90) * 1e3,
           s_pct(s_itl, s_n_itl, 99) * 1e3);
    printf("%s ms: p50 %.2f p90 %.2f p99 %.2f\n", s_new_conn ? "connect+send" : "send",
           s_pct(s_sent, s_n_sent, 50) * 1e3, s_pct(s_sent, s_n_sent, 90) * 1e3, s_pct(s_sent, s_n_sent, 99) * 1e3);
    double b50, b99, bmax;
    benchload_burst(s_t_send, next, &b50, &b99, &bmax);
    printf("sends in a request's millisecond: p50 %.0f p99 %.0f max %.0f\n", b50, b99, bmax);
    for (int i = 0; i < conc; i++) {
        free(cs[i].req);
        if (cs[i].fd >= 0) close(cs[i].fd);
    }
    free(s_sent);
    free(s_t_send);
    free(cs);
    free(s_ttft);
    free(s_itl);
    close(ep);
    return s_failed ? 1 : 0;
}
