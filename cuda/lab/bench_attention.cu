/* cuda/lab/bench_attention.cu: zllm-attnbench, the flash-decoding kernels alone against the GPU's measured
 * read-only bandwidth (docs/perf.md, "Decode attention").
 *
 * Shapes: 32 query heads, 8 KV heads, head size 128 (--head-dim 64: the 1B shape), BF16 KV; batches and contexts
 * from the command line.
 * The KV buffers are rotated (as many sets as make at least 1 GiB, memory allowing) so the L2 cache does not
 * serve them. Bytes counted: the K and V rows read (2 * batch * ctx * 8 * head size * 2); time: median of CUDA event
 * pairs around single launches, two ways: "queued" (all iterations enqueued back to back, one event pair around
 * each call, so the host's enqueue time is not counted while the GPU is busy: what a captured graph sees) and
 * "sync" (the host waits after every call, so each pair also holds the launch latency of an idle GPU). The read-only ceiling: a streaming read kernel (16-byte loads, several in
 * flight per thread) over a 4 GiB buffer, median of 20 runs.
 *
 * usage: zllm-attnbench [-b 1,16,64] [-c 1024,...] [-s B:L,B:L,...] [-n iters] [-m max_gib] [--sweep]
 *                       [-K kernel] [-f splits] [--hm] [--settle ms] [--kvlen n] [--paged N [--paged-run R]]
 *                       [--group G] [--lpw L] [--head-dim D]
 *   -s: only these (batch, context) pairs instead of the -b x -c table.
 *   --sweep: also forced split counts for batch 1 at 64k and batch 16 at 8k.
 *   -K: attn_decode_params.kernel (0 default, 1 chunk kernel + reduce, 2 persistent kernel, 3 chunk kernel with
 *     its own merge, 4 tensor-core kernel).
 *   --kvlen: every sequence attends to n keys while the context (max_kv_len, which fixes the grid and split count
 *     as the engine's n_ctx does) stays the row's ctx: one short sequence in a long-context engine. KV_MB and
 *     GB/s then count the n keys actually read.
 *   --settle: idle this many milliseconds before each shape's timed calls, so that every row starts, like the read ceiling,
 *     from an idle GPU (H100: within a second of the 8.6 GB shapes the card sits at its 700 W cap and the SM
 *     clock drops to 1485-1890 MHz, docs/perf.md; without a pause the rows measured next read lower).
 *   -f: force this split count on every shape.
 *   --paged N: paged KV (attention.h): the same caches read as a pool of blocks of N rows (16..256, a power of two,
 *     dividing every context), each sequence's block table a slice of one shuffled permutation of all the pool's
 *     blocks (the engine's tables after a while of allocations and releases); the same bytes and split counts, so
 *     the time against a run without it is the cost of the tables. --paged-run R shuffles runs of R consecutive pool
 *     blocks instead of single blocks (an allocator that hands out runs; R at least a sequence's blocks keeps each
 *     sequence's blocks in pool order), which separates the cost of the lookups from that of scattered memory.
 *   --hm: head-major emulation, the same bytes and split count as a contiguous per-head layout: batch B runs as
 *     B * 8 sequences of 1 KV head and 4 query heads (each (sequence, head) its own contiguous slab), with the
 *     split count forced to the one the real shape gets. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>
#include "attention.h"

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

/* streaming read: each thread reads 4 x 16 bytes per step; the xor keeps the loads alive */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                    d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

/* fills n bf16 values with a hash of the index, in [-1, 1) */
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        p[i] = __float2bfloat16((float)((z >> 40) * (1.0 / 8388608.0)) - 1.0f);
    }
}
__global__ void fill_f32(float *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        p[i] = (float)((z >> 40) * (1.0 / 8388608.0)) - 1.0f;
    }
}

static int s_kernel = 0;   /* -K */
static int s_settle_ms = 0;   /* --settle: idle before each shape's timed calls */
static long s_kvlen = 0;      /* --kvlen: every sequence's kv_len (<= the context, which stays max_kv_len) */
static int s_hm = 0;       /* --hm */
static int s_paged = 0;    /* --paged: rows per block, 0 contiguous */
static int s_group = 0, s_lpw = 0; /* --group G, --lpw L: the tensor-core kernel's warps per block and chunks per
                                    * warp (0: its own choice) */
