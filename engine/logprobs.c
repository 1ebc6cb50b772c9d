/* engine/logprobs.c: log-softmax of one row in float64 and its top k by insertion (k <= 20: one pass over the
 * row), see logprobs.h. */
#include <math.h>
#include <string.h>
#include "logprobs.h"

static int s_cand(float x) { return !isnan(x) && x != -INFINITY; }

void logprobs_compute(const float *logits, int vocab, int sampled, int k, zl_logprobs *out) {
    memset(out, 0, sizeof *out);
    out->logprob = -INFINITY;
    if (k < 0) k = 0;
    if (k > ZL_MAX_TOP_LOGPROBS) k = ZL_MAX_TOP_LOGPROBS;
    double mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (s_cand(logits[i]) && (double)logits[i] > mx) mx = logits[i];
    if (mx == -INFINITY) return; /* no candidate at all */
    double sum = 0.0;
    for (int i = 0; i < vocab; i++)
        if (s_cand(logits[i])) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    if (sampled >= 0 && sampled < vocab && s_cand(logits[sampled]))
        out->logprob = (float)((double)logits[sampled] - lse);
    /* top k: ids visited in ascending order, so an equal logit never displaces an earlier (lower) id */
    int n = 0;
    for (int i = 0; i < vocab && k > 0; i++) {
        const float x = logits[i];
        if (!s_cand(x)) continue;
        if (n == k && !(x > logits[out->top_id[n - 1]])) continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && x > logits[out->top_id[j - 1]]) {
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_id[j] = i;
    }
    out->n_top = n;
    for (int j = 0; j < n; j++) out->top_logprob[j] = (float)((double)logits[out->top_id[j]] - lse);
}
