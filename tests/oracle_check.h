/* tests/oracle_check.h: an engine against transformers' logits on the oracle models of tests/data/oracle (made by
 * tests/oracle/make_oracle.py: tiny random models built by transformers, written with the gguf package's writer as
 * llama.cpp's converter writes them), for any device. Shared by tests/test_oracle.c (CPU engines) and
 * cuda/test_oracle_gpu.cu (CUDA engine); C and C++ alike. Runs from the repository root (tests/run.sh does). Needs
 * test.h (CHECK).
 *
 * A case NAME is NAME.gguf, NAME.txt and NAME.logits.f32 ([rows][vocab] little-endian f32, the check rows of every
 * prompt in order). NAME.txt:
 *     vocab V
 *     window W                            (optional: the model's attention.sliding_window, 0 when absent)
 *     greedy N IDS...                     (optional: transformers' greedy continuation of prompt 0, for
 *                                          tests/test_e2e_gemma3.sh; no near tie in it)
 *     prompt N_TOKENS N_CTX N_CHECKS      (N_CTX: the context the engine is made with; LongRoPE depends on it)
 *     TOKENS...
 *     CHECK POSITIONS...                  (ascending; one logits row each)
 * lines starting with '#' are comments.
 *
 * oracle_run: each prompt alone on an engine of its N_CTX, prefilled in chunks that end at the check positions
 * (consecutive checks are single-token decode steps); the worst rel err over the rows, rel err of a row =
 * max_i |ours - ref| / max_i |ref|.
 * oracle_batch: every prompt together in one engine, cut into chunks of at most 7 tokens (ending at the check
 * positions) in shared steps: each check row must be bitwise that of the prompt alone in the same engine, whole
 * chunks (batch and chunking invariance); or, given a bound (an engine whose products may round differently at
 * another batch size, such as CUDA's cuBLAS path for these small shapes), within it of those rows (the engine's
 * context is the longest prompt's, so LongRoPE may pick another factor set than the reference's for a short one).
 * oracle_companion: prompt 0 in its check chunks alone, then with a second sequence (other tokens, other
 * positions, 1 to 3 tokens) in every step: bitwise the same rows. */
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
    int vocab, window, n_prompts, n_rows;
    oracle_prompt p[ORACLE_MAX_PROMPTS];
    float *ref; /* [n_rows][vocab] */
} oracle_case;

/* the oracle models: name, architecture, and the CPU engines' bound (cpu-ref and cpu alike; the f32 reference
 * engine stays well inside it everywhere). The CUDA engine's bound: 1e-3 for F32 files, 2e-2 for the BF16 twins
 * (16-bit product inputs and KV cache). */
typedef struct {
    const char *name;
    zl_arch arch;
    double cpu_bound;
} oracle_model;

static const oracle_model oracle_models[] = {
    /* RoPE variants and architectures */
    {"llama3", ZL_ARCH_LLAMA, 1e-3},
    {"llama3-bf16", ZL_ARCH_LLAMA, 1e-3},
    {"linear", ZL_ARCH_LLAMA, 1e-3},
    {"linear-bf16", ZL_ARCH_LLAMA, 1e-3},
    {"yarn", ZL_ARCH_LLAMA, 1e-3},
    {"yarn-bf16", ZL_ARCH_LLAMA, 1e-3},
    {"qwen3", ZL_ARCH_QWEN3, 1e-3},
    {"qwen3-bf16", ZL_ARCH_QWEN3, 1e-3},
    {"qwen3-yarn", ZL_ARCH_QWEN3, 1e-3},
    {"qwen3-yarn-bf16", ZL_ARCH_QWEN3, 1e-3},
    {"phi3", ZL_ARCH_PHI3, 1e-3},
    {"phi3-bf16", ZL_ARCH_PHI3, 1e-3},
    {"phi3-hd96", ZL_ARCH_PHI3, 1e-3}, /* Phi-3 mini's head size 96 */
    {"phi3-hd96-bf16", ZL_ARCH_PHI3, 1e-3},
    /* gemma3 and sliding windows */
    {"gemma3-swa", ZL_ARCH_GEMMA3, 1e-4},
    {"gemma3-linear", ZL_ARCH_GEMMA3, 1e-4},
    {"gemma3-swa-bf16", ZL_ARCH_GEMMA3, 1e-4},
    {"mistral-swa", ZL_ARCH_LLAMA, 1e-4},
};
#define ORACLE_N_MODELS ((int)(sizeof oracle_models / sizeof oracle_models[0]))

/* the CUDA engine's bound for a case */
static inline double oracle_cuda_bound(const char *name) {
    const size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, "-bf16") == 0 ? 2e-2 : 1e-3;
}

static inline void oracle_free(oracle_case *c) {
    for (int i = 0; i < c->n_prompts; i++) {
        free(c->p[i].tokens);
        free(c->p[i].checks);
    }
    free(c->ref);
    memset(c, 0, sizeof *c);
}

