/* worker/kv_blocks.h: the worker's pool of fixed-size KV blocks (docs/kv-cache.md).
 *
 * A block holds the KV of block_size consecutive tokens of one sequence. Every block is in exactly one state:
 *   free    on the free list, content meaningless;
 *   used    refcount >= 1: in the block table of that many sequences (more than one only for a published block,
 *           which is then read-only);
 *   cached  refcount 0 but published (its tokens and chain hash are indexed): kept in an LRU list, found again by
 *           kv_pool_lookup, and reclaimed (oldest first) by kv_pool_alloc when the free list is empty.
 * Publishing names a full block by its chain hash (common/kv_hash.h) and its tokens; a lookup matches only when
 * both the hash and the tokens are equal, so a hash collision can never hand out another prefix's KV.
 * Refcounts are checked: taking a reference past KV_REF_MAX or dropping one that is not held fails (-1) and
 * changes nothing, so a double release can never put a block that is still shared on the free list. */
#ifndef ZLLM_KV_BLOCKS_H
#define ZLLM_KV_BLOCKS_H
#include <stddef.h>
#include <stdint.h>

#ifndef KV_REF_MAX
#define KV_REF_MAX 0x7fffffff /* most references to one block (tests/test_kv_mutants.sh builds with a small one) */
#endif

typedef struct kv_pool kv_pool;

/* n_blocks >= 1 blocks of block_size (1..KV_BLOCK_MAX) tokens. NULL with a message on bad arguments or no memory. */
kv_pool *kv_pool_new(int n_blocks, int block_size, char *err, size_t errlen);
void kv_pool_destroy(kv_pool **p); /* idempotent; sets *p to NULL */

/* A private block (refcount 1, unpublished): from the free list, else the least recently released cached block
 * (it leaves the index). -1 when every block is used. */
int kv_pool_alloc(kv_pool *p);
/* One more reference to a used or cached block (a cached block leaves the LRU list and becomes used). 0, or -1
 * (nothing changed) for a free block, a bad id or a refcount at KV_REF_MAX. */
int kv_pool_ref(kv_pool *p, int id);
/* Drops one reference. At 0 a published block becomes cached (the most recently used end of the LRU list), an
 * unpublished one free. 0, or -1 (nothing changed) when the block holds no reference or the id is bad. */
int kv_pool_unref(kv_pool *p, int id);
/* Publishes used block id as holding tokens[0..block_size) with chain hash h. When an equal block (same hash and
 * tokens) is already published, returns that block's id and leaves id unpublished (the caller may share the
 * older one instead); otherwise returns id. -1 when id is not a used block, is already published under another
 * hash, or the tokens are missing. */
int kv_pool_publish(kv_pool *p, int id, uint64_t h, const int32_t *tokens);
/* The published block (used or cached) with hash h and exactly these block_size tokens, or -1. Takes no reference. */
int kv_pool_lookup(const kv_pool *p, uint64_t h, const int32_t *tokens);

int kv_pool_block_size(const kv_pool *p);
int kv_pool_blocks(const kv_pool *p);                         /* all blocks */
int kv_pool_free(const kv_pool *p);                           /* on the free list */
int kv_pool_cached(const kv_pool *p);                         /* refcount 0, published: reclaimable */
int kv_pool_used(const kv_pool *p);                           /* refcount >= 1 */
int kv_pool_available(const kv_pool *p);                      /* free + cached: what kv_pool_alloc can still hand out */
int kv_pool_refcount(const kv_pool *p, int id);               /* -1 for a bad id */
int kv_pool_published(const kv_pool *p, int id, uint64_t *h); /* 1 (hash in *h) when published */
uint64_t kv_pool_evictions(const kv_pool *p);                 /* cached blocks reclaimed by kv_pool_alloc */
/* Writes the hashes of the (at most cap) most recently used published blocks, used or cached, in block order;
 * returns the count written. The worker's summary for cache-aware routing. */
int kv_pool_hashes(const kv_pool *p, uint64_t *out, int cap);
/* bumps a published block's recency for kv_pool_hashes (a lookup hit); no effect on an unpublished one */
void kv_pool_touch(kv_pool *p, int id);
#endif
