/* engine/engine.h: the model interface every backend implements (CPU reference, CUDA).
 *
 * An engine owns n_slots per-sequence KV caches of n_ctx tokens each. One step (zl_step: engine_launch then
 * engine_wait, or engine_step for both) runs a batch of sequences at independent positions: each entry appends
 * n_tokens tokens to its slot starting at pos (a whole or partial prompt: prefill; or one token: decode), and,
 * when `sample` is set, samples the next token from the logits of its last position. Slots need no reset:
 * writing at pos overwrites, and attention reads only positions [0, pos + n_tokens). An engine created with
 * paged KV (zl_engine_opts.kv_block, offered by the CPU and CUDA engines: zl_engine.kv_block) keeps instead one pool of
 * kv_blocks blocks of kv_block rows, and each entry names its rows through its block table (zl_seq.blocks), so
 * that sequences share the blocks of a common prefix (docs/kv-cache.md).
 * Batch invariance is part of the contract: a sequence's tokens and logits do not depend on which other
 * sequences share its step, nor on its index in the batch. */
#ifndef ZLLM_ENGINE_H
#define ZLLM_ENGINE_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "model.h"
#include "logprobs.h"
#include "penalty.h"
#include "sampler.h"

typedef struct {
    int slot;                /* KV slot in [0, n_slots); one sequence per slot per step */
    int pos;                 /* position of tokens[0]; the slot holds valid KV for [0, pos) */
    int n_tokens;            /* tokens this step, >= 1, pos + n_tokens <= n_ctx */
    const int32_t *tokens;   /* [n_tokens] token ids, each in [0, vocab) */
    int sample;              /* 1: sample after the last token; 0: prefill chunk only (out_tokens gets -1) */
    const zl_sampling *samp; /* sampling parameters; NULL means greedy */
    const int32_t *history;  /* the sequence's tokens so far incl. these (for the repetition penalty), or NULL */
    int n_history;           /* entries in history */
    int history_prompt;      /* history[0 .. history_prompt) is the prompt: the presence/frequency penalties count
                                * history[history_prompt .. n_history), the generated tokens (engine/penalty.h;
                                * none while n_history <= history_prompt) */
    const zl_bias *bias;     /* [n_bias] logit bias added before sampling (engine/penalty.h), or NULL */
    int n_bias;              /* entries in bias, 0..ZL_MAX_LOGIT_BIAS */
    uint64_t *rng;           /* per-sequence generator state, advanced when sampling (may be NULL if greedy) */
    int feed;                /* 1: a decode entry (n_tokens 1) whose token is the id the engine sampled for this
                                * slot in the latest earlier step (launched or run) that had the slot, and whose
                                * generator state continues from that step's on the device: tokens and *rng are
                                * not read (a step queued behind one whose ids the host has not seen yet, depth 2
                                * in zl_engine_ops). That step must have sampled the slot (sample 1), and the
                                * entry may not use the repetition, presence or frequency penalty (its history
                                * would lack the fed id);
                                * otherwise the step fails with nothing started. 0: tokens as given */
    const uint32_t *mask;    /* structured output: the ids sampling may pick, as bits (bit i of mask[i / 32]) over
                                * the vocabulary, applied to the logits before the sampler (sampler_mask.h); NULL:
                                * every id. Read only with sample set, by an engine whose zl_engine.masks is 1
                                * (callers check it: one with 0 ignores masks); out_logits stay unmasked on the CPU
                                * engines (on CUDA a masked row's logits come back masked) */
    int plp_rows;            /* prompt logprobs: rows [0, plp_rows) of this entry (plp_rows <= n_tokens) report the
                                * log probability of plp_next[j] under the logits of row j (position pos + j) and
                                * their top plp_top alternatives (engine/logprobs.h: logprobs_prompt_row); 0: none.
                                * Only on an engine with ZL_CAP_PROMPT_LOGPROBS, never on a fed entry */
    int plp_top;             /* alternatives per row, 0..ZL_MAX_TOP_LOGPROBS */
    const int32_t *plp_next; /* [plp_rows] the ids the rows score (the prompt's next tokens), each in [0, vocab) */
    zl_logprobs *plp_out;    /* [plp_rows] the rows' results, the caller's buffer: written by the step's wait (the
                                * CPU engines write them at the launch) */
    int mask_late;           /* 1: mask's contents are written by the caller after the launch and announced with
                                * engine_masks_ready before the step is waited for (a fed entry's mask depends on
                                * the id of the step in flight); only on an engine with zl_engine.masks_late, in a
                                * step queued behind another (not sync), with mask and sample set */
    const int32_t *blocks;   /* paged KV (zl_engine.kv_block > 0): the sequence's block table, at least
                                * ceil((pos + n_tokens) / kv_block) ids in [0, kv_blocks): position p's KV is row
                                * p % kv_block of pool block blocks[p / kv_block]. Required there (slot then names
                                * only the sequence's launch state: feeds, generator carries); the step writes rows
                                * pos .. pos + n_tokens - 1 and reads rows 0 .. pos + n_tokens - 1. Ignored by an
                                * engine with kv_block 0 (one contiguous slot of n_ctx rows per slot) */
    int prompt;              /* 1: a prompt entry: its positions lie before the prompt's end (its tokens are the
                                * request's); 0: a decode entry when it has one token (the token fed was generated,
                                * or the caller does not say). An entry of more tokens is always computed as prompt
                                * rows. On an engine with kv_split_kernels a position's KV depends on this kind
                                * (docs/kv-cache.md): a 1-token prompt entry runs the prefill kernels, a decode
                                * entry the decode kernels; other engines ignore it */
} zl_seq;

