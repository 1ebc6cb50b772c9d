/* tests/test_batcher.c: the worker's continuous batcher over the real CPU engine on stories260K.
 * Oracle: llama2.c's greedy continuation from BOS (golden_greedy_ids.txt). A prompt made of BOS and the first k
 * golden ids must continue with golden ids k, k+1, ... whatever else shares the steps, however the prompt is
 * chunked, and whenever the sequence joins. Also: stop ids, max_tokens, context full, cancel acknowledgements,
 * rejection of bad assignments (ids outside the vocabulary, too long, no free slot), duplicate rids.
 * Lanes: the same golden continuations with 2 and 3 lanes, over the CPU engine driven synchronously and over a
 * test engine of several lanes (t_async: a step runs only at its wait, like a pipeline's) that checks the lane
 * protocol: one step per lane, waits in launch order, no KV slot in two steps in flight, the caller's entries
 * unchanged until the wait. Seeded sampling with a repetition penalty gives the same tokens
 * with 1, 2 and 3 lanes. Cancels and clears while a step is in flight, and random churn of adds and cancels.
 * Steps queued ahead (forced over the CPU engine, whose default is off): the same events as synchronous steps,
 * prompt chunks one a step, churn with steps in flight (test_ahead), and the one-lane tests again queued ahead.
 * The step budget: decodes keep their pace while long prompts arrive, prompts share what is left oldest first, a
 * lone prompt takes the whole step (test_budget). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"
#include "kv_hash.h"
#include "engine.h"
#include "model.h"
#include "test.h"

#define NG 200
static int32_t s_gold[NG];
static uint8_t *s_eog;

/* -1: each batcher as batcher_new makes it; 0 / 1: steps queued ahead forced off / on (zllm-worker --ahead) */
static int s_force_ahead = -1;
static wk_batcher *s_batcher_new(zl_engine *e, const uint8_t *eog, int vocab, char *err, size_t errlen) {
    wk_batcher *b = batcher_new(e, eog, vocab, err, errlen);
    if (b && s_force_ahead >= 0) batcher_set_ahead(b, s_force_ahead);
    return b;
}

/* ------------------------------------------------------------------------------------------------------------
 * t_async: an engine of several lanes over a CPU engine, for the lane tests */

#define TA_LANES 4
typedef struct {
    zl_engine base;                /* must stay first */
    zl_engine *inner;              /* the CPU engine that runs the steps */
    const zl_step *st[TA_LANES];   /* each lane's step in flight */
    const zl_seq *seqs[TA_LANES];  /* its entries (the batcher's) */
    const zl_step *sync_st;        /* a synchronous step run at its launch, until its wait */
    int n[TA_LANES];               /* its entries */
    int busy[TA_LANES];            /* 1 while in flight */
    uint64_t ord[TA_LANES];        /* its submission ordinal */
    uint64_t sum[TA_LANES];        /* checksum of its entries at the submit */
    uint64_t ord_next, ord_collect;/* next ordinal to give, to collect */
    int in_flight, max_in_flight;  /* steps in flight now, most at once */
    int violations;                /* protocol violations seen */
} t_async;

/* everything of the entries an engine may read until the collect */
static uint64_t ta_sum(const zl_seq *q, int n) {
    uint64_t h = 1469598103934665603ull;
#define TA_MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    for (int i = 0; i < n; i++) {
        TA_MIX(q[i].slot); TA_MIX(q[i].pos); TA_MIX(q[i].n_tokens); TA_MIX(q[i].sample); TA_MIX(q[i].n_history);
        TA_MIX((uintptr_t)q[i].rng); TA_MIX(q[i].rng ? *q[i].rng : 0); TA_MIX((uintptr_t)q[i].samp);
        for (int t = 0; t < q[i].n_tokens; t++) TA_MIX(q[i].tokens[t]);
        for (int t = 0; q[i].history && t < q[i].n_history; t++) TA_MIX(q[i].history[t]);
    }
#undef TA_MIX
    return h;
}

static int ta_fail(t_async *a, const char *why, int lane) {
    a->violations++;
    snprintf(a->base.err, sizeof a->base.err, "t_async: %s (lane %d)", why, lane);
    CHECK(0, "%s", a->base.err);
    return -1;
}

/* launch: a synchronous step runs now; any other is only booked on its lane (it runs at its wait) */
static int ta_launch(zl_engine *e, const zl_step *st) {
    t_async *a = (t_async *)e;
    if (a->sync_st) return ta_fail(a, "launch before the synchronous step's wait", -1);
    if (st->sync) {
        if (a->in_flight) return ta_fail(a, "synchronous step with steps in flight", -1);
        if (engine_step(a->inner, st->seqs, st->n, st->out_tokens, st->out_logits) != 0) {
            snprintf(e->err, sizeof e->err, "%s", a->inner->err);
            return -1;
        }
        a->sync_st = st;
        return 0;
    }
    const zl_seq *seqs = st->seqs;
    const int n = st->n, lane = st->lane;
    if (lane < 0 || lane >= e->lanes) return ta_fail(a, "lane out of range", lane);
    if (a->busy[lane]) return ta_fail(a, "lane already in flight", lane);
    for (int k = 0; k < TA_LANES; k++)
        for (int j = 0; a->busy[k] && j < a->n[k]; j++)
            for (int i = 0; i < n; i++)
                if (a->seqs[k][j].slot == seqs[i].slot) return ta_fail(a, "KV slot reused while in flight", lane);
    a->st[lane] = st;
    a->seqs[lane] = seqs;
    a->n[lane] = n;
    a->busy[lane] = 1;
    a->ord[lane] = a->ord_next++;
    a->sum[lane] = ta_sum(seqs, n);
    if (++a->in_flight > a->max_in_flight) a->max_in_flight = a->in_flight;
    return 0;
}

static int ta_wait(zl_engine *e, const zl_step *st) {
    t_async *a = (t_async *)e;
    if (a->sync_st) {
        if (st != a->sync_st) return ta_fail(a, "wait for another step than the synchronous one", -1);
        a->sync_st = NULL;
        return 0;
    }
    const int lane = st->lane;
    if (lane < 0 || lane >= e->lanes || !a->busy[lane] || a->st[lane] != st)
        return ta_fail(a, "wait without a step", lane);
    if (a->ord[lane] != a->ord_collect) return ta_fail(a, "wait out of launch order", lane);
    if (ta_sum(a->seqs[lane], a->n[lane]) != a->sum[lane]) return ta_fail(a, "entries changed in flight", lane);
    a->busy[lane] = 0;
    a->ord_collect++;
    a->in_flight--;
    /* the step runs now, reading the caller's entries as a pipeline's later stages would */
    if (engine_step(a->inner, a->seqs[lane], a->n[lane], st->out_tokens, NULL) != 0) {
        snprintf(e->err, sizeof e->err, "%s", a->inner->err);
        return -1;
    }
    return 0;
}

static void ta_destroy(zl_engine *e) {
    t_async *a = (t_async *)e;
    engine_destroy(&a->inner);
    free(a);
}

static const zl_engine_ops ta_ops = {ta_launch, ta_wait, ta_destroy, NULL};

/* wraps inner (taken over) into an engine of `lanes` lanes; NULL on failure (inner destroyed) */
static zl_engine *ta_new(zl_engine *inner, int lanes) {
    t_async *a = calloc(1, sizeof *a);
    if (!a || !inner) {
        free(a);
        engine_destroy(&inner);
        return NULL;
    }
    a->inner = inner;
    zl_engine *b = &a->base;
    b->ops = &ta_ops;
    b->model = inner->model;
    snprintf(b->device, sizeof b->device, "test-async");
    b->n_slots = inner->n_slots;
    b->n_ctx = inner->n_ctx;
    b->max_batch = inner->max_batch;
    b->max_step_tokens = inner->max_step_tokens;
    b->lanes = lanes;
    b->depth = 1;
    return b;
}

static zl_engine *s_engine(const zl_model *m, int slots, int batch, int ctx, int step_tokens) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = slots;
    o.max_batch = batch;
    o.n_ctx = ctx;
    o.threads = 1;
    o.max_step_tokens = step_tokens;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new: %s", err);
    return e;
}

/* the request "BOS + gold[0..k)", greedy, ignoring EOS */
static wk_request s_req(uint64_t rid, int32_t *buf, int k, int max_tokens) {
    buf[0] = 1;
    memcpy(buf + 1, s_gold, (size_t)k * sizeof(int32_t));
    wk_request r;
    memset(&r, 0, sizeof r);
    r.rid = rid;
    r.tokens = buf;
    r.n_tokens = k + 1;
    r.max_tokens = max_tokens;
    r.samp = sampler_defaults();
    r.ignore_eos = 1;
    return r;
}

typedef struct {
    int k;            /* golden prefix length of the prompt */
    int max_tokens;   /* limit */
    int join_step;    /* step at which it is added */
    int got[NG];      /* tokens received */
    int n_got;        /* count */
    int fin;          /* final code, 0 while running */
    int events_after_fin; /* must stay 0 */
} s_case;

