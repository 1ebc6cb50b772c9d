/* tests/test_stage.c: pipeline stages (worker/stage.h) over host shared memory (worker/shmring.h), with real
 * processes (fork): the shm rings refuse corrupt indexes and stale generations; 2-stage and 3-stage pipelines
 * of stories260K give exactly the golden 200 greedy ids (llama2.c's run.c); several sequences at once (prompts
 * in chunks, temperature sampling with seeds, repetition penalty) give the same tokens through 3 stages as one
 * whole-model engine; the partial engines' hidden states chain to the whole model's logits bitwise; kill -9 of
 * any stage mid-run brings the other stages down (non-zero exit) within a few seconds; and a group restarted
 * under the same name works again.
 * Lanes (steps in flight, engine_launch/engine_wait on lanes 0 and 1): 2 and 3 stages give the golden ids on two
 * lanes at once and the same tokens as one whole-model engine for the mixed set of sequences split over two lanes;
 * protocol misuse (a wait out of order, a busy lane, a slot in two steps, step() while in flight) fails cleanly
 * and the group keeps serving; and stage 1 really works while stage 0 computes: its CPU time during the leader's
 * submits is measured (clock_getcpuclockid), which does not depend on how loaded the machine is. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <glob.h>
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "shmring.h"
#include "stage.h"
#include "test.h"

static char s_path[1024];
static int32_t s_gold[256];
static char s_group[64];
static int s_dead_ms = 3000;   /* heartbeat age that means a dead peer */
static volatile uint64_t *s_progress;   /* shared with forked leaders: steps done */

/* a step of n entries q on `lane`, its ids into out (launched and waited for by the caller) */
static zl_step lane_step(const zl_seq *q, int n, int lane, int32_t *out) {
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = q;
    st.n = n;
    st.lane = lane;
    st.out_tokens = out;
    return st;
}

/* one synchronous step of a partial engine (a pipeline stage): hidden states in and out */
static int run_hidden(zl_engine *e, const zl_seq *q, int n, const float *h_in, float *h_out, int32_t *out,
                      float *logits) {
    zl_step st = lane_step(q, n, 0, out);
    st.sync = 1;
    st.h_in = h_in;
    st.h_out = h_out;
    st.out_logits = logits;
    return engine_run(e, &st);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static stage_opts opts(int stage, int n) {
    stage_opts so;
    memset(&so, 0, sizeof so);
    so.group = s_group;
    so.stage = stage;
    so.n_stages = n;
    so.threads = 1;
    so.attach_timeout_ms = 10000;
    so.dead_ms = s_dead_ms;
    return so;
}

/* a follower process: loads the model itself and serves its stage; exits 0 on the leader's shutdown */
static pid_t spawn_follower(int stage, int n) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char err[256];
    zl_model *m = model_load(s_path, err, sizeof err);
    if (!m) _exit(2);
    stage_opts so = opts(stage, n);
    int rc = stage_run_follower(m, &so, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "[stage %d/%d pid %d] %s\n", stage, n, (int)getpid(), err);
    model_destroy(&m);
    _exit(rc ? 3 : 0);
}

/* waits for pid up to secs; returns its wait status, or -1 on timeout (then kills it) */
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

static zl_engine_opts eopts(int slots) {
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = slots;
    o.max_batch = slots;
    o.n_ctx = 256;
    o.threads = 1;
    o.max_step_tokens = 64;
    return o;
}

/* 1 when a segment of group s_group (any generation) is in /dev/shm */
static int shm_exists(void) {
    char p[128];
    snprintf(p, sizeof p, "/dev/shm/zllm-%s.%u.*", s_group, (unsigned)geteuid());
    glob_t gl;
    int found = glob(p, 0, NULL, &gl) == 0 && gl.gl_pathc > 0;
    globfree(&gl);
    return found;
}

/* ------------------------------------------------------------------------------------------------------------
 * rings */

