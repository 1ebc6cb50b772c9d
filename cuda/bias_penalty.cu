/* cuda/bias_penalty.cu: logit bias and presence/frequency penalties, one 256-thread block per row (see bias_penalty.h).
 * The copy is spread over the block; the bias entries are added by thread 0 in their order (two entries may name
 * one id: the sum then rounds as the CPU's does); the generated ids are distinct, so each thread updates its own. */
#include "pdl.cuh"
#include "bias_penalty.h"
#include "cu_host.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) penalty_kernel(penalty_params p) {
    pdl_trigger();
    pdl_wait(); /* cu_launch contract (cuda/pdl.cuh): nothing read or written before */
    const int row = blockIdx.x, V = p.vocab;
    const long stride = p.logits_stride ? p.logits_stride : V;
    const float *src = p.logits + (long)row * stride;
    float *dst = p.out + (long)row * V;
    for (int i = threadIdx.x; i < V; i += kThreads) dst[i] = src[i];
    __syncthreads();
    const int nb = p.bias_n ? p.bias_n[row] : 0;
    if (threadIdx.x == 0)
        for (int j = 0; j < nb && j < p.bias_stride; j++) {
            const int id = p.bias_id[(long)row * p.bias_stride + j];
            if (id >= 0 && id < V) dst[id] = __fadd_rn(dst[id], p.bias[(long)row * p.bias_stride + j]);
        }
    __syncthreads();
    const zl_sampling P = p.params[row];
    if (P.presence_penalty == 0.0f && P.frequency_penalty == 0.0f) return;
    const int ng = p.gen_n ? p.gen_n[row] : 0;
    for (int j = threadIdx.x; j < ng && j < p.gen_stride; j += kThreads) {
        const int id = p.gen_id[(long)row * p.gen_stride + j];
        const int c = p.gen_cnt[(long)row * p.gen_stride + j];
        if (id < 0 || id >= V) continue;
        const float pen = __fadd_rn(__fmul_rn((float)c, P.frequency_penalty), P.presence_penalty);
        dst[id] = __fsub_rn(dst[id], pen);
    }
}

} // namespace

extern "C" cudaError_t penalty_launch(const penalty_params *p, cudaStream_t stream) {
    if (!p || !p->logits || !p->out || !p->params || p->n_rows < 1 || p->vocab < 1 || p->logits_stride < 0 ||
        (p->logits_stride && p->logits_stride < p->vocab) ||
        (p->bias_n && (!p->bias_id || !p->bias || p->bias_stride < 1)) ||
        (p->gen_n && (!p->gen_id || !p->gen_cnt || p->gen_stride < 1)))
        return cudaErrorInvalidValue;
    return cu_launch(penalty_kernel, dim3((unsigned)p->n_rows), dim3(kThreads), 0, stream, *p);
}
