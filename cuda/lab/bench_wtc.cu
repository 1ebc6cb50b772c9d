/* cuda/lab/bench_wtc.cu: zllm-wtcbench, the 16-bit weight products of cuda/wtc.cu per shape, batch M and form,
 * beside cuBLAS (cublasGemmEx, BF16 in, f32 accumulate and output) on the same shape and M.
 *
 * Shapes (n_out x n_in): one Llama-3.1-8B layer's products: Q/K/V joined 6144x4096, output 4096x4096, gate/up
 * joined 28672x4096, down 4096x14336. Weights: random BF16 (F16 with --f16) values, in as many buffers as make
 * >= 1 GiB (at least 2), rotated call after call so that L2 (50 MB) does not serve them. Timing: one group of
 * calls (one per buffer) captured in a CUDA graph, replayed 7 times with a CUDA-event pair around each replay;
 * the median replay divided by the calls in the group is the time per call. Reported: us per call, TFLOP/s
 * (2 M n_in n_out / time) and the weights' read rate (GB/s). Each layer line sums the four shapes. x holds the
 * largest M rounded up to 128 rows, all of them readable (wtc_params.x_rows), as the engine's inputs are.
 *
 * usage: zllm-wtcbench [--ms 32,64,128,256,2048] [--forms 0] [--f16] [--no-cublas] [--x-rows-m]
 *   --forms: wtc_params.form values (0 automatic, 1 to 6 forced: cuda/wtc.h; a form refused for a shape, the
 *            narrow one above 16 rows say, ends the run with status 1).
 *   --x-rows-m: x_rows 0 (only the first M rows of x readable: a last batch tile past them is zero-filled).
 * Exit status 1 on any CUDA or cuBLAS error, and with the usage on an unknown argument, an empty list, an M outside
 * 1..65536 or a form outside 0..6. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "wtc.h"
#include "bench_graph.cuh"

#define CK(call) BENCH_GRAPH_CK(call) /* a CUDA error: the call and its error, exit status 1 */
#define CB(call)                                                                                                       \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)s_);                                    \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static const int kShapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}; /* n_out, n_in */
static const char *kNames[] = {"qkv", "out", "gate/up", "down"};

static std::vector<int> parse_list(const char *s) {
    std::vector<int> v;
    for (const char *p = s; *p;) {
        v.push_back(atoi(p));
        while (*p && *p != ',') p++;
        if (*p) p++;
    }
    return v;
}

/* fills n 16-bit values with small random numbers of either type (the exponent field kept in a sane range) */
__global__ void fill16(uint16_t *p, size_t n, uint32_t seed, int bf16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float v = ((h & 0xffff) / 65536.f - 0.5f) * 0.1f;
        p[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16(v)) : __half_as_ushort(__float2half(v));
    }
}

/* median us per call of fn(i) for i < calls, captured as one graph */
template <typename F> static float time_graph(cudaStream_t st, int calls, F fn) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; i++) fn(i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double ms = bench_graph_ms(ge, st);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return (float)(ms * 1000.0 / calls);
}

