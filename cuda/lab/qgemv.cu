/* cuda/lab/qgemv.cu: small-batch matrix-vector products over raw GGUF weight blocks (see qgemv.h).
 *
 * Staged kernel (k_qgemv, any type): warp w of the grid owns the R output rows [R*w, R*w + R) and walks their
 * n_in elements in chunks of KC = 1024 (32 lanes x 32-element pieces). For each chunk the warp copies the bytes
 * of the R row chunks into its own shared-memory stage with 16-byte cp.async (the 16-byte-aligned span that
 * covers the chunk, so any block size and row alignment works; the matrix's last partial word with plain
 * loads), S stages deep; only __syncwarp is needed, never a CTA barrier. Lane l then decodes the 32 elements
 * [32l, 32l+32) of the chunk for each of the R rows, in groups of 8: one x load (f32 from global through L1)
 * serves R rows.
 * Direct kernel (k_direct, F16/BF16/Q4_K/Q5_K): same ownership, but 16-byte loads go straight to registers
 * (double-buffered across steps), no shared memory: half the L1/shared-memory traffic of the staged kernel.
 * Packed kernel (k_pk, F16/BF16/Q4_K on GGUF rows, Q8_0/Q6_K on the qgemv_repack layout): every lane word a
 * single 16-byte load, S slots of R rows issued before the first use, short rows split over ks warps; see its
 * section below. qgemv_launch_packed uses it by default (Q4_K only for n_out <= 2048).
 * All: integer levels become floats through the 2^23 trick (byte | 0x4B000000 read as a float is 2^23 + byte;
 * subtracting 2^23 + offset is exact), so no conversion instruction (a quarter-rate unit) sits in the inner
 * loop; sums are f32, scales (and min times sum(x)) applied per group of 4..8 elements. */
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>
#include "qgemv.h"

namespace {

constexpr int KC = 1024;   /* elements per chunk and row */

/* elements per block and bytes per block of the block types */
template <int T> struct Tr;
template <> struct Tr<GGML_Q4_0> { static constexpr int BLK = 32,  BPB = 18; };
template <> struct Tr<GGML_Q4_1> { static constexpr int BLK = 32,  BPB = 20; };
template <> struct Tr<GGML_Q5_0> { static constexpr int BLK = 32,  BPB = 22; };
template <> struct Tr<GGML_Q5_1> { static constexpr int BLK = 32,  BPB = 24; };
template <> struct Tr<GGML_Q8_0> { static constexpr int BLK = 32,  BPB = 34; };
template <> struct Tr<GGML_Q4_K> { static constexpr int BLK = 256, BPB = 144; };
template <> struct Tr<GGML_Q5_K> { static constexpr int BLK = 256, BPB = 176; };
template <> struct Tr<GGML_Q6_K> { static constexpr int BLK = 256, BPB = 210; };

/* weights of an affine type are d*q + mn: the group's sum(x) is needed */
template <int T> __host__ __device__ constexpr bool affine()
{
    return T == GGML_Q4_1 || T == GGML_Q5_1 || T == GGML_Q4_K || T == GGML_Q5_K;
}

/* ---------------------------------------------------------------------------------------------------------
 * small device helpers */

/* the 4 bytes at p (shared memory, 2-byte aligned) as a little-endian word */
__device__ __forceinline__ uint32_t ld32(const uint8_t *p)
{
    const uint32_t *w = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    return __funnelshift_r(w[0], w[1], ((uint32_t)(uintptr_t)p & 2u) * 8u);
}

__device__ __forceinline__ float ld_h(const uint8_t *p)   /* fp16 at p (2-byte aligned) */
{
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* the 4 bytes of v (each 0..255) minus off, as exact floats: (2^23 + byte) - (2^23 + off) */
__device__ __forceinline__ void bytes4(uint32_t v, float magic_off, float *q)
{
    q[0] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440)) - magic_off;
    q[1] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7441)) - magic_off;
    q[2] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7442)) - magic_off;
    q[3] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7443)) - magic_off;
}

/* bits 0..3 of b moved to bit 4 of bytes 0..3 (the fifth bit of four Q5 levels) */
__device__ __forceinline__ uint32_t spread4(uint32_t b)
{
    return ((b * 0x00204081u) & 0x01010101u) << 4;
}

constexpr float MAGIC = 8388608.0f;   /* 2^23 */

/* ---------------------------------------------------------------------------------------------------------
 * per-type decoding of group g (0..3: elements 8g..8g+7) of a lane's 32-element piece.
 * b: the piece's block (32-element types) or super-block (Q6_K) in shared memory; part: the piece's index
 * inside a super-block (0..7). Output: q[8] and d, mn with w = d*q + mn. */
template <int T> struct Dec;

template <> struct Dec<GGML_Q8_0> {
    static __device__ __forceinline__ void run(const uint8_t *b, int, int g, float *q, float &d, float &mn)
    {
        bytes4(ld32(b + 2 + 8 * g) ^ 0x80808080u, MAGIC + 128.0f, q);
        bytes4(ld32(b + 6 + 8 * g) ^ 0x80808080u, MAGIC + 128.0f, q + 4);
        d = ld_h(b);
        mn = 0.0f;
    }
};

/* nibbles of elements 8g..8g+7 of a 32-element block whose 16 quant bytes start at qs */
__device__ __forceinline__ void nibbles8(const uint8_t *qs, int g, uint32_t *v0, uint32_t *v1)
{
    int sh = (g >> 1) * 4;
    *v0 = (ld32(qs + 8 * (g & 1)) >> sh) & 0x0f0f0f0fu;
    *v1 = (ld32(qs + 8 * (g & 1) + 4) >> sh) & 0x0f0f0f0fu;
}

template <> struct Dec<GGML_Q4_0> {
    static __device__ __forceinline__ void run(const uint8_t *b, int, int g, float *q, float &d, float &mn)
    {
        uint32_t v0, v1;
        nibbles8(b + 2, g, &v0, &v1);
        bytes4(v0, MAGIC + 8.0f, q);
        bytes4(v1, MAGIC + 8.0f, q + 4);
        d = ld_h(b);
        mn = 0.0f;
    }
};

template <> struct Dec<GGML_Q4_1> {
    static __device__ __forceinline__ void run(const uint8_t *b, int, int g, float *q, float &d, float &mn)
    {
        uint32_t v0, v1;
        nibbles8(b + 4, g, &v0, &v1);
        bytes4(v0, MAGIC, q);
        bytes4(v1, MAGIC, q + 4);
        d = ld_h(b);
        mn = ld_h(b + 2);
    }
};

template <> struct Dec<GGML_Q5_0> {
    static __device__ __forceinline__ void run(const uint8_t *b, int, int g, float *q, float &d, float &mn)
    {
        uint32_t v0, v1, qh = ld32(b + 2) >> (8 * g);
        nibbles8(b + 6, g, &v0, &v1);
        bytes4(v0 | spread4(qh & 15u), MAGIC + 16.0f, q);
        bytes4(v1 | spread4((qh >> 4) & 15u), MAGIC + 16.0f, q + 4);
        d = ld_h(b);
        mn = 0.0f;
    }
};

template <> struct Dec<GGML_Q5_1> {
    static __device__ __forceinline__ void run(const uint8_t *b, int, int g, float *q, float &d, float &mn)
    {
        uint32_t v0, v1, qh = ld32(b + 4) >> (8 * g);
        nibbles8(b + 8, g, &v0, &v1);
        bytes4(v0 | spread4(qh & 15u), MAGIC, q);
        bytes4(v1 | spread4((qh >> 4) & 15u), MAGIC, q + 4);
        d = ld_h(b);
        mn = ld_h(b + 2);
    }
};

