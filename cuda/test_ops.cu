/* cuda/test_ops.cu -> gpu_test_ops: every kernel of cuda/ops.h against a CPU reference (double precision) on
 * fresh random inputs of several shapes, with outputs poisoned (all bits set: NaN in every type) before each
 * run. Pass: relative error ||gpu - ref|| / ||ref|| <= 1e-5 for f32 outputs, 1e-2 for bf16/f16 outputs, and
 * every element finite (an unwritten element stays NaN). The dual-output variants (qgemv inputs) are checked for
 * exact agreement with the single-output functions. Needs a CUDA GPU. */
extern "C" {
#include "quant.h"
#include "test.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_common.h"
#include "ops.h"

static char err[256];
static const size_t errlen = sizeof err;
static uint64_t s_rng = 0x9E3779B97F4A7C15ull;

static float frand(void) {   /* uniform in [-1, 1) */
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    return (float)((s_rng >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}

/* host value of element i of a typed buffer */
static double hget(const void *p, cu_dtype t, size_t i) {
    if (t == CU_F32) return ((const float *)p)[i];
    if (t == CU_F16) return fp16_to_f32(((const uint16_t *)p)[i]);
    return bf16_to_f32(((const uint16_t *)p)[i]);
}
static void hset(void *p, cu_dtype t, size_t i, float v) {
    if (t == CU_F32) ((float *)p)[i] = v;
    else if (t == CU_F16) ((uint16_t *)p)[i] = f32_to_fp16(v);
    else ((uint16_t *)p)[i] = f32_to_bf16(v);
}
static double tol_of(cu_dtype t) { return t == CU_F32 ? 1e-5 : 1e-2; }

/* device buffer of n elements of t, filled from host h (or poisoned when h is NULL) */
static void *dnew(const void *h, cu_dtype t, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n * ops_dtype_size(t) + 16) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(2); }
    if (h) cudaMemcpy(d, h, n * ops_dtype_size(t), cudaMemcpyHostToDevice);
    else cudaMemset(d, 0xFF, n * ops_dtype_size(t));
    return d;
}

/* compares a device buffer of type t against ref; returns the relative error (inf when any value is not finite) */
static double cmp_tol(const char *what, const void *d, cu_dtype t, const double *ref, size_t n, double tol) {
    void *h = malloc(n * ops_dtype_size(t));
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce == cudaSuccess) ce = cudaMemcpy(h, d, n * ops_dtype_size(t), cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    int bad = ce != cudaSuccess;
    for (size_t i = 0; i < n && !bad; i++) {
        const double g = hget(h, t, i);
        if (!isfinite(g)) { bad = 1; break; }
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    free(h);
    const double rel = bad ? INFINITY : sqrt(num / (den > 0 ? den : 1e-300));
    CHECK(rel <= tol, "%s (%s): rel err %.3g > %.0e%s", what, ops_dtype_name(t), rel, tol,
          ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    if (getenv("ZLLM_TEST_VERBOSE")) printf("  %-40s %-5s rel err %.3g\n", what, ops_dtype_name(t), rel);
    return rel;
}
static double cmp(const char *what, const void *d, cu_dtype t, const double *ref, size_t n) {
    return cmp_tol(what, d, t, ref, n, tol_of(t));
}

static float *hrand(size_t n) {
    float *h = (float *)malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = frand();
    return h;
}

/* typed host copy of f32 values, and the values as they are after rounding to t */
static void *htyped(const float *src, cu_dtype t, size_t n, double *rounded) {
    void *h = malloc(n * ops_dtype_size(t) + 4);
    for (size_t i = 0; i < n; i++) { hset(h, t, i, src[i]); if (rounded) rounded[i] = hget(h, t, i); }
    return h;
}

static const cu_dtype s_types[] = {CU_F32, CU_F16, CU_BF16};

static void test_embed(int vocab, int dim, int rows) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        float *tab = hrand((size_t)vocab * dim);
        double *tr = (double *)malloc(sizeof(double) * vocab * dim), *ref = (double *)malloc(sizeof(double) * rows * dim);
        void *ht = htyped(tab, t, (size_t)vocab * dim, tr);
        int32_t *tok = (int32_t *)malloc(rows * 4);
        for (int r = 0; r < rows; r++) tok[r] = (int32_t)((frand() * 0.5f + 0.5f) * (vocab - 1));
        for (int r = 0; r < rows; r++) for (int i = 0; i < dim; i++) ref[(size_t)r * dim + i] = tr[(size_t)tok[r] * dim + i];
        void *dt = dnew(ht, t, (size_t)vocab * dim), *dtok = dnew(tok, CU_F32, rows), *dout = dnew(NULL, CU_F32, (size_t)rows * dim);
        CHECK(ops_embed(dt, t, dim, (int32_t *)dtok, rows, (float *)dout, 0, err, errlen) == 0, "embed: %s", err);
        cmp("embed", dout, CU_F32, ref, (size_t)rows * dim);
        cudaFree(dt); cudaFree(dtok); cudaFree(dout); free(tab); free(tr); free(ref); free(ht); free(tok);
    }
}

static void test_rmsnorm(int dim, int rows, int gather) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        float *x = hrand((size_t)rows * dim), *w = hrand(dim);
        int32_t *idx = (int32_t *)malloc(rows * 4);
        for (int r = 0; r < rows; r++) idx[r] = gather ? rows - 1 - r : r;
        double *ref = (double *)malloc(sizeof(double) * rows * dim);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)idx[r] * dim;
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
            const double sc = 1.0 / sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; i++) ref[(size_t)r * dim + i] = xr[i] * sc * w[i];
        }
        void *dx = dnew(x, CU_F32, (size_t)rows * dim), *dw = dnew(w, CU_F32, dim), *di = dnew(idx, CU_F32, rows);
        void *dout = dnew(NULL, t, (size_t)rows * dim);
        CHECK(ops_rmsnorm((float *)dx, gather ? (int32_t *)di : NULL, (float *)dw, dim, 1e-5f, rows, dout, t, 0, err,
                          errlen) == 0, "rmsnorm: %s", err);
        cmp(gather ? "rmsnorm(gather)" : "rmsnorm", dout, t, ref, (size_t)rows * dim);
        cudaFree(dx); cudaFree(dw); cudaFree(di); cudaFree(dout); free(x); free(w); free(idx); free(ref);
    }
}

