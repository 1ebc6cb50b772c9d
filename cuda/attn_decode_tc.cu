/* cuda/attn_decode_tc.cu: tensor-core split-K decode attention (see attn_decode_tc.h for the contract and the
 * arithmetic; measurements in docs/cuda.md).
 *
 * Grid (blocks per row, n_kv_heads, n_seq); a block is G warps, warp w of block b computing chunks
 * (b * G + w) * lpw .. + lpw - 1 of its row. Why warps that own their chunks: the CUDA-core kernel of
 * cuda/attention.cu is partly issue-bound (its f32 dot products and conversions), and its block-wide ring needs
 * barriers; here the GQA group is the M of mma.sync (16 rows, group <= 16 of them real), so a 16-key tile costs
 * 2 * D / 8 mma and D / 8 ldmatrix per warp instead of ~16 * D * group / 32 FMAs, and each warp runs its own
 * cp.async ring (__syncwarp only).
 * The per-warp ring is NS tiles deep (NS - 1 in flight while one is computed): 24 KiB per warp for both head
 * sizes (8-9 warps per SM whatever G is), or 48 KiB in the deep form that launches of one or two sequences with
 * at most 4 warps of chunks per SM use (short contexts: each warp then needs more bytes in flight).
 * Rows g + 8 of the mma are used only for groups above 8; below, their P fragments are zero.
 * After its chunks (with lpw > 1 each chunk's partial goes through a binary counter of saved subtree partials in
 * registers, so the warp leaves its aligned subtree of lpw leaves), each warp leaves (m, l, o) for its group
 * rows in its own ring area; the block folds its G warp partials (factors per row first, then the output
 * elements: the levels of the tree unrolled in registers), then either writes o / l (the block holds every
 * non-empty chunk of the row) or, when the row has more blocks:
 *   - cluster fold (2..8 blocks per row on sm_90, the default there): the row's blocks are one thread-block
 *     cluster; each leaves its subtree partial in its own shared memory, and after a cluster barrier every
 *     block folds a slice of the output elements from all of them through distributed shared memory;
 *   - otherwise each block stores its subtree partial and counts itself on the row's arrival counter; the
 *     block that completes the count copies the row's subtree partials into shared memory and folds them the
 *     same way (up to 16 in registers, more level by level in shared memory), writes o / l, then puts the
 *     counter back to zero. Blocks whose chunks all lie past kv_len exit at once and do not count (the count
 *     awaited is the number of blocks holding a non-empty chunk, known to every block).
 * Every fold evaluates the same perfect tree with the same merge (ml_factors + ml_apply), so any G, lpw and
 * fold, and the batch, leave a row's bits unchanged.
 * Each shape rule below carries the measurement that chose it (docs/cuda.md). */
#include "attn_decode_tc.h"
#include "cu_host.h"
#include "kv_page.cuh"
#include "mma_util.cuh"
#include "pdl.cuh"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <atomic>
#include <cooperative_groups.h>

