/* cuda/lab/bench_prefill.cu: zllm-prefillbench, where the time of a prefill step goes (docs/cuda.md).
 *
 *   zllm-prefillbench [--shape 8b|1b] [--tokens P] [--reps N] [--attn-only]
 *
 * 1. Prefill attention alone at the shape (8b: 32/8 heads x 128, 1b: 32/8 heads x 64; BF16 KV cache, one
 *    sequence of P rows at pos0 0): the scalar kernel (cuda/attention.cu), the tensor-core kernel
 *    (cuda/attn_prefill_tc.cu) and, on a device that has it, its wgmma form (cuda/attn_prefill_wg.cu), median of N
 *    launches timed by CUDA event pairs; TFLOP/s counted as zllm-bench counts attention (2 * P^2 * n_heads *
 *    head_dim per layer, causal); whether the two tensor-core forms give the same bits, and the relative
 *    difference between the mma.sync form's and the scalar kernel's outputs.
 * 2. One transformer layer of prefill, op by op in the order of s_forward (cuda/engine_cuda.cu) with the same
 *    ops_* launchers and a cuBLAS handle set up as the engine's (32 MiB workspace, default math): RMSNorm, Q/K/V
 *    products, RoPE, KV append, attention, cast, output product (+ residual), RMSNorm, gate/up products,
 *    SwiGLU, down product (+ residual). Event pairs around each op, median over N repetitions; the table gives
 *    each op's ms, share and rate, and the layer total times the model's layer count. Weights and activations
 *    are random (speed does not depend on the values). Exit status 1 on any CUDA/cuBLAS error. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "attention.h"
#include "attn_prefill_tc.h"
#include "attn_prefill_wg.h"
#include "ops.h"

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)
#define OK(call) do { if ((call) != 0) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err); \
    exit(1); } } while (0)

struct shape {
    const char *name;
    int dim, ffn, n_heads, n_kv, head_dim, layers;
};
static const shape kShapes[] = {
    {"8b", 4096, 14336, 32, 8, 128, 32},   /* Llama-3.1-8B */
    {"1b", 2048, 8192, 32, 8, 64, 16},     /* Llama-3.2-1B */
};

