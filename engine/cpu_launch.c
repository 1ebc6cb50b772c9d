/* engine/cpu_launch.c: see cpu_launch.h. */
#include "cpu_launch.h"

#include <stdio.h>
#include <stdlib.h>

int cpu_launch_init(cpu_launch *l, int n_slots, int max_batch, cpu_forward_fn forward) {
    l->forward = forward;
    l->carry_tok = calloc((size_t)n_slots, sizeof(int32_t));
    l->carry_rng = calloc((size_t)n_slots, sizeof(uint64_t));
    l->carry_ok = calloc((size_t)n_slots, 1);
    l->fseq = calloc((size_t)max_batch, sizeof(zl_seq));
    l->ftok = calloc((size_t)max_batch, sizeof(int32_t));
    l->frng = calloc((size_t)max_batch, sizeof(uint64_t));
    l->q_head = l->q_count = l->q_sync = 0;
    return l->carry_tok && l->carry_rng && l->carry_ok && l->fseq && l->ftok && l->frng ? 0 : -1;
}

void cpu_launch_free(cpu_launch *l) {
    free(l->carry_tok);
    free(l->carry_rng);
    free(l->carry_ok);
    free(l->fseq);
    free(l->ftok);
    free(l->frng);
    l->carry_tok = NULL;
    l->carry_rng = NULL;
    l->carry_ok = NULL;
    l->fseq = NULL;
    l->ftok = NULL;
    l->frng = NULL;
}

int cpu_launch_check(zl_engine *b, const zl_seq *seqs, int n, int need_tokens, int *T_out) {
    if (!seqs || n < 1 || n > b->max_batch) {
        snprintf(b->err, sizeof b->err, "step: %d sequences (1..%d allowed)", n, b->max_batch);
        return -1;
    }
    int64_t T = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (s->slot < 0 || s->slot >= b->n_slots) {
            snprintf(b->err, sizeof b->err, "step: seq %d: slot %d out of range [0, %d)", i, s->slot, b->n_slots);
            return -1;
        }
        for (int k = 0; k < i; k++)
            if (seqs[k].slot == s->slot) {
                snprintf(b->err, sizeof b->err, "step: slot %d appears twice", s->slot);
                return -1;
            }
        if (s->feed) { /* resolved by the fed step before this check; a stage or a step without ids has none */
            snprintf(b->err, sizeof b->err, "step: seq %d: feed is served only by a whole model's step with ids", i);
            return -1;
        }
        if (s->n_tokens < 1 || s->pos < 0 || (need_tokens && !s->tokens) || (int64_t)s->pos + s->n_tokens > b->n_ctx) {
            snprintf(b->err, sizeof b->err, "step: seq %d: pos %d + %d tokens outside the context of %d", i, s->pos,
                     s->n_tokens, b->n_ctx);
            return -1;
        }
        if (b->kv_block > 0) { /* paged KV: every block the entry touches is in the pool */
            if (!s->blocks) {
                snprintf(b->err, sizeof b->err, "step: seq %d: paged KV needs a block table", i);
                return -1;
            }
            for (int k = 0, nb = (s->pos + s->n_tokens + b->kv_block - 1) / b->kv_block; k < nb; k++)
                if (s->blocks[k] < 0 || s->blocks[k] >= b->kv_blocks) {
                    snprintf(b->err, sizeof b->err, "step: seq %d: block %d is %d, outside [0, %d)", i, k,
                             (int)s->blocks[k], b->kv_blocks);
                    return -1;
                }
        }
        for (int t = 0; need_tokens && t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= b->model->cfg.vocab_size) {
                snprintf(b->err, sizeof b->err, "step: seq %d: token %d out of vocabulary", i, (int)s->tokens[t]);
                return -1;
            }
        if (s->mask_late) { /* the CPU engines run a step at its launch: a mask must come with it */
            snprintf(b->err, sizeof b->err, "step: seq %d: a late mask needs an engine that takes them (masks_late)",
                     i);
            return -1;
        }
        int greedy = !s->samp || !(s->samp->temperature > 0.0f);
        if (s->sample && !greedy && !s->rng) {
            snprintf(b->err, sizeof b->err, "step: seq %d samples with temperature but has no rng state", i);
            return -1;
        }
        if (s->n_bias < 0 || s->n_bias > ZL_MAX_LOGIT_BIAS || (s->n_bias && !s->bias) || s->history_prompt < 0 ||
            (s->samp && (s->samp->top_logprobs < 0 || s->samp->top_logprobs > ZL_MAX_TOP_LOGPROBS))) {
            snprintf(b->err, sizeof b->err,
                     "step: seq %d: logit bias (%d entries), history_prompt (%d) or top_logprobs (%d) out of range", i,
                     s->n_bias, s->history_prompt, s->samp ? s->samp->top_logprobs : 0);
            return -1;
        }
        if (s->plp_rows < 0 || s->plp_rows > s->n_tokens ||
            (s->plp_rows && (!s->plp_next || !s->plp_out || s->plp_top < 0 || s->plp_top > ZL_MAX_TOP_LOGPROBS))) {
            snprintf(b->err, sizeof b->err, "step: seq %d: prompt logprobs of %d rows (top %d) out of range", i,
                     s->plp_rows, s->plp_top);
            return -1;
        }
        for (int t = 0; t < s->plp_rows; t++)
            if (s->plp_next[t] < 0 || s->plp_next[t] >= b->model->cfg.vocab_size) {
                snprintf(b->err, sizeof b->err, "step: seq %d: prompt logprob id %d out of vocabulary", i,
                         (int)s->plp_next[t]);
                return -1;
            }
        T += s->n_tokens;
    }
    if (T > b->max_step_tokens) {
        snprintf(b->err, sizeof b->err, "step: %lld tokens exceed max_step_tokens %d", (long long)T,
                 b->max_step_tokens);
        return -1;
    }
    *T_out = (int)T;
    return 0;
}

