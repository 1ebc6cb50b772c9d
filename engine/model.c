/* engine/model.c: reads a Llama-family configuration (llama, qwen2, qwen3, phi3, gemma3; docs/models.md) from GGUF
 * metadata and binds every weight tensor, checking presence, shape and type against that configuration. Nothing is
 * copied: zl_weight points into the mapping owned by the gguf. Every check returns an error message; nothing is
 * asserted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"
#include "quant.h"

/* one integer hyper-parameter "{arch}.{suffix}": def when absent (def < 0: required); must lie in [lo, hi] */
static int s_get_int(const gguf *g, const char *arch, const char *suffix, int64_t def, int64_t lo, int64_t hi, int *out,
                     char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_value *v = gguf_get(g, key);
    int64_t x;
    if (!v) {
        if (def < 0) {
            snprintf(err, errlen, "%s: missing metadata %s", g->path, key);
            return -1;
        }
        x = def;
    } else {
        switch (v->type) {
        case GGUF_T_UINT8:
        case GGUF_T_UINT16:
        case GGUF_T_UINT32:
        case GGUF_T_UINT64: x = v->v.u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v->v.u64; break;
        case GGUF_T_INT8:
        case GGUF_T_INT16:
        case GGUF_T_INT32:
        case GGUF_T_INT64: x = v->v.i64; break;
        default:
            snprintf(err, errlen, "%s: metadata %s is not an integer (per-layer arrays are not supported)", g->path,
                     key);
            return -1;
        }
    }
    if (x < lo || x > hi) {
        snprintf(err, errlen, "%s: metadata %s = %lld is out of range [%lld, %lld]", g->path, key, (long long)x,
                 (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* one float hyper-parameter: def when absent; must be finite and in (lo, hi] */
static int s_get_float(const gguf *g, const char *arch, const char *suffix, double def, double lo, double hi,
                       float *out, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_value *v = gguf_get(g, key);
    double x = def;
    if (v) {
        if (v->type != GGUF_T_FLOAT32 && v->type != GGUF_T_FLOAT64) {
            snprintf(err, errlen, "%s: metadata %s is not a float", g->path, key);
            return -1;
        }
        x = v->v.f64;
    }
    if (!isfinite(x) || !(x > lo) || x > hi) {
        snprintf(err, errlen, "%s: metadata %s = %g is out of range (%g, %g]", g->path, key, x, lo, hi);
        return -1;
    }
    *out = (float)x;
    return 0;
}

/* binds tensor `name` into w, checking it is a vector of n_in (n_out == 0) or a matrix [n_out rows][n_in].
 * optional: an absent tensor leaves w->data NULL and succeeds. */
static int s_bind(const gguf *g, zl_weight *w, const char *name, int64_t n_in, int64_t n_out, int optional, char *err,
                  size_t errlen) {
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (optional) return 0;
        snprintf(err, errlen, "%s: missing tensor %s", g->path, name);
        return -1;
    }
    w->name = t->name;
    int is_vec = n_out == 0;
    int64_t rows = is_vec ? 1 : n_out;
    if (t->ne[0] != n_in || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        snprintf(err, errlen,
                 "%s: tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] "
                 "(from the metadata)",
                 g->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                 (long long)n_in, (long long)rows);
        return -1;
    }
    if (!quant_supported(t->type)) {
        snprintf(err, errlen, "%s: tensor %s has unsupported type %s (%d)", g->path, name,
                 ggml_type_name(t->type) ? ggml_type_name(t->type) : "unknown", (int)t->type);
        return -1;
    }
    size_t rb = ggml_row_bytes(t->type, n_in);
    if (rb == 0) {
        snprintf(err, errlen, "%s: tensor %s: row of %lld is not a whole number of %s blocks", g->path, name,
                 (long long)n_in, ggml_type_name(t->type));
        return -1;
    }
    if (t->nbytes != rb * (uint64_t)rows || !t->data) {
        snprintf(err, errlen, "%s: tensor %s holds %llu bytes, expected %llu", g->path, name,
                 (unsigned long long)t->nbytes, (unsigned long long)(rb * (uint64_t)rows));
        return -1;
    }
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = rows;
    w->row_bytes = rb;
    w->data = t->data;
    return 0;
}

/* metadata that changes the function and that zllm does not compute: its presence (with a value other than the
 * neutral one) is a load error naming the key, never ignored */
static const struct {
    const char *suffix; /* "{arch}.SUFFIX" */
    double neutral;     /* a numeric value equal to this is accepted (the feature is off) */
    const char *what;   /* for the message */
} s_refused_keys[] = {
    {"rope.scaling.yarn_log_multiplier", 0.0, "YaRN attention scaling by log multiplier"},
    {"rope.scaling.alpha", 0.0, "NTK-alpha RoPE scaling"},
    {"attn_logit_softcapping", 0.0, "attention logit soft-capping"},
    {"final_logit_softcapping", 0.0, "final logit soft-capping"},
    {"expert_count", 0.0, "mixture of experts"},
    {"expert_used_count", 0.0, "mixture of experts"},
    {"attention.clamp_kqv", 0.0, "Q/K/V clamping"},
    {"embedding_scale", 1.0, "embedding scaling"},
    {"residual_scale", 1.0, "residual scaling"},
    {"logit_scale", 1.0, "logit scaling"},
    {"attention.scale", 0.0, "a custom attention scale"},
};

static int s_refuse_keys(const gguf *g, const char *arch, char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof s_refused_keys / sizeof s_refused_keys[0]; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", arch, s_refused_keys[i].suffix);
        const gguf_value *v = gguf_get(g, key);
        if (!v) continue;
        double x;
        switch (v->type) {
        case GGUF_T_UINT8:
        case GGUF_T_UINT16:
        case GGUF_T_UINT32:
        case GGUF_T_UINT64:
        case GGUF_T_BOOL: x = (double)v->v.u64; break;
        case GGUF_T_INT8:
        case GGUF_T_INT16:
        case GGUF_T_INT32:
        case GGUF_T_INT64: x = (double)v->v.i64; break;
        case GGUF_T_FLOAT32:
        case GGUF_T_FLOAT64: x = v->v.f64; break;
        default: x = NAN; /* arrays (per-layer values) and strings: never neutral */
        }
        if (x == s_refused_keys[i].neutral) continue;
        snprintf(err, errlen, "%s: metadata %s (%s) is not supported", g->path, key, s_refused_keys[i].what);
        return -1;
    }
    return 0;
}

/* {arch}.rope.scaling.*: the type (linear when absent, as llama.cpp reads it), factor, original context, attention
 * factors and YaRN's parameters; a type zllm does not compute is refused by name */
static int s_read_rope_scaling(const gguf *g, const char *arch, zl_config *c, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const gguf_value *sv = gguf_get(g, key);
    c->rope_scaling = ZL_ROPE_SCALING_LINEAR;
    if (sv) {
        if (sv->type != GGUF_T_STRING) {
            snprintf(err, errlen, "%s: metadata %s is not a string", g->path, key);
            return -1;
        }
        if (gguf_str_eq(sv->v.str, "none")) c->rope_scaling = ZL_ROPE_SCALING_NONE;
        else if (gguf_str_eq(sv->v.str, "yarn")) c->rope_scaling = ZL_ROPE_SCALING_YARN;
        else if (!gguf_str_eq(sv->v.str, "linear") && !gguf_str_eq(sv->v.str, "longrope")) {
            int n = sv->v.str.len > 32 ? 32 : (int)sv->v.str.len;
            snprintf(err, errlen,
                     "%s: RoPE scaling type '%.*s' (%s) is not supported (zllm computes none, linear, "
                     "yarn and longrope)",
                     g->path, n, sv->v.str.ptr, key);
            return -1;
        }
    }
    /* the factor; older files write it as rope.scale_linear; 0 means none (llama.cpp) */
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    const char *factor_key = gguf_get(g, key) ? "rope.scaling.factor" : "rope.scale_linear";
    if (s_get_float(g, arch, factor_key, 1.0, -1e-30, 1e6, &c->rope_scale, err, errlen) ||
        s_get_int(g, arch, "rope.scaling.original_context_length", c->n_ctx, 1, 1 << 24, &c->rope_orig_ctx, err,
                  errlen) ||
        s_get_float(g, arch, "rope.scaling.attn_factor", 1.0, 0.0, 1e3, &c->rope_attn_factor, err, errlen) ||
        s_get_float(g, arch, "rope.scaling.yarn_attn_factor", 1.0, 0.0, 1e3, &c->rope_yarn_attn, err, errlen) ||
        s_get_float(g, arch, "rope.scaling.yarn_ext_factor", -1.0, -1.5, 1.0, &c->rope_ext_factor, err, errlen) ||
        s_get_float(g, arch, "rope.scaling.yarn_beta_fast", 32.0, 0.0, 1e6, &c->rope_beta_fast, err, errlen) ||
        s_get_float(g, arch, "rope.scaling.yarn_beta_slow", 1.0, 0.0, 1e6, &c->rope_beta_slow, err, errlen))
        return -1;
    if (c->rope_scale == 0.0f) c->rope_scale = 1.0f;
    if (c->rope_scaling == ZL_ROPE_SCALING_NONE) c->rope_scale = 1.0f; /* llama.cpp: no scaling whatever the factor */
    /* llama.cpp: a negative extrapolation factor means 1 for YaRN; it has no effect otherwise */
    if (c->rope_ext_factor < 0) c->rope_ext_factor = c->rope_scaling == ZL_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    return 0;
}

/* attention.sliding_window_pattern, where a file carries one, must say what zllm computes (gemma3: an integer 6, or
 * one flag per layer, true on the sliding layers); any other value, and the key on another architecture, is refused */
static int s_check_swa_pattern(const gguf *g, const char *arch, const zl_config *c, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const gguf_value *v = gguf_get(g, key);
    if (!v) return 0;
    int ok = c->arch == ZL_ARCH_GEMMA3;
    if (ok && v->type == GGUF_T_ARRAY) {
        ok = v->v.arr.n == (uint64_t)c->n_layers;
        for (int l = 0; ok && l < c->n_layers; l++) {
            int64_t f;
            ok = gguf_arr_i64(v, (uint64_t)l, &f) == 0 && (f != 0) == (l % c->swa_pattern != c->swa_pattern - 1);
        }
    } else if (ok) {
        ok = (v->type == GGUF_T_UINT32 || v->type == GGUF_T_INT32 || v->type == GGUF_T_UINT64 ||
              v->type == GGUF_T_INT64) &&
             v->v.u64 == (uint64_t)c->swa_pattern;
    }
    if (ok) return 0;
    snprintf(err, errlen, "%s: metadata %s (a sliding-window layer pattern other than %s) is not supported", g->path,
             key, c->arch == ZL_ARCH_GEMMA3 ? "gemma3's every-6th-layer-global" : "none");
    return -1;
}

/* the sliding window and the gemma3 block, after the common hyper-parameters and the RoPE scaling. gemma3 as
 * llama.cpp reads it: every 6th layer global (RoPE base rope.freq_base, with the file's scaling), the others
 * sliding (base 10000, unscaled); embeddings times sqrt(dim); the query scale 1/sqrt(key_length), 1/sqrt(dim /
 * heads) for the 62-layer (27B) model whose query_pre_attn_scalar the file does not carry */
static int s_swa_config(const gguf *g, const char *arch, zl_config *c, char *err, size_t errlen) {
    c->rope_base_swa = c->rope_base;
    c->rope_scale_swa = c->rope_scale;
    c->embd_scale = 1.0f;
    c->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    c->ffn_act = ZL_ACT_SILU;
    if (s_get_int(g, arch, "attention.sliding_window", 0, 0, 1 << 24, &c->swa_window, err, errlen)) return -1;
    /* llama (Mistral) and phi3 slide on every layer, as transformers computes them (llama.cpp ignores phi3's
     * window); qwen2/qwen3 slide on some layers only (max_window_layers): refused */
    if (c->swa_window > 0 && (c->arch == ZL_ARCH_QWEN2 || c->arch == ZL_ARCH_QWEN3)) {
        snprintf(err, errlen, "%s: metadata %s.attention.sliding_window (sliding-window attention) is not supported",
                 g->path, arch);
        return -1;
    }
    if (c->arch == ZL_ARCH_GEMMA3) c->swa_pattern = 6;
    if (s_check_swa_pattern(g, arch, c, err, errlen)) return -1;
    if (c->arch != ZL_ARCH_GEMMA3) return 0;
    /* gemma3 scales its global layers linearly (Gemma 3 4B+); YaRN there is not what its checks cover: refused */
    if (c->rope_scaling == ZL_ROPE_SCALING_YARN) {
        snprintf(err, errlen, "%s: metadata gemma3.rope.scaling.type 'yarn' (RoPE scaling) is not supported for gemma3",
                 g->path);
        return -1;
    }
    c->rope_base_swa = 10000.0f;
    c->rope_scale_swa = 1.0f;
    c->embd_scale = (float)sqrt((double)c->dim);
    if (c->n_layers == 62) c->attn_scale = (float)(1.0 / sqrt((double)c->dim / c->n_heads));
    c->has_post_norms = 1;
    c->ffn_act = ZL_ACT_GELU_TANH;
    return 0;
}

int model_layer_window(const zl_config *c, int l) {
    if (c->swa_window <= 0) return 0;
    if (c->swa_pattern > 0 && l % c->swa_pattern == c->swa_pattern - 1) return 0;
    return c->swa_window;
}

int model_attn_window(const zl_config *c, int l, int n_ctx) {
    const int w = model_layer_window(c, l);
    return w >= n_ctx ? 0 : w;
}

int model_rope_two_kinds(const zl_config *c) {
    if (c->swa_window <= 0 || (c->rope_base_swa == c->rope_base && c->rope_scale_swa == c->rope_scale)) return 0;
    for (int l = 0; l < c->n_layers; l++) /* both kinds of layer present */
        if (!model_layer_window(c, l)) return 1;
    return 0;
}

static const char *const s_arch_names[] = {"llama", "qwen2", "qwen3", "phi3", "gemma3"};

static int s_read_config(const gguf *g, zl_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    const gguf_value *av = gguf_get(g, "general.architecture");
    if (!av || av->type != GGUF_T_STRING) {
        snprintf(err, errlen, "%s: missing metadata general.architecture", g->path);
        return -1;
    }
    const char *arch;
    if (gguf_str_eq(av->v.str, "llama")) {
        c->arch = ZL_ARCH_LLAMA;
        c->rope_style = ZL_ROPE_ADJACENT;
        arch = "llama";
    } else if (gguf_str_eq(av->v.str, "qwen2")) {
        c->arch = ZL_ARCH_QWEN2;
        c->rope_style = ZL_ROPE_HALVES;
        arch = "qwen2";
    } else if (gguf_str_eq(av->v.str, "qwen3")) {
        c->arch = ZL_ARCH_QWEN3;
        c->rope_style = ZL_ROPE_HALVES;
        arch = "qwen3";
    } else if (gguf_str_eq(av->v.str, "phi3")) {
        c->arch = ZL_ARCH_PHI3;
        c->rope_style = ZL_ROPE_HALVES;
        arch = "phi3";
    } else if (gguf_str_eq(av->v.str, "gemma3")) {
        c->arch = ZL_ARCH_GEMMA3;
        c->rope_style = ZL_ROPE_HALVES; /* llama.cpp's NEOX rope type; the converter does not permute Q/K */
        arch = "gemma3";
    } else {
        int n = av->v.str.len > 64 ? 64 : (int)av->v.str.len;
        snprintf(err, errlen, "%s: unsupported architecture '%.*s' (zllm runs llama, qwen2, qwen3, phi3 and gemma3)",
                 g->path, n, av->v.str.ptr);
        return -1;
    }
    const int64_t big = 1 << 20;
    if (s_get_int(g, arch, "block_count", -1, 1, 4096, &c->n_layers, err, errlen) ||
        s_get_int(g, arch, "embedding_length", -1, 1, 1 << 17, &c->dim, err, errlen) ||
        s_get_int(g, arch, "feed_forward_length", -1, 1, big, &c->ffn_dim, err, errlen) ||
        s_get_int(g, arch, "attention.head_count", -1, 1, 4096, &c->n_heads, err, errlen) ||
        s_get_int(g, arch, "attention.head_count_kv", c->n_heads, 1, c->n_heads, &c->n_kv_heads, err, errlen) ||
        s_get_int(g, arch, "context_length", 2048, 1, 1 << 24, &c->n_ctx, err, errlen))
        return -1;
    if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(err, errlen, "%s: %d query heads are not a multiple of %d KV heads", g->path, c->n_heads,
                 c->n_kv_heads);
        return -1;
    }
    int def_hd = c->dim % c->n_heads == 0 ? c->dim / c->n_heads : -1;
    if (s_get_int(g, arch, "attention.key_length", def_hd, 1, 1 << 14, &c->head_dim, err, errlen)) {
        if (def_hd < 0)
            snprintf(err, errlen, "%s: no %s.attention.key_length and dim %d is not a multiple of %d heads", g->path,
                     arch, c->dim, c->n_heads);
        return -1;
    }
    int vlen;
    if (s_get_int(g, arch, "attention.value_length", c->head_dim, 1, 1 << 14, &vlen, err, errlen)) return -1;
    if (vlen != c->head_dim) {
        snprintf(err, errlen, "%s: value_length %d != key_length %d is not supported", g->path, vlen, c->head_dim);
        return -1;
    }
    if ((int64_t)c->n_heads * c->head_dim > big) {
        snprintf(err, errlen, "%s: %d heads of %d is too wide", g->path, c->n_heads, c->head_dim);
        return -1;
    }
    if (s_get_int(g, arch, "rope.dimension_count", c->head_dim, 2, c->head_dim, &c->rope_dim, err, errlen)) return -1;
    if (c->rope_dim % 2 != 0) {
        snprintf(err, errlen, "%s: rope.dimension_count %d is odd", g->path, c->rope_dim);
        return -1;
    }
    if (s_get_float(g, arch, "rope.freq_base", 10000.0, 1.0, 1e12, &c->rope_base, err, errlen) ||
        s_get_float(g, arch, "attention.layer_norm_rms_epsilon",
                    c->arch == ZL_ARCH_LLAMA || c->arch == ZL_ARCH_PHI3 ? 1e-5 : 1e-6, 0.0, 1.0, &c->rms_eps, err,
                    errlen))
        return -1;
    return s_read_rope_scaling(g, arch, c, err, errlen) || s_swa_config(g, arch, c, err, errlen) ||
                   s_refuse_keys(g, arch, err, errlen)
               ? -1
               : 0;
}

/* the layer of a block tensor's name "blk.N.REST", N written as s_bind_all writes it (decimal, no sign, space or
 * leading zero), with *rest = REST; -1 for any other name */
static int s_block_layer(const char *name, const char **rest) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    int layer = 0, k = 0;
    for (; p[k] >= '0' && p[k] <= '9'; k++) {
        if (k == 9) return -1; /* beyond any layer count (and int) */
        layer = layer * 10 + (p[k] - '0');
    }
    if (k == 0 || p[k] != '.' || (k > 1 && p[0] == '0')) return -1;
    *rest = p + k + 1;
    return layer;
}

