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
