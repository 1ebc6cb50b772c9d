/* engine/cpu_qdot.c: the fast CPU engine's dot products (see cpu_qdot.h for the activation format per weight
 * type). Three paths, chosen at run time: scalar C (any CPU; also the oracle the SIMD paths are tested
 * against), AVX2 (+FMA, F16C) and AVX-512 (F, BW, VL, DQ, VNNI), each compiled with function-level target
 * attributes so that one binary runs everywhere.
 *
 * Per 32-block of a row, every integer-weight kernel forms the exact integer sum of weight levels times
 * activation levels, then adds it, scaled in f32, to per-lane f32 accumulators; offsets (Q4_1's m, Q4_K's
 * mins) are added from the activation block's precomputed sum s. A kernel decodes each weight block once
 * and applies it to its nt activation rows one after the other; the operations for one (row, activation row)
 * pair do not depend on nt, so a token's result is the same alone and in a batch.
 *
 * Path status: AVX-512 kernels for Q4_0, Q4_1, Q8_0, Q4_K and Q6_K (two 32-blocks per 512-bit register, VNNI
 * dot products; Q6_K's 16-element scales weight int16 pair sums); the float types run their AVX2 kernels on the
 * AVX-512 path. */
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "cpu_qdot.h"
#include "quant.h"

#define S_AVX2 __attribute__((target("avx2,fma,f16c")))
#define S_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define S_INLINE static inline __attribute__((always_inline))

/* F16C: every CPU with AVX2 and FMA has it (Haswell, Piledriver and later), and clang's __builtin_cpu_supports does
 * not know its name (the libFuzzer builds use clang) */
#if defined(__clang__)
#define S_HAS_F16C() 1
#else
#define S_HAS_F16C() __builtin_cpu_supports("f16c")
#endif

int qdot_isa_ok(int isa) {
    __builtin_cpu_init();
    switch (isa) {
    case QDOT_SCALAR: return 1;
    case QDOT_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && S_HAS_F16C();
    case QDOT_AVX512:
        return qdot_isa_ok(QDOT_AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
    default: return 0;
    }
}

int qdot_isa_best(void) {
    return qdot_isa_ok(QDOT_AVX512) ? QDOT_AVX512 : qdot_isa_ok(QDOT_AVX2) ? QDOT_AVX2 : QDOT_SCALAR;
}

const char *qdot_isa_name(int isa) { return isa == QDOT_AVX512 ? "avx512" : isa == QDOT_AVX2 ? "avx2" : "scalar"; }

int qdot_wants_q8(ggml_type t) {
    return t == GGML_Q4_0 || t == GGML_Q4_1 || t == GGML_Q8_0 || t == GGML_Q4_K || t == GGML_Q6_K;
}

static inline float s_h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

/* round to nearest, ties to even, for |v| < 2^22 (no libm call) */
static inline int s_round(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static void s_quantize_c(const float *x, qdot_blk *b, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++, x += 32, b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f, id256 = 256.0f * id;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = s_round(x[j] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            int r = s_round((x[j] - d * (float)q) * id256);
            r = r > 127 ? 127 : r < -127 ? -127 : r;
            b->q[j] = (int8_t)q;
            b->r[j] = (int8_t)r;
            sum += 256 * q + r;
        }
        b->d = d * (1.0f / 256.0f);
        b->s = b->d * (float)sum;
    }
}

/* the 16-bit level of element j of an activation block */
static inline int s_lv(const qdot_blk *b, int j) { return 256 * b->q[j] + b->r[j]; }

/* the 6-bit scale and min of sub-block j of Q4_K (as common/quant.c) */
static inline void s_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * scalar path: per block an exact integer sum, then acc += (weight scale * activation scale) * sum */

static void s_q4_0_c(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const qdot_blk *x = xv[t];
        float acc = 0.0f;
        for (int64_t i = 0; i < n / 32; i++, b += 18) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += ((b[2 + j] & 0xf) - 8) * s_lv(&x[i], j) + ((b[2 + j] >> 4) - 8) * s_lv(&x[i], j + 16);
            acc += (s_h(b) * x[i].d) * (float)s;
        }
        out[t] = acc;
    }
}

