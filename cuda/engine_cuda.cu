/* cuda/engine_cuda.cu: the CUDA backend of engine/engine.h (one GPU).
 *
 * Data layout and types
 *   - Matrices live on the GPU in one compute type `wt`: F32 when every matrix of the file is F32, otherwise
 *     BF16 when any matrix is BF16, otherwise F16 (F16 files, and quantized ones, which are dequantized on the
 *     host with quant_dequant_row and converted on the GPU at load). Each matrix (cu_mat) may in addition keep
 *     its raw GGUF rows on the GPU for cuda/qgemv.cu, which then serves the steps of at most qg_max rows
 *     (s_qg_max: none by default, every step with ZLLM_CUDA_GEMV_MAX=all, which also drops the dense copy of
 *     quantized matrices); 16-bit matrices are their own raw rows. Norm weights and biases are f32. qgemv is
 *     not the default because it is not yet faster than cuBLAS above M = 1 and a mixed path breaks batch
 *     invariance (docs/perf.md); a GPU dequantize-into-scratch path for large steps would remove the dense copy.
 *   - The residual stream x and every matrix-product output are f32; matrix-product inputs (normalised rows,
 *     attention output, SwiGLU product) are cast to wt, so F32 models run in f32 end to end and 16-bit models
 *     get tensor-core products with f32 accumulation and an f32 residual. qgemv takes the same inputs as f32
 *     arrays holding the wt-rounded values (xf). The residual adds are fused into the output projections
 *     (cuBLAS beta = 1, qgemv y_in).
 *   - KV caches are wt-typed, per layer [n_slots + 1][n_ctx][n_kv_heads][head_dim]; slot n_slots is the
 *     sentinel that padded rows of a graph bucket write into and never read from (kv_len 0).
 *   - Fewer launches per layer (single-sequence decode is launch-bound): when cuBLAS serves wq, wk and wv on
 *     their dense copies (the default for every model), they are ONE matrix (cu_layer.wqkv) and ONE product
 *     into E->qkv, likewise wg and wu (wgu, into E->gu); otherwise the separate products write the column
 *     slices of the same arrays. One kernel (ops_qkv_rope_append) then adds the biases, applies RoPE, writes q
 *     for attention and k, v into the caches, and the SwiGLU reads gate and up as the two halves of E->gu's rows.
 *     A decode layer is 10 launches (rmsnorm, QKV, prologue, attention, cast, wo, rmsnorm, gate/up, SwiGLU, wd)
 *     instead of 15 (18 with Q/K/V biases); ZLLM_CUDA_FUSE=0 keeps the matrices separate (docs/notes-fuse.md).
 *     Through wtc (16-bit models) fewer still: the decode attention writes the 16-bit input of wo itself (no
 *     cast), and the gate/up join interleaves its rows in blocks of 8 so that wtc's TMA form (steps above 16
 *     rows, prefill included) applies the SwiGLU in its epilogue and writes the down product's input (no f32
 *     gate/up round trip, no SwiGLU kernel); smaller steps run the product and an interleaved SwiGLU kernel, with
 *     the same bits.
 *     Matrices served by qtc are joined the same way at load (s_upload_joined: one packed qtc matrix for Q/K/V,
 *     or for Q/K when V has another type, and one for gate/up, its rows interleaved in blocks of 8 so that qtc's
 *     narrow kernel (decode steps of <= 8 rows) applies the SwiGLU in its epilogue; larger steps run the product
 *     and the interleaved SwiGLU kernel, with the same bits).
 *     Where Q/K and V stay two qtc matrices of two types (Q4_K_M's Q6_K V layers), steps of <= 8 rows run both
 *     in one launch (s_matmul_pair, qtc_launch_pair: the same bits as two).
 *   - Programmatic dependent launch (cuda/pdl.cuh, sm_90+, ZLLM_CUDA_PDL=0 off): our kernels of a step are
 *     launched so that each may start while the one before drains; qtc streams its first weight tiles before it
 *     waits for its input. cuBLAS launches stay plain (full stream order). No result changes.
 * A step
 *   Entries are reordered so that decode entries (one token) come first, one row each, then prefill entries,
 *   each a run of consecutive rows. Every row goes through the same matrix products; attention runs the split-K
 *   flash-decoding kernels over the decode rows and the prefill kernel over the prefill runs. The final norm
 *   gathers each entry's last row, the LM head makes [n][vocab] logits, and the GPU sampler writes one id per
 *   entry: only ids (and the advanced generator states) come back, logits only when asked for.
 *   All per-step inputs are packed into one pinned host block and sent by ONE cudaMemcpyAsync on the engine's
 *   stream, so that every kernel (eager or graph) reads them from fixed device addresses after the copy.
 * Batch invariance
 *   Every kernel computes a row from that row's data alone; the flash-decoding split count is fixed at start-up
 *   (from the SM count and n_ctx, not from the batch) and max_kv_len is always n_ctx, so the split boundaries of
 *   a row do not depend on its neighbours. cuBLAS may pick different algorithms for different batch sizes, which
 *   can change f32 rounding in the last bits; gpu_test_engine_gpu measures whether greedy tokens stay the same.
 *   They do on the small models of tests/run_gpu.sh, but NOT on 2048-wide 16-bit llamas (measured, H100: at least
 *   8 of 16 sequences differ from their run alone in bf16, 2 of 16 in f16). So the dense 16-bit matrices go through
 *   cuda/wtc.h by default (one arithmetic for every step size: those models pass); ZLLM_CUDA_WTC=0 puts cuBLAS
 *   back (faster for prefill and batches above 64 rows, docs/perf.md session 10, and not batch invariant).
 *   qgemv and cuBLAS are never mixed by step size by default (s_qg_max): that broke greedy invariance.
 *   By default (ZLLM_CUDA_QTC=0 turns it off) quantized matrices of a type cuda/qtc.h covers (Q4_K, Q6_K, Q8_0
 *   rows of a multiple of 256 elements; F16 engines) keep only a tile-packed copy of their GGUF blocks and go
 *   through qtc at EVERY step size (tensor cores, one fixed arithmetic per element whatever M: invariant by
 *   construction). With ZLLM_CUDA_QMMA=1, the matrices qtc leaves and qmma covers go through qmma likewise.
 * Pipeline stages (worker/stage.h, docs/pipeline.md)
 *   An engine made with opts->layer_begin/layer_end holds only its layers' weights and KV caches, the embedding
 *   only when it starts at layer 0 (or is the last stage of a tied model), the final norm, LM head and sampler
 *   only when it ends at the last layer. A later stage reads its input rows through a gather kernel and an
 *   earlier one writes its output rows through a scatter kernel; both take the buffer's address from the step's
 *   input block (hptr) and the caller's row of every engine row from a permutation (perm: entries are
 *   reordered decode-first), so the same captured decode graph serves every transport buffer. A launched step takes
 *   host pointers (staged through hbuf); engine_cuda_step_hidden_dev takes device pointers and cross-process
 *   events, waited on the stream before the graph replay and recorded after it (not captured as graph event
 *   nodes: the transport has one event per ring slot, so captured nodes would need a graph per slot or an
 *   exec update per launch, and a stream wait just before cudaGraphLaunch orders the graph's first node the
 *   same way). A stage that is not last does not synchronise: the next step only waits (ev_in) for the
 *   previous step's input copy before rewriting the pinned input block.
 * Errors: any CUDA or cuBLAS error fails the step with e->err naming it; the engine then refuses further steps
 * (the device state is unknown) and the caller must exit. */
extern "C" {
#include "engine.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"
}
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "attention.h"
#include "attn_decode_tc.h"
#include "cu_host.h"
#include "cuda_common.h"
#include "engine_cuda.h"
#include "ops.h"
#include "qgemv.h"
#include "qmma.h"
#include "qtc.h"
#include "sample.h"
#include "wtc.h"

enum { CU_GEMV_ALL = 1 << 30, /* gemv_env: qgemv for steps of any size */
       CU_HIST = 256,        /* history tokens per row staged for the repetition penalty (repeat_last_n capped) */
       CU_MAX_BUCKETS = 64 };

/* one weight matrix [n_out][n_in] on the device, in one or both of two forms */
typedef struct {
    int n_in, n_out;           /* elements per row, rows */
    ggml_type qt;              /* type of raw (a qgemv type); meaningful only when raw != NULL */
    const void *raw;           /* [n_out][row_bytes] GGUF rows for qgemv, or NULL (== dense for F16/BF16 wt) */
    size_t row_bytes;          /* bytes per raw row */
    void *dense;               /* [n_out][n_in] of the engine's wt for cuBLAS, or NULL (quantized: raw only) */
    int owns_raw, owns_dense;  /* 1 when this matrix frees the pointer (raw == dense is owned once, as dense) */
    int qg_max;                /* steps of <= qg_max rows use qgemv on raw, larger ones cuBLAS on dense */
    int qmma;                  /* 1: raw is served by qmma (cuda/qmma.h) at every step size; dense is NULL */
    int qtc;                   /* 1: raw holds qtc_pack's tiles (cuda/qtc.h), served by qtc at every step size;
                                * dense is NULL */
    int glu8;                  /* 1: a gate/up join whose dense rows interleave the two in blocks of 8 (wtc's SwiGLU
                                * layout, wtc_params.glu): the product's columns are in that order too */
} cu_mat;

typedef struct {
    cu_mat wqkv;               /* [q_dim + 2 kv_dim][dim]: the rows of wq, then wk, then wv in one dense wt array,
                                * one cuBLAS product into E->qkv, when s_upload_mat gave all three a dense copy
                                * only (s_mat_cublas_only: the default for every model); then wq, wk, wv are empty
                                * (n_out 0). Otherwise empty, and wq, wk, wv write the column slices of E->qkv. */
    cu_mat wqk;                /* [q_dim + kv_dim][dim]: wq rows then wk rows packed as one qtc matrix when both
                                * are of one qtc type but wv is not (Q4_K_M's Q6_K layers); else empty. wqkv is
                                * likewise one qtc matrix when all three share a qtc type */
    cu_mat wq, wk, wv, wo;     /* attention matrices (empty when wqkv or wqk holds them) */
    cu_mat wgu;                /* [2 ffn_dim][dim]: wg rows then wu rows, fused likewise (into E->gu; through wtc
                                * interleaved in blocks of 8 instead, glu8), or packed as one qtc matrix when both
                                * are of one type qtc serves; or empty */
    cu_mat wg, wu, wd;         /* FFN matrices (wg, wu empty when wgu holds them) */
    float *attn_norm, *ffn_norm; /* [dim] f32 */
    float *bq, *bk, *bv;       /* biases f32 [rows], NULL when absent */
    void *kc, *vc;             /* this layer's caches [n_slots + 1][n_ctx][kv_dim] of wt */
} cu_layer;

/* offsets (bytes) of the per-step input block, identical in the pinned host copy and on the device */
typedef struct {
    size_t rng;                /* uint64 [max_batch] generator state per sampling row (advanced on the GPU) */
    size_t out_tok;            /* int32 [max_batch] sampled ids (written by the GPU; copied back with rng) */
    size_t tokens, pos, slot;  /* int32 [max_tok] per row: token id, position, KV slot */
    size_t kv_len;             /* int32 [max_batch] decode rows: attend to [0, kv_len) */
    size_t seq_row0, seq_rows, seq_slot, seq_pos0; /* int32 [max_batch] prefill entries */
    size_t last_row;           /* int32 [max_batch] per sampling row (= ordered entry): its last token's row */
    size_t eslot;              /* int32 [max_batch] per sampling row: its KV slot (n_slots for a padded row), the
                                * index of the sampler's carry (sample_params.carry_idx) */
    size_t hist_len;           /* int32 [max_batch] staged history tokens per sampling row */
    size_t params;             /* zl_sampling [max_batch] */
    size_t perm;               /* int32 [max_tok] pipeline stage: engine row -> caller's row (-1: padded row) */
    size_t hptr;               /* uint64 [2] pipeline stage: device addresses of h_in [T][dim], h_out [T][dim] */
    size_t hist;               /* int32 [max_batch][CU_HIST] history tail per sampling row */
    size_t core_end;           /* end of everything but hist: the copy length when no row needs a penalty */
    size_t total;              /* whole block */
} cu_inputs;

/* one launched step's results on their way back (cu_engine.fl) */
typedef struct {
    const zl_seq *seqs;        /* the caller's entries (theirs until the wait: rng written back there) */
    int n;                     /* entries */
    int *order;                /* [max_batch] ordered entry k -> caller index */
    uint8_t *h_out;            /* pinned [in.tokens - in.rng]: the step's rng and out_tok areas of the input block
                                * (a later step rewrites h_in before this one is waited for); mapped, and written
                                * by the sampler itself, with two input blocks (cu_engine.n_inb) */
    uint8_t *d_out;            /* h_out's device address (mapped host memory) */
    float *logits;             /* caller's [n][vocab] logits buffer (synchronous steps only), or NULL */
    cudaEvent_t ev0, ev1;      /* around the step's device work (input copy .. output copy) */
} cu_flight;

