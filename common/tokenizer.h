/* common/tokenizer.h: text <-> token ids with the model's own vocabulary from its GGUF metadata
 * (tokenizer.ggml.*): SentencePiece-style (model "llama") and byte-level BPE (model "gpt2") with the
 * pre-tokenizers named by tokenizer.ggml.pre; chat templates. */
#ifndef ZLLM_TOKENIZER_H
#define ZLLM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"

typedef struct zl_tokenizer zl_tokenizer;

/* Builds the tokenizer from g's metadata (g may be closed afterwards: everything is copied).
 * Returns NULL with a message for a missing or unsupported vocabulary. */
zl_tokenizer *tokenizer_new(const gguf *g, char *err, size_t errlen);
void tokenizer_destroy(zl_tokenizer **t);

int tokenizer_n_vocab(const zl_tokenizer *t);
int tokenizer_bos(const zl_tokenizer *t);       /* -1 when none */
int tokenizer_eos(const zl_tokenizer *t);       /* -1 when none */
int tokenizer_add_bos(const zl_tokenizer *t);   /* the file's add-BOS flag (default by model type) */
/* 1 when id ends generation (EOS, EOT, <|im_end|>, <|eot_id|> ...) */
int tokenizer_is_eog(const zl_tokenizer *t, int32_t id);

/* Encodes text[len]. add_bos: prepend BOS; parse_special: text such as <|im_start|> becomes its single token
 * (otherwise it is plain text). Writes up to max_out ids and returns the total count (which may exceed max_out:
 * call again with a bigger buffer), or -1 on error. */
int tokenizer_encode(const zl_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t *out, int max_out);

/* Streaming decode state for one sequence: holds bytes of an incomplete UTF-8 character. Zero-initialise. */
typedef struct {
    unsigned char pend[8];     /* bytes of an unfinished UTF-8 character */
    int n_pend;                /* count of pend */
    int started;               /* 0 until the first text is produced (the SentencePiece leading space rule) */
} zl_detok;

/* Appends the text of id to out (cap bytes, NUL-terminated) and returns the byte count written, holding back
 * an incomplete UTF-8 character until a later token completes it. Returns -1 if cap is too small or id is
 * out of range. Special/control tokens decode to their text only when `special` is set. */
int tokenizer_decode_stream(const zl_tokenizer *t, zl_detok *st, int32_t id, int special, char *out, size_t cap);
/* The cap with which tokenizer_decode_stream and tokenizer_decode_flush never fail for a valid id: every byte
 * of the vocabulary's longest piece and of the held bytes may become U+FFFD (3 bytes), plus the NUL. */
size_t tokenizer_stream_cap(const zl_tokenizer *t);
/* Flushes held bytes at the end of a stream (invalid leftovers become U+FFFD). */
int tokenizer_decode_flush(const zl_tokenizer *t, zl_detok *st, char *out, size_t cap);
/* Whole-sequence decode into a malloc'd NUL-terminated string (caller frees), or NULL. */
char *tokenizer_decode(const zl_tokenizer *t, const int32_t *ids, int n, int special);

/* Chat templates */
typedef struct {
    const char *role;          /* "system", "user", "assistant" */
    const char *content;       /* UTF-8 text */
    const char *tool_call_id;  /* NULL, or (role "tool") the id of the call this message answers */
    const char *tool_calls;    /* NULL, or (role "assistant") the calls it made as OpenAI's JSON array text,
                                * [{"id", "type", "function": {"name", "arguments"}}]: the template sees the array,
                                * each function's "arguments" string parsed into its JSON value (as vLLM passes it
                                * to transformers' templates); text that does not parse stays a string */
} zl_chat_msg;

/* Renders msgs with the model's tokenizer.chat_template (kept by tokenizer_new) into a malloc'd prompt, with the
 * assistant generation prompt added when add_gen is set: the Jinja interpreter renders it as transformers does,
 * and where the template uses a construct the interpreter lacks, the hand-written family it matches (ChatML,
 * Llama 3, Llama 2 / Mistral [INST]) renders it instead, with a note saying so left in err (err is "" otherwise).
 * chat_set_mode (common/chat.h) asks for the hand-written families only or the interpreter only (chat_render takes
 * the choice as an argument). The prompt is meant to be encoded with
 * parse_special = 1 and add_bos = 0 (BOS, where the family has one, is written by the template). Returns NULL
 * with a message for an absent or failing template (raise_exception's message, a limit, "... send a raw prompt"). */
char *chat_apply(const zl_tokenizer *t, const zl_chat_msg *msgs, int n, int add_gen, char *err, size_t errlen);
/* --- additions (tokenizer owner): accessors for chat templates, tools and tests --- */
/* the file's tokenizer.chat_template, or NULL (owned by t) */
const char *tokenizer_chat_template(const zl_tokenizer *t);
/* the text of id as looked up by the encoder (BPE: raw bytes; special tokens as written), or NULL when out of
 * range; *len gets its length (not NUL-terminated) */
const char *tokenizer_token_text(const zl_tokenizer *t, int32_t id, size_t *len);
/* tokenizer_decode that also reports the byte length in *len (the text may hold NUL bytes). The whole-sequence
 * decode is byte-exact: the pieces' bytes concatenated (SPM: the leading space dropped once, see
 * tokenizer_decode_stream), invalid UTF-8 kept as is, so decode(encode(x)) == x for BPE vocabularies. Only the
 * streaming decoder replaces invalid UTF-8 with U+FFFD. */
char *tokenizer_decode_len(const zl_tokenizer *t, const int32_t *ids, int n, int special, size_t *len);
/* tokenizer.ggml.pre ("default" when absent), owned by t */
const char *tokenizer_pre(const zl_tokenizer *t);
/* 1 for a SentencePiece-style ("llama") vocabulary, 0 for byte-level BPE */
int tokenizer_is_spm(const zl_tokenizer *t);
/* Renders msgs like chat_apply, but with the given Jinja template text tmpl instead of the file's (for models
 * whose GGUF has none); bos/eos are the texts the template's bos_token/eos_token stand for ("" when NULL). */
char *chat_apply_template(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n,
                          int add_gen, char *err, size_t errlen);
#endif
