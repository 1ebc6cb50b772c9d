/* cuda/mbar.cuh: shared-memory barriers with transaction counts (mbarrier, sm_90a) and the bulk copies that
 * complete them, for the warp-specialized kernels of cuda/wtc.cu and cuda/qtc.cu: one producer thread arms a
 * stage's full barrier with the stage's byte count (mbar_expect_tx) and issues its copies; the consumers wait on
 * that barrier's phase (mbar_wait), and once they are done with the stage arrive on its empty barrier, which the
 * producer waits on before it refills the slot. Addresses are shared-window addresses (smem_u32). Device code
 * only; defined only where sm_90a code is compiled (ZWG_ON). */
#ifndef ZLLM_CUDA_MBAR_CUH
#define ZLLM_CUDA_MBAR_CUH
#include <stdint.h>

#include "wgmma.cuh"

#if ZWG_ON
/* count: the arrivals that complete one phase */
__device__ __forceinline__ void mbar_init(uint32_t a, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
/* one arrival that also expects bytes more of transactions (the copies issued against the barrier) */
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
/* waits for the completion of the barrier's phase with this parity (acquire) */
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on barrier bar */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif
#endif
