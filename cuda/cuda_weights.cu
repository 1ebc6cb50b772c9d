/* cuda/cuda_weights.cu: the CUDA engine's weights on the device (cu_engine.h).
 *
 * Types: matrices live on the GPU in one compute type `wt`: F32 when every matrix of the file is F32, otherwise
 * BF16 when any matrix is BF16, otherwise F16 (F16 files, and quantized ones). Norm weights and biases are f32.
 * Paths: each matrix's products take one kernel family for every step size, chosen here once (cu_path):
 *   - CU_PATH_QTC: quantized matrices of a type qtc serves (Q4_K, Q6_K, Q8_0 rows of a multiple of 256 elements)
 *     in an F16 engine keep only a tile-packed copy of their GGUF blocks (qtc_pack) and go through cuda/qtc.h:
 *     tensor cores, one fixed arithmetic per element whatever the step size (batch invariant by construction);
 *     ZLLM_CUDA_QTC=0 turns it off;
 *   - otherwise a dense wt copy (converted, or dequantized on the host with quant_dequant_row): CU_PATH_WTC when
 *     the engine is 16-bit and wtc serves the shape (cuda/wtc.h, batch invariant at every width), else
 *     CU_PATH_CUBLAS (F32 engines, other shapes, ZLLM_CUDA_WTC=0: cuBLAS may pick another algorithm for another
 *     batch size and is not batch invariant on 2048-wide 16-bit models).
 * Joins (fewer launches per layer, the same arithmetic per element; ZLLM_CUDA_FUSE=0 keeps them apart):
 *   - qtc matrices of one type are packed as one matrix at load: Q/K/V (wqkv), or Q/K when V has another type
 *     (wqk; Q4_K_M's Q6_K V layers, whose small steps then run both in one pair launch), and gate/up (wgu) with
 *     their rows interleaved in blocks of 8 (ZLLM_CUDA_QTC_GLU) so that qtc's narrow kernel applies the SwiGLU in
 *     its epilogue;
 *   - dense matrices are joined on the device after their upload: Q/K/V into wqkv, gate/up into wgu (interleaved
 *     by 8 when wtc serves the join: wtc's SwiGLU epilogue).
 * Each layer records what came out (cu_layer.qkv, .ffn, .qkv_pair), so that the forward pass only follows it. */
extern "C" {
#include "quant.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cu_engine.h"
#include "cu_settings.h"
#include "cuda_common.h"
#include "qtc.h"
#include "wtc.h"

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

/* 1 when matrix w is served by qtc (cuda/qtc.h): on by default (ZLLM_CUDA_QTC=0 turns it off), the engine's
 * 16-bit type is F16 (qtc takes f16 activations) and qtc covers the type and shape. A device with less shared
 * memory per block than the type's kernels need (qtc_smem_bytes) keeps the dense copy. */
static int s_qtc_ok(const cu_engine *E, const zl_weight *w) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, E->dev) != cudaSuccess) optin = 0;
    return cu_settings_get()->qtc && E->wt == CU_F16 && qtc_supported(w->type, (int)w->n_in, (int)w->n_out) &&
           w->row_bytes == ggml_row_bytes(w->type, w->n_in) && qtc_smem_bytes(w->type) <= (size_t)optin;
}

/* the path of a dense [n_out][n_in] wt matrix: wtc where it serves the shape (every step size alike: the choice
 * depends on the matrix only, never on the row count), else cuBLAS */
static cu_path s_dense_path(const cu_engine *E, int n_in, int n_out) {
    return E->wtc_on && wtc_supported(n_in, n_out) ? CU_PATH_WTC : CU_PATH_CUBLAS;
}

/* uploads matrix w into M: qtc's packed tiles (CU_PATH_QTC) or a dense wt array (converted, or dequantized on the
 * host, when the file's type differs) */
static int s_upload_mat(cu_engine *E, cu_stage *sg, const zl_weight *w, cu_mat *M, char *err, size_t errlen) {
    memset(M, 0, sizeof *M);
    M->n_in = (int)w->n_in;
    M->n_out = (int)w->n_out;
    if (s_qtc_ok(E, w)) {   /* qtc at every step: the packed tiles only (the file's bytes), no dense copy */
        const size_t pb = qtc_packed_bytes(w->type, M->n_in, M->n_out);
        void *h = malloc(pb), *d = NULL;
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
        M->w = d; M->owns = 1; M->qt = w->type; M->path = CU_PATH_QTC;
        E->weight_bytes += pb;
        return 0;
    }
    if (s_upload(E, sg, w, E->wt, &M->w, err, errlen) != 0) return -1;
    M->owns = 1;
    M->path = s_dense_path(E, M->n_in, M->n_out);
    return 0;
}