/* 1 when `name` is a tensor that s_bind_all binds for this configuration */
static int s_known_tensor(const zl_model *m, const char *name) {
    const zl_config *c = &m->cfg;
    static const char *const global[] = {"token_embd.weight", "output_norm.weight", "output.weight"};
    static const char *const block[] = {"attn_norm.weight", "attn_output.weight", "ffn_norm.weight", "ffn_up.weight",
                                        "ffn_down.weight"};
    static const char *const qkv[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
    static const char *const bias[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    static const char *const qk_norm[] = {"attn_q_norm.weight", "attn_k_norm.weight"};
    static const char *const post[] = {"post_attention_norm.weight", "post_ffw_norm.weight"};
    for (size_t i = 0; i < sizeof global / sizeof global[0]; i++)
        if (strcmp(name, global[i]) == 0) return 1;
    /* RoPE factor tensors, bound by s_bind_rope */
    if ((m->rope_freqs.data && strcmp(name, "rope_freqs.weight") == 0) ||
        (m->rope_long.data && strcmp(name, "rope_factors_long.weight") == 0) ||
        (m->rope_short.data && strcmp(name, "rope_factors_short.weight") == 0))
        return 1;
    const char *rest;
    int layer = s_block_layer(name, &rest);
    if (layer < 0 || layer >= c->n_layers) return 0;
    const zl_layer_weights *L = &m->layers[layer];
    const int fused_qkv = L->wq.name && strcmp(L->wq.name, name) == 0; /* phi3's attn_qkv.weight */
    if (fused_qkv) return 1;
    for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
        if (strcmp(rest, block[i]) == 0) return 1;
    for (size_t i = 0; i < sizeof qkv / sizeof qkv[0]; i++)
        if (strcmp(rest, qkv[i]) == 0 && !(L->wq.name && strstr(L->wq.name, "attn_qkv"))) return 1;
    if (c->arch != ZL_ARCH_PHI3 && strcmp(rest, "ffn_gate.weight") == 0) return 1;
    for (size_t i = 0; c->has_qkv_bias && i < sizeof bias / sizeof bias[0]; i++)
        if (strcmp(rest, bias[i]) == 0) return 1;
    for (size_t i = 0; c->has_qk_norm && i < sizeof qk_norm / sizeof qk_norm[0]; i++)
        if (strcmp(rest, qk_norm[i]) == 0) return 1;
    for (size_t i = 0; c->has_post_norms && i < sizeof post / sizeof post[0]; i++)
        if (strcmp(rest, post[i]) == 0) return 1;
    return 0;
}

/* a tensor that zllm does not bind would be ignored, and the model computed without it: refuse the file,
 * naming the tensor (attn_q_norm on llama: Q/K norms; rope_factors_long without its short twin; ...) */
static int s_refuse_tensors(const zl_model *m, char *err, size_t errlen) {
    const gguf *g = m->gguf;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        if (s_known_tensor(m, name)) continue;
        snprintf(err, errlen, "%s: tensor %s is not used by zllm's %s model (unsupported)", g->path, name,
                 s_arch_names[m->cfg.arch]);
        return -1;
    }
    return 0;
}

/* w = rows [row0, row0 + rows) of the matrix f (a fused tensor's part; rows are contiguous, so a view) */
static void s_view(zl_weight *w, const zl_weight *f, int64_t row0, int64_t rows) {
    *w = *f;
    w->n_out = rows;
    w->data = (const char *)f->data + (size_t)row0 * f->row_bytes;
}

/* the RoPE factor tensors: rope_freqs.weight (llama3), or LongRoPE's rope_factors_long/short.weight (both), each
 * [rope_dim/2] positive finite values */
static int s_bind_rope(zl_model *m, char *err, size_t errlen) {
    const gguf *g = m->gguf;
    const int half = m->cfg.rope_dim / 2;
    if (s_bind(g, &m->rope_freqs, "rope_freqs.weight", half, 0, 1, err, errlen) ||
        s_bind(g, &m->rope_long, "rope_factors_long.weight", half, 0, 1, err, errlen) ||
        s_bind(g, &m->rope_short, "rope_factors_short.weight", half, 0, 1, err, errlen))
        return -1;
    if (!m->rope_long.data != !m->rope_short.data) {
        snprintf(err, errlen, "%s: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight",
                 g->path);
        return -1;
    }
    if (m->rope_freqs.data && m->rope_long.data) {
        snprintf(err, errlen, "%s: both rope_freqs.weight and LongRoPE factors (unsupported)", g->path);
        return -1;
    }
    const zl_weight *ws[] = {&m->rope_freqs, &m->rope_long, &m->rope_short};
    float *f = calloc((size_t)half, sizeof(float));
    if (!f) {
        snprintf(err, errlen, "%s: out of memory", g->path);
        return -1;
    }
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        if (!ws[k]->data) continue;
        if (quant_dequant_row(ws[k]->type, ws[k]->data, f, half) != 0) rc = -1;
        for (int i = 0; i < half && rc == 0; i++)
            if (!(f[i] > 0.0f) || !isfinite(f[i])) rc = -1;
        if (rc)
            snprintf(err, errlen, "%s: tensor %s holds a factor that is not positive and finite", g->path, ws[k]->name);
    }
    free(f);
    return rc;
}

