/* cuda/attn_prefill_wg.cu: the wgmma form of the tensor-core causal prefill attention for F16/BF16 caches of head
 * size 64 or 128 (see attn_prefill_wg.h for the contract: the bits of cuda/attn_prefill_tc.cu's kernel).
 *
 * One block (one warpgroup, 4 warps) per (query head, tile of 64 query rows, sequence), as the mma.sync kernel's
 * 4-warp blocks. The block converts its q rows (f32, scaled by scale * log2 e) to the cache type once and each warp
 * keeps its 16 x head_dim rows as wgmma A fragments in registers (the m16n8k16 A layout). K/V tiles of 64 keys
 * stream with cp.async through 3 stages of shared memory in the 128-byte swizzle ([64][64] column blocks), zero
 * past the last key the block needs; Q is staged in stage 2's K tile, which the first refill overwrites after
 * every warp holds its fragments. Per key tile j the warpgroup issues
 *   S(j + 1) = Q K(j + 1)^T   (register A, K-major B: DK k16 steps of m64n64),
 *   O += P(j) V(j)            (register A: P rounded to the cache type, MN-major B: 4 k16 steps per 64 columns),
 * then, while P V runs, masks and soft-maxes S(j + 1) (the mma.sync kernel's f32 arithmetic, row max and sum over
 * the 4 lanes of a row group), and after P V retires rescales O by the new alpha and rounds P(j + 1) into the A
 * registers P V(j) read. O's update order is the mma.sync kernel's: (O + P(j) V(j)) * alpha(j + 1) + P(j + 1)
 * V(j + 1). Each thread computes the row offsets of its 8 (D 128) or 4 (D 64) chunks of a tile before their
 * copies: the copy loop has no branch. */
#include "attn_prefill_wg.h"
#include "attn_prefill_tile.cuh"
#include "cu_host.h"
#include "kv_page.cuh"
#include "mma_util.cuh"
#include "wgmma.cuh"
#include "wtc.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <atomic>

