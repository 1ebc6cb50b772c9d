/* cuda/engine_cuda.cu: the CUDA backend of engine/engine.h (one GPU): the engine object's life, its ops table and
 * the launch/wait of engine.h and the entry points of engine_cuda.h. The rest of the engine:
 *   cuda/cu_engine.h      the object (cu_engine), its matrices and input block;
 *   cuda/cuda_weights.cu  weights on the device, each matrix's kernel family (qtc, wtc, cuBLAS) chosen at load;
 *   cuda/cuda_forward.cu  the forward pass of one step, one call per operation of a layer;
 *   cuda/cuda_step.cu     validation, input staging, the flights of launched steps, the decode graphs;
 *   cuda/cu_settings.h    the ZLLM_CUDA_* switches, read once here.
 * docs/cuda.md maps the kernels and how batch invariance is kept: every kernel computes a row from that row's data
 * alone with an arithmetic fixed by the shape, never by the batch; the flash-decoding split count is fixed at
 * start-up from the SM count and n_ctx, and max_kv_len is always n_ctx.
 * Memory: KV caches are wt-typed, per layer [n_slots + 1][n_ctx][n_kv_heads][head_dim]; slot n_slots is the
 * sentinel that padded rows of a graph bucket write into and never read from (kv_len 0). With paged KV
 * (opts->kv_block, whole models only) they are instead one pool per layer [kv_blocks + 1][kv_block][n_kv_heads]
 * [head_dim], block kv_blocks the sentinel, and each step's entries name their rows through block tables staged
 * with the step's inputs (cu_inputs.tab; docs/kv-cache.md). An engine made with
 * opts->layer_begin/layer_end (a pipeline stage) holds only its layers' weights and KV caches, the embedding only
 * when it starts at layer 0 (or is the last stage of a tied model), the final norm, LM head and sampler only when
 * it ends at the last layer. */
