/* tools/main_zllm-grammarbench.c: the grammar engine's costs (docs/structured-output.md): compiling a schema,
 * regex or grammar (cold, then through the cache), and the allowed-token mask per decoding step over a model's
 * vocabulary, along random walks that pick allowed tokens.
 *
 *     zllm-grammarbench -m MODEL.gguf [--kind json_schema|json_object|regex|grammar] [--walks N] [--steps N]
 *                       [--serve N [--requests N]] [--no-cache | --cache-mib N] (TEXT | -f FILE)
 * Without TEXT or -f a built-in typical schema (about 1 KB) is used. --serve simulates N sequences generating
 * under the grammar at once (a step masks each of them, then each takes a random allowed token; a finished
 * sequence makes room for the next request), so the grammar's remembered masks are shared as in serving; the
 * accepts of the picked tokens are timed too.
 * Prints one line per measurement. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gguf.h"
#include "grammar.h"
#include "slurp.h"
#include "tokenizer.h"
#include "version.h"

static const char s_default[] =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"name\":{\"type\":"
    "\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":0},\"email\":{\"type\":\"string\","
    "\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},"
    "\"maxItems\":5},\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{"
    "\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},\"country\":{\"enum\":[\"FR\","
    "\"DE\",\"IT\",\"ES\"]}},\"required\":[\"street\",\"city\",\"country\"],\"additionalProperties\":false},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"active\":{\"type\":\"boolean\"},\"score\":{\"type\":"
    "\"number\"},\"manager\":{\"anyOf\":[{\"$ref\":\"#/$defs/person\"},{\"type\":\"null\"}]}},\"required\":["
    "\"id\",\"name\",\"role\",\"active\"],\"additionalProperties\":false,\"$defs\":{\"person\":{\"type\":"
    "\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"id\":{\"type\":\"integer\"}},\"required\":["
    "\"name\"],\"additionalProperties\":false}}}";

static double s_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t s_rng = 0x9E3779B97F4A7C15ULL;
static uint32_t s_rand(void) {
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 16);
}

/* serve sequences at once over requests requests of up to steps tokens: each step masks every live sequence,
 * then each takes a random allowed token; prints the masks' cost per mask and per step, the hit rate, and the
 * accepts' cost per token and per step */
