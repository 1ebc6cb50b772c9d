/* cuda/sample.cu: GPU token sampling, one 1024-thread block per row (see sample.h).
 *
 * The CPU reference sorts the candidates; here every cut is a threshold found without sorting:
 *  - greedy: a block argmax (larger value wins, then the lower id), NaN never wins, and a NaN at id 0 makes
 *    the answer 0, exactly as the CPU's strict-greater scan from id 0;
 *  - top-k: the k-th largest logit by a 4-pass radix select over order-preserving 32-bit keys (per-bin
 *    counts), then among the logits equal to it the lowest ids up to k, as the CPU's (logit desc, id asc) order;
 *  - softmax weights w = exp((l - l_max) / T) in (0, 1], as 40-bit fixed point so that every sum is an
 *    integer sum: the same inputs always give the same draws whatever the order of the atomics;
 *  - min-p: w >= min_p (p >= min_p * p_max), the maximum always kept;
 *  - top-p: the shortest prefix in (logit desc, id asc) order whose mass reaches top_p of the remaining mass,
 *    by a radix select on the same keys with per-bin masses, then the ties in id order;
 *  - draw: u * total mass, found by a block prefix scan over the kept ids in id order.
 * Histogram atomics are aggregated per warp (__match_any_sync + __reduce_add_sync) to avoid contention on the
 * few bins that similar logits share.
 * Plain greedy rows (temperature <= 0 or no generator, no repetition penalty) of a large vocabulary on sm_90: a
 * thread-block cluster of kCl blocks per row, each the argmax of one slice of ids, block 0 combining the slices in
 * id order through distributed shared memory (the same winner: larger value, then lower id). One block reading a
 * 128k-logit row alone took ~19 us of a batch-1 step (H100); every other row is one
 * block as before (the cluster's other blocks return at once). */
#include "pdl.cuh"
#include "sample.h"
#include "cu_host.h"
#include <cooperative_groups.h>
#include <math.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCl = 8;             /* blocks per plain greedy row (portable cluster size) */
constexpr int kClMinVocab = 8192;  /* below this a row stays one block */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kFix = 1099511627776.0f;   /* 2^40: fixed-point scale of the weights */

typedef unsigned long long u64;

__device__ __forceinline__ uint32_t fkey(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ bool finite_cand(float x) { return !isnan(x) && x != -INFINITY; }

/* splitmix64, as engine/sampler.c */
__device__ __forceinline__ float rng_uniform(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

struct row_ctx {
    const float *src;   /* logits (penalized copy when the penalty is on) */
    int vocab;
    int best;           /* argmax id */
    float lmax;         /* its logit */
    float invt_l2;      /* log2(e) / temperature */
    float min_p;        /* <= 0: off */
    int topk_on;        /* top-k cut active */
    uint32_t tk;        /* top-k threshold key */
    int cut1;           /* highest id kept among keys == tk */
    int topp_on;        /* top-p cut active */
    uint32_t t3;        /* top-p threshold key */
    int cut3;           /* highest id kept among keys == t3 */
};

__device__ __forceinline__ bool in_topk(const row_ctx &c, int i, float x, uint32_t key) {
    return finite_cand(x) && (!c.topk_on || key > c.tk || (key == c.tk && i <= c.cut1));
}
/* fixed-point weight after top-k, temperature and min-p (0: not a candidate) */
__device__ __forceinline__ u64 weight2(const row_ctx &c, int i, float x, uint32_t key) {
    if (!in_topk(c, i, x, key)) return 0;
    const float w = exp2f((x - c.lmax) * c.invt_l2);
    if (c.min_p > 0.f && w < c.min_p && i != c.best) return 0;
    return (u64)(w * kFix);
}
__device__ __forceinline__ u64 weight3(const row_ctx &c, int i, float x, uint32_t key) {
    u64 f = weight2(c, i, x, key);
    if (f && c.topp_on && !(key > c.t3 || (key == c.t3 && i <= c.cut3))) f = 0;
    return f;
}

struct block_smem {
    u64 hist[256];
    u64 warp_sum[kWarps];
    float warp_val[kWarps];
    int warp_id[kWarps];
    int warp_cnt[kWarps];
    u64 bcast_u64;
    uint32_t prefix;
    int bcast_int;
    int found;
    float bcast_f;
};

/* inclusive block scan of v (u64); returns this thread's inclusive prefix, *total the block's sum */
__device__ u64 block_scan(block_smem &sm, u64 v, u64 *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) sm.warp_sum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u64 s = sm.warp_sum[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += y;
        }
        sm.warp_sum[lane] = s;   /* inclusive over warps */
    }
    __syncthreads();
    const u64 before = warp > 0 ? sm.warp_sum[warp - 1] : 0;
    *total = sm.warp_sum[kWarps - 1];
    const u64 r = x + before;
    __syncthreads();   /* warp_sum is reused by the next call */
    return r;
}