namespace {

using namespace zmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kTileKeys = 16;     /* keys per K/V tile: the k of the P V mma */
constexpr int kMaxG = 8;          /* warps per block at most (8 x 24 KiB of rings) */
constexpr int kMaxStack = 24;     /* fold stack depth: enough for 2^23 leaves */
/* the L2 prefetch of a batch-1 row's later keys (mode bit 10) serves rows of at most this many bytes of K and V in
 * a layer: 4096 keys of the 8B shape (8 KV heads of 128, 16 bits), about a third of an H100's or H200's L2 */
constexpr long kL2pfMaxBytes = 16L << 20;

/* launch-shape constants (each leaves a row's bits unchanged: every fold evaluates the same tree) */
constexpr int kWps = 8;           /* warps per SM one sequence's chunks aim to fill (16 measured no faster) */
/* deep rings (twice the stages) for launches with few warps: each warp must keep more bytes in flight */
constexpr bool kDeep = true;

/* a ring row: D elements, in the deep form at D = 64 and 16 bytes of padding. Padded rows keep the 8 rows an
 * ldmatrix reads in 8 distinct bank groups without the XOR swizzle, so every ldmatrix and copy address is the
 * lane's base plus an immediate: the swizzle's LOP3 and add per ldmatrix and per copy were ~45 of a batch-1
 * warp's ~326 instructions a tile (ncu, D = 128). Measured (H100): padding every form
 * made 1B BF16 (D = 64) M=1 1.9% faster but M=256 1.8% slower, and at D = 128 no batch-1 step faster and batches
 * of 64-256 3-6% slower; padding the deep form (small launches) at D = 64 only keeps the M=1 gain (1.9%) and
 * leaves M=64 and M=256 unchanged. The layout changes no arithmetic. */
template <int D, bool DEEP> __host__ __device__ constexpr bool tc_pad() { return D == 64 && DEEP; }
template <int D, bool DEEP> __host__ __device__ constexpr int tc_rp() { return tc_pad<D, DEEP>() ? D + 8 : D; }
/* ring depth per warp: 24 KiB for both head sizes, or twice that in the deep form (launches with few warps,
 * where each warp must keep more bytes in flight; the depth changes no arithmetic; 54 KiB padded) */
template <int D, bool DEEP> __host__ __device__ constexpr int tc_stages() {
    return (D == 64 ? 6 : 3) * (DEEP ? 2 : 1);
}
template <int D, bool DEEP> __host__ __device__ constexpr size_t ring_elems() {
    return (size_t)tc_stages<D, DEEP>() * 2 * kTileKeys * tc_rp<D, DEEP>();
}
template <typename T, int D, bool DEEP> constexpr size_t tc_smem(int G) {
    return (size_t)G * ring_elems<D, DEEP>() * sizeof(T) + 16;   /* + the last-block flag */
}

/* Merge of partial b into partial a (m: max score in log2 units, l: sum of exp2(s - m), o: sum of exp2(s - m) v),
 * in two steps so that the level-wise fold below can compute the factors once per row: ml_factors gives the
 * new max and the two scale factors and says which form applies (0: both sides, o = o_a sa + o_b sb; 1: b is an
 * identity (m = -inf, no keys): a unchanged; 2: a is an identity: b), ml_apply applies them. Explicit roundings
 * so that every caller computes the same bits whatever the compiler contracts. */
__device__ __forceinline__ int ml_factors(float ma, float mb, float &mn, float &sa, float &sb) {
    sa = sb = 0.f;
    if (mb == -INFINITY) { mn = ma; return 1; }
    if (ma == -INFINITY) { mn = mb; return 2; }
    mn = fmaxf(ma, mb);
    sa = exp2f(ma - mn);
    sb = exp2f(mb - mn);
    return 0;
}
__device__ __forceinline__ float ml_apply(int form, float a, float b, float sa, float sb) {
    return form == 1 ? a : form == 2 ? b : __fadd_rn(__fmul_rn(a, sa), __fmul_rn(b, sb));
}
__device__ __forceinline__ void ml_merge(float &m, float &l, float &o, float mb, float lb, float ob) {
    float mn, sa, sb;
    const int f = ml_factors(m, mb, mn, sa, sb);
    l = ml_apply(f, l, lb, sa, sb);
    o = ml_apply(f, o, ob, sa, sb);
    m = mn;
}

/* a lane's partial row sum added over the 4 lanes of its row group, in the same order everywhere */
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

__device__ __forceinline__ float finalize(float l, float o) { return l > 0.f ? __fdiv_rn(o, l) : 0.f; }

/* an output element: f32 into out, or rounded to the cache type into out_w (the cast kernel's rounding) */
__device__ __forceinline__ void put_out(float *o, __half *ow, long e, float v) {
    if (ow) ow[e] = __float2half_rn(v);
    else o[e] = v;
}
__device__ __forceinline__ void put_out(float *o, __nv_bfloat16 *ow, long e, float v) {
    if (ow) ow[e] = __float2bfloat16_rn(v);
    else o[e] = v;
}

/* Thread-block cluster helpers (sm_90; the host launches the cluster fold only there, so below they compile to
 * nothing): a cluster barrier whose arrival releases this block's shared-memory stores and whose wait acquires
 * the other blocks', and the address of the same shared-memory variable in block `rank` of the cluster. */
__device__ __forceinline__ void cl_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ const float *cl_peer(const float *p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(const_cast<float *>(p), rank);
#else
    (void)rank;
    return p;
#endif
}

/* a block's subtree partial for the cluster fold, after its rings and flag: m [16], l [16], o [group][D] floats */
template <typename T, int D, bool DEEP> __host__ __device__ constexpr size_t tc_export_off(int G) {
    return (size_t)G * ring_elems<D, DEEP>() * sizeof(T) + 16;
}
template <int D> constexpr size_t tc_export_bytes() { return sizeof(float) * (32 + 16 * D); }

/* Folds leaves 0..n-1 (leaf(i, m, l, o)) as the perfect binary tree over them padded with identities: a stack
 * of complete subtrees (binary counter), then the unfinished ones from the right. */
template <int DEPTH, typename F>
__device__ __forceinline__ void tree_fold(int n, F leaf, float &m, float &l, float &o) {
    float sm[DEPTH], sl[DEPTH], so[DEPTH];
    int sz[DEPTH];
    int top = 0;
    for (int i = 0; i < n; i++) {
        leaf(i, sm[top], sl[top], so[top]);
        sz[top++] = 1;
        while (top >= 2 && sz[top - 1] == sz[top - 2]) {
            ml_merge(sm[top - 2], sl[top - 2], so[top - 2], sm[top - 1], sl[top - 1], so[top - 1]);
            sz[top - 2] *= 2;
            top--;
        }
    }
    m = -INFINITY; l = 0.f; o = 0.f;
    for (int k = top - 1; k >= 0; k--) {   /* result = merge(s[k], result) */
        float mm = sm[k], ll = sl[k], oo = so[k];
        ml_merge(mm, ll, oo, m, l, o);
        m = mm; l = ll; o = oo;
    }
}

/* per-warp partial area inside the warp's ring once its chunk is done: m[16], l[16], o[16][D] floats */
template <int D> struct warp_part {
    float *m, *l, *o;
    __device__ warp_part(void *base) : m((float *)base), l(m + 16), o(m + 32) {}
};

/* qscale = scale * log2(e); chunk keys per warp; n_chunks per row; counters: the arrival counters (workspace end) */
template <typename T, int D, int G, bool DEEP, int LPW, bool PG>
__global__ void __launch_bounds__(G * 32, 1)
    decode_tc_kernel(attn_decode_params p, int group, int chunk, int n_chunks, float qscale, int *counters, int mode) {
    constexpr int lpw = LPW;   /* chunks per warp, 1 or 2: a template so that 1 carries no saved partial (registers) */
    constexpr int NS = tc_stages<D, DEEP>();
    constexpr int CH = D / 8;            /* 16-byte chunks per key row */
    constexpr int DK = D / 16;           /* k-steps of Q K^T */
    constexpr int DN = D / 8;            /* n-tiles of the O accumulator */
    constexpr bool PAD = tc_pad<D, DEEP>();   /* padded ring rows instead of the swizzle */
    constexpr int RP = tc_rp<D, DEEP>();      /* elements of a ring row */
    constexpr int TILE = kTileKeys * RP; /* elements of one K or V tile in the ring */
    static_assert(sizeof(float) * 16 * (D + 2) <= ring_elems<D, DEEP>() * sizeof(T), "partial must fit the ring");
    extern __shared__ __align__(16) unsigned char smem_raw[];

    /* grid (block, KV head, sequence) */
    const int blk = blockIdx.x, kvh = blockIdx.y;
    const int seq = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* mode bits 8-9: where the block lets the next kernel launch (tc_trig): 0 here; 1 once q is loaded, so that
     * at batch 1 the next kernel's weight stream does not meet q's load; 2 after the key loop. Blocks that
     * return early count as triggered. Moves no arithmetic. */
    const int trig = (mode >> 8) & 3;
    if (trig == 0) pdl_trigger();
    /* kv_pre: slot and kv_len are host-written inputs, read before the wait (one L2 round trip off the critical
     * path of a batch-1 layer); otherwise after it (cu_launch contract, cuda/pdl.cuh) */
    int len = 0, slot = 0;
    if (p.kv_pre) { len = p.kv_len[seq]; slot = p.slot[seq]; }
    /* early (mode bit 7, kv_early): the first ring stages whose keys all lie below len - 1 are issued before the
     * wait (written by earlier steps, attention.h); the wait then comes just before the rest of the stages */
    const bool early = p.kv_pre && ((mode >> 7) & 1);
    if (!early) pdl_wait();
    if (!p.kv_pre) { len = p.kv_len[seq]; slot = p.slot[seq]; }
    const long q_stride = p.q_stride ? p.q_stride : (long)p.n_heads * D;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    if (len > n_chunks * chunk) len = n_chunks * chunk;   /* kv_len <= max_kv_len by contract; never read past */
    const int n_valid = len > 0 ? (len + chunk - 1) / chunk : 0;   /* chunks (tree leaves) holding keys */
    const int nb_valid = (n_valid + G * lpw - 1) / (G * lpw);       /* blocks holding keys */
    float *orow = p.out + (long)seq * out_stride + (long)kvh * group * D;
    T *orow_w = p.out_w ? reinterpret_cast<T *>(p.out_w) + (long)seq * out_stride + (long)kvh * group * D : nullptr;
    /* Cluster fold (mode bit 6: the row's blocks are one thread-block cluster, at most 8, sm_90): instead of the
     * workspace, an arrival counter and a last block, each block holding keys leaves its subtree partial in its
     * own shared memory (the export area after its rings); after a cluster barrier every block of the cluster
     * folds a slice of the row's output elements from all of them through distributed shared memory: the
     * block partials as the perfect tree over 8 leaves (past nb_valid identities), merged with ml_merge as
     * the other folds merge, so the same bits. A second barrier keeps each block's shared memory alive until
     * every block has read it. Compact on purpose: each SM runs this code once per launch, from a cold
     * instruction cache (ncu, 1 x 1040: the unrolled 16-leaf fold of the last-block path stalled on
     * instruction fetch while the row's other blocks waited). Every block of the cluster, with keys or not,
     * meets both barriers. */
    const bool clu = (mode >> 6) & 1;
    float *ex = reinterpret_cast<float *>(smem_raw + tc_export_off<T, D, DEEP>(G));
    auto cl_fold = [&]() {
        cl_sync();
        if (nb_valid > 1) {
            const int ncl = gridDim.x;   /* the cluster's blocks (grid x in cluster launches) */
            for (int e = blk * G * 32 + tid; e < group * D; e += ncl * G * 32) {
                const int r = e / D;
                float vm[8], vl[8], vo[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    vm[i] = -INFINITY;
                    vl[i] = vo[i] = 0.f;
                    if (i < nb_valid) {
                        const float *px = cl_peer(ex, i);
                        vm[i] = px[r];
                        vl[i] = px[16 + r];
                        vo[i] = px[32 + e];
                    }
                }
#pragma unroll
                for (int st = 1; st < 8; st *= 2)
#pragma unroll
                    for (int i = 0; i < 8; i += 2 * st)
                        ml_merge(vm[i], vl[i], vo[i], vm[i + st], vl[i + st], vo[i + st]);
                put_out(orow, orow_w, e, finalize(vl[0], vo[0]));
            }
        }
        cl_sync();
    };
    if (blk >= nb_valid) {
        if (early) pdl_wait();   /* before any write (cuda/pdl.cuh) */
        if (blk == 0)   /* kv_len 0: zeros */
            for (int e = tid; e < group * D; e += G * 32) put_out(orow, orow_w, e, 0.f);
        if (clu) cl_fold();
        return;
    }

    T *ring = reinterpret_cast<T *>(smem_raw) + (size_t)warp * ring_elems<D, DEEP>();
    const int k0 = (blk * G + warp) * lpw * chunk;   /* the warp's lpw consecutive chunks */
    const int k1 = min(k0 + lpw * chunk, len);
    const int tpl = chunk / kTileKeys;                /* tiles per chunk: a chunk boundary is a tile boundary */
    const int ntile = k1 > k0 ? (k1 - k0 + kTileKeys - 1) / kTileKeys : 0;
    const long row_stride = (long)p.n_kv_heads * D;   /* elements between consecutive positions */
    /* paged KV: kg/vg are the pool's origin for this head; every address goes through the table (tile_off for the
     * ring's tiles, pg_row for the L2 prefetch's rows). A tile of kTileKeys keys starts at a multiple of kTileKeys
     * (chunks are multiples of it) and kv_block is a multiple of it (kv_block_log2 >= 4, checked at launch), so a
     * tile lies in one block, rows consecutive */
    /* PG: a template (launch_g picks it from p.blocks), so that contiguous caches carry no table code: with it
     * compiled in behind a runtime test, the contiguous kernel took 1.7x as long at batch 1 (H200, 1B BF16 shape,
     * 1 x 1040: 258 against 154 us of a step's critical path over its 16 layers; the step 0.977 against 0.868 ms),
     * with a few more registers and no spills either way: a batch-1 launch is bound by instruction fetch (below,
     * the prologue), and the table code makes a form's code larger (the deep 4-warp BF16 form at head size 128:
     * 107 KB without it, 121 KB with it) */
    constexpr bool paged = PG;
    const long base = paged ? (long)kvh * D : (long)slot * p.n_ctx * row_stride + (long)kvh * D;
    auto pg_row = [&](int key) -> long { return kv_page_row(p.blocks, p.kv_block_log2, slot, 0, key); };
    const T *kg = reinterpret_cast<const T *>(p.k_cache) + base;
    const T *vg = reinterpret_cast<const T *>(p.v_cache) + base;
    /* paged: lane l holds the table entry of the warp's block tw + l (a window of 32 of its blocks, relative to
     * its first, tb0) and the window after it, so that a whole tile's lookup is a shuffle instead of a load in
     * its address chain; the window after next is loaded as the warp enters the next (load() asks for tiles in
     * order, a block at most per tile: kv_block >= kTileKeys). Each window is one coalesced 128-byte load. */
    const int tb0 = k0 >> p.kv_block_log2;
    const int tbn = paged && k1 > k0 ? ((k1 - 1) >> p.kv_block_log2) - tb0 + 1 : 0;
    int tw = 0;
    int32_t tcur = 0, tnext = 0;
    if (lane < tbn) tcur = __ldg(p.blocks + slot + tb0 + lane);
    if (32 + lane < tbn) tnext = __ldg(p.blocks + slot + tb0 + 32 + lane);
    /* paged: the bytes of a cache row and of a block (ints: a row is n_kv_heads * D elements, a block at most
     * 256 rows), so that a tile's source is one wide multiply-add from its block's entry (the lean path's issue
     * is the warp's bottleneck at short context, see below) */
    const int row_bytes = (int)(row_stride * (long)sizeof(T)), blk_bytes = row_bytes << p.kv_block_log2;
    /* the byte offset from kpg (the lean path's lane origin, below) of a tile's first key (warp-uniform, tiles
     * asked for in order) */
    auto tile_off = [&](int key) -> long {
        const int bi = (key >> p.kv_block_log2) - tb0;
        if (bi >= tw + 32) {
            tw += 32;
            tcur = tnext;
            tnext = tw + 32 + lane < tbn ? __ldg(p.blocks + slot + tb0 + tw + 32 + lane) : 0;
        }
        return (long)__shfl_sync(0xffffffffu, tcur, bi - tw) * blk_bytes +
               (key & ((1 << p.kv_block_log2) - 1)) * row_bytes;
    };

    /* tile j of the chunk into ring stage j % NS (K then V), keys past k1 zero-filled; one commit group per call,
     * empty past the last tile so that the wait counts stay uniform. A tile wholly inside the chunk (all but
     * possibly the last) takes the lean path: lane copies rows lr + RPI u (u < CU) at chunk lc, its source one
     * pointer advanced by a tile per call and a row step per copy, its destinations the stage's shared address
     * plus per-copy constants (the swizzle's (row & 7) is lr | (RPI u & 7): lr < RPI). The issue of these copies
     * was half of a batch-1 warp's instructions (ncu, H100: ~262 of ~514 per tile, the warp issue-bound). */
    constexpr int RPI = 32 / CH, CU = kTileKeys * CH / 32;
    const int lr = lane / CH, lc = lane % CH;
    /* paged: the lane's first copy in pool row 0 (tile_off is relative to it) */
    const char *kpg = reinterpret_cast<const char *>(kg + (long)lr * row_stride + lc * 8);
    const uint32_t ring_sa = smem_u32(ring);
    const uint32_t dst0 = ring_sa + (uint32_t)(lr * RP * (int)sizeof(T));         /* row lr of stage 0 */
    const uint32_t dxor = PAD ? (uint32_t)(lc * 8 * (int)sizeof(T))             /* chunk lc, bytes */
                              : (uint32_t)((lc ^ lr) << 3) * (uint32_t)sizeof(T);   /* chunk lc ^ lr */
    const char *ksrc = reinterpret_cast<const char *>(kg + (long)(k0 + lr) * row_stride + lc * 8);
    const long vdelta = reinterpret_cast<const char *>(vg) - reinterpret_cast<const char *>(kg);
    const long rstep = (long)RPI * row_stride * (long)sizeof(T), tstep = (long)kTileKeys * row_stride * (long)sizeof(T);
    auto load = [&](int j) {
        if (j < ntile && k0 + (j + 1) * kTileKeys <= k1) {
            const uint32_t sb = dst0 + (uint32_t)((j % NS) * 2 * TILE * (int)sizeof(T));
            const char *src = paged ? kpg + tile_off(k0 + j * kTileKeys) : ksrc + (long)j * tstep;
#pragma unroll
            for (int u = 0; u < CU; u++) {
                /* element offset (lr + RPI u) RP + ((lc ^ (lr | k)) << 3), k = RPI u & 7; padded: + (lc << 3) */
                const uint32_t d = sb + (uint32_t)(RPI * u * RP * (int)sizeof(T)) +
                                   (PAD ? dxor : (dxor ^ (uint32_t)(((RPI * u) & 7) << 3) * (uint32_t)sizeof(T)));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + (uint32_t)(TILE * sizeof(T))),
                             "l"(src + vdelta)
                             : "memory");
                src += rstep;
            }
        } else if (j < ntile) {
            /* the chunk's last tile, keys past k1 zero-filled: its first key's row through one table lookup (a
             * tile lies in one block), the others a row apart */
            const int kt = k0 + j * kTileKeys;
            const char *t0 = paged ? reinterpret_cast<const char *>(kg) + tile_off(kt)
                                   : reinterpret_cast<const char *>(kg + (long)kt * row_stride);
            T *dk = ring + (j % NS) * 2 * TILE, *dv = dk + TILE;
#pragma unroll
            for (int i = lane; i < kTileKeys * CH; i += 32) {
                const int r = i / CH, c = i % CH;
                const bool ok = kt + r < k1;
                const char *src =
                    ok ? t0 + (long)r * row_bytes + c * 8 * (int)sizeof(T) : reinterpret_cast<const char *>(kg);
                const int e = PAD ? r * RP + c * 8 : sw<D>(r, c);
                cp_async16_zfill(dk + e, src, ok);
                cp_async16_zfill(dv + e, src + vdelta, ok);
            }
        }
        cp_async_commit();
    };
    /* The prologue's loops stay rolled: each SM runs this code once per launch from a cold instruction cache,
     * and NS - 1 inlined copies of load() each (the deep ring's 11 at head size 64) put a fetch miss on every
     * stage issued or skipped (ncu, H200, 1B BF16 shape at batch 1, cycles a warp waits per instruction issued:
     * "no instruction" 5.5 of 15.3 unrolled, 2.5 of 11.9 rolled; with block tables 11.3 of 21.4 against 1.9 of
     * 10.8; the engine's step 0.844 against 0.823 ms, with block tables of 16 rows 0.919 against 0.833). */
    int j_pre = 0;   /* stages issued before the wait (early launches): whole tiles of keys below len - 1 */
    if (early) {
#pragma unroll 1
        while (j_pre < NS - 1 && j_pre < ntile && k0 + (j_pre + 1) * kTileKeys <= len - 1) {
            load(j_pre);
            j_pre++;
        }
        /* mode bit 10 (tc_l2pf): the warp's other rows below len - 1 (written by earlier steps, like the stages
         * above) are prefetched into L2 with the evict_last policy, a row's K and V lines per lane. At batch 1
         * the key loop after the wait is a chain of dependent ring refills; when they come from DRAM they queue
         * behind the output projection's weight stream, which starts when this kernel triggers (H100, 8B Q8_0
         * M=1, globaltimer probe, the loop took 10.3 us after q with that stream and 5.4
         * without it). Only for rows whose K and V in this layer take at most kL2pfMaxBytes: longer rows'
         * prefetched lines evict each other in L2 before the ring reaches them, and those rows are read twice
         * (H200, 8B BF16 M=1: at 32k keys 5.756 ms a step with the prefetch against 4.906 without, 76.2 against
         * 89.0% of the roofline, Q4_K_M 3.972 against 3.084; at 8k 4.197 against 4.120; at 1k and 4k the same
         * either way). Moves no arithmetic. */
        if (((mode >> 10) & 1) && (long)len * row_bytes <= kL2pfMaxBytes / 2) {
            const int r1 = min(k1, len - 1);
            for (int r = k0 + j_pre * kTileKeys + lane; r < r1; r += 32) {
                const long rr = paged ? pg_row(r) : (long)r;
                const char *kr = reinterpret_cast<const char *>(kg + rr * row_stride);
                const char *vr = reinterpret_cast<const char *>(vg + rr * row_stride);
#pragma unroll
                for (int b = 0; b < D * (int)sizeof(T); b += 128) {
                    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(kr + b));
                    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(vr + b));
                }
            }
        }
        pdl_wait();
    }
