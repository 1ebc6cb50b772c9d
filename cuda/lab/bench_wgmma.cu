/* cuda/lab/bench_wgmma.cu: zllm-wgmmabench, the rate at which one multiprocessor runs F16 wgmma k16 steps from
 * operands already in shared memory (SS: A and B there; RS: A in registers, B there), at N = 32, 64, 128 and 256,
 * with 1 or 2 warpgroups a CTA issuing, alone or beside a producer warp that keeps copies into shared memory in
 * flight (as cuda/wtc.cu's TMA ring does), and the copies' own rate: so that what bounds the decode products' k
 * loops can be told apart (the tensor pipe, shared memory, or the copies feeding it).
 *
 * One CTA per SM; each issuing warpgroup runs `iters` groups of 4 k16 steps (a 64-wide k tile) on its own
 * accumulators, with at most one group in flight behind the current (wait<1>), as the products do. Tiles: A
 * [64][64] per warpgroup, B [N][64] shared by the warpgroups, 128-byte swizzle, small values. The producer warp keeps
 * 8 copies of 16 KiB in flight into a ring, `iters` of them: plain bulk copies from a 4 MiB source (L2) or a 2 GiB
 * one (DRAM), or two TMA boxes of [64 rows][64] F16 each (wtc_ws's boxes) from the same sources read as [rows][4096]
 * matrices. Reported: SM cycles per k16 step (all warpgroups' steps over the CTA's clock64 span, median CTA) and the
 * share of the dense F16 rate (64 x N x 16 multiply-adds a step at 2,048 a cycle: the H100/H200 dense rate per SM);
 * for the copies, bytes a cycle an SM over the producer's span (median CTA).
 *
 * usage: zllm-wgmmabench [--iters 4000]
 * Exit status 1 on a CUDA error or a bad argument. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "wgmma.cuh"
#include "mbar.cuh"
#include "bench_graph.cuh"

#define CK(call) BENCH_GRAPH_CK(call)

namespace {

constexpr int kCopyBytes = 16384; /* one bulk copy: a stage of W and x rows of the decode forms */
constexpr int kSlots = 8;         /* copies in flight */
constexpr size_t kL2Src = (size_t)4 << 20, kDramSrc = (size_t)2 << 30;
constexpr int kCols = 4096; /* the tensor copies' matrix: [rows][4096] F16 */
constexpr int kL2Rows = (int)(kL2Src / (kCols * 2)), kDramRows = (int)(kDramSrc / (kCols * 2));

/* W issuing warpgroups (0: none); CP 0 no copies, 1 copies from a 4 MiB source (L2), 2 from a 2 GiB one (DRAM):
 * a producer warp after the warpgroups keeps kSlots copies of kCopyBytes in flight into a ring, `iters` of them;
 * CP 3 (L2) and 4 (DRAM): each copy two TMA boxes of [64 rows][64] F16 (128 bytes a row, 128-byte swizzle, as
 * cuda/wtc.cu's stages: W rows then x rows) from tm, a [rows][4096] matrix, the CTA's rows fixed and k advancing */
