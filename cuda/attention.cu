/* cuda/attention.cu: split-K flash decoding and tiled causal prefill attention (see attention.h).
 * attn_decode_launch hands F16/BF16 caches with head sizes 64/128 to the tensor-core decode kernel
 * (cuda/attn_decode_tc.cu) unless ZLLM_ATTN_DECODE_TC=0 or an explicit kernel 1-3 is asked for; the kernels
 * below serve every other shape. attn_decode_workspace_bytes covers both, attn_decode_splits reports the chunk
 * count of whichever runs.
 *
 * Decode chunk kernel: one block of 4 warps per (KV head group x query-head tile, split, sequence). A "team"
 * of TPK consecutive lanes owns one key row at a time: each lane holds 16 bytes (VEC elements) of it, so a
 * team covers a whole head row with coalesced 16-byte accesses. Loads go through a per-thread cp.async ring in
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
 * memset (the workspace is zeroed once, attn_decode_workspace_init). Otherwise (or with ZLLM_ATTN_FUSED=0, or
 * kernel 1) a reduce kernel merges: one block per (sequence, query head), groups of threads fold interleaved
 * subsets of the splits in one pass, then the groups merge in a fixed order; on sm_90 it is launched as a
 * programmatic dependent (PDL) of the chunk kernel (griddepcontrol.wait still orders every read of the partials
 * after the chunk grid has finished).
 * Residency: 3 ring stages and a 128-register cap keep 4 blocks per SM (4 stages / 3 blocks measured slower);
 * the kernel asks for the largest shared-memory carveout, since 4 blocks need a little over 196 KiB.
 * Build knobs (benchmarked in docs/perf.md): ZLLM_ATTN_HEADS_PER_BLOCK (KV heads served by one block, 1 was
 * fastest on H100), ZLLM_ATTN_BLOCKS_PER_SM, ZLLM_ATTN_CHUNK_MIN, ZLLM_ATTN_STAGES. Run-time overrides for
 * benchmarking, read once per process (so the split count stays a function of the device, the head layout
 * and max_kv_len): ZLLM_ATTN_PDL (bit 0: reduce as PDL dependent, bit 1: chunk kernel too; default 1),
 * ZLLM_ATTN_CHUNK_MIN (keys, rounded up to 64), ZLLM_ATTN_BPS (split target in blocks per SM), ZLLM_ATTN_L2PF
 * (steps past the cp.async ring whose K/V rows one lane per team bulk-prefetches into L2 on sm_90; 0: off),
 * ZLLM_ATTN_PERSIST (1: the persistent kernel below instead of chunk + reduce), ZLLM_ATTN_CHUNK_MAX (most keys
 * per split, 0: no cap), ZLLM_ATTN_SKIP_REDUCE (diagnostic: no split merge at all, wrong results),
 * ZLLM_ATTN_FUSED (0: reduce kernel, 1: merged in the chunk kernel, 2: by split count, the default),
 * ZLLM_ATTN_REDUCE (1: one-pass reduce
 * kernel, 0: the older two-pass one), ZLLM_ATTN_GROUP (split groups: a block streams several consecutive splits
 * of its row, merging each at its boundary while the ring runs on; 0 = off, the default, because it measured
 * slower: the boundary merges stall all warps), ZLLM_ATTN_CARVE, ZLLM_ATTN_PF0 (L2 bulk prefetch at block start,
 * measured slower).
 * Persistent kernel (decode_stream_kernel, ZLLM_ATTN_STAGES_P ring stages): same items and per-item arithmetic
 * as the chunk kernel, the grid at most the resident blocks, each block a contiguous range of the non-empty
 * items with its cp.async ring running across item boundaries, the splits merged by the last-arriving block of
 * each row (arrival counters zeroed by a memset node per launch) with its own fixed arithmetic. Not the default:
 * see docs/notes-attn.md for its measurements. */
#include "attention.h"
#include "attn_decode_tc.h"
#include "attn_prefill_tc.h"
#include "cu_host.h"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <atomic>

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kDecodeWarps = 4;     /* warps per decode chunk block */
#ifndef ZLLM_ATTN_CHUNK_MIN
#define ZLLM_ATTN_CHUNK_MIN 256
#endif
constexpr int kChunkMin = ZLLM_ATTN_CHUNK_MIN;   /* fewest keys per split */
constexpr int kChunkAlign = 64;     /* split boundaries are multiples of this */
#ifndef ZLLM_ATTN_STAGES
#define ZLLM_ATTN_STAGES 3
#endif
constexpr int kStages = ZLLM_ATTN_STAGES;   /* decode prefetch depth: tiles in flight per thread (cp.async ring) */
#ifndef ZLLM_ATTN_STAGES_P
#define ZLLM_ATTN_STAGES_P 3
#endif
/* ring depth of the persistent kernel: its team-merge area is separate from the ring, so 4 stages of the llama
 * shape (80 KiB) would leave room for only 2 blocks per SM; 3 keeps 3 (64 KiB each) */
constexpr int kStagesP = ZLLM_ATTN_STAGES_P;
#ifndef ZLLM_ATTN_CHUNK_MAX
#define ZLLM_ATTN_CHUNK_MAX 0
#endif
/* most keys per split for long contexts (0: no cap, the default: a cap of 512 made batch 1 at 64k-128k 5-7%
 * slower, docs/notes-attn.md) */
constexpr int kChunkMax = ZLLM_ATTN_CHUNK_MAX;
constexpr int kMaxTile = 8;         /* query heads served per block (a GQA group larger than this is tiled) */
constexpr int kReduceMaxSplits = 2048;
#ifndef ZLLM_ATTN_BLOCKS_PER_SM
#define ZLLM_ATTN_BLOCKS_PER_SM 3
#endif
#ifndef ZLLM_ATTN_L2PF
#define ZLLM_ATTN_L2PF 0
#endif
#ifndef ZLLM_ATTN_PF0
#define ZLLM_ATTN_PF0 0
#endif
#ifndef ZLLM_ATTN_HEADS_PER_BLOCK
#define ZLLM_ATTN_HEADS_PER_BLOCK 1
#endif
#ifndef ZLLM_ATTN_FENCE_ALL
#define ZLLM_ATTN_FENCE_ALL 0
#endif
constexpr bool kFenceAll = ZLLM_ATTN_FENCE_ALL != 0;   /* 1: every thread fences its partial writes (comparison) */
#ifndef ZLLM_ATTN_FUSED_DEFAULT
#define ZLLM_ATTN_FUSED_DEFAULT 2
#endif
/* automatic merge choice (ZLLM_ATTN_FUSED=2): the chunk kernel merges the splits itself from this many splits on,
 * the reduce kernel below it (H100: fused faster at 16-49 splits, the reduce kernel at 4-8; the choice follows
 * the split count only, so a row's arithmetic never depends on the batch) */
constexpr int kFuseMinSplits = 9;
/* split target: one sequence alone makes this many blocks per SM (those resident at once: one wave) */
constexpr int kBlocksPerSm = ZLLM_ATTN_BLOCKS_PER_SM;
constexpr int kMaxHeadsPerBlock = ZLLM_ATTN_HEADS_PER_BLOCK;   /* cap on KV heads served by one block */
#ifndef ZLLM_ATTN_MIN_BLOCKS
#define ZLLM_ATTN_MIN_BLOCKS 4
#endif
/* register cap so that this many chunk blocks per SM stay resident (smem allows 3 at 4 stages, 4 at 3); GQA
 * groups of 8 (GM = 8) keep at most 3: at 4 their registers would spill */
