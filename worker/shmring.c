/* worker/shmring.c: see shmring.h. Counters in shared memory are 32-bit words touched only with __atomic
 * builtins (acquire/release), so that futex(2) can sleep on them; they wrap, and only differences are used.
 *
 * Trust: the segment is writable by every process of the owner's uid, so nothing read from it is trusted
 * after attach. The geometry (member and ring counts, each ring's offset, capacity and slot size) and the info
 * blob are validated once and copied into the private shm_group; every address is computed from that copy.
 * A producer keeps its ring's head and a consumer its tail privately too: the shared copies only tell the
 * other side, and a shared counter that no longer matches its owner's private one is reported as corruption
 * by the owner's next wait slice. Slot headers are read once each into locals before they are checked. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "shmring.h"

#define S_MAGIC 0x314d48534d4c4c5aULL /* "ZLLMSHM1" */
#define S_VERSION 2u
#define S_SLICE_MS 20 /* futex sleep slice between liveness checks */
#define S_ALIGN 64
#define S_DIR "/dev/shm"                /* where POSIX shared memory lives on Linux */
#define S_SUFFIX 16                     /* hex digits of a segment's random suffix */
#define S_UNINIT_S 60                   /* a segment without a creator pid this old is a creator's crash */
#define S_MAX_TOTAL ((uint64_t)1 << 40) /* bytes of one segment, at most */

/* ring roles of this process (private) */
enum { S_PRODUCER = 1, S_CONSUMER = 2 };
typedef struct {
    uint32_t pid;          /* process id, 0 while not attached; members[0]: the creator, written first */
    uint32_t state;        /* 0 absent, 1 attached, 2 left */
    uint64_t heartbeat_ms; /* CLOCK_MONOTONIC ms of its last wait slice / heartbeat */
} s_member;

typedef struct {
    uint32_t cap; /* slots */
    uint32_t pad;
    uint64_t slot_bytes;                        /* bytes per slot, header included, multiple of S_ALIGN */
    uint64_t off;                               /* offset of slot 0 from the segment start */
    uint32_t head __attribute__((aligned(64))); /* slots published (wraps) */
    uint32_t tail __attribute__((aligned(64))); /* slots released (wraps) */
} s_ring_hdr;

typedef struct {
    uint64_t magic;                    /* S_MAGIC, written last-but-one (before ready) */
    uint32_t version;                  /* S_VERSION */
    uint32_t ready;                    /* 1 once everything below is initialized */
    uint64_t total_bytes;              /* segment size */
    uint64_t gen;                      /* generation nonce of this group */
    uint32_t n_members;                /* processes, 2..SHM_MAX_MEMBERS */
    uint32_t n_rings;                  /* rings, 1..SHM_MAX_RINGS */
    uint32_t abort_word;               /* SHM_RUNNING / SHM_SHUTDOWN / SHM_FAILED */
    uint32_t info_bytes;               /* bytes of info */
    s_member members[SHM_MAX_MEMBERS]; /* [n_members] */
    s_ring_hdr rings[SHM_MAX_RINGS];   /* [n_rings] */
    uint8_t info[SHM_MAX_INFO];        /* creator's blob */
} s_hdr;

typedef struct {
    uint64_t gen; /* generation of the group that wrote the slot */
    uint32_t seq; /* head value when it was published */
    uint32_t pad;
    uint64_t bytes;   /* payload bytes */
    uint64_t pad2[5]; /* pads the header to S_ALIGN so payloads stay aligned */
} s_slot_hdr;

/* a ring's geometry, validated once (private) */
typedef struct {
    uint32_t cap;        /* slots */
    uint64_t slot_bytes; /* bytes per slot, header included */
    uint64_t off;        /* offset of slot 0 from the segment start */
} s_geo;

