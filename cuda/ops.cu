/* cuda/ops.cu: element-wise and row kernels of the CUDA engine (see ops.h). Correct-first versions: one pass
 * per op, grid-stride loops, f32 arithmetic everywhere. Fused forms (ops_qkv_rope_append, the strided SwiGLU)
 * share their arithmetic with the separate kernels through one inline helper each (rope_rotate, silu_mul), so
 * that fusing changes launches, never bits. */
#include <math.h>
#include <string.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops.h"
#include "kv_page.cuh"
#include "cuda_common.h"
#include "pdl.cuh"
#include "act.cuh"
#include "qtc.h"

size_t ops_dtype_size(cu_dtype t) { return t == CU_F32 ? 4 : 2; }
const char *ops_dtype_name(cu_dtype t) { return t == CU_F32 ? "f32" : t == CU_F16 ? "f16" : "bf16"; }

/* element loads and stores through f32 */
__device__ __forceinline__ float ld_f(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld_f(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld_f(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st_f(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_f(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st_f(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
/* st_f of two (st2: at element 2 i2) or four (st4: at element 4 i4) consecutive elements in one store, each
 * converted as by st_f */
__device__ __forceinline__ void st2(float *p, size_t i2, const float *v) {
    reinterpret_cast<float2 *>(p)[i2] = make_float2(v[0], v[1]);
}
__device__ __forceinline__ void st2(__half *p, size_t i2, const float *v) {
    reinterpret_cast<__half2 *>(p)[i2] = __halves2half2(__float2half_rn(v[0]), __float2half_rn(v[1]));
}
__device__ __forceinline__ void st2(__nv_bfloat16 *p, size_t i2, const float *v) {
    reinterpret_cast<__nv_bfloat162 *>(p)[i2] =
        __halves2bfloat162(__float2bfloat16_rn(v[0]), __float2bfloat16_rn(v[1]));
}
__device__ __forceinline__ void st4(float *p, size_t i4, const float *v) {
    reinterpret_cast<float4 *>(p)[i4] = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st4(__half *p, size_t i4, const float *v) {
    __half h[4] = {__float2half_rn(v[0]), __float2half_rn(v[1]), __float2half_rn(v[2]), __float2half_rn(v[3])};
    reinterpret_cast<uint2 *>(p)[i4] = *reinterpret_cast<const uint2 *>(h);
}
__device__ __forceinline__ void st4(__nv_bfloat16 *p, size_t i4, const float *v) {
    __nv_bfloat16 h[4] = {__float2bfloat16_rn(v[0]), __float2bfloat16_rn(v[1]), __float2bfloat16_rn(v[2]),
                          __float2bfloat16_rn(v[3])};
    reinterpret_cast<uint2 *>(p)[i4] = *reinterpret_cast<const uint2 *>(h);
}

/* calls f with a typed null pointer for the dtype, so a launcher can instantiate its kernel per type */
template <typename F> static void with_type(cu_dtype t, F f) {
    if (t == CU_F32) f((float *)0);
    else if (t == CU_F16) f((__half *)0);
    else f((__nv_bfloat16 *)0);
}

static int grid_for(size_t n, int block) {
    size_t g = (n + block - 1) / block;
    return (int)(g > 65535u * 8 ? 65535u * 8 : (g ? g : 1));
}

/* ---------------------------------------------------------------- embedding gather */
/* row r's token; a fed row (negative id) reads its slot's carried id, and thread 0 moves the carried generator
 * state into the entry's sampling state (ops_feed) */
__device__ __forceinline__ int embed_token(const int32_t *tokens, const ops_feed &fd, int r) {
    int t = tokens[r];
    if (t < 0) {
        if (!fd.carry_tok) return 0;
        const int s = fd.slot[r];
        t = fd.carry_tok[s];
        if (threadIdx.x == 0) fd.rng[r] = fd.carry_rng[s];
    }
    return t;
}

template <typename T>
__global__ void k_embed(const T *table, int dim, const int32_t *tokens, float *out, ops_feed fd) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int r = blockIdx.x;
    const T *row = table + (size_t)embed_token(tokens, fd, r) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)r * dim + i] = ld_f(row, i);
}

/* k_embed for 16-bit tables with rows of a multiple of 8 elements: 8 elements (one 16-byte load) per thread, so
 * that a row is one round trip to memory (the loop above issues its 2-byte loads a few at a time: ~9 us for a
 * 4096-wide row at the start of every step, H100) */
template <typename T>
__global__ void k_embed8(const T *table, int dim, const int32_t *tokens, float *out, ops_feed fd) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int r = blockIdx.x;
    const uint4 *row = reinterpret_cast<const uint4 *>(table + (size_t)embed_token(tokens, fd, r) * dim);
    for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) {
        const uint4 v = row[i];
        const T *e = reinterpret_cast<const T *>(&v);
        float4 *o = reinterpret_cast<float4 *>(out + (size_t)r * dim + 8 * (size_t)i);
        o[0] = make_float4(ld_f(e, 0), ld_f(e, 1), ld_f(e, 2), ld_f(e, 3));
        o[1] = make_float4(ld_f(e, 4), ld_f(e, 5), ld_f(e, 6), ld_f(e, 7));
    }
}

int ops_embed(const void *table, cu_dtype tdt, int dim, const int32_t *tokens, int n_rows, float *out,
              const ops_feed *fdp, cudaStream_t st, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    ops_feed fd;
    memset(&fd, 0, sizeof fd);
    if (fdp) fd = *fdp;
    if (fd.carry_tok && (!fd.slot || !fd.carry_rng || !fd.rng)) {
        snprintf(err, errlen, "ops_embed: incomplete feed arguments");
        return -1;
    }
    cudaError_t le = cudaSuccess;
    const bool vec = tdt != CU_F32 && dim % 8 == 0 && ((uintptr_t)table & 15) == 0 && ((uintptr_t)out & 15) == 0;
    with_type(tdt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        if constexpr (sizeof(T) == 2) {
            if (vec) {
                const int th = dim / 8 < 512 ? (dim / 8 + 31) / 32 * 32 : 512;
                le = cu_launch(k_embed8<T>, n_rows, th, 0, st, (const T *)table, dim, tokens, out, fd);
                return;
            }
        }
        le = cu_launch(k_embed<T>, n_rows, 256, 0, st, (const T *)table, dim, tokens, out, fd);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_embed", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_embed");
    return 0;
}

/* ---------------------------------------------------------------- RMSNorm */
/* block-wide sum of one float per thread; blockDim.x a multiple of 32, at most 1024 */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();   /* part[] may still be read by a previous call */
    if (l == 0) part[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += part[i];   /* same order in every thread: identical result everywhere */
    return s;
}

template <typename T>
__global__ void k_rmsnorm(const float *x, const int32_t *rows, const float *w, int dim, float eps, T *out) {
    const int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) st_f(out, (size_t)r * dim + i, xr[i] * scale * w[i]);
}

/* the RMSNorm block size for rows of dim elements (part of the reduction order; one rule for ops_rmsnorm and
 * ops_rmsnorm_dual, whose outputs the checks compare bit for bit). Blocks of kNormThreads (512) threads: at batch 1 the norm is one block on the critical path
 * between two matrix products, and it can only start once an SM has room for it. 512 threads of ~56 registers
 * fit beside a running Q8_0 output projection's CTA (1024 did not: they waited for one to exit), and beside a CTA
 * of every other qtc product that holds half an SM; measured faster than 1024 (and 256, 16 elements a thread,
 * slower than 1024) on the 8B decode step (docs/cuda.md). */
static constexpr int kNormThreads = 512;
static int s_norm_block(int dim) {
    const int b = dim >= kNormThreads ? kNormThreads : dim >= 256 ? 256 : 64;
    /* rows wider than 8 elements a thread: a larger block (up to 1024), so that ops_rmsnorm_dual keeps its
     * 8-register form (k_rmsnorm_dual_r<T, 8>) as it had with 1024 threads */
    if (dim > 8 * b) {
        const int w = ((dim + 7) / 8 + 31) / 32 * 32;
        return w < 1024 ? w : 1024;
    }
    return b;
}

int ops_rmsnorm(const float *x, const int32_t *rows, const float *w, int dim, float eps, int n_rows,
                void *out, cu_dtype odt, cudaStream_t st, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    const int block = s_norm_block(dim);
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        k_rmsnorm<T><<<n_rows, block, 0, st>>>(x, rows, w, dim, eps, (T *)out);
    });
    CU_LAUNCH_CHECK_RET("ops_rmsnorm");
    return 0;
}