static void test_rings(void) {
    char err[256];
    snprintf(s_group, sizeof s_group, "t%d-rings", (int)getpid());
    shm_ring_spec sp[1] = { { 2, 64 } };
    int info = 42;
    shm_group *a = shm_group_create(s_group, 2, sp, 1, &info, sizeof info, err, sizeof err);
    CHECK(a != NULL, "create: %s", err);
    if (!a) return;
    shm_group *b = shm_group_attach(s_group, 1, 1000, err, sizeof err);
    CHECK(b != NULL, "attach: %s", err);
    if (!b) {
        shm_group_destroy(&a);
        return;
    }
    shm_group *c = shm_group_attach(s_group, 1, 100, err, sizeof err);
    CHECK(c == NULL && strstr(err, "already attached"), "a second member 1 is refused: %s", err);
    CHECK(shm_group_attach(s_group, 2, 100, err, sizeof err) == NULL, "member 2 of 2 refused");
    size_t ib;
    const int *pi = shm_group_info(b, &ib);
    CHECK(ib == sizeof info && *pi == 42, "info blob travels");
    CHECK(shm_group_wait_members(a, 1000, err, sizeof err) == 0, "all attached: %s", err);
    void *w;
    const void *r;
    uint64_t n;
    /* fill: 2 slots, the third reservation times out */
    for (int i = 0; i < 2; i++) {
        CHECK(shm_ring_reserve(a, 0, 100, &w, err, sizeof err) == 0, "reserve %d: %s", i, err);
        memset(w, 'a' + i, 64);
        CHECK(shm_ring_publish(a, 0, 10 + i, err, sizeof err) == 0, "publish: %s", err);
    }
    CHECK(shm_ring_reserve(a, 0, 50, &w, err, sizeof err) == 1, "full ring: reservation times out");
    CHECK(shm_ring_publish(a, 0, 100, err, sizeof err) != 0, "publish without a reservation / oversized refused");
    CHECK(shm_ring_peek(b, 0, 100, &r, &n, err, sizeof err) == 0 && n == 10 && ((const char *)r)[0] == 'a',
          "first slot: %llu bytes", (unsigned long long)n);
    shm_ring_release(b, 0);
    CHECK(shm_ring_peek(b, 0, 100, &r, &n, err, sizeof err) == 0 && n == 11 && ((const char *)r)[0] == 'b',
          "second slot");
    shm_ring_release(b, 0);
    shm_ring_release(b, 0);   /* nothing peeked: ignored */
    CHECK(shm_ring_peek(b, 0, 50, &r, &n, err, sizeof err) == 1, "empty ring: peek times out");
    CHECK(shm_ring_peek(b, 5, 50, &r, &n, err, sizeof err) == -1, "ring index out of range refused");

    /* corruption through the mapping: a stale generation in the next slot, then a head far past the tail */
    int fd = open(shm_group_path(a), O_RDWR);
    CHECK(fd >= 0, "open for corruption");
    off_t size = lseek(fd, 0, SEEK_END);
    unsigned char *raw = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(shm_ring_reserve(a, 0, 100, &w, err, sizeof err) == 0, "reserve");
    CHECK(shm_ring_publish(a, 0, 8, err, sizeof err) == 0, "publish");
    uint64_t *slot_gen = (uint64_t *)((char *)w - 64);   /* the slot header precedes the payload */
    *slot_gen ^= 1;
    CHECK(shm_ring_peek(b, 0, 100, &r, &n, err, sizeof err) == -1 && strstr(err, "stale"), "stale slot: %s", err);
    *slot_gen ^= 1;
    CHECK(shm_ring_peek(b, 0, 100, &r, &n, err, sizeof err) == 0, "restored slot reads");
    shm_ring_release(b, 0);
    /* find ring 0's head (it equals 3 now, tail 3) and push it beyond the capacity */
    uint32_t *head = NULL;
    for (off_t o = 0; o + 4 <= size && o < 8192; o += 4) {
        uint32_t *p = (uint32_t *)(raw + o);
        if (*p == 3 && p[16] == 3) {   /* head and tail sit 64 bytes apart */
            head = p;
            break;
        }
    }
    CHECK(head != NULL, "found the ring counters");
    if (head) {
        *head = 3 + 7;
        CHECK(shm_ring_peek(b, 0, 100, &r, &n, err, sizeof err) == -1 && strstr(err, "corrupt"),
              "head beyond capacity refused: %s", err);
        *head = 3;
    }
    munmap(raw, (size_t)size);
    /* abort wakes and fails waits on both sides */
    shm_group_abort(a, SHM_FAILED);
    CHECK(shm_ring_peek(b, 0, 1000, &r, &n, err, sizeof err) == -1, "peek after abort fails");
    shm_group_abort(a, SHM_SHUTDOWN);
    CHECK(shm_group_aborted(b) == SHM_FAILED, "a failure is never downgraded to a shutdown");
    shm_group_destroy(&b);
    shm_group_destroy(&a);
    shm_group_destroy(&a);   /* idempotent */
    CHECK(a == NULL && !shm_exists(), "creator unlinks on destroy");
    CHECK(shm_group_attach(s_group, 1, 100, err, sizeof err) == NULL, "attach to a missing group times out");
    CHECK(shm_group_create("bad/name", 2, sp, 1, NULL, 0, err, sizeof err) == NULL, "bad name refused");
}

/* ------------------------------------------------------------------------------------------------------------
 * partial engines chain to the whole model */

