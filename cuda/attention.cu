/* cuda/attention.cu: split-K flash decoding on CUDA cores and the decode dispatch (see attention.h); the prefill
 * kernels are in cuda/attn_prefill.cu and cuda/attn_prefill_tc.cu.
 * attn_decode_launch hands F16/BF16 caches with head sizes 64/128 (not 80/96) to the tensor-core decode kernel
 * (cuda/attn_decode_tc.cu) unless cu_settings.attn_tc is 0 or an explicit kernel 1-3 is asked for; the kernels
 * below serve every other shape. attn_decode_workspace_bytes covers both, attn_decode_splits reports the chunk
 * count of whichever runs.
 *
 * Decode chunk kernel: one block of 4 warps per (KV head group x query-head tile, split, sequence). A "team"
 * of TPK consecutive lanes owns one key row at a time: each lane holds 16 bytes (VEC elements) of it, so a
 * team covers a whole head row with coalesced 16-byte accesses (TPK a power of two: at head sizes 80 and 96 the
 * team's last lanes hold no part of the row and add zeros). Loads go through a per-thread cp.async ring in
 * shared memory, kStages steps deep (each slot written and read by the same thread, so no barriers), which
 * keeps 3 steps of U keys per team in flight while the current one is computed. Each team computes the scores
 * of every query head of its GQA group (partial dot products summed by xor shuffles within the team) and keeps
 * its own online-softmax state (max, sum, output slice) per head in registers; the teams' states merge through
 * shared memory in a fixed order, so a row's result depends only on its own inputs, max_kv_len and the
 * multiprocessor count (batch invariance). Scores live in the log2 domain (q pre-scaled by scale * log2(e)).
 * Split count: enough splits that one sequence alone fills one wave (kBlocksPerSm resident blocks per SM),
 * each split at least kChunkMin keys. From kFuseMinSplits splits on, the splits are merged inside the chunk
 * kernel (below that, by the reduce kernel described next): each block
 * writes its split's partial (output, log-sum-exp), counts it on a per-row-group counter at the end of the
 * workspace, and the block that completes the count merges the row group (weights staged in shared memory,
 * columns summed in split order) and puts the counter back to zero; so no reduce kernel and no per-launch
 * memset (the workspace is zeroed once, attn_decode_workspace_init). Otherwise (or kernel 1) a reduce kernel
 * merges: one block per (sequence, query head), groups of threads fold interleaved subsets of the splits in one
 * pass, then the groups merge in a fixed order; on sm_90 it is launched as a programmatic dependent (PDL) of the
 * chunk kernel (griddepcontrol.wait still orders every read of the partials after the chunk grid has finished).
 * Residency: 3 ring stages and a 128-register cap keep 4 blocks per SM (4 stages / 3 blocks measured slower);
 * the kernel asks for the largest shared-memory carveout, since 4 blocks need a little over 196 KiB.
 * attn_decode_params.kernel 2 is not a kernel: attn_decode_launch refuses it (attention.h). */
#include "attention.h"
#include "attn_decode_tc.h"
#include "cu_host.h"
#include "attn_vec.cuh"
#include "kv_page.cuh"
#include "pdl.cuh"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <atomic>