extern "C" {
#include "engine.h"
#include "model.h"
#include "rope.h"
#include "sampler.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attention.h"
#include "cu_engine.h"
#include "cu_settings.h"
#include "cuda_common.h"
#include "engine_cuda.h"
#include "ops.h"
#include "qtc.h"
#include "sample.h"
#include "wtc.h"

/* ------------------------------------------------------------------ launch/wait: the ops table
 * Thin dispatch to cuda_step_run and cuda_step_collect (zl_engine_ops). A whole model keeps up to 2 steps in
 * flight (zl_engine.depth 2): a queued step is started by cuda_step_run (launch 1) and its wait collects it. A
 * synchronous step (zl_step.sync) and every step of a pipeline stage run whole at their launch (launch 0, its
 * collect included, device hidden states and events as the stage transport gives them); their wait only checks the
 * order. op_q keeps the steps launched and not waited for, so that a wait names the oldest one. */

/* the flight in flight holding st with late masks not yet announced, or NULL */
static cu_flight *s_late_flight(cu_engine *E, const zl_step *st) {
    for (int j = 0; j < E->fl_count; j++) {
        cu_flight *f = &E->fl[(E->fl_head + j) & 1];
        if (f->seqs == st->seqs && f->n == st->n && f->late && !f->late_ready) return f;
    }
    return NULL;
}

/* writes the late masks of flight f's rows (all ones for a row whose mask is NULL: unmasked) and releases its
 * sampling: the flag store follows the mask stores (a full fence between them) */
static void s_late_release(cu_engine *E, cu_flight *f, int use_masks) {
    const size_t w = (size_t)E->in.mask_words;
    for (int k = 0; k < f->n; k++) {
        const zl_seq *s = &f->seqs[f->order[k]];
        if (!s->mask_late) continue;
        if (use_masks && s->mask) memcpy(f->h_lmask + (size_t)k * w, s->mask, w * 4);
        else memset(f->h_lmask + (size_t)k * w, 0xFF, w * 4);
    }
    __sync_synchronize();
    *f->h_lflag = f->lseq;
    __sync_synchronize();
    f->late_ready = 1;
}

static int s_op_masks_ready(zl_engine *base, const zl_step *st) {
    cu_engine *E = (cu_engine *)base;
    cu_flight *f = st ? s_late_flight(E, st) : NULL;
    if (!f) {
        snprintf(base->err, sizeof base->err, "masks_ready: the step is not in flight with late masks to announce");
        return -1;
    }
    s_late_release(E, f, 1);
    return 0;
}

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
    const cu_step_req run = {st->seqs,       st->n,      st->h_in,        st->h_out,    st->h_dev,
                             st->wait_ev,    st->n_wait, st->record_ev,   st->n_record, st->out_tokens,
                             st->out_logits, 0,          st->out_logprobs};
    const cu_step_req queue = {st->seqs,      st->n,        NULL, NULL,           0, st->wait_ev,     st->n_wait,
                               st->record_ev, st->n_record, NULL, st->out_logits, 1, st->out_logprobs};
    if (cuda_step_run(E, now ? &run : &queue) != 0) return -1;
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
        /* late masks never announced: the rows go unmasked rather than the device waiting forever */
        cu_flight *lf = s_late_flight(E, st);
        if (lf) s_late_release(E, lf, 0);
        if (cuda_step_collect(E, st->out_tokens) != 0) return -1;
    }
    E->op_head ^= 1;
    E->op_count--;
    E->op_ran = 0;
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
        free(E->h_gcount);
        free(E->h_gtouch);
        free(E);
        return;
    }
    cudaSetDevice(E->dev);
    for (int i = 0; i < 2; i++) /* a step waiting for late masks that never came goes on (its flight's value) */
        if (E->fl[i].h_lflag) *E->fl[i].h_lflag = E->fl[i].lseq;
    __sync_synchronize();
    if (E->st) cudaStreamSynchronize(E->st);
    if (E->cst) cudaStreamSynchronize(E->cst);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < E->n_buckets; i++) if (E->gexec[p][i]) cudaGraphExecDestroy(E->gexec[p][i]);
    cuda_weights_free(E);
    free(E->L);
    for (int i = 0; i < 2; i++) {
        if (E->fl[i].ev0) cudaEventDestroy(E->fl[i].ev0);
        if (E->fl[i].ev1) cudaEventDestroy(E->fl[i].ev1);
        cudaFreeHost(E->fl[i].h_out);
        cudaFreeHost(E->fl[i].h_lmask);
        cudaFreeHost((void *)E->fl[i].h_lflag);
        cudaFreeHost(E->fl[i].h_lp);
        cudaFreeHost(E->fl[i].h_plp);
        free(E->fl[i].order);
    }
    free(E->carry_ok);
    free(E->h_gcount);
    free(E->h_gtouch);
    if (E->ev_in) cudaEventDestroy(E->ev_in);
    for (int p = 0; p < 2; p++) {
        if (E->ev_cp[p]) cudaEventDestroy(E->ev_cp[p]);
        cudaFreeHost(E->h_inb[p]);
        cudaFree(E->d_inb[p]);
    }
    if (E->cst) cudaStreamDestroy(E->cst);
    cudaFree(E->hbuf);
    /* E->gu is E->qkv's allocation: freed once, as qkv */
    void *d[] = {E->tok_embd, E->out_norm, E->rope_cs,   E->kv,        E->x,           E->qkv,
                 E->q,        E->att,      E->xb,        E->logits,    E->attn_ws,     E->samp_ws,
                 E->cb_ws,    E->qtc_ws,   E->carry_tok, E->carry_rng, E->rope_cs_swa, E->qtc_flags};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cudaFree(d[i]);
    if (E->att_w != (void *)E->att) cudaFree(E->att_w);
    cudaFreeHost(E->h_logits);
    if (E->cb) cublasDestroy(E->cb);
    if (E->st) cudaStreamDestroy(E->st);
    free(E->crow);
    free(E);
}

/* zl_engine_ops.copy_kv: each layer's K and V rows [0, n_tokens) of slot src into slot dst, on the engine's stream
 * (after every step launched before, before every step launched after) */
