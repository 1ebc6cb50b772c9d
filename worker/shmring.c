/* worker/shmring.c: see shmring.h. Counters in shared memory are 32-bit words touched only with __atomic
 * builtins (acquire/release), so that futex(2) can sleep on them; they wrap, and only differences are used. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "shmring.h"

#define S_MAGIC 0x314d48534d4c4c5aULL   /* "ZLLMSHM1" */
#define S_VERSION 1u
#define S_SLICE_MS 20                    /* futex sleep slice between liveness checks */
#define S_ALIGN 64

typedef struct {
    uint32_t pid;                  /* process id, 0 while not attached */
    uint32_t state;                /* 0 absent, 1 attached */
    uint64_t heartbeat_ms;         /* CLOCK_MONOTONIC ms of its last wait slice / heartbeat */
} s_member;

typedef struct {
    uint32_t cap;                  /* slots */
    uint32_t pad;
    uint64_t slot_bytes;           /* bytes per slot, header included, multiple of S_ALIGN */
    uint64_t off;                  /* offset of slot 0 from the segment start */
    uint32_t head __attribute__((aligned(64)));   /* slots published (wraps) */
    uint32_t tail __attribute__((aligned(64)));   /* slots released (wraps) */
} s_ring_hdr;

typedef struct {
    uint64_t magic;                /* S_MAGIC, written last-but-one (before ready) */
    uint32_t version;              /* S_VERSION */
    uint32_t ready;                /* 1 once everything below is initialized */
    uint64_t total_bytes;          /* segment size */
    uint64_t gen;                  /* generation nonce of this group */
    uint32_t n_members;            /* processes, 2..SHM_MAX_MEMBERS */
    uint32_t n_rings;              /* rings, 1..SHM_MAX_RINGS */
    uint32_t abort_word;           /* SHM_RUNNING / SHM_SHUTDOWN / SHM_FAILED */
    uint32_t info_bytes;           /* bytes of info */
    s_member members[SHM_MAX_MEMBERS];   /* [n_members] */
    s_ring_hdr rings[SHM_MAX_RINGS];     /* [n_rings] */
    uint8_t info[SHM_MAX_INFO];    /* creator's blob */
} s_hdr;

typedef struct {
    uint64_t gen;                  /* generation of the group that wrote the slot */
    uint32_t seq;                  /* head value when it was published */
    uint32_t pad;
    uint64_t bytes;                /* payload bytes */
    uint64_t pad2[5];              /* pads the header to S_ALIGN so payloads stay aligned */
} s_slot_hdr;

struct shm_group {
    char name[80];                 /* "/NAME" */
    s_hdr *h;                      /* the mapping */
    size_t size;                   /* bytes mapped */
    int member;                    /* this process's member index */
    int creator;                   /* 1 for member 0 */
    uint64_t gen;                  /* generation seen at create/attach */
    int dead_ms;                   /* heartbeat age that means dead */
    uint32_t reserved[SHM_MAX_RINGS];   /* 1 while a producer holds a reserved slot */
    uint32_t peeked[SHM_MAX_RINGS];     /* 1 while a consumer holds a peeked slot */
};

static uint64_t s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int s_name(const char *name, char *out, size_t outlen, char *err, size_t errlen) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > 64) {
        snprintf(err, errlen, "shm group name must have 1..64 characters");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.')) {
            snprintf(err, errlen, "shm group name '%s': only letters, digits, '_', '-' and '.'", name);
            return -1;
        }
    }
    snprintf(out, outlen, "/zllm-%s", name);
    return 0;
}

