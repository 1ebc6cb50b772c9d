/* cuda/qtc.h: quantized matrix products on tensor cores from a tile-packed copy of the GGUF blocks, one kernel
 * family for every batch size M (decode M = 1 up to prefill-sized M):
 *
 *   y[m][o] = sum_i W[o][i] * x[m][i]  (+ y_in[m][o] when y_in is given: a fused residual add), f32 output
 *
 * for m < M, o < n_out, i < n_in; x is f16 (the engine's 16-bit activations), y and y_in f32.
 *
 * The weights are repacked once, on the host, by qtc_pack: the GGUF rows are cut into tiles of 16 rows x 256
 * elements ("tile blocks"), each stored contiguously with its quants laid out in the order the mma fragments
 * consume them (every lane of a warp reads whole 16-byte words, and a warp reads 512 contiguous bytes per load)
 * and its scales beside them. A tile block holds exactly the bytes of the 16 x 256 GGUF blocks it replaces
 * (Q4_K 2304 = 16 x 144, Q6_K 3360 = 16 x 210, Q8_0 4352 = 16 x 8 x 34): the packed copy is the file's size
 * (plus the zero rows that pad n_out to a multiple of 16).
 *
 * Arithmetic (the batch-invariance contract of the engine): y[m][o] is computed by a FIXED sequence of
 * operations that depends only on (type, n_in, n_out) and the data of row o and batch row m, never on M:
 *   - each weight is dequantized to f16 by a fixed formula (Q4_K: (q - 0) * f16(d sc) - f16(dmin m) by one f16
 *     fma; Q6_K: (q - 32) * f16(d sc); Q8_0: q * f16(d)), the same for every M;
 *   - mma.sync.m16n8k16 (f16 x f16 -> f32) with the weights as the A operand (16 rows) and the activations as
 *     the B operand (8 batch rows per fragment; a column's result never depends on another column), chained
 *     from zero over a fixed k order (lane t of a quad owns elements 64t .. 64t+63 of each 256-element unit, four
 *     per 16-wide k step);
 *   - split-K in two levels: kn = qtc_split_narrow(type, n_in, n_out) contiguous ranges of units ("sub-splits",
 *     unit range [units s / kn, units (s + 1) / kn)), each chained from zero; consecutive groups of r = kn / ks
 *     of them (ks = qtc_split) summed in order, then the ks group sums in order, then + y_in:
 *     ((p0 + .. + p_{r-1}) + (p_r + .. + p_{2r-1})) + ... The narrow kernel runs one warp per sub-split and
 *     sums all of them in one CTA; the wide kernel runs one CTA per group (its r sub-splits one after another,
 *     each from zero) and sums the groups in a second kernel from a workspace: the same operations in the same
 *     order.
 * M only decides which kernel runs (the narrow one up to 8 columns, or 16 where its staged slice serves; a wide one
 * above: on sm_90 the wide split with its k16 steps issued as wgmma, whose chains give mma.sync's bits,
 * cuda/wgmma.cuh), where the narrow kernel reads x from, how many 8-column fragments a CTA carries and how many CTAs
 * run. cuda/test_qtc.cu checks this bit for bit (a row alone vs the same row among others, M up to 2048).
 * No allocation, no host synchronisation: launches may be captured into CUDA graphs. */
