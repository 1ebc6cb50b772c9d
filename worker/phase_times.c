/* worker/phase_times.c: per-phase host timings of the worker's steps (see phase_times.h). */
#include "phase_times.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S_FINE 4096   /* 1 us buckets [0, 4096) */
#define S_COARSE 1024 /* then 256 us buckets: up to 4096 + 1024 * 256 us; the last one takes everything above */
#define S_STEP 256
#define S_BUCKETS (S_FINE + S_COARSE)

typedef struct {
    uint32_t bucket[S_BUCKETS];
    uint64_t n;
    double sum, max;
} s_hist;

struct wk_phase_times {
    s_hist h[2][WK_PH_N];
    uint64_t steps[2], tokens[2], prompt[2], mixed[2]; /* phase_times_step's sums per group */
};

static const char *const s_names[WK_PH_N] = {"device", "accept", "apply", "masks", "build", "launch",
                                             "gap",    "out",    "io",    "loop",  "gpu"};

wk_phase_times *phase_times_new(void) { return calloc(1, sizeof(wk_phase_times)); }

void phase_times_destroy(wk_phase_times **pt) {
    if (!pt) return;
    free(*pt);
    *pt = NULL;
}

void phase_times_reset(wk_phase_times *pt) {
    if (pt) memset(pt, 0, sizeof *pt);
}

static s_hist *s_get(const wk_phase_times *pt, int grammar, int phase) {
    if (!pt || phase < 0 || phase >= WK_PH_N) return NULL;
    return (s_hist *)&pt->h[grammar != 0][phase];
}

void phase_times_add(wk_phase_times *pt, int grammar, int phase, double us) {
    s_hist *h = s_get(pt, grammar, phase);
    if (!h || !(us >= 0)) return;
    double k = us < S_FINE ? us : S_FINE + (us - S_FINE) / S_STEP;
    int b = k < S_BUCKETS - 1 ? (int)k : S_BUCKETS - 1;
    if (h->bucket[b] < UINT32_MAX) h->bucket[b]++;
    h->n++;
    h->sum += us;
    if (us > h->max) h->max = us;
}

void phase_times_step(wk_phase_times *pt, int grammar, int tokens, int prompt) {
    if (!pt) return;
    const int g = grammar != 0;
    pt->steps[g]++;
    pt->tokens[g] += tokens > 0 ? (uint64_t)tokens : 0;
    pt->prompt[g] += prompt > 0 ? (uint64_t)prompt : 0;
    pt->mixed[g] += prompt > 0;
}

uint64_t phase_times_count(const wk_phase_times *pt, int grammar, int phase) {
    const s_hist *h = s_get(pt, grammar, phase);
    return h ? h->n : 0;
}

double phase_times_mean(const wk_phase_times *pt, int grammar, int phase) {
    const s_hist *h = s_get(pt, grammar, phase);
    return h && h->n ? h->sum / (double)h->n : 0;
}

double phase_times_quantile(const wk_phase_times *pt, int grammar, int phase, double q) {
    const s_hist *h = s_get(pt, grammar, phase);
    if (!h || !h->n) return 0;
    uint64_t want = (uint64_t)(q * (double)h->n), seen = 0;
    if (want >= h->n) want = h->n - 1;
    for (int b = 0; b < S_BUCKETS; b++) {
        seen += h->bucket[b];
        if (seen > want) { /* the bucket's upper edge, never above the largest sample */
            double top = b < S_FINE ? b + 1 : S_FINE + (double)(b - S_FINE + 1) * S_STEP;
            return b == S_BUCKETS - 1 || top > h->max ? h->max : top;
        }
    }
    return h->max;
}

size_t phase_times_format(const wk_phase_times *pt, int grammar, char *buf, size_t len) {
    if (!buf || !len) return 0;
    const int g = grammar != 0;
    const double n = pt && pt->steps[g] ? (double)pt->steps[g] : 1;
    size_t off = (size_t)snprintf(
        buf, len,
        "phase times, steps %s grammars: %llu steps (%.1f tokens, %.1f prompt tokens per step, %.1f%% with prompt "
        "tokens); mean/p99 us:",
        g ? "with" : "without", (unsigned long long)(pt ? pt->steps[g] : 0), pt ? (double)pt->tokens[g] / n : 0,
        pt ? (double)pt->prompt[g] / n : 0, pt ? 100.0 * (double)pt->mixed[g] / n : 0);
    for (int p = 0; p < WK_PH_N && off < len; p++) {
        if (!phase_times_count(pt, grammar, p)) continue;
        off += (size_t)snprintf(buf + off, len - off, " %s %.1f/%.0f", s_names[p], phase_times_mean(pt, grammar, p),
                                phase_times_quantile(pt, grammar, p, 0.99));
    }
    return off < len ? off : len - 1;
}

const char *phase_times_name(int phase) { return phase >= 0 && phase < WK_PH_N ? s_names[phase] : "?"; }

double phase_times_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}
