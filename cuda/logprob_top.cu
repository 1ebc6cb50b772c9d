/* cuda/logprob_top.cu: one 1024-thread block per row (see logprob_top.h): the maximum over the candidates, the sum of
 * exp(x - max) in float64 (each thread over a fixed stride of ids, then a fixed tree: the same bits whatever else
 * runs), and the top k by k block-wide arg-maxima, each over the candidates ordered after the previous pick (logit
 * descending, id ascending). k <= 20 passes over the row. */
#include <math.h>
#include "cu_host.h"
#include "logprob_top.h"
#include "pdl.cuh"

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ bool cand(float x) { return !isnan(x) && x != -INFINITY; }
/* a before b in (logit descending, id ascending) */
__device__ __forceinline__ bool before(float xa, int ia, float xb, int ib) { return xa > xb || (xa == xb && ia < ib); }

struct smem {
    float v[kWarps];
    int id[kWarps];
    double d[kWarps];
    float bv;
    int bi;
    double bd;
};

/* the first candidate in (logit desc, id asc) order strictly after (pv, pi) (pi < 0: from the start); every
 * thread gets it in *ov / *oi (oi -1 when none) */
__device__ void block_next(smem &sm, const float *x, int V, float pv, int pi, float *ov, int *oi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < V; i += kThreads) {
        const float v = x[i];
        if (!cand(v) || (pi >= 0 && !before(pv, pi, v, i))) continue;
        if (bi < 0 || before(v, i, bv, bi)) bv = v, bi = i;
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov2 = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi2 = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi2 >= 0 && (bi < 0 || before(ov2, oi2, bv, bi))) bv = ov2, bi = oi2;
    }
    if (lane == 0) sm.v[warp] = bv, sm.id[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = sm.v[0];
        int id = sm.id[0];
        for (int w = 1; w < kWarps; w++)
            if (sm.id[w] >= 0 && (id < 0 || before(sm.v[w], sm.id[w], v, id))) v = sm.v[w], id = sm.id[w];
        sm.bv = v;
        sm.bi = id;
    }
    __syncthreads();
    *ov = sm.bv;
    *oi = sm.bi;
    __syncthreads();
}

/* sum over the block of each thread's d, in a fixed order; every thread gets it */
__device__ double block_sum(smem &sm, double d) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (lane == 0) sm.d[warp] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < kWarps; w++) s += sm.d[w];
        sm.bd = s;
    }
    __syncthreads();
    const double r = sm.bd;
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(kThreads) logprobs_kernel(logprobs_params p) {
    __shared__ smem sm;
    pdl_trigger();
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int row = blockIdx.x, V = p.vocab;
    zl_sampling P;
    if (p.params) {
        P = p.params[row];
        if (!P.logprobs) return;
    } else { /* raw rows (prompt logprobs): every row, no penalty */
        memset(&P, 0, sizeof P);
    }
    const long stride = p.logits_stride ? p.logits_stride : V;
    const int hl = p.hist_len && p.params ? p.hist_len[row] : 0;
    const bool pen = p.pen_rows && hl > 0 && P.repeat_last_n > 0 && P.repeat_penalty != 1.0f && P.repeat_penalty > 0.0f;
    const float *x = pen ? p.pen_rows + (long)row * V : p.logits + (long)row * stride;
    float mx;
    int mi;
    block_next(sm, x, V, 0.0f, -1, &mx, &mi);
    zl_logprobs *o = &p.out[row];
    const int k0 = p.top_k ? p.top_k[row] : P.top_logprobs;
    int k = k0 < 0 ? 0 : k0 > ZL_MAX_TOP_LOGPROBS ? ZL_MAX_TOP_LOGPROBS : k0;
    if (mi < 0) { /* no candidate at all */
        if (threadIdx.x == 0) o->logprob = -INFINITY, o->n_top = 0;
        return;
    }
    double d = 0.0;
    for (int i = threadIdx.x; i < V; i += kThreads)
        if (cand(x[i])) d += exp((double)x[i] - (double)mx);
    const double lse = (double)mx + log(block_sum(sm, d));
    if (threadIdx.x == 0) {
        const int s = p.sampled[row];
        o->logprob = s >= 0 && s < V && cand(x[s]) ? (float)((double)x[s] - lse) : -INFINITY;
    }
    float pv = mx;
    int pi = mi, n = 0;
    while (n < k && pi >= 0) {
        if (threadIdx.x == 0) {
            o->top_id[n] = pi;
            o->top_logprob[n] = (float)((double)pv - lse);
        }
        n++;
        if (n < k) block_next(sm, x, V, pv, pi, &pv, &pi);
    }
    if (threadIdx.x == 0) o->n_top = n;
}

} // namespace

extern "C" cudaError_t logprobs_launch(const logprobs_params *p, cudaStream_t stream) {
    if (!p || !p->logits || (!p->params && !p->top_k) || !p->sampled || !p->out || p->n_rows < 1 || p->vocab < 1 ||
        p->logits_stride < 0 || (p->logits_stride && p->logits_stride < p->vocab))
        return cudaErrorInvalidValue;
    return cu_launch(logprobs_kernel, dim3((unsigned)p->n_rows), dim3(kThreads), 0, stream, *p);
}
