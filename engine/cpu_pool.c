/* engine/cpu_pool.c: the CPU engine's thread pool. Workers wait on a generation counter; a job is a function
 * pointer and its argument, run by every thread with its index. A step runs a few hundred jobs, so a worker
 * spins briefly on the generation before it sleeps on the condition variable. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include "cpu_pool.h"

#define S_MAX_THREADS 64
#define S_SPIN 20000 /* polls of the generation before a worker sleeps */

typedef struct {
    cpu_pool *pool; /* owner */
    int ith;        /* this worker's index, >= 1 */
} s_arg;

struct cpu_pool {
    pthread_mutex_t mu; /* guards sleeping and waking */
    pthread_cond_t go;  /* signalled when gen advances or quit is set */
    int n_threads;      /* including the caller */
    int n_started;      /* workers created */
    pthread_t tids[S_MAX_THREADS];
    s_arg args[S_MAX_THREADS];
    cpu_pool_fn fn;     /* current job (written before gen advances) */
    void *ctx;          /* its argument */
    atomic_uint gen;    /* job generation */
    atomic_int pending; /* workers still running the current job */
    atomic_int quit;    /* 1: workers exit */
};

static void *s_worker(void *arg) {
    s_arg *a = arg;
    cpu_pool *p = a->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < S_SPIN && !atomic_load(&p->quit); i++) {
            if (i > 64) sched_yield(); /* cores are shared: give the time slice away while waiting */
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && (g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->go, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        p->fn(p->ctx, a->ith, p->n_threads);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

cpu_pool *cpu_pool_new(int n_threads, char *err, size_t errlen) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > S_MAX_THREADS) n_threads = S_MAX_THREADS;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "cpu pool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    p->n_threads = n_threads;
    for (int i = 1; i < n_threads; i++) {
        p->args[i].pool = p;
        p->args[i].ith = i;
        if (pthread_create(&p->tids[i - 1], NULL, s_worker, &p->args[i]) != 0) {
            snprintf(err, errlen, "cpu pool: cannot start thread %d", i);
            cpu_pool_destroy(&p);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

int cpu_pool_threads(const cpu_pool *p) { return p->n_threads; }

void cpu_pool_start(cpu_pool *p, cpu_pool_fn fn, void *ctx) {
    p->fn = fn;
    p->ctx = ctx;
    if (p->n_threads <= 1) return;
    atomic_store(&p->pending, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
}

void cpu_pool_join(cpu_pool *p) {
    p->fn(p->ctx, 0, p->n_threads);
    for (int i = 0; p->n_threads > 1 && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++)
        if (i > 64) sched_yield();
}

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx) {
    cpu_pool_start(p, fn, ctx);
    cpu_pool_join(p);
}

void cpu_pool_destroy(cpu_pool **pp) {
    if (!pp || !*pp) return;
    cpu_pool *p = *pp;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    free(p);
    *pp = NULL;
}
