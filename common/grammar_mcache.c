/* common/grammar_mcache.c: the masks a grammar remembers by parse state (docs/structured-output.md).
 *
 * Every matcher of one grammar masks through this cache: sequences under one schema pass through the same parse
 * states (a string at its k-th character, the position after a key), and a state seen before costs a copy of its
 * mask instead of a walk of the vocabulary. The key is the matcher's state written out canonically (its stacks'
 * element positions and the pending partial UTF-8 character, grammar_match.c's s_state_key), so it means the
 * same in every matcher. Entries form a hash table and a least-recently-used list, bounded by bytes per grammar
 * (grammar_mask_cache_limit) and by ZG_MASK_CACHE_TOTAL over every grammar of the process: a grammar inserting
 * past either bound drops its own oldest entries. Matchers mask on several threads at once: the lock covers
 * the lookups and the list, never a walk (a miss computes outside it and inserts afterwards) nor a hit's copy
 * (the entry is pinned while it is copied: dropped meanwhile, its last reader frees it). */
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

struct zg_mc_entry {
    zg_mc_entry *hnext;         /* hash chain */
    zg_mc_entry *newer, *older; /* the LRU list */
    uint64_t hash;
    size_t bytes; /* this entry's share of the bounds */
    int klen, count;
    int pins;       /* readers copying its mask outside the lock */
    int dropped;    /* out of the table and the list: the last reader frees it */
    uint32_t *mask; /* words of mask bits after the key */
    int32_t key[];
};

static size_t s_total; /* bytes held by every grammar's cache (atomic) */

void zg_mcache_init(zg_mcache *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->limit = ZG_MASK_CACHE_BYTES;
}

static void s_unlink(zg_mcache *c, zg_mc_entry *e) {
    if (e->newer) e->newer->older = e->older;
    else c->newest = e->older;
    if (e->older) e->older->newer = e->newer;
    else c->oldest = e->newer;
    e->newer = e->older = NULL;
}

static void s_push_newest(zg_mcache *c, zg_mc_entry *e) {
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest) c->newest->newer = e;
    c->newest = e;
    if (!c->oldest) c->oldest = e;
}

/* drops entry e (in the table and the list) */
static void s_drop(zg_mcache *c, zg_mc_entry *e) {
    zg_mc_entry **p = &c->bucket[e->hash & (uint64_t)(c->nb - 1)];
    while (*p != e) p = &(*p)->hnext;
    *p = e->hnext;
    s_unlink(c, e);
    c->bytes -= e->bytes;
    c->n--;
    __atomic_sub_fetch(&s_total, e->bytes, __ATOMIC_RELAXED);
    if (e->pins > 0) e->dropped = 1;
    else free(e);
}

/* drops every entry (the lock held) */
static void s_clear(zg_mcache *c) {
    while (c->oldest) s_drop(c, c->oldest);
}

void zg_mcache_free(zg_mcache *c) {
    if (c->bucket) s_clear(c);
    free(c->bucket);
    c->bucket = NULL;
    pthread_mutex_destroy(&c->lock);
}

static zg_mc_entry *s_find(const zg_mcache *c, uint64_t h, const int32_t *key, int klen) {
    if (!c->bucket) return NULL;
    for (zg_mc_entry *e = c->bucket[h & (uint64_t)(c->nb - 1)]; e; e = e->hnext)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, (size_t)klen * sizeof *key) == 0) return e;
    return NULL;
}

/* makes the table follow vocab (another vocabulary forgets every mask); the lock held */
static void s_vocab(zg_mcache *c, const void *vocab) {
    if (c->vocab == vocab) return;
    if (c->bucket) s_clear(c);
    c->vocab = vocab;
}