static void test_chain(const zl_model *m) {
    char err[256];
    int L = m->cfg.n_layers, D = m->cfg.dim, V = m->cfg.vocab_size;
    zl_engine_opts o = eopts(2);
    zl_engine *whole = engine_new(m, &o, err, sizeof err);
    CHECK(whole != NULL, "whole: %s", err);
    zl_engine *part[3] = { NULL, NULL, NULL };
    for (int i = 0; i < 3; i++) {
        zl_engine_opts po = o;
        stage_layer_range(L, i, 3, &po.layer_begin, &po.layer_end);
        part[i] = engine_new(m, &po, err, sizeof err);
        CHECK(part[i] != NULL, "part %d: %s", i, err);
    }
    zl_engine_opts bad = o;
    bad.layer_begin = 2;
    bad.layer_end = 1;
    CHECK(engine_new(m, &bad, err, sizeof err) == NULL, "empty layer range refused");
    bad.layer_begin = 0;
    bad.layer_end = L + 1;
    CHECK(engine_new(m, &bad, err, sizeof err) == NULL, "range past the model refused");
    if (!whole || !part[0] || !part[1] || !part[2]) goto out;
    int32_t prompt[5] = { 1, 40, 50, 60, 70 }, t2 = 300, tw[2], tp[2];
    zl_seq s[2] = { { .slot = 0, .pos = 0, .n_tokens = 5, .tokens = prompt, .sample = 1 },
                    { .slot = 1, .pos = 0, .n_tokens = 1, .tokens = &t2, .sample = 1 } };
    float *lw = malloc(sizeof(float) * 2 * V), *lp = malloc(sizeof(float) * 2 * V);
    float *h1 = malloc(sizeof(float) * 6 * D), *h2 = malloc(sizeof(float) * 6 * D);
    CHECK(engine_step(part[0], s, 2, tp, NULL) != 0, "step() on a partial engine refused: %s", part[0]->err);
    CHECK(run_hidden(part[1], s, 2, NULL, h2, NULL, NULL) != 0, "middle stage without h_in refused");
    CHECK(run_hidden(part[0], s, 2, NULL, NULL, NULL, NULL) != 0, "first stage without h_out refused");
    {
        zl_step dv = lane_step(s, 2, 0, NULL);
        void *ev = NULL;
        dv.sync = 1;
        dv.h_out = h2;
        dv.h_dev = 1;
        CHECK(engine_run(part[0], &dv) != 0 && strstr(part[0]->err, "CUDA"), "device hidden states refused: %s",
              part[0]->err);
        dv.h_dev = 0;
        dv.wait_ev = &ev;
        dv.n_wait = 1;
        CHECK(engine_run(part[0], &dv) != 0, "events refused by the CPU engine");
    }
    CHECK(engine_step(whole, s, 2, tw, lw) == 0, "whole step: %s", whole->err);
    CHECK(run_hidden(part[0], s, 2, NULL, h1, NULL, NULL) == 0, "part 0: %s", part[0]->err);
    zl_seq s_nt[2] = { s[0], s[1] };
    s_nt[0].tokens = s_nt[1].tokens = NULL;   /* later stages do not need tokens */
    CHECK(run_hidden(part[1], s_nt, 2, h1, h2, NULL, NULL) == 0, "part 1: %s", part[1]->err);
    CHECK(run_hidden(part[2], s_nt, 2, h2, NULL, tp, lp) == 0, "part 2: %s", part[2]->err);
    CHECK(memcmp(lw, lp, sizeof(float) * 2 * V) == 0 && tw[0] == tp[0] && tw[1] == tp[1],
          "3 partial engines give bitwise the whole model's logits");
    free(lw);
    free(lp);
    free(h1);
    free(h2);
out:
    engine_destroy(&whole);
    for (int i = 0; i < 3; i++) engine_destroy(&part[i]);
}

/* ------------------------------------------------------------------------------------------------------------
 * golden ids through N stages */

static void test_golden(const zl_model *m, int n) {
    char err[256];
    snprintf(s_group, sizeof s_group, "t%d-gold%d", (int)getpid(), n);
    pid_t f[STAGE_MAX];
    for (int i = 1; i < n; i++) f[i] = spawn_follower(i, n);
    zl_engine_opts o = eopts(1);
    stage_opts so = opts(0, n);
    double t0 = now_s();
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "%d stages: leader: %s", n, err);
    int same = 0;
    if (e) {
        int32_t tok = 1, out = -1;
        for (int i = 0; i < 200; i++) {
            zl_seq s = { .slot = 0, .pos = i, .n_tokens = 1, .tokens = &tok, .sample = 1 };
            if (engine_step(e, &s, 1, &out, NULL) != 0) {
                CHECK(0, "%d stages: step %d: %s", n, i, e->err);
                break;
            }
            if (out != s_gold[i]) {
                CHECK(0, "%d stages: greedy token %d: got %d, golden %d", n, i, out, s_gold[i]);
                break;
            }
            same++;
            tok = out;
        }
    }
    CHECK(same == 200, "%d stages: %d of 200 golden greedy tokens", n, same);
    engine_destroy(&e);
    for (int i = 1; i < n; i++) {
        int st = wait_for(f[i], 5.0);
        CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%d stages: follower %d exits 0 on shutdown (%d)", n,
              i, st);
    }
    CHECK(!shm_exists(), "%d stages: segment removed after shutdown", n);
    printf("%d stages: 200 golden tokens in %.2f s\n", n, now_s() - t0);
}

/* ------------------------------------------------------------------------------------------------------------
 * several sequences at once: the pipeline against one whole-model engine */

#define NS 5
#define NGEN 12
typedef struct {
    int32_t toks[64];          /* prompt then generated */
    int n, fed, plen, chunk;   /* tokens known, in the cache, prompt length, prefill chunk */
    uint64_t rng;              /* generator */
    zl_sampling samp;          /* parameters */
    int gen;                   /* tokens generated */
} seqst;

static void seqs_init(seqst *ss, int vocab) {
    static const int plen[NS] = { 1, 9, 17, 4, 23 }, chunk[NS] = { 1, 4, 17, 2, 8 };
    memset(ss, 0, sizeof(seqst) * NS);
    for (int i = 0; i < NS; i++) {
        ss[i].plen = ss[i].n = plen[i];
        ss[i].chunk = chunk[i];
        ss[i].toks[0] = 1;
        for (int t = 1; t < plen[i]; t++) ss[i].toks[t] = (int32_t)(3 + (i * 89 + t * 37) % (vocab - 3));
        ss[i].samp = sampler_defaults();
        if (i % 2 == 1) {   /* odd ones sample with temperature and a repetition penalty */
            ss[i].samp.temperature = 0.9f;
            ss[i].samp.top_k = 40;
            ss[i].samp.top_p = 0.9f;
            ss[i].samp.repeat_penalty = 1.3f;
            ss[i].samp.repeat_last_n = 8;
            ss[i].samp.seed = 1000 + i;
        }
        ss[i].rng = sampler_rng_init(ss[i].samp.seed);
    }
}