namespace {

constexpr int kDecodeWarps = 4;     /* warps per decode chunk block */
constexpr int kChunkMin = 256;      /* fewest keys per split */
constexpr int kChunkAlign = 64;     /* split boundaries are multiples of this */
constexpr int kStages = 3;          /* decode prefetch depth: tiles in flight per thread (cp.async ring) */
constexpr int kMaxTile = 8;         /* query heads served per block (a GQA group larger than this is tiled) */
constexpr int kReduceMaxSplits = 2048;
/* the chunk kernel merges the splits itself from this many splits on, the reduce kernel below it (H100: fused
 * faster at 16-49 splits, the reduce kernel at 4-8; the choice follows the split count only, so a row's
 * arithmetic never depends on the batch) */
constexpr int kFuseMinSplits = 9;
/* split target: one sequence alone makes this many blocks per SM (those resident at once: one wave) */
constexpr int kBlocksPerSm = 3;
/* KV heads served by one block (1 was the fastest on H100; a larger cap lets heads share a block) */
constexpr int kMaxHeadsPerBlock = 1;
/* register cap so that this many chunk blocks per SM stay resident (smem allows 3 at 4 stages, 4 at 3); GQA
 * groups of 8 (GM = 8) keep at most 3: at 4 their registers would spill */
constexpr int kMinBlocks = 4;
/* the reduce kernel is launched as a programmatic dependent of the chunk kernel (sm_90; the chunk kernel itself
 * launches plainly) */
constexpr bool kReducePdl = true;

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

struct decode_geom {
    int splits;   /* grid x */
    int chunk;    /* keys per split (multiple of kChunkAlign) */
};

/* ---- decode chunk kernel ----
 * Teams: NT per block. A block serves HB KV heads (HB a power of two dividing NT and n_kv_heads): team t works
 * for KV head hg * HB + (t % HB) on the key subset t / HB of the chunk (keys kb + u * KS + subset, KS = NT / HB),
 * so with HB > 1 the teams of one step read the contiguous [position][head] rows of several heads together. */
/* lanes per team for a row of n 16-byte vectors: the smallest power of two covering them, at most 32 (the xor
 * shuffles of a team need a power of two; head sizes 80 and 96 leave some lanes of a team idle) */
__host__ __device__ constexpr int decode_tpk(int n) {
    int t = 1;
    while (t < n && t < 32) t *= 2;
    return t;
}

template <typename T, int D> struct decode_shape {
    static constexpr int VEC = vec_traits<T>::VEC;
    static constexpr int TPK0 = D / VEC;                  /* 16-byte vectors per key row */
    static constexpr int TPK = decode_tpk(TPK0);          /* lanes per team (one key row) */
    static constexpr int NV = (TPK0 + TPK - 1) / TPK;     /* 16-byte vectors per lane per row */
    static constexpr int E = NV * VEC;                    /* elements per lane per row */
    static constexpr int KPW = 32 / TPK;                  /* teams per warp */
    static constexpr int NT = kDecodeWarps * KPW;         /* teams per block */
    /* vector v of team lane r lies inside the row (always, unless TPK * NV > TPK0): an idle vector loads
     * nothing, holds zeros and stores nothing */
    static __device__ __forceinline__ bool on(int r, int v) { return TPK * NV == TPK0 || r + v * TPK < TPK0; }
};

/* The team's slice of the GM query rows h0 .. h0 + gcount - 1 of sequence seq (rows past gcount are zeros), scaled
 * by qscale: lane r of the team holds elements (r + v * TPK) * VEC .. + VEC - 1 of each head. */
template <typename T, int D, int GM>
__device__ __forceinline__ void decode_load_q(const attn_decode_params &p, int seq, int h0, int gcount, int r,
                                              float qscale, float (&q)[GM][decode_shape<T, D>::E]) {
    using S = decode_shape<T, D>;
    constexpr int VEC = S::VEC, TPK = S::TPK, NV = S::NV;
    const long q_stride = p.q_stride ? p.q_stride : (long)p.n_heads * D;
    const float *qrow = p.q + (long)seq * q_stride + (long)h0 * D;
#pragma unroll
    for (int h = 0; h < GM; h++) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
#pragma unroll
            for (int j = 0; j < VEC; j += 4) {
                float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
                if (h < gcount && S::on(r, v))
                    x = *reinterpret_cast<const float4 *>(qrow + h * D + (r + v * TPK) * VEC + j);
                q[h][v * VEC + j + 0] = x.x * qscale;
                q[h][v * VEC + j + 1] = x.y * qscale;
                q[h][v * VEC + j + 2] = x.z * qscale;
                q[h][v * VEC + j + 3] = x.w * qscale;
            }
        }
    }
}

/* One step of a team's online softmax over U keys: scores of the GM query heads against the keys kb + u * KS + sub (xor-shuffle sums
 * over the TPK lanes of the team), keys at or past k1 masked, then the running max, sum and output slice
 * rescaled and accumulated in key order. q is pre-scaled (log2 domain). */
template <typename T, int D, int GM, int U>
__device__ __forceinline__ void decode_step(const float (&q)[GM][decode_shape<T, D>::E],
                                            const uint4 (&kr)[U][decode_shape<T, D>::NV],
                                            const uint4 (&vr)[U][decode_shape<T, D>::NV], int kb, int KS, int sub,
                                            int k1, float (&m)[GM], float (&l)[GM],
                                            float (&acc)[GM][decode_shape<T, D>::E]) {
    using S = decode_shape<T, D>;
    constexpr int VEC = S::VEC, TPK = S::TPK, NV = S::NV, E = S::E;
    float s[U][GM];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kf[E];
#pragma unroll
        for (int v = 0; v < NV; v++) cvt_any<T>(kr[u][v], kf + v * VEC);
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float a = 0.f;
#pragma unroll
            for (int e = 0; e < E; e++) a = fmaf(q[h][e], kf[e], a);
            s[u][h] = a;
        }
    }
#pragma unroll
    for (int off = TPK / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int h = 0; h < GM; h++) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], off);
        }
    }
    float vf[U][E];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const bool valid = kb + u * KS + sub < k1;
        if (!valid) {
#pragma unroll
            for (int h = 0; h < GM; h++) s[u][h] = -INFINITY;
        }
#pragma unroll
        for (int v = 0; v < NV; v++) {
            if (valid) cvt_any<T>(vr[u][v], vf[u] + v * VEC);
            else {
#pragma unroll
                for (int j = 0; j < VEC; j++) vf[u][v * VEC + j] = 0.f;
            }
        }
    }
#pragma unroll
    for (int h = 0; h < GM; h++) {
        float mx = m[h];
#pragma unroll
        for (int u = 0; u < U; u++) mx = fmaxf(mx, s[u][h]);
        const float ms = mx == -INFINITY ? 0.f : mx;
        const float alpha = exp2f(m[h] - ms);
        float pu[U];
        float ps = 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            pu[u] = exp2f(s[u][h] - ms);
            ps += pu[u];
        }
        l[h] = l[h] * alpha + ps;
