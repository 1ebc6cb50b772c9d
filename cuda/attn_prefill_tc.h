/* cuda/attn_prefill_tc.h: tensor-core causal prefill attention for F16 and BF16 KV caches (internal to
 * cuda/: attn_prefill_launch in cuda/attention.cu dispatches here; benches and tests may call it directly).
 *
 * Same contract as attn_prefill_launch (cuda/attention.h, attn_prefill_params): several sequences per launch,
 * each with its own q/out rows, KV slot and pos0 (a prompt may be a continuation chunk). Served shapes: kv_type
 * ATTN_KV_F16 or ATTN_KV_BF16, head_dim 64, 80, 96 or 128; every other shape stays on the scalar kernel.
 * Arithmetic: q rows are scaled by scale * log2(e) in f32 and rounded once to the cache type; S = Q K^T and
 * O += P V run on mma.sync m16n8k16 with f32 accumulation; the online softmax (max, sum) is f32 in the log2
 * domain; P is rounded to the cache type before P V. A row's result depends only on its own q row, its
 * position and the cache (key tiles are always [64 i, 64 i + 64) from position 0): it is the same bits alone,
 * batched with other sequences, or computed as a continuation chunk (batch invariance). */
#ifndef ZLLM_CUDA_ATTN_PREFILL_TC_H
#define ZLLM_CUDA_ATTN_PREFILL_TC_H
#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when attn_prefill_launch should use the tensor-core kernel for p: the shape is served (above) and the knob
 * allows it: attn_prefill_tc_force(0/1) if called, else cu_settings.prefill_tc (0 selects the scalar kernel for
 * every shape), default on. Never fails. */
int attn_prefill_tc_wants(const attn_prefill_params *p);

/* Overrides the knob for this process (benchmarks, tests): 0 scalar kernel, 1 tensor-core kernel where the shape
 * is served, -1 back to the environment's choice. Not thread-safe against concurrent launches' reads of the
 * knob: call it between launches. */
void attn_prefill_tc_force(int mode);

/* Enqueues the tensor-core prefill kernel on stream (no allocation, no copy, no synchronization: capturable).
 * Returns cudaSuccess, cudaErrorInvalidValue for parameters it does not serve (other types or head sizes) or
 * that attn_prefill_launch would reject, or the launch error. */
cudaError_t attn_prefill_tc_launch(const attn_prefill_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
