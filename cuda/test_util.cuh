/* cuda/test_util.cuh: what the CUDA test programs (cuda/test_*.cu) share beside tests/test.h, header only.
 *   CUDA_OK(call): a runtime call that must succeed; otherwise the program prints the call and its error and exits
 *     with status 2 (every later check would read a broken runtime; tests/run.sh counts the exit as a failure).
 *   s_rng, rnd_u64, rnd_i, rnd_unit: one splitmix64 stream. Each program seeds s_rng before its first draw (from
 *     ZLLM_TEST_SEED, the clock or a constant) and may save and restore it to replay a sequence of draws;
 *     test_cuda_start seeds it from ZLLM_TEST_SEED or the clock and prints the seed, so a failure can be rerun.
 *   dev_buf: device bytes owned for a scope (allocation failures exit through CUDA_OK). */
#ifndef ZLLM_CUDA_TEST_UTIL_CUH
#define ZLLM_CUDA_TEST_UTIL_CUH
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <vector>

#include "test.h"

#define CUDA_OK(call)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                     \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t s_rng;
static inline uint64_t rnd_u64(void) {
    uint64_t z = (s_rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static inline int rnd_i(int n) { return (int)(rnd_u64() % (uint64_t)n); } /* [0, n) */
/* [0, 1) in steps of 2^-24 (exact in a float) */
static inline float rnd_unit(void) { return (float)((rnd_u64() >> 40) * (1.0 / 16777216.0)); }

/* the start of a test program: seeds s_rng (ZLLM_TEST_SEED, else the clock) and prints the seed; 0 when a CUDA
 * device is present, else -1 after a failed check (the program then returns test_report()) */
static inline int test_cuda_start(void) {
    const char *es = getenv("ZLLM_TEST_SEED");
    const uint64_t seed = es && *es ? strtoull(es, NULL, 10) : (uint64_t)time(NULL);
    s_rng = seed;
    printf("seed %llu\n", (unsigned long long)seed);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        CHECK(0, "a CUDA device is required");
        return -1;
    }
    return 0;
}

struct dev_buf {
    void *p = nullptr;
    size_t n = 0;
    explicit dev_buf(size_t bytes) : n(bytes) { CUDA_OK(cudaMalloc(&p, bytes ? bytes : 16)); }
    dev_buf(const void *h, size_t bytes) : n(bytes) {
        CUDA_OK(cudaMalloc(&p, bytes ? bytes : 16));
        if (bytes) CUDA_OK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    template <typename X> X *as() { return reinterpret_cast<X *>(p); }
    std::vector<unsigned char> get() const {
        std::vector<unsigned char> h(n);
        CUDA_OK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
        return h;
    }
};
#endif
