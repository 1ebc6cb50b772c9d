/* cuda/test_ops.cu -> gpu_test_ops: every kernel of cuda/ops.h against a CPU reference (double precision) on fresh
 * random inputs of several shapes, with outputs poisoned (all bits set: NaN in every type) before each run. Pass:
 * relative error ||gpu - ref|| / ||ref|| <= 1e-5 for f32 outputs, 1e-2 for bf16/f16 outputs, and every element
 * finite (an unwritten element stays NaN). The dual-output variants (an f32 copy beside the typed output) are
 * checked for exact agreement with the single-output functions (RMSNorm also on gathered rows), the fused
 * ops_qkv_rope_append for the same bits as the chain it replaces (bias adds, two RoPEs, KV append), the strided
 * SwiGLU for the bits of the contiguous one, and ops_gemm's ldy for writing only its column slice,
 * ops_head_rmsnorm for leaving the other columns alone. Needs a CUDA GPU. */
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
#include "qtc.h"

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
        CHECK(ops_embed(dt, t, dim, (int32_t *)dtok, rows, (float *)dout, NULL, 0, err, errlen) == 0, "embed: %s", err);
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

/* per-head RMSNorm in place on the q columns [col0, col0 + n_heads * hd) of rows ld floats apart; the other
 * columns must keep their values */
static void test_head_rmsnorm(int rows, int n_heads, int hd, int ld, int col0) {
    const size_t n = (size_t)rows * ld;
    float *x = hrand(n), *w = hrand(hd);
    double *ref = (double *)malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) ref[i] = x[i];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_heads; h++) {
            const float *v = x + (size_t)r * ld + col0 + (size_t)h * hd;
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)v[i] * v[i];
            const double sc = 1.0 / sqrt(ss / hd + 1e-6);
            for (int i = 0; i < hd; i++) ref[(size_t)r * ld + col0 + (size_t)h * hd + i] = v[i] * sc * w[i];
        }
    void *dx = dnew(x, CU_F32, n), *dw = dnew(w, CU_F32, hd);
    CHECK(ops_head_rmsnorm((float *)dx + col0, ld, rows, n_heads, hd, (float *)dw, 1e-6f, 0, err, errlen) == 0,
          "head_rmsnorm: %s", err);
    char what[96];
    snprintf(what, sizeof what, "head_rmsnorm(%d heads of %d, ld %d, col %d)", n_heads, hd, ld, col0);
    cmp(what, dx, CU_F32, ref, n);
    cudaFree(dx);
    cudaFree(dw);
    free(x);
    free(w);
    free(ref);
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
            CHECK(ops_gemm(h, dx, dw, t, rows, n_in, n_out, (float *)dy, 0, (float)beta, err, errlen) == 0, "gemm: %s", err);
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

/* rows [rows][n] of f16 (device) against the same values as qtc's wgmma images of nx columns (device, written by
 * an *_ximage op): every element at its qtc_ximage_pos, bit for bit */
static void ximage_check(const char *what, const void *drows, const void *dimg, int rows, int n, int nx) {
    const size_t N = (size_t)rows * n, NI = (size_t)((rows + nx - 1) / nx) * nx * n;
    uint16_t *h1 = (uint16_t *)malloc(N * 2), *h2 = (uint16_t *)malloc(NI * 2);
    CHECK(cudaMemcpy(h1, drows, N * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
              cudaMemcpy(h2, dimg, NI * 2, cudaMemcpyDeviceToHost) == cudaSuccess,
          "copy back");
    size_t bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) bad += h1[(size_t)r * n + i] != h2[qtc_ximage_pos(nx, n / 256, r, i)];
    CHECK(bad == 0, "%s %d x %d, images of %d columns: %zu elements differ from the rows at their image positions",
          what, rows, n, nx, bad);
    free(h1);
    free(h2);
}

