/* clients/main_zllm.c: the `zllm` command, a client of the broker.
 *
 *   zllm generate --broker EP -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [--ids] [--chat]
 *                 [--system TEXT] [--tokens ID,ID,...] [--model NAME] [--deadline-ms MS] [--stop STR]
 *   zllm chat     --broker EP [--system TEXT] [-n N] [--temp T] ...     (interactive; conversation kept)
 *   zllm status   --broker EP
 *   zllm bench    --broker EP [-N REQUESTS] [-c CONCURRENCY] [--prompt-len DIST] [--out-len DIST] [--vocab V]
 *                 DIST: N (fixed) or A:B (uniform in [A, B])
 *
 * Every wait is bounded: a request whose final does not come within its deadline plus a grace period is
 * cancelled and reported as a client timeout (exit 1), so a vanished broker never hangs the command.
 * Exit status: 0 when every request ended with stop or length (status: when the broker is ready), 1 otherwise,
 * 2 on a usage error.
 *
 * Include map:
 *   zllm_client.h - zllm_client_new/submit/recv/cancel/status/destroy
 *   proto.h       - proto_generate and the decoded messages */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "proto.h"
#include "zllm_client.h"

#define S_GRACE_MS 5000            /* client-side wait beyond a request's deadline */
#define S_MAX_TOKENS_ARG 4096      /* --tokens entries */
#define S_LINE_MAX 65536           /* chat input line */

typedef struct {
    const char *broker;            /* endpoint */
    const char *prompt;            /* -p */
    const char *system;            /* --system */
    const char *model;             /* --model */
    const char *stop;              /* --stop (one string) */
    int32_t tokens[S_MAX_TOKENS_ARG]; /* --tokens */
    int n_tokens;                  /* -1 when not given */
    int max_tokens;                /* -n */
    double temp;                   /* --temp; NAN = broker default */
    int top_k;                     /* --top-k; -1 = default */
    double top_p;                  /* --top-p; NAN = default */
    long long seed;                /* --seed; -1 = broker's choice */
    int ids;                       /* --ids: print ids */
    int chat;                      /* --chat: prompt as a user message */
    int ignore_eos;                /* --ignore-eos */
    unsigned deadline_ms;          /* --deadline-ms */
    /* bench */
    int n_requests;                /* -N */
    int concurrency;               /* -c */
    int plen_lo, plen_hi;          /* --prompt-len */
    int olen_lo, olen_hi;          /* --out-len */
    int vocab;                     /* --vocab: ids drawn from [3, vocab) */
    unsigned long long bench_seed; /* --bench-seed */
} s_args;

static volatile sig_atomic_t s_interrupted;
static void s_on_sigint(int sig) {
    (void)sig;
    s_interrupted = 1;
}

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_usage(void) {
    fprintf(stderr,
            "usage: zllm generate --broker EP -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
            "                     [--ids] [--chat] [--system TEXT] [--tokens ID,ID,..] [--model NAME]\n"
            "                     [--stop STR] [--ignore-eos] [--deadline-ms MS]\n"
            "       zllm chat     --broker EP [--system TEXT] [-n N] [--temp T] ...\n"
            "       zllm status   --broker EP\n"
            "       zllm bench    --broker EP [-N REQUESTS] [-c CONCURRENCY] [--prompt-len A[:B]]\n"
            "                     [--out-len A[:B]] [--vocab V] [--model NAME]\n"
            "EP defaults to $ZLLM_BROKER, else tcp://127.0.0.1:5555\n");
}