static void s_q4_1_c(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const qdot_blk *x = xv[t];
        float acc = 0.0f, macc = 0.0f;
        for (int64_t i = 0; i < n / 32; i++, b += 20) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += (b[4 + j] & 0xf) * s_lv(&x[i], j) + (b[4 + j] >> 4) * s_lv(&x[i], j + 16);
            acc += (s_h(b) * x[i].d) * (float)s;
            macc += s_h(b + 2) * x[i].s;
        }
        out[t] = acc + macc;
    }
}

static void s_q8_0_c(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const qdot_blk *x = xv[t];
        float acc = 0.0f;
        for (int64_t i = 0; i < n / 32; i++, b += 34) {
            int s = 0;
            for (int j = 0; j < 32; j++) s += (int8_t)b[2 + j] * s_lv(&x[i], j);
            acc += (s_h(b) * x[i].d) * (float)s;
        }
        out[t] = acc;
    }
}

static void s_q4_k_c(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const qdot_blk *x = xv[t];
        float acc = 0.0f, macc = 0.0f;
        for (int64_t sb = 0; sb < n / 256; sb++, b += 144, x += 8) {
            float d = s_h(b), dmin = s_h(b + 2);
            const uint8_t *q = b + 16;
            for (int j = 0; j < 8; j++) {
                int sc, m, s = 0;
                s_scale_min_k4(j, b + 4, &sc, &m);
                const uint8_t *qq = q + 32 * (j / 2);
                for (int l = 0; l < 32; l++) s += ((j & 1) ? qq[l] >> 4 : qq[l] & 0xf) * s_lv(&x[j], l);
                acc += ((d * (float)sc) * x[j].d) * (float)s;
                macc += (dmin * (float)m) * x[j].s;
            }
        }
        out[t] = acc - macc;
    }
}

static void s_q6_k_c(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const qdot_blk *x = xv[t];
        float acc = 0.0f;
        for (int64_t sb = 0; sb < n / 256; sb++, b += 210, x += 8) {
            float d = s_h(b + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
                for (int k = 0; k < 4; k++) {
                    const qdot_blk *xb = &x[4 * h + k];
                    int s0 = 0, s1 = 0;
                    for (int l = 0; l < 32; l++) {
                        int lo = k & 1 ? ql[l + 32] : ql[l];
                        int q = ((k & 2 ? lo >> 4 : lo & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                        if (l < 16) s0 += q * s_lv(xb, l);
                        else s1 += q * s_lv(xb, l);
                    }
                    acc += (d * xb->d) * (float)((int64_t)sc[2 * k] * s0 + (int64_t)sc[2 * k + 1] * s1);
                }
            }
        }
        out[t] = acc;
    }
}

/* float weights (F32, F16, BF16) and the types without integer kernels (dequantized one block at a time) */
static float s_wget(ggml_type ty, const void *w, int64_t i) {
    uint16_t h;
    if (ty == GGML_F32) return ((const float *)w)[i];
    memcpy(&h, (const uint8_t *)w + 2 * i, 2);
    return ty == GGML_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

static void s_float_c(ggml_type ty, const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    for (int t = 0; t < nt; t++) {
        const float *x = xv[t];
        float a[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) a[k] += s_wget(ty, w, i + k) * x[i + k];
        float tail = 0.0f;
        for (; i < n; i++) tail += s_wget(ty, w, i) * x[i];
        out[t] = (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))) + tail;
    }
}
static void s_f32_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_float_c(GGML_F32, w, x, nt, n, out);
}
static void s_f16_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_float_c(GGML_F16, w, x, nt, n, out);
}
static void s_bf16_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_float_c(GGML_BF16, w, x, nt, n, out);
}

