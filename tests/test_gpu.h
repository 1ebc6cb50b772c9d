/* tests/test_gpu.h: host helpers shared by the GPU matrix-kernel checks (cuda/lab/test_qgemv.cu, cuda/lab/test_qmma.cu,
 * cuda/test_qtc.cu): the CUDA-call check, f16 activations, the output buffers with NaN poison and the residual
 * forms, a launch captured into a CUDA graph or not, and the double-precision oracle comparison. C++ (CUDA
 * runtime); include after quant.h, test.h and tests/test_rand.h. A failing CUDA call of the harness itself (not
 * of the kernel under test) exits with status 2. */
#ifndef ZLLM_TEST_GPU_H
#define ZLLM_TEST_GPU_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <cuda_runtime.h>

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(2); } } while (0)

/* random activations rounded to f16: bits (for the device) and their exact f32 values (for the oracle) */
static inline void tg_rand_x_f16(std::vector<uint16_t> &xh, std::vector<float> &xf, size_t n)
{
    xh.resize(n);
    xf.resize(n);
    for (size_t i = 0; i < n; i++) {
        xh[i] = f32_to_fp16(rnd_normal());
        xf[i] = fp16_to_f32(xh[i]);
    }
}

/* the output of ny floats on the device: resid 2 = in place (*dy holds yin_h, *dyin == *dy); else *dy is NaN
 * poison and, for resid 1, *dyin a separate copy of yin_h (NULL for resid 0). tg_out_free releases them. */
static inline void tg_out_alloc(size_t ny, int resid, const float *yin_h, float **dy, float **dyin)
{
    CK(cudaMalloc(dy, ny * 4));
    *dyin = NULL;
    if (resid == 2) {
        CK(cudaMemcpy(*dy, yin_h, ny * 4, cudaMemcpyHostToDevice));
        *dyin = *dy;
        return;
    }
    CK(cudaMemset(*dy, 0xff, ny * 4));
    if (resid == 1) {
        CK(cudaMalloc(dyin, ny * 4));
        CK(cudaMemcpy(*dyin, yin_h, ny * 4, cudaMemcpyHostToDevice));
    }
}
static inline void tg_out_free(int resid, float *dy, float *dyin)
{
    cudaFree(dy);
    if (resid == 1) cudaFree(dyin);
}

/* launch(st) once: on the default stream (graph 0), or captured on a new stream into a CUDA graph that is then
 * instantiated and replayed (graph 1); synchronised either way. Returns launch's own error. */
template <typename F> static inline cudaError_t tg_launch(int graph, F launch)
{
    cudaError_t e;
    if (graph) {
        cudaStream_t st;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamCreate(&st));
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        e = launch(st);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        CK(cudaStreamDestroy(st));
    } else {
        e = launch((cudaStream_t)0);
    }
    CK(cudaDeviceSynchronize());
    return e;
}

/* y [m][ldy] against the oracle s = sum_i w[o][i] x[mi][i] (+ yin[mi][o] when resid), summed in double: nan
 * counts NaN outputs, bad the elements off by more than 1e-3 of sum |terms|, rel the relative L2 error, either
 * the worst batch row's (per_row 1) or over the whole output (per_row 0) */
struct tg_cmp {
    int nan, bad;
    double rel;
};
static inline tg_cmp tg_oracle(const float *wf, const float *xf, int ldx, const float *yin, const float *y, int ldy,
                               int m, int n_in, int n_out, int resid, int per_row)
{
    tg_cmp r = {0, 0, 0.0};
    double num = 0.0, den = 0.0;
    for (int mi = 0; mi < m; mi++) {
        if (per_row) num = den = 0.0;
        for (int o = 0; o < n_out; o++) {
            const float *w = wf + (size_t)o * n_in, *xr = xf + (size_t)mi * ldx;
            double s = 0.0, sa = 0.0;
            for (int i = 0; i < n_in; i++) {
                const double t = (double)w[i] * (double)xr[i];
                s += t;
                sa += fabs(t);
            }
            if (resid) {
                s += yin[(size_t)mi * ldy + o];
                sa += fabs(yin[(size_t)mi * ldy + o]);
            }
            const double got = y[(size_t)mi * ldy + o];
            if (isnan(got)) { r.nan++; continue; }
            const double err = fabs(got - s);
            if (err > 1e-3 * sa + 1e-30) r.bad++;
            num += err * err;
            den += s * s;
        }
        if (per_row) {
            const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (rel > r.rel) r.rel = rel;
        }
    }
    if (!per_row) r.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return r;
}
#endif
