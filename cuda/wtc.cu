/* cuda/wtc.cu: 16-bit weight products on tensor cores, batch-invariant (contract and arithmetic: wtc.h).
 *
 * Shared-memory tiles are [rows][64] 16-bit values (8 chunks of 16 bytes per row), chunk c of row r stored at
 * chunk c ^ (r & 7): the ldmatrix reads of 8 consecutive rows at one logical chunk hit 8 distinct bank groups,
 * and on a 1024-byte aligned tile this is exactly the 128-byte swizzle of Hopper's wgmma descriptors and TMA
 * boxes, so all the kernels here share one layout.
 * A operand (W rows) by ldmatrix.x4: lanes 0-15 address rows 0-15 at chunk 2q, lanes 16-31 the same rows at
 * chunk 2q + 1, which yields a0..a3 of m16n8k16 (rows g / g + 8, k 2t / 2t + 8). B operand (x rows, k
 * contiguous) by ldmatrix.x4 over 16 batch rows (two n8 fragments), or, in the narrow kernel, by 32-bit shared
 * loads from the x rows its ring stage carries (b0 = k 2t..2t+1, b1 = k 2t+8..2t+9 of batch row g).
 * Kernels: narrow (mma.sync, M <= 16, and M <= 32 on sm_90 where it fits one wave), wide and wide2 (mma.sync, M > 16 below sm_90 or with ZLLM_CUDA_WGMMA=0),
 * wg (wgmma fed by cp.async: forced forms 4 and 5), ws (wgmma fed by TMA, warp-specialized: M > 16 on sm_90). */
#include "wtc.h"
#include "wgmma.cuh"
#include "mbar.cuh"
#include "act.cuh"
#include <cooperative_groups.h>
#include <type_traits>
#include <cuda.h>
#include <cudaTypedefs.h>
#include "cu_host.h"
#include "mma_util.cuh"
#include "pdl.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <atomic>

using namespace zmma;

namespace {

constexpr int kKT = 64;            /* k elements per stage of the wide kernel; splits are multiples of it */
/* k tiles of one qtc unit (256 elements: wtc_launch_qsplit's sub-splits; read by sm_90a code only) */
[[maybe_unused]] constexpr int kUT = 256 / kKT;
constexpr int kKC = 64;            /* k elements per stage of the narrow kernel (H100, 8B BF16 M = 1: 7.3 ms; 256
                                    * with 3 stages: 8.7 ms) */
constexpr int kNS = 6;             /* narrow kernel: stages of each warp's ring up to 2 batch rows (4 above; see
                                    * launch_t) */
constexpr int kStageN = 16 * kKC;  /* narrow stage: 16 rows x 64 (2 KiB) */
constexpr int kBM = 128, kWS = 4;  /* wide kernel: CTA rows of W and stages (kBN batch rows: a template) */
constexpr int kMaxKs = 8;
constexpr int kSplitRows = 256;    /* the one-CTA-per-split form serves launches of at most this many rows */
/* the narrow kernel serves launches of at most this many rows: one 8-row B fragment up to 8, two up to 16, four up
 * to 32 (H200, 8B F16 at 16 rows: 117 us a layer's four products against 136 for the wgmma cluster form and 127 for
 * the TMA form; at 32 rows, with 32 W rows a CTA, the output and down products are faster than in the TMA form and
 * Q/K/V and gate/up slower: s_form) */
constexpr int kNarrowM = 32;
/* narrow kernel: elements of one ring stage at m batch rows and mt W tiles (W [16 mt][kKC], then x [m][kKC]) */
__host__ __device__ constexpr int narrow_stage(int m, int mt = 1) { return kStageN * mt + m * kKC; }
constexpr size_t kNarrowSmem = (size_t)kMaxKs * 4 * narrow_stage(8) * 2;    /* 96 KiB: ks 8, m 8, 4 stages (and
                                                                               * m 16, 3 stages) */
constexpr size_t kWideSmem64 = (size_t)kWS * (kBM + 64) * kKT * 2;          /* 96 KiB at kBN 64: 2 CTAs per SM */

/* element offset of 16-byte chunk c of row r in a [rows][W] tile, chunks XOR-swizzled by (r & 7) */
template <int W> __device__ __forceinline__ int swz(int r, int c) { return r * W + ((c ^ (r & 7)) << 3); }

/* silu(gate) * up rounded to T, as ops_swiglu_il8_dual rounds it: every SwiGLU epilogue here */
template <typename T> __device__ __forceinline__ T glu_value(float gate, float up) {
    const float v = silu_mul(gate, up);
    if constexpr (std::is_same<T, __nv_bfloat16>::value) return __float2bfloat16_rn(v);
    else return __float2half_rn(v);
}

/* the SwiGLU epilogue (wtc_params.glu) of the same accumulator: W's rows interleave gate and up in blocks of 8, so
 * this thread's rows rbase (16 b + g: gate of feature 8 b + g) and rbase + 8 (the up row of that feature) meet in
 * one thread: out[col][8 b + g] = glu_value(gate, up) */
template <typename T, int NX>
__device__ __forceinline__ void wg_store_glu(const float (&acc)[NX / 2], int rbase, int col0, int t, T *out, int ldg,
                                             int n_out, int m) {
    if (rbase >= n_out) return;   /* n_out is a multiple of 16: rbase + 8 is then inside too */
    const int f = (rbase >> 4) * 8 + (rbase & 7);
#pragma unroll
    for (int j = 0; j < NX / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int col = col0 + 8 * j + 2 * t + e;
            if (col >= m) continue;
            out[(size_t)col * ldg + f] = glu_value<T>(acc[4 * j + e], acc[4 * j + e + 2]);
        }
}

/* M <= 32: CTA = ks warps on MT tiles of 16 W rows, warp s chains split s through its own ring; the split partials
 * are summed in order (wtc.h), tile mt's by warp mt % ks, which stores its columns < m (with glu, their SwiGLU:
 * wg_store_glu). NF batch fragments of 8 rows (NF = 1 up to 8 rows, 2 up to 16, 4 up to 32): each k16 step multiplies MT A
 * fragments of W with NF B fragments of x, and an element's chain (its k order, its split sum) is the same in any
 * fragment and any tile of the CTA, so a row's bits depend on neither NF, MT nor m. A ring stage holds the W tiles
 * [16 MT][64] and the m x rows of the same 64 k [m][64] (chunk c of row r at chunk c ^ (r & 7): the B reads of 8
 * rows hit distinct banks), both by cp.async in one commit group: x then arrives with its weights, NS - 1 stages
 * ahead, and MT tiles share each x row read. (x read from global memory one stage ahead, as before, held each warp
 * to one stage per L2 round trip under full DRAM load: H100 8B BF16 M = 1, gate/up and down at 2.72 TB/s in the
 * graph, 89% of the read ceiling.)
 * The launch bound names one CTA an SM (a launch holds as many as shared memory and threads allow: narrow_per_sm).
 * With the thread count alone ptxas reads each k16 step's fragments just before its product (58 registers at one
 * batch row); with the CTA count it reads the next step's ahead of the current product (64 registers). H200, 8B F16
 * decode 0.3-0.8% faster a step at M = 1 to 16, 1B F16 0.5-1.7% (docs/perf.md). The forms whose registers grew
 * (9 to 16 rows: 96 allocated a thread with 16 W rows a CTA, 112 with 32) still fit the CTAs an SM that
 * narrow_per_sm counts, at every split count: their rings' shared memory binds first. */
template <typename T, int NS = kNS, int NF = 1, int MT = 1>
__global__ void __launch_bounds__(kMaxKs * 32, 1)
    wtc_narrow(const T *__restrict__ w, int n_in, int n_out, int ks, int m, const T *__restrict__ x, int ldx, float *y,
               int ldy, const float *y_in, T *glu, int ldg) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int kW = kStageN * MT; /* W elements of a stage */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * MT;
    const int klen = n_in / ks, k0 = warp * klen, nst = klen / kKC;
    const int sst = narrow_stage(m, MT); /* elements per stage: W, then x */
    T *ring = reinterpret_cast<T *>(smem) + (size_t)warp * NS * sst;
    /* lane's 4 MT W chunks of a stage: rows lane / 8 + 4 j, chunk lane % 8 (addresses computed once) */
    const T *src[4 * MT];
    int soff[4 * MT];
    bool sok[4 * MT];
#pragma unroll
    for (int j = 0; j < 4 * MT; j++) {
        const int r = (lane >> 3) + 4 * j, row = row0 + r;
        sok[j] = row < n_out;
        src[j] = sok[j] ? w + (size_t)row * n_in + k0 + (lane & 7) * 8 : w;
        soff[j] = swz<kKC>(r, lane & 7);
    }
    /* lane's x chunks: rows lane / 8 + 4 j (j < 2 NF, when < m), chunk lane % 8 */
    const int xr = lane >> 3, xc = lane & 7;
    const T *xsrc[2 * NF];
    int xoff[2 * NF];
#pragma unroll
    for (int j = 0; j < 2 * NF; j++) {
        const int r = xr + 4 * j;
        xsrc[j] = x + (size_t)r * ldx + k0 + xc * 8;
        xoff[j] = kW + r * kKC + ((xc ^ (r & 7)) << 3);
    }
    auto load_w = [&](int s) {
        if (s < nst) {
            T *dst = ring + (s % NS) * sst;
#pragma unroll
            for (int j = 0; j < 4 * MT; j++) cp_async16_zfill(dst + soff[j], sok[j] ? src[j] + s * kKC : w, sok[j]);
        }
    };
    auto load_x = [&](int s) {
        if (s < nst) {
            T *dst = ring + (s % NS) * sst;
#pragma unroll
            for (int j = 0; j < 2 * NF; j++)
                if (xr + 4 * j < m) cp_async16_zfill(dst + xoff[j], xsrc[j] + s * kKC, true);
        }
    };
    pdl_trigger();
    /* weights are written once, at load: their first stages stream in while the kernel before finishes (one
     * commit group each); x only after pdl_wait, all NS - 1 stages' rows in one more group, waited for in full
     * before stage 0. From then on group s + 1 carries stage s (its W and its x), so waiting for all but the newest
     * NS - 2 groups before stage s is enough, as with a plain ring */
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        load_w(s);
        cp_async_commit();
    }
    pdl_wait();
