/* cuda/attn_prefill_tile.cuh: the per-tile soft-max of the tensor-core prefill attention, the one definition that
 * cuda/attn_prefill_tc.cu's mma.sync kernel and cuda/attn_prefill_wg.cu's wgmma form both run (so that they give
 * the same bits). Device code only. */
#ifndef ZLLM_CUDA_ATTN_PREFILL_TILE_CUH
#define ZLLM_CUDA_ATTN_PREFILL_TILE_CUH
#include <math.h>

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
