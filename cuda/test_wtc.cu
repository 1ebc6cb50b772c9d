/* cuda/test_wtc.cu: the batch-invariant 16-bit weight products (cuda/wtc.cu) against the oracle and against
 * themselves.
 *
 * For BF16 and F16, shapes covering split counts 1, 2 and 8, n_out not a multiple of 16 or 128, and rows of 64
 * to 14336 elements: W and x random normal values rounded to the type, y NaN-poisoned before each launch.
 *   - accuracy: the double-precision oracle (tests/test_gpu.h tg_oracle) for batches 1..130: no NaN, every
 *     element within 1e-3 of sum |w_i x_i|, relative L2 error <= 1e-3; fused residual (separate and in place),
 *     strided x and y;
 *   - one arithmetic: every form (1 narrow, 2 and 3 the mma.sync wide ones, and on sm_90 4 to 6 the wgmma ones:
 *     chained, cluster of split CTAs, TMA-fed warp-specialized, this one also in the tiles it takes for 3 SMs)
 *     gives the same bits for the same batch, and a row alone (M = 1) the same bits as that row at several
 *     positions among random rows for M up to 300 (up to 2048 on the shapes of at most 3M weights);
 *   - x readable past the batch (wtc_params.x_rows) and NaN there: the same bits, products and SwiGLU epilogue;
 *   - CUDA-graph replay equal to eager; argument checks.
 * Prints "N passed, N failed"; skips (0 checks) on a device without the kernels' shared memory. */
extern "C" {
#include "quant.h"
#include "test.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "wtc.h"
#include "ops.h"
#include "test_rand.h"
#include "test_gpu.h"

static uint16_t to16(int bf16, float v) { return bf16 ? f32_to_bf16(v) : f32_to_fp16(v); }
static float from16(int bf16, uint16_t h) { return bf16 ? bf16_to_f32(h) : fp16_to_f32(h); }

static void rand16(int bf16, float scale, std::vector<uint16_t> &h, std::vector<float> &f, size_t n)
{
    h.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = to16(bf16, scale * rnd_normal());
        f[i] = from16(bf16, h[i]);
    }
}

struct Mat {
    int bf16, n_in, n_out;
    std::vector<float> wf;
    void *dw;
};

/* the launches' multiprocessor count (0: the device's); 3 makes the TMA form take other tiles */
static int s_sm_count;
/* the launches' wtc_params.x_rows (0: m) */
static int s_x_rows;

/* y of batch m (rows ldx / ldy apart, 0 = packed) in the given form; resid 0 none, 1 separate y_in, 2 in place */
static cudaError_t run(const Mat *a, const void *dx, int m, int ldx, int ldy, const float *yin_h, int resid, int form,
                       int graph, std::vector<float> &y)
{
    const int ly = ldy ? ldy : a->n_out;
    const size_t ny = (size_t)m * ly;
    float *dy, *dyin;
    tg_out_alloc(ny, resid, yin_h, &dy, &dyin);
    wtc_params p;
    memset(&p, 0, sizeof p);
    p.bf16 = a->bf16; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = m;
    p.x = dx; p.ldx = ldx; p.y = dy; p.ldy = ldy; p.y_in = dyin; p.form = form;
    p.sm_count = s_sm_count;
    p.x_rows = s_x_rows;
    p.workspace_bytes = wtc_workspace_bytes(a->n_in, a->n_out, m);
    if (p.workspace_bytes) CK(cudaMalloc(&p.workspace, p.workspace_bytes));
    const cudaError_t e = tg_launch(graph, [&](cudaStream_t st) { return wtc_launch(&p, st); });
    y.resize(ny);
    CK(cudaMemcpy(y.data(), dy, ny * 4, cudaMemcpyDeviceToHost));
    tg_out_free(resid, dy, dyin);
    cudaFree(p.workspace);
    return e;
}

static void *upload(const std::vector<uint16_t> &h)
{
    void *d;
    CK(cudaMalloc(&d, h.size() * 2 + 16));
    CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return d;
}

/* x of m rows uploaded with NaN rows after them up to x_rows (F16 and BF16 0xffff), for wtc_params.x_rows */
static void *upload_nan_rows(const std::vector<uint16_t> &xh, int n_in, int x_rows) {
    std::vector<uint16_t> xp((size_t)x_rows * n_in, 0xffff);
    memcpy(xp.data(), xh.data(), xh.size() * 2);
    return upload(xp);
}

static const char *tn(const Mat *a) { return a->bf16 ? "bf16" : "f16"; }

