/* cuda/attn_prefill_tc.cu: tensor-core causal prefill attention (FlashAttention-2 style) for F16/BF16 KV caches,
 * head sizes 64, 80, 96 and 128 (see attn_prefill_tc.h for the contract and the arithmetic).
 *
 * One block per (query head, tile of 16 * W query rows, sequence), W = kWarps warps of 16 rows each. The block
 * converts its q rows (f32, scaled by scale * log2 e) to the cache type once into shared memory, and each warp
 * keeps its 16 x head_dim Q fragments in registers. K/V tiles of 64 keys stream through two shared-memory buffers
 * with cp.async (tile j + 1 is in flight while tile j is computed); positions past the last key the block needs are
 * zero-filled, never read. Shared rows are stored with their 16-byte chunks XOR-swizzled by (row & 7) (head sizes
 * 64 and 128; 80 and 96 pad each row by one chunk instead, lay), so the ldmatrix reads of 8 rows x 16 bytes hit 8
 * distinct bank groups. Per tile each warp computes S = Q K^T (mma.sync
 * m16n8k16, f32 accumulators; K read by ldmatrix), masks keys past each row's position only on tiles that reach
 * past the block's first row position (the diagonal tiles), updates the running max and sum in f32 (exp2), rescales
 * its O accumulators, rounds P to the cache type in registers (the S accumulator layout is the A operand layout of
 * the next mma) and adds P V (V read by ldmatrix.trans). A key tile entirely past a row's position leaves that
 * row's state exactly as it was (max unchanged, alpha = 1, p = 0), so a row's result does not depend on which block
 * or chunk held it.
 * The tile order runs the last query tiles of a sequence (the most keys) first, so the short ones fill the
 * tail of the wave.
 * cu_settings.prefill_tc = 0 runs the scalar kernel of cuda/attention.cu everywhere. The kernel keeps a SPLIT
 * template form (separate K and V waits) that the launcher does not instantiate: it measured 17% slower, as did
 * 8-warp tiles (2-3%). Where attn_prefill_wg_wants (sm_90, head sizes 64 and 128) the launch runs the kernel's
 * wgmma form instead (cuda/attn_prefill_wg.cu), which gives these bits. */
#include "attn_prefill_tc.h"
#include "attn_prefill_tile.cuh"
#include "attn_prefill_wg.h"
#include "cu_host.h"
#include "kv_page.cuh"
#include "mma_util.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <atomic>

