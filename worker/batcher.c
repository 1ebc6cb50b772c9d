/* worker/batcher.c: continuous batching over an engine (see batcher.h).
 *
 * Scheduling, per step: every decoding sequence gets one token (decodes first, so inter-token latency does not
 * depend on other sequences' prompts), then prefilling sequences by priority, in admission order within one, get
 * prompt chunks from what is left of the engine's max_step_tokens, up to max_batch entries. While any sequence
 * decodes, the step budget (batcher_set_step_budget) bounds the step instead: prompt chunks get what the decodes
 * leave of it (at least a quarter of it), so that a long prompt is spread over several steps rather than stalling
 * every running stream for one long step; a prompt alone (nothing decoding), or one of a higher priority than every
 * decoding sequence, takes the engine's whole step (beside the decodes). A chunk
 * that completes the prompt samples the first token in the same step. When more sequences run than max_batch allows, the start rotates so none starves.
 * With lanes, all of this applies to one lane's step: its sequences only, its own rotation.
 *
 * Records: a sequence lives in a record (rec), which holds an engine KV slot (kv). toks holds the sequence's
 * prompt followed by its generated tokens (len of them); n_past of them are in the KV cache. A step feeds
 * toks[n_past .. n_past + chunk), so prefill and decode are the same operation (a decode feeds the last sampled
 * token, chunk = 1). There are 2 * n_slots records for n_slots KV slots: a sequence cancelled while its step is
 * in flight keeps its record and its KV slot until that step is collected (the engine still reads its tokens and
 * writes its KV slot and generator state), while the broker already counts the slot as free and may assign a
 * new sequence, which then waits in a record without a KV slot (kv = -1) and gets the first slot released. With
 * one lane nothing is ever in flight between calls, so only records [0, n_slots) are used and record i holds
 * KV slot i.
 *
 * Steps queued ahead (one lane over an engine whose launch is asynchronous, the default there; batcher_set_ahead
 * and zllm-worker --ahead forces it on or off): a step stays in flight between calls, and each call queues the next
 * step behind it before it waits for it, so the device goes from one step to the next without waiting for the
 * host. The next step cannot know the tokens the step
 * in flight will sample, so a sequence in flight whose entry samples continues with a fed entry (zl_seq.feed:
 * the engine takes the id its sampler left for the slot). That is a guess that the sequence goes on: when the
 * step in flight ends it (a stop id, end of generation, a cancel), the fed step's result for it is dropped and
 * its record and KV slot are released when that step is collected, as for a cancel in flight. The guess is not
 * made where the end is certain (max_tokens, the context) or where a fed entry is not allowed (the repetition
 * penalty, or a grammar over an engine without late masks: such a sequence waits for its token and runs in the
 * step after). A grammar sequence fed over an engine with late masks gets its fed entry's mask once the step in
 * flight is collected: the mask threads compute it while the device runs the fed step and the caller handles the
 * collected step's events, and batcher_masks_flush or the next batcher_step announces it (s_late_start,
 * s_late_finish). A prompt
 * whose chunk in flight does not sample goes on with its next chunk in the step queued behind (its tokens are
 * known). A record may then be in two steps in flight (inflight counts them), so records beyond n_slots are used
 * as with lanes. */
#include <math.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"
#include "cpu_pool.h"
#include "kv_hash.h"
#include "kv_table.h"
#include "phase_times.h"

typedef struct s_lane s_lane;
typedef struct wk_batcher wk_batcher;

/* one job of mask computations: the entries list[0..n) of lane L, taken in turn from next by the threads */
typedef struct {
    wk_batcher *b;
    s_lane *L;
    const int *list;
    int n;
    atomic_int next;
} s_mask_job;

typedef struct {
    int active;                    /* 1 while the record is used: a running sequence, or a cancelled one whose
                                    * step is still in flight (live 0) */
    int live;                      /* 1 while the sequence runs (not ended, not cancelled) */
    int kv;                        /* engine KV slot it holds, in [0, n_slots); -1 while waiting for one */
    int lane;                      /* lane its steps run in, [0, lanes) */
    int inflight;                  /* submitted, uncollected steps holding an entry for it (0..2: two only with
                                    * steps queued ahead) */
    int n_sched;                   /* tokens in the KV cache once the steps in flight are done (n_past + theirs) */
    int n_gen_sched;               /* tokens generated once the steps in flight are done (n_gen + theirs) */
    int last_sampled;              /* 1: its latest launched entry samples (a fed entry may follow it) */
    uint64_t rid;                  /* its broker id */
    uint64_t order;                /* admission counter, for FIFO prefill and slot hand-over */
    int priority;                  /* wk_request.priority: prefill and slot hand-over take higher first */
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
    zg_matcher *gm;                /* structured output: the grammar's state after the tokens so far, or NULL */
    uint32_t *mask;                /* [mask_words] its allowed ids for the entry being built (kept across uses) */
    zl_bias bias[ZL_MAX_LOGIT_BIAS]; /* logit bias */
    int n_bias;                      /* entries in bias */
    uint64_t share;                  /* rid whose prompt KV it waits to copy (wk_request.share); 0: none */
    int plp;                         /* wk_request.prompt_lp */
    int plp_top;                     /* wk_request.prompt_top */
    int plp_sent;                    /* prompt positions below it have had their logprobs sent (a preempted
                                      * sequence computes them again when it resumes: not sent twice) */
    kv_table kvt;                    /* its KV block table (block accounting, docs/kv-cache.md); empty without it */
    int resumed;                     /* 1 once preempted (paged): its admissions no longer count as prompts */
} s_rec;

struct s_lane {
    zl_seq *seqs;                  /* [max_batch] entries of the step being built or in flight (the engine reads
                                    * them until the collect) */
    int *seq_rec;                  /* [max_batch] record of each entry */
    int32_t *out_tok;              /* [max_batch] sampled ids (an engine without lanes writes them at the submit) */
    zl_logprobs *out_lp;           /* [max_batch] their logprobs (entries whose sequence asks for them) */
    zl_logprobs *plp;              /* [max_step_tokens] prompt logprobs of the step's rows (zl_seq.plp_out points
                                    * here), allocated with the first sequence that asks for them; NULL before */
    int plp_used;                  /* rows of plp taken by the step being built */
    zl_step st;                    /* the step in flight (engine_launch/engine_wait name it by this address) */
    int n;                         /* entries of the step in flight */
    int prefill;                   /* with ahead: its prompt tokens (batcher_last_prefill_tokens at its collect) */
    int busy;                      /* 1 while a step of this lane is submitted and not collected */
    uint64_t ord;                  /* that step's submission ordinal (collects go in submission order) */
    int rotate;                    /* decode start offset when more decodes than max_batch */
};

struct wk_batcher {
    zl_engine *e;                  /* borrowed engine */
    int vocab;                     /* vocabulary size */
    uint8_t *eog;                  /* [vocab] 1 for end-of-generation ids */
    int n_slots;                   /* engine KV slots */
    int n_ctx;                     /* tokens per slot */
    int n_rec;                     /* records: 2 * n_slots */
    int n_scan;                    /* records the decode rotation runs over: n_slots with 1 lane, else n_rec */
    s_rec *recs;                   /* [n_rec] */
    int32_t *tok_buf;              /* [n_rec][n_ctx] token storage */
    int *kv_rec;                   /* [n_slots] record holding each KV slot, -1 when free */
    wk_event *pending;             /* [pending_cap] acknowledgements waiting for the next step's message */
    int n_pending;                 /* entries in pending */
    int pending_cap;               /* bound on pending (a broker flooding bad assignments loses the excess) */
    int lanes;                     /* lanes in use, 1..WK_MAX_LANES */
    int ahead;                     /* 1: one lane, steps queued ahead (engine depth 2; lane[0..1] are the two
                                    * steps in flight, the older at fl_head) */
    int ahead_want;                /* -1: as the engine says (zl_engine.launch_async); 0: never queue ahead
                                    * (zllm-worker --ahead 0: batcher_set_ahead(b, 0)); 1: wherever the engine can */
    int fl_head;                   /* with ahead: lane index of the older step in flight */
    int fl_count;                  /* with ahead: steps in flight, 0..2 */
    int async;                     /* 1: the engine keeps steps in flight on several lanes (else steps run
                                    * synchronously at the submit) */
    s_lane lane[WK_MAX_LANES];     /* per lane */
    int next_lane;                 /* the lane whose turn is next */
    uint64_t ord_next;             /* submission ordinal of the next submitted step */
    uint64_t ord_collect;          /* ordinal of the step that must be collected next */
    uint64_t order_next;           /* admission counter */
    int prefill_cap;               /* most prompt tokens per step (batcher_set_prefill_cap) */
    int step_budget;               /* tokens per step while sequences decode (batcher_set_step_budget); 0: off */
    int last_tokens;               /* tokens of the last step */
    int last_prefill;              /* of which prompt chunks (not decodes) */
    uint64_t steps;                /* steps run */
    uint64_t duplicates;           /* duplicate assignments ignored */
    uint64_t prefills_shared;      /* prompt KV copies instead of prefills */
    char share_err[256];           /* an engine error of a KV copy inside s_apply ("" when none) */
    uint64_t pending_dropped;      /* acknowledgements lost to a full pending queue */
    const zg_vocab *gvocab;        /* borrowed: the vocabulary of grammar masks (batcher_set_vocab), or NULL */
    int mask_words;                /* (vocab + 31) / 32 */
    cpu_pool *mask_pool;           /* threads computing a step's masks (batcher_set_mask_threads), or NULL */
    int *mask_list;                /* [max_batch] entries of the step being built that need their mask (or of
                                    * the step collected whose matchers take their tokens) */
    uint8_t *refused;              /* [max_batch] per entry of the step collected: its grammar refused the token */
    /* late masks computed while the caller goes on (s_late_start .. s_late_finish): the fed step in flight whose
     * masks they are (NULL: none pending), the job, its entries, and whether the mask threads run it */
    s_lane *late_lane;
    s_mask_job late_job;
    int *late_list; /* [max_batch] */
    int late_async;
    /* KV block accounting (batcher_set_kv, docs/kv-cache.md): the engine still keeps one contiguous slot per
     * sequence; the pool mirrors what paged KV would hold and finds the prompts' cached prefixes */
    kv_pool *kvp;              /* NULL: off */
    int paged;                 /* 1: the engine reads KV through the tables (zl_engine.kv_block): the pool is the
                                * engine's, a cached prefix is not prefilled again, and a sequence short of blocks
                                * preempts (s_kv_prepare) */
    int kv_no_reuse;           /* batcher_set_prefix_cache(b, 0): nothing is published, no cached block taken */
    uint64_t kv_preemptions;   /* sequences preempted (paged) */
    uint64_t kv_resumed_tokens; /* tokens computed again after preemptions, cached prefix excluded */
    uint64_t kv_replayed;       /* decode entries replaying a generated token without sampling (s_split) */
    uint64_t kv_key;           /* kv_hash_model of the model name */
    uint64_t kv_hit_tokens;    /* prompt tokens found cached at admission */
    uint64_t kv_prompt_tokens; /* prompt tokens admitted */
    /* host timings (batcher_set_timing): the current call's phases in us (-1: not happened), whether a running
     * sequence had a grammar, and when the last wait for (or synchronous run of) a step ended (0: none yet) */
    int timing;
    double ph[WK_PH_N];
    int ph_grammar;
    double t_collected;
};