#pragma unroll
    for (int s = 0; s < NS - 1; s++) load_x(s);
    /* the warp storing tile mt takes its y_in elements with the x group (waited for in full just below), into
     * s_yin, instead of one L2 round trip after the last barrier (no other CTA writes them; y_in may be y) */
    __shared__ float s_yin[MT][128 * NF];
    if (y_in && !glu) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (mt % ks != warp) continue;
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = row0 + 16 * mt + g + 8 * (e >> 1), col = 8 * f + 2 * t + (e & 1);
                    if (row < n_out && col < m)
                        cp_async4(&s_yin[mt][(f * 32 + lane) * 4 + e], y_in + (size_t)col * ldy + row);
                }
        }
    }
    cp_async_commit();
    cp_async_wait<0>();
    float acc[MT][NF][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int f = 0; f < NF; f++) acc[mt][f][0] = acc[mt][f][1] = acc[mt][f][2] = acc[mt][f][3] = 0.f;
    static_assert(kKC == 64, "a stage is 4 k16 steps and 4 chunks per lane (splits are multiples of 64)");
    for (int s = 0; s < nst; s++) {
        cp_async_wait<NS - 2>();
        __syncwarp();   /* stage s landed for every lane; every lane is done with stage s - 1 (refilled next) */
        load_w(s + NS - 1);
        load_x(s + NS - 1);
        cp_async_commit();
        const T *st = ring + (s % NS) * sst;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ldsm_x4(a[mt], st + swz<kKC>(16 * mt + (lane & 15), 2 * q + (lane >> 4)));
#pragma unroll
            for (int f = 0; f < NF; f++) {
                /* b0 = x[r][16 q + 2t, +1], b1 = x[r][16 q + 8 + 2t, +1], r = 8 f + g: chunks 2q and 2q + 1 of row
                 * r (rows >= m: zero operand, never stored) */
                const int r = 8 * f + g;
                const uint32_t *xs = reinterpret_cast<const uint32_t *>(st + kW + r * kKC);
                const uint32_t b0 = r < m ? xs[(((2 * q) ^ g) << 2) + t] : 0u;
                const uint32_t b1 = r < m ? xs[(((2 * q + 1) ^ g) << 2) + t] : 0u;
#pragma unroll
                for (int mt = 0; mt < MT; mt++) tc_type<T>::mma(acc[mt][f], a[mt], b0, b1);
            }
        }
    }
    cp_async_wait<0>();
    __syncwarp();
    float *part = reinterpret_cast<float *>(ring);   /* this warp's ring is idle now */
    auto part_of = [&](int k) { return reinterpret_cast<const float *>(smem + (size_t)k * NS * sst * sizeof(T)); };
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int f = 0; f < NF; f++)
            *reinterpret_cast<float4 *>(part + ((mt * NF + f) * 32 + lane) * 4) =
                make_float4(acc[mt][f][0], acc[mt][f][1], acc[mt][f][2], acc[mt][f][3]);
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt % ks != warp) continue;
        /* split 0's partial: warp 0's registers, or shared memory for another warp (whose own registers then give
         * way to it) */
        float(&sum)[NF][4] = acc[mt];
        if (warp != 0) {
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const float4 v = *reinterpret_cast<const float4 *>(part_of(0) + ((mt * NF + f) * 32 + lane) * 4);
                sum[f][0] = v.x, sum[f][1] = v.y, sum[f][2] = v.z, sum[f][3] = v.w;
            }
        }
        for (int k = 1; k < ks; k++) {
            const float *pk = part_of(k);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const float4 v = *reinterpret_cast<const float4 *>(pk + ((mt * NF + f) * 32 + lane) * 4);
                sum[f][0] = __fadd_rn(sum[f][0], v.x);
                sum[f][1] = __fadd_rn(sum[f][1], v.y);
                sum[f][2] = __fadd_rn(sum[f][2], v.z);
                sum[f][3] = __fadd_rn(sum[f][3], v.w);
            }
        }
        const int rt = row0 + 16 * mt; /* the tile's first row */
        /* lane (g, t), fragment f: sum[f] = C[g][8f + 2t], C[g][8f + 2t+1], C[g+8][8f + 2t], C[g+8][8f + 2t+1] */
        if (glu) { /* the SwiGLU epilogue: rows g and g + 8 of the tile are gate and up of one feature */
#pragma unroll
            for (int f = 0; f < NF; f++) wg_store_glu<T, 8>(sum[f], rt + g, 8 * f, t, glu, ldg, n_out, m);
            continue;
        }
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rt + g + 8 * (e >> 1), col = 8 * f + 2 * t + (e & 1);
                if (row < n_out && col < m) {
                    const size_t idx = (size_t)col * ldy + row;
                    y[idx] = y_in ? __fadd_rn(sum[f][e], s_yin[mt][(f * 32 + lane) * 4 + e]) : sum[f][e];
                }
            }
    }
}

/* M > 16 below sm_90 (and the forced forms 2 and 3 at any M): CTA tile kBM W rows x kBN batch rows (32, 64 or 128:
 * the smallest covering M), 8 warps as WR x WC (each 16 MI rows x 32 batch rows), kWS-stage cp.async pipeline over
 * 64-wide k tiles. PER_SPLIT: blockIdx.z is one split, its partial goes to part [ks][m][n_out] (the merge kernel
 * sums); else the CTA runs every split, closing each one into tot in order. */
template <typename T, bool PER_SPLIT, int kBN>
__global__ void __launch_bounds__(256, PER_SPLIT ? 2 : 1) wtc_wide(const T *__restrict__ w, int n_in, int n_out, int ks, int m,
                                                   const T *__restrict__ x, int ldx, float *y, int ldy,
                                                   const float *y_in, float *part) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *sA = reinterpret_cast<T *>(smem);        /* [kWS][kBM][kKT] */
    T *sB = sA + (size_t)kWS * kBM * kKT;        /* [kWS][kBN][kKT] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* warps: WC = kBN / 32 columns of 32 batch rows, WR = 8 / WC rows of MI 16-row tiles */
    constexpr int WC = kBN / 32, WR = 8 / WC, MI = kBM / WR / 16;
    const int wr = warp / WC, wc = warp % WC;
    const int col0 = blockIdx.x * kBN, row0 = blockIdx.y * kBM;
    const int klen = n_in / ks, tps = klen / kKT;
    const int kbeg = PER_SPLIT ? (int)blockIdx.z * klen : 0;
    const int nt = PER_SPLIT ? tps : n_in / kKT;
    /* this thread's chunks of a stage: rows tid / 8 + 32 j, chunk tid % 8; element offsets computed once (they
     * fit 32 bits: n_out x n_in and m x ldx are below 2^31 for every served model) */
    constexpr int JA = kBM / 32, JB = kBN / 32;
    const int lr = tid >> 3, lc = tid & 7;
    int aoff[JA], boff[JB], asm_[JA], bsm_[JB];
#pragma unroll
    for (int j = 0; j < JA; j++) {
        const int row = row0 + lr + 32 * j;
        aoff[j] = row < n_out ? row * n_in + kbeg + lc * 8 : -1;
        asm_[j] = swz<kKT>(lr + 32 * j, lc);
    }
#pragma unroll
    for (int j = 0; j < JB; j++) {
        const int col = col0 + lr + 32 * j;
        boff[j] = col < m ? col * ldx + kbeg + lc * 8 : -1;
        bsm_[j] = swz<kKT>(lr + 32 * j, lc);
    }
    auto load_a = [&](int kt, int slot) {
        T *d = sA + (size_t)slot * kBM * kKT;
#pragma unroll
        for (int j = 0; j < JA; j++)
            cp_async16_zfill(d + asm_[j], aoff[j] >= 0 ? w + aoff[j] + kt * kKT : w, aoff[j] >= 0);
    };
    auto load_b = [&](int kt, int slot) {
        T *d = sB + (size_t)slot * kBN * kKT;
#pragma unroll
        for (int j = 0; j < JB; j++)
            cp_async16_zfill(d + bsm_[j], boff[j] >= 0 ? x + boff[j] + kt * kKT : x, boff[j] >= 0);
    };
    pdl_trigger();
    /* the weight tiles of the first stages before pdl_wait (written once, at load), x only after; commit groups
     * {A0..A2, B0}, {B1}, {B2}: stage i is complete once group i is, which is all the waits below assume */
#pragma unroll
    for (int s = 0; s < kWS - 1; s++)
        if (s < nt) load_a(s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kWS - 1; s++) {
        if (s < nt) load_b(s, s);
        cp_async_commit();
    }
    float cur[MI][4][4], tot[PER_SPLIT ? 1 : MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) cur[i][j][e] = 0.f;
    for (int kt = 0; kt < nt; kt++) {
        if (!PER_SPLIT && kt > 0 && kt % tps == 0) {   /* split kt / tps - 1 ends: tot = ((p0 + p1) + ..) */
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        tot[PER_SPLIT ? 0 : i][j][e] =
                            kt == tps ? cur[i][j][e] : __fadd_rn(tot[PER_SPLIT ? 0 : i][j][e], cur[i][j][e]);
                        cur[i][j][e] = 0.f;
                    }
        }
        cp_async_wait<kWS - 2>();
        __syncthreads();   /* tile kt landed for every thread; every warp is done with tile kt - 1's slot */
        if (kt + kWS - 1 < nt) {
            load_a(kt + kWS - 1, (kt + kWS - 1) % kWS);
            load_b(kt + kWS - 1, (kt + kWS - 1) % kWS);
        }
        cp_async_commit();
        const T *a = sA + (size_t)(kt % kWS) * kBM * kKT, *b = sB + (size_t)(kt % kWS) * kBN * kKT;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t af[MI][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < MI; i++) ldsm_x4(af[i], a + swz<kKT>(wr * (16 * MI) + 16 * i + (lane & 15), 2 * q + (lane >> 4)));
#pragma unroll
            for (int j2 = 0; j2 < 2; j2++) {
                uint32_t r4[4];
                ldsm_x4(r4, b + swz<kKT>(wc * 32 + 16 * j2 + (lane & 7) + ((lane >> 4) << 3), 2 * q + ((lane >> 3) & 1)));
                bf[2 * j2][0] = r4[0];
                bf[2 * j2][1] = r4[1];
                bf[2 * j2 + 1][0] = r4[2];
                bf[2 * j2 + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) tc_type<T>::mma(cur[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    cp_async_wait<0>();
    if (!PER_SPLIT && ks > 1) {   /* the last split closes the sum */
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) cur[i][j][e] = __fadd_rn(tot[PER_SPLIT ? 0 : i][j][e], cur[i][j][e]);
    }
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + wr * (16 * MI) + 16 * i + g + 8 * (e >> 1);
                const int col = col0 + wc * 32 + 8 * j + 2 * t + (e & 1);
                if (row < n_out && col < m) {
                    if (PER_SPLIT) {
                        part[((size_t)blockIdx.z * m + col) * n_out + row] = cur[i][j][e];
                    } else {
                        const size_t idx = (size_t)col * ldy + row;
                        y[idx] = y_in ? __fadd_rn(cur[i][j][e], y_in[idx]) : cur[i][j][e];
                    }
                }
            }
}

/* M > 64, splits chained in the CTA (the large-M form: prefill): CTA 128 W rows x 128 batch rows, 4 warps of
 * 64 x 64 (32 mma per 8 ldmatrix), kS2-stage pipeline. The running split sum lives in shared memory, one private
 * column per thread ([value][thread]: conflict-free), so that the registers hold one 64 x 64 accumulator set; the
 * same operations and order as the other forms (wtc.h). */
constexpr int kB2 = 128, kS2 = 3;   /* 4 stages: the same (8B BF16 2k prefill 121.1 against 121.8 ms) */
constexpr size_t kWide2Smem = (size_t)kS2 * 2 * kB2 * kKT * 2 + (size_t)128 * 128 * 4;   /* 96 + 64 KiB */

template <typename T>
__global__ void __launch_bounds__(128, 1) wtc_wide2(const T *__restrict__ w, int n_in, int n_out, int ks, int m,
                                                    const T *__restrict__ x, int ldx, float *y, int ldy,
                                                    const float *y_in) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *sA = reinterpret_cast<T *>(smem);                  /* [kS2][kB2][kKT] */
    T *sB = sA + (size_t)kS2 * kB2 * kKT;                 /* [kS2][kB2][kKT] */
    float *tot = reinterpret_cast<float *>(sB + (size_t)kS2 * kB2 * kKT);   /* [128 values][128 threads] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wr = warp >> 1, wc = warp & 1;
    const int col0 = blockIdx.x * kB2, row0 = blockIdx.y * kB2;
    const int tps = n_in / ks / kKT, nt = n_in / kKT;
    /* this thread's chunks of a stage: rows tid / 8 + 16 j (j < 8), chunk tid % 8 */
    const int lr = tid >> 3, lc = tid & 7;
    const int soff = swz<kKT>(lr, lc);   /* + 16 j rows: the swizzle depends on r & 7 only */
    const long abase = (long)(row0 + lr) * n_in + lc * 8, bbase = (long)(col0 + lr) * ldx + lc * 8;
    auto load = [&](int kt, int slot) {
        T *da = sA + (size_t)slot * kB2 * kKT;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const bool ok = row0 + lr + 16 * j < n_out;
            cp_async16_zfill(da + soff + 16 * j * kKT, ok ? w + abase + (long)16 * j * n_in + kt * kKT : w, ok);
        }
    };
    auto load_b = [&](int kt, int slot) {
        T *db = sB + (size_t)slot * kB2 * kKT;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const bool ok = col0 + lr + 16 * j < m;
            cp_async16_zfill(db + soff + 16 * j * kKT, ok ? x + bbase + (long)16 * j * ldx + kt * kKT : x, ok);
        }
    };
    pdl_trigger();
#pragma unroll
    for (int s = 0; s < kS2 - 1; s++)
        if (s < nt) load(s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kS2 - 1; s++) {
        if (s < nt) load_b(s, s);
        cp_async_commit();
    }
    float cur[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) cur[i][j][e] = 0.f;
    for (int kt = 0; kt < nt; kt++) {
        if (kt > 0 && kt % tps == 0) {   /* split kt / tps - 1 ends: tot = ((p0 + p1) + ..) */
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float *tp = tot + ((i * 8 + j) * 4 + e) * 128 + tid;
                        *tp = kt == tps ? cur[i][j][e] : __fadd_rn(*tp, cur[i][j][e]);
                        cur[i][j][e] = 0.f;
                    }
        }
        cp_async_wait<kS2 - 2>();
        __syncthreads();   /* tile kt landed for every thread; every warp is done with tile kt - 1's slot */
        if (kt + kS2 - 1 < nt) {
            load(kt + kS2 - 1, (kt + kS2 - 1) % kS2);
            load_b(kt + kS2 - 1, (kt + kS2 - 1) % kS2);
        }
        cp_async_commit();
        const T *a = sA + (size_t)(kt % kS2) * kB2 * kKT, *b = sB + (size_t)(kt % kS2) * kB2 * kKT;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t af[4][4], bf[8][2];