static long s_paged_run = 1; /* --paged-run: consecutive pool blocks kept together when the tables are shuffled */
static int s_head_dim = 128; /* --head-dim: 128 (the 8B shape) or 64 (the 1B shape) */

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

static std::vector<long> parse_list(const char *s) {
    std::vector<long> v;
    while (s && *s) {
        v.push_back(strtol(s, (char **)&s, 10));
        if (*s == ',') s++;
        else break;
    }
    return v;
}

/* best of several launch shapes: the read-only ceiling the attention kernels are compared with */
static double measure_read_bw(int sm) {
    const size_t bytes = (size_t)4 << 30;
    void *buf;
    unsigned *sink;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 0x5a, bytes));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double best = 1e30;
    const int shapes[][2] = {{2, 1024}, {4, 512}, {8, 512}, {16, 256}, {32, 256}, {4, 1024}};
    for (const auto &sh : shapes) {
        std::vector<float> t;
        for (int it = 0; it < 13; it++) {
            CK(cudaEventRecord(a));
            read_kernel<<<sm * sh[0], sh[1]>>>((const uint4 *)buf, bytes / 16, sink);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (it >= 3) t.push_back(ms);
        }
        const double m = median(t);
        printf("read kernel %5d blocks x %4d threads: %.0f GB/s\n", sm * sh[0], sh[1], bytes / (m * 1e-3) / 1e9);
        best = std::min(best, m);
    }
    CK(cudaGetLastError());
    cudaFree(buf);
    cudaFree(sink);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return bytes / (best * 1e-3) / 1e9;
}

struct result {
    double us, gbs;    /* queued: median per-call time, bandwidth */
    double us_sync;    /* synchronized per call: median time */
    int splits;
};

