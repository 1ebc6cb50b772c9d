/* broker/bk_route.c: per-worker block-hash summaries and the routing choice (bk_route.h). */
#include "bk_route.h"
#include "proto.h"

#include <stdlib.h>
#include <string.h>

#define SLOTS 16384 /* power of two, over twice the most entries (PROTO_MAX_KV_HASHES + BK_ROUTE_PENDING_MAX) */

typedef struct {
    uint64_t h;
    double t_routed; /* > 0: routed at that time (counts for BK_ROUTE_PENDING_MS) */
    uint8_t used, reported;
} entry;

struct bk_summary {
    entry *tab, *old; /* [SLOTS] each: the live table and the rebuild scratch */
    uint32_t n, n_routed;
};

bk_summary *bk_summary_new(void) {
    bk_summary *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tab = calloc(SLOTS, sizeof *s->tab);
    s->old = calloc(SLOTS, sizeof *s->old);
    if (!s->tab || !s->old) bk_summary_destroy(&s);
    return s;
}

void bk_summary_destroy(bk_summary **ps) {
    if (!ps || !*ps) return;
    free((*ps)->tab);
    free((*ps)->old);
    free(*ps);
    *ps = NULL;
}

static uint32_t slot_of(uint64_t h) { return (uint32_t)((h ^ h >> 29) * 0x9e3779b97f4a7c15ull >> 40) & (SLOTS - 1); }

static entry *find(const bk_summary *s, uint64_t h) {
    for (uint32_t i = slot_of(h), k = 0; k < SLOTS; i = (i + 1) & (SLOTS - 1), k++) {
        entry *e = &s->tab[i];
        if (!e->used) return NULL;
        if (e->h == h) return e;
    }
    return NULL;
}

/* the entry for h, inserted when absent; NULL when the table is at its bound */
static entry *insert(bk_summary *s, uint64_t h) {
    for (uint32_t i = slot_of(h), k = 0; k < SLOTS; i = (i + 1) & (SLOTS - 1), k++) {
        entry *e = &s->tab[i];
        if (e->used && e->h == h) return e;
        if (!e->used) {
            if (s->n >= PROTO_MAX_KV_HASHES + BK_ROUTE_PENDING_MAX) return NULL;
            memset(e, 0, sizeof *e);
            e->used = 1;
            e->h = h;
            s->n++;
            return e;
        }
    }
    return NULL;
}

void bk_summary_report(bk_summary *s, const uint64_t *h, uint32_t n, double t) {
    if (!s) return;
    if (n > PROTO_MAX_KV_HASHES) n = PROTO_MAX_KV_HASHES;
    entry *keep = s->tab;
    s->tab = s->old;
    s->old = keep;
    memset(s->tab, 0, SLOTS * sizeof *s->tab);
    s->n = s->n_routed = 0;
    for (uint32_t i = 0; i < n; i++) {
        entry *e = insert(s, h[i]);
        if (e) e->reported = 1;
    }
    for (uint32_t i = 0; i < SLOTS; i++) {
        const entry *o = &keep[i];
        if (!o->used || o->t_routed <= 0 || t - o->t_routed > BK_ROUTE_PENDING_MS) continue;
        if (s->n_routed >= BK_ROUTE_PENDING_MAX) break;
        entry *e = insert(s, o->h);
        if (e) {
            e->t_routed = o->t_routed;
            s->n_routed++;
        }
    }
}

void bk_summary_note(bk_summary *s, const uint64_t *h, int n, double t) {
    if (!s) return;
    for (int i = 0; i < n && s->n_routed < BK_ROUTE_PENDING_MAX; i++) {
        entry *e = insert(s, h[i]);
        if (!e) return;
        if (e->t_routed <= 0) s->n_routed++;
        e->t_routed = t > 0 ? t : 1e-9;
    }
}

int bk_summary_match(const bk_summary *s, const uint64_t *h, int n, double t) {
    if (!s) return 0;
    int k = 0;
    while (k < n) {
        const entry *e = find(s, h[k]);
        if (!e || (!e->reported && t - e->t_routed > BK_ROUTE_PENDING_MS)) break;
        k++;
    }
    return k;
}

uint32_t bk_summary_size(const bk_summary *s) { return s ? s->n : 0; }

int bk_route_pick(const bk_cand *c, int n, int slack, int *balanced) {
    int least = -1, best = -1;
    if (balanced) *balanced = 0;
    for (int i = 0; i < n; i++) {
        if (!c[i].fits) continue;
        if (least < 0 || c[i].load < c[least].load) least = i;
        if (best < 0 || c[i].match > c[best].match ||
            (c[i].match == c[best].match &&
             (c[i].load < c[best].load || (c[i].load == c[best].load && c[i].free > c[best].free))))
            best = i;
    }
    if (best < 0) return -1;
    if (c[best].match == 0) { /* no prefix anywhere: the most free slots, as without routing */
        int pick = -1;
        for (int i = 0; i < n; i++)
            if (c[i].fits && c[i].free > 0 && (pick < 0 || c[i].free > c[pick].free)) pick = i;
        return pick;
    }
    if ((int64_t)c[best].load > (int64_t)c[least].load + slack) {
        int pick = -1;
        for (int i = 0; i < n; i++) {
            if (!c[i].fits || (int64_t)c[i].load > (int64_t)c[least].load + slack) continue;
            if (pick < 0 || c[i].match > c[pick].match || (c[i].match == c[pick].match && c[i].free > c[pick].free))
                pick = i;
        }
        if (balanced && pick >= 0 && c[pick].match < c[best].match) *balanced = 1;
        best = pick;
    }
    return best >= 0 && c[best].free > 0 ? best : -1;
}
