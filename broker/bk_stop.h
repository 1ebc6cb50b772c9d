/* broker/bk_stop.h: stop-string matching over streamed text, holding back text that could be the start of a
 * stop string so that a client never sees text past the stop. */
#ifndef ZLLM_BK_STOP_H
#define ZLLM_BK_STOP_H
#include <stddef.h>
#include <stdint.h>

#define BK_MAX_STOP 8

typedef struct {
    const char *s[BK_MAX_STOP];  /* stop strings (not NUL-terminated), each 1..256 bytes */
    uint32_t n[BK_MAX_STOP];     /* byte lengths */
    int count;                   /* 0..BK_MAX_STOP */
    uint32_t max_len;            /* longest n[] */
} bk_stops;

/* Earliest occurrence of any stop string in text[0..n) that starts at or after `from`. Returns its byte
 * offset, or -1 when none. */
long bk_stop_find(const bk_stops *st, const char *text, size_t n, size_t from);

/* Bytes of text[0..n) that may be released now: n minus the longest suffix that is a proper prefix of a stop
 * string, moved back to a UTF-8 character boundary. Returns n when there are no stop strings. */
size_t bk_stop_releasable(const bk_stops *st, const char *text, size_t n);
#endif
