/* tools/main_zllm-brokerbench.c: broker cost benchmark. Starts a zllm-broker as a child process, plays W fake
 * workers (threads: each step emits one token for every sequence it holds, echoing the prompt) and C clients
 * (threads: each keeps K streaming requests in flight) over real ipc sockets, and reports the broker's CPU time
 * per streamed token (utime+stime of the broker process from /proc over the measured window, and getrusage of
 * the reaped child over its whole life) and the tokens per second through the one broker.
 *
 *   zllm-brokerbench --broker BUILD/bin/zllm-broker --model stories260K.gguf [--workers 4] [--slots 64]
 *                    [--clients 16] [--inflight 8] [--max-tokens 256] [--seconds 5] */
#include "proto.h"
#include "version.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

typedef struct {
    uint64_t rid;
    int32_t toks[64];           /* prompt (echoed cyclically) */
    uint32_t n_toks, max, n;
} bseq;

static void *s_ctx;
static char s_cep[256], s_wep[256];
static int s_slots = 64, s_inflight = 8, s_max_tokens = 256;
static atomic_int s_stop;
static atomic_ullong s_tokens, s_finals;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *worker_main(void *arg) {
    int idx = (int)(intptr_t)arg;
    void *s = zmq_socket(s_ctx, ZMQ_DEALER);
    int zero = 0, hwm = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_connect(s, s_wep);
    proto_buf b = {0};
    proto_msg m = {0};
    char name[64], err[256];
    snprintf(name, sizeof name, "bench-%d", idx);
    proto_register r = {proto_cstr(name),
                        proto_cstr("bench"),
                        proto_cstr("fake"),
                        (uint32_t)s_slots,
                        (uint32_t)s_slots,
                        4096,
                        (uint64_t)s_slots * 4096,
                        0,
                        200,
                        0,
                        0};
    proto_encode_register(&b, &r);
    zmq_send(s, b.data, b.len, 0);
    bseq *seqs = calloc((size_t)s_slots, sizeof *seqs);
    uint64_t *rids = calloc((size_t)s_slots, sizeof *rids);
    int32_t *toks = calloc((size_t)s_slots, sizeof *toks);
    uint8_t *fin = calloc((size_t)s_slots, 1);
    int n = 0;
    uint64_t step = 0;
    double last_hb = 0;
    while (!atomic_load(&s_stop)) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        zmq_poll(&it, 1, n ? 0 : 1);
        for (;;) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, s, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&msg); break; }
            if (proto_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &m, err, sizeof err) == 0) {
                if (m.type == PROTO_ASSIGN) {
                    for (uint32_t i = 0; i < m.assign.n_seqs && n < s_slots; i++) {
                        const proto_seq *q = &m.assign.seqs[i];
                        bseq *x = &seqs[n++];
                        x->rid = q->rid;
                        x->n_toks = q->n_tokens < 64 ? q->n_tokens : 64;
                        memcpy(x->toks, q->tokens, x->n_toks * sizeof(int32_t));
                        x->max = q->max_tokens;
                        x->n = 0;
                    }
                } else if (m.type == PROTO_CANCEL) {
                    for (uint32_t i = 0; i < m.cancel.n_rids; i++)
                        for (int j = 0; j < n; j++)
                            if (seqs[j].rid == m.cancel.rids[i]) { seqs[j] = seqs[--n]; break; }
                } else if (m.type == PROTO_REREGISTER) {
                    n = 0;
                    proto_encode_register(&b, &r);
                    zmq_send(s, b.data, b.len, 0);
                }
            }
            zmq_msg_close(&msg);
        }
        if (n) {
            int k = 0;
            for (int j = 0; j < n; j++) {
                bseq *x = &seqs[j];
                rids[k] = x->rid;
                toks[k] = x->toks[x->n % x->n_toks];
                x->n++;
                fin[k] = x->n >= x->max ? PROTO_FIN_LENGTH : PROTO_FIN_RUNNING;
                k++;
            }
            step++;
            proto_encode_out(&b, step, rids, toks, fin, (uint32_t)k);
            zmq_send(s, b.data, b.len, 0);
            for (int j = 0; j < n;) {
                if (seqs[j].n >= seqs[j].max) seqs[j] = seqs[--n];
                else j++;
            }
        }
        double t = now_s();
        if (t - last_hb > 0.1) {
            last_hb = t;
            proto_encode_hb_worker(&b, step, (uint32_t)(s_slots - n), (uint32_t)n, 0);
            zmq_send(s, b.data, b.len, 0);
        }
    }
    free(seqs); free(rids); free(toks); free(fin);
    proto_buf_free(&b);
    proto_msg_free(&m);
    zmq_close(s);
    return NULL;
}

static void *client_main(void *arg) {
    int idx = (int)(intptr_t)arg;
    void *s = zmq_socket(s_ctx, ZMQ_DEALER);
    int zero = 0, hwm = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_connect(s, s_cep);
    proto_buf b = {0};
    proto_msg m = {0};
    char id[32], err[256];
    unsigned seq = 0;
    proto_generate g;
    proto_generate_defaults(&g);
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("Once upon a time there was a little cat. The cat liked to play in the garden.");
    g.max_tokens = (uint32_t)s_max_tokens;
    g.sampling.temperature = 0;
    for (int i = 0; i < s_inflight; i++) {
        snprintf(id, sizeof id, "c%d-%u", idx, seq++);
        g.id = proto_cstr(id);
        proto_encode_generate(&b, &g);
        zmq_send(s, b.data, b.len, 0);
    }
    while (!atomic_load(&s_stop)) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, 10) <= 0) continue;
        for (;;) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, s, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&msg); break; }
            if (proto_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &m, err, sizeof err) == 0) {
                if (m.type == PROTO_TOKEN) atomic_fetch_add(&s_tokens, m.token.n_ids);
                else if (m.type == PROTO_FINAL) {
                    atomic_fetch_add(&s_finals, 1);
                    snprintf(id, sizeof id, "c%d-%u", idx, seq++);
                    g.id = proto_cstr(id);
                    proto_encode_generate(&b, &g);
                    zmq_send(s, b.data, b.len, 0);
                }
            }
            zmq_msg_close(&msg);
        }
    }
    proto_buf_free(&b);
    proto_msg_free(&m);
    zmq_close(s);
    return NULL;
}

