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

/* seconds after the start at which the first request of stream k (0..streams-1) is sent */
double benchload_start(int k, int streams, double ramp_ms);

/* the burstiness of n send times (seconds, any order; sorted in place): for each request, the number of requests
 * sent in the same whole millisecond as it; writes their p50, p99 and maximum over the requests (0 when n is 0) */
void benchload_burst(double *t_sent, long n, double *p50, double *p99, double *max);

#endif
