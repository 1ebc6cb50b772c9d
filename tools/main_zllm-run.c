/* tools/main_zllm-run.c: zllm-run, generation in one process (no broker): loads a GGUF model, encodes the
 * prompt, prefills it and decodes token by token on the chosen backend, streaming the text (or the ids).
 *
 *   zllm-run -m MODEL.gguf [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
 *            [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--ids] [--device cpu|cuda[:N]] [--threads N]
 *            [--chat] [--ctx N]
 *
 * An empty prompt means BOS alone. The prompt is encoded with special tokens parsed (and BOS as the vocabulary
 * asks); --chat renders it as one user message through the model's chat template. Generation stops at an
 * end-of-generation token (not printed) or after N tokens. Only the generated text is printed (the prompt is not
 * echoed; a continuation keeps its leading space), then one newline; statistics go to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"
#include "version.h"

typedef struct {
    const char *model;         /* -m */
    const char *prompt;        /* -p, "" when absent */
    int n_predict;             /* -n: most tokens to generate */
    zl_sampling samp;          /* sampling parameters */
    int seed_set;              /* 1 when --seed was given */
    int ids;                   /* --ids: print ids instead of text */
    const char *device;        /* --device */
    int threads;               /* --threads (CPU) */
    int chat;                  /* --chat: wrap the prompt as a user message */
    int n_ctx;                 /* --ctx: 0 = prompt + n, capped at the model's context */
} s_args;

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-run -m MODEL.gguf [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
               "                [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--ids] [--device cpu|cuda[:N]]\n"
               "                [--threads N] [--chat] [--ctx N]\n"
               "defaults: -n 128 --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05 --repeat-penalty 1 (off)\n"
               "          --repeat-last-n 64, --seed from the clock (printed), --device cpu; --temp 0 is greedy\n"
               "          -p \"\" (an empty prompt), --threads 0 (all cores), --ctx 0 (prompt + n, at most the\n"
               "          model's); --ids prints token ids, --chat wraps the prompt as a user message\n"
               "       zllm-run --help | --version\n"
               "Environment: ZLLM_CUDA_* (docs/cuda.md) with --device cuda:\n"
               "CUDA kernel choices and tuning knobs for measurements (docs/perf.md).\n");
}

static int s_num(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "zllm-run: bad value '%s' for %s (expected %g..%g)\n", v, opt, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int s_parse(int argc, char **argv, s_args *a) {
    memset(a, 0, sizeof *a);
    a->prompt = "";
    a->n_predict = 128;
    a->device = "cpu";
    a->samp = sampler_defaults();
    a->samp.temperature = 0.8f;
    a->samp.top_k = 40;
    a->samp.top_p = 0.95f;
    a->samp.min_p = 0.05f;
    a->samp.repeat_penalty = 1.0f;
    a->samp.repeat_last_n = 64;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
#define NUM(lo, hi) do { if (!v || s_num(o, v, lo, hi, &x)) return -1; i++; } while (0)
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            s_usage(stdout);
            exit(0);
        } else if (!strcmp(o, "--version")) {
            printf("zllm-run %s\n", ZLLM_VERSION);
            exit(0);
        } else if (!strcmp(o, "--ids")) a->ids = 1;
        else if (!strcmp(o, "--chat")) a->chat = 1;
        else if (!v) {
            fprintf(stderr, "zllm-run: unknown option or missing value: %s\n", o);
            return -1;
        } else if (!strcmp(o, "-m")) { a->model = v; i++; }
        else if (!strcmp(o, "-p")) { a->prompt = v; i++; }
        else if (!strcmp(o, "--device")) { a->device = v; i++; }
        else if (!strcmp(o, "-n")) { NUM(0, 1 << 24); a->n_predict = (int)x; }
        else if (!strcmp(o, "--temp")) { NUM(0, 1e6); a->samp.temperature = (float)x; }
        else if (!strcmp(o, "--top-k")) { NUM(0, 1 << 24); a->samp.top_k = (int)x; }
        else if (!strcmp(o, "--top-p")) { NUM(0, 1); a->samp.top_p = (float)x; }
        else if (!strcmp(o, "--min-p")) { NUM(0, 1); a->samp.min_p = (float)x; }
        else if (!strcmp(o, "--repeat-penalty")) { NUM(1e-3, 1e3); a->samp.repeat_penalty = (float)x; }
        else if (!strcmp(o, "--repeat-last-n")) { NUM(0, 1 << 24); a->samp.repeat_last_n = (int)x; }
        else if (!strcmp(o, "--seed")) { NUM(0, 1.8e19); a->samp.seed = (uint64_t)x; a->seed_set = 1; }
        else if (!strcmp(o, "--threads")) { NUM(0, 1024); a->threads = (int)x; }
        else if (!strcmp(o, "--ctx")) { NUM(0, 1 << 24); a->n_ctx = (int)x; }
        else {
            fprintf(stderr, "zllm-run: unknown option %s\n", o);
            return -1;
        }
#undef NUM
    }
    if (!a->model) {
        fprintf(stderr, "zllm-run: -m MODEL.gguf is required\n");
        return -1;
    }
    if (!a->seed_set) a->samp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return 0;
}