/* async: 1 drives a t_async engine of `lanes` lanes, 0 the CPU engine (synchronously, whatever the lanes) */
static void test_mixed(const zl_model *m, int async, int lanes) {
    /* 4 slots, batch 3, 7-token steps: prompts are chunked, decodes share steps with prefills, sequences wait
     * for free slots and join at different steps */
    zl_engine *e = s_engine(m, 4, 3, 128, 7);
    if (!e) return;
    if (async && !(e = ta_new(e, lanes))) return;
    char err[256];
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b != NULL, "batcher_new: %s", err);
    if (!b) goto out;
    CHECK(batcher_lanes(b) == (async ? lanes : 1), "default lanes: the engine's (%d)", batcher_lanes(b));
    CHECK(batcher_set_lanes(b, lanes) == lanes, "%d lanes set", lanes);
    enum { NC = 9 };
    s_case c[NC] = {
        {.k = 0, .max_tokens = 20}, {.k = 17, .max_tokens = 5, .join_step = 0}, {.k = 40, .max_tokens = 30},
        {.k = 3, .max_tokens = 1, .join_step = 2}, {.k = 60, .max_tokens = 12, .join_step = 3},
        {.k = 9, .max_tokens = 25, .join_step = 5}, {.k = 90, .max_tokens = 8, .join_step = 9},
        {.k = 1, .max_tokens = 40, .join_step = 9}, {.k = 30, .max_tokens = 3, .join_step = 20},
    };
    int added[NC] = {0};
    int cap = batcher_event_cap(b);
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    int32_t buf[NG + 1];
    int done = 0;
    /* a join step counts full turns: one batcher_step per lane */
    for (int call = 0; call < 500 * lanes && done < NC; call++) {
        int step = call / lanes;
        for (int i = 0; i < NC; i++) {
            if (added[i] || c[i].join_step > step || batcher_free_slots(b) == 0) continue;
            wk_request r = s_req(100 + i, buf, c[i].k, c[i].max_tokens);
            int rc = batcher_add(b, &r, err, sizeof err);
            CHECK(rc == 0, "add %d: %s", i, err);
            added[i] = 1;
        }
        int n_ev = 0;
        int rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
        CHECK(rc >= 0, "step: %s", err);
        if (rc < 0) break;
        for (int j = 0; j < n_ev; j++) {
            int i = (int)ev[j].rid - 100;
            CHECK(i >= 0 && i < NC, "event for unknown rid %llu", (unsigned long long)ev[j].rid);
            if (i < 0 || i >= NC) continue;
            if (c[i].fin) c[i].events_after_fin++;
            if (ev[j].tok >= 0 && c[i].n_got < NG) c[i].got[c[i].n_got++] = ev[j].tok;
            if (ev[j].fin) {
                c[i].fin = ev[j].fin;
                done++;
            }
        }
    }
    CHECK(done == NC, "%d lanes (%s): %d of %d sequences finished", lanes, async ? "async" : "sync", done, NC);
    for (int i = 0; i < NC; i++) {
        CHECK(c[i].fin == WK_FIN_LENGTH, "case %d: fin %d, want length", i, c[i].fin);
        CHECK(c[i].n_got == c[i].max_tokens, "case %d: %d tokens, want %d", i, c[i].n_got, c[i].max_tokens);
        CHECK(c[i].events_after_fin == 0, "case %d: events after its final", i);
        int same = 1;
        for (int t = 0; t < c[i].n_got && c[i].k + t < NG; t++)
            if (c[i].got[t] != s_gold[c[i].k + t]) {
                CHECK(0, "case %d (k=%d): token %d is %d, golden %d", i, c[i].k, t, c[i].got[t], s_gold[c[i].k + t]);
                same = 0;
                break;
            }
        CHECK(same, "%d lanes (%s): case %d matches the golden continuation", lanes, async ? "async" : "sync", i);
    }
    CHECK(batcher_running(b) == 0 && batcher_free_slots(b) == 4, "all slots free at the end");
    CHECK(batcher_in_flight(b) == 0, "nothing in flight at the end");
    if (async) {
        t_async *a = (t_async *)e;
        CHECK(a->max_in_flight == lanes, "%d lanes: %d steps were in flight at once", lanes, a->max_in_flight);
        CHECK(a->violations == 0, "%d lanes: no protocol violation", lanes);
    }
    free(ev);
out:
    batcher_destroy(&b);
    batcher_destroy(&b);   /* idempotent */
    engine_destroy(&e);
}

/* runs b until rid ends; returns its finish code and writes the tokens */
static int s_run_one(wk_batcher *b, uint64_t rid, int *got, int *n_got) {
    int cap = batcher_event_cap(b), fin = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    char err[256];
    *n_got = 0;
    for (int step = 0; step < 300 && !fin; step++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        for (int j = 0; j < n_ev; j++)
            if (ev[j].rid == rid) {
                if (ev[j].tok >= 0) got[(*n_got)++] = ev[j].tok;
                fin = ev[j].fin;
            }
    }
    /* with steps queued ahead, the step behind the final one is still in flight (its result for rid dropped):
     * collected here, so that another batcher may use the engine, and it must say nothing more of rid */
    for (int k = 0; k < 3 && batcher_in_flight(b) > 0; k++) {
        int n_ev = 0;
        CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) >= 0, "drain: %s", err);
        for (int j = 0; j < n_ev; j++) CHECK(ev[j].rid != rid, "rid %llu: an event after its final one",
                                             (unsigned long long)rid);
    }
    CHECK(batcher_in_flight(b) == 0, "nothing in flight after the drain");
    free(ev);
    return fin;
}

static void test_stops(const zl_model *m) {
    zl_engine *e = s_engine(m, 2, 2, 64, 64);
    if (!e) return;
    char err[256];
    int got[NG], n_got = 0;
    int32_t buf[NG + 1];
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    if (!b) goto out;
    /* a stop id: the first golden id after position 10 that did not occur in 10..i */
    int k = 10, at = -1;
    for (int i = k + 2; i < 40 && at < 0; i++) {
        int seen = 0;
        for (int j = k; j < i; j++) seen |= s_gold[j] == s_gold[i];
        if (!seen) at = i;
    }
    wk_request r = s_req(7, buf, k, 30);
    r.stop_ids = &s_gold[at];
    r.n_stop_ids = 1;
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add: %s", err);
    int fin = s_run_one(b, 7, got, &n_got);
    CHECK(fin == WK_FIN_STOP, "stop id: fin %d", fin);
    CHECK(n_got == at - k + 1 && got[n_got - 1] == s_gold[at], "stop id: %d tokens, the stop id included", n_got);
    /* end-of-generation ids (the bitmap is copied at creation) stop unless ignore_eos */
    s_eog[s_gold[k + 2]] = 1;
    wk_batcher *b2 = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    s_eog[s_gold[k + 2]] = 0;
    CHECK(b2 != NULL, "batcher_new: %s", err);
    if (b2) {
        r = s_req(8, buf, k, 30);
        r.ignore_eos = 0;
        CHECK(batcher_add(b2, &r, err, sizeof err) == 0, "add: %s", err);
        fin = s_run_one(b2, 8, got, &n_got);
        CHECK(fin == WK_FIN_STOP && n_got <= 3, "eog: fin %d after %d tokens", fin, n_got);
        r = s_req(10, buf, k, 5);
        CHECK(batcher_add(b2, &r, err, sizeof err) == 0, "add: %s", err);
        fin = s_run_one(b2, 10, got, &n_got);
        CHECK(fin == WK_FIN_LENGTH && n_got == 5, "ignore_eos: fin %d after %d tokens", fin, n_got);
        batcher_destroy(&b2);
    }
    /* context full: 64-token slot, prompt of 60 */
    r = s_req(9, buf, 59, 100);
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add: %s", err);
    fin = s_run_one(b, 9, got, &n_got);
    CHECK(fin == WK_FIN_LENGTH && n_got == 4, "context full: fin %d after %d tokens", fin, n_got);
    CHECK(n_got == 4 && memcmp(got, &s_gold[59], 4 * sizeof(int)) == 0, "context full: golden tokens");
out:
    batcher_destroy(&b);
    engine_destroy(&e);
}

static void test_rejects_and_cancel(const zl_model *m) {
    zl_engine *e = s_engine(m, 2, 2, 64, 64);
    if (!e) return;
    char err[256];
    int32_t buf[NG + 1], buf2[NG + 1];
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    if (!b) goto out;
    /* the call-by-call expectations below are those of synchronous steps (test_ahead has the queued ones) */
    CHECK(batcher_ahead(b) == (s_force_ahead == 1) && batcher_set_ahead(b, 0) == 0 && !batcher_ahead(b),
          "steps queued ahead: off (the CPU engine's default)");
    int cap = batcher_event_cap(b), n_ev = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    wk_request r = s_req(1, buf, 5, 50);
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add 1: %s", err);
    CHECK(batcher_add(b, &r, err, sizeof err) == 1, "duplicate rid is ignored");
    wk_request bad = s_req(2, buf2, 5, 50);
    buf2[3] = m->cfg.vocab_size;
    CHECK(batcher_add(b, &bad, err, sizeof err) == -1, "id outside the vocabulary rejected");
    bad = s_req(3, buf2, 70, 5);
    CHECK(batcher_add(b, &bad, err, sizeof err) == -1, "prompt longer than the context rejected");
    bad = s_req(4, buf2, 5, 5);
    bad.samp.temperature = -1;
    CHECK(batcher_add(b, &bad, err, sizeof err) == -1, "negative temperature rejected");
    wk_request r5 = s_req(5, buf2, 2, 50);
    CHECK(batcher_add(b, &r5, err, sizeof err) == 0, "add 5: %s", err);
    wk_request r6 = s_req(6, buf2, 2, 50);
    CHECK(batcher_add(b, &r6, err, sizeof err) == -1, "no free slot: rejected");
    CHECK(batcher_free_slots(b) == 0, "both slots taken");
    int rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    CHECK(rc == 1, "step ran");
    int seen[8] = {0};
    for (int j = 0; j < n_ev; j++)
        if (ev[j].rid < 8) {
            seen[ev[j].rid]++;
            if (ev[j].rid >= 2 && ev[j].rid != 5) CHECK(ev[j].fin == WK_FIN_ERROR && ev[j].tok == -1, "rid %d fin 4", (int)ev[j].rid);
        }
    CHECK(seen[1] == 1 && seen[2] == 1 && seen[3] == 1 && seen[4] == 1 && seen[5] == 1 && seen[6] == 1,
          "one event per rid in the step's message");
    CHECK(batcher_cancel(b, 1) == 1, "cancel of a running rid");
    CHECK(batcher_cancel(b, 1) == 0 && batcher_cancel(b, 999) == 0, "cancel of unknown rids ignored");
    CHECK(batcher_free_slots(b) == 1, "cancel frees the slot at once");
    rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    int acked = 0, rid1 = 0;
    for (int j = 0; j < n_ev; j++)
        if (ev[j].rid == 1) {
            rid1++;
            acked = ev[j].fin == WK_FIN_CANCELLED;
        }
    CHECK(rid1 == 1 && acked, "cancel acknowledged with fin 3 in the next step");
    batcher_clear(b);
    CHECK(batcher_running(b) == 0, "clear drops everything");
    /* prefill cap: a 10-token prompt in chunks of 3 (3, 3, 3, then the last token samples): 4 steps */
    batcher_set_prefill_cap(b, 3);
    wk_request r7 = s_req(7, buf, 9, 2);
    CHECK(batcher_add(b, &r7, err, sizeof err) == 0, "add 7: %s", err);
    int first = -1;
    for (int step = 0; step < 10 && first < 0; step++) {
        batcher_step(b, ev, cap, &n_ev, err, sizeof err);
        CHECK(batcher_last_step_tokens(b) <= 3, "step %d: %d tokens under a cap of 3", step, batcher_last_step_tokens(b));
        CHECK(batcher_last_prefill_tokens(b) == (step < 3 ? 3 : 0), "step %d: %d prompt tokens", step,
              batcher_last_prefill_tokens(b));
        for (int j = 0; j < n_ev; j++)
            if (ev[j].rid == 7 && ev[j].tok >= 0) first = step;
    }
    CHECK(first == 3, "first token after 4 capped steps (got step %d)", first);
    batcher_clear(b);
    rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    CHECK(rc == 0 && n_ev == 0, "nothing to run after clear");
    free(ev);
out:
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* ------------------------------------------------------------------------------------------------------------
 * the step budget (batcher_set_step_budget): 4 sequences decode while two long prompts arrive. With a budget of
 * 12 every step keeps all 4 decodes and at most max(12 - 4, 3) = 8 prompt tokens (with a budget of 2: the floor of
 * 1), the older prompt first, and every decoding sequence gets a token in every step; without it a step takes a
 * chunk of up to 60. A prompt alone on an
 * idle batcher takes the engine's whole step either way. All tokens are the golden continuations (chunking and
 * batching change none). ahead: steps queued ahead (forced over the CPU engine). */
