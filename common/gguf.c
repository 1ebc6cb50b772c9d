/* common/gguf.c: GGUF v2/v3 reader over mmap.
 *
 * Every length and count read from the file is checked against the bytes that remain before it is used, so a
 * truncated or corrupt file is refused with a message instead of reading out of bounds or allocating what the
 * file claims. Layout (little endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv x (str key, u32 type, value)
 *   | n_tensors x (str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset) | pad to alignment | data
 * (v1 used u32 counts; it is refused.) */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gguf.h"

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_ARRAY_DEPTH 8          /* nested arrays deeper than this are refused */
#define GGUF_MAX_KEY 65535               /* longest key we accept, bytes */

typedef struct {
    const uint8_t *base; /* start of the file */
    const uint8_t *p;    /* cursor */
    const uint8_t *end;  /* one past the last byte */
    char *err;           /* message buffer */
    size_t errlen;
    const char *name;    /* file name for messages */
} s_cur;

/* type traits: elements per block, bytes per block */
static const struct { int blk; size_t bytes; const char *name; } s_types[GGML_TYPE_COUNT] = {
    [GGML_F32] = {1, 4, "F32"},       [GGML_F16] = {1, 2, "F16"},       [GGML_BF16] = {1, 2, "BF16"},
    [GGML_Q4_0] = {32, 18, "Q4_0"},   [GGML_Q4_1] = {32, 20, "Q4_1"},   [GGML_Q5_0] = {32, 22, "Q5_0"},
    [GGML_Q5_1] = {32, 24, "Q5_1"},   [GGML_Q8_0] = {32, 34, "Q8_0"},   [GGML_Q8_1] = {32, 36, "Q8_1"},
    [GGML_Q2_K] = {256, 84, "Q2_K"},  [GGML_Q3_K] = {256, 110, "Q3_K"}, [GGML_Q4_K] = {256, 144, "Q4_K"},
    [GGML_Q5_K] = {256, 176, "Q5_K"}, [GGML_Q6_K] = {256, 210, "Q6_K"}, [GGML_Q8_K] = {256, 292, "Q8_K"},
    [GGML_I8] = {1, 1, "I8"},         [GGML_I16] = {1, 2, "I16"},       [GGML_I32] = {1, 4, "I32"},
    [GGML_I64] = {1, 8, "I64"},       [GGML_F64] = {1, 8, "F64"},
};

int ggml_type_block(ggml_type t) {
    return (unsigned)t < GGML_TYPE_COUNT ? s_types[t].blk : 0;
}
size_t ggml_type_block_bytes(ggml_type t) {
    return (unsigned)t < GGML_TYPE_COUNT ? s_types[t].bytes : 0;
}
const char *ggml_type_name(ggml_type t) {
    return (unsigned)t < GGML_TYPE_COUNT && s_types[t].name ? s_types[t].name : "unknown";
}
size_t ggml_row_bytes(ggml_type t, int64_t n) {
    int blk = ggml_type_block(t);
    if (blk <= 0 || n < 0 || n % blk) return 0;
    return (size_t)(n / blk) * ggml_type_block_bytes(t);
}