#pragma unroll 1
    for (int j = j_pre; j < NS - 1; j++) load(j);

    /* Q as A fragments, straight from the f32 rows while the first tiles are in flight: a0/a2 row g, dims 2tq and
     * 2tq + 8 of each 16-dim step, a1/a3 the same for row g + 8; rows past the group are zero */
    const int g = lane >> 2, tq = lane & 3;
    const bool hi_rows = LPW != 4 && group > 8;   /* lpw 4 serves groups up to 8 only (tc_lpw) */
    uint32_t qf[DK][4];
    {
        const float *q0 = p.q + (long)seq * q_stride + (long)kvh * group * D;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = g + 8 * h;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
                float2 x = make_float2(0.f, 0.f), y = make_float2(0.f, 0.f);
                if (r < group) {
                    x = *reinterpret_cast<const float2 *>(q0 + (long)r * D + 16 * kk + 2 * tq);
                    y = *reinterpret_cast<const float2 *>(q0 + (long)r * D + 16 * kk + 8 + 2 * tq);
                }
                qf[kk][h] = tc_type<T>::pack(x.x * qscale, x.y * qscale);
                qf[kk][2 + h] = tc_type<T>::pack(y.x * qscale, y.y * qscale);
            }
        }
    }

    if (trig == 1) pdl_trigger();
    float o[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    /* ldmatrix addresses: K's row (lane & 7) + 8 (lane >> 4) at chunk 2 kk + ((lane >> 3) & 1), V's row
     * (lane & 7) + 8 ((lane >> 3) & 1) at chunk 2 dp + (lane >> 4), both swizzled by x = lane & 7. With the
     * chunk 2 s + b: ((2 s + b) ^ x) << 3 = ((b ^ (x & 1)) << 3) + ((16 s) ^ ((x & 6) << 3)), so a lane's address
     * for step s is its constant plus ((32 s) ^ lx) bytes. Padded rows (no swizzle): plus 32 s bytes (lx 0). */
    const uint32_t lx = PAD ? 0u : (uint32_t)(lane & 6) << 4;
    const int xk = PAD ? 0 : (lane & 1);   /* the swizzle's low bit */
    const uint32_t ka = ring_sa + (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * RP + ((((lane >> 3) & 1) ^ xk) << 3)) *
                                             (int)sizeof(T));
    const uint32_t va = ring_sa + (uint32_t)(TILE * sizeof(T)) +
                        (uint32_t)((((lane & 7) + (((lane >> 3) & 1) << 3)) * RP + (((lane >> 4) ^ xk) << 3)) *
                                   (int)sizeof(T));
    auto ldsm4 = [](uint32_t (&r)[4], uint32_t a) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    };
    auto ldsm4t = [](uint32_t (&r)[4], uint32_t a) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    };

    /* S = Q K^T for the tile in ring stage st: ldmatrix x4 gives the B fragments of key n-tiles 0 and 1 for one
     * 16-dim step; even and odd steps accumulate apart and are added at the end (4 independent mma chains instead
     * of 2: a warp alone on its SM, as in batch-1 decode, is bound by this chain's latency) */
    auto qk = [&](int st, float (&s)[2][4]) {
        const uint32_t kb = ka + (uint32_t)(st * 2 * TILE * (int)sizeof(T));
        float s2[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = s2[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            uint32_t b[4];
            ldsm4(b, kb + ((uint32_t)(32 * kk) ^ lx));
            tc_type<T>::mma((kk & 1) ? s2[0] : s[0], qf[kk], b[0], b[1]);
            tc_type<T>::mma((kk & 1) ? s2[1] : s[1], qf[kk], b[2], b[3]);
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] += s2[n][e];
    };
    /* tile j's scores s (from qk) into the running state: mask, online softmax, O += P V with V from stage st */
    auto softmax_pv = [&](int j, int st, float (&s)[2][4]) {
        const uint32_t vb = va + (uint32_t)(st * 2 * TILE * (int)sizeof(T));
        const int kt = k0 + j * kTileKeys;
        if (kt + kTileKeys > k1) {   /* the chunk's last tile: keys past k1 (zero-filled) take no weight */
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (kt + n * 8 + 2 * tq + (e & 1) >= k1) s[n][e] = -INFINITY;
        }
        /* online softmax for rows g (elements 0, 1) and g + 8 (2, 3); a row's 16 scores lie in its 4 lanes */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h == 1 && !hi_rows) break;
            float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m[h], mx);   /* finite: every tile holds at least one key */
            const float alpha = exp2f(m[h] - mnew);
            m[h] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < 2; n++) {
                s[n][2 * h] = exp2f(s[n][2 * h] - mnew);
                s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - mnew);
                sum += s[n][2 * h] + s[n][2 * h + 1];
            }
            l[h] = l[h] * alpha + sum;   /* this lane's part; summed over the 4 lanes at the end */
            /* o *= alpha, skipped when no row's max moved (alpha exactly 1: the product would be o itself) */
            if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
                for (int n = 0; n < DN; n++) {
                    o[n][2 * h] *= alpha;
                    o[n][2 * h + 1] *= alpha;
                }
            }
        }
        /* O += P V: the S accumulators of key n-tiles 0 and 1 are the A fragment of one 16-key step */
        uint32_t a[4];
        a[0] = tc_type<T>::pack(s[0][0], s[0][1]);
        a[1] = hi_rows ? tc_type<T>::pack(s[0][2], s[0][3]) : 0u;
        a[2] = tc_type<T>::pack(s[1][0], s[1][1]);
        a[3] = hi_rows ? tc_type<T>::pack(s[1][2], s[1][3]) : 0u;
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            ldsm4t(b, vb + ((uint32_t)(32 * dp) ^ lx));
            tc_type<T>::mma(o[2 * dp], a, b[0], b[1]);
            tc_type<T>::mma(o[2 * dp + 1], a, b[2], b[3]);
        }
    };
    /* (Measured and not kept: in the deep form, S of tile j + 1 computed before the softmax and P V of tile j
     * so that two tiles' chains overlap: batch 1 at 1k-4k 5-7% slower.) */
    /* A warp with lpw > 1 chunks keeps each one a leaf of the tree: at a chunk boundary the finished leaf's
     * partial (m, l summed over the quad as at the end, o) goes through a binary counter of saved subtree
     * partials in registers. Level k holds the left sibling of the subtree the running partial completes: a
     * set bit k of the leaf's index merges level k (left) with it, the first clear bit stores it there. lpw 4
     * keeps two levels of rows g only (the host runs it for groups up to 8: rows g + 8 are padding). */
    constexpr int NSV = LPW == 4 ? 2 : LPW == 2 ? 1 : 0;   /* saved levels */
    constexpr int NSA = NSV > 0 ? NSV : 1;
    constexpr int SH = LPW == 4 ? 1 : 2;                    /* row halves merged: g, and g + 8 (lpw <= 2) */
    float so[NSA][NSV > 0 ? DN : 1][2 * SH], sm[NSA][SH], sl[NSA][SH];