constexpr int kMinBlocks = ZLLM_ATTN_MIN_BLOCKS;

/* run-time overrides of the build knobs, read once (see the file comment) */
struct decode_knobs {
    int pdl;             /* bit 0: reduce launched as PDL dependent; bit 1: chunk kernel as well */
    int chunk_min;       /* fewest keys per split, multiple of kChunkAlign */
    int blocks_per_sm;   /* split target: blocks per SM for one sequence */
    int l2_prefetch;     /* steps ahead of the cp.async ring that K/V rows are bulk-prefetched into L2; 0: off */
    int persist;         /* 0: chunk kernel, one block per item (default); 1: persistent kernel */
    int chunk_max;       /* most keys per split when the split target would make them longer; 0: no cap */
    int skip_reduce;     /* diagnostic only: 1 launches no reduce kernel and skips the persistent kernel's split
                            merge (multi-split results are then wrong) */
    int pf0;             /* keys of its chunk a chunk block bulk-prefetches into L2 when it starts; 0: none */
    int reduce;          /* 1: the one-pass reduce kernel (default), 0: the two-pass one */
    int fused;           /* split merge: 1 in the chunk kernel (last block per row group), 0 by the reduce kernel,
                            2 (default) the first from kFuseMinSplits splits on */
    int group;           /* split groups: 0 off (default: measured slower, docs/perf.md), 1 automatic
                            (decode_group), N > 1 forced N splits per block */
    int group_waves;     /* automatic groups keep at least this many tenths of a wave of blocks */
    int carve;           /* 1: ask for the largest shared-memory carveout for the chunk kernel */
};

const decode_knobs &knobs() {
    static const decode_knobs k = [] {
        decode_knobs r;
        r.pdl = cu_env_int("ZLLM_ATTN_PDL", 1, 0, 3);
        r.chunk_min = (cu_env_int("ZLLM_ATTN_CHUNK_MIN", kChunkMin, 1, 1 << 20) + kChunkAlign - 1) / kChunkAlign *
                      kChunkAlign;
        r.blocks_per_sm = cu_env_int("ZLLM_ATTN_BPS", kBlocksPerSm, 1, 64);
        r.l2_prefetch = cu_env_int("ZLLM_ATTN_L2PF", ZLLM_ATTN_L2PF, 0, 64);
        r.persist = cu_env_int("ZLLM_ATTN_PERSIST", 0, 0, 1);
        r.chunk_max = cu_env_int("ZLLM_ATTN_CHUNK_MAX", kChunkMax, 0, 1 << 20);
        if (r.chunk_max > 0) {
            r.chunk_max = (r.chunk_max + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
            if (r.chunk_max < r.chunk_min) r.chunk_max = r.chunk_min;
        }
        r.skip_reduce = cu_env_int("ZLLM_ATTN_SKIP_REDUCE", 0, 0, 1);
        r.pf0 = cu_env_int("ZLLM_ATTN_PF0", ZLLM_ATTN_PF0, 0, 1 << 20);
        r.reduce = cu_env_int("ZLLM_ATTN_REDUCE", 1, 0, 1);
        r.fused = cu_env_int("ZLLM_ATTN_FUSED", ZLLM_ATTN_FUSED_DEFAULT, 0, 2);
        r.group = cu_env_int("ZLLM_ATTN_GROUP", 0, 0, 4096);
        r.group_waves = cu_env_int("ZLLM_ATTN_GROUP_WAVES", 9, 1, 1000);
        r.carve = cu_env_int("ZLLM_ATTN_CARVE", 1, 0, 1);
        return r;
    }();
    return k;
}

/* PDL (griddepcontrol) exists from sm_90; elsewhere these are no-ops and the launches carry no attribute */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
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
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
/* sm_90 bulk prefetch of bytes (multiple of 16, 16-byte aligned) into L2; a no-op elsewhere */
__device__ __forceinline__ void prefetch_l2(const void *gmem, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
#endif
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
template <typename T, int D> struct decode_shape {
    static constexpr int VEC = vec_traits<T>::VEC;
    static constexpr int TPK0 = D / VEC;
    static constexpr int TPK = TPK0 < 32 ? TPK0 : 32;     /* lanes per team (one key row) */
    static constexpr int NV = D / (VEC * TPK);            /* 16-byte vectors per lane per row */
    static constexpr int E = NV * VEC;                    /* elements per lane per row */
    static constexpr int KPW = 32 / TPK;                  /* teams per warp */
    static constexpr int NT = kDecodeWarps * KPW;         /* teams per block */
};

/* The team's slice of the GM query rows h0 .. h0 + gcount - 1 of sequence seq (rows past gcount are zeros), scaled
 * by qscale: lane r of the team holds elements (r + v * TPK) * VEC .. + VEC - 1 of each head. Shared by the chunk
 * and the persistent kernel. */
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
                if (h < gcount) x = *reinterpret_cast<const float4 *>(qrow + h * D + (r + v * TPK) * VEC + j);
                q[h][v * VEC + j + 0] = x.x * qscale;
                q[h][v * VEC + j + 1] = x.y * qscale;
                q[h][v * VEC + j + 2] = x.z * qscale;
                q[h][v * VEC + j + 3] = x.w * qscale;
            }
        }
    }
}

/* One step of a team's online softmax over U keys (shared by the chunk and the persistent kernel, so both keep
 * the same per-item bits): scores of the GM query heads against the keys kb + u * KS + sub (xor-shuffle sums
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

/* a split group (several consecutive splits in one block, see decode_chunk_kernel) is possible when the team
 * merge area fits in one ring stage and split boundaries fall on step boundaries */
