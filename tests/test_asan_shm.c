/* tests/test_asan_shm.c: a pipeline group's shared memory (worker/shmring.h, worker/stage.h) against other local
 * users and against writers of the segment, under ASan, with real processes and real files in /dev/shm.
 *
 * Runs as root (CI does) to play two other users: the victim V owns the groups, the attacker A is another uid.
 * The test switches its effective uid (seteuid) for what each user does in this process, and forks children
 * for whatever could crash or hang, waiting for each a bounded time (a hang is a failure, a signal too).
 * Checks: A cannot open or resize V's segment; files that A puts under V's names beforehand (any mode, with a
 * valid header and a live creator) neither stop V's leader nor are attached to; a segment of V with group or
 * other permission bits is refused; rewriting a ring's offset, capacity or slot size, or moving a ring counter
 * back, or a member's pid record, in a live group (as V: a writer of the segment) gives an error naming the
 * corruption within a bounded time, and in a running 2-stage pipeline makes both stages exit non-zero (not by a signal); segments whose
 * creator died are removed by the next creator; no segment is left after a failure (leader killed, group
 * failed and leader gone without cleanup, follower killed or stopped by SIGTERM, members that never came). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "engine.h"
#include "model.h"
#include "shmring.h"
#include "stage.h"
#include "test.h"

#define UID_V 60001u /* the victim: owns the groups */
#define UID_A 60002u /* the attacker: another local user */

/* mirror of worker/shmring.c's header (its S_VERSION 2); s_map() checks that it matches a live segment */
typedef struct {
    uint32_t pid, state;
    uint64_t heartbeat_ms;
} m_member;
typedef struct {
    uint32_t cap, pad;
    uint64_t slot_bytes, off;
    uint32_t head __attribute__((aligned(64)));
    uint32_t tail __attribute__((aligned(64)));
} m_ring;
typedef struct {
    uint64_t magic;
    uint32_t version, ready;
    uint64_t total_bytes, gen;
    uint32_t n_members, n_rings, abort_word, info_bytes;
    m_member members[SHM_MAX_MEMBERS];
    m_ring rings[SHM_MAX_RINGS];
    uint8_t info[SHM_MAX_INFO];
} m_hdr;
#define M_MAGIC 0x314d48534d4c4c5aULL

static char s_err[512];
static char s_model[1024];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* switches this process's effective uid and gid (0: back to root) */
static void as_user(unsigned uid) {
    if (seteuid(0) != 0 || setegid(uid) != 0 || (uid && seteuid(uid) != 0)) {
        fprintf(stderr, "cannot switch to uid %u: %s\n", uid, strerror(errno));
        exit(2);
    }
}

/* segment files of group NAME owned by uid: /dev/shm/zllm-NAME.UID.* and the plain zllm-NAME (so that a check
 * of what is left behind cannot pass by looking under the wrong name).
 * count: how many; path (may be NULL): the first one */
static int seg_find(const char *name, unsigned uid, char *path, size_t pathlen) {
    char p[2][160];
    snprintf(p[0], sizeof p[0], "/dev/shm/zllm-%s.%u.*", name, uid);
    snprintf(p[1], sizeof p[1], "/dev/shm/zllm-%s", name);
    int n = 0;
    if (path) path[0] = 0;
    for (int k = 0; k < 2; k++) {
        glob_t gl;
        if (glob(p[k], 0, NULL, &gl) == 0)
            for (size_t i = 0; i < gl.gl_pathc; i++) {
                struct stat st;
                if (lstat(gl.gl_pathv[i], &st) != 0 || st.st_uid != uid) continue;
                if (path && !path[0]) snprintf(path, pathlen, "%s", gl.gl_pathv[i]);
                n++;
            }
        globfree(&gl);
    }
    return n;
}

static int seg_count(const char *name, unsigned uid) { return seg_find(name, uid, NULL, 0); }

