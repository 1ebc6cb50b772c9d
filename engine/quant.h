/* engine/quant.h: GGUF weight types: block layouts, dequantization (the oracle for every GPU kernel) and
 * quantization (for zllm-mkmodel). Layouts and formulas are those of the GGUF format (ggml's block_q4_0 ...).
 * Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. */
#ifndef ZLLM_QUANT_H
#define ZLLM_QUANT_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"

/* half <-> float conversions (IEEE binary16 and bfloat16), exact, round-to-nearest-even on the way down */
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* 1 when zllm can dequantize this type */
int quant_supported(ggml_type t);

/* Dequantizes n elements (n a multiple of the type's block size) from src into dst.
 * Returns 0, or -1 for an unsupported type or a bad n. */
int quant_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);

/* Quantizes n elements of src into dst (ggml_row_bytes(t, n) bytes). Returns 0 or -1 as above.
 * Reference (non-iterative) quantizers: enough for random test models and round-trip checks. */
int quant_quantize_row(ggml_type t, const float *src, void *dst, int64_t n);

/* dot product of one quantized row with an f32 vector of n: sum_i deq(row)[i] * x[i]; used by the CPU engine.
 * Computed by dequantizing block by block into a stack buffer (no allocation). */
float quant_dot_row(ggml_type t, const void *row, const float *x, int64_t n);
#endif
