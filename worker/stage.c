/* worker/stage.c: pipeline stages over host shared memory (see stage.h, docs/pipeline.md).
 *
 * Rings of the group (n = n_stages): for each link i -> i+1 (i < n-1), ring 2i holds descriptors and ring 2i+1
 * the hidden states of the same micro-batches, published hidden first; ring 2(n-1) returns sampled ids and
 * generator states from the last stage to the leader. Member index = stage index. With the GPU transport
 * (stage_cuda.h; when the leader's engine is CUDA) ring 2i+1 carries the link's set-up message and then one
 * record per micro-batch instead of the hidden states, which stay in device memory, and ring 2(n-1)+1+i is the
 * link's back ring (the consumer's set-up answer). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shmring.h"
#include "stage.h"
#include "stage_cuda.h"

#define S_INFO_MAGIC 0x45474154u   /* "TAGE" */
#define S_INFO_VERSION 2u
#define S_WAIT_MS 200              /* follower's wait slice between checks of *stop */
#define S_FULL_MS                                                                                                      \
    30000 /* a reservation waits at most this long for a full ring: in a working group no
                                    * stage ever waits for one (at most ring_cap micro-batches are in flight), so
                                    * a ring full this long means its consumer stopped consuming */

/* what the leader writes into the group for the followers (and what they check) */
typedef struct {
    uint32_t magic, version;       /* S_INFO_MAGIC, S_INFO_VERSION */
    uint32_t sz_desc, sz_entry;    /* sizeof(stage_desc), sizeof(stage_entry): the same binary layout */
    int32_t n_stages;              /* stages */
    int32_t n_layers, dim, vocab;  /* model shape (followers check theirs) */
    int32_t n_slots, n_ctx, max_batch, max_step_tokens;   /* the leader's engine, resolved */
    int32_t hist_cap;              /* history ids a descriptor can carry */
    int32_t transport;             /* 0: host shm rings; 1: GPU transport (every stage runs a CUDA engine) */
    int32_t no_graphs;             /* the leader's zl_engine_opts.no_graphs (CUDA followers use the same) */
    int32_t ring_cap;              /* slots per ring (GPU links size their device rings from it) */
    int32_t pad;
} s_info;

/* one returned sequence */
typedef struct {
    int32_t tok;                   /* sampled id, -1 when not sampled */
    int32_t pad;
    uint64_t rng;                  /* generator state after sampling */
} s_ret_entry;

typedef struct {
    uint64_t step;                 /* as the descriptor */
    int32_t micro;                 /* as the descriptor */
    int32_t n;                     /* entries that follow */
} s_ret;

/* ------------------------------------------------------------------------------------------------------------
 * host transport: descriptor ring + hidden-state ring of one link */

typedef struct {
    shm_group *g;                  /* the group */
    int ring_desc, ring_hidden;    /* ring indexes */
    uint64_t hidden_bytes;         /* payload bytes of a hidden slot */
    int dim;                       /* floats per hidden row */
    stage_desc *w_desc;            /* reserved descriptor (producer) */
    stage_cuda_link *cu;           /* GPU transport: the link's device end (s_cuda_ops), NULL for the host one */
    stage_desc *r_desc;            /* consumer: private copy of the descriptor peeked (desc_cap bytes) */
    uint64_t desc_cap;             /* bytes of r_desc */
} s_host_link;

/* Consumer: copies the descriptor peeked from shared memory (d, bytes) into the link's private buffer, which
 * is what the stage then checks and uses: another process writing the slot meanwhile cannot change a count
 * between its check and its use. 0, or -1 with a message. */
static int s_desc_take(s_host_link *l, const void *d, uint64_t bytes, char *err, size_t errlen) {
    if (!l->r_desc || bytes < sizeof(stage_desc) || bytes > l->desc_cap) {
        snprintf(err, errlen, "step descriptor of %llu bytes (most %llu)", (unsigned long long)bytes,
                 (unsigned long long)l->desc_cap);
        return -1;
    }
    memcpy(l->r_desc, d, bytes);
    return 0;
}

/* reserves a slot of ring r, waiting at most S_FULL_MS; 0, or -1 with a message */
static int s_reserve(shm_group *g, int r, void **p, char *err, size_t errlen) {
    int rc = shm_ring_reserve(g, r, S_FULL_MS, p, err, errlen);
    if (rc == 1) snprintf(err, errlen, "ring %d stayed full for %d ms: its consumer stopped consuming", r, S_FULL_MS);
    return rc ? -1 : 0;
}

static int s_host_reserve(void *ctx, stage_desc **desc, float **hidden, char *err, size_t errlen) {
    s_host_link *l = ctx;
    void *h, *d;
    /* hidden first: a descriptor is never published before its hidden states */
    if (s_reserve(l->g, l->ring_hidden, &h, err, errlen) || s_reserve(l->g, l->ring_desc, &d, err, errlen)) return -1;
    *hidden = h;
    *desc = l->w_desc = d;
    return 0;
}

static int s_host_publish(void *ctx, uint64_t desc_bytes, char *err, size_t errlen) {
    s_host_link *l = ctx;
    uint64_t hb = (uint64_t)(l->w_desc->n_rows > 0 ? l->w_desc->n_rows : 0) * (uint64_t)l->dim * sizeof(float);
    if (shm_ring_publish(l->g, l->ring_hidden, hb, err, errlen) ||
        shm_ring_publish(l->g, l->ring_desc, desc_bytes, err, errlen))
        return -1;
    return 0;
}

static int s_host_peek(void *ctx, const stage_desc **desc, uint64_t *desc_bytes, const float **hidden, char *err,
                       size_t errlen) {
    s_host_link *l = ctx;
    const void *d, *h;
    uint64_t hb;
    int rc = shm_ring_peek(l->g, l->ring_desc, S_WAIT_MS, &d, desc_bytes, err, errlen);
    if (rc) return rc;   /* 1: nothing yet (the caller checks its stop flag and retries) */
    /* the hidden states were published before the descriptor: they must be there now */
    if (shm_ring_peek(l->g, l->ring_hidden, 0, &h, &hb, err, errlen) != 0) {
        snprintf(err + strlen(err), errlen - strlen(err), " (hidden states missing for a descriptor)");
        return -1;
    }
    if (s_desc_take(l, d, *desc_bytes, err, errlen)) return -1;
    const stage_desc *dd = l->r_desc;
    if (dd->n_rows < 1 || hb != (uint64_t)dd->n_rows * (uint64_t)l->dim * sizeof(float)) {
        snprintf(err, errlen, "hidden states of %llu bytes do not match the descriptor", (unsigned long long)hb);
        return -1;
    }
    *desc = dd;
    *hidden = h;
    return 0;
}