/* the dual-output variants (an f32 copy beside the typed output): the typed output is bitwise the single-output
 * function's, the f32 output holds exactly those rounded values (round_f 1) or the f32 function's values
 * (round_f 0); each output may be left out; the cast may round in place */
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
        /* the same values in qtc's 16-bit k order (rows of whole 256-element units, 16-bit outputs) */
        if (t != CU_F32 && ops_rmsnorm_kperm_serves(n, t)) {
            const size_t es = ops_dtype_size(t);
            CHECK(ops_rmsnorm_kperm((float *)dx, (float *)dw, n, 1e-5f, rows, f2, t, 0, err, errlen) == 0, "%s", err);
            uint8_t *h1 = (uint8_t *)malloc(N * es), *h2 = (uint8_t *)malloc(N * es);
            CHECK(cudaMemcpy(h1, o1, N * es, cudaMemcpyDeviceToHost) == cudaSuccess &&
                      cudaMemcpy(h2, f2, N * es, cudaMemcpyDeviceToHost) == cudaSuccess,
                  "copy back");
            size_t bad = 0;
            for (size_t i = 0; i < N; i++) {
                const size_t k = i % n, at = i - k + (k & ~(size_t)255) + qtc_kpos((int)(k & 255));
                bad += memcmp(h1 + i * es, h2 + at * es, es) != 0;
            }
            CHECK(bad == 0, "rmsnorm_kperm %s %d x %d: %zu elements differ from rmsnorm at their k position",
                  ops_dtype_name(t), rows, n, bad);
            free(h1);
            free(h2);
        } else if (n % 256 == 0 && t != CU_F32) {
            CHECK(0, "rmsnorm_kperm refuses %d elements of %s", n, ops_dtype_name(t));
        }
        /* the same values as qtc's wgmma images (F16 only: refused for BF16) */
        if (t != CU_F32 && ops_rmsnorm_kperm_serves(n, t)) {
            for (int nx : {32, 64, 128}) {
                void *img = dnew(NULL, t, (size_t)((rows + nx - 1) / nx) * nx * n);
                const int rc = ops_rmsnorm_ximage((float *)dx, (float *)dw, n, 1e-5f, rows, img, t, nx, 0, err, errlen);
                if (t == CU_F16) {
                    CHECK(rc == 0, "%s", err);
                    ximage_check("rmsnorm_ximage", o1, img, rows, n, nx);
                } else {
                    CHECK(rc != 0, "rmsnorm_ximage accepted %s", ops_dtype_name(t));
                }
                cudaFree(img);
            }
        }
        /* a qtc product's split partials summed into x before the norm (ops_rmsnorm_merge): x and the output as
         * the merge's sums (added in split order on the host) and then the norm give, in every layout */
        if (t != CU_F32 && ops_rmsnorm_kperm_serves(n, t) && !ops_rmsnorm_merge_serves(n, t)) {
            CHECK(ops_rmsnorm_merge((float *)dx, (float *)dg, 4, (float *)dw, n, 1e-5f, rows, o2, t, 0, 0, err,
                                    errlen) != 0,
                  "rmsnorm_merge accepted rows of %d", n);
        } else if (t != CU_F32 && ops_rmsnorm_kperm_serves(n, t)) {
            const int ks = 4;
            float *pp = hrand((size_t)ks * N), *xs = (float *)malloc(N * 4);
            for (size_t i = 0; i < N; i++) {
                float v = pp[i];
                for (int k = 1; k < ks; k++) v += pp[k * N + i];
                xs[i] = v + x[i];
            }
            void *dpp = dnew(pp, CU_F32, ks * N), *dxs = dnew(xs, CU_F32, N);
            for (int lay : {0, 1, 64}) {
                if (lay == 64 && t != CU_F16) continue;
                const size_t no = lay == 64 ? (size_t)((rows + 63) / 64) * 64 * n : N, es = ops_dtype_size(t);
                void *ref = dnew(NULL, t, no), *got = dnew(NULL, t, no), *dxm = dnew(x, CU_F32, N);
                const int rc =
                    lay == 0 ? ops_rmsnorm_dual((float *)dxs, NULL, (float *)dw, n, 1e-5f, rows, ref, t, NULL, 1, 0,
                                                err, errlen)
                    : lay == 1
                        ? ops_rmsnorm_kperm((float *)dxs, (float *)dw, n, 1e-5f, rows, ref, t, 0, err, errlen)
                        : ops_rmsnorm_ximage((float *)dxs, (float *)dw, n, 1e-5f, rows, ref, t, 64, 0, err, errlen);
                CHECK(rc == 0, "%s", err);
                CHECK(ops_rmsnorm_merge((float *)dxm, (float *)dpp, ks, (float *)dw, n, 1e-5f, rows, got, t, lay, 0,
                                        err, errlen) == 0,
                      "%s", err);
                uint8_t *h1 = (uint8_t *)malloc(no * es), *h2 = (uint8_t *)malloc(no * es);
                float *hx = (float *)malloc(N * 4);
                CHECK(cudaMemcpy(h1, ref, no * es, cudaMemcpyDeviceToHost) == cudaSuccess &&
                          cudaMemcpy(h2, got, no * es, cudaMemcpyDeviceToHost) == cudaSuccess &&
                          cudaMemcpy(hx, dxm, N * 4, cudaMemcpyDeviceToHost) == cudaSuccess,
                      "copy back");
                CHECK(memcmp(h1, h2, no * es) == 0 && memcmp(hx, xs, N * 4) == 0,
                      "rmsnorm_merge %s %d x %d layout %d: differs from the sums then the norm", ops_dtype_name(t),
                      rows, n, lay);
                free(h1);
                free(h2);
                free(hx);
                cudaFree(ref);
                cudaFree(got);
                cudaFree(dxm);
            }
            CHECK(ops_rmsnorm_merge((float *)dxs, (float *)dpp, 9, (float *)dw, n, 1e-5f, rows, o2, t, 0, 0, err,
                                    errlen) != 0,
                  "rmsnorm_merge accepted 9 partials");
            free(pp);
            free(xs);
            cudaFree(dpp);
            cudaFree(dxs);
        }
        /* gathered rows (the engine's sampled rows), in reverse order */
        int32_t *idx = (int32_t *)malloc((size_t)rows * 4);
        for (int r = 0; r < rows; r++) idx[r] = rows - 1 - r;
        void *di = dnew(idx, CU_F32, rows); /* 4-byte elements copied as they are */
        CHECK(ops_rmsnorm((float *)dx, (int32_t *)di, (float *)dw, n, 1e-5f, rows, o1, t, 0, err, errlen) == 0, "%s",
              err);
        CHECK(ops_rmsnorm_dual((float *)dx, (int32_t *)di, (float *)dw, n, 1e-5f, rows, o2, t, NULL, 0, 0, err,
                               errlen) == 0,
              "%s", err);
        same_vals("rmsnorm_dual gathered == rmsnorm gathered", o2, t, o1, t, N);
        cudaFree(di);
        free(idx);
        /* SwiGLU */
        cudaMemset(o2, 0xFF, N * ops_dtype_size(t)); cudaMemset(f2, 0xFF, N * 4); cudaMemset(f3, 0xFF, N * 4);
        CHECK(ops_swiglu((float *)dg, (float *)du, rows, n, o1, t, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu((float *)dg, (float *)du, rows, n, o32, CU_F32, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, 0, rows, n, o2, t, (float *)f2, 1, 0, err, errlen) == 0, "%s", err);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, 0, rows, n, NULL, t, (float *)f3, 0, 0, err, errlen) == 0, "%s",
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

