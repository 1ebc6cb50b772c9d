/* tests/test_cpu_pool.c: engine/cpu_pool.c. cpu_pool_run calls the job once on every thread with its index;
 * cpu_pool_start leaves the caller free (its index 0 runs only at cpu_pool_join) while the workers run theirs;
 * jobs that take entries in turn from a shared counter cover every entry once; one thread runs everything on the
 * caller. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include "cpu_pool.h"
#include "test.h"

#define N_ENTRIES 1000
typedef struct {
    atomic_int calls[8];        /* per thread index */
    atomic_int nth_bad;         /* calls whose nth was not the pool's */
    int nth;                    /* expected nth */
    atomic_int next;            /* entries taken in turn */
    atomic_int done[N_ENTRIES]; /* times each entry was done */
} s_job;

static void s_fn(void *ctx, int ith, int nth) {
    s_job *j = ctx;
    if (ith >= 0 && ith < 8) atomic_fetch_add(&j->calls[ith], 1);
    if (nth != j->nth) atomic_fetch_add(&j->nth_bad, 1);
    for (int k; (k = atomic_fetch_add(&j->next, 1)) < N_ENTRIES;) atomic_fetch_add(&j->done[k], 1);
}

static void s_check(s_job *j, int n, const char *what) {
    int once = 1, all = 1;
    for (int i = 0; i < n; i++) once &= atomic_load(&j->calls[i]) == 1;
    for (int k = 0; k < N_ENTRIES; k++) all &= atomic_load(&j->done[k]) == 1;
    CHECK(once && atomic_load(&j->nth_bad) == 0, "%s, %d threads: every index called once with nth %d", what, n, n);
    CHECK(all, "%s, %d threads: every entry done once", what, n);
}

int main(void) {
    char err[128];
    for (int n = 1; n <= 4; n++) {
        cpu_pool *p = cpu_pool_new(n, err, sizeof err);
        CHECK(p != NULL && cpu_pool_threads(p) == n, "cpu_pool_new(%d): %s", n, p ? "" : err);
        if (!p) continue;
        static s_job j;
        for (int round = 0; round < 50; round++) {
            memset(&j, 0, sizeof j);
            j.nth = n;
            cpu_pool_run(p, s_fn, &j);
            s_check(&j, n, "run");
            memset(&j, 0, sizeof j);
            j.nth = n;
            cpu_pool_start(p, s_fn, &j);
            if (round == 0) {
                /* the workers run meanwhile (waited for up to 2 s); the caller's index waits for the join */
                for (int t = 0; n > 1 && t < 200 && atomic_load(&j.calls[1]) == 0; t++) usleep(10000);
                CHECK(atomic_load(&j.calls[0]) == 0, "start: index 0 not run before the join (%d threads)", n);
                if (n > 1) CHECK(atomic_load(&j.calls[1]) == 1, "start: the workers run before the join");
            }
            cpu_pool_join(p);
            s_check(&j, n, "start/join");
        }
        cpu_pool_destroy(&p);
        CHECK(p == NULL, "destroy clears");
    }
    return test_report();
}
