/* tests/test_batcher_grammar.c: structured output in the worker's batcher over the real CPU engine on stories260K
 * (a SentencePiece vocabulary with byte-fallback pieces). Sequences with a grammar (GBNF and regex), greedy and
 * sampled, share steps with unconstrained ones, with steps synchronous and queued ahead (where a constrained
 * sequence must never be fed), and queued ahead over an engine that takes late masks (the CPU engine wrapped so
 * that a step runs at its wait, with the masks announced after its launch: constrained sequences are fed), with
 * the masks on one thread and on three:
 *  - every constrained sequence ends with finish stop, and its tokens' bytes are accepted whole by a fresh
 *    matcher (a complete match);
 *  - the unconstrained sequences give llama2.c's golden greedy ids, as without the others;
 *  - every run gives each sequence the ids and finish of synchronous steps on one thread; with late masks every
 *    fed constrained entry's mask is announced before its step is waited for (fed entries did take them);
 *  - a constrained sequence refused where the batcher has no vocabulary, and a max_tokens cut ends with length. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"
#include "engine.h"
#include "gguf.h"
#include "grammar.h"
#include "model.h"
#include "test.h"
#include "tokenizer.h"

#define NG 200
static int32_t s_gold[NG];

static zl_engine *s_engine(const zl_model *m) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = 6;
    o.max_batch = 6;
    o.n_ctx = 256;
    o.threads = 1;
    o.max_step_tokens = 64;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new: %s", err);
    return e;
}

/* An engine that takes late masks (zl_engine.masks_late), around the CPU engine: a launched step is only booked
 * (two at most, waited for in launch order) and runs at its wait, with the masks that engine_masks_ready copied
 * (a step with late masks waited for before they were announced is a violation, and fails). */
#define TL_MAX 8
typedef struct {
    zl_engine base;
    zl_engine *inner;
    const zl_step *q[2]; /* booked steps, oldest first */
    int announced[2];    /* their late masks were announced */
    uint32_t *masks[2];  /* [TL_MAX][words] their entries' masks as announced */
    int nq, words;
    zl_seq run[TL_MAX]; /* the entries the inner engine runs */
    int late_entries;   /* fed entries whose late masks were announced */
    int violations;
} t_late;

static int tl_fail(t_late *a, const char *why) {
    a->violations++;
    snprintf(a->base.err, sizeof a->base.err, "t_late: %s", why);
    return -1;
}

static int tl_has_late(const zl_step *st) {
    for (int i = 0; i < st->n; i++)
        if (st->seqs[i].mask_late) return 1;
    return 0;
}

static int tl_launch(zl_engine *e, const zl_step *st) {
    t_late *a = (t_late *)e;
    if (st->sync) {
        if (a->nq) return tl_fail(a, "a synchronous step with steps booked");
        return engine_run(a->inner, st);
    }
    if (a->nq >= 2 || st->n > TL_MAX) return tl_fail(a, "a third step in flight, or too many entries");
    if (tl_has_late(st) && a->nq == 0) return tl_fail(a, "late masks in a step queued behind none");
    a->q[a->nq] = st;
    a->announced[a->nq] = 0;
    a->nq++;
    return 0;
}

static int tl_masks_ready(zl_engine *e, const zl_step *st) {
    t_late *a = (t_late *)e;
    for (int k = 0; k < a->nq; k++) {
        if (a->q[k] != st || a->announced[k] || !tl_has_late(st)) continue;
        for (int i = 0; i < st->n; i++)
            if (st->seqs[i].mask_late) {
                memcpy(a->masks[k] + (size_t)i * a->words, st->seqs[i].mask, (size_t)a->words * 4);
                a->late_entries++;
            }
        a->announced[k] = 1;
        return 0;
    }
    snprintf(e->err, sizeof e->err, "masks_ready: the step is not in flight with late masks to announce");
    return -1;
}

