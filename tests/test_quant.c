/* tests/test_quant.c: engine/quant.c on its own: fp16/bf16 conversion edge cases (subnormals, overflow, inf,
 * NaN, round-to-nearest-even ties), quantize -> dequantize round-trip error bounds per type, argument checks,
 * and quant_dot_row against a double-precision dot of the dequantized row. (Bit-exactness against the GGUF
 * reference implementation is tests/test_quant_gguf.py's job.) */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "quant.h"
#include "test.h"

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint64_t s_rng = 88172645463325252ull;
static double rnd_normal(void) {
    /* Box-Muller over xorshift64 */
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    double u1 = ((double)(s_rng >> 11) + 0.5) * 0x1p-53;
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    double u2 = (double)(s_rng >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void test_fp16(void) {
    CHECK(fp16_to_f32(0x0000) == 0.0f && !signbit(fp16_to_f32(0x0000)), "+0");
    CHECK(fp16_to_f32(0x8000) == 0.0f && signbit(fp16_to_f32(0x8000)), "-0");
    CHECK(fp16_to_f32(0x3c00) == 1.0f, "1.0");
    CHECK(fp16_to_f32(0xc000) == -2.0f, "-2.0");
    CHECK(fp16_to_f32(0x7bff) == 65504.0f, "max half");
    CHECK(fp16_to_f32(0x0001) == 0x1p-24f, "smallest subnormal");
    CHECK(fp16_to_f32(0x03ff) == 1023 * 0x1p-24f, "largest subnormal");
    CHECK(fp16_to_f32(0x0400) == 0x1p-14f, "smallest normal");
    CHECK(isinf(fp16_to_f32(0x7c00)) && fp16_to_f32(0x7c00) > 0, "+inf");
    CHECK(isinf(fp16_to_f32(0xfc00)) && fp16_to_f32(0xfc00) < 0, "-inf");
    CHECK(isnan(fp16_to_f32(0x7e00)) && isnan(fp16_to_f32(0x7c01)) && isnan(fp16_to_f32(0xfe00)), "NaNs");

    CHECK(f32_to_fp16(0.0f) == 0x0000 && f32_to_fp16(-0.0f) == 0x8000, "zeros");
    CHECK(f32_to_fp16(1.0f) == 0x3c00 && f32_to_fp16(-2.0f) == 0xc000, "1, -2");
    CHECK(f32_to_fp16(65504.0f) == 0x7bff, "65504");
    CHECK(f32_to_fp16(65519.0f) == 0x7bff, "65519 rounds down");
    CHECK(f32_to_fp16(65520.0f) == 0x7c00, "65520 ties to even: inf");
    CHECK(f32_to_fp16(1e10f) == 0x7c00 && f32_to_fp16(-1e10f) == 0xfc00, "overflow to inf");
    CHECK(f32_to_fp16(INFINITY) == 0x7c00 && f32_to_fp16(-INFINITY) == 0xfc00, "inf");
    uint16_t hn = f32_to_fp16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0 && (hn & 0x200), "NaN stays a quiet NaN: %04x", hn);
    CHECK((f32_to_fp16(u2f(0x7f800001)) & 0x3ff) != 0, "signalling NaN with a low payload stays NaN");
    CHECK(f32_to_fp16(0x1p-24f) == 0x0001, "smallest subnormal");
    CHECK(f32_to_fp16(0x1p-25f) == 0x0000, "half the smallest subnormal ties to even (0)");
    CHECK(f32_to_fp16(0x1.000002p-25f) == 0x0001, "just above half the smallest subnormal rounds up");
    CHECK(f32_to_fp16(3 * 0x1p-25f) == 0x0002, "1.5 ulp subnormal ties to even (2)");
    CHECK(f32_to_fp16(5 * 0x1p-25f) == 0x0002, "2.5 ulp subnormal ties to even (2)");
    CHECK(f32_to_fp16(0x1p-14f - 0x1p-25f) == 0x0400, "rounds up into the smallest normal");
    CHECK(f32_to_fp16(1e-30f) == 0 && f32_to_fp16(-1e-30f) == 0x8000, "underflow keeps the sign");
    CHECK(f32_to_fp16(u2f(0x00000001)) == 0, "f32 subnormal -> 0");
    CHECK(f32_to_fp16(1.0f + 0x1p-11f) == 0x3c00, "1 + half ulp ties to even (down)");
    CHECK(f32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02, "1 + 1.5 ulp ties to even (up)");
    CHECK(f32_to_fp16(u2f(0x3f801001)) == 0x3c01, "just above the tie rounds up");
    CHECK(f32_to_fp16(2.0f - 0x1p-12f) == 0x4000, "mantissa carry into the exponent");

    /* every half value survives a round trip; every f32 between two halves rounds to the nearer one */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (f32_to_fp16(f) != h) bad++;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = fp16_to_f32((uint16_t)h), b = fp16_to_f32((uint16_t)(h + 1));
        float mid = u2f((f2u(a) + f2u(b)) / 2);   /* a value strictly between (not the tie) */
        if (mid == a || mid == b) continue;
        uint16_t r = f32_to_fp16(mid);
        uint16_t want = (double)mid - a < (double)b - mid ? (uint16_t)h
                      : (double)mid - a > (double)b - mid ? (uint16_t)(h + 1) : ((h & 1) ? (uint16_t)(h + 1) : (uint16_t)h);
        if (r != want) bad++;
    }
    CHECK(bad == 0, "%d in-between values round wrongly", bad);
}