#pragma unroll
    for (int k = 0; k < NSA; k++)   /* identities (every level is stored before it is read) */
#pragma unroll
        for (int h = 0; h < SH; h++) {
            sm[k][h] = -INFINITY;
            sl[k][h] = 0.f;
#pragma unroll
            for (int n = 0; n < (NSV > 0 ? DN : 1); n++) so[k][n][2 * h] = so[k][n][2 * h + 1] = 0.f;
        }
    int leaf = 0;        /* this warp's leaves finished */
    int jb = tpl;        /* the tile that starts the next leaf */
    /* level k (left) merged with the running partial (m, lq, o) into the running partial, rows half h */
    auto carry = [&](int k, int h, float &lq) {
        float mn, sa, sb;
        h = h < SH ? h : 0;   /* callers pass h < SH only */
        const int f = ml_factors(sm[k][h], m[h], mn, sa, sb);
        lq = ml_apply(f, sl[k][h], lq, sa, sb);
#pragma unroll
        for (int n = 0; n < (NSV > 0 ? DN : 0); n++) {
            o[n][2 * h] = ml_apply(f, so[k][n][2 * h], o[n][2 * h], sa, sb);
            o[n][2 * h + 1] = ml_apply(f, so[k][n][2 * h + 1], o[n][2 * h + 1], sa, sb);
        }
        m[h] = mn;
    };
    for (int j = 0; j < ntile; j++) {
        cp_async_wait<NS - 2>();   /* this lane's copies of tile j have landed */
        __syncwarp();              /* ... and every lane's; stage (j - 1) % NS is no longer read */
        load(j + NS - 1);
        if (LPW > 1 && j == jb) {   /* a new chunk begins: leaf `leaf` is complete */
            jb += tpl;
#pragma unroll
            for (int h = 0; h < SH; h++) {
                float lq = quad_sum(l[h]);
                bool stored = false;
#pragma unroll
                for (int k = 0; k < NSV; k++) {
                    if (stored) continue;
                    if ((leaf >> k) & 1) {
                        carry(k, h, lq);
                    } else {
                        sm[k][h] = m[h];
                        sl[k][h] = lq;
#pragma unroll
                        for (int n = 0; n < (NSV > 0 ? DN : 0); n++) {
                            so[k][n][2 * h] = o[n][2 * h];
                            so[k][n][2 * h + 1] = o[n][2 * h + 1];
                        }
                        stored = true;
                    }
                }
            }
            leaf++;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                m[h] = -INFINITY;
                l[h] = 0.f;
            }
#pragma unroll
            for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        }
        float s[2][4];
        qk(j % NS, s);
        softmax_pv(j, j % NS, s);
    }
    cp_async_wait<0>();
    __syncwarp();   /* every lane is done with the ring: it now holds the warp's partial */
    if (trig == 2) pdl_trigger();

    {
        warp_part<D> wp(ring);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = quad_sum(l[h]);
            if (ntile == 0) m[h] = -INFINITY;
            /* the last leaf closes the warp's subtree: leaves past it are identities, so each saved level
             * whose bit is set in the last leaf's index is its left sibling at that level (lpw 4: rows g) */
            if (h < SH)
#pragma unroll
                for (int k = 0; k < NSV; k++)
                    if ((leaf >> k) & 1) carry(k, h, sum);
            const float mh = m[h];
            const int r = g + 8 * h;
            if (r >= group) continue;
            if (tq == 0) {
                wp.m[r] = mh;
                wp.l[r] = sum;
            }
#pragma unroll
            for (int n = 0; n < DN; n++)
                *reinterpret_cast<float2 *>(wp.o + r * D + n * 8 + 2 * tq) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
        }
    }
    __syncthreads();

    /* the block's subtree: one thread per (group row, dim) */
    const int n_elem = group * D;
    const int nblk = gridDim.x;
    const long row_id = (long)seq * p.n_kv_heads + kvh;
    float *ws_o = reinterpret_cast<float *>(p.workspace);                     /* [rows][nblk][group][D] */
    float *ws_m = ws_o + (long)gridDim.z * p.n_kv_heads * nblk * n_elem;      /* [rows][nblk][group] */
    float *ws_l = ws_m + (long)gridDim.z * p.n_kv_heads * nblk * group;       /* [rows][nblk][group] */
    const size_t wstride = ring_elems<D, DEEP>() * sizeof(T);               /* bytes between warp areas */
    /* The G warp partials fold as the tree's levels in registers, in two steps: one thread per row folds m and l
     * and keeps each node's factors (scale factors and form: they depend on the row only), then every thread
     * folds its output elements with them (~3 mul/add per node instead of a whole merge; folding each element
     * with full merges through a stack cost 6-7 us per wave, measured). The same merges as ml_merge, so the
     * same bits. Warp w's area holds m [16], l [16], o [16][D]; warp 0's area then the factors: sa, sb, form
     * [G - 1 nodes][16], the row's final m and l [16] each. Node of level st for the pair (i, i + st): G - G / st
     * + i / (2 st). */
    {
        constexpr int kF = 32 + 16 * D;
        static_assert(sizeof(float) * (kF + 3 * 16 * kMaxG + 32) <= ring_elems<D, DEEP>() * sizeof(T),
                      "factors must fit the area");
        const int wsf = (int)(wstride / sizeof(float));
        float *pm = reinterpret_cast<float *>(smem_raw);
        float *fa = pm + kF, *fb = fa + 16 * (G - 1), *fm = fb + 16 * (G - 1) + 16 * (G - 1), *fl = fm + 16;
        int *ff = reinterpret_cast<int *>(fb + 16 * (G - 1));
        if (tid < group) {
            const int r = tid;
            float vm[G], vl[G];
#pragma unroll
            for (int i = 0; i < G; i++) {
                vm[i] = pm[i * wsf + r];
                vl[i] = pm[i * wsf + 16 + r];
            }
#pragma unroll
            for (int st = 1; st < G; st *= 2)
#pragma unroll
                for (int i = 0; i < G; i += 2 * st) {
                    const int node = G - G / st + i / (2 * st);
                    float mn, sa, sb;
                    const int f = ml_factors(vm[i], vm[i + st], mn, sa, sb);
                    vl[i] = ml_apply(f, vl[i], vl[i + st], sa, sb);
                    vm[i] = mn;
                    fa[node * 16 + r] = sa;
                    fb[node * 16 + r] = sb;
                    ff[node * 16 + r] = f;
                }
            fm[r] = vm[0];
            fl[r] = vl[0];
        }
        __syncthreads();
        for (int e = tid; e < n_elem; e += G * 32) {
            const int r = e / D;
            float vo[G];
#pragma unroll
            for (int i = 0; i < G; i++) vo[i] = pm[i * wsf + 32 + e];
#pragma unroll
            for (int st = 1; st < G; st *= 2)
#pragma unroll
                for (int i = 0; i < G; i += 2 * st) {
                    const int q = (G - G / st + i / (2 * st)) * 16 + r;
                    vo[i] = ml_apply(ff[q], vo[i], vo[i + st], fa[q], fb[q]);
                }
            if (nb_valid == 1) {
                put_out(orow, orow_w, e, finalize(fl[r], vo[0]));
            } else if (clu) {   /* the export area, for the cluster fold */
                ex[32 + e] = vo[0];
                if (e % D == 0) {
                    ex[r] = fm[r];
                    ex[16 + r] = fl[r];
                }
            } else {
                const long pi = row_id * nblk + blk;
                ws_o[pi * n_elem + e] = vo[0];
                if (e % D == 0) {
                    ws_m[pi * group + r] = fm[r];
                    ws_l[pi * group + r] = fl[r];
                }
            }
        }
    }
    if (clu) {
        cl_fold();
        return;
    }
    if (nb_valid == 1) return;

    /* arrival: the block that completes the row's count folds the subtree partials (classic last-block pattern:
     * the barrier orders the block's stores before thread 0's fence and atomic) */
    int *flag = reinterpret_cast<int *>(smem_raw + G * wstride);
    __syncthreads();
    if (tid == 0) {
        int prev;
        /* release of the block's stores (ordered before by the barrier), acquire of the others' */
        asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;\n" : "=r"(prev) : "l"(counters + row_id) : "memory");
        *flag = prev == nb_valid - 1;
    }
    __syncthreads();
    if (!*flag) return;
    /* The row's subtree partials are first copied into shared memory (the rings are free now) with every load
     * of a pass in flight at once, then folded from there: folding straight from global memory leaves one
     * dependent L2 round trip per leaf on the critical path (measured: 1 x 64k at 53% of the read bandwidth).
     * Layout: m [nb_valid][group], l [nb_valid][group], then o [nb_valid][eb] for a slice of eb elements. */
    const long pi0 = row_id * nblk;
    const int cap = (int)(G * wstride / sizeof(float));
    const int nml = nb_valid * group;
    const int o_off = (7 * nml + 47 * group + 3) & ~3;   /* o starts 16-byte aligned, after m, l, the level
                                                            factors and the 16-leaf factors */
    int eb = ((cap - o_off) / nb_valid) & ~3;      /* a multiple of 4, like n_elem: float4 copies */
    if (eb > n_elem) eb = n_elem;
    if (eb >= 4) {
        /* m, l as loaded; wm, wl the working copies one slice's tree levels update; fa, fb, ff one level's merge
         * factors and forms per (left leaf, row) */
        float *sm_m = reinterpret_cast<float *>(smem_raw), *sm_l = sm_m + nml, *wm = sm_l + nml, *wl = wm + nml;
        float *fa = wl + nml, *fb = fa + nml;
        int *ff = reinterpret_cast<int *>(fb + nml);
        float *sm_o = sm_m + o_off;
        /* the first G * 32 m and l values stay in registers until the first o loads are issued too: one L2
         * round trip for both instead of two on this block's critical path */
        float mv = 0.f, lv = 0.f;
        if (tid < nml) {
            mv = __ldcg(ws_m + pi0 * group + tid);
            lv = __ldcg(ws_l + pi0 * group + tid);
        }
        for (int i = tid + G * 32; i < nml; i += G * 32) {
            sm_m[i] = __ldcg(ws_m + pi0 * group + i);
            sm_l[i] = __ldcg(ws_l + pi0 * group + i);
        }
        for (int e0 = 0; e0 < n_elem; e0 += eb) {
            const int w = min(eb, n_elem - e0), w4 = w / 4;
            /* 8 loads per thread in flight before any store (a load-store loop left one L2 round trip per
             * iteration on the critical path: ~7 us for 16 leaves of 2 KB, measured) */
            const int n4 = nb_valid * w4;
            for (int b0 = 0; b0 < n4; b0 += 8 * G * 32) {
                float4 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = b0 + u * G * 32 + tid;
                    if (i < n4) {
                        const int leaf = i / w4, x4 = i - leaf * w4;
                        v[u] = __ldcg(reinterpret_cast<const float4 *>(ws_o + (pi0 + leaf) * n_elem + e0) + x4);
                    }
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = b0 + u * G * 32 + tid;
                    if (i < n4) reinterpret_cast<float4 *>(sm_o)[i] = v[u];
                }
            }
            if (e0 == 0 && tid < nml) {
                sm_m[tid] = mv;
                sm_l[tid] = lv;
            }
            for (int i = tid; i < nml; i += G * 32) {
                wm[i] = sm_m[i];
                wl[i] = sm_l[i];
            }
            __syncthreads();
            if (nb_valid <= 16) {
                /* up to 16 leaves: the factor-first fold of the in-block step over 16 leaves (leaves past nb_valid
                 * are identities: the same tree, the same bits); factors in tf [15 nodes][group] x 3, then the
                 * row's m and l */
                float *ta = sm_m + 7 * nml, *tb = ta + 15 * group, *tm = tb + 30 * group, *tl = tm + group;
                int *tfm = reinterpret_cast<int *>(tb + 15 * group);
                if (tid < group) {
                    const int r = tid;
                    float vm[16], vl[16];
#pragma unroll
                    for (int i = 0; i < 16; i++) {
                        vm[i] = i < nb_valid ? sm_m[i * group + r] : -INFINITY;
                        vl[i] = i < nb_valid ? sm_l[i * group + r] : 0.f;
                    }
#pragma unroll
                    for (int st = 1; st < 16; st *= 2)
#pragma unroll
                        for (int i = 0; i < 16; i += 2 * st) {
                            const int q = (16 - 16 / st + i / (2 * st)) * group + r;
                            float mn, sa, sb;
                            const int f = ml_factors(vm[i], vm[i + st], mn, sa, sb);
                            vl[i] = ml_apply(f, vl[i], vl[i + st], sa, sb);
                            vm[i] = mn;
                            ta[q] = sa; tb[q] = sb; tfm[q] = f;
                        }
                    tm[r] = vm[0];
                    tl[r] = vl[0];
                }
                __syncthreads();
                for (int x = tid; x < w; x += G * 32) {
                    const int r = (e0 + x) / D;
                    float vo[16];
#pragma unroll
                    for (int i = 0; i < 16; i++) vo[i] = i < nb_valid ? sm_o[i * w + x] : 0.f;
#pragma unroll
                    for (int st = 1; st < 16; st *= 2)
#pragma unroll
                        for (int i = 0; i < 16; i += 2 * st) {
                            const int q = (16 - 16 / st + i / (2 * st)) * group + r;
                            vo[i] = ml_apply(tfm[q], vo[i], vo[i + st], ta[q], tb[q]);
                        }
                    put_out(orow, orow_w, e0 + x, finalize(tl[r], vo[0]));
                }
                __syncthreads();
                continue;
            }
            /* the perfect tree level by level, every merge of a level in parallel (one dependent chain per element
             * cost ~5 us at 16 leaves); the same merges as tree_fold, so the same bits. Per level: the factors,
             * m and l per (pair, row), then the outputs. */
            for (int st = 1; st < nb_valid; st *= 2) {
                const int npair = (nb_valid - st + 2 * st - 1) / (2 * st);   /* i = 2 st k with i + st < nb_valid */
                for (int t = tid; t < npair * group; t += G * 32) {
                    const int k = t / group, r = t - k * group, q = 2 * st * k * group + r, qj = q + st * group;
                    float mn, sa, sb;
                    const int f = ml_factors(wm[q], wm[qj], mn, sa, sb);
                    wl[q] = ml_apply(f, wl[q], wl[qj], sa, sb);
                    wm[q] = mn;
                    fa[q] = sa; fb[q] = sb; ff[q] = f;
                }
                __syncthreads();
                for (int k = 0; k < npair; k++) {
                    const int i = 2 * st * k, j = i + st;
                    for (int x = tid; x < w; x += G * 32) {
                        const int q = i * group + (e0 + x) / D;
                        sm_o[i * w + x] = ml_apply(ff[q], sm_o[i * w + x], sm_o[j * w + x], fa[q], fb[q]);
                    }
                }
                __syncthreads();
            }
            for (int x = tid; x < w; x += G * 32) put_out(orow, orow_w, e0 + x, finalize(wl[(e0 + x) / D], sm_o[x]));
            __syncthreads();
        }
    } else {   /* more partials than shared memory holds (forced split counts only): fold from global memory */
        for (int e = tid; e < n_elem; e += G * 32) {
            const int r = e / D;
            float bm, bl, bo;
            tree_fold<kMaxStack>(nb_valid, [&](int i, float &mm, float &ll, float &oo) {
                const long pi = pi0 + i;
                mm = __ldcg(ws_m + pi * group + r);
                ll = __ldcg(ws_l + pi * group + r);
                oo = __ldcg(ws_o + pi * n_elem + e);
            }, bm, bl, bo);
            put_out(orow, orow_w, e, finalize(bl, bo));
        }
    }
    if (tid == 0) counters[row_id] = 0;   /* every block of the row has counted: ready for the next launch */
}