static int s_fail(s_cur *c, const char *fmt, ...) {
    int k = snprintf(c->err, c->errlen, "%s: ", c->name);
    if (k < 0 || (size_t)k >= c->errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t s_left(const s_cur *c) { return (uint64_t)(c->end - c->p); }

static int s_take(s_cur *c, void *dst, size_t n, const char *what) {
    if (s_left(c) < n) return s_fail(c, "truncated file: %s needs %zu bytes at offset %zu, %llu left", what, n,
                                     (size_t)(c->p - c->base), (unsigned long long)s_left(c));
    memcpy(dst, c->p, n);
    c->p += n;
    return 0;
}
#define TAKE(c, v, what) s_take((c), &(v), sizeof(v), (what))

static int s_str(s_cur *c, gguf_str *s, const char *what) {
    uint64_t n = 0;
    if (TAKE(c, n, what)) return -1;
    if (n > s_left(c)) return s_fail(c, "truncated file: %s declares %llu bytes, %llu left", what,
                                      (unsigned long long)n, (unsigned long long)s_left(c));
    s->ptr = (const char *)c->p;
    s->len = n;
    c->p += n;
    return 0;
}

/* fixed encoded size of a scalar value type, 0 for STRING/ARRAY/unknown */
static size_t s_scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static void s_scalar_decode(uint32_t t, const uint8_t *p, gguf_value *v) {
    v->type = (gguf_vtype)t;
    switch (t) {
    case GGUF_T_UINT8: v->v.u64 = p[0]; break;
    case GGUF_T_BOOL: v->v.u64 = p[0] != 0; break;
    case GGUF_T_INT8: v->v.i64 = (int8_t)p[0]; break;
    case GGUF_T_UINT16: { uint16_t x; memcpy(&x, p, 2); v->v.u64 = x; break; }
    case GGUF_T_INT16: { int16_t x; memcpy(&x, p, 2); v->v.i64 = x; break; }
    case GGUF_T_UINT32: { uint32_t x; memcpy(&x, p, 4); v->v.u64 = x; break; }
    case GGUF_T_INT32: { int32_t x; memcpy(&x, p, 4); v->v.i64 = x; break; }
    case GGUF_T_FLOAT32: { float x; memcpy(&x, p, 4); v->v.f64 = x; break; }
    case GGUF_T_UINT64: { uint64_t x; memcpy(&x, p, 8); v->v.u64 = x; break; }
    case GGUF_T_INT64: { int64_t x; memcpy(&x, p, 8); v->v.i64 = x; break; }
    case GGUF_T_FLOAT64: { double x; memcpy(&x, p, 8); v->v.f64 = x; break; }
    }
}

/* skips one array body (element type already read, count n) checking every declared size; depth-limited */
static int s_skip_array(s_cur *c, uint32_t elem, uint64_t n, int depth) {
    if (depth > GGUF_MAX_ARRAY_DEPTH) return s_fail(c, "arrays nested deeper than %d", GGUF_MAX_ARRAY_DEPTH);
    size_t sz = s_scalar_size(elem);
    if (sz) {
        if (n > s_left(c) / sz) return s_fail(c, "truncated file: array of %llu elements of %zu bytes, %llu bytes left",
                                              (unsigned long long)n, sz, (unsigned long long)s_left(c));
        c->p += n * sz;
        return 0;
    }
    if (elem == GGUF_T_STRING) {
        /* each string takes at least 8 bytes: an absurd count fails here without looping for long */
        if (n > s_left(c) / 8) return s_fail(c, "truncated file: array of %llu strings, %llu bytes left",
                                             (unsigned long long)n, (unsigned long long)s_left(c));
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if (s_str(c, &s, "array string")) return -1;
        }
        return 0;
    }
    if (elem == GGUF_T_ARRAY) {
        if (n > s_left(c) / 12) return s_fail(c, "truncated file: array of %llu arrays, %llu bytes left",
                                              (unsigned long long)n, (unsigned long long)s_left(c));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t e2 = 0; uint64_t n2 = 0;
            if (TAKE(c, e2, "nested array type") || TAKE(c, n2, "nested array count")) return -1;
            if (s_skip_array(c, e2, n2, depth + 1)) return -1;
        }
        return 0;
    }
    return s_fail(c, "unknown metadata value type %u in an array", elem);
}

