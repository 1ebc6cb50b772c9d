/* cuda/cuda_common.h: error checking for CUDA runtime and cuBLAS calls in library code.
 *
 * Library code never exits: each macro writes "where: what (code)" into a caller's (char *err, size_t errlen)
 * and jumps to the function's `fail:` label (CU_CHECK / CUBLAS_CHECK) or returns -1 (..._RET variants).
 * The names err/errlen must be in scope. */
#ifndef ZLLM_CUDA_COMMON_H
#define ZLLM_CUDA_COMMON_H
#include <stdio.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

/* text of a cuBLAS status (cublasGetStatusString exists since 11.4) */
static inline const char *cu_blas_str(cublasStatus_t s) { return cublasGetStatusString(s); }

#define CU_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); goto fail; } } while (0)
#define CUBLAS_CHECK(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu_blas_str(s_)); goto fail; } } while (0)
#define CU_CHECK_RET(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); return -1; } } while (0)
#define CUBLAS_CHECK_RET(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cu_blas_str(s_)); return -1; } } while (0)
/* after a kernel launch: catches bad launch configurations (asynchronous faults surface at the next sync) */
#define CU_LAUNCH_CHECK_RET(what) do { cudaError_t e_ = cudaGetLastError(); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s: launch failed: %s", (what), cudaGetErrorString(e_)); return -1; } } while (0)

static inline int cu_div_up(long long a, long long b) { return (int)((a + b - 1) / b); }
#endif
