/* cuda/attn_window.cu: sliding-window attention (attn_window.h). Correct-first: one block per (head, row), keys
 * streamed from the cache by lanes of a warp (each lane owns EPL elements of the head, lane + 32 i), scores summed
 * across the warp by a fixed xor tree. */
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "attn_window.h"
#include "kv_page.cuh"

#define S_WARPS 4

static __device__ __forceinline__ float s_ld(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ float s_ld(const __half *p, size_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float s_ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }

template <typename T, int EPL>
static __global__ void __launch_bounds__(S_WARPS * 32) k_attn_window(attn_window_params p, float qscale) {
    __shared__ float s_m[S_WARPS], s_l[S_WARPS], s_o[S_WARPS][EPL * 32];
    const int r = blockIdx.x, h = blockIdx.y, D = p.head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = p.n_heads / p.n_kv_heads, kvh = h / group;
    const int pos = p.pos[r];
    float *out = p.out + ((size_t)r * p.n_heads + h) * D;
    if (pos < 0 || pos >= p.n_ctx) {
        for (int d = threadIdx.x; d < D; d += S_WARPS * 32) out[d] = 0.f;
        return;
    }
    const int lo = pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const float *qh = p.q + ((size_t)r * p.n_heads + h) * D;
    float q[EPL], acc[EPL];
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        const int e = lane + 32 * i;
        q[i] = e < D ? qh[e] * qscale : 0.f;
        acc[i] = 0.f;
    }
    const size_t row = (size_t)p.n_kv_heads * D;
    const int sl = p.slot[r]; /* paged KV: the offset of the row's block table (kv_page_row) */
    const size_t base = p.blocks ? (size_t)kvh * D : (size_t)sl * p.n_ctx * row + (size_t)kvh * D;
    const T *kc = reinterpret_cast<const T *>(p.k_cache) + base;
    const T *vc = reinterpret_cast<const T *>(p.v_cache) + base;
    float m = -INFINITY, l = 0.f;
    for (int j = lo + warp; j <= pos; j += S_WARPS) {
        const size_t jr = p.blocks ? (size_t)kv_page_row(p.blocks, p.kv_block_log2, sl, 0, j) : (size_t)j;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            const int e = lane + 32 * i;
            if (e < D) s = fmaf(q[i], s_ld(kc, jr * row + e), s);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        const float mn = fmaxf(m, s);
        const float alpha = exp2f(m - mn); /* 0 for the first key (m = -inf) */
        const float pr = exp2f(s - mn);
        l = l * alpha + pr;
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            const int e = lane + 32 * i;
            const float v = e < D ? s_ld(vc, jr * row + e) : 0.f;
            acc[i] = fmaf(pr, v, acc[i] * alpha);
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < EPL; i++) s_o[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < S_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    float lsum = 0.f, f[S_WARPS];
    for (int w = 0; w < S_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.f : exp2f(s_m[w] - mx); /* a warp without keys adds nothing */
        lsum += s_l[w] * f[w];
    }
    for (int d = threadIdx.x; d < D; d += S_WARPS * 32) {
        float o = 0.f;
        for (int w = 0; w < S_WARPS; w++) o += s_o[w][d] * f[w];
        out[d] = o / lsum;
    }
}

template <typename T> static cudaError_t s_launch(const attn_window_params *p, float qscale, cudaStream_t st) {
    const dim3 grid((unsigned)p->n_rows, (unsigned)p->n_heads), block(S_WARPS * 32);
    if (p->head_dim <= 32) k_attn_window<T, 1><<<grid, block, 0, st>>>(*p, qscale);
    else if (p->head_dim <= 64) k_attn_window<T, 2><<<grid, block, 0, st>>>(*p, qscale);
    else if (p->head_dim <= 128) k_attn_window<T, 4><<<grid, block, 0, st>>>(*p, qscale);
    else k_attn_window<T, 8><<<grid, block, 0, st>>>(*p, qscale);
    return cudaGetLastError();
}

cudaError_t attn_window_launch(const attn_window_params *p, cudaStream_t stream) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->pos || !p->slot || !p->out || p->n_rows < 1 ||
        p->n_heads > 65535 || p->n_heads < 1 || p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads != 0 ||
        p->head_dim < 1 || p->head_dim > 256 || p->n_ctx < 1 || p->window < 1 ||
        (p->blocks && (p->kv_block_log2 < 0 || p->kv_block_log2 > 8)))
        return cudaErrorInvalidValue;
    const float qscale = (p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)p->head_dim)) * 1.4426950408889634f;
    switch (p->kv_type) {
    case ATTN_KV_F32: return s_launch<float>(p, qscale, stream);
    case ATTN_KV_F16: return s_launch<__half>(p, qscale, stream);
    case ATTN_KV_BF16: return s_launch<__nv_bfloat16>(p, qscale, stream);
    default: return cudaErrorInvalidValue;
    }
}