bool served(const attn_decode_params *p) {
    if (!p || p->n_kv_heads < 1 || p->n_heads < 1 || p->n_heads % p->n_kv_heads) return false;
    return (p->kv_type == ATTN_KV_F16 || p->kv_type == ATTN_KV_BF16) && (p->head_dim == 64 || p->head_dim == 128) &&
           p->n_heads / p->n_kv_heads <= 16;
}

/* chunk keys from max_kv_len, the SM count and n_kv_heads (or a forced n_splits): one sequence's chunks make
 * wps warps for each of the floor(sm / n_kv_heads) SMs a KV head gets (so that at G = 8 its blocks fit one
 * wave), each chunk at least chunk_min keys; a multiple of kTileKeys */
/* most chunks (tree leaves) per row: two per warp (one from 64k keys) for the warps a KV head gets when one
 * sequence fills floor(SMs / KV heads) SMs with wps warps each */
long tc_target_short(const attn_decode_params *p) {   /* below 64k keys; the larger of the two targets */
    long per_head = cu_sm_count(p->sm_count) / p->n_kv_heads;
    if (per_head < 1) per_head = 1;
    return 2 * per_head * kWps;
}
long tc_target(const attn_decode_params *p) {
    /* from 64k keys, one chunk per warp: there 256-key chunks two per warp read 83.6% at batch 1 against 85.4%
     * for 512-key chunks one per warp (H100) */
    return p->max_kv_len >= 65536 ? tc_target_short(p) / 2 : tc_target_short(p);
}
/* fewest keys per chunk (a function of the head size and max_kv_len only, like the whole tree): 128 at head size
 * 128 up to 2048 keys, 256 otherwise. H100, 8B models at n_ctx 1040: 8
 * leaves of 144 keys in one 8-warp block per row against 4 of 272 keys in one 4-warp block made Q4_K_M M=1 1.8%
 * and M=4 3.8% faster, Q8_0 M=1 1.0% and BF16 M=1 0.5%, BF16 M=64 1.4% slower; at head size 64 (1B) and
 * from 4k keys (1 x 16384 35.4 against 31.4 us) 256 stays. */