/* Q6_K piece t (0..7) = elements 32t..32t+31: half n = t/4, quarter qq = t%4 of engine/quant.c's loop */
template <> struct Dec<GGML_Q6_K> {
    static __device__ __forceinline__ void run(const uint8_t *b, int t, int g, float *q, float &d, float &mn)
    {
        int n = t >> 2, qq = t & 3;
        const uint8_t *ql = b + 64 * n + 32 * (qq & 1) + 8 * g, *qh = b + 128 + 32 * n + 8 * g;
        int sl = (qq >> 1) * 4, sh = 2 * qq;
        uint32_t v0 = ((ld32(ql) >> sl) & 0x0f0f0f0fu) | (((ld32(qh) >> sh) & 0x03030303u) << 4);
        uint32_t v1 = ((ld32(ql + 4) >> sl) & 0x0f0f0f0fu) | (((ld32(qh + 4) >> sh) & 0x03030303u) << 4);
        bytes4(v0, MAGIC + 32.0f, q);
        bytes4(v1, MAGIC + 32.0f, q + 4);
        int8_t sc = (int8_t)b[192 + 8 * n + (g >> 1) + 2 * qq];
        d = ld_h(b + 208) * (float)sc;
        mn = 0.0f;
    }
};

/* ---------------------------------------------------------------------------------------------------------
 * cp.async */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---------------------------------------------------------------------------------------------------------
 * the kernel */

/* warp reduction of acc, then lane (r*M + m) % 32 writes output (r, m) (+ the residual) */
template <int M, int R>
__device__ __forceinline__ void finish(float (&acc)[R][M], const qgemv_params &p, long long row0, int nrows, int lane)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            float v = acc[r][m];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (r < nrows && lane == ((r * M + m) & 31)) {
                const size_t at = (size_t)m * p.ldy + (size_t)(row0 + r);
                if (p.y_in) v += p.y_in[at];
                p.y[at] = v;
            }
        }
    }
}

template <int T> struct Geo {
    static constexpr int CB = KC / Tr<T>::BLK * Tr<T>::BPB;   /* bytes of a full row chunk */
    static constexpr int RB = (CB / 16 + 2) * 16;             /* stage bytes per row: chunk + alignment slack */
};

constexpr int stages_for(int) { return 3; }
constexpr int wpc_for(int per_warp)   /* warps per CTA: static shared memory stays under 48 KB */
{
    return 45056 / per_warp >= 4 ? 4 : 45056 / per_warp >= 1 ? 45056 / per_warp : 1;
}

template <int T, int M, int R, int S, int WPC>
__global__ void __launch_bounds__(WPC * 32) k_qgemv(qgemv_params p)
{
    constexpr int BLK = Tr<T>::BLK, BPB = Tr<T>::BPB, CB = Geo<T>::CB, RB = Geo<T>::RB;
    __shared__ __align__(16) uint8_t sm[WPC][S][R][RB];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row0 = ((long long)blockIdx.x * WPC + warp) * R;
    if (row0 >= p.n_out) return;   /* whole warp: no CTA barrier follows */
    const int nrows = p.n_out - row0 < R ? (int)(p.n_out - row0) : R;
    const int n_chunks = (p.n_in + KC - 1) / KC, n_pieces = p.n_in / 32;
    const uint8_t *wb = (const uint8_t *)p.w;
    const size_t total = (size_t)p.n_out * p.row_bytes;

    /* byte offset of this lane's piece inside a row chunk, and its index inside a super-block */
    const int lane_off = BLK == 32 ? lane * BPB : (lane >> 3) * BPB;
    const int part = lane & 7;

    auto issue = [&](int c) {
        if (c < n_chunks) {
            const int buf = c % S;
            const int kel = p.n_in - c * KC < KC ? p.n_in - c * KC : KC;
            const int cbytes = kel / BLK * BPB;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nrows) {
                    const size_t s = (size_t)(row0 + r) * p.row_bytes + (size_t)c * CB;
                    const size_t a0 = s & ~(size_t)15;
                    const int nw = (int)((s & 15) + cbytes + 15) >> 4;
                    for (int i = lane; i < nw; i += 32) {
                        const size_t src = a0 + 16 * (size_t)i;
                        if (total - src >= 16) {
                            cp_async16(&sm[warp][buf][r][16 * i], wb + src, 16);
                        } else {   /* the matrix's last bytes: plain loads, never past its end */
                            for (int b = 0; b < (int)(total - src); b++) sm[warp][buf][r][16 * i + b] = wb[src + b];
                        }
                    }
                }
            }
        }
        cp_async_commit();
    };

    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;

#pragma unroll
    for (int c = 0; c < S - 1; c++) issue(c);

    for (int c = 0; c < n_chunks; c++) {
        cp_async_wait<S - 2>();
        __syncwarp();
        issue(c + S - 1);
        const int piece = c * 32 + lane;
        if (piece >= n_pieces) continue;
        const int buf = c % S;
        const float *xp = p.x + (size_t)piece * 32;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            float xv[M][8], xs[M];
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 a = __ldg((const float4 *)(xp + (size_t)m * p.ldx + 8 * g));
                const float4 b = __ldg((const float4 *)(xp + (size_t)m * p.ldx + 8 * g + 4));
                xv[m][0] = a.x; xv[m][1] = a.y; xv[m][2] = a.z; xv[m][3] = a.w;
                xv[m][4] = b.x; xv[m][5] = b.y; xv[m][6] = b.z; xv[m][7] = b.w;
                if (affine<T>()) xs[m] = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nrows) {
                    const size_t s = (size_t)(row0 + r) * p.row_bytes + (size_t)c * CB;
                    const uint8_t *blk = &sm[warp][buf][r][(s & 15) + lane_off];
                    float q[8], d, mn;
                    Dec<T>::run(blk, part, g, q, d, mn);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        float t = q[0] * xv[m][0];
#pragma unroll
                        for (int e = 1; e < 8; e++) t = fmaf(q[e], xv[m][e], t);
                        if (affine<T>()) acc[r][m] = fmaf(mn, xs[m], fmaf(d, t, acc[r][m]));
                        else acc[r][m] = fmaf(d, t, acc[r][m]);
                    }
                }
            }
        }
    }

    finish<M, R>(acc, p, row0, nrows, lane);
}

/* ---------------------------------------------------------------------------------------------------------
 * the direct kernel, for the types whose blocks keep 16-byte alignment (F16, BF16: rows of 64-byte multiples;
 * Q4_K 144 and Q5_K 176 bytes per super-block): weights go global -> registers with 16-byte streaming loads,
 * no shared memory; the next 1024-element step of the R rows is loaded while the current one is multiplied.
 *   F16/BF16: step word u (0..3) of lane l = elements 256u + 8l .. +8.
 *   Q4_K/Q5_K: lane l = super-block l/8 of the step, t = l%8: quant bytes 16t..16t+15, i.e. elements
 *   64j + l0 + (0..15) (low nibbles, sub-block 2j) and 64j + 32 + l0 + (0..15) (high, sub-block 2j+1),
 *   j = t/2, l0 = 16 (t%2); word 0 is the super-block's first 16 bytes (d, dmin, scales). */
template <int T> struct DU { static constexpr int U = T == GGML_Q5_K ? 3 : T == GGML_Q4_K ? 2 : 4; };

__device__ __forceinline__ uint4 ldw(const uint8_t *p) { return __ldcs((const uint4 *)p); }

