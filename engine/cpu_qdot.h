/* engine/cpu_qdot.h: dot products of packed GGUF weight rows with activation rows, for the fast CPU engine.
 *
 * Activations, per product:
 *   Q4_0, Q4_1, Q8_0, Q4_K, Q6_K weights: activations quantized per block of 32 to 16-bit levels held as two
 *     int8 parts with an f32 scale (qdot_blk: a Q8_0-style level, d = amax / 127, and its residual at 1/256 of
 *     that step), and the products are integer dot products of the weight's levels with both parts, combined
 *     per block as 256 * high + low (exact in int32; the conversion to f32 rounds only above 2^24), then
 *     scaled in f32. The only error against the f32 reference is the activations' rounding to about 16 bits
 *     (8-bit activations, as llama.cpp's Q8_0/Q8_1, move SmolLM2's logits by up to 3 and flip near ties such
 *     as the first token of its answer to "What is the capital of France?"; these move them by about 0.01).
 *   F32, F16, BF16 weights and the remaining types (Q5_0, Q5_1, Q5_K): activations stay f32 (the 16-bit and
 *     32-bit weights are exact in f32; the Q5 types are dequantized block by block).
 * Every kernel computes each (row, activation row) pair with the same operations in the same order whatever
 * the number of activation rows it is given (nt) and wherever it runs, so results do not depend on the batch
 * (batch invariance), only on the ISA path, which an engine fixes at creation. */
#ifndef ZLLM_CPU_QDOT_H
#define ZLLM_CPU_QDOT_H
#include <stdint.h>
#include "gguf.h"

typedef enum { QDOT_SCALAR = 0, QDOT_AVX2 = 1, QDOT_AVX512 = 2 } qdot_isa;

#define QDOT_TILE 4 /* most activation rows one kernel call takes */

/* one block of 32 quantized activations in two int8 parts: x[i] ~= d * (256 q[i] + r[i]). q is the Q8_0-style
 * level (amax / 127 steps); r quantizes what q leaves, 256 times finer, so the block carries 16-bit levels and
 * the products stay int8 dot products (two per block) */
typedef struct {
    int8_t q[32]; /* high levels in [-127, 127] */
    int8_t r[32]; /* low levels in [-127, 127] */
    float d;      /* scale of the 16-bit level 256 q + r */
    float s;      /* d * sum(256 q + r): the block's sum, for the weights' offsets (Q4_1, Q4_K) */
} qdot_blk;

/* the best path this CPU runs (AVX-512 needs F, BW, VL, DQ and VNNI; AVX2 needs FMA and F16C) */
int qdot_isa_best(void);
/* 1 when this CPU runs path isa */
int qdot_isa_ok(int isa);
const char *qdot_isa_name(int isa);

/* 1 when products with weights of type t take quantized activations (rows of qdot_blk), 0 when f32 rows */
int qdot_wants_q8(ggml_type t);

/* quantizes x[n] (n % 32 == 0) into n / 32 blocks; every path gives the same bytes */
void qdot_quantize_row(int isa, const float *x, qdot_blk *b, int64_t n);

/* out[t] = dot(weight row w of n elements, activation row x[t]) for t < nt (1..QDOT_TILE); x[t] points to
 * qdot_blk rows when qdot_wants_q8(type), else to f32 rows */
typedef void (*qdot_fn)(const void *w, const void *const *x, int nt, int64_t n, float *out);

/* the kernel for weights of type t on path isa (falling back to a lower path for a type without one there);
 * NULL for a type the engine cannot multiply */
qdot_fn qdot_get(ggml_type t, int isa);

/* a scalar kernel for weights of type t that takes f32 activation rows (dequantizing block by block), for every
 * type: the check that the quantized activations are the only difference from the reference (ZLLM_CPU_EXACT) */
qdot_fn qdot_get_f32act(ggml_type t);

/* f32 helpers for attention on path isa: fixed-order dot product, and y += a * x */
float qdot_f32(int isa, const float *a, const float *b, int64_t n);
void qdot_axpy(int isa, float *y, float a, const float *x, int64_t n);
#endif
