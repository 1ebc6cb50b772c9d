/* worker/kv_table.h: one sequence's block table over a kv_pool, with exact prefix reuse (docs/kv-cache.md).
 *
 * The interface the engines read: token t of the sequence has its KV in physical block blocks[t / block_size], at
 * row t % block_size. blocks[0..n_blocks) covers n_tokens tokens (the last block may be partly filled). The first
 * n_cached tokens (whole blocks) were found in the cache at admission: their KV is already in those blocks, so a
 * step need only compute tokens n_cached.. of the prompt. The first n_published blocks may be shared with other
 * sequences and are read-only: nothing writes a published block.
 *
 * Life of a sequence: kv_table_admit (cached prefix + blocks for the rest of the prompt, or nothing) ->
 * kv_table_publish after its prompt's KV is written (its full prompt blocks become findable) -> kv_table_grow
 * one token at a time as it decodes (a new block each block_size tokens) -> kv_table_release at its end (blocks
 * released last-first, so the LRU reclaims a prefix's tail before its head). */
#ifndef ZLLM_KV_TABLE_H
#define ZLLM_KV_TABLE_H
#include <stdint.h>
#include "kv_blocks.h"

typedef struct {
    int32_t *blocks; /* [n_blocks] physical block ids in token order (owned; cap entries allocated) */
    int n_blocks, cap;
    int n_tokens;       /* tokens the blocks hold or are reserved for */
    int n_cached;       /* leading prompt tokens found in the cache at admission (a multiple of block_size) */
    int n_published;    /* leading full blocks published (their chain hash is last_hash) */
    uint64_t last_hash; /* chain hash of block n_published-1 (0 when none) */
} kv_table;

/* Admits a prompt of n >= 1 tokens into the empty table t: takes the longest run of cached full blocks that is a
 * prefix of tokens and leaves at least the last prompt token to compute (so the first sampled token has logits;
 * reuse 0: takes none, for a prompt whose every row must be computed, as prompt logprobs need),
 * then allocates blocks for the rest of the prompt. It is refused unless that many blocks plus headroom more are
 * available (headroom: blocks kept for the sequence's first decodes; at most what n + max_tokens can use).
 * Returns 0, or -1 with t left empty and nothing taken (no memory, or not enough blocks: kv_table_admit_fits). */
int kv_table_admit(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n, int max_tokens,
                   int headroom, int reuse);
/* kv_table_admit taking cached blocks only among the first `within` tokens (whole blocks that end at or before
 * it; 0: none): a resumed sequence on an engine with kv_split_kernels reuses blocks of its prompt only, never
 * blocks that would stand for its generated positions (docs/kv-cache.md) */
int kv_table_admit_within(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n, int max_tokens,
                          int headroom, int within);
/* Counts the leading cached full blocks of tokens[0..n) (the same rule as admit) without taking anything */
int kv_table_cached_prefix(const kv_pool *p, uint64_t model_key, const int32_t *tokens, int n);
/* Publishes the full blocks among the first n_known tokens whose KV is written (tokens: the sequence's tokens,
 * prompt then generated). A block whose equal is already published is swapped for it (shared) and its own block
 * released. Returns the blocks published or shared now, or -1 on a pool error. */
int kv_table_publish(kv_pool *p, kv_table *t, uint64_t model_key, const int32_t *tokens, int n_known);
/* Makes room for n_new more tokens: allocates blocks as n_tokens crosses block boundaries. Returns 0, or -1 when
 * the pool is out of blocks (the table keeps the blocks it had: the sequence must end or be preempted). */
int kv_table_grow(kv_pool *p, kv_table *t, int n_new);
/* Drops every reference, last block first; the table is left empty and reusable. */
void kv_table_release(kv_pool *p, kv_table *t);
void kv_table_free(kv_table *t); /* frees blocks[] (after kv_table_release) */
#endif
