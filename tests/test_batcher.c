/* tests/test_batcher.c: the worker's continuous batcher over the real CPU engine on stories260K.
 * Oracle: llama2.c's greedy continuation from BOS (golden_greedy_ids.txt). A prompt made of BOS and the first k
 * golden ids must continue with golden ids k, k+1, ... whatever else shares the steps, however the prompt is
 * chunked, and whenever the sequence joins. Also: stop ids, max_tokens, context full, cancel acknowledgements,
 * rejection of bad assignments (ids outside the vocabulary, too long, no free slot), duplicate rids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"
#include "engine.h"
#include "model.h"
#include "test.h"

#define NG 200
static int32_t s_gold[NG];
static uint8_t *s_eog;

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

static void test_mixed(const zl_model *m) {
    /* 4 slots, batch 3, 7-token steps: prompts are chunked, decodes share steps with prefills, sequences wait
     * for free slots and join at different steps */
    zl_engine *e = s_engine(m, 4, 3, 128, 7);
    if (!e) return;
    char err[256];
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b != NULL, "batcher_new: %s", err);
    if (!b) goto out;
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
    for (int step = 0; step < 500 && done < NC; step++) {
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
    CHECK(done == NC, "%d of %d sequences finished", done, NC);
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
        CHECK(same, "case %d matches the golden continuation", i);
    }
    CHECK(batcher_running(b) == 0 && batcher_free_slots(b) == 4, "all slots free at the end");
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
    free(ev);
    return fin;
}

static void test_stops(const zl_model *m) {
    zl_engine *e = s_engine(m, 2, 2, 64, 64);
    if (!e) return;
    char err[256];
    int got[NG], n_got = 0;
    int32_t buf[NG + 1];
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
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
    wk_batcher *b2 = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
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
    wk_batcher *b = batcher_new(e, s_eog, m->cfg.vocab_size, err, sizeof err);
    if (!b) goto out;
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
    test_mixed(m);
    test_stops(m);
    test_rejects_and_cancel(m);
    free(s_eog);
    model_destroy(&m);
    return test_report();
}
