/* GGUF reader: values of every type, real fixture files, and hostile files (crafted, truncated at every header
 * offset, corrupted byte by byte). Built with AddressSanitizer + UBSan: a read past the buffer fails the test. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "gguf.h"
#include "gguf_craft.h"
#include "test.h"

static int s_open_fails(const uint8_t *b, size_t n, const char *expect) {
    char err[512] = "";
    uint8_t *copy = malloc(n ? n : 1);   /* exact-size copy: ASan sees any overread */
    memcpy(copy, b, n);
    gguf *g = gguf_open_mem(copy, n, "crafted.gguf", err, sizeof err);
    int failed = g == NULL;
    if (g) gguf_close(&g);
    free(copy);
    if (failed && strncmp(err, "crafted.gguf: ", 14) != 0) { fprintf(stderr, "message without file name: %s\n", err); return 0; }
    if (failed && expect && !strstr(err, expect)) { fprintf(stderr, "message '%s' lacks '%s'\n", err, expect); return 0; }
    return failed;
}

/* patch helper: a copy of the valid file with bytes replaced at off */
static craft_buf s_patched(const craft_buf *v, size_t off, const void *p, size_t n) {
    craft_buf c = {0};
    craft_put(&c, v->b, v->n);
    memcpy(c.b + off, p, n);
    return c;
}

static size_t s_findn(const craft_buf *c, const char *needle, size_t n) {
    for (size_t i = 0; i + n <= c->n; i++) if (memcmp(c->b + i, needle, n) == 0) return i;
    return (size_t)-1;
}
static size_t s_find(const craft_buf *c, const char *needle) { return s_findn(c, needle, strlen(needle)); }
/* the tensor info of a one-letter tensor name: u64 length 1, then the letter */
static size_t s_tinfo(const craft_buf *c, char name) {
    char nd[9] = {1, 0, 0, 0, 0, 0, 0, 0, name};
    return s_findn(c, nd, 9);
}

static void test_valid(void) {
    craft_buf c = craft_valid();
    char err[512];
    gguf *g = gguf_open_mem(c.b, c.n, "crafted.gguf", err, sizeof err);
    CHECK(g != NULL, "valid crafted file refused: %s", err);
    if (!g) { free(c.b); return; }
    CHECK(gguf_get_int(g, "k.u8", 0) == 200, "u8");
    CHECK(gguf_get_int(g, "k.i8", 0) == -2, "i8");
    CHECK(gguf_get_int(g, "k.u16", 0) == 0x1234, "u16");
    CHECK(gguf_get_int(g, "k.i16", 0) == -1, "i16");
    CHECK(gguf_get_int(g, "k.u32", 0) == 4000000000ll, "u32");
    CHECK(gguf_get_int(g, "k.i32", 0) == -7, "i32");
    CHECK(gguf_get_float(g, "k.f32", 0) == 1.5, "f32");
    CHECK(gguf_get_int(g, "k.bool", 0) == 1, "bool");
    CHECK(gguf_get_int(g, "k.u64", 0) == (1ll << 40), "u64");
    CHECK(gguf_get_int(g, "k.i64", 0) == -5, "i64");
    CHECK(gguf_get_float(g, "k.f64", 0) == 0.25, "f64");
    CHECK(gguf_get_int(g, "k.missing", 42) == 42, "default");
    char *s = gguf_get_cstr(g, "k.str");
    CHECK(s && strcmp(s, "hello") == 0, "str");
    free(s);
    CHECK(gguf_get_cstr(g, "k.u8") == NULL, "cstr of a non-string is NULL");
    const gguf_value *a = gguf_get(g, "k.arr_u32");
    int64_t x = 0;
    CHECK(a && a->type == GGUF_T_ARRAY && a->v.arr.n == 3 && gguf_arr_i64(a, 2, &x) == 0 && x == 30, "arr u32");
    CHECK(gguf_arr_i64(a, 3, &x) == -1, "arr index out of range");
    const gguf_value *as = gguf_get(g, "k.arr_str");
    gguf_str st;
    CHECK(as && gguf_arr_str(g, as, 2, &st) == 0 && gguf_str_eq(st, "zz"), "arr str [2]");
    CHECK(as && gguf_arr_str(g, as, 1, &st) == 0 && st.len == 0, "arr str empty");
    CHECK(gguf_arr_str(g, as, 3, &st) == -1, "arr str out of range");
    const gguf_value *n = gguf_get(g, "k.nested");
    CHECK(n && n->v.arr.elem == GGUF_T_ARRAY && n->v.arr.n == 2, "nested array");
    const gguf_tensor *ta = gguf_find_tensor(g, "a"), *tb = gguf_find_tensor(g, "b");
    CHECK(ta && ta->type == GGML_F32 && ta->ne[0] == 4 && ta->ne[1] == 2 && ta->nbytes == 32, "tensor a");
    CHECK(ta && ((const float *)ta->data)[7] == 7.0f, "tensor a data");
    CHECK(tb && tb->type == GGML_Q8_0 && tb->nbytes == 34, "tensor b");
    CHECK(gguf_find_tensor(g, "c") == NULL, "absent tensor");
    gguf_close(&g);
    gguf_close(&g); /* idempotent */
    CHECK(g == NULL, "close nulls");
    free(c.b);
}