int zg_mcache_get(zg_mcache *c, const void *vocab, uint64_t h, const int32_t *key, int klen, uint32_t *mask,
                  size_t words) {
    int count = -1;
    pthread_mutex_lock(&c->lock);
    s_vocab(c, vocab);
    zg_mc_entry *e = s_find(c, h, key, klen);
    if (!e) {
        c->misses++;
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    count = e->count;
    s_unlink(c, e);
    s_push_newest(c, e);
    c->hits++;
    e->pins++;
    pthread_mutex_unlock(&c->lock);
    memcpy(mask, e->mask, words * sizeof *mask); /* immutable once inserted */
    pthread_mutex_lock(&c->lock);
    int last = --e->pins == 0 && e->dropped;
    pthread_mutex_unlock(&c->lock);
    if (last) free(e);
    return count;
}

/* doubles the hash table (the lock held); a failed allocation keeps the old one (longer chains) */
static void s_grow(zg_mcache *c) {
    int nb = c->nb ? 2 * c->nb : 256;
    zg_mc_entry **b = calloc((size_t)nb, sizeof *b);
    if (!b) return;
    for (int i = 0; i < c->nb; i++)
        for (zg_mc_entry *e = c->bucket[i], *next; e; e = next) {
            next = e->hnext;
            e->hnext = b[e->hash & (uint64_t)(nb - 1)];
            b[e->hash & (uint64_t)(nb - 1)] = e;
        }
    free(c->bucket);
    c->bucket = b;
    c->nb = nb;
}

void zg_mcache_put(zg_mcache *c, const void *vocab, uint64_t h, const int32_t *key, int klen, const uint32_t *mask,
                   size_t words, int count) {
    size_t bytes = sizeof(zg_mc_entry) + (size_t)klen * sizeof *key + words * sizeof *mask;
    if (klen <= 0 || bytes > __atomic_load_n(&c->limit, __ATOMIC_RELAXED) || bytes > ZG_MASK_CACHE_TOTAL) return;
    zg_mc_entry *e = malloc(bytes);
    if (!e) return;
    *e = (zg_mc_entry){.hash = h, .bytes = bytes, .klen = klen, .count = count};
    memcpy(e->key, key, (size_t)klen * sizeof *key);
    e->mask = (uint32_t *)(e->key + klen);
    memcpy(e->mask, mask, words * sizeof *mask);
    pthread_mutex_lock(&c->lock);
    s_vocab(c, vocab);
    if (s_find(c, h, key, klen)) { /* another thread computed it meanwhile */
        pthread_mutex_unlock(&c->lock);
        free(e);
        return;
    }
    if (c->n >= 2 * c->nb) s_grow(c);
    if (!c->bucket) {
        pthread_mutex_unlock(&c->lock);
        free(e);
        return;
    }
    zg_mc_entry **slot = &c->bucket[h & (uint64_t)(c->nb - 1)];
    e->hnext = *slot;
    *slot = e;
    s_push_newest(c, e);
    c->n++;
    c->bytes += bytes;
    size_t total = __atomic_add_fetch(&s_total, bytes, __ATOMIC_RELAXED);
    while (c->oldest != e && (c->bytes > c->limit || total > ZG_MASK_CACHE_TOTAL)) {
        s_drop(c, c->oldest);
        total = __atomic_load_n(&s_total, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->lock);
}

void grammar_mask_cache_limit(zg_grammar *g, size_t bytes) {
    pthread_mutex_lock(&g->mc.lock);
    __atomic_store_n(&g->mc.limit, bytes, __ATOMIC_RELAXED);
    while (g->mc.oldest && g->mc.bytes > bytes) s_drop(&g->mc, g->mc.oldest);
    pthread_mutex_unlock(&g->mc.lock);
}

void grammar_mask_cache_stats(zg_grammar *g, uint64_t *hits, uint64_t *misses, size_t *bytes) {
    pthread_mutex_lock(&g->mc.lock);
    if (hits) *hits = g->mc.hits;
    if (misses) *misses = g->mc.misses;
    if (bytes) *bytes = g->mc.bytes;
    pthread_mutex_unlock(&g->mc.lock);
}
