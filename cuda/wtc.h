/* cuda/wtc.h: matrix products with 16-bit weights (F16, BF16) on tensor cores, one arithmetic for every batch
 * size M (decode M = 1 up to prefill-sized M): the batch-invariant replacement of cuBLAS for 16-bit models.
 *
 *   y[m][o] = sum_i W[o][i] * x[m][i]  (+ y_in[m][o] when y_in is given: a fused residual add), f32 output
 *
 * for m < M, o < n_out, i < n_in; W [n_out][n_in] and x [M][ldx] in the same 16-bit type (the engine's wt
 * arrays, used in place: no packed copy), y and y_in f32.
 *
 * Why: cuBLAS picks its kernel (tile shape, split-K) by M, so a row's last bits depend on how many rows share its
 * step, and on 2048-wide llamas that flips greedy tokens of a sequence decoded alone against the same sequence in
 * a batch (measured: cuda/test_engine_gpu.cu on tests/run_gpu.sh's 2048-wide models).
 *
 * Arithmetic (a function of (n_in, n_out) and the data of row o and batch row m only, never of M):
 *   - ks = wtc_split(n_in, n_out) splits of the k range, split s = [s n_in / ks, (s + 1) n_in / ks) (multiples
 *     of 64);
 *   - within a split, mma.sync.m16n8k16 (16-bit x 16-bit -> f32) with W as the A operand (16 rows) and x as the
 *     B operand (8 batch rows per fragment: a column's result never depends on another column), k slot j of a
 *     step holding element k0 + j (natural order), the steps chained in k order from zero;
 *   - the split partials summed in split order, ((p0 + p1) + p2) + ..., then + y_in.
 * Which kernel computes them follows M (and the device) only, never a bit:
 *   - M <= 16: the narrow kernel (mma.sync; one CTA of ks warps per 16 or 32 W rows, warp s chains split s from
 *     its own cp.async ring of weights and x rows through one or two 8-row B fragments, one warp a 16-row tile
 *     sums); sm_90, 16 < M <= 32: the same kernel with four B fragments where its CTAs of 32 W rows fit one wave;
 *   - sm_90, M > 16 otherwise: wgmma fed by TMA, warp-specialized (a producer warpgroup, one, two or four consumer warpgroups on
 *     mbarriers), every split chained in the CTA with the running sum in registers; tiles of 128 W rows and up to
 *     128 batch rows (192 where a product takes fewer waves so), smaller where that brings idle multiprocessors in,
 *     with rings as deep as shared memory allows; up to 64 rows 256 W rows a CTA (four consumer warpgroups) where
 *     128 take more than a wave and 256 fit one; up to 64 rows the whole batch against 64 W rows with k halved
 *     between the two CTAs of a cluster where those pairs fit one wave (an even split count: rank 1's split
 *     partials join rank 0's sum in split order through distributed shared memory); 64-row batch tiles in CTA
 *     pairs that share each W stage (TMA multicast) where they pair up;
 *   - M > 16 on other devices, or with ZLLM_CUDA_WGMMA=0: the mma.sync wide kernels (one CTA per split plus an ordered merge for
 *     small grids, else splits chained in the CTA).
 * wgmma chains give the same bits as mma.sync chains (measured, cuda/wgmma.cuh), so every form is one
 * arithmetic; cuda/test_wtc.cu checks it bit for bit (a row alone against the same row inside M up to 2048,
 * every form) and against a double-precision oracle.
 * The engine uses it by default for its dense 16-bit matrices (cuda/cuda_weights.cu; ZLLM_CUDA_WTC=0 gives cuBLAS
 * back, faster for prefill and large batches and not batch invariant). wtc_params.form forces a form (tests and
 * benchmarks: the bits are the same).
 * Launches are programmatic dependents (cuda/pdl.cuh): weight tiles stream in before pdl_wait. No allocation, no
 * host synchronisation (the TMA descriptors are built on the host at launch): capturable into CUDA graphs. */
