/* tools/gguf_write.c: GGUF v3 writer (see gguf_write.h). The header (metadata + tensor infos) is encoded into
 * a growing byte buffer as calls arrive; tensor infos are encoded at open time, when offsets are known. */
#include "gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;      /* NUL-terminated tensor name */
    int n_dims;      /* 1..4 */
    int64_t ne[4];   /* elements per dimension, ne[0] = row length */
    ggml_type type;  /* element type */
    uint64_t nbytes; /* data bytes */
    uint64_t offset; /* offset from the data section start (set at open) */
} s_tinfo;

struct gguf_writer {
    uint8_t *kv;         /* encoded metadata key/value pairs */
    size_t kv_len;       /* bytes used in kv */
    size_t kv_cap;       /* bytes allocated in kv */
    uint64_t n_kv;       /* metadata count */
    char **keys;         /* [n_kv] copies of the keys, for duplicate checks */
    s_tinfo *t;          /* [n_t] declared tensors */
    int n_t;             /* tensor count */
    int cap_t;           /* allocated entries of t */
    uint64_t alignment;  /* from general.alignment when set, else 32 */
    char err[256];       /* first recorded error, "" when none */
    int fd;              /* output file, -1 when not open */
    char *path;          /* output path, for messages */
    uint64_t data_start; /* file offset of the data section */
    uint64_t file_size;  /* total file size */
    uint64_t app_pos;    /* append mode: bytes of data section written so far (incl. padding) */
    int app_t;           /* append mode: current tensor index */
    uint64_t app_off;    /* append mode: bytes of the current tensor written */
};

static int s_fail(gguf_writer *w, const char *fmt, ...) {
    if (w->err[0] == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void s_msg(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int s_put(gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *nb = realloc(w->kv, cap);
        if (!nb) return s_fail(w, "out of memory encoding metadata");
        w->kv = nb;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int s_put_u32(gguf_writer *w, uint32_t v) { return s_put(w, &v, 4); }
static int s_put_u64(gguf_writer *w, uint64_t v) { return s_put(w, &v, 8); }
static int s_put_str(gguf_writer *w, const char *s, uint64_t len) {
    if (s_put_u64(w, len) != 0) return -1;
    return len ? s_put(w, s, (size_t)len) : 0;
}

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->fd = -1;
    w->alignment = 32;
    return w;
}

void gguf_writer_destroy(gguf_writer **pw) {
    if (!pw || !*pw) return;
    gguf_writer *w = *pw;
    if (w->fd >= 0) close(w->fd);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w->path);
    free(w);
    *pw = NULL;
}

/* starts a key/value pair: checks the key, writes it and the value type */
static int s_key(gguf_writer *w, const char *key, gguf_vtype type) {
    if (w->fd >= 0) return s_fail(w, "metadata %s set after gguf_writer_open", key);
    if (!key || !*key) return s_fail(w, "empty metadata key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return s_fail(w, "metadata key %s set twice", key);
    char **nk = realloc(w->keys, (w->n_kv + 1) * sizeof *nk);
    if (!nk) return s_fail(w, "out of memory");
    w->keys = nk;
    if (!(w->keys[w->n_kv] = strdup(key))) return s_fail(w, "out of memory");
    w->n_kv++;
    if (s_put_str(w, key, strlen(key)) != 0) return -1;
    return s_put_u32(w, (uint32_t)type);
}

static int s_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *v, size_t n) {
    if (s_key(w, key, t) != 0) return -1;
    return s_put(w, v, n);
}

int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) { return s_scalar(w, key, GGUF_T_UINT8, &v, 1); }
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) { return s_scalar(w, key, GGUF_T_INT8, &v, 1); }
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) { return s_scalar(w, key, GGUF_T_UINT16, &v, 2); }
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) { return s_scalar(w, key, GGUF_T_INT16, &v, 2); }
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    if (key && strcmp(key, "general.alignment") == 0) {
        if (v == 0 || (v & (v - 1)) != 0) return s_fail(w, "general.alignment %u is not a power of two", v);
        w->alignment = v;
    }
    return s_scalar(w, key, GGUF_T_UINT32, &v, 4);
}
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { return s_scalar(w, key, GGUF_T_INT32, &v, 4); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return s_scalar(w, key, GGUF_T_UINT64, &v, 8); }
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) { return s_scalar(w, key, GGUF_T_INT64, &v, 8); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { return s_scalar(w, key, GGUF_T_FLOAT32, &v, 4); }
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v) { return s_scalar(w, key, GGUF_T_FLOAT64, &v, 8); }
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    return s_scalar(w, key, GGUF_T_BOOL, &b, 1);
}

int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t len) {
    if (!v && len) return s_fail(w, "metadata %s: NULL string", key ? key : "?");
    if (s_key(w, key, GGUF_T_STRING) != 0) return -1;
    return s_put_str(w, v, len);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    return gguf_writer_set_strn(w, key, v, v ? strlen(v) : 0);
}

