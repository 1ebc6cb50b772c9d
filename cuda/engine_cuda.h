/* cuda/engine_cuda.h: what the CUDA backend (cuda/engine_cuda.cu) exposes beyond engine/engine.h. */
#ifndef ZLLM_CUDA_ENGINE_CUDA_H
#define ZLLM_CUDA_ENGINE_CUDA_H
#include <stdint.h>
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif
/* The CUDA back-end's constructor (devices "cuda" and "cuda:N"), registered with the engine layer by
 * cuda/cuda_register.cu; tests may call it directly. NULL with a message in err (no GPU, out of memory, a model the
 * back-end does not run). */
zl_engine *engine_cuda_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen);
/* Device time (ms) of e's last successful step, from an event recorded before its input copy to one after its
 * output copy (so host time of a step minus this is the time the GPU sat idle waiting for the host). Returns
 * -1 when e is not a CUDA engine or has not stepped yet. */
double engine_cuda_last_step_gpu_ms(const zl_engine *e);
/* Pipeline stages: what engine_run does for a stage step with zl_step.h_dev 1 and events (worker/stage_cuda.c).
 * e runs its layers [layer_begin, layer_end) on one micro-batch: d_h_in [T][dim] f32 device memory holding the
 * hidden states entering layer_begin (rows in seqs order, T = sum of n_tokens; unused when layer_begin == 0,
 * which embeds seqs[].tokens), d_h_out [T][dim] f32 device memory for the residual stream after layer_end - 1
 * (unused on the last stage, which samples into out_tokens[n]: -1 where sample == 0, generator states advanced
 * as in engine_step). wait_events (n_wait <= 4, cudaEvent_t, typically imported interprocess events): the
 * engine's stream waits for them after the step's input copy and before any kernel (h_in written, h_out no
 * longer read); record_events (n_record <= 4): recorded on the stream after the step's kernels (h_in consumed,
 * h_out written). The hidden states never pass through the host. Decode steps replay the CUDA graphs (the
 * waits and records are on the stream around the replay, not graph nodes: one event per ring slot would need
 * a graph per slot). A stage that is not last returns without synchronising (use engine_cuda_ready before the
 * next call to avoid blocking); the last stage synchronises to read the ids back. Returns 0, or -1 with
 * e->err (bad arguments, or a device error: the engine is then unusable). */
int engine_cuda_step_hidden_dev(zl_engine *e, const zl_seq *seqs, int n, const float *d_h_in, float *d_h_out,
                                void *const *wait_events, int n_wait, void *const *record_events, int n_record,
                                int32_t *out_tokens);
/* the CUDA device ordinal of e, or -1 when e is not a CUDA engine */
int engine_cuda_device(const zl_engine *e);
/* 1 when the next step can stage its inputs without blocking (the previous unsynchronised step's input copy is
 * done), 0 not yet, -1 not a CUDA engine or a device error. Polled by stages, with liveness checks between
 * polls, because the copy is queued behind waits on a peer's events that a dead peer never completes. */
int engine_cuda_ready(const zl_engine *e);
/* 1 when e's stream has no pending work, 0 when it has, -1 not a CUDA engine or a device error */
int engine_cuda_idle(const zl_engine *e);
/* marks e's stream as possibly never finishing (it waits on a dead peer's event): engine_destroy then frees
 * only host memory and leaves the device memory to the process's exit. No-op for other engines. */
void engine_cuda_abandon(zl_engine *e);
#ifdef __cplusplus
}
#endif
#endif
