/* tests/oracle_check.h: an engine against transformers' logits for the models of tests/data/oracle (written by
 * tests/oracle/make_oracle.py: random gemma3 and Mistral-style models with sliding windows, F32), for any device.
 *
 * oracle_check(name, device, bound, bitwise): loads tests/data/oracle/NAME.gguf and for each prompt of NAME.json
 * prefills its first n_prefill tokens in one step and decodes the rest one token per step, alone in the engine; every
 * logits row must match the reference with rel err <= bound (rel err = max_i |ours_i - ref_i| / max_i |ref_i| over
 * a row). Then all prompts run together in one engine, their prompts cut into chunks of 7 tokens and the steps
 * shared: with bitwise, every row must be bitwise the row of the prompt alone (batch invariance, chunking included);
 * without (an engine whose products may round differently at another batch size, such as CUDA's cuBLAS path for
 * F32 files), within bound of the reference too.
 * Runs from the repository root (tests/run.sh does). Uses CHECK from tests/test.h. C and C++ (the GPU test). */
#ifndef ZLLM_ORACLE_CHECK_H
#define ZLLM_ORACLE_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "model.h"
#include "test.h"

#define ORACLE_MAX_PROMPTS 4
#define ORACLE_MAX_TOKENS 128

typedef struct {
    int n_prompts;
    int vocab;
    int window;
    int n[ORACLE_MAX_PROMPTS];                          /* tokens of each prompt */
    int n_prefill[ORACLE_MAX_PROMPTS];                  /* its first step */
    int32_t tok[ORACLE_MAX_PROMPTS][ORACLE_MAX_TOKENS]; /* its tokens */
    float *ref;                                         /* rows of every prompt in order, [rows][vocab] */
    size_t n_rows;                                      /* rows in all */
} oracle_ref;

static char *oracle_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0) b = (char *)malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[len] = 0;
    if (n) *n = b ? (size_t)len : 0;
    return b;
}

/* the integer after "key": at or after p; -1 when absent */
static long oracle_int(const char *p, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *q = strstr(p, pat);
    return q ? strtol(q + strlen(pat), NULL, 10) : -1;
}

