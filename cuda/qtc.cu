/* cuda/qtc.cu: tensor-core products of tile-packed GGUF weights (contract and batch-invariance argument:
 * cuda/qtc.h).
 *
 * Packed layout (written on the host by cuda/qtc_pack.cu). Rows are grouped in tiles of 16 (zero rows pad the last tile), each row cut in 256-element
 * units; tile block (tile, unit) is TB bytes at ((tile * n_units) + unit) * TB, so one tile's blocks are
 * contiguous and a warp streams its split as one run. Lane L = 4 g + t of the warp that multiplies a tile block
 * holds rows g and g + 8 (the mma A fragment rows) and owns elements 64 t .. 64 t + 63 of the unit; its 16-wide
 * k step s (0..15) takes elements 64 t + 4 s .. + 3, placed in k slots (2t, 2t+1, 2t+8, 2t+9), so its x operand
 * is 4 consecutive halves and A and B always agree. Per type (bytes of one tile block):
 *   Q4_K (2304): quants at 512 j + 16 L, j = 2 h + b: row g + 8 h, sub-block 2 t + b (32 elements), 4-bit levels;
 *         word u of the 16 bytes holds elements 8u .. 8u+7, element 8u + 2p + c at bit 16 c + 4 p, so that
 *         (word >> 4p) & 0x000F000F is the f16x2 pair (8u+2p, 8u+2p+1) under 0x6400. At 2048 + 16 r: row r's
 *         record: d, dmin (f16 bits), then 12 bytes where lane t's 24 bits (bit 24 t) are sc(2t), m(2t),
 *         sc(2t+1), m(2t+1), 6 bits each. Weight = f16 fma((q), f16(d sc), -f16(dmin m)).
 *   Q6_K (3360): the low 4 bits as Q4_K's quants (b = 32-element run); at 2048 + 512 h + 16 L the high 2 bits of
 *         row g + 8 h: word v holds lane elements 16 v .. 16 v + 15, element 16 v + 2 P + c at bit 16 c + 2 P;
 *         at 3072 + 16 r row r's 16 int8 sub-block scales, at 3328 + 2 r its d. Weight = (q - 32) * f16(d sc),
 *         as 16 (q - 32) * f16(d sc) / 16 for the pairs read 4 bits up (the same wherever d sc / 16 is normal).
 *   Q8_0 (4352): at 512 j + 16 L, j = 4 h + c: the levels q + 128 (uint8) of row g + 8 h, lane elements 16 c ..
 *         16 c + 15 in order; at 4096 + 16 r row r's 8 block scales d (f16). Weight = q * f16(d).
 * Every dequantized weight is one f16 value computed the same way whatever M is.
 *
 * Kernel. A CTA is kn warps (kn = qtc_split_narrow: contiguous ranges of units, one per warp) and NF fragments of
 * 8 batch columns (grid.x: column groups, fastest, so the CTAs of one tile run together and share its weights
 * through L2), persistent over tiles (grid.y: at most the CTAs the GPU holds at once; CTA b takes tiles b, b +
 * gridDim.y, ...). Each warp streams the tile blocks of its unit range, tile after tile, through its own 2-stage
 * cp.async ring in shared memory, reads its quants and scales from the ring into registers, dequantizes a 16x16 A
 * fragment per k step and multiplies it with the NF B fragments (x read from global memory, 16 bytes per lane per
 * two steps; at NF = 1 the next unit's x is loaded before this unit is multiplied). A tile's kn partials are
 * summed by warp 0 through shared memory, in groups of r = kn / ks and then the groups (qtc.h), then + y_in.
 * Where x comes from is the template parameter XM (qtc_body): each lane's columns straight from global memory, or
 * staged in shared memory by 8-column groups (s_xm_default says which, by m and shape). Above 8 columns (16 where
 * the staged slice serves) a wide kernel below takes over (same arithmetic per element, another work split): on
 * sm_90 the one whose k16 steps are wgmma (qtc_wg_kernel), elsewhere the mma.sync one (qtc_wide_kernel). */
#include "qtc.h"
#include "qtc_layout.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "act.cuh"
#include "cu_host.h"
#include "mma_util.cuh"
#include "f16x2.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"
#include "mbar.cuh"
#include "wtc.h"

using namespace zmma;

/* QT_STAGES: the narrow kernel's ring depth per warp (units in flight); QT_STAGES_MAX sizes the narrow kernel's
 * shared-memory requirement (qtc_smem_bytes, which decides at load whether a device serves qtc at all) */
enum { QT_STAGES = 2, QT_STAGES_MAX = 4, QT_MAX_KS = 8 };
/* QT_XS_MAX: the most shared memory the narrow kernel gives the launch's x in its slice form (qtc_body) */
enum { QT_XS_MAX = 64 * 1024 };
/* QT_XC2_MAX: the most shared memory the compact slice with two fragments (9 to 16 columns, sm_90 only) gives x:
 * 16 columns of 4,096 inputs, so that every type's rings and partials fit beside it in the SM's 227 KiB */
enum { QT_XC2_MAX = 128 * 1024 };
/* QT_NARROW_M: the most columns the narrow kernel's staged forms take (in 8-column groups side by side, grid.x) */
enum { QT_NARROW_M = 16 };
enum { QB_WARPS = 8, QB_COLS = 64, QB_STAGES = 3, QB_XBYTES = QB_COLS * 512, QB_CHUNK = 256 };

template <int TY> struct qt_traits;
template <> struct qt_traits<QT_Q4K> { static constexpr int TB = 2304; };
template <> struct qt_traits<QT_Q6K> { static constexpr int TB = 3360; };
template <> struct qt_traits<QT_Q8_0> { static constexpr int TB = 4352; };


extern "C" int qtc_supported(ggml_type t, int n_in, int n_out)
{
    return qt_ty(t) >= 0 && n_in > 0 && n_in % 256 == 0 && n_out > 0 && (n_out + 15) / 16 <= 65535;
}

extern "C" size_t qtc_packed_bytes(ggml_type t, int n_in, int n_out)
{
    if (!qtc_supported(t, n_in, n_out)) return 0;
    return (size_t)((n_out + 15) / 16) * (size_t)(n_in / 256) * (size_t)qt_tb(qt_ty(t));
}

/* the narrow kernel's dynamic shared memory: kn rings, then the double-buffered partial area */
static size_t s_narrow_bytes(int tb, int st, int kn, int nf)
{
    return (size_t)kn * st * tb + (size_t)2 * kn * nf * 512;
}

/* the staged form's x area: kn warp slices of xsn units x 8 columns x 512 bytes (xsn = ceil(units / kn), the
 * longest warp range; the columns past m are zeros) */
static size_t s_xs_bytes(int units, int kn) {
    const int xsn = (units + kn - 1) / kn;
    return (size_t)kn * xsn * 8 * 512;
}

/* the compact form's x area (m <= 16, one CTA's columns): kn warp slices of xsn units x m columns x 512 bytes */
static size_t s_xc_bytes(int units, int kn, int m) {
    const int xsn = (units + kn - 1) / kn;
    return (size_t)kn * xsn * (size_t)m * 512;
}

/* Grow ks (powers of two, at most 8 and at most half the units per row) while the matrix has fewer than 1024
 * warps: enough streams in flight at M = 1 on a 132-SM H100. Shape only: part of every element's arithmetic. */
extern "C" size_t qtc_smem_bytes(ggml_type t)
{
    const int ty = qt_ty(t);
    if (ty < 0) return 0;
    /* the staged forms (QT_STAGES-deep rings of one fragment, plus at most QT_XS_MAX of x or 4 KiB of x a stage)
     * ask less than the deepest narrow form for every type; the compact slice's two-fragment form (up to
     * QT_XC2_MAX of x, 197 KiB in all for Q6_K) runs only on sm_90, whose SMs have 227 KiB, and is not counted */
    const size_t narrow = s_narrow_bytes(qt_tb(ty), QT_STAGES_MAX, QT_MAX_KS, 8);
    const size_t wide = (size_t)QB_STAGES * (QB_WARPS * (size_t)qt_tb(ty) + QB_XBYTES);
    return narrow > wide ? narrow : wide;
}

static size_t s_part_bytes(int ks, int n_out);

/* The 16-bit form (QTC_F16): the weights dequantized into a 16-bit copy in row chunks of QF_ROWS_BYTES at most
 * (whole multiples of 128 rows, at least 128), x permuted into qtc's k order in column chunks of QF_COLS_BYTES and
 * 4,096 columns at most (multiples of 128, at least 128): both bound the workspace whatever the matrix (an 8B
 * layer's gate/up copy is 224 MiB whole). QF_MIN_M: the fewest columns for which qtc_launch takes it by default (at
 * 1,024 columns every 8B product is faster than in the wgmma kernel, H200: docs/perf.md) */
enum { QF_MIN_M = 1024 };
static const size_t QF_ROWS_BYTES = (size_t)128 << 20, QF_COLS_BYTES = (size_t)64 << 20;
static int s_f16_rows(int n_in, int n_out) {
    long r = (long)(QF_ROWS_BYTES / ((size_t)n_in * 2)) / 128 * 128;
    const long all = ((long)n_out + 127) / 128 * 128;
    if (r < 128) r = 128;
    return (int)(r < all ? r : all);
}
static int s_f16_cols(int n_in) { /* at most 4,096: twice the engine's prefill chunk (--step-tokens) */
    const long c = (long)(QF_COLS_BYTES / ((size_t)n_in * 2)) / 128 * 128;
    return c < 128 ? 128 : c > 4096 ? 4096 : (int)c;
}
/* the 16-bit form's workspace (after the wide kernels', from the next 256-byte boundary: the TMA maps' bases): the
 * row chunk's copy, then the column chunk of x */
static size_t s_f16_bytes(int n_in, int n_out) {
    return 256 + ((size_t)s_f16_rows(n_in, n_out) + (size_t)s_f16_cols(n_in)) * (size_t)n_in * 2;
}

/* the wgmma kernel's hand-over sums (qw_plan), after the 16-bit form's copies: room for 8 published sums of 128
 * columns (QW_FIX_SUM bytes each) per SM; their flags (qtc_params.flags, qtc_flags_bytes) one per sum of 32
 * columns, the most sums the same bytes hold */
enum { QW_FIX_SUM = 16 * 128 * 4 };
static size_t s_fix_bytes() { return (size_t)cu_sm_count(0) * QB_WARPS * QW_FIX_SUM; }

extern "C" size_t qtc_flags_bytes(void) {
    return wtc_wgmma() ? (size_t)cu_sm_count(0) * QB_WARPS * 4 * sizeof(unsigned) : 0;
}

extern "C" size_t qtc_workspace_bytes(ggml_type t, int n_in, int n_out)
{
    const int ks = qtc_split(t, n_in, n_out);
    if (ks < 1) return 0;
    /* the split partials, then the wgmma kernel's images of x (qtc_ximage_kernel: 256 columns' room), then on
     * devices where it runs the 16-bit form's copies and the wgmma kernel's hand-over sums */
    return s_part_bytes(ks, n_out) + (size_t)QB_CHUNK * (size_t)n_in * 2 +
           (wtc_wgmma() ? s_f16_bytes(n_in, n_out) + s_fix_bytes() : 0);
}

extern "C" int qtc_split(ggml_type t, int n_in, int n_out)
{
    if (!qtc_supported(t, n_in, n_out)) return 0;
    /* the warps one launch aims for (tiles x ks). ks decides the summation order: a function of the shape only */
    constexpr long s_target = 1024;
    const long units = n_in / 256, tiles = (n_out + 15) / 16;
    int ks = 1;
    while (ks < QT_MAX_KS && 2 * ks <= units && tiles * ks < s_target) ks *= 2;
    return ks;
}

extern "C" int qtc_split_narrow(ggml_type t, int n_in, int n_out)
{
    const int ks = qtc_split(t, n_in, n_out);
    if (ks < 1) return 0;
    /* sub-splits: more streams for the narrow kernel (M <= 8 is bound by how many bytes are in flight, not by
     * its instructions), while the wide kernel keeps ks CTAs per tile group (more would cost it workspace
     * traffic at M = 64: measured +4% with ks itself doubled). Q8_0 aims for 4096 warps (8B Q8_0 M = 1 with
     * 2-unit rings and persistent CTAs: 3.633 against 3.744 ms with kn = ks, 3.650 at 2048; 8192 measured no
     * faster). Q4_K and Q6_K aim for 8192, which gives the 14336-row gate and up matrices and the 128256-row LM
     * head twice the streams (their units are 144 and 210 bytes a row against Q8_0's 272, so they need more
     * warps for the same bytes in flight): 8B Q4_K_M M = 1 about 1% faster than at 4096, itself about 6% faster
     * than kn = ks (H100). */
    const long target = t == GGML_Q8_0 ? 4096 : 8192;
    const long units = n_in / 256, tiles = (n_out + 15) / 16;
    int kn = ks;
    while (kn < QT_MAX_KS && 2 * kn <= units && tiles * kn < target) kn *= 2;
    return kn;
}

/* ------------------------------------------------------------------------------------------------------
 * device helpers */

