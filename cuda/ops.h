/* cuda/ops.h: the element-wise and row kernels of the CUDA engine, plus the cuBLAS matrix product wrapper.
 * Each has a CPU reference in cuda/test_ops.cu (gpu_test_ops), which runs it on fresh random inputs with
 * poisoned outputs.
 *
 * Conventions: matrices are row-major, one row per token; the residual stream and every matrix-product output
 * are f32; matrix-product inputs (normalised activations, the attention output, the SwiGLU product) and the KV
 * cache use the engine's compute type (cu_dtype: F32 for F32 models, F16 or BF16 otherwise). Every launcher
 * enqueues on `st` and returns 0, or -1 with a message in err when the launch itself fails (a fault inside a
 * kernel surfaces at the caller's next synchronisation). Nothing here allocates, so every launcher may be
 * captured into a CUDA graph. */
#ifndef ZLLM_CUDA_OPS_H
#define ZLLM_CUDA_OPS_H
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

typedef enum { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2 } cu_dtype;

/* bytes per element of a cu_dtype */
size_t ops_dtype_size(cu_dtype t);
const char *ops_dtype_name(cu_dtype t);

/* fed rows of an embedding gather (zl_seq.feed): a row whose token is negative takes the id carried for its
 * slot (the sampler's last id for it, sample_params.carry_tok) and its generator state (carry_rng into rng). */
typedef struct {
    const int32_t *slot;       /* device [n_rows]: each row's KV slot (the carry index) */
    const int32_t *carry_tok;  /* device [n_slots + 1]: carried ids */
    const uint64_t *carry_rng; /* device [n_slots + 1]: carried generator states */
    uint64_t *rng;             /* device [n_rows]: sampling state of entry r, written for fed rows (a fed row is
                                * a decode row, and decode rows come first: row r is entry r) */
} ops_feed;

/* out[t][0..dim) = f32(table[tokens[t]][0..dim)); table [vocab][dim] of type tdt. Token ids must be < vocab
 * (the engine checks them before the step); with fd (may be NULL), a negative id is a fed row (ops_feed), and
 * without fd it reads row 0. */
int ops_embed(const void *table, cu_dtype tdt, int dim, const int32_t *tokens, int n_rows, float *out,
              const ops_feed *fd, cudaStream_t st, char *err, size_t errlen);

/* RMSNorm: out[r] = x[rows ? rows[r] : r] / sqrt(mean(x^2) + eps) * w, with f32 statistics; out [n_rows][dim]
 * of type odt. rows (device, may be NULL) gathers rows, e.g. the last token of each sequence before the LM head. */
int ops_rmsnorm(const float *x, const int32_t *rows, const float *w, int dim, float eps, int n_rows,
                void *out, cu_dtype odt, cudaStream_t st, char *err, size_t errlen);

/* per-head RMSNorm in place (qwen3's and gemma3's q and k norms): for r < n_rows, h < n_heads (<= 65535), the
 * head_dim values at x + r * ld + h * head_dim become x / sqrt(mean(x^2) + eps) * w, f32, one warp per head in a
 * fixed order (a row's values never depend on the other rows) */
int ops_head_rmsnorm(float *x, int ld, int n_rows, int n_heads, int head_dim, const float *w, float eps,
                     cudaStream_t st, char *err, size_t errlen);

/* y[r][i] += b[i] for r < n_rows, i < n (Q/K/V biases, f32) */
int ops_bias_add(float *y, const float *b, int n_rows, int n, cudaStream_t st, char *err, size_t errlen);

/* RoPE host table: cs[p][i] = (cos, sin)(p * base^(-2i/rope_dim)) for p < n_pos, i < rope_dim/2, computed in
 * double and rounded to f32 (so the kernels need no transcendental functions and the angle is exact at long
 * positions). cs must hold n_pos * rope_dim floats (pairs). */
void ops_rope_table_host(float *cs, int n_pos, int rope_dim, double base);
/* rotates, in place, the first rope_dim dims of each of the n_heads heads (head_dim apart) of every row r at
 * position pos[r]. style 0: adjacent pairs (x[2i], x[2i+1]); 1: halves (x[i], x[i + rope_dim/2]).
 * cs: device copy of the host table; pos[r] < its n_pos. */
int ops_rope(float *x, const int32_t *pos, int n_rows, int n_heads, int head_dim, int rope_dim, int style,
             const float *cs, cudaStream_t st, char *err, size_t errlen);

/* KV append: for each row r, kc[slot[r]][pos[r]][0..kv_dim) = k[r], same for v, converted to kvdt.
 * Caches are [n_slots][n_ctx][kv_dim] (kv_dim = n_kv_heads * head_dim) for one layer. */
int ops_kv_append(const float *k, const float *v, const int32_t *slot, const int32_t *pos, int n_rows, int kv_dim,
                  int n_ctx, void *kc, void *vc, cu_dtype kvdt, cudaStream_t st, char *err, size_t errlen);