struct shm_group {
    char name[128];                   /* "zllm-NAME.UID.SUFFIX", the file's name in S_DIR */
    char path[144];                   /* S_DIR "/" name */
    s_hdr *h;                         /* the mapping */
    size_t size;                      /* bytes mapped */
    int member;                       /* this process's member index */
    int creator;                      /* 1 for member 0 */
    uint64_t gen;                     /* generation seen at create/attach */
    int dead_ms;                      /* heartbeat age that means dead */
    uint32_t n_members, n_rings;      /* validated counts */
    s_geo geo[SHM_MAX_RINGS];         /* validated ring geometry */
    uint32_t head[SHM_MAX_RINGS];     /* producer: slots this process published (the shared head's true value) */
    uint32_t tail[SHM_MAX_RINGS];     /* consumer: slots this process released */
    uint32_t role[SHM_MAX_RINGS];     /* S_PRODUCER / S_CONSUMER bits: which counter this process owns */
    uint32_t reserved[SHM_MAX_RINGS]; /* 1 while a producer holds a reserved slot */
    uint32_t peeked[SHM_MAX_RINGS];   /* 1 while a consumer holds a peeked slot */
    uint32_t info_bytes;              /* bytes of info */
    uint8_t info[SHM_MAX_INFO];       /* the creator's blob, copied */
    uint32_t pid[SHM_MAX_MEMBERS];    /* each member's pid as first seen (0: not yet; atomics: two threads check) */
};

static uint64_t s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* checks a group name; 0 or -1 with a message */
static int s_check_name(const char *name, char *err, size_t errlen) {
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
    return 0;
}

/* "zllm-NAME.UID." : the part of a segment's file name that this user's groups called NAME share */
static void s_prefix(const char *name, char *out, size_t outlen) {
    snprintf(out, outlen, "zllm-%s.%u.", name ? name : "", (unsigned)geteuid());
}

/* 1 when file name f is a segment of this user: "zllm-" ... "." UID "." SUFFIX hex digits; with prefix (from
 * s_prefix), only of that group */
static int s_ours(const char *f, const char *prefix) {
    size_t n = strlen(f);
    if (n < 5 + S_SUFFIX + 3 || strncmp(f, "zllm-", 5) != 0) return 0;
    for (size_t i = n - S_SUFFIX; i < n; i++)
        if (!((f[i] >= '0' && f[i] <= '9') || (f[i] >= 'a' && f[i] <= 'f'))) return 0;
    if (prefix) return strlen(prefix) + S_SUFFIX == n && strncmp(f, prefix, strlen(prefix)) == 0;
    char uid[24];
    int k = snprintf(uid, sizeof uid, ".%u.", (unsigned)geteuid());
    return n >= S_SUFFIX + (size_t)k + 6 && strncmp(f + n - S_SUFFIX - k, uid, (size_t)k) == 0;
}

/* Opens file f of S_DIR (dirfd: S_DIR open, or -1) without following links or blocking, and checks that it is
 * a regular file of this user with no group or other permission bits. Returns the fd, or -1 with why. */
static int s_open_own(int dirfd, const char *f, int flags, struct stat *st, char *why, size_t whylen) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", S_DIR, f);
    int fd = dirfd >= 0 ? openat(dirfd, f, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                        : open(p, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", f, strerror(errno));
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_uid != geteuid() || (st->st_mode & 077) != 0) {
        snprintf(why, whylen, "%s refused: not a regular file of uid %u with mode 0600 (uid %u, mode %o)", f,
                 (unsigned)geteuid(), (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777));
        close(fd);
        return -1;
    }
    return fd;
}

