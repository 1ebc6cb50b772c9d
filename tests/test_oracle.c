/* tests/test_oracle.c: both CPU engines against transformers on the random gemma3 and Mistral-style models of
 * tests/data/oracle (sliding windows crossed by every prompt; gemma3 with its local and global layers, and with
 * linear RoPE scaling on the global ones; gemma3 with BF16 matrices against transformers on the same rounded weights). cpu-ref (f32) within 1e-4 relative; cpu (quantized activations where the
 * weights are quantized: these are F32, so f32 products in another summation order and a vectorized exp) within
 * 1e-4 too. Each also runs all prompts batched in chunks and must give bitwise the rows of each alone
 * (tests/oracle_check.h). The data: tests/oracle/make_oracle.py. */
#include "oracle_check.h"

int main(void) {
    static const char *const models[] = {"gemma3-swa", "gemma3-linear", "mistral-swa", "gemma3-swa-bf16"};
    static const char *const devices[] = {"cpu-ref", "cpu"};
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 2; d++) oracle_check(models[i], devices[d], 1e-4, 1);
    return test_report();
}
