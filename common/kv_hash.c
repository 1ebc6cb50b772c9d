/* common/kv_hash.c: SipHash-2-4 and the chained block hashes (kv_hash.h). */
#include "kv_hash.h"

#include <string.h>

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                                       \
    do {                                                                                                               \
        v0 += v1;                                                                                                      \
        v1 = ROTL(v1, 13);                                                                                             \
        v1 ^= v0;                                                                                                      \
        v0 = ROTL(v0, 32);                                                                                             \
        v2 += v3;                                                                                                      \
        v3 = ROTL(v3, 16);                                                                                             \
        v3 ^= v2;                                                                                                      \
        v0 += v3;                                                                                                      \
        v3 = ROTL(v3, 21);                                                                                             \
        v3 ^= v0;                                                                                                      \
        v2 += v1;                                                                                                      \
        v1 = ROTL(v1, 17);                                                                                             \
        v1 ^= v2;                                                                                                      \
        v2 = ROTL(v2, 32);                                                                                             \
    } while (0)

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

uint64_t kv_hash_sip(uint64_t k0, uint64_t k1, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    size_t full = n & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t i = 0; i < (n & 7); i++) b |= (uint64_t)p[full + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t kv_hash_model(const char *name, size_t n) { return kv_hash_sip(0, KV_HASH_K1, name, n); }

/* the message is laid out little-endian whatever the host; n <= KV_BLOCK_MAX (callers check) */
uint64_t kv_hash_block(uint64_t model_key, uint64_t prev, const int32_t *tokens, int n) {
    uint8_t msg[8 + 4 * KV_BLOCK_MAX];
    if (n < 0) n = 0;
    if (n > KV_BLOCK_MAX) n = KV_BLOCK_MAX;
    for (int i = 0; i < 8; i++) msg[i] = (uint8_t)(prev >> (8 * i));
    for (int t = 0; t < n; t++) {
        uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) msg[8 + 4 * t + i] = (uint8_t)(v >> (8 * i));
    }
    return kv_hash_sip(model_key, KV_HASH_K1, msg, 8 + 4 * (size_t)n);
}

int kv_hash_prompt(uint64_t model_key, const int32_t *tokens, int n, int block_size, uint64_t *out, int cap) {
    if (block_size < 1 || block_size > KV_BLOCK_MAX || n < 0) return -1;
    int nb = n / block_size;
    uint64_t h = 0;
    for (int i = 0; i < nb && i < cap; i++) {
        h = kv_hash_block(model_key, h, tokens + (size_t)i * block_size, block_size);
        out[i] = h;
    }
    return nb;
}