#pragma unroll
        for (int e = 0; e < E; e++) {
            float a = acc[h][e] * alpha;
#pragma unroll
            for (int u = 0; u < U; u++) a = fmaf(pu[u], vf[u][e], a);
            acc[h][e] = a;
        }
        m[h] = mx;
    }
}

/* bytes the chunk kernel's shared memory holds past its ring where the team merge area fits in one ring stage:
 * room for a team's (max, sum) per head. Part of decode_smem, which also bounds the fused split merge
 * (decode_fuse_fits), so it stays in the size whether or not a kernel uses it. */
template <typename T, int D, int GM, int U> struct decode_ring_extra {
    using S = decode_shape<T, D>;
    static constexpr size_t stage_bytes = (size_t)U * S::NV * 2 * kDecodeWarps * 32 * 16;
    static constexpr size_t merge_o_bytes = sizeof(float) * (size_t)S::NT * GM * D;
    static constexpr size_t bytes = merge_o_bytes <= stage_bytes ? sizeof(float) * 2 * (size_t)S::NT * GM : 0;
};

/* merges the key subsets (teams) of one split from s_m/s_l/s_o ([NT][GM], [NT][GM], [NT][GM][D]) in a fixed
 * order and writes the split's partial (or the output when splits == 1) */
template <int D, int GM>
__device__ __forceinline__ void decode_team_merge(const attn_decode_params &p, const float *s_m, const float *s_l,
                                                  const float *s_o, int KS, int hb_log2, int gcount, int seq, int hg,
                                                  int group, int tile, int splits, int split) {
    const int HB = 1 << hb_log2;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    float *ws_o = reinterpret_cast<float *>(p.workspace);
    float *ws_lse = ws_o + (long)p.n_seq * p.n_heads * splits * D;
    for (int idx = threadIdx.x; idx < HB * gcount * D; idx += kDecodeWarps * 32) {
        const int b = idx / (gcount * D);
        const int rest = idx - b * gcount * D;
        const int h = rest / D, d = rest - h * D;
        float mx = -INFINITY;
        for (int sI = 0; sI < KS; sI++) mx = fmaxf(mx, s_m[((sI << hb_log2) + b) * GM + h]);
        const float ms = mx == -INFINITY ? 0.f : mx;
        float lsum = 0.f, o = 0.f;
        for (int sI = 0; sI < KS; sI++) {
            const int t = (sI << hb_log2) + b;
            const float f = exp2f(s_m[t * GM + h] - ms);
            lsum += s_l[t * GM + h] * f;
            o += s_o[(t * GM + h) * D + d] * f;
        }
        const int head = (hg * HB + b) * group + tile * GM + h;
        if (splits == 1) {
            p.out[(long)seq * out_stride + (long)head * D + d] = lsum > 0.f ? o / lsum : 0.f;
        } else {
            const long pi = ((long)seq * p.n_heads + head) * splits + split;
            ws_o[pi * D + d] = o / lsum;
            if (d == 0) ws_lse[pi] = mx + log2f(lsum);
        }
    }
}