template <typename T, int D, int GM, int U> struct decode_group_shape {
    using S = decode_shape<T, D>;
    static constexpr size_t stage_bytes = (size_t)U * S::NV * 2 * kDecodeWarps * 32 * 16;
    static constexpr size_t merge_o_bytes = sizeof(float) * (size_t)S::NT * GM * D;
    static constexpr bool ok = merge_o_bytes <= stage_bytes;
    static constexpr size_t extra_bytes = ok ? sizeof(float) * 2 * (size_t)S::NT * GM : 0;   /* s_m, s_l */
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
                    int l2pf, int pf0, int fuse, int P) {
    using S = decode_shape<T, D>;
    using GS = decode_group_shape<T, D, GM, U>;
    constexpr int VEC = S::VEC, TPK = S::TPK, NV = S::NV, E = S::E, KPW = S::KPW, NT = S::NT;
    static_assert(D % (VEC * TPK) == 0, "head size");
    constexpr int NTH = kDecodeWarps * 32;
    /* per-thread prefetch ring: [stage][u][v][K,V][thread] 16-byte slots, each written and read by one thread
     * only (so no barrier is needed). The team merge of a split uses the ring stage just consumed (s_o) and a
     * small area after the ring (s_m, s_l), so the stages in flight keep streaming across split boundaries; a
     * block of one split (P == 1) on a shape without that room merges in the drained ring after the loop. */
    extern __shared__ uint4 s_ring[];

    pdl_wait();      /* no-op unless launched as a PDL dependent: then q, kv_len and K/V are complete */
    pdl_trigger();   /* let the reduce grid launch early; it waits for this grid's completion itself */
    const int HB = 1 << hb_log2, KS = NT >> hb_log2;
    const int seq = blockIdx.z;
    const int split0 = blockIdx.y * P;   /* this block's splits: split0 .. split0 + P - 1 (a split group) */
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
    const int k1 = min(k0 + P * chunk, len);   /* the group's keys: [k0, k1) */
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
    const long slot_base = (long)slot_id * p.n_ctx * row_stride + (long)kvh * D;
    const T *kbase = reinterpret_cast<const T *>(p.k_cache) + slot_base;
    const T *vbase = reinterpret_cast<const T *>(p.v_cache) + slot_base;
    if (pf0 > 0) {   /* the first pf0 keys of the chunk into L2 at once: more bytes in flight while the ring fills */
        const int kp = min(k1, k0 + pf0);
        for (int i = threadIdx.x; i < 2 * (kp - k0); i += NTH) {
            const int key = k0 + (i >> 1);
            prefetch_l2(((i & 1) ? vbase : kbase) + key * row_stride, (unsigned)(D * sizeof(T)));
        }
    }

    /* step it covers keys k0 + it * KS * U + u * KS + sub, u < U; a split is spi steps (P > 1 only when chunk is a
     * multiple of KS * U: the launcher checks) */
    const int step_keys = KS * U;
    const int n_it = (k1 - k0 + step_keys - 1) / step_keys;
    const int spi = (chunk + step_keys - 1) / step_keys;
    auto issue = [&](int it) {
        if (it < n_it) {
            uint4 *slot = s_ring + (size_t)(it % kStages) * U * NV * 2 * NTH;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int key = k0 + it * KS * U + u * KS + sub;
                if (key < k1) {
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        const long off = key * row_stride + (r + v * TPK) * VEC;
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

    /* the team state of the current split into the merge area (after a barrier: every thread is done reading
     * the area's previous contents) */
    auto stash = [&](float *s_m, float *s_l, float *s_o) {
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (r == 0) {
                s_m[team * GM + h] = m[h];
                s_l[team * GM + h] = l[h];
            }
#pragma unroll
            for (int v = 0; v < NV; v++) {
#pragma unroll
                for (int j = 0; j < VEC; j++)
                    s_o[(team * GM + h) * D + (r + v * TPK) * VEC + j] = acc[h][v * VEC + j];
            }
        }
    };

    for (int it = 0; it < n_it; it++) {
        if (l2pf > 0 && r == 0) {   /* one lane per team: the team's rows l2pf steps past the ring into L2 */
            const int pit = it + kStages - 1 + l2pf;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int key = k0 + pit * KS * U + u * KS + sub;
                if (key < k1) {
                    prefetch_l2(kbase + key * row_stride, (unsigned)(D * sizeof(T)));
                    prefetch_l2(vbase + key * row_stride, (unsigned)(D * sizeof(T)));
                }
            }
        }
        issue(it + kStages - 1);
        cp_async_wait<kStages - 1>();
        const int kb = k0 + it * KS * U;
        const uint4 *slot = s_ring + (size_t)(it % kStages) * U * NV * 2 * NTH;
        uint4 kr[U][NV], vr[U][NV];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                kr[u][v] = slot[((u * NV + v) * 2 + 0) * NTH + threadIdx.x];
                vr[u][v] = slot[((u * NV + v) * 2 + 1) * NTH + threadIdx.x];
            }
        }
#ifdef ZLLM_ATTN_DIAG_NOCOMPUTE
        /* diagnostic build only (results wrong): the loads without the arithmetic, to see what the copies alone
         * reach */
        {
            uint32_t x = 0;
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int v = 0; v < NV; v++) x ^= kr[u][v].x ^ kr[u][v].w ^ vr[u][v].y ^ vr[u][v].z;
            acc[0][0] += __uint_as_float(x & 0x007fffffu);
        }
        if (false)
