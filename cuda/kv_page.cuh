/* cuda/kv_page.cuh: the cache row of a sequence's position, contiguous or paged (attention.h, "KV caches").
 * Contiguous: slot s, position t is row s * n_ctx + t. Paged: `slot` is the offset of the sequence's block table
 * in `blocks`, and position t is row t % kv_block of pool block blocks[slot + t / kv_block], i.e. pool row
 * blocks[slot + (t >> lg)] * kv_block + (t & (kv_block - 1)) with kv_block = 1 << lg. Only the address differs:
 * every kernel reads the same values in the same order either way, so paged and contiguous KV give the same
 * bits. The tables are host-written step inputs, read-only while a kernel runs (hence __ldg). */
#ifndef ZLLM_CUDA_KV_PAGE_CUH
#define ZLLM_CUDA_KV_PAGE_CUH
#include <stdint.h>

/* the cache row (in units of one position's n_kv_heads * head_dim elements) holding position t */
static __device__ __forceinline__ long kv_page_row(const int32_t *blocks, int lg, int slot, int n_ctx, int t) {
    if (!blocks) return (long)slot * n_ctx + t;
    return ((long)__ldg(blocks + slot + (t >> lg)) << lg) + (t & ((1 << lg) - 1));
}
#endif
