/* cuda/test_qtc.cu: the tile-packed tensor-core quantized kernels (cuda/qtc.cu) against the CPU oracle.
 *
 * For Q4_K, Q6_K and Q8_0, several shapes (split-K counts 1 .. 8; n_out not a multiple of 16): W is half rows
 * quantized from random f32 rows with quant_quantize_row and half rows of random raw blocks (random bytes, sane
 * fp16 scales), packed on the host by qtc_pack; x is random, rounded to f16 (the kernel's input type); y is
 * NaN-poisoned before each launch. Reference: quant_dequant_row of the ORIGINAL GGUF rows (the oracle checked
 * against the gguf package; so the packing is checked too) and a double dot product. Checks: no NaN, every
 * element within 1e-3 of sum_i |w_i x_i|, and ||y - ref|| / ||ref|| <= 1e-3 over the case's whole output (the
 * kernel rounds each dequantized weight to f16, 2^-11 relative, so a batch row of 3 outputs whose sums cancel
 * can show a larger relative error on its own; the per-element bound holds everywhere); fused residual
 * (separate and in place); strided x/y; every fragment count nf, the narrow kernel with x staged (QTC_XS, refused
 * past its 64 KiB; the compact QTC_XC, refused past 64 KiB up to 8 columns and past 128 KiB from 9 to 16;
 * QTC_XR), the wide kernels and the 16-bit form (QTC_F16: strided, with residuals, over several row and column
 * chunks, in wtc's 192-row tiles, its SwiGLU epilogue) bitwise equal to the default; x given as the wgmma
 * kernel's images (x_image) bitwise equal to the default; the split partials a part_only launch leaves, summed
 * in split order on the host, equal to the default; every launch with hand-over flags leaves them zero, and a
 * launch without them gives the same bits; batch invariance: for M in {1,2,3,7,8,9,16,33,64,128,256}, a row
 * placed at several positions among random rows gives a y row bit-identical (memcmp) to the row alone, and the same at M = 2048; CUDA-graph replay equal to
 * eager; the narrow kernel's SwiGLU epilogue (qtc_params.glu) bitwise equal to the product followed by
 * ops_swiglu_il8_dual; two products in one launch (qtc_launch_pair, x staged and not) bitwise equal to two
 * launches; the Q4_K scale formula (q4k_scales) bit for bit against its f32 definition for every f16 d and every
 * 6-bit scale; packing and launch argument checks. Prints "N passed, N failed". */
extern "C" {
#include "quant.h"
#include "test.h"
}
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "ops.h"
#include "qtc.h"
#include "f16x2.cuh"
#include "wtc.h"

#define TEST_RAND_SEED 0x9E3779B97F4A7C15ull
#include "test_rand.h"
#include "test_gpu.h"

/* q4k_scales (cuda/f16x2.cuh, the Q4_K scales of every qtc kernel) against its f32 definition,
 * __float2half_rn(d * (float)sc), of -(dmin * (float)m) and of d * (float)sc * 0.0625f, for every f16 d and dmin
 * but NaN and every 6-bit sc and m (both halves: sub-block 0 takes (v, w), sub-block 1 (63 - v, 63 - w)): one
 * thread per d bit pattern; bad[0] counts mismatching bit patterns, bad[1] the d tried */
__global__ void q4k_scales_kernel(unsigned long long *bad)
{
    const uint32_t db = blockIdx.x * blockDim.x + threadIdx.x;
    if (db >= 65536) return;
    const float d = __half2float(__ushort_as_half((unsigned short)db));
    if (d != d) return;
    atomicAdd(&bad[1], 1ull);
    const uint32_t mb = db ^ 0x8001u;   /* dmin: another pattern, either sign */
    const float dmin = __half2float(__ushort_as_half((unsigned short)mb));
    const bool dmin_ok = dmin == dmin;   /* NaN dmin (paired with d = +-inf, or NaN d): its half not compared */
    auto bits = [](float v) { return (uint32_t)__half_as_ushort(__float2half_rn(v)); };
    unsigned long long n = 0;
    for (uint32_t v = 0; v < 64; v++)
        for (uint32_t w = 0; w < 64; w++) {
            const uint32_t v1 = 63 - v, w1 = 63 - w;
            uint32_t a01, n01, s01;
            q4k_scales(db | (mb << 16), v | (w << 6) | (v1 << 12) | (w1 << 18), a01, n01, s01);
            const uint32_t ea = bits(d * (float)v) | bits(d * (float)v1) << 16;
            const uint32_t en = bits(-(dmin * (float)w)) | bits(-(dmin * (float)w1)) << 16;
            const uint32_t es = bits(d * (float)v * 0.0625f) | bits(d * (float)v1 * 0.0625f) << 16;
            /* inf * 0 gives a NaN whose payload may differ: any NaN matches a NaN */
            auto same = [](uint32_t x, uint32_t y) {
                for (int h = 0; h < 2; h++) {
                    const uint32_t a = (x >> (16 * h)) & 0xffff, b = (y >> (16 * h)) & 0xffff;
                    const bool na = (a & 0x7c00) == 0x7c00 && (a & 0x3ff), nb = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
                    if (na != nb || (!na && a != b)) return false;
                }
                return true;
            };
            n += !same(a01, ea) + (dmin_ok && !same(n01, en)) + !same(s01, es);
        }
    if (n) atomicAdd(&bad[0], n);
}

static void q4k_scales_case(void)
{
    unsigned long long *d = NULL, h[2] = {1, 0};
    if (cudaMalloc(&d, sizeof h) == cudaSuccess && cudaMemset(d, 0, sizeof h) == cudaSuccess) {
        q4k_scales_kernel<<<256, 256>>>(d);
        if (cudaDeviceSynchronize() == cudaSuccess) cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    }
    cudaFree(d);
    CHECK(h[0] == 0 && h[1] == 65536 - 2046, "q4k_scales: %llu mismatches over %llu d", h[0], h[1]);
}