static void s_host_release(void *ctx) {
    s_host_link *l = ctx;
    shm_ring_release(l->g, l->ring_hidden);
    shm_ring_release(l->g, l->ring_desc);
}

static const stage_transport_ops s_host_ops = { s_host_reserve, s_host_publish, s_host_peek, s_host_release };

/* ------------------------------------------------------------------------------------------------------------
 * GPU transport: the descriptor ring as above, the hidden states in the link's device slots (stage_cuda.h);
 * the hidden pointers handed out are device pointers, used only through s_run_layers */

static int s_cuda_reserve(void *ctx, stage_desc **desc, float **hidden, char *err, size_t errlen) {
    s_host_link *l = ctx;
    void *d;
    /* the record's host slot first, as the host transport reserves its hidden slot first */
    if (stage_cuda_link_reserve(l->cu, hidden, err, errlen) || s_reserve(l->g, l->ring_desc, &d, err, errlen))
        return -1;
    *desc = l->w_desc = d;
    return 0;
}

static int s_cuda_publish(void *ctx, uint64_t desc_bytes, char *err, size_t errlen) {
    s_host_link *l = ctx;
    if (stage_cuda_link_publish(l->cu, l->w_desc->n_rows, err, errlen) ||
        shm_ring_publish(l->g, l->ring_desc, desc_bytes, err, errlen))
        return -1;
    return 0;
}

static int s_cuda_peek(void *ctx, const stage_desc **desc, uint64_t *desc_bytes, const float **hidden, char *err,
                       size_t errlen) {
    s_host_link *l = ctx;
    const void *d;
    int rc = shm_ring_peek(l->g, l->ring_desc, S_WAIT_MS, &d, desc_bytes, err, errlen);
    if (rc) return rc;
    if (s_desc_take(l, d, *desc_bytes, err, errlen)) return -1;
    const stage_desc *dd = l->r_desc;
    /* the record was published before the descriptor; its rows must match (checked against the capacity) */
    if (stage_cuda_link_peek(l->cu, dd->n_rows, hidden, err, errlen)) return -1;
    *desc = dd;
    return 0;
}

static void s_cuda_release(void *ctx) {
    s_host_link *l = ctx;
    stage_cuda_link_release(l->cu);
    shm_ring_release(l->g, l->ring_desc);
}

static const stage_transport_ops s_cuda_ops = { s_cuda_reserve, s_cuda_publish, s_cuda_peek, s_cuda_release };

/* Runs e's layers on one micro-batch: from in's hidden states h_in (in NULL: stage 0 embeds the tokens) to
 * out's buffer h_out (out NULL: the last stage samples into toks). With the GPU transport both are device
 * buffers ordered by the links' events (stage_cuda_run); otherwise host memory. On failure e->err says why. */
static int s_run_layers(zl_engine *e, shm_group *g, const zl_seq *seqs, int n, s_host_link *in, const float *h_in,
                        s_host_link *out, float *h_out, int32_t *toks) {
    if ((in && in->cu) || (out && out->cu)) {
        char err[sizeof e->err];
        if (stage_cuda_run(e, g, seqs, n, in ? in->cu : NULL, h_in, out ? out->cu : NULL, h_out, toks, err,
                           sizeof err) != 0) {
            memcpy(e->err, err, sizeof err);
            return -1;
        }
        return 0;
    }
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = seqs;
    st.n = n;
    st.sync = 1;
    st.h_in = h_in;
    st.h_out = h_out;
    st.out_tokens = toks;
    return engine_run(e, &st);
}

/* ------------------------------------------------------------------------------------------------------------
 * monitor thread: heartbeats while the stage computes or idles, and notices a dead peer even when idle */

typedef struct {
    shm_group *g;                  /* the group (its mapping outlives the thread) */
    pthread_t tid;                 /* the thread */
    int started;                   /* 1 once created */
    int quit;                      /* set (atomically) to stop it */
    int term_on_failure;           /* 1: SIGTERM this process when the group fails */
    int fired;                     /* set (atomically, after why) once the monitor failed the group */
    char why[200];                 /* what it saw (a dead peer, a corrupt header), valid once fired */
} s_monitor;

static void *s_monitor_fn(void *arg) {
    s_monitor *mo = arg;
    char err[200];
    int fired = 0;
    while (!__atomic_load_n(&mo->quit, __ATOMIC_ACQUIRE)) {
        shm_group_heartbeat(mo->g);
        if (!fired && shm_group_check(mo->g, err, sizeof err) != 0 && shm_group_aborted(mo->g) != SHM_SHUTDOWN) {
            fired = 1;
            snprintf(mo->why, sizeof mo->why, "%s", err);
            __atomic_store_n(&mo->fired, 1, __ATOMIC_RELEASE);
            shm_group_abort(mo->g, SHM_FAILED);
            if (mo->term_on_failure) {
                fprintf(stderr, "pipeline: %s: stopping this process\n", err);
                kill(getpid(), SIGTERM);
            }
        }
        usleep(100000);
    }
    return NULL;
}

static int s_monitor_start(s_monitor *mo, shm_group *g, int term, char *err, size_t errlen) {
    mo->g = g;
    mo->quit = 0;
    mo->term_on_failure = term;
    if (pthread_create(&mo->tid, NULL, s_monitor_fn, mo) != 0) {
        snprintf(err, errlen, "pipeline: cannot start the monitor thread");
        return -1;
    }
    mo->started = 1;
    return 0;
}

/* the reason the monitor failed the group, or NULL when it did not */
static const char *s_monitor_why(const s_monitor *mo) {
    return __atomic_load_n(&mo->fired, __ATOMIC_ACQUIRE) ? mo->why : NULL;
}