namespace {

using namespace zmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeys = 64;     /* keys per K/V tile, query rows per block (wgmma's M) */
static_assert(kKeys == 64, "pf_block (attn_prefill_tile.cuh) counts key tiles of 64");
constexpr int kThreads = 128; /* one warpgroup */
constexpr int kStages = 3;    /* K/V tile pairs in shared memory: j in P V, j + 1 in Q K^T, j + 2 landing */

std::atomic<int> s_force{-1}; /* attn_prefill_wg_force: -1 default, 0 off */

#if ZWG_ON
/* element offset of 16-byte chunk c of row r in a [64][D] tile kept as D / 64 column blocks of [64][64], each in
 * the 128-byte swizzle (chunk c & 7 of row r at (c & 7) ^ (r & 7)): the layout of the wgmma descriptors, and
 * ldmatrix reads of 8 rows at one chunk hit 8 distinct bank groups */
__device__ __forceinline__ int wl(int r, int c) {
    return (c >> 3) * (kKeys * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}
#endif

/* bytes of dynamic shared memory: kStages x (K + V) tiles of 64 x D 16-bit values (Q lives in stage 2's K) */
template <int D> constexpr size_t wg_smem() { return (size_t)kStages * 2 * kKeys * D * 2; }

/* grid: (n_heads, query tiles, n_seq); q pre-scale qscale = scale * log2(e). 2 blocks per SM: 96 KiB of shared
 * memory each at D = 128 (no register cap below the 170 the kernel takes) */
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 2) prefill_wg_kernel(attn_prefill_params p, int group, float qscale) {
#if ZWG_ON
    constexpr int CH = D / 8;         /* 16-byte chunks per row */
    constexpr int DK = D / 16;        /* k16 steps of Q K^T */
    constexpr int NB = D / 64;        /* 64-column blocks of O (one m64n64 P V step each) */
    constexpr int TE = kKeys * D;     /* elements of one K or V tile */
    constexpr int RS = kThreads / CH; /* rows between a thread's chunks of a tile: 8 (D 128) or 16 (D 64) */
    constexpr int RPT = kKeys / RS;   /* chunks of a K (or V) tile per thread */
    extern __shared__ __align__(1024) unsigned char pw_smem[];
    T *const sst = reinterpret_cast<T *>(pw_smem); /* stage s: K at 2 s TE, V at (2 s + 1) TE */
    T *const sq = sst + 4 * TE;                    /* Q in stage 2's K tile */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    pf_block<T> blk;
    if (!pf_block_at<T, D, kKeys>(blk, p, group)) return;

    /* this thread copies chunk lc of rows lr + RS k (k < RPT) of each K and V tile; RS is a multiple of 8, so
     * the rows share one swizzle phase and their shared offsets step by RS rows */
    const int lr = tid / CH, lc = tid % CH;
    const int soff = wl(lr, lc);
    /* K and V tile j into stage j % kStages (nothing past the block's tiles); one commit either way. Rows past
     * kend are zero-filled (nothing read); their address is kend - 1's, a row the sequence has. The row offsets
     * come first, then the copies: no branch per chunk */
    auto load_kv = [&](int j) {
        if (j < blk.nkt) {
            T *dk = sst + (j % kStages) * 2 * TE + soff;
            const int key0 = j * kKeys + lr;
            long off[RPT];
            if (p.blocks) {
#pragma unroll
                for (int k = 0; k < RPT; k++)
                    off[k] = kv_page_row(p.blocks, p.kv_block_log2, blk.sl, 0, min(key0 + RS * k, blk.kend - 1)) *
                             blk.row_stride;
            } else {
#pragma unroll
                for (int k = 0; k < RPT; k++) off[k] = (long)min(key0 + RS * k, blk.kend - 1) * blk.row_stride;
            }
#pragma unroll
            for (int k = 0; k < RPT; k++) {
                const bool ok = key0 + RS * k < blk.kend;
                cp_async16_zfill(dk + RS * k * 64, blk.kbase + off[k] + lc * 8, ok);
                cp_async16_zfill(dk + TE + RS * k * 64, blk.vbase + off[k] + lc * 8, ok);
            }
        }
        cp_async_commit();
    };
    load_kv(0);
    load_kv(1);

    for (int i = tid; i < kKeys * D / 4; i += kThreads) {
        const int r = i / (D / 4), d = (i - r * (D / 4)) * 4;
        *reinterpret_cast<uint2 *>(sq + wl(r, d >> 3) + (d & 7)) = pf_q4<T, D>(p, blk, r, d, qscale);
    }
    cp_async_wait<1>(); /* tile 0 */
    zwg::proxy_fence(); /* this thread's landed copies, before the wgmma (async proxy) reads */
    __syncthreads();    /* q and tile 0 for every thread */
    /* the warp's Q as A fragments: lanes 0-15 address rows 0-15 at chunk 2k, lanes 16-31 the same rows at 2k + 1 */
    uint32_t qf[DK][4];
#pragma unroll
    for (int kk = 0; kk < DK; kk++) ldsm_x4(qf[kk], sq + wl(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));

    const int g = lane >> 2, tq = lane & 3;  /* accumulator coordinates: row group, column pair */
    const int pos_r0 = blk.pmin + warp * 16 + g; /* position of this thread's row g; row g + 8 is +8 */
    float s[32], o[NB][32];                  /* s[4 n + e]: the mma.sync kernel's s[n][e] */
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[b][i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
    uint32_t pa[4][4]; /* P of the tile in P V: the A fragments of its 4 k16 steps */

    /* issues S = Q K(j)^T into s */
    auto qk = [&](int j) {
        const T *kb = sst + (j % kStages) * 2 * TE;
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.f;
        zwg::fence();
#pragma unroll
        for (int kk = 0; kk < DK; kk++)
            zwg::mma_r64<T, 0>::run(s, qf[kk], zwg::desc(kb + (kk >> 2) * (kKeys * 64) + (kk & 3) * 16));
        zwg::commit();
    };
    /* issues O += P V(j), P in pp */
    auto pv = [&](int j, const uint32_t(&pp)[4][4]) {
        const T *vb = sst + (j % kStages) * 2 * TE + TE;
        zwg::fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                zwg::mma_r64<T, 1>::run(o[b], pp[kk], zwg::desc_mn(vb + b * (kKeys * 64) + kk * 16 * 64));
        zwg::commit();
    };
    /* P rounded to the cache type into pa (once P V of the previous tile retired: it reads pa) */
    auto pack = [&]() {
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) pa[kk][i] = tc_type<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    };

    /* waits for P V: O readable again, P's registers free */
    auto retire_pv = [&]() {
        zwg::wait<0>();
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
            for (int i = 0; i < 32; i++) zwg::reg_fence(o[b][i]);
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) zwg::reg_keep(pa[kk][i]);
    };