static void s_deq_c(ggml_type ty, const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    const int bs = ggml_type_block(ty);
    const size_t bb = ggml_type_block_bytes(ty);
    float buf[256], a[QDOT_TILE][8];
    memset(a, 0, sizeof a);
    for (int64_t i = 0; i < n / bs; i++) {
        quant_dequant_row(ty, (const uint8_t *)w + (size_t)i * bb, buf, bs);
        for (int t = 0; t < nt; t++) {
            const float *x = (const float *)xv[t] + i * bs;
            for (int j = 0; j < bs; j += 8)
                for (int k = 0; k < 8; k++) a[t][k] += buf[j + k] * x[j + k];
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = ((a[t][0] + a[t][4]) + (a[t][1] + a[t][5])) + ((a[t][2] + a[t][6]) + (a[t][3] + a[t][7]));
}
static void s_q4_0_x(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q4_0, w, x, nt, n, out);
}
static void s_q4_1_x(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q4_1, w, x, nt, n, out);
}
static void s_q8_0_x(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q8_0, w, x, nt, n, out);
}
static void s_q4_k_x(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q4_K, w, x, nt, n, out);
}
static void s_q6_k_x(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q6_K, w, x, nt, n, out);
}
static void s_q5_0_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q5_0, w, x, nt, n, out);
}
static void s_q5_1_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q5_1, w, x, nt, n, out);
}
static void s_q5_k_c(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_deq_c(GGML_Q5_K, w, x, nt, n, out);
}

/* ------------------------------------------------------------------------------------------------------------
 * AVX2 */

S_INLINE S_AVX2 float s_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

S_INLINE S_AVX2 float s_h2(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 int32 lane sums of u8 * s8 products (u <= 63 so that pairs do not saturate) */
S_INLINE S_AVX2 __m256i s_dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* the 16-bit levels' sums: 256 * (u . q) + (u . r) */
S_INLINE S_AVX2 __m256i s_dot2_us(__m256i u, const qdot_blk *x) {
    const __m256i p = s_dot_us(u, _mm256_loadu_si256((const __m256i *)x->q));
    return _mm256_add_epi32(_mm256_slli_epi32(p, 8), s_dot_us(u, _mm256_loadu_si256((const __m256i *)x->r)));
}

/* signed levels a: |a| times the activation with a's sign */
S_INLINE S_AVX2 __m256i s_dot2_ss(__m256i a, __m256i aa, const qdot_blk *x) {
    const __m256i p = s_dot_us(aa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->q), a));
    return _mm256_add_epi32(_mm256_slli_epi32(p, 8),
                            s_dot_us(aa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->r), a)));
}

/* 32 nibbles of 16 packed bytes: low nibbles first, then high */
S_INLINE S_AVX2 __m256i s_nib32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p), m4 = _mm_set1_epi8(0xf);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* each kernel body is an always-inline function of a constant nt, instantiated for nt = 1..4 */
#define S_TILED(name, body, attr)                                                                                      \
    static attr void name(const void *w, const void *const *x, int nt, int64_t n, float *out) {                        \
        switch (nt) {                                                                                                  \
        case 1: body(w, x, 1, n, out); break;                                                                          \
        case 2: body(w, x, 2, n, out); break;                                                                          \
        case 3: body(w, x, 3, n, out); break;                                                                          \
        default: body(w, x, 4, n, out); break;                                                                         \
        }                                                                                                              \
    }

#define S_XS                                                                                                           \
    const qdot_blk *x[QDOT_TILE];                                                                                      \
    for (int t = 0; t < nt; t++) x[t] = xv[t];

S_INLINE S_AVX2 void s_q4_0_avx2_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m256 acc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++, b += 18) {
        const float d = s_h2(b);
        const __m256i q = _mm256_sub_epi8(s_nib32(b + 2), _mm256_set1_epi8(8));
        const __m256i aq = _mm256_abs_epi8(q);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256i p = s_dot2_ss(q, aq, &x[t][i]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t][i].d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(acc[t]);
}
S_TILED(s_q4_0_avx2, s_q4_0_avx2_b, S_AVX2)

S_INLINE S_AVX2 void s_q4_1_avx2_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m256 acc[QDOT_TILE];
    float macc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps(), macc[t] = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 20) {
        const float d = s_h2(b), m = s_h2(b + 2);
        const __m256i q = s_nib32(b + 4);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256i p = s_dot2_us(q, &x[t][i]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t][i].d), _mm256_cvtepi32_ps(p), acc[t]);
            macc[t] += m * x[t][i].s;
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(acc[t]) + macc[t];
}
S_TILED(s_q4_1_avx2, s_q4_1_avx2_b, S_AVX2)

