/* tests/test_oracle.c: zllm's CPU engines against transformers on the oracle models of tests/data/oracle (made by
 * tests/oracle/make_oracle.py: models built by transformers, written with the gguf package's GGUFWriter as
 * llama.cpp's converter writes them; the list and bounds are oracle_models in tests/oracle_check.h):
 * - RoPE variants and architectures: llama with llama3 frequency factors (rope_freqs.weight, positions to 2099),
 *   linear scaling, YaRN, qwen3 (Q/K norms, tied head; also with YaRN) and phi3 (fused Q/K/V and gate/up,
 *   LongRoPE's long and short factor sets, partial rotary; and phi3-hd96: Phi-3 mini's head size 96, full rotary,
 *   its declared window wider than the context);
 * - gemma3 and sliding windows: gemma3 with its local and global layers (windows crossed by every prompt), with
 *   linear RoPE scaling on the global ones, and a Mistral-style llama sliding on every layer;
 * each in F32 and the BF16 twins (NAME-bf16: transformers ran the rounded weights; the RoPE cases' twins have a
 * smaller Q/K scale, tests/oracle/make_oracle.py says why).
 * cpu-ref (f32) and cpu (the fast engine; F32 and BF16 weights keep f32 activations, with its own summation
 * order) must match within the case's bound (1e-4 or 1e-3 relative per logits row).
 * Batch and chunking invariance on both engines (oracle_batch, oracle_companion in tests/oracle_check.h), and
 * gemma3 split into two pipeline stages gives the whole engine's logits bitwise.
 * Each case also runs with its variant switched off (scaling gone, factors dropped, Q/K norms skipped, no sliding
 * window): the logits must then miss the oracle by far, so the comparison sees the variant (an unscaled or
 * unwindowed run never passes). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "test.h"
#include "oracle_check.h"

/* m with its variant switched off: the function zllm computed before it knew the variant */
static zl_model s_plain(const zl_model *m) {
    zl_model p = *m;
    p.cfg.rope_scaling = ZL_ROPE_SCALING_NONE;
    p.cfg.rope_scale = p.cfg.rope_scale_swa = 1.0f;
    p.cfg.rope_attn_factor = 1.0f;
    p.cfg.rope_yarn_attn = 1.0f;
    p.cfg.rope_ext_factor = 0.0f;
    p.cfg.has_qk_norm = 0;
    p.cfg.swa_window = 0;
    memset(&p.rope_freqs, 0, sizeof p.rope_freqs);
    memset(&p.rope_long, 0, sizeof p.rope_long);
    memset(&p.rope_short, 0, sizeof p.rope_short);
    return p;
}

static void test_case(const oracle_model *om) {
    oracle_case c;
    zl_model *m;
    if (oracle_open(om, &c, &m) != 0) return;
    const char *name = om->name;
    const double bound = om->cpu_bound;
    double ref = oracle_run(m, &c, "cpu-ref", 0);
    CHECK(ref >= 0 && ref <= bound, "%s: cpu-ref vs transformers: max rel err %.3g > %g", name, ref, bound);
    double fast = oracle_run(m, &c, "cpu", 0);
    CHECK(fast >= 0 && fast <= bound, "%s: cpu vs transformers: max rel err %.3g > %g", name, fast, bound);
    oracle_batch(m, &c, "cpu-ref", 0, name, 0);
    oracle_batch(m, &c, "cpu", 0, name, 0);
    oracle_companion(m, &c, "cpu-ref", 0, name);
    oracle_companion(m, &c, "cpu", 0, name);
    zl_model plain = s_plain(m);
    double off = oracle_run(&plain, &c, "cpu-ref", 0);
    CHECK(off > 1e-2, "%s: with the variant off the logits still match (%.3g): the check is blind to it", name, off);
    printf("%s: %d rows x %d logits vs transformers: cpu-ref %.3g, cpu %.3g (bound %.0e; variant off: %.3g)\n", name,
           c.n_rows, c.vocab, ref, fast, bound, off);
    model_destroy(&m);
    oracle_free(&c);
}

/* pipeline stages: layers [0, 4) and [4, 6) of gemma3-swa (the embedding scale in the first, the global layer 5 in
 * the second; each layer keeps its own window and RoPE table) chained through hidden states give bitwise the whole
 * engine's logits over oracle prompt 0: its prefill to the first check, then decode steps past the window */
