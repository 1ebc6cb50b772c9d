/* cuda/qtc_pack.cu: qtc_pack, the host repacking of GGUF Q4_K, Q6_K and Q8_0 rows into qtc's tile blocks (the
 * layout: cuda/qtc.cu's file comment; the contract: cuda/qtc.h). Host code only, done once per matrix at load, on
 * several threads for large matrices. */
#include "qtc.h"
#include "qtc_layout.h"

#include <stdint.h>
#include <string.h>

#include <thread>
#include <vector>

/* levels and scales of one 256-element unit of one row, in the packed form's terms */
typedef struct {
    uint8_t q[256];       /* levels: Q4_K 0..15, Q6_K 0..63, Q8_0 the int8 bit pattern */
    uint16_t d, dmin;     /* Q4_K d / dmin bits; Q6_K d bits */
    uint8_t sc[16], mn[8];/* Q4_K: 8 sc, 8 m (6-bit); Q6_K: 16 int8 scales */
    uint16_t d8[8];       /* Q8_0: the 8 block scales (bits) */
} s_unit;

static void s_unit_read(int ty, const uint8_t *row, int u, s_unit *o)
{
    memset(o, 0, sizeof *o);
    if (ty == QT_Q4K) {
        const uint8_t *b = row + (size_t)u * 144, *sc = b + 4, *qs = b + 16;
        memcpy(&o->d, b, 2);
        memcpy(&o->dmin, b + 2, 2);
        for (int j = 0; j < 8; j++) {
            if (j < 4) { o->sc[j] = sc[j] & 63; o->mn[j] = sc[j + 4] & 63; }
            else {
                o->sc[j] = (uint8_t)((sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4));
                o->mn[j] = (uint8_t)((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
            }
        }
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                o->q[64 * j + l] = qs[32 * j + l] & 15;
                o->q[64 * j + 32 + l] = qs[32 * j + l] >> 4;
            }
    } else if (ty == QT_Q6K) {
        const uint8_t *b = row + (size_t)u * 210, *ql = b, *qh = b + 128;
        memcpy(o->sc, b + 192, 16);
        memcpy(&o->d, b + 208, 2);
        for (int e = 0; e < 256; e++) {
            const int n = e / 128, r = e % 128, qq = r / 32, l = r % 32;
            const uint8_t lo = ql[64 * n + (qq & 1 ? l + 32 : l)];
            const int lo4 = qq >= 2 ? lo >> 4 : lo & 15;
            const int hi2 = (qh[32 * n + l] >> (2 * qq)) & 3;
            o->q[e] = (uint8_t)(lo4 | (hi2 << 4));
        }
    } else {
        for (int k = 0; k < 8; k++) {
            const uint8_t *b = row + (size_t)(8 * u + k) * 34;
            memcpy(&o->d8[k], b, 2);
            memcpy(o->q + 32 * k, b + 2, 32);
        }
    }
}

/* the 4-bit field of element i (0..31) of a 32-element run into 16 bytes (Q4_K/Q6_K low nibbles) */
static void s_put_nib(uint8_t *w16, int i, int v)
{
    const int u = i / 8, p = (i % 8) / 2, c = i % 2, bit = 16 * c + 4 * p;
    uint32_t word;
    memcpy(&word, w16 + 4 * u, 4);
    word |= (uint32_t)(v & 15) << bit;
    memcpy(w16 + 4 * u, &word, 4);
}

/* tiles [tile0, tile1) of qtc_pack: each tile's blocks depend on its own 16 rows only (so any split of the tiles
 * over threads writes the same bytes) */
static void s_pack_tiles(int ty, const void *rows, size_t row_bytes, int n_in, int n_out, void *dst, int tile0,
                         int tile1)
{
    const int units = n_in / 256, TB = qt_tb(ty);
    s_unit un;
    for (int tile = tile0; tile < tile1; tile++)
        for (int u = 0; u < units; u++) {
            uint8_t *blk = (uint8_t *)dst + ((size_t)tile * units + u) * TB;
            memset(blk, 0, (size_t)TB);
            if (ty == QT_Q8_0) memset(blk, 0x80, 4096);   /* padded rows: level q + 128 = 128, i.e. q = 0 */
            for (int r = 0; r < 16; r++) {
                const int o = tile * 16 + r;
                if (o >= n_out) break;   /* padded rows: all zero (zero scales and levels: weight 0) */
                s_unit_read(ty, (const uint8_t *)rows + (size_t)o * row_bytes, u, &un);
                const int g = r % 8, h = r / 8;
                if (ty == QT_Q4K || ty == QT_Q6K) {
                    for (int e = 0; e < 256; e++) {
                        const int tt = e / 64, b = (e % 64) / 32, i = e % 32;
                        s_put_nib(blk + 512 * (2 * h + b) + 16 * (4 * g + tt), i, un.q[e]);
                    }
                }
                if (ty == QT_Q4K) {
                    uint8_t *rec = blk + 2048 + 16 * r;
                    memcpy(rec, &un.d, 2);
                    memcpy(rec + 2, &un.dmin, 2);
                    uint8_t bits[12] = {0};
                    for (int tt = 0; tt < 4; tt++) {
                        const uint32_t f = (uint32_t)un.sc[2 * tt] | (uint32_t)un.mn[2 * tt] << 6 |
                                           (uint32_t)un.sc[2 * tt + 1] << 12 | (uint32_t)un.mn[2 * tt + 1] << 18;
                        for (int k = 0; k < 24; k++)
                            if (f >> k & 1) bits[(24 * tt + k) / 8] |= (uint8_t)(1u << ((24 * tt + k) % 8));
                    }
                    memcpy(rec + 4, bits, 12);
                } else if (ty == QT_Q6K) {
                    for (int e = 0; e < 256; e++) {
                        const int tt = e / 64, el = e % 64, v = el / 16, ee = el % 16, P = ee / 2, c = ee % 2;
                        uint8_t *w = blk + 2048 + 512 * h + 16 * (4 * g + tt) + 4 * v;
                        uint32_t word;
                        memcpy(&word, w, 4);
                        word |= (uint32_t)((un.q[e] >> 4) & 3) << (16 * c + 2 * P);
                        memcpy(w, &word, 4);
                    }
                    memcpy(blk + 3072 + 16 * r, un.sc, 16);
                    memcpy(blk + 3328 + 2 * r, &un.d, 2);
                } else {
                    /* stored as q + 128 (the bit pattern ^ 0x80), what the dequantization's PRMT wants */
                    for (int e = 0; e < 256; e++) {
                        const int tt = e / 64, el = e % 64, c = el / 16, i = el % 16;
                        blk[512 * (4 * h + c) + 16 * (4 * g + tt) + i] = (uint8_t)(un.q[e] ^ 0x80u);
                    }
                    memcpy(blk + 4096 + 16 * r, un.d8, 16);
                }
            }
        }
}

extern "C" int qtc_pack_threads(ggml_type t, const void *rows, size_t row_bytes, int n_in, int n_out, void *dst,
                                int n_threads)
{
    const int ty = qt_ty(t);
    if (!qtc_supported(t, n_in, n_out) || !rows || !dst || row_bytes != ggml_row_bytes(t, n_in) || n_threads < 0)
        return -1;
    const int tiles = (n_out + 15) / 16;
    if (n_threads == 0) {   /* every hardware thread, at most 16, at least 64 tiles each */
        const unsigned hc = std::thread::hardware_concurrency();
        n_threads = hc == 0 ? 1 : hc > 16 ? 16 : (int)hc;
    }
    if (n_threads > tiles / 64) n_threads = tiles / 64;
    if (n_threads < 1) n_threads = 1;
    std::vector<std::thread> th;
    for (int i = 1; i < n_threads; i++) {
        const int a = (int)((long)tiles * i / n_threads), b = (int)((long)tiles * (i + 1) / n_threads);
        try {
            th.emplace_back(s_pack_tiles, ty, rows, row_bytes, n_in, n_out, dst, a, b);
        } catch (...) {   /* no thread to be had: this thread packs that range itself */
            s_pack_tiles(ty, rows, row_bytes, n_in, n_out, dst, a, b);
        }
    }
    s_pack_tiles(ty, rows, row_bytes, n_in, n_out, dst, 0, (int)((long)tiles / n_threads));
    for (auto &x : th) x.join();
    return 0;
}

extern "C" int qtc_pack(ggml_type t, const void *rows, size_t row_bytes, int n_in, int n_out, void *dst)
{
    return qtc_pack_threads(t, rows, row_bytes, n_in, n_out, dst, 0);
}
