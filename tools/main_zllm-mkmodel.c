/* tools/main_zllm-mkmodel.c: writes a synthetic Llama-family GGUF (random weights, fixed seed) with the shapes,
 * metadata and tensor names llama.cpp uses, in any weight type zllm reads. For tests and benchmarks of every
 * size up to Llama-3.1-8B: tensors are generated in chunks of rows by a pool of threads and pwrite()n at their
 * precomputed offsets, so memory stays at a few MiB per thread whatever the model size.
 *
 * Determinism: each chunk's generator is seeded from (seed, tensor index, first row), so the file depends on
 * the arguments only, not on the thread count. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"
#include "version.h"

typedef struct {
    const char *name;   /* preset name */
    const char *arch;   /* "llama", "qwen2", "qwen3" or "phi3" */
    int layers;         /* transformer blocks */
    int dim;            /* embedding width */
    int heads;          /* query heads */
    int kv_heads;       /* key/value heads */
    int head_dim;       /* per-head width */
    int ffn;            /* SwiGLU hidden width */
    int vocab;          /* vocabulary size */
    int ctx;            /* context length */
    double rope_base;   /* RoPE theta */
    double rms_eps;     /* RMSNorm epsilon */
    int tied;           /* 1: no output.weight */
} s_cfg;

static const s_cfg s_presets[] = {
    {"tiny-llama", "llama", 3, 64, 8, 2, 16, 160, 384, 512, 10000.0, 1e-5, 0},
    {"tiny-qwen2", "qwen2", 3, 64, 8, 2, 16, 160, 384, 512, 1000000.0, 1e-6, 1},
    {"tiny-qwen3", "qwen3", 3, 64, 8, 2, 16, 160, 384, 512, 1000000.0, 1e-6, 1},
    {"tiny-phi3", "phi3", 3, 64, 8, 2, 16, 160, 384, 512, 10000.0, 1e-5, 0},
    {"llama-3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0, 1e-5, 0},
    {"llama-3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0, 1e-5, 1},
    {"qwen2.5-1.5b", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 1000000.0, 1e-6, 1},
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0, 1e-5, 1},
};

/* --type names, their element type (Q4_K for q4_k_m) and llama.cpp's general.file_type */
static const struct {
    const char *name;
    ggml_type type;
    int ftype;
} s_types[] = {
    {"f32", GGML_F32, 0},   {"f16", GGML_F16, 1},   {"bf16", GGML_BF16, 32}, {"q8_0", GGML_Q8_0, 7},
    {"q4_0", GGML_Q4_0, 2}, {"q4_1", GGML_Q4_1, 3}, {"q5_0", GGML_Q5_0, 8},  {"q5_1", GGML_Q5_1, 9},
    {"q4_k", GGML_Q4_K, 14}, {"q5_k", GGML_Q5_K, 16}, {"q6_k", GGML_Q6_K, 18}, {"q4_k_m", GGML_Q4_K, 15},
};

typedef enum { K_MATRIX, K_NORM, K_BIAS } s_kind;

typedef struct {
    int idx;            /* index in the writer */
    s_kind kind;        /* how values are drawn */
    int64_t n_in;       /* ne[0] */
    int64_t n_rows;     /* ne[1] (1 for vectors) */
    ggml_type type;     /* storage type */
    size_t row_bytes;   /* bytes per row */
} s_tensor;

typedef struct {
    int t;              /* tensor (index in s_tensor array) */
    int64_t r0, r1;     /* rows [r0, r1) */
} s_job;

typedef struct {
    gguf_writer *w;            /* output */
    s_tensor *tensors;         /* [n_tensors] */
    s_job *jobs;               /* [n_jobs] */
    int n_jobs;                /* job count */
    uint64_t seed;             /* --seed */
    int64_t max_chunk;         /* elements per job at most (buffer size) */
    atomic_int next;           /* next job to take */
    atomic_ullong done_bytes;  /* tensor bytes written */
    atomic_int failed;         /* set on the first error */
    char err[256];             /* that error */
    pthread_mutex_t err_mu;    /* guards err */
} s_pool;

static uint64_t s_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n values uniform in [center - a, center + a) */
static void s_fill(float *x, int64_t n, uint64_t *rng, float center, float a) {
    const float k = 0x1p-24f * 2.0f * a;
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t r = s_splitmix(rng);
        x[i] = center - a + (float)(r & 0xffffff) * k;
        x[i + 1] = center - a + (float)((r >> 32) & 0xffffff) * k;
    }
    if (i < n) x[i] = center - a + (float)(s_splitmix(rng) & 0xffffff) * k;
}