/* a whole-model step with its feeds resolved (zl_seq.feed): fed entries read the slot's carried id and generator
 * state; afterwards every entry's slot carries what it sampled. 0, or -1 with e->err (nothing run, nothing
 * carried) */
static int s_step_fed(zl_engine *e, cpu_launch *l, const zl_seq *seqs, int n, int32_t *out_tokens, float *out_logits,
                      zl_logprobs *out_lp) {
    if (!seqs || n < 1 || n > e->max_batch || !out_tokens) {
        snprintf(e->err, sizeof e->err, "step: %d sequences (1..%d allowed) or no output", n, e->max_batch);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        l->fseq[i] = *s;
        if (!s->feed) continue;
        const zl_sampling *sp = s->samp;
        if (s->slot < 0 || s->slot >= e->n_slots || s->n_tokens != 1 || !l->carry_ok[s->slot] || s->plp_rows ||
            (sp && sp->repeat_penalty != 1.0f && sp->repeat_last_n > 0) || penalty_counts(sp)) {
            snprintf(e->err, sizeof e->err,
                     "step: seq %d: a fed entry needs one token, a slot whose last step "
                     "sampled, no prompt logprobs and no repetition, presence or frequency penalty (slot %d)",
                     i, s->slot);
            return -1;
        }
        l->ftok[i] = l->carry_tok[s->slot];
        l->frng[i] = l->carry_rng[s->slot];
        l->fseq[i].tokens = &l->ftok[i];
        l->fseq[i].rng = &l->frng[i];
        l->fseq[i].history = NULL;
        l->fseq[i].n_history = 0;
        l->fseq[i].feed = 0;
    }
    if (l->forward(e, l->fseq, n, NULL, NULL, out_tokens, out_logits, out_lp) != 0) return -1;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        l->carry_ok[s->slot] = s->sample != 0;
        if (!s->sample) continue;
        l->carry_tok[s->slot] = out_tokens[i];
        const uint64_t st = s->feed ? l->frng[i] : (s->rng ? *s->rng : 0);
        l->carry_rng[s->slot] = st;
        if (s->feed && s->rng) *s->rng = st;
    }
    return 0;
}

int cpu_launch_run(zl_engine *e, cpu_launch *l, const zl_step *st) {
    if (!st) {
        snprintf(e->err, sizeof e->err, "launch: no step");
        return -1;
    }
    if (st->lane != 0) {
        snprintf(e->err, sizeof e->err, "launch: lane %d outside 0..0", st->lane);
        return -1;
    }
    if (st->h_dev || st->n_wait || st->n_record) {
        snprintf(e->err, sizeof e->err, "launch: device hidden states and events need the CUDA engine");
        return -1;
    }
    const int busy = l->q_count > 0 && (st->sync || st->out_logits || l->q_sync);
    if (l->q_count >= engine_depth(e) || busy) {
        snprintf(e->err, sizeof e->err, "launch: %d launched steps are not waited for", l->q_count);
        return -1;
    }
    const int whole = e->layer_begin == 0 && e->layer_end == e->model->cfg.n_layers;
    if (whole && !st->sync && !st->out_tokens) {
        snprintf(e->err, sizeof e->err, "launch: a queued step needs out_tokens");
        return -1;
    }
    if (whole && st->out_tokens) {
        if (s_step_fed(e, l, st->seqs, st->n, st->out_tokens, st->out_logits, st->out_logprobs) != 0) return -1;
    } else {
        if (l->forward(e, st->seqs, st->n, st->h_in, st->h_out, st->out_tokens, st->out_logits, st->out_logprobs) != 0)
            return -1;
        for (int i = 0; whole && i < st->n; i++) l->carry_ok[st->seqs[i].slot] = 0;
    }
    l->fl[(l->q_head + l->q_count) & 1] = st;
    l->q_count++;
    l->q_sync = st->sync != 0;
    return 0;
}

