/* broker/bk_route.h: cache-aware routing (docs/kv-cache.md): per worker, a bounded summary of the KV block hashes
 * it holds, and the choice of a worker for a request from its prompt's chained block hashes (common/kv_hash.h).
 *
 * A summary holds the hashes the worker last reported (`hb` `kv_hashes`, at most PROTO_MAX_KV_HASHES, each
 * report replacing the previous one) and the hashes of the prompts the broker routed to it since, for
 * BK_ROUTE_PENDING_MS (a worker reports a prompt's blocks only once it has run it; until then the broker's own
 * routing stands in). Everything in it came from a worker and is only ever used to choose a worker: a lying
 * worker can attract or repel requests, never change their results. */
#ifndef ZLLM_BK_ROUTE_H
#define ZLLM_BK_ROUTE_H
#include <stdint.h>

#define BK_ROUTE_PENDING_MS 2000.0 /* how long a routed prompt's hashes count without the worker reporting them */
#define BK_ROUTE_PENDING_MAX 2048  /* routed hashes held per worker beyond its report */
#define BK_ROUTE_MAX_BLOCKS 4096   /* prompt blocks hashed for routing (a summary never holds more) */
#define BK_ROUTE_WINDOW 64         /* queued requests (of the head's priority) searched for one whose worker has room */

typedef struct bk_summary bk_summary;

bk_summary *bk_summary_new(void);        /* NULL when out of memory */
void bk_summary_destroy(bk_summary **s); /* idempotent; sets *s to NULL */
/* replaces the reported hashes with h[0..n) (n is clamped to PROTO_MAX_KV_HASHES); routed hashes younger than
 * BK_ROUTE_PENDING_MS at time t are kept */
void bk_summary_report(bk_summary *s, const uint64_t *h, uint32_t n, double t);
/* adds the hashes of a prompt routed to the worker at time t (up to BK_ROUTE_PENDING_MAX held) */
void bk_summary_note(bk_summary *s, const uint64_t *h, int n, double t);
/* how many leading hashes of h[0..n) the summary holds at time t */
int bk_summary_match(const bk_summary *s, const uint64_t *h, int n, double t);
uint32_t bk_summary_size(const bk_summary *s); /* hashes held (reported + routed) */

/* one worker as seen for one request */
typedef struct {
    int fits;  /* its context fits the request */
    int load;  /* sequences assigned to it */
    int free;  /* free sequence slots */
    int match; /* leading prompt blocks in its summary */
} bk_cand;

/* Picks the worker for a request: the one with the longest match (ties: lower load, then more free slots),
 * unless its load exceeds the least loaded fitting worker's by more than slack, in which case the longest match
 * among the workers within slack of the least load; with no match anywhere, the one with the most free slots.
 * Returns its index; -1 when nothing fits or the chosen worker has no free slot (the request waits for it);
 * *balanced is set to 1 when a longer match was passed over for load. */
int bk_route_pick(const bk_cand *c, int n, int slack, int *balanced);
#endif