wk_batcher *batcher_new(zl_engine *e, const uint8_t *eog, int vocab, char *err, size_t errlen) {
    wk_batcher *b = NULL;
    if (!e || !eog || vocab <= 0 || e->n_slots <= 0 || e->n_ctx <= 1 || e->max_batch <= 0 ||
        e->max_step_tokens <= 0 || e->n_slots > (1 << 24)) {
        snprintf(err, errlen, "batcher: bad arguments");
        return NULL;
    }
    b = calloc(1, sizeof *b);
    if (!b) goto oom;
    b->e = e;
    b->vocab = vocab;
    b->n_slots = e->n_slots;
    b->n_ctx = e->n_ctx;
    b->n_rec = 2 * e->n_slots;
    b->n_scan = b->n_slots;
    b->lanes = 1;
    b->pending_cap = 2 * e->n_slots + 64;
    b->prefill_cap = e->max_step_tokens;
    b->mask_words = (vocab + 31) / 32;
    b->mask_list = malloc((size_t)e->max_batch * sizeof *b->mask_list);
    b->refused = malloc((size_t)e->max_batch);
    b->late_list = malloc((size_t)e->max_batch * sizeof *b->late_list);
    b->eog = malloc((size_t)vocab);
    b->recs = calloc((size_t)b->n_rec, sizeof *b->recs);
    b->tok_buf = malloc((size_t)b->n_rec * (size_t)b->n_ctx * sizeof(int32_t));
    b->kv_rec = malloc((size_t)b->n_slots * sizeof *b->kv_rec);
    b->pending = calloc((size_t)b->pending_cap, sizeof *b->pending);
    if (!b->eog || !b->recs || !b->tok_buf || !b->kv_rec || !b->pending || !b->mask_list || !b->refused ||
        !b->late_list)
        goto oom;
    for (int l = 0; l < WK_MAX_LANES; l++) {
        s_lane *L = &b->lane[l];
        L->seqs = calloc((size_t)e->max_batch, sizeof *L->seqs);
        L->seq_rec = calloc((size_t)e->max_batch, sizeof *L->seq_rec);
        L->out_tok = calloc((size_t)e->max_batch, sizeof *L->out_tok);
        L->out_lp = calloc((size_t)e->max_batch, sizeof *L->out_lp);
        if (!L->seqs || !L->seq_rec || !L->out_tok || !L->out_lp) goto oom;
    }
    memcpy(b->eog, eog, (size_t)vocab);
    b->ahead_want = -1;
    for (int i = 0; i < b->n_rec; i++) {
        b->recs[i].toks = b->tok_buf + (size_t)i * (size_t)b->n_ctx;
        b->recs[i].kv = -1;
    }
    for (int i = 0; i < b->n_slots; i++) b->kv_rec[i] = -1;
    batcher_set_lanes(b, engine_lanes(e));
    return b;
oom:
    snprintf(err, errlen, "batcher: out of memory");
    batcher_destroy(&b);
    return NULL;
}

void batcher_destroy(wk_batcher **pb) {
    if (!pb || !*pb) return;
    wk_batcher *b = *pb;
    if (b->late_async) cpu_pool_join(b->mask_pool); /* the mask threads finish with the matchers before they go */
    for (int i = 0; b->recs && i < b->n_rec; i++) kv_table_free(&b->recs[i].kvt);
    kv_pool_destroy(&b->kvp);
    free(b->eog);
    for (int i = 0; b->recs && i < b->n_rec; i++) {
        grammar_matcher_destroy(&b->recs[i].gm);
        free(b->recs[i].mask);
    }
    free(b->recs);
    free(b->mask_list);
    free(b->refused);
    free(b->late_list);
    cpu_pool_destroy(&b->mask_pool);
    free(b->tok_buf);
    free(b->kv_rec);
    free(b->pending);
    for (int l = 0; l < WK_MAX_LANES; l++) {
        free(b->lane[l].seqs);
        free(b->lane[l].seq_rec);
        free(b->lane[l].out_tok);
        free(b->lane[l].out_lp);
        free(b->lane[l].plp);
    }
    free(b);
    *pb = NULL;
}

void batcher_set_timing(wk_batcher *b, int on) {
    b->timing = on != 0;
    b->t_collected = 0;
    for (int p = 0; p < WK_PH_N; p++) b->ph[p] = -1;
}

int batcher_phases(const wk_batcher *b, double *us) {
    for (int p = 0; p < WK_PH_N; p++) us[p] = b->ph[p];
    return b->ph_grammar;
}

/* the clock for a phase's start, read only with timings on */
static double s_t0(const wk_batcher *b) { return b->timing ? phase_times_now_us() : 0; }

/* adds the time since t0 (s_t0) to phase p of the current call; returns it */
static double s_ph(wk_batcher *b, int p, double t0) {
    if (!b->timing) return 0;
    const double dt = phase_times_now_us() - t0;
    b->ph[p] = (b->ph[p] < 0 ? 0 : b->ph[p]) + dt;
    return dt;
}

/* the host's critical path (WK_PH_GAP): the time since the last collect, at a launch that fills the queue again */
static void s_ph_gap(wk_batcher *b) {
    if (b->timing && b->t_collected > 0) b->ph[WK_PH_GAP] = phase_times_now_us() - b->t_collected;
}

/* marks the end of a wait for (or of a synchronous run of) a step */
static void s_ph_collected(wk_batcher *b) {
    if (b->timing) b->t_collected = phase_times_now_us();
}

/* 1 when the engine computes decode entries and prompt rows with different reductions (zl_engine.kv_split_kernels):
 * then every position is computed by the kind of entry a cold run uses (docs/kv-cache.md): prompt positions as
 * prompt rows (zl_seq.prompt), generated ones as decode entries of one token, also when a preempted sequence
 * recomputes them; and only blocks of prompt rows are published, so that no prompt ever reuses decoded rows */
static int s_split(const wk_batcher *b) { return b->e->kv_split_kernels != 0; }

/* the tokens of record r whose KV rows may be published: all that are written, or with s_split those of its
 * prompt only */
static int s_publishable(const wk_batcher *b, const s_rec *r) {
    if (b->kv_no_reuse) return 0;
    return s_split(b) && r->n_past > r->n_prompt ? r->n_prompt : r->n_past;
}

int batcher_in_flight(const wk_batcher *b) {
    if (b->ahead) return b->fl_count;
    int n = 0;
    for (int l = 0; l < WK_MAX_LANES; l++) n += b->lane[l].busy;
    return n;
}

int batcher_lanes(const wk_batcher *b) { return b->lanes; }

int batcher_set_ahead(wk_batcher *b, int on) {
    for (int i = 0; i < b->n_rec; i++)
        if (b->recs[i].active) return -1;
    if (batcher_in_flight(b)) return -1;
    b->ahead_want = on != 0;
    batcher_set_lanes(b, b->lanes);
    return b->ahead;
}

int batcher_ahead(const wk_batcher *b) { return b->ahead; }

int batcher_set_lanes(wk_batcher *b, int lanes) {
    for (int i = 0; i < b->n_rec; i++)
        if (b->recs[i].active) return -1;
    if (batcher_in_flight(b)) return -1;
    if (b->paged) lanes = 1; /* paged KV: one lane, steps queued ahead or not (batcher_set_kv) */
    b->async = engine_lanes(b->e) > 1;
    if (lanes > WK_MAX_LANES) lanes = WK_MAX_LANES;
    if (b->async && lanes > engine_lanes(b->e)) lanes = engine_lanes(b->e);
    if (lanes < 1) lanes = 1;
    b->lanes = lanes;
    b->ahead = lanes == 1 && engine_depth(b->e) >= 2 && (b->ahead_want < 0 ? b->e->launch_async : b->ahead_want);
    b->fl_head = b->fl_count = 0;
    /* one lane: the decode rotation over the first n_slots records only, record i on KV slot i (not with steps
     * queued ahead: a record ended in flight keeps its slot while a new one waits) */
    b->n_scan = lanes > 1 || b->ahead ? b->n_rec : b->n_slots;
    b->next_lane = 0;
    for (int l = 0; l < WK_MAX_LANES; l++) b->lane[l].rotate = 0;
    return lanes;
}