#pragma unroll
            for (int i = 0; i < 4; i++)
                ldsm_x4(af[i], a + swz<kKT>(wr * 64 + 16 * i + (lane & 15), 2 * q + (lane >> 4)));
#pragma unroll
            for (int j2 = 0; j2 < 4; j2++) {
                uint32_t r4[4];
                ldsm_x4(r4, b + swz<kKT>(wc * 64 + 16 * j2 + (lane & 7) + ((lane >> 4) << 3), 2 * q + ((lane >> 3) & 1)));
                bf[2 * j2][0] = r4[0];
                bf[2 * j2][1] = r4[1];
                bf[2 * j2 + 1][0] = r4[2];
                bf[2 * j2 + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) tc_type<T>::mma(cur[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = cur[i][j][e];
                if (ks > 1) v = __fadd_rn(tot[((i * 8 + j) * 4 + e) * 128 + tid], v);   /* the last split closes */
                const int row = row0 + wr * 64 + 16 * i + g + 8 * (e >> 1);
                const int col = col0 + wc * 64 + 8 * j + 2 * t + (e & 1);
                if (row < n_out && col < m) {
                    const size_t idx = (size_t)col * ldy + row;
                    y[idx] = y_in ? __fadd_rn(v, y_in[idx]) : v;
                }
            }
}

/* y[c][o] = ((p0 + p1) + ...) (+ y_in[c][o]) over the per-split partials [ks][m][n_out] */
__global__ void wtc_merge(const float *__restrict__ part, int ks, int n_out, int m, float *y, int ldy,
                          const float *y_in) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const size_t n = (size_t)m * n_out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < ks; k++) v = __fadd_rn(v, part[(size_t)k * n + i]);
        const size_t c = i / n_out, o = i % n_out, idx = c * ldy + o;
        y[idx] = y_in ? __fadd_rn(v, y_in[idx]) : v;
    }
}

/* sm_90a: the wgmma forms (cuda/wgmma.cuh; its chains give mma.sync's bits, so these are the same arithmetic).
 * CTA = WG warpgroups (1 or 2) on 64 W rows each x NX batch rows (16 to 256: wgmma's N), the A tile (W) and the
 * B tile (x) of a 64-wide k stage in the 128-byte swizzle that both wgmma and these cp.async loads use, S stages
 * of ring. Iteration kt: stage kt landed (cp.async wait, proxy fence, barrier), stage kt + S - 2 is loaded into
 * the slot that stage kt - 2 used (every warpgroup retired that stage's wgmma group before the barrier: wait<1>
 * below), stage kt's 4 k16 steps are issued as one group, and at most one group stays in flight.
 * CL = false (form 4, chained): the CTA runs every split; at a split's end the accumulator (retired: wait<0>) is
 * added to the running sum in registers, ((p0 + p1) + ..), and restarts from zero. Checked, not chosen
 * automatically: form 6 below is faster at every M it would serve. CL = true (form 5, the decode form for M <= 64):
 * blockIdx.z is the split, the ks CTAs of a tile form one thread-block cluster; each writes its partial to its own
 * shared memory and the cluster sums them in split order through distributed shared memory (CTA z sums a z-th of
 * the tile), so no partial goes through global memory. */
/* y = acc (+ y_in) for one consumer warpgroup's [64 W rows][NX batch rows] accumulator in wgmma's layout (thread
 * lane 4 g + t of warp w holds rows rbase = row0 + 16 w + g and rbase + 8, columns 8 j + 2 t (+ 1)). In batches of
 * 8 fragments (32 values): the residual's loads of a batch all issued before its stores (y_in may be y: each
 * element is read, then written, by this thread only). */
template <int NX>
__device__ __forceinline__ void wg_store(const float (&acc)[NX / 2], int rbase, int col0, int t, float *y, int ldy,
                                         const float *y_in, int n_out, int m) {
    constexpr int kJB = NX / 8 < 8 ? NX / 8 : 8;
    static_assert((NX / 8) % kJB == 0, "whole batches of fragments");
#pragma unroll
    for (int j0 = 0; j0 < NX / 8; j0 += kJB) {
        float yi[kJB * 4];
#pragma unroll
        for (int j = 0; j < kJB; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rbase + 8 * (e >> 1), col = col0 + 8 * (j0 + j) + 2 * t + (e & 1);
                yi[4 * j + e] = y_in && row < n_out && col < m ? y_in[(size_t)col * ldy + row] : 0.f;
            }
#pragma unroll
        for (int j = 0; j < kJB; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rbase + 8 * (e >> 1), col = col0 + 8 * (j0 + j) + 2 * t + (e & 1);
                const float v = acc[4 * (j0 + j) + e];
                if (row < n_out && col < m) y[(size_t)col * ldy + row] = y_in ? __fadd_rn(v, yi[4 * j + e]) : v;
            }
    }
}

template <int WG, int NX, int S> struct wg_shape {
    static constexpr int kBM = 64 * WG, kThreads = 128 * WG;                /* W rows and threads of a CTA */
    static constexpr int kStageElems = (kBM + NX) * kKT;                    /* A then B, 16-bit values */
    static constexpr size_t kSmem = (size_t)S * kStageElems * 2;            /* the ring */
    static constexpr int kPld = kBM + 4;                                    /* cluster partials [NX][kPld] f32 */
    static_assert((size_t)NX * kPld * 4 <= kSmem, "the cluster partial fits in the drained ring");
    static_assert((kBM * kKT * 2) % 1024 == 0 && (NX * kKT * 2) % 1024 == 0, "1024-byte aligned tiles");
    static_assert(kSmem <= 227 * 1024, "shared memory of one CTA");
};
/* ring depth: 4 stages, 6 for the chained 128 x 128 form (one CTA per SM either way at NX >= 128) */
template <int WG, int NX, bool CL> constexpr int wg_stages() { return !CL && NX == 128 && WG == 2 ? 6 : 4; }

template <typename T, int WG, int NX, int S, bool CL>
__global__ void __launch_bounds__(128 * WG, 1) wtc_wg(const T *__restrict__ w, int n_in, int n_out, int ks, int m,
                                                        const T *__restrict__ x, int ldx, float *y, int ldy,
                                                        const float *y_in) {
#if ZWG_ON
    /* its own name: the other kernels declare the same dynamic memory aligned to 16 */
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    using shp = wg_shape<WG, NX, S>;
    constexpr int kBM = shp::kBM, kNT = shp::kThreads;
    constexpr uint32_t kStageBytes = shp::kStageElems * 2;
    const uint32_t ring = smem_u32(wg_smem);   /* [S][A kBM x 64 | B NX x 64] */
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int col0 = blockIdx.x * NX, row0 = blockIdx.y * kBM;
    const int klen = n_in / ks, tps = klen / kKT;
    const int kbeg = CL ? (int)blockIdx.z * klen : 0, nt = CL ? tps : n_in / kKT;
    /* this thread's 16-byte chunks of a stage: chunk i = tid + kNT j of the tile, row i / 8, column chunk i % 8.
     * The main loop does little besides the wgmma (their issue shares the warps): source pointers advance by one
     * stage per load (rows past the matrix stay on a valid row and copy nothing), destinations are byte offsets
     * in a stage, descriptors are slot 0's plus the slot's offset. */
    constexpr int JA = kBM * 8 / kNT, JB = (NX * 8 + kNT - 1) / kNT;
    const T *ap[JA];
    uint32_t aso[JA];
    int asz[JA];   /* 16 or 0 bytes read: the zero fill of rows past n_out */
#pragma unroll
    for (int j = 0; j < JA; j++) {
        const int i = tid + kNT * j, r = i >> 3, c = i & 7;
        asz[j] = row0 + r < n_out ? 16 : 0;
        ap[j] = asz[j] ? w + (size_t)(row0 + r) * n_in + kbeg + c * 8 : w;
        aso[j] = (uint32_t)swz<kKT>(r, c) * 2;
    }
    /* B (up to 16 chunks a thread at NX 256): one row pointer and a mask instead of arrays (registers: the
     * accumulators take NX / 2). Chunk j is row tid / 8 + j kNT / 8: the same r & 7, so the same swizzle. */
    const T *bp = x + (size_t)(col0 + (tid >> 3)) * ldx + kbeg + (tid & 7) * 8;
    const size_t bstride = (size_t)(kNT / 8) * ldx;
    const uint32_t bso = (uint32_t)(kBM * kKT + swz<kKT>(tid >> 3, tid & 7)) * 2;
    uint32_t bmask = 0;   /* bit j: chunk j is inside the tile and its batch row exists */
#pragma unroll
    for (int j = 0; j < JB; j++)
        if (tid + kNT * j < NX * 8 && col0 + (tid >> 3) + (kNT / 8) * j < m) bmask |= 1u << j;
    auto cp16 = [](uint32_t dst, const void *src, int sz) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(sz) : "memory");
    };
    auto load_a = [&](int slot) {   /* the next stage of A into slot */
        const uint32_t d = ring + slot * kStageBytes;
#pragma unroll
        for (int j = 0; j < JA; j++) {
            cp16(d + aso[j], ap[j], asz[j]);
            ap[j] += asz[j] << 2;   /* 64 elements when the row is real */
        }
    };
    auto load_b = [&](int slot) {
        const uint32_t d = ring + slot * kStageBytes + bso;
        const T *p = bp;
        size_t st = bstride;
        asm volatile("" : "+l"(st));   /* opaque: keeps the compiler from holding JB row pointers across the loop */
#pragma unroll
        for (int j = 0; j < JB; j++, p += st) {
            if (JB * kNT > NX * 8 && tid + kNT * j >= NX * 8) continue;   /* chunk past the B tile */
            const bool ok = (bmask >> j) & 1;
            cp16(d + j * (kNT / 8) * kKT * 2, ok ? p : x, ok ? 16 : 0);
        }
        bp += kKT;
    };
    pdl_trigger();
    /* weight tiles of the first stages before pdl_wait (written once, at load), x after; groups {A0.., B0}, {B1},
     * ..: stage i is complete once group i is */
#pragma unroll
    for (int s = 0; s < S - 2; s++)
        if (s < nt) load_a(s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < S - 2; s++) {
        if (s < nt) load_b(s);
        cp_async_commit();
    }
    const uint64_t da0 = zwg::desc(wg_smem + wg * 64 * kKT * 2), db0 = zwg::desc(wg_smem + kBM * kKT * 2);
    float acc[NX / 2], sum[CL ? 1 : NX / 2];
#pragma unroll
    for (int i = 0; i < NX / 2; i++) acc[i] = 0.f;
    int cslot = 0, lslot = S - 2, left = tps;   /* compute slot, load slot, stages left in this split */
    for (int kt = 0; kt < nt; kt++) {
        if (!CL && left == 0) {   /* a split ended: sum = ((p0 + p1) + ..) */
            zwg::wait<0>();
#pragma unroll
            for (int i = 0; i < NX / 2; i++) zwg::reg_fence(acc[i]);
            if (kt == tps) {
#pragma unroll
                for (int i = 0; i < NX / 2; i++) sum[CL ? 0 : i] = acc[i];
            } else {
#pragma unroll
                for (int i = 0; i < NX / 2; i++) sum[CL ? 0 : i] = __fadd_rn(sum[CL ? 0 : i], acc[i]);
            }
#pragma unroll
            for (int i = 0; i < NX / 2; i++) acc[i] = 0.f;
            left = tps;
        }
        left--;
        cp_async_wait<S - 3>();
        zwg::proxy_fence();   /* this thread's landed copies, before the wgmma (async proxy) reads */
        __syncthreads();      /* stage kt landed for all; every warpgroup retired stage kt - 2's group */
        if (kt + S - 2 < nt) {
            load_a(lslot);
            load_b(lslot);
        }
        cp_async_commit();
        lslot = lslot == S - 1 ? 0 : lslot + 1;
        const uint64_t off = (uint64_t)((cslot * kStageBytes) >> 4);
        cslot = cslot == S - 1 ? 0 : cslot + 1;
        zwg::fence();
#pragma unroll
        for (int q = 0; q < 4; q++) zwg::mma<T, NX>::run(acc, da0 + off + 2 * q, db0 + off + 2 * q);
        zwg::commit();
        zwg::wait<1>();
    }
    zwg::wait<0>();