/* runs every sequence to NGEN tokens, all in the same steps; returns 0 or -1 */
static int seqs_run(zl_engine *e, seqst *ss) {
    for (int step = 0; step < 200; step++) {
        zl_seq sq[NS];
        int idx[NS], n = 0;
        for (int i = 0; i < NS; i++) {
            seqst *s = &ss[i];
            if (s->gen >= NGEN) continue;
            int nt = s->n - s->fed;
            if (s->fed < s->plen && nt > s->chunk) nt = s->chunk;
            sq[n] = (zl_seq){ .slot = i, .pos = s->fed, .n_tokens = nt, .tokens = s->toks + s->fed,
                              .sample = s->fed + nt == s->n, .samp = &s->samp, .history = s->toks,
                              .n_history = s->fed + nt, .rng = &s->rng };
            idx[n++] = i;
        }
        if (n == 0) return 0;
        int32_t out[NS];
        if (engine_step(e, sq, n, out, NULL) != 0) {
            CHECK(0, "multi step: %s", e->err);
            return -1;
        }
        for (int k = 0; k < n; k++) {
            seqst *s = &ss[idx[k]];
            s->fed += sq[k].n_tokens;
            if (!sq[k].sample) {
                CHECK(out[k] == -1, "prefill chunk gives -1, got %d", out[k]);
                continue;
            }
            s->toks[s->n++] = out[k];
            s->gen++;
        }
    }
    return 0;
}

/* micro: micro-batches per step (the batch of up to 5 is cut into that many) */
static void test_multi(const zl_model *m, int micro) {
    char err[256];
    seqst one[NS], pipe[NS];
    zl_engine_opts o = eopts(NS);
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "whole engine: %s", err);
    if (!e) return;
    seqs_init(one, m->cfg.vocab_size);
    seqs_run(e, one);
    engine_destroy(&e);

    snprintf(s_group, sizeof s_group, "t%d-multi", (int)getpid());
    pid_t f[3];
    for (int i = 1; i < 3; i++) f[i] = spawn_follower(i, 3);
    stage_opts so = opts(0, 3);
    so.micro_batches = micro;
    so.ring_cap = 8;
    e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "leader: %s", err);
    if (e) {
        seqs_init(pipe, m->cfg.vocab_size);
        seqs_run(e, pipe);
        int same = 0;
        for (int i = 0; i < NS; i++) {
            int ok = pipe[i].n == one[i].n && memcmp(pipe[i].toks, one[i].toks, sizeof(int32_t) * one[i].n) == 0 &&
                     pipe[i].rng == one[i].rng;
            CHECK(ok, "seq %d: pipeline tokens/rng differ from one stage", i);
            same += ok;
        }
        CHECK(same == NS, "%d of %d sequences identical through 3 stages (%d micro-batches)", same, NS, micro);
        /* a bad step (slot out of range) fails without hurting the group */
        int32_t t = 1, out;
        zl_seq bad = { .slot = 99, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 };
        CHECK(engine_step(e, &bad, 1, &out, NULL) != 0, "bad slot refused by the leader");
        /* the same slot in both micro-batches, and a bad token in the second one: refused before anything leaves */
        int32_t badtok = m->cfg.vocab_size;
        zl_seq dup[2] = { { .slot = 1, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 },
                          { .slot = 1, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 } };
        int32_t out2[2];
        CHECK(engine_step(e, dup, 2, out2, NULL) != 0 && strstr(e->err, "twice"), "slot in two halves refused: %s",
              e->err);
        dup[1].slot = 2;
        dup[1].tokens = &badtok;
        CHECK(engine_step(e, dup, 2, out2, NULL) != 0, "bad token in the second half refused");
        zl_seq good = { .slot = 0, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 };
        CHECK(engine_step(e, &good, 1, &out, NULL) == 0 && out == s_gold[0], "group still serves after a bad step");
    }
    engine_destroy(&e);
    for (int i = 1; i < 3; i++) {
        int st = wait_for(f[i], 5.0);
        CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "follower %d exits 0 (%d)", i, st);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * lanes: two steps in flight */

/* n stages, slots 0 and 1 on lanes 0 and 1, both decoding greedily from BOS: submit A, submit B, collect A,
 * submit A, collect B, ... Each lane gives the 200 golden ids. Misuse in the middle fails without harm. */
