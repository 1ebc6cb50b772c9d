/* tests/test_reference.c: the CPU engine against oracles we did not write.
 *
 * 1. Reference logits from PyTorch + transformers (tests/ref/make_refs.py; committed as tests/ref/NAME.json +
 *    NAME.logits.f32) for stories260K and two zllm-mkmodel models (tiny llama and tiny qwen2: F32, GQA, 3 layers,
 *    head_dim * heads != dim), and SmolLM2-135M-Instruct Q4_1 (deploy/fetch-model.sh) as loaded by transformers'
 *    own GGUF loader (a 512-id subset of each 49152-logit row is stored). The engine prefills the first n_prefill tokens in one step, then decodes the rest
 *    one token per step; each logits row must match with relative error <= 1e-4, where
 *    rel err = max_i |ours_i - ref_i| / max_i |ref_i| over one row of vocab logits (for the subset rows: max over
 *    the stored ids, divided by the full row's max |ref|, recorded in the header).
 * 2. Quantized vs dequantized twin: zllm-mkmodel writes random q4_k_m / q8_0 / q4_1 / ... models (fixed seed),
 *    tests/ref/dequant_twin.py writes their F32 twins with the gguf Python package's dequantizer, and the engine's
 *    logits on the two files must agree with rel err <= 1e-5 (same definition).
 * Runs from the repository root (tests/run.sh does); binaries from $ZLLM_BUILD (default build). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine.h"
#include "model.h"
#include "test.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[len] = 0;
    if (n) *n = b ? (size_t)len : 0;
    return b;
}

/* the tiny JSON subset make_refs.py writes: "key": int / "key": "str" / "key": [ints] */
static const char *json_find(const char *j, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(j, pat);
    return p ? p + strlen(pat) : NULL;
}

static long json_int(const char *j, const char *key) {
    const char *p = json_find(j, key);
    return p ? strtol(p, NULL, 10) : -1;
}