static int tl_wait(zl_engine *e, const zl_step *st) {
    t_late *a = (t_late *)e;
    if (!a->nq || a->q[0] != st) return tl_fail(a, "wait for a step that is not the oldest booked");
    if (tl_has_late(st) && !a->announced[0]) return tl_fail(a, "waited before its late masks were announced");
    for (int i = 0; i < st->n; i++) {
        a->run[i] = st->seqs[i];
        if (a->run[i].mask_late) a->run[i].mask = a->masks[0] + (size_t)i * a->words;
        a->run[i].mask_late = 0;
    }
    zl_step r = *st;
    r.seqs = a->run;
    r.sync = 1;
    const int rc = engine_run(a->inner, &r);
    if (rc != 0) snprintf(e->err, sizeof e->err, "%s", a->inner->err);
    uint32_t *m0 = a->masks[0];
    a->q[0] = a->q[1];
    a->announced[0] = a->announced[1];
    a->masks[0] = a->masks[1];
    a->masks[1] = m0;
    a->nq--;
    return rc;
}

static void tl_destroy(zl_engine *e) {
    t_late *a = (t_late *)e;
    engine_destroy(&a->inner);
    free(a->masks[0]);
    free(a->masks[1]);
    free(a);
}

static const zl_engine_ops tl_ops = {tl_launch, tl_wait, tl_destroy, NULL};

/* wraps inner (taken over); NULL on failure (inner destroyed) */
static zl_engine *tl_new(zl_engine *inner) {
    t_late *a = inner && inner->max_batch <= TL_MAX ? calloc(1, sizeof *a) : NULL;
    if (a) {
        a->words = (inner->model->cfg.vocab_size + 31) / 32;
        a->masks[0] = malloc((size_t)TL_MAX * (size_t)a->words * 4);
        a->masks[1] = malloc((size_t)TL_MAX * (size_t)a->words * 4);
    }
    if (!a || !a->masks[0] || !a->masks[1]) {
        if (a) {
            free(a->masks[0]);
            free(a->masks[1]);
        }
        free(a);
        engine_destroy(&inner);
        return NULL;
    }
    a->inner = inner;
    zl_engine *b = &a->base;
    b->ops = &tl_ops;
    b->model = inner->model;
    snprintf(b->device, sizeof b->device, "test-late");
    b->n_slots = inner->n_slots;
    b->n_ctx = inner->n_ctx;
    b->max_batch = inner->max_batch;
    b->max_step_tokens = inner->max_step_tokens;
    b->lanes = 1;
    b->depth = 2;
    b->masks = 1;
    b->masks_late = 1;
    b->masks_ready = tl_masks_ready;
    b->caps = inner->caps;
    b->launch_async = 1;
    return b;
}

/* does the byte string of ids[0..n) (end-of-generation ids excluded) match g whole */
static int s_complete(zg_grammar *g, const zg_vocab *v, const int32_t *ids, int n) {
    char err[128];
    zg_matcher *m = grammar_matcher_new(g, err, sizeof err);
    int ok = m != NULL;
    for (int i = 0; ok && i < n; i++) ok = grammar_matcher_accept_token(m, v, ids[i]) == 0;
    ok = ok && grammar_matcher_accepting(m);
    grammar_matcher_destroy(&m);
    return ok;
}

#define NSEQ 6
/* ahead: 0 synchronous steps, 1 queued ahead, 2 queued ahead over late masks (t_late); each sequence's ids and
 * finish code into got, n_got, fin */