/* queues an acknowledgement; a rid already pending is not queued twice (one entry per rid per message) */
static void s_pend(wk_batcher *b, uint64_t rid, int fin) {
    for (int i = 0; i < b->n_pending; i++)
        if (b->pending[i].rid == rid) return;
    if (b->n_pending >= b->pending_cap) {
        b->pending_dropped++;
        return;
    }
    b->pending[b->n_pending++] = (wk_event){.rid = rid, .tok = -1, .fin = fin};
}

/* the running record of rid, or -1 */
static int s_find(const wk_batcher *b, uint64_t rid) {
    for (int i = 0; i < b->n_rec; i++)
        if (b->recs[i].active && b->recs[i].live && b->recs[i].rid == rid) return i;
    return -1;
}

void batcher_set_vocab(wk_batcher *b, const zg_vocab *v) {
    b->gvocab = v && grammar_vocab_size(v) == b->vocab ? v : NULL;
}

static int s_late_finish(wk_batcher *b, char *err, size_t errlen);

int batcher_set_mask_threads(wk_batcher *b, int n, char *err, size_t errlen) {
    if (b->late_lane && s_late_finish(b, err, errlen) != 0) return -1;
    cpu_pool_destroy(&b->mask_pool);
    if (n <= 1) return 0;
    b->mask_pool = cpu_pool_new(n, err, errlen);
    return b->mask_pool ? 0 : -1;
}

/* frees record i and its KV slot (never while a step of it is in flight) */
static void s_release(wk_batcher *b, int i) {
    s_rec *r = &b->recs[i];
    grammar_matcher_destroy(&r->gm);
    if (b->kvp) { /* its written blocks become findable, then go to the pool's LRU */
        kv_table_publish(b->kvp, &r->kvt, b->kv_key, r->toks, s_publishable(b, r));
        kv_table_release(b->kvp, &r->kvt);
    }
    if (r->kv >= 0) b->kv_rec[r->kv] = -1;
    r->kv = -1;
    r->active = r->live = r->inflight = 0;
}

/* Takes record i's prompt blocks when it gets its KV slot (docs/kv-cache.md): the blocks of the slot's previous
 * sequence are released by then, and the pool holds a whole context per slot, so this cannot fail; if it did, the
 * sequence runs without block accounting (it changes no token). */
static void s_kv_admit(wk_batcher *b, int i) {
    s_rec *r = &b->recs[i];
    if (!b->kvp || b->paged || r->kvt.n_blocks) return;
    int most = b->n_ctx - r->n_prompt; /* what the slot lets it generate: the headroom never exceeds a slot */
    if (kv_table_admit(b->kvp, &r->kvt, b->kv_key, r->toks, r->n_prompt, r->max_tokens < most ? r->max_tokens : most,
                       WK_KV_HEADROOM, !r->plp && !b->kv_no_reuse) != 0)
        return;
    b->kv_hit_tokens += (uint64_t)r->kvt.n_cached;
    b->kv_prompt_tokens += (uint64_t)r->n_prompt;
}

/* 1 when a goes before b: higher priority, then earlier admission */
static int s_before(const s_rec *a, const s_rec *b) {
    return a->priority != b->priority ? a->priority > b->priority : a->order < b->order;
}

/* hands free KV slots to running records waiting for one, by priority then oldest admission first */
static void s_give_slots(wk_batcher *b) {
    for (int k = 0; k < b->n_slots; k++) {
        if (b->kv_rec[k] >= 0) continue;
        int best = -1;
        for (int i = 0; i < b->n_rec; i++) {
            const s_rec *r = &b->recs[i];
            if (r->active && r->live && r->kv < 0 && (best < 0 || s_before(r, &b->recs[best]))) best = i;
        }
        if (best < 0) return;
        b->recs[best].kv = k;
        b->kv_rec[k] = best;
        s_kv_admit(b, best);
    }
}

/* running records per lane into cnt[WK_MAX_LANES] */
static void s_lane_counts(const wk_batcher *b, int *cnt) {
    memset(cnt, 0, WK_MAX_LANES * sizeof *cnt);
    for (int i = 0; i < b->n_rec; i++)
        if (b->recs[i].active && b->recs[i].live) cnt[b->recs[i].lane]++;
}

/* range checks of the sampling parameters; the sampler itself tolerates anything, but NaN would make a greedy
 * request random and a silent surprise is worse than a rejection */
static int s_sampling_ok(const zl_sampling *s) {
    return isfinite(s->temperature) && s->temperature >= 0 && s->top_k >= 0 && isfinite(s->top_p) && s->top_p > 0 &&
           s->top_p <= 1 && isfinite(s->min_p) && s->min_p >= 0 && s->min_p < 1 && isfinite(s->repeat_penalty) &&
           s->repeat_penalty > 0 && s->repeat_last_n >= 0 && isfinite(s->presence_penalty) &&
           fabsf(s->presence_penalty) <= 2 && isfinite(s->frequency_penalty) && fabsf(s->frequency_penalty) <= 2 &&
           s->top_logprobs >= 0 && s->top_logprobs <= ZL_MAX_TOP_LOGPROBS;
}

