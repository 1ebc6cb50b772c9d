/* cuda/attn_decode_tc.h: tensor-core split-K decode attention for F16 and BF16 KV caches (internal to cuda/:
 * attn_decode_launch in cuda/attention.cu dispatches here; tests and benches may call it directly).
 *
 * Same contract as attn_decode_launch (cuda/attention.h, attn_decode_params). Served shapes: kv_type
 * ATTN_KV_F16 or ATTN_KV_BF16, head_dim 64 or 128, GQA group (n_heads / n_kv_heads) at most 16; every other
 * shape (head sizes 80 and 96 included: the key rings' swizzle and chunk layout assume 8 or 16 chunks per row)
 * stays on the CUDA-core kernels of cuda/attention.cu.
 *
 * Arithmetic (what makes a row's bits independent of the batch and of the launch shape):
 *   - A row (sequence, KV head) is cut into chunks of `chunk` keys, [c * chunk, (c + 1) * chunk): the leaves of
 *     the merge tree. chunk follows max_kv_len, the multiprocessor count and the head layout only (or a forced
 *     n_splits), never n_seq: at least 128 keys at head size 128 up to 2048 keys, else 256, at most 2 x 8 x
 *     floor(SMs / KV heads) chunks per row (half that from 64k keys), the count a power of two up to 16, else a
 *     multiple of 16.
 *   - Each chunk's partial (max m, sum l, unnormalised output o for each query head of the group) is computed
 *     by one warp: q rows scaled by scale * log2(e) in f32 and rounded once to the cache type, S = Q K^T and
 *     O += P V on mma.sync m16n8k16 with f32 accumulators over tiles of 16 keys in order, online softmax in f32
 *     in the log2 domain, P rounded to the cache type before P V; the lanes' sums of l added in a fixed order.
 *   - The chunk partials of a row are merged by ONE fixed binary tree: the perfect tree over the chunks in
 *     order, chunks past kv_len being exact identities (m = -inf). Merge of (a, b): m = max, each side scaled
 *     by exp2(m_side - m), l and o summed; an identity side returns the other side unchanged.
 *   - Who evaluates which node follows the launch and changes no bit: a warp takes lpw = 1, 2 or 4 consecutive
 *     chunks (more in large launches, so that a warp streams about 512 keys; 4 only for groups up to 8); it
 *     folds them as the tree's lower levels through a binary counter of saved partials in registers. A block
 *     of G warps (1, 2, 4 or 8) folds its G x lpw aligned chunks in shared memory (a subtree). When a row needs
 *     2..8 blocks on sm_90 they run as one thread-block cluster and fold the upper levels through distributed
 *     shared memory; otherwise each block stores its subtree's partial in the workspace and the last block of
 *     the row to finish (an arrival counter at the workspace's end, left at zero again) folds them. tc_group,
 *     tc_lpw and tc_cluster (attention.h) force the form; the checks compare every form bit for bit.
 *     Output: o / l, or zeros for kv_len 0: f32 into out, or (out_w set) rounded to the cache type into out_w,
 *     the next product's input, as the engine's cast kernel would round it.
 * Loads: each warp streams its keys through its own cp.async ring of 16-key K and V tiles in shared memory
 * (rows XOR-swizzled for ldmatrix; in the deep form at head size 64 padded by 16 bytes instead), so no block
 * barrier sits in the key loop; launches with at most 4 warps per SM use deeper rings, where the row then needs
 * no cross-block fold, or folds in one cluster and is too long for one block of up to 8 warps of the 24 KiB form.
 * Shape rules (cuda/attn_decode_tc.cu): fewest keys per chunk 128 at head size 128 up to 2048 keys (32 where the
 * engine's fullest batch of such leaves fits one wave), else 256; warps per block the smallest power of two
 * covering the row's warps, at most 8 (4 in the deep form); cu_settings.attn_tc = 0 keeps kernel 0 on the
 * CUDA-core kernels, cu_settings.attn_cluster = 0 never folds through a cluster. */
#ifndef ZLLM_CUDA_ATTN_DECODE_TC_H
#define ZLLM_CUDA_ATTN_DECODE_TC_H
#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when attn_decode_launch should run the tensor-core kernel for p: the shape is served and p->kernel is 4, or
 * p->kernel is 0 and cu_settings.attn_tc is not 0. Never fails. */
int attn_decode_tc_wants(const attn_decode_params *p);

/* 1 when the tensor-core kernel serves p's shape (type, head size, GQA group). */
int attn_decode_tc_served(const attn_decode_params *p);

/* Chunks per row for p (its "split count", >= 1). */
int attn_decode_tc_chunks(const attn_decode_params *p);

/* Workspace bytes the kernel needs for p, and for p with any smaller n_seq or max_kv_len (group partials from
 * the start, arrival counters at the end, n_seq * n_heads ints). 0 for invalid parameters. */
size_t attn_decode_tc_workspace_bytes(const attn_decode_params *p);

/* Enqueues the kernel on stream (no allocation, copy or synchronisation: capturable). Returns cudaSuccess,
 * cudaErrorInvalidValue for a shape it does not serve, bad parameters or a workspace that is missing or too
 * small, or the launch error. */
cudaError_t attn_decode_tc_launch(const attn_decode_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
