/* cuda/test_oracle_gpu.cu -> gpu_test_oracle_gpu: the CUDA engine against transformers on the RoPE variants and
 * architectures of tests/data/oracle (tests/oracle/make_oracle.py; the CPU engines' check is
 * tests/test_oracle_logits.c): llama with llama3 frequency factors (positions to 2099), linear scaling, YaRN,
 * qwen3 (per-head Q/K norms) and phi3 (fused matrices, LongRoPE long and short sets, partial rotary). F32 models:
 * max rel err <= 1e-3 per logits row, with the decode steps replayed from CUDA graphs and run eagerly. Batch
 * invariance on these models: tests/run_gpu.sh runs gpu_test_engine_gpu on each file. */
extern "C" {
#include "engine.h"
#include "model.h"
#include "test.h"
#include "oracle_check.h"
}
#include <stdio.h>

static void test_case(const char *name, zl_arch arch) {
    oracle_case c;
    if (oracle_read(name, &c) != 0) {
        oracle_free(&c);
        return;
    }
    char path[256], err[512];
    snprintf(path, sizeof path, "tests/data/oracle/%s.gguf", name);
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (m) {
        CHECK(m->cfg.arch == arch, "%s: architecture %d, expected %d", name, (int)m->cfg.arch, (int)arch);
        const double g = oracle_run(m, &c, "cuda", 0), eager = oracle_run(m, &c, "cuda", 1);
        CHECK(g >= 0 && g <= 1e-3, "%s: cuda (graphs) vs transformers: max rel err %.3g > 1e-3", name, g);
        CHECK(eager >= 0 && eager <= 1e-3, "%s: cuda (eager) vs transformers: max rel err %.3g > 1e-3", name, eager);
        printf("%s: %d rows x %d logits vs transformers: cuda %.3g (graphs), %.3g (eager)\n", name, c.n_rows, c.vocab,
               g, eager);
    }
    model_destroy(&m);
    oracle_free(&c);
}

int main(void) {
    test_case("llama3", ZL_ARCH_LLAMA);
    test_case("linear", ZL_ARCH_LLAMA);
    test_case("yarn", ZL_ARCH_LLAMA);
    test_case("qwen3", ZL_ARCH_QWEN3);
    test_case("phi3", ZL_ARCH_PHI3);
    return test_report();
}