/* arguments of ops_qkv_rope_append (q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim) */
typedef struct {
    const float *qkv;          /* [n_rows][ld] f32 products: q at column 0, k at q_dim, v at q_dim + kv_dim */
    int ld;                    /* floats between rows of qkv: >= q_dim + 2 * kv_dim */
    const float *bq, *bk, *bv; /* f32 biases [q_dim], [kv_dim], [kv_dim]; each may be NULL (no add at all) */
    const int32_t *pos;        /* [n_rows] device: position of each row (< n_ctx, < the RoPE table's n_pos) */
    const int32_t *slot;       /* [n_rows] device: KV slot of each row (the sentinel slot for padded rows) */
    int n_rows;                /* rows of the step (0: nothing to do) */
    int n_heads, n_kv_heads, head_dim; /* attention shape */
    int rope_dim, style;       /* as ops_rope: dims rotated per head (<= head_dim), 0 adjacent pairs / 1 halves */
    const float *cs;           /* device copy of ops_rope_table_host's table */
    float *q;                  /* [n_rows][q_dim] f32 output: rotated q, rows contiguous (what attention reads) */
    int n_ctx;                 /* positions per slot of the caches */
    void *kc, *vc;             /* this layer's caches [n_slots][n_ctx][kv_dim] of kvdt */
    cu_dtype kvdt;             /* cache element type */
    int pos_pre;               /* 1: pos and slot were written before the launch by something other than a kernel
                                  of its stream that may still run (the engine's host copy ahead of the step): the
                                  kernel reads them, and its RoPE pair, before its PDL wait (cuda/pdl.cuh); the
                                  same bits either way */
    const int32_t *blocks;     /* paged KV (cuda/attention.h): device block tables, slot[r] the offset of row r's
                                  table, the caches a pool of blocks of 1 << kv_block_log2 rows; NULL: contiguous */
    int kv_block_log2;         /* paged KV: log2 of the rows per block, 0..8 */
    const float *part;         /* NULL, or the products as split partials [ks][n_rows][ld] f32 (what a qtc launch with
                                  part_only leaves), each element the sum of its ks partials in split order ((p0 +
                                  p1) + ...), as qtc's merge sums them: the same values; qkv is then unused */
    int ks;                    /* part's planes: 2..8 */
} ops_qkv_args;

/* The attention prologue in one launch: q, k, v = the slices of a->qkv (+ bq, bk, bv when given); q and k rotated
 * as by ops_rope; q written to a->q, k and v to the caches as by ops_kv_append. Bit-for-bit the results of
 * ops_bias_add (each bias) + ops_rope (q) + ops_rope (k) + ops_kv_append on contiguous q, k, v arrays: the same
 * f32 operations in the same order (gpu_test_ops checks it). Returns -1 with err set for a launch failure or a
 * shape the grid cannot cover (a row of more than 65535 * 256 elements). */
int ops_qkv_rope_append(const ops_qkv_args *a, cudaStream_t st, char *err, size_t errlen);

/* SwiGLU: out[r][i] = silu(gate[r][i]) * up[r][i], out of type odt */
int ops_swiglu(const float *gate, const float *up, int n_rows, int n, void *out, cu_dtype odt, cudaStream_t st,
               char *err, size_t errlen);

/* x[i] += y[i] for i < n (residual stream, f32) */
int ops_residual_add(float *x, const float *y, size_t n, cudaStream_t st, char *err, size_t errlen);

/* converts n elements from src (type sdt) to dst (type ddt); round-to-nearest-even on the way down */
int ops_convert(const void *src, cu_dtype sdt, void *dst, cu_dtype ddt, size_t n, cudaStream_t st, char *err,
                size_t errlen);

/* Y[n_rows][n_out] (f32, rows ldy floats apart: ldy >= n_out, 0 means n_out) = X[n_rows][n_in] (type dt) x W^T,
 * W [n_out][n_in] (type dt), + beta * Y. ldy > n_out writes a column slice of a wider array (the engine's Q/K/V
 * and gate/up products when they are separate matrices); the columns in between are left as they are.
 * Through cublasGemmEx with CUBLAS_COMPUTE_32F: F32 stays true f32 (no TF32; the handle keeps the default math
 * mode), F16/BF16 use the tensor cores with f32 accumulation. The handle's stream must be the caller's.
 * Returns -1 with err set when cuBLAS refuses the call (including ldy < n_out). */
int ops_gemm(cublasHandle_t h, const void *x, const void *w, cu_dtype dt, int n_rows, int n_in, int n_out,
             float *y, int ldy, float beta, char *err, size_t errlen);

/* Dual-output variants: each writes its value v to out (type odt; skipped when out is NULL) and to outf (f32;
 * skipped when NULL): outf gets v rounded to odt and back when round_f is 1 (the operands a 16-bit product sees),
 * v itself when 0. The value written is computed exactly as by the single-output function. The engine passes
 * outf NULL; the f32 copy serves f32-input kernels such as cuda/lab/qgemv.h. Same failure contract as the
 * others. */