static void s_pool_fail(s_pool *p, const char *msg) {
    pthread_mutex_lock(&p->err_mu);
    if (!atomic_load(&p->failed)) snprintf(p->err, sizeof p->err, "%s", msg);
    atomic_store(&p->failed, 1);
    pthread_mutex_unlock(&p->err_mu);
}

static void *s_worker(void *arg) {
    s_pool *p = arg;
    size_t max_qbytes = (size_t)p->max_chunk * 4;   /* no type is wider than f32 */
    float *f = malloc((size_t)p->max_chunk * sizeof *f);
    uint8_t *q = malloc(max_qbytes);
    if (!f || !q) {
        s_pool_fail(p, "out of memory");
        goto out;
    }
    for (;;) {
        int j = atomic_fetch_add(&p->next, 1);
        if (j >= p->n_jobs || atomic_load(&p->failed)) break;
        const s_job *jb = &p->jobs[j];
        const s_tensor *t = &p->tensors[jb->t];
        int64_t n = (jb->r1 - jb->r0) * t->n_in;
        uint64_t rng = p->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(jb->t + 1)) ^
                       (0xd1b54a32d192ed03ull * (uint64_t)(jb->r0 + 1));
        s_splitmix(&rng);
        switch (t->kind) {
        case K_MATRIX: s_fill(f, n, &rng, 0.0f, sqrtf(3.0f / (float)t->n_in)); break;   /* std 1/sqrt(n_in) */
        case K_NORM: s_fill(f, n, &rng, 1.0f, 0.1f); break;
        case K_BIAS: s_fill(f, n, &rng, 0.0f, 0.02f); break;
        }
        for (int64_t r = 0; r < jb->r1 - jb->r0; r++)
            if (quant_quantize_row(t->type, f + r * t->n_in, q + (size_t)r * t->row_bytes, t->n_in) != 0) {
                s_pool_fail(p, "quantization failed");
                goto out;
            }
        char err[256];
        uint64_t nb = (uint64_t)(jb->r1 - jb->r0) * t->row_bytes;
        if (gguf_writer_write_at(p->w, t->idx, (uint64_t)jb->r0 * t->row_bytes, q, nb, err, sizeof err) != 0) {
            s_pool_fail(p, err);
            goto out;
        }
        atomic_fetch_add(&p->done_bytes, nb);
    }
out:
    free(f);
    free(q);
    return NULL;
}

