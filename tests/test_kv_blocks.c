/* tests/test_kv_blocks.c: the KV block pool, block tables and chained prefix hashes (docs/kv-cache.md):
 * SipHash-2-4 against its reference vector, chained hashes (a block's hash depends on every block before it and
 * on the model), sharing of cached prefixes (refcounts, the last prompt token always computed), release into the
 * LRU pool, eviction order (oldest release first, a prefix's tail before its head), refcount underflow and
 * overflow refused without effect, admission by blocks (prompt + headroom, not prompt + max_tokens), growth a
 * block at a time and publication that dedupes equal blocks.
 * tests/test_kv_mutants.sh builds this file against broken copies of the sources and requires it to fail. */
#include "test.h"
#include "kv_blocks.h"
#include "kv_hash.h"
#include "kv_table.h"

#include <stdint.h>

#define BS 4

static void fill(int32_t *t, int n, int32_t base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void test_siphash(void) {
    uint8_t key[16], msg[64];
    for (int i = 0; i < 16; i++) key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++) msg[i] = (uint8_t)i;
    uint64_t k0 = 0, k1 = 0;
    for (int i = 7; i >= 0; i--) {
        k0 = k0 << 8 | key[i];
        k1 = k1 << 8 | key[8 + i];
    }
    /* the SipHash paper's vectors: 15-byte message 00..0e, and the empty message */
    CHECK(kv_hash_sip(k0, k1, msg, 15) == 0xa129ca6149be45e5ull, "siphash-2-4 reference vector (15 bytes)");
    CHECK(kv_hash_sip(k0, k1, msg, 0) == 0x726fdb47dd0e0e31ull, "siphash-2-4 reference vector (empty)");
}

static void test_chain(void) {
    uint64_t key = kv_hash_model("m", 1), key2 = kv_hash_model("n", 1);
    int32_t a[3 * BS], b[3 * BS];
    fill(a, 3 * BS, 100);
    fill(b, 3 * BS, 100);
    b[0] = 7; /* differs in block 0 only */
    uint64_t ha[3], hb[3], hc[3];
    CHECK(kv_hash_prompt(key, a, 3 * BS, BS, ha, 3) == 3, "three full blocks");
    CHECK(kv_hash_prompt(key, a, 3 * BS + 2, BS, hc, 3) == 3, "a partial block is not hashed");
    CHECK(ha[0] == kv_hash_block(key, 0, a, BS) && ha[1] == kv_hash_block(key, ha[0], a + BS, BS) &&
              ha[2] == kv_hash_block(key, ha[1], a + 2 * BS, BS),
          "each hash chains the previous one");
    kv_hash_prompt(key, b, 3 * BS, BS, hb, 3);
    CHECK(hb[0] != ha[0] && hb[1] != ha[1] && hb[2] != ha[2], "a change in block 0 changes every later hash");
    CHECK(kv_hash_block(key, 0, a + BS, BS) != ha[1], "the same tokens at another position hash differently");
    kv_hash_prompt(key2, a, 3 * BS, BS, hc, 3);
    CHECK(hc[0] != ha[0] && hc[2] != ha[2], "the model is part of the hash");
    CHECK(kv_hash_prompt(key, a, 4, 0, hc, 3) == -1 && kv_hash_prompt(key, a, 4, KV_BLOCK_MAX + 1, hc, 3) == -1,
          "bad block sizes refused");
    /* the Python copy in tests/broker_fake.py must give these bits: a fixed vector both sides check */
    int32_t v[BS] = {1, 2, 3, 4};
    CHECK(kv_hash_block(kv_hash_model("stories260K", 11), 0, v, BS) == 0x632426691270953dull, "fixed vector: %#llx",
          (unsigned long long)kv_hash_block(kv_hash_model("stories260K", 11), 0, v, BS));
}