/* maps a segment file read-write; checks the mirror layout against what the group says. NULL on failure. */
static m_hdr *s_map(const char *path, size_t *size, uint64_t gen, uint32_t cap0) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(m_hdr))
        p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return NULL;
    m_hdr *h = p;
    *size = (size_t)st.st_size;
    int ok = h->magic == M_MAGIC && h->total_bytes == (uint64_t)st.st_size && (!gen || h->gen == gen) &&
             (!cap0 || h->rings[0].cap == cap0) && h->rings[0].off >= sizeof(m_hdr);
    CHECK(ok, "the test's mirror of the segment header matches %s", path);
    if (!ok) {
        munmap(p, *size);
        return NULL;
    }
    return h;
}

/* waits for pid up to secs: its exit code, 128+signal when a signal ended it, or -1 on timeout (then killed) */
static int wait_for(pid_t pid, double secs) {
    double t0 = now_s();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_s() - t0 > secs) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(5000);
    }
}

/* runs fn in a child process (same effective uid as now); its exit code as wait_for */
static int in_child(int (*fn)(const void *), const void *arg, double secs) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) _exit(fn(arg));
    return pid < 0 ? -2 : wait_for(pid, secs);
}

/* ------------------------------------------------------------------------------------------------------------
 * another user: cannot open or resize; squatting the names does not work */

