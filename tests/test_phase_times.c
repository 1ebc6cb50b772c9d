/* tests/test_phase_times.c: worker/phase_times.c, the per-phase step timings of zllm-worker --phase-times: means,
 * percentiles at the histogram's resolution, the two groups kept apart, phases that did not happen left out, and
 * the log line. */
#include <math.h>
#include <string.h>
#include "phase_times.h"
#include "test.h"

int main(void) {
    wk_phase_times *pt = phase_times_new();
    CHECK(pt != NULL, "phase_times_new");
    if (!pt) return test_report();
    /* 1..100 us in the grammar group's masks: mean 50.5, p99 99 (1 us buckets), p50 50 */
    for (int i = 1; i <= 100; i++) phase_times_add(pt, 1, WK_PH_MASKS, i - 0.5);
    CHECK(phase_times_count(pt, 1, WK_PH_MASKS) == 100, "count %llu",
          (unsigned long long)phase_times_count(pt, 1, WK_PH_MASKS));
    CHECK(fabs(phase_times_mean(pt, 1, WK_PH_MASKS) - 50.0) < 1e-9, "mean %f", phase_times_mean(pt, 1, WK_PH_MASKS));
    CHECK(fabs(phase_times_quantile(pt, 1, WK_PH_MASKS, 0.99) - 99.5) < 1e-9, "p99 %f",
          phase_times_quantile(pt, 1, WK_PH_MASKS, 0.99));
    CHECK(fabs(phase_times_quantile(pt, 1, WK_PH_MASKS, 0.5) - 51) < 1e-9, "p50 %f",
          phase_times_quantile(pt, 1, WK_PH_MASKS, 0.5));
    /* the other group and other phases are untouched */
    CHECK(phase_times_count(pt, 0, WK_PH_MASKS) == 0, "group without grammars untouched");
    CHECK(phase_times_mean(pt, 0, WK_PH_MASKS) == 0 && phase_times_quantile(pt, 0, WK_PH_MASKS, 0.99) == 0,
          "no samples: 0");
    /* a phase that did not happen (negative) is not counted */
    phase_times_add(pt, 0, WK_PH_LAUNCH, -1);
    CHECK(phase_times_count(pt, 0, WK_PH_LAUNCH) == 0, "negative sample ignored");
    /* long samples: coarse buckets, never above the largest sample; beyond the last bucket, the maximum */
    for (int i = 0; i < 99; i++) phase_times_add(pt, 0, WK_PH_DEVICE, 10);
    phase_times_add(pt, 0, WK_PH_DEVICE, 10000);
    CHECK(phase_times_quantile(pt, 0, WK_PH_DEVICE, 0.99) == 10000, "p99 of one long sample in 100: %f",
          phase_times_quantile(pt, 0, WK_PH_DEVICE, 0.99));
    CHECK(phase_times_quantile(pt, 0, WK_PH_DEVICE, 0.5) == 11, "p50 %f",
          phase_times_quantile(pt, 0, WK_PH_DEVICE, 0.5));
    phase_times_add(pt, 0, WK_PH_GAP, 5e6);
    CHECK(phase_times_quantile(pt, 0, WK_PH_GAP, 0.99) == 5e6, "overflow bucket gives the maximum");
    /* the log line names the group, the steps and each phase with samples */
    phase_times_add(pt, 1, WK_PH_LOOP, 1200);
    phase_times_step(pt, 1, 64, 32);
    phase_times_step(pt, 1, 64, 0);
    char line[1024];
    size_t n = phase_times_format(pt, 1, line, sizeof line);
    CHECK(n == strlen(line) && n > 0, "length %zu", n);
    CHECK(strstr(line, "steps with grammars: 2 steps (64.0 tokens, 16.0 prompt tokens per step, 50.0% with prompt") !=
              NULL,
          "%s", line);
    CHECK(strstr(line, " masks 50.0/100") && strstr(line, " loop 1200.0/1200") && !strstr(line, " device "), "%s",
          line);
    phase_times_format(pt, 0, line, sizeof line);
    CHECK(strstr(line, "steps without grammars: 0 steps") && strstr(line, " device 109.9/10000") &&
              !strstr(line, "masks"),
          "%s", line);
    /* truncation keeps a terminated string */
    char small[16];
    n = phase_times_format(pt, 1, small, sizeof small);
    CHECK(n == strlen(small) && n == sizeof small - 1, "truncated to %zu", n);
    CHECK(strcmp(phase_times_name(WK_PH_GAP), "gap") == 0 && strcmp(phase_times_name(WK_PH_N), "?") == 0, "names");
    phase_times_destroy(&pt);
    CHECK(pt == NULL, "destroy clears");
    phase_times_destroy(&pt);
    return test_report();
}