typedef struct zl_engine zl_engine;

/* what a back-end's sampling offers besides the id (zl_engine.caps): a step whose entries ask for more than their
 * engine offers is refused (the batcher refuses such sequences at admission) */
enum {
    ZL_CAP_LOGPROBS = 1,        /* zl_sampling.logprobs / top_logprobs, zl_step.out_logprobs */
    ZL_CAP_PENALTY = 2,         /* zl_sampling.presence_penalty / frequency_penalty, zl_seq.bias */
    ZL_CAP_PROMPT_LOGPROBS = 4, /* zl_seq.plp_rows: logprobs of prompt positions */
};

/* One step's arguments and results (zl_engine_ops.launch and .wait). The struct and everything it points to
 * (seqs and their tokens, history, samp, rng; the output buffers) belong to the caller and stay valid and
 * unchanged from the launch until its wait returns; the wait names the step by this same pointer.
 * T below is the step's rows: the sum of seqs[].n_tokens, in seqs order. */
typedef struct {
    const zl_seq *seqs;     /* [n] entries, at most one per slot */
    int n;                  /* entries, 1..max_batch */
    int lane;               /* lane in [0, engine_lanes(e)) (see zl_engine.lanes) */
    int sync;               /* 1: the caller waits for this step before it launches another (engine_step,
                                * engine_run): refused while another step is in flight; an engine may give it all
                                * it has (the pipeline leader cuts it into as many micro-batches as its rings
                                * hold). 0: a step that may stay in flight beside others */
    const float *h_in;      /* pipeline stage (layer_begin > 0): [T][dim] f32 hidden states entering layer
                                * layer_begin; seqs[].tokens are then not read (may be NULL). NULL when
                                * layer_begin == 0: the step embeds seqs[].tokens */
    float *h_out;           /* pipeline stage (layer_end < n_layers): [T][dim] f32 gets the residual stream after
                                * layer layer_end - 1, and out_tokens/out_logits are not touched. NULL on the last
                                * stage or a whole model */
    int h_dev;              /* 1: h_in and h_out are device memory of the engine's GPU (CUDA pipeline stages: the
                                * hidden states never pass through the host); 0: host memory */
    void *const *wait_ev;   /* [n_wait] backend events (cudaEvent_t, often imported from a peer process) the
                                * step waits for after its input copy and before any kernel (h_in written, h_out
                                * free), or NULL; CUDA only */
    int n_wait;             /* 0..4 */
    void *const *record_ev; /* [n_record] backend events recorded after the step's kernels (h_in consumed,
                                * h_out written), or NULL; CUDA only. A CUDA stage before the last that takes
                                * device memory returns from its wait without synchronising (engine_cuda_ready) */
    int n_record;           /* 0..4 */
    int32_t *out_tokens;    /* [n] the sampled ids (-1 where sample == 0); needed on the last stage or a whole
                                * model (a synchronous step on the CPU engine may leave it NULL: logits only) */
    float *out_logits;      /* [n][vocab] f32 logits of each entry's last position, or NULL (tests and the
                                * reference harness); taken only by a step launched with no other in flight */
    zl_logprobs *out_logprobs; /* [n]: entry i's sampled id's logprob and top alternatives where seqs[i] samples
                                * with samp->logprobs set (others untouched), engine/logprobs.h; or NULL */
} zl_step;

