/* cuda/test_oracle_gpu.cu -> gpu_test_oracle_gpu: the CUDA engine against transformers on the random gemma3 and
 * Mistral-style models of tests/data/oracle (F32: the engine computes in f32; sliding windows crossed by every
 * prompt, gemma3's local and global layers, linear RoPE scaling on the global ones): every logits row within 1e-3
 * relative (2e-2 for the BF16 gemma3, which the engine runs with BF16 product inputs and cache), alone and with all
 * prompts batched in chunks (tests/oracle_check.h). Runs from the repository root. */
extern "C" {
#include "oracle_check.h"
}

int main(void) {
    static const char *const models[] = {"gemma3-swa", "gemma3-linear", "mistral-swa"};
    /* batched rows are held to the bound, not to the bits: these small shapes run their products through cuBLAS,
     * whose rounding may follow the batch size (batch invariance on CUDA: gpu_test_engine_gpu, which make test-gpu
     * runs on these models too, compares greedy tokens) */
    for (int i = 0; i < 3; i++) oracle_check(models[i], "cuda", 1e-3, 0);
    oracle_check("gemma3-swa-bf16", "cuda", 2e-2, 0); /* BF16 engine: 16-bit product inputs and KV cache */
    return test_report();
}