static void test_bias_residual(int rows, int n) {
    const size_t N = (size_t)rows * n;
    float *y = hrand(N), *b = hrand(n), *z = hrand(N);
    double *ref = (double *)malloc(sizeof(double) * N);
    for (size_t i = 0; i < N; i++) ref[i] = (double)y[i] + b[i % n];
    void *dy = dnew(y, CU_F32, N), *db = dnew(b, CU_F32, n), *dz = dnew(z, CU_F32, N);
    CHECK(ops_bias_add((float *)dy, (float *)db, rows, n, 0, err, errlen) == 0, "bias: %s", err);
    cmp("bias_add", dy, CU_F32, ref, N);
    for (size_t i = 0; i < N; i++) ref[i] = (double)(float)((double)y[i] + b[i % n]) + z[i];
    CHECK(ops_residual_add((float *)dy, (float *)dz, N, 0, err, errlen) == 0, "residual: %s", err);
    cmp("residual_add", dy, CU_F32, ref, N);
    cudaFree(dy); cudaFree(db); cudaFree(dz); free(y); free(b); free(z); free(ref);
}

static void test_rope(int rows, int n_heads, int head_dim, int rope_dim, int style, int n_pos) {
    const size_t N = (size_t)rows * n_heads * head_dim;
    float *x = hrand(N);
    float *cs = (float *)malloc((size_t)n_pos * rope_dim * 4);
    ops_rope_table_host(cs, n_pos, rope_dim, 500000.0);
    int32_t *pos = (int32_t *)malloc(rows * 4);
    for (int r = 0; r < rows; r++) pos[r] = (int32_t)((frand() * 0.5f + 0.5f) * (n_pos - 1));
    double *ref = (double *)malloc(sizeof(double) * N);
    for (size_t i = 0; i < N; i++) ref[i] = x[i];
    const int half = rope_dim / 2;
    for (int r = 0; r < rows; r++) for (int h = 0; h < n_heads; h++) for (int i = 0; i < half; i++) {
        double *hp = ref + ((size_t)r * n_heads + h) * head_dim;
        const double a = pos[r] * pow(500000.0, -2.0 * i / rope_dim), c = cos(a), s = sin(a);
        const int ia = style == 0 ? 2 * i : i, ib = style == 0 ? 2 * i + 1 : i + half;
        const double x0 = hp[ia], x1 = hp[ib];
        hp[ia] = x0 * c - x1 * s;
        hp[ib] = x0 * s + x1 * c;
    }
    void *dx = dnew(x, CU_F32, N), *dcs = dnew(cs, CU_F32, (size_t)n_pos * rope_dim), *dp = dnew(pos, CU_F32, rows);
    CHECK(ops_rope((float *)dx, (int32_t *)dp, rows, n_heads, head_dim, rope_dim, style, (float *)dcs, 0, err,
                   errlen) == 0, "rope: %s", err);
    char what[64];
    snprintf(what, sizeof what, "rope(style %d, hd %d, rd %d)", style, head_dim, rope_dim);
    cmp(what, dx, CU_F32, ref, N);
    cudaFree(dx); cudaFree(dcs); cudaFree(dp); free(x); free(cs); free(pos); free(ref);
}