static int s_copy_kv(zl_engine *base, int src, int dst, int n_tokens) {
    cu_engine *E = (cu_engine *)base;
    const zl_config *c = &base->model->cfg;
    if (E->dead || E->paged || src < 0 || src >= base->n_slots || dst < 0 || dst >= base->n_slots || src == dst ||
        n_tokens < 0 || n_tokens > base->n_ctx) {
        snprintf(base->err, sizeof base->err,
                 "copy_kv: slots %d -> %d, %d tokens: out of range (or engine dead, or paged KV: copy_block)", src, dst,
                 n_tokens);
        return -1;
    }
    const size_t row = (size_t)c->n_kv_heads * c->head_dim * ops_dtype_size(E->wt), slot = row * base->n_ctx;
    cudaError_t ce = cudaSetDevice(E->dev);
    for (int l = base->layer_begin; ce == cudaSuccess && l < base->layer_end; l++) {
        ce = cudaMemcpyAsync((uint8_t *)E->L[l].kc + dst * slot, (const uint8_t *)E->L[l].kc + src * slot,
                             row * n_tokens, cudaMemcpyDeviceToDevice, E->st);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync((uint8_t *)E->L[l].vc + dst * slot, (const uint8_t *)E->L[l].vc + src * slot,
                                 row * n_tokens, cudaMemcpyDeviceToDevice, E->st);
    }
    if (ce != cudaSuccess) {
        snprintf(base->err, sizeof base->err, "copy_kv: %s", cudaGetErrorString(ce));
        E->dead = 1;
        return -1;
    }
    E->carry_ok[dst] = 0;
    return 0;
}

/* zl_engine.copy_block (paged KV): each layer's K and V rows [0, n_rows) of pool block src into block dst, on the
 * engine's stream (after every step launched before, before every step launched after) */
static int s_copy_block(zl_engine *base, int src, int dst, int n_rows) {
    cu_engine *E = (cu_engine *)base;
    const zl_config *c = &base->model->cfg;
    if (E->dead || !E->paged || src < 0 || src >= base->kv_blocks || dst < 0 || dst >= base->kv_blocks || src == dst ||
        n_rows < 0 || n_rows > base->kv_block) {
        snprintf(base->err, sizeof base->err, "copy_block: blocks %d -> %d, %d rows: out of range (or engine dead)",
                 src, dst, n_rows);
        return -1;
    }
    const size_t row = (size_t)c->n_kv_heads * c->head_dim * ops_dtype_size(E->wt), blk = row * base->kv_block;
    cudaError_t ce = cudaSetDevice(E->dev);
    for (int l = base->layer_begin; ce == cudaSuccess && l < base->layer_end; l++) {
        ce = cudaMemcpyAsync((uint8_t *)E->L[l].kc + dst * blk, (const uint8_t *)E->L[l].kc + src * blk, row * n_rows,
                             cudaMemcpyDeviceToDevice, E->st);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync((uint8_t *)E->L[l].vc + dst * blk, (const uint8_t *)E->L[l].vc + src * blk,
                                 row * n_rows, cudaMemcpyDeviceToDevice, E->st);
    }
    if (ce != cudaSuccess) {
        snprintf(base->err, sizeof base->err, "copy_block: %s", cudaGetErrorString(ce));
        E->dead = 1;
        return -1;
    }
    return 0;
}

static const zl_engine_ops s_ops_cuda = {s_op_launch, s_op_wait, s_destroy, s_copy_kv};

