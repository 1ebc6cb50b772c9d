/* cuda/test_logprobs.cu: the GPU logit bias / presence-frequency penalties (cuda/bias_penalty.cu) and logprobs
 * (cuda/logprob_top.cu) against the Python reference of OpenAI's definitions (tests/data/penalty_ref.bin, made by
 * tests/data/make_penalty_ref.py; the CPU's tests/test_penalty_ref.c reads the same file):
 *  - every penalized row bit for bit, on random logits with ties and -inf masks;
 *  - the logprob of the sampled id and the top k within 1e-6 of the float64 reference, ids exactly (ties by id);
 *  - batch invariance: each of 64 rows of a 32000-wide batch (different parameters per row) gives bit-identical
 *    logprobs alone and inside the batch, and equal to engine/logprobs.c's within 1e-6;
 *  - the repetition-penalized rows (pen_rows) are read where cuda/sample.cu applies the penalty, the logits
 *    elsewhere; rows that do not ask for logprobs are left untouched;
 *  - the CUDA engine on stories260K (zl_step.out_logprobs): with logprobs, a logit bias and presence/frequency
 *    penalties its ids equal the CPU reference engine's and its logprobs are within 1e-4 of them; an entry gives
 *    the same bits alone and inside a batch of 6; a slot whose prompt KV was copied (engine_copy_kv, the prefill
 *    shared by `n`) gives the bits of the slot that prefilled it;
 *  - raw rows (prompt logprobs: no params, a top k per row) equal to engine/logprobs.c's within 1e-6;
 *  - prompt logprobs (zl_seq.plp_rows) on the CUDA engine: each prompt row's logprob and 20 alternatives within 1e-4
 *    of the CPU reference engine's (ids equal but for near-ties), bit-identical alone, inside a batch with decode
 *    and other prefill entries (one with prompt logprobs too), and prefilled in chunks of 3 and of 7 tokens. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <algorithm>
#include <vector>
extern "C" {
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "test.h"
}
#include "bias_penalty.h"
#include "logprob_top.h"
#include "penalty_ref.h"
#include "test_util.cuh"

template <typename T> static T *dev_copy(const T *h, size_t n) {
    T *d = NULL;
    CUDA_OK(cudaMalloc(&d, (n ? n : 1) * sizeof(T)));
    if (n) CUDA_OK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void s_case(const penalty_case *c, int ci) {
    const int V = (int)c->vocab;
    /* distinct generated ids and their counts, as the CUDA step stages them */
    std::vector<int32_t> g(c->gen, c->gen + c->n_gen);
    std::sort(g.begin(), g.end());
    std::vector<int32_t> gid, gcnt;
    for (size_t i = 0; i < g.size();) {
        size_t j = i;
        while (j < g.size() && g[j] == g[i]) j++;
        gid.push_back(g[i]);
        gcnt.push_back((int32_t)(j - i));
        i = j;
    }
    zl_sampling P = sampler_defaults();
    P.presence_penalty = c->presence;
    P.frequency_penalty = c->frequency;
    P.logprobs = 1;
    P.top_logprobs = (int)c->k;
    int32_t nb = (int32_t)c->n_bias, ng = (int32_t)gid.size(), sampled = (int32_t)c->sampled;
    float *d_lg = dev_copy(c->logits, V), *d_out = NULL;
    CUDA_OK(cudaMalloc(&d_out, (size_t)V * 4));
    zl_sampling *d_par = dev_copy(&P, 1);
    int32_t *d_nb = dev_copy(&nb, 1), *d_bid = dev_copy(c->bias_id, c->n_bias), *d_ng = dev_copy(&ng, 1);
    float *d_b = dev_copy(c->bias, c->n_bias);
    int32_t *d_gid = dev_copy(gid.data(), gid.size()), *d_gc = dev_copy(gcnt.data(), gcnt.size());
    int32_t *d_s = dev_copy(&sampled, 1);
    zl_logprobs *d_lp = NULL;
    CUDA_OK(cudaMalloc(&d_lp, sizeof(zl_logprobs)));
    penalty_params pp = {};
    pp.logits = d_lg;
    pp.out = d_out;
    pp.n_rows = 1;
    pp.vocab = V;
    pp.params = d_par;
    pp.bias_n = d_nb;
    pp.bias_id = d_bid;
    pp.bias = d_b;
    pp.bias_stride = nb > 0 ? nb : 1;
    pp.gen_n = d_ng;
    pp.gen_id = d_gid;
    pp.gen_cnt = d_gc;
    pp.gen_stride = ng > 0 ? ng : 1;
    CUDA_OK(penalty_launch(&pp, 0));
    logprobs_params lp = {};
    lp.logits = d_out;
    lp.n_rows = 1;
    lp.vocab = V;
    lp.params = d_par;
    lp.sampled = d_s;
    lp.out = d_lp;
    CUDA_OK(logprobs_launch(&lp, 0));
    std::vector<float> out(V);
    zl_logprobs r;
    CUDA_OK(cudaMemcpy(out.data(), d_out, (size_t)V * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&r, d_lp, sizeof r, cudaMemcpyDeviceToHost));
    int diff = 0;
    for (int i = 0; i < V; i++) diff += memcmp(&out[i], &c->penalized[i], 4) != 0;
    CHECK(diff == 0, "case %d (V %d, p %g f %g, %u bias): %d penalized logits differ from the reference", ci, V,
          c->presence, c->frequency, c->n_bias, diff);
    CHECK(fabs(r.logprob - c->logprob) <= 1e-6 * (1 + fabs(c->logprob)), "case %d: logprob %.9g vs %.9g", ci, r.logprob,
          c->logprob);
    CHECK(r.n_top == (int)c->n_top, "case %d: %d alternatives, want %u", ci, r.n_top, c->n_top);
    int ids = 1, lps = 1;
    for (int j = 0; j < r.n_top && j < (int)c->n_top; j++) {
        ids &= r.top_id[j] == c->top_id[j];
        lps &= fabs(r.top_logprob[j] - c->top_lp[j]) <= 1e-6 * (1 + fabs(c->top_lp[j]));
    }
    CHECK(ids && lps, "case %d: top ids/logprobs differ from the reference", ci);
    cudaFree(d_lg), cudaFree(d_out), cudaFree(d_par), cudaFree(d_nb), cudaFree(d_bid), cudaFree(d_ng), cudaFree(d_b);
    cudaFree(d_gid), cudaFree(d_gc), cudaFree(d_s), cudaFree(d_lp);
}