static void s_futex_wait(uint32_t *addr, uint32_t val, int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void s_futex_wake(uint32_t *addr) { syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static int s_pid_alive(uint32_t pid) {
    if (pid == 0 || pid > (uint32_t)INT_MAX) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* ------------------------------------------------------------------------------------------------------------
 * stale segments */

int shm_group_sweep(void) {
    DIR *d = opendir(S_DIR);
    if (!d) return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!s_ours(de->d_name, NULL)) continue;
        struct stat st;
        char why[300];
        int fd = s_open_own(dirfd(d), de->d_name, O_RDONLY, &st, why, sizeof why);
        if (fd < 0) continue; /* another user's file (refused), or gone meanwhile */
        s_member creator;
        memset(&creator, 0, sizeof creator);
        ssize_t n = pread(fd, &creator, sizeof creator, (off_t)offsetof(s_hdr, members));
        close(fd);
        int stale;
        if (n == (ssize_t)sizeof creator && creator.pid != 0) stale = !s_pid_alive(creator.pid);
        else stale = time(NULL) - st.st_mtime > S_UNINIT_S && time(NULL) - st.st_ctime > S_UNINIT_S;
        if (stale && unlinkat(dirfd(d), de->d_name, 0) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* unlinks every segment of this user's group (prefix from s_prefix); returns how many */
static int s_unlink_group(const char *prefix) {
    DIR *d = opendir(S_DIR);
    if (!d) return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!s_ours(de->d_name, prefix)) continue;
        struct stat st;
        char why[300];
        int fd = s_open_own(dirfd(d), de->d_name, O_RDONLY, &st, why, sizeof why);
        if (fd < 0) continue;
        close(fd);
        if (unlinkat(dirfd(d), de->d_name, 0) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* unlinks g's segment if its name still holds g's generation */
static void s_unlink_own(shm_group *g) {
    struct stat st;
    char why[300];
    int fd = s_open_own(-1, g->name, O_RDONLY, &st, why, sizeof why);
    if (fd < 0) return;
    uint64_t gen = 0;
    ssize_t n = pread(fd, &gen, sizeof gen, (off_t)offsetof(s_hdr, gen));
    close(fd);
    if (n == (ssize_t)sizeof gen && gen == g->gen) unlink(g->path);
}

/* ------------------------------------------------------------------------------------------------------------
 * group */

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
    for (uint32_t r = 0; r < g->n_rings; r++) {
        s_futex_wake(&g->h->rings[r].head);
        s_futex_wake(&g->h->rings[r].tail);
    }
}

int shm_group_aborted(const shm_group *g) {
    if (!g) return SHM_FAILED;
    uint32_t a = __atomic_load_n(&g->h->abort_word, __ATOMIC_ACQUIRE);
    return a == SHM_RUNNING || a == SHM_SHUTDOWN ? (int)a : SHM_FAILED; /* anything else: failed */
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
    /* the geometry in use is the private copy; a shared one that differs was rewritten by another process */
    if (__atomic_load_n(&h->n_members, __ATOMIC_RELAXED) != g->n_members ||
        __atomic_load_n(&h->n_rings, __ATOMIC_RELAXED) != g->n_rings ||
        __atomic_load_n(&h->total_bytes, __ATOMIC_RELAXED) != g->size) {
        snprintf(err, errlen, "group header corrupt: counts or size changed by another process");
        return -1;
    }
    for (uint32_t r = 0; r < g->n_rings; r++) {
        const s_ring_hdr *rh = &h->rings[r];
        if (__atomic_load_n(&rh->cap, __ATOMIC_RELAXED) != g->geo[r].cap ||
            __atomic_load_n(&rh->slot_bytes, __ATOMIC_RELAXED) != g->geo[r].slot_bytes ||
            __atomic_load_n(&rh->off, __ATOMIC_RELAXED) != g->geo[r].off) {
            snprintf(err, errlen,
                     "ring %u corrupt: its geometry (offset, slots, slot size) was changed by another "
                     "process",
                     r);
            return -1;
        }
    }
    uint64_t now = s_now_ms();
    for (uint32_t m = 0; m < g->n_members; m++) {
        if ((int)m == g->member) continue;
        uint32_t pid = __atomic_load_n(&h->members[m].pid, __ATOMIC_ACQUIRE);
        /* a member's pid is recorded when first seen: a record rewritten later (to another live process, or back
         * to 0 so that the member looks not attached yet) would hide its death */
        uint32_t seen = 0;
        if (pid != 0 && !__atomic_compare_exchange_n(&g->pid[m], &seen, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
            seen != pid) {
            snprintf(err, errlen, "member %u's record corrupt: pid %u changed to %u by another process", m, seen, pid);
            return -1;
        }
        seen = __atomic_load_n(&g->pid[m], __ATOMIC_ACQUIRE);
        if (pid == 0 && seen != 0) {
            snprintf(err, errlen, "member %u's record corrupt: pid %u cleared by another process", m, seen);
            return -1;
        }
        if (pid == 0) continue; /* not attached yet (creator waits for all before running) */
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

/* the shared counters this process owns still hold what it wrote; -1 with a message otherwise (another process
 * wrote them: left alone, a counter moved back would leave its consumer or producer waiting forever) */
static int s_check_counters(shm_group *g, char *err, size_t errlen) {
    for (uint32_t r = 0; r < g->n_rings; r++) {
        uint32_t v;
        if ((g->role[r] & S_PRODUCER) && (v = __atomic_load_n(&g->h->rings[r].head, __ATOMIC_RELAXED)) != g->head[r]) {
            snprintf(err, errlen, "ring %u corrupt: its head %u was changed by another process (published %u)", r, v,
                     g->head[r]);
            return -1;
        }
        if ((g->role[r] & S_CONSUMER) && (v = __atomic_load_n(&g->h->rings[r].tail, __ATOMIC_RELAXED)) != g->tail[r]) {
            snprintf(err, errlen, "ring %u corrupt: its tail %u was changed by another process (released %u)", r, v,
                     g->tail[r]);
            return -1;
        }
    }
    return 0;
}

/* sleeps on *word while it equals val (one slice), then heartbeats and checks the group and this process's
 * counters. Returns 0 to retry, 1 when timeout_ms (from t0) has passed, -1 on a group failure. */
static int s_wait_slice(shm_group *g, uint32_t *word, uint32_t val, uint64_t t0, int timeout_ms, char *err,
                        size_t errlen) {
    s_futex_wait(word, val, S_SLICE_MS);
    shm_group_heartbeat(g);
    if (s_check_group(g, err, errlen) || s_check_counters(g, err, errlen)) return -1;
    if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
        snprintf(err, errlen, "timed out after %d ms", timeout_ms);
        return 1;
    }
    return 0;
}

static uint64_t s_round(uint64_t x) { return (x + S_ALIGN - 1) / S_ALIGN * S_ALIGN; }

shm_group *shm_group_create(const char *name, int n_members, const shm_ring_spec *rings, int n_rings, const void *info,
                            size_t info_bytes, char *err, size_t errlen) {
    if (s_check_name(name, err, errlen)) return NULL;
    if (n_members < 2 || n_members > SHM_MAX_MEMBERS || n_rings < 1 || n_rings > SHM_MAX_RINGS || !rings ||
        info_bytes > SHM_MAX_INFO || (info_bytes && !info)) {
        snprintf(err, errlen, "shm group: %d members, %d rings, %zu info bytes (limits %d, %d, %d)", n_members, n_rings,
                 info_bytes, SHM_MAX_MEMBERS, SHM_MAX_RINGS, SHM_MAX_INFO);
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
        if (total > S_MAX_TOTAL) {
            snprintf(err, errlen, "shm group: %llu bytes is too large", (unsigned long long)total);
            return NULL;
        }
    }
    shm_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "shm group: out of memory");
        return NULL;
    }
    int fd = -1, made = 0; /* made: the file at g->path is ours (the failure path removes it) */
    /* segments whose creator is gone (any group of this user), then the earlier segments of this group: their
     * members, if any survive, see their creator gone or the group failed and leave */
    shm_group_sweep();
    char prefix[96];
    s_prefix(name, prefix, sizeof prefix);
    s_unlink_group(prefix);
    /* a name nobody else can predict: another user may create files in S_DIR, so a fixed name could be taken
     * (the creation would fail) or be a trap; O_EXCL never opens an existing file */
    for (int tries = 0; fd < 0 && tries < 16; tries++) {
        uint64_t rnd = 0;
        if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            snprintf(err, errlen, "shm group: getrandom: %s", strerror(errno));
            goto fail;
        }
        snprintf(g->name, sizeof g->name, "%s%016llx", prefix, (unsigned long long)rnd);
        snprintf(g->path, sizeof g->path, "%s/%s", S_DIR, g->name);
        fd = open(g->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) {
            snprintf(err, errlen, "create %s: %s", g->path, strerror(errno));
            goto fail;
        }
    }
    if (fd < 0) {
        snprintf(err, errlen, "create %s*: every name tried exists", prefix);
        goto fail;
    }
    made = 1;
    g->creator = 1;
    g->dead_ms = 10000;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)total) != 0) {
        snprintf(err, errlen, "size %s to %llu bytes: %s", g->path, (unsigned long long)total, strerror(errno));
        goto fail;
    }
    /* make sure the pages exist now (tmpfs allocates lazily: a full /dev/shm would SIGBUS later) */
    if (posix_fallocate(fd, 0, (off_t)total) != 0) {
        snprintf(err, errlen, "cannot allocate %llu bytes in /dev/shm for %s (is it large enough?)",
                 (unsigned long long)total, g->path);
        goto fail;
    }
    void *p = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "mmap %s: %s", g->path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    g->h = p;
    g->size = (size_t)total;
    s_hdr *h = g->h;
    h->members[0].pid = (uint32_t)getpid(); /* first: a sweep must see whose segment this is */
    g->pid[0] = h->members[0].pid;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = 0;
    g->gen = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^ rnd;
    if (g->gen == 0) g->gen = 1;
    g->n_members = (uint32_t)n_members;
    g->n_rings = (uint32_t)n_rings;
    g->info_bytes = (uint32_t)info_bytes;
    if (info_bytes) memcpy(g->info, info, info_bytes);
    h->version = S_VERSION;
    h->total_bytes = total;
    h->gen = g->gen;
    h->n_members = (uint32_t)n_members;
    h->n_rings = (uint32_t)n_rings;
    h->info_bytes = (uint32_t)info_bytes;
    if (info_bytes) memcpy(h->info, info, info_bytes);
    for (int r = 0; r < n_rings; r++) {
        g->geo[r] = (s_geo){rings[r].cap, slot[r], offs[r]};
        h->rings[r].cap = rings[r].cap;
        h->rings[r].slot_bytes = slot[r];
        h->rings[r].off = offs[r];
    }
    h->members[0].state = 1;
    h->members[0].heartbeat_ms = s_now_ms();
    h->magic = S_MAGIC;
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
    return g;
fail:
    if (fd >= 0) close(fd);
    if (made) unlink(g->path);
    free(g);
    return NULL;
}