/* a weight matrix: packed tiles on the device, the oracle's dequantized copy of the GGUF rows on the host */
struct Mat {
    ggml_type t;
    int n_in, n_out;
    std::vector<float> wf;   /* [n_out][n_in] dequantized by the oracle from the GGUF rows */
    void *dw;                /* qtc_packed_bytes bytes on the device */
};

static void mat_make(Mat *a, ggml_type t, int n_in, int n_out)
{
    a->t = t; a->n_in = n_in; a->n_out = n_out;
    const size_t rb = ggml_row_bytes(t, n_in);
    std::vector<uint8_t> raw(rb * n_out);
    std::vector<float> src(n_in);
    a->wf.assign((size_t)n_in * n_out, 0.0f);
    for (int o = 0; o < n_out; o++) {
        uint8_t *row = raw.data() + (size_t)o * rb;
        if (o % 2 == 0) {
            const float scale = 0.02f * (float)(1 + o % 5);
            for (int i = 0; i < n_in; i++) src[i] = rnd_normal() * scale + (o % 3 == 0 ? 0.01f : 0.0f);
            if (quant_quantize_row(t, src.data(), row, n_in) != 0) { fprintf(stderr, "quantize failed\n"); exit(2); }
        } else {
            raw_row(t, row, rb);
        }
        if (quant_dequant_row(t, row, a->wf.data() + (size_t)o * n_in, n_in) != 0) {
            fprintf(stderr, "dequant failed\n");
            exit(2);
        }
    }
    const size_t pb = qtc_packed_bytes(t, n_in, n_out);
    std::vector<uint8_t> packed(pb);
    CHECK(pb > 0 && qtc_pack(t, raw.data(), rb, n_in, n_out, packed.data()) == 0, "%s %dx%d: qtc_pack failed",
          ggml_type_name(t), n_out, n_in);
    CHECK(qtc_pack(t, raw.data(), rb + 2, n_in, n_out, packed.data()) == -1, "row_bytes mismatch accepted");
    CK(cudaMalloc(&a->dw, pb));
    CK(cudaMemcpy(a->dw, packed.data(), pb, cudaMemcpyHostToDevice));
}

static void mat_free(Mat *a) { cudaFree(a->dw); a->dw = NULL; }


/* qtc_params.flags of run()'s launches (zeroed once: every launch must leave them zero), unless s_without_flags */
static unsigned *s_flags;
static bool s_without_flags;