S_INLINE S_AVX2 void s_q8_0_avx2_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m256 acc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++, b += 34) {
        const float d = s_h2(b);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256i aq = _mm256_abs_epi8(q);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256i p = s_dot2_ss(q, aq, &x[t][i]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t][i].d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(acc[t]);
}
S_TILED(s_q8_0_avx2, s_q8_0_avx2_b, S_AVX2)

S_INLINE S_AVX2 void s_q4_k_avx2_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m256 acc[QDOT_TILE];
    float macc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps(), macc[t] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int64_t sb = 0; sb < n / 256; sb++, b += 144) {
        const float d = s_h2(b), dmin = s_h2(b + 2);
        float ds[8], dm[8];
        for (int j = 0; j < 8; j++) {
            int sc, m;
            s_scale_min_k4(j, b + 4, &sc, &m);
            ds[j] = d * (float)sc;
            dm[j] = dmin * (float)m;
        }
        for (int j = 0; j < 8; j += 2) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 16 * j));
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            const int64_t i = sb * 8 + j;
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                __m256i p = s_dot2_us(lo, &x[t][i]);
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ds[j] * x[t][i].d), _mm256_cvtepi32_ps(p), acc[t]);
                macc[t] += dm[j] * x[t][i].s;
                p = s_dot2_us(hi, &x[t][i + 1]);
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ds[j + 1] * x[t][i + 1].d), _mm256_cvtepi32_ps(p), acc[t]);
                macc[t] += dm[j + 1] * x[t][i + 1].s;
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(acc[t]) - macc[t];
}
S_TILED(s_q4_k_avx2, s_q4_k_avx2_b, S_AVX2)

S_INLINE S_AVX2 void s_q6_k_avx2_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m256 acc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xf), m3 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    for (int64_t sb = 0; sb < n / 256; sb++, b += 210) {
        const float d = s_h2(b + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i qs = _mm256_sub_epi8(q[k], c32), aq = _mm256_abs_epi8(qs);
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                const int64_t i = sb * 8 + 4 * h + k;
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    const __m256i yq = _mm256_loadu_si256((const __m256i *)x[t][i].q);
                    const __m256i yr = _mm256_loadu_si256((const __m256i *)x[t][i].r);
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(yq, qs)), scv);
                    p = _mm256_add_epi32(_mm256_slli_epi32(p, 8),
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(yr, qs)), scv));
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t][i].d), _mm256_cvtepi32_ps(p), acc[t]);
                }
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(acc[t]);
}
S_TILED(s_q6_k_avx2, s_q6_k_avx2_b, S_AVX2)

