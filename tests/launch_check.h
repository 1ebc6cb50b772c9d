/* tests/launch_check.h: steps queued ahead (engine_launch / engine_wait at depth 2, zl_seq.feed) against plain
 * synchronous steps, for any backend that has them: included by tests/test_engine.c (CPU) and
 * cuda/test_engine_gpu.cu (CUDA). C and C++.
 *
 * launch_check_tokens: NS sequences (greedy, seeded sampling, and one with a repetition penalty, which may not
 * be fed) join at different steps; a scheduler like the worker's keeps up to 2 steps in flight, feeds every
 * sequence it can from its previous step on the device, and gives the penalty sequence its token from the host
 * once its step is back. Each sequence must produce exactly the tokens of a synchronous run with host tokens
 * (batch invariance makes every schedule equal).
 * launch_check_refusals: a third launch, a step or wait out of turn, logits asked of a step queued behind another,
 * and feeds the engine cannot serve are refused with an error, and the engine keeps working. */
#ifndef ZLLM_TEST_LAUNCH_CHECK_H
#define ZLLM_TEST_LAUNCH_CHECK_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "sampler.h"
#include "test.h"

enum { LC_NS = 6, LC_PMAX = 24 };

typedef struct {
    int32_t prompt[LC_PMAX];   /* prompt ids */
    int plen;                  /* prompt length */
    int join;                  /* step at which it joins the scheduled run */
    zl_sampling samp;          /* its sampling */
} lc_seq;

static void lc_setup(lc_seq *sq, int vocab) {
    uint64_t r = 99;
    for (int s = 0; s < LC_NS; s++) {
        sq[s].plen = 1 + (s * 5) % 11;
        sq[s].join = (s * 3) % 7;
        for (int i = 0; i < sq[s].plen; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            sq[s].prompt[i] = (int32_t)(1 + (r >> 33) % (uint64_t)(vocab - 1));
        }
        sq[s].samp = sampler_defaults();
        if (s % 3 == 1) {   /* seeded sampling: the generator state must continue on the device */
            sq[s].samp.temperature = 0.8f; sq[s].samp.top_k = 20; sq[s].samp.top_p = 0.9f; sq[s].samp.seed = 7 + s;
        }
        if (s == LC_NS - 1) {   /* the repetition penalty: never fed, its tokens come from the host */
            sq[s].samp.temperature = 0.7f; sq[s].samp.seed = 31;
            sq[s].samp.repeat_penalty = 1.3f; sq[s].samp.repeat_last_n = 16;
        }
    }
}

/* the reference: every sequence from step 0, one synchronous step at a time, host tokens; ref[s][n_gen] */
static int lc_reference(zl_engine *e, const lc_seq *sq, int n_gen, int32_t *ref, int32_t *hist) {
    int pos[LC_NS] = {0}, nh[LC_NS];
    uint64_t rng[LC_NS];
    for (int s = 0; s < LC_NS; s++) {
        rng[s] = sampler_rng_init(sq[s].samp.seed);
        memcpy(hist + (size_t)s * (LC_PMAX + n_gen), sq[s].prompt, (size_t)sq[s].plen * 4);
        nh[s] = sq[s].plen;
    }
    for (int g = 0; g < n_gen; g++) {
        zl_seq q[LC_NS];
        int32_t out[LC_NS];
        memset(q, 0, sizeof q);
        for (int s = 0; s < LC_NS; s++) {
            int32_t *h = hist + (size_t)s * (LC_PMAX + n_gen);
            q[s].slot = s; q[s].pos = pos[s]; q[s].sample = 1; q[s].samp = &sq[s].samp; q[s].rng = &rng[s];
            q[s].n_tokens = g == 0 ? sq[s].plen : 1;
            q[s].tokens = g == 0 ? sq[s].prompt : &h[nh[s] - 1];
            q[s].history = h; q[s].n_history = nh[s];
        }
        if (engine_step(e, q, LC_NS, out, NULL) != 0) { CHECK(0, "launch reference step %d: %s", g, e->err); return -1; }
        for (int s = 0; s < LC_NS; s++) {
            pos[s] += q[s].n_tokens;
            hist[(size_t)s * (LC_PMAX + n_gen) + nh[s]++] = out[s];
            ref[(size_t)s * n_gen + g] = out[s];
        }
    }
    return 0;
}

/* one launched step's entries and outputs, kept until its wait (the engine reads them until then) */
typedef struct {
    zl_seq q[LC_NS];
    int who[LC_NS];
    int n;
    int32_t out[LC_NS];
    zl_step st;
} lc_flight;