/* reads tests/data/oracle/NAME.txt and NAME.logits.f32; 0 or -1 (with a CHECK failure) */
static inline int oracle_read(const char *name, oracle_case *c) {
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
        } else if (!strcmp(line, "window")) {
            ok = fscanf(f, "%d", &c->window) == 1 && c->window >= 0;
        } else if (!strcmp(line, "greedy")) { /* read by the broker test */
            int n, id;
            ok = fscanf(f, "%d", &n) == 1 && n >= 0;
            for (int i = 0; ok && i < n; i++) ok = fscanf(f, "%d", &id) == 1;
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
    c->ref = (float *)calloc((size_t)c->n_rows * c->vocab + 1, sizeof(float)); /* + 1: a longer file reads past */
    size_t got = f && c->ref ? fread(c->ref, sizeof(float), (size_t)c->n_rows * c->vocab + 1, f) : 0;
    if (f) fclose(f);
    CHECK(got == (size_t)c->n_rows * c->vocab, "%s: %zu floats, expected %d", path, got, c->n_rows * c->vocab);
    return got == (size_t)c->n_rows * c->vocab ? 0 : -1;
}

static inline double oracle_rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN propagates as a failure */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

static inline zl_engine *oracle_engine(const zl_model *m, const char *dev, int n_slots, int n_ctx, int max_step_tokens,
                                       int no_graphs) {
    char err[512];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = dev;
    o.n_slots = n_slots;
    o.max_batch = n_slots;
    o.n_ctx = n_ctx;
    o.max_step_tokens = max_step_tokens;
    o.threads = 2;
    o.no_graphs = no_graphs;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "%s: engine_new: %s", dev, err);
    return e;
}

/* the largest rel err of device `dev`'s logits on model m over every check row of c; -1 when a step fails
 * (a CHECK failure names it). no_graphs: the CUDA engine's decode steps run eagerly instead of from graphs */