typedef struct {
    zl_engine base;            /* public part; must be first */
    int dev;                   /* CUDA device ordinal */
    int sm_count;              /* multiprocessors */
    int dead;                  /* 1 after a device error: further steps are refused */
    cu_dtype wt;               /* matrix / KV / GEMM-input type */
    int max_tok;               /* rows the activation buffers hold (>= max_batch) */
    cudaStream_t st;           /* the one stream everything runs on */
    cublasHandle_t cb;         /* bound to st, workspace cb_ws */
    void *cb_ws;               /* cuBLAS workspace (fixed so graph capture never allocates) */
    size_t cb_ws_bytes;
    cu_layer *L;               /* [n_layers] */
    void *tok_embd;            /* [vocab][dim] wt (the embedding gather; quantized tables are dequantized) */
    cu_mat out;                /* LM head [vocab][dim]; shares tok_embd's storage when tied and 16-bit */
    int gemv_env;              /* ZLLM_CUDA_GEMV_MAX: 0..8 qgemv row limit for every type, CU_GEMV_ALL for
                                * "all" (qgemv at every size, no dense copy of quantized matrices); -1: default */
    int qmma_env;              /* ZLLM_CUDA_QMMA: 1 = qmma for the matrices it covers (at every step size), 0 =
                                * off, the default: qmma is 1.3x faster at M = 1..8 but 2.1x slower at M = 64 on
                                * the 8B shape (docs/notes-qmma.md), and one path must serve every M */
    int qtc_glu_env;           /* ZLLM_CUDA_QTC_GLU: 1 (default) = a qtc gate/up join interleaves its rows in blocks
                                * of 8 (glu8) and decode steps of <= 8 rows take qtc's SwiGLU epilogue; 0 = in
                                * order, the product and ops_swiglu_dual (the same bits either way) */
    int fuse_env;              /* ZLLM_CUDA_FUSE: 1 (default) = Q/K/V and gate/up matrices served by cuBLAS are
                                * fused into one product each (cu_layer wqkv, wgu); 0 = separate (comparisons) */
    int qtc_env;               /* ZLLM_CUDA_QTC: 1 (default) = qtc for every matrix it covers (Q4_K, Q6_K, Q8_0
                                * rows of 256-multiple length in an F16 engine), at every step size; 0 = off */
    int wtc_on;                /* 1 (default): products on dense 16-bit matrices go through cuda/wtc.h (one
                                * arithmetic for every step size: batch invariance at every width); 0
                                * (ZLLM_CUDA_WTC=0): cuBLAS, which is not batch invariant on 2048-wide models
                                * (docs/perf.md, session 9). Needs a 16-bit wt and wtc_available */
    int round_f;               /* 1: f32 qgemv inputs are rounded to wt (the operands cuBLAS sees); always 1 */
    float *xf;                 /* f32 qgemv input [max_tok][max(dim, ffn_dim, q_dim)] (NULL for F32 models) */
    double last_gpu_ms;        /* device time of the last step waited for, from its flight's ev0/ev1; -1 before */
    float *out_norm;           /* [dim] */
    float *rope_cs;            /* [n_ctx][rope_dim/2] (cos, sin) */
    void *kv;                  /* one allocation holding every layer's K and V */
    size_t kv_bytes;
    size_t weight_bytes;       /* bytes of weights on the device */
    /* activations, [max_tok] rows unless noted */
    float *x;                  /* residual [dim] */
    float *qkv;                /* Q/K/V products [q_dim + 2 kv_dim]: q at column 0, k at q_dim, v at q_dim + kv_dim
                                * (biases and RoPE not applied: ops_qkv_rope_append reads them from here) */
    float *q;                  /* [q_dim] biased, rotated q, what attention reads */
    float *att;                /* attention output [q_dim] f32 */
    void *att_w;               /* att cast to wt (== att for F32) */
    void *xb;                  /* GEMM input, wt, [max(dim, ffn_dim, q_dim)] */
    float *gu;                 /* gate/up products [2 ffn_dim]: gate at column 0, up at ffn_dim (interleaved by 8
                                * for a glu8 join); or, after wtc's SwiGLU epilogue, the down product's wt input
                                * [ffn_dim]. The SAME allocation as qkv (sized for the wider of the two): qkv lives
                                * from the Q/K/V product to ops_qkv_rope_append, gu from the gate/up product to the
                                * SwiGLU (or the down product), in stream order */
    float *logits;             /* [max_batch][vocab] */
    void *attn_ws;             /* flash-decoding partials */
    size_t attn_ws_bytes;
    void *qtc_ws;              /* qtc's and wtc's split partials (and qtc's slot-order copy of x): the largest
                                * qtc_workspace_bytes / wtc_workspace_bytes of their matrices (NULL when none needs
                                * one); one stream, so one buffer serves all */
    size_t qtc_ws_bytes;
    int n_splits;              /* fixed split count (batch invariance), from attn_decode_splits at n_ctx */
    void *samp_ws;             /* sampler scratch */
    size_t samp_ws_bytes;
    cu_inputs in;              /* input block layout */
    uint8_t *h_in;             /* the pinned host input block of the step being staged (h_inb[cur_p]) */
    uint8_t *d_in;             /* its device input block (d_inb[cur_p]): what IN_PTR addresses */
    int n_inb;                 /* input blocks: 2 for a whole-model engine, 1 for a pipeline stage. With 2, step k
                                * uses block k & 1 (the flight index), its graphs are captured once per block, its
                                * input copy runs on cst while the step before still runs, and the sampler writes
                                * the ids straight into the flight's mapped h_out: no copy lies between two steps'
                                * kernels (H100 trace, docs/perf.md session 24: 16-24 us a step went to the two
                                * copies and the boundary). A stage keeps one block, copied on st (its stream also
                                * waits on the other stages' events) */
    uint8_t *h_inb[2];         /* pinned host input blocks */
    uint8_t *d_inb[2];         /* device input blocks */
    int cur_p;                 /* the block (and flight) the step being staged, or the graph being captured, uses */
    cudaStream_t cst;          /* n_inb 2: the input copies' stream */
    cudaEvent_t ev_cp[2];      /* n_inb 2: recorded on cst after block p's copy; st waits on it before the step */
    float *h_logits;           /* pinned [max_batch][vocab] */
    int n_buckets;             /* CUDA graphs: batch sizes and executables (none when no_graphs) */
    int bucket[CU_MAX_BUCKETS];
    cudaGraphExec_t gexec[2][CU_MAX_BUCKETS];   /* [input block][bucket] */
    int *order;                /* the flight being built's order (cu_flight.order) */
    int *crow;                 /* host scratch [max_batch]: caller index -> its first row in caller order */
    float *hbuf;               /* pipeline stage: [max_tok][dim] device staging of a step's host h_in/h_out */
    cudaEvent_t ev_in;         /* recorded after each step's input copy (no timing) */
    int in_pending;            /* 1: a step returned without synchronising; wait ev_in before rewriting h_in */
    int abandoned;             /* 1: engine_cuda_abandon: destroy frees host memory only (stream may never end) */
    /* steps queued ahead (zl_engine.depth 2): a step's results leave through its flight, so that the next
     * step can be staged and queued before this one's ids reach the host. The sampler writes each entry's id and
     * generator state into the slot's carry, and the next step's embedding gather reads them for fed rows: the
     * ids never make a host round trip between two steps of a sequence */
    cu_flight fl[2];           /* the launched steps' results, oldest at fl_head */
    int fl_head;               /* index of the oldest launched step not waited for */
    int fl_count;              /* launched steps not waited for, 0..2 (a synchronous step is one launch + wait) */
    int32_t *carry_tok;        /* device [n_slots + 1]: the id last sampled for each slot (+ the padded rows') */
    uint64_t *carry_rng;       /* device [n_slots + 1]: that entry's generator state after its draw */
    uint8_t *carry_ok;         /* host [n_slots]: 1 when the slot's latest launched step sampled it (may feed) */
    const zl_step *op_q[2];    /* zl_engine_ops glue: the steps launched and not waited for, oldest at op_head */
    int op_head, op_count;     /* (index of the oldest, how many: 0..2) */
    int op_ran;                /* 1: the one step in op_q ran whole at its launch (synchronous, or a stage) */
} cu_engine;

/* ------------------------------------------------------------------ weight upload */

/* host rows [r0, r0 + nr) of w as f32 into dst */
static int s_rows_to_f32(const zl_weight *w, int64_t r0, int64_t nr, float *dst) {
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
        float *d = dst + (size_t)r * w->n_in;
        if (w->type == GGML_F32) memcpy(d, src, (size_t)w->n_in * 4);
        else if (w->type == GGML_F16) for (int64_t i = 0; i < w->n_in; i++) d[i] = fp16_to_f32(((const uint16_t *)src)[i]);
        else if (w->type == GGML_BF16) for (int64_t i = 0; i < w->n_in; i++) d[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        else if (quant_dequant_row(w->type, src, d, w->n_in) != 0) return -1;
    }
    return 0;
}

/* staging for conversions: host f32 rows -> device f32 -> ops_convert into the destination type */
typedef struct {
    float *h;                  /* pinned [cap] */
    float *d;                  /* device [cap] */
    size_t cap;                /* floats */
} cu_stage;

/* uploads w into a new device array of type dt ([n_out][n_in]); copies bytes as they are when the file's type
 * already is dt, otherwise converts through f32. */
static int s_upload(cu_engine *E, cu_stage *sg, const zl_weight *w, cu_dtype dt, void **out, char *err,
                    size_t errlen) {
    const size_t n = (size_t)w->n_in * w->n_out, es = ops_dtype_size(dt);
    void *d = NULL;
    *out = NULL;
    CU_CHECK(cudaMalloc(&d, n * es));
    E->weight_bytes += n * es;
    if ((w->type == GGML_F32 && dt == CU_F32) || (w->type == GGML_F16 && dt == CU_F16) ||
        (w->type == GGML_BF16 && dt == CU_BF16)) {
        CU_CHECK(cudaMemcpy(d, w->data, n * es, cudaMemcpyHostToDevice));
    } else {
        const int64_t rows_per = (int64_t)(sg->cap / (size_t)w->n_in);
        if (rows_per < 1) { snprintf(err, errlen, "%s: row of %lld too wide to stage", w->name, (long long)w->n_in); goto fail; }
        for (int64_t r0 = 0; r0 < w->n_out; r0 += rows_per) {
            const int64_t nr = w->n_out - r0 < rows_per ? w->n_out - r0 : rows_per;
            if (s_rows_to_f32(w, r0, nr, sg->h) != 0) {
                snprintf(err, errlen, "%s: cannot dequantize type %s", w->name, ggml_type_name(w->type));
                goto fail;
            }
            CU_CHECK(cudaMemcpyAsync(sg->d, sg->h, (size_t)nr * w->n_in * 4, cudaMemcpyHostToDevice, E->st));
            if (ops_convert(sg->d, CU_F32, (uint8_t *)d + (size_t)r0 * w->n_in * es, dt, (size_t)nr * w->n_in, E->st,
                            err, errlen) != 0) goto fail;
            CU_CHECK(cudaStreamSynchronize(E->st));   /* sg->h is reused by the next chunk */
        }
    }
    *out = d;
    return 0;
fail:
    cudaFree(d);
    return -1;
}

static int s_is_16bit(ggml_type t) { return t == GGML_F16 || t == GGML_BF16; }

/* Steps of at most this many rows use qgemv for a matrix of type t, larger ones cuBLAS. Default 0 (cuBLAS on
 * the dense copy at every size), from what zllm-bench and gpu_test_engine_gpu measured on an H100 (docs/perf.md,
 * GPU section): qgemv beats cuBLAS only for Q4_K/Q5_K at M = 1 (8B shape: 5.15 ms per step against 7.07 ms);
 * Q8_0/Q6_K qgemv are slower than cuBLAS on F16 even at M = 1, BF16 qgemv ~2% slower at M = 1..4, every type
 * far slower at M >= 2; and mixing the two paths by step size (qgemv for small buckets, cuBLAS for large) broke
 * greedy batch invariance on every model checked, while qgemv at every size keeps it. So the choice is all or
 * nothing: ZLLM_CUDA_GEMV_MAX=all serves every step through qgemv (invariant; faster for single-stream Q4_K,
 * much slower for batches), 1..8 gives the mixed path for measurements only. */
static int s_qg_max(const cu_engine *E, ggml_type t) {
    (void)t;
    return E->gemv_env >= 0 ? E->gemv_env : 0;
}

/* 1 when matrix w is served by qmma: the knob is on, the engine's 16-bit type is F16 (qmma takes f16
 * activations: the wt copies xb / att_w) and qmma covers the type and shape */
static int s_qmma_ok(const cu_engine *E, const zl_weight *w) {
    return E->qmma_env && E->wt == CU_F16 && qmma_split(w->type, (int)w->n_in, (int)w->n_out) > 0 &&
           w->row_bytes == ggml_row_bytes(w->type, w->n_in);
}

/* 1 when matrix w is served by qtc (cuda/qtc.h): on by default (ZLLM_CUDA_QTC=0 turns it off), the engine's
 * 16-bit type is F16 (qtc takes f16 activations) and qtc covers the type and shape. It takes precedence over
 * qmma and qgemv: one kernel family for every step size, and faster than both (docs/perf.md). A device with
 * less shared memory per block than the type's kernels need (qtc_smem_bytes) keeps the other paths. */
static int s_qtc_ok(const cu_engine *E, const zl_weight *w) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, E->dev) != cudaSuccess) optin = 0;
    return E->qtc_env && E->wt == CU_F16 && qtc_supported(w->type, (int)w->n_in, (int)w->n_out) &&
           w->row_bytes == ggml_row_bytes(w->type, w->n_in) && qtc_smem_bytes(w->type) <= (size_t)optin;
}

/* uploads matrix w into M: a dense wt array (converted, or dequantized on the host, when the file's type
 * differs) for cuBLAS, plus the raw GGUF rows when qgemv serves small steps of this type (for 16-bit types
 * the dense array is the raw one). */
