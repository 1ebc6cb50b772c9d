/* cuda/cu_settings.cu: reads the CUDA engine's settings from the environment once (see cu_settings.h). */
#include "cu_settings.h"
#include <stdlib.h>
#include <mutex>

static cu_settings s_settings;
static std::once_flag s_once;

/* the integer value of name within [lo, hi], or dflt when unset, empty, not a whole number or out of range */
static int s_env_int(const char *name, int dflt, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return dflt;
    return (int)x;
}

static void s_read(void) {
    cu_settings *s = &s_settings;
    s->qtc = s_env_int("ZLLM_CUDA_QTC", 1, 0, 1);
    s->wtc = s_env_int("ZLLM_CUDA_WTC", 1, 0, 1);
    s->wgmma = s_env_int("ZLLM_CUDA_WGMMA", 1, 0, 1);
    s->fuse = s_env_int("ZLLM_CUDA_FUSE", 1, 0, 1);
    s->qtc_glu = s_env_int("ZLLM_CUDA_QTC_GLU", 1, 0, 1);
    s->wtc_glu = s_env_int("ZLLM_CUDA_WTC_GLU", 1, 0, 1);
    s->qtc_pair = s_env_int("ZLLM_CUDA_QTC_PAIR", 1, 0, 1);
    s->pdl = s_env_int("ZLLM_CUDA_PDL", 1, 0, 1);
    s->inputs_early = s_env_int("ZLLM_CUDA_KV_PRE", 1, 0, 1);
    s->attn_tc = s_env_int("ZLLM_CUDA_ATTN_TC", 1, 0, 1);
    s->attn_cluster = s_env_int("ZLLM_CUDA_ATTN_CLUSTER", 1, 0, 1);
    s->prefill_tc = s_env_int("ZLLM_CUDA_PREFILL_TC", 1, 0, 1);
    s->sample_cluster = s_env_int("ZLLM_CUDA_SAMPLE_CLUSTER", 1, 0, 1);
    s->qtc_grid = s_env_int("ZLLM_CUDA_QTC_GRID", 0, 0, 1 << 30);
}

extern "C" const cu_settings *cu_settings_get(void) {
    std::call_once(s_once, s_read);
    return &s_settings;
}