/* utime + stime of pid in seconds, from /proc/pid/stat */
static double proc_cpu(pid_t pid) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    unsigned long ut = 0, st = 0;
    /* after ')': state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-brokerbench --broker PATH --model PATH.gguf [options]\n"
               "       zllm-brokerbench --help | --version\n"
               "The broker's CPU time per streamed token, with fake workers and clients over ipc sockets.\n"
               "  --broker PATH     the zllm-broker binary to start (required)\n"
               "  --model PATH      a GGUF file for its vocabulary (required)\n"
               "  --workers W       fake workers, 1..256 (default 4)\n"
               "  --slots S         sequences each fake worker holds, >= 1 (default 64)\n"
               "  --clients C       client threads, 1..1024 (default 16)\n"
               "  --inflight K      streaming requests each client keeps in flight, >= 1 (default 8)\n"
               "  --max-tokens N    tokens per request, >= 1 (default 256)\n"
               "  --seconds S       measured window, > 0 (default 5)\n"
               "  -h, --help        this text;  --version  print the version\n"
               "Environment: none read.\n");
}

int main(int argc, char **argv) {
    const char *broker = NULL, *model = NULL;
    int n_workers = 4, n_clients = 16;
    double seconds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("zllm-brokerbench %s\n", ZLLM_VERSION);
            return 0;
        }
    }
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "zllm-brokerbench: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--broker")) broker = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--workers")) n_workers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots")) s_slots = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients")) n_clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--inflight")) s_inflight = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-tokens")) s_max_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else { fprintf(stderr, "zllm-brokerbench: unknown option %s\n", argv[i]); return 2; }
    }
    if (!broker || !model || n_workers < 1 || n_workers > 256 || n_clients < 1 || n_clients > 1024 ||
        s_slots < 1 || s_inflight < 1 || s_max_tokens < 1 || seconds <= 0) {
        s_usage(stderr);
        return 2;
    }
    snprintf(s_cep, sizeof s_cep, "ipc:///tmp/zllm-bench-%d-c", (int)getpid());
    snprintf(s_wep, sizeof s_wep, "ipc:///tmp/zllm-bench-%d-w", (int)getpid());
    char marg[4200];
    snprintf(marg, sizeof marg, "bench=%s", model);
    char qarg[32];
    snprintf(qarg, sizeof qarg, "%d", n_clients * s_inflight + 16);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        execl(broker, broker, "--clients", s_cep, "--workers", s_wep, "--model", marg, "--queue", qarg, (char *)NULL);
        perror("exec");
        _exit(127);
    }
    usleep(300000);
    s_ctx = zmq_ctx_new();
    pthread_t wt[256], ct[1024];
    for (int i = 0; i < n_workers; i++) pthread_create(&wt[i], NULL, worker_main, (void *)(intptr_t)i);
    usleep(300000);
    for (int i = 0; i < n_clients; i++) pthread_create(&ct[i], NULL, client_main, (void *)(intptr_t)i);
    usleep(1000000);   /* warm up */
    unsigned long long tok0 = atomic_load(&s_tokens);
    double cpu0 = proc_cpu(pid), t0 = now_s();
    usleep((useconds_t)(seconds * 1e6));
    unsigned long long tok1 = atomic_load(&s_tokens);
    double cpu1 = proc_cpu(pid), t1 = now_s();
    atomic_store(&s_stop, 1);
    for (int i = 0; i < n_clients; i++) pthread_join(ct[i], NULL);
    for (int i = 0; i < n_workers; i++) pthread_join(wt[i], NULL);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double life_cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    zmq_ctx_term(s_ctx);
    unsigned long long ntok = tok1 - tok0;
    unsigned long long all_tok = atomic_load(&s_tokens);
    double wall = t1 - t0;
    printf("workers %d x %d slots, clients %d x %d in flight, max_tokens %d, window %.2f s\n", n_workers, s_slots,
           n_clients, s_inflight, s_max_tokens, wall);
    printf("streamed tokens in window: %llu (%.0f tokens/s through the broker), finals %llu\n", ntok, ntok / wall,
           (unsigned long long)atomic_load(&s_finals));
    if (ntok && cpu0 >= 0 && cpu1 >= 0)
        printf("broker CPU in window: %.2f s = %.2f us per streamed token (%.0f%% of one core)\n", cpu1 - cpu0,
               (cpu1 - cpu0) * 1e6 / ntok, 100.0 * (cpu1 - cpu0) / wall);
    if (all_tok)
        printf("broker CPU over its life (getrusage, incl. startup): %.2f s = %.2f us per streamed token (%llu)\n",
               life_cpu, life_cpu * 1e6 / all_tok, all_tok);
    printf("broker exit status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