zl_engine *engine_cuda_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    const zl_config *c = &m->cfg;
    cu_settings_get();   /* the settings, read from the environment once, before anything they steer */
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
    if (c->head_dim != 8 && c->head_dim != 16 && c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 80 &&
        c->head_dim != 96 && c->head_dim != 128 && c->head_dim != 256) {
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
    /* paged KV (whole models; a pipeline stage keeps contiguous slots): blocks of 16..256 rows, a power of two,
     * so that the tensor-core decode kernel's 16-key tiles never straddle two blocks (cuda/attention.h) */
    int kv_lg = -1;
    if (o->kv_block && lb == 0 && le == c->n_layers) {
        for (int g = 4; g <= 8; g++)
            if (o->kv_block == 1 << g) kv_lg = g;
        if (kv_lg < 0 || o->kv_blocks < 0 || o->kv_blocks > (1 << 24)) {
            snprintf(err, errlen,
                     "cuda engine: paged KV takes blocks of 16, 32, 64, 128 or 256 rows (whole 16-key attention "
                     "tiles in one block) and at most 2^24 blocks, not %d rows, %d blocks",
                     o->kv_block, o->kv_blocks);
            return NULL;
        }
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
    b->kv_split_kernels = 1; /* 1-token decode entries take the split-K decode kernels, prompt rows the prefill ones */
    b->masks = le == c->n_layers;       /* the last stage samples: structured output's masks (cuda/sample_mask.cu) */
    if (lb == 0 && le == c->n_layers) { /* late masks: steps queued behind another, whole models only */
        b->masks_late = 1;
        b->masks_ready = s_op_masks_ready;
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
    if (kv_lg >= 0) {
        E->paged = 1;
        E->kv_lg = kv_lg;
        E->max_blocks = (b->n_ctx + (1 << kv_lg) - 1) >> kv_lg;
    }
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

        E->wt = cuda_weights_type(m);
        E->wtc_on = cu_settings_get()->wtc && E->wt != CU_F32 && wtc_available();
        if (cuda_weights_upload(E, err, errlen) != 0) goto fail;
        E->last_gpu_ms = -1;
        for (int i = 0; i < 2; i++) {
            CU_CHECK(cudaEventCreate(&E->fl[i].ev0));
            CU_CHECK(cudaEventCreate(&E->fl[i].ev1));
        }
        CU_CHECK(cudaEventCreateWithFlags(&E->ev_in, cudaEventDisableTiming));

        /* RoPE table for every position of a slot: the model's frequencies and magnitude (engine/rope.h), the global
         * layers' and, where they rotate otherwise, the sliding layers' */
        for (int kind = 0; kind < (model_rope_two_kinds(c) ? 2 : 1); kind++) {
            const size_t nf = (size_t)b->n_ctx * c->rope_dim;
            float **dst = kind ? &E->rope_cs_swa : &E->rope_cs;
            float *h = (float *)malloc(nf * 4 + 4);
            if (!h) { snprintf(err, errlen, "out of memory"); goto fail; }
            zl_rope rope;
            if (rope_init(&rope, m, b->n_ctx, kind, err, errlen) != 0) {
                free(h);
                goto fail;
            }
            for (int p = 0; p < b->n_ctx; p++) rope_cs_row(&rope, p, h + (size_t)p * c->rope_dim);
            rope_free(&rope);
            ce = cudaMalloc((void **)dst, nf * 4 + 4);
            if (ce == cudaSuccess) ce = cudaMemcpy(*dst, h, nf * 4, cudaMemcpyHostToDevice);
            free(h);
            CU_CHECK(ce);
        }

        /* activations */
        if (b->max_step_tokens < b->max_batch) b->max_step_tokens = b->max_batch;
        E->max_tok = b->max_step_tokens;
        E->x_rows = (E->max_tok + 127) / 128 * 128;
        const size_t T = (size_t)E->max_tok, TX = (size_t)E->x_rows, es = ops_dtype_size(E->wt);
        const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
        size_t wide = (size_t)c->dim;
        if ((size_t)c->ffn_dim > wide) wide = c->ffn_dim;
        if (qd > wide) wide = qd;
        CU_CHECK(cudaMalloc((void **)&E->x, T * c->dim * 4));
        /* qkv and gu: one allocation for the wider of the two (disjoint lifetimes within a layer, see cu_engine) */
        /* with post norms (gemma3) the same allocation also holds the output projections' products [dim] before
         * their norm and residual add (after the attention prologue has read qkv and the GeGLU has read gu) */
        size_t qkv_w = qd + 2 * kvd, gu_w = 2 * (size_t)c->ffn_dim;
        if (c->has_post_norms && gu_w < (size_t)c->dim) gu_w = c->dim;
        const size_t qkv_bytes = TX * (qkv_w > gu_w ? qkv_w : gu_w) * 4;
        CU_CHECK(cudaMalloc((void **)&E->qkv, qkv_bytes));
        E->gu = E->qkv;
        CU_CHECK(cudaMalloc((void **)&E->q, T * qd * 4));
        CU_CHECK(cudaMalloc((void **)&E->att, TX * qd * 4));
        if (E->wt == CU_F32) E->att_w = E->att;
        else CU_CHECK(cudaMalloc(&E->att_w, TX * qd * es));
        CU_CHECK(cudaMalloc(&E->xb, TX * wide * es));
        /* rows past a step's hold values no output row depends on: zeros until a step writes them */
        CU_CHECK(cudaMemset(E->xb, 0, TX * wide * es));
        CU_CHECK(cudaMemset(E->qkv, 0, qkv_bytes));
        if (E->att_w != E->att) CU_CHECK(cudaMemset(E->att_w, 0, TX * qd * es));
        CU_CHECK(cudaMalloc((void **)&E->logits, (size_t)b->max_batch * c->vocab_size * 4));
        CU_CHECK(cudaMallocHost((void **)&E->h_logits, (size_t)b->max_batch * c->vocab_size * 4));
        cuda_step_layout(&E->in, E->max_tok, b->max_batch, c->vocab_size,
                         E->paged ? (size_t)b->max_batch * E->max_blocks + 1 : 0);
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
            if (b->masks_late) { /* the late masks and their flag (zl_seq.mask_late), in mapped host memory */
                const size_t lb_bytes = (size_t)b->max_batch * E->in.mask_words * 4;
                CU_CHECK(cudaHostAlloc((void **)&E->fl[i].h_lmask, lb_bytes, cudaHostAllocMapped));
                memset(E->fl[i].h_lmask, 0xFF, lb_bytes);
                CU_CHECK(cudaHostGetDevicePointer((void **)&E->fl[i].d_lmask, E->fl[i].h_lmask, 0));
                uint32_t *flag = NULL;
                CU_CHECK(cudaHostAlloc((void **)&flag, 64, cudaHostAllocMapped));
                memset(flag, 0, 64);
                E->fl[i].h_lflag = flag;
                CU_CHECK(cudaHostGetDevicePointer((void **)&E->fl[i].d_lflag, flag, 0));
            }
            if (E->n_inb == 2) { /* a whole model samples: the logprobs kernel writes here */
                CU_CHECK(cudaHostAlloc((void **)&E->fl[i].h_lp, (size_t)b->max_batch * sizeof(zl_logprobs),
                                       cudaHostAllocMapped));
                memset(E->fl[i].h_lp, 0, (size_t)b->max_batch * sizeof(zl_logprobs));
                CU_CHECK(cudaHostGetDevicePointer((void **)&E->fl[i].d_lp, E->fl[i].h_lp, 0));
                /* and the prompt logprobs of a step's rows (zl_seq.plp_rows) */
                CU_CHECK(cudaHostAlloc((void **)&E->fl[i].h_plp, (size_t)E->max_tok * sizeof(zl_logprobs),
                                       cudaHostAllocMapped));
                memset(E->fl[i].h_plp, 0, (size_t)E->max_tok * sizeof(zl_logprobs));
                CU_CHECK(cudaHostGetDevicePointer((void **)&E->fl[i].d_plp, E->fl[i].h_plp, 0));
            }
        }
        if (E->n_inb == 2) {
            E->h_gcount = (int32_t *)calloc((size_t)c->vocab_size, sizeof(int32_t));
            E->h_gtouch = (int32_t *)malloc((size_t)CU_GEN * sizeof(int32_t));
            if (!E->h_gcount || !E->h_gtouch) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            b->caps = ZL_CAP_LOGPROBS | ZL_CAP_PENALTY | ZL_CAP_PROMPT_LOGPROBS;
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
            p.kv_type = cu_kv_type(E->wt); p.n_heads = c->n_heads; p.n_kv_heads = c->n_kv_heads;
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
            /* qtc's and wtc's workspace: the largest any of the matrices needs */
            E->qtc_ws_bytes = cuda_weights_workspace_bytes(E);
            if (E->qtc_ws_bytes) CU_CHECK(cudaMalloc(&E->qtc_ws, E->qtc_ws_bytes));
            /* qtc's hand-over flags start at zero and every launch leaves them so */
            if (E->qtc_ws_bytes && qtc_flags_bytes()) {
                CU_CHECK(cudaMalloc((void **)&E->qtc_flags, qtc_flags_bytes()));
                CU_CHECK(cudaMemset(E->qtc_flags, 0, qtc_flags_bytes()));
            }
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
        size_t layer_half = 0;              /* bytes of one layer's K (or V) */
        if (E->paged) {
            /* the pool: --kv-blocks, else as many blocks as n_slots whole contexts take, fewer when the budget holds
             * fewer; at least one whole context. n_slots (launch states: feeds, carries) is not budget-bound */
            const int bs = 1 << E->kv_lg;
            const size_t block_bytes = (size_t)(le - lb) * 2 * bs * kvd * es;
            const size_t fitb = budget / block_bytes; /* blocks that fit, the sentinel included */
            size_t want = o->kv_blocks > 0 ? (size_t)o->kv_blocks : (size_t)b->n_slots * E->max_blocks;
            if (o->kv_blocks <= 0 && want + 1 > fitb) want = fitb > 1 ? fitb - 1 : 0;
            if (want > ((size_t)1 << 24)) want = (size_t)1 << 24;
            if (want < (size_t)E->max_blocks || want + 1 > fitb) {
                snprintf(err, errlen,
                         "KV budget of %.1f MiB: a paged pool of %zu blocks of %d rows (%.2f MiB each, plus a "
                         "sentinel) does not fit it, or holds less than one context of %d blocks",
                         budget / 1048576.0, want, bs, block_bytes / 1048576.0, E->max_blocks);
                goto fail;
            }
            b->kv_block = bs;
            b->kv_blocks = (int)want;
            b->copy_block = s_copy_block;
            E->kv_bytes = block_bytes * (want + 1);
            layer_half = (want + 1) * bs * kvd * es;
        } else {
            if (o->n_slots <= 0 && o->kv_mem) b->n_slots = fit > 1 ? (int)(fit - 1 > 65536 ? 65536 : fit - 1) : 0;
            if (fit < (size_t)b->n_slots + 1) b->n_slots = fit > 1 ? (int)(fit - 1) : 0;
            if (b->n_slots < 1) {
                snprintf(err, errlen, "KV budget of %.1f MiB holds no slot of %d tokens (%.1f MiB each)",
                         budget / 1048576.0, b->n_ctx, slot_bytes / 1048576.0);
                goto fail;
            }
            E->kv_bytes = slot_bytes * (b->n_slots + 1);
            layer_half = (size_t)(b->n_slots + 1) * b->n_ctx * kvd * es;
        }
        if (b->max_batch > b->n_slots) b->max_batch = b->n_slots;
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
        for (int l = lb; l < le; l++) {
            E->L[l].kc = (uint8_t *)E->kv + (size_t)(l - lb) * 2 * layer_half;
            E->L[l].vc = (uint8_t *)E->kv + ((size_t)(l - lb) * 2 + 1) * layer_half;
            E->L[l].window = model_attn_window(c, l, b->n_ctx);
        }
        if (E->paged)
            fprintf(stderr,
                    "zllm %s: paged KV cache %d blocks x %d tokens (%lld tokens, %.1f MiB %s), %d slots, "
                    "max batch %d\n",
                    b->device, b->kv_blocks, b->kv_block, (long long)b->kv_blocks * b->kv_block,
                    E->kv_bytes / 1048576.0, ops_dtype_name(E->wt), b->n_slots, b->max_batch);
        else
            fprintf(stderr, "zllm %s: KV cache %d slots x %d tokens (%lld tokens, %.1f MiB %s), max batch %d\n",
                    b->device, b->n_slots, b->n_ctx, (long long)b->n_slots * b->n_ctx, E->kv_bytes / 1048576.0,
                    ops_dtype_name(E->wt), b->max_batch);
        if (!o->no_graphs && cuda_step_capture_graphs(E, err, errlen) != 0) goto fail;
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