static int s_value(s_cur *c, uint32_t t, gguf_value *v) {
    size_t sz = s_scalar_size(t);
    memset(v, 0, sizeof *v);
    if (sz) {
        if (s_left(c) < sz) return s_fail(c, "truncated file: metadata value");
        s_scalar_decode(t, c->p, v);
        c->p += sz;
        return 0;
    }
    if (t == GGUF_T_STRING) {
        v->type = GGUF_T_STRING;
        return s_str(c, &v->v.str, "metadata string");
    }
    if (t == GGUF_T_ARRAY) {
        uint32_t elem = 0; uint64_t n = 0;
        if (TAKE(c, elem, "array type") || TAKE(c, n, "array count")) return -1;
        v->type = GGUF_T_ARRAY;
        v->v.arr.elem = (gguf_vtype)elem;
        v->v.arr.n = n;
        v->v.arr.data = c->p;
        if (s_skip_array(c, elem, n, 1)) return -1;
        v->v.arr.nbytes = (uint64_t)(c->p - v->v.arr.data);
        if (elem == GGUF_T_STRING && n) {
            /* index the strings once so lookups are O(1); n is bounded by the bytes present (8 per string) */
            uint64_t *offs = malloc(n * sizeof *offs);
            if (!offs) return s_fail(c, "out of memory indexing an array of %llu strings", (unsigned long long)n);
            const uint8_t *p = v->v.arr.data;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t len;
                offs[i] = (uint64_t)(p - v->v.arr.data);
                memcpy(&len, p, 8);
                p += 8 + len;
            }
            v->v.arr.offs = offs;
        }
        return 0;
    }
    return s_fail(c, "unknown metadata value type %u", t);
}

static void s_free(gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            if (g->kv[i].val.type == GGUF_T_ARRAY) free(g->kv[i].val.v.arr.offs);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    free(g);
}

