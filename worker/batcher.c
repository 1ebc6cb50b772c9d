/* worker/batcher.c: continuous batching over an engine (see batcher.h).
 *
 * Scheduling, per step: every decoding sequence gets one token (decodes first, so inter-token latency does not
 * depend on other sequences' prompts), then prefilling sequences in admission order get prompt chunks from what
 * is left of the engine's max_step_tokens, up to max_batch entries. A chunk that completes the prompt samples the
 * first token in the same step. When more sequences run than max_batch allows, the start rotates so none starves.
 *
 * Slot buffer: toks[slot] holds the sequence's prompt followed by its generated tokens (len of them); n_past of
 * them are in the KV cache. A step feeds toks[n_past .. n_past + chunk), so prefill and decode are the same
 * operation (a decode feeds the last sampled token, chunk = 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"

typedef struct {
    int active;                    /* 1 while a sequence holds this slot */
    uint64_t rid;                  /* its broker id */
    uint64_t order;                /* admission counter, for FIFO prefill */
    int32_t *toks;                 /* [n_ctx] prompt then generated tokens (points into b->tok_buf) */
    int len;                       /* valid entries in toks */
    int n_prompt;                  /* prompt length */
    int n_past;                    /* tokens already in the KV cache */
    int n_gen;                     /* tokens generated */
    int max_tokens;                /* limit on n_gen */
    zl_sampling samp;              /* sampling parameters */
    uint64_t rng;                  /* generator state */
    int32_t stop_ids[WK_MAX_STOP_IDS]; /* extra stop ids */
    int n_stop_ids;                /* count of stop_ids */
    int ignore_eos;                /* 1: eog ids do not stop */
} s_slot;

struct wk_batcher {
    zl_engine *e;                  /* borrowed engine */
    int vocab;                     /* vocabulary size */
    uint8_t *eog;                  /* [vocab] 1 for end-of-generation ids */
    int n_slots;                   /* engine slots */
    int n_ctx;                     /* tokens per slot */
    s_slot *slots;                 /* [n_slots] */
    int32_t *tok_buf;              /* [n_slots][n_ctx] token storage */
    wk_event *pending;             /* [pending_cap] acknowledgements waiting for the next step's message */
    int n_pending;                 /* entries in pending */
    int pending_cap;               /* bound on pending (a broker flooding bad assignments loses the excess) */
    zl_seq *seqs;                  /* [max_batch] step entries */
    int *seq_slot;                 /* [max_batch] slot of each entry */
    int32_t *out_tok;              /* [max_batch] sampled ids */
    uint64_t order_next;           /* admission counter */
    int rotate;                    /* decode start offset when more decodes than max_batch */
    int prefill_cap;               /* most prompt tokens per step (batcher_set_prefill_cap) */
    int last_tokens;               /* tokens of the last step */
    int last_prefill;              /* of which prompt chunks (not decodes) */
    uint64_t steps;                /* steps run */
    uint64_t duplicates;           /* duplicate assignments ignored */
    uint64_t pending_dropped;      /* acknowledgements lost to a full pending queue */
};

wk_batcher *batcher_new(zl_engine *e, const uint8_t *eog, int vocab, char *err, size_t errlen) {
    wk_batcher *b = NULL;
    if (!e || !eog || vocab <= 0 || e->n_slots <= 0 || e->n_ctx <= 1 || e->max_batch <= 0 ||
        e->max_step_tokens <= 0) {
        snprintf(err, errlen, "batcher: bad arguments");
        return NULL;
    }
    b = calloc(1, sizeof *b);
    if (!b) goto oom;
    b->e = e;
    b->vocab = vocab;
    b->n_slots = e->n_slots;
    b->n_ctx = e->n_ctx;
    b->pending_cap = 2 * e->n_slots + 64;
    b->prefill_cap = e->max_step_tokens;
    b->eog = malloc((size_t)vocab);
    b->slots = calloc((size_t)b->n_slots, sizeof *b->slots);
    b->tok_buf = malloc((size_t)b->n_slots * (size_t)b->n_ctx * sizeof(int32_t));
    b->pending = calloc((size_t)b->pending_cap, sizeof *b->pending);
    b->seqs = calloc((size_t)e->max_batch, sizeof *b->seqs);
    b->seq_slot = calloc((size_t)e->max_batch, sizeof *b->seq_slot);
    b->out_tok = calloc((size_t)e->max_batch, sizeof *b->out_tok);
    if (!b->eog || !b->slots || !b->tok_buf || !b->pending || !b->seqs || !b->seq_slot || !b->out_tok) goto oom;
    memcpy(b->eog, eog, (size_t)vocab);
    for (int i = 0; i < b->n_slots; i++) b->slots[i].toks = b->tok_buf + (size_t)i * (size_t)b->n_ctx;
    return b;
oom:
    snprintf(err, errlen, "batcher: out of memory");
    batcher_destroy(&b);
    return NULL;
}