/* f's step of its f->n entries, queued on lane 0 */
static void lc_step_of(lc_flight *f) {
    memset(&f->st, 0, sizeof f->st);
    f->st.seqs = f->q;
    f->st.n = f->n;
    f->st.out_tokens = f->out;
}

static void launch_check_tokens(zl_engine *e, const char *name, int vocab, int n_gen) {
    lc_seq sq[LC_NS];
    lc_setup(sq, vocab);
    const size_t hs = LC_PMAX + (size_t)n_gen;
    int32_t *ref = (int32_t *)calloc((size_t)LC_NS * n_gen, 4), *got = (int32_t *)calloc((size_t)LC_NS * n_gen, 4);
    int32_t *hist = (int32_t *)calloc(LC_NS * hs, 4);
    if (!ref || !got || !hist || lc_reference(e, sq, n_gen, ref, hist) != 0) { free(ref); free(got); free(hist); return; }
    /* the scheduled run, in other slots than the reference's (a fresh slot's carry must not matter) */
    int pos[LC_NS] = {0}, launched[LC_NS] = {0}, n_got[LC_NS] = {0}, infl[LC_NS] = {0}, nh[LC_NS];
    int last_sampled[LC_NS] = {0};   /* 1: the sequence's latest launched step sampled it (it may be fed) */
    uint64_t rng[LC_NS];
    for (int s = 0; s < LC_NS; s++) {
        rng[s] = sampler_rng_init(sq[s].samp.seed);
        memcpy(hist + (size_t)s * hs, sq[s].prompt, (size_t)sq[s].plen * 4);
        nh[s] = sq[s].plen;
    }
    lc_flight fl[2];
    int head = 0, count = 0, fed = 0, hosted = 0, ok = 1;
    for (int step = 0; ok && step < 4 * n_gen + 64; step++) {
        lc_flight *f = &fl[(head + count) & 1];
        f->n = 0;
        for (int s = 0; s < LC_NS; s++) {
            if (launched[s] >= n_gen || step < sq[s].join) continue;
            zl_seq *q = &f->q[f->n];
            memset(q, 0, sizeof *q);
            int32_t *h = hist + (size_t)s * hs;
            q->slot = LC_NS + s; q->pos = pos[s]; q->sample = 1; q->samp = &sq[s].samp; q->rng = &rng[s];
            const int pen = sq[s].samp.repeat_penalty != 1.0f;
            if (launched[s] == 0) {   /* its prompt */
                q->n_tokens = sq[s].plen; q->tokens = sq[s].prompt; q->history = h; q->n_history = sq[s].plen;
            } else if (!pen && last_sampled[s]) {   /* fed from its step in flight (or just waited for) */
                q->n_tokens = 1; q->feed = 1;
                fed++;
            } else if (infl[s] == 0) {   /* the host's token, once its step is back */
                q->n_tokens = 1; q->tokens = &h[nh[s] - 1]; q->history = h; q->n_history = nh[s];
                hosted++;
            } else {
                continue;
            }
            pos[s] += q->n_tokens;
            launched[s]++;
            infl[s]++;
            last_sampled[s] = 1;
            f->who[f->n++] = s;
        }
        if (f->n > 0) {
            lc_step_of(f);
            if (engine_launch(e, &f->st) != 0) {
                CHECK(0, "%s: launch at step %d: %s", name, step, e->err);
                ok = 0;
                break;
            }
            count++;
        }
        if (count == 2 || (f->n == 0 && count > 0)) {   /* wait for the oldest */
            lc_flight *w = &fl[head];
            const int32_t *out = w->out;
            if (engine_wait(e, &w->st) != 0) {
                CHECK(0, "%s: wait at step %d: %s", name, step, e->err);
                ok = 0;
                break;
            }
            for (int i = 0; i < w->n; i++) {
                const int s = w->who[i];
                infl[s]--;
                hist[(size_t)s * hs + nh[s]++] = out[i];
                got[(size_t)s * n_gen + n_got[s]++] = out[i];
            }
            head ^= 1;
            count--;
        }
        int all = count == 0;
        for (int s = 0; s < LC_NS; s++) all &= n_got[s] >= n_gen;
        if (all) break;
    }
    while (ok && count > 0) {   /* never left in flight, whatever happened above */
        if (engine_wait(e, &fl[head].st) != 0) {
            CHECK(0, "%s: final wait: %s", name, e->err);
            break;
        }
        head ^= 1;
        count--;
    }
    int same = 0;
    for (int s = 0; s < LC_NS; s++) {
        int eq = n_got[s] == n_gen && !memcmp(ref + (size_t)s * n_gen, got + (size_t)s * n_gen, (size_t)n_gen * 4);
        CHECK(eq, "%s: sequence %d (%s): queued steps gave other tokens than synchronous ones (%d of %d back)",
              name, s, sq[s].samp.temperature > 0 ? "sampled" : "greedy", n_got[s], n_gen);
        same += eq;
    }
    CHECK(fed > 0 && hosted > 0, "%s: the schedule fed %d entries and gave %d host tokens", name, fed, hosted);
    printf("%s: queued steps (depth 2, %d fed entries, %d host tokens): %d of %d sequences equal to synchronous steps\n",
           name, fed, hosted, same, LC_NS);
    free(ref); free(got); free(hist);
}