static void s_run(const zl_model *m, const zg_vocab *v, zg_grammar **g, int ahead, int threads, int32_t (*got)[NG],
                  int *n_got, int *fin) {
    zl_engine *e = s_engine(m);
    if (e && ahead == 2) {
        e = tl_new(e);
        CHECK(e != NULL, "the late-mask engine");
    }
    if (!e) return;
    char err[256];
    uint8_t *eog = calloc((size_t)m->cfg.vocab_size, 1);
    eog[2] = 1; /* stories260K's EOS */
    wk_batcher *b = batcher_new(e, eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b != NULL, "batcher_new: %s", err);
    if (!b) {
        free(eog);
        engine_destroy(&e);
        return;
    }
    CHECK(batcher_set_ahead(b, ahead != 0) == (ahead != 0), "ahead %d", ahead);
    batcher_set_vocab(b, v);
    CHECK(batcher_set_mask_threads(b, threads, err, sizeof err) == 0, "mask threads: %s", err);
    /* sequences 0, 2, 4: constrained (grammar g[i / 2 % 2], greedy for 0, sampled for 2 and 4); 1, 3, 5: the
     * golden continuation of BOS + gold[0..k) */
    int32_t prompt[NSEQ][16];
    memset(n_got, 0, NSEQ * sizeof *n_got);
    memset(fin, 0, NSEQ * sizeof *fin);
    for (int i = 0; i < NSEQ; i++) {
        wk_request r;
        memset(&r, 0, sizeof r);
        r.rid = 100 + (uint64_t)i;
        prompt[i][0] = 1;
        memcpy(prompt[i] + 1, s_gold, 8 * sizeof(int32_t));
        r.tokens = prompt[i];
        r.n_tokens = 1 + 2 * i % 8 + 1;
        r.max_tokens = i % 2 ? 24 : 120;
        r.samp = sampler_defaults();
        if (i % 2 == 0) {
            r.grammar = g[i / 2 % 2];
            if (i > 0) {
                r.samp.temperature = 0.9f;
                r.samp.seed = 7 + (uint64_t)i;
            }
        } else r.ignore_eos = 1;
        CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add %d: %s", i, err);
    }
    int cap = batcher_event_cap(b);
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int step = 0; step < 400; step++) {
        int n_ev = 0, done = 1;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        for (int j = 0; j < n_ev; j++) {
            int i = (int)(ev[j].rid - 100);
            if (i < 0 || i >= NSEQ) continue;
            CHECK(!fin[i], "seq %d: an event after its final", i);
            if (ev[j].tok >= 0 && n_got[i] < NG) got[i][n_got[i]++] = ev[j].tok;
            if (ev[j].fin) fin[i] = ev[j].fin;
        }
        for (int i = 0; i < NSEQ; i++) done &= fin[i] != 0;
        /* on three threads the late masks are announced here, as the worker does once its out is sent (elsewhere
         * by the next batcher_step) */
        if (ahead == 2 && threads == 3) CHECK(batcher_masks_flush(b, err, sizeof err) == 0, "flush: %s", err);
        if (done && !batcher_in_flight(b)) break;
    }
    for (int i = 0; i < NSEQ; i++) {
        if (i % 2 == 0) {
            /* the ids before a final end-of-generation id */
            int n = n_got[i] > 0 && got[i][n_got[i] - 1] == 2 ? n_got[i] - 1 : n_got[i];
            CHECK(fin[i] == WK_FIN_STOP && s_complete(g[i / 2 % 2], v, got[i], n),
                  "ahead %d threads %d seq %d: fin %d, %d tokens, not a complete match", ahead, threads, i, fin[i],
                  n_got[i]);
        } else {
            const int k = 2 * i % 8 + 1; /* golden ids in the prompt after BOS */
            int same = fin[i] == WK_FIN_LENGTH && n_got[i] == 24;
            for (int t = 0; same && t < 24; t++) same = got[i][t] == s_gold[k + t];
            CHECK(same, "ahead %d threads %d seq %d: the unconstrained continuation is golden (fin %d, %d ids)", ahead,
                  threads, i, fin[i], n_got[i]);
        }
    }
    if (ahead == 2) {
        const t_late *a = (const t_late *)e;
        CHECK(a->violations == 0, "threads %d: %d late-mask violations (%s)", threads, a->violations, e->err);
        CHECK(a->late_entries > 20, "threads %d: %d fed entries took late masks", threads, a->late_entries);
    }
    free(ev);
    batcher_destroy(&b);
    free(eog);
    engine_destroy(&e);
}