/* 1 when n bytes of device buffers a and b are identical (poison included) */
static int same_bits(const char *what, const void *a, const void *b, size_t n) {
    uint8_t *ha = (uint8_t *)malloc(n + 1), *hb = (uint8_t *)malloc(n + 1);
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce == cudaSuccess) ce = cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost);
    size_t bad = n;
    for (size_t i = 0; i < n && ce == cudaSuccess; i++) if (ha[i] != hb[i]) { bad = i; break; }
    CHECK(ce == cudaSuccess && bad == n, "%s: differs at byte %zu of %zu%s", what, bad, n,
          ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    free(ha); free(hb);
    return ce == cudaSuccess && bad == n;
}

/* finite elements of a device buffer of n elements of t */
static size_t count_finite(const void *d, cu_dtype t, size_t n) {
    void *h = malloc(n * ops_dtype_size(t) + 4);
    size_t k = 0;
    if (cudaMemcpy(h, d, n * ops_dtype_size(t), cudaMemcpyDeviceToHost) == cudaSuccess)
        for (size_t i = 0; i < n; i++) k += isfinite(hget(h, t, i)) ? 1 : 0;
    free(h);
    return k;
}

/* ops_qkv_rope_append against the chain it replaces (ops_bias_add for each bias, ops_rope on q and on k,
 * ops_kv_append) on the same products, rows ld floats apart: q and both caches must be the same bits, for every
 * cache type, with and without biases. The last n_pad rows are padded rows as the engine stages them (sentinel
 * slot n_slots, position 0, the same values in each, so the sentinel cell's content does not depend on which
 * row writes last); the real rows write distinct cells at high positions (large rotation angles). */
