/* cuda/engine_cuda.h: what the CUDA backend (cuda/engine_cuda.cu) exposes beyond common/engine.h. */
#ifndef ZLLM_CUDA_ENGINE_CUDA_H
#define ZLLM_CUDA_ENGINE_CUDA_H
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Device time (ms) of e's last successful step, from an event recorded before its input copy to one after its
 * output copy (so host time of a step minus this is the time the GPU sat idle waiting for the host). Returns
 * -1 when e is not a CUDA engine or has not stepped yet. */
double engine_cuda_last_step_gpu_ms(const zl_engine *e);
#ifdef __cplusplus
}
#endif
#endif
