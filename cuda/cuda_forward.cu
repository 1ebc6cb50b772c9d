/* cuda/cuda_forward.cu: the forward pass of one CUDA engine step (cu_engine.h), the body graph capture records.
 *
 * A step's rows: decode rows (one token each) first, then each prefill entry's run of consecutive rows. Every row
 * goes through the same matrix products; attention runs the split-K flash-decoding kernels over the decode rows
 * and the prefill kernel over the prefill runs. The final norm gathers the last row of each entry that samples (a
 * prompt chunk that does not sample comes last and has none), the LM head makes their logits, and the GPU sampler
 * writes one id per such entry.
 * Data: the residual stream x and every matrix-product output are f32; matrix-product inputs (normalised rows,
 * attention output, SwiGLU product) are cast to wt (xb, att_w), so F32 models run in f32 end to end and 16-bit
 * models get tensor-core products with f32 accumulation and an f32 residual. The residual adds are fused into the
 * output projections (y += x W^T). The Q/K/V products write the column slices of E->qkv (one product when joined),
 * one kernel (ops_qkv_rope_append) then adds the biases, applies RoPE, writes q for attention and k, v into the
 * caches; the gate/up products write E->gu's halves (or interleaved blocks of 8) for the SwiGLU.
 * Each matrix's kernel family and each layer's joins were decided at load (cuda/cuda_weights.cu); nothing here
 * depends on a row's contents, only on the step's shape. Programmatic dependent launch (cuda/pdl.cuh) lets each
 * of our kernels start while the one before drains; cuBLAS launches stay plain. No result changes. */
extern "C" {
#include "sampler.h"
}
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "attention.h"
#include "attn_decode_tc.h"
#include "attn_window.h"
#include "cu_engine.h"
#include "cu_settings.h"
#include "ops_gemma.h"
#include "qtc.h"
#include "sample.h"
#include "sample_mask.h"
#include "bias_penalty.h"
#include "logprob_top.h"
#include "wtc.h"

#define IN_PTR(E, field, type) ((type *)((E)->d_in + (E)->in.field))
#define FWD_CHECK(call) do { if ((call) != 0) return -1; } while (0)
#define FWD_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_)); return -1; } } while (0)

/* ------------------------------------------------------------------ matrix products */

/* the qtc launch of W on n_rows rows of xw (f16, n_in apart) into y (ldy floats apart; resid: + y itself) */
static qtc_params s_qtc_params(const cu_engine *E, const cu_mat *W, int n_rows, const void *xw, float *y, int ldy,
                               int resid) {
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = W->qt; p.w = W->w; p.n_in = W->n_in; p.n_out = W->n_out;
    p.m = n_rows; p.x = (const uint16_t *)xw; p.ldx = W->n_in; p.y = y; p.ldy = ldy;
    p.y_in = resid ? y : NULL;
    p.workspace = E->qtc_ws;
    p.workspace_bytes = E->qtc_ws_bytes;
    p.flags = E->qtc_flags;
    return p;
}

/* 1 when W's product over n_rows rows takes qtc's 16-bit form, whose input may come in its k order (x_perm) */
static int s_kperm_takes(const cu_engine *E, const cu_mat *W, int n_rows) {
    if (W->path != CU_PATH_QTC) return 0;
    const qtc_params p = s_qtc_params(E, W, n_rows, NULL, NULL, 0, 0);
    return qtc_f16_form(&p);
}

/* NX (32 or 64) when W's product over n_rows rows takes qtc's wgmma kernel with NX columns a CTA and its input
 * comes as its images (x_image), written by the norm or the SwiGLU before it; 0 otherwise, where the engine's
 * activations are not F16, and for 128 columns a CTA (65 to 1,023 rows), where the images written by those kernels
 * made the 8B Q8_0 and Q4_K_M steps 0.7% slower at 256 rows and no faster at 128 than qtc's own copy (docs/perf.md,
 * "Quantized products at 17 to 64 rows: x written as the wgmma kernel's images") */
static int s_ximage_takes(const cu_engine *E, const cu_mat *W, int n_rows) {
    if (W->path != CU_PATH_QTC || E->wt != CU_F16) return 0;
    const qtc_params p = s_qtc_params(E, W, n_rows, NULL, NULL, 0, 0);
    const int nx = qtc_ximage_nx(&p);
    return nx <= 64 ? nx : 0;
}