static int s_upload_mat(cu_engine *E, cu_stage *sg, const zl_weight *w, cu_mat *M, char *err, size_t errlen) {
    const size_t nb = (size_t)w->n_out * w->row_bytes;
    const ggml_type dt = E->wt == CU_BF16 ? GGML_BF16 : GGML_F16;
    void *d = NULL;
    memset(M, 0, sizeof *M);
    M->n_in = (int)w->n_in;
    M->n_out = (int)w->n_out;
    if (s_qtc_ok(E, w)) {   /* qtc at every step: the packed tiles only (the file's bytes), no dense copy */
        const size_t pb = qtc_packed_bytes(w->type, M->n_in, M->n_out);
        void *h = malloc(pb);
        if (!h) { snprintf(err, errlen, "out of host memory packing %zu bytes", pb); return -1; }
        if (qtc_pack(w->type, w->data, w->row_bytes, M->n_in, M->n_out, h) != 0) {
            free(h);
            snprintf(err, errlen, "qtc_pack refused a %s matrix %d x %d", ggml_type_name(w->type), M->n_out, M->n_in);
            return -1;
        }
        cudaError_t ce = cudaMalloc(&d, pb);
        if (ce == cudaSuccess) ce = cudaMemcpy(d, h, pb, cudaMemcpyHostToDevice);
        free(h);
        if (ce != cudaSuccess) {
            if (d) cudaFree(d);
            snprintf(err, errlen, "uploading a packed %s matrix (%zu bytes): %s", ggml_type_name(w->type), pb,
                     cudaGetErrorString(ce));
            return -1;
        }
        M->raw = d; M->owns_raw = 1; M->qt = w->type; M->qtc = 1;
        E->weight_bytes += pb;
        return 0;
    }
    if (s_qmma_ok(E, w)) {   /* qmma at every step: the GGUF rows only, no dense copy */
        CU_CHECK(cudaMalloc(&d, nb));
        M->raw = d; M->owns_raw = 1; M->qt = w->type; M->row_bytes = w->row_bytes; M->qmma = 1;
        E->weight_bytes += nb;
        CU_CHECK(cudaMemcpy(d, w->data, nb, cudaMemcpyHostToDevice));
        return 0;
    }
    if (E->wt != CU_F32 && !s_is_16bit(w->type) && qgemv_pick(w->type, 1, M->n_in, M->n_out) &&
        s_qg_max(E, w->type) > 0) {
        CU_CHECK(cudaMalloc(&d, nb));
        M->raw = d; M->owns_raw = 1; M->qt = w->type; M->row_bytes = w->row_bytes;
        M->qg_max = s_qg_max(E, w->type);
        E->weight_bytes += nb;
        CU_CHECK(cudaMemcpy(d, w->data, nb, cudaMemcpyHostToDevice));
        if (M->qg_max == CU_GEMV_ALL) return 0;   /* qgemv serves every step: no dense copy */
    }
    if (s_upload(E, sg, w, E->wt, &M->dense, err, errlen) != 0) return -1;
    M->owns_dense = 1;
    if (!M->raw && E->wt != CU_F32 && qgemv_pick(dt, 1, M->n_in, M->n_out) && s_qg_max(E, dt) > 0) {
        M->raw = M->dense; M->qt = dt; M->row_bytes = (size_t)M->n_in * 2; M->qg_max = s_qg_max(E, dt);
    }
    return 0;
fail:
    return -1;
}

static void s_free_mat(cu_mat *M) {
    if (M->owns_raw) cudaFree((void *)M->raw);
    if (M->owns_dense) cudaFree(M->dense);
    memset(M, 0, sizeof *M);
}

/* 1 when M is served by cuBLAS on its own dense copy at every step size and by nothing else: no raw rows (qgemv,
 * qmma, qtc), so its dense rows may move into a fused matrix. A new serving path added to s_upload_mat must keep
 * this false for the matrices it serves. */
static int s_mat_cublas_only(const cu_mat *M) {
    return M->dense && M->owns_dense && !M->raw && !M->qmma && !M->qtc && M->n_out > 0;
}

/* Fuses n matrices of the same n_in that are all s_mat_cublas_only into F: one dense [sum n_out][n_in] array
 * holding their rows in order (one GEMM instead of n, each column block bitwise the product the part would
 * give, up to cuBLAS's choice of algorithm for the wider shape), or with il8 (two parts of equal n_out, a multiple
 * of 8: gate and up for wtc) their rows interleaved in blocks of 8 (F->glu8); the parts are then freed and
 * emptied, so the device holds the weights once. Returns 1 when fused, 0 when not (a part is served otherwise,
 * or the new array does not fit next to the parts: they stay as they are), -1 with err set on a CUDA error. Load
 * time only. */
static int s_fuse_mats(cu_engine *E, cu_mat *const *parts, int n, int il8, cu_mat *F, char *err, size_t errlen) {
    const size_t es = ops_dtype_size(E->wt);
    int rows = 0;
    for (int i = 0; i < n; i++) {
        if (!s_mat_cublas_only(parts[i]) || parts[i]->n_in != parts[0]->n_in) return 0;
        rows += parts[i]->n_out;
    }
    const int n_in = parts[0]->n_in;
    const size_t row_bytes = (size_t)n_in * es;
    void *d = NULL;
    if (cudaMalloc(&d, (size_t)rows * row_bytes) != cudaSuccess) {
        (void)cudaGetLastError();   /* out of memory is not sticky: keep the separate matrices */
        return 0;
    }
    if (il8 && (n != 2 || parts[0]->n_out != parts[1]->n_out || parts[0]->n_out % 8)) il8 = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t nb = (size_t)parts[i]->n_out * row_bytes;
        if (il8)   /* blocks of 8 rows: part i's block b to rows 16 b + 8 i */
            CU_CHECK(cudaMemcpy2DAsync((uint8_t *)d + (size_t)i * 8 * row_bytes, 16 * row_bytes, parts[i]->dense,
                                       8 * row_bytes, 8 * row_bytes, (size_t)parts[i]->n_out / 8,
                                       cudaMemcpyDeviceToDevice, E->st));
        else
            CU_CHECK(cudaMemcpyAsync((uint8_t *)d + off, parts[i]->dense, nb, cudaMemcpyDeviceToDevice, E->st));
        off += nb;
    }
    CU_CHECK(cudaStreamSynchronize(E->st));   /* the copies read the parts: done before they are freed */
    for (int i = 0; i < n; i++) s_free_mat(parts[i]);
    memset(F, 0, sizeof *F);
    F->n_in = n_in;
    F->n_out = rows;
    F->dense = d;
    F->owns_dense = 1;   /* E->weight_bytes unchanged: the same bytes, moved */
    F->glu8 = il8;
    return 1;
fail:
    cudaFree(d);
    return -1;
}

static int s_is_matrix_type_f32(const zl_model *m) {
    const zl_config *c = &m->cfg;
    if (m->tok_embd.type != GGML_F32 || m->output.type != GGML_F32) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        const zl_layer_weights *w = &m->layers[l];
        const zl_weight *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++) if (mats[i]->type != GGML_F32) return 0;
    }
    return 1;
}

static int s_has_bf16(const zl_model *m) {
    const zl_config *c = &m->cfg;
    if (m->tok_embd.type == GGML_BF16 || m->output.type == GGML_BF16) return 1;
    for (int l = 0; l < c->n_layers; l++) {
        const zl_layer_weights *w = &m->layers[l];
        const zl_weight *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++) if (mats[i]->type == GGML_BF16) return 1;
    }
    return 0;
}

/* Packs n (2 or 3) matrices of one type and row length that qtc serves as ONE qtc matrix F: their GGUF rows in
 * order (parts[0] first), so one product fills the adjacent column slices the separate products would fill; each
 * output element is the same fixed qtc sequence over the same row, so this changes launches, not arithmetic,
 * except through qtc_split (a function of the joined shape). il8 (two parts of equal rows, a multiple of 8: gate
 * and up) interleaves their rows in blocks of 8 instead (F->glu8, qtc's SwiGLU epilogue). Returns 1 when packed, 0
 * when the parts do not qualify (F untouched), -1 with err set on a failure. Load time only. */
static int s_upload_joined(cu_engine *E, cu_stage *sg, const zl_weight *const *parts, int n, int il8,
                           const char *name, cu_mat *F, char *err, size_t errlen) {
    if (!E->fuse_env) return 0;
    size_t nb = 0;
    int rows = 0;
    for (int i = 0; i < n; i++) {
        const zl_weight *w = parts[i];
        if (w->type != parts[0]->type || w->n_in != parts[0]->n_in || w->row_bytes != parts[0]->row_bytes ||
            !s_qtc_ok(E, w))
            return 0;
        nb += (size_t)w->n_out * w->row_bytes;
        rows += (int)w->n_out;
    }
    zl_weight j = *parts[0];
    j.n_out = rows;
    j.name = name;
    if (!s_qtc_ok(E, &j)) return 0;   /* the joined shape is not a qtc shape */
    uint8_t *cat = (uint8_t *)malloc(nb);
    if (!cat) { snprintf(err, errlen, "out of host memory joining %s", name); return -1; }
    if (il8 && (n != 2 || parts[0]->n_out != parts[1]->n_out || parts[0]->n_out % 8)) il8 = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = (size_t)parts[i]->n_out * parts[i]->row_bytes, rb = parts[i]->row_bytes;
        if (il8) {   /* blocks of 8 rows: part i's block q to rows 16 q + 8 i */
            for (size_t q = 0; q < (size_t)parts[i]->n_out / 8; q++)
                memcpy(cat + (16 * q + 8 * (size_t)i) * rb, (const uint8_t *)parts[i]->data + 8 * q * rb, 8 * rb);
        } else {
            memcpy(cat + off, parts[i]->data, b);
        }
        off += b;
    }
    j.data = cat;
    const int rc = s_upload_mat(E, sg, &j, F, err, errlen);
    free(cat);
    if (rc == 0) F->glu8 = il8;
    return rc == 0 ? 1 : -1;
}

static int s_upload_model(cu_engine *E, char *err, size_t errlen) {
    const zl_model *m = E->base.model;
    const zl_config *c = &m->cfg;
    cu_stage sg = {NULL, NULL, (size_t)16 << 20};
    int rc = -1;
    const int lb = E->base.layer_begin, le = E->base.layer_end, last = le == c->n_layers;
    const int tied = c->tied_embeddings || m->output.data == m->tok_embd.data;
    size_t widest = (size_t)c->dim > (size_t)c->ffn_dim ? (size_t)c->dim : (size_t)c->ffn_dim;
    if ((size_t)c->n_heads * c->head_dim > widest) widest = (size_t)c->n_heads * c->head_dim;
    if (sg.cap < widest) sg.cap = widest;
    CU_CHECK(cudaMallocHost((void **)&sg.h, sg.cap * 4));
    CU_CHECK(cudaMalloc((void **)&sg.d, sg.cap * 4));
    /* a pipeline stage uploads the embedding only to embed (first stage) or as the tied LM head (last stage) */
    if ((lb == 0 || (last && tied)) && s_upload(E, &sg, &m->tok_embd, E->wt, &E->tok_embd, err, errlen) != 0)
        goto fail;
    if (!last) {
        /* a stage before the last: no final norm, LM head or sampler weights */
    } else if (!tied) {
        if (s_upload_mat(E, &sg, &m->output, &E->out, err, errlen) != 0) goto fail;
    } else if (E->wt != CU_F32 && !s_is_16bit(m->tok_embd.type) &&
               ((qgemv_pick(m->tok_embd.type, 1, (int)m->tok_embd.n_in, (int)m->tok_embd.n_out) &&
                 s_qg_max(E, m->tok_embd.type) > 0) || s_qmma_ok(E, &m->tok_embd) || s_qtc_ok(E, &m->tok_embd))) {
        /* tied quantized table served by qgemv at small steps (raw rows plus a second dense copy) or by qmma at
         * every step (raw rows only; the embedding gather keeps reading the dense tok_embd) */
        if (s_upload_mat(E, &sg, &m->tok_embd, &E->out, err, errlen) != 0) goto fail;
    } else {
        /* tied: the LM head reads the (not owned) dense table */
        E->out.n_in = c->dim; E->out.n_out = c->vocab_size; E->out.dense = E->tok_embd;
        const ggml_type dt = E->wt == CU_BF16 ? GGML_BF16 : GGML_F16;
        if (E->wt != CU_F32 && qgemv_pick(dt, 1, c->dim, c->vocab_size) && s_qg_max(E, dt) > 0) {
            E->out.raw = E->tok_embd; E->out.qt = dt; E->out.row_bytes = (size_t)c->dim * 2;
            E->out.qg_max = s_qg_max(E, dt);
        }
    }
    if (last && s_upload(E, &sg, &m->output_norm, CU_F32, (void **)&E->out_norm, err, errlen) != 0) goto fail;
    for (int l = lb; l < le; l++) {
        const zl_layer_weights *w = &m->layers[l];
        cu_layer *d = &E->L[l];
        if (s_upload(E, &sg, &w->attn_norm, CU_F32, (void **)&d->attn_norm, err, errlen) != 0 ||
            s_upload(E, &sg, &w->ffn_norm, CU_F32, (void **)&d->ffn_norm, err, errlen) != 0 ||
            s_upload_mat(E, &sg, &w->wo, &d->wo, err, errlen) != 0 ||
            s_upload_mat(E, &sg, &w->w_down, &d->wd, err, errlen) != 0) goto fail;
        {
            /* Q/K/V of one qtc type: one packed qtc matrix (wqkv); else wq and wk of one type: wqk, wv apart; gate
             * and up of one qtc type: one packed matrix (wgu). Otherwise apart (and maybe fused for cuBLAS below) */
            const zl_weight *qkv[] = {&w->wq, &w->wk, &w->wv}, *gu[] = {&w->w_gate, &w->w_up};
            int jq = s_upload_joined(E, &sg, qkv, 3, 0, "attn_q+k+v", &d->wqkv, err, errlen);
            if (jq == 0) {
                jq = s_upload_joined(E, &sg, qkv, 2, 0, "attn_q+k", &d->wqk, err, errlen);
                if (jq == 1 && s_upload_mat(E, &sg, &w->wv, &d->wv, err, errlen) != 0) goto fail;
            }
            if (jq < 0) goto fail;
            if (jq == 0 && (s_upload_mat(E, &sg, &w->wq, &d->wq, err, errlen) != 0 ||
                            s_upload_mat(E, &sg, &w->wk, &d->wk, err, errlen) != 0 ||
                            s_upload_mat(E, &sg, &w->wv, &d->wv, err, errlen) != 0)) goto fail;
            /* gate and up interleaved in blocks of 8 (glu8) for qtc's SwiGLU epilogue, unless ZLLM_CUDA_QTC_GLU=0 */
            const int jg = s_upload_joined(E, &sg, gu, 2, E->qtc_glu_env, "ffn_gate+ffn_up", &d->wgu, err, errlen);
            if (jg < 0) goto fail;
            if (jg == 0 && (s_upload_mat(E, &sg, &w->w_gate, &d->wg, err, errlen) != 0 ||
                            s_upload_mat(E, &sg, &w->w_up, &d->wu, err, errlen) != 0)) goto fail;
        }
        if (E->fuse_env) {   /* Q/K/V and gate/up as one product each when cuBLAS serves all parts */
            cu_mat *qkv[] = {&d->wq, &d->wk, &d->wv}, *gu[] = {&d->wg, &d->wu};
            /* gate/up through wtc: interleaved, for its SwiGLU epilogue (the product's arithmetic per element is
             * the same: wtc's splits follow the joined shape only) */
            const int il8 = E->wtc_on && wtc_supported(d->wg.n_in, d->wg.n_out + d->wu.n_out);
            if (s_fuse_mats(E, qkv, 3, 0, &d->wqkv, err, errlen) < 0 ||
                s_fuse_mats(E, gu, 2, il8, &d->wgu, err, errlen) < 0)
                goto fail;
        }
        if (w->bq.data && s_upload(E, &sg, &w->bq, CU_F32, (void **)&d->bq, err, errlen) != 0) goto fail;
        if (w->bk.data && s_upload(E, &sg, &w->bk, CU_F32, (void **)&d->bk, err, errlen) != 0) goto fail;
        if (w->bv.data && s_upload(E, &sg, &w->bv, CU_F32, (void **)&d->bv, err, errlen) != 0) goto fail;
        /* progress line, one update per tenth of the layers (the file may be tens of GB) */
        if (c->n_layers >= 10 && (l + 1) % (c->n_layers / 10) == 0)
            fprintf(stderr, "\rzllm %s: uploading weights: layer %d/%d, %.0f MiB", E->base.device, l + 1,
                    c->n_layers, E->weight_bytes / 1048576.0);
    }
    E->round_f = 1;
    {
        int n_raw = E->out.raw && !E->out.qmma && !E->out.qtc ? 1 : 0, n_qmma = E->out.qmma, n_qtc = E->out.qtc;
        int n_fused = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const cu_layer *L = &E->L[l];
            n_fused += (L->wqkv.n_out > 0) + (L->wqk.n_out > 0) + (L->wgu.n_out > 0);
            const cu_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd, &L->wqkv, &L->wgu, &L->wqk};
            for (int i = 0; i < 10; i++) {
                n_raw += mats[i]->raw && !mats[i]->qmma && !mats[i]->qtc ? 1 : 0;
                n_qmma += mats[i]->qmma;
                n_qtc += mats[i]->qtc;
            }
        }
        fprintf(stderr, "\rzllm %s: uploaded weights: %d layers, %.1f MiB as %s (%d matrices also read by qgemv, "
                "%d by qmma only, %d by qtc only; %d fused Q/K/V or gate/up products)\n", E->base.device, le - lb,
                E->weight_bytes / 1048576.0, ops_dtype_name(E->wt), n_raw, n_qmma, n_qtc, n_fused);
    }
    rc = 0;
