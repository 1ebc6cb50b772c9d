/* cuda/attn_vec.cuh: device helpers shared by the CUDA-core attention kernels (cuda/attention.cu decode,
 * cuda/attn_prefill.cu prefill): 16-byte vectors of K/V elements converted to f32, the log2(e) scale and the head
 * sizes they serve. Header only, for .cu files. */
#ifndef ZLLM_CUDA_ATTN_VEC_CUH
#define ZLLM_CUDA_ATTN_VEC_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr float kLog2e = 1.4426950408889634f;

/* the head sizes the attention kernels serve */
inline int attn_head_dim_ok(int d) {
    return d == 8 || d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}

/* ---- 16-byte vectors of K/V elements converted to f32 ---- */
template <typename T> struct vec_traits;
template <> struct vec_traits<float> { static constexpr int VEC = 4; };
template <> struct vec_traits<__half> { static constexpr int VEC = 8; };
template <> struct vec_traits<__nv_bfloat16> { static constexpr int VEC = 8; };

__device__ __forceinline__ void bf2(uint32_t w, float &a, float &b) {
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void h2(uint32_t w, float &a, float &b) {
    __half2 h = *reinterpret_cast<__half2 *>(&w);
    float2 f = __half22float2(h);
    a = f.x;
    b = f.y;
}
template <typename T> __device__ __forceinline__ void cvt8(const uint4 r, float *f);
template <> __device__ __forceinline__ void cvt8<__nv_bfloat16>(const uint4 r, float *f) {
    bf2(r.x, f[0], f[1]); bf2(r.y, f[2], f[3]); bf2(r.z, f[4], f[5]); bf2(r.w, f[6], f[7]);
}
template <> __device__ __forceinline__ void cvt8<__half>(const uint4 r, float *f) {
    h2(r.x, f[0], f[1]); h2(r.y, f[2], f[3]); h2(r.z, f[4], f[5]); h2(r.w, f[6], f[7]);
}
template <typename T> __device__ __forceinline__ void cvt_any(const uint4 r, float *f) {
    if constexpr (sizeof(T) == 4) {
        f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w);
    } else {
        cvt8<T>(r, f);
    }
}

} // namespace
#endif