static void test_kv_append(int rows, int kv_dim, int n_slots, int n_ctx) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        const size_t N = (size_t)rows * kv_dim, C = (size_t)n_slots * n_ctx * kv_dim;
        float *k = hrand(N), *v = hrand(N);
        int32_t *slot = (int32_t *)malloc(rows * 4), *pos = (int32_t *)malloc(rows * 4);
        for (int r = 0; r < rows; r++) { slot[r] = r % n_slots; pos[r] = r / n_slots; }   /* distinct cells */
        void *dk = dnew(k, CU_F32, N), *dv = dnew(v, CU_F32, N), *ds = dnew(slot, CU_F32, rows), *dp = dnew(pos, CU_F32, rows);
        void *kc = dnew(NULL, t, C), *vc = dnew(NULL, t, C);
        CHECK(ops_kv_append((float *)dk, (float *)dv, (int32_t *)ds, (int32_t *)dp, rows, kv_dim, n_ctx, kc, vc, t, 0,
                            err, errlen) == 0, "kv_append: %s", err);
        /* compare exactly the written cells, read back through a gather on the host */
        void *hk = malloc(C * ops_dtype_size(t)), *hv = malloc(C * ops_dtype_size(t));
        cudaDeviceSynchronize();
        cudaMemcpy(hk, kc, C * ops_dtype_size(t), cudaMemcpyDeviceToHost);
        cudaMemcpy(hv, vc, C * ops_dtype_size(t), cudaMemcpyDeviceToHost);
        double num = 0, den = 0;
        int bad = 0;
        for (int r = 0; r < rows; r++) for (int i = 0; i < kv_dim; i++) {
            const size_t c = ((size_t)slot[r] * n_ctx + pos[r]) * kv_dim + i;
            const double gk = hget(hk, t, c), gv = hget(hv, t, c);
            if (!isfinite(gk) || !isfinite(gv)) bad = 1;
            num += (gk - k[(size_t)r * kv_dim + i]) * (gk - k[(size_t)r * kv_dim + i]) +
                   (gv - v[(size_t)r * kv_dim + i]) * (gv - v[(size_t)r * kv_dim + i]);
            den += (double)k[(size_t)r * kv_dim + i] * k[(size_t)r * kv_dim + i] + (double)v[(size_t)r * kv_dim + i] * v[(size_t)r * kv_dim + i];
        }
        /* and that nothing else was written: every other cell still holds the poison */
        size_t touched = 0;
        for (size_t c = 0; c < C; c++) touched += isfinite(hget(hk, t, c)) ? 1 : 0;
        const double rel = bad ? INFINITY : sqrt(num / den);
        CHECK(rel <= tol_of(t), "kv_append (%s): rel err %.3g", ops_dtype_name(t), rel);
        CHECK(touched == N, "kv_append (%s): %zu cells written, expected %zu", ops_dtype_name(t), touched, N);
        cudaFree(dk); cudaFree(dv); cudaFree(ds); cudaFree(dp); cudaFree(kc); cudaFree(vc);
        free(k); free(v); free(slot); free(pos); free(hk); free(hv);
    }
}

static void test_swiglu(int rows, int n) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        const size_t N = (size_t)rows * n;
        float *g = hrand(N), *u = hrand(N);
        for (size_t i = 0; i < N; i++) g[i] *= 6.f;
        double *ref = (double *)malloc(sizeof(double) * N);
        for (size_t i = 0; i < N; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        void *dg = dnew(g, CU_F32, N), *du = dnew(u, CU_F32, N), *dout = dnew(NULL, t, N);
        CHECK(ops_swiglu((float *)dg, (float *)du, rows, n, dout, t, 0, err, errlen) == 0, "swiglu: %s", err);
        cmp("swiglu", dout, t, ref, N);
        cudaFree(dg); cudaFree(du); cudaFree(dout); free(g); free(u); free(ref);
    }
}