static void test_budget(const zl_model *m, int ahead, int budget) {
    enum { ND = 4, NB = ND + 2, DEC_MAX = 60 };
    zl_engine *e = s_engine(m, NB, NB, 256, 64);
    if (!e) return;
    char err[256];
    static int32_t bufs[NB][NG + 1];
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_ahead(b, ahead) == ahead, "budget %d: batcher, steps queued ahead %d", budget, ahead);
    if (!b) {
        engine_destroy(&e);
        return;
    }
    batcher_set_step_budget(b, budget);
    CHECK(batcher_step_budget(b) == budget, "budget %d set", budget);
    const int least = budget / 4 > 1 ? budget / 4 : 1, share = budget - ND > least ? budget - ND : least;
    int cap = batcher_event_cap(b), n_ev = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    int32_t got[NB][NG];
    int n_got[NB] = {0}, fin[NB] = {0}, first_at[NB], most_prefill = 0, stalls = 0, long_steps = 0, done = 0;
    for (int i = 0; i < NB; i++) first_at[i] = -1;
    /* a prompt alone: 101 tokens, the first step takes 64 of them whatever the budget */
    wk_request lone = s_req(200, bufs[0], 100, 2);
    CHECK(batcher_add(b, &lone, err, sizeof err) == 0, "add the lone prompt: %s", err);
    int lone_first = -1;
    for (int step = 0; step < 20 && !fin[0]; step++) {
        CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) >= 0, "step: %s", err);
        if (step == 0)
            CHECK(batcher_last_prefill_tokens(b) == 64,
                  "budget %d, ahead %d: a lone prompt's first step "
                  "takes the engine's 64 tokens (took %d)",
                  budget, ahead, batcher_last_prefill_tokens(b));
        for (int j = 0; j < n_ev; j++)
            if (ev[j].rid == 200) {
                if (ev[j].tok >= 0 && lone_first < 0) lone_first = ev[j].tok;
                fin[0] = ev[j].fin;
            }
    }
    for (int k = 0; k < 3 && batcher_in_flight(b) > 0; k++) batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    CHECK(fin[0] == WK_FIN_LENGTH && lone_first == s_gold[100], "the lone prompt's golden continuation");
    fin[0] = 0;
    /* 4 decoding sequences, then two long prompts (121 and 91 tokens) arriving together, the 121 admitted first */
    for (int i = 0; i < ND; i++) {
        wk_request r = s_req(300 + i, bufs[i], i, DEC_MAX);
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add decoder %d: %s", i, err);
    }
    for (int call = 0; call < 400 && done < NB; call++) {
        if (call == 4) {
            wk_request r = s_req(300 + ND, bufs[ND], 120, 20), r2 = s_req(300 + ND + 1, bufs[ND + 1], 90, 20);
            CHECK(batcher_add(b, &r, err, sizeof err) == 0 && batcher_add(b, &r2, err, sizeof err) == 0,
                  "add the long prompts: %s", err);
        }
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        int dec_tokens = 0;
        for (int j = 0; j < n_ev; j++) {
            const int k = (int)ev[j].rid - 300;
            if (k < 0 || k >= NB) continue;
            if (ev[j].tok >= 0 && n_got[k] < NG) got[k][n_got[k]++] = ev[j].tok;
            if (ev[j].tok >= 0 && k < ND) dec_tokens++;
            if (ev[j].tok >= 0 && first_at[k] < 0) first_at[k] = call;
            if (ev[j].fin && !fin[k]) {
                fin[k] = ev[j].fin;
                done++;
            }
        }
        /* the steps collected while a long prompt prefills and the 4 decoders run */
        const int pre = batcher_last_prefill_tokens(b);
        if (call > 6 && first_at[ND + 1] < 0 && n_got[0] < DEC_MAX - 2) {
            long_steps++;
            if (pre > most_prefill) most_prefill = pre;
            if (dec_tokens != ND) stalls++;
        }
    }
    CHECK(done == NB, "budget %d, ahead %d: %d of %d sequences ended", budget, ahead, done, NB);
    for (int k = 0; k < NB; k++) {
        const int k0 = k < ND ? k : k == ND ? 120 : 90, want = k < ND ? DEC_MAX : 20;
        int same = fin[k] == WK_FIN_LENGTH && n_got[k] == want;
        for (int t = 0; same && t < want; t++) same = got[k][t] == s_gold[k0 + t];
        CHECK(same, "budget %d, ahead %d: sequence %d gives its golden continuation", budget, ahead, k);
    }
    CHECK(long_steps >= (budget ? 8 : 1), "budget %d, ahead %d: %d steps with decodes and long prompts", budget, ahead,
          long_steps);
    CHECK(stalls == 0, "budget %d, ahead %d: every decoder got a token in every step (%d steps without)", budget, ahead,
          stalls);
    if (budget > 0) {
        CHECK(most_prefill == share,
              "budget %d, ahead %d: prompt tokens per step beside 4 decodes at most %d (most %d)", budget, ahead, share,
              most_prefill);
        CHECK(first_at[ND] >= 0 && first_at[ND] < first_at[ND + 1],
              "budget %d, ahead %d: the older long prompt gets its first token first (%d, %d)", budget, ahead,
              first_at[ND], first_at[ND + 1]);
    } else {
        CHECK(most_prefill >= 32, "no budget: a step takes a prompt chunk of more than 32 (most %d)", most_prefill);
    }
    free(ev);
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* the step budget with steps queued ahead when the decoding sequences are not in the step being built (a repetition
 * penalty keeps them from being fed: they wait for their token): the budget still holds, so a long prompt arriving
 * does not take the engine's whole step while they wait */
static void test_budget_unfed(const zl_model *m) {
    enum { ND = 2, BUDGET = 12 };
    zl_engine *e = s_engine(m, ND + 1, ND + 1, 256, 64);
    if (!e) return;
    char err[256];
    static int32_t bufs[ND + 1][NG + 1];
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_ahead(b, 1) == 1, "unfed: batcher with steps queued ahead");
    if (!b) {
        engine_destroy(&e);
        return;
    }
    batcher_set_step_budget(b, BUDGET);
    int cap = batcher_event_cap(b), n_ev = 0, fin[ND + 1] = {0}, done = 0, most = 0, first = -1;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int i = 0; i < ND; i++) {
        wk_request r = s_req(400 + i, bufs[i], i, 60);
        r.samp.repeat_penalty = 1.1f;
        r.samp.repeat_last_n = 16;
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "unfed: add decoder %d: %s", i, err);
    }
    for (int call = 0; call < 400 && done < ND + 1; call++) {
        if (call == 4) {
            wk_request r = s_req(400 + ND, bufs[ND], 120, 4);
            CHECK(batcher_add(b, &r, err, sizeof err) == 0, "unfed: add the long prompt: %s", err);
        }
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "unfed: step: %s", err);
            break;
        }
        if (call >= 4 && first < 0 && batcher_last_prefill_tokens(b) > most) most = batcher_last_prefill_tokens(b);
        for (int j = 0; j < n_ev; j++) {
            const int k = (int)ev[j].rid - 400;
            if (k < 0 || k > ND) continue;
            if (k == ND && ev[j].tok >= 0 && first < 0) first = ev[j].tok;
            if (ev[j].fin && !fin[k]) {
                fin[k] = ev[j].fin;
                done++;
            }
        }
    }
    CHECK(done == ND + 1, "unfed: %d of %d sequences ended", done, ND + 1);
    CHECK(first == s_gold[120], "unfed: the long prompt's golden first token");
    CHECK(most >= 1 && most <= BUDGET,
          "unfed: prompt tokens per step at most the budget of %d while sequences decode "
          "outside the step (most %d)",
          BUDGET, most);
    free(ev);
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* the step budget and priorities: 4 sequences decode at priority 0 while a long prompt arrives. At priority 0 it
 * is held to what the decodes leave of the budget of 12 (8 tokens a step); at priority 5, higher than every
 * decoding sequence, it takes the step as a prompt alone would (the engine's 64 tokens less the 4 decodes) while
 * the decoders still get a token in every step, and its tokens are the golden ones. ahead: steps queued ahead. */
static void test_budget_priority(const zl_model *m, int ahead, int prio) {
    enum { ND = 4, BUDGET = 12 };
    zl_engine *e = s_engine(m, ND + 1, ND + 1, 256, 64);
    if (!e) return;
    char err[256];
    static int32_t bufs[ND + 1][NG + 1];
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_ahead(b, ahead) == ahead, "priority %d: batcher, ahead %d", prio, ahead);
    if (!b) {
        engine_destroy(&e);
        return;
    }
    batcher_set_step_budget(b, BUDGET);
    int cap = batcher_event_cap(b), n_ev = 0, fin[ND + 1] = {0}, done = 0, most = 0, stalls = 0, n_long = 0;
    int32_t got[NG];
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int i = 0; i < ND; i++) {
        wk_request r = s_req(500 + i, bufs[i], i, 60);
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "priority: add decoder %d: %s", i, err);
    }
    for (int call = 0; call < 400 && done < ND + 1; call++) {
        if (call == 4) {
            wk_request r = s_req(500 + ND, bufs[ND], 120, 8);
            r.priority = prio;
            CHECK(batcher_add(b, &r, err, sizeof err) == 0, "priority: add the long prompt: %s", err);
        }
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "priority: step: %s", err);
            break;
        }
        int dec = 0;
        for (int j = 0; j < n_ev; j++) {
            const int k = (int)ev[j].rid - 500;
            if (k < 0 || k > ND) continue;
            if (k == ND && ev[j].tok >= 0 && n_long < NG) got[n_long++] = ev[j].tok;
            if (k < ND && ev[j].tok >= 0) dec++;
            if (ev[j].fin && !fin[k]) {
                fin[k] = ev[j].fin;
                done++;
            }
        }
        if (call > 4 && n_long == 0) {
            if (batcher_last_prefill_tokens(b) > most) most = batcher_last_prefill_tokens(b);
            if (call > 6 && dec != ND) stalls++;
        }
    }
    CHECK(done == ND + 1, "priority %d, ahead %d: %d of %d sequences ended", prio, ahead, done, ND + 1);
    int same = n_long == 8;
    for (int t = 0; same && t < 8; t++) same = got[t] == s_gold[120 + t];
    CHECK(same, "priority %d, ahead %d: the long prompt's golden continuation", prio, ahead);
    const int want = prio > 0 ? 64 - ND : BUDGET - ND;
    CHECK(most == want,
          "priority %d, ahead %d: prompt tokens per step beside 4 decodes at priority 0: most %d, want %d", prio, ahead,
          most, want);
    CHECK(stalls == 0, "priority %d, ahead %d: every decoder got a token in every step (%d steps without)", prio, ahead,
          stalls);
    free(ev);
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* ------------------------------------------------------------------------------------------------------------
 * lanes */

