/* cuda/ops_gemma.h: the row kernels the gemma3 block adds to the CUDA engine's forward pass: the embedding scale,
 * the norm of a block's output before its residual add, and GeGLU (its per-head RMSNorm of q and k, shared with
 * qwen3, is ops_head_rmsnorm in cuda/ops.h). Conventions as in cuda/ops.h: f32 activations, every launcher enqueues
 * on st and returns 0, or -1 with a message in err when the launch fails; nothing allocates, so every launcher may be captured into a CUDA graph. Each value of a row depends
 * on that row alone (batch invariance). Plain launches (no programmatic dependent launch). */
#ifndef ZLLM_CUDA_OPS_GEMMA_H
#define ZLLM_CUDA_OPS_GEMMA_H
#include <stddef.h>
#include <cuda_runtime.h>
#include "ops.h"

/* x[i] *= s for i < n */
int ops_scale(float *x, size_t n, float s, cudaStream_t st, char *err, size_t errlen);

/* x[r] += y[r] / sqrt(mean(y[r]^2) + eps) * w for r < n_rows: x [n_rows][dim], y rows ldy floats apart, w [dim] */
int ops_rmsnorm_add(float *x, const float *y, int ldy, const float *w, int dim, float eps, int n_rows, cudaStream_t st,
                    char *err, size_t errlen);

/* GeGLU: out[r][i] = gelu_tanh(gate[r][i]) * up[r][i] as odt, gelu_tanh(a) = a/2 (1 + tanh(sqrt(2/pi)(a + 0.044715
 * a^3))); gate and up rows ld floats apart (ld >= n, 0 means n), out rows contiguous [n_rows][n] */
int ops_geglu(const float *gate, const float *up, int ld, int n_rows, int n, void *out, cu_dtype odt, cudaStream_t st,
              char *err, size_t errlen);
#endif
