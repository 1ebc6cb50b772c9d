/* tests/test_bk_route.c: the broker's cache-aware routing pieces (broker/bk_route.h): the worker summary (a report
 * replaces the previous one, routed prompts count for BK_ROUTE_PENDING_MS, leading-prefix matching, the bounds on
 * what a worker can make the broker hold) and bk_route_pick's rules (longest prefix, ties by load, the slack that
 * gives way to load, most free slots without any prefix, waiting for a full worker). */
#include "test.h"
#include "bk_route.h"
#include "proto.h"

static void test_summary(void) {
    bk_summary *s = bk_summary_new();
    CHECK(s != NULL, "summary");
    if (!s) return;
    uint64_t a[4] = {11, 12, 13, 14}, b[3] = {21, 22, 23};
    CHECK(bk_summary_match(s, a, 4, 0) == 0 && bk_summary_size(s) == 0, "empty");
    bk_summary_report(s, a, 3, 0);
    CHECK(bk_summary_match(s, a, 4, 0) == 3, "reported prefix of 3");
    uint64_t gap[3] = {11, 99, 13};
    CHECK(bk_summary_match(s, gap, 3, 0) == 1, "matching stops at the first missing block");
    bk_summary_note(s, b, 3, 1000);
    CHECK(bk_summary_match(s, b, 3, 1500) == 3, "a routed prompt counts at once");
    CHECK(bk_summary_match(s, b, 3, 1000 + BK_ROUTE_PENDING_MS + 1) == 0, "and stops counting after the window");
    bk_summary_report(s, a + 1, 2, 1200); /* a report replaces: 11 is gone, the routed b stays (young) */
    CHECK(bk_summary_match(s, a, 4, 1200) == 0 && bk_summary_match(s, a + 1, 3, 1200) == 2, "a report replaces");
    CHECK(bk_summary_match(s, b, 3, 1300) == 3, "routed hashes survive a report within the window");
    bk_summary_report(s, NULL, 0, 1000 + BK_ROUTE_PENDING_MS + 1);
    CHECK(bk_summary_size(s) == 0, "an empty report after the window clears everything");
    /* bounds: a report is clamped to PROTO_MAX_KV_HASHES, routed hashes to BK_ROUTE_PENDING_MAX */
    static uint64_t many[PROTO_MAX_KV_HASHES + 100];
    for (int i = 0; i < PROTO_MAX_KV_HASHES + 100; i++) many[i] = 1000 + (uint64_t)i;
    bk_summary_report(s, many, PROTO_MAX_KV_HASHES + 100, 0);
    CHECK(bk_summary_size(s) == PROTO_MAX_KV_HASHES, "a report holds at most %d (%u)", PROTO_MAX_KV_HASHES,
          bk_summary_size(s));
    for (int i = 0; i < PROTO_MAX_KV_HASHES + 100; i++) many[i] = 900000 + (uint64_t)i;
    bk_summary_note(s, many, PROTO_MAX_KV_HASHES + 100, 1);
    CHECK(bk_summary_size(s) == PROTO_MAX_KV_HASHES + BK_ROUTE_PENDING_MAX, "routed hashes bounded too (%u)",
          bk_summary_size(s));
    uint64_t dup[3] = {5, 5, 5};
    bk_summary_report(s, dup, 3, 1e6); /* the routed ones have expired by then */
    CHECK(bk_summary_size(s) == 1, "duplicates count once");
    bk_summary_destroy(&s);
    CHECK(s == NULL, "destroy clears");
    bk_summary_destroy(&s);
}

static void test_pick(void) {
    int bal;
    /* fits, load, free, match */
    bk_cand c1[3] = {{1, 2, 6, 0}, {1, 3, 5, 10}, {1, 1, 7, 4}};
    CHECK(bk_route_pick(c1, 3, 4, &bal) == 1 && !bal, "longest prefix wins within the slack");
    CHECK(bk_route_pick(c1, 3, 1, &bal) == 2 && bal, "beyond the slack: the longest prefix near the least load");
    bk_cand c2[2] = {{1, 5, 3, 0}, {1, 2, 6, 0}};
    CHECK(bk_route_pick(c2, 2, 4, &bal) == 1, "no prefix anywhere: most free slots");
    bk_cand c3[2] = {{1, 8, 0, 9}, {1, 6, 2, 0}};
    CHECK(bk_route_pick(c3, 2, 4, &bal) == -1, "the longest prefix's worker is full and within the slack: wait");
    CHECK(bk_route_pick(c3, 2, 1, &bal) == 1 && bal, "beyond the slack: the free one");
    bk_cand c4[2] = {{0, 0, 8, 9}, {1, 0, 8, 3}};
    CHECK(bk_route_pick(c4, 2, 4, &bal) == 1, "a worker whose context does not fit is never picked");
    bk_cand c5[2] = {{1, 4, 4, 5}, {1, 2, 6, 5}};
    CHECK(bk_route_pick(c5, 2, 4, &bal) == 1, "equal prefixes: the lower load");
    bk_cand c6[1] = {{0, 0, 8, 0}};
    CHECK(bk_route_pick(c6, 1, 4, &bal) == -1 && bk_route_pick(c6, 0, 4, &bal) == -1, "nothing fits");
    bk_cand c7[2] = {{1, 0, 8, 2}, {1, 0x7fffffff, 0, 9}};
    CHECK(bk_route_pick(c7, 2, 0x7fffffff, &bal) == -1, "no overflow with a huge slack");
}

int main(void) {
    test_summary();
    test_pick();
    return test_report();
}