/* ---------------------------------------------------------------- per-head RMSNorm */
/* block (row, head) of 32 threads, blockIdx.x = row, blockIdx.y = head (any row count launches): lane i sums
 * elements i, i + 32, ...; then a butterfly over the warp */
__global__ void k_head_rmsnorm(float *x, int ld, int head_dim, const float *w, float eps) {
    float *v = x + (size_t)blockIdx.x * ld + (size_t)blockIdx.y * head_dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += 32) ss += v[i] * v[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += 32) v[i] = v[i] * scale * w[i];
}

int ops_head_rmsnorm(float *x, int ld, int n_rows, int n_heads, int head_dim, const float *w, float eps,
                     cudaStream_t st, char *err, size_t errlen) {
    if (n_rows <= 0 || n_heads <= 0) return 0;
    if (n_heads > 65535) {
        snprintf(err, errlen, "ops_head_rmsnorm: %d heads (at most 65535)", n_heads);
        return -1;
    }
    k_head_rmsnorm<<<dim3(n_rows, n_heads), 32, 0, st>>>(x, ld, head_dim, w, eps);
    CU_LAUNCH_CHECK_RET("ops_head_rmsnorm");
    return 0;
}

/* ---------------------------------------------------------------- bias */
__global__ void k_bias_add(float *y, const float *b, size_t total, int n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

int ops_bias_add(float *y, const float *b, int n_rows, int n, cudaStream_t st, char *err, size_t errlen) {
    const size_t total = (size_t)n_rows * n;
    if (!total) return 0;
    k_bias_add<<<grid_for(total, 256), 256, 0, st>>>(y, b, total, n);
    CU_LAUNCH_CHECK_RET("ops_bias_add");
    return 0;
}

/* ---------------------------------------------------------------- RoPE */
void ops_rope_table_host(float *cs, int n_pos, int rope_dim, double base) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const double inv = pow(base, -2.0 * i / (double)rope_dim);
        for (int p = 0; p < n_pos; p++) {
            const double a = (double)p * inv;
            cs[((size_t)p * half + i) * 2] = (float)cos(a);
            cs[((size_t)p * half + i) * 2 + 1] = (float)sin(a);
        }
    }
}

/* the rotation of one pair by (cos, sin) = (c.x, c.y): y0 = x0 cos - x1 sin, y1 = x0 sin + x1 cos, the ONE
 * definition every RoPE kernel uses. The roundings are spelled out with intrinsics (which nvcc never contracts
 * or reorders) so that k_rope and k_qkv_rope_append give the same bits whatever their surroundings; they are the
 * ones nvcc 13.0 chose for the plain expressions on sm_90 (one FMUL and one FFMA per output, as read from the
 * SASS), so the values are those of the earlier k_rope. */
__device__ __forceinline__ void rope_rotate(float x0, float x1, float2 c, float *y0, float *y1) {
    *y0 = __fmaf_rn(x0, c.x, -__fmul_rn(x1, c.y));
    *y1 = __fmaf_rn(x0, c.y, __fmul_rn(x1, c.x));
}

__global__ void k_rope(float *x, const int32_t *pos, int n_rows, int n_heads, int head_dim, int rope_dim, int style,
                       const float2 *cs) {
    const int half = rope_dim / 2;
    const size_t total = (size_t)n_rows * n_heads * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const size_t rh = t / half;
        const int r = (int)(rh / n_heads), h = (int)(rh % n_heads);
        float *hp = x + (size_t)r * n_heads * head_dim + (size_t)h * head_dim;
        const float2 c = cs[(size_t)pos[r] * half + i];
        const int a = style == 0 ? 2 * i : i, b = style == 0 ? 2 * i + 1 : i + half;
        float y0, y1;
        rope_rotate(hp[a], hp[b], c, &y0, &y1);
        hp[a] = y0;
        hp[b] = y1;
    }
}

int ops_rope(float *x, const int32_t *pos, int n_rows, int n_heads, int head_dim, int rope_dim, int style,
             const float *cs, cudaStream_t st, char *err, size_t errlen) {
    const size_t total = (size_t)n_rows * n_heads * (rope_dim / 2);
    if (!total) return 0;
    k_rope<<<grid_for(total, 256), 256, 0, st>>>(x, pos, n_rows, n_heads, head_dim, rope_dim, style,
                                                 (const float2 *)cs);
    CU_LAUNCH_CHECK_RET("ops_rope");
    return 0;
}