static void acc_case(const Mat *a, int m, int resid, int pad)
{
    const int ldx = a->n_in + pad, ldy = a->n_out + (pad ? 3 : 0);
    std::vector<uint16_t> xh;
    std::vector<float> xf, yin((size_t)m * ldy), y;
    rand16(a->bf16, 1.f, xh, xf, (size_t)m * ldx);
    for (auto &v : yin) v = rnd_normal();
    void *dx = upload(xh);
    const cudaError_t e = run(a, dx, m, pad ? ldx : 0, pad ? ldy : 0, yin.data(), resid, 0, 0, y);
    CHECK(e == cudaSuccess, "%s %dx%d m %d: launch %s", tn(a), a->n_out, a->n_in, m, cudaGetErrorString(e));
    const tg_cmp c = tg_oracle(a->wf.data(), xf.data(), ldx, yin.data(), y.data(), ldy, m, a->n_in, a->n_out,
                               resid, 0);
    CHECK(c.nan == 0 && c.bad == 0 && c.rel <= 1e-3, "%s %dx%d (ks %d) m %d resid %d pad %d: %d NaN, %d off, rel %.3g",
          tn(a), a->n_out, a->n_in, wtc_split(a->n_in, a->n_out), m, resid, pad, c.nan, c.bad, c.rel);
    cudaFree(dx);
}

/* the SwiGLU epilogue (wtc_params.glu): where wtc_glu_fused says it runs (the narrow kernel: automatic up to 16 rows;
 * the TMA form: automatic above 16 rows, or form 6 forced), the same bits as the product into y followed by
 * ops_swiglu_il8_dual, into a padded [m][ldg] (ldg = n_out / 2 + lpad: 8 keeps rows 16-byte aligned, 3 does not);
 * elsewhere a glu launch is refused. a's rows are read as gate/up blocks of 8 (n_out a multiple of 16). */