constexpr long kFloorShortMax = 2048;
long tc_floor_at(int head_dim, long max_kv_len) {   /* never falls as max_kv_len grows */
    return head_dim == 128 && max_kv_len <= kFloorShortMax ? 128 : 256;
}
int tc_chunk_with(const attn_decode_params *p, long floor);
/* the small leaf floor, at both head sizes up to kFloorShortMax keys: an engine whose fullest batch of 32-key
 * leaves still fits one wave takes them (H100, 8B at n_ctx 1040: 22 leaves of 48 keys a row against 8 of 144
 * made batch-1 steps 2-3% faster (the warp's serial chain of tiles is shorter) and batch 4 2-3%; past a wave
 * they cost: batch 16 2%, 64 5%, 256 3% slower. H200, 1B BF16 at n_ctx 1040: 22 leaves against 4 of 272 keys
 * gave batch-1 steps the same time and batch 4 2.9% more tokens/s) */
constexpr long kFloorSmall = 32;
long tc_floor(const attn_decode_params *p) {
    const long f = tc_floor_at(p->head_dim, p->max_kv_len);
    if (p->max_kv_len > kFloorShortMax || p->max_seq < 1) return f;
    const long L = p->max_kv_len > 0 ? p->max_kv_len : 1;
    const long c = tc_chunk_with(p, kFloorSmall), leaves = (L + c - 1) / c;
    return (long)p->max_seq * p->n_kv_heads * leaves <= (long)cu_sm_count(p->sm_count) * kWps ? kFloorSmall
                                                                                                      : f;
}
int tc_chunk(const attn_decode_params *p) {
    return tc_chunk_with(p, p->n_splits > 0 ? 0 : tc_floor(p));
}
/* chunk keys: from a forced n_splits, or at least `floor` keys (see below) */
int tc_chunk_with(const attn_decode_params *p, long floor) {
    const long L = p->max_kv_len > 0 ? p->max_kv_len : 1;
    long c;
    if (p->n_splits > 0) {
        c = (L + p->n_splits - 1) / p->n_splits;
    } else {
        /* at least floor keys per chunk, at most the target's count; the count a power of two up to 16,
         * else a multiple of 16: whole blocks of 8 warps x 2 chunks (at L = n_ctx = 1040 a fifth chunk of 16 keys
         * would hold a block of idle warps' rings per row) */
        long n = L / floor;
        const long target = tc_target(p);
        if (n > target) n = target;
        if (n < 1) n = 1;
        if (n <= 16) { while (n & (n - 1)) n &= n - 1; }
        else n -= n % 16;
        c = (L + n - 1) / n;
    }
    c = (c + kTileKeys - 1) / kTileKeys * kTileKeys;
    return (int)c;
}