/* ---------------------------------------------------------------- KV append */
template <typename T>
__global__ void k_kv_append(const float *k, const float *v, const int32_t *slot, const int32_t *pos, int n_rows,
                            int kv_dim, int n_ctx, T *kc, T *vc) {
    const size_t total = (size_t)n_rows * kv_dim;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(t / kv_dim), i = (int)(t % kv_dim);
        const size_t dst = ((size_t)slot[r] * n_ctx + pos[r]) * kv_dim + i;
        st_f(kc, dst, k[t]);
        st_f(vc, dst, v[t]);
    }
}

int ops_kv_append(const float *k, const float *v, const int32_t *slot, const int32_t *pos, int n_rows, int kv_dim,
                  int n_ctx, void *kc, void *vc, cu_dtype kvdt, cudaStream_t st, char *err, size_t errlen) {
    const size_t total = (size_t)n_rows * kv_dim;
    if (!total) return 0;
    with_type(kvdt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        k_kv_append<T><<<grid_for(total, 256), 256, 0, st>>>(k, v, slot, pos, n_rows, kv_dim, n_ctx, (T *)kc,
                                                             (T *)vc);
    });
    CU_LAUNCH_CHECK_RET("ops_kv_append");
    return 0;
}

/* ---------------------------------------------------------------- fused bias + RoPE + KV append */
/* qkv's N elements (1, 2 or 4; aligned to N) from column col of row r into o: the products, or with a.part the
 * sum of their split partials in split order (qtc_merge_kernel's operations), every plane's load issued first */
template <int N> __device__ __forceinline__ void qkv_get(const ops_qkv_args &a, int r, int col, float *o) {
    using V = typename std::conditional<N == 4, float4, typename std::conditional<N == 2, float2, float>::type>::type;
    static_assert(sizeof(V) == 4 * N, "one vector of N floats");
    const size_t e = (size_t)r * a.ld + col;
    if (!a.part) {
        const V v = *reinterpret_cast<const V *>(a.qkv + e);
        memcpy(o, &v, sizeof v);
        return;
    }
    const size_t np = (size_t)a.n_rows * a.ld;
    float t[8][N];
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < a.ks) {
            const V v = *reinterpret_cast<const V *>(a.part + k * np + e);
            memcpy(t[k], &v, sizeof v);
        }
#pragma unroll
    for (int i = 0; i < N; i++) {
        float v = t[0][i];
#pragma unroll
        for (int k = 1; k < 8; k++)
            if (k < a.ks) v += t[k][i];
        o[i] = v;
    }
}

/* One block row (blockIdx.x) per token row, blockIdx.y chunks of its work items: first, per head of q then of k
 * (adjacent in qkv: k's heads follow q's), `head_dim - half` items: the half RoPE pairs, then the head_dim -
 * 2 * half dims RoPE leaves alone; then the kv_dim elements of v. Each item reads its qkv element(s), adds the
 * bias with one f32 add (__fadd_rn: the value ops_bias_add stores; never contracted into another operation),
 * rotates with rope_rotate (k_rope's expression) and stores f32 (q) or through st_f (caches, ops_kv_append's
 * conversion). */
template <typename T>
__global__ void k_qkv_rope_append(ops_qkv_args a, T *kc, T *vc) {
    pdl_trigger();
    const int r = blockIdx.x, t = blockIdx.y * blockDim.x + threadIdx.x;
    const int hd = a.head_dim, half = a.rope_dim / 2, per_head = hd - half;
    const int qd = a.n_heads * hd, kvd = a.n_kv_heads * hd, n_rope = (a.n_heads + a.n_kv_heads) * per_head;
    /* pos_pre: the row's position, slot and RoPE pair (cos, sin) before the wait (host-written inputs and a
     * table written once: two dependent L2 round trips off a batch-1 layer's critical path) */
    const int jr = t < n_rope ? t % per_head : 0;
    int pr = 0, sr = 0;
    float2 cr = make_float2(0.f, 0.f);
    if (a.pos_pre) {
        pr = a.pos[r]; sr = a.slot[r];
        if (t < n_rope && jr < half) cr = ((const float2 *)a.cs)[(size_t)pr * half + jr];
    }
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): before it only the pos_pre reads */
    if (t >= n_rope + kvd) return;
    if (!a.pos_pre) {
        pr = a.pos[r]; sr = a.slot[r];
        if (t < n_rope && jr < half) cr = ((const float2 *)a.cs)[(size_t)pr * half + jr];
    }
    /* ops_kv_append's destination row; paged KV: row pr % kv_block of block blocks[sr + pr / kv_block] */
    const size_t cell = (size_t)kv_page_row(a.blocks, a.kv_block_log2, sr, a.n_ctx, pr) * kvd;
    if (t >= n_rope) {   /* v */
        const int i = t - n_rope;
        float v;
        qkv_get<1>(a, r, qd + kvd + i, &v);
        if (a.bv) v = __fadd_rn(v, a.bv[i]);
        st_f(vc, cell + i, v);
        return;
    }
    const int h = t / per_head, j = t % per_head, is_k = h >= a.n_heads;
    const int hk = h - a.n_heads;   /* k head, when is_k */
    const int c0 = h * hd;          /* q head h, or k head hk (k starts at qd = n_heads * hd) */
    const float *b = is_k ? (a.bk ? a.bk + (size_t)hk * hd : NULL) : (a.bq ? a.bq + (size_t)h * hd : NULL);
    int e[2], n_e = 1;
    float y[2];
    if (j < half) {   /* a RoPE pair */
        e[0] = a.style == 0 ? 2 * j : j;
        e[1] = a.style == 0 ? 2 * j + 1 : j + half;
        float x0, x1;
        qkv_get<1>(a, r, c0 + e[0], &x0);
        qkv_get<1>(a, r, c0 + e[1], &x1);
        if (b) { x0 = __fadd_rn(x0, b[e[0]]); x1 = __fadd_rn(x1, b[e[1]]); }
        rope_rotate(x0, x1, cr, &y[0], &y[1]);
        n_e = 2;
    } else {          /* a dim past the rotated ones */
        e[0] = 2 * half + (j - half);
        qkv_get<1>(a, r, c0 + e[0], &y[0]);
        if (b) y[0] = __fadd_rn(y[0], b[e[0]]);
    }
    for (int u = 0; u < n_e; u++) {
        if (is_k) st_f(kc, cell + (size_t)hk * hd + e[u], y[u]);
        else a.q[(size_t)r * qd + (size_t)h * hd + e[u]] = y[u];
    }
}

