/* worker/batcher.h: continuous batching over an engine (engine/engine.h).
 *
 * The batcher owns the engine's KV slots: a sequence (an `assign` entry from the broker) takes a free slot, is
 * prefilled in chunks that share steps with the other sequences' decodes, samples one token per step once its
 * prompt is in, and leaves its slot when it stops (end-of-generation or stop id, max_tokens, context full) or is
 * cancelled. batcher_step() runs one engine step and reports one event per sequence that produced a token or
 * ended, plus the pending acknowledgements (cancels, rejected assignments). The batcher never talks to the
 * network: the worker turns its events into `out` messages (docs/protocol.md).
 *
 * Everything from the broker is checked here (ids below the vocabulary, lengths within the slot's context,
 * duplicate rids, sampling ranges, logit bias ids and values): a bad sequence is rejected with fin=4, never run.
 *
 * Lanes (docs/pipeline.md): with lanes > 1 the sequences are split into that many independent groups, each
 * with at most one step in flight (engine_launch / engine_wait on the engine's lanes), so that a pipelined engine
 * keeps every stage busy: submit A, submit B, collect A, submit A, collect B, submit B, ... Each batcher_step()
 * handles one lane: it collects that lane's step in flight (its events) and submits the lane's next step. An
 * engine of one lane (engine_lanes) is driven synchronously (the step runs at the submit, its events come
 * with the collect), which gives the same tokens. With 1 lane (the default for such engines) batcher_step()
 * runs one synchronous engine_step() over all sequences, as it always did. A sequence belongs to one lane
 * (assigned at admission to the lane with the fewest sequences; moved only between its steps to even the lanes
 * out), and never has two steps in flight.
 *
 * Steps queued ahead (one lane over the CUDA engine; batcher_set_ahead): each
 * batcher_step() queues the next step behind the one in flight, its sequences' tokens fed on the device from the
 * samples of the step in flight, and then collects that step: the GPU does not wait for the host between
 * steps. A step is then in flight between calls (batcher_in_flight), and a sequence that ends may have one more
 * step in flight, whose result is dropped; its events are those of synchronous steps. */
#ifndef ZLLM_BATCHER_H
#define ZLLM_BATCHER_H
#include <stddef.h>
#include <stdint.h>
#include "engine.h"
#include "grammar.h"

/* finish codes of an `out` entry (docs/protocol.md) */
enum { WK_FIN_NONE = 0, WK_FIN_STOP = 1, WK_FIN_LENGTH = 2, WK_FIN_CANCELLED = 3, WK_FIN_ERROR = 4 };

#define WK_MAX_STOP_IDS 64         /* protocol limit on stop_ids per sequence */
#define WK_MAX_LANES 8             /* most lanes of one batcher */

/* one sequence to run, as assigned by the broker; everything is copied by batcher_add */
typedef struct {
    uint64_t rid;                  /* the broker's sequence id */
    const int32_t *tokens;         /* [n_tokens] the whole prompt */
    int n_tokens;                  /* prompt length, >= 1 */
    int max_tokens;                /* most tokens to generate, >= 1 */
    zl_sampling samp;              /* sampling parameters (seed included) */
    const int32_t *stop_ids;       /* [n_stop_ids] extra ids that end generation */
    int n_stop_ids;                /* <= WK_MAX_STOP_IDS */
    int ignore_eos;                /* 1: end-of-generation ids do not stop it */
    zg_grammar *grammar;           /* structured output (docs/structured-output.md): every sampled token follows
                                    * it, and the sequence stops when the grammar can go no further; NULL: none.
                                    * The batcher keeps a reference */
    const zl_bias *bias;           /* [n_bias] logit bias (ids below the vocabulary, |bias| <= 100) */
    int n_bias;                    /* 0..ZL_MAX_LOGIT_BIAS */
    uint64_t share;                /* rid of a sequence admitted before it with the same prompt (a sibling of the
                                    * same generate): its prompt KV but the last token's is copied from that one
                                    * once written (zl_engine_ops.copy_kv) instead of prefilled (paged KV: it waits
                                    * until that one's prompt blocks are published and finds their full blocks in
                                    * the prefix cache); 0, an unknown rid, another prompt or an engine without
                                    * copy_kv: prefilled as usual */
    int priority;                  /* higher prefills (and gets a freed KV slot) first; the broker's range */
    int prompt_lp;                 /* 1: report the logprobs of prompt positions 1..n_tokens-1 (wk_event.plp), which
                                    * needs every prompt row's logits: such a sequence prefills its whole prompt itself
                                    * (no `share` copy, and never a prefix-cache hit, should the prompt KV ever be
                                    * reused) on an engine with ZL_CAP_PROMPT_LOGPROBS; with it max_tokens may be 0
                                    * (scoring only: the sequence ends with fin 2 once its prompt is in) */
    int prompt_top;                /* alternatives per prompt position, 0..ZL_MAX_TOP_LOGPROBS */
} wk_request;

