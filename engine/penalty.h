/* engine/penalty.h: OpenAI's logit bias and presence/frequency penalties on the CPU (the reference of
 * cuda/bias_penalty.cu). Applied to a row's logits before the sampler (engine/sampler.h: its repetition penalty
 * comes after them), in this order:
 *   logit[id] += bias            for each (id, bias) of the request's logit bias (ids outside the vocabulary are
 *                                skipped; the broker refuses them);
 *   logit[j]  -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty
 *                                where c[j] counts j among the tokens generated so far (not the prompt).
 * Both are additive, so their order between themselves does not change the result beyond float rounding; this
 * order is the one the GPU follows. */
#ifndef ZLLM_PENALTY_H
#define ZLLM_PENALTY_H
#include <stdint.h>
#include "sampler.h"

#define ZL_MAX_LOGIT_BIAS 300 /* most logit bias entries per request */

typedef struct {
    int32_t id; /* token id */
    float bias; /* added to its logit, in [-100, 100] */
} zl_bias;

/* 1 when s asks for a presence or frequency penalty (they need the generated tokens) */
static inline int penalty_counts(const zl_sampling *s) {
    return s && (s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f);
}
/* Applies bias[n_bias] and the presence/frequency penalties of s over gen[n_gen] (the generated tokens, in any
 * order) to logits[vocab]. Returns 0, or -1 when out of memory for the counts (the bias is then applied, the
 * penalties not). */
int penalty_apply(float *logits, int vocab, const zl_sampling *s, const zl_bias *bias, int n_bias, const int32_t *gen,
                  int n_gen);
#endif
