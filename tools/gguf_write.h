/* tools/gguf_write.h: a GGUF v3 writer that streams tensor data.
 *
 * Use: gguf_writer_new(); set metadata (gguf_writer_set_*) and declare every tensor (gguf_writer_add_tensor) in
 * file order; gguf_writer_open() computes the layout (each tensor's data aligned to general.alignment, default
 * 32), writes the whole header and sizes the file; then write each tensor's bytes, either in order with
 * gguf_writer_append() or from any number of threads with gguf_writer_write_at() (pwrite at precomputed
 * offsets); gguf_writer_close() checks that every tensor byte was written and closes the file. Only the header
 * is held in memory, never tensor data.
 *
 * Errors: the setters and add_tensor record the first problem in the writer and return -1; gguf_writer_open()
 * then refuses with that message. The functions taking err/errlen put a one-line message there. */
#ifndef ZLLM_GGUF_WRITE_H
#define ZLLM_GGUF_WRITE_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"

typedef struct gguf_writer gguf_writer;

/* an empty writer, or NULL when out of memory */
gguf_writer *gguf_writer_new(void);
/* closes the file if still open (the output is then incomplete) and frees; idempotent; sets *w to NULL */
void gguf_writer_destroy(gguf_writer **w);

/* metadata, kept in the order set. Setting a key twice is an error. Return 0, or -1 (recorded) on failure. */
int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* a string of len bytes (may hold NULs) */
int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t len);
/* an array of n elements of a fixed-size scalar type (not STRING/ARRAY), data in host (little-endian) layout;
 * BOOL elements are one byte each */
int gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n);
/* an array of n strings; lens may be NULL (then each is NUL-terminated) */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens, uint64_t n);
/* a copy of a value read by gguf.h (any type; arrays, nested ones too, are copied as their encoded bytes) */
int gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v);

/* Declares a tensor (data follows in declaration order). n_dims 1..4, ne[0] the row length; the row length
 * must be a multiple of type's block size. Returns the tensor's index, or -1 (recorded). */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne, ggml_type type);
/* bytes of tensor i's data (0 for a bad index) */
uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int i);

/* Creates path (truncating it), writes the header and sizes the file. Returns 0, or -1 with a message (a recorded
 * setter error, or I/O; a file it created is then removed). */
int gguf_writer_open(gguf_writer *w, const char *path, char *err, size_t errlen);
/* Writes the next nbytes of tensor data in file order (tensor 0 first; chunks may split a tensor anywhere).
 * Returns 0, or -1 with a message on I/O error or when more bytes are given than tensors remain. */
int gguf_writer_append(gguf_writer *w, const void *data, uint64_t nbytes, char *err, size_t errlen);
/* Thread-safe: writes nbytes at byte offset off inside tensor i's data. Returns 0, or -1 with a message. */
int gguf_writer_write_at(gguf_writer *w, int i, uint64_t off, const void *data, uint64_t nbytes, char *err,
                         size_t errlen);
/* Closes the file. Returns 0, or -1 with a message when the close fails or (append mode only) when fewer
 * tensor bytes were appended than declared; write_at users are trusted to have covered every tensor. */
int gguf_writer_close(gguf_writer *w, char *err, size_t errlen);
/* the file size once open (header + aligned data) */
uint64_t gguf_writer_file_size(const gguf_writer *w);
#endif