static __device__ __forceinline__ float h_to_f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xffff)));
}
static __device__ __forceinline__ uint32_t comp(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
/* c[16x8] += A[16x16] b[16x8], f16 operands, f32 accumulators (cuda/mma_util.cuh) */
static __device__ __forceinline__ void mma_f16(float *c, const uint32_t (&A)[4], uint32_t b0, uint32_t b1)
{
    tc_type<__half>::mma(c, A, b0, b1);
}

/* the unit's data a lane needs, read from its ring stage, and the per-step A fragments */
template <int TY> struct unit_regs;

template <> struct unit_regs<QT_Q4K> {
    uint4 q[4];                 /* j = 2h + b */
    /* [h]: f16x2 pairs (sub-block 2t in the low half, 2t + 1 in the high half) of d sc, of -(dmin m) and of
     * d sc / 16 (the scale of a level read 4 bits up, 16 q); frag picks half b through h2bc, an operand
     * selector of the HFMA2, not an instruction */
    uint32_t a[2], nb[2], a16[2];
    __device__ __forceinline__ void load(const uint8_t *sp, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < 4; j++) q[j] = *(const uint4 *)(sp + 512 * j + 16 * lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 rec = *(const uint4 *)(sp + 2048 + 16 * (g + 8 * h));   /* d, dmin, packed scales */
            const unsigned long long v = t < 2 ? (((unsigned long long)rec.z << 32 | rec.y) >> (24 * t))
                                               : (((unsigned long long)rec.w << 32 | rec.z) >> (24 * t - 32));
            /* f16(d sc), f16(-(dmin m)), f16(d sc / 16) of sub-blocks 2t and 2t + 1 (cuda/f16x2.cuh) */
            q4k_scales(rec.x, (uint32_t)v, a[h], nb[h], a16[h]);
        }
    }
    /* A fragment of step s: a0 = row g (e0,e1), a1 = row g+8 (e0,e1), a2 = row g (e2,e3), a3 = row g+8 (e2,e3).
     * The pair at bit 4 of each half-word is read in place, as 16 q under 0x6400 (mantissa bits 4..7), with the
     * scale d sc / 16: one shift a word (by 8, odd steps) instead of three. fma(16 q, f16(d sc / 16), nb) is
     * fma(q, f16(d sc), nb) exactly wherever d sc / 16 is a normal f16 (>= 2^-14); below, the scale carries its
     * subnormal rounding (an absolute error under 2^-25 a level) */
    __device__ __forceinline__ void frag(int s, uint32_t (&A)[4]) const
    {
        const int b = s >> 3, u = (s & 7) >> 1;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t w = (s & 1) ? comp(q[2 * h + b], u) >> 8 : comp(q[2 * h + b], u);
            const uint32_t v0 = lop_andor(w, 0x000F000Fu, 0x64006400u);   /* 1024 + q */
            const uint32_t v1 = lop_andor(w, 0x00F000F0u, 0x64006400u);   /* 1024 + 16 q */
            A[h] = h2fma(h2sub(v0, 0x64006400u), h2bc(a[h], b), h2bc(nb[h], b));
            A[2 + h] = h2fma(h2sub(v1, 0x64006400u), h2bc(a16[h], b), h2bc(nb[h], b));
        }
    }
};

/* x shifted left by S bits (right by -S), S a compile-time constant after unrolling */
static __device__ __forceinline__ uint32_t shl_s(uint32_t x, int S)
{
    return S >= 0 ? x << S : x >> -S;
}

template <> struct unit_regs<QT_Q6K> {
    uint4 q[4];               /* low nibbles, j = 2h + b */
    uint4 hi[2];              /* high 2 bits, [h] */
    uint32_t a[2][2];         /* [h][i]: f16x2 of d sc of sub-blocks 4t + 2i (low half) and 4t + 2i + 1 (high) */
    uint32_t a16[2][2];       /* [h][i]: the same / 16, the scale of 16 (q - 32) */
    __device__ __forceinline__ void load(const uint8_t *sp, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < 4; j++) q[j] = *(const uint4 *)(sp + 512 * j + 16 * lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            hi[h] = *(const uint4 *)(sp + 2048 + 512 * h + 16 * lane);
            const int r = g + 8 * h;
            const uint32_t scw = *(const uint32_t *)(sp + 3072 + 16 * r + 4 * t);
            const float d = h_to_f(*(const unsigned short *)(sp + 3328 + 2 * r));
#pragma unroll
            for (int i = 0; i < 2; i++) {
                /* f16(d sc) of two sub-blocks, one conversion (the f32 products are exact) */
                const __half2 p2 = __floats2half2_rn(d * (float)(int8_t)(scw >> (16 * i)),
                                                     d * (float)(int8_t)(scw >> (16 * i + 8)));
                a[h][i] = *(const uint32_t *)&p2;
                a16[h][i] = h2mul(a[h][i], 0x2C002C00u);   /* 0x2C00: 1/16 */
            }
        }
    }
    /* A fragment of step s (layout as Q4_K's). v0 holds the pair whose low 4 bits are at bit 0 of each half-word
     * of w, its 2 high bits moved to bits 4..5: 1024 + q under 0x6400. v1 reads the pair at bit 4 in place with its
     * high bits moved to bits 8..9: 1024 + 16 q (at most 2032), whose 16 (q - 32) = v1 - 1536 is exact and times
     * d sc / 16 gives (q - 32) d sc exactly wherever d sc / 16 is a normal f16 (as Q4_K's 16 q). Per register: one
     * shift of the high word, two LOP3 and the two f16x2 operations; the scale's half is an operand selector */
    __device__ __forceinline__ void frag(int s, uint32_t (&A)[4]) const
    {
        const int b = s >> 3, u = (s & 7) >> 1, v = s >> 2, k = s & 3;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t w = (s & 1) ? comp(q[2 * h + b], u) >> 8 : comp(q[2 * h + b], u);
            const uint32_t H = comp(hi[h], v);
            /* pair 2k's high bits are at bit 4k of each half-word, pair 2k + 1's at 4k + 2 */
            const uint32_t v0 = lop_andor(w, 0x000F000Fu, lop_andor(shl_s(H, 4 - 4 * k), 0x00300030u, 0x64006400u));
            const uint32_t v1 = lop_andor(w, 0x00F000F0u, lop_andor(shl_s(H, 6 - 4 * k), 0x03000300u, 0x64006400u));
            A[h] = h2mul(h2sub(v0, 0x64206420u), h2bc(a[h][v >> 1], v & 1));        /* (1024 + q) - 1056 = q - 32 */
            A[2 + h] = h2mul(h2sub(v1, 0x66006600u), h2bc(a16[h][v >> 1], v & 1));  /* - 1536: 16 (q - 32) */
        }
    }
};

template <> struct unit_regs<QT_Q8_0> {
    uint4 q[8];               /* j = 4h + c */
    uint32_t d[2][2];         /* [h][block 2t + i]: f16x2 of d */
    __device__ __forceinline__ void load(const uint8_t *sp, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = *(const uint4 *)(sp + 512 * j + 16 * lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t dw = *(const uint32_t *)(sp + 4096 + 16 * (g + 8 * h) + 4 * t);
            d[h][0] = (dw & 0xffffu) | (dw << 16);
            d[h][1] = (dw >> 16) | (dw & 0xffff0000u);
        }
    }
    __device__ __forceinline__ void frag(int s, uint32_t (&A)[4]) const
    {
        const int c = s >> 2, u = s & 3, bi = s >> 3;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t w = comp(q[4 * h + c], u);   /* q + 128, as packed */
            const uint32_t v0 = prmt(w, 0x64646464u, 0x4140u), v1 = prmt(w, 0x64646464u, 0x4342u);
            A[h] = h2mul(h2sub(v0, 0x64806480u), d[h][bi]);          /* (1024 + q + 128) - 1152 = q, exact */
            A[2 + h] = h2mul(h2sub(v1, 0x64806480u), d[h][bi]);
        }
    }
};

/* The 16-bit form's copies. A 16-bit row holds each unit's elements in qtc's step order: position 16 s + j of a unit
 * holds the element k slot j of step s takes (lane t's elements 64 t + 4 s .. + 3 in slots 2t, 2t+1, 2t+8, 2t+9),
 * so that a plain k16 step over positions 16 s .. 16 s + 15 multiplies exactly the operands of qtc's step s in the
 * same slots. qtc_dq_kernel: one warp per tile block (tile, unit) of tiles [tile0, tile0 + tiles), its 16 rows
 * dequantized by unit_regs (the same f16 values every form computes) into rows [16 (tile - tile0)) of wf, [rows][n_in]
 * (rows past n_out - 16 tile0 not written) */
enum { QDQ_WARPS = 4 }; /* qtc_dq_kernel's warps a block (tile blocks a block) */
template <int TY>
__global__ void __launch_bounds__(QDQ_WARPS * 32)
    qtc_dq_kernel(const uint8_t *__restrict__ w, int units, int tile0, int tiles, int rows, uint32_t *__restrict__ wf) {
    constexpr int TB = qt_traits<TY>::TB, LD = 132; /* a staged row: 128 f16 pairs + 4 (conflict-free writes) */
    __shared__ __align__(16) uint32_t s_t[QDQ_WARPS][16 * LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long b = (long)blockIdx.x * QDQ_WARPS + warp;
    pdl_trigger();
    if (b >= (long)tiles * units) return;
    const int tl = (int)(b / units), u = (int)(b - (long)tl * units);
    unit_regs<TY> R;
    R.load(w + ((size_t)(tile0 + tl) * units + u) * TB, lane); /* the weights: written once, at load */
    /* the tile block's 16 rows x 256 positions staged in shared memory, then stored as whole 512-byte row runs */
    uint32_t *st = s_t[warp];
#pragma unroll
    for (int s = 0; s < 16; s++) {
        uint32_t A[4];
        R.frag(s, A);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            st[(g + 8 * h) * LD + 8 * s + t] = A[h];         /* slots 2t, 2t + 1 */
            st[(g + 8 * h) * LD + 8 * s + t + 4] = A[2 + h]; /* slots 2t + 8, 2t + 9 */
        }
    }
    __syncwarp();
    pdl_wait();                                 /* wf: read by the product before (cuda/pdl.cuh) */
    const size_t half_in = (size_t)units * 128; /* f16 pairs a row */
    for (int r = 0; r < 16 && 16 * tl + r < rows; r++)
        *(uint4 *)(wf + (size_t)(16 * tl + r) * half_in + (size_t)u * 128 + 4 * lane) =
            *(const uint4 *)(st + r * LD + 4 * lane);
}

/* x rows [0, m) of x into xq [rows][n_in] in the copy's order (zeros in rows m .. rows - 1): row blockIdx.y, 8
 * positions a thread, 16 s + 8 h .. + 7 of a unit, which are the pairs of elements 64 t + 4 s + 2 h (+ 1) for
 * t = 0..3 (a warp's loads of one t are 128 contiguous bytes, its stores 512) */
__global__ void __launch_bounds__(256)
    qtc_xq_kernel(const uint16_t *__restrict__ x, int ldx, int m, int n_in, uint16_t *__restrict__ xq) {
    pdl_trigger();
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int r = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
    if (c >= n_in / 8) return;
    const int u = c >> 5, s = (c >> 1) & 15, h = c & 1;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < m) {
        const uint32_t *xu = (const uint32_t *)(x + (size_t)r * ldx + (size_t)u * 256 + 4 * s + 2 * h);
        v = make_uint4(__ldg(xu), __ldg(xu + 32), __ldg(xu + 64), __ldg(xu + 96)); /* t = 0..3: 64 halves apart */
    }
    *(uint4 *)(xq + (size_t)r * n_in + 8 * (size_t)c) = v;
}

/* copy tile block src (TB bytes, 16-byte aligned) into the ring stage dst; one commit group per call site */
template <int TB>
static __device__ __forceinline__ void issue_block(uint8_t *dst, const uint8_t *src, int lane)
{
#pragma unroll
    for (int c = lane; c < TB / 16; c += 32) cp_async16_zfill(dst + 16 * c, src + 16 * c, true);
}

/* byte offset of 16-byte chunk c (0..31) of column r within a staged unit's [8][256] halves: chunks XOR-swizzled
 * so that the 8 lanes of a quarter-warp (two columns x t = 0..3, chunk 8 t + p) hit 8 distinct bank groups */
static __device__ __forceinline__ int xs_off(int r, int c) {
    return r * 512 + 16 * (c ^ ((c >> 3) & 3) ^ ((r & 1) << 2));
}

/* XM, where the narrow kernel's x comes from: XM_LDG each lane's columns from global memory; XM_SLICE each warp's
 * unit range copied once into shared memory (8 columns, zero past m) and read for every tile of the CTA; XM_RING
 * each unit's x (8 columns) copied into the ring stage beside its tile block, for ranges too long to keep;
 * XM_CSLICE as XM_SLICE with only the CTA's mc = min(8 NF, m - col0) columns copied (no zero columns), each lane
 * reading its B operands of a step pair just before their mma (no unit of x held in registers: at most 80 registers
 * a thread, launch bound 3 CTAs an SM, against 127-144 with XM_LDG; Q8_0's rings still keep it to 2 CTAs an SM).
 * With NF = 2 (9 to 16 columns) one CTA multiplies each dequantized A fragment with both fragments of x, where the
 * slice form's two CTAs of 8 columns each dequantize the tile */
enum { XM_LDG = 0, XM_SLICE = 1, XM_RING = 2, XM_CSLICE = 3 };

/* The narrow kernel's CTAs are persistent: grid.y is at most the CTAs that fit the GPU at once (qtc_launch), and
 * CTA b takes tiles b, b + gridDim.y, ... . A warp streams the tile blocks of its unit range for each of its tiles
 * as one run through its ring, so the next tile's blocks are in flight while this tile is multiplied and summed
 * (with one tile per CTA a warp had 2 units: its ring drained before every CTA's end). A tile's kn partials pass
 * through a partial area double-buffered by tile parity: every warp but 0 writes its partial of tile k, one block
 * barrier, warp 0 sums them in warp order and stores. Warp 0 read tile k - 2's partials before it reached tile
 * k - 1's barrier, which every warp passed before writing tile k's: the one barrier per tile orders both. Each
 * tile's arithmetic is that of one CTA per tile, whatever the grid.
 */