/* the flags as every launch must leave them: all zero */
static void flags_zero_check(const Mat *a, int m, int nf) {
    std::vector<unsigned> h(qtc_flags_bytes() / sizeof(unsigned));
    CK(cudaMemcpy(h.data(), s_flags, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    size_t set = 0;
    for (unsigned f : h) set += f != 0;
    CHECK(set == 0, "%s %dx%d m %d nf %d: %zu hand-over flags left set", ggml_type_name(a->t), a->n_out, a->n_in, m, nf,
          set);
}

/* y for batch m with nf fragments per CTA (0 default), as host floats; resid: 0 none, 1 y_in separate, 2 in
 * place; graph: captured in a CUDA graph and replayed */
static cudaError_t run(const Mat *a, const uint16_t *dx, int m, int ldx, int ldy, const float *yin_h, int resid, int nf,
                       int graph, std::vector<float> &y, int x_perm = 0, int x_rows = 0, int x_image = 0) {
    const int ly = ldy ? ldy : a->n_out;
    const size_t ny = (size_t)m * ly;
    float *dy, *dyin;
    tg_out_alloc(ny, resid, yin_h, &dy, &dyin);
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = m;
    p.x = dx; p.ldx = ldx; p.y = dy; p.ldy = ldy; p.y_in = dyin;
    p.x_perm = x_perm;
    p.x_rows = x_rows;
    p.x_image = x_image;
    p.flags = s_without_flags ? NULL : s_flags;
    p.workspace_bytes = qtc_workspace_bytes(a->t, a->n_in, a->n_out);
    if (p.workspace_bytes) CK(cudaMalloc(&p.workspace, p.workspace_bytes));
    const cudaError_t e = tg_launch(graph, [&](cudaStream_t st) { return qtc_launch_nf(&p, nf, st); });
    if (p.flags) flags_zero_check(a, m, nf);
    y.resize(ny);
    CK(cudaMemcpy(y.data(), dy, ny * 4, cudaMemcpyDeviceToHost));
    tg_out_free(resid, dy, dyin);
    cudaFree(p.workspace);
    return e;
}

/* the SwiGLU epilogue (p.glu; W's rows taken as gate and up interleaved in blocks of 8) for batch m with nf
 * fragments (0 default): where qtc_glu_fused, the same bits as the product into y followed by
 * ops_swiglu_il8_dual, written into padded rows [m][ldg] and nothing past them; elsewhere the launch is refused */
static void glu_case(const Mat *a, int m, int nf)
{
    const int ff = a->n_out / 2, ldg = ff + 8;
    std::vector<uint16_t> xh;
    std::vector<float> xf, y;
    tg_rand_x_f16(xh, xf, (size_t)m * a->n_in);
    uint16_t *dx;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    const size_t ng = (size_t)m * ldg;
    uint16_t *dg = NULL, *dr = NULL;
    float *dy = NULL;
    CK(cudaMalloc(&dg, ng * 2));
    CK(cudaMalloc(&dr, ng * 2));
    CK(cudaMalloc(&dy, (size_t)m * a->n_out * 4));
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = m; p.x = dx;
    p.glu = dg; p.ldg = ldg;
    p.workspace_bytes = qtc_workspace_bytes(a->t, a->n_in, a->n_out);
    if (p.workspace_bytes) CK(cudaMalloc(&p.workspace, p.workspace_bytes));
    /* the 16-bit form serves the epilogue wherever it runs */
    if (nf == QTC_F16 ? !wtc_wgmma() : !qtc_glu_fused(&p)) {
        CHECK(qtc_launch_nf(&p, nf, 0) == cudaErrorInvalidValue, "%s %dx%d m %d nf %d: a glu launch without the "
              "epilogue accepted", ggml_type_name(a->t), a->n_out, a->n_in, m, nf);
    } else {
        CK(cudaMemset(dg, 0xff, ng * 2));
        CK(cudaMemset(dr, 0xff, ng * 2));
        cudaError_t e = qtc_launch_nf(&p, nf, 0);
        CHECK(e == cudaSuccess, "%s %dx%d m %d nf %d: glu launch %s", ggml_type_name(a->t), a->n_out, a->n_in, m, nf,
              cudaGetErrorString(e));
        qtc_params q = p;
        q.glu = NULL; q.y = dy;
        e = qtc_launch_nf(&q, 0, 0);
        CHECK(e == cudaSuccess, "plain launch %s", cudaGetErrorString(e));
        char err[256];
        for (int r = 0; r < m; r++)   /* the reference SwiGLU, row by row into the padded rows */
            CHECK(ops_swiglu_il8_dual(dy + (size_t)r * a->n_out, a->n_out, 1, ff, dr + (size_t)r * ldg, CU_F16, NULL,
                                      0, 0, err, sizeof err) == 0, "%s", err);
        std::vector<uint16_t> hg(ng), hr(ng);
        CK(cudaMemcpy(hg.data(), dg, ng * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hr.data(), dr, ng * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < ng; i++) bad += hg[i] != hr[i];
        CHECK(bad == 0, "%s %dx%d m %d nf %d: %zu of %zu glu values differ from product + ops_swiglu_il8_dual",
              ggml_type_name(a->t), a->n_out, a->n_in, m, nf, bad, ng);
    }
    cudaFree(p.workspace);
    cudaFree(dx);
    cudaFree(dg);
    cudaFree(dr);
    cudaFree(dy);
}

/* qtc_launch_pair: a Q/K matrix (Q4_K) and a V matrix (Q6_K) of one x in one launch, into the column slices of
 * one [m][ld] array, bitwise equal to the two launches; refused (cudaErrorNotSupported, nothing written) where it
 * does not apply */
static void pair_case(const Mat *a, const Mat *b, int m)
{
    const int ld = a->n_out + b->n_out + 5;
    std::vector<uint16_t> xh;
    std::vector<float> xf;
    tg_rand_x_f16(xh, xf, (size_t)m * a->n_in);
    uint16_t *dx;
    float *y0, *y1;
    const size_t ny = (size_t)m * ld;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&y0, ny * 4));
    CK(cudaMalloc(&y1, ny * 4));
    CK(cudaMemset(y0, 0xff, ny * 4));
    CK(cudaMemset(y1, 0xff, ny * 4));
    qtc_params p[2];
    for (int i = 0; i < 2; i++) {
        const Mat *w = i ? b : a;
        memset(&p[i], 0, sizeof p[i]);
        p[i].type = w->t; p[i].w = w->dw; p[i].n_in = w->n_in; p[i].n_out = w->n_out; p[i].m = m; p[i].x = dx;
        p[i].ldy = ld; p[i].y = y0 + (i ? a->n_out : 0);
        const cudaError_t e = qtc_launch(&p[i], 0);
        CHECK(e == cudaSuccess, "pair reference %d: %s", i, cudaGetErrorString(e));
    }
    p[0].y = y1; p[1].y = y1 + a->n_out;
    cudaError_t e = qtc_launch_pair(&p[0], &p[1], 0);
    CHECK(e == cudaSuccess, "qtc_launch_pair %s %d + %s %d, m %d: %s", ggml_type_name(a->t), a->n_out,
          ggml_type_name(b->t), b->n_out, m, cudaGetErrorString(e));
    std::vector<float> h0(ny), h1(ny);
    CK(cudaMemcpy(h0.data(), y0, ny * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), y1, ny * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(h0.data(), h1.data(), ny * 4), "qtc_launch_pair m %d: differs from the two launches", m);
    qtc_params q[2] = {p[0], p[1]};   /* refusals */
    q[0].m = q[1].m = 9;
    CHECK(qtc_launch_pair(&q[0], &q[1], 0) == cudaErrorNotSupported, "pair at m 9 accepted");
    CHECK(qtc_launch_pair(&p[1], &p[0], 0) == cudaErrorNotSupported, "pair (Q6_K, Q4_K) accepted");
    q[0] = p[0]; q[1] = p[1];
    q[0].y_in = q[0].y;
    CHECK(qtc_launch_pair(&q[0], &q[1], 0) == cudaErrorNotSupported, "pair with y_in accepted");
    q[0] = p[0]; q[1] = p[1];
    q[0].ldy = q[1].ldy = 0;   /* each product's own stride: one launch cannot serve both */
    CHECK(qtc_launch_pair(&q[0], &q[1], 0) == cudaErrorNotSupported, "pair with ldy 0 and unequal n_out accepted");
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h0.data(), y1, ny * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(h0.data(), h1.data(), ny * 4), "a refused pair wrote");
    cudaFree(dx); cudaFree(y0); cudaFree(y1);
}

/* 1 when the compact slice (QTC_XC) serves batch m: the warps' slices (ceil(units / kn) units of m columns each)
 * within 64 KiB up to 8 columns; from 9 to 16 columns (two fragments) on sm_90 only, within
 * 128 KiB and the CTA (2-stage rings of kn warps, the partial area, the slices) within 226 KiB */