/* the wtc product of W's dense 16-bit copy over n_rows rows of xw (n_in apart); output fields left unset */
static wtc_params s_wtc_params(const cu_engine *E, const cu_mat *W, int n_rows, const void *xw) {
    wtc_params p;
    memset(&p, 0, sizeof p);
    p.bf16 = E->wt == CU_BF16; p.w = W->w; p.n_in = W->n_in; p.n_out = W->n_out; p.m = n_rows;
    p.x = xw;
    p.ldx = W->n_in;
    p.x_rows = E->x_rows;
    p.workspace = E->qtc_ws; p.workspace_bytes = E->qtc_ws_bytes; p.sm_count = E->sm_count;
    return p;
}

/* y[n_rows][n_out] = x W^T, or y += x W^T when resid (y holds the residual stream), on W's path; x is xw (wt,
 * n_in apart), or with kperm (the x layout, s_xlayout below) 1 in qtc's 16-bit k order (only where
 * s_kperm_takes), NX > 1 as qtc's wgmma images of NX columns (only where s_ximage_takes gives NX). y's rows are ldy
 * floats apart (0 means n_out; a larger ldy writes a column slice of a wider array, e.g. wk into E->qkv + q_dim).
 * s_matmul: kperm 0. */
static int s_matmul_k(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, int kperm, float *y, int ldy,
                      int resid, char *err, size_t errlen) {
    if (n_rows <= 0) return 0;
    if (ldy == 0) ldy = W->n_out;
    cudaError_t e = cudaSuccess;
    switch (W->path) {
    case CU_PATH_QTC: {
        qtc_params p = s_qtc_params(E, W, n_rows, xw, y, ldy, resid);
        p.x_perm = kperm == 1;
        p.x_image = kperm > 1;
        p.x_rows = E->x_rows;
        e = qtc_launch(&p, E->st);
        break;
    }
    case CU_PATH_WTC: {
        wtc_params p = s_wtc_params(E, W, n_rows, xw);
        p.y = y; p.ldy = ldy; p.y_in = resid ? y : NULL;
        e = wtc_launch(&p, E->st);
        break;
    }
    case CU_PATH_CUBLAS:
        return ops_gemm(E->cb, xw, W->w, E->wt, n_rows, W->n_in, W->n_out, y, ldy, resid ? 1.f : 0.f, err, errlen);
    default:
        snprintf(err, errlen, "a matrix (%d x %d) without a path", W->n_out, W->n_in);
        return -1;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "%s (%s, %d x %d, m %d): %s", W->path == CU_PATH_QTC ? "qtc" : "wtc",
                 W->path == CU_PATH_QTC ? ggml_type_name(W->qt) : ops_dtype_name(E->wt), W->n_out, W->n_in, n_rows,
                 cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static int s_matmul(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, float *y, int ldy, int resid, char *err,
                    size_t errlen) {
    return s_matmul_k(E, W, n_rows, xw, 0, y, ldy, resid, err, errlen);
}

/* The interleaved gate/up product W (glu8) with its path's SwiGLU epilogue: silu(gate) * up as wt values
 * [n_rows][ff] into out. Returns 1 when launched, 0 when this step's form has no such epilogue (the caller runs
 * the product and ops_swiglu_il8_dual: the same bits), -1 with err set on a launch error. kperm: xw is in qtc's
 * 16-bit k order (only where s_kperm_takes). */
static int s_glu(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, int kperm, void *out, int ff, char *err,
                 size_t errlen) {
    cudaError_t e;
    if (W->path == CU_PATH_QTC) {   /* qtc's narrow kernel (decode batches of <= 8 rows): f16 (E->wt is F16) */
        qtc_params p = s_qtc_params(E, W, n_rows, xw, NULL, 0, 0);
        p.glu = (uint16_t *)out; p.ldg = ff;
        p.x_perm = kperm == 1;
        p.x_image = kperm > 1;
        p.x_rows = E->x_rows;
        if (!qtc_glu_fused(&p)) return 0;
        e = qtc_launch(&p, E->st);
    } else if (W->path == CU_PATH_WTC) {
        wtc_params p = s_wtc_params(E, W, n_rows, xw);
        p.glu = out; p.ldg = ff;
        if (!wtc_glu_fused(&p)) return 0;
        e = wtc_launch(&p, E->st);
    } else {
        return 0;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "glu (%d x %d, m %d): %s", W->n_out, W->n_in, n_rows, cudaGetErrorString(e));
        return -1;
    }
    return 1;
}

/* ya = x A^T and yb = x B^T (ldy floats apart) in one qtc launch (qtc_launch_pair: the same bits as two), for a
 * layer's qkv_pair in steps of at most 8 rows. Returns 1 when launched, 0 when the pair has no such form (the
 * caller launches the two products), -1 with err set on a launch error. */
static int s_matmul_pair(cu_engine *E, const cu_mat *A, const cu_mat *B, int n_rows, const void *xw, float *ya,
                         float *yb, int ldy, char *err, size_t errlen) {
    if (n_rows > 8) return 0;
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

/* ------------------------------------------------------------------ the operations of a layer */

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

/* x = the rows' token embeddings (fed rows: the slots' carried ids), or on a later pipeline stage the hidden
 * states the stage before handed on */
static int s_embed(cu_engine *E, int n_rows, char *err, size_t errlen) {
    const int dim = E->base.model->cfg.dim;
    if (E->base.layer_begin == 0) {
        ops_feed fd;   /* fed rows (zl_seq.feed): their ids and generator states from the slots' carries */
        fd.slot = IN_PTR(E, slot, int32_t); fd.carry_tok = E->carry_tok; fd.carry_rng = E->carry_rng;
        fd.rng = IN_PTR(E, rng, uint64_t);
        FWD_CHECK(
            ops_embed(E->tok_embd, E->wt, dim, IN_PTR(E, tokens, int32_t), n_rows, E->x, &fd, E->st, err, errlen));
        const float es = E->base.model->cfg.embd_scale; /* gemma3: sqrt(dim) */
        return es != 1.0f ? ops_scale(E->x, (size_t)n_rows * dim, es, E->st, err, errlen) : 0;
    }
    s_k_stage_in<<<n_rows, 256, 0, E->st>>>(E->x, IN_PTR(E, hptr, const unsigned long long),
                                              IN_PTR(E, perm, const int32_t), dim);
    FWD_CUDA(cudaGetLastError());
    return 0;
}

/* xb = rmsnorm(x) * w as wt, for the next products; kperm, the x layout (s_kperm_qkv, s_kperm_ffn): 1 in qtc's
 * 16-bit k order, NX > 1 as qtc's wgmma images of NX columns; pk > 0: x first takes the sum of the pk split partials
 * that the output product before left in E->qtc_ws (s_partials) */
static int s_rmsnorm(cu_engine *E, const float *w, int n_rows, int kperm, int pk, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    if (pk) /* the output product's split partials first (s_partials) */
        return ops_rmsnorm_merge(E->x, (const float *)E->qtc_ws, pk, w, c->dim, c->rms_eps, n_rows, E->xb, E->wt, kperm,
                                 E->st, err, errlen);
    if (kperm > 1)
        return ops_rmsnorm_ximage(E->x, w, c->dim, c->rms_eps, n_rows, E->xb, E->wt, kperm, E->st, err, errlen);
    if (kperm) return ops_rmsnorm_kperm(E->x, w, c->dim, c->rms_eps, n_rows, E->xb, E->wt, E->st, err, errlen);
    return ops_rmsnorm_dual(E->x, NULL, w, c->dim, c->rms_eps, n_rows, E->xb, E->wt, NULL, 1, E->st, err, errlen);
}

/* The layout the norm before the products of W[0..n) writes xb in for this step, when every one of them reads it
 * so and the norm serves the row (the products then skip their own reordering of xb: the same bits): 1 in qtc's
 * 16-bit k order (qtc matrices, n_rows >= 1,024 on sm_90), NX > 1 as qtc's wgmma images of NX columns (qtc
 * matrices of F16 activations in steps between the narrow kernel's rows and the 16-bit form's); 0 in rows */
static int s_xlayout(const cu_engine *E, const cu_mat *const *W, int n, int n_rows) {
    if (!ops_rmsnorm_kperm_serves(E->base.model->cfg.dim, E->wt)) return 0;
    int kp = 1, nx = s_ximage_takes(E, W[0], n_rows);
    for (int i = 0; i < n; i++) {
        kp = kp && s_kperm_takes(E, W[i], n_rows);
        if (i > 0 && s_ximage_takes(E, W[i], n_rows) != nx) nx = 0;
    }
    return kp ? 1 : nx;
}

/* s_xlayout for the norm before the Q/K/V products */
static int s_kperm_qkv(const cu_engine *E, const cu_layer *L, int n_rows) {
    switch (L->qkv) {
    case CU_QKV_JOINED: {
        const cu_mat *W[] = {&L->wqkv};
        return s_xlayout(E, W, 1, n_rows);
    }
    case CU_QKV_QK_V: {
        const cu_mat *W[] = {&L->wqk, &L->wv};
        return s_xlayout(E, W, 2, n_rows);
    }
    default: {
        const cu_mat *W[] = {&L->wq, &L->wk, &L->wv};
        return s_xlayout(E, W, 3, n_rows);
    }
    }
}

/* the same for the norm before the gate/up products */
static int s_kperm_ffn(const cu_engine *E, const cu_layer *L, int n_rows) {
    if (L->ffn == CU_FFN_GLU8 || L->ffn == CU_FFN_JOINED) {
        const cu_mat *W[] = {&L->wgu};
        return s_xlayout(E, W, 1, n_rows);
    }
    const cu_mat *W[] = {&L->wg, &L->wu};
    return s_xlayout(E, W, 2, n_rows);
}

/* xw W^T left as qtc's split partials in E->qtc_ws (part_only), for the kernel after the product to sum in qtc's
 * merge order (ops_rmsnorm_merge, ops_qkv_rope_append: the same bits): their count, launched, where W's product
 * has them (qtc_partials); 0 where not, nothing launched; -1 with err set on a launch error. It saves the merge
 * launch, whose end every CTA of that kernel would wait for. */
static int s_partials(cu_engine *E, const cu_mat *W, int n_rows, const void *xw, int kperm, char *err, size_t errlen) {
    if (W->path != CU_PATH_QTC) return 0;
    qtc_params p = s_qtc_params(E, W, n_rows, xw, E->x, 0, 1);
    p.x_perm = kperm == 1;
    p.x_image = kperm > 1;
    p.x_rows = E->x_rows;
    const int ks = qtc_partials(&p);
    if (!ks) return 0;
    p.part_only = 1;
    const cudaError_t e = qtc_launch(&p, E->st);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "qtc (%s, %d x %d, m %d, partials): %s", ggml_type_name(W->qt), W->n_out, W->n_in, n_rows,
                 cudaGetErrorString(e));
        return -1;
    }
    return ks;
}

