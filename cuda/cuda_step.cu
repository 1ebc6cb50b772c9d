/* cuda/cuda_step.cu: one CUDA engine step around the forward pass (cu_engine.h): validation, input staging,
 * the flight that carries a launched step's results back, and the CUDA graphs of decode steps.
 * Staging: entries are reordered so that decode entries (one token) come first, one row each, then prefill
 * entries, each a run of consecutive rows. All per-step inputs are packed into one pinned host block and sent by
 * one cudaMemcpyAsync per part the step reads (one for a plain step: s_copy_ranges) on the copy stream cst
 * while the step before still runs (with two input blocks), so that
 * every kernel (eager or graph) reads them from fixed device addresses after the copy; only ids and the advanced
 * generator states come back (the sampler writes them into the flight's mapped memory), logits only when asked
 * for.
 * Graphs: decode-only steps replay a graph captured at start-up for the smallest bucket (1, 2, 4, 8, 16, 24, ...,
 * max_batch) that holds them; padded rows use the sentinel slot n_slots with kv_len 0. A whole model's graphs
 * hold the wait for late masks (graph_late): the value waited for travels in the input block (lwant), so steps
 * with and without late masks replay the same graphs.
 * Pipeline stages (worker/stage.h, docs/pipeline.md): a later stage reads its input rows through a gather kernel
 * and an earlier one writes its output rows through a scatter kernel; both take the buffer's address from the
 * step's input block (hptr) and the caller's row of every engine row from a permutation (perm), so the same
 * captured decode graph serves every transport buffer. a stage step's cross-process events (zl_step.wait_ev/record_ev) are
 * waited on the stream before the graph replay and recorded after it (not captured as graph nodes: the
 * transport has one event per ring slot). A stage that is not last does not synchronise: the next step only waits
 * (ev_in) for the previous step's input copy before rewriting the pinned input block.
 * Errors: any CUDA error fails the step with e->err naming it; the engine then refuses further steps (the device
 * state is unknown) and the caller must exit. */