#ifndef ZLLM_CUDA_QTC_H
#define ZLLM_CUDA_QTC_H
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
    const void *w;       /* packed tiles from qtc_pack (qtc_packed_bytes bytes), 16-byte aligned */
    int n_in;            /* elements per row, a multiple of 256 */
    int n_out;           /* rows, >= 1 */
    int m;               /* activation rows (batch), >= 1 */
    const uint16_t *x;   /* [m][ldx] f16 bit patterns, 16-byte aligned */
    int ldx;             /* halves between rows of x: >= n_in, a multiple of 8 (0 means n_in) */
    float *y;            /* [m][ldy] f32 output; must not overlap x */
    int ldy;             /* floats between rows of y and y_in: >= n_out (0 means n_out) */
    const float *y_in;   /* NULL, or [m][ldy] added to the product (may equal y: in-place residual add) */
    void *workspace;     /* scratch of the wide kernels (m > 8, or 16 where the narrow kernel's slice serves): the
                          * split partials (ks > 1), the wgmma kernel's images of x and its hand-over sums; at least
                          * qtc_workspace_bytes(type, n_in, n_out) bytes of device memory, 16-byte aligned, not
                          * shared with a launch that may run concurrently; may be NULL for m <= 8 */
    size_t workspace_bytes;
    uint16_t *glu;       /* NULL, or the SwiGLU epilogue: W's rows are gate and up rows interleaved in blocks of 8
                          * (tile k = gate features 8k..8k+7, then up features 8k..8k+7), and the launch writes
                          * f16(silu(gate) * up) (cuda/act.cuh silu_mul, round to nearest) as [m][ldg] f16 bit
                          * patterns instead of y: the same bits as the product into y followed by
                          * ops_swiglu_il8_dual. Only where qtc_glu_fused(p) is 1; y, ldy and y_in are then unused.
                          * Must not overlap w or x */
    int ldg;             /* halves between rows of glu: >= n_out / 2 */
    int x_perm;          /* 1: x's rows are already in the 16-bit form's k order (each 256-element unit permuted by
                          * qtc_kpos, as ops_rmsnorm_kperm writes them): the form skips its own permutation. Only
                          * where qtc_f16_form(p) is 1 (else qtc_launch returns cudaErrorInvalidValue) */
    int x_rows;          /* x_perm: rows of x the launch may read, >= m (0 means m); rows past m change no output */
    int x_image;         /* 1: x holds the wgmma kernel's stage images of the launch's columns, NX = qtc_ximage_nx(p)
                          * (element e of column c at qtc_ximage_pos(NX, n_in / 256, c, e), as ops_rmsnorm_ximage
                          * writes them; ldx unused): the launch skips its own copy of x into that layout (the same
                          * bits). Columns past m up to the next multiple of NX may hold any values: their outputs
                          * are not stored. Only where qtc_ximage_nx(p) > 0 (else qtc_launch returns
                          * cudaErrorInvalidValue) */
    int part_only;       /* 1: the launch leaves its split partials in the workspace instead of summing them into y:
                          * [ks][m][n_out] f32 from the workspace's start, ks = qtc_split(type, n_in, n_out), whose
                          * sum in split order ((p0 + p1) + ...) (+ y_in) is y's bits (ops_rmsnorm_merge sums them
                          * so); y and y_in are not touched (y must still be given). Only where qtc_partials(p) > 0
                          * (else qtc_launch returns cudaErrorInvalidValue) */
    unsigned *flags;     /* NULL, or the wgmma kernel's hand-over flags: qtc_flags_bytes() bytes of device memory,
                          * 4-byte aligned, all zero before a launch that is given them (every launch leaves them
                          * zero), not shared with a launch that may run concurrently and written by nothing else.
                          * With them a product whose splits would run in more than one wave runs them evenly over
                          * one (the same bits); without them, one CTA a split */
} qtc_params;

/* The wgmma kernel's stage image of x (x_image): for each block of NX columns and each 256-element unit, 4 k tiles
 * of NX columns x 128 bytes; within a column's unit, 4-byte word w = 32 s + c (s < 4, c < 32: the k slot order of
 * qtc's steps, qtc.cu) sits in 16-byte chunk c of the column, 128-byte swizzled (chunk c % 8 at (c % 8) ^ (col % 8)
 * of k tile c / 8), at word s of the chunk. Returns the position, in 16-bit elements from the image's start, of
 * element e (0 <= e < 256 units) of column col. */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline size_t
    qtc_ximage_pos(int nx, int units, int col, int e) {
    const int b = col / nx, n = col % nx, u = e >> 8, w = (e & 255) >> 1, c = w & 31;
    const size_t byte = (((size_t)b * units + u) * 4 + (size_t)(c >> 3)) * (size_t)nx * 128 + (size_t)n * 128 +
                        (size_t)(((c & 7) ^ (n & 7)) << 4) + (size_t)(w >> 5) * 4 + (size_t)(e & 1) * 2;
    return byte / 2;
}

/* The 16-bit form's k order (QTC_F16): element e (0..255) of a 256-element unit of a row sits at position
 * qtc_kpos(e) of the unit, e = 64 t + 4 s + 2 h + b -> 16 s + 8 h + 2 t + b (s < 16; t, h, b < 4, 2, 2): position
 * 16 s + j holds the element that the k slot j of qtc's step s takes. */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline int
    qtc_kpos(int e) {
    return ((e >> 2) & 15) * 16 + ((e >> 1) & 1) * 8 + (e >> 6) * 2 + (e & 1);
}

/* 1 when qtc serves this type and shape (Q4_K, Q6_K, Q8_0; n_in a positive multiple of 256; n_out >= 1) */
int qtc_supported(ggml_type t, int n_in, int n_out);