static void test_bf16(void) {
    CHECK(bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(bf16_to_f32(0x8000) == 0.0f && signbit(bf16_to_f32(0x8000)), "bf16 -0");
    CHECK(isinf(bf16_to_f32(0x7f80)), "bf16 inf");
    CHECK(isnan(bf16_to_f32(0x7fc0)), "bf16 NaN");
    CHECK(bf16_to_f32(0x0001) == u2f(0x00010000), "bf16 subnormal kept");
    CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(f32_to_bf16(u2f(0x3f808000)) == 0x3f80, "tie to even (down)");
    CHECK(f32_to_bf16(u2f(0x3f818000)) == 0x3f82, "tie to even (up)");
    CHECK(f32_to_bf16(u2f(0x3f808001)) == 0x3f81, "above the tie rounds up");
    CHECK(f32_to_bf16(u2f(0x7f7fffff)) == 0x7f80, "max f32 rounds to inf");
    CHECK(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80, "inf");
    uint16_t n = f32_to_bf16(u2f(0x7f800001));
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0, "signalling NaN with a low payload stays NaN: %04x", n);
    CHECK(f32_to_bf16(u2f(0x00010000)) == 0x0001, "subnormal");
}

typedef struct {
    ggml_type t;
    double max_rel_rms;   /* bound on rms(error) / rms(signal) for gaussian data */
} s_case;