int ops_rmsnorm_dual(const float *x, const int32_t *rows, const float *w, int dim, float eps, int n_rows,
                     void *out, cu_dtype odt, float *outf, int round_f, cudaStream_t st, char *err, size_t errlen);
/* ops_rmsnorm_dual's values into out (odt F16 or BF16) with each row's 256-element units in qtc's 16-bit k order
 * (qtc_kpos, cuda/qtc.h): a qtc product in its 16-bit form then reads them as they are (qtc_params.x_perm). The
 * same bits as ops_rmsnorm_dual (outf NULL) followed by that permutation. dim a multiple of 256 that
 * ops_rmsnorm_dual serves in its register form (up to 8 elements a thread of its block); -1 with err set
 * otherwise or on a launch error. */
int ops_rmsnorm_kperm(const float *x, const float *w, int dim, float eps, int n_rows, void *out, cu_dtype odt,
                      cudaStream_t st, char *err, size_t errlen);
/* 1 when ops_rmsnorm_kperm serves rows of dim elements of odt. Never fails. */
int ops_rmsnorm_kperm_serves(int dim, cu_dtype odt);
/* ops_rmsnorm_dual's values (odt F16) written as qtc's wgmma images of nx columns (32, 64 or 128; row r is column
 * r, element i at qtc_ximage_pos(nx, dim / 256, r, i), cuda/qtc.h): a qtc product whose qtc_ximage_nx is nx then
 * reads them as they are (qtc_params.x_image). The same values as ops_rmsnorm_dual, other places; positions of
 * columns past n_rows are not written. Rows as ops_rmsnorm_kperm serves them; -1 with err set otherwise or on a
 * launch error. */
int ops_rmsnorm_ximage(const float *x, const float *w, int dim, float eps, int n_rows, void *out, cu_dtype odt, int nx,
                       cudaStream_t st, char *err, size_t errlen);
/* A qtc product's split sum before the norm: x[r][i] = ((part[0][r][i] + part[1][r][i]) + ...) + x[r][i] over the
 * ks planes of part ([ks][n_rows][dim] f32, 2 <= ks <= 8: what a qtc launch with part_only leaves, whose merge
 * computes exactly that), written back to x, then the norm of the new x into out in layout lay: 0 rows (as
 * ops_rmsnorm_dual), 1 qtc's 16-bit k order (as ops_rmsnorm_kperm), 32, 64 or 128 qtc's wgmma images (as
 * ops_rmsnorm_ximage). The same bits as qtc's own merge followed by that norm. Rows as ops_rmsnorm_merge_serves
 * says; -1 with err set otherwise or on a launch error. */
int ops_rmsnorm_merge(float *x, const float *part, int ks, const float *w, int dim, float eps, int n_rows, void *out,
                      cu_dtype odt, int lay, cudaStream_t st, char *err, size_t errlen);
/* 1 when ops_rmsnorm_merge serves rows of dim elements of odt (as ops_rmsnorm_kperm, rows of at most 4,096
 * elements). Never fails. */
int ops_rmsnorm_merge_serves(int dim, cu_dtype odt);
/* SwiGLU dual: gate and up rows are ld floats apart (ld >= n; 0 means n), so both may be column slices of one
 * [n_rows][2n] product (gate = gu, up = gu + n, ld = 2n); out and outf are [n_rows][n], rows contiguous. The
 * value of each element does not depend on ld. */
int ops_swiglu_dual(const float *gate, const float *up, int ld, int n_rows, int n, void *out, cu_dtype odt,
                    float *outf, int round_f, cudaStream_t st, char *err, size_t errlen);
/* SwiGLU dual of an interleaved gate/up product (the layout of wtc_params.glu: each row of gu, ld floats apart,
 * holds per block of 8 features the 8 gate values then the 8 up values): out[r][j] = silu(gate) * up stored as
 * ops_swiglu_dual stores it (the same value for the same gate and up). n features, a multiple of 8; ld >= 2 n.
 * Same failure contract as the others. */
int ops_swiglu_il8_dual(const float *gu, int ld, int n_rows, int n, void *out, cu_dtype odt, float *outf, int round_f,
                        cudaStream_t st, char *err, size_t errlen);
/* ops_swiglu_il8_dual's F16 values written as qtc's wgmma images of nx columns (32, 64 or 128), as
 * ops_rmsnorm_ximage writes its rows; n a multiple of 256. Same failure contract. */
int ops_swiglu_il8_ximage(const float *gu, int ld, int n_rows, int n, void *out, int nx, cudaStream_t st, char *err,
                          size_t errlen);
/* src (f32, n elements) to out (odt) and/or outf; outf may equal src (rounding in place) */
int ops_cast_dual(const float *src, size_t n, void *out, cu_dtype odt, float *outf, int round_f, cudaStream_t st,
                  char *err, size_t errlen);
#endif