template <int TY, int NF, int ST, int XM>
static __device__ __forceinline__ void
qtc_body(const uint8_t *__restrict__ w, int units, int kn, int r, int n_out, int m, const uint16_t *__restrict__ x,
         int ldx, float *y, int ldy, const float *y_in, __half *glu, int ldg, int pre, int by, int gy, int xsn) {
    static_assert(XM == XM_LDG || NF == 1 || (XM == XM_CSLICE && NF == 2),
                  "the staged forms carry one fragment, the compact slice up to two");
    constexpr bool XS = XM != XM_LDG;
    /* TB: a tile block; SB: a ring stage (the tile block, then with XM_RING the unit's x) */
    constexpr int TB = qt_traits<TY>::TB, SB = TB + (XM == XM_RING ? 4096 : 0);
    extern __shared__ __align__(16) uint8_t s_mem[];
    /* the warp index from warp_index: uniform registers (products up to 13% faster at 1 to 16 rows; Q8_0's
     * global-read form with its launch bound, qtc_kernel) */
    const int warp = warp_index();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int col0 = blockIdx.x * NF * 8, tiles = (n_out + 15) / 16;
    const int u0 = (int)((long)units * warp / kn), u1 = (int)((long)units * (warp + 1) / kn), n = u1 - u0;
    uint8_t *ring = s_mem + (size_t)warp * ST * SB;
    float *part = (float *)(s_mem + (size_t)kn * ST * SB); /* [2][kn][NF * 32][4] partials */
    /* XM_SLICE: this warp's x slice, [xsn units][8 columns][256 halves] (xs_off), after the partial area */
    uint8_t *xs = s_mem + (size_t)kn * ST * SB + (size_t)2 * kn * NF * 512 + (size_t)warp * xsn * 8 * 512;
    /* XM_CSLICE: this warp's x slice, [xsn units][mc columns][256 halves] (xs_off within a column), mc =
     * min(8 NF, m - col0); lane (g, t) reads column 8 f + g of fragment f, or for columns past m column col0 (any
     * finite operand serves: a column's products are never stored past m, and no column's result depends on
     * another's) */
    auto xc_area = [&](int &mc) {
        mc = m - col0 < 8 * NF ? m - col0 : 8 * NF;
        return s_mem + (size_t)kn * ST * SB + (size_t)2 * kn * NF * 512 + (size_t)warp * xsn * mc * 512;
    };
    /* this CTA's 8 columns (col0 ..) of unit i of this warp's range into dst ([8][256] halves, xs_off), zeros past m */
    auto issue_x = [&](uint8_t *dst, int i) {
#pragma unroll
        for (int k = lane; k < 256; k += 32) {
            const int c = k >> 5, q = k & 31;
            const bool ok = col0 + c < m;
            cp_async16_zfill(dst + xs_off(c, q), ok ? x + (size_t)(col0 + c) * ldx + (size_t)(u0 + i) * 256 + 8 * q : x,
                             ok);
        }
    };
    /* this CTA's tiles: by + k gy for k < nt (by, gy: the CTA's index and count among those of this matrix); the
     * warp's stream: item j = unit j % n of tile j / n */
    const int nt = (tiles - by + gy - 1) / gy, total = nt * n;
    const size_t tstep = (size_t)gy * units * TB;   /* bytes from one of this CTA's tiles to the next */
    /* the next item to issue: its source, and its unit within the range (the source steps to the next tile after
     * unit n - 1) */
    const uint8_t *nsrc = w + ((size_t)by * units + u0) * TB;
    int ni = 0;
    auto advance = [&]() {
        if (++ni < n) {
            nsrc += TB;
        } else {
            ni = 0;
            nsrc += tstep - (size_t)(n - 1) * TB;
        }
    };
    pdl_trigger();
    /* the weights are written once, at load: their first stages stream in while the kernel before this one (the
     * producer of x, or the reader of y) finishes (cuda/pdl.cuh); nothing else is touched before pdl_wait. The
     * launcher passes pre = ST: every stage is issued before it (pre 0 would wait first) */
#pragma unroll
    for (int i = 0; i < ST; i++) {
        if (i == pre) pdl_wait();
        if (i < total) {
            issue_block<TB>(ring + i * SB, nsrc, lane);
            advance();
        }
        cp_async_commit();
    }
    pdl_wait();
    /* XS: lane (g, t) reads chunk 8 t + p of column g at xs_lane + 16 (p ^ xs_k) of each unit (xs_off with the XOR
     * split into its lane part and p, so that the loop adds no address arithmetic) */
    const int xs_lane = g * 512 + 128 * t, xs_k = t ^ ((g & 1) << 2);
    if (XS) {
        /* x, copied as whole 512-byte column runs of a unit (16 bytes a lane; the columns past m zero-filled, so
         * every lane reads without a branch): XM_SLICE the warp's whole range, once, used for every tile of this
         * CTA; XM_RING the units of the stages issued above. The first item waits for it (and for those stages) */
        if (XM == XM_CSLICE) {
            int mc;
            uint8_t *xc = xc_area(mc);
            for (int i = 0; i < n; i++)
                for (int k = lane; k < mc * 32; k += 32) {
                    const int c = k >> 5, q = k & 31;
                    cp_async16_zfill(xc + (size_t)(i * mc + c) * 512 + (xs_off(c, q) - c * 512),
                                     x + (size_t)(col0 + c) * ldx + (size_t)(u0 + i) * 256 + 8 * q, true);
                }
        } else if (XM == XM_SLICE)
            for (int i = 0; i < n; i++) issue_x(xs + (size_t)i * 4096, i);
        else
            for (int i = 0; i < ST && i < total; i++) issue_x(ring + i * SB + TB, i % n);
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
    }
    /* this lane's B columns: col0 + 8 f + g (NULL past m: zero operand, result not stored) */
    const uint16_t *xr[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) {
        const int c = col0 + 8 * f + g;
        xr[f] = c < m ? x + (size_t)c * ldx + (size_t)u0 * 256 + 64 * t : nullptr;
    }
    float acc[NF][4];
#pragma unroll
    for (int f = 0; f < NF; f++) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
    uint4 xn[8], xo[8];   /* NF == 1: x of the even items (xn) and of the odd items (xo), loaded one item ahead */
    if (NF == 1 && !XS) {
#pragma unroll
        for (int p = 0; p < 8; p++)
            xn[p] = xr[0] && total > 0 ? __ldg((const uint4 *)(xr[0]) + p) : make_uint4(0, 0, 0, 0);
    }
    int j = 0;   /* items consumed */
    const bool ycp = NF <= 2 && !glu && y_in && warp == 0;   /* warp 0 copies each tile's y_in ahead (below) */
    for (int k = 0; k < nt; k++) {
        if (ycp) {
            /* warp 0 stores this tile: its y_in elements are copied into warp 0's own slot of the partial area
             * (no other warp writes it) in the group that the tile's first unit commits, so that their L2 round
             * trip overlaps the tile's products instead of following its last barrier. No other CTA writes them
             * (y_in may be y); the slot is read at this tile's end and next written at tile k + 2's start */
            const int tile = by + k * gy;
            float *ys = part + (size_t)(k & 1) * kn * NF * 128;
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int o = tile * 16 + g + 8 * (e >> 1), c = col0 + 8 * f + 2 * t + (e & 1);
                    if (o < n_out && c < m) cp_async4(ys + (f * 32 + lane) * 4 + e, y_in + (size_t)c * ldy + o);
                }
        }
        for (int i = 0; i < n; i++, j++) {
            cp_async_wait<ST - 1>();
            __syncwarp();
            unit_regs<TY> R;
            R.load(ring + (j % ST) * SB, lane);
            /* XS: this unit's x from the warp's slice (column g; chunks 8 t .. 8 t + 7), read before the refill's
             * copies below, which would otherwise queue ahead of these loads */
            uint4 xsv[XS ? 8 : 1];
            if (XS && XM != XM_CSLICE) {
                const uint8_t *xu = (XM == XM_SLICE ? xs + (size_t)i * 4096 : ring + (j % ST) * SB + TB) + xs_lane;
#pragma unroll
                for (int p = 0; p < 8; p++) xsv[p] = *(const uint4 *)(xu + 16 * (p ^ xs_k));
            }
            __syncwarp();   /* every lane has read the stage before it is refilled */
            if (j + ST < total) {
                issue_block<TB>(ring + (j % ST) * SB, nsrc, lane);
                if (XM == XM_RING) issue_x(ring + (j % ST) * SB + TB, ni);
                advance();
            }
            cp_async_commit();
            if (XM == XM_CSLICE && NF == 1) {
                int mc;
                const uint8_t *xc = xc_area(mc);
                const int gc = g < mc ? g : 0, xc_k = t ^ ((gc & 1) << 2);
                const uint8_t *xu = xc + (size_t)(i * mc + gc) * 512 + 128 * t;
#pragma unroll
                for (int s = 0; s < 16; s++) {
                    uint32_t A[4];
                    R.frag(s, A);
                    if (!(s & 1)) xsv[0] = *(const uint4 *)(xu + 16 * ((s >> 1) ^ xc_k));
                    mma_f16(acc[0], A, (s & 1) ? xsv[0].z : xsv[0].x, (s & 1) ? xsv[0].w : xsv[0].y);
                }
            } else if (XM == XM_CSLICE) {
                /* two fragments: fragment f reads column 8 f + g of the CTA's, or column 0 past m */
                int mc;
                const uint8_t *xc = xc_area(mc);
                const uint8_t *xu[NF];
                int xc_k[NF];
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    const int gc = 8 * f + g < mc ? 8 * f + g : 0;
                    xc_k[f] = t ^ ((gc & 1) << 2);
                    xu[f] = xc + (size_t)(i * mc + gc) * 512 + 128 * t;
                }
                uint4 xq[NF];
#pragma unroll
                for (int s = 0; s < 16; s++) {
                    uint32_t A[4];
                    R.frag(s, A);
#pragma unroll
                    for (int f = 0; f < NF; f++) {
                        if (!(s & 1)) xq[f] = *(const uint4 *)(xu[f] + 16 * ((s >> 1) ^ xc_k[f]));
                        mma_f16(acc[f], A, (s & 1) ? xq[f].z : xq[f].x, (s & 1) ? xq[f].w : xq[f].y);
                    }
                }
            } else if (XS) {
#pragma unroll
                for (int s = 0; s < 16; s++) {
                    uint32_t A[4];
                    R.frag(s, A);
                    const uint4 &xq = xsv[s >> 1];
                    mma_f16(acc[0], A, (s & 1) ? xq.z : xq.x, (s & 1) ? xq.w : xq.y);
                }
            } else if (NF == 1) {
                /* this item's x is in one buffer; the next item's is loaded into the other. The buffers swap
                 * roles by item parity (two copies of the body) rather than by a copy, which cost 32 register
                 * moves an item */
                auto body = [&](const uint4 (&xc)[8], uint4 (&xl)[8]) {
                    if (j + 1 < total && xr[0]) {
                        const int in = i + 1 < n ? i + 1 : 0;
#pragma unroll
                        for (int p = 0; p < 8; p++) xl[p] = __ldg((const uint4 *)(xr[0] + (size_t)in * 256) + p);
                    }
#pragma unroll
                    for (int s = 0; s < 16; s++) {
                        uint32_t A[4];
                        R.frag(s, A);
                        const uint4 &xv = xc[s >> 1];
                        const uint32_t b0 = (s & 1) ? xv.z : xv.x, b1 = (s & 1) ? xv.w : xv.y;
                        mma_f16(acc[0], A, b0, b1);
                    }
                };
                if (j & 1)
                    body(xo, xn);
                else
                    body(xn, xo);
            } else {
#pragma unroll
                for (int p = 0; p < 8; p++) {
                    uint4 xv[NF];
#pragma unroll
                    for (int f = 0; f < NF; f++)
                        xv[f] = xr[f] ? __ldg((const uint4 *)(xr[f] + (size_t)i * 256) + p) : make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        uint32_t A[4];
                        R.frag(2 * p + h, A);
#pragma unroll
                        for (int f = 0; f < NF; f++)
                            mma_f16(acc[f], A, h ? xv[f].z : xv[f].x, h ? xv[f].w : xv[f].y);
                    }
                }
            }
        }
        /* tile k of this CTA is done: its kn partials summed in warp order by warp 0, then stored */
        const int tile = by + k * gy;
        /* the y_in copies went with the tile's first unit's group, which n - 1 newer groups follow: the loop's
         * last wait (at most ST - 1 pending) covered it where n > ST; otherwise warp 0 waits here, for all but
         * the newest group at n = 2 and ST = 2 (the output projection's launches) */
        if (ycp) {
            if (n == 1 || (ST > 2 && n <= ST))
                cp_async_wait<0>();
            else if (n == 2)
                cp_async_wait<1>();
        }
        if (kn > 1) {
            float *pb = part + (size_t)(k & 1) * kn * NF * 128;
            if (warp != 0) {
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    *(float4 *)(pb + ((size_t)warp * NF * 32 + f * 32 + lane) * 4) =
                        make_float4(acc[f][0], acc[f][1], acc[f][2], acc[f][3]);
                    acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
                }
            }
            __syncthreads();
            if (warp != 0) continue;
            /* groups of r sub-split partials (the wide kernel's splits) summed first, then the groups, both in
             * order: ((p0 + .. + p_{r-1}) + (p_r + .. + p_{2r-1})) + ..., the wide kernel's and merge's
             * operations. q mod r is kept by a counter: a division per partial (some 25 instructions) made
             * this warp, which every other warp waits for at the next tile's barrier, slower still (ncu: 16%
             * of the warps' stall samples at that barrier, Q4_K 14336 x 4096 at M = 1) */
            float tot[NF][4] = {};
            int qr = 0;   /* q mod r */
            for (int q = 1; q < kn; q++) {
                const float *pk = pb + (size_t)q * NF * 128;
                qr = qr + 1 == r ? 0 : qr + 1;
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    const float4 v = *(const float4 *)(pk + (f * 32 + lane) * 4);
                    if (qr == 0) {
#pragma unroll
                        for (int e = 0; e < 4; e++) tot[f][e] = q == r ? acc[f][e] : tot[f][e] + acc[f][e];
                        acc[f][0] = v.x; acc[f][1] = v.y; acc[f][2] = v.z; acc[f][3] = v.w;
                    } else {
                        acc[f][0] += v.x; acc[f][1] += v.y; acc[f][2] += v.z; acc[f][3] += v.w;
                    }
                }
            }
            if (kn > r) {
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[f][e] = tot[f][e] + acc[f][e];
            }
        }
        /* lane (g, t): acc[f] = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1] of fragment f */
        if (glu) {
            /* rows g and g + 8 of the tile are gate and up of feature 8 tile + g (n_out % 16 == 0) */
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int c = col0 + 8 * f + 2 * t + e;
                    if (c < m)
                        glu[(size_t)c * ldg + tile * 8 + g] = __float2half_rn(silu_mul(acc[f][e], acc[f][2 + e]));
                }
        } else {
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int o = tile * 16 + g + 8 * (e >> 1), c = col0 + 8 * f + 2 * t + (e & 1);
                    if (o < n_out && c < m) {
                        const size_t idx = (size_t)c * ldy + o;
                        const float yi = !y_in ? 0.f
                                         : ycp ? part[(size_t)(k & 1) * kn * NF * 128 + (f * 32 + lane) * 4 + e]
                                               : y_in[idx];
                        y[idx] = y_in ? acc[f][e] + yi : acc[f][e];
                    }
                }
        }
