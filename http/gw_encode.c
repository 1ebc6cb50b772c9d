/* http/gw_encode.c: OpenAI response bodies and SSE chunks (see gw_encode.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include "gw_encode.h"
#include "tokenizer.h"

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
    gw_buf_str(&b, ",\"choices\":[{\"index\":");
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

json_t *gw_encode_choice(const gw_resp *r, uint32_t index, const char *text, size_t text_n, const char *finish,
                         json_t *logprobs) {
    json_t *t = s_jstring(text, text_n);
    json_t *lp = logprobs ? logprobs : json_null();
    if (r->ep == GW_EP_CHAT)
        return json_pack("{s:I, s:{s:s, s:o, s:o}, s:o, s:s}", "index", (json_int_t)index, "message", "role",
                         "assistant", "content", t, "refusal", json_null(), "logprobs", lp, "finish_reason", finish);
    return json_pack("{s:o, s:I, s:o, s:s}", "text", t, "index", (json_int_t)index, "logprobs", lp, "finish_reason",
                     finish);
}

char *gw_encode_full(const gw_resp *r, json_t *choices, uint32_t prompt_tokens, uint32_t completion_tokens,
                     json_t *prompt_logprobs) {
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                  r->ep == GW_EP_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)r->created,
                  "model", r->model, "choices", choices, "usage", s_usage(prompt_tokens, completion_tokens));
    if (o && prompt_logprobs) json_object_set(o, "prompt_logprobs", prompt_logprobs);
    json_decref(prompt_logprobs);
    return s_dump(o);
}

/* a logprob as JSON: -inf (no candidate) as -9999.0, OpenAI's value for it */
static json_t *s_lpval(float x) { return json_real(x == -INFINITY || x < -9999.0f ? -9999.0 : (double)x); }

/* token id's text (malloc'd, *n bytes, exact bytes) by tok, or "token_id:ID". first: the completion's first text,
 * where SentencePiece drops its leading space (as the broker's text does); elsewhere a piece's leading space
 * stays */
static char *s_token_text(const void *tok, int32_t id, int first, size_t *n) {
    if (tok && id >= 0 && id < tokenizer_n_vocab(tok)) {
        char *t = tokenizer_decode_len(tok, &id, 1, 1, n);
        size_t pn = 0;
        const char *piece = tokenizer_token_text(tok, id, &pn);
        if (t && !first && tokenizer_is_spm(tok) && piece && pn >= 3 && !memcmp(piece, "\xe2\x96\x81", 3) &&
            (*n == 0 || t[0] != ' ')) {
            char *u = malloc(*n + 2);
            if (u) {
                u[0] = ' ';
                memcpy(u + 1, t, *n + 1);
                *n += 1;
            }
            free(t);
            t = u;
        }
        if (t) return t;
    }
    char *t = malloc(32);
    if (t) *n = (size_t)snprintf(t, 32, "token_id:%d", (int)id);
    return t;
}

/* [bytes] of s[n] */
static json_t *s_bytes(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

json_t *gw_encode_logprobs(const gw_resp *r, const void *tok, const int32_t *ids, const proto_logprob *lps, uint32_t n,
                           size_t *text_off) {
    const int chat = r->ep == GW_EP_CHAT;
    json_t *content = json_array(), *tokens = json_array(), *tlps = json_array(), *tops = json_array(),
           *offs = json_array();
    int fail = !content || !tokens || !tlps || !tops || !offs;
    for (uint32_t i = 0; !fail && i < n; i++) {
        const proto_logprob *lp = &lps[i];
        const int first = *text_off == 0;
        size_t tn = 0;
        char *tt = s_token_text(tok, ids[i], first, &tn);
        if (!tt) {
            fail = 1;
            break;
        }
        if (chat) {
            json_t *alts = json_array();
            for (uint32_t k = 0; alts && lp->present && k < lp->n_top; k++) {
                size_t an = 0;
                char *at = s_token_text(tok, lp->top_id[k], first, &an);
                if (at)
                    json_array_append_new(alts, json_pack("{s:o, s:o, s:o}", "token", s_jstring(at, an), "logprob",
                                                          s_lpval(lp->top_logprob[k]), "bytes", s_bytes(at, an)));
                free(at);
            }
            json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token", s_jstring(tt, tn), "logprob",
                                                     lp->present ? s_lpval(lp->logprob) : json_null(), "bytes",
                                                     s_bytes(tt, tn), "top_logprobs", alts ? alts : json_array()));
        } else {
            json_t *alts = json_object();
            for (uint32_t k = 0; alts && lp->present && k < lp->n_top; k++) {
                size_t an = 0;
                char *at = s_token_text(tok, lp->top_id[k], first, &an);
                json_t *key = at ? s_jstring(at, an) : NULL;
                if (key && !json_object_get(alts, json_string_value(key)))
                    json_object_set_new(alts, json_string_value(key), s_lpval(lp->top_logprob[k]));
                json_decref(key);
                free(at);
            }
            json_array_append_new(tokens, s_jstring(tt, tn));
            json_array_append_new(tlps, lp->present ? s_lpval(lp->logprob) : json_null());
            if (!lp->present) json_decref(alts); /* a position nothing precedes, or a token without logprobs */
            json_array_append_new(tops, alts && lp->present ? alts : json_null());
            json_array_append_new(offs, json_integer((json_int_t)*text_off));
        }
        *text_off += tn;
        free(tt);
    }
    json_t *o = NULL;
    if (!fail && chat) {
        o = json_pack("{s:O, s:n}", "content", content, "refusal");
    } else if (!fail) {
        o = json_pack("{s:O, s:O, s:O, s:O}", "tokens", tokens, "token_logprobs", tlps, "top_logprobs", tops,
                      "text_offset", offs);
    }
    json_decref(content);
    json_decref(tokens);
    json_decref(tlps);
    json_decref(tops);
    json_decref(offs);
    return o;
}