extern "C" {
#include "sampler.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cu_engine.h"
#include "cuda_common.h"
#include "sample_mask.h"

/* 1 when entry s runs as a decode row (the split-K decode kernels, graphs): one token, not a prompt entry (a fed
 * entry always decodes). A 1-token prompt entry runs the prefill kernels as a run of one row, so that a prompt
 * position's KV has the same bits however its prompt was chunked (zl_seq.prompt) */
static int s_is_decode(const zl_seq *s) { return s->n_tokens == 1 && (!s->prompt || s->feed); }

/* 1 when entry s asks for more than an id: logprobs, a logit bias, presence/frequency penalties */
static int s_extras(const zl_seq *s) {
    return s->samp && (s->samp->logprobs || s->samp->presence_penalty != 0.0f || s->samp->frequency_penalty != 0.0f ||
                       s->n_bias > 0);
}

/* fills the logit bias and the distinct generated ids with their counts of ordered row k from entry s (NULL: none) */
static void s_stage_extras(cu_engine *E, int k, const zl_seq *s) {
    int32_t *bn = (int32_t *)(E->h_in + E->in.bias_n) + k, *gn = (int32_t *)(E->h_in + E->in.gen_n) + k;
    *bn = 0;
    *gn = 0;
    if (!s || !s->samp) return;
    const int nb = s->bias && s->n_bias > 0 ? (s->n_bias < ZL_MAX_LOGIT_BIAS ? s->n_bias : ZL_MAX_LOGIT_BIAS) : 0;
    int32_t *bid = (int32_t *)(E->h_in + E->in.bias_id) + (size_t)k * ZL_MAX_LOGIT_BIAS;
    float *bv = (float *)(E->h_in + E->in.bias_v) + (size_t)k * ZL_MAX_LOGIT_BIAS;
    for (int j = 0; j < nb; j++) bid[j] = s->bias[j].id, bv[j] = s->bias[j].bias;
    *bn = nb;
    if (!penalty_counts(s->samp) || !s->history || s->n_history <= s->history_prompt) return;
    /* counts in the zeroed scratch, in order of first appearance, then the scratch zeroed again */
    const int V = E->base.model->cfg.vocab_size;
    int32_t *gid = (int32_t *)(E->h_in + E->in.gen_id) + (size_t)k * CU_GEN;
    int32_t *gc = (int32_t *)(E->h_in + E->in.gen_cnt) + (size_t)k * CU_GEN;
    int n = 0;
    for (int i = s->history_prompt < 0 ? 0 : s->history_prompt; i < s->n_history; i++) {
        const int32_t id = s->history[i];
        if (id < 0 || id >= V) continue;
        if (E->h_gcount[id] == 0) {
            if (n == CU_GEN) continue; /* documented cap (CU_GEN) */
            E->h_gtouch[n++] = id;
        }
        E->h_gcount[id]++;
    }
    for (int j = 0; j < n; j++) {
        gid[j] = E->h_gtouch[j];
        gc[j] = E->h_gcount[E->h_gtouch[j]];
        E->h_gcount[E->h_gtouch[j]] = 0;
    }
    *gn = n;
}

/* fills the sampling part of ordered row k from entry s (NULL: a padded row, greedy, no history) */
static void s_stage_sampling(cu_engine *E, int k, const zl_seq *s) {
    zl_sampling *par = (zl_sampling *)(E->h_in + E->in.params) + k;
    uint64_t *rng = (uint64_t *)(E->h_in + E->in.rng) + k;
    int32_t *hl = (int32_t *)(E->h_in + E->in.hist_len) + k;
    int32_t *mo = (int32_t *)(E->h_in + E->in.mask_on) + k;
    int32_t *ml = (int32_t *)(E->h_in + E->in.mask_late_on) + k;
    *ml = s && s->mask && s->sample && s->mask_late; /* written to the flight's lmask after the launch */
    *mo = s && s->mask && s->sample && !s->mask_late;
    if (*mo)
        memcpy((uint32_t *)(E->h_in + E->in.mask) + (size_t)k * E->in.mask_words, s->mask,
               (size_t)E->in.mask_words * 4);
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

/* The parts of the input block a step reads, as ranges {offset, bytes} in block order: the core (with the
 * repetition penalty's history when a row uses it), the masks of the sampling rows when one has a mask, and the
 * first n_samp rows of each extras array when a row asks for them, and the prompt logprob rows' area when the step
 * has such rows. Ranges less than S_COPY_GAP apart are merged: one copy of a small gap costs less than one more
 * call. Returns their count (at most S_COPY_MAX). */
#define S_COPY_GAP ((size_t)64 << 10)
/* ranges at most: the core, the masks, six extras arrays, the prompt logprob rows, the paged KV tables */
#define S_COPY_MAX 11
static int s_copy_ranges(const cu_inputs *in, int n_samp, int need_hist, int need_mask, int extras, int n_plp,
                         size_t n_tab, size_t r[][2]) {
    const size_t rows = (size_t)n_samp;
    size_t want[S_COPY_MAX][2] = {{0, need_hist ? in->hist_end : in->core_end}};
    int n = 1;
    if (need_mask) want[n][0] = in->mask, want[n++][1] = rows * in->mask_words * 4;
    if (extras) {
        const size_t part[6][2] = {{in->bias_n, rows * 4},
                                   {in->bias_id, rows * ZL_MAX_LOGIT_BIAS * 4},
                                   {in->bias_v, rows * ZL_MAX_LOGIT_BIAS * 4},
                                   {in->gen_n, rows * 4},
                                   {in->gen_id, rows * CU_GEN * 4},
                                   {in->gen_cnt, rows * CU_GEN * 4}};
        for (int i = 0; i < 6; i++) want[n][0] = part[i][0], want[n++][1] = part[i][1];
    }
    if (n_plp) want[n][0] = in->plp_row, want[n++][1] = in->plp_end - in->plp_row; /* the prompt logprob rows */
    if (n_tab) want[n][0] = in->tab, want[n++][1] = n_tab * 4; /* paged KV: the tables up to the sentinel's */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && want[i][0] <= r[m - 1][0] + r[m - 1][1] + S_COPY_GAP) {
            r[m - 1][1] = want[i][0] + want[i][1] - r[m - 1][0];
            continue;
        }
        r[m][0] = want[i][0];
        r[m++][1] = want[i][1];
    }
    return m;
}

