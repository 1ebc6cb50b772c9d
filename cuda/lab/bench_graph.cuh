/* cuda/lab/bench_graph.cuh: the lab benchmarks' timing of a captured CUDA graph, header only.
 *   bench_graph_ms(ge, st): one warm-up replay of ge on st, then 7 replays, each between two CUDA events; returns
 *   the median replay in ms. A CUDA error prints the call and exits with status 1 (a benchmark has no figure to
 *   give after one).
 *   BENCH_GRAPH_CK(call): that check, for the benchmarks' own CUDA calls too. */
#ifndef ZLLM_CUDA_LAB_BENCH_GRAPH_CUH
#define ZLLM_CUDA_LAB_BENCH_GRAPH_CUH
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define BENCH_GRAPH_CK(call)                                                                                           \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static inline double bench_graph_ms(cudaGraphExec_t ge, cudaStream_t st) {
    cudaEvent_t a, b;
    BENCH_GRAPH_CK(cudaEventCreate(&a));
    BENCH_GRAPH_CK(cudaEventCreate(&b));
    BENCH_GRAPH_CK(cudaGraphLaunch(ge, st)); /* warm-up */
    BENCH_GRAPH_CK(cudaStreamSynchronize(st));
    std::vector<double> v;
    for (int i = 0; i < 7; i++) {
        BENCH_GRAPH_CK(cudaEventRecord(a, st));
        BENCH_GRAPH_CK(cudaGraphLaunch(ge, st));
        BENCH_GRAPH_CK(cudaEventRecord(b, st));
        BENCH_GRAPH_CK(cudaEventSynchronize(b));
        float ms;
        BENCH_GRAPH_CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    BENCH_GRAPH_CK(cudaEventDestroy(a));
    BENCH_GRAPH_CK(cudaEventDestroy(b));
    return v[v.size() / 2];
}
#endif
