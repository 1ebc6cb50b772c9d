/* tests/test_engine.c: the CPU engine on stories260K (golden greedy ids from llama2.c's run.c), model
 * validation (malformed configurations refused by name), the sampler, and batch invariance: sequences with
 * different prompts and lengths, joining the batch at different steps, give bitwise the same logits and
 * greedy tokens as each run alone, whatever the thread count; steps queued ahead with tokens fed from the
 * previous step (tests/launch_check.h) give the tokens of synchronous steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine.h"
#include "gguf_write.h"
#include "model.h"
#include "sampler.h"
#include "test.h"
#include "launch_check.h"

static char s_path[1024];

/* golden ids file -> ids[]; returns count */
static int load_ids(const char *path, int32_t *ids, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, v;
    while (n < max && fscanf(f, "%d", &v) == 1) ids[n++] = v;
    fclose(f);
    return n;
}

static zl_engine *new_engine(const zl_model *m, int slots, int threads, int n_ctx) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu-ref";
    o.n_slots = slots;
    o.max_batch = slots;
    o.n_ctx = n_ctx;
    o.threads = threads;
    o.max_step_tokens = 256;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new: %s", err);
    return e;
}

/* ------------------------------------------------------------------------------------------------------------
 * model validation: variants of stories260K with one thing wrong must be refused with a message naming it */

typedef struct {
    const char *key;           /* metadata key */
    char kind;                 /* 'd' drop, 'i' u32, 's' string, 'f' f32 */
    long long i;               /* value for 'i' */
    const char *s;             /* value for 's' */
    double f;                  /* value for 'f' */
} kv_edit;

/* stories260K with the metadata edits applied, tensor `drop` left out, tensor `as_i32` re-typed I32 (same bytes)
 * and, when add_bias, a zero blk.0.attn_q.bias */
static int write_variant(const char *out, const kv_edit *ed, int ned, const char *drop, const char *as_i32,
                         int add_bias) {
    char err[256];
    gguf *g = gguf_open(s_path, err, sizeof err);
    gguf_writer *w = gguf_writer_new();
    int rc = -1;
    if (!g || !w) goto out;
    int *used = calloc((size_t)ned + 1, sizeof(int));
    for (uint64_t k = 0; k < g->n_kv; k++) {
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)g->kv[k].key.len, g->kv[k].key.ptr);
        int e = -1;
        for (int j = 0; j < ned; j++)
            if (!strcmp(ed[j].key, key)) e = j;
        if (e < 0) {
            gguf_writer_set_value(w, key, &g->kv[k].val);
            continue;
        }
        used[e] = 1;
        if (ed[e].kind == 'i') gguf_writer_set_u32(w, key, (uint32_t)ed[e].i);
        else if (ed[e].kind == 's') gguf_writer_set_str(w, key, ed[e].s);
        else if (ed[e].kind == 'f') gguf_writer_set_f32(w, key, (float)ed[e].f);
    }
    for (int j = 0; j < ned; j++) {
        if (used[j]) continue;
        if (ed[j].kind == 'i') gguf_writer_set_u32(w, ed[j].key, (uint32_t)ed[j].i);
        else if (ed[j].kind == 's') gguf_writer_set_str(w, ed[j].key, ed[j].s);
        else if (ed[j].kind == 'f') gguf_writer_set_f32(w, ed[j].key, (float)ed[j].f);
    }
    free(used);
    for (uint64_t t = 0; t < g->n_tensors; t++) {
        const gguf_tensor *x = &g->tensors[t];
        if (drop && !strcmp(x->name, drop)) continue;
        ggml_type ty = as_i32 && !strcmp(x->name, as_i32) ? GGML_I32 : x->type;
        gguf_writer_add_tensor(w, x->name, (int)x->n_dims, x->ne, ty);
    }
    int64_t bne[1] = { 64 };
    if (add_bias) gguf_writer_add_tensor(w, "blk.0.attn_q.bias", 1, bne, GGML_F32);
    if (gguf_writer_open(w, out, err, sizeof err)) goto out;
    for (uint64_t t = 0; t < g->n_tensors; t++) {
        const gguf_tensor *x = &g->tensors[t];
        if (drop && !strcmp(x->name, drop)) continue;
        if (gguf_writer_append(w, x->data, x->nbytes, err, sizeof err)) goto out;
    }
    float zeros[64] = { 0 };
    if (add_bias && gguf_writer_append(w, zeros, sizeof zeros, err, sizeof err)) goto out;
    rc = gguf_writer_close(w, err, sizeof err);