static void test_other_user(void) {
    char name[64], sq[64], path[256];
    snprintf(name, sizeof name, "o%d", (int)getpid());
    shm_ring_spec sp[1] = {{2, 256}};
    as_user(UID_V);
    shm_group *g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(g != NULL, "victim creates a group: %s", s_err);
    if (!g) {
        as_user(0);
        return;
    }
    snprintf(path, sizeof path, "%s", shm_group_path(g));
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_uid == UID_V && (st.st_mode & 0777) == 0600, "segment %s is V's, 0600 (%o)",
          path, (unsigned)(st.st_mode & 0777));
    as_user(UID_A);
    int fd = open(path, O_RDWR);
    CHECK(fd < 0 && errno == EACCES, "another user cannot open the segment read-write");
    if (fd >= 0) close(fd);
    fd = open(path, O_RDONLY);
    CHECK(fd < 0 && errno == EACCES, "another user cannot open the segment read-only");
    if (fd >= 0) close(fd);
    CHECK(truncate(path, 0) != 0 && errno == EACCES, "another user cannot resize the segment");
    CHECK(unlink(path) != 0, "another user cannot remove the segment");
    /* A squats the next group names of V: a real group of A's (valid header, live creator), renamed to V's name
     * with mode 0666, under the old fixed name and under V's prefix with a made-up suffix */
    snprintf(sq, sizeof sq, "q%d", (int)getpid());
    char sq_a[80], sq_b[80], f_old[256], f_new[256];
    snprintf(sq_a, sizeof sq_a, "%sa", sq);
    snprintf(sq_b, sizeof sq_b, "%sb", sq);
    shm_group *qa = shm_group_create(sq_a, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    shm_group *qb = qa ? shm_group_create(sq_b, 2, sp, 1, NULL, 0, s_err, sizeof s_err) : NULL;
    CHECK(qa && qb, "attacker creates two groups of its own: %s", s_err);
    snprintf(f_old, sizeof f_old, "/dev/shm/zllm-%s", sq);
    snprintf(f_new, sizeof f_new, "/dev/shm/zllm-%s.%u.0123456789abcdef", sq, UID_V);
    int renamed = qa && qb && rename(shm_group_path(qa), f_old) == 0 && rename(shm_group_path(qb), f_new) == 0 &&
                  chmod(f_old, 0666) == 0 && chmod(f_new, 0666) == 0;
    CHECK(renamed, "attacker puts 0666 segments at %s and %s", f_old, f_new);
    uint64_t gen_b = qb ? shm_group_generation(qb) : 0;
    as_user(UID_V);
    /* a follower of V's group finds only A's files: refused, whatever they hold */
    shm_group *f = shm_group_attach(sq, 1, 300, s_err, sizeof s_err);
    CHECK(f == NULL && strstr(s_err, "refused"), "a squatted segment of another user is refused: %s",
          f ? "attached" : s_err);
    shm_group_destroy(&f);
    /* V's leader starts anyway, and its follower attaches to the leader's segment, not to a squatter's */
    shm_group *l = shm_group_create(sq, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(l != NULL, "squatted names do not stop the leader: %s", s_err);
    f = l ? shm_group_attach(sq, 1, 2000, s_err, sizeof s_err) : NULL;
    CHECK(f != NULL, "the follower attaches: %s", s_err);
    if (l && f) {
        CHECK(shm_group_generation(f) == shm_group_generation(l) && !strcmp(shm_group_path(f), shm_group_path(l)),
              "the follower attached to its leader's segment %s (not %s)", shm_group_path(l), shm_group_path(f));
        void *w;
        const void *r;
        uint64_t n = 0;
        int ok = shm_ring_reserve(l, 0, 100, &w, s_err, sizeof s_err) == 0;
        if (ok) memcpy(w, "hello", 6);
        ok = ok && shm_ring_publish(l, 0, 6, s_err, sizeof s_err) == 0 &&
             shm_ring_peek(f, 0, 100, &r, &n, s_err, sizeof s_err) == 0 && n == 6 && !memcmp(r, "hello", 6);
        CHECK(ok, "a message travels: %s", s_err);
        shm_ring_release(f, 0);
    }
    shm_group_destroy(&f);
    shm_group_destroy(&l);
    CHECK(seg_count(sq, UID_V) == 0 && access(f_new, F_OK) == 0, "V's segment removed, A's file left alone");
    as_user(0);
    size_t sz;
    m_hdr *h = s_map(f_new, &sz, gen_b, 2);
    if (h) {
        CHECK(h->members[1].pid == 0 && h->abort_word == 0, "nothing of V touched the squatter's segment");
        munmap(h, sz);
    }
    unlink(f_old);
    unlink(f_new);
    as_user(UID_A);
    shm_group_destroy(&qa);
    shm_group_destroy(&qb);
    as_user(UID_V);
    shm_group_destroy(&g);
    CHECK(seg_count(name, UID_V) == 0, "no segment left");
    as_user(0);
}

/* a segment of V's with group or other bits is refused; the same file at 0600 is accepted */
static void test_mode(void) {
    char name[64];
    snprintf(name, sizeof name, "m%d", (int)getpid());
    shm_ring_spec sp[1] = {{2, 64}};
    as_user(UID_V);
    shm_group *g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(g != NULL, "create: %s", s_err);
    if (g) {
        static const unsigned modes[] = {0640, 0604, 0660, 0666};
        for (int i = 0; i < 4; i++) {
            chmod(shm_group_path(g), modes[i]);
            shm_group *f = shm_group_attach(name, 1, 200, s_err, sizeof s_err);
            CHECK(f == NULL && strstr(s_err, "refused"), "mode %o refused: %s", modes[i], f ? "attached" : s_err);
            shm_group_destroy(&f);
        }
        chmod(shm_group_path(g), 0600);
        shm_group *f = shm_group_attach(name, 1, 1000, s_err, sizeof s_err);
        CHECK(f != NULL, "mode 600 accepted: %s", s_err);
        shm_group_destroy(&f);
        shm_group_destroy(&g);
    }
    CHECK(seg_count(name, UID_V) == 0, "no segment left");
    as_user(0);
}

/* ------------------------------------------------------------------------------------------------------------
 * a writer of the segment (the owner) rewrites the geometry or the counters */

typedef struct {
    const char *field; /* "off", "off0", "cap", "slot", "rings" */
} s_corrupt_arg;

static int s_corrupt_child(const void *argp) {
    const s_corrupt_arg *a = argp;
    char name[64];
    snprintf(name, sizeof name, "c%d", (int)getpid());
    shm_ring_spec sp[2] = {{2, 256}, {2, 64}};
    shm_group *p = shm_group_create(name, 2, sp, 2, NULL, 0, s_err, sizeof s_err);
    shm_group *c = p ? shm_group_attach(name, 1, 1000, s_err, sizeof s_err) : NULL;
    if (!p || !c) return 10;
    size_t sz;
    m_hdr *h = s_map(shm_group_path(p), &sz, shm_group_generation(p), 2);
    if (!h) return 11;
    void *w;
    const void *r;
    uint64_t n;
    if (shm_ring_reserve(p, 0, 100, &w, s_err, sizeof s_err) || (memset(w, 1, 256), 0) ||
        shm_ring_publish(p, 0, 256, s_err, sizeof s_err) || shm_ring_peek(c, 0, 100, &r, &n, s_err, sizeof s_err))
        return 12;
    shm_ring_release(c, 0);
    if (!strcmp(a->field, "off")) h->rings[0].off = h->total_bytes + 4096;
    else if (!strcmp(a->field, "off0")) h->rings[0].off = 0; /* onto the header */
    else if (!strcmp(a->field, "offbig")) h->rings[0].off = (uint64_t)1 << 45;
    else if (!strcmp(a->field, "cap")) h->rings[0].cap = 0;
    else if (!strcmp(a->field, "capbig")) h->rings[0].cap = 1u << 30;
    else if (!strcmp(a->field, "slot")) h->rings[0].slot_bytes = (uint64_t)1 << 40;
    else if (!strcmp(a->field, "rings")) h->n_rings = SHM_MAX_RINGS;
    int rc = 0;
    s_err[0] = 0;
    int pr = shm_ring_reserve(p, 0, 200, &w, s_err, sizeof s_err);
    if (pr == 0) {
        memset(w, 2, 256); /* where the shared header says the slot is */
        pr = shm_ring_publish(p, 0, 256, s_err, sizeof s_err);
    }
    if (pr != -1 || !strstr(s_err, "corrupt")) {
        fprintf(stderr, "[%s] producer: %d %s\n", a->field, pr, s_err);
        rc = 20;
    }
    s_err[0] = 0;
    int cr = shm_ring_peek(c, 0, 200, &r, &n, s_err, sizeof s_err);
    if (cr != -1 || !strstr(s_err, "corrupt")) {
        fprintf(stderr, "[%s] consumer: %d %s\n", a->field, cr, s_err);
        rc = rc ? rc : 21;
    }
    if (shm_group_check(c, s_err, sizeof s_err) != -1 || !strstr(s_err, "corrupt")) rc = rc ? rc : 22;
    munmap(h, sz);
    shm_group_destroy(&c);
    shm_group_destroy(&p);
    if (seg_count(name, (unsigned)geteuid()) != 0) rc = rc ? rc : 23;
    return rc;
}

typedef struct {
    shm_group *g;
    int ring;
    int rc;
    char err[256];
} s_waiter;

/* a consumer that waits with no time limit, as a follower does, and fails the group when its wait fails */
static void *s_peek_forever(void *arg) {
    s_waiter *w = arg;
    const void *r;
    uint64_t n;
    w->rc = shm_ring_peek(w->g, w->ring, -1, &r, &n, w->err, sizeof w->err);
    if (w->rc == 0) shm_ring_release(w->g, w->ring);
    else shm_group_abort(w->g, SHM_FAILED);
    return NULL;
}

/* a counter moved back by a writer: both sides wait without a time limit; the owner of the counter notices,
 * fails the group, and both waits end. which: "head" or "tail". */
static int s_counter_child(const void *argp) {
    const char *which = argp;
    char name[64];
    snprintf(name, sizeof name, "k%d", (int)getpid());
    shm_ring_spec sp[2] = {{1, 64}, {1, 64}};
    shm_group *p = shm_group_create(name, 2, sp, 2, NULL, 0, s_err, sizeof s_err);
    shm_group *c = p ? shm_group_attach(name, 1, 1000, s_err, sizeof s_err) : NULL;
    if (!p || !c) return 10;
    size_t sz;
    m_hdr *h = s_map(shm_group_path(p), &sz, shm_group_generation(p), 1);
    if (!h) return 11;
    void *w;
    const void *r;
    uint64_t n;
    if (shm_ring_reserve(p, 0, 100, &w, s_err, sizeof s_err) || shm_ring_publish(p, 0, 8, s_err, sizeof s_err))
        return 12;
    s_waiter cw = {c, 0, 0, ""};
    int prc;
    char perr[256] = "";
    pthread_t t;
    if (!strcmp(which, "head")) {
        /* the published slot disappears: the consumer would wait for it forever, the producer for its return */
        h->rings[0].head = 0;
        if (pthread_create(&t, NULL, s_peek_forever, &cw)) return 13;
        prc = shm_ring_peek(p, 1, -1, &r, &n, perr, sizeof perr); /* the producer owns head: it notices */
        if (prc) shm_group_abort(p, SHM_FAILED);
    } else {
        /* the slot was consumed; the released tail moves back: the ring looks full to the producer forever */
        if (shm_ring_peek(c, 0, 100, &r, &n, s_err, sizeof s_err)) return 14;
        shm_ring_release(c, 0);
        h->rings[0].tail = 0;
        if (pthread_create(&t, NULL, s_peek_forever, &cw)) return 13; /* the consumer owns tail: it notices */
        prc = shm_ring_reserve(p, 0, -1, &w, perr, sizeof perr);
        if (prc) shm_group_abort(p, SHM_FAILED);
    }
    pthread_join(t, NULL);
    int rc = 0;
    const char *owner_err = !strcmp(which, "head") ? perr : cw.err;
    if (prc != -1 || cw.rc != -1 || !strstr(owner_err, "corrupt")) {
        fprintf(stderr, "[%s] producer %d (%s), consumer %d (%s)\n", which, prc, perr, cw.rc, cw.err);
        rc = 20;
    }
    munmap(h, sz);
    shm_group_destroy(&c);
    shm_group_destroy(&p);
    if (seg_count(name, (unsigned)geteuid()) != 0) rc = rc ? rc : 23;
    return rc;
}

/* a member's record rewritten, then the member killed: the creator, waiting for work without a time limit,
 * must still see the death. which: "pid0" (the record cleared: looks not attached yet) or "pidlive" (the record
 * pointing at another live process) */
static int s_record_child(const void *argp) {
    const char *which = argp;
    char name[64];
    snprintf(name, sizeof name, "r%d", (int)getpid());
    shm_ring_spec sp[1] = {{2, 64}};
    shm_group *p = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    if (!p) return 10;
    pid_t m = fork();
    if (m == 0) {
        shm_group *c = shm_group_attach(name, 1, 5000, s_err, sizeof s_err);
        if (!c) _exit(1);
        for (;;) pause();
    }
    if (shm_group_wait_members(p, 5000, s_err, sizeof s_err)) return 11;
    size_t sz;
    m_hdr *h = s_map(shm_group_path(p), &sz, shm_group_generation(p), 2);
    if (!h) return 12;
    h->members[1].pid = !strcmp(which, "pid0") ? 0 : (uint32_t)getppid();
    kill(m, SIGKILL);
    waitpid(m, NULL, 0);
    const void *r;
    uint64_t n;
    int rc = shm_ring_peek(p, 0, -1, &r, &n, s_err, sizeof s_err);
    int ok = rc == -1 && strstr(s_err, "corrupt");
    if (!ok) fprintf(stderr, "[%s] %d %s\n", which, rc, s_err);
    munmap(h, sz);
    shm_group_destroy(&p);
    return ok ? 0 : 20;
}

static void test_corrupt(void) {
    as_user(UID_V);
    static const char *fields[] = {"off", "off0", "offbig", "cap", "capbig", "slot", "rings"};
    for (int i = 0; i < 7; i++) {
        s_corrupt_arg a = {fields[i]};
        double t0 = now_s();
        int rc = in_child(s_corrupt_child, &a, 10.0);
        CHECK(rc == 0, "rewritten ring %s: a clear error, no crash, no hang, no segment left (child %d%s) in %.2f s",
              fields[i], rc,
              rc == -1   ? ": hung"
              : rc > 128 ? ": signal"
                         : "",
              now_s() - t0);
    }
    static const char *ctr[] = {"head", "tail"};
    for (int i = 0; i < 2; i++) {
        double t0 = now_s();
        int rc = in_child(s_counter_child, ctr[i], 5.0);
        CHECK(rc == 0, "%s moved back: the waits end with an error within 5 s (child %d%s, %.2f s)", ctr[i], rc,
              rc == -1 ? ": hung" : "", now_s() - t0);
    }
    static const char *rec[] = {"pid0", "pidlive"};
    for (int i = 0; i < 2; i++) {
        double t0 = now_s();
        int rc = in_child(s_record_child, rec[i], 5.0);
        CHECK(rc == 0,
              "member record %s, member killed: the creator's wait ends with an error within 5 s (child "
              "%d%s, %.2f s)",
              rec[i], rc, rc == -1 ? ": hung" : "", now_s() - t0);
    }
    as_user(0);
}

/* ------------------------------------------------------------------------------------------------------------
 * a running 2-stage pipeline whose return ring's offset is rewritten */

static volatile uint64_t *s_steps; /* shared page: steps the leader ran */

static stage_opts s_sopts(const char *group, int stage) {
    stage_opts so;
    memset(&so, 0, sizeof so);
    so.group = group;
    so.stage = stage;
    so.n_stages = 2;
    so.threads = 1;
    so.attach_timeout_ms = 20000;
    so.dead_ms = 3000;
    return so;
}

static volatile sig_atomic_t s_stop; /* a follower's stop flag, set by SIGTERM as in zllm-worker */

static void s_on_term(int sig) {
    (void)sig;
    s_stop = 1;
}

static int s_follower_child(const void *group) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_term;
    sigaction(SIGTERM, &sa, NULL);
    zl_model *m = model_load(s_model, s_err, sizeof s_err);
    if (!m) return 2;
    stage_opts so = s_sopts(group, 1);
    int rc = stage_run_follower(m, &so, &s_stop, s_err, sizeof s_err);
    fprintf(stderr, "[follower] %s\n", rc ? s_err : "shut down");
    model_destroy(&m);
    return rc ? 3 : 0;
}