#pragma unroll
        for (int f = 0; f < NF; f++) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
    }
    cp_async_wait<0>();
}

/* Q8_0's global-read form of one fragment (one or two rows on matrices of fewer than 256 tiles, and the LM head) is
 * bound to one CTA an SM, as many as its registers held without the bound: 136 registers a thread and no stack,
 * where the thread count alone gives 128 registers and a stack frame (16% slower on 1,024 x 4,096 at one and two
 * rows; H200, docs/perf.md). 0: the thread count's bound alone */
template <int TY, int NF, int XM> constexpr int qtc_min_ctas() {
    return TY == QT_Q8_0 && NF == 1 && XM == XM_LDG ? 1 : 0;
}

template <int TY, int NF, int ST, int XM>
__global__ void __launch_bounds__(256, qtc_min_ctas<TY, NF, XM>())
    qtc_kernel(const uint8_t *__restrict__ w, int units, int kn, int r, int n_out, int m,
               const uint16_t *__restrict__ x, int ldx, float *y, int ldy, const float *y_in, __half *glu, int ldg,
               int pre, int xsn) {
    qtc_body<TY, NF, ST, XM>(w, units, kn, r, n_out, m, x, ldx, y, ldy, y_in, glu, ldg, pre, (int)blockIdx.y,
                             (int)gridDim.y, xsn);
}

/* the compact slice form (XM_CSLICE) with a launch bound of 3 CTAs an SM: at most 80 registers a thread, which
 * it holds without spilling */
template <int TY, int ST>
__global__ void __launch_bounds__(256, 3)
    qtc_kernel_xc(const uint8_t *__restrict__ w, int units, int kn, int r, int n_out, int m,
                  const uint16_t *__restrict__ x, int ldx, float *y, int ldy, const float *y_in, __half *glu, int ldg,
                  int pre, int xsn) {
    qtc_body<TY, 1, ST, XM_CSLICE>(w, units, kn, r, n_out, m, x, ldx, y, ldy, y_in, glu, ldg, pre, (int)blockIdx.y,
                                   (int)gridDim.y, xsn);
}

/* the narrow kernel of a form: qtc_kernel, or qtc_kernel_xc for the compact slice (one fragment) */
template <int TY, int NF, int ST, int XM> struct qtc_narrow_fn {
    static constexpr auto f = qtc_kernel<TY, NF, ST, XM>;
};
template <int TY, int ST> struct qtc_narrow_fn<TY, 1, ST, XM_CSLICE> {
    static constexpr auto f = qtc_kernel_xc<TY, ST>;
};

/* Two products of one x in one launch (qtc_launch_pair): CTAs below gya run matrix a (type TA), the others matrix
 * b (type TBT), each with the narrow kernel's body and its own CTA count, so each element has its bits of a
 * launch of its own. Why: Q4_K_M's layers with a Q6_K V product ran it as a second launch after the Q4_K Q/K
 * one, a dependent kernel boundary (release, first loads, its own tail) on every such layer's critical path. */
template <int TA, int TBT, int ST, int XM>
__global__ void __launch_bounds__(256)
    qtc_pair_kernel(const uint8_t *__restrict__ wa, int na, int ra, float *ya, const uint8_t *__restrict__ wb, int nb,
                    int rb, float *yb, int gya, int units, int kn, int m, const uint16_t *__restrict__ x, int ldx,
                    int ldy, int pre, int xsn) {
    if ((int)blockIdx.y < gya)
        qtc_body<TA, 1, ST, XM>(wa, units, kn, ra, na, m, x, ldx, ya, ldy, nullptr, nullptr, 0, pre, (int)blockIdx.y,
                                gya, xsn);
    else
        qtc_body<TBT, 1, ST, XM>(wb, units, kn, rb, nb, m, x, ldx, yb, ldy, nullptr, nullptr, 0, pre,
                                 (int)blockIdx.y - gya, (int)gridDim.y - gya, xsn);
}

/* ------------------------------------------------------------------------------------------------------
 * the wide kernel (m > 8): a CTA of QB_WARPS warps owns QB_WARPS row tiles (128 rows), 64 batch columns (8
 * fragments) and one of the ks splits (blockIdx.z); the tile blocks of its 8 tiles and the 64 x 256 x slice of
 * each unit go through a 3-stage cp.async pipeline in shared memory, so each B fragment read from shared memory
 * serves 8 warps and each A fragment 8 mma. A warp chains its split's units from zero exactly as a narrow warp
 * does; with ks > 1 the partial goes to the workspace and qtc_merge_kernel sums the splits as ((p0 + p1) + p2)
 * + ... then + y_in, the operations and order of the narrow kernel's warp 0, so an element's bits do not depend
 * on which kernel computed it. Columns go in launches of at most QB_CHUNK (bounding the workspace). */
/* the mma.sync wide kernel's prologue, the first D units into stages 0 .. D - 1 (issue(u, stage, what): what 1 the
 * tile blocks, 2 the x slice): the weight tiles stream in while the kernel before finishes (cuda/pdl.cuh); x and
 * everything else only after pdl_wait. Commit groups, at D = 2: {w0, w1, x0}, {x1}: stage i's weights and x are
 * both complete once group i is, which is all the main loops' waits assume */
template <int D, typename F> static __device__ __forceinline__ void wide_prologue(F &issue, int n_units)
{
    pdl_trigger();
#pragma unroll
    for (int i = 0; i < D; i++)
        if (i < n_units) issue(i, i, 1);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < D; i++) {
        if (i < n_units) issue(i, i, 2);
        cp_async_commit();
    }
}

template <int TY> __host__ __device__ constexpr int qb_stage_bytes() { return QB_WARPS * qt_traits<TY>::TB + QB_XBYTES; }

/* byte offset of 16-byte chunk c (0..31) of column r in a stage's x slice [64][256] halves: chunks XOR-swizzled so
 * that a quarter-warp's reads (t = 0..3 x two columns) hit 8 distinct bank groups */
static __device__ __forceinline__ int qb_xoff(int r, int c) { return r * 512 + 16 * (c ^ ((c >> 3) & 3) ^ ((r & 1) << 2)); }

template <int TY>
__global__ void __launch_bounds__(QB_WARPS * 32, 1)
qtc_wide_kernel(const uint8_t *__restrict__ w, int units, int ks, int r, int tiles, int n_out, int m,
                const uint16_t *__restrict__ x, int ldx, float *y, int ldy, const float *y_in, float *part)
{
    constexpr int TB = qt_traits<TY>::TB, SB = qb_stage_bytes<TY>();
    extern __shared__ __align__(16) uint8_t s_mem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int tile0 = blockIdx.y * QB_WARPS, col0 = blockIdx.x * QB_COLS;
    const int n_tiles = tiles - tile0 < QB_WARPS ? tiles - tile0 : QB_WARPS;
    const int kz = blockIdx.z, ub = (int)((long)units * kz / ks), n_units = (int)((long)units * (kz + 1) / ks) - ub;
    /* the block's copy of unit u into stage st: n_tiles tile blocks (contiguous per tile; what & 1), then the x
     * slice (what & 2) */
    auto issue = [&](int u, int st, int what) {
        uint8_t *sp = s_mem + (size_t)st * SB;
        if (what & 1)
            for (int c = threadIdx.x; c < QB_WARPS * (TB / 16); c += QB_WARPS * 32) {
                const int k = c / (TB / 16), o = c % (TB / 16);
                if (k < n_tiles)
                    cp_async16_zfill(sp + k * TB + 16 * o, w + ((size_t)(tile0 + k) * units + ub + u) * TB + 16 * o,
                                     true);
            }
        uint8_t *xs = sp + QB_WARPS * TB;
        if (what & 2)
            for (int c = threadIdx.x; c < QB_COLS * 32; c += QB_WARPS * 32) {
                const int r = c >> 5, ch = c & 31, col = col0 + r;
                const bool ok = col < m;
                cp_async16_zfill(xs + qb_xoff(r, ch), ok ? x + (size_t)col * ldx + (size_t)(ub + u) * 256 + 8 * ch : x,
                                 ok);
            }
    };
    wide_prologue<QB_STAGES - 1>(issue, n_units);
    /* cur: the running sub-split (the narrow kernel's warp ranges: r of them per split, boundaries
     * units * (kz r + i) / (ks r) - ub), chained from zero; tot: the closed sub-splits summed in order */
    float cur[8][4], tot[8][4] = {};
#pragma unroll
    for (int f = 0; f < 8; f++)
#pragma unroll
        for (int e = 0; e < 4; e++) cur[f][e] = 0.f;
    const bool active = warp < n_tiles;
    const long kn = (long)ks * r;
    int sub = 1, next = r > 1 ? (int)((long)units * (kz * r + 1) / kn) - ub : n_units;
    for (int u = 0; u < n_units; u++) {
        if (u == next) {   /* block-uniform: a sub-split ends */
#pragma unroll
            for (int f = 0; f < 8; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[f][e] = sub == 1 ? cur[f][e] : tot[f][e] + cur[f][e];
                    cur[f][e] = 0.f;
                }
            sub++;
            next = sub < r ? (int)((long)units * (kz * r + sub) / kn) - ub : n_units;
        }
        cp_async_wait<QB_STAGES - 2>();
        __syncthreads();   /* unit u landed for every thread; every warp is done with unit u - 1's stage */
        if (u + QB_STAGES - 1 < n_units) issue(u + QB_STAGES - 1, (u + QB_STAGES - 1) % QB_STAGES, 3);
        cp_async_commit();
        const uint8_t *sp = s_mem + (size_t)(u % QB_STAGES) * SB;
        if (active) {
            unit_regs<TY> R;
            R.load(sp + warp * TB, lane);
            const uint8_t *xs = sp + QB_WARPS * TB;
#pragma unroll
            for (int p = 0; p < 8; p++) {
                uint4 xv[8];
#pragma unroll
                for (int f = 0; f < 8; f++) xv[f] = *(const uint4 *)(xs + qb_xoff(8 * f + g, 8 * t + p));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t A[4];
                    R.frag(2 * p + h, A);
#pragma unroll
                    for (int f = 0; f < 8; f++)
                        mma_f16(cur[f], A, h ? xv[f].z : xv[f].x, h ? xv[f].w : xv[f].y);
                }
            }
        }
    }
    cp_async_wait<0>();
    if (!active) return;
    if (r > 1) {
#pragma unroll
        for (int f = 0; f < 8; f++)
#pragma unroll
            for (int e = 0; e < 4; e++) cur[f][e] = tot[f][e] + cur[f][e];
    }
    const int tile = tile0 + warp;
#pragma unroll
    for (int f = 0; f < 8; f++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int o = tile * 16 + g + 8 * (e >> 1), c = col0 + 8 * f + 2 * t + (e & 1);
            if (o < n_out && c < m) {
                if (ks > 1) {
                    part[((size_t)kz * m + c) * n_out + o] = cur[f][e];
                } else {
                    const size_t idx = (size_t)c * ldy + o;
                    y[idx] = y_in ? cur[f][e] + y_in[idx] : cur[f][e];
                }
            }
        }
}

