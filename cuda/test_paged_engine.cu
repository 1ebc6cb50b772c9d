/* cuda/test_paged_engine.cu: the CUDA engine with paged KV (zl_engine_opts.kv_block) against the same engine with
 * contiguous slots, bit for bit. One contiguous engine and paged engines of blocks of 16 and 64 rows run the same
 * script of steps with the same entries: whole and chunked prompts, a prompt whose first 37 positions come from
 * another sequence (contiguous: engine_copy_kv; paged: the other sequence's full blocks shared read-only in the
 * table plus a copy_block of the partial one), decode-only steps (CUDA graphs), mixed steps, and pairs of steps
 * queued ahead with fed entries (zl_seq.feed). Paged tables take their blocks from a shuffled free list as the
 * sequences grow. Every step's ids, and its logits where the step takes them, must be the same bits as the
 * contiguous engine's; greedy and seeded sampled sequences. Also: the paged engine reports what it granted and
 * refuses a block size its kernels do not take, and a table entry out of the pool. argv[1]: a GGUF model (default:
 * the stories260K fixture). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
extern "C" {
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "test.h"
}
#include "test_util.cuh"

enum { NSEQ = 6, CTX = 256 };


/* one engine's view of the sequences: its block tables (paged) and generator states */
struct run {
    zl_engine *e = nullptr;
    int bs = 0;                     /* 0: contiguous slots */
    std::vector<int32_t> free_ids;  /* paged: shuffled free blocks */
    std::vector<int32_t> tab[NSEQ]; /* paged: each sequence's table */
    uint64_t rng[NSEQ];
    int ok = 1;
    /* the table of sequence i holds positions [0, n) */
    void cover(int i, int n) {
        while (bs && (int)tab[i].size() * bs < n) {
            if (free_ids.empty()) {
                ok = 0;
                tab[i].push_back(0);
                continue;
            }
            tab[i].push_back(free_ids.back());
            free_ids.pop_back();
        }
    }
};

struct seq_state {
    std::vector<int32_t> toks; /* prompt then generated */
    int n_prompt = 0, pos = 0; /* tokens in the KV */
    zl_sampling samp;
};

static seq_state S[NSEQ];
static std::vector<run *> R; /* R[0] contiguous, the others paged */
static int V;

/* entry list of one step: sequence, tokens from pos, count, sample, feed */
struct ent {
    int i, n, sample, feed;
};

/* builds the zl_seq entries of r for es */
static std::vector<zl_seq> s_seqs(run *r, const std::vector<ent> &es) {
    std::vector<zl_seq> q(es.size());
    for (size_t k = 0; k < es.size(); k++) {
        const ent &x = es[k];
        seq_state &s = S[x.i];
        zl_seq &z = q[k];
        memset(&z, 0, sizeof z);
        z.slot = x.i;
        z.pos = s.pos;
        z.n_tokens = x.n;
        z.tokens = x.feed ? NULL : s.toks.data() + s.pos;
        z.sample = x.sample;
        z.samp = &s.samp;
        z.rng = &r->rng[x.i];
        z.feed = x.feed;
        r->cover(x.i, s.pos + x.n);
        z.blocks = r->bs ? r->tab[x.i].data() : NULL;
    }
    return q;
}

/* one synchronous step on every engine: ids and logits compared with the contiguous engine's; the sampled ids
 * appended, positions advanced */
static void s_step(const char *what, const std::vector<ent> &es) {
    const int n = (int)es.size();
    std::vector<int32_t> ids0;
    std::vector<float> lg0;
    for (size_t ri = 0; ri < R.size(); ri++) {
        run *r = R[ri];
        std::vector<zl_seq> q = s_seqs(r, es);
        std::vector<int32_t> ids(n, -2);
        std::vector<float> lg((size_t)n * V);
        const int rc = engine_step(r->e, q.data(), n, ids.data(), lg.data());
        CHECK(rc == 0 && r->ok, "%s: step on %s (block %d): %s", what, r->e->device, r->bs, rc ? r->e->err : "pool");
        if (ri == 0) {
            ids0 = ids;
            lg0 = lg;
        } else {
            CHECK(ids == ids0 && memcmp(lg.data(), lg0.data(), lg.size() * 4) == 0,
                  "%s: blocks of %d give other ids or logits than contiguous slots", what, r->bs);
        }
    }
    for (int k = 0; k < n; k++) {
        seq_state &s = S[es[k].i];
        s.pos += es[k].n;
        if (es[k].sample && s.pos == (int)s.toks.size()) s.toks.push_back(ids0[k]);
    }
}

