/* cuda/test_attention.cu: flash decoding and prefill attention against a CPU reference in double precision.
 * Fresh random inputs for every case (seeded from the clock unless ZLLM_TEST_SEED is set; the seed is printed),
 * outputs poisoned with NaN before each launch; relative error ||gpu - ref|| / ||ref|| at most 1e-5 for F32
 * caches and 1e-2 for F16/BF16 (the reference reads the same rounded cache values). Also: graph capture at a
 * fixed max_kv_len replayed with changed lengths, rows of kv_len 0 on a sentinel slot, batch invariance (a
 * row's output is bit-identical alone and in a batch), and parameter validation. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "attention.h"
#include "attn_decode_tc.h"
#include "attn_prefill_tc.h"
#include "attn_prefill_wg.h"
#include "wtc.h"
#include "test.h"
#include "test_util.cuh"

static float rnd_f(void) { return rnd_unit() * 2.f - 1.f; } /* [-1,1) */

static size_t type_size(attn_kv_type t) { return t == ATTN_KV_F32 ? 4 : 2; }
static const char *type_name(attn_kv_type t) { return t == ATTN_KV_F32 ? "f32" : t == ATTN_KV_F16 ? "f16" : "bf16"; }

/* host cache of n elements: random values stored in type t, plus their exact f32 values */
struct host_cache {
    std::vector<unsigned char> raw;
    std::vector<float> val;
};
static void fill_cache(host_cache *c, size_t n, attn_kv_type t, float amp) {
    c->raw.resize(n * type_size(t));
    c->val.resize(n);
    for (size_t i = 0; i < n; i++) {
        float x = rnd_f() * amp;
        if (t == ATTN_KV_F32) {
            memcpy(&c->raw[i * 4], &x, 4);
        } else if (t == ATTN_KV_F16) {
            __half h = __float2half(x);
            memcpy(&c->raw[i * 2], &h, 2);
            x = __half2float(h);
        } else {
            __nv_bfloat16 h = __float2bfloat16(x);
            memcpy(&c->raw[i * 2], &h, 2);
            x = __bfloat162float(h);
        }
        c->val[i] = x;
    }
}

/* reference attention of one query row (all heads) over positions [0, len) of a slot */
static void ref_row(const float *q, const float *kc, const float *vc, int slot, int len, int n_ctx, int n_heads,
                    int n_kv, int D, double scale, double *out) {
    const int group = n_heads / n_kv;
    std::vector<double> s((size_t)(len > 0 ? len : 1));
    for (int h = 0; h < n_heads; h++) {
        const int kvh = h / group;
        double *o = out + (size_t)h * D;
        for (int d = 0; d < D; d++) o[d] = 0.0;
        if (len <= 0) continue;
        double mx = -INFINITY;
        for (int t = 0; t < len; t++) {
            const float *k = kc + (((size_t)slot * n_ctx + t) * n_kv + kvh) * D;
            double a = 0.0;
            for (int d = 0; d < D; d++) a += (double)q[(size_t)h * D + d] * k[d];
            s[t] = a * scale;
            if (s[t] > mx) mx = s[t];
        }
        double sum = 0.0;
        for (int t = 0; t < len; t++) {
            s[t] = exp(s[t] - mx);
            sum += s[t];
        }
        for (int t = 0; t < len; t++) {
            const float *v = vc + (((size_t)slot * n_ctx + t) * n_kv + kvh) * D;
            const double w = s[t] / sum;
            for (int d = 0; d < D; d++) o[d] += w * v[d];
        }
    }
}