/* bytes of one element of a fixed-size type, 0 for STRING/ARRAY/unknown */
static size_t s_vsize(gguf_vtype t) {
    switch (t) {
    case GGUF_T_UINT8:
    case GGUF_T_INT8:
    case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16:
    case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32:
    case GGUF_T_INT32:
    case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64:
    case GGUF_T_INT64:
    case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n) {
    size_t es = s_vsize(elem);
    if (es == 0) return s_fail(w, "metadata %s: array element type %d is not a fixed-size scalar", key, (int)elem);
    if (n && !data) return s_fail(w, "metadata %s: NULL array", key);
    if (n > SIZE_MAX / es) return s_fail(w, "metadata %s: array too large", key);
    if (s_key(w, key, GGUF_T_ARRAY) != 0 || s_put_u32(w, (uint32_t)elem) != 0 || s_put_u64(w, n) != 0) return -1;
    return n ? s_put(w, data, (size_t)(n * es)) : 0;
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                            uint64_t n) {
    if (n && !strs) return s_fail(w, "metadata %s: NULL array", key);
    if (s_key(w, key, GGUF_T_ARRAY) != 0 || s_put_u32(w, GGUF_T_STRING) != 0 || s_put_u64(w, n) != 0) return -1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
        if (!strs[i] && len) return s_fail(w, "metadata %s: NULL string at %llu", key, (unsigned long long)i);
        if (s_put_str(w, strs[i], len) != 0) return -1;
    }
    return 0;
}

int gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    switch (v->type) {
    case GGUF_T_UINT8: return gguf_writer_set_u8(w, key, (uint8_t)v->v.u64);
    case GGUF_T_INT8: return gguf_writer_set_i8(w, key, (int8_t)v->v.i64);
    case GGUF_T_UINT16: return gguf_writer_set_u16(w, key, (uint16_t)v->v.u64);
    case GGUF_T_INT16: return gguf_writer_set_i16(w, key, (int16_t)v->v.i64);
    case GGUF_T_UINT32: return gguf_writer_set_u32(w, key, (uint32_t)v->v.u64);
    case GGUF_T_INT32: return gguf_writer_set_i32(w, key, (int32_t)v->v.i64);
    case GGUF_T_UINT64: return gguf_writer_set_u64(w, key, v->v.u64);
    case GGUF_T_INT64: return gguf_writer_set_i64(w, key, v->v.i64);
    case GGUF_T_FLOAT32: return gguf_writer_set_f32(w, key, (float)v->v.f64);
    case GGUF_T_FLOAT64: return gguf_writer_set_f64(w, key, v->v.f64);
    case GGUF_T_BOOL: return gguf_writer_set_bool(w, key, v->v.u64 != 0);
    case GGUF_T_STRING: return gguf_writer_set_strn(w, key, v->v.str.ptr, v->v.str.len);
    case GGUF_T_ARRAY:
        if ((v->v.arr.nbytes && !v->v.arr.data) || v->v.arr.nbytes > SIZE_MAX)
            return s_fail(w, "metadata %s: bad array value", key);
        if (s_key(w, key, GGUF_T_ARRAY) != 0 || s_put_u32(w, (uint32_t)v->v.arr.elem) != 0 ||
            s_put_u64(w, v->v.arr.n) != 0)
            return -1;
        return v->v.arr.nbytes ? s_put(w, v->v.arr.data, (size_t)v->v.arr.nbytes) : 0;
    default: return s_fail(w, "metadata %s: unknown value type %d", key, (int)v->type);
    }
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne, ggml_type type) {
    if (w->fd >= 0) return s_fail(w, "tensor %s added after gguf_writer_open", name);
    if (!name || !*name || strlen(name) > 255) return s_fail(w, "bad tensor name");
    if (n_dims < 1 || n_dims > 4) return s_fail(w, "tensor %s: %d dims", name, n_dims);
    for (int i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return s_fail(w, "tensor %s added twice", name);
    uint64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return s_fail(w, "tensor %s: dim %d is %lld", name, d, (long long)ne[d]);
        if (d > 0) rows *= (uint64_t)ne[d];
    }
    size_t row = ggml_row_bytes(type, ne[0]);
    if (row == 0)
        return s_fail(w, "tensor %s: row length %lld does not fit type %d", name, (long long)ne[0], (int)type);
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 64;
        s_tinfo *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return s_fail(w, "out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    s_tinfo *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return s_fail(w, "out of memory");
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->nbytes = rows * (uint64_t)row;
    return w->n_t++;
}

uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }

uint64_t gguf_writer_file_size(const gguf_writer *w) { return w->file_size; }