/* two steps queued ahead: es (sampling decodes), then each of them fed in the step behind; ids compared */
static void s_step_pair(const char *what, const std::vector<ent> &es) {
    const int n = (int)es.size();
    std::vector<ent> fed = es;
    for (auto &x : fed) x.feed = 1, x.n = 1, x.sample = 1;
    std::vector<int32_t> a0, b0;
    for (size_t ri = 0; ri < R.size(); ri++) {
        run *r = R[ri];
        /* both steps' blocks first: s_seqs hands out pointers into the tables, which a later cover may move */
        for (auto &x : es) r->cover(x.i, S[x.i].pos + 2);
        std::vector<zl_seq> qa = s_seqs(r, es);
        for (auto &x : es) S[x.i].pos += 1; /* the fed entries' positions */
        std::vector<zl_seq> qb = s_seqs(r, fed);
        for (auto &x : es) S[x.i].pos -= 1;
        std::vector<int32_t> a(n, -2), b(n, -2);
        zl_step sa, sb;
        memset(&sa, 0, sizeof sa);
        memset(&sb, 0, sizeof sb);
        sa.seqs = qa.data();
        sa.n = n;
        sa.out_tokens = a.data();
        sb.seqs = qb.data();
        sb.n = n;
        sb.out_tokens = b.data();
        int rc = engine_launch(r->e, &sa);
        if (rc == 0) rc = engine_launch(r->e, &sb);
        if (rc == 0) rc = engine_wait(r->e, &sa);
        if (rc == 0) rc = engine_wait(r->e, &sb);
        CHECK(rc == 0 && r->ok, "%s: queued steps on block %d: %s", what, r->bs, rc ? r->e->err : "pool");
        if (ri == 0) {
            a0 = a;
            b0 = b;
        } else {
            CHECK(a == a0 && b == b0, "%s: blocks of %d give other ids than contiguous slots (queued, fed)", what,
                  r->bs);
        }
    }
    for (int k = 0; k < n; k++) {
        seq_state &s = S[es[k].i];
        s.pos += 2;
        s.toks.push_back(a0[k]);
        s.toks.push_back(b0[k]);
    }
}

/* entries decoding every sequence in list (their last token) */
static std::vector<ent> s_decodes(std::initializer_list<int> list) {
    std::vector<ent> es;
    for (int i : list) es.push_back({i, 1, 1, 0});
    return es;
}