/* the logit bias: at most ZL_MAX_LOGIT_BIAS entries, ids in the vocabulary, finite values within [-100, 100] */
static int s_bias_ok(const wk_batcher *b, const wk_request *r) {
    if (r->n_bias < 0 || r->n_bias > ZL_MAX_LOGIT_BIAS || (r->n_bias && !r->bias)) return 0;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias[i].id < 0 || r->bias[i].id >= b->vocab || !isfinite(r->bias[i].bias) ||
            fabsf(r->bias[i].bias) > 100)
            return 0;
    return 1;
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
    if (r->max_tokens < (r->prompt_lp ? 0 : 1)) {
        snprintf(err, errlen, "rid %llu: max_tokens %d < 1", (unsigned long long)r->rid, r->max_tokens);
        goto reject;
    }
    if (r->prompt_lp && (r->prompt_top < 0 || r->prompt_top > ZL_MAX_TOP_LOGPROBS)) {
        snprintf(err, errlen, "rid %llu: prompt logprobs with %d alternatives (at most %d)", (unsigned long long)r->rid,
                 r->prompt_top, ZL_MAX_TOP_LOGPROBS);
        goto reject;
    }
    if (r->prompt_lp && !(b->e->caps & ZL_CAP_PROMPT_LOGPROBS)) {
        snprintf(err, errlen, "rid %llu: device %s does not serve prompt logprobs", (unsigned long long)r->rid,
                 b->e->device);
        goto reject;
    }
    /* the rows of every lane a step may be built in (steps queued ahead use lanes 0 and 1) */
    for (int l = 0; r->prompt_lp && l < WK_MAX_LANES && (l < b->lanes || l < 2); l++)
        if (!b->lane[l].plp && !(b->lane[l].plp = malloc((size_t)b->e->max_step_tokens * sizeof(zl_logprobs)))) {
            snprintf(err, errlen, "rid %llu: out of memory for prompt logprobs", (unsigned long long)r->rid);
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
    if (r->grammar && (!b->gvocab || !b->e->masks)) {
        snprintf(err, errlen, "rid %llu: structured output is not available here (%s)", (unsigned long long)r->rid,
                 !b->gvocab ? "no vocabulary for the grammar masks" : "the engine does not apply token masks");
        goto reject;
    }
    if (!s_bias_ok(b, r)) {
        snprintf(err, errlen, "rid %llu: logit bias out of range", (unsigned long long)r->rid);
        goto reject;
    }
    if ((r->samp.logprobs && !(b->e->caps & ZL_CAP_LOGPROBS)) ||
        ((penalty_counts(&r->samp) || r->n_bias) && !(b->e->caps & ZL_CAP_PENALTY))) {
        snprintf(err, errlen, "rid %llu: device %s does not serve logprobs, presence/frequency penalties or logit bias",
                 (unsigned long long)r->rid, b->e->device);
        goto reject;
    }
    /* a free slot is one not held by a running sequence: with live < n_slots, either a KV slot is free now, or
     * more are held by cancelled sequences in flight than records wait for one (so this one gets the next) */
    if (batcher_running(b) >= b->n_slots) {
        snprintf(err, errlen, "rid %llu: no free slot (%d running)", (unsigned long long)r->rid, b->n_slots);
        goto reject;
    }
    int slot = -1, kv = -1;
    for (int i = 0; i < b->n_rec && slot < 0; i++)
        if (!b->recs[i].active) slot = i;
    for (int k = 0; k < b->n_slots && kv < 0; k++)
        if (b->kv_rec[k] < 0) kv = k;
    if (slot < 0) {   /* cannot happen: active records <= running + draining < 2 * n_slots */
        snprintf(err, errlen, "rid %llu: no free record", (unsigned long long)r->rid);
        goto reject;
    }
    int cnt[WK_MAX_LANES], lane = 0;
    s_lane_counts(b, cnt);
    for (int l = 1; l < b->lanes; l++)
        if (cnt[l] < cnt[lane]) lane = l;
    s_rec *s = &b->recs[slot];
    if (r->grammar) {
        char gerr[160];
        if (!s->mask) s->mask = malloc((size_t)b->mask_words * sizeof *s->mask);
        s->gm = s->mask ? grammar_matcher_new(r->grammar, gerr, sizeof gerr) : NULL;
        if (!s->gm) {
            snprintf(err, errlen, "rid %llu: %s", (unsigned long long)r->rid, s->mask ? gerr : "out of memory");
            goto reject;
        }
    }
    s->active = 1;
    s->live = 1;
    s->inflight = 0;
    s->kv = kv;
    if (kv >= 0) b->kv_rec[kv] = slot;
    s->lane = lane;
    s->rid = r->rid;
    s->order = b->order_next++;
    s->priority = r->priority;
    memcpy(s->toks, r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
    s->len = s->n_prompt = r->n_tokens;
    s->n_past = 0;
    s->resumed = 0;
    s->n_gen = 0;
    s->n_sched = 0;
    s->n_gen_sched = 0;
    s->last_sampled = 0;
    s->max_tokens = r->max_tokens;
    s->samp = r->samp;
    s->rng = sampler_rng_init(r->samp.seed);
    s->n_stop_ids = r->n_stop_ids;
    if (r->n_stop_ids) memcpy(s->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
    s->ignore_eos = r->ignore_eos;
    s->n_bias = r->n_bias;
    if (r->n_bias) memcpy(s->bias, r->bias, (size_t)r->n_bias * sizeof *s->bias);
    s->plp = r->prompt_lp != 0;
    s->plp_top = r->prompt_top;
    s->plp_sent = 0;
    /* prompt logprobs need the logits of every prompt row: such a prompt is prefilled, never copied */
    s->share = r->share != r->rid && r->n_tokens > 1 && (b->paged || b->e->ops->copy_kv) && !s->plp ? r->share : 0;
    if (kv >= 0) s_kv_admit(b, slot);
    return 0;
reject:
    s_pend(b, r->rid, WK_FIN_ERROR);
    return -1;
}

void batcher_refuse(wk_batcher *b, uint64_t rid) { s_pend(b, rid, WK_FIN_ERROR); }

int batcher_cancel(wk_batcher *b, uint64_t rid) {
    int i = s_find(b, rid);
    if (i < 0) return 0;
    if (b->recs[i].inflight) {
        b->recs[i].live = 0;   /* released by the collect of its step */
    } else {
        s_release(b, i);
        s_give_slots(b);
    }
    s_pend(b, rid, WK_FIN_CANCELLED);
    return 1;
}

void batcher_clear(wk_batcher *b) {
    for (int i = 0; i < b->n_rec; i++) {
        if (!b->recs[i].active) continue;
        if (b->recs[i].inflight) b->recs[i].live = 0;
        else s_release(b, i);
    }
    b->n_pending = 0;
}

void batcher_set_prefill_cap(wk_batcher *b, int tokens) {
    if (tokens < 1) tokens = 1;
    if (tokens > b->e->max_step_tokens) tokens = b->e->max_step_tokens;
    b->prefill_cap = tokens;
}

void batcher_set_step_budget(wk_batcher *b, int tokens) { b->step_budget = tokens > 0 ? tokens : 0; }
int batcher_step_budget(const wk_batcher *b) { return b->step_budget; }

int batcher_last_step_tokens(const wk_batcher *b) { return b->last_tokens; }
int batcher_last_prefill_tokens(const wk_batcher *b) { return b->last_prefill; }
int batcher_prefill_cap(const wk_batcher *b) { return b->prefill_cap; }

int batcher_running(const wk_batcher *b) {
    int n = 0;
    for (int i = 0; i < b->n_rec; i++) n += b->recs[i].active && b->recs[i].live;
    return n;
}

int batcher_free_slots(const wk_batcher *b) { return b->n_slots - batcher_running(b); }

int batcher_set_kv(wk_batcher *b, int block_size, const char *model, char *err, size_t errlen) {
    for (int i = 0; i < b->n_rec; i++)
        if (b->recs[i].active) {
            snprintf(err, errlen, "batcher: KV blocks set while sequences run");
            return -1;
        }
    kv_pool_destroy(&b->kvp);
    b->paged = 0;
    if (b->e->kv_block > 0) { /* the engine's paged KV: its pool, its block size, one lane */
        const int per_seq = (b->n_ctx + b->e->kv_block - 1) / b->e->kv_block;
        if (block_size != b->e->kv_block || b->lanes != 1 || b->e->kv_blocks < per_seq + WK_KV_HEADROOM) {
            snprintf(err, errlen,
                     "batcher: paged KV of %d blocks of %d tokens needs --kv-block %d (not %d), one lane, "
                     "and at least %d blocks (a whole context and the headroom)",
                     b->e->kv_blocks, b->e->kv_block, b->e->kv_block, block_size, per_seq + WK_KV_HEADROOM);
            return -1;
        }
        b->kvp = kv_pool_new(b->e->kv_blocks, block_size, err, errlen);
        if (!b->kvp) return -1;
        b->paged = 1;
        b->kv_key = kv_hash_model(model ? model : "", model ? strlen(model) : 0);
        return 0;
    }
    if (block_size == 0) return 0;
    int per_slot = (b->n_ctx + block_size - 1) / (block_size > 0 ? block_size : 1);
    if (block_size < 0 || block_size > KV_BLOCK_MAX || (int64_t)per_slot * b->n_slots > (1 << 28)) {
        snprintf(err, errlen, "batcher: KV block size %d outside 0..%d (or too many blocks)", block_size, KV_BLOCK_MAX);
        return -1;
    }
    b->kvp = kv_pool_new(per_slot * b->n_slots, block_size, err, errlen);
    if (!b->kvp) return -1;
    b->kv_key = kv_hash_model(model ? model : "", model ? strlen(model) : 0);
    return 0;
}

int batcher_kv(const wk_batcher *b, wk_kv_stats *st) {
    memset(st, 0, sizeof *st);
    if (!b->kvp) return 0;
    st->block_size = kv_pool_block_size(b->kvp);
    st->blocks = kv_pool_blocks(b->kvp);
    st->used = kv_pool_used(b->kvp);
    st->free = kv_pool_free(b->kvp);
    st->cached = kv_pool_cached(b->kvp);
    st->hit_tokens = b->kv_hit_tokens;
    st->prompt_tokens = b->kv_prompt_tokens;
    st->paged = b->paged;
    st->preemptions = b->kv_preemptions;
    st->resumed_tokens = b->kv_resumed_tokens;
    st->replayed_tokens = b->kv_replayed;
    st->evictions = kv_pool_evictions(b->kvp);
    return 1;
}

int batcher_kv_hashes(const wk_batcher *b, uint64_t *out, int cap) {
    return b->kvp ? kv_pool_hashes(b->kvp, out, cap) : 0;
}

void batcher_set_prefix_cache(wk_batcher *b, int on) { b->kv_no_reuse = !on; }
int batcher_prefix_cache(const wk_batcher *b) { return !b->kv_no_reuse; }
int batcher_event_cap(const wk_batcher *b) { return b->n_slots + b->pending_cap; }
uint64_t batcher_steps(const wk_batcher *b) { return b->steps; }
uint64_t batcher_duplicates(const wk_batcher *b) { return b->duplicates; }
uint64_t batcher_prefills_shared(const wk_batcher *b) { return b->prefills_shared; }

/* paged KV on an engine whose prefill is not chunk invariant (zl_engine.chunk_variant): a resumed sequence would
 * prefill its prompt in other chunks than its first run, so its later tokens could differ; there nothing is
 * preempted. Instead admission reserves: a sequence is admitted only while the pool, less the blocks the running
 * ones may still take (s_kv_reserved), holds its whole run (s_kv_final: n_prompt + max_tokens positions, at most
 * the context; a run writes one fewer). Growth then never runs short; were it to, the growth loop's preemption
 * would still keep the worker going. */
static int s_kv_final(const wk_batcher *b, const s_rec *r) {
    const long t = (long)r->n_prompt + (r->max_tokens > 0 ? r->max_tokens : 0);
    const long bs = kv_pool_block_size(b->kvp);
    return (int)(((t < b->n_ctx ? t : b->n_ctx) + bs - 1) / bs);
}
static int s_kv_reserved(const wk_batcher *b, int skip) {
    int res = 0;
    for (int i = 0; i < b->n_rec; i++) {
        const s_rec *r = &b->recs[i];
        if (i == skip || !r->active || !r->kvt.n_blocks) continue;
        const int more = s_kv_final(b, r) - r->kvt.n_blocks;
        if (more > 0) res += more;
    }
    return res;
}
/* 1 when record i may take its blocks now on such an engine (always elsewhere) */
static int s_kv_fits(const wk_batcher *b, int i) {
    if (!b->e->chunk_variant) return 1;
    return kv_pool_available(b->kvp) - s_kv_reserved(b, i) >= s_kv_final(b, &b->recs[i]);
}

/* record f waits to copy the prompt KV of record i (or -1: its sibling is gone): copies it once i's KV holds all but
 * the last prompt token, or gives up (f prefills itself) when i cannot serve. 0, or -1 on an engine error */
/* paged KV: record s waits for the prompt of its sibling l: once l's prompt is in (its full blocks published), s is
 * admitted, finds those blocks in the prefix cache and gets a copy of the rows of l's partial last prompt block
 * that precede the last prompt token (zl_engine.copy_block), so that it computes only that token. Not enough
 * blocks now: it is admitted later as any prompt (s_kv_prepare). 0, or -1 on an engine error */
static int s_share_paged(wk_batcher *b, s_rec *s, const s_rec *l, char *err, size_t errlen) {
    const int need = s->n_prompt - 1, bs = kv_pool_block_size(b->kvp), j = need / bs;
    if (l->n_past < l->n_prompt || l->kvt.n_blocks <= j || s->kv < 0 || s->inflight || s->kvt.n_blocks) return 0;
    s->share = 0;
    if (!s_kv_fits(b, (int)(s - b->recs))) return 0; /* a chunk_variant engine: admitted later, as any prompt */
    const int most = b->n_ctx - s->n_prompt;
    if (kv_table_admit(b->kvp, &s->kvt, b->kv_key, s->toks, s->n_prompt, s->max_tokens < most ? s->max_tokens : most,
                       WK_KV_HEADROOM, !s->plp && !b->kv_no_reuse) != 0)
        return 0;
    s->n_past = s->n_sched = s->kvt.n_cached;
    b->kv_hit_tokens += (uint64_t)s->kvt.n_cached;
    b->kv_prompt_tokens += (uint64_t)s->n_prompt;
    if (s->kvt.n_cached == j * bs && need > j * bs && b->e->copy_block) {
        if (b->e->copy_block(b->e, l->kvt.blocks[j], s->kvt.blocks[j], need - j * bs) != 0) {
            snprintf(err, errlen, "%s", b->e->err);
            return -1;
        }
        s->n_past = s->n_sched = need;
    }
    if (s->n_past > 0) b->prefills_shared++;
    return 0;
}

static int s_share_one(wk_batcher *b, int f, int i, char *err, size_t errlen) {
    s_rec *s = &b->recs[f];
    const int need = s->n_prompt - 1;
    if (i < 0) {
        s->share = 0;
        return 0;
    }
    const s_rec *l = &b->recs[i];
    if (!l->live || l->kv < 0 || l->n_prompt != s->n_prompt ||
        memcmp(l->toks, s->toks, (size_t)s->n_prompt * sizeof *s->toks) != 0) {
        s->share = 0;
        return 0;
    }
    if (b->paged) return s_share_paged(b, s, l, err, errlen);
    if (l->n_past < need || s->kv < 0 || s->inflight) return 0; /* not yet */
    if (engine_copy_kv(b->e, l->kv, s->kv, need) != 0) {
        snprintf(err, errlen, "%s", b->e->err);
        return -1;
    }
    s->n_past = s->n_sched = need;
    s->share = 0;
    b->prefills_shared++;
    return 0;
}

/* every record waiting for a sibling's prompt KV (s_share_one); with from >= 0 only those waiting for record
 * from. 0, or -1 on an engine error */
static int s_share(wk_batcher *b, int from, char *err, size_t errlen) {
    for (int f = 0; f < b->n_rec; f++) {
        s_rec *s = &b->recs[f];
        if (!s->active || !s->live || !s->share) continue;
        if (from >= 0 && b->recs[from].rid != s->share) continue;
        if (s_share_one(b, f, from >= 0 ? from : s_find(b, s->share), err, errlen) != 0) return -1;
    }
    return 0;
}

int batcher_rids(const wk_batcher *b, uint64_t *rids, int cap) {
    int n = 0;
    for (int i = 0; i < b->n_rec && n < cap; i++)
        if (b->recs[i].active && b->recs[i].live) rids[n++] = b->recs[i].rid;
    return n;
}

/* the finish code for record s after it got token t */
static int s_finish(const wk_batcher *b, const s_rec *s, int32_t t) {
    if (!s->ignore_eos && b->eog[t]) return WK_FIN_STOP;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) return WK_FIN_STOP;
    if (s->gm && !grammar_matcher_can_continue(s->gm)) return WK_FIN_STOP; /* the grammar's match is complete */
    if (s->n_gen >= s->max_tokens) return WK_FIN_LENGTH;
    /* the next decode would write toks[len] and need KV position len - 1 + 1 <= n_ctx: stop while both fit */
    if (s->len >= b->n_ctx) return WK_FIN_LENGTH;
    return WK_FIN_NONE;
}

/* record i may join a step of lane l: running, holding a KV slot, in that lane, nothing in flight (or, queued
 * ahead, only a prompt chunk that does not sample) */
static int s_ready(const wk_batcher *b, int i, int l) {
    const s_rec *s = &b->recs[i];
    if (!s->active || !s->live || s->kv < 0 || s->lane != l || s->share) return 0;
    if (b->paged && (!s->kvt.n_blocks || s->kvt.n_tokens < s->len)) return 0; /* waits for blocks */
    /* with steps queued ahead, a prompt whose chunk in flight does not sample goes on with its next chunk (the
     * host has its tokens), positioned after what is in flight */
    return !s->inflight || (b->ahead && s->inflight == 1 && !s->last_sampled && s->n_sched < s->len);
}

/* tokens of record i already in the KV cache or in steps in flight: where its next entry starts */
static int s_at(const wk_batcher *b, const s_rec *s) { return b->ahead ? s->n_sched : s->n_past; }

/* adds record i to lane L's step as entry n with a chunk of at most budget tokens; returns the tokens taken */
static int s_entry(wk_batcher *b, s_lane *L, int i, int n, int budget) {
    s_rec *s = &b->recs[i];
    const int at = s_at(b, s);
    int chunk = s->len - at;
    if (chunk > budget) chunk = budget;
    /* s_split: a prompt chunk ends at the prompt's end; a generated position (a resumed sequence's replay) is a
     * decode entry of one token */
    if (s_split(b) && at < s->n_prompt && at + chunk > s->n_prompt) chunk = s->n_prompt - at;
    if (s_split(b) && at >= s->n_prompt) chunk = 1;
    zl_seq *q = &L->seqs[n];
    q->slot = s->kv;
    q->pos = at;
    q->n_tokens = chunk;
    q->tokens = s->toks + at;
    q->sample = at + chunk == s->len && s->max_tokens > 0; /* max_tokens 0: prompt logprobs only */
    q->samp = &s->samp;
    q->history = s->toks;
    q->n_history = at + chunk;
    q->history_prompt = s->n_prompt;
    q->bias = s->n_bias ? s->bias : NULL;
    q->n_bias = s->n_bias;
    q->rng = &s->rng;
    q->feed = 0;
    /* the mask is computed when the step is built (s_masks); the matcher is current then: a grammar sequence has no
     * sampling entry in flight */
    q->mask = q->sample && s->gm ? s->mask : NULL;
    q->mask_late = 0;
    /* prompt logprobs: rows whose next token is a prompt token (positions at .. n_prompt - 2) */
    const int rows = s->plp ? (s->n_prompt - 1 - at < chunk ? s->n_prompt - 1 - at : chunk) : 0;
    q->plp_rows = rows > 0 && L->plp ? rows : 0;
    q->plp_top = s->plp_top;
    q->plp_next = q->plp_rows ? s->toks + at + 1 : NULL;
    q->plp_out = q->plp_rows ? L->plp + L->plp_used : NULL;
    L->plp_used += q->plp_rows;
    q->blocks = b->paged ? s->kvt.blocks : NULL;
    q->prompt = at < s->n_prompt;
    b->kv_replayed += s_split(b) && !q->prompt && !q->sample; /* a generated token replayed: its decode again */
    L->seq_rec[n] = i;
    return chunk;
}

/* adds record i (in flight, its entry sampling) to L's step as entry n: one token fed from that entry's sample */
static void s_entry_fed(wk_batcher *b, s_lane *L, int i, int n) {
    s_rec *s = &b->recs[i];
    zl_seq *q = &L->seqs[n];
    q->slot = s->kv;
    q->pos = s->n_sched;
    q->n_tokens = 1;
    q->tokens = NULL;
    q->sample = 1;
    q->samp = &s->samp;
    q->history = NULL;
    q->n_history = 0;
    q->history_prompt = 0;
    q->bias = s->n_bias ? s->bias : NULL;
    q->n_bias = s->n_bias;
    q->rng = &s->rng;
    q->feed = 1;
    /* a constrained sequence's mask depends on the id of the step in flight: written after that step is collected
     * and announced to the engine then (s_late_start, s_late_finish) */
    q->mask = s->gm ? s->mask : NULL;
    q->mask_late = s->gm != NULL;
    q->plp_rows = 0;
    q->plp_top = 0;
    q->plp_next = NULL;
    q->plp_out = NULL;
    q->blocks = b->paged ? s->kvt.blocks : NULL; /* s_kv_prepare grew it to hold position n_sched (s_can_feed) */
    q->prompt = 0;
    L->seq_rec[n] = i;
}

/* record i, in flight, could continue with a fed entry in the step queued behind: it runs, its latest entry
 * samples, the repetition, presence and frequency penalties are off (their history would lack the fed id), and
 * neither max_tokens nor the context ends it for certain when that
 * entry's token arrives (s_finish: n_gen reaches n_gen_sched, len reaches n_sched + 1) */
static int s_feedable(const wk_batcher *b, int i) {
    const s_rec *s = &b->recs[i];
    const int pen = (s->samp.repeat_penalty != 1.0f && s->samp.repeat_last_n > 0) || penalty_counts(&s->samp);
    return s->active && s->live && s->kv >= 0 && s->inflight == 1 && s->last_sampled && !pen &&
           (!s->gm || b->e->masks_late) && s->n_gen_sched < s->max_tokens && s->n_sched + 1 < b->n_ctx;
}

/* s_feedable, and with paged KV its table holds the position the fed entry writes (n_sched: s_kv_prepare grows
 * it before the step is built, or leaves it short when the pool is out of blocks: the sequence then waits for its
 * token and runs in the step after) */
static int s_can_feed(const wk_batcher *b, int i) {
    const s_rec *s = &b->recs[i];
    return s_feedable(b, i) && (!b->paged || (s->kvt.n_blocks && s->kvt.n_tokens > s->n_sched));
}

/* paged KV: the tokens record i's table must cover for the next step built: its whole sequence when nothing of it
 * is in flight or its prompt goes on behind a chunk in flight; the position a fed entry writes (n_sched + 1) when
 * it may be fed; 0 otherwise (it waits for its step in flight) */
static int s_kv_need(const wk_batcher *b, int i) {
    const s_rec *r = &b->recs[i];
    if (!r->inflight) return r->len;
    if (!b->ahead || r->inflight != 1) return 0;
    if (!r->last_sampled) return r->n_sched < r->len ? r->len : 0;
    return s_feedable(b, i) ? r->n_sched + 1 : 0;
}

/* any thread: the entries list[0..n) of L whose masks it computes, taken one at a time from next (a walk of a
 * state the grammar has not seen costs a hundred copies: taking entries in turn keeps the threads even) */
static void s_mask_run(void *ctx, int ith, int nth) {
    s_mask_job *j = ctx;
    (void)ith;
    (void)nth;
    for (int k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) {
        const int e = j->list[k];
        grammar_matcher_mask(j->b->recs[j->L->seq_rec[e]].gm, j->b->gvocab, (uint32_t *)j->L->seqs[e].mask);
    }
}

/* computes the masks of L's entries [n0, n) that have one (one matcher per sequence, so on several threads) */
static void s_masks(wk_batcher *b, s_lane *L, int n0, int n) {
    int cnt = 0;
    for (int j = n0; j < n; j++)
        if (L->seqs[j].mask && !L->seqs[j].mask_late) b->mask_list[cnt++] = j;
    if (!cnt) return;
    const double t0 = s_t0(b);
    s_mask_job job = {b, L, b->mask_list, cnt, 0};
    if (cnt > 1 && b->mask_pool) cpu_pool_run(b->mask_pool, s_mask_run, &job);
    else s_mask_run(&job, 0, 1);
    s_ph(b, WK_PH_MASKS, t0);
}

/* paged KV: preempts record v (docs/kv-cache.md): its written full blocks are published (likely found again), all
 * its blocks released, and it waits for blocks again with its tokens so far (prompt and generated), its sampler
 * state and grammar state kept: resumed, it prefills those tokens (its cached prefix excepted) and samples exactly
 * the token its next decode would have */
static void s_preempt(wk_batcher *b, int v) {
    s_rec *r = &b->recs[v];
    kv_table_publish(b->kvp, &r->kvt, b->kv_key, r->toks, s_publishable(b, r));
    kv_table_release(b->kvp, &r->kvt);
    r->n_past = r->n_sched = 0;
    r->resumed = 1;
    b->kv_preemptions++;
}

/* paged KV: the victim for a record of priority prio that needs blocks: the running record holding blocks with the
 * lowest priority, the most recently admitted among those, of priority below prio (or equal with equal_ok), other
 * than `keep`; -1 when none */
static int s_victim(const wk_batcher *b, int prio, int equal_ok, int keep) {
    int v = -1;
    for (int i = 0; i < b->n_rec; i++) {
        const s_rec *r = &b->recs[i];
        if (i == keep || !r->active || !r->live || r->inflight || !r->kvt.n_blocks) continue;
        if (r->priority > prio || (r->priority == prio && !equal_ok)) continue;
        if (v < 0 || r->priority < b->recs[v].priority ||
            (r->priority == b->recs[v].priority && r->order > b->recs[v].order))
            v = i;
    }
    return v;
}

/* paged KV, before a step is built: records without blocks (new or preempted) are admitted by priority, then
 * admission order, each preempting only sequences of lower priority, until one does not fit; then every running
 * record's table is grown to hold its tokens (the token its next step feeds; with steps queued ahead also the
 * position a fed entry writes, s_kv_need), highest priority first, preempting the lowest priority, most recently
 * admitted sequence (possibly itself) when the pool runs out. A record with a step in flight is never preempted
 * and its blocks are never released (s_victim, s_release): the device may still read and write them */
static void s_kv_prepare(wk_batcher *b) {
    for (;;) {
        int w = -1;
        for (int i = 0; i < b->n_rec; i++) {
            const s_rec *r = &b->recs[i];
            if (r->active && r->live && r->kv >= 0 && !r->kvt.n_blocks && !r->inflight && !r->share &&
                (w < 0 || s_before(r, &b->recs[w])))
                w = i;
        }
        if (w < 0) break;
        s_rec *r = &b->recs[w];
        const int left = r->max_tokens - r->n_gen, most = b->n_ctx - r->len, gen = left < most ? left : most;
        /* with s_split a resumed sequence reuses cached blocks of its prompt only: a block of another sequence's
         * prompt rows may hold the tokens of its generated positions, which it computes as decode entries */
        const int within = r->plp || b->kv_no_reuse ? 0 : s_split(b) ? r->n_prompt : r->len;
        if (!s_kv_fits(b, w)) goto grow; /* it waits (and every record behind it) for running ones to end */
        while (kv_table_admit_within(b->kvp, &r->kvt, b->kv_key, r->toks, r->len, gen, WK_KV_HEADROOM, within) != 0) {
            int v = b->e->chunk_variant ? -1 : s_victim(b, r->priority, 0, w);
            if (v < 0) goto grow; /* it waits (and every record behind it) until blocks come back */
            s_preempt(b, v);
        }
        r->n_past = r->n_sched = r->kvt.n_cached;
        if (r->resumed) {
            b->kv_resumed_tokens += (uint64_t)(r->len - r->kvt.n_cached);
        } else {
            b->kv_hit_tokens += (uint64_t)r->kvt.n_cached;
            b->kv_prompt_tokens += (uint64_t)r->n_prompt;
        }
    }
grow:
    for (;;) {
        int g = -1;
        for (int i = 0; i < b->n_rec; i++) {
            const s_rec *r = &b->recs[i];
            if (r->active && r->live && r->kvt.n_blocks && r->kvt.n_tokens < s_kv_need(b, i) &&
                (g < 0 || s_before(r, &b->recs[g])))
                g = i;
        }
        if (g < 0) return;
        s_rec *r = &b->recs[g];
        while (r->kvt.n_blocks && kv_table_grow(b->kvp, &r->kvt, s_kv_need(b, g) - r->kvt.n_tokens) != 0) {
            int v = s_victim(b, r->priority, 1, -1); /* r itself when it is the lowest and newest (not in flight) */
            if (v < 0) return;
            s_preempt(b, v);
        }
    }
}

/* the highest priority among the sequences of lane l that decode or will once their step in flight is collected
 * (they have generated a token, or their whole prompt is in the KV cache or in flight: a step built now would
 * stall them); INT_MIN when none does */
static int s_decoding(const wk_batcher *b, int l) {
    int top = INT_MIN;
    for (int i = 0; i < b->n_rec; i++) {
        const s_rec *s = &b->recs[i];
        if (s->active && s->live && s->kv >= 0 && s->lane == l && (s->len > s->n_prompt || s_at(b, s) >= s->len) &&
            s->priority > top)
            top = s->priority;
    }
    return top;
}

/* 1 when record s's next entry has one token and joins the decodes: its last token (a decode, or a prompt's last
 * token), or with s_split a generated token replayed after a preemption */
static int s_one_token(const wk_batcher *b, const s_rec *s) {
    const int at = s_at(b, s);
    return s->len - at == 1 || (s_split(b) && at >= s->n_prompt && at < s->len);
}

/* builds the next step of lane l's records into L's seqs after its first n0 entries, within budget tokens;
 * returns the entries and the prompt tokens in *prefill */
static int s_build_into(wk_batcher *b, int l, s_lane *L, int n0, int budget, int *prefill) {
    const double t0 = s_t0(b);
    zl_engine *e = b->e;
    int n = n0;
    int *rot = &b->lane[l].rotate; /* the lane's rotation (with steps queued ahead, L is either buffer) */
    L->plp_used = 0;               /* entries [0, n0) are fed ones, which have no prompt rows */
    /* decodes first, rotating the start so that every decoding sequence gets its turn */
    for (int k = 0; k < b->n_scan && n < e->max_batch && budget > 0; k++) {
        int i = (k + *rot) % b->n_scan;
        const s_rec *s = &b->recs[i];
        if (!s_ready(b, i, l) || !s_one_token(b, s)) continue;
        budget -= s_entry(b, L, i, n++, 1);
    }
    *rot = (*rot + 1) % b->n_scan;
    /* then prefills, by priority and oldest admission first, within the prefill cap and, while sequences decode,
     * within what the decodes leave of the step budget (never less than a quarter of it, so that prompts go on
     * when decodes alone fill it). The budget keeps running streams at their pace against prompts of their
     * priority or lower; a prompt of a higher priority than every decoding sequence is not held back for them: it
     * takes the step as a prompt alone would (beside the decodes), so that it waits behind lower-priority work for
     * no more than the steps already built */
    if (budget > b->prefill_cap) budget = b->prefill_cap;
    int share = budget, dprio = INT_MIN;
    if (b->step_budget > 0) {
        for (int j = 0; j < n; j++)
            if (b->recs[L->seq_rec[j]].priority > dprio) dprio = b->recs[L->seq_rec[j]].priority;
        const int top = s_decoding(b, l);
        if (top > dprio) dprio = top;
        if (dprio != INT_MIN) {
            int least = b->step_budget / 4 > 0 ? b->step_budget / 4 : 1;
            share = b->step_budget - n;
            if (share < least) share = least;
            if (share > budget) share = budget;
        }
    }
    int n_decode = n, used = 0;
    while (n < e->max_batch && used < budget) {
        int best = -1;
        for (int i = 0; i < b->n_rec; i++) {
            const s_rec *s = &b->recs[i];
            if (!s_ready(b, i, l) || s_one_token(b, s)) continue;
            int taken = 0;
            for (int j = 0; j < n; j++) taken |= L->seq_rec[j] == i;
            if (taken) continue;
            if (best < 0 || s_before(s, &b->recs[best])) best = i;
        }
        if (best < 0) break;
        /* candidates come by priority: once one is held to the share, every later one is too */
        const int lim = (b->recs[best].priority > dprio ? budget : share) - used;
        if (lim <= 0) break;
        used += s_entry(b, L, best, n++, lim);
    }
    *prefill = n > n_decode ? used : 0;
    s_ph(b, WK_PH_BUILD, t0);
    s_masks(b, L, n0, n);
    return n;
}

/* builds lane l's next step in its seqs; returns the entries and the prompt tokens in *prefill */
static void s_kv_prepare(wk_batcher *b);
static int s_build(wk_batcher *b, int l, int *prefill) {
    if (b->paged) s_kv_prepare(b);
    return s_build_into(b, l, &b->lane[l], 0, b->e->max_step_tokens, prefill);
}

static void s_apply(wk_batcher *b, s_lane *L, int n, wk_event *ev, int *ne);

/* L's step of its first n entries on engine lane `lane`, its ids into out_tok */
static void s_set_step(s_lane *L, int n, int lane) {
    memset(&L->st, 0, sizeof L->st);
    L->st.seqs = L->seqs;
    L->st.n = n;
    L->st.lane = lane;
    L->st.out_tokens = L->out_tok;
    L->st.out_logprobs = L->out_lp;
}

/* runs L's first n entries as one synchronous step on lane 0 (engine_step with logprobs) */
static int s_run_sync(wk_batcher *b, s_lane *L, int n) {
    s_set_step(L, n, 0);
    L->st.sync = 1;
    s_ph_gap(b);
    const double t0 = s_t0(b);
    const int rc = engine_run(b->e, &L->st);
    s_ph(b, WK_PH_DEVICE, t0);
    s_ph_collected(b);
    return rc;
}

/* queues L's n entries behind the step in flight (steps queued ahead) and books them on their records */
static int s_launch_ahead(wk_batcher *b, s_lane *L, int n, int prefill, char *err, size_t errlen) {
    s_set_step(L, n, 0);
    if (b->fl_count == 1) s_ph_gap(b); /* the launch that fills the queue again */
    const double t0 = s_t0(b);
    if (engine_launch(b->e, &L->st) != 0) {
        snprintf(err, errlen, "%s", b->e->err);
        return -1;
    }
    s_ph(b, WK_PH_LAUNCH, t0);
    for (int j = 0; j < n; j++) {
        s_rec *s = &b->recs[L->seq_rec[j]];
        const zl_seq *q = &L->seqs[j];
        s->inflight++;
        s->n_sched += q->n_tokens;
        s->n_gen_sched += q->sample != 0;
        s->last_sampled = q->sample != 0;
    }
    L->n = n;
    L->prefill = prefill;
    b->fl_count++;   /* fl_head and fl_count order the two steps (busy and ord are the lanes' bookkeeping) */
    return 0;
}

/* The late masks of B's fed constrained entries (zl_seq.mask_late), once the step before it has been applied:
 * computed from the matchers that took that step's ids (a sequence that ended meanwhile gets all ids: its result
 * is dropped), then announced to the engine, whose sampling of B waits for them. s_late_start starts them on the
 * mask threads' workers and returns, so that they are computed while the caller turns the collected step's events
 * into its `out` message; s_late_finish (batcher_masks_flush, else the next batcher_step before anything else,
 * and before anything that would free a matcher or the pool) computes what is left on the caller's thread, waits
 * for the workers and announces them. In between, the workers own B's matchers (live ones, held by the
 * step in flight, which nothing frees) and masks; the caller touches neither. */
static int s_late_start(wk_batcher *b, s_lane *B, char *err, size_t errlen) {
    int cnt = 0, any = 0;
    for (int j = 0; j < B->n; j++) {
        zl_seq *q = &B->seqs[j];
        if (!q->mask_late) continue;
        any = 1;
        const s_rec *s = &b->recs[B->seq_rec[j]];
        if (s->live && s->gm) b->late_list[cnt++] = j;
        else memset((uint32_t *)q->mask, 0xFF, (size_t)b->mask_words * sizeof(uint32_t));
    }
    if (!any) return 0;
    const double t0 = s_t0(b);
    b->late_lane = B;
    b->late_job.b = b;
    b->late_job.L = B;
    b->late_job.list = b->late_list;
    b->late_job.n = cnt;
    atomic_store_explicit(&b->late_job.next, 0, memory_order_relaxed);
    b->late_async = cnt > 1 && b->mask_pool && cpu_pool_threads(b->mask_pool) > 1;
    if (b->late_async) cpu_pool_start(b->mask_pool, s_mask_run, &b->late_job);
    s_ph(b, WK_PH_MASKS, t0);
    return b->late_async ? 0 : s_late_finish(b, err, errlen);
}

int batcher_masks_flush(wk_batcher *b, char *err, size_t errlen) { return s_late_finish(b, err, errlen); }

static int s_late_finish(wk_batcher *b, char *err, size_t errlen) {
    s_lane *B = b->late_lane;
    if (!B) return 0;
    const double t0 = s_t0(b);
    if (b->late_async) cpu_pool_join(b->mask_pool);
    else s_mask_run(&b->late_job, 0, 1);
    b->late_async = 0;
    b->late_lane = NULL;
    if (engine_masks_ready(b->e, &B->st) != 0) {
        snprintf(err, errlen, "%s", b->e->err);
        return -1;
    }
    s_ph(b, WK_PH_MASKS, t0);
    return 0;
}

/* one call with steps queued ahead: with nothing in flight, the next step is launched; then the step behind it
 * (the fed continuations of its sampling entries, then whatever else can run) is queued before the older one
 * is waited for and applied */
static int s_step_ahead(wk_batcher *b, wk_event *ev, int ne, int *n_ev, char *err, size_t errlen) {
    zl_engine *e = b->e;
    *n_ev = ne;
    if (b->fl_count == 0) {
        b->t_collected = 0; /* nothing in flight: no critical path to the launch behind this one */
        if (b->paged) s_kv_prepare(b);
        s_lane *L = &b->lane[b->fl_head];
        int prefill, n = s_build_into(b, 0, L, 0, e->max_step_tokens, &prefill);
        if (n == 0) return 0;
        if (s_launch_ahead(b, L, n, prefill, err, errlen) != 0) return -1;
    }
    s_lane *A = &b->lane[b->fl_head], *B = &b->lane[b->fl_head ^ 1];
    if (b->fl_count == 1) {
        int nb = 0, budget = e->max_step_tokens, prefill = 0;
        if (b->paged) s_kv_prepare(b); /* with the step in flight: its fed continuations' positions too */
        const double t0 = s_t0(b);
        for (int j = 0; j < A->n && nb < e->max_batch && budget > 0; j++)
            if (s_can_feed(b, A->seq_rec[j])) {
                s_entry_fed(b, B, A->seq_rec[j], nb++);
                budget--;
            }
        s_ph(b, WK_PH_BUILD, t0);
        if (nb < e->max_batch && budget > 0) nb = s_build_into(b, 0, B, nb, budget, &prefill);
        if (nb > 0 && s_launch_ahead(b, B, nb, prefill, err, errlen) != 0) return -1;
    }
    const double t0 = s_t0(b);
    if (engine_wait(e, &A->st) != 0) {
        snprintf(err, errlen, "%s", e->err);
        return -1;
    }
    s_ph(b, WK_PH_DEVICE, t0);
    s_ph_collected(b);
    b->fl_head ^= 1;
    b->fl_count--;
    b->steps++;
    b->last_prefill = A->prefill;
    b->last_tokens = 0;
    for (int j = 0; j < A->n; j++) b->last_tokens += A->seqs[j].n_tokens;
    s_apply(b, A, A->n, ev, &ne);
    *n_ev = ne;
    if (b->fl_count == 1 && s_late_start(b, B, err, errlen) != 0) return -1;
    return 1;
}

/* applies the results of lane L's n entries (out_tok): positions advance, tokens and events for the running
 * sequences, records of ended or cancelled sequences are released (their KV slots go to waiting records) */
typedef struct {
    wk_batcher *b;
    s_lane *L;
    int n;
    atomic_int next;
} s_accept_job;

/* any thread: entries of the accept list taken in turn, each result into mask_list's sign (-1 - entry: refused) */
static void s_accept_run(void *ctx, int ith, int nth) {
    s_accept_job *j = ctx;
    (void)ith;
    (void)nth;
    for (int k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) {
        const int e = j->b->mask_list[k];
        s_rec *s = &j->b->recs[j->L->seq_rec[e]];
        if (grammar_matcher_accept_token(s->gm, j->b->gvocab, j->L->out_tok[e]) != 0) j->b->mask_list[k] = -1 - e;
    }
}

/* advances the matchers of L's live constrained entries that sampled by their tokens (on several threads: one
 * matcher per sequence); *refused gets, per entry, 1 where the grammar refused the token */
static void s_accepts(wk_batcher *b, s_lane *L, int n, uint8_t *refused) {
    int cnt = 0;
    for (int j = 0; j < n; j++) {
        refused[j] = 0;
        const s_rec *s = &b->recs[L->seq_rec[j]];
        const int32_t t = L->out_tok[j];
        if (s->live && s->gm && L->seqs[j].sample && t >= 0 && t < b->vocab) b->mask_list[cnt++] = j;
    }
    s_accept_job job = {b, L, cnt, 0};
    if (cnt > 1 && b->mask_pool) cpu_pool_run(b->mask_pool, s_accept_run, &job);
    else if (cnt > 0) s_accept_run(&job, 0, 1);
    for (int k = 0; k < cnt; k++)
        if (b->mask_list[k] < 0) refused[-1 - b->mask_list[k]] = 1;
}

/* the prompt logprob rows of entry q that were not sent before, into event v (positions q->pos + 1 on) */
static void s_plp_event(s_rec *s, const zl_seq *q, wk_event *v) {
    int skip = s->plp_sent - (q->pos + 1);
    if (skip < 0) skip = 0;
    if (skip > q->plp_rows) skip = q->plp_rows;
    v->plp_start = q->pos + 1 + skip;
    v->n_plp = q->plp_rows - skip;
    v->plp = v->n_plp ? q->plp_out + skip : NULL;
    if (q->pos + 1 + q->plp_rows > s->plp_sent) s->plp_sent = q->pos + 1 + q->plp_rows;
}

static void s_apply(wk_batcher *b, s_lane *L, int n, wk_event *ev, int *ne) {
    int released = 0;
    double t0 = s_t0(b);
    s_accepts(b, L, n, b->refused);
    t0 += s_ph(b, WK_PH_ACCEPT, t0);
    for (int j = 0; j < n; j++) {
        int i = L->seq_rec[j];
        s_rec *s = &b->recs[i];
        const zl_seq *q = &L->seqs[j];
        s->inflight--;
        if (!s->live) {   /* cancelled, cleared or ended while in flight: drop the results, free the slot with
                           * its last step in flight */
            if (s->inflight == 0) {
                s_release(b, i);
                released = 1;
            }
            continue;
        }
        s->n_past += q->n_tokens;
        if (b->kvp && !b->kv_no_reuse && s->n_past >= s->n_prompt &&
            s->kvt.n_published * kv_pool_block_size(b->kvp) + kv_pool_block_size(b->kvp) <= s->n_prompt)
            kv_table_publish(b->kvp, &s->kvt, b->kv_key, s->toks, s->n_prompt); /* the prompt's KV is written */
        if (!b->share_err[0]) (void)s_share(b, i, b->share_err, sizeof b->share_err); /* its siblings' KV */
        if (!q->sample) {
            /* a prompt chunk: its prompt logprobs, and the end of a scoring-only sequence (max_tokens 0) */
            const int done = s->max_tokens == 0 && s->n_past >= s->n_prompt;
            wk_event pe = {.rid = s->rid, .tok = -1, .fin = done ? WK_FIN_LENGTH : WK_FIN_NONE};
            s_plp_event(s, q, &pe);
            if (!pe.n_plp && !done) continue;
            ev[(*ne)++] = pe;
            if (done && s->inflight == 0) {
                s_release(b, i);
                released = 1;
            } else if (done) {
                s->live = 0;
            }
            continue;
        }
        int32_t t = L->out_tok[j];
        if (t < 0 || t >= b->vocab) {
            /* an engine that returns an impossible id is broken; end the sequence rather than index with it */
            ev[(*ne)++] = (wk_event){.rid = s->rid, .tok = -1, .fin = WK_FIN_ERROR};
            if (s->inflight == 0) {
                s_release(b, i);
                released = 1;
            } else {
                s->live = 0;
            }
            continue;
        }
        s->toks[s->len++] = t;
        s->n_gen++;
        if (b->kvp && !b->paged && s->kvt.n_blocks)
            kv_table_grow(b->kvp, &s->kvt, 1); /* within the slots' blocks: never short (paged: s_kv_prepare) */
        /* the matcher has taken t (s_accepts); a token the mask did not allow (an engine that ignored it) ends the
         * sequence as an error */
        int fin = s->gm && b->refused[j] ? WK_FIN_ERROR : s_finish(b, s, t);
        wk_event *v = &ev[(*ne)++];
        v->rid = s->rid;
        v->tok = t;
        v->fin = fin;
        v->has_lp = s->samp.logprobs != 0;
        if (v->has_lp) v->lp = L->out_lp[j];
        s_plp_event(s, q, v);
        if (fin && s->inflight == 0) {
            s_release(b, i);
            released = 1;
        } else if (fin) {
            s->live = 0;   /* a fed step for it is in flight: its result is dropped, the slot freed with it */
        }
    }
    if (released) s_give_slots(b);
    s_ph(b, WK_PH_APPLY, t0);
}

/* evens the lanes out after lane l's collect: while l has 2 or more sequences more than the lightest lane, its
 * newest moves there (none of l's sequences is in flight now; the lightest lane's step in flight, if any, does
 * not hold it, so its next step is simply the other lane's next one) */
static void s_balance(wk_batcher *b, int l) {
    int cnt[WK_MAX_LANES];
    s_lane_counts(b, cnt);
    for (;;) {
        int lo = 0;
        for (int k = 1; k < b->lanes; k++)
            if (cnt[k] < cnt[lo]) lo = k;
        if (cnt[l] <= cnt[lo] + 1) return;
        int pick = -1;
        for (int i = 0; i < b->n_rec; i++) {
            const s_rec *s = &b->recs[i];
            if (s->active && s->live && s->lane == l && !s->inflight &&
                (pick < 0 || s->order > b->recs[pick].order))
                pick = i;
        }
        if (pick < 0) return;
        b->recs[pick].lane = lo;
        cnt[l]--;
        cnt[lo]++;
    }
}

/* 1 when lane l has a sequence that could run now */
static int s_lane_work(const wk_batcher *b, int l) {
    for (int i = 0; i < b->n_rec; i++)
        if (s_ready(b, i, l)) return 1;
    return 0;
}

static int s_step_any(wk_batcher *b, wk_event *ev, int ne, int *n_ev, char *err, size_t errlen);

int batcher_step(wk_batcher *b, wk_event *ev, int cap, int *n_ev, char *err, size_t errlen) {
    *n_ev = 0;
    if (cap < batcher_event_cap(b)) {
        snprintf(err, errlen, "batcher: event buffer of %d < %d", cap, batcher_event_cap(b));
        return -1;
    }
    if (b->timing) {
        for (int p = 0; p < WK_PH_N; p++) b->ph[p] = -1;
        b->ph_grammar = 0;
        for (int i = 0; i < b->n_rec && !b->ph_grammar; i++)
            b->ph_grammar = b->recs[i].active && b->recs[i].live && b->recs[i].gm;
    }
    if (s_late_finish(b, err, errlen) != 0) return -1; /* the late masks of the step in flight, announced */
    int ne = 0;
    for (int i = 0; i < b->n_pending; i++) ev[ne++] = b->pending[i];
    b->n_pending = 0;
    if (b->share_err[0] || s_share(b, -1, b->share_err, sizeof b->share_err) != 0) {
        snprintf(err, errlen, "%s", b->share_err);
        *n_ev = ne;
        return -1;
    }
    const int rc = s_step_any(b, ev, ne, n_ev, err, errlen);
    if (rc == 0) b->t_collected = 0; /* idle: the next step's gap starts afresh */
    if (rc >= 0 && b->share_err[0]) {
        snprintf(err, errlen, "%s", b->share_err);
        return -1;
    }
    return rc;
}

/* batcher_step after the pending acknowledgements (ne of them in ev) and the KV copies */
static int s_step_any(wk_batcher *b, wk_event *ev, int ne, int *n_ev, char *err, size_t errlen) {
    zl_engine *e = b->e;
    if (b->ahead) return s_step_ahead(b, ev, ne, n_ev, err, errlen);
    if (b->lanes == 1) {   /* one synchronous step over every sequence */
        s_lane *L = &b->lane[0];
        int prefill, n = s_build(b, 0, &prefill);
        if (n == 0) {
            *n_ev = ne;
            return 0;
        }
        b->last_prefill = prefill;
        if (s_run_sync(b, L, n) != 0) {
            snprintf(err, errlen, "%s", e->err);
            *n_ev = ne;
            return -1;
        }
        b->steps++;
        b->last_tokens = 0;
        for (int j = 0; j < n; j++) {
            b->last_tokens += L->seqs[j].n_tokens;
            b->recs[L->seq_rec[j]].inflight++;   /* s_apply counts the step off */
        }
        s_apply(b, L, n, ev, &ne);
        *n_ev = ne;
        return 1;
    }
    /* lanes: the next lane in turn with a step in flight or work. Taking turns in a fixed cyclic order keeps the
     * collects in submission order: the lanes in flight, oldest first, are always in cyclic order from next_lane,
     * and the lanes skipped on the way have nothing in flight. The ordinal check makes that a tested fact. */
    int l = -1;
    for (int k = 0; k < b->lanes && l < 0; k++) {
        int c = (b->next_lane + k) % b->lanes;
        if (b->lane[c].busy || s_lane_work(b, c)) l = c;
    }
    if (l < 0) {
        *n_ev = ne;
        return 0;
    }
    b->next_lane = (l + 1) % b->lanes;
    s_lane *L = &b->lane[l];
    int did = 0;
    if (L->busy) {
        if (L->ord != b->ord_collect) {
            snprintf(err, errlen, "batcher: lane %d's step %llu is not the oldest in flight (%llu)", l,
                     (unsigned long long)L->ord, (unsigned long long)b->ord_collect);
            *n_ev = ne;
            return -1;
        }
        const double t0 = s_t0(b);
        if (b->async && engine_wait(e, &L->st) != 0) {
            snprintf(err, errlen, "%s", e->err);
            *n_ev = ne;
            return -1;
        }
        if (b->async) {
            s_ph(b, WK_PH_DEVICE, t0);
            s_ph_collected(b);
        }
        L->busy = 0;
        b->ord_collect++;
        b->steps++;
        s_apply(b, L, L->n, ev, &ne);
        did = 1;
    }
    s_balance(b, l);
    int prefill, n = s_build(b, l, &prefill);
    if (n > 0) {
        b->last_prefill = prefill;
        b->last_tokens = 0;
        for (int j = 0; j < n; j++) b->last_tokens += L->seqs[j].n_tokens;
        /* an engine without lanes runs the step now; its tokens wait in out_tok for the lane's collect */
        s_set_step(L, n, l);
        int rc;
        if (b->async) {
            s_ph_gap(b);
            const double t0 = s_t0(b);
            rc = engine_launch(e, &L->st);
            s_ph(b, WK_PH_LAUNCH, t0);
        } else {
            rc = s_run_sync(b, L, n);
        }
        if (rc != 0) {
            snprintf(err, errlen, "%s", e->err);
            *n_ev = ne;
            return -1;
        }
        for (int j = 0; j < n; j++) b->recs[L->seq_rec[j]].inflight++;
        L->n = n;
        L->busy = 1;
        L->ord = b->ord_next++;
        did = 1;
    }
    *n_ev = ne;
    return did;
}
