/* cuda/test_oracle_gpu.cu -> gpu_test_oracle_gpu: the CUDA engine against transformers on the oracle models of
 * tests/data/oracle (tests/oracle/make_oracle.py; the list is oracle_models in tests/oracle_check.h, the CPU
 * engines' check tests/test_oracle.c): llama with llama3 frequency factors (positions to 2099), linear scaling,
 * YaRN, qwen3 (per-head Q/K norms; also with YaRN), phi3 (fused matrices, LongRoPE long and short sets, partial
 * rotary; phi3-hd96: head size 96 and a window wider than the context, so the causal kernels run), gemma3 (local and global layers, sliding windows crossed by every prompt, linear scaling on the global
 * ones) and a Mistral-style llama sliding on every layer. Max rel err per logits row <= 1e-3 for the F32 models,
 * <= 2e-2 for their BF16 twins (16-bit GEMM inputs and KV cache), with the decode steps replayed from CUDA graphs
 * and run eagerly; all prompts batched in chunks of 7 within the same bound of each alone (tests/oracle_check.h).
 * tests/run_gpu.sh also runs gpu_test_engine_gpu (CUDA against CPU, batch invariance) on each file. Runs from the
 * repository root. */
extern "C" {
#include "engine.h"
#include "model.h"
#include "test.h"
#include "oracle_check.h"
}
#include <stdio.h>

static void test_case(const oracle_model *om) {
    oracle_case c;
    zl_model *m;
    if (oracle_open(om, &c, &m) != 0) return;
    const char *name = om->name;
    const double tol = oracle_cuda_bound(name);
    const double g = oracle_run(m, &c, "cuda", 0), eager = oracle_run(m, &c, "cuda", 1);
    CHECK(g >= 0 && g <= tol, "%s: cuda (graphs) vs transformers: max rel err %.3g > %g", name, g, tol);
    CHECK(eager >= 0 && eager <= tol, "%s: cuda (eager) vs transformers: max rel err %.3g > %g", name, eager, tol);
    /* batched rows are held to the bound, not to the bits: these small shapes run their products through cuBLAS,
     * whose rounding may follow the batch size (batch invariance on CUDA: gpu_test_engine_gpu, which make test-gpu
     * runs on these models too, compares greedy tokens) */
    oracle_batch(m, &c, "cuda", 0, name, tol);
    printf("%s: %d rows x %d logits vs transformers: cuda %.3g (graphs), %.3g (eager), bound %.0e\n", name, c.n_rows,
           c.vocab, g, eager, tol);
    model_destroy(&m);
    oracle_free(&c);
}

int main(void) {
    for (int i = 0; i < ORACLE_N_MODELS; i++) test_case(&oracle_models[i]);
    return test_report();
}