/* first id (in id order) at which the running sum of wfn(i) reaches need (>= 1); -1 if never */
template <typename F>
__device__ int block_find_cum(block_smem &sm, int vocab, u64 need, F wfn) {
    u64 carry = 0;
    for (int base = 0; base < vocab; base += kThreads) {
        const int i = base + threadIdx.x;
        const u64 w = i < vocab ? wfn(i) : 0;
        u64 total;
        const u64 incl = block_scan(sm, w, &total);
        if (carry + total >= need) {
            if (w && carry + incl >= need && carry + incl - w < need) sm.bcast_int = i;
            __syncthreads();
            const int r = sm.bcast_int;
            __syncthreads();
            return r;
        }
        carry += total;
    }
    return -1;
}

/* radix select, largest keys first: the key t with mass(key > t) < target <= mass(key >= t) over the elements
 * efn(i) -> (in, key, weight); *above gets mass(key > t). The caller guarantees total mass >= target. */
template <typename F>
__device__ uint32_t radix_select(block_smem &sm, int vocab, u64 target, F efn, u64 *above) {
    const int lane = threadIdx.x & 31;
    uint32_t prefix = 0;
    u64 acc_above = 0;
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        const uint32_t hmask = pass == 0 ? 0u : 0xffffffffu << (32 - 8 * pass);
        for (int b = threadIdx.x; b < 256; b += kThreads) sm.hist[b] = 0;
        __syncthreads();
        for (int base = 0; base < vocab; base += kThreads) {
            const int i = base + threadIdx.x;
            int bin = 256;   /* none */
            u64 w = 0;
            if (i < vocab) {
                uint32_t key;
                bool in;
                efn(i, &in, &key, &w);
                if (in && w && (key & hmask) == prefix) bin = (int)((key >> shift) & 255u);
                else w = 0;
            }
            const unsigned grp = __match_any_sync(0xffffffffu, bin);
            /* w < 2^41: sum 24-bit low and high parts separately (32 lanes cannot overflow either) */
            const unsigned lo = __reduce_add_sync(grp, (unsigned)(w & 0xffffffu));
            const unsigned hi = __reduce_add_sync(grp, (unsigned)(w >> 24));
            if (bin < 256 && lane == __ffs(grp) - 1) atomicAdd(&sm.hist[bin], ((u64)hi << 24) + lo);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = 255;
            for (; b > 0; b--) {
                if (acc_above + sm.hist[b] >= target) break;
                acc_above += sm.hist[b];
            }
            sm.prefix = prefix | ((uint32_t)b << shift);
            sm.bcast_u64 = acc_above;
        }
        __syncthreads();
        prefix = sm.prefix;
        acc_above = sm.bcast_u64;
        __syncthreads();
    }
    *above = acc_above;
    return prefix;
}

/* argmax over ids [i0, i1) of src (lowest id among maxima, NaN skipped) and the count of finite candidates, for
 * the whole block: every thread gets *best_v / *best_i / *n (from sm) */