/* ------------------------------------------------------------------------------------------------------
 * the wgmma wide kernel (sm_90a; m > 8 by default there): the wide kernel's work split (a CTA on 8 row tiles and NX
 * batch columns, one of the ks splits per blockIdx.z, its r sub-splits chained from zero one after another, the
 * same workspace and merge; or, where those splits would run in more than one wave, even ranges of sub-splits over
 * one wave: qw_plan), with the k16 steps run by wgmma.mma_async: the two warpgroups each multiply 64 rows (A:
 * the dequantized fragments, in registers, in exactly the mma.sync layout the narrow kernel feeds) by the NX x 16
 * slice of x, which wgmma reads from shared memory. wgmma chains give mma.sync's bits (cuda/wgmma.cuh; gpu_test_qtc
 * compares the forms bit for bit), so every element is the same sequence of operations as in the other kernels.
 *
 * x in slot order. Step s of lane t takes unit elements 64 t + 4 s + j (j < 4) in k slots 2t + (j & 1) +
 * 8 (j >> 1), so wgmma needs each unit's 256 elements at positions 16 s + slot: 4-byte word w = 32 t + 2 s + h of
 * a unit goes to position word 8 s + 4 h + t, i.e. position chunk c (words 4c .. 4c + 3) of a unit holds words c,
 * 32 + c, 64 + c, 96 + c. That gathers 4-byte words, which a CTA would redo for every row block, so
 * qtc_ximage_kernel writes the launch's x once to the workspace as the images a stage holds: for each block of NX
 * columns and each unit, 4 k tiles x NX columns x 128 bytes in the 128-byte swizzle of cuda/wgmma.cuh (chunk c of
 * column n at k tile c / 8, chunk (c % 8) ^ (n % 8)), zeros for columns past m. A stage's x is then one bulk copy.
 *
 * Warp specialization. A CTA is 8 consumer warps (one row tile each) and a producer warpgroup, whose first thread
 * streams units into an S-slot ring of stages [x image (XB bytes) | the 8 tile blocks], 1024-byte aligned, its barriers
 * after the ring: for each unit it waits on the slot's empty barrier, arms its full barrier with the stage's byte count
 * and issues the bulk copies (the tile blocks before pdl_wait, written once at load; x after). A consumer warp waits on
 * the full barrier, dequantizes its tile block's fragments and issues the unit's wgmma in commit groups of QW_G k16
 * steps; once every wgmma of unit u - 1 has retired (the wait before its second group: at most the newest group
 * pending), lane 0 arrives on that stage's empty barrier. No CTA-wide barrier runs in the loop, so the warpgroups drift
 * apart and one dequantizes while the other's wgmma run. Tiles past the last have no copies: their warps multiply zeros
 * (their slots are zeroed once; with qw_plan's ranges, what the slots hold) into rows nobody stores. */

/* xi: for each block b of NX columns (of the launch's m) and unit u, the stage image of x (XB = 4 NX 128 bytes) at
 * (b units + u) XB: the copy the wgmma kernel reads */
template <int NX>
__global__ void qtc_ximage_kernel(const uint16_t *__restrict__ x, int ldx, int m, int units, uint8_t *__restrict__ xi) {
    pdl_trigger();
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int nb = (m + NX - 1) / NX;
    const size_t n = (size_t)nb * units * 32 * NX; /* 16-byte chunks of the images */
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += (size_t)gridDim.x * blockDim.x) {
        /* q = ((b units + u) 4 + kt) NX 8 + n 8 + c8: consecutive threads write one column's 128 bytes */
        const int c8 = (int)(q & 7), col = (int)((q >> 3) % NX);
        const size_t bu = q / (32 * NX); /* b units + u */
        const int kt = (int)((q / (8 * NX)) & 3), u = (int)(bu % units), c = 8 * kt + c8;
        const size_t gcol = (bu / units) * NX + col;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (gcol < (size_t)m) {
            const uint32_t *src = (const uint32_t *)(x + gcol * ldx + (size_t)u * 256) + c;
            v.x = src[0];
            v.y = src[32];
            v.z = src[64];
            v.w = src[96];
        }
        *(uint4 *)(xi + (bu * 4 + kt) * (NX * 128) + col * 128 + ((c8 ^ (col & 7)) << 4)) = v;
    }
}

template <int NX> __host__ __device__ constexpr int qw_xbytes() { return 4 * NX * 128; }
template <int TY, int NX> __host__ __device__ constexpr int qw_stage_bytes()
{
    return (qw_xbytes<NX>() + QB_WARPS * qt_traits<TY>::TB + 1023) / 1024 * 1024;
}
/* a stage and its two barriers (full, empty: 8 bytes each), after the ring */
template <int TY, int NX> __host__ __device__ constexpr int qw_slot_bytes() { return qw_stage_bytes<TY, NX>() + 16; }
/* 4 stages where they fit in 227 KiB, else 3, else 2 (128 columns: x alone is 64 KiB) */
template <int TY, int NX> __host__ __device__ constexpr int qw_stages()
{
    return 4 * qw_slot_bytes<TY, NX>() <= 227 * 1024 ? 4 : 3 * qw_slot_bytes<TY, NX>() <= 227 * 1024 ? 3 : 2;
}
template <int TY, int NX> __host__ __device__ constexpr int qw_smem_bytes() {
    return qw_stages<TY, NX>() * qw_slot_bytes<TY, NX>();
}
#if ZWG_ON
/* k16 steps per wgmma commit group, of 1, 2, 4, 8, 16 (H200, the 8B layer products at M = 64, 256 and 2048: 1, 2, 4
 * and 8 within 4% of each other, 4 the fastest or within 1% of it; 16 not measured in this kernel) */
constexpr int QW_G = 4;
#endif

/* The work of one CTA of the wgmma kernel. A column block's work is its row groups (8 tiles) x ks splits x r
 * sub-splits, in the order t = (group ks + kz) r + j; CTA b of the block's nb takes the sub-splits [T b / nb,
 * T (b + 1) / nb) of its T. With one split a CTA (nb = groups ks: the grid (column blocks, groups, ks)) that is the
 * split alone. With fewer CTAs than splits (nb: the SMs' share of the column block; every CTA at least r
 * sub-splits, so that no range falls inside one split) a range can cut a split in two. Its sum keeps
 * its order across the cut: the CTA holding the split's first sub-splits runs them first and publishes their sum
 * (QW_PUB: per warp, to the workspace, then its flag); the CTA holding the rest runs them last, from that sum
 * (QW_SUF). The splits between run whole (QW_ALL). A segment: split s, sub-splits [ja, jb). The wait does not depend
 * on the grid fitting the GPU at once: a CTA waits only on the CTA before it in launch order (blocks are dispatched
 * in that order), which publishes first, before it could wait on anything itself. */
enum { QW_ALL = 0, QW_PUB = 1, QW_SUF = 2 };
template <bool EVEN> struct qw_plan {
    int s0, j0, s1, je, r;
    /* EVEN: the range [t0, t1) of sub-splits; else split t0 whole (t1 unused) */
    __device__ __forceinline__ qw_plan(long t0, long t1, int r_) : r(r_) {
        if (EVEN) {
            s0 = (int)(t0 / r);
            j0 = (int)(t0 % r);
            s1 = (int)((t1 - 1) / r);
            je = (int)((t1 - 1) % r) + 1;
        } else {
            s0 = s1 = (int)t0;
            j0 = 0;
            je = r;
        }
    }
    __device__ __forceinline__ int count() const {
        return EVEN ? (je < r) + (s1 + (je == r)) - (s0 + (j0 > 0)) + (j0 > 0) : 1;
    }
    /* segment i in run order: its split, sub-split range and kind */
    __device__ __forceinline__ int seg(int i, int &s, int &ja, int &jb) const {
        if (!EVEN) {
            s = s0, ja = 0, jb = r;
            return QW_ALL;
        }
        if (je < r) {
            if (i == 0) {
                s = s1, ja = 0, jb = je;
                return QW_PUB;
            }
            i--;
        }
        const int f0 = s0 + (j0 > 0), nf = s1 + (je == r) - f0;
        if (i < nf) {
            s = f0 + i, ja = 0, jb = r;
            return QW_ALL;
        }
        s = s0, ja = j0, jb = r;
        return QW_SUF;
    }
    /* the units of segment i's split kz, sub-splits [ja, jb): [units (kz r + ja) / kn, units (kz r + jb) / kn) */
    __device__ __forceinline__ static int unit_at(int units, int kz, int j, int kn, int r) {
        return (int)((unsigned)(units * (kz * r + j)) / (unsigned)kn);
    }
};

#if ZWG_ON
/* the producer of the wgmma kernel (its CTA's first thread): the plan's units, each the tile blocks of its group's
 * tiles (the group's last tile below `tiles`) and the column block's x image of the unit, into the S-slot ring (slot
 * st at ring + st SB: x image (XB bytes), then the tile blocks); full barrier of slot st at bars + 8 st, empty barrier
 * at bars + 8 (S + st). xs: the column block's images (unit u at xs + u XB) */
template <int TB, int SB, int S, int XB, bool EVEN>
static __device__ __forceinline__ void s_wg_produce(const uint8_t *w, const uint8_t *xs, int units, int ks,
                                                    const qw_plan<EVEN> &P, int tiles, uint32_t ring, uint32_t bars) {
    const int kn = ks * P.r;
    if constexpr (!EVEN) { /* one split: its units [ub, ue) of one group, in order */
        const int grp = P.s0 / ks, kz = P.s0 % ks, tile0 = grp * QB_WARPS;
        const int nt = tiles - tile0 < QB_WARPS ? tiles - tile0 : QB_WARPS;
        const int ub = qw_plan<EVEN>::unit_at(units, kz, 0, kn, P.r),
                  n_units = qw_plan<EVEN>::unit_at(units, kz, P.r, kn, P.r) - ub;
        const uint8_t *wsrc = w + ((size_t)tile0 * units + ub) * TB; /* tile block (tile0 + k, ub + u) */
        const uint8_t *xsrc = xs + (size_t)ub * XB;
        const uint32_t bytes = XB + nt * TB;
        auto load_w = [&](int u, int st) {
            for (int k = 0; k < nt; k++)
                bulk_copy(ring + st * SB + XB + k * TB, wsrc + ((size_t)k * units + u) * TB, TB, bars + 8 * st);
        };
        const int pre = S < n_units ? S : n_units;
        for (int st = 0; st < pre; st++) {
            mbar_expect_tx(bars + 8 * st, bytes);
            load_w(st, st);
        }
        pdl_wait(); /* x: written by qtc_ximage_kernel, the kernel before */
        for (int st = 0; st < pre; st++) bulk_copy(ring + st * SB, xsrc + (size_t)st * XB, XB, bars + 8 * st);
        for (int u = S, st = 0, ph = 0; u < n_units; u++) {
            mbar_wait(bars + 8 * (S + st), ph); /* unit u - S retired */
            mbar_expect_tx(bars + 8 * st, bytes);
            load_w(u, st);
            bulk_copy(ring + st * SB, xsrc + (size_t)u * XB, XB, bars + 8 * st);
            if (++st == S) {
                st = 0;
                ph ^= 1;
            }
        }
        return;
    }
    const int ns = P.count();
    /* segment i: its group's first tile block at unit 0 (tile block (tile0 + k, u) at wt + (k units + u) TB), its
     * tiles and its units [ua, ue) */
    const uint8_t *wt;
    int nt, ua, ue;
    auto segment = [&](int i) {
        int sp, ja, jb;
        P.seg(i, sp, ja, jb);
        const int kz = sp % ks, tile0 = sp / ks * QB_WARPS;
        nt = tiles - tile0 < QB_WARPS ? tiles - tile0 : QB_WARPS;
        wt = w + (size_t)tile0 * units * TB;
        ua = qw_plan<EVEN>::unit_at(units, kz, ja, kn, P.r);
        ue = qw_plan<EVEN>::unit_at(units, kz, jb, kn, P.r);
    };
    /* unit u into slot st: the stage's byte count, then its tile blocks */
    auto load_w = [&](int u, int st) {
        mbar_expect_tx(bars + 8 * st, XB + nt * TB);
        const uint8_t *src = wt + (size_t)u * TB;
        for (int k = 0; k < nt; k++, src += (size_t)units * TB)
            bulk_copy(ring + st * SB + XB + k * TB, src, TB, bars + 8 * st);
    };
    /* the first S units: their weights before pdl_wait (written once at load), their x after it */
    int n = 0;
    for (int i = 0; i < ns && n < S; i++) {
        segment(i);
        for (int u = ua; u < ue && n < S; u++, n++) load_w(u, n);
    }
    pdl_wait(); /* x: written by qtc_ximage_kernel, the kernel before */
    n = 0;
    for (int i = 0; i < ns && n < S; i++) {
        segment(i);
        for (int u = ua; u < ue && n < S; u++, n++) bulk_copy(ring + n * SB, xs + (size_t)u * XB, XB, bars + 8 * n);
    }
    /* the rest, each once the unit S before it has retired */
    int skip = S, st = 0;
    uint32_t ph = 0;
    for (int i = 0; i < ns; i++) {
        segment(i);
        const int k = ue - ua < skip ? ue - ua : skip;
        skip -= k;
        for (int u = ua + k; u < ue; u++) {
            mbar_wait(bars + 8 * (S + st), ph); /* unit n - S retired */
            load_w(u, st);
            bulk_copy(ring + st * SB, xs + (size_t)u * XB, XB, bars + 8 * st);
            if (++st == S) {
                st = 0;
                ph ^= 1;
            }
        }
    }
}
/* a hand-over flag: set with release once the warp's published sum is written; waited on with acquire */
static __device__ __forceinline__ void qw_flag_set(unsigned *f) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(f), "r"(1u) : "memory");
}
static __device__ __forceinline__ void qw_flag_wait(const unsigned *f) {
    unsigned v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(f) : "memory"); } while (!v);
}
#endif

