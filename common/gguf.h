/* common/gguf.h: a read-only GGUF (v2, v3) reader over mmap.
 *
 * gguf_open() validates the whole header before returning: every metadata value (all types, nested arrays),
 * every tensor info (name, dims, type, offset), alignment, and that each tensor's bytes lie inside the file.
 * A malformed file is refused with one line in err naming the file and the problem; nothing is asserted.
 * Strings in the file are not NUL-terminated; the reader keeps (pointer, length) pairs into the mapping, and
 * gguf_str_dup() / the *_cstr helpers copy when a C string is needed. */
#ifndef ZLLM_GGUF_H
#define ZLLM_GGUF_H
#include <stddef.h>
#include <stdint.h>

/* metadata value types, as numbered by the GGUF format */
typedef enum {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3, GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7, GGUF_T_STRING = 8, GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11, GGUF_T_FLOAT64 = 12, GGUF_T_COUNT
} gguf_vtype;

/* tensor element types, as numbered by ggml */
typedef enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
    GGML_Q8_K = 15, GGML_I8 = 24, GGML_I16 = 25, GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28, GGML_BF16 = 30,
    GGML_TYPE_COUNT = 40
} ggml_type;

typedef struct {
    const char *ptr;     /* bytes inside the mapping, NOT NUL-terminated */
    uint64_t len;        /* length in bytes */
} gguf_str;

/* one metadata value. Scalars are decoded; arrays point into the mapping. */
typedef struct {
    gguf_vtype type;      /* value type */
    union {
        uint64_t u64;     /* UINT8/16/32/64, BOOL */
        int64_t  i64;     /* INT8/16/32/64 */
        double   f64;     /* FLOAT32/64 */
        gguf_str str;     /* STRING */
        struct {
            gguf_vtype elem;     /* element type (may itself be ARRAY for nested arrays) */
            uint64_t n;          /* element count */
            const uint8_t *data; /* first element's bytes in the mapping */
            uint64_t nbytes;     /* total encoded size of the elements */
            uint64_t *offs;      /* arrays of STRING only: [n] offset of each element's length field from data, built at open */
        } arr;            /* ARRAY */
    } v;
} gguf_value;

typedef struct {
    gguf_str key;         /* key name (not NUL-terminated) */
    gguf_value val;       /* its value */
} gguf_kv;

typedef struct {
    char name[256];       /* NUL-terminated copy of the tensor name (names over 255 bytes are refused) */
    uint32_t n_dims;      /* 1..4 */
    int64_t ne[4];        /* elements per dimension, ne[0] fastest (a row); unused dims are 1 */
    ggml_type type;       /* element type */
    uint64_t offset;      /* offset from the start of the data section */
    uint64_t nbytes;      /* bytes of data (rows * row size of the type) */
    const void *data;     /* pointer into the mapping */
} gguf_tensor;

typedef struct gguf gguf;
struct gguf {
    char *path;               /* file name, for messages */
    uint32_t version;         /* 2 or 3 */
    uint64_t n_kv;            /* metadata count */
    gguf_kv *kv;              /* [n_kv] */
    uint64_t n_tensors;       /* tensor count */
    gguf_tensor *tensors;     /* [n_tensors] */
    uint64_t alignment;       /* general.alignment, default 32 */
    uint64_t data_offset;     /* file offset of the data section */
    const uint8_t *map;       /* the whole file, read-only */
    uint64_t size;            /* file size in bytes */
    int owns_map;             /* 1 when gguf_close must munmap (gguf_open), 0 for gguf_open_mem */
};

/* Opens and validates path. Returns NULL on any problem with a one-line message in err
 * ("FILE: problem"); never crashes on malformed input. */
gguf *gguf_open(const char *path, char *err, size_t errlen);
/* Same over a caller-owned buffer (kept, not copied, until gguf_close); used by the fuzz target. */
gguf *gguf_open_mem(const void *buf, uint64_t size, const char *name, char *err, size_t errlen);
/* Unmaps and frees; idempotent; sets *g to NULL. */
void gguf_close(gguf **g);

/* metadata lookups: return NULL / default when the key is absent */
const gguf_value *gguf_get(const gguf *g, const char *key);
/* integer of any integer/bool type, or def when absent or not an integer */
int64_t gguf_get_int(const gguf *g, const char *key, int64_t def);
/* float of FLOAT32/FLOAT64 (or an integer), or def */
double gguf_get_float(const gguf *g, const char *key, double def);
/* string as a freshly malloc'd C string, or NULL when absent or not a string (embedded NULs cut it short) */
char *gguf_get_cstr(const gguf *g, const char *key);
/* true when the string value equals s */
int gguf_str_eq(gguf_str a, const char *s);

/* array helpers: element i of an array of a fixed-size scalar type / of strings.
 * Return -1 when i is out of range or the type does not match. Arrays of strings are indexed once at open,
 * so gguf_arr_str is O(1). */
int gguf_arr_str(const gguf *g, const gguf_value *arr, uint64_t i, gguf_str *out);
int gguf_arr_f32(const gguf_value *arr, uint64_t i, float *out);
int gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out);

const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name);

/* type traits: block size in elements and bytes per block; 0 for types we do not read */
int ggml_type_block(ggml_type t);
size_t ggml_type_block_bytes(ggml_type t);
const char *ggml_type_name(ggml_type t);
/* bytes of one row of n elements; 0 if n is not a multiple of the block size or the type is unknown */
size_t ggml_row_bytes(ggml_type t, int64_t n);
#endif
