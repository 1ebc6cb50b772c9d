/* tests/penalty_ref.h: reads tests/data/penalty_ref.bin, the Python reference of the logit bias, the presence/
 * frequency penalties and the logprobs (tests/data/make_penalty_ref.py documents the format), for
 * tests/test_penalty_ref.c (CPU) and cuda/test_logprobs.cu (GPU). */
#ifndef ZLLM_TEST_PENALTY_REF_H
#define ZLLM_TEST_PENALTY_REF_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t vocab, n_gen, n_bias, k, sampled;
    float presence, frequency;
    float *logits;    /* [vocab] */
    int32_t *gen;     /* [n_gen] generated tokens */
    int32_t *bias_id; /* [n_bias] */
    float *bias;      /* [n_bias] */
    float *penalized; /* [vocab] the reference row after bias and penalties (float32, bit-exact) */
    double logprob;   /* log-softmax of penalized at sampled */
    uint32_t n_top;
    int32_t *top_id; /* [n_top] */
    double *top_lp;  /* [n_top] */
} penalty_case;

/* all cases of path into *cases (malloc'd; penalty_ref_free); their count, or -1 when the file is missing or
 * malformed (a message on stderr) */
static int penalty_ref_load(const char *path, penalty_case **cases) {
    FILE *f = fopen(path, "rb");
    uint32_t hdr[2];
    char magic[4];
    int n = -1;
    *cases = NULL;
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "ZLPR", 4) || fread(hdr, 4, 2, f) != 2 || hdr[0] != 1 ||
        hdr[1] > 10000)
        goto out;
    *cases = (penalty_case *)calloc(hdr[1] ? hdr[1] : 1, sizeof **cases);
    if (!*cases) goto out;
    for (uint32_t i = 0; i < hdr[1]; i++) {
        penalty_case *c = &(*cases)[i];
        uint32_t u[5];
        if (fread(u, 4, 5, f) != 5 || fread(&c->presence, 4, 1, f) != 1 || fread(&c->frequency, 4, 1, f) != 1) goto out;
        c->vocab = u[0], c->n_gen = u[1], c->n_bias = u[2], c->k = u[3], c->sampled = u[4];
        if (c->vocab < 1 || c->vocab > (1u << 20) || c->n_gen > (1u << 20) || c->n_bias > 300 || c->k > 20) goto out;
        c->logits = (float *)malloc(c->vocab * 4);
        c->gen = (int32_t *)malloc((c->n_gen + 1) * 4);
        c->bias_id = (int32_t *)malloc((c->n_bias + 1) * 4);
        c->bias = (float *)malloc((c->n_bias + 1) * 4);
        c->penalized = (float *)malloc(c->vocab * 4);
        c->top_id = (int32_t *)malloc(21 * 4);
        c->top_lp = (double *)malloc(21 * 8);
        if (!c->logits || !c->gen || !c->bias_id || !c->bias || !c->penalized || !c->top_id || !c->top_lp) goto out;
        if (fread(c->logits, 4, c->vocab, f) != c->vocab || fread(c->gen, 4, c->n_gen, f) != c->n_gen) goto out;
        for (uint32_t j = 0; j < c->n_bias; j++)
            if (fread(&c->bias_id[j], 4, 1, f) != 1 || fread(&c->bias[j], 4, 1, f) != 1) goto out;
        if (fread(c->penalized, 4, c->vocab, f) != c->vocab || fread(&c->logprob, 8, 1, f) != 1 ||
            fread(&c->n_top, 4, 1, f) != 1 || c->n_top > 20 || fread(c->top_id, 4, c->n_top, f) != c->n_top ||
            fread(c->top_lp, 8, c->n_top, f) != c->n_top)
            goto out;
    }
    n = (int)hdr[1];
out:
    if (n < 0) fprintf(stderr, "penalty_ref: cannot read %s (tests/data/make_penalty_ref.py writes it)\n", path);
    if (f) fclose(f);
    return n;
}

static void penalty_ref_free(penalty_case *cases, int n) {
    for (int i = 0; cases && i < n; i++) {
        penalty_case *c = &cases[i];
        free(c->logits), free(c->gen), free(c->bias_id), free(c->bias), free(c->penalized), free(c->top_id),
            free(c->top_lp);
    }
    free(cases);
}
#endif
