/* http/gw_encode.c: the OpenAI response shapes the gateway writes: error bodies, chat.completion and
 * text_completion bodies, and Server-Sent Events chunks (chat.completion.chunk / text_completion). Objects
 * built once per request go through jansson; the per-token chunk is a prefix made once per request, the JSON-
 * escaped text and a fixed suffix, so a streamed token costs one escape and two copies. */
#ifndef ZLLM_GW_ENCODE_H
#define ZLLM_GW_ENCODE_H
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "gw_error.h"
#include "gw_request.h"

/* a growable byte buffer; zero-initialise */
typedef struct {
    char *p;
    size_t n, cap;
    int failed; /* an allocation failed: contents incomplete */
} gw_buf;

int gw_buf_add(gw_buf *b, const void *s, size_t n); /* 0 or -1 (sets failed) */
int gw_buf_str(gw_buf *b, const char *s);
/* appends s[n] as a JSON string literal (quotes included); bytes that are not valid UTF-8 become U+FFFD */
int gw_buf_json_str(gw_buf *b, const char *s, size_t n);
void gw_buf_free(gw_buf *b);

/* what every body and chunk of one response repeats */
typedef struct {
    gw_endpoint ep;
    char id[64];       /* "chatcmpl-..." or "cmpl-..." */
    long long created; /* Unix seconds */
    char model[PROTO_NAME_MAX + 1];
    char *chunk_pre; /* `data: {"id":...,"choices":[{"index":` (owned; each chunk then writes its index) */
} gw_resp;

/* Fills r (ep, id from the gateway's unique request number, created = now, model); 0 or -1 (out of memory). */
int gw_resp_init(gw_resp *r, gw_endpoint ep, const char *uid, const char *model);
void gw_resp_free(gw_resp *r);

/* {"error": {...}} as a malloc'd NUL-terminated body; NULL when out of memory */
char *gw_encode_error(const gw_error *e);
/* one choice of a non-streamed body: its index, text, finish ("stop"/"length") and logprobs (taken; NULL: null) */
json_t *gw_encode_choice(const gw_resp *r, uint32_t index, const char *text, size_t text_n, const char *finish,
                         json_t *logprobs);
/* the complete non-streamed body: choices (a JSON array, taken), usage, and prompt_logprobs (taken; NULL: absent) */
char *gw_encode_full(const gw_resp *r, json_t *choices, uint32_t prompt_tokens, uint32_t completion_tokens,
                     json_t *prompt_logprobs);
/* appends to list (a JSON array) the entries of vLLM's `prompt_logprobs` for prompt ids[n] with lps[n]: null where
 * lps[i] is not present (position 0), else {"ID": {"logprob", "rank", "decoded_token"}} for the prompt token (rank:
 * its place among the alternatives, null when it is not one of them) and each of the first k alternatives (rank
 * 1..k). 0, or -1 when out of memory */
int gw_encode_prompt_logprobs(json_t *list, const void *tok, const int32_t *ids, const proto_logprob *lps, uint32_t n,
                              uint32_t k);
/* the logprobs object of n tokens ids[n] with their lps[n] in OpenAI's shape for r->ep: chat {"content": [{token,
 * logprob, bytes, top_logprobs}], "refusal": null}; completions {tokens, token_logprobs, top_logprobs: [{token:
 * logprob}], text_offset}. tok (a zl_tokenizer *, or NULL) gives each token's text; without it a token reads
 * "token_id:ID". *text_off: the completion's text bytes before ids[0], advanced by their texts (completions'
 * text_offset). -inf (no candidate) is written as -9999.0. NULL when out of memory */
json_t *gw_encode_logprobs(const gw_resp *r, const void *tok, const int32_t *ids, const proto_logprob *lps, uint32_t n,
                           size_t *text_off);
/* 1 when token id (by tok, a zl_tokenizer *) starts with SentencePiece's space, which the broker's text of a
 * completion's first token drops: an echo puts it back between the prompt and the completion */
int gw_token_space(const void *tok, int32_t id);
/* appends the completions logprobs object b's four arrays to a's (the echoed prompt's, then the completion's);
 * b is not modified. 0, or -1 when out of memory */
int gw_logprobs_concat(json_t *a, const json_t *b);
/* SSE events appended to b: a text delta of choice `index` (chat: its first one carries role "assistant"), with
 * logprobs (a JSON object, taken; NULL: null), the last chunk of a choice with finish_reason, the usage chunk
 * (choices []), an error event, and `data: [DONE]` */
int gw_sse_delta(gw_buf *b, const gw_resp *r, uint32_t index, const char *text, size_t n, int first, json_t *logprobs);
int gw_sse_finish(gw_buf *b, const gw_resp *r, uint32_t index, const char *finish);
int gw_sse_usage(gw_buf *b, const gw_resp *r, uint32_t prompt_tokens, uint32_t completion_tokens);
int gw_sse_error(gw_buf *b, const gw_error *e);
int gw_sse_done(gw_buf *b);
#endif
