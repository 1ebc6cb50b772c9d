/* worker/phase_times.h: where the worker's host time goes, per engine step and per phase of its loop
 * (zllm-worker --phase-times 1; docs/structured-output.md "Where a step's host time goes").
 *
 * Each step the worker runs adds one sample per phase (microseconds), in one of two groups: steps that hold a
 * sequence with a grammar and steps that hold none, so that one worker serving both kinds of requests shows
 * their difference. Samples go into a histogram per phase and group (1 us buckets below 4 ms, 256 us buckets
 * up to about 266 ms, the rest in the last one), which gives the mean, the 99th percentile and the maximum
 * without storing the samples. Not thread-safe: the worker's loop thread owns it. */
#ifndef ZLLM_PHASE_TIMES_H
#define ZLLM_PHASE_TIMES_H
#include <stddef.h>
#include <stdint.h>

/* the phases, in the order of a step's critical path; batcher.c and the worker's loop fill them */
enum {
    /* the host blocked on the device for the collected step (engine_wait; a synchronous engine: the whole step) */
    WK_PH_DEVICE,
    WK_PH_ACCEPT, /* the grammars take the collected tokens (matcher accepts) */
    WK_PH_APPLY,  /* the rest of applying the collected step: positions, finishes, events */
    /* masks of the steps built, and the late masks of the step in flight: the caller's share of computing them,
     * the wait for the mask threads and the announcement */
    WK_PH_MASKS,
    WK_PH_BUILD,  /* building the next step's entries (masks excluded) */
    WK_PH_LAUNCH, /* engine_launch of a queued step (steps queued ahead, lanes) */
    /* the host's critical path: from the end of the wait for step n to the launch of the step that fills the
     * queue again (steps queued ahead: n + 2); synchronous steps: from the end of step n to the start of n + 1 */
    WK_PH_GAP,
    WK_PH_OUT,  /* events into the `out` message and its send */
    WK_PH_IO,   /* the rest of the loop's turn: poll, reading the broker's messages, heartbeats */
    WK_PH_LOOP, /* one whole turn of the loop (the step period seen by the host) */
    WK_PH_GPU,  /* device time of the collected step (CUDA events around it; absent elsewhere) */
    WK_PH_N
};

typedef struct wk_phase_times wk_phase_times;

wk_phase_times *phase_times_new(void);         /* NULL when out of memory */
void phase_times_destroy(wk_phase_times **pt); /* idempotent; sets *pt to NULL */
void phase_times_reset(wk_phase_times *pt);    /* forgets every sample and step */
/* adds one sample of phase (WK_PH_*) in group grammar (0: steps without grammars, 1: with); a negative us
 * (a phase that did not happen this step) is not counted */
void phase_times_add(wk_phase_times *pt, int grammar, int phase, double us);
/* counts one step of group grammar that ran tokens tokens, prompt of them prompt tokens (a step with prompt
 * tokens is a mixed step: on CUDA it runs eagerly, not as a captured graph) */
void phase_times_step(wk_phase_times *pt, int grammar, int tokens, int prompt);
uint64_t phase_times_count(const wk_phase_times *pt, int grammar, int phase); /* samples of that phase */
double phase_times_mean(const wk_phase_times *pt, int grammar, int phase);    /* us; 0 without samples */
/* us below which a fraction q (0..1) of the samples lie, at the buckets' resolution; 0 without samples */
double phase_times_quantile(const wk_phase_times *pt, int grammar, int phase, double q);
/* one line for group grammar: "phase times, steps with grammars: 1234 steps (63.2 tokens, 1.5 prompt tokens per
 * step, 12.0% with prompt tokens); mean/p99 us: device 812.0/950 ..." (mean/p99 of every phase with samples);
 * returns the length written (truncated to len) */
size_t phase_times_format(const wk_phase_times *pt, int grammar, char *buf, size_t len);
const char *phase_times_name(int phase); /* "device", "accept", ... */
double phase_times_now_us(void);         /* CLOCK_MONOTONIC in microseconds */
#endif