fail:
    cudaFreeHost(sg.h);
    cudaFree(sg.d);
    return rc;
}

/* ------------------------------------------------------------------ forward pass */

static attn_kv_type s_kvt(cu_dtype t) { return t == CU_F32 ? ATTN_KV_F32 : t == CU_F16 ? ATTN_KV_F16 : ATTN_KV_BF16; }

#define IN_PTR(E, field, type) ((type *)((E)->d_in + (E)->in.field))
#define FWD_CHECK(call) do { if ((call) != 0) return -1; } while (0)
#define FWD_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_)); return -1; } } while (0)

/* the qtc launch of W on n_rows rows of xw (f16, n_in apart) into y (ldy floats apart; resid: + y itself) */
static qtc_params s_qtc_params(const cu_engine *E, const cu_mat *W, int n_rows, const void *xw, float *y, int ldy,
                               int resid) {
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = W->qt; p.w = W->raw; p.n_in = W->n_in; p.n_out = W->n_out;
    p.m = n_rows; p.x = (const uint16_t *)xw; p.ldx = W->n_in; p.y = y; p.ldy = ldy;
    p.y_in = resid ? y : NULL;
    p.workspace = E->qtc_ws; p.workspace_bytes = E->qtc_ws_bytes;
    return p;
}

/* 1 when W goes through qgemv in a step of n_rows rows. The choice depends on the matrix and the row count
 * only (a graph bucket's size, or an eager step's rows), never on the rows' contents. Both paths multiply the
 * same activations (rounded to wt: round_f) with f32 accumulation; they differ in the weights' rounding (qgemv
 * dequantizes in f32, the dense copy holds them in wt) and the summation order, which is enough to flip greedy
 * tokens of a sequence alone vs batched (measured), hence the all-or-nothing default of s_qg_max. qgemv's own
 * per-row arithmetic does not depend on how many rows a launch carries, so "all" is batch-invariant. */
static int s_use_qg(const cu_engine *E, const cu_mat *W, int n_rows) {
    (void)E;
    return W->raw && !W->qmma && !W->qtc && n_rows <= W->qg_max;
}

/* 1 when W's dense copy goes through wtc instead of cuBLAS (every step size alike: the choice depends on the
 * matrix only, never on the row count) */
static int s_use_wtc(const cu_engine *E, const cu_mat *W) {
    return E->wtc_on && W->dense && !W->qtc && !W->qmma && wtc_supported(W->n_in, W->n_out);
}

/* the wtc product of W's dense 16-bit copy over n_rows rows of xw (n_in apart); output fields left unset */
static wtc_params s_wtc_params(const cu_engine *E, const cu_mat *W, int n_rows, const void *xw) {
    wtc_params p;
    memset(&p, 0, sizeof p);
    p.bf16 = E->wt == CU_BF16; p.w = W->dense; p.n_in = W->n_in; p.n_out = W->n_out; p.m = n_rows;
    p.x = xw; p.ldx = W->n_in;
    p.workspace = E->qtc_ws; p.workspace_bytes = E->qtc_ws_bytes; p.sm_count = E->sm_count;
    return p;
}

/* y[n_rows][n_out] = x W^T, or y += x W^T when resid (y holds the residual stream): through qgemv on xf (f32)
 * in launches of at most QGEMV_MAX_M rows, or through cuBLAS on xw (wt). y's rows are ldy floats apart (0 means
 * n_out; a larger ldy writes a column slice of a wider array, e.g. wk into E->qkv + q_dim). */
static int s_matmul(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, const float *xf, float *y, int ldy,
                    int resid, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    if (ldy == 0) ldy = W->n_out;
    if (W->qtc) {   /* every step size: xw holds the f16 inputs (wt == F16), n_in apart */
        const qtc_params p = s_qtc_params(E, W, n_rows, xw, y, ldy, resid);
        const cudaError_t e = qtc_launch(&p, E->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "qtc (%s, %d x %d, m %d): %s", ggml_type_name(W->qt), W->n_out, W->n_in, n_rows,
                     cudaGetErrorString(e));
            return -1;
        }
        return 0;
    }
    if (W->qmma) {   /* every step size: xw holds the f16 inputs (wt == F16), n_in apart */
        qmma_params p;
        memset(&p, 0, sizeof p);
        p.type = W->qt; p.w = W->raw; p.row_bytes = W->row_bytes; p.n_in = W->n_in; p.n_out = W->n_out;
        p.m = n_rows; p.x = (const uint16_t *)xw; p.ldx = W->n_in; p.y = y; p.ldy = ldy;
        p.y_in = resid ? y : NULL;
        const cudaError_t e = qmma_launch(&p, E->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "qmma (%s, %d x %d, m %d): %s", ggml_type_name(W->qt), W->n_out, W->n_in, n_rows,
                     cudaGetErrorString(e));
            return -1;
        }
        return 0;
    }
    const int qg = s_use_qg(E, W, n_rows);
    if (!qg && s_use_wtc(E, W)) {
        /* the dense 16-bit matrix (the one cuBLAS would read), through wtc at every step size */
        wtc_params p = s_wtc_params(E, W, n_rows, xw);
        p.y = y; p.ldy = ldy; p.y_in = resid ? y : NULL;
        const cudaError_t e = wtc_launch(&p, E->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "wtc (%d x %d, m %d): %s", W->n_out, W->n_in, n_rows, cudaGetErrorString(e));
            return -1;
        }
        return 0;
    }
    if (!qg)
        return ops_gemm(E->cb, xw, W->dense, E->wt, n_rows, W->n_in, W->n_out, y, ldy, resid ? 1.f : 0.f, err,
                        errlen);
    for (int r0 = 0; r0 < n_rows; r0 += QGEMV_MAX_M) {
        qgemv_params p;
        memset(&p, 0, sizeof p);
        p.type = W->qt; p.w = W->raw; p.row_bytes = W->row_bytes; p.n_in = W->n_in; p.n_out = W->n_out;
        p.m = n_rows - r0 < QGEMV_MAX_M ? n_rows - r0 : QGEMV_MAX_M;
        p.x = xf + (size_t)r0 * W->n_in; p.ldx = W->n_in;
        p.y = y + (size_t)r0 * ldy; p.ldy = ldy;
        p.y_in = resid ? p.y : NULL;
        const cudaError_t e = qgemv_launch(&p, E->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "qgemv (%s, %d x %d, m %d): %s", ggml_type_name(W->qt), W->n_out, W->n_in, p.m,
                     cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

/* The interleaved gate/up product W (glu8) with wtc's or qtc's SwiGLU epilogue: silu(gate) * up as wt values
 * [n_rows][ff] into out. Returns 1 when launched, 0 when this step's form has no such epilogue (the caller runs
 * the product and ops_swiglu_il8_dual: the same bits), -1 with err set on a launch error. */
static int s_glu(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, void *out, int ff, char *err,
                 size_t errlen) {
    if (W->qtc) {   /* qtc's narrow kernel (decode batches of <= 8 rows): the f16 result (qtc: E->wt is F16) */
        qtc_params p = s_qtc_params(E, W, n_rows, xw, NULL, 0, 0);
        p.glu = (uint16_t *)out; p.ldg = ff;
        if (!qtc_glu_fused(&p)) return 0;
        const cudaError_t e = qtc_launch(&p, E->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "qtc glu (%s %d x %d, m %d): %s", ggml_type_name(W->qt), W->n_out, W->n_in,
                     n_rows, cudaGetErrorString(e));
            return -1;
        }
        return 1;
    }
    if (!s_use_wtc(E, W) || s_use_qg(E, W, n_rows)) return 0;
    wtc_params p = s_wtc_params(E, W, n_rows, xw);
    p.glu = out; p.ldg = ff;
    if (!wtc_glu_fused(&p)) return 0;
    const cudaError_t e = wtc_launch(&p, E->st);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "wtc glu (%d x %d, m %d): %s", W->n_out, W->n_in, n_rows, cudaGetErrorString(e));
        return -1;
    }
    return 1;
}

/* which inputs a step of n_rows needs: *need_w (wt, for cuBLAS) and *need_f (f32, for qgemv) */
static void s_need_inputs(const cu_engine *E, int n_rows, int *need_w, int *need_f) {
    *need_w = *need_f = 0;
    for (int l = E->base.layer_begin; l < E->base.layer_end; l++) {
        const cu_layer *L = &E->L[l];
        const cu_mat *mats[] = {&L->wqkv, &L->wqk, &L->wq, &L->wk, &L->wv, &L->wo, &L->wgu, &L->wg, &L->wu, &L->wd};
        for (int i = 0; i < 10; i++) {
            if (mats[i]->n_out == 0) continue;   /* empty: joined into wqkv / wqk / wgu, or those unused */
            if (s_use_qg(E, mats[i], n_rows)) *need_f = 1;
            else *need_w = 1;
        }
    }
}

/* 1 when kernels may read the step's input block (pos, slot, kv_len) before their PDL wait: it is copied from the
 * host before the step's first kernel and written by no kernel (cuda/pdl.cuh). ZLLM_CUDA_KV_PRE=0 reads them after
 * the wait (comparisons; the same bits). Read once per process. */
static int s_inputs_early(void) {
    static const int s_on = cu_env_int("ZLLM_CUDA_KV_PRE", 1, 0, 1);
    return s_on;
}

/* pipeline stage input: x[r] = src[perm[r]] (zeros for padded rows, perm -1); src's address is read from the
 * input block (hptr[0]) so that one captured graph serves every transport buffer */