static int s_bind_all(zl_model *m, char *err, size_t errlen) {
    const gguf *g = m->gguf;
    zl_config *c = &m->cfg;
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        snprintf(err, errlen, "%s: missing tensor token_embd.weight", g->path);
        return -1;
    }
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        snprintf(err, errlen, "%s: token_embd.weight has %lld rows (vocabulary size out of range)", g->path,
                 (long long)te->ne[1]);
        return -1;
    }
    c->vocab_size = (int)te->ne[1];
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    if (s_bind(g, &m->tok_embd, "token_embd.weight", c->dim, c->vocab_size, 0, err, errlen) ||
        s_bind(g, &m->output_norm, "output_norm.weight", c->dim, 0, 0, err, errlen) ||
        s_bind(g, &m->output, "output.weight", c->dim, c->vocab_size, 1, err, errlen))
        return -1;
    if (!m->output.data) {
        m->output = m->tok_embd;
        c->tied_embeddings = 1;
    }
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, errlen, "%s: out of memory", g->path);
        return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        zl_layer_weights *L = &m->layers[l];
        char n[96];
#define BIND(field, suffix, nin, nout, opt)                                                                            \
    (snprintf(n, sizeof n, "blk.%d." suffix, l), s_bind(g, &L->field, n, nin, nout, opt, err, errlen))
        if (BIND(attn_norm, "attn_norm.weight", c->dim, 0, 0)) return -1;
        zl_weight fused;
        snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", l);
        if (c->arch == ZL_ARCH_PHI3 && gguf_find_tensor(g, n)) { /* phi3: q, k, v rows of one matrix */
            if (s_bind(g, &fused, n, c->dim, q_dim + 2 * kv_dim, 0, err, errlen)) return -1;
            s_view(&L->wq, &fused, 0, q_dim);
            s_view(&L->wk, &fused, q_dim, kv_dim);
            s_view(&L->wv, &fused, q_dim + kv_dim, kv_dim);
        } else if (BIND(wq, "attn_q.weight", c->dim, q_dim, 0) || BIND(wk, "attn_k.weight", c->dim, kv_dim, 0) ||
                   BIND(wv, "attn_v.weight", c->dim, kv_dim, 0)) {
            return -1;
        }
        if (BIND(wo, "attn_output.weight", q_dim, c->dim, 0) || BIND(ffn_norm, "ffn_norm.weight", c->dim, 0, 0))
            return -1;
        if (c->arch == ZL_ARCH_PHI3) { /* phi3: ffn_up.weight holds the gate rows, then the up rows */
            snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
            if (s_bind(g, &fused, n, c->dim, 2 * (int64_t)c->ffn_dim, 0, err, errlen)) return -1;
            s_view(&L->w_gate, &fused, 0, c->ffn_dim);
            s_view(&L->w_up, &fused, c->ffn_dim, c->ffn_dim);
        } else if (BIND(w_gate, "ffn_gate.weight", c->dim, c->ffn_dim, 0) ||
                   BIND(w_up, "ffn_up.weight", c->dim, c->ffn_dim, 0)) {
            return -1;
        }
        if (BIND(w_down, "ffn_down.weight", c->ffn_dim, c->dim, 0)) return -1;
        /* qwen3, gemma3: per-head RMSNorm of q and k (required; on other architectures the tensors are refused
         * below) */
        c->has_qk_norm = c->arch == ZL_ARCH_QWEN3 || c->arch == ZL_ARCH_GEMMA3;
        if (c->has_qk_norm && (BIND(attn_q_norm, "attn_q_norm.weight", c->head_dim, 0, 0) ||
                               BIND(attn_k_norm, "attn_k_norm.weight", c->head_dim, 0, 0)))
            return -1;
        /* gemma3: norms of the attention and FFN outputs (required) */
        if (c->has_post_norms && (BIND(post_attn_norm, "post_attention_norm.weight", c->dim, 0, 0) ||
                                  BIND(post_ffn_norm, "post_ffw_norm.weight", c->dim, 0, 0)))
            return -1;
        /* biases: required for qwen2, refused elsewhere (we would otherwise silently ignore them) */
        int need_bias = c->arch == ZL_ARCH_QWEN2;
        if (BIND(bq, "attn_q.bias", q_dim, 0, 1) || BIND(bk, "attn_k.bias", kv_dim, 0, 1) ||
            BIND(bv, "attn_v.bias", kv_dim, 0, 1))
            return -1;
