/* common/benchload.c: the load shared by `zllm bench` and zllm-httpbench (see benchload.h). */
#include "benchload.h"
#include <math.h>
#include <stdlib.h>

/* splitmix64: a full-period mix of a counter, so that neighbouring i give independent draws */
static uint64_t s_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int benchload_out_len(uint64_t seed, long i, int lo, int hi) {
    if (hi <= lo) return lo;
    uint64_t r = s_mix(s_mix(seed) ^ (uint64_t)i);
    return lo + (int)(r % (uint64_t)(hi - lo + 1));
}

/* a counter-driven stream of draws: draw j of stream (seed, i) */
static uint64_t s_draw(uint64_t seed, long i, long j) { return s_mix(s_mix(s_mix(seed) ^ (uint64_t)i) + (uint64_t)j); }

/* n ids in [3, vocab), draws [0, n) of stream (seed, i) */
static void s_ids(uint64_t seed, long i, int32_t *out, int n, int vocab) {
    for (int j = 0; j < n; j++) out[j] = 3 + (int32_t)(s_draw(seed, i, j) % (uint64_t)(vocab - 3));
}

void benchload_ids(uint64_t seed, long i, int32_t *out, int n, int vocab) { s_ids(seed ^ 0x1D5ull, i, out, n, vocab); }

void benchload_prefix(uint64_t prefix_seed, int k, int32_t *out, int n, int vocab) {
    s_ids(prefix_seed ^ 0x9F3ull, k, out, n, vocab);
}

int benchload_prefix_of(long i, int n_prefixes) { return n_prefixes > 0 ? (int)(i % n_prefixes) : 0; }

int benchload_prompt_len(uint64_t seed, long i, int lo, int hi) {
    if (hi <= lo) return lo;
    return lo + (int)(s_draw(seed ^ 0x71Eull, i, 0) % (uint64_t)(hi - lo + 1));
}

uint64_t benchload_digest_start(long i) { return s_mix((uint64_t)i ^ 0xD16E57ull); }

uint64_t benchload_digest_add(uint64_t h, const int32_t *ids, int n) {
    for (int j = 0; j < n; j++) h = s_mix(h ^ (uint32_t)ids[j]);
    return h;
}

double benchload_start(int k, int streams, double ramp_ms) {
    if (streams < 1 || ramp_ms <= 0) return 0;
    return ramp_ms * 1e-3 * k / streams;
}

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int s_cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

void benchload_burst(double *t_sent, long n, double *p50, double *p99, double *max) {
    *p50 = *p99 = *max = 0;
    if (n <= 0) return;
    qsort(t_sent, (size_t)n, sizeof *t_sent, s_cmp);
    long *seen = malloc((size_t)n * sizeof *seen); /* per request: the sends of its millisecond */
    if (!seen) return;
    for (long i = 0; i < n;) {
        double ms = floor(t_sent[i] * 1e3);
        long j = i;
        while (j < n && floor(t_sent[j] * 1e3) == ms) j++;
        for (long k = i; k < j; k++) seen[k] = j - i;
        i = j;
    }
    qsort(seen, (size_t)n, sizeof *seen, s_cmp_long);
    long i50 = (long)ceil(0.50 * (double)n) - 1, i99 = (long)ceil(0.99 * (double)n) - 1;
    *p50 = (double)seen[i50 < 0 ? 0 : i50];
    *p99 = (double)seen[i99 < 0 ? 0 : i99];
    *max = (double)seen[n - 1];
    free(seen);
}