namespace {

using namespace zmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeys = 64;          /* keys per K/V tile */
static_assert(kKeys == 64, "pf_block (attn_prefill_tile.cuh) counts key tiles of 64");
constexpr int kWarpRows = 16;      /* query rows per warp (the mma's M) */

std::atomic<int> s_force{-1};      /* attn_prefill_tc_force: -1 the settings, 0 off, 1 on */
constexpr int kWarps = 4;          /* warps per block: 64-row query tiles */

/* shared rows: head sizes that are multiples of 64 (8 chunks or more, a multiple of 8) XOR-swizzle their 16-byte
 * chunks by (row & 7); 80 and 96 (10 and 12 chunks, which the swizzle would carry past the row) pad each row by
 * one chunk instead: an odd number of chunks between rows puts 8 consecutive rows' chunk c in 8 distinct bank
 * groups as well */
template <int D> __host__ __device__ constexpr bool tc_swz() { return D % 64 == 0; }
template <int D> __host__ __device__ constexpr int tc_rs() { return tc_swz<D>() ? D : D + 8; } /* elements a row */
template <int D> __device__ __forceinline__ int lay(int r, int c) {
    if constexpr (tc_swz<D>()) return sw<D>(r, c);
    else return r * tc_rs<D>() + c * 8;
}

template <typename T, int D, int W> constexpr size_t tc_smem() {
    return sizeof(T) * ((size_t)W * kWarpRows * tc_rs<D>() + 4 * (size_t)kKeys * tc_rs<D>()); /* Q + 2 x (K + V) */
}

/* grid: (n_heads, query tiles, n_seq); W warps; q pre-scale qscale = scale * log2(e); SPLIT: see tc_knobs.split */
template <typename T, int D, int W, bool SPLIT>
/* 4 warps: 2 blocks per SM (shared memory allows 2 at D = 128); 8 warps: 1 (no register cap: O, Q and S
 * fragments take ~170 registers) */
__global__ void __launch_bounds__(W * 32, W == 4 ? 2 : 1)
prefill_tc_kernel(attn_prefill_params p, int group, float qscale) {
    constexpr int R = W * kWarpRows;    /* query rows per block */
    constexpr int NT = W * 32;          /* threads */
    constexpr int CH = D / 8;           /* 16-byte chunks per row */
    constexpr int DK = D / 16;          /* k-steps of Q K^T */
    constexpr int DN = D / 8;           /* n-tiles of the O accumulator */
    constexpr int RS = tc_rs<D>();      /* elements between shared rows */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sq = reinterpret_cast<T *>(smem_raw); /* [R][RS] */
    T *sk = sq + R * RS;                     /* [2][kKeys][RS] */
    T *sv = sk + 2 * kKeys * RS;             /* [2][kKeys][RS] */

    pf_block<T> blk;
    if (!pf_block_at<T, D, R>(blk, p, group)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* K (kv bit 0) and/or V (bit 1) tile j into buffer b: 64 keys x CH chunks each, zero past kend; one commit */
    auto load_kv = [&](int j, int b, int kv) {
        T *dk = sk + b * kKeys * RS, *dv = sv + b * kKeys * RS;
        for (int i = tid; i < kKeys * CH; i += NT) {
            const int r = i / CH, c = i - r * CH;
            const int key = j * kKeys + r;
            const bool ok = key < blk.kend;
            const long kr = !ok ? 0 : p.blocks ? kv_page_row(p.blocks, p.kv_block_log2, blk.sl, 0, key) : (long)key;
            const long off = ok ? kr * blk.row_stride + c * 8 : 0;
            if (kv & 1) cp_async16_zfill(dk + lay<D>(r, c), blk.kbase + off, ok);
            if (kv & 2) cp_async16_zfill(dv + lay<D>(r, c), blk.vbase + off, ok);
        }
        cp_async_commit();
    };
    /* in flight while q is converted; SPLIT: groups K(0), V(0), then per tile K(j + 1) and V(j + 1) */
    if (SPLIT) {
        load_kv(0, 0, 1);
        load_kv(0, 0, 2);
    } else {
        load_kv(0, 0, 3);
    }

    for (int i = tid; i < R * D / 4; i += NT) {
        const int r = i / (D / 4), d = (i - r * (D / 4)) * 4;
        *reinterpret_cast<uint2 *>(sq + lay<D>(r, d >> 3) + (d & 7)) = pf_q4<T, D>(p, blk, r, d, qscale);
    }
    __syncthreads();
    /* warp's Q as A fragments: lanes 0-15 address rows 0-15 at chunk 2k, lanes 16-31 the same rows at 2k + 1 */
    uint32_t qf[DK][4];
#pragma unroll
    for (int kk = 0; kk < DK; kk++) ldsm_x4(qf[kk], sq + lay<D>(warp * kWarpRows + (lane & 15), 2 * kk + (lane >> 4)));

    const bool active = warp * kWarpRows < blk.nr; /* a warp of padding rows only skips the math */
    const int g = lane >> 2, tq = lane & 3;     /* mma fragment coordinates: row group, column pair */
    const int pos_r0 = blk.pmin + warp * kWarpRows + g; /* position of this thread's row g; row g + 8 is +8 */
    float o[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int j = 0; j < blk.nkt; j++) {
        if (SPLIT) {
            /* pending: K(j), V(j); K buffer (j + 1) & 1 was last read by S(j - 1), before this barrier */
            cp_async_wait<1>();
            __syncthreads();
            if (j + 1 < blk.nkt) load_kv(j + 1, (j + 1) & 1, 1);
        } else if (j + 1 < blk.nkt) {
            load_kv(j + 1, (j + 1) & 1, 3);
            cp_async_wait<1>();
            __syncthreads();
        } else {
            cp_async_wait<0>();
            __syncthreads();
        }
        const T *vb = sv + (j & 1) * kKeys * RS;
        float s[kKeys / 8][4];
        if (active) {
            const T *kb = sk + (j & 1) * kKeys * RS;
#pragma unroll
            for (int n = 0; n < kKeys / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            /* S = Q K^T: ldmatrix x4 gives the B fragments of key n-tiles 2np and 2np + 1 */
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
#pragma unroll
                for (int np = 0; np < kKeys / 16; np++) {
                    uint32_t b[4];
                    ldsm_x4(b, kb + lay<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
                    tc_type<T>::mma(s[2 * np], qf[kk], b[0], b[1]);
                    tc_type<T>::mma(s[2 * np + 1], qf[kk], b[2], b[3]);
                }
            }
            /* mask and online soft-max (cuda/attn_prefill_tile.cuh), then O rescaled by alpha */
            float alpha[2];
            pf_softmax(&s[0][0], j * kKeys, blk.pmin, pos_r0, tq, m, l, alpha);
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int n = 0; n < DN; n++) {
                    o[n][2 * h] *= alpha[h];
                    o[n][2 * h + 1] *= alpha[h];
                }
        }
        if (SPLIT) {
            /* pending: V(j), K(j + 1); V buffer (j + 1) & 1 was last read by P V(j - 1), before this barrier */
            if (j + 1 < blk.nkt) cp_async_wait<1>();
            else cp_async_wait<0>();
            __syncthreads();
        }
        if (active) {
            /* O += P V: the accumulators of key n-tiles 2kk, 2kk + 1 are the A fragment of k-step kk */
#pragma unroll
            for (int kk = 0; kk < kKeys / 16; kk++) {
                uint32_t a[4];
                a[0] = tc_type<T>::pack(s[2 * kk][0], s[2 * kk][1]);
                a[1] = tc_type<T>::pack(s[2 * kk][2], s[2 * kk][3]);
                a[2] = tc_type<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = tc_type<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, vb + lay<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
                    tc_type<T>::mma(o[2 * dp], a, b[0], b[1]);
                    tc_type<T>::mma(o[2 * dp + 1], a, b[2], b[3]);
                }
            }
        }
        if (SPLIT) {
            if (j + 1 < blk.nkt) load_kv(j + 1, (j + 1) & 1, 2);
        } else {
            __syncthreads();   /* buffer j & 1 is refilled by the next iteration's load of tile j + 2 */
        }
    }

#pragma unroll
    for (int h = 0; h < 2; h++) {
        float sum = l[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = warp * kWarpRows + g + 8 * h;
        if (!active || r >= blk.nr) continue;
        const float inv = 1.f / sum;
        float *orow = p.out + (long)(blk.row0 + blk.t0 + r) * blk.out_stride + (long)blk.head * D + 2 * tq;
#pragma unroll
        for (int n = 0; n < DN; n++)
            *reinterpret_cast<float2 *>(orow + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

template <typename T, int D, int W, bool SPLIT>
cudaError_t tc_launch_t(const attn_prefill_params *p, cudaStream_t st) {
    constexpr size_t smem = tc_smem<T, D, W>();
    constexpr int R = W * kWarpRows;
    const long tiles = ((long)p->max_rows + R - 1) / R;
    if (tiles > 65535) return cudaErrorInvalidValue;
    if (smem > 48 * 1024) {
        /* a function attribute, not a stream operation: allowed while the stream is being captured */
        const cudaError_t e = cudaFuncSetAttribute(prefill_tc_kernel<T, D, W, SPLIT>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    const dim3 grid((unsigned)p->n_heads, (unsigned)tiles, (unsigned)p->n_seq);
    prefill_tc_kernel<T, D, W, SPLIT><<<grid, W * 32, smem, st>>>(*p, p->n_heads / p->n_kv_heads, scale * kLog2e);
    return cudaGetLastError();
}

template <typename T, int W>
cudaError_t tc_launch_d(const attn_prefill_params *p, cudaStream_t st) {
    switch (p->head_dim) {
    case 64: return tc_launch_t<T, 64, W, false>(p, st);
    case 80: return tc_launch_t<T, 80, W, false>(p, st);
    case 96: return tc_launch_t<T, 96, W, false>(p, st);
    case 128: return tc_launch_t<T, 128, W, false>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t tc_launch_w(const attn_prefill_params *p, cudaStream_t st) {
    return tc_launch_d<T, kWarps>(p, st);
}

bool tc_served(const attn_prefill_params *p) {
    return (p->kv_type == ATTN_KV_F16 || p->kv_type == ATTN_KV_BF16) &&
           (p->head_dim == 64 || p->head_dim == 80 || p->head_dim == 96 || p->head_dim == 128);
}

} // namespace

extern "C" int attn_prefill_tc_wants(const attn_prefill_params *p) {
    if (!p || !tc_served(p)) return 0;
    const int f = s_force.load(std::memory_order_relaxed);
    return f >= 0 ? f : cu_settings_get()->prefill_tc;
}

extern "C" void attn_prefill_tc_force(int mode) { s_force.store(mode < 0 ? -1 : mode ? 1 : 0); }

extern "C" cudaError_t attn_prefill_tc_launch(const attn_prefill_params *p, cudaStream_t stream) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->seq_row0 || !p->seq_rows || !p->seq_slot ||
        !p->seq_pos0 || !p->out || !tc_served(p))
        return cudaErrorInvalidValue;
    if (p->n_seq < 1 || p->n_seq > 65535 || p->max_rows < 1 || p->n_heads < 1 || p->n_heads > 65535 ||
        p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads || p->n_ctx < 1 || p->q_stride < 0 || p->out_stride < 0 ||
        (p->blocks && (p->kv_block_log2 < 0 || p->kv_block_log2 > 8)))
        return cudaErrorInvalidValue;
    if (attn_prefill_wg_wants(p)) return attn_prefill_wg_launch(p, stream); /* sm_90a: the same bits */
    return p->kv_type == ATTN_KV_F16 ? tc_launch_w<__half>(p, stream) : tc_launch_w<__nv_bfloat16>(p, stream);
}
