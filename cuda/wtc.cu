/* cuda/wtc.cu: 16-bit weight products on tensor cores, batch-invariant (contract and arithmetic: wtc.h).
 *
 * Shared-memory tiles are [rows][64] 16-bit values (8 chunks of 16 bytes per row), chunk c of row r stored at
 * chunk c ^ (r & 7): the ldmatrix reads of 8 consecutive rows at one logical chunk hit 8 distinct bank groups.
 * A operand (W rows) by ldmatrix.x4: lanes 0-15 address rows 0-15 at chunk 2q, lanes 16-31 the same rows at
 * chunk 2q + 1, which yields a0..a3 of m16n8k16 (rows g / g + 8, k 2t / 2t + 8). B operand (x rows, k
 * contiguous) by ldmatrix.x4 over 16 batch rows (two n8 fragments), or, in the narrow kernel, straight from
 * global memory (b0 = k 2t..2t+1, b1 = k 2t+8..2t+9 of batch row g). */
#include "wtc.h"
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
constexpr int kKC = 64;            /* k elements per stage of the narrow kernel (H100, 8B BF16 M = 1: 7.3 ms; 256
                                    * with 3 stages: 8.7 ms) */
constexpr int kNS = 6;             /* narrow kernel: stages of each warp's ring (H100, 8B BF16 M = 1: 6 -> 6.49 ms,
                                    * 4 -> 6.53, 8 -> 7.00: more warps per SM beat deeper rings) */
constexpr int kStageN = 16 * kKC;  /* narrow stage: 16 rows x 64 (2 KiB) */
constexpr int kBM = 128, kWS = 4;  /* wide kernel: CTA rows of W and stages (kBN batch rows: a template) */
constexpr int kMaxKs = 8;
constexpr int kSplitRows = 256;    /* the one-CTA-per-split form serves launches of at most this many rows */
constexpr size_t kNarrowSmem = (size_t)kMaxKs * kNS * kStageN * 2;           /* 128 KiB at ks 8 */
constexpr size_t kWideSmem64 = (size_t)kWS * (kBM + 64) * kKT * 2;          /* 96 KiB at kBN 64: 2 CTAs per SM */

/* element offset of 16-byte chunk c of row r in a [rows][W] tile, chunks XOR-swizzled by (r & 7) */
template <int W> __device__ __forceinline__ int swz(int r, int c) { return r * W + ((c ^ (r & 7)) << 3); }

__device__ __forceinline__ uint32_t ldg32(const void *p) { return __ldg(reinterpret_cast<const unsigned int *>(p)); }

/* M <= 8: CTA = ks warps on one 16-row tile, warp s chains split s through its own ring; warp 0 sums the split
 * partials in order (wtc.h) and stores columns < m */
template <typename T>
__global__ void __launch_bounds__(kMaxKs * 32) wtc_narrow(const T *__restrict__ w, int n_in, int n_out, int ks,
                                                          int m, const T *__restrict__ x, int ldx, float *y, int ldy,
                                                          const float *y_in) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int klen = n_in / ks, k0 = warp * klen, nst = klen / kKC;
    T *ring = reinterpret_cast<T *>(smem) + (size_t)warp * kNS * kStageN;
    /* stage s (k0 + s kKC ..) of this warp's split into slot s % kNS; one commit group per call (empty past the
     * end) */
    /* lane's 4 chunks of a stage: rows lane / 8 + 4 j, chunk lane % 8 (addresses computed once) */
    const T *src[4];
    int soff[4];
    bool sok[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = (lane >> 3) + 4 * j, row = row0 + r;
        sok[j] = row < n_out;
        src[j] = sok[j] ? w + (size_t)row * n_in + k0 + (lane & 7) * 8 : w;
        soff[j] = swz<kKC>(r, lane & 7);
    }
    auto load = [&](int s) {
        if (s < nst) {
            T *dst = ring + (s % kNS) * kStageN;
#pragma unroll
            for (int j = 0; j < 4; j++) cp_async16_zfill(dst + soff[j], sok[j] ? src[j] + s * kKC : w, sok[j]);
        }
        cp_async_commit();
    };
    pdl_trigger();
    /* weights are written once, at load: their first stages stream in while the kernel before finishes */