/* k_qkv_rope_append with four elements a thread, for shapes whose rows split into aligned 16-byte pieces
 * (s_rope4_fits): per head of q then of k, half / 2 items of two RoPE pairs (style 0: elements 4 j .. 4 j + 3;
 * style 1: 2 j, 2 j + 1 and half + 2 j, half + 2 j + 1) and (head_dim - 2 * half) / 4 items of four unrotated
 * dims; then kv_dim / 4 items of four v elements. Every element is computed by k_qkv_rope_append's expressions
 * (the same bias add, rope_rotate, conversion): the same bits; only the loads and stores are wider. */
template <typename T> __global__ void k_qkv_rope_append4(ops_qkv_args a, T *kc, T *vc) {
    pdl_trigger();
    const int r = blockIdx.x, t = blockIdx.y * blockDim.x + threadIdx.x;
    const int hd = a.head_dim, half = a.rope_dim / 2, pu = half / 2, per_head = pu + (hd - 2 * half) / 4;
    const int qd = a.n_heads * hd, kvd = a.n_kv_heads * hd, n_rope = (a.n_heads + a.n_kv_heads) * per_head;
    /* pos_pre: as in k_qkv_rope_append; the item's two (cos, sin) pairs in one 16-byte read */
    const int jr = t < n_rope ? t % per_head : 0;
    int pr = 0, sr = 0;
    float4 cr = make_float4(0.f, 0.f, 0.f, 0.f);
    if (a.pos_pre) {
        pr = a.pos[r];
        sr = a.slot[r];
        if (t < n_rope && jr < pu) cr = ((const float4 *)a.cs)[(size_t)pr * pu + jr];
    }
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): before it only the pos_pre reads */
    if (t >= n_rope + kvd / 4) return;
    if (!a.pos_pre) {
        pr = a.pos[r];
        sr = a.slot[r];
        if (t < n_rope && jr < pu) cr = ((const float4 *)a.cs)[(size_t)pr * pu + jr];
    }
    const size_t cell = (size_t)kv_page_row(a.blocks, a.kv_block_log2, sr, a.n_ctx, pr) * kvd;
    float y[4];
    if (t >= n_rope) { /* v */
        const int i = (t - n_rope) * 4;
        qkv_get<4>(a, r, qd + kvd + i, y);
        if (a.bv)
            for (int e = 0; e < 4; e++) y[e] = __fadd_rn(y[e], a.bv[i + e]);
        st4(vc, (cell + i) / 4, y);
        return;
    }
    const int h = t / per_head, j = t % per_head, is_k = h >= a.n_heads;
    const int hk = h - a.n_heads; /* k head, when is_k */
    const int c0 = h * hd;
    const float *b = is_k ? (a.bk ? a.bk + (size_t)hk * hd : NULL) : (a.bq ? a.bq + (size_t)h * hd : NULL);
    T *kdst = kc + cell + (size_t)hk * hd; /* k head hk's cache row */
    float *qdst = a.q + (size_t)r * qd + (size_t)h * hd;
    if (j < pu && a.style == 1) { /* pairs (2 j, half + 2 j) and (2 j + 1, half + 2 j + 1) */
        float lo[2], hi[2];
        qkv_get<2>(a, r, c0 + 2 * j, lo);
        qkv_get<2>(a, r, c0 + half + 2 * j, hi);
        float x[4] = {lo[0], hi[0], lo[1], hi[1]}; /* pair 2 j: x[0], x[1]; pair 2 j + 1: x[2], x[3] */
        if (b) {
            x[0] = __fadd_rn(x[0], b[2 * j]);
            x[1] = __fadd_rn(x[1], b[half + 2 * j]);
            x[2] = __fadd_rn(x[2], b[2 * j + 1]);
            x[3] = __fadd_rn(x[3], b[half + 2 * j + 1]);
        }
        float p0[2], p1[2];
        rope_rotate(x[0], x[1], make_float2(cr.x, cr.y), &p0[0], &p0[1]);
        rope_rotate(x[2], x[3], make_float2(cr.z, cr.w), &p1[0], &p1[1]);
        const float ylo[2] = {p0[0], p1[0]}, yhi[2] = {p0[1], p1[1]};
        if (is_k) {
            st2(kdst, j, ylo);
            st2(kdst, half / 2 + j, yhi);
        } else {
            st2(qdst, j, ylo);
            st2(qdst, half / 2 + j, yhi);
        }
        return;
    }
    /* style 0 pairs (4 j, 4 j + 1), (4 j + 2, 4 j + 3), or four dims past the rotated ones */
    const int e0 = j < pu ? 4 * j : 2 * half + 4 * (j - pu);
    float x[4];
    qkv_get<4>(a, r, c0 + e0, x);
    if (b)
        for (int e = 0; e < 4; e++) x[e] = __fadd_rn(x[e], b[e0 + e]);
    if (j < pu) {
        rope_rotate(x[0], x[1], make_float2(cr.x, cr.y), &y[0], &y[1]);
        rope_rotate(x[2], x[3], make_float2(cr.z, cr.w), &y[2], &y[3]);
    } else {
        for (int e = 0; e < 4; e++) y[e] = x[e];
    }
    if (is_k) st4(kdst, e0 / 4, y);
    else st4(qdst, e0 / 4, y);
}

/* 1 when k_qkv_rope_append4 serves a: the pieces it reads and writes are whole and aligned (16 bytes of qkv and
 * q, 8 of the caches at 16-bit types) */
static int s_rope4_fits(const ops_qkv_args *a) {
    const int hd = a->head_dim, half = a->rope_dim / 2;
    return half % 2 == 0 && (hd - 2 * half) % 4 == 0 && hd % 4 == 0 && a->ld % 4 == 0 &&
           ((uintptr_t)(a->part ? a->part : a->qkv) & 15) == 0 && ((uintptr_t)a->q & 15) == 0 &&
           ((uintptr_t)a->kc & 15) == 0 && ((uintptr_t)a->vc & 15) == 0 && ((uintptr_t)a->cs & 15) == 0;
}

