/* cuda/engine_cuda.cu: the CUDA backend of common/engine.h (one GPU).
 *
 * Data layout and types
 *   - Matrices live on the GPU in one compute type `wt`: F32 when every matrix of the file is F32, otherwise
 *     BF16 when any matrix is BF16, otherwise F16 (F16 files, and quantized ones, which are dequantized on the
 *     host with quant_dequant_row and converted on the GPU at load; the speed issue replaces this with kernels
 *     that read the GGUF blocks). Norm weights and biases are f32.
 *   - The residual stream x and every matrix-product output are f32; matrix-product inputs (normalised rows,
 *     attention output, SwiGLU product) are cast to wt, so F32 models run in f32 end to end and 16-bit models
 *     get tensor-core products with f32 accumulation and an f32 residual.
 *   - KV caches are wt-typed, per layer [n_slots + 1][n_ctx][n_kv_heads][head_dim]; slot n_slots is the
 *     sentinel that padded rows of a graph bucket write into and never read from (kv_len 0).
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
#include "cuda_common.h"
#include "ops.h"
#include "sample.h"

enum { CU_HIST = 256,        /* history tokens per row staged for the repetition penalty (repeat_last_n capped) */
       CU_MAX_BUCKETS = 64 };

typedef struct {
    void *wq, *wk, *wv, *wo;   /* wt matrices [rows][cols] as in the file */
    void *wg, *wu, *wd;        /* FFN matrices, wt */
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
    size_t hist_len;           /* int32 [max_batch] staged history tokens per sampling row */
    size_t params;             /* zl_sampling [max_batch] */
    size_t hist;               /* int32 [max_batch][CU_HIST] history tail per sampling row */
    size_t core_end;           /* end of everything but hist: the copy length when no row needs a penalty */
    size_t total;              /* whole block */
} cu_inputs;

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
    void *tok_embd;            /* [vocab][dim] wt */
    void *out_w;               /* LM head [vocab][dim] wt; == tok_embd when tied */
    float *out_norm;           /* [dim] */
    float *rope_cs;            /* [n_ctx][rope_dim/2] (cos, sin) */
    void *kv;                  /* one allocation holding every layer's K and V */
    size_t kv_bytes;
    size_t weight_bytes;       /* bytes of weights on the device */
    /* activations, [max_tok] rows unless noted */
    float *x;                  /* residual [dim] */
    float *q, *k, *v;          /* [q_dim], [kv_dim], [kv_dim] */
    float *att;                /* attention output [q_dim] f32 */
    void *att_w;               /* att cast to wt (== att for F32) */
    void *xb;                  /* GEMM input, wt, [max(dim, ffn_dim, q_dim)] */
    float *tmp;                /* GEMM output before the residual add [dim] */
    float *gate, *up;          /* [ffn_dim] */
    float *logits;             /* [max_batch][vocab] */
    void *attn_ws;             /* flash-decoding partials */
    size_t attn_ws_bytes;
    int n_splits;              /* fixed split count (batch invariance), from attn_decode_splits at n_ctx */
    void *samp_ws;             /* sampler scratch */
    size_t samp_ws_bytes;
    cu_inputs in;              /* input block layout */
    uint8_t *h_in;             /* pinned host input block */
    uint8_t *d_in;             /* device input block */
    float *h_logits;           /* pinned [max_batch][vocab] */
    int n_buckets;             /* CUDA graphs: batch sizes and executables (none when no_graphs) */
    int bucket[CU_MAX_BUCKETS];
    cudaGraphExec_t gexec[CU_MAX_BUCKETS];
    int *order;                /* host scratch [max_batch]: ordered entry k -> caller index */
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