static int s_serve(zg_grammar *gr, const zg_vocab *v, int serve, int requests, int steps) {
    char err[256];
    int nv = grammar_vocab_size(v), rc = 1;
    size_t words = ((size_t)nv + 31) / 32;
    zg_matcher **m = calloc((size_t)serve, sizeof *m);
    int *len = calloc((size_t)serve, sizeof *len);
    uint32_t *mask = malloc(words * sizeof *mask);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    uint64_t h0 = 0, m0 = 0, h1 = 0, m1 = 0;
    grammar_mask_cache_stats(gr, &h0, &m0, NULL);
    double total = 0, worst = 0, worst_step = 0, acc = 0, acc_worst = 0;
    long n_masks = 0, n_steps = 0;
    int started = 0, live = 0;
    if (!m || !len || !mask || !allowed) goto done;
    for (;;) {
        for (int i = 0; i < serve; i++) /* admit requests into free slots */
            if (!m[i] && started < requests) {
                m[i] = grammar_matcher_new(gr, err, sizeof err);
                if (!m[i]) goto done;
                len[i] = 0;
                started++;
                live++;
            }
        if (live == 0) break;
        double step = 0;
        for (int i = 0; i < serve; i++) {
            if (!m[i]) continue;
            double a = s_ms();
            int n = grammar_matcher_mask(m[i], v, mask);
            double d = s_ms() - a;
            step += d;
            worst = d > worst ? d : worst;
            n_masks++;
            int k = 0;
            for (int t = 0; n > 0 && t < nv; t++)
                if (mask[t >> 5] >> (t & 31) & 1) allowed[k++] = t;
            const int32_t pick = k ? allowed[s_rand() % (uint32_t)k] : -1;
            a = s_ms();
            const int refused = k == 0 || grammar_matcher_accept_token(m[i], v, pick) != 0;
            d = s_ms() - a;
            acc += d;
            acc_worst = d > acc_worst ? d : acc_worst;
            if (refused || !grammar_matcher_can_continue(m[i]) || ++len[i] >= steps) {
                grammar_matcher_destroy(&m[i]);
                live--;
            }
        }
        total += step;
        worst_step = step > worst_step ? step : worst_step;
        n_steps++;
    }
    grammar_mask_cache_stats(gr, &h1, &m1, NULL);
    uint64_t hits = h1 - h0, misses = m1 - m0;
    printf("serve %d at once, %d requests: %.3f ms mean, %.3f ms worst per mask; %.3f ms mean, %.3f ms worst of "
           "masks per step (one thread); %.1f%% remembered (%ld masks)\n",
           serve, requests, n_masks ? total / (double)n_masks : 0.0, worst, n_steps ? total / (double)n_steps : 0.0,
           worst_step, hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 0.0, n_masks);
    printf("accepting the sampled tokens: %.3f ms mean, %.3f ms worst per token; %.3f ms mean per step (one thread)\n",
           n_masks ? acc / (double)n_masks : 0.0, acc_worst, n_steps ? acc / (double)n_steps : 0.0);
    rc = 0;
done:
    for (int i = 0; m && i < serve; i++) grammar_matcher_destroy(&m[i]);
    free(m);
    free(len);
    free(mask);
    free(allowed);
    return rc;
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-grammarbench -m MODEL.gguf [--kind K] [--walks N] [--steps N] [--serve N [--requests N]]\n"
               "                         [--no-cache | --cache-mib N] [TEXT | -f FILE]\n"
               "  the grammar engine's costs: compiling (cold and cached) and the token mask per step along random\n"
               "  walks over the model's vocabulary (docs/structured-output.md)\n"
               "  -m MODEL.gguf     the model whose vocabulary the masks cover (required)\n"
               "  --kind K          json_schema (default), json_object, regex or grammar\n"
               "  --walks N         random walks (default 4)\n"
               "  --steps N         most tokens per walk or request (default 64)\n"
               "  --serve N         then N sequences at once over --requests requests (default 0: none)\n"
               "  --requests N      requests of --serve (default 512)\n"
               "  --no-cache        no remembered masks: every mask walks the vocabulary\n"
               "  --cache-mib N     the grammar remembers masks up to N MiB (default 32)\n"
               "  -f FILE           the schema, regex or grammar text from FILE (default: TEXT, else a built-in\n"
               "                    1 KB schema)\n"
               "  -h, --help        this text;  --version  print the version\n"
               "Environment: none read.\n"
               "Exit status 1 on any error, 2 on a usage error.\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    int kind = ZG_JSON_SCHEMA, walks = 4, steps = 64, serve = 0, requests = 512, no_cache = 0, cache_mib = -1, rc = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("zllm-grammarbench %s\n", ZLLM_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--kind") && i + 1 < argc) kind = grammar_kind_parse(argv[++i]);
        else if (!strcmp(argv[i], "--walks") && i + 1 < argc) walks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--serve") && i + 1 < argc) serve = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-cache")) no_cache = 1;
        else if (!strcmp(argv[i], "--cache-mib") && i + 1 < argc) cache_mib = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !text) text = argv[i];
        else {
            s_usage(stderr);
            return 2;
        }
    }
    if (kind < 0 || !model || walks < 0 || steps < 1 || serve < 0 || serve > 4096 || requests < 0 || cache_mib > 4096) {
        fprintf(stderr, "zllm-grammarbench: needs -m MODEL and a known --kind\n");
        return 2;
    }
    char err[256], *buf = NULL;
    size_t len = 0;
    if (file) {
        FILE *f = fopen(file, "rb");
        buf = f ? slurp_stream(f, &len) : NULL;
        if (f) fclose(f);
        if (!buf) {
            fprintf(stderr, "zllm-grammarbench: cannot read %s\n", file);
            return 1;
        }
        text = buf;
    } else if (!text) text = s_default;
    if (!file) len = strlen(text);
    gguf *g = gguf_open(model, err, sizeof err);
    zl_tokenizer *t = g ? tokenizer_new(g, err, sizeof err) : NULL;
    zg_vocab *v = t ? grammar_vocab_from_tokenizer(t, err, sizeof err) : NULL;
    zg_cache *c = grammar_cache_new(8);
    zg_grammar *gr = NULL, *again = NULL;
    uint32_t *mask = NULL;
    if (!v || !c) {
        fprintf(stderr, "zllm-grammarbench: %s\n", c ? err : "out of memory");
        goto done;
    }
    double t0 = s_ms();
    gr = grammar_cache_get(c, kind, text, len, err, sizeof err);
    double t1 = s_ms();
    if (!gr) {
        fprintf(stderr, "zllm-grammarbench: %s\n", err);
        goto done;
    }
    again = grammar_cache_get(c, kind, text, len, err, sizeof err);
    double t2 = s_ms();
    printf("compile %s (%zu bytes, %d rules): %.3f ms; cached: %.4f ms\n", grammar_kind_name(kind), len,
           grammar_rules(gr), t1 - t0, t2 - t1);
    if (no_cache) grammar_mask_cache_limit(gr, 0);
    else if (cache_mib >= 0) grammar_mask_cache_limit(gr, (size_t)cache_mib << 20);
    int nv = grammar_vocab_size(v);
    mask = malloc(((size_t)nv + 31) / 32 * sizeof *mask);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    if (!mask || !allowed) {
        free(allowed);
        goto done;
    }
    double mask_ms = 0, worst = 0;
    long n_masks = 0, n_allowed = 0, n_spent = 0;
    uint64_t work = 0, work_max = 0;
    for (int w = 0; w < walks; w++) {
        zg_matcher *m = grammar_matcher_new(gr, err, sizeof err);
        for (int s = 0; m && s < steps; s++) {
            double a = s_ms();
            int n = grammar_matcher_mask(m, v, mask);
            double d = s_ms() - a;
            mask_ms += d;
            worst = d > worst ? d : worst;
            n_masks++;
            n_allowed += n;
            work += grammar_matcher_work(m);
            work_max = grammar_matcher_work(m) > work_max ? grammar_matcher_work(m) : work_max;
            n_spent += grammar_matcher_spent(m);
            int k = 0;
            for (int i = 0; i < nv; i++)
                if (mask[i >> 5] >> (i & 31) & 1) allowed[k++] = i;
            if (k == 0 || grammar_matcher_accept_token(m, v, allowed[s_rand() % (uint32_t)k]) != 0 ||
                !grammar_matcher_can_continue(m))
                break;
        }
        grammar_matcher_destroy(&m);
    }
    free(allowed);
    uint64_t hits = 0, misses = 0;
    grammar_mask_cache_stats(gr, &hits, &misses, NULL);
    printf("mask over %d ids: %.3f ms mean, %.3f ms worst, %.0f ids allowed on average (%ld masks, %.1f%% "
           "remembered)\n",
           nv, n_masks ? mask_ms / (double)n_masks : 0.0, worst, n_masks ? (double)n_allowed / (double)n_masks : 0.0,
           n_masks, hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 0.0);
    printf("mask work (stacks expanded and stepped): %.0f mean, %llu worst; %ld walks went over their bound (the "
           "sequence ends there)\n",
           n_masks ? (double)work / (double)n_masks : 0.0, (unsigned long long)work_max, n_spent);
    rc = serve > 0 ? s_serve(gr, v, serve, requests, steps) : 0;
done:
    free(mask);
    grammar_unref(&gr);
    grammar_unref(&again);
    grammar_cache_destroy(&c);
    grammar_vocab_destroy(&v);
    tokenizer_destroy(&t);
    gguf_close(&g);
    free(buf);
    return rc;
}