int main(int argc, char **argv) {
    std::vector<int> ms = {32, 64, 128, 256, 2048}, forms = {0};
    int bf16 = 1, cublas = 1, x_rows_m = 0, bad_arg = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--forms") && i + 1 < argc) forms = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--f16")) bf16 = 0;
        else if (!strcmp(argv[i], "--no-cublas")) cublas = 0;
        else if (!strcmp(argv[i], "--x-rows-m")) x_rows_m = 1;
        else bad_arg = 1;
    }
    const auto bad_m = [](int m) { return m < 1 || m > 65536; };
    const auto bad_form = [](int f) { return f < 0 || f > 6; };
    if (bad_arg || ms.empty() || forms.empty() || std::any_of(ms.begin(), ms.end(), bad_m) ||
        std::any_of(forms.begin(), forms.end(), bad_form)) {
        fprintf(stderr, "usage: zllm-wtcbench [--ms 32,64,... (1..65536)] [--forms 0,... (0..6)] [--f16] "
                        "[--no-cublas] [--x-rows-m]\n");
        return 1;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t cb = NULL;
    void *cbws = NULL;
    if (cublas) {
        CB(cublasCreate(&cb));
        CB(cublasSetStream(cb, st));
        CK(cudaMalloc(&cbws, 32u << 20));
        CB(cublasSetWorkspace(cb, cbws, 32u << 20));
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int max_m = *std::max_element(ms.begin(), ms.end()), x_rows = (max_m + 127) / 128 * 128;
    printf("zllm-wtcbench: %s, %s weights, %d SMs\n", prop.name, bf16 ? "BF16" : "F16", prop.multiProcessorCount);
    printf("%-8s %6s %6s %5s %10s %9s %9s\n", "shape", "M", "form", "ks", "us", "TFLOP/s", "W GB/s");
    std::vector<float> layer(forms.size() + 1);
    for (int m : ms) {
        std::fill(layer.begin(), layer.end(), 0.f);
        for (int s = 0; s < 4; s++) {
            const int n_out = kShapes[s][0], n_in = kShapes[s][1];
            const size_t wbytes = (size_t)n_out * n_in * 2;
            const int nbuf = std::max(2, (int)((1ull << 30) / wbytes) + 1);
            std::vector<void *> w(nbuf);
            for (auto &b : w) {
                CK(cudaMalloc(&b, wbytes));
                fill16<<<1024, 256, 0, st>>>((uint16_t *)b, wbytes / 2, (uint32_t)(uintptr_t)b, bf16);
            }
            void *x, *ws = NULL;
            float *y;
            CK(cudaMalloc(&x, (size_t)x_rows * n_in * 2));
            fill16<<<1024, 256, 0, st>>>((uint16_t *)x, (size_t)x_rows * n_in, 7u, bf16);
            CK(cudaMalloc(&y, (size_t)max_m * n_out * 4));
            const size_t wsb = wtc_workspace_bytes(n_in, n_out, m);
            if (wsb) CK(cudaMalloc(&ws, wsb));
            CK(cudaStreamSynchronize(st));
            const double flop = 2.0 * m * n_in * n_out;
            for (size_t f = 0; f < forms.size(); f++) {
                wtc_params p;
                memset(&p, 0, sizeof p);
                p.bf16 = bf16;
                p.n_in = n_in;
                p.n_out = n_out;
                p.m = m;
                p.x = x;
                p.x_rows = x_rows_m ? 0 : x_rows;
                p.y = y;
                p.form = forms[f];
                p.workspace = ws;
                p.workspace_bytes = wsb;
                const float us = time_graph(st, nbuf, [&](int i) {
                    p.w = w[i];
                    CK(wtc_launch(&p, st));
                });
                layer[f] += us;
                printf("%-8s %6d %6d %5d %10.2f %9.1f %9.0f\n", kNames[s], m, forms[f], wtc_split(n_in, n_out), us,
                       flop / us * 1e-6, wbytes / us * 1e-3);
            }
            if (cublas) {
                const float one = 1.f, zero = 0.f;
                const cudaDataType_t t16 = bf16 ? CUDA_R_16BF : CUDA_R_16F;
                const float us = time_graph(st, nbuf, [&](int i) {
                    CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n_out, m, n_in, &one, w[i], t16, n_in, x, t16, n_in,
                                    &zero, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                });
                layer[forms.size()] += us;
                printf("%-8s %6d %6s %5s %10.2f %9.1f %9.0f\n", kNames[s], m, "cublas", "", us, flop / us * 1e-6,
                       wbytes / us * 1e-3);
            }
            for (auto b : w) cudaFree(b);
            cudaFree(x);
            cudaFree(y);
            cudaFree(ws);
        }
        for (size_t f = 0; f < forms.size(); f++) printf("layer    %6d %6d %5s %10.2f\n", m, forms[f], "", layer[f]);
        if (cublas) printf("layer    %6d %6s %5s %10.2f\n", m, "cublas", "", layer[forms.size()]);
    }
    if (cb) cublasDestroy(cb);
    cudaFree(cbws);
    return 0;
}