static __global__ void s_k_stage_in(float *x, const unsigned long long *hptr, const int32_t *perm, int dim) {
    const int r = blockIdx.x, p = perm[r];
    const float *src = (const float *)(uintptr_t)hptr[0];
    float *dst = x + (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = p >= 0 ? src[(size_t)p * dim + i] : 0.f;
}

/* pipeline stage output: dst[perm[r]] = x[r] for every real row; dst's address is hptr[1] */
static __global__ void s_k_stage_out(const float *x, const unsigned long long *hptr, const int32_t *perm, int dim) {
    const int r = blockIdx.x, p = perm[r];
    if (p < 0) return;
    float *dst = (float *)(uintptr_t)hptr[1] + (size_t)p * dim;
    const float *src = x + (size_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

/* ya = x A^T and yb = x B^T (ldy floats apart) in one qtc launch (qtc_launch_pair: the same bits as two): for the
 * layers whose Q/K matrix and V matrix are of two qtc types (Q4_K_M's Q6_K V layers), in steps of at most 8 rows.
 * Returns 1 when launched, 0 when the pair has no such form (the caller launches the two products), -1 with err
 * set on a launch error. ZLLM_CUDA_QTC_PAIR=0 turns it off. */
static int s_matmul_pair(cu_engine *E, const cu_mat *A, const cu_mat *B, int n_rows, const void *xw, float *ya,
                         float *yb, int ldy, char *err, size_t errlen) {
    static const int s_on = cu_env_int("ZLLM_CUDA_QTC_PAIR", 1, 0, 1);
    if (!s_on || n_rows > 8 || !A->qtc || !B->qtc) return 0;
    const qtc_params pa = s_qtc_params(E, A, n_rows, xw, ya, ldy, 0), pb = s_qtc_params(E, B, n_rows, xw, yb, ldy, 0);
    const cudaError_t e = qtc_launch_pair(&pa, &pb, E->st);
    if (e == cudaErrorNotSupported) return 0;
    if (e != cudaSuccess) {
        snprintf(err, errlen, "qtc pair (%s %d + %s %d rows, m %d): %s", ggml_type_name(A->qt), A->n_out,
                 ggml_type_name(B->qt), B->n_out, n_rows, cudaGetErrorString(e));
        return -1;
    }
    return 1;
}

/* Enqueues the forward pass and the sampling for the inputs already in d_in: n_rows rows, of which the first
 * n_dec are decode rows and the rest belong to n_pre prefill entries (at most max_rows rows each); n_samp
 * sampling rows (= entries, including padded ones). No host synchronisation, allocation or copy: it is the
 * body that graph capture records. */
static int s_forward(cu_engine *E, int n_rows, int n_dec, int n_pre, int max_rows, int n_samp, char *err,
                     size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    const int dim = c->dim, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, ff = c->ffn_dim;
    const int ldqkv = qd + 2 * kvd;
    const int32_t *tokens = IN_PTR(E, tokens, int32_t), *pos = IN_PTR(E, pos, int32_t);
    const int32_t *slot = IN_PTR(E, slot, int32_t);
    cudaStream_t st = E->st;
    int nw = 0, nf = 0;
    s_need_inputs(E, n_rows, &nw, &nf);
    void *xw = nw ? E->xb : NULL;
    float *xf = nf ? E->xf : NULL;
    const int rf = E->round_f;
    /* ZLLM_CUDA_DIAG_SKIP: a measurement knob, WRONG RESULTS: leaves launches out of every layer to bound what
     * fusing them away could gain (bit 0 the attention RMSNorm, 1 the FFN RMSNorm, 2 RoPE/append, 3 decode
     * attention, 4 a V product apart from Q/K) */
    static const int s_skip = cu_env_int("ZLLM_CUDA_DIAG_SKIP", 0, 0, 255);
    if (E->base.layer_begin == 0) {
        ops_feed fd;   /* fed rows (zl_seq.feed): their ids and generator states from the slots' carries */
        fd.slot = slot; fd.carry_tok = E->carry_tok; fd.carry_rng = E->carry_rng; fd.rng = IN_PTR(E, rng, uint64_t);
        FWD_CHECK(ops_embed(E->tok_embd, E->wt, dim, tokens, n_rows, E->x, &fd, st, err, errlen));
    } else {
        s_k_stage_in<<<n_rows, 256, 0, st>>>(E->x, IN_PTR(E, hptr, const unsigned long long),
                                             IN_PTR(E, perm, const int32_t), dim);
        FWD_CUDA(cudaGetLastError());
    }
    for (int l = E->base.layer_begin; l < E->base.layer_end; l++) {
        const cu_layer *L = &E->L[l];
        if (!(s_skip & 1))
            FWD_CHECK(ops_rmsnorm_dual(E->x, NULL, L->attn_norm, dim, c->rms_eps, n_rows, xw, E->wt, xf, rf, st,
                                       err, errlen));
        /* Q/K/V products into the column slices of E->qkv: one product when fused, three otherwise */
        if (L->wqkv.n_out) {
            FWD_CHECK(s_matmul(E, &L->wqkv, n_rows, E->xb, E->xf, E->qkv, ldqkv, 0, err, errlen));
        } else if (L->wqk.n_out) {   /* q and k columns are adjacent in E->qkv: one product, then v (or both in
                                        * one launch, s_matmul_pair) */
            const int pr = (s_skip & 16) ? 0 : s_matmul_pair(E, &L->wqk, &L->wv, n_rows, E->xb, E->qkv,
                                                             E->qkv + qd + kvd, ldqkv, err, errlen);
            if (pr < 0) return -1;
            if (!pr) FWD_CHECK(s_matmul(E, &L->wqk, n_rows, E->xb, E->xf, E->qkv, ldqkv, 0, err, errlen));
            if (!pr && !(s_skip & 16))
                FWD_CHECK(s_matmul(E, &L->wv, n_rows, E->xb, E->xf, E->qkv + qd + kvd, ldqkv, 0, err, errlen));
        } else {
            FWD_CHECK(s_matmul(E, &L->wq, n_rows, E->xb, E->xf, E->qkv, ldqkv, 0, err, errlen));
            FWD_CHECK(s_matmul(E, &L->wk, n_rows, E->xb, E->xf, E->qkv + qd, ldqkv, 0, err, errlen));
            FWD_CHECK(s_matmul(E, &L->wv, n_rows, E->xb, E->xf, E->qkv + qd + kvd, ldqkv, 0, err, errlen));
        }
        /* biases, RoPE of q and k, q into E->q, k and v into the caches: one kernel. The append precedes
         * attention on the same stream: every row then attends to itself through the cache */
        {
            ops_qkv_args a;
            memset(&a, 0, sizeof a);
            a.qkv = E->qkv; a.ld = ldqkv; a.bq = L->bq; a.bk = L->bk; a.bv = L->bv; a.pos = pos; a.slot = slot;
            a.n_rows = n_rows; a.n_heads = c->n_heads; a.n_kv_heads = c->n_kv_heads; a.head_dim = c->head_dim;
            a.rope_dim = c->rope_dim; a.style = (int)c->rope_style; a.cs = E->rope_cs; a.q = E->q;
            a.n_ctx = E->base.n_ctx; a.kc = L->kc; a.vc = L->vc; a.kvdt = E->wt;
            a.pos_pre = s_inputs_early();
            if (!(s_skip & 4)) FWD_CHECK(ops_qkv_rope_append(&a, st, err, errlen));
        }
        int att_w_done = 0;   /* the decode attention wrote att_w itself: no cast kernel */
        if (n_dec > 0) {
            attn_decode_params p;
            memset(&p, 0, sizeof p);
            p.q = E->q; p.k_cache = L->kc; p.v_cache = L->vc; p.kv_type = s_kvt(E->wt);
            p.slot = slot; p.kv_len = IN_PTR(E, kv_len, int32_t); p.out = E->att;
            p.workspace = E->attn_ws; p.workspace_bytes = E->attn_ws_bytes;
            p.n_seq = n_dec; p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads; p.head_dim = c->head_dim;
            p.n_ctx = E->base.n_ctx;
            /* always the longest context and the start-up split count: a graph serves every length, and a row's
             * split boundaries never depend on the batch (batch invariance) */
            p.max_kv_len = E->base.n_ctx; p.sm_count = E->sm_count; p.n_splits = E->n_splits;
            p.kv_pre = s_inputs_early();
            /* positions below kv_len - 1 come from earlier steps: every kernel of a step starts after the step
             * before has completed (a graph launch, a copy or an event wait on the stream carries no
             * programmatic edge), also with steps queued ahead */
            p.kv_early = p.kv_pre;
            /* a decode-only step whose products read only the 16-bit copy: the tensor-core kernel writes att_w
             * directly, with the cast kernel's rounding (one launch per layer fewer) */
            if (n_pre == 0 && !nf && E->wt != CU_F32 && attn_decode_tc_wants(&p)) {
                p.out_w = E->att_w;
                att_w_done = 1;
            }
            if (!(s_skip & 8)) FWD_CUDA(attn_decode_launch(&p, st));
        }
        if (n_pre > 0) {
            attn_prefill_params p;
            memset(&p, 0, sizeof p);
            p.q = E->q; p.k_cache = L->kc; p.v_cache = L->vc; p.kv_type = s_kvt(E->wt);
            p.seq_row0 = IN_PTR(E, seq_row0, int32_t); p.seq_rows = IN_PTR(E, seq_rows, int32_t);
            p.seq_slot = IN_PTR(E, seq_slot, int32_t); p.seq_pos0 = IN_PTR(E, seq_pos0, int32_t);
            p.out = E->att; p.n_seq = n_pre; p.max_rows = max_rows;
            p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads; p.head_dim = c->head_dim; p.n_ctx = E->base.n_ctx;
            FWD_CUDA(attn_prefill_launch(&p, st));
        }
        /* attention output: wt for cuBLAS (att_w), f32 for qgemv (att itself, rounded in place for 16-bit) */
        if (E->wt != CU_F32 && !att_w_done)
            FWD_CHECK(ops_cast_dual(E->att, (size_t)n_rows * qd, nw ? E->att_w : NULL, E->wt, nf ? E->att : NULL, rf,
                                    st, err, errlen));
        /* residual adds fused into the output projections (qgemv's y_in, cuBLAS's beta = 1) */
        FWD_CHECK(s_matmul(E, &L->wo, n_rows, E->att_w, E->att, E->x, 0, 1, err, errlen));
        if (!(s_skip & 2))
            FWD_CHECK(ops_rmsnorm_dual(E->x, NULL, L->ffn_norm, dim, c->rms_eps, n_rows, xw, E->wt, xf, rf, st,
                                       err, errlen));
        /* gate and up into the two halves of E->gu's rows: one product when fused, two otherwise; with the
         * interleaved join through wtc, its SwiGLU epilogue where the step's form has it (the 16-bit result into
         * E->gu's memory, since the product still reads E->xb), else the interleaved SwiGLU kernel */
        const void *xd = E->xb;   /* the down product's 16-bit input */
        if (L->wgu.glu8) {
            const int g = nf ? 0 : s_glu(E, &L->wgu, n_rows, E->xb, E->gu, ff, err, errlen);
            if (g < 0) return -1;
            if (g) {
                xd = E->gu;
            } else {
                FWD_CHECK(s_matmul(E, &L->wgu, n_rows, E->xb, E->xf, E->gu, 2 * ff, 0, err, errlen));
                FWD_CHECK(ops_swiglu_il8_dual(E->gu, 2 * ff, n_rows, ff, xw, E->wt, xf, rf, st, err, errlen));
            }
        } else {
            if (L->wgu.n_out) {
                FWD_CHECK(s_matmul(E, &L->wgu, n_rows, E->xb, E->xf, E->gu, 2 * ff, 0, err, errlen));
            } else {
                FWD_CHECK(s_matmul(E, &L->wg, n_rows, E->xb, E->xf, E->gu, 2 * ff, 0, err, errlen));
                FWD_CHECK(s_matmul(E, &L->wu, n_rows, E->xb, E->xf, E->gu + ff, 2 * ff, 0, err, errlen));
            }
            FWD_CHECK(ops_swiglu_dual(E->gu, E->gu + ff, 2 * ff, n_rows, ff, xw, E->wt, xf, rf, st, err, errlen));
        }
        FWD_CHECK(s_matmul(E, &L->wd, n_rows, xd, E->xf, E->x, 0, 1, err, errlen));
    }
    if (E->base.layer_end < c->n_layers) {   /* a stage before the last: hand the residual stream on */
        s_k_stage_out<<<n_rows, 256, 0, st>>>(E->x, IN_PTR(E, hptr, const unsigned long long),
                                              IN_PTR(E, perm, const int32_t), dim);
        FWD_CUDA(cudaGetLastError());
        return 0;
    }
    /* final norm of each entry's last row only, then the LM head for those rows */
    {
        const int hq = s_use_qg(E, &E->out, n_samp);
        FWD_CHECK(ops_rmsnorm_dual(E->x, IN_PTR(E, last_row, int32_t), E->out_norm, dim, c->rms_eps, n_samp,
                                   hq ? NULL : E->xb, E->wt, hq ? E->xf : NULL, rf, st, err, errlen));
        FWD_CHECK(s_matmul(E, &E->out, n_samp, E->xb, E->xf, E->logits, 0, 0, err, errlen));
    }
    sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.logits = E->logits; sp.n_rows = n_samp; sp.vocab = c->vocab_size;
    sp.params = IN_PTR(E, params, zl_sampling); sp.row_state = NULL;
    sp.history = IN_PTR(E, hist, int32_t); sp.history_stride = CU_HIST; sp.history_len = IN_PTR(E, hist_len, int32_t);
    sp.rng_state = IN_PTR(E, rng, uint64_t); sp.out = IN_PTR(E, out_tok, int32_t);
    if (E->n_inb == 2) {   /* the ids and states straight into the flight's mapped results (no copy after) */
        sp.out = (int32_t *)(E->fl[E->cur_p].d_out + (E->in.out_tok - E->in.rng));
        sp.rng_out = (uint64_t *)E->fl[E->cur_p].d_out;
    }
    sp.workspace = E->samp_ws; sp.workspace_bytes = E->samp_ws_bytes;
    sp.carry_tok = E->carry_tok; sp.carry_rng = E->carry_rng; sp.carry_idx = IN_PTR(E, eslot, int32_t);
    FWD_CUDA(sample_launch(&sp, st));
    return 0;
}

/* ------------------------------------------------------------------ input staging */

/* fills the sampling part of ordered row k from entry s (NULL: a padded row, greedy, no history) */
static void s_stage_sampling(cu_engine *E, int k, const zl_seq *s) {
    zl_sampling *par = (zl_sampling *)(E->h_in + E->in.params) + k;
    uint64_t *rng = (uint64_t *)(E->h_in + E->in.rng) + k;
    int32_t *hl = (int32_t *)(E->h_in + E->in.hist_len) + k;
    *par = s && s->samp ? *s->samp : sampler_defaults();
    if (par->repeat_last_n > CU_HIST) par->repeat_last_n = CU_HIST;   /* documented cap of the staged history */
    *rng = s && s->rng ? *s->rng : 0;
    *hl = 0;
    if (s && s->history && s->n_history > 0 && par->repeat_penalty != 1.0f && par->repeat_last_n > 0) {
        const int n = s->n_history < par->repeat_last_n ? s->n_history : par->repeat_last_n;
        memcpy((int32_t *)(E->h_in + E->in.hist) + (size_t)k * CU_HIST, s->history + s->n_history - n, (size_t)n * 4);
        *hl = n;
    }
}

static int s_bucket_for(const cu_engine *E, int n) {
    for (int i = 0; i < E->n_buckets; i++) if (E->bucket[i] >= n) return i;
    return -1;
}

static void s_fail_step(cu_engine *E, const zl_seq *seqs, int n, const char *what) {
    char slots[96];
    size_t o = 0;
    slots[0] = 0;
    for (int i = 0; i < n && o + 12 < sizeof slots; i++) o += snprintf(slots + o, sizeof slots - o, "%s%d", i ? "," : "", seqs[i].slot);
    snprintf(E->base.err, sizeof E->base.err, "cuda step of %d entries (slots %s): %s", n, slots, what);
    E->dead = 1;
}

/* One step of layers [layer_begin, layer_end) (the whole model for an engine without a range). h_in/h_out:
 * [T][dim] f32 hidden states in the caller's row order, device memory when dev is set, host memory otherwise
 * (staged through hbuf); h_in is used when layer_begin > 0, h_out when layer_end < n_layers. waits: events the
 * stream waits for after the input copy (h_in written, h_out free); recs: events recorded after the step's
 * kernels (h_in consumed, h_out written). A stage that is not last and gets device pointers returns without
 * synchronising. */
static int s_collect(cu_engine *E, int32_t *out_tokens);

static int s_run(cu_engine *E, const zl_seq *seqs, int n, const float *h_in, float *h_out, int dev,
                 void *const *waits, int n_waits, void *const *recs, int n_recs, int32_t *out_tokens,
                 float *out_logits, int launch) {
    zl_engine *base = &E->base;
    const zl_config *c = &base->model->cfg;
    const int embed = base->layer_begin == 0, last = base->layer_end == c->n_layers;
    char err[200];
    const size_t errlen = sizeof err;
    if (E->dead) { snprintf(base->err, sizeof base->err, "cuda engine unusable after an earlier device error"); return -1; }
    if (launch ? E->fl_count >= 2 || !embed || !last : E->fl_count > 0) {
        snprintf(base->err, sizeof base->err, launch ? (E->fl_count >= 2 ? "step_launch: 2 launched steps are not "
                 "waited for" : "step_launch: this engine runs a pipeline stage") :
                 "step: %d launched steps are not waited for", E->fl_count);
        return -1;
    }
    if (!seqs || n < 1 || n > base->max_batch || (last && !launch && !out_tokens) || (!embed && !h_in) ||
        (!last && !h_out) || n_waits < 0 || n_waits > 4 || n_recs < 0 || n_recs > 4) {
        snprintf(base->err, sizeof base->err, "bad step: %d entries (max %d), or a missing output/hidden-state buffer "
                 "for layers [%d, %d)", n, base->max_batch, base->layer_begin, base->layer_end);
        return -1;
    }
    /* validate everything before touching the device */
    int total = 0, n_dec = 0, max_rows = 1, need_hist = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (s->slot < 0 || s->slot >= base->n_slots || s->pos < 0 || s->n_tokens < 1 ||
            s->pos + s->n_tokens > base->n_ctx || (embed && !s->feed && !s->tokens)) {
            snprintf(base->err, sizeof base->err, "bad entry %d: slot %d pos %d n_tokens %d (n_slots %d, n_ctx %d)",
                     i, s->slot, s->pos, s->n_tokens, base->n_slots, base->n_ctx);
            return -1;
        }
        for (int j = 0; j < i; j++) if (seqs[j].slot == s->slot) {
            snprintf(base->err, sizeof base->err, "entries %d and %d share slot %d", j, i, s->slot);
            return -1;
        }
        if (s->feed && (!embed || !last || s->n_tokens != 1 || !E->carry_ok[s->slot] ||
                        (s->samp && s->samp->repeat_penalty != 1.0f && s->samp->repeat_last_n > 0))) {
            snprintf(base->err, sizeof base->err, "entry %d: a fed entry needs one token, a whole-model engine, a "
                     "slot whose last step sampled, and no repetition penalty (slot %d)", i, s->slot);
            return -1;
        }
        for (int t = 0; embed && !s->feed && t < s->n_tokens; t++) if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab_size) {
            snprintf(base->err, sizeof base->err, "entry %d: token %d out of range", i, (int)s->tokens[t]);
            return -1;
        }
        E->crow[i] = total;   /* first row of entry i in the caller's order (h_in/h_out) */
        total += s->n_tokens;
        if (s->n_tokens == 1) n_dec++;
        else if (s->n_tokens > max_rows) max_rows = s->n_tokens;
        if (s->samp && s->samp->repeat_penalty != 1.0f && s->samp->repeat_last_n > 0 && s->history) need_hist = 1;
    }
    if (total > base->max_step_tokens) {
        snprintf(base->err, sizeof base->err, "step of %d tokens exceeds max_step_tokens %d", total, base->max_step_tokens);
        return -1;
    }
    if (cudaSetDevice(E->dev) != cudaSuccess) { s_fail_step(E, seqs, n, "cudaSetDevice failed"); return -1; }
    /* the flight (and with two blocks, the input block) of this step */
    cu_flight *f = &E->fl[(E->fl_head + E->fl_count) & 1];
    E->cur_p = E->n_inb == 2 ? (int)(f - E->fl) : 0;
    E->h_in = E->h_inb[E->cur_p];
    E->d_in = E->d_inb[E->cur_p];
    /* the previous step may have returned without synchronising: its input copy must be done before the pinned
     * block is rewritten (callers that must not block poll engine_cuda_ready first). With two blocks, block p's
     * last user is the step before the previous one, already waited for (at most 2 launched) */
    if (E->in_pending && E->n_inb == 1) {
        if (cudaEventSynchronize(E->ev_in) != cudaSuccess) { s_fail_step(E, seqs, n, "input event failed"); return -1; }
        E->in_pending = 0;
    }
    E->order = f->order;
    /* order: decode entries first (one row each), then prefill entries as runs of rows */
    int k = 0;
    for (int i = 0; i < n; i++) if (seqs[i].n_tokens == 1) E->order[k++] = i;
    for (int i = 0; i < n; i++) if (seqs[i].n_tokens > 1) E->order[k++] = i;
    const int n_pre = n - n_dec;
    const int gi = (n_pre == 0 && E->n_buckets > 0) ? s_bucket_for(E, n) : -1;
    const int n_samp = gi >= 0 ? E->bucket[gi] : n;
    int32_t *tok = (int32_t *)(E->h_in + E->in.tokens), *pos = (int32_t *)(E->h_in + E->in.pos);
    int32_t *slot = (int32_t *)(E->h_in + E->in.slot), *kvl = (int32_t *)(E->h_in + E->in.kv_len);
    int32_t *r0 = (int32_t *)(E->h_in + E->in.seq_row0), *nr = (int32_t *)(E->h_in + E->in.seq_rows);
    int32_t *ss = (int32_t *)(E->h_in + E->in.seq_slot), *sp0 = (int32_t *)(E->h_in + E->in.seq_pos0);
    int32_t *lastr = (int32_t *)(E->h_in + E->in.last_row), *perm = (int32_t *)(E->h_in + E->in.perm);
    int32_t *eslot = (int32_t *)(E->h_in + E->in.eslot);
    int row = 0;
    for (k = 0; k < n; k++) {
        const zl_seq *s = &seqs[E->order[k]];
        for (int t = 0; t < s->n_tokens; t++) perm[row + t] = E->crow[E->order[k]] + t;
        if (k >= n_dec) {
            r0[k - n_dec] = row; nr[k - n_dec] = s->n_tokens; ss[k - n_dec] = s->slot; sp0[k - n_dec] = s->pos;
        } else {
            kvl[k] = s->pos + 1;
        }
        for (int t = 0; t < s->n_tokens; t++, row++) {
            /* a fed row: -1, which the embedding gather replaces with the slot's carried id (ops_feed) */
            tok[row] = embed && !s->feed ? s->tokens[t] : embed ? -1 : 0; pos[row] = s->pos + t; slot[row] = s->slot;
        }
        lastr[k] = row - 1;
        eslot[k] = s->slot;
        s_stage_sampling(E, k, s);
    }
    /* padded rows of a graph bucket: the sentinel slot at position 0 with kv_len 0, greedy, no history */
    for (; k < n_samp; k++, row++) {
        tok[row] = 0; pos[row] = 0; slot[row] = base->n_slots; kvl[k] = 0; lastr[k] = row; perm[row] = -1;
        eslot[k] = base->n_slots;
        s_stage_sampling(E, k, NULL);
    }
    /* ONE host-to-device copy of every per-step input, on the engine's stream: the kernels (or the graph) that
     * follow on the same stream see it complete; the pinned block is not rewritten before the step's final
     * synchronisation, so the asynchronous copy never reads a half-updated block */
    const size_t nbytes = need_hist ? E->in.total : E->in.core_end;
    /* stage buffers: device pointers as given, host ones through hbuf (copied in here, out after the step) */
    const int stage_io = !embed || !last;
    unsigned long long *hp = (unsigned long long *)(E->h_in + E->in.hptr);
    hp[0] = (unsigned long long)(uintptr_t)(dev ? (const void *)h_in : (const void *)E->hbuf);
    hp[1] = (unsigned long long)(uintptr_t)(dev ? (void *)h_out : (void *)E->hbuf);
    if (E->n_inb == 2) {
        /* the copy on cst may run while the step before runs on st: it writes the other block */
        if (cudaEventRecord(f->ev0, E->st) != cudaSuccess ||
            cudaMemcpyAsync(E->d_in, E->h_in, nbytes, cudaMemcpyHostToDevice, E->cst) != cudaSuccess ||
            cudaEventRecord(E->ev_cp[E->cur_p], E->cst) != cudaSuccess ||
            cudaStreamWaitEvent(E->st, E->ev_cp[E->cur_p], 0) != cudaSuccess) {
            s_fail_step(E, seqs, n, "input copy failed");
            return -1;
        }
    } else if (cudaEventRecord(f->ev0, E->st) != cudaSuccess || cudaMemcpyAsync(E->d_in, E->h_in, nbytes, cudaMemcpyHostToDevice, E->st) != cudaSuccess ||
        cudaEventRecord(E->ev_in, E->st) != cudaSuccess ||
        (stage_io && !dev && !embed &&
         cudaMemcpyAsync(E->hbuf, h_in, (size_t)total * c->dim * 4, cudaMemcpyHostToDevice, E->st) != cudaSuccess)) {
        s_fail_step(E, seqs, n, "input copy failed");
        return -1;
    }
    /* cross-process ordering: after the input copy (which reads only this process's pinned block), before the
     * kernels that read h_in or write h_out */
    for (int w = 0; w < n_waits; w++)
        if (cudaStreamWaitEvent(E->st, (cudaEvent_t)waits[w], 0) != cudaSuccess) {
            s_fail_step(E, seqs, n, "cudaStreamWaitEvent on a stage event failed");
            return -1;
        }
    if (gi >= 0) {
        const cudaError_t ce = cudaGraphLaunch(E->gexec[E->cur_p][gi], E->st);
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "cudaGraphLaunch(bucket %d): %s", E->bucket[gi], cudaGetErrorString(ce));
            s_fail_step(E, seqs, n, err);
            return -1;
        }
    } else if (s_forward(E, row, n_dec, n_pre, max_rows, n, err, errlen) != 0) {
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    for (int r = 0; r < n_recs; r++)
        if (cudaEventRecord((cudaEvent_t)recs[r], E->st) != cudaSuccess) {
            s_fail_step(E, seqs, n, "cudaEventRecord of a stage event failed");
            return -1;
        }
    if (!last) {
        cudaError_t ce = cudaSuccess;
        if (!dev) {
            ce = cudaMemcpyAsync(h_out, E->hbuf, (size_t)total * c->dim * 4, cudaMemcpyDeviceToHost, E->st);
            if (ce == cudaSuccess) ce = cudaStreamSynchronize(E->st);
        } else {
            E->in_pending = 1;   /* no host round trip: the next stage's stream waits on recs */
        }
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "%s", cudaGetErrorString(ce));
            s_fail_step(E, seqs, n, err);
            return -1;
        }
        return 0;
    }
    /* ids and the advanced generator states come back in one copy (rng and out_tok are adjacent), into the
     * flight's own pinned area: a step launched behind this one rewrites h_in before this one is waited for */
    cudaError_t ce = E->n_inb == 2 ? cudaSuccess   /* the sampler wrote them into h_out */
                     : cudaMemcpyAsync(f->h_out, E->d_in + E->in.rng, E->in.tokens - E->in.rng,
                                       cudaMemcpyDeviceToHost, E->st);
    if (ce == cudaSuccess && out_logits)
        ce = cudaMemcpyAsync(E->h_logits, E->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, E->st);
    if (ce == cudaSuccess) ce = cudaEventRecord(f->ev1, E->st);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "%s", cudaGetErrorString(ce));
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    /* the slots' carries as the device will leave them, in launch order: a later step may feed from a slot
     * whose latest step sampled it */
    for (int i = 0; i < n; i++) E->carry_ok[seqs[i].slot] = seqs[i].sample != 0;
    f->seqs = seqs;
    f->n = n;
    f->logits = out_logits;
    E->fl_count++;
    E->in_pending = E->n_inb == 1;   /* the next step waits for this one's input copy (ev_in) before rewriting h_in */
    return launch ? 0 : s_collect(E, out_tokens);
}

