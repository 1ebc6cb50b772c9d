/* engine/engine_env.h: the one place where the model runtime and its back-ends read the environment. What they
 * read are switches that turn one kernel path off for comparisons or force one for tests: ZLLM_CUDA_*
 * (docs/cuda.md, read once by cuda/cu_settings.cu) and ZLLM_CPU_ISA, ZLLM_CPU_EXACT (docs/cpu.md, read when a fast
 * CPU engine starts). Every user setting is a command-line option instead. */
#ifndef ZLLM_ENGINE_ENV_H
#define ZLLM_ENGINE_ENV_H

#ifdef __cplusplus
extern "C" {
#endif
/* the value of `name`, or NULL when it is unset or empty */
const char *engine_env(const char *name);
/* the whole decimal number `name` holds, within [lo, hi]; dflt when unset, empty, not a whole number or out of
 * range */
int engine_env_int(const char *name, int dflt, int lo, int hi);
#ifdef __cplusplus
}
#endif
#endif