/* deterministic pseudo-random fill: f32 in [-amp, amp) */
__global__ void k_fill_f32(float *p, size_t n, uint32_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = ((h >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f) * amp;
    }
}
static void fill_f32(float *p, size_t n, uint32_t seed, float amp) {
    k_fill_f32<<<1024, 256>>>(p, n, seed, amp);
    CK(cudaGetLastError());
}
static void fill_bf16(void *p, size_t n, uint32_t seed, float amp, float *tmp, size_t tmp_n) {
    char err[256] = "";
    for (size_t o = 0; o < n; o += tmp_n) {
        const size_t c = std::min(tmp_n, n - o);
        fill_f32(tmp, c, seed + (uint32_t)o, amp);
        OK(ops_convert(tmp, CU_F32, (uint16_t *)p + o, CU_BF16, c, 0, err, sizeof err));
    }
}
static void *dmalloc(size_t bytes) {
    void *p = nullptr;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

static void bench_attention(const shape &s, int P, int reps) {
    const int qd = s.n_heads * s.head_dim, kvd = s.n_kv * s.head_dim;
    float *q = (float *)dmalloc((size_t)P * qd * 4), *o1 = (float *)dmalloc((size_t)P * qd * 4),
          *o2 = (float *)dmalloc((size_t)P * qd * 4), *o3 = (float *)dmalloc((size_t)P * qd * 4),
          *tmp = (float *)dmalloc((size_t)P * kvd * 4);
    void *kc = dmalloc((size_t)P * kvd * 2), *vc = dmalloc((size_t)P * kvd * 2);
    int32_t *meta = (int32_t *)dmalloc(4 * 4);
    const int32_t h_meta[4] = {0, P, 0, 0};   /* row0, rows, slot, pos0 */
    CK(cudaMemcpy(meta, h_meta, sizeof h_meta, cudaMemcpyHostToDevice));
    fill_f32(q, (size_t)P * qd, 1, 2.f);
    fill_bf16(kc, (size_t)P * kvd, 2, 1.f, tmp, (size_t)P * kvd);
    fill_bf16(vc, (size_t)P * kvd, 3, 1.f, tmp, (size_t)P * kvd);
    attn_prefill_params p;
    memset(&p, 0, sizeof p);
    p.q = q; p.k_cache = kc; p.v_cache = vc; p.kv_type = ATTN_KV_BF16;
    p.seq_row0 = meta; p.seq_rows = meta + 1; p.seq_slot = meta + 2; p.seq_pos0 = meta + 3;
    p.n_seq = 1; p.max_rows = P; p.n_heads = s.n_heads; p.n_kv_heads = s.n_kv; p.head_dim = s.head_dim; p.n_ctx = P;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const double flops = 2.0 * P * (double)P * qd;
    double ms[3] = {0, 0, 0};
    static const char *const names[3] = {"scalar", "tc", "tc-wgmma"};
    for (int k = 0; k < 3; k++) {
        attn_prefill_tc_force(k ? 1 : 0);
        attn_prefill_wg_force(k == 1 ? 0 : -1);
        if (k == 2 && !attn_prefill_wg_wants(&p)) break;
        p.out = k == 2 ? o3 : k ? o2 : o1;
        std::vector<float> t;
        for (int i = -2; i < reps; i++) {
            CK(cudaEventRecord(a));
            CK(attn_prefill_launch(&p, 0));
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float x = 0;
            CK(cudaEventElapsedTime(&x, a, b));
            if (i >= 0) t.push_back(x);
        }
        ms[k] = median(t);
        printf("attention %s P=%d heads %d/%d x %d, %-8s kernel: %8.3f ms  %6.1f TFLOP/s  (x %d layers: %.1f ms)\n",
               s.name, P, s.n_heads, s.n_kv, s.head_dim, names[k], ms[k], flops / ms[k] / 1e9, s.layers,
               ms[k] * s.layers);
    }
    attn_prefill_tc_force(-1);
    attn_prefill_wg_force(-1);
    std::vector<float> h1((size_t)P * qd), h2((size_t)P * qd);
    if (ms[2] > 0) {
        std::vector<float> h3((size_t)P * qd);
        CK(cudaMemcpy(h2.data(), o2, h2.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h3.data(), o3, h3.size() * 4, cudaMemcpyDeviceToHost));
        printf("attention %s: tc-wgmma vs tc %s bits, speed-up %.2fx\n", s.name,
               memcmp(h2.data(), h3.data(), h2.size() * 4) ? "DIFFERENT" : "the same", ms[1] / ms[2]);
    }
    CK(cudaMemcpy(h1.data(), o1, h1.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2.data(), o2, h2.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < h1.size(); i++) {
        num += ((double)h2[i] - h1[i]) * ((double)h2[i] - h1[i]);
        den += (double)h1[i] * h1[i];
    }
    printf("attention %s: tc vs scalar relative difference %.3g, speed-up %.2fx\n\n", s.name, sqrt(num / den),
           ms[0] / ms[1]);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    cudaFree(q);
    cudaFree(o1);
    cudaFree(o2);
    cudaFree(o3);
    cudaFree(tmp);
    cudaFree(kc);
    cudaFree(vc);
    cudaFree(meta);
}

static void bench_layer(const shape &s, int P, int reps) {
    char err[512] = "";
    const int dim = s.dim, ff = s.ffn, qd = s.n_heads * s.head_dim, kvd = s.n_kv * s.head_dim;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); exit(1); }
    void *cbws = dmalloc((size_t)32 << 20);
    cublasSetStream(cb, st);
    cublasSetWorkspace(cb, cbws, (size_t)32 << 20);
    cublasSetMathMode(cb, CUBLAS_DEFAULT_MATH);
    /* weights (bf16) and norms (f32) */
    const size_t wn[7] = {(size_t)qd * dim, (size_t)kvd * dim, (size_t)kvd * dim, (size_t)dim * qd, (size_t)ff * dim,
                          (size_t)ff * dim, (size_t)dim * ff};
    void *w[7];
    float *tmp = (float *)dmalloc((size_t)64 << 20);
    for (int i = 0; i < 7; i++) {
        w[i] = dmalloc(wn[i] * 2);
        fill_bf16(w[i], wn[i], 10 + i, 0.02f, tmp, (size_t)16 << 20);
    }
    float *nw = (float *)dmalloc((size_t)dim * 4);
    fill_f32(nw, dim, 20, 1.f);
    float *x = (float *)dmalloc((size_t)P * dim * 4), *q = (float *)dmalloc((size_t)P * qd * 4),
          *k = (float *)dmalloc((size_t)P * kvd * 4), *v = (float *)dmalloc((size_t)P * kvd * 4),
          *att = (float *)dmalloc((size_t)P * qd * 4), *gate = (float *)dmalloc((size_t)P * ff * 4),
          *up = (float *)dmalloc((size_t)P * ff * 4);
    void *xb = dmalloc((size_t)P * (ff > dim ? ff : dim) * 2), *att_w = dmalloc((size_t)P * qd * 2);
    void *kc = dmalloc((size_t)P * kvd * 2), *vc = dmalloc((size_t)P * kvd * 2);
    fill_f32(x, (size_t)P * dim, 21, 1.f);
    std::vector<int32_t> hpos(P), hz(P, 0);
    for (int i = 0; i < P; i++) hpos[i] = i;
    int32_t *pos = (int32_t *)dmalloc((size_t)P * 4), *slot = (int32_t *)dmalloc((size_t)P * 4),
            *meta = (int32_t *)dmalloc(16);
    const int32_t h_meta[4] = {0, P, 0, 0};
    CK(cudaMemcpy(pos, hpos.data(), (size_t)P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(slot, hz.data(), (size_t)P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(meta, h_meta, 16, cudaMemcpyHostToDevice));
    std::vector<float> cs((size_t)P * s.head_dim);
    ops_rope_table_host(cs.data(), P, s.head_dim, 500000.0);
    float *dcs = (float *)dmalloc(cs.size() * 4);
    CK(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());

    enum { N_OPS = 16 };
    const char *names[N_OPS] = {"rmsnorm (attn)", "gemm q", "gemm k", "gemm v", "rope q", "rope k", "kv append",
                                "attention", "cast att", "gemm o (+resid)", "rmsnorm (ffn)", "gemm gate", "gemm up",
                                "swiglu", "gemm down (+resid)", "attention (scalar)"};
    const double gfl[N_OPS] = {0, 2.0 * P * qd * dim, 2.0 * P * kvd * dim, 2.0 * P * kvd * dim, 0, 0, 0,
                               2.0 * P * (double)P * qd, 0, 2.0 * P * (double)dim * qd, 0, 2.0 * P * (double)ff * dim,
                               2.0 * P * (double)ff * dim, 0, 2.0 * P * (double)dim * ff, 2.0 * P * (double)P * qd};
    /* bytes each element-wise op moves (reads + writes), for a GB/s column */
    const double gby[N_OPS] = {(double)P * dim * 6, 0, 0, 0, (double)P * qd * 8, (double)P * kvd * 8,
                               (double)P * kvd * 2 * 6, 0, (double)P * qd * 6, 0, (double)P * dim * 6, 0, 0,
                               (double)P * ff * 10, 0, 0};
    cudaEvent_t ev[N_OPS + 1];
    for (auto &e : ev) CK(cudaEventCreate(&e));
    std::vector<std::vector<float>> t(N_OPS);
    attn_prefill_params ap;
    memset(&ap, 0, sizeof ap);
    ap.q = q; ap.k_cache = kc; ap.v_cache = vc; ap.kv_type = ATTN_KV_BF16; ap.out = att;
    ap.seq_row0 = meta; ap.seq_rows = meta + 1; ap.seq_slot = meta + 2; ap.seq_pos0 = meta + 3;
    ap.n_seq = 1; ap.max_rows = P; ap.n_heads = s.n_heads; ap.n_kv_heads = s.n_kv; ap.head_dim = s.head_dim;
    ap.n_ctx = P;
    for (int r = -1; r < reps; r++) {
        int i = 0;
        CK(cudaEventRecord(ev[i], st));
#define STEP(call) do { OK(call); CK(cudaEventRecord(ev[++i], st)); } while (0)
        STEP(ops_rmsnorm_dual(x, NULL, nw, dim, 1e-5f, P, xb, CU_BF16, NULL, 0, st, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[0], CU_BF16, P, dim, qd, q, 0, 0.f, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[1], CU_BF16, P, dim, kvd, k, 0, 0.f, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[2], CU_BF16, P, dim, kvd, v, 0, 0.f, err, sizeof err));
        STEP(ops_rope(q, pos, P, s.n_heads, s.head_dim, s.head_dim, 1, dcs, st, err, sizeof err));
        STEP(ops_rope(k, pos, P, s.n_kv, s.head_dim, s.head_dim, 1, dcs, st, err, sizeof err));
        STEP(ops_kv_append(k, v, slot, pos, P, kvd, P, kc, vc, CU_BF16, st, err, sizeof err));
        attn_prefill_tc_force(-1);
        STEP((int)attn_prefill_launch(&ap, st));
        STEP(ops_cast_dual(att, (size_t)P * qd, att_w, CU_BF16, NULL, 0, st, err, sizeof err));
        STEP(ops_gemm(cb, att_w, w[3], CU_BF16, P, qd, dim, x, 0, 1.f, err, sizeof err));
        STEP(ops_rmsnorm_dual(x, NULL, nw, dim, 1e-5f, P, xb, CU_BF16, NULL, 0, st, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[4], CU_BF16, P, dim, ff, gate, 0, 0.f, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[5], CU_BF16, P, dim, ff, up, 0, 0.f, err, sizeof err));
        STEP(ops_swiglu_dual(gate, up, 0, P, ff, xb, CU_BF16, NULL, 0, st, err, sizeof err));
        STEP(ops_gemm(cb, xb, w[6], CU_BF16, P, ff, dim, x, 0, 1.f, err, sizeof err));
        attn_prefill_tc_force(0);
        STEP((int)attn_prefill_launch(&ap, st));
        attn_prefill_tc_force(-1);
#undef STEP
        fill_f32(x, (size_t)P * dim, 21, 1.f);   /* keep the residual stream bounded across repetitions */
        CK(cudaStreamSynchronize(st));
        CK(cudaDeviceSynchronize());
        for (int j = 0; j < N_OPS && r >= 0; j++) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, ev[j], ev[j + 1]));
            t[j].push_back(ms);
        }
    }
    double total = 0, gemm = 0, ew = 0;
    std::vector<double> med(N_OPS);
    for (int j = 0; j < N_OPS; j++) med[j] = median(t[j]);
    for (int j = 0; j < N_OPS - 1; j++) {
        total += med[j];
        if (!strncmp(names[j], "gemm", 4)) gemm += med[j];
        else if (strcmp(names[j], "attention")) ew += med[j];
    }
    printf("one layer of prefill, shape %s, P=%d (BF16; median of %d; x %d layers)\n", s.name, P, reps, s.layers);
    printf("%-20s %9s %7s %10s %9s\n", "op", "ms", "share", "TFLOP/s", "GB/s");
    for (int j = 0; j < N_OPS; j++)
        printf("%-20s %9.3f %6.1f%% %10.1f %9.0f\n", names[j], med[j], j < N_OPS - 1 ? 100.0 * med[j] / total : 0.0,
               gfl[j] > 0 ? gfl[j] / med[j] / 1e9 : 0.0, gby[j] > 0 ? gby[j] / med[j] / 1e6 : 0.0);
    printf("layer total %.3f ms (GEMMs %.3f, attention %.3f, element-wise %.3f); x %d layers = %.1f ms "
           "(GEMMs %.1f, attention %.1f, element-wise %.1f)\n\n", total, gemm, med[7], ew, s.layers,
           total * s.layers, gemm * s.layers, med[7] * s.layers, ew * s.layers);
    for (auto &e : ev) cudaEventDestroy(e);
    for (int i = 0; i < 7; i++) cudaFree(w[i]);
    void *fr[] = {tmp, nw, x, q, k, v, att, gate, up, xb, att_w, kc, vc, pos, slot, meta, dcs, cbws};
    for (void *f : fr) cudaFree(f);
    cublasDestroy(cb);
    cudaStreamDestroy(st);
}

int main(int argc, char **argv) {
    const char *sh = nullptr;
    int P = 0, reps = 10, attn_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) sh = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--attn-only")) attn_only = 1;
        else {
            fprintf(stderr, "usage: zllm-prefillbench [--shape 8b|1b] [--tokens P] [--reps N] [--attn-only]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    for (const shape &s : kShapes) {
        if (sh && strcmp(sh, s.name)) continue;
        const int p = P > 0 ? P : !strcmp(s.name, "8b") ? 2048 : 1024;
        bench_attention(s, p, reps);
        if (!attn_only) bench_layer(s, p, reps);
    }
    return 0;
}
