/* tools/main_zllm-pipebench.c: zllm-pipebench, the decode speed of a model split over pipeline stages on this
 * host (worker/stage.h), driven by the worker's batcher with 1 or more lanes (docs/pipeline.md, docs/perf.md).
 *
 *   zllm-pipebench -m MODEL.gguf [--stages N] [--lanes L] [--seqs S] [--prompt P] [--gen G] [--threads T]
 *                  [--repeat R]
 *
 * --stages 1 runs the whole model in this process (the reference); N >= 2 forks N-1 follower processes (stages
 * 1..N-1, each with T CPU threads) and makes this process the leader (stage 0, T threads). S sequences with
 * P-token prompts (ids from a fixed generator, greedy, end-of-generation ignored) each generate G tokens; the
 * clock runs from the first token of every sequence (prefill done) to the last, and tokens/s counts the decode
 * tokens in between. Every run must give the same tokens as the first one (the lanes must not change results);
 * a mismatch is reported and the exit status is 1. R repetitions print each and the best. Each run also prints
 * the CPU time of the leader process and of the followers (from /proc, 10 ms ticks) over its wall time: the
 * parallelism the stages reached (about 1 when other processes hold the cores, whatever the lanes). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "batcher.h"
#include "engine.h"
#include "model.h"
#include "stage.h"
#include "version.h"

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_usage(FILE *f) {
    fprintf(f,
            "usage: zllm-pipebench -m MODEL.gguf [--stages N] [--lanes L] [--seqs S] [--prompt P] [--gen G]\n"
            "                      [--threads T] [--repeat R]\n"
            "       zllm-pipebench --help | --version\n"
            "  -m, --model FILE  the GGUF model (required)\n"
            "  --stages N        pipeline stages, 1..%d (default 1)\n"
            "  --lanes L         lanes with a step in flight, 1..%d (default 1)\n"
            "  --seqs S          sequences, 1..256 (default 8)\n"
            "  --prompt P        prompt tokens per sequence, 1..4096 (default 16)\n"
            "  --gen G           tokens generated per sequence, 2..4096 (default 64)\n"
            "  --threads T       CPU threads per stage, 0..256 (default 1; 0: all cores)\n"
            "  --repeat R        runs, 1..100 (default 3)\n"
            "  -h, --help        this text;  --version  print the version\n"
            "Environment: none read.\n",
            STAGE_MAX, WK_MAX_LANES);
}

/* CPU seconds of process pid (utime + stime from /proc/pid/stat), or 0 */
static double s_proc_cpu(pid_t pid) {
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *c = strrchr(buf, ')');   /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!c || sscanf(c + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double s_self_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

typedef struct {
    const char *model;             /* GGUF path */
    int stages, lanes, seqs, prompt, gen, threads, repeat;   /* as the options */
} s_opts;

/* one run: decode tokens per second in *tps, every sequence's tokens in toks[seqs][gen]; 0 or -1 */
static int s_run(zl_engine *e, const zl_model *m, const s_opts *o, int32_t *toks, double *tps) {
    char err[256];
    int rc = -1, vocab = m->cfg.vocab_size;
    uint8_t *eog = calloc((size_t)vocab, 1);
    wk_batcher *b = eog ? batcher_new(e, eog, vocab, err, sizeof err) : NULL;
    int32_t *prompt = malloc((size_t)o->prompt * sizeof *prompt);
    int *n_got = calloc((size_t)o->seqs, sizeof *n_got);
    wk_event *ev = b ? calloc((size_t)batcher_event_cap(b), sizeof *ev) : NULL;
    if (!b || !prompt || !n_got || !ev) {
        fprintf(stderr, "zllm-pipebench: %s\n", b ? "out of memory" : err);
        goto out;
    }
    if (batcher_set_lanes(b, o->lanes) != o->lanes) {
        fprintf(stderr, "zllm-pipebench: the %s engine does not take %d lanes\n", e->device, o->lanes);
        goto out;
    }
    for (int i = 0; i < o->seqs; i++) {
        uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        prompt[0] = 1;
        for (int t = 1; t < o->prompt; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompt[t] = (int32_t)(3 + x % (uint64_t)(vocab - 3));
        }
        wk_request r;
        memset(&r, 0, sizeof r);
        r.rid = (uint64_t)i + 1;
        r.tokens = prompt;
        r.n_tokens = o->prompt;
        r.max_tokens = o->gen;
        r.samp = sampler_defaults();
        r.ignore_eos = 1;
        if (batcher_add(b, &r, err, sizeof err) != 0) {
            fprintf(stderr, "zllm-pipebench: %s\n", err);
            goto out;
        }
    }
    int started = 0, done = 0;
    long decoded = 0;
    double t0 = 0;
    while (done < o->seqs) {
        int n_ev = 0;
        if (batcher_step(b, ev, batcher_event_cap(b), &n_ev, err, sizeof err) < 0) {
            fprintf(stderr, "zllm-pipebench: %s\n", err);
            goto out;
        }
        for (int j = 0; j < n_ev; j++) {
            int i = (int)ev[j].rid - 1;
            if (i < 0 || i >= o->seqs || ev[j].tok < 0) continue;
            if (n_got[i] < o->gen) toks[(size_t)i * o->gen + n_got[i]] = ev[j].tok;
            if (n_got[i]++ == 0 && ++started == o->seqs) t0 = s_now();
            else if (started == o->seqs) decoded++;
            if (ev[j].fin) done++;
        }
    }
    double dt = s_now() - t0;
    *tps = dt > 0 ? decoded / dt : 0;
    rc = 0;
out:
    free(ev);
    free(n_got);
    free(prompt);
    batcher_destroy(&b);
    free(eog);
    return rc;
}

int main(int argc, char **argv) {
    s_opts o = { NULL, 1, 1, 8, 16, 64, 1, 3 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("zllm-pipebench %s\n", ZLLM_VERSION);
            return 0;
        }
        if (i + 1 >= argc) {
            s_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int x = atoi(v);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--stages") && x >= 1 && x <= STAGE_MAX) o.stages = x;
        else if (!strcmp(a, "--lanes") && x >= 1 && x <= WK_MAX_LANES) o.lanes = x;
        else if (!strcmp(a, "--seqs") && x >= 1 && x <= 256) o.seqs = x;
        else if (!strcmp(a, "--prompt") && x >= 1 && x <= 4096) o.prompt = x;
        else if (!strcmp(a, "--gen") && x >= 2 && x <= 4096) o.gen = x;
        else if (!strcmp(a, "--threads") && x >= 0 && x <= 256) o.threads = x;
        else if (!strcmp(a, "--repeat") && x >= 1 && x <= 100) o.repeat = x;
        else {
            fprintf(stderr, "zllm-pipebench: bad option %s %s\n", a, v);
            return 2;
        }
    }
    if (!o.model) {
        s_usage(stderr);
        return 2;
    }
    char err[512], group[64];
    zl_model *m = model_load(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "zllm-pipebench: %s\n", err);
        return 1;
    }
    snprintf(group, sizeof group, "pipebench-%d", (int)getpid());
    pid_t kids[STAGE_MAX];
    int n_kids = 0;
    stage_opts so;
    memset(&so, 0, sizeof so);
    so.group = group;
    so.n_stages = o.stages;
    so.threads = o.threads;
    for (int s = 1; s < o.stages; s++) {
        pid_t p = fork();
        if (p == 0) {
            so.stage = s;
            int rc = stage_run_follower(m, &so, NULL, err, sizeof err);
            if (rc) fprintf(stderr, "zllm-pipebench: stage %d: %s\n", s, err);
            _exit(rc ? 1 : 0);
        }
        if (p > 0) kids[n_kids++] = p;
    }
    so.stage = 0;
    zl_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.device = "cpu";
    eo.n_slots = eo.max_batch = o.seqs;
    eo.n_ctx = o.prompt + o.gen + 1;
    eo.max_step_tokens = 256;
    eo.threads = o.threads;
    zl_engine *e = o.stages > 1 ? stage_leader_new(m, &eo, &so, err, sizeof err) : engine_new(m, &eo, err, sizeof err);
    int status = 1;
    int32_t *ref = calloc((size_t)o.seqs * o.gen, sizeof *ref), *toks = calloc((size_t)o.seqs * o.gen, sizeof *toks);
    if (!e || !ref || !toks) {
        fprintf(stderr, "zllm-pipebench: %s\n", e ? "out of memory" : err);
        goto out;
    }
    double best = 0;
    status = 0;
    for (int r = 0; r < o.repeat; r++) {
        double tps, c0 = s_self_cpu(), c1 = 0, t0 = s_now();
        for (int i = 0; i < n_kids; i++) c1 -= s_proc_cpu(kids[i]);
        int rc = s_run(e, m, &o, r ? toks : ref, &tps);
        double wall = s_now() - t0;
        c0 = s_self_cpu() - c0;
        for (int i = 0; i < n_kids; i++) c1 += s_proc_cpu(kids[i]);
        if (rc != 0) {
            status = 1;
            break;
        }
        if (r && memcmp(ref, toks, (size_t)o.seqs * o.gen * sizeof *ref) != 0) {
            fprintf(stderr, "zllm-pipebench: run %d gave other tokens than run 1\n", r + 1);
            status = 1;
        }
        printf("run %d: %.1f decode tokens/s; CPU leader %.2f s + followers %.2f s in %.2f s: parallelism %.2f\n",
               r + 1, tps, c0, c1, wall, wall > 0 ? (c0 + c1) / wall : 0);
        if (tps > best) best = tps;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < (size_t)o.seqs * o.gen; i++) h = (h ^ (uint32_t)ref[i]) * 1099511628211ull;
    printf("%s: %d stage%s, %d lane%s, %d sequences, prompt %d, %d tokens each, %d thread%s per stage: best %.1f "
           "decode tokens/s (tokens hash %016llx)\n", e->device, o.stages, o.stages > 1 ? "s" : "", o.lanes,
           o.lanes > 1 ? "s" : "", o.seqs, o.prompt, o.gen, o.threads, o.threads == 1 ? "" : "s", best,
           (unsigned long long)h);
out:;
    const int no_leader = e == NULL;   /* the followers would wait for it until their attach timeout */
    free(ref);
    free(toks);
    engine_destroy(&e);   /* a leader shuts its group down: the followers exit 0 */
    for (int i = 0; i < n_kids; i++) {
        if (no_leader) kill(kids[i], SIGTERM);
        int st;
        waitpid(kids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
    }
    model_destroy(&m);
    return status;
}
