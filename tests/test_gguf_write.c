/* tests/test_gguf_write.c: tools/gguf_write.c read back by common/gguf.c: metadata of every value type
 * (incl. arrays of strings and a nested array copied with gguf_writer_set_value), tensor infos, alignment and
 * padding, streaming appends split across tensors, pwrite-style writes, and the recorded errors.
 * (Reading the same files with the gguf Python package is tests/test_mkmodel.py's job.) */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_craft.h"
#include "gguf_write.h"
#include "test.h"

static char s_dir[] = "/tmp/zllm-gw-XXXXXX";

static void test_roundtrip(int alignment, int use_append) {
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/rt-%d-%d.gguf", s_dir, alignment, use_append);
    gguf_writer *w = gguf_writer_new();
    CHECK(w != NULL, "writer");
    if (!w) return;
    CHECK(gguf_writer_set_u8(w, "k.u8", 200) == 0, "u8");
    gguf_writer_set_i8(w, "k.i8", -100);
    gguf_writer_set_u16(w, "k.u16", 60000);
    gguf_writer_set_i16(w, "k.i16", -30000);
    gguf_writer_set_u32(w, "k.u32", 4000000000u);
    gguf_writer_set_i32(w, "k.i32", -2000000000);
    gguf_writer_set_u64(w, "k.u64", 18000000000000000000ull);
    gguf_writer_set_i64(w, "k.i64", -9000000000000000000ll);
    gguf_writer_set_f32(w, "k.f32", 0.15625f);
    gguf_writer_set_f64(w, "k.f64", -1e300);
    gguf_writer_set_bool(w, "k.bool", 1);
    gguf_writer_set_str(w, "k.str", "héllo");
    gguf_writer_set_strn(w, "k.strn", "a\0b", 3);
    gguf_writer_set_str(w, "k.empty", "");
    if (alignment != 32) gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment);
    const char *strs[] = {"<s>", "", "▁the", "x"};
    gguf_writer_set_arr_str(w, "k.astr", strs, NULL, 4);
    float fa[3] = {1.5f, -2.0f, 1e-3f};
    gguf_writer_set_arr(w, "k.af32", GGUF_T_FLOAT32, fa, 3);
    int32_t ia[2] = {-7, 9};
    gguf_writer_set_arr(w, "k.ai32", GGUF_T_INT32, ia, 2);
    gguf_writer_set_arr(w, "k.aempty", GGUF_T_UINT8, NULL, 0);
    /* tensors: F32 [5, 3] (60 bytes, needs padding), Q8_0 [64, 2], F16 [7] */
    int64_t ne0[2] = {5, 3}, ne1[2] = {64, 2}, ne2[1] = {7};
    CHECK(gguf_writer_add_tensor(w, "t.f32", 2, ne0, GGML_F32) == 0, "add t.f32");
    CHECK(gguf_writer_add_tensor(w, "t.q8", 2, ne1, GGML_Q8_0) == 1, "add t.q8");
    CHECK(gguf_writer_add_tensor(w, "t.f16", 1, ne2, GGML_F16) == 2, "add t.f16");
    CHECK(gguf_writer_tensor_nbytes(w, 1) == 2 * 2 * 34, "q8 nbytes");
    CHECK(gguf_writer_open(w, path, err, sizeof err) == 0, "open: %s", err);
    uint8_t data[60 + 136 + 14];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
    data[60] = 0x00, data[61] = 0x3c;   /* keep the Q8_0 scale a finite fp16 (1.0) */
    data[60 + 34] = 0x00, data[60 + 35] = 0x3c;
    data[60 + 68] = 0x00, data[60 + 69] = 0x3c;
    data[60 + 102] = 0x00, data[60 + 103] = 0x3c;
    if (use_append) {
        /* chunks that straddle tensor boundaries */
        CHECK(gguf_writer_append(w, data, 50, err, sizeof err) == 0, "append: %s", err);
        CHECK(gguf_writer_append(w, data + 50, 100, err, sizeof err) == 0, "append: %s", err);
        CHECK(gguf_writer_append(w, data + 150, sizeof data - 150, err, sizeof err) == 0, "append: %s", err);
        CHECK(gguf_writer_append(w, data, 1, err, sizeof err) == -1, "appending past the end is refused");
    } else {
        CHECK(gguf_writer_write_at(w, 2, 0, data + 196, 14, err, sizeof err) == 0, "write_at: %s", err);
        CHECK(gguf_writer_write_at(w, 1, 68, data + 128, 68, err, sizeof err) == 0, "write_at: %s", err);
        CHECK(gguf_writer_write_at(w, 1, 0, data + 60, 68, err, sizeof err) == 0, "write_at: %s", err);
        CHECK(gguf_writer_write_at(w, 0, 0, data, 60, err, sizeof err) == 0, "write_at: %s", err);
        CHECK(gguf_writer_write_at(w, 0, 1, data, 60, err, sizeof err) == -1, "write_at past a tensor is refused");
    }
    CHECK(gguf_writer_close(w, err, sizeof err) == 0, "close: %s", err);
    uint64_t fsize = gguf_writer_file_size(w);
    gguf_writer_destroy(&w);
    CHECK(w == NULL, "destroy NULLs");
    gguf_writer_destroy(&w);

    gguf *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "reader: %s", err);
    if (!g) return;
    CHECK(g->version == 3 && g->size == fsize, "version 3, size %llu", (unsigned long long)g->size);
    CHECK(g->alignment == (uint64_t)alignment && g->data_offset % (uint64_t)alignment == 0, "alignment");
    CHECK(gguf_get_int(g, "k.u8", 0) == 200 && gguf_get(g, "k.u8")->type == GGUF_T_UINT8, "u8");
    CHECK(gguf_get_int(g, "k.i8", 0) == -100, "i8");
    CHECK(gguf_get_int(g, "k.u16", 0) == 60000, "u16");
    CHECK(gguf_get_int(g, "k.i16", 0) == -30000, "i16");
    CHECK(gguf_get_int(g, "k.u32", 0) == 4000000000ll, "u32");
    CHECK(gguf_get_int(g, "k.i32", 0) == -2000000000, "i32");
    CHECK(gguf_get(g, "k.u64") && gguf_get(g, "k.u64")->v.u64 == 18000000000000000000ull, "u64");
    CHECK(gguf_get_int(g, "k.i64", 0) == -9000000000000000000ll, "i64");
    CHECK(gguf_get_float(g, "k.f32", 0) == 0.15625 && gguf_get(g, "k.f32")->type == GGUF_T_FLOAT32, "f32");
    CHECK(gguf_get_float(g, "k.f64", 0) == -1e300, "f64");
    CHECK(gguf_get_int(g, "k.bool", 0) == 1 && gguf_get(g, "k.bool")->type == GGUF_T_BOOL, "bool");
    char *s = gguf_get_cstr(g, "k.str");
    CHECK(s && strcmp(s, "héllo") == 0, "str");
    free(s);
    const gguf_value *v = gguf_get(g, "k.strn");
    CHECK(v && v->type == GGUF_T_STRING && v->v.str.len == 3 && memcmp(v->v.str.ptr, "a\0b", 3) == 0, "strn");
    v = gguf_get(g, "k.empty");
    CHECK(v && v->type == GGUF_T_STRING && v->v.str.len == 0, "empty string");
    v = gguf_get(g, "k.astr");
    CHECK(v && v->type == GGUF_T_ARRAY && v->v.arr.elem == GGUF_T_STRING && v->v.arr.n == 4, "string array");
    for (int i = 0; v && i < 4; i++) {
        gguf_str e;
        CHECK(gguf_arr_str(g, v, (uint64_t)i, &e) == 0 && e.len == strlen(strs[i]) && memcmp(e.ptr, strs[i], e.len) == 0,
              "string array element %d", i);
    }
    v = gguf_get(g, "k.af32");
    float f = 0;
    CHECK(v && gguf_arr_f32(v, 2, &f) == 0 && f == 1e-3f, "f32 array");
    int64_t iv = 0;
    v = gguf_get(g, "k.ai32");
    CHECK(v && gguf_arr_i64(v, 0, &iv) == 0 && iv == -7, "i32 array");
    v = gguf_get(g, "k.aempty");
    CHECK(v && v->type == GGUF_T_ARRAY && v->v.arr.n == 0, "empty array");
    CHECK(g->n_tensors == 3, "3 tensors");
    const gguf_tensor *t0 = gguf_find_tensor(g, "t.f32"), *t1 = gguf_find_tensor(g, "t.q8"),
                      *t2 = gguf_find_tensor(g, "t.f16");
    CHECK(t0 && t0->n_dims == 2 && t0->ne[0] == 5 && t0->ne[1] == 3 && t0->type == GGML_F32, "t.f32 info");
    CHECK(t1 && t1->ne[0] == 64 && t1->ne[1] == 2 && t1->type == GGML_Q8_0 && t1->nbytes == 136, "t.q8 info");
    CHECK(t2 && t2->n_dims == 1 && t2->ne[0] == 7 && t2->type == GGML_F16, "t.f16 info");
    if (t0 && t1 && t2) {
        CHECK(t0->offset % (uint64_t)alignment == 0 && t1->offset % (uint64_t)alignment == 0 &&
              t2->offset % (uint64_t)alignment == 0, "offsets aligned");
        CHECK(memcmp(t0->data, data, 60) == 0 && memcmp(t1->data, data + 60, 136) == 0 &&
              memcmp(t2->data, data + 196, 14) == 0, "tensor bytes");
    }
    CHECK(fsize % (uint64_t)alignment == 0, "file padded to the alignment");

    /* copying every value with set_value (incl. a nested array from a crafted source) gives the same bytes */
    char path2[256];
    snprintf(path2, sizeof path2, "%s/copy-%d-%d.gguf", s_dir, alignment, use_append);
    gguf_writer *w2 = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)g->kv[i].key.len, g->kv[i].key.ptr);
        CHECK(gguf_writer_set_value(w2, key, &g->kv[i].val) == 0, "copy %s", key);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        gguf_writer_add_tensor(w2, g->tensors[i].name, (int)g->tensors[i].n_dims, g->tensors[i].ne, g->tensors[i].type);
    CHECK(gguf_writer_open(w2, path2, err, sizeof err) == 0, "copy open: %s", err);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        gguf_writer_append(w2, g->tensors[i].data, g->tensors[i].nbytes, err, sizeof err);
    CHECK(gguf_writer_close(w2, err, sizeof err) == 0, "copy close: %s", err);
    gguf_writer_destroy(&w2);
    FILE *a = fopen(path, "rb"), *b = fopen(path2, "rb");
    int same = a && b;
    while (same) {
        int ca = fgetc(a), cb = fgetc(b);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (a) fclose(a);
    if (b) fclose(b);
    CHECK(same, "a file copied value by value is byte-identical");
    gguf_close(&g);
    unlink(path);
    unlink(path2);
}

