/* cuda/attn_prefill_tile.cuh: what cuda/attn_prefill_tc.cu's mma.sync kernel and cuda/attn_prefill_wg.cu's wgmma
 * form of the tensor-core prefill attention share: a block's place in the launch, its Q as staged, and the per-tile
 * soft-max (one definition, so that the two give the same bits). Device code only. */
#ifndef ZLLM_CUDA_ATTN_PREFILL_TILE_CUH
#define ZLLM_CUDA_ATTN_PREFILL_TILE_CUH
#include <math.h>

#include "attention.h"
#include "mma_util.cuh"

/* One block's share of a prefill launch. Grid: (query heads, query tiles of R rows, sequences); grid row y runs
 * tile gridDim.y - 1 - y, so that the heaviest tiles (the last ones, with the most keys) start first. */
template <typename T> struct pf_block {
    int head;                  /* the query head */
    int t0, nr;                /* the block's first row within its sequence, and its rows (1..R) */
    int row0;                  /* the sequence's first row of q and out */
    int pmin;                  /* the position of the block's first row */
    int kend, nkt;             /* keys [0, kend) are needed by some row of the block: nkt tiles of 64 keys */
    int sl;                    /* paged KV: the offset of the sequence's block table (kv_page_row) */
    long q_stride, out_stride; /* elements between consecutive rows of q and of out */
    long row_stride;           /* elements between consecutive positions of the cache */
    const T *kbase, *vbase;    /* position 0 of the block's KV head (contiguous KV: in the sequence's slot) */
};

/* b for this block of R query rows at head size D, group query heads a KV head; false when the block's sequence
 * ends before the block's tile (nothing to do) */
template <typename T, int D, int R>
__device__ __forceinline__ bool pf_block_at(pf_block<T> &b, const attn_prefill_params &p, int group) {
    const int seq = blockIdx.z;
    const int rows = p.seq_rows[seq];
    b.head = blockIdx.x;
    b.t0 = ((int)gridDim.y - 1 - (int)blockIdx.y) * R;
    if (b.t0 >= rows) return false;
    b.row0 = p.seq_row0[seq];
    b.pmin = p.seq_pos0[seq] + b.t0;
    b.nr = min(R, rows - b.t0);
    b.kend = b.pmin + b.nr;
    b.nkt = (b.kend + 63) / 64;
    b.q_stride = p.q_stride ? p.q_stride : (long)p.n_heads * D;
    b.out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    b.row_stride = (long)p.n_kv_heads * D;
    b.sl = p.seq_slot[seq];
    const long slot_base =
        p.blocks ? (long)(b.head / group) * D : (long)b.sl * p.n_ctx * b.row_stride + (long)(b.head / group) * D;
    b.kbase = reinterpret_cast<const T *>(p.k_cache) + slot_base;
    b.vbase = reinterpret_cast<const T *>(p.v_cache) + slot_base;
    return true;
}

/* elements d .. d + 3 of the block's query row r (zero past its rows), scaled by qscale and rounded to T: the
 * block's Q as both kernels stage it in shared memory (each in its own layout) */
template <typename T, int D>
__device__ __forceinline__ uint2 pf_q4(const attn_prefill_params &p, const pf_block<T> &blk, int r, int d,
                                       float qscale) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < blk.nr)
        v = *reinterpret_cast<const float4 *>(p.q + (long)(blk.row0 + blk.t0 + r) * blk.q_stride + (long)blk.head * D +
                                              d);
    uint2 u;
    u.x = zmma::tc_type<T>::pack(v.x * qscale, v.y * qscale);
    u.y = zmma::tc_type<T>::pack(v.z * qscale, v.w * qscale);
    return u;
}

/* One key tile of 64 keys for this thread's two rows, in the m16n8 accumulator layout: s[4 n + e] is row g + 8 (e >>
 * 1) (position pos_r0 + 8 (e >> 1)), key kt + 8 n + 2 tq + (e & 1), in the log2 domain. Masks the keys past each
 * row's position when the tile reaches past the block's first row position pmin (a diagonal tile), then the online
 * soft-max in f32: m[h] becomes the running row max (over the 4 lanes of the row group), alpha[h] = exp2(old m -
 * new m) (0 while the row has seen no key), s = exp2(s - m), l[h] = l[h] alpha[h] + this lane's sum of s. A tile
 * entirely past a row's position leaves the row as it was (alpha 1, p 0). The caller rescales its O by alpha. */
__device__ __forceinline__ void pf_softmax(float *s, int kt, int pmin, int pos_r0, int tq, float (&m)[2], float (&l)[2],
                                           float (&alpha)[2]) {
    if (kt + 63 > pmin) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (kt + n * 8 + 2 * tq + (e & 1) > pos_r0 + (e >> 1) * 8) s[4 * n + e] = -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[h], mx);
        const float ms = mnew == -INFINITY ? 0.f : mnew;
        alpha[h] = exp2f(m[h] - ms);
        m[h] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[4 * n + 2 * h] = exp2f(s[4 * n + 2 * h] - ms);
            s[4 * n + 2 * h + 1] = exp2f(s[4 * n + 2 * h + 1] - ms);
            sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
        }
        l[h] = l[h] * alpha[h] + sum;
    }
}
#endif
