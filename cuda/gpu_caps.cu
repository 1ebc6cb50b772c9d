/* cuda/gpu_caps.cu: memory bandwidth and BF16 matrix rate of the current GPU, for zllm-bench's roofline. */
#include <algorithm>
#include <stdint.h>
#include <string.h>
#include <cuda_bf16.h>
#include "gpu_caps.h"
#include "cuda_common.h"

/* sums the buffer with 16-byte loads; one value per block keeps the compiler from dropping the reads */
__global__ void k_read(const uint4 *p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x + v.y + v.z + v.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

/* random bf16 in [-1, 1) from a counter hash (never zeros: zeros run faster than real data) */
__global__ void k_fill(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = __float2bfloat16((float)(h & 0xFFFFFF) / 8388608.0f - 1.0f);
    }
}

static double median(float *v, int n) {
    std::sort(v, v + n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int gpu_caps_measure(int dev, gpu_caps *o, char *err, size_t errlen) {
    const size_t bytes = (size_t)1 << 30;   /* 1 GiB per buffer: 20x the largest L2 */
    const int reps = 15;
    void *a = NULL, *b = NULL;
    unsigned *sink = NULL;
    __nv_bfloat16 *A = NULL, *B = NULL, *C = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasHandle_t h = NULL;
    float ms[reps];
    int rc = -1;
    memset(o, 0, sizeof *o);
    CU_CHECK(cudaSetDevice(dev));
    {
        cudaDeviceProp p;
        CU_CHECK(cudaGetDeviceProperties(&p, dev));
        snprintf(o->name, sizeof o->name, "%s", p.name);
        o->sm_count = p.multiProcessorCount;
    }
    CU_CHECK(cudaEventCreate(&e0));
    CU_CHECK(cudaEventCreate(&e1));
    CU_CHECK(cudaMalloc(&a, bytes));
    CU_CHECK(cudaMalloc(&b, bytes));
    CU_CHECK(cudaMalloc((void **)&sink, 65536 * 4));
    k_fill<<<4096, 256>>>((__nv_bfloat16 *)a, bytes / 2, 1);
    CU_CHECK(cudaGetLastError());
    for (int i = -2; i < reps; i++) {
        CU_CHECK(cudaEventRecord(e0));
        CU_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CU_CHECK(cudaEventRecord(e1));
        CU_CHECK(cudaEventSynchronize(e1));
        if (i >= 0) CU_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    o->copy_gbs = 2.0 * bytes / (median(ms, reps) * 1e-3) / 1e9;
    for (int i = -2; i < reps; i++) {
        const void *src = (i & 1) ? a : b;   /* alternate buffers */
        CU_CHECK(cudaEventRecord(e0));
        k_read<<<o->sm_count * 8, 512>>>((const uint4 *)src, bytes / 16, sink);
        CU_CHECK(cudaEventRecord(e1));
        CU_CHECK(cudaEventSynchronize(e1));
        CU_CHECK(cudaGetLastError());
        if (i >= 0) CU_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    o->read_gbs = bytes / (median(ms, reps) * 1e-3) / 1e9;
    cudaFree(a); a = NULL;
    cudaFree(b); b = NULL;
    {
        const int n = 8192;
        const size_t ne = (size_t)n * n;
        CU_CHECK(cudaMalloc((void **)&A, ne * 2));
        CU_CHECK(cudaMalloc((void **)&B, ne * 2));
        CU_CHECK(cudaMalloc((void **)&C, ne * 2));
        k_fill<<<4096, 256>>>(A, ne, 7);
        k_fill<<<4096, 256>>>(B, ne, 11);
        CU_CHECK(cudaGetLastError());
        CUBLAS_CHECK(cublasCreate(&h));
        const float alpha = 1.f, beta = 0.f;
        for (int i = -3; i < reps; i++) {
            CU_CHECK(cudaEventRecord(e0));
            CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                                      &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            CU_CHECK(cudaEventRecord(e1));
            CU_CHECK(cudaEventSynchronize(e1));
            if (i >= 0) CU_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
        }
        o->bf16_tflops = 2.0 * n * (double)n * n / (median(ms, reps) * 1e-3) / 1e12;
    }
    rc = 0;
fail:
    cudaFree(a); cudaFree(b); cudaFree(sink); cudaFree(A); cudaFree(B); cudaFree(C);
    if (h) cublasDestroy(h);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}