template <typename T, int D, int GM, int U>
__global__ void __launch_bounds__(kDecodeWarps * 32, GM >= 8 ? (kMinBlocks < 3 ? kMinBlocks : 3) : kMinBlocks)
decode_chunk_kernel(attn_decode_params p, int group, int n_tiles, int hb_log2, int splits, int chunk, float qscale,
                    int fuse) {
    using S = decode_shape<T, D>;
    constexpr int VEC = S::VEC, TPK = S::TPK, NV = S::NV, E = S::E, KPW = S::KPW, NT = S::NT;
    static_assert(D % VEC == 0, "head size");
    constexpr int NTH = kDecodeWarps * 32;
    /* per-thread prefetch ring: [stage][u][v][K,V][thread] 16-byte slots, each written and read by one thread
     * only (so no barrier is needed). The team merge of the split uses the drained ring after the loop. */
    extern __shared__ uint4 s_ring[];

    pdl_wait();      /* no-op unless launched as a PDL dependent: then q, kv_len and K/V are complete */
    pdl_trigger();   /* let the reduce grid launch early; it waits for this grid's completion itself */
    const int HB = 1 << hb_log2, KS = NT >> hb_log2;
    const int seq = blockIdx.z;
    const int split0 = blockIdx.y;   /* this block's split */
    /* the length and the slot are loaded together, before anything else: the first K/V copy waits on both, and
     * one dependent load fewer shortens every block's start (short splits have many blocks) */
    const int kvl = __ldg(p.kv_len + seq);
    const int slot_id = __ldg(p.slot + seq);
    const int len = max(0, min(kvl, splits * chunk));   /* clamp: never past the grid */
    const int k0 = split0 * chunk;
    const int hg = blockIdx.x / n_tiles;
    const int tile = blockIdx.x - hg * n_tiles;
    const int gcount = min(GM, group - tile * GM);
    if (splits > 1 && k0 >= len) {   /* empty splits: the merge reads only non-empty ones */
        if (fuse && len == 0 && split0 == 0) {   /* no reduce kernel: split 0 writes the zero rows */
            const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
            for (int idx = threadIdx.x; idx < HB * gcount * D; idx += NTH) {
                const int b = idx / (gcount * D), rest = idx - b * gcount * D, h = rest / D, d = rest - h * D;
                p.out[(long)seq * out_stride + (long)((hg * HB + b) * group + tile * GM + h) * D + d] = 0.f;
            }
        }
        return;
    }
    const int k1 = min(k0 + chunk, len);   /* the split's keys: [k0, k1) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int team = warp * KPW + lane / TPK;
    const int hb = team & (HB - 1), sub = team >> hb_log2;
    const int kvh = hg * HB + hb;
    const int h0 = kvh * group + tile * GM;        /* first query head of this team */
    const int r = lane % TPK;

    float m[GM], l[GM], acc[GM][E];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] = 0.f;
    }

    const long row_stride = (long)p.n_kv_heads * D;  /* elements between positions */
    /* paged KV: the pool's origin here, each key row's address through the table (kv_page_row) */
    const long slot_base = p.blocks ? (long)kvh * D : (long)slot_id * p.n_ctx * row_stride + (long)kvh * D;
    const T *kbase = reinterpret_cast<const T *>(p.k_cache) + slot_base;
    const T *vbase = reinterpret_cast<const T *>(p.v_cache) + slot_base;

    /* step it covers keys k0 + it * KS * U + u * KS + sub, u < U */
    const int step_keys = KS * U;
    const int n_it = (k1 - k0 + step_keys - 1) / step_keys;
    auto issue = [&](int it) {
        if (it < n_it) {
            uint4 *slot = s_ring + (size_t)(it % kStages) * U * NV * 2 * NTH;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int key = k0 + it * KS * U + u * KS + sub;
                if (key < k1) {
                    const long krow = p.blocks ? kv_page_row(p.blocks, p.kv_block_log2, slot_id, 0, key) : (long)key;
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        if (!S::on(r, v)) continue;
                        const long off = krow * row_stride + (r + v * TPK) * VEC;
                        cp_async16(slot + ((u * NV + v) * 2 + 0) * NTH + threadIdx.x, kbase + off);
                        cp_async16(slot + ((u * NV + v) * 2 + 1) * NTH + threadIdx.x, vbase + off);
                    }
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < kStages - 1; st++) issue(st);

    /* q after the first copies are issued: its loads then overlap theirs instead of delaying them */
    float q[GM][E];
    decode_load_q<T, D, GM>(p, seq, h0, gcount, r, qscale, q);

    /* the team state into the merge area (after a barrier: every thread is done with the ring) */
    auto stash = [&](float *s_m, float *s_l, float *s_o) {
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (r == 0) {
                s_m[team * GM + h] = m[h];
                s_l[team * GM + h] = l[h];
            }
#pragma unroll
            for (int v = 0; v < NV; v++) {
                if (!S::on(r, v)) continue;
#pragma unroll
                for (int j = 0; j < VEC; j++)
                    s_o[(team * GM + h) * D + (r + v * TPK) * VEC + j] = acc[h][v * VEC + j];
            }
        }
    };

    for (int it = 0; it < n_it; it++) {
        issue(it + kStages - 1);
        cp_async_wait<kStages - 1>();
        const int kb = k0 + it * KS * U;
        const uint4 *slot = s_ring + (size_t)(it % kStages) * U * NV * 2 * NTH;
        uint4 kr[U][NV], vr[U][NV];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                if (S::on(r, v)) {
                    kr[u][v] = slot[((u * NV + v) * 2 + 0) * NTH + threadIdx.x];
                    vr[u][v] = slot[((u * NV + v) * 2 + 1) * NTH + threadIdx.x];
                } else {
                    kr[u][v] = vr[u][v] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
        }
        decode_step<T, D, GM, U>(q, kr, vr, kb, KS, sub, k1, m, l, acc);
    }

    cp_async_wait<0>();
    __syncthreads();   /* every thread is done with the ring: reuse it for the merge */
    {
        float *s_m = reinterpret_cast<float *>(s_ring);   /* [NT][GM] */
        float *s_l = s_m + NT * GM;                       /* [NT][GM] */
        float *s_o = s_l + NT * GM;                       /* [NT][GM][D] */
        stash(s_m, s_l, s_o);
        __syncthreads();
        decode_team_merge<D, GM>(p, s_m, s_l, s_o, KS, hb_log2, gcount, seq, hg, group, tile, splits, split0);
    }
    if (!fuse || splits == 1) return;

    /* Splits merged here instead of by a reduce kernel. A block holding every non-empty split of its rows merges
     * them itself (its own writes are visible to it after a barrier). Otherwise the block that completes a row
     * group's count (one counter per (sequence, block column), anchored at the workspace's end so its address
     * never depends on n_seq or the split count) merges the group's heads and puts the counter back to 0 for the
     * next launch (the contract of attn_decode_workspace_init). Ordering: a barrier, then thread 0 fences and
     * counts; the merging block fences again and reads through L2. */
    const int ns = (len + chunk - 1) / chunk;
    const int mine = min(split0 + 1, ns) - split0;   /* non-empty splits of this block: 1 */
    int &s_last = *reinterpret_cast<int *>(s_ring);  /* the flag in the ring: free after the barrier */
    if (mine == ns) {
        __syncthreads();
    } else {
        /* release: the barrier orders every thread's partial writes before thread 0's fence, which is cumulative
         * (the pattern of CUTLASS's semaphores), so one fence per block instead of one per thread */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            int *cnt = reinterpret_cast<int *>((reinterpret_cast<uintptr_t>(p.workspace) + p.workspace_bytes) &
                                               ~(uintptr_t)3) - 1 - ((long)seq * gridDim.x + blockIdx.x);
            const int prev = atomicAdd(cnt, mine);
            s_last = prev + mine == ns;
            if (s_last) *cnt = 0;   /* every other split of the group has counted: none touches it again */
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
    }
    /* the merge: per head, the log-sum-exp max and weights over the splits (in shared memory when they fit),
     * then each float4 column summed in split order, loads issued several at a time */
    const float *ws_o = reinterpret_cast<const float *>(p.workspace);
    const float *ws_lse = ws_o + (long)p.n_seq * p.n_heads * splits * D;
    constexpr int C4 = D / 4;
    const int nh = HB * gcount;
    float *s_w = reinterpret_cast<float *>(s_ring) + 32;   /* [nh][ns] weights, then [nh] sums */
    /* the launcher fuses only when nh * (splits + 1) + 32 floats fit in the ring (decode_fuse_fits) */
    auto head_of = [&](int i) { return ((hg * HB + i / gcount) * group + tile * GM + i % gcount); };
    {
        __syncthreads();   /* s_last has been read by every thread */
        for (int i = threadIdx.x; i < nh * ns; i += NTH)
            s_w[i] = __ldcg(ws_lse + ((long)seq * p.n_heads + head_of(i / ns)) * splits + i % ns);
        __syncthreads();
        for (int i = warp; i < nh; i += kDecodeWarps) {   /* a warp per head: max, weights, their sum */
            float mx = -INFINITY;
            for (int sI = lane; sI < ns; sI += 32) mx = fmaxf(mx, s_w[i * ns + sI]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float ws = 0.f;
            for (int sI = lane; sI < ns; sI += 32) {
                const float f = exp2f(s_w[i * ns + sI] - mx);
                s_w[i * ns + sI] = f;
                ws += f;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, off);
            if (lane == 0) s_w[nh * ns + i] = ws;
        }
        __syncthreads();
    }
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    for (int idx = threadIdx.x; idx < nh * C4; idx += NTH) {
        const int i = idx / C4, c = idx - i * C4;
        const int head = head_of(i);
        const long pair = (long)seq * p.n_heads + head;
        const float4 *po = reinterpret_cast<const float4 *>(ws_o + pair * splits * D) + c;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        const float *wr = s_w + i * ns;
#pragma unroll 16
        for (int sI = 0; sI < ns; sI++) {   /* up to 16 loads in flight: the merge sits on the launch's tail */
            const float f = wr[sI];
            const float4 o = __ldcg(po + (long)sI * C4);
            a.x = fmaf(f, o.x, a.x);
            a.y = fmaf(f, o.y, a.y);
            a.z = fmaf(f, o.z, a.z);
            a.w = fmaf(f, o.w, a.w);
        }
        const float wsum = s_w[nh * ns + i];
        const float inv = 1.f / wsum;
        reinterpret_cast<float4 *>(p.out + (long)seq * out_stride + (long)head * D)[c] =
            make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
    }
}

