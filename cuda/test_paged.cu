/* cuda/test_paged.cu: paged KV (block tables, cuda/kv_page.cuh) against contiguous slots, bit for bit.
 * Every case fills contiguous caches with random values, copies each sequence's rows into the blocks of a pool
 * named by a shuffled block table (the pool's other rows hold NaN, so a read through a wrong id shows), packs the
 * tables as the engine stages them (each sequence's ceil(len / kv_block) ids at its own offset), and runs the same
 * launch both ways: decode (every kernel: 0, 1, 3 and the tensor-core kernel 4 with several warp layouts and the
 * early-read flags), prefill (the scalar and the tensor-core kernel), sliding-window attention, and the fused
 * RoPE + KV append (the written rows gathered back through the tables). Outputs must be the same bits. A table
 * whose first id is swapped for a NaN block must change the output (the paged launch really reads through the
 * table), and out-of-range block sizes are refused. Seeded from the clock unless ZLLM_TEST_SEED is set. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "attention.h"
#include "attn_decode_tc.h"
#include "attn_prefill_tc.h"
#include "attn_prefill_wg.h"
#include "attn_window.h"
#include "ops.h"
#include "test.h"
#include "test_util.cuh"

static float rnd_f(void) { return rnd_unit() * 2.f - 1.f; } /* [-1,1) */

static size_t type_size(attn_kv_type t) { return t == ATTN_KV_F32 ? 4 : 2; }
static const char *type_name(attn_kv_type t) { return t == ATTN_KV_F32 ? "f32" : t == ATTN_KV_F16 ? "f16" : "bf16"; }

/* n random values of type t as raw bytes */
static std::vector<unsigned char> rand_cache(size_t n, attn_kv_type t) {
    std::vector<unsigned char> raw(n * type_size(t));
    for (size_t i = 0; i < n; i++) {
        const float x = rnd_f();
        if (t == ATTN_KV_F32) {
            memcpy(&raw[i * 4], &x, 4);
        } else if (t == ATTN_KV_F16) {
            const __half h = __float2half(x);
            memcpy(&raw[i * 2], &h, 2);
        } else {
            const __nv_bfloat16 h = __float2bfloat16(x);
            memcpy(&raw[i * 2], &h, 2);
        }
    }
    return raw;
}

/* A pool holding the rows of contiguous slots: sequence i (slot slot[i], positions [0, len[i])) gets
 * ceil(len[i] / bs) blocks drawn from a shuffled pool of that many plus `spare` blocks, its table packed at off[i];
 * every pool row not copied from a slot holds NaN bits (0xff bytes). */
