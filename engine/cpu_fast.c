/* engine/cpu_fast.c: the fast CPU backend (device "cpu"; the f32 reference is "cpu-ref", common/engine_cpu.c). A
 * Llama-family forward pass (llama, qwen2, qwen3, phi3, gemma3; sliding windows per layer, engine/model.h) over a batch
 * of sequences at independent positions, with per-slot f32 KV caches, like the reference, but with the matrix products
 * on the packed GGUF blocks (engine/cpu_qdot.c: integer dot products against activations quantized per block of 32 for
 * Q4_0/Q4_1/Q8_0/Q4_K/Q6_K weights, f32 for the float types), SIMD attention, and the row-wise work (norms, activation
 * quantization, SiLU) spread over the thread pool when a step has many rows.
 *
 * Batch processing: the step's T = sum(n_tokens) rows are stacked; a matrix product walks each thread's share of
 * weight rows in chunks that stay in cache and applies every chunk to all T rows, QDOT_TILE rows per kernel
 * call, so a prompt chunk is a matrix-matrix product that reads each weight block from memory once.
 *
 * Batch invariance: each output value is computed by one kernel call whose operations for that (weight row,
 * activation row) pair do not depend on the other rows of the call (cpu_qdot.h), activation quantization is
 * per row, attention and the element-wise work are per row and head, and threads split output rows only. So a
 * sequence's logits are bitwise the same whatever shares its step and whatever the thread count. The ISA path
 * (scalar, AVX2, AVX-512) is fixed at creation: the best the CPU has, or $ZLLM_CPU_ISA (scalar|avx2|avx512).
 * $ZLLM_CPU_EXACT=1 gives every product f32 activations (scalar, slow): the engine then matches the reference
 * up to f32 summation order, which tests use to show that the quantized activations are the only difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu_attn.h"
#include "cpu_pool.h"
#include "cpu_qdot.h"
#include "cpu_extra.h"
#include "cpu_launch.h"
#include "cpu_sample.h"
#include "engine.h"
#include "sampler_mask.h"
#include "engine_env.h"
#include "quant.h"
#include "rope.h"

#define S_MAX_THREADS 64
#define S_CHUNK_BYTES (24 * 1024) /* weight bytes a thread applies to all rows before moving on */
#define S_PAR_ROWS 4              /* row-wise work runs on the pool from this many rows */

typedef struct {
    zl_engine base;          /* public part; must stay first */
    zl_config c;             /* copy of the model configuration */
    int isa;                 /* qdot_isa of every kernel */
    int exact;               /* 1: f32 activations for every product ($ZLLM_CPU_EXACT=1; slow, for checks) */
    cpu_pool *pool;          /* threads */
    float *attn_norm;        /* [n_layers][dim] */
    float *ffn_norm;         /* [n_layers][dim] */
    float *bq, *bk, *bv;     /* [n_layers][q_dim] / [n_layers][kv_dim]; NULL without biases */
    float *out_norm;         /* [dim] */
    float *kc, *vc;          /* [n_slots][n_own layers][n_ctx][kv_dim] */
    float *x;                /* [T][dim] residual stream */
    float *xb;               /* [T][max(dim, q_dim)] normed input / attention output */
    float *xb2;              /* [T][dim] projection output */
    float *q;                /* [T][q_dim] */
    float *k, *v;            /* [T][kv_dim] */
    float *hb, *hb2;         /* [T][ffn_dim] */
    float *xl;               /* [max_batch][dim] last rows, normed */
    float *lg;               /* [max_batch][vocab] logits */
    float *lgs;              /* [vocab] sampler scratch */
    qdot_blk *xq;            /* [T][max width / 32] quantized activations */
    size_t xq_row;           /* blocks per row of xq */
    const float *xq_of;      /* the f32 buffer xq now holds (NULL: none); reset whenever that buffer changes */
    int xq_n;                /* its row width */
    int *row_slot, *row_pos; /* [T] slot and position of each row */
    const int32_t **row_tab; /* [T] block table of each row's sequence (cpu_kv_tab) */
    int32_t *slot_ids;       /* [n_slots] i at i: the one-block tables of contiguous slots */
    int kbs, n_kb;           /* rows per KV block (n_ctx for contiguous slots) and blocks (cpu_kv_shape) */
    float *rope_cs;          /* [T][rope_dim] cos/sin pairs per row (the global layers' RoPE) */
    cpu_extra ex;            /* RoPE tables and the qwen3/gemma3 per-layer vectors (cpu_extra.h) */
    float *th_att;           /* [nth][n_ctx] attention scores per thread */
    size_t *th_off;          /* [nth][n_ctx] key row offsets per thread (cpu_attn_head) */
    int nth;                 /* threads */
    /* steps queued ahead (zl_engine.depth 2, whole models): as the reference, a launched step runs at once and
     * writes its results then; the wait only checks the order */
    cpu_launch lq; /* launch/wait, feeds and the slots' carries (cpu_launch.h) */
} s_fast;