/* reads NAME.json and NAME.logits.f32; 0, or -1 after a failed CHECK */
static int oracle_read(const char *name, oracle_ref *o) {
    char p[512];
    memset(o, 0, sizeof *o);
    snprintf(p, sizeof p, "tests/data/oracle/%s.json", name);
    char *j = oracle_slurp(p, NULL);
    CHECK(j != NULL, "cannot read %s (run from the repository root)", p);
    if (!j) return -1;
    o->vocab = (int)oracle_int(j, "vocab");
    o->window = (int)oracle_int(j, "window");
    o->n_prompts = (int)oracle_int(j, "n_prompts");
    int ok = o->vocab > 0 && o->n_prompts >= 1 && o->n_prompts <= ORACLE_MAX_PROMPTS;
    const char *at = strstr(j, "\"prompts\":");
    for (int i = 0; ok && i < o->n_prompts; i++) {
        at = at ? strstr(at, "\"n_prefill\":") : NULL;
        if (!at) break;
        o->n_prefill[i] = (int)oracle_int(at, "n_prefill");
        const char *t = strstr(at, "\"tokens\":");
        t = t ? strchr(t, '[') : NULL;
        int n = 0;
        while (t && n < ORACLE_MAX_TOKENS) {
            t++;
            char *end;
            long v = strtol(t, &end, 10);
            if (end == t) break;
            o->tok[i][n++] = (int32_t)v;
            t = end;
            while (*t == ' ' || *t == '\n') t++;
            if (*t != ',') break;
        }
        o->n[i] = n;
        ok = n > 1 && o->n_prefill[i] >= 1 && o->n_prefill[i] <= n;
        o->n_rows += ok ? (size_t)(n - o->n_prefill[i] + 1) : 0;
        at = t;
    }
    free(j);
    CHECK(ok && at, "%s: bad header", p);
    if (!ok || !at) return -1;
    size_t nb;
    snprintf(p, sizeof p, "tests/data/oracle/%s.logits.f32", name);
    o->ref = (float *)oracle_slurp(p, &nb);
    CHECK(o->ref && nb == o->n_rows * o->vocab * sizeof(float), "%s: %zu bytes, expected %zu", p, nb,
          o->n_rows * o->vocab * sizeof(float));
    if (!o->ref || nb != o->n_rows * o->vocab * sizeof(float)) return -1;
    return 0;
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

/* runs the prompts `which` (n of them, slot i for the i-th) in shared steps: prefill in chunks of `chunk` tokens
 * (0: n_prefill in one step), then one token per step; out[i] gets prompt which[i]'s rows */
static int oracle_run(zl_engine *e, const oracle_ref *o, const int *which, int n, int chunk, float **out) {
    int pos[ORACLE_MAX_PROMPTS] = {0}, row[ORACLE_MAX_PROMPTS] = {0};
    float *lg = (float *)malloc((size_t)ORACLE_MAX_PROMPTS * o->vocab * sizeof(float));
    if (!lg) return -1;
    for (;;) {
        zl_seq s[ORACLE_MAX_PROMPTS];
        int map[ORACLE_MAX_PROMPTS], k = 0;
        for (int i = 0; i < n; i++) {
            const int p = which[i], np = o->n_prefill[p];
            if (pos[i] >= o->n[p]) continue;
            int nt = pos[i] < np ? (chunk > 0 ? chunk : np) : 1;
            if (pos[i] < np && pos[i] + nt > np) nt = np - pos[i];
            memset(&s[k], 0, sizeof s[k]);
            s[k].slot = i;
            s[k].pos = pos[i];
            s[k].n_tokens = nt;
            s[k].tokens = o->tok[p] + pos[i];
            s[k].sample = 1;
            map[k++] = i;
        }
        if (k == 0) break;
        int32_t ids[ORACLE_MAX_PROMPTS];
        if (engine_step(e, s, k, ids, lg) != 0) {
            CHECK(0, "step: %s", e->err);
            free(lg);
            return -1;
        }
        for (int q = 0; q < k; q++) {
            const int i = map[q];
            pos[i] += s[q].n_tokens;
            if (pos[i] >= o->n_prefill[which[i]])
                memcpy(out[i] + (size_t)row[i]++ * o->vocab, lg + (size_t)q * o->vocab, o->vocab * sizeof(float));
        }
    }
    free(lg);
    return 0;
}

/* the check of the file's header comment; returns the worst rel err seen (or INFINITY on a failure to run) */
static double oracle_check(const char *name, const char *device, double bound, int bitwise) {
    oracle_ref o;
    char p[512], err[512];
    zl_model *m = NULL;
    zl_engine *e = NULL;
    zl_engine_opts eo;
    float *alone[ORACLE_MAX_PROMPTS] = {0}, *both[ORACLE_MAX_PROMPTS] = {0};
    int which[ORACLE_MAX_PROMPTS];
    size_t r0 = 0;
    double worst = INFINITY;
    if (oracle_read(name, &o)) goto done;
    snprintf(p, sizeof p, "tests/data/oracle/%s.gguf", name);
    m = model_load(p, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m) goto done;
    CHECK(m->cfg.vocab_size == o.vocab && m->cfg.swa_window == o.window, "%s: vocab %d window %d, reference %d %d",
          name, m->cfg.vocab_size, m->cfg.swa_window, o.vocab, o.window);
    memset(&eo, 0, sizeof eo);
    eo.device = device;
    eo.n_slots = ORACLE_MAX_PROMPTS;
    eo.max_batch = ORACLE_MAX_PROMPTS;
    eo.n_ctx = ORACLE_MAX_TOKENS;
    eo.threads = 2;
    e = engine_new(m, &eo, err, sizeof err);
    CHECK(e != NULL, "%s on %s: engine_new: %s", name, device, err);
    if (!e) goto done;
    worst = 0;
    for (int i = 0; i < o.n_prompts; i++) {
        const int rows = o.n[i] - o.n_prefill[i] + 1;
        alone[i] = (float *)calloc((size_t)rows * o.vocab, sizeof(float));
        both[i] = (float *)calloc((size_t)rows * o.vocab, sizeof(float));
        which[i] = i;
        if (!alone[i] || !both[i] || oracle_run(e, &o, &which[i], 1, 0, &alone[i])) {
            worst = INFINITY;
            goto done;
        }
        for (int r = 0; r < rows; r++) {
            const double x = oracle_rel_err(alone[i] + (size_t)r * o.vocab, o.ref + (r0 + r) * o.vocab, o.vocab);
            CHECK(x <= bound, "%s on %s: prompt %d position %d: rel err %.3g > %.3g", name, device, i,
                  o.n_prefill[i] - 1 + r, x, bound);
            if (!(x <= worst)) worst = x;
        }
        r0 += (size_t)rows;
    }
    r0 = 0;
    if (oracle_run(e, &o, which, o.n_prompts, 7, both) == 0)
        for (int i = 0; i < o.n_prompts; i++) {
            const int rows = o.n[i] - o.n_prefill[i] + 1;
            if (bitwise)
                CHECK(memcmp(alone[i], both[i], (size_t)rows * o.vocab * sizeof(float)) == 0,
                      "%s on %s: prompt %d batched with the others in chunks of 7 differs from alone", name, device, i);
            for (int r = 0; !bitwise && r < rows; r++) {
                const double x = oracle_rel_err(both[i] + (size_t)r * o.vocab, o.ref + (r0 + r) * o.vocab, o.vocab);
                CHECK(x <= bound, "%s on %s: prompt %d batched, position %d: rel err %.3g > %.3g", name, device, i,
                      o.n_prefill[i] - 1 + r, x, bound);
                if (!(x <= worst)) worst = x;
            }
            r0 += (size_t)rows;
        }
    printf("%s on %s: %zu rows x %d logits vs transformers: max rel err %.3g (bound %.0e)\n", name, device, o.n_rows,
           o.vocab, worst, bound);
done:
    for (int i = 0; i < ORACLE_MAX_PROMPTS; i++) {
        free(alone[i]);
        free(both[i]);
    }
    engine_destroy(&e);
    model_destroy(&m);
    free(o.ref);
    return worst;
}
#endif