int ops_qkv_rope_append(const ops_qkv_args *a, cudaStream_t st, char *err, size_t errlen) {
    if (a->n_rows <= 0) return 0;
    const int hd = a->head_dim, per_head = hd - a->rope_dim / 2, wide = s_rope4_fits(a);
    const long long items = wide
                                ? (long long)(a->n_heads + a->n_kv_heads) * (a->rope_dim / 4 + (hd - a->rope_dim) / 4) +
                                      (long long)a->n_kv_heads * hd / 4
                                : (long long)(a->n_heads + a->n_kv_heads) * per_head + (long long)a->n_kv_heads * hd;
    const long long chunks = (items + 255) / 256;
    if (chunks > 65535 || a->rope_dim > hd || a->ld < (a->n_heads + 2 * a->n_kv_heads) * hd ||
        (a->blocks && (a->kv_block_log2 < 0 || a->kv_block_log2 > 8))) {
        snprintf(err, errlen, "ops_qkv_rope_append: unsupported shape (%d + 2 x %d heads of %d, rope %d, ld %d)",
                 a->n_heads, a->n_kv_heads, hd, a->rope_dim, a->ld);
        return -1;
    }
    if (a->part && (a->ks < 2 || a->ks > 8)) {
        snprintf(err, errlen, "ops_qkv_rope_append: %d split partials (2 to 8)", a->ks);
        return -1;
    }
    const dim3 grid((unsigned)a->n_rows, (unsigned)chunks);
    cudaError_t le = cudaSuccess;
    with_type(a->kvdt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        le = wide ? cu_launch(k_qkv_rope_append4<T>, grid, 256, 0, st, *a, (T *)a->kc, (T *)a->vc)
                  : cu_launch(k_qkv_rope_append<T>, grid, 256, 0, st, *a, (T *)a->kc, (T *)a->vc);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_qkv_rope_append", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_qkv_rope_append");
    return 0;
}

/* ---------------------------------------------------------------- SwiGLU, residual, conversion */
/* silu_mul (cuda/act.cuh): the one expression every SwiGLU kernel uses (same bits whatever the kernel's layout,
 * wtc's fused epilogue included) */

template <typename T>
__global__ void k_swiglu(const float *g, const float *u, size_t total, T *out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        st_f(out, i, silu_mul(g[i], u[i]));
    }
}

int ops_swiglu(const float *gate, const float *up, int n_rows, int n, void *out, cu_dtype odt, cudaStream_t st,
               char *err, size_t errlen) {
    const size_t total = (size_t)n_rows * n;
    if (!total) return 0;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        k_swiglu<T><<<grid_for(total, 256), 256, 0, st>>>(gate, up, total, (T *)out);
    });
    CU_LAUNCH_CHECK_RET("ops_swiglu");
    return 0;
}

__global__ void k_residual_add(float *x, const float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

int ops_residual_add(float *x, const float *y, size_t n, cudaStream_t st, char *err, size_t errlen) {
    if (!n) return 0;
    k_residual_add<<<grid_for(n, 256), 256, 0, st>>>(x, y, n);
    CU_LAUNCH_CHECK_RET("ops_residual_add");
    return 0;
}

template <typename S, typename D>
__global__ void k_convert(const S *src, D *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st_f(dst, i, ld_f(src, i));
}

int ops_convert(const void *src, cu_dtype sdt, void *dst, cu_dtype ddt, size_t n, cudaStream_t st, char *err,
                size_t errlen) {
    if (!n) return 0;
    with_type(sdt, [&](auto *sp) {
        using S = typename std::remove_pointer<decltype(sp)>::type;
        with_type(ddt, [&](auto *dp) {
            using D = typename std::remove_pointer<decltype(dp)>::type;
            k_convert<S, D><<<grid_for(n, 256), 256, 0, st>>>((const S *)src, (D *)dst, n);
        });
    });
    CU_LAUNCH_CHECK_RET("ops_convert");
    return 0;
}

/* ---------------------------------------------------------------- matrix product */
int ops_gemm(cublasHandle_t h, const void *x, const void *w, cu_dtype dt, int n_rows, int n_in, int n_out,
             float *y, int ldy, float beta, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    if (ldy == 0) ldy = n_out;
    const float alpha = 1.0f;
    const cudaDataType_t ct = dt == CU_F32 ? CUDA_R_32F : dt == CU_F16 ? CUDA_R_16F : CUDA_R_16BF;
    /* column-major view: Y^T [n_out x n_rows] (leading dimension ldy) = W (seen as n_in x n_out, transposed) x
     * X^T [n_in x n_rows] */
    CUBLAS_CHECK_RET(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_rows, n_in, &alpha, w, ct, n_in, x, ct, n_in,
                                  &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---------------------------------------------------------------- dual-output variants (ops.h) */
__device__ __forceinline__ float rnd_f(const float *, float v) { return v; }
__device__ __forceinline__ float rnd_f(const __half *, float v) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float rnd_f(const __nv_bfloat16 *, float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}
template <typename T>
__device__ __forceinline__ void st_dual(T *out, float *outf, int round_f, size_t i, float v) {
    if (out) st_f(out, i, v);
    if (outf) outf[i] = round_f ? rnd_f((const T *)0, v) : v;
}

template <typename T>
__global__ void k_rmsnorm_dual(const float *x, const int32_t *rows, const float *w, int dim, float eps, T *out,
                               float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) st_dual(out, outf, round_f, (size_t)r * dim + i, xr[i] * scale * w[i]);
}

/* k_rmsnorm_dual for rows of at most V x blockDim.x elements, the same operations in the same order per thread:
 * the weights are read into registers before pdl_wait (written once, at load), the row once after it, and both
 * stay in registers for the second pass. At batch 1 the norm is one block between two matrix products on the
 * critical path, so its latency is what counts. */
/* LAY: where element i of row r goes (the same values, another place): 0 at r dim + i; 1 at its position in qtc's
 * 16-bit k order (qtc_kpos within each 256-element unit; dim a multiple of 256); 2 at its place in qtc's wgmma
 * images of nx columns (qtc_ximage_pos; dim a multiple of 256; F16 only), through ximage_store */
enum { LAY_ROWS = 0, LAY_KPERM = 1, LAY_XIMAGE = 2 };
template <int LAY> __device__ __forceinline__ size_t lay_pos(int r, int dim, int i) {
    if (LAY == LAY_KPERM) return (size_t)r * dim + (i & ~255) + qtc_kpos(i & 255);
    return (size_t)r * dim + i;
}
/* Row r's f16 values, held in shared memory (h: its units [u0, u0 + nu) of 256 elements, from h's start), stored as
 * qtc's wgmma images of nx columns (qtc_ximage_pos) of a row of `units` units: 16-byte chunk c of a unit holds its
 * 4-byte words c, 32 + c, 64 + c and 96 + c (each thread reads them from 4 banks that differ across a warp), and a
 * warp's 32 chunks of a unit fill four 128-byte runs of the image (its 4 k tiles of column r). The caller
 * synchronizes the threads that wrote h before. */
__device__ __forceinline__ void ximage_store(const __half *h, int u0, int nu, int units, int r, int nx, __half *out) {
    const uint32_t *hw = (const uint32_t *)h;
    const int b = r / nx, n = r % nx;
    uint8_t *base = (uint8_t *)out + (size_t)n * 128;
    for (int q = threadIdx.x; q < nu * 32; q += blockDim.x) {
        const int uu = q >> 5, c = q & 31, u = u0 + uu;
        uint4 v;
        v.x = hw[uu * 128 + c];
        v.y = hw[uu * 128 + 32 + c];
        v.z = hw[uu * 128 + 64 + c];
        v.w = hw[uu * 128 + 96 + c];
        *(uint4 *)(base + (((size_t)b * units + u) * 4 + (c >> 3)) * (size_t)nx * 128 + (((c & 7) ^ (n & 7)) << 4)) = v;
    }
}
/* a merge before the norm (ops_rmsnorm_merge): ks planes of split partials [ks][n_rows][dim], ks <= KS_MAX, summed in
 * split order and added to x, which takes the sum (xo: x itself) */
enum { KS_MAX = 8 };
struct norm_merge {
    const float *part;
    int ks;
    float *xo;
};
/* MG: with a merge (mg); its partials held in registers (KS_MAX V floats a thread: blocks of at most 512 threads) */
template <typename T, int V, int LAY = LAY_ROWS, bool MG = false>
__global__ void k_rmsnorm_dual_r(const float *x, const int32_t *rows, const float *w, int dim, float eps, T *out,
                                 float *outf, int round_f, int nx, norm_merge mg) {
    float wv[V], xv[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < dim ? w[i] : 0.f;
    }
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): only the weights read before */
    const int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * dim;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < dim ? xr[i] : 0.f;
    }
    /* with a merge: x = ((p0 + p1) + ...) + x, qtc_merge_kernel's operations; every load issued before the sums */
    if constexpr (MG) {
        const size_t np = (size_t)gridDim.x * dim;
        float pv[KS_MAX][V];
#pragma unroll
        for (int k = 0; k < KS_MAX; k++)
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int i = threadIdx.x + j * blockDim.x;
                pv[k][j] = k < mg.ks && i < dim ? mg.part[k * np + (size_t)r * dim + i] : 0.f;
            }
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            float v = pv[0][j];
#pragma unroll
            for (int k = 1; k < KS_MAX; k++)
                if (k < mg.ks) v += pv[k][j];
            xv[j] = v + xv[j];
            if (i < dim) mg.xo[(size_t)r * dim + i] = xv[j];
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < V; j++)
        if (threadIdx.x + j * blockDim.x < dim) ss += xv[j] * xv[j];
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    if constexpr (LAY == LAY_XIMAGE) { /* the row in shared memory, then its image chunks */
        __shared__ __half h[8 * 1024]; /* dim <= V blockDim.x <= 8 x 1024 (ops_rmsnorm_kperm_serves) */
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < dim) st_f(h, i, xv[j] * scale * wv[j]);
        }
        __syncthreads();
        ximage_store(h, 0, dim >> 8, dim >> 8, r, nx, (__half *)out);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < dim) st_dual(out, outf, round_f, lay_pos<LAY>(r, dim, i), xv[j] * scale * wv[j]);
        }
    }
}