static void s_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ------------------------------------------------------------------------------------------------------------
 * row-wise work */

typedef struct {
    s_fast *e;
    int T; /* rows */
    void (*fn)(s_fast *e, int r, const void *arg);
    const void *arg;
} s_rows_job;

static void s_rows_fn(void *ctx, int ith, int nth) {
    s_rows_job *j = ctx;
    int64_t lo, hi;
    s_range(j->T, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) j->fn(j->e, (int)r, j->arg);
}

/* fn(e, r, arg) for every row r < T: on the pool when there are enough rows */
static void s_rows(s_fast *e, int T, void (*fn)(s_fast *, int, const void *), const void *arg) {
    s_rows_job j = {e, T, fn, arg};
    if (T < S_PAR_ROWS) s_rows_fn(&j, 0, 1);
    else cpu_pool_run(e->pool, s_rows_fn, &j);
}

static void s_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

typedef struct {
    const float *w; /* norm weights [dim] */
} s_norm_arg;

static void s_norm_row(s_fast *e, int r, const void *arg) {
    const s_norm_arg *a = arg;
    size_t dim = (size_t)e->c.dim;
    s_rmsnorm(e->xb + r * dim, e->x + r * dim, a->w, (int)dim, e->c.rms_eps);
}

static void s_quant_row(s_fast *e, int r, const void *arg) {
    (void)arg;
    qdot_quantize_row(e->isa, e->xq_of + (size_t)r * e->xq_n, e->xq + (size_t)r * e->xq_row, e->xq_n);
}

static void s_glu_row(s_fast *e, int r, const void *arg) {
    (void)arg;
    size_t ff = (size_t)e->c.ffn_dim;
    float *g = e->hb + r * ff;
    const float *u = e->hb2 + r * ff;
    if (e->c.ffn_act == ZL_ACT_GELU_TANH) { /* GeGLU: gelu_tanh(gate) * up */
        for (size_t i = 0; i < ff; i++) {
            const float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
        }
        return;
    }
    for (size_t i = 0; i < ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i]; /* SiLU(gate) * up */
}

/* xb2[r] = rmsnorm(xb2[r]) * w: the norm of a block's output before its residual add */
static void s_post_norm_row(s_fast *e, int r, const void *arg) {
    const s_norm_arg *a = arg;
    size_t dim = (size_t)e->c.dim;
    s_rmsnorm(e->xb2 + r * dim, e->xb2 + r * dim, a->w, (int)dim, e->c.rms_eps);
}

/* ------------------------------------------------------------------------------------------------------------
 * matrix products */

/* one matrix product of a job: y[T][n_out] = x W^T (+ bias) */
typedef struct {
    const zl_weight *w; /* [n_out rows][n_in] */
    qdot_fn fn;         /* its kernel */
    const float *bias;  /* [n_out] or NULL */
    float *y;           /* [T][n_out] */
} s_mm;

/* up to 3 products of the same input (Q, K, V; gate, up) in one pool run: threads split their rows together */
typedef struct {
    s_mm mm[3];
    int n_mm;        /* products */
    int64_t n_rows;  /* their rows in all */
    const void *x;   /* [T] rows: qdot_blk [n_in / 32] or f32 [n_in] */
    size_t x_stride; /* bytes per row of x */
    int T;           /* rows */
} s_mm_job;