/* the Q/K/V products of xb (kperm: its layout, s_kperm_qkv) into the column slices of E->qkv, in the layer's form;
 * *pq: where one joined product feeds the RoPE kernel directly (no per-head norms), the count of the split partials
 * it left for that kernel instead (s_partials), else 0 */
static int s_qkv(cu_engine *E, const cu_layer *L, int n_rows, int kperm, int *pq, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, ld = qd + 2 * kvd;
    float *q = E->qkv, *k = E->qkv + qd, *v = E->qkv + qd + kvd;
    *pq = 0;
    switch (L->qkv) {
    case CU_QKV_JOINED:
        if (!L->q_norm) {
            *pq = s_partials(E, &L->wqkv, n_rows, E->xb, kperm, err, errlen);
            if (*pq) return *pq < 0 ? -1 : 0;
        }
        return s_matmul_k(E, &L->wqkv, n_rows, E->xb, kperm, q, ld, 0, err, errlen);
    case CU_QKV_QK_V: {   /* q and k columns are adjacent in E->qkv: one product, then v (or both in one launch) */
        const int pr =
            L->qkv_pair && !kperm ? s_matmul_pair(E, &L->wqk, &L->wv, n_rows, E->xb, q, v, ld, err, errlen) : 0;
        if (pr != 0) return pr < 0 ? -1 : 0;
        FWD_CHECK(s_matmul_k(E, &L->wqk, n_rows, E->xb, kperm, q, ld, 0, err, errlen));
        return s_matmul_k(E, &L->wv, n_rows, E->xb, kperm, v, ld, 0, err, errlen);
    }
    default:
        FWD_CHECK(s_matmul_k(E, &L->wq, n_rows, E->xb, kperm, q, ld, 0, err, errlen));
        FWD_CHECK(s_matmul_k(E, &L->wk, n_rows, E->xb, kperm, k, ld, 0, err, errlen));
        return s_matmul_k(E, &L->wv, n_rows, E->xb, kperm, v, ld, 0, err, errlen);
    }
}

