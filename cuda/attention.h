/* cuda/attention.h: attention kernels of the CUDA engine.
 *
 * Decode: split-K flash decoding. For F16/BF16 caches with head sizes 64/128 (every Llama-family model in
 * 16-bit or quantized form) the default is the tensor-core kernel of cuda/attn_decode_tc.h (one warp per chunk,
 * mma.sync, the chunks merged by one fixed tree, so the block shape may follow the batch); the rest of this
 * paragraph describes the CUDA-core kernels that serve the other shapes (F32 caches, head sizes 8-32, 80, 96 and
 * 256)
 * and cu_settings.attn_tc = 0. Work items are (sequence, KV head, split): each loads a chunk of the
 * sequence's K/V once and serves every query head of that GQA group from it, keeping a running (max, sum,
 * output) in f32; the splits' partials merge through log-sum-exp (in the chunk kernel's last block per row, or
 * a reduce kernel). A chunk kernel runs one block per item. The split
 * count follows the multiprocessor count and max_kv_len, never the actual lengths, which are read from
 * device memory at run time: a launch captured in a CUDA graph serves any kv_len <= max_kv_len, and splits
 * past a sequence's length exit at once.
 * Prefill: causal attention of consecutive query rows of each sequence against its slot (K/V tiles in
 * shared memory reused across the query rows, f32 accumulation); a separate launch over the prefill rows,
 * so it runs in the same step as other sequences' decodes.
 *
 * KV caches (one K and one V array per layer): element type attn_kv_type, layout
 * [n_slots][n_ctx][n_kv_heads][head_dim], i.e. slot s, position t, KV head h starts at element
 * ((s * n_ctx + t) * n_kv_heads + h) * head_dim. Query head j reads KV head j / (n_heads / n_kv_heads).
 * Paged KV (blocks not NULL): the caches are a pool [n_blocks][kv_block][n_kv_heads][head_dim] (kv_block =
 * 1 << kv_block_log2 rows a block, each block laid out as a small contiguous slot), and each row's slot value is
 * instead the offset in `blocks` of its sequence's block table: position t lives at row t % kv_block of block
 * blocks[slot + t / kv_block] (cuda/kv_page.cuh). Every kernel reads the same values in the same order as from
 * contiguous slots (chunk and split boundaries still follow n_ctx and max_kv_len), so the results are the same
 * bits. The tensor-core decode kernel takes whole 16-key tiles from one block: it needs kv_block >= 16
 * (kv_block_log2 >= 4); the other kernels translate each key row and take any kv_block_log2 in 0..8.
 * Head sizes: 8, 16, 32, 64, 80, 96, 128, 256. Every pointer is device memory, 16-byte aligned; q/out row strides
 * must keep rows 16-byte aligned (multiples of 4 floats). No launcher synchronizes, allocates or copies
 * from the host, so every launch may be captured in a CUDA graph.
 * CPU references for the checks live in cuda/test_attention.cu. */
#ifndef ZLLM_CUDA_ATTENTION_H
#define ZLLM_CUDA_ATTENTION_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* element type of the K/V caches */
typedef enum { ATTN_KV_F32 = 0, ATTN_KV_F16 = 1, ATTN_KV_BF16 = 2 } attn_kv_type;