constexpr int kReduceThreads = 128;      /* fewest threads per reduce block */
constexpr int kReduceMaxThreads = 512;   /* most: many splits get more groups, <= 8 loads per thread */

/* threads of a reduce block: (D / 4) float4 columns x G split groups (a whole number of groups: head sizes 80
 * and 96 do not divide a power of two); a function of D and the split count only */
int reduce_threads(int D, int splits) {
    const int cols = D / 4;
    int t = kReduceThreads;
    while (t < kReduceMaxThreads && (t / cols) * 8 < splits) t *= 2;
    return t / cols * cols;
}

/* ---- decode reduce kernel: one block of 128..512 threads per (sequence, query head) ----
 * Thread t owns float4 column c = t % (D / 4) of the head and the splits s = g, g + G, ... (g = t / (D / 4),
 * G = threads / (D / 4) groups); the block size follows D and the split count only (reduce_threads). Each group folds
 * its splits in one pass (running max, rescaled weight sum and column sums, in increasing split order), then the
 * groups are merged in group order through shared memory: max over the groups, then the rescaled sums. Every
 * load a thread needs is independent of the others, and the first split's are issued together with kv_len's,
 * so a row costs about one round trip to L2 instead of four. The arithmetic depends on D, the split count and
 * the row's partials only (batch invariance). */