static int s_leader_exits; /* 1: the leader _exits after a failed step, without cleanup, as zllm-worker does */

static int s_leader_child(const void *group) {
    zl_model *m = model_load(s_model, s_err, sizeof s_err);
    if (!m) return 2;
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = o.max_batch = 1;
    o.n_ctx = 256;
    o.threads = 1;
    o.max_step_tokens = 16;
    stage_opts so = s_sopts(group, 0);
    zl_engine *e = stage_leader_new(m, &o, &so, s_err, sizeof s_err);
    if (!e) {
        fprintf(stderr, "[leader] %s\n", s_err);
        return 4;
    }
    int rc = 0;
    int32_t tok = 1, out = -1;
    for (int i = 0; i < 250; i++) {
        zl_seq s = {.slot = 0, .pos = i, .n_tokens = 1, .tokens = &tok, .sample = 1};
        if (engine_step(e, &s, 1, &out, NULL) != 0) {
            fprintf(stderr, "[leader] step %d: %s\n", i, e->err);
            rc = strstr(e->err, "corrupt") ? 5 : 6;
            if (s_leader_exits) _exit(rc);
            break;
        }
        tok = out;
        *s_steps = (uint64_t)i + 1;
        usleep(20000);
    }
    engine_destroy(&e);
    model_destroy(&m);
    return rc;
}