int main(int argc, char **argv) {
    s_rng = 12345;
    char path[1100], err[256];
    if (argc > 1) snprintf(path, sizeof path, "%s", argv[1]);
    else snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(path, err, sizeof err);
    CHECK(m != NULL, "model_load %s: %s", path, err);
    if (!m) return test_report();
    V = m->cfg.vocab_size;
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cuda";
    o.n_slots = o.max_batch = 8;
    o.n_ctx = CTX;
    o.max_step_tokens = 256;
    o.kv_mem = (size_t)512 << 20;
    { /* block sizes the kernels do not take are refused at creation */
        zl_engine_opts b = o;
        b.kv_block = 8;
        zl_engine *e = engine_new(m, &b, err, sizeof err);
        CHECK(!e && strstr(err, "16, 32, 64, 128 or 256"), "blocks of 8 rows: refused with a clear error (%s)", err);
        engine_destroy(&e);
    }
    run runs[3];
    const int sizes[3] = {0, 16, 64};
    for (int ri = 0; ri < 3; ri++) {
        zl_engine_opts b = o;
        b.kv_block = sizes[ri];
        b.kv_blocks = sizes[ri] ? NSEQ * (CTX / sizes[ri]) + 4 : 0;
        runs[ri].e = engine_new(m, &b, err, sizeof err);
        runs[ri].bs = sizes[ri];
        CHECK(runs[ri].e && runs[ri].e->kv_block == sizes[ri] && runs[ri].e->kv_blocks == b.kv_blocks &&
                  (!sizes[ri] || runs[ri].e->copy_block),
              "engine with kv_block %d: %s", sizes[ri], runs[ri].e ? "granted other" : err);
        if (!runs[ri].e) goto out;
        for (int k = 0; k < b.kv_blocks; k++) runs[ri].free_ids.push_back(k);
        for (int k = b.kv_blocks - 1; k > 0; k--) {
            const int j = (int)(rnd_u64() % (uint64_t)(k + 1));
            const int32_t x = runs[ri].free_ids[k];
            runs[ri].free_ids[k] = runs[ri].free_ids[j];
            runs[ri].free_ids[j] = x;
        }
        R.push_back(&runs[ri]);
    }
    { /* a table entry outside the pool is refused, nothing run */
        run *r = R[1];
        int32_t bad[2] = {0, r->e->kv_blocks};
        int32_t t[20] = {1};
        zl_seq z;
        memset(&z, 0, sizeof z);
        z.slot = 0;
        z.pos = 0;
        z.n_tokens = 20;
        z.tokens = t;
        z.sample = 0;
        z.blocks = bad;
        int32_t id;
        CHECK(engine_step(r->e, &z, 1, &id, NULL) == -1 && strstr(r->e->err, "block table"),
              "a block id past the pool: refused (%s)", r->e->err);
    }
    {
        const int plen[NSEQ] = {40, 45, 23, 5, 70, 17};
        for (int i = 0; i < NSEQ; i++) {
            seq_state &s = S[i];
            s.n_prompt = plen[i];
            for (int t = 0; t < plen[i]; t++) s.toks.push_back(t == 0 ? 1 : (int32_t)(rnd_u64() % (uint64_t)V));
            s.samp = sampler_defaults();
            if (i & 1) {
                s.samp.temperature = 0.8f;
                s.samp.top_k = 40;
                s.samp.seed = 100 + (uint64_t)i;
            }
            for (run *r : R) r->rng[i] = sampler_rng_init(s.samp.seed);
        }
        for (int t = 0; t < 38; t++) S[1].toks[t] = S[0].toks[t]; /* sequence 1 shares 0's first 38 tokens */
        s_step("prompts 0, 2, 3 whole", {{0, 40, 1, 0}, {2, 23, 1, 0}, {3, 5, 1, 0}});
        /* sequence 1 takes the KV of 0's first 37 positions */
        const int share = 37;
        for (run *r : R) {
            if (!r->bs) {
                CHECK(engine_copy_kv(r->e, 0, 1, share) == 0, "copy_kv: %s", r->e->err);
                continue;
            }
            const int full = share / r->bs, rem = share - full * r->bs;
            for (int k = 0; k < full; k++) r->tab[1].push_back(r->tab[0][k]); /* shared, read-only */
            if (rem) {
                r->cover(1, share);
                CHECK(r->e->copy_block(r->e, r->tab[0][full], r->tab[1][full], rem) == 0, "copy_block: %s", r->e->err);
            }
        }
        S[1].pos = share;
        s_step("prompt 1 after its shared prefix, with decodes",
               {{0, 1, 1, 0}, {1, 8, 1, 0}, {2, 1, 1, 0}, {3, 1, 1, 0}});
        for (int k = 0; k < 6; k++) s_step("decodes (graphs)", s_decodes({0, 1, 2, 3}));
        s_step("prompt 4's first chunk with decodes", {{3, 1, 1, 0}, {4, 30, 0, 0}, {0, 1, 1, 0}, {2, 1, 1, 0}});
        s_step("prompt 4's second chunk alone", {{4, 40, 1, 0}});
        s_step("prompt 5 with decodes", {{5, 17, 1, 0}, {0, 1, 1, 0}, {1, 1, 1, 0}, {4, 1, 1, 0}});
        for (int k = 0; k < 12; k++) s_step("decodes (graphs)", s_decodes({0, 1, 2, 3, 4, 5}));
        for (int k = 0; k < 8; k++) s_step_pair("queued pairs", s_decodes({5, 4, 3, 2, 1, 0}));
        for (int k = 0; k < 4; k++) s_step("decodes after queued pairs", s_decodes({1, 3, 5}));
        for (run *r : R) CHECK(r->ok, "the pool of block %d held every table", r->bs);
        printf("%d sequences, %zu engines (contiguous, blocks of 16 and 64): lengths", NSEQ, R.size());
        for (int i = 0; i < NSEQ; i++) printf(" %d", S[i].pos);
        printf("\n");
    }
out:
    for (int ri = 0; ri < 3; ri++) engine_destroy(&runs[ri].e);
    model_destroy(&m);
    return test_report();
}
