/* tools/slurp.c: see slurp.h. */
#include "slurp.h"

#include <stdlib.h>

char *slurp_stream(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    if (!b) return NULL;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    b[len] = 0;
    *n = len;
    return b;
}