static void test_pipeline(void) {
    char group[64], path[256];
    snprintf(group, sizeof group, "p%d", (int)getpid());
    as_user(UID_V);
    *s_steps = 0;
    fflush(stdout);
    fflush(stderr);
    pid_t l = fork();
    if (l == 0) _exit(s_leader_child(group));
    pid_t f = fork();
    if (f == 0) _exit(s_follower_child(group));
    double t0 = now_s();
    while (*s_steps < 5 && now_s() - t0 < 60) usleep(10000);
    CHECK(*s_steps >= 5, "the pipeline ran %llu steps", (unsigned long long)*s_steps);
    seg_find(group, UID_V, path, sizeof path);
    size_t sz;
    m_hdr *h = path[0] ? s_map(path, &sz, 0, 4) : NULL;
    CHECK(h != NULL, "map the running group's segment %s", path);
    if (h) {
        h->rings[2].off = h->total_bytes + ((uint64_t)1 << 30); /* the return ring, written by stage 1 */
        munmap(h, sz);
    }
    t0 = now_s();
    int rf = wait_for(f, 10.0), rl = wait_for(l, 10.0);
    CHECK(rf == 3, "stage 1 exits 3 after the rewrite, not by a signal or a hang (%d)", rf);
    CHECK(rl == 5 || rl == 6, "the leader's step fails, not by a signal or a hang (%d)", rl);
    printf("pipeline: rewritten return ring offset: both stages down in %.2f s\n", now_s() - t0);
    CHECK(seg_count(group, UID_V) == 0, "no segment left after the failed group");
    as_user(0);
}

