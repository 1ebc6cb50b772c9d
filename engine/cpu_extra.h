/* engine/cpu_extra.h: what both CPU engines (engine/engine_cpu.c, engine/cpu_fast.c) load beside their main
 * weights: the RoPE frequencies (engine/rope.h), the sliding layers' second RoPE table where the two kinds of layer
 * rotate differently, and the per-layer small vectors of qwen3 and gemma3 blocks (per-head Q/K norms, gemma3's
 * norms after attention and FFN), dequantized to f32 once at engine creation. */
#ifndef ZLLM_CPU_EXTRA_H
#define ZLLM_CPU_EXTRA_H
#include <stddef.h>
#include "model.h"
#include "rope.h"

typedef struct {
    zl_rope rope;       /* RoPE frequencies and magnitude of the global layers (every layer without sliding kinds) */
    zl_rope rope_swa;   /* the sliding layers' (with rope_cs_swa) */
    float *rope_cs_swa; /* [T][rope_dim] the sliding layers' cos/sin rows; NULL when both kinds rotate alike */
    float *q_norm;      /* [n_layers][head_dim] per-head Q norms; NULL without them */
    float *k_norm;      /* [n_layers][head_dim] per-head K norms; NULL without them */
    float *post_attn;   /* [n_layers][dim] norm of the attention output; NULL without it */
    float *post_ffn;    /* [n_layers][dim] norm of the FFN output; NULL without it */
} cpu_extra;

/* n zeroed floats (at least one allocated, so that NULL means out of memory), for free(); the engines allocate
 * their other f32 buffers with it too */
float *cpu_extra_floats(size_t n);

/* w's n_in values dequantized to f32 into dst: 0, or -1 with a message naming the tensor in err */
int cpu_extra_vec(const zl_weight *w, float *dst, char *err, size_t errlen);

/* Fills x (zeroed by the caller) for model m served with n_ctx positions and steps of up to T rows. Returns 0, or
 * -1 with a message in err (out of memory, a vector that cannot be dequantized, a RoPE setting rope_init refuses);
 * cpu_extra_free then frees what was allocated. */
int cpu_extra_load(cpu_extra *x, const zl_model *m, int n_ctx, size_t T, char *err, size_t errlen);

/* Frees x's arrays and tables; idempotent (fields reset). */
void cpu_extra_free(cpu_extra *x);
#endif
