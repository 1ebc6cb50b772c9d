/* cuda/test_sample_mask.cu: structured output's mask on the GPU (cuda/sample_mask.cu) and through the CUDA engine.
 *  - the kernel against engine/sampler_mask.c on random logits and masks (dense, sparse, all-ones, one id; a
 *    vocabulary that is not a multiple of 32; rows without the flag untouched): bit for bit; the late form over
 *    mapped host memory rewritten between two launches: the second applies the new masks;
 *  - the input block's layout (cuda_step_layout): regions in order, large enough, aligned;
 *  - the wait for late masks across the counter's wrap (a flag at 2^32 - 1 still waits for 0), and its cost in a
 *    graph when it has nothing to wait for (printed; a few microseconds);
 *  - the GPU sampler after the mask, greedy and with temperature/top-k/top-p: every id drawn is allowed;
 *  - the CUDA engine on stories260K ($ZLLM_FIXTURES, or the model given as argv[1]): decode steps of 8 sequences
 *    (graph replays and eager steps), each with its own mask (random subsets, a single allowed id, none on some),
 *    greedy and sampled: every sampled id is allowed, a single allowed id is taken, and an unmasked sequence's ids
 *    equal those of the same step without any mask in the batch (the mask changes nothing else);
 *  - late masks (zl_seq.mask_late): a step queued behind another, its constrained entries fed, their masks written
 *    after the first step is collected and announced with engine_masks_ready: every id drawn is allowed, graph
 *    replays (whose wait passes at once for a step without late masks) draw exactly the ids of eager steps, the
 *    flights' counters wrap; waiting without the announcement does not hang (the rows go unmasked); a synchronous
 *    step with a late mask and an announcement for a step without late masks are refused. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vector>
extern "C" {
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "sampler_mask.h"
#include "test.h"
}
#include "cu_engine.h"
#include "sample.h"
#include "sample_mask.h"
#include "test_util.cuh"


/* a random mask of one of a few shapes over vocab ids (never empty) */
static void rnd_mask(uint32_t *m, int vocab, int shape) {
    const int words = sample_mask_words(vocab);
    for (int w = 0; w < words; w++) {
        uint32_t x = (uint32_t)rnd_u64();
        m[w] = shape == 0   ? x
               : shape == 1 ? x & (uint32_t)rnd_u64() & (uint32_t)rnd_u64()
               : shape == 2 ? 0xFFFFFFFFu
                            : 0;
    }
    if (shape == 3 || shape == 1) {
        const int id = (int)(rnd_u64() % (uint64_t)vocab);
        m[id >> 5] |= 1u << (id & 31);
    }
    if (vocab % 32) m[words - 1] &= (1u << (vocab % 32)) - 1; /* bits past the vocabulary stay clear */
}

static int allowed(const uint32_t *m, int id) { return id >= 0 && (m[id >> 5] >> (id & 31) & 1); }