static void test_golden_lanes(const zl_model *m, int n) {
    char err[256];
    snprintf(s_group, sizeof s_group, "t%d-lgold%d", (int)getpid(), n);
    pid_t f[STAGE_MAX];
    for (int i = 1; i < n; i++) f[i] = spawn_follower(i, n);
    zl_engine_opts o = eopts(3);
    stage_opts so = opts(0, n);
    double t0 = now_s();
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "%d stages, lanes: leader: %s", n, err);
    int same[2] = {0, 0}, bad = 0;
    if (e) {
        CHECK(engine_lanes(e) == 2, "%d stages: the leader asks for 2 lanes (%d)", n, engine_lanes(e));
        int32_t tok[2] = {1, 1}, out[2] = {-1, -1};
        zl_seq s[2];
        zl_step st[2];
        for (int l = 0; l < 2; l++) {
            s[l] = (zl_seq){ .slot = l, .pos = 0, .n_tokens = 1, .tokens = &tok[l], .sample = 1 };
            st[l] = lane_step(&s[l], 1, l, &out[l]);
            if (engine_launch(e, &st[l]) != 0) {
                CHECK(0, "%d stages: submit lane %d: %s", n, l, e->err);
                bad = 1;
            }
        }
        for (int i = 0; i < 200 && !bad; i++) {
            if (i == 50) {   /* misuse: nothing may change, the group must keep serving */
                int32_t t = 1, o2;
                zl_seq x = { .slot = 2, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 };
                zl_seq y = { .slot = 1, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 };
                zl_step sx = lane_step(&x, 1, 0, &o2), sy = lane_step(&y, 1, 2, &o2), si = lane_step(&x, 1, 2, &o2);
                CHECK(engine_wait(e, &st[1]) != 0 && strstr(e->err, "oldest"), "wait out of launch order refused: %s",
                      e->err);
                CHECK(engine_launch(e, &sx) != 0 && strstr(e->err, "in flight"), "launch on a busy lane refused: %s",
                      e->err);
                CHECK(engine_launch(e, &sy) != 0 && strstr(e->err, "slot 1"),
                      "a slot in two steps in flight refused: %s", e->err);
                CHECK(engine_step(e, &x, 1, &o2, NULL) != 0 && strstr(e->err, "in flight"),
                      "step() while steps are in flight refused: %s", e->err);
                CHECK(engine_wait(e, &si) != 0, "wait on an idle lane refused");
                float lg[1];
                si.out_logits = lg;
                CHECK(engine_launch(e, &si) != 0 && strstr(e->err, "logits"), "logits asked of the leader refused: %s",
                      e->err);
            }
            for (int l = 0; l < 2 && !bad; l++) {
                if (engine_wait(e, &st[l]) != 0) {
                    CHECK(0, "%d stages: wait lane %d at %d: %s", n, l, i, e->err);
                    bad = 1;
                    break;
                }
                if (out[l] == s_gold[i]) same[l]++;
                tok[l] = out[l];
                s[l].pos = i + 1;
                if (i + 1 < 200 && engine_launch(e, &st[l]) != 0) {
                    CHECK(0, "%d stages: launch lane %d at %d: %s", n, l, i + 1, e->err);
                    bad = 1;
                }
            }
        }
        /* both lanes drained: a synchronous step works again */
        int32_t t = 1, o1 = -1;
        zl_seq z = { .slot = 2, .pos = 0, .n_tokens = 1, .tokens = &t, .sample = 1 };
        CHECK(!bad && engine_step(e, &z, 1, &o1, NULL) == 0 && o1 == s_gold[0], "%d stages: step() after the lanes",
              n);
    }
    CHECK(same[0] == 200 && same[1] == 200, "%d stages, 2 lanes: %d and %d of 200 golden greedy tokens", n, same[0],
          same[1]);
    engine_destroy(&e);
    for (int i = 1; i < n; i++) {
        int st = wait_for(f[i], 5.0);
        CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%d stages, lanes: follower %d exits 0 (%d)", n, i,
              st);
    }
    printf("%d stages, 2 lanes: 2 x 200 golden tokens in %.2f s\n", n, now_s() - t0);
}

/* the mixed set (seqs_init) with sequence i on lane i % 2, the lanes' steps alternating with both in flight */
static int seqs_run_lanes(zl_engine *e, seqst *ss) {
    zl_seq sq[2][NS];
    int32_t outs[2][NS];
    zl_step st[2];
    int idx[2][NS], n[2] = {0, 0}, busy[2] = {0, 0};
    for (int turn = 0; turn < 400; turn++) {
        int l = turn % 2;
        if (busy[l]) {
            const int32_t *out = outs[l];
            if (engine_wait(e, &st[l]) != 0) {
                CHECK(0, "lanes: wait: %s", e->err);
                return -1;
            }
            busy[l] = 0;
            for (int k = 0; k < n[l]; k++) {
                seqst *s = &ss[idx[l][k]];
                s->fed += sq[l][k].n_tokens;
                if (!sq[l][k].sample) {
                    CHECK(out[k] == -1, "prefill chunk gives -1, got %d", out[k]);
                    continue;
                }
                s->toks[s->n++] = out[k];
                s->gen++;
            }
        }
        n[l] = 0;
        for (int i = l; i < NS; i += 2) {
            seqst *s = &ss[i];
            if (s->gen >= NGEN) continue;
            int nt = s->n - s->fed;
            if (s->fed < s->plen && nt > s->chunk) nt = s->chunk;
            sq[l][n[l]] = (zl_seq){ .slot = i, .pos = s->fed, .n_tokens = nt, .tokens = s->toks + s->fed,
                                    .sample = s->fed + nt == s->n, .samp = &s->samp, .history = s->toks,
                                    .n_history = s->fed + nt, .rng = &s->rng };
            idx[l][n[l]++] = i;
        }
        if (n[l] > 0) {
            st[l] = lane_step(sq[l], n[l], l, outs[l]);
            if (engine_launch(e, &st[l]) != 0) {
                CHECK(0, "lanes: launch: %s", e->err);
                return -1;
            }
            busy[l] = 1;
        }
        if (!busy[0] && !busy[1]) return 0;
    }
    CHECK(0, "lanes: sequences did not finish");
    return -1;
}

