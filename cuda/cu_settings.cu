/* cuda/cu_settings.cu: reads the CUDA engine's settings from the environment once (see cu_settings.h), through
 * engine/engine_env.h, the one reader of the environment below the clients. */
#include "cu_settings.h"
#include "engine_env.h"
#include <mutex>

static cu_settings s_settings;
static std::once_flag s_once;

static void s_read(void) {
    cu_settings *s = &s_settings;
    s->qtc = engine_env_int("ZLLM_CUDA_QTC", 1, 0, 1);
    s->wtc = engine_env_int("ZLLM_CUDA_WTC", 1, 0, 1);
    s->wgmma = engine_env_int("ZLLM_CUDA_WGMMA", 1, 0, 1);
    s->fuse = engine_env_int("ZLLM_CUDA_FUSE", 1, 0, 1);
    s->qtc_glu = engine_env_int("ZLLM_CUDA_QTC_GLU", 1, 0, 1);
    s->wtc_glu = engine_env_int("ZLLM_CUDA_WTC_GLU", 1, 0, 1);
    s->qtc_pair = engine_env_int("ZLLM_CUDA_QTC_PAIR", 1, 0, 1);
    s->qtc_f16 = engine_env_int("ZLLM_CUDA_QTC_F16", 1, 0, 1);
    s->pdl = engine_env_int("ZLLM_CUDA_PDL", 1, 0, 1);
    s->inputs_early = engine_env_int("ZLLM_CUDA_KV_PRE", 1, 0, 1);
    s->attn_tc = engine_env_int("ZLLM_CUDA_ATTN_TC", 1, 0, 1);
    s->attn_cluster = engine_env_int("ZLLM_CUDA_ATTN_CLUSTER", 1, 0, 1);
    s->prefill_tc = engine_env_int("ZLLM_CUDA_PREFILL_TC", 1, 0, 1);
    s->sample_cluster = engine_env_int("ZLLM_CUDA_SAMPLE_CLUSTER", 1, 0, 1);
    s->qtc_grid = engine_env_int("ZLLM_CUDA_QTC_GRID", 0, 0, 1 << 30);
}

extern "C" const cu_settings *cu_settings_get(void) {
    std::call_once(s_once, s_read);
    return &s_settings;
}
