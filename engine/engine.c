/* engine/engine.c: picks the back-end named by the options: the CPU engines ("cpu": engine/cpu_fast.c, "cpu-ref":
 * the f32 reference engine/engine_cpu.c), or one that registered itself. */
#include <stdio.h>
#include <string.h>
#include "engine.h"

#define ENGINE_MAX_BACKENDS 8

typedef struct {
    char name[16]; /* device name without ":N", e.g. "cuda" */
    zl_engine_new_fn fn;
} s_backend;

/* zero-initialised before any constructor runs, so registration order does not matter */
static s_backend s_backends[ENGINE_MAX_BACKENDS];
static int s_n_backends;

int engine_register(const char *name, zl_engine_new_fn fn) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= sizeof s_backends[0].name || !fn || s_n_backends >= ENGINE_MAX_BACKENDS) return -1;
    for (int i = 0; i < s_n_backends; i++)
        if (strcmp(s_backends[i].name, name) == 0) return -1;
    memcpy(s_backends[s_n_backends].name, name, len + 1);
    s_backends[s_n_backends].fn = fn;
    s_n_backends++;
    return 0;
}

/* the registered back-end for dev ("name" or "name:N"), or NULL */
static zl_engine_new_fn s_find(const char *dev) {
    for (int i = 0; i < s_n_backends; i++) {
        size_t len = strlen(s_backends[i].name);
        if (strncmp(dev, s_backends[i].name, len) == 0 && (dev[len] == 0 || dev[len] == ':')) return s_backends[i].fn;
    }
    return NULL;
}

zl_engine *engine_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    const char *dev = o && o->device ? o->device : "cpu";
    zl_engine *e = NULL;
    zl_engine_new_fn fn = s_find(dev);
    if (strcmp(dev, "cpu") == 0) e = engine_cpu_fast_new(m, o, err, errlen);
    else if (strcmp(dev, "cpu-ref") == 0) e = engine_cpu_new(m, o, err, errlen);
    else if (fn) e = fn(m, o, err, errlen);
    else if (strncmp(dev, "cuda", 4) == 0 && (dev[4] == 0 || dev[4] == ':'))
        snprintf(err, errlen, "this zllm was built without CUDA (rebuild with ZLLM_CUDA=1 and the CUDA toolkit)");
    else snprintf(err, errlen, "unknown device '%s' (expected cpu, cpu-ref, cuda or cuda:N)", dev);
    /* a layer range asked of a backend that does not run pipeline stages (layer_end 0) is refused, not
     * silently ignored */
    if (e && o && (o->layer_begin || o->layer_end) && e->layer_end == 0) {
        snprintf(err, errlen, "the %s backend does not run pipeline stages (layer ranges)", e->device);
        engine_destroy(&e);
    }
    return e;
}

void engine_destroy(zl_engine **e) {
    if (!e || !*e) return;
    (*e)->ops->destroy(*e);
    *e = NULL;
}