/* The engine's one way to run steps: launch starts a step, wait finishes it. A synchronous step is a launch
 * followed at once by its wait (engine_step, engine_run).
 * lanes (zl_engine.lanes): independent groups of sequences; a slot may be in steps in flight on one lane only
 * (its KV positions are written in launch order). depth (zl_engine.depth): the most steps in flight on one lane.
 * Steps on one lane share sequences and run in launch order: with depth 2 a step may be queued behind the one
 * in flight, and its entries with feed = 1 take the id and generator state that the slot's previous step sampled
 * on the device (zl_seq.feed), so the device never waits for the host between the two.
 * launch: starts st (checked whole before anything runs). Returns 0, or -1 with e->err: bad arguments, a lane
 * outside [0, lanes), a lane already holding depth steps in flight (a third launch), a sync step with another
 * in flight, out_logits with another step in flight, a slot already in flight on another lane, a feed the engine
 * cannot serve (see zl_seq.feed); then nothing started and the engine stays usable. -1 after a device or peer
 * error: the caller must then exit. An engine may run the step before launch returns (CPU: zl_engine.launch_async
 * 0) or leave it running (CUDA, the pipeline leader).
 * wait: waits for st, which must be the oldest step launched and not waited for (steps are waited for in launch
 * order, across lanes too). On return st's outputs (out_tokens, out_logits, h_out) hold its results and
 * *seqs[].rng the advanced generator states (an engine may write them earlier: the CPU engine does at the
 * launch). Returns 0, or -1 with e->err: st not in flight or not the oldest (nothing changes), or a device or
 * peer error (the caller must exit). */
typedef struct {
    int (*launch)(zl_engine *e, const zl_step *st);
    int (*wait)(zl_engine *e, const zl_step *st);
    void (*destroy)(zl_engine *e); /* frees everything the backend owns, including e */
    /* optional (NULL: not offered): copies the KV of positions [0, n_tokens) of slot src into slot dst (a sibling
     * sequence with the same prompt prefix, generate's `n`), ordered after every step launched before it and before
     * every step launched after it. dst may not be in a step in flight; src's positions [0, n_tokens) must have
     * been written by steps launched before. dst cannot be fed next (its slot sampled nothing). 0, or -1 with
     * e->err (bad slots or length: nothing copied; a device error: the caller must exit) */
    int (*copy_kv)(zl_engine *e, int src, int dst, int n_tokens);
} zl_engine_ops;