static void test_crafted_bad(void) {
    craft_buf v = craft_valid();
    uint32_t u32; uint64_t u64; craft_buf c;
    c = s_patched(&v, 0, "GGUG", 4); CHECK(s_open_fails(c.b, c.n, "bad magic"), "bad magic"); free(c.b);
    u32 = 1; c = s_patched(&v, 4, &u32, 4); CHECK(s_open_fails(c.b, c.n, "unsupported GGUF version"), "v1"); free(c.b);
    u32 = 99; c = s_patched(&v, 4, &u32, 4); CHECK(s_open_fails(c.b, c.n, "unsupported GGUF version"), "v99"); free(c.b);
    u64 = 1ull << 60; c = s_patched(&v, 8, &u64, 8); CHECK(s_open_fails(c.b, c.n, "absurd tensor count"), "tensors"); free(c.b);
    u64 = 1ull << 60; c = s_patched(&v, 16, &u64, 8); CHECK(s_open_fails(c.b, c.n, "absurd metadata count"), "kvs"); free(c.b);
    /* first key length huge */
    u64 = 1ull << 62; c = s_patched(&v, 24, &u64, 8); CHECK(s_open_fails(c.b, c.n, "truncated"), "key len"); free(c.b);
    /* unknown value type for k.u8 */
    size_t off = s_find(&v, "k.u8") + 4;
    u32 = 77; c = s_patched(&v, off, &u32, 4); CHECK(s_open_fails(c.b, c.n, "unknown metadata value type"), "vtype"); free(c.b);
    /* string array with an absurd count */
    off = s_find(&v, "k.arr_str") + 9 + 4 + 4;
    u64 = 1ull << 61; c = s_patched(&v, off, &u64, 8); CHECK(s_open_fails(c.b, c.n, "truncated"), "arr count"); free(c.b);
    /* unknown tensor type for "b": name "b" is followed by n_dims(4) ne(8) type(4) */
    off = s_tinfo(&v, 'b') + 9 + 4 + 8;
    u32 = 39; c = s_patched(&v, off, &u32, 4); CHECK(s_open_fails(c.b, c.n, "unknown type"), "ttype"); free(c.b);
    /* tensor b's offset past the end */
    u64 = 1 << 20; c = s_patched(&v, off + 4, &u64, 8); CHECK(s_open_fails(c.b, c.n, "outside the file"), "toff"); free(c.b);
    /* misaligned offset */
    u64 = 33; c = s_patched(&v, off + 4, &u64, 8); CHECK(s_open_fails(c.b, c.n, "not aligned"), "align"); free(c.b);
    /* shape overflow: tensor a dims */
    off = s_tinfo(&v, 'a') + 9;
    u32 = 5; c = s_patched(&v, off, &u32, 4); CHECK(s_open_fails(c.b, c.n, "dimensions"), "ndims"); free(c.b);
    u32 = 0; c = s_patched(&v, off, &u32, 4); CHECK(s_open_fails(c.b, c.n, "dimensions"), "ndims 0"); free(c.b);
    u64 = 1ull << 39; c = s_patched(&v, off + 4, &u64, 8);
    craft_buf c2 = s_patched(&c, off + 12, &u64, 8); free(c.b);
    CHECK(s_open_fails(c2.b, c2.n, "overflow"), "shape overflow"); free(c2.b);
    /* Q8_0 tensor b with a row that is not a multiple of 32 */
    off = s_tinfo(&v, 'b') + 9 + 4;
    u64 = 33; c = s_patched(&v, off, &u64, 8); CHECK(s_open_fails(c.b, c.n, "multiple"), "block"); free(c.b);
    /* duplicate tensor name: rename b to a */
    off = s_tinfo(&v, 'b') + 8;
    c = s_patched(&v, off, "a", 1); CHECK(s_open_fails(c.b, c.n, "twice"), "dup"); free(c.b);
    /* bad alignment value */
    off = s_find(&v, "general.alignment") + 17 + 4;
    u32 = 3; c = s_patched(&v, off, &u32, 4); CHECK(s_open_fails(c.b, c.n, "alignment"), "alignment value"); free(c.b);
    /* arrays nested too deep: a hand-built file */
    craft_buf d = {0};
    craft_put(&d, "GGUF", 4); craft_u32(&d, 3); craft_u64(&d, 0); craft_u64(&d, 1);
    craft_str(&d, "deep"); craft_u32(&d, 9);
    for (int i = 0; i < 20; i++) { craft_u32(&d, 9); craft_u64(&d, 1); }
    craft_u32(&d, 4); craft_u64(&d, 0);
    CHECK(s_open_fails(d.b, d.n, "nested"), "depth"); free(d.b);
    free(v.b);
}