static int s_range(const char *v, int *lo, int *hi) {
    char *end;
    long a = strtol(v, &end, 10), b = a;
    if (end == v) return -1;
    if (*end == ':') {
        const char *q = end + 1;
        b = strtol(q, &end, 10);
        if (end == q) return -1;
    }
    if (*end || a < 1 || b < a || b > 1000000) return -1;
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

static int s_parse(int argc, char **argv, s_args *a) {
    memset(a, 0, sizeof *a);
    a->broker = getenv("ZLLM_BROKER");
    if (!a->broker || !*a->broker) a->broker = "tcp://127.0.0.1:5555";
    a->n_tokens = -1;
    a->max_tokens = -1;
    a->temp = NAN;
    a->top_k = -1;
    a->top_p = NAN;
    a->seed = -1;
    a->deadline_ms = 0;
    a->n_requests = 64;
    a->concurrency = 8;
    a->plen_lo = a->plen_hi = 32;
    a->olen_lo = a->olen_hi = 32;
    a->vocab = 256;
    a->bench_seed = 1;
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--ids")) { a->ids = 1; continue; }
        if (!strcmp(k, "--chat")) { a->chat = 1; continue; }
        if (!strcmp(k, "--ignore-eos")) { a->ignore_eos = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "zllm: %s needs a value (or is unknown)\n", k);
            return -1;
        }
        const char *v = argv[++i];
        char *end = NULL;
        errno = 0;
        if (!strcmp(k, "--broker")) a->broker = v;
        else if (!strcmp(k, "-p") || !strcmp(k, "--prompt")) a->prompt = v;
        else if (!strcmp(k, "--system")) a->system = v;
        else if (!strcmp(k, "--model")) a->model = v;
        else if (!strcmp(k, "--stop")) a->stop = v;
        else if (!strcmp(k, "-n") || !strcmp(k, "--max-tokens")) a->max_tokens = (int)strtol(v, &end, 10);
        else if (!strcmp(k, "--temp")) a->temp = strtod(v, &end);
        else if (!strcmp(k, "--top-k")) a->top_k = (int)strtol(v, &end, 10);
        else if (!strcmp(k, "--top-p")) a->top_p = strtod(v, &end);
        else if (!strcmp(k, "--seed")) a->seed = strtoll(v, &end, 10);
        else if (!strcmp(k, "--deadline-ms")) a->deadline_ms = (unsigned)strtoul(v, &end, 10);
        else if (!strcmp(k, "-N")) a->n_requests = (int)strtol(v, &end, 10);
        else if (!strcmp(k, "-c")) a->concurrency = (int)strtol(v, &end, 10);
        else if (!strcmp(k, "--vocab")) a->vocab = (int)strtol(v, &end, 10);
        else if (!strcmp(k, "--bench-seed")) a->bench_seed = strtoull(v, &end, 10);
        else if (!strcmp(k, "--prompt-len")) { if (s_range(v, &a->plen_lo, &a->plen_hi)) goto bad; }
        else if (!strcmp(k, "--out-len")) { if (s_range(v, &a->olen_lo, &a->olen_hi)) goto bad; }
        else if (!strcmp(k, "--tokens")) {
            a->n_tokens = 0;
            const char *p = v;
            while (*p) {
                if (a->n_tokens >= S_MAX_TOKENS_ARG) goto bad;
                long t = strtol(p, &end, 10);
                if (end == p || t < 0 || t > PROTO_TOKEN_ID_MAX) goto bad;
                a->tokens[a->n_tokens++] = (int32_t)t;
                p = end;
                while (*p == ',' || *p == ' ') p++;
            }
            end = NULL;
        } else {
            fprintf(stderr, "zllm: unknown option %s\n", k);
            return -1;
        }
        if (errno || (end && *end)) goto bad;
        continue;
    bad:
        fprintf(stderr, "zllm: bad value for %s: %s\n", k, v);
        return -1;
    }
    if (a->n_requests < 1 || a->concurrency < 1 || a->vocab < 4) {
        fprintf(stderr, "zllm: -N, -c must be >= 1 and --vocab >= 4\n");
        return -1;
    }
    return 0;
}

/* fills g from the arguments' sampling options (the prompt is set by the caller) */
static void s_fill(const s_args *a, proto_generate *g, const char *id) {
    proto_generate_defaults(g);
    g->id = proto_cstr(id);
    if (a->model) g->model = proto_cstr(a->model);
    if (a->max_tokens > 0) g->max_tokens = (uint32_t)a->max_tokens;
    if (!isnan(a->temp)) g->sampling.temperature = (float)a->temp;
    if (a->top_k >= 0) g->sampling.top_k = a->top_k;
    if (!isnan(a->top_p)) g->sampling.top_p = (float)a->top_p;
    if (a->seed >= 0) {
        g->sampling.seed = (uint64_t)a->seed;
        g->sampling.has_seed = 1;
    }
    g->sampling.ignore_eos = a->ignore_eos;
    if (a->deadline_ms) g->deadline_ms = a->deadline_ms;
    if (a->stop) {
        g->stop[0] = proto_cstr(a->stop);
        g->n_stop = 1;
    }
}