static int s_cmp_name(const void *a, const void *b) {
    return strcmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

/* parses and validates the header at g->map[0, g->size) */
static int s_parse(gguf *g, char *err, size_t errlen) {
    s_cur c = {g->map, g->map, g->map + g->size, err, errlen, g->path};
    uint8_t magic[4];
    if (TAKE(&c, magic, "magic")) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return s_fail(&c, "bad magic (not a GGUF file)");
    if (TAKE(&c, g->version, "version")) return -1;
    if (g->version != 2 && g->version != 3)
        return s_fail(&c, "unsupported GGUF version %u (zllm reads 2 and 3)", g->version);
    if (TAKE(&c, g->n_tensors, "tensor count") || TAKE(&c, g->n_kv, "metadata count")) return -1;
    /* each kv takes >= 8+4+1 bytes, each tensor info >= 8+4+8+4+8: absurd counts fail before any allocation */
    if (g->n_kv > s_left(&c) / 13)
        return s_fail(&c, "absurd metadata count %llu (truncated or corrupt: %llu bytes cannot hold them)", (unsigned long long)g->n_kv,
                      (unsigned long long)g->size);
    if (g->n_tensors > s_left(&c) / 32)
        return s_fail(&c, "absurd tensor count %llu (truncated or corrupt: %llu bytes cannot hold them)", (unsigned long long)g->n_tensors,
                      (unsigned long long)g->size);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return s_fail(&c, "out of memory");
    g->alignment = 32;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint32_t t = 0;
        if (s_str(&c, &kv->key, "metadata key")) return -1;
        if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY) return s_fail(&c, "metadata key %llu has bad length %llu",
                                                                       (unsigned long long)i, (unsigned long long)kv->key.len);
        if (TAKE(&c, t, "metadata type")) return -1;
        if (s_value(&c, t, &kv->val)) return -1;
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->val.type != GGUF_T_UINT32 && kv->val.type != GGUF_T_UINT64 && kv->val.type != GGUF_T_INT32)
                return s_fail(&c, "general.alignment has the wrong type");
            uint64_t a = kv->val.v.u64;
            if (a == 0 || (a & (a - 1)) || a > 65536) return s_fail(&c, "bad alignment %llu", (unsigned long long)a);
            g->alignment = a;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        gguf_str name;
        uint32_t type = 0;
        if (s_str(&c, &name, "tensor name")) return -1;
        if (name.len == 0 || name.len >= sizeof t->name)
            return s_fail(&c, "tensor %llu: name length %llu out of range", (unsigned long long)i, (unsigned long long)name.len);
        memcpy(t->name, name.ptr, name.len);
        t->name[name.len] = 0;
        if (strlen(t->name) != name.len) return s_fail(&c, "tensor %llu: NUL inside its name", (unsigned long long)i);
        if (TAKE(&c, t->n_dims, "tensor dims")) return -1;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return s_fail(&c, "tensor '%s': %u dimensions (1..%d allowed)", t->name, t->n_dims, GGUF_MAX_DIMS);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne = 0;
            if (TAKE(&c, ne, "tensor shape")) return -1;
            if (ne == 0 || ne > (1ull << 40)) return s_fail(&c, "tensor '%s': dimension %u is %llu", t->name, d,
                                                            (unsigned long long)ne);
            if (nel > (1ull << 50) / ne) return s_fail(&c, "tensor '%s': element count overflows", t->name);
            nel *= ne;
            t->ne[d] = (int64_t)ne;
        }
        if (TAKE(&c, type, "tensor type")) return -1;
        if (type >= GGML_TYPE_COUNT || !s_types[type].blk)
            return s_fail(&c, "tensor '%s': unknown type %u", t->name, type);
        t->type = (ggml_type)type;
        if (TAKE(&c, t->offset, "tensor offset")) return -1;
        if (t->ne[0] % s_types[type].blk)
            return s_fail(&c, "tensor '%s': row of %lld elements is not a multiple of the %s block (%d)", t->name,
                          (long long)t->ne[0], s_types[type].name, s_types[type].blk);
        uint64_t rows = nel / (uint64_t)t->ne[0];
        uint64_t row = (uint64_t)ggml_row_bytes(t->type, t->ne[0]);
        if (rows && row > UINT64_MAX / rows) return s_fail(&c, "tensor '%s': byte size overflows", t->name);
        t->nbytes = row * rows;
    }
    uint64_t hdr = (uint64_t)(c.p - g->map);
    g->data_offset = (hdr + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && g->data_offset > g->size)
        return s_fail(&c, "truncated file: data section at %llu is past the end (%llu bytes)",
                      (unsigned long long)g->data_offset, (unsigned long long)g->size);
    uint64_t avail = g->size >= g->data_offset ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return s_fail(&c, "tensor '%s': offset %llu is not aligned to %llu", t->name,
                          (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return s_fail(&c, "tensor '%s' (%llu bytes at data offset %llu) lies outside the file (%llu data bytes): truncated?",
                          t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset, (unsigned long long)avail);
        t->data = g->map + g->data_offset + t->offset;
    }
    /* duplicate names: sort pointers by name (n log n: the count is bounded only by the file size) */
    if (g->n_tensors > 1) {
        const gguf_tensor **idx = malloc(g->n_tensors * sizeof *idx);
        if (!idx) return s_fail(&c, "out of memory");
        for (uint64_t i = 0; i < g->n_tensors; i++) idx[i] = &g->tensors[i];
        qsort(idx, g->n_tensors, sizeof *idx, s_cmp_name);
        for (uint64_t i = 1; i < g->n_tensors; i++)
            if (strcmp(idx[i - 1]->name, idx[i]->name) == 0) {
                s_fail(&c, "tensor '%s' appears twice", idx[i]->name);
                free(idx);
                return -1;
            }
        free(idx);
    }
    return 0;
}

gguf *gguf_open_mem(const void *buf, uint64_t size, const char *name, char *err, size_t errlen) {
    gguf *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "%s: out of memory", name); return NULL; }
    g->path = strdup(name ? name : "(memory)");
    g->map = buf;
    g->size = size;
    if (!g->path || s_parse(g, err, errlen)) {
        g->map = NULL; /* caller owns the buffer */
        s_free(g);
        return NULL;
    }
    return g;
}

