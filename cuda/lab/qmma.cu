/* cuda/lab/qmma.cu: tensor-core products of GGUF-quantized weights with f16 activations, every batch size
 * (contract and batch-invariance argument: cuda/qmma.h).
 *
 * Work decomposition. A CTA owns RT tiles of 16 weight rows and NF fragments of 8 batch columns; its ks warps
 * (ks = qmma_split(type, n_in, n_out), 1..8) split the row's scale units (Q4_K/Q6_K: 256-element super-blocks,
 * Q8_0: 32-element blocks) into ks contiguous ranges, one per warp, and warp 0 adds the ks partial tiles in
 * warp order. Lane (g = lane / 4, t = lane % 4) of a warp holds weight rows g and g + 8 of each row tile (the
 * mma A fragment) and batch column g of each column fragment (the B fragment); per unit it reads the raw
 * bytes of its two rows straight from global memory into registers (Q4_K: 16-byte loads, blocks keep 16-byte
 * alignment; Q6_K/Q8_0: 4-byte loads, or two 2-byte loads where a 210/34-byte block leaves a word misaligned)
 * and turns the levels into f16 with the 0x6400|q trick (1024 + q exactly, minus 1024 in f16: no conversion
 * instruction). When RT * NF <= 2 (decode), the next unit's raw bytes are loaded before the current unit is
 * multiplied (register double-buffering) so that loads stay in flight.
 *
 * The k slots of a 16-element mma step: slots (2t, 2t+1) and (2t+8, 2t+9) of lane t hold the four CONSECUTIVE
 * elements e0 .. e0+3 of the unit, e0 chosen per type below, so that the lane's x operand is one 8-byte load
 * (and every lane's A and B use the same elements). Per type:
 *   Q4_K: lane t reads qs words t and t + 4 (16 bytes each) of both rows; word w holds elements 16(w&1) ..
 *         +15 of sub-blocks 2(w>>1) (low nibbles) and 2(w>>1)+1 (high nibbles). Step (wi, nib, u):
 *         e0 = 32 s + 16 (t&1) + 4u with s = 2((t>>1) + 2 wi) + nib. A = q * sc (exact: <= 945), chained
 *         over the 16 steps of the super-block; the mins through a second chained mma with A = m (the 6-bit
 *         min of each element's sub-block) against the same x: acc = fma(d, C, acc); acc = fma(-dmin, Cm, acc).
 *   Q6_K: one step per 16-element sub-block (n, qq, is): e0 = 128 n + 32 qq + 16 is + 4t; A = q - 32 (exact);
 *         acc = fma(d * sc, C, acc) per step (sc * q would not be exact in f16).
 *   Q8_0: two steps per block: e0 = 8t (step 0) and 8t + 4 (step 1); A = q; acc = fma(d, C, acc) per block.
 * None of this depends on M: M only decides the tile (RT, NF) and the grid's second dimension. */
#include "qmma.h"

#include <cuda_fp16.h>
#include <stdint.h>

#include "f16x2.cuh"

enum { QM_Q4K = 0, QM_Q6K = 1, QM_Q80 = 2 };

/* elements per scale unit and bytes per unit */
static int s_unit(ggml_type t) { return t == GGML_Q4_K || t == GGML_Q6_K ? 256 : t == GGML_Q8_0 ? 32 : 0; }
static int s_unit_bytes(ggml_type t) { return t == GGML_Q4_K ? 144 : t == GGML_Q6_K ? 210 : t == GGML_Q8_0 ? 34 : 0; }

extern "C" int qmma_supported(ggml_type t) { return s_unit(t) > 0; }

/* Split-K count: grow ks (powers of two, at most 8 and at most the units per row) while the matrix has fewer
 * than 2048 warps in all (16 per SM on a 132-SM H100: enough loads in flight at M = 1). A function of the
 * shape only, never of M or of the device: part of the arithmetic of every element. */
extern "C" int qmma_split(ggml_type t, int n_in, int n_out)
{
    const int un = s_unit(t);
    if (un == 0 || n_in <= 0 || n_in % un != 0 || n_out <= 0) return 0;
    const long nunits = n_in / un, tiles = (n_out + 15) / 16;
    int ks = 1;
    while (ks < 8 && 2 * ks <= nunits && tiles * ks < 2048) ks *= 2;
    return ks;
}