int ops_rmsnorm_dual(const float *x, const int32_t *rows, const float *w, int dim, float eps, int n_rows,
                     void *out, cu_dtype odt, float *outf, int round_f, cudaStream_t st, char *err, size_t errlen) {
    if (n_rows <= 0 || (!out && !outf)) return 0;
    const int block = s_norm_block(dim);   /* the same rule as ops_rmsnorm */
    cudaError_t le = cudaSuccess;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        if (dim <= 8 * block)
            le = cu_launch(k_rmsnorm_dual_r<T, 8>, n_rows, block, 0, st, x, rows, w, dim, eps, (T *)out, outf, round_f,
                           0, norm_merge{});
        else
            le = cu_launch(k_rmsnorm_dual<T>, n_rows, block, 0, st, x, rows, w, dim, eps, (T *)out, outf, round_f);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_rmsnorm_dual", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_rmsnorm_dual");
    return 0;
}

int ops_rmsnorm_kperm_serves(int dim, cu_dtype odt) {
    return dim > 0 && dim % 256 == 0 && dim <= 8 * s_norm_block(dim) && (odt == CU_F16 || odt == CU_BF16);
}

int ops_rmsnorm_merge_serves(int dim, cu_dtype odt) {
    return ops_rmsnorm_kperm_serves(dim, odt) && s_norm_block(dim) <= 512;
}

/* ops_rmsnorm_kperm (lay 1), ops_rmsnorm_ximage (lay nx > 1) and ops_rmsnorm_merge (any lay, with mg.part) */
static int s_rmsnorm_lay(const char *fn, const float *x, const float *w, int dim, float eps, int n_rows, void *out,
                         cu_dtype odt, int lay, norm_merge mg, cudaStream_t st, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    const int block = s_norm_block(dim); /* the same rule as ops_rmsnorm_dual: the same sums */
    if (!ops_rmsnorm_kperm_serves(dim, odt) || (lay > 1 && odt != CU_F16)) {
        snprintf(err, errlen, "%s: unsupported row (%d elements of %s)", fn, dim, ops_dtype_name(odt));
        return -1;
    }
    if (lay < 0 || (lay > 1 && lay != 32 && lay != 64 && lay != 128)) {
        snprintf(err, errlen, "%s: layout %d (0 rows, 1 k order, images of 32, 64 or 128 columns)", fn, lay);
        return -1;
    }
    if (lay == 0 && !mg.part) {
        snprintf(err, errlen, "%s: rows without a merge", fn);
        return -1;
    }
    if (mg.part && !ops_rmsnorm_merge_serves(dim, odt)) {
        snprintf(err, errlen, "%s: rows of %d elements with split partials (at most 4,096)", fn, dim);
        return -1;
    }
    if (mg.part && (mg.ks < 2 || mg.ks > KS_MAX || !mg.xo)) {
        snprintf(err, errlen, "%s: %d split partials (2 to %d, and x to write)", fn, mg.ks, (int)KS_MAX);
        return -1;
    }
    cudaError_t le = cudaSuccess;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        const int32_t *rows = NULL;
        if (lay > 1)
            le = mg.part ? cu_launch(k_rmsnorm_dual_r<T, 8, LAY_XIMAGE, true>, n_rows, block, 0, st, x, rows, w, dim,
                                     eps, (T *)out, (float *)NULL, 0, lay, mg)
                         : cu_launch(k_rmsnorm_dual_r<T, 8, LAY_XIMAGE>, n_rows, block, 0, st, x, rows, w, dim, eps,
                                     (T *)out, (float *)NULL, 0, lay, mg);
        else if (lay == 1)
            le = mg.part ? cu_launch(k_rmsnorm_dual_r<T, 8, LAY_KPERM, true>, n_rows, block, 0, st, x, rows, w, dim,
                                     eps, (T *)out, (float *)NULL, 0, 0, mg)
                         : cu_launch(k_rmsnorm_dual_r<T, 8, LAY_KPERM>, n_rows, block, 0, st, x, rows, w, dim, eps,
                                     (T *)out, (float *)NULL, 0, 0, mg);
        else
            le = cu_launch(k_rmsnorm_dual_r<T, 8, LAY_ROWS, true>, n_rows, block, 0, st, x, rows, w, dim, eps, (T *)out,
                           (float *)NULL, 1, 0, mg);
    });
    if (le != cudaSuccess) {
        snprintf(err, errlen, "%s: launch failed: %s", fn, cudaGetErrorString(le));
        return -1;
    }
    CU_LAUNCH_CHECK_RET(fn);
    return 0;
}