static int s_upload_model(cu_engine *E, char *err, size_t errlen) {
    const zl_model *m = E->base.model;
    const zl_config *c = &m->cfg;
    cu_stage sg = {NULL, NULL, (size_t)16 << 20};
    int rc = -1;
    size_t widest = (size_t)c->dim > (size_t)c->ffn_dim ? (size_t)c->dim : (size_t)c->ffn_dim;
    if ((size_t)c->n_heads * c->head_dim > widest) widest = (size_t)c->n_heads * c->head_dim;
    if (sg.cap < widest) sg.cap = widest;
    CU_CHECK(cudaMallocHost((void **)&sg.h, sg.cap * 4));
    CU_CHECK(cudaMalloc((void **)&sg.d, sg.cap * 4));
    if (s_upload(E, &sg, &m->tok_embd, E->wt, &E->tok_embd, err, errlen) != 0) goto fail;
    if (c->tied_embeddings || m->output.data == m->tok_embd.data) E->out_w = E->tok_embd;
    else if (s_upload(E, &sg, &m->output, E->wt, &E->out_w, err, errlen) != 0) goto fail;
    if (s_upload(E, &sg, &m->output_norm, CU_F32, (void **)&E->out_norm, err, errlen) != 0) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        const zl_layer_weights *w = &m->layers[l];
        cu_layer *d = &E->L[l];
        if (s_upload(E, &sg, &w->attn_norm, CU_F32, (void **)&d->attn_norm, err, errlen) != 0 ||
            s_upload(E, &sg, &w->ffn_norm, CU_F32, (void **)&d->ffn_norm, err, errlen) != 0 ||
            s_upload(E, &sg, &w->wq, E->wt, &d->wq, err, errlen) != 0 ||
            s_upload(E, &sg, &w->wk, E->wt, &d->wk, err, errlen) != 0 ||
            s_upload(E, &sg, &w->wv, E->wt, &d->wv, err, errlen) != 0 ||
            s_upload(E, &sg, &w->wo, E->wt, &d->wo, err, errlen) != 0 ||
            s_upload(E, &sg, &w->w_gate, E->wt, &d->wg, err, errlen) != 0 ||
            s_upload(E, &sg, &w->w_up, E->wt, &d->wu, err, errlen) != 0 ||
            s_upload(E, &sg, &w->w_down, E->wt, &d->wd, err, errlen) != 0) goto fail;
        if (w->bq.data && s_upload(E, &sg, &w->bq, CU_F32, (void **)&d->bq, err, errlen) != 0) goto fail;
        if (w->bk.data && s_upload(E, &sg, &w->bk, CU_F32, (void **)&d->bk, err, errlen) != 0) goto fail;
        if (w->bv.data && s_upload(E, &sg, &w->bv, CU_F32, (void **)&d->bv, err, errlen) != 0) goto fail;
        /* progress line, one update per tenth of the layers (the file may be tens of GB) */
        if (c->n_layers >= 10 && (l + 1) % (c->n_layers / 10) == 0)
            fprintf(stderr, "\rzllm %s: uploading weights: layer %d/%d, %.0f MiB", E->base.device, l + 1,
                    c->n_layers, E->weight_bytes / 1048576.0);
    }
    fprintf(stderr, "\rzllm %s: uploaded weights: %d layers, %.1f MiB as %s\n", E->base.device, c->n_layers,
            E->weight_bytes / 1048576.0, ops_dtype_name(E->wt));
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

/* Enqueues the forward pass and the sampling for the inputs already in d_in: n_rows rows, of which the first
 * n_dec are decode rows and the rest belong to n_pre prefill entries (at most max_rows rows each); n_samp
 * sampling rows (= entries, including padded ones). No host synchronisation, allocation or copy: it is the
 * body that graph capture records. */
