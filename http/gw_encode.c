/* http/gw_encode.c: OpenAI response bodies and SSE chunks (see gw_encode.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include "gw_encode.h"

int gw_error_set(gw_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int gw_buf_add(gw_buf *b, const void *s, size_t n) {
    if (b->failed) return -1;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int gw_buf_str(gw_buf *b, const char *s) { return gw_buf_add(b, s, strlen(s)); }

/* length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one */
static size_t s_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) k = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) k = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    unsigned cp = c & (0xff >> (k + 1));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

int gw_buf_json_str(gw_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    gw_buf_add(b, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        const char *esc = NULL;
        char tmp[8];
        size_t k = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) {
            memcpy(tmp, "\\u00", 4);
            tmp[4] = hex[c >> 4];
            tmp[5] = hex[c & 15];
            tmp[6] = 0;
            esc = tmp;
        } else if (c >= 0x80 && !(k = s_utf8_len(u + i, n - i))) {
            esc = "\\ufffd";
            k = 1;
        }
        if (esc) {
            gw_buf_add(b, s + run, i - run);
            gw_buf_add(b, esc, strlen(esc));
            i += k;
            run = i;
        } else {
            i += k;
        }
    }
    gw_buf_add(b, s + run, n - run);
    return gw_buf_add(b, "\"", 1);
}

void gw_buf_free(gw_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int gw_resp_init(gw_resp *r, gw_endpoint ep, const char *uid, const char *model) {
    memset(r, 0, sizeof *r);
    r->ep = ep;
    snprintf(r->id, sizeof r->id, "%s-%s", ep == GW_EP_CHAT ? "chatcmpl" : "cmpl", uid);
    r->created = (long long)time(NULL);
    snprintf(r->model, sizeof r->model, "%s", model);
    gw_buf b = {0};
    gw_buf_str(&b, "data: {\"id\":");
    gw_buf_json_str(&b, r->id, strlen(r->id));
    char tmp[96];
    snprintf(tmp, sizeof tmp, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
             ep == GW_EP_CHAT ? "chat.completion.chunk" : "text_completion", r->created);
    gw_buf_str(&b, tmp);
    gw_buf_json_str(&b, r->model, strlen(r->model));
    gw_buf_str(&b, ",\"choices\":[{\"index\":0,");
    if (b.failed) {
        gw_buf_free(&b);
        return -1;
    }
    r->chunk_pre = b.p;
    return 0;
}

void gw_resp_free(gw_resp *r) {
    free(r->chunk_pre);
    r->chunk_pre = NULL;
}

static char *s_dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *gw_encode_error(const gw_error *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message, "type", e->type[0] ? e->type : "error",
                            "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code[0] ? json_string(e->code) : json_null());
    return s_dump(err ? json_pack("{s:o}", "error", err) : NULL);
}

static json_t *s_usage(uint32_t p, uint32_t c) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)p + c);
}

/* a JSON string of s[n]; bytes that are not valid UTF-8 become U+FFFD (jansson refuses them) */
static json_t *s_jstring(const char *s, size_t n) {
    json_t *t = json_stringn(s, n);
    if (t) return t;
    gw_buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = s_utf8_len(u + i, n - i);
        if (k) gw_buf_add(&b, s + i, k);
        else gw_buf_add(&b, "\xef\xbf\xbd", 3);
        i += k ? k : 1;
    }
    t = b.failed ? NULL : json_stringn(b.p ? b.p : "", b.n);
    gw_buf_free(&b);
    return t;
}

char *gw_encode_full(const gw_resp *r, const char *text, size_t text_n, const char *finish, uint32_t prompt_tokens,
                     uint32_t completion_tokens) {
    json_t *t = s_jstring(text, text_n);
    json_t *choice;
    if (r->ep == GW_EP_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content",
                           t, "refusal", json_null(), "logprobs", "finish_reason", finish);
    else choice = json_pack("{s:o, s:i, s:n, s:s}", "text", t, "index", 0, "logprobs", "finish_reason", finish);
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->id, "object",
                  r->ep == GW_EP_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)r->created,
                  "model", r->model, "choices", choice, "usage", s_usage(prompt_tokens, completion_tokens));
    return s_dump(o);
}

int gw_sse_delta(gw_buf *b, const gw_resp *r, const char *text, size_t n, int first) {
    gw_buf_str(b, r->chunk_pre);
    if (r->ep == GW_EP_CHAT)
        gw_buf_str(b, first ? "\"delta\":{\"role\":\"assistant\",\"content\":" : "\"delta\":{\"content\":");
    else gw_buf_str(b, "\"text\":");
    gw_buf_json_str(b, text, n);
    return gw_buf_str(b, r->ep == GW_EP_CHAT ? "},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                                             : ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

int gw_sse_finish(gw_buf *b, const gw_resp *r, const char *finish) {
    gw_buf_str(b, r->chunk_pre);
    gw_buf_str(b, r->ep == GW_EP_CHAT ? "\"delta\":{},\"logprobs\":null,\"finish_reason\":"
                                      : "\"text\":\"\",\"logprobs\":null,\"finish_reason\":");
    gw_buf_json_str(b, finish, strlen(finish));
    return gw_buf_str(b, "}]}\n\n");
}

int gw_sse_usage(gw_buf *b, const gw_resp *r, uint32_t prompt_tokens, uint32_t completion_tokens) {
    /* chunk_pre ends inside the choices array: write this chunk's own head */
    char tmp[160];
    gw_buf_str(b, "data: {\"id\":");
    gw_buf_json_str(b, r->id, strlen(r->id));
    snprintf(tmp, sizeof tmp, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
             r->ep == GW_EP_CHAT ? "chat.completion.chunk" : "text_completion", r->created);
    gw_buf_str(b, tmp);
    gw_buf_json_str(b, r->model, strlen(r->model));
    snprintf(tmp, sizeof tmp,
             ",\"choices\":[],\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%llu}}\n\n",
             prompt_tokens, completion_tokens, (unsigned long long)prompt_tokens + completion_tokens);
    return gw_buf_str(b, tmp);
}

int gw_sse_error(gw_buf *b, const gw_error *e) {
    char *s = gw_encode_error(e);
    if (!s) {
        b->failed = 1;
        return -1;
    }
    gw_buf_str(b, "data: ");
    gw_buf_str(b, s);
    free(s);
    return gw_buf_str(b, "\n\n");
}

int gw_sse_done(gw_buf *b) { return gw_buf_str(b, "data: [DONE]\n\n"); }