static void s_free_mat(cu_mat *M) {
    if (M->owns) cudaFree(M->w);
    memset(M, 0, sizeof *M);
}

/* Joins n dense matrices of the same n_in (parts uploaded by s_upload_mat, none qtc) into F: one dense
 * [sum n_out][n_in] array holding their rows in order (one product instead of n, each column block the product
 * the part would give, up to cuBLAS's choice of algorithm for the wider shape), or with il8 (two parts of equal
 * n_out, a multiple of 8: gate and up) their rows interleaved in blocks of 8 (F->glu8); the parts are then freed
 * and emptied, so the device holds the weights once. Returns 1 when joined, 0 when not (a part is served
 * otherwise, or the new array does not fit next to the parts: they stay as they are), -1 with err set on a CUDA
 * error. */
static int s_join_dense(cu_engine *E, cu_mat *const *parts, int n, int il8, cu_mat *F, char *err, size_t errlen) {
    const size_t es = ops_dtype_size(E->wt);
    int rows = 0;
    for (int i = 0; i < n; i++) {
        const cu_mat *P = parts[i];
        if (P->path == CU_PATH_QTC || !P->owns || P->n_out <= 0 || P->n_in != parts[0]->n_in) return 0;
        rows += P->n_out;
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
            CU_CHECK(cudaMemcpy2DAsync((uint8_t *)d + (size_t)i * 8 * row_bytes, 16 * row_bytes, parts[i]->w,
                                       8 * row_bytes, 8 * row_bytes, (size_t)parts[i]->n_out / 8,
                                       cudaMemcpyDeviceToDevice, E->st));
        else
            CU_CHECK(cudaMemcpyAsync((uint8_t *)d + off, parts[i]->w, nb, cudaMemcpyDeviceToDevice, E->st));
        off += nb;
    }
    CU_CHECK(cudaStreamSynchronize(E->st));   /* the copies read the parts: done before they are freed */
    for (int i = 0; i < n; i++) s_free_mat(parts[i]);
    memset(F, 0, sizeof *F);
    F->n_in = n_in;
    F->n_out = rows;
    F->w = d;
    F->owns = 1;   /* E->weight_bytes unchanged: the same bytes, moved */
    F->glu8 = il8;
    F->path = s_dense_path(E, n_in, rows);
    return 1;
fail:
    cudaFree(d);
    return -1;
}

/* Packs n (2 or 3) matrices of one type and row length that qtc serves as ONE qtc matrix F: their GGUF rows in
 * order (parts[0] first), so one product fills the adjacent column slices the separate products would fill; each
 * output element is the same fixed qtc sequence over the same row, so this changes launches, not arithmetic,
 * except through qtc_split (a function of the joined shape). il8 (two parts of equal rows, a multiple of 8: gate
 * and up) interleaves their rows in blocks of 8 instead (F->glu8, qtc's SwiGLU epilogue). Returns 1 when packed, 0
 * when the parts do not qualify (F untouched), -1 with err set on a failure. */