template <int TY, int NX, bool EVEN>
__global__ void __launch_bounds__(QB_WARPS * 32 + 128, 1)
    qtc_wg_kernel(const uint8_t *__restrict__ w, int units, int ks, int r, int tiles, int n_out, int m,
                  const uint8_t *__restrict__ xi, float *y, int ldy, const float *y_in, float *part, float *fix,
                  unsigned *flags) {
#if ZWG_ON
    constexpr int TB = qt_traits<TY>::TB, SB = qw_stage_bytes<TY, NX>(), S = qw_stages<TY, NX>(),
                  XB = qw_xbytes<NX>(), NA = NX / 2;
    extern __shared__ __align__(1024) uint8_t qw_smem[];
    /* warpgroup 0 produces (its first thread), warps 4 .. 11 multiply: warp = their row tile in a group */
    const int warp = warp_index() - 4, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int col0 = blockIdx.x * NX, groups = (tiles + QB_WARPS - 1) / QB_WARPS;
    /* this CTA's range of the column block's sub-splits (qw_plan) */
    const long nb = (long)gridDim.y * gridDim.z, b = (long)blockIdx.y * gridDim.z + blockIdx.z;
    const long T = (long)groups * ks * r;
    const qw_plan<EVEN> P(EVEN ? T * b / nb : b, EVEN ? T * (b + 1) / nb : b + 1, r);
    /* the warps that multiply: with one split a CTA, those of its group's tiles (the last group's may be fewer);
     * with the plan's ranges all of them, whatever the group (a warp past the last tile multiplies what its slots
     * hold into rows nobody stores) */
    const int tile_f = P.s0 / ks * QB_WARPS;
    const int n_tiles = EVEN || tiles - tile_f >= QB_WARPS ? QB_WARPS : tiles - tile_f;
    const uint32_t ring = smem_u32(qw_smem), bars = ring + S * SB;
    const int n_wg = (n_tiles + 3) / 4; /* warpgroups with a tile: only they multiply (and release stages) */
    if (threadIdx.x == 0) {
        for (int st = 0; st < S; st++) {
            mbar_init(bars + 8 * st, 1);              /* the producer's expect_tx; the copies complete it */
            mbar_init(bars + 8 * (S + st), 4 * n_wg); /* lane 0 of every multiplying warp */
        }
    }
    __syncthreads();
    pdl_trigger();
    if (warp < 0) { /* the producer warpgroup: its registers go to the multiplying ones */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0)
            s_wg_produce<TB, SB, S, XB, EVEN>(w, xi + (size_t)blockIdx.x * units * XB, units, ks, P, tiles, ring, bars);
        return;
    }
    /* 232 a thread: the accumulators, the sub-split sums and two buffers of A fragments (4 x 40 + 8 x 232 x 4
     * warps' registers fit the SM's 64 Ki) */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    pdl_wait();                             /* y, y_in and the flags only after the previous kernel */
    if (4 * (warp >> 2) >= n_tiles) return; /* a warpgroup without a tile (warpgroup-uniform) */
    if (warp >= n_tiles) {                  /* no copies reach this warp's slots: zeros, multiplied into no row */
        for (int st = 0; st < S; st++)
            for (int i = lane; i < TB / 16; i += 32)
                *(uint4 *)(qw_smem + st * SB + XB + warp * TB + 16 * i) = make_uint4(0, 0, 0, 0);
        __syncwarp();
    }
    float cur[NA], tot[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) cur[i] = tot[i] = 0.f;
    const int kn = ks * r;
    /* A fragments of G k16 steps per commit group; two buffers below 16 steps a group (the dequantization of
     * a group overlaps the wgmma of the one before), one at 16 */
    constexpr int NB = QW_G < 16 ? 2 : 1;
    /* the group whose wait leaves no wgmma of the unit before pending: its stage is released there */
    constexpr int QREL = NB == 2 ? 1 : 0;
    uint32_t A[NB][QW_G][4];
    /* the B descriptors as offsets of one base: a tile's k16 step s of stage st starts (st SB + (s / 4) NX 128
     * + 32 (s % 4)) >> 4 above the base in the start-address field (every address is under 2^18 bytes, so
     * the sum never carries out of it) */
    const uint32_t d0 = (uint32_t)zwg::desc(qw_smem);
    /* this warp's hand-over slot (published sums: NA floats a lane, lane-minor) as the publisher, and the slot of
     * the CTA before as the one that continues its sum */
    const long slot = ((long)blockIdx.x * nb + b) * QB_WARPS + warp;
    int cst = 0, pst = S - 1; /* the slots of this unit and of the unit before */
    uint32_t ph = 0;          /* the full barrier's phase parity of this unit */
    bool rel = false;         /* a unit before this one: its stage is released in this one */
    for (int si = 0, ns = P.count(); si < ns; si++) {
        int sp_, ja, jb;
        const int kind = P.seg(si, sp_, ja, jb);
        const int grp = sp_ / ks, kz = sp_ % ks;
        const int ue = qw_plan<EVEN>::unit_at(units, kz, jb, kn, r);
        int j = ja, next = qw_plan<EVEN>::unit_at(units, kz, j + 1, kn, r);
        bool have = false;    /* tot holds the sum of the split's sub-splits before the current one */
        if (kind == QW_SUF) { /* the split's first sub-splits: the CTA before published their sum */
            const long from = slot - QB_WARPS;
            if (lane == 0) {
                qw_flag_wait(flags + from);
                flags[from] = 0; /* this launch's only wait on it: left zero for the next launch */
            }
            __syncwarp();
#pragma unroll
            for (int i = 0; i < NA; i++) tot[i] = __ldcg(fix + (from * NA + i) * 32 + lane);
            have = true;
        }
        for (int u = qw_plan<EVEN>::unit_at(units, kz, ja, kn, r); u < ue; u++) {
            if (u == next) { /* warpgroup-uniform: a sub-split ends; its wgmma must have landed in cur */
                zwg::wait<0>();
#pragma unroll
                for (int i = 0; i < NA; i++) {
                    zwg::reg_fence(cur[i]);
                    tot[i] = have ? tot[i] + cur[i] : cur[i];
                    cur[i] = 0.f;
                }
                have = true;
                j++;
                next = qw_plan<EVEN>::unit_at(units, kz, j + 1, kn, r);
            }
            mbar_wait(bars + 8 * cst, ph); /* the unit landed */
            const uint8_t *sp = qw_smem + (size_t)cst * SB;
            const uint32_t du = d0 + (uint32_t)((cst * SB) >> 4);
            unit_regs<TY> R;
            R.load(sp + XB + warp * TB, lane);
#pragma unroll
            for (int q = 0; q < 16 / QW_G; q++) {
                uint32_t(&Ab)[QW_G][4] = A[NB == 2 ? (q & 1) : 0];
                /* the group that last read Ab (two groups back; one back with a single buffer) is complete */
                if (NB == 2) zwg::wait<1>();
                else zwg::wait<0>();
                if (q == QREL && rel && lane == 0) mbar_arrive(bars + 8 * (S + pst)); /* the unit before retired */
#pragma unroll
                for (int jj = 0; jj < QW_G; jj++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) zwg::reg_keep(Ab[jj][i]);
                    R.frag(q * QW_G + jj, Ab[jj]);
                }
                zwg::fence(); /* Ab and cur written before the wgmma read them */
#pragma unroll
                for (int jj = 0; jj < QW_G; jj++) {
                    const int s = q * QW_G + jj;
                    zwg::mma_ra<NX>::run(cur, Ab[jj], zwg::desc_at(du + (((s >> 2) * (NX * 128) + 32 * (s & 3)) >> 4)));
                }
                zwg::commit();
            }
            pst = cst;
            rel = true;
            if (++cst == S) {
                cst = 0;
                ph ^= 1;
            }
        }
        zwg::wait<0>();
#pragma unroll
        for (int i = 0; i < NA; i++) {
            zwg::reg_fence(cur[i]);
            cur[i] = have ? tot[i] + cur[i] : cur[i];
        }
        if (kind == QW_PUB) { /* the split's first sub-splits: their sum to the CTA after */
#pragma unroll
            for (int i = 0; i < NA; i++) __stcg(fix + (slot * NA + i) * 32 + lane, cur[i]);
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                qw_flag_set(flags + slot);
            }
        } else if (warp < n_tiles) {
            const int tile = grp * QB_WARPS + warp;
#pragma unroll
            for (int f = 0; f < NX / 8; f++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int o = tile * 16 + g + 8 * (e >> 1), c = col0 + 8 * f + 2 * t + (e & 1);
                    if (o < n_out && c < m) {
                        const float v = cur[4 * f + e];
                        if (ks > 1) {
                            part[((size_t)kz * m + c) * n_out + o] = v;
                        } else {
                            const size_t idx = (size_t)c * ldy + o;
                            y[idx] = y_in ? v + y_in[idx] : v;
                        }
                    }
                }
        }
#pragma unroll
        for (int i = 0; i < NA; i++) cur[i] = 0.f;
    }
#pragma unroll
    for (int bb = 0; bb < NB; bb++)
#pragma unroll
        for (int jj = 0; jj < QW_G; jj++)
#pragma unroll
            for (int i = 0; i < 4; i++) zwg::reg_keep(A[bb][jj][i]);
#else
    (void)w, (void)units, (void)ks, (void)r, (void)tiles, (void)n_out, (void)m, (void)xi, (void)y, (void)ldy,
        (void)y_in, (void)part, (void)fix, (void)flags;
    __trap();   /* launched only where wtc_wgmma() says sm_90a code runs */
#endif
}

/* y[c][o] = ((p0 + p1) + ... + p_{ks-1}) (+ y_in[c][o]) over the wide kernel's split partials [ks][m][n_out] */
__global__ void qtc_merge_kernel(const float *__restrict__ part, int ks, int n_out, int m, float *y, int ldy,
                                 const float *y_in)
{
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const size_t n = (size_t)m * n_out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < ks; k++) v += part[(size_t)k * n + i];
        const size_t c = i / n_out, o = i % n_out, idx = c * ldy + o;
        y[idx] = y_in ? v + y_in[idx] : v;
    }
}

/* bytes of the wide kernels' split partials [ks][QB_CHUNK][n_out] f32 (0 with one split); the images of x of
 * QB_CHUNK columns (QB_CHUNK n_in halves) follow them in the workspace */
static size_t s_part_bytes(int ks, int n_out) { return ks > 1 ? (size_t)ks * QB_CHUNK * (size_t)n_out * sizeof(float) : 0; }

/* The wgmma kernel's CTAs per column block where fewer CTAs than splits serve better (qw_plan), else 0 (one CTA a
 * split: the grid (column blocks, groups, ks)). With one CTA a split, more splits than the SMs hold at once run in
 * waves, the last one part empty (the 8B gate/up product, 224 splits of 16 units at up to 64 columns: two waves on
 * 132 SMs); the plan spreads the sub-splits evenly over one wave instead. Taken where every CTA gets at least r
 * sub-splits, the hand-over slots fit s_fix_bytes and qtc_flags_bytes, and the plan's longest CTA runs fewer
 * units than the waves' longest (the caller takes it only where the launch has its flags). cu_settings.qtc_grid
 * (> 0) takes it with that many CTAs a column block wherever it can run, for the checks (the same bits: a split's
 * sum keeps its order across a cut). */
static int s_wg_nb(int tiles, int units, int ks, int r, int cb, int nx) {
    const int sms = cu_sm_count(0), cap = cu_settings_get()->qtc_grid, kn = ks * r;
    const long splits = (long)((tiles + QB_WARPS - 1) / QB_WARPS) * ks, T = splits * r;
    const long nb = cap > 0 ? cap : sms / cb;
    if (nb < 1 || nb >= splits || T / nb < r) return 0;
    if ((long)cb * nb * QB_WARPS > (long)sms * QB_WARPS * (128 / nx)) return 0; /* hand-over slots */
    if (cap <= 0) {
        const long waves = (splits * cb + sms - 1) / sms, one = waves * ((units + ks - 1) / ks);
        const long even = (T + nb - 1) / nb * ((units + kn - 1) / kn);
        if (even >= one) return 0;
    }
    return (int)nb;
}

/* NX 0: the mma.sync wide kernel (64 columns a CTA); 32, 64 or 128: the wgmma one with NX columns a CTA, after
 * qtc_ximage_kernel has written the chunk's x as stage images to the workspace */