/* a constrained request where the batcher has no vocabulary is refused; a max_tokens cut ends with length */
static void s_edges(const zl_model *m, const zg_vocab *v, zg_grammar *g) {
    zl_engine *e = s_engine(m);
    if (!e) return;
    char err[256];
    uint8_t *eog = calloc((size_t)m->cfg.vocab_size, 1);
    wk_batcher *b = batcher_new(e, eog, m->cfg.vocab_size, err, sizeof err);
    int32_t prompt[2] = {1, s_gold[0]};
    wk_request r;
    memset(&r, 0, sizeof r);
    r.rid = 1;
    r.tokens = prompt;
    r.n_tokens = 2;
    r.max_tokens = 2;
    r.samp = sampler_defaults();
    r.grammar = g;
    CHECK(b && batcher_add(b, &r, err, sizeof err) == -1 && strstr(err, "structured output"),
          "no vocabulary: refused (%s)", err);
    batcher_set_vocab(b, v);
    r.rid = 2;
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "with the vocabulary: admitted (%s)", err);
    int cap = batcher_event_cap(b), fin = 0, n = 0;
    wk_event *ev = calloc((size_t)cap, sizeof *ev);
    for (int step = 0; step < 20 && !fin; step++) {
        int n_ev = 0;
        if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) break;
        for (int j = 0; j < n_ev; j++)
            if (ev[j].rid == 2) {
                n += ev[j].tok >= 0;
                fin = ev[j].fin;
            }
    }
    CHECK(fin == WK_FIN_LENGTH && n == 2, "max_tokens 2 under a longer grammar: fin %d after %d tokens", fin, n);
    free(ev);
    batcher_destroy(&b);
    free(eog);
    engine_destroy(&e);
}

/* late masks with cancels, late admissions and a destroy while masks are being computed: 6 constrained sampled
 * sequences on 3 mask threads; after the 3rd call two are cancelled (their step in flight still takes late masks)
 * and two more are admitted into the freed slots; every other sequence still ends as a complete match, every
 * cancel is acknowledged once, no step is waited for before its late masks were announced; then a batcher is
 * destroyed with late masks pending (the mask threads finish before the matchers go) */
