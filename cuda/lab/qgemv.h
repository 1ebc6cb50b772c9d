/* cuda/lab/qgemv.h: matrix-vector kernels for small batches (decode) that read GGUF weight blocks directly.
 *
 *   y[m][o] = sum_i W[o][i] * x[m][i]  (+ y_in[m][o] when y_in is given: a fused residual add)
 *
 * for m < M (1..QGEMV_MAX_M), o < n_out, i < n_in. W is n_out rows of raw GGUF blocks, row_bytes apart
 * (ggml_row_bytes(type, n_in)), laid out exactly as in the file; x and y are f32. Dequantization follows
 * engine/quant.c (the CPU oracle, cuda/test_qgemv.cu checks every type against it); accumulation is f32.
 *
 * How: each warp owns R output rows (R = 2 or 4) and walks n_in in steps of 1024 elements, f32 accumulation,
 * one warp-shuffle reduction at the end; x (f32, read through L1) is shared by the R rows; integer levels become
 * floats with the 2^23 trick (no conversion instructions). Two kernels:
 *   direct (F16, BF16, Q4_K, Q5_K: blocks that keep 16-byte alignment): weights go straight to registers with
 *     16-byte streaming loads, the next step loaded while the current one is multiplied;
 *   staged (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, whose 18..210-byte blocks are only 2-byte aligned): each
 *     step of the R rows is copied global -> shared memory with 16-byte cp.async over the aligned span that
 *     covers it (3 stages per warp, __syncwarp only), then each lane decodes 32 elements.
 * Each weight byte is read once per call for all M rows. No allocation, no synchronisation with the host, no
 * CUDA call but the launch: launchers may be captured into CUDA graphs. Measured speed: docs/perf.md
 * ("Quantized matrix-vector kernels"), from zllm-qbench.
 * A third, faster kernel reads a load-time repacked copy (Q8_0, Q6_K; for the other types the GGUF rows are
 * already that form): qgemv_repack + qgemv_launch_packed below (measurements: docs/cuda.md). */
#ifndef ZLLM_CUDA_QGEMV_H
#define ZLLM_CUDA_QGEMV_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "gguf.h"

#define QGEMV_MAX_M 8

/* one matrix-vector product; every pointer is device memory */
typedef struct {
    ggml_type type;      /* weight type: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K */
    const void *w;       /* [n_out][row_bytes] raw GGUF rows; 16-byte aligned */
    size_t row_bytes;    /* bytes per row: ggml_row_bytes(type, n_in) */
    int n_in;            /* elements per row: a multiple of the type's block (32 for F16/BF16 too) */
    int n_out;           /* rows, >= 1 */
    int m;               /* activation rows, 1..QGEMV_MAX_M */
    const float *x;      /* [m][ldx] f32, 16-byte aligned */
    int ldx;             /* floats between rows of x: >= n_in, a multiple of 4 (0 means n_in) */
    float *y;            /* [m][ldy] f32 output; must not overlap x */
    int ldy;             /* floats between rows of y and y_in: >= n_out (0 means n_out) */
    const float *y_in;   /* NULL, or [m][ldy] added to the product (may equal y: in-place residual add) */
} qgemv_params;

/* 1 when qgemv_launch has a kernel for this weight type */
int qgemv_supported(ggml_type t);

/* 1 when the engine should use qgemv for this type at batch m with these shapes, given weights that stay in
 * their GGUF form on the GPU: the type is supported, 1 <= m <= QGEMV_MAX_M and the shape meets qgemv_params's
 * rules. For F16/BF16, where cuBLAS reads the weights directly and was faster in zllm-qbench from m = 2 on
 * (H100, docs/perf.md), only m == 1. Results are batch invariant: a row's arithmetic under qgemv_launch does
 * not depend on m (or on which other rows are in the batch). */
int qgemv_pick(ggml_type t, int m, int n_in, int n_out);

/* Enqueues y = W x (+ y_in) on st. Returns cudaSuccess, cudaErrorInvalidValue for an unsupported type, m or
 * shape, cudaErrorMisalignedAddress for a w or x that is not 16-byte aligned, or the launch's error. A fault
 * inside the kernel surfaces at the caller's next synchronisation. */
cudaError_t qgemv_launch(const qgemv_params *p, cudaStream_t st);

/* Kernel selection for the benchmark and the checks; same contract as qgemv_launch. variant: 0 the default;
 * 10 the staged kernel (shared-memory stages: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K) with 2 rows per warp; 14 the
 * staged kernel with 4 rows per warp (m == 1 only); 20 the direct kernel (weights straight to registers: F16,
 * BF16, Q4_K, Q5_K) with its default rows per warp; 22 / 24 the direct kernel with 2 / 4 rows per warp (m == 1).
 * cudaErrorInvalidValue for a combination that does not exist. */