static void glu_case(const Mat *a, int m, int form, int lpad = 8) {
    const int ff = a->n_out / 2, ldg = ff + lpad;
    std::vector<uint16_t> xh;
    std::vector<float> xf, y;
    rand16(a->bf16, 1.f, xh, xf, (size_t)m * a->n_in);
    void *dx = upload(xh);
    wtc_params p;
    memset(&p, 0, sizeof p);
    p.bf16 = a->bf16; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = m; p.x = dx; p.form = form;
    p.ldg = ldg;
    p.sm_count = s_sm_count;
    const size_t ng = (size_t)m * ldg;
    void *dg = NULL, *dr = NULL;
    float *dy = NULL;
    CK(cudaMalloc(&dg, ng * 2));
    CK(cudaMalloc(&dr, ng * 2));
    CK(cudaMalloc(&dy, (size_t)m * a->n_out * 4));
    p.glu = dg;
    if (!wtc_glu_fused(&p)) {
        CHECK(wtc_launch(&p, 0) == cudaErrorInvalidValue, "%s %dx%d m %d form %d: a glu launch without the epilogue "
              "accepted", tn(a), a->n_out, a->n_in, m, form);
    } else {
        CK(cudaMemset(dg, 0xff, ng * 2));
        CK(cudaMemset(dr, 0xff, ng * 2));
        cudaError_t e = wtc_launch(&p, 0);
        CHECK(e == cudaSuccess, "%s %dx%d m %d form %d: glu launch %s", tn(a), a->n_out, a->n_in, m, form,
              cudaGetErrorString(e));
        wtc_params q = p;
        q.glu = NULL; q.y = dy;
        e = wtc_launch(&q, 0);
        CHECK(e == cudaSuccess, "plain launch %s", cudaGetErrorString(e));
        char err[256];
        for (int r = 0; r < m; r++)   /* the reference SwiGLU, row by row into the padded rows */
            CHECK(ops_swiglu_il8_dual(dy + (size_t)r * a->n_out, a->n_out, 1, ff, (uint16_t *)dr + (size_t)r * ldg,
                                      a->bf16 ? CU_BF16 : CU_F16, NULL, 0, 0, err, sizeof err) == 0, "%s", err);
        std::vector<uint16_t> hg(ng), hr(ng);
        CK(cudaMemcpy(hg.data(), dg, ng * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hr.data(), dr, ng * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < ng; i++) bad += hg[i] != hr[i];
        CHECK(bad == 0, "%s %dx%d m %d form %d: %zu of %zu glu values differ from product + ops_swiglu_il8_dual "
              "(padding included)", tn(a), a->n_out, a->n_in, m, form, bad, ng);
        /* x readable past m (x_rows), NaN there: the same values */
        const int xr = (m + 127) / 128 * 128 + 64;
        void *dxp = upload_nan_rows(xh, a->n_in, xr);
        CK(cudaMemset(dg, 0xff, ng * 2));
        wtc_params r = p;
        r.x = dxp;
        r.x_rows = xr;
        e = wtc_launch(&r, 0);
        CK(cudaMemcpy(hr.data(), dg, ng * 2, cudaMemcpyDeviceToHost));
        bad = 0;
        for (size_t i = 0; i < ng; i++) bad += hg[i] != hr[i];
        CHECK(e == cudaSuccess && bad == 0,
              "%s %dx%d m %d form %d: x_rows %d (NaN past m): %zu glu values differ "
              "(launch %s)",
              tn(a), a->n_out, a->n_in, m, form, xr, bad, cudaGetErrorString(e));
        cudaFree(dxp);
    }
    cudaFree(dx); cudaFree(dg); cudaFree(dr); cudaFree(dy);
}

/* every form gives the default's bits; graph replay the eager bits */
static void form_case(const Mat *a, int m)
{
    std::vector<uint16_t> xh;
    std::vector<float> xf, y0, y1;
    rand16(a->bf16, 1.f, xh, xf, (size_t)m * a->n_in);
    void *dx = upload(xh);
    run(a, dx, m, 0, 0, NULL, 0, 0, 0, y0);
    for (int form = 1; form <= 6; form++) {
        if ((form == 1 && m > 32) || (form >= 4 && !wtc_wgmma())) continue;
        /* the TMA form's tiles for 3 SMs too; the narrow kernel at multiprocessor counts at which a third CTA per
         * SM brings its 16-row tiles within one wave (shallower rings; 16 W rows a CTA from 9 rows) and at which
         * its 32-row tiles fit one CTA per SM (32 W rows a CTA from 9 rows) */
        const int third = ((a->n_out + 15) / 16 + 2) / 3, half = (a->n_out + 31) / 32;
        int sms_alt[3] = {0, 0, 0}, n_alt = 1;
        if (form == 6) sms_alt[n_alt++] = 3;
        if (form == 1 && m > 2) sms_alt[n_alt++] = third;
        if (form == 1 && m > 8) sms_alt[n_alt++] = half;
        for (int i = 0; i < n_alt; i++) {
            const int sms = sms_alt[i];
            s_sm_count = sms;
            const cudaError_t e = run(a, dx, m, 0, 0, NULL, 0, form, 0, y1);
            s_sm_count = 0;
            CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4),
                  "%s %dx%d m %d: form %d (sm_count %d) differs from the default (launch %s)", tn(a), a->n_out, a->n_in,
                  m, form, sms, cudaGetErrorString(e));
        }
    }
    const cudaError_t e = run(a, dx, m, 0, 0, NULL, 0, 0, 1, y1);
    CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4), "%s %dx%d m %d: graph replay != eager",
          tn(a), a->n_out, a->n_in, m);
    cudaFree(dx);
}

/* rows of x past m readable (wtc_params.x_rows, the last batch tile read whole), holding NaN: the bits of x_rows 0,
 * in the default form and the TMA one (also in its tiles for 3 SMs); x_rows below m refused */
static void xrows_case(const Mat *a, int m) {
    std::vector<uint16_t> xh;
    std::vector<float> xf, y0, y1;
    rand16(a->bf16, 1.f, xh, xf, (size_t)m * a->n_in);
    void *dx = upload(xh);
    run(a, dx, m, 0, 0, NULL, 0, 0, 0, y0);
    const int xr = (m + 127) / 128 * 128 + 64;
    void *dxp = upload_nan_rows(xh, a->n_in, xr);
    for (int form = 0; form <= 6; form += 6) {
        if (form == 6 && !wtc_wgmma()) continue;
        for (int sms = 0; sms <= (form == 6 ? 3 : 0); sms += 3) {
            s_x_rows = xr;
            s_sm_count = sms;
            const cudaError_t e = run(a, dxp, m, 0, 0, NULL, 0, form, 0, y1);
            s_x_rows = 0;
            s_sm_count = 0;
            CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4),
                  "%s %dx%d m %d: form %d (sm_count %d) with x_rows %d (NaN past m) differs from x_rows 0 (launch %s)",
                  tn(a), a->n_out, a->n_in, m, form, sms, xr, cudaGetErrorString(e));
        }
    }
    if (m > 1) {
        s_x_rows = m - 1;
        const cudaError_t e = run(a, dxp, m, 0, 0, NULL, 0, 0, 0, y1);
        s_x_rows = 0;
        CHECK(e == cudaErrorInvalidValue, "%s m %d: x_rows %d accepted (%s)", tn(a), m, m - 1, cudaGetErrorString(e));
    }
    cudaFree(dx);
    cudaFree(dxp);
}