/* rows [lo, hi) of one product, in chunks of weight rows that stay in cache, each applied to all T rows */
static void s_mm_rows(const s_mm_job *j, const s_mm *p, int64_t lo, int64_t hi) {
    const zl_weight *w = p->w;
    const int64_t n_in = w->n_in, n_out = w->n_out;
    int64_t chunk = (int64_t)(S_CHUNK_BYTES / w->row_bytes);
    if (chunk < 1) chunk = 1;
    for (int64_t o0 = lo; o0 < hi; o0 += chunk) {
        const int64_t o1 = hi - o0 < chunk ? hi : o0 + chunk;
        for (int t0 = 0; t0 < j->T; t0 += QDOT_TILE) {
            const int nt = j->T - t0 < QDOT_TILE ? j->T - t0 : QDOT_TILE;
            const void *xp[QDOT_TILE];
            for (int t = 0; t < nt; t++) xp[t] = (const char *)j->x + (size_t)(t0 + t) * j->x_stride;
            for (int64_t o = o0; o < o1; o++) {
                float r[QDOT_TILE];
                p->fn((const char *)w->data + (size_t)o * w->row_bytes, xp, nt, n_in, r);
                const float b = p->bias ? p->bias[o] : 0.0f;
                for (int t = 0; t < nt; t++) p->y[(size_t)(t0 + t) * n_out + o] = p->bias ? r[t] + b : r[t];
            }
        }
    }
}

static void s_mm_fn(void *ctx, int ith, int nth) {
    s_mm_job *j = ctx;
    int64_t lo, hi, base = 0;
    s_range(j->n_rows, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n_mm; i++) {
        const int64_t n = j->mm[i].w->n_out, a = lo > base ? lo - base : 0, b = hi - base < n ? hi - base : n;
        if (a < b) s_mm_rows(j, &j->mm[i], a, b);
        base += n;
    }
}

/* the products ws[i] (bias bs[i], may be NULL) of the same input x[T][n_in], into ys[i], in one pool run;
 * quantizes x first when the kernels want it (once per buffer content: e->xq_of) */
static int s_matmuls(s_fast *e, int n, const zl_weight *const *ws, const float *const *bs, const float *x,
                     float *const *ys, int T) {
    s_mm_job j;
    memset(&j, 0, sizeof j);
    int q8 = -1;
    for (int i = 0; i < n; i++) {
        const zl_weight *w = ws[i];
        qdot_fn fn = e->exact ? qdot_get_f32act(w->type) : qdot_get(w->type, e->isa);
        if (!fn) {
            snprintf(e->base.err, sizeof e->base.err, "cpu engine: no kernel for %s (%s)", w->name ? w->name : "?",
                     ggml_type_name(w->type));
            return -1;
        }
        const int wq = qdot_wants_q8(w->type) && !e->exact;
        if ((q8 >= 0 && wq != q8) || w->n_in != ws[0]->n_in) { /* mixed activation kinds: one run each */
            for (int k = 0; k < n; k++)
                if (s_matmuls(e, 1, &ws[k], &bs[k], x, &ys[k], T)) return -1;
            return 0;
        }
        q8 = wq;
        j.mm[i] = (s_mm){w, fn, bs[i], ys[i]};
        j.n_rows += w->n_out;
    }
    j.n_mm = n;
    j.T = T;
    j.x = x;
    j.x_stride = (size_t)ws[0]->n_in * sizeof(float);
    if (q8) {
        if (e->xq_of != x || e->xq_n != (int)ws[0]->n_in) {
            e->xq_of = x;
            e->xq_n = (int)ws[0]->n_in;
            s_rows(e, T, s_quant_row, NULL);
        }
        j.x = e->xq;
        j.x_stride = e->xq_row * sizeof(qdot_blk);
    }
    cpu_pool_run(e->pool, s_mm_fn, &j);
    return 0;
}

static int s_matmul(s_fast *e, const zl_weight *w, const float *bias, const float *x, float *y, int T) {
    return s_matmuls(e, 1, &w, &bias, x, &y, T);
}

/* ------------------------------------------------------------------------------------------------------------
 * attention */