/* n stages, 2 lanes, micro micro-batches per step: the same tokens and generator states as one whole engine */
static void test_multi_lanes(const zl_model *m, int n, int micro) {
    char err[256];
    seqst one[NS], pipe[NS];
    zl_engine_opts o = eopts(NS);
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "whole engine: %s", err);
    if (!e) return;
    seqs_init(one, m->cfg.vocab_size);
    seqs_run(e, one);
    engine_destroy(&e);
    snprintf(s_group, sizeof s_group, "t%d-lmulti", (int)getpid());
    pid_t f[STAGE_MAX];
    for (int i = 1; i < n; i++) f[i] = spawn_follower(i, n);
    stage_opts so = opts(0, n);
    so.micro_batches = micro;
    e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "leader: %s", err);
    if (e) {
        seqs_init(pipe, m->cfg.vocab_size);
        seqs_run_lanes(e, pipe);
        int same = 0;
        for (int i = 0; i < NS; i++)
            same += pipe[i].n == one[i].n && memcmp(pipe[i].toks, one[i].toks, sizeof(int32_t) * one[i].n) == 0 &&
                    pipe[i].rng == one[i].rng;
        CHECK(same == NS, "%d stages, 2 lanes, up to %d micro-batches: %d of %d sequences identical to one engine", n,
              micro, same, NS);
    }
    engine_destroy(&e);
    for (int i = 1; i < n; i++) {
        int st = wait_for(f[i], 5.0);
        CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "lanes: follower %d exits 0 (%d)", i, st);
    }
}

/* pins the calling thread to the k-th CPU it may run on, when there are 2 or more (the overlap test puts stage 0
 * and stage 1 on different CPUs: a woken stage 1 on the leader's CPU would preempt it right after its publish,
 * and its compute of the step just published would then count as overlap) */
static void s_pin(int k) {
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0 || CPU_COUNT(&all) < 2) return;
    CPU_ZERO(&one);
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all) && seen++ == k) {
            CPU_SET(c, &one);
            break;
        }
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

/* a follower in a thread of this process (same shm protocol): its thread CPU clock is exact, where another
 * process's CPU clock lags by up to a scheduler tick while it runs */
typedef struct {
    const zl_model *m;             /* shared, read only */
    stage_opts so;                 /* its stage */
    volatile sig_atomic_t stop;    /* unused (the leader's shutdown ends it) */
    int rc;                        /* stage_run_follower's result */
    char err[256];                 /* its message */
} t_follower;

static void *follower_thread(void *arg) {
    t_follower *t = arg;
    s_pin(1);
    t->rc = stage_run_follower(t->m, &t->so, &t->stop, t->err, sizeof t->err);
    return NULL;
}

static double cpu_s(clockid_t c) {
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0) return -1;
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* 2 stages, 1 micro-batch per step (so that nothing overlaps inside a step), 2 lanes of 2 sequences x 32-token
 * chunks. For every submit (stage 0 computing its layers) the follower's CPU time is read before and after:
 * overlap = sum over submits of min(follower CPU, leader CPU) during the submit, over the leader's CPU in
 * submits. The follower runs in a thread here, for an exact CPU clock, and the two are pinned to different CPUs.
 * Lanes in flight (submit A, submit B, collect A, submit A, ...): stage 1 computes the other lane's step
 * meanwhile, near 1 (less when other processes take its CPU: up to 3 attempts). The same steps one at a time
 * (submit A, collect A, submit B, ...): stage 1 has nothing to do, near 0. Both runs must give the same tokens.
 * Wall times are printed, not checked (they depend on free cores). */