static void s_usage(FILE *o) {
    fprintf(o,
            "usage: zllm-mkmodel -o OUT.gguf [--preset NAME] [--arch llama|qwen2|qwen3|phi3] [--layers N] [--dim N]\n"
            "         [--heads N] [--kv-heads N] [--head-dim N] [--ffn N] [--vocab N] [--ctx N] [--rope-base F]\n"
            "         [--rms-eps F] [--type T] [--tied | --untied] [--seed S] [--threads N] [--vocab-from F.gguf]\n"
            "         [--rope-freqs] [--longrope]\n"
            "presets: tiny-llama tiny-qwen2 tiny-qwen3 tiny-phi3 llama-3.1-8b llama-3.2-1b qwen2.5-1.5b smollm2-135m\n"
            "         (default tiny-llama)\n"
            "types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m (default f32)\n"
            "Explicit shape options override the preset's values. Matrices whose row length does not fit the\n"
            "type's block fall back as llama.cpp does (q4_k->q5_0, q5_k->q5_1, q6_k->q8_0, then f16).\n"
            "Defaults: the shape, --arch, --rope-base, --rms-eps and --tied/--untied come from the preset;\n"
            "--seed 1234; --threads: all cores (at most 256); --vocab-from: the synthetic byte-level vocabulary.\n"
            "Architectures as llama.cpp writes them: qwen3 adds per-head attn_q_norm/attn_k_norm, phi3 fuses\n"
            "attn_qkv and gate/up (ffn_up). --rope-freqs adds llama3 RoPE frequency factors (rope_freqs.weight);\n"
            "--longrope adds LongRoPE factors (rope_factors_long/short.weight, original context ctx/4, its\n"
            "attention factor). Factors are random values around 1 (K_NORM's fill), all positive.\n"
            "       zllm-mkmodel --help | --version\n"
            "Environment: none read.\n");
}

/* llama.cpp's use_more_bits(): which layers' attn_v / ffn_down get Q6_K in Q4_K_M */
static int s_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static ggml_type s_fit(ggml_type t, int64_t n_in, const char *name) {
    ggml_type want = t;
    for (;;) {
        if (n_in % ggml_type_block(t) == 0) break;
        if (t == GGML_Q4_K) t = GGML_Q5_0;
        else if (t == GGML_Q5_K) t = GGML_Q5_1;
        else if (t == GGML_Q6_K) t = GGML_Q8_0;
        else t = GGML_F16;
    }
    static int s_noted[GGML_TYPE_COUNT];   /* one message per wanted type (main thread only) */
    if (t != want && !s_noted[want]) {
        s_noted[want] = 1;
        fprintf(stderr, "zllm-mkmodel: %s: row length %lld does not fit %s, using %s (and likewise for others)\n",
                name, (long long)n_in, ggml_type_name(want), ggml_type_name(t));
    }
    return t;
}

/* the synthetic byte-level SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens <0xXX>,
 * "\u2581" (the SentencePiece space), printable ASCII, then control fillers <|extra_N|>. Needs vocab >= 259. */
static int s_write_vocab(gguf_writer *w, int vocab) {
    char **tok = calloc((size_t)vocab, sizeof *tok);
    float *score = calloc((size_t)vocab, sizeof *score);
    int32_t *type = calloc((size_t)vocab, sizeof *type);
    int rc = -1;
    if (!tok || !score || !type) goto out;
    for (int i = 0; i < vocab; i++) {
        char buf[32];
        if (i == 0) snprintf(buf, sizeof buf, "<unk>"), type[i] = 2;
        else if (i == 1) snprintf(buf, sizeof buf, "<s>"), type[i] = 3;
        else if (i == 2) snprintf(buf, sizeof buf, "</s>"), type[i] = 3;
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3), type[i] = 6;
        else if (i == 259) snprintf(buf, sizeof buf, "\xe2\x96\x81"), type[i] = 1;
        else if (i < 260 + 94) snprintf(buf, sizeof buf, "%c", (char)(0x21 + i - 260)), type[i] = 1;
        else snprintf(buf, sizeof buf, "<|extra_%d|>", i), type[i] = 3;
        score[i] = type[i] == 1 ? -(float)i : 0.0f;
        if (!(tok[i] = strdup(buf))) goto out;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (uint64_t)vocab);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, score, (uint64_t)vocab);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, type, (uint64_t)vocab);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 0);
    rc = 0;