#pragma unroll
    for (int s = 0; s < kNS - 1; s++) load(s);
    pdl_wait();
    const T *xr = g < m ? x + (size_t)g * ldx + k0 + 2 * t : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    static_assert(kKC == 64, "a stage is 4 k16 steps and 4 chunks per lane (splits are multiples of 64)");
    /* x of stage s + 1 is loaded while stage s is multiplied (its latency stays off the mma chain) */
    uint32_t bx[4][2], bn[4][2];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        bn[q][0] = xr && nst > 0 ? ldg32(xr + 16 * q) : 0u;
        bn[q][1] = xr && nst > 0 ? ldg32(xr + 16 * q + 8) : 0u;
    }
    for (int s = 0; s < nst; s++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            bx[q][0] = bn[q][0];
            bx[q][1] = bn[q][1];
        }
        if (xr && s + 1 < nst) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                bn[q][0] = ldg32(xr + (s + 1) * kKC + 16 * q);
                bn[q][1] = ldg32(xr + (s + 1) * kKC + 16 * q + 8);
            }
        }
        cp_async_wait<kNS - 2>();
        __syncwarp();   /* stage s landed for every lane; every lane is done with stage s - 1 (refilled next) */
        load(s + kNS - 1);
        const T *st = ring + (s % kNS) * kStageN;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t a[4];
            ldsm_x4(a, st + swz<kKC>(lane & 15, 2 * q + (lane >> 4)));
            tc_type<T>::mma(acc, a, bx[q][0], bx[q][1]);
        }
    }
    cp_async_wait<0>();
    __syncwarp();
    float *part = reinterpret_cast<float *>(ring);   /* this warp's ring is idle now */
    *reinterpret_cast<float4 *>(part + lane * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp != 0) return;
    for (int k = 1; k < ks; k++) {
        const float4 v = *reinterpret_cast<const float4 *>(
            reinterpret_cast<const float *>(smem + (size_t)k * kNS * kStageN * sizeof(T)) + lane * 4);
        acc[0] = __fadd_rn(acc[0], v.x);
        acc[1] = __fadd_rn(acc[1], v.y);
        acc[2] = __fadd_rn(acc[2], v.z);
        acc[3] = __fadd_rn(acc[3], v.w);
    }
    /* lane (g, t): acc = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1] */
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int row = row0 + g + 8 * (e >> 1), col = 2 * t + (e & 1);
        if (row < n_out && col < m) {
            const size_t idx = (size_t)col * ldy + row;
            y[idx] = y_in ? __fadd_rn(acc[e], y_in[idx]) : acc[e];
        }
    }
}

/* M > 8: CTA tile kBM W rows x kBN batch rows (32, 64 or 128: the smallest covering M), 8 warps as WR x WC
 * (each 16 MI rows x 32 batch rows), kWS-stage cp.async pipeline over 64-wide k tiles. PER_SPLIT: blockIdx.z is one split, its partial goes to part [ks][m][n_out] (the merge
 * kernel sums); else the CTA runs every split, closing each one into tot in order. */
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

template <typename T>
cudaError_t launch_t(const wtc_params *p, int form, int ks, int ldx, int ldy, cudaStream_t st) {
    if (form == 1) {
        static std::atomic<unsigned long long> s_set{0};
        const cudaError_t e = cu_smem_optin(wtc_narrow<T>, kNarrowSmem, s_set);
        if (e != cudaSuccess) return e;
        const unsigned tiles = (unsigned)((p->n_out + 15) / 16);
        return cu_launch(wtc_narrow<T>, dim3(tiles), dim3(32 * ks), (size_t)ks * kNS * kStageN * sizeof(T), st,
                         (const T *)p->w, p->n_in, p->n_out, ks, p->m, (const T *)p->x, ldx, p->y, ldy, p->y_in);
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
    /* enough warps for one decode row (tiles x ks >= 2048 on the narrow kernel), each split a multiple of the
     * 64-wide k tile. Shape only: it is part of every element's arithmetic. */
    const long tiles = (n_out + 15) / 16;
    int ks = 1;
    while (ks < kMaxKs && tiles * ks < 2048 && n_in % (kKT * 2 * ks) == 0) ks *= 2;
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

extern "C" cudaError_t wtc_launch(const wtc_params *p, cudaStream_t st) {
    if (!p || !p->w || !p->x || !p->y || p->m < 1 || !wtc_supported(p->n_in, p->n_out) || p->form < 0 || p->form > 3)
        return cudaErrorInvalidValue;
    const int ldx = p->ldx ? p->ldx : p->n_in, ldy = p->ldy ? p->ldy : p->n_out;
    if (ldx < p->n_in || ldx % 8 || ldy < p->n_out || (long)p->m * ldx >= (1L << 31)) return cudaErrorInvalidValue;
    if (((uintptr_t)p->w & 15) || ((uintptr_t)p->x & 15)) return cudaErrorMisalignedAddress;
    const int ks = wtc_split(p->n_in, p->n_out);
    int form = p->form;
    if (form == 0) {
        if (p->m <= 8) {
            form = 1;
        } else {
            /* one CTA per split when the tile grid alone would leave most multiprocessors idle (layer matrices
             * at batch 16-128); the form never changes a bit (wtc.h) */
            const int bn = wide_bn(p->m);
            const long ctas = (long)((p->m + bn - 1) / bn) * ((p->n_out + kBM - 1) / kBM);
            form = ks > 1 && p->m <= kSplitRows && ctas < 2L * cu_sm_count(p->sm_count) ? 3 : 2;
        }
    }
    if (form == 1 && p->m > 8) return cudaErrorInvalidValue;
    if (form == 3 && ks > 1) {
        if (p->m > kSplitRows || !p->workspace || ((uintptr_t)p->workspace & 15) ||
            p->workspace_bytes < (size_t)ks * p->m * p->n_out * sizeof(float))
            return cudaErrorInvalidValue;
    }
    if (form == 3 && ks == 1) form = 2;   /* one split: nothing to merge */
    return p->bf16 ? launch_t<__nv_bfloat16>(p, form, ks, ldx, ldy, st) : launch_t<__half>(p, form, ks, ldx, ldy, st);
}