int ops_rmsnorm_kperm(const float *x, const float *w, int dim, float eps, int n_rows, void *out, cu_dtype odt,
                      cudaStream_t st, char *err, size_t errlen) {
    return s_rmsnorm_lay("ops_rmsnorm_kperm", x, w, dim, eps, n_rows, out, odt, 1, norm_merge{}, st, err, errlen);
}

int ops_rmsnorm_ximage(const float *x, const float *w, int dim, float eps, int n_rows, void *out, cu_dtype odt, int nx,
                       cudaStream_t st, char *err, size_t errlen) {
    if (nx != 32 && nx != 64 && nx != 128) {
        snprintf(err, errlen, "ops_rmsnorm_ximage: images of %d columns (32, 64 or 128)", nx);
        return -1;
    }
    return s_rmsnorm_lay("ops_rmsnorm_ximage", x, w, dim, eps, n_rows, out, odt, nx, norm_merge{}, st, err, errlen);
}

int ops_rmsnorm_merge(float *x, const float *part, int ks, const float *w, int dim, float eps, int n_rows, void *out,
                      cu_dtype odt, int lay, cudaStream_t st, char *err, size_t errlen) {
    if (!part || !x) {
        snprintf(err, errlen, "ops_rmsnorm_merge: no partials or no x");
        return -1;
    }
    return s_rmsnorm_lay("ops_rmsnorm_merge", x, w, dim, eps, n_rows, out, odt, lay, norm_merge{part, ks, x}, st, err,
                         errlen);
}

template <typename T>
__global__ void k_swiglu_dual(const float *g, const float *u, size_t total, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        st_dual(out, outf, round_f, i, silu_mul(g[i], u[i]));
    }
}

/* float4 forms of k_swiglu_dual and k_cast_dual (prefill: swiglu moves ~300 MB per 8B layer at 2k tokens), for
 * element counts that are multiples of 4 and 16-byte aligned arrays: four elements per thread and step, each
 * computed by the same expression and rounded by the same conversion as in the scalar kernels (so the results
 * are the same bits: gpu_test_ops's test_dual compares them with ops_swiglu / ops_convert exactly); only the
 * loads and stores are wider. */
template <typename T>
__device__ __forceinline__ void st_dual4(T *out, float *outf, int round_f, size_t i4, const float *v) {
    if (out) st4(out, i4, v);
    if (outf) {
        float r[4];
        for (int e = 0; e < 4; e++) r[e] = round_f ? rnd_f((const T *)0, v[e]) : v[e];
        st4(outf, i4, r);
    }
}
template <typename T>
__global__ void k_swiglu_dual4(const float4 *g, const float4 *u, size_t n4, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 a4 = g[i], b4 = u[i];
        const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
        float v[4];
        for (int e = 0; e < 4; e++) v[e] = silu_mul(a[e], b[e]);
        st_dual4(out, outf, round_f, i, v);
    }
}
template <typename T>
__global__ void k_cast_dual4(const float4 *src, size_t n4, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 s4 = src[i];
        const float v[4] = {s4.x, s4.y, s4.z, s4.w};
        st_dual4(out, outf, round_f, i, v);
    }
}
/* strided forms (gate and up rows ld floats apart, out rows n apart): blockIdx.y walks the rows, x the columns;
 * each element is silu_mul of the same two values as in the flat kernels, stored by the same st_dual/st_dual4 */
template <typename T>
__global__ void k_swiglu_dual_ld(const float *g, const float *u, int ld, int n_rows, int n, T *out, float *outf,
                                 int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y)
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
            st_dual(out, outf, round_f, (size_t)r * n + j, silu_mul(g[(size_t)r * ld + j], u[(size_t)r * ld + j]));
}
template <typename T>
__global__ void k_swiglu_dual4_ld(const float4 *g, const float4 *u, int ld4, int n_rows, int n4, T *out, float *outf,
                                  int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y)
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n4; j += gridDim.x * blockDim.x) {
            const float4 a4 = g[(size_t)r * ld4 + j], b4 = u[(size_t)r * ld4 + j];
            const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
            float v[4];
            for (int e = 0; e < 4; e++) v[e] = silu_mul(a[e], b[e]);
            st_dual4(out, outf, round_f, (size_t)r * n4 + j, v);
        }
}
static bool vec4_ok(size_t n, const void *a, const void *b, const void *c, const void *d) {
    const void *p[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)p[i] % 16) return false;
    return n % 4 == 0;
}

int ops_swiglu_dual(const float *gate, const float *up, int ld, int n_rows, int n, void *out, cu_dtype odt,
                    float *outf, int round_f, cudaStream_t st, char *err, size_t errlen) {
    const size_t total = (size_t)n_rows * n;
    if (!total || (!out && !outf)) return 0;
    if (ld == 0) ld = n;
    if (ld < n) { snprintf(err, errlen, "ops_swiglu_dual: row stride %d < %d", ld, n); return -1; }
    cudaError_t le = cudaSuccess;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        const unsigned gy = (unsigned)(n_rows < 65535 ? n_rows : 65535);
        if (ld != n && ld % 4 == 0 && vec4_ok((size_t)n, gate, up, out, outf))
            le = cu_launch(k_swiglu_dual4_ld<T>, dim3((unsigned)(n / 4 + 255) / 256, gy), 256, 0, st,
                           (const float4 *)gate, (const float4 *)up, ld / 4, n_rows, n / 4, (T *)out, outf, round_f);
        else if (ld != n)
            le = cu_launch(k_swiglu_dual_ld<T>, dim3((unsigned)(n + 255) / 256, gy), 256, 0, st, gate, up, ld,
                           n_rows, n, (T *)out, outf, round_f);
        else if (vec4_ok(total, gate, up, out, outf))
            le = cu_launch(k_swiglu_dual4<T>, grid_for(total / 4, 256), 256, 0, st, (const float4 *)gate,
                           (const float4 *)up, total / 4, (T *)out, outf, round_f);
        else
            le = cu_launch(k_swiglu_dual<T>, grid_for(total, 256), 256, 0, st, gate, up, total, (T *)out, outf,
                           round_f);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_swiglu_dual", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_swiglu_dual");
    return 0;
}