static void s_monitor_stop(s_monitor *mo) {
    if (!mo->started) return;
    __atomic_store_n(&mo->quit, 1, __ATOMIC_RELEASE);
    pthread_join(mo->tid, NULL);
    mo->started = 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * shared helpers */

void stage_layer_range(int n_layers, int stage, int n_stages, int *begin, int *end) {
    *begin = (int)((int64_t)n_layers * stage / n_stages);
    *end = (int)((int64_t)n_layers * (stage + 1) / n_stages);
}

/* a decimal number of 1..3 digits (nothing else: no sign or space) at *p, which moves past it; -1 when none */
static int s_small_num(const char **p) {
    int v = 0, k = 0;
    for (; (*p)[k] >= '0' && (*p)[k] <= '9'; k++) {
        if (k == 3) return -1;
        v = v * 10 + ((*p)[k] - '0');
    }
    *p += k;
    return k ? v : -1;
}

int stage_parse(const char *arg, int *stage, int *n_stages) {
    if (!arg) return -1;
    const char *p = arg;
    int i = s_small_num(&p);
    if (i < 0 || *p++ != '/') return -1;
    int n = s_small_num(&p);
    if (*p != 0 || n < 2 || n > STAGE_MAX || i >= n) return -1;
    *stage = i;
    *n_stages = n;
    return 0;
}

static uint64_t s_desc_cap(const s_info *in) {
    return sizeof(stage_desc) + (uint64_t)in->max_batch * sizeof(stage_entry) + (uint64_t)in->hist_cap * 4;
}

static stage_entry *s_entries(const stage_desc *d) {
    return (stage_entry *)((char *)d + sizeof(stage_desc));
}

static int32_t *s_hist(const stage_desc *d) {
    return (int32_t *)((char *)d + sizeof(stage_desc) + (size_t)d->n * sizeof(stage_entry));
}

/* a received descriptor: every count and offset within the group's limits */
static int s_desc_check(const s_info *in, const stage_desc *d, uint64_t bytes, char *err, size_t errlen) {
    if (bytes < sizeof *d || d->n < 1 || d->n > in->max_batch || d->n_hist < 0 || d->n_hist > in->hist_cap ||
        d->n_rows < 1 || d->n_rows > in->max_step_tokens || d->micro < 0 || d->micro >= d->n_micro ||
        bytes != sizeof *d + (uint64_t)d->n * sizeof(stage_entry) + (uint64_t)d->n_hist * 4) {
        snprintf(err, errlen, "bad step descriptor (n %d, rows %d, hist %d, %llu bytes)", d->n, d->n_rows,
                 d->n_hist, (unsigned long long)bytes);
        return -1;
    }
    const stage_entry *e = s_entries(d);
    int64_t rows = 0;
    for (int i = 0; i < d->n; i++) {
        if (e[i].n_tokens < 1 || e[i].hist_off < 0 || e[i].n_hist < 0 ||
            (int64_t)e[i].hist_off + e[i].n_hist > d->n_hist) {
            snprintf(err, errlen, "bad descriptor entry %d", i);
            return -1;
        }
        rows += e[i].n_tokens;
    }
    if (rows != d->n_rows) {
        snprintf(err, errlen, "descriptor rows %d but entries hold %lld", d->n_rows, (long long)rows);
        return -1;
    }
    return 0;
}

static void s_opts_defaults(const stage_opts *so, stage_opts *out) {
    *out = *so;
    if (out->attach_timeout_ms <= 0) out->attach_timeout_ms = 30000;
    if (out->dead_ms <= 0) out->dead_ms = 10000;
    if (out->ring_cap <= 0) out->ring_cap = 4;
    if (out->micro_batches <= 0) out->micro_batches = 2;
}

/* ------------------------------------------------------------------------------------------------------------
 * leader */

#define S_LANES 8 /* lane ids a leader accepts (zl_step.lane); it asks for 2 */

/* one lane's step in flight (launched, not yet waited for) */
typedef struct {
    int busy;                      /* 1 while the step is in flight */
    uint64_t ord;                  /* submission ordinal: steps are collected in this order (FIFO return ring) */
    uint64_t step;                 /* its step number in the descriptors */
    const zl_step *st;             /* the caller's step, valid until its wait (ids and rng written back there) */
    const zl_seq *seqs;            /* st->seqs */
    int n;                         /* entries */
    int n_micro;                   /* micro-batches published */
    int bnd[STAGE_MAX * 4 + 1];    /* micro-batch k is seqs[bnd[k], bnd[k+1]) */
} s_lane_step;

typedef struct {
    zl_engine base;                /* public part; must stay first */
    zl_engine *local;              /* stage 0's layers */
    shm_group *g;                  /* the group */
    s_info info;                   /* what the followers were told */
    s_host_link link0;             /* link 0 -> 1 (host transport) */
    const stage_transport_ops *tx; /* its operations */
    int ring_ret;                  /* return ring index */
    uint64_t step;                 /* steps run */
    int micro;                     /* micro-batches per step (most) */
    s_monitor mon;                 /* heartbeat/peer monitor */
    s_lane_step lane[S_LANES];     /* steps in flight, by lane */
    uint64_t ord_next;             /* ordinal of the next submitted step */
    uint64_t ord_collect;          /* ordinal of the step to collect next */
    int inflight_micro;            /* micro-batches submitted and not collected (<= info.ring_cap) */
    int dead_ms;                   /* stage_opts.dead_ms (teardown waits) */
} s_leader;

/* the GPU end of link `l` and the engine whose stream uses it: drained, then the link's two-phase teardown
 * (stage_cuda.h); when the stream cannot drain (it waits on a dead peer's event) both are abandoned to the
 * process's exit instead of hanging here */
static void s_cuda_teardown(zl_engine *e, s_host_link *l, int dead_ms) {
    const int abandon = e && stage_cuda_drain(e, 2000) == 0;   /* 0: e was abandoned too */
    if (l && l->cu) stage_cuda_link_destroy(&l->cu, abandon, dead_ms);
}

static void s_leader_destroy(zl_engine *eb) {
    if (!eb) return;
    s_leader *L = (s_leader *)eb;
    s_monitor_stop(&L->mon);
    if (L->g) {
        shm_group_abort(L->g, SHM_SHUTDOWN);
        /* GPU link: closes the imports and frees the buffer once stage 1 has left the group (two phases) */
        if (L->link0.cu) s_cuda_teardown(L->local, &L->link0, L->dead_ms);
        shm_group_destroy(&L->g);
    }
    engine_destroy(&L->local);
    free(L);
}

/* fails the step: the group is aborted (a half-run step leaves the followers' state unknown) */
static int s_leader_fail(s_leader *L, const char *what, const char *why) {
    char msg[200];
    const char *mw = s_monitor_why(&L->mon);    /* what the monitor saw, when it failed the group */
    snprintf(msg, sizeof msg, "%.199s", why);   /* why may be base.err itself */
    int k = snprintf(L->base.err, sizeof L->base.err, "pipeline: %.20s: %s", what, msg);
    if (mw && k > 0 && (size_t)k + 4 < sizeof L->base.err)
        snprintf(L->base.err + k, sizeof L->base.err - (size_t)k, " (%s)", mw);
    shm_group_abort(L->g, SHM_FAILED);
    return -1;
}

/* the ids of s's history that travel (the sampler reads only the last repeat_last_n) */
static int64_t s_hist_tail(const zl_seq *s) {
    if (!s->samp || !s->history || s->n_history <= 0 || s->samp->repeat_last_n <= 0) return 0;
    return s->n_history < s->samp->repeat_last_n ? s->n_history : s->samp->repeat_last_n;
}

/* the whole batch is checked before any micro-batch leaves: a bad entry in the second half must not fail the
 * group after the first half went out (and the same slot in two halves would not be seen by either half) */
static int s_leader_check(s_leader *L, const zl_seq *seqs, int n) {
    zl_engine *b = &L->base;
    int64_t rows = 0, hist = 0;
    for (int i = 0; i < n; i++) {
        const zl_seq *s = &seqs[i];
        if (s->slot < 0 || s->slot >= b->n_slots || s->n_tokens < 1 || s->pos < 0 || !s->tokens ||
            (int64_t)s->pos + s->n_tokens > b->n_ctx) {
            snprintf(b->err, sizeof b->err, "step: seq %d: slot %d, pos %d + %d tokens out of range", i, s->slot,
                     s->pos, s->n_tokens);
            return -1;
        }
        for (int k = 0; k < i; k++)
            if (seqs[k].slot == s->slot) {
                snprintf(b->err, sizeof b->err, "step: slot %d appears twice", s->slot);
                return -1;
            }
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= L->info.vocab) {
                snprintf(b->err, sizeof b->err, "step: seq %d: token %d out of vocabulary", i, (int)s->tokens[t]);
                return -1;
            }
        if (s->sample && s->samp && s->samp->temperature > 0.0f && !s->rng) {
            snprintf(b->err, sizeof b->err, "step: seq %d samples with temperature but has no rng state", i);
            return -1;
        }
        rows += s->n_tokens;
        hist += s_hist_tail(s);
    }
    if (rows > b->max_step_tokens || hist > L->info.hist_cap) {
        snprintf(b->err, sizeof b->err, "step: %lld tokens (most %d) or %lld history ids (most %d)",
                 (long long)rows, b->max_step_tokens, (long long)hist, L->info.hist_cap);
        return -1;
    }
    return 0;
}

