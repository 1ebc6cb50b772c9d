/* worker/stage_cuda.h: the GPU transport of a pipeline link (worker/stage.h, docs/pipeline.md "GPU transport").
 *
 * A link i -> i+1 between two CUDA stages keeps its step descriptors in the host shm ring (stage.c) and moves
 * the hidden states through device memory: the producer (stage i) owns one allocation of cap slots of
 * [max_rows][dim] f32 and cap "ready" events; the consumer (stage i+1) owns cap "consumed" events. Both kinds
 * of events are interprocess (cudaEventInterprocess | cudaEventDisableTiming) and each process records only
 * the events it created and waits (on its stream) for the ones it imported:
 *   producer: wait consumed[s] -> its kernels write slot s -> record ready[s] -> publish the record, then the
 *             descriptor (host shm);
 *   consumer: take the descriptor and the record -> wait ready[s] -> its kernels read slot s -> record
 *             consumed[s] -> release both host slots.
 * Slot s of micro-batch k is k mod cap on both sides; the host rings' capacity (cap) keeps the producer from
 * reusing a slot whose consumer has not yet queued its consumed record.
 * Set-up: the producer publishes a hello on the link's hidden ring (group generation, geometry, its device's
 * PCI bus id, the legacy IPC handle of the buffer and of its events); the consumer validates it, enables peer
 * access when the devices differ (reads then go over NVLink), maps the buffer, opens the events, and answers
 * with its own hello (its consumed events' handles) on the link's back ring. Every later message on the hidden
 * ring is a record {magic, slot, sequence number, rows} checked against the consumer's own count, the capacity
 * and the descriptor.
 * Teardown in two phases: each side first closes what it imported (events, the mapped buffer) and leaves the
 * shm group; the producer frees its buffer and events only when the consumer has left (or died), or leaks them
 * to the process's exit when that does not happen within the wait.
 * Without CUDA (ZLLM_HAVE_CUDA unset) every function fails with a message. */
#ifndef ZLLM_STAGE_CUDA_H
#define ZLLM_STAGE_CUDA_H
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "engine.h"
#include "shmring.h"

#define STAGE_CUDA_MAX_CAP 64      /* slots of a link (stage_opts.ring_cap is at most this) */

typedef struct stage_cuda_link stage_cuda_link;

/* The producer's end: on CUDA device dev, allocates cap slots of [max_rows][dim] f32 and cap ready events,
 * publishes the hello on ring_fwd and waits up to timeout_ms for the consumer's hello on ring_back (peer: the
 * consumer's member index). Returns NULL with a message (CUDA error, timeout, dead peer, bad answer). */
stage_cuda_link *stage_cuda_link_export(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, char *err, size_t errlen);
/* The consumer's end on device dev: waits up to timeout_ms for the producer's hello on ring_fwd (stops early
 * when *stop becomes non-zero), validates it against (cap, max_rows, dim) and the group's generation, maps the
 * buffer, opens the events, and answers on ring_back. Returns NULL with a message. */
stage_cuda_link *stage_cuda_link_import(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, const volatile sig_atomic_t *stop,
                                        char *err, size_t errlen);
/* Producer: waits for a free host slot (no time limit; fails on abort or a dead peer) and returns the device
 * buffer of the micro-batch's slot. 0, or -1 with a message. */
int stage_cuda_link_reserve(stage_cuda_link *l, float **d_hidden, char *err, size_t errlen);
/* Producer: publishes the reserved slot's record for n_rows rows (after its kernels were queued with the
 * slot's events). 0, or -1 with a message. */
int stage_cuda_link_publish(stage_cuda_link *l, int n_rows, char *err, size_t errlen);
/* Consumer: takes the record of the next micro-batch (it was published before its descriptor, so it must be
 * there), checks it (sequence, slot, n_rows == the descriptor's) and returns the slot's device buffer.
 * 0, or -1 with a message. */
int stage_cuda_link_peek(stage_cuda_link *l, int n_rows, const float **d_hidden, char *err, size_t errlen);
/* Consumer: frees the record's host slot (after the consumed event was queued). */
void stage_cuda_link_release(stage_cuda_link *l);

/* the CUDA device ordinal of e, -1 when e is not a CUDA engine (or the build has no CUDA) */
int stage_cuda_engine_device(const zl_engine *e);
/* bytes of the largest message on a link's hidden and back rings (the set-up message) */
size_t stage_cuda_msg_bytes(void);
/* Runs e (a CUDA engine) on one micro-batch between two links: in (NULL on stage 0, which embeds) gives h_in
 * and the event to wait for, out (NULL on the last stage, which samples into out_tokens) gives h_out and its
 * events. Before queueing, polls until e can stage without blocking (and, on the last stage, until the input
 * is ready), checking the group between polls, so that a dead peer's never-completed event fails the step
 * instead of hanging it. 0, or -1 with a message (the group is not aborted here). */
int stage_cuda_run(zl_engine *e, shm_group *g, const zl_seq *seqs, int n, stage_cuda_link *in, const float *h_in,
                   stage_cuda_link *out, float *h_out, int32_t *out_tokens, char *err, size_t errlen);
/* Waits up to wait_ms for e's stream to drain. 1 drained; 0 not (e is then abandoned, engine_cuda_abandon:
 * destroying it frees host memory only, and the caller must abandon its links too); -1 not a CUDA engine. */
int stage_cuda_drain(zl_engine *e, int wait_ms);
/* Teardown (see above): closes imports; an owner then waits up to wait_ms for the peer to leave the group
 * before freeing (leaks otherwise). abandon: free host memory only (a stream may still use the buffers).
 * Idempotent; sets *l to NULL. */
void stage_cuda_link_destroy(stage_cuda_link **l, int abandon, int wait_ms);
#endif