static void test_kernel(int vocab, int rows) {
    const int words = sample_mask_words(vocab);
    std::vector<float> lg((size_t)rows * vocab), ref;
    std::vector<uint32_t> mask((size_t)rows * words);
    std::vector<int32_t> on(rows);
    for (auto &x : lg) x = rnd_unit() * 20.0f - 10.0f;
    for (int r = 0; r < rows; r++) {
        rnd_mask(&mask[(size_t)r * words], vocab, r % 4);
        on[r] = r % 5 != 4;
    }
    ref = lg;
    for (int r = 0; r < rows; r++)
        if (on[r]) sampler_mask_apply(&ref[(size_t)r * vocab], vocab, &mask[(size_t)r * words]);
    float *d_lg;
    uint32_t *d_mask;
    int32_t *d_on, *d_out;
    CUDA_OK(cudaMalloc(&d_lg, lg.size() * 4));
    CUDA_OK(cudaMalloc(&d_mask, mask.size() * 4));
    CUDA_OK(cudaMalloc(&d_on, rows * 4));
    CUDA_OK(cudaMalloc(&d_out, rows * 4));
    CUDA_OK(cudaMemcpy(d_lg, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_mask, mask.data(), mask.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_on, on.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK(sample_mask_launch(d_lg, vocab, rows, vocab, d_on, d_mask, 0) == cudaSuccess, "launch");
    std::vector<float> got(lg.size());
    CUDA_OK(cudaMemcpy(got.data(), d_lg, got.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got.data(), ref.data(), got.size() * 4) == 0, "vocab %d: masked logits differ from the CPU's", vocab);
    CHECK(sample_mask_launch(d_lg, vocab - 1, rows, vocab, d_on, d_mask, 0) == cudaErrorInvalidValue,
          "a stride below the vocabulary is refused");
    {
        /* the late form over masks in mapped host memory, rewritten by the host between two launches: the second
         * launch applies the new masks (nothing cached from the first read), bit for bit as the CPU */
        uint32_t *h_m, *d_m;
        CUDA_OK(cudaHostAlloc((void **)&h_m, mask.size() * 4, cudaHostAllocMapped));
        CUDA_OK(cudaHostGetDevicePointer((void **)&d_m, h_m, 0));
        float *d_lg2;
        CUDA_OK(cudaMalloc(&d_lg2, lg.size() * 4));
        std::vector<uint32_t> mask2(mask.size());
        for (int r = 0; r < rows; r++) rnd_mask(&mask2[(size_t)r * words], vocab, (r + 1) % 4);
        std::vector<float> ref2 = lg;
        for (int r = 0; r < rows; r++)
            if (on[r]) sampler_mask_apply(&ref2[(size_t)r * vocab], vocab, &mask2[(size_t)r * words]);
        for (int pass = 0; pass < 2; pass++) {
            memcpy(h_m, pass ? mask2.data() : mask.data(), mask.size() * 4);
            CUDA_OK(cudaMemcpy(d_lg2, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
            CHECK(sample_mask_late_launch(d_lg2, vocab, rows, vocab, d_on, d_m, 0) == cudaSuccess, "late launch");
            std::vector<float> got2(lg.size());
            CUDA_OK(cudaMemcpy(got2.data(), d_lg2, got2.size() * 4, cudaMemcpyDeviceToHost));
            CHECK(memcmp(got2.data(), (pass ? ref2 : ref).data(), got2.size() * 4) == 0,
                  "vocab %d pass %d: late-masked logits differ from the CPU's", vocab, pass);
        }
        cudaFree(d_lg2);
        cudaFreeHost(h_m);
    }
    /* the sampler after the mask: greedy, then temperature with top-k / top-p, several seeds */
    for (int mode = 0; mode < 3; mode++) {
        std::vector<zl_sampling> par(rows, sampler_defaults());
        std::vector<uint64_t> rng(rows);
        for (int r = 0; r < rows; r++) {
            if (mode > 0) par[r].temperature = mode == 1 ? 1.0f : 2.5f;
            if (mode == 2) par[r].top_k = 40, par[r].top_p = 0.9f;
            rng[r] = sampler_rng_init(rnd_u64());
        }
        zl_sampling *d_par;
        uint64_t *d_rng;
        CUDA_OK(cudaMalloc(&d_par, rows * sizeof(zl_sampling)));
        CUDA_OK(cudaMalloc(&d_rng, rows * 8));
        CUDA_OK(cudaMemcpy(d_par, par.data(), rows * sizeof(zl_sampling), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_rng, rng.data(), rows * 8, cudaMemcpyHostToDevice));
        int bad = 0;
        for (int rep = 0; rep < 20; rep++) {
            sample_params sp;
            memset(&sp, 0, sizeof sp);
            sp.logits = d_lg;
            sp.n_rows = rows;
            sp.vocab = vocab;
            sp.params = d_par;
            sp.rng_state = d_rng;
            sp.out = d_out;
            CHECK(sample_launch(&sp, 0) == cudaSuccess, "sample_launch");
            std::vector<int32_t> out(rows);
            CUDA_OK(cudaMemcpy(out.data(), d_out, rows * 4, cudaMemcpyDeviceToHost));
            for (int r = 0; r < rows; r++) bad += on[r] && !allowed(&mask[(size_t)r * words], out[r]);
            if (mode == 0) break;
        }
        CHECK(bad == 0, "vocab %d mode %d: %d draws outside the mask", vocab, mode, bad);
        cudaFree(d_par);
        cudaFree(d_rng);
    }
    cudaFree(d_lg);
    cudaFree(d_mask);
    cudaFree(d_on);
    cudaFree(d_out);
}

/* decode steps of NS sequences on the CUDA engine with masks, against the same steps unmasked */
#define NS 8
static void test_engine(const char *path) {
    char err[256];
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "model_load %s: %s", path, err);
    if (!m) return;
    const int vocab = m->cfg.vocab_size, words = sample_mask_words(vocab);
    for (int graphs = 1; graphs >= 0; graphs--) {
        zl_engine_opts o;
        memset(&o, 0, sizeof o);
        o.device = "cuda";
        o.n_slots = 2 * NS;
        o.max_batch = 2 * NS;
        o.n_ctx = 128;
        o.max_step_tokens = 256;
        o.no_graphs = !graphs;
        o.kv_mem = (size_t)1 << 28;
        zl_engine *e = engine_new(m, &o, err, sizeof err);
        CHECK(e != NULL, "engine_new: %s", err);
        if (!e) continue;
        CHECK(e->masks == 1, "the CUDA engine says it applies masks");
        std::vector<uint32_t> mask((size_t)NS * words);
        std::vector<int32_t> tok(NS), tok2(NS), out(NS), out2(NS);
        std::vector<uint64_t> rng(NS), rng2(NS);
        std::vector<zl_sampling> par(NS, sampler_defaults());
        for (int i = 0; i < NS; i++) {
            tok[i] = tok2[i] = 1 + (int)(rnd_u64() % (uint64_t)(vocab - 1));
            if (i % 2) par[i].temperature = 0.8f, par[i].top_p = 0.95f;
            rng[i] = rng2[i] = sampler_rng_init(100 + i);
        }
        int bad = 0, single_ok = 0, single = 0, same = 0, unmasked = 0;
        for (int step = 0; step < 24; step++) {
            zl_seq q[NS], q2[NS];
            for (int i = 0; i < NS; i++) {
                rnd_mask(&mask[(size_t)i * words], vocab, (step + i) % 4);
                /* slots NS.. run the same sequences unmasked: the reference for rows without a mask */
                memset(&q[i], 0, sizeof q[i]);
                q[i].slot = i;
                q[i].pos = step;
                q[i].n_tokens = 1;
                q[i].tokens = &tok[i];
                q[i].sample = 1;
                q[i].samp = &par[i];
                q[i].rng = &rng[i];
                q[i].mask = i % 4 == 3 ? NULL : &mask[(size_t)i * words];
                q2[i] = q[i];
                q2[i].slot = NS + i;
                q2[i].tokens = &tok2[i];
                q2[i].rng = &rng2[i];
                q2[i].mask = NULL;
            }
            if (engine_step(e, q, NS, out.data(), NULL) != 0 || engine_step(e, q2, NS, out2.data(), NULL) != 0) {
                CHECK(0, "step %d: %s", step, e->err);
                break;
            }
            for (int i = 0; i < NS; i++) {
                if (q[i].mask) {
                    bad += !allowed(q[i].mask, out[i]);
                    int n_allowed = 0;
                    for (int w = 0; w < words; w++) n_allowed += __builtin_popcount(q[i].mask[w]);
                    if (n_allowed == 1) single++, single_ok += allowed(q[i].mask, out[i]);
                } else {
                    unmasked++;
                    same += out[i] == out2[i];
                }
                tok[i] = out[i];
                tok2[i] = out2[i];
                rng2[i] = rng[i]; /* keep the two copies on one generator stream */
            }
        }
        CHECK(bad == 0, "graphs %d: %d sampled ids outside their masks", graphs, bad);
        CHECK(single == single_ok, "graphs %d: %d of %d single-id masks gave that id", graphs, single_ok, single);
        CHECK(unmasked > 0 && same == unmasked, "graphs %d: unmasked rows equal the unmasked run: %d of %d", graphs,
              same, unmasked);
        engine_destroy(&e);
    }
    model_destroy(&m);
}

/* one pair of steps: A (prompt tokens, sampling), B queued behind it with every entry fed and late masks on
 * the even ones; announce: call engine_masks_ready between waiting for A and for B */
static void s_late_pair(zl_engine *e, int vocab, int pos, int announce, int *bad, int *checked,
                        std::vector<int32_t> *ids) {
    const int words = sample_mask_words(vocab);
    std::vector<uint32_t> mask((size_t)NS * words);
    std::vector<int32_t> tok(NS), outa(NS), outb(NS);
    std::vector<uint64_t> rng(NS);
    std::vector<zl_sampling> par(NS, sampler_defaults());
    zl_seq a[NS], b[NS];
    for (int i = 0; i < NS; i++) {
        tok[i] = 1 + (int)(rnd_u64() % (uint64_t)(vocab - 1));
        if (i % 4 == 1) par[i].temperature = 0.7f;
        rng[i] = sampler_rng_init(31 + i);
        memset(&a[i], 0, sizeof a[i]);
        a[i].slot = i;
        a[i].pos = pos;
        a[i].n_tokens = 1;
        a[i].tokens = &tok[i];
        a[i].sample = 1;
        a[i].samp = &par[i];
        a[i].rng = &rng[i];
        b[i] = a[i];
        b[i].pos = pos + 1;
        b[i].tokens = NULL;
        b[i].feed = 1;
        b[i].mask = i % 2 == 0 ? &mask[(size_t)i * words] : NULL;
        b[i].mask_late = i % 2 == 0;
        for (int w = 0; w < words; w++) mask[(size_t)i * words + w] = 0; /* nothing allowed until written */
    }
    zl_step sa, sb;
    memset(&sa, 0, sizeof sa);
    sa.seqs = a;
    sa.n = NS;
    sa.out_tokens = outa.data();
    sb = sa;
    sb.seqs = b;
    sb.out_tokens = outb.data();
    CHECK(engine_launch(e, &sa) == 0, "launch A: %s", e->err);
    CHECK(engine_launch(e, &sb) == 0, "launch B with late masks: %s", e->err);
    CHECK(engine_wait(e, &sa) == 0, "wait A: %s", e->err);
    for (int i = 0; i < NS; i += 2) rnd_mask(&mask[(size_t)i * words], vocab, (pos + i) % 4);
    if (announce) CHECK(engine_masks_ready(e, &sb) == 0, "masks_ready: %s", e->err);
    CHECK(engine_wait(e, &sb) == 0, "wait B: %s", e->err);
    ids->insert(ids->end(), outa.begin(), outa.end());
    ids->insert(ids->end(), outb.begin(), outb.end());
    if (!announce) return;
    for (int i = 0; i < NS; i += 2) {
        *bad += !allowed(&mask[(size_t)i * words], outb[i]);
        (*checked)++;
    }
}

/* late masks on an engine with graphs (whose decode graphs hold the wait: steps with late masks replay them) and
 * on one without (eager steps): the same steps from the same random state draw the same ids on both, every id of
 * a late-masked row is allowed, the flights' counters cross their wrap on the way, and a step whose late masks
 * are never announced is waited for without hanging (alarm in main) */
static void test_late(const char *path) {
    char err[256];
    zl_model *m = model_load(path, err, sizeof err);
    if (!m) return;
    std::vector<int32_t> ids[2];
    for (int graphs = 1; graphs >= 0; graphs--) {
        zl_engine_opts o;
        memset(&o, 0, sizeof o);
        o.device = "cuda";
        o.n_slots = NS;
        o.max_batch = NS;
        o.n_ctx = 128;
        o.max_step_tokens = 256;
        o.no_graphs = !graphs;
        o.kv_mem = (size_t)1 << 28;
        zl_engine *e = engine_new(m, &o, err, sizeof err);
        CHECK(e != NULL, "engine_new: %s", err);
        if (!e) continue;
        cu_engine *E = (cu_engine *)e;
        CHECK(e->masks_late == 1, "the CUDA engine takes late masks");
        CHECK(E->graph_late == graphs, "graphs %d: the decode graphs hold the wait for late masks: %d", graphs,
              E->graph_late);
        for (int i = 0; i < 2; i++) { /* 20 late steps per flight from here cross the counter's wrap */
            E->fl[i].lseq = 0xFFFFFFF8u;
            *E->fl[i].h_lflag = 0xFFFFFFF8u;
        }
        s_rng = 0x1A7E; /* the same tokens and masks on both engines */
        int bad = 0, checked = 0;
        for (int p = 0; p < 40; p += 2) s_late_pair(e, m->cfg.vocab_size, p, 1, &bad, &checked, &ids[graphs]);
        CHECK(checked > 0 && bad == 0, "graphs %d: late masks: %d of %d ids outside their masks", graphs, bad, checked);
        s_late_pair(e, m->cfg.vocab_size, 60, 0, &bad, &checked, &ids[graphs]); /* returns: no hang */
        CHECK(1, "graphs %d: a step with late masks never announced was waited for", graphs);
        /* refusals */
        std::vector<uint32_t> mk((size_t)sample_mask_words(m->cfg.vocab_size), 0xFFFFFFFFu);
        int32_t t = 5, out = -1;
        zl_seq q;
        memset(&q, 0, sizeof q);
        q.slot = 0;
        q.pos = 0;
        q.n_tokens = 1;
        q.tokens = &t;
        q.sample = 1;
        q.mask = mk.data();
        q.mask_late = 1;
        CHECK(engine_step(e, &q, 1, &out, NULL) == -1 && strstr(e->err, "late mask"),
              "a synchronous step with a late mask is refused: %s", e->err);
        q.mask_late = 0;
        zl_step st;
        memset(&st, 0, sizeof st);
        st.seqs = &q;
        st.n = 1;
        st.out_tokens = &out;
        CHECK(engine_launch(e, &st) == 0, "launch: %s", e->err);
        CHECK(engine_masks_ready(e, &st) == -1, "masks_ready on a step without late masks is refused");
        CHECK(engine_wait(e, &st) == 0 && out >= 0, "wait: %s", e->err);
        engine_destroy(&e);
    }
    size_t same = 0;
    for (size_t i = 0; i < ids[0].size() && i < ids[1].size(); i++) same += ids[0][i] == ids[1][i];
    CHECK(!ids[0].empty() && ids[0].size() == ids[1].size() && same == ids[0].size(),
          "late masks: graph replays draw the eager steps' ids: %zu of %zu", same, ids[0].size());
    model_destroy(&m);
}

/* the input block's layout (cuda_step_layout): every field of the core before core_end, then hist, mask and the
 * extras in that order, each region as large as what is staged into it and 256-byte aligned, up to the largest
 * vocabulary and batch served (the copy lengths of cuda_step_run are prefixes ending at these marks) */
static void test_layout(void) {
    const int shapes[][3] = {{16, 1, 32}, {256, 16, 37}, {4096, 64, 151936}, {8192, 256, 262144}, {512, 256, 49152}};
    for (const auto &sh : shapes) {
        const int T = sh[0], B = sh[1], V = sh[2];
        cu_inputs in;
        const size_t TAB = (size_t)B * 9 + 1; /* paged tables: a context of 9 blocks per entry and the sentinel */
        cuda_step_layout(&in, T, B, V, TAB);
        const size_t W = (size_t)sample_mask_words(V);
        struct {
            size_t off, bytes;
        } core[] = {{in.rng, (size_t)B * 8},
                    {in.out_tok, (size_t)B * 4},
                    {in.tokens, (size_t)T * 4},
                    {in.pos, (size_t)T * 4},
                    {in.slot, (size_t)T * 4},
                    {in.kv_len, (size_t)B * 4},
                    {in.seq_row0, (size_t)B * 4},
                    {in.seq_rows, (size_t)B * 4},
                    {in.seq_slot, (size_t)B * 4},
                    {in.seq_pos0, (size_t)B * 4},
                    {in.last_row, (size_t)B * 4},
                    {in.eslot, (size_t)B * 4},
                    {in.hist_len, (size_t)B * 4},
                    {in.params, (size_t)B * sizeof(zl_sampling)},
                    {in.perm, (size_t)T * 4},
                    {in.hptr, 16},
                    {in.mask_on, (size_t)B * 4},
                    {in.mask_late_on, (size_t)B * 4},
                    {in.lwant, 4},
                    {in.pslot, (size_t)T * 4},
                    {in.pseq, (size_t)B * 4}};
        int ok = in.rng == 0 && in.out_tok == (size_t)B * 8 && in.mask_words == (int)W;
        for (size_t i = 0; i + 1 < sizeof core / sizeof core[0]; i++)
            ok &= core[i].off + core[i].bytes <= core[i + 1].off;
        ok &= in.pseq + (size_t)B * 4 <= in.core_end && in.hist == in.core_end;
        ok &= in.hist + (size_t)B * CU_HIST * 4 <= in.hist_end && in.hist_end <= in.mask;
        ok &= in.mask + (size_t)B * W * 4 <= in.mask_end && in.mask_end <= in.bias_n;
        ok &= in.bias_n + (size_t)B * 4 <= in.bias_id && in.bias_id + (size_t)B * ZL_MAX_LOGIT_BIAS * 4 <= in.bias_v;
        ok &= in.bias_v + (size_t)B * ZL_MAX_LOGIT_BIAS * 4 <= in.gen_n && in.gen_n + (size_t)B * 4 <= in.gen_id;
        ok &= in.gen_id + (size_t)B * CU_GEN * 4 <= in.gen_cnt && in.gen_cnt + (size_t)B * CU_GEN * 4 <= in.plp_row;
        ok &= in.plp_end <= in.tab && in.tab + TAB * 4 <= in.total;
        const size_t al[] = {in.tokens, in.mask_on, in.mask_late_on, in.lwant,  in.hist,
                             in.mask,   in.bias_n,  in.bias_id,      in.bias_v, in.gen_n,
                             in.gen_id, in.gen_cnt, in.total,        in.pslot,  in.tab};
        for (size_t a : al) ok &= a % 256 == 0;
        CHECK(ok, "input block layout for max_tok %d, max_batch %d, vocab %d", T, B, V);
    }
}

/* the wait for late masks compares the wrapping counter as a signed difference: a flag at 2^32 - 1 has not reached
 * a wanted 0 (the value after it), 0 has */
static void test_wait_wrap(void) {
    uint32_t *h_flag, *d_flag, *d_want;
    CUDA_OK(cudaHostAlloc((void **)&h_flag, 64, cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&d_flag, h_flag, 0));
    CUDA_OK(cudaMalloc(&d_want, 4));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const uint32_t cases[][2] = {{0xFFFFFFFFu, 0u}, {0u, 1u}, {0x7FFFFFFFu, 0x80000000u}};
    for (int c = 0; c < 3; c++) {
        *(volatile uint32_t *)h_flag = cases[c][0];
        CUDA_OK(cudaMemcpy(d_want, &cases[c][1], 4, cudaMemcpyHostToDevice));
        CHECK(sample_mask_wait_launch(d_flag, d_want, st) == cudaSuccess, "wait launch");
        usleep(50000);
        CHECK(cudaStreamQuery(st) == cudaErrorNotReady, "flag %#x before want %#x: still waiting", cases[c][0],
              cases[c][1]);
        __sync_synchronize();
        *(volatile uint32_t *)h_flag = cases[c][1];
        __sync_synchronize();
        CHECK(cudaStreamSynchronize(st) == cudaSuccess, "flag %#x reached: the wait returns", cases[c][1]);
        /* a flag past the wanted value releases at once */
        *(volatile uint32_t *)h_flag = cases[c][1] + 5u;
        CHECK(sample_mask_wait_launch(d_flag, d_want, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess,
              "flag past want %#x: no wait", cases[c][1]);
    }
    cudaStreamDestroy(st);
    cudaFree(d_want);
    cudaFreeHost(h_flag);
}

/* what a decode graph pays for holding the wait when a step has no late masks: the wait on a flag already
 * reached and the late-mask kernel with no row on (64 rows of a 49152-id vocabulary), captured 100 times in a
 * graph and replayed; prints the cost per step, which must stay a few microseconds */
static void test_noop_wait_cost(void) {
    const int rows = 64, vocab = 49152, words = sample_mask_words(vocab), reps = 100;
    uint32_t *h_flag, *d_flag, *d_want, *h_lmask, *d_lmask;
    int32_t *d_on;
    float *d_lg;
    CUDA_OK(cudaHostAlloc((void **)&h_flag, 64, cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&d_flag, h_flag, 0));
    CUDA_OK(cudaHostAlloc((void **)&h_lmask, (size_t)rows * words * 4, cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&d_lmask, h_lmask, 0));
    CUDA_OK(cudaMalloc(&d_want, 4));
    CUDA_OK(cudaMalloc(&d_on, rows * 4));
    CUDA_OK(cudaMalloc(&d_lg, (size_t)rows * vocab * 4));
    CUDA_OK(cudaMemset(d_on, 0, rows * 4));
    *(volatile uint32_t *)h_flag = 7u;
    const uint32_t want = 7u;
    CUDA_OK(cudaMemcpy(d_want, &want, 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    int ok = 1;
    for (int i = 0; i < reps; i++) {
        ok &= sample_mask_wait_launch(d_flag, d_want, st) == cudaSuccess;
        ok &= sample_mask_late_launch(d_lg, vocab, rows, vocab, d_on, d_lmask, st) == cudaSuccess;
    }
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, st));
    for (int i = 0; i < 10; i++) CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaEventRecord(e1, st));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = ms * 1000.0 / (10.0 * reps);
    printf("a decode graph's wait and late-mask kernel without late masks: %.2f us per step\n", us);
    CHECK(ok && us < 20.0, "the no-op wait costs %.2f us per step (launches ok: %d)", us, ok);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    cudaFree(d_want);
    cudaFree(d_on);
    cudaFree(d_lg);
    cudaFreeHost(h_lmask);
    cudaFreeHost(h_flag);
}

int main(int argc, char **argv) {
    s_rng = 0x5EED;
    alarm(300); /* a device waiting for late masks that never come ends the test instead of hanging it */
    test_layout();
    test_wait_wrap();
    test_noop_wait_cost();
    test_kernel(37, 9);
    test_kernel(49152, 64);
    test_kernel(151936, 5);
    char path[1024];
    if (argc > 1) snprintf(path, sizeof path, "%s", argv[1]);
    else snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    test_engine(path);
    test_late(path);
    return test_report();
}