static void s_late_cancel(const zl_model *m, const zg_vocab *v, zg_grammar *g) {
    for (int pass = 0; pass < 2; pass++) {
        zl_engine *e = s_engine(m);
        e = e ? tl_new(e) : NULL;
        CHECK(e != NULL, "the late-mask engine");
        if (!e) return;
        char err[256];
        uint8_t *eog = calloc((size_t)m->cfg.vocab_size, 1);
        eog[2] = 1;
        wk_batcher *b = batcher_new(e, eog, m->cfg.vocab_size, err, sizeof err);
        CHECK(b && batcher_set_ahead(b, 1) == 1, "late cancel: batcher queued ahead");
        if (!b) {
            free(eog);
            engine_destroy(&e);
            return;
        }
        batcher_set_vocab(b, v);
        CHECK(batcher_set_mask_threads(b, 3, err, sizeof err) == 0, "mask threads: %s", err);
        int32_t prompt[2] = {1, s_gold[0]};
        int32_t got[8][NG];
        int n_got[8] = {0}, fin[8] = {0}, acks[8] = {0};
        wk_request r;
        memset(&r, 0, sizeof r);
        r.tokens = prompt;
        r.n_tokens = 2;
        r.max_tokens = 120;
        r.samp = sampler_defaults();
        r.samp.temperature = 0.9f;
        r.grammar = g;
        for (int i = 0; i < 6; i++) {
            r.rid = 200 + (uint64_t)i;
            r.samp.seed = 11 + (uint64_t)i;
            CHECK(batcher_add(b, &r, err, sizeof err) == 0, "late cancel: add %d: %s", i, err);
        }
        int cap = batcher_event_cap(b);
        wk_event *ev = calloc((size_t)cap, sizeof *ev);
        for (int call = 0; call < 400; call++) {
            if (pass == 1 && call == 4) break; /* destroyed below with late masks pending */
            if (call == 3) {
                CHECK(batcher_cancel(b, 201) == 1 && batcher_cancel(b, 204) == 1, "late cancel: cancels");
                for (int i = 6; i < 8; i++) {
                    r.rid = 200 + (uint64_t)i;
                    r.samp.seed = 11 + (uint64_t)i;
                    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "late cancel: add %d: %s", i, err);
                }
            }
            int n_ev = 0, done = 1;
            if (batcher_step(b, ev, cap, &n_ev, err, sizeof err) < 0) {
                CHECK(0, "late cancel: step: %s", err);
                break;
            }
            for (int j = 0; j < n_ev; j++) {
                int i = (int)(ev[j].rid - 200);
                if (i < 0 || i >= 8) continue;
                if (ev[j].fin == WK_FIN_CANCELLED) {
                    acks[i]++;
                    continue;
                }
                CHECK(!fin[i], "late cancel: seq %d: an event after its final", i);
                if (ev[j].tok >= 0 && n_got[i] < NG) got[i][n_got[i]++] = ev[j].tok;
                if (ev[j].fin) fin[i] = ev[j].fin;
            }
            for (int i = 0; i < 8; i++) done &= fin[i] != 0 || acks[i] != 0;
            if (done && !batcher_in_flight(b)) break;
        }
        if (pass == 0) {
            for (int i = 0; i < 8; i++) {
                if (i == 1 || i == 4) {
                    CHECK(acks[i] == 1 && !fin[i], "late cancel: seq %d acknowledged once (%d), no final", i, acks[i]);
                    continue;
                }
                int n = n_got[i] > 0 && got[i][n_got[i] - 1] == 2 ? n_got[i] - 1 : n_got[i];
                CHECK(fin[i] == WK_FIN_STOP && s_complete(g, v, got[i], n),
                      "late cancel: seq %d: fin %d after %d tokens, a complete match", i, fin[i], n_got[i]);
            }
            CHECK(batcher_free_slots(b) == 6 && !batcher_in_flight(b), "late cancel: every slot back");
        }
        const t_late *a = (const t_late *)e;
        CHECK(a->violations == 0, "late cancel pass %d: %d violations (%s)", pass, a->violations, e->err);
        CHECK(a->late_entries > 0, "late cancel pass %d: late masks taken", pass);
        free(ev);
        batcher_destroy(&b);
        free(eog);
        engine_destroy(&e);
    }
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
    zl_tokenizer *t = m ? tokenizer_new(m->gguf, err, sizeof err) : NULL;
    CHECK(t != NULL, "tokenizer: %s", err);
    zg_vocab *v = t ? grammar_vocab_from_tokenizer(t, err, sizeof err) : NULL;
    CHECK(v != NULL, "vocabulary: %s", err);
    const char *gbnf = "root ::= (\"Once\" | \"The\") (\" \" [a-z]{1,8}){2,6} \".\"\n";
    const char *re = "[A-Z][a-z]{0,6}( [a-z]{1,6}){1,5}[.!]";
    zg_grammar *g[2] = {grammar_compile(ZG_GBNF, gbnf, strlen(gbnf), err, sizeof err),
                        grammar_compile(ZG_REGEX, re, strlen(re), err, sizeof err)};
    CHECK(g[0] && g[1], "grammars: %s", err);
    if (m && v && g[0] && g[1] && ng == NG) {
        static int32_t got[6][NSEQ][NG];
        int n_got[6][NSEQ], fin[6][NSEQ];
        s_run(m, v, g, 0, 1, got[0], n_got[0], fin[0]);
        s_run(m, v, g, 1, 1, got[1], n_got[1], fin[1]);
        s_run(m, v, g, 0, 3, got[2], n_got[2], fin[2]);
        s_run(m, v, g, 1, 3, got[3], n_got[3], fin[3]);
        s_run(m, v, g, 2, 1, got[4], n_got[4], fin[4]);
        s_run(m, v, g, 2, 3, got[5], n_got[5], fin[5]);
        for (int r = 1; r < 6; r++)
            for (int i = 0; i < NSEQ; i++)
                CHECK(n_got[r][i] == n_got[0][i] && fin[r][i] == fin[0][i] &&
                          !memcmp(got[r][i], got[0][i], (size_t)n_got[0][i] * sizeof(int32_t)),
                      "run %d seq %d: %d ids (fin %d), synchronous on one thread %d (fin %d)", r, i, n_got[r][i],
                      fin[r][i], n_got[0][i], fin[0][i]);
        s_late_cancel(m, v, g[0]);
        s_edges(m, v, g[0]);
    }
    grammar_unref(&g[0]);
    grammar_unref(&g[1]);
    grammar_vocab_destroy(&v);
    tokenizer_destroy(&t);
    model_destroy(&m);
    return test_report();
}