static int s_join_qtc(cu_engine *E, cu_stage *sg, const zl_weight *const *parts, int n, int il8, const char *name,
                      cu_mat *F, char *err, size_t errlen) {
    if (!cu_settings_get()->fuse) return 0;
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

/* uploads layer l's matrices, joined where they can be, and records the layer's Q/K/V and gate/up forms */
static int s_upload_layer(cu_engine *E, cu_stage *sg, int l, char *err, size_t errlen) {
    const zl_layer_weights *w = &E->base.model->layers[l];
    const cu_settings *cs = cu_settings_get();
    cu_layer *d = &E->L[l];
    if (s_upload(E, sg, &w->attn_norm, CU_F32, (void **)&d->attn_norm, err, errlen) != 0 ||
        s_upload(E, sg, &w->ffn_norm, CU_F32, (void **)&d->ffn_norm, err, errlen) != 0 ||
        s_upload_mat(E, sg, &w->wo, &d->wo, err, errlen) != 0 ||
        s_upload_mat(E, sg, &w->w_down, &d->wd, err, errlen) != 0)
        return -1;
    /* Q/K/V of one qtc type: one packed qtc matrix (wqkv); else wq and wk of one type: wqk, wv apart; gate and up
     * of one qtc type: one packed matrix (wgu). Otherwise apart (and maybe joined as dense matrices below) */
    const zl_weight *qkv[] = {&w->wq, &w->wk, &w->wv}, *gu[] = {&w->w_gate, &w->w_up};
    int jq = s_join_qtc(E, sg, qkv, 3, 0, "attn_q+k+v", &d->wqkv, err, errlen);
    if (jq == 0) {
        jq = s_join_qtc(E, sg, qkv, 2, 0, "attn_q+k", &d->wqk, err, errlen);
        if (jq == 1 && s_upload_mat(E, sg, &w->wv, &d->wv, err, errlen) != 0) return -1;
    }
    if (jq < 0) return -1;
    if (jq == 0 && (s_upload_mat(E, sg, &w->wq, &d->wq, err, errlen) != 0 ||
                    s_upload_mat(E, sg, &w->wk, &d->wk, err, errlen) != 0 ||
                    s_upload_mat(E, sg, &w->wv, &d->wv, err, errlen) != 0))
        return -1;
    /* the fused gate/up epilogues compute SwiGLU: a GeGLU layer (gemma3) keeps gate and up in order */
    const int silu = E->base.model->cfg.ffn_act == ZL_ACT_SILU;
    const int jg = s_join_qtc(E, sg, gu, 2, cs->qtc_glu && silu, "ffn_gate+ffn_up", &d->wgu, err, errlen);
    if (jg < 0) return -1;
    if (jg == 0 && (s_upload_mat(E, sg, &w->w_gate, &d->wg, err, errlen) != 0 ||
                    s_upload_mat(E, sg, &w->w_up, &d->wu, err, errlen) != 0))
        return -1;
    if (cs->fuse) {   /* dense Q/K/V and gate/up as one product each */
        cu_mat *dq[] = {&d->wq, &d->wk, &d->wv}, *dg[] = {&d->wg, &d->wu};
        /* gate/up through wtc: interleaved, for its SwiGLU epilogue (the product's arithmetic per element is the
         * same: wtc's splits follow the joined shape only) */
        const int il8 = silu && E->wtc_on && wtc_supported(d->wg.n_in, d->wg.n_out + d->wu.n_out);
        if (s_join_dense(E, dq, 3, 0, &d->wqkv, err, errlen) < 0 || s_join_dense(E, dg, 2, il8, &d->wgu, err, errlen) < 0)
            return -1;
    }
    if (w->bq.data && s_upload(E, sg, &w->bq, CU_F32, (void **)&d->bq, err, errlen) != 0) return -1;
    if (w->bk.data && s_upload(E, sg, &w->bk, CU_F32, (void **)&d->bk, err, errlen) != 0) return -1;
    if (w->bv.data && s_upload(E, sg, &w->bv, CU_F32, (void **)&d->bv, err, errlen) != 0) return -1;
    if (w->attn_q_norm.data && (s_upload(E, sg, &w->attn_q_norm, CU_F32, (void **)&d->q_norm, err, errlen) != 0 ||
                                s_upload(E, sg, &w->attn_k_norm, CU_F32, (void **)&d->k_norm, err, errlen) != 0))
        return -1;
    if (w->post_attn_norm.data &&
        (s_upload(E, sg, &w->post_attn_norm, CU_F32, (void **)&d->post_attn_norm, err, errlen) != 0 ||
         s_upload(E, sg, &w->post_ffn_norm, CU_F32, (void **)&d->post_ffn_norm, err, errlen) != 0))
        return -1;
    d->qkv = d->wqkv.n_out ? CU_QKV_JOINED : d->wqk.n_out ? CU_QKV_QK_V : CU_QKV_SEPARATE;
    d->qkv_pair = d->qkv == CU_QKV_QK_V && cs->qtc_pair && d->wqk.path == CU_PATH_QTC && d->wv.path == CU_PATH_QTC;
    d->ffn = !d->wgu.n_out ? CU_FFN_SEPARATE : d->wgu.glu8 ? CU_FFN_GLU8 : CU_FFN_JOINED;
    return 0;
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

cu_dtype cuda_weights_type(const zl_model *m) {
    return s_is_matrix_type_f32(m) ? CU_F32 : s_has_bf16(m) ? CU_BF16 : CU_F16;
}

/* the layer's matrices, joined or not (empty ones have n_out 0) */
#define CU_LAYER_MATS(L) {&(L)->wqkv, &(L)->wqk, &(L)->wq, &(L)->wk, &(L)->wv, &(L)->wo, &(L)->wgu, &(L)->wg, &(L)->wu, \
                          &(L)->wd}

int cuda_weights_upload(cu_engine *E, char *err, size_t errlen) {
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
    } else if (s_qtc_ok(E, &m->tok_embd)) {
        /* a tied quantized table that qtc serves: its packed tiles for the LM head (the embedding gather keeps
         * reading the dense tok_embd) */
        if (s_upload_mat(E, &sg, &m->tok_embd, &E->out, err, errlen) != 0) goto fail;
    } else {
        /* tied: the LM head reads the (not owned) dense table */
        E->out.n_in = c->dim; E->out.n_out = c->vocab_size; E->out.w = E->tok_embd;
        E->out.path = s_dense_path(E, c->dim, c->vocab_size);
    }
    if (last && s_upload(E, &sg, &m->output_norm, CU_F32, (void **)&E->out_norm, err, errlen) != 0) goto fail;
    for (int l = lb; l < le; l++) {
        if (s_upload_layer(E, &sg, l, err, errlen) != 0) goto fail;
        /* progress line, one update per tenth of the layers (the file may be tens of GB) */
        if (c->n_layers >= 10 && (l + 1) % (c->n_layers / 10) == 0)
            fprintf(stderr, "\rzllm %s: uploading weights: layer %d/%d, %.0f MiB", E->base.device, l + 1,
                    c->n_layers, E->weight_bytes / 1048576.0);
    }
    {
        int n_path[4] = {0, 0, 0, 0}, n_joined = 0;
        if (last) n_path[E->out.path]++;
        for (int l = lb; l < le; l++) {
            const cu_layer *L = &E->L[l];
            n_joined += (L->wqkv.n_out > 0) + (L->wqk.n_out > 0) + (L->wgu.n_out > 0);
            const cu_mat *mats[] = CU_LAYER_MATS(L);
            for (int i = 0; i < 10; i++) n_path[mats[i]->path]++;
        }
        E->base.chunk_variant = n_path[CU_PATH_CUBLAS] > 0; /* cuBLAS: another row count, maybe other bits */
        fprintf(stderr, "\rzllm %s: uploaded weights: %d layers, %.1f MiB as %s (matrices: %d qtc, %d wtc, %d cuBLAS; "
                "%d joined Q/K/V or gate/up products)\n", E->base.device, le - lb, E->weight_bytes / 1048576.0,
                ops_dtype_name(E->wt), n_path[CU_PATH_QTC], n_path[CU_PATH_WTC], n_path[CU_PATH_CUBLAS], n_joined);
    }
    rc = 0;
fail:
    cudaFreeHost(sg.h);
    cudaFree(sg.d);
    return rc;
}