out:
    if (rc) fprintf(stderr, "write_variant: %s\n", err);
    gguf_writer_destroy(&w);
    gguf_close(&g);
    return rc;
}

static void expect_refused(const char *what, const kv_edit *ed, int ned, const char *drop, const char *as_i32,
                           int add_bias, const char *needle) {
    char path[] = "/tmp/zllm-variant-XXXXXX", err[512] = "";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    CHECK(write_variant(path, ed, ned, drop, as_i32, add_bias) == 0, "%s: cannot write the variant", what);
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m == NULL, "%s: loaded, should be refused", what);
    CHECK(m != NULL || strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
    model_destroy(&m);
    unlink(path);
}

static void test_validation(void) {
    kv_edit e;
    e = (kv_edit){ "general.architecture", 's', 0, "gpt2", 0 };
    expect_refused("unknown architecture", &e, 1, NULL, NULL, 0, "gpt2");
    e = (kv_edit){ "llama.attention.head_count", 'i', 7, NULL, 0 };
    expect_refused("heads not dividing dim", &e, 1, NULL, NULL, 0, "head");
    e = (kv_edit){ "llama.attention.head_count_kv", 'i', 3, NULL, 0 };
    expect_refused("kv heads not dividing heads", &e, 1, NULL, NULL, 0, "KV heads");
    e = (kv_edit){ "llama.attention.head_count_kv", 'i', 16, NULL, 0 };
    expect_refused("more kv heads than heads", &e, 1, NULL, NULL, 0, "head_count_kv");
    e = (kv_edit){ "llama.block_count", 'i', 6, NULL, 0 };
    expect_refused("more blocks than tensors", &e, 1, NULL, NULL, 0, "blk.5.");
    e = (kv_edit){ "llama.block_count", 'i', 0, NULL, 0 };
    expect_refused("zero blocks", &e, 1, NULL, NULL, 0, "block_count");
    e = (kv_edit){ "llama.block_count", 's', 0, "five", 0 };
    expect_refused("block_count not an integer", &e, 1, NULL, NULL, 0, "block_count");
    e = (kv_edit){ "llama.block_count", 'd', 0, NULL, 0 };
    expect_refused("block_count missing", &e, 1, NULL, NULL, 0, "block_count");
    e = (kv_edit){ "llama.embedding_length", 'i', 128, NULL, 0 };
    expect_refused("dim vs tensor shapes", &e, 1, NULL, NULL, 0, "shape");
    e = (kv_edit){ "llama.attention.key_length", 'i', 16, NULL, 0 };
    expect_refused("head dim vs tensor shapes", &e, 1, NULL, NULL, 0, "attn_q");
    e = (kv_edit){ "llama.feed_forward_length", 'i', 171, NULL, 0 };
    expect_refused("ffn vs tensor shapes", &e, 1, NULL, NULL, 0, "ffn_gate");
    e = (kv_edit){ "llama.rope.dimension_count", 'i', 7, NULL, 0 };
    expect_refused("odd rope dims", &e, 1, NULL, NULL, 0, "odd");
    e = (kv_edit){ "llama.rope.dimension_count", 'i', 16, NULL, 0 };
    expect_refused("rope dims > head dim", &e, 1, NULL, NULL, 0, "rope.dimension_count");
    e = (kv_edit){ "llama.attention.layer_norm_rms_epsilon", 'f', 0, NULL, -1.0 };
    expect_refused("negative eps", &e, 1, NULL, NULL, 0, "epsilon");
    e = (kv_edit){ "llama.rope.freq_base", 'f', 0, NULL, NAN };
    expect_refused("NaN rope base", &e, 1, NULL, NULL, 0, "freq_base");
    e = (kv_edit){"llama.rope.scaling.type", 's', 0, "dynamic", 0};
    expect_refused("unknown rope scaling type", &e, 1, NULL, NULL, 0, "scaling");
    expect_refused("missing tensor", NULL, 0, "blk.2.ffn_up.weight", NULL, 0, "blk.2.ffn_up.weight");
    expect_refused("missing norm", NULL, 0, "output_norm.weight", NULL, 0, "output_norm.weight");
    expect_refused("missing embeddings", NULL, 0, "token_embd.weight", NULL, 0, "token_embd.weight");
    expect_refused("unsupported tensor type", NULL, 0, NULL, "blk.1.attn_k.weight", 0, "I32");
    expect_refused("llama with a bias", NULL, 0, NULL, NULL, 1, "bias");
    kv_edit q2[] = { { "general.architecture", 's', 0, "qwen2", 0 }, { "qwen2.block_count", 'i', 5, NULL, 0 },
                     { "qwen2.embedding_length", 'i', 64, NULL, 0 }, { "qwen2.feed_forward_length", 'i', 172, NULL, 0 },
                     { "qwen2.attention.head_count", 'i', 8, NULL, 0 }, { "qwen2.attention.head_count_kv", 'i', 4, NULL, 0 } };
    expect_refused("qwen2 without biases", q2, 6, NULL, NULL, 0, "bias");

    /* positive: no output.weight means tied embeddings */
    char path[] = "/tmp/zllm-variant-XXXXXX", err[512];
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(fd >= 0 && write_variant(path, NULL, 0, "output.weight", NULL, 0) == 0, "tied variant written");
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m && m->cfg.tied_embeddings && m->output.data == m->tok_embd.data, "absent output.weight => tied: %s",
          m ? "" : err);
    model_destroy(&m);
    unlink(path);
}