#endif
            decode_step<T, D, GM, U>(q, kr, vr, kb, KS, sub, k1, m, l, acc);
        if constexpr (GS::ok) {
            /* a split boundary inside the group: merge this split's teams now, in the stage just consumed (the
             * next stages stay in flight), then start the next split from zero. The last split is merged after
             * the loop like a single one (nothing is in flight by then). */
            if (P > 1 && (it + 1) % spi == 0 && it + 1 < n_it) {
                float *s_o = reinterpret_cast<float *>(const_cast<uint4 *>(slot));
                float *s_m = reinterpret_cast<float *>(s_ring + (size_t)kStages * U * NV * 2 * NTH);
                float *s_l = s_m + NT * GM;
                __syncthreads();   /* every thread has read its cells of this stage */
                stash(s_m, s_l, s_o);
                __syncthreads();
                decode_team_merge<D, GM>(p, s_m, s_l, s_o, KS, hb_log2, gcount, seq, hg, group, tile, splits,
                                         split0 + it / spi);
                __syncthreads();   /* the next issue() refills this stage */
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    m[h] = -INFINITY;
                    l[h] = 0.f;
#pragma unroll
                    for (int e = 0; e < E; e++) acc[h][e] = 0.f;
                }
            }
        }
    }

    cp_async_wait<0>();
    __syncthreads();   /* every thread is done with the ring: reuse it for the merge */
    {
        float *s_m = reinterpret_cast<float *>(s_ring);   /* [NT][GM] */
        float *s_l = s_m + NT * GM;                       /* [NT][GM] */
        float *s_o = s_l + NT * GM;                       /* [NT][GM][D] */
        stash(s_m, s_l, s_o);
        __syncthreads();
        decode_team_merge<D, GM>(p, s_m, s_l, s_o, KS, hb_log2, gcount, seq, hg, group, tile, splits,
                                 split0 + (n_it - 1) / spi);
    }
    if (!fuse || splits == 1) return;

    /* Splits merged here instead of by a reduce kernel. A block holding every non-empty split of its rows merges
     * them itself (its own writes are visible to it after a barrier). Otherwise the block that completes a row
     * group's count (one counter per (sequence, block column), anchored at the workspace's end so its address
     * never depends on n_seq or the split count) merges the group's heads and puts the counter back to 0 for the
     * next launch (the contract of attn_decode_workspace_init). Ordering: a barrier, then thread 0 fences and
     * counts; the merging block fences again and reads through L2. */
    const int ns = (len + chunk - 1) / chunk;
    const int mine = min(split0 + P, ns) - split0;   /* non-empty splits of this block */
    int &s_last = *reinterpret_cast<int *>(s_ring);  /* the flag in the ring: free after the barrier */
    if (mine == ns) {
        __syncthreads();
    } else {
        /* release: the barrier orders every thread's partial writes before thread 0's fence, which is cumulative
         * (the pattern of CUTLASS's semaphores), so one fence per block instead of one per thread */
        if (kFenceAll) __threadfence();
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

/* ---- persistent decode kernel ("stream") ----
 * The same work items as the chunk kernel above, item = (sequence, KV head x query-head tile, split), each with
 * exactly the chunk kernel's per-item arithmetic (same teams, keys per team, U, fma order and team merge). The
 * grid is at most the resident blocks. The non-empty items (split start < the row's kv_len) are numbered in
 * row-major order (sequence, KV head x tile, split) and block b takes the contiguous range [b T / G,
 * (b + 1) T / G) of the T non-empty items (T and the ranges are computed on the device from kv_len, so a graph
 * captured at max_kv_len balances whatever lengths it replays with): a block streams long runs of consecutive
 * splits of the same rows, and its cp.async ring runs ACROSS item boundaries (an "issue" cursor walks the same
 * items ST - 1 steps ahead of the "compute" cursor), so it never drains its copies between items. The team merge
 * uses its own shared area after the ring (the ring is still in flight then).
 * Splits are merged inside this kernel (no reduce kernel): each item writes its partial to the workspace; at
 * the end of a run of consecutive splits of one row the block adds the run's length to the row's arrival
 * counter (zeroed by a memset node before every launch), and the block that completes the count merges the
 * row with a fixed arithmetic (stream_merge_row: log-sum-exp max and weight sum over the splits, then each
 * column folded in split order), so a row's output does not depend on which block arrives last, on the
 * assignment or on the batch (batch invariance). The per-item partials are bit-identical to the chunk kernel's;
 * the merge's arithmetic differs from the reduce kernel's (the two kernels agree to rounding, not to the bit).
 * Measured slower than chunk + reduce on the H100 at every bar shape (docs/notes-attn.md): opt-in only. */
constexpr int kReduceThreads = 128;      /* fewest threads per reduce block */
constexpr int kReduceMaxThreads = 512;   /* most: many splits get more groups, <= 8 loads per thread */

/* threads of a reduce block: (D / 4) float4 columns x G split groups; a function of D and the split count only */
int reduce_threads(int D, int splits) {
    const int cols = D / 4;
    int t = kReduceThreads;
    while (t < kReduceMaxThreads && (t / cols) * 8 < splits) t *= 2;
    return t;
}

/* non-empty splits of sequence seq (0 for kv_len 0) */
__device__ __forceinline__ int stream_ns(const attn_decode_params &p, int seq, int splits, int chunk) {
    const int len = max(0, min(p.kv_len[seq], splits * chunk));
    return len > 0 ? (len + chunk - 1) / chunk : 0;
}

struct stream_cursor {
    long left;        /* items of this block's range not yet reached, including the current one */
    int seq, x, split;
    int ns;           /* non-empty splits of seq */
    int k0, k1, nit;  /* the current item's key range and steps */
    int step;         /* next step to issue (issue cursor only) */
};

__device__ __forceinline__ void stream_item(const attn_decode_params &p, stream_cursor &c, int splits, int chunk,
                                            int ksu) {
    const int len = max(0, min(p.kv_len[c.seq], splits * chunk));
    c.k0 = c.split * chunk;
    c.k1 = min(c.k0 + chunk, len);
    c.nit = (c.k1 - c.k0 + ksu - 1) / ksu;
    c.step = 0;
}

/* places c at non-empty item number first (row-major order) with left items to walk */
__device__ __forceinline__ void stream_start(const attn_decode_params &p, stream_cursor &c, long first, long left,
                                             int n_x, int splits, int chunk, int ksu) {
    c.left = left;
    if (left <= 0) return;
    long cum = 0;
    for (int seq = 0; seq < p.n_seq; seq++) {
        const int ns = stream_ns(p, seq, splits, chunk);
        const long w = (long)ns * n_x;
        if (first < cum + w) {
            const long within = first - cum;
            c.seq = seq;
            c.ns = ns;
            c.x = (int)(within / ns);
            c.split = (int)(within - (long)c.x * ns);
            stream_item(p, c, splits, chunk, ksu);
            return;
        }
        cum += w;
    }
    c.left = 0;   /* not reached: first < T */
}

/* the next non-empty item */
__device__ __forceinline__ void stream_next(const attn_decode_params &p, stream_cursor &c, int n_x, int splits,
                                            int chunk, int ksu) {
    if (--c.left <= 0) return;
    if (++c.split >= c.ns) {
        c.split = 0;
        if (++c.x >= n_x) {
            c.x = 0;
            do {
                c.seq++;
                c.ns = c.seq < p.n_seq ? stream_ns(p, c.seq, splits, chunk) : 1;
            } while (c.ns == 0);
            if (c.seq >= p.n_seq) {
                c.left = 0;
                return;
            }
        }
    }
    stream_item(p, c, splits, chunk, ksu);
}

/* merges the splits of query heads [h0, h0 + gcount) of sequence seq from the workspace into out: warp w takes
 * heads w, w + 4, ...; the warp computes the log-sum-exp max and weight sum lane-strided over the splits (xor
 * trees), then each lane folds one float4 column over the splits in increasing order. Fixed arithmetic: the
 * result depends only on the row's partials. The partials come from other blocks: read through L2 (__ldcg)
 * after the arrival counter's fences. */
template <int D>
__device__ void stream_merge_row(const attn_decode_params &p, int seq, int h0, int gcount, int splits, int ns) {
    constexpr int cols = D / 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    const float *ws_o = reinterpret_cast<const float *>(p.workspace);
    const float *ws_lse = ws_o + (long)p.n_seq * p.n_heads * splits * D;
    for (int h = warp; h < gcount; h += kDecodeWarps) {
        const long pair = (long)seq * p.n_heads + h0 + h;
        const float *lse = ws_lse + pair * splits;
        float mx = -INFINITY;
        for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, __ldcg(lse + s));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float wsum = 0.f;
        for (int s = lane; s < ns; s += 32) wsum += exp2f(__ldcg(lse + s) - mx);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
        const float inv = 1.f / wsum;
        float4 *out = reinterpret_cast<float4 *>(p.out + (long)seq * out_stride + (long)(h0 + h) * D);
        for (int c = lane; c < cols; c += 32) {
            const float4 *po = reinterpret_cast<const float4 *>(ws_o + pair * splits * D) + c;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
            for (int s = 0; s < ns; s++) {
                const float w = exp2f(__ldcg(lse + s) - mx);
                const float4 o = __ldcg(po + (long)s * cols);
                acc.x = fmaf(w, o.x, acc.x);
                acc.y = fmaf(w, o.y, acc.y);
                acc.z = fmaf(w, o.z, acc.z);
                acc.w = fmaf(w, o.w, acc.w);
            }
            out[c] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        }
    }
}