/* runs one streaming request, printing text (or ids) as it comes; returns 0 on stop/length, 1 otherwise.
 * reply, when not NULL, gets the whole answer (malloc'd) for the chat history. */
static int s_run_one(zllm_client *c, const s_args *a, proto_generate *g, char **reply) {
    char err[256], id[PROTO_ID_MAX + 1];
    proto_str_copy(g->id, id, sizeof id);
    size_t cap = 0, len = 0;
    char *acc = NULL;
    if (zllm_client_submit(c, g, err, sizeof err) != 0) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    double t_end = s_now() + (g->deadline_ms + S_GRACE_MS) / 1000.0;
    int cancelled = 0, rc = 1;
    for (;;) {
        if (s_interrupted && !cancelled) {
            zllm_client_cancel(c, id, err, sizeof err);
            cancelled = 1;
        }
        double left = t_end - s_now();
        if (left <= 0) {
            zllm_client_cancel(c, id, err, sizeof err);
            fprintf(stderr, "\nzllm: no final for %s within %u ms: giving up (broker gone?)\n", id,
                    g->deadline_ms + S_GRACE_MS);
            break;
        }
        const proto_msg *m;
        int r = zllm_client_recv(c, left > 0.2 ? 200 : (int)(left * 1000) + 1, &m, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "zllm: %s\n", err);
            break;
        }
        if (r == 0) continue;
        if (m->type == PROTO_ERROR) {
            fprintf(stderr, "zllm: broker error %.*s: %.*s\n", (int)m->error.code_str.n,
                    m->error.code_str.p ? m->error.code_str.p : "", (int)m->error.message.n,
                    m->error.message.p ? m->error.message.p : "");
            break;   /* this client has only this request in flight: the broker could not read it */
        }
        proto_str text = {0};
        const int32_t *ids = NULL;
        uint32_t n_ids = 0;
        if (m->type == PROTO_TOKEN && proto_str_eq(m->token.id, id)) {
            text = m->token.text;
            ids = m->token.ids;
            n_ids = m->token.n_ids;
        } else if (m->type == PROTO_FINAL && proto_str_eq(m->final.id, id)) {
            text = m->final.text;
            if (m->final.has_ids) {
                ids = m->final.ids;
                n_ids = m->final.n_ids;
            }
        } else {
            continue;
        }
        if (a->ids) {
            for (uint32_t i = 0; i < n_ids; i++) printf("%d ", (int)ids[i]);
        } else if (text.n) {
            fwrite(text.p, 1, text.n, stdout);
        }
        if (reply && text.n) {
            if (len + text.n + 1 > cap) {
                size_t nc = (len + text.n + 1) * 2;
                char *p = realloc(acc, nc);
                if (p) {
                    acc = p;
                    cap = nc;
                }
            }
            if (len + text.n + 1 <= cap) {
                memcpy(acc + len, text.p, text.n);
                len += text.n;
                acc[len] = 0;
            }
        }
        fflush(stdout);
        if (m->type == PROTO_FINAL) {
            const proto_final *f = &m->final;
            printf("\n");
            if (f->finish == PROTO_FINISH_STOP || f->finish == PROTO_FINISH_LENGTH) {
                rc = 0;
            } else {
                fprintf(stderr, "zllm: %s %.*s: %.*s\n", proto_finish_name(f->finish), (int)f->code_str.n,
                        f->code_str.p ? f->code_str.p : "", (int)f->message.n, f->message.p ? f->message.p : "");
            }
            if (getenv("ZLLM_VERBOSE"))
                fprintf(stderr, "[%s: %u prompt + %u completion tokens, queue %.1f ms, ttft %.1f ms, total %.1f ms]\n",
                        proto_finish_name(f->finish), f->prompt_tokens, f->completion_tokens, f->queue_ms,
                        f->ttft_ms, f->total_ms);
            break;
        }
    }
    if (reply) *reply = acc ? acc : strdup("");
    else free(acc);
    return rc;
}