/* waits for the oldest launched step and hands its ids (and logits, generator states) to the caller */
static int s_collect(cu_engine *E, int32_t *out_tokens) {
    zl_engine *base = &E->base;
    if (E->fl_count == 0 || !out_tokens) {
        snprintf(base->err, sizeof base->err, "step_wait: no launched step (or no output)");
        return -1;
    }
    cu_flight *f = &E->fl[E->fl_head];
    const zl_seq *seqs = f->seqs;
    const int n = f->n;
    const size_t V = (size_t)base->model->cfg.vocab_size;
    cudaError_t ce = cudaSetDevice(E->dev);
    if (ce == cudaSuccess) ce = cudaEventSynchronize(f->ev1);
    if (ce == cudaSuccess) {
        float ms = 0.f;
        ce = cudaEventElapsedTime(&ms, f->ev0, f->ev1);
        E->last_gpu_ms = ms;
    }
    if (ce != cudaSuccess) {
        char err[200];
        snprintf(err, sizeof err, "%s", cudaGetErrorString(ce));
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    E->fl_head ^= 1;
    if (--E->fl_count == 0) E->in_pending = 0;   /* every copy of the stream is done */
    const int32_t *otok = (const int32_t *)(f->h_out + (E->in.out_tok - E->in.rng));
    const uint64_t *orng = (const uint64_t *)f->h_out;
    for (int k = 0; k < n; k++) {
        const int i = f->order[k];
        out_tokens[i] = seqs[i].sample ? otok[k] : -1;
        if (seqs[i].sample && seqs[i].rng) *seqs[i].rng = orng[k];
        if (f->logits) memcpy(f->logits + (size_t)i * V, E->h_logits + (size_t)k * V, V * 4);
    }
    return 0;
}

/* ------------------------------------------------------------------ lifetime */

static void s_destroy(zl_engine *base) {
    cu_engine *E = (cu_engine *)base;
    if (!E) return;
    if (E->abandoned) {   /* the stream may wait forever on a dead peer's event: free host memory only */
        free(E->L);
        for (int i = 0; i < 2; i++) free(E->fl[i].order);
        free(E->carry_ok);
        free(E->crow);
        free(E);
        return;
    }
    cudaSetDevice(E->dev);
    if (E->st) cudaStreamSynchronize(E->st);
    if (E->cst) cudaStreamSynchronize(E->cst);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < E->n_buckets; i++) if (E->gexec[p][i]) cudaGraphExecDestroy(E->gexec[p][i]);
    if (E->L) {
        for (int l = 0; l < base->model->cfg.n_layers; l++) {
            cu_layer *L = &E->L[l];
            cu_mat *mats[] = {&L->wqkv, &L->wqk, &L->wq, &L->wk, &L->wv, &L->wo, &L->wgu, &L->wg, &L->wu, &L->wd};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) s_free_mat(mats[i]);
            void *p[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
        }
        free(E->L);
    }
    s_free_mat(&E->out);
    for (int i = 0; i < 2; i++) {
        if (E->fl[i].ev0) cudaEventDestroy(E->fl[i].ev0);
        if (E->fl[i].ev1) cudaEventDestroy(E->fl[i].ev1);
        cudaFreeHost(E->fl[i].h_out);
        free(E->fl[i].order);
    }
    free(E->carry_ok);
    if (E->ev_in) cudaEventDestroy(E->ev_in);
    for (int p = 0; p < 2; p++) {
        if (E->ev_cp[p]) cudaEventDestroy(E->ev_cp[p]);
        cudaFreeHost(E->h_inb[p]);
        cudaFree(E->d_inb[p]);
    }
    if (E->cst) cudaStreamDestroy(E->cst);
    cudaFree(E->xf);
    cudaFree(E->hbuf);
    /* E->gu is E->qkv's allocation: freed once, as qkv */
    void *d[] = {E->tok_embd, E->out_norm, E->rope_cs, E->kv, E->x, E->qkv, E->q, E->att, E->xb, E->logits,
                 E->attn_ws, E->samp_ws, E->cb_ws, E->qtc_ws, E->carry_tok, E->carry_rng};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cudaFree(d[i]);
    if (E->att_w != (void *)E->att) cudaFree(E->att_w);
    cudaFreeHost(E->h_logits);
    if (E->cb) cublasDestroy(E->cb);
    if (E->st) cudaStreamDestroy(E->st);
    free(E->crow);
    free(E);
}