/* one entry of an `out` message */
typedef struct {
    uint64_t rid;                  /* sequence */
    int32_t tok;                   /* token produced this step, -1 if none */
    int fin;                       /* WK_FIN_* */
    int has_lp;                    /* 1: lp holds tok's logprobs (the sequence asked for them: samp.logprobs) */
    zl_logprobs lp;                /* tok's log probability and top alternatives (engine/logprobs.h) */
    int plp_start;                 /* prompt logprobs this step (wk_request.prompt_lp): plp[j] scores the prompt token
                                    * at position plp_start + j (>= 1) */
    int n_plp;                     /* entries in plp, 0: none */
    const zl_logprobs *plp;        /* [n_plp], the batcher's: valid until the next batcher_step */
} wk_event;

typedef struct wk_batcher wk_batcher;

/* Creates a batcher over e (borrowed; it must outlive the batcher) with engine_lanes(e) lanes. eog: [vocab] 1 for
 * end-of-generation ids (copied). Returns NULL with a message on bad arguments or out of memory. */
wk_batcher *batcher_new(zl_engine *e, const uint8_t *eog, int vocab, char *err, size_t errlen);
/* idempotent; sets *b to NULL. Steps still in flight are not collected (the engine's destroy copes). */
void batcher_destroy(wk_batcher **b);
/* Sets the number of lanes (1 disables them), before any sequence is added: lanes is clamped to
 * 1..WK_MAX_LANES, and to engine_lanes() for an engine of several lanes (an engine of one lane is driven
 * synchronously, any number of lanes). Returns the lanes now in use, or -1 (nothing changed) while
 * sequences run or steps are in flight. */
int batcher_set_lanes(wk_batcher *b, int lanes);
/* steps queued ahead (batcher.c): on or off (one synchronous step per call). By default on with one lane over an
 * engine whose launch is asynchronous (zl_engine.launch_async: CUDA), off over the CPU engine (its launch runs the
 * step, so queuing ahead would only delay the ids); this call (zllm-worker --ahead 1 / 0) forces
 * it on (wherever the engine queues steps ahead: engine_depth 2) or off. Refused (-1) while sequences run or a
 * step is in flight; returns whether steps are now queued ahead (0 where the engine or the lanes do not allow it) */
int batcher_set_ahead(wk_batcher *b, int on);
int batcher_ahead(const wk_batcher *b);        /* 1 while steps are queued ahead */
int batcher_lanes(const wk_batcher *b);       /* lanes in use */
int batcher_in_flight(const wk_batcher *b);   /* lanes with a step submitted and not yet collected */

/* The vocabulary grammar masks are computed over (borrowed; it must outlive the batcher); without it, or over an
 * engine that does not apply masks (zl_engine.masks), a request with a grammar is rejected. A sequence with a
 * grammar gets its mask computed on the CPU when its sampling entry is built; with steps queued ahead over an
 * engine that takes late masks (zl_engine.masks_late: CUDA) it is fed like any other sequence and the mask of its
 * fed entry is computed once the step in flight is collected, on the mask threads while the device runs the fed
 * step and the caller handles the returned events, and announced to the engine by batcher_masks_flush or at the
 * start of the next batcher_step (elsewhere it is never fed: each mask needs the previous token). Between the two calls the mask
 * threads read those sequences' matchers; batcher_add, batcher_cancel and batcher_clear stay safe (they free no
 * matcher of a step in flight), and batcher_destroy and batcher_set_mask_threads wait for the threads first. */
