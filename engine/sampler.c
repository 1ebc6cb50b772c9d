/* engine/sampler.c: token sampling on the CPU, in the order documented in sampler.h:
 * repetition penalty -> greedy (temperature <= 0) -> top-k -> temperature -> softmax -> min-p -> top-p -> draw.
 * Ties are broken by the lower id everywhere (greedy and the candidate order), so results are deterministic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "sampler.h"

zl_sampling sampler_defaults(void) {
    zl_sampling s;
    memset(&s, 0, sizeof s);
    s.temperature = 0.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0.0f;
    s.repeat_penalty = 1.0f;
    s.repeat_last_n = 64;
    s.seed = 0;
    return s;
}

uint64_t sampler_rng_init(uint64_t seed) { return seed ^ 0x2545F4914F6CDD1DULL; }

/* splitmix64 */
static uint64_t s_next(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

float sampler_rng_uniform(uint64_t *rng) {
    return (float)(s_next(rng) >> 40) * (1.0f / 16777216.0f); /* 24 bits: exactly representable, < 1 */
}

static int s_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i; /* strict: the lowest id wins ties */
    return best;
}

/* llama.cpp's rule: each distinct token among the last n is penalised once */
static void s_penalize(float *logits, int vocab, const int32_t *hist, int n_hist, int last_n, float penalty) {
    if (penalty == 1.0f || last_n <= 0 || !hist || n_hist <= 0 || !(penalty > 0.0f)) return;
    int n = n_hist < last_n ? n_hist : last_n;
    const int32_t *h = hist + (n_hist - n);
    unsigned char *seen = calloc(((size_t)vocab + 7) / 8, 1);
    for (int i = 0; i < n; i++) {
        int32_t id = h[i];
        if (id < 0 || id >= vocab) continue;
        if (seen) {
            if (seen[id >> 3] & (1u << (id & 7))) continue;
            seen[id >> 3] |= (unsigned char)(1u << (id & 7));
        } else { /* no memory for the bitmap: quadratic scan for an earlier occurrence */
            int dup = 0;
            for (int j = 0; j < i && !dup; j++) dup = h[j] == id;
            if (dup) continue;
        }
        logits[id] = logits[id] > 0.0f ? logits[id] / penalty : logits[id] * penalty;
    }
    free(seen);
}

typedef struct {
    float logit; /* logit, then probability */
    int id;      /* token id */
} s_cand;

/* descending logit, then ascending id: a total order, so qsort's instability cannot matter */
static int s_cmp(const void *a, const void *b) {
    const s_cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

int sampler_sample(float *logits, int vocab, const zl_sampling *s, const int32_t *history, int n_history,
                   uint64_t *rng) {
    if (vocab <= 1) return 0;
    if (!s) return s_argmax(logits, vocab);
    s_penalize(logits, vocab, history, n_history, s->repeat_last_n, s->repeat_penalty);
    if (!(s->temperature > 0.0f) || !rng) return s_argmax(logits, vocab);

    s_cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) return s_argmax(logits, vocab); /* documented fallback: greedy when out of memory */
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if (isnan(logits[i]) || logits[i] == -INFINITY) continue; /* masked */
        c[n].logit = logits[i];
        c[n].id = i;
        n++;
    }
    if (n == 0) {
        free(c);
        return 0;
    }
    qsort(c, (size_t)n, sizeof *c, s_cmp);
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    /* temperature and softmax (max first: exp never overflows) */
    double inv_t = 1.0 / (double)s->temperature, sum = 0.0;
    double mx = (double)c[0].logit * inv_t;
    for (int i = 0; i < n; i++) {
        double p = exp((double)c[i].logit * inv_t - mx);
        c[i].logit = (float)p;
        sum += p;
    }
    for (int i = 0; i < n; i++) c[i].logit = (float)(c[i].logit / sum);
    /* min-p: keep p >= min_p * p_max (c[0] is the max); always keeps c[0] */
    if (s->min_p > 0.0f) {
        float thr = s->min_p * c[0].logit;
        int k = 1;
        while (k < n && c[k].logit >= thr) k++;
        n = k;
    }
    /* top-p: the shortest prefix whose mass (renormalised after min-p) reaches top_p */
    if (s->top_p < 1.0f) {
        double tot = 0.0, acc = 0.0;
        for (int i = 0; i < n; i++) tot += c[i].logit;
        int k = 0;
        while (k < n) {
            acc += c[k].logit;
            k++;
            if (acc >= (double)s->top_p * tot) break;
        }
        n = k;
    }
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += c[i].logit;
    double u = (double)sampler_rng_uniform(rng) * tot, acc = 0.0;
    int pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].logit;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return pick;
}