/* a file built byte by byte by tests/gguf_craft.h (every value type, arrays of strings, a nested array),
 * copied key by key and tensor by tensor through the writer, comes out byte-identical (plus end padding) */
static void test_copy_crafted(void) {
    char err[512], path[256];
    snprintf(path, sizeof path, "%s/crafted.gguf", s_dir);
    craft_buf c = craft_valid();
    gguf *g = gguf_open_mem(c.b, c.n, "crafted", err, sizeof err);
    CHECK(g != NULL, "crafted file opens: %s", err);
    if (!g) {
        free(c.b);
        return;
    }
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)g->kv[i].key.len, g->kv[i].key.ptr);
        CHECK(gguf_writer_set_value(w, key, &g->kv[i].val) == 0, "copy %s", key);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        gguf_writer_add_tensor(w, g->tensors[i].name, (int)g->tensors[i].n_dims, g->tensors[i].ne, g->tensors[i].type);
    CHECK(gguf_writer_open(w, path, err, sizeof err) == 0, "open: %s", err);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        gguf_writer_append(w, g->tensors[i].data, g->tensors[i].nbytes, err, sizeof err);
    CHECK(gguf_writer_close(w, err, sizeof err) == 0, "close: %s", err);
    gguf_writer_destroy(&w);
    gguf_close(&g);
    FILE *f = fopen(path, "rb");
    uint8_t buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    int pad_zero = 1;
    for (size_t i = c.n; i < n; i++)
        if (buf[i]) pad_zero = 0;
    CHECK(n >= c.n && n % 32 == 0 && n - c.n < 32, "copied size %zu vs crafted %zu", n, c.n);
    CHECK(n >= c.n && memcmp(buf, c.b, c.n) == 0 && pad_zero, "copy is byte-identical to the crafted file");
    free(c.b);
    unlink(path);
}