/* ||a - ref|| / ||ref||; NaN in a gives NaN (fails every <= test) */
static double rel_err(const float *a, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static double tol_for(attn_kv_type t) { return t == ATTN_KV_F32 ? 1e-5 : 1e-2; }

static void poison(void *p, size_t bytes) { CUDA_OK(cudaMemset(p, 0xff, bytes)); }   /* 0xffffffff is a NaN */

struct decode_case {
    int n_seq, n_heads, n_kv, D, n_ctx, max_len;
    attn_kv_type t;
    int n_splits;     /* 0: automatic */
    int zero_rows;    /* 1: some rows get kv_len 0 on a sentinel slot */
};

/* one decode case: random caches and queries, random lengths in [0 or 1, max_len] (the first row at max_len) */
static void run_decode_case(const decode_case &c) {
    const int n_slots = c.n_seq + 2, sentinel = n_slots - 1;
    const size_t cache_n = (size_t)n_slots * c.n_ctx * c.n_kv * c.D;
    host_cache kc, vc;
    fill_cache(&kc, cache_n, c.t, 1.0f);
    fill_cache(&vc, cache_n, c.t, 1.0f);
    const size_t qn = (size_t)c.n_seq * c.n_heads * c.D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.0f;
    /* slots: a random permutation of [0, n_slots - 1) */
    std::vector<int32_t> slot(c.n_seq), len(c.n_seq);
    std::vector<int32_t> perm(n_slots - 1);
    for (int i = 0; i < n_slots - 1; i++) perm[i] = i;
    for (int i = n_slots - 2; i > 0; i--) { int j = rnd_i(i + 1); int x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
    for (int i = 0; i < c.n_seq; i++) {
        slot[i] = perm[i];
        len[i] = i == 0 ? c.max_len : 1 + rnd_i(c.max_len);
        if (c.zero_rows && i > 0 && rnd_i(4) == 0) {
            len[i] = 0;
            slot[i] = sentinel;
        }
    }
    std::vector<double> ref(qn);
    for (int i = 0; i < c.n_seq; i++)
        ref_row(&q[(size_t)i * c.n_heads * c.D], kc.val.data(), vc.val.data(), slot[i], len[i], c.n_ctx, c.n_heads,
                c.n_kv, c.D, 1.0 / sqrt((double)c.D), &ref[(size_t)i * c.n_heads * c.D]);

    dev_buf dk(kc.raw.size()), dv(vc.raw.size()), dq(qn * 4), dout(qn * 4), dslot(c.n_seq * 4), dlen(c.n_seq * 4);
    CUDA_OK(cudaMemcpy(dk.p, kc.raw.data(), kc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.p, vc.raw.data(), vc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq.p, q.data(), qn * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dslot.p, slot.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dlen.p, len.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>();
    p.k_cache = dk.p;
    p.v_cache = dv.p;
    p.kv_type = c.t;
    p.slot = dslot.as<int32_t>();
    p.kv_len = dlen.as<int32_t>();
    p.out = dout.as<float>();
    p.n_seq = c.n_seq;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv;
    p.head_dim = c.D;
    p.n_ctx = c.n_ctx;
    p.max_kv_len = c.max_len;
    p.n_splits = c.n_splits;
    const size_t wsb = attn_decode_workspace_bytes(&p);
    dev_buf ws(wsb);
    CUDA_OK(attn_decode_workspace_init(ws.p, wsb, 0));
    p.workspace = ws.p;
    p.workspace_bytes = wsb;
    /* one launch with poisoned outputs: the launch succeeds, the result is within tolerance of the reference and
     * rows of kv_len 0 are exactly zero; returns the relative error, the output left in out */
    std::vector<float> out(qn);
    auto run_checked = [&](const attn_decode_params &pk, const char *what) {
        poison(dout.p, qn * 4);
        const cudaError_t e = attn_decode_launch(&pk, 0);
        CHECK(e == cudaSuccess, "decode launch (%s): %s", what, cudaGetErrorString(e));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out.data(), dout.p, qn * 4, cudaMemcpyDeviceToHost));
        const double err = rel_err(out.data(), ref.data(), qn);
        int zeros_ok = 1;
        for (int i = 0; i < c.n_seq; i++)
            if (len[i] == 0)
                for (int j = 0; j < c.n_heads * c.D; j++) zeros_ok &= out[(size_t)i * c.n_heads * c.D + j] == 0.0f;
        CHECK(err <= tol_for(c.t), "decode %s %s seq=%d heads=%d/%d D=%d len=%d: rel_err %g", what, type_name(c.t),
              c.n_seq, c.n_heads, c.n_kv, c.D, c.max_len, err);
        CHECK(zeros_ok, "decode %s: rows with kv_len 0 must be exactly zero", what);
        return err;
    };
    const double err = run_checked(p, "default kernel");
    printf("decode %-4s seq=%-3d heads=%d/%d D=%-3d max_len=%-5d splits=%-4d rel_err=%.3g\n", type_name(c.t),
           c.n_seq, c.n_heads, c.n_kv, c.D, c.max_len, attn_decode_splits(&p), err);
    /* each kernel explicitly: chunk + reduce kernel (1), chunk with its own split merge (3) */
    for (int k = 1; k <= 3; k += 2) {
        attn_decode_params pk = p;
        pk.kernel = k;
        char what[32];
        snprintf(what, sizeof what, "kernel %d", k);
        const double ek = run_checked(pk, what);
        if (k == 3) printf("       kernel %d rel_err=%.3g\n", k, ek);
    }
    {   /* kernel 2 is not a kernel: refused */
        attn_decode_params p2 = p;
        p2.kernel = 2;
        CHECK(attn_decode_launch(&p2, 0) == cudaErrorInvalidValue, "kernel 2 must be refused");
    }
    /* the tensor-core kernel (4) where it serves the shape: every block size G gives the same bits (one fixed
     * merge tree over the chunks), within tolerance of the reference; elsewhere kernel 4 is refused */
    attn_decode_params p4 = p;
    p4.kernel = 4;
    if (!attn_decode_tc_served(&p4)) {
        CHECK(attn_decode_launch(&p4, 0) == cudaErrorInvalidValue, "kernel 4 on a shape it does not serve must fail");
        return;
    }
    std::vector<float> first;
    /* (warps per block G, chunks per warp, cluster fold): automatic first, then forced combinations; cluster -1
     * folds a row's blocks through the workspace, 0 through a thread-block cluster where the launch allows (2..8
     * blocks per row on sm_90), lpw 4 runs as 2 for groups above 8 */
    const int forms[][3] = {{0, 0, 0}, {0, 0, -1}, {1, 1, -1}, {2, 2, -1}, {4, 1, -1}, {8, 2, -1}, {1, 2, -1},
                            {8, 1, -1}, {1, 1, 0}, {2, 2, 0}, {4, 1, 0}, {1, 4, 0}, {2, 4, -1}, {4, 4, 0},
                            {8, 4, -1}, {1, 4, -1}};
    for (int fi = 0; fi < (int)(sizeof forms / sizeof forms[0]); fi++) {
        p4.tc_group = forms[fi][0];
        p4.tc_lpw = forms[fi][1];
        p4.tc_cluster = forms[fi][2];
        p4.kv_pre = fi & 1;   /* slot and kv_len (host-copied here) read before the PDL wait */
        p4.kv_early = (fi & 3) == 1;   /* ... and the first stages below kv_len - 1 */
        char what[80];
        snprintf(what, sizeof what, "kernel 4 G %d lpw %d cluster %d kv_pre %d", forms[fi][0], forms[fi][1],
                 forms[fi][2], p4.kv_pre);
        const double ek = run_checked(p4, what);
        if (fi == 0) {
            first = out;
            printf("       kernel 4 (tensor cores, %d chunks) rel_err=%.3g\n", attn_decode_tc_chunks(&p4), ek);
        } else {
            CHECK(memcmp(first.data(), out.data(), qn * 4) == 0,
                  "decode %s gives other bits than the automatic form", what);
        }
    }
    /* the 16-bit output (out_w): exactly the f32 output rounded to nearest in the cache type, out left untouched,
     * in the automatic form and in forms with cross-block merges; kernels 1-3 refuse it */
    std::vector<uint16_t> expect(qn), got(qn);
    for (size_t i = 0; i < qn; i++) {
        if (c.t == ATTN_KV_F16) {
            const __half h = __float2half_rn(first[i]);
            memcpy(&expect[i], &h, 2);
        } else {
            const __nv_bfloat16 h = __float2bfloat16_rn(first[i]);
            memcpy(&expect[i], &h, 2);
        }
    }
    dev_buf dw(qn * 2);
    const int wforms[][3] = {{0, 0, 0}, {1, 1, -1}, {8, 2, -1}, {2, 1, 0}, {1, 4, 0}};
    for (int fi = 0; fi < (int)(sizeof wforms / sizeof wforms[0]); fi++) {
        attn_decode_params pw = p4;
        pw.tc_group = wforms[fi][0];
        pw.tc_lpw = wforms[fi][1];
        pw.tc_cluster = wforms[fi][2];
        pw.out_w = dw.p;
        poison(dout.p, qn * 4);
        poison(dw.p, qn * 2);
        const cudaError_t e = attn_decode_launch(&pw, 0);
        CHECK(e == cudaSuccess, "decode with out_w (G %d lpw %d): %s", wforms[fi][0], wforms[fi][1],
              cudaGetErrorString(e));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), dw.p, qn * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(out.data(), dout.p, qn * 4, cudaMemcpyDeviceToHost));
        CHECK(memcmp(expect.data(), got.data(), qn * 2) == 0,
              "decode %s out_w (G %d lpw %d) differs from the rounded f32 output", type_name(c.t), wforms[fi][0],
              wforms[fi][1]);
        size_t touched = 0;
        for (size_t i = 0; i < qn; i++) touched += !(out[i] != out[i]);   /* the poison is a NaN */
        CHECK(touched == 0, "decode with out_w wrote %zu f32 outputs", touched);
    }
    attn_decode_params p1 = p;
    p1.kernel = 1;
    p1.out_w = dw.p;
    CHECK(attn_decode_launch(&p1, 0) == cudaErrorInvalidValue, "kernel 1 must refuse out_w");
}