static int json_ints(const char *j, const char *key, int32_t *out, int max) {
    const char *p = json_find(j, key);
    if (!p || !(p = strchr(p, '['))) return -1;
    int n = 0;
    p++;
    while (n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[n++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ' || *p == '\n') p++;
    }
    return n;
}

static int json_floats(const char *j, const char *key, double *out, int max) {
    const char *p = json_find(j, key);
    if (!p || !(p = strchr(p, '['))) return -1;
    int n = 0;
    p++;
    while (n < max) {
        char *end;
        double v = strtod(p, &end);
        if (end == p) break;
        out[n++] = v;
        p = end;
        while (*p == ',' || *p == ' ' || *p == '\n') p++;
    }
    return n;
}

/* max|a-b| / max|b| over n */
static double rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d;   /* NaN propagates as a failure */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

/* prefill toks[0..n_prefill) in one step, then one step per remaining token; out gets [n - n_prefill + 1][V] */
static int run_tokens(const zl_model *m, const int32_t *toks, int n, int n_prefill, int threads, float *out) {
    char err[256];
    zl_engine_opts o = {.device = "cpu-ref", .n_slots = 1, .max_batch = 1, .n_ctx = 64, .threads = threads};
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new: %s", err);
    if (!e) return -1;
    int V = m->cfg.vocab_size, row = 0, pos = 0, rc = 0;
    while (pos < n) {
        int nt = pos == 0 ? n_prefill : 1;
        int32_t tok;
        zl_seq s = { .slot = 0, .pos = pos, .n_tokens = nt, .tokens = toks + pos, .sample = 1 };
        if (engine_step(e, &s, 1, &tok, out + (size_t)row * V) != 0) {
            CHECK(0, "step at %d: %s", pos, e->err);
            rc = -1;
            break;
        }
        pos += nt;
        row++;
    }
    engine_destroy(&e);
    return rc;
}

/* reference `name` (tests/ref/NAME.json ...) for the model at model_path (NULL: tests/ref/NAME.gguf, else the
 * fixtures). Subset references (large vocabularies) hold, per row, `subset` ids (NAME.idx.i32), their logits, and
 * the full row's max|logit| in row_absmax: rel err is then max over the subset |ours - ref| / row_absmax. */
static void test_ref(const char *name, const char *model_path) {
    char p[1200], err[512];
    snprintf(p, sizeof p, "tests/ref/%s.json", name);
    char *j = slurp(p, NULL);
    CHECK(j != NULL, "cannot read %s (run from the repository root)", p);
    if (!j) return;
    int32_t toks[64];
    int n = json_ints(j, "tokens", toks, 64);
    long n_prefill = json_int(j, "n_prefill"), rows = json_int(j, "rows"), vocab = json_int(j, "vocab");
    long subset = json_int(j, "subset");
    double absmax[64];
    int n_absmax = subset > 0 ? json_floats(j, "row_absmax", absmax, 64) : 0;
    int good = n > 1 && n_prefill >= 1 && rows == n - n_prefill + 1 && vocab > 0 && subset <= vocab &&
               (subset <= 0 || n_absmax == rows);
    CHECK(good, "%s: bad header", p);
    free(j);
    if (!good) return;
    long width = subset > 0 ? subset : vocab;   /* stored values per row */
    snprintf(p, sizeof p, "tests/ref/%s.logits.f32", name);
    size_t nb, ni = 0;
    float *ref = (float *)slurp(p, &nb);
    int32_t *idx = NULL;
    CHECK(ref && nb == (size_t)rows * width * 4, "%s: %zu bytes, expected %ld", p, nb, rows * width * 4);
    if (subset > 0) {
        snprintf(p, sizeof p, "tests/ref/%s.idx.i32", name);
        idx = (int32_t *)slurp(p, &ni);
        CHECK(idx && ni == (size_t)rows * width * 4, "%s: %zu bytes, expected %ld", p, ni, rows * width * 4);
        for (size_t i = 0; idx && i < ni / 4; i++)
            if (idx[i] < 0 || idx[i] >= vocab) idx[i] = 0;
    }
    if (model_path) {
        snprintf(p, sizeof p, "%s", model_path);
    } else {
        snprintf(p, sizeof p, "tests/ref/%s.gguf", name);
        if (access(p, R_OK) != 0) snprintf(p, sizeof p, "%s/%s/%s.gguf", test_fixtures(), name, name);
    }
    zl_model *m = model_load(p, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (m && ref && nb == (size_t)rows * width * 4 && (subset <= 0 || (idx && ni == nb))) {
        CHECK(m->cfg.vocab_size == vocab, "%s: vocab %d vs reference %ld", name, m->cfg.vocab_size, vocab);
        float *got = calloc((size_t)rows * vocab, sizeof(float)), *got1 = calloc((size_t)rows * vocab, sizeof(float));
        int small = vocab <= 4096;   /* the 1-vs-2-threads bitwise check only where it is cheap */
        if (m->cfg.vocab_size == vocab && run_tokens(m, toks, n, (int)n_prefill, 2, got) == 0 &&
            (!small || run_tokens(m, toks, n, (int)n_prefill, 1, got1) == 0)) {
            double worst = 0;
            for (long r = 0; r < rows; r++) {
                double e;
                if (subset > 0) {
                    double num = 0;
                    for (long i = 0; i < width; i++) {
                        double d = fabs((double)got[r * vocab + idx[r * width + i]] - ref[r * width + i]);
                        if (!(d <= num)) num = d;
                    }
                    e = num / absmax[r];
                } else {
                    e = rel_err(got + r * vocab, ref + r * vocab, (int)vocab);
                }
                CHECK(e <= 1e-4, "%s: logits row %ld (position %ld): rel err %.3g > 1e-4", name, r, n_prefill - 1 + r, e);
                if (e > worst || isnan(e)) worst = e;
            }
            printf("%s: %ld rows x %ld of %ld logits vs transformers: max rel err %.3g\n", name, rows, width, vocab,
                   worst);
            CHECK(!small || memcmp(got, got1, sizeof(float) * rows * vocab) == 0, "%s: 1 and 2 threads differ", name);
        }
        free(got);
        free(got1);
    }
    free(ref);
    free(idx);
    model_destroy(&m);
}

/* quantized models vs their F32 twins dequantized by gguf-py: make every model (zllm-mkmodel, fixed seed), then
 * all twins in one python run, then compare */
typedef struct {
    const char *type;          /* mkmodel --type */
    const char *arch;          /* llama or qwen2 */
} twin_case;

static void twin_paths(const char *dir, const twin_case *c, char *q, char *t, size_t cap) {
    snprintf(q, cap, "%s/%s-%s.gguf", dir, c->arch, c->type);
    snprintf(t, cap, "%s/%s-%s.f32.gguf", dir, c->arch, c->type);
}

static void test_twins(const char *dir, const twin_case *cases, int n) {
    const char *build = getenv("ZLLM_BUILD");
    if (!build || !*build) build = "build";
    char q[1100], t[1100], cmd[8192], err[512];
    size_t len = (size_t)snprintf(cmd, sizeof cmd, "python3 tests/ref/dequant_twin.py");
    int made = 1;
    for (int i = 0; i < n; i++) {
        char mk[2600];
        twin_paths(dir, &cases[i], q, t, sizeof q);
        /* dims multiples of 256 so that k-quants apply (q4_k_m also mixes in q6_k for some attn_v / ffn_down) */
        snprintf(mk, sizeof mk,
                 "%s/bin/zllm-mkmodel -o %s --arch %s --layers 2 --dim 256 --heads 8 --kv-heads 2 --head-dim 32 "
                 "--ffn 512 --vocab 260 --ctx 64 --type %s --seed 5 >/dev/null 2>&1", build, q, cases[i].arch,
                 cases[i].type);
        int rc = system(mk);
        CHECK(rc == 0, "%s %s: zllm-mkmodel failed: %s", cases[i].arch, cases[i].type, mk);
        made &= rc == 0;
        len += (size_t)snprintf(cmd + len, len < sizeof cmd ? sizeof cmd - len : 0, " %s %s", q, t);
    }
    CHECK(len < sizeof cmd, "command too long");
    int rc = made && len < sizeof cmd ? system(cmd) : -1;
    CHECK(rc == 0, "dequant_twin.py failed: %s", cmd);
    for (int i = 0; rc == 0 && i < n; i++) {
        const char *type = cases[i].type, *arch = cases[i].arch;
        twin_paths(dir, &cases[i], q, t, sizeof q);
        zl_model *mq = model_load(q, err, sizeof err);
        CHECK(mq != NULL, "%s", err);
        zl_model *mt = model_load(t, err, sizeof err);
        CHECK(mt != NULL, "%s", err);
        if (mq && mt) {
            int V = mq->cfg.vocab_size, ok = 1;
            CHECK(mq->layers[0].wq.type != GGML_F32 && mt->layers[0].wq.type == GGML_F32, "%s: types", type);
            int32_t toks[12] = { 1, 17, 200, 3, 99, 42, 42, 7, 255, 128, 64, 2 };
            float *a = calloc((size_t)6 * V, sizeof(float)), *b = calloc((size_t)6 * V, sizeof(float));
            if (run_tokens(mq, toks, 12, 7, 2, a) == 0 && run_tokens(mt, toks, 12, 7, 2, b) == 0) {
                double worst = 0;
                for (int r = 0; r < 6; r++) {
                    double e = rel_err(a + (size_t)r * V, b + (size_t)r * V, V);
                    if (!(e <= 1e-5)) ok = 0;
                    if (e > worst || isnan(e)) worst = e;
                }
                CHECK(ok, "%s %s vs its F32 twin: max rel err %.3g > 1e-5", arch, type, worst);
                printf("%s %s vs F32 twin (gguf-py dequantized): max rel err %.3g\n", arch, type, worst);
            }
            free(a);
            free(b);
        }
        model_destroy(&mq);
        model_destroy(&mt);
    }
    for (int i = 0; i < n; i++) {
        twin_paths(dir, &cases[i], q, t, sizeof q);
        unlink(q);
        unlink(t);
    }
}

int main(void) {
    test_ref("stories260K", NULL);
    test_ref("tiny-llama", NULL);
    test_ref("tiny-qwen2", NULL);
    /* the real chat model: deploy/fetch-model.sh prints its cached path (downloading it once) */
    char smol[1024] = "";
    FILE *f = popen("bash deploy/fetch-model.sh 2>/dev/null", "r");
    if (f) {
        if (!fgets(smol, sizeof smol, f)) smol[0] = 0;
        pclose(f);
    }
    smol[strcspn(smol, "\n")] = 0;
    CHECK(smol[0] != 0, "deploy/fetch-model.sh gave no model path");
    if (smol[0]) test_ref("SmolLM2-135M-Instruct.Q4_1", smol);
    char dir[] = "/tmp/zllm-twin-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    static const twin_case cases[] = { { "q4_k_m", "llama" }, { "q8_0", "llama" }, { "q4_1", "llama" },
                                       { "q4_0", "llama" }, { "q5_0", "llama" }, { "q5_1", "llama" },
                                       { "q5_k", "llama" }, { "q6_k", "llama" }, { "f16", "llama" },
                                       { "bf16", "llama" }, { "q4_k_m", "qwen2" } };
    test_twins(dir, cases, (int)(sizeof cases / sizeof cases[0]));
    rmdir(dir);
    return test_report();
}