void batcher_set_vocab(wk_batcher *b, const zg_vocab *v);
/* Announces the late masks that the last batcher_step left to the mask threads (waiting for them, and computing
 * what they have not taken on the caller's thread), so that the device's sampling of the step in flight goes on;
 * a no-op when none are pending. The worker calls it once the step's `out` is sent, before reading the broker;
 * otherwise the next batcher_step does it first. 0, or -1 with err on an engine error (the caller must exit). */
int batcher_masks_flush(wk_batcher *b, char *err, size_t errlen);
/* Computes each step's masks, and advances the matchers by the collected tokens, on n threads (the caller's included;
 * <= 1: on the caller's only). 0, or -1 with err
 * when a thread cannot start (the masks then stay on the caller's thread). */
int batcher_set_mask_threads(wk_batcher *b, int n, char *err, size_t errlen);

/* Admits r. Returns 0 when admitted; 1 when r.rid is already running (the duplicate is ignored and counted); -1
 * when r is invalid or there is no free slot: a fin=4 event is queued for r.rid and err says why. A slot freed
 * by a cancel counts as free at once, as the broker assumes (docs/protocol.md), even while the cancelled
 * sequence's step is still in flight: the new sequence then waits (runs nothing) until that step is collected
 * and the slot really is free. */
int batcher_add(wk_batcher *b, const wk_request *r, char *err, size_t errlen);
/* Queues a fin=4 (error) event for rid, an assignment refused before batcher_add (a grammar that does not
 * compile here). */
void batcher_refuse(wk_batcher *b, uint64_t rid);
/* Ends rid and queues its fin=3 acknowledgement; its slot is released at once, or, when a step of rid is in
 * flight, when that step is collected (its results are then dropped). Returns 1 if rid was running, 0 if
 * unknown (ignored). */
int batcher_cancel(wk_batcher *b, uint64_t rid);
/* One lane's turn (the next lane, in turn, that has a step in flight or sequences to run): collects its step in
 * flight and submits its next step (1 lane: runs one synchronous step over every sequence). Writes the pending
 * acknowledgements and the collected step's events to ev[cap] (cap >= batcher_event_cap()), with their count in
 * *n_ev. Returns 1 when a step was collected or submitted, 0 when there was nothing to run, -1 on an engine error
 * (err holds the engine's message; the caller must exit: the device state is unknown). */
int batcher_step(wk_batcher *b, wk_event *ev, int cap, int *n_ev, char *err, size_t errlen);
/* Drops every sequence without events (the broker forgot them) and clears pending acknowledgements. Slots with a
 * step in flight are released when it is collected (a batcher_step() call still has work to do). */
void batcher_clear(wk_batcher *b);

/* Caps the prompt tokens one step may prefill (>= 1; at most the engine's max_step_tokens; decodes are not
 * counted): the worker lowers it when steps get slow, so that its heartbeats keep their pace. */
void batcher_set_prefill_cap(wk_batcher *b, int tokens);
/* The step budget: while any sequence of a lane decodes, its steps hold every decode and prompt chunks of at most
 * max(tokens - decodes, tokens / 4) tokens (besides the prefill cap), so that a long prompt arriving is spread
 * over several steps and the running streams keep their pace; with nothing decoding a prompt takes the engine's
 * max_step_tokens (the time to first token of a lone request). 0 (the default) turns it off. Any value is allowed
 * at any time; it applies from the next step built. */
void batcher_set_step_budget(wk_batcher *b, int tokens);
int batcher_step_budget(const wk_batcher *b);
int batcher_last_step_tokens(const wk_batcher *b); /* tokens (prefill + decode) of the last step run/submitted */
int batcher_last_prefill_tokens(const wk_batcher *b); /* prompt tokens of that step (those under the cap) */
int batcher_prefill_cap(const wk_batcher *b);      /* the current cap */