out:
    if (tok)
        for (int i = 0; i < vocab; i++) free(tok[i]);
    free(tok);
    free(score);
    free(type);
    return rc;
}

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* integer option value; exits with usage on a bad number (this is a program, not library code) */
static long long s_int_arg(const char *opt, const char *v) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == 0 || *end != 0 || x < 0) {
        fprintf(stderr, "zllm-mkmodel: bad value for %s: %s\n", opt, v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv) {
    const char *out = NULL, *preset = "tiny-llama", *arch = NULL, *type_name = "f32", *vocab_from = NULL;
    long long ov[9];   /* layers dim heads kv_heads head_dim ffn vocab ctx threads; -1 = unset */
    for (int i = 0; i < 9; i++) ov[i] = -1;
    static const char *int_opts[9] = {"--layers", "--dim",   "--heads", "--kv-heads", "--head-dim",
                                      "--ffn",    "--vocab", "--ctx",   "--threads"};
    double rope_base = -1, rms_eps = -1;
    int tied = -1, rope_freqs = 0, longrope = 0;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_v = i + 1 < argc;
        int matched = 0;
        for (int k = 0; k < 9; k++)
            if (strcmp(a, int_opts[k]) == 0 && has_v) {
                ov[k] = s_int_arg(a, argv[++i]);
                matched = 1;
            }
        if (matched) continue;
        if (strcmp(a, "-o") == 0 && has_v) out = argv[++i];
        else if (strcmp(a, "--preset") == 0 && has_v) preset = argv[++i];
        else if (strcmp(a, "--arch") == 0 && has_v) arch = argv[++i];
        else if (strcmp(a, "--type") == 0 && has_v) type_name = argv[++i];
        else if (strcmp(a, "--vocab-from") == 0 && has_v) vocab_from = argv[++i];
        else if (strcmp(a, "--rope-base") == 0 && has_v) rope_base = atof(argv[++i]);
        else if (strcmp(a, "--rms-eps") == 0 && has_v) rms_eps = atof(argv[++i]);
        else if (strcmp(a, "--seed") == 0 && has_v) seed = (uint64_t)s_int_arg(a, argv[++i]);
        else if (strcmp(a, "--tied") == 0) tied = 1;
        else if (strcmp(a, "--untied") == 0) tied = 0;
        else if (strcmp(a, "--rope-freqs") == 0) rope_freqs = 1;
        else if (strcmp(a, "--longrope") == 0) longrope = 1;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            s_usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("zllm-mkmodel %s\n", ZLLM_VERSION);
            return 0;
        } else {
            fprintf(stderr, "zllm-mkmodel: unknown or incomplete option %s\n", a);
            s_usage(stderr);
            return 2;
        }
    }
    if (!out) {
        s_usage(stderr);
        return 2;
    }
    s_cfg c;
    int found = 0;
    for (size_t i = 0; i < sizeof s_presets / sizeof s_presets[0]; i++)
        if (strcmp(s_presets[i].name, preset) == 0) {
            c = s_presets[i];
            found = 1;
        }
    if (!found) {
        fprintf(stderr, "zllm-mkmodel: unknown preset %s\n", preset);
        return 2;
    }
    int *fields[8] = {&c.layers, &c.dim, &c.heads, &c.kv_heads, &c.head_dim, &c.ffn, &c.vocab, &c.ctx};
    for (int k = 0; k < 8; k++)
        if (ov[k] >= 0) {
            if (ov[k] == 0 || ov[k] > (1 << 30)) {
                fprintf(stderr, "zllm-mkmodel: %s out of range\n", int_opts[k]);
                return 2;
            }
            *fields[k] = (int)ov[k];
        }
    int threads = ov[8] > 0 ? (int)ov[8] : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (arch) c.arch = arch;
    if (strcmp(c.arch, "llama") != 0 && strcmp(c.arch, "qwen2") != 0 && strcmp(c.arch, "qwen3") != 0 &&
        strcmp(c.arch, "phi3") != 0) {
        fprintf(stderr, "zllm-mkmodel: unknown arch %s (llama, qwen2, qwen3, phi3)\n", c.arch);
        return 2;
    }
    if (rope_base > 0) c.rope_base = rope_base;
    if (rms_eps > 0) c.rms_eps = rms_eps;
    if (tied >= 0) c.tied = tied;
    if (c.heads % c.kv_heads != 0) {
        fprintf(stderr, "zllm-mkmodel: heads %d not a multiple of kv-heads %d\n", c.heads, c.kv_heads);
        return 2;
    }
    int ti = -1;
    for (size_t i = 0; i < sizeof s_types / sizeof s_types[0]; i++)
        if (strcmp(s_types[i].name, type_name) == 0) ti = (int)i;
    if (ti < 0) {
        fprintf(stderr, "zllm-mkmodel: unknown type %s\n", type_name);
        return 2;
    }
    int is_q4km = strcmp(type_name, "q4_k_m") == 0;
    ggml_type wtype = s_types[ti].type;
    int bias = strcmp(c.arch, "qwen2") == 0, qk_norm = strcmp(c.arch, "qwen3") == 0, phi3 = strcmp(c.arch, "phi3") == 0;
    if (rope_freqs && longrope) {
        fprintf(stderr, "zllm-mkmodel: --rope-freqs and --longrope exclude each other\n");
        return 2;
    }

    int rc = 1;
    char err[512];
    gguf_writer *w = NULL;
    gguf *vf = NULL;
    s_tensor *ts = NULL;
    s_job *jobs = NULL;
    pthread_t *tids = NULL;
    int n_started = 0, opened = 0;
    s_pool pool;
    memset(&pool, 0, sizeof pool);
    pthread_mutex_init(&pool.err_mu, NULL);

    if (vocab_from) {
        vf = gguf_open(vocab_from, err, sizeof err);
        if (!vf) {
            fprintf(stderr, "zllm-mkmodel: %s\n", err);
            goto fail;
        }
        const gguf_value *toks = gguf_get(vf, "tokenizer.ggml.tokens");
        if (!toks || toks->type != GGUF_T_ARRAY || toks->v.arr.elem != GGUF_T_STRING || toks->v.arr.n == 0 ||
            toks->v.arr.n > (1u << 30)) {
            fprintf(stderr, "zllm-mkmodel: %s: no tokenizer.ggml.tokens array of strings\n", vocab_from);
            goto fail;
        }
        c.vocab = (int)toks->v.arr.n;
    }

    w = gguf_writer_new();
    if (!w) {
        fprintf(stderr, "zllm-mkmodel: out of memory\n");
        goto fail;
    }
    char key[128], name[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, c.arch), key)
    gguf_writer_set_str(w, "general.architecture", c.arch);
    snprintf(name, sizeof name, "zllm synthetic %s %s", preset, type_name);
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)s_types[ti].ftype);
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    gguf_writer_set_u32(w, "general.alignment", 32);
    gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c.layers);
    gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c.ctx);
    gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c.dim);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c.ffn);
    gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c.heads);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c.kv_heads);
    gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c.head_dim);
    gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c.head_dim);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)c.rope_base);
    gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c.head_dim);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)c.rms_eps);
    gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c.vocab);
    if (longrope) { /* phi3-style: long factors beyond the original context, and LongRoPE's attention factor */
        const int orig = c.ctx / 4 > 0 ? c.ctx / 4 : 1;
        gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)orig);
        if (orig > 1)
            gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), (float)sqrt(1.0 + log(4.0) / log((double)orig)));
    }