template <int TY, int NX>
static cudaError_t s_launch_wide(const qtc_params *p, int ks, int r, int ldx, int ldy, cudaStream_t st)
{
    constexpr int SMEM = NX ? qw_smem_bytes<TY, NX>() : QB_STAGES * qb_stage_bytes<TY>();
    constexpr int COLS = NX ? NX : QB_COLS, NW = NX ? NX : 64; /* NW: the wgmma kernel's columns (unused at NX 0) */
    static_assert(SMEM <= 227 * 1024, "the wide kernel's stages must fit one SM's shared memory");
    static std::atomic<unsigned long long> s_set{0};
    {
        static std::atomic<unsigned long long> s_set_even{0};
        cudaError_t e = NX ? cu_smem_optin(qtc_wg_kernel<TY, NW, false>, SMEM, s_set)
                           : cu_smem_optin(qtc_wide_kernel<TY>, SMEM, s_set);
        if (e == cudaSuccess && NX) e = cu_smem_optin(qtc_wg_kernel<TY, NW, true>, SMEM, s_set_even);
        if (e != cudaSuccess) return e;
    }
    const int tiles = (p->n_out + 15) / 16, units = p->n_in / 256;
    if ((ks > 1 || NX) && (!p->workspace || p->workspace_bytes < qtc_workspace_bytes(p->type, p->n_in, p->n_out) ||
                           ((uintptr_t)p->workspace & 15)))
        return cudaErrorInvalidValue;
    float *part = (float *)p->workspace;
    uint8_t *xi = NX ? (uint8_t *)p->workspace + s_part_bytes(ks, p->n_out) : nullptr;
    /* the hand-over sums (s_fix_bytes), after the 16-bit form's copies; their flags are the launch's own */
    float *fix = NX ? (float *)(xi + (size_t)QB_CHUNK * p->n_in * 2 + s_f16_bytes(p->n_in, p->n_out)) : nullptr;
    if (p->x_image && NX != qtc_ximage_nx(p)) return cudaErrorInvalidValue;
    for (int c0 = 0; c0 < p->m; c0 += QB_CHUNK) {
        const int mc = p->m - c0 < QB_CHUNK ? p->m - c0 : QB_CHUNK;
        const float *yin = p->y_in ? p->y_in + (size_t)c0 * ldy : nullptr;
        const uint16_t *xc = p->x + (size_t)c0 * ldx;
        float *yc = p->y + (size_t)c0 * ldy;
        const int cb = (mc + COLS - 1) / COLS, nb = NX && p->flags ? s_wg_nb(tiles, units, ks, r, cb, NX) : 0;
        const dim3 grid((unsigned)cb, nb ? (unsigned)nb : (unsigned)((tiles + QB_WARPS - 1) / QB_WARPS),
                        nb ? 1u : (unsigned)ks);
        cudaError_t e = cudaSuccess;
        if (NX) {
            /* x_image: the chunk's images in the caller's (its first column block at c0 / COLS); otherwise
             * qtc_ximage_kernel writes them into the workspace, in 16-byte chunks of NX-column blocks (within
             * QB_CHUNK columns, the workspace's room) */
            const uint8_t *xs = xi;
            if (p->x_image) {
                xs = (const uint8_t *)p->x + (size_t)(c0 / COLS) * units * qw_xbytes<COLS>();
            } else {
                const size_t n = (size_t)grid.x * COLS * units * 32;
                const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
                e = cu_launch(qtc_ximage_kernel<COLS>, dim3(blocks), dim3(256), 0, st, xc, ldx, mc, units, xi);
            }
            if (e == cudaSuccess)
                e = cu_launch(nb ? qtc_wg_kernel<TY, NW, true> : qtc_wg_kernel<TY, NW, false>, grid,
                              dim3(QB_WARPS * 32 + 128), SMEM, st, (const uint8_t *)p->w, units, ks, r, tiles, p->n_out,
                              mc, xs, yc, ldy, yin, part, fix, p->flags);
        } else {
            e = cu_launch(qtc_wide_kernel<TY>, grid, dim3(QB_WARPS * 32), SMEM, st, (const uint8_t *)p->w, units, ks,
                          r, tiles, p->n_out, mc, xc, ldx, yc, ldy, yin, part);
        }
        if (e == cudaSuccess && ks > 1 && !p->part_only) {
            const size_t n = (size_t)mc * p->n_out;
            const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
            e = cu_launch(qtc_merge_kernel, dim3(blocks), dim3(256), 0, st, (const float *)part, ks, p->n_out, mc, yc,
                          ldy, yin);
        }
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* the narrow kernel's grid height (CTAs over tiles): per (the CTAs one SM holds for this block size and shared
 * memory) x the SMs (one wave of persistent CTAs), at most the tiles; cu_settings.qtc_grid (> 0) caps it further,
 * for checks that want every CTA to take several tiles. Neither changes a bit: a tile's arithmetic does not depend
 * on which CTA takes it. */
static int s_grid_y(int per, int tiles, int groups)
{
    const int s_cap = cu_settings_get()->qtc_grid;
    int gy = tiles;
    if (per > 0) {
        const long fit = (long)per * cu_sm_count(0) / groups;
        if (fit >= 1 && fit < gy) gy = (int)fit;
    }
    if (s_cap > 0 && s_cap < gy) gy = s_cap;
    return gy;
}

/* The narrow launches mark their matrix's window as streaming in L2 (an access policy window, hit and miss
 * property cudaAccessPropertyStreaming: evict first), so that the weight stream, read once a step, does not push
 * out what the step's other kernels reuse (activations, the code, decode attention's keys prefetched into L2).
 * Moves no arithmetic. H100, 8B M=1 Q4_K_M 2.490 / 2.502 against 2.515 / 2.512 ms,
 * Q8_0 about 0.7% faster than without. */

/* CTAs an SM holds for kernel K at this block size and shared memory, asked once per (block size, shared memory)
 * and kernel (a small table of its own per kernel, since two kernels can ask the same bytes; a launch whose entry
 * was displaced asks again) */
template <auto K> static int s_occupancy(int threads, size_t smem) {
    static std::atomic<unsigned long long> s_tab[16]; /* (smem << 16 | threads) << 8 | per; 0 empty */
    const unsigned long long key = ((unsigned long long)smem << 16 | (unsigned)threads);
    std::atomic<unsigned long long> &e = s_tab[(key * 0x9E3779B97F4A7C15ull) >> 60];
    const unsigned long long v = e.load(std::memory_order_relaxed);
    if (v && (v >> 8) == key) return (int)(v & 255);
    int per = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, K, threads, smem) != cudaSuccess || per <= 0) return 0;
    if (per > 255) per = 255;
    e.store(key << 8 | (unsigned)per, std::memory_order_relaxed);
    return per;
}

/* XM (qtc_body): where x comes from. Every form gives the same bits: only where x is read from differs. */
template <int TY, int NF, int ST, int XM>
static cudaError_t s_launch_st(const qtc_params *p, int kn, int r, int ldx, int ldy, cudaStream_t st) {
    constexpr int TB = qt_traits<TY>::TB, SB = TB + (XM == XM_RING ? 4096 : 0);
    const int units = p->n_in / 256;
    constexpr auto K = qtc_narrow_fn<TY, NF, ST, XM>::f;
    const size_t xsb = XM == XM_SLICE    ? s_xs_bytes(units, kn)
                       : XM == XM_CSLICE ? s_xc_bytes(units, kn, p->m)
                                         : 0,
                 smem = s_narrow_bytes(SB, ST, kn, NF) + xsb;
    static std::atomic<unsigned long long> s_set{0};
    /* the opt-in covers the largest x of the form: QT_XS_MAX, or QT_XC2_MAX for the two-fragment compact slice */
    const size_t xmax = XM == XM_SLICE || (XM == XM_CSLICE && NF == 1) ? (size_t)QT_XS_MAX
                        : XM == XM_CSLICE                              ? (size_t)QT_XC2_MAX
                                                                       : 0;
    const cudaError_t e = cu_smem_optin(K, s_narrow_bytes(SB, ST, QT_MAX_KS, NF) + xmax, s_set);
    if (e != cudaSuccess) return e;
    const int per = s_occupancy<K>(32 * kn, smem);
    const int tiles = (p->n_out + 15) / 16, groups = (p->m + 8 * NF - 1) / (8 * NF);
    const int gy = s_grid_y(per, tiles, groups);
    const dim3 grid((unsigned)groups, (unsigned)gy), block(32 * kn);
    return cu_launch_win(p->w, qtc_packed_bytes(p->type, p->n_in, p->n_out), cudaAccessPropertyStreaming, K, grid,
                         block, smem, st, (const uint8_t *)p->w, units, kn, r, p->n_out, p->m, p->x, ldx, p->y, ldy,
                         p->y_in, (__half *)p->glu, p->ldg, ST, (units + kn - 1) / kn);
}

/* the narrow kernel with QT_STAGES-deep rings: 2, since more warps per SM beat deeper rings (8B M=1, Q4_K_M and
 * Q8_0: 2 stages faster than 3, 3 faster than 4; the depth never changes a bit) */
template <int TY, int NF>
static cudaError_t s_launch(const qtc_params *p, int kn, int r, int ldx, int ldy, cudaStream_t st)
{
    return s_launch_st<TY, NF, QT_STAGES, XM_LDG>(p, kn, r, ldx, ldy, st);
}

/* 1 when the slice form can serve this launch: m <= QT_NARROW_M and the warps' slices within QT_XS_MAX */
static int s_xs_fits(const qtc_params *p, int kn) {
    return p->m <= QT_NARROW_M && s_xs_bytes(p->n_in / 256, kn) <= (size_t)QT_XS_MAX;
}

/* 1 when the compact slice form can serve this launch: m <= 8 and the warps' slices within QT_XS_MAX, or 9 to 16
 * columns on sm_90 (two fragments) with the slices within QT_XC2_MAX and the CTA within the SM's 227 KiB */
static int s_xc_fits(const qtc_params *p, int kn) {
    const size_t xb = s_xc_bytes(p->n_in / 256, kn, p->m);
    if (p->m <= 8) return xb <= (size_t)QT_XS_MAX;
    /* 226 KiB: the SM's 227 less the 1 KiB the driver reserves per CTA */
    return p->m <= QT_NARROW_M && wtc_wgmma() && xb <= (size_t)QT_XC2_MAX &&
           s_narrow_bytes(qt_tb(qt_ty(p->type)), QT_STAGES, kn, 2) + xb <= (size_t)226 * 1024;
}

/* The narrow kernel's form by default, or -1 where the wide kernel serves m (docs/perf.md has the kernel timings
 * behind each threshold). Reading x from global memory costs each warp instruction 32 cache lines (lane (g, t)
 * reads 16 bytes of the 128-byte run of column g that it owns), so from a few columns on the L1 wavefronts, not the
 * weights, bound it; a staged x is read conflict-free from shared memory. A stage holds 8 columns whatever m (no
 * branch in the loop), which costs shared memory and occupancy, so with one or two columns the global reads are
 * cheaper. Up to 8 columns: the slice from 3 (5 where a CTA has fewer than 4 warps, whose slices are long: the LM
 * head's), the ring (its stages also hold x, refetched for every tile) from 5 for the ranges whose slices do not
 * fit (the 14336 inputs of 8B's down projection), global reads below. From 9 to 16 columns the CTAs of the two
 * 8-column groups run side by side and meet in L2 on the weights, twice the dequantization of one group: the slice
 * beats the wgmma kernel there, the ring and the LM head's slices do not. Q8_0 at one or two columns takes the
 * compact slice where a CTA has 4 warps or more and the matrix 256 tiles or more (the 8B layer's four products):
 * its 8B step at M = 1 and 2 is 2.5-3.3% faster than with the global reads, the gate/up and down products 5-9% at
 * kernel level (docs/perf.md). Q4_K and Q6_K keep the global reads: with the compact slice the 8B Q4_K_M step ran
 * 3% slower at M = 1, and the small Q6_K products and the LM heads slower at kernel level (same section). From 9 to
 * 16 columns every type takes the compact slice with two fragments where it fits (sm_90, x within 128 KiB) and a
 * CTA has 4 warps or more: it dequantizes each tile once instead of twice (Q4_K 14336 x 4096 at 16 rows 18.1
 * against 21.7 us, Q6_K 21.5 against 31.6, Q8_0 18.6 against 27.3; the 8B Q4_K_M step at M = 16 6% faster, Q8_0
 * 6%). */
static int s_xm_default(const qtc_params *p, int kn) {
    const int fits = s_xs_fits(p, kn);
    if (p->type == GGML_Q8_0 && p->m <= 2 && kn >= 4 && (p->n_out + 15) / 16 >= 256 && s_xc_fits(p, kn))
        return XM_CSLICE;
    if (p->m > 8) {
        if (p->m <= QT_NARROW_M && kn >= 4 && s_xc_fits(p, kn)) return XM_CSLICE;
        return p->m <= QT_NARROW_M && fits && kn >= 4 ? XM_SLICE : -1;
    }
    if (fits) return p->m >= (kn >= 4 ? 3 : 5) ? XM_SLICE : XM_LDG;
    return p->m >= 5 ? XM_RING : XM_LDG;
}

template <int TY>
static cudaError_t s_launch_ty(const qtc_params *p, int nf, int ks, int kn, int ldx, int ldy, cudaStream_t st)
{
    /* the narrow kernel runs the kn sub-splits one warp each; the wide one ks splits of r = kn / ks each */
    const int r = kn / ks;
    switch (nf) {
    case 1: return s_launch<TY, 1>(p, kn, r, ldx, ldy, st);
    case 2: return s_launch<TY, 2>(p, kn, r, ldx, ldy, st);
    case 4: return s_launch<TY, 4>(p, kn, r, ldx, ldy, st);
    case 8: return s_launch<TY, 8>(p, kn, r, ldx, ldy, st);
    case QTC_XS: return s_launch_st<TY, 1, QT_STAGES, XM_SLICE>(p, kn, r, ldx, ldy, st);
    case QTC_XR: return s_launch_st<TY, 1, QT_STAGES, XM_RING>(p, kn, r, ldx, ldy, st);
    case QTC_XC:
        return p->m > 8 ? s_launch_st<TY, 2, QT_STAGES, XM_CSLICE>(p, kn, r, ldx, ldy, st)
                        : s_launch_st<TY, 1, QT_STAGES, XM_CSLICE>(p, kn, r, ldx, ldy, st);
    case QTC_WIDE: return s_launch_wide<TY, 0>(p, ks, r, ldx, ldy, st);
    case QTC_WG: return s_launch_wide<TY, 64>(p, ks, r, ldx, ldy, st);
    case QTC_WG32: return s_launch_wide<TY, 32>(p, ks, r, ldx, ldy, st);
    case QTC_WG128: return s_launch_wide<TY, 128>(p, ks, r, ldx, ldy, st);
    default: return cudaErrorInvalidValue;
    }
}

/* 1 when the 16-bit form can run p: the TMA form of wtc on this device and the workspace holding its copies */
static int s_f16_fits(const qtc_params *p) {
    return wtc_wgmma() && p->workspace && !((uintptr_t)p->workspace & 15) &&
           p->workspace_bytes >= qtc_workspace_bytes(p->type, p->n_in, p->n_out);
}

/* 1 when qtc_launch takes the 16-bit form for p by default (m >= QF_MIN_M, cu_settings.qtc_f16) */
static int s_f16_default(const qtc_params *p) {
    return p->m >= QF_MIN_M && cu_settings_get()->qtc_f16 && s_f16_fits(p);
}

/* The 16-bit form (its caller checks s_f16_fits): for each column chunk, x permuted into the copy's order (qtc_xq_kernel;
 * x_perm: x is in that order already); for each row chunk, the
 * rows dequantized (qtc_dq_kernel) and wtc's TMA kernel in qtc's split order (wtc_launch_qsplit: kn sub-splits in
 * groups of r) from the copies into y (+ y_in) or the SwiGLU epilogue. The same operands in the same mma slots,
 * chained and summed in the same order as every other form: the same bits. Why: at prefill sizes the
 * dequantization inside the wgmma kernel's loop, not the tensor cores, bounds the quantized products; the copy
 * costs one pass over the weights (a write of 2 bytes a weight) and one over x a launch */
