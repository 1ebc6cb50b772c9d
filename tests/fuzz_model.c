/* fuzz target: model_from_gguf (configuration and tensor binding) on arbitrary bytes, and when a model is
 * accepted, one CPU engine step on it. Must never crash, leak or read out of bounds: every inconsistency between
 * metadata and tensors is refused with a message. Seeds: the committed tiny llama / qwen2 models (tests/ref) and
 * the BF16 oracle models of the RoPE variants and architectures (tests/data/oracle: llama3 rope_freqs, qwen3 Q/K
 * norms, phi3 fused matrices and LongRoPE factors, gemma3 post norms and sliding window). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "engine.h"
#include "fuzz_main.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    char err[256];
    gguf *g = gguf_open_mem(copy, size, "fuzz", err, sizeof err);
    zl_model *m = g ? model_from_gguf(g, err, sizeof err) : NULL;
    if (g && !m) gguf_close(&g);
    if (m) {
        zl_engine_opts o = { .device = "cpu", .n_slots = 1, .max_batch = 1, .n_ctx = 4, .threads = 1 };
        zl_engine *e = engine_new(m, &o, err, sizeof err);
        if (e) {
            int32_t toks[2] = { 0, m->cfg.vocab_size - 1 }, out;
            zl_seq s = { .slot = 0, .pos = 0, .n_tokens = 2, .tokens = toks, .sample = 1 };
            engine_step(e, &s, 1, &out, NULL);
            engine_destroy(&e);
        }
        model_destroy(&m);
    }
    free(copy);
    return 0;
}

/* the committed tiny models, read once (from the repository root, where tests/run.sh runs) */
static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    static const char *paths[] = {"tests/ref/tiny-llama.gguf",          "tests/ref/tiny-qwen2.gguf",
                                  "tests/data/oracle/llama3-bf16.gguf", "tests/data/oracle/qwen3-bf16.gguf",
                                  "tests/data/oracle/phi3-bf16.gguf",   "tests/data/oracle/gemma3-swa-bf16.gguf"};
    enum { N_PATHS = sizeof paths / sizeof paths[0] };
    static uint8_t *bufs[N_PATHS];
    static size_t lens[N_PATHS];
    int n = 0;
    for (int i = 0; i < N_PATHS && n < max; i++) {
        if (!bufs[i]) {
            FILE *f = fopen(paths[i], "rb");
            if (!f) continue;
            fseek(f, 0, SEEK_END);
            long len = ftell(f);
            fseek(f, 0, SEEK_SET);
            bufs[i] = len > 0 ? malloc((size_t)len) : NULL;
            if (bufs[i] && fread(bufs[i], 1, (size_t)len, f) != (size_t)len) {
                free(bufs[i]);
                bufs[i] = NULL;
            }
            fclose(f);
            lens[i] = bufs[i] ? (size_t)len : 0;
        }
        if (bufs[i]) {
            seeds[n] = bufs[i];
            sizes[n++] = lens[i];
        }
    }
    return n;
}