/* a row alone vs the same row at positions 0, M/2, M-1 among random rows */
static void invariance_case(const Mat *a, int max_m)
{
    static const int Ms[] = {2, 3, 7, 8, 9, 16, 33, 64, 128, 256, 300, 2048};
    std::vector<uint16_t> xr, xb;
    std::vector<float> xf, y1, yM;
    rand16(a->bf16, 1.f, xr, xf, (size_t)a->n_in);
    void *dx1 = upload(xr);
    run(a, dx1, 1, 0, 0, NULL, 0, 0, 0, y1);
    cudaFree(dx1);
    for (int M : Ms) {
        if (M > max_m) continue;
        const int pos[3] = {0, M / 2, M - 1};
        for (int pi = 0; pi < 3; pi++) {
            if (pi > 0 && pos[pi] == pos[pi - 1]) continue;
            rand16(a->bf16, 1.f, xb, xf, (size_t)M * a->n_in);
            memcpy(xb.data() + (size_t)pos[pi] * a->n_in, xr.data(), (size_t)a->n_in * 2);
            void *dx = upload(xb);
            const cudaError_t e = run(a, dx, M, 0, 0, NULL, 0, 0, 0, yM);
            CHECK(e == cudaSuccess && !memcmp(yM.data() + (size_t)pos[pi] * a->n_out, y1.data(), (size_t)a->n_out * 4),
                  "%s %dx%d (ks %d): row at %d of M = %d differs from the row alone (launch %s)", tn(a), a->n_out,
                  a->n_in, wtc_split(a->n_in, a->n_out), pos[pi], M, cudaGetErrorString(e));
            cudaFree(dx);
        }
    }
}

static void arg_checks(const Mat *a)
{
    void *dx;
    float *dy;
    CK(cudaMalloc(&dx, (size_t)2 * a->n_in * 2 + 64));
    CK(cudaMalloc(&dy, (size_t)300 * a->n_out * 4));
    wtc_params p;
    memset(&p, 0, sizeof p);
    p.bf16 = a->bf16; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = 1; p.x = dx; p.y = dy;
    CHECK(wtc_launch(&p, 0) == cudaSuccess, "valid launch refused");
    wtc_params q = p; q.n_in = a->n_in + 32;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "n_in not a multiple of 64 accepted");
    q = p; q.x = (char *)dx + 8;
    CHECK(wtc_launch(&q, 0) == cudaErrorMisalignedAddress, "misaligned x accepted");
    q = p; q.ldx = a->n_in + 4;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "ldx not a multiple of 8 accepted");
    q = p; q.ldy = a->n_out - 1;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "ldy < n_out accepted");
    q = p; q.m = 0;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "m = 0 accepted");
    q = p;
    q.m = 33;
    q.form = 1;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "narrow form at m = 33 accepted");
    q = p; q.form = 7;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "form 7 accepted");
    if (wtc_split(a->n_in, a->n_out) > 1) {
        q = p; q.m = 16; q.form = 3;
        CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "per-split form without a workspace accepted");
    }
    q = p; q.w = NULL;
    CHECK(wtc_launch(&q, 0) == cudaErrorInvalidValue, "NULL w accepted");
    CHECK(wtc_launch(NULL, 0) == cudaErrorInvalidValue, "NULL params accepted");
    CK(cudaDeviceSynchronize());
    cudaFree(dx);
    cudaFree(dy);
}