/* every truncation of the crafted file fails cleanly; byte corruption never crashes */
static void test_truncate_corrupt(void) {
    craft_buf v = craft_valid();
    int ok = 1;
    for (size_t n = 0; n < v.n; n++) if (!s_open_fails(v.b, n, NULL)) { ok = 0; fprintf(stderr, "truncated at %zu accepted\n", n); }
    CHECK(ok, "every truncation refused");
    uint64_t rng = 12345;
    for (size_t off = 0; off < v.n; off++)
        for (int k = 0; k < 4; k++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            craft_buf c = {0}; craft_put(&c, v.b, v.n);
            c.b[off] = (uint8_t)rng;
            char err[256];
            gguf *g = gguf_open_mem(c.b, c.n, "x", err, sizeof err);
            if (g) { for (uint64_t i = 0; i < g->n_kv; i++) { gguf_str s; gguf_arr_str(g, &g->kv[i].val, 0, &s); } gguf_close(&g); }
            free(c.b);
        }
    CHECK(1, "corruption survived");
    free(v.b);
}

/* the real fixtures: open, check what we know of them; truncate stories260K at many offsets via real files */
static void test_real_files(void) {
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    gguf *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "stories260K: %s", err);
    if (!g) return;
    CHECK(g->n_tensors == 48, "48 tensors");
    CHECK(gguf_get_int(g, "llama.block_count", 0) == 5, "5 layers");
    const gguf_tensor *t = gguf_find_tensor(g, "blk.0.ffn_down.weight");
    CHECK(t && t->ne[0] == 172 && t->ne[1] == 64 && t->type == GGML_F32, "ffn_down shape");
    const gguf_value *tok = gguf_get(g, "tokenizer.ggml.tokens");
    gguf_str s;
    CHECK(tok && tok->v.arr.n == 512 && gguf_arr_str(g, tok, 0, &s) == 0 && gguf_str_eq(s, "<unk>"), "tokens");
    /* truncations of the real file through an exact-size copy: refused, with the reason */
    const uint8_t *m = g->map; size_t size = g->size;
    size_t data = g->data_offset;
    int ok = 1;
    for (size_t n = 0; n < size; n += (n < data ? 7 : 4099)) {
        uint8_t *b = malloc(n ? n : 1); memcpy(b, m, n);
        gguf *h = gguf_open_mem(b, n, "cut.gguf", err, sizeof err);
        if (h) { ok = 0; fprintf(stderr, "cut at %zu accepted\n", n); gguf_close(&h); }
        else if (!strstr(err, "truncated") && !strstr(err, "outside the file")) { ok = 0; fprintf(stderr, "cut at %zu: %s\n", n, err); }
        free(b);
    }
    CHECK(ok, "truncated real file refused with 'truncated'/'outside the file'");
    gguf_close(&g);
    const char *vocabs[] = {"llama-spm", "llama-bpe", "qwen2"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", test_fixtures(), vocabs[i]);
        g = gguf_open(path, err, sizeof err);
        CHECK(g != NULL, "%s: %s", vocabs[i], err);
        const gguf_value *tk = g ? gguf_get(g, "tokenizer.ggml.tokens") : NULL;
        CHECK(tk && tk->v.arr.n >= 32000, "%s tokens", vocabs[i]);
        gguf_close(&g);
    }
    g = gguf_open("/nonexistent/x.gguf", err, sizeof err);
    CHECK(!g && strstr(err, "/nonexistent/x.gguf: cannot open"), "missing file: %s", err);
}

int main(void) {
    test_valid();
    test_crafted_bad();
    test_truncate_corrupt();
    test_real_files();
    return test_report();
}