static int s_forward(cu_engine *E, int n_rows, int n_dec, int n_pre, int max_rows, int n_samp, char *err,
                     size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    const int dim = c->dim, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, ff = c->ffn_dim;
    const int32_t *tokens = IN_PTR(E, tokens, int32_t), *pos = IN_PTR(E, pos, int32_t);
    const int32_t *slot = IN_PTR(E, slot, int32_t);
    cudaStream_t st = E->st;
    FWD_CHECK(ops_embed(E->tok_embd, E->wt, dim, tokens, n_rows, E->x, st, err, errlen));
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer *L = &E->L[l];
        FWD_CHECK(ops_rmsnorm(E->x, NULL, L->attn_norm, dim, c->rms_eps, n_rows, E->xb, E->wt, st, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wq, E->wt, n_rows, dim, qd, E->q, 0.f, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wk, E->wt, n_rows, dim, kvd, E->k, 0.f, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wv, E->wt, n_rows, dim, kvd, E->v, 0.f, err, errlen));
        if (L->bq) FWD_CHECK(ops_bias_add(E->q, L->bq, n_rows, qd, st, err, errlen));
        if (L->bk) FWD_CHECK(ops_bias_add(E->k, L->bk, n_rows, kvd, st, err, errlen));
        if (L->bv) FWD_CHECK(ops_bias_add(E->v, L->bv, n_rows, kvd, st, err, errlen));
        FWD_CHECK(ops_rope(E->q, pos, n_rows, c->n_heads, c->head_dim, c->rope_dim, (int)c->rope_style, E->rope_cs,
                           st, err, errlen));
        FWD_CHECK(ops_rope(E->k, pos, n_rows, c->n_kv_heads, c->head_dim, c->rope_dim, (int)c->rope_style,
                           E->rope_cs, st, err, errlen));
        /* the append precedes attention on the same stream: every row then attends to itself through the cache */
        FWD_CHECK(ops_kv_append(E->k, E->v, slot, pos, n_rows, kvd, E->base.n_ctx, L->kc, L->vc, E->wt, st, err,
                                errlen));
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
            FWD_CUDA(attn_decode_launch(&p, st));
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
        if (E->wt != CU_F32)
            FWD_CHECK(ops_convert(E->att, CU_F32, E->att_w, E->wt, (size_t)n_rows * qd, st, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->att_w, L->wo, E->wt, n_rows, qd, dim, E->tmp, 0.f, err, errlen));
        FWD_CHECK(ops_residual_add(E->x, E->tmp, (size_t)n_rows * dim, st, err, errlen));
        FWD_CHECK(ops_rmsnorm(E->x, NULL, L->ffn_norm, dim, c->rms_eps, n_rows, E->xb, E->wt, st, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wg, E->wt, n_rows, dim, ff, E->gate, 0.f, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wu, E->wt, n_rows, dim, ff, E->up, 0.f, err, errlen));
        FWD_CHECK(ops_swiglu(E->gate, E->up, n_rows, ff, E->xb, E->wt, st, err, errlen));
        FWD_CHECK(ops_gemm(E->cb, E->xb, L->wd, E->wt, n_rows, ff, dim, E->tmp, 0.f, err, errlen));
        FWD_CHECK(ops_residual_add(E->x, E->tmp, (size_t)n_rows * dim, st, err, errlen));
    }
    /* final norm of each entry's last row only, then the LM head for those rows */
    FWD_CHECK(ops_rmsnorm(E->x, IN_PTR(E, last_row, int32_t), E->out_norm, dim, c->rms_eps, n_samp, E->xb, E->wt,
                          st, err, errlen));
    FWD_CHECK(ops_gemm(E->cb, E->xb, E->out_w, E->wt, n_samp, dim, c->vocab_size, E->logits, 0.f, err, errlen));
    sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.logits = E->logits; sp.n_rows = n_samp; sp.vocab = c->vocab_size;
    sp.params = IN_PTR(E, params, zl_sampling); sp.row_state = NULL;
    sp.history = IN_PTR(E, hist, int32_t); sp.history_stride = CU_HIST; sp.history_len = IN_PTR(E, hist_len, int32_t);
    sp.rng_state = IN_PTR(E, rng, uint64_t); sp.out = IN_PTR(E, out_tok, int32_t);
    sp.workspace = E->samp_ws; sp.workspace_bytes = E->samp_ws_bytes;
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

