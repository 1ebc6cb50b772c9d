/* engine/penalty.c: logit bias, then presence/frequency penalties over the generated tokens (penalty.h). Each
 * distinct generated id is penalised once, with its count: the ids are sorted into a copy and counted in runs. */
#include <stdlib.h>
#include <string.h>
#include "penalty.h"

static int s_cmp_id(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int penalty_apply(float *logits, int vocab, const zl_sampling *s, const zl_bias *bias, int n_bias, const int32_t *gen,
                  int n_gen) {
    for (int i = 0; bias && i < n_bias; i++)
        if (bias[i].id >= 0 && bias[i].id < vocab) logits[bias[i].id] += bias[i].bias;
    if (!penalty_counts(s) || !gen || n_gen <= 0) return 0;
    int32_t *ids = malloc((size_t)n_gen * sizeof *ids);
    if (!ids) return -1;
    memcpy(ids, gen, (size_t)n_gen * sizeof *ids);
    qsort(ids, (size_t)n_gen, sizeof *ids, s_cmp_id);
    for (int i = 0; i < n_gen;) {
        int j = i;
        while (j < n_gen && ids[j] == ids[i]) j++;
        const int32_t id = ids[i];
        if (id >= 0 && id < vocab) logits[id] -= (float)(j - i) * s->frequency_penalty + s->presence_penalty;
        i = j;
    }
    free(ids);
    return 0;
}