__device__ void block_argmax(block_smem &sm, const float *src, int i0, int i1, float *best_v, int *best_i, int *n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = 0x7fffffff, cnt = 0;
    auto see = [&](float x, int i) {
        if (isnan(x)) return;
        if (x > bv || (x == bv && i < bi)) { bv = x; bi = i; }
        cnt += x != -INFINITY;
    };
    /* 8 independent loads in flight per thread (one block reads a 128k vocabulary: latency-bound otherwise); the
     * result does not depend on the visiting order (ties go to the lowest id) */
    int i = i0 + threadIdx.x;
    for (; i + 7 * kThreads < i1; i += 8 * kThreads) {
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; u++) x[u] = src[i + u * kThreads];
#pragma unroll
        for (int u = 0; u < 8; u++) see(x[u], i + u * kThreads);
    }
    for (; i < i1; i += kThreads) see(src[i], i);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        cnt += __shfl_xor_sync(0xffffffffu, cnt, off);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) {
        sm.warp_val[warp] = bv;
        sm.warp_id[warp] = bi;
        sm.warp_cnt[warp] = cnt;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = sm.warp_val[0];
        int id = sm.warp_id[0], c = sm.warp_cnt[0];
        for (int w = 1; w < kWarps; w++) {
            c += sm.warp_cnt[w];
            if (sm.warp_val[w] > v || (sm.warp_val[w] == v && sm.warp_id[w] < id)) {
                v = sm.warp_val[w];
                id = sm.warp_id[w];
            }
        }
        sm.bcast_int = id;
        sm.bcast_f = v;
        sm.found = c;
    }
    __syncthreads();
    *best_v = sm.bcast_f;
    *best_i = sm.bcast_int;
    *n = sm.found;
    __syncthreads();
}

/* the repetition penalty applies to this row (history of hl entries) */
__device__ __forceinline__ bool penalty_on(const sample_params &p, const zl_sampling &P, int hl) {
    return p.history && hl > 0 && P.repeat_last_n > 0 && P.repeat_penalty != 1.0f && P.repeat_penalty > 0.0f;
}

/* the row's id into out and, with a carry, into the carry at the row's index with the generator state after
 * the draw (thread 0, after its own rng write, so the state read is the advanced one) */
__device__ __forceinline__ void put_id(const sample_params &p, int row, int sidx, int id) {
    p.out[row] = id;
    if (p.rng_out) p.rng_out[row] = p.rng_state ? p.rng_state[sidx] : 0;
    if (p.carry_tok) {
        const int ci = p.carry_idx[row];
        p.carry_tok[ci] = id;
        p.carry_rng[ci] = p.rng_state ? p.rng_state[sidx] : 0;
    }
}