template <int T, int R>
__device__ __forceinline__ void dload(uint4 (&w)[R][DU<T>::U], const qgemv_params &p, long long row0, int nrows,
                                      int k0, int lane)
{
    constexpr int U = DU<T>::U;
    const uint8_t *wb = (const uint8_t *)p.w;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *row = wb + (size_t)(row0 + r) * p.row_bytes;
        if constexpr (T == GGML_F16 || T == GGML_BF16) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = k0 + 256 * u + 8 * lane;
                w[r][u] = r < nrows && k < p.n_in ? ldw(row + 2 * (size_t)k) : make_uint4(0, 0, 0, 0);
            }
        } else {
            const int sb = k0 / Tr<T>::BLK + (lane >> 3), t = lane & 7;
            const bool ok = r < nrows && sb < p.n_in / Tr<T>::BLK;
            const uint8_t *b = row + (size_t)sb * Tr<T>::BPB;
            w[r][0] = ok ? ldw(b) : make_uint4(0, 0, 0, 0);
            if constexpr (T == GGML_Q4_K) {
                w[r][1] = ok ? ldw(b + 16 + 16 * t) : make_uint4(0, 0, 0, 0);
            } else {
                w[r][1] = ok ? ldw(b + 16 + 16 * (t & 1)) : make_uint4(0, 0, 0, 0);
                w[r][2] = ok ? ldw(b + 48 + 16 * t) : make_uint4(0, 0, 0, 0);
            }
        }
    }
}

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int i)   /* i a compile-time constant */
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* byte i (0..11, run-time) of the 12 scale bytes held in words y, z, w of a Q4_K/Q5_K header */
__device__ __forceinline__ int hdr_byte(const uint4 &h, int i)
{
    const uint32_t v = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (int)((v >> (8 * (i & 3))) & 0xffu);
}

__device__ __forceinline__ void hdr_scale_min(const uint4 &h, int j, float *dsc, float *mmin)
{
    int sc, m;
    if (j < 4) {
        sc = hdr_byte(h, j) & 63;
        m = hdr_byte(h, j + 4) & 63;
    } else {
        sc = (hdr_byte(h, j + 4) & 0xf) | ((hdr_byte(h, j - 4) >> 6) << 4);
        m = (hdr_byte(h, j + 4) >> 4) | ((hdr_byte(h, j) >> 6) << 4);
    }
    const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
    *dsc = d * (float)sc;
    *mmin = dmin * (float)m;
}

__device__ __forceinline__ float dot4(const float *q, const float4 &x, float acc)
{
    return fmaf(q[3], x.w, fmaf(q[2], x.z, fmaf(q[1], x.y, fmaf(q[0], x.x, acc))));
}

template <int T, int M, int R>
__device__ __forceinline__ void dcompute(const uint4 (&w)[R][DU<T>::U], const qgemv_params &p, int nrows, int k0,
                                         int lane, float (&acc)[R][M])
{
    if constexpr (T == GGML_F16 || T == GGML_BF16) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + 256 * u + 8 * lane;
            if (k >= p.n_in) continue;
            float4 xa[M], xb[M];
#pragma unroll
            for (int m = 0; m < M; m++) {
                xa[m] = __ldg((const float4 *)(p.x + (size_t)m * p.ldx + k));
                xb[m] = __ldg((const float4 *)(p.x + (size_t)m * p.ldx + k + 4));
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= nrows) continue;
                float q[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t v = u4_word(w[r][u], i);
                    if constexpr (T == GGML_BF16) {
                        q[2 * i] = __uint_as_float(v << 16);
                        q[2 * i + 1] = __uint_as_float(v & 0xffff0000u);
                    } else {
                        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&v));
                        q[2 * i] = f.x;
                        q[2 * i + 1] = f.y;
                    }
                }
