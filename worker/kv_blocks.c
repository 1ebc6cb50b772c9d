/* worker/kv_blocks.c: the KV block pool (kv_blocks.h): refcounts, a free stack, an LRU list of cached blocks and
 * a chained hash index of published blocks, all in flat arrays sized once. */
#include "kv_blocks.h"
#include "kv_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_pool {
    int n, bs;
    int32_t *ref;    /* [n] references; 0 = free or cached */
    uint8_t *pub;    /* [n] 1 when published */
    uint64_t *hash;  /* [n] chain hash of a published block */
    uint64_t *stamp; /* [n] recency (kv_pool_hashes order) */
    int32_t *toks;   /* [n * bs] tokens of a published block */
    int *free_next;  /* [n] free stack links */
    int free_top, n_free;
    int *lru_prev, *lru_next; /* [n] cached list: head = least recently released */
    int lru_head, lru_tail, n_cached;
    int *bucket;       /* [nbuckets] index heads */
    int *h_next;       /* [n] index chains */
    uint32_t nbuckets; /* power of two */
    uint64_t clock, evictions;
    uint64_t *scratch; /* [n] kv_pool_hashes: (stamp, id) sort keys */
    int *scratch_id;
};

static void set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

kv_pool *kv_pool_new(int n_blocks, int block_size, char *err, size_t errlen) {
    if (n_blocks < 1 || n_blocks > (1 << 28) || block_size < 1 || block_size > KV_BLOCK_MAX) {
        set_err(err, errlen, "kv pool: blocks must be >= 1 and the block size 1..KV_BLOCK_MAX tokens");
        return NULL;
    }
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail;
    p->n = n_blocks;
    p->bs = block_size;
    p->nbuckets = 1;
    while (p->nbuckets < 2u * (uint32_t)n_blocks) p->nbuckets <<= 1;
    size_t n = (size_t)n_blocks;
    p->ref = calloc(n, sizeof *p->ref);
    p->pub = calloc(n, 1);
    p->hash = calloc(n, sizeof *p->hash);
    p->stamp = calloc(n, sizeof *p->stamp);
    p->toks = calloc(n * (size_t)block_size, sizeof *p->toks);
    p->free_next = malloc(n * sizeof *p->free_next);
    p->lru_prev = malloc(n * sizeof *p->lru_prev);
    p->lru_next = malloc(n * sizeof *p->lru_next);
    p->h_next = malloc(n * sizeof *p->h_next);
    p->bucket = malloc(p->nbuckets * sizeof *p->bucket);
    p->scratch = malloc(n * sizeof *p->scratch);
    p->scratch_id = malloc(n * sizeof *p->scratch_id);
    if (!p->ref || !p->pub || !p->hash || !p->stamp || !p->toks || !p->free_next || !p->lru_prev || !p->lru_next ||
        !p->h_next || !p->bucket || !p->scratch || !p->scratch_id)
        goto fail;
    /* the free stack hands out 0, 1, 2, ... first */
    for (int i = 0; i < n_blocks; i++) p->free_next[i] = i + 1 < n_blocks ? i + 1 : -1;
    p->free_top = 0;
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    for (uint32_t i = 0; i < p->nbuckets; i++) p->bucket[i] = -1;
    for (int i = 0; i < n_blocks; i++) p->h_next[i] = p->lru_prev[i] = p->lru_next[i] = -1;
    return p;
fail:
    set_err(err, errlen, "kv pool: out of memory");
    kv_pool_destroy(&p);
    return NULL;
}

void kv_pool_destroy(kv_pool **pp) {
    if (!pp || !*pp) return;
    kv_pool *p = *pp;
    free(p->ref);
    free(p->pub);
    free(p->hash);
    free(p->stamp);
    free(p->toks);
    free(p->free_next);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->h_next);
    free(p->bucket);
    free(p->scratch);
    free(p->scratch_id);
    free(p);
    *pp = NULL;
}

static int bad_id(const kv_pool *p, int id) { return !p || id < 0 || id >= p->n; }
static uint32_t bucket_of(const kv_pool *p, uint64_t h) { return (uint32_t)(h ^ h >> 32) & (p->nbuckets - 1); }

static void lru_unlink(kv_pool *p, int id) {
    int a = p->lru_prev[id], b = p->lru_next[id];
    if (a >= 0) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a;
    else p->lru_tail = a;
    p->lru_prev[id] = p->lru_next[id] = -1;
    p->n_cached--;
}