/* ------------------------------------------------------------------------------------------------------
 * device helpers */

static __device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* two copies of the f16 of an integer |v| <= 2048 (exact) */
static __device__ __forceinline__ uint32_t h2_int(int v)
{
    const uint32_t h = __half_as_ushort(__int2half_rn(v));
    return h | (h << 16);
}

static __device__ __forceinline__ uint4 ldg16(const void *p) { return __ldg((const uint4 *)p); }
static __device__ __forceinline__ uint2 ldg8(const void *p) { return __ldg((const uint2 *)p); }

/* weight loads: the read-only path (__ldg). The L2 256-byte prefetch hint with L1::no_allocate (as in
 * cuda/qgemv.cu's packed kernel) was measured here too and was slower at M = 1 (Q6_K 4096x4096 16.2 us against
 * 12.9 us, Q4_K 4096x4096 9.3 against 8.8; docs/cuda.md), so plain __ldg it is. */
static __device__ __forceinline__ uint4 ldw16(const void *p) { return __ldg((const uint4 *)p); }
static __device__ __forceinline__ uint32_t ldw4(const void *p) { return __ldg((const uint32_t *)p); }
static __device__ __forceinline__ uint32_t ldw2(const void *p) { return __ldg((const unsigned short *)p); }

/* 4 bytes at a 2-byte-aligned address (Q6_K / Q8_0 blocks): one 4-byte load when aligned, else two 2-byte loads */
static __device__ __forceinline__ uint32_t ld4a2(const uint8_t *p)
{
    if (((uintptr_t)p & 3) == 0) return ldw4(p);
    return ldw2(p) | (ldw2(p + 2) << 16);
}

static __device__ __forceinline__ float h_f32(uint32_t bits16) { return __half2float(__ushort_as_half((unsigned short)bits16)); }

/* byte k (0..11) of the Q4_K scales from the header words s0 (bytes 0-3), s1 (4-7), s2 (8-11) */
static __device__ __forceinline__ int q4k_byte(int k, uint32_t s0, uint32_t s1, uint32_t s2)
{
    const uint32_t w = k < 4 ? s0 : k < 8 ? s1 : s2;
    return (int)((w >> (8 * (k & 3))) & 0xff);
}

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block (engine/quant.c s_scale_min_k4) */
static __device__ __forceinline__ void q4k_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, int *sc, int *m)
{
    if (j < 4) {
        *sc = q4k_byte(j, s0, s1, s2) & 63;
        *m = q4k_byte(j + 4, s0, s1, s2) & 63;
    } else {
        *sc = (q4k_byte(j + 4, s0, s1, s2) & 0xf) | ((q4k_byte(j - 4, s0, s1, s2) >> 6) << 4);
        *m = (q4k_byte(j + 4, s0, s1, s2) >> 4) | ((q4k_byte(j, s0, s1, s2) >> 6) << 4);
    }
}

