/* cuda/cu_settings.h: the CUDA engine's settings, the one place in cuda/ that reads the environment.
 *
 * Every field is a kill switch of the ZLLM_CUDA_* family (1 = on, the default; 0 = the older or plainer path,
 * for comparisons and for devices where a path misbehaves) or a test setting. None of them is needed for
 * correct results: every switch leaves a correct engine, and a switch marked "same bits" leaves every result
 * bit unchanged. The settings are read once per process, at the first call of cu_settings_get (engine_cuda_new
 * calls it first thing); later changes of the environment are not seen. docs/cuda.md lists them with the
 * kernels they steer. */
#ifndef ZLLM_CUDA_CU_SETTINGS_H
#define ZLLM_CUDA_CU_SETTINGS_H

#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
    /* matrix products (chosen once per matrix at load, cuda/cuda_weights.cu) */
    int qtc;             /* ZLLM_CUDA_QTC: quantized tensor-core products (cuda/qtc.h) for Q4_K, Q6_K and Q8_0
                          * matrices; 0: the matrix is dequantized to F16 at load and served as a dense one */
    int wtc;             /* ZLLM_CUDA_WTC: dense 16-bit products through the batch-invariant tensor-core kernels
                          * (cuda/wtc.h); 0: cuBLAS (faster for prefill, NOT batch invariant at 2048 wide) */
    int wgmma;           /* ZLLM_CUDA_WGMMA: Hopper's wgmma forms of wtc, qtc and the prefill attention
                          * (attn_prefill_wg.h); 0: the mma.sync forms (same bits) */
    int fuse;            /* ZLLM_CUDA_FUSE: Q/K/V and gate/up matrices joined at load into one product each; 0:
                          * separate matrices */
    int qtc_glu;         /* ZLLM_CUDA_QTC_GLU: a qtc gate/up join interleaves its rows in blocks of 8 so that
                          * decode steps of <= 8 rows take qtc's SwiGLU epilogue; 0: rows in order, the product
                          * then the SwiGLU kernel (same bits) */
    int wtc_glu;         /* ZLLM_CUDA_WTC_GLU: wtc's narrow kernel (steps of <= 32 rows) applies the SwiGLU of an
                          * interleaved gate/up join in its epilogue; 0: the SwiGLU kernel after it (same bits) */
    int qtc_pair;        /* ZLLM_CUDA_QTC_PAIR: Q/K and V matrices of two qtc types (Q4_K_M) in one launch for
                          * steps of <= 8 rows; 0: two launches (same bits) */
    int qtc_f16;         /* ZLLM_CUDA_QTC_F16: qtc products of >= 1,024 batch rows (M) on sm_90 through a 16-bit
                          * copy of their weights (qtc.h, QTC_F16); 0: the wgmma kernel (same bits) */
    /* launches */
    int pdl;             /* ZLLM_CUDA_PDL: programmatic dependent launch on sm_90+ (cuda/pdl.cuh); 0: every
                          * kernel waits for the one before, as a plain launch (same bits) */
    int inputs_early;    /* ZLLM_CUDA_KV_PRE: kernels read the step's input block (positions, slots, lengths)
                          * before their PDL wait; 0: after it (same bits) */
    /* attention and sampling */
    int attn_tc;         /* ZLLM_CUDA_ATTN_TC: decode attention on tensor cores for F16/BF16 caches of head size
                          * 64 or 128 (cuda/attn_decode_tc.h); 0: the CUDA-core split-K kernels (other bits) */
    int attn_cluster;    /* ZLLM_CUDA_ATTN_CLUSTER: the tensor-core decode attention folds a row's blocks through
                          * a thread-block cluster on sm_90+; 0: through global memory (same bits) */
    int prefill_tc;      /* ZLLM_CUDA_PREFILL_TC: prefill attention on tensor cores where it serves the shape
                          * (cuda/attn_prefill_tc.h); 0: the CUDA-core tiled kernel (other bits) */
    int sample_cluster;  /* ZLLM_CUDA_SAMPLE_CLUSTER: the sampler spreads a large vocabulary over a thread-block
                          * cluster on sm_90+; 0: one block per row (same bits) */
    /* tests */
    /* ZLLM_CUDA_QTC_GRID: > 0 caps qtc's persistent narrow grid at this many CTAs, so that every CTA takes several
     * tiles, and runs its wgmma kernel with this many CTAs a column block wherever their even ranges can serve, so
     * that splits are cut between CTAs (tests/run_gpu.sh); 0: automatic (same bits) */
    int qtc_grid;
} cu_settings;

/* The settings, read from the environment at the first call (thread safe). Never fails: a variable that is
 * unset, empty or not 0/1 (a whole number for qtc_grid) leaves the default. */
const cu_settings *cu_settings_get(void);
#ifdef __cplusplus
}
#endif
#endif