static bool xc_fits(const Mat *a, int m) {
    const int kn = qtc_split_narrow(a->t, a->n_in, a->n_out), units = a->n_in / 256;
    const long xb = (long)kn * ((units + kn - 1) / kn) * m * 512;
    const long tb = a->t == GGML_Q4_K ? 2304 : a->t == GGML_Q6_K ? 3360 : 4352;
    if (m <= 8) return xb <= 65536;
    return m <= 16 && wtc_wgmma() && xb <= 128 * 1024 && kn * 2 * tb + 2L * kn * 2 * 512 + xb <= 226 * 1024;
}

/* accuracy of one case against the oracle */
static void acc_case(const Mat *a, int m, int resid, int pad, int nf)
{
    const int n_in = a->n_in, n_out = a->n_out, ldx = n_in + pad, ldy = n_out + (pad ? 3 : 0);
    std::vector<uint16_t> xh;
    std::vector<float> xf, yin((size_t)m * ldy), y;
    tg_rand_x_f16(xh, xf, (size_t)m * ldx);
    for (auto &v : yin) v = rnd_normal();
    uint16_t *dx;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    const cudaError_t e = run(a, dx, m, pad ? ldx : 0, pad ? ldy : 0, yin.data(), resid, nf, 0, y);
    CHECK(e == cudaSuccess, "%s %dx%d m %d: launch: %s", ggml_type_name(a->t), n_out, n_in, m, cudaGetErrorString(e));
    const tg_cmp c = tg_oracle(a->wf.data(), xf.data(), ldx, yin.data(), y.data(), ldy, m, n_in, n_out, resid, 0);
    const int nan = c.nan, bad = c.bad;
    const double worst = c.rel;
    CHECK(nan == 0 && bad == 0 && worst <= 1e-3,
          "%s %dx%d (ks %d) m %d resid %d pad %d nf %d: %d NaN, %d elements off, rel err %.3g",
          ggml_type_name(a->t), n_out, n_in, qtc_split(a->t, n_in, n_out), m, resid, pad, nf, nan, bad, worst);
    cudaFree(dx);
}

/* the split partials left in the workspace (part_only) where qtc_partials says the launch has them: summed in split
 * order on the host, the default launch's bits y0 (no residual); refused elsewhere */
static void partials_case(const Mat *a, const uint16_t *dx, int m, const std::vector<float> &y0) {
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t;
    p.w = a->dw;
    p.n_in = a->n_in;
    p.n_out = a->n_out;
    p.m = m;
    p.x = dx;
    p.flags = s_flags;
    p.workspace_bytes = qtc_workspace_bytes(a->t, a->n_in, a->n_out);
    float *dy = NULL;
    CK(cudaMalloc(&dy, (size_t)m * a->n_out * 4));
    p.y = dy;
    if (p.workspace_bytes) CK(cudaMalloc(&p.workspace, p.workspace_bytes));
    const int ks = qtc_partials(&p);
    p.part_only = 1;
    const cudaError_t e = qtc_launch(&p, 0);
    if (!ks) {
        CHECK(e == cudaErrorInvalidValue, "%s %dx%d m %d: part_only accepted without partials (%s)",
              ggml_type_name(a->t), a->n_out, a->n_in, m, cudaGetErrorString(e));
    } else {
        CHECK(ks == qtc_split(a->t, a->n_in, a->n_out), "qtc_partials %d, qtc_split %d", ks,
              qtc_split(a->t, a->n_in, a->n_out));
        const size_t n = (size_t)m * a->n_out;
        std::vector<float> part((size_t)ks * n);
        CK(cudaMemcpy(part.data(), p.workspace, part.size() * 4, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float v = part[i];
            for (int k = 1; k < ks; k++) v += part[k * n + i];
            bad += memcmp(&v, &y0[i], 4) != 0;
        }
        CHECK(e == cudaSuccess && bad == 0, "%s %dx%d m %d: %zu partial sums differ from the default (launch %s)",
              ggml_type_name(a->t), a->n_out, a->n_in, m, bad, cudaGetErrorString(e));
        if (s_flags) flags_zero_check(a, m, 0);
    }
    cudaFree(p.workspace);
    cudaFree(dy);
}

/* every nf gives the default's bits; graph replay gives the eager bits */
static void nf_graph_case(const Mat *a, int m)
{
    std::vector<uint16_t> xh;
    std::vector<float> xf, y0, y1;
    tg_rand_x_f16(xh, xf, (size_t)m * a->n_in);
    uint16_t *dx;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    run(a, dx, m, 0, 0, NULL, 0, 0, 0, y0);
    static const int nfs[] = {1, 2, 4, 8, QTC_XS, QTC_XR, QTC_XC, QTC_WIDE, QTC_WG, QTC_WG32, QTC_WG128, QTC_F16};
    /* the staged forms: up to 16 columns; the slice where the warps' slices (ceil(units / kn) units of 8 columns
     * each) fit in 64 KiB */
    const int kn = qtc_split_narrow(a->t, a->n_in, a->n_out), units = a->n_in / 256;
    const bool xs_fits = m <= 16 && (long)kn * ((units + kn - 1) / kn) * 8 * 512 <= 65536;
    for (int nf : nfs) {
        const cudaError_t e = run(a, dx, m, 0, 0, NULL, 0, nf, 0, y1);
        /* the wgmma forms are refused where no sm_90a code runs */
        if ((nf == QTC_WG || nf == QTC_WG32 || nf == QTC_WG128 || nf == QTC_F16) && !wtc_wgmma()) {
            CHECK(e == cudaErrorInvalidValue, "nf %d launched without wgmma: %s", nf, cudaGetErrorString(e));
            continue;
        }
        if ((nf == QTC_XS && !xs_fits) || (nf == QTC_XR && m > 16) || (nf == QTC_XC && !xc_fits(a, m))) {
            CHECK(e == cudaErrorInvalidValue, "%s %dx%d m %d: staged form %d accepted where x does not fit: %s",
                  ggml_type_name(a->t), a->n_out, a->n_in, m, nf, cudaGetErrorString(e));
            continue;
        }
        CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4),
              "%s %dx%d m %d: nf %d differs from the default (launch %s)", ggml_type_name(a->t), a->n_out, a->n_in,
              m, nf, cudaGetErrorString(e));
    }
    cudaError_t e = run(a, dx, m, 0, 0, NULL, 0, 0, 1, y1);
    CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4), "%s %dx%d m %d: graph replay != eager",
          ggml_type_name(a->t), a->n_out, a->n_in, m);
    partials_case(a, dx, m, y0);
    s_without_flags = true; /* the wgmma kernel without its hand-over flags: one CTA a split */
    e = run(a, dx, m, 0, 0, NULL, 0, 0, 0, y1);
    s_without_flags = false;
    CHECK(e == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4), "%s %dx%d m %d: without flags != with",
          ggml_type_name(a->t), a->n_out, a->n_in, m);
    cudaFree(dx);
}