#pragma unroll
                for (int m = 0; m < M; m++) acc[r][m] = dot4(q + 4, xb[m], dot4(q, xa[m], acc[r][m]));
            }
        }
    } else {
        const int sb = k0 / Tr<T>::BLK + (lane >> 3), t = lane & 7, j = t >> 1;
        if (sb >= p.n_in / Tr<T>::BLK) return;
        const int kb = sb * Tr<T>::BLK + 64 * j + 16 * (t & 1);
        float d0[R], m0[R], d1[R], m1[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            hdr_scale_min(w[r][0], 2 * j, &d0[r], &m0[r]);
            hdr_scale_min(w[r][0], 2 * j + 1, &d1[r], &m1[r]);
        }
        float sxl[M], sxh[M];
#pragma unroll
        for (int m = 0; m < M; m++) sxl[m] = sxh[m] = 0.0f;
#pragma unroll
        for (int wd = 0; wd < 4; wd++) {
            float4 xl[M], xh[M];
#pragma unroll
            for (int m = 0; m < M; m++) {
                xl[m] = __ldg((const float4 *)(p.x + (size_t)m * p.ldx + kb + 4 * wd));
                xh[m] = __ldg((const float4 *)(p.x + (size_t)m * p.ldx + kb + 32 + 4 * wd));
                sxl[m] += (xl[m].x + xl[m].y) + (xl[m].z + xl[m].w);
                sxh[m] += (xh[m].x + xh[m].y) + (xh[m].z + xh[m].w);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t v = u4_word(w[r][T == GGML_Q4_K ? 1 : 2], wd);
                uint32_t lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;
                if constexpr (T == GGML_Q5_K) {
                    const uint32_t h = u4_word(w[r][1], wd);
                    lo |= ((h >> (2 * j)) & 0x01010101u) << 4;
                    hi |= ((h >> (2 * j + 1)) & 0x01010101u) << 4;
                }
                float ql[4], qh[4];
                bytes4(lo, MAGIC, ql);
                bytes4(hi, MAGIC, qh);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    acc[r][m] = fmaf(d0[r], dot4(ql, xl[m], 0.0f), acc[r][m]);
                    acc[r][m] = fmaf(d1[r], dot4(qh, xh[m], 0.0f), acc[r][m]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] -= fmaf(m0[r], sxl[m], m1[r] * sxh[m]);
    }
}

template <int T, int M, int R>
__global__ void __launch_bounds__(128) k_direct(qgemv_params p)
{
    constexpr int U = DU<T>::U;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row0 = ((long long)blockIdx.x * 4 + warp) * R;
    if (row0 >= p.n_out) return;
    const int nrows = p.n_out - row0 < R ? (int)(p.n_out - row0) : R;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    uint4 wa[R][U], wn[R][U];
    dload<T, R>(wa, p, row0, nrows, 0, lane);
    for (int k0 = 0; k0 < p.n_in; k0 += 2 * KC) {
        dload<T, R>(wn, p, row0, nrows, k0 + KC, lane);
        dcompute<T, M, R>(wa, p, nrows, k0, lane, acc);
        if (k0 + KC >= p.n_in) break;
        dload<T, R>(wa, p, row0, nrows, k0 + 2 * KC, lane);
        dcompute<T, M, R>(wn, p, nrows, k0 + KC, lane, acc);
    }
    finish<M, R>(acc, p, row0, nrows, lane);
}

template <int T> constexpr bool has_direct()
{
    return T == GGML_F16 || T == GGML_BF16 || T == GGML_Q4_K || T == GGML_Q5_K;
}

/* ---------------------------------------------------------------------------------------------------------
 * the packed kernel (k_pk): BF16, F16, Q4_K on their GGUF rows and Q8_0, Q6_K on the packed layout of
 * qgemv_repack (see qgemv.h), i.e. every weight word 16-byte aligned and read with one 16-byte load.
 *
 * Work split: a CTA is 4 warps = (4 / ks) row groups of R rows, each served by ks warps; the n_in of a row is cut
 * into slots of E elements (one 16-byte word per lane and row: E = 256 BF16/F16, 512 Q8_0, 1024 Q4_K/Q6_K), and
 * warp kw of a group takes slots kw, kw + ks, kw + 2ks, ... Per loop trip a warp issues the loads of S slots of
 * its R rows (S * R independent 16-byte loads per lane, all before the first use), then multiplies them in slot
 * order. ks (1, 2 or 4) splits short rows over several warps so that small matrices still put enough loads in
 * flight; it depends on (type, n_in, n_out) only (pk_ks), never on the batch. The ks partial sums of a row are
 * added in warp order through shared memory.
 * Batch invariance: a lane's elements, their order and every operation on them (explicit fmaf, fixed shuffle
 * tree, fixed warp order) are the same for every M, R and S; only ks changes the arithmetic, and ks is fixed by
 * the shape. So row m of a launch is bitwise the same at any M (checked by gpu_test_qgemv).
 * Rows past n_out (the last group's tail) are computed on a clamped row index and not stored. */

/* 16-byte streaming load through the non-coherent path, no L1 allocation; H (hint) asks L2 for 256-byte
 * prefetch, so one request brings two sectors' neighbours (more DRAM bytes in flight per request) */
template <bool H> __device__ __forceinline__ uint4 ldq(const void *p)
{
    uint4 v;
    if constexpr (H)
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldq8(const void *p)
{
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldq2(const void *p)
{
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float h2f(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }

/* x[m][k .. k+3] (f32, through L1: every row of the CTA reads it) */
__device__ __forceinline__ float4 ldx(const qgemv_params &p, int m, int k)
{
    return __ldg((const float4 *)(p.x + (size_t)m * p.ldx + k));
}

/* per-type slot of the packed kernel: E elements per slot; W: what one lane loads for one row and slot;
 * ok(): the lane's part lies inside n_in; load(): the lane's words (only called when ok); mul(): adds the R
 * rows' products to acc */
template <int T> struct PK;

template <int T> struct PK16 {   /* F16, BF16: lane l = elements k0 + 8l .. +7 */
    static constexpr int E = 256;
    struct W { uint4 v; };
    static __device__ __forceinline__ int at(int slot, int lane) { return slot * E + 8 * lane; }
    static __device__ __forceinline__ bool ok(const qgemv_params &p, int slot, int lane)
    {
        return at(slot, lane) < p.n_in;
    }
    template <bool H>
    static __device__ __forceinline__ void load(W &w, const qgemv_params &p, const uint8_t *, long long row, int slot,
                                                int lane)
    {
        w.v = ldq<H>((const uint8_t *)p.w + (size_t)row * p.row_bytes + 2 * (size_t)at(slot, lane));
    }
    template <int M, int R>
    static __device__ __forceinline__ void mul(const W (&w)[R], const qgemv_params &p, int slot, int lane,
                                               float (&acc)[R][M])
    {
        const int k = at(slot, lane);
        float q[R][8];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t v = u4_word(w[r].v, i);
                if constexpr (T == GGML_BF16) {
                    q[r][2 * i] = __uint_as_float(v << 16);
                    q[r][2 * i + 1] = __uint_as_float(v & 0xffff0000u);
                } else {
                    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&v));
                    q[r][2 * i] = f.x;
                    q[r][2 * i + 1] = f.y;
                }
            }
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float4 xa = ldx(p, m, k), xb = ldx(p, m, k + 4);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][m] = dot4(q[r] + 4, xb, dot4(q[r], xa, acc[r][m]));
        }
    }
};
template <> struct PK<GGML_F16> : PK16<GGML_F16> {};
template <> struct PK<GGML_BF16> : PK16<GGML_BF16> {};

/* Q8_0 packed: quants [n_out][n_in] int8, then scales [n_out][n_in / 32] fp16 (aux). Lane l = elements
 * k0 + 16l .. +15, all in block k0/32 + l/2. */
template <> struct PK<GGML_Q8_0> {
    static constexpr int E = 512;
    struct W { uint4 q; uint32_t d; };
    static __device__ __forceinline__ int at(int slot, int lane) { return slot * E + 16 * lane; }
    static __device__ __forceinline__ bool ok(const qgemv_params &p, int slot, int lane)
    {
        return at(slot, lane) < p.n_in;
    }
    template <bool H>
    static __device__ __forceinline__ void load(W &w, const qgemv_params &p, const uint8_t *aux, long long row,
                                                int slot, int lane)
    {
        const int k = at(slot, lane);
        w.q = ldq<H>((const uint8_t *)p.w + (size_t)row * p.n_in + k);
        w.d = ldq2(aux + 2 * ((size_t)row * (p.n_in / 32) + k / 32));
    }
    template <int M, int R>
    static __device__ __forceinline__ void mul(const W (&w)[R], const qgemv_params &p, int slot, int lane,
                                               float (&acc)[R][M])
    {
        const int k = at(slot, lane);
        float s[R][M];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) s[r][m] = 0.0f;
#pragma unroll(M == 1 ? 4 : 1)
        for (int i = 0; i < 4; i++) {
            float q[R][4];
#pragma unroll
            for (int r = 0; r < R; r++) bytes4(u4_word(w[r].q, i) ^ 0x80808080u, MAGIC + 128.0f, q[r]);
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 xv = ldx(p, m, k + 4 * i);
#pragma unroll
                for (int r = 0; r < R; r++) s[r][m] = dot4(q[r], xv, s[r][m]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float d = h2f(w[r].d);
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = fmaf(d, s[r][m], acc[r][m]);
        }
    }
};

/* Q4_K, GGUF layout (144-byte super-blocks keep 16-byte alignment): lane l = super-block k0/256 + l/8, t = l%8:
 * header word (d, dmin, scales) and quant word t = elements 64j + 16(t%2) + (0..15) (low nibbles, sub-block 2j)
 * and the same + 32 (high nibbles, sub-block 2j+1), j = t/2 */
template <> struct PK<GGML_Q4_K> {
    static constexpr int E = 1024;
    struct W { uint4 h, q; };
    static __device__ __forceinline__ int sb(int slot, int lane) { return slot * 4 + (lane >> 3); }
    static __device__ __forceinline__ bool ok(const qgemv_params &p, int slot, int lane)
    {
        return sb(slot, lane) < p.n_in / 256;
    }
    template <bool H>
    static __device__ __forceinline__ void load(W &w, const qgemv_params &p, const uint8_t *, long long row, int slot,
                                                int lane)
    {
        const uint8_t *b = (const uint8_t *)p.w + (size_t)row * p.row_bytes + (size_t)sb(slot, lane) * 144;
        w.h = ldq<H>(b);
        w.q = ldq<H>(b + 16 + 16 * (lane & 7));
    }
    template <int M, int R>
    static __device__ __forceinline__ void mul(const W (&w)[R], const qgemv_params &p, int slot, int lane,
                                               float (&acc)[R][M])
    {
        const int t = lane & 7, j = t >> 1, kb = sb(slot, lane) * 256 + 64 * j + 16 * (t & 1);
        float sl[R][M], sh[R][M], xl_sum[M], xh_sum[M];
#pragma unroll
        for (int m = 0; m < M; m++) {
            xl_sum[m] = xh_sum[m] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) sl[r][m] = sh[r][m] = 0.0f;
        }
#pragma unroll(M == 1 ? 4 : 1)
        for (int i = 0; i < 4; i++) {
            float ql[R][4], qh[R][4];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t v = u4_word(w[r].q, i);
                bytes4(v & 0x0f0f0f0fu, MAGIC, ql[r]);
                bytes4((v >> 4) & 0x0f0f0f0fu, MAGIC, qh[r]);
            }
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 xl = ldx(p, m, kb + 4 * i), xh = ldx(p, m, kb + 32 + 4 * i);
                const float al = (xl.x + xl.y) + (xl.z + xl.w), ah = (xh.x + xh.y) + (xh.z + xh.w);
                xl_sum[m] += al;
                xh_sum[m] += ah;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    sl[r][m] = dot4(ql[r], xl, sl[r][m]);
                    sh[r][m] = dot4(qh[r], xh, sh[r][m]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float d0, m0, d1, m1;
            hdr_scale_min(w[r].h, 2 * j, &d0, &m0);
            hdr_scale_min(w[r].h, 2 * j + 1, &d1, &m1);
#pragma unroll
            for (int m = 0; m < M; m++) {
                float a = fmaf(d0, sl[r][m], acc[r][m]);
                a = fmaf(d1, sh[r][m], a);
                acc[r][m] = a - fmaf(m0, xl_sum[m], m1 * xh_sum[m]);
            }
        }
    }
};

