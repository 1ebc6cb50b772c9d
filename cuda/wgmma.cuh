/* cuda/wgmma.cuh: Hopper warpgroup matrix multiply (wgmma.mma_async, sm_90a only) for the kernels of cuda/wtc.cu and
 * cuda/qtc.cu (whose register-A form, mma_ra, is at the end).
 *
 * One warpgroup (4 consecutive warps, 128 threads) issues D[64 x N] += A[64 x 16] B[16 x N] with both operands in
 * shared memory as K-major tiles in the 128-byte swizzle: [rows][64] 16-bit values, 128 bytes a row, 16-byte
 * chunk c of row r stored at chunk c ^ (r & 7), tile bases 1024-byte aligned (the layout wtc.cu's cp.async
 * loads already write, so ldmatrix and wgmma read the same tiles). D is f32 in registers, N / 2 per thread:
 * thread (warp w of the group, lane = 4 g + t) holds d[4 j + e] = D[16 w + g + 8 (e >> 1)][8 j + 2 t + (e & 1)],
 * the m16n8 accumulator layout of mma.sync repeated over j < N / 8.
 *
 * Arithmetic: measured on an H100 (a probe of 786,432 elements per type over three value
 * distributions, K up to 4096, N 8..256, either operand order): a chain of wgmma k16 steps gives the same bits as
 * the chain of mma.sync.m16n8k16 steps over the same k order, for BF16 and F16. cuda/test_wtc.cu checks it for
 * every shape it runs (the wgmma forms against the mma.sync ones, bit for bit).
 *
 * The wrappers below differ only in N (the operand list is N / 2 registers long, so each N is written out once)
 * and the type (a macro argument). Device code only. */
#ifndef ZLLM_CUDA_WGMMA_CUH
#define ZLLM_CUDA_WGMMA_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace zwg {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZWG_ON 1
/* the descriptor of a K-major 128B-swizzled tile whose k16 step starts at p (tile base + 32 bytes per step):
 * start address >> 4, leading offset unused (1) for swizzled K-major, stride 1024 bytes between 8-row groups */
constexpr uint64_t kDescHi = ((uint64_t)(1024 >> 4) << 32) | (1ull << 62); /* the stride and the swizzle */
__device__ __forceinline__ uint64_t desc(const void *p) {
    const uint64_t a = (uint32_t)__cvta_generic_to_shared(p);
    return ((a & 0x3FFFF) >> 4) | (1ull << 16) | kDescHi;
}
/* the descriptor whose low word is lo (desc's low word plus a start-address offset in 16-byte units) */
__device__ __forceinline__ uint64_t desc_at(uint32_t lo) { return kDescHi | lo; }
/* before the first wgmma of a group: orders the registers' earlier writes before the asynchronous reads */
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* waits until at most N of this warpgroup's committed groups are pending */
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accesses of r across a wait (the asynchronous writes are invisible to it) */
__device__ __forceinline__ void reg_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }
/* orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later wgmma reads */
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <typename T, int N> struct mma;
/* the wrapper for one N, written once and instantiated for BF16 and F16 (PT: the PTX type name) */
#define ZWG_MMA_N16(TY, PT)                                                                         \
    template <> struct mma<TY, 16> {                                                                \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {            \
            asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32." PT "." PT " {"               \
                         "%0,%1,%2,%3,%4,%5,%6,%7"                                                  \
                         "}, %8, %9, 1, 1, 1, 0, 0;\n"                                              \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),  \
                           "+f"(d[6]), "+f"(d[7])                                                   \
                         : "l"(da), "l"(db));                                                       \
        }                                                                                           \
    };
ZWG_MMA_N16(__nv_bfloat16, "bf16")
ZWG_MMA_N16(__half, "f16")
#undef ZWG_MMA_N16
#define ZWG_MMA_N32(TY, PT)                                                                           \
    template <> struct mma<TY, 32> {                                                                  \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {              \
            asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32." PT "." PT " {"                 \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"                      \
                         "}, %16, %17, 1, 1, 1, 0, 0;\n"                                              \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),    \
                           "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),  \
                           "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                         \
                         : "l"(da), "l"(db));                                                         \
        }                                                                                             \
    };
ZWG_MMA_N32(__nv_bfloat16, "bf16")
ZWG_MMA_N32(__half, "f16")
#undef ZWG_MMA_N32
#define ZWG_MMA_N64(TY, PT)                                                                               \
    template <> struct mma<TY, 64> {                                                                      \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {                  \
            asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " {"                     \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                         \
                         "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"                \
                         "}, %32, %33, 1, 1, 1, 0, 0;\n"                                                  \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),        \
                           "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),      \
                           "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),  \
                           "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                           "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),  \
                           "+f"(d[30]), "+f"(d[31])                                                       \
                         : "l"(da), "l"(db));                                                             \
        }                                                                                                 \
    };
ZWG_MMA_N64(__nv_bfloat16, "bf16")
ZWG_MMA_N64(__half, "f16")
#undef ZWG_MMA_N64
#define ZWG_MMA_N128(TY, PT)                                                                              \
    template <> struct mma<TY, 128> {                                                                     \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {                  \
            asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." PT "." PT " {"                    \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                         \
                         "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"               \
                         "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"               \
                         "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"                \
                         "}, %64, %65, 1, 1, 1, 0, 0;\n"                                                  \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),        \
                           "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),      \
                           "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),  \
                           "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                           "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),  \
                           "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
                           "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),  \
                           "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
                           "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),  \
                           "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),  \
                           "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                             \
                         : "l"(da), "l"(db));                                                             \
        }                                                                                                 \
    };