    qk(0);
    zwg::wait<0>();
#pragma unroll
    for (int i = 0; i < 32; i++) zwg::reg_fence(s[i]);
    pf_softmax(s, 0, blk.pmin, pos_r0, tq, m, l, alpha); /* O is 0: its rescale by alpha would leave it 0 */
    pack();
    /* the last tile's P V runs after the loop: every S issue and wait in the loop is unconditional (ptxas
     * serializes the wgmma pipeline when a wait<1> follows a conditional issue) */
    for (int j = 0; j + 1 < blk.nkt; j++) {
        cp_async_wait<0>(); /* tile j + 1 */
        zwg::proxy_fence();
        /* tile j + 1 landed for every thread; every warp retired S(j) and P V(j - 1) (and read Q into
         * registers): stage (j + 2) % kStages, tile j - 1's, is free */
        __syncthreads();
        load_kv(j + 2);
        qk(j + 1);
        pv(j, pa);
        zwg::wait<1>(); /* S(j + 1); P V(j) may still run */
#pragma unroll
        for (int i = 0; i < 32; i++) zwg::reg_fence(s[i]);
        pf_softmax(s, (j + 1) * kKeys, blk.pmin, pos_r0, tq, m, l, alpha);
        /* ptxas hoists a wgmma wait to the start of its basic block, ahead of the soft-max that is to overlap P V:
         * this uniform branch (never taken: j + 1 < nkt <= 2^25) ends the block first (its own wait: no exit with
         * a wgmma in flight) */
        if (j == 0x7ffffff0) {
            zwg::wait<0>();
            __trap();
        }
        retire_pv();
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
            for (int i = 0; i < 32; i++) o[b][i] *= alpha[(i >> 1) & 1];
        pack();
    }
    pv(blk.nkt - 1, pa); /* its tile landed before the last barrier (tile 0: before the first) */
    retire_pv();

#pragma unroll
    for (int h = 0; h < 2; h++) {
        float sum = l[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = warp * 16 + g + 8 * h;
        if (r >= blk.nr) continue;
        const float inv = 1.f / sum;
        float *orow = p.out + (long)(blk.row0 + blk.t0 + r) * blk.out_stride + (long)blk.head * D + 2 * tq;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(orow + n * 8) =
                make_float2(o[n >> 3][4 * (n & 7) + 2 * h] * inv, o[n >> 3][4 * (n & 7) + 2 * h + 1] * inv);
    }
#endif
}

template <typename T, int D> cudaError_t wg_launch_t(const attn_prefill_params *p, cudaStream_t st) {
    constexpr size_t smem = wg_smem<D>();
    const long tiles = ((long)p->max_rows + kKeys - 1) / kKeys;
    if (tiles > 65535) return cudaErrorInvalidValue;
    /* a function attribute, not a stream operation: allowed while the stream is being captured */
    const cudaError_t e =
        cudaFuncSetAttribute(prefill_wg_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    const dim3 grid((unsigned)p->n_heads, (unsigned)tiles, (unsigned)p->n_seq);
    prefill_wg_kernel<T, D><<<grid, kThreads, smem, st>>>(*p, p->n_heads / p->n_kv_heads, scale * kLog2e);
    return cudaGetLastError();
}

template <typename T> cudaError_t wg_launch_d(const attn_prefill_params *p, cudaStream_t st) {
    return p->head_dim == 64 ? wg_launch_t<T, 64>(p, st) : wg_launch_t<T, 128>(p, st);
}

bool wg_served(const attn_prefill_params *p) {
    return (p->kv_type == ATTN_KV_F16 || p->kv_type == ATTN_KV_BF16) && (p->head_dim == 64 || p->head_dim == 128);
}

} // namespace

extern "C" int attn_prefill_wg_wants(const attn_prefill_params *p) {
    if (!p || !wg_served(p) || s_force.load(std::memory_order_relaxed) == 0) return 0;
    return wtc_wgmma();
}

extern "C" void attn_prefill_wg_force(int mode) { s_force.store(mode < 0 ? -1 : mode ? 1 : 0); }

extern "C" cudaError_t attn_prefill_wg_launch(const attn_prefill_params *p, cudaStream_t stream) {
    if (!p || !wg_served(p)) return cudaErrorInvalidValue;
    return p->kv_type == ATTN_KV_F16 ? wg_launch_d<__half>(p, stream) : wg_launch_d<__nv_bfloat16>(p, stream);
}