static int s_generate(zllm_client *c, const s_args *a) {
    if (!a->prompt && a->n_tokens < 0) {
        fprintf(stderr, "zllm generate: -p TEXT or --tokens is required\n");
        return 2;
    }
    char id[64];
    snprintf(id, sizeof id, "zllm-%d", (int)getpid());
    proto_generate g;
    s_fill(a, &g, id);
    proto_chat msgs[2];
    if (a->n_tokens >= 0) {
        g.prompt_kind = PROTO_PROMPT_TOKENS;
        g.tokens = a->tokens;
        g.n_tokens = (uint32_t)a->n_tokens;
    } else if (a->chat || a->system) {
        int n = 0;
        if (a->system) msgs[n++] = (proto_chat){proto_cstr("system"), proto_cstr(a->system)};
        msgs[n++] = (proto_chat){proto_cstr("user"), proto_cstr(a->prompt)};
        g.prompt_kind = PROTO_PROMPT_MESSAGES;
        g.messages = msgs;
        g.n_messages = (uint32_t)n;
    } else {
        g.prompt_kind = PROTO_PROMPT_TEXT;
        g.prompt = proto_cstr(a->prompt);
    }
    return s_run_one(c, a, &g, NULL);
}

static int s_chat(zllm_client *c, const s_args *a) {
    enum { MAXM = 256 };   /* messages kept; the oldest exchanges are dropped beyond it */
    char *role[MAXM], *content[MAXM];
    int n = 0, rc = 0, turn = 0;
    if (a->system) {
        role[n] = strdup("system");
        content[n++] = strdup(a->system);
    }
    int interactive = isatty(0);
    char *line = malloc(S_LINE_MAX);
    if (!line) return 1;
    for (;;) {
        if (interactive) {
            fprintf(stderr, "> ");
            fflush(stderr);
        }
        if (!fgets(line, S_LINE_MAX, stdin)) break;
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (n + 2 > MAXM) {   /* drop the oldest user/assistant pair after the system message */
            int first = a->system ? 1 : 0;
            for (int k = first; k < first + 2; k++) {
                free(role[k]);
                free(content[k]);
            }
            memmove(role + first, role + first + 2, (size_t)(n - first - 2) * sizeof *role);
            memmove(content + first, content + first + 2, (size_t)(n - first - 2) * sizeof *content);
            n -= 2;
        }
        role[n] = strdup("user");
        content[n++] = strdup(line);
        proto_chat msgs[MAXM];
        for (int k = 0; k < n; k++) msgs[k] = (proto_chat){proto_cstr(role[k]), proto_cstr(content[k])};
        char id[64];
        snprintf(id, sizeof id, "chat-%d-%d", (int)getpid(), turn++);
        proto_generate g;
        s_fill(a, &g, id);
        g.prompt_kind = PROTO_PROMPT_MESSAGES;
        g.messages = msgs;
        g.n_messages = (uint32_t)n;
        char *reply = NULL;
        s_interrupted = 0;
        rc = s_run_one(c, a, &g, &reply);
        role[n] = strdup("assistant");
        content[n++] = reply;
    }
    for (int k = 0; k < n; k++) {
        free(role[k]);
        free(content[k]);
    }
    free(line);
    return rc;
}