gguf *gguf_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < 24) {
        snprintf(err, errlen, "%s: truncated file (%lld bytes, not a GGUF header)", path, (long long)st.st_size);
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) { snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno)); return NULL; }
    gguf *g = gguf_open_mem(m, (uint64_t)st.st_size, path, err, errlen);
    if (!g) { munmap(m, (size_t)st.st_size); return NULL; }
    g->owns_map = 1;
    return g;
}

void gguf_close(gguf **gp) {
    if (!gp || !*gp) return;
    gguf *g = *gp;
    if (g->owns_map && g->map) munmap((void *)g->map, (size_t)g->size);
    s_free(g);
    *gp = NULL;
}

int gguf_str_eq(gguf_str a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && memcmp(a.ptr, s, n) == 0;
}

const gguf_value *gguf_get(const gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i].val;
    return NULL;
}

int64_t gguf_get_int(const gguf *g, const char *key, int64_t def) {
    const gguf_value *v = gguf_get(g, key);
    if (!v) return def;
    switch (v->type) {
    case GGUF_T_UINT8: case GGUF_T_UINT16: case GGUF_T_UINT32: case GGUF_T_BOOL: return (int64_t)v->v.u64;
    case GGUF_T_UINT64: return v->v.u64 > INT64_MAX ? def : (int64_t)v->v.u64;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32: case GGUF_T_INT64: return v->v.i64;
    default: return def;
    }
}

double gguf_get_float(const gguf *g, const char *key, double def) {
    const gguf_value *v = gguf_get(g, key);
    if (!v) return def;
    if (v->type == GGUF_T_FLOAT32 || v->type == GGUF_T_FLOAT64) return v->v.f64;
    if (v->type == GGUF_T_ARRAY || v->type == GGUF_T_STRING) return def;
    return (double)gguf_get_int(g, key, 0);
}

char *gguf_get_cstr(const gguf *g, const char *key) {
    const gguf_value *v = gguf_get(g, key);
    if (!v || v->type != GGUF_T_STRING) return NULL;
    return strndup(v->v.str.ptr, (size_t)v->v.str.len);
}

int gguf_arr_str(const gguf *g, const gguf_value *arr, uint64_t i, gguf_str *out) {
    (void)g;
    if (!arr || arr->type != GGUF_T_ARRAY || arr->v.arr.elem != GGUF_T_STRING || i >= arr->v.arr.n) return -1;
    const uint8_t *p = arr->v.arr.data + arr->v.arr.offs[i];
    memcpy(&out->len, p, 8);
    out->ptr = (const char *)p + 8;
    return 0;
}

int gguf_arr_f32(const gguf_value *arr, uint64_t i, float *out) {
    if (!arr || arr->type != GGUF_T_ARRAY || i >= arr->v.arr.n) return -1;
    uint32_t e = arr->v.arr.elem;
    size_t sz = s_scalar_size(e);
    if (!sz) return -1;
    gguf_value v;
    s_scalar_decode(e, arr->v.arr.data + i * sz, &v);
    if (e == GGUF_T_FLOAT32 || e == GGUF_T_FLOAT64) *out = (float)v.v.f64;
    else if (e == GGUF_T_INT8 || e == GGUF_T_INT16 || e == GGUF_T_INT32 || e == GGUF_T_INT64) *out = (float)v.v.i64;
    else *out = (float)v.v.u64;
    return 0;
}

int gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out) {
    if (!arr || arr->type != GGUF_T_ARRAY || i >= arr->v.arr.n) return -1;
    uint32_t e = arr->v.arr.elem;
    size_t sz = s_scalar_size(e);
    if (!sz || e == GGUF_T_FLOAT32 || e == GGUF_T_FLOAT64) return -1;
    gguf_value v;
    s_scalar_decode(e, arr->v.arr.data + i * sz, &v);
    if (e == GGUF_T_INT8 || e == GGUF_T_INT16 || e == GGUF_T_INT32 || e == GGUF_T_INT64) *out = v.v.i64;
    else *out = (int64_t)v.v.u64;
    return 0;
}

const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}