ZWG_MMA_N128(__nv_bfloat16, "bf16")
ZWG_MMA_N128(__half, "f16")
#undef ZWG_MMA_N128
#define ZWG_MMA_N192(TY, PT)                                                                                           \
    template <> struct mma<TY, 192> {                                                                                  \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {                               \
            asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32." PT "." PT " {"                                 \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                      \
                         "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                            \
                         "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                            \
                         "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                            \
                         "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                            \
                         "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"                             \
                         "}, %96, %97, 1, 1, 1, 0, 0;\n"                                                               \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
                           "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),     \
                           "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),  \
                           "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),  \
                           "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),  \
                           "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),  \
                           "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),  \
                           "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
                           "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),  \
                           "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),  \
                           "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),  \
                           "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),  \
                           "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),  \
                           "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])                             \
                         : "l"(da), "l"(db));                                                                          \
        }                                                                                                              \
    };
ZWG_MMA_N192(__nv_bfloat16, "bf16")
ZWG_MMA_N192(__half, "f16")
#undef ZWG_MMA_N192
#define ZWG_MMA_N256(TY, PT)                                                                                    \
    template <> struct mma<TY, 256> {                                                                           \
        static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db) {                        \
            asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32." PT "." PT " {"                          \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                               \
                         "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                     \
                         "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                     \
                         "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                     \
                         "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                     \
                         "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                     \
                         "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"         \
                         "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"      \
                         "}, %128, %129, 1, 1, 1, 0, 0;\n"                                                      \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),              \
                           "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),            \
                           "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),        \
                           "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),        \
                           "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),        \
                           "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),        \
                           "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),        \
                           "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),        \
                           "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),        \
                           "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),        \
                           "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),        \
                           "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),        \
                           "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),        \
                           "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),        \
                           "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),        \
                           "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),        \
                           "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),      \
                           "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),  \
                           "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),  \
                           "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
                           "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),  \
                           "+f"(d[126]), "+f"(d[127])                                                           \
                         : "l"(da), "l"(db));                                                                   \
        }                                                                                                       \
    };
ZWG_MMA_N256(__nv_bfloat16, "bf16")
ZWG_MMA_N256(__half, "f16")
#undef ZWG_MMA_N256
/* register-A form, F16 only (cuda/qtc.cu: A is a fragment dequantized in registers): D[64 x N] += A[64 x 16] B[16 x N],
 * warp w of the group holding rows 16 w .. 16 w + 15 of A in the m16n8k16 A layout, B in shared memory as above.
 * The registers of A must not change until a wait covers the wgmma (reg_keep after that wait) */
template <int N> struct mma_ra;
template <> struct mma_ra<32> {
    static __device__ __forceinline__ void run(float *d, const uint32_t (&a)[4], uint64_t db)
    {
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                     "}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                       "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                       "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <> struct mma_ra<64> {
    static __device__ __forceinline__ void run(float *d, const uint32_t (&a)[4], uint64_t db)
    {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                     "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                       "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                       "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                       "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                       "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <> struct mma_ra<128> {
    static __device__ __forceinline__ void run(float *d, const uint32_t (&a)[4], uint64_t db) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                     "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                     "}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                       "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                       "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                       "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                       "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
/* register-A form of N = 64 for either type, B K-major (TB 0: [64 n rows][64 k] tiles as above) or MN-major (TB 1:
 * [16 k rows][64 n] of a [k][64] 128B-swizzled tile, described by desc_mn): cuda/attn_prefill_wg.cu's S = Q K^T and
 * O += P V. The registers of A must not change until a wait covers the wgmma (reg_keep after that wait) */
template <typename T, int TB> struct mma_r64;
#define ZWG_MMA_R64(TY, PT, TB)                                                                                        \
    template <> struct mma_r64<TY, TB> {                                                                               \
        static __device__ __forceinline__ void run(float *d, const uint32_t (&a)[4], uint64_t db) {                    \
            asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " {"                                  \
                         "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                      \
                         "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"                             \
                         "}, {%32,%33,%34,%35}, %36, 1, 1, 1, " #TB ";\n"                                              \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
                           "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),     \
                           "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),  \
                           "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),  \
                           "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                          \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                       \
        }                                                                                                              \
    };
ZWG_MMA_R64(__nv_bfloat16, "bf16", 0)
ZWG_MMA_R64(__nv_bfloat16, "bf16", 1)
ZWG_MMA_R64(__half, "f16", 0)
ZWG_MMA_R64(__half, "f16", 1)
#undef ZWG_MMA_R64
/* the descriptor of an MN-major operand of N = 64 whose k16 step starts at p: p is row k of a [k][64] tile in the
 * 128-byte swizzle (1024-byte aligned tile, k a multiple of 8); the 8-row groups along k are 1024 bytes apart.
 * Both byte offsets are 1024: one N = 64 step spans a single swizzle atom along N, so only the k-group stride is
 * read, under either offset's reading */
__device__ __forceinline__ uint64_t desc_mn(const void *p) {
    const uint64_t a = (uint32_t)__cvta_generic_to_shared(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 16) | kDescHi;
}
/* keeps the compiler from reusing a register an issued wgmma may still read, or reading one it may still write,
 * before the wait that covers it */
__device__ __forceinline__ void reg_keep(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
#else
#define ZWG_ON 0
#endif

} // namespace zwg
#endif