/* SwiGLU of an interleaved gate/up product (wtc_params.glu's layout): feature j of row r is gate
 * gu[r][16 (j / 8) + j % 8] times up gu[r][16 (j / 8) + 8 + j % 8]; four features per thread (a float4 of gate
 * and one of up: ld % 4 == 0 and 16-byte aligned rows) or one */
template <typename T>
__global__ void k_swiglu_il8_dual4(const float4 *gu, int ld4, int n_rows, int n4, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y)
        for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < n4; q += gridDim.x * blockDim.x) {
            const size_t gi = (size_t)r * ld4 + 4 * (q >> 1) + (q & 1);   /* float4 of the gate values */
            const float4 a4 = gu[gi], b4 = gu[gi + 2];
            const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
            float v[4];
            for (int e = 0; e < 4; e++) v[e] = silu_mul(a[e], b[e]);
            st_dual4(out, outf, round_f, (size_t)r * n4 + q, v);
        }
}
template <typename T>
__global__ void k_swiglu_il8_dual(const float *gu, int ld, int n_rows, int n, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y)
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
            const size_t gi = (size_t)r * ld + 16 * (j >> 3) + (j & 7);
            st_dual(out, outf, round_f, (size_t)r * n + j, silu_mul(gu[gi], gu[gi + 8]));
        }
}
/* k_swiglu_il8_dual's f16 values as qtc's wgmma images of nx columns: a block of 256 threads takes up to 8 units
 * (2,048 features) of a row at a time, through shared memory (ximage_store: a chunk a thread) */
__global__ void k_swiglu_il8_ximage(const float *gu, int ld, int n_rows, int n, __half *out, int nx) {
    __shared__ __half h[8 * 256];
    pdl_trigger();
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int units = n / 256;
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y)
        for (int u0 = 8 * blockIdx.x; u0 < units; u0 += 8 * gridDim.x) {
            const int nu = units - u0 < 8 ? units - u0 : 8;
            for (int i = threadIdx.x; i < 256 * nu; i += blockDim.x) {
                const int j = 256 * u0 + i;
                const size_t gi = (size_t)r * ld + 16 * (j >> 3) + (j & 7);
                st_f(h, i, silu_mul(gu[gi], gu[gi + 8]));
            }
            __syncthreads();
            ximage_store(h, u0, nu, units, r, nx, out);
            __syncthreads(); /* h read before the next units overwrite it */
        }
}

int ops_swiglu_il8_dual(const float *gu, int ld, int n_rows, int n, void *out, cu_dtype odt, float *outf, int round_f,
                        cudaStream_t st, char *err, size_t errlen) {
    if (!n_rows || !n || (!out && !outf)) return 0;
    if (n % 8 || ld < 2 * n) {
        snprintf(err, errlen, "ops_swiglu_il8_dual: %d features (a multiple of 8) in rows of %d floats", n, ld);
        return -1;
    }
    cudaError_t le = cudaSuccess;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        const unsigned gy = (unsigned)(n_rows < 65535 ? n_rows : 65535);
        if (ld % 4 == 0 && vec4_ok((size_t)n, gu, gu, out, outf))
            le = cu_launch(k_swiglu_il8_dual4<T>, dim3((unsigned)(n / 4 + 255) / 256, gy), 256, 0, st,
                           (const float4 *)gu, ld / 4, n_rows, n / 4, (T *)out, outf, round_f);
        else
            le = cu_launch(k_swiglu_il8_dual<T>, dim3((unsigned)(n + 255) / 256, gy), 256, 0, st, gu, ld, n_rows, n,
                           (T *)out, outf, round_f);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_swiglu_il8_dual", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_swiglu_il8_dual");
    return 0;
}

int ops_swiglu_il8_ximage(const float *gu, int ld, int n_rows, int n, void *out, int nx, cudaStream_t st, char *err,
                          size_t errlen) {
    if (!n_rows) return 0;
    if (n % 256 || ld < 2 * n || !out || (nx != 32 && nx != 64 && nx != 128)) {
        snprintf(err, errlen,
                 "ops_swiglu_il8_ximage: %d features (a multiple of 256) in rows of %d floats, images of "
                 "%d columns (32, 64 or 128)",
                 n, ld, nx);
        return -1;
    }
    const unsigned gy = (unsigned)(n_rows < 65535 ? n_rows : 65535);
    const cudaError_t le = cu_launch(k_swiglu_il8_ximage, dim3((unsigned)(n / 256 + 7) / 8, gy), 256, 0, st, gu, ld,
                                     n_rows, n, (__half *)out, nx);
    if (le != cudaSuccess) {
        snprintf(err, errlen, "%s: launch failed: %s", "ops_swiglu_il8_ximage", cudaGetErrorString(le));
        return -1;
    }
    CU_LAUNCH_CHECK_RET("ops_swiglu_il8_ximage");
    return 0;
}

template <typename T>
__global__ void k_cast_dual(const float *src, size_t n, T *out, float *outf, int round_f) {
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st_dual(out, outf, round_f, i, src[i]);
}

int ops_cast_dual(const float *src, size_t n, void *out, cu_dtype odt, float *outf, int round_f, cudaStream_t st,
                  char *err, size_t errlen) {
    if (outf == src && !round_f) outf = NULL;   /* nothing to do in place */
    if (!n || (!out && !outf)) return 0;
    cudaError_t le = cudaSuccess;
    with_type(odt, [&](auto *tp) {
        using T = typename std::remove_pointer<decltype(tp)>::type;
        if (vec4_ok(n, src, src, out, outf))
            le = cu_launch(k_cast_dual4<T>, grid_for(n / 4, 256), 256, 0, st, (const float4 *)src, n / 4, (T *)out,
                           outf, round_f);
        else
            le = cu_launch(k_cast_dual<T>, grid_for(n, 256), 256, 0, st, src, n, (T *)out, outf, round_f);
    });
    if (le != cudaSuccess) { snprintf(err, errlen, "%s: launch failed: %s", "ops_cast_dual", cudaGetErrorString(le)); return -1; }
    CU_LAUNCH_CHECK_RET("ops_cast_dual");
    return 0;
}
