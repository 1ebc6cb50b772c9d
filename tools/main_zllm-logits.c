/* tools/main_zllm-logits.c: zllm-logits, the logits of one prompt's last position, for reference checks in tests
 * (tests/test_logprobs.py computes logprobs and predicts penalized greedy tokens from them).
 *
 *   zllm-logits -m MODEL.gguf [--device cpu|cpu-ref|cuda[:N]] ID [ID ...]
 *
 * Prefills the token ids in one step and prints the vocabulary's logits after the last one, one per line ("%.9g":
 * every f32 exactly). Exit status 0, 1 on a load or engine error, 2 on bad arguments. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "model.h"
#include "version.h"

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-logits -m MODEL.gguf [--device cpu|cpu-ref|cuda[:N]] ID [ID ...]\n"
               "  prints the logits after the last id, one a line (default --device cpu-ref)\n"
               "       zllm-logits --help | --version\n"
               "Environment: ZLLM_CUDA_* and ZLLM_CPU_* (docs/cuda.md, docs/cpu.md) with their devices.\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *device = "cpu-ref";
    int32_t *ids = calloc((size_t)(argc > 1 ? argc : 1), sizeof *ids);
    int n = 0;
    for (int i = 1; i < argc && ids; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            s_usage(stdout);
            free(ids);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("zllm-logits %s\n", ZLLM_VERSION);
            free(ids);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else {
            char *end;
            errno = 0;
            long v = strtol(argv[i], &end, 10);
            if (errno || end == argv[i] || *end || v < 0 || v > 0x7fffffffL) {
                fprintf(stderr, "zllm-logits: bad argument '%s'\n", argv[i]);
                free(ids);
                return 2;
            }
            ids[n++] = (int32_t)v;
        }
    }
    if (!ids || !model || n < 1) {
        s_usage(stderr);
        free(ids);
        return 2;
    }
    char err[512];
    int rc = 1;
    zl_engine *e = NULL;
    float *lg = NULL;
    zl_model *m = model_load(model, err, sizeof err);
    if (!m) goto fail;
    zl_engine_opts o = {
        .device = device, .n_slots = 1, .max_batch = 1, .n_ctx = n + 1, .max_step_tokens = n, .threads = 1};
    e = engine_new(m, &o, err, sizeof err);
    if (!e) goto fail;
    lg = malloc((size_t)m->cfg.vocab_size * sizeof *lg);
    if (!lg) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    zl_seq s = {.slot = 0, .pos = 0, .n_tokens = n, .tokens = ids, .sample = 1};
    int32_t tok;
    if (engine_step(e, &s, 1, &tok, lg) != 0) {
        snprintf(err, sizeof err, "%s", e->err);
        goto fail;
    }
    for (int i = 0; i < m->cfg.vocab_size; i++) printf("%.9g\n", lg[i]);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zllm-logits: %s\n", err);
    free(lg);
    engine_destroy(&e);
    model_destroy(&m);
    free(ids);
    return rc;
}