static void test_share_release_evict(void) {
    char err[128];
    uint64_t key = kv_hash_model("m", 1);
    kv_pool *p = kv_pool_new(16, BS, err, sizeof err);
    CHECK(p != NULL, "pool: %s", err);
    if (!p) return;
    int32_t sys[3 * BS + 2];
    fill(sys, 3 * BS + 2, 1000); /* 3 full blocks + 2 */
    kv_table a = {0}, b = {0}, c = {0};
    CHECK(kv_table_admit(p, &a, key, sys, 3 * BS + 2, 1000, 1, 1) == 0, "A admitted");
    CHECK(a.n_blocks == 4 && a.n_cached == 0 && kv_pool_used(p) == 4, "A: 4 blocks for 14 tokens, none cached");
    CHECK(kv_table_publish(p, &a, key, sys, 3 * BS + 2) == 3, "A publishes its 3 full blocks");
    /* B: the same 3 blocks then its own tail: shares all 3 */
    int32_t pb[4 * BS];
    memcpy(pb, sys, sizeof(int32_t) * 3 * BS);
    fill(pb + 3 * BS, BS, 5000);
    CHECK(kv_table_admit(p, &b, key, pb, 4 * BS, 10, 1, 1) == 0, "B admitted");
    CHECK(b.n_cached == 3 * BS && b.blocks[0] == a.blocks[0] && b.blocks[2] == a.blocks[2] && b.n_blocks == 4,
          "B shares A's 3 blocks (cached %d)", b.n_cached);
    CHECK(kv_pool_refcount(p, a.blocks[0]) == 2 && kv_pool_refcount(p, a.blocks[3]) == 1, "refcounts 2 and 1");
    /* a prompt exactly 3 blocks long: the last token is always computed, so only 2 blocks come from the cache */
    CHECK(kv_table_cached_prefix(p, key, sys, 3 * BS) == 2, "last prompt token never cached");
    CHECK(kv_table_cached_prefix(p, key, sys, 3 * BS + 1) == 3, "one token past the blocks: all 3 cached");
    /* the second block's tokens at position 0: another prefix, no match (the chain covers what precedes it) */
    CHECK(kv_table_cached_prefix(p, key, sys + BS, 2 * BS + 2) == 0, "a block is found only after its prefix");
    CHECK(kv_table_cached_prefix(p, kv_hash_model("n", 1), sys, 3 * BS + 2) == 0, "another model finds nothing");
    int shared0 = a.blocks[0], own_a = a.blocks[3];
    kv_table_release(p, &a);
    CHECK(kv_pool_refcount(p, shared0) == 1, "A's release leaves B's reference on the shared block");
    CHECK(kv_pool_refcount(p, own_a) == 0 && kv_pool_published(p, own_a, NULL) == 0, "A's own tail block is free");
    /* every block a new allocation can take is neither B's nor in use */
    int got[16], ng = 0, clash = 0;
    while (ng < 16 && (got[ng] = kv_pool_alloc(p)) >= 0) {
        for (int i = 0; i < b.n_blocks; i++) clash += got[ng] == b.blocks[i];
        ng++;
    }
    CHECK(clash == 0 && ng == 16 - 4, "allocation never hands out a shared block (%d taken, %d clashes)", ng, clash);
    for (int i = 0; i < ng; i++) kv_pool_unref(p, got[i]);
    CHECK(kv_pool_free(p) == 12 && kv_pool_used(p) == 4, "given back");
    /* B ends: its 3 shared blocks stay cached (published), its tail (unpublished) goes free */
    CHECK(kv_table_publish(p, &b, key, pb, 4 * BS) == 1, "B publishes its 4th block");
    int b0 = b.blocks[0], b3 = b.blocks[3];
    kv_table_release(p, &b);
    CHECK(kv_pool_cached(p) == 4 && kv_pool_used(p) == 0 && kv_pool_available(p) == 16, "4 cached, all available");
    /* C reuses the cached prefix after every sequence ended */
    CHECK(kv_table_admit(p, &c, key, pb, 4 * BS, 4, 0, 1) == 0 && c.n_cached == 3 * BS && c.blocks[0] == b0,
          "a cached prefix is reused after its sequences ended (cached %d)", c.n_cached);
    CHECK(kv_pool_cached(p) == 1 && kv_pool_refcount(p, b0) == 1, "revived blocks leave the LRU");
    kv_table_release(p, &c);
    /* eviction: fill the free list, then new allocations take the oldest released first: the tail (block 3) was
     * released first, the head (block 0) last */
    int free_n = kv_pool_free(p);
    for (int i = 0; i < free_n; i++) kv_pool_alloc(p);
    int e1 = kv_pool_alloc(p), e2 = kv_pool_alloc(p);
    CHECK(e1 == b3 && e2 == c.blocks[2], "LRU: tail evicted first (%d %d vs %d %d)", e1, e2, b3, c.blocks[2]);
    CHECK(kv_pool_evictions(p) == 2 && kv_pool_lookup(p, 0, pb) == -1, "evicted blocks leave the index");
    CHECK(kv_table_cached_prefix(p, key, pb, 4 * BS) == 2, "the prefix's head is still cached");
    kv_table_free(&a);
    kv_table_free(&b);
    kv_table_free(&c);
    kv_pool_destroy(&p);
    CHECK(p == NULL, "destroy clears");
}

