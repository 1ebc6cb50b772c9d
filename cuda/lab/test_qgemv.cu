/* cuda/lab/test_qgemv.cu: the quantized matrix-vector kernels (cuda/qgemv.cu) against the CPU oracle.
 *
 * For every weight type, shapes with n_in from 32 to 14336 (rows that are and are not 16-byte aligned) and odd
 * n_out, and every batch M = 1..8: W is half rows quantized from random f32 rows with quant_quantize_row and
 * half rows of random raw blocks (random bytes with sane fp16 scales), x is random, y is poisoned with NaN
 * before each launch; the reference dequantizes each row with quant_dequant_row and multiplies in double.
 * Checks: no NaN, ||y - ref|| / ||ref|| <= 1e-3 per batch row, and every element within 1e-3 of
 * sum_i |w_i x_i|. Also: the fused residual (separate and in place), strided x/y, every kernel variant,
 * replay inside a CUDA graph, batch invariance (a row alone = the same row inside M = 3 and M = 8, bit for
 * bit), and the argument checks. Prints "N passed, N failed".
 * ZLLM_GPU_TEST_QUICK=1: fewer shapes and batches (for runs under compute-sanitizer). */
extern "C" {
#include "quant.h"
#include "test.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "qgemv.h"
#include "test_rand.h"
#include "test_gpu.h"


static const ggml_type s_types[] = {GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                                    GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};

static int pk_type(ggml_type t)   /* types with the packed kernel */
{
    return t == GGML_F16 || t == GGML_BF16 || t == GGML_Q8_0 || t == GGML_Q4_K || t == GGML_Q6_K;
}
static int pk_repacked_type(ggml_type t) { return t == GGML_Q8_0 || t == GGML_Q6_K; }

static int type_block(ggml_type t)
{
    return t == GGML_Q4_K || t == GGML_Q5_K || t == GGML_Q6_K ? 256 : 32;
}

/* a weight matrix: raw rows on the device and their dequantized copy on the host */
struct Mat {
    ggml_type t;
    int n_in, n_out;
    size_t row_bytes;
    std::vector<float> wf;   /* dequantized [n_out][n_in] */
    void *dw;                /* device copy of the raw rows */
    void *dp;                /* device copy of the packed form (qgemv_repack_host of the raw rows) */
};

static void mat_make(Mat *a, ggml_type t, int n_in, int n_out)
{
    a->t = t;
    a->n_in = n_in;
    a->n_out = n_out;
    a->row_bytes = ggml_row_bytes(t, n_in);
    std::vector<uint8_t> raw(a->row_bytes * n_out);
    std::vector<float> src(n_in);
    a->wf.assign((size_t)n_in * n_out, 0.0f);
    for (int o = 0; o < n_out; o++) {
        uint8_t *row = raw.data() + (size_t)o * a->row_bytes;
        if (o % 2 == 0) {
            float scale = 0.02f * (float)(1 + o % 5);
            for (int i = 0; i < n_in; i++) src[i] = rnd_normal() * scale + (o % 3 == 0 ? 0.01f : 0.0f);
            if (quant_quantize_row(t, src.data(), row, n_in) != 0) { fprintf(stderr, "quantize failed\n"); exit(2); }
        } else {
            raw_row(t, row, a->row_bytes);
        }
        if (quant_dequant_row(t, row, a->wf.data() + (size_t)o * n_in, n_in) != 0) {
            fprintf(stderr, "dequant failed\n");
            exit(2);
        }
    }
    CK(cudaMalloc(&a->dw, raw.size()));
    CK(cudaMemcpy(a->dw, raw.data(), raw.size(), cudaMemcpyHostToDevice));
    /* the packed form: made on the host, checked against the device repack of the uploaded rows */
    const size_t pb = qgemv_repack_bytes(t, n_in, n_out);
    CHECK(pb == raw.size(), "%s n_in %d n_out %d: qgemv_repack_bytes %zu, GGUF bytes %zu", ggml_type_name(t), n_in,
          n_out, pb, raw.size());
    std::vector<uint8_t> packed(raw.size()), back(raw.size());
    CHECK(qgemv_repack_host(t, raw.data(), packed.data(), n_in, n_out) == 0, "%s: qgemv_repack_host failed",
          ggml_type_name(t));
    CK(cudaMalloc(&a->dp, raw.size()));
    void *dtmp;
    CK(cudaMalloc(&dtmp, raw.size()));
    CHECK(qgemv_repack(t, a->dw, dtmp, n_in, n_out, 0) == cudaSuccess, "%s: qgemv_repack failed", ggml_type_name(t));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(back.data(), dtmp, raw.size(), cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back.data(), packed.data(), raw.size()), "%s n_in %d n_out %d: device and host repack differ",
          ggml_type_name(t), n_in, n_out);
    CK(cudaFree(dtmp));
    CK(cudaMemcpy(a->dp, packed.data(), raw.size(), cudaMemcpyHostToDevice));
}