/* SIGTERM of a follower (zllm-worker's handler sets the stop flag) fails the group; the leader _exits after
 * its failed step without cleanup, as zllm-worker does: no segment is left */
static void test_signal(void) {
    char group[64];
    snprintf(group, sizeof group, "g%d", (int)getpid());
    as_user(UID_V);
    *s_steps = 0;
    s_leader_exits = 1;
    fflush(stdout);
    fflush(stderr);
    pid_t l = fork();
    if (l == 0) _exit(s_leader_child(group));
    pid_t f = fork();
    if (f == 0) _exit(s_follower_child(group));
    double t0 = now_s();
    while (*s_steps < 5 && now_s() - t0 < 60) usleep(10000);
    CHECK(*s_steps >= 5, "the pipeline ran %llu steps", (unsigned long long)*s_steps);
    kill(f, SIGTERM);
    int rf = wait_for(f, 10.0), rl = wait_for(l, 10.0);
    CHECK(rf == 3 && rl == 6, "SIGTERM of the follower: it exits 3 (%d), the leader's step fails (%d)", rf, rl);
    CHECK(seg_count(group, UID_V) == 0, "SIGTERM of the follower, leader gone without cleanup: no segment left");
    s_leader_exits = 0;
    as_user(0);
}

/* ------------------------------------------------------------------------------------------------------------
 * stale segments and failure paths */