static void test_golden(const zl_model *m) {
    int32_t gold[256];
    char p[1100];
    snprintf(p, sizeof p, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    int ng = load_ids(p, gold, 256);
    CHECK(ng == 200, "golden ids: %d read from %s", ng, p);
    if (ng != 200) return;
    zl_engine *e = new_engine(m, 1, 2, 256);
    if (!e) return;
    int32_t tok = 1, out = -1;   /* BOS */
    int same = 0;
    for (int i = 0; i < 200; i++) {
        zl_seq s = { .slot = 0, .pos = i, .n_tokens = 1, .tokens = &tok, .sample = 1 };
        if (engine_step(e, &s, 1, &out, NULL) != 0) {
            CHECK(0, "step %d: %s", i, e->err);
            break;
        }
        if (out != gold[i]) {
            CHECK(0, "greedy token %d: got %d, golden %d", i, out, gold[i]);
            break;
        }
        same++;
        tok = out;
    }
    CHECK(same == 200, "%d of 200 golden greedy tokens", same);
    engine_destroy(&e);
    CHECK(e == NULL, "engine_destroy NULLs");
    engine_destroy(&e);   /* idempotent */
}

/* Batch invariance. Each sequence i has a prompt of plen[i] tokens, joins at step join[i] (prefilling its
 * prompt in chunks of chunk[i] tokens), then decodes greedily; we record the logits of every step. */
#define NSEQ 5
#define NDEC 6
#define MAXSTEPS 32
typedef struct {
    int32_t toks[64];          /* prompt then generated */
    int n;                     /* tokens known */
    int fed;                   /* tokens already in the cache */
    int plen, join, chunk;
    float *logits[MAXSTEPS];   /* logits after each step that sampled */
    int n_logits;
    int gen;                   /* decode tokens produced */
} seqstate;

static void run_batch(const zl_model *m, int threads, seqstate *ss, const int *which, int nw) {
    zl_engine *e = new_engine(m, NSEQ, threads, 128);
    if (!e) return;
    int V = m->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * V * NSEQ);
    for (int step = 0; step < MAXSTEPS; step++) {
        zl_seq sq[NSEQ];
        int idx[NSEQ], n = 0;
        for (int w = 0; w < nw; w++) {
            int i = which[w];
            seqstate *s = &ss[i];
            if (step < s->join || s->gen >= NDEC) continue;
            int left = s->n - s->fed, nt = left;
            if (s->fed < s->plen && nt > s->chunk) nt = s->chunk;
            /* the slot is the position in the batch order, reversed, so slots differ between runs */
            sq[n] = (zl_seq){ .slot = NSEQ - 1 - i, .pos = s->fed, .n_tokens = nt, .tokens = s->toks + s->fed,
                              .sample = s->fed + nt == s->n };
            idx[n++] = i;
        }
        if (n == 0) continue;
        int32_t out[NSEQ];
        if (engine_step(e, sq, n, out, lg) != 0) {
            CHECK(0, "step: %s", e->err);
            break;
        }
        for (int k = 0; k < n; k++) {
            seqstate *s = &ss[idx[k]];
            s->fed += sq[k].n_tokens;
            if (!sq[k].sample) {
                CHECK(out[k] == -1, "prefill chunk returns -1, got %d", out[k]);
                continue;
            }
            s->logits[s->n_logits] = malloc(sizeof(float) * V);
            memcpy(s->logits[s->n_logits++], lg + (size_t)k * V, sizeof(float) * V);
            s->toks[s->n++] = out[k];
            s->gen++;
        }
    }
    free(lg);
    engine_destroy(&e);
}