typedef struct {
    const float *q;            /* [n_seq] rows of q_stride floats; row i holds [n_heads][head_dim] f32, RoPE applied */
    long q_stride;             /* floats between consecutive q rows; 0: n_heads * head_dim */
    const void *k_cache;       /* this layer's K: [n_slots][n_ctx][n_kv_heads][head_dim] of kv_type */
    const void *v_cache;       /* this layer's V: same layout and type as k_cache */
    attn_kv_type kv_type;      /* element type of k_cache and v_cache */
    const int32_t *slot;       /* device [n_seq]: KV slot of each row, in [0, n_slots) */
    const int32_t *kv_len;     /* device [n_seq]: row i attends to positions [0, kv_len[i]); 0..max_kv_len;
                                  0 writes zeros and reads no K/V (padded rows) */
    float *out;                /* [n_seq] rows of out_stride floats; row i gets [n_heads][head_dim] f32 */
    long out_stride;           /* floats between consecutive out rows; 0: n_heads * head_dim */
    void *workspace;           /* device scratch of at least attn_decode_workspace_bytes() bytes (split partials
                                  from its start, arrival counters at its end), zeroed once with
                                  attn_decode_workspace_init before its first launch */
    size_t workspace_bytes;    /* its size (the real one: the counters are anchored at workspace + this); the
                                  launcher fails with cudaErrorInvalidValue when too small */
    int n_seq;                 /* rows (sequences) in this launch, >= 1 */
    int n_heads;               /* query heads, a multiple of n_kv_heads */
    int n_kv_heads;            /* KV heads */
    int head_dim;              /* 8, 16, 32, 64, 80, 96, 128 or 256 */
    int n_ctx;                 /* positions per slot in the cache layout */
    int max_kv_len;            /* upper bound on every kv_len[i] (<= n_ctx): fixes the grid. Under graph capture
                                  pass the longest allowed context; eagerly, the step's longest kv_len */
    float scale;               /* softmax scale; 0: 1/sqrt(head_dim) */
    int sm_count;              /* multiprocessors of the device, sizes the split count; 0: read from the current
                                  device (a cached attribute query, safe during capture) */
    int n_splits;              /* 0: chosen from sm_count, n_seq, n_kv_heads and max_kv_len; > 0 forces it (tests) */
    int kernel;                /* 0: the default: 4 where it serves the shape (F16/BF16 caches, head sizes 64 and
                                  128, GQA groups up to 16) unless cu_settings.attn_tc is 0, else 3 from 9 splits
                                  on, else 1 (cuda/attention.cu);
                                  1: the chunk kernel, one block per (split, sequence, head), then the reduce
                                  kernel; 2: refused (cudaErrorInvalidValue); 3: the chunk kernel
                                  whose last block per row merges the splits (no reduce kernel). Each is batch
                                  invariant on its own; they agree to rounding, not to the bit;
                                  4: the tensor-core kernel (cuda/attn_decode_tc.h; cudaErrorInvalidValue for a
                                  shape it does not serve) */
    int tc_group;              /* kernel 4 only: warps per block, 1, 2, 4 or 8; 0: chosen from the launch. Any value
                                  gives the same bits (cuda/attn_decode_tc.h): tests and benchmarks */
    int tc_lpw;                /* kernel 4 only: chunks per warp, 1, 2 or 4 (4 serves GQA groups up to 8; above,
                                  2 runs); 0: chosen from the launch. Same bits */
    int tc_cluster;            /* kernel 4 only: -1 never folds a row's blocks through a thread-block cluster, 0
                                  or 1 does where the launch allows it (2..8 blocks per row, sm_90, the
                                  cu_settings.attn_cluster not 0). Same bits */
    void *out_w;               /* NULL, or (tensor-core kernel only) the output as values of kv_type, rounded to
                                  nearest, in rows of out_stride elements (out is then not written): the next
                                  product's 16-bit input without a cast kernel. A launch the tensor-core kernel
                                  does not serve fails with cudaErrorInvalidValue */
    int kv_pre;                /* tensor-core kernel only: 1 when slot and kv_len were written before the launch by
                                  something other than a kernel of its stream that may still run (a host copy
                                  ahead of the step), so that a block may read them before it waits for the
                                  kernel before it (cuda/pdl.cuh); the same bits either way; 0: read after */
    int kv_early;              /* tensor-core kernel only, with kv_pre: 1 when every row's cache positions below
                                  kv_len - 1 were written by kernels that completed before this launch's stream
                                  predecessors began (earlier engine steps: a step's first kernel starts after
                                  the step before has completed, since neither a graph launch nor an event wait
                                  on the stream carries a programmatic edge), so that a warp may start streaming
                                  its first K/V tiles before its PDL wait; position kv_len - 1 (this step's
                                  append) and later are read only after it. The same bits either way */
    int max_seq;               /* tensor-core kernel, automatic split count only: the most sequences any launch with
                                  this split count will have (an engine's max batch); 0 unknown. Where max_seq
                                  rows of 32-key leaves still fit one wave, short contexts at head size 128 take
                                  them (cuda/attn_decode_tc.cu, tc_floor); the split count then serves every n_seq
                                  up to max_seq with the same leaves */
    const int32_t *blocks;     /* paged KV (above): device block tables, slot[i] the offset of row i's table; NULL:
                                  contiguous slots */
    int kv_block_log2;         /* paged KV: log2 of the rows per block, 0..8 (4..8 for the tensor-core kernel) */
} attn_decode_params;