/* the qtc/wtc workspace M's products of up to rows rows need */
static size_t s_ws_need(const cu_mat *M, int rows) {
    if (M->path == CU_PATH_QTC) return qtc_workspace_bytes(M->qt, M->n_in, M->n_out);
    if (M->path == CU_PATH_WTC) return wtc_workspace_bytes(M->n_in, M->n_out, rows);
    return 0;
}

size_t cuda_weights_workspace_bytes(const cu_engine *E) {
    const zl_engine *b = &E->base;
    size_t ws = s_ws_need(&E->out, b->max_batch);   /* the LM head: one row per entry */
    for (int l = b->layer_begin; l < b->layer_end; l++) {
        const cu_mat *mats[] = CU_LAYER_MATS(&E->L[l]);
        for (int i = 0; i < 10; i++) {
            const size_t need = s_ws_need(mats[i], b->max_step_tokens);
            if (need > ws) ws = need;
        }
    }
    return ws;
}

void cuda_weights_free(cu_engine *E) {
    if (E->L) {
        for (int l = 0; l < E->base.model->cfg.n_layers; l++) {
            cu_layer *L = &E->L[l];
            cu_mat *mats[] = CU_LAYER_MATS(L);
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) s_free_mat(mats[i]);
            void *p[] = {L->attn_norm, L->ffn_norm,       L->bq,           L->bk, L->bv, L->q_norm,
                         L->k_norm,    L->post_attn_norm, L->post_ffn_norm};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
        }
    }
    s_free_mat(&E->out);
}