int main(void)
{
    (void)raw_row;   /* tests/test_rand.h's GGUF rows: not needed here */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || !wtc_available()) {
        printf("test_wtc: no device with the kernels' shared memory: skipped\n");
        return test_report();
    }
    CHECK(wtc_supported(64, 1) && wtc_supported(14336, 4096) && !wtc_supported(96, 4) && !wtc_supported(600, 4) && wtc_supported(576, 4) &&
          !wtc_supported(4096, 0), "wtc_supported");
    CHECK(wtc_split(4096, 4096) == 8 && wtc_split(4096, 28672) == 8 && wtc_split(4096, 128256) == 4 &&
              wtc_split(768, 20001) == 2 && wtc_split(192, 33) == 1 && wtc_split(14336, 4096) == 8 &&
              wtc_split(100, 16) == 0 && wtc_split(2048, 16400) == 4 && wtc_split(2048, 8192) == 4 &&
              wtc_split(256, 2000) == 4 && wtc_split(128, 1000) == 2,
          "wtc_split: %d %d %d %d %d %d %d", wtc_split(4096, 4096), wtc_split(4096, 28672), wtc_split(4096, 128256),
          wtc_split(768, 20001), wtc_split(192, 33), wtc_split(14336, 4096), wtc_split(2048, 16400));
    const int quick = getenv("ZLLM_GPU_TEST_QUICK") && atoi(getenv("ZLLM_GPU_TEST_QUICK"));
    static const int shapes[][2] = {
        {64, 1},     {64, 17},     {192, 33},    {2048, 40},    {1024, 4001}, {768, 20001},
        {4096, 300}, {14336, 130}, {2048, 3000}, {2048, 16400}, /* 4 splits by the second rule of wtc_split */
        {256, 2000},                                            /* 4 splits: the k-split pair's halves of 2 splits */
        {128, 1000}};                                           /* 2 splits: halves of 1 */
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (quick && s % 3) continue;
            Mat a;
            a.bf16 = bf16; a.n_in = shapes[s][0]; a.n_out = shapes[s][1];
            std::vector<uint16_t> wh;
            rand16(bf16, 0.05f, wh, a.wf, (size_t)a.n_in * a.n_out);
            a.dw = upload(wh);
            const long work = (long)a.n_in * a.n_out;
            static const int ms[] = {1, 3, 8, 9, 16, 32, 64, 130};
            for (int m : ms)
                if (work * m <= 300000000L) acc_case(&a, m, 0, 0);
            acc_case(&a, 3, 1, 0);
            acc_case(&a, 5, 2, 0);
            acc_case(&a, 4, 1, 8);
            acc_case(&a, 20, 2, 8);
            form_case(&a, 1);
            form_case(&a, 7);
            form_case(&a, 12);
            form_case(&a, 16);
            form_case(&a, 20);
            form_case(&a, 32);
            form_case(&a, 37);
            form_case(&a, 64);  /* the k-split pair (ws_kpair) where its pairs fit one wave */
            form_case(&a, 100); /* 65 to 128 rows: 64-row tiles in CTA pairs (ws_paired) or 128-row ones */
            if (work <= 20000000L) form_case(&a, 200);
            xrows_case(&a, 20);
            xrows_case(&a, 37);
            if (work <= 20000000L) xrows_case(&a, 144);
            invariance_case(&a, work <= 3000000L ? 2048 : 300);
            if (s == 3 || s == 6) arg_checks(&a);
            cudaFree(a.dw);
        }
    /* the SwiGLU epilogue on gate/up-shaped products (n_out = 2 ffn) */
    /* (the last: a last W tile of 16 rows in the TMA form's 128-row tiles) */
    static const int gshapes[][2] = {{2048, 2 * 1024}, {1024, 2 * 2816}, {4096, 2 * 512}, {1024, 2 * 520}};
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (size_t s = 0; s < sizeof gshapes / sizeof gshapes[0]; s++) {
            Mat a;
            a.bf16 = bf16; a.n_in = gshapes[s][0]; a.n_out = gshapes[s][1];
            std::vector<uint16_t> wh;
            rand16(bf16, 0.05f, wh, a.wf, (size_t)a.n_in * a.n_out);
            a.dw = upload(wh);
            static const int gm[] = {1, 2, 3, 8, 9, 16, 17, 32, 33, 64, 130, 2048};
            for (int m : gm) glu_case(&a, m, 0);
            glu_case(&a, 9, 6);
            glu_case(&a, 64, 5);
            s_sm_count = 3; /* the TMA form's tiles for 3 SMs */
            glu_case(&a, 33, 6);
            glu_case(&a, 300, 0);
            glu_case(&a, 300, 0, 3);
            s_sm_count = 0;
            glu_case(&a, 130, 0, 3);
            s_sm_count = 40; /* (nx0, 4) tiles (four consumer warpgroups) for the 5632-row shape */
            glu_case(&a, 64, 0);
            glu_case(&a, 48, 0);
            glu_case(&a, 20, 6);
            s_sm_count = 0;
            cudaFree(a.dw);
        }
    return test_report();
}
