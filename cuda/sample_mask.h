/* cuda/sample_mask.h: structured output's allowed-token mask on the GPU (zl_seq.mask; the CPU's is
 * engine/sampler_mask.c). Runs on the LM head's logits right before sample_launch, in place: a masked id's logit
 * becomes -INFINITY, which the sampler never picks (cuda/sample.cu skips non-finite candidates). No host
 * synchronization, allocation or copy: the launch may be captured in a CUDA graph, and rows whose flag is 0 cost
 * one load each. */
#ifndef ZLLM_CUDA_SAMPLE_MASK_H
#define ZLLM_CUDA_SAMPLE_MASK_H
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the mask words of a vocabulary: one bit per id */
static inline int sample_mask_words(int vocab) { return (vocab + 31) / 32; }

/* For each of n_rows (1..65535) rows of logits (row r at logits + r * stride, vocab floats) whose mask_on[r] is non-zero,
 * sets to -INFINITY the logit of every id whose bit is clear in mask + r * sample_mask_words(vocab) (bit i of word
 * i / 32). mask_on and mask are device memory. Returns cudaSuccess, cudaErrorInvalidValue for bad arguments, or
 * the launch error. */
cudaError_t sample_mask_launch(float *logits, long stride, int n_rows, int vocab, const int32_t *mask_on,
                               const uint32_t *mask, cudaStream_t stream);

/* sample_mask_launch for masks in mapped host memory that the host rewrites between launches (zl_seq.mask_late):
 * every mask word is loaded past the GPU's caches (a cached line of an earlier read would be stale). */
cudaError_t sample_mask_late_launch(float *logits, long stride, int n_rows, int vocab, const int32_t *mask_on,
                                    const uint32_t *mask, cudaStream_t stream);

/* Enqueues a one-thread kernel that returns once *flag has reached *want (flag: mapped host memory the host sets;
 * want: device memory), compared as the signed 32-bit difference *flag - *want >= 0 so that a counter that wraps
 * keeps working: the stream's later work (the late masks' launch, the sampler) waits for the host without
 * blocking the host. Returns cudaSuccess or the launch error. */
cudaError_t sample_mask_wait_launch(const volatile uint32_t *flag, const uint32_t *want, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
