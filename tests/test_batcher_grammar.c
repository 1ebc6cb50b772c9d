/* tests/test_batcher_grammar.c: structured output in the worker's batcher over the real CPU engine on stories260K
 * (a SentencePiece vocabulary with byte-fallback pieces). Sequences with a grammar (GBNF and regex), greedy and
 * sampled, share steps with unconstrained ones, with steps synchronous and queued ahead (where a constrained
 * sequence must never be fed), with the masks on one thread and on three:
 *  - every constrained sequence ends with finish stop, and its tokens' bytes are accepted whole by a fresh
 *    matcher (a complete match);
 *  - the unconstrained sequences give llama2.c's golden greedy ids, as without the others;
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
static void s_run(const zl_model *m, const zg_vocab *v, zg_grammar **g, int ahead, int threads) {
    zl_engine *e = s_engine(m);
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
    batcher_set_ahead(b, ahead);
    batcher_set_vocab(b, v);
    CHECK(batcher_set_mask_threads(b, threads, err, sizeof err) == 0, "mask threads: %s", err);
    /* sequences 0, 2, 4: constrained (grammar g[i / 2 % 2], greedy for 0, sampled for 2 and 4); 1, 3, 5: the
     * golden continuation of BOS + gold[0..k) */
    int32_t prompt[NSEQ][16];
    int32_t got[NSEQ][NG];
    int n_got[NSEQ] = {0}, fin[NSEQ] = {0};
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
        s_run(m, v, g, 0, 1);
        s_run(m, v, g, 1, 1);
        s_run(m, v, g, 0, 3);
        s_run(m, v, g, 1, 3);
        s_edges(m, v, g[0]);
    }
    grammar_unref(&g[0]);
    grammar_unref(&g[1]);
    grammar_vocab_destroy(&v);
    tokenizer_destroy(&t);
    model_destroy(&m);
    return test_report();
}