/* st: a queued step of n entries from q into out */
static zl_step lc_queued(const zl_seq *q, int n, int32_t *out) {
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = q;
    st.n = n;
    st.out_tokens = out;
    return st;
}

static void launch_check_refusals(zl_engine *e, const char *name) {
    int32_t t = 1, out[2];
    zl_seq q;
    memset(&q, 0, sizeof q);
    /* a fresh slot has no sampled step: a feed is refused, nothing runs */
    q.slot = e->n_slots - 1; q.pos = 0; q.n_tokens = 1; q.feed = 1; q.sample = 1;
    CHECK(engine_step(e, &q, 1, out, NULL) != 0, "%s: feed of a slot that never sampled accepted", name);
    zl_step s0 = lc_queued(&q, 1, &out[0]);
    CHECK(engine_wait(e, &s0) != 0, "%s: wait with nothing launched accepted", name);
    q.feed = 0; q.tokens = &t;
    CHECK(engine_launch(e, &s0) == 0, "%s: launch: %s", name, e->err);
    zl_seq f = q;
    f.feed = 1; f.tokens = NULL; f.pos = 1;
    zl_step s1 = lc_queued(&f, 1, &out[1]);
    float lg[1];
    s1.out_logits = lg;
    CHECK(engine_launch(e, &s1) != 0, "%s: logits asked of a step queued behind another accepted", name);
    s1.out_logits = NULL;
    CHECK(engine_launch(e, &s1) == 0, "%s: fed launch: %s", name, e->err);
    zl_seq g = f;
    g.pos = 2;
    int32_t og = -1;
    zl_step s2 = lc_queued(&g, 1, &og);
    CHECK(engine_launch(e, &s2) != 0, "%s: a third launch accepted", name);
    s2.lane = 1;
    CHECK(engine_launch(e, &s2) != 0, "%s: a launch on lane 1 of %d accepted", name, engine_lanes(e));
    CHECK(engine_step(e, &q, 1, &og, NULL) != 0, "%s: a step between launch and wait accepted", name);
    CHECK(engine_wait(e, &s1) != 0, "%s: a wait out of launch order accepted", name);
    CHECK(engine_wait(e, &s0) == 0 && engine_wait(e, &s1) == 0, "%s: waits: %s", name, e->err);
    CHECK(engine_wait(e, &s1) != 0, "%s: a second wait for the same step accepted", name);
    /* the fed step continued from the first one's sample: the same as feeding that id from the host */
    zl_seq h = q;
    int32_t prev = out[0], again = -1;
    h.tokens = &prev; h.pos = 1;
    CHECK(engine_step(e, &h, 1, &again, NULL) == 0 && again == out[1], "%s: fed id %d vs host-fed %d", name, out[1],
          again);
    /* a feed with a repetition penalty would lack its own id in the history: refused */
    zl_sampling sp = sampler_defaults();
    sp.repeat_penalty = 1.2f; sp.repeat_last_n = 8;
    zl_seq p = f;
    p.samp = &sp; p.pos = 2;
    CHECK(engine_step(e, &p, 1, out, NULL) != 0, "%s: a fed entry with a repetition penalty accepted", name);
    /* a prefill chunk that does not sample leaves nothing to feed */
    int32_t two[2] = {1, 2};
    zl_seq c = q;
    c.n_tokens = 2; c.tokens = two; c.sample = 0;
    CHECK(engine_step(e, &c, 1, out, NULL) == 0, "%s: chunk: %s", name, e->err);
    f.pos = 2;
    CHECK(engine_step(e, &f, 1, out, NULL) != 0, "%s: feed after a chunk that did not sample accepted", name);
    CHECK(engine_step(e, &q, 1, out, NULL) == 0, "%s: the engine still runs steps: %s", name, e->err);
}
#endif