/* Validates the private copy h of a header mapped from a file of `size` bytes and fills g's geometry and info
 * from it. 0, or -1 with a message. */
static int s_validate(shm_group *g, const s_hdr *h, size_t size, char *err, size_t errlen) {
    if (h->magic != S_MAGIC || h->version != S_VERSION || h->total_bytes != size) {
        snprintf(err, errlen, "bad header (magic, version or size)");
        return -1;
    }
    if (h->n_members < 2 || h->n_members > SHM_MAX_MEMBERS || h->n_rings < 1 || h->n_rings > SHM_MAX_RINGS ||
        h->info_bytes > SHM_MAX_INFO) {
        snprintf(err, errlen, "bad header counts");
        return -1;
    }
    uint64_t end = s_round(sizeof(s_hdr)); /* rings follow the header and each other, without overlap */
    for (uint32_t r = 0; r < h->n_rings; r++) {
        const s_ring_hdr *rh = &h->rings[r];
        if (rh->cap < 1 || rh->cap > 4096 || rh->slot_bytes < sizeof(s_slot_hdr) || rh->slot_bytes % S_ALIGN ||
            rh->off % S_ALIGN || rh->off < end || rh->off > size || rh->slot_bytes > (size - rh->off) / rh->cap) {
            snprintf(err, errlen, "ring %u does not fit the segment", r);
            return -1;
        }
        g->geo[r] = (s_geo){rh->cap, rh->slot_bytes, rh->off};
        end = rh->off + rh->slot_bytes * rh->cap;
    }
    g->n_members = h->n_members;
    g->n_rings = h->n_rings;
    g->info_bytes = h->info_bytes;
    memcpy(g->info, h->info, h->info_bytes);
    return 0;
}