static void test_overlap(const zl_model *m) {
    char err[256];
    snprintf(s_group, sizeof s_group, "t%d-overlap", (int)getpid());
    t_follower tf;
    memset(&tf, 0, sizeof tf);
    tf.m = m;
    tf.so = opts(1, 2);
    tf.so.device = "cpu-ref"; /* both stages on the f32 reference: its steps are long enough, against the hand-over
                                 * between stages, for the CPU-time ratio to show the overlap (the fast engine's
                                 * steps on stories260K take about 1 ms) */
    pthread_t tid;
    if (pthread_create(&tid, NULL, follower_thread, &tf) != 0) {
        CHECK(0, "overlap: follower thread");
        return;
    }
    cpu_set_t saved;
    int have_saved = sched_getaffinity(0, sizeof saved, &saved) == 0;
    s_pin(0);
    zl_engine_opts o = eopts(4);
    o.device = "cpu-ref";
    stage_opts so = opts(0, 2);
    so.micro_batches = 1;
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "overlap: leader: %s", err);
    clockid_t fc;
    int have_clock = pthread_getcpuclockid(tid, &fc) == 0 && cpu_s(fc) >= 0;
    CHECK(have_clock, "overlap: the follower's CPU clock");
    if (!e || !have_clock) goto out;
    enum { K = 24, CH = 32 };
    int32_t toks[4][CH], res[2][K][4];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < CH; t++) toks[i][t] = (int32_t)(3 + (i * 131 + t * 17) % (m->cfg.vocab_size - 3));
    double ratio[2] = {0, 0}, wall[2] = {0, 0}, cpu0[2] = {0, 0}, cpu1[2] = {0, 0};
    int pass = 0, same = 1;
    /* other processes on the CPUs take stage 1's time away, lowering the lanes' ratio: up to 3 attempts */
    for (int attempt = 0; attempt < 3 && !pass && same; attempt++) {
    for (int mode = 0; mode < 2 && e; mode++) {   /* 0: one step at a time; 1: both lanes in flight */
        zl_seq sq[2][2];
        int32_t out[2][2];
        zl_step st[2];
        double over = 0, lead = 0, f_start = cpu_s(fc), t_start = now_s();
        int bad = 0;
        for (int k = 0; k < K && !bad; k++) {
            for (int l = 0; l < 2 && !bad; l++) {
                /* mode 1 waits for this lane's previous step just before launching its next one */
                if (mode == 1 && k > 0 && engine_wait(e, &st[l]) == 0) {
                    res[l][k - 1][0] = out[l][0];
                    res[l][k - 1][1] = out[l][1];
                } else if (mode == 1 && k > 0) {
                    bad = 1;
                }
                for (int j = 0; j < 2; j++)
                    sq[l][j] = (zl_seq){
                        .slot = 2 * l + j, .pos = (k % 7) * CH, .n_tokens = CH, .tokens = toks[2 * l + j], .sample = 1};
                st[l] = lane_step(sq[l], 2, l, out[l]);
                double l0 = cpu_s(CLOCK_THREAD_CPUTIME_ID), f0 = cpu_s(fc);
                bad |= engine_launch(e, &st[l]) != 0;
                double dl = cpu_s(CLOCK_THREAD_CPUTIME_ID) - l0, df = cpu_s(fc) - f0;
                lead += dl;
                over += df < dl ? df : dl;
                if (mode == 0) {
                    bad |= engine_wait(e, &st[l]) != 0;
                    res[l][k][2] = out[l][0];
                    res[l][k][3] = out[l][1];
                }
            }
        }
        for (int l = 0; l < 2 && mode == 1 && !bad; l++) {
            bad |= engine_wait(e, &st[l]) != 0;
            res[l][K - 1][0] = out[l][0];
            res[l][K - 1][1] = out[l][1];
        }
        if (bad) {
            CHECK(0, "overlap: steps run (%s)", e->err);
            break;
        }
        wall[mode] = now_s() - t_start;
        cpu1[mode] = cpu_s(fc) - f_start;
        cpu0[mode] = lead;
        ratio[mode] = lead > 0 ? over / lead : 0;
    }
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < K; k++) same &= res[l][k][0] == res[l][k][2] && res[l][k][1] == res[l][k][3];
    printf("overlap, 2 stages (attempt %d): stage 1 busy during %.0f%% of stage 0's compute with 2 lanes in flight, "
           "%.0f%% one step at a time; wall %.3f s vs %.3f s (stage CPU %.3f + %.3f s)\n", attempt + 1,
           100 * ratio[1], 100 * ratio[0], wall[1], wall[0], cpu0[1], cpu1[1]);
    pass = ratio[1] >= 0.4 && ratio[1] >= ratio[0] + 0.3;
    }
    CHECK(same, "overlap: lanes in flight give the same tokens as one step at a time");
    CHECK(pass, "overlap: stage 1 works during %.0f%% of stage 0's compute with lanes (>= 40%%), %.0f%% without "
          "(30 points less)", 100 * ratio[1], 100 * ratio[0]);
out:
    engine_destroy(&e);   /* shuts the group down: the follower returns 0 */
    pthread_join(tid, NULL);
    if (have_saved) sched_setaffinity(0, sizeof saved, &saved);
    CHECK(tf.rc == 0, "overlap: follower returns 0 (%s)", tf.rc ? tf.err : "");
}

/* ------------------------------------------------------------------------------------------------------------
 * kill -9 of one stage: the others leave with a non-zero status within a few seconds; then the group restarts */

/* a leader process that decodes forever (positions wrap) */
static pid_t spawn_leader_loop(int n) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char err[256];
    zl_model *m = model_load(s_path, err, sizeof err);
    if (!m) _exit(2);
    zl_engine_opts o = eopts(2);
    stage_opts so = opts(0, n);
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    if (!e) {
        fprintf(stderr, "[leader] %s\n", err);
        _exit(4);
    }
    int32_t tok[2] = { 1, 1 }, out[2];
    for (int i = 0;; i++) {
        zl_seq s[2] = { { .slot = 0, .pos = i % 200, .n_tokens = 1, .tokens = &tok[0], .sample = 1 },
                        { .slot = 1, .pos = i % 100, .n_tokens = 1, .tokens = &tok[1], .sample = 1 } };
        if (engine_step(e, s, 2, out, NULL) != 0) {
            fprintf(stderr, "[leader] %s\n", e->err);
            break;
        }
        tok[0] = out[0];
        tok[1] = out[1];
        *s_progress = (uint64_t)i + 1;
    }
    engine_destroy(&e);
    _exit(5);
}