struct zl_engine {
    const zl_engine_ops *ops; /* backend */
    const zl_model *model;    /* borrowed; must outlive the engine */
    char device[32];          /* "cpu", "cpu-ref", "cuda:0" */
    int n_slots;              /* KV slots = most sequences alive at once */
    int n_ctx;                /* tokens per slot */
    int max_batch;            /* most entries in one step */
    int max_step_tokens;      /* most tokens (sum of n_tokens) in one step */
    char err[256];            /* last error */
    int layer_begin;          /* first layer this engine runs (0 unless opts->layer_end was set) */
    int layer_end;            /* one past its last layer (n_layers for a whole model; 0: backend without stages) */
    int lanes;                /* lanes the engine keeps steps in flight on (0 or 1: one lane, id 0; the pipeline
                                * leader says 2, so that its stages all work, docs/pipeline.md) */
    int depth;                /* most steps in flight on one lane (0 or 1: a launch on a lane with a step in
                                * flight is refused; 2: a step may be queued behind the one in flight, with feeds) */
    int masks;                /* 1: the engine applies zl_seq.mask (structured output); 0: it ignores masks, and
                                * the worker refuses such sequences at admission */
    int masks_late;           /* 1: the engine takes masks announced after the launch (zl_seq.mask_late): its
                                * sampling waits on the device for engine_masks_ready, the forward pass does not */
    int (*masks_ready)(zl_engine *e, const zl_step *st); /* with masks_late: see engine_masks_ready */
    int caps;                                            /* ZL_CAP_* the back-end serves */
    /* paged KV (kv_block > 0): copies rows [0, n_rows) of pool block src into block dst, every layer, after every
     * step launched before (a sibling's partial prompt block, generate's `n`); dst may not be read or written by a
     * step in flight. 0, or -1 with err (bad blocks or rows). NULL where not offered */
    int (*copy_block)(zl_engine *e, int src, int dst, int n_rows);
    int kv_block;             /* paged KV: rows per block (zl_seq.blocks); 0: contiguous slots */
    int kv_blocks;            /* paged KV: blocks in the pool */
    int kv_split_kernels;     /* 1: decode entries (zl_seq.prompt 0, one token) and prompt rows run kernels of
                                * different reductions (CUDA), so a position's KV has the bits of a cold run only
                                * when it is computed by the same kind of entry as there: prompt positions as
                                * prompt rows, generated ones as decode entries (the batcher keeps that rule:
                                * docs/kv-cache.md). 0: both give the same bits (the CPU engines) */
    int chunk_variant;        /* 1: a position's KV and logits may have other bits when its prompt's prefill is
                                * chunked or batched otherwise (CUDA with a matrix through cuBLAS, which picks its
                                * algorithm by the row count: F32 models), so a cached prefix would not give a cold
                                * run's bits and the worker turns its prefix cache off; 0: chunk invariant */
    int launch_async;         /* 1: launch returns while the step runs (CUDA): queuing ahead hides the host;
                                * 0: it runs the step before it returns (CPU), so queuing ahead only delays each
                                * step's ids by one step (callers queue ahead there only when asked to) */
};
typedef struct {
    const char *device;  /* "cpu" (fast), "cpu-ref" (f32 reference), "cuda", "cuda:N" */
    int n_slots;         /* 0: max_batch */
    int n_ctx;           /* 0: the model's trained context, capped at 4096 */
    int max_batch;       /* 0: 16 */
    int max_step_tokens; /* 0: 2048 */
    int threads;         /* CPU threads; 0: all cores */
    size_t kv_mem;       /* CUDA KV budget in bytes; 0: a fraction of free memory */
    int no_graphs;       /* CUDA: 1 runs decode eagerly instead of replaying CUDA graphs */
    int layer_begin;     /* pipeline stage: first layer run here; 0 with layer_end 0: the whole model */
    int layer_end;       /* one past the last layer run here, <= n_layers; 0: n_layers */
    int kv_block;        /* paged KV, where the back-end offers it: rows per block, 1..256 on the CPU engines, 16, 32,
                          * 64, 128 or 256 on CUDA (whole models; another size fails engine_new); 0 (and on other
                          * back-ends): contiguous slots. Check zl_engine.kv_block for what was granted */
    int kv_blocks;       /* paged KV: blocks in the pool; 0: n_slots * ceil(n_ctx / kv_block) (CUDA: at most what
                          * the KV budget holds) */
} zl_engine_opts;