/* Q6_K packed: super-blocks of 208 bytes (ql[128] qh[64] scales[16], as in GGUF, 16-byte aligned), then the
 * fp16 d of every super-block [n_out][n_in / 256] (aux). Lane l = super-block k0/256 + l/8, a = l%8, half n =
 * a/4, b = a%4: ql word a (bytes 64n + 16b ..), qh word 2n + b%2, the 8 scale bytes 8n .. 8n+7. Its low
 * nibbles are elements e0 = 128n + 16(b%2) + 32(b/2) + (0..15) (scale byte b of 8n..), its high nibbles
 * e0 + 64 + (0..15) (scale byte 4 + b); the two qh bits of each are at 2(b/2) and 4 + 2(b/2). */
template <> struct PK<GGML_Q6_K> {
    static constexpr int E = 1024;
    struct W { uint4 ql, qh; uint2 sc; uint32_t d; };
    static __device__ __forceinline__ int sb(int slot, int lane) { return slot * 4 + (lane >> 3); }
    static __device__ __forceinline__ bool ok(const qgemv_params &p, int slot, int lane)
    {
        return sb(slot, lane) < p.n_in / 256;
    }
    template <bool H>
    static __device__ __forceinline__ void load(W &w, const qgemv_params &p, const uint8_t *aux, long long row,
                                                int slot, int lane)
    {
        const int nsb = p.n_in / 256, s = sb(slot, lane), a = lane & 7, n = a >> 2;
        const uint8_t *b = (const uint8_t *)p.w + ((size_t)row * nsb + s) * 208;
        w.ql = ldq<H>(b + 16 * a);
        w.qh = ldq<H>(b + 128 + 32 * n + 16 * (a & 1));
        w.sc = ldq8(b + 192 + 8 * n);
        w.d = ldq2(aux + 2 * ((size_t)row * nsb + s));
    }
    template <int M, int R>
    static __device__ __forceinline__ void mul(const W (&w)[R], const qgemv_params &p, int slot, int lane,
                                               float (&acc)[R][M])
    {
        const int a = lane & 7, n = a >> 2, b = a & 3, h2 = b >> 1;
        const int e0 = sb(slot, lane) * 256 + 128 * n + 16 * (b & 1) + 32 * h2;
        float sl[R][M], sh[R][M];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) sl[r][m] = sh[r][m] = 0.0f;
#pragma unroll(M == 1 ? 4 : 1)
        for (int i = 0; i < 4; i++) {
            float ql[R][4], qh[R][4];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t v = u4_word(w[r].ql, i), hb = u4_word(w[r].qh, i) >> (2 * h2);
                bytes4((v & 0x0f0f0f0fu) | ((hb & 0x03030303u) << 4), MAGIC + 32.0f, ql[r]);
                bytes4(((v >> 4) & 0x0f0f0f0fu) | (((hb >> 4) & 0x03030303u) << 4), MAGIC + 32.0f, qh[r]);
            }
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 xl = ldx(p, m, e0 + 4 * i), xh = ldx(p, m, e0 + 64 + 4 * i);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    sl[r][m] = dot4(ql[r], xl, sl[r][m]);
                    sh[r][m] = dot4(qh[r], xh, sh[r][m]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float d = h2f(w[r].d);
            const float dl = d * (float)(int8_t)((w[r].sc.x >> (8 * b)) & 0xffu);
            const float dh = d * (float)(int8_t)((w[r].sc.y >> (8 * b)) & 0xffu);
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = fmaf(dh, sh[r][m], fmaf(dl, sl[r][m], acc[r][m]));
        }
    }
};

template <int T> constexpr bool has_pk()
{
    return T == GGML_F16 || T == GGML_BF16 || T == GGML_Q8_0 || T == GGML_Q4_K || T == GGML_Q6_K;
}

/* T's weights are read in the packed layout (different from the GGUF rows) */
template <int T> constexpr bool pk_repacked() { return T == GGML_Q8_0 || T == GGML_Q6_K; }

