/* engine/rope.h: the rotary position embedding of a model, as llama.cpp computes it from a GGUF file: the
 * per-pair inverse frequencies (with the file's frequency factors, linear scaling, YaRN or LongRoPE applied) and
 * the magnitude factor cos and sin are multiplied by. Computed once per engine (LongRoPE's factor set depends on
 * the engine's context length); every engine builds its cos/sin rows from it, so all three rotate alike. A model
 * whose sliding layers rotate otherwise (model_rope_two_kinds: gemma3's base 10000, unscaled) has a second one. */
#ifndef ZLLM_ROPE_H
#define ZLLM_ROPE_H
#include <stddef.h>
#include "model.h"

typedef struct {
    int half;         /* rotated pairs per head: rope_dim / 2 */
    double *inv_freq; /* [half] angle per position of pair i: theta(p, i) = p * inv_freq[i] */
    double mscale;    /* cos and sin are multiplied by this (YaRN's and LongRoPE's attention factor; else 1) */
    int long_factors; /* 1 when LongRoPE's long factor set was chosen (n_ctx > the original context) */
} zl_rope;

/* Fills r for model m served with context n_ctx (LongRoPE picks its long factors when n_ctx exceeds
 * rope.scaling.original_context_length, as llama.cpp does): the global layers' rotation (base rope_base, factor
 * rope_scale), or with sliding = 1 the sliding layers' (rope_base_swa, rope_scale_swa; the rest alike, as llama.cpp
 * sets up its sliding layers). Returns 0, or -1 with a message in err. */
int rope_init(zl_rope *r, const zl_model *m, int n_ctx, int sliding, char *err, size_t errlen);
/* Frees r's array; idempotent. */
void rope_free(zl_rope *r);
/* cs[2i], cs[2i + 1] = mscale * (cos, sin)(pos * inv_freq[i]) for i < half, angles in double precision. */
void rope_cs_row(const zl_rope *r, int pos, float *cs);
#endif
