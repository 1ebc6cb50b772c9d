/* cuda/bias_penalty.h: OpenAI's logit bias and presence/frequency penalties on the GPU, one block per row, with the
 * meaning, order and float32 arithmetic of engine/penalty.h (the CPU reference): each bias entry added in turn,
 * then per distinct generated id logit - (float(count) * frequency + presence), rounded as the CPU rounds (no fused
 * multiply-add), so both give the same bits. The penalized rows go to a separate buffer (the logits stay as the
 * model made them); rows that ask for nothing are copied unchanged. No host synchronization, allocation or copy. */
#ifndef ZLLM_CUDA_BIAS_PENALTY_H
#define ZLLM_CUDA_BIAS_PENALTY_H
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "sampler.h" /* zl_sampling */

typedef struct {
    const float *logits;       /* device [n_rows] rows of logits_stride floats; read only */
    long logits_stride;        /* floats between rows; 0: vocab */
    float *out;                /* device [n_rows][vocab]: the penalized rows */
    int n_rows, vocab;         /* >= 1 */
    const zl_sampling *params; /* device [n_rows]: presence_penalty, frequency_penalty */
    const int32_t *bias_n;     /* device [n_rows]: logit bias entries of row r (0..bias_stride) */
    const int32_t *bias_id;    /* device [n_rows][bias_stride] ids (outside [0, vocab): skipped) */
    const float *bias;         /* device [n_rows][bias_stride] values */
    int bias_stride;           /* entries per row */
    const int32_t *gen_n;      /* device [n_rows]: distinct generated ids of row r (0..gen_stride) */
    const int32_t *gen_id;     /* device [n_rows][gen_stride] distinct generated ids */
    const int32_t *gen_cnt;    /* device [n_rows][gen_stride] their counts (>= 1) */
    int gen_stride;            /* entries per row */
} penalty_params;

/* Enqueues the kernel on stream. cudaSuccess, cudaErrorInvalidValue for bad parameters, or the launch error. */
cudaError_t penalty_launch(const penalty_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
