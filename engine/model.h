/* engine/model.h: a Llama-family model as read from a GGUF file: its configuration from the metadata and
 * its weights as typed views into the mapping (no copy; backends dequantize or upload as they need).
 * Architectures: llama (Llama 2/3.x, Mistral with its sliding window, TinyLlama, SmolLM), qwen2 (Q/K/V biases),
 * qwen3 (per-head RMSNorm of Q and K), phi3 (fused Q/K/V and gate/up matrices, LongRoPE) and gemma3 (scaled
 * embeddings, Q/K head norms, norms after attention and FFN, GeGLU, local and global layers); docs/models.md lists
 * them and the RoPE variants. */
#ifndef ZLLM_MODEL_H
#define ZLLM_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"

typedef enum { ZL_ARCH_LLAMA = 0, ZL_ARCH_QWEN2 = 1, ZL_ARCH_QWEN3 = 2, ZL_ARCH_PHI3 = 3, ZL_ARCH_GEMMA3 = 4 } zl_arch;
/* RoPE pairing, from the architecture as llama.cpp selects it: llama rotates adjacent pairs (x[2i], x[2i+1]);
 * qwen2, qwen3, phi3 and gemma3 rotate halves (x[i], x[i + rope_dim/2]) ("neox") */
typedef enum { ZL_ROPE_ADJACENT = 0, ZL_ROPE_HALVES = 1 } zl_rope_style;
/* {arch}.rope.scaling.type: none, linear (also when absent, as in llama.cpp: a factor of 1 is then no scaling) or
 * yarn. LongRoPE and llama3 scaling come as factor tensors (zl_model.rope_long/short, rope_freqs). */
typedef enum { ZL_ROPE_SCALING_LINEAR = 0, ZL_ROPE_SCALING_NONE = 1, ZL_ROPE_SCALING_YARN = 2 } zl_rope_scaling;
/* the FFN's gate activation: SwiGLU silu(gate) * up, or GeGLU gelu_tanh(gate) * up (gemma3) */
typedef enum { ZL_ACT_SILU = 0, ZL_ACT_GELU_TANH = 1 } zl_ffn_act;

typedef struct {
    zl_arch arch;             /* architecture */
    int n_layers;             /* transformer blocks */
    int dim;                  /* model (embedding) width */
    int n_heads;              /* query heads */
    int n_kv_heads;           /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    int head_dim;             /* per-head width; n_heads * head_dim need not equal dim */
    int ffn_dim;              /* SwiGLU hidden width */
    int vocab_size;           /* rows of the embedding / LM head */
    int n_ctx;                /* trained context length (tokens) */
    int rope_dim;             /* leading dims of each head that RoPE rotates (<= head_dim, even) */
    float rope_base;          /* RoPE theta base (10000, 500000, 1000000 ...) */
    zl_rope_style rope_style; /* pairing, from the architecture */
    zl_rope_scaling rope_scaling; /* rope.scaling.type */
    float rope_scale;         /* rope.scaling.factor (linear and YaRN: positions are divided by it); 1 when absent */
    int rope_orig_ctx;        /* rope.scaling.original_context_length (YaRN, LongRoPE); n_ctx when absent */
    float rope_attn_factor;   /* rope.scaling.attn_factor: cos/sin magnitude (LongRoPE's attention factor); 1 */
    float rope_yarn_attn;     /* rope.scaling.yarn_attn_factor (1; unused where YaRN mixes, as in llama.cpp) */
    float rope_ext_factor;    /* YaRN's extrapolation mix (rope.scaling.yarn_ext_factor; 1 when absent) */
    float rope_beta_fast;     /* YaRN's correction range (rope.scaling.yarn_beta_fast, 32 when absent) */
    float rope_beta_slow;     /* (rope.scaling.yarn_beta_slow, 1 when absent) */
    float rms_eps;            /* RMSNorm epsilon */
    int tied_embeddings;      /* 1 when there is no output.weight and the LM head is token_embd.weight */
    int has_qkv_bias;         /* 1 when attn_{q,k,v}.bias exist (qwen2) */
    int has_qk_norm;          /* 1: per-head RMSNorm of q and k before RoPE (qwen3, gemma3: attn_{q,k}_norm.weight) */
    /* sliding windows and the gemma3 block (neutral values for the other architectures) */
    int swa_window;       /* attention.sliding_window: on a sliding layer a query at position i sees the key at j
                           * only when i - j < swa_window; 0: no layer slides */
    int swa_pattern;      /* with swa_window: 0, every layer slides (Mistral); N, layer l slides unless
                           * l % N == N - 1 (gemma3: 6, every 6th layer is global) */
    float rope_base_swa;  /* RoPE base of the sliding layers (gemma3: 10000); rope_base where they share it */
    float rope_scale_swa; /* rope_scale of the sliding layers (gemma3: 1, unscaled); rope_scale where they share it */
    float embd_scale;     /* token embeddings are multiplied by this (gemma3: sqrt(dim)); 1 otherwise */
    float attn_scale;     /* the softmax scale of q.k (1/sqrt(head_dim); gemma3 27B: 1/sqrt(dim / n_heads)) */
    int has_post_norms;   /* 1: RMSNorm of the attention and FFN outputs before each residual add
                           * (post_attention_norm.weight, post_ffw_norm.weight) */
    zl_ffn_act ffn_act;   /* the FFN's gate activation */
} zl_config;