__global__ void __launch_bounds__(kReduceMaxThreads)
decode_reduce1_kernel(attn_decode_params p, int D, int splits, int chunk) {
    __shared__ float4 s_acc[kReduceMaxThreads];
    __shared__ float s_gm[kReduceMaxThreads / 2], s_gw[kReduceMaxThreads / 2];   /* per group: max, weight sum */
    pdl_wait();   /* the chunk grid's partials are complete and visible past this point */
    const long pair = blockIdx.x;
    const int seq = (int)(pair / p.n_heads), head = (int)(pair - (long)seq * p.n_heads);
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    float *out = p.out + (long)seq * out_stride + (long)head * D;
    const int cols = D >> 2, G = (int)blockDim.x / cols;
    const int c = threadIdx.x % cols, g = threadIdx.x / cols;
    const float *ws_o = reinterpret_cast<const float *>(p.workspace);
    const float *lse = ws_o + (long)p.n_seq * p.n_heads * splits * D + pair * splits;
    const float4 *po = reinterpret_cast<const float4 *>(ws_o + pair * splits * D) + c;
    /* split g's partial is inside this launch's workspace whatever the length: load it before knowing ns
     * (a stale value of an empty split is never used) */
    float ls0 = -INFINITY;
    float4 o0 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (g < splits) {
        ls0 = __ldcg(lse + g);   /* L2: never a stale L1 line */
        o0 = __ldcg(po + (long)g * cols);
    }
    const int len = max(0, min(p.kv_len[seq], splits * chunk));
    const int ns = len > 0 ? (len + chunk - 1) / chunk : 0;
    if (ns == 0) {
        if (g == 0) reinterpret_cast<float4 *>(out)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    float mg = -INFINITY, wg = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    auto fold = [&](float ls, float4 o) {
        const float mn = fmaxf(mg, ls);
        const float a = mg == -INFINITY ? 0.f : exp2f(mg - mn);
        const float w = exp2f(ls - mn);
        wg = fmaf(wg, a, w);
        acc.x = fmaf(w, o.x, acc.x * a);
        acc.y = fmaf(w, o.y, acc.y * a);
        acc.z = fmaf(w, o.z, acc.z * a);
        acc.w = fmaf(w, o.w, acc.w * a);
        mg = mn;
    };
    if (g < ns) fold(ls0, o0);
#pragma unroll 4
    for (int s = g + G; s < ns; s += G) fold(__ldcg(lse + s), __ldcg(po + (long)s * cols));
    s_acc[threadIdx.x] = acc;
    if (c == 0) {
        s_gm[g] = mg;
        s_gw[g] = wg;
    }
    __syncthreads();
    if (g == 0) {
        float mx = s_gm[0];
        for (int k = 1; k < G; k++) mx = fmaxf(mx, s_gm[k]);
        float wsum = 0.f;
        float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int k = 0; k < G; k++) {
            const float f = s_gm[k] == -INFINITY ? 0.f : exp2f(s_gm[k] - mx);   /* groups with no split: 0 */
            const float4 u = s_acc[k * cols + c];
            wsum = fmaf(f, s_gw[k], wsum);
            t.x = fmaf(f, u.x, t.x);
            t.y = fmaf(f, u.y, t.y);
            t.z = fmaf(f, u.z, t.z);
            t.w = fmaf(f, u.w, t.w);
        }
        const float inv = 1.f / wsum;
        reinterpret_cast<float4 *>(out)[c] = make_float4(t.x * inv, t.y * inv, t.z * inv, t.w * inv);
    }
}

int decode_params_ok(const attn_decode_params *p) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->slot || !p->kv_len || !p->out) return 0;
    if (p->n_seq < 1 || p->n_heads < 1 || p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) return 0;
    if (!attn_head_dim_ok(p->head_dim) || p->n_ctx < 1 || p->max_kv_len < 0 || p->max_kv_len > p->n_ctx) return 0;
    if ((int)p->kv_type < 0 || (int)p->kv_type > 2 || p->n_seq > 65535) return 0;
    if (p->blocks && (p->kv_block_log2 < 0 || p->kv_block_log2 > 8)) return 0;
    if (p->q_stride < 0 || p->out_stride < 0 || p->q_stride % 4 || p->out_stride % 4) return 0;
    return 1;
}

/* split count and chunk from the multiprocessor count, the head layout and max_kv_len only (never n_seq):
 * enough splits for one sequence to fill one wave, each at least kChunkMin keys */
/* teams per decode block for a cache type and head size (decode_shape<T, D>::NT) */
int decode_teams(attn_kv_type t, int D) {
    const int vec = t == ATTN_KV_F32 ? 4 : 8;
    return kDecodeWarps * (32 / decode_tpk(D / vec));
}