static void init_seqs(seqstate *ss, int vocab) {
    static const int plen[NSEQ] = { 1, 7, 13, 3, 20 }, join[NSEQ] = { 0, 0, 2, 3, 5 }, chunk[NSEQ] = { 1, 7, 5, 1, 8 };
    memset(ss, 0, sizeof(seqstate) * NSEQ);
    for (int i = 0; i < NSEQ; i++) {
        ss[i].plen = plen[i];
        ss[i].join = join[i];
        ss[i].chunk = chunk[i];
        ss[i].toks[0] = 1;
        for (int t = 1; t < plen[i]; t++) ss[i].toks[t] = (int32_t)(3 + (i * 97 + t * 31) % (vocab - 3));
        ss[i].n = plen[i];
    }
}

static void free_seqs(seqstate *ss) {
    for (int i = 0; i < NSEQ; i++)
        for (int k = 0; k < ss[i].n_logits; k++) free(ss[i].logits[k]);
}

static void test_batch_invariance(const zl_model *m) {
    seqstate all[NSEQ], alone[NSEQ];
    int every[NSEQ] = { 0, 1, 2, 3, 4 };
    init_seqs(all, m->cfg.vocab_size);
    run_batch(m, 2, all, every, NSEQ);
    init_seqs(alone, m->cfg.vocab_size);
    for (int i = 0; i < NSEQ; i++) {
        alone[i].join = 0;
        alone[i].chunk = alone[i].plen;   /* alone: the whole prompt in one step, one thread */
        run_batch(m, 1, alone, &every[i], 1);
    }
    int V = m->cfg.vocab_size;
    for (int i = 0; i < NSEQ; i++) {
        CHECK(all[i].n_logits == NDEC && alone[i].n_logits == NDEC, "seq %d: %d / %d decode steps", i,
              all[i].n_logits, alone[i].n_logits);
        int same_tok = all[i].n == alone[i].n && memcmp(all[i].toks, alone[i].toks, sizeof(int32_t) * all[i].n) == 0;
        CHECK(same_tok, "seq %d: batched greedy tokens differ from alone", i);
        int same = 1;
        for (int k = 0; k < all[i].n_logits && k < alone[i].n_logits; k++)
            if (memcmp(all[i].logits[k], alone[i].logits[k], sizeof(float) * V) != 0) same = 0;
        CHECK(same, "seq %d: batched logits are not bitwise equal to alone", i);
    }
    free_seqs(all);
    free_seqs(alone);
}