#undef BIND
        int have = (L->bq.data != NULL) + (L->bk.data != NULL) + (L->bv.data != NULL);
        if (need_bias && have != 3) {
            snprintf(err, errlen, "%s: qwen2 layer %d lacks attention biases attn_{q,k,v}.bias", g->path, l);
            return -1;
        }
        if (!need_bias && have != 0) {
            snprintf(err, errlen, "%s: layer %d has attention biases (unsupported for this architecture)", g->path, l);
            return -1;
        }
        c->has_qkv_bias = need_bias;
    }
    return s_bind_rope(m, err, errlen) || s_refuse_tensors(m, err, errlen) ? -1 : 0;
}

zl_model *model_from_gguf(gguf *g, char *err, size_t errlen) {
    if (!g) {
        snprintf(err, errlen, "model: no file");
        return NULL;
    }
    zl_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "%s: out of memory", g->path);
        return NULL;
    }
    m->gguf = g;
    m->path = strdup(g->path ? g->path : "");
    if (!m->path) {
        snprintf(err, errlen, "%s: out of memory", g->path);
        goto fail;
    }
    if (s_read_config(g, &m->cfg, err, errlen) || s_bind_all(m, err, errlen)) goto fail;
    return m;
fail:
    m->gguf = NULL; /* on failure the caller keeps g */
    model_destroy(&m);
    return NULL;
}

zl_model *model_load(const char *path, char *err, size_t errlen) {
    gguf *g = gguf_open(path, err, errlen);
    if (!g) return NULL;
    zl_model *m = model_from_gguf(g, err, errlen);
    if (!m) gguf_close(&g);
    return m;
}

void model_destroy(zl_model **pm) {
    if (!pm || !*pm) return;
    zl_model *m = *pm;
    free(m->layers);
    free(m->path);
    gguf_close(&m->gguf);
    free(m);
    *pm = NULL;
}