/* 64 rows alone and together: bit-identical; equal to the CPU's within 1e-6; pen_rows read where the repetition
 * penalty applies; rows without logprobs untouched */
static void s_batch(void) {
    const int B = 64, V = 32000;
    std::vector<float> lg((size_t)B * V), pen((size_t)B * V);
    for (size_t i = 0; i < lg.size(); i++) {
        lg[i] = roundf((rnd_unit() * 12.0f - 6.0f) * 8.0f) / 8.0f; /* ties */
        pen[i] = lg[i] - 0.5f;
    }
    std::vector<zl_sampling> par(B);
    std::vector<int32_t> hl(B), sampled(B);
    for (int r = 0; r < B; r++) {
        par[r] = sampler_defaults();
        par[r].logprobs = r % 7 != 3;
        par[r].top_logprobs = r % 21;
        par[r].repeat_penalty = r % 5 == 0 ? 1.3f : 1.0f;
        par[r].repeat_last_n = 64;
        hl[r] = r % 10 == 0 ? 4 : 0;
        sampled[r] = (r * 997) % V;
    }
    float *d_lg = dev_copy(lg.data(), lg.size()), *d_pen = dev_copy(pen.data(), pen.size());
    zl_sampling *d_par = dev_copy(par.data(), B);
    int32_t *d_hl = dev_copy(hl.data(), B), *d_s = dev_copy(sampled.data(), B);
    zl_logprobs *d_all = NULL, *d_one = NULL;
    CUDA_OK(cudaMalloc(&d_all, B * sizeof(zl_logprobs)));
    CUDA_OK(cudaMalloc(&d_one, B * sizeof(zl_logprobs)));
    CUDA_OK(cudaMemset(d_all, 0x7f, B * sizeof(zl_logprobs)));
    CUDA_OK(cudaMemset(d_one, 0x7f, B * sizeof(zl_logprobs)));
    logprobs_params p = {};
    p.logits = d_lg;
    p.pen_rows = d_pen;
    p.hist_len = d_hl;
    p.n_rows = B;
    p.vocab = V;
    p.params = d_par;
    p.sampled = d_s;
    p.out = d_all;
    CUDA_OK(logprobs_launch(&p, 0));
    for (int r = 0; r < B; r++) { /* alone: a batch of one row at the row's own data */
        logprobs_params q = p;
        q.logits = d_lg + (size_t)r * V;
        q.pen_rows = d_pen + (size_t)r * V;
        q.hist_len = d_hl + r;
        q.n_rows = 1;
        q.params = d_par + r;
        q.sampled = d_s + r;
        q.out = d_one + r;
        CUDA_OK(logprobs_launch(&q, 0));
    }
    std::vector<zl_logprobs> all(B), one(B);
    CUDA_OK(cudaMemcpy(all.data(), d_all, B * sizeof(zl_logprobs), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(one.data(), d_one, B * sizeof(zl_logprobs), cudaMemcpyDeviceToHost));
    int same = 0, cpu_ok = 0, untouched = 0, asked = 0;
    for (int r = 0; r < B; r++) {
        if (!par[r].logprobs) {
            unsigned char ff[sizeof(zl_logprobs)];
            memset(ff, 0x7f, sizeof ff);
            untouched += !memcmp(&all[r], ff, sizeof ff);
            continue;
        }
        asked++;
        same += !memcmp(&all[r], &one[r], offsetof(zl_logprobs, top_id)) &&
                !memcmp(all[r].top_id, one[r].top_id, sizeof(int32_t) * all[r].n_top) &&
                !memcmp(all[r].top_logprob, one[r].top_logprob, sizeof(float) * all[r].n_top);
        const float *src = (hl[r] > 0 && par[r].repeat_penalty != 1.0f ? pen.data() : lg.data()) + (size_t)r * V;
        zl_logprobs ref;
        logprobs_compute(src, V, sampled[r], par[r].top_logprobs, &ref);
        int ok = fabs(ref.logprob - all[r].logprob) <= 1e-6 * (1 + fabs(ref.logprob)) && ref.n_top == all[r].n_top;
        for (int j = 0; ok && j < ref.n_top; j++)
            ok = ref.top_id[j] == all[r].top_id[j] &&
                 fabs(ref.top_logprob[j] - all[r].top_logprob[j]) <= 1e-6 * (1 + fabs(ref.top_logprob[j]));
        cpu_ok += ok;
    }
    CHECK(same == asked, "batch of 64: %d of %d rows bit-identical alone and in the batch", same, asked);
    CHECK(cpu_ok == asked, "batch of 64: %d of %d rows equal engine/logprobs.c's", cpu_ok, asked);
    CHECK(untouched == B - asked, "rows without logprobs untouched (%d of %d)", untouched, B - asked);
    cudaFree(d_lg), cudaFree(d_pen), cudaFree(d_par), cudaFree(d_hl), cudaFree(d_s), cudaFree(d_all), cudaFree(d_one);
}

/* raw rows (prompt logprobs: params NULL, top_k per row, pen_rows and hist_len ignored): every row computed, equal
 * to engine/logprobs.c's logprobs_prompt_row within 1e-6, ids exact */
static void s_raw(void) {
    const int B = 24, V = 5000;
    std::vector<float> lg((size_t)B * V);
    for (size_t i = 0; i < lg.size(); i++) lg[i] = roundf((rnd_unit() * 10.0f - 5.0f) * 4.0f) / 4.0f; /* ties */
    lg[7] = -INFINITY;                                                                           /* no candidate */
    std::vector<int32_t> k(B), next(B);
    for (int r = 0; r < B; r++) k[r] = r % 21, next[r] = r == 0 ? 7 : (r * 131) % V;
    float *d_lg = dev_copy(lg.data(), lg.size());
    int32_t *d_k = dev_copy(k.data(), B), *d_n = dev_copy(next.data(), B);
    zl_logprobs *d_out = NULL;
    CUDA_OK(cudaMalloc(&d_out, B * sizeof(zl_logprobs)));
    CUDA_OK(cudaMemset(d_out, 0x7f, B * sizeof(zl_logprobs)));
    logprobs_params p = {};
    p.logits = d_lg;
    p.pen_rows = d_lg; /* ignored without params */
    p.n_rows = B;
    p.vocab = V;
    p.top_k = d_k;
    p.sampled = d_n;
    p.out = d_out;
    CUDA_OK(logprobs_launch(&p, 0));
    std::vector<zl_logprobs> out(B);
    CUDA_OK(cudaMemcpy(out.data(), d_out, B * sizeof(zl_logprobs), cudaMemcpyDeviceToHost));
    int ok_rows = 0;
    for (int r = 0; r < B; r++) {
        zl_logprobs ref;
        logprobs_prompt_row(lg.data() + (size_t)r * V, V, next[r], k[r], &ref);
        int ok =
            (ref.logprob == out[r].logprob || fabs(ref.logprob - out[r].logprob) <= 1e-6 * (1 + fabs(ref.logprob))) &&
            ref.n_top == out[r].n_top;
        for (int j = 0; ok && j < ref.n_top; j++)
            ok = ref.top_id[j] == out[r].top_id[j] &&
                 fabs(ref.top_logprob[j] - out[r].top_logprob[j]) <= 1e-6 * (1 + fabs(ref.top_logprob[j]));
        ok_rows += ok;
    }
    CHECK(ok_rows == B, "raw rows (top_k per row, no params): %d of %d equal logprobs_prompt_row's", ok_rows, B);
    CHECK(out[0].logprob == -INFINITY, "a raw row's -inf id: logprob -inf (%g)", out[0].logprob);
    cudaFree(d_lg), cudaFree(d_k), cudaFree(d_n), cudaFree(d_out);
}

static zl_engine *s_engine_new(const zl_model *m, const char *dev) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = dev;
    o.n_slots = 8;
    o.max_batch = 8;
    o.n_ctx = 64;
    o.max_step_tokens = 64;
    o.kv_mem = (size_t)1 << 28;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new(%s): %s", dev, err);
    return e;
}

