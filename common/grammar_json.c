/* common/grammar_json.c: a small strict JSON reader and writer for the schema translator (the common layer links
 * no JSON library). Bounded nesting; strings must be valid UTF-8; \u escapes are decoded, surrogate pairs joined,
 * a lone surrogate refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

typedef struct {
    const char *s, *end, *beg;
    char *err;
    size_t errlen;
    int failed;
} s_rd;

static void s_fail(s_rd *r, const char *msg) {
    if (r->failed) return;
    r->failed = 1;
    snprintf(r->err, r->errlen, "json_schema: invalid JSON: %s at offset %ld", msg, (long)(r->s - r->beg));
}

static void s_ws(s_rd *r) {
    while (r->s < r->end && (*r->s == ' ' || *r->s == '\t' || *r->s == '\n' || *r->s == '\r')) r->s++;
}

static int s_lit(s_rd *r, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(r->end - r->s) < n || memcmp(r->s, w, n) != 0) return 0;
    r->s += n;
    return 1;
}

static int s_hex4(s_rd *r, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        if (r->s >= r->end) return -1;
        char c = *r->s++;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static void s_put_utf8(zg_buf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) t[0] = (char)cp, n = 1;
    else if (cp < 0x800) t[0] = (char)(0xC0 | cp >> 6), t[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        t[0] = (char)(0xE0 | cp >> 12), t[1] = (char)(0x80 | (cp >> 6 & 0x3F)), t[2] = (char)(0x80 | (cp & 0x3F)),
        n = 3;
    else
        t[0] = (char)(0xF0 | cp >> 18), t[1] = (char)(0x80 | (cp >> 12 & 0x3F)), t[2] = (char)(0x80 | (cp >> 6 & 0x3F)),
        t[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    zg_buf_put(b, t, n);
}

/* a string after its opening quote, decoded into *out */
static int s_string(s_rd *r, char **out, size_t *len) {
    zg_buf b = {0};
    zg_buf_put(&b, "", 0);
    for (;;) {
        if (r->s >= r->end) {
            s_fail(r, "unterminated string");
            goto fail;
        }
        unsigned char c = (unsigned char)*r->s;
        if (c == '"') {
            r->s++;
            break;
        }
        if (c < 0x20) {
            s_fail(r, "control character in a string");
            goto fail;
        }
        if (c == '\\') {
            r->s++;
            if (r->s >= r->end) {
                s_fail(r, "unterminated escape");
                goto fail;
            }
            char e = *r->s++;
            uint32_t cp;
            switch (e) {
            case '"':
            case '\\':
            case '/': zg_buf_put(&b, &e, 1); break;
            case 'b': zg_buf_put(&b, "\b", 1); break;
            case 'f': zg_buf_put(&b, "\f", 1); break;
            case 'n': zg_buf_put(&b, "\n", 1); break;
            case 'r': zg_buf_put(&b, "\r", 1); break;
            case 't': zg_buf_put(&b, "\t", 1); break;
            case 'u':
                if (s_hex4(r, &cp) != 0) {
                    s_fail(r, "bad \\u escape");
                    goto fail;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (!s_lit(r, "\\u") || s_hex4(r, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
                        s_fail(r, "lone surrogate");
                        goto fail;
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    s_fail(r, "lone surrogate");
                    goto fail;
                }
                s_put_utf8(&b, cp);
                break;
            default: s_fail(r, "bad escape"); goto fail;
            }
            continue;
        }
        size_t i = 0;
        if (zg_utf8_next(r->s, (size_t)(r->end - r->s), &i) < 0) {
            s_fail(r, "invalid UTF-8");
            goto fail;
        }
        zg_buf_put(&b, r->s, i);
        r->s += i;
    }
    if (b.oom) {
        s_fail(r, "out of memory");
        goto fail;
    }
    *out = b.p;
    *len = b.n;
    return 0;
fail:
    free(b.p);
    return -1;
}

static zj_value *s_value(s_rd *r, int depth);

static int s_add(zj_value *v, zj_value *item, char *key) {
    if ((v->n & (v->n - 1)) == 0) { /* grow at powers of two */
        size_t cap = v->n ? (size_t)v->n * 2 : 1;
        zj_value **it = realloc(v->items, cap * sizeof *it);
        if (!it) return -1;
        v->items = it;
        if (v->type == ZJ_OBJECT) {
            char **k = realloc(v->keys, cap * sizeof *k);
            if (!k) return -1;
            v->keys = k;
        }
    }
    v->items[v->n] = item;
    if (v->type == ZJ_OBJECT) v->keys[v->n] = key;
    v->n++;
    return 0;
}

static zj_value *s_value(s_rd *r, int depth) {
    s_ws(r);
    if (r->s >= r->end) {
        s_fail(r, "unexpected end");
        return NULL;
    }
    if (depth > ZG_MAX_DEPTH) {
        s_fail(r, "nested too deep");
        return NULL;
    }
    zj_value *v = calloc(1, sizeof *v);
    if (!v) {
        s_fail(r, "out of memory");
        return NULL;
    }
    char c = *r->s;
    if (s_lit(r, "null")) v->type = ZJ_NULL;
    else if (s_lit(r, "true")) v->type = ZJ_TRUE;
    else if (s_lit(r, "false")) v->type = ZJ_FALSE;
    else if (c == '"') {
        r->s++;
        v->type = ZJ_STRING;
        if (s_string(r, &v->str, &v->slen) != 0) goto fail;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        const char *b = r->s;
        if (*r->s == '-') r->s++;
        if (r->s < r->end && *r->s == '0') r->s++;
        else if (r->s < r->end && *r->s >= '1' && *r->s <= '9')
            while (r->s < r->end && *r->s >= '0' && *r->s <= '9') r->s++;
        else {
            s_fail(r, "bad number");
            goto fail;
        }
        if (r->s < r->end && *r->s == '.') {
            r->s++;
            if (r->s >= r->end || *r->s < '0' || *r->s > '9') {
                s_fail(r, "bad number");
                goto fail;
            }
            while (r->s < r->end && *r->s >= '0' && *r->s <= '9') r->s++;
        }
        if (r->s < r->end && (*r->s == 'e' || *r->s == 'E')) {
            r->s++;
            if (r->s < r->end && (*r->s == '+' || *r->s == '-')) r->s++;
            if (r->s >= r->end || *r->s < '0' || *r->s > '9') {
                s_fail(r, "bad number");
                goto fail;
            }
            while (r->s < r->end && *r->s >= '0' && *r->s <= '9') r->s++;
        }
        v->type = ZJ_NUMBER;
        v->slen = (size_t)(r->s - b);
        v->str = malloc(v->slen + 1);
        if (!v->str) {
            s_fail(r, "out of memory");
            goto fail;
        }
        memcpy(v->str, b, v->slen);
        v->str[v->slen] = 0;
        v->num = strtod(v->str, NULL);
    } else if (c == '[' || c == '{') {
        int obj = c == '{';
        v->type = obj ? ZJ_OBJECT : ZJ_ARRAY;
        r->s++;
        s_ws(r);
        if (r->s < r->end && *r->s == (obj ? '}' : ']')) {
            r->s++;
            return v;
        }
        for (;;) {
            char *key = NULL;
            if (obj) {
                s_ws(r);
                size_t kl;
                if (r->s >= r->end || *r->s != '"') {
                    s_fail(r, "expected a key");
                    goto fail;
                }
                r->s++;
                if (s_string(r, &key, &kl) != 0) goto fail;
                s_ws(r);
                if (r->s >= r->end || *r->s != ':') {
                    free(key);
                    s_fail(r, "expected ':'");
                    goto fail;
                }
                r->s++;
            }
            zj_value *item = s_value(r, depth + 1);
            if (!item || s_add(v, item, key) != 0) {
                zj_free(item);
                free(key);
                s_fail(r, "out of memory");
                goto fail;
            }
            s_ws(r);
            if (r->s < r->end && *r->s == ',') {
                r->s++;
                continue;
            }
            if (r->s < r->end && *r->s == (obj ? '}' : ']')) {
                r->s++;
                break;
            }
            s_fail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            goto fail;
        }
    } else {
        s_fail(r, "unexpected character");
        goto fail;
    }
    return v;
fail:
    zj_free(v);
    return NULL;
}

zj_value *zj_parse(const char *text, size_t len, char *err, size_t errlen) {
    s_rd r = {text, text + len, text, err, errlen, 0};
    zj_value *v = s_value(&r, 0);
    if (!v) return NULL;
    s_ws(&r);
    if (r.s != r.end) {
        s_fail(&r, "trailing characters");
        zj_free(v);
        return NULL;
    }
    return v;
}

void zj_free(zj_value *v) {
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        zj_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

zj_value *zj_get(const zj_value *obj, const char *key) {
    if (!obj || obj->type != ZJ_OBJECT) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

static void s_write_str(const char *s, size_t n, zg_buf *out) {
    zg_buf_put(out, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') zg_buf_put(out, "\\\"", 2);
        else if (c == '\\') zg_buf_put(out, "\\\\", 2);
        else if (c < 0x20 || c == 0x7F) zg_buf_fmt(out, "\\u%04x", c);
        else zg_buf_put(out, s + i, 1);
    }
    zg_buf_put(out, "\"", 1);
}

void zj_write(const zj_value *v, zg_buf *out) {
    switch (v->type) {
    case ZJ_NULL: zg_buf_str(out, "null"); break;
    case ZJ_TRUE: zg_buf_str(out, "true"); break;
    case ZJ_FALSE: zg_buf_str(out, "false"); break;
    case ZJ_NUMBER: zg_buf_put(out, v->str, v->slen); break;
    case ZJ_STRING: s_write_str(v->str, v->slen, out); break;
    default:
        zg_buf_str(out, v->type == ZJ_OBJECT ? "{" : "[");
        for (int i = 0; i < v->n; i++) {
            if (i) zg_buf_str(out, ",");
            if (v->type == ZJ_OBJECT) {
                s_write_str(v->keys[i], strlen(v->keys[i]), out);
                zg_buf_str(out, ":");
            }
            zj_write(v->items[i], out);
        }
        zg_buf_str(out, v->type == ZJ_OBJECT ? "}" : "]");
    }
}
