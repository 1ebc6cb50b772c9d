/* engine/cpu_sample.h: one entry's sampling on the CPU engines, the order the CUDA step follows: the structured-output
 * mask (-inf outside it: nothing later brings a masked id back), logit bias and
 * presence/frequency penalties (engine/penalty.h), then the sampler (engine/sampler.h: repetition penalty first),
 * the logprobs taken from the row as the sampler left it after its penalty (engine/logprobs.h). */
#ifndef ZLLM_CPU_SAMPLE_H
#define ZLLM_CPU_SAMPLE_H
#include "engine.h"

/* Samples entry s from logits[vocab] (not modified) using scratch[vocab]; fills *lp (when not NULL and s asks for
 * logprobs). Returns the id. */
int cpu_sample_entry(const float *logits, int vocab, float *scratch, const zl_seq *s, zl_logprobs *lp);
#endif