static __device__ __forceinline__ uint32_t u4_at(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* x operand of one step: elements e .. e+3 of batch column xr (zeros for a padded column) */
template <int NF>
static __device__ __forceinline__ void load_b(const uint16_t *const (&xr)[NF], size_t e, uint2 (&b)[NF])
{
#pragma unroll
    for (int nf = 0; nf < NF; nf++) b[nf] = xr[nf] ? ldg8(xr[nf] + e) : make_uint2(0u, 0u);
}

/* ------------------------------------------------------------------------------------------------------
 * per-type raw bytes of one unit for the lane's rows (RT tiles x rows g, g+8) and their multiplication */

template <int TYPE, int RT> struct Raw;

template <int RT> struct Raw<QM_Q4K, RT> {
    uint4 hd[RT][2];      /* header: d, dmin (f16), scales[12] */
    uint4 q[RT][2][2];    /* qs words t and t + 4 */
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[RT][2], int u, int t)
    {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *b = wr[rt][r] + (size_t)u * 144;
                hd[rt][r] = ldw16(b);
                q[rt][r][0] = ldw16(b + 16 + 16 * t);
                q[rt][r][1] = ldw16(b + 16 + 16 * (t + 4));
            }
    }
    template <int NF>
    __device__ __forceinline__ void mul(const uint16_t *const (&xr)[NF], int u, int t, float (&P)[RT][NF][4]) const
    {
        float C[RT][NF][4], Cm[RT][NF][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
#pragma unroll
                for (int i = 0; i < 4; i++) C[rt][nf][i] = Cm[rt][nf][i] = 0.f;
        const int a = t >> 1, h = t & 1;
#pragma unroll
        for (int wi = 0; wi < 2; wi++)
#pragma unroll
            for (int nib = 0; nib < 2; nib++) {
                const int s = 2 * (a + 2 * wi) + nib;   /* this lane's sub-block in these 4 steps */
                uint32_t scv[RT][2], nsc[RT][2], mv[RT][2];
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        int sc, m;
                        q4k_scale_min(s, hd[rt][r].y, hd[rt][r].z, hd[rt][r].w, &sc, &m);
                        scv[rt][r] = h2_int(sc);
                        nsc[rt][r] = h2_int(-1024 * sc);   /* |1024 sc| <= 64512: exact in f16 */
                        mv[rt][r] = h2_int(m);
                    }
#pragma unroll
                for (int u4 = 0; u4 < 4; u4++) {
                    uint2 b[NF];
                    load_b<NF>(xr, (size_t)u * 256 + 32 * s + 16 * h + 4 * u4, b);
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        uint32_t A[4];
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const uint32_t v = u4_at(q[rt][r][wi], u4);
                            uint32_t p01 = __byte_perm(v, 0, 0x4140), p23 = __byte_perm(v, 0, 0x4342);
                            if (nib) { p01 >>= 4; p23 >>= 4; }
                            /* (1024 + q) * sc - 1024 sc = q * sc, exact (one rounding of an exact value) */
                            A[r] = h2fma((p01 & 0x000F000Fu) | 0x64006400u, scv[rt][r], nsc[rt][r]);
                            A[r + 2] = h2fma((p23 & 0x000F000Fu) | 0x64006400u, scv[rt][r], nsc[rt][r]);
                        }
#pragma unroll
                        for (int nf = 0; nf < NF; nf++) {
                            mma16816(C[rt][nf], A[0], A[1], A[2], A[3], b[nf].x, b[nf].y);
                            mma16816(Cm[rt][nf], mv[rt][0], mv[rt][1], mv[rt][0], mv[rt][1], b[nf].x, b[nf].y);
                        }
                    }
                }
            }
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const float d0 = h_f32(hd[rt][0].x & 0xffff), m0 = h_f32(hd[rt][0].x >> 16);
            const float d1 = h_f32(hd[rt][1].x & 0xffff), m1 = h_f32(hd[rt][1].x >> 16);
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float d = i < 2 ? d0 : d1, dm = i < 2 ? m0 : m1;
                    P[rt][nf][i] = fmaf(d, C[rt][nf][i], P[rt][nf][i]);
                    P[rt][nf][i] = fmaf(-dm, Cm[rt][nf][i], P[rt][nf][i]);
                }
        }
    }
};