/* one synchronous step of n entries with logprobs out */
static int s_run(zl_engine *e, const zl_seq *q, int n, int32_t *tok, zl_logprobs *lp) {
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = q;
    st.n = n;
    st.sync = 1;
    st.out_tokens = tok;
    st.out_logprobs = lp;
    const int rc = engine_run(e, &st);
    CHECK(rc == 0, "step: %s", e->err);
    return rc;
}

static int s_same_lp(const zl_logprobs *a, const zl_logprobs *b) {
    return a->logprob == b->logprob && a->n_top == b->n_top &&
           !memcmp(a->top_id, b->top_id, sizeof(int32_t) * a->n_top) &&
           !memcmp(a->top_logprob, b->top_logprob, sizeof(float) * a->n_top);
}

/* path: a model file, NULL for stories260K. Bitwise checks (alone vs batched, copied KV) hold where every matrix
 * takes a batch-invariant path (qtc or wtc: 16-bit or quantized files, docs/cuda.md); an F32 file runs its products
 * through cuBLAS, which picks its algorithm by M, so there the batched entry is held to its ids and 1e-4. */
static void s_engine(const char *model) {
    char path[1100], err[256];
    if (model) snprintf(path, sizeof path, "%s", model);
    else snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m) return;
    zl_engine *g = s_engine_new(m, "cuda"), *c = s_engine_new(m, "cpu-ref");
    if (!g || !c) {
        engine_destroy(&g);
        engine_destroy(&c);
        model_destroy(&m);
        return;
    }
    CHECK((g->caps & ZL_CAP_LOGPROBS) && (g->caps & ZL_CAP_PENALTY) && g->ops->copy_kv, "the CUDA engine's caps");
    const int bitwise = m->layers[0].wq.type != GGML_F32;
    /* the prompt, then 5 "generated" tokens in the history: ids 260 and 299 repeat */
    const int32_t hist[12] = {1, 327, 260, 299, 472, 17, 375, 260, 299, 260, 408, 39};
    zl_sampling sp = sampler_defaults();
    sp.logprobs = 1;
    sp.top_logprobs = 8;
    sp.presence_penalty = 0.75f;
    sp.frequency_penalty = 0.5f;
    const zl_bias bias[3] = {{410, -3.0f}, {300, 2.5f}, {410, 0.25f}};
    zl_seq q;
    memset(&q, 0, sizeof q);
    q.slot = 0;
    q.n_tokens = 12;
    q.tokens = hist;
    q.sample = 1;
    q.samp = &sp;
    q.history = hist;
    q.n_history = 12;
    q.history_prompt = 7;
    q.bias = bias;
    q.n_bias = 3;
    int32_t tg[8], tc[8];
    zl_logprobs lg[8], lc[8];
    if (s_run(g, &q, 1, tg, lg) || s_run(c, &q, 1, tc, lc)) goto out;
    if (!bitwise) { /* a 16-bit file's activations are rounded on the GPU: held to its own bits below instead */
        int ok = tg[0] == tc[0] && fabsf(lg[0].logprob - lc[0].logprob) <= 1e-4f && lg[0].n_top == lc[0].n_top;
        for (int j = 0; ok && j < lc[0].n_top; j++)
            ok = lg[0].top_id[j] == lc[0].top_id[j] && fabsf(lg[0].top_logprob[j] - lc[0].top_logprob[j]) <= 1e-4f;
        CHECK(ok, "CUDA vs CPU with bias and penalties: id %d vs %d, logprob %g vs %g", tg[0], tc[0], lg[0].logprob,
              lc[0].logprob);
    }
    {
        /* the same entry at slot 3 inside a batch of 6 (other prompts, sampled, some with logprobs) */
        zl_seq b[6];
        zl_sampling o[6];
        int32_t ot[6][4];
        for (int i = 0; i < 6; i++) {
            o[i] = sampler_defaults();
            o[i].temperature = 0.8f;
            o[i].logprobs = i % 2;
            o[i].top_logprobs = i;
            for (int t = 0; t < 4; t++) ot[i][t] = 1 + (i * 31 + t * 7) % 500;
            memset(&b[i], 0, sizeof b[i]);
            static const int slots[6] = {4, 5, 6, 3, 7, 1};
            b[i].slot = slots[i];
            b[i].n_tokens = 4;
            b[i].tokens = ot[i];
            b[i].sample = 1;
            b[i].samp = &o[i];
            uint64_t *rng = (uint64_t *)malloc(8);
            *rng = sampler_rng_init((uint64_t)i);
            b[i].rng = rng;
        }
        free(b[3].rng);
        b[3] = q;
        b[3].slot = 3;
        if (s_run(g, b, 6, tg, lg) == 0 && !bitwise)
            CHECK(tg[3] == tc[0] && fabsf(lg[3].logprob - lc[0].logprob) <= 1e-4f, "in a batch: the CPU's id");
        zl_logprobs alone;
        int32_t ta;
        zl_seq a = q;
        a.slot = 2;
        if (s_run(g, &a, 1, &ta, &alone) == 0)
            CHECK(ta == tg[3] && (bitwise ? s_same_lp(&alone, &lg[3]) : fabsf(alone.logprob - lg[3].logprob) <= 1e-4f),
                  "an entry alone and inside a batch of 6: the same %s", bitwise ? "bits" : "id and logprob");
        for (int i = 0; i < 6; i++)
            if (i != 3) free(b[i].rng);
    }
    {
        /* copy_kv (n > 1 shares a prompt this way): slot 5 prefills all but the last token, its KV goes to slot 6;
         * the last token then runs in slot 5 and in slot 6 in one step: the copy gives the bits of the slot that
         * prefilled */
        zl_seq p = q;
        p.slot = 5;
        p.n_tokens = 11;
        p.sample = 0;
        int32_t t1;
        zl_logprobs l1, l2[2];
        if (s_run(g, &p, 1, &t1, &l1) == 0 && engine_copy_kv(g, 5, 6, 11) == 0) {
            zl_seq r[2] = {q, q};
            int32_t t2[2];
            for (int i = 0; i < 2; i++) {
                r[i].slot = 5 + i;
                r[i].pos = 11;
                r[i].n_tokens = 1;
                r[i].tokens = hist + 11;
            }
            if (s_run(g, r, 2, t2, l2) == 0)
                CHECK(t2[0] == t2[1] && s_same_lp(&l2[0], &l2[1]),
                      "a copied prompt KV gives the bits of the slot that prefilled");
        } else {
            CHECK(0, "copy_kv: %s", g->err);
        }
    }