static uint64_t s_align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int s_pwrite_all(int fd, const void *data, uint64_t n, uint64_t off) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = pwrite(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int gguf_writer_open(gguf_writer *w, const char *path, char *err, size_t errlen) {
    uint8_t *hdr = NULL;
    if (w->err[0]) {
        s_msg(err, errlen, "%s: %s", path, w->err);
        return -1;
    }
    if (w->fd >= 0) {
        s_msg(err, errlen, "%s: writer already open", path);
        return -1;
    }
    /* layout: data offsets */
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off = s_align(off + w->t[i].nbytes, w->alignment);
    }
    uint64_t data_len = off;
    /* header = fixed part + metadata + tensor infos. The fixed part and the infos are encoded after the
     * metadata in the same buffer, assembled in file order into hdr, then cut off again. */
    size_t kv_len = w->kv_len;
    uint32_t magic = 0x46554747u, version = 3; /* "GGUF" little-endian */
    uint64_t n_t = (uint64_t)w->n_t;
    if (s_put(w, &magic, 4) || s_put(w, &version, 4) || s_put_u64(w, n_t) || s_put_u64(w, w->n_kv)) goto fail_rec;
    size_t fixed_at = kv_len; /* the fixed part sits after the kv bytes in the buffer for now */
    for (int i = 0; i < w->n_t; i++) {
        s_tinfo *t = &w->t[i];
        if (s_put_str(w, t->name, strlen(t->name)) || s_put_u32(w, (uint32_t)t->n_dims)) goto fail_rec;
        for (int d = 0; d < t->n_dims; d++)
            if (s_put_u64(w, (uint64_t)t->ne[d])) goto fail_rec;
        if (s_put_u32(w, (uint32_t)t->type) || s_put_u64(w, t->offset)) goto fail_rec;
    }
    size_t hdr_len = w->kv_len; /* fixed(24) + kv + infos */
    w->data_start = s_align(hdr_len, w->alignment);
    w->file_size = w->data_start + data_len;
    hdr = calloc(1, (size_t)w->data_start);
    if (!hdr) {
        s_msg(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    memcpy(hdr, w->kv + fixed_at, 24);
    memcpy(hdr + 24, w->kv, kv_len);
    memcpy(hdr + 24 + kv_len, w->kv + fixed_at + 24, hdr_len - fixed_at - 24);
    w->kv_len = kv_len; /* the buffer holds the metadata alone again */

    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        s_msg(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto fail;
    }
    free(w->path);
    if (!(w->path = strdup(path))) {
        s_msg(err, errlen, "%s: out of memory", path);
        unlink(path);
        goto fail;
    }
    if (s_pwrite_all(w->fd, hdr, w->data_start, 0) != 0 || ftruncate(w->fd, (off_t)w->file_size) != 0) {
        s_msg(err, errlen, "%s: write failed: %s", path, strerror(errno));
        unlink(path);
        goto fail;
    }
    w->app_pos = 0;
    w->app_t = 0;
    w->app_off = 0;
    free(hdr);
    return 0;
fail_rec:
    s_msg(err, errlen, "%s: %s", path, w->err[0] ? w->err : "header encoding failed");
fail:
    w->kv_len = kv_len;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    free(hdr);
    return -1;
}

int gguf_writer_write_at(gguf_writer *w, int i, uint64_t off, const void *data, uint64_t nbytes, char *err,
                         size_t errlen) {
    if (w->fd < 0) {
        s_msg(err, errlen, "gguf writer: not open");
        return -1;
    }
    if (i < 0 || i >= w->n_t || off > w->t[i].nbytes || nbytes > w->t[i].nbytes - off) {
        s_msg(err, errlen, "%s: write outside tensor %d", w->path, i);
        return -1;
    }
    if (s_pwrite_all(w->fd, data, nbytes, w->data_start + w->t[i].offset + off) != 0) {
        s_msg(err, errlen, "%s: write failed: %s", w->path, strerror(errno));
        return -1;
    }
    return 0;
}

int gguf_writer_append(gguf_writer *w, const void *data, uint64_t nbytes, char *err, size_t errlen) {
    const uint8_t *p = data;
    while (nbytes > 0) {
        while (w->app_t < w->n_t && w->app_off == w->t[w->app_t].nbytes) {
            w->app_t++;
            w->app_off = 0;
        }
        if (w->app_t >= w->n_t) {
            s_msg(err, errlen, "%s: more tensor data appended than declared", w->path ? w->path : "gguf");
            return -1;
        }
        s_tinfo *t = &w->t[w->app_t];
        uint64_t n = t->nbytes - w->app_off;
        if (n > nbytes) n = nbytes;
        if (gguf_writer_write_at(w, w->app_t, w->app_off, p, n, err, errlen) != 0) return -1;
        w->app_off += n;
        w->app_pos += n;
        p += n;
        nbytes -= n;
    }
    return 0;
}

int gguf_writer_close(gguf_writer *w, char *err, size_t errlen) {
    if (w->fd < 0) {
        s_msg(err, errlen, "gguf writer: not open");
        return -1;
    }
    int rc = 0;
    if (w->app_pos > 0) {
        uint64_t total = 0;
        for (int i = 0; i < w->n_t; i++) total += w->t[i].nbytes;
        if (w->app_pos != total) {
            s_msg(err, errlen, "%s: %llu of %llu tensor bytes appended", w->path, (unsigned long long)w->app_pos,
                  (unsigned long long)total);
            rc = -1;
        }
    }
    if (close(w->fd) != 0 && rc == 0) {
        s_msg(err, errlen, "%s: close failed: %s", w->path, strerror(errno));
        rc = -1;
    }
    w->fd = -1;
    return rc;
}