/* qwen3, gemma3: per-head RMSNorm of q and k in place in E->qkv, before RoPE (no biases: neither architecture has
 * them) */
static int s_qk_norm(cu_engine *E, const cu_layer *L, int n_rows, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    const int qd = c->n_heads * c->head_dim, ld = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    FWD_CHECK(ops_head_rmsnorm(E->qkv, ld, n_rows, c->n_heads, c->head_dim, L->q_norm, c->rms_eps, E->st, err, errlen));
    return ops_head_rmsnorm(E->qkv + qd, ld, n_rows, c->n_kv_heads, c->head_dim, L->k_norm, c->rms_eps, E->st, err,
                            errlen);
}

/* biases, RoPE of q and k, q into E->q, k and v into the layer's caches: one kernel. The append precedes
 * attention on the same stream: every row then attends to itself through the cache */
static int s_rope_append(cu_engine *E, const cu_layer *L, int l, int n_rows, int pq, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    ops_qkv_args a;
    memset(&a, 0, sizeof a);
    a.qkv = E->qkv; a.ld = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim; a.bq = L->bq; a.bk = L->bk; a.bv = L->bv;
    if (pq) { /* the joined product's split partials (s_qkv) */
        a.part = (const float *)E->qtc_ws;
        a.ks = pq;
    }
    a.pos = IN_PTR(E, pos, int32_t); a.slot = IN_PTR(E, slot, int32_t);
    a.n_rows = n_rows; a.n_heads = c->n_heads; a.n_kv_heads = c->n_kv_heads; a.head_dim = c->head_dim;
    a.rope_dim = c->rope_dim;
    a.style = (int)c->rope_style;
    a.q = E->q;
    a.cs = E->rope_cs_swa && model_layer_window(c, l) ? E->rope_cs_swa : E->rope_cs;
    a.n_ctx = E->base.n_ctx; a.kc = L->kc; a.vc = L->vc; a.kvdt = E->wt;
    a.pos_pre = cu_settings_get()->inputs_early;
    if (E->paged) { /* rows name their KV through the step's block tables (cu_inputs.tab) */
        a.slot = IN_PTR(E, pslot, int32_t);
        a.blocks = IN_PTR(E, tab, int32_t);
        a.kv_block_log2 = E->kv_lg;
    }
    return ops_qkv_rope_append(&a, E->st, err, errlen);
}

