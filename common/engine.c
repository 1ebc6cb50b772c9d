/* common/engine.c: picks the backend named by the options. */
#include <stdio.h>
#include <string.h>
#include "engine.h"

zl_engine *engine_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    const char *dev = o && o->device ? o->device : "cpu";
    zl_engine *e = NULL;
    if (strcmp(dev, "cpu") == 0) e = engine_cpu_fast_new(m, o, err, errlen);
    else if (strcmp(dev, "cpu-ref") == 0) e = engine_cpu_new(m, o, err, errlen);
    else if (strncmp(dev, "cuda", 4) == 0 && (dev[4] == 0 || dev[4] == ':')) e = engine_cuda_new(m, o, err, errlen);
    else snprintf(err, errlen, "unknown device '%s' (expected cpu, cpu-ref, cuda or cuda:N)", dev);
    /* a layer range asked of a backend that does not run pipeline stages is refused, not silently ignored */
    if (e && o && (o->layer_begin || o->layer_end) && !e->step_hidden) {
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

#ifndef ZLLM_HAVE_CUDA
zl_engine *engine_cuda_new(const zl_model *m, const zl_engine_opts *o, char *err, size_t errlen) {
    (void)m; (void)o;
    snprintf(err, errlen, "this zllm was built without CUDA (rebuild with ZLLM_CUDA=1 and the CUDA toolkit)");
    return NULL;
}
#endif