/* float weights: 16 elements per step in two accumulators, one 8-wide step, then a scalar tail */
S_INLINE S_AVX2 __m256 s_ldw(ggml_type ty, const void *w, int64_t i) {
    if (ty == GGML_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (ty == GGML_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

S_INLINE S_AVX2 void s_float_avx2_b(ggml_type ty, const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    const float *x[QDOT_TILE];
    __m256 a0[QDOT_TILE], a1[QDOT_TILE];
    for (int t = 0; t < nt; t++) x[t] = xv[t], a0[t] = _mm256_setzero_ps(), a1[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = s_ldw(ty, w, i), w1 = s_ldw(ty, w, i + 8);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i + 8), a1[t]);
        }
    }
    if (i + 8 <= n) {
        const __m256 w0 = s_ldw(ty, w, i);
        for (int t = 0; t < nt; t++) a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[t]);
        i += 8;
    }
    for (int t = 0; t < nt; t++) {
        float tail = 0.0f;
        for (int64_t j = i; j < n; j++) tail += s_wget(ty, w, j) * x[t][j];
        out[t] = s_hsum8(_mm256_add_ps(a0[t], a1[t])) + tail;
    }
}
#define S_FLOAT_AVX2(name, ty)                                                                                         \
    S_INLINE S_AVX2 void name##_b(const void *w, const void *const *x, int nt, int64_t n, float *out) {                \
        s_float_avx2_b(ty, w, x, nt, n, out);                                                                          \
    }                                                                                                                  \
    S_TILED(name, name##_b, S_AVX2)
S_FLOAT_AVX2(s_f32_avx2, GGML_F32)
S_FLOAT_AVX2(s_f16_avx2, GGML_F16)
S_FLOAT_AVX2(s_bf16_avx2, GGML_BF16)

/* the other block types (Q5_0, Q5_1, Q5_K: Gemma 3 Q4_K_M's Q/K/gate/up rows are Q5_0) with f32 activations: each
 * block dequantized once (quant_dequant_row) and applied to every activation row by 8-wide FMAs into one
 * accumulator per row; the same operations per (weight row, activation row) whatever the tile */
S_INLINE S_AVX2 void s_deq_avx2_b(ggml_type ty, const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    const int bs = ggml_type_block(ty);
    const size_t bb = ggml_type_block_bytes(ty);
    float buf[256];
    __m256 a[QDOT_TILE];
    for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / bs; i++) {
        quant_dequant_row(ty, (const uint8_t *)w + (size_t)i * bb, buf, bs);
        for (int j = 0; j < bs; j += 8) {
            const __m256 wv = _mm256_loadu_ps(buf + j);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                a[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps((const float *)xv[t] + i * bs + j), a[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = s_hsum8(a[t]);
}
#define S_DEQ_AVX2(name, ty)                                                                                           \
    S_INLINE S_AVX2 void name##_b(const void *w, const void *const *x, int nt, int64_t n, float *out) {                \
        s_deq_avx2_b(ty, w, x, nt, n, out);                                                                            \
    }                                                                                                                  \
    S_TILED(name, name##_b, S_AVX2)
S_DEQ_AVX2(s_q5_0_avx2, GGML_Q5_0)
S_DEQ_AVX2(s_q5_1_avx2, GGML_Q5_1)
S_DEQ_AVX2(s_q5_k_avx2, GGML_Q5_K)

static S_AVX2 float s_f32_dot_avx2(const float *a, const float *b, int64_t n) {
    float out;
    const void *x = b;
    s_float_avx2_b(GGML_F32, a, &x, 1, n, &out);
    return out;
}

static S_AVX2 void s_axpy_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* 8 int32 levels to 8 int8 in order (values within [-127, 127]) */
S_INLINE S_AVX2 __m256i s_pack8(const __m256i q[4]) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* the scalar quantizer's values exactly: the same max, scales, products, differences and round-to-nearest-even
 * (cvtps) */
static S_AVX2 void s_quantize_avx2(const float *x, qdot_blk *b, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t i = 0; i < n / 32; i++, x += 32, b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h), d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f, id256 = 256.0f * id;
        __m256i q[4], r[4], sum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            q[k] =
                _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id))), lo), hi);
            const __m256 res = _mm256_sub_ps(v[k], _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q[k])));
            r[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(res, _mm256_set1_ps(id256))), lo),
                                    hi);
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_slli_epi32(q[k], 8), r[k]));
        }
        _mm256_storeu_si256((__m256i *)b->q, s_pack8(q));
        _mm256_storeu_si256((__m256i *)b->r, s_pack8(r));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        t = _mm_hadd_epi32(t, t);
        t = _mm_hadd_epi32(t, t);
        b->d = d * (1.0f / 256.0f);
        b->s = b->d * (float)_mm_cvtsi128_si32(t);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * AVX-512: two 32-blocks per register; lanes 0-7 hold the first block's sums, 8-15 the second's; an odd last
 * block runs on 256-bit VNNI */

S_INLINE S_AVX512 __m512 s_two(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

S_INLINE S_AVX512 __m512i s_cat(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

/* the high (lo 0) or low (lo 1) levels of two consecutive activation blocks */
S_INLINE S_AVX512 __m512i s_ly2(const qdot_blk *x, int lo) {
    return s_cat(_mm256_loadu_si256((const __m256i *)(lo ? x[0].r : x[0].q)),
                 _mm256_loadu_si256((const __m256i *)(lo ? x[1].r : x[1].q)));
}

/* 16-bit levels' sums of unsigned weights u with two activation blocks: 256 * (u . q) + (u . r) */
S_INLINE S_AVX512 __m512i s_dot2_u(__m512i u, const qdot_blk *x) {
    const __m512i p = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s_ly2(x, 0)), 8);
    return _mm512_dpbusd_epi32(p, u, s_ly2(x, 1));
}