static void test_refcounts(void) {
    char err[128];
    kv_pool *p = kv_pool_new(4, BS, err, sizeof err);
    if (!p) {
        CHECK(0, "pool: %s", err);
        return;
    }
    int id = kv_pool_alloc(p);
    CHECK(kv_pool_unref(p, id) == 0 && kv_pool_free(p) == 4, "unref to 0 frees an unpublished block");
    CHECK(kv_pool_unref(p, id) == -1 && kv_pool_free(p) == 4, "underflow refused, the free list unchanged");
    CHECK(kv_pool_ref(p, id) == -1 && kv_pool_refcount(p, id) == 0, "a free block cannot be referenced");
    CHECK(kv_pool_ref(p, 99) == -1 && kv_pool_unref(p, -1) == -1 && kv_pool_refcount(p, 4) == -1, "bad ids");
    int32_t t[BS] = {1, 2, 3, 4};
    int a = kv_pool_alloc(p), b = kv_pool_alloc(p);
    CHECK(kv_pool_publish(p, a, 42, t) == a, "published");
    CHECK(kv_pool_publish(p, b, 42, t) == a, "an equal block is already published: its id comes back");
    CHECK(kv_pool_published(p, b, NULL) == 0, "the duplicate stays unpublished");
    t[3] = 9;
    CHECK(kv_pool_publish(p, b, 42, t) == b && kv_pool_lookup(p, 42, t) == b,
          "same hash, other tokens: a collision is a different block");
    t[3] = 4;
    CHECK(kv_pool_lookup(p, 42, t) == a && kv_pool_lookup(p, 43, t) == -1, "lookup needs hash and tokens");
    CHECK(kv_pool_publish(p, a, 44, t) == -1, "a published block cannot be renamed");
#if KV_REF_MAX < 1000
    int n = 1;
    while (n < KV_REF_MAX + 10 && kv_pool_ref(p, a) == 0) n++;
    CHECK(n == KV_REF_MAX && kv_pool_refcount(p, a) == KV_REF_MAX, "refs stop at KV_REF_MAX (%d)", n);
    for (int i = 0; i < n; i++) kv_pool_unref(p, a);
    CHECK(kv_pool_refcount(p, a) == 0 && kv_pool_cached(p) == 1, "all dropped: cached");
#endif
    kv_pool_destroy(&p);
    CHECK(kv_pool_new(0, BS, err, sizeof err) == NULL && kv_pool_new(4, 0, err, sizeof err) == NULL &&
              kv_pool_new(4, KV_BLOCK_MAX + 1, err, sizeof err) == NULL,
          "bad pool sizes refused");
}

static void test_admission_growth(void) {
    char err[128];
    uint64_t key = kv_hash_model("m", 1);
    kv_pool *p = kv_pool_new(8, BS, err, sizeof err);
    if (!p) {
        CHECK(0, "pool: %s", err);
        return;
    }
    int32_t pr[6 * BS];
    fill(pr, 6 * BS, 1);
    kv_table a = {0}, b = {0};
    /* a long max_tokens reserves nothing beyond prompt + headroom */
    CHECK(kv_table_admit(p, &a, key, pr, 5, 100000, 1, 1) == 0 && a.n_blocks == 2 && kv_pool_used(p) == 2,
          "prompt of 5: 2 blocks, not prompt + max_tokens");
    CHECK(kv_table_admit(p, &b, key, pr, 0, 1, 0, 1) == -1, "empty prompt refused");
    fill(pr, 6 * BS, 500);
    CHECK(kv_table_admit(p, &b, key, pr, 6 * BS, 10, 1, 1) == -1 && b.n_blocks == 0 && kv_pool_used(p) == 2,
          "6 blocks + 1 headroom do not fit in 6 free: refused, nothing taken");
    CHECK(kv_table_admit(p, &b, key, pr, 6 * BS, 0, 1, 1) == 0, "headroom is capped by what max_tokens can use");
    kv_table_release(p, &b);
    /* growth: one block per BS tokens */
    CHECK(kv_table_grow(p, &a, 3) == 0 && a.n_blocks == 2 && a.n_tokens == 8, "8 tokens: still 2 blocks");
    CHECK(kv_table_grow(p, &a, 1) == 0 && a.n_blocks == 3, "the 9th token takes a 3rd block");
    CHECK(kv_table_grow(p, &a, 8 * BS - 9) == 0 && a.n_blocks == 8, "grows to the whole pool");
    CHECK(kv_table_grow(p, &a, 1) == -1 && a.n_blocks == 8, "out of blocks: refused, the table kept");
    kv_table_release(p, &a);
    CHECK(kv_pool_free(p) == 8, "all free again");
    kv_table_free(&a);
    kv_table_free(&b);
    kv_pool_destroy(&p);
}