/* ------------------------------------------------------------------ launch/wait: the ops table's glue
 * Thin dispatch to s_run and s_collect (zl_engine_ops). A whole model keeps up to 2 steps in flight
 * (zl_engine.depth 2): a queued step is started by s_run(launch 1) and its wait collects it (s_collect). A
 * synchronous step (zl_step.sync) and every step of a pipeline stage run whole at their launch (s_run(launch 0),
 * its collect included, device hidden states and events as engine_cuda_step_hidden_dev); their wait only checks
 * the order. op_q keeps the steps launched and not waited for, so that a wait names the oldest one. */

static int s_op_launch(zl_engine *base, const zl_step *st) {
    cu_engine *E = (cu_engine *)base;
    const int whole = base->layer_begin == 0 && base->layer_end == base->model->cfg.n_layers;
    if (!st || st->lane != 0) {
        snprintf(base->err, sizeof base->err, "launch: no step, or lane %d outside 0..0", st ? st->lane : -1);
        return -1;
    }
    const int now = st->sync || !whole;   /* runs whole before launch returns */
    if (E->op_count >= 2 || (E->op_count > 0 && (E->op_ran || now || st->out_logits))) {
        snprintf(base->err, sizeof base->err, "launch: %d launched steps are not waited for", E->op_count);
        return -1;
    }
    if (!now && !st->out_tokens) {
        snprintf(base->err, sizeof base->err, "launch: a queued step needs out_tokens");
        return -1;
    }
    const int rc = now ? s_run(E, st->seqs, st->n, st->h_in, st->h_out, st->h_dev, st->wait_ev, st->n_wait,
                               st->record_ev, st->n_record, st->out_tokens, st->out_logits, 0)
                       : s_run(E, st->seqs, st->n, NULL, NULL, 0, st->wait_ev, st->n_wait, st->record_ev,
                               st->n_record, NULL, st->out_logits, 1);
    if (rc != 0) return -1;
    E->op_q[(E->op_head + E->op_count) & 1] = st;
    E->op_count++;
    E->op_ran = now;
    return 0;
}

static int s_op_wait(zl_engine *base, const zl_step *st) {
    cu_engine *E = (cu_engine *)base;
    if (E->op_count == 0 || !st || E->op_q[E->op_head] != st) {
        snprintf(base->err, sizeof base->err, "%s", E->op_count == 0 ? "wait: no launched step" :
                 "wait: not the oldest launched step (wait in launch order)");
        return -1;
    }
    if (!E->op_ran) {
        if (E->dead) {
            snprintf(base->err, sizeof base->err, "cuda engine unusable after an earlier device error");
            return -1;
        }
        if (s_collect(E, st->out_tokens) != 0) return -1;
    }
    E->op_head ^= 1;
    E->op_count--;
    E->op_ran = 0;
    return 0;
}

static const zl_engine_ops s_ops_cuda = {s_op_launch, s_op_wait, s_destroy};

static size_t s_align(size_t o) { return (o + 255) & ~(size_t)255; }

/* lays out the input block for max_tok rows and max_batch sampling rows */
static void s_layout_inputs(cu_inputs *in, int max_tok, int max_batch) {
    size_t o = 0;
    in->rng = o;      o += (size_t)max_batch * 8;
    in->out_tok = o;  o += (size_t)max_batch * 4;
    o = s_align(o);
    in->tokens = o;   o = s_align(o + (size_t)max_tok * 4);
    in->pos = o;      o = s_align(o + (size_t)max_tok * 4);
    in->slot = o;     o = s_align(o + (size_t)max_tok * 4);
    in->kv_len = o;   o = s_align(o + (size_t)max_batch * 4);
    in->seq_row0 = o; o = s_align(o + (size_t)max_batch * 4);
    in->seq_rows = o; o = s_align(o + (size_t)max_batch * 4);
    in->seq_slot = o; o = s_align(o + (size_t)max_batch * 4);
    in->seq_pos0 = o; o = s_align(o + (size_t)max_batch * 4);
    in->last_row = o; o = s_align(o + (size_t)max_batch * 4);
    in->eslot = o;    o = s_align(o + (size_t)max_batch * 4);
    in->hist_len = o; o = s_align(o + (size_t)max_batch * 4);
    in->params = o;   o = s_align(o + (size_t)max_batch * sizeof(zl_sampling));
    in->perm = o;     o = s_align(o + (size_t)max_tok * 4);
    in->hptr = o;     o = s_align(o + 2 * sizeof(unsigned long long));
    in->core_end = o;
    in->hist = o;     o = s_align(o + (size_t)max_batch * CU_HIST * 4);
    in->total = o;
}

/* Captures one CUDA graph per decode bucket. Done last, when every buffer exists, because a graph records the
 * device addresses it was captured with. Capture records without executing; the input block was zeroed at
 * allocation, so nothing recorded ever reads uninitialised memory. */
static int s_capture_graphs(cu_engine *E, char *err, size_t errlen) {
    const int mb = E->base.max_batch;
    int nb = 0;
    for (int b = 1; b <= mb && nb < CU_MAX_BUCKETS - 1; b = b < 8 ? b * 2 : b + 8) E->bucket[nb++] = b;
    if (E->bucket[nb - 1] != mb) E->bucket[nb++] = mb;
    for (int i = 0; i < nb; i++) {
        const int B = E->bucket[i];
        for (int p = 0; p < E->n_inb; p++) {   /* one graph per input block: a graph records its addresses */
            cudaGraph_t g = NULL;
            E->cur_p = p;
            E->d_in = E->d_inb[p];
            /* thread-local capture: other threads of the process may keep using CUDA (e.g. another engine) */
            CU_CHECK(cudaStreamBeginCapture(E->st, cudaStreamCaptureModeThreadLocal));
            if (s_forward(E, B, B, 0, 1, B, err, errlen) != 0) {
                cudaStreamEndCapture(E->st, &g);
                if (g) cudaGraphDestroy(g);
                goto fail;
            }
            CU_CHECK(cudaStreamEndCapture(E->st, &g));
            {
                const cudaError_t ce = cudaGraphInstantiate(&E->gexec[p][i], g, 0);
                cudaGraphDestroy(g);
                CU_CHECK(ce);
            }
            E->n_buckets = i + 1;
            CU_CHECK(cudaGraphUpload(E->gexec[p][i], E->st));
        }
    }
    E->cur_p = 0;
    E->d_in = E->d_inb[0];
    CU_CHECK(cudaStreamSynchronize(E->st));
    return 0;
fail:
    return -1;
}