static void mat_free(Mat *a)
{
    cudaFree(a->dw);
    cudaFree(a->dp);
    a->dw = a->dp = NULL;
}

/* launch on matrix a: GGUF rows (packed 0) or the packed form (packed 1), default kernel (rv 0) or variant rv */
static cudaError_t launch(const Mat *a, qgemv_params *p, int rv, int packed, cudaStream_t st)
{
    p->w = packed ? a->dp : a->dw;
    if (packed) return rv ? qgemv_launch_packed_variant(p, rv, st) : qgemv_launch_packed(p, st);
    return rv ? qgemv_launch_variant(p, rv, st) : qgemv_launch(p, st);
}

/* one case on matrix a: batch m; rv: kernel variant (0 default, else qgemv_launch_variant's); resid: 0 none,
 * 1 separate y_in, 2 in place (y_in == y); pad: extra floats per x/y row; graph: launch inside a CUDA graph;
 * packed: the packed form through qgemv_launch_packed(_variant) */
static void run_case(const Mat *a, int m, int rv, int resid, int pad, int graph, int packed = 0)
{
    const int n_in = a->n_in, n_out = a->n_out, ldx = n_in + pad, ldy = n_out + pad;
    std::vector<float> x((size_t)m * ldx), yin((size_t)m * ldy), y((size_t)m * ldy);
    for (auto &v : x) v = rnd_normal();
    for (auto &v : yin) v = rnd_normal();
    float *dx, *dy, *dyin;
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    tg_out_alloc(y.size(), resid, yin.data(), &dy, &dyin);
    qgemv_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t;
    p.w = a->dw;
    p.row_bytes = a->row_bytes;
    p.n_in = n_in;
    p.n_out = n_out;
    p.m = m;
    p.x = dx;
    p.ldx = pad ? ldx : 0;
    p.y = dy;
    p.ldy = pad ? ldy : 0;
    p.y_in = dyin;
    const cudaError_t e = tg_launch(graph, [&](cudaStream_t st) { return launch(a, &p, rv, packed, st); });
    CHECK(e == cudaSuccess, "%s n_in %d n_out %d m %d r %d packed %d: launch: %s", ggml_type_name(a->t), n_in, n_out,
          m, rv, packed, cudaGetErrorString(e));
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));

    const tg_cmp c = tg_oracle(a->wf.data(), x.data(), ldx, yin.data(), y.data(), ldy, m, n_in, n_out, resid, 1);
    const int nan = c.nan, bad_el = c.bad;
    const double worst_rel = c.rel;
    CHECK(nan == 0 && bad_el == 0 && worst_rel <= 1e-3,
          "%s n_in %d n_out %d m %d r %d resid %d pad %d graph %d packed %d: %d NaN, %d elements off, rel err %.3g",
          ggml_type_name(a->t), n_in, n_out, m, rv, resid, pad, graph, packed, nan, bad_el, worst_rel);
    cudaFree(dx);
    tg_out_free(resid, dy, dyin);
}

/* batch invariance of the packed form with kernel variant rv (0 default; 1000 + 100 ks: default rows/slots with
 * ks warps per row): for every M = 1..8, row j of the M-row product equals, bit for bit, x row j alone (M = 1) */
