/* worker/kv_table.c: a sequence's block table (kv_table.h). */
#include "kv_table.h"
#include "kv_hash.h"

#include <stdlib.h>
#include <string.h>

static int blocks_for(int tokens, int bs) { return tokens <= 0 ? 0 : (int)(((int64_t)tokens + bs - 1) / bs); }

static int table_reserve(kv_table *t, int n) {
    if (n <= t->cap) return 0;
    int cap = t->cap ? t->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *b = realloc(t->blocks, (size_t)cap * sizeof *b);
    if (!b) return -1;
    t->blocks = b;
    t->cap = cap;
    return 0;
}

/* walks the cached prefix: the ids (ids may be NULL) and chain hash of the leading cached full blocks, never the
 * block holding the last prompt token */
static int cached_walk(const kv_pool *p, uint64_t key, const int32_t *tokens, int n, int32_t *ids, uint64_t *last,
                       int within) {
    int bs = kv_pool_block_size(p);
    int k_max = n >= 1 ? (n - 1) / bs : 0, k = 0;
    if (within < n && k_max > within / bs) k_max = within > 0 ? within / bs : 0;
    uint64_t h = 0;
    while (k < k_max) {
        uint64_t h2 = kv_hash_block(key, h, tokens + (size_t)k * bs, bs);
        int id = kv_pool_lookup(p, h2, tokens + (size_t)k * bs);
        if (id < 0) break;
        if (ids) ids[k] = id;
        h = h2;
        k++;
    }
    if (last) *last = h;
    return k;
}

int kv_table_cached_prefix(const kv_pool *p, uint64_t model_key, const int32_t *tokens, int n) {
    if (!p || !tokens || n < 1) return 0;
    return cached_walk(p, model_key, tokens, n, NULL, NULL, n);
}

int kv_table_admit(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n, int max_tokens,
                   int headroom, int reuse) {
    return kv_table_admit_within(p, t, model_key, tokens, n, max_tokens, headroom, reuse ? n : 0);
}

int kv_table_admit_within(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n, int max_tokens,
                          int headroom, int within) {
    if (!p || !t || !tokens || n < 1 || t->n_blocks) return -1;
    int bs = kv_pool_block_size(p);
    int need_all = blocks_for(n, bs);
    if (table_reserve(t, need_all + 1) != 0) return -1;
    uint64_t h = 0;
    int k = within > 0 ? cached_walk(p, model_key, tokens, n, t->blocks, &h, within) : 0;
    int revive = 0; /* cached (unreferenced) blocks among them: taking them lowers what is available */
    for (int i = 0; i < k; i++) revive += kv_pool_refcount(p, t->blocks[i]) == 0;
    int64_t total = (int64_t)n + (max_tokens > 0 ? max_tokens : 0);
    int most = blocks_for(total > 0x7fffffff ? 0x7fffffff : (int)total, bs) - need_all;
    if (headroom < 0) headroom = 0;
    if (headroom > most) headroom = most > 0 ? most : 0;
    if (kv_pool_available(p) - revive < need_all - k + headroom) return -1;
    for (int i = 0; i < k; i++) {
        if (kv_pool_ref(p, t->blocks[i]) != 0) { /* refcount overflow: take nothing */
            while (i-- > 0) kv_pool_unref(p, t->blocks[i]);
            return -1;
        }
        kv_pool_touch(p, t->blocks[i]);
    }
    t->n_blocks = k;
    for (int i = k; i < need_all; i++) {
        int id = kv_pool_alloc(p);
        if (id < 0) { /* cannot happen after the check above; stay safe */
            kv_table_release(p, t);
            return -1;
        }
        t->blocks[t->n_blocks++] = id;
    }
    t->n_tokens = n;
    t->n_cached = k * bs;
    t->n_published = k;
    t->last_hash = h;
    return 0;
}

int kv_table_publish(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n_known) {
    if (!p || !t || !tokens) return -1;
    int bs = kv_pool_block_size(p);
    if (n_known > t->n_tokens) n_known = t->n_tokens;
    int full = n_known / bs, done = 0;
    while (t->n_published < full && t->n_published < t->n_blocks) {
        int i = t->n_published;
        uint64_t h = kv_hash_block(model_key, t->last_hash, tokens + (size_t)i * bs, bs);
        int got = kv_pool_publish(p, t->blocks[i], h, tokens + (size_t)i * bs);
        if (got < 0) return -1;
        if (got != t->blocks[i]) { /* an equal block is published already: share it, give ours back */
            if (kv_pool_ref(p, got) != 0) return -1;
            kv_pool_unref(p, t->blocks[i]);
            t->blocks[i] = got;
        }
        t->last_hash = h;
        t->n_published++;
        done++;
    }
    return done;
}

int kv_table_grow(kv_pool *p, kv_table *t, int n_new) {
    if (!p || !t || n_new < 0) return -1;
    int bs = kv_pool_block_size(p);
    int64_t want_tokens = (int64_t)t->n_tokens + n_new;
    if (want_tokens > 0x7fffffff) return -1;
    int want = blocks_for((int)want_tokens, bs);
    if (table_reserve(t, want) != 0) return -1;
    while (t->n_blocks < want) {
        int id = kv_pool_alloc(p);
        if (id < 0) return -1;
        t->blocks[t->n_blocks++] = id;
    }
    t->n_tokens = (int)want_tokens;
    return 0;
}

void kv_table_release(kv_pool *p, kv_table *t) {
    if (!t) return;
    for (int i = t->n_blocks - 1; i >= 0; i--) kv_pool_unref(p, t->blocks[i]);
    t->n_blocks = t->n_tokens = t->n_cached = t->n_published = 0;
    t->last_hash = 0;
}

void kv_table_free(kv_table *t) {
    if (!t) return;
    free(t->blocks);
    memset(t, 0, sizeof *t);
}