static void s_rope(float *x, int n_heads, int head_dim, int rope_dim, zl_rope_style style, const float *cs) {
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int a = style == ZL_ROPE_ADJACENT ? 2 * i : i;
            int b = style == ZL_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* per-head RMSNorm of a row's q and k (before RoPE), with layer l's weights */
static void s_qk_norm(s_fast *e, int l, float *q, float *k) {
    const zl_config *c = &e->c;
    const int hd = c->head_dim;
    for (int h = 0; h < c->n_heads; h++)
        s_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, e->ex.q_norm + (size_t)l * hd, hd, c->rms_eps);
    for (int h = 0; h < c->n_kv_heads; h++)
        s_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, e->ex.k_norm + (size_t)l * hd, hd, c->rms_eps);
}

typedef struct {
    s_fast *e;
    int layer;
    int T;
} s_attn_job;

/* causal attention for this thread's share of (row, head) items; output into e->xb [T][q_dim] */
static void s_attn_fn(void *ctx, int ith, int nth) {
    s_attn_job *j = ctx;
    s_fast *e = j->e;
    const zl_config *c = &e->c;
    const int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, isa = e->isa;
    const size_t q_dim = (size_t)c->n_heads * hd, kv_dim = (size_t)c->n_kv_heads * hd;
    const int n_own = e->base.layer_end - e->base.layer_begin, li = j->layer - e->base.layer_begin;
    float *att = e->th_att + (size_t)ith * e->base.n_ctx;
    size_t *off = e->th_off + (size_t)ith * e->base.n_ctx; /* the keys' row offsets of row r_off */
    int r_off = -1;
    const float scale = c->attn_scale;
    const int window = model_layer_window(c, j->layer);
    int64_t lo, hi;
    s_range((int64_t)j->T * c->n_heads, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        const int r = (int)(it / c->n_heads), h = (int)(it % c->n_heads), kvh = h / group;
        const int pos = e->row_pos[r];
        const int p0 = window > 0 && pos >= window ? pos - window + 1 : 0; /* the first key the row sees */
        if (r != r_off) {
            for (int p = p0; p <= pos; p++) off[p - p0] = cpu_kv_at(e->row_tab[r], e->kbs, n_own, li, p, kv_dim);
            r_off = r;
        }
        const size_t base = (size_t)kvh * hd;
        cpu_attn_head(isa, e->q + (size_t)r * q_dim + (size_t)h * hd, hd, e->kc + base, e->vc + base, off, pos + 1 - p0,
                      scale, att, e->xb + (size_t)r * q_dim + (size_t)h * hd);
    }
}


