/* engine/sampler.h: token sampling on the CPU (the reference for the GPU sampler).
 * Order (as llama.cpp's common sampler): repetition penalty -> greedy if temperature <= 0 -> top-k ->
 * temperature -> softmax -> min-p -> top-p -> draw. Greedy picks the lowest id among equal maxima. */
#ifndef ZLLM_SAMPLER_H
#define ZLLM_SAMPLER_H
#include <stdint.h>

typedef struct {
    float temperature;    /* <= 0: greedy */
    int top_k;            /* keep the k most likely; <= 0: off */
    float top_p;          /* nucleus mass; >= 1: off */
    float min_p;          /* drop tokens below min_p * p_max; <= 0: off */
    float repeat_penalty; /* 1: off; logits of recent tokens: >0 divided, <0 multiplied */
    int repeat_last_n;    /* how many of the latest history tokens the penalty sees (0: none) */
    uint64_t seed;        /* seeds the per-sequence generator (sampler_rng_init) */
    float presence_penalty;  /* OpenAI's, over the generated tokens (engine/penalty.h); 0: off */
    float frequency_penalty; /* OpenAI's, over the generated tokens (engine/penalty.h); 0: off */
    int logprobs;            /* 1: report the sampled id's log probability (engine/logprobs.h); 0: off */
    int top_logprobs;        /* with logprobs: that many alternatives too, 0..ZL_MAX_TOP_LOGPROBS */
} zl_sampling;

/* default parameters: greedy, everything off */
zl_sampling sampler_defaults(void);
/* generator state from a seed (splitmix64); the same seed gives the same draws */
uint64_t sampler_rng_init(uint64_t seed);
/* uniform float in [0,1) advancing *rng */
float sampler_rng_uniform(uint64_t *rng);
/* Samples one id from logits[vocab] (modified in place). history: the sequence's tokens so far, oldest
 * first (only the last repeat_last_n are used). Returns the id; never fails for vocab >= 1. */
int sampler_sample(float *logits, int vocab, const zl_sampling *s, const int32_t *history, int n_history,
                   uint64_t *rng);
#endif
