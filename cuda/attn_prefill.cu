/* cuda/attn_prefill.cu: causal prefill attention on CUDA cores (see attention.h), for the shapes the tensor-core
 * kernel (cuda/attn_prefill_tc.cu) does not serve: F32 caches, head sizes 8-32 and 256, and every shape with
 * cu_settings.prefill_tc = 0. attn_prefill_launch dispatches between the two. */
#include "attention.h"
#include "attn_prefill_tc.h"
#include "attn_vec.cuh"
#include "kv_page.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

namespace {

/* ---- prefill: one block per (16-row query tile, query head, sequence); 4 warps x 4 rows; 32-key tiles ---- */
constexpr int kPfRowsPerWarp = 4;
constexpr int kPfRows = 4 * kPfRowsPerWarp;
constexpr int kPfKeys = 32;

template <int D> constexpr size_t prefill_smem() {
    return sizeof(float) * ((size_t)kPfRows * D + (size_t)kPfKeys * (D + 1) + (size_t)kPfKeys * D);
}

template <typename T, int D>
__global__ void __launch_bounds__(128) prefill_kernel(attn_prefill_params p, int group, float qscale) {
    constexpr int VEC = vec_traits<T>::VEC;
    constexpr int DC = (D + 31) / 32;   /* output dims per lane */
    extern __shared__ float smem[];
    float *sq = smem;                                /* [kPfRows][D], pre-scaled */
    float *sk = sq + kPfRows * D;                    /* [kPfKeys][D + 1] */
    float *sv = sk + kPfKeys * (D + 1);              /* [kPfKeys][D] */

    const int seq = blockIdx.z, head = blockIdx.y;
    const int rows = p.seq_rows[seq];
    const int t0 = blockIdx.x * kPfRows;
    if (t0 >= rows) return;
    const int row0 = p.seq_row0[seq], pos0 = p.seq_pos0[seq];
    const int kvh = head / group;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long q_stride = p.q_stride ? p.q_stride : (long)p.n_heads * D;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    const int nr = min(kPfRows, rows - t0);

    for (int i = threadIdx.x; i < kPfRows * D; i += blockDim.x) {
        const int rr = i / D, d = i - rr * D;
        sq[i] = rr < nr ? p.q[(long)(row0 + t0 + rr) * q_stride + (long)head * D + d] * qscale : 0.f;
    }
    const long row_stride = (long)p.n_kv_heads * D;
    const int sl = p.seq_slot[seq]; /* paged KV: the offset of the sequence's block table (kv_page_row) */
    const long slot_base = p.blocks ? (long)kvh * D : (long)sl * p.n_ctx * row_stride + (long)kvh * D;
    const T *kbase = reinterpret_cast<const T *>(p.k_cache) + slot_base;
    const T *vbase = reinterpret_cast<const T *>(p.v_cache) + slot_base;
    const int kend = pos0 + t0 + nr;    /* keys [0, kend) are needed by some row of this tile */

    float m[kPfRowsPerWarp], l[kPfRowsPerWarp], acc[kPfRowsPerWarp][DC];
    int mypos[kPfRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kPfRowsPerWarp; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
        const int rr = warp * kPfRowsPerWarp + i;
        mypos[i] = rr < nr ? pos0 + t0 + rr : -1;     /* -1: no row, every key masked */
#pragma unroll
        for (int c = 0; c < DC; c++) acc[i][c] = 0.f;
    }

    for (int kt = 0; kt < kend; kt += kPfKeys) {
        __syncthreads();
        for (int i = threadIdx.x; i < kPfKeys * D / VEC; i += blockDim.x) {
            const int j = i / (D / VEC), d = (i - j * (D / VEC)) * VEC;
            float kf[VEC], vf[VEC];
            if (kt + j < kend) {
                const long kr = p.blocks ? kv_page_row(p.blocks, p.kv_block_log2, sl, 0, kt + j) : (long)(kt + j);
                cvt_any<T>(*reinterpret_cast<const uint4 *>(kbase + kr * row_stride + d), kf);
                cvt_any<T>(*reinterpret_cast<const uint4 *>(vbase + kr * row_stride + d), vf);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) kf[e] = vf[e] = 0.f;
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                sk[j * (D + 1) + d + e] = kf[e];
                sv[j * D + d + e] = vf[e];
            }
        }
        __syncthreads();
        const int key = kt + lane;
        float s[kPfRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kPfRowsPerWarp; i++) s[i] = 0.f;
        const float *krow = sk + lane * (D + 1);
        const float *qw = sq + warp * kPfRowsPerWarp * D;
#pragma unroll 8
        for (int d = 0; d < D; d++) {
            const float kd = krow[d];
#pragma unroll
            for (int i = 0; i < kPfRowsPerWarp; i++) s[i] = fmaf(qw[i * D + d], kd, s[i]);
        }
#pragma unroll
        for (int i = 0; i < kPfRowsPerWarp; i++) {
            if (key > mypos[i]) s[i] = -INFINITY;
            float mx = s[i];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            mx = fmaxf(mx, m[i]);
            const float ms = mx == -INFINITY ? 0.f : mx;
            const float alpha = exp2f(m[i] - ms);
            const float pj = exp2f(s[i] - ms);
            float ps = pj;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l[i] = l[i] * alpha + ps;
            m[i] = mx;
#pragma unroll
            for (int c = 0; c < DC; c++) acc[i][c] *= alpha;
            s[i] = pj;
        }
#pragma unroll 4
        for (int j = 0; j < kPfKeys; j++) {
#pragma unroll
            for (int c = 0; c < DC; c++) {
                const int d = lane + 32 * c;
                /* lanes past the head (D not a multiple of 32: 8, 16, 80) read nothing: past the last row of sv
                 * lies the end of shared memory */
                const float vd = (D % 32 == 0 || d < D) ? sv[j * D + (d < D ? d : 0)] : 0.f;
#pragma unroll
                for (int i = 0; i < kPfRowsPerWarp; i++) {
                    const float pj = __shfl_sync(0xffffffffu, s[i], j);
                    acc[i][c] = fmaf(pj, vd, acc[i][c]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < kPfRowsPerWarp; i++) {
        const int rr = warp * kPfRowsPerWarp + i;
        if (rr >= nr) continue;
        float *o = p.out + (long)(row0 + t0 + rr) * out_stride + (long)head * D;
        const float inv = 1.f / l[i];
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const int d = lane + 32 * c;
            if (d < D) o[d] = acc[i][c] * inv;
        }
    }
}

template <typename T, int D>
cudaError_t prefill_launch_t(const attn_prefill_params *p, cudaStream_t st) {
    const size_t smem = prefill_smem<D>();
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return e;
    }
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    dim3 grid((unsigned)((p->max_rows + kPfRows - 1) / kPfRows), (unsigned)p->n_heads, (unsigned)p->n_seq);
    prefill_kernel<T, D><<<grid, 128, smem, st>>>(*p, p->n_heads / p->n_kv_heads, scale * kLog2e);
    return cudaGetLastError();
}

template <typename T>
cudaError_t prefill_launch_d(const attn_prefill_params *p, cudaStream_t st) {
    switch (p->head_dim) {
    case 8: return prefill_launch_t<T, 8>(p, st);
    case 16: return prefill_launch_t<T, 16>(p, st);
    case 32: return prefill_launch_t<T, 32>(p, st);
    case 64: return prefill_launch_t<T, 64>(p, st);
    case 80: return prefill_launch_t<T, 80>(p, st);
    case 96: return prefill_launch_t<T, 96>(p, st);
    case 128: return prefill_launch_t<T, 128>(p, st);
    case 256: return prefill_launch_t<T, 256>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" cudaError_t attn_prefill_launch(const attn_prefill_params *p, cudaStream_t stream) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->seq_row0 || !p->seq_rows || !p->seq_slot ||
        !p->seq_pos0 || !p->out)
        return cudaErrorInvalidValue;
    if (p->n_seq < 1 || p->n_seq > 65535 || p->max_rows < 1 || p->n_heads < 1 || p->n_heads > 65535 ||
        p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads || !attn_head_dim_ok(p->head_dim) || p->n_ctx < 1 ||
        p->q_stride < 0 || p->out_stride < 0 || (p->blocks && (p->kv_block_log2 < 0 || p->kv_block_log2 > 8)))
        return cudaErrorInvalidValue;
    if (attn_prefill_tc_wants(p)) return attn_prefill_tc_launch(p, stream); /* tensor cores: F16/BF16, D 64-128 */
    switch (p->kv_type) {
    case ATTN_KV_F32: return prefill_launch_d<float>(p, stream);
    case ATTN_KV_F16: return prefill_launch_d<__half>(p, stream);
    case ATTN_KV_BF16: return prefill_launch_d<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}