int tc_chunks_of(const attn_decode_params *p, int chunk) {
    const long L = p->max_kv_len > 0 ? p->max_kv_len : 1;
    return (int)((L + chunk - 1) / chunk);
}

/* chunks per warp: tc_lpw or the knob (4 becomes 2 for GQA groups above 8: lpw 4 keeps rows g only), else:
 *   - launches whose chunks fit one wave of wps warps per SM (batch 1 among them): one chunk a warp (more
 *     warps), except 2 at head size 128 where the chunks are long (256 keys) and 2 a warp bring the launch
 *     from more than 4 warps per SM to at most 4;
 *   - past a wave: at head size 128 the fewest (2, then 4, or 2 for groups above 8) that bring the launch's
 *     warps back within one wave; failing that (and at head size 64), 1 unless a row has more chunks than one
 *     block of 8 warps holds, then as many as make a warp's keys at least kWarpKeys (at most 2 for groups above
 *     8, else 4).
 * Why: the rings hold an SM to about wps warps whatever the block size, and a block of 8 warps fills its shared
 * memory alone, so in a launch of a few waves each block's start (its first tiles' latency) and its fold leave
 * the SM's reads idle, while one wave of fewer, longer warps in smaller blocks overlaps them with other blocks'
 * reads; long streams also amortise a warp's start and its merges. H200, 8B BF16 shape, zllm-bench tokens/s
 * against one chunk a warp below a wave and 2 for 256-key rows (512 keys a warp): context 1024, M=64 (4 a
 * warp) +2.0%, M=32 (2) +0.7%; context 32768, M=1 (2) +1.4%; context 16384, M=16 (4) +3.9%; context 4096,
 * M=64 (4) unchanged. Launches of many waves with rows of at most 8 chunks gain nothing from longer warps
 * (context 1024, M=128 and 256 at 4 a warp: 1.4-1.9% fewer tokens/s), so they keep one. Those figures come
 * from the kernel with the table code in its contiguous form (PG below); without it, against the rule before
 * (one chunk a warp in a wave, 512 keys a warp past it; one run each): context 1024 M=64 +0.3%, context 16384
 * M=16 +3.0%, context 32768 M=1 -0.1%. */
constexpr int kWarpKeys = 1024;
int tc_lpw(const attn_decode_params *p, int chunk, int n_chunks) {
    const int lmax = p->n_heads / p->n_kv_heads > 8 ? 2 : 4;
    const int f = p->tc_lpw;
    if (f == 1 || f == 2 || f == 4) return f < lmax ? f : lmax;
    if (n_chunks < 2) return 1;
    const long rows = (long)p->n_seq * p->n_kv_heads, sm = cu_sm_count(p->sm_count), wave = sm * kWps;
    /* the launch's warps at l chunks a warp */
    auto warps = [&](int l) { return rows * ((n_chunks + l - 1) / l); };
    /* the in-wave pair and the past-wave rule at head size 128 only: at head size 64 (H200, 1B BF16 shape,
     * zllm-bench tokens/s against one chunk a warp) they made context 32768 M=1 (2 a warp) 3.5% and context
     * 1024 M=128 (4) 2.7% slower, M=64 (2) the same. The 1024 keys a warp past a wave hold at both: context
     * 16384 M=16 at head size 64 5.4% faster than with 512 (4 a warp against 2) */
    const bool wide = p->head_dim == 128;
    if (warps(1) <= wave) return wide && chunk >= 256 && warps(1) > sm * 4 && warps(2) <= sm * 4 ? 2 : 1;
    for (int l = 2; wide && l <= lmax && l <= n_chunks; l *= 2)
        if (warps(l) <= wave) return l;
    if (n_chunks <= kMaxG) return 1;
    int l = 2;
    while (l < lmax && (long)l * chunk < kWarpKeys) l *= 2;
    return l;
}

/* warps per block: tc_group, the knob, or the smallest power of two covering the row's warps, at most g_max
 * (forced values are capped at g_max too: the deep form holds at most 4 rings per block) */
int tc_group_size(const attn_decode_params *p, int n_warps, int g_max) {
    int g = p->tc_group;
    if (g == 1 || g == 2 || g == 4 || g == 8) return g < g_max ? g : g_max;
    g = 1;
    while (g < n_warps && g < g_max) g *= 2;
    return g;
}

/* 1 when launches for p may fold rows through thread-block clusters (the cluster fold of decode_tc_kernel):
 * compute capability 9.0 or later, cu_settings.attn_cluster not 0 and tc_cluster not -1. Either fold gives the
 * same bits. */
bool tc_cluster_on(const attn_decode_params *p) {
    static int s_state[64];
    if (p->tc_cluster < 0) return false;
    return cu_device_switch(s_state, 9, 1 << 30, cu_settings_get()->attn_cluster) != 0;
}
/* 1 when a row of nblk blocks folds through one cluster: 2..8 blocks (the portable cluster size) */
bool tc_cluster(const attn_decode_params *p, int nblk) { return nblk >= 2 && nblk <= 8 && tc_cluster_on(p); }

/* whether the early stream also prefetches a warp's later keys into L2 (mode bit 10): at batch 1 (H100, same
 * call, 8B Q8_0 M=1 3.448-3.455 ms against 3.471-3.474 without, Q4_K_M 2.653-2.654
 * against 2.662-2.666; in every small launch it made M=4 and M=8 2.5% slower, Qwen2.5-1.5B M=16 2.4%, and in
 * every launch 8B BF16 M=64 11%); rows of more than kL2pfMaxBytes skip it in the kernel */
bool tc_l2pf(const attn_decode_params *p) { return p->kv_early && p->n_seq == 1; }

/* where a block lets the next kernel launch: after its q loads at batch 1 (8B Q4_K_M M=1 1.1% faster: the output
 * projection's weight stream no longer meets q's load), at its start otherwise (after q at batch 4 made Q8_0 1.5%
 * slower; after the key loop was slower everywhere) */
int tc_trig(const attn_decode_params *p) { return p->n_seq == 1 ? 1 : 0; }

size_t ws_counter_bytes(const attn_decode_params *p) { return (size_t)p->n_seq * p->n_heads * sizeof(int); }

template <typename T, int D, int G, bool DEEP, int LPW, bool PG>
cudaError_t launch_gp(const attn_decode_params *p, int chunk, int n_chunks, cudaStream_t st) {
    constexpr int lpw = LPW;
    constexpr size_t smem = tc_smem<T, D, DEEP>(G);
    constexpr size_t smem_cl = tc_export_off<T, D, DEEP>(G) + tc_export_bytes<D>();   /* the cluster fold's */
    static_assert(smem_cl <= 227 * 1024, "a block's rings must fit the shared memory of one SM");
    static std::atomic<unsigned long long> s_set{0};   /* devices whose attributes are set (bit per device) */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(s_set.load(std::memory_order_relaxed) & bit)) {
        /* function attributes, not stream operations: allowed while the stream is being captured */
        cudaError_t e = cudaFuncSetAttribute(decode_tc_kernel<T, D, G, DEEP, LPW, PG>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_cl);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(decode_tc_kernel<T, D, G, DEEP, LPW, PG>,
                                     cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        if (e != cudaSuccess) return e;
        s_set.fetch_or(bit, std::memory_order_relaxed);
    }
    const int group = p->n_heads / p->n_kv_heads;
    const int nblk = (n_chunks + G * lpw - 1) / (G * lpw);
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    const bool clu = tc_cluster(p, nblk);
    int *counters = nullptr;
    if (nblk > 1 && !clu) {
        const size_t need = (size_t)p->n_seq * p->n_kv_heads * nblk * group * (D + 2) * sizeof(float) +
                            ws_counter_bytes(p);
        if (!p->workspace || p->workspace_bytes < need) return cudaErrorInvalidValue;
        counters = reinterpret_cast<int *>(static_cast<char *>(p->workspace) + p->workspace_bytes -
                                           ws_counter_bytes(p));
    }
    const int mode = (clu ? 64 : 0) | (p->kv_early ? 128 : 0) | (tc_l2pf(p) ? 1024 : 0) | (tc_trig(p) << 8);
    if (clu)   /* one cluster per row: grid x is the row's blocks (tc_cluster) */
        return cu_launch_cl(1, dim3((unsigned)nblk, 1, 1), decode_tc_kernel<T, D, G, DEEP, LPW, PG>,
                            dim3((unsigned)nblk, (unsigned)p->n_kv_heads, (unsigned)p->n_seq), dim3(G * 32), smem_cl,
                            st, *p, group, chunk, n_chunks, scale * kLog2e, counters, mode);
    const dim3 grid((unsigned)nblk, (unsigned)p->n_kv_heads, (unsigned)p->n_seq);
    return cu_launch_opt(1, decode_tc_kernel<T, D, G, DEEP, LPW, PG>, grid, dim3(G * 32), smem, st, *p, group, chunk,
                         n_chunks, scale * kLog2e, counters, mode);
}

