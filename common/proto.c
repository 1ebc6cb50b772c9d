/* common/proto.c: zllm wire protocol codec (see proto.h, docs/protocol.md).
 * ---------------------------------------------------------------------------------------------------------
 * A small zero-copy msgpack reader/writer written for hostile input: msgpack-c's unpacker preallocates arrays
 * from declared counts, so it is not used for decoding. Layout of this file: arena -> writer -> reader ->
 * validator -> schema decoders -> encoders -> names. */
#include "proto.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------
 * arena: a bump allocator whose pointers never move during one decode; reset between decodes. */

#define ARENA_INITIAL (16u << 10)
#define ARENA_KEEP_MAX (1u << 20)   /* the base block grows to the last decode's need, up to this */

typedef struct arena_extra {
    struct arena_extra *next;
    /* payload follows, aligned to 16 by the struct padding below */
    max_align_t pad[];
} arena_extra;

struct proto_arena {
    uint8_t *base;              /* [cap] bytes of the base block */
    size_t cap, used;           /* bytes */
    size_t total;               /* bytes requested during the current decode (including extras) */
    arena_extra *extras;        /* blocks allocated when base was too small */
};

static void *arena_alloc(struct proto_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    a->total += n;
    if (a->cap - a->used >= n) {
        void *p = a->base + a->used;
        a->used += n;
        return p;
    }
    arena_extra *e = malloc(sizeof *e + n);
    if (!e) return NULL;
    e->next = a->extras;
    a->extras = e;
    return e->pad;
}

static int arena_reset(struct proto_arena *a) {
    while (a->extras) { arena_extra *e = a->extras; a->extras = e->next; free(e); }
    size_t want = a->total > a->cap ? a->total : a->cap;
    if (want < ARENA_INITIAL) want = ARENA_INITIAL;
    if (want > ARENA_KEEP_MAX) want = ARENA_KEEP_MAX;
    if (want != a->cap) {
        uint8_t *nb = realloc(a->base, want);
        if (nb) { a->base = nb; a->cap = want; }
        else if (!a->base) return -1;
    }
    a->used = 0;
    a->total = 0;
    return 0;
}

static void arena_free(struct proto_arena **pa) {
    if (!*pa) return;
    struct proto_arena *a = *pa;
    while (a->extras) { arena_extra *e = a->extras; a->extras = e->next; free(e); }
    free(a->base);
    free(a);
    *pa = NULL;
}

/* ---------------------------------------------------------------------------------------------------------
 * writer */

static int buf_reserve(proto_buf *b, size_t extra) {
    if (b->failed) return -1;
    if (b->cap - b->len >= extra) return 0;
    size_t nc = b->cap ? b->cap : 256;
    while (nc - b->len < extra) {
        if (nc > ((size_t)1 << 40)) { b->failed = 1; return -1; }
        nc *= 2;
    }
    uint8_t *nd = realloc(b->data, nc);
    if (!nd) { b->failed = 1; return -1; }
    b->data = nd;
    b->cap = nc;
    return 0;
}

