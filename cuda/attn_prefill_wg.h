/* cuda/attn_prefill_wg.h: Hopper's wgmma form of the tensor-core causal prefill attention (internal to cuda/:
 * attn_prefill_tc_launch dispatches here; tests and benches may force it off).
 *
 * Same contract and the same bits as the mma.sync kernel of cuda/attn_prefill_tc.cu (attn_prefill_tc.h): q rows
 * scaled by scale * log2(e) and rounded once to the cache type, key tiles [64 i, 64 i + 64) from position 0, S and
 * O chained over the same k16 steps in the same order (a chain of wgmma k16 steps gives the bits of the chain of
 * mma.sync m16n8k16 steps, cuda/wgmma.cuh), the same f32 online softmax. Served shapes: F16/BF16 caches of head
 * size 64 or 128 on a device where wtc_wgmma() is 1 (sm_90a code present, ZLLM_CUDA_WGMMA not 0). */
#ifndef ZLLM_CUDA_ATTN_PREFILL_WG_H
#define ZLLM_CUDA_ATTN_PREFILL_WG_H
#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when attn_prefill_tc_launch runs p on the wgmma form: the shape is served (above) and the form is not forced
 * off. Attribute queries only (safe while a stream is captured). Never fails. */
int attn_prefill_wg_wants(const attn_prefill_params *p);

/* 0 forces the mma.sync kernel for this process (tests, benches: the same bits), -1 back to the default. Call it
 * between launches. */
void attn_prefill_wg_force(int mode);

/* Enqueues the wgmma kernel on stream (no allocation, no synchronization: capturable). Returns
 * cudaErrorInvalidValue for a shape it does not serve, else the launch error. p is checked by the caller
 * (attn_prefill_tc_launch). */
cudaError_t attn_prefill_wg_launch(const attn_prefill_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
