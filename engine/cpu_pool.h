/* engine/cpu_pool.h: a small persistent thread pool for the CPU engine. cpu_pool_run(fn) calls fn(ctx, ith, nth)
 * on every thread (the caller is thread 0) and returns when all have returned. One caller at a time. */
#ifndef ZLLM_CPU_POOL_H
#define ZLLM_CPU_POOL_H

typedef void (*cpu_pool_fn)(void *ctx, int ith, int nth);
typedef struct cpu_pool cpu_pool;

/* n_threads >= 1 (the caller counts as one). Returns NULL with a message in err when a thread cannot start. */
cpu_pool *cpu_pool_new(int n_threads, char *err, size_t errlen);
/* runs fn on all threads and waits for them */
void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx);
int cpu_pool_threads(const cpu_pool *p);
/* joins the workers; idempotent; sets *p to NULL */
void cpu_pool_destroy(cpu_pool **p);
#endif