/* the 16-bit form (QTC_F16) bitwise equal to the default with strided x and y and a residual (separate, or in
 * place), and refused where it does not run */
static void f16_case(const Mat *a, int m, int resid) {
    const int ldx = a->n_in + 8, ldy = a->n_out + 3;
    std::vector<uint16_t> xh;
    std::vector<float> xf, yin((size_t)m * ldy), y0, y1;
    tg_rand_x_f16(xh, xf, (size_t)m * ldx);
    for (float &v : yin) v = rnd_normal();
    uint16_t *dx;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    const cudaError_t e0 = run(a, dx, m, ldx, ldy, yin.data(), resid, 0, 0, y0);
    const cudaError_t e1 = run(a, dx, m, ldx, ldy, yin.data(), resid, QTC_F16, 0, y1);
    if (!wtc_wgmma()) {
        CHECK(e1 == cudaErrorInvalidValue, "QTC_F16 launched without wgmma: %s", cudaGetErrorString(e1));
    } else {
        CHECK(e0 == cudaSuccess && e1 == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4),
              "%s %dx%d m %d resid %d: the 16-bit form differs from the default (launch %s, %s)", ggml_type_name(a->t),
              a->n_out, a->n_in, m, resid, cudaGetErrorString(e0), cudaGetErrorString(e1));
        /* x given in the form's k order (x_perm), 5 rows of ones past m that the launch may read: the same bits;
         * refused where the default form is not the 16-bit one (m < 1,024). (No draw of the shared generator:
         * the later cases keep their inputs.) */
        std::vector<uint16_t> xp((size_t)(m + 5) * ldx, 0x3C00);
        for (int r = 0; r < m; r++)
            for (int k = 0; k < ldx; k++)
                xp[(size_t)r * ldx + (k < a->n_in ? (k & ~255) + qtc_kpos(k & 255) : k)] = xh[(size_t)r * ldx + k];
        uint16_t *dp;
        CK(cudaMalloc(&dp, xp.size() * 2));
        CK(cudaMemcpy(dp, xp.data(), xp.size() * 2, cudaMemcpyHostToDevice));
        std::vector<float> y2, y3;
        const cudaError_t e2 = run(a, dp, m, ldx, ldy, yin.data(), resid, QTC_F16, 0, y2, 1, m + 5);
        CHECK(e2 == cudaSuccess && !memcmp(y0.data(), y2.data(), y0.size() * 4),
              "%s %dx%d m %d resid %d: x in the k order (x_perm) differs from the default (launch %s)",
              ggml_type_name(a->t), a->n_out, a->n_in, m, resid, cudaGetErrorString(e2));
        const cudaError_t e3 = run(a, dp, m, ldx, ldy, yin.data(), resid, 0, 0, y3, 1, m + 5);
        CHECK(m >= 1024 ? e3 == cudaSuccess : e3 == cudaErrorInvalidValue, "x_perm at m %d with the default form: %s",
              m, cudaGetErrorString(e3));
        cudaFree(dp);
    }
    cudaFree(dx);
}

/* x given as the wgmma kernel's images (x_image, qtc_ximage_pos; the columns past m up to the block's end NaN):
 * bitwise the default's y with an in-place residual, in graphs too; refused where qtc_ximage_nx is 0 and for a
 * forced form other than the default */
static void ximage_case(const Mat *a, int m) {
    const int n_in = a->n_in;
    std::vector<uint16_t> xh;
    std::vector<float> xf, yin((size_t)m * a->n_out), y0, y1;
    tg_rand_x_f16(xh, xf, (size_t)m * n_in);
    for (float &v : yin) v = rnd_normal();
    qtc_params q;
    memset(&q, 0, sizeof q);
    q.type = a->t;
    q.w = a->dw;
    q.n_in = n_in;
    q.n_out = a->n_out;
    q.m = m;
    const int nx = qtc_ximage_nx(&q);
    const int cols = nx ? (m + nx - 1) / nx * nx : m;
    std::vector<uint16_t> img((size_t)cols * n_in, 0x7E00);
    for (int r = 0; r < m && nx; r++)
        for (int e = 0; e < n_in; e++) img[qtc_ximage_pos(nx, n_in / 256, r, e)] = xh[(size_t)r * n_in + e];
    uint16_t *dx, *di;
    CK(cudaMalloc(&dx, xh.size() * 2));
    CK(cudaMalloc(&di, img.size() * 2));
    CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(di, img.data(), img.size() * 2, cudaMemcpyHostToDevice));
    const cudaError_t e0 = run(a, dx, m, 0, 0, yin.data(), 2, 0, 0, y0);
    const cudaError_t e1 = run(a, di, m, 0, 0, yin.data(), 2, 0, 0, y1, 0, 0, 1);
    if (!nx) {
        CHECK(e1 == cudaErrorInvalidValue, "%s %dx%d m %d: x_image accepted without the wgmma form (%s)",
              ggml_type_name(a->t), a->n_out, n_in, m, cudaGetErrorString(e1));
    } else {
        CHECK(e0 == cudaSuccess && e1 == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4),
              "%s %dx%d m %d: x as images of %d columns differs from the default (launch %s, %s)", ggml_type_name(a->t),
              a->n_out, n_in, m, nx, cudaGetErrorString(e0), cudaGetErrorString(e1));
        const cudaError_t e2 = run(a, di, m, 0, 0, yin.data(), 2, 0, 1, y1, 0, 0, 1);
        CHECK(e2 == cudaSuccess && !memcmp(y0.data(), y1.data(), y0.size() * 4), "%s %dx%d m %d: x_image in a graph",
              ggml_type_name(a->t), a->n_out, n_in, m);
        const int other = nx == 32 ? QTC_WG : QTC_WG32;
        CHECK(run(a, di, m, 0, 0, NULL, 0, other, 0, y1, 0, 0, 1) == cudaErrorInvalidValue,
              "x_image accepted with form %d", other);
    }
    cudaFree(dx);
    cudaFree(di);
}

