/* cuda/sample_mask.cu: the allowed-token mask on the logits (sample_mask.h). One thread per mask word: a word of
 * all ones (the common case inside a JSON string) is one load and no store. And the wait for masks the host
 * writes after the launch (zl_seq.mask_late): one thread polling a flag in mapped host memory. */
#include <math.h>
#include "sample_mask.h"

/* kFresh: the mask is mapped host memory the host rewrites between launches: loaded with ld.global.cv, which
 * discards a cached copy of the line (the GPU's L2 may hold system memory lines from an earlier step's read) */
template <bool kFresh>
__global__ void k_sample_mask(float *logits, long stride, int vocab, int words, const int32_t *mask_on,
                              const uint32_t *mask) {
    const int row = blockIdx.y;
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= words || !mask_on[row]) return;
    const uint32_t *mp = mask + (size_t)row * words + w;
    const uint32_t bits = kFresh ? __ldcv(mp) : *mp;
    if (bits == 0xFFFFFFFFu) return;
    float *l = logits + (size_t)row * stride + (size_t)w * 32;
    const int end = vocab - w * 32 < 32 ? vocab - w * 32 : 32;
    for (int j = 0; j < end; j++)
        if (!(bits >> j & 1u)) l[j] = -INFINITY;
}

template <bool kFresh>
static cudaError_t s_launch(float *logits, long stride, int n_rows, int vocab, const int32_t *mask_on,
                            const uint32_t *mask, cudaStream_t stream) {
    if (!logits || !mask_on || !mask || n_rows < 1 || n_rows > 65535 || vocab < 1 || stride < vocab)
        return cudaErrorInvalidValue;
    const int words = sample_mask_words(vocab), threads = 128;
    dim3 grid((unsigned)((words + threads - 1) / threads), (unsigned)n_rows);
    k_sample_mask<kFresh><<<grid, threads, 0, stream>>>(logits, stride, vocab, words, mask_on, mask);
    return cudaGetLastError();
}

extern "C" cudaError_t sample_mask_launch(float *logits, long stride, int n_rows, int vocab, const int32_t *mask_on,
                                          const uint32_t *mask, cudaStream_t stream) {
    return s_launch<false>(logits, stride, n_rows, vocab, mask_on, mask, stream);
}

extern "C" cudaError_t sample_mask_late_launch(float *logits, long stride, int n_rows, int vocab,
                                               const int32_t *mask_on, const uint32_t *mask, cudaStream_t stream) {
    return s_launch<true>(logits, stride, n_rows, vocab, mask_on, mask, stream);
}

__global__ void k_sample_mask_wait(const volatile uint32_t *flag, const uint32_t *want) {
    const uint32_t w = *want;
    while ((int32_t)(*flag - w) < 0) __nanosleep(500);
    __threadfence_system();
}

extern "C" cudaError_t sample_mask_wait_launch(const volatile uint32_t *flag, const uint32_t *want,
                                               cudaStream_t stream) {
    if (!flag || !want) return cudaErrorInvalidValue;
    k_sample_mask_wait<<<1, 1, 0, stream>>>(flag, want);
    return cudaGetLastError();
}
