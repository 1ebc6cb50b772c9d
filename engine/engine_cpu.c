/* engine/engine_cpu.c: the CPU reference backend (device "cpu-ref"; "cpu" is engine/cpu_fast.c): an f32 forward pass of
 * a Llama-family model (llama, qwen2, qwen3, phi3, gemma3; sliding windows per layer, engine/model.h) over a batch of
 * sequences at independent positions, with per-slot f32 KV caches. Weights stay in the file's type and are dequantized
 * row by row as the matrix-vector products read them.
 *
 * Batch invariance: every value a row produces depends only on that row (and its own slot's cache). Every
 * dot product runs in one fixed order (s_dot), matrix products are split over threads by output row only,
 * and nothing ever reduces across rows, so a sequence's logits are bitwise the same whatever shares its step.
 *
 * Step layout: the step's T = sum(n_tokens) token rows are stacked into [T][width] activations; each weight
 * row is dequantized once per step and applied to all T rows. Matrix products and attention run on a small
 * pool of pthreads (opts->threads); element-wise work stays on the calling thread. One engine serves one caller
 * at a time (steps are not reentrant); separate engines are independent. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu_extra.h"
#include "cpu_launch.h"
#include "cpu_sample.h"
#include "engine.h"
#include "sampler_mask.h"
#include "quant.h"
#include "rope.h"

#define S_MAX_THREADS 64
#define S_CHUNK_BYTES (64 * 1024) /* dequantized weight rows held per thread at once */

/* ------------------------------------------------------------------------------------------------------------
 * thread pool: run(fn) calls fn(ctx, ith, nth) on every thread (the caller is thread 0) and waits for all */

typedef void (*s_job_fn)(void *ctx, int ith, int nth);

typedef struct {
    pthread_mutex_t mu;            /* guards everything below */
    pthread_cond_t go;             /* signalled when gen advances or quit is set */
    pthread_cond_t done;           /* signalled when pending reaches 0 */
    int n_threads;                 /* including the caller */
    pthread_t tids[S_MAX_THREADS]; /* [n_threads - 1] workers */
    int n_started;                 /* workers created */
    s_job_fn fn;                   /* current job */
    void *ctx;                     /* its argument */
    uint64_t gen;                  /* job generation */
    int pending;                   /* workers still running the current job */
    int quit;                      /* 1: workers exit */
} s_pool;

typedef struct {
    s_pool *pool; /* owner */
    int ith;      /* this worker's index, >= 1 */
} s_worker_arg;

typedef struct {
    zl_engine base;                    /* public part; must stay first */
    zl_config c;                       /* copy of the model configuration */
    int nth;                           /* threads */
    s_pool pool;                       /* workers */
    s_worker_arg wargs[S_MAX_THREADS]; /* worker arguments */
    /* small weights dequantized to f32 at creation */
    float *attn_norm;    /* [n_layers][dim] */
    float *ffn_norm;     /* [n_layers][dim] */
    float *bq, *bk, *bv; /* [n_layers][q_dim] / [n_layers][kv_dim]; NULL without biases */
    float *out_norm;     /* [dim] */
    /* KV cache: [n_slots][n_own][n_ctx][kv_dim] each, n_own = layer_end - layer_begin (this stage's layers) */
    float *kc, *vc;
    /* step activations, sized for max_step_tokens rows */
    float *x;                /* [T][dim] residual stream */
    float *xb;               /* [T][max(dim, q_dim)] normed input / attention output */
    float *xb2;              /* [T][dim] projection output */
    float *q;                /* [T][q_dim] */
    float *k, *v;            /* [T][kv_dim] */
    float *hb, *hb2;         /* [T][ffn_dim] */
    float *xl;               /* [max_batch][dim] last rows, normed */
    float *lg;               /* [max_batch][vocab] logits */
    float *lgs;              /* [vocab] sampler scratch */
    int *row_slot, *row_pos; /* [T] slot and position of each row */
    const int32_t **row_tab; /* [T] block table of each row's sequence (cpu_kv_tab) */
    int32_t *slot_ids;       /* [n_slots] i at i: the one-block tables of contiguous slots */
    int kbs, n_kb;           /* rows per KV block (n_ctx for contiguous slots) and blocks (cpu_kv_shape) */
    float *rope_cs;          /* [T][rope_dim] cos/sin pairs per row (the global layers' RoPE) */
    cpu_extra ex;            /* RoPE tables and the qwen3/gemma3 per-layer vectors (cpu_extra.h) */
    float *th_att;           /* [nth][n_ctx] attention scores per thread */
    float *th_w;             /* [nth][chunk floats] dequantized weight rows per thread */
    size_t th_w_floats;      /* floats per thread in th_w */
    /* steps queued ahead (zl_engine.depth 2, whole models): this backend runs a launched step at once and
     * writes its results then; the wait only checks the order, so the caller's protocol is the one the CUDA
     * engine needs */
    cpu_launch lq; /* launch/wait, feeds and the slots' carries (cpu_launch.h) */
} s_cpu;