static void test_qkv_rope_append(int rows, int n_pad, int n_heads, int n_kv, int head_dim, int rope_dim, int style,
                                 int extra_ld, int n_slots, int n_ctx) {
    const int qd = n_heads * head_dim, kvd = n_kv * head_dim, ld = qd + 2 * kvd + extra_ld;
    const size_t C = (size_t)(n_slots + 1) * n_ctx * kvd;   /* the sentinel slot included */
    /* the products as the sums of 4 split partials in split order (a.part's form), the padded rows' the same */
    const int ks = 4;
    const size_t np = (size_t)rows * ld;
    float *pp = hrand(ks * np), *qkv = (float *)malloc(np * 4), *bias = hrand((size_t)qd + 2 * kvd);
    for (int k = 0; k < ks; k++)
        for (int r = rows - n_pad + 1; r < rows; r++)
            memcpy(pp + k * np + (size_t)r * ld, pp + k * np + (size_t)(rows - n_pad) * ld, (size_t)ld * 4);
    for (size_t i = 0; i < np; i++) {
        float v = pp[i];
        for (int k = 1; k < ks; k++) v += pp[k * np + i];
        qkv[i] = v;
    }
    float *q = (float *)malloc((size_t)rows * qd * 4), *k = (float *)malloc((size_t)rows * kvd * 4);
    float *v = (float *)malloc((size_t)rows * kvd * 4);
    for (int r = 0; r < rows; r++) {
        memcpy(q + (size_t)r * qd, qkv + (size_t)r * ld, (size_t)qd * 4);
        memcpy(k + (size_t)r * kvd, qkv + (size_t)r * ld + qd, (size_t)kvd * 4);
        memcpy(v + (size_t)r * kvd, qkv + (size_t)r * ld + qd + kvd, (size_t)kvd * 4);
    }
    int32_t *slot = (int32_t *)malloc(rows * 4), *pos = (int32_t *)malloc(rows * 4);
    for (int r = 0; r < rows; r++) {
        const int pad = r >= rows - n_pad;
        slot[r] = pad ? n_slots : r % n_slots;
        pos[r] = pad ? 0 : n_ctx - 1 - r / n_slots;
    }
    float *cs = (float *)malloc((size_t)n_ctx * rope_dim * 4 + 4);
    ops_rope_table_host(cs, n_ctx, rope_dim, 1000000.0);
    void *dqkv = dnew(qkv, CU_F32, (size_t)rows * ld), *dcs = dnew(cs, CU_F32, (size_t)n_ctx * rope_dim);
    void *dpp = dnew(pp, CU_F32, ks * np);
    void *ds = dnew(slot, CU_F32, rows), *dp = dnew(pos, CU_F32, rows);
    void *db = dnew(bias, CU_F32, (size_t)qd + 2 * kvd);
    const float *dbq = (const float *)db, *dbk = dbq + qd, *dbv = dbq + qd + kvd;
    const int n_cells = (rows - n_pad) + (n_pad > 0);
    for (int ti = 0; ti < 3; ti++) for (int with_bias = 0; with_bias < 2; with_bias++) {
        const cu_dtype t = s_types[ti];
        char what[160];
        snprintf(what, sizeof what, "qkv_rope_append %s (%d rows, %d padded, %d+%d heads of %d, rope %d style %d, "
                 "ld +%d, bias %d)", ops_dtype_name(t), rows, n_pad, n_heads, n_kv, head_dim, rope_dim, style,
                 extra_ld, with_bias);
        /* the separate chain */
        void *dq = dnew(q, CU_F32, (size_t)rows * qd), *dk = dnew(k, CU_F32, (size_t)rows * kvd);
        void *dv = dnew(v, CU_F32, (size_t)rows * kvd);
        void *kc1 = dnew(NULL, t, C), *vc1 = dnew(NULL, t, C), *kc2 = dnew(NULL, t, C), *vc2 = dnew(NULL, t, C);
        void *q2 = dnew(NULL, CU_F32, (size_t)rows * qd);
        if (with_bias) {
            CHECK(ops_bias_add((float *)dq, dbq, rows, qd, 0, err, errlen) == 0, "%s", err);
            CHECK(ops_bias_add((float *)dk, dbk, rows, kvd, 0, err, errlen) == 0, "%s", err);
            CHECK(ops_bias_add((float *)dv, dbv, rows, kvd, 0, err, errlen) == 0, "%s", err);
        }
        CHECK(ops_rope((float *)dq, (int32_t *)dp, rows, n_heads, head_dim, rope_dim, style, (float *)dcs, 0, err,
                       errlen) == 0, "%s", err);
        CHECK(ops_rope((float *)dk, (int32_t *)dp, rows, n_kv, head_dim, rope_dim, style, (float *)dcs, 0, err,
                       errlen) == 0, "%s", err);
        CHECK(ops_kv_append((float *)dk, (float *)dv, (int32_t *)ds, (int32_t *)dp, rows, kvd, n_ctx, kc1, vc1, t, 0,
                            err, errlen) == 0, "%s", err);
        /* the fused kernel */
        ops_qkv_args a;
        memset(&a, 0, sizeof a);
        a.qkv = (const float *)dqkv; a.ld = ld;
        a.bq = with_bias ? dbq : NULL; a.bk = with_bias ? dbk : NULL; a.bv = with_bias ? dbv : NULL;
        a.pos = (int32_t *)dp; a.slot = (int32_t *)ds; a.n_rows = rows;
        a.n_heads = n_heads; a.n_kv_heads = n_kv; a.head_dim = head_dim; a.rope_dim = rope_dim; a.style = style;
        a.cs = (const float *)dcs; a.q = (float *)q2; a.n_ctx = n_ctx; a.kc = kc2; a.vc = vc2; a.kvdt = t;
        CHECK(ops_qkv_rope_append(&a, 0, err, errlen) == 0, "%s: %s", what, err);
        int ok = same_bits(what, dq, q2, (size_t)rows * qd * 4);
        ok &= same_bits(what, kc1, kc2, C * ops_dtype_size(t));
        ok &= same_bits(what, vc1, vc2, C * ops_dtype_size(t));
        /* and something was written: every q element, each row's cell (one shared by the padded rows) */
        CHECK(count_finite(q2, CU_F32, (size_t)rows * qd) == (size_t)rows * qd, "%s: q not fully written", what);
        CHECK(count_finite(kc2, t, C) == (size_t)n_cells * kvd && count_finite(vc2, t, C) == (size_t)n_cells * kvd,
              "%s: cache cells written differ from %d rows of %d", what, n_cells, kvd);
        /* the products given as their split partials: the same bits */
        void *q3 = dnew(NULL, CU_F32, (size_t)rows * qd), *kc3 = dnew(NULL, t, C), *vc3 = dnew(NULL, t, C);
        a.qkv = NULL;
        a.part = (const float *)dpp;
        a.ks = ks;
        a.q = (float *)q3;
        a.kc = kc3;
        a.vc = vc3;
        CHECK(ops_qkv_rope_append(&a, 0, err, errlen) == 0, "%s (partials): %s", what, err);
        ok &= same_bits(what, dq, q3, (size_t)rows * qd * 4);
        ok &= same_bits(what, kc1, kc3, C * ops_dtype_size(t));
        ok &= same_bits(what, vc1, vc3, C * ops_dtype_size(t));
        a.ks = 9;
        CHECK(ops_qkv_rope_append(&a, 0, err, errlen) != 0, "%s: 9 partials accepted", what);
        cudaFree(q3);
        cudaFree(kc3);
        cudaFree(vc3);
        if (getenv("ZLLM_TEST_VERBOSE")) printf("  %s: %s\n", what, ok ? "same bits" : "DIFFERENT");
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(kc1); cudaFree(vc1); cudaFree(kc2); cudaFree(vc2);
        cudaFree(q2);
    }
    cudaFree(dqkv);
    cudaFree(dcs);
    cudaFree(ds);
    cudaFree(dp);
    cudaFree(db);
    cudaFree(dpp);
    free(pp);
    free(qkv);
    free(bias);
    free(q);
    free(k);
    free(v);
    free(slot);
    free(pos);
    free(cs);
}