int cpu_launch_wait(zl_engine *e, cpu_launch *l, const zl_step *st) {
    if (l->q_count == 0 || !st || l->fl[l->q_head] != st) {
        snprintf(e->err, sizeof e->err, "%s",
                 l->q_count == 0 ? "wait: no launched step"
                                 : "wait: not the oldest launched step (wait in launch order)");
        return -1;
    }
    l->q_head ^= 1;
    l->q_count--;
    l->q_sync = 0;
    return 0;
}

int cpu_kv_shape(zl_engine *e, const zl_engine_opts *o, int *kbs, int *n_kb, char *err, size_t errlen) {
    e->kv_block = e->kv_blocks = 0;
    *kbs = e->n_ctx;
    *n_kb = e->n_slots;
    if (o->kv_block == 0) return 0;
    if (o->kv_block < 1 || o->kv_block > 256 || o->kv_blocks < 0 || o->kv_blocks > (1 << 24)) {
        snprintf(err, errlen, "cpu engine: KV blocks of %d rows (1..256), %d blocks: out of range", o->kv_block,
                 o->kv_blocks);
        return -1;
    }
    e->kv_block = *kbs = o->kv_block;
    e->kv_blocks = *n_kb = o->kv_blocks ? o->kv_blocks : e->n_slots * ((e->n_ctx + o->kv_block - 1) / o->kv_block);
    return 0;
}

int cpu_launch_copy_block(zl_engine *e, float *kc, float *vc, size_t kv_dim, int src, int dst, int n_rows) {
    if (e->kv_block <= 0 || src < 0 || src >= e->kv_blocks || dst < 0 || dst >= e->kv_blocks || src == dst ||
        n_rows < 0 || n_rows > e->kv_block) {
        snprintf(e->err, sizeof e->err, "copy_block: blocks %d -> %d, %d rows: out of range", src, dst, n_rows);
        return -1;
    }
    const int n_own = e->layer_end - e->layer_begin;
    const int32_t s = src, d = dst;
    for (int li = 0; li < n_own; li++) {
        const size_t so = cpu_kv_at(&s, e->kv_block, n_own, li, 0, kv_dim),
                     dd = cpu_kv_at(&d, e->kv_block, n_own, li, 0, kv_dim);
        memcpy(kc + dd, kc + so, (size_t)n_rows * kv_dim * sizeof(float));
        memcpy(vc + dd, vc + so, (size_t)n_rows * kv_dim * sizeof(float));
    }
    return 0;
}

int cpu_launch_copy_kv(zl_engine *e, cpu_launch *l, float *kc, float *vc, size_t kv_dim, int src, int dst,
                       int n_tokens) {
    if (e->kv_block > 0) {
        snprintf(e->err, sizeof e->err, "copy_kv: paged KV shares blocks instead");
        return -1;
    }
    if (src < 0 || src >= e->n_slots || dst < 0 || dst >= e->n_slots || src == dst || n_tokens < 0 ||
        n_tokens > e->n_ctx) {
        snprintf(e->err, sizeof e->err, "copy_kv: slots %d -> %d, %d tokens: out of range", src, dst, n_tokens);
        return -1;
    }
    const size_t n_own = (size_t)(e->layer_end - e->layer_begin), slot = n_own * (size_t)e->n_ctx * kv_dim;
    for (size_t li = 0; li < n_own; li++) {
        const size_t so = (size_t)src * slot + li * (size_t)e->n_ctx * kv_dim;
        const size_t d = (size_t)dst * slot + li * (size_t)e->n_ctx * kv_dim;
        memcpy(kc + d, kc + so, (size_t)n_tokens * kv_dim * sizeof(float));
        memcpy(vc + d, vc + so, (size_t)n_tokens * kv_dim * sizeof(float));
    }
    l->carry_ok[dst] = 0;
    return 0;
}