#undef KEY
    if (vf) {
        for (uint64_t i = 0; i < vf->n_kv; i++) {
            gguf_str k = vf->kv[i].key;
            if (k.len < 10 || k.len >= sizeof key || memcmp(k.ptr, "tokenizer.", 10) != 0) continue;
            memcpy(key, k.ptr, k.len);
            key[k.len] = 0;
            gguf_writer_set_value(w, key, &vf->kv[i].val);
        }
        gguf_close(&vf);
    } else if (c.vocab >= 259) {
        if (s_write_vocab(w, c.vocab) != 0) {
            fprintf(stderr, "zllm-mkmodel: out of memory\n");
            goto fail;
        }
    } else {
        fprintf(stderr, "zllm-mkmodel: vocab %d < 259: no tokenizer written\n", c.vocab);
    }

    /* tensors, in llama.cpp's usual order */
    int max_t = 5 + c.layers * 14, n_t = 0;
    ts = calloc((size_t)max_t, sizeof *ts);
    if (!ts) goto fail;
    int64_t qdim = (int64_t)c.heads * c.head_dim, kvdim = (int64_t)c.kv_heads * c.head_dim;
#define ADD(nm, kind_, nin, nrows, type_)                                                                  \
    do {                                                                                                   \
        s_tensor *t_ = &ts[n_t];                                                                           \
        t_->kind = (kind_);                                                                                \
        t_->n_in = (nin);                                                                                  \
        t_->n_rows = (nrows);                                                                              \
        t_->type = (kind_) == K_MATRIX ? s_fit((type_), t_->n_in, (nm)) : GGML_F32;                        \
        t_->row_bytes = ggml_row_bytes(t_->type, t_->n_in);                                                \
        int64_t ne_[2] = {t_->n_in, t_->n_rows};                                                           \
        t_->idx = gguf_writer_add_tensor(w, (nm), (kind_) == K_MATRIX ? 2 : 1, ne_, t_->type);             \
        n_t++;                                                                                             \
    } while (0)
    ggml_type out_type = is_q4km ? GGML_Q6_K : wtype;
    /* llama.cpp gives the token embedding the output's type when it doubles as the LM head */
    ADD("token_embd.weight", K_MATRIX, c.dim, c.vocab, c.tied ? out_type : wtype);
    for (int l = 0; l < c.layers; l++) {
        char nm[96];
        ggml_type more = is_q4km && s_more_bits(l, c.layers) ? GGML_Q6_K : wtype;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), nm)
        ADD(BLK("attn_norm.weight"), K_NORM, c.dim, 1, GGML_F32);
        if (phi3) { /* q, k, v rows in one matrix */
            ADD(BLK("attn_qkv.weight"), K_MATRIX, c.dim, qdim + 2 * kvdim, more);
        } else {
            ADD(BLK("attn_q.weight"), K_MATRIX, c.dim, qdim, wtype);
            ADD(BLK("attn_k.weight"), K_MATRIX, c.dim, kvdim, wtype);
            ADD(BLK("attn_v.weight"), K_MATRIX, c.dim, kvdim, more);
        }
        if (qk_norm) {
            ADD(BLK("attn_q_norm.weight"), K_NORM, c.head_dim, 1, GGML_F32);
            ADD(BLK("attn_k_norm.weight"), K_NORM, c.head_dim, 1, GGML_F32);
        }
        if (bias) {
            ADD(BLK("attn_q.bias"), K_BIAS, qdim, 1, GGML_F32);
            ADD(BLK("attn_k.bias"), K_BIAS, kvdim, 1, GGML_F32);
            ADD(BLK("attn_v.bias"), K_BIAS, kvdim, 1, GGML_F32);
        }
        ADD(BLK("attn_output.weight"), K_MATRIX, qdim, c.dim, wtype);
        ADD(BLK("ffn_norm.weight"), K_NORM, c.dim, 1, GGML_F32);
        if (phi3) { /* gate rows, then up rows */
            ADD(BLK("ffn_up.weight"), K_MATRIX, c.dim, 2 * (int64_t)c.ffn, wtype);
        } else {
            ADD(BLK("ffn_gate.weight"), K_MATRIX, c.dim, c.ffn, wtype);
            ADD(BLK("ffn_up.weight"), K_MATRIX, c.dim, c.ffn, wtype);
        }
        ADD(BLK("ffn_down.weight"), K_MATRIX, c.ffn, c.dim, more);