/* the launch of one form, with or without block tables (PG) */
template <typename T, int D, int G, bool DEEP, int LPW>
cudaError_t launch_g(const attn_decode_params *p, int chunk, int n_chunks, cudaStream_t st) {
    return p->blocks ? launch_gp<T, D, G, DEEP, LPW, true>(p, chunk, n_chunks, st)
                     : launch_gp<T, D, G, DEEP, LPW, false>(p, chunk, n_chunks, st);
}

/* The form follows the launch (none of it changes a row's bits): for rows of at most 2 sequences with at most 4
 * warps of chunks per SM in the whole launch, deep rings (more bytes in flight per warp) and at most 4 warps per
 * block, 1 when there are no more warps than SMs (one warp per SM); otherwise 24 KiB rings and up to g_max (8) warps
 * per block. */
template <typename T, int D, int LPW>
cudaError_t launch_l(const attn_decode_params *p, int chunk, int n_chunks, cudaStream_t st) {
    const int row_warps = (n_chunks + LPW - 1) / LPW;
    const long warps = (long)p->n_seq * p->n_kv_heads * row_warps;
    const long sm = cu_sm_count(p->sm_count);
    const int gd = tc_group_size(p, row_warps, 4), nbd = (row_warps + gd - 1) / gd;
    /* deep rings only where the row then needs no cross-block fold or folds in one cluster (where clusters run
     * at all): 16 deep blocks per row folding through the workspace took 23.0 us at 1 x 4096, 8 blocks of the
     * 24 KiB form in a cluster 16.3 (H100); and not where one block of the 24 KiB form (up to 8 warps) holds
     * the whole row while the deep form would need a cluster (8 chunks at 1 x 1040: 14.0 us in one 8-warp block
     * against 14.5 in two deep 4-warp blocks; 8B Q4_K_M M=1 1.8% faster in the engine) */
    const bool one_block = row_warps <= tc_group_size(p, row_warps, kMaxG);
    /* and deep rings only for rows of at most 2 sequences. H200, the engine's decode step (ms, docs/perf.md), deep
     * rings up to 4 warps an SM against this rule: 1B F16 at M = 4, 8 and 16 0.924-0.925 against 0.901-0.902,
     * 0.957-0.960 against 0.944, 1.059 against 1.045-1.046; at 16k context and M = 4 2.052 against 1.511; 1B Q4_K_M
     * at M = 8 and 16 0.745-0.749 against 0.728-0.732 and 1.045-1.050 against 1.000-1.005, but at M = 4 0.724-0.731
     * against 0.742-0.747; 8B F16 and Q4_K_M at 2 to 16 rows unchanged; and at 1 and 2 rows the deep form is the
     * faster one (1B F16 0.825 against 0.835 and 0.862 against 0.871) */
    if (kDeep && p->n_seq <= 2 && warps <= sm * 4 &&
        (nbd == 1 || (!one_block && (tc_cluster(p, nbd) || !tc_cluster_on(p))))) {
        switch (gd) {
        case 1: return launch_g<T, D, 1, true, LPW>(p, chunk, n_chunks, st);
        case 2: return launch_g<T, D, 2, true, LPW>(p, chunk, n_chunks, st);
        default: return launch_g<T, D, 4, true, LPW>(p, chunk, n_chunks, st);
        }
    }
    switch (tc_group_size(p, row_warps, kMaxG)) {
    case 1: return launch_g<T, D, 1, false, LPW>(p, chunk, n_chunks, st);
    case 2: return launch_g<T, D, 2, false, LPW>(p, chunk, n_chunks, st);
    case 4: return launch_g<T, D, 4, false, LPW>(p, chunk, n_chunks, st);
    default: return launch_g<T, D, 8, false, LPW>(p, chunk, n_chunks, st);
    }
}

template <typename T, int D>
cudaError_t launch_d(const attn_decode_params *p, cudaStream_t st) {
    const int chunk = tc_chunk(p), n_chunks = tc_chunks_of(p, chunk);
    switch (tc_lpw(p, chunk, n_chunks)) {
    case 4: return launch_l<T, D, 4>(p, chunk, n_chunks, st);
    case 2: return launch_l<T, D, 2>(p, chunk, n_chunks, st);
    default: return launch_l<T, D, 1>(p, chunk, n_chunks, st);
    }
}

template <typename T>
cudaError_t launch_t(const attn_decode_params *p, cudaStream_t st) {
    return p->head_dim == 64 ? launch_d<T, 64>(p, st) : launch_d<T, 128>(p, st);
}

} // namespace

extern "C" int attn_decode_tc_served(const attn_decode_params *p) { return served(p) ? 1 : 0; }

extern "C" int attn_decode_tc_wants(const attn_decode_params *p) {
    if (!served(p)) return 0;
    return p->kernel == 4 || (p->kernel == 0 && cu_settings_get()->attn_tc);
}

extern "C" int attn_decode_tc_chunks(const attn_decode_params *p) {
    if (!served(p)) return 1;
    return tc_chunks_of(p, tc_chunk(p));
}

extern "C" size_t attn_decode_tc_workspace_bytes(const attn_decode_params *p) {
    if (!served(p) || p->n_seq < 1 || p->max_kv_len < 0) return 0;
    /* a bound that never falls as n_seq or max_kv_len grow: at most n_splits chunks when forced, else at most
     * the larger (short-context) target and at most ceil(L / smallest chunk); G >= 1 blocks of partials per
     * chunk at most. (tc_target itself halves at 64k keys, so it cannot bound a workspace sized for a longer
     * context that serves a shorter launch.) */
    size_t b;
    if (p->n_splits > 0) {
        b = (size_t)p->n_splits;
    } else {
        const size_t L = p->max_kv_len > 0 ? (size_t)p->max_kv_len : 1;
        const size_t target = (size_t)tc_target_short(p);
        size_t lo = (size_t)tc_floor_at(p->head_dim, 1);   /* the shortest chunk of any max_kv_len <= L */
        if (p->head_dim == 128 && lo > (size_t)kFloorSmall) lo = kFloorSmall;   /* tc_floor */
        const size_t c = (L + lo - 1) / lo;
        b = c < target ? c : target;
    }
    const size_t exact = (size_t)attn_decode_tc_chunks(p);
    if (exact > b) b = exact;
    return (size_t)p->n_seq * p->n_heads * b * (p->head_dim + 2) * sizeof(float) + ws_counter_bytes(p);
}

extern "C" cudaError_t attn_decode_tc_launch(const attn_decode_params *p, cudaStream_t stream) {
    if (!served(p) || !p->q || !p->k_cache || !p->v_cache || !p->slot || !p->kv_len || !p->out)
        return cudaErrorInvalidValue;
    if (p->n_seq < 1 || p->n_seq > 65535 || p->n_ctx < 1 || p->max_kv_len < 0 || p->max_kv_len > p->n_ctx ||
        p->q_stride < 0 || p->out_stride < 0 || p->q_stride % 4 || p->out_stride % 4 || p->tc_group < 0 ||
        p->tc_group > kMaxG || p->tc_lpw < 0 || p->tc_lpw > 4 || p->tc_lpw == 3 || p->tc_cluster < -1 ||
        p->tc_cluster > 1 || (p->blocks && (p->kv_block_log2 < 4 || p->kv_block_log2 > 8)))
        return cudaErrorInvalidValue;
    return p->kv_type == ATTN_KV_F16 ? launch_t<__half>(p, stream) : launch_t<__nv_bfloat16>(p, stream);
}
