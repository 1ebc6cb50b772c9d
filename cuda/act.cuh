/* cuda/act.cuh: the activation expressions that more than one kernel evaluates. One definition each, so that a
 * fused form (wtc's SwiGLU epilogue) computes the same bits as the separate kernel (cuda/ops.cu). */
#ifndef ZLLM_CUDA_ACT_CUH
#define ZLLM_CUDA_ACT_CUH

/* silu(a) * b = a / (1 + e^-a) * b in f32 (expf, IEEE division: no fast-math contraction to rely on) */
__device__ __forceinline__ float silu_mul(float a, float b) { return a / (1.0f + expf(-a)) * b; }

#endif
