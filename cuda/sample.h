/* cuda/sample.h: token sampling on the GPU, one block per row of logits (on sm_90, a cluster of blocks for plain
 * greedy rows of a large vocabulary: cuda/sample.cu), so that only ids leave the GPU.
 *
 * Per row, the order and meaning of engine/sampler.h (the CPU reference): repetition penalty over the last
 * repeat_last_n history tokens -> greedy if temperature <= 0 (argmax, lowest id among equal maxima; exactly
 * the CPU's pick) -> top-k -> temperature -> softmax -> min-p -> top-p -> draw with one uniform number from
 * the row's generator, advanced in device memory exactly as sampler_rng_uniform() advances it on the CPU
 * (so a seeded row is deterministic; draws need not equal the CPU's id for id, since the order of
 * summation differs). The logits are not modified (the penalty works on a copy in the workspace).
 * No host synchronization, allocation or copy: the launch may be captured in a CUDA graph.
 * Checks against the CPU sampler live in cuda/test_sample.cu. */
#ifndef ZLLM_CUDA_SAMPLE_H
#define ZLLM_CUDA_SAMPLE_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "sampler.h"   /* zl_sampling; common/ headers are C */

typedef struct {
    const float *logits;       /* device [n_rows] rows of logits_stride floats, each [vocab] f32; read only */
    long logits_stride;        /* floats between rows; 0: vocab */
    int n_rows;                /* rows, >= 1 */
    int vocab;                 /* ids per row, >= 1 */
    const zl_sampling *params; /* device [n_rows]: each row's parameters (seed is not used here) */
    const int32_t *row_state;  /* device [n_rows]: row r's index into history and rng_state (its KV slot, say);
                                  NULL: row r uses index r */
    const int32_t *history;    /* device [*][history_stride]: token history of each index, oldest first;
                                  NULL: no history (penalty off) */
    long history_stride;       /* int32 entries between consecutive history rows */
    const int32_t *history_len;/* device [n_rows]: valid history entries of row r (its last repeat_last_n are
                                  penalized); NULL: 0 */
    uint64_t *rng_state;       /* device [*]: generator state of each index (sampler_rng_init(seed) on the host),
                                  advanced once per non-greedy draw; may be NULL when every row is greedy */
    int32_t *out;              /* device [n_rows]: sampled ids */
    void *workspace;           /* device scratch of sample_workspace_bytes(n_rows, vocab) bytes (penalized logits);
                                  may be NULL when history is NULL */
    size_t workspace_bytes;    /* its size; the launcher fails with cudaErrorInvalidValue when too small */
    int32_t *carry_tok;        /* device [*]: each row's id is also written at carry_idx[r] (the next step's fed
                                  token, ops_feed); NULL: no carry */
    uint64_t *carry_rng;       /* device [*]: with carry_tok, the row's generator state after its draw (unchanged
                                  for greedy rows; 0 without rng_state) */
    const int32_t *carry_idx;  /* device [n_rows]: row r's carry index (its KV slot); required with carry_tok */
    uint64_t *rng_out;         /* device [n_rows] (mapped host memory, say): each row's generator state after its
                                  draw (0 without rng_state); NULL: not written */
} sample_params;

/* Workspace bytes for n_rows rows of vocab logits (also enough for fewer rows). */
size_t sample_workspace_bytes(int n_rows, int vocab);

/* Enqueues the sampling kernel on stream. Returns cudaSuccess, cudaErrorInvalidValue for bad parameters
 * (n_rows < 1, vocab < 1, missing pointers, workspace too small), or the launch error. Ids written are
 * always in [0, vocab), also for rows whose logits hold NaN (those never win). */
cudaError_t sample_launch(const sample_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