/* log2 of the KV heads per block: the largest power of two dividing n_kv_heads, at most the teams and the cap */
int decode_hb_log2(const attn_decode_params *p) {
    const int nt = decode_teams(p->kv_type, p->head_dim);
    int lg = 0;
    while ((2 << lg) <= nt && (2 << lg) <= kMaxHeadsPerBlock && p->n_kv_heads % (2 << lg) == 0) lg++;
    return lg;
}

int decode_target(const attn_decode_params *p) {
    if (p->n_splits > 0) return p->n_splits;
    const int sm = cu_sm_count(p->sm_count);
    const int group = p->n_heads / p->n_kv_heads;
    const int tiles = (group + kMaxTile - 1) / kMaxTile;
    const int per_split = (p->n_kv_heads >> decode_hb_log2(p)) * tiles;   /* blocks per split, one sequence */
    /* rounded down: one split more than fits would leave a few blocks for a second wave that runs alone */
    const int target = kBlocksPerSm * sm / per_split;
    return target < 1 ? 1 : target;
}

/* workspace: split partials ([n_seq][n_heads][splits][D] outputs, then [n_seq][n_heads][splits] log-sum-exps),
 * then the fused merge's arrival counters ([n_seq][n_heads] ints, at most one per row group it merges) */
size_t ws_partial_bytes(const attn_decode_params *p, int splits) {
    return (size_t)p->n_seq * p->n_heads * splits * ((size_t)p->head_dim + 1) * sizeof(float);
}
size_t ws_counter_bytes(const attn_decode_params *p) { return (size_t)p->n_seq * p->n_heads * sizeof(int); }

decode_geom decode_geometry(const attn_decode_params *p) {
    decode_geom g;
    const int L = p->max_kv_len > 0 ? p->max_kv_len : 1;
    const int target = decode_target(p);
    int chunk = (L + target - 1) / target;
    chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
    if (p->n_splits <= 0 && chunk < kChunkMin) chunk = kChunkMin;
    g.chunk = chunk;
    g.splits = (L + chunk - 1) / chunk;
    if (g.splits > kReduceMaxSplits) {   /* forced tiny chunks: widen */
        g.chunk = ((L + kReduceMaxSplits - 1) / kReduceMaxSplits + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
        g.splits = (L + g.chunk - 1) / g.chunk;
    }
    return g;
}

/* dynamic shared memory of the chunk kernel: the prefetch ring, or the merge area if larger */
template <typename T, int D, int GM, int U> constexpr size_t decode_smem() {
    constexpr int NV = decode_shape<T, D>::NV;
    constexpr size_t ring = (size_t)kStages * U * NV * 2 * kDecodeWarps * 32 * 16 +
                            decode_ring_extra<T, D, GM, U>::bytes;
    constexpr size_t merge = sizeof(float) * (size_t)decode_shape<T, D>::NT * GM * (2 + D);
    return ring > merge ? ring : merge;
}

/* the fused split merge stages nh * (splits + 1) weights after a 32-float header in the ring */
template <typename T, int D, int GM, int U> bool decode_fuse_fits(int nh, int splits) {
    return (size_t)nh * (splits + 1) + 32 <= decode_smem<T, D, GM, U>() / sizeof(float);
}

/* the chunk kernel's shared-memory opt-in and carveout, once per kernel and device (a benign race sets them twice):
 * its 4 resident blocks need just over the 196 KiB carveout */
template <typename K> cudaError_t smem_opt_in(K kernel, size_t smem, std::atomic<unsigned long long> &set_bits) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(set_bits.load(std::memory_order_relaxed) & bit)) {
        if (smem > 48 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return e;
        }
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared);
        if (e != cudaSuccess) return e;
        set_bits.fetch_or(bit, std::memory_order_relaxed);
    }
    return cudaSuccess;
}

template <typename T, int D, int GM>
cudaError_t decode_launch_t(const attn_decode_params *p, decode_geom g, cudaStream_t st) {
    constexpr int U = (GM >= 8 || (D >= 256 && sizeof(T) == 4)) ? 2 : 4;
    const int group = p->n_heads / p->n_kv_heads;
    const int n_tiles = (group + GM - 1) / GM;
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    const int hb_log2 = decode_hb_log2(p);
    dim3 grid((unsigned)((p->n_kv_heads >> hb_log2) * n_tiles), (unsigned)g.splits, (unsigned)p->n_seq);
    const size_t smem = decode_smem<T, D, GM, U>();
    static std::atomic<unsigned long long> s_smem_set{0};
    cudaError_t e = smem_opt_in(decode_chunk_kernel<T, D, GM, U>, smem, s_smem_set);
    if (e != cudaSuccess) return e;
    const int fuse = g.splits > 1 && (p->kernel == 3 || (p->kernel == 0 && g.splits >= kFuseMinSplits)) &&
                     decode_fuse_fits<T, D, GM, U>((1 << hb_log2) * GM, g.splits);
    e = cu_launch_opt(0, decode_chunk_kernel<T, D, GM, U>, grid, dim3(kDecodeWarps * 32), smem, st, *p, group, n_tiles,
                      hb_log2, g.splits, g.chunk, scale * kLog2e, fuse);
    if (e == cudaSuccess) e = cudaGetLastError();
    /* the chunk kernel, when fused, merges the splits itself */
    if (e != cudaSuccess || g.splits == 1 || fuse) return e;
    const long pairs = (long)p->n_seq * p->n_heads;
    const dim3 rblock((unsigned)reduce_threads(D, g.splits));
    e = cu_launch_opt(kReducePdl, decode_reduce1_kernel, dim3((unsigned)pairs), rblock, 0, st, *p, D, g.splits, g.chunk);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e;
}

