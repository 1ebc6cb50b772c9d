/* worker/stage_cuda.c: the GPU transport of a pipeline link (see stage_cuda.h). C calling the CUDA runtime;
 * compiled to failing stubs when the build has no CUDA (ZLLM_CUDA=0), so CPU-only builds keep every symbol. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "stage_cuda.h"

#ifdef ZLLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "engine_cuda.h"

#define S_HELLO_MAGIC 0x4f4c4548u  /* "HELO" */
#define S_REC_MAGIC 0x43455243u    /* "CREC" */
#define S_VERSION 1u
#define S_CHECK_US 2000            /* group checks between polls of an event, at most this often */
#define S_FULL_MS 30000            /* longest wait for a slot of the record ring (never full in a working group) */

/* the set-up message of each end: the producer's (kind 1, on the hidden ring) carries the buffer and the ready
 * events, the consumer's (kind 2, on the back ring) its consumed events */
typedef struct {
    uint32_t magic, version;       /* S_HELLO_MAGIC, S_VERSION */
    uint64_t gen;                  /* the group's generation (a stale group's hello is refused) */
    int32_t kind;                  /* 1 producer, 2 consumer */
    int32_t cap, max_rows, dim;    /* slots, rows per slot, floats per row: must equal the reader's */
    int32_t pid;                   /* the writer's pid (diagnostics) */
    int32_t pad;
    char bus_id[32];               /* PCI bus id of the writer's device (cudaDeviceGetPCIBusId) */
    cudaIpcMemHandle_t mem;        /* kind 1: the [cap][max_rows][dim] f32 buffer */
    cudaIpcEventHandle_t ev[STAGE_CUDA_MAX_CAP];   /* [cap] kind 1: ready events, kind 2: consumed events */
} s_hello;

/* one micro-batch on the hidden ring (its descriptor follows on the descriptor ring) */
typedef struct {
    uint32_t magic;                /* S_REC_MAGIC */
    int32_t slot;                  /* device slot, == seq mod cap */
    uint64_t seq;                  /* micro-batches before this one on the link */
    int32_t n_rows;                /* rows written, 1..max_rows, == the descriptor's n_rows */
    int32_t pad;
} s_rec;

struct stage_cuda_link {
    shm_group *g;                  /* the group (borrowed) */
    int ring_fwd, ring_back;       /* hidden ring (producer -> consumer), back ring (consumer -> producer) */
    int producer;                  /* 1: this end owns the buffer */
    int peer;                      /* the other end's member index */
    int dev;                       /* this process's device */
    int cap, max_rows, dim;        /* geometry */
    float *buf;                    /* [cap][max_rows][dim] f32: cudaMalloc'd (producer) or mapped (consumer) */
    cudaEvent_t own[STAGE_CUDA_MAX_CAP];    /* [cap] created here: ready (producer) / consumed (consumer) */
    cudaEvent_t peer_ev[STAGE_CUDA_MAX_CAP];/* [cap] imported: consumed (producer) / ready (consumer) */
    int n_own, n_peer;             /* events created / imported so far (for teardown after a partial set-up) */
    uint64_t count;                /* micro-batches reserved (producer) or taken (consumer) */
    int cur;                       /* slot of the micro-batch in hand, -1 none */
    s_rec *w_rec;                  /* producer: the reserved record */
};

static uint64_t s_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int s_cuda_err(cudaError_t ce, const char *what, char *err, size_t errlen) {
    if (ce == cudaSuccess) return 0;
    snprintf(err, errlen, "pipeline gpu link: %s: %s", what, cudaGetErrorString(ce));
    return -1;
}

size_t stage_cuda_msg_bytes(void) { return sizeof(s_hello); }

int stage_cuda_engine_device(const zl_engine *e) { return engine_cuda_device(e); }

