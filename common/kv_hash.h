/* common/kv_hash.h: the chained block hashes of exact prefix caching (docs/kv-cache.md).
 *
 * A prompt is cut into full blocks of block_size tokens. Block i is named by
 *     h[i] = SipHash-2-4(key = (model_key, KV_HASH_K1), msg = le64(h[i-1]) || le32(tok[i*bs]) ... le32(tok[i*bs+bs-1]))
 * with h[-1] = 0 and model_key = SipHash-2-4(key = (0, KV_HASH_K1), model name bytes). A block's hash therefore
 * covers its own tokens, every token before it and the model: two prompts share block i's hash only when they
 * share their first (i+1)*bs tokens (up to a 2^-64 collision, which the worker's cache rules out by comparing
 * tokens). The worker (its cache) and the broker (routing on the hashes workers report) compute the same values;
 * tests/broker_fake.py has a Python copy that the broker tests check against. */
#ifndef ZLLM_KV_HASH_H
#define ZLLM_KV_HASH_H
#include <stddef.h>
#include <stdint.h>

#define KV_HASH_K1 0x7a6c6c6d2d6b7631ull /* "zllm-kv1": the second half of every key */
#define KV_BLOCK_MAX 256                 /* most tokens per block (the worker option --kv-block is 1..this) */

/* SipHash-2-4 of p[0..n) under the key (k0, k1) */
uint64_t kv_hash_sip(uint64_t k0, uint64_t k1, const void *p, size_t n);
/* the model's key: the hash of its name (the name a worker registers under) */
uint64_t kv_hash_model(const char *name, size_t n);
/* h[i] from h[i-1] (0 for the first block) and the block's n tokens, 1 <= n <= KV_BLOCK_MAX */
uint64_t kv_hash_block(uint64_t model_key, uint64_t prev, const int32_t *tokens, int n);
/* Writes the chained hashes of the full blocks of tokens[0..n) to out[0..cap) (at most cap of them); returns how
 * many full blocks there are (n / block_size, even beyond cap), or -1 when block_size is not 1..KV_BLOCK_MAX or n < 0. */
int kv_hash_prompt(uint64_t model_key, const int32_t *tokens, int n, int block_size, uint64_t *out, int cap);
#endif