static void *s_worker(void *arg) {
    s_worker_arg *a = arg;
    s_pool *p = a->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        s_job_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, a->ith, p->n_threads);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void s_pool_run(s_pool *p, s_job_fn fn, void *ctx) {
    if (p->n_threads <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n_threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n_threads);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* [lo, hi) of n items for thread ith of nth */
static void s_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ------------------------------------------------------------------------------------------------------------
 * kernels */

/* the one dot product: 8 partial sums in a fixed order, independent of alignment and of the caller */
static float s_dot(const float *a, const float *b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + t;
}

static void s_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

typedef struct {
    s_cpu *e;           /* engine (thread scratch) */
    const zl_weight *w; /* [n_out rows][n_in] */
    const float *bias;  /* [n_out] or NULL */
    const float *x;     /* [T][n_in] */
    float *y;           /* [T][n_out] */
    int T;              /* rows */
    int err;            /* set by a thread when dequantization fails */
} s_matmul_job;

/* y[t][o] = dot(W[o], x[t]) (+ bias[o]) for this thread's share of output rows o */
static void s_matmul_fn(void *ctx, int ith, int nth) {
    s_matmul_job *j = ctx;
    const zl_weight *w = j->w;
    int64_t n_in = w->n_in, n_out = w->n_out, lo, hi;
    s_range(n_out, ith, nth, &lo, &hi);
    float *buf = j->e->th_w + (size_t)ith * j->e->th_w_floats;
    int64_t chunk = (int64_t)(j->e->th_w_floats / (size_t)n_in);
    if (chunk < 1) chunk = 1;
    for (int64_t o0 = lo; o0 < hi; o0 += chunk) {
        int64_t nr = hi - o0 < chunk ? hi - o0 : chunk;
        const float *rows;
        if (w->type == GGML_F32) {
            rows = (const float *)((const char *)w->data + (size_t)o0 * w->row_bytes);
        } else {
            for (int64_t r = 0; r < nr; r++) {
                const void *src = (const char *)w->data + (size_t)(o0 + r) * w->row_bytes;
                if (quant_dequant_row(w->type, src, buf + r * n_in, n_in) != 0) {
                    j->err = 1;
                    return;
                }
            }
            rows = buf;
        }
        for (int t = 0; t < j->T; t++) {
            const float *xt = j->x + (size_t)t * n_in;
            float *yt = j->y + (size_t)t * n_out;
            for (int64_t r = 0; r < nr; r++) {
                float s = s_dot(rows + r * n_in, xt, n_in);
                yt[o0 + r] = j->bias ? s + j->bias[o0 + r] : s;
            }
        }
    }
}

static int s_matmul(s_cpu *e, const zl_weight *w, const float *bias, const float *x, float *y, int T) {
    s_matmul_job j = {e, w, bias, x, y, T, 0};
    s_pool_run(&e->pool, s_matmul_fn, &j);
    if (j.err) snprintf(e->base.err, sizeof e->base.err, "cannot dequantize %s", w->name ? w->name : "?");
    return j.err ? -1 : 0;
}

/* rotates the leading rope_dim dims of each of n_heads heads of x (one row) with the row's cos/sin pairs */
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

/* the FFN's gate activation times up, in place in g */
static void s_glu(float *g, const float *u, size_t n, zl_ffn_act act) {
    if (act == ZL_ACT_GELU_TANH) {
        for (size_t i = 0; i < n; i++) {
            float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
        }
        return;
    }
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i]; /* SiLU(gate) * up */
}

typedef struct {
    s_cpu *e;  /* engine */
    int layer; /* layer index */
    int T;     /* rows */
} s_attn_job;