static int s_create_and_vanish(const void *name) {
    shm_ring_spec sp[1] = {{2, 64}};
    shm_group *g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    return g ? 0 : 1; /* exits without destroy: its segment stays, its creator is gone */
}

static int s_leader_waits(const void *name) {
    shm_ring_spec sp[1] = {{2, 64}};
    shm_group *g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    if (!g) return 1;
    shm_group_wait_members(g, 20000, s_err, sizeof s_err);
    const void *r;
    uint64_t n;
    shm_ring_peek(g, 0, 20000, &r, &n, s_err, sizeof s_err);
    shm_group_destroy(&g);
    return 0;
}

static int s_leader_fails_and_exits(const void *name) {
    shm_ring_spec sp[1] = {{2, 64}};
    shm_group *g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    if (!g || shm_group_wait_members(g, 20000, s_err, sizeof s_err)) return 1;
    usleep(100000);
    shm_group_abort(g, SHM_FAILED);
    _exit(3); /* as the worker after a failed step: no cleanup */
}

static int s_member(const void *name) {
    shm_group *g = shm_group_attach(name, 1, 20000, s_err, sizeof s_err);
    if (!g) return 1;
    const void *r;
    uint64_t n;
    int rc;
    while ((rc = shm_ring_peek(g, 0, 200, &r, &n, s_err, sizeof s_err)) == 1)
        ;
    shm_group_destroy(&g);
    return rc == -1 ? 7 : 0;
}