/* Steps in flight (lanes, zl_engine_ops.launch): submit cuts a lane's step into micro-batches, runs stage 0's
 * layers on each and publishes it at once; the wait (collect) takes the step's returns later. The return ring is
 * FIFO, so steps are collected in submission order. A micro-batch in flight holds at most one slot of each ring,
 * and the micro-batches of all steps in flight never exceed ring_cap (per_step and the room check below): so no
 * stage ever waits for a full ring, which could deadlock (the last stage blocked on the return ring that the
 * leader drains only in collect, while the leader is blocked on link 0 in a submit). per_step: most micro-batches
 * of this step (ring_cap / lanes, so that every lane finds room). */
static int s_leader_submit_n(s_leader *L, const zl_step *st, int per_step) {
    zl_engine *eb = &L->base;
    const zl_seq *seqs = st->seqs;
    const int n = st->n, lane = st->lane;
    char err[256];
    if (lane < 0 || lane >= S_LANES) {
        snprintf(eb->err, sizeof eb->err, "step: lane %d outside 0..%d", lane, S_LANES - 1);
        return -1;
    }
    s_lane_step *ln = &L->lane[lane];
    if (ln->busy) {
        snprintf(eb->err, sizeof eb->err, "step: lane %d already has a step in flight", lane);
        return -1;
    }
    if (!seqs || n < 1 || n > eb->max_batch) {
        snprintf(eb->err, sizeof eb->err, "step: %d sequences (1..%d allowed)", n, eb->max_batch);
        return -1;
    }
    if (shm_group_aborted(L->g) != SHM_RUNNING) return s_leader_fail(L, "group", "aborted");
    if (s_leader_check(L, seqs, n)) return -1;
    /* a slot in two steps in flight would get its KV positions and generator state updated by both */
    for (int k = 0; k < S_LANES; k++) {
        if (!L->lane[k].busy) continue;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < L->lane[k].n; j++)
                if (seqs[i].slot == L->lane[k].seqs[j].slot) {
                    snprintf(eb->err, sizeof eb->err, "step: slot %d already has a step in flight (lane %d)",
                             seqs[i].slot, k);
                    return -1;
                }
    }
    int room = L->info.ring_cap - L->inflight_micro;
    int n_micro = n < L->micro ? n : L->micro;
    if (n_micro > per_step) n_micro = per_step;
    if (n_micro > room) n_micro = room;
    if (n_micro < 1) {
        snprintf(eb->err, sizeof eb->err, "step: %d micro-batches in flight fill the rings (ring_cap %d): fewer lanes",
                 L->inflight_micro, L->info.ring_cap);
        return -1;
    }
    /* micro-batch k is seqs [bnd[k], bnd[k+1]): cut where the running row count passes k/n_micro of the rows,
     * so that a long prompt chunk does not leave the other parts nearly empty; each part keeps >= 1 sequence */
    int *bnd = ln->bnd;
    if (n_micro > STAGE_MAX * 4) n_micro = STAGE_MAX * 4;
    int64_t total = 0, run = 0;
    for (int i = 0; i < n; i++) total += seqs[i].n_tokens;
    bnd[0] = 0;
    bnd[n_micro] = n;
    for (int k = 1, j = 0; k < n_micro; k++) {
        while (j < n && run * n_micro < total * k) run += seqs[j++].n_tokens;
        int lo_ok = bnd[k - 1] + 1, hi_ok = n - (n_micro - k);
        bnd[k] = j < lo_ok ? lo_ok : j > hi_ok ? hi_ok : j;
        if (bnd[k] != j) {   /* clamped: restart the running count at the cut */
            j = bnd[k];
            run = 0;
            for (int i = 0; i < j; i++) run += seqs[i].n_tokens;
        }
    }
    uint64_t step = L->step++;
    for (int mi = 0; mi < n_micro; mi++) {
        int lo = bnd[mi], hi = bnd[mi + 1];
        stage_desc *d;
        float *hidden;
        if (L->tx->reserve(&L->link0, &d, &hidden, err, sizeof err)) return s_leader_fail(L, "send", err);
        d->step = step;
        d->micro = mi;
        d->n_micro = n_micro;
        d->n = hi - lo;
        d->pad = 0;
        /* the slot is shared: nothing written into it is read back (another process may change it meanwhile),
         * so its layout comes from the local count */
        stage_entry *e = s_entries(d);
        int32_t *hist = (int32_t *)(e + (hi - lo));
        int64_t rows = 0, nh = 0;
        for (int i = lo; i < hi; i++) {
            const zl_seq *s = &seqs[i];
            stage_entry *x = &e[i - lo];
            memset(x, 0, sizeof *x);
            x->slot = s->slot;
            x->pos = s->pos;
            x->n_tokens = s->n_tokens;
            x->sample = s->sample;
            x->prompt = s->prompt;
            x->has_samp = s->samp != NULL;
            if (s->samp) x->samp = *s->samp;
            x->has_rng = s->rng != NULL;
            if (s->rng) x->rng = *s->rng;
            int64_t tail = s_hist_tail(s);   /* fits: s_leader_check */
            x->hist_off = (int32_t)nh;
            x->n_hist = (int32_t)tail;
            if (tail) memcpy(hist + nh, s->history + (s->n_history - tail), (size_t)tail * 4);
            nh += tail;
            rows += s->n_tokens;
        }
        d->n_hist = (int32_t)nh;
        d->n_rows = (int32_t)rows;
        /* stage 0's layers write their output straight into the link's buffer */
        if (s_run_layers(L->local, L->g, seqs + lo, hi - lo, NULL, NULL, &L->link0, hidden, NULL) != 0) {
            snprintf(eb->err, sizeof eb->err, "%s", L->local->err);
            /* bad arguments from the caller: nothing was sent, the group stays up unless a half step went out */
            if (mi == 0) {
                L->step--;
                return -1;
            }
            return s_leader_fail(L, "stage 0", L->local->err);
        }
        uint64_t bytes = sizeof *d + (uint64_t)(hi - lo) * sizeof(stage_entry) + (uint64_t)nh * 4;
        if (L->tx->publish(&L->link0, bytes, err, sizeof err)) return s_leader_fail(L, "send", err);
    }
    ln->busy = 1;
    ln->ord = L->ord_next++;
    ln->step = step;
    ln->st = st;
    ln->seqs = seqs;
    ln->n = n;
    ln->n_micro = n_micro;
    L->inflight_micro += n_micro;
    return 0;
}