#pragma unroll
    for (int i = 0; i < NX / 2; i++) zwg::reg_fence(acc[i]);
    cp_async_wait<0>();
    if (!CL || ks == 1) {   /* chained, or a cluster of one: the CTA holds the whole sum */
        if (!CL && ks > 1) {
#pragma unroll
            for (int i = 0; i < NX / 2; i++) acc[i] = __fadd_rn(sum[CL ? 0 : i], acc[i]);   /* the last split */
        }
        wg_store<NX>(acc, row0 + wg * 64 + 16 * warp + g, col0, t, y, ldy, y_in, n_out, m);
        return;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __syncthreads();   /* every warpgroup is done with the ring: it becomes this split's partial */
    float *part = reinterpret_cast<float *>(wg_smem);   /* [NX][kPld]: column (batch row) major */
#pragma unroll
    for (int j = 0; j < NX / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            part[(8 * j + 2 * t + (e & 1)) * shp::kPld + wg * 64 + 16 * warp + g + 8 * (e >> 1)] = acc[4 * j + e];
    cl.sync();   /* every split's partial is written and visible to the cluster */
    /* CTA z sums elements [z per, (z + 1) per) of the tile, kU per thread at a time: every load of a batch
     * (the ks partials in split order, the residual) before its stores */
    const int z = (int)cl.block_rank(), per = NX * kBM / ks;
    constexpr int kU = 4;
    for (int i0 = z * per + tid; i0 < (z + 1) * per; i0 += kU * kNT) {
        float v[kU], yi[kU];
        size_t idx[kU];
        bool ok[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int i = i0 + u * kNT, c = i / kBM, r = i % kBM, row = row0 + r, col = col0 + c;
            ok[u] = i < (z + 1) * per && row < n_out && col < m;
            idx[u] = (size_t)col * ldy + row;
            v[u] = 0.f;
            yi[u] = 0.f;
            if (ok[u]) {
                v[u] = cl.map_shared_rank(part, 0)[c * shp::kPld + r];
                for (int s = 1; s < ks; s++) v[u] = __fadd_rn(v[u], cl.map_shared_rank(part, s)[c * shp::kPld + r]);
                if (y_in) yi[u] = y_in[idx[u]];
            }
        }
#pragma unroll
        for (int u = 0; u < kU; u++)
            if (ok[u]) y[idx[u]] = y_in ? __fadd_rn(v[u], yi[u]) : v[u];
    }
    cl.sync();   /* the partials stay until every CTA of the cluster has read them */
#else
    __trap();   /* built without sm_90a code (the Makefile builds 90 as 90a): the host never launches it here */
#endif
}

/* sm_90a, warp-specialized, fed by TMA (form 6: the form for M > 16). CTA = 1 producer warpgroup + CW consumer
 * warpgroups (64 W rows each) x NX batch rows (ws_chained: up to 192, with deep rings: few CTAs, each with many
 * bytes in flight), splits chained in the CTA as form 4 (the same operations in the same order). One producer
 * thread streams stages into an S-slot ring: for each stage it arms the stage's full barrier with the stage's byte
 * count and issues two TMA box loads (W [64 CW][64], x [NX][64]; the tensor maps zero-fill rows past n_out and
 * past x's readable rows (x_rows, else m) and write the 128-byte swizzle wgmma reads), after waiting on the slot's empty barrier. Consumers wait on the full
 * barrier, issue the stage's 4 wgmma as one group, and once the group two stages back has retired (wait<2>: two
 * groups stay queued on the tensor pipe) lane 0 of each consumer warp arrives on that stage's empty barrier. So the
 * consumers run nothing but the wgmma chain and the split sums, with no CTA-wide barrier in the loop.
 * Measured (H100, 8B BF16 2k prefill): form 4 (cp.async by every warp, bar.sync per stage) 80.6 ms with 45-53%
 * tensor-pipe activity in ncu; the same warp specialization fed by cp.async 84.2 ms; with TMA 68.6 ms (60-68%).
 * Not faster on an H200 (zllm-wtcbench --f16 at M = 128, 256 and 2048, and the 8B F16 and Q4_K_M 2k prefills):
 * pairs of CTAs of one W tile in a cluster, each loading half of every W stage into both by TMA multicast (a
 * quarter fewer L2 reads: the products are not bound by L2, and the pair waits for its slower CTA); persistent
 * CTAs that stream all their tiles through one ring, with or without the second consumer warpgroup started later
 * so that the two meet less at split ends and epilogues (no gain at 2048 rows, and a CTA of one tile slower); two
 * accumulator sets alternating by split with the split sums in shared memory, so that a split's last group retires
 * while the next split's first runs instead of draining the pipe (the ring one stage shorter for the sums: gate/up
 * at 2048 rows 969-986 us against 881-901; the drain at a split's end is not what bounds the kernel). In ncu at
 * 2048 rows the kernel keeps the tensor pipe 67-71% busy in 128-row tiles and 74-77% in 192-row ones where
 * cuBLAS's 256 x 128 and 320 x 128 tiles keep it 86-90%, with L1/shared throughput at 58-59% against 94%. */

/* wtc_ws's epilogue through shared memory (the ring, idle once every consumer's wgmma retired): each consumer
 * thread writes its accumulator values (wgmma's layout: rows r = 64 cw + 16 warp + g (+ 8), columns 8 j + 2 t (+ 1))
 * into a [NX][64 CW + 4] f32 staging tile (a row pitch of 4 mod 32 words: the 8 g and 4 t of a warp's write hit 32
 * distinct banks), then the 128 CW consumer threads store it as 16-byte vectors, each column's 64 CW outputs
 * contiguous in y (one 512-byte line run a warp instruction at CW 2), with y_in loaded the same way before the adds.
 * Every value is the one wg_store writes (acc, or acc + y_in as __fadd_rn(acc, y_in)); only the order of the
 * memory operations changes. u: the thread's index among the consumers; vec: y, y_in 16-byte aligned and ldy a
 * multiple of 4 (else every element is stored alone, in the same order). (wg_store's 4-byte stores, 8 values into
 * each of 4 rows a warp instruction, cost the 8B F16 decode step at M = 64 about 2.5% on an H200: docs/perf.md) */
template <int CW, int NX>
__device__ __forceinline__ void ws_store(const float (&acc)[NX / 2], float *st, int u, int row0, int col0, float *y,
                                         int ldy, const float *y_in, int n_out, int m) {
    constexpr int kR = 64 * CW, kLD = kR + 4, kQ = kR / 4; /* rows a column, pitch, 16-byte quads a column */
    constexpr int kCP = 128 * CW / kQ;                     /* columns a pass: 8 */
    constexpr int kB = NX / kCP < 8 ? NX / kCP : 8;        /* passes whose y_in loads go out together */
    static_assert((NX / kCP) % kB == 0, "whole batches of passes");
    {
        const int warp = (u >> 5) & 3, lane = u & 31, g = lane >> 2, t = lane & 3, r = (u >> 7) * 64 + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < NX / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[(8 * j + 2 * t + (e & 1)) * kLD + r + 8 * (e >> 1)] = acc[4 * j + e];
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(128 * CW) : "memory");
    const int q = u % kQ, cc = u / kQ, row = row0 + 4 * q;
    const bool vec = ((((uintptr_t)y | (uintptr_t)y_in) & 15) | (ldy & 3)) == 0 && row + 3 < n_out;
#pragma unroll
    for (int p0 = 0; p0 < NX / kCP; p0 += kB) {
        float4 yi[kB];
#pragma unroll
        for (int b = 0; b < kB; b++) {
            const int col = col0 + (p0 + b) * kCP + cc;
            yi[b] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (!y_in || col >= m) continue;
            const float *src = y_in + (size_t)col * ldy + row;
            if (vec) yi[b] = *reinterpret_cast<const float4 *>(src);
            else {
                if (row < n_out) yi[b].x = src[0];
                if (row + 1 < n_out) yi[b].y = src[1];
                if (row + 2 < n_out) yi[b].z = src[2];
                if (row + 3 < n_out) yi[b].w = src[3];
            }
        }
#pragma unroll
        for (int b = 0; b < kB; b++) {
            const int c = (p0 + b) * kCP + cc, col = col0 + c;
            if (col >= m) continue;
            float4 v = *reinterpret_cast<const float4 *>(st + c * kLD + 4 * q);
            if (y_in) {
                v.x = __fadd_rn(v.x, yi[b].x);
                v.y = __fadd_rn(v.y, yi[b].y);
                v.z = __fadd_rn(v.z, yi[b].z);
                v.w = __fadd_rn(v.w, yi[b].w);
            }
            float *dst = y + (size_t)col * ldy + row;
            if (vec) *reinterpret_cast<float4 *>(dst) = v;
            else {
                if (row < n_out) dst[0] = v.x;
                if (row + 1 < n_out) dst[1] = v.y;
                if (row + 2 < n_out) dst[2] = v.z;
                if (row + 3 < n_out) dst[3] = v.w;
            }
        }
    }
}

/* the SwiGLU epilogue of wtc_ws the same way: each thread's glu_value values (features 32 cw + 8 warp + g of the
 * tile, as wg_store_glu pairs them) into a [NX][32 CW + 16] staging tile of T (a pitch of 8 mod 32 words), then
 * 16-byte stores of 8 features; vec: out 16-byte aligned and ldg a multiple of 8 */
template <typename T, int CW, int NX>
__device__ __forceinline__ void ws_store_glu(const float (&acc)[NX / 2], T *st, int u, int row0, int col0, T *out,
                                             int ldg, int n_out, int m) {
    constexpr int kF = 32 * CW, kLD = kF + 16, kQ = kF / 8; /* features a column, pitch, 16-byte chunks a column */
    constexpr int kCP = 128 * CW / kQ;                      /* columns a pass: 32 */
    {
        const int warp = (u >> 5) & 3, lane = u & 31, g = lane >> 2, t = lane & 3, f = (u >> 7) * 32 + 8 * warp + g;
#pragma unroll
        for (int j = 0; j < NX / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                st[(8 * j + 2 * t + e) * kLD + f] = glu_value<T>(acc[4 * j + e], acc[4 * j + e + 2]);
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(128 * CW) : "memory");
    const int q = u % kQ, cc = u / kQ, f0 = row0 / 2 + 8 * q, nf = n_out / 2;
    const bool vec = (((uintptr_t)out & 15) | (ldg & 7)) == 0 && f0 + 7 < nf;
#pragma unroll
    for (int p = 0; p < (NX + kCP - 1) / kCP; p++) {
        const int c = p * kCP + cc, col = col0 + c;
        if (c >= NX || col >= m || f0 >= nf) continue;
        const uint4 v = *reinterpret_cast<const uint4 *>(st + c * kLD + 8 * q);
        T *dst = out + (size_t)col * ldg + f0;
        if (vec) *reinterpret_cast<uint4 *>(dst) = v;
        else {
            const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
            uint16_t *d16 = reinterpret_cast<uint16_t *>(dst);
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (f0 + i < nf) d16[i] = (uint16_t)(w4[i >> 1] >> (16 * (i & 1)));
        }
    }
}

template <int CW, int NX, int S> struct ws_shape {
    static constexpr int kBM = 64 * CW, kThreads = 128 * (CW + 1);
    static constexpr int kStageElems = (kBM + NX) * kKT;
    static constexpr uint32_t kStageBytes = kStageElems * 2;
    static constexpr size_t kSmem = (size_t)S * kStageBytes + 2 * S * 8;   /* ring, then full[S], empty[S] */
    static_assert(kSmem <= 227 * 1024, "shared memory of one CTA");
    static_assert((size_t)NX * (kBM + 4) * 4 <= (size_t)S * kStageBytes, "ws_store's staging tile fits the ring");
    static_assert(kStageBytes % 1024 == 0 && (kBM * kKT * 2) % 1024 == 0, "1024-byte aligned boxes (the swizzle)");
};

/* QS: qtc's split order (wtc_launch_qsplit) instead of ks equal splits: kn sub-splits of the n_in / 256 units,
 * sub-split s the k tiles [kUT floor(units s / kn), kUT floor(units (s + 1) / kn)), summed in consecutive groups of r,
 * then the groups; QG: 1 < r < kn, which keeps the open group's sum in shared memory after the ring and the
 * barriers (a third register set spills: 240 registers a consumer thread hold two of 64; otherwise the order is the
 * sequential ((p0 + p1) + p2) + ... of ks splits); KP: the k-split pair (ws_kpair): a cluster of two CTAs (grid.z) on
 * one tile of one consumer warpgroup, rank r streaming the k tiles [r nt / 2, (r + 1) nt / 2) (ks even, so each half
 * is whole splits); rank 1 stores each split's partial into rank 0's shared memory (distributed shared memory) and
 * arrives on rank 0's mbarrier with release at cluster scope, then ends; rank 0 closes its own splits' sum and adds
 * rank 1's partials to it one by one, in split order, then stores the tile: ((p0 + p1) + ..) + p_{ks-1}, the bits of
 * the one-CTA order */
template <typename T, int CW, int NX, int S, bool QS = false, bool QG = false, bool MC = false, bool KP = false>
__global__ void __launch_bounds__(128 * (CW + 1), 1)
    wtc_ws(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, int n_in, int n_out, int ks,
           int m, float *y, int ldy, const float *y_in, T *glu, int ldg, int units, int r) {
#if ZWG_ON
    extern __shared__ __align__(1024) unsigned char ws_smem[];
    using shp = ws_shape<CW, NX, S>;
    static_assert(S >= 3, "the consumers hold two stages past the one they wait for");
    static_assert(!KP || (CW == 1 && !QS && !MC), "the k-split pair: one consumer warpgroup, wtc_split's order");
    static_assert(!(MC && QS), "the paired form runs wtc_split's order only");
    constexpr int kBM = shp::kBM;
    /* full barrier of slot s at bars + 8 s, empty barrier at bars + 8 (S + s) */
    const uint32_t ring = smem_u32(ws_smem), bars = ring + S * shp::kStageBytes;
    /* wg from warp_index (cuda/mma_util.cuh): uniform registers for the consumers' descriptors and barrier addresses.
     * With one consumer warpgroup, one warp a scheduler, the k loop's instruction latencies show (docs/perf.md) */
    const int tid = threadIdx.x, wg = warp_index() >> 2;
    const int col0 = blockIdx.x * NX, row0 = blockIdx.y * kBM;
    const int tps = n_in / ks / kKT, nt = n_in / kKT;
    /* MC: this CTA's place in its pair, and the W rows its producer loads for both (kWR from row0 + kWR rank) */
    const uint32_t rank = (MC || KP) ? cluster_rank() : 0;
    /* KP: the pair's k halves (rank r takes the k tiles [r nt / 2, (r + 1) nt / 2)); rank 1 pushes its split partials
     * into rank 0's [split][NX / 2][128] f32 area after the ring and the barriers (16 bytes: its mbarrier first) */
    const uint32_t kpbar = ring + (uint32_t)shp::kSmem;
    constexpr int kWR = MC ? kBM / 2 : kBM;
    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(bars + 8 * s, 1); /* the producer's arrive.expect_tx; the copies' bytes complete it */
            /* lane 0 of every consumer warp (MC: of both CTAs), once the stage's wgmma retired */
            mbar_init(bars + 8 * (S + s), 4 * CW * (MC ? 2 : 1));
        }
        if (KP) mbar_init(kpbar, 128); /* every consumer thread of rank 1, once its partials are stored */
    }
    if constexpr (MC || KP) cluster_sync_init();
    else __syncthreads();
    pdl_trigger();
    if (wg == 0) {
        /* registers move to the consumers (their accumulators and split sums): with two consumer warpgroups the
         * launch share (168 a thread) would spill them; 24 + 2 x 240 is the 3 x 168 of the launch (the producer
         * thread's loop fits in 24). Four consumer warpgroups (32 or 64 batch rows) fit the launch share */
        if (CW == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid != 0) return;   /* one thread issues every copy */
        /* a stage = the W box [kBM][64] then the x box [NX][64], both written by TMA in the 128-byte swizzle
         * wgmma reads (rows past n_out or x's readable rows zero-filled by the tensor maps' bounds) */
        auto tma = [](uint32_t dst, const CUtensorMap *map, int k, int row, uint32_t bar) {
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                         "%3}], [%4];\n" ::"r"(dst),
                         "l"(map), "r"(k), "r"(row), "r"(bar)
                         : "memory");
        };
        /* the stage's W box: MC, this CTA's half into both CTAs of the pair (the same offsets; each CTA's own full
         * barrier counts the bytes) */
        auto tma_w = [&](uint32_t dst, int k, uint32_t bar) {
            if constexpr (MC) {
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
                             "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst + rank * (kWR * kKT * 2)),
                             "l"(&tw), "r"(k), "r"(row0 + (int)rank * kWR), "r"(bar), "h"((uint16_t)3)
                             : "memory");
            } else {
                tma(dst, &tw, k, row0, bar);
            }
        };
        const int nl = KP ? nt / 2 : nt, pre = S < nl ? S : nl;
        auto ktile = [&](int j) { return KP ? (int)rank * (nt / 2) + j : j; }; /* KP: the CTA's k half */
        /* the first S stages' weights before pdl_wait (written once, at load), x after; QS: the weights are qtc's
         * 16-bit copy, written by the kernel before, so after it too */
        if (QS) pdl_wait();
        for (int s = 0; s < pre; s++) {
            mbar_expect_tx(bars + 8 * s, shp::kStageBytes);
            tma_w(ring + s * shp::kStageBytes, ktile(s) * kKT, bars + 8 * s);
        }
        pdl_wait();
        for (int s = 0; s < pre; s++)
            tma(ring + s * shp::kStageBytes + kBM * kKT * 2, &tx, ktile(s) * kKT, col0, bars + 8 * s);
        for (int kt = S; kt < nl; kt++) {
            const int slot = kt % S;
            /* stage kt - S retired (MC: in both CTAs, whose slots this copy fills) */
            mbar_wait(bars + 8 * (S + slot), ((kt / S) & 1) ^ 1);
            mbar_expect_tx(bars + 8 * slot, shp::kStageBytes);
            tma_w(ring + slot * shp::kStageBytes, ktile(kt) * kKT, bars + 8 * slot);
            tma(ring + slot * shp::kStageBytes + kBM * kKT * 2, &tx, ktile(kt) * kKT, col0, bars + 8 * slot);
        }
        /* the residual's tile into L2 while the consumers run the last stages (ws_store reads it after them) */
        if (y_in && (((uintptr_t)y_in & 15) | (ldy & 3)) == 0) {
            const uint32_t bytes = (uint32_t)(min(kBM, n_out - row0) * 4) & ~15u;
            for (int c = col0; bytes && c < col0 + NX && c < m; c++)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(y_in + (size_t)c * ldy + row0),
                             "r"(bytes)
                             : "memory");
        }
        /* MC: the CTA ends only once both CTAs' consumers released every stage: no copy of this producer is then
         * still landing in the peer, and no arrival of the peer's consumers still targets this CTA's barriers (the
         * last S stages are in S distinct slots, each at its last phase) */
        if constexpr (MC) {
            for (int j = nt > S ? nt - S : 0; j < nt; j++) mbar_wait(bars + 8 * (S + j % S), (j / S) & 1);
        }
        return;
    }
    /* consumers */
    if (CW == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    pdl_wait();   /* y and y_in only after the previous kernel (the loads above it wait on the producer anyway) */
    const int cw = wg - 1, lane = tid & 31;
    const uint32_t pbars = MC ? cluster_addr(bars, rank ^ 1) : 0; /* MC: the peer's barriers */
    /* the slot's wgmma reads retired: its empty barrier (MC: and the peer's copy of it) gets this warp's arrival */
    auto release = [&](int sl) {
        mbar_arrive(bars + 8 * (S + sl));
        if constexpr (MC) mbar_arrive_cl(pbars + 8 * (S + sl));
    };
    const uint64_t da0 = zwg::desc(ws_smem + cw * 64 * kKT * 2), db0 = zwg::desc(ws_smem + kBM * kKT * 2);
    float acc[NX / 2], sum[NX / 2];
    /* QG: the open group's sum, element i of consumer thread c at gs[i * 128 CW + c] */
    float *gs = reinterpret_cast<float *>(ws_smem + shp::kSmem) + (tid - 128);
#pragma unroll
    for (int i = 0; i < NX / 2; i++) acc[i] = 0.f, sum[i] = -0.f;
    int slot = 0, prev = S - 1, prev2 = S - 2, left = tps; /* prev, prev2: the slots of stages kt - 1, kt - 2 */
    /* KP: element i of split j of consumer thread u at kp[(j NX / 2 + i) 128 + u] (rank 0's area); js: rank 1's next
     * split; kpr: the area's address in rank 0 */
    float *kp = reinterpret_cast<float *>(ws_smem + shp::kSmem + 16) + (tid - 128);
    const uint32_t kpr = KP ? cluster_addr(kpbar + 16 + 4 * (uint32_t)(tid - 128), 0) : 0;
    int js = 0;
    /* rank 1: acc, split js, into rank 0 */
    auto kpush = [&]() {
#pragma unroll
        for (int i = 0; i < NX / 2; i++) st_cluster_f32(kpr + 4u * (uint32_t)((js * (NX / 2) + i) * 128), acc[i]);
        js++;
    };
    const int nloc = KP ? nt / 2 : nt; /* this CTA's k tiles */
    /* QS: ks is kn; sp the open sub-split, bnext its end (k tiles), q its place in its group */
    int sp = 0, q = 0, bnext = QS ? kUT * (int)((long)units / ks) : 0;
    /* QS: sub-split sp's partial in acc joins the sums (qtc.h's order); last: the last sub-split's end, after
     * which sum holds the product */
    auto qfold = [&](bool last) {
        if constexpr (!QG) {
            (void)last; /* sum from -0 (-0 + p is p); the last sub-split closes the product into sum */
#pragma unroll
            for (int i = 0; i < NX / 2; i++) sum[i] = __fadd_rn(sum[i], acc[i]);
        } else {
            /* the open group G = ((p_{jr} + ..) + p) in gs, closed at q = r - 1 into sum = ((G0 + G1) + ..); the
             * last group closes into sum, the product (acc defined by a shared-memory sum here made ptxas serialize
             * every wgmma of the kernel). Each thread reads only what it wrote: no barrier */
            constexpr int kC = 128 * CW;
            if (last) {
#pragma unroll
                for (int i = 0; i < NX / 2; i++) sum[i] = __fadd_rn(sum[i], __fadd_rn(gs[i * kC], acc[i]));
            } else {
                const bool first = q == 0, close = q == r - 1;
#pragma unroll
                for (int i = 0; i < NX / 2; i++) {
                    const float gv = first ? acc[i] : __fadd_rn(gs[i * kC], acc[i]);
                    if (close) sum[i] = __fadd_rn(sum[i], gv); /* sum from -0: the first close is gv */
                    else gs[i * kC] = gv;
                }
            }
        }
    };
    uint32_t parity = 0;
    /* (two accumulator sets alternating by split, so that a split's end does not drain the tensor pipe, measured
     * slower: H100, 8B BF16 2k prefill 68.6 -> 71.5 ms; see above for the form with the sums in shared memory) */
    /* QS: the last sub-split's fold runs in the loop too, at kt = nt (the final wait and sums where the other
     * folds are: after the loop, its shared-memory reads made ptxas serialize every wgmma of the kernel) */
    for (int kt = 0; QS || kt < nloc; kt++) {
        if constexpr (QS) {
            if (kt == bnext) { /* sub-split sp ended */
                zwg::wait<0>();
#pragma unroll
                for (int i = 0; i < NX / 2; i++) zwg::reg_fence(acc[i]);
                qfold(kt == nt);
                if (kt == nt) break;
#pragma unroll
                for (int i = 0; i < NX / 2; i++) acc[i] = 0.f;
                sp++;
                q = q + 1 == r ? 0 : q + 1;
                bnext = kUT * (int)((long)units * (sp + 1) / ks);
            }
        }
        /* a split ended: sum = ((-0 + p0) + p1) + .., the bits of ((p0 + p1) + ..) (-0 + p is p), one add per
         * element with no condition: an if / else over the whole array makes ptxas keep a second copy of sum across
         * the k loop (64 register moves a k tile at NX 128), and a select per element spills at NX 192 */
        if (!QS && left == 0) {
            zwg::wait<0>();
#pragma unroll
            for (int i = 0; i < NX / 2; i++) zwg::reg_fence(acc[i]);
            if (KP && rank == 1) {
                kpush();
            } else {
#pragma unroll
                for (int i = 0; i < NX / 2; i++) sum[i] = __fadd_rn(sum[i], acc[i]);
            }
#pragma unroll
            for (int i = 0; i < NX / 2; i++) acc[i] = 0.f;
            left = tps;
        }
        left--;
        mbar_wait(bars + 8 * slot, parity);
        const uint64_t off = (uint64_t)((slot * shp::kStageBytes) >> 4);
        zwg::fence();
#pragma unroll
        for (int q = 0; q < 4; q++) zwg::mma<T, NX>::run(acc, da0 + off + 2 * q, db0 + off + 2 * q);
        zwg::commit();
        zwg::wait<2>(); /* stage kt - 2's group retired: its slot may be refilled */
        if (kt > 1 && lane == 0) release(prev2);
        prev2 = prev;
        prev = slot;
        if (++slot == S) {
            slot = 0;
            parity ^= 1;
        }
    }
    if constexpr (!QS) { /* (QS: the last fold ran in the loop) */
        zwg::wait<0>();
#pragma unroll
        for (int i = 0; i < NX / 2; i++) zwg::reg_fence(acc[i]);
        if (KP && rank == 1) {
            kpush();
        } else if (ks > 1) {
#pragma unroll
            for (int i = 0; i < NX / 2; i++) acc[i] = __fadd_rn(sum[i], acc[i]); /* the last split closes the sum */
        }
    }
    if constexpr (KP) { /* rank 0 adds rank 1's splits in order: ((s + p_{ks/2}) + ..) + p_{ks-1} */
        if (rank == 1) {
            mbar_arrive_cl_release(cluster_addr(kpbar, 0));
            return;
        }
        mbar_wait_cl(kpbar, 0);
        for (int j = 0; j < ks / 2; j++)
#pragma unroll
            for (int i = 0; i < NX / 2; i++) acc[i] = __fadd_rn(acc[i], kp[(j * (NX / 2) + i) * 128]);
    }
    if constexpr (MC) { /* the last two stages' releases, for both producers' tails (their groups retired above) */
        if (lane == 0) {
            if (nt > 1) release(prev2);
            release(prev);
        }
    }
    const float(&res)[NX / 2] = QS ? sum : acc; /* the product: QG closes it into sum */
    /* the staging tile at the ring's start: every consumer passed its last wait<0> (its wgmmas retired) before the
     * staging barrier, and every copy into the ring completed before the consumers' last full-barrier wait */
    asm volatile("bar.sync 1, %0;\n" ::"n"(128 * CW) : "memory");
    if (glu) ws_store_glu<T, CW, NX>(res, reinterpret_cast<T *>(ws_smem), tid - 128, row0, col0, glu, ldg, n_out, m);
    else ws_store<CW, NX>(res, reinterpret_cast<float *>(ws_smem), tid - 128, row0, col0, y, ldy, y_in, n_out, m);
#else
    __trap();   /* built without sm_90a code: the host never launches it here */
#endif
}

