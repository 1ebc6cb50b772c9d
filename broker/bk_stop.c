/* broker/bk_stop.c: stop strings over streamed text (see bk_stop.h). */
#include "bk_stop.h"

#include <string.h>

long bk_stop_find(const bk_stops *st, const char *text, size_t n, size_t from) {
    long best = -1;
    if (from >= n) return -1;
    for (int i = 0; i < st->count; i++) {
        if (st->n[i] == 0 || st->n[i] > n - from) continue;
        const char *p = memmem(text + from, n - from, st->s[i], st->n[i]);
        if (p && (best < 0 || p - text < best)) best = p - text;
    }
    return best;
}

size_t bk_stop_releasable(const bk_stops *st, const char *text, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < st->count; i++) {
        size_t m = st->n[i];
        if (m < 2) continue;                 /* a 1-byte stop is found by bk_stop_find, never a prefix */
        size_t kmax = m - 1 < n ? m - 1 : n;
        for (size_t k = kmax; k > hold; k--) {
            if (text[n - k] == st->s[i][0] && memcmp(text + n - k, st->s[i], k) == 0) { hold = k; break; }
        }
    }
    size_t rel = n - hold;
    while (rel > 0 && rel < n && ((unsigned char)text[rel] & 0xc0) == 0x80) rel--;
    return rel;
}
