/* cuda/test_util.cuh: what the CUDA test programs (cuda/test_*.cu) share beside tests/test.h, header only.
 *   CUDA_OK(call): a runtime call that must succeed; otherwise the program prints the call and its error and exits
 *     with status 2 (every later check would read a broken runtime; tests/run.sh counts the exit as a failure).
 *   s_rng, rnd_u64, rnd_i, rnd_unit: one splitmix64 stream. Each program seeds s_rng before its first draw (from
 *     ZLLM_TEST_SEED, the clock or a constant) and may save and restore it to replay a sequence of draws. */
#ifndef ZLLM_CUDA_TEST_UTIL_CUH
#define ZLLM_CUDA_TEST_UTIL_CUH
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
#endif