out:
    engine_destroy(&g);
    engine_destroy(&c);
    model_destroy(&m);
}

/* prompt logprobs of PR[0..n) (rows scoring PR[1..n)) on engine e, slot `slot`, in chunks of `chunk` tokens, each
 * chunk's entry at index `at` of a step with `others` other entries (decodes and a prefill, one with prompt
 * logprobs) on slots 4..7; out[n - 1] */
static int s_prompt_run(zl_engine *e, const int32_t *PR, int n, int chunk, int slot, int others, zl_logprobs *out) {
    zl_sampling sp = sampler_defaults();
    zl_sampling so = sampler_defaults();
    so.temperature = 0.7f;
    static int32_t otok[4][8];
    static zl_logprobs oplp[4][8];
    static uint64_t orng[4];
    for (int done = 0; done < n;) {
        const int len = n - done < chunk ? n - done : chunk;
        zl_seq b[5];
        memset(b, 0, sizeof b);
        int k = 0;
        for (int i = 0; i < others; i++, k++) { /* other entries: 2 decodes, then prefills of 6 tokens */
            for (int t = 0; t < 8; t++) otok[i][t] = 2 + (i * 37 + t * 11 + done) % 400;
            orng[i] = sampler_rng_init((uint64_t)(i + 1));
            b[k].slot = 4 + i;
            b[k].pos = 0;
            b[k].n_tokens = i < 2 ? 1 : 6;
            b[k].tokens = otok[i];
            b[k].sample = 1;
            b[k].samp = &so;
            b[k].rng = &orng[i];
            if (i == 2) { /* a prefill with prompt logprobs of its own */
                b[k].plp_rows = 5;
                b[k].plp_top = 3;
                b[k].plp_next = otok[i] + 1;
                b[k].plp_out = oplp[i];
            }
        }
        zl_seq *q = &b[k++];
        q->slot = slot;
        q->pos = done;
        q->n_tokens = len;
        q->tokens = PR + done;
        q->sample = done + len == n;
        q->samp = &sp;
        q->plp_rows = done + len == n ? len - 1 : len; /* the last position scores nothing of the prompt */
        q->plp_top = 20;
        q->plp_next = PR + done + 1;
        q->plp_out = out + done;
        if (others) std::swap(b[0], b[k - 1]); /* the prompt's entry first, the others after it */
        int32_t tok[5];
        zl_logprobs lp[5];
        if (s_run(e, b, k, tok, lp)) return -1;
        done += len;
    }
    return 0;
}