template <int T, int M, int R, int S, bool H, int MINB>
__global__ void __launch_bounds__(128, MINB) k_pk(qgemv_params p, const uint8_t *aux, int ks)
{
    using K = PK<T>;
    __shared__ float red[4][R][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = warp / ks, kw = warp - g * ks;
    const long long row0 = ((long long)blockIdx.x * (4 / ks) + g) * R;
    const int nrows = p.n_out - row0 <= 0 ? 0 : p.n_out - row0 < R ? (int)(p.n_out - row0) : R;
    const int n_slots = (p.n_in + K::E - 1) / K::E;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    if (nrows > 0) {
        for (int s0 = kw; s0 < n_slots; s0 += S * ks) {
            typename K::W w[S][R];
#pragma unroll
            for (int i = 0; i < S; i++) {
                const int slot = s0 + i * ks;
                if (slot < n_slots && K::ok(p, slot, lane)) {
#pragma unroll
                    for (int r = 0; r < R; r++)
                        K::template load<H>(w[i][r], p, aux, r < nrows ? row0 + r : row0, slot, lane);
                }
            }
#pragma unroll
            for (int i = 0; i < S; i++) {
                const int slot = s0 + i * ks;
                if (slot < n_slots && K::ok(p, slot, lane)) K::template mul<M, R>(w[i], p, slot, lane, acc);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if (ks > 1) {   /* uniform over the CTA: every thread reaches the barrier */
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < M; m++) red[warp][r][m] = acc[r][m];
        __syncthreads();
        if (kw != 0) return;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) {
                float v = red[warp][r][m];
                for (int k = 1; k < ks; k++) v += red[warp + k][r][m];
                acc[r][m] = v;
            }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
            if (r < nrows && lane == ((r * M + m) & 31)) {
                const size_t at = (size_t)m * p.ldy + (size_t)(row0 + r);
                float v = acc[r][m];
                if (p.y_in) v += p.y_in[at];
                p.y[at] = v;
            }
}

/* warps per row group: 1, 2 or 4, from the type and shape alone (never from M: batch invariance).
 * F16/BF16/Q4_K: short matrices get split rows so that about 4096 warps (32 per SM of a 132-SM H100) carry
 * loads, counting 2 rows per warp, each warp keeping >= 2 slots. Q8_0: 1 for n_out >= 8192, else 4; Q6_K: 1 for
 * n_out > 65536 (the LM head), else 4; both at most one warp per slot. These are the fastest ks measured at M = 1
 * on the 8B shapes (zllm-qbench --variants, H100, docs/cuda.md): e.g. Q8_0 4096x4096 ks 1/2/4 = 50/42/52%
 * of read bandwidth, down (n_in 14336, n_out 4096) 65/54/69%; Q6_K 4096x4096 42/34/43%, LM head 80/75/66%. */
template <int T> int pk_ks(int n_in, int n_out)
{
    const int n_slots = (n_in + PK<T>::E - 1) / PK<T>::E;
    int ks = 1;
    if (T == GGML_Q8_0 || T == GGML_Q6_K) {
        ks = n_out >= (T == GGML_Q8_0 ? 8192 : 65537) ? 1 : 4;
        while (ks > 1 && n_slots < ks) ks /= 2;
        return ks;
    }
    const long long groups = ((long long)n_out + 1) / 2;
    while (ks < 4 && groups * ks < 4096 && n_slots >= 2 * ks) ks *= 2;
    return ks;
}

/* aux: the scale array of a packed Q8_0 / Q6_K matrix (after the quants), else NULL */
template <int T> const uint8_t *pk_aux(const qgemv_params &p)
{
    const uint8_t *w = (const uint8_t *)p.w;
    if (T == GGML_Q8_0) return w + (size_t)p.n_out * p.n_in;
    if (T == GGML_Q6_K) return w + (size_t)p.n_out * (p.n_in / 256) * 208;
    return NULL;
}

template <int T, int M, int R, int S, bool H>
cudaError_t launch_pk(const qgemv_params &p, int ks, cudaStream_t st)
{
    if (!ks) ks = pk_ks<T>(p.n_in, p.n_out);
    if (ks != 1 && ks != 2 && ks != 4) return cudaErrorInvalidValue;
    const long long rows_per_cta = (long long)(4 / ks) * R;
    const long long grid = (p.n_out + rows_per_cta - 1) / rows_per_cta;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    /* CTAs per SM the registers must allow: 8 (<= 64 registers, 32 warps per SM) for F16/BF16 at M = 1, 6
     * (<= 80) for the others at M = 1 and F16/BF16 at M = 2, 4 (<= 128) above; chosen so that ptxas spills
     * (almost) nothing (sm_90, nvcc 13.0, -Xptxas -v: at most 20 bytes, Q6_K at M = 8 and (R, S) = (1, 4)) */
    constexpr bool w16 = T == GGML_F16 || T == GGML_BF16;
    constexpr int MINB = M == 1 && w16 ? 8 : M == 1 || (M == 2 && w16) ? 6 : 4;
    k_pk<T, M, R, S, H, MINB><<<(unsigned)grid, 128, 0, st>>>(p, pk_aux<T>(p), ks);
    return cudaGetLastError();
}

/* default rows per warp and slots per trip (zllm-qbench --variants, H100; see docs/cuda.md). At M = 1:
 * F16/BF16 (2, 2) (84/55/93/95/100% of read bandwidth on the five 8B shapes against 79/52/90/93/100% with
 * (2, 4)); Q8_0 (2, 4), but (2, 2) for n_out >= 8192 (pk_q8_narrow: 83% against 66% on gate/up); Q4_K and
 * Q6_K (2, 2). Neither changes the arithmetic of a row (batch invariance). */
constexpr int pk_r(int m) { return m <= 2 ? 2 : 1; }
template <int T> constexpr int pk_s(int m)
{
    return T == GGML_Q4_K || T == GGML_Q6_K || ((T == GGML_F16 || T == GGML_BF16) && m == 1) ? 2 : 4;
}
template <int T, int M> bool pk_q8_narrow(const qgemv_params &p)
{
    return T == GGML_Q8_0 && M == 1 && p.n_out >= 8192;
}

/* variant v >= 1000 of the packed kernel: v = 1000 + 100 ks + 10 R + S (+ 10000: no L2 prefetch hint);
 * ks 0 = pk_ks, R = S = 0: the default pair. The defaults exist for every M; the other (R, S) pairs and the
 * hint-less form only for M = 1. */
template <int T, int M>
cudaError_t launch_pk_variant(const qgemv_params &p, int v, cudaStream_t st)
{
    if constexpr (!has_pk<T>()) {
        (void)p; (void)v; (void)st;
        return cudaErrorInvalidValue;
    } else {
        constexpr int DR = pk_r(M), DS = pk_s<T>(M);
        if (v == 0) {
            if constexpr (T == GGML_Q8_0 && M == 1)
                if (pk_q8_narrow<T, M>(p)) return launch_pk<T, 1, 2, 2, true>(p, 0, st);
            return launch_pk<T, M, DR, DS, true>(p, 0, st);
        }
        const bool hint = v < 10000;
        if (!hint) v -= 10000;
        if (v < 1000 || v >= 1500) return cudaErrorInvalidValue;
        v -= 1000;
        const int ks = v / 100, rs = v % 100;
        if (ks != 0 && ks != 1 && ks != 2 && ks != 4) return cudaErrorInvalidValue;
        if constexpr (T == GGML_Q8_0 && M == 1)   /* the default pair of a narrow Q8_0 matrix */
            if (rs == 0 && pk_q8_narrow<T, M>(p))
                return hint ? launch_pk<T, 1, 2, 2, true>(p, ks, st) : launch_pk<T, 1, 2, 2, false>(p, ks, st);
        const bool def = rs == 0 || rs == DR * 10 + DS;
        if (def && hint) return launch_pk<T, M, DR, DS, true>(p, ks, st);
        if constexpr (M == 1) {
            if (def) return launch_pk<T, M, DR, DS, false>(p, ks, st);
            if (hint) {
                switch (rs) {
                case 14: return launch_pk<T, 1, 1, 4, true>(p, ks, st);
                case 22:
                    if constexpr (T == GGML_Q8_0) return launch_pk<T, 1, 2, 2, true>(p, ks, st);
                    else return cudaErrorInvalidValue;
                case 24:
                    if constexpr (T == GGML_F16 || T == GGML_BF16) return launch_pk<T, 1, 2, 4, true>(p, ks, st);
                    else return cudaErrorInvalidValue;
                case 42:
                    if constexpr (T == GGML_F16 || T == GGML_BF16) return launch_pk<T, 1, 4, 2, true>(p, ks, st);
                    else return cudaErrorInvalidValue;
                default: break;
                }
            }
        }
        return cudaErrorInvalidValue;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * repacking (qgemv_repack*): one thread per GGUF block on the device, the same loops on the host */

__global__ void k_repack(int type, const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int n_in,
                         long long n_blocks)
{
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    if (type == GGML_Q8_0) {
        const uint8_t *s = src + b * 34;
        uint8_t *q = dst + b * 32, *d = dst + n_blocks * 32 + b * 2;
        d[0] = s[0];
        d[1] = s[1];
        for (int i = 0; i < 32; i++) q[i] = s[2 + i];
    } else {   /* Q6_K */
        const uint8_t *s = src + b * 210;
        uint8_t *q = dst + b * 208, *d = dst + n_blocks * 208 + b * 2;
        for (int i = 0; i < 208; i++) q[i] = s[i];
        d[0] = s[208];
        d[1] = s[209];
    }
    (void)n_in;
}

/* ---------------------------------------------------------------------------------------------------------
 * launchers. variant: 0 default; 10 staged kernel with 2 rows per warp, 14 staged with 4 rows (m == 1), both
 * only for the types without a direct kernel; 20 direct kernel with its default rows per warp, 22 / 24 direct
 * with 2 / 4 rows (m == 1). (On an H100 the staged kernel ran BF16/Q4_K/Q5_K 2-4x slower than the direct one,
 * so those instantiations are not built.) */

template <int T, int M, int R>
cudaError_t launch_staged(const qgemv_params &p, cudaStream_t st)
{
    constexpr int S = stages_for(T);
    constexpr int WPC = wpc_for(S * R * Geo<T>::RB);
    const long long groups = ((long long)p.n_out + R - 1) / R;
    const long long grid = (groups + WPC - 1) / WPC;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    k_qgemv<T, M, R, S, WPC><<<(unsigned)grid, WPC * 32, 0, st>>>(p);
    return cudaGetLastError();
}

template <int T, int M, int R>
cudaError_t launch_direct(const qgemv_params &p, cudaStream_t st)
{
    const long long groups = ((long long)p.n_out + R - 1) / R;
    const long long grid = (groups + 3) / 4;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    k_direct<T, M, R><<<(unsigned)grid, 128, 0, st>>>(p);
    return cudaGetLastError();
}

/* rows per warp of the direct kernel (zllm-qbench on an H100: at M = 1, F16/BF16 run best with 2 rows, Q4_K/Q5_K
 * with 4) */
template <int T> constexpr int direct_r(int m)
{
    return m == 1 && (T == GGML_F16 || T == GGML_BF16) ? 2 : m <= 2 ? 4 : 2;
}

template <int T, int M>
cudaError_t launch_m(const qgemv_params &p, int variant, cudaStream_t st)
{
    /* the packed kernel on GGUF rows: only where the packed layout is the GGUF one */
    if (variant >= 1000) return has_pk<T>() && !pk_repacked<T>() ? launch_pk_variant<T, M>(p, variant, st)
                                                                  : cudaErrorInvalidValue;
    if (variant == 0) {
        if (has_direct<T>()) variant = 20;
        else variant = M == 1 && p.n_out >= 8192 ? 14 : 10;
    }
    if constexpr (!has_direct<T>()) {   /* the staged kernel exists only where the direct one cannot run */
        if (variant == 10) return launch_staged<T, M, 2>(p, st);
        if (variant == 14 && M == 1) return launch_staged<T, 1, 4>(p, st);
    } else {
        if (variant == 20) return launch_direct<T, M, direct_r<T>(M)>(p, st);
        if (variant == 22 && M == 1) return launch_direct<T, 1, 2>(p, st);
        if (variant == 24 && M == 1) return launch_direct<T, 1, 4>(p, st);
    }
    return cudaErrorInvalidValue;
}

template <int T>
cudaError_t launch_type(const qgemv_params &p, int variant, cudaStream_t st)
{
    switch (p.m) {
    case 1: return launch_m<T, 1>(p, variant, st);
    case 2: return launch_m<T, 2>(p, variant, st);
    case 3: return launch_m<T, 3>(p, variant, st);
    case 4: return launch_m<T, 4>(p, variant, st);
    case 5: return launch_m<T, 5>(p, variant, st);
    case 6: return launch_m<T, 6>(p, variant, st);
    case 7: return launch_m<T, 7>(p, variant, st);
    case 8: return launch_m<T, 8>(p, variant, st);
    default: return cudaErrorInvalidValue;
    }
}

/* the packed layout (qgemv_repack): the packed kernel for its types (variant 0 = its default), else the GGUF
 * kernels on the unchanged rows */
template <int T, int M>
cudaError_t launch_m_packed(const qgemv_params &p, int variant, cudaStream_t st)
{
    /* Q4_K: the direct kernel was faster than the packed one on every 8B shape but n_out = 1024 (K/V, M = 1:
     * packed 3.9 us, direct 6.3 us; gate/up, n_out 14336: direct 21.5 us, packed 23.3 us), so the default picks
     * by n_out alone (both are batch invariant, and the choice does not depend on m) */
    if constexpr (T == GGML_Q4_K)
        if (variant == 0 && p.n_out > 2048) return launch_m<T, M>(p, 0, st);
    /* F16, BF16, Q4_K: the packed form is the GGUF one, so the GGUF kernels' variant codes work too */
    if constexpr (has_pk<T>() && !pk_repacked<T>())
        if (variant != 0 && variant < 1000) return launch_m<T, M>(p, variant, st);
    if constexpr (has_pk<T>()) return launch_pk_variant<T, M>(p, variant, st);
    else return launch_m<T, M>(p, variant, st);
}

template <int T>
cudaError_t launch_type_packed(const qgemv_params &p, int variant, cudaStream_t st)
{
    switch (p.m) {
    case 1: return launch_m_packed<T, 1>(p, variant, st);
    case 2: return launch_m_packed<T, 2>(p, variant, st);
    case 3: return launch_m_packed<T, 3>(p, variant, st);
    case 4: return launch_m_packed<T, 4>(p, variant, st);
    case 5: return launch_m_packed<T, 5>(p, variant, st);
    case 6: return launch_m_packed<T, 6>(p, variant, st);
    case 7: return launch_m_packed<T, 7>(p, variant, st);
    case 8: return launch_m_packed<T, 8>(p, variant, st);
    default: return cudaErrorInvalidValue;
    }
}

int block_of(ggml_type t)
{
    switch (t) {
    case GGML_F16: case GGML_BF16: case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1:
    case GGML_Q8_0: return 32;
    case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: return 256;
    default: return 0;
    }
}

/* 0 when p's shape, batch and pointers meet qgemv_params's rules; fills the default strides into q */
cudaError_t check(const qgemv_params *p, qgemv_params *q)
{
    int blk = block_of(p->type);
    if (!blk || p->m < 1 || p->m > QGEMV_MAX_M || p->n_in < blk || p->n_in % blk || p->n_out < 1 || !p->w ||
        !p->x || !p->y)
        return cudaErrorInvalidValue;
    *q = *p;
    if (!q->ldx) q->ldx = q->n_in;
    if (!q->ldy) q->ldy = q->n_out;
    if (q->ldx < q->n_in || q->ldx % 4 || q->ldy < q->n_out) return cudaErrorInvalidValue;
    int bpb = p->type == GGML_F16 || p->type == GGML_BF16 ? 2 : 0;
    if (!bpb) {
        switch (p->type) {
        case GGML_Q4_0: bpb = 18; break;
        case GGML_Q4_1: bpb = 20; break;
        case GGML_Q5_0: bpb = 22; break;
        case GGML_Q5_1: bpb = 24; break;
        case GGML_Q8_0: bpb = 34; break;
        case GGML_Q4_K: bpb = 144; break;
        case GGML_Q5_K: bpb = 176; break;
        default: bpb = 210; break;
        }
    }
    size_t unit = p->type == GGML_F16 || p->type == GGML_BF16 ? 1 : (size_t)blk;
    if (p->row_bytes != (size_t)p->n_in / unit * (size_t)bpb) return cudaErrorInvalidValue;
    if (((uintptr_t)p->w & 15) || ((uintptr_t)p->x & 15)) return cudaErrorMisalignedAddress;
    return cudaSuccess;
}

cudaError_t dispatch_packed(const qgemv_params &q, int r, cudaStream_t st)
{
    switch (q.type) {
    case GGML_F16:  return launch_type_packed<GGML_F16>(q, r, st);
    case GGML_BF16: return launch_type_packed<GGML_BF16>(q, r, st);
    case GGML_Q4_0: return launch_type_packed<GGML_Q4_0>(q, r, st);
    case GGML_Q4_1: return launch_type_packed<GGML_Q4_1>(q, r, st);
    case GGML_Q5_0: return launch_type_packed<GGML_Q5_0>(q, r, st);
    case GGML_Q5_1: return launch_type_packed<GGML_Q5_1>(q, r, st);
    case GGML_Q8_0: return launch_type_packed<GGML_Q8_0>(q, r, st);
    case GGML_Q4_K: return launch_type_packed<GGML_Q4_K>(q, r, st);
    case GGML_Q5_K: return launch_type_packed<GGML_Q5_K>(q, r, st);
    case GGML_Q6_K: return launch_type_packed<GGML_Q6_K>(q, r, st);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t dispatch(const qgemv_params *p, int r, cudaStream_t st, bool packed = false)
{
    qgemv_params q;
    cudaError_t e = check(p, &q);
    if (e != cudaSuccess) return e;
    if (packed) return dispatch_packed(q, r, st);
    switch (q.type) {
    case GGML_F16:  return launch_type<GGML_F16>(q, r, st);
    case GGML_BF16: return launch_type<GGML_BF16>(q, r, st);
    case GGML_Q4_0: return launch_type<GGML_Q4_0>(q, r, st);
    case GGML_Q4_1: return launch_type<GGML_Q4_1>(q, r, st);
    case GGML_Q5_0: return launch_type<GGML_Q5_0>(q, r, st);
    case GGML_Q5_1: return launch_type<GGML_Q5_1>(q, r, st);
    case GGML_Q8_0: return launch_type<GGML_Q8_0>(q, r, st);
    case GGML_Q4_K: return launch_type<GGML_Q4_K>(q, r, st);
    case GGML_Q5_K: return launch_type<GGML_Q5_K>(q, r, st);
    case GGML_Q6_K: return launch_type<GGML_Q6_K>(q, r, st);
    default: return cudaErrorInvalidValue;
    }
}

/* read-only bandwidth: 4 independent 16-byte loads in flight per thread, grid-stride */
__global__ void __launch_bounds__(256) k_read(const uint4 *__restrict__ buf, size_t n16, float *sink)
{
    uint32_t a = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v0 = __ldcs(buf + i), v1 = __ldcs(buf + i + stride), v2 = __ldcs(buf + i + 2 * stride),
              v3 = __ldcs(buf + i + 3 * stride);
        a ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w ^ v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^
             v3.z ^ v3.w;
    }
    for (; i < n16; i += stride) {
        uint4 v = __ldcs(buf + i);
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    for (int o = 16; o > 0; o >>= 1) a ^= __shfl_xor_sync(0xffffffffu, a, o);
    if (threadIdx.x == 0) sink[blockIdx.x % 4096] = __uint_as_float(a & 0x007fffffu);
}

}   // namespace

extern "C" int qgemv_supported(ggml_type t) { return block_of(t) != 0; }

extern "C" int qgemv_pick(ggml_type t, int m, int n_in, int n_out)
{
    int blk = block_of(t);
    if (!blk || m < 1 || m > QGEMV_MAX_M || n_in < blk || n_in % blk || n_out < 1) return 0;
    /* F16/BF16: from m = 2 on, cuBLAS reads them faster (docs/perf.md); at m = 1 qgemv is within 3-8% of it
     * on large matrices, level on small ones, and takes f32 x (no conversion launch) with the residual fused */
    if (t == GGML_F16 || t == GGML_BF16) return m == 1;
    return 1;
}

extern "C" cudaError_t qgemv_launch(const qgemv_params *p, cudaStream_t st) { return dispatch(p, 0, st); }

extern "C" cudaError_t qgemv_launch_variant(const qgemv_params *p, int variant, cudaStream_t st)
{
    return dispatch(p, variant, st);
}

extern "C" cudaError_t qgemv_read_bench(const void *buf, size_t bytes, float *sink, cudaStream_t st)
{
    if (!buf || !sink || bytes % 16 || ((uintptr_t)buf & 15)) return cudaErrorInvalidValue;
    int dev = 0, sms = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    k_read<<<sms * 8, 256, 0, st>>>((const uint4 *)buf, bytes / 16, sink);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------------------------
 * the packed layout */

namespace {

/* bytes of one GGUF row of n_in elements of type t, 0 for an unsupported type or shape */
size_t row_bytes_of(ggml_type t, int n_in)
{
    const int blk = block_of(t);
    if (!blk || n_in < blk || n_in % blk) return 0;
    switch (t) {
    case GGML_F16: case GGML_BF16: return (size_t)n_in * 2;
    case GGML_Q4_0: return (size_t)n_in / 32 * 18;
    case GGML_Q4_1: return (size_t)n_in / 32 * 20;
    case GGML_Q5_0: return (size_t)n_in / 32 * 22;
    case GGML_Q5_1: return (size_t)n_in / 32 * 24;
    case GGML_Q8_0: return (size_t)n_in / 32 * 34;
    case GGML_Q4_K: return (size_t)n_in / 256 * 144;
    case GGML_Q5_K: return (size_t)n_in / 256 * 176;
    case GGML_Q6_K: return (size_t)n_in / 256 * 210;
    default: return 0;
    }
}

}   // namespace

extern "C" size_t qgemv_repack_bytes(ggml_type t, int n_in, int n_out)
{
    const size_t rb = row_bytes_of(t, n_in);
    return rb && n_out >= 1 ? rb * (size_t)n_out : 0;
}

extern "C" int qgemv_repack_host(ggml_type t, const void *src, void *dst, int n_in, int n_out)
{
    const size_t total = qgemv_repack_bytes(t, n_in, n_out);
    if (!total || !src || !dst) return -1;
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    if (s < d + total && d < s + total) return -1;   /* overlap */
    if (t == GGML_Q8_0 || t == GGML_Q6_K) {
        const size_t bpb = t == GGML_Q8_0 ? 34 : 210, qb = bpb - 2;
        const size_t nb = total / bpb;
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *sb = s + b * bpb;
            if (t == GGML_Q8_0) {
                memcpy(d + b * qb, sb + 2, qb);
                memcpy(d + nb * qb + 2 * b, sb, 2);
            } else {
                memcpy(d + b * qb, sb, qb);
                memcpy(d + nb * qb + 2 * b, sb + 208, 2);
            }
        }
    } else {
        memcpy(d, s, total);
    }
    return 0;
}

extern "C" cudaError_t qgemv_repack(ggml_type t, const void *src, void *dst, int n_in, int n_out, cudaStream_t st)
{
    const size_t total = qgemv_repack_bytes(t, n_in, n_out);
    if (!total || !src || !dst) return cudaErrorInvalidValue;
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    if (s < d + total && d < s + total) return cudaErrorInvalidValue;
    if (t != GGML_Q8_0 && t != GGML_Q6_K) return cudaMemcpyAsync(dst, src, total, cudaMemcpyDeviceToDevice, st);
    const long long nb = (long long)(total / (t == GGML_Q8_0 ? 34 : 210));
    const long long grid = (nb + 255) / 256;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    k_repack<<<(unsigned)grid, 256, 0, st>>>((int)t, s, d, n_in, nb);
    return cudaGetLastError();
}

extern "C" cudaError_t qgemv_launch_packed(const qgemv_params *p, cudaStream_t st) { return dispatch(p, 0, st, true); }

extern "C" cudaError_t qgemv_launch_packed_variant(const qgemv_params *p, int variant, cudaStream_t st)
{
    return dispatch(p, variant, st, true);
}
