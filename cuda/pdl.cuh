/* cuda/pdl.cuh: programmatic dependent launch (PDL, Hopper and later), header only, for .cu files.
 *
 * Why. A decode step at batch 1 is a chain of ~10 short kernels per layer, each dependent on the one before.
 * Launched plainly, kernel n+1 starts only when every block of kernel n has exited and its writes are flushed:
 * the GPU drains (the last blocks finish alone) and then ramps up (launch, first loads in flight) at every
 * boundary, a few microseconds each, which at M = 1 is a large part of a layer. With PDL, kernel n+1 may be
 * launched while kernel n still runs: its blocks become resident as soon as every block of kernel n has called
 * pdl_trigger() (or exited), read what does NOT depend on kernel n (the weights: written once at load), and
 * then block in pdl_wait() until kernel n has completed and its memory is visible. So a matrix kernel's first
 * weight tiles are already in shared memory when its input vector becomes ready.
 *
 * The contract of a kernel launched by cu_launch (with the attribute on):
 *   - every block calls pdl_wait() before its first read of anything an earlier kernel of the stream wrote and
 *     before its first write of anything an earlier kernel reads or writes (write-after-read counts too); before
 *     it, only memory that no kernel writes (weights, constant tables) may be read, and memory a plain copy put
 *     there ahead of the chain's first kernel (the engine's per-step input block, copied from the host before the
 *     step: every kernel of the step starts after that copy has completed; attn_decode_params.kv_pre and
 *     ops_qkv_args.pos_pre say when a caller guarantees this);
 *   - a block may return before pdl_wait() only if it touches no such memory at all.
 * Completion is transitive: kernel n itself passed its pdl_wait() (or was launched plainly), so when kernel n
 * has completed, so has everything before it. A plain launch (a cuBLAS kernel, a copy) after or before a PDL one
 * keeps the full stream order. pdl_trigger() only lets the NEXT kernel be launched early; it never lets this
 * kernel's results be read early (the next kernel still waits for our completion in its pdl_wait()).
 * Both instructions are no-ops on a kernel launched without the attribute, and compile to nothing below sm_90.
 * Launch order and results are unchanged: PDL moves no arithmetic, so bits are identical with it on or off
 * (ZLLM_CUDA_PDL=0 turns it off; the checks compare). Stream capture records the dependency as a programmatic
 * graph edge, so CUDA graphs replay it. */
#ifndef ZLLM_CUDA_PDL_CUH
#define ZLLM_CUDA_PDL_CUH
#include <cuda_runtime.h>
#include <utility>

#include "cu_host.h"

/* blocks until the previous kernel of the stream has completed and its writes are visible (see above) */
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* lets the next kernel of the stream be launched once every block of this one has called it (or exited) */
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 1 when launches on the current device get the PDL attribute: compute capability >= 9.0 and ZLLM_CUDA_PDL not 0.
 * Cached per device (64 devices); safe while a stream is captured (attribute queries only). */
static inline int cu_pdl_on() {
    static int s_state[64];
    return cu_device_switch(s_state, 9, 1 << 30, cu_settings_get()->pdl);
}

/* cudaLaunchKernelEx with the n attributes at[] (room for one more) and, where allow and cu_pdl_on(), the
 * programmatic-serialization attribute after them: the launch path cu_launch_cl and cu_launch_win share */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_attrs(cudaLaunchAttribute *at, unsigned n, int allow, void (*k)(KArgs...),
                                          dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    if (allow && cu_pdl_on()) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = n ? at : nullptr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

/* Launches kernel k<<<grid, block, smem, st>>>(args...) in thread-block clusters of `cluster` blocks (sm_90;
 * cluster.x == 0: no clusters), with the programmatic-serialization attribute when allow and cu_pdl_on(); k must
 * keep the contract above. Returns the launch's error (cudaSuccess when enqueued). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_cl(int allow, dim3 cluster, void (*k)(KArgs...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t st, Args &&...args) {
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (cluster.x) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster.x;
        at[n].val.clusterDim.y = cluster.y;
        at[n].val.clusterDim.z = cluster.z;
        n++;
    }
    return cu_launch_attrs(at, n, allow, k, grid, block, smem, st, std::forward<Args>(args)...);
}

/* cu_launch with an L2 access policy window on [base, base + bytes) (capped at the device's largest window; none
 * when the device has no windows): accesses of the launch's kernel to the window get hit and miss property
 * prop (cudaAccessPropertyStreaming: evict first). Safe while a stream is captured (the window is a kernel-node
 * attribute). Moves no arithmetic. */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_win(const void *base, size_t bytes, cudaAccessProperty prop, void (*k)(KArgs...),
                                        dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args &&...args) {
    static const size_t s_max = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxAccessPolicyWindowSize, dev) != cudaSuccess || v < 0)
            v = 0;
        return (size_t)v;
    }();
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (s_max > 0 && base && bytes) {
        at[n].id = cudaLaunchAttributeAccessPolicyWindow;
        at[n].val.accessPolicyWindow.base_ptr = const_cast<void *>(base);
        at[n].val.accessPolicyWindow.num_bytes = bytes < s_max ? bytes : s_max;
        at[n].val.accessPolicyWindow.hitRatio = 1.0f;
        at[n].val.accessPolicyWindow.hitProp = prop;
        at[n].val.accessPolicyWindow.missProp = prop;
        n++;
    }
    return cu_launch_attrs(at, n, 1, k, grid, block, smem, st, std::forward<Args>(args)...);
}

/* cu_launch_cl without clusters */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_opt(int allow, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t st, Args &&...args) {
    return cu_launch_cl(allow, dim3(0, 0, 0), k, grid, block, smem, st, std::forward<Args>(args)...);
}

/* cu_launch_opt with allow = 1: the form every kernel of a step uses */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    Args &&...args) {
    return cu_launch_opt(1, k, grid, block, smem, st, std::forward<Args>(args)...);
}
#endif