/* ops_swiglu_dual on column slices of one [rows][2n] array (ld = 2n, the engine's fused gate/up product) gives
 * the same bits as on separate contiguous gate and up arrays, for each output type, both outputs and round_f;
 * n % 4 == 0 takes the float4 kernels, odd n the scalar ones */
static void test_swiglu_strided(int rows, int n) {
    const size_t N = (size_t)rows * n;
    float *g = hrand(N), *u = hrand(N), *gu = (float *)malloc(N * 2 * 4);
    for (size_t i = 0; i < N; i++) g[i] *= 6.f;
    for (int r = 0; r < rows; r++) {
        memcpy(gu + (size_t)r * 2 * n, g + (size_t)r * n, (size_t)n * 4);
        memcpy(gu + (size_t)r * 2 * n + n, u + (size_t)r * n, (size_t)n * 4);
    }
    void *dg = dnew(g, CU_F32, N), *du = dnew(u, CU_F32, N), *dgu = dnew(gu, CU_F32, 2 * N);
    for (int ti = 0; ti < 3; ti++) for (int round_f = 0; round_f < 2; round_f++) {
        const cu_dtype t = s_types[ti];
        void *o1 = dnew(NULL, t, N), *o2 = dnew(NULL, t, N), *f1 = dnew(NULL, CU_F32, N), *f2 = dnew(NULL, CU_F32, N);
        char what[96];
        snprintf(what, sizeof what, "swiglu_dual ld 2n == contiguous (%d x %d, %s, round_f %d)", rows, n,
                 ops_dtype_name(t), round_f);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, 0, rows, n, o1, t, (float *)f1, round_f, 0, err, errlen) == 0,
              "%s", err);
        CHECK(ops_swiglu_dual((float *)dgu, (float *)dgu + n, 2 * n, rows, n, o2, t, (float *)f2, round_f, 0, err,
                              errlen) == 0, "%s", err);
        same_vals(what, o2, t, o1, t, N);
        same_bits(what, o1, o2, N * ops_dtype_size(t));
        same_bits(what, f1, f2, N * 4);
        /* one output only */
        cudaMemset(f2, 0xFF, N * 4);
        CHECK(ops_swiglu_dual((float *)dgu, (float *)dgu + n, 2 * n, rows, n, NULL, t, (float *)f2, round_f, 0, err,
                              errlen) == 0, "%s", err);
        same_bits(what, f1, f2, N * 4);
        cudaFree(o1); cudaFree(o2); cudaFree(f1); cudaFree(f2);
    }
    CHECK(ops_swiglu_dual((float *)dg, (float *)du, n - 1, rows, n, NULL, CU_F32, (float *)dg, 0, 0, err, errlen) != 0,
          "swiglu_dual accepted a row stride below n");
    cudaFree(dg); cudaFree(du); cudaFree(dgu); free(g); free(u); free(gu);
}

