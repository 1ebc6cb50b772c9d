/* tests/test_rand.h: the random numbers and random GGUF weight rows of the GPU matrix-kernel checks
 * (cuda/lab/test_qgemv.cu, cuda/lab/test_qmma.cu, cuda/test_qtc.cu). A file-static splitmix64 stream: define TEST_RAND_SEED before the
 * include for another start. Needs quant.h (ggml_type_block_bytes, f32_to_fp16) and <string.h>. */
#ifndef ZLLM_TEST_RAND_H
#define ZLLM_TEST_RAND_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t s_rng = TEST_RAND_SEED;
static uint64_t rnd_u64(void) {
    uint64_t z = (s_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) * 0x1p-53; }
static float rnd_normal(void) {
    double u = rnd_unit() + 1e-300, v = rnd_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* one row of random raw GGUF data of type t: F16/BF16 values of moderate exponent; for block types random bytes
 * with the fp16 scale (and min) fields replaced by values in [-0.05, 0.05) */
static void raw_row(ggml_type t, uint8_t *row, size_t row_bytes) {
    for (size_t i = 0; i < row_bytes; i++) row[i] = (uint8_t)rnd_u64();
    if (t == GGML_F16) {
        for (size_t i = 0; i < row_bytes; i += 2) {
            uint16_t h = (uint16_t)(((rnd_u64() & 1) << 15) | ((uint16_t)(5 + rnd_u64() % 20) << 10) |
                                    (rnd_u64() & 0x3ff));
            memcpy(row + i, &h, 2);
        }
        return;
    }
    if (t == GGML_BF16) {
        for (size_t i = 0; i < row_bytes; i += 2) {
            uint16_t h = (uint16_t)(((rnd_u64() & 1) << 15) | ((uint16_t)(110 + rnd_u64() % 30) << 7) |
                                    (rnd_u64() & 0x7f));
            memcpy(row + i, &h, 2);
        }
        return;
    }
    size_t bpb = ggml_type_block_bytes(t);
    for (size_t b = 0; b + bpb <= row_bytes; b += bpb) {
        uint8_t *p = row + b;
        uint16_t d = f32_to_fp16((float)(rnd_unit() * 2 - 1) * 0.05f);
        uint16_t m = f32_to_fp16((float)(rnd_unit() * 2 - 1) * 0.05f);
        switch (t) {
        case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K:
            memcpy(p, &d, 2);
            memcpy(p + 2, &m, 2);
            break;
        case GGML_Q6_K: memcpy(p + 208, &d, 2); break;
        default: memcpy(p, &d, 2); break;
        }
    }
}
#endif