template <typename T, int D, int GM, int U, int ST>
__global__ void __launch_bounds__(kDecodeWarps * 32, 3)   /* its 64 KiB blocks fit 3 per SM */
decode_stream_kernel(attn_decode_params p, int group, int n_tiles, int splits, int chunk, float qscale, int *cnt) {
    using S = decode_shape<T, D>;
    constexpr int VEC = S::VEC, TPK = S::TPK, NV = S::NV, E = S::E, KPW = S::KPW, NT = S::NT;
    static_assert(D % (VEC * TPK) == 0, "head size");
    constexpr int NTH = kDecodeWarps * 32;
    constexpr int KS = NT;   /* one KV head per block: every team works on the same head */
    constexpr int KSU = KS * U;
    extern __shared__ uint4 s_ring[];                  /* [ST][U][NV][K,V][thread], per-thread slots */
    float *s_m = reinterpret_cast<float *>(s_ring + (size_t)ST * U * NV * 2 * NTH);   /* [NT][GM] */
    float *s_l = s_m + NT * GM;                        /* [NT][GM] */
    float *s_o = s_l + NT * GM;                        /* [NT][GM][D] */
    __shared__ int s_last;                             /* this block merges the row */

    pdl_wait();
    pdl_trigger();
    const int n_x = p.n_kv_heads * n_tiles;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int team = warp * KPW + lane / TPK;
    const int sub = team;
    const int r = lane % TPK;
    const long row_stride = (long)p.n_kv_heads * D;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    float *ws_o = reinterpret_cast<float *>(p.workspace);
    float *ws_lse = ws_o + (long)p.n_seq * p.n_heads * splits * D;
    const T *kc = reinterpret_cast<const T *>(p.k_cache);
    const T *vc = reinterpret_cast<const T *>(p.v_cache);

    /* rows of kv_len 0 get zeros (sequences spread over the blocks) */
    long total = 0;   /* T: non-empty items */
    for (int seq = 0; seq < p.n_seq; seq++) {
        const int ns = stream_ns(p, seq, splits, chunk);
        total += (long)ns * n_x;
        if (ns == 0 && seq % gridDim.x == blockIdx.x) {
            float *o = p.out + (long)seq * out_stride;
            for (int i = threadIdx.x; i < p.n_heads * D; i += blockDim.x) o[i] = 0.f;
        }
    }
    const long first = (long)blockIdx.x * total / gridDim.x;
    const long count = (long)(blockIdx.x + 1) * total / gridDim.x - first;

    stream_cursor ci, cs;   /* compute and issue cursors over the same items */
    stream_start(p, ci, first, count, n_x, splits, chunk, KSU);
    stream_start(p, cs, first, count, n_x, splits, chunk, KSU);
    long is_base = 0;       /* element offset of the issue item's (slot, KV head) */
    if (cs.left > 0) is_base = (long)p.slot[cs.seq] * p.n_ctx * row_stride + (long)(cs.x / n_tiles) * D;
    int gi = 0;             /* ring steps issued (committed groups) */
    auto issue = [&]() {
        if (cs.left > 0) {
            uint4 *slot = s_ring + (size_t)(gi % ST) * U * NV * 2 * NTH;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int key = cs.k0 + cs.step * KSU + u * KS + sub;
                if (key < cs.k1) {
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        const long off = is_base + key * row_stride + (r + v * TPK) * VEC;
                        cp_async16(slot + ((u * NV + v) * 2 + 0) * NTH + threadIdx.x, kc + off);
                        cp_async16(slot + ((u * NV + v) * 2 + 1) * NTH + threadIdx.x, vc + off);
                    }
                }
            }
            if (++cs.step >= cs.nit) {
                const int old_seq = cs.seq, old_x = cs.x;
                stream_next(p, cs, n_x, splits, chunk, KSU);
                if (cs.left > 0 && (cs.seq != old_seq || cs.x != old_x))
                    is_base = (long)p.slot[cs.seq] * p.n_ctx * row_stride + (long)(cs.x / n_tiles) * D;
            }
        }
        cp_async_commit();
        gi++;
    };
#pragma unroll
    for (int st = 0; st < ST - 1; st++) issue();

    int g = 0;              /* ring steps consumed */
    int run = 0;            /* items of the current row done since this block last counted them */
    while (ci.left > 0) {
        const int seq = ci.seq;
        const int hg = ci.x / n_tiles;
        const int tile = ci.x - hg * n_tiles;
        const int gcount = min(GM, group - tile * GM);
        const int h0 = hg * group + tile * GM;
        const int split = ci.split;
        float q[GM][E];
        decode_load_q<T, D, GM>(p, seq, h0, gcount, r, qscale, q);
        float m[GM], l[GM], acc[GM][E];
#pragma unroll
        for (int h = 0; h < GM; h++) {
            m[h] = -INFINITY;
            l[h] = 0.f;
#pragma unroll
            for (int e = 0; e < E; e++) acc[h][e] = 0.f;
        }
        const int k0 = ci.k0, k1 = ci.k1;
        for (int it = 0; it < ci.nit; it++, g++) {
            issue();
            cp_async_wait<ST - 1>();
            const int kb = k0 + it * KSU;
            const uint4 *slot = s_ring + (size_t)(g % ST) * U * NV * 2 * NTH;
            uint4 kr[U][NV], vr[U][NV];
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int v = 0; v < NV; v++) {
                    kr[u][v] = slot[((u * NV + v) * 2 + 0) * NTH + threadIdx.x];
                    vr[u][v] = slot[((u * NV + v) * 2 + 1) * NTH + threadIdx.x];
                }
            }
            decode_step<T, D, GM, U>(q, kr, vr, kb, KS, sub, k1, m, l, acc);
        }

        /* team merge, as in the chunk kernel; the first barrier keeps the previous item's readers out */
        __syncthreads();
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (r == 0) {
                s_m[team * GM + h] = m[h];
                s_l[team * GM + h] = l[h];
            }
#pragma unroll
            for (int v = 0; v < NV; v++) {
#pragma unroll
                for (int j = 0; j < VEC; j++)
                    s_o[(team * GM + h) * D + (r + v * TPK) * VEC + j] = acc[h][v * VEC + j];
            }
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < gcount * D; idx += blockDim.x) {
            const int h = idx / D, d = idx - h * D;
            float mx = -INFINITY;
            for (int sI = 0; sI < KS; sI++) mx = fmaxf(mx, s_m[sI * GM + h]);
            const float ms = mx == -INFINITY ? 0.f : mx;
            float lsum = 0.f, o = 0.f;
            for (int sI = 0; sI < KS; sI++) {
                const float f = exp2f(s_m[sI * GM + h] - ms);
                lsum += s_l[sI * GM + h] * f;
                o += s_o[(sI * GM + h) * D + d] * f;
            }
            const int head = h0 + h;
            if (splits == 1) {
                p.out[(long)seq * out_stride + (long)head * D + d] = lsum > 0.f ? o / lsum : 0.f;
            } else {
                const long pi = ((long)seq * p.n_heads + head) * splits + split;
                ws_o[pi * D + d] = o / lsum;
                if (d == 0) ws_lse[pi] = mx + log2f(lsum);
            }
        }
        const int row_x = ci.x, row_ns = ci.ns;
        stream_next(p, ci, n_x, splits, chunk, KSU);
        if (splits > 1) run++;
        if (splits > 1 && cnt && (ci.left <= 0 || ci.seq != seq || ci.x != row_x)) {
            /* this block's run of consecutive splits of the row ends: publish its partials and count them in
             * one atomic; the block that completes the row's count merges it. Every writer fences before the
             * barrier, the counting thread fences again after seeing the final count. */
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                int *c = cnt + (long)seq * n_x + row_x;
                const int old = atomicAdd(c, run);
                s_last = old + run == row_ns;
                if (s_last) {
                    __threadfence();
                    *c = 0;   /* left clean (the launcher zeroes the counters before every launch anyway) */
                }
            }
            __syncthreads();
            if (s_last) {
                __threadfence();
                stream_merge_row<D>(p, seq, h0, gcount, splits, row_ns);
            }
            run = 0;
        }
    }
    cp_async_wait<0>();
}

/* ---- decode reduce kernel: one block of 128..512 threads per (sequence, query head) ----
 * Thread t owns float4 column c = t % (D / 4) of the head and the splits s = g, g + G, ... (g = t / (D / 4),
 * G = threads / (D / 4) groups); every warp computes the same log-sum-exp max and weight sum over all splits
 * (same code, same order, so the same bits), the groups add their partial sums in smem in group order. The
 * block size follows D and the split count only (reduce_threads), so the result depends only on the row's
 * partials and the split count. */