static int s_step(zl_engine *base, const zl_seq *seqs, int n, int32_t *out_tokens, float *out_logits) {
    cu_engine *E = (cu_engine *)base;
    const zl_config *c = &base->model->cfg;
    char err[200];
    const size_t errlen = sizeof err;
    if (E->dead) { snprintf(base->err, sizeof base->err, "cuda engine unusable after an earlier device error"); return -1; }
    if (!seqs || n < 1 || n > base->max_batch || !out_tokens) {
        snprintf(base->err, sizeof base->err, "bad step: %d entries (max %d)", n, base->max_batch);
        return -1;
    }
    /* validate everything before touching the device */
    int total = 0, n_dec = 0, max_rows = 1, need_hist = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (s->slot < 0 || s->slot >= base->n_slots || s->pos < 0 || s->n_tokens < 1 ||
            s->pos + s->n_tokens > base->n_ctx || !s->tokens) {
            snprintf(base->err, sizeof base->err, "bad entry %d: slot %d pos %d n_tokens %d (n_slots %d, n_ctx %d)",
                     i, s->slot, s->pos, s->n_tokens, base->n_slots, base->n_ctx);
            return -1;
        }
        for (int j = 0; j < i; j++) if (seqs[j].slot == s->slot) {
            snprintf(base->err, sizeof base->err, "entries %d and %d share slot %d", j, i, s->slot);
            return -1;
        }
        for (int t = 0; t < s->n_tokens; t++) if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab_size) {
            snprintf(base->err, sizeof base->err, "entry %d: token %d out of range", i, (int)s->tokens[t]);
            return -1;
        }
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
    int32_t *last = (int32_t *)(E->h_in + E->in.last_row);
    int row = 0;
    for (k = 0; k < n; k++) {
        const zl_seq *s = &seqs[E->order[k]];
        if (k >= n_dec) {
            r0[k - n_dec] = row; nr[k - n_dec] = s->n_tokens; ss[k - n_dec] = s->slot; sp0[k - n_dec] = s->pos;
        } else {
            kvl[k] = s->pos + 1;
        }
        for (int t = 0; t < s->n_tokens; t++, row++) { tok[row] = s->tokens[t]; pos[row] = s->pos + t; slot[row] = s->slot; }
        last[k] = row - 1;
        s_stage_sampling(E, k, s);
    }
    /* padded rows of a graph bucket: the sentinel slot at position 0 with kv_len 0, greedy, no history */
    for (; k < n_samp; k++, row++) {
        tok[row] = 0; pos[row] = 0; slot[row] = base->n_slots; kvl[k] = 0; last[k] = row;
        s_stage_sampling(E, k, NULL);
    }
    /* ONE host-to-device copy of every per-step input, on the engine's stream: the kernels (or the graph) that
     * follow on the same stream see it complete; the pinned block is not rewritten before the step's final
     * synchronisation, so the asynchronous copy never reads a half-updated block */
    const size_t nbytes = need_hist ? E->in.total : E->in.core_end;
    if (cudaMemcpyAsync(E->d_in, E->h_in, nbytes, cudaMemcpyHostToDevice, E->st) != cudaSuccess) {
        s_fail_step(E, seqs, n, "input copy failed");
        return -1;
    }
    if (gi >= 0) {
        const cudaError_t ce = cudaGraphLaunch(E->gexec[gi], E->st);
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "cudaGraphLaunch(bucket %d): %s", E->bucket[gi], cudaGetErrorString(ce));
            s_fail_step(E, seqs, n, err);
            return -1;
        }
    } else if (s_forward(E, row, n_dec, n_pre, max_rows, n, err, errlen) != 0) {
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    /* ids and the advanced generator states come back in one copy (rng and out_tok are adjacent) */
    cudaError_t ce = cudaMemcpyAsync(E->h_in + E->in.rng, E->d_in + E->in.rng, E->in.tokens - E->in.rng,
                                     cudaMemcpyDeviceToHost, E->st);
    if (ce == cudaSuccess && out_logits)
        ce = cudaMemcpyAsync(E->h_logits, E->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, E->st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(E->st);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "%s", cudaGetErrorString(ce));
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    const int32_t *otok = (const int32_t *)(E->h_in + E->in.out_tok);
    const uint64_t *orng = (const uint64_t *)(E->h_in + E->in.rng);
    for (k = 0; k < n; k++) {
        const int i = E->order[k];
        out_tokens[i] = seqs[i].sample ? otok[k] : -1;
        if (seqs[i].sample && seqs[i].rng) *seqs[i].rng = orng[k];
        if (out_logits) memcpy(out_logits + (size_t)i * c->vocab_size, E->h_logits + (size_t)k * c->vocab_size,
                               (size_t)c->vocab_size * 4);
    }
    return 0;
}

/* ------------------------------------------------------------------ lifetime */