/* the same for signed weights given as |w| and w's negative lanes */
S_INLINE S_AVX512 __m512i s_dot2_s(__m512i aw, __mmask64 neg, const qdot_blk *x) {
    const __m512i z = _mm512_setzero_si512(), yq = s_ly2(x, 0), yr = s_ly2(x, 1);
    const __m512i p = _mm512_slli_epi32(_mm512_dpbusd_epi32(z, aw, _mm512_mask_sub_epi8(yq, neg, z, yq)), 8);
    return _mm512_dpbusd_epi32(p, aw, _mm512_mask_sub_epi8(yr, neg, z, yr));
}

/* one block on 256-bit VNNI: unsigned u, or signed a with |a| = aa */
S_INLINE S_AVX512 __m256i s_dot2_u1(__m256i u, const qdot_blk *x) {
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)x->q));
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(p, 8), u, _mm256_loadu_si256((const __m256i *)x->r));
}
S_INLINE S_AVX512 __m256i s_dot2_s1(__m256i a, __m256i aa, const qdot_blk *x) {
    const __m256i yq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->q), a);
    const __m256i yr = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->r), a);
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aa, yq);
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(p, 8), aa, yr);
}

/* Q4_0 and Q4_1 share the nibble layout; Q4_0's levels nibble - 8 are signed (|w| and a masked negation) */
S_INLINE S_AVX512 void s_q4_avx512_b(int is_q4_1, const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const int bs = is_q4_1 ? 20 : 18, qo = is_q4_1 ? 4 : 2;
    const uint8_t *b = w;
    const int64_t nb = n / 32;
    __m512 acc[QDOT_TILE];
    __m256 acc1[QDOT_TILE];
    float macc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps(), acc1[t] = _mm256_setzero_ps(), macc[t] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 2 * bs) {
        const float d0 = s_h2(b), d1 = s_h2(b + bs);
        const float m0 = is_q4_1 ? s_h2(b + 2) : 0.0f, m1 = is_q4_1 ? s_h2(b + bs + 2) : 0.0f;
        const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b + bs + qo)),
                                           _mm_loadu_si128((const __m128i *)(b + qo)));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m512i q = s_cat(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
        const __m512i qs = is_q4_1 ? q : _mm512_sub_epi8(q, _mm512_set1_epi8(8));
        const __m512i aq = is_q4_1 ? q : _mm512_abs_epi8(qs);
        const __mmask64 neg = is_q4_1 ? 0 : _mm512_movepi8_mask(qs);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m512i p = is_q4_1 ? s_dot2_u(q, &x[t][i]) : s_dot2_s(aq, neg, &x[t][i]);
            acc[t] = _mm512_fmadd_ps(s_two(d0 * x[t][i].d, d1 * x[t][i + 1].d), _mm512_cvtepi32_ps(p), acc[t]);
            if (is_q4_1) {
                macc[t] += m0 * x[t][i].s;
                macc[t] += m1 * x[t][i + 1].s;
            }
        }
    }
    if (i < nb) {
        const float d0 = s_h2(b), m0 = is_q4_1 ? s_h2(b + 2) : 0.0f;
        const __m256i q = s_nib32(b + qo), qs = _mm256_sub_epi8(q, _mm256_set1_epi8(8)), aq = _mm256_abs_epi8(qs);
        for (int t = 0; t < nt; t++) {
            const __m256i p = is_q4_1 ? s_dot2_u1(q, &x[t][i]) : s_dot2_s1(qs, aq, &x[t][i]);
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[t][i].d), _mm256_cvtepi32_ps(p), acc1[t]);
            if (is_q4_1) macc[t] += m0 * x[t][i].s;
        }
    }
    for (int t = 0; t < nt; t++) out[t] = (_mm512_reduce_add_ps(acc[t]) + s_hsum8(acc1[t])) + macc[t];
}
S_INLINE S_AVX512 void s_q4_0_avx512_b(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_q4_avx512_b(0, w, x, nt, n, out);
}
S_INLINE S_AVX512 void s_q4_1_avx512_b(const void *w, const void *const *x, int nt, int64_t n, float *out) {
    s_q4_avx512_b(1, w, x, nt, n, out);
}
S_TILED(s_q4_0_avx512, s_q4_0_avx512_b, S_AVX512)
S_TILED(s_q4_1_avx512, s_q4_1_avx512_b, S_AVX512)