static void s_futex_wait(uint32_t *addr, uint32_t val, int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void s_futex_wake(uint32_t *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int s_pid_alive(uint32_t pid) {
    if (pid == 0 || pid > (uint32_t)INT_MAX) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

void shm_group_heartbeat(shm_group *g) {
    if (!g) return;
    __atomic_store_n(&g->h->members[g->member].heartbeat_ms, s_now_ms(), __ATOMIC_RELAXED);
}

void shm_group_abort(shm_group *g, int why) {
    if (!g || (why != SHM_SHUTDOWN && why != SHM_FAILED)) return;
    uint32_t cur = __atomic_load_n(&g->h->abort_word, __ATOMIC_ACQUIRE);
    while (cur < (uint32_t)why &&
           !__atomic_compare_exchange_n(&g->h->abort_word, &cur, (uint32_t)why, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
    /* wake every waiter: they sleep on ring counters */
    for (uint32_t r = 0; r < g->h->n_rings && r < SHM_MAX_RINGS; r++) {
        s_futex_wake(&g->h->rings[r].head);
        s_futex_wake(&g->h->rings[r].tail);
    }
}

int shm_group_aborted(const shm_group *g) {
    return g ? (int)__atomic_load_n(&g->h->abort_word, __ATOMIC_ACQUIRE) : SHM_FAILED;
}

/* 0 while the group is healthy; -1 with a message on abort, generation change or a dead member */
static int s_check_group(shm_group *g, char *err, size_t errlen) {
    s_hdr *h = g->h;
    uint32_t a = __atomic_load_n(&h->abort_word, __ATOMIC_ACQUIRE);
    if (a == SHM_SHUTDOWN) {
        snprintf(err, errlen, "group shut down");
        return -1;
    }
    if (a != SHM_RUNNING) {
        snprintf(err, errlen, "group aborted after a failure");
        return -1;
    }
    if (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) != g->gen) {
        snprintf(err, errlen, "group generation changed (restarted by another process)");
        return -1;
    }
    uint64_t now = s_now_ms();
    for (uint32_t m = 0; m < h->n_members && m < SHM_MAX_MEMBERS; m++) {
        if ((int)m == g->member) continue;
        uint32_t pid = __atomic_load_n(&h->members[m].pid, __ATOMIC_ACQUIRE);
        if (pid == 0) continue;   /* not attached yet (creator waits for all before running) */
        uint64_t hb = __atomic_load_n(&h->members[m].heartbeat_ms, __ATOMIC_RELAXED);
        if (!s_pid_alive(pid)) {
            snprintf(err, errlen, "member %u (pid %u) died", m, pid);
            return -1;
        }
        if (g->dead_ms > 0 && now > hb && now - hb > (uint64_t)g->dead_ms) {
            snprintf(err, errlen, "member %u (pid %u) silent for %llu ms", m, pid, (unsigned long long)(now - hb));
            return -1;
        }
    }
    return 0;
}

int shm_group_check(shm_group *g, char *err, size_t errlen) {
    if (!g) {
        snprintf(err, errlen, "no group");
        return -1;
    }
    return s_check_group(g, err, errlen);
}

/* sleeps on *word while it equals val (one slice), then heartbeats and checks the group.
 * Returns 0 to retry, 1 when timeout_ms (from t0) has passed, -1 on a group failure. */
static int s_wait_slice(shm_group *g, uint32_t *word, uint32_t val, uint64_t t0, int timeout_ms, char *err,
                        size_t errlen) {
    s_futex_wait(word, val, S_SLICE_MS);
    shm_group_heartbeat(g);
    if (s_check_group(g, err, errlen)) return -1;
    if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
        snprintf(err, errlen, "timed out after %d ms", timeout_ms);
        return 1;
    }
    return 0;
}

static uint64_t s_round(uint64_t x) {
    return (x + S_ALIGN - 1) / S_ALIGN * S_ALIGN;
}

shm_group *shm_group_create(const char *name, int n_members, const shm_ring_spec *rings, int n_rings,
                            const void *info, size_t info_bytes, char *err, size_t errlen) {
    char nm[80];
    if (s_name(name, nm, sizeof nm, err, errlen)) return NULL;
    if (n_members < 2 || n_members > SHM_MAX_MEMBERS || n_rings < 1 || n_rings > SHM_MAX_RINGS || !rings ||
        info_bytes > SHM_MAX_INFO || (info_bytes && !info)) {
        snprintf(err, errlen, "shm group: %d members, %d rings, %zu info bytes (limits %d, %d, %d)", n_members,
                 n_rings, info_bytes, SHM_MAX_MEMBERS, SHM_MAX_RINGS, SHM_MAX_INFO);
        return NULL;
    }
    uint64_t total = s_round(sizeof(s_hdr));
    uint64_t offs[SHM_MAX_RINGS], slot[SHM_MAX_RINGS];
    for (int r = 0; r < n_rings; r++) {
        if (rings[r].cap < 1 || rings[r].cap > 4096 || rings[r].payload_bytes > ((uint64_t)1 << 36)) {
            snprintf(err, errlen, "shm group: ring %d: %u slots of %llu bytes out of limits", r, rings[r].cap,
                     (unsigned long long)rings[r].payload_bytes);
            return NULL;
        }
        slot[r] = s_round(sizeof(s_slot_hdr) + rings[r].payload_bytes);
        offs[r] = total;
        total += slot[r] * rings[r].cap;
        if (total > ((uint64_t)1 << 40)) {
            snprintf(err, errlen, "shm group: %llu bytes is too large", (unsigned long long)total);
            return NULL;
        }
    }
    shm_unlink(nm);   /* a stale group of the same name: its members see their creator dead and leave */
    int fd = shm_open(nm, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open %s: %s", nm, strerror(errno));
        return NULL;
    }
    shm_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "shm group: out of memory");
        goto fail;
    }
    snprintf(g->name, sizeof g->name, "%s", nm);
    g->creator = 1;
    g->dead_ms = 10000;
    if (ftruncate(fd, (off_t)total) != 0) {
        snprintf(err, errlen, "ftruncate %s to %llu bytes: %s", nm, (unsigned long long)total, strerror(errno));
        goto fail;
    }
    /* make sure the pages exist now (tmpfs allocates lazily: a full /dev/shm would SIGBUS later) */
    if (posix_fallocate(fd, 0, (off_t)total) != 0) {
        snprintf(err, errlen, "cannot allocate %llu bytes in /dev/shm for %s (is it large enough?)",
                 (unsigned long long)total, nm);
        goto fail;
    }
    void *p = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "mmap %s: %s", nm, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    g->h = p;
    g->size = (size_t)total;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->gen = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40);
    if (g->gen == 0) g->gen = 1;
    s_hdr *h = g->h;
    h->version = S_VERSION;
    h->total_bytes = total;
    h->gen = g->gen;
    h->n_members = (uint32_t)n_members;
    h->n_rings = (uint32_t)n_rings;
    h->info_bytes = (uint32_t)info_bytes;
    if (info_bytes) memcpy(h->info, info, info_bytes);
    for (int r = 0; r < n_rings; r++) {
        h->rings[r].cap = rings[r].cap;
        h->rings[r].slot_bytes = slot[r];
        h->rings[r].off = offs[r];
    }
    h->members[0].pid = (uint32_t)getpid();
    h->members[0].state = 1;
    h->members[0].heartbeat_ms = s_now_ms();
    h->magic = S_MAGIC;
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
    return g;
fail:
    if (fd >= 0) close(fd);
    shm_unlink(nm);
    free(g);
    return NULL;
}