/* Tries to attach g as `member` to segment file f of S_DIR. 0 when attached; 1 when f is not (yet) a group to
 * join, with why; -1 on a definite error (member out of range or taken, out of memory), with err. */
static int s_attach_one(shm_group *g, int dfd, const char *f, int member, char *why, size_t whylen, char *err,
                        size_t errlen) {
    struct stat st;
    int fd = s_open_own(dfd, f, O_RDWR, &st, why, whylen);
    if (fd < 0) return 1;
    size_t size = (size_t)st.st_size;
    void *p = MAP_FAILED;
    if (st.st_size >= (off_t)sizeof(s_hdr) && (uint64_t)st.st_size <= S_MAX_TOTAL)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "%s: being created", f);
        return 1;
    }
    s_hdr *h = p;
    s_hdr *copy = malloc(sizeof *copy);
    int rc = 1;
    if (!copy) {
        snprintf(err, errlen, "shm group: out of memory");
        rc = -1;
        goto out;
    }
    if (!__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE)) {
        snprintf(why, whylen, "%s: being initialized", f);
        goto out;
    }
    memcpy(copy, h, sizeof *copy);
    char v[160];
    if (s_validate(g, copy, size, v, sizeof v)) {
        snprintf(why, whylen, "%.120s: %.150s", f, v);
        goto out;
    }
    if (!s_pid_alive(copy->members[0].pid)) {
        snprintf(why, whylen, "%s: stale (its creator pid %u is gone)", f, copy->members[0].pid);
        goto out;
    }
    if ((uint32_t)member >= g->n_members) {
        snprintf(err, errlen, "%s: member %d but the group has %u", f, member, g->n_members);
        rc = -1;
        goto out;
    }
    uint32_t zero = 0, me = (uint32_t)getpid();
    __atomic_store_n(&h->members[member].heartbeat_ms, s_now_ms(), __ATOMIC_RELAXED);
    if (!__atomic_compare_exchange_n(&h->members[member].pid, &zero, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        snprintf(err, errlen, "%s: member %d is already attached (pid %u)", f, member, zero);
        rc = -1;
        goto out;
    }
    snprintf(g->name, sizeof g->name, "%.127s", f); /* s_ours: a name of s_prefix + S_SUFFIX characters */
    snprintf(g->path, sizeof g->path, "%s/%.127s", S_DIR, f);
    g->h = h;
    g->size = size;
    g->member = member;
    g->gen = copy->gen;
    g->dead_ms = 10000;
    g->pid[0] = copy->members[0].pid;
    g->pid[member] = me;
    for (uint32_t r = 0; r < g->n_rings; r++) {
        g->head[r] = __atomic_load_n(&h->rings[r].head, __ATOMIC_ACQUIRE);
        g->tail[r] = __atomic_load_n(&h->rings[r].tail, __ATOMIC_ACQUIRE);
    }
    __atomic_store_n(&h->members[member].state, 1, __ATOMIC_RELEASE);
    rc = 0;
out:
    free(copy);
    if (rc != 0) munmap(p, size);
    return rc;
}