static void lru_push_tail(kv_pool *p, int id) {
    p->lru_prev[id] = p->lru_tail;
    p->lru_next[id] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

static void index_remove(kv_pool *p, int id) {
    uint32_t b = bucket_of(p, p->hash[id]);
    for (int *link = &p->bucket[b]; *link >= 0; link = &p->h_next[*link]) {
        if (*link == id) {
            *link = p->h_next[id];
            break;
        }
    }
    p->h_next[id] = -1;
    p->pub[id] = 0;
}

int kv_pool_alloc(kv_pool *p) {
    if (!p) return -1;
    int id;
    if (p->free_top >= 0) {
        id = p->free_top;
        p->free_top = p->free_next[id];
        p->n_free--;
    } else if (p->lru_head >= 0) {
        id = p->lru_head;
        lru_unlink(p, id);
        index_remove(p, id);
        p->evictions++;
    } else {
        return -1;
    }
    p->ref[id] = 1;
    p->stamp[id] = ++p->clock;
    return id;
}

int kv_pool_ref(kv_pool *p, int id) {
    if (bad_id(p, id) || p->ref[id] >= KV_REF_MAX) return -1;
    if (p->ref[id] == 0) {
        if (!p->pub[id]) return -1; /* free: nothing to share */
        lru_unlink(p, id);
    }
    p->ref[id]++;
    p->stamp[id] = ++p->clock;
    return 0;
}

int kv_pool_unref(kv_pool *p, int id) {
    if (bad_id(p, id) || p->ref[id] <= 0) return -1;
    if (--p->ref[id] > 0) return 0;
    if (p->pub[id]) {
        lru_push_tail(p, id);
    } else {
        p->free_next[id] = p->free_top;
        p->free_top = id;
        p->n_free++;
    }
    return 0;
}

int kv_pool_lookup(const kv_pool *p, uint64_t h, const int32_t *tokens) {
    if (!p || !tokens) return -1;
    for (int id = p->bucket[bucket_of(p, h)]; id >= 0; id = p->h_next[id]) {
        if (p->hash[id] == h && memcmp(p->toks + (size_t)id * p->bs, tokens, (size_t)p->bs * sizeof *tokens) == 0)
            return id;
    }
    return -1;
}

int kv_pool_publish(kv_pool *p, int id, uint64_t h, const int32_t *tokens) {
    if (bad_id(p, id) || p->ref[id] <= 0 || !tokens) return -1;
    if (p->pub[id]) {
        if (p->hash[id] != h || memcmp(p->toks + (size_t)id * p->bs, tokens, (size_t)p->bs * sizeof *tokens) != 0)
            return -1;
        return id;
    }
    int old = kv_pool_lookup(p, h, tokens);
    if (old >= 0) return old;
    memcpy(p->toks + (size_t)id * p->bs, tokens, (size_t)p->bs * sizeof *tokens);
    p->hash[id] = h;
    p->pub[id] = 1;
    uint32_t b = bucket_of(p, h);
    p->h_next[id] = p->bucket[b];
    p->bucket[b] = id;
    return id;
}

void kv_pool_touch(kv_pool *p, int id) {
    if (!bad_id(p, id) && p->pub[id]) p->stamp[id] = ++p->clock;
}

int kv_pool_block_size(const kv_pool *p) { return p ? p->bs : 0; }
int kv_pool_blocks(const kv_pool *p) { return p ? p->n : 0; }
int kv_pool_free(const kv_pool *p) { return p ? p->n_free : 0; }
int kv_pool_cached(const kv_pool *p) { return p ? p->n_cached : 0; }
int kv_pool_used(const kv_pool *p) { return p ? p->n - p->n_free - p->n_cached : 0; }
int kv_pool_available(const kv_pool *p) { return p ? p->n_free + p->n_cached : 0; }
int kv_pool_refcount(const kv_pool *p, int id) { return bad_id(p, id) ? -1 : p->ref[id]; }
uint64_t kv_pool_evictions(const kv_pool *p) { return p ? p->evictions : 0; }

int kv_pool_published(const kv_pool *p, int id, uint64_t *h) {
    if (bad_id(p, id) || !p->pub[id]) return 0;
    if (h) *h = p->hash[id];
    return 1;
}

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int kv_pool_hashes(const kv_pool *p, uint64_t *out, int cap) {
    if (!p || !out || cap <= 0) return 0;
    int m = 0;
    for (int id = 0; id < p->n; id++)
        if (p->pub[id]) p->scratch[m++] = p->stamp[id]; /* stamps are unique: they name the block */
    if (m > cap) {
        qsort(p->scratch, (size_t)m, sizeof *p->scratch, cmp_desc);
        m = cap;
    }
    /* map the chosen stamps back to blocks: a stamp at or above the cut-off is chosen */
    uint64_t cut = 0;
    for (int i = 0; i < m; i++)
        if (i == 0 || p->scratch[i] < cut) cut = p->scratch[i];
    int k = 0;
    for (int id = 0; id < p->n && k < m; id++)
        if (p->pub[id] && p->stamp[id] >= cut) out[k++] = p->hash[id];
    return k;
}