/* copies the ranges of the staged input block to the device block on stream s */
static cudaError_t s_copy_in(const cu_engine *E, size_t r[][2], int n, cudaStream_t s) {
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < n && ce == cudaSuccess; i++)
        ce = cudaMemcpyAsync(E->d_in + r[i][0], E->h_in + r[i][0], r[i][1], cudaMemcpyHostToDevice, s);
    return ce;
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

/* s_fail_step for a failed input copy, naming the CUDA error */
static void s_fail_copy(cu_engine *E, const zl_seq *seqs, int n) {
    char what[160];
    snprintf(what, sizeof what, "input copy failed (%s)", cudaGetErrorString(cudaGetLastError()));
    s_fail_step(E, seqs, n, what);
}

/* One step of layers [layer_begin, layer_end) (the whole model for an engine without a range). h_in/h_out:
 * [T][dim] f32 hidden states in the caller's row order, device memory when dev is set, host memory otherwise
 * (staged through hbuf); h_in is used when layer_begin > 0, h_out when layer_end < n_layers. waits: events the
 * stream waits for after the input copy (h_in written, h_out free); recs: events recorded after the step's
 * kernels (h_in consumed, h_out written). A stage that is not last and gets device pointers returns without
 * synchronising. */
int cuda_step_run(cu_engine *E, const cu_step_req *r) {
    const zl_seq *seqs = r->seqs;
    const int n = r->n, dev = r->dev, n_waits = r->n_waits, n_recs = r->n_recs, launch = r->launch;
    const float *h_in = r->h_in;
    float *h_out = r->h_out;
    int32_t *out_tokens = r->out_tokens;
    float *out_logits = r->out_logits;
    zl_engine *base = &E->base;
    const zl_config *c = &base->model->cfg;
    const int embed = base->layer_begin == 0, last = base->layer_end == c->n_layers;
    char err[200];
    const size_t errlen = sizeof err;
    if (E->dead) { snprintf(base->err, sizeof base->err, "cuda engine unusable after an earlier device error"); return -1; }
    if (launch ? E->fl_count >= 2 || !embed || !last : E->fl_count > 0) {
        snprintf(base->err, sizeof base->err, launch ? (E->fl_count >= 2 ? "launch: 2 launched steps are not "
                 "waited for" : "launch: this engine runs a pipeline stage") :
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
    int total = 0, n_dec = 0, max_rows = 1, need_hist = 0, need_mask = 0, need_late = 0, extras = 0, n_plp = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (s->slot < 0 || s->slot >= base->n_slots || s->pos < 0 || s->n_tokens < 1 ||
            s->pos + s->n_tokens > base->n_ctx || (embed && !s->feed && !s->tokens)) {
            snprintf(base->err, sizeof base->err, "bad entry %d: slot %d pos %d n_tokens %d (n_slots %d, n_ctx %d)",
                     i, s->slot, s->pos, s->n_tokens, base->n_slots, base->n_ctx);
            return -1;
        }
        if (E->paged) { /* every block the entry touches is in the pool */
            const int nb = (s->pos + s->n_tokens + base->kv_block - 1) >> E->kv_lg;
            int bad = !s->blocks;
            for (int k = 0; !bad && k < nb; k++) bad = s->blocks[k] < 0 || s->blocks[k] >= base->kv_blocks;
            if (bad) {
                snprintf(base->err, sizeof base->err,
                         "entry %d: paged KV needs a block table of %d ids in [0, %d) (slot %d, pos %d)", i, nb,
                         base->kv_blocks, s->slot, s->pos);
                return -1;
            }
        }
        for (int j = 0; j < i; j++) if (seqs[j].slot == s->slot) {
            snprintf(base->err, sizeof base->err, "entries %d and %d share slot %d", j, i, s->slot);
            return -1;
        }
        if (s->feed &&
            (!embed || !last || s->n_tokens != 1 || !E->carry_ok[s->slot] ||
             (s->samp && s->samp->repeat_penalty != 1.0f && s->samp->repeat_last_n > 0) || penalty_counts(s->samp))) {
            snprintf(base->err, sizeof base->err,
                     "entry %d: a fed entry needs one token, a whole-model engine, a "
                     "slot whose last step sampled, and no repetition, presence or frequency penalty (slot %d)",
                     i, s->slot);
            return -1;
        }
        if (s_extras(s) && (!(base->caps & ZL_CAP_LOGPROBS) || s->n_bias < 0 || s->n_bias > ZL_MAX_LOGIT_BIAS ||
                            (s->n_bias && !s->bias) || s->history_prompt < 0)) {
            snprintf(base->err, sizeof base->err,
                     "entry %d: logprobs, logit bias or penalties this engine does not "
                     "serve, or out of range",
                     i);
            return -1;
        }
        extras |= s->sample && s_extras(s);
        if (s->plp_rows && (!(base->caps & ZL_CAP_PROMPT_LOGPROBS) || !embed || !last || s->feed || s->plp_rows < 0 ||
                            s->plp_rows > s->n_tokens || !s->plp_next || !s->plp_out || s->plp_top < 0 ||
                            s->plp_top > ZL_MAX_TOP_LOGPROBS)) {
            snprintf(base->err, sizeof base->err,
                     "entry %d: prompt logprobs (%d rows, top %d) this engine does not "
                     "serve, or out of range",
                     i, s->plp_rows, s->plp_top);
            return -1;
        }
        for (int t = 0; t < s->plp_rows; t++)
            if (s->plp_next[t] < 0 || s->plp_next[t] >= c->vocab_size) {
                snprintf(base->err, sizeof base->err, "entry %d: prompt logprob id %d out of range", i,
                         (int)s->plp_next[t]);
                return -1;
            }
        n_plp += s->plp_rows > 0 ? s->plp_rows : 0;
        for (int t = 0; embed && !s->feed && t < s->n_tokens; t++) if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab_size) {
            snprintf(base->err, sizeof base->err, "entry %d: token %d out of range", i, (int)s->tokens[t]);
            return -1;
        }
        E->crow[i] = total;   /* first row of entry i in the caller's order (h_in/h_out) */
        total += s->n_tokens;
        if (s_is_decode(s)) n_dec++;
        else if (s->n_tokens > max_rows) max_rows = s->n_tokens;
        if (s->samp && s->samp->repeat_penalty != 1.0f && s->samp->repeat_last_n > 0 && s->history) need_hist = 1;
        if (s->mask && s->sample && !s->mask_late) need_mask = 1;
        if (s->mask_late) {
            /* late masks: only a queued whole-model step (its sampling waits for engine_masks_ready, which the
             * caller can only give once launch has returned) */
            if (!s->mask || !s->sample || !launch || !base->masks_late) {
                snprintf(base->err, sizeof base->err,
                         "entry %d: a late mask needs a mask, a sampling entry and a "
                         "queued step of an engine that takes late masks",
                         i);
                return -1;
            }
            need_late = 1;
        }
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
    /* order: decode entries first (one row each), then prefill entries as runs of rows (1-token prompt entries too):
     * those that sample, then, unless the caller wants every entry's logits, those that do not (n_quiet: the
     * final norm, the LM head and the sampler skip them, so that a prompt chunk does not widen them) */
    int k = 0, n_quiet = 0;
    for (int i = 0; i < n; i++)
        if (s_is_decode(&seqs[i])) E->order[k++] = i;
    for (int i = 0; i < n; i++)
        if (!s_is_decode(&seqs[i]) && (seqs[i].sample || out_logits)) E->order[k++] = i;
    for (int i = 0; i < n; i++)
        if (!s_is_decode(&seqs[i]) && !seqs[i].sample && !out_logits) {
            E->order[k++] = i;
            n_quiet++;
        }
    const int n_pre = n - n_dec;
    /* decode-only steps replay a captured graph, except a step with extras or prompt logprob rows (the captured
     * graphs hold the plain sampler only), or with late masks when the graphs do not hold their wait (graph_late) */
    const int gi = (n_pre == 0 && E->n_buckets > 0 && (!need_late || E->graph_late) && !extras && !n_plp)
                       ? s_bucket_for(E, n)
                       : -1;
    const int n_samp = gi >= 0 ? E->bucket[gi] : n - n_quiet;
    int32_t *tok = (int32_t *)(E->h_in + E->in.tokens), *pos = (int32_t *)(E->h_in + E->in.pos);
    int32_t *slot = (int32_t *)(E->h_in + E->in.slot), *kvl = (int32_t *)(E->h_in + E->in.kv_len);
    int32_t *r0 = (int32_t *)(E->h_in + E->in.seq_row0), *nr = (int32_t *)(E->h_in + E->in.seq_rows);
    int32_t *ss = (int32_t *)(E->h_in + E->in.seq_slot), *sp0 = (int32_t *)(E->h_in + E->in.seq_pos0);
    int32_t *lastr = (int32_t *)(E->h_in + E->in.last_row), *perm = (int32_t *)(E->h_in + E->in.perm);
    int32_t *eslot = (int32_t *)(E->h_in + E->in.eslot);
    int32_t *prow = (int32_t *)(E->h_in + E->in.plp_row), *pnext = (int32_t *)(E->h_in + E->in.plp_next);
    int32_t *pk = (int32_t *)(E->h_in + E->in.plp_k);
    /* paged KV: each entry's table packed into tab in ordered-entry order; its offset is what the kernels take as
     * the slot of each of its rows (pslot) and of its prefill run (pseq) */
    int32_t *tab = (int32_t *)(E->h_in + E->in.tab), *pslot = (int32_t *)(E->h_in + E->in.pslot);
    int32_t *pseq = (int32_t *)(E->h_in + E->in.pseq);
    size_t n_tab = 0;
    int row = 0, prows = 0;
    for (k = 0; k < n; k++) {
        const zl_seq *s = &seqs[E->order[k]];
        const int toff = (int)n_tab;
        if (E->paged) {
            const int nb = (s->pos + s->n_tokens + base->kv_block - 1) >> E->kv_lg;
            memcpy(tab + n_tab, s->blocks, (size_t)nb * 4);
            n_tab += (size_t)nb;
            for (int t = 0; t < s->n_tokens; t++) pslot[row + t] = toff;
            if (k >= n_dec) pseq[k - n_dec] = toff;
        }
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
        for (int t = 0; t < s->plp_rows; t++, prows++) { /* rows [row - n_tokens, ...) in ordered-entry order */
            prow[prows] = row - s->n_tokens + t;
            pnext[prows] = s->plp_next[t];
            pk[prows] = s->plp_top;
        }
        lastr[k] = row - 1;
        eslot[k] = s->slot;
        s_stage_sampling(E, k, s);
        if (extras) s_stage_extras(E, k, s);
    }
    /* padded rows of a graph bucket: the sentinel slot (paged: the sentinel table, one block past the pool) at
     * position 0 with kv_len 0, greedy, no history */
    if (E->paged) tab[n_tab++] = base->kv_blocks;
    for (; k < n_samp; k++, row++) {
        if (E->paged) pslot[row] = (int)n_tab - 1;
        tok[row] = 0; pos[row] = 0; slot[row] = base->n_slots; kvl[k] = 0; lastr[k] = row; perm[row] = -1;
        eslot[k] = base->n_slots;
        s_stage_sampling(E, k, NULL);
    }
    /* the host-to-device copy of the per-step inputs, on the engine's stream: the kernels (or the graph) that
     * follow on the same stream see it complete; the pinned block is not rewritten before the step's final
     * synchronisation, so the asynchronous copy never reads a half-updated block */
    /* only what the step reads: a masked step the masks of its sampling rows (a row of a 262k vocabulary is
     * 32 KiB), a step with extras their first n_samp rows */
    size_t cr[S_COPY_MAX][2];
    const int n_cr = s_copy_ranges(&E->in, n_samp, need_hist, need_mask, extras, n_plp, n_tab, cr);
    /* late masks: the flight's flag value that releases this step's sampling (the flag is below it until the host
     * has written the masks: it holds the flight's previous value). Without late masks, the value the flag holds
     * now (the host only moves it forward): a graph's wait passes at once */
    f->late = need_late;
    f->late_ready = !need_late;
    if (need_late) {
        f->lseq++;
        *(uint32_t *)(E->h_in + E->in.lwant) = f->lseq;
    } else if (f->h_lflag) {
        *(uint32_t *)(E->h_in + E->in.lwant) = *f->h_lflag;
    }
    /* stage buffers: device pointers as given, host ones through hbuf (copied in here, out after the step) */
    const int stage_io = !embed || !last;
    unsigned long long *hp = (unsigned long long *)(E->h_in + E->in.hptr);
    hp[0] = (unsigned long long)(uintptr_t)(dev ? (const void *)h_in : (const void *)E->hbuf);
    hp[1] = (unsigned long long)(uintptr_t)(dev ? (void *)h_out : (void *)E->hbuf);
    if (E->n_inb == 2) {
        /* the copy on cst may run while the step before runs on st: it writes the other block */
        if (cudaEventRecord(f->ev0, E->st) != cudaSuccess || s_copy_in(E, cr, n_cr, E->cst) != cudaSuccess ||
            cudaEventRecord(E->ev_cp[E->cur_p], E->cst) != cudaSuccess ||
            cudaStreamWaitEvent(E->st, E->ev_cp[E->cur_p], 0) != cudaSuccess) {
            s_fail_copy(E, seqs, n);
            return -1;
        }
    } else if (cudaEventRecord(f->ev0, E->st) != cudaSuccess || s_copy_in(E, cr, n_cr, E->st) != cudaSuccess ||
               cudaEventRecord(E->ev_in, E->st) != cudaSuccess ||
               (stage_io && !dev && !embed &&
                cudaMemcpyAsync(E->hbuf, h_in, (size_t)total * c->dim * 4, cudaMemcpyHostToDevice, E->st) !=
                    cudaSuccess)) {
        s_fail_copy(E, seqs, n);
        return -1;
    }
    /* cross-process ordering: after the input copy (which reads only this process's pinned block), before the
     * kernels that read h_in or write h_out */
    for (int w = 0; w < n_waits; w++)
        if (cudaStreamWaitEvent(E->st, (cudaEvent_t)r->waits[w], 0) != cudaSuccess) {
            s_fail_step(E, seqs, n, "cudaStreamWaitEvent on a stage event failed");
            return -1;
        }
    if (n_plp && !f->d_plp) {
        s_fail_step(E, seqs, n, "prompt logprobs without their result buffer");
        return -1;
    }
    const cu_batch fb = {row, n_dec, n_pre, max_rows, n_samp, extras, need_mask, n_plp};
    E->step_late = need_late;
    E->cur_fl = f;
    if (gi >= 0) {
        const cudaError_t ce = cudaGraphLaunch(E->gexec[E->cur_p][gi], E->st);
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "cudaGraphLaunch(bucket %d): %s", E->bucket[gi], cudaGetErrorString(ce));
            s_fail_step(E, seqs, n, err);
            return -1;
        }
    } else if (cuda_forward(E, &fb, err, errlen) != 0) {
        s_fail_step(E, seqs, n, err);
        return -1;
    }
    for (int i = 0; i < n_recs; i++)
        if (cudaEventRecord((cudaEvent_t)r->recs[i], E->st) != cudaSuccess) {
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
    f->lps = extras ? r->out_logprobs : NULL;
    E->fl_count++;
    E->in_pending = E->n_inb == 1;   /* the next step waits for this one's input copy (ev_in) before rewriting h_in */
    return launch ? 0 : cuda_step_collect(E, out_tokens);
}