/* steps b until every rid in rids[n] ended (or calls run out); per rid: tokens got[k][..], n_got[k], fin[k],
 * events after the final in *after. Returns the number of rids ended. */
#define NL 8
static int s_drive(wk_batcher *b, const uint64_t *rids, int n, int32_t got[][NG], int *n_got, int *fin, int *after) {
    int cap = batcher_event_cap(b), done = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    char err[256];
    for (int call = 0; call < 3000 && done < n; call++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        for (int j = 0; j < n_ev; j++)
            for (int k = 0; k < n; k++) {
                if (ev[j].rid != rids[k]) continue;
                if (fin[k]) (*after)++;
                if (ev[j].tok >= 0 && n_got[k] < NG) got[k][n_got[k]++] = ev[j].tok;
                if (ev[j].fin && !fin[k]) {
                    fin[k] = ev[j].fin;
                    done++;
                }
            }
    }
    free(ev);
    return done;
}

/* seeded sampling with a repetition penalty, greedy beside it, chunked prompts, more sequences than slots:
 * the same tokens whatever the lanes (batch invariance, per-sequence order) */
static void test_sampled(const zl_model *m) {
    static const int cfg[][2] = { {0, 1}, {0, 2}, {1, 2}, {1, 3} };   /* {async, lanes} */
    int32_t ref[NL][NG], got[NL][NG];
    int ref_n[NL];
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        zl_engine *e = s_engine(m, 4, 3, 128, 7);
        if (e && cfg[c][0]) e = ta_new(e, cfg[c][1]);
        if (!e) return;
        char err[256];
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        CHECK(b && batcher_set_lanes(b, cfg[c][1]) == cfg[c][1], "batcher with %d lanes", cfg[c][1]);
        if (!b) {
            engine_destroy(&e);
            return;
        }
        int n_got[NL] = {0}, fin[NL] = {0}, after = 0, added = 0;
        int32_t buf[NG + 1];
        int cap = batcher_event_cap(b);
        wk_event *ev = calloc((size_t)cap, sizeof *ev);
        /* admit as slots free up, stepping in between (events handled as in s_drive) */
        for (int call = 0; call < 4000; call++) {
            while (added < NL && batcher_free_slots(b) > 0) {
                int i = added;
                wk_request r = s_req(500 + i, buf, (i * 7) % 30, 12 + i);
                if (i % 2) {
                    r.samp.temperature = 0.9f;
                    r.samp.top_k = 40;
                    r.samp.top_p = 0.9f;
                    r.samp.repeat_penalty = 1.3f;
                    r.samp.repeat_last_n = 8;
                    r.samp.seed = 77 + i;
                }
                CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add %d: %s", i, err);
                added++;
            }
            int n_ev = 0, rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
            CHECK(rc >= 0, "step: %s", err);
            if (rc < 0) break;
            for (int j = 0; j < n_ev; j++) {
                int k = (int)ev[j].rid - 500;
                if (k < 0 || k >= NL) continue;
                if (fin[k]) after++;
                if (ev[j].tok >= 0 && n_got[k] < NG) got[k][n_got[k]++] = ev[j].tok;
                if (ev[j].fin) fin[k] = ev[j].fin;
            }
            if (rc == 0 && added == NL) break;
        }
        free(ev);
        int same = 1;
        for (int k = 0; k < NL; k++) {
            CHECK(fin[k] == WK_FIN_LENGTH && n_got[k] == 12 + k, "cfg %zu: seq %d: fin %d, %d tokens", c, k, fin[k],
                  n_got[k]);
            if (c == 0) {
                memcpy(ref[k], got[k], sizeof ref[k]);
                ref_n[k] = n_got[k];
            } else {
                same &= ref_n[k] == n_got[k] && memcmp(ref[k], got[k], (size_t)n_got[k] * sizeof(int32_t)) == 0;
            }
        }
        CHECK(after == 0, "cfg %zu: no events after a final", c);
        if (c > 0)
            CHECK(same, "%d lanes (%s): the same tokens as 1 lane (seeded sampling, repetition penalty)", cfg[c][1],
                  cfg[c][0] ? "async" : "sync");
        if (cfg[c][0]) CHECK(((t_async *)e)->violations == 0, "cfg %zu: no protocol violation", c);
        batcher_destroy(&b);
        engine_destroy(&e);
    }
}

/* a cancel while the sequence's step is in flight: acknowledged at once, the slot counts as free for the broker,
 * a new sequence admitted into it waits until the step is collected (t_async checks that the KV slot is never
 * in two steps in flight) and then runs; the cancelled step's token is dropped. Then the same for a clear. */
static void test_lanes_cancel(const zl_model *m) {
    zl_engine *e = ta_new(s_engine(m, 2, 2, 64, 64), 2);
    if (!e) return;
    t_async *a = (t_async *)e;
    char err[256];
    int32_t buf[4][NG + 1];
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_lanes(b) == 2, "2 lanes from the engine");
    if (!b) goto out;
    CHECK(batcher_set_lanes(b, 5) == 2, "no more lanes than the engine keeps in flight");
    int cap = batcher_event_cap(b), n_ev = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    wk_request r1 = s_req(1, buf[0], 5, 50), r2 = s_req(2, buf[1], 8, 50);
    CHECK(batcher_add(b, &r1, err, sizeof err) == 0 && batcher_add(b, &r2, err, sizeof err) == 0, "add 1, 2");
    CHECK(batcher_set_lanes(b, 1) == -1, "lanes do not change while sequences run");
    CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) == 1 && n_ev == 0 && batcher_in_flight(b) == 1,
          "first turn: lane 0 submitted, nothing collected");
    CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) == 1 && n_ev == 0 && batcher_in_flight(b) == 2,
          "second turn: lane 1 submitted");
    CHECK(batcher_cancel(b, 1) == 1, "cancel of rid 1 in flight");
    CHECK(batcher_running(b) == 1 && batcher_free_slots(b) == 1, "its slot counts as free at once");
    wk_request r3 = s_req(3, buf[2], 3, 10), r4 = s_req(4, buf[3], 3, 10);
    CHECK(batcher_add(b, &r3, err, sizeof err) == 0, "rid 3 admitted into the slot still in flight: %s", err);
    CHECK(batcher_add(b, &r4, err, sizeof err) == -1, "rid 4: no free slot");
    CHECK(batcher_free_slots(b) == 0 && batcher_running(b) == 2, "2 running");
    int rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    int ack1 = 0, ack4 = 0, other1 = 0;
    for (int j = 0; j < n_ev; j++) {
        if (ev[j].rid == 1 && ev[j].fin == WK_FIN_CANCELLED && ev[j].tok == -1) ack1++;
        else if (ev[j].rid == 1) other1++;
        if (ev[j].rid == 4 && ev[j].fin == WK_FIN_ERROR) ack4++;
    }
    CHECK(rc == 1 && ack1 == 1 && other1 == 0 && ack4 == 1, "lane 0 collected: rid 1 acknowledged, its token dropped");
    CHECK(a->in_flight == 2, "lane 0 submitted again (rid 3 in the freed slot)");
    uint64_t rids[2] = {2, 3};
    int32_t got[2][NG];
    int n_got[2] = {0}, fin[2] = {0}, after = 0;
    CHECK(s_drive(b, rids, 2, got, n_got, fin, &after) == 2, "rids 2 and 3 end");
    CHECK(fin[0] == WK_FIN_LENGTH && n_got[0] == 50 && memcmp(got[0], &s_gold[8], 50 * sizeof(int32_t)) == 0,
          "rid 2 (beside the cancel): 50 golden tokens");
    CHECK(fin[1] == WK_FIN_LENGTH && n_got[1] == 10 && memcmp(got[1], &s_gold[3], 10 * sizeof(int32_t)) == 0,
          "rid 3 (in the cancelled slot): 10 golden tokens");
    CHECK(after == 0 && batcher_in_flight(b) == 0 && batcher_free_slots(b) == 2, "all done, nothing in flight");

    /* clear with both lanes in flight: no events for the dropped sequences, the slots free after the collects */
    wk_request r5 = s_req(5, buf[0], 4, 40), r6 = s_req(6, buf[1], 6, 40);
    CHECK(batcher_add(b, &r5, err, sizeof err) == 0 && batcher_add(b, &r6, err, sizeof err) == 0, "add 5, 6");
    for (int k = 0; k < 4; k++) batcher_step(b, ev, cap, &n_ev, err, sizeof err);
    CHECK(batcher_in_flight(b) == 2, "both lanes in flight");
    batcher_clear(b);
    CHECK(batcher_running(b) == 0 && batcher_free_slots(b) == 2 && batcher_in_flight(b) == 2,
          "clear: nothing running, steps still in flight");
    wk_request r7 = s_req(7, buf[2], 11, 20);
    CHECK(batcher_add(b, &r7, err, sizeof err) == 0, "rid 7 admitted while both slots drain");
    int stray = 0;
    for (int k = 0; k < 2; k++) {
        CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) == 1, "collect %d after the clear", k);
        for (int j = 0; j < n_ev; j++) stray += ev[j].rid == 5 || ev[j].rid == 6;
    }
    CHECK(stray == 0, "no events for cleared sequences");
    uint64_t rid7 = 7;
    int32_t got7[1][NG];
    int n7 = 0, fin7 = 0, after7 = 0;
    CHECK(s_drive(b, &rid7, 1, got7, &n7, &fin7, &after7) == 1 && n7 == 20 &&
          memcmp(got7[0], &s_gold[11], 20 * sizeof(int32_t)) == 0, "rid 7: 20 golden tokens");
    CHECK(a->violations == 0, "no protocol violation (slots never in two steps in flight)");
    n_ev = 0;
    CHECK(batcher_step(b, ev, cap, &n_ev, err, sizeof err) == 0 && batcher_in_flight(b) == 0, "idle at the end");
    free(ev);