static void test_hash_summary(void) {
    char err[128];
    uint64_t key = kv_hash_model("m", 1);
    kv_pool *p = kv_pool_new(32, BS, err, sizeof err);
    if (!p) {
        CHECK(0, "pool: %s", err);
        return;
    }
    int32_t pr[8 * BS + 1];
    fill(pr, 8 * BS + 1, 3);
    kv_table a = {0};
    kv_table_admit(p, &a, key, pr, 8 * BS + 1, 4, 1, 1);
    kv_table_publish(p, &a, key, pr, 8 * BS + 1);
    uint64_t want[8], got[8];
    kv_hash_prompt(key, pr, 8 * BS + 1, BS, want, 8);
    int n = kv_pool_hashes(p, got, 8), all = 1;
    for (int i = 0; i < 8; i++) {
        int f = 0;
        for (int j = 0; j < n; j++) f |= got[j] == want[i];
        all &= f;
    }
    CHECK(n == 8 && all, "the summary holds the prompt's chain hashes");
    kv_pool_touch(p, a.blocks[7]);
    CHECK(kv_pool_hashes(p, got, 1) == 1 && got[0] == want[7], "a capped summary keeps the most recent");
    kv_table_release(p, &a);
    kv_table_free(&a);
    kv_pool_destroy(&p);
}

/* A randomized run against a shadow of the KV contents: each block's row holds a fingerprint of what a real KV row
 * depends on (the token, its position and every token before it), as the sequence that computed it wrote it. 20000 operations (admit a prompt from a few shared prefixes, decode a token, publish, release) over
 * a small pool keep every invariant: used + free + cached = all blocks; each block's refcount is the number of
 * tables holding it; nothing writes a published (shared, read-only) block; and every token a sequence has
 * computed, cached prefix included, is what its block table's rows hold. */
#define FZ_BLOCKS 48
#define FZ_SEQS 6
#define FZ_MAXLEN 64
static uint64_t s_fz = 88172645463325252ull;
static int fz_rand(int n) {
    s_fz ^= s_fz << 13;
    s_fz ^= s_fz >> 7;
    s_fz ^= s_fz << 17;
    return (int)(s_fz % (uint64_t)n);
}

typedef struct {
    int on;
    kv_table t;
    int32_t toks[FZ_MAXLEN];
    uint64_t fp[FZ_MAXLEN]; /* fp[t]: the fingerprint of toks[0..t] */
    int len, written;
} fz_seq;

static uint64_t s_shadow[FZ_BLOCKS][BS];

static void fz_fp(fz_seq *q, int from, int to) {
    for (int t = from; t < to; t++)
        q->fp[t] = ((t ? q->fp[t - 1] : 0x9e3779b97f4a7c15ull) ^ (uint32_t)q->toks[t]) * 0x100000001b3ull;
}

static int fz_write(kv_pool *p, fz_seq *q, int from, int to) { /* the rows of tokens [from, to) are computed */
    int bad = 0;
    for (int t = from; t < to; t++) {
        int b = q->t.blocks[t / BS];
        bad += kv_pool_published(p, b, NULL) || kv_pool_refcount(p, b) != 1; /* never write a shared block */
        s_shadow[b][t % BS] = q->fp[t];
    }
    return bad;
}