template <int TY>
static cudaError_t s_launch_f16(const qtc_params *p, int ks, int kn, int ldx, int ldy, cudaStream_t st) {
    const int units = p->n_in / 256, R = s_f16_rows(p->n_in, p->n_out), C = s_f16_cols(p->n_in);
    uint8_t *base = (uint8_t *)p->workspace + s_part_bytes(ks, p->n_out) + (size_t)QB_CHUNK * p->n_in * 2;
    base = (uint8_t *)(((uintptr_t)base + 255) & ~(uintptr_t)255);
    uint16_t *wf = (uint16_t *)base, *xq = wf + (size_t)R * p->n_in;
    for (int c0 = 0; c0 < p->m; c0 += C) {
        const int mc = p->m - c0 < C ? p->m - c0 : C, rows = (mc + 127) / 128 * 128;
        cudaError_t e = cudaSuccess;
        if (!p->x_perm) {
            e = cu_launch(qtc_xq_kernel, dim3((unsigned)((p->n_in / 8 + 255) / 256), (unsigned)rows), dim3(256), 0, st,
                          p->x + (size_t)c0 * ldx, ldx, mc, p->n_in, xq);
            if (e != cudaSuccess) return e;
        }
        for (int r0 = 0; r0 < p->n_out; r0 += R) {
            const int nr = p->n_out - r0 < R ? p->n_out - r0 : R, tiles = (nr + 15) / 16;
            e = cu_launch(qtc_dq_kernel<TY>, dim3((unsigned)(((long)tiles * units + QDQ_WARPS - 1) / QDQ_WARPS)),
                          dim3(QDQ_WARPS * 32), 0, st, (const uint8_t *)p->w, units, r0 / 16, tiles, nr,
                          (uint32_t *)wf);
            if (e != cudaSuccess) return e;
            wtc_params q;
            memset(&q, 0, sizeof q); /* bf16 0: the copy is F16 */
            q.w = wf;
            q.n_in = p->n_in;
            q.n_out = nr;
            q.m = mc;
            if (p->x_perm) { /* x as given, its rows up to x_rows */
                const int xr = (p->x_rows ? p->x_rows : p->m) - c0;
                q.x = p->x + (size_t)c0 * ldx;
                q.ldx = ldx;
                q.x_rows = xr < rows ? xr : rows;
            } else {
                q.x = xq;
                q.ldx = p->n_in;
                q.x_rows = rows;
            }
            if (p->glu) {
                q.glu = p->glu + (size_t)c0 * p->ldg + r0 / 2;
                q.ldg = p->ldg;
            } else {
                q.y = p->y + (size_t)c0 * ldy + r0;
                q.ldy = ldy;
                q.y_in = p->y_in ? p->y_in + (size_t)c0 * ldy + r0 : nullptr;
            }
            e = wtc_launch_qsplit(&q, kn, kn / ks, st);
            if (e != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

/* the wgmma form above 8 columns (sm_90): 32 columns a tile up to 32 rows, 64 up to 64, 128 above (every form gives
 * the same bits) */
static int s_wg_form(int m) { return m <= 32 ? QTC_WG32 : m <= 64 ? QTC_WG : QTC_WG128; }

/* 1 when qtc_launch(p) runs a wide kernel by default: p is a product of rows (no SwiGLU epilogue, x in rows), above
 * the narrow kernel's forms and below the 16-bit form's */
static int s_wide_default(const qtc_params *p) {
    return p && p->m >= 1 && !p->glu && !p->x_perm && qtc_supported(p->type, p->n_in, p->n_out) && !s_f16_default(p) &&
           s_xm_default(p, qtc_split_narrow(p->type, p->n_in, p->n_out)) < 0;
}

extern "C" int qtc_ximage_nx(const qtc_params *p) {
    if (!s_wide_default(p) || !wtc_wgmma()) return 0;
    switch (s_wg_form(p->m)) {
    case QTC_WG32: return 32;
    case QTC_WG: return 64;
    default: return 128;
    }
}

extern "C" int qtc_partials(const qtc_params *p) {
    if (!s_wide_default(p) || p->m > QB_CHUNK) return 0;
    const int ks = qtc_split(p->type, p->n_in, p->n_out);
    return ks > 1 ? ks : 0;
}

extern "C" int qtc_f16_form(const qtc_params *p) {
    return p && qtc_supported(p->type, p->n_in, p->n_out) && s_f16_default(p);
}

extern "C" int qtc_glu_fused(const qtc_params *p)
{
    if (!p || !p->glu || p->m < 1 || p->n_out % 16 != 0 || !qtc_supported(p->type, p->n_in, p->n_out)) return 0;
    return p->m <= 8 || s_xm_default(p, qtc_split_narrow(p->type, p->n_in, p->n_out)) >= 0 || s_f16_default(p);
}

extern "C" cudaError_t qtc_launch_nf(const qtc_params *p, int nf, cudaStream_t st)
{
    if (!p || !p->w || !p->x || (!p->y && !p->glu) || p->m < 1 || !qtc_supported(p->type, p->n_in, p->n_out))
        return cudaErrorInvalidValue;
    const int ldx = p->ldx ? p->ldx : p->n_in, ldy = p->ldy ? p->ldy : p->n_out;
    if (ldx < p->n_in || ldx % 8 != 0 || (!p->glu && ldy < p->n_out)) return cudaErrorInvalidValue;
    /* the SwiGLU epilogue: the narrow kernel (nf 1 .. 8 fragments, or staged) and the 16-bit form, f16 rows of
     * n_out / 2 */
    if (p->glu) {
        if (p->ldg < p->n_out / 2) return cudaErrorInvalidValue;
        if (nf == QTC_F16 ? p->n_out % 16 != 0 || !s_f16_fits(p)
                          : !qtc_glu_fused(p) || (nf != 0 && nf != 1 && nf != 2 && nf != 4 && nf != 8 && nf != QTC_XS &&
                                                  nf != QTC_XR && nf != QTC_XC))
            return cudaErrorInvalidValue;
    }
    if (((uintptr_t)p->w & 15) || ((uintptr_t)p->x & 15)) return cudaErrorMisalignedAddress;
    /* the narrow kernel up to 8 columns, and up to 16 where its slice form serves (s_xm_default); a wide one above
     * (x staged in shared memory and shared by 8 row tiles; its wgmma form on sm_90) */
    const int ks = qtc_split(p->type, p->n_in, p->n_out), kn = qtc_split_narrow(p->type, p->n_in, p->n_out);
    if (nf == 0 && s_f16_default(p)) nf = QTC_F16;
    if (p->x_perm && (nf != QTC_F16 || (p->x_rows && p->x_rows < p->m))) return cudaErrorInvalidValue;
    /* part_only: the wide forms' partials only */
    if (p->part_only &&
        (!qtc_partials(p) || (nf != 0 && nf != QTC_WIDE && nf != QTC_WG && nf != QTC_WG32 && nf != QTC_WG128)))
        return cudaErrorInvalidValue;
    /* x_image: the default form's images only (s_launch_wide checks the form's columns against qtc_ximage_nx) */
    if (p->x_image && (p->x_perm || p->glu || !qtc_ximage_nx(p) || (nf != 0 && nf != s_wg_form(p->m))))
        return cudaErrorInvalidValue;
    if (nf == 0) {
        const int xm = s_xm_default(p, kn);
        nf = xm < 0            ? (!wtc_wgmma() ? QTC_WIDE : s_wg_form(p->m))
             : xm == XM_SLICE  ? QTC_XS
             : xm == XM_CSLICE ? QTC_XC
             : xm == XM_RING   ? QTC_XR
                               : 1;
    }
    if (nf != 1 && nf != 2 && nf != 4 && nf != 8 && nf != QTC_XS && nf != QTC_XR && nf != QTC_XC && nf != QTC_WIDE &&
        nf != QTC_WG && nf != QTC_WG32 && nf != QTC_WG128 && nf != QTC_F16)
        return cudaErrorInvalidValue;
    if (nf == QTC_F16) {
        if (!s_f16_fits(p)) return cudaErrorInvalidValue;
        switch (qt_ty(p->type)) {
        case QT_Q4K: return s_launch_f16<QT_Q4K>(p, ks, kn, ldx, ldy, st);
        case QT_Q6K: return s_launch_f16<QT_Q6K>(p, ks, kn, ldx, ldy, st);
        case QT_Q8_0: return s_launch_f16<QT_Q8_0>(p, ks, kn, ldx, ldy, st);
        default: return cudaErrorInvalidValue;
        }
    }
    if ((nf == QTC_WG || nf == QTC_WG32 || nf == QTC_WG128) && !wtc_wgmma()) return cudaErrorInvalidValue;
    if ((nf == QTC_XS && !s_xs_fits(p, kn)) || (nf == QTC_XR && p->m > QT_NARROW_M) ||
        (nf == QTC_XC && !s_xc_fits(p, kn)))
        return cudaErrorInvalidValue;
    if (nf <= 8 && (p->m + 8L * nf - 1) / (8L * nf) > 0x7fffffffL) return cudaErrorInvalidValue;
    switch (qt_ty(p->type)) {
    case QT_Q4K: return s_launch_ty<QT_Q4K>(p, nf, ks, kn, ldx, ldy, st);
    case QT_Q6K: return s_launch_ty<QT_Q6K>(p, nf, ks, kn, ldx, ldy, st);
    case QT_Q8_0: return s_launch_ty<QT_Q8_0>(p, nf, ks, kn, ldx, ldy, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t qtc_launch(const qtc_params *p, cudaStream_t st) { return qtc_launch_nf(p, 0, st); }

extern "C" cudaError_t qtc_launch_pair(const qtc_params *a, const qtc_params *b, cudaStream_t st)
{
    if (!a || !b) return cudaErrorInvalidValue;
    if (qt_ty(a->type) != QT_Q4K || qt_ty(b->type) != QT_Q6K || a->m != b->m || a->m < 1 || a->m > 8 ||
        a->x != b->x || a->n_in != b->n_in || a->ldx != b->ldx || a->ldy != b->ldy || a->y_in || b->y_in ||
        a->glu || b->glu || !a->y || !b->y || !qtc_supported(a->type, a->n_in, a->n_out) ||
        !qtc_supported(b->type, b->n_in, b->n_out))
        return cudaErrorNotSupported;
    const int kn = qtc_split_narrow(a->type, a->n_in, a->n_out);
    if (kn != QT_MAX_KS || qtc_split_narrow(b->type, b->n_in, b->n_out) != kn) return cudaErrorNotSupported;
    /* ldy 0 means each product's own n_out in qtc_launch: one launch has one stride, so only equal n_out share it */
    if (!a->ldy && a->n_out != b->n_out) return cudaErrorNotSupported;
    const int ldx = a->ldx ? a->ldx : a->n_in, ldy = a->ldy ? a->ldy : a->n_out;
    if (ldx < a->n_in || ldx % 8 != 0 || ldy < a->n_out || ldy < b->n_out) return cudaErrorInvalidValue;
    if (((uintptr_t)a->w & 15) || ((uintptr_t)b->w & 15) || ((uintptr_t)a->x & 15)) return cudaErrorMisalignedAddress;
    constexpr int ST = QT_STAGES;
    /* the larger of the two bodies' rings, and x staged as qtc_launch would (the two share n_in, kn and m) */
    const bool xs = s_xm_default(a, kn) == XM_SLICE; /* the ring form's launches take global reads here */
    const size_t sa = s_narrow_bytes(qt_traits<QT_Q4K>::TB, ST, kn, 1), sb = s_narrow_bytes(qt_traits<QT_Q6K>::TB, ST, kn, 1);
    const size_t smax = sa > sb ? sa : sb, smem = smax + (xs ? s_xs_bytes(a->n_in / 256, kn) : 0);
    static std::atomic<unsigned long long> s_set0{0}, s_set1{0};
    const cudaError_t eo = xs ? cu_smem_optin(qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_SLICE>, smax + QT_XS_MAX, s_set1)
                              : cu_smem_optin(qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_LDG>, smax, s_set0);
    if (eo != cudaSuccess) return cudaErrorNotSupported;
    const int per = xs ? s_occupancy<qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_SLICE>>(32 * kn, smem)
                       : s_occupancy<qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_LDG>>(32 * kn, smem);
    if (per <= 0) return cudaErrorNotSupported;
    /* the CTAs the GPU holds at once: b's tiles one CTA each (its tiles carry more bytes), a's over the rest */
    const int ta = (a->n_out + 15) / 16, tb = (b->n_out + 15) / 16, slots = per * cu_sm_count(0);
    const int gyb = tb, gya = ta < slots - gyb ? ta : slots - gyb;
    if (gya < 1 || gyb > slots / 2) return cudaErrorNotSupported;
    const int ks = qtc_split(a->type, a->n_in, a->n_out), ksb = qtc_split(b->type, b->n_in, b->n_out);
    const dim3 grid((unsigned)((a->m + 7) / 8), (unsigned)(gya + gyb)), block(32 * kn);
    const int units = a->n_in / 256, xsn = (units + kn - 1) / kn;
    if (xs)
        return cu_launch_win(a->w, qtc_packed_bytes(a->type, a->n_in, a->n_out), cudaAccessPropertyStreaming,
                             qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_SLICE>, grid, block, smem, st,
                             (const uint8_t *)a->w, a->n_out, kn / ks, a->y, (const uint8_t *)b->w, b->n_out, kn / ksb,
                             b->y, gya, units, kn, a->m, a->x, ldx, ldy, ST, xsn);
    return cu_launch_win(a->w, qtc_packed_bytes(a->type, a->n_in, a->n_out), cudaAccessPropertyStreaming,
                         qtc_pair_kernel<QT_Q4K, QT_Q6K, ST, XM_LDG>, grid, block, smem, st, (const uint8_t *)a->w,
                         a->n_out, kn / ks, a->y, (const uint8_t *)b->w, b->n_out, kn / ksb, b->y, gya, units, kn, a->m,
                         a->x, ldx, ldy, ST, xsn);
}