cudaError_t qgemv_launch_variant(const qgemv_params *p, int variant, cudaStream_t st);

/* ---- the packed layout (additive; docs/cuda.md) ----
 * A load-time copy of a matrix in which every weight word the kernel reads is 16-byte aligned, of exactly the
 * same size as the GGUF rows (qgemv_repack_bytes == n_out * ggml_row_bytes(t, n_in)):
 *   Q8_0: the int8 quants [n_out][n_in], then the fp16 scales [n_out][n_in / 32];
 *   Q6_K: the super-blocks without d, 208 bytes each (ql[128] qh[64] scales[16]) [n_out][n_in / 256], then the
 *         fp16 d [n_out][n_in / 256];
 *   every other type: the GGUF rows unchanged (a copy).
 * qgemv_launch_packed then runs the packed kernel (F16, BF16, Q8_0, Q4_K, Q6_K: many rows per CTA, 16-byte
 * loads only, several slots of loads in flight per lane, rows of short matrices split over 2-4 warps in a fixed
 * order chosen from the shape) and the GGUF kernels for the other types. Results are batch invariant as with
 * qgemv_launch (a row's arithmetic does not depend on m), but in general not bitwise equal to qgemv_launch's
 * (another summation order; equal where both run the same GGUF kernel: Q4_K with n_out > 2048, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q5_K). */

/* bytes of the packed form of an n_out x n_in matrix of type t (equal to the GGUF bytes), or 0 when qgemv does
 * not support the type or shape (n_in a multiple of the type's block, n_out >= 1) */
size_t qgemv_repack_bytes(ggml_type t, int n_in, int n_out);

/* Host copy: src = n_out GGUF rows (host memory), dst = qgemv_repack_bytes(t, n_in, n_out) bytes of host memory,
 * not overlapping src. Returns 0, or -1 for an unsupported type/shape, a NULL pointer or an overlap (dst then
 * untouched). */
int qgemv_repack_host(ggml_type t, const void *src, void *dst, int n_in, int n_out);

/* Device copy, enqueued on st: src = the GGUF rows in device memory, dst = qgemv_repack_bytes(...) bytes of
 * device memory (16-byte aligned for qgemv_launch_packed), not overlapping src. Same bytes as
 * qgemv_repack_host. Returns cudaErrorInvalidValue for an unsupported type/shape, a NULL pointer or an overlap,
 * else the launch's (or cudaMemcpyAsync's) error. */
cudaError_t qgemv_repack(ggml_type t, const void *src, void *dst, int n_in, int n_out, cudaStream_t st);

/* qgemv_launch on the packed form: p->w is the qgemv_repack output (for every type but Q8_0 and Q6_K the GGUF
 * rows themselves may be passed: their packed form is a copy), every other field (row_bytes included: still
 * ggml_row_bytes(type, n_in)) as for qgemv_launch. Same return values and guarantees (no allocation, no host
 * synchronisation, graph-capturable, batch invariant). */
cudaError_t qgemv_launch_packed(const qgemv_params *p, cudaStream_t st);

/* qgemv_launch_packed with a kernel choice, for the benchmark and the checks. For F16, BF16, Q8_0, Q4_K, Q6_K:
 * 0 the default, or the packed kernel as 1000 + 100 ks + 10 R + S (+ 10000: without the L2 256-byte prefetch
 * hint), ks = warps per row group (0: chosen from the type and shape, else 1, 2 or 4), R rows per warp, S slots
 * in flight per trip (R = S = 0: the default pair). Built: the default (R, S) for every m (R = 2 for m <= 2 else
 * 1; S = 2 for Q4_K/Q6_K and for F16/BF16 at m == 1, else 4; Q8_0 at m == 1 takes (2, 2) when n_out >= 8192)
 * with any ks; at m == 1 also (1, 4), (2, 2) for Q8_0, (2, 4) and (4, 2) for F16/BF16, and the default without
 * the hint. The default of Q4_K is the GGUF direct kernel for n_out > 2048 (faster there), the packed kernel
 * below. For F16, BF16 and Q4_K, whose packed form is the GGUF one, qgemv_launch_variant's codes work here and
 * qgemv_launch_variant takes the codes >= 1000 on the GGUF rows. For the other types: qgemv_launch_variant's
 * codes. cudaErrorInvalidValue for a combination that does not exist. */
cudaError_t qgemv_launch_packed_variant(const qgemv_params *p, int variant, cudaStream_t st);

/* Benchmark helper: reads `bytes` (a multiple of 16) of buf with 16-byte loads and writes one word per CTA to
 * sink (device, >= 4096 floats) so the reads are not optimised away: the read-only bandwidth ceiling.
 * Returns cudaErrorInvalidValue for a NULL or misaligned buf/sink or bytes % 16, else the launch's error. */
cudaError_t qgemv_read_bench(const void *buf, size_t bytes, float *sink, cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