template <int N, bool RS, int W, int CP>
__global__ void __launch_bounds__(128 * W + (CP ? 32 : 0), 1)
    rate_kernel(int iters, const uint8_t *src, long long *cycles, long long *ccycles, float *sink,
                const __grid_constant__ CUtensorMap tm) {
#if ZWG_ON
    extern __shared__ __align__(1024) unsigned char sm[];
    __half *a = reinterpret_cast<__half *>(sm);            /* W x [64][64] */
    __half *b = reinterpret_cast<__half *>(sm + W * 8192); /* [N][64] */
    unsigned char *ring = sm + W * 8192 + N * 128;         /* kSlots x kCopyBytes, 1024-aligned */
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(ring + kSlots * kCopyBytes);
    for (int i = threadIdx.x; i < W * 4096 + N * 64; i += blockDim.x)
        (i < W * 4096 ? a[i] : b[i - W * 4096]) = __float2half(((i * 37) % 17 - 8) * 0.01f);
    if (threadIdx.x == 0)
        for (int s = 0; s < kSlots; s++) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if ((int)threadIdx.x >= 128 * W) { /* the producer warp */
        if (CP && threadIdx.x == 128 * W) {
            const size_t span = CP == 1 ? kL2Src : kDramSrc,
                         base = CP == 1 ? 0 : (size_t)blockIdx.x * iters * kCopyBytes;
            const long long t0 = clock64();
            for (int it = 0; it < iters; it++) {
                const int slot = it % kSlots;
                if (it >= kSlots) mbar_wait(bars + 8 * slot, ((it / kSlots) - 1) & 1);
                mbar_expect_tx(bars + 8 * slot, kCopyBytes);
                const uint32_t dst = (uint32_t)__cvta_generic_to_shared(ring + slot * kCopyBytes);
                if (CP <= 2) {
                    bulk_copy(dst, src + (base + (size_t)it * kCopyBytes) % span, kCopyBytes, bars + 8 * slot);
                } else {
                    /* rows: the CTA's 128 (two boxes), then the next 128 x SMs once k wraps (DRAM: a fresh region) */
                    const int rows = CP == 3 ? kL2Rows : kDramRows, k = (it % (kCols / 64)) * 64;
                    const int r0 = (int)(((long)blockIdx.x * 128 + (long)(it / (kCols / 64)) * gridDim.x * 128) % rows);
                    for (int h = 0; h < 2; h++)
                        asm volatile(
                            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
                            "[%1, {%2, %3}], [%4];\n" ::"r"(dst + h * 8192),
                            "l"(&tm), "r"(k), "r"(r0 + 64 * h), "r"(bars + 8 * slot)
                            : "memory");
                }
            }
            for (int it = iters > kSlots ? iters - kSlots : 0; it < iters; it++)
                mbar_wait(bars + 8 * (it % kSlots), (it / kSlots) & 1);
            ccycles[blockIdx.x] = clock64() - t0;
        }
        return;
    }
    const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) acc[i] = 0.f;
    const uint64_t da = zwg::desc(a + wg * 4096), db = zwg::desc(b);
    uint32_t ar[4][4] = {};
    if (RS) { /* A's fragments for the 4 steps (rows 16 warp + g / + 8, k 2t.. of each step), read once */
        const int g = lane >> 2, t = lane & 3;
        for (int q = 0; q < 4; q++)
            for (int r = 0; r < 4; r++) {
                const int row = 16 * warp + g + 8 * (r & 1), k = 16 * q + 2 * t + 8 * (r >> 1);
                const int chunk = (k >> 3) ^ (row & 7);
                ar[q][r] = *reinterpret_cast<const uint32_t *>(a + wg * 4096 + row * 64 + chunk * 8 + (k & 7));
            }
    }
    const long long t0 = clock64();
    for (int it = 0; it < iters; it++) {
        zwg::fence();
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if constexpr (RS) zwg::mma_ra<N>::run(acc, ar[q], db + 2 * q);
            else zwg::mma<__half, N>::run(acc, da + 2 * q, db + 2 * q);
        }
        zwg::commit();
        zwg::wait<1>();
    }
    zwg::wait<0>();
    const long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < N / 2; i++) s += acc[i];
    if (s == 12345.f) sink[threadIdx.x] = s; /* keeps the products */
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
#else
    (void)iters;
    (void)src;
    (void)cycles;
    (void)ccycles;
    (void)sink;
    __trap();
#endif
}

static long long median(long long *d, int n) {
    std::vector<long long> c(n);
    CK(cudaMemcpy(c.data(), d, n * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    return c[n / 2];
}

static CUtensorMap s_map_l2, s_map_dram;

/* the [rows][4096] F16 map of src in [64][64] boxes, 128-byte swizzle (cuda/wtc.cu's tma_map) */
static void make_map(CUtensorMap *map, const void *src, int rows) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "zllm-wgmmabench: no cuTensorMapEncodeTiled\n");
        exit(1);
    }
    const cuuint64_t dims[2] = {(cuuint64_t)kCols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)kCols * 2};
    const cuuint32_t box[2] = {64, 64}, estr[2] = {1, 1};
    if (reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
            map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void *>(src), dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "zllm-wgmmabench: cuTensorMapEncodeTiled failed\n");
        exit(1);
    }
}

