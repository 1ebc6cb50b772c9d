/* cuda/test_oracle_gpu.cu -> gpu_test_oracle_gpu: the CUDA engine against transformers on the RoPE variants and
 * architectures of tests/data/oracle (tests/oracle/make_oracle.py; the CPU engines' check is
 * tests/test_oracle_logits.c): llama with llama3 frequency factors (positions to 2099), linear scaling, YaRN,
 * qwen3 (per-head Q/K norms; also with YaRN) and phi3 (fused matrices, LongRoPE long and short sets, partial
 * rotary). Max rel err per logits row <= 1e-3 for the F32 models, <= 2e-2 for their BF16 twins (16-bit GEMM inputs
 * and KV cache), with the decode steps replayed from CUDA graphs and run eagerly. Batch invariance on these
 * models: tests/run_gpu.sh runs gpu_test_engine_gpu on each file. */
extern "C" {
#include "engine.h"
#include "model.h"
#include "test.h"
#include "oracle_check.h"
}
#include <stdio.h>

static void test_case(const char *name, zl_arch arch, double tol) {
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
        CHECK(g >= 0 && g <= tol, "%s: cuda (graphs) vs transformers: max rel err %.3g > %g", name, g, tol);
        CHECK(eager >= 0 && eager <= tol, "%s: cuda (eager) vs transformers: max rel err %.3g > %g", name, eager, tol);
        printf("%s: %d rows x %d logits vs transformers: cuda %.3g (graphs), %.3g (eager)\n", name, c.n_rows, c.vocab,
               g, eager);
    }
    model_destroy(&m);
    oracle_free(&c);
}

int main(void) {
    static const char *const names[] = {"llama3", "linear", "yarn", "qwen3", "qwen3-yarn", "phi3"};
    static const zl_arch archs[] = {ZL_ARCH_LLAMA, ZL_ARCH_LLAMA, ZL_ARCH_LLAMA,
                                    ZL_ARCH_QWEN3, ZL_ARCH_QWEN3, ZL_ARCH_PHI3};
    for (int i = 0; i < 6; i++) {
        char bf[64];
        snprintf(bf, sizeof bf, "%s-bf16", names[i]);
        test_case(names[i], archs[i], 1e-3);
        test_case(bf, archs[i], 2e-2);
    }
    return test_report();
}