out:
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* random adds and cancels over 2 and 3 lanes: every sequence not cancelled gives its golden continuation, every
 * cancelled one gets exactly one acknowledgement and nothing after it, and no KV slot is ever in two steps */
static void test_churn(const zl_model *m) {
    for (int lanes = 2; lanes <= 3; lanes++) {
        zl_engine *e = ta_new(s_engine(m, 4, 3, 160, 7), lanes);
        if (!e) return;
        char err[256];
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        if (!b) {
            engine_destroy(&e);
            return;
        }
        enum { NR = 40 };
        static int k[NR], maxt[NR], n_got[NR], fin[NR], cancelled[NR], added[NR], after[NR];
        static int32_t got[NR][NG];
        memset(n_got, 0, sizeof n_got);
        memset(fin, 0, sizeof fin);
        memset(cancelled, 0, sizeof cancelled);
        memset(added, 0, sizeof added);
        memset(after, 0, sizeof after);
        uint64_t rng = 12345 + (uint64_t)lanes;
        int cap = batcher_event_cap(b), n_add = 0, n_cancel = 0;
        wk_event *ev = calloc((size_t)cap, sizeof *ev);
        int32_t buf[NG + 1];
        for (int call = 0; call < 4000; call++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            unsigned x = (unsigned)(rng >> 33);
            if (n_add < NR && x % 2 == 0 && batcher_free_slots(b) > 0) {
                int i = n_add++;
                k[i] = (int)((x >> 4) % 60);
                maxt[i] = 1 + (int)((x >> 10) % 25);
                wk_request r = s_req(1000 + i, buf, k[i], maxt[i]);
                CHECK(batcher_add(b, &r, err, sizeof err) == 0, "churn add %d: %s", i, err);
                added[i] = 1;
            }
            if (x % 7 == 3) {   /* cancel a running one, often while its step is in flight */
                int i = (int)((x >> 16) % NR);
                if (added[i] && !fin[i] && !cancelled[i]) {
                    CHECK(batcher_cancel(b, 1000 + i) == 1, "churn cancel %d", i);
                    cancelled[i] = 1;
                    n_cancel++;
                }
            }
            int n_ev = 0, rc = batcher_step(b, ev, cap, &n_ev, err, sizeof err);
            CHECK(rc >= 0, "churn step: %s", err);
            if (rc < 0) break;
            for (int j = 0; j < n_ev; j++) {
                int i = (int)ev[j].rid - 1000;
                if (i < 0 || i >= NR) continue;
                if (fin[i]) after[i]++;
                if (ev[j].tok >= 0 && n_got[i] < NG) got[i][n_got[i]++] = ev[j].tok;
                if (ev[j].fin) fin[i] = ev[j].fin;
            }
            if (n_add == NR && rc == 0) break;
        }
        int good = 0;
        for (int i = 0; i < NR; i++) {
            int ok = added[i] && after[i] == 0 && n_got[i] <= maxt[i] &&
                     memcmp(got[i], &s_gold[k[i]], (size_t)n_got[i] * sizeof(int32_t)) == 0 &&
                     (cancelled[i] ? fin[i] == WK_FIN_CANCELLED : fin[i] == WK_FIN_LENGTH && n_got[i] == maxt[i]);
            CHECK(ok, "churn %d lanes: rid %d (k %d, max %d, cancelled %d): fin %d, %d tokens, %d after", lanes, i,
                  k[i], maxt[i], cancelled[i], fin[i], n_got[i], after[i]);
            good += ok;
        }
        CHECK(good == NR && n_cancel > 3, "churn %d lanes: %d of %d sequences right, %d cancelled", lanes, good, NR,
              n_cancel);
        CHECK(((t_async *)e)->violations == 0 && batcher_in_flight(b) == 0 && batcher_free_slots(b) == 4,
              "churn %d lanes: no protocol violation, all slots free", lanes);
        free(ev);
        batcher_destroy(&b);
        engine_destroy(&e);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * steps queued ahead (the CPU engine has depth 2): the same requests with and without give every rid
 * the same tokens and final code (greedy golden continuations, a stop id, seeded sampling fed on the device, a
 * repetition penalty that is never fed), with more requests than slots; then random adds and cancels with steps
 * in flight: golden tokens, one final event per rid, none after it, and every slot back at the end. */
#define NA 10
static void test_ahead(const zl_model *m) {
    static int32_t got[2][NA][NG], bufs[NA][NG + 1];
    int n_got[2][NA], fin[2][NA], in_flight_seen[2] = {0, 0}, stop_at = 0;
    for (int mode = 0; mode < 2; mode++) {
        zl_engine *e = s_engine(m, 4, 4, 128, 16);
        if (!e) return;
        char err[256];
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        CHECK(b && batcher_set_ahead(b, mode) == mode, "batcher with steps queued ahead %s", mode ? "on" : "off");
        if (!b) { engine_destroy(&e); return; }
        int cap = batcher_event_cap(b), next = 0, ended = 0;
        wk_event *ev = calloc((size_t)cap, sizeof *ev);
        memset(n_got[mode], 0, sizeof n_got[mode]);
        memset(fin[mode], 0, sizeof fin[mode]);
        for (int call = 0; call < 600 && ended < NA; call++) {
            while (next < NA && batcher_free_slots(b) > 0) {
                wk_request r = s_req(100 + next, bufs[next], 2 + 7 * next % 23, 3 + 5 * next % 17);
                if (next == 2) { stop_at = 2 + 7 * 2 % 23 + 4; r.stop_ids = &s_gold[stop_at]; r.n_stop_ids = 1; }
                if (next == 4 || next == 7) { r.samp.temperature = 0.8f; r.samp.top_k = 30; r.samp.seed = 5 + next; }
                if (next == 7) { r.samp.repeat_penalty = 1.2f; r.samp.repeat_last_n = 16; }
                CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add %d: %s", next, err);
                next++;
            }
            int n_ev = 0;
            if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) { CHECK(0, "ahead %d: %s", mode, err); break; }
            in_flight_seen[mode] |= batcher_in_flight(b) > 0;
            for (int j = 0; j < n_ev; j++) {
                const int k = (int)ev[j].rid - 100;
                if (k < 0 || k >= NA) continue;
                CHECK(!fin[mode][k], "rid %d: an event after its final one", k);
                if (ev[j].tok >= 0 && n_got[mode][k] < NG) got[mode][k][n_got[mode][k]++] = ev[j].tok;
                if (ev[j].fin) { fin[mode][k] = ev[j].fin; ended++; }
            }
        }
        CHECK(ended == NA, "ahead %d: %d of %d requests ended", mode, ended, NA);
        for (int k = 0; k < 3 && batcher_in_flight(b); k++) {
            int n_ev = 0;
            batcher_step(b, ev, cap, &n_ev, err, sizeof err);
        }
        CHECK(batcher_in_flight(b) == 0 && batcher_free_slots(b) == 4, "ahead %d: every slot back", mode);
        free(ev);
        batcher_destroy(&b);
        engine_destroy(&e);
    }
    CHECK(!in_flight_seen[0] && in_flight_seen[1], "steps stay in flight between calls only when queued ahead");
    for (int k = 0; k < NA; k++) {
        CHECK(n_got[0][k] == n_got[1][k] && fin[0][k] == fin[1][k] &&
              !memcmp(got[0][k], got[1][k], (size_t)n_got[0][k] * sizeof(int32_t)),
              "rid %d: %d tokens (fin %d) queued ahead, %d (fin %d) synchronously", k, n_got[1][k], fin[1][k],
              n_got[0][k], fin[0][k]);
        const int kp = 2 + 7 * k % 23;
        if (k != 4 && k != 7)
            CHECK(n_got[1][k] > 0 && !memcmp(got[1][k], &s_gold[kp], (size_t)n_got[1][k] * sizeof(int32_t)),
                  "rid %d: golden continuation", k);
    }
    CHECK(fin[1][2] == WK_FIN_STOP && got[1][2][n_got[1][2] - 1] == s_gold[stop_at], "the stop id ends rid 2");

    /* a prompt in chunks keeps one chunk a step while queued ahead (its next chunk is queued behind the one in
     * flight), beside a sequence that decodes: 41 tokens under a cap of 4 sample in the 11th step after the add
     * synchronously, in the 12th queued ahead (the step in flight at the add comes first) */
    for (int mode = 0; mode < 2; mode++) {
        zl_engine *e = s_engine(m, 2, 2, 96, 16);
        if (!e) return;
        char err[256];
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        CHECK(b && batcher_set_ahead(b, mode) == mode, "prompt chunks: batcher");
        if (!b) { engine_destroy(&e); return; }
        batcher_set_prefill_cap(b, 4);
        wk_request d = s_req(901, bufs[1], 2, 60);
        CHECK(batcher_add(b, &d, err, sizeof err) == 0, "prompt chunks: add the decoder: %s", err);
        int cap = batcher_event_cap(b), first = -1, ended = 0, n_ev = 0;
        wk_event *ev = calloc((size_t)cap, sizeof *ev);
        for (int call = 0; call < 3; call++) batcher_step(b, ev, cap, &n_ev, err, sizeof err);
        wk_request q = s_req(900, bufs[0], 40, 3);
        CHECK(batcher_add(b, &q, err, sizeof err) == 0, "prompt chunks: add: %s", err);
        for (int call = 0; call < 40 && !ended; call++) {
            if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) { CHECK(0, "prompt chunks: %s", err); break; }
            for (int j = 0; j < n_ev; j++) {
                if (ev[j].rid != 900) continue;
                if (ev[j].tok >= 0 && first < 0) first = call;
                ended |= ev[j].fin != 0;
            }
        }
        CHECK(first == 10 + mode, "prompt chunks (ahead %d): first token at call %d, not %d", mode, first, 10 + mode);
        batcher_clear(b);
        for (int k = 0; k < 3 && batcher_in_flight(b); k++) batcher_step(b, ev, cap, &n_ev, err, sizeof err);
        free(ev);
        batcher_destroy(&b);
        engine_destroy(&e);
    }

    /* churn: adds and cancels at random calls, with steps in flight */
    zl_engine *e = s_engine(m, 3, 3, 96, 8);
    if (!e) return;
    char err[256];
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_ahead(b, 1) == 1, "churn: steps queued ahead");
    if (!b) { engine_destroy(&e); return; }
    enum { NC = 30 };
    static int32_t cb[NC][NG + 1], cg[NC][NG];
    int cn[NC] = {0}, cf[NC] = {0}, plen[NC] = {0}, cancelled[NC] = {0}, finals = 0, n_add = 0;
    uint64_t r = 77;
    int cap = batcher_event_cap(b);
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int call = 0; call < 2000 && finals < NC; call++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int pick = (int)((r >> 33) % 8);
        if (pick < 3 && n_add < NC && batcher_free_slots(b) > 0) {
            plen[n_add] = 1 + (int)((r >> 40) % 30);
            wk_request q = s_req(500 + n_add, cb[n_add], plen[n_add], 1 + (int)((r >> 50) % 12));
            CHECK(batcher_add(b, &q, err, sizeof err) == 0, "churn add: %s", err);
            n_add++;
        } else if (pick == 3 && n_add > 0) {
            const int k = (int)((r >> 45) % (uint64_t)n_add);
            if (batcher_cancel(b, 500 + k)) cancelled[k] = 1;
        }
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) { CHECK(0, "churn: %s", err); break; }
        for (int j = 0; j < n_ev; j++) {
            const int k = (int)ev[j].rid - 500;
            if (k < 0 || k >= NC) continue;
            CHECK(!cf[k], "churn rid %d: an event after its final one", k);
            if (ev[j].tok >= 0) cg[k][cn[k]++] = ev[j].tok;
            if (ev[j].fin) { cf[k] = ev[j].fin; finals++; }
        }
        if (n_add == NC && batcher_running(b) == 0 && !batcher_in_flight(b)) break;
    }
    int golden = 1, ends = 1;
    for (int k = 0; k < n_add; k++) {
        ends &= cf[k] != 0 && (cancelled[k] || cf[k] == WK_FIN_LENGTH);
        golden &= cn[k] == 0 || !memcmp(cg[k], &s_gold[plen[k]], (size_t)cn[k] * sizeof(int32_t));
    }
    CHECK(n_add == NC && ends, "churn: %d rids added, each with one final event (cancelled or at its length)", n_add);
    CHECK(golden, "churn: every rid's tokens are its golden continuation");
    CHECK(batcher_free_slots(b) == 3 && !batcher_in_flight(b), "churn: every slot back, nothing in flight");
    free(ev);
    batcher_destroy(&b);
    engine_destroy(&e);
}