static void invariance_packed(const Mat *a, int rv)
{
    const int n_in = a->n_in, n_out = a->n_out;
    std::vector<float> x((size_t)8 * n_in), yM((size_t)8 * n_out), y1((size_t)8 * n_out);
    for (auto &v : x) v = rnd_normal();
    float *dx, *dy;
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMalloc(&dy, yM.size() * 4));
    CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    qgemv_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t; p.row_bytes = a->row_bytes; p.n_in = n_in; p.n_out = n_out; p.y = dy;
    int ok = 1, same = 1;
    for (int j = 0; j < 8; j++) {   /* each row alone */
        p.m = 1; p.x = dx + (size_t)j * n_in;
        ok &= launch(a, &p, rv, 1, 0) == cudaSuccess;
        CK(cudaMemcpy(y1.data() + (size_t)j * n_out, dy, (size_t)n_out * 4, cudaMemcpyDeviceToHost));
    }
    for (int m = 2; m <= 8; m++) {
        p.m = m; p.x = dx;
        ok &= launch(a, &p, rv, 1, 0) == cudaSuccess;
        CK(cudaMemcpy(yM.data(), dy, (size_t)m * n_out * 4, cudaMemcpyDeviceToHost));
        same &= !memcmp(yM.data(), y1.data(), (size_t)m * n_out * 4);
    }
    CHECK(ok && same, "%s n_in %d n_out %d variant %d: packed results depend on the batch (launch ok %d)",
          ggml_type_name(a->t), n_in, n_out, rv, ok);
    cudaFree(dx);
    cudaFree(dy);
}

/* batch invariance: row 3 of an M = 8 product equals, bit for bit, the same x row alone (M = 1) and as row 0
 * of an M = 3 product (the engine relies on this to keep results independent of the batch) */