/* cuTensorMapEncodeTiled from the driver (through the runtime: no -lcuda), once; NULL when unavailable */
PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
    static std::atomic<int> s_state{0};   /* 0 unknown, 1 found, 2 missing */
    static PFN_cuTensorMapEncodeTiled_v12000 s_fn = nullptr;
    if (s_state.load() == 0) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess && q == cudaDriverEntryPointSuccess && fn) {
            s_fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
            s_state.store(1);
        } else {
            s_state.store(2);
        }
    }
    return s_state.load() == 1 ? s_fn : nullptr;
}

/* the 2-D map of a [rows][ld] 16-bit matrix read in [box_rows][64] boxes, 128-byte swizzle; -1 on failure */
int tma_map(CUtensorMap *map, int bf16, const void *base, int cols, int rows, int ld, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc) return -1;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {(cuuint32_t)kKT, (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return enc(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
               const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
                   CUDA_SUCCESS
               ? 0
               : -1;
}

/* ring depth: at NX 128, 6 stages (6 x 32 KiB at CW 2; 7 stages: the same, H100 8B BF16 2k prefill 69.4 against
 * 68.9 ms, and H200 8B F16 60.4-60.8 against 60.4-60.5 ms with two wgmma groups in flight); for the decode tiles
 * as many as about 220 KiB hold, at most 16 (H100, 8B BF16 M = 64 in tiles of 64 rows: 9.15 ms with 96 KiB rings,
 * 9.01 ms with 208 KiB; 4 stages: 10.65 ms); at NX 192, the 5 stages of 40 KiB that hold */
template <int CW, int NX> constexpr int ws_stages() {
    constexpr int fit = (220 * 1024) / ((64 * CW + NX) * 128);   /* stages of (64 CW + NX) x 64 16-bit values */
    return NX == 192 ? 5 : NX == 128 ? 6 : fit < 16 ? fit : 16;
}
/* KP (the k-split pair: one W tile of 64 rows, two CTAs on halves of k): the stages that about 220 KiB hold beside
 * rank 1's split partials (at most 4 splits of NX / 2 f32 a thread) and their mbarrier, at most 16 */
template <int NX> constexpr size_t kp_part_bytes() { return 16 + (size_t)4 * 128 * (NX / 2) * 4; }
template <int NX> constexpr int kp_stages() {
    constexpr int fit = (int)((220 * 1024 - kp_part_bytes<NX>()) / ((64 + NX) * 128));
    return fit < 16 ? fit : 16;
}

/* QS, QG, MC, KP: wtc_ws (kn = ks, r: wtc_launch_qsplit; MC: an even count of batch tiles, ws_paired; KP: ks even,
 * at most 8, no SwiGLU epilogue, ws_kpair) */
template <typename T, int CW, int NX, bool QS = false, bool QG = false, bool MC = false, bool KP = false>
cudaError_t launch_ws_t(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st, int r = 1) {
    /* QG: one stage fewer, for the open group's sums (128 CW threads x NX / 2 floats) after the barriers */
    constexpr int S = KP ? kp_stages<NX>() : ws_stages<CW, NX>() - (QG ? 1 : 0);
    using shp = ws_shape<CW, NX, S>;
    constexpr size_t smem = shp::kSmem + (QG ? (size_t)128 * CW * (NX / 2) * 4 : 0) + (KP ? kp_part_bytes<NX>() : 0);
    if (KP && (ks < 2 || ks > 8 || ks % 2 || p->glu)) return cudaErrorInvalidValue;
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    CUtensorMap tw, tx;
    if (tma_map(&tw, p->bf16, p->w, p->n_in, p->n_out, p->n_in, MC ? shp::kBM / 2 : shp::kBM) != 0 ||
        tma_map(&tx, p->bf16, p->x, p->n_in, p->x_rows > p->m ? p->x_rows : p->m, ldx, NX) != 0)
        return cudaErrorInvalidValue;
    auto k = wtc_ws<T, CW, NX, S, QS, QG, MC, KP>;
    static std::atomic<unsigned long long> s_set{0};
    const cudaError_t e = cu_smem_optin(k, smem, s_set);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((p->m + NX - 1) / NX), (unsigned)((p->n_out + shp::kBM - 1) / shp::kBM), KP ? 2u : 1u);
    if (MC && grid.x % 2) return cudaErrorInvalidValue;
    return cu_launch_cl(1,
                        MC   ? dim3(2, 1, 1)
                        : KP ? dim3(1, 1, 2)
                             : dim3(0, 0, 0),
                        k, grid, dim3(shp::kThreads), smem, st, tw, tx, p->n_in, p->n_out, ks, p->m, p->y, ldy, p->y_in,
                        (T *)p->glu, p->ldg, p->n_in / 256, r);
}

template <typename T, bool CL>
cudaError_t launch_wg(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st);

/* batch rows of form 6's first tile (nx0): 128 above 64 rows, else the smallest of 16, 32, 64 covering m, so
 * that every W tile is read once where the tiles fill the multiprocessors anyway (ws_chained takes smaller ones
 * where they do not) */
int ws_nx(int m) { return m > 64 ? 128 : m > 32 ? 64 : m > 16 ? 32 : 16; }

/* a form-6 launch's tiles: nx batch rows, cw consumer warpgroups (64 W rows each) */
struct ws_cfg {
    int nx, cw;
};

/* CTAs of a launch in tiles of c */
static long ws_ctas(const wtc_params *p, const ws_cfg &c) {
    return (long)((p->m + c.nx - 1) / c.nx) * ((p->n_out + 64 * c.cw - 1) / (64 * c.cw));
}

/* Form 6's tiles, (nx batch rows, cw consumer warpgroups): of the candidates below (none under 32 batch rows or 64 x
 * 64 but nx0's own; nx0 = ws_nx(m)), the one with the most CTAs that still fit one wave (CTAs <= SMs; the first of
 * equal counts), else (nx0, 2): smaller tiles bring idle multiprocessors in, and a second wave costs a whole tile's
 * time. Past one wave at nx0 = 128, (192, 2) where its waves x 192 come under (128, 2)'s waves x 128, a 192-row tile
 * counted 5% cheaper a row (each W stage feeds 1.5 times the products). H200, F16 8B layer products at 2048 rows
 * (zllm-wtcbench --f16, us, 192 against 128 rows): Q/K/V 158 against 163 (4 waves against 6), gate/up 803-829 against
 * 833-837 (19 against 28); the output and down products, 3 waves against 4, stay at 128 (127-133 against 125, 411-414
 * against 367-371), as gate/up at 512 rows does (231 against 195: 6 waves against 7). Up to 64 rows (memory-bound)
 * whole batch tiles come first, so W is read once; above, two consumer warpgroups. H200, BF16 8B layer products
 * (zllm-wtcbench, us): at M = 128 the output product 14.5 in (64, 1) against 18.6 in (128, 1), the down product 41.9
 * against 54.0, Q/K/V 19.1 in (64, 2) against 20.8 in (128, 1); Q/K/V at M = 256 27.4 in (128, 2) against 36.6 in
 * (128, 1) (two waves); the down product at M = 64 37.5 in (64, 1) against 40.8 in (32, 2).
 * Up to 64 rows, where (nx0, 2) takes more than a wave (nx0 of 32 or 64), (nx0, 4) where that fits one: four
 * consumer warpgroups, 256 W rows a CTA, one wave (the 8B gate/up join, 28,672 rows: 112 CTAs against 224). H200, 8B
 * F16 decode (zllm-bench, ms a step, two runs each): M = 64 6.549-6.565 against 6.676-6.681, M = 48 6.155-6.171
 * against 6.293-6.308, M = 32 5.384 against 5.433-5.437 */
static ws_cfg ws_chained(const wtc_params *p) {
    const long sms = cu_sm_count(p->sm_count);
    const int nx0 = ws_nx(p->m), h = nx0 / 2, q = nx0 / 4;
    const ws_cfg small[5] = {{nx0, 2}, {nx0, 1}, {h, 2}, {h, 1}, {q, 2}};
    const ws_cfg large[5] = {{nx0, 2}, {h, 2}, {nx0, 1}, {h, 1}, {q, 2}};
    const ws_cfg *cand = p->m <= 64 ? small : large;
    const ws_cfg c4 = {nx0, 4};
    if (p->m <= 64 && nx0 >= 32 && ws_ctas(p, cand[0]) > sms && ws_ctas(p, c4) <= sms) return c4;
    ws_cfg best = cand[0];
    long most = 0;
    for (int i = 0; i < 5; i++) {
        const ws_cfg &c = cand[i];
        if (c.nx != nx0 && (c.nx < 32 || c.nx * c.cw < 64)) continue;
        const long n = ws_ctas(p, c);
        if (n <= sms && n > most) {
            best = c;
            most = n;
        }
    }
    if (most == 0 && nx0 == 128) { /* more than one wave: the wave count decides between 128 and 192 batch rows */
        const ws_cfg wide = {192, 2};
        const long w128 = (ws_ctas(p, best) + sms - 1) / sms, w192 = (ws_ctas(p, wide) + sms - 1) / sms;
        if (w192 * 192 * 19 < w128 * 128 * 20) best = wide;
    }
    return best;
}

/* the paired form of the 64-row batch tiles: two CTAs of one W tile (consecutive batch tiles) form a cluster and
 * each loads half of every W stage into both (TMA multicast), so the pair reads W from L2 once; where the batch tiles
 * pair up (65 to 128 rows). The tile's arithmetic is unchanged. H200, 8B F16 layer products at 128 rows
 * (zllm-wtcbench --f16): Q/K/V 17.9 against 18.5 us, down 40.1-40.3 against 40.6-40.8, the layer 141.8-142.9
 * against 143.2-143.4; decode at M = 128 9.50-9.51 against 9.55-9.59 ms a step. Tiles of 32 rows (33 to 64 rows)
 * gain nothing (the output and down products 12.3-12.4 and 35.4-35.5 against 12.3 and 35.1 us at 64 rows), nor do
 * the 128-row tiles of prefill sizes (docs/perf.md). */
static bool ws_paired(const wtc_params *p, const ws_cfg &c) {
    return c.nx == 64 && ((p->m + c.nx - 1) / c.nx) % 2 == 0;
}

/* the k-split pair (KP): up to 64 rows, where the whole batch in one tile (nx0 = ws_nx(m) rows) against 64 W rows,
 * with k halved between two CTAs, still fits one wave (2 x CTAs <= SMs), for products of an even split count (their
 * halves end at a split: rank 1's partials join rank 0's sum in wtc_split's order, the same bits) and without the
 * SwiGLU epilogue. Each wgmma then covers nx0 batch rows instead of the nx0 / 2 of ws_chained's tiles, and each CTA
 * takes half the k steps: at 33 to 64 rows the output and down products run below DRAM speed at the pace of their k
 * loops (not of the tensor pipe: zllm-wgmmabench), so fewer steps a CTA finish sooner (docs/perf.md). H200,
 * zllm-bench decode at M = 64, ms a step: 8B F16 6.968-6.978 against 6.669-6.670, 1B F16 1.714 against 1.625-1.627;
 * M = 16 and 32 (the narrow kernel) unchanged */
static bool ws_kpair(const wtc_params *p, int ks) {
    const ws_cfg c = {ws_nx(p->m), 1};
    return p->m <= 64 && !p->glu && ks >= 2 && ks <= 8 && ks % 2 == 0 && 2 * ws_ctas(p, c) <= cu_sm_count(p->sm_count);
}

template <typename T, int NX>
cudaError_t launch_ws_c(const wtc_params *p, const ws_cfg &c, int ks, int ldx, int ldy, cudaStream_t st) {
    if constexpr (NX == 32 || NX == 64) {
        if (c.cw == 4) return launch_ws_t<T, 4, NX>(p, ks, ldx, ldy, st);
    }
    if constexpr (NX == 64) {
        if (ws_paired(p, c))
            return c.cw == 2 ? launch_ws_t<T, 2, NX, false, false, true>(p, ks, ldx, ldy, st)
                             : launch_ws_t<T, 1, NX, false, false, true>(p, ks, ldx, ldy, st);
    }
    return c.cw == 2 ? launch_ws_t<T, 2, NX>(p, ks, ldx, ldy, st) : launch_ws_t<T, 1, NX>(p, ks, ldx, ldy, st);
}

/* form 6 in ws_chained's tiles; form 4 when the driver has no tensor-map encoder (the same bits) */
template <typename T>
cudaError_t launch_ws(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st) {
    if (!tma_encoder()) return launch_wg<T, false>(p, ks, ldx, ldy, st);
    if (ws_kpair(p, ks)) {
        switch (ws_nx(p->m)) {
        case 16: return launch_ws_t<T, 1, 16, false, false, false, true>(p, ks, ldx, ldy, st);
        case 32: return launch_ws_t<T, 1, 32, false, false, false, true>(p, ks, ldx, ldy, st);
        default: return launch_ws_t<T, 1, 64, false, false, false, true>(p, ks, ldx, ldy, st);
        }
    }
    const ws_cfg c = ws_chained(p);
    switch (c.nx) {
    case 16: return launch_ws_c<T, 16>(p, c, ks, ldx, ldy, st);
    case 32: return launch_ws_c<T, 32>(p, c, ks, ldx, ldy, st);
    case 64: return launch_ws_c<T, 64>(p, c, ks, ldx, ldy, st);
    case 128: return launch_ws_c<T, 128>(p, c, ks, ldx, ldy, st);
    default: return launch_ws_t<T, 2, 192>(p, ks, ldx, ldy, st);
    }
}

/* an empty kernel compiled with the same targets as the wgmma kernels: its PTX version says which code of this
 * binary a device runs */
__global__ void wg_probe() {}

/* 1 when the wgmma forms run on the current device: compute capability 9.x, this binary holds the sm_90a code
 * (a build whose CUDA_ARCHS lacks 90 would run the wgmma kernels from older PTX, where their bodies are a trap)
 * and ZLLM_CUDA_WGMMA not 0. Attribute queries only (safe while a stream is captured); cached per device. */
int wg_on() {
    static int s_state[64], s_code[64];
    if (!cu_device_switch(s_state, 9, 9, cu_settings_get()->wgmma)) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    int *c = &s_code[dev & 63];
    if (*c == 0) {
        cudaFuncAttributes a;
        *c = cudaFuncGetAttributes(&a, wg_probe) == cudaSuccess && a.ptxVersion >= 90 ? 1 : 2;
    }
    return *c == 1;
}

template <typename T, int WG, int NX, bool CL>
cudaError_t launch_wg_t(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st) {
    constexpr int S = wg_stages<WG, NX, CL>();
    using shp = wg_shape<WG, NX, S>;
    auto k = wtc_wg<T, WG, NX, S, CL>;
    static std::atomic<unsigned long long> s_set{0};
    const cudaError_t e = cu_smem_optin(k, shp::kSmem, s_set);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((p->m + NX - 1) / NX), (unsigned)((p->n_out + shp::kBM - 1) / shp::kBM),
                    CL ? (unsigned)ks : 1u);
    /* CL: the ks split CTAs of a tile are one cluster (ks <= 8, the portable size) */
    return cu_launch_cl(1, CL ? dim3(1, 1, (unsigned)ks) : dim3(0, 0, 0), k, grid, dim3(shp::kThreads), shp::kSmem,
                        st, (const T *)p->w, p->n_in, p->n_out, ks, p->m, (const T *)p->x, ldx, p->y, ldy, p->y_in);
}

