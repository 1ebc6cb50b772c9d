/* tests/test_oracle.c: zllm's CPU engines against transformers on the oracle models of tests/data/oracle (made by
 * tests/oracle/make_oracle.py: models built by transformers, written with the gguf package's GGUFWriter as
 * llama.cpp's converter writes them; the list and bounds are oracle_models in tests/oracle_check.h):
 * - RoPE variants and architectures: llama with llama3 frequency factors (rope_freqs.weight, positions to 2099),
 *   linear scaling, YaRN, qwen3 (Q/K norms, tied head; also with YaRN) and phi3 (fused Q/K/V and gate/up,
 *   LongRoPE's long and short factor sets, partial rotary);
 * - gemma3 and sliding windows: gemma3 with its local and global layers (windows crossed by every prompt), with
 *   linear RoPE scaling on the global ones, and a Mistral-style llama sliding on every layer;
 * each in F32 and the BF16 twins (NAME-bf16: transformers ran the same rounded weights).
 * cpu-ref (f32) and cpu (the fast engine; F32 and BF16 weights keep f32 activations, with its own summation
 * order) must match within the case's bound (1e-4 or 1e-3 relative per logits row).
 * Batch and chunking invariance on both engines (oracle_batch, oracle_companion in tests/oracle_check.h).
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
    oracle_batch(m, &c, "cpu-ref", 0, name);
    oracle_batch(m, &c, "cpu", 0, name);
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

int main(void) {
    for (int i = 0; i < ORACLE_N_MODELS; i++) test_case(&oracle_models[i]);
    return test_report();
}