/* what comes back besides the token: a sequence sharing its sibling's prompt (wk_request.share) copies its KV
 * instead of prefilling (counted; the prompt tokens of the steps say so) and gives the tokens of the request run
 * alone; events carry logprobs exactly when asked for; an engine that does not offer logprobs or penalties (caps 0)
 * refuses such sequences with fin 4 */
static void test_extras(const zl_model *m) {
    char err[256];
    int32_t buf[3][NG + 1];
    int alone[16], n_alone = 0;
    {
        zl_engine *e = s_engine(m, 4, 4, 64, 64);
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        wk_request r = s_req(1, buf[0], 9, 6);
        r.samp.temperature = 1.0f;
        r.samp.seed = 77;
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add alone: %s", err);
        s_run_one(b, 1, alone, &n_alone);
        batcher_destroy(&b);
        engine_destroy(&e);
    }
    zl_engine *e = s_engine(m, 4, 4, 64, 64);
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    wk_request r0 = s_req(10, buf[0], 9, 6), r1 = s_req(11, buf[1], 9, 6);
    r0.samp.temperature = r1.samp.temperature = 1.0f;
    r0.samp.seed = 76;
    r1.samp.seed = 77;
    r1.share = 10;
    r1.samp.logprobs = 1;
    r1.samp.top_logprobs = 3;
    CHECK(batcher_add(b, &r0, err, sizeof err) == 0 && batcher_add(b, &r1, err, sizeof err) == 0, "add pair: %s", err);
    int cap = batcher_event_cap(b), got[16], n_got = 0, fin = 0, prefill = 0, with_lp = 0, lp_ok = 1;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int step = 0; step < 50 && !fin; step++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        prefill += batcher_last_prefill_tokens(b);
        for (int j = 0; j < n_ev; j++) {
            if (ev[j].rid == 10) CHECK(!ev[j].has_lp, "no logprobs unless asked for");
            if (ev[j].rid != 11) continue;
            if (ev[j].tok >= 0) got[n_got++] = ev[j].tok;
            with_lp += ev[j].has_lp;
            lp_ok &= ev[j].lp.n_top == 3 && ev[j].lp.logprob <= 0 && ev[j].lp.top_logprob[0] >= ev[j].lp.logprob;
            fin = ev[j].fin;
        }
    }
    CHECK(batcher_prefills_shared(b) == 1, "one prompt KV copied (%llu)",
          (unsigned long long)batcher_prefills_shared(b));
    CHECK(prefill == 10,
          "prompt chunks: the leader's 10 tokens only (the sharer's last prompt token runs as a decode "
          "entry; without the copy: 20) (%d)",
          prefill);
    CHECK(n_got == n_alone && !memcmp(got, alone, sizeof(int) * (size_t)n_got),
          "the sharer's tokens equal the request alone (%d vs %d tokens)", n_got, n_alone);
    CHECK(with_lp == n_got && lp_ok, "every token of the sharer carries 3 alternatives (%d of %d)", with_lp, n_got);
    free(ev);
    batcher_destroy(&b);
    /* an engine without the caps */
    zl_engine *t = ta_new(e, 1);
    b = s_batcher_new(t, s_eog, m->cfg.vocab_size, err, sizeof err);
    wk_request q = s_req(20, buf[2], 3, 4);
    q.samp.logprobs = 1;
    CHECK(batcher_add(b, &q, err, sizeof err) == -1 && strstr(err, "logprobs"), "caps 0: logprobs refused (%s)", err);
    q.samp.logprobs = 0;
    q.samp.presence_penalty = 0.5f;
    CHECK(batcher_add(b, &q, err, sizeof err) == -1, "caps 0: a presence penalty refused");
    q.samp.presence_penalty = 0;
    const zl_bias bias[1] = {{5, 1.0f}};
    q.bias = bias;
    q.n_bias = 1;
    CHECK(batcher_add(b, &q, err, sizeof err) == -1, "caps 0: a logit bias refused");
    batcher_destroy(&b);
    engine_destroy(&t);
}

/* runs rid's sequence (with prompt logprobs) in b to its end: its prompt logprobs in order into plp[], its tokens,
 * its final code; returns the rows received (-1 when they came out of order) */
static int s_run_plp(wk_batcher *b, uint64_t rid, zl_logprobs *plp, int *toks, int *n_tok, int *fin) {
    char err[256];
    int cap = batcher_event_cap(b), rows = 0, order = 1;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    *n_tok = 0;
    *fin = 0;
    for (int step = 0; step < 200 && !*fin; step++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        for (int j = 0; j < n_ev; j++) {
            if (ev[j].rid != rid) continue;
            if (ev[j].n_plp) {
                order &= ev[j].plp_start == rows + 1;
                memcpy(plp + rows, ev[j].plp, (size_t)ev[j].n_plp * sizeof *plp);
                rows += ev[j].n_plp;
            }
            if (ev[j].tok >= 0) toks[(*n_tok)++] = ev[j].tok;
            *fin = ev[j].fin;
        }
    }
    /* the others to their end too, so that no step stays in flight on the engine the next batcher takes */
    for (int step = 0; step < 200 && (batcher_running(b) > 0 || batcher_in_flight(b) > 0); step++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) break;
    }
    free(ev);
    return order ? rows : -1;
}

/* prompt logprobs (wk_request.prompt_lp): positions 1..P-1 in order, the same bits as one engine step over the whole
 * prompt, whatever the chunking (a prefill cap of 3) and beside another sequence; tokens unchanged; max_tokens 0
 * ends with fin 2 and no token once the prompt is in; a sharer with prompt logprobs prefills itself */
