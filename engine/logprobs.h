/* engine/logprobs.h: log probabilities of a sampled token and of its top alternatives (the CPU reference of
 * cuda/logprob_top.cu).
 *
 * The distribution they describe is the one the sampler draws from before its truncations: the log-softmax, at
 * temperature 1, of the row's logits after the logit bias, the presence and frequency penalties and the repetition
 * penalty (engine/penalty.h, engine/sampler.h), and before temperature, top-k, min-p and top-p. So a greedy and a
 * sampled request report the same numbers for the same token, and the numbers do not depend on how the draw was
 * truncated. NaN and -inf logits are not candidates (their logprob is -inf). The sums are taken in float64.
 * Top alternatives are ordered by logprob, descending, ties broken by the lower token id.
 *
 * Prompt logprobs (zl_seq.plp_rows) describe the model's own distribution instead: the log-softmax at temperature 1
 * of a prompt position's raw logits, with no mask, logit bias or penalty applied (as OpenAI's `echo` and vLLM's
 * `prompt_logprobs` report them), scored for the prompt's next token; the same float64 sums and the same order of
 * alternatives. */
#ifndef ZLLM_LOGPROBS_H
#define ZLLM_LOGPROBS_H
#include <stdint.h>

#define ZL_MAX_TOP_LOGPROBS 20 /* most alternatives per token */

typedef struct {
    float logprob;                          /* the sampled id's log probability (-inf when it is no candidate) */
    int n_top;                              /* alternatives below, 0..ZL_MAX_TOP_LOGPROBS */
    int32_t top_id[ZL_MAX_TOP_LOGPROBS];    /* the n_top most likely ids, logprob descending, then id ascending */
    float top_logprob[ZL_MAX_TOP_LOGPROBS]; /* their log probabilities */
} zl_logprobs;

/* Fills *out for the id `sampled` of logits[vocab] (not modified) with the top k (clamped to 0..
 * ZL_MAX_TOP_LOGPROBS and to the finite candidates) alternatives. */
void logprobs_compute(const float *logits, int vocab, int sampled, int k, zl_logprobs *out);
/* Prompt logprobs of one position: logprobs_compute of its raw logits for the next prompt id `next`. */
static inline void logprobs_prompt_row(const float *logits, int vocab, int next, int k, zl_logprobs *out) {
    logprobs_compute(logits, vocab, next, k, out);
}
#endif
