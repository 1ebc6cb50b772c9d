/* cuda/cu_host.h: host helpers shared by the kernel modules of cuda/ (header only). */
#ifndef ZLLM_CUDA_CU_HOST_H
#define ZLLM_CUDA_CU_HOST_H
#include <atomic>
#include <cuda_runtime.h>
#include "cu_settings.h"

/* `given` when > 0, else the multiprocessor count of the current device (a cached attribute query, safe while a
 * stream is being captured); 132 (an H100) when the query fails. */
static inline int cu_sm_count(int given) {
    if (given > 0) return given;
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) return 132;
    return n;
}

/* The current device's opt-in shared memory per block in bytes (an attribute query, safe while a stream is being
 * captured); 48 KiB when the query fails. */
static inline size_t cu_smem_optin_max() {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || v <= 0)
        return 48 * 1024;
    return (size_t)v;
}

/* A per-device switch cached in state[64] (0 unknown, 1 on, 2 off): on when the current device's compute capability
 * major is within [lo, hi] and `on` (a cu_settings field) is not 0 at the first call for the device. Attribute
 * queries only, so safe while a stream is captured. Returns 0 when the device query fails. */
static inline int cu_device_switch(int *state, int lo, int hi, int on) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    int *s = &state[dev & 63];
    if (*s == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) major = 0;
        *s = major >= lo && major <= hi && on ? 1 : 2;
    }
    return *s == 1;
}

/* Raises kernel k's dynamic shared-memory limit to bytes once per device (set: one bit per device, a static of the
 * caller's kernel instantiation). A function attribute, not a stream operation: allowed while a stream is
 * captured. Returns cudaSuccess or the attribute call's error (the bit stays clear, so the next call tries again). */
template <typename K>
static inline cudaError_t cu_smem_optin(K k, size_t bytes, std::atomic<unsigned long long> &set) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const unsigned long long bit = 1ull << (dev & 63);
    if (set.load(std::memory_order_relaxed) & bit) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) set.fetch_or(bit, std::memory_order_relaxed);
    return e;
}
#endif