/* bytes of the packed copy (0 when unsupported): ceil(n_out / 16) * (n_in / 256) tile blocks */
size_t qtc_packed_bytes(ggml_type t, int n_in, int n_out);

/* The split-K count (warps per CTA, 1..8): a function of (type, n_in, n_out) only, never of M or of the device.
 * 0 when unsupported. */
int qtc_split(ggml_type t, int n_in, int n_out);

/* The sub-split count of the narrow kernel (warps per CTA, 1..8, a multiple of qtc_split: that many sub-splits
 * per wide split): a function of (type, n_in, n_out) only. 0 when unsupported. */
int qtc_split_narrow(ggml_type t, int n_in, int n_out);

/* the most dynamic shared memory per block a qtc kernel of type t asks for (0: unsupported type): a device whose
 * cudaDevAttrMaxSharedMemoryPerBlockOptin is smaller cannot run it (H100/H200: 227 KiB, all types fit; A100:
 * 163 KiB, Q4_K only; Ada: 99 KiB, none), and launches there fail with the attribute call's error. The wgmma
 * forms, which run only on sm_90, are not counted: they ask up to 204 KiB of its 227 KiB. */
size_t qtc_smem_bytes(ggml_type t);

/* bytes of workspace a wide launch (m > 8) of this shape needs (0: unsupported shape): ks * 256 * n_out floats when
 * ks > 1, then room for 256 * n_in halves (x as the wgmma kernel's stage images), then on a device where
 * wtc_wgmma() the 16-bit form's copies (QTC_F16: up to 128 MiB of weights and 64 MiB or 4,096 columns of x, 256
 * bytes of alignment) */
size_t qtc_workspace_bytes(ggml_type t, int n_in, int n_out);

/* bytes of qtc_params.flags on the current device: 128 a multiprocessor where wtc_wgmma(), else 0 (no launch there
 * uses them) */
size_t qtc_flags_bytes(void);

/* Host: packs n_out GGUF rows (row_bytes apart, exactly as in the file) into dst (qtc_packed_bytes bytes of
 * host memory). Returns 0, or -1 for an unsupported type/shape or a row_bytes that does not match the type. */
int qtc_pack(ggml_type t, const void *rows, size_t row_bytes, int n_in, int n_out, void *dst);

/* qtc_pack on n_threads host threads (0: the hardware threads, at most 16; never more than one per 64 tiles): the
 * same bytes whatever the count (tiles are independent). A thread that cannot be started leaves its share to the
 * calling thread. Returns as qtc_pack, and -1 for n_threads < 0. qtc_pack is this with n_threads 0. */
int qtc_pack_threads(ggml_type t, const void *rows, size_t row_bytes, int n_in, int n_out, void *dst,
                     int n_threads);

/* Enqueues y = W x (+ y_in) on st. Returns cudaSuccess, cudaErrorInvalidValue for an unsupported type, m or
 * shape, cudaErrorMisalignedAddress for a w or x that is not 16-byte aligned, cudaErrorInvalidValue when the wide kernel
 * needs a workspace that is missing or too small, or the launch's error. A fault
 * inside the kernel surfaces at the caller's next synchronisation. */
cudaError_t qtc_launch(const qtc_params *p, cudaStream_t st);

/* NX (32, 64 or 128 columns a CTA) when qtc_launch(p) runs the wgmma kernel for p's m and shape (sm_90, above the
 * narrow kernel's forms, below the 16-bit form's), whose x may then come as its images (x_image); 0 otherwise.
 * Attribute queries only. Never fails. */
int qtc_ximage_nx(const qtc_params *p);

/* ks > 1 when qtc_launch(p) runs a wide kernel (above the narrow kernel's rows, below the 16-bit form's) whose split
 * partials can be left to the caller (part_only): p's shape has splits, m <= 256 (one column chunk) and no SwiGLU
 * epilogue; 0 otherwise. Attribute queries only. Never fails. */
int qtc_partials(const qtc_params *p);

/* 1 when qtc_launch(p) runs the 16-bit form (QTC_F16: m >= 1,024 on sm_90 where p's workspace holds its copies,
 * ZLLM_CUDA_QTC_F16 not 0), whose x may come in its k order (x_perm). Attribute queries only. Never fails. */
int qtc_f16_form(const qtc_params *p);

/* 1 when qtc_launch(p) runs the SwiGLU epilogue (p->glu): the narrow kernel's batches (m <= 8, and up to 16 where
 * its slice form is the default) and the 16-bit form's (QTC_F16, the default from 1,024 columns where p's workspace
 * holds its copies), of an n_out that is a multiple of 16. Otherwise the caller runs the product into y and
 * ops_swiglu_il8_dual. */
