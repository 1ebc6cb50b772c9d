/* tests/gguf_craft.h: builds small GGUF files byte by byte for the reader's tests and fuzz seeds, so that each
 * field can be set to a hostile value on purpose. Independent of tools/gguf_write.c on purpose. */
#ifndef ZLLM_GGUF_CRAFT_H
#define ZLLM_GGUF_CRAFT_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint8_t *b; size_t n, cap; } craft_buf;

static void craft_put(craft_buf *c, const void *p, size_t n) {
    if (c->n + n > c->cap) {
        c->cap = (c->n + n) * 2 + 64;
        c->b = realloc(c->b, c->cap);
        if (!c->b) abort();
    }
    memcpy(c->b + c->n, p, n);
    c->n += n;
}
static void craft_u8(craft_buf *c, uint8_t v) { craft_put(c, &v, 1); }
static void craft_u32(craft_buf *c, uint32_t v) { craft_put(c, &v, 4); }
static void craft_u64(craft_buf *c, uint64_t v) { craft_put(c, &v, 8); }
static void craft_f32(craft_buf *c, float v) { craft_put(c, &v, 4); }
static void craft_str(craft_buf *c, const char *s) { craft_u64(c, strlen(s)); craft_put(c, s, strlen(s)); }
static void craft_pad(craft_buf *c, size_t align) { while (c->n % align) craft_u8(c, 0); }

/* A valid v3 file: one key of every scalar type, a string, arrays of u32/strings, a nested array, and two
 * tensors: "a" F32 [4, 2] and "b" Q8_0 [32] (one block). Returns the buffer (caller frees c->b). */
static craft_buf craft_valid(void) {
    craft_buf c = {0};
    craft_put(&c, "GGUF", 4);
    craft_u32(&c, 3);
    craft_u64(&c, 2);   /* tensors */
    craft_u64(&c, 16);  /* kv */
    craft_str(&c, "k.u8");  craft_u32(&c, 0);  craft_u8(&c, 200);
    craft_str(&c, "k.i8");  craft_u32(&c, 1);  craft_u8(&c, 0xFE);            /* -2 */
    craft_str(&c, "k.u16"); craft_u32(&c, 2);  craft_u8(&c, 0x34); craft_u8(&c, 0x12);
    craft_str(&c, "k.i16"); craft_u32(&c, 3);  craft_u8(&c, 0xFF); craft_u8(&c, 0xFF);  /* -1 */
    craft_str(&c, "k.u32"); craft_u32(&c, 4);  craft_u32(&c, 4000000000u);
    craft_str(&c, "k.i32"); craft_u32(&c, 5);  craft_u32(&c, (uint32_t)-7);
    craft_str(&c, "k.f32"); craft_u32(&c, 6);  craft_f32(&c, 1.5f);
    craft_str(&c, "k.bool"); craft_u32(&c, 7); craft_u8(&c, 1);
    craft_str(&c, "k.str"); craft_u32(&c, 8);  craft_str(&c, "hello");
    craft_str(&c, "k.u64"); craft_u32(&c, 10); craft_u64(&c, 1ull << 40);
    craft_str(&c, "k.i64"); craft_u32(&c, 11); craft_u64(&c, (uint64_t)-5);
    craft_str(&c, "k.f64"); craft_u32(&c, 12); { double d = 0.25; craft_put(&c, &d, 8); }
    craft_str(&c, "k.arr_u32"); craft_u32(&c, 9); craft_u32(&c, 4); craft_u64(&c, 3);
    craft_u32(&c, 10); craft_u32(&c, 20); craft_u32(&c, 30);
    craft_str(&c, "k.arr_str"); craft_u32(&c, 9); craft_u32(&c, 8); craft_u64(&c, 3);
    craft_str(&c, "x"); craft_str(&c, ""); craft_str(&c, "zz");
    craft_str(&c, "k.nested"); craft_u32(&c, 9); craft_u32(&c, 9); craft_u64(&c, 2);
    craft_u32(&c, 4); craft_u64(&c, 1); craft_u32(&c, 7);
    craft_u32(&c, 8); craft_u64(&c, 1); craft_str(&c, "in");
    craft_str(&c, "general.alignment"); craft_u32(&c, 4); craft_u32(&c, 32);
    /* tensor infos */
    craft_str(&c, "a"); craft_u32(&c, 2); craft_u64(&c, 4); craft_u64(&c, 2); craft_u32(&c, 0); craft_u64(&c, 0);
    craft_str(&c, "b"); craft_u32(&c, 1); craft_u64(&c, 32); craft_u32(&c, 8); craft_u64(&c, 32);
    craft_pad(&c, 32);
    for (int i = 0; i < 8; i++) craft_f32(&c, (float)i);      /* a: 32 bytes at 0 */
    uint16_t d = 0x3C00; craft_put(&c, &d, 2);                /* b: Q8_0 block at 32: scale 1.0 */
    for (int i = 0; i < 32; i++) craft_u8(&c, (uint8_t)(i - 16));
    return c;
}
#endif
