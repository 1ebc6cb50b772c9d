/* cuda/f16x2.cuh: the f16x2 helpers of the quantized kernels' dequantization (cuda/qtc.cu, cuda/lab/qmma.cu), header
 * only, for .cu files, and qtc's Q4_K scale formula, which gpu_test_qtc checks exhaustively against its f32
 * definition. */
#ifndef ZLLM_CUDA_F16X2_CUH
#define ZLLM_CUDA_F16X2_CUH
#include <stdint.h>

static __device__ __forceinline__ uint32_t h2sub(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t h2fma(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
static __device__ __forceinline__ uint32_t h2mul(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
/* (a & m) | c in one LOP3. A SASS LOP3 takes one immediate, so ptxas splits (a & m) | c with two constants into two
 * LOP3; passed to this asm, the constant c is kept in a register (one move a kernel) and the LOP3 is one */
static __device__ __forceinline__ uint32_t lop_andor(uint32_t a, uint32_t m, uint32_t c)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(m), "r"(c));
    return d;
}
/* the f16x2 (x.lo, x.lo) (hi = 0) or (x.hi, x.hi) (hi = 1), written so that ptxas reads it as an operand
 * selector (.H0_H0 / .H1_H1) of the f16x2 instruction that uses it instead of a PRMT */
static __device__ __forceinline__ uint32_t h2bc(uint32_t x, int hi)
{
    uint32_t d;
    if (hi)
        asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h};}" : "=r"(d) : "r"(x));
    else
        asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l};}" : "=r"(d) : "r"(x));
    return d;
}
static __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* The scales of two Q4_K sub-blocks as f16x2 pairs (low half the first sub-block, high half the second):
 *   a01 = (f16(d sc0), f16(d sc1)), n01 = (f16(-(dmin m0)), f16(-(dmin m1))), s01 = (f16(d sc0 / 16), f16(d sc1 / 16))
 * from dm (d in bits 0..15, dmin in bits 16..31, f16) and f (sc0 in bits 0..5, m0 6..11, sc1 12..17, m1 18..23).
 * The 6-bit integers become f16 exactly (1024 + v under 0x6400, less 1024), and each scale is one f16x2 product:
 * d and dmin are f16 and the integers below 64, so the exact product is rounded once, which gives the bits of
 * __float2half_rn(d * (float)sc) (whose f32 product is exact too); d sc / 16 goes through sc / 16, exact. Five
 * f16x2 operations instead of six f32 products and six conversions (H100: 16 fewer instructions per tile unit of
 * the narrow kernel). Any d but NaN; gpu_test_qtc checks every d against the f32 form. */
static __device__ __forceinline__ void q4k_scales(uint32_t dm, uint32_t f, uint32_t &a01, uint32_t &n01,
                                                  uint32_t &s01)
{
    const uint32_t scf = h2sub(lop_andor(f, 0x3Fu, lop_andor(f << 4, 0x3F0000u, 0x64006400u)), 0x64006400u);
    const uint32_t mf = h2sub(lop_andor(f >> 6, 0x3Fu, lop_andor(f >> 2, 0x3F0000u, 0x64006400u)), 0x64006400u);
    a01 = h2mul(h2bc(dm, 0), scf);
    n01 = h2mul(h2bc(dm ^ 0x80000000u, 1), mf);   /* (-dmin) m: -0 where m = 0, as before */
    s01 = h2mul(h2bc(dm, 0), h2mul(scf, 0x2C002C00u));   /* 0x2C00: 1/16 */
}
#endif