static void test_prompt_lp(const zl_model *m) {
    char err[256];
    int32_t buf[3][NG + 1];
    const int K = 12, P = K + 1;
    zl_logprobs ref[NG], a[NG], c[NG];
    zl_engine *e = s_engine(m, 4, 4, 64, 64);
    {
        /* the reference: one step over the whole prompt on the same engine */
        wk_request r = s_req(1, buf[0], K, 1);
        zl_seq q;
        memset(&q, 0, sizeof q);
        q.slot = 3;
        q.n_tokens = P;
        q.tokens = r.tokens;
        q.plp_rows = P - 1;
        q.plp_top = 5;
        q.plp_next = r.tokens + 1;
        q.plp_out = ref;
        int32_t tok;
        CHECK(engine_step(e, &q, 1, &tok, NULL) == 0, "reference step: %s", e->err);
    }
    int toks[16], n_tok, fin, plain[16], n_plain, fin_plain;
    for (int chunked = 0; chunked < 2; chunked++) {
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        if (chunked) batcher_set_prefill_cap(b, 3);
        wk_request r = s_req(10, buf[0], K, 4), o = s_req(11, buf[1], 20, 6);
        r.prompt_lp = 1;
        r.prompt_top = 5;
        CHECK(batcher_add(b, &o, err, sizeof err) == 0 && batcher_add(b, &r, err, sizeof err) == 0, "add: %s", err);
        memset(chunked ? c : a, 0xA5, sizeof a);
        const int rows = s_run_plp(b, 10, chunked ? c : a, toks, &n_tok, &fin);
        CHECK(rows == P - 1, "prompt logprobs of %d positions in order (%d)", P - 1, rows);
        CHECK(!memcmp(chunked ? c : a, ref, (size_t)(P - 1) * sizeof *ref), "%s: the bits of one step over the prompt",
              chunked ? "chunks of 3 beside another prompt" : "whole");
        CHECK(n_tok == 4 && fin == WK_FIN_LENGTH && !memcmp(toks, s_gold + K, 4 * sizeof(int)),
              "the golden continuation all the same");
        batcher_destroy(&b);
    }
    {
        wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
        wk_request r = s_req(20, buf[0], K, 0);
        CHECK(batcher_add(b, &r, err, sizeof err) == -1, "max_tokens 0 without prompt logprobs refused");
        r.prompt_lp = 1;
        r.prompt_top = 5;
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "max_tokens 0 with prompt logprobs: %s", err);
        const int rows = s_run_plp(b, 20, c, plain, &n_plain, &fin_plain);
        CHECK(rows == P - 1 && n_plain == 0 && fin_plain == WK_FIN_LENGTH && !memcmp(c, ref, (P - 1) * sizeof *ref),
              "max_tokens 0: the prompt logprobs, no token, length (%d rows, %d tokens, fin %d)", rows, n_plain,
              fin_plain);
        wk_request s0 = s_req(30, buf[1], K, 2), s1 = s_req(31, buf[2], K, 2);
        s1.share = 30;
        s1.prompt_lp = 1;
        CHECK(batcher_add(b, &s0, err, sizeof err) == 0 && batcher_add(b, &s1, err, sizeof err) == 0, "add pair");
        const int rows1 = s_run_plp(b, 31, c, plain, &n_plain, &fin_plain);
        CHECK(rows1 == P - 1 && batcher_prefills_shared(b) == 0, "a sharer with prompt logprobs prefills itself");
        r.prompt_top = 21;
        r.rid = 40;
        CHECK(batcher_add(b, &r, err, sizeof err) == -1, "21 alternatives refused");
        batcher_destroy(&b);
    }
    zl_engine *t = ta_new(e, 1);
    wk_batcher *b = s_batcher_new(t, s_eog, m->cfg.vocab_size, err, sizeof err);
    wk_request q = s_req(50, buf[2], 3, 4);
    q.prompt_lp = 1;
    CHECK(batcher_add(b, &q, err, sizeof err) == -1 && strstr(err, "prompt logprobs"),
          "an engine without ZL_CAP_PROMPT_LOGPROBS refuses them (%s)", err);
    batcher_destroy(&b);
    engine_destroy(&t); /* and e, which t owns */
}

/* KV block accounting (batcher_set_kv): blocks by tokens used, the prefix cache found again by a second run of the
 * same prompt (its tokens unchanged), counters and hashes for the heartbeat; and prefill by priority */
/* batcher_set_prefix_cache(b, 0) (zllm-worker --prefix-cache 0): a prompt run twice finds nothing cached, on paged
 * KV and with block accounting over contiguous slots; with it on the second run hits; the tokens are the same in
 * all four runs */
static void test_kv_cache_off(const zl_model *m) {
    char err[256];
    int32_t buf[NG + 1];
    int ref[NG], n_ref = 0;
    for (int paged = 0; paged < 2; paged++)
        for (int on = 1; on >= 0; on--) {
            zl_engine_opts o;
            memset(&o, 0, sizeof o);
            o.device = "cpu";
            o.n_slots = o.max_batch = 2;
            o.n_ctx = 64;
            o.threads = 1;
            o.max_step_tokens = 64;
            o.kv_block = paged ? 4 : 0;
            o.kv_blocks = paged ? 40 : 0;
            zl_engine *e = engine_new(m, &o, err, sizeof err);
            wk_batcher *b = e ? s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err) : NULL;
            CHECK(b != NULL, "engine/batcher: %s", err);
            if (!b) {
                engine_destroy(&e);
                continue;
            }
            CHECK(batcher_set_kv(b, 4, "stories260K", err, sizeof err) == 0, "set_kv: %s", err);
            CHECK(batcher_prefix_cache(b) == 1, "the prefix cache is on by default");
            batcher_set_prefix_cache(b, on);
            wk_kv_stats st;
            for (int round = 0; round < 2; round++) {
                int got[NG], n_got = 0;
                wk_request r = s_req(1 + (uint64_t)round, buf, 12, 20);
                CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add: %s", err);
                int fin = s_run_one(b, r.rid, got, &n_got);
                CHECK(fin == WK_FIN_LENGTH && n_got == 20, "paged %d cache %d round %d: fin %d, %d tokens", paged, on,
                      round, fin, n_got);
                if (!n_ref) {
                    memcpy(ref, got, sizeof(int) * (size_t)n_got);
                    n_ref = n_got;
                } else {
                    CHECK(n_got == n_ref && !memcmp(ref, got, sizeof(int) * (size_t)n_got),
                          "paged %d cache %d round %d: the same tokens", paged, on, round);
                }
            }
            batcher_kv(b, &st);
            uint64_t h[64];
            CHECK(st.paged == paged && st.prompt_tokens == 26, "paged %d: %llu prompt tokens", paged,
                  (unsigned long long)st.prompt_tokens);
            if (on)
                CHECK(st.hit_tokens == 12, "paged %d cache on: 12 tokens hit (%llu)", paged,
                      (unsigned long long)st.hit_tokens);
            else
                CHECK(st.hit_tokens == 0 && st.cached == 0 && batcher_kv_hashes(b, h, 64) == 0,
                      "paged %d cache off: nothing hit (%llu), cached (%d) nor reported", paged,
                      (unsigned long long)st.hit_tokens, st.cached);
            batcher_destroy(&b);
            engine_destroy(&e);
        }
}

static void test_kv(const zl_model *m) {
    zl_engine *e = s_engine(m, 2, 2, 64, 64);
    if (!e) return;
    char err[256];
    int got[NG], got2[NG], n_got = 0, n_got2 = 0;
    int32_t buf[NG + 1];
    wk_kv_stats st;
    wk_batcher *b = s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    if (!b) goto out;
    CHECK(batcher_kv(b, &st) == 0 && st.blocks == 0, "off by default");
    CHECK(batcher_set_kv(b, KV_BLOCK_MAX + 1, "m", err, sizeof err) == -1, "block size 257 refused");
    CHECK(batcher_set_kv(b, 4, "stories260K", err, sizeof err) == 0, "set_kv: %s", err);
    CHECK(batcher_kv(b, &st) == 1 && st.block_size == 4 && st.blocks == 2 * 16 && st.free == 32, "2 slots x 16 blocks");
    wk_request r = s_req(1, buf, 12, 20); /* 13 prompt tokens: 4 blocks, 3 full */
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add: %s", err);
    batcher_kv(b, &st);
    CHECK(st.used == 4 && st.prompt_tokens == 13 && st.hit_tokens == 0,
          "admission takes the prompt's 4 blocks, not "
          "prompt + max_tokens (used %d)",
          st.used);
    int fin = s_run_one(b, 1, got, &n_got);
    batcher_kv(b, &st);
    CHECK(fin == WK_FIN_LENGTH && n_got == 20, "ran: fin %d, %d tokens", fin, n_got);
    CHECK(st.used == 0 && st.cached == 8 && st.free == 24,
          "ended: its 8 full blocks (32 of 33 tokens) cached, used "
          "%d cached %d free %d",
          st.used, st.cached, st.free);
    uint64_t h[64];
    CHECK(batcher_kv_hashes(b, h, 64) == 8, "8 block hashes for the heartbeat");
    r = s_req(2, buf, 12, 20);
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add again: %s", err);
    batcher_kv(b, &st);
    CHECK(st.hit_tokens == 12 && st.prompt_tokens == 26,
          "the same prompt: 3 blocks (12 tokens) found, the last "
          "prompt token computed (hit %llu)",
          (unsigned long long)st.hit_tokens);
    fin = s_run_one(b, 2, got2, &n_got2);
    CHECK(fin == WK_FIN_LENGTH && n_got2 == n_got && memcmp(got, got2, sizeof(int) * (size_t)n_got) == 0,
          "a cache hit gives the same tokens");
    /* priority: the higher one is prefilled first, whatever the admission order */
    batcher_set_prefill_cap(b, 8); /* both prompts do not fit one step */
    wk_request lo = s_req(3, buf, 12, 1);
    int32_t buf2[NG + 1];
    wk_request hi = s_req(4, buf2, 20, 1);
    hi.priority = 5;
    CHECK(batcher_add(b, &lo, err, sizeof err) == 0 && batcher_add(b, &hi, err, sizeof err) == 0, "add lo, hi");
    wk_event ev[128];
    int n_ev = 0, first = 0;
    CHECK(batcher_event_cap(b) <= 128, "event cap %d", batcher_event_cap(b));
    for (int step = 0; step < 20 && !first; step++) {
        CHECK(batcher_step(b, ev, 128, &n_ev, err, sizeof err) >= 0, "step: %s", err);
        for (int j = 0; j < n_ev && !first; j++)
            if (ev[j].tok >= 0) first = (int)ev[j].rid;
    }
    CHECK(first == 4, "the high-priority prompt (admitted second, longer) gets its first token first (rid %d)", first);
    batcher_destroy(&b);
out:
    engine_destroy(&e);
}

