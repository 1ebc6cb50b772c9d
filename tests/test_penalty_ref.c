/* tests/test_penalty_ref.c: engine/penalty.c and engine/logprobs.c against the Python reference of OpenAI's logit
 * bias and presence/frequency penalties (tests/data/penalty_ref.bin, made by tests/data/make_penalty_ref.py) on
 * random logits, with ties and -inf masks: the penalized rows bit for bit, the logprobs within 1e-6, the top-k ids
 * exactly (ties broken by the lower id). Also: the penalties count only the generated tokens (history_prompt), and
 * the CPU sampling path (cpu_sample_entry) reports the logprobs of the row it sampled from. */
#include <math.h>
#include "cpu_sample.h"
#include "logprobs.h"
#include "penalty.h"
#include "penalty_ref.h"
#include "test.h"

static void s_check_case(const penalty_case *c, int ci) {
    float *row = malloc(c->vocab * sizeof *row);
    zl_bias *b = malloc((c->n_bias + 1) * sizeof *b);
    for (uint32_t j = 0; j < c->n_bias; j++) b[j] = (zl_bias){c->bias_id[j], c->bias[j]};
    memcpy(row, c->logits, c->vocab * sizeof *row);
    zl_sampling s = sampler_defaults();
    s.presence_penalty = c->presence;
    s.frequency_penalty = c->frequency;
    CHECK(penalty_apply(row, (int)c->vocab, &s, b, (int)c->n_bias, c->gen, (int)c->n_gen) == 0, "case %d: apply", ci);
    uint32_t diff = 0;
    for (uint32_t i = 0; i < c->vocab; i++) diff += memcmp(&row[i], &c->penalized[i], 4) != 0;
    CHECK(diff == 0, "case %d (V %u, %u gen, %u bias, p %g f %g): %u logits differ from the reference", ci, c->vocab,
          c->n_gen, c->n_bias, c->presence, c->frequency, diff);
    zl_logprobs lp;
    logprobs_compute(c->penalized, (int)c->vocab, (int)c->sampled, (int)c->k, &lp);
    CHECK(fabs(lp.logprob - c->logprob) <= 1e-6 * (1 + fabs(c->logprob)), "case %d: logprob %.9g vs %.9g", ci,
          lp.logprob, c->logprob);
    CHECK(lp.n_top == (int)c->n_top, "case %d: %d alternatives, want %u", ci, lp.n_top, c->n_top);
    int ids_ok = 1, lps_ok = 1;
    for (int j = 0; j < lp.n_top && j < (int)c->n_top; j++) {
        ids_ok &= lp.top_id[j] == c->top_id[j];
        lps_ok &= fabs(lp.top_logprob[j] - c->top_lp[j]) <= 1e-6 * (1 + fabs(c->top_lp[j]));
    }
    CHECK(ids_ok, "case %d: top ids differ from the reference (first %d vs %d)", ci, lp.top_id[0], c->top_id[0]);
    CHECK(lps_ok, "case %d: top logprobs differ from the reference", ci);
    free(row);
    free(b);
}

/* cpu_sample_entry: the prompt part of the history is not counted, and the logprobs are those of the row the
 * sampler drew from (bias and penalties in) */
static void s_check_entry(void) {
    enum { V = 16 };
    float lg[V], scratch[V];
    for (int i = 0; i < V; i++) lg[i] = (float)(i % 5) * 0.5f;
    const int32_t hist[6] = {4, 4, 9, 4, 9, 3}; /* prompt 4 4 9, generated 4 9 3 */
    zl_sampling s = sampler_defaults();
    s.presence_penalty = 1.0f;
    s.frequency_penalty = 0.5f;
    s.logprobs = 1;
    s.top_logprobs = 4;
    const zl_bias bias[1] = {{13, 2.0f}};
    zl_seq q = {.samp = &s, .history = hist, .n_history = 6, .history_prompt = 3, .bias = bias, .n_bias = 1};
    zl_logprobs lp;
    int id = cpu_sample_entry(lg, V, scratch, &q, &lp);
    float want[V];
    memcpy(want, lg, sizeof want);
    want[13] += 2.0f;
    for (int g = 3; g < 6; g++) want[hist[g]] -= 1.0f * 0.5f + 1.0f; /* each generated id once: count 1 */
    int best = 0;
    for (int i = 1; i < V; i++)
        if (want[i] > want[best]) best = i;
    CHECK(id == best, "cpu_sample_entry: greedy id %d, want %d", id, best);
    zl_logprobs ref;
    logprobs_compute(want, V, best, 4, &ref);
    CHECK(lp.logprob == ref.logprob && lp.n_top == 4 && !memcmp(lp.top_id, ref.top_id, sizeof ref.top_id),
          "cpu_sample_entry: logprobs of the penalized row (%g vs %g)", lp.logprob, ref.logprob);
    for (int i = 0; i < V; i++) CHECK(lg[i] == (float)(i % 5) * 0.5f, "cpu_sample_entry: logits[%d] untouched", i);
    /* ties: equal logits in id order; NaN and -inf never listed */
    float t[6] = {1.0f, NAN, 1.0f, -INFINITY, 1.0f, 0.5f};
    logprobs_compute(t, 6, 3, 20, &lp);
    CHECK(lp.n_top == 4 && lp.top_id[0] == 0 && lp.top_id[1] == 2 && lp.top_id[2] == 4 && lp.top_id[3] == 5,
          "ties by id, NaN/-inf skipped: %d alternatives (%d %d %d %d)", lp.n_top, lp.top_id[0], lp.top_id[1],
          lp.top_id[2], lp.top_id[3]);
    CHECK(lp.logprob == -INFINITY, "a masked id's logprob is -inf (%g)", lp.logprob);
}

int main(void) {
    penalty_case *cases;
    int n = penalty_ref_load("tests/data/penalty_ref.bin", &cases);
    CHECK(n >= 30, "tests/data/penalty_ref.bin holds the reference cases (%d)", n);
    for (int i = 0; i < n; i++) s_check_case(&cases[i], i);
    penalty_ref_free(cases, n);
    s_check_entry();
    return test_report();
}