/* Bytes of workspace a decode launch with these parameters needs, and also enough for the same parameters
 * with any smaller n_seq or max_kv_len (so a buffer sized for the engine's largest batch and context serves
 * every step). Returns 0 for invalid parameters (the launcher then reports the error). */
size_t attn_decode_workspace_bytes(const attn_decode_params *p);

/* Zeroes a decode workspace (bytes from its start) on stream. Call it once after allocating the workspace and
 * before its first launch: the chunk kernel keeps per-row arrival counters in it that every launch leaves at
 * zero again, so no per-launch reset is needed (none sits in captured graphs). Returns cudaErrorInvalidValue for
 * a NULL workspace with bytes > 0, else cudaMemsetAsync's error. */
cudaError_t attn_decode_workspace_init(void *workspace, size_t bytes, cudaStream_t stream);

/* Split count the launcher will use for these parameters (>= 1), for benchmarks and tests. */
int attn_decode_splits(const attn_decode_params *p);

/* Enqueues the chunk kernel (by default it merges the splits itself), or the chunk and reduce kernels (on sm_90
 * the reduce is a programmatic dependent launch of the chunk kernel); all of it capturable in a CUDA graph. Returns cudaSuccess, cudaErrorInvalidValue for bad
 * parameters (unsupported head_dim or type, n_heads % n_kv_heads != 0, max_kv_len > n_ctx, workspace too
 * small), or the launch error. Kernel faults surface at the next synchronization as usual. */
cudaError_t attn_decode_launch(const attn_decode_params *p, cudaStream_t stream);

typedef struct {
    const float *q;            /* [n_rows] rows of q_stride floats, each [n_heads][head_dim] f32, RoPE applied */
    long q_stride;             /* floats between consecutive q rows; 0: n_heads * head_dim */
    const void *k_cache;       /* this layer's K, layout as above, already holding positions [0, pos0 + rows) */
    const void *v_cache;       /* this layer's V, same layout */
    attn_kv_type kv_type;      /* element type of the caches */
    const int32_t *seq_row0;   /* device [n_seq]: first q/out row of sequence i (its rows are consecutive) */
    const int32_t *seq_rows;   /* device [n_seq]: number of rows of sequence i, 0..max_rows */
    const int32_t *seq_slot;   /* device [n_seq]: KV slot of sequence i */
    const int32_t *seq_pos0;   /* device [n_seq]: position of sequence i's first row; row t attends to
                                  [0, pos0 + t] (pos0 + rows <= n_ctx) */
    float *out;                /* [n_rows] rows of out_stride floats, each [n_heads][head_dim] f32 */
    long out_stride;           /* floats between consecutive out rows; 0: n_heads * head_dim */
    int n_seq;                 /* sequences in this launch, >= 1 */
    int max_rows;              /* upper bound on every seq_rows[i] (fixes the grid), >= 1 */
    int n_heads;               /* query heads, a multiple of n_kv_heads */
    int n_kv_heads;            /* KV heads */
    int head_dim;              /* 8, 16, 32, 64, 80, 96, 128 or 256 */
    int n_ctx;                 /* positions per slot in the cache layout */
    float scale;               /* softmax scale; 0: 1/sqrt(head_dim) */
    const int32_t *blocks;     /* paged KV (above): device block tables, seq_slot[i] the offset of sequence i's
                                  table; NULL: contiguous slots */
    int kv_block_log2;         /* paged KV: log2 of the rows per block, 0..8 */
} attn_prefill_params;

/* Enqueues causal prefill attention on stream. Returns cudaSuccess, cudaErrorInvalidValue for bad
 * parameters, or the launch error. */
cudaError_t attn_prefill_launch(const attn_prefill_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