/* times decode attention at batch B, context L; n_splits 0: automatic. Returns false when it does not fit. */
static bool bench_shape(int B, long L, int iters, double max_bytes, int n_splits, result *res) {
    int H = 32, KVH = 8;
    const int D = s_head_dim;
    if (s_hm) {   /* same bytes, one KV head per sequence, split count of the real shape */
        attn_decode_params r;
        memset(&r, 0, sizeof r);
        r.kv_type = ATTN_KV_BF16;
        r.n_seq = B;
        r.n_heads = H;
        r.n_kv_heads = KVH;
        r.head_dim = D;
        r.n_ctx = (int)L;
        r.max_kv_len = (int)L;
        r.n_splits = n_splits;
        n_splits = attn_decode_splits(&r);
        B *= KVH;
        H /= KVH;
        KVH = 1;
    }
    const double set_bytes = 2.0 * B * L * KVH * D * 2;
    if (set_bytes > max_bytes || (s_paged && L % s_paged)) return false;
    int R = (int)std::min(64.0, std::max(1.0, ceil((1.0 * (1 << 30)) / set_bytes)));
    while (R > 1 && R * set_bytes > max_bytes) R--;
    const int n_slots = B * R;
    const size_t cache_n = (size_t)n_slots * L * KVH * D;
    __nv_bfloat16 *k, *v;
    float *q, *out;
    int32_t *slot, *len;
    if (cudaMalloc(&k, cache_n * 2) != cudaSuccess) return false;
    if (cudaMalloc(&v, cache_n * 2) != cudaSuccess) { cudaFree(k); cudaGetLastError(); return false; }
    CK(cudaMalloc(&q, (size_t)B * H * D * 4));
    CK(cudaMalloc(&out, (size_t)B * H * D * 4));
    CK(cudaMalloc(&slot, (size_t)n_slots * 4));
    CK(cudaMalloc(&len, (size_t)B * 4));
    fill_bf16<<<4096, 256>>>(k, cache_n, 1);
    fill_bf16<<<4096, 256>>>(v, cache_n, 2);
    fill_f32<<<256, 256>>>(q, (size_t)B * H * D, 3);
    const long kvl = s_kvlen > 0 && s_kvlen < L ? s_kvlen : L;   /* keys each sequence attends to */
    std::vector<int32_t> hs(n_slots), hl(B, (int32_t)kvl);
    for (int i = 0; i < n_slots; i++) hs[i] = i;
    int32_t *tab = nullptr;
    if (s_paged) { /* slot s's table: blocks [s * nb, (s + 1) * nb) of a shuffled permutation; slot = its offset */
        const long nb = L / s_paged;
        std::vector<int32_t> ids((size_t)n_slots * nb);
        /* runs of s_paged_run consecutive pool blocks, the runs in shuffled order */
        const size_t run = s_paged_run > 0 ? (size_t)s_paged_run : 1, n_runs = (ids.size() + run - 1) / run;
        std::vector<size_t> order(n_runs);
        for (size_t i = 0; i < n_runs; i++) order[i] = i;
        uint64_t z = 88172645463325252ULL;
        for (size_t i = n_runs - 1; i > 0; i--) {
            z ^= z << 13, z ^= z >> 7, z ^= z << 17;
            std::swap(order[i], order[z % (i + 1)]);
        }
        size_t at = 0;
        for (size_t r = 0; r < n_runs; r++)
            for (size_t j = order[r] * run; j < (order[r] + 1) * run && j < ids.size(); j++) ids[at++] = (int32_t)j;
        CK(cudaMalloc(&tab, ids.size() * 4));
        CK(cudaMemcpy(tab, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < n_slots; i++) hs[i] = (int32_t)(i * nb);
    }
    CK(cudaMemcpy(slot, hs.data(), n_slots * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(len, hl.data(), B * 4, cudaMemcpyHostToDevice));
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = q;
    p.k_cache = k;
    p.v_cache = v;
    p.kv_type = ATTN_KV_BF16;
    p.kv_len = len;
    p.out = out;
    p.n_seq = B;
    p.n_heads = H;
    p.n_kv_heads = KVH;
    p.head_dim = D;
    p.n_ctx = (int)L;
    p.max_kv_len = (int)L;
    p.n_splits = n_splits;
    p.kernel = s_kernel;
    p.tc_group = s_group;
    p.tc_lpw = s_lpw;
    if (s_paged) {
        p.blocks = tab;
        for (int lg = 0; lg <= 8; lg++)
            if ((1 << lg) == s_paged) p.kv_block_log2 = lg;
    }
    const size_t wsb = attn_decode_workspace_bytes(&p);
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    CK(attn_decode_workspace_init(ws, wsb, 0));
    p.workspace = ws;
    p.workspace_bytes = wsb;
    if (s_settle_ms > 0) {   /* after the fills, right before the timed calls */
        CK(cudaDeviceSynchronize());
        const struct timespec ts = {s_settle_ms / 1000, (long)(s_settle_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int it = 0; it < iters + 5; it++) {
        p.slot = slot + (size_t)(it % R) * B;
        CK(cudaEventRecord(a));
        CK(attn_decode_launch(&p, 0));
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (it >= 5) t.push_back(ms);
    }
    res->us_sync = median(t) * 1e3;
    std::vector<cudaEvent_t> ev(2 * (size_t)(iters + 5));
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int it = 0; it < iters + 5; it++) {
        p.slot = slot + (size_t)(it % R) * B;
        CK(cudaEventRecord(ev[2 * it]));
        CK(attn_decode_launch(&p, 0));
        CK(cudaEventRecord(ev[2 * it + 1]));
    }
    CK(cudaDeviceSynchronize());
    t.clear();
    for (int it = 5; it < iters + 5; it++) {
        float ms;
        CK(cudaEventElapsedTime(&ms, ev[2 * it], ev[2 * it + 1]));
        t.push_back(ms);
    }
    for (auto &e : ev) cudaEventDestroy(e);
    res->us = median(t) * 1e3;
    res->gbs = set_bytes * ((double)kvl / L) / (res->us * 1e-6) / 1e9;   /* bytes actually read */
    res->splits = attn_decode_splits(&p);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(out);
    cudaFree(slot);
    cudaFree(len);
    cudaFree(ws);
    if (tab) cudaFree(tab);
    return true;
}

int main(int argc, char **argv) {
    std::vector<long> batches = {1, 16, 64};
    std::vector<long> ctxs = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
    std::vector<long> pairs;   /* -s: batch, context, batch, context, ... */
    int iters = 30, sweep = 0, force = 0;
    double max_gib = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-b") && i + 1 < argc) batches = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) ctxs = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            for (const char *q = argv[++i]; *q;) {
                char *e;
                const long bb = strtol(q, &e, 10);
                if (*e != ':') break;
                const long ll = strtol(e + 1, &e, 10);
                pairs.push_back(bb);
                pairs.push_back(ll);
                q = *e == ',' ? e + 1 : e;
            }
        }
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) max_gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "-K") && i + 1 < argc) s_kernel = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) force = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hm")) s_hm = 1;
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc) s_settle_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kvlen") && i + 1 < argc) s_kvlen = atol(argv[++i]);
        else if (!strcmp(argv[i], "--paged") && i + 1 < argc) s_paged = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--paged-run") && i + 1 < argc) s_paged_run = atol(argv[++i]);
        else if (!strcmp(argv[i], "--group") && i + 1 < argc) s_group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lpw") && i + 1 < argc) s_lpw = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) s_head_dim = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [-b 1,16,64] [-c 1024,...] [-s B:L,...] [-n iters] [-m max_gib] [--sweep] "
                    "[-K kernel] [-f splits] [--hm] [--settle ms] [--kvlen n] [--paged N [--paged-run R]] "
                    "[--group G] [--lpw L] [--head-dim D]\n",
                    argv[0]);
            return 2;
        }
    }
    if (s_head_dim != 64 && s_head_dim != 128) {
        fprintf(stderr, "--head-dim: 64 or 128\n");
        return 2;
    }
    if (s_paged && (s_paged < 16 || s_paged > 256 || (s_paged & (s_paged - 1)))) {
        fprintf(stderr, "--paged: blocks of 16, 32, 64, 128 or 256 rows\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const double max_bytes = max_gib > 0 ? max_gib * (1 << 30) : 0.85 * free_b;
    const double rbw = measure_read_bw(prop.multiProcessorCount);
    printf("device: %s, %d SMs, L2 %d MiB, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           total_b / 1073741824.0);
    printf("read-only bandwidth (4 GiB streaming read, best shape): %.0f GB/s\n", rbw);
    printf("options: -K %d -f %d --settle %d --paged %d --group %d --lpw %d --head-dim %d%s\n", s_kernel, force,
           s_settle_ms, s_paged, s_group, s_lpw, s_head_dim, s_hm ? " --hm (head-major emulation)" : "");
    printf("%5s %7s %10s %6s %10s %8s %7s %10s %7s\n", "batch", "ctx", "KV_MB", "splits", "time_us", "GB/s", "%read",
           "sync_us", "%sync");
    if (pairs.empty()) {
        for (long B : batches)
            for (long L : ctxs) {
                pairs.push_back(B);
                pairs.push_back(L);
            }
    }
    if (pairs.size() >= 2) {   /* warm-up: the first shape of a process measured slower (run 1 of docs/perf.md) */
        result w;
        bench_shape((int)pairs[0], pairs[1], 5, max_bytes, force, &w);
    }
    for (size_t pi = 0; pi + 1 < pairs.size(); pi += 2) {
        const long B = pairs[pi], L = pairs[pi + 1];
        {
            result r;
            const double mb = 2.0 * B * (s_kvlen > 0 && s_kvlen < L ? s_kvlen : L) * 8 * s_head_dim * 2 / 1e6;
            if (!bench_shape((int)B, L, iters, max_bytes, force, &r)) {
                printf("%5ld %7ld %10.1f %6s %10s %8s %7s\n", B, L, mb, "-", "OOM", "-", "-");
                continue;
            }
            printf("%5ld %7ld %10.1f %6d %10.1f %8.0f %6.1f%% %10.1f %6.1f%%\n", B, L, mb, r.splits, r.us, r.gbs,
                   100.0 * r.gbs / rbw, r.us_sync, 100.0 * (mb * 1e6 / (r.us_sync * 1e-6) / 1e9) / rbw);
            fflush(stdout);
        }
    }
    if (sweep) {
        const long shapes[3][2] = {{1, 65536}, {1, 131072}, {16, 8192}};
        const int forced[] = {32, 48, 64, 96, 128, 192, 256, 384};
        for (const auto &s : shapes) {
            for (int f : forced) {
                result r;
                if (!bench_shape((int)s[0], s[1], iters, max_bytes, f, &r)) continue;
                printf("sweep batch %ld ctx %ld splits %4d: %8.1f us %6.0f GB/s %5.1f%%\n", s[0], s[1], r.splits, r.us,
                       r.gbs, 100.0 * r.gbs / rbw);
            }
        }
    }
    return 0;
}
