/* cuda/logprob_top.h: the logprobs of each row's sampled id and its top k alternatives on the GPU, one block per row,
 * the definition of engine/logprobs.h (the CPU reference): the log-softmax at temperature 1 of the row the sampler
 * drew from (after bias and penalties), NaN and -inf no candidates, sums in float64 in a fixed order (a row's result
 * does not depend on the other rows of the step), alternatives by logprob descending, then id ascending. Rows whose
 * parameters do not ask for logprobs are left alone. No host synchronization, allocation or copy. */
#ifndef ZLLM_CUDA_LOGPROB_TOP_H
#define ZLLM_CUDA_LOGPROB_TOP_H
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "logprobs.h" /* zl_logprobs */
#include "sampler.h"  /* zl_sampling */

typedef struct {
    const float *logits;       /* device [n_rows] rows of logits_stride floats: what the sampler read */
    long logits_stride;        /* floats between rows; 0: vocab */
    const float *pen_rows;     /* device [n_rows][vocab]: the rows with the repetition penalty applied (the
                                  sampler's workspace), read for rows where it applies; NULL: never */
    const int32_t *hist_len;   /* device [n_rows]: staged history of row r (the penalty applies when > 0, with
                                  repeat_penalty != 1 and repeat_last_n > 0, as cuda/sample.cu decides); NULL: 0 */
    int n_rows, vocab;         /* >= 1 */
    const zl_sampling *params; /* device [n_rows]: logprobs, top_logprobs (and the repetition penalty's fields); NULL
                                  with top_k: every row, no penalty */
    const int32_t *top_k;      /* device [n_rows]: alternatives per row (prompt logprobs of raw logits rows); NULL:
                                  params->top_logprobs */
    const int32_t *sampled;    /* device [n_rows]: each row's sampled id */
    zl_logprobs *out;          /* device [n_rows] (mapped host memory, say) */
} logprobs_params;

/* Enqueues the kernel on stream. cudaSuccess, cudaErrorInvalidValue for bad parameters, or the launch error. */
cudaError_t logprobs_launch(const logprobs_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