/* batch invariance: x row r alone (M = 1) vs the same row at positions 0, M/2 and M-1 among random rows */
static void invariance_case(const Mat *a)
{
    static const int Ms[] = {1, 2, 3, 7, 8, 9, 16, 33, 64, 128, 256};
    const int n_in = a->n_in, n_out = a->n_out;
    std::vector<uint16_t> xr, xb;
    std::vector<float> xf, y1, yM;
    tg_rand_x_f16(xr, xf, (size_t)n_in);
    uint16_t *dx;
    CK(cudaMalloc(&dx, (size_t)256 * n_in * 2));
    CK(cudaMemcpy(dx, xr.data(), (size_t)n_in * 2, cudaMemcpyHostToDevice));
    run(a, dx, 1, 0, 0, NULL, 0, 0, 0, y1);
    for (int M : Ms) {
        const int pos[3] = {0, M / 2, M - 1};
        for (int pi = 0; pi < 3; pi++) {
            if (pi > 0 && pos[pi] == pos[pi - 1]) continue;
            tg_rand_x_f16(xb, xf, (size_t)M * n_in);
            memcpy(xb.data() + (size_t)pos[pi] * n_in, xr.data(), (size_t)n_in * 2);
            CK(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
            const cudaError_t e = run(a, dx, M, 0, 0, NULL, 0, 0, 0, yM);
            CHECK(e == cudaSuccess && !memcmp(yM.data() + (size_t)pos[pi] * n_out, y1.data(), (size_t)n_out * 4),
                  "%s %dx%d (ks %d): row at position %d of M = %d differs from the row alone (launch %s)",
                  ggml_type_name(a->t), n_out, n_in, qtc_split(a->t, n_in, n_out), pos[pi], M,
                  cudaGetErrorString(e));
        }
    }
    cudaFree(dx);
}

static void arg_checks(const Mat *a)
{
    uint16_t *dx;
    float *dy;
    CK(cudaMalloc(&dx, (size_t)2 * a->n_in * 2 + 64));
    CK(cudaMalloc(&dy, (size_t)2 * a->n_out * 4));
    qtc_params p;
    memset(&p, 0, sizeof p);
    p.type = a->t; p.w = a->dw; p.n_in = a->n_in; p.n_out = a->n_out; p.m = 1;
    p.x = dx; p.y = dy;
    CHECK(qtc_launch(&p, 0) == cudaSuccess, "valid launch refused");
    qtc_params q = p; q.type = GGML_F32;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue && !qtc_supported(GGML_F32, 256, 16), "F32 accepted");
    q = p; q.type = GGML_Q4_0;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue, "Q4_0 accepted");
    q = p; q.n_in = a->n_in + 32;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue, "n_in not a multiple of 256 accepted");
    q = p; q.x = dx + 4;
    CHECK(qtc_launch(&q, 0) == cudaErrorMisalignedAddress, "misaligned x accepted");
    q = p; q.ldx = a->n_in + 4;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue, "ldx not a multiple of 8 accepted");
    q = p; q.ldy = a->n_out - 1;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue, "ldy < n_out accepted");
    q = p; q.m = 0;
    CHECK(qtc_launch(&q, 0) == cudaErrorInvalidValue, "m = 0 accepted");
    CHECK(qtc_launch_nf(&p, 3, 0) == cudaErrorInvalidValue, "nf 3 accepted");
    CHECK(qtc_launch(NULL, 0) == cudaErrorInvalidValue, "NULL params accepted");
    if (qtc_split(a->t, a->n_in, a->n_out) > 1) {   /* the wide kernel with splits needs its workspace */
        q = p; q.m = 1;
        CHECK(qtc_launch_nf(&q, QTC_WIDE, 0) == cudaErrorInvalidValue, "wide launch without a workspace accepted");
    }
    if (wtc_wgmma()) {   /* the wgmma kernel always (x in slot order), and all of it */
        q = p; q.m = 1;
        CHECK(qtc_launch_nf(&q, QTC_WG, 0) == cudaErrorInvalidValue, "wgmma launch without a workspace accepted");
        void *ws;
        const size_t need = qtc_workspace_bytes(a->t, a->n_in, a->n_out);
        CK(cudaMalloc(&ws, need));
        q.workspace = ws; q.workspace_bytes = need - 16;
        CHECK(qtc_launch_nf(&q, QTC_WG32, 0) == cudaErrorInvalidValue, "wgmma launch with a short workspace accepted");
        q.workspace_bytes = need;
        CHECK(qtc_launch_nf(&q, QTC_WG32, 0) == cudaSuccess, "wgmma launch with its workspace refused");
        CK(cudaDeviceSynchronize());
        cudaFree(ws);
    }
    CK(cudaDeviceSynchronize());
    cudaFree(dx);
    cudaFree(dy);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 2;
    }
    CHECK(qtc_supported(GGML_Q4_K, 256, 1) && qtc_supported(GGML_Q6_K, 4096, 4096) &&
          qtc_supported(GGML_Q8_0, 512, 3) && !qtc_supported(GGML_Q8_0, 96, 3) && !qtc_supported(GGML_F16, 256, 16) &&
          !qtc_supported(GGML_Q4_K, 256, 0), "qtc_supported");
    q4k_scales_case();
    if (qtc_flags_bytes()) {
        CK(cudaMalloc(&s_flags, qtc_flags_bytes()));
        CK(cudaMemset(s_flags, 0, qtc_flags_bytes()));
    }
    CHECK(qtc_packed_bytes(GGML_Q4_K, 4096, 4096) == (size_t)4096 * 16 * 144 &&
          qtc_packed_bytes(GGML_Q6_K, 512, 17) == (size_t)2 * 2 * 3360 &&
          qtc_packed_bytes(GGML_Q8_0, 256, 16) == 4352, "qtc_packed_bytes");
    /* split counts: a function of the shape only */
    CHECK(qtc_split(GGML_Q4_K, 4096, 4096) == 4 && qtc_split(GGML_Q4_K, 256, 40000) == 1 &&
          qtc_split(GGML_Q4_K, 4096, 128256) == 1 && qtc_split(GGML_Q4_K, 4096, 1024) == 8 &&
          qtc_split(GGML_Q4_K, 100, 16) == 0,
          "qtc_split: %d %d %d %d", qtc_split(GGML_Q4_K, 4096, 4096), qtc_split(GGML_Q4_K, 256, 40000),
          qtc_split(GGML_Q4_K, 4096, 128256), qtc_split(GGML_Q4_K, 4096, 1024));
    /* the narrow kernel's sub-splits: a multiple of qtc_split, more warps for matrices with few tiles */
    CHECK(qtc_split_narrow(GGML_Q4_K, 4096, 4096) == 8 && qtc_split_narrow(GGML_Q4_K, 4096, 28672) == 8 &&
          qtc_split_narrow(GGML_Q4_K, 4096, 128256) == 2 && qtc_split_narrow(GGML_Q4_K, 768, 20001) == 2 &&
          qtc_split_narrow(GGML_Q4_K, 100, 16) == 0 && qtc_split_narrow(GGML_Q8_0, 4096, 4096) == 8 &&
          qtc_split(GGML_Q8_0, 4096, 4097) == 4 && qtc_split_narrow(GGML_Q8_0, 4096, 4097) == 8 &&
          qtc_split_narrow(GGML_Q6_K, 14336, 4096) == 8 && qtc_split_narrow(GGML_Q6_K, 4096, 128256) == 2 &&
          qtc_split_narrow(GGML_Q8_0, 4096, 28672) == 4,
          "qtc_split_narrow: %d %d %d %d", qtc_split_narrow(GGML_Q4_K, 4096, 4096),
          qtc_split_narrow(GGML_Q4_K, 4096, 28672), qtc_split_narrow(GGML_Q4_K, 4096, 128256),
          qtc_split_narrow(GGML_Q4_K, 768, 20001));
    struct { ggml_type t; int n_in, n_out; } shapes[] = {
        /* ks 1 (one unit / many rows), 2, 4, 8; n_out not a multiple of 16 */
        {GGML_Q4_K, 256, 17}, {GGML_Q4_K, 2048, 40}, {GGML_Q4_K, 1024, 4001}, {GGML_Q4_K, 768, 20001},
        {GGML_Q6_K, 256, 17}, {GGML_Q6_K, 2048, 40}, {GGML_Q6_K, 1024, 4001}, {GGML_Q6_K, 768, 20001},
        {GGML_Q6_K, 1280, 33}, {GGML_Q4_K, 4096, 48}, {GGML_Q6_K, 4096, 48},
        {GGML_Q8_0, 256, 3}, {GGML_Q8_0, 512, 17}, {GGML_Q8_0, 1536, 129}, {GGML_Q8_0, 4096, 300},
        {GGML_Q8_0, 4096, 4097},   /* sub-splits: kn 8 over ks 4 */
        {GGML_Q4_K, 1024, 1536}, {GGML_Q8_0, 2048, 1024},   /* with the 48-row ones: the SwiGLU epilogue */
    };
    for (const auto &s : shapes) {
        const int ks = qtc_split(s.t, s.n_in, s.n_out), kn = qtc_split_narrow(s.t, s.n_in, s.n_out);
        CHECK(ks >= 1 && kn >= ks && kn % ks == 0 && kn <= 8, "%s %dx%d: ks %d, narrow %d", ggml_type_name(s.t),
              s.n_out, s.n_in, ks, kn);
        Mat a;
        mat_make(&a, s.t, s.n_in, s.n_out);
        const long work = (long)s.n_in * s.n_out;   /* keep the oracle's time bounded */
        const int ms[] = {1, 2, 3, 8, 9, 17, 64};
        for (int m : ms) {
            if (work * m > 400000000L) continue;
            acc_case(&a, m, 0, 0, 0);
        }
        acc_case(&a, 3, 1, 0, 0);     /* fused residual */
        acc_case(&a, 5, 2, 0, 0);     /* in place */
        acc_case(&a, 4, 1, 8, 0);     /* strided x and y */
        acc_case(&a, 20, 0, 0, 8);    /* the widest narrow tile on a partial column group */
        acc_case(&a, 3, 1, 8, QTC_WIDE); /* the wide kernel: few columns, strided, residual */
        if (xc_fits(&a, 2)) {            /* the compact slice: strided with a residual, and in place */
            acc_case(&a, 2, 1, 8, QTC_XC);
            acc_case(&a, 1, 2, 0, QTC_XC);
        }
        if (xc_fits(&a, 12)) acc_case(&a, 12, 1, 8, QTC_XC); /* its two fragments */
        if (wtc_wgmma()) {               /* the wgmma forms, the same way */
            acc_case(&a, 3, 1, 8, QTC_WG);
            acc_case(&a, 3, 1, 8, QTC_WG32);
            acc_case(&a, 3, 1, 8, QTC_WG128);
            acc_case(&a, 3, 1, 8, QTC_F16);
        }
        f16_case(&a, 3, 2);
        if (work * 200 <= 400000000L) f16_case(&a, 200, 1);
        nf_graph_case(&a, 37);
        nf_graph_case(&a, 5); /* the narrow forms: x staged (the default where it fits) and read from global */
        nf_graph_case(&a, 1);
        nf_graph_case(&a, 13);                                  /* two 8-column groups of the narrow kernel */
        if ((long)s.n_in * 8 * 2 > 65536) nf_graph_case(&a, 8); /* past the staged form's 64 KiB: refused */
        if (work * 100 <= 400000000L) nf_graph_case(&a, 100);   /* several column groups of every width */
        if (s.n_out >= 40) invariance_case(&a);
        if (s.n_out == 40 || s.n_out == 129) arg_checks(&a);
        mat_free(&a);
    }
    /* the SwiGLU epilogue on the shapes of 16-row multiples: every narrow batch size and form, refused above 8
     * (after the loop above, so that its random draws stay those the accuracy cases always had) */
    for (const auto &s : shapes) {
        if (s.n_out % 16) continue;
        Mat a;
        mat_make(&a, s.t, s.n_in, s.n_out);
        for (int m : {1, 2, 3, 8}) glu_case(&a, m, 0);
        for (int nf : {1, 2, 4, 8}) glu_case(&a, 5, nf);
        for (int m : {1, 5, 12})
            if (xc_fits(&a, m)) glu_case(&a, m, QTC_XC);
        glu_case(&a, 9, 0);
        glu_case(&a, 16, 0);
        glu_case(&a, 17, 0); /* past the narrow kernel: refused */
        glu_case(&a, 40, QTC_F16);
        mat_free(&a);
    }
    /* x as the wgmma kernel's images, at every column width and over two 256-column chunks */
    for (const auto &s : shapes) {
        Mat a;
        mat_make(&a, s.t, s.n_in, s.n_out);
        for (int m : {9, 17, 40, 64, 100, 300}) ximage_case(&a, m);
        mat_free(&a);
    }
    /* 3 units a warp: x past the slice form's 64 KiB, so the ring form serves 5 to 8 columns and the wide kernel
     * 9 and more (the SwiGLU epilogue refused there) */
    {
        Mat a;
        mat_make(&a, GGML_Q4_K, 6144, 64);
        for (int m : {3, 5, 8, 13}) acc_case(&a, m, 0, 0, 0);
        acc_case(&a, 6, 2, 0, 0);
        for (int m : {5, 8, 13}) nf_graph_case(&a, m);
        for (int m : {2, 8, 9}) glu_case(&a, m, 0);
        mat_free(&a);
    }
    /* more splits than one wave of CTAs holds at once on an H100 or H200 (the 8B Q/K/V shape; gate/up's 1,792
     * tiles): the wgmma kernel's even ranges (qtc.cu s_wg_nb), with splits cut between two CTAs (r 2 and 4), against
     * every other form and every row alone */
    for (const auto &s : {std::make_pair(GGML_Q8_0, 6144), std::make_pair(GGML_Q4_K, 28672)}) {
        Mat a;
        mat_make(&a, s.first, s.first == GGML_Q8_0 ? 4096 : 1024, s.second);
        for (int m : {37, 64, 200}) nf_graph_case(&a, m);
        invariance_case(&a);
        mat_free(&a);
    }
    /* two products in one launch: Q4_K_M's Q/K (Q4_K) and V (Q6_K) */
    {
        Mat qk, v;
        mat_make(&qk, GGML_Q4_K, 4096, 640);   /* 16 units a row: the narrow split of 8 both need */
        mat_make(&v, GGML_Q6_K, 4096, 128);
        for (int m : {1, 2, 5, 8}) pair_case(&qk, &v, m); /* x read from global memory, then staged */
        mat_free(&qk); mat_free(&v);
    }
    /* a prefill-sized batch on a layer-sized matrix: the big launch agrees with the same rows alone */
    {
        Mat a;
        mat_make(&a, GGML_Q4_K, 1024, 512);
        const int M = 2048;
        std::vector<uint16_t> xh;
        std::vector<float> xf, yb, ys;
        tg_rand_x_f16(xh, xf, (size_t)M * a.n_in);
        uint16_t *dx;
        CK(cudaMalloc(&dx, xh.size() * 2));
        CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
        run(&a, dx, M, 0, 0, NULL, 0, 0, 0, yb);
        int same = 1;
        for (int r0 = 0; r0 < M; r0 += 509) {
            run(&a, dx + (size_t)r0 * a.n_in, 1, 0, 0, NULL, 0, 0, 0, ys);
            same &= !memcmp(ys.data(), yb.data() + (size_t)r0 * a.n_out, (size_t)a.n_out * 4);
        }
        CHECK(same, "Q4_K M = 2048: rows differ from the same rows alone");
        cudaFree(dx);
        mat_free(&a);
    }
    /* the 16-bit form in wtc's 192-row tiles (ws_chained takes them for 300 rows of 8,192 outputs on 132 SMs: one
     * wave against two of 128-row tiles) */
    {
        Mat a;
        mat_make(&a, GGML_Q4_K, 1024, 8192);
        f16_case(&a, 300, 1);
        mat_free(&a);
    }
    /* the 16-bit form over two row and two column chunks (65,536 inputs: 1,024 rows and 512 columns a chunk) */
    for (ggml_type t : {GGML_Q4_K, GGML_Q8_0}) {
        Mat a;
        mat_make(&a, t, 65536, 1100);
        f16_case(&a, 600, 2);
        mat_free(&a);
    }
    cudaFree(s_flags);
    return test_report();
}