int cuda_step_collect(cu_engine *E, int32_t *out_tokens) {
    zl_engine *base = &E->base;
    if (E->fl_count == 0 || !out_tokens) {
        snprintf(base->err, sizeof base->err, "wait: no launched step (or no output)");
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
        if (f->lps && f->h_lp && seqs[i].sample && seqs[i].samp && seqs[i].samp->logprobs) f->lps[i] = f->h_lp[k];
    }
    /* prompt logprobs, in ordered-entry order as staged */
    for (int k = 0, off = 0; k < n; k++) {
        const zl_seq *s = &seqs[f->order[k]];
        if (s->plp_rows <= 0 || !f->h_plp) continue;
        memcpy(s->plp_out, f->h_plp + off, (size_t)s->plp_rows * sizeof(zl_logprobs));
        off += s->plp_rows;
    }
    return 0;
}

static size_t s_align(size_t o) { return (o + 255) & ~(size_t)255; }

void cuda_step_layout(cu_inputs *in, int max_tok, int max_batch, int vocab, size_t max_tab) {
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
    in->mask_on = o;
    o = s_align(o + (size_t)max_batch * 4);
    in->mask_late_on = o;
    o = s_align(o + (size_t)max_batch * 4);
    in->lwant = o;
    o = s_align(o + 4);
    in->pslot = o;
    o = s_align(o + (size_t)max_tok * 4);
    in->pseq = o;
    o = s_align(o + (size_t)max_batch * 4);
    in->core_end = o;
    in->hist = o;     o = s_align(o + (size_t)max_batch * CU_HIST * 4);
    in->hist_end = o;
    in->mask_words = sample_mask_words(vocab);
    in->mask = o;
    o = s_align(o + (size_t)max_batch * in->mask_words * 4);
    in->mask_end = o;
    in->bias_n = o;
    o = s_align(o + (size_t)max_batch * 4);
    in->bias_id = o;
    o = s_align(o + (size_t)max_batch * ZL_MAX_LOGIT_BIAS * 4);
    in->bias_v = o;
    o = s_align(o + (size_t)max_batch * ZL_MAX_LOGIT_BIAS * 4);
    in->gen_n = o;
    o = s_align(o + (size_t)max_batch * 4);
    in->gen_id = o;
    o = s_align(o + (size_t)max_batch * CU_GEN * 4);
    in->gen_cnt = o;
    o = s_align(o + (size_t)max_batch * CU_GEN * 4);
    in->plp_row = o;
    o = s_align(o + (size_t)max_tok * 4);
    in->plp_next = o;
    o = s_align(o + (size_t)max_tok * 4);
    in->plp_k = o;
    o = s_align(o + (size_t)max_tok * 4);
    in->plp_end = o;
    in->tab = o;
    o = s_align(o + max_tab * 4);
    in->total = o;
}

/* Captures one CUDA graph per decode bucket. Done last, when every buffer exists, because a graph records the
 * device addresses it was captured with. Capture records without executing; the input block was zeroed at
 * allocation, so nothing recorded ever reads uninitialised memory. */
int cuda_step_capture_graphs(cu_engine *E, char *err, size_t errlen) {
    const int mb = E->base.max_batch;
    int nb = 0;
    E->graph_late = E->base.masks_late && E->n_inb == 2 && E->fl[0].d_lflag && E->fl[1].d_lflag;
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
            const cu_batch fb = {B, B, 0, 1, B, 0, 1, 0};
            E->step_late = E->graph_late; /* flight p's flag and late masks (n_inb 2: block p is flight p's) */
            if (cuda_forward(E, &fb, err, errlen) != 0) {
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
    E->step_late = 0;
    CU_CHECK(cudaStreamSynchronize(E->st));
    return 0;
fail:
    E->step_late = 0;
    return -1;
}