/* the softmax scale the attention kernels take: 0 (their own 1/sqrt(head_dim), whose f32 rounding the engine has
 * always used) unless the model sets another one (gemma3 27B) */
static float s_attn_scale(const zl_config *c) {
    return c->attn_scale == (float)(1.0 / sqrt((double)c->head_dim)) ? 0.f : c->attn_scale;
}

/* attention of the step's rows into att_w (wt, the output projection's input): the decode kernels over the decode
 * rows, the prefill kernel over the prefill runs, then the cast, unless the decode kernel wrote att_w itself */
static int s_attention(cu_engine *E, const cu_layer *L, const cu_batch *b, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    cudaStream_t st = E->st;
    int att_w_done = 0;   /* the decode attention wrote att_w itself: no cast kernel */
    const int window = L->window; /* chosen at load: 0 where the window covers the whole context */
    if (window > 0) { /* a sliding layer: every row, decode or prefill, through the window kernel */
        attn_window_params p;
        memset(&p, 0, sizeof p);
        p.q = E->q;
        p.k_cache = L->kc;
        p.v_cache = L->vc;
        p.kv_type = cu_kv_type(E->wt);
        p.pos = IN_PTR(E, pos, int32_t);
        p.slot = IN_PTR(E, slot, int32_t);
        p.out = E->att;
        p.n_rows = b->n_rows;
        p.n_heads = c->n_heads;
        p.n_kv_heads = c->n_kv_heads;
        p.head_dim = c->head_dim;
        p.n_ctx = E->base.n_ctx;
        p.window = window;
        p.scale = s_attn_scale(c);
        if (E->paged) {
            p.slot = IN_PTR(E, pslot, int32_t);
            p.blocks = IN_PTR(E, tab, int32_t);
            p.kv_block_log2 = E->kv_lg;
        }
        FWD_CUDA(attn_window_launch(&p, st));
    }
    if (window == 0 && b->n_dec > 0) {
        attn_decode_params p;
        memset(&p, 0, sizeof p);
        p.q = E->q; p.k_cache = L->kc; p.v_cache = L->vc; p.kv_type = cu_kv_type(E->wt);
        p.slot = IN_PTR(E, slot, int32_t); p.kv_len = IN_PTR(E, kv_len, int32_t); p.out = E->att;
        p.workspace = E->attn_ws; p.workspace_bytes = E->attn_ws_bytes;
        p.n_seq = b->n_dec; p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads; p.head_dim = c->head_dim;
        p.n_ctx = E->base.n_ctx;
        p.scale = s_attn_scale(c);
        /* always the longest context and the start-up split count: a graph serves every length, and a row's split
         * boundaries never depend on the batch (batch invariance) */
        p.max_kv_len = E->base.n_ctx; p.sm_count = E->sm_count; p.n_splits = E->n_splits;
        p.kv_pre = cu_settings_get()->inputs_early;
        /* positions below kv_len - 1 come from earlier steps: every kernel of a step starts after the step before
         * has completed (a graph launch, a copy or an event wait on the stream carries no programmatic edge), also
         * with steps queued ahead */
        p.kv_early = p.kv_pre;
        if (E->paged) { /* decode rows are the step's first rows: pslot[i] is decode row i's table */
            p.slot = IN_PTR(E, pslot, int32_t);
            p.blocks = IN_PTR(E, tab, int32_t);
            p.kv_block_log2 = E->kv_lg;
        }
        /* a decode-only step of a 16-bit engine: the tensor-core kernel writes att_w directly, with the cast
         * kernel's rounding (one launch per layer fewer) */
        if (b->n_pre == 0 && E->wt != CU_F32 && attn_decode_tc_wants(&p)) {
            p.out_w = E->att_w;
            att_w_done = 1;
        }
        FWD_CUDA(attn_decode_launch(&p, st));
    }
    if (window == 0 && b->n_pre > 0) {
        attn_prefill_params p;
        memset(&p, 0, sizeof p);
        p.q = E->q; p.k_cache = L->kc; p.v_cache = L->vc; p.kv_type = cu_kv_type(E->wt);
        p.seq_row0 = IN_PTR(E, seq_row0, int32_t); p.seq_rows = IN_PTR(E, seq_rows, int32_t);
        p.seq_slot = IN_PTR(E, seq_slot, int32_t); p.seq_pos0 = IN_PTR(E, seq_pos0, int32_t);
        p.out = E->att; p.n_seq = b->n_pre; p.max_rows = b->max_rows;
        p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads; p.head_dim = c->head_dim; p.n_ctx = E->base.n_ctx;
        p.scale = s_attn_scale(c);
        if (E->paged) {
            p.seq_slot = IN_PTR(E, pseq, int32_t);
            p.blocks = IN_PTR(E, tab, int32_t);
            p.kv_block_log2 = E->kv_lg;
        }
        FWD_CUDA(attn_prefill_launch(&p, st));
    }
    if (E->wt == CU_F32 || att_w_done) return 0;   /* F32: att_w is att */
    return ops_cast_dual(E->att, (size_t)b->n_rows * c->n_heads * c->head_dim, E->att_w, E->wt, NULL, 1, st, err,
                         errlen);
}