/* KV blocks (docs/kv-cache.md). Over an engine with paged KV (zl_engine.kv_block > 0) block_size must be the
 * engine's, with one lane (then batcher_set_lanes keeps it; steps may be queued ahead): the batcher's pool is the
 * engine's (kv_blocks blocks), each entry, fed ones included, reads its KV through its sequence's block table, a
 * cached prompt prefix is not prefilled again, and a sequence short of blocks preempts the running one of lowest
 * priority, newest first (possibly itself; never one with a step in flight), which resumes later from its tokens
 * with its sampler state.
 * Otherwise (KV block accounting): the engine keeps one contiguous KV slot per sequence; with block_size
 * > 0 the batcher also keeps a block pool of n_slots * ceil(n_ctx / block_size) blocks and a block table per
 * sequence (a sequence takes its prompt's blocks, with WK_KV_HEADROOM more available, when it gets its KV slot;
 * decoding takes a block each block_size tokens;
 * ended sequences publish their full blocks into the prefix cache), so that its counters and the cached blocks'
 * hashes are what paged KV would hold. With that pool size admission by blocks never refuses a sequence a free
 * slot admits, and growth never runs out. block_size 0 turns it off (the default); model names the hash key.
 * Refused (-1) while sequences run or for a block size outside 0..KV_BLOCK_MAX. */
#define WK_KV_HEADROOM 1 /* blocks admission keeps free beyond the prompt's (capped by what max_tokens can use) */
typedef struct {
    int block_size, blocks, used, free, cached;
    uint64_t hit_tokens;    /* prompt tokens found in the prefix cache at admission */
    uint64_t prompt_tokens; /* prompt tokens admitted */
    int paged;              /* 1: the engine reads KV through the block tables (prefix reuse, preemption) */
    uint64_t preemptions;   /* sequences preempted for blocks (paged) */
    uint64_t resumed_tokens;  /* tokens computed again on resumption, cached prefixes excluded (paged) */
    uint64_t replayed_tokens; /* of which generated tokens replayed as decode entries that do not sample, one a
                               * step (an engine with kv_split_kernels: docs/kv-cache.md) */
    uint64_t evictions;      /* cached blocks reclaimed for new ones */
} wk_kv_stats;
int batcher_set_kv(wk_batcher *b, int block_size, const char *model, char *err, size_t errlen);
int batcher_kv(const wk_batcher *b, wk_kv_stats *st);               /* 1 with st filled when on, else 0 (st zeroed) */
int batcher_kv_hashes(const wk_batcher *b, uint64_t *out, int cap); /* the cap most recent cached block hashes */
/* The prefix cache on (1, the default) or off (0): off, no block is ever published, so no sequence takes a cached
 * block (admission as kv_table_admit's reuse 0, a preempted sequence recomputes every token), nothing is cached
 * and no hash is reported; blocks, their accounting and preemption work as with it on, and the tokens are the
 * same. The baseline that measures what caching buys (docs/kv-cache.md); set it before the first request. */
void batcher_set_prefix_cache(wk_batcher *b, int on);
int batcher_prefix_cache(const wk_batcher *b);
int batcher_running(const wk_batcher *b);     /* sequences running (not counting cancelled ones still in flight) */
int batcher_free_slots(const wk_batcher *b);  /* slots free for batcher_add (engine slots - running) */
int batcher_event_cap(const wk_batcher *b);   /* the most events one batcher_step can report */
uint64_t batcher_steps(const wk_batcher *b);  /* steps run (collected) so far */
uint64_t batcher_duplicates(const wk_batcher *b); /* duplicate assignments ignored */
uint64_t batcher_prefills_shared(const wk_batcher *b); /* sequences whose prompt KV was copied (wk_request.share) */
/* Host timings (worker/phase_times.h): off by default; on, each batcher_step measures its phases (WK_PH_DEVICE,
 * ACCEPT, APPLY, MASKS, BUILD, LAUNCH, GAP) with the monotonic clock. batcher_phases writes the last call's into
 * us[WK_PH_N] (-1 where a phase did not happen, and for the worker's own phases) and returns 1 when a running
 * sequence had a grammar at that call, else 0. */
void batcher_set_timing(wk_batcher *b, int on);
int batcher_phases(const wk_batcher *b, double *us);
/* writes up to cap rids of the running sequences (for error logs); returns the count written */
int batcher_rids(const wk_batcher *b, uint64_t *rids, int cap);
#endif
