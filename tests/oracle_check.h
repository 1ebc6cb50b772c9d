/* tests/oracle_check.h: runs an engine on the oracle cases of tests/data/oracle (made by
 * tests/oracle/make_oracle.py from transformers models written with the gguf package's writer) and compares its
 * logits with transformers' at every check position. Shared by tests/test_oracle_logits.c (CPU engines) and
 * cuda/test_oracle_gpu.cu (CUDA engine); C and C++ alike. Each prompt is prefilled in chunks that end at the
 * check positions (consecutive checks at the end are single-token decode steps), on an engine made with the
 * prompt's context (LongRoPE chooses its factor set by it). rel err of a row = max_i |ours - ref| / max_i |ref|.
 * Needs test.h (CHECK) included before. */
#ifndef ZLLM_ORACLE_CHECK_H
#define ZLLM_ORACLE_CHECK_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "model.h"

#define ORACLE_MAX_PROMPTS 4

typedef struct {
    int n_tokens, n_ctx, n_checks;
    int32_t *tokens; /* [n_tokens] */
    int *checks;     /* [n_checks] ascending positions */
} oracle_prompt;

typedef struct {
    int vocab, n_prompts, n_rows;
    oracle_prompt p[ORACLE_MAX_PROMPTS];
    float *ref; /* [n_rows][vocab] */
} oracle_case;

static void oracle_free(oracle_case *c) {
    for (int i = 0; i < c->n_prompts; i++) {
        free(c->p[i].tokens);
        free(c->p[i].checks);
    }
    free(c->ref);
    memset(c, 0, sizeof *c);
}

/* reads tests/data/oracle/NAME.txt and NAME.logits.f32; 0 or -1 (with a CHECK failure) */
static int oracle_read(const char *name, oracle_case *c) {
    char path[512], line[256];
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "tests/data/oracle/%s.txt", name);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s (run from the repository root)", path);
    if (!f) return -1;
    int ok = 1;
    while (ok && fscanf(f, " %255s", line) == 1) {
        if (line[0] == '#') {
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n') {}
        } else if (!strcmp(line, "vocab")) {
            ok = fscanf(f, "%d", &c->vocab) == 1 && c->vocab > 0;
        } else if (!strcmp(line, "prompt") && c->n_prompts < ORACLE_MAX_PROMPTS) {
            oracle_prompt *p = &c->p[c->n_prompts++];
            ok = fscanf(f, "%d %d %d", &p->n_tokens, &p->n_ctx, &p->n_checks) == 3 && p->n_tokens > 0 &&
                 p->n_checks > 0 && p->n_ctx >= p->n_tokens;
            if (!ok) break;
            p->tokens = (int32_t *)calloc((size_t)p->n_tokens, sizeof(int32_t));
            p->checks = (int *)calloc((size_t)p->n_checks, sizeof(int));
            ok = p->tokens && p->checks;
            for (int i = 0; ok && i < p->n_tokens; i++) ok = fscanf(f, "%d", &p->tokens[i]) == 1;
            for (int i = 0; ok && i < p->n_checks; i++)
                ok = fscanf(f, "%d", &p->checks[i]) == 1 && p->checks[i] < p->n_tokens &&
                     (i == 0 || p->checks[i] > p->checks[i - 1]);
            c->n_rows += p->n_checks;
        } else {
            ok = 0;
        }
    }
    fclose(f);
    CHECK(ok && c->vocab > 0 && c->n_prompts > 0, "%s: malformed", path);
    if (!ok || !c->n_prompts) return -1;
    snprintf(path, sizeof path, "tests/data/oracle/%s.logits.f32", name);
    f = fopen(path, "rb");
    c->ref = (float *)calloc((size_t)c->n_rows * c->vocab, sizeof(float));
    size_t got = f && c->ref ? fread(c->ref, sizeof(float), (size_t)c->n_rows * c->vocab + 1, f) : 0;
    if (f) fclose(f);
    CHECK(got == (size_t)c->n_rows * c->vocab, "%s: %zu floats, expected %d", path, got, c->n_rows * c->vocab);
    return got == (size_t)c->n_rows * c->vocab ? 0 : -1;
}

static double oracle_rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN propagates as a failure */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

/* the largest rel err of device `dev`'s logits on model m over every check row of c; -1 when a step fails
 * (a CHECK failure names it). no_graphs: the CUDA engine's decode steps run eagerly instead of from graphs */
static double oracle_run(const zl_model *m, const oracle_case *c, const char *dev, int no_graphs) {
    char err[512];
    double worst = 0;
    float *lg = (float *)calloc((size_t)c->vocab, sizeof(float));
    int row = 0;
    for (int pi = 0; pi < c->n_prompts && lg; pi++) {
        const oracle_prompt *p = &c->p[pi];
        zl_engine_opts o;
        memset(&o, 0, sizeof o);
        o.device = dev;
        o.n_slots = 1;
        o.max_batch = 1;
        o.n_ctx = p->n_ctx;
        o.max_step_tokens = p->n_tokens;
        o.threads = 2;
        o.no_graphs = no_graphs;
        zl_engine *e = engine_new(m, &o, err, sizeof err);
        CHECK(e != NULL, "%s: engine_new: %s", dev, err);
        if (!e) {
            worst = -1;
            break;
        }
        int pos = 0;
        for (int k = 0; k < p->n_checks; k++, row++) {
            int32_t tok;
            zl_seq s;
            memset(&s, 0, sizeof s);
            s.slot = 0;
            s.pos = pos;
            s.n_tokens = p->checks[k] + 1 - pos;
            s.tokens = p->tokens + pos;
            s.sample = 1;
            if (engine_step(e, &s, 1, &tok, lg) != 0) {
                CHECK(0, "%s: step at %d: %s", dev, pos, e->err);
                worst = -1;
                break;
            }
            pos = p->checks[k] + 1;
            double r = oracle_rel_err(lg, c->ref + (size_t)row * c->vocab, c->vocab);
            if (!(r <= worst)) worst = r;
        }
        engine_destroy(&e);
        if (worst < 0) break;
    }
    free(lg);
    return worst;
}
#endif
