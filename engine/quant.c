/* engine/quant.c: GGUF weight types. Block layouts follow the GGUF format (ggml's block_q4_0 ... block_q6_K);
 * every dequantizer evaluates the same float expression as the format's reference, term by term, so results
 * are bit-identical to gguf-py's numpy dequantizers (checked by tests/test_quant_gguf.py).
 *
 *   Q4_0  32: d(f16) qs[16]                      x = (nibble - 8) * d        (low nibbles first 16, high last 16)
 *   Q4_1  32: d(f16) m(f16) qs[16]                x = d * nibble + m
 *   Q5_0  32: d(f16) qh[4] qs[16]                 x = ((nibble | bit << 4) - 16) * d   (bit j of qh: element j)
 *   Q5_1  32: d(f16) m(f16) qh[4] qs[16]          x = d * (nibble | bit << 4) + m
 *   Q8_0  32: d(f16) qs[32] (int8)                x = q * d
 *   Q4_K 256: d dmin(f16) scales[12] qs[128]      8 sub-blocks of 32, 6-bit scale/min each: x = d*sc * q - dmin*m
 *   Q5_K 256: d dmin scales[12] qh[32] qs[128]    same with a fifth bit from qh
 *   Q6_K 256: ql[128] qh[64] scales[16](int8) d   16 sub-blocks of 16: x = d*sc * (q - 32)
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#define QK 32   /* elements per block of the simple types */
#define QKK 256 /* elements per super-block of the K types */

/* ------------------------------------------------------------------------------------------------------
 * half <-> float */

static inline uint32_t s_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float s_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return s_u2f(s_f2u(v) | sign);
    }
    if (exp == 31) return s_u2f(sign | 0x7f800000u | (mant << 13)); /* inf, NaN keeps its payload */
    return s_u2f(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_fp16(float f) {
    uint32_t x = s_f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* NaN, made quiet */
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds (to even) to infinity */
    uint32_t e = ax >> 23;
    if (e < 113) {
        /* result is a half subnormal (or zero, or the smallest normal after rounding up) */
        if (e == 0) return sign;                                  /* f32 zero or subnormal: far below half's range */
        uint32_t m = (ax & 0x7fffff) | 0x800000, shift = 126 - e; /* value * 2^24 = m * 2^-shift */
        if (shift > 24) return sign;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into the exponent is still correct */
    return sign | (uint16_t)h;
}

float bf16_to_f32(uint16_t h) { return s_u2f((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t x = s_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* NaN: force quiet */
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1))) >> 16);
}

/* rows of F16 / BF16, 32 elements at a time: branch-free, fixed trip count, so that the compiler vectorizes
 * them at -O2; same values as fp16_to_f32 / bf16_to_f32 (the tail uses those) */
static void s_f16_x32(const uint8_t *restrict p, float *restrict y) {
    for (int i = 0; i < 32; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fffu, exp = em >> 10;
        /* rebias the exponent by 112; inf/NaN (exp 31, so (exp + 1) >> 5 == 1) by another 112, to 255 */
        uint32_t normal = (em << 13) + (112u << 23) + ((exp + 1) >> 5) * (112u << 23);
        uint32_t sub = s_f2u((float)(int32_t)(em & 0x3ff) * 0x1p-24f); /* zero and subnormals: mant * 2^-24 */
        uint32_t is_sub = 0u - (uint32_t)(exp == 0);                   /* all ones when exp == 0 */
        y[i] = s_u2f(((sub & is_sub) | (normal & ~is_sub)) | sign);
    }
}

static void s_bf16_x32(const uint8_t *restrict p, float *restrict y) {
    for (int i = 0; i < 32; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = s_u2f((uint32_t)h << 16);
    }
}

static void s_row_f16(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) s_f16_x32(p + 2 * i, y + i);
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = fp16_to_f32(h);
    }
}

static void s_row_bf16(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) s_bf16_x32(p + 2 * i, y + i);
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = bf16_to_f32(h);
    }
}

static inline float s_h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

static inline void s_put_h(uint8_t *p, float f) {
    uint16_t h = f32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* ------------------------------------------------------------------------------------------------------
 * dequantization of one block */

static void s_deq_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((qs[j] & 0xf) - 8);
        y[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void s_deq_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b), m = s_h(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(qs[j] & 0xf) + m;
        y[j + QK / 2] = d * (float)(qs[j] >> 4) + m;
    }
}

static void s_deq_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = d * (float)(((qs[j] & 0xf) | (h0 << 4)) - 16);
        y[j + QK / 2] = d * (float)(((qs[j] >> 4) | (h1 << 4)) - 16);
    }
}