/* one row in one block: every sampling mode */
__device__ void sample_row(const sample_params &p, int row, block_smem &sm) {
    const zl_sampling P = p.params[row];
    const int V = p.vocab;
    const long lstride = p.logits_stride ? p.logits_stride : V;
    const float *lg = p.logits + (long)row * lstride;
    const int sidx = p.row_state ? p.row_state[row] : row;
    if (V <= 1) {
        if (threadIdx.x == 0) put_id(p, row, sidx, 0);
        return;
    }

    /* repetition penalty on a copy: each distinct id among the last repeat_last_n once */
    const float *src = lg;
    const int hl = p.history_len ? p.history_len[row] : 0;
    if (penalty_on(p, P, hl)) {
        float *wl = reinterpret_cast<float *>(p.workspace) + (long)row * V;
        for (int i = threadIdx.x; i < V; i += kThreads) wl[i] = lg[i];
        __syncthreads();
        const int n = hl < P.repeat_last_n ? hl : P.repeat_last_n;
        const int32_t *h = p.history + (long)sidx * p.history_stride + (hl - n);
        for (int i = threadIdx.x; i < n; i += kThreads) {
            const int32_t id = h[i];
            if (id < 0 || id >= V) continue;
            bool dup = false;
            for (int j = 0; j < i && !dup; j++) dup = h[j] == id;
            if (dup) continue;
            const float x = lg[id];
            wl[id] = x > 0.0f ? x / P.repeat_penalty : x * P.repeat_penalty;
        }
        __syncthreads();
        src = wl;
    }

    /* argmax (lowest id among maxima, NaN skipped) and the count of finite candidates */
    float bv;
    int bi, n_found;
    block_argmax(sm, src, 0, V, &bv, &bi, &n_found);
    if (isnan(src[0]) || bi >= V) bi = 0;   /* the CPU's scan starts at id 0 and only moves on '>' */
    row_ctx c;
    c.src = src;
    c.vocab = V;
    c.best = bi;
    c.lmax = bv;
    const int n_valid = n_found;
    if (!(P.temperature > 0.0f) || !p.rng_state) {
        if (threadIdx.x == 0) put_id(p, row, sidx, c.best);
        return;
    }
    if (n_valid == 0) {   /* everything masked: the CPU answers 0 without drawing */
        if (threadIdx.x == 0) put_id(p, row, sidx, 0);
        return;
    }
    c.invt_l2 = kLog2e / P.temperature;
    c.min_p = P.min_p;
    c.topk_on = 0;
    c.tk = 0;
    c.cut1 = V;
    c.topp_on = 0;
    c.t3 = 0;
    c.cut3 = V;

    /* top-k */
    if (P.top_k > 0 && P.top_k < n_valid) {
        u64 above;
        const uint32_t tk = radix_select(sm, V, (u64)P.top_k, [&](int i, bool *in, uint32_t *key, u64 *w) {
            const float x = src[i];
            *in = finite_cand(x);
            *key = fkey(x);
            *w = 1;
        }, &above);
        const int cut = block_find_cum(sm, V, (u64)P.top_k - above, [&](int i) -> u64 {
            const float x = src[i];
            return finite_cand(x) && fkey(x) == tk ? 1 : 0;
        });
        c.topk_on = 1;
        c.tk = tk;
        c.cut1 = cut < 0 ? V : cut;
    }

    /* top-p over the weights left after top-k and min-p */
    if (P.top_p < 1.0f) {
        u64 tot2 = 0;
        for (int i = threadIdx.x; i < V; i += kThreads) {
            const float x = src[i];
            tot2 += weight2(c, i, x, fkey(x));
        }
        u64 total;
        block_scan(sm, tot2, &total);
        tot2 = total;
        double t = ceil((double)P.top_p * (double)tot2);
        u64 target = t < 1.0 ? 1 : (u64)t;
        if (target > tot2) target = tot2;
        u64 above;
        const row_ctx cc = c;
        const uint32_t t3 = radix_select(sm, V, target, [&](int i, bool *in, uint32_t *key, u64 *w) {
            const float x = src[i];
            *key = fkey(x);
            *w = weight2(cc, i, x, *key);
            *in = *w != 0;
        }, &above);
        const int cut = block_find_cum(sm, V, target - above, [&](int i) -> u64 {
            const float x = src[i];
            const uint32_t key = fkey(x);
            return key == t3 ? weight2(cc, i, x, key) : 0;
        });
        c.topp_on = 1;
        c.t3 = t3;
        c.cut3 = cut < 0 ? V : cut;
    }

    /* draw */
    u64 tot3 = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) {
        const float x = src[i];
        tot3 += weight3(c, i, x, fkey(x));
    }
    u64 total;
    block_scan(sm, tot3, &total);
    tot3 = total;
    if (threadIdx.x == 0) {
        uint64_t st = p.rng_state[sidx];
        const float u = rng_uniform(&st);
        p.rng_state[sidx] = st;
        u64 target = (u64)((double)u * (double)tot3);
        if (target >= tot3) target = tot3 - 1;
        sm.bcast_u64 = target;
    }
    __syncthreads();
    const u64 target = sm.bcast_u64;
    __syncthreads();
    const row_ctx cc = c;
    const int pick = block_find_cum(sm, V, target + 1, [&](int i) -> u64 {
        const float x = src[i];
        return weight3(cc, i, x, fkey(x));
    });
    if (threadIdx.x == 0) put_id(p, row, sidx, pick >= 0 ? pick : c.best);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(sample_params p) {
    __shared__ block_smem sm;
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    sample_row(p, blockIdx.x, sm);
}