/* batch rows per wgmma tile: the smallest of 16, 32, 64, 128 (256 for the cluster form) covering m */
int wg_nx(int m, bool cl) { return m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 || !cl ? 128 : 256; }

/* warpgroups (64 W rows each) per CTA: 2 when the grid of 128-row tiles fills the multiprocessors */
int wg_count(const wtc_params *p, int ks, bool cl) {
    const int nx = wg_nx(p->m, cl);
    const long ctas = (long)((p->m + nx - 1) / nx) * ((p->n_out + 127) / 128) * (cl ? ks : 1);
    return ctas >= cu_sm_count(p->sm_count) ? 2 : 1;
}

template <typename T, int WG, bool CL>
cudaError_t launch_wg_w(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st) {
    switch (wg_nx(p->m, CL)) {
    case 16: return launch_wg_t<T, WG, 16, CL>(p, ks, ldx, ldy, st);
    case 32: return launch_wg_t<T, WG, 32, CL>(p, ks, ldx, ldy, st);
    case 64: return launch_wg_t<T, WG, 64, CL>(p, ks, ldx, ldy, st);
    case 128: return launch_wg_t<T, WG, 128, CL>(p, ks, ldx, ldy, st);
    default: return launch_wg_t<T, WG, CL ? 256 : 128, CL>(p, ks, ldx, ldy, st);
    }
}