static void test_convert(size_t n) {
    for (int a = 0; a < 3; a++) for (int b = 0; b < 3; b++) {
        const cu_dtype st = s_types[a], dt = s_types[b];
        float *x = hrand(n);
        double *r = (double *)malloc(sizeof(double) * n);
        void *hs = htyped(x, st, n, r);
        void *ds = dnew(hs, st, n), *dd = dnew(NULL, dt, n);
        CHECK(ops_convert(ds, st, dd, dt, n, 0, err, errlen) == 0, "convert: %s", err);
        char what[48];
        snprintf(what, sizeof what, "convert %s->%s", ops_dtype_name(st), ops_dtype_name(dt));
        cmp(what, dd, dt, r, n);
        cudaFree(ds); cudaFree(dd); free(x); free(r); free(hs);
    }
}

static void test_gemm(cublasHandle_t h, int rows, int n_in, int n_out) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        float *x = hrand((size_t)rows * n_in), *w = hrand((size_t)n_out * n_in), *y0 = hrand((size_t)rows * n_out);
        double *xr = (double *)malloc(sizeof(double) * rows * n_in), *wr = (double *)malloc(sizeof(double) * n_out * n_in);
        double *ref = (double *)malloc(sizeof(double) * rows * n_out);
        void *hx = htyped(x, t, (size_t)rows * n_in, xr), *hw = htyped(w, t, (size_t)n_out * n_in, wr);
        for (int beta = 0; beta < 2; beta++) {
            for (int r = 0; r < rows; r++) for (int o = 0; o < n_out; o++) {
                double s = beta ? y0[(size_t)r * n_out + o] : 0;
                for (int i = 0; i < n_in; i++) s += xr[(size_t)r * n_in + i] * wr[(size_t)o * n_in + i];
                ref[(size_t)r * n_out + o] = s;
            }
            void *dx = dnew(hx, t, (size_t)rows * n_in), *dw = dnew(hw, t, (size_t)n_out * n_in);
            void *dy = dnew(beta ? y0 : NULL, CU_F32, (size_t)rows * n_out);
            CHECK(ops_gemm(h, dx, dw, t, rows, n_in, n_out, (float *)dy, (float)beta, err, errlen) == 0, "gemm: %s", err);
            char what[64];
            snprintf(what, sizeof what, "gemm %dx%dx%d beta %d in %s", rows, n_in, n_out, beta, ops_dtype_name(t));
            /* the reference uses the same rounded 16-bit inputs; products are exact and sums f32 on the tensor
             * cores, so 16-bit products are held to 1e-4, f32 ones to 1e-5 */
            cmp_tol(what, dy, CU_F32, ref, (size_t)rows * n_out, t == CU_F32 ? 1e-5 : 1e-4);
            cudaFree(dx); cudaFree(dw); cudaFree(dy);
        }
        free(x); free(w); free(y0); free(xr); free(wr); free(ref); free(hx); free(hw);
    }
}

