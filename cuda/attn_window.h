/* cuda/attn_window.h: sliding-window attention for the CUDA engine's sliding layers (gemma3's local layers,
 * Mistral-style llama files), decode and prefill rows alike.
 *
 * Row r (at position pos[r], in KV slot slot[r]) attends to the keys at positions j with pos[r] - window < j <=
 * pos[r], j >= 0: at most `window` keys, whatever the context. One block of 4 warps per (row, query head): warp w
 * takes the keys lo + w, lo + w + 4, ... in order with an online softmax in the log2 domain (q scaled by scale *
 * log2(e), f32 throughout), the four warps' partials are merged in warp order. A row's result depends only on its
 * q, its position and its slot's cache, never on the other rows of the launch: batch invariant, and a prompt gives
 * the same bits whole or chunked. No allocation, no host synchronisation: capturable in a CUDA graph. */
#ifndef ZLLM_CUDA_ATTN_WINDOW_H
#define ZLLM_CUDA_ATTN_WINDOW_H
#include <stdint.h>
#include <cuda_runtime.h>
#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const float *q;       /* [n_rows][n_heads * head_dim] f32, RoPE applied */
    const void *k_cache;  /* this layer's K: [n_slots][n_ctx][n_kv_heads][head_dim] of kv_type, holding every
                             position a row attends to (the step's own appended already) */
    const void *v_cache;  /* this layer's V: same layout */
    attn_kv_type kv_type; /* element type of the caches */
    const int32_t *pos;   /* device [n_rows]: each row's position, < n_ctx (a negative one writes zeros) */
    const int32_t *slot;  /* device [n_rows]: each row's KV slot */
    float *out;           /* [n_rows][n_heads * head_dim] f32 */
    int n_rows;           /* rows, >= 1 */
    int n_heads;          /* query heads, a multiple of n_kv_heads, at most 65535 */
    int n_kv_heads;       /* KV heads */
    int head_dim;         /* 1 .. 256 */
    int n_ctx;            /* positions per slot in the cache layout */
    int window;           /* keys per row at most, >= 1 */
    float scale;          /* softmax scale of q.k */
    const int32_t *blocks; /* paged KV (attention.h): device block tables, slot[r] the offset of row r's table;
                              NULL: contiguous slots */
    int kv_block_log2;     /* paged KV: log2 of the rows per block, 0..8 */
} attn_window_params;

/* Enqueues the kernel on stream. Returns cudaSuccess, cudaErrorInvalidValue for bad parameters, or the launch
 * error. */
cudaError_t attn_window_launch(const attn_window_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