static void invariance_case(const Mat *a)
{
    const int n_in = a->n_in, n_out = a->n_out;
    std::vector<float> x((size_t)8 * n_in), y8((size_t)8 * n_out), y1(n_out), y3((size_t)3 * n_out);
    for (auto &v : x) v = rnd_normal();
    float *dx, *dy;
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMalloc(&dy, y8.size() * 4));
    CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    qgemv_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t; p.w = a->dw; p.row_bytes = a->row_bytes; p.n_in = n_in; p.n_out = n_out; p.y = dy;
    int ok = 1;
    p.m = 8; p.x = dx;
    ok &= qgemv_launch(&p, 0) == cudaSuccess;
    CK(cudaMemcpy(y8.data(), dy, y8.size() * 4, cudaMemcpyDeviceToHost));
    p.m = 1; p.x = dx + (size_t)3 * n_in;
    ok &= qgemv_launch(&p, 0) == cudaSuccess;
    CK(cudaMemcpy(y1.data(), dy, y1.size() * 4, cudaMemcpyDeviceToHost));
    p.m = 3;
    ok &= qgemv_launch(&p, 0) == cudaSuccess;
    CK(cudaMemcpy(y3.data(), dy, y3.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(ok && !memcmp(y1.data(), y8.data() + (size_t)3 * n_out, (size_t)n_out * 4) &&
              !memcmp(y3.data(), y1.data(), (size_t)n_out * 4),
          "%s n_in %d n_out %d: results depend on the batch", ggml_type_name(a->t), n_in, n_out);
    cudaFree(dx);
    cudaFree(dy);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n0 passed, 0 failed\n");
        return 0;
    }
    /* shapes: n_in (multiples of 32 give unaligned rows for the 32-element types), odd n_out */
    const int shapes32[][2] = {{32, 3}, {96, 17}, {1056, 77}, {4096, 129}, {14336, 33}};
    const int shapes256[][2] = {{256, 3}, {768, 17}, {1280, 77}, {4096, 129}, {14336, 33}};
    /* ZLLM_GPU_TEST_QUICK=1 (e.g. under compute-sanitizer): the three smaller shapes, M = 1, 2, 8 */
    const char *qe = getenv("ZLLM_GPU_TEST_QUICK");
    const int quick = qe && *qe && strcmp(qe, "0") != 0;
    for (ggml_type t : s_types) {
        const int(*sh)[2] = type_block(t) == 256 ? shapes256 : shapes32;
        for (int si = 0; si < (quick ? 3 : 5); si++) {
            Mat a;
            mat_make(&a, t, sh[si][0], sh[si][1]);
            for (int m = 1; m <= QGEMV_MAX_M; m++)
                if (!quick || m == 1 || m == 2 || m == 8) run_case(&a, m, 0, m % 3 == 2 ? 1 : 0, 0, 0);
            if (si == 2 || si == 3) {
                /* every kernel variant (qgemv_launch_variant): staged 10/14, direct 20/22/24 */
                const int direct = t == GGML_F16 || t == GGML_BF16 || t == GGML_Q4_K || t == GGML_Q5_K;
                if (!direct) {
                    run_case(&a, 1, 10, 0, 0, 0);
                    run_case(&a, 1, 14, 0, 0, 0);
                    run_case(&a, 5, 10, 1, 0, 0);
                } else {
                    run_case(&a, 1, 20, 0, 0, 0);
                    run_case(&a, 1, 22, 0, 0, 0);
                    run_case(&a, 1, 24, 0, 0, 0);
                    run_case(&a, 4, 20, 0, 0, 0);
                }
                invariance_case(&a);
                run_case(&a, 3, 0, 2, 4, 0);   /* in-place residual, strided x and y */
                run_case(&a, 1, 0, 1, 0, 1);   /* inside a CUDA graph */
                /* the packed form: residuals, strides, graph, invariance under every split of the rows */
                run_case(&a, 3, 0, 2, 4, 0, 1);
                run_case(&a, 1, 0, 1, 0, 1, 1);
                run_case(&a, 8, 0, 1, 4, 0, 1);
                invariance_packed(&a, 0);
                if (pk_type(t)) {
                    for (int ks = 1; ks <= 4; ks *= 2) {
                        invariance_packed(&a, 1000 + 100 * ks);
                        run_case(&a, 1, 1000 + 100 * ks, 0, 0, 0, 1);
                        run_case(&a, 6, 1000 + 100 * ks, 1, 0, 0, 1);
                    }
                    /* the M = 1 alternatives: (R, S) = (1, 4), (2, 2) or (4, 2) where built, no L2 hint */
                    const int k = t == GGML_Q4_K || t == GGML_Q6_K, w16 = t == GGML_F16 || t == GGML_BF16;
                    run_case(&a, 1, 1014, 0, 0, 0, 1);
                    run_case(&a, 1, 1214, 0, 0, 0, 1);
                    if (!k) run_case(&a, 1, 1022, 0, 0, 0, 1);
                    if (w16) run_case(&a, 1, 1442, 0, 0, 0, 1);
                    if (w16) run_case(&a, 1, 1024, 0, 0, 0, 1);
                    run_case(&a, 1, 11000, 0, 0, 0, 1);
                    run_case(&a, 1, k || w16 ? 11022 : 11024, 1, 0, 0, 1);
                    /* the packed kernel on GGUF rows where the layouts agree (F16, BF16, Q4_K) */
                    if (!pk_repacked_type(t)) {
                        run_case(&a, 1, 1000, 0, 0, 0, 0);
                        run_case(&a, 7, 1200, 1, 0, 0, 0);
                    }
                }
            }
            for (int m = 1; m <= QGEMV_MAX_M; m++)   /* the packed form at every batch */
                if (!quick || m == 1 || m == 2 || m == 8) run_case(&a, m, 0, m % 3 == 1 ? 1 : 0, 0, 0, 1);
            mat_free(&a);
        }
    }

    /* the packed defaults that depend on the shape: Q4_K with n_out > 2048 (GGUF direct kernel), Q8_0 with
     * n_out >= 8192 ((R, S) = (2, 2), ks 1), Q6_K with n_out > 65536 (ks 1); checked and batch invariant */
    {
        const struct { ggml_type t; int n_in, n_out; } big[] = {
            {GGML_Q4_K, 512, 2053}, {GGML_Q8_0, 1024, 8195}, {GGML_Q6_K, 256, 65601}};
        for (const auto &b : big) {
            Mat a;
            mat_make(&a, b.t, b.n_in, b.n_out);
            run_case(&a, 1, 0, 0, 0, 0, 1);
            run_case(&a, 2, 0, 1, 0, 0, 1);
            if (!quick) run_case(&a, 5, 0, 0, 0, 0, 1);
            invariance_packed(&a, 0);
            mat_free(&a);
        }
    }

    /* argument checks */
    {
        Mat a;
        mat_make(&a, GGML_Q4_0, 64, 4);
        float *dx, *dy;
        CK(cudaMalloc(&dx, 64 * 9 * 4));
        CK(cudaMalloc(&dy, 64 * 9 * 4));
        qgemv_params p;
        memset(&p, 0, sizeof p);
        p.type = GGML_Q4_0; p.w = a.dw; p.row_bytes = a.row_bytes; p.n_in = 64; p.n_out = 4; p.m = 1; p.x = dx;
        p.y = dy;
        CHECK(qgemv_launch(&p, 0) == cudaSuccess, "valid launch refused");
        p.m = 9;
        CHECK(qgemv_launch(&p, 0) == cudaErrorInvalidValue, "m = 9 accepted");
        p.m = 0;
        CHECK(qgemv_launch(&p, 0) == cudaErrorInvalidValue, "m = 0 accepted");
        p.m = 1; p.n_in = 48;
        CHECK(qgemv_launch(&p, 0) == cudaErrorInvalidValue, "n_in 48 accepted");
        p.n_in = 64; p.row_bytes = 37;
        CHECK(qgemv_launch(&p, 0) == cudaErrorInvalidValue, "wrong row_bytes accepted");
        p.row_bytes = a.row_bytes; p.x = dx + 1;
        CHECK(qgemv_launch(&p, 0) == cudaErrorMisalignedAddress, "misaligned x accepted");
        p.x = dx; p.type = GGML_Q8_K;
        CHECK(qgemv_launch(&p, 0) == cudaErrorInvalidValue, "Q8_K accepted");
        p.type = GGML_Q4_0;
        CHECK(qgemv_launch_variant(&p, 20, 0) == cudaErrorInvalidValue, "direct kernel for Q4_0 accepted");
        CHECK(qgemv_launch_variant(&p, 7, 0) == cudaErrorInvalidValue, "variant 7 accepted");
        CHECK(qgemv_launch_variant(&p, 1000, 0) == cudaErrorInvalidValue, "packed kernel for Q4_0 accepted");
        CHECK(qgemv_launch_packed_variant(&p, 0, 0) == cudaSuccess, "Q4_0 packed (= GGUF rows) refused");
        {
            qgemv_params q = p;
            /* a valid Q8_0 shape over a.dw (2 x 68 bytes <= its 4 x 36): every call below is refused before launch */
            q.type = GGML_Q8_0; q.n_in = 64; q.row_bytes = 68; q.w = a.dw; q.n_out = 2;
            CHECK(qgemv_launch_variant(&q, 1000, 0) == cudaErrorInvalidValue, "packed kernel on GGUF Q8_0 accepted");
            CHECK(qgemv_launch_packed_variant(&q, 1300, 0) == cudaErrorInvalidValue, "ks 3 accepted");
            CHECK(qgemv_launch_packed_variant(&q, 1042, 0) == cudaErrorInvalidValue, "Q8_0 (4, 2) accepted");
            q.m = 2;
            CHECK(qgemv_launch_packed_variant(&q, 1014, 0) == cudaErrorInvalidValue, "(1, 4) at m 2 accepted");
            CHECK(qgemv_launch_packed_variant(&q, 11000, 0) == cudaErrorInvalidValue, "no-hint at m 2 accepted");
        }
        CHECK(qgemv_repack_bytes(GGML_Q2_K, 256, 4) == 0 && qgemv_repack_bytes(GGML_Q8_0, 48, 4) == 0 &&
              qgemv_repack_bytes(GGML_Q6_K, 512, 3) == 3 * 420, "qgemv_repack_bytes");
        {
            uint8_t buf[256] = {0};
            CHECK(qgemv_repack_host(GGML_Q8_0, buf, buf + 10, 32, 2) == -1, "overlapping repack accepted");
            CHECK(qgemv_repack_host(GGML_Q8_0, buf, buf + 68, 32, 2) == 0, "adjacent repack refused");
            CHECK(qgemv_repack(GGML_Q8_0, a.dw, (uint8_t *)a.dw + 8, 32, 2, 0) == cudaErrorInvalidValue,
                  "overlapping device repack accepted");
        }
        CHECK(!qgemv_supported(GGML_F32) && !qgemv_supported(GGML_Q2_K) && qgemv_supported(GGML_Q6_K) &&
              qgemv_supported(GGML_BF16), "qgemv_supported");
        CHECK(qgemv_pick(GGML_Q4_K, 1, 4096, 4096) && !qgemv_pick(GGML_Q4_K, 9, 4096, 4096) &&
              !qgemv_pick(GGML_Q4_K, 1, 4000, 4096), "qgemv_pick");
        CK(cudaDeviceSynchronize());
        cudaFree(dx);
        cudaFree(dy);
        mat_free(&a);
    }
    return test_report();
}