static int s_status(zllm_client *c, const char *ep) {
    char err[256];
    if (zllm_client_status(c, "status", err, sizeof err) != 0) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    double end = s_now() + 5.0;
    while (s_now() < end) {
        const proto_msg *m;
        int r = zllm_client_recv(c, 200, &m, err, sizeof err);
        if (r < 0) break;
        if (r == 0 || m->type != PROTO_STATUS) continue;
        const proto_status *s = &m->status;
        printf("ready %s, queue %u, active %u\n", s->ready ? "yes" : "no", s->queue, s->active);
        printf("models:");
        for (uint32_t i = 0; i < s->n_models; i++) printf(" %.*s", (int)s->models[i].n, s->models[i].p);
        printf("\nworkers: %u\n", s->n_workers);
        for (uint32_t i = 0; i < s->n_workers; i++) {
            const proto_worker_info *w = &s->workers[i];
            printf("  %.*s model %.*s device %.*s batch %u slots %u (free %u, running %u) ctx %u step %llu %s\n",
                   (int)w->name.n, w->name.p ? w->name.p : "", (int)w->model.n, w->model.p ? w->model.p : "",
                   (int)w->device.n, w->device.p ? w->device.p : "", w->max_batch, w->n_slots, w->free_slots,
                   w->running, w->n_ctx, (unsigned long long)w->step, w->alive ? "alive" : "DEAD");
        }
        for (uint32_t i = 0; i < s->n_capacity; i++) {   /* why a model cannot take work now */
            const proto_model_info *k = &s->capacity[i];
            printf("  model %.*s: %u workers, %u free slots, %u queued, %llu registrations refused%s%.*s\n",
                   (int)k->model.n, k->model.p ? k->model.p : "", k->workers, k->free_slots, k->queued,
                   (unsigned long long)k->refused, k->reason.n ? ": " : "", (int)k->reason.n,
                   k->reason.p ? k->reason.p : "");
        }
        printf("counters:");
        for (uint32_t i = 0; i < s->n_counters; i++)
            printf(" %.*s=%llu", (int)s->counters[i].name.n, s->counters[i].name.p ? s->counters[i].name.p : "",
                   (unsigned long long)s->counters[i].value);
        printf("\n");
        return s->ready ? 0 : 1;
    }
    fprintf(stderr, "zllm: no status from %s within 5 s\n", ep);
    return 1;
}

/* ------------------------------------------------------------------------------------------------------------
 * bench: a closed-loop load generator */

typedef struct {
    double t_submit, t_first, t_last, t_end;  /* seconds */
    int n_out;                     /* tokens received */
    int done;                      /* 1 after the final (or a client timeout) */
    int ok;                        /* 1 for stop/length */
    proto_finish finish;           /* final's finish */
} s_breq;

