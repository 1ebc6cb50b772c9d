/* tests/test.h: a whole test framework in a few macros (after Redis's testhelp.h).
 * Each test program ends with `return test_report();`, which prints the closing line
 * "N passed, N failed" that tests/run.sh adds up, and returns non-zero on any failure. */
#ifndef ZLLM_TEST_H
#define ZLLM_TEST_H
#include <stdio.h>
#include <stdlib.h>

static int s_test_passed, s_test_failed;

/* CHECK(cond, fmt, ...): one assertion; prints a FAIL line with file:line and the message when false. */
#define CHECK(cond, ...) do { \
    if (cond) { s_test_passed++; } \
    else { s_test_failed++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* fixtures root: $ZLLM_FIXTURES, default ../shared/fixtures (relative to the repository root) */
static inline const char *test_fixtures(void) {
    const char *f = getenv("ZLLM_FIXTURES");
    return f && *f ? f : "../shared/fixtures";
}

static inline int test_report(void) {
    printf("%d passed, %d failed\n", s_test_passed, s_test_failed);
    return s_test_failed ? 1 : 0;
}
#endif
