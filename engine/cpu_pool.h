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
/* cpu_pool_run in two halves, so that the caller works on something else meanwhile: cpu_pool_start starts fn on
 * the workers (ith 1..n-1) and returns at once; cpu_pool_join runs the caller's part (ith 0) and waits for the
 * workers. Every start is followed by one join before any other call on the pool (destroy included). */
void cpu_pool_start(cpu_pool *p, cpu_pool_fn fn, void *ctx);
void cpu_pool_join(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* joins the workers; idempotent; sets *p to NULL */
void cpu_pool_destroy(cpu_pool **p);
#endif