template <int RT> struct Raw<QM_Q6K, RT> {
    uint32_t ql[RT][2][8];   /* [n][p][is]: ql bytes 64n + 32p + 16is + 4t .. +3 */
    uint32_t qh[RT][2][4];   /* [n][is]: qh bytes 32n + 16is + 4t .. +3 */
    uint32_t sc[RT][2][4];   /* the 16 int8 scales */
    uint32_t d[RT][2];       /* f16 bits */
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[RT][2], int u, int t)
    {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *b = wr[rt][r] + (size_t)u * 210;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    ql[rt][r][k] = ld4a2(b + 64 * (k >> 2) + 32 * ((k >> 1) & 1) + 16 * (k & 1) + 4 * t);
#pragma unroll
                for (int k = 0; k < 4; k++) qh[rt][r][k] = ld4a2(b + 128 + 32 * (k >> 1) + 16 * (k & 1) + 4 * t);
#pragma unroll
                for (int k = 0; k < 4; k++) sc[rt][r][k] = ld4a2(b + 192 + 4 * k);
                d[rt][r] = ldw2(b + 208);
            }
    }
    template <int NF>
    __device__ __forceinline__ void mul(const uint16_t *const (&xr)[NF], int u, int t, float (&P)[RT][NF][4]) const
    {
        float dd[RT][2];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int r = 0; r < 2; r++) dd[rt][r] = h_f32(d[rt][r]);
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int qq = 0; qq < 4; qq++)
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    uint2 b[NF];
                    load_b<NF>(xr, (size_t)u * 256 + 128 * n + 32 * qq + 16 * is + 4 * t, b);
                    const int nsh = 4 * (qq >> 1), hsh = 2 * qq, si = 8 * n + is + 2 * qq;
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        uint32_t A[4];
                        float dsc[2];
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const uint32_t L = ql[rt][r][4 * n + 2 * (qq & 1) + is], H = qh[rt][r][2 * n + is];
                            const uint32_t l01 = __byte_perm(L, 0, 0x4140), l23 = __byte_perm(L, 0, 0x4342);
                            const uint32_t h01 = __byte_perm(H, 0, 0x4140), h23 = __byte_perm(H, 0, 0x4342);
                            const uint32_t q01 = ((l01 >> nsh) & 0x000F000Fu) | (((h01 >> hsh) & 0x00030003u) << 4);
                            const uint32_t q23 = ((l23 >> nsh) & 0x000F000Fu) | (((h23 >> hsh) & 0x00030003u) << 4);
                            A[r] = h2sub(q01 | 0x64006400u, 0x64206420u);       /* 1024 + q - 1056 = q - 32 */
                            A[r + 2] = h2sub(q23 | 0x64006400u, 0x64206420u);
                            const int s8 = (int)(int8_t)((sc[rt][r][si >> 2] >> (8 * (si & 3))) & 0xff);
                            dsc[r] = dd[rt][r] * (float)s8;
                        }
#pragma unroll
                        for (int nf = 0; nf < NF; nf++) {
                            float C[4] = {0.f, 0.f, 0.f, 0.f};
                            mma16816(C, A[0], A[1], A[2], A[3], b[nf].x, b[nf].y);
#pragma unroll
                            for (int i = 0; i < 4; i++) P[rt][nf][i] = fmaf(dsc[i >> 1], C[i], P[rt][nf][i]);
                        }
                    }
                }
    }
};

template <int RT> struct Raw<QM_Q80, RT> {
    uint32_t w0[RT][2], w1[RT][2];   /* quants 8t .. 8t+3 and 8t+4 .. 8t+7 */
    uint32_t d[RT][2];               /* f16 bits */
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[RT][2], int u, int t)
    {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *b = wr[rt][r] + (size_t)u * 34;
                d[rt][r] = ldw2(b);
                w0[rt][r] = ld4a2(b + 2 + 8 * t);
                w1[rt][r] = ld4a2(b + 6 + 8 * t);
            }
    }
    template <int NF>
    __device__ __forceinline__ void mul(const uint16_t *const (&xr)[NF], int u, int t, float (&P)[RT][NF][4]) const
    {
        uint4 b[NF];
#pragma unroll
        for (int nf = 0; nf < NF; nf++)
            b[nf] = xr[nf] ? ldg16(xr[nf] + (size_t)u * 32 + 8 * t) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            uint32_t A0[4], A1[4];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* int8 -> f16: (q ^ 0x80) = q + 128 as a byte under 0x64: 1024 + 128 + q, minus 1152 */
                const uint32_t v0 = w0[rt][r] ^ 0x80808080u, v1 = w1[rt][r] ^ 0x80808080u;
                A0[r] = h2sub(__byte_perm(v0, 0x64646464u, 0x4140), 0x64806480u);
                A0[r + 2] = h2sub(__byte_perm(v0, 0x64646464u, 0x4342), 0x64806480u);
                A1[r] = h2sub(__byte_perm(v1, 0x64646464u, 0x4140), 0x64806480u);
                A1[r + 2] = h2sub(__byte_perm(v1, 0x64646464u, 0x4342), 0x64806480u);
            }
            const float d0 = h_f32(d[rt][0]), d1 = h_f32(d[rt][1]);
