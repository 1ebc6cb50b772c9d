/* cuda/mma_util.cuh: device helpers shared by the tensor-core kernels (the attention kernels, cuda/wtc.cu,
 * cuda/qtc.cu): mma.sync m16n8k16 with f32 accumulators for F16/BF16 operands, ldmatrix, cp.async, the XOR swizzle
 * of [rows][D] shared-memory tiles and the warp index as a warp-uniform value. Device code only, sm_80 and later. */
#ifndef ZLLM_CUDA_MMA_UTIL_CUH
#define ZLLM_CUDA_MMA_UTIL_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace zmma {

/* per-type packing of two f32 into one 32-bit register of 16-bit values (lower half = first value) and the mma
 * c[16x8] += a[16x16] b[16x8] (fragments in the PTX ISA's m16n8k16 layout) */
template <typename T> struct tc_type;
template <> struct tc_type<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct tc_type<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i */
__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
/* the same, each matrix transposed */
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
/* 16-byte copy global -> shared, zero-filled (nothing read) when !valid */
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
/* 4-byte copy global -> shared (cp.async.ca; joins this thread's open group like the 16-byte copies) */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* waits until at most N of this thread's committed groups are pending */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* element offset of 16-byte chunk c of row r in a [rows][D] shared array, chunks swizzled by (r & 7): the
 * ldmatrix reads of 8 consecutive rows at one chunk hit 8 distinct bank groups */
template <int D> __device__ __forceinline__ int sw(int r, int c) { return r * D + ((c ^ (r & 7)) << 3); }

/* The warp's index in its block, read from lane 0 through a shuffle: the compiler then knows it uniform across the
 * warp, keeps what derives from it (a warp's unit range and ring, a warpgroup's wgmma descriptors and barrier
 * addresses) in uniform registers, and branches on it without reconvergence code. From threadIdx.x alone it is a
 * per-thread value to the compiler, which then builds those values per thread and moves each wgmma's descriptors
 * into uniform registers before it. Every lane of the warp calls it (a full-mask shuffle). */
__device__ __forceinline__ int warp_index() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 5), 0); }

} // namespace zmma
#endif