/* CUDA graph: captured once at max_kv_len = n_ctx, replayed with two different length sets; plus batch
 * invariance: row 0 computed alone equals row 0 in the batch, bit for bit */
static void run_graph_case(attn_kv_type t, int kernel) {
    const int n_seq = 8, n_heads = 8, n_kv = 2, D = 64, n_ctx = 3000, n_slots = n_seq + 1;
    const size_t cache_n = (size_t)n_slots * n_ctx * n_kv * D;
    host_cache kc, vc;
    fill_cache(&kc, cache_n, t, 1.0f);
    fill_cache(&vc, cache_n, t, 1.0f);
    const size_t qn = (size_t)n_seq * n_heads * D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.0f;
    dev_buf dk(kc.raw.size()), dv(vc.raw.size()), dq(qn * 4), dout(qn * 4), dslot(n_seq * 4), dlen(n_seq * 4);
    CUDA_OK(cudaMemcpy(dk.p, kc.raw.data(), kc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.p, vc.raw.data(), vc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq.p, q.data(), qn * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> slot(n_seq);
    for (int i = 0; i < n_seq; i++) slot[i] = n_seq - 1 - i;
    CUDA_OK(cudaMemcpy(dslot.p, slot.data(), n_seq * 4, cudaMemcpyHostToDevice));
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>();
    p.k_cache = dk.p;
    p.v_cache = dv.p;
    p.kv_type = t;
    p.slot = dslot.as<int32_t>();
    p.kv_len = dlen.as<int32_t>();
    p.out = dout.as<float>();
    p.n_seq = n_seq;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv;
    p.head_dim = D;
    p.n_ctx = n_ctx;
    p.max_kv_len = n_ctx;
    p.kernel = kernel;
    const size_t wsb = attn_decode_workspace_bytes(&p);
    dev_buf ws(wsb);
    CUDA_OK(attn_decode_workspace_init(ws.p, wsb, 0));
    p.workspace = ws.p;
    p.workspace_bytes = wsb;
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cudaError_t le = attn_decode_launch(&p, st);
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CHECK(le == cudaSuccess, "decode launch under capture: %s", cudaGetErrorString(le));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> out(qn), row_batch;
    for (int rep = 0; rep < 2; rep++) {
        std::vector<int32_t> len(n_seq);
        for (int i = 0; i < n_seq; i++) len[i] = rep == 0 ? 1 + rnd_i(n_ctx) : 1 + rnd_i(300);
        len[1] = 0;
        len[2] = n_ctx;
        CUDA_OK(cudaMemcpyAsync(dlen.p, len.data(), n_seq * 4, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemsetAsync(dout.p, 0xff, qn * 4, st));
        CUDA_OK(cudaGraphLaunch(ge, st));
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaMemcpy(out.data(), dout.p, qn * 4, cudaMemcpyDeviceToHost));
        std::vector<double> ref(qn);
        for (int i = 0; i < n_seq; i++)
            ref_row(&q[(size_t)i * n_heads * D], kc.val.data(), vc.val.data(), slot[i], len[i], n_ctx, n_heads, n_kv,
                    D, 1.0 / sqrt((double)D), &ref[(size_t)i * n_heads * D]);
        const double err = rel_err(out.data(), ref.data(), qn);
        printf("graph  %-4s kernel %d replay %d rel_err=%.3g\n", type_name(t), kernel, rep, err);
        CHECK(err <= tol_for(t), "graph replay %d (%s, kernel %d): rel_err %g", rep, type_name(t), kernel, err);
        if (rep == 0) row_batch.assign(out.begin(), out.begin() + n_heads * D);
        if (rep == 0) {
            /* the same row 0 alone (n_seq 1), same max_kv_len: bit-identical */
            attn_decode_params p1 = p;
            p1.n_seq = 1;
            CUDA_OK(cudaMemsetAsync(dout.p, 0xff, qn * 4, st));
            CHECK(attn_decode_launch(&p1, st) == cudaSuccess, "decode n_seq 1");
            CUDA_OK(cudaStreamSynchronize(st));
            std::vector<float> alone(n_heads * D);
            CUDA_OK(cudaMemcpy(alone.data(), dout.p, alone.size() * 4, cudaMemcpyDeviceToHost));
            CHECK(memcmp(alone.data(), row_batch.data(), alone.size() * 4) == 0,
                  "batch invariance (kernel %d): row 0 alone differs from row 0 in a batch of %d", kernel, n_seq);
        }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
}

struct prefill_case {
    int n_seq, n_heads, n_kv, D, n_ctx, max_rows;
    attn_kv_type t;
    int tc = -1;      /* attn_prefill_tc_force: -1 default dispatch, 0 scalar kernel, 1 tensor-core kernel */
    int cont = 0;     /* 1: every sequence is a continuation chunk (pos0 > 0) */
    int inv = 0;      /* 1: also each sequence alone and sequence 0 in two chunks, bit-identical to the batch */
};

/* the kernel a prefill launch runs on (under the case's attn_prefill_tc_force, set while the case runs) */
static const char *prefill_kernel_name(const attn_prefill_params *p) {
    return !attn_prefill_tc_wants(p) ? "scalar" : attn_prefill_wg_wants(p) ? "tc-wgmma" : "tc";
}
static int s_wg_compared; /* prefill cases whose wgmma form was compared with the mma.sync kernel */

/* prefill: each sequence gets rows in [1, max_rows] at pos0 in [0, n_ctx - rows]; K/V of the slot are random
 * for every position (positions after pos0 + t must not influence row t) */
static void run_prefill_case(const prefill_case &c) {
    const int n_slots = c.n_seq + 1;
    const size_t cache_n = (size_t)n_slots * c.n_ctx * c.n_kv * c.D;
    host_cache kc, vc;
    fill_cache(&kc, cache_n, c.t, 1.0f);
    fill_cache(&vc, cache_n, c.t, 1.0f);
    std::vector<int32_t> row0(c.n_seq), rows(c.n_seq), slot(c.n_seq), pos0(c.n_seq);
    int n_rows = 0;
    for (int i = 0; i < c.n_seq; i++) {
        rows[i] = i == 0 ? c.max_rows : 1 + rnd_i(c.max_rows);
        pos0[i] = rnd_i(2) ? 0 : rnd_i(c.n_ctx - rows[i] + 1);
        if (c.cont) pos0[i] = 1 + rnd_i(c.n_ctx - rows[i]);
        slot[i] = n_slots - 1 - i;
        row0[i] = n_rows;
        n_rows += rows[i];
    }
    const size_t rn = (size_t)c.n_heads * c.D, qn = (size_t)n_rows * rn;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.0f;
    std::vector<double> ref(qn);
    for (int i = 0; i < c.n_seq; i++)
        for (int t = 0; t < rows[i]; t++)
            ref_row(&q[(size_t)(row0[i] + t) * rn], kc.val.data(), vc.val.data(), slot[i], pos0[i] + t + 1, c.n_ctx,
                    c.n_heads, c.n_kv, c.D, 1.0 / sqrt((double)c.D), &ref[(size_t)(row0[i] + t) * rn]);
    dev_buf dk(kc.raw.size()), dv(vc.raw.size()), dq(qn * 4), dout(qn * 4), dr0(c.n_seq * 4), drows(c.n_seq * 4),
        dslot(c.n_seq * 4), dpos(c.n_seq * 4);
    CUDA_OK(cudaMemcpy(dk.p, kc.raw.data(), kc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.p, vc.raw.data(), vc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq.p, q.data(), qn * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dr0.p, row0.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(drows.p, rows.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dslot.p, slot.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos.p, pos0.data(), c.n_seq * 4, cudaMemcpyHostToDevice));
    attn_prefill_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>();
    p.k_cache = dk.p;
    p.v_cache = dv.p;
    p.kv_type = c.t;
    p.seq_row0 = dr0.as<int32_t>();
    p.seq_rows = drows.as<int32_t>();
    p.seq_slot = dslot.as<int32_t>();
    p.seq_pos0 = dpos.as<int32_t>();
    p.out = dout.as<float>();
    p.n_seq = c.n_seq;
    p.max_rows = c.max_rows;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv;
    p.head_dim = c.D;
    p.n_ctx = c.n_ctx;
    poison(dout.p, qn * 4);
    if (c.tc >= 0) attn_prefill_tc_force(c.tc);
    cudaError_t e = attn_prefill_launch(&p, 0);
    CHECK(e == cudaSuccess, "prefill launch: %s", cudaGetErrorString(e));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> out(qn);
    CUDA_OK(cudaMemcpy(out.data(), dout.p, qn * 4, cudaMemcpyDeviceToHost));
    const double err = rel_err(out.data(), ref.data(), qn);
    printf("prefill %-4s seq=%-2d rows=%-5d heads=%d/%d D=%-3d rel_err=%.3g%s%s%s\n", type_name(c.t), c.n_seq, n_rows,
           c.n_heads, c.n_kv, c.D, err, c.tc >= 0 || c.cont ? " kernel=" : "", c.tc >= 0 || c.cont ?
           prefill_kernel_name(&p) : "", c.cont ? " (continuation chunks)" : "");
    CHECK(err <= tol_for(c.t), "prefill %s seq=%d heads=%d/%d D=%d: rel_err %g", type_name(c.t), c.n_seq, c.n_heads,
          c.n_kv, c.D, err);
    if (attn_prefill_tc_wants(&p) && attn_prefill_wg_wants(&p)) {
        /* the wgmma form gives the mma.sync kernel's bits */
        dev_buf dout3(qn * 4);
        std::vector<float> out3(qn);
        attn_prefill_params pm = p;
        pm.out = dout3.as<float>();
        poison(dout3.p, qn * 4);
        attn_prefill_wg_force(0);
        e = attn_prefill_launch(&pm, 0);
        attn_prefill_wg_force(-1);
        CHECK(e == cudaSuccess, "prefill launch (mma.sync form): %s", cudaGetErrorString(e));
        CUDA_OK(cudaMemcpy(out3.data(), dout3.p, qn * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(out3.data(), out.data(), qn * 4),
              "prefill %s seq=%d heads=%d/%d D=%d: the wgmma form differs from the mma.sync kernel", type_name(c.t),
              c.n_seq, c.n_heads, c.n_kv, c.D);
        s_wg_compared++;
    }
    if (c.inv) {
        /* batch invariance: each sequence alone, and sequence 0 as two continuation chunks, give the same bits */
        dev_buf dout2(qn * 4), dchunk(4 * 4);
        std::vector<float> out2(qn);
        int same = 1;
        for (int i = 0; i < c.n_seq; i++) {
            attn_prefill_params pa = p;
            pa.seq_row0 = dr0.as<int32_t>() + i; pa.seq_rows = drows.as<int32_t>() + i;
            pa.seq_slot = dslot.as<int32_t>() + i; pa.seq_pos0 = dpos.as<int32_t>() + i;
            pa.n_seq = 1; pa.max_rows = rows[i]; pa.out = dout2.as<float>();
            poison(dout2.p, qn * 4);
            CHECK(attn_prefill_launch(&pa, 0) == cudaSuccess, "prefill launch (sequence alone)");
            CUDA_OK(cudaMemcpy(out2.data(), dout2.p, qn * 4, cudaMemcpyDeviceToHost));
            same &= !memcmp(&out2[(size_t)row0[i] * rn], &out[(size_t)row0[i] * rn], (size_t)rows[i] * rn * 4);
        }
        CHECK(same, "prefill %s seq=%d heads=%d/%d D=%d: a sequence alone differs from the batch", type_name(c.t),
              c.n_seq, c.n_heads, c.n_kv, c.D);
        if (rows[0] >= 2) {
            const int a = 1 + rnd_i(rows[0] - 1);   /* chunk 1: rows [0, a), chunk 2: [a, rows) */
            const int32_t ch[2][4] = {{row0[0], a, slot[0], pos0[0]}, {row0[0] + a, rows[0] - a, slot[0], pos0[0] + a}};
            poison(dout2.p, qn * 4);
            for (int k = 0; k < 2; k++) {
                CUDA_OK(cudaMemcpy(dchunk.p, ch[k], sizeof ch[k], cudaMemcpyHostToDevice));
                attn_prefill_params pc = p;
                pc.seq_row0 = dchunk.as<int32_t>(); pc.seq_rows = dchunk.as<int32_t>() + 1;
                pc.seq_slot = dchunk.as<int32_t>() + 2; pc.seq_pos0 = dchunk.as<int32_t>() + 3;
                pc.n_seq = 1; pc.max_rows = ch[k][1]; pc.out = dout2.as<float>();
                CHECK(attn_prefill_launch(&pc, 0) == cudaSuccess, "prefill launch (chunk)");
                CUDA_OK(cudaDeviceSynchronize());
            }
            CUDA_OK(cudaMemcpy(out2.data(), dout2.p, qn * 4, cudaMemcpyDeviceToHost));
            CHECK(!memcmp(&out2[(size_t)row0[0] * rn], &out[(size_t)row0[0] * rn], (size_t)rows[0] * rn * 4),
                  "prefill %s heads=%d/%d D=%d: two chunks (split at %d of %d rows) differ from one launch",
                  type_name(c.t), c.n_heads, c.n_kv, c.D, a, rows[0]);
        }
        /* runs of one row (a 1-token prompt entry): sequence 0's first, last and a random row each alone give the
         * bits of the one launch */
        const int pick[3] = {0, rows[0] - 1, rnd_i(rows[0])};
        for (int k = 0; k < 3; k++) {
            const int t = pick[k];
            const int32_t ch[4] = {row0[0] + t, 1, slot[0], pos0[0] + t};
            CUDA_OK(cudaMemcpy(dchunk.p, ch, sizeof ch, cudaMemcpyHostToDevice));
            attn_prefill_params p1 = p;
            p1.seq_row0 = dchunk.as<int32_t>();
            p1.seq_rows = dchunk.as<int32_t>() + 1;
            p1.seq_slot = dchunk.as<int32_t>() + 2;
            p1.seq_pos0 = dchunk.as<int32_t>() + 3;
            p1.n_seq = 1;
            p1.max_rows = 1;
            p1.out = dout2.as<float>();
            poison(dout2.p, qn * 4);
            CHECK(attn_prefill_launch(&p1, 0) == cudaSuccess, "prefill launch (one row)");
            CUDA_OK(cudaMemcpy(out2.data(), dout2.p, qn * 4, cudaMemcpyDeviceToHost));
            const size_t at = (size_t)(row0[0] + t) * rn;
            CHECK(!memcmp(&out2[at], &out[at], rn * 4),
                  "prefill %s heads=%d/%d D=%d: row %d of %d as a run of one row differs from one launch",
                  type_name(c.t), c.n_heads, c.n_kv, c.D, t, rows[0]);
        }
    }
    if (c.tc >= 0) attn_prefill_tc_force(-1);
}

static void run_validation(void) {
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    CHECK(attn_decode_launch(&p, 0) == cudaErrorInvalidValue, "empty decode params must be rejected");
    CHECK(attn_decode_workspace_bytes(&p) == 0, "workspace of invalid params is 0");
    /* workspace bound never falls as max_kv_len or n_seq grows */
    p.n_seq = 3;
    p.n_heads = 32;
    p.n_kv_heads = 8;
    p.head_dim = 128;
    p.n_ctx = 200000;
    p.sm_count = 132;
    /* F32 caches (the CUDA-core kernels) and BF16 ones (the tensor-core kernel, whose partials carry m and l:
     * head_dim + 2 floats each, and whose chunk target changes at 64k keys) */
    const attn_kv_type wt[2] = {ATTN_KV_F32, ATTN_KV_BF16};
    for (int ti = 0; ti < 2; ti++) {
        p.kv_type = wt[ti];
        int mono = 1;
        size_t prev = 0;
        for (int L = 1; L <= 200000; L += 97) {
            p.max_kv_len = L;
            const size_t b = attn_decode_workspace_bytes(&p);
            p.n_seq = 2;
            const size_t b2 = attn_decode_workspace_bytes(&p);
            p.n_seq = 3;
            const size_t need = (size_t)3 * 32 * attn_decode_splits(&p) * (ti ? 130 : 129) * 4;
            mono &= b >= prev && b2 <= b && b >= need;
            prev = b;
        }
        CHECK(mono, "attn_decode_workspace_bytes (%s) must be monotone and cover the launch", type_name(wt[ti]));
    }
    p.kv_type = ATTN_KV_F32;
    attn_prefill_params pp;
    memset(&pp, 0, sizeof pp);
    CHECK(attn_prefill_launch(&pp, 0) == cudaErrorInvalidValue, "empty prefill params must be rejected");
}

/* one workspace, zeroed once, serving a sequence of launches of every kernel with different batches, lengths
 * and split counts (the merge counters live at its end and must be back at zero after every launch) */
static void run_reuse_case(attn_kv_type t) {
    const int max_seq = 12, n_heads = 8, n_kv = 2, D = 64, n_ctx = 5000, n_slots = max_seq;
    const size_t cache_n = (size_t)n_slots * n_ctx * n_kv * D;
    host_cache kc, vc;
    fill_cache(&kc, cache_n, t, 1.0f);
    fill_cache(&vc, cache_n, t, 1.0f);
    const size_t qn = (size_t)max_seq * n_heads * D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.0f;
    dev_buf dk(kc.raw.size()), dv(vc.raw.size()), dq(qn * 4), dout(qn * 4), dslot(max_seq * 4), dlen(max_seq * 4);
    CUDA_OK(cudaMemcpy(dk.p, kc.raw.data(), kc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.p, vc.raw.data(), vc.raw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq.p, q.data(), qn * 4, cudaMemcpyHostToDevice));
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>(); p.k_cache = dk.p; p.v_cache = dv.p; p.kv_type = t;
    p.slot = dslot.as<int32_t>(); p.kv_len = dlen.as<int32_t>(); p.out = dout.as<float>();
    p.n_heads = n_heads; p.n_kv_heads = n_kv; p.head_dim = D; p.n_ctx = n_ctx;
    p.n_seq = max_seq; p.max_kv_len = n_ctx;
    const size_t wsb = attn_decode_workspace_bytes(&p);
    dev_buf ws(wsb);
    CUDA_OK(attn_decode_workspace_init(ws.p, wsb, 0));
    p.workspace = ws.p;
    p.workspace_bytes = wsb;
    int bad = 0, runs = 0;
    double worst = 0;
    const int kernels[] = {0, 3, 1, 4, 1, 0, 3, 4};
    for (int it = 0; it < 16; it++) {
        p.n_seq = 1 + rnd_i(max_seq);
        p.max_kv_len = it % 3 == 0 ? n_ctx : 1 + rnd_i(n_ctx);
        p.kernel = kernels[it % 8];
        if (p.kernel == 4 && t == ATTN_KV_F32) p.kernel = 1;
        p.tc_group = p.kernel == 4 ? 1 << rnd_i(4) : 0;   /* G 1..8: more blocks per row, more counter use */
        p.tc_lpw = p.kernel == 4 ? rnd_i(4) : 0;
        if (p.tc_lpw == 3) p.tc_lpw = 4;
        p.tc_cluster = p.kernel == 4 ? rnd_i(2) - 1 : 0;
        std::vector<int32_t> slot(p.n_seq), len(p.n_seq);
        for (int i = 0; i < p.n_seq; i++) {
            slot[i] = (i * 5 + it) % n_slots;
            len[i] = rnd_i(4) == 0 ? 0 : 1 + rnd_i(p.max_kv_len);
        }
        CUDA_OK(cudaMemcpy(dslot.p, slot.data(), p.n_seq * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dlen.p, len.data(), p.n_seq * 4, cudaMemcpyHostToDevice));
        poison(dout.p, qn * 4);
        const cudaError_t e = attn_decode_launch(&p, 0);
        CHECK(e == cudaSuccess, "reuse launch %d: %s", it, cudaGetErrorString(e));
        CUDA_OK(cudaDeviceSynchronize());
        const size_t n = (size_t)p.n_seq * n_heads * D;
        std::vector<float> out(n);
        std::vector<double> ref(n);
        CUDA_OK(cudaMemcpy(out.data(), dout.p, n * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < p.n_seq; i++)
            ref_row(&q[(size_t)i * n_heads * D], kc.val.data(), vc.val.data(), slot[i], len[i], n_ctx, n_heads, n_kv,
                    D, 1.0 / sqrt((double)D), &ref[(size_t)i * n_heads * D]);
        const double err = rel_err(out.data(), ref.data(), n);
        if (err > worst) worst = err;
        bad += !(err <= tol_for(t));
        runs++;
    }
    printf("decode %-4s one workspace, %d launches of kernels 0-4 with changing batch/length/splits: worst rel_err=%.3g\n",
           type_name(t), runs, worst);
    CHECK(bad == 0, "decode with a reused workspace: %d of %d launches off (worst rel_err %g)", bad, runs, worst);
}

int main(void) {
    if (test_cuda_start() != 0) return test_report();
    run_validation();
    const attn_kv_type types[3] = {ATTN_KV_F32, ATTN_KV_F16, ATTN_KV_BF16};
    for (int ti = 0; ti < 3; ti++) {
        const attn_kv_type t = types[ti];
        /* n_seq, heads, kv heads, D, n_ctx, max_len, type, forced splits, zero rows */
        const decode_case dc[] = {
            {1, 8, 4, 8, 512, 300, t, 0, 0}, /* stories260K shape */
            {5, 8, 4, 8, 1024, 1024, t, 0, 1},
            {3, 4, 4, 16, 600, 555, t, 0, 1}, /* GQA 1 */
            {2, 8, 2, 32, 700, 700, t, 0, 0},
            {1, 32, 8, 128, 4096, 4096, t, 0, 0}, /* llama shape, batch 1 */
            {16, 32, 8, 128, 1100, 1033, t, 0, 1},
            {64, 8, 1, 64, 300, 257, t, 0, 1},    /* GQA 8, batch 64 */
            {7, 9, 3, 64, 2000, 1999, t, 0, 1},   /* SmolLM2-135M: GQA 3 */
            {3, 14, 2, 64, 1500, 1500, t, 0, 0},  /* GQA 7 */
            {2, 32, 2, 64, 800, 800, t, 0, 0},    /* GQA 16: two head tiles */
            {4, 16, 8, 128, 3000, 2900, t, 0, 1}, /* GQA 2 */
            {2, 8, 4, 256, 900, 900, t, 0, 0},
            {3, 8, 2, 128, 2000, 2000, t, 7, 1},   /* forced split count */
            {3, 8, 2, 128, 2000, 1, t, 0, 0},      /* one key */
            {48, 16, 4, 128, 2048, 2048, t, 0, 1}, /* more items than resident blocks: each walks several */
            {4, 8, 8, 64, 40000, 40000, t, 0, 1},  /* long rows: 49 splits of 832 keys */
            {4, 8, 2, 64, 9000, 9000, t, 200, 1},  /* 141 forced splits: the widest split merge */
            /* head sizes 80 and 96 (Phi-2, Phi-3 mini): teams with idle lanes, on the shapes above */
            {1, 32, 32, 96, 4096, 4096, t, 0, 0}, /* Phi-3 mini shape, batch 1 */
            {16, 32, 8, 96, 1100, 1033, t, 0, 1},
            {7, 9, 3, 80, 2000, 1999, t, 0, 1},  /* GQA 3 */
            {2, 32, 2, 80, 800, 800, t, 0, 0},   /* GQA 16: two head tiles */
            {4, 16, 8, 96, 3000, 2900, t, 0, 1}, /* GQA 2 */
            {3, 8, 2, 80, 2000, 2000, t, 7, 1},  /* forced split count: the reduce kernel */
            {48, 16, 4, 96, 2048, 2048, t, 0, 1},
            {4, 8, 8, 80, 40000, 40000, t, 0, 1}, /* long rows: the merge inside the chunk kernel */
            {4, 8, 2, 96, 9000, 9000, t, 200, 1},
        };
        for (const auto &c : dc) run_decode_case(c);
        for (int k = 0; k <= 3; k++) if (k != 2) run_graph_case(t, k);
        if (t != ATTN_KV_F32) run_graph_case(t, 4);
        run_reuse_case(t);
        const prefill_case pc[] = {
            {1, 8, 4, 8, 256, 200, t},    {3, 8, 4, 8, 512, 100, t},   {2, 4, 4, 16, 300, 70, t},
            {4, 32, 8, 128, 300, 100, t}, {3, 9, 3, 64, 400, 120, t},  {2, 8, 1, 64, 300, 33, t},
            {2, 4, 2, 256, 200, 40, t},   {2, 8, 8, 32, 100, 17, t},   {4, 32, 8, 96, 300, 100, t},
            {3, 9, 3, 80, 400, 120, t},   {2, 32, 32, 96, 300, 33, t},
        };
        for (const auto &c : pc) run_prefill_case(c);
        run_prefill_case({3, 8, 4, 64, 400, 120, t, -1, 0, 1}); /* invariance: alone, two chunks, runs of one row */
    }
    /* the tensor-core prefill kernel (cuda/attn_prefill_tc.cu): F16/BF16, head sizes 64/80/96/128, GQA 1/3/4/8, rows
     * not multiples of its tiles, continuation chunks, batch invariance; and the scalar kernel on the same shapes */
    for (int ti = 1; ti < 3; ti++) {
        const attn_kv_type t = types[ti];
        /* n_seq, heads, kv heads, D, n_ctx, max_rows, type, kernel, continuation, invariance */
        const prefill_case tc[] = {
            {1, 8, 2, 128, 1100, 1000, t, 1, 0, 1}, /* long prompt, GQA 4: 16 key tiles, several query tiles */
            {3, 8, 8, 128, 700, 300, t, 1, 1, 1},   /* GQA 1, continuation chunks */
            {4, 16, 2, 64, 600, 200, t, 1, 0, 1},   /* GQA 8 */
            {2, 8, 1, 128, 400, 130, t, 1, 1, 0},
            {5, 12, 12, 64, 500, 129, t, 1, 1, 1},
            {2, 9, 3, 64, 300, 65, t, 1, 0, 0},    /* GQA 3 */
            {6, 8, 2, 64, 300, 5, t, 1, 1, 1},     /* a few rows each */
            {3, 32, 8, 128, 300, 100, t, 0, 1, 1}, /* the scalar kernel on a served shape */
            /* head sizes 80 and 96: padded shared rows instead of the swizzle */
            {1, 8, 2, 96, 1100, 1000, t, 1, 0, 1},
            {3, 32, 32, 96, 700, 300, t, 1, 1, 1}, /* Phi-3 mini heads, continuation chunks */
            {4, 16, 2, 80, 600, 200, t, 1, 0, 1},  /* GQA 8 */
            {5, 12, 12, 80, 500, 129, t, 1, 1, 1},
            {2, 9, 3, 96, 300, 65, t, 1, 0, 0},   /* GQA 3 */
            {3, 32, 8, 96, 300, 100, t, 0, 1, 1}, /* the scalar kernel */
        };
        for (const auto &c : tc) run_prefill_case(c);
    }
    if (wtc_wgmma()) {
        CHECK(s_wg_compared > 0, "no prefill case ran the wgmma form on a device that has it");
        printf("prefill: the wgmma form gave the mma.sync kernel's bits in %d cases\n", s_wg_compared);
    }
    return test_report();
}