/* Q8_0: signed * signed as |w| * (y with w's sign), the sign applied by a masked negation */
S_INLINE S_AVX512 void s_q8_0_avx512_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    const int64_t nb = n / 32;
    __m512 acc[QDOT_TILE];
    __m256 acc1[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps(), acc1[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 68) {
        const float d0 = s_h2(b), d1 = s_h2(b + 34);
        const __m512i q =
            s_cat(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_loadu_si256((const __m256i *)(b + 36)));
        const __m512i aq = _mm512_abs_epi8(q);
        const __mmask64 neg = _mm512_movepi8_mask(q);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m512i p = s_dot2_s(aq, neg, &x[t][i]);
            acc[t] = _mm512_fmadd_ps(s_two(d0 * x[t][i].d, d1 * x[t][i + 1].d), _mm512_cvtepi32_ps(p), acc[t]);
        }
    }
    if (i < nb) {
        const float d0 = s_h2(b);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2)), aq = _mm256_abs_epi8(q);
        for (int t = 0; t < nt; t++) {
            const __m256i p = s_dot2_s1(q, aq, &x[t][i]);
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[t][i].d), _mm256_cvtepi32_ps(p), acc1[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]) + s_hsum8(acc1[t]);
}
S_TILED(s_q8_0_avx512, s_q8_0_avx512_b, S_AVX512)

/* Q4_K: the two sub-blocks of each 32 packed bytes (low nibbles, high nibbles) share one register */
S_INLINE S_AVX512 void s_q4_k_avx512_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m512 acc[QDOT_TILE];
    float macc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps(), macc[t] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int64_t sb = 0; sb < n / 256; sb++, b += 144) {
        const float d = s_h2(b), dmin = s_h2(b + 2);
        float ds[8], dm[8];
        for (int j = 0; j < 8; j++) {
            int sc, m;
            s_scale_min_k4(j, b + 4, &sc, &m);
            ds[j] = d * (float)sc;
            dm[j] = dmin * (float)m;
        }
        for (int j = 0; j < 8; j += 2) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 16 * j));
            const __m512i q = s_cat(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            const int64_t i = sb * 8 + j;
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m512i p = s_dot2_u(q, &x[t][i]);
                acc[t] =
                    _mm512_fmadd_ps(s_two(ds[j] * x[t][i].d, ds[j + 1] * x[t][i + 1].d), _mm512_cvtepi32_ps(p), acc[t]);
                macc[t] += dm[j] * x[t][i].s;
                macc[t] += dm[j + 1] * x[t][i + 1].s;
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]) - macc[t];
}
S_TILED(s_q4_k_avx512, s_q4_k_avx512_b, S_AVX512)

/* Q6_K: levels q - 32 as |q - 32| times the activation with q - 32's sign; int16 pair sums weighted by the
 * 16-element scales (4 per register) */
