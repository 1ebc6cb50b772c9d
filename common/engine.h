/* common/engine.h: the model interface every backend implements (CPU reference, CUDA).
 *
 * An engine owns n_slots per-sequence KV caches of n_ctx tokens each. One engine_step() runs a batch of
 * sequences at independent positions: each entry appends n_tokens tokens to its slot starting at pos (a
 * whole or partial prompt: prefill; or one token: decode), and, when `sample` is set, samples the next
 * token from the logits of its last position. Slots need no reset: writing at pos overwrites, and attention
 * reads only positions [0, pos + n_tokens).
 * Batch invariance is part of the contract: a sequence's tokens and logits do not depend on which other
 * sequences share its step, nor on its index in the batch. */
#ifndef ZLLM_ENGINE_H
#define ZLLM_ENGINE_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "model.h"
#include "sampler.h"

typedef struct {
    int slot;                  /* KV slot in [0, n_slots); one sequence per slot per step */
    int pos;                   /* position of tokens[0]; the slot holds valid KV for [0, pos) */
    int n_tokens;              /* tokens this step, >= 1, pos + n_tokens <= n_ctx */
    const int32_t *tokens;     /* [n_tokens] token ids, each in [0, vocab) */
    int sample;                /* 1: sample after the last token; 0: prefill chunk only (out_tokens gets -1) */
    const zl_sampling *samp;   /* sampling parameters; NULL means greedy */
    const int32_t *history;    /* the sequence's tokens so far incl. these (for the repetition penalty), or NULL */
    int n_history;             /* entries in history */
    uint64_t *rng;             /* per-sequence generator state, advanced when sampling (may be NULL if greedy) */
    int feed;                  /* 1: a decode entry (n_tokens 1) whose token is the id the engine sampled for this
                                * slot in the latest earlier step (launched or run) that had the slot, and whose
                                * generator state continues from that step's on the device: tokens and *rng are
                                * not read (engine_step_launch keeps a step queued behind one whose ids the host
                                * has not seen yet). That step must have sampled the slot (sample 1), and the
                                * entry may not use the repetition penalty (its history would lack the fed id);
                                * otherwise the step fails with nothing started. 0: tokens as given */
} zl_seq;

typedef struct zl_engine zl_engine;

typedef struct {
    /* runs one step; out_tokens[n] gets sampled ids (-1 where sample == 0); out_logits, when not NULL, gets
     * [n][vocab] f32 logits of each entry's last position (tests and the reference harness).
     * Returns 0, or -1 with e->err set (bad arguments, or a device error: the caller must then exit). */
    int (*step)(zl_engine *e, const zl_seq *seqs, int n, int32_t *out_tokens, float *out_logits);
    void (*destroy)(zl_engine *e);   /* frees everything the backend owns, including e */
} zl_engine_ops;

struct zl_engine {
    const zl_engine_ops *ops;  /* backend */
    const zl_model *model;     /* borrowed; must outlive the engine */
    char device[32];           /* "cpu", "cpu-ref", "cuda:0" */
    int n_slots;               /* KV slots = most sequences alive at once */
    int n_ctx;                 /* tokens per slot */
    int max_batch;             /* most entries in one step */
    int max_step_tokens;       /* most tokens (sum of n_tokens) in one step */
    char err[256];             /* last error */
    int layer_begin;           /* first layer this engine runs (0 unless opts->layer_end was set) */
    int layer_end;             /* one past its last layer (n_layers for a whole model; 0: backend without stages) */
    /* pipeline stages (worker/stage.h): runs layers [layer_begin, layer_end) only. h_in: [T][dim] f32 hidden
     * states entering layer_begin (T = sum of n_tokens, rows in seqs order), or NULL when layer_begin == 0
     * (embeds seqs[].tokens; otherwise tokens may be NULL). When layer_end < n_layers, h_out gets [T][dim] the
     * residual stream after layer_end - 1 and out_tokens/out_logits are not touched; when layer_end ==
     * n_layers, h_out may be NULL and the final norm, LM head and sampling run as in step. NULL in a backend that
     * has no stages (set by the backend at creation, beside ops; kept out of zl_engine_ops so that existing ops
     * tables stay complete) (engine_step_hidden then fails). Returns 0 or -1 with e->err set. */
    int (*step_hidden)(zl_engine *e, const zl_seq *seqs, int n, const float *h_in, float *h_out,
                       int32_t *out_tokens, float *out_logits);
    /* Asynchronous steps ("lanes", docs/pipeline.md), optional like step_hidden (NULL: the engine is driven
     * synchronously through step). A lane is an independent group of sequences with at most one step in
     * flight; the caller keeps several lanes' steps in flight so that the stages of a pipeline all work.
     * lanes: the most steps the engine keeps in flight at once (0 or 1: only synchronous steps; the stage
     * leader says 2); lane ids are 0..lanes-1.
     * step_submit: starts a step of seqs on `lane` (which must have no step in flight) and returns without
     * waiting for its tokens. The seqs array and everything it points to (tokens, history, samp, rng) belong to
     * the caller and must stay valid and unchanged until the step is collected; the engine writes the advanced
     * generator states into *rng by the collect at the latest. A slot may appear in at most one step in flight
     * (its KV positions are written in submission order, so its next step must wait for the collect). Returns 0,
     * or -1 with e->err set: bad arguments or a lane already in flight (nothing started, the engine stays
     * usable), or a device/peer error (the caller must exit).
     * step_collect: waits for `lane`'s step and writes out_tokens[n] (n and order as submitted; -1 where sample
     * was 0). Steps are collected in the order they were submitted: collecting another lane first fails with -1
     * and changes nothing. Returns 0, or -1 with e->err set (as step). step() must not be called while a
     * submitted step is not collected. */
    int lanes;
    int (*step_submit)(zl_engine *e, const zl_seq *seqs, int n, int lane);
    int (*step_collect)(zl_engine *e, int lane, int32_t *out_tokens);
    /* Steps queued ahead (optional, NULL: not supported; docs/perf.md "host gap"): the device never waits for the
     * host between steps when the next step is already queued behind the one it runs. Unlike lanes, the steps
     * share sequences: a slot may appear in consecutive launched steps, which run in launch order (its KV
     * positions and the fed ids follow that order).
     * step_launch: queues a step of seqs behind the steps already launched (at most 2 uncollected) and returns
     * without waiting. Entries with feed = 1 take their token and generator state from the slot's previous step
     * on the device (zl_seq.feed). seqs and what it points to stay the caller's and must stay valid and
     * unchanged until the step's wait. Returns 0, or -1 with e->err: bad arguments, 2 steps already
     * uncollected, a feed the engine cannot serve (nothing queued, the engine stays usable), or a device error
     * (the caller must exit).
     * step_wait: waits for the oldest launched step, writes out_tokens[n] (its n and order; -1 where sample was
     * 0) and the advanced generator states into *rng. Returns 0, or -1 with e->err (none launched; a device
     * error). step() and step_hidden() must not be called while a launched step is not waited for. */
    int (*step_launch)(zl_engine *e, const zl_seq *seqs, int n);
    int (*step_wait)(zl_engine *e, int32_t *out_tokens);
    int launch_async;          /* 1: step_launch returns while the step runs (CUDA): queuing ahead hides the host;
                                * 0: it runs the step before it returns (CPU), so queuing ahead only delays each
                                * step's ids by one step (callers queue ahead there only when asked to) */
};

