/* tests/test.h: a whole test framework in a few macros (after Redis's testhelp.h).
 * Each test program ends with `return test_report();`, which prints the closing line
 * "N passed, N failed" that tests/run.sh adds up, and returns non-zero on any failure. */
#ifndef ZLLM_TEST_H
#define ZLLM_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int s_test_passed, s_test_failed;

/* CHECK(cond, fmt, ...): one assertion; prints a FAIL line with file:line and the message when false. */
#define CHECK(cond, ...) do { \
    if (cond) { s_test_passed++; } \
    else { s_test_failed++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* fixtures root: $ZLLM_FIXTURES, else the folder that tests/fetch-fixtures.sh assembles and prints (run from the
 * repository root, as tests/run.sh does); that folder is then exported as $ZLLM_FIXTURES for the processes the test
 * starts. Where the script cannot even print a folder, the path names the script, so every open fails loudly. */
static inline const char *test_fixtures(void) {
    static char s_dir[1024];
    const char *f = getenv("ZLLM_FIXTURES");
    if (f && *f) return f;
    if (!s_dir[0]) {
        FILE *p = popen("bash tests/fetch-fixtures.sh", "r");
        if (p) {
            if (!fgets(s_dir, sizeof s_dir, p)) s_dir[0] = 0;
            pclose(p);
        }
        s_dir[strcspn(s_dir, "\n")] = 0;
        if (!s_dir[0]) snprintf(s_dir, sizeof s_dir, "(tests/fetch-fixtures.sh failed)");
        setenv("ZLLM_FIXTURES", s_dir, 1);
    }
    return s_dir;
}

static inline int test_report(void) {
    printf("%d passed, %d failed\n", s_test_passed, s_test_failed);
    return s_test_failed ? 1 : 0;
}
#endif