static void test_cleanup(void) {
    char name[64], other[64];
    snprintf(name, sizeof name, "s%d", (int)getpid());
    snprintf(other, sizeof other, "s%dx", (int)getpid());
    as_user(UID_V);
    /* stale: a creator that died without cleaning up */
    CHECK(in_child(s_create_and_vanish, name, 10.0) == 0 && seg_count(name, UID_V) == 1,
          "a dead creator's segment is left behind");
    shm_ring_spec sp[1] = {{2, 64}};
    shm_group *g = shm_group_create(other, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(g != NULL, "create: %s", s_err);
    CHECK(seg_count(name, UID_V) == 0, "the next creator (another group) removed the dead creator's segment");
    /* a live creator's segment of another group is kept */
    pid_t l = fork();
    if (l == 0) _exit(s_leader_waits(name));
    double t0 = now_s();
    while (seg_count(name, UID_V) == 0 && now_s() - t0 < 5) usleep(5000);
    shm_group_destroy(&g);
    g = shm_group_create(other, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(g && seg_count(name, UID_V) == 1, "a live creator's segment is kept by the sweep");
    shm_group_destroy(&g);
    /* leader killed: its member leaves and removes the segment */
    pid_t m = fork();
    if (m == 0) _exit(s_member(name));
    usleep(300000);
    kill(l, SIGKILL);
    waitpid(l, NULL, 0);
    int rm = wait_for(m, 5.0);
    CHECK(rm == 7, "member of a killed leader fails (%d)", rm);
    CHECK(seg_count(name, UID_V) == 0, "leader killed: no segment left");
    /* the group fails and its leader exits without cleanup */
    l = fork();
    if (l == 0) _exit(s_leader_fails_and_exits(name));
    m = fork();
    if (m == 0) _exit(s_member(name));
    int rl = wait_for(l, 10.0);
    rm = wait_for(m, 10.0);
    CHECK(rl == 3 && rm == 7, "failed group: leader %d, member %d", rl, rm);
    CHECK(seg_count(name, UID_V) == 0, "failed group, leader gone without cleanup: no segment left");
    /* member killed: the leader's wait fails, it removes the segment */
    l = fork();
    if (l == 0) _exit(s_leader_waits(name));
    m = fork();
    if (m == 0) _exit(s_member(name));
    usleep(500000);
    kill(m, SIGKILL);
    waitpid(m, NULL, 0);
    rl = wait_for(l, 5.0);
    CHECK(rl == 0, "leader of a killed member ends its wait (%d)", rl);
    CHECK(seg_count(name, UID_V) == 0, "member killed: no segment left");
    /* nobody comes */
    g = shm_group_create(name, 2, sp, 1, NULL, 0, s_err, sizeof s_err);
    CHECK(g && shm_group_wait_members(g, 100, s_err, sizeof s_err) == -1, "members that never come: %s", s_err);
    shm_group_destroy(&g);
    CHECK(seg_count(name, UID_V) == 0, "members never came: no segment left");
    CHECK(shm_group_attach(name, 1, 100, s_err, sizeof s_err) == NULL && seg_count(name, UID_V) == 0,
          "a follower without a leader times out and creates nothing");
    as_user(0);
}

/* copies src to dst; 0 or -1 */
static int s_copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    char buf[65536];
    size_t n;
    int rc = in && out ? 0 : -1;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = -1;
    if (in) fclose(in);
    if (out && fclose(out) != 0) rc = -1;
    return rc;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    CHECK(getuid() == 0, "runs as root, to play two other users (CI runs as root)");
    if (getuid() != 0) return test_report();
    if (setgroups(0, NULL) != 0) CHECK(0, "setgroups: %s", strerror(errno));
    /* the stages run as the victim's uid, which cannot enter root's cache: a world-readable copy */
    char src[1024], dir[] = "/tmp/zllm-test-shm.XXXXXX";
    snprintf(src, sizeof src, "%s/stories260K/stories260K.gguf", test_fixtures());
    CHECK(access(src, R_OK) == 0, "model %s", src);
    CHECK(mkdtemp(dir) != NULL && chmod(dir, 0755) == 0, "model directory %s", dir);
    snprintf(s_model, sizeof s_model, "%s/stories260K.gguf", dir);
    CHECK(s_copy_file(src, s_model) == 0 && chmod(s_model, 0644) == 0, "copy %s to %s", src, s_model);
    void *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED, "shared page");
    if (shared == MAP_FAILED) return test_report();
    s_steps = shared;
    test_other_user();
    test_mode();
    test_corrupt();
    test_cleanup();
    test_pipeline();
    test_signal();
    munmap(shared, 4096);
    unlink(s_model);
    rmdir(dir);
    return test_report();
}