static void test_bad_steps(const zl_model *m) {
    zl_engine *e = new_engine(m, 2, 1, 16);
    if (!e) return;
    int32_t t[20] = { 1 }, out[2];
    zl_seq s = { .slot = 0, .pos = 0, .n_tokens = 1, .tokens = t, .sample = 1 };
    zl_seq bad = s;
    bad.slot = 2;
    CHECK(engine_step(e, &bad, 1, out, NULL) == -1 && strstr(e->err, "slot"), "bad slot: %s", e->err);
    bad = s;
    bad.pos = 10;
    bad.n_tokens = 7;
    CHECK(engine_step(e, &bad, 1, out, NULL) == -1, "past the context refused");
    bad = s;
    int32_t bt = 512;
    bad.tokens = &bt;
    CHECK(engine_step(e, &bad, 1, out, NULL) == -1 && strstr(e->err, "vocab"), "token out of vocab: %s", e->err);
    zl_seq two[2] = { s, s };
    CHECK(engine_step(e, two, 2, out, NULL) == -1 && strstr(e->err, "twice"), "same slot twice: %s", e->err);
    CHECK(engine_step(e, two, 3, out, NULL) == -1, "more than max_batch refused");
    zl_sampling sp = sampler_defaults();
    sp.temperature = 1.0f;
    bad = s;
    bad.samp = &sp;
    CHECK(engine_step(e, &bad, 1, out, NULL) == -1 && strstr(e->err, "rng"), "temperature without rng: %s", e->err);
    CHECK(engine_step(e, &s, 1, out, NULL) == 0 && out[0] >= 0, "a good step still runs after errors");
    engine_destroy(&e);
}

static void test_sampler(void) {
    float lg[8];
    const float base[8] = { 1.0f, 3.0f, 3.0f, 0.5f, -2.0f, 2.9f, -1.0f, 0.0f };
    memcpy(lg, base, sizeof lg);
    CHECK(sampler_sample(lg, 8, NULL, NULL, 0, NULL) == 1, "greedy picks the lowest id among ties");
    zl_sampling s = sampler_defaults();
    memcpy(lg, base, sizeof lg);
    CHECK(sampler_sample(lg, 8, &s, NULL, 0, NULL) == 1, "defaults are greedy");
    /* repetition penalty: 1 and 2 penalised (3 -> 1.5), so 5 (2.9) wins; a repeated id is penalised once */
    s.repeat_penalty = 2.0f;
    s.repeat_last_n = 8;
    int32_t hist[4] = { 1, 2, 1, 1 };
    memcpy(lg, base, sizeof lg);
    CHECK(sampler_sample(lg, 8, &s, hist, 4, NULL) == 5, "repetition penalty");
    CHECK(lg[1] == 1.5f && lg[2] == 1.5f, "penalised once: %g %g", lg[1], lg[2]);
    s.repeat_last_n = 2;   /* only {1, 1}: 2 keeps 3.0 */
    memcpy(lg, base, sizeof lg);
    CHECK(sampler_sample(lg, 8, &s, hist, 4, NULL) == 2, "repeat_last_n window");
    /* negative logits are multiplied */
    int32_t h4 = 4;
    memcpy(lg, base, sizeof lg);
    sampler_sample(lg, 8, &s, &h4, 1, NULL);
    CHECK(lg[4] == -4.0f, "negative logit multiplied: %g", lg[4]);

    /* top-k 1 = greedy whatever the temperature; the same seed gives the same draws */
    s = sampler_defaults();
    s.temperature = 5.0f;
    s.top_k = 1;
    uint64_t rng = sampler_rng_init(42);
    int ok = 1;
    for (int i = 0; i < 50; i++) {
        memcpy(lg, base, sizeof lg);
        ok &= sampler_sample(lg, 8, &s, NULL, 0, &rng) == 1;
    }
    CHECK(ok, "top-k 1 is greedy");
    s.top_k = 0;
    int seqa[200], seqb[200], counts[8] = { 0 };
    uint64_t ra = sampler_rng_init(7), rb = sampler_rng_init(7), rc = sampler_rng_init(8);
    int diff = 0;
    for (int i = 0; i < 200; i++) {
        memcpy(lg, base, sizeof lg);
        seqa[i] = sampler_sample(lg, 8, &s, NULL, 0, &ra);
        memcpy(lg, base, sizeof lg);
        seqb[i] = sampler_sample(lg, 8, &s, NULL, 0, &rb);
        memcpy(lg, base, sizeof lg);
        diff += sampler_sample(lg, 8, &s, NULL, 0, &rc) != seqa[i];
        counts[seqa[i]]++;
    }
    CHECK(memcmp(seqa, seqb, sizeof seqa) == 0, "same seed, same tokens");
    CHECK(diff > 0, "another seed gives other tokens");
    int used = 0;
    for (int i = 0; i < 8; i++) used += counts[i] > 0;
    CHECK(used >= 6, "temperature 5 spreads over the vocabulary (%d ids used)", used);
    /* top-p: p(1) = p(2) ~ 0.35 each at T=1; top_p 0.5 keeps {1, 2} only */
    s.temperature = 1.0f;
    s.top_p = 0.5f;
    int only12 = 1, saw1 = 0, saw2 = 0;
    for (int i = 0; i < 200; i++) {
        memcpy(lg, base, sizeof lg);
        int id = sampler_sample(lg, 8, &s, NULL, 0, &ra);
        only12 &= id == 1 || id == 2;
        saw1 |= id == 1;
        saw2 |= id == 2;
    }
    CHECK(only12 && saw1 && saw2, "top-p 0.5 keeps exactly the two top tokens");
    /* min-p 0.8: keeps p >= 0.8 p_max: ids 1, 2 (p_max) and 5 (e^-0.1 = 0.905) */
    s.top_p = 1.0f;
    s.min_p = 0.8f;
    int in125 = 1, saw5 = 0;
    for (int i = 0; i < 300; i++) {
        memcpy(lg, base, sizeof lg);
        int id = sampler_sample(lg, 8, &s, NULL, 0, &ra);
        in125 &= id == 1 || id == 2 || id == 5;
        saw5 |= id == 5;
    }
    CHECK(in125 && saw5, "min-p keeps the tokens within the ratio");
    float u = 0;
    uint64_t r = sampler_rng_init(1);
    int inrange = 1;
    for (int i = 0; i < 10000; i++) {
        u = sampler_rng_uniform(&r);
        inrange &= u >= 0.0f && u < 1.0f;
    }
    CHECK(inrange, "uniform in [0, 1)");
}

