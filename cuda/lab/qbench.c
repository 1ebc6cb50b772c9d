/* cuda/lab/qbench.c: benchmark of the quantized matrix-vector kernels (cuda/qgemv.h).
 *
 *   zllm-qbench [--quick] [--types Q4_K,Q6_K,...] [--shapes 0,1,2,3,4] [--variants]
 *
 * Measures, in one run on the current GPU: the read-only bandwidth (a large 16-byte-load read kernel, the
 * roofline), then each weight type's kernels on Llama-3.1-8B-shaped matrices (n_in x n_out, --shapes picks by
 * index: 0 4096x4096 (wq/wo), 1 4096x1024 (wk/wv), 2 4096x14336 (gate/up), 3 14336x4096 (down),
 * 4 4096x128256 (LM head)) at M = 1, 2, 4, 8: "gguf" = qgemv_launch on the GGUF rows (the old kernels),
 * "packed" = qgemv_launch_packed on the qgemv_repack form; with --variants also, at M = 1, the other kernel
 * variants ("gguf/V": qgemv_launch_variant's V, "packed/V": qgemv_launch_packed_variant's V). Weights rotate
 * over enough distinct buffers that L2 cannot serve them; cuBLAS (cublasGemmEx, BF16 in, f32 out) runs on the
 * same BF16 shapes as a comparison point. Each figure: calls captured into a CUDA graph, median of replays,
 * time per call, bytes moved (weights + x + y, f32 x and y) / time, and that as a fraction of the measured
 * read bandwidth. Weights are random blocks with valid fp16 scales (never zeros). Exits 0 after printing the
 * table; 1 on a CUDA error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "version.h"

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-qbench [--quick] [--types Q4_K,Q6_K,...] [--shapes 0,1,2,3,4] [--variants]\n"
               "       zllm-qbench --help | --version\n"
               "  --quick           the first shape only (default: all five)\n"
               "  --types LIST      weight types to time (default: every supported type)\n"
               "  --shapes LIST     matrix shapes by index (default: all five)\n"
               "  --variants        also every kernel variant at M = 1 (default off)\n"
               "Needs a GPU (a build with ZLLM_CUDA=1). Environment: the CUDA tuning knobs (docs/perf.md).\n");
}

/* --help / --version anywhere on the line: prints and returns 1 (the caller exits 0), else 0 */
static int s_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("zllm-qbench %s\n", ZLLM_VERSION);
            return 1;
        }
    }
    return 0;
}

