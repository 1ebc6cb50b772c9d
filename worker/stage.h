/* worker/stage.h: pipeline stages: one model split by layers over N processes on one host (docs/pipeline.md).
 *
 * Stage 0 (the leader) embeds and runs its layers, stage N-1 runs the last layers, the final norm, the LM head
 * and sampling, the stages between take and produce hidden states. The leader is seen by the rest of the worker
 * as an ordinary zl_engine (stage_leader_new): its step() splits the batch into micro-batches, runs its own
 * layers on each and hands each micro-batch on as soon as it is done, so that stage 1 works on the first half
 * while stage 0 runs the second; then it collects the sampled ids from the return ring. Only the leader talks
 * to the broker; followers (stage_run_follower) only serve their links.
 *
 * A link i -> i+1 carries, per micro-batch, a step descriptor (stage_desc, always in host shared memory) and
 * the micro-batch's hidden states, [n_rows][dim] f32, through a stage_transport. The host transport keeps both
 * in shm rings (worker/shmring.h); a GPU transport replaces only the hidden-state buffers (device memory
 * shared by CUDA IPC, ordered by interprocess events) and keeps the descriptor ring.
 *
 * Failure: any error or dead peer aborts the whole group (shm abort word); every stage then returns -1 (a
 * follower's process exits non-zero, the leader's engine step fails and the worker exits, so the broker sees
 * its worker gone and fails or requeues its requests). A restarted group under the same name gets a fresh
 * segment and generation: slots of the dead group are never read. */
#ifndef ZLLM_STAGE_H
#define ZLLM_STAGE_H
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include "engine.h"
#include "sampler.h"

#define STAGE_MAX 16               /* stages in one group */
#define STAGE_MAX_CUDA 11          /* stages in one group with the GPU transport (3 rings per link, 32 rings) */

typedef struct {
    const char *group;             /* shm group name ([A-Za-z0-9_.-], <= 64 chars); all stages use the same */
    int stage;                     /* this process's stage, 0..n_stages-1 */
    int n_stages;                  /* 2..STAGE_MAX */
    int threads;                   /* follower's CPU engine threads (0: all cores); the leader's come from opts */
    const char *device;            /* follower's engine device, "cpu" (NULL) or "cuda[:K]"; the leader's comes from
                                    * opts. CUDA on the leader means the GPU transport: every stage must be CUDA */
    int attach_timeout_ms;         /* follower: wait for the leader's group; leader: for every follower (0: 30000) */
    int dead_ms;                   /* a peer silent this long is dead (0: 10000); dead pids are seen at once */
    int ring_cap;                  /* slots per ring, >= 2 (0: 4) */
    int micro_batches;             /* leader: a step's batch is split into this many micro-batches of about equal
                                    * rows, handed on one by one so that the stages overlap (0: 2; 1: none;
                                    * at most ring_cap); a lane's step (steps in flight) into at most
                                    * ceil(n_stages / 2) and ring_cap / 2 of them */
    int term_on_failure;           /* leader: 1 sends SIGTERM to this process when the group fails while it idles
                                    * (a worker whose loop stops on SIGTERM then leaves the broker at once) */
} stage_opts;

/* one sequence of a micro-batch, as it travels between stages */
typedef struct {
    int32_t slot, pos, n_tokens;   /* as zl_seq */
    int32_t sample;                /* as zl_seq.sample */
    int32_t has_samp;              /* 0: greedy (zl_seq.samp was NULL) */
    int32_t has_rng;               /* 1: rng carries the generator state (returned advanced) */
    int32_t hist_off, n_hist;      /* [hist_off, hist_off + n_hist) of the descriptor's history ids */
    int32_t prompt;                /* as zl_seq.prompt: every stage runs the entry through the same kernels */
    int32_t pad;
    zl_sampling samp;              /* sampling parameters when has_samp */
    uint64_t rng;                  /* generator state before sampling */
} stage_entry;

/* the step descriptor, followed in memory by stage_entry[n] and int32_t hist[n_hist] */
typedef struct {
    uint64_t step;                 /* leader's step counter */
    int32_t micro;                 /* micro-batch index in the step */
    int32_t n_micro;               /* micro-batches of the step */
    int32_t n;                     /* entries, 1..max_batch */
    int32_t n_rows;                /* sum of n_tokens = rows of hidden states */
    int32_t n_hist;                /* history ids after the entries (tails the repetition penalty reads) */
    int32_t pad;
} stage_desc;

/* What carries micro-batches over one link. The producer reserves a slot (a descriptor of desc_bytes and a
 * hidden-state buffer of [max_rows][dim] f32 that its engine writes into directly), fills both and publishes;
 * the consumer peeks the next one (the descriptor as a private copy, checked before use; the hidden states in
 * place), uses it and releases it. All return 0, or -1 with a message (dead peer, abort, corrupt slot); peek
 * also returns -1 on a clean shutdown, with stage_opts' group reporting SHM_SHUTDOWN. */
typedef struct {
    int (*reserve)(void *ctx, stage_desc **desc, float **hidden, char *err, size_t errlen);
    int (*publish)(void *ctx, uint64_t desc_bytes, char *err, size_t errlen);
    int (*peek)(void *ctx, const stage_desc **desc, uint64_t *desc_bytes, const float **hidden, char *err,
                size_t errlen);
    void (*release)(void *ctx);
} stage_transport_ops;

/* layers [*begin, *end) of stage `stage` of n: an even split, the remainder going to the later stages */
void stage_layer_range(int n_layers, int stage, int n_stages, int *begin, int *end);
/* parses "I/N" (0 <= I < N, 2 <= N <= STAGE_MAX). 0, or -1 when malformed. */
int stage_parse(const char *arg, int *stage, int *n_stages);

/* The leader: creates its engine for stage 0's layers (options o, device o->device: cpu, or cuda[:K] for the
 * GPU transport, worker/stage_cuda.h), creates the shm group so->group sized for o, and waits for every
 * follower to attach (and, with CUDA, for every link's set-up). Returns an engine that runs whole steps through the pipeline
 * (engine_step; out_logits and hidden states are not supported and must be NULL) and also steps in flight on 2
 * lanes (engine_launch/engine_wait, depth 1 per lane, docs/pipeline.md), or NULL with a message. engine_destroy() shuts
 * the group down (followers return 0) and removes the segment. Every stage process runs a monitor thread that
 * heartbeats in the group every 100 ms and checks its peers, so idle stages stay alive and notice deaths. */
zl_engine *stage_leader_new(const zl_model *m, const zl_engine_opts *o, const stage_opts *so, char *err,
                            size_t errlen);
/* 1 when e is a leader engine whose group failed (a dead peer, an aborted step); 0 otherwise */
int stage_leader_failed(const zl_engine *e);
/* A follower (so->stage >= 1): attaches to the group, builds its engine for its layers with the leader's
 * options, and serves micro-batches until the group shuts down (returns 0) or fails (returns -1 with a
 * message: dead peer, engine error, corrupt slot; the group is then aborted for everyone). Stops early, with
 * -1, when *stop becomes non-zero (a signal handler's flag; may be NULL). */
int stage_run_follower(const zl_model *m, const stage_opts *so, const volatile sig_atomic_t *stop, char *err,
                       size_t errlen);
#endif