/* model: as s_engine's (bitwise checks where every product is batch invariant, the CPU reference on F32 files) */
static void s_prompt(const char *model) {
    char path[1100], err[256];
    if (model) snprintf(path, sizeof path, "%s", model);
    else snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m) return;
    zl_engine *g = s_engine_new(m, "cuda"), *c = s_engine_new(m, "cpu-ref");
    if (g && c) {
        CHECK(g->caps & ZL_CAP_PROMPT_LOGPROBS, "the CUDA engine serves prompt logprobs");
        const int bitwise = m->layers[0].wq.type != GGML_F32;
        static const int32_t PR[20] = {1,  327, 260, 299, 472, 17,  375, 408, 39,  508,
                                       48, 186, 60,  61,  62,  300, 301, 17,  260, 299};
        const int n = 20;
        zl_logprobs ref[20], alone[20], batch[20], ch3[20], ch7[20];
        memset(ref, 0, sizeof ref);
        memset(alone, 0, sizeof alone);
        memset(batch, 0xA5, sizeof batch);
        memset(ch3, 0x5A, sizeof ch3);
        memset(ch7, 0x3C, sizeof ch7);
        if (s_prompt_run(c, PR, n, n, 0, 0, ref) == 0 && s_prompt_run(g, PR, n, n, 0, 0, alone) == 0 &&
            s_prompt_run(g, PR, n, n, 1, 3, batch) == 0 && s_prompt_run(g, PR, n, 3, 2, 0, ch3) == 0 &&
            s_prompt_run(g, PR, n, 7, 3, 3, ch7) == 0) {
            float worst = 0;
            int ids = 1, same_b = 1, same_3 = 1, same_7 = 1;
            for (int p = 0; p < n - 1; p++) {
                worst = fmaxf(worst, fabsf(alone[p].logprob - ref[p].logprob));
                ids &= alone[p].n_top == 20 && ref[p].n_top == 20;
                for (int j = 0; ids && j < 20; j++) {
                    worst = fmaxf(worst, fabsf(alone[p].top_logprob[j] - ref[p].top_logprob[j]));
                    ids &= alone[p].top_id[j] == ref[p].top_id[j] ||
                           fabsf(ref[p].top_logprob[j] - alone[p].top_logprob[j]) <= 1e-4f;
                }
                same_b &= s_same_lp(&alone[p], &batch[p]);
                same_3 &= s_same_lp(&alone[p], &ch3[p]);
                same_7 &= s_same_lp(&alone[p], &ch7[p]);
            }
            if (!bitwise) {
                CHECK(worst <= 1e-4f, "prompt logprobs: CUDA within 1e-4 of the CPU reference (max err %g)", worst);
                CHECK(ids, "prompt logprobs: 20 alternatives, the CPU reference's ids but for near-ties");
            } else {
                CHECK(same_b, "prompt logprobs alone and inside a batch with decodes and prefills: the same bits");
                CHECK(same_3, "prompt logprobs prefilled in chunks of 3: the same bits");
                CHECK(same_7, "prompt logprobs in chunks of 7 inside batches: the same bits");
            }
        }
    }
    engine_destroy(&g);
    engine_destroy(&c);
    model_destroy(&m);
}

/* argv[1]: the model of the engine checks (default stories260K; tests/run_gpu.sh adds a BF16 one) */
int main(int argc, char **argv) {
    s_rng = 12345;
    penalty_case *cases;
    int n = penalty_ref_load("tests/data/penalty_ref.bin", &cases);
    CHECK(n >= 30, "tests/data/penalty_ref.bin holds the reference cases (%d)", n);
    for (int i = 0; i < n; i++) s_case(&cases[i], i);
    penalty_ref_free(cases, n);
    s_batch();
    s_raw();
    s_engine(argc > 1 ? argv[1] : NULL);
    s_prompt(argc > 1 ? argv[1] : NULL);
    return test_report();
}
