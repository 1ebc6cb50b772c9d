/* engine/cpu_attn.h: one query head's causal attention over its keys, for the fast CPU engine. */
#ifndef ZLLM_CPU_ATTN_H
#define ZLLM_CPU_ATTN_H
#include <stddef.h>

/* out[hd] = softmax(scale * q.K^T) V over keys 0..n_keys-1, key j's row at k + off[j] and v + off[j] (rows of a
 * paged KV cache need not be evenly spaced);
 * att: scratch of n_keys floats. The same operations for the same (q, keys) whatever the caller's batch; isa
 * (qdot_isa) picks the path: AVX2 (also used on the AVX-512 path) when hd % 8 == 0, else scalar. */
void cpu_attn_head(int isa, const float *q, int hd, const float *k, const float *v, const size_t *off, int n_keys,
                   float scale, float *att, float *out);
#endif