template <typename T, bool CL>
cudaError_t launch_wg(const wtc_params *p, int ks, int ldx, int ldy, cudaStream_t st) {
    return wg_count(p, ks, CL) == 2 ? launch_wg_w<T, 2, CL>(p, ks, ldx, ldy, st)
                                    : launch_wg_w<T, 1, CL>(p, ks, ldx, ldy, st);
}

template <typename T, int BN>
cudaError_t launch_wide(const wtc_params *p, int form, int ks, int ldx, int ldy, cudaStream_t st) {
    constexpr size_t smem = (size_t)kWS * (kBM + BN) * kKT * sizeof(T);
    const dim3 grid((unsigned)((p->m + BN - 1) / BN), (unsigned)((p->n_out + kBM - 1) / kBM),
                    form == 3 ? (unsigned)ks : 1u);
    if (form == 3) {
        static std::atomic<unsigned long long> s_set{0};
        cudaError_t e = cu_smem_optin(wtc_wide<T, true, BN>, smem, s_set);
        if (e != cudaSuccess) return e;
        e = cu_launch(wtc_wide<T, true, BN>, grid, dim3(256), smem, st, (const T *)p->w, p->n_in, p->n_out, ks, p->m,
                      (const T *)p->x, ldx, p->y, ldy, p->y_in, (float *)p->workspace);
        if (e != cudaSuccess) return e;
        const size_t n = (size_t)p->m * p->n_out;
        const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
        return cu_launch(wtc_merge, dim3(blocks), dim3(256), 0, st, (const float *)p->workspace, ks, p->n_out, p->m,
                         p->y, ldy, p->y_in);
    }
    static std::atomic<unsigned long long> s_set{0};
    const cudaError_t e = cu_smem_optin(wtc_wide<T, false, BN>, smem, s_set);
    if (e != cudaSuccess) return e;
    return cu_launch(wtc_wide<T, false, BN>, grid, dim3(256), smem, st, (const T *)p->w, p->n_in, p->n_out, ks, p->m,
                     (const T *)p->x, ldx, p->y, ldy, p->y_in, (float *)nullptr);
}

/* batch rows per wide CTA: 32 up to 32 rows, else 64 (96 KiB CTAs; 128-wide tiles were not faster: H100 8B BF16
 * M=64 11.17 against 10.85 ms, the 2k prefill 161.6 against 161.8 ms). The per-split form holds no running sum
 * and runs two CTAs per SM; the chained form keeps one (the sum's registers; capped at 128 they spilled: prefill
 * 179.7 ms) */
int wide_bn(int m) { return m <= 32 ? 32 : 64; }

/* CTAs of the narrow kernel with ks warps, ns-stage rings, m batch rows and mt W tiles that one SM holds (0: one
 * does not fit in optin bytes): by shared memory (the rings and s_yin; an SM holds one CTA's optin and 1 KiB a CTA
 * for the system) and by threads */
long narrow_per_sm(int ks, int ns, int m, int mt, size_t optin) {
    const int nf = m > 8 ? (m > 16 ? 4 : 2) : 1;
    const size_t b = (size_t)ks * ns * narrow_stage(m, mt) * 2 + (size_t)mt * 128 * nf * sizeof(float);
    if (b > optin) return 0;
    const long by_smem = (long)((optin + 1024) / (b + 1024)), by_threads = 2048 / (32 * ks);
    return by_smem < by_threads ? by_smem : by_threads;
}

/* the narrow kernel with NS-stage rings, NF batch fragments and MT W tiles per CTA (the caller checked that ks
 * warps' rings fit optin bytes) */
template <typename T, int NS, int NF, int MT>
cudaError_t launch_narrow(const wtc_params *p, int ks, int ldx, int ldy, size_t optin, cudaStream_t st) {
    static std::atomic<unsigned long long> s_set{0};
    const size_t most = (size_t)kMaxKs * NS * narrow_stage(8 * NF, MT) * sizeof(T);
    const cudaError_t e = cu_smem_optin(wtc_narrow<T, NS, NF, MT>, most < optin ? most : optin, s_set);
    if (e != cudaSuccess) return e;
    const unsigned tiles = (unsigned)((p->n_out + 16 * MT - 1) / (16 * MT));
    return cu_launch(wtc_narrow<T, NS, NF, MT>, dim3(tiles), dim3(32 * ks),
                     (size_t)ks * NS * narrow_stage(p->m, MT) * sizeof(T), st, (const T *)p->w, p->n_in, p->n_out, ks,
                     p->m, (const T *)p->x, ldx, p->y, ldy, p->y_in, (T *)p->glu, p->ldg);
}