/* 1 when device buffers a (type ta) and b (type tb) hold exactly equal finite values (NaN: unwritten) */
static int same_vals(const char *what, const void *a, cu_dtype ta, const void *b, cu_dtype tb, size_t n) {
    void *ha = malloc(n * ops_dtype_size(ta) + 4), *hb = malloc(n * ops_dtype_size(tb) + 4);
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce == cudaSuccess) ce = cudaMemcpy(ha, a, n * ops_dtype_size(ta), cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(hb, b, n * ops_dtype_size(tb), cudaMemcpyDeviceToHost);
    size_t bad = n;
    for (size_t i = 0; i < n && ce == cudaSuccess; i++) {
        const double x = hget(ha, ta, i), y = hget(hb, tb, i);
        if (!isfinite(x) || x != y) { bad = i; break; }
    }
    CHECK(ce == cudaSuccess && bad == n, "%s (%s): differs at element %zu%s", what, ops_dtype_name(ta), bad,
          ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    free(ha); free(hb);
    return ce == cudaSuccess && bad == n;
}

/* the dual-output variants (qgemv inputs): the typed output is bitwise the single-output function's, the f32
 * output holds exactly those rounded values (round_f 1) or the f32 function's values (round_f 0); each output
 * may be left out; the cast may round in place */
static void test_dual(int rows, int n) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        const size_t N = (size_t)rows * n;
        float *x = hrand(N), *w = hrand(n), *g = hrand(N), *u = hrand(N);
        void *dx = dnew(x, CU_F32, N), *dw = dnew(w, CU_F32, n), *dg = dnew(g, CU_F32, N), *du = dnew(u, CU_F32, N);
        void *o1 = dnew(NULL, t, N), *o32 = dnew(NULL, CU_F32, N), *o2 = dnew(NULL, t, N);
        void *f2 = dnew(NULL, CU_F32, N), *f3 = dnew(NULL, CU_F32, N);
        /* RMSNorm */
        CHECK(ops_rmsnorm((float *)dx, NULL, (float *)dw, n, 1e-5f, rows, o1, t, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_rmsnorm((float *)dx, NULL, (float *)dw, n, 1e-5f, rows, o32, CU_F32, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_rmsnorm_dual((float *)dx, NULL, (float *)dw, n, 1e-5f, rows, o2, t, (float *)f2, 1, 0, err,
                               errlen) == 0, "%s", err);
        CHECK(ops_rmsnorm_dual((float *)dx, NULL, (float *)dw, n, 1e-5f, rows, NULL, t, (float *)f3, 0, 0, err,
                              errlen) == 0, "%s", err);
        same_vals("rmsnorm_dual typed == rmsnorm", o2, t, o1, t, N);
        same_vals("rmsnorm_dual f32 (rounded) == typed", f2, CU_F32, o1, t, N);
        same_vals("rmsnorm_dual f32 (unrounded) == rmsnorm f32", f3, CU_F32, o32, CU_F32, N);
        /* SwiGLU */
        cudaMemset(o2, 0xFF, N * ops_dtype_size(t)); cudaMemset(f2, 0xFF, N * 4); cudaMemset(f3, 0xFF, N * 4);
        CHECK(ops_swiglu((float *)dg, (float *)du, rows, n, o1, t, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu((float *)dg, (float *)du, rows, n, o32, CU_F32, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, rows, n, o2, t, (float *)f2, 1, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, rows, n, NULL, t, (float *)f3, 0, 0, err, errlen) == 0, "%s",
              err);
        same_vals("swiglu_dual typed == swiglu", o2, t, o1, t, N);
        same_vals("swiglu_dual f32 (rounded) == typed", f2, CU_F32, o1, t, N);
        same_vals("swiglu_dual f32 (unrounded) == swiglu f32", f3, CU_F32, o32, CU_F32, N);
        /* cast: typed output == ops_convert; in-place rounding of the source == the typed values */
        cudaMemset(o2, 0xFF, N * ops_dtype_size(t));
        CHECK(ops_convert(dg, CU_F32, o1, t, N, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_cast_dual((float *)dg, N, o2, t, (float *)dg, 1, 0, err, errlen) == 0, "%s", err);
        same_vals("cast_dual typed == convert", o2, t, o1, t, N);
        same_vals("cast_dual in-place rounding == typed", dg, CU_F32, o1, t, N);
        cudaFree(dx); cudaFree(dw); cudaFree(dg); cudaFree(du); cudaFree(o1); cudaFree(o32); cudaFree(o2);
        cudaFree(f2); cudaFree(f3); free(x); free(w); free(g); free(u);
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "gpu_test_ops: no CUDA device\n");
        CHECK(0, "no CUDA device");
        return test_report();
    }
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { CHECK(0, "cublasCreate"); return test_report(); }
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    test_embed(512, 64, 7);
    test_embed(1000, 576, 33);
    test_rmsnorm(64, 5, 0);
    test_rmsnorm(576, 17, 1);
    test_rmsnorm(4096, 3, 0);
    test_bias_residual(9, 896);
    test_bias_residual(1, 64);
    test_rope(7, 8, 8, 8, 0, 512);
    test_rope(13, 32, 128, 128, 1, 4096);
    test_rope(5, 4, 64, 32, 0, 100000);
    test_rope(5, 4, 64, 64, 1, 100000);
    test_kv_append(12, 32, 4, 8);
    test_kv_append(40, 1024, 8, 16);
    test_swiglu(3, 172);
    test_swiglu(17, 1536);
    test_convert(1000);
    test_convert((size_t)1 << 20);
    test_dual(5, 576);
    test_dual(3, 4096);
    test_gemm(h, 1, 64, 172);
    test_gemm(h, 7, 576, 192);
    test_gemm(h, 33, 256, 512);
    cublasDestroy(h);
    const cudaError_t ce = cudaDeviceSynchronize();
    CHECK(ce == cudaSuccess, "device error at the end: %s", cudaGetErrorString(ce));
    return test_report();
}
