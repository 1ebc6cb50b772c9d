/* engine/cpu_attn.c: attention of one query head for the fast CPU engine. The AVX2 path computes scores for 8
 * keys at a time (8 accumulators reduced together), exponentials with a vectorized exp (Cephes polynomial,
 * about 1 ulp: the softmax differs from the reference's expf by rounding only), and the weighted sum of values
 * with the output held in registers 64 dims at a time. */
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "cpu_attn.h"
#include "cpu_qdot.h"

#define S_AVX2 __attribute__((target("avx2,fma")))

static void s_attn_c(const float *q, int hd, const float *k, const float *v, const size_t *off, int n_keys, float scale,
                     float *att, float *out) {
    float mx = -INFINITY;
    for (int p = 0; p < n_keys; p++) {
        att[p] = qdot_f32(QDOT_SCALAR, q, k + off[p], hd) * scale;
        if (att[p] > mx) mx = att[p];
    }
    float sum = 0.0f;
    for (int p = 0; p < n_keys; p++) {
        att[p] = expf(att[p] - mx);
        sum += att[p];
    }
    const float inv = 1.0f / sum;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int p = 0; p < n_keys; p++) qdot_axpy(QDOT_SCALAR, out, att[p] * inv, v + off[p], hd);
}

static inline S_AVX2 float s_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial) */
static inline S_AVX2 __m256 s_exp(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static S_AVX2 void s_attn_avx2(const float *q, int hd, const float *k, const float *v, const size_t *off, int n_keys,
                               float scale, float *att, float *out) {
    const int nc = hd / 8;
    int p = 0;
    /* scores, 8 keys at a time: a[j] accumulates key p + j, then the 8 sums are reduced into one vector */
    for (; p + 8 <= n_keys; p += 8) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const __m256 qc = _mm256_loadu_ps(q + 8 * c);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + off[p + j] + 8 * c), a[j]);
        }
        const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
        const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
        const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
        const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
        _mm256_storeu_ps(att + p, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
    }
    for (; p < n_keys; p++) {
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(k + off[p] + 8 * c), a);
        att[p] = s_hsum(a) * scale;
    }
    /* softmax */
    float mx = -INFINITY;
    for (p = 0; p < n_keys; p++) mx = att[p] > mx ? att[p] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vs = _mm256_setzero_ps();
    for (p = 0; p + 8 <= n_keys; p += 8) {
        const __m256 e = s_exp(_mm256_sub_ps(_mm256_loadu_ps(att + p), vmx));
        _mm256_storeu_ps(att + p, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = s_hsum(vs);
    for (; p < n_keys; p++) {
        att[p] = expf(att[p] - mx);
        sum += att[p];
    }
    const float inv = 1.0f / sum;
    /* out = sum_p att[p] * inv * v[p], 64 dims at a time in registers, then 8 at a time */
    int c0 = 0;
    for (; c0 + 8 <= nc; c0 += 8) {
        __m256 o[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) o[c] = _mm256_setzero_ps();
        for (p = 0; p < n_keys; p++) {
            const __m256 w = _mm256_set1_ps(att[p] * inv);
            const float *vp = v + off[p] + 8 * c0;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp + 8 * c), o[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + 8 * (c0 + c), o[c]);
    }
    for (; c0 < nc; c0++) {
        __m256 o = _mm256_setzero_ps();
        for (p = 0; p < n_keys; p++)
            o = _mm256_fmadd_ps(_mm256_set1_ps(att[p] * inv), _mm256_loadu_ps(v + off[p] + 8 * c0), o);
        _mm256_storeu_ps(out + 8 * c0, o);
    }
}

void cpu_attn_head(int isa, const float *q, int hd, const float *k, const float *v, const size_t *off, int n_keys,
                   float scale, float *att, float *out) {
    if (isa >= QDOT_AVX2 && hd % 8 == 0) s_attn_avx2(q, hd, k, v, off, n_keys, scale, att, out);
    else s_attn_c(q, hd, k, v, off, n_keys, scale, att, out);
}