typedef struct {
    const char *device;        /* "cpu" (fast), "cpu-ref" (f32 reference), "cuda", "cuda:N" */
    int n_slots;               /* 0: max_batch */
    int n_ctx;                 /* 0: the model's trained context, capped at 4096 */
    int max_batch;             /* 0: 16 */
    int max_step_tokens;       /* 0: 2048 */
    int threads;               /* CPU threads; 0: all cores */
    size_t kv_mem;             /* CUDA KV budget in bytes; 0: a fraction of free memory */
    int no_graphs;             /* CUDA: 1 runs decode eagerly instead of replaying CUDA graphs */
    int layer_begin;           /* pipeline stage: first layer run here; 0 with layer_end 0: the whole model */
    int layer_end;             /* one past the last layer run here, <= n_layers; 0: n_layers */
} zl_engine_opts;

/* Creates the backend named by o->device. Returns NULL with a message in err (unknown device, CUDA not
 * built in or no GPU, out of memory, model not supported by the backend). */
zl_engine *engine_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);
/* backends, called by engine_new */
zl_engine *engine_cpu_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);   /* cpu-ref */
zl_engine *engine_cpu_fast_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);  /* cpu */
zl_engine *engine_cuda_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);

static inline int engine_step(zl_engine *e, const zl_seq *s, int n, int32_t *tok, float *logits) {
    return e->ops->step(e, s, n, tok, logits);
}
/* one pipeline stage's share of a step (see zl_engine_ops.step_hidden); -1 with e->err when the backend has
 * no stages */
static inline int engine_step_hidden(zl_engine *e, const zl_seq *s, int n, const float *h_in, float *h_out,
                                     int32_t *tok, float *logits) {
    if (!e->step_hidden) {
        snprintf(e->err, sizeof e->err, "the %s backend does not run pipeline stages", e->device);
        return -1;
    }
    return e->step_hidden(e, s, n, h_in, h_out, tok, logits);
}
/* the most steps e keeps in flight (1 for an engine without step_submit/step_collect) */
static inline int engine_lanes(const zl_engine *e) {
    return e->step_submit && e->step_collect && e->lanes > 1 ? e->lanes : 1;
}
/* starts a step on a lane (see zl_engine.step_submit); -1 with e->err when the backend has no lanes */
static inline int engine_step_submit(zl_engine *e, const zl_seq *s, int n, int lane) {
    if (!e->step_submit || !e->step_collect) {
        snprintf(e->err, sizeof e->err, "the %s backend does not run asynchronous steps", e->device);
        return -1;
    }
    return e->step_submit(e, s, n, lane);
}
/* waits for a lane's step (see zl_engine.step_collect); -1 with e->err when the backend has no lanes */
static inline int engine_step_collect(zl_engine *e, int lane, int32_t *tok) {
    if (!e->step_submit || !e->step_collect) {
        snprintf(e->err, sizeof e->err, "the %s backend does not run asynchronous steps", e->device);
        return -1;
    }
    return e->step_collect(e, lane, tok);
}
/* queues a step behind those launched (see zl_engine.step_launch); -1 with e->err when the backend cannot */
static inline int engine_step_launch(zl_engine *e, const zl_seq *s, int n) {
    if (!e->step_launch || !e->step_wait) {
        snprintf(e->err, sizeof e->err, "the %s backend does not queue steps ahead", e->device);
        return -1;
    }
    return e->step_launch(e, s, n);
}
/* waits for the oldest launched step (see zl_engine.step_wait) */
static inline int engine_step_wait(zl_engine *e, int32_t *tok) {
    if (!e->step_launch || !e->step_wait) {
        snprintf(e->err, sizeof e->err, "the %s backend does not queue steps ahead", e->device);
        return -1;
    }
    return e->step_wait(e, tok);
}
/* 1 when e queues steps ahead (engine_step_launch) */
static inline int engine_can_launch(const zl_engine *e) { return e->step_launch && e->step_wait; }
/* idempotent; sets *e to NULL */
void engine_destroy(zl_engine **e);
#endif