#pragma unroll
            for (int nf = 0; nf < NF; nf++) {
                float C[4] = {0.f, 0.f, 0.f, 0.f};
                mma16816(C, A0[0], A0[1], A0[2], A0[3], b[nf].x, b[nf].y);
                mma16816(C, A1[0], A1[1], A1[2], A1[3], b[nf].z, b[nf].w);
#pragma unroll
                for (int i = 0; i < 4; i++) P[rt][nf][i] = fmaf(i < 2 ? d0 : d1, C[i], P[rt][nf][i]);
            }
        }
    }
};

/* ------------------------------------------------------------------------------------------------------
 * the kernel: grid (row tiles of 16 RT, column blocks of 8 NF), ks warps per CTA */

template <int TYPE, int RT, int NF>
__global__ void __launch_bounds__(256) k_qmma(const qmma_params p, int ks, int nunits)
{
    extern __shared__ float s_red[];   /* [ks][RT][NF][4][32] partial tiles (ks > 1) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * RT, col0 = blockIdx.y * 8 * NF;
    const uint8_t *wr[RT][2];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 16 * rt + g + 8 * r;
            if (row > p.n_out - 1) row = p.n_out - 1;   /* padded rows read row n_out - 1; never stored */
            wr[rt][r] = (const uint8_t *)p.w + (size_t)row * p.row_bytes;
        }
    const uint16_t *xr[NF];
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
        const int col = col0 + 8 * nf + g;
        xr[nf] = col < p.m ? p.x + (size_t)col * p.ldx : nullptr;
    }
    float P[RT][NF][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++)
#pragma unroll
            for (int i = 0; i < 4; i++) P[rt][nf][i] = 0.f;

    /* this warp's contiguous range of units: fixed by (ks, nunits), i.e. by the shape */
    const int u0 = (int)((long)warp * nunits / ks), u1 = (int)((long)(warp + 1) * nunits / ks);
    /* register double-buffering where the registers allow it without spills (nvcc 13 -Xptxas -v, sm_90): every
     * Q8_0 tile (12 words of raw bytes per row tile), Q4_K up to 4 fragments, Q6_K (34 words) decode tiles only */
    constexpr bool kPrefetch = TYPE == QM_Q80 || (TYPE == QM_Q4K && RT * NF <= 4) || RT * NF <= 2;
    if (kPrefetch) {
        /* the next unit's loads are issued before the current unit is multiplied */
        Raw<TYPE, RT> cur, nxt;
        if (u0 < u1) cur.load(wr, u0, t);
        for (int u = u0; u < u1; u++) {
            if (u + 1 < u1) nxt.load(wr, u + 1, t);
            cur.template mul<NF>(xr, u, t, P);
            cur = nxt;
        }
    } else {
        for (int u = u0; u < u1; u++) {
            Raw<TYPE, RT> cur;
            cur.load(wr, u, t);
            cur.template mul<NF>(xr, u, t, P);
        }
    }

    /* merge of the ks partial tiles in warp order: T = ((0 + p0) + p1) + ... (also for ks = 1) */
    if (ks > 1) {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    s_red[((size_t)((warp * RT + rt) * NF + nf) * 4 + i) * 32 + lane] = P[rt][nf][i];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float T = 0.f;
                    for (int w = 0; w < ks; w++) T += s_red[((size_t)((w * RT + rt) * NF + nf) * 4 + i) * 32 + lane];
                    P[rt][nf][i] = T;
                }
    } else {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
#pragma unroll
                for (int i = 0; i < 4; i++) P[rt][nf][i] = 0.f + P[rt][nf][i];
    }
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + 16 * rt + g + 8 * (i >> 1), col = col0 + 8 * nf + 2 * t + (i & 1);
                if (row < p.n_out && col < p.m) {
                    const size_t o = (size_t)col * p.ldy + row;
                    float v = P[rt][nf][i];
                    if (p.y_in) v = p.y_in[o] + v;
                    p.y[o] = v;
                }
            }
}