static void chain_check(const char *device) {
    static const oracle_model om = {"gemma3-swa", ZL_ARCH_GEMMA3, 1e-4};
    oracle_case c;
    char err[512];
    zl_engine *whole = NULL, *part[2] = {NULL, NULL};
    float *lw = NULL, *lp = NULL, *h = NULL;
    zl_model *m = NULL;
    if (oracle_open(&om, &c, &m)) return;
    const oracle_prompt *p = &c.p[0];
    const int n_prefill = p->checks[0] + 1;
    zl_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.device = device;
    eo.n_slots = 1;
    eo.max_batch = 1;
    eo.n_ctx = p->n_ctx;
    eo.threads = 2;
    whole = engine_new(m, &eo, err, sizeof err);
    for (int i = 0; i < 2; i++) {
        zl_engine_opts po = eo;
        po.layer_begin = i ? 4 : 0;
        po.layer_end = i ? 6 : 4;
        part[i] = engine_new(m, &po, err, sizeof err);
    }
    CHECK(whole && part[0] && part[1], "%s: engines: %s", device, err);
    if (!whole || !part[0] || !part[1]) goto done;
    const int V = c.vocab, D = m->cfg.dim;
    lw = (float *)malloc(sizeof(float) * V);
    lp = (float *)malloc(sizeof(float) * V);
    h = (float *)malloc(sizeof(float) * (size_t)n_prefill * D);
    if (!lw || !lp || !h) goto done;
    int same = 1, steps = 0;
    for (int pos = 0; pos < p->n_tokens; steps++) {
        const int nt = pos == 0 ? n_prefill : 1;
        zl_seq s;
        memset(&s, 0, sizeof s);
        s.slot = 0;
        s.pos = pos;
        s.n_tokens = nt;
        s.tokens = p->tokens + pos;
        s.sample = 1;
        int32_t tw, tp;
        zl_step st;
        memset(&st, 0, sizeof st);
        st.seqs = &s;
        st.n = 1;
        st.sync = 1;
        st.h_out = h;
        int rc = engine_step(whole, &s, 1, &tw, lw) || engine_run(part[0], &st);
        memset(&st, 0, sizeof st);
        st.seqs = &s;
        st.n = 1;
        st.sync = 1;
        st.h_in = h;
        st.out_tokens = &tp;
        st.out_logits = lp;
        rc = rc || engine_run(part[1], &st);
        CHECK(rc == 0, "%s: chain step at %d: %s / %s / %s", device, pos, whole->err, part[0]->err, part[1]->err);
        if (rc) break;
        same &= memcmp(lw, lp, sizeof(float) * V) == 0 && tw == tp;
        pos += nt;
    }
    CHECK(same, "%s: 2 stages of gemma3-swa differ from the whole engine", device);
    printf("gemma3-swa on %s: 2 stages %s the whole engine's logits over %d steps\n", device,
           same ? "give bitwise" : "DIFFER from", steps);
done:
    free(lw);
    free(lp);
    free(h);
    engine_destroy(&whole);
    for (int i = 0; i < 2; i++) engine_destroy(&part[i]);
    model_destroy(&m);
    oracle_free(&c);
}

/* model_attn_window (the window kernels run only where a window is below the engine's context): phi3-hd96's 2047
 * on every layer, gemma3-swa's 16 on its sliding layers and none on its global layer 5 */
static void window_choice(void) {
    char err[512];
    zl_model *m = model_load("tests/data/oracle/phi3-hd96.gguf", err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (m) {
        const zl_config *c = &m->cfg;
        CHECK(model_layer_window(c, 1) == 2047, "phi3-hd96: layer window %d", model_layer_window(c, 1));
        CHECK(model_attn_window(c, 1, 1024) == 0 && model_attn_window(c, 1, 2047) == 0,
              "phi3-hd96: a window of 2047 must not apply to contexts up to 2047");
        CHECK(model_attn_window(c, 1, 2048) == 2047 && model_attn_window(c, 0, 4096) == 2047,
              "phi3-hd96: a window of 2047 must apply to contexts above it");
        model_destroy(&m);
    }
    m = model_load("tests/data/oracle/gemma3-swa.gguf", err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (m) {
        const zl_config *c = &m->cfg;
        CHECK(model_attn_window(c, 0, 128) == 16 && model_attn_window(c, 5, 128) == 0 &&
                  model_attn_window(c, 0, 16) == 0 && model_attn_window(c, 0, 17) == 16,
              "gemma3-swa: windows %d %d %d %d", model_attn_window(c, 0, 128), model_attn_window(c, 5, 128),
              model_attn_window(c, 0, 16), model_attn_window(c, 0, 17));
        model_destroy(&m);
    }
}

int main(void) {
    for (int i = 0; i < ORACLE_N_MODELS; i++) test_case(&oracle_models[i]);
    window_choice();
    chain_check("cpu-ref");
    chain_check("cpu");
    return test_report();
}