/* 0 when the mapped header is complete and consistent with the file size; -1 otherwise */
static int s_validate(const s_hdr *h, size_t size, char *err, size_t errlen) {
    if (h->magic != S_MAGIC || h->version != S_VERSION || h->total_bytes != size) {
        snprintf(err, errlen, "bad header (magic, version or size)");
        return -1;
    }
    if (h->n_members < 2 || h->n_members > SHM_MAX_MEMBERS || h->n_rings < 1 || h->n_rings > SHM_MAX_RINGS ||
        h->info_bytes > SHM_MAX_INFO) {
        snprintf(err, errlen, "bad header counts");
        return -1;
    }
    for (uint32_t r = 0; r < h->n_rings; r++) {
        const s_ring_hdr *rh = &h->rings[r];
        if (rh->cap < 1 || rh->cap > 4096 || rh->slot_bytes < sizeof(s_slot_hdr) || rh->slot_bytes % S_ALIGN ||
            rh->off % S_ALIGN || rh->off < sizeof(s_hdr) || rh->off > size ||
            rh->slot_bytes > (size - rh->off) / rh->cap) {
            snprintf(err, errlen, "ring %u does not fit the segment", r);
            return -1;
        }
    }
    return 0;
}

shm_group *shm_group_attach(const char *name, int member, int timeout_ms, char *err, size_t errlen) {
    char nm[80];
    if (s_name(name, nm, sizeof nm, err, errlen)) return NULL;
    if (member < 1 || member >= SHM_MAX_MEMBERS) {
        snprintf(err, errlen, "shm group: member %d out of range", member);
        return NULL;
    }
    uint64_t t0 = s_now_ms();
    char why[160] = "not created yet";
    for (;;) {
        int fd = shm_open(nm, O_RDWR, 0);
        if (fd >= 0) {
            struct stat st;
            void *p = MAP_FAILED;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(s_hdr))
                p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (p != MAP_FAILED) {
                s_hdr *h = p;
                size_t size = (size_t)st.st_size;
                if (!__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE)) {
                    snprintf(why, sizeof why, "being initialized");
                } else if (s_validate(h, size, why, sizeof why) == 0) {
                    if (!s_pid_alive(h->members[0].pid)) {
                        snprintf(why, sizeof why, "stale (its creator pid %u is gone)", h->members[0].pid);
                    } else if ((uint32_t)member >= h->n_members) {
                        snprintf(err, errlen, "%s: member %d but the group has %u", nm, member, h->n_members);
                        munmap(p, size);
                        return NULL;
                    } else {
                        uint32_t zero = 0, me = (uint32_t)getpid();
                        uint32_t *slot = &h->members[member].pid;
                        __atomic_store_n(&h->members[member].heartbeat_ms, s_now_ms(), __ATOMIC_RELAXED);
                        if (__atomic_compare_exchange_n(slot, &zero, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                            shm_group *g = calloc(1, sizeof *g);
                            if (!g) {
                                __atomic_store_n(slot, 0, __ATOMIC_RELEASE);
                                munmap(p, size);
                                snprintf(err, errlen, "shm group: out of memory");
                                return NULL;
                            }
                            snprintf(g->name, sizeof g->name, "%s", nm);
                            g->h = h;
                            g->size = size;
                            g->member = member;
                            g->gen = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE);
                            g->dead_ms = 10000;
                            __atomic_store_n(&h->members[member].state, 1, __ATOMIC_RELEASE);
                            return g;
                        }
                        snprintf(err, errlen, "%s: member %d is already attached (pid %u)", nm, member, zero);
                        munmap(p, size);
                        return NULL;
                    }
                }
                munmap(p, size);
            }
        }
        if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
            snprintf(err, errlen, "cannot attach to shm group %s within %d ms: %s", nm, timeout_ms, why);
            return NULL;
        }
        usleep(20000);
    }
}