shm_group *shm_group_attach(const char *name, int member, int timeout_ms, char *err, size_t errlen) {
    if (s_check_name(name, err, errlen)) return NULL;
    if (member < 1 || member >= SHM_MAX_MEMBERS) {
        snprintf(err, errlen, "shm group: member %d out of range", member);
        return NULL;
    }
    char prefix[96];
    s_prefix(name, prefix, sizeof prefix);
    shm_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "shm group: out of memory");
        return NULL;
    }
    uint64_t t0 = s_now_ms();
    char why[320] = "not created yet";
    for (;;) {
        DIR *d = opendir(S_DIR);
        if (!d) {
            snprintf(err, errlen, "open %s: %s", S_DIR, strerror(errno));
            free(g);
            return NULL;
        }
        struct dirent *de;
        int rc = 1;
        while (rc == 1 && (de = readdir(d)) != NULL)
            if (s_ours(de->d_name, prefix))
                rc = s_attach_one(g, dirfd(d), de->d_name, member, why, sizeof why, err, errlen);
        closedir(d);
        if (rc == 0) return g;
        if (rc < 0) {
            free(g);
            return NULL;
        }
        if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
            snprintf(err, errlen, "cannot attach to shm group %s (%s/%s*) within %d ms: %s", name, S_DIR, prefix,
                     timeout_ms, why);
            free(g);
            return NULL;
        }
        usleep(20000);
    }
}