static void w_bytes(proto_buf *b, const void *p, size_t n) {
    if (buf_reserve(b, n) != 0) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void w_be(proto_buf *b, uint8_t tag, uint64_t v, int nbytes) {
    uint8_t t[9];
    t[0] = tag;
    for (int i = 0; i < nbytes; i++) t[1 + i] = (uint8_t)(v >> (8 * (nbytes - 1 - i)));
    w_bytes(b, t, (size_t)nbytes + 1);
}

static void w_uint(proto_buf *b, uint64_t v) {
    if (v < 128) { uint8_t c = (uint8_t)v; w_bytes(b, &c, 1); }
    else if (v <= 0xff) w_be(b, 0xcc, v, 1);
    else if (v <= 0xffff) w_be(b, 0xcd, v, 2);
    else if (v <= 0xffffffffu) w_be(b, 0xce, v, 4);
    else w_be(b, 0xcf, v, 8);
}

static void w_int(proto_buf *b, int64_t v) {
    if (v >= 0) { w_uint(b, (uint64_t)v); return; }
    if (v >= -32) { uint8_t c = (uint8_t)(int8_t)v; w_bytes(b, &c, 1); }
    else if (v >= INT8_MIN) w_be(b, 0xd0, (uint64_t)(uint8_t)(int8_t)v, 1);
    else if (v >= INT16_MIN) w_be(b, 0xd1, (uint64_t)(uint16_t)(int16_t)v, 2);
    else if (v >= INT32_MIN) w_be(b, 0xd2, (uint64_t)(uint32_t)(int32_t)v, 4);
    else w_be(b, 0xd3, (uint64_t)v, 8);
}

static void w_f64(proto_buf *b, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    w_be(b, 0xcb, u, 8);
}

static void w_bool(proto_buf *b, int v) { uint8_t c = v ? 0xc3 : 0xc2; w_bytes(b, &c, 1); }

static void w_strn(proto_buf *b, const char *p, size_t n) {
    if (n < 32) { uint8_t c = (uint8_t)(0xa0 | n); w_bytes(b, &c, 1); }
    else if (n <= 0xff) w_be(b, 0xd9, n, 1);
    else if (n <= 0xffff) w_be(b, 0xda, n, 2);
    else w_be(b, 0xdb, n, 4);
    w_bytes(b, p, n);
}
static void w_str(proto_buf *b, proto_str s) { w_strn(b, s.p ? s.p : "", s.p ? s.n : 0); }
static void w_key(proto_buf *b, const char *k) { w_strn(b, k, strlen(k)); }

static void w_map(proto_buf *b, uint32_t n) {
    if (n < 16) { uint8_t c = (uint8_t)(0x80 | n); w_bytes(b, &c, 1); }
    else if (n <= 0xffff) w_be(b, 0xde, n, 2);
    else w_be(b, 0xdf, n, 4);
}
static void w_arr(proto_buf *b, uint32_t n) {
    if (n < 16) { uint8_t c = (uint8_t)(0x90 | n); w_bytes(b, &c, 1); }
    else if (n <= 0xffff) w_be(b, 0xdc, n, 2);
    else w_be(b, 0xdd, n, 4);
}

/* header: map of n_fields + 2 with zllm and type */
static void w_head(proto_buf *b, uint32_t n_fields, const char *type) {
    b->len = 0;
    b->failed = 0;
    w_map(b, n_fields + 2);
    w_key(b, "zllm"); w_uint(b, PROTO_VERSION);
    w_key(b, "type"); w_key(b, type);
}

static void w_i32arr(proto_buf *b, const int32_t *v, uint32_t n) {
    w_arr(b, n);
    for (uint32_t i = 0; i < n; i++) w_int(b, v[i]);
}

/* ---------------------------------------------------------------------------------------------------------
 * reader: every read checks the bytes remaining */

typedef struct {
    const uint8_t *p, *end;
} rd;

enum { K_BAD = 0, K_NIL, K_BOOL, K_UINT, K_NINT, K_FLOAT, K_STR, K_BIN, K_ARR, K_MAP, K_EXT };

static int rd_kind(const rd *r) {
    if (r->p >= r->end) return K_BAD;
    uint8_t c = *r->p;
    if (c <= 0x7f) return K_UINT;
    if (c <= 0x8f) return K_MAP;
    if (c <= 0x9f) return K_ARR;
    if (c <= 0xbf) return K_STR;
    if (c >= 0xe0) return K_NINT;
    switch (c) {
    case 0xc0: return K_NIL;
    case 0xc2: case 0xc3: return K_BOOL;
    case 0xc4: case 0xc5: case 0xc6: return K_BIN;
    case 0xc7: case 0xc8: case 0xc9: case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: return K_EXT;
    case 0xca: case 0xcb: return K_FLOAT;
    case 0xcc: case 0xcd: case 0xce: case 0xcf: return K_UINT;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return K_NINT; /* signed forms: value checked on read */
    case 0xd9: case 0xda: case 0xdb: return K_STR;
    case 0xdc: case 0xdd: return K_ARR;
    case 0xde: case 0xdf: return K_MAP;
    default: return K_BAD; /* 0xc1 never used */
    }
}

static int rd_be(rd *r, int nbytes, uint64_t *v) {
    if (r->end - r->p < nbytes) return -1;
    uint64_t x = 0;
    for (int i = 0; i < nbytes; i++) x = (x << 8) | r->p[i];
    r->p += nbytes;
    *v = x;
    return 0;
}

/* any integer form -> signed 64 with a flag for values above INT64_MAX */
static int rd_integer(rd *r, int64_t *sv, uint64_t *uv, int *is_neg) {
    if (r->p >= r->end) return -1;
    uint8_t c = *r->p++;
    uint64_t x;
    *is_neg = 0;
    if (c <= 0x7f) { *uv = c; *sv = c; return 0; }
    if (c >= 0xe0) { *sv = (int8_t)c; *is_neg = 1; *uv = 0; return 0; }
    switch (c) {
    case 0xcc: if (rd_be(r, 1, &x)) return -1; break;
    case 0xcd: if (rd_be(r, 2, &x)) return -1; break;
    case 0xce: if (rd_be(r, 4, &x)) return -1; break;
    case 0xcf: if (rd_be(r, 8, &x)) return -1; break;
    case 0xd0: if (rd_be(r, 1, &x)) return -1; *sv = (int8_t)(uint8_t)x; goto signed_;
    case 0xd1: if (rd_be(r, 2, &x)) return -1; *sv = (int16_t)(uint16_t)x; goto signed_;
    case 0xd2: if (rd_be(r, 4, &x)) return -1; *sv = (int32_t)(uint32_t)x; goto signed_;
    case 0xd3: if (rd_be(r, 8, &x)) return -1; *sv = (int64_t)x; goto signed_;
    default: r->p--; return -1;
    }
    *uv = x;
    *sv = x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x;
    return 0;
signed_:
    *is_neg = *sv < 0;
    *uv = *sv < 0 ? 0 : (uint64_t)*sv;
    return 0;
}

static int rd_uint(rd *r, uint64_t *v) {
    int64_t s; uint64_t u; int neg;
    const uint8_t *save = r->p;
    if (rd_integer(r, &s, &u, &neg) != 0 || neg) { r->p = save; return -1; }
    *v = u;
    return 0;
}

static int rd_int(rd *r, int64_t *v) {
    int64_t s; uint64_t u; int neg;
    const uint8_t *save = r->p;
    if (rd_integer(r, &s, &u, &neg) != 0) { r->p = save; return -1; }
    if (!neg && u > (uint64_t)INT64_MAX) { r->p = save; return -1; }
    *v = s;
    return 0;
}

static int rd_float(rd *r, double *d) {
    if (r->p >= r->end) return -1;
    uint8_t c = *r->p;
    uint64_t x;
    if (c == 0xca) {
        r->p++;
        if (rd_be(r, 4, &x)) { r->p--; return -1; }
        uint32_t u = (uint32_t)x; float f;
        memcpy(&f, &u, 4);
        *d = f;
        return 0;
    }
    if (c == 0xcb) {
        r->p++;
        if (rd_be(r, 8, &x)) { r->p--; return -1; }
        memcpy(d, &x, 8);
        return 0;
    }
    int64_t s; uint64_t u; int neg;
    const uint8_t *save = r->p;
    if (rd_integer(r, &s, &u, &neg) != 0) { r->p = save; return -1; }
    *d = neg ? (double)s : (double)u;
    return 0;
}

static int rd_bool(rd *r, int *v) {
    if (r->p >= r->end) return -1;
    if (*r->p == 0xc2 || *r->p == 0xc3) { *v = *r->p == 0xc3; r->p++; return 0; }
    return -1;
}

static int rd_nil(rd *r) {
    if (r->p < r->end && *r->p == 0xc0) { r->p++; return 1; }
    return 0;
}

static int rd_str(rd *r, proto_str *s) {
    if (r->p >= r->end) return -1;
    uint8_t c = *r->p;
    uint64_t n;
    const uint8_t *save = r->p;
    r->p++;
    if (c >= 0xa0 && c <= 0xbf) n = c & 0x1f;
    else if (c == 0xd9) { if (rd_be(r, 1, &n)) goto bad; }
    else if (c == 0xda) { if (rd_be(r, 2, &n)) goto bad; }
    else if (c == 0xdb) { if (rd_be(r, 4, &n)) goto bad; }
    else goto bad;
    if ((uint64_t)(r->end - r->p) < n) goto bad;
    s->p = (const char *)r->p;
    s->n = (uint32_t)n;
    r->p += n;
    return 0;
bad:
    r->p = save;
    return -1;
}

static int rd_container(rd *r, int want_map, uint32_t *count) {
    if (r->p >= r->end) return -1;
    uint8_t c = *r->p;
    uint64_t n;
    const uint8_t *save = r->p;
    r->p++;
    if (want_map) {
        if (c >= 0x80 && c <= 0x8f) n = c & 0x0f;
        else if (c == 0xde) { if (rd_be(r, 2, &n)) goto bad; }
        else if (c == 0xdf) { if (rd_be(r, 4, &n)) goto bad; }
        else goto bad;
        if (n * 2 > (uint64_t)(r->end - r->p)) goto bad;
    } else {
        if (c >= 0x90 && c <= 0x9f) n = c & 0x0f;
        else if (c == 0xdc) { if (rd_be(r, 2, &n)) goto bad; }
        else if (c == 0xdd) { if (rd_be(r, 4, &n)) goto bad; }
        else goto bad;
        if (n > (uint64_t)(r->end - r->p)) goto bad;
    }
    *count = (uint32_t)n;
    return 0;
bad:
    r->p = save;
    return -1;
}
static int rd_map(rd *r, uint32_t *n) { return rd_container(r, 1, n); }
static int rd_arr(rd *r, uint32_t *n) { return rd_container(r, 0, n); }

/* skips one object; depth is the number of enclosing containers allowed below this one */
static int rd_skip(rd *r, int depth) {
    if (r->p >= r->end) return -1;
    uint8_t c = *r->p;
    uint64_t n;
    int k = rd_kind(r);
    switch (k) {
    case K_NIL: case K_BOOL: r->p++; return 0;
    case K_UINT: case K_NINT: { int64_t s; uint64_t u; int neg; return rd_integer(r, &s, &u, &neg); }
    case K_FLOAT: { double d; return rd_float(r, &d); }
    case K_STR: { proto_str s; return rd_str(r, &s); }
    case K_BIN: {
        r->p++;
        if (rd_be(r, c == 0xc4 ? 1 : c == 0xc5 ? 2 : 4, &n)) return -1;
        if ((uint64_t)(r->end - r->p) < n) return -1;
        r->p += n;
        return 0;
    }
    case K_EXT: {
        r->p++;
        if (c >= 0xd4 && c <= 0xd8) n = (uint64_t)1 << (c - 0xd4);
        else if (rd_be(r, c == 0xc7 ? 1 : c == 0xc8 ? 2 : 4, &n)) return -1;
        if ((uint64_t)(r->end - r->p) < n + 1) return -1;  /* type byte + data */
        r->p += n + 1;
        return 0;
    }
    case K_ARR: case K_MAP: {
        uint32_t cnt;
        if (depth <= 0) return -1;
        if (rd_container(r, k == K_MAP, &cnt)) return -1;
        uint64_t items = k == K_MAP ? (uint64_t)cnt * 2 : cnt;
        for (uint64_t i = 0; i < items; i++)
            if (rd_skip(r, depth - 1)) return -1;
        return 0;
    }
    default: return -1;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * validator */

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int proto_msgpack_validate(const void *buf, size_t len, int max_depth, char *err, size_t errlen) {
    if (!buf && len) { set_err(err, errlen, "null buffer"); return -1; }
    if (len == 0) { set_err(err, errlen, "empty frame"); return -1; }
    rd r = { buf, (const uint8_t *)buf + len };
    if (rd_skip(&r, max_depth) != 0) {
        set_err(err, errlen, "invalid msgpack (truncated, bad length, or nesting deeper than %d)", max_depth);
        return -1;
    }
    if (r.p != r.end) {
        set_err(err, errlen, "%zu trailing bytes after the message", (size_t)(r.end - r.p));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * schema decoding helpers */

typedef struct {
    rd r;
    struct proto_arena *a;
    char *err;
    size_t errlen;
} dec;

#define FAIL(...) do { set_err(d->err, d->errlen, __VA_ARGS__); return -1; } while (0)

static int key_is(proto_str k, const char *s) {
    size_t n = strlen(s);
    return k.n == n && memcmp(k.p, s, n) == 0;
}

static int utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s, *e = p + n;
    while (p < e) {
        uint8_t c = *p;
        if (c < 0x80) { p++; continue; }
        int len; uint32_t cp;
        if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (e - p < len) return 0;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        p += len;
    }
    return 1;
}

static int d_str(dec *d, const char *name, proto_str *s, uint32_t min, uint32_t max, int utf8) {
    if (rd_str(&d->r, s)) FAIL("%s: expected a string", name);
    if (s->n < min || s->n > max) FAIL("%s: length %u outside %u..%u", name, s->n, min, max);
    if (utf8 && !utf8_valid(s->p, s->n)) FAIL("%s: invalid UTF-8", name);
    return 0;
}

static int d_u64(dec *d, const char *name, uint64_t *v, uint64_t min, uint64_t max) {
    if (rd_uint(&d->r, v)) FAIL("%s: expected a non-negative integer", name);
    if (*v < min || *v > max) FAIL("%s: %llu outside %llu..%llu", name, (unsigned long long)*v,
                                   (unsigned long long)min, (unsigned long long)max);
    return 0;
}

static int d_u32(dec *d, const char *name, uint32_t *v, uint32_t min, uint32_t max) {
    uint64_t x;
    if (d_u64(d, name, &x, min, max)) return -1;
    *v = (uint32_t)x;
    return 0;
}

/* float in [lo,hi] with open ends when lo_open/hi_open */
/* float fields are stored as float: the range is checked on the rounded value (a tiny double must not pass
 * "> 0" and then become 0) */
static int d_float(dec *d, const char *name, double *v, double lo, int lo_open, double hi, int hi_open) {
    if (rd_float(&d->r, v)) FAIL("%s: expected a number", name);
    if (!isfinite(*v)) FAIL("%s: not finite", name);
    if (fabs(*v) > 3e38) FAIL("%s: out of range", name);
    *v = (float)*v;
    if (*v < lo || (lo_open && *v == lo) || *v > hi || (hi_open && *v == hi))
        FAIL("%s: %g outside %c%g,%g%c", name, *v, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    return 0;
}

static int d_i32(dec *d, const char *name, int32_t *v, int32_t min, int32_t max) {
    int64_t x;
    if (rd_int(&d->r, &x)) FAIL("%s: expected an integer", name);
    if (x < min || x > max) FAIL("%s: %lld outside %d..%d", name, (long long)x, min, max);
    *v = (int32_t)x;
    return 0;
}

/* array of uint64 (at most max_n) into the arena */
static int d_u64arr(dec *d, const char *name, const uint64_t **out, uint32_t *n_out, uint32_t max_n) {
    uint32_t n;
    if (rd_arr(&d->r, &n)) FAIL("%s: expected an array", name);
    if (n > max_n) FAIL("%s: %u entries, at most %u", name, n, max_n);
    uint64_t *v = arena_alloc(d->a, (size_t)n * sizeof *v);
    if (!v) FAIL("%s: out of memory", name);
    for (uint32_t i = 0; i < n; i++)
        if (rd_uint(&d->r, &v[i])) FAIL("%s[%u]: expected a non-negative integer", name, i);
    *out = v;
    *n_out = n;
    return 0;
}

static int d_bool(dec *d, const char *name, int *v) {
    if (rd_bool(&d->r, v)) FAIL("%s: expected a bool", name);
    return 0;
}

/* array of ints in [lo,hi] into the arena */
static int d_i32arr(dec *d, const char *name, const int32_t **out, uint32_t *n_out, uint32_t max_n,
                    int64_t lo, int64_t hi) {
    uint32_t n;
    if (rd_arr(&d->r, &n)) FAIL("%s: expected an array", name);
    if (n > max_n) FAIL("%s: %u entries, at most %u", name, n, max_n);
    int32_t *v = arena_alloc(d->a, (size_t)n * sizeof *v);
    if (!v) FAIL("%s: out of memory", name);
    for (uint32_t i = 0; i < n; i++) {
        int64_t x;
        if (rd_int(&d->r, &x)) FAIL("%s[%u]: expected an integer", name, i);
        if (x < lo || x > hi) FAIL("%s[%u]: %lld outside %lld..%lld", name, i, (long long)x, (long long)lo,
                                   (long long)hi);
        v[i] = (int32_t)x;
    }
    *out = v;
    *n_out = n;
    return 0;
}

static int d_key(dec *d, proto_str *k) {
    if (rd_str(&d->r, k)) FAIL("map key is not a string");
    return 0;
}

static int d_skip(dec *d) {
    if (rd_skip(&d->r, PROTO_MAX_DEPTH)) FAIL("bad value");
    return 0;
}

static const char *const s_format_names[] = {"", "json_schema", "json_object", "regex", "grammar"};

const char *proto_format_name(int kind) { return kind > 0 && kind <= PROTO_FORMAT_GRAMMAR ? s_format_names[kind] : ""; }

/* response_format: {type: "json_schema" | "json_object" | "regex" | "grammar", text: string}; text required
 * except for json_object */
static int d_format(dec *d, proto_format *f) {
    uint32_t nk;
    proto_str type = {NULL, 0};
    if (rd_map(&d->r, &nk)) FAIL("response_format: expected a map");
    f->text.p = NULL;
    f->text.n = 0;
    for (uint32_t j = 0; j < nk; j++) {
        proto_str k;
        if (d_key(d, &k)) return -1;
        if (key_is(k, "type")) {
            if (d_str(d, "response_format.type", &type, 1, 32, 1)) return -1;
        } else if (key_is(k, "text")) {
            if (d_str(d, "response_format.text", &f->text, 0, PROTO_FORMAT_MAX_LEN, 1)) return -1;
        } else if (d_skip(d)) return -1;
    }
    f->kind = PROTO_FORMAT_NONE;
    for (int i = 1; i <= PROTO_FORMAT_GRAMMAR; i++)
        if (type.p && key_is(type, s_format_names[i])) f->kind = i;
    if (f->kind == PROTO_FORMAT_NONE) FAIL("response_format.type: expected json_schema, json_object, regex or grammar");
    if (f->kind != PROTO_FORMAT_JSON_OBJECT && !f->text.p)
        FAIL("response_format: %s needs text", s_format_names[f->kind]);
    return 0;
}

/* `logit_bias`: [[id, bias], ...] into the arena */
static int d_bias(dec *d, const proto_bias **out, uint32_t *n_out) {
    uint32_t n;
    if (rd_arr(&d->r, &n)) FAIL("logit_bias: expected an array of [id, bias]");
    if (n > PROTO_MAX_LOGIT_BIAS) FAIL("logit_bias: %u entries, at most %d", n, PROTO_MAX_LOGIT_BIAS);
    proto_bias *v = arena_alloc(d->a, (size_t)(n ? n : 1) * sizeof *v);
    if (!v) FAIL("logit_bias: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        uint32_t two;
        uint64_t id;
        double f;
        if (rd_arr(&d->r, &two) || two != 2) FAIL("logit_bias[%u]: expected [id, bias]", i);
        if (d_u64(d, "logit_bias id", &id, 0, PROTO_TOKEN_ID_MAX)) return -1;
        if (d_float(d, "logit_bias value", &f, -100, 0, 100, 0)) return -1;
        v[i].id = (int32_t)id;
        v[i].bias = (float)f;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* a logprob value: a number <= 0 (-inf allowed), never NaN */
static int d_lpval(dec *d, const char *name, float *out) {
    double f;
    if (rd_float(&d->r, &f)) FAIL("%s: expected a number", name);
    if (isnan(f) || f > 0) FAIL("%s: %g is not a log probability", name, f);
    *out = (float)f;
    return 0;
}

/* one logprobs entry: nil or [logprob, [ids], [logprobs]] (ids and logprobs of equal length <= 20) */
static int d_logprob(dec *d, proto_logprob *lp) {
    memset(lp, 0, sizeof *lp);
    if (rd_nil(&d->r)) return 0;
    uint32_t three, ni, nl;
    if (rd_arr(&d->r, &three) || three != 3) FAIL("logprobs: expected [logprob, [ids], [logprobs]]");
    if (d_lpval(d, "logprob", &lp->logprob)) return -1;
    const int32_t *ids;
    if (d_i32arr(d, "top ids", &ids, &ni, PROTO_MAX_TOP_LOGPROBS, 0, PROTO_TOKEN_ID_MAX)) return -1;
    if (rd_arr(&d->r, &nl) || nl != ni) FAIL("logprobs: top ids and logprobs differ in length");
    float *v = arena_alloc(d->a, (size_t)(nl ? nl : 1) * sizeof *v);
    if (!v) FAIL("logprobs: out of memory");
    for (uint32_t i = 0; i < nl; i++)
        if (d_lpval(d, "top logprob", &v[i])) return -1;
    lp->present = 1;
    lp->n_top = ni;
    lp->top_id = ids;
    lp->top_logprob = v;
    return 0;
}

/* an array of logprobs entries of at most max_n into the arena */
static int d_logprobs(dec *d, const char *name, const proto_logprob **out, uint32_t *n_out, uint32_t max_n) {
    uint32_t n;
    if (rd_arr(&d->r, &n)) FAIL("%s: expected an array", name);
    if (n > max_n) FAIL("%s: %u entries, at most %u", name, n, max_n);
    proto_logprob *v = arena_alloc(d->a, (size_t)(n ? n : 1) * sizeof *v);
    if (!v) FAIL("%s: out of memory", name);
    for (uint32_t i = 0; i < n; i++)
        if (d_logprob(d, &v[i])) return -1;
    *out = v;
    *n_out = n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * schema decoders: each loops over the top map's entries (after validation) */

typedef int (*field_fn)(dec *d, proto_str key, proto_msg *m);

/* sampling fields shared by generate and assign; returns 1 if key was one of them, 0 if not, -1 on error */
static int d_sampling(dec *d, proto_str k, proto_sampling *s) {
    double f;
    if (key_is(k, "temperature")) {
        if (d_float(d, "temperature", &f, 0, 0, 100, 0)) return -1;
        s->temperature = (float)f;
    } else if (key_is(k, "top_k")) {
        uint64_t v;
        if (d_u64(d, "top_k", &v, 0, INT32_MAX)) return -1;
        s->top_k = (int32_t)v;
    } else if (key_is(k, "top_p")) {
        if (d_float(d, "top_p", &f, 0, 1, 1, 0)) return -1;
        s->top_p = (float)f;
    } else if (key_is(k, "min_p")) {
        if (d_float(d, "min_p", &f, 0, 0, 1, 1)) return -1;
        s->min_p = (float)f;
    } else if (key_is(k, "repeat_penalty")) {
        if (d_float(d, "repeat_penalty", &f, 0, 1, 100, 0)) return -1;
        s->repeat_penalty = (float)f;
    } else if (key_is(k, "repeat_last_n")) {
        if (d_u32(d, "repeat_last_n", &s->repeat_last_n, 0, PROTO_MAX_TOKENS)) return -1;
    } else if (key_is(k, "seed")) {
        if (d_u64(d, "seed", &s->seed, 0, UINT64_MAX)) return -1;
        s->has_seed = 1;
    } else if (key_is(k, "ignore_eos")) {
        if (d_bool(d, "ignore_eos", &s->ignore_eos)) return -1;
    } else if (key_is(k, "presence_penalty")) {
        if (d_float(d, "presence_penalty", &f, -2, 0, 2, 0)) return -1;
        s->presence_penalty = (float)f;
    } else if (key_is(k, "frequency_penalty")) {
        if (d_float(d, "frequency_penalty", &f, -2, 0, 2, 0)) return -1;
        s->frequency_penalty = (float)f;
    } else if (key_is(k, "logit_bias")) {
        if (d_bias(d, &s->bias, &s->n_bias)) return -1;
    } else if (key_is(k, "logprobs")) {
        if (d_bool(d, "logprobs", &s->logprobs)) return -1;
    } else if (key_is(k, "top_logprobs")) {
        if (d_u32(d, "top_logprobs", &s->top_logprobs, 0, PROTO_MAX_TOP_LOGPROBS)) return -1;
    } else if (key_is(k, "prompt_logprobs")) {
        if (d_u32(d, "prompt_logprobs", &s->prompt_top, 0, PROTO_MAX_TOP_LOGPROBS)) return -1;
        s->prompt_lp = 1;
    } else {
        return 0;
    }
    return 1;
}

static int f_generate(dec *d, proto_str k, proto_msg *m) {
    proto_generate *g = &m->generate;
    int r = d_sampling(d, k, &g->sampling);
    if (r != 0) return r < 0 ? -1 : 0;
    if (key_is(k, "id")) return d_str(d, "id", &g->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "model")) return d_str(d, "model", &g->model, 1, PROTO_NAME_MAX, 0);
    if (key_is(k, "prompt")) {
        if (g->prompt_kind && g->prompt_kind != PROTO_PROMPT_TEXT) FAIL("more than one of prompt/tokens/messages");
        g->prompt_kind = PROTO_PROMPT_TEXT;
        return d_str(d, "prompt", &g->prompt, 0, PROTO_CLIENT_MAX_FRAME, 1);
    }
    if (key_is(k, "tokens")) {
        if (g->prompt_kind && g->prompt_kind != PROTO_PROMPT_TOKENS) FAIL("more than one of prompt/tokens/messages");
        g->prompt_kind = PROTO_PROMPT_TOKENS;
        return d_i32arr(d, "tokens", &g->tokens, &g->n_tokens, PROTO_MAX_TOKENS, 0, PROTO_TOKEN_ID_MAX);
    }
    if (key_is(k, "messages")) {
        if (g->prompt_kind && g->prompt_kind != PROTO_PROMPT_MESSAGES)
            FAIL("more than one of prompt/tokens/messages");
        g->prompt_kind = PROTO_PROMPT_MESSAGES;
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("messages: expected an array");
        if (n < 1 || n > PROTO_MAX_MESSAGES) FAIL("messages: %u entries, need 1..%u", n, PROTO_MAX_MESSAGES);
        proto_chat *c = arena_alloc(d->a, (size_t)n * sizeof *c);
        if (!c) FAIL("messages: out of memory");
        for (uint32_t i = 0; i < n; i++) {
            uint32_t nk;
            if (rd_map(&d->r, &nk)) FAIL("messages[%u]: expected a map", i);
            memset(&c[i], 0, sizeof c[i]);
            for (uint32_t j = 0; j < nk; j++) {
                proto_str kk;
                if (d_key(d, &kk)) return -1;
                if (key_is(kk, "role")) { if (d_str(d, "messages.role", &c[i].role, 1, 64, 1)) return -1; }
                else if (key_is(kk, "content")) {
                    if (d_str(d, "messages.content", &c[i].content, 0, PROTO_CLIENT_MAX_FRAME, 1)) return -1;
                } else if (key_is(kk, "tool_call_id")) {
                    if (d_str(d, "messages.tool_call_id", &c[i].tool_call_id, 0, 256, 1)) return -1;
                } else if (key_is(kk, "tool_calls")) {
                    if (d_str(d, "messages.tool_calls", &c[i].tool_calls, 0, PROTO_CLIENT_MAX_FRAME, 1)) return -1;
                } else if (d_skip(d)) return -1;
            }
            if (!c[i].role.p || !c[i].content.p) FAIL("messages[%u]: needs role and content", i);
        }
        g->messages = c;
        g->n_messages = n;
        return 0;
    }
    if (key_is(k, "max_tokens")) return d_u32(d, "max_tokens", &g->max_tokens, 0, PROTO_MAX_GEN); /* 0: below */
    if (key_is(k, "stop")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("stop: expected an array of strings");
        if (n > PROTO_MAX_STOP) FAIL("stop: %u strings, at most %d", n, PROTO_MAX_STOP);
        for (uint32_t i = 0; i < n; i++)
            if (d_str(d, "stop[]", &g->stop[i], 1, PROTO_STOP_MAX_LEN, 1)) return -1;
        g->n_stop = n;
        return 0;
    }
    if (key_is(k, "stop_ids"))
        return d_i32arr(d, "stop_ids", &g->stop_ids, &g->n_stop_ids, PROTO_MAX_STOP_IDS, 0, PROTO_TOKEN_ID_MAX);
    if (key_is(k, "n")) return d_u32(d, "n", &g->n, 1, PROTO_MAX_N);
    if (key_is(k, "stream")) return d_bool(d, "stream", &g->stream);
    if (key_is(k, "deadline_ms")) return d_u32(d, "deadline_ms", &g->deadline_ms, 1, 86400000u);
    if (key_is(k, "special")) return d_bool(d, "special", &g->special);
    if (key_is(k, "add_bos")) return d_bool(d, "add_bos", &g->add_bos);
    if (key_is(k, "response_format")) return d_format(d, &g->format);
    if (key_is(k, "priority")) return d_i32(d, "priority", &g->priority, PROTO_PRIORITY_MIN, PROTO_PRIORITY_MAX);
    return d_skip(d);
}

static int f_cancel(dec *d, proto_str k, proto_msg *m) {
    proto_cancel *c = &m->cancel;
    if (key_is(k, "id")) return d_str(d, "id", &c->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "rids")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("rids: expected an array");
        if (n > PROTO_MAX_SEQS) FAIL("rids: %u entries, at most %d", n, PROTO_MAX_SEQS);
        uint64_t *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("rids: out of memory");
        for (uint32_t i = 0; i < n; i++)
            if (d_u64(d, "rids[]", &v[i], 0, UINT64_MAX)) return -1;
        c->rids = v;
        c->n_rids = n;
        return 0;
    }
    return d_skip(d);
}

static int f_worker_info(dec *d, proto_worker_info *w) {
    uint32_t nk;
    if (rd_map(&d->r, &nk)) FAIL("workers[]: expected a map");
    for (uint32_t j = 0; j < nk; j++) {
        proto_str k;
        int rc = 0;
        if (d_key(d, &k)) return -1;
        if (key_is(k, "name")) rc = d_str(d, "name", &w->name, 0, PROTO_NAME_MAX, 0);
        else if (key_is(k, "model")) rc = d_str(d, "model", &w->model, 0, PROTO_NAME_MAX, 0);
        else if (key_is(k, "device")) rc = d_str(d, "device", &w->device, 0, PROTO_NAME_MAX, 0);
        else if (key_is(k, "max_batch")) rc = d_u32(d, "max_batch", &w->max_batch, 0, UINT32_MAX);
        else if (key_is(k, "n_slots")) rc = d_u32(d, "n_slots", &w->n_slots, 0, UINT32_MAX);
        else if (key_is(k, "n_ctx")) rc = d_u32(d, "n_ctx", &w->n_ctx, 0, UINT32_MAX);
        else if (key_is(k, "free_slots")) rc = d_u32(d, "free_slots", &w->free_slots, 0, UINT32_MAX);
        else if (key_is(k, "running")) rc = d_u32(d, "running", &w->running, 0, UINT32_MAX);
        else if (key_is(k, "step")) rc = d_u64(d, "step", &w->step, 0, UINT64_MAX);
        else if (key_is(k, "alive")) rc = d_bool(d, "alive", &w->alive);
        else if (key_is(k, "kv_block")) rc = d_u32(d, "kv_block", &w->kv_block, 0, PROTO_MAX_KV_BLOCK);
        else if (key_is(k, "kv_used")) rc = d_u32(d, "kv_used", &w->kv_used, 0, UINT32_MAX);
        else if (key_is(k, "kv_free")) rc = d_u32(d, "kv_free", &w->kv_free, 0, UINT32_MAX);
        else if (key_is(k, "kv_cached")) rc = d_u32(d, "kv_cached", &w->kv_cached, 0, UINT32_MAX);
        else if (key_is(k, "kv_hit_tokens")) rc = d_u64(d, "kv_hit_tokens", &w->kv_hit_tokens, 0, UINT64_MAX);
        else if (key_is(k, "kv_prompt_tokens")) rc = d_u64(d, "kv_prompt_tokens", &w->kv_prompt_tokens, 0, UINT64_MAX);
        else if (key_is(k, "kv_summary")) rc = d_u32(d, "kv_summary", &w->kv_summary, 0, UINT32_MAX);
        else if (key_is(k, "kv_preemptions")) rc = d_u64(d, "kv_preemptions", &w->kv_preemptions, 0, UINT64_MAX);
        else if (key_is(k, "kv_evictions")) rc = d_u64(d, "kv_evictions", &w->kv_evictions, 0, UINT64_MAX);
        else rc = d_skip(d);
        if (rc) return -1;
    }
    return 0;
}

static int f_model_info(dec *d, proto_model_info *c) {
    uint32_t nk;
    if (rd_map(&d->r, &nk)) FAIL("capacity[]: expected a map");
    for (uint32_t j = 0; j < nk; j++) {
        proto_str k;
        int rc = 0;
        if (d_key(d, &k)) return -1;
        if (key_is(k, "model")) rc = d_str(d, "model", &c->model, 0, PROTO_NAME_MAX, 0);
        else if (key_is(k, "workers")) rc = d_u32(d, "workers", &c->workers, 0, UINT32_MAX);
        else if (key_is(k, "free_slots")) rc = d_u32(d, "free_slots", &c->free_slots, 0, UINT32_MAX);
        else if (key_is(k, "queued")) rc = d_u32(d, "queued", &c->queued, 0, UINT32_MAX);
        else if (key_is(k, "refused")) rc = d_u64(d, "refused", &c->refused, 0, UINT64_MAX);
        else if (key_is(k, "reason")) rc = d_str(d, "reason", &c->reason, 0, 64, 0);
        else rc = d_skip(d);
        if (rc) return -1;
    }
    return 0;
}

static int f_status(dec *d, proto_str k, proto_msg *m) {
    proto_status *s = &m->status;
    if (key_is(k, "id")) return d_str(d, "id", &s->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "ready")) return d_bool(d, "ready", &s->ready);
    if (key_is(k, "queue")) return d_u32(d, "queue", &s->queue, 0, UINT32_MAX);
    if (key_is(k, "active")) return d_u32(d, "active", &s->active, 0, UINT32_MAX);
    if (key_is(k, "models")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("models: expected an array");
        if (n > PROTO_MAX_WORKERS) FAIL("models: too many");
        proto_str *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("models: out of memory");
        for (uint32_t i = 0; i < n; i++)
            if (d_str(d, "models[]", &v[i], 0, PROTO_NAME_MAX, 0)) return -1;
        s->models = v;
        s->n_models = n;
        return 0;
    }
    if (key_is(k, "workers")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("workers: expected an array");
        if (n > PROTO_MAX_WORKERS) FAIL("workers: too many");
        proto_worker_info *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("workers: out of memory");
        memset(v, 0, (size_t)n * sizeof *v);
        for (uint32_t i = 0; i < n; i++)
            if (f_worker_info(d, &v[i])) return -1;
        s->workers = v;
        s->n_workers = n;
        return 0;
    }
    if (key_is(k, "counters")) {
        uint32_t n;
        if (rd_map(&d->r, &n)) FAIL("counters: expected a map");
        if (n > PROTO_MAX_COUNTERS) FAIL("counters: too many");
        proto_counter *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("counters: out of memory");
        for (uint32_t i = 0; i < n; i++) {
            if (d_str(d, "counters key", &v[i].name, 1, PROTO_NAME_MAX, 0)) return -1;
            if (d_u64(d, "counters value", &v[i].value, 0, UINT64_MAX)) return -1;
        }
        s->counters = v;
        s->n_counters = n;
        return 0;
    }
    if (key_is(k, "capacity")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("capacity: expected an array");
        if (n > PROTO_MAX_WORKERS) FAIL("capacity: too many");
        proto_model_info *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("capacity: out of memory");
        memset(v, 0, (size_t)n * sizeof *v);
        for (uint32_t i = 0; i < n; i++)
            if (f_model_info(d, &v[i])) return -1;
        s->capacity = v;
        s->n_capacity = n;
        return 0;
    }
    return d_skip(d);
}

static int f_token(dec *d, proto_str k, proto_msg *m) {
    proto_token *t = &m->token;
    if (key_is(k, "id")) return d_str(d, "id", &t->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "ids")) return d_i32arr(d, "ids", &t->ids, &t->n_ids, PROTO_MAX_GEN, 0, PROTO_TOKEN_ID_MAX);
    if (key_is(k, "text")) return d_str(d, "text", &t->text, 0, PROTO_MAX_FRAME, 0);
    if (key_is(k, "logprobs")) {
        uint32_t n;
        return d_logprobs(d, "logprobs", &t->lps, &n, PROTO_MAX_GEN); /* length checked against ids at the end */
    }
    if (key_is(k, "index")) return d_u32(d, "index", &t->index, 0, PROTO_MAX_N - 1);
    return d_skip(d);
}

static proto_finish finish_parse(proto_str s) {
    for (int f = 1; f < PROTO_FINISH_COUNT; f++)
        if (key_is(s, proto_finish_name((proto_finish)f))) return (proto_finish)f;
    return PROTO_FINISH_NONE;
}

static int d_f64any(dec *d, const char *name, double *v) {
    if (rd_float(&d->r, v)) FAIL("%s: expected a number", name);
    if (!isfinite(*v) || *v < 0 || *v > 1e15) FAIL("%s: not a finite number in [0,1e15]", name);
    return 0;
}

static int f_final(dec *d, proto_str k, proto_msg *m) {
    proto_final *f = &m->final;
    if (key_is(k, "id")) return d_str(d, "id", &f->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "finish")) {
        proto_str s;
        if (d_str(d, "finish", &s, 1, 32, 0)) return -1;
        f->finish = finish_parse(s);
        if (f->finish == PROTO_FINISH_NONE) FAIL("finish: unknown value");
        return 0;
    }
    if (key_is(k, "code")) {
        if (d_str(d, "code", &f->code_str, 0, PROTO_NAME_MAX, 0)) return -1;
        f->code = proto_code_parse(f->code_str);
        return 0;
    }
    if (key_is(k, "message")) return d_str(d, "message", &f->message, 0, PROTO_MAX_FRAME, 0);
    if (key_is(k, "text")) return d_str(d, "text", &f->text, 0, PROTO_MAX_FRAME, 0);
    if (key_is(k, "ids")) {
        f->has_ids = 1;
        return d_i32arr(d, "ids", &f->ids, &f->n_ids, PROTO_MAX_GEN, 0, PROTO_TOKEN_ID_MAX);
    }
    if (key_is(k, "logprobs")) {
        uint32_t n;
        return d_logprobs(d, "logprobs", &f->lps, &n, PROTO_MAX_GEN); /* length checked against ids at the end */
    }
    if (key_is(k, "index")) return d_u32(d, "index", &f->index, 0, PROTO_MAX_N - 1);
    if (key_is(k, "left")) return d_u32(d, "left", &f->left, 0, PROTO_MAX_N - 1);
    if (key_is(k, "usage") || key_is(k, "timings")) {
        int usage = key_is(k, "usage");
        uint32_t n;
        if (rd_map(&d->r, &n)) FAIL("%s: expected a map", usage ? "usage" : "timings");
        for (uint32_t i = 0; i < n; i++) {
            proto_str kk;
            int rc;
            if (d_key(d, &kk)) return -1;
            if (usage && key_is(kk, "prompt_tokens")) rc = d_u32(d, "prompt_tokens", &f->prompt_tokens, 0, UINT32_MAX);
            else if (usage && key_is(kk, "completion_tokens"))
                rc = d_u32(d, "completion_tokens", &f->completion_tokens, 0, UINT32_MAX);
            else if (!usage && key_is(kk, "queue_ms")) rc = d_f64any(d, "queue_ms", &f->queue_ms);
            else if (!usage && key_is(kk, "ttft_ms")) rc = d_f64any(d, "ttft_ms", &f->ttft_ms);
            else if (!usage && key_is(kk, "total_ms")) rc = d_f64any(d, "total_ms", &f->total_ms);
            else rc = d_skip(d);
            if (rc) return -1;
        }
        return 0;
    }
    return d_skip(d);
}

static int f_error(dec *d, proto_str k, proto_msg *m) {
    proto_error *e = &m->error;
    if (key_is(k, "code")) {
        if (d_str(d, "code", &e->code_str, 0, PROTO_NAME_MAX, 0)) return -1;
        e->code = proto_code_parse(e->code_str);
        return 0;
    }
    if (key_is(k, "message")) return d_str(d, "message", &e->message, 0, PROTO_MAX_FRAME, 0);
    if (key_is(k, "id")) return d_str(d, "id", &e->id, 1, PROTO_ID_MAX, 1);
    return d_skip(d);
}

static int f_register(dec *d, proto_str k, proto_msg *m) {
    proto_register *r = &m->reg;
    if (key_is(k, "name")) return d_str(d, "name", &r->name, 1, PROTO_NAME_MAX, 0);
    if (key_is(k, "model")) return d_str(d, "model", &r->model, 1, PROTO_NAME_MAX, 0);
    if (key_is(k, "device")) return d_str(d, "device", &r->device, 1, PROTO_NAME_MAX, 0);
    if (key_is(k, "max_batch")) return d_u32(d, "max_batch", &r->max_batch, 1, 1u << 20);
    if (key_is(k, "n_slots")) return d_u32(d, "n_slots", &r->n_slots, 1, 1u << 20);
    if (key_is(k, "n_ctx")) return d_u32(d, "n_ctx", &r->n_ctx, 2, 1u << 24);
    if (key_is(k, "kv_tokens")) return d_u64(d, "kv_tokens", &r->kv_tokens, 0, UINT64_MAX);
    if (key_is(k, "vocab_size")) return d_u32(d, "vocab_size", &r->vocab_size, 0, PROTO_TOKEN_ID_MAX);
    if (key_is(k, "heartbeat_ms")) return d_u32(d, "heartbeat_ms", &r->heartbeat_ms, 1, 60000);
    if (key_is(k, "kv_block")) return d_u32(d, "kv_block", &r->kv_block, 0, PROTO_MAX_KV_BLOCK);
    if (key_is(k, "kv_blocks")) return d_u32(d, "kv_blocks", &r->kv_blocks, 0, UINT32_MAX);
    return d_skip(d);
}

static int f_registered(dec *d, proto_str k, proto_msg *m) {
    if (key_is(k, "heartbeat_ms")) return d_u32(d, "heartbeat_ms", &m->registered.heartbeat_ms, 1, 60000);
    return d_skip(d);
}

static int f_hb(dec *d, proto_str k, proto_msg *m) {
    proto_hb *h = &m->hb;
    if (key_is(k, "step")) { h->has_step = 1; return d_u64(d, "step", &h->step, 0, UINT64_MAX); }
    if (key_is(k, "free_slots")) return d_u32(d, "free_slots", &h->free_slots, 0, 1u << 20);
    if (key_is(k, "running")) return d_u32(d, "running", &h->running, 0, 1u << 20);
    if (key_is(k, "prefills_shared")) return d_u64(d, "prefills_shared", &h->prefills_shared, 0, UINT64_MAX);
    if (key_is(k, "kv_used")) {
        h->kv.has_kv = 1;
        return d_u32(d, "kv_used", &h->kv.used, 0, UINT32_MAX);
    }
    if (key_is(k, "kv_free")) {
        h->kv.has_kv = 1;
        return d_u32(d, "kv_free", &h->kv.free, 0, UINT32_MAX);
    }
    if (key_is(k, "kv_cached")) {
        h->kv.has_kv = 1;
        return d_u32(d, "kv_cached", &h->kv.cached, 0, UINT32_MAX);
    }
    if (key_is(k, "kv_hit_tokens")) {
        h->kv.has_kv = 1;
        return d_u64(d, "kv_hit_tokens", &h->kv.hit_tokens, 0, UINT64_MAX);
    }
    if (key_is(k, "kv_prompt_tokens")) {
        h->kv.has_kv = 1;
        return d_u64(d, "kv_prompt_tokens", &h->kv.prompt_tokens, 0, UINT64_MAX);
    }
    if (key_is(k, "kv_preemptions")) {
        h->kv.has_kv = 1;
        return d_u64(d, "kv_preemptions", &h->kv.preemptions, 0, UINT64_MAX);
    }
    if (key_is(k, "kv_evictions")) {
        h->kv.has_kv = 1;
        return d_u64(d, "kv_evictions", &h->kv.evictions, 0, UINT64_MAX);
    }
    if (key_is(k, "kv_hashes")) {
        h->kv.has_hashes = 1;
        return d_u64arr(d, "kv_hashes", &h->kv.hashes, &h->kv.n_hashes, PROTO_MAX_KV_HASHES);
    }
    return d_skip(d);
}

static int f_nofields(dec *d, proto_str k, proto_msg *m) {
    (void)k; (void)m;
    return d_skip(d);
}

static int d_seq(dec *d, proto_seq *s) {
    uint32_t nk;
    int have_rid = 0, have_tokens = 0, have_max = 0, have_seed = 0;
    if (rd_map(&d->r, &nk)) FAIL("seqs[]: expected a map");
    memset(s, 0, sizeof *s);
    proto_sampling_defaults(&s->sampling);
    for (uint32_t j = 0; j < nk; j++) {
        proto_str k;
        if (d_key(d, &k)) return -1;
        int r = d_sampling(d, k, &s->sampling);
        if (r < 0) return -1;
        if (r > 0) { if (key_is(k, "seed")) have_seed = 1; continue; }
        int rc;
        if (key_is(k, "rid")) { rc = d_u64(d, "rid", &s->rid, 0, UINT64_MAX); have_rid = 1; }
        else if (key_is(k, "tokens")) {
            rc = d_i32arr(d, "tokens", &s->tokens, &s->n_tokens, PROTO_MAX_TOKENS, 0, PROTO_TOKEN_ID_MAX);
            have_tokens = 1;
        } else if (key_is(k, "max_tokens")) {
            rc = d_u32(d, "max_tokens", &s->max_tokens, 0, PROTO_MAX_GEN);
            have_max = 1;
        } else if (key_is(k, "stop_ids"))
            rc = d_i32arr(d, "stop_ids", &s->stop_ids, &s->n_stop_ids, PROTO_MAX_STOP_IDS, 0, PROTO_TOKEN_ID_MAX);
        else if (key_is(k, "response_format")) rc = d_format(d, &s->format);
        else if (key_is(k, "share")) rc = d_u64(d, "share", &s->share, 0, UINT64_MAX);
        else if (key_is(k, "priority")) rc = d_i32(d, "priority", &s->priority, PROTO_PRIORITY_MIN, PROTO_PRIORITY_MAX);
        else rc = d_skip(d);
        if (rc) return -1;
    }
    if (!have_rid || !have_tokens || !have_max) FAIL("seqs[]: needs rid, tokens and max_tokens");
    if (s->n_tokens < 1) FAIL("seqs[]: empty prompt");
    if (s->max_tokens == 0 && !s->sampling.prompt_lp) FAIL("seqs[]: max_tokens 0 needs prompt_logprobs");
    s->sampling.has_seed = 1;
    if (!have_seed) s->sampling.seed = 0;
    return 0;
}

static int f_assign(dec *d, proto_str k, proto_msg *m) {
    if (key_is(k, "seqs")) {
        uint32_t n;
        if (rd_arr(&d->r, &n)) FAIL("seqs: expected an array");
        if (n < 1 || n > PROTO_MAX_SEQS) FAIL("seqs: %u entries, need 1..%d", n, PROTO_MAX_SEQS);
        proto_seq *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("seqs: out of memory");
        for (uint32_t i = 0; i < n; i++)
            if (d_seq(d, &v[i])) return -1;
        m->assign.seqs = v;
        m->assign.n_seqs = n;
        return 0;
    }
    return d_skip(d);
}

static int f_out(dec *d, proto_str k, proto_msg *m) {
    proto_out *o = &m->out;
    uint32_t n;
    if (key_is(k, "step")) return d_u64(d, "step", &o->step, 0, UINT64_MAX);
    if (key_is(k, "rids")) {
        if (rd_arr(&d->r, &n)) FAIL("rids: expected an array");
        if (n > PROTO_MAX_SEQS) FAIL("rids: too many");
        uint64_t *v = arena_alloc(d->a, (size_t)n * sizeof *v);
        if (!v) FAIL("rids: out of memory");
        for (uint32_t i = 0; i < n; i++)
            if (d_u64(d, "rids[]", &v[i], 0, UINT64_MAX)) return -1;
        o->rids = v;
        o->n = n;  /* checked against toks/fin at the end */
        return 0;
    }
    if (key_is(k, "toks")) {
        const int32_t *t; uint32_t nt;
        if (d_i32arr(d, "toks", &t, &nt, PROTO_MAX_SEQS, -1, PROTO_TOKEN_ID_MAX)) return -1;
        (void)nt;   /* lengths are compared in proto_decode (out_lengths) */
        o->toks = t;
        return 0;
    }
    if (key_is(k, "fin")) {
        if (rd_arr(&d->r, &n)) FAIL("fin: expected an array");
        if (n > PROTO_MAX_SEQS) FAIL("fin: too many");
        uint8_t *v = arena_alloc(d->a, n ? n : 1);
        if (!v) FAIL("fin: out of memory");
        for (uint32_t i = 0; i < n; i++) {
            uint32_t x;
            if (d_u32(d, "fin[]", &x, 0, PROTO_FIN_ERROR)) return -1;
            v[i] = (uint8_t)x;
        }
        o->fin = v;
        return 0;
    }
    if (key_is(k, "lps")) {
        uint32_t nl;
        return d_logprobs(d, "lps", &o->lps, &nl, PROTO_MAX_SEQS); /* length checked in proto_decode */
    }
    if (key_is(k, "plp")) { /* [nil or [start, [entries]]], length checked in proto_decode */
        if (rd_arr(&d->r, &n)) FAIL("plp: expected an array");
        if (n > PROTO_MAX_SEQS) FAIL("plp: too many");
        proto_plp *v = arena_alloc(d->a, (size_t)(n ? n : 1) * sizeof *v);
        if (!v) FAIL("plp: out of memory");
        for (uint32_t i = 0; i < n; i++) {
            uint32_t two;
            memset(&v[i], 0, sizeof v[i]);
            if (rd_nil(&d->r)) continue;
            if (rd_arr(&d->r, &two) || two != 2) FAIL("plp[%u]: expected [start, [entries]]", i);
            if (d_u32(d, "plp start", &v[i].start, 1, PROTO_MAX_TOKENS - 1)) return -1;
            if (d_logprobs(d, "plp entries", &v[i].lps, &v[i].n, PROTO_MAX_TOKENS)) return -1;
            for (uint32_t j = 0; j < v[i].n; j++)
                if (!v[i].lps[j].present) FAIL("plp[%u]: entry %u is nil", i, j);
            if ((uint64_t)v[i].start + v[i].n > PROTO_MAX_TOKENS) FAIL("plp[%u]: past the longest prompt", i);
        }
        o->plp = v;
        return 0;
    }
    return d_skip(d);
}

static int f_plps(dec *d, proto_str k, proto_msg *m) {
    proto_plps *p = &m->plps;
    if (key_is(k, "id")) return d_str(d, "id", &p->id, 1, PROTO_ID_MAX, 1);
    if (key_is(k, "start")) return d_u32(d, "start", &p->start, 0, PROTO_MAX_TOKENS - 1);
    if (key_is(k, "ids")) return d_i32arr(d, "ids", &p->ids, &p->n_ids, PROTO_PLP_CHUNK, 0, PROTO_TOKEN_ID_MAX);
    if (key_is(k, "logprobs")) {
        uint32_t n;
        return d_logprobs(d, "logprobs", &p->lps, &n, PROTO_PLP_CHUNK); /* length checked against ids at the end */
    }
    if (key_is(k, "index")) return d_u32(d, "index", &p->index, 0, PROTO_MAX_N - 1);
    return d_skip(d);
}

static const struct {
    const char *name;
    field_fn fn;
} s_types[PROTO_TYPE_COUNT] = {
    [PROTO_NONE] = {"", NULL},
    [PROTO_GENERATE] = {"generate", f_generate},
    [PROTO_CANCEL] = {"cancel", f_cancel},
    [PROTO_STATUS] = {"status", f_status},
    [PROTO_TOKEN] = {"token", f_token},
    [PROTO_FINAL] = {"final", f_final},
    [PROTO_ERROR] = {"error", f_error},
    [PROTO_REGISTER] = {"register", f_register},
    [PROTO_REGISTERED] = {"registered", f_registered},
    [PROTO_HB] = {"hb", f_hb},
    [PROTO_REREGISTER] = {"reregister", f_nofields},
    [PROTO_ASSIGN] = {"assign", f_assign},
    [PROTO_OUT] = {"out", f_out},
    [PROTO_PROMPT_LPS] = {"prompt_logprobs", f_plps},
};

/* out: the three arrays must be present and of equal length; proto_out has one count, so the lengths are
 * re-read from the (already validated) frame's array headers. */
static int out_lengths(const uint8_t *buf, size_t len, uint32_t *nr, uint32_t *nt, uint32_t *nf, uint32_t *nl) {
    rd r = { buf, buf + len };
    uint32_t n;
    *nr = *nt = *nf = *nl = UINT32_MAX;
    if (rd_map(&r, &n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        proto_str k;
        if (rd_str(&r, &k)) return -1;
        uint32_t *dst = key_is(k, "rids")   ? nr
                        : key_is(k, "toks") ? nt
                        : key_is(k, "fin")  ? nf
                        : key_is(k, "lps")  ? nl
                                            : NULL;
        if (dst) {
            uint32_t c;
            rd save = r;
            if (rd_arr(&r, &c) == 0) *dst = c;
            r = save;
        }
        if (rd_skip(&r, PROTO_MAX_DEPTH)) return -1;
    }
    return 0;
}

/* the length of the top map's array under key (`logprobs` of token and final), UINT32_MAX when absent */
static uint32_t arr_count(const uint8_t *buf, size_t len, const char *key) {
    rd r = {buf, buf + len};
    uint32_t n, c = UINT32_MAX;
    if (rd_map(&r, &n)) return UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        proto_str k;
        if (rd_str(&r, &k)) return UINT32_MAX;
        if (key_is(k, key)) {
            rd save = r;
            if (rd_arr(&r, &c) != 0) c = UINT32_MAX;
            r = save;
        }
        if (rd_skip(&r, PROTO_MAX_DEPTH)) return UINT32_MAX;
    }
    return c;
}

int proto_decode(const void *buf, size_t len, proto_msg *out, char *err, size_t errlen) {
    struct proto_arena *a = out->arena;
    memset(out, 0, sizeof *out);
    out->arena = a;
    if (len > PROTO_MAX_FRAME) { set_err(err, errlen, "frame of %zu bytes exceeds %u", len, PROTO_MAX_FRAME); return -1; }
    if (proto_msgpack_validate(buf, len, PROTO_MAX_DEPTH, err, errlen) != 0) return -1;
    if (!out->arena) {
        out->arena = calloc(1, sizeof *out->arena);
        if (!out->arena) { set_err(err, errlen, "out of memory"); return -1; }
    }
    if (arena_reset(out->arena) != 0) { set_err(err, errlen, "out of memory"); return -1; }

    dec dd = { { buf, (const uint8_t *)buf + len }, out->arena, err, errlen }, *d = &dd;
    uint32_t n;
    if (rd_map(&d->r, &n)) FAIL("message is not a map");
    /* pass 1: zllm and type */
    rd start = d->r;
    int have_ver = 0;
    proto_str type = { NULL, 0 };
    for (uint32_t i = 0; i < n; i++) {
        proto_str k;
        if (d_key(d, &k)) return -1;
        if (key_is(k, "zllm")) {
            if (d_u32(d, "zllm", &out->version, 0, UINT32_MAX)) return -1;
            have_ver = 1;
        } else if (key_is(k, "type")) {
            if (d_str(d, "type", &type, 1, 32, 0)) return -1;
        } else if (key_is(k, "inst")) { /* kept only when a UTF-8 string of 1..64 bytes */
            rd at = d->r;
            if (rd_str(&d->r, &out->inst) != 0 || out->inst.n < 1 || out->inst.n > 64 ||
                !utf8_valid(out->inst.p, out->inst.n)) {
                out->inst.p = NULL;
                out->inst.n = 0;
                d->r = at;
                if (d_skip(d)) return -1;
            }
        } else if (d_skip(d)) return -1;
    }
    if (!have_ver) FAIL("missing zllm version");
    if (out->version != PROTO_VERSION) FAIL("unsupported protocol version %u", out->version);
    if (!type.p) FAIL("missing type");
    proto_type t = PROTO_NONE;
    for (int i = 1; i < PROTO_TYPE_COUNT; i++)
        if (key_is(type, s_types[i].name)) { t = (proto_type)i; break; }
    if (t == PROTO_NONE) FAIL("unknown type '%.*s'", (int)(type.n > 32 ? 32 : type.n), type.p);

    /* defaults */
    if (t == PROTO_GENERATE) { proto_generate_defaults(&out->generate); out->generate.stream = 1; }

    /* pass 2: fields */
    d->r = start;
    for (uint32_t i = 0; i < n; i++) {
        proto_str k;
        if (d_key(d, &k)) return -1;
        if (key_is(k, "zllm") || key_is(k, "type") || key_is(k, "inst")) {
            if (d_skip(d)) return -1;
            continue;
        }
        if (rd_nil(&d->r)) continue;   /* nil = absent */
        if (s_types[t].fn(d, k, out) != 0) return -1;
    }

    /* required fields and cross-field rules */
    switch (t) {
    case PROTO_GENERATE: {
        proto_generate *g = &out->generate;
        if (!g->id.p) FAIL("generate: missing id");
        if (!g->prompt_kind) FAIL("generate: needs one of prompt, tokens, messages");
        if (g->max_tokens == 0 && !g->sampling.prompt_lp) FAIL("generate: max_tokens 0 needs prompt_logprobs");
        if (g->prompt_kind == PROTO_PROMPT_TOKENS && g->n_tokens == 0) FAIL("generate: empty tokens");
        break;
    }
    case PROTO_CANCEL:
        if (!out->cancel.id.p && !out->cancel.rids) FAIL("cancel: needs id or rids");
        break;
    case PROTO_TOKEN:
        if (!out->token.id.p) FAIL("token: missing id");
        if (out->token.lps && arr_count(buf, len, "logprobs") != out->token.n_ids)
            FAIL("token: logprobs and ids differ in length");
        break;
    case PROTO_FINAL:
        if (!out->final.id.p) FAIL("final: missing id");
        if (out->final.finish == PROTO_FINISH_NONE) FAIL("final: missing finish");
        if (out->final.lps && arr_count(buf, len, "logprobs") != out->final.n_ids)
            FAIL("final: logprobs and ids differ in length");
        break;
    case PROTO_REGISTER: {
        proto_register *r = &out->reg;
        if (!r->name.p || !r->model.p || !r->n_slots || !r->n_ctx || !r->heartbeat_ms || !r->max_batch)
            FAIL("register: needs name, model, max_batch, n_slots, n_ctx, heartbeat_ms");
        if (!r->device.p) r->device = proto_cstr("?");
        break;
    }
    case PROTO_REGISTERED:
        if (!out->registered.heartbeat_ms) FAIL("registered: missing heartbeat_ms");
        break;
    case PROTO_ASSIGN:
        if (!out->assign.seqs) FAIL("assign: missing seqs");
        break;
    case PROTO_OUT: {
        uint32_t nr, nt, nf, nl;
        if (out_lengths(buf, len, &nr, &nt, &nf, &nl) != 0) FAIL("out: bad map");
        if (nr == UINT32_MAX || nt == UINT32_MAX || nf == UINT32_MAX) FAIL("out: needs rids, toks and fin");
        if (nr != nt || nr != nf) FAIL("out: rids/toks/fin lengths differ (%u/%u/%u)", nr, nt, nf);
        if (!out->out.lps) nl = UINT32_MAX; /* absent, or nil */
        if (nl != UINT32_MAX && nl != nr) FAIL("out: lps has %u entries for %u rids", nl, nr);
        if (out->out.plp && arr_count(buf, len, "plp") != nr) FAIL("out: plp and rids differ in length");
        break;
    }
    case PROTO_PROMPT_LPS: {
        const proto_plps *p = &out->plps;
        if (!p->id.p || !p->ids || !p->lps) FAIL("prompt_logprobs: needs id, ids and logprobs");
        if (p->n_ids < 1 || arr_count(buf, len, "logprobs") != p->n_ids)
            FAIL("prompt_logprobs: logprobs and ids differ in length");
        if ((uint64_t)p->start + p->n_ids > PROTO_MAX_TOKENS) FAIL("prompt_logprobs: past the longest prompt");
        break;
    }
    default:
        break;
    }
    out->type = t;
    return 0;
}

int proto_peek_id(const void *buf, size_t len, proto_str *type, proto_str *id) {
    if (len > PROTO_MAX_FRAME || proto_msgpack_validate(buf, len, PROTO_MAX_DEPTH, NULL, 0) != 0) return -1;
    rd r = { buf, (const uint8_t *)buf + len };
    uint32_t n;
    proto_str t = { NULL, 0 }, i = { NULL, 0 };
    if (rd_map(&r, &n)) return -1;
    for (uint32_t k = 0; k < n; k++) {
        proto_str key, v;
        if (rd_str(&r, &key) != 0) { if (rd_skip(&r, PROTO_MAX_DEPTH)) return -1; }
        else if ((key_is(key, "type") || key_is(key, "id")) && rd_str(&r, &v) == 0) {
            if (key_is(key, "type")) t = v; else i = v;
            continue;
        }
        if (rd_skip(&r, PROTO_MAX_DEPTH)) return -1;
    }
    if (!t.p || !i.p || i.n < 1 || i.n > PROTO_ID_MAX || !utf8_valid(i.p, i.n)) return -1;
    *type = t;
    *id = i;
    return 0;
}

void proto_msg_free(proto_msg *m) {
    if (!m) return;
    arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------------------------------------------------
 * encoders */

static int enc_done(proto_buf *b) { return b->failed ? -1 : 0; }

static void w_sampling(proto_buf *b, const proto_sampling *s, int with_seed) {
    w_key(b, "temperature"); w_f64(b, s->temperature);
    w_key(b, "top_k"); w_int(b, s->top_k);
    w_key(b, "top_p"); w_f64(b, s->top_p);
    w_key(b, "min_p"); w_f64(b, s->min_p);
    w_key(b, "repeat_penalty"); w_f64(b, s->repeat_penalty);
    w_key(b, "repeat_last_n"); w_uint(b, s->repeat_last_n);
    w_key(b, "ignore_eos"); w_bool(b, s->ignore_eos);
    if (with_seed) { w_key(b, "seed"); w_uint(b, s->seed); }
    if (s->presence_penalty != 0.0f) {
        w_key(b, "presence_penalty");
        w_f64(b, s->presence_penalty);
    }
    if (s->frequency_penalty != 0.0f) {
        w_key(b, "frequency_penalty");
        w_f64(b, s->frequency_penalty);
    }
    if (s->n_bias) {
        uint32_t nb = s->n_bias > PROTO_MAX_LOGIT_BIAS ? PROTO_MAX_LOGIT_BIAS : s->n_bias;
        w_key(b, "logit_bias");
        w_arr(b, nb);
        for (uint32_t i = 0; i < nb; i++) {
            w_arr(b, 2);
            w_uint(b, (uint32_t)s->bias[i].id);
            w_f64(b, s->bias[i].bias);
        }
    }
    if (s->logprobs) {
        w_key(b, "logprobs");
        w_bool(b, 1);
    }
    if (s->top_logprobs) {
        w_key(b, "top_logprobs");
        w_uint(b, s->top_logprobs);
    }
    if (s->prompt_lp) {
        w_key(b, "prompt_logprobs");
        w_uint(b, s->prompt_top > PROTO_MAX_TOP_LOGPROBS ? PROTO_MAX_TOP_LOGPROBS : s->prompt_top);
    }
}
#define SAMPLING_FIELDS 7
/* the optional sampling fields w_sampling writes (those away from their defaults) */
static uint32_t sampling_extra(const proto_sampling *s) {
    return (s->presence_penalty != 0.0f) + (s->frequency_penalty != 0.0f) + (s->n_bias != 0) + (s->logprobs != 0) +
           (s->top_logprobs != 0) + (s->prompt_lp != 0);
}

/* one logprobs entry: nil when absent */
static void w_logprob(proto_buf *b, const proto_logprob *lp) {
    if (!lp || !lp->present) {
        uint8_t c = 0xc0;
        w_bytes(b, &c, 1);
        return;
    }
    uint32_t k = lp->n_top > PROTO_MAX_TOP_LOGPROBS ? PROTO_MAX_TOP_LOGPROBS : lp->n_top;
    w_arr(b, 3);
    w_f64(b, lp->logprob);
    w_i32arr(b, lp->top_id, k);
    w_arr(b, k);
    for (uint32_t i = 0; i < k; i++) w_f64(b, lp->top_logprob[i]);
}

/* the response_format entry (key and map) */
static void w_format(proto_buf *b, const proto_format *f) {
    w_key(b, "response_format");
    w_map(b, 2);
    w_key(b, "type");
    w_str(b, proto_cstr(proto_format_name(f->kind)));
    w_key(b, "text");
    w_str(b, f->text.p ? f->text : proto_cstr(""));
}

int proto_encode_generate(proto_buf *b, const proto_generate *g) {
    uint32_t n = 1 + 1 + SAMPLING_FIELDS + (g->sampling.has_seed ? 1 : 0) + 1 /*max_tokens*/ + 1 /*stream*/ +
                 1 /*deadline*/ + 1 /*special*/ + (g->model.p ? 1 : 0) + (g->n_stop ? 1 : 0) + (g->n_stop_ids ? 1 : 0) +
                 (g->add_bos >= 0 ? 1 : 0) + (g->format.kind ? 1 : 0) + sampling_extra(&g->sampling) + (g->n > 1) +
                 (g->priority ? 1 : 0);
    w_head(b, n, "generate");
    w_key(b, "id"); w_str(b, g->id);
    if (g->model.p) { w_key(b, "model"); w_str(b, g->model); }
    if (g->prompt_kind == PROTO_PROMPT_TOKENS) { w_key(b, "tokens"); w_i32arr(b, g->tokens, g->n_tokens); }
    else if (g->prompt_kind == PROTO_PROMPT_MESSAGES) {
        w_key(b, "messages");
        w_arr(b, g->n_messages);
        for (uint32_t i = 0; i < g->n_messages; i++) {
            const proto_chat *m = &g->messages[i];
            w_map(b, 2 + (m->tool_call_id.p != NULL) + (m->tool_calls.p != NULL));
            w_key(b, "role");
            w_str(b, m->role);
            w_key(b, "content");
            w_str(b, m->content);
            if (m->tool_call_id.p) {
                w_key(b, "tool_call_id");
                w_str(b, m->tool_call_id);
            }
            if (m->tool_calls.p) {
                w_key(b, "tool_calls");
                w_str(b, m->tool_calls);
            }
        }
    } else { w_key(b, "prompt"); w_str(b, g->prompt); }
    w_sampling(b, &g->sampling, g->sampling.has_seed);
    w_key(b, "max_tokens"); w_uint(b, g->max_tokens);
    w_key(b, "stream"); w_bool(b, g->stream);
    w_key(b, "deadline_ms"); w_uint(b, g->deadline_ms);
    w_key(b, "special"); w_bool(b, g->special);
    if (g->n_stop) {
        w_key(b, "stop");
        uint32_t ns = g->n_stop > PROTO_MAX_STOP ? PROTO_MAX_STOP : g->n_stop;
        w_arr(b, ns);
        for (uint32_t i = 0; i < ns; i++) w_str(b, g->stop[i]);
    }
    if (g->n_stop_ids) { w_key(b, "stop_ids"); w_i32arr(b, g->stop_ids, g->n_stop_ids); }
    if (g->add_bos >= 0) { w_key(b, "add_bos"); w_bool(b, g->add_bos); }
    if (g->format.kind) w_format(b, &g->format);
    if (g->n > 1) {
        w_key(b, "n");
        w_uint(b, g->n);
    }
    if (g->priority) {
        w_key(b, "priority");
        w_int(b, g->priority);
    }
    return enc_done(b);
}

int proto_encode_cancel(proto_buf *b, proto_str id) {
    w_head(b, 1, "cancel");
    w_key(b, "id"); w_str(b, id);
    return enc_done(b);
}

int proto_encode_cancel_rids(proto_buf *b, const uint64_t *rids, uint32_t n) {
    w_head(b, 1, "cancel");
    w_key(b, "rids");
    w_arr(b, n);
    for (uint32_t i = 0; i < n; i++) w_uint(b, rids[i]);
    return enc_done(b);
}

int proto_encode_status_request(proto_buf *b, proto_str id) {
    w_head(b, id.p ? 1 : 0, "status");
    if (id.p) { w_key(b, "id"); w_str(b, id); }
    return enc_done(b);
}

int proto_encode_status(proto_buf *b, const proto_status *s) {
    w_head(b, 6 + (s->id.p ? 1 : 0) + (s->n_capacity ? 1 : 0), "status");
    if (s->id.p) { w_key(b, "id"); w_str(b, s->id); }
    w_key(b, "ready"); w_bool(b, s->ready);
    w_key(b, "queue"); w_uint(b, s->queue);
    w_key(b, "active"); w_uint(b, s->active);
    w_key(b, "models"); w_arr(b, s->n_models);
    for (uint32_t i = 0; i < s->n_models; i++) w_str(b, s->models[i]);
    w_key(b, "workers"); w_arr(b, s->n_workers);
    for (uint32_t i = 0; i < s->n_workers; i++) {
        const proto_worker_info *w = &s->workers[i];
        w_map(b, 19);
        w_key(b, "name"); w_str(b, w->name);
        w_key(b, "model"); w_str(b, w->model);
        w_key(b, "device"); w_str(b, w->device);
        w_key(b, "max_batch"); w_uint(b, w->max_batch);
        w_key(b, "n_slots"); w_uint(b, w->n_slots);
        w_key(b, "n_ctx"); w_uint(b, w->n_ctx);
        w_key(b, "free_slots"); w_uint(b, w->free_slots);
        w_key(b, "running"); w_uint(b, w->running);
        w_key(b, "step"); w_uint(b, w->step);
        w_key(b, "alive"); w_bool(b, w->alive);
        w_key(b, "kv_block");
        w_uint(b, w->kv_block);
        w_key(b, "kv_used");
        w_uint(b, w->kv_used);
        w_key(b, "kv_free");
        w_uint(b, w->kv_free);
        w_key(b, "kv_cached");
        w_uint(b, w->kv_cached);
        w_key(b, "kv_hit_tokens");
        w_uint(b, w->kv_hit_tokens);
        w_key(b, "kv_prompt_tokens");
        w_uint(b, w->kv_prompt_tokens);
        w_key(b, "kv_summary");
        w_uint(b, w->kv_summary);
        w_key(b, "kv_preemptions");
        w_uint(b, w->kv_preemptions);
        w_key(b, "kv_evictions");
        w_uint(b, w->kv_evictions);
    }
    w_key(b, "counters"); w_map(b, s->n_counters);
    for (uint32_t i = 0; i < s->n_counters; i++) { w_str(b, s->counters[i].name); w_uint(b, s->counters[i].value); }
    if (s->n_capacity) {
        w_key(b, "capacity");
        w_arr(b, s->n_capacity);
        for (uint32_t i = 0; i < s->n_capacity; i++) {
            const proto_model_info *m = &s->capacity[i];
            w_map(b, 6);
            w_key(b, "model");
            w_str(b, m->model);
            w_key(b, "workers");
            w_uint(b, m->workers);
            w_key(b, "free_slots");
            w_uint(b, m->free_slots);
            w_key(b, "queued");
            w_uint(b, m->queued);
            w_key(b, "refused");
            w_uint(b, m->refused);
            w_key(b, "reason");
            w_str(b, m->reason);
        }
    }
    return enc_done(b);
}

int proto_encode_token(proto_buf *b, proto_str id, const int32_t *ids, uint32_t n_ids, proto_str text) {
    return proto_encode_token_ex(b, id, ids, n_ids, text, NULL, 0);
}

int proto_encode_token_ex(proto_buf *b, proto_str id, const int32_t *ids, uint32_t n_ids, proto_str text,
                          const proto_logprob *lps, uint32_t index) {
    w_head(b, 3 + (lps != NULL) + (index != 0), "token");
    w_key(b, "id"); w_str(b, id);
    w_key(b, "ids"); w_i32arr(b, ids, n_ids);
    w_key(b, "text"); w_str(b, text);
    if (lps) {
        w_key(b, "logprobs");
        w_arr(b, n_ids);
        for (uint32_t i = 0; i < n_ids; i++) w_logprob(b, &lps[i]);
    }
    if (index) {
        w_key(b, "index");
        w_uint(b, index);
    }
    return enc_done(b);
}

int proto_encode_final(proto_buf *b, const proto_final *f) {
    int has_code = f->code != PROTO_CODE_NONE;
    int has_msg = f->message.p != NULL;
    int has_ids = f->has_ids || f->ids;
    int has_lps = has_ids && f->lps;
    w_head(b, 5 + has_code + has_msg + has_ids + has_lps + (f->index != 0) + (f->left != 0), "final");
    w_key(b, "id"); w_str(b, f->id);
    w_key(b, "finish"); w_key(b, proto_finish_name(f->finish));
    if (has_code) { w_key(b, "code"); w_key(b, proto_code_name(f->code)); }
    if (has_msg) { w_key(b, "message"); w_str(b, f->message); }
    w_key(b, "text"); w_str(b, f->text);
    if (has_ids) { w_key(b, "ids"); w_i32arr(b, f->ids, f->n_ids); }
    if (has_lps) {
        w_key(b, "logprobs");
        w_arr(b, f->n_ids);
        for (uint32_t i = 0; i < f->n_ids; i++) w_logprob(b, &f->lps[i]);
    }
    if (f->index) {
        w_key(b, "index");
        w_uint(b, f->index);
    }
    if (f->left) {
        w_key(b, "left");
        w_uint(b, f->left);
    }
    w_key(b, "usage"); w_map(b, 2);
    w_key(b, "prompt_tokens"); w_uint(b, f->prompt_tokens);
    w_key(b, "completion_tokens"); w_uint(b, f->completion_tokens);
    w_key(b, "timings"); w_map(b, 3);
    w_key(b, "queue_ms"); w_f64(b, f->queue_ms);
    w_key(b, "ttft_ms"); w_f64(b, f->ttft_ms);
    w_key(b, "total_ms"); w_f64(b, f->total_ms);
    return enc_done(b);
}

int proto_encode_error_id(proto_buf *b, proto_code code, proto_str id, proto_str message) {
    w_head(b, 2 + (id.p ? 1 : 0), "error");
    w_key(b, "code"); w_key(b, proto_code_name(code));
    w_key(b, "message"); w_str(b, message);
    if (id.p) { w_key(b, "id"); w_str(b, id); }
    return enc_done(b);
}

int proto_buf_add_str(proto_buf *b, const char *key, proto_str v) {
    if (b->failed || b->len == 0) return -1;
    uint8_t h = b->data[0];
    if ((h & 0xf0) == 0x80 && (h & 0x0f) < 15) b->data[0] = (uint8_t)(h + 1);
    else if (h == 0x8f) { /* fixmap of 15 -> map16 of 16: two more header bytes */ w_bytes(b, "\0\0", 2);
        if (b->failed) return -1;
        memmove(b->data + 3, b->data + 1, b->len - 3);
        b->data[0] = 0xde;
        b->data[1] = 0;
        b->data[2] = 16;
    } else if (h == 0xde) {
        uint32_t n = ((uint32_t)b->data[1] << 8 | b->data[2]) + 1;
        if (n > 0xffff) return -1;
        b->data[1] = (uint8_t)(n >> 8);
        b->data[2] = (uint8_t)n;
    } else return -1;
    w_key(b, key);
    w_str(b, v);
    return enc_done(b);
}

int proto_encode_error(proto_buf *b, proto_code code, proto_str message) {
    proto_str none = { NULL, 0 };
    return proto_encode_error_id(b, code, none, message);
}

int proto_encode_register(proto_buf *b, const proto_register *r) {
    w_head(b, 9 + (r->kv_block ? 2 : 0), "register");
    w_key(b, "name"); w_str(b, r->name);
    w_key(b, "model"); w_str(b, r->model);
    w_key(b, "device"); w_str(b, r->device);
    w_key(b, "max_batch"); w_uint(b, r->max_batch);
    w_key(b, "n_slots"); w_uint(b, r->n_slots);
    w_key(b, "n_ctx"); w_uint(b, r->n_ctx);
    w_key(b, "kv_tokens"); w_uint(b, r->kv_tokens);
    w_key(b, "vocab_size"); w_uint(b, r->vocab_size);
    w_key(b, "heartbeat_ms"); w_uint(b, r->heartbeat_ms);
    if (r->kv_block) {
        w_key(b, "kv_block");
        w_uint(b, r->kv_block);
        w_key(b, "kv_blocks");
        w_uint(b, r->kv_blocks);
    }
    return enc_done(b);
}

int proto_encode_registered(proto_buf *b, uint32_t heartbeat_ms) {
    w_head(b, 1, "registered");
    w_key(b, "heartbeat_ms"); w_uint(b, heartbeat_ms);
    return enc_done(b);
}

int proto_encode_hb_worker(proto_buf *b, uint64_t step, uint32_t free_slots, uint32_t running,
                           uint64_t prefills_shared) {
    return proto_encode_hb_kv(b, step, free_slots, running, prefills_shared, NULL);
}

int proto_encode_hb_kv(proto_buf *b, uint64_t step, uint32_t free_slots, uint32_t running, uint64_t prefills_shared,
                       const proto_kv *kv) {
    int has_kv = kv && kv->has_kv, has_h = kv && kv->has_hashes;
    uint32_t nh = has_h ? (kv->n_hashes > PROTO_MAX_KV_HASHES ? PROTO_MAX_KV_HASHES : kv->n_hashes) : 0;
    w_head(b, 3 + (prefills_shared != 0) + (has_kv ? 7 : 0) + (has_h ? 1 : 0), "hb");
    w_key(b, "step"); w_uint(b, step);
    w_key(b, "free_slots"); w_uint(b, free_slots);
    w_key(b, "running"); w_uint(b, running);
    if (prefills_shared) {
        w_key(b, "prefills_shared");
        w_uint(b, prefills_shared);
    }
    if (has_kv) {
        w_key(b, "kv_used");
        w_uint(b, kv->used);
        w_key(b, "kv_free");
        w_uint(b, kv->free);
        w_key(b, "kv_cached");
        w_uint(b, kv->cached);
        w_key(b, "kv_hit_tokens");
        w_uint(b, kv->hit_tokens);
        w_key(b, "kv_prompt_tokens");
        w_uint(b, kv->prompt_tokens);
        w_key(b, "kv_preemptions");
        w_uint(b, kv->preemptions);
        w_key(b, "kv_evictions");
        w_uint(b, kv->evictions);
    }
    if (has_h) {
        w_key(b, "kv_hashes");
        w_arr(b, nh);
        for (uint32_t i = 0; i < nh; i++) w_uint(b, kv->hashes[i]);
    }
    return enc_done(b);
}

int proto_encode_hb_broker(proto_buf *b) { w_head(b, 0, "hb"); return enc_done(b); }
int proto_encode_reregister(proto_buf *b) { w_head(b, 0, "reregister"); return enc_done(b); }

int proto_encode_assign(proto_buf *b, const proto_seq *seqs, uint32_t n_seqs) {
    w_head(b, 1, "assign");
    w_key(b, "seqs");
    w_arr(b, n_seqs);
    for (uint32_t i = 0; i < n_seqs; i++) {
        const proto_seq *s = &seqs[i];
        w_map(b, 3 + SAMPLING_FIELDS + 1 + 1 + 1 + (s->format.kind ? 1 : 0) + sampling_extra(&s->sampling) +
                     (s->share != 0));
        w_key(b, "rid"); w_uint(b, s->rid);
        w_key(b, "tokens"); w_i32arr(b, s->tokens, s->n_tokens);
        w_key(b, "max_tokens"); w_uint(b, s->max_tokens);
        w_sampling(b, &s->sampling, 1);
        w_key(b, "stop_ids"); w_i32arr(b, s->stop_ids, s->n_stop_ids);
        if (s->format.kind) w_format(b, &s->format);
        if (s->share) {
            w_key(b, "share");
            w_uint(b, s->share);
        }
        w_key(b, "priority");
        w_int(b, s->priority);
    }
    return enc_done(b);
}

int proto_encode_out(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks,
                     const uint8_t *fin, uint32_t n) {
    return proto_encode_out_lp(b, step, rids, toks, fin, NULL, n);
}

int proto_encode_out_lp(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks, const uint8_t *fin,
                        const proto_logprob *lps, uint32_t n) {
    return proto_encode_out_plp(b, step, rids, toks, fin, lps, NULL, n);
}

int proto_encode_out_plp(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks, const uint8_t *fin,
                         const proto_logprob *lps, const proto_plp *plp, uint32_t n) {
    w_head(b, 4 + (lps != NULL) + (plp != NULL), "out");
    w_key(b, "step"); w_uint(b, step);
    w_key(b, "rids"); w_arr(b, n);
    for (uint32_t i = 0; i < n; i++) w_uint(b, rids[i]);
    w_key(b, "toks"); w_i32arr(b, toks, n);
    w_key(b, "fin"); w_arr(b, n);
    for (uint32_t i = 0; i < n; i++) w_uint(b, fin[i]);
    if (lps) {
        w_key(b, "lps");
        w_arr(b, n);
        for (uint32_t i = 0; i < n; i++) w_logprob(b, &lps[i]);
    }
    if (plp) {
        w_key(b, "plp");
        w_arr(b, n);
        for (uint32_t i = 0; i < n; i++) {
            if (!plp[i].n) {
                uint8_t c = 0xc0;
                w_bytes(b, &c, 1);
                continue;
            }
            w_arr(b, 2);
            w_uint(b, plp[i].start);
            w_arr(b, plp[i].n);
            for (uint32_t j = 0; j < plp[i].n; j++) w_logprob(b, &plp[i].lps[j]);
        }
    }
    return enc_done(b);
}

int proto_encode_plps(proto_buf *b, const proto_plps *p) {
    w_head(b, 4 + (p->index != 0), "prompt_logprobs");
    w_key(b, "id");
    w_str(b, p->id);
    w_key(b, "start");
    w_uint(b, p->start);
    w_key(b, "ids");
    w_i32arr(b, p->ids, p->n_ids);
    w_key(b, "logprobs");
    w_arr(b, p->n_ids);
    for (uint32_t i = 0; i < p->n_ids; i++) w_logprob(b, &p->lps[i]);
    if (p->index) {
        w_key(b, "index");
        w_uint(b, p->index);
    }
    return enc_done(b);
}

void proto_buf_free(proto_buf *b) {
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * defaults and names */

void proto_sampling_defaults(proto_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    s->repeat_penalty = 1.0f;
    s->repeat_last_n = 64;
}

void proto_generate_defaults(proto_generate *g) {
    memset(g, 0, sizeof *g);
    proto_sampling_defaults(&g->sampling);
    g->max_tokens = 128;
    g->stream = 1;
    g->deadline_ms = 600000;
    g->add_bos = -1;
    g->n = 1;
}

proto_str proto_cstr(const char *s) {
    proto_str r = { s, s ? (uint32_t)strlen(s) : 0 };
    return r;
}

int proto_str_eq(proto_str a, const char *s) {
    if (!a.p || !s) return 0;
    return key_is(a, s);
}

char *proto_str_copy(proto_str s, char *dst, size_t cap) {
    if (!cap) return dst;
    size_t n = s.p ? s.n : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, s.p, n);
    dst[n] = 0;
    return dst;
}

const char *proto_type_name(proto_type t) {
    if ((int)t <= 0 || t >= PROTO_TYPE_COUNT) return "?";
    return s_types[t].name;
}

static const char *const s_finish_names[PROTO_FINISH_COUNT] = {
    "", "stop", "length", "cancelled", "error", "timeout", "overloaded",
};
const char *proto_finish_name(proto_finish f) {
    if ((int)f < 0 || f >= PROTO_FINISH_COUNT) return "";
    return s_finish_names[f];
}

static const char *const s_code_names[PROTO_CODE_COUNT] = {
    "",
    "bad_request",
    "unknown_model",
    "prompt_too_long",
    "template_error",
    "overloaded",
    "worker_failed",
    "timeout",
    "shutting_down",
    "duplicate_id",
    "internal",
    "bad_message",
    "too_large",
    "no_capacity",
    "broker_restarted",
    "broker_unreachable",
    "other",
};
const char *proto_code_name(proto_code c) {
    if ((int)c < 0 || c >= PROTO_CODE_COUNT) return "";
    return s_code_names[c];
}

proto_code proto_code_parse(proto_str s) {
    if (!s.p || s.n == 0) return PROTO_CODE_NONE;
    for (int c = 1; c < PROTO_CODE_OTHER; c++)
        if (key_is(s, s_code_names[c])) return (proto_code)c;
    return PROTO_CODE_OTHER;
}