static int s_forward(zl_engine *eb, const zl_seq *seqs, int n, const float *h_in, float *h_out, int32_t *out_tokens,
                     float *out_logits, zl_logprobs *out_lp) {
    s_fast *e = (s_fast *)eb;
    const zl_model *m = eb->model;
    const zl_config *c = &e->c;
    int T;
    const int embed = h_in == NULL;
    if (embed && eb->layer_begin != 0) {
        snprintf(eb->err, sizeof eb->err, "step: layers from %d need hidden states in", eb->layer_begin);
        return -1;
    }
    if (!h_out && eb->layer_end < c->n_layers) {
        snprintf(eb->err, sizeof eb->err, "step: layers up to %d need a hidden state buffer out", eb->layer_end);
        return -1;
    }
    if (cpu_launch_check(eb, seqs, n, embed, &T)) return -1;
    const int dim = c->dim, hd = c->head_dim;
    const size_t q_dim = (size_t)c->n_heads * hd, kv_dim = (size_t)c->n_kv_heads * hd;

    int r = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        for (int t = 0; t < s->n_tokens; t++, r++) {
            if (embed) {
                const void *src = (const char *)m->tok_embd.data + (size_t)s->tokens[t] * m->tok_embd.row_bytes;
                if (quant_dequant_row(m->tok_embd.type, src, e->x + (size_t)r * dim, dim) != 0) {
                    snprintf(eb->err, sizeof eb->err, "cannot dequantize token_embd.weight");
                    return -1;
                }
                if (c->embd_scale != 1.0f)
                    for (int i = 0; i < dim; i++) e->x[(size_t)r * dim + i] *= c->embd_scale;
            }
            e->row_slot[r] = s->slot;
            e->row_tab[r] = cpu_kv_tab(eb, s, e->slot_ids);
            e->row_pos[r] = s->pos + t;
            rope_cs_row(&e->ex.rope, s->pos + t, e->rope_cs + (size_t)r * c->rope_dim);
            if (e->ex.rope_cs_swa)
                rope_cs_row(&e->ex.rope_swa, s->pos + t, e->ex.rope_cs_swa + (size_t)r * c->rope_dim);
        }
    }
    if (!embed) memcpy(e->x, h_in, (size_t)T * dim * sizeof(float));

    for (int l = eb->layer_begin; l < eb->layer_end; l++) {
        const zl_layer_weights *L = &m->layers[l];
        s_norm_arg na = {e->attn_norm + (size_t)l * dim};
        e->xq_of = NULL;
        s_rows(e, T, s_norm_row, &na);
        const zl_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const float *qkv_b[3] = {e->bq ? e->bq + l * q_dim : NULL, e->bk ? e->bk + l * kv_dim : NULL,
                                 e->bv ? e->bv + l * kv_dim : NULL};
        float *qkv_y[3] = {e->q, e->k, e->v};
        if (s_matmuls(e, 3, qkv, qkv_b, e->xb, qkv_y, T)) return -1;
        const float *cs_l = e->ex.rope_cs_swa && model_layer_window(c, l) ? e->ex.rope_cs_swa : e->rope_cs;
        for (r = 0; r < T; r++) {
            const float *cs = cs_l + (size_t)r * c->rope_dim;
            if (e->ex.q_norm) s_qk_norm(e, l, e->q + r * q_dim, e->k + r * kv_dim);
            s_rope(e->q + r * q_dim, c->n_heads, hd, c->rope_dim, c->rope_style, cs);
            s_rope(e->k + r * kv_dim, c->n_kv_heads, hd, c->rope_dim, c->rope_style, cs);
            size_t at = cpu_kv_at(e->row_tab[r], e->kbs, eb->layer_end - eb->layer_begin, l - eb->layer_begin,
                                  e->row_pos[r], kv_dim);
            memcpy(e->kc + at, e->k + r * kv_dim, kv_dim * sizeof(float));
            memcpy(e->vc + at, e->v + r * kv_dim, kv_dim * sizeof(float));
        }
        s_attn_job aj = {e, l, T};
        e->xq_of = NULL;
        cpu_pool_run(e->pool, s_attn_fn, &aj);
        if (s_matmul(e, &L->wo, NULL, e->xb, e->xb2, T)) return -1;
        if (e->ex.post_attn) {
            s_norm_arg pa = {e->ex.post_attn + (size_t)l * dim};
            s_rows(e, T, s_post_norm_row, &pa);
        }
        for (size_t i = 0; i < (size_t)T * dim; i++) e->x[i] += e->xb2[i];

        na.w = e->ffn_norm + (size_t)l * dim;
        e->xq_of = NULL;
        s_rows(e, T, s_norm_row, &na);
        const zl_weight *gu[2] = {&L->w_gate, &L->w_up};
        const float *gu_b[2] = {NULL, NULL};
        float *gu_y[2] = {e->hb, e->hb2};
        if (s_matmuls(e, 2, gu, gu_b, e->xb, gu_y, T)) return -1;
        s_rows(e, T, s_glu_row, NULL);
        if (s_matmul(e, &L->w_down, NULL, e->hb, e->xb2, T)) return -1;
        if (e->ex.post_ffn) {
            s_norm_arg pf = {e->ex.post_ffn + (size_t)l * dim};
            s_rows(e, T, s_post_norm_row, &pf);
        }
        for (size_t i = 0; i < (size_t)T * dim; i++) e->x[i] += e->xb2[i];
    }
    e->xq_of = NULL;

    if (eb->layer_end < c->n_layers) {
        memcpy(h_out, e->x, (size_t)T * dim * sizeof(float));
        return 0;
    }

    /* prompt logprobs (zl_seq.plp_rows): the LM head on those rows too, max_batch rows at a time through the same
     * buffers and products as the last rows (each row's logits are the same bits whichever rows share the product) */
    r = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        for (int j0 = 0; j0 < s->plp_rows; j0 += eb->max_batch) {
            const int nr = s->plp_rows - j0 < eb->max_batch ? s->plp_rows - j0 : eb->max_batch;
            for (int j = 0; j < nr; j++)
                s_rmsnorm(e->xl + (size_t)j * dim, e->x + (size_t)(r + j0 + j) * dim, e->out_norm, dim, c->rms_eps);
            e->xq_of = NULL; /* xl holds new rows */
            if (s_matmul(e, &m->output, NULL, e->xl, e->lg, nr)) return -1;
            for (int j = 0; j < nr; j++)
                logprobs_prompt_row(e->lg + (size_t)j * c->vocab_size, c->vocab_size, s->plp_next[j0 + j], s->plp_top,
                                    &s->plp_out[j0 + j]);
        }
        r += s->n_tokens;
    }
    e->xq_of = NULL;
    r = 0;
    for (int i = 0; i < n; i++) {
        r += seqs[i].n_tokens;
        s_rmsnorm(e->xl + (size_t)i * dim, e->x + (size_t)(r - 1) * dim, e->out_norm, dim, c->rms_eps);
    }
    if (s_matmul(e, &m->output, NULL, e->xl, e->lg, n)) return -1;
    e->xq_of = NULL;
    const size_t V = (size_t)c->vocab_size;
    if (out_logits) memcpy(out_logits, e->lg, (size_t)n * V * sizeof(float));
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (!s->sample) {
            if (out_tokens) out_tokens[i] = -1;
            continue;
        }
        int id = cpu_sample_entry(e->lg + i * V, (int)V, e->lgs, s, out_lp ? &out_lp[i] : NULL);
        if (out_tokens) out_tokens[i] = id;
    }
    return 0;
}

