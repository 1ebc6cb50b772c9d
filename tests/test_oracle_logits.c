/* tests/test_oracle_logits.c: zllm's CPU engines against transformers on the RoPE variants and architectures
 * (tests/data/oracle, made by tests/oracle/make_oracle.py: models built by transformers, written with the gguf
 * package's GGUFWriter): llama with llama3 frequency factors (rope_freqs.weight, positions to 2099), linear
 * scaling, YaRN, qwen3 (Q/K norms, tied head; also with YaRN) and phi3 (fused Q/K/V and gate/up, LongRoPE's long
 * and short factor sets, partial rotary), each in F32 and with BF16 matrices (NAME-bf16: transformers ran the same
 * rounded weights).
 * cpu-ref (f32) must match within 1e-4 relative, cpu (the fast engine; F32 and BF16 weights keep f32 activations,
 * with its own summation order) within 1e-3.
 * Batch invariance: a prompt's logits are bitwise the same with a second sequence in every step, on both engines.
 * Each case also runs with its variant switched off (scaling gone, factors dropped, Q/K norms skipped): the
 * logits must then miss the oracle by far, so the comparison sees the variant (an unscaled run never passes). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "test.h"
#include "oracle_check.h"

/* m with its variant switched off: the function zllm computed before it knew the variant */
static zl_model s_plain(const zl_model *m) {
    zl_model p = *m;
    p.cfg.rope_scaling = ZL_ROPE_SCALING_NONE;
    p.cfg.rope_scale = 1.0f;
    p.cfg.rope_attn_factor = 1.0f;
    p.cfg.rope_yarn_attn = 1.0f;
    p.cfg.rope_ext_factor = 0.0f;
    p.cfg.has_qk_norm = 0;
    memset(&p.rope_freqs, 0, sizeof p.rope_freqs);
    memset(&p.rope_long, 0, sizeof p.rope_long);
    memset(&p.rope_short, 0, sizeof p.rope_short);
    return p;
}

/* batch invariance on device dev: prompt 0 of c prefilled in its check chunks alone, then again with a second
 * sequence (other tokens, other positions) in every step; the first sequence's logits must be bitwise equal */
static void s_batch_invariance(const zl_model *m, const oracle_case *c, const char *dev, const char *name) {
    const oracle_prompt *p = &c->p[0];
    char err[512];
    size_t V = (size_t)c->vocab;
    float *solo = calloc((size_t)p->n_checks * V, sizeof(float)), *lg = calloc(2 * V, sizeof(float));
    int32_t *other = calloc((size_t)p->n_tokens + 16, sizeof(int32_t));
    int same = solo && lg && other;
    for (int i = 0; other && i < p->n_tokens + 16; i++) other[i] = (int32_t)((i * 37 + 11) % c->vocab);
    for (int pass = 0; pass < 2 && same; pass++) {
        zl_engine_opts o;
        memset(&o, 0, sizeof o);
        o.device = dev;
        o.n_slots = 2;
        o.max_batch = 2;
        o.n_ctx = p->n_ctx;
        o.max_step_tokens = 2 * p->n_tokens + 16;
        o.threads = 2;
        zl_engine *e = engine_new(m, &o, err, sizeof err);
        CHECK(e != NULL, "%s: %s: engine_new: %s", name, dev, err);
        if (!e) return;
        int pos = 0, opos = 0;
        for (int k = 0; k < p->n_checks && same; k++) {
            zl_seq s[2];
            int32_t tok[2];
            memset(s, 0, sizeof s);
            s[0].slot = 0;
            s[0].pos = pos;
            s[0].n_tokens = p->checks[k] + 1 - pos;
            s[0].tokens = p->tokens + pos;
            s[0].sample = 1;
            /* the companion: 1 to 3 tokens per step (decode-like and short prefills), in slot 1 */
            s[1].slot = 1;
            s[1].pos = opos;
            s[1].n_tokens = 1 + k % 3;
            s[1].tokens = other + (opos % p->n_tokens);
            s[1].sample = 1;
            if (opos + s[1].n_tokens > p->n_ctx || opos % p->n_tokens + s[1].n_tokens > p->n_tokens + 16) break;
            if (engine_step(e, s, pass + 1, tok, lg) != 0) {
                CHECK(0, "%s: %s: step: %s", name, dev, e->err);
                same = 0;
                break;
            }
            if (pass == 0) memcpy(solo + (size_t)k * V, lg, V * sizeof(float));
            else same = memcmp(solo + (size_t)k * V, lg, V * sizeof(float)) == 0;
            pos = p->checks[k] + 1;
            opos += s[1].n_tokens;
        }
        engine_destroy(&e);
    }
    CHECK(same, "%s: %s: logits of a sequence change when another shares its steps", name, dev);
    free(solo);
    free(lg);
    free(other);
}

static void test_case(const char *name, zl_arch arch) {
    oracle_case c;
    if (oracle_read(name, &c) != 0) {
        oracle_free(&c);
        return;
    }
    char path[256], err[512];
    snprintf(path, sizeof path, "tests/data/oracle/%s.gguf", name);
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (m) {
        CHECK(m->cfg.arch == arch, "%s: architecture %d, expected %d", name, (int)m->cfg.arch, (int)arch);
        CHECK(m->cfg.vocab_size == c.vocab, "%s: vocab %d vs %d", name, m->cfg.vocab_size, c.vocab);
        double ref = oracle_run(m, &c, "cpu-ref", 0);
        CHECK(ref >= 0 && ref <= 1e-4, "%s: cpu-ref vs transformers: max rel err %.3g > 1e-4", name, ref);
        double fast = oracle_run(m, &c, "cpu", 0);
        CHECK(fast >= 0 && fast <= 1e-3, "%s: cpu vs transformers: max rel err %.3g > 1e-3", name, fast);
        s_batch_invariance(m, &c, "cpu-ref", name);
        s_batch_invariance(m, &c, "cpu", name);
        zl_model plain = s_plain(m);
        double off = oracle_run(&plain, &c, "cpu-ref", 0);
        CHECK(off > 1e-2, "%s: with the variant off the logits still match (%.3g): the check is blind to it", name,
              off);
        printf("%s: %d rows x %d logits vs transformers: cpu-ref %.3g, cpu %.3g (variant off: %.3g)\n", name, c.n_rows,
               c.vocab, ref, fast, off);
    }
    model_destroy(&m);
    oracle_free(&c);
}

int main(void) {
    static const char *const names[] = {"llama3", "linear", "yarn", "qwen3", "qwen3-yarn", "phi3"};
    static const zl_arch archs[] = {ZL_ARCH_LLAMA, ZL_ARCH_LLAMA, ZL_ARCH_LLAMA,
                                    ZL_ARCH_QWEN3, ZL_ARCH_QWEN3, ZL_ARCH_PHI3};
    for (int i = 0; i < 6; i++) {
        char bf[64];
        snprintf(bf, sizeof bf, "%s-bf16", names[i]);
        test_case(names[i], archs[i]);
        test_case(bf, archs[i]);
    }
    return test_report();
}