static inline double oracle_run(const zl_model *m, const oracle_case *c, const char *dev, int no_graphs) {
    double worst = 0;
    float *lg = (float *)calloc((size_t)c->vocab, sizeof(float));
    int row = 0;
    for (int pi = 0; pi < c->n_prompts && lg; pi++) {
        const oracle_prompt *p = &c->p[pi];
        zl_engine *e = oracle_engine(m, dev, 1, p->n_ctx, p->n_tokens, no_graphs);
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

/* runs the prompts `which` (n of them, the i-th in slot i) of c on e in shared steps, each cut into chunks of at
 * most `chunk` tokens (0: no limit) that end at its check positions; out[i] gets the check rows of prompt
 * which[i]. 0, or -1 after a failed CHECK */
static inline int oracle_steps(zl_engine *e, const oracle_case *c, const int *which, int n, int chunk, float **out) {
    int pos[ORACLE_MAX_PROMPTS] = {0}, row[ORACLE_MAX_PROMPTS] = {0};
    float *lg = (float *)malloc((size_t)ORACLE_MAX_PROMPTS * c->vocab * sizeof(float));
    if (!lg) return -1;
    for (;;) {
        zl_seq s[ORACLE_MAX_PROMPTS];
        int map[ORACLE_MAX_PROMPTS], k = 0;
        for (int i = 0; i < n; i++) {
            const oracle_prompt *p = &c->p[which[i]];
            if (row[i] >= p->n_checks) continue;
            int nt = p->checks[row[i]] + 1 - pos[i];
            if (chunk > 0 && nt > chunk) nt = chunk;
            memset(&s[k], 0, sizeof s[k]);
            s[k].slot = i;
            s[k].pos = pos[i];
            s[k].n_tokens = nt;
            s[k].tokens = p->tokens + pos[i];
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
            if (pos[i] == c->p[which[i]].checks[row[i]] + 1)
                memcpy(out[i] + (size_t)row[i]++ * c->vocab, lg + (size_t)q * c->vocab, c->vocab * sizeof(float));
        }
    }
    free(lg);
    return 0;
}

/* the batch and chunking check of the header comment on device dev: bitwise (bound 0) or within bound of the rows
 * alone; 0, or -1 after a failed CHECK */
static inline int oracle_batch(const zl_model *m, const oracle_case *c, const char *dev, int no_graphs,
                               const char *name, double bound) {
    float *alone[ORACLE_MAX_PROMPTS] = {0}, *both[ORACLE_MAX_PROMPTS] = {0};
    int which[ORACLE_MAX_PROMPTS], n_ctx = 0, steps = 0, rc = -1;
    for (int i = 0; i < c->n_prompts; i++) {
        if (c->p[i].n_ctx > n_ctx) n_ctx = c->p[i].n_ctx;
        steps += c->p[i].n_tokens;
    }
    zl_engine *e = oracle_engine(m, dev, c->n_prompts, n_ctx, steps, no_graphs);
    if (!e) return -1;
    for (int i = 0; i < c->n_prompts; i++) {
        alone[i] = (float *)calloc((size_t)c->p[i].n_checks * c->vocab, sizeof(float));
        both[i] = (float *)calloc((size_t)c->p[i].n_checks * c->vocab, sizeof(float));
        which[i] = i;
        if (!alone[i] || !both[i] || oracle_steps(e, c, &which[i], 1, 0, &alone[i])) goto done;
    }
    if (oracle_steps(e, c, which, c->n_prompts, 7, both)) goto done;
    rc = 0;
    for (int i = 0; i < c->n_prompts; i++) {
        if (bound > 0) {
            for (int r = 0; r < c->p[i].n_checks; r++) {
                const double x =
                    oracle_rel_err(both[i] + (size_t)r * c->vocab, alone[i] + (size_t)r * c->vocab, c->vocab);
                CHECK(x <= bound, "%s on %s: prompt %d batched, position %d: rel err %.3g > %.3g", name, dev, i,
                      c->p[i].checks[r], x, bound);
                if (!(x <= bound)) rc = -1;
            }
            continue;
        }
        const int same = memcmp(alone[i], both[i], (size_t)c->p[i].n_checks * c->vocab * sizeof(float)) == 0;
        CHECK(same, "%s on %s: prompt %d batched with the others in chunks of 7 differs from alone", name, dev, i);
        if (!same) rc = -1;
    }
done:
    for (int i = 0; i < ORACLE_MAX_PROMPTS; i++) {
        free(alone[i]);
        free(both[i]);
    }
    engine_destroy(&e);
    return rc;
}

/* the companion check of the header comment on device dev; 0, or -1 after a failed CHECK */
static inline int oracle_companion(const zl_model *m, const oracle_case *c, const char *dev, int no_graphs,
                                   const char *name) {
    const oracle_prompt *p = &c->p[0];
    size_t V = (size_t)c->vocab;
    float *solo = (float *)calloc((size_t)p->n_checks * V, sizeof(float)), *lg = (float *)calloc(2 * V, sizeof(float));
    int32_t *other = (int32_t *)calloc((size_t)p->n_tokens + 16, sizeof(int32_t));
    int same = solo && lg && other;
    for (int i = 0; other && i < p->n_tokens + 16; i++) other[i] = (int32_t)((i * 37 + 11) % c->vocab);
    for (int pass = 0; pass < 2 && same; pass++) {
        zl_engine *e = oracle_engine(m, dev, 2, p->n_ctx, 2 * p->n_tokens + 16, no_graphs);
        if (!e) {
            same = 0;
            break;
        }
        int pos = 0, opos = 0;
        for (int k = 0; k < p->n_checks && same; k++) {
            zl_seq s[2];
            int32_t tok[2];
            memset(s, 0, sizeof s);
            s[0].slot = 0;
            s[0].pos = pos;
            s[0].n_tokens = p->checks[k] + 1 - pos;
            s[0].tokens = p->tokens + pos;
            s[0].sample = 1;
            /* the companion: 1 to 3 tokens per step (decode-like and short prefills), in slot 1 */
            s[1].slot = 1;
            s[1].pos = opos;
            s[1].n_tokens = 1 + k % 3;
            s[1].tokens = other + (opos % p->n_tokens);
            s[1].sample = 1;
            if (opos + s[1].n_tokens > p->n_ctx || opos % p->n_tokens + s[1].n_tokens > p->n_tokens + 16) break;
            if (engine_step(e, s, pass + 1, tok, lg) != 0) {
                CHECK(0, "%s: %s: step: %s", name, dev, e->err);
                same = 0;
                break;
            }
            if (pass == 0) memcpy(solo + (size_t)k * V, lg, V * sizeof(float));
            else same = memcmp(solo + (size_t)k * V, lg, V * sizeof(float)) == 0;
            pos = p->checks[k] + 1;
            opos += s[1].n_tokens;
        }
        engine_destroy(&e);
    }
    CHECK(same, "%s: %s: logits of a sequence change when another shares its steps", name, dev);
    free(solo);
    free(lg);
    free(other);
    return same ? 0 : -1;
}

/* loads case `name` (its model into *m); 0, or -1 after a failed CHECK (then nothing is held) */
static inline int oracle_open(const oracle_model *om, oracle_case *c, zl_model **m) {
    char path[256], err[512];
    *m = NULL;
    if (oracle_read(om->name, c) != 0) {
        oracle_free(c);
        return -1;
    }
    snprintf(path, sizeof path, "tests/data/oracle/%s.gguf", om->name);
    *m = model_load(path, err, sizeof err);
    CHECK(*m != NULL, "%s", err);
    if (*m) {
        const zl_config *k = &(*m)->cfg;
        CHECK(k->arch == om->arch && k->vocab_size == c->vocab && k->swa_window == c->window,
              "%s: architecture %d vocab %d window %d, expected %d %d %d", om->name, (int)k->arch, k->vocab_size,
              k->swa_window, (int)om->arch, c->vocab, c->window);
        return 0;
    }
    oracle_free(c);
    return -1;
}
#endif