/* launch (zl_engine_ops): a lane's step is cut into at most ceil(n_stages / lanes) micro-batches: the lanes
 * together then keep about n_stages micro-batches in flight, one per stage. More parts would not add overlap,
 * only cost: a decode micro-batch's time is mostly the stage reading its share of the weights, once per
 * micro-batch. A synchronous step (st->sync) gets the whole ring capacity for its micro-batches. */
static int s_leader_launch(zl_engine *eb, const zl_step *st) {
    s_leader *L = (s_leader *)eb;
    if (!st) {
        snprintf(eb->err, sizeof eb->err, "launch: no step");
        return -1;
    }
    if (st->out_logits || st->h_in || st->h_out || st->h_dev || st->n_wait || st->n_record) {
        snprintf(eb->err, sizeof eb->err, "pipeline: logits and hidden states are not returned by the last stage");
        return -1;
    }
    if (st->sync) {
        if (L->ord_next != L->ord_collect) {
            snprintf(eb->err, sizeof eb->err, "step: asynchronous steps are in flight (wait for them first)");
            return -1;
        }
        return s_leader_submit_n(L, st, L->info.ring_cap);
    }
    int lanes = eb->lanes > 1 ? eb->lanes : 1;
    int per = (L->info.n_stages + lanes - 1) / lanes;
    if (per > L->info.ring_cap / lanes) per = L->info.ring_cap / lanes;
    return s_leader_submit_n(L, st, per);
}

/* wait (zl_engine_ops): st's micro-batches' returns, in order, from the FIFO return ring */
static int s_leader_wait(zl_engine *eb, const zl_step *st) {
    s_leader *L = (s_leader *)eb;
    char err[256];
    const int lane = st ? st->lane : -1;
    if (lane < 0 || lane >= S_LANES || !L->lane[lane].busy || L->lane[lane].st != st) {
        snprintf(eb->err, sizeof eb->err, "wait: lane %d has no such step in flight", lane);
        return -1;
    }
    s_lane_step *ln = &L->lane[lane];
    if (ln->ord != L->ord_collect) {   /* nothing read: the caller's mistake leaves the group as it was */
        snprintf(eb->err, sizeof eb->err,
                 "wait: lane %d's step is not the oldest in flight (wait in launch "
                 "order)",
                 lane);
        return -1;
    }
    int32_t *out_tokens = st->out_tokens;
    const zl_seq *seqs = ln->seqs;
    const int *bnd = ln->bnd;
    int n_micro = ln->n_micro;
    uint64_t step = ln->step;
    for (int mi = 0; mi < n_micro; mi++) {
        int lo = bnd[mi], hi = bnd[mi + 1];
        const void *p;
        uint64_t bytes;
        int rc;
        while ((rc = shm_ring_peek(L->g, L->ring_ret, 1000, &p, &bytes, err, sizeof err)) == 1)
            ;
        if (rc) return s_leader_fail(L, "receive", err);
        s_ret r; /* a private copy: checked once, used as checked */
        memset(&r, 0, sizeof r);
        if (bytes >= sizeof r) memcpy(&r, p, sizeof r);
        if (bytes < sizeof r || r.step != step || r.micro != mi || r.n != hi - lo ||
            bytes != sizeof r + (uint64_t)(hi - lo) * sizeof(s_ret_entry)) {
            snprintf(err, sizeof err, "return slot for step %llu micro %d n %d does not match step %llu micro %d n %d",
                     (unsigned long long)r.step, r.micro, r.n, (unsigned long long)step, mi, hi - lo);
            return s_leader_fail(L, "receive", err);
        }
        const s_ret_entry *re = (const s_ret_entry *)((const s_ret *)p + 1); /* hi - lo entries fit: bytes */
        for (int i = lo; i < hi; i++) {
            s_ret_entry x;
            memcpy(&x, &re[i - lo], sizeof x); /* read once */
            int32_t tok = x.tok;
            if (tok < -1 || tok >= L->info.vocab || (tok < 0 && seqs[i].sample)) {
                shm_ring_release(L->g, L->ring_ret);
                return s_leader_fail(L, "receive", "token id out of range");
            }
            if (out_tokens) out_tokens[i] = seqs[i].sample ? tok : -1;
            if (seqs[i].rng && seqs[i].sample) *seqs[i].rng = x.rng;
        }
        shm_ring_release(L->g, L->ring_ret);
    }
    ln->busy = 0;
    L->ord_collect++;
    L->inflight_micro -= n_micro;
    return 0;
}

