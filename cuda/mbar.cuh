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
/* Pairs of CTAs in one cluster (wtc.cu's paired form, MC): a CTA's consumers also release the peer's slot, at CTA
 * scope (a cluster-scope release is a GPU-wide memory barrier an arrival): what the release orders is the
 * retirement of wgmma reads (wgmma.wait_group) before the peer's copies into the slot, which the peer's producer
 * issues only once it has seen the arrival. */
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* every thread of every CTA of the cluster: the barriers initialized before are visible to the peers */
__device__ __forceinline__ void cluster_sync_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n"
                 "barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
/* the cluster-window address of the shared address a in CTA `rank` of the cluster */
__device__ __forceinline__ uint32_t cluster_addr(uint32_t a, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
/* one arrival on the barrier at cluster-window address a (cluster_addr) */
__device__ __forceinline__ void mbar_arrive_cl(uint32_t a) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(a) : "memory");
}
/* Data handed to a peer CTA (wtc.cu's k-split pair, KP): a thread stores into the peer's shared memory
 * (st_cluster_f32), then arrives on the peer's barrier with release at cluster scope (mbar_arrive_cl_release), and the
 * peer waits with acquire at cluster scope (mbar_wait_cl) before it reads what was stored. */
/* v to the cluster-window address a (cluster_addr) */
__device__ __forceinline__ void st_cluster_f32(uint32_t a, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
/* one arrival on the barrier at cluster-window address a, ordering this thread's earlier stores before it */
__device__ __forceinline__ void mbar_arrive_cl_release(uint32_t a) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(a) : "memory");
}
/* mbar_wait with acquire at cluster scope: the stores the peers' arrivals released are visible after it */
__device__ __forceinline__ void mbar_wait_cl(uint32_t a, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
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