static void s_destroy(zl_engine *base) {
    cu_engine *E = (cu_engine *)base;
    if (!E) return;
    cudaSetDevice(E->dev);
    if (E->st) cudaStreamSynchronize(E->st);
    for (int i = 0; i < E->n_buckets; i++) if (E->gexec[i]) cudaGraphExecDestroy(E->gexec[i]);
    if (E->L) {
        for (int l = 0; l < base->model->cfg.n_layers; l++) {
            cu_layer *L = &E->L[l];
            void *p[] = {L->wq, L->wk, L->wv, L->wo, L->wg, L->wu, L->wd, L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
        }
        free(E->L);
    }
    if (E->out_w != E->tok_embd) cudaFree(E->out_w);
    void *d[] = {E->tok_embd, E->out_norm, E->rope_cs, E->kv, E->x, E->q, E->k, E->v, E->att, E->xb, E->tmp,
                 E->gate, E->up, E->logits, E->attn_ws, E->samp_ws, E->d_in, E->cb_ws};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cudaFree(d[i]);
    if (E->att_w != (void *)E->att) cudaFree(E->att_w);
    cudaFreeHost(E->h_in);
    cudaFreeHost(E->h_logits);
    if (E->cb) cublasDestroy(E->cb);
    if (E->st) cudaStreamDestroy(E->st);
    free(E->order);
    free(E);
}

static const zl_engine_ops s_ops_cuda = {s_step, s_destroy};

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
    in->hist_len = o; o = s_align(o + (size_t)max_batch * 4);
    in->params = o;   o = s_align(o + (size_t)max_batch * sizeof(zl_sampling));
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
        cudaGraph_t g = NULL;
        /* thread-local capture: other threads of the process may keep using CUDA (e.g. another engine) */
        CU_CHECK(cudaStreamBeginCapture(E->st, cudaStreamCaptureModeThreadLocal));
        if (s_forward(E, B, B, 0, 1, B, err, errlen) != 0) {
            cudaStreamEndCapture(E->st, &g);
            if (g) cudaGraphDestroy(g);
            goto fail;
        }
        CU_CHECK(cudaStreamEndCapture(E->st, &g));
        {
            const cudaError_t ce = cudaGraphInstantiate(&E->gexec[i], g, 0);
            cudaGraphDestroy(g);
            CU_CHECK(ce);
        }
        E->n_buckets = i + 1;
        CU_CHECK(cudaGraphUpload(E->gexec[i], E->st));
    }
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
    cu_engine *E = (cu_engine *)calloc(1, sizeof *E);
    if (!E) { snprintf(err, errlen, "out of memory"); return NULL; }
    zl_engine *b = &E->base;
    b->ops = &s_ops_cuda;
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
        if (s_upload_model(E, err, errlen) != 0) goto fail;
        
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
        CU_CHECK(cudaMalloc((void **)&E->q, T * qd * 4));
        CU_CHECK(cudaMalloc((void **)&E->k, T * kvd * 4));
        CU_CHECK(cudaMalloc((void **)&E->v, T * kvd * 4));
        CU_CHECK(cudaMalloc((void **)&E->att, T * qd * 4));
        if (E->wt == CU_F32) E->att_w = E->att;
        else CU_CHECK(cudaMalloc(&E->att_w, T * qd * es));
        CU_CHECK(cudaMalloc(&E->xb, T * wide * es));
        CU_CHECK(cudaMalloc((void **)&E->tmp, T * c->dim * 4));
        CU_CHECK(cudaMalloc((void **)&E->gate, T * c->ffn_dim * 4));
        CU_CHECK(cudaMalloc((void **)&E->up, T * c->ffn_dim * 4));
        CU_CHECK(cudaMalloc((void **)&E->logits, (size_t)b->max_batch * c->vocab_size * 4));
        CU_CHECK(cudaMallocHost((void **)&E->h_logits, (size_t)b->max_batch * c->vocab_size * 4));
        s_layout_inputs(&E->in, E->max_tok, b->max_batch);
        CU_CHECK(cudaMallocHost((void **)&E->h_in, E->in.total));
        memset(E->h_in, 0, E->in.total);
        CU_CHECK(cudaMalloc((void **)&E->d_in, E->in.total));
        CU_CHECK(cudaMemset(E->d_in, 0, E->in.total));
        E->order = (int *)malloc((size_t)b->max_batch * sizeof(int));
        if (!E->order) { snprintf(err, errlen, "out of memory"); goto fail; }
        E->samp_ws_bytes = sample_workspace_bytes(b->max_batch, c->vocab_size);
        CU_CHECK(cudaMalloc(&E->samp_ws, E->samp_ws_bytes ? E->samp_ws_bytes : 16));
        {
            attn_decode_params p;
            memset(&p, 0, sizeof p);
            p.kv_type = s_kvt(E->wt); p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads;
            p.head_dim = c->head_dim; p.n_ctx = b->n_ctx; p.max_kv_len = b->n_ctx; p.sm_count = E->sm_count;
            /* the split count a single sequence at full context would get, fixed for every batch */
            p.n_seq = 1;
            E->n_splits = attn_decode_splits(&p);
            p.n_splits = E->n_splits;
            p.n_seq = b->max_batch;
            E->attn_ws_bytes = attn_decode_workspace_bytes(&p);
            if (E->n_splits < 1 || E->attn_ws_bytes == 0) {
                snprintf(err, errlen, "attention does not support this model's shape");
                goto fail;
            }
            CU_CHECK(cudaMalloc(&E->attn_ws, E->attn_ws_bytes));
        }

        /* KV caches from the budget: --kv-mem, or 85% of what is free now (the rest for cuBLAS and graphs) */
        size_t free_b = 0, total_b = 0;
        CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const size_t budget = o->kv_mem ? o->kv_mem : (size_t)(free_b * 0.85);
        const size_t slot_bytes = (size_t)c->n_layers * 2 * b->n_ctx * kvd * es;
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
        const size_t layer_half = (size_t)(b->n_slots + 1) * b->n_ctx * kvd * es;
        for (int l = 0; l < c->n_layers; l++) {
            E->L[l].kc = (uint8_t *)E->kv + (size_t)l * 2 * layer_half;
            E->L[l].vc = (uint8_t *)E->kv + ((size_t)l * 2 + 1) * layer_half;
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