/* the gate/up products of xb (kperm: its layout, s_kperm_ffn) and the SwiGLU, in the layer's form; *xd = the down
 * product's input (xb, or E->gu's memory after a SwiGLU epilogue), *xdl its layout (s_matmul_k's kperm: xb as qtc's
 * wgmma images where the down product takes them) */
static int s_ffn_up(cu_engine *E, const cu_layer *L, int n_rows, int kperm, const void **xd, int *xdl, char *err,
                    size_t errlen) {
    const int ff = E->base.model->cfg.ffn_dim;
    *xd = E->xb;
    *xdl = 0;
    switch (L->ffn) {
    case CU_FFN_GLU8: {   /* the product's SwiGLU epilogue (into E->gu's memory: the product still reads xb) */
        const int g = s_glu(E, &L->wgu, n_rows, E->xb, kperm, E->gu, ff, err, errlen);
        if (g < 0) return -1;
        if (g) { *xd = E->gu; return 0; }
        FWD_CHECK(s_matmul_k(E, &L->wgu, n_rows, E->xb, kperm, E->gu, 2 * ff, 0, err, errlen));
        const int nx = ff % 256 == 0 ? s_ximage_takes(E, &L->wd, n_rows) : 0;
        if (nx) {
            *xdl = nx;
            return ops_swiglu_il8_ximage(E->gu, 2 * ff, n_rows, ff, E->xb, nx, E->st, err, errlen);
        }
        return ops_swiglu_il8_dual(E->gu, 2 * ff, n_rows, ff, E->xb, E->wt, NULL, 1, E->st, err, errlen);
    }
    case CU_FFN_JOINED: FWD_CHECK(s_matmul_k(E, &L->wgu, n_rows, E->xb, kperm, E->gu, 2 * ff, 0, err, errlen)); break;
    default:
        FWD_CHECK(s_matmul_k(E, &L->wg, n_rows, E->xb, kperm, E->gu, 2 * ff, 0, err, errlen));
        FWD_CHECK(s_matmul_k(E, &L->wu, n_rows, E->xb, kperm, E->gu + ff, 2 * ff, 0, err, errlen));
    }
    if (E->base.model->cfg.ffn_act == ZL_ACT_GELU_TANH) /* GeGLU (gemma3: never a glu8 join) */
        return ops_geglu(E->gu, E->gu + ff, 2 * ff, n_rows, ff, E->xb, E->wt, E->st, err, errlen);
    return ops_swiglu_dual(E->gu, E->gu + ff, 2 * ff, n_rows, ff, E->xb, E->wt, NULL, 1, E->st, err, errlen);
}

/* x += xw W^T, or with a post norm (gemma3) x += norm(xw W^T) * post: the product then goes to E->qkv's memory
 * (free after the attention prologue and the GLU: cu_engine.gu) and one kernel norms and adds it; kperm: xw's
 * layout (s_matmul_k). pk: NULL, or where a norm follows (without a post norm), the product may leave its split
 * partials to it (s_partials): *pk their count, 0 if it did not */