/* paged KV (the engine reads KV through the batcher's block tables): 4 sampled requests sharing prefixes over a pool
 * too small for all of them at once, with one of higher priority, give each the tokens it gives alone on
 * contiguous slots; cached prefixes are found, sequences are preempted and resumed. ahead 1: the same with steps
 * queued ahead (fed entries through the tables; a sequence with a step in flight is never preempted) */
static void test_kv_paged(const zl_model *m, int ahead) {
    enum { N = 4, MT = 24 };
    static const int ks[N] = {10, 21, 14, 27};
    int ref[N][MT], n_ref[N], got[N][MT], n_got[N];
    int32_t bufs[N][NG + 1];
    char err[256];
    wk_kv_stats st;
    for (int i = 0; i < N; i++) { /* alone, contiguous slots, no blocks */
        zl_engine *e = s_engine(m, 1, 1, 64, 64);
        wk_batcher *b = e ? s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err) : NULL;
        wk_request r = s_req(100 + (uint64_t)i, bufs[i], ks[i], MT);
        r.samp.temperature = 0.9f;
        r.samp.seed = 7 + (uint64_t)i;
        n_ref[i] = 0;
        if (b && batcher_add(b, &r, err, sizeof err) == 0) s_run_one(b, r.rid, ref[i], &n_ref[i]);
        CHECK(n_ref[i] == MT, "reference %d: %d tokens", i, n_ref[i]);
        batcher_destroy(&b);
        engine_destroy(&e);
    }
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = o.max_batch = N;
    o.n_ctx = 64;
    o.threads = 1;
    o.max_step_tokens = 64;
    o.kv_block = 4;
    o.kv_blocks = 20; /* a whole context (16) and the headroom, but not the 4 sequences' 6..13 blocks each */
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e && e->kv_block == 4 && e->kv_blocks == 20, "paged engine: %s", e ? "kv_block" : err);
    wk_batcher *b = e ? s_batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err) : NULL;
    if (!b) goto out;
    CHECK(batcher_set_kv(b, 8, "stories260K", err, sizeof err) == -1, "a block size other than the engine's: refused");
    CHECK(batcher_set_kv(b, 4, "stories260K", err, sizeof err) == 0, "set_kv: %s", err);
    CHECK(batcher_kv(b, &st) == 1 && st.paged == 1 && st.blocks == 20, "paged, 20 blocks");
    CHECK(batcher_set_ahead(b, ahead) == ahead && batcher_set_lanes(b, 2) == 1 && batcher_ahead(b) == ahead,
          "paged KV: one lane, steps queued ahead %d", ahead);
    for (int round = 0; round < 2; round++) { /* round 1 finds round 0's blocks cached */
        for (int i = 0; i < N; i++) {
            wk_request r = s_req(100 + (uint64_t)i + 10 * (uint64_t)round, bufs[i], ks[i], MT);
            r.samp.temperature = 0.9f;
            r.samp.seed = 7 + (uint64_t)i;
            r.priority = i == 3 ? 5 : 0;
            n_got[i] = 0;
            CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add %d: %s", i, err);
        }
        wk_event ev[128];
        int done = 0;
        for (int step = 0; step < 2000 && done < N; step++) {
            int n_ev = 0;
            if (batcher_step(b, ev, 128, &n_ev, err, sizeof err) < 0) {
                CHECK(0, "step: %s", err);
                break;
            }
            for (int j = 0; j < n_ev; j++) {
                int i = (int)(ev[j].rid - 100 - 10 * (uint64_t)round);
                if (i < 0 || i >= N) continue;
                if (ev[j].tok >= 0 && n_got[i] < MT) got[i][n_got[i]++] = ev[j].tok;
                done += ev[j].fin != 0;
            }
        }
        for (int i = 0; i < N; i++)
            CHECK(n_got[i] == n_ref[i] && memcmp(got[i], ref[i], sizeof(int) * (size_t)n_ref[i]) == 0,
                  "round %d request %d: the tokens it gives alone (%d of %d)", round, i, n_got[i], n_ref[i]);
        batcher_kv(b, &st);
        printf("paged round %d: hit %llu of %llu prompt tokens, %llu preemptions, %llu re-prefilled, %llu evictions\n",
               round, (unsigned long long)st.hit_tokens, (unsigned long long)st.prompt_tokens,
               (unsigned long long)st.preemptions, (unsigned long long)st.resumed_tokens,
               (unsigned long long)st.evictions);
        CHECK(st.used == 0, "round %d: every block released (%d used)", round, st.used);
    }
    CHECK(st.preemptions > 0, "sequences were preempted");
    CHECK(st.hit_tokens > 0, "cached prefixes were found");
    { /* a higher priority's admission preempts a running lower one; both give the tokens they give alone */
        int32_t lo_buf[NG + 1], hi_buf[NG + 1];
        int lo_ref[MT], hi_ref[MT], n_lo_ref = 0, n_hi_ref = 0, lo_got[MT], hi_got[MT], n_lo = 0, n_hi = 0;
        wk_request lo = s_req(300, lo_buf, 40, MT), hi = s_req(301, hi_buf, 40, MT);
        for (int t = 1; t <= 40; t++) { /* prompts unlike the cached ones: 11 blocks each, 2 x 11 > 20 */
            lo_buf[t] = (lo_buf[t] + 7) % m->cfg.vocab_size;
            hi_buf[t] = (hi_buf[t] + 13) % m->cfg.vocab_size;
        }
        hi.priority = 3;
        for (int k = 0; k < 2; k++) { /* each alone first (on this engine: paged, an idle pool) */
            wk_request r = k ? hi : lo;
            r.rid += 10;
            CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add alone: %s", err);
            s_run_one(b, r.rid, k ? hi_ref : lo_ref, k ? &n_hi_ref : &n_lo_ref);
        }
        uint64_t pre0 = st.preemptions;
        CHECK(batcher_add(b, &lo, err, sizeof err) == 0, "add lo: %s", err);
        wk_event ev[128];
        int n_ev = 0, first = 0, done = 0;
        batcher_set_prefill_cap(b, 8); /* lo is mid-prefill when hi comes */
        for (int step = 0; step < 500 && done < 2; step++) {
            if (step == 1) CHECK(batcher_add(b, &hi, err, sizeof err) == 0, "add hi: %s", err);
            if (batcher_step(b, ev, 128, &n_ev, err, sizeof err) < 0) break;
            for (int j = 0; j < n_ev; j++) {
                if (ev[j].tok >= 0 && !first) first = (int)ev[j].rid;
                if (ev[j].tok >= 0 && ev[j].rid == 300 && n_lo < MT) lo_got[n_lo++] = ev[j].tok;
                if (ev[j].tok >= 0 && ev[j].rid == 301 && n_hi < MT) hi_got[n_hi++] = ev[j].tok;
                done += ev[j].fin != 0;
            }
        }
        batcher_kv(b, &st);
        /* with steps queued ahead lo's chunk may be in flight when hi comes (never preempted then): the order is
         * the scheduler's, the tokens are not */
        CHECK(ahead || (first == 301 && st.preemptions > pre0),
              "the high priority's first token comes first (rid %d), the low one preempted mid-prefill (%llu "
              "preemptions)",
              first, (unsigned long long)(st.preemptions - pre0));
        CHECK(n_lo == n_lo_ref && !memcmp(lo_got, lo_ref, sizeof(int) * (size_t)n_lo) && n_hi == n_hi_ref &&
                  !memcmp(hi_got, hi_ref, sizeof(int) * (size_t)n_hi),
              "preempted and preempting sequences give their tokens alone (%d/%d, %d/%d)", n_lo, n_lo_ref, n_hi,
              n_hi_ref);
    }
    batcher_destroy(&b);
out:
    engine_destroy(&e);
}

int main(void) {
    char p[1100], err[256];
    snprintf(p, sizeof p, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    FILE *f = fopen(p, "r");
    int ng = 0;
    if (f) {
        while (ng < NG && fscanf(f, "%d", &s_gold[ng]) == 1) ng++;
        fclose(f);
    }
    CHECK(ng == NG, "golden ids: %d from %s", ng, p);
    snprintf(p, sizeof p, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(p, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m || ng != NG) return test_report();
    s_eog = calloc((size_t)m->cfg.vocab_size, 1);
    test_kv_paged(m, 0);
    test_kv_paged(m, 1);
    test_mixed(m, 0, 1);
    test_mixed(m, 0, 2);
    test_mixed(m, 0, 3);
    test_mixed(m, 1, 2);
    test_mixed(m, 1, 3);
    test_sampled(m);
    test_lanes_cancel(m);
    test_churn(m);
    test_stops(m);
    test_rejects_and_cancel(m);
    test_ahead(m);
    test_extras(m);
    test_prompt_lp(m);
    test_kv(m);
    test_kv_cache_off(m);
    test_budget(m, 0, 12);
    test_budget(m, 1, 12);
    test_budget(m, 0, 2);
    test_budget(m, 1, 0);
    test_budget_unfed(m);
    test_budget_priority(m, 0, 0);
    test_budget_priority(m, 0, 5);
    test_budget_priority(m, 1, 5);
    /* the one-lane tests again with steps queued ahead over the CPU engine (forced: not its default) */
    s_force_ahead = 1;
    test_mixed(m, 0, 1);
    test_sampled(m);
    test_stops(m);
    test_rejects_and_cancel(m);
    test_extras(m);
    test_prompt_lp(m);
    s_force_ahead = -1;
    free(s_eog);
    model_destroy(&m);
    return test_report();
}