int shm_group_wait_members(shm_group *g, int timeout_ms, char *err, size_t errlen) {
    uint64_t t0 = s_now_ms();
    for (;;) {
        uint32_t m = 1;
        for (; m < g->n_members; m++)
            if (__atomic_load_n(&g->h->members[m].state, __ATOMIC_ACQUIRE) != 1 ||
                __atomic_load_n(&g->h->members[m].pid, __ATOMIC_ACQUIRE) == 0)
                break;
        shm_group_heartbeat(g);
        /* also records every attached member's pid (s_check_group), so none can be made to look absent later */
        if (s_check_group(g, err, errlen)) return -1;
        if (m == g->n_members) return 0;
        if (timeout_ms >= 0 && s_now_ms() - t0 >= (uint64_t)timeout_ms) {
            snprintf(err, errlen, "member %u did not attach within %d ms", m, timeout_ms);
            return -1;
        }
        usleep(10000);
    }
}

const void *shm_group_info(const shm_group *g, size_t *bytes) {
    if (bytes) *bytes = g->info_bytes;
    return g->info;
}

uint64_t shm_group_generation(const shm_group *g) { return g->gen; }

int shm_group_rings(const shm_group *g) { return (int)g->n_rings; }

const char *shm_group_path(const shm_group *g) { return g ? g->path : ""; }

void shm_group_set_dead_ms(shm_group *g, int ms) {
    if (g) g->dead_ms = ms;
}

int shm_group_member_gone(const shm_group *g, int member) {
    if (!g || member < 0 || (uint32_t)member >= g->n_members) return -1;
    const s_member *mb = &g->h->members[member];
    if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) == 2) return 1;
    uint32_t pid = __atomic_load_n(&g->pid[member], __ATOMIC_ACQUIRE); /* as first seen, when it was */
    return s_pid_alive(pid ? pid : __atomic_load_n(&mb->pid, __ATOMIC_ACQUIRE)) ? 0 : 1;
}

void shm_group_destroy(shm_group **gp) {
    if (!gp || !*gp) return;
    shm_group *g = *gp;
    if (g->h) {
        __atomic_store_n(&g->h->members[g->member].state, 2, __ATOMIC_RELEASE);
        /* the creator removes the name; so does a member once nobody can join any more (the group stopped, or its
         * creator is gone: it may have exited without cleaning up), so that no failure path leaves it behind */
        if (g->creator || __atomic_load_n(&g->h->abort_word, __ATOMIC_ACQUIRE) != SHM_RUNNING ||
            shm_group_member_gone(g, 0) == 1)
            s_unlink_own(g);
        munmap(g->h, g->size);
    }
    free(g);
    *gp = NULL;
}