int shm_group_wait_members(shm_group *g, int timeout_ms, char *err, size_t errlen) {
    uint64_t t0 = s_now_ms();
    for (;;) {
        uint32_t m = 1;
        for (; m < g->h->n_members; m++)
            if (__atomic_load_n(&g->h->members[m].state, __ATOMIC_ACQUIRE) != 1) break;
        if (m == g->h->n_members) return 0;
        shm_group_heartbeat(g);
        if (s_check_group(g, err, errlen)) return -1;
        if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
            snprintf(err, errlen, "member %u did not attach within %d ms", m, timeout_ms);
            return -1;
        }
        usleep(10000);
    }
}

const void *shm_group_info(const shm_group *g, size_t *bytes) {
    if (bytes) *bytes = g->h->info_bytes;
    return g->h->info;
}

uint64_t shm_group_generation(const shm_group *g) {
    return g->gen;
}

int shm_group_rings(const shm_group *g) {
    return (int)g->h->n_rings;
}

void shm_group_set_dead_ms(shm_group *g, int ms) {
    if (g) g->dead_ms = ms;
}

int shm_group_member_gone(const shm_group *g, int member) {
    if (!g || member < 0 || (uint32_t)member >= g->h->n_members || member >= SHM_MAX_MEMBERS) return -1;
    const s_member *mb = &g->h->members[member];
    if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) == 2) return 1;
    return s_pid_alive(__atomic_load_n(&mb->pid, __ATOMIC_ACQUIRE)) ? 0 : 1;
}

void shm_group_destroy(shm_group **gp) {
    if (!gp || !*gp) return;
    shm_group *g = *gp;
    if (g->h) {
        __atomic_store_n(&g->h->members[g->member].state, 2, __ATOMIC_RELEASE);
        if (g->creator) {
            /* unlink only our own generation: a new group of the same name may already exist */
            int fd = shm_open(g->name, O_RDONLY, 0);
            if (fd >= 0) {
                s_hdr peek;
                ssize_t n = pread(fd, &peek, sizeof peek, 0);
                close(fd);
                if (n == (ssize_t)sizeof peek && peek.gen == g->gen) shm_unlink(g->name);
            }
        }
        munmap(g->h, g->size);
    }
    free(g);
    *gp = NULL;
}