#ifndef ZLLM_HAVE_CUDA
int main(int argc, char **argv) {
    if (s_info(argc, argv)) return 0;
    fprintf(stderr, "zllm-qbench: built without CUDA (ZLLM_CUDA=0)\n");
    return 1;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "gguf.h"
#include "qgemv.h"
#include "quant.h"

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t s_rng = 0x243F6A8885A308D3ull;
static inline uint64_t rnd_u64(void) {
    uint64_t z = (s_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* random valid blocks: random bytes, fp16 scale fields set to small finite values, F16/BF16 elements
 * finite and of moderate size */
static void fill_weights(ggml_type t, uint8_t *buf, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = rnd_u64();
        memcpy(buf + i, &r, 8);
    }
    if (t == GGML_F16 || t == GGML_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            uint16_t h;
            memcpy(&h, buf + i, 2);
            if (t == GGML_F16) h = (uint16_t)((h & 0x83ff) | ((5 + (h >> 10) % 20) << 10));
            else h = (uint16_t)((h & 0x807f) | ((110 + ((h >> 7) & 0xff) % 30) << 7));
            memcpy(buf + i, &h, 2);
        }
        return;
    }
    size_t bpb = ggml_type_block_bytes(t);
    uint16_t d = f32_to_fp16(0.01f), m = f32_to_fp16(-0.02f);
    for (size_t b = 0; b + bpb <= bytes; b += bpb) {
        uint8_t *p = buf + b;
        switch (t) {
        case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K:
            memcpy(p, &d, 2);
            memcpy(p + 2, &m, 2);
            break;
        case GGML_Q6_K: memcpy(p + 208, &d, 2); break;
        default: memcpy(p, &d, 2); break;
        }
    }
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median over reps replays of graph ge, in ms */
static float time_graph(cudaGraphExec_t ge, cudaStream_t st, int reps) {
    cudaEvent_t e0, e1;
    float t[16];
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge, st));   /* warm-up */
    CK(cudaStreamSynchronize(st));
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, (size_t)reps, sizeof(float), cmp_f);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    int quick = 0, variants = 0;
    const char *types_arg = NULL, *shapes_arg = NULL;
    if (s_info(argc, argv)) return 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--variants")) variants = 1;
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes_arg = argv[++i];
        else {
            s_usage(stderr);
            return 2;
        }
    }
    int dev = 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %.0f MB, cc %d.%d\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize / 1e6, prop.major, prop.minor);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    /* 1. read-only bandwidth: 2 GiB, read 10 times per graph */
    double read_bw;
    float *sink;
    CK(cudaMalloc((void **)&sink, 4096 * sizeof(float)));
    {
        size_t bytes = (size_t)2 << 30;
        void *buf;
        CK(cudaMalloc(&buf, bytes));
        CK(cudaMemset(buf, 0x5a, bytes));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < 10; i++) CK(qgemv_read_bench(buf, bytes, sink, st));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        float ms = time_graph(ge, st, 7);
        read_bw = 10.0 * (double)bytes / (ms * 1e-3);
        printf("read-only bandwidth: %.0f GB/s (2 GiB read with 16-byte loads, median of 7 x 10 reads)\n",
               read_bw / 1e9);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        CK(cudaFree(buf));
    }

    const ggml_type all[] = {GGML_Q4_K, GGML_Q6_K, GGML_Q8_0, GGML_BF16, GGML_F16, GGML_Q4_0, GGML_Q4_1,
                             GGML_Q5_0, GGML_Q5_1, GGML_Q5_K};
    /* n_in, n_out */
    const int shapes[][2] = {{4096, 4096}, {4096, 1024}, {4096, 14336}, {14336, 4096}, {4096, 128256}};
    const int ms_list[] = {1, 2, 4, 8};
    const int n_shapes = quick ? 1 : 5;

    float *dx, *dy;
    uint16_t *dxb;
    CK(cudaMalloc((void **)&dx, (size_t)8 * 14336 * sizeof(float)));
    CK(cudaMalloc((void **)&dy, (size_t)8 * 128256 * sizeof(float)));
    CK(cudaMalloc((void **)&dxb, (size_t)8 * 14336 * sizeof(uint16_t)));
    {
        float *hx = malloc((size_t)8 * 14336 * sizeof(float));
        uint16_t *hb = malloc((size_t)8 * 14336 * sizeof(uint16_t));
        if (!hx || !hb) return 1;
        for (int i = 0; i < 8 * 14336; i++) {
            hx[i] = (float)((double)(rnd_u64() >> 11) * 0x1p-53 * 2 - 1);
            hb[i] = f32_to_bf16(hx[i]);
        }
        CK(cudaMemcpy(dx, hx, (size_t)8 * 14336 * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dxb, hb, (size_t)8 * 14336 * sizeof(uint16_t), cudaMemcpyHostToDevice));
        free(hx);
        free(hb);
    }
    cublasHandle_t h;
    void *ws;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    CK(cudaMalloc(&ws, (size_t)32 << 20));
    cublasSetStream(h, st);
    cublasSetWorkspace(h, ws, (size_t)32 << 20);

    printf("\n%-5s %6s %6s %2s %-12s %9s %8s %6s\n", "type", "n_in", "n_out", "M", "kernel", "us/call", "GB/s",
           "%read");
    for (size_t ti = 0; ti < sizeof all / sizeof all[0]; ti++) {
        ggml_type t = all[ti];
        if (types_arg && !strstr(types_arg, ggml_type_name(t))) continue;
        for (int si = 0; si < n_shapes; si++) {
            if (shapes_arg) {
                char id[4];
                snprintf(id, sizeof id, "%d", si);
                if (!strstr(shapes_arg, id)) continue;
            }
            int n_in = shapes[si][0], n_out = shapes[si][1];
            size_t row_bytes = ggml_row_bytes(t, n_in), mat = row_bytes * (size_t)n_out;
            /* distinct buffers: at least 4 x L2 in all, at least 2 */
            int nbuf = (int)((4 * (size_t)prop.l2CacheSize + mat - 1) / mat);
            if (nbuf < 2) nbuf = 2;
            void **bufs = calloc((size_t)nbuf, sizeof(void *)), **pbufs = calloc((size_t)nbuf, sizeof(void *));
            uint8_t *host = malloc(mat);
            if (!bufs || !pbufs || !host) return 1;
            fill_weights(t, host, mat);
            for (int b = 0; b < nbuf; b++) {   /* the GGUF rows and their packed form (qgemv_repack) */
                CK(cudaMalloc(&bufs[b], mat));
                CK(cudaMemcpy(bufs[b], host, mat, cudaMemcpyHostToDevice));
                CK(cudaMalloc(&pbufs[b], mat));
                CK(qgemv_repack(t, bufs[b], pbufs[b], n_in, n_out, st));
            }
            CK(cudaStreamSynchronize(st));
            free(host);
            int calls = nbuf;
            while (calls < 60) calls += nbuf;
            for (int mi = 0; mi < 4; mi++) {
                int m = ms_list[mi];
                /* bytes per call: the weights, x and y (f32) */
                const double moved = (double)mat + 4.0 * m * ((double)n_in + n_out);
                /* the GGUF kernels (default, then qgemv_launch_variant's other variants), then the packed form
                 * (default, then qgemv_launch_packed_variant's); vars[i] < 0: packed variant -vars[i] - 1 */
                const int direct = t == GGML_F16 || t == GGML_BF16 || t == GGML_Q4_K || t == GGML_Q5_K;
                const int pk = direct ? t != GGML_Q5_K : t == GGML_Q8_0 || t == GGML_Q6_K;
                const int kq = t == GGML_Q4_K || t == GGML_Q6_K, w16 = t == GGML_F16 || t == GGML_BF16;
                int vars[16], nv = 0;
                vars[nv++] = 0;
                if (m == 1 && variants && direct) {
                    vars[nv++] = 22;
                    vars[nv++] = 24;
                } else if (m == 1 && variants) {
                    vars[nv++] = 10;
                    vars[nv++] = 14;
                }
                vars[nv++] = -1;   /* packed default */
                if (m == 1 && variants && pk) {
                    const int alt[] = {1014, kq ? 0 : 1022, w16 ? 1042 : 0, 11000, 1100, 1200, 1400};
                    for (size_t ai = 0; ai < sizeof alt / sizeof alt[0]; ai++)
                        if (alt[ai]) vars[nv++] = -alt[ai] - 1;
                }
                for (int vi = 0; vi < nv; vi++) {
                    const int packed = vars[vi] < 0, rv = packed ? -vars[vi] - 1 : vars[vi];
                    qgemv_params p;
                    memset(&p, 0, sizeof p);
                    p.type = t; p.row_bytes = row_bytes; p.n_in = n_in; p.n_out = n_out; p.m = m; p.x = dx;
                    p.y = dy;
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                    for (int c = 0; c < calls; c++) {
                        p.w = packed ? pbufs[c % nbuf] : bufs[c % nbuf];
                        cudaError_t e = packed ? (rv ? qgemv_launch_packed_variant(&p, rv, st)
                                                     : qgemv_launch_packed(&p, st))
                                               : (rv ? qgemv_launch_variant(&p, rv, st) : qgemv_launch(&p, st));
                        if (e != cudaSuccess) {
                            fprintf(stderr, "qgemv (%s, packed %d, variant %d): %s\n", ggml_type_name(t), packed, rv,
                                    cudaGetErrorString(e));
                            return 1;
                        }
                    }
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    float ms = time_graph(ge, st, 9) / (float)calls;
                    double bw = moved / (ms * 1e-3);
                    char kn[24];
                    if (packed) snprintf(kn, sizeof kn, rv ? "packed/%d" : "packed", rv);
                    else snprintf(kn, sizeof kn, rv ? "gguf/%d" : "gguf", rv);
                    printf("%-5s %6d %6d %2d %-12s %9.2f %8.0f %5.1f%%\n", ggml_type_name(t), n_in, n_out, m, kn,
                           ms * 1e3, bw / 1e9, 100.0 * bw / read_bw);
                    fflush(stdout);
                    cudaGraphExecDestroy(ge);
                    cudaGraphDestroy(g);
                }
                if (t == GGML_BF16) {   /* cuBLAS on the same buffers */
                    const float alpha = 1.0f, beta = 0.0f;
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                    for (int c = 0; c < calls; c++) {
                        cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, m, n_in, &alpha,
                                                        bufs[c % nbuf], CUDA_R_16BF, n_in, dxb, CUDA_R_16BF, n_in,
                                                        &beta, dy, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                                        CUBLAS_GEMM_DEFAULT);
                        if (s != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasGemmEx: %d\n", (int)s); return 1; }
                    }
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    float ms = time_graph(ge, st, 9) / (float)calls;
                    double bw = ((double)mat + 2.0 * m * n_in + 4.0 * m * n_out) / (ms * 1e-3);
                    printf("%-5s %6d %6d %2d %-12s %9.2f %8.0f %5.1f%%\n", ggml_type_name(t), n_in, n_out, m, "cublas",
                           ms * 1e3, bw / 1e9, 100.0 * bw / read_bw);
                    cudaGraphExecDestroy(ge);
                    cudaGraphDestroy(g);
                }
            }
            for (int b = 0; b < nbuf; b++) {
                CK(cudaFree(bufs[b]));
                CK(cudaFree(pbufs[b]));
            }
            free(bufs);
            free(pbufs);
        }
    }
    cublasDestroy(h);
    cudaFree(ws);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dxb);
    cudaFree(sink);
    cudaStreamDestroy(st);
    printf("read bandwidth %.0f GB/s; bytes per call (weights + x + y) / time per call\n", read_bw / 1e9);
    return 0;
}
#endif