int shm_group_unlink(const char *name) {
    char err[128], prefix[96];
    if (s_check_name(name, err, sizeof err)) return -1;
    s_prefix(name, prefix, sizeof prefix);
    return s_unlink_group(prefix) > 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * rings: every address comes from the private geometry; counter % cap keeps every slot inside its ring */

static int s_ring_ok(const shm_group *g, int r, char *err, size_t errlen) {
    if (!g || r < 0 || (uint32_t)r >= g->n_rings) {
        snprintf(err, errlen, "ring %d does not exist", r);
        return 0;
    }
    return 1;
}

static s_slot_hdr *s_slot(const shm_group *g, int r, uint32_t counter) {
    const s_geo *q = &g->geo[r];
    return (s_slot_hdr *)((char *)g->h + q->off + (uint64_t)(counter % q->cap) * q->slot_bytes);
}

uint64_t shm_ring_payload_bytes(const shm_group *g, int r) {
    if (!g || r < 0 || (uint32_t)r >= g->n_rings) return 0;
    return g->geo[r].slot_bytes - sizeof(s_slot_hdr);
}

int shm_ring_reserve(shm_group *g, int r, int timeout_ms, void **payload, char *err, size_t errlen) {
    if (!s_ring_ok(g, r, err, errlen)) return -1;
    s_ring_hdr *rh = &g->h->rings[r];
    const uint32_t cap = g->geo[r].cap;
    g->role[r] |= S_PRODUCER;
    uint64_t t0 = s_now_ms();
    for (;;) {
        if (s_check_group(g, err, errlen)) return -1;
        uint32_t head = g->head[r];
        uint32_t tail = __atomic_load_n(&rh->tail, __ATOMIC_ACQUIRE);
        uint32_t used = head - tail;
        if (used > cap) {
            snprintf(err, errlen, "ring %d corrupt: %u slots in use of %u", r, used, cap);
            return -1;
        }
        if (used < cap) {
            g->reserved[r] = 1;
            *payload = (char *)s_slot(g, r, head) + sizeof(s_slot_hdr);
            return 0;
        }
        int w = s_wait_slice(g, &rh->tail, tail, t0, timeout_ms, err, errlen);
        if (w) return w;
    }
}

int shm_ring_publish(shm_group *g, int r, uint64_t bytes, char *err, size_t errlen) {
    if (!s_ring_ok(g, r, err, errlen)) return -1;
    if (!g->reserved[r] || bytes > shm_ring_payload_bytes(g, r)) {
        snprintf(err, errlen, "ring %d: publish of %llu bytes without a reservation or too large", r,
                 (unsigned long long)bytes);
        return -1;
    }
    uint32_t head = g->head[r];
    s_slot_hdr *sh = s_slot(g, r, head);
    sh->gen = g->gen;
    sh->seq = head;
    sh->bytes = bytes;
    g->reserved[r] = 0;
    g->head[r] = head + 1;
    __atomic_store_n(&g->h->rings[r].head, head + 1, __ATOMIC_RELEASE);
    s_futex_wake(&g->h->rings[r].head);
    return 0;
}

int shm_ring_peek(shm_group *g, int r, int timeout_ms, const void **payload, uint64_t *bytes, char *err,
                  size_t errlen) {
    if (!s_ring_ok(g, r, err, errlen)) return -1;
    s_ring_hdr *rh = &g->h->rings[r];
    const uint32_t cap = g->geo[r].cap;
    g->role[r] |= S_CONSUMER;
    uint64_t t0 = s_now_ms();
    for (;;) {
        uint32_t tail = g->tail[r];
        uint32_t head = __atomic_load_n(&rh->head, __ATOMIC_ACQUIRE);
        uint32_t avail = head - tail;
        if (avail > cap) {
            snprintf(err, errlen, "ring %d corrupt: %u slots published of %u", r, avail, cap);
            return -1;
        }
        if (avail > 0) {
            s_slot_hdr *sh = s_slot(g, r, tail);
            /* each field read once: another process may rewrite the slot between the check and the use */
            uint64_t gen = __atomic_load_n(&sh->gen, __ATOMIC_RELAXED);
            uint32_t seq = __atomic_load_n(&sh->seq, __ATOMIC_RELAXED);
            uint64_t nb = __atomic_load_n(&sh->bytes, __ATOMIC_RELAXED);
            if (gen != g->gen) {
                snprintf(err, errlen, "ring %d: stale slot from generation %llx (ours %llx)", r,
                         (unsigned long long)gen, (unsigned long long)g->gen);
                return -1;
            }
            if (seq != tail || nb > shm_ring_payload_bytes(g, r)) {
                snprintf(err, errlen, "ring %d: slot out of order (seq %u, expected %u) or oversized (%llu bytes)", r,
                         seq, tail, (unsigned long long)nb);
                return -1;
            }
            *payload = (const char *)sh + sizeof(s_slot_hdr);
            *bytes = nb;
            g->peeked[r] = 1;
            return 0;
        }
        /* checked only when idle, so that a shutdown lets the consumer drain what was published */
        int w = s_wait_slice(g, &rh->head, head, t0, timeout_ms, err, errlen);
        if (w) return w;
    }
}

void shm_ring_release(shm_group *g, int r) {
    if (!g || r < 0 || (uint32_t)r >= g->n_rings || !g->peeked[r]) return;
    g->peeked[r] = 0;
    uint32_t tail = g->tail[r] + 1;
    g->tail[r] = tail;
    __atomic_store_n(&g->h->rings[r].tail, tail, __ATOMIC_RELEASE);
    s_futex_wake(&g->h->rings[r].tail);
}