template <typename T, int D>
cudaError_t decode_launch_g(const attn_decode_params *p, decode_geom g, cudaStream_t st) {
    const int group = p->n_heads / p->n_kv_heads;
    if (group == 1) return decode_launch_t<T, D, 1>(p, g, st);
    if (group <= 4) return decode_launch_t<T, D, 4>(p, g, st);
    return decode_launch_t<T, D, 8>(p, g, st);
}

template <typename T>
cudaError_t decode_launch_d(const attn_decode_params *p, decode_geom g, cudaStream_t st) {
    switch (p->head_dim) {
    case 8: return decode_launch_g<T, 8>(p, g, st);
    case 16: return decode_launch_g<T, 16>(p, g, st);
    case 32: return decode_launch_g<T, 32>(p, g, st);
    case 64: return decode_launch_g<T, 64>(p, g, st);
    case 80: return decode_launch_g<T, 80>(p, g, st);
    case 96: return decode_launch_g<T, 96>(p, g, st);
    case 128: return decode_launch_g<T, 128>(p, g, st);
    case 256: return decode_launch_g<T, 256>(p, g, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" size_t attn_decode_workspace_bytes(const attn_decode_params *p) {
    if (!p || p->n_seq < 1 || p->n_heads < 1 || !attn_head_dim_ok(p->head_dim) || p->max_kv_len < 0) return 0;
    if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) return 0;
    /* a bound that never falls as n_seq or max_kv_len grow: the split count is at most the target and at most
     * ceil(max_kv_len / kChunkMin); forced split counts use their exact value */
    size_t splits = (size_t)decode_geometry(p).splits;
    if (p->n_splits <= 0) {
        const size_t L = p->max_kv_len > 0 ? (size_t)p->max_kv_len : 1;
        size_t b = (size_t)decode_target(p);
        const size_t c = (L + kChunkMin - 1) / kChunkMin;
        if (c < b) b = c;
        if (b > (size_t)kReduceMaxSplits) b = kReduceMaxSplits;
        if (b > splits) splits = b;
    }
    const size_t own = ws_partial_bytes(p, (int)splits) + ws_counter_bytes(p);
    /* the tensor-core kernel's need when it serves the shape (the same counters at the end): the larger of both,
     * so one buffer serves every kernel choice */
    const size_t tc = attn_decode_tc_workspace_bytes(p);
    return tc > own ? tc : own;
}

extern "C" cudaError_t attn_decode_workspace_init(void *workspace, size_t bytes, cudaStream_t stream) {
    if (!workspace && bytes) return cudaErrorInvalidValue;
    return bytes ? cudaMemsetAsync(workspace, 0, bytes, stream) : cudaSuccess;
}

extern "C" int attn_decode_splits(const attn_decode_params *p) {
    if (!p || p->n_kv_heads < 1 || p->n_heads < 1) return 1;
    if (attn_decode_tc_wants(p)) return attn_decode_tc_chunks(p);
    return decode_geometry(p).splits;
}

extern "C" cudaError_t attn_decode_launch(const attn_decode_params *p, cudaStream_t stream) {
    if (!decode_params_ok(p)) return cudaErrorInvalidValue;
    if (attn_decode_tc_wants(p)) return attn_decode_tc_launch(p, stream);   /* tensor cores: F16/BF16, D 64/128 */
    if (p->out_w) return cudaErrorInvalidValue;   /* a 16-bit output only from the tensor-core kernel */
    /* 4: a shape the tensor-core kernel does not serve; 2: the removed persistent kernel */
    if (p->kernel == 4 || p->kernel == 2 || p->kernel < 0 || p->kernel > 4) return cudaErrorInvalidValue;
    decode_geom g = decode_geometry(p);
    if (g.splits > 1) {
        const size_t need = ws_partial_bytes(p, g.splits) + ws_counter_bytes(p);
        if (!p->workspace || p->workspace_bytes < need) return cudaErrorInvalidValue;
    }
    switch (p->kv_type) {
    case ATTN_KV_F32: return decode_launch_d<float>(p, g, stream);
    case ATTN_KV_F16: return decode_launch_d<__half>(p, g, stream);
    case ATTN_KV_BF16: return decode_launch_d<__nv_bfloat16>(p, g, stream);
    }
    return cudaErrorInvalidValue;
}