static const zl_engine_ops s_leader_ops = {s_leader_launch, s_leader_wait, s_leader_destroy, NULL};

int stage_leader_failed(const zl_engine *e) {
    if (!e || e->ops != &s_leader_ops) return 0;
    const s_leader *L = (const s_leader *)e;
    return L->g && shm_group_aborted(L->g) == SHM_FAILED;
}

/* the group's rings for info in: 2 per link, then the return ring */
static int s_specs(const s_info *in, int ring_cap, shm_ring_spec *sp) {
    int k = 0;
    for (int i = 0; i + 1 < in->n_stages; i++) {
        sp[k].cap = (uint32_t)ring_cap;
        sp[k++].payload_bytes = s_desc_cap(in);
        sp[k].cap = (uint32_t)ring_cap;
        sp[k++].payload_bytes = (uint64_t)in->max_step_tokens * in->dim * sizeof(float);
    }
    sp[k].cap = (uint32_t)ring_cap;
    sp[k++].payload_bytes = sizeof(s_ret) + (uint64_t)in->max_batch * sizeof(s_ret_entry);
    if (in->transport == 1) {
        /* GPU links: the hidden ring carries set-up messages and records only; one back ring per link */
        for (int i = 0; i + 1 < in->n_stages; i++) {
            sp[2 * i + 1].payload_bytes = stage_cuda_msg_bytes();
            sp[k].cap = 2;
            sp[k++].payload_bytes = stage_cuda_msg_bytes();
        }
    }
    return k;
}