__global__ void __launch_bounds__(kReduceMaxThreads)
decode_reduce_kernel(attn_decode_params p, int D, int splits, int chunk) {
    __shared__ float4 s_part[kReduceMaxThreads];
    pdl_wait();   /* the chunk grid's partials are complete and visible past this point */
    const long pair = blockIdx.x;
    const int seq = (int)(pair / p.n_heads), head = (int)(pair - (long)seq * p.n_heads);
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    float *out = p.out + (long)seq * out_stride + (long)head * D;
    const int len = max(0, min(p.kv_len[seq], splits * chunk));
    const int ns = len > 0 ? (len + chunk - 1) / chunk : 0;
    const int cols = D >> 2, G = (int)blockDim.x / cols;
    const int c = threadIdx.x % cols, g = threadIdx.x / cols;
    if (ns == 0) {
        if (g == 0) reinterpret_cast<float4 *>(out)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    const float *ws_o = reinterpret_cast<const float *>(p.workspace);
    const float *ws_lse = ws_o + (long)p.n_seq * p.n_heads * splits * D;
    const float *lse = ws_lse + pair * splits;
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, __ldcg(lse + s));   /* L2: never a stale L1 line */
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float wsum = 0.f;
    for (int s = lane; s < ns; s += 32) wsum += exp2f(__ldcg(lse + s) - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
    const float4 *po = reinterpret_cast<const float4 *>(ws_o + pair * splits * D) + c;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    /* increasing split order within a group. (A variant that issued 16 clamped loads per thread before use
     * measured slower at 4-8 splits, docs/perf.md: most of its loads were redundant there.) */
#pragma unroll 4
    for (int s = g; s < ns; s += G) {
        const float w = exp2f(__ldcg(lse + s) - mx);
        const float4 o = __ldcg(po + (long)s * cols);
        acc.x = fmaf(w, o.x, acc.x);
        acc.y = fmaf(w, o.y, acc.y);
        acc.z = fmaf(w, o.z, acc.z);
        acc.w = fmaf(w, o.w, acc.w);
    }
    s_part[threadIdx.x] = acc;
    __syncthreads();
    if (g == 0) {
        float4 t = s_part[c];
        for (int k = 1; k < G; k++) {
            const float4 u = s_part[k * cols + c];
            t.x += u.x;
            t.y += u.y;
            t.z += u.z;
            t.w += u.w;
        }
        const float inv = 1.f / wsum;
        reinterpret_cast<float4 *>(out)[c] = make_float4(t.x * inv, t.y * inv, t.z * inv, t.w * inv);
    }
}

/* ---- decode reduce kernel, one-pass form (the default; ZLLM_ATTN_REDUCE=0 selects the two-pass one above) ----
 * Same threads as above: thread (c, g) owns float4 column c and the splits s = g, g + G, ... But each group folds
 * its splits in one pass (running max, rescaled weight sum and column sums, in increasing split order), then the
 * groups are merged in group order through shared memory: max over the groups, then the rescaled sums. Every
 * load a thread needs is independent of the others, and the first split's are issued together with kv_len's,
 * so a row costs about one round trip to L2 instead of four. The arithmetic depends on D, the split count and
 * the row's partials only (batch invariance); it is not bitwise the two-pass form's. */
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

/* PDL needs sm_90; the attribute is only set there */
int s_pdl_ok() {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
    return major >= 9;
}

int head_dim_ok(int d) { return d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

int decode_params_ok(const attn_decode_params *p) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->slot || !p->kv_len || !p->out) return 0;
    if (p->n_seq < 1 || p->n_heads < 1 || p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) return 0;
    if (!head_dim_ok(p->head_dim) || p->n_ctx < 1 || p->max_kv_len < 0 || p->max_kv_len > p->n_ctx) return 0;
    if ((int)p->kv_type < 0 || (int)p->kv_type > 2 || p->n_seq > 65535) return 0;
    if (p->q_stride < 0 || p->out_stride < 0 || p->q_stride % 4 || p->out_stride % 4) return 0;
    return 1;
}

/* split count and chunk from the multiprocessor count, the head layout and max_kv_len only (never n_seq):
 * enough splits for one sequence to fill one wave, each at least kChunkMin keys */
/* teams per decode block for a cache type and head size (decode_shape<T, D>::NT) */
int decode_teams(attn_kv_type t, int D) {
    const int vec = t == ATTN_KV_F32 ? 4 : 8;
    const int tpk = D / vec < 32 ? D / vec : 32;
    return kDecodeWarps * (32 / tpk);
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
    const int target = knobs().blocks_per_sm * sm / per_split;
    return target < 1 ? 1 : target;
}

/* workspace: split partials ([n_seq][n_heads][splits][D] outputs, then [n_seq][n_heads][splits] log-sum-exps),
 * then the persistent kernel's arrival counters ([n_seq][n_heads] ints, at most one per row it merges) */
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
    if (p->n_splits <= 0 && knobs().chunk_max > 0 && chunk > knobs().chunk_max) chunk = knobs().chunk_max;
    if (p->n_splits <= 0 && chunk < knobs().chunk_min) chunk = knobs().chunk_min;
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
    constexpr int VEC = vec_traits<T>::VEC;
    constexpr int TPK = D / VEC < 32 ? D / VEC : 32;
    constexpr int NV = D / (VEC * TPK);
    constexpr size_t ring = (size_t)kStages * U * NV * 2 * kDecodeWarps * 32 * 16 +
                            decode_group_shape<T, D, GM, U>::extra_bytes;
    constexpr size_t merge = sizeof(float) * (size_t)decode_shape<T, D>::NT * GM * (2 + D);
    return ring > merge ? ring : merge;
}

/* the fused split merge stages nh * (splits + 1) weights after a 32-float header in the ring */
template <typename T, int D, int GM, int U> bool decode_fuse_fits(int nh, int splits) {
    return (size_t)nh * (splits + 1) + 32 <= decode_smem<T, D, GM, U>() / sizeof(float);
}

/* splits per block (a split group): 1 unless the batch has enough items to fill the resident blocks with fewer,
 * longer blocks; then the largest divisor P of the split count that keeps >= pair_waves (tenths) waves. The
 * per-split arithmetic is the same for every P (each split's partial is merged and written as by its own block),
 * so P may follow the batch without touching batch invariance. */
int decode_group(long items_per_split, int splits, bool can, int sm) {
    const int mode = knobs().group;
    if (!can || splits <= 1 || mode == 0) return 1;
    if (mode > 1) return mode < splits ? mode : splits;
    const double slots = (double)kMinBlocks * sm, need = slots * knobs().group_waves / 10.0;
    int best = 1;
    for (int P = 2; P <= splits; P++)
        if (splits % P == 0 && (double)(splits / P) * items_per_split >= need) best = P;
    return best;
}

/* dynamic shared memory of the persistent kernel: the ring plus its own team-merge area */
template <typename T, int D, int GM, int U> constexpr size_t stream_smem() {
    constexpr int VEC = vec_traits<T>::VEC;
    constexpr int TPK = D / VEC < 32 ? D / VEC : 32;
    constexpr int NV = D / (VEC * TPK);
    return (size_t)kStagesP * U * NV * 2 * kDecodeWarps * 32 * 16 +
           sizeof(float) * (size_t)decode_shape<T, D>::NT * GM * (2 + D);
}

/* grid of the persistent kernel: all of n_items when they fit in the resident slots; else the largest count in
 * [slots / 2, slots] that divides n_items (full-length rows then give every block the same work), else slots */
long stream_grid(long n_items, long slots) {
    if (n_items <= slots) return n_items;
    for (long g = slots; g >= slots / 2 && g > 0; g--)
        if (n_items % g == 0) return g;
    return slots;
}

/* the shared-memory opt-in once per kernel and device (a benign race sets it twice); for the persistent kernel
 * also its resident blocks per SM, cached (occ, 0 = unknown) */
