/* cuda/lab/bench_qmma.cu: zllm-qmmabench, the tensor-core quantized kernels (cuda/qmma.cu) per type, shape and
 * batch M, against the read-only bandwidth measured in the same run and cuBLAS BF16 (cublasGemmEx, f32
 * accumulate and output) on the same shape and M.
 *
 * Shapes (n_out x n_in): one Llama-3.1-8B layer's matrices and its LM head: 4096x4096, 1024x4096, 14336x4096,
 * 4096x14336, 128256x4096. Weights: random valid blocks (random bytes, fp16 scales in a sane range), in as many
 * buffers as make >= 1 GiB (at least 2), rotated call after call so that L2 (50 MB) does not serve them.
 * Timing: one group of calls (one per buffer) captured in a CUDA graph (no host launch cost between calls),
 * replayed 7 times with a CUDA-event pair around each replay; the median replay divided by the calls in the
 * group is the time per call. Bytes counted: the weights' GGUF bytes + x (f16) + y (f32); TFLOP/s = 2 M n_in
 * n_out / time. The read-only ceiling: qgemv_read_bench over 2 GiB, the same median-of-event-pairs.
 *
 * usage: zllm-qmmabench [--types Q4_K,Q6_K,Q8_0] [--ms 1,2,4,8,16,32,64,128,256] [--tiles] [--no-cublas]
 *   --tiles: also every tile (rt, nf) at each M (the default picks one from M).
 *   --ks: also every forced split count 1, 2, 4, 8 (qmma_launch_variant; another arithmetic) at each M.
 *   --qtc: time the tile-packed kernels of cuda/qtc.cu instead (weights packed by qtc_pack, same bytes; with
 *          --tiles every fragment count nf 1, 2, 4, 8, the staged narrow forms QTC_XS, QTC_XR, QTC_XC and the wide forms
 *          QTC_WIDE, QTC_WG, QTC_WG32, QTC_WG128, and the 16-bit form QTC_F16).
 *   --shape I: only shape I of the list (0-based; for profilers). --nf NF: with --qtc, only that form. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "qgemv.h"
#include "qmma.h"
#include "qtc.h"
#include "bench_graph.cuh"

#define CK(call) BENCH_GRAPH_CK(call) /* a CUDA error: the call and its error, exit status 1 */
#define CB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)s_); exit(1); } } while (0)

static uint64_t s_rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return s_rng;
}

static uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

static const char *tname_of(ggml_type t) { return t == GGML_Q4_K ? "Q4_K" : t == GGML_Q6_K ? "Q6_K" : "Q8_0"; }
static size_t unit_bytes(ggml_type t) { return t == GGML_Q4_K ? 144 : t == GGML_Q6_K ? 210 : 34; }
static int unit_elems(ggml_type t) { return t == GGML_Q8_0 ? 32 : 256; }

/* random valid blocks: random bytes with the fp16 scale fields set to +-[0.001, 0.05] */
static void fill_blocks(ggml_type t, uint8_t *p, size_t n_units)
{
    const size_t ub = unit_bytes(t);
    for (size_t i = 0; i < n_units * ub; i += 8) {
        const uint64_t r = rnd();
        memcpy(p + i, &r, n_units * ub - i < 8 ? n_units * ub - i : 8);
    }
    for (size_t u = 0; u < n_units; u++) {
        uint8_t *b = p + u * ub;
        const uint16_t d = f2h((float)((rnd() % 1000) + 20) * 5e-5f * ((rnd() & 1) ? 1.f : -1.f));
        const uint16_t m = f2h((float)((rnd() % 1000) + 20) * 5e-5f);
        if (t == GGML_Q4_K) { memcpy(b, &d, 2); memcpy(b + 2, &m, 2); }
        else if (t == GGML_Q6_K) memcpy(b + 208, &d, 2);
        else memcpy(b, &d, 2);
    }
}