static void s_deq_q5_1(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b), m = s_h(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = d * (float)((qs[j] & 0xf) | (h0 << 4)) + m;
        y[j + QK / 2] = d * (float)((qs[j] >> 4) | (h1 << 4)) + m;
    }
}

static void s_deq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

/* the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K:
 * bytes 0-3 low 6 bits: scales 0-3; bytes 4-7 low 6 bits: mins 0-3; bytes 8-11: low nibble scales 4-7 and
 * high nibble mins 4-7, whose top 2 bits sit in the top 2 bits of bytes 0-3 (scales) and 4-7 (mins). */
static inline void s_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void s_deq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b), dmin = s_h(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0; j < QKK / 64; j++) {
        int sc, m;
        s_scale_min_k4(2 * j, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        s_scale_min_k4(2 * j + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xf) - m1;
        for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
        y += 64;
    }
}

static void s_deq_q5_k(const uint8_t *restrict b, float *restrict y) {
    float d = s_h(b), dmin = s_h(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    for (int j = 0; j < QKK / 64; j++) {
        int sc, m;
        s_scale_min_k4(2 * j, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        s_scale_min_k4(2 * j + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        int s1 = 2 * j, s2 = 2 * j + 1;
        for (int l = 0; l < 32; l++) y[l] = d1 * (float)((ql[l] & 0xf) | (((qh[l] >> s1) & 1) << 4)) - m1;
        for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)((ql[l] >> 4) | (((qh[l] >> s2) & 1) << 4)) - m2;
        ql += 32;
        y += 64;
    }
}

static void s_deq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = s_h(b + 208);
    for (int n = 0; n < QKK / 128; n++) {
        for (int is = 0; is < 2; is++) { /* the scale changes every 16 elements */
            for (int l = 16 * is; l < 16 * is + 16; l++) {
                int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is + 0]) * (float)q1;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* ------------------------------------------------------------------------------------------------------
 * quantization of one block (reference, non-iterative) */

static void s_q_q4_0(const float *x, uint8_t *b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
    s_put_h(b, d);
    for (int j = 0; j < QK / 2; j++) {
        int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[j + QK / 2] * id + 8.5f);
        q0 = q0 > 15 ? 15 : q0;
        q1 = q1 > 15 ? 15 : q1;
        b[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void s_q_q4_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    float d = (mx - mn) / 15, id = d != 0.0f ? 1.0f / d : 0.0f;
    s_put_h(b, d);
    s_put_h(b + 2, mn);
    for (int j = 0; j < QK / 2; j++) {
        int q0 = (int)(int8_t)((x[j] - mn) * id + 0.5f), q1 = (int)(int8_t)((x[j + QK / 2] - mn) * id + 0.5f);
        q0 = q0 > 15 ? 15 : q0;
        q1 = q1 > 15 ? 15 : q1;
        b[4 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void s_q_q5_0(const float *x, uint8_t *b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -16, id = d != 0.0f ? 1.0f / d : 0.0f;
    s_put_h(b, d);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        int q0 = (int)(int8_t)(x[j] * id + 16.5f), q1 = (int)(int8_t)(x[j + QK / 2] * id + 16.5f);
        q0 = q0 > 31 ? 31 : q0;
        q1 = q1 > 31 ? 31 : q1;
        b[6 + j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
        qh |= (uint32_t)((q0 >> 4) & 1) << j;
        qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    memcpy(b + 2, &qh, 4);
}

static void s_q_q5_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    float d = (mx - mn) / 31, id = d != 0.0f ? 1.0f / d : 0.0f;
    s_put_h(b, d);
    s_put_h(b + 2, mn);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        int q0 = (int)((x[j] - mn) * id + 0.5f), q1 = (int)((x[j + QK / 2] - mn) * id + 0.5f);
        q0 = q0 > 31 ? 31 : q0;
        q1 = q1 > 31 ? 31 : q1;
        b[8 + j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
        qh |= (uint32_t)((q0 >> 4) & 1) << j;
        qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    memcpy(b + 4, &qh, 4);
}

static void s_q_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
    float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
    s_put_h(b, d);
    for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static inline int s_clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* round to nearest (ties to even) of v clamped to [lo, hi], without a libm call: adding 1.5 * 2^23 puts the
 * integer in the low mantissa bits (valid while |v| < 2^22, which the clamp guarantees) */
static inline int s_round_clamp(float v, float lo, float hi) {
    v = v < lo ? lo : v > hi ? hi : v;
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Q4_K / Q5_K: per sub-block of 32 an affine range [min(0, lo), hi]; the 8 scales and mins are quantized
 * to 6 bits against the super-block's d = max scale / 63 and dmin = max min / 63. nmax: 15 or 31. */
static void s_q_kaffine(const float *x, uint8_t *b, int nmax, uint8_t *qout /* [256] levels */) {
    float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < 8; s++) {
        const float *xs = x + 32 * s;
        float lo = 0.0f, hi = xs[0];
        for (int l = 0; l < 32; l++) {
            if (xs[l] < lo) lo = xs[l];
            if (xs[l] > hi) hi = xs[l];
        }
        if (hi < lo) hi = lo;
        scale[s] = (hi - lo) / (float)nmax;
        mins[s] = -lo;
        if (scale[s] > max_scale) max_scale = scale[s];
        if (mins[s] > max_min) max_min = mins[s];
    }
    s_put_h(b, max_scale / 63.0f);
    s_put_h(b + 2, max_min / 63.0f);
    float d = s_h(b), dmin = s_h(b + 2);
    uint8_t *sc = b + 4;
    memset(sc, 0, 12);
    for (int s = 0; s < 8; s++) {
        int ls = d > 0.0f ? s_clampi((int)lrintf(scale[s] / d), 0, 63) : 0;
        int lm = dmin > 0.0f ? s_clampi((int)lrintf(mins[s] / dmin), 0, 63) : 0;
        if (s < 4) {
            sc[s] = (uint8_t)ls;
            sc[s + 4] = (uint8_t)lm;
        } else {
            sc[s + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            sc[s - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[s] |= (uint8_t)((lm >> 4) << 6);
        }
        float dl = d * (float)ls, ml = dmin * (float)lm, idl = dl > 0.0f ? 1.0f / dl : 0.0f;
        for (int l = 0; l < 32; l++)
            qout[32 * s + l] = (uint8_t)s_round_clamp((x[32 * s + l] + ml) * idl, 0, (float)nmax);
    }
}

static void s_q_q4_k(const float *x, uint8_t *b) {
    uint8_t q[QKK];
    s_q_kaffine(x, b, 15, q);
    uint8_t *qs = b + 16;
    for (int j = 0; j < QKK / 64; j++)
        for (int l = 0; l < 32; l++) qs[32 * j + l] = (uint8_t)(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
}

static void s_q_q5_k(const float *x, uint8_t *b) {
    uint8_t q[QKK];
    s_q_kaffine(x, b, 31, q);
    uint8_t *qh = b + 16, *ql = b + 48;
    memset(qh, 0, 32);
    for (int j = 0; j < QKK / 64; j++)
        for (int l = 0; l < 32; l++) {
            int q1 = q[64 * j + l], q2 = q[64 * j + 32 + l];
            ql[32 * j + l] = (uint8_t)((q1 & 0xf) | ((q2 & 0xf) << 4));
            qh[l] |= (uint8_t)(((q1 >> 4) << (2 * j)) | ((q2 >> 4) << (2 * j + 1)));
        }
}

/* Q6_K: per sub-block of 16 a symmetric scale amax/31 (levels -32..31), quantized to int8 against
 * d = max scale / 127. */
static void s_q_q6_k(const float *x, uint8_t *b) {
    float scale[16], max_scale = 0.0f;
    for (int s = 0; s < 16; s++) {
        float amax = 0.0f;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * s + l]) > amax) amax = fabsf(x[16 * s + l]);
        scale[s] = amax / 31.0f;
        if (scale[s] > max_scale) max_scale = scale[s];
    }
    s_put_h(b + 208, max_scale / 127.0f);
    float d = s_h(b + 208);
    int8_t *sc = (int8_t *)(b + 192);
    uint8_t q[QKK];
    for (int s = 0; s < 16; s++) {
        int ls = d > 0.0f ? s_clampi((int)lrintf(scale[s] / d), 0, 127) : 0;
        sc[s] = (int8_t)ls;
        float dl = d * (float)ls, idl = dl > 0.0f ? 1.0f / dl : 0.0f;
        for (int l = 0; l < 16; l++) q[16 * s + l] = (uint8_t)(s_round_clamp(x[16 * s + l] * idl, -32, 31) + 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    memset(qh, 0, 64);
    for (int n = 0; n < 2; n++) {
        const uint8_t *qq = q + 128 * n;
        uint8_t *l8 = ql + 64 * n, *h8 = qh + 32 * n;
        for (int l = 0; l < 32; l++) {
            int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
            l8[l] = (uint8_t)((q1 & 0xf) | ((q3 & 0xf) << 4));
            l8[l + 32] = (uint8_t)((q2 & 0xf) | ((q4 & 0xf) << 4));
            h8[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

/* ------------------------------------------------------------------------------------------------------
 * dispatch */

typedef struct {
    int block;                                 /* elements per block (1 for the float types) */
    int bytes;                                 /* bytes per block */
    void (*deq)(const uint8_t *b, float *y);   /* one block; NULL for the float types */
    void (*quant)(const float *x, uint8_t *b); /* one block; NULL for the float types */
} s_qtype;

static int s_traits(ggml_type t, s_qtype *q) {
    switch (t) {
    case GGML_F32: *q = (s_qtype){1, 4, NULL, NULL}; return 0;
    case GGML_F16: *q = (s_qtype){1, 2, NULL, NULL}; return 0;
    case GGML_BF16: *q = (s_qtype){1, 2, NULL, NULL}; return 0;
    case GGML_Q4_0: *q = (s_qtype){QK, 18, s_deq_q4_0, s_q_q4_0}; return 0;
    case GGML_Q4_1: *q = (s_qtype){QK, 20, s_deq_q4_1, s_q_q4_1}; return 0;
    case GGML_Q5_0: *q = (s_qtype){QK, 22, s_deq_q5_0, s_q_q5_0}; return 0;
    case GGML_Q5_1: *q = (s_qtype){QK, 24, s_deq_q5_1, s_q_q5_1}; return 0;
    case GGML_Q8_0: *q = (s_qtype){QK, 34, s_deq_q8_0, s_q_q8_0}; return 0;
    case GGML_Q4_K: *q = (s_qtype){QKK, 144, s_deq_q4_k, s_q_q4_k}; return 0;
    case GGML_Q5_K: *q = (s_qtype){QKK, 176, s_deq_q5_k, s_q_q5_k}; return 0;
    case GGML_Q6_K: *q = (s_qtype){QKK, 210, s_deq_q6_k, s_q_q6_k}; return 0;
    default: return -1;
    }
}

int quant_supported(ggml_type t) {
    s_qtype q;
    return s_traits(t, &q) == 0;
}

int quant_dequant_row(ggml_type t, const void *src, float *dst, int64_t n) {
    s_qtype q;
    if (s_traits(t, &q) != 0 || n < 0 || n % q.block != 0) return -1;
    const uint8_t *p = src;
    switch (t) {
    case GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case GGML_F16: s_row_f16(p, dst, n); return 0;
    case GGML_BF16: s_row_bf16(p, dst, n); return 0;
    default:
        for (int64_t i = 0; i < n / q.block; i++) q.deq(p + i * q.bytes, dst + i * q.block);
        return 0;
    }
}

int quant_quantize_row(ggml_type t, const float *src, void *dst, int64_t n) {
    s_qtype q;
    if (s_traits(t, &q) != 0 || n < 0 || n % q.block != 0) return -1;
    uint8_t *p = dst;
    switch (t) {
    case GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case GGML_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = f32_to_fp16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    default:
        for (int64_t i = 0; i < n / q.block; i++) q.quant(src + i * q.block, p + i * q.bytes);
        return 0;
    }
}

/* 8 independent partial sums so the compiler can keep them in vector registers (n % 8 == 0 here) */
static inline void s_dot8(const float *a, const float *x, int n, float acc[8]) {
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * x[i + k];
}

static inline float s_sum8(const float acc[8]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float quant_dot_row(ggml_type t, const void *row, const float *x, int64_t n) {
    s_qtype q;
    if (s_traits(t, &q) != 0 || n < 0 || n % q.block != 0) return NAN;
    float acc[8] = {0};
    float buf[QKK];
    const uint8_t *p = row;
    if (q.deq) {
        for (int64_t i = 0; i < n / q.block; i++) {
            q.deq(p + i * q.bytes, buf);
            s_dot8(buf, x + i * q.block, q.block, acc);
        }
        return s_sum8(acc);
    }
    /* float types: convert QKK at a time, then a scalar tail */
    int64_t i = 0;
    if (t == GGML_F32) {
        for (; i + QKK <= n; i += QKK) s_dot8((const float *)row + i, x + i, QKK, acc);
        memcpy(buf, (const float *)row + i, (size_t)(n - i) * 4);
    } else {
        for (; i + QKK <= n; i += QKK) {
            quant_dequant_row(t, p + 2 * i, buf, QKK);
            s_dot8(buf, x + i, QKK, acc);
        }
        quant_dequant_row(t, p + 2 * i, buf, n - i);
    }
    float s = s_sum8(acc);
    for (int64_t j = 0; j < n - i; j++) s += buf[j] * x[i + j];
    return s;
}
