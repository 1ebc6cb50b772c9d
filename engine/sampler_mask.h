/* engine/sampler_mask.h: structured output's allowed-token mask on the logits (zl_seq.mask). The mask comes from
 * the grammar matcher (common/grammar.h) in the worker; every engine applies it right before its sampler, so the
 * sampler's own steps (penalties, temperature, top-k/p, min-p) see only allowed ids. */
#ifndef ZLLM_SAMPLER_MASK_H
#define ZLLM_SAMPLER_MASK_H
#include <stdint.h>

/* sets logits[i] to -INFINITY for every i in [0, vocab) whose bit (bit i of mask[i / 32]) is clear. The samplers
 * skip -INFINITY, and greedy never picks it while an allowed id has a finite logit. */
void sampler_mask_apply(float *logits, int vocab, const uint32_t *mask);
#endif