static int s_launch(zl_engine *eb, const zl_step *st) { return cpu_launch_run(eb, &((s_fast *)eb)->lq, st); }
static int s_wait(zl_engine *eb, const zl_step *st) { return cpu_launch_wait(eb, &((s_fast *)eb)->lq, st); }

/* ------------------------------------------------------------------------------------------------------------
 * lifetime */

static void s_destroy(zl_engine *eb) {
    if (!eb) return;
    s_fast *e = (s_fast *)eb;
    cpu_pool_destroy(&e->pool);
    float *bufs[] = {e->attn_norm, e->ffn_norm, e->bq, e->bk,  e->bv,  e->out_norm, e->kc,
                     e->vc,        e->x,        e->xb, e->xb2, e->q,   e->k,        e->v,
                     e->hb,        e->hb2,      e->xl, e->lg,  e->lgs, e->rope_cs,  e->th_att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(e->xq);
    cpu_extra_free(&e->ex);
    free(e->row_slot);
    free(e->row_tab);
    free(e->th_off);
    free(e->slot_ids);
    free(e->row_pos);
    cpu_launch_free(&e->lq);
    free(e);
}

static int s_copy_block(zl_engine *eb, int src, int dst, int n_rows) {
    s_fast *e = (s_fast *)eb;
    const zl_config *c = &eb->model->cfg;
    return cpu_launch_copy_block(eb, e->kc, e->vc, (size_t)c->n_kv_heads * c->head_dim, src, dst, n_rows);
}

static int s_copy_kv(zl_engine *eb, int src, int dst, int n_tokens) {
    s_fast *e = (s_fast *)eb;
    const zl_config *c = &eb->model->cfg;
    return cpu_launch_copy_kv(eb, &e->lq, e->kc, e->vc, (size_t)c->n_kv_heads * c->head_dim, src, dst, n_tokens);
}

static const zl_engine_ops s_ops = {s_launch, s_wait, s_destroy, s_copy_kv};

/* the ISA from $ZLLM_CPU_ISA (refused when this CPU lacks it) or the best one */
static int s_pick_isa(char *err, size_t errlen) {
    const char *s = engine_env("ZLLM_CPU_ISA");
    if (!s) return qdot_isa_best();
    for (int isa = QDOT_SCALAR; isa <= QDOT_AVX512; isa++)
        if (!strcmp(s, qdot_isa_name(isa))) {
            if (qdot_isa_ok(isa)) return isa;
            snprintf(err, errlen, "cpu engine: ZLLM_CPU_ISA=%s: this CPU lacks it", s);
            return -1;
        }
    snprintf(err, errlen, "cpu engine: ZLLM_CPU_ISA=%s: expected scalar, avx2 or avx512", s);
    return -1;
}

/* 1 when every matrix of layers [lb, le) and the LM head has a kernel */
static int s_kernels_ok(const zl_model *m, int lb, int le, char *err, size_t errlen) {
    for (int l = lb; l < le; l++) {
        const zl_layer_weights *L = &m->layers[l];
        const zl_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (!qdot_get(ws[i]->type, QDOT_SCALAR) || (qdot_wants_q8(ws[i]->type) && ws[i]->n_in % 32 != 0)) {
                snprintf(err, errlen, "cpu engine: no kernel for %s (%s)", ws[i]->name ? ws[i]->name : "?",
                         ggml_type_name(ws[i]->type));
                return 0;
            }
    }
    if (!qdot_get(m->output.type, QDOT_SCALAR)) {
        snprintf(err, errlen, "cpu engine: no kernel for the LM head (%s)", ggml_type_name(m->output.type));
        return 0;
    }
    return 1;
}

zl_engine *engine_cpu_fast_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    if (!m) {
        snprintf(err, errlen, "cpu engine: no model");
        return NULL;
    }
    zl_engine_opts def;
    memset(&def, 0, sizeof def);
    if (!o) o = &def;
    const zl_config *c = &m->cfg;
    if (o->n_ctx < 0 || o->max_batch < 0 || o->n_slots < 0 || o->max_step_tokens < 0 || o->threads < 0) {
        snprintf(err, errlen, "cpu engine: negative option");
        return NULL;
    }
    int lb = o->layer_begin, le = o->layer_end ? o->layer_end : c->n_layers;
    if (lb < 0 || lb >= le || le > c->n_layers) {
        snprintf(err, errlen, "cpu engine: layer range [%d, %d) outside the model's %d layers", o->layer_begin,
                 o->layer_end, c->n_layers);
        return NULL;
    }
    const int isa = s_pick_isa(err, errlen);
    if (isa < 0 || !s_kernels_ok(m, lb, le, err, errlen)) return NULL;
    s_fast *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "cpu engine: out of memory");
        return NULL;
    }
    zl_engine *b = &e->base;
    b->ops = &s_ops;
    b->model = m;
    b->layer_begin = lb;
    b->layer_end = le;
    b->lanes = 1;
    b->masks = 1;
    b->caps = ZL_CAP_LOGPROBS | ZL_CAP_PENALTY | ZL_CAP_PROMPT_LOGPROBS;
    b->depth = lb == 0 && le == c->n_layers ? 2 : 1; /* steps queued ahead: whole models only (the carries) */
    snprintf(b->device, sizeof b->device, "cpu");
    b->max_batch = o->max_batch ? o->max_batch : 16;
    b->n_slots = o->n_slots ? o->n_slots : b->max_batch;
    b->n_ctx = o->n_ctx ? o->n_ctx : (c->n_ctx < 4096 ? c->n_ctx : 4096);
    b->max_step_tokens = o->max_step_tokens ? o->max_step_tokens : 2048;
    if (b->max_step_tokens < b->max_batch) b->max_step_tokens = b->max_batch;
    if (b->max_batch > 4096 || b->n_slots > 65536 || b->n_ctx > (1 << 22) || b->max_step_tokens > (1 << 20)) {
        snprintf(err, errlen, "cpu engine: options too large (batch %d, slots %d, ctx %d, step tokens %d)",
                 b->max_batch, b->n_slots, b->n_ctx, b->max_step_tokens);
        goto fail;
    }
    e->c = *c;
    e->isa = isa;
    e->exact = engine_env_int("ZLLM_CPU_EXACT", 0, 0, 1);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    e->nth = o->threads ? o->threads : (ncpu > 0 ? (int)ncpu : 1);
    if (e->nth > S_MAX_THREADS) e->nth = S_MAX_THREADS;

    size_t L = (size_t)c->n_layers, L_own = (size_t)(le - lb), dim = (size_t)c->dim;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t T = (size_t)b->max_step_tokens, V = (size_t)c->vocab_size, ff = (size_t)c->ffn_dim;
    size_t wide = dim > q_dim ? dim : q_dim, max_in = wide > ff ? wide : ff;
    if (cpu_kv_shape(b, o, &e->kbs, &e->n_kb, err, errlen) != 0) goto fail;
    if (b->kv_block > 0) b->copy_block = s_copy_block;
    double kv_floats = (double)e->n_kb * L_own * e->kbs * kv_dim;
    if (kv_floats * 8.0 > 1e12) {
        snprintf(err, errlen, "cpu engine: KV cache of %.0f GB is too large", kv_floats * 8.0 / 1e9);
        goto fail;
    }
    e->xq_row = (max_in + 31) / 32;
    e->attn_norm = cpu_extra_floats(L * dim);
    e->ffn_norm = cpu_extra_floats(L * dim);
    e->out_norm = cpu_extra_floats(dim);
    e->kc = cpu_extra_floats((size_t)kv_floats);
    e->vc = cpu_extra_floats((size_t)kv_floats);
    e->x = cpu_extra_floats(T * dim);
    e->xb = cpu_extra_floats(T * wide);
    e->xb2 = cpu_extra_floats(T * dim);
    e->q = cpu_extra_floats(T * q_dim);
    e->k = cpu_extra_floats(T * kv_dim);
    e->v = cpu_extra_floats(T * kv_dim);
    e->hb = cpu_extra_floats(T * ff);
    e->hb2 = cpu_extra_floats(T * ff);
    e->xl = cpu_extra_floats((size_t)b->max_batch * dim);
    e->lg = cpu_extra_floats((size_t)b->max_batch * V);
    e->lgs = cpu_extra_floats(V);
    e->rope_cs = cpu_extra_floats(T * (size_t)c->rope_dim);
    e->th_att = cpu_extra_floats((size_t)e->nth * b->n_ctx);
    e->th_off = calloc((size_t)e->nth * b->n_ctx, sizeof *e->th_off);
    e->xq = calloc(T * e->xq_row, sizeof(qdot_blk));
    e->row_slot = calloc(T, sizeof(int));
    e->row_tab = calloc(T, sizeof *e->row_tab);
    e->slot_ids = calloc((size_t)b->n_slots, sizeof *e->slot_ids);
    for (int i = 0; e->slot_ids && i < b->n_slots; i++) e->slot_ids[i] = i;
    e->row_pos = calloc(T, sizeof(int));
    const int lq_ok = cpu_launch_init(&e->lq, b->n_slots, b->max_batch, s_forward) == 0;
    if (!e->attn_norm || !e->ffn_norm || !e->out_norm || !e->kc || !e->vc || !e->x || !e->xb || !e->xb2 || !e->q ||
        !e->k || !e->v || !e->hb || !e->hb2 || !e->xl || !e->lg || !e->lgs || !e->rope_cs || !e->th_att || !e->xq ||
        !e->row_slot || !e->row_pos || !e->row_tab || !e->slot_ids || !e->th_off || !lq_ok) {
        snprintf(err, errlen, "cpu engine: out of memory (KV cache %.1f MB)", kv_floats * 8.0 / 1e6);
        goto fail;
    }
    if (c->has_qkv_bias) {
        e->bq = cpu_extra_floats(L * q_dim);
        e->bk = cpu_extra_floats(L * kv_dim);
        e->bv = cpu_extra_floats(L * kv_dim);
        if (!e->bq || !e->bk || !e->bv) {
            snprintf(err, errlen, "cpu engine: out of memory");
            goto fail;
        }
    }
    for (size_t l = 0; l < L; l++) {
        const zl_layer_weights *lw = &m->layers[l];
        if (cpu_extra_vec(&lw->attn_norm, e->attn_norm + l * dim, err, errlen) ||
            cpu_extra_vec(&lw->ffn_norm, e->ffn_norm + l * dim, err, errlen))
            goto fail;
        if (c->has_qkv_bias && (cpu_extra_vec(&lw->bq, e->bq + l * q_dim, err, errlen) ||
                                cpu_extra_vec(&lw->bk, e->bk + l * kv_dim, err, errlen) ||
                                cpu_extra_vec(&lw->bv, e->bv + l * kv_dim, err, errlen)))
            goto fail;
    }
    if (cpu_extra_vec(&m->output_norm, e->out_norm, err, errlen)) goto fail;
    if (cpu_extra_load(&e->ex, m, e->base.n_ctx, T, err, errlen)) goto fail;
    e->pool = cpu_pool_new(e->nth, err, errlen);
    if (!e->pool) goto fail;
    return b;
fail:
    s_destroy(b);
    return NULL;
}