struct paged {
    int lg = 0, n_blocks = 0;
    std::vector<unsigned char> pool;
    std::vector<int32_t> tab, off;
    std::vector<int> spare_ids; /* blocks no table names (NaN) */
};
static paged make_paged(const std::vector<unsigned char> &cont, size_t row_bytes, int n_ctx,
                        const std::vector<int32_t> &slot, const std::vector<int32_t> &len, int lg, int spare) {
    paged pg;
    pg.lg = lg;
    const int bs = 1 << lg;
    int need = 0;
    for (size_t i = 0; i < len.size(); i++) need += (len[i] + bs - 1) / bs;
    pg.n_blocks = need + spare;
    std::vector<int32_t> ids(pg.n_blocks);
    for (int i = 0; i < pg.n_blocks; i++) ids[i] = i;
    for (int i = pg.n_blocks - 1; i > 0; i--) {
        const int j = rnd_i(i + 1);
        const int32_t x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    pg.pool.assign((size_t)pg.n_blocks * bs * row_bytes, 0xff);
    int used = 0;
    for (size_t i = 0; i < len.size(); i++) {
        pg.off.push_back((int32_t)pg.tab.size());
        for (int b = 0; b < (len[i] + bs - 1) / bs; b++) {
            const int32_t id = ids[used++];
            pg.tab.push_back(id);
            for (int r = 0; r < bs && b * bs + r < n_ctx; r++)
                memcpy(&pg.pool[((size_t)id * bs + r) * row_bytes],
                       &cont[((size_t)slot[i] * n_ctx + b * bs + r) * row_bytes], row_bytes);
        }
    }
    for (int i = used; i < pg.n_blocks; i++) pg.spare_ids.push_back(ids[i]);
    if (pg.tab.empty()) pg.tab.push_back(0);
    return pg;
}

/* random slots (a permutation of [0, n_slots)) */
static std::vector<int32_t> rand_slots(int n, int n_slots) {
    std::vector<int32_t> perm(n_slots);
    for (int i = 0; i < n_slots; i++) perm[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        const int j = rnd_i(i + 1);
        const int32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    perm.resize(n);
    return perm;
}

struct decode_case {
    attn_kv_type t;
    int n_seq, n_heads, n_kv, D, n_ctx, max_len, lg;
};

/* decode: every kernel that serves the shape, contiguous and paged, the same bits */
static void run_decode(const decode_case &c) {
    const int n_slots = c.n_seq + 1;
    const size_t row_el = (size_t)c.n_kv * c.D, row_bytes = row_el * type_size(c.t);
    const std::vector<unsigned char> kc = rand_cache((size_t)n_slots * c.n_ctx * row_el, c.t),
                                     vc = rand_cache((size_t)n_slots * c.n_ctx * row_el, c.t);
    const std::vector<int32_t> slot = rand_slots(c.n_seq, n_slots);
    std::vector<int32_t> len(c.n_seq);
    for (int i = 0; i < c.n_seq; i++) len[i] = i == 0 ? c.max_len : rnd_i(6) == 0 ? 0 : 1 + rnd_i(c.max_len);
    /* the same shuffle for K and V: make_paged draws its ids from the generator, so reseed it in between */
    const uint64_t r0 = s_rng;
    const paged pk = make_paged(kc, row_bytes, c.n_ctx, slot, len, c.lg, 3);
    s_rng = r0;
    const paged pv = make_paged(vc, row_bytes, c.n_ctx, slot, len, c.lg, 3);
    const size_t qn = (size_t)c.n_seq * c.n_heads * c.D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.f;
    dev_buf dkc(kc.data(), kc.size()), dvc(vc.data(), vc.size()), dkp(pk.pool.data(), pk.pool.size()),
        dvp(pv.pool.data(), pv.pool.size()), dq(q.data(), qn * 4), dslot(slot.data(), slot.size() * 4),
        dlen(len.data(), len.size() * 4), doff(pk.off.data(), pk.off.size() * 4),
        dtab(pk.tab.data(), pk.tab.size() * 4), dout(qn * 4);
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>();
    p.kv_type = c.t;
    p.kv_len = dlen.as<int32_t>();
    p.out = dout.as<float>();
    p.n_seq = c.n_seq;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv;
    p.head_dim = c.D;
    p.n_ctx = c.n_ctx;
    p.max_kv_len = c.n_ctx; /* the engine's choice: the split count follows n_ctx, never the lengths */
    p.max_seq = c.n_seq;
    size_t wsb = 0;
    for (int k = 0; k <= 4; k++) {
        attn_decode_params w = p;
        w.kernel = k == 2 ? 0 : k;
        const size_t b = attn_decode_workspace_bytes(&w);
        if (b > wsb) wsb = b;
    }
    dev_buf ws(wsb);
    CUDA_OK(attn_decode_workspace_init(ws.p, wsb, 0));
    p.workspace = ws.p;
    p.workspace_bytes = wsb;
    const bool tc = attn_decode_tc_served(&p) && c.lg >= 4;
    /* forms: kernel, tc_group, tc_lpw, kv_pre/kv_early */
    const int forms[][4] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {3, 0, 0, 0}, {4, 0, 0, 0},
                            {4, 1, 1, 1}, {4, 8, 2, 1}, {4, 2, 4, 0}};
    auto run = [&](attn_decode_params x, bool paged_run, const int32_t *tab) {
        if (paged_run) {
            x.k_cache = dkp.p;
            x.v_cache = dvp.p;
            x.slot = doff.as<int32_t>();
            x.blocks = tab;
            x.kv_block_log2 = c.lg;
        } else {
            x.k_cache = dkc.p;
            x.v_cache = dvc.p;
            x.slot = dslot.as<int32_t>();
        }
        CUDA_OK(cudaMemset(dout.p, 0xff, qn * 4));
        const cudaError_t e = attn_decode_launch(&x, 0);
        CUDA_OK(cudaDeviceSynchronize());
        return e == cudaSuccess ? dout.get() : std::vector<unsigned char>();
    };
    int n_forms = 0;
    for (const auto &f : forms) {
        if (f[0] == 4 && !tc) continue;
        if (f[0] == 0 && !tc && c.lg < 4 && attn_decode_tc_served(&p)) continue; /* kernel 0 would take kernel 4 */
        attn_decode_params x = p;
        x.kernel = f[0];
        x.tc_group = f[1];
        x.tc_lpw = f[2];
        x.kv_pre = x.kv_early = f[3];
        const std::vector<unsigned char> a = run(x, false, nullptr), b = run(x, true, dtab.as<int32_t>());
        CHECK(!a.empty() && a.size() == b.size() && memcmp(a.data(), b.data(), a.size()) == 0,
              "decode %s kernel %d (G %d lpw %d pre %d) seq=%d heads=%d/%d D=%d n_ctx=%d block %d: paged differs "
              "from contiguous (or a launch failed)",
              type_name(c.t), f[0], f[1], f[2], f[3], c.n_seq, c.n_heads, c.n_kv, c.D, c.n_ctx, 1 << c.lg);
        n_forms++;
    }
    /* the table is really read: sequence 0's first block swapped for a NaN block changes its output */
    if (!pk.spare_ids.empty() && len[0] > 0) {
        std::vector<int32_t> bad = pk.tab;
        bad[pk.off[0]] = pk.spare_ids[0];
        dev_buf dbad(bad.data(), bad.size() * 4);
        attn_decode_params x = p;
        x.kernel = tc ? 4 : 1;
        const std::vector<unsigned char> a = run(x, false, nullptr), b = run(x, true, dbad.as<int32_t>());
        CHECK(!a.empty() && memcmp(a.data(), b.data(), (size_t)c.n_heads * c.D * 4) != 0,
              "decode %s: a wrong block id left the output unchanged (the launch does not read the table)",
              type_name(c.t));
    }
    printf("decode  %-4s seq=%-3d heads=%d/%d D=%-3d n_ctx=%-6d block %-3d: %d forms, same bits\n", type_name(c.t),
           c.n_seq, c.n_heads, c.n_kv, c.D, c.n_ctx, 1 << c.lg, n_forms);
}

struct prefill_case {
    attn_kv_type t;
    int n_seq, n_heads, n_kv, D, n_ctx, max_rows, lg;
};

/* prefill: the scalar kernel and (F16/BF16, head sizes it serves) the tensor-core kernel, contiguous and paged */
static void run_prefill(const prefill_case &c) {
    const int n_slots = c.n_seq + 1;
    const size_t row_el = (size_t)c.n_kv * c.D, row_bytes = row_el * type_size(c.t);
    const std::vector<unsigned char> kc = rand_cache((size_t)n_slots * c.n_ctx * row_el, c.t),
                                     vc = rand_cache((size_t)n_slots * c.n_ctx * row_el, c.t);
    const std::vector<int32_t> slot = rand_slots(c.n_seq, n_slots);
    std::vector<int32_t> row0(c.n_seq), rows(c.n_seq), pos0(c.n_seq), len(c.n_seq);
    int n_rows = 0;
    for (int i = 0; i < c.n_seq; i++) {
        rows[i] = i == 0 ? c.max_rows : 1 + rnd_i(c.max_rows);
        pos0[i] = rnd_i(2) ? 0 : rnd_i(c.n_ctx - rows[i] + 1);
        row0[i] = n_rows;
        n_rows += rows[i];
        len[i] = pos0[i] + rows[i];
    }
    const uint64_t r0 = s_rng;
    const paged pk = make_paged(kc, row_bytes, c.n_ctx, slot, len, c.lg, 2);
    s_rng = r0;
    const paged pv = make_paged(vc, row_bytes, c.n_ctx, slot, len, c.lg, 2);
    const size_t qn = (size_t)n_rows * c.n_heads * c.D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.f;
    dev_buf dkc(kc.data(), kc.size()), dvc(vc.data(), vc.size()), dkp(pk.pool.data(), pk.pool.size()),
        dvp(pv.pool.data(), pv.pool.size()), dq(q.data(), qn * 4), dslot(slot.data(), slot.size() * 4),
        dr0(row0.data(), row0.size() * 4), drows(rows.data(), rows.size() * 4), dpos(pos0.data(), pos0.size() * 4),
        doff(pk.off.data(), pk.off.size() * 4), dtab(pk.tab.data(), pk.tab.size() * 4), dout(qn * 4);
    attn_prefill_params p;
    memset(&p, 0, sizeof p);
    p.q = dq.as<float>();
    p.kv_type = c.t;
    p.seq_row0 = dr0.as<int32_t>();
    p.seq_rows = drows.as<int32_t>();
    p.seq_pos0 = dpos.as<int32_t>();
    p.out = dout.as<float>();
    p.n_seq = c.n_seq;
    p.max_rows = c.max_rows;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv;
    p.head_dim = c.D;
    p.n_ctx = c.n_ctx;
    int n_forms = 0;
    std::vector<unsigned char> tc_out; /* the tensor-core kernel's output (the wgmma form where it runs) */
    /* force 0: the scalar kernel; 1: the tensor-core kernel; 2: its mma.sync form, where 1 ran the wgmma one */
    for (int force = 0; force < 3; force++) {
        attn_prefill_tc_force(force ? 1 : 0);
        attn_prefill_wg_force(-1);
        if (force >= 1 && !attn_prefill_tc_wants(&p)) continue;
        if (force == 2 && !attn_prefill_wg_wants(&p)) continue;
        if (force == 2) attn_prefill_wg_force(0);
        std::vector<unsigned char> out[2];
        for (int pg = 0; pg < 2; pg++) {
            attn_prefill_params x = p;
            x.k_cache = pg ? dkp.p : dkc.p;
            x.v_cache = pg ? dvp.p : dvc.p;
            x.seq_slot = pg ? doff.as<int32_t>() : dslot.as<int32_t>();
            x.blocks = pg ? dtab.as<int32_t>() : nullptr;
            x.kv_block_log2 = pg ? c.lg : 0;
            CUDA_OK(cudaMemset(dout.p, 0xff, qn * 4));
            const cudaError_t e = attn_prefill_launch(&x, 0);
            CUDA_OK(cudaDeviceSynchronize());
            if (e == cudaSuccess) out[pg] = dout.get();
        }
        CHECK(!out[0].empty() && out[0].size() == out[1].size() &&
                  memcmp(out[0].data(), out[1].data(), out[0].size()) == 0,
              "prefill %s %s seq=%d heads=%d/%d D=%d n_ctx=%d block %d: paged differs from contiguous (or a launch "
              "failed)",
              type_name(c.t),
              force == 2 ? "tc mma.sync"
              : force    ? "tc"
                         : "scalar",
              c.n_seq, c.n_heads, c.n_kv, c.D, c.n_ctx, 1 << c.lg);
        if (force == 1) tc_out = out[1];
        if (force == 2)
            CHECK(tc_out == out[1], "prefill %s seq=%d heads=%d/%d D=%d block %d: the wgmma and mma.sync forms differ",
                  type_name(c.t), c.n_seq, c.n_heads, c.n_kv, c.D, 1 << c.lg);
        n_forms++;
    }
    attn_prefill_tc_force(-1);
    attn_prefill_wg_force(-1);
    printf("prefill %-4s seq=%-3d heads=%d/%d D=%-3d n_ctx=%-6d block %-3d: %d kernels, same bits\n", type_name(c.t),
           c.n_seq, c.n_heads, c.n_kv, c.D, c.n_ctx, 1 << c.lg, n_forms);
}

/* sliding-window attention: rows at random positions, each its own slot */
static void run_window(attn_kv_type t, int n_rows, int n_heads, int n_kv, int D, int n_ctx, int window, int lg) {
    const int n_slots = n_rows + 1;
    const size_t row_el = (size_t)n_kv * D, row_bytes = row_el * type_size(t);
    const std::vector<unsigned char> kc = rand_cache((size_t)n_slots * n_ctx * row_el, t),
                                     vc = rand_cache((size_t)n_slots * n_ctx * row_el, t);
    const std::vector<int32_t> slot = rand_slots(n_rows, n_slots);
    std::vector<int32_t> pos(n_rows), len(n_rows);
    for (int i = 0; i < n_rows; i++) {
        pos[i] = i == 0 ? n_ctx - 1 : rnd_i(n_ctx);
        len[i] = pos[i] + 1;
    }
    const uint64_t r0 = s_rng;
    const paged pk = make_paged(kc, row_bytes, n_ctx, slot, len, lg, 2);
    s_rng = r0;
    const paged pv = make_paged(vc, row_bytes, n_ctx, slot, len, lg, 2);
    const size_t qn = (size_t)n_rows * n_heads * D;
    std::vector<float> q(qn);
    for (auto &x : q) x = rnd_f() * 2.f;
    dev_buf dkc(kc.data(), kc.size()), dvc(vc.data(), vc.size()), dkp(pk.pool.data(), pk.pool.size()),
        dvp(pv.pool.data(), pv.pool.size()), dq(q.data(), qn * 4), dslot(slot.data(), slot.size() * 4),
        dpos(pos.data(), pos.size() * 4), doff(pk.off.data(), pk.off.size() * 4),
        dtab(pk.tab.data(), pk.tab.size() * 4), dout(qn * 4);
    std::vector<unsigned char> out[2];
    for (int pg = 0; pg < 2; pg++) {
        attn_window_params p;
        memset(&p, 0, sizeof p);
        p.q = dq.as<float>();
        p.k_cache = pg ? dkp.p : dkc.p;
        p.v_cache = pg ? dvp.p : dvc.p;
        p.kv_type = t;
        p.pos = dpos.as<int32_t>();
        p.slot = pg ? doff.as<int32_t>() : dslot.as<int32_t>();
        p.out = dout.as<float>();
        p.n_rows = n_rows;
        p.n_heads = n_heads;
        p.n_kv_heads = n_kv;
        p.head_dim = D;
        p.n_ctx = n_ctx;
        p.window = window;
        p.blocks = pg ? dtab.as<int32_t>() : nullptr;
        p.kv_block_log2 = pg ? lg : 0;
        CUDA_OK(cudaMemset(dout.p, 0xff, qn * 4));
        const cudaError_t e = attn_window_launch(&p, 0);
        CUDA_OK(cudaDeviceSynchronize());
        if (e == cudaSuccess) out[pg] = dout.get();
    }
    CHECK(!out[0].empty() && out[0].size() == out[1].size() && memcmp(out[0].data(), out[1].data(), out[0].size()) == 0,
          "window %s rows=%d heads=%d/%d D=%d n_ctx=%d window %d block %d: paged differs from contiguous", type_name(t),
          n_rows, n_heads, n_kv, D, n_ctx, window, 1 << lg);
    printf("window  %-4s rows=%-3d heads=%d/%d D=%-3d n_ctx=%-6d block %-3d: same bits\n", type_name(t), n_rows,
           n_heads, n_kv, D, n_ctx, 1 << lg);
}

/* the fused RoPE + KV append: q the same bits, every row's K and V where its table puts it (gathered back), and
 * nothing else in the pool written */
static void run_append(cu_dtype t, int n_rows, int n_heads, int n_kv, int D, int n_ctx, int lg) {
    const int qd = n_heads * D, kvd = n_kv * D, ld = qd + 2 * kvd, bs = 1 << lg, mb = (n_ctx + bs - 1) / bs;
    const size_t es = ops_dtype_size(t);
    std::vector<float> qkv((size_t)n_rows * ld), cs((size_t)n_ctx * D + 4);
    for (auto &x : qkv) x = rnd_f();
    ops_rope_table_host(cs.data(), n_ctx, D, 10000.0);
    /* row r: slot r, a random position; its table: mb ids of a shuffled pool of n_rows * mb blocks */
    std::vector<int32_t> slot(n_rows), pos(n_rows), off(n_rows), tab((size_t)n_rows * mb);
    std::vector<int32_t> ids((size_t)n_rows * mb);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)i;
    for (size_t i = ids.size() - 1; i > 0; i--) {
        const size_t j = (size_t)rnd_i((int)i + 1);
        const int32_t x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    for (int r = 0; r < n_rows; r++) {
        slot[r] = r;
        pos[r] = rnd_i(n_ctx);
        off[r] = r * mb;
        for (int b = 0; b < mb; b++) tab[(size_t)r * mb + b] = ids[(size_t)r * mb + b];
    }
    const size_t cont_n = (size_t)n_rows * n_ctx * kvd, pool_n = (size_t)n_rows * mb * bs * kvd;
    dev_buf dqkv(qkv.data(), qkv.size() * 4), dcs(cs.data(), cs.size() * 4), dslot(slot.data(), n_rows * 4),
        dpos(pos.data(), n_rows * 4), doff(off.data(), n_rows * 4), dtab(tab.data(), tab.size() * 4),
        dq1((size_t)n_rows * qd * 4), dq2((size_t)n_rows * qd * 4), kc(cont_n * es), vc(cont_n * es), kp(pool_n * es),
        vp(pool_n * es);
    for (dev_buf *b : {&kc, &vc, &kp, &vp}) CUDA_OK(cudaMemset(b->p, 0, b->n));
    char err[256];
    int ok = 1;
    for (int pg = 0; pg < 2; pg++) {
        ops_qkv_args a;
        memset(&a, 0, sizeof a);
        a.qkv = dqkv.as<float>();
        a.ld = ld;
        a.pos = dpos.as<int32_t>();
        a.slot = pg ? doff.as<int32_t>() : dslot.as<int32_t>();
        a.n_rows = n_rows;
        a.n_heads = n_heads;
        a.n_kv_heads = n_kv;
        a.head_dim = D;
        a.rope_dim = D;
        a.cs = dcs.as<float>();
        a.q = pg ? dq2.as<float>() : dq1.as<float>();
        a.n_ctx = n_ctx;
        a.kc = pg ? kp.p : kc.p;
        a.vc = pg ? vp.p : vc.p;
        a.kvdt = t;
        a.blocks = pg ? dtab.as<int32_t>() : nullptr;
        a.kv_block_log2 = pg ? lg : 0;
        ok &= ops_qkv_rope_append(&a, 0, err, sizeof err) == 0;
    }
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> q1 = dq1.get(), q2 = dq2.get();
    std::vector<unsigned char> hk = kc.get(), hv = vc.get(), pk = kp.get(), pv = vp.get();
    ok &= memcmp(q1.data(), q2.data(), q1.size()) == 0;
    const size_t rb = (size_t)kvd * es;
    for (int r = 0; r < n_rows; r++) {
        const size_t c = ((size_t)slot[r] * n_ctx + pos[r]) * rb;
        const size_t p = ((size_t)tab[(size_t)off[r] + (pos[r] >> lg)] * bs + (pos[r] & (bs - 1))) * rb;
        ok &= memcmp(&hk[c], &pk[p], rb) == 0 && memcmp(&hv[c], &pv[p], rb) == 0;
        memset(&pk[p], 0, rb);
        memset(&pv[p], 0, rb);
    }
    size_t stray = 0;
    for (size_t i = 0; i < pk.size(); i++) stray += pk[i] != 0 || pv[i] != 0;
    CHECK(ok && stray == 0,
          "append %s rows=%d heads=%d/%d D=%d n_ctx=%d block %d: paged rows differ from contiguous "
          "(or %zu stray bytes written)",
          ops_dtype_name(t), n_rows, n_heads, n_kv, D, n_ctx, bs, stray);
    printf("append  %-4s rows=%-3d heads=%d/%d D=%-3d n_ctx=%-6d block %-3d: same bits\n", ops_dtype_name(t), n_rows,
           n_heads, n_kv, D, n_ctx, bs);
}

/* block sizes outside the kernels' range are refused */
static void run_validation(void) {
    dev_buf d(1 << 16);
    attn_decode_params p;
    memset(&p, 0, sizeof p);
    p.q = d.as<float>();
    p.k_cache = p.v_cache = d.p;
    p.kv_type = ATTN_KV_F16;
    p.slot = p.kv_len = d.as<int32_t>();
    p.out = d.as<float>();
    p.n_seq = 1;
    p.n_heads = 8;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.n_ctx = p.max_kv_len = 64;
    p.blocks = d.as<int32_t>();
    const size_t wsb = attn_decode_workspace_bytes(&p);
    dev_buf ws(wsb);
    CUDA_OK(attn_decode_workspace_init(ws.p, wsb, 0));
    p.workspace = ws.p;
    p.workspace_bytes = wsb;
    p.kernel = 4;
    p.kv_block_log2 = 3;
    CHECK(attn_decode_launch(&p, 0) == cudaErrorInvalidValue, "the tensor-core decode kernel must refuse blocks of 8");
    p.kernel = 1;
    p.kv_block_log2 = 9;
    CHECK(attn_decode_launch(&p, 0) == cudaErrorInvalidValue, "decode must refuse blocks of 512");
    attn_window_params w;
    memset(&w, 0, sizeof w);
    w.q = d.as<float>();
    w.k_cache = w.v_cache = d.p;
    w.kv_type = ATTN_KV_F16;
    w.pos = w.slot = d.as<int32_t>();
    w.out = d.as<float>();
    w.n_rows = 1;
    w.n_heads = w.n_kv_heads = 1;
    w.head_dim = 64;
    w.n_ctx = 64;
    w.window = 8;
    w.blocks = d.as<int32_t>();
    w.kv_block_log2 = -1;
    CHECK(attn_window_launch(&w, 0) == cudaErrorInvalidValue, "the window kernel must refuse a negative block log2");
    CUDA_OK(cudaDeviceSynchronize());
}

int main(void) {
    if (test_cuda_start() != 0) return test_report();
    run_validation();
    const attn_kv_type T16[2] = {ATTN_KV_F16, ATTN_KV_BF16};
    for (int ti = 0; ti < 2; ti++) {
        const attn_kv_type t = T16[ti];
        /* type, n_seq, heads, kv heads, D, n_ctx, max_len, log2 block */
        const decode_case dc[] = {
            {t, 1, 9, 3, 64, 2048, 2048, 4},    /* SmolLM2-135M heads, batch 1 */
            {t, 5, 9, 3, 64, 2048, 1999, 6},    /* random lengths, some 0 */
            {t, 16, 32, 8, 128, 4096, 4096, 4}, /* llama heads, batch 16 */
            {t, 16, 32, 8, 128, 4096, 3000, 8},
            {t, 64, 8, 1, 64, 1024, 1024, 5},    /* GQA 8, batch 64 */
            {t, 2, 32, 8, 128, 40000, 40000, 4}, /* long rows: the split merge, many leaves */
            {t, 3, 16, 8, 128, 3000, 2900, 7},
            {t, 4, 32, 32, 96, 3000, 3000, 4}, /* head size 96: the chunk kernel only */
            {t, 7, 9, 3, 80, 2000, 1999, 6},   /* head size 80 */
            {t, 3, 8, 2, 64, 1000, 1000, 0},   /* blocks of 1 and 4: the chunk kernels */
            {t, 3, 8, 2, 64, 1000, 777, 2},
        };
        for (const auto &c : dc) run_decode(c);
        /* type, n_seq, heads, kv heads, D, n_ctx, max_rows, log2 block */
        const prefill_case pc[] = {
            {t, 1, 9, 3, 64, 1100, 1000, 4},  {t, 3, 8, 2, 128, 700, 300, 4},  {t, 4, 16, 2, 64, 600, 200, 6},
            {t, 5, 32, 8, 128, 1000, 129, 8}, {t, 3, 32, 32, 96, 500, 100, 5}, {t, 4, 9, 3, 80, 400, 120, 4},
            {t, 2, 8, 2, 64, 300, 65, 0},     {t, 6, 8, 2, 64, 300, 5, 2},
        };
        for (const auto &c : pc) run_prefill(c);
        run_window(t, 9, 8, 4, 256, 2000, 512, 4); /* gemma3 heads */
        run_window(t, 33, 9, 3, 64, 1000, 100, 6);
        run_window(t, 4, 8, 2, 128, 700, 700, 2);
    }
    /* F32 caches: the CUDA-core kernels */
    const decode_case f32d[] = {{ATTN_KV_F32, 1, 8, 4, 8, 512, 300, 4},
                                {ATTN_KV_F32, 16, 32, 8, 128, 2048, 2048, 4},
                                {ATTN_KV_F32, 4, 8, 8, 64, 20000, 20000, 8}};
    for (const auto &c : f32d) run_decode(c);
    const prefill_case f32p[] = {{ATTN_KV_F32, 3, 8, 4, 8, 512, 100, 4}, {ATTN_KV_F32, 2, 32, 8, 128, 400, 130, 6}};
    for (const auto &c : f32p) run_prefill(c);
    run_window(ATTN_KV_F32, 5, 8, 4, 64, 600, 128, 4);
    const cu_dtype ct[3] = {CU_F32, CU_F16, CU_BF16};
    for (int i = 0; i < 3; i++) {
        run_append(ct[i], 37, 9, 3, 64, 2048, 4);
        run_append(ct[i], 8, 32, 8, 128, 1000, 8);
        run_append(ct[i], 5, 8, 2, 64, 300, 0);
    }
    return test_report();
}