zl_engine *engine_cuda_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    const zl_config *c = &m->cfg;
    zl_engine_opts def;
    memset(&def, 0, sizeof def);
    if (!o) o = &def;
    int dev = 0, ndev = 0;
    const char *name = o->device ? o->device : "cuda";
    if (strncmp(name, "cuda:", 5) == 0) {
        char *end = NULL;
        long v = strtol(name + 5, &end, 10);
        if (!*(name + 5) || *end || v < 0 || v > 255) { snprintf(err, errlen, "bad device '%s'", name); return NULL; }
        dev = (int)v;
    }
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        snprintf(err, errlen, "no CUDA device (%s)", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
        return NULL;
    }
    if (dev >= ndev) { snprintf(err, errlen, "%s: only %d CUDA device(s)", name, ndev); return NULL; }
    if (c->head_dim != 8 && c->head_dim != 16 && c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128 &&
        c->head_dim != 256) {
        snprintf(err, errlen, "%s: head size %d not supported by the CUDA attention", m->path, c->head_dim);
        return NULL;
    }
    if ((c->n_heads * c->head_dim) % 4 || (c->n_kv_heads * c->head_dim) % 4 || c->rope_dim > c->head_dim) {
        snprintf(err, errlen, "%s: head layout not supported by the CUDA engine", m->path);
        return NULL;
    }
    const int lb = o->layer_begin, le = o->layer_end ? o->layer_end : c->n_layers;
    if (lb < 0 || le > c->n_layers || lb >= le) {
        snprintf(err, errlen, "cuda engine: layer range [%d, %d) outside the model's %d layers", o->layer_begin,
                 o->layer_end, c->n_layers);
        return NULL;
    }
    cu_engine *E = (cu_engine *)calloc(1, sizeof *E);
    if (!E) { snprintf(err, errlen, "out of memory"); return NULL; }
    zl_engine *b = &E->base;
    b->ops = &s_ops_cuda;
    b->lanes = 1;
    if (lb == 0 && le == c->n_layers) {   /* steps queued ahead: whole models only (the sampler carries ids) */
        b->depth = 2;
        b->launch_async = 1;
    }
    b->layer_begin = lb;
    b->layer_end = le;
    b->model = m;
    E->dev = dev;
    snprintf(b->device, sizeof b->device, "cuda:%d", dev);
    b->max_batch = o->max_batch > 0 ? o->max_batch : 16;
    b->n_slots = o->n_slots > 0 ? o->n_slots : b->max_batch;
    b->n_ctx = o->n_ctx > 0 ? o->n_ctx : (c->n_ctx < 4096 ? c->n_ctx : 4096);
    b->max_step_tokens = o->max_step_tokens > 0 ? o->max_step_tokens : 2048;
    E->L = (cu_layer *)calloc((size_t)c->n_layers, sizeof *E->L);
    if (!E->L) { snprintf(err, errlen, "out of memory"); goto fail; }
    {
        CU_CHECK(cudaSetDevice(dev));
        cudaDeviceProp prop;
        CU_CHECK(cudaGetDeviceProperties(&prop, dev));
        E->sm_count = prop.multiProcessorCount;
        CU_CHECK(cudaStreamCreateWithFlags(&E->st, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&E->cb));
        CUBLAS_CHECK(cublasSetStream(E->cb, E->st));
        /* a fixed workspace: cuBLAS then never allocates inside a captured graph (32 MiB as advised for Hopper) */
        E->cb_ws_bytes = (size_t)32 << 20;
        CU_CHECK(cudaMalloc(&E->cb_ws, E->cb_ws_bytes));
        CUBLAS_CHECK(cublasSetWorkspace(E->cb, E->cb_ws, E->cb_ws_bytes));
        /* default math mode: no TF32 for F32 products (CUBLAS_COMPUTE_32F in ops_gemm) */
        CUBLAS_CHECK(cublasSetMathMode(E->cb, CUBLAS_DEFAULT_MATH));

        E->wt = s_is_matrix_type_f32(m) ? CU_F32 : s_has_bf16(m) ? CU_BF16 : CU_F16;
        /* qgemv row limit (s_qg_max): ZLLM_CUDA_GEMV_MAX=all for qgemv at every step size, 0..8 for the mixed
         * path (measurements only: not batch-invariant); the switch is per step size, so every graph bucket has
         * one fixed kernel per matrix */
        E->gemv_env = -1;
        {
            const char *gm = getenv("ZLLM_CUDA_GEMV_MAX");
            if (gm && !strcmp(gm, "all")) E->gemv_env = CU_GEMV_ALL;
            else if (gm && *gm) {
                const int v = atoi(gm);
                E->gemv_env = v < 0 ? 0 : v > QGEMV_MAX_M ? QGEMV_MAX_M : v;
            }
            const char *qm = getenv("ZLLM_CUDA_QMMA");
            E->qmma_env = qm && *qm ? atoi(qm) != 0 : 0;
            const char *qt = getenv("ZLLM_CUDA_QTC");
            E->qtc_env = qt && *qt ? atoi(qt) != 0 : 1;
            const char *fu = getenv("ZLLM_CUDA_FUSE");
            E->fuse_env = fu && *fu ? atoi(fu) != 0 : 1;
            const char *qg = getenv("ZLLM_CUDA_QTC_GLU");
            E->qtc_glu_env = qg && *qg ? atoi(qg) != 0 : 1;
            const char *wc = getenv("ZLLM_CUDA_WTC");
            E->wtc_on = (wc && *wc ? atoi(wc) != 0 : 1) && E->wt != CU_F32 && wtc_available();
        }
        if (s_upload_model(E, err, errlen) != 0) goto fail;
        E->last_gpu_ms = -1;
        for (int i = 0; i < 2; i++) {
            CU_CHECK(cudaEventCreate(&E->fl[i].ev0));
            CU_CHECK(cudaEventCreate(&E->fl[i].ev1));
        }
        CU_CHECK(cudaEventCreateWithFlags(&E->ev_in, cudaEventDisableTiming));
        
        /* RoPE table for every position of a slot */
        {
            const size_t nf = (size_t)b->n_ctx * c->rope_dim;
            float *h = (float *)malloc(nf * 4 + 4);
            if (!h) { snprintf(err, errlen, "out of memory"); goto fail; }
            ops_rope_table_host(h, b->n_ctx, c->rope_dim, c->rope_base);
            ce = cudaMalloc((void **)&E->rope_cs, nf * 4 + 4);
            if (ce == cudaSuccess) ce = cudaMemcpy(E->rope_cs, h, nf * 4, cudaMemcpyHostToDevice);
            free(h);
            CU_CHECK(ce);
        }

        /* activations */
        if (b->max_step_tokens < b->max_batch) b->max_step_tokens = b->max_batch;
        E->max_tok = b->max_step_tokens;
        const size_t T = (size_t)E->max_tok, es = ops_dtype_size(E->wt);
        const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
        size_t wide = (size_t)c->dim;
        if ((size_t)c->ffn_dim > wide) wide = c->ffn_dim;
        if (qd > wide) wide = qd;
        CU_CHECK(cudaMalloc((void **)&E->x, T * c->dim * 4));
        /* qkv and gu: one allocation for the wider of the two (disjoint lifetimes within a layer, see cu_engine) */
        const size_t qkv_w = qd + 2 * kvd, gu_w = 2 * (size_t)c->ffn_dim;
        CU_CHECK(cudaMalloc((void **)&E->qkv, T * (qkv_w > gu_w ? qkv_w : gu_w) * 4));
        E->gu = E->qkv;
        CU_CHECK(cudaMalloc((void **)&E->q, T * qd * 4));
        CU_CHECK(cudaMalloc((void **)&E->att, T * qd * 4));
        if (E->wt == CU_F32) E->att_w = E->att;
        else CU_CHECK(cudaMalloc(&E->att_w, T * qd * es));
        CU_CHECK(cudaMalloc(&E->xb, T * wide * es));
        if (E->wt != CU_F32) CU_CHECK(cudaMalloc((void **)&E->xf, T * wide * 4));
        CU_CHECK(cudaMalloc((void **)&E->logits, (size_t)b->max_batch * c->vocab_size * 4));
        CU_CHECK(cudaMallocHost((void **)&E->h_logits, (size_t)b->max_batch * c->vocab_size * 4));
        s_layout_inputs(&E->in, E->max_tok, b->max_batch);
        E->n_inb = lb == 0 && le == c->n_layers ? 2 : 1;
        for (int p = 0; p < E->n_inb; p++) {
            CU_CHECK(cudaMallocHost((void **)&E->h_inb[p], E->in.total));
            memset(E->h_inb[p], 0, E->in.total);
            CU_CHECK(cudaMalloc((void **)&E->d_inb[p], E->in.total));
            CU_CHECK(cudaMemset(E->d_inb[p], 0, E->in.total));
            if (E->n_inb == 2) CU_CHECK(cudaEventCreateWithFlags(&E->ev_cp[p], cudaEventDisableTiming));
        }
        if (E->n_inb == 2) CU_CHECK(cudaStreamCreateWithFlags(&E->cst, cudaStreamNonBlocking));
        E->h_in = E->h_inb[0];
        E->d_in = E->d_inb[0];
        for (int i = 0; i < 2; i++) {
            E->fl[i].order = (int *)malloc((size_t)b->max_batch * sizeof(int));
            if (!E->fl[i].order) { snprintf(err, errlen, "out of memory"); goto fail; }
            CU_CHECK(cudaHostAlloc((void **)&E->fl[i].h_out, E->in.tokens - E->in.rng, cudaHostAllocMapped));
            memset(E->fl[i].h_out, 0, E->in.tokens - E->in.rng);
            CU_CHECK(cudaHostGetDevicePointer((void **)&E->fl[i].d_out, E->fl[i].h_out, 0));
        }
        E->order = E->fl[0].order;
        E->crow = (int *)malloc((size_t)b->max_batch * sizeof(int));
        if (!E->crow) { snprintf(err, errlen, "out of memory"); goto fail; }
        if (lb > 0 || le < c->n_layers) CU_CHECK(cudaMalloc((void **)&E->hbuf, T * c->dim * 4));
        E->samp_ws_bytes = sample_workspace_bytes(b->max_batch, c->vocab_size);
        CU_CHECK(cudaMalloc(&E->samp_ws, E->samp_ws_bytes ? E->samp_ws_bytes : 16));
        {
            attn_decode_params p;
            memset(&p, 0, sizeof p);
            p.kv_type = s_kvt(E->wt); p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads;
            p.head_dim = c->head_dim; p.n_ctx = b->n_ctx; p.max_kv_len = b->n_ctx; p.sm_count = E->sm_count;
            /* the split count a single sequence at full context would get, fixed for every batch up to the
             * engine's largest (max_seq: whether small leaves still fit one wave at that batch) */
            p.n_seq = 1;
            p.max_seq = b->max_batch;
            E->n_splits = attn_decode_splits(&p);
            p.n_splits = E->n_splits;
            p.n_seq = b->max_batch;
            E->attn_ws_bytes = attn_decode_workspace_bytes(&p);
            if (E->n_splits < 1 || E->attn_ws_bytes == 0) {
                snprintf(err, errlen, "attention does not support this model's shape");
                goto fail;
            }
            CU_CHECK(cudaMalloc(&E->attn_ws, E->attn_ws_bytes));
            /* qtc's workspace: the largest any of its matrices needs */
            E->qtc_ws_bytes = E->out.qtc ? qtc_workspace_bytes(E->out.qt, E->out.n_in, E->out.n_out) : 0;
            for (int l = b->layer_begin; l < b->layer_end; l++) {
                const cu_layer *L = &E->L[l];
                const cu_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd, &L->wgu, &L->wqkv,
                                        &L->wqk};
                for (int i = 0; i < 10; i++) {
                    const size_t need = mats[i]->qtc ? qtc_workspace_bytes(mats[i]->qt, mats[i]->n_in, mats[i]->n_out) : 0;
                    if (need > E->qtc_ws_bytes) E->qtc_ws_bytes = need;
                    const size_t wneed = s_use_wtc(E, mats[i]) ? wtc_workspace_bytes(mats[i]->n_in, mats[i]->n_out,
                                                                                       b->max_step_tokens) : 0;
                    if (wneed > E->qtc_ws_bytes) E->qtc_ws_bytes = wneed;
                }
            }
            if (s_use_wtc(E, &E->out)) {
                const size_t wneed = wtc_workspace_bytes(E->out.n_in, E->out.n_out, b->max_batch);
                if (wneed > E->qtc_ws_bytes) E->qtc_ws_bytes = wneed;
            }
            if (E->qtc_ws_bytes) CU_CHECK(cudaMalloc(&E->qtc_ws, E->qtc_ws_bytes));
            /* the decode kernel's arrival counters start at zero and every launch leaves them so */
            CU_CHECK(attn_decode_workspace_init(E->attn_ws, E->attn_ws_bytes, 0));
            CU_CHECK(cudaDeviceSynchronize());
        }

        /* KV caches from the budget: --kv-mem, or 85% of what is free now (the rest for cuBLAS and graphs) */
        size_t free_b = 0, total_b = 0;
        CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const size_t budget = o->kv_mem ? o->kv_mem : (size_t)(free_b * 0.85);
        const size_t slot_bytes = (size_t)(le - lb) * 2 * b->n_ctx * kvd * es;   /* this engine's layers only */
        size_t fit = budget / slot_bytes;   /* slots that fit, the sentinel included */
        if (o->n_slots <= 0 && o->kv_mem) b->n_slots = fit > 1 ? (int)(fit - 1 > 65536 ? 65536 : fit - 1) : 0;
        if (fit < (size_t)b->n_slots + 1) b->n_slots = fit > 1 ? (int)(fit - 1) : 0;
        if (b->n_slots < 1) {
            snprintf(err, errlen, "KV budget of %.1f MiB holds no slot of %d tokens (%.1f MiB each)", budget / 1048576.0,
                     b->n_ctx, slot_bytes / 1048576.0);
            goto fail;
        }
        if (b->max_batch > b->n_slots) b->max_batch = b->n_slots;
        E->kv_bytes = slot_bytes * (b->n_slots + 1);
        CU_CHECK(cudaMalloc(&E->kv, E->kv_bytes));
        /* zeroed once: the sentinel and not-yet-written positions hold finite values */
        CU_CHECK(cudaMemset(E->kv, 0, E->kv_bytes));
        /* the slots' carries (zl_seq.feed), sized now that the KV budget has fixed n_slots (+ the sentinel); they
         * start zeroed: every id and state a fed row could read is valid before the first sample */
        E->carry_ok = (uint8_t *)calloc((size_t)b->n_slots, 1);
        if (!E->carry_ok) { snprintf(err, errlen, "out of memory"); goto fail; }
        CU_CHECK(cudaMalloc((void **)&E->carry_tok, ((size_t)b->n_slots + 1) * 4));
        CU_CHECK(cudaMemset(E->carry_tok, 0, ((size_t)b->n_slots + 1) * 4));
        CU_CHECK(cudaMalloc((void **)&E->carry_rng, ((size_t)b->n_slots + 1) * 8));
        CU_CHECK(cudaMemset(E->carry_rng, 0, ((size_t)b->n_slots + 1) * 8));
        const size_t layer_half = (size_t)(b->n_slots + 1) * b->n_ctx * kvd * es;
        for (int l = lb; l < le; l++) {
            E->L[l].kc = (uint8_t *)E->kv + (size_t)(l - lb) * 2 * layer_half;
            E->L[l].vc = (uint8_t *)E->kv + ((size_t)(l - lb) * 2 + 1) * layer_half;
        }
        fprintf(stderr, "zllm %s: KV cache %d slots x %d tokens (%lld tokens, %.1f MiB %s), max batch %d\n", b->device,
                b->n_slots, b->n_ctx, (long long)b->n_slots * b->n_ctx, E->kv_bytes / 1048576.0, ops_dtype_name(E->wt),
                b->max_batch);
        if (!o->no_graphs && s_capture_graphs(E, err, errlen) != 0) goto fail;
    }
    return b;
fail:
    s_destroy(b);
    return NULL;
}

double engine_cuda_last_step_gpu_ms(const zl_engine *e) {
    if (!e || !e->ops || e->ops != &s_ops_cuda) return -1;
    return ((const cu_engine *)e)->last_gpu_ms;
}

int engine_cuda_step_hidden_dev(zl_engine *e, const zl_seq *seqs, int n, const float *d_h_in, float *d_h_out,
                                void *const *wait_events, int n_wait, void *const *record_events, int n_record,
                                int32_t *out_tokens) {
    if (!e || !e->ops || e->ops != &s_ops_cuda) return -1;
    return s_run((cu_engine *)e, seqs, n, d_h_in, d_h_out, 1, wait_events, n_wait, record_events, n_record,
                 out_tokens, NULL, 0);
}

int engine_cuda_device(const zl_engine *e) {
    if (!e || !e->ops || e->ops != &s_ops_cuda) return -1;
    return ((const cu_engine *)e)->dev;
}

int engine_cuda_ready(const zl_engine *e) {
    if (!e || !e->ops || e->ops != &s_ops_cuda) return -1;
    const cu_engine *E = (const cu_engine *)e;
    if (E->dead) return -1;
    if (!E->in_pending) return 1;
    const cudaError_t ce = cudaEventQuery(E->ev_in);
    return ce == cudaSuccess ? 1 : ce == cudaErrorNotReady ? 0 : -1;
}

int engine_cuda_idle(const zl_engine *e) {
    if (!e || !e->ops || e->ops != &s_ops_cuda) return -1;
    const cu_engine *E = (const cu_engine *)e;
    if (cudaSetDevice(E->dev) != cudaSuccess) return -1;
    const cudaError_t ce = cudaStreamQuery(E->st);
    return ce == cudaSuccess ? 1 : ce == cudaErrorNotReady ? 0 : -1;
}

void engine_cuda_abandon(zl_engine *e) {
    if (e && e->ops == &s_ops_cuda) ((cu_engine *)e)->abandoned = 1;
}