static void test_randomized(void) {
    char err[128];
    uint64_t key = kv_hash_model("m", 1);
    kv_pool *p = kv_pool_new(FZ_BLOCKS, BS, err, sizeof err);
    if (!p) {
        CHECK(0, "pool: %s", err);
        return;
    }
    /* prefixes: 1 shares 0's first 2 blocks, 2 is 0 from its 2nd block on, 3 is 0 shifted by one block */
    int32_t base[4][FZ_MAXLEN];
    for (int i = 0; i < FZ_MAXLEN; i++) {
        base[0][i] = i;
        base[1][i] = i < 2 * BS ? i : 100 + i;
        base[2][i] = i < BS ? 200 + i : i;
        base[3][i] = i + BS;
    }
    fz_seq seq[FZ_SEQS];
    memset(seq, 0, sizeof seq);
    int bad_write = 0, bad_inv = 0, bad_kv = 0, admitted = 0, hits = 0, ops = 20000;
    for (int op = 0; op < ops; op++) {
        int i = fz_rand(FZ_SEQS), what = fz_rand(10);
        fz_seq *q = &seq[i];
        if (!q->on) {
            int k = fz_rand(4), n = 1 + fz_rand(24), extra = fz_rand(5);
            memcpy(q->toks, base[k], (size_t)n * sizeof(int32_t));
            for (int j = 0; j < extra; j++) q->toks[n + j] = 1000 + fz_rand(3);
            n += extra;
            fz_fp(q, 0, n);
            if (kv_table_admit(p, &q->t, key, q->toks, n, 1 + fz_rand(16), 1, 1) != 0) continue;
            q->on = 1;
            q->len = n;
            admitted++;
            hits += q->t.n_cached > 0;
            q->written = q->t.n_cached; /* the cached rows are already there: checked below */
            bad_write += fz_write(p, q, q->t.n_cached, n);
            q->written = n;
            if (fz_rand(2)) kv_table_publish(p, &q->t, key, q->toks, q->written);
        } else if (what < 6 && q->len < FZ_MAXLEN) {
            q->toks[q->len] = 1000 + fz_rand(3);
            fz_fp(q, q->len, q->len + 1);
            if (kv_table_grow(p, &q->t, 1) != 0) { /* out of blocks: it ends (preemption's place) */
                kv_table_release(p, &q->t);
                q->on = 0;
                continue;
            }
            bad_write += fz_write(p, q, q->len, q->len + 1);
            q->len++;
            q->written = q->len;
            if (fz_rand(4) == 0) kv_table_publish(p, &q->t, key, q->toks, q->written);
        } else {
            kv_table_publish(p, &q->t, key, q->toks, q->written);
            kv_table_release(p, &q->t);
            q->on = 0;
        }
        /* invariants */
        int refs[FZ_BLOCKS] = {0};
        for (int j = 0; j < FZ_SEQS; j++) {
            if (!seq[j].on) continue;
            for (int b = 0; b < seq[j].t.n_blocks; b++) refs[seq[j].t.blocks[b]]++;
            for (int t = 0; t < seq[j].written; t++)
                bad_kv += s_shadow[seq[j].t.blocks[t / BS]][t % BS] != seq[j].fp[t];
        }
        for (int b = 0; b < FZ_BLOCKS; b++) bad_inv += kv_pool_refcount(p, b) != refs[b];
        bad_inv += kv_pool_used(p) + kv_pool_free(p) + kv_pool_cached(p) != FZ_BLOCKS;
    }
    CHECK(bad_write == 0, "randomized: %d writes into shared blocks", bad_write);
    CHECK(bad_inv == 0, "randomized: %d refcount/accounting mismatches", bad_inv);
    CHECK(bad_kv == 0, "randomized: %d computed tokens whose rows hold another prefix's KV", bad_kv);
    CHECK(admitted > 1000 && hits > 300, "randomized: %d admitted, %d with a cached prefix", admitted, hits);
    for (int j = 0; j < FZ_SEQS; j++) {
        if (seq[j].on) kv_table_release(p, &seq[j].t);
        kv_table_free(&seq[j].t);
    }
    CHECK(kv_pool_used(p) == 0, "randomized: all released");
    kv_pool_destroy(&p);
}

int main(void) {
    test_siphash();
    test_chain();
    test_share_release_evict();
    test_refcounts();
    test_admission_growth();
    test_hash_summary();
    test_randomized();
    return test_report();
}