int qtc_glu_fused(const qtc_params *p);

/* Two products of the same activations in ONE launch of the narrow kernel: a->y and b->y exactly as qtc_launch(a)
 * and qtc_launch(b) would write them (the same bits: each CTA runs one of the two with its own CTA count). For
 * Q4_K_M's layers whose Q/K matrix is Q4_K and V matrix Q6_K: the second product then costs no dependent launch.
 * Both must have m <= 8, the same m, x, ldx, ldy and n_in, the same narrow split, no y_in and no glu, types
 * (Q4_K, Q6_K) in that order, and an ldy given unless both n_out are equal; otherwise returns
 * cudaErrorNotSupported without launching (the caller launches them one after the other). Other errors as
 * qtc_launch. */
cudaError_t qtc_launch_pair(const qtc_params *a, const qtc_params *b, cudaStream_t st);

/* qtc_launch_nf's nf for the wide kernel: 128 weight rows x 64 batch columns per CTA, x staged in shared memory
 * (the default above the narrow kernel's columns where wtc_wgmma() is 0) */
#define QTC_WIDE 64
/* ... for the wgmma wide kernel (sm_90a only: wtc_wgmma() true): the wide kernel's split and arithmetic, its k16
 * steps issued as wgmma with the dequantized A fragments in registers, fed by bulk copies from a producer
 * warpgroup; 64, 32 or 128 batch columns per CTA. The default above the narrow kernel's columns where wtc_wgmma()
 * (32 columns up to m = 32, 64 up to 64, 128 above) */
#define QTC_WG 65
#define QTC_WG32 66
#define QTC_WG128 70
/* ... for the narrow kernel with x staged in shared memory (m <= 16, in groups of 8 columns, zeros past m): QTC_XS,
 * each warp copies its unit range of x once and reads its B fragments from there for every tile its CTA takes
 * (where the CTA's copies fit in 64 KiB, cudaErrorInvalidValue elsewhere); QTC_XR, each unit's x goes through the
 * warp's ring beside its tile block. The defaults: QTC_XS where it fits from 3 columns (5 where a CTA has fewer
 * than 4 warps) up to 16 (8 where a CTA has fewer than 4 warps), else QTC_XR from 5 columns up to 8 */
#define QTC_XS 67
#define QTC_XR 68
/* ... for the narrow kernel with only the CTA's columns of x staged, each lane reading its B operands a step pair at
 * a time (no unit of x held in registers): m <= 8 where the CTA's copies fit in 64 KiB, and on sm_90 (wtc_wgmma())
 * 9 to 16 columns in one CTA (two fragments: each tile dequantized once) where they fit in 128 KiB;
 * cudaErrorInvalidValue elsewhere. The default for Q8_0 matrices of 256 tiles or more at m <= 2, and from 9 to 16
 * columns where it serves, where a CTA has 4 warps or more */
#define QTC_XC 69
/* ... for the 16-bit form (sm_90 where wtc_wgmma(), with qtc_workspace_bytes' workspace): the weights dequantized
 * into a 16-bit copy whose k order is qtc's step order (in row chunks of at most 128 MiB), x permuted the same way
 * (column chunks of at most 64 MiB and 4,096 columns), and wtc's TMA-fed wgmma kernel run in qtc's split order
 * (wtc_launch_qsplit): the same operands in the same mma slots, chained and summed as every form. The default
 * from 1,024 columns where it runs (unless ZLLM_CUDA_QTC_F16=0); serves the SwiGLU epilogue. cudaErrorInvalidValue
 * where wtc_wgmma() is 0 or the workspace is smaller */
#define QTC_F16 71

/* qtc_launch with a forced kernel: nf in {1, 2, 4, 8} = the narrow kernel with nf 8-column fragments per CTA (x
 * read from global memory), QTC_XS / QTC_XR / QTC_XC = the narrow kernel with x staged, QTC_WIDE = the mma.sync wide
 * kernel, QTC_WG / QTC_WG32 / QTC_WG128 = the wgmma one, 0 = the default chosen from m (narrow up to 16 columns,
 * staged from 3, wgmma above on sm_90, the mma.sync wide kernel above elsewhere). Results are bitwise those of
 * qtc_launch. cudaErrorInvalidValue for another nf, or for the wgmma forms where wtc_wgmma() is 0. For checks and
 * benchmarks. */
cudaError_t qtc_launch_nf(const qtc_params *p, int nf, cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