S_INLINE S_AVX512 void s_q6_k_avx512_b(const void *w, const void *const *xv, int nt, int64_t n, float *out) {
    S_XS const uint8_t *b = w;
    __m512 acc[QDOT_TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xf), m3 = _mm256_set1_epi8(3);
    for (int64_t sb = 0; sb < n / 256; sb++, b += 210) {
        const float d = s_h2(b + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            const __m256i q0 =
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int k = 0; k < 4; k += 2) {
                const __m512i qs = _mm512_sub_epi8(k ? s_cat(q2, q3) : s_cat(q0, q1), _mm512_set1_epi8(32));
                const __m512i aq = _mm512_abs_epi8(qs);
                const __mmask64 neg = _mm512_movepi8_mask(qs);
                const __m512i scv = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]))),
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 3]), _mm_set1_epi16(sc[2 * k + 2])), 1);
                const int64_t i = sb * 8 + 4 * h + k;
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    const __m512i z = _mm512_setzero_si512(), yq = s_ly2(&x[t][i], 0), yr = s_ly2(&x[t][i], 1);
                    __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aq, _mm512_mask_sub_epi8(yq, neg, z, yq)), scv);
                    p = _mm512_add_epi32(
                        _mm512_slli_epi32(p, 8),
                        _mm512_madd_epi16(_mm512_maddubs_epi16(aq, _mm512_mask_sub_epi8(yr, neg, z, yr)), scv));
                    acc[t] = _mm512_fmadd_ps(s_two(d * x[t][i].d, d * x[t][i + 1].d), _mm512_cvtepi32_ps(p), acc[t]);
                }
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}
S_TILED(s_q6_k_avx512, s_q6_k_avx512_b, S_AVX512)

/* ------------------------------------------------------------------------------------------------------------
 * dispatch */

qdot_fn qdot_get(ggml_type t, int isa) {
    if (isa == QDOT_AVX512) {
        switch (t) {
        case GGML_Q4_0: return s_q4_0_avx512;
        case GGML_Q4_1: return s_q4_1_avx512;
        case GGML_Q8_0: return s_q8_0_avx512;
        case GGML_Q4_K: return s_q4_k_avx512;
        case GGML_Q6_K: return s_q6_k_avx512;
        default: break;
        }
    }
    if (isa >= QDOT_AVX2) {
        switch (t) {
        case GGML_Q4_0: return s_q4_0_avx2;
        case GGML_Q4_1: return s_q4_1_avx2;
        case GGML_Q8_0: return s_q8_0_avx2;
        case GGML_Q4_K: return s_q4_k_avx2;
        case GGML_Q6_K: return s_q6_k_avx2;
        case GGML_F32: return s_f32_avx2;
        case GGML_F16: return s_f16_avx2;
        case GGML_BF16: return s_bf16_avx2;
        case GGML_Q5_0: return s_q5_0_avx2;
        case GGML_Q5_1: return s_q5_1_avx2;
        case GGML_Q5_K: return s_q5_k_avx2;
        default: break;
        }
    }
    switch (t) {
    case GGML_Q4_0: return s_q4_0_c;
    case GGML_Q4_1: return s_q4_1_c;
    case GGML_Q8_0: return s_q8_0_c;
    case GGML_Q4_K: return s_q4_k_c;
    case GGML_Q6_K: return s_q6_k_c;
    case GGML_F32: return s_f32_c;
    case GGML_F16: return s_f16_c;
    case GGML_BF16: return s_bf16_c;
    case GGML_Q5_0: return s_q5_0_c;
    case GGML_Q5_1: return s_q5_1_c;
    case GGML_Q5_K: return s_q5_k_c;
    default: return NULL;
    }
}

void qdot_quantize_row(int isa, const float *x, qdot_blk *b, int64_t n) {
    if (isa >= QDOT_AVX2) s_quantize_avx2(x, b, n);
    else s_quantize_c(x, b, n);
}

qdot_fn qdot_get_f32act(ggml_type t) {
    switch (t) {
    case GGML_Q4_0: return s_q4_0_x;
    case GGML_Q4_1: return s_q4_1_x;
    case GGML_Q8_0: return s_q8_0_x;
    case GGML_Q4_K: return s_q4_k_x;
    case GGML_Q6_K: return s_q6_k_x;
    default: return qdot_wants_q8(t) ? NULL : qdot_get(t, QDOT_SCALAR);
    }
}

float qdot_f32(int isa, const float *a, const float *b, int64_t n) {
    if (isa >= QDOT_AVX2) return s_f32_dot_avx2(a, b, n);
    float out;
    const void *x = b;
    s_f32_c(a, &x, 1, n, &out);
    return out;
}

void qdot_axpy(int isa, float *y, float a, const float *x, int64_t n) {
    if (isa >= QDOT_AVX2) {
        s_axpy_avx2(y, a, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
