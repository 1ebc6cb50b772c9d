/* cuda/lab/qmma.h: one tensor-core matrix kernel family for GGUF-quantized weights, for every batch size M (decode
 * M = 1 up to prefill-sized M), reading the GGUF blocks directly (no 16-bit copy of the weights):
 *
 *   y[m][o] = sum_i W[o][i] * x[m][i]  (+ y_in[m][o] when y_in is given: a fused residual add), f32 output
 *
 * for m < M, o < n_out, i < n_in. W is n_out rows of raw GGUF blocks, row_bytes apart, exactly as in the file;
 * x is f16 (the engine's 16-bit activations; values are used exactly as given), y and y_in f32.
 *
 * Batch invariance (the engine contract): y[m][o] is computed by a FIXED sequence of operations that depends
 * only on (type, n_in, n_out) and on the data of row o and batch row m, never on M or on the other rows:
 *   - one mma.sync.m16n8k16 (f16 x f16 -> f32) shape; the weights are the A operand (16 rows per fragment,
 *     exact integer levels, for Q4_K times the 6-bit sub-block scale, which stays exact in f16), the
 *     activations are the B operand (8 batch rows per fragment; batch rows past M are zero columns, which
 *     touch no other column's result);
 *   - a fixed, per-type assignment of the elements of a scale unit (a 256-element super-block or a 32-element
 *     block) to the k slots of the fragments (x is read with the same one), chained mma over the unit from
 *     zero, then acc = fma(scale, partial, acc) per unit (Q4_K: the min term through a second mma of the
 *     6-bit mins against the same x fragments, so its per-group sums of x are fixed too);
 *   - a split-K count ks = qmma_split(type, n_in, n_out) (contiguous ranges of units, one warp each), merged
 *     as ((0 + p0) + p1) + ... in warp order through shared memory, then + y_in.
 * M only changes how many B fragments and CTAs there are (the tile shape (RT, NF) chosen from M changes which
 * warp computes an element, not its arithmetic). cuda/test_qmma.cu checks this bit for bit.
 * No allocation, no synchronisation with the host, no CUDA call but the launch: launchers may be captured
 * into CUDA graphs. Types: Q4_K, Q6_K, Q8_0 (qmma_supported). Measurements: docs/cuda.md. */
#ifndef ZLLM_CUDA_QMMA_H
#define ZLLM_CUDA_QMMA_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "gguf.h"

/* one matrix product; every pointer is device memory */
typedef struct {
    ggml_type type;      /* weight type: Q4_K, Q6_K or Q8_0 */
    const void *w;       /* [n_out][row_bytes] raw GGUF rows; 16-byte aligned */
    size_t row_bytes;    /* bytes per row: ggml_row_bytes(type, n_in) */
    int n_in;            /* elements per row: a multiple of the type's block (256 for K types, 32 for Q8_0) */
    int n_out;           /* rows, >= 1 */
    int m;               /* activation rows (batch), >= 1 (at most 8 * 65535) */
    const uint16_t *x;   /* [m][ldx] f16 bit patterns, 16-byte aligned */
    int ldx;             /* halves between rows of x: >= n_in, a multiple of 8 (0 means n_in) */
    float *y;            /* [m][ldy] f32 output; must not overlap x */
    int ldy;             /* floats between rows of y and y_in: >= n_out (0 means n_out) */
    const float *y_in;   /* NULL, or [m][ldy] added to the product (may equal y: in-place residual add) */
} qmma_params;

/* 1 when qmma_launch has a kernel for this weight type */
int qmma_supported(ggml_type t);

/* The split-K count (warps per row tile, 1..8) used for this type and shape: a function of (type, n_in, n_out)
 * only, never of M (part of the batch-invariance argument). 0 for an unsupported type or shape. */
int qmma_split(ggml_type t, int n_in, int n_out);

/* Enqueues y = W x (+ y_in) on st. Returns cudaSuccess, cudaErrorInvalidValue for an unsupported type, m or
 * shape, cudaErrorMisalignedAddress for a w or x that is not 16-byte aligned, or the launch's error. A fault
 * inside the kernel surfaces at the caller's next synchronisation. */
cudaError_t qmma_launch(const qmma_params *p, cudaStream_t st);

/* qmma_launch with a forced tile: rt row tiles of 16 weight rows and nf batch fragments of 8 columns per CTA,
 * (rt, nf) in {(1,1), (1,2), (1,4), (2,2), (2,4)}; (0, 0) = the default chosen from m. Results are bitwise
 * those of qmma_launch (the tile does not change any element's arithmetic). cudaErrorInvalidValue for a
 * tile that is not built. For the benchmark and the checks. */
cudaError_t qmma_launch_tile(const qmma_params *p, int rt, int nf, cudaStream_t st);

/* qmma_launch_tile with a forced split-K count ks_force (1..8, at most the units per row; 0 = qmma_split's).
 * A forced ks changes the arithmetic (another split of the sum): results are still independent of M for a
 * fixed ks, but not bitwise equal to qmma_launch's. For the benchmark (choosing the qmma_split rule) only. */
cudaError_t qmma_launch_variant(const qmma_params *p, int rt, int nf, int ks_force, cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