template <typename K> cudaError_t smem_opt_in(K kernel, size_t smem, std::atomic<unsigned long long> &set_bits,
                                               std::atomic<int> *occ, bool carve = false) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(set_bits.load(std::memory_order_relaxed) & bit)) {
        if (smem > 48 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return e;
        }
        if (carve) {   /* the chunk kernel's 4 resident blocks need just over the 196 KiB carveout */
            cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 (int)cudaSharedmemCarveoutMaxShared);
            if (e != cudaSuccess) return e;
        }
        if (occ) {
            int nb = 0;
            cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, kDecodeWarps * 32, smem);
            if (e != cudaSuccess) return e;
            occ[dev & 63].store(nb > 0 ? nb : 1, std::memory_order_relaxed);
        }
        set_bits.fetch_or(bit, std::memory_order_relaxed);
    }
    return cudaSuccess;
}

/* the persistent kernel serves this launch: chosen by the params, else the process-wide knob; never with the
 * multi-head build knob (it serves one KV head per block) */
int decode_use_stream(const attn_decode_params *p) {
    if (kMaxHeadsPerBlock > 1) return 0;
    if (p->kernel == 1 || p->kernel == 3) return 0;
    if (p->kernel == 2) return 1;
    return knobs().persist;
}

template <typename T, int D, int GM>
cudaError_t decode_launch_t(const attn_decode_params *p, decode_geom g, cudaStream_t st) {
    constexpr int U = (GM >= 8 || (D >= 256 && sizeof(T) == 4)) ? 2 : 4;
    const int group = p->n_heads / p->n_kv_heads;
    const int n_tiles = (group + GM - 1) / GM;
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    const int hb_log2 = decode_hb_log2(p);
    dim3 grid((unsigned)((p->n_kv_heads >> hb_log2) * n_tiles), (unsigned)g.splits, (unsigned)p->n_seq);
    const long n_items = (long)g.splits * p->n_seq * p->n_kv_heads * n_tiles;
    const bool stream = decode_use_stream(p) && hb_log2 == 0 && n_items < (1l << 30);
    const size_t smem = stream ? stream_smem<T, D, GM, U>() : decode_smem<T, D, GM, U>();
    static std::atomic<unsigned long long> s_smem_set{0}, s_smem_set_p{0};
    static std::atomic<int> s_occ[64];
    cudaError_t oe = stream ? smem_opt_in(decode_stream_kernel<T, D, GM, U, kStagesP>, smem, s_smem_set_p, s_occ)
                            : smem_opt_in(decode_chunk_kernel<T, D, GM, U>, smem, s_smem_set, nullptr,
                                          knobs().carve != 0);
    if (oe != cudaSuccess) return oe;
    int *cnt = nullptr;
    if (stream) {   /* grid: the resident blocks, or fewer (stream_grid) */
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
        const long slots = (long)s_occ[dev & 63].load(std::memory_order_relaxed) * cu_sm_count(0);
        grid = dim3((unsigned)stream_grid(n_items, slots));
        if (g.splits > 1 && !knobs().skip_reduce) {
            /* the arrival counters start at zero in every launch: a memset node in the same stream (the kernel
             * also leaves them at zero, but a fresh or reused workspace holds anything) */
            cnt = reinterpret_cast<int *>(static_cast<char *>(p->workspace) + ws_partial_bytes(p, g.splits));
            cudaError_t me = cudaMemsetAsync(cnt, 0, ws_counter_bytes(p), st);
            if (me != cudaSuccess) return me;
        }
    }
    const int fuse = !stream && g.splits > 1 && !knobs().skip_reduce &&
                     (p->kernel == 3 ||
                      (p->kernel == 0 && (knobs().fused == 1 || (knobs().fused == 2 && g.splits >= kFuseMinSplits)))) &&
                     decode_fuse_fits<T, D, GM, U>((1 << hb_log2) * GM, g.splits);
    /* split groups: the chunk kernel only, where the merge area fits a stage and splits end on step boundaries */
    const int step_keys = (decode_shape<T, D>::NT >> hb_log2) * U;
    const int P = stream ? 1 : decode_group((long)grid.x * p->n_seq, g.splits,
                                            decode_group_shape<T, D, GM, U>::ok && g.chunk % step_keys == 0,
                                            cu_sm_count(p->sm_count));
    if (!stream) grid.y = (unsigned)((g.splits + P - 1) / P);
    const int pdl = s_pdl_ok() ? knobs().pdl : 0;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kDecodeWarps * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (pdl & 2) ? 1 : 0;
    cudaError_t e;
    if (stream)
        e = cudaLaunchKernelEx(&cfg, decode_stream_kernel<T, D, GM, U, kStagesP>, *p, group, n_tiles, g.splits,
                               g.chunk, scale * kLog2e, cnt);
    else
        e = cudaLaunchKernelEx(&cfg, decode_chunk_kernel<T, D, GM, U>, *p, group, n_tiles, hb_log2, g.splits,
                               g.chunk, scale * kLog2e, knobs().l2_prefetch, knobs().pf0, fuse, P);
    if (e == cudaSuccess) e = cudaGetLastError();
    /* the persistent kernel, and the chunk kernel when fused, merge the splits themselves */
    if (e != cudaSuccess || g.splits == 1 || stream || fuse || knobs().skip_reduce) return e;
    const long pairs = (long)p->n_seq * p->n_heads;
    cfg.gridDim = dim3((unsigned)pairs);
    cfg.blockDim = dim3((unsigned)reduce_threads(D, g.splits));
    cfg.dynamicSmemBytes = 0;
    cfg.numAttrs = (pdl & 1) ? 1 : 0;
    e = cudaLaunchKernelEx(&cfg, knobs().reduce ? decode_reduce1_kernel : decode_reduce_kernel, *p, D, g.splits,
                           g.chunk);
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
    case 128: return decode_launch_g<T, 128>(p, g, st);
    case 256: return decode_launch_g<T, 256>(p, g, st);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- prefill: one block per (16-row query tile, query head, sequence); 4 warps x 4 rows; 32-key tiles ---- */
constexpr int kPfRowsPerWarp = 4;
constexpr int kPfRows = 4 * kPfRowsPerWarp;
constexpr int kPfKeys = 32;

template <int D> constexpr size_t prefill_smem() {
    return sizeof(float) * ((size_t)kPfRows * D + (size_t)kPfKeys * (D + 1) + (size_t)kPfKeys * D);
}

template <typename T, int D>
__global__ void __launch_bounds__(128) prefill_kernel(attn_prefill_params p, int group, float qscale) {
    constexpr int VEC = vec_traits<T>::VEC;
    constexpr int DC = (D + 31) / 32;   /* output dims per lane */
    extern __shared__ float smem[];
    float *sq = smem;                                /* [kPfRows][D], pre-scaled */
    float *sk = sq + kPfRows * D;                    /* [kPfKeys][D + 1] */
    float *sv = sk + kPfKeys * (D + 1);              /* [kPfKeys][D] */

    const int seq = blockIdx.z, head = blockIdx.y;
    const int rows = p.seq_rows[seq];
    const int t0 = blockIdx.x * kPfRows;
    if (t0 >= rows) return;
    const int row0 = p.seq_row0[seq], pos0 = p.seq_pos0[seq];
    const int kvh = head / group;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long q_stride = p.q_stride ? p.q_stride : (long)p.n_heads * D;
    const long out_stride = p.out_stride ? p.out_stride : (long)p.n_heads * D;
    const int nr = min(kPfRows, rows - t0);

    for (int i = threadIdx.x; i < kPfRows * D; i += blockDim.x) {
        const int rr = i / D, d = i - rr * D;
        sq[i] = rr < nr ? p.q[(long)(row0 + t0 + rr) * q_stride + (long)head * D + d] * qscale : 0.f;
    }
    const long row_stride = (long)p.n_kv_heads * D;
    const long slot_base = (long)p.seq_slot[seq] * p.n_ctx * row_stride + (long)kvh * D;
    const T *kbase = reinterpret_cast<const T *>(p.k_cache) + slot_base;
    const T *vbase = reinterpret_cast<const T *>(p.v_cache) + slot_base;
    const int kend = pos0 + t0 + nr;    /* keys [0, kend) are needed by some row of this tile */

    float m[kPfRowsPerWarp], l[kPfRowsPerWarp], acc[kPfRowsPerWarp][DC];
    int mypos[kPfRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kPfRowsPerWarp; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
        const int rr = warp * kPfRowsPerWarp + i;
        mypos[i] = rr < nr ? pos0 + t0 + rr : -1;     /* -1: no row, every key masked */
#pragma unroll
        for (int c = 0; c < DC; c++) acc[i][c] = 0.f;
    }

    for (int kt = 0; kt < kend; kt += kPfKeys) {
        __syncthreads();
        for (int i = threadIdx.x; i < kPfKeys * D / VEC; i += blockDim.x) {
            const int j = i / (D / VEC), d = (i - j * (D / VEC)) * VEC;
            float kf[VEC], vf[VEC];
            if (kt + j < kend) {
                cvt_any<T>(*reinterpret_cast<const uint4 *>(kbase + (long)(kt + j) * row_stride + d), kf);
                cvt_any<T>(*reinterpret_cast<const uint4 *>(vbase + (long)(kt + j) * row_stride + d), vf);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) kf[e] = vf[e] = 0.f;
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                sk[j * (D + 1) + d + e] = kf[e];
                sv[j * D + d + e] = vf[e];
            }
        }
        __syncthreads();
        const int key = kt + lane;
        float s[kPfRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kPfRowsPerWarp; i++) s[i] = 0.f;
        const float *krow = sk + lane * (D + 1);
        const float *qw = sq + warp * kPfRowsPerWarp * D;
#pragma unroll 8
        for (int d = 0; d < D; d++) {
            const float kd = krow[d];
#pragma unroll
            for (int i = 0; i < kPfRowsPerWarp; i++) s[i] = fmaf(qw[i * D + d], kd, s[i]);
        }
#pragma unroll
        for (int i = 0; i < kPfRowsPerWarp; i++) {
            if (key > mypos[i]) s[i] = -INFINITY;
            float mx = s[i];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            mx = fmaxf(mx, m[i]);
            const float ms = mx == -INFINITY ? 0.f : mx;
            const float alpha = exp2f(m[i] - ms);
            const float pj = exp2f(s[i] - ms);
            float ps = pj;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l[i] = l[i] * alpha + ps;
            m[i] = mx;
#pragma unroll
            for (int c = 0; c < DC; c++) acc[i][c] *= alpha;
            s[i] = pj;
        }
#pragma unroll 4
        for (int j = 0; j < kPfKeys; j++) {
#pragma unroll
            for (int c = 0; c < DC; c++) {
                const int d = lane + 32 * c;
                const float vd = (D >= 32 || d < D) ? sv[j * D + (d < D ? d : 0)] : 0.f;
#pragma unroll
                for (int i = 0; i < kPfRowsPerWarp; i++) {
                    const float pj = __shfl_sync(0xffffffffu, s[i], j);
                    acc[i][c] = fmaf(pj, vd, acc[i][c]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < kPfRowsPerWarp; i++) {
        const int rr = warp * kPfRowsPerWarp + i;
        if (rr >= nr) continue;
        float *o = p.out + (long)(row0 + t0 + rr) * out_stride + (long)head * D;
        const float inv = 1.f / l[i];
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const int d = lane + 32 * c;
            if (d < D) o[d] = acc[i][c] * inv;
        }
    }
}

template <typename T, int D>
cudaError_t prefill_launch_t(const attn_prefill_params *p, cudaStream_t st) {
    const size_t smem = prefill_smem<D>();
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return e;
    }
    const float scale = p->scale > 0.f ? p->scale : 1.0f / sqrtf((float)D);
    dim3 grid((unsigned)((p->max_rows + kPfRows - 1) / kPfRows), (unsigned)p->n_heads, (unsigned)p->n_seq);
    prefill_kernel<T, D><<<grid, 128, smem, st>>>(*p, p->n_heads / p->n_kv_heads, scale * kLog2e);
    return cudaGetLastError();
}

template <typename T>
cudaError_t prefill_launch_d(const attn_prefill_params *p, cudaStream_t st) {
    switch (p->head_dim) {
    case 8: return prefill_launch_t<T, 8>(p, st);
    case 16: return prefill_launch_t<T, 16>(p, st);
    case 32: return prefill_launch_t<T, 32>(p, st);
    case 64: return prefill_launch_t<T, 64>(p, st);
    case 128: return prefill_launch_t<T, 128>(p, st);
    case 256: return prefill_launch_t<T, 256>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" size_t attn_decode_workspace_bytes(const attn_decode_params *p) {
    if (!p || p->n_seq < 1 || p->n_heads < 1 || !head_dim_ok(p->head_dim) || p->max_kv_len < 0) return 0;
    if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) return 0;
    /* a bound that never falls as n_seq or max_kv_len grow: the split count is at most the target and at most
     * ceil(max_kv_len / kChunkMin); forced split counts use their exact value */
    size_t splits = (size_t)decode_geometry(p).splits;
    if (p->n_splits <= 0) {
        const size_t L = p->max_kv_len > 0 ? (size_t)p->max_kv_len : 1;
        size_t b = (size_t)decode_target(p);
        if (knobs().chunk_max > 0) {   /* the cap: at most ceil(L / chunk_max) splits beyond the target */
            const size_t cm = (L + knobs().chunk_max - 1) / knobs().chunk_max;
            if (cm > b) b = cm;
        }
        const size_t c = (L + knobs().chunk_min - 1) / knobs().chunk_min;
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
    if (p->kernel == 4 || p->kernel < 0 || p->kernel > 4) return cudaErrorInvalidValue;   /* 4: shape not served */
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

extern "C" cudaError_t attn_prefill_launch(const attn_prefill_params *p, cudaStream_t stream) {
    if (!p || !p->q || !p->k_cache || !p->v_cache || !p->seq_row0 || !p->seq_rows || !p->seq_slot ||
        !p->seq_pos0 || !p->out)
        return cudaErrorInvalidValue;
    if (p->n_seq < 1 || p->n_seq > 65535 || p->max_rows < 1 || p->n_heads < 1 || p->n_heads > 65535 ||
        p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads || !head_dim_ok(p->head_dim) || p->n_ctx < 1 ||
        p->q_stride < 0 || p->out_stride < 0)
        return cudaErrorInvalidValue;
    if (attn_prefill_tc_wants(p)) return attn_prefill_tc_launch(p, stream);   /* tensor cores: F16/BF16, D 64/128 */
    switch (p->kv_type) {
    case ATTN_KV_F32: return prefill_launch_d<float>(p, stream);
    case ATTN_KV_F16: return prefill_launch_d<__half>(p, stream);
    case ATTN_KV_BF16: return prefill_launch_d<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}
