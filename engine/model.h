/* engine/model.h: a Llama-family model as read from a GGUF file: its configuration from the metadata and
 * its weights as typed views into the mapping (no copy; backends dequantize or upload as they need).
 * Architectures: llama (Llama 2/3, Mistral, TinyLlama, SmolLM) and qwen2 (Q/K/V biases). */
#ifndef ZLLM_MODEL_H
#define ZLLM_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"

typedef enum { ZL_ARCH_LLAMA = 0, ZL_ARCH_QWEN2 = 1 } zl_arch;
/* RoPE pairing: llama rotates adjacent pairs (x[2i], x[2i+1]); qwen2 rotates halves (x[i], x[i + rope_dim/2]) */
typedef enum { ZL_ROPE_ADJACENT = 0, ZL_ROPE_HALVES = 1 } zl_rope_style;

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
    float rms_eps;            /* RMSNorm epsilon */
    int tied_embeddings;      /* 1 when there is no output.weight and the LM head is token_embd.weight */
    int has_qkv_bias;         /* 1 when attn_{q,k,v}.bias exist (qwen2) */
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
    zl_weight wq;           /* [n_heads*head_dim rows][dim] */
    zl_weight wk, wv;       /* [n_kv_heads*head_dim rows][dim] */
    zl_weight bq, bk, bv;   /* biases [rows] (qwen2), data NULL otherwise */
    zl_weight wo;           /* [dim rows][n_heads*head_dim] */
    zl_weight ffn_norm;     /* [dim] */
    zl_weight w_gate, w_up; /* [ffn_dim rows][dim] */
    zl_weight w_down;       /* [dim rows][ffn_dim] */
} zl_layer_weights;

typedef struct zl_model {
    char *path;               /* file name */
    gguf *gguf;               /* the open file (owns the mapping) */
    zl_config cfg;            /* hyper-parameters */
    zl_weight tok_embd;       /* [vocab rows][dim] */
    zl_weight output_norm;    /* [dim] */
    zl_weight output;         /* LM head [vocab rows][dim]; a copy of tok_embd when tied */
    zl_layer_weights *layers; /* [n_layers] */
} zl_model;

/* Opens path, reads the configuration and binds every tensor, checking each one's presence, shape and type.
 * Returns NULL with a one-line message in err ("FILE: problem") for any malformed, unsupported or incomplete
 * file (unknown architecture or weight type named in the message). */
zl_model *model_load(const char *path, char *err, size_t errlen);
/* Same from an already open gguf; on success the model owns g. */
zl_model *model_from_gguf(gguf *g, char *err, size_t errlen);
/* Closes the file and frees; idempotent; sets *m to NULL. */
void model_destroy(zl_model **m);
#endif