void batcher_destroy(wk_batcher **pb) {
    if (!pb || !*pb) return;
    wk_batcher *b = *pb;
    free(b->eog);
    free(b->slots);
    free(b->tok_buf);
    free(b->pending);
    free(b->seqs);
    free(b->seq_slot);
    free(b->out_tok);
    free(b);
    *pb = NULL;
}

/* queues an acknowledgement; a rid already pending is not queued twice (one entry per rid per message) */
static void s_pend(wk_batcher *b, uint64_t rid, int fin) {
    for (int i = 0; i < b->n_pending; i++)
        if (b->pending[i].rid == rid) return;
    if (b->n_pending >= b->pending_cap) {
        b->pending_dropped++;
        return;
    }
    b->pending[b->n_pending++] = (wk_event){rid, -1, fin};
}

static int s_find(const wk_batcher *b, uint64_t rid) {
    for (int i = 0; i < b->n_slots; i++)
        if (b->slots[i].active && b->slots[i].rid == rid) return i;
    return -1;
}

/* range checks of the sampling parameters; the sampler itself tolerates anything, but NaN would make a greedy
 * request random and a silent surprise is worse than a rejection */
static int s_sampling_ok(const zl_sampling *s) {
    return isfinite(s->temperature) && s->temperature >= 0 && s->top_k >= 0 && isfinite(s->top_p) &&
           s->top_p > 0 && s->top_p <= 1 && isfinite(s->min_p) && s->min_p >= 0 && s->min_p < 1 &&
           isfinite(s->repeat_penalty) && s->repeat_penalty > 0 && s->repeat_last_n >= 0;
}

