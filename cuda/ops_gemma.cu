/* cuda/ops_gemma.cu: the gemma3 block's row kernels (ops_gemma.h). Correct-first: one block (or warp) per row or
 * head, sums in a fixed order that depends on the row's width only. */
#include <math.h>
#include <stdio.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "cuda_common.h"
#include "ops_gemma.h"

static __global__ void k_scale(float *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

int ops_scale(float *x, size_t n, float s, cudaStream_t st, char *err, size_t errlen) {
    if (n == 0) return 0;
    size_t g = (n + 255) / 256;
    if (g > 65535u * 8) g = 65535u * 8;
    k_scale<<<(unsigned)g, 256, 0, st>>>(x, n, s);
    CU_LAUNCH_CHECK_RET("ops_scale");
    return 0;
}

/* the sum of v over a block of 256 threads, in a fixed order (warps, then warp sums); every thread gets it */
static __device__ float s_block_sum(float v, float *sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += sh[i];
    __syncthreads();
    return t;
}

static __global__ void k_rmsnorm_add(float *x, const float *y, int ldy, const float *w, int dim, float eps) {
    __shared__ float sh[32];
    const float *yr = y + (size_t)blockIdx.x * ldy;
    float *xr = x + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(yr[i], yr[i], ss);
    ss = s_block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += w[i] * (yr[i] * r);
}

int ops_rmsnorm_add(float *x, const float *y, int ldy, const float *w, int dim, float eps, int n_rows, cudaStream_t st,
                    char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    k_rmsnorm_add<<<n_rows, 256, 0, st>>>(x, y, ldy ? ldy : dim, w, dim, eps);
    CU_LAUNCH_CHECK_RET("ops_rmsnorm_add");
    return 0;
}

static __device__ __forceinline__ void s_st(float *p, size_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void s_st(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void s_st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* one block per row */
template <typename T> static __global__ void k_geglu(const float *g, const float *u, int ld, int n, T *out) {
    const size_t r = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float a = g[r * ld + i];
        const float ge = 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
        s_st(out, r * n + i, ge * u[r * ld + i]);
    }
}

int ops_geglu(const float *gate, const float *up, int ld, int n_rows, int n, void *out, cu_dtype odt, cudaStream_t st,
              char *err, size_t errlen) {
    if (n_rows <= 0 || n <= 0) return 0;
    const unsigned grid = (unsigned)n_rows;
    if (!ld) ld = n;
    if (odt == CU_F32) k_geglu<float><<<grid, 256, 0, st>>>(gate, up, ld, n, (float *)out);
    else if (odt == CU_F16) k_geglu<__half><<<grid, 256, 0, st>>>(gate, up, ld, n, (__half *)out);
    else k_geglu<__nv_bfloat16><<<grid, 256, 0, st>>>(gate, up, ld, n, (__nv_bfloat16 *)out);
    CU_LAUNCH_CHECK_RET("ops_geglu");
    return 0;
}