/* ops_swiglu_il8_dual on gate/up rows interleaved in blocks of 8 (wtc's SwiGLU layout; ld >= 2n, padded rows too)
 * gives the same bits as ops_swiglu_dual on separate gate and up arrays, for each output type, both outputs and
 * round_f; ld % 4 == 0 takes the float4 kernel, an odd ld the scalar one; n not a multiple of 8 is refused */
static void test_swiglu_il8(int rows, int n, int ld) {
    const size_t N = (size_t)rows * n;
    float *g = hrand(N), *u = hrand(N), *gu = (float *)calloc((size_t)rows * ld, 4);
    for (size_t i = 0; i < N; i++) g[i] *= 6.f;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            gu[(size_t)r * ld + 16 * (j / 8) + j % 8] = g[(size_t)r * n + j];
            gu[(size_t)r * ld + 16 * (j / 8) + 8 + j % 8] = u[(size_t)r * n + j];
        }
    void *dg = dnew(g, CU_F32, N), *du = dnew(u, CU_F32, N), *dgu = dnew(gu, CU_F32, (size_t)rows * ld);
    for (int ti = 0; ti < 3; ti++) for (int round_f = 0; round_f < 2; round_f++) {
        const cu_dtype t = s_types[ti];
        void *o1 = dnew(NULL, t, N), *o2 = dnew(NULL, t, N), *f1 = dnew(NULL, CU_F32, N), *f2 = dnew(NULL, CU_F32, N);
        char what[96];
        snprintf(what, sizeof what, "swiglu_il8_dual == swiglu_dual (%d x %d, ld %d, %s, round_f %d)", rows, n, ld,
                 ops_dtype_name(t), round_f);
        CHECK(ops_swiglu_dual((float *)dg, (float *)du, 0, rows, n, o1, t, (float *)f1, round_f, 0, err, errlen) == 0,
              "%s", err);
        CHECK(ops_swiglu_il8_dual((float *)dgu, ld, rows, n, o2, t, (float *)f2, round_f, 0, err, errlen) == 0, "%s",
              err);
        same_bits(what, o1, o2, N * ops_dtype_size(t));
        same_bits(what, f1, f2, N * 4);
        cudaMemset(o2, 0xFF, N * ops_dtype_size(t));   /* one output only */
        CHECK(ops_swiglu_il8_dual((float *)dgu, ld, rows, n, o2, t, NULL, round_f, 0, err, errlen) == 0, "%s", err);
        same_bits(what, o1, o2, N * ops_dtype_size(t));
        cudaFree(o1); cudaFree(o2); cudaFree(f1); cudaFree(f2);
    }
    CHECK(ops_swiglu_il8_dual((float *)dgu, ld, rows, n + 4, NULL, CU_F32, (float *)dg, 0, 0, err, errlen) != 0,
          "swiglu_il8_dual accepted a feature count that is not a multiple of 8");
    /* the same F16 values as qtc's wgmma images; refused for rows that are not whole 256-element units */
    {
        void *o1 = dnew(NULL, CU_F16, N);
        CHECK(ops_swiglu_il8_dual((float *)dgu, ld, rows, n, o1, CU_F16, NULL, 1, 0, err, errlen) == 0, "%s", err);
        for (int nx : {32, 64, 128}) {
            void *img = dnew(NULL, CU_F16, (size_t)((rows + nx - 1) / nx) * nx * n);
            const int rc = ops_swiglu_il8_ximage((float *)dgu, ld, rows, n, img, nx, 0, err, errlen);
            if (n % 256 == 0) {
                CHECK(rc == 0, "%s", err);
                ximage_check("swiglu_il8_ximage", o1, img, rows, n, nx);
            } else {
                CHECK(rc != 0, "swiglu_il8_ximage accepted %d features", n);
            }
            cudaFree(img);
        }
        cudaFree(o1);
    }
    cudaFree(dg); cudaFree(du); cudaFree(dgu); free(g); free(u); free(gu);
}