int batcher_add(wk_batcher *b, const wk_request *r, char *err, size_t errlen) {
    if (s_find(b, r->rid) >= 0) {
        b->duplicates++;
        snprintf(err, errlen, "rid %llu is already running: duplicate ignored", (unsigned long long)r->rid);
        return 1;
    }
    if (!r->tokens || r->n_tokens < 1 || r->n_tokens >= b->n_ctx) {
        snprintf(err, errlen, "rid %llu: prompt of %d tokens does not fit a context of %d",
                 (unsigned long long)r->rid, r->n_tokens, b->n_ctx);
        goto reject;
    }
    if (r->max_tokens < 1) {
        snprintf(err, errlen, "rid %llu: max_tokens %d < 1", (unsigned long long)r->rid, r->max_tokens);
        goto reject;
    }
    if (r->n_stop_ids < 0 || r->n_stop_ids > WK_MAX_STOP_IDS || (r->n_stop_ids && !r->stop_ids)) {
        snprintf(err, errlen, "rid %llu: %d stop ids (at most %d)", (unsigned long long)r->rid, r->n_stop_ids,
                 WK_MAX_STOP_IDS);
        goto reject;
    }
    for (int i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= b->vocab) {
            snprintf(err, errlen, "rid %llu: token %d at %d outside the vocabulary of %d",
                     (unsigned long long)r->rid, (int)r->tokens[i], i, b->vocab);
            goto reject;
        }
    if (!s_sampling_ok(&r->samp)) {
        snprintf(err, errlen, "rid %llu: sampling parameters out of range", (unsigned long long)r->rid);
        goto reject;
    }
    int slot = -1;
    for (int i = 0; i < b->n_slots; i++)
        if (!b->slots[i].active) {
            slot = i;
            break;
        }
    if (slot < 0) {
        snprintf(err, errlen, "rid %llu: no free slot (%d running)", (unsigned long long)r->rid, b->n_slots);
        goto reject;
    }
    s_slot *s = &b->slots[slot];
    s->active = 1;
    s->rid = r->rid;
    s->order = b->order_next++;
    memcpy(s->toks, r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
    s->len = s->n_prompt = r->n_tokens;
    s->n_past = 0;
    s->n_gen = 0;
    s->max_tokens = r->max_tokens;
    s->samp = r->samp;
    s->rng = sampler_rng_init(r->samp.seed);
    s->n_stop_ids = r->n_stop_ids;
    if (r->n_stop_ids) memcpy(s->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
    s->ignore_eos = r->ignore_eos;
    return 0;
reject:
    s_pend(b, r->rid, WK_FIN_ERROR);
    return -1;
}

int batcher_cancel(wk_batcher *b, uint64_t rid) {
    int i = s_find(b, rid);
    if (i < 0) return 0;
    b->slots[i].active = 0;
    s_pend(b, rid, WK_FIN_CANCELLED);
    return 1;
}

void batcher_clear(wk_batcher *b) {
    for (int i = 0; i < b->n_slots; i++) b->slots[i].active = 0;
    b->n_pending = 0;
}

void batcher_set_prefill_cap(wk_batcher *b, int tokens) {
    if (tokens < 1) tokens = 1;
    if (tokens > b->e->max_step_tokens) tokens = b->e->max_step_tokens;
    b->prefill_cap = tokens;
}

int batcher_last_step_tokens(const wk_batcher *b) { return b->last_tokens; }
int batcher_last_prefill_tokens(const wk_batcher *b) { return b->last_prefill; }
int batcher_prefill_cap(const wk_batcher *b) { return b->prefill_cap; }

int batcher_running(const wk_batcher *b) {
    int n = 0;
    for (int i = 0; i < b->n_slots; i++) n += b->slots[i].active;
    return n;
}

int batcher_free_slots(const wk_batcher *b) { return b->n_slots - batcher_running(b); }
int batcher_event_cap(const wk_batcher *b) { return b->n_slots + b->pending_cap; }
uint64_t batcher_steps(const wk_batcher *b) { return b->steps; }
uint64_t batcher_duplicates(const wk_batcher *b) { return b->duplicates; }

int batcher_rids(const wk_batcher *b, uint64_t *rids, int cap) {
    int n = 0;
    for (int i = 0; i < b->n_slots && n < cap; i++)
        if (b->slots[i].active) rids[n++] = b->slots[i].rid;
    return n;
}

/* the finish code for slot s after it got token t */
static int s_finish(const wk_batcher *b, const s_slot *s, int32_t t) {
    if (!s->ignore_eos && b->eog[t]) return WK_FIN_STOP;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) return WK_FIN_STOP;
    if (s->n_gen >= s->max_tokens) return WK_FIN_LENGTH;
    /* the next decode would write toks[len] and need KV position len - 1 + 1 <= n_ctx: stop while both fit */
    if (s->len >= b->n_ctx) return WK_FIN_LENGTH;
    return WK_FIN_NONE;
}

/* adds slot i to the step as entry n with a chunk of at most budget tokens; returns the tokens taken */
static int s_entry(wk_batcher *b, int i, int n, int budget) {
    s_slot *s = &b->slots[i];
    int chunk = s->len - s->n_past;
    if (chunk > budget) chunk = budget;
    zl_seq *q = &b->seqs[n];
    q->slot = i;
    q->pos = s->n_past;
    q->n_tokens = chunk;
    q->tokens = s->toks + s->n_past;
    q->sample = s->n_past + chunk == s->len;
    q->samp = &s->samp;
    q->history = s->toks;
    q->n_history = s->n_past + chunk;
    q->rng = &s->rng;
    b->seq_slot[n] = i;
    return chunk;
}

int batcher_step(wk_batcher *b, wk_event *ev, int cap, int *n_ev, char *err, size_t errlen) {
    *n_ev = 0;
    if (cap < batcher_event_cap(b)) {
        snprintf(err, errlen, "batcher: event buffer of %d < %d", cap, batcher_event_cap(b));
        return -1;
    }
    int ne = 0;
    for (int i = 0; i < b->n_pending; i++) ev[ne++] = b->pending[i];
    b->n_pending = 0;
    zl_engine *e = b->e;
    int n = 0, budget = e->max_step_tokens;
    /* decodes first, rotating the start so that every decoding sequence gets its turn */
    for (int k = 0; k < b->n_slots && n < e->max_batch && budget > 0; k++) {
        int i = (k + b->rotate) % b->n_slots;
        s_slot *s = &b->slots[i];
        if (!s->active || s->len - s->n_past != 1) continue;
        budget -= s_entry(b, i, n++, 1);
    }
    b->rotate = (b->rotate + 1) % b->n_slots;
    /* then prefills, oldest admission first, within the prefill cap */
    if (budget > b->prefill_cap) budget = b->prefill_cap;
    int n_decode = n, budget0 = budget;
    while (n < e->max_batch && budget > 0) {
        int best = -1;
        for (int i = 0; i < b->n_slots; i++) {
            s_slot *s = &b->slots[i];
            if (!s->active || s->len - s->n_past <= 1) continue;
            int taken = 0;
            for (int j = 0; j < n; j++) taken |= b->seq_slot[j] == i;
            if (taken) continue;
            if (best < 0 || s->order < b->slots[best].order) best = i;
        }
        if (best < 0) break;
        budget -= s_entry(b, best, n++, budget);
    }
    if (n == 0) {
        *n_ev = ne;
        return 0;
    }
    b->last_prefill = n > n_decode ? budget0 - budget : 0;
    if (engine_step(e, b->seqs, n, b->out_tok, NULL) != 0) {
        snprintf(err, errlen, "%s", e->err);
        *n_ev = ne;
        return -1;
    }
    b->steps++;
    b->last_tokens = 0;
    for (int j = 0; j < n; j++) b->last_tokens += b->seqs[j].n_tokens;
    for (int j = 0; j < n; j++) {
        s_slot *s = &b->slots[b->seq_slot[j]];
        const zl_seq *q = &b->seqs[j];
        s->n_past += q->n_tokens;
        if (!q->sample) continue;
        int32_t t = b->out_tok[j];
        if (t < 0 || t >= b->vocab) {
            /* an engine that returns an impossible id is broken; end the sequence rather than index with it */
            ev[ne++] = (wk_event){s->rid, -1, WK_FIN_ERROR};
            s->active = 0;
            continue;
        }
        s->toks[s->len++] = t;
        s->n_gen++;
        int fin = s_finish(b, s, t);
        ev[ne++] = (wk_event){s->rid, t, fin};
        if (fin) s->active = 0;
    }
    *n_ev = ne;
    return 1;
}