static uint64_t s_rand(uint64_t *x) {   /* xorshift64* */
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, int n, double p) {
    if (n == 0) return NAN;
    int i = (int)ceil(p / 100.0 * n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

static int s_bench(zllm_client *c, const s_args *a) {
    int N = a->n_requests;
    s_breq *r = calloc((size_t)N, sizeof *r);
    double *ttft = calloc((size_t)N, sizeof *ttft);
    size_t itl_cap = 1 << 16;
    double *itl = malloc(itl_cap * sizeof *itl);
    int32_t *toks = malloc((size_t)a->plen_hi * sizeof *toks);
    if (!r || !ttft || !itl || !toks) return 1;
    size_t n_itl = 0;
    uint64_t rng = a->bench_seed * 0x9E3779B97F4A7C15ull + 1;
    unsigned deadline = a->deadline_ms ? a->deadline_ms : 60000;
    int next = 0, in_flight = 0, finished = 0, rc = 0;
    long long out_tokens = 0;
    char err[256], id[64];
    int fin_count[PROTO_FINISH_COUNT] = {0};
    double t0 = s_now();
    while (finished < N && !s_interrupted) {
        while (next < N && in_flight < a->concurrency) {
            int pl = a->plen_lo + (int)(s_rand(&rng) % (uint64_t)(a->plen_hi - a->plen_lo + 1));
            int ol = a->olen_lo + (int)(s_rand(&rng) % (uint64_t)(a->olen_hi - a->olen_lo + 1));
            for (int i = 0; i < pl; i++) toks[i] = 3 + (int32_t)(s_rand(&rng) % (uint64_t)(a->vocab - 3));
            snprintf(id, sizeof id, "b%d", next);
            proto_generate g;
            s_fill(a, &g, id);
            if (isnan(a->temp)) g.sampling.temperature = 0;
            g.sampling.ignore_eos = 1;
            g.prompt_kind = PROTO_PROMPT_TOKENS;
            g.tokens = toks;
            g.n_tokens = (uint32_t)pl;
            g.max_tokens = (uint32_t)ol;
            g.deadline_ms = deadline;
            r[next].t_submit = s_now();
            if (zllm_client_submit(c, &g, err, sizeof err) != 0) {
                fprintf(stderr, "zllm bench: %s\n", err);
                r[next].done = 1;
                finished++;
            } else {
                in_flight++;
            }
            next++;
        }
        const proto_msg *m;
        int got = zllm_client_recv(c, 100, &m, err, sizeof err);
        double now = s_now();
        if (got < 0) {
            fprintf(stderr, "zllm bench: %s\n", err);
            rc = 1;
            break;
        }
        if (got == 1 && (m->type == PROTO_TOKEN || m->type == PROTO_FINAL)) {
            proto_str pid = m->type == PROTO_TOKEN ? m->token.id : m->final.id;
            char sid[PROTO_ID_MAX + 1];
            proto_str_copy(pid, sid, sizeof sid);
            int k = sid[0] == 'b' ? atoi(sid + 1) : -1;
            if (k >= 0 && k < N && !r[k].done) {
                s_breq *q = &r[k];
                int n = m->type == PROTO_TOKEN ? (int)m->token.n_ids : 0;
                if (n > 0) {
                    if (q->n_out == 0) q->t_first = now;
                    else if (n_itl < itl_cap) itl[n_itl++] = (now - q->t_last) / n;
                    q->t_last = now;
                    q->n_out += n;
                }
                if (m->type == PROTO_FINAL) {
                    q->done = 1;
                    q->t_end = now;
                    q->finish = m->final.finish;
                    q->ok = q->finish == PROTO_FINISH_STOP || q->finish == PROTO_FINISH_LENGTH;
                    fin_count[q->finish]++;
                    out_tokens += q->n_out;
                    in_flight--;
                    finished++;
                }
            }
        }
        for (int k = 0; k < next; k++)   /* client-side timeouts */
            if (!r[k].done && now - r[k].t_submit > (deadline + S_GRACE_MS) / 1000.0) {
                snprintf(id, sizeof id, "b%d", k);
                zllm_client_cancel(c, id, err, sizeof err);
                r[k].done = 1;
                in_flight--;
                finished++;
            }
    }
    double wall = s_now() - t0;
    int n_ttft = 0, n_ok = 0;
    for (int k = 0; k < N; k++) {
        if (r[k].ok) n_ok++;
        if (r[k].n_out > 0) ttft[n_ttft++] = r[k].t_first - r[k].t_submit;
    }
    qsort(ttft, (size_t)n_ttft, sizeof *ttft, s_cmp);
    qsort(itl, n_itl, sizeof *itl, s_cmp);
    printf("requests: %d (%d ok", N, n_ok);
    for (int f = 1; f < PROTO_FINISH_COUNT; f++)
        if (fin_count[f]) printf(", %d %s", fin_count[f], proto_finish_name((proto_finish)f));
    int n_final = 0;
    for (int f = 1; f < PROTO_FINISH_COUNT; f++) n_final += fin_count[f];
    printf(", %d without final), concurrency %d, prompt %d..%d, output %d..%d tokens\n", N - n_final,
           a->concurrency, a->plen_lo, a->plen_hi, a->olen_lo, a->olen_hi);
    printf("wall %.2f s, %.1f requests/s, %.1f output tokens/s\n", wall, n_ok / wall, out_tokens / wall);
    printf("ttft ms: p50 %.1f p90 %.1f p99 %.1f\n", s_pct(ttft, n_ttft, 50) * 1e3, s_pct(ttft, n_ttft, 90) * 1e3,
           s_pct(ttft, n_ttft, 99) * 1e3);
    printf("itl ms:  p50 %.2f p90 %.2f p99 %.2f\n", s_pct(itl, (int)n_itl, 50) * 1e3,
           s_pct(itl, (int)n_itl, 90) * 1e3, s_pct(itl, (int)n_itl, 99) * 1e3);
    if (n_ok != N) rc = 1;
    free(r);
    free(ttft);
    free(itl);
    free(toks);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        s_usage();
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    s_args a;
    if (s_parse(argc, argv, &a) != 0) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_sigint;
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    zllm_client *c = zllm_client_new(a.broker, err, sizeof err);
    if (!c) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    int rc;
    if (!strcmp(cmd, "generate")) rc = s_generate(c, &a);
    else if (!strcmp(cmd, "chat")) rc = s_chat(c, &a);
    else if (!strcmp(cmd, "status")) rc = s_status(c, a.broker);
    else if (!strcmp(cmd, "bench")) rc = s_bench(c, &a);
    else {
        s_usage();
        rc = 2;
    }
    zllm_client_destroy(&c);
    return rc;
}