/* ops_gemm writing a column slice (ldy > n_out) leaves the other columns alone and gives the same bits as the
 * contiguous product */
static void test_gemm_ldy(cublasHandle_t h, int rows, int n_in, int n_out, int ldy, int col0) {
    for (int ti = 0; ti < 3; ti++) {
        const cu_dtype t = s_types[ti];
        float *x = hrand((size_t)rows * n_in), *w = hrand((size_t)n_out * n_in);
        void *hx = htyped(x, t, (size_t)rows * n_in, NULL), *hw = htyped(w, t, (size_t)n_out * n_in, NULL);
        void *dx = dnew(hx, t, (size_t)rows * n_in), *dw = dnew(hw, t, (size_t)n_out * n_in);
        void *y1 = dnew(NULL, CU_F32, (size_t)rows * n_out), *y2 = dnew(NULL, CU_F32, (size_t)rows * ldy);
        CHECK(ops_gemm(h, dx, dw, t, rows, n_in, n_out, (float *)y1, 0, 0.f, err, errlen) == 0, "%s", err);
        CHECK(ops_gemm(h, dx, dw, t, rows, n_in, n_out, (float *)y2 + col0, ldy, 0.f, err, errlen) == 0, "%s", err);
        float *h1 = (float *)malloc((size_t)rows * n_out * 4), *h2 = (float *)malloc((size_t)rows * ldy * 4);
        cudaDeviceSynchronize();
        cudaMemcpy(h1, y1, (size_t)rows * n_out * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(h2, y2, (size_t)rows * ldy * 4, cudaMemcpyDeviceToHost);
        /* cuBLAS may pick another algorithm for another ldc, so the slice is held to 1e-6 of the contiguous
         * product (not to its bits); every column outside the slice must still hold the poison */
        size_t bad_in = 0, bad_out = 0, n_diff_bits = 0;
        for (int r = 0; r < rows; r++) for (int j = 0; j < ldy; j++) {
            const float g = h2[(size_t)r * ldy + j];
            if (j >= col0 && j < col0 + n_out) {
                const float e = h1[(size_t)r * n_out + j - col0];
                n_diff_bits += memcmp(&g, &e, 4) != 0;
                bad_in += !(fabsf(g - e) <= 1e-6f * (1.f + fabsf(e)));
            } else {
                bad_out += !isnan(g);
            }
        }
        CHECK(bad_in == 0 && bad_out == 0, "gemm ldy %d col %d (%s): %zu slice values differ, %zu outside written",
              ldy, col0, ops_dtype_name(t), bad_in, bad_out);
        if (getenv("ZLLM_TEST_VERBOSE"))
            printf("  gemm ldy %d col %d (%s): %zu of %zu slice values not the contiguous bits\n", ldy, col0,
                   ops_dtype_name(t), n_diff_bits, (size_t)rows * n_out);
        cudaFree(dx); cudaFree(dw); cudaFree(y1); cudaFree(y2);
        free(x); free(w); free(hx); free(hw); free(h1); free(h2);
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
    test_head_rmsnorm(5, 8, 16, 8 * 16 + 2 * 2 * 16, 0);            /* qwen3-like q heads of a qkv row */
    test_head_rmsnorm(3, 2, 128, 16 * 128 + 2 * 2 * 128, 16 * 128); /* k heads, head size 128 */
    test_head_rmsnorm(33, 4, 64, 4 * 64 * 3, 0);
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
    test_dual(2, 8192);
    test_swiglu_il8(3, 4096, 8192);
    test_swiglu_il8(5, 576, 1160);
    test_swiglu_il8(2, 64, 131);
    test_gemm(h, 1, 64, 172);
    test_gemm(h, 7, 576, 192);
    test_gemm(h, 33, 256, 512);
    test_gemm_ldy(h, 5, 256, 64, 384, 256);
    test_gemm_ldy(h, 33, 576, 192, 960, 0);
    /* the fused attention prologue: GQA and MHA, full and partial RoPE, both styles, tiny and real head sizes,
     * exact and wider row strides, padded rows, both kernels (four elements a thread where the shape allows) */
    for (int style = 0; style < 2; style++) {
        test_qkv_rope_append(7, 0, 8, 8, 8, 8, style, 0, 4, 512);
        test_qkv_rope_append(13, 3, 32, 8, 128, 128, style, 0, 4, 4096);
        test_qkv_rope_append(9, 2, 14, 2, 64, 64, style, 8, 3, 8192);
        test_qkv_rope_append(6, 1, 4, 4, 64, 32, style, 4, 8, 100);
        test_qkv_rope_append(40, 8, 9, 3, 64, 64, style, 0, 8, 16);
        /* rows an odd number of floats apart, a RoPE of 6 dims of 8: the one-element kernel (the others take the
         * four-element one) */
        test_qkv_rope_append(11, 2, 8, 4, 64, 64, style, 3, 4, 256);
        test_qkv_rope_append(5, 1, 4, 2, 8, 6, style, 0, 4, 64);
    }
    test_swiglu_strided(5, 576);
    test_swiglu_strided(3, 171);
    test_swiglu_strided(17, 1536);
    cublasDestroy(h);
    const cudaError_t ce = cudaDeviceSynchronize();
    CHECK(ce == cudaSuccess, "device error at the end: %s", cudaGetErrorString(ce));
    return test_report();
}