/* the prompt's ids in a malloc'd array (*n of them), or NULL with a message */
static int32_t *s_encode(const zl_tokenizer *tk, const s_args *a, int *n) {
    char err[256];
    char *text = NULL;
    const char *src = a->prompt;
    int add_bos = tokenizer_add_bos(tk);
    if (a->chat) {
        zl_chat_msg msg = {.role = "user", .content = a->prompt};
        text = chat_apply(tk, &msg, 1, 1, err, sizeof err);
        if (!text) {
            fprintf(stderr, "zllm-run: --chat: %s\n", err);
            return NULL;
        }
        src = text;
        add_bos = 0;   /* the template writes BOS where its family has one */
    }
    int32_t *ids = NULL;
    if (!*src) {   /* empty prompt: BOS alone */
        int bos = tokenizer_bos(tk);
        if (bos < 0) {
            fprintf(stderr, "zllm-run: empty prompt and the model has no BOS token\n");
            goto out;
        }
        ids = malloc(sizeof *ids);
        if (ids) ids[0] = bos;
        *n = 1;
        goto out;
    }
    int cnt = tokenizer_encode(tk, src, strlen(src), add_bos, 1, NULL, 0);
    if (cnt < 0) {
        fprintf(stderr, "zllm-run: cannot tokenize the prompt\n");
        goto out;
    }
    ids = malloc(sizeof *ids * (size_t)(cnt > 0 ? cnt : 1));
    if (!ids || tokenizer_encode(tk, src, strlen(src), add_bos, 1, ids, cnt) != cnt) {
        fprintf(stderr, "zllm-run: cannot tokenize the prompt\n");
        free(ids);
        ids = NULL;
        goto out;
    }
    if (cnt == 0) {
        fprintf(stderr, "zllm-run: the prompt encodes to no tokens\n");
        free(ids);
        ids = NULL;
        goto out;
    }
    *n = cnt;
out:
    free(text);
    return ids;
}

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    s_args a;
    if (s_parse(argc, argv, &a)) {
        s_usage(stderr);
        return 2;
    }
    char err[512];
    int rc = 1, n_prompt = 0, n_gen = 0;
    zl_model *m = NULL;
    zl_tokenizer *tk = NULL;
    zl_engine *e = NULL;
    int32_t *prompt = NULL, *hist = NULL;

    m = model_load(a.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "zllm-run: %s\n", err);
        goto fail;
    }
    tk = tokenizer_new(m->gguf, err, sizeof err);
    if (!tk) {
        fprintf(stderr, "zllm-run: %s\n", err);
        goto fail;
    }
    prompt = s_encode(tk, &a, &n_prompt);
    if (!prompt) goto fail;
    int n_ctx = a.n_ctx ? a.n_ctx : n_prompt + (a.n_predict > 0 ? a.n_predict : 1);
    if (!a.n_ctx && n_ctx > m->cfg.n_ctx) n_ctx = m->cfg.n_ctx;
    if (n_prompt > n_ctx) {
        fprintf(stderr, "zllm-run: prompt of %d tokens does not fit the context of %d\n", n_prompt, n_ctx);
        goto fail;
    }
    zl_engine_opts o = { .device = a.device, .n_slots = 1, .max_batch = 1, .n_ctx = n_ctx,
                         .max_step_tokens = n_prompt < 2048 ? n_prompt : 2048, .threads = a.threads };
    e = engine_new(m, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "zllm-run: %s\n", err);
        goto fail;
    }
    hist = malloc(sizeof *hist * (size_t)(n_ctx + 1));
    if (!hist) {
        fprintf(stderr, "zllm-run: out of memory\n");
        goto fail;
    }
    memcpy(hist, prompt, sizeof *hist * (size_t)n_prompt);
    uint64_t rng = sampler_rng_init(a.samp.seed);
    if (!a.seed_set && a.samp.temperature > 0)
        fprintf(stderr, "zllm-run: seed %llu\n", (unsigned long long)a.samp.seed);

    double t0 = s_now(), t_first = 0;
    int pos = 0, n_hist = n_prompt;
    zl_detok st;
    memset(&st, 0, sizeof st);
    /* the text continues a raw prompt: keep the first piece's leading space (SentencePiece strips it only at
     * the start of a text, as after BOS alone or at the start of a chat reply) */
    st.started = !a.chat && a.prompt[0] != 0;
    char out[512];
    while (n_gen < a.n_predict) {
        /* prefill the prompt in chunks of max_step_tokens; then one token per step */
        int nt = pos < n_prompt ? n_prompt - pos : 1;
        if (nt > e->max_step_tokens) nt = e->max_step_tokens;
        if (pos + nt > n_ctx) break;   /* context full */
        int last = pos + nt >= n_prompt;
        zl_seq s = { .slot = 0, .pos = pos, .n_tokens = nt, .tokens = hist + pos, .sample = last,
                     .samp = &a.samp, .history = hist, .n_history = n_hist, .rng = &rng };
        int32_t id;
        if (engine_step(e, &s, 1, &id, NULL) != 0) {
            fprintf(stderr, "zllm-run: %s\n", e->err);
            goto fail;
        }
        pos += nt;
        if (!last) continue;
        if (n_gen == 0) t_first = s_now();
        if (tokenizer_is_eog(tk, id)) break;
        hist[n_hist++] = id;
        n_gen++;
        if (a.ids) {
            printf(n_gen > 1 ? " %d" : "%d", (int)id);
        } else {
            int k = tokenizer_decode_stream(tk, &st, id, 0, out, sizeof out);
            if (k > 0) fwrite(out, 1, (size_t)k, stdout);
        }
        fflush(stdout);
    }
    if (!a.ids) {
        int k = tokenizer_decode_flush(tk, &st, out, sizeof out);
        if (k > 0) fwrite(out, 1, (size_t)k, stdout);
    }
    putchar('\n');
    fflush(stdout);
    double t1 = s_now();
    if (n_gen > 0)
        fprintf(stderr, "zllm-run: %s: prompt %d tokens in %.3f s, generated %d tokens in %.3f s (%.1f tok/s)\n",
                e->device, n_prompt, t_first - t0, n_gen, t1 - t_first,
                n_gen > 1 && t1 > t_first ? (n_gen - 1) / (t1 - t_first) : 0.0);
    rc = 0;
fail:
    free(hist);
    free(prompt);
    engine_destroy(&e);
    tokenizer_destroy(&tk);
    model_destroy(&m);
    return rc;
}