#ifndef ZLLM_CUDA_WTC_H
#define ZLLM_CUDA_WTC_H
#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* one product; every pointer is device memory, 16-byte aligned */
typedef struct {
    int bf16;            /* 1: W and x are BF16; 0: F16 */
    const void *w;       /* [n_out][n_in] 16-bit weights, rows n_in apart */
    int n_in;            /* a positive multiple of 64 */
    int n_out;           /* >= 1 */
    int m;               /* batch rows, >= 1 */
    const void *x;       /* [m][ldx] 16-bit */
    int ldx;             /* elements between rows of x: >= n_in, a multiple of 8 (0 means n_in) */
    int x_rows;          /* rows of x the launch may read: >= m (0 means m). Rows past m change no output row; the
                          * TMA form (6) reads its last batch tile whole from x when they reach its end (a tile
                          * past x_rows is zero-filled by the tensor map's bounds, which makes a launch up to 1.5x
                          * slower: H200, 8B Q/K/V at M = 144 in tiles of 128 rows, 41 against 27 us at M = 256) */
    float *y;            /* [m][ldy] f32; must not overlap w or x */
    int ldy;             /* floats between rows of y and y_in: >= n_out (0 means n_out) */
    const float *y_in;   /* NULL, or [m][ldy] added to the product (may equal y: the in-place residual add) */
    void *workspace;     /* split partials of the wide kernel's small grids: wtc_workspace_bytes bytes, or NULL
                          * when that is 0; not shared with a launch that may run concurrently */
    size_t workspace_bytes;
    int sm_count;        /* multiprocessors (0: the device's): decides the wide kernel's form, never the bits */
    int form;            /* 0 automatic; 1 narrow; 2 wide, splits chained in the CTA; 3 wide, one CTA per split;
                          * 4 wgmma, splits chained in the CTA; 5 wgmma, one cluster of split CTAs per tile;
                          * 6 wgmma fed by TMA, warp-specialized (checks and benchmarks: every form gives the same
                          * bits; narrow needs m <= 32 and, above 16, its rings to fit the device's shared
                          * memory; 4 to 6 need wtc_wgmma()) */
    void *glu;           /* NULL, or the SwiGLU epilogue: W's rows are gate and up rows interleaved in blocks of 8
                          * (rows 16 b .. 16 b + 7 the gate rows of features 8 b .., rows 16 b + 8 .. the up rows of
                          * the same features), and instead of y the launch writes
                          * silu(gate) * up, rounded to the 16-bit type, as [m][ldg] values (n_out / 2 features).
                          * The same bits as the product into y followed by ops_swiglu_il8_dual. Only where
                          * wtc_glu_fused(p) is 1; y and y_in are then unused. Must not overlap w or x */
    int ldg;             /* elements between rows of glu: >= n_out / 2 */
} wtc_params;

/* 1 when wtc serves this shape (n_in a positive multiple of 64, n_out >= 1) */
int wtc_supported(int n_in, int n_out);

/* the split count (1, 2, 4 or 8): a function of (n_in, n_out) only. 0 when unsupported. */
int wtc_split(int n_in, int n_out);

/* workspace bytes a launch of up to m_max rows may need (0: none) */
size_t wtc_workspace_bytes(int n_in, int n_out, int m_max);

/* 1 when the current device gives a block the kernels' shared memory (sm_80 and sm_90 do; sm_89 does not).
 * Never fails (0 when the query does). */
int wtc_available(void);

/* 1 when the wgmma forms (4 to 6) run on the current device: an sm_90 device (built as sm_90a) and ZLLM_CUDA_WGMMA
 * not 0; form 0 then uses form 6 for m > 16 where the narrow kernel does not serve. Never fails (0 when the query
 * does). */
int wtc_wgmma(void);

/* 1 when a launch of p (its shape, m, form and the device) would run the SwiGLU epilogue (p->glu): n_out a multiple
 * of 16, and the narrow kernel (form 1, automatic up to 16 rows and on sm_90 up to 32 where its CTAs fit one wave)
 * or the TMA-fed form (form 6, automatic above 16 rows on sm_90 otherwise). Never fails (0 otherwise). */
int wtc_glu_fused(const wtc_params *p);

/* Enqueues y = W x (+ y_in), or the SwiGLU of it into p->glu, on st. Returns cudaSuccess, cudaErrorInvalidValue
 * for an unserved shape, bad strides, a NULL pointer, a forced form that cannot run, a glu launch that
 * wtc_glu_fused refuses, or a needed workspace that is missing or too small,
 * cudaErrorMisalignedAddress for a w or x not 16-byte aligned, or the launch's error. */
cudaError_t wtc_launch(const wtc_params *p, cudaStream_t st);

/* wtc_launch in the TMA form (F16 only, tiles of 128 W rows x 128 batch rows) with qtc's split order instead of
 * wtc_split's (cuda/qtc.h): kn sub-splits of the n_in / 256 units of 256 elements, sub-split s the units
 * [floor(units s / kn), floor(units (s + 1) / kn)), each chained from zero in k order; consecutive groups of r
 * summed in order, then the groups in order, then + y_in; or the SwiGLU epilogue as wtc_launch's (n_out a multiple
 * of 16). For qtc's products through a 16-bit copy of their weights (qtc_launch's QTC_F16 form). Returns
 * cudaErrorNotSupported where the TMA form does not run (wtc_wgmma() 0 or no tensor-map encoder),
 * cudaErrorInvalidValue for n_in not a multiple of 256, kn outside 1 .. n_in / 256, r not dividing kn, bad strides
 * or a NULL pointer, cudaErrorMisalignedAddress as wtc_launch, or the launch's error. p->form, p->workspace and
 * p->sm_count are not used. */
cudaError_t wtc_launch_qsplit(const wtc_params *p, int kn, int r, cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