#undef BLK
    }
    ADD("output_norm.weight", K_NORM, c.dim, 1, GGML_F32);
    if (!c.tied) ADD("output.weight", K_MATRIX, c.dim, c.vocab, out_type);
    if (rope_freqs) ADD("rope_freqs.weight", K_NORM, c.head_dim / 2, 1, GGML_F32);
    if (longrope) {
        ADD("rope_factors_long.weight", K_NORM, c.head_dim / 2, 1, GGML_F32);
        ADD("rope_factors_short.weight", K_NORM, c.head_dim / 2, 1, GGML_F32);
    }
#undef ADD

    if (gguf_writer_open(w, out, err, sizeof err) != 0) {
        fprintf(stderr, "zllm-mkmodel: %s\n", err);
        goto fail;
    }
    opened = 1;

    /* jobs of about 1M elements (whole rows) */
    const int64_t chunk = 1 << 20;
    int64_t max_in = 0, n_jobs = 0;
    for (int i = 0; i < n_t; i++) {
        if (ts[i].n_in > max_in) max_in = ts[i].n_in;
        int64_t rows = chunk / ts[i].n_in > 0 ? chunk / ts[i].n_in : 1;
        n_jobs += (ts[i].n_rows + rows - 1) / rows;
    }
    jobs = calloc((size_t)n_jobs, sizeof *jobs);
    if (!jobs) goto fail;
    int64_t k = 0;
    for (int i = 0; i < n_t; i++) {
        int64_t rows = chunk / ts[i].n_in > 0 ? chunk / ts[i].n_in : 1;
        for (int64_t r = 0; r < ts[i].n_rows; r += rows)
            jobs[k++] = (s_job){i, r, r + rows < ts[i].n_rows ? r + rows : ts[i].n_rows};
    }
    pool.w = w;
    pool.tensors = ts;
    pool.jobs = jobs;
    pool.n_jobs = (int)n_jobs;
    pool.seed = seed;
    pool.max_chunk = chunk > max_in ? chunk : max_in;
    uint64_t total = gguf_writer_file_size(w);
    fprintf(stderr, "zllm-mkmodel: %s: %s %s, %d layers, dim %d, ffn %d, vocab %d, %d tensors, %.2f GiB, %d threads\n",
            out, c.arch, type_name, c.layers, c.dim, c.ffn, c.vocab, n_t, (double)total / (1 << 30), threads);
    double t0 = s_now();
    tids = calloc((size_t)threads, sizeof *tids);
    if (!tids) goto fail;
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&tids[i], NULL, s_worker, &pool) != 0) {
            s_pool_fail(&pool, "cannot start threads");
            break;
        }
        n_started++;
    }
    int tty = isatty(2);
    double last = t0;
    while (atomic_load(&pool.next) < pool.n_jobs + n_started && !atomic_load(&pool.failed) && n_started > 0) {
        usleep(50000);
        double now = s_now();
        if (now - last >= (tty ? 0.5 : 5.0)) {
            last = now;
            double done = (double)atomic_load(&pool.done_bytes);
            fprintf(stderr, "%szllm-mkmodel: %.2f / %.2f GiB (%.0f%%), %.0f MiB/s%s", tty ? "\r" : "",
                    done / (1 << 30), (double)total / (1 << 30), 100.0 * done / (double)total,
                    done / (1 << 20) / (now - t0), tty ? "" : "\n");
        }
    }
    for (int i = 0; i < n_started; i++) pthread_join(tids[i], NULL);
    if (tty) fputc('\n', stderr);
    if (atomic_load(&pool.failed)) {
        fprintf(stderr, "zllm-mkmodel: %s\n", pool.err);
        goto fail;
    }
    if (gguf_writer_close(w, err, sizeof err) != 0) {
        fprintf(stderr, "zllm-mkmodel: %s\n", err);
        goto fail;
    }
    double dt = s_now() - t0;
    fprintf(stderr, "zllm-mkmodel: wrote %s (%.2f GiB) in %.1f s\n", out, (double)total / (1 << 30), dt);
    rc = 0;
fail:
    if (rc != 0 && opened) unlink(out);
    gguf_close(&vf);
    gguf_writer_destroy(&w);
    free(ts);
    free(jobs);
    free(tids);
    pthread_mutex_destroy(&pool.err_mu);
    return rc;
}
