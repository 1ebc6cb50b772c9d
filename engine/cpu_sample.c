/* engine/cpu_sample.c: penalties, bias, sampling and logprobs of one entry (cpu_sample.h). */
#include <string.h>
#include "cpu_sample.h"
#include "sampler_mask.h"

int cpu_sample_entry(const float *logits, int vocab, float *scratch, const zl_seq *s, zl_logprobs *lp) {
    memcpy(scratch, logits, (size_t)vocab * sizeof(float));
    if (s->mask) sampler_mask_apply(scratch, vocab, s->mask); /* -inf stays -inf through bias and penalties */
    const zl_sampling *sp = s->samp;
    int ng = s->history ? s->n_history - s->history_prompt : 0;
    if (ng < 0) ng = 0;
    (void)penalty_apply(scratch, vocab, sp, s->bias, s->n_bias, ng ? s->history + s->history_prompt : NULL, ng);
    const int id = sampler_sample(scratch, vocab, sp, s->history, s->n_history, s->rng);
    if (lp && sp && sp->logprobs) logprobs_compute(scratch, vocab, id, sp->top_logprobs, lp);
    return id;
}