int main(void) {
    char err[512];
    snprintf(s_path, sizeof s_path, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(s_path, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    test_sampler();
    test_validation();
    if (m) {
        const zl_config *c = &m->cfg;
        CHECK(c->arch == ZL_ARCH_LLAMA && c->n_layers == 5 && c->dim == 64 && c->n_heads == 8 &&
              c->n_kv_heads == 4 && c->head_dim == 8 && c->ffn_dim == 172 && c->vocab_size == 512 &&
              c->rope_dim == 8 && c->rope_style == ZL_ROPE_ADJACENT && !c->tied_embeddings && !c->has_qkv_bias,
              "stories260K configuration");
        test_golden(m);
        test_bad_steps(m);
        test_batch_invariance(m);
        /* steps queued ahead with fed tokens give the synchronous run's tokens (tests/launch_check.h) */
        zl_engine *e = new_engine(m, 16, 2, 128);
        if (e) {
            launch_check_refusals(e, "stories260K cpu");
            launch_check_tokens(e, "stories260K cpu", c->vocab_size, 24);
        }
        engine_destroy(&e);
    }
    /* again on qwen2 (RoPE on halves, Q/K/V biases, tied LM head, heads * head_dim != dim) */
    zl_model *q = model_load("tests/ref/tiny-qwen2.gguf", err, sizeof err);
    CHECK(q != NULL, "model_load: %s (run from the repository root)", err);
    if (q) {
        CHECK(q->cfg.arch == ZL_ARCH_QWEN2 && q->cfg.has_qkv_bias && q->cfg.tied_embeddings &&
              q->cfg.rope_style == ZL_ROPE_HALVES && q->cfg.n_heads * q->cfg.head_dim != q->cfg.dim,
              "tiny-qwen2 configuration");
        test_batch_invariance(q);
    }
    model_destroy(&q);
    model_destroy(&m);
    CHECK(m == NULL, "model_destroy NULLs");
    model_destroy(&m);
    CHECK(model_load("/nonexistent.gguf", err, sizeof err) == NULL, "missing file refused");
    return test_report();
}