int shm_group_unlink(const char *name) {
    char nm[80], err[128];
    if (s_name(name, nm, sizeof nm, err, sizeof err)) return -1;
    return shm_unlink(nm) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * rings */

static s_ring_hdr *s_ring(shm_group *g, int r, char *err, size_t errlen) {
    if (!g || r < 0 || (uint32_t)r >= g->h->n_rings) {
        snprintf(err, errlen, "ring %d does not exist", r);
        return NULL;
    }
    return &g->h->rings[r];
}

static s_slot_hdr *s_slot(shm_group *g, const s_ring_hdr *rh, uint32_t counter) {
    return (s_slot_hdr *)((char *)g->h + rh->off + (uint64_t)(counter % rh->cap) * rh->slot_bytes);
}

uint64_t shm_ring_payload_bytes(const shm_group *g, int r) {
    if (!g || r < 0 || (uint32_t)r >= g->h->n_rings) return 0;
    return g->h->rings[r].slot_bytes - sizeof(s_slot_hdr);
}

int shm_ring_reserve(shm_group *g, int r, int timeout_ms, void **payload, char *err, size_t errlen) {
    s_ring_hdr *rh = s_ring(g, r, err, errlen);
    if (!rh) return -1;
    uint64_t t0 = s_now_ms();
    for (;;) {
        if (s_check_group(g, err, errlen)) return -1;
        uint32_t head = __atomic_load_n(&rh->head, __ATOMIC_RELAXED);   /* we are its only writer */
        uint32_t tail = __atomic_load_n(&rh->tail, __ATOMIC_ACQUIRE);
        uint32_t used = head - tail;
        if (used > rh->cap) {
            snprintf(err, errlen, "ring %d corrupt: %u slots in use of %u", r, used, rh->cap);
            return -1;
        }
        if (used < rh->cap) {
            g->reserved[r] = 1;
            *payload = (char *)s_slot(g, rh, head) + sizeof(s_slot_hdr);
            return 0;
        }
        int w = s_wait_slice(g, &rh->tail, tail, t0, timeout_ms, err, errlen);
        if (w) return w;
    }
}

int shm_ring_publish(shm_group *g, int r, uint64_t bytes, char *err, size_t errlen) {
    s_ring_hdr *rh = s_ring(g, r, err, errlen);
    if (!rh) return -1;
    if (!g->reserved[r] || bytes > rh->slot_bytes - sizeof(s_slot_hdr)) {
        snprintf(err, errlen, "ring %d: publish of %llu bytes without a reservation or too large", r,
                 (unsigned long long)bytes);
        return -1;
    }
    uint32_t head = __atomic_load_n(&rh->head, __ATOMIC_RELAXED);
    s_slot_hdr *sh = s_slot(g, rh, head);
    sh->gen = g->gen;
    sh->seq = head;
    sh->bytes = bytes;
    g->reserved[r] = 0;
    __atomic_store_n(&rh->head, head + 1, __ATOMIC_RELEASE);
    s_futex_wake(&rh->head);
    return 0;
}

int shm_ring_peek(shm_group *g, int r, int timeout_ms, const void **payload, uint64_t *bytes, char *err,
                  size_t errlen) {
    s_ring_hdr *rh = s_ring(g, r, err, errlen);
    if (!rh) return -1;
    uint64_t t0 = s_now_ms();
    for (;;) {
        uint32_t tail = __atomic_load_n(&rh->tail, __ATOMIC_RELAXED);   /* we are its only writer */
        uint32_t head = __atomic_load_n(&rh->head, __ATOMIC_ACQUIRE);
        uint32_t avail = head - tail;
        if (avail > rh->cap) {
            snprintf(err, errlen, "ring %d corrupt: %u slots published of %u", r, avail, rh->cap);
            return -1;
        }
        if (avail > 0) {
            const s_slot_hdr *sh = s_slot(g, rh, tail);
            if (sh->gen != g->gen) {
                snprintf(err, errlen, "ring %d: stale slot from generation %llx (ours %llx)", r,
                         (unsigned long long)sh->gen, (unsigned long long)g->gen);
                return -1;
            }
            if (sh->seq != tail || sh->bytes > rh->slot_bytes - sizeof(s_slot_hdr)) {
                snprintf(err, errlen, "ring %d: slot out of order (seq %u, expected %u) or oversized", r, sh->seq,
                         tail);
                return -1;
            }
            *payload = (const char *)sh + sizeof(s_slot_hdr);
            *bytes = sh->bytes;
            g->peeked[r] = 1;
            return 0;
        }
        /* checked only when idle, so that a shutdown lets the consumer drain what was published */
        int w = s_wait_slice(g, &rh->head, head, t0, timeout_ms, err, errlen);
        if (w) return w;
    }
}

void shm_ring_release(shm_group *g, int r) {
    if (!g || r < 0 || (uint32_t)r >= g->h->n_rings || !g->peeked[r]) return;
    g->peeked[r] = 0;
    s_ring_hdr *rh = &g->h->rings[r];
    uint32_t tail = __atomic_load_n(&rh->tail, __ATOMIC_RELAXED);
    __atomic_store_n(&rh->tail, tail + 1, __ATOMIC_RELEASE);
    s_futex_wake(&rh->tail);
}