static void test_errors(void) {
    char err[512], path[256];
    snprintf(path, sizeof path, "%s/err.gguf", s_dir);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u32(w, "a", 1);
    CHECK(gguf_writer_set_u32(w, "a", 2) == -1, "duplicate key refused");
    CHECK(gguf_writer_open(w, path, err, sizeof err) == -1 && strstr(err, "twice"), "open reports it: %s", err);
    CHECK(access(path, F_OK) != 0, "no file written");
    gguf_writer_destroy(&w);

    w = gguf_writer_new();
    int64_t ne[2] = {33, 2};
    CHECK(gguf_writer_add_tensor(w, "t", 2, ne, GGML_Q4_0) == -1, "row of 33 refused for Q4_0");
    CHECK(gguf_writer_open(w, path, err, sizeof err) == -1 && strstr(err, "t:"), "open reports it: %s", err);
    gguf_writer_destroy(&w);

    w = gguf_writer_new();
    CHECK(gguf_writer_set_u32(w, "general.alignment", 48) == -1, "alignment 48 refused");
    gguf_writer_destroy(&w);

    w = gguf_writer_new();
    int64_t ne1[1] = {4};
    gguf_writer_add_tensor(w, "t", 1, ne1, GGML_F32);
    CHECK(gguf_writer_add_tensor(w, "t", 1, ne1, GGML_F32) == -1, "duplicate tensor refused");
    gguf_writer_destroy(&w);

    w = gguf_writer_new();
    gguf_writer_add_tensor(w, "t", 1, ne1, GGML_F32);
    CHECK(gguf_writer_open(w, path, err, sizeof err) == 0, "open: %s", err);
    CHECK(gguf_writer_set_u32(w, "late", 1) == -1, "metadata after open refused");
    float x[2] = {1, 2};
    gguf_writer_append(w, x, sizeof x, err, sizeof err);
    CHECK(gguf_writer_close(w, err, sizeof err) == -1 && strstr(err, "8 of 16"), "short append reported: %s", err);
    gguf_writer_destroy(&w);
    unlink(path);

    w = gguf_writer_new();
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.gguf", s_dir);
    CHECK(gguf_writer_open(w, bad, err, sizeof err) == -1 && strstr(err, "x.gguf"), "unwritable path: %s", err);
    gguf_writer_destroy(&w);
}

int main(void) {
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip(32, 1);
    test_roundtrip(32, 0);
    test_roundtrip(64, 1);
    test_roundtrip(4096, 0);
    test_copy_crafted();
    test_errors();
    rmdir(s_dir);
    return test_report();
}