static stage_cuda_link *s_link_new(shm_group *g, int fwd, int back, int peer, int dev, int cap, int max_rows,
                                   int dim, char *err, size_t errlen) {
    if (!g || cap < 1 || cap > STAGE_CUDA_MAX_CAP || max_rows < 1 || dim < 1 ||
        (uint64_t)cap * (uint64_t)max_rows * (uint64_t)dim > ((uint64_t)1 << 36)) {
        snprintf(err, errlen, "pipeline gpu link: bad geometry (cap %d, rows %d, dim %d)", cap, max_rows, dim);
        return NULL;
    }
    if (shm_ring_payload_bytes(g, fwd) < sizeof(s_hello) || shm_ring_payload_bytes(g, back) < sizeof(s_hello)) {
        snprintf(err, errlen, "pipeline gpu link: rings %d/%d too small for the set-up message", fwd, back);
        return NULL;
    }
    stage_cuda_link *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, errlen, "pipeline gpu link: out of memory");
        return NULL;
    }
    *l = (stage_cuda_link){ .g = g, .ring_fwd = fwd, .ring_back = back, .peer = peer, .dev = dev, .cap = cap,
                            .max_rows = max_rows, .dim = dim, .cur = -1 };
    if (s_cuda_err(cudaSetDevice(dev), "cudaSetDevice", err, errlen)) {
        free(l);
        return NULL;
    }
    return l;
}

