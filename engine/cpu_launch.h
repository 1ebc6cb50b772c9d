/* engine/cpu_launch.h: the launch/wait protocol both CPU engines share (engine/engine_cpu.c, engine/cpu_fast.c). A
 * CPU step runs at once, inside its launch, and writes its results there; the wait only checks the order. What
 * the CUDA engine carries on the device for steps queued ahead (zl_seq.feed), these carry on the host: each slot's
 * last sampled id and generator state. */
#ifndef ZLLM_CPU_LAUNCH_H
#define ZLLM_CPU_LAUNCH_H
#include <stdint.h>
#include "engine.h"

/* the engine's forward pass over its layers (as zl_step: h_in/h_out for stages, out_tokens/out_logits for the
 * last layer): 0, or -1 with e->err */
typedef int (*cpu_forward_fn)(zl_engine *e, const zl_seq *seqs, int n, const float *h_in, float *h_out,
                              int32_t *out_tokens, float *out_logits, zl_logprobs *out_lp);

typedef struct {
    cpu_forward_fn forward; /* the engine's forward pass */
    int32_t *carry_tok;     /* [n_slots] id sampled for each slot by the last step that had it (zl_seq.feed) */
    uint64_t *carry_rng;    /* [n_slots] that entry's generator state after its draw */
    uint8_t *carry_ok;      /* [n_slots] 1 when that step sampled the slot (a feed may follow) */
    zl_seq *fseq;           /* [max_batch] the step's entries with their feeds resolved */
    int32_t *ftok;          /* [max_batch] fed ids */
    uint64_t *frng;         /* [max_batch] fed generator states */
    const zl_step *fl[2];   /* the launched steps not yet waited for, oldest at q_head */
    int q_head;             /* index (0, 1) of the oldest launched step */
    int q_count;            /* launched steps not yet waited for, 0..depth */
    int q_sync;             /* 1: the one launched step is synchronous (nothing may launch before its wait) */
} cpu_launch;

/* allocates l's carries for n_slots slots and max_batch entries: 0, or -1 (out of memory; cpu_launch_free frees
 * what was allocated) */
int cpu_launch_init(cpu_launch *l, int n_slots, int max_batch, cpu_forward_fn forward);
void cpu_launch_free(cpu_launch *l);
/* validates a step's entries for a CPU engine's forward pass (slots in range and distinct, no feeds left, positions
 * inside the context, token ids in the vocabulary when need_tokens, a generator state where sampling draws, at most
 * max_step_tokens rows; need_tokens 0 when the step starts from hidden states, whose tokens are not read) and sets
 * *T_out to its rows: 0, or -1 with e->err */
int cpu_launch_check(zl_engine *e, const zl_seq *seqs, int n, int need_tokens, int *T_out);
/* zl_engine_ops.launch: runs st now. A whole model with ids wanted serves feeds and keeps the slots' carries (as
 * the CUDA engine does); otherwise the forward pass over e's layers, after which no slot it touched may be fed.
 * The step is then kept until its wait. 0, or -1 with e->err (nothing run, nothing kept) */
int cpu_launch_run(zl_engine *e, cpu_launch *l, const zl_step *st);
/* zl_engine_ops.wait: the results are in place since the launch; checks that st is the oldest launched step.
 * 0, or -1 with e->err */
int cpu_launch_wait(zl_engine *e, cpu_launch *l, const zl_step *st);
/* where position p of a sequence lives in a CPU engine's caches ([n_kb][n_own layers][kbs][kv_dim] f32 each: kbs
 * rows per block; contiguous slots are blocks of n_ctx rows, one per slot): the float offset of row p of own layer
 * li, tab the sequence's block table ({slot} for contiguous slots) */
static inline size_t cpu_kv_at(const int32_t *tab, int kbs, int n_own, int li, int p, size_t kv_dim) {
    return (((size_t)tab[p / kbs] * (size_t)n_own + (size_t)li) * (size_t)kbs + (size_t)(p % kbs)) * kv_dim;
}
/* the block table of e's entry s: its blocks (paged KV) or ids[slot] (the identity table of contiguous slots) */
static inline const int32_t *cpu_kv_tab(const zl_engine *e, const zl_seq *s, const int32_t *ids) {
    return e->kv_block > 0 ? s->blocks : ids + s->slot;
}
/* reads the paged-KV options into e (kv_block, kv_blocks) and the cache's shape (*kbs rows per block, *n_kb
 * blocks): 0, or -1 with err (bad sizes) */
int cpu_kv_shape(zl_engine *e, const zl_engine_opts *o, int *kbs, int *n_kb, char *err, size_t errlen);
/* zl_engine.copy_block over a paged CPU engine's caches kc/vc (layout of cpu_kv_at, n_own layers): runs at once.
 * 0, or -1 with e->err */
int cpu_launch_copy_block(zl_engine *e, float *kc, float *vc, size_t kv_dim, int src, int dst, int n_rows);
/* zl_engine_ops.copy_kv over a CPU engine's caches kc/vc ([n_slots][n_own layers][n_ctx][kv_dim] f32 each): runs
 * at once (every launched step has run). Refused with paged KV (sequences share blocks instead). 0, or -1 with
 * e->err */
int cpu_launch_copy_kv(zl_engine *e, cpu_launch *l, float *kc, float *vc, size_t kv_dim, int src, int dst,
                       int n_tokens);
#endif