template <int N, bool RS, int W, int CP>
void run(int iters, int sms, const uint8_t *src, long long *dcyc, long long *dccyc, float *sink) {
    const size_t smem = (size_t)W * 8192 + N * 128 + kSlots * kCopyBytes + 8 * kSlots;
    auto k = rate_kernel<N, RS, W, CP>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* with warpgroups and copies, the producer issues one 16 KiB copy per group of 4 steps (`iters` of each: a
     * CW 1, NX 64 stage per k tile); each side is timed over its own span */
    k<<<sms, 128 * W + (CP ? 32 : 0), smem>>>(iters, src, dcyc, dccyc, sink, CP == 4 ? s_map_dram : s_map_l2);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    static const char *const names[] = {"", "+copies(L2)", "+copies(DRAM)", "+boxes(L2)", "+boxes(DRAM)"};
    const char *cp = names[CP];
    if (W) {
        const double per = (double)median(dcyc, sms) / ((double)iters * 4 * W); /* SM cycles per k16 step */
        const double peak = 64.0 * N * 16 / 2048;                               /* cycles a step at the dense rate */
        printf("N=%-4d %s warpgroups %d %-14s %8.1f cycles a step  %5.1f%% of the dense peak", N, RS ? "RS" : "SS", W,
               cp, per, 100.0 * peak / per);
    } else {
        printf("copies only %-14s", cp);
    }
    if (CP) printf("  copies %.1f bytes a cycle an SM", (double)iters * kCopyBytes / (double)median(dccyc, sms));
    printf("\n");
}

template <int N> void run_n(int iters, int sms, const uint8_t *src, long long *dcyc, long long *dccyc, float *sink) {
    run<N, false, 1, 0>(iters, sms, src, dcyc, dccyc, sink);
    run<N, false, 2, 0>(iters, sms, src, dcyc, dccyc, sink);
    run<N, false, 1, 1>(iters, sms, src, dcyc, dccyc, sink);
    run<N, false, 1, 2>(iters, sms, src, dcyc, dccyc, sink);
    if constexpr (N <= 128) { /* zwg::mma_ra's sizes */
        run<N, true, 1, 0>(iters, sms, src, dcyc, dccyc, sink);
        run<N, true, 1, 1>(iters, sms, src, dcyc, dccyc, sink);
    }
}

} // namespace

int main(int argc, char **argv) {
    int iters = 4000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc && atoi(argv[i + 1]) > 0) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: zllm-wgmmabench [--iters 4000]\n");
            return 1;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) {
        fprintf(stderr, "zllm-wgmmabench: needs an sm_90 device (%s is %d.%d)\n", prop.name, prop.major, prop.minor);
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    uint8_t *src;
    long long *dcyc, *dccyc;
    float *sink;
    CK(cudaMalloc(&src, kDramSrc));
    CK(cudaMemset(src, 0, kDramSrc));
    CK(cudaMalloc(&dcyc, sms * sizeof(long long)));
    CK(cudaMalloc(&dccyc, sms * sizeof(long long)));
    make_map(&s_map_l2, src, kL2Rows);
    make_map(&s_map_dram, src, kDramRows);
    CK(cudaMalloc(&sink, 1024 * sizeof(float)));
    printf("zllm-wgmmabench: %s, %d SMs, %d groups of 4 k16 steps a warpgroup\n", prop.name, sms, iters);
    run<32, false, 0, 1>(iters, sms, src, dcyc, dccyc, sink);
    run<32, false, 0, 2>(iters, sms, src, dcyc, dccyc, sink);
    run<32, false, 0, 3>(iters, sms, src, dcyc, dccyc, sink);
    run<32, false, 0, 4>(iters, sms, src, dcyc, dccyc, sink);
    run<64, false, 1, 3>(iters, sms, src, dcyc, dccyc, sink);
    run<64, false, 1, 4>(iters, sms, src, dcyc, dccyc, sink);
    run_n<32>(iters, sms, src, dcyc, dccyc, sink);
    run_n<64>(iters, sms, src, dcyc, dccyc, sink);
    run_n<128>(iters, sms, src, dcyc, dccyc, sink);
    run_n<256>(iters, sms, src, dcyc, dccyc, sink);
    cudaFree(src);
    cudaFree(dcyc);
    cudaFree(dccyc);
    cudaFree(sink);
    return 0;
}
