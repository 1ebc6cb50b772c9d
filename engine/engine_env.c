/* engine/engine_env.c: see engine_env.h. */
#include "engine_env.h"

#include <stdlib.h>

const char *engine_env(const char *name) {
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

int engine_env_int(const char *name, int dflt, int lo, int hi) {
    const char *v = engine_env(name);
    if (!v) return dflt;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) return dflt;
    return (int)x;
}