/* creates this end's cap interprocess events and writes their handles into h */
static int s_make_events(stage_cuda_link *l, s_hello *h, char *err, size_t errlen) {
    for (int s = 0; s < l->cap; s++) {
        if (s_cuda_err(cudaEventCreateWithFlags(&l->own[s], cudaEventInterprocess | cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(interprocess)", err, errlen))
            return -1;
        l->n_own = s + 1;
        if (s_cuda_err(cudaIpcGetEventHandle(&h->ev[s], l->own[s]), "cudaIpcGetEventHandle", err, errlen))
            return -1;
    }
    return 0;
}

static int s_hello_fill(stage_cuda_link *l, s_hello *h, int kind, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    h->magic = S_HELLO_MAGIC;
    h->version = S_VERSION;
    h->gen = shm_group_generation(l->g);
    h->kind = kind;
    h->cap = l->cap;
    h->max_rows = l->max_rows;
    h->dim = l->dim;
    h->pid = (int32_t)getpid();
    return s_cuda_err(cudaDeviceGetPCIBusId(h->bus_id, (int)sizeof h->bus_id, l->dev), "cudaDeviceGetPCIBusId", err,
                      errlen);
}

/* waits for the other end's hello on ring r and copies it into *out, then validates the copy (kind, geometry,
 * generation) and releases the slot: the hello is used only from private memory, so another process writing
 * the slot cannot change a field between its check and its use */
static int s_hello_take(stage_cuda_link *l, int r, int kind, int timeout_ms, const volatile sig_atomic_t *stop,
                        s_hello *out, char *err, size_t errlen) {
    const void *p;
    uint64_t bytes;
    uint64_t t0 = s_now_us();
    int rc;
    for (;;) {
        rc = shm_ring_peek(l->g, r, 200, &p, &bytes, err, errlen);
        if (rc != 1) break;
        if (stop && *stop) {
            snprintf(err, errlen, "pipeline gpu link: stopped by a signal");
            return -1;
        }
        if (timeout_ms >= 0 && s_now_us() - t0 > (uint64_t)timeout_ms * 1000u) {
            snprintf(err, errlen, "pipeline gpu link: no set-up message from stage %d within %d ms", l->peer,
                     timeout_ms);
            return -1;
        }
    }
    if (rc) return -1;
    memset(out, 0, sizeof *out);
    if (bytes == sizeof *out) memcpy(out, p, sizeof *out);
    shm_ring_release(l->g, r);
    const s_hello *h = out;
    if (bytes != sizeof *h || h->magic != S_HELLO_MAGIC || h->version != S_VERSION || h->kind != kind ||
        h->gen != shm_group_generation(l->g) || h->cap != l->cap || h->max_rows != l->max_rows || h->dim != l->dim ||
        memchr(h->bus_id, 0, sizeof h->bus_id) == NULL) {
        snprintf(err, errlen,
                 "pipeline gpu link: bad set-up message from stage %d (%llu bytes, kind %d, cap %d/%d, "
                 "rows %d/%d, dim %d/%d, or another generation or build)",
                 l->peer, (unsigned long long)bytes, h->kind, h->cap, l->cap, h->max_rows, l->max_rows, h->dim, l->dim);
        return -1;
    }
    return 0;
}

/* opens the cap events of h (the other end's) */
static int s_open_events(stage_cuda_link *l, const s_hello *h, char *err, size_t errlen) {
    for (int s = 0; s < l->cap; s++) {
        if (s_cuda_err(cudaIpcOpenEventHandle(&l->peer_ev[s], h->ev[s]), "cudaIpcOpenEventHandle", err, errlen))
            return -1;
        l->n_peer = s + 1;
    }
    return 0;
}

static int s_hello_send(stage_cuda_link *l, int r, const s_hello *h, char *err, size_t errlen) {
    void *p;
    if (shm_ring_reserve(l->g, r, 5000, &p, err, errlen) != 0) {
        snprintf(err + strlen(err), errlen - strlen(err), " (sending the gpu link set-up)");
        return -1;
    }
    memcpy(p, h, sizeof *h);
    return shm_ring_publish(l->g, r, sizeof *h, err, errlen);
}

stage_cuda_link *stage_cuda_link_export(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, char *err, size_t errlen) {
    stage_cuda_link *l = s_link_new(g, ring_fwd, ring_back, peer, dev, cap, max_rows, dim, err, errlen);
    if (!l) return NULL;
    l->producer = 1;
    s_hello *h = calloc(2, sizeof *h), *back = h ? h + 1 : NULL; /* ours, and the consumer's answer */
    if (!h) {
        snprintf(err, errlen, "pipeline gpu link: out of memory");
        goto fail;
    }
    if (s_hello_fill(l, h, 1, err, errlen)) goto fail;
    size_t bytes = (size_t)cap * max_rows * dim * sizeof(float);
    if (s_cuda_err(cudaMalloc((void **)&l->buf, bytes), "cudaMalloc of the link buffer", err, errlen)) goto fail;
    /* zeroed: a consumer never reads rows nobody wrote, but memcheck's initcheck stays quiet either way */
    if (s_cuda_err(cudaMemset(l->buf, 0, bytes), "cudaMemset", err, errlen) ||
        s_cuda_err(cudaIpcGetMemHandle(&h->mem, l->buf), "cudaIpcGetMemHandle", err, errlen) ||
        s_make_events(l, h, err, errlen) || s_hello_send(l, ring_fwd, h, err, errlen))
        goto fail;
    if (s_hello_take(l, ring_back, 2, timeout_ms, NULL, back, err, errlen) || s_open_events(l, back, err, errlen))
        goto fail;
    free(h);
    return l;
fail:
    free(h);
    stage_cuda_link_destroy(&l, 0, 0);   /* nothing was imported by the peer yet that it could still use */
    return NULL;
}

stage_cuda_link *stage_cuda_link_import(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, const volatile sig_atomic_t *stop,
                                        char *err, size_t errlen) {
    stage_cuda_link *l = s_link_new(g, ring_fwd, ring_back, peer, dev, cap, max_rows, dim, err, errlen);
    if (!l) return NULL;
    s_hello *h = calloc(2, sizeof *h), *fw = h ? h + 1 : NULL; /* ours, and the producer's */
    if (!h) {
        snprintf(err, errlen, "pipeline gpu link: out of memory");
        goto fail;
    }
    if (s_hello_take(l, ring_fwd, 1, timeout_ms, stop, fw, err, errlen)) goto fail;
    {
        int pdev = -1, can = 0, rc = 0;
        cudaError_t ce = cudaDeviceGetByPCIBusId(&pdev, fw->bus_id);
        if (ce == cudaSuccess && pdev != dev) {
            /* another GPU: peer access so that the consumer's gather kernel reads the producer's memory
             * directly (over NVLink where there is one); mapping still works without it via the IPC flag */
            ce = cudaDeviceCanAccessPeer(&can, dev, pdev);
            if (ce == cudaSuccess && can) {
                ce = cudaDeviceEnablePeerAccess(pdev, 0);
                if (ce == cudaErrorPeerAccessAlreadyEnabled) {
                    cudaGetLastError();
                    ce = cudaSuccess;
                }
            }
        } else if (ce != cudaSuccess) {
            cudaGetLastError();   /* a device this process cannot see (CUDA_VISIBLE_DEVICES): IPC still maps it */
            ce = cudaSuccess;
        }
        if (s_cuda_err(ce, "enabling peer access to the producer's GPU", err, errlen)) rc = -1;
        if (!rc && s_cuda_err(cudaIpcOpenMemHandle((void **)&l->buf, fw->mem, cudaIpcMemLazyEnablePeerAccess),
                              "cudaIpcOpenMemHandle", err, errlen))
            rc = -1;
        if (!rc) rc = s_open_events(l, fw, err, errlen);
        if (rc) goto fail;
    }
    if (s_hello_fill(l, h, 2, err, errlen) || s_make_events(l, h, err, errlen) ||
        s_hello_send(l, ring_back, h, err, errlen))
        goto fail;
    free(h);
    return l;
fail:
    free(h);
    stage_cuda_link_destroy(&l, 0, 0);
    return NULL;
}

int stage_cuda_link_reserve(stage_cuda_link *l, float **d_hidden, char *err, size_t errlen) {
    void *p;
    if (!l || !l->producer) {
        snprintf(err, errlen, "pipeline gpu link: reserve on a consumer");
        return -1;
    }
    /* a reservation not published (the step failed before any kernel was queued) is simply taken again */
    /* bounded as stage.c's reservations: in a working group the ring is never full */
    int rc = shm_ring_reserve(l->g, l->ring_fwd, S_FULL_MS, &p, err, errlen);
    if (rc == 1) snprintf(err, errlen, "pipeline gpu link: record ring full for %d ms", S_FULL_MS);
    if (rc != 0) return -1;
    l->w_rec = p;
    l->cur = (int)(l->count % (uint64_t)l->cap);
    *d_hidden = l->buf + (size_t)l->cur * l->max_rows * l->dim;
    return 0;
}

int stage_cuda_link_publish(stage_cuda_link *l, int n_rows, char *err, size_t errlen) {
    if (!l || !l->producer || l->cur < 0 || n_rows < 1 || n_rows > l->max_rows) {
        snprintf(err, errlen, "pipeline gpu link: publish of %d rows without a reservation or too many", n_rows);
        return -1;
    }
    *l->w_rec = (s_rec){ S_REC_MAGIC, l->cur, l->count, n_rows, 0 };
    if (shm_ring_publish(l->g, l->ring_fwd, sizeof(s_rec), err, errlen) != 0) return -1;
    l->count++;
    l->cur = -1;
    return 0;
}

int stage_cuda_link_peek(stage_cuda_link *l, int n_rows, const float **d_hidden, char *err, size_t errlen) {
    const void *p;
    uint64_t bytes;
    if (!l || l->producer || l->cur >= 0) {
        snprintf(err, errlen, "pipeline gpu link: peek out of order");
        return -1;
    }
    if (shm_ring_peek(l->g, l->ring_fwd, 0, &p, &bytes, err, errlen) != 0) {
        snprintf(err + strlen(err), errlen - strlen(err), " (gpu link record missing for a descriptor)");
        return -1;
    }
    const s_rec *r = p;
    const int want = (int)(l->count % (uint64_t)l->cap);
    if (bytes != sizeof *r || r->magic != S_REC_MAGIC || r->seq != l->count || r->slot != want || r->n_rows < 1 ||
        r->n_rows > l->max_rows || r->n_rows != n_rows) {
        snprintf(err, errlen, "pipeline gpu link: bad record (%llu bytes, seq %llu/%llu, slot %d/%d, rows %d/%d)",
                 (unsigned long long)bytes, bytes == sizeof *r ? (unsigned long long)r->seq : 0ull,
                 (unsigned long long)l->count, bytes == sizeof *r ? r->slot : -1, want,
                 bytes == sizeof *r ? r->n_rows : -1, n_rows);
        shm_ring_release(l->g, l->ring_fwd);
        return -1;
    }
    l->cur = want;
    *d_hidden = l->buf + (size_t)want * l->max_rows * l->dim;
    return 0;
}

void stage_cuda_link_release(stage_cuda_link *l) {
    if (!l || l->producer || l->cur < 0) return;
    shm_ring_release(l->g, l->ring_fwd);
    l->count++;
    l->cur = -1;
}

/* polls until pred(arg) is 1, checking the group every S_CHECK_US; 0, or -1 with a message */
static int s_poll(int (*pred)(const void *), const void *arg, shm_group *g, const char *what, char *err,
                  size_t errlen) {
    uint64_t last = s_now_us();
    for (unsigned spin = 0;; spin++) {
        int r = pred(arg);
        if (r == 1) return 0;
        if (r < 0) {
            snprintf(err, errlen, "pipeline gpu link: %s: device error", what);
            return -1;
        }
        uint64_t now = s_now_us();
        if (now - last >= S_CHECK_US) {
            last = now;
            if (shm_group_check(g, err, errlen) != 0) {
                snprintf(err + strlen(err), errlen - strlen(err), " (waiting for %s)", what);
                return -1;
            }
        }
        if (spin > 64) usleep(20);
    }
}

static int s_engine_ready(const void *e) { return engine_cuda_ready((const zl_engine *)e); }

static int s_event_done(const void *ev) {
    cudaError_t ce = cudaEventQuery((cudaEvent_t)ev);
    if (ce == cudaErrorNotReady) return 0;
    return ce == cudaSuccess ? 1 : -1;
}

int stage_cuda_run(zl_engine *e, shm_group *g, const zl_seq *seqs, int n, stage_cuda_link *in, const float *h_in,
                   stage_cuda_link *out, float *h_out, int32_t *out_tokens, char *err, size_t errlen) {
    void *waits[2], *recs[2];
    int nw = 0, nr = 0;
    if ((in && (in->producer || in->cur < 0)) || (out && (!out->producer || out->cur < 0))) {
        snprintf(err, errlen, "pipeline gpu link: no micro-batch in hand");
        return -1;
    }
    if (in) {
        waits[nw++] = in->peer_ev[in->cur];   /* the producer's ready[s]: h_in written */
        recs[nr++] = in->own[in->cur];        /* consumed[s]: h_in read */
    }
    if (out) {
        waits[nw++] = out->peer_ev[out->cur]; /* the consumer's consumed[s]: the slot's previous use is over */
        recs[nr++] = out->own[out->cur];      /* ready[s]: h_out written */
    }
    if (s_poll(s_engine_ready, e, g, "this stage's previous step", err, errlen)) return -1;
    /* the last stage synchronises inside the step to read its ids: it must not queue behind an event that a
     * dead producer never completes, so it waits for the input on the host (polled) first */
    if (!out && in && s_poll(s_event_done, in->peer_ev[in->cur], g, "the previous stage's hidden states", err,
                             errlen))
        return -1;
    zl_step st;
    memset(&st, 0, sizeof st);
    st.seqs = seqs;
    st.n = n;
    st.sync = 1;
    st.h_in = h_in;
    st.h_out = h_out;
    st.h_dev = 1;
    st.wait_ev = waits;
    st.n_wait = nw;
    st.record_ev = recs;
    st.n_record = nr;
    st.out_tokens = out_tokens;
    if (engine_run(e, &st) != 0) {
        snprintf(err, errlen, "%s", e->err);
        return -1;
    }
    return 0;
}

static int s_engine_idle(const void *e) { return engine_cuda_idle((const zl_engine *)e); }

int stage_cuda_drain(zl_engine *e, int wait_ms) {
    if (engine_cuda_device(e) < 0) return -1;
    uint64_t t0 = s_now_us();
    for (;;) {
        int r = s_engine_idle(e);
        if (r == 1) return 1;
        if (r < 0 || s_now_us() - t0 > (uint64_t)wait_ms * 1000u) {
            engine_cuda_abandon(e);
            return 0;
        }
        usleep(200);
    }
}

void stage_cuda_link_destroy(stage_cuda_link **lp, int abandon, int wait_ms) {
    if (!lp || !*lp) return;
    stage_cuda_link *l = *lp;
    *lp = NULL;
    if (abandon) {
        free(l);
        return;
    }
    cudaSetDevice(l->dev);
    /* phase 1: what this end imported */
    for (int s = 0; s < l->n_peer; s++) cudaEventDestroy(l->peer_ev[s]);
    if (!l->producer && l->buf) cudaIpcCloseMemHandle(l->buf);
    /* phase 2: what it owns, once the peer has left (an owner's buffer must outlive every mapping of it) */
    int gone = 1;
    if (l->producer && l->buf) {
        uint64_t t0 = s_now_us();
        while ((gone = shm_group_member_gone(l->g, l->peer)) == 0 && s_now_us() - t0 < (uint64_t)wait_ms * 1000u)
            usleep(1000);
        if (gone != 1)
            fprintf(stderr, "pipeline gpu link: stage %d still attached after %d ms: its buffer is left to the "
                    "process's exit\n", l->peer, wait_ms);
    }
    if (gone == 1) {
        if (l->producer) cudaFree(l->buf);
        for (int s = 0; s < l->n_own; s++) cudaEventDestroy(l->own[s]);
    }
    free(l);
}

#else /* no CUDA in this build */

static stage_cuda_link *s_none(char *err, size_t errlen) {
    snprintf(err, errlen, "this zllm was built without CUDA: no GPU pipeline transport");
    return NULL;
}

stage_cuda_link *stage_cuda_link_export(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, char *err, size_t errlen) {
    (void)g; (void)ring_fwd; (void)ring_back; (void)peer; (void)dev; (void)cap; (void)max_rows; (void)dim;
    (void)timeout_ms;
    return s_none(err, errlen);
}

stage_cuda_link *stage_cuda_link_import(shm_group *g, int ring_fwd, int ring_back, int peer, int dev, int cap,
                                        int max_rows, int dim, int timeout_ms, const volatile sig_atomic_t *stop,
                                        char *err, size_t errlen) {
    (void)g; (void)ring_fwd; (void)ring_back; (void)peer; (void)dev; (void)cap; (void)max_rows; (void)dim;
    (void)timeout_ms; (void)stop;
    return s_none(err, errlen);
}

int stage_cuda_link_reserve(stage_cuda_link *l, float **d_hidden, char *err, size_t errlen) {
    (void)l; (void)d_hidden;
    s_none(err, errlen);
    return -1;
}

int stage_cuda_link_publish(stage_cuda_link *l, int n_rows, char *err, size_t errlen) {
    (void)l; (void)n_rows;
    s_none(err, errlen);
    return -1;
}

int stage_cuda_link_peek(stage_cuda_link *l, int n_rows, const float **d_hidden, char *err, size_t errlen) {
    (void)l; (void)n_rows; (void)d_hidden;
    s_none(err, errlen);
    return -1;
}

void stage_cuda_link_release(stage_cuda_link *l) { (void)l; }

size_t stage_cuda_msg_bytes(void) { return 64; }

int stage_cuda_engine_device(const zl_engine *e) {
    (void)e;
    return -1;
}

int stage_cuda_run(zl_engine *e, shm_group *g, const zl_seq *seqs, int n, stage_cuda_link *in, const float *h_in,
                   stage_cuda_link *out, float *h_out, int32_t *out_tokens, char *err, size_t errlen) {
    (void)e; (void)g; (void)seqs; (void)n; (void)in; (void)h_in; (void)out; (void)h_out; (void)out_tokens;
    s_none(err, errlen);
    return -1;
}

int stage_cuda_drain(zl_engine *e, int wait_ms) {
    (void)e; (void)wait_ms;
    return -1;
}

void stage_cuda_link_destroy(stage_cuda_link **l, int abandon, int wait_ms) {
    (void)abandon; (void)wait_ms;
    if (l && *l) *l = NULL;   /* never allocated without CUDA */
}
#endif
