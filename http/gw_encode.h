/* http/gw_encode.c: the OpenAI response shapes the gateway writes: error bodies, chat.completion and
 * text_completion bodies, and Server-Sent Events chunks (chat.completion.chunk / text_completion). Objects
 * built once per request go through jansson; the per-token chunk is a prefix made once per request, the JSON-
 * escaped text and a fixed suffix, so a streamed token costs one escape and two copies. */
#ifndef ZLLM_GW_ENCODE_H
#define ZLLM_GW_ENCODE_H
#include <stddef.h>
#include <stdint.h>
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
    char *chunk_pre; /* `data: {"id":...,"choices":[{"index":0,` (owned) */
} gw_resp;

/* Fills r (ep, id from the gateway's unique request number, created = now, model); 0 or -1 (out of memory). */
int gw_resp_init(gw_resp *r, gw_endpoint ep, const char *uid, const char *model);
void gw_resp_free(gw_resp *r);

/* {"error": {...}} as a malloc'd NUL-terminated body; NULL when out of memory */
char *gw_encode_error(const gw_error *e);
/* the complete non-streamed body: text, finish ("stop"/"length"), usage */
char *gw_encode_full(const gw_resp *r, const char *text, size_t text_n, const char *finish, uint32_t prompt_tokens,
                     uint32_t completion_tokens);
/* SSE events appended to b: a text delta (chat: the first one carries role "assistant"), the last chunk with
 * finish_reason, the usage chunk (choices []), an error event, and `data: [DONE]` */
int gw_sse_delta(gw_buf *b, const gw_resp *r, const char *text, size_t n, int first);
int gw_sse_finish(gw_buf *b, const gw_resp *r, const char *finish);
int gw_sse_usage(gw_buf *b, const gw_resp *r, uint32_t prompt_tokens, uint32_t completion_tokens);
int gw_sse_error(gw_buf *b, const gw_error *e);
int gw_sse_done(gw_buf *b);
#endif