int main(int argc, char **argv)
{
    const char *types_arg = "Q4_K,Q6_K,Q8_0";
    std::vector<int> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    int tiles = 0, cublas = 1, kss = 0, use_qtc = 0, only_shape = -1, only_nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            ms.clear();
            for (char *s = argv[++i]; *s;) {
                ms.push_back(atoi(s));
                while (*s && *s != ',') s++;
                if (*s) s++;
            }
        } else if (!strcmp(argv[i], "--tiles")) tiles = 1;
        else if (!strcmp(argv[i], "--ks")) kss = 1;
        else if (!strcmp(argv[i], "--no-cublas")) cublas = 0;
        else if (!strcmp(argv[i], "--qtc")) use_qtc = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only_shape = atoi(argv[++i]);   /* index, for profiling */
        else if (!strcmp(argv[i], "--nf") && i + 1 < argc) only_nf = atoi(argv[++i]);         /* one qtc form */
        else {
            fprintf(stderr, "usage: zllm-qmmabench [--types Q4_K,Q6_K,Q8_0] [--ms 1,2,...] [--tiles] [--ks] [--no-cublas] [--qtc] [--shape I]\n"
                            "                      [--nf NF]\n");
            return 2;
        }
    }
    int maxm = 1;
    for (int m : ms) maxm = std::max(maxm, m);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    /* read-only ceiling */
    double ceil_gbs;
    {
        const size_t nb = (size_t)2 << 30;
        void *buf;
        float *sink;
        CK(cudaMalloc(&buf, nb));
        CK(cudaMalloc(&sink, 4096 * 4));
        CK(cudaMemset(buf, 1, nb));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CK(qgemv_read_bench(buf, nb, sink, st));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const double ms1 = bench_graph_ms(ge, st);
        ceil_gbs = nb / (ms1 * 1e-3) / 1e9;
        printf("read-only ceiling: %.0f GB/s (qgemv_read_bench, 2 GiB, median of 7)\n", ceil_gbs);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        CK(cudaFree(buf));
        CK(cudaFree(sink));
    }

    cublasHandle_t cb = NULL;
    void *cb_ws = NULL;
    const size_t cb_ws_bytes = (size_t)32 << 20;
    if (cublas) {
        CB(cublasCreate(&cb));
        CB(cublasSetStream(cb, st));
        CK(cudaMalloc(&cb_ws, cb_ws_bytes));
        CB(cublasSetWorkspace(cb, cb_ws, cb_ws_bytes));
    }

    static const int shapes[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
    printf("\n| type | n_out x n_in | ks | M | tile | us | GB/s | %% read | TFLOP/s | cuBLAS BF16 us | TFLOP/s | qmma speed-up |\n");
    printf("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const ggml_type all_types[] = {GGML_Q4_K, GGML_Q6_K, GGML_Q8_0};
    for (ggml_type t : all_types) {
        if (!strstr(types_arg, tname_of(t))) continue;
        for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
            if (only_shape >= 0 && si != only_shape) continue;
            const int n_out = shapes[si][0], n_in = shapes[si][1];
            const size_t rb = (size_t)(n_in / unit_elems(t)) * unit_bytes(t), wbytes = rb * n_out;
            const int nbuf = (int)std::max<size_t>(2, (((size_t)1 << 30) + wbytes - 1) / wbytes);
            std::vector<uint8_t> host(wbytes);
            fill_blocks(t, host.data(), wbytes / unit_bytes(t));
            if (use_qtc) {   /* the packed copy holds the same bytes (n_out is a multiple of 16 here) */
                std::vector<uint8_t> packed(qtc_packed_bytes(t, n_in, n_out));
                if (packed.size() != wbytes || qtc_pack(t, host.data(), rb, n_in, n_out, packed.data()) != 0) {
                    fprintf(stderr, "qtc_pack failed\n");
                    return 1;
                }
                host.swap(packed);
            }
            std::vector<void *> bufs(nbuf);
            for (int b = 0; b < nbuf; b++) {
                CK(cudaMalloc(&bufs[b], wbytes));
                CK(cudaMemcpy(bufs[b], host.data(), wbytes, cudaMemcpyHostToDevice));
            }
            std::vector<uint16_t> xh((size_t)maxm * n_in);
            for (auto &v : xh) v = f2h((float)((int)(rnd() % 2001) - 1000) * 1e-3f);
            uint16_t *dx;
            float *dy;
            CK(cudaMalloc(&dx, xh.size() * 2));
            CK(cudaMalloc(&dy, (size_t)maxm * n_out * 4));
            CK(cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
            void *qws = NULL;   /* qtc's split partials (wide kernel) */
            const size_t qws_bytes = use_qtc ? qtc_workspace_bytes(t, n_in, n_out) : 0;
            if (qws_bytes) CK(cudaMalloc(&qws, qws_bytes));
            unsigned *qflags = NULL; /* qtc's hand-over flags (zeroed once; every launch leaves them zero) */
            if (use_qtc && qtc_flags_bytes()) {
                CK(cudaMalloc(&qflags, qtc_flags_bytes()));
                CK(cudaMemset(qflags, 0, qtc_flags_bytes()));
            }
            /* BF16 copies for cuBLAS (contents irrelevant to the time: a constant pattern) */
            const size_t bf_bytes = (size_t)n_out * n_in * 2;
            const int nbf = cublas ? (int)std::max<size_t>(2, (((size_t)1 << 30) + bf_bytes - 1) / bf_bytes) : 0;
            std::vector<void *> bfs(nbf);
            for (int b = 0; b < nbf; b++) {
                CK(cudaMalloc(&bfs[b], bf_bytes));
                CK(cudaMemset(bfs[b], 0x3c, bf_bytes));
            }
            void *xbf = NULL;
            if (cublas) {
                CK(cudaMalloc(&xbf, (size_t)maxm * n_in * 2));
                CK(cudaMemset(xbf, 0x3c, (size_t)maxm * n_in * 2));
            }
            for (int m : ms) {
                /* (rt, nf, forced ks) */
                std::vector<std::vector<int>> tl = {{0, 0, 0}};
                if (tiles) tl = {{0, 0, 0}, {1, 1, 0}, {1, 2, 0}, {1, 4, 0}, {2, 2, 0}, {2, 4, 0}};
                if (use_qtc) tl = {{0, 0, 0}};
                if (use_qtc && tiles)
                    tl = {{0, 0, 0},        {1, 1, 0},         {1, 2, 0},      {1, 4, 0},        {1, 8, 0},
                          {1, QTC_XS, 0},   {1, QTC_XR, 0},    {1, QTC_XC, 0}, {1, QTC_WIDE, 0}, {1, QTC_WG, 0},
                          {1, QTC_WG32, 0}, {1, QTC_WG128, 0}, {1, QTC_F16, 0}};
                if (use_qtc && only_nf) tl = {{1, only_nf, 0}};
                if (kss && !use_qtc) for (int k = 1; k <= 8; k *= 2) tl.push_back({0, 0, k});
                double cub_us = 0;
                if (cublas) {
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    const float one = 1.f, zero = 0.f;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    for (int b = 0; b < nbf; b++)
                        CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n_out, m, n_in, &one, bfs[b], CUDA_R_16BF, n_in,
                                        xbf, CUDA_R_16BF, n_in, &zero, dy, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    cub_us = bench_graph_ms(ge, st) * 1e3 / nbf;
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(g));
                }
                for (const auto &tt : tl) {
                    qmma_params p;
                    memset(&p, 0, sizeof p);
                    p.type = t; p.row_bytes = rb; p.n_in = n_in; p.n_out = n_out; p.m = m; p.x = dx; p.y = dy;
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    cudaError_t e = cudaSuccess;
                    for (int b = 0; b < nbuf && e == cudaSuccess; b++) {
                        p.w = bufs[b];
                        if (use_qtc) {
                            qtc_params q;
                            memset(&q, 0, sizeof q);
                            q.type = t; q.w = bufs[b]; q.n_in = n_in; q.n_out = n_out; q.m = m; q.x = dx; q.y = dy;
                            q.workspace = qws;
                            q.workspace_bytes = qws_bytes;
                            q.flags = qflags;
                            e = qtc_launch_nf(&q, tt[1], st);
                        } else {
                            e = qmma_launch_variant(&p, tt[0], tt[1], tt[2], st);
                        }
                    }
                    CK(cudaStreamEndCapture(st, &g));
                    if (e != cudaSuccess) {
                        printf("| %s | %dx%d | | %d | %d,%d ks %d | launch: %s |\n", tname_of(t), n_out, n_in, m,
                               tt[0], tt[1], tt[2], cudaGetErrorString(e));
                        CK(cudaGraphDestroy(g));
                        continue;
                    }
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    const double us = bench_graph_ms(ge, st) * 1e3 / nbuf;
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(g));
                    const double bytes = (double)wbytes + (double)m * n_in * 2 + (double)m * n_out * 4;
                    const double gbs = bytes / (us * 1e-6) / 1e9, tf = 2.0 * m * n_in * (double)n_out / (us * 1e-6) / 1e12;
                    char tname[32];
                    if (tt[2]) snprintf(tname, sizeof tname, "ks %d", tt[2]);
                    else if (tt[0] && use_qtc) snprintf(tname, sizeof tname, "qtc nf %d", tt[1]);
                    else if (tt[0]) snprintf(tname, sizeof tname, "%d,%d", tt[0], tt[1]);
                    else if (use_qtc) snprintf(tname, sizeof tname, "qtc");
                    else snprintf(tname, sizeof tname, "default");
                    if (cublas)
                        printf("| %s | %dx%d | %d | %d | %s | %.2f | %.0f | %.1f%% | %.2f | %.2f | %.2f | %.2fx |\n",
                               tname_of(t), n_out, n_in, use_qtc ? qtc_split(t, n_in, n_out) : qmma_split(t, n_in, n_out), m, tname, us, gbs,
                               100.0 * gbs / ceil_gbs, tf, cub_us, 2.0 * m * n_in * (double)n_out / (cub_us * 1e-6) / 1e12,
                               cub_us / us);
                    else
                        printf("| %s | %dx%d | %d | %d | %s | %.2f | %.0f | %.1f%% | %.2f | | | |\n", tname_of(t),
                               n_out, n_in, use_qtc ? qtc_split(t, n_in, n_out) : qmma_split(t, n_in, n_out), m, tname, us, gbs,
                               100.0 * gbs / ceil_gbs, tf);
                    fflush(stdout);
                }
            }
            for (void *b : bufs) CK(cudaFree(b));
            for (void *b : bfs) CK(cudaFree(b));
            CK(cudaFree(dx));
            CK(cudaFree(dy));
            if (xbf) CK(cudaFree(xbf));
            if (qws) CK(cudaFree(qws));
            if (qflags) CK(cudaFree(qflags));
        }
    }
    if (cb) cublasDestroy(cb);
    if (cb_ws) cudaFree(cb_ws);
    return 0;
}