int gw_token_space(const void *tok, int32_t id) {
    size_t pn = 0;
    const char *piece = tok && id >= 0 && id < tokenizer_n_vocab(tok) ? tokenizer_token_text(tok, id, &pn) : NULL;
    return piece && tokenizer_is_spm(tok) && pn >= 3 && !memcmp(piece, "\xe2\x96\x81", 3);
}

int gw_logprobs_concat(json_t *a, const json_t *b) {
    static const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int i = 0; i < 4; i++) {
        json_t *x = json_object_get(a, keys[i]), *y = json_object_get(b, keys[i]);
        if (!x || !y || json_array_extend(x, y) != 0) return -1;
    }
    return 0;
}

/* {"logprob", "rank", "decoded_token"} of one id (rank <= 0: null) */
static json_t *s_plp_entry(const void *tok, int32_t id, float lp, int rank) {
    size_t n = 0;
    char *t = s_token_text(tok, id, 0, &n);
    json_t *o =
        json_pack("{s:o, s:o, s:o}", "logprob", s_lpval(lp), "rank", rank > 0 ? json_integer(rank) : json_null(),
                  "decoded_token", t ? s_jstring(t, n) : json_null());
    free(t);
    return o;
}

int gw_encode_prompt_logprobs(json_t *list, const void *tok, const int32_t *ids, const proto_logprob *lps, uint32_t n,
                              uint32_t k) {
    for (uint32_t i = 0; i < n; i++) {
        const proto_logprob *lp = &lps[i];
        if (!lp->present) {
            if (json_array_append_new(list, json_null()) != 0) return -1;
            continue;
        }
        json_t *o = json_object();
        if (!o) return -1;
        char key[16];
        int rank = 0;
        for (uint32_t j = 0; j < lp->n_top; j++)
            if (lp->top_id[j] == ids[i]) rank = (int)j + 1;
        snprintf(key, sizeof key, "%d", (int)ids[i]);
        json_object_set_new(o, key, s_plp_entry(tok, ids[i], lp->logprob, rank));
        for (uint32_t j = 0; j < lp->n_top && j < k; j++) {
            snprintf(key, sizeof key, "%d", (int)lp->top_id[j]);
            if (!json_object_get(o, key))
                json_object_set_new(o, key, s_plp_entry(tok, lp->top_id[j], lp->top_logprob[j], (int)j + 1));
        }
        if (json_array_append_new(list, o) != 0) return -1;
    }
    return 0;
}

/* appends `N,` (the choice index after chunk_pre) */
static void s_index(gw_buf *b, uint32_t index) {
    char tmp[16];
    snprintf(tmp, sizeof tmp, "%u,", index);
    gw_buf_str(b, tmp);
}

/* appends logprobs (taken) as JSON, or null */
static void s_lp_add(gw_buf *b, json_t *logprobs) {
    char *s = logprobs ? json_dumps(logprobs, JSON_COMPACT) : NULL;
    if (logprobs && !s) b->failed = 1;
    gw_buf_str(b, s ? s : "null");
    free(s);
    json_decref(logprobs);
}

int gw_sse_delta(gw_buf *b, const gw_resp *r, uint32_t index, const char *text, size_t n, int first, json_t *logprobs) {
    gw_buf_str(b, r->chunk_pre);
    s_index(b, index);
    if (r->ep == GW_EP_CHAT)
        gw_buf_str(b, first ? "\"delta\":{\"role\":\"assistant\",\"content\":" : "\"delta\":{\"content\":");
    else gw_buf_str(b, "\"text\":");
    gw_buf_json_str(b, text, n);
    gw_buf_str(b, r->ep == GW_EP_CHAT ? "},\"logprobs\":" : ",\"logprobs\":");
    s_lp_add(b, logprobs);
    return gw_buf_str(b, ",\"finish_reason\":null}]}\n\n");
}

int gw_sse_finish(gw_buf *b, const gw_resp *r, uint32_t index, const char *finish) {
    gw_buf_str(b, r->chunk_pre);
    s_index(b, index);
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