template <typename T>
cudaError_t launch_t(const wtc_params *p, int form, int ks, int ldx, int ldy, cudaStream_t st) {
    if (form == 4) return launch_wg<T, false>(p, ks, ldx, ldy, st);
    if (form == 5) return launch_wg<T, true>(p, ks, ldx, ldy, st);
    if (form == 6) return launch_ws<T>(p, ks, ldx, ldy, st);
    if (form == 1) {
        /* ring depth: 6 stages up to 2 rows, 4 up to 8, 3 above (each stage carries m x rows, and more warps per
         * SM beat deeper rings: on the 8B BF16 shape 4 stages were faster than 6 at M = 4 and 8, and 6 faster than
         * 4, 8 and 12 at M = 1; H200, 8B F16 at M = 16, 4.72 ms a step with 3 stages (two CTAs of 8 warps per SM)
         * against 4.76 with 2 and 5.34 with 4), one stage fewer from 3 rows where a third CTA per SM brings the
         * tiles within one wave (H200, 8B F16 Q/K/V, 384 tiles on 132 SMs: 12.6 against 14.1 us at M = 4 and 8,
         * 13.5 against 15.8 at 16; the steps 0.6-0.8% faster). The depth never changes a bit */
        const size_t optin = cu_smem_optin_max();
        const long sms = cu_sm_count(p->sm_count), tiles = (p->n_out + 15) / 16;
        const bool third = tiles > 2 * sms && tiles <= 3 * sms;
        /* W rows a CTA: 32 from 9 rows (two A fragments share each x read: a stage's x rows cost as many L2 reads
         * as its W rows at 16 rows), with 4-stage rings (one CTA of 8 warps per SM), where that fits one wave or
         * 16 rows a CTA do not fit one wave either (H200, 8B F16 at 16 rows, us: output 8.98 against 9.36, gate/up
         * 60.27 against 60.80, down 29.67 against 29.96; Q/K/V 15.67 against 13.68: its 192 CTAs of 32 rows on
         * 132 SMs against 384 of 16 rows three per SM). Also where 32 rows a CTA leave SMs idle (the 1B shape's
         * output and down products: 64 CTAs): 16 rows a CTA there made its M = 16 step slower (H200, two calls,
         * 1.073-1.075 ms a step against 1.067, where 16 rows a CTA everywhere ran 1.063-1.064 in each). 17 to 32
         * rows: 3-stage rings, four B fragments (the caller chose the form where it fits one wave: s_form) */
        if (p->m > 16) {
            if (!narrow_per_sm(ks, 3, p->m, 2, optin)) return cudaErrorInvalidValue;
            return launch_narrow<T, 3, 4, 2>(p, ks, ldx, ldy, optin, st);
        }
        if (p->m > 8) {
            const long c2 = sms * narrow_per_sm(ks, 4, p->m, 2, optin);
            const long c1 = sms * narrow_per_sm(ks, third ? 2 : 3, p->m, 1, optin);
            if (c2 > 0 && ((p->n_out + 31) / 32 <= c2 || tiles > c1))
                return launch_narrow<T, 4, 2, 2>(p, ks, ldx, ldy, optin, st);
            if (third) return launch_narrow<T, 2, 2, 1>(p, ks, ldx, ldy, optin, st);
            return launch_narrow<T, 3, 2, 1>(p, ks, ldx, ldy, optin, st);
        }
        if (third && p->m > 2) return launch_narrow<T, 3, 1, 1>(p, ks, ldx, ldy, optin, st);
        int ns = p->m <= 2 ? kNS : 4;
        auto fits = [&](int n) { return (size_t)ks * n * narrow_stage(p->m) * sizeof(T) <= optin; };
        if (!fits(ns)) ns = fits(kNS) ? kNS : 4;
        if (ns == 4) return launch_narrow<T, 4, 1, 1>(p, ks, ldx, ldy, optin, st);
        return launch_narrow<T, 6, 1, 1>(p, ks, ldx, ldy, optin, st);
    }
    if (form == 2 && p->m > 64) {
        static std::atomic<unsigned long long> s_set{0};
        const cudaError_t e = cu_smem_optin(wtc_wide2<T>, kWide2Smem, s_set);
        if (e != cudaSuccess) return e;
        const dim3 grid((unsigned)((p->m + kB2 - 1) / kB2), (unsigned)((p->n_out + kB2 - 1) / kB2));
        return cu_launch(wtc_wide2<T>, grid, dim3(128), kWide2Smem, st, (const T *)p->w, p->n_in, p->n_out, ks, p->m,
                         (const T *)p->x, ldx, p->y, ldy, p->y_in);
    }
    switch (wide_bn(p->m)) {
    case 32: return launch_wide<T, 32>(p, form, ks, ldx, ldy, st);
    default: return launch_wide<T, 64>(p, form, ks, ldx, ldy, st);
    }
}

} // namespace

extern "C" int wtc_supported(int n_in, int n_out) {
    return n_in >= kKT && n_in % kKT == 0 && n_out >= 1 && (long)n_out * n_in < (1L << 31);
}

extern "C" int wtc_split(int n_in, int n_out) {
    if (!wtc_supported(n_in, n_out)) return 0;
    /* Enough warps for one decode row (tiles x ks >= 2048 on the narrow kernel); then more splits while each keeps
     * at least 512 k (8 ring stages) and tiles x ks < 16384: a split is one warp's unit of work at M <= 16, and
     * many short units balance the SMs where few long ones leave a tail (H100, M = 1: 8B BF16 6.03 -> 5.88 ms,
     * gate/up 2 -> 8 splits and the LM head 1 -> 4; 1B 1.234 -> 1.205 ms). Each split a multiple of the 64-wide
     * k tile. Shape only: it is part of every element's arithmetic. */
    constexpr long s_target = 2048, s_target2 = 16384, s_kmin = 512;
    const long tiles = (n_out + 15) / 16;
    int ks = 1;
    while (ks < kMaxKs && tiles * ks < s_target && n_in % (kKT * 2 * ks) == 0) ks *= 2;
    while (ks < kMaxKs && tiles * ks < s_target2 && n_in / (2 * ks) >= s_kmin && n_in % (kKT * 2 * ks) == 0) ks *= 2;
    return ks;
}

extern "C" size_t wtc_workspace_bytes(int n_in, int n_out, int m_max) {
    const int ks = wtc_split(n_in, n_out);
    if (ks <= 1 || m_max < 1) return 0;
    const int m = m_max < kSplitRows ? m_max : kSplitRows;
    return (size_t)ks * m * n_out * sizeof(float);
}

extern "C" int wtc_available(void) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 0;
    const size_t need = kNarrowSmem > kWideSmem64 ? kNarrowSmem : kWideSmem64;
    return (size_t)optin >= (need > kWide2Smem ? need : kWide2Smem);
}

extern "C" int wtc_wgmma(void) { return wg_on(); }

/* the form a valid launch of p runs (ks its split count): p->form, or the automatic choice; 3 with one split runs
 * as 2 */
static int s_form(const wtc_params *p, int ks) {
    int form = p->form;
    if (form == 0) {
        if (p->m <= 16) {
            form = 1;
        } else if (wg_on()) {
            /* wgmma, TMA-fed and warp-specialized, splits chained in the CTA (H100, 8B BF16: form 6 beat forms 4
             * and 5 at M = 128, 256 and the prefill, and form 5 at M = 64; the narrow kernel beat both at 9..16
             * rows); from 17 to 32 rows the narrow kernel where its CTAs of 32 W rows fit one wave: form 6 then
             * runs few CTAs (H200, 8B F16 at 32 rows: output 10.2 against 11.9 us, down 31.4 against 33.7) */
            const long one = cu_sm_count(p->sm_count) * narrow_per_sm(ks, 3, p->m, 2, cu_smem_optin_max());
            form = p->m <= kNarrowM && (p->n_out + 31) / 32 <= one ? 1 : 6;
        } else {
            /* one CTA per split when the tile grid alone would leave most multiprocessors idle (layer matrices
             * at batch 16-128); the form never changes a bit (wtc.h) */
            const int bn = wide_bn(p->m);
            const long ctas = (long)((p->m + bn - 1) / bn) * ((p->n_out + kBM - 1) / kBM);
            form = ks > 1 && p->m <= kSplitRows && ctas < 2L * cu_sm_count(p->sm_count) ? 3 : 2;
        }
    }
    if (form == 3 && ks == 1) form = 2;   /* one split: nothing to merge */
    return form;
}

/* the SwiGLU epilogue runs in a launch of p in this form: the narrow kernel (m <= 32) or the TMA form, rows in whole
 * gate/up blocks */
static bool s_glu_ok(const wtc_params *p, int form) {
    /* ZLLM_CUDA_WTC_GLU=0: the narrow kernel without it (the same bits either way) */
    const int s_narrow = cu_settings_get()->wtc_glu;
    if (p->n_out % 16) return false;
    return (form == 1 && s_narrow) || (form == 6 && wg_on() && tma_encoder() != nullptr);
}

extern "C" int wtc_glu_fused(const wtc_params *p) {
    if (!p || p->m < 1 || !wtc_supported(p->n_in, p->n_out) || p->form < 0 || p->form > 6) return 0;
    return s_glu_ok(p, s_form(p, wtc_split(p->n_in, p->n_out)));
}

extern "C" cudaError_t wtc_launch(const wtc_params *p, cudaStream_t st) {
    if (!p || !p->w || !p->x || (!p->y && !p->glu) || p->m < 1 || !wtc_supported(p->n_in, p->n_out) || p->form < 0 ||
        p->form > 6)
        return cudaErrorInvalidValue;
    const int ldx = p->ldx ? p->ldx : p->n_in, ldy = p->ldy ? p->ldy : p->n_out;
    if (ldx < p->n_in || ldx % 8 || ldy < p->n_out || (long)p->m * ldx >= (1L << 31)) return cudaErrorInvalidValue;
    if (p->x_rows < 0 || (p->x_rows && p->x_rows < p->m) || (long)p->x_rows * ldx >= (1L << 31))
        return cudaErrorInvalidValue;
    if (((uintptr_t)p->w & 15) || ((uintptr_t)p->x & 15)) return cudaErrorMisalignedAddress;
    const int ks = wtc_split(p->n_in, p->n_out);
    const int form = s_form(p, ks);
    if (p->glu && (!s_glu_ok(p, form) || p->ldg < p->n_out / 2 || (long)p->m * p->ldg >= (1L << 31)))
        return cudaErrorInvalidValue;
    if (form == 1 && p->m > kNarrowM) return cudaErrorInvalidValue;
    if (form >= 4 && !wg_on()) return cudaErrorInvalidValue;
    if (form == 3 && ks > 1) {
        if (p->m > kSplitRows || !p->workspace || ((uintptr_t)p->workspace & 15) ||
            p->workspace_bytes < (size_t)ks * p->m * p->n_out * sizeof(float))
            return cudaErrorInvalidValue;
    }
    return p->bf16 ? launch_t<__nv_bfloat16>(p, form, ks, ldx, ldy, st) : launch_t<__half>(p, form, ks, ldx, ldy, st);
}

extern "C" cudaError_t wtc_launch_qsplit(const wtc_params *p, int kn, int r, cudaStream_t st) {
    if (!p || !p->w || !p->x || (!p->y && !p->glu) || p->m < 1 || p->bf16 || p->n_in % 256 != 0 || p->n_out < 1 ||
        kn < 1 || r < 1 || kn % r != 0 || kn > p->n_in / 256)
        return cudaErrorInvalidValue;
    if (!wg_on() || !tma_encoder()) return cudaErrorNotSupported;
    const int ldx = p->ldx ? p->ldx : p->n_in, ldy = p->ldy ? p->ldy : p->n_out;
    if (ldx < p->n_in || ldx % 8 || ldy < p->n_out || (long)p->m * ldx >= (1L << 31)) return cudaErrorInvalidValue;
    if (p->x_rows < 0 || (p->x_rows && p->x_rows < p->m) || (long)p->x_rows * ldx >= (1L << 31))
        return cudaErrorInvalidValue;
    if (p->glu && (p->n_out % 16 != 0 || p->ldg < p->n_out / 2 || (long)p->m * p->ldg >= (1L << 31)))
        return cudaErrorInvalidValue;
    if (((uintptr_t)p->w & 15) || ((uintptr_t)p->x & 15)) return cudaErrorMisalignedAddress;
    /* tiles of 128 W rows x 128 batch rows (the form for large m), or 192 batch rows where ws_chained takes them;
     * the open group's sums in shared memory only where groups are neither single sub-splits nor the whole row
     * (otherwise the order is the sequential one), and there 128 rows (a ring of 3 stages at 192 rows: every
     * product above 128 rows in 192-row tiles made the 8B Q4_K_M 2k prefill 71.7 against 67.3 ms on an H200;
     * where ws_chained takes them and outside groups, 65.4 against 66.3-66.5) */
    if (r > 1 && r < kn) return launch_ws_t<__half, 2, 128, true, true>(p, kn, ldx, ldy, st, r);
    if (ws_chained(p).nx == 192) return launch_ws_t<__half, 2, 192, true, false>(p, kn, ldx, ldy, st, r);
    return launch_ws_t<__half, 2, 128, true, false>(p, kn, ldx, ldy, st, r);
}