static void test_roundtrip(void) {
    /* bounds: about 2x what these reference quantizers reach on gaussian data */
    const s_case cases[] = {
        {GGML_F32, 0.0},     {GGML_F16, 0.001},  {GGML_BF16, 0.005}, {GGML_Q8_0, 0.01},
        {GGML_Q4_0, 0.15},   {GGML_Q4_1, 0.15},  {GGML_Q5_0, 0.08},  {GGML_Q5_1, 0.08},
        {GGML_Q4_K, 0.15},   {GGML_Q5_K, 0.08},  {GGML_Q6_K, 0.04},
    };
    enum { N = 4096 };
    static float x[N], y[N], v[N];
    static uint8_t q[N * 4 + 64];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ggml_type t = cases[c].t;
        const char *nm = ggml_type_name(t);
        CHECK(quant_supported(t), "%s supported", nm);
        for (int rep = 0; rep < 3; rep++) {
            double scale = rep == 0 ? 1.0 : rep == 1 ? 0.003 : 40.0;
            for (int i = 0; i < N; i++) x[i] = (float)(rnd_normal() * scale);
            if (rep == 2)
                for (int i = 0; i < 256; i++) x[i] = 0.0f;   /* an all-zero (super-)block */
            memset(q, 0xAB, sizeof q);
            CHECK(quant_quantize_row(t, x, q, N) == 0, "%s quantize", nm);
            size_t rb = ggml_row_bytes(t, N);
            CHECK(q[rb] == 0xAB, "%s quantize wrote past its %zu bytes", nm, rb);
            CHECK(quant_dequant_row(t, q, y, N) == 0, "%s dequantize", nm);
            double se = 0, ss = 0;
            int finite = 1;
            for (int i = 0; i < N; i++) {
                se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                ss += (double)x[i] * x[i];
                if (!isfinite(y[i])) finite = 0;
            }
            double rel = sqrt(se / ss);
            CHECK(finite, "%s round trip gives non-finite values", nm);
            CHECK(rel <= cases[c].max_rel_rms, "%s scale %g: relative rms error %.4f > %.4f", nm, scale, rel,
                  cases[c].max_rel_rms);
            if (rep == 2) {
                int zeros = 1;
                for (int i = 0; i < 256; i++)
                    if (y[i] != 0.0f) zeros = 0;
                CHECK(zeros, "%s: an all-zero block does not come back as zeros", nm);
            }
            /* dot: against double precision over the dequantized row */
            for (int i = 0; i < N; i++) v[i] = (float)rnd_normal();
            double ref = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                ref += (double)y[i] * v[i];
                mag += fabs((double)y[i] * v[i]);
            }
            float d = quant_dot_row(t, q, v, N);
            CHECK(fabs(d - ref) <= 1e-5 * mag, "%s dot %g vs %g", nm, d, ref);
        }
        int blk = ggml_type_block(t);
        if (blk > 1) {
            CHECK(quant_dequant_row(t, q, y, blk + 1) == -1, "%s: n not a multiple of the block is refused", nm);
            CHECK(quant_quantize_row(t, x, q, blk / 2) == -1, "%s: quantize n not a multiple of the block", nm);
            CHECK(isnan(quant_dot_row(t, q, v, blk - 1)), "%s: dot with a bad n is NaN", nm);
        }
    }
    /* odd lengths for the float types (dot's scalar tail) */
    for (int n = 1; n < 300; n += 37) {
        for (int i = 0; i < n; i++) x[i] = (float)rnd_normal(), v[i] = (float)rnd_normal();
        double ref = 0;
        for (int i = 0; i < n; i++) ref += (double)x[i] * v[i];
        CHECK(fabs(quant_dot_row(GGML_F32, x, v, n) - ref) < 1e-4 * (1 + fabs(ref)), "F32 dot n=%d", n);
        quant_quantize_row(GGML_F16, x, q, n);
        quant_dequant_row(GGML_F16, q, y, n);
        ref = 0;
        for (int i = 0; i < n; i++) ref += (double)y[i] * v[i];
        CHECK(fabs(quant_dot_row(GGML_F16, q, v, n) - ref) < 1e-4 * (1 + fabs(ref)), "F16 dot n=%d", n);
    }
    CHECK(!quant_supported(GGML_Q2_K) && !quant_supported(GGML_Q8_K) && !quant_supported((ggml_type)99),
          "unsupported types are reported");
    CHECK(quant_dequant_row(GGML_Q2_K, q, y, 256) == -1, "dequant of an unsupported type fails");
}

/* the CPU engine's hot path: report throughput (informational, no check on speed) */
static void bench_dot(void) {
    enum { N = 4096, ROWS = 256 };
    static float x[N], w[N];
    static uint8_t q[ROWS][N * 4];
    for (int i = 0; i < N; i++) x[i] = (float)rnd_normal(), w[i] = (float)rnd_normal();
    const ggml_type ts[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q6_K};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        for (int r = 0; r < ROWS; r++) quant_quantize_row(ts[k], w, q[r], N);
        double best = 1e30;   /* best of 5: the machine is shared */
        volatile float sink = 0;
        for (int trial = 0; trial < 5; trial++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            for (int r = 0; r < ROWS; r++) sink += quant_dot_row(ts[k], q[r], x, N);
            clock_gettime(CLOCK_MONOTONIC, &b);
            double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
            if (s < best) best = s;
        }
        printf("quant_dot_row %-5s %6.2f Gelem/s\n", ggml_type_name(ts[k]), (double)ROWS * N / best / 1e9);
        (void)sink;
    }
}

int main(void) {
    test_fp16();
    test_bf16();
    test_roundtrip();
    bench_dot();
    return test_report();
}