/* Creates the backend named by o->device. Returns NULL with a message in err (unknown device, CUDA not
 * built in or no GPU, out of memory, model not supported by the backend). */
zl_engine *engine_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);
/* A back-end's constructor: as engine_new, for a device name the back-end registered. */
typedef zl_engine *(*zl_engine_new_fn)(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);
/* Registers the back-end serving devices "name" and "name:N". Back-ends below the engine layer (cuda/) call it
 * from a constructor function, before main, so that this layer never names them: a binary serves the devices whose
 * back-ends it links. 0, or -1 when the name is empty or longer than 15 bytes, already taken, or the table (8
 * entries) is full. */
int engine_register(const char *name, zl_engine_new_fn fn);
/* the CPU engines, the back-ends of this layer: the f32 reference (engine_new's "cpu-ref", engine/engine_cpu.c) and
 * the fast one on the packed quantized blocks ("cpu", engine/cpu_fast.c) */
zl_engine *engine_cpu_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);
zl_engine *engine_cpu_fast_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);

/* starts a step (zl_engine_ops.launch) */
static inline int engine_launch(zl_engine *e, const zl_step *st) { return e->ops->launch(e, st); }
/* waits for st, the oldest step launched and not waited for (zl_engine_ops.wait) */
static inline int engine_wait(zl_engine *e, const zl_step *st) { return e->ops->wait(e, st); }
/* runs st synchronously: launch, then wait (st->sync should be 1: refused while a step is in flight) */
static inline int engine_run(zl_engine *e, const zl_step *st) {
    return engine_launch(e, st) != 0 ? -1 : engine_wait(e, st);
}
/* one synchronous whole-model step on lane 0: out_tokens[n] gets the sampled ids (-1 where sample == 0),
 * out_logits, when not NULL, [n][vocab] f32 logits. Returns 0, or -1 with e->err (see zl_engine_ops) */
static inline int engine_step(zl_engine *e, const zl_seq *s, int n, int32_t *out_tokens, float *out_logits) {
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = s;
    st.n = n;
    st.sync = 1;
    st.out_tokens = out_tokens;
    st.out_logits = out_logits;
    return engine_run(e, &st);
}
/* Announces that the masks of st's entries with mask_late are written (st launched, not yet waited for); the
 * engine reads them now and its sampling for st goes on. Waiting for st without it treats those entries as
 * unmasked. 0, or -1 with e->err (no such step in flight, or an engine without masks_late). */
static inline int engine_masks_ready(zl_engine *e, const zl_step *st) {
    if (!e->masks_ready) {
        snprintf(e->err, sizeof e->err, "masks_ready: this engine takes no late masks");
        return -1;
    }
    return e->masks_ready(e, st);
}

/* zl_engine_ops.copy_kv, or -1 with e->err when the back-end does not offer it */
static inline int engine_copy_kv(zl_engine *e, int src, int dst, int n_tokens) {
    if (!e->ops->copy_kv) {
        snprintf(e->err, sizeof e->err, "copy_kv: not offered by device %s", e->device);
        return -1;
    }
    return e->ops->copy_kv(e, src, dst, n_tokens);
}
/* the lanes of e (zl_engine.lanes), >= 1 */
static inline int engine_lanes(const zl_engine *e) { return e->lanes > 1 ? e->lanes : 1; }
/* the most steps in flight on one lane of e (zl_engine.depth), >= 1: 2 when e queues steps ahead */
static inline int engine_depth(const zl_engine *e) { return e->depth > 1 ? e->depth : 1; }
/* idempotent; sets *e to NULL */
void engine_destroy(zl_engine **e);
#endif