/* ------------------------------------------------------------------------------------------------------
 * launchers */

template <int TYPE, int RT, int NF>
static cudaError_t s_go(const qmma_params &p, int ks, int nunits, cudaStream_t st)
{
    const dim3 grid((unsigned)((p.n_out + 16 * RT - 1) / (16 * RT)), (unsigned)((p.m + 8 * NF - 1) / (8 * NF)));
    if (grid.y > 65535u) return cudaErrorInvalidValue;
    const size_t smem = ks > 1 ? (size_t)ks * RT * NF * 4 * 32 * sizeof(float) : 0;
    k_qmma<TYPE, RT, NF><<<grid, 32 * ks, smem, st>>>(p, ks, nunits);
    return cudaGetLastError();
}

template <int TYPE>
static cudaError_t s_go_tile(const qmma_params &p, int rt, int nf, int ks, int nunits, cudaStream_t st)
{
    if (rt == 1 && nf == 1) return s_go<TYPE, 1, 1>(p, ks, nunits, st);
    if (rt == 1 && nf == 2) return s_go<TYPE, 1, 2>(p, ks, nunits, st);
    if (rt == 1 && nf == 4) return s_go<TYPE, 1, 4>(p, ks, nunits, st);
    if (rt == 2 && nf == 2) return s_go<TYPE, 2, 2>(p, ks, nunits, st);
    if (rt == 2 && nf == 4) return s_go<TYPE, 2, 4>(p, ks, nunits, st);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t qmma_launch_variant(const qmma_params *pp, int rt, int nf, int ks_force, cudaStream_t st)
{
    if (!pp) return cudaErrorInvalidValue;
    qmma_params p = *pp;
    const int un = s_unit(p.type);
    if (un == 0 || !p.w || !p.x || !p.y || p.n_in <= 0 || p.n_in % un != 0 || p.n_out < 1 || p.m < 1)
        return cudaErrorInvalidValue;
    if (p.ldx == 0) p.ldx = p.n_in;
    if (p.ldy == 0) p.ldy = p.n_out;
    if (p.ldx < p.n_in || p.ldx % 8 != 0 || p.ldy < p.n_out) return cudaErrorInvalidValue;
    if (p.row_bytes < (size_t)(p.n_in / un) * s_unit_bytes(p.type) || p.row_bytes % 2 != 0 ||
        (p.type == GGML_Q4_K && p.row_bytes % 16 != 0))
        return cudaErrorInvalidValue;
    if (((uintptr_t)p.w & 15) != 0 || ((uintptr_t)p.x & 15) != 0) return cudaErrorMisalignedAddress;
    if (rt == 0 && nf == 0) {
        /* tile from the batch: one column fragment up to 8 rows, wider tiles for larger batches (more reuse of
         * each weight fragment), as measured fastest by zllm-qmmabench --tiles on an H100 (docs/cuda.md);
         * the tile never changes an element's arithmetic */
        if (p.m <= 8) { rt = 1; nf = 1; }
        else if (p.m <= 16 && p.type == GGML_Q8_0) { rt = 1; nf = 2; }
        else if (p.m <= 16) { rt = 2; nf = 2; }
        else { rt = 2; nf = 4; }
    }
    const int nunits = p.n_in / un;
    if (ks_force != 0 && (ks_force < 1 || ks_force > 8 || ks_force > nunits)) return cudaErrorInvalidValue;
    const int ks = ks_force ? ks_force : qmma_split(p.type, p.n_in, p.n_out);
    switch (p.type) {
    case GGML_Q4_K: return s_go_tile<QM_Q4K>(p, rt, nf, ks, nunits, st);
    case GGML_Q6_K: return s_go_tile<QM_Q6K>(p, rt, nf, ks, nunits, st);
    case GGML_Q8_0: return s_go_tile<QM_Q80>(p, rt, nf, ks, nunits, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t qmma_launch_tile(const qmma_params *p, int rt, int nf, cudaStream_t st)
{
    return qmma_launch_variant(p, rt, nf, 0, st);
}

extern "C" cudaError_t qmma_launch(const qmma_params *p, cudaStream_t st) { return qmma_launch_variant(p, 0, 0, 0, st); }
