/* common/benchload.h: the load that `zllm bench` (clients/main_zllm.c) and zllm-httpbench
 * (http/main_zllm-httpbench.c) apply, defined once so that the ZeroMQ and the HTTP paths see the same load:
 * request i's output length is a function of the seed and i alone (the same sequence in both tools, whatever
 * order requests end in), and stream k's first request is sent k * ramp / streams after the start, so that a
 * closed loop of streams with spread output lengths reaches a steady state instead of sending in waves. Both
 * tools also report how bunched their sends were (benchload_burst). */
#ifndef ZLLM_BENCHLOAD_H
#define ZLLM_BENCHLOAD_H

#include <stdint.h>

/* request i's output length: uniform in [lo, hi] (lo <= hi), from seed and i only */
int benchload_out_len(uint64_t seed, long i, int lo, int hi);

/* Prompts made of token ids in [3, vocab) (vocab > 3), drawn from a seed and an index alone, so that they do not
 * depend on the order requests are sent or end in:
 * benchload_ids: n ids for index i (request i's own part of its prompt, or probe i's prompt);
 * benchload_prefix: shared prefix k of n ids, from prefix_seed and k only (two runs with other bench seeds and the
 * same prefix seed share their prefixes); request or chat i starts with prefix benchload_prefix_of(i, K) = i mod K;
 * benchload_prompt_len: request i's own prompt length, uniform in [lo, hi], independent of its output length. */
void benchload_ids(uint64_t seed, long i, int32_t *out, int n, int vocab);
void benchload_prefix(uint64_t prefix_seed, int k, int32_t *out, int n, int vocab);
int benchload_prefix_of(long i, int n_prefixes);
int benchload_prompt_len(uint64_t seed, long i, int lo, int hi);

/* an order-independent digest of a run's outputs: the sum over requests of their digests, each started by
 * benchload_digest_start(i) and fed its output ids in order (benchload_digest_add), so that two runs that give
 * every request i the same ids give the same sum whatever order requests end in */
uint64_t benchload_digest_start(long i);
uint64_t benchload_digest_add(uint64_t h, const int32_t *ids, int n);

/* seconds after the start at which the first request of stream k (0..streams-1) is sent */
double benchload_start(int k, int streams, double ramp_ms);

/* the burstiness of n send times (seconds, any order; sorted in place): for each request, the number of requests
 * sent in the same whole millisecond as it; writes their p50, p99 and maximum over the requests (0 when n is 0) */
void benchload_burst(double *t_sent, long n, double *p50, double *p99, double *max);

#endif