/* a weight matrix (or vector) in the file. Rows are ne[1], each of ne[0] elements of `type`. */
typedef struct {
    ggml_type type;   /* storage type */
    int64_t n_in;     /* ne[0]: elements per row (input features; for a vector its length) */
    int64_t n_out;    /* ne[1]: rows (output features); 1 for a vector */
    size_t row_bytes; /* bytes of one row */
    const void *data; /* into the mapping; NULL when the tensor is absent (optional biases) */
    const char *name; /* tensor name, for messages */
} zl_weight;

typedef struct {
    zl_weight attn_norm;    /* [dim] */
    zl_weight wq;           /* [n_heads*head_dim rows][dim] (phi3: wq, wk, wv are row ranges of attn_qkv.weight) */
    zl_weight wk, wv;       /* [n_kv_heads*head_dim rows][dim] */
    zl_weight bq, bk, bv;   /* biases [rows] (qwen2), data NULL otherwise */
    zl_weight attn_q_norm;  /* [head_dim] per-head RMSNorm of q before RoPE (qwen3, gemma3), data NULL otherwise */
    zl_weight attn_k_norm;  /* [head_dim] the same for k */
    zl_weight wo;           /* [dim rows][n_heads*head_dim] */
    zl_weight ffn_norm;     /* [dim] */
    zl_weight w_gate, w_up; /* [ffn_dim rows][dim] (phi3: row ranges of the fused ffn_up.weight, gate first) */
    zl_weight w_down;       /* [dim rows][ffn_dim] */
    /* gemma3 (data NULL otherwise); its norms are stored as (1 + w), so every engine multiplies by the value */
    zl_weight post_attn_norm; /* [dim]: RMSNorm of the attention output */
    zl_weight post_ffn_norm;  /* [dim]: RMSNorm of the FFN output */
} zl_layer_weights;

typedef struct zl_model {
    char *path;               /* file name */
    gguf *gguf;               /* the open file (owns the mapping) */
    zl_config cfg;            /* hyper-parameters */
    zl_weight tok_embd;       /* [vocab rows][dim] */
    zl_weight output_norm;    /* [dim] */
    zl_weight output;         /* LM head [vocab rows][dim]; a copy of tok_embd when tied */
    zl_layer_weights *layers; /* [n_layers] */
    zl_weight rope_freqs;     /* [rope_dim/2] llama3 frequency factors (rope_freqs.weight); data NULL when absent */
    zl_weight rope_long;      /* [rope_dim/2] LongRoPE factors for contexts beyond rope_orig_ctx (phi3) */
    zl_weight rope_short;     /* [rope_dim/2] LongRoPE factors within rope_orig_ctx */
} zl_model;

/* Opens path, reads the configuration and binds every tensor, checking each one's presence, shape and type.
 * Returns NULL with a one-line message in err ("FILE: problem") for any malformed, unsupported or incomplete
 * file (unknown architecture or weight type named in the message). */
zl_model *model_load(const char *path, char *err, size_t errlen);
/* Same from an already open gguf; on success the model owns g. */
zl_model *model_from_gguf(gguf *g, char *err, size_t errlen);
/* The window of layer l's attention: swa_window on a sliding layer, 0 (all earlier positions) on a global one. */
int model_layer_window(const zl_config *c, int l);
/* The window an engine of n_ctx positions per slot must apply at layer l: model_layer_window, or 0 when that
 * window is at least n_ctx (a row at a position below n_ctx then sees every earlier position anyway, so the causal
 * kernels give the same result; Phi-3 and Mistral-style files declare windows of 2k-32k and more). The rotation
 * of a sliding layer still follows model_layer_window. */
int model_attn_window(const zl_config *c, int l, int n_ctx);
/* 1 when the layers rotate in two ways (sliding layers' rope_base_swa / rope_scale_swa differ from the global
 * layers' rope_base / rope_scale): the engines then keep a second RoPE table for the sliding layers (rope_init with
 * sliding = 1). */
int model_rope_two_kinds(const zl_config *c);
/* Closes the file and frees; idempotent; sets *m to NULL. */
void model_destroy(zl_model **m);
#endif