static int s_out_proj(cu_engine *E, const cu_mat *W, const float *post, int n_rows, const void *xw, int kperm, int *pk,
                      char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    if (pk) *pk = 0;
    if (!post && pk && ops_rmsnorm_merge_serves(c->dim, E->wt)) {
        *pk = s_partials(E, W, n_rows, xw, kperm, err, errlen);
        if (*pk < 0) return -1;
        if (*pk) return 0;
    }
    if (!post) return s_matmul_k(E, W, n_rows, xw, kperm, E->x, 0, 1, err, errlen);
    FWD_CHECK(s_matmul_k(E, W, n_rows, xw, kperm, E->qkv, c->dim, 0, err, errlen));
    return ops_rmsnorm_add(E->x, E->qkv, c->dim, post, c->dim, c->rms_eps, n_rows, E->st, err, errlen);
}

/* the sampler over the LM head's logits: one id per sampling row, generator states advanced; with two input
 * blocks straight into the flight's mapped results (no copy after) */
static int s_sample(cu_engine *E, int n_samp, int extras, int masks, char *err, size_t errlen) {
    const int V = E->base.model->cfg.vocab_size;
    /* structured output first, so that penalties, sampling and logprobs all see it: rows flagged in mask_on get
     * their masked ids' logits at -inf (in place); rows with late masks wait until the host has written them into
     * the flight's mapped buffer (the flight of input block cur_p: a graph of block p waits on flight p's flag, for
     * the value the step's input copy brings in lwant) */
    if (masks)
        FWD_CUDA(
            sample_mask_launch(E->logits, V, n_samp, V, IN_PTR(E, mask_on, int32_t), IN_PTR(E, mask, uint32_t), E->st));
    if (E->step_late) {
        FWD_CUDA(sample_mask_wait_launch(E->fl[E->cur_p].d_lflag, IN_PTR(E, lwant, uint32_t), E->st));
        FWD_CUDA(sample_mask_late_launch(E->logits, V, n_samp, V, IN_PTR(E, mask_late_on, int32_t),
                                         E->fl[E->cur_p].d_lmask, E->st));
    }
    if (extras) { /* logit bias and presence/frequency penalties: every row into the sampler's workspace */
        penalty_params pp;
        memset(&pp, 0, sizeof pp);
        pp.logits = E->logits;
        pp.out = (float *)E->samp_ws;
        pp.n_rows = n_samp;
        pp.vocab = V;
        pp.params = IN_PTR(E, params, zl_sampling);
        pp.bias_n = IN_PTR(E, bias_n, int32_t);
        pp.bias_id = IN_PTR(E, bias_id, int32_t);
        pp.bias = IN_PTR(E, bias_v, float);
        pp.bias_stride = ZL_MAX_LOGIT_BIAS;
        pp.gen_n = IN_PTR(E, gen_n, int32_t);
        pp.gen_id = IN_PTR(E, gen_id, int32_t);
        pp.gen_cnt = IN_PTR(E, gen_cnt, int32_t);
        pp.gen_stride = CU_GEN;
        FWD_CUDA(penalty_launch(&pp, E->st));
    }
    sample_params sp;
    memset(&sp, 0, sizeof sp);
    /* with extras the sampler reads the penalized rows in its own workspace (its repetition penalty then rewrites
     * a row in place: the same values as from a copy) */
    sp.logits = extras ? (const float *)E->samp_ws : E->logits;
    sp.n_rows = n_samp;
    sp.vocab = V;
    sp.params = IN_PTR(E, params, zl_sampling); sp.row_state = NULL;
    sp.history = IN_PTR(E, hist, int32_t); sp.history_stride = CU_HIST; sp.history_len = IN_PTR(E, hist_len, int32_t);
    sp.rng_state = IN_PTR(E, rng, uint64_t); sp.out = IN_PTR(E, out_tok, int32_t);
    if (E->n_inb == 2) {
        sp.out = (int32_t *)(E->fl[E->cur_p].d_out + (E->in.out_tok - E->in.rng));
        sp.rng_out = (uint64_t *)E->fl[E->cur_p].d_out;
    }
    sp.workspace = E->samp_ws; sp.workspace_bytes = E->samp_ws_bytes;
    sp.carry_tok = E->carry_tok; sp.carry_rng = E->carry_rng; sp.carry_idx = IN_PTR(E, eslot, int32_t);
    FWD_CUDA(sample_launch(&sp, E->st));
    if (extras && E->fl[E->cur_p].d_lp) { /* the logprobs of the rows as the sampler left them */
        logprobs_params lp;
        memset(&lp, 0, sizeof lp);
        lp.logits = (const float *)E->samp_ws;
        lp.n_rows = n_samp;
        lp.vocab = V;
        lp.params = IN_PTR(E, params, zl_sampling);
        lp.sampled = sp.out;
        lp.out = E->fl[E->cur_p].d_lp;
        FWD_CUDA(logprobs_launch(&lp, E->st));
    }
    return 0;
}