/* causal attention for this thread's share of (row, head) items; output into e->xb [T][q_dim] */
static void s_attn_fn(void *ctx, int ith, int nth) {
    s_attn_job *j = ctx;
    s_cpu *e = j->e;
    const zl_config *c = &e->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    size_t q_dim = (size_t)c->n_heads * hd, kv_dim = (size_t)c->n_kv_heads * hd;
    const int n_own = e->base.layer_end - e->base.layer_begin, li = j->layer - e->base.layer_begin;
    float *att = e->th_att + (size_t)ith * e->base.n_ctx;
    float scale = c->attn_scale;
    int window = model_layer_window(c, j->layer);
    int64_t lo, hi;
    s_range((int64_t)j->T * c->n_heads, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        int r = (int)(it / c->n_heads), h = (int)(it % c->n_heads), kvh = h / group;
        int pos = e->row_pos[r];
        int p0 = window > 0 && pos >= window ? pos - window + 1 : 0; /* the first key the row sees */
        const int32_t *tab = e->row_tab[r];
        const size_t base = (size_t)kvh * hd;
        const float *qh = e->q + (size_t)r * q_dim + (size_t)h * hd;
        float mx = -INFINITY;
        for (int p = p0; p <= pos; p++) {
            att[p] = s_dot(qh, e->kc + base + cpu_kv_at(tab, e->kbs, n_own, li, p, kv_dim), hd) * scale;
            if (att[p] > mx) mx = att[p];
        }
        float sum = 0.0f;
        for (int p = p0; p <= pos; p++) {
            att[p] = expf(att[p] - mx);
            sum += att[p];
        }
        float inv = 1.0f / sum;
        float *out = e->xb + (size_t)r * q_dim + (size_t)h * hd;
        for (int d = 0; d < hd; d++) out[d] = 0.0f;
        for (int p = p0; p <= pos; p++) {
            float a = att[p] * inv;
            const float *vp = e->vc + base + cpu_kv_at(tab, e->kbs, n_own, li, p, kv_dim);
            for (int d = 0; d < hd; d++) out[d] += a * vp[d];
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * step */


/* the forward pass over layers [layer_begin, layer_end): from tokens (h_in NULL, first stage) or from h_in, to
 * h_out (not the last stage) or to logits and sampled tokens (last stage) */
static int s_forward(zl_engine *eb, const zl_seq *seqs, int n, const float *h_in, float *h_out, int32_t *out_tokens,
                     float *out_logits, zl_logprobs *out_lp) {
    s_cpu *e = (s_cpu *)eb;
    const zl_model *m = eb->model;
    const zl_config *c = &e->c;
    int T;
    int embed = h_in == NULL;
    if (embed && eb->layer_begin != 0) {
        snprintf(eb->err, sizeof eb->err, "step: layers from %d need hidden states in", eb->layer_begin);
        return -1;
    }
    if (!h_out && eb->layer_end < c->n_layers) {
        snprintf(eb->err, sizeof eb->err, "step: layers up to %d need a hidden state buffer out", eb->layer_end);
        return -1;
    }
    if (cpu_launch_check(eb, seqs, n, embed, &T)) return -1;
    int dim = c->dim, hd = c->head_dim;
    size_t q_dim = (size_t)c->n_heads * hd, kv_dim = (size_t)c->n_kv_heads * hd;

    /* rows: embeddings, slot/pos, RoPE tables (double precision angles, then f32) */
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
        for (r = 0; r < T; r++)
            s_rmsnorm(e->xb + (size_t)r * dim, e->x + (size_t)r * dim, e->attn_norm + (size_t)l * dim, dim, c->rms_eps);
        if (s_matmul(e, &L->wq, e->bq ? e->bq + l * q_dim : NULL, e->xb, e->q, T) ||
            s_matmul(e, &L->wk, e->bk ? e->bk + l * kv_dim : NULL, e->xb, e->k, T) ||
            s_matmul(e, &L->wv, e->bv ? e->bv + l * kv_dim : NULL, e->xb, e->v, T))
            return -1;
        const float *cs_l = e->ex.rope_cs_swa && model_layer_window(c, l) ? e->ex.rope_cs_swa : e->rope_cs;
        for (r = 0; r < T; r++) {
            const float *cs = cs_l + (size_t)r * c->rope_dim;
            if (e->ex.q_norm) { /* per-head norms of q and k before RoPE */
                for (int h = 0; h < c->n_heads; h++) {
                    float *qh = e->q + r * q_dim + (size_t)h * hd;
                    s_rmsnorm(qh, qh, e->ex.q_norm + (size_t)l * hd, hd, c->rms_eps);
                }
                for (int h = 0; h < c->n_kv_heads; h++) {
                    float *kh = e->k + r * kv_dim + (size_t)h * hd;
                    s_rmsnorm(kh, kh, e->ex.k_norm + (size_t)l * hd, hd, c->rms_eps);
                }
            }
            s_rope(e->q + r * q_dim, c->n_heads, hd, c->rope_dim, c->rope_style, cs);
            s_rope(e->k + r * kv_dim, c->n_kv_heads, hd, c->rope_dim, c->rope_style, cs);
            size_t at = cpu_kv_at(e->row_tab[r], e->kbs, eb->layer_end - eb->layer_begin, l - eb->layer_begin,
                                  e->row_pos[r], kv_dim);
            memcpy(e->kc + at, e->k + r * kv_dim, kv_dim * sizeof(float));
            memcpy(e->vc + at, e->v + r * kv_dim, kv_dim * sizeof(float));
        }
        s_attn_job aj = {e, l, T};
        s_pool_run(&e->pool, s_attn_fn, &aj);
        if (s_matmul(e, &L->wo, NULL, e->xb, e->xb2, T)) return -1;
        if (e->ex.post_attn)
            for (r = 0; r < T; r++)
                s_rmsnorm(e->xb2 + (size_t)r * dim, e->xb2 + (size_t)r * dim, e->ex.post_attn + (size_t)l * dim, dim,
                          c->rms_eps);
        for (size_t i = 0; i < (size_t)T * dim; i++) e->x[i] += e->xb2[i];

        for (r = 0; r < T; r++)
            s_rmsnorm(e->xb + (size_t)r * dim, e->x + (size_t)r * dim, e->ffn_norm + (size_t)l * dim, dim, c->rms_eps);
        if (s_matmul(e, &L->w_gate, NULL, e->xb, e->hb, T) || s_matmul(e, &L->w_up, NULL, e->xb, e->hb2, T)) return -1;
        s_glu(e->hb, e->hb2, (size_t)T * c->ffn_dim, c->ffn_act);
        if (s_matmul(e, &L->w_down, NULL, e->hb, e->xb2, T)) return -1;
        if (e->ex.post_ffn)
            for (r = 0; r < T; r++)
                s_rmsnorm(e->xb2 + (size_t)r * dim, e->xb2 + (size_t)r * dim, e->ex.post_ffn + (size_t)l * dim, dim,
                          c->rms_eps);
        for (size_t i = 0; i < (size_t)T * dim; i++) e->x[i] += e->xb2[i];
    }

    if (eb->layer_end < c->n_layers) { /* a stage before the last: hand the residual stream on */
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
            if (s_matmul(e, &m->output, NULL, e->xl, e->lg, nr)) return -1;
            for (int j = 0; j < nr; j++)
                logprobs_prompt_row(e->lg + (size_t)j * c->vocab_size, c->vocab_size, s->plp_next[j0 + j], s->plp_top,
                                    &s->plp_out[j0 + j]);
        }
        r += s->n_tokens;
    }
    /* LM head on each sequence's last row only */
    r = 0;
    for (int i = 0; i < n; i++) {
        r += seqs[i].n_tokens;
        s_rmsnorm(e->xl + (size_t)i * dim, e->x + (size_t)(r - 1) * dim, e->out_norm, dim, c->rms_eps);
    }
    if (s_matmul(e, &m->output, NULL, e->xl, e->lg, n)) return -1;
    size_t V = (size_t)c->vocab_size;
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

static int s_launch(zl_engine *eb, const zl_step *st) { return cpu_launch_run(eb, &((s_cpu *)eb)->lq, st); }
static int s_wait(zl_engine *eb, const zl_step *st) { return cpu_launch_wait(eb, &((s_cpu *)eb)->lq, st); }

/* ------------------------------------------------------------------------------------------------------------
 * lifetime */

static void s_destroy(zl_engine *eb) {
    if (!eb) return;
    s_cpu *e = (s_cpu *)eb;
    s_pool *p = &e->pool;
    if (p->n_started > 0) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->tids[i], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    float *bufs[] = {e->attn_norm, e->ffn_norm, e->bq,  e->bk,      e->bv,     e->out_norm, e->kc, e->vc,
                     e->x,         e->xb,       e->xb2, e->q,       e->k,      e->v,        e->hb, e->hb2,
                     e->xl,        e->lg,       e->lgs, e->rope_cs, e->th_att, e->th_w};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    cpu_extra_free(&e->ex);
    free(e->row_slot);
    free(e->row_tab);
    free(e->slot_ids);
    free(e->row_pos);
    cpu_launch_free(&e->lq);
    free(e);
}

static int s_copy_block(zl_engine *eb, int src, int dst, int n_rows) {
    s_cpu *e = (s_cpu *)eb;
    const zl_config *c = &eb->model->cfg;
    return cpu_launch_copy_block(eb, e->kc, e->vc, (size_t)c->n_kv_heads * c->head_dim, src, dst, n_rows);
}

static int s_copy_kv(zl_engine *eb, int src, int dst, int n_tokens) {
    s_cpu *e = (s_cpu *)eb;
    const zl_config *c = &eb->model->cfg;
    return cpu_launch_copy_kv(eb, &e->lq, e->kc, e->vc, (size_t)c->n_kv_heads * c->head_dim, src, dst, n_tokens);
}

static const zl_engine_ops s_ops = {s_launch, s_wait, s_destroy, s_copy_kv};

/* n floats, zeroed; NULL when n overflows or memory is short (calloc leaves untouched pages unbacked) */
/* dequantizes vector w ([n]) into dst */
zl_engine *engine_cpu_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
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
    s_cpu *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "cpu engine: out of memory");
        return NULL;
    }
    pthread_mutex_init(&e->pool.mu, NULL);
    pthread_cond_init(&e->pool.go, NULL);
    pthread_cond_init(&e->pool.done, NULL);
    zl_engine *b = &e->base;
    b->ops = &s_ops;
    b->model = m;
    b->layer_begin = lb;
    b->layer_end = le;
    b->lanes = 1;
    b->masks = 1;
    b->caps = ZL_CAP_LOGPROBS | ZL_CAP_PENALTY | ZL_CAP_PROMPT_LOGPROBS;
    b->depth = lb == 0 && le == c->n_layers ? 2 : 1; /* steps queued ahead: whole models only (the sampler
                                                        * carries ids) */
    snprintf(b->device, sizeof b->device, "cpu-ref");
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
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    e->nth = o->threads ? o->threads : (ncpu > 0 ? (int)ncpu : 1);
    if (e->nth > S_MAX_THREADS) e->nth = S_MAX_THREADS;

    size_t L = (size_t)c->n_layers, L_own = (size_t)(le - lb), dim = (size_t)c->dim,
           q_dim = (size_t)c->n_heads * c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim, T = (size_t)b->max_step_tokens, V = (size_t)c->vocab_size;
    size_t ff = (size_t)c->ffn_dim, wide = dim > q_dim ? dim : q_dim;
    if (cpu_kv_shape(b, o, &e->kbs, &e->n_kb, err, errlen) != 0) goto fail;
    if (b->kv_block > 0) b->copy_block = s_copy_block;
    double kv_floats = (double)e->n_kb * L_own * e->kbs * kv_dim;
    if (kv_floats * 8.0 > 1e12) {
        snprintf(err, errlen, "cpu engine: KV cache of %.0f GB is too large", kv_floats * 8.0 / 1e9);
        goto fail;
    }
    size_t max_in = dim > q_dim ? dim : q_dim;
    if (ff > max_in) max_in = ff;
    e->th_w_floats = S_CHUNK_BYTES / sizeof(float) > max_in ? S_CHUNK_BYTES / sizeof(float) : max_in;
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
    e->th_w = cpu_extra_floats((size_t)e->nth * e->th_w_floats);
    e->row_slot = calloc(T, sizeof(int));
    e->row_tab = calloc(T, sizeof *e->row_tab);
    e->slot_ids = calloc((size_t)b->n_slots, sizeof *e->slot_ids);
    for (int i = 0; e->slot_ids && i < b->n_slots; i++) e->slot_ids[i] = i;
    e->row_pos = calloc(T, sizeof(int));
    const int lq_ok = cpu_launch_init(&e->lq, b->n_slots, b->max_batch, s_forward) == 0;
    if (!lq_ok) {
        snprintf(err, errlen, "cpu engine: out of memory");
        goto fail;
    }
    if (!e->attn_norm || !e->ffn_norm || !e->out_norm || !e->kc || !e->vc || !e->x || !e->xb || !e->xb2 || !e->q ||
        !e->k || !e->v || !e->hb || !e->hb2 || !e->xl || !e->lg || !e->lgs || !e->rope_cs || !e->th_att || !e->th_w ||
        !e->row_slot || !e->row_pos || !e->row_tab || !e->slot_ids) {
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

    e->pool.n_threads = e->nth;
    for (int i = 1; i < e->nth; i++) {
        e->wargs[i].pool = &e->pool;
        e->wargs[i].ith = i;
        if (pthread_create(&e->pool.tids[i - 1], NULL, s_worker, &e->wargs[i]) != 0) {
            snprintf(err, errlen, "cpu engine: cannot start thread %d", i);
            goto fail;
        }
        e->pool.n_started++;
    }
    return b;
fail:
    s_destroy(b);
    return NULL;
}
