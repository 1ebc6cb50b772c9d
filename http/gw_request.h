/* http/gw_request.h: an OpenAI request body (chat or completions) parsed with jansson and validated into a
 * proto_generate for the broker. Every field zllm supports is range-checked against docs/protocol.md (logprobs,
 * top_logprobs, n, presence/frequency_penalty, logit_bias, response_format, completions' echo and the
 * prompt_logprobs extension included: docs/http.md); every field it does not support yet (best_of, tools, ...) is
 * refused with a 400 naming the field; fields that
 * change nothing (user, store, metadata, ...) are accepted and ignored.
 *
 *     gw_request r; gw_error e;
 *     if (gw_request_parse(GW_EP_CHAT, body, len, &r, &e) != 0) { ... reply e.status with e ... }
 *     ... r.gen.id = ...; proto_encode_generate(&buf, &r.gen) ...
 *     gw_request_free(&r);
 */
#ifndef ZLLM_GW_REQUEST_H
#define ZLLM_GW_REQUEST_H
#include <stddef.h>
#include "gw_error.h"
#include "proto.h"

typedef enum { GW_EP_CHAT = 1, GW_EP_COMPLETIONS = 2 } gw_endpoint;

#define GW_DEFAULT_MAX_TOKENS_COMPLETIONS 16 /* OpenAI's documented default for /v1/completions */

typedef struct {
    gw_endpoint ep;
    const char *model;  /* the model the client named, NUL-terminated ("" when absent); owned */
    int stream;         /* 0/1 */
    int include_usage;  /* stream_options.include_usage */
    int has_max_tokens; /* 1 when max_tokens / max_completion_tokens was given */
    int echo;           /* completions `echo`: the prompt is returned before the completion */
    int echo_top;       /* with echo: alternatives per prompt token in logprobs (completions' `logprobs`), -1 when
                         * logprobs were not asked for */
    int plp_ext;        /* the `prompt_logprobs` extension (vLLM's): alternatives per prompt position, -1: absent */
    proto_generate gen; /* prompt and sampling (gen.id and gen.model are the caller's to set) */
    /* owned storage the pointers above point into */
    void *root; /* the parsed json_t document */
    proto_chat *msgs;
    int32_t *tokens;
    proto_bias *bias; /* logit_bias entries (gen.sampling.bias) */
    char **pieces; /* joined text-part contents */
    int n_pieces;
    char *format_text; /* the JSON schema of a structured-output request as text (gen.format points here) */
} gw_request;

/* Parses body[len] (need not be NUL-terminated) for endpoint ep into r. Returns 0, or -1 with e filled
 * (status 400; r is then freed). Never reads outside body, whatever it holds. */
int gw_request_parse(gw_endpoint ep, const char *body, size_t len, gw_request *r, gw_error *e);
/* Structured output (http/gw_format.c): OpenAI's response_format (json_object, json_schema) and llama-server's
 * json_schema and grammar fields of the parsed body root into r->gen.format. 0, or -1 with e (400). */
int gw_format_parse(gw_request *r, void *root, gw_error *e);
/* Releases r's storage; idempotent. */
void gw_request_free(gw_request *r);

/* llama-server's /tokenize body {"content": str, "add_special": bool, "parse_special": bool} and /detokenize
 * body {"tokens": [int]}, each with an optional "model" (str) copied into model[model_cap] ("" when absent).
 * Return 0 or -1 with e (400; 404 for a model name no model can have). *content points into *root
 * (json_decref it after use); *tokens is malloc'd. */
int gw_tokenize_parse(const char *body, size_t len, void **root, const char **content, size_t *content_len,
                      int *add_special, int *parse_special, char *model, size_t model_cap, gw_error *e);
int gw_detokenize_parse(const char *body, size_t len, int32_t **tokens, size_t *n, char *model, size_t model_cap,
                        gw_error *e);
#endif