static void test_kill(int n, int victim) {
    snprintf(s_group, sizeof s_group, "t%d-kill", (int)getpid());   /* the same name every time: restarts */
    pid_t p[STAGE_MAX];
    *s_progress = 0;
    p[0] = spawn_leader_loop(n);
    for (int i = 1; i < n; i++) p[i] = spawn_follower(i, n);
    double t_run = now_s();
    while (*s_progress < 30 && now_s() - t_run < 15) usleep(10000);   /* mid-run: the group has run steps */
    CHECK(*s_progress >= 30, "kill %d/%d: the group ran %llu steps before the kill", victim, n,
          (unsigned long long)*s_progress);
    int alive = 0;
    for (int i = 0; i < n; i++) alive += waitpid(p[i], NULL, WNOHANG) == 0;
    CHECK(alive == n, "kill %d/%d: all %d stages running before the kill (%d)", victim, n, n, alive);
    kill(p[victim], SIGKILL);
    double t0 = now_s();
    waitpid(p[victim], NULL, 0);
    int clean = 0;
    for (int i = 0; i < n; i++) {
        if (i == victim) continue;
        int st = wait_for(p[i], 5.0);
        int ok = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0;
        CHECK(ok, "kill %d/%d: stage %d exits non-zero within 5 s (status %d)", victim, n, i, st);
        clean += ok;
    }
    printf("kill -9 of stage %d of %d: %d others down in %.2f s\n", victim, n, clean, now_s() - t0);
}

int main(void) {
    char err[256], p[1100];
    signal(SIGPIPE, SIG_IGN);
    snprintf(s_path, sizeof s_path, "%s/stories260K/stories260K.gguf", test_fixtures());
    snprintf(p, sizeof p, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    FILE *f = fopen(p, "r");
    int ng = 0, v;
    while (f && ng < 256 && fscanf(f, "%d", &v) == 1) s_gold[ng++] = v;
    if (f) fclose(f);
    CHECK(ng == 200, "golden ids: %d read from %s", ng, p);
    int sp, sn;
    CHECK(stage_parse("1/3", &sp, &sn) == 0 && sp == 1 && sn == 3, "parse 1/3");
    CHECK(stage_parse("3/3", &sp, &sn) != 0 && stage_parse("0/1", &sp, &sn) != 0 &&
          stage_parse("1/3x", &sp, &sn) != 0 && stage_parse("-1/2", &sp, &sn) != 0, "bad stage specs refused");
    CHECK(stage_parse(" 1/3", &sp, &sn) != 0 && stage_parse("1/+3", &sp, &sn) != 0 &&
              stage_parse("1/ 3", &sp, &sn) != 0 && stage_parse("4294967297/4294967299", &sp, &sn) != 0 &&
              stage_parse("/3", &sp, &sn) != 0 && stage_parse("1/", &sp, &sn) != 0 && stage_parse("", &sp, &sn) != 0,
          "stage specs other than I/N in plain digits refused (no sign, space or wrap-around)");
    CHECK(stage_parse("0/2", &sp, &sn) == 0 && sp == 0 && sn == 2, "parse 0/2");
    void *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED, "shared page");
    if (shared == MAP_FAILED) return test_report();
    s_progress = shared;
    test_rings();
    zl_model *m = model_load(s_path, err, sizeof err);
    CHECK(m != NULL, "model: %s", err);
    if (!m || ng != 200) return test_report();
    test_chain(m);
    test_golden(m, 2);
    test_golden(m, 3);
    test_multi(m, 2);
    test_multi(m, 1);
    test_multi(m, 5);
    test_golden_lanes(m, 2);
    test_golden_lanes(m, 3);
    test_multi_lanes(m, 2, 2);
    test_multi_lanes(m, 3, 2);
    test_multi_lanes(m, 3, 1);
    test_overlap(m);
    for (int victim = 0; victim < 3; victim++) test_kill(3, victim);
    test_kill(2, 1);
    /* the group comes back under the name the killed groups used (their stale segment is replaced) */
    snprintf(s_group, sizeof s_group, "t%d-kill", (int)getpid());
    s_dead_ms = 300;   /* and idle stages stay up far longer than that: their monitors heartbeat */
    pid_t f1 = spawn_follower(1, 2);
    zl_engine_opts o = eopts(1);
    stage_opts so = opts(0, 2);
    zl_engine *e = stage_leader_new(m, &o, &so, err, sizeof err);
    CHECK(e != NULL, "restart: %s", err);
    if (e) {
        int32_t tok = 1, out = -1;
        int same = 0;
        for (int i = 0; i < 20; i++) {
            if (i == 10) usleep(1000000);   /* idle for 3 dead_ms */
            zl_seq s = { .slot = 0, .pos = i, .n_tokens = 1, .tokens = &tok, .sample = 1 };
            if (engine_step(e, &s, 1, &out, NULL) != 0 || out != s_gold[i]) break;
            same++;
            tok = out;
        }
        CHECK(same == 20, "restarted group: %d of 20 golden tokens (idle 1 s in the middle)", same);
    }
    engine_destroy(&e);
    int st = wait_for(f1, 5.0);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "restarted follower exits 0 (%d)", st);
    CHECK(!shm_exists(), "no segment left");
    model_destroy(&m);
    return test_report();
}