/* ------------------------------------------------------------------ the forward pass */

int cuda_forward(cu_engine *E, const cu_batch *b, char *err, size_t errlen) {
    const zl_config *c = &E->base.model->cfg;
    const int n = b->n_rows;
    FWD_CHECK(s_embed(E, n, err, errlen));
    int pk = 0; /* split partials of the output product before that the next norm sums into x (s_partials) */
    for (int l = E->base.layer_begin; l < E->base.layer_end; l++) {
        const cu_layer *L = &E->L[l];
        const void *xd = NULL;
        int kd = 0;                                                            /* the down product's x layout */
        int pq = 0; /* split partials of the Q/K/V product that the RoPE kernel sums (s_qkv) */
        const int kq = s_kperm_qkv(E, L, n), kf = s_kperm_ffn(E, L, n);        /* xb's layouts (s_xlayout) */
        FWD_CHECK(s_rmsnorm(E, L->attn_norm, n, kq, pk, err, errlen));         /* xb = norm(x (+ partials)) */
        FWD_CHECK(s_qkv(E, L, n, kq, &pq, err, errlen));                       /* qkv = xb [Wq Wk Wv] */
        if (L->q_norm) FWD_CHECK(s_qk_norm(E, L, n, err, errlen));             /* qwen3, gemma3: per-head norms */
        FWD_CHECK(s_rope_append(E, L, l, n, pq, err, errlen));                 /* q, caches += k, v */
        FWD_CHECK(s_attention(E, L, b, err, errlen));                          /* att_w = attention(q) */
        FWD_CHECK(s_out_proj(E, &L->wo, L->post_attn_norm, n, E->att_w, 0, &pk, err, errlen)); /* x += att_w Wo */
        FWD_CHECK(s_rmsnorm(E, L->ffn_norm, n, kf, pk, err, errlen));                  /* xb = norm(x (+ partials)) */
        FWD_CHECK(s_ffn_up(E, L, n, kf, &xd, &kd, err, errlen));                       /* xd = silu(xb Wg) * xb Wu */
        /* x += xd Wd: its partials to the next layer's norm where this stage runs it */
        FWD_CHECK(
            s_out_proj(E, &L->wd, L->post_ffn_norm, n, xd, kd, l + 1 < E->base.layer_end ? &pk : NULL, err, errlen));
    }
    if (E->base.layer_end < c->n_layers) {   /* a stage before the last: hand the residual stream on */
        s_k_stage_out<<<n, 256, 0, E->st>>>(E->x, IN_PTR(E, hptr, const unsigned long long),
                                            IN_PTR(E, perm, const int32_t), c->dim);
        FWD_CUDA(cudaGetLastError());
        return 0;
    }
    /* prompt logprobs (eager steps only): the final norm, the LM head and the log-softmax of those rows, max_batch
     * rows at a time through the sampling rows' buffers (xb, logits), before the sampling rows use them */
    for (int g = 0; g < b->n_plp; g += E->base.max_batch) {
        const int nr = b->n_plp - g < E->base.max_batch ? b->n_plp - g : E->base.max_batch;
        FWD_CHECK(ops_rmsnorm_dual(E->x, IN_PTR(E, plp_row, int32_t) + g, E->out_norm, c->dim, c->rms_eps, nr, E->xb,
                                   E->wt, NULL, 1, E->st, err, errlen));
        FWD_CHECK(s_matmul(E, &E->out, nr, E->xb, E->logits, 0, 0, err, errlen));
        logprobs_params lp;
        memset(&lp, 0, sizeof lp);
        lp.logits = E->logits;
        lp.n_rows = nr;
        lp.vocab = c->vocab_size;
        lp.top_k = IN_PTR(E, plp_k, int32_t) + g;
        lp.sampled = IN_PTR(E, plp_next, int32_t) + g;
        lp.out = E->cur_fl->d_plp + g;
        FWD_CUDA(logprobs_launch(&lp, E->st));
    }
    /* the final norm of each sampling entry's last row only, then the LM head for those rows, then the sampler;
     * nothing when every entry is a prompt chunk that does not sample */
    if (b->n_samp == 0) return 0;
    FWD_CHECK(ops_rmsnorm_dual(E->x, IN_PTR(E, last_row, int32_t), E->out_norm, c->dim, c->rms_eps, b->n_samp, E->xb,
                               E->wt, NULL, 1, E->st, err, errlen));
    FWD_CHECK(s_matmul(E, &E->out, b->n_samp, E->xb, E->logits, 0, 0, err, errlen));
    return s_sample(E, b->n_samp, b->extras, b->masks, err, errlen);
}