zl_engine *stage_leader_new(const zl_model *m, const zl_engine_opts *o, const stage_opts *so_in, char *err,
                            size_t errlen) {
    if (!m || !so_in || so_in->n_stages < 2 || so_in->n_stages > STAGE_MAX || so_in->stage != 0) {
        snprintf(err, errlen, "pipeline leader: needs a model and stage 0 of 2..%d", STAGE_MAX);
        return NULL;
    }
    if (m->cfg.n_layers < so_in->n_stages) {
        snprintf(err, errlen, "pipeline: %d stages for %d layers", so_in->n_stages, m->cfg.n_layers);
        return NULL;
    }
    stage_opts so;
    s_opts_defaults(so_in, &so);
    const int cuda = o && o->device && strncmp(o->device, "cuda", 4) == 0;
    if (cuda && so.n_stages > STAGE_MAX_CUDA) {
        snprintf(err, errlen, "pipeline: at most %d CUDA stages", STAGE_MAX_CUDA);
        return NULL;
    }
    if (so.ring_cap < 2 || so.ring_cap > 64 || so.micro_batches > so.ring_cap) {
        snprintf(err, errlen, "pipeline: ring_cap %d outside 2..64 or below micro_batches %d", so.ring_cap,
                 so.micro_batches);
        return NULL;
    }
    s_leader *L = calloc(1, sizeof *L);
    if (!L) {
        snprintf(err, errlen, "pipeline: out of memory");
        return NULL;
    }
    zl_engine_opts lo;
    memset(&lo, 0, sizeof lo);
    if (o) lo = *o;
    if (!lo.device) lo.device = "cpu";
    stage_layer_range(m->cfg.n_layers, 0, so.n_stages, &lo.layer_begin, &lo.layer_end);
    L->local = engine_new(m, &lo, err, errlen);
    if (!L->local) goto fail;
    zl_engine *b = &L->base;
    b->ops = &s_leader_ops;
    b->model = m;
    snprintf(b->device, sizeof b->device, "%.16s-pipeline-%d", L->local->device, so.n_stages);
    b->n_slots = L->local->n_slots;
    b->n_ctx = L->local->n_ctx;
    b->max_batch = L->local->max_batch;
    b->max_step_tokens = L->local->max_step_tokens;
    b->layer_begin = 0;
    b->layer_end = m->cfg.n_layers;
    /* two lanes keep every stage busy across step boundaries (docs/pipeline.md); ring_cap / 2 micro-batches each */
    b->lanes = 2;
    b->depth = 1;
    s_info *in = &L->info;
    in->magic = S_INFO_MAGIC;
    in->version = S_INFO_VERSION;
    in->sz_desc = sizeof(stage_desc);
    in->sz_entry = sizeof(stage_entry);
    in->n_stages = so.n_stages;
    in->n_layers = m->cfg.n_layers;
    in->dim = m->cfg.dim;
    in->vocab = m->cfg.vocab_size;
    in->n_slots = b->n_slots;
    in->n_ctx = b->n_ctx;
    in->max_batch = b->max_batch;
    in->max_step_tokens = b->max_step_tokens;
    in->hist_cap = (int32_t)((int64_t)b->max_batch * b->n_ctx > (1 << 24) ? (1 << 24) : b->max_batch * b->n_ctx);
    in->transport = cuda;
    in->no_graphs = o ? o->no_graphs : 0;
    in->ring_cap = so.ring_cap;
    L->dead_ms = so.dead_ms;
    shm_ring_spec sp[2 * STAGE_MAX];
    int nr = s_specs(in, so.ring_cap, sp);
    L->g = shm_group_create(so.group, so.n_stages, sp, nr, in, sizeof *in, err, errlen);
    if (!L->g) goto fail;
    shm_group_set_dead_ms(L->g, so.dead_ms);
    L->link0 = (s_host_link){L->g, 0, 1, sp[1].payload_bytes, in->dim, NULL, NULL, NULL, 0};
    L->tx = &s_host_ops;
    L->micro = so.micro_batches;
    L->ring_ret = 2 * (so.n_stages - 1);
    if (shm_group_wait_members(L->g, so.attach_timeout_ms, err, errlen)) goto fail;
    if (s_monitor_start(&L->mon, L->g, so.term_on_failure, err, errlen)) goto fail;
    if (cuda) {
        /* link 0's device end: stage 1 answers once its engine is up (a large model takes a while to load; a
         * dead stage 1 fails the wait at once) */
        L->link0.cu = stage_cuda_link_export(L->g, 1, L->ring_ret + 1, 1, stage_cuda_engine_device(L->local),
                                             so.ring_cap, b->max_step_tokens, in->dim, so.attach_timeout_ms * 4,
                                             err, errlen);
        if (!L->link0.cu) goto fail;
        L->tx = &s_cuda_ops;
    }
    return b;
fail:
    s_monitor_stop(&L->mon);
    if (L->g) shm_group_abort(L->g, SHM_FAILED);
    if (L->link0.cu) s_cuda_teardown(L->local, &L->link0, so.dead_ms);
    shm_group_destroy(&L->g);
    engine_destroy(&L->local);
    free(L);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------------------
 * follower */

int stage_run_follower(const zl_model *m, const stage_opts *so_in, const volatile sig_atomic_t *stop, char *err,
                       size_t errlen) {
    if (!m || !so_in || so_in->n_stages < 2 || so_in->n_stages > STAGE_MAX || so_in->stage < 1 ||
        so_in->stage >= so_in->n_stages) {
        snprintf(err, errlen, "pipeline follower: needs a model and a stage in 1..n_stages-1");
        return -1;
    }
    stage_opts so;
    s_opts_defaults(so_in, &so);
    int rc = -1, last = so.stage == so.n_stages - 1;
    zl_engine *e = NULL;
    zl_seq *seqs = NULL;
    uint64_t *rngs = NULL;
    int32_t *toks = NULL;
    s_monitor mon;
    memset(&mon, 0, sizeof mon);
    s_host_link in_link, out_link;   /* links so.stage-1 -> so.stage and so.stage -> so.stage+1 */
    memset(&in_link, 0, sizeof in_link);
    memset(&out_link, 0, sizeof out_link);
    shm_group *g = shm_group_attach(so.group, so.stage, so.attach_timeout_ms, err, errlen);
    if (!g) return -1;
    shm_group_set_dead_ms(g, so.dead_ms);
    if (s_monitor_start(&mon, g, 0, err, errlen)) goto fail;   /* heartbeats while the engine loads, too */
    size_t ib;
    const s_info *pin = shm_group_info(g, &ib);
    s_info in;
    if (ib != sizeof in) {
        snprintf(err, errlen, "pipeline: group info of %zu bytes, expected %zu", ib, sizeof in);
        goto fail;
    }
    memcpy(&in, pin, sizeof in);
    if (in.magic != S_INFO_MAGIC || in.version != S_INFO_VERSION || in.sz_desc != sizeof(stage_desc) ||
        in.sz_entry != sizeof(stage_entry) || in.n_stages != so.n_stages || in.n_layers != m->cfg.n_layers ||
        in.dim != m->cfg.dim || in.vocab != m->cfg.vocab_size || in.max_batch < 1 || in.max_step_tokens < 1 ||
        in.hist_cap < 0 || in.transport < 0 || in.transport > 1 || in.ring_cap < 2 ||
        in.ring_cap > STAGE_CUDA_MAX_CAP) {
        snprintf(err, errlen, "pipeline: the leader's group does not match this stage (stages %d/%d, layers %d/%d, "
                 "dim %d/%d, vocab %d/%d, or a different build)", in.n_stages, so.n_stages, in.n_layers,
                 m->cfg.n_layers, in.dim, m->cfg.dim, in.vocab, m->cfg.vocab_size);
        goto fail;
    }
    const int cuda = so.device && strncmp(so.device, "cuda", 4) == 0;
    if (cuda != (in.transport == 1)) {
        snprintf(err, errlen, "pipeline: stage %d runs on %s but the leader's group uses the %s transport: every "
                 "stage of a group must be CUDA, or none", so.stage, so.device ? so.device : "cpu",
                 in.transport ? "GPU" : "host");
        goto fail;
    }
    shm_ring_spec sp[3 * STAGE_MAX];
    int nr = s_specs(&in, in.ring_cap, sp);
    if (shm_group_rings(g) != nr) {
        snprintf(err, errlen, "pipeline: group has %d rings, expected %d", shm_group_rings(g), nr);
        goto fail;
    }
    for (int r = 0; r < nr; r++)
        if (shm_ring_payload_bytes(g, r) < sp[r].payload_bytes) {
            snprintf(err, errlen, "pipeline: ring %d too small for its slots", r);
            goto fail;
        }
    zl_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.device = so.device ? so.device : "cpu";
    eo.no_graphs = in.no_graphs;
    eo.n_slots = in.n_slots;
    eo.n_ctx = in.n_ctx;
    eo.max_batch = in.max_batch;
    eo.max_step_tokens = in.max_step_tokens;
    eo.threads = so.threads;
    stage_layer_range(m->cfg.n_layers, so.stage, so.n_stages, &eo.layer_begin, &eo.layer_end);
    e = engine_new(m, &eo, err, errlen);
    if (!e) goto fail;
    /* a CUDA engine may shrink slots or batch to its memory: the leader's steps would then be refused */
    if (e->n_slots != in.n_slots || e->max_batch < in.max_batch || e->n_ctx != in.n_ctx ||
        e->max_step_tokens < in.max_step_tokens) {
        snprintf(err, errlen, "pipeline: stage %d's engine on %s holds %d slots x %d tokens, batch %d, %d tokens per "
                 "step; the leader's has %d x %d, %d, %d (free device memory?)", so.stage, e->device, e->n_slots,
                 e->n_ctx, e->max_batch, e->max_step_tokens, in.n_slots, in.n_ctx, in.max_batch,
                 in.max_step_tokens);
        goto fail;
    }
    seqs = calloc((size_t)in.max_batch, sizeof *seqs);
    rngs = calloc((size_t)in.max_batch, sizeof *rngs);
    toks = calloc((size_t)in.max_batch, sizeof *toks);
    if (!seqs || !rngs || !toks) {
        snprintf(err, errlen, "pipeline: out of memory");
        goto fail;
    }
    int li = so.stage - 1;
    in_link = (s_host_link){g,    2 * li, 2 * li + 1,     shm_ring_payload_bytes(g, 2 * li + 1), in.dim, NULL,
                            NULL, NULL,   s_desc_cap(&in)};
    in_link.r_desc = malloc((size_t)in_link.desc_cap); /* the largest descriptor s_desc_check accepts */
    if (!in_link.r_desc) {
        snprintf(err, errlen, "pipeline: out of memory");
        goto fail;
    }
    out_link = (s_host_link){g,
                             2 * so.stage,
                             2 * so.stage + 1,
                             last ? 0 : shm_ring_payload_bytes(g, 2 * so.stage + 1),
                             in.dim,
                             NULL,
                             NULL,
                             NULL,
                             0};
    const stage_transport_ops *tx = &s_host_ops;
    int ring_ret = 2 * (so.n_stages - 1);
    uint64_t hidden_need_max = (uint64_t)in.max_step_tokens * in.dim * sizeof(float);
    if (cuda) {
        /* the input link's device end (stage so.stage - 1 owns it), then this stage's output link, whose
         * consumer answers once its own engine is up */
        in_link.cu = stage_cuda_link_import(g, 2 * li + 1, ring_ret + 1 + li, li, stage_cuda_engine_device(e),
                                            in.ring_cap, in.max_step_tokens, in.dim, so.attach_timeout_ms * 4, stop,
                                            err, errlen);
        if (!in_link.cu) goto fail;
        if (!last) {
            out_link.cu = stage_cuda_link_export(g, 2 * so.stage + 1, ring_ret + 1 + so.stage, so.stage + 1,
                                                 stage_cuda_engine_device(e), in.ring_cap, in.max_step_tokens,
                                                 in.dim, so.attach_timeout_ms * 4, err, errlen);
            if (!out_link.cu) goto fail;
        }
        tx = &s_cuda_ops;
        hidden_need_max = 0;   /* the hidden rings carry records only */
    }
    if (in_link.hidden_bytes < hidden_need_max || (!last && out_link.hidden_bytes < hidden_need_max)) {
        snprintf(err, errlen, "pipeline: hidden-state rings too small");
        goto fail;
    }
    for (;;) {
        const stage_desc *d;
        const float *h_in;
        uint64_t db;
        int pr = tx->peek(&in_link, &d, &db, &h_in, err, errlen);
        if (stop && *stop) {
            snprintf(err, errlen, "stopped by a signal");
            goto fail;
        }
        if (pr == 1) continue;
        if (pr != 0) {
            if (shm_group_aborted(g) == SHM_SHUTDOWN) rc = 0;   /* the leader's planned shutdown */
            goto done;
        }
        if (s_desc_check(&in, d, db, err, errlen)) goto fail;
        const stage_entry *x = s_entries(d);
        const int32_t *hist = s_hist(d);
        for (int i = 0; i < d->n; i++) {
            rngs[i] = x[i].rng;
            seqs[i] = (zl_seq){.slot = x[i].slot,
                               .pos = x[i].pos,
                               .n_tokens = x[i].n_tokens,
                               .tokens = NULL,
                               .sample = x[i].sample,
                               .prompt = x[i].prompt,
                               .samp = x[i].has_samp ? &x[i].samp : NULL,
                               .history = x[i].n_hist ? hist + x[i].hist_off : NULL,
                               .n_history = x[i].n_hist,
                               .rng = x[i].has_rng ? &rngs[i] : NULL};
        }
        if (last) {
            if (s_run_layers(e, g, seqs, d->n, &in_link, h_in, NULL, NULL, toks) != 0) {
                snprintf(err, errlen, "stage %d: %s", so.stage, e->err);
                goto fail;
            }
            void *p;
            if (s_reserve(g, ring_ret, &p, err, errlen)) goto done;
            s_ret *r = p;
            r->step = d->step;
            r->micro = d->micro;
            r->n = d->n;
            s_ret_entry *re = (s_ret_entry *)(r + 1);
            for (int i = 0; i < d->n; i++) re[i] = (s_ret_entry){ x[i].sample ? toks[i] : -1, 0, rngs[i] };
            if (shm_ring_publish(g, ring_ret, sizeof *r + (uint64_t)d->n * sizeof *re, err, errlen)) goto fail;
        } else {
            stage_desc *od;
            float *h_out;
            if (tx->reserve(&out_link, &od, &h_out, err, errlen)) goto done;
            if (s_run_layers(e, g, seqs, d->n, &in_link, h_in, &out_link, h_out, NULL) != 0) {
                snprintf(err, errlen, "stage %d: %s", so.stage, e->err);
                goto fail;
            }
            memcpy(od, d, db);
            if (tx->publish(&out_link, db, err, errlen)) goto fail;
        }
        tx->release(&in_link);
        shm_group_heartbeat(g);
    }
fail:
    rc = -1;
done:
    if (rc != 0 && g && shm_group_aborted(g) == SHM_SHUTDOWN && !(stop && *stop)) rc = 0;   /* planned */
    if (rc != 0 && g) shm_group_abort(g, SHM_FAILED);
    s_monitor_stop(&mon);
    if (rc != 0 && s_monitor_why(&mon) && strlen(err) + 4 < errlen) /* what this stage's monitor saw */
        snprintf(err + strlen(err), errlen - strlen(err), " (%s)", s_monitor_why(&mon));
    /* GPU links: drain this stage's stream, close the imports (input link), then free the output link's buffer
     * once the next stage has left the group; all before this stage leaves it (two-phase teardown) */
    if (in_link.cu || out_link.cu) {
        const int abandon = stage_cuda_drain(e, 2000) == 0;
        stage_cuda_link_destroy(&in_link.cu, abandon, so.dead_ms);
        stage_cuda_link_destroy(&out_link.cu, abandon, so.dead_ms);
    }
    free(seqs);
    free(rngs);
    free(toks);
    free(in_link.r_desc);
    engine_destroy(&e);
    shm_group_destroy(&g);
    return rc;
}