/* kCl blocks (one cluster) per row: plain greedy rows split their argmax over the cluster, every other row runs
 * sample_row in block 0. The branch is uniform over a cluster (it depends on the row only), so every block of a
 * cluster meets the same cluster barriers. */
__global__ void __launch_bounds__(kThreads) sample_cluster_kernel(sample_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ block_smem sm;
    pdl_trigger();
    pdl_wait();   /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    const int row = blockIdx.x / kCl, b = (int)cl.block_rank();
    const zl_sampling P = p.params[row];
    const int V = p.vocab;
    const int hl = p.history_len ? p.history_len[row] : 0;
    const bool greedy = !(P.temperature > 0.0f) || !p.rng_state;
    if (!greedy || penalty_on(p, P, hl) || V < kCl) {
        if (b == 0) sample_row(p, row, sm);
        return;
    }
    const long lstride = p.logits_stride ? p.logits_stride : V;
    const float *lg = p.logits + (long)row * lstride;
    const int i0 = (int)((long)V * b / kCl), i1 = (int)((long)V * (b + 1) / kCl);
    float bv;
    int bi, n;
    block_argmax(sm, lg, i0, i1, &bv, &bi, &n);   /* leaves its result in sm.bcast_f / sm.bcast_int */
    cl.sync();   /* every slice's result is visible to the cluster */
    if (b == 0 && threadIdx.x == 0) {
        float v = bv;
        int id = bi;
        for (int k = 1; k < kCl; k++) {   /* slices in id order: a later one wins only by a larger value */
            const float kv = *cl.map_shared_rank(&sm.bcast_f, k);
            const int ki = *cl.map_shared_rank(&sm.bcast_int, k);
            if (kv > v || (kv == v && ki < id)) { v = kv; id = ki; }
        }
        if (isnan(lg[0]) || id >= V) id = 0;   /* as sample_row */
        put_id(p, row, p.row_state ? p.row_state[row] : row, id);
    }
    cl.sync();   /* the slices' shared memory stays until block 0 has read it */
#else
    __trap();   /* sm_90 only: the host launches it only there */
#endif
}

} // namespace

extern "C" size_t sample_workspace_bytes(int n_rows, int vocab) {
    if (n_rows < 1 || vocab < 1) return 0;
    return (size_t)n_rows * (size_t)vocab * sizeof(float);
}

extern "C" cudaError_t sample_launch(const sample_params *p, cudaStream_t stream) {
    if (!p || !p->logits || !p->params || !p->out || p->n_rows < 1 || p->vocab < 1 || p->logits_stride < 0)
        return cudaErrorInvalidValue;
    if (p->logits_stride && p->logits_stride < p->vocab) return cudaErrorInvalidValue;
    if (p->history && (p->history_stride < 1 || !p->history_len)) return cudaErrorInvalidValue;
    if (p->history && (!p->workspace || p->workspace_bytes < sample_workspace_bytes(p->n_rows, p->vocab)))
        return cudaErrorInvalidValue;
    if (p->carry_tok && (!p->carry_rng || !p->carry_idx)) return cudaErrorInvalidValue;
    static int s_cl[64];   /* clusters: sm_90 and later (ZLLM_CUDA_SAMPLE_CLUSTER=0 off, for comparisons) */
    if (p->vocab >= kClMinVocab && (long)p->n_rows * kCl <= 0x7fffffffL &&
        cu_device_switch(s_cl, 9, 99, cu_settings_get()->sample_cluster)) {
        return cu_launch_cl(1, dim3(kCl, 1, 1), sample_cluster_kernel, dim3((unsigned)(p->n_rows * kCl)),
                            dim3(kThreads), 0, stream, *p);
    }
    return cu_launch(sample_kernel, dim3((unsigned)p->n_rows), dim3(kThreads), 0, stream, *p);
}
