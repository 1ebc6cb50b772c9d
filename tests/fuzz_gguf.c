/* fuzz target: the GGUF reader on arbitrary bytes. Must never crash, leak or read out of bounds. */
#include <stdint.h>
#include <string.h>
#include "fuzz_main.h"
#include "gguf.h"
#include "gguf_craft.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    char err[256];
    gguf *g = gguf_open_mem(copy, size, "fuzz", err, sizeof err);
    if (g) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const gguf_value *v = &g->kv[i].val;
            gguf_str s; float f; int64_t x;
            for (uint64_t j = 0; v->type == GGUF_T_ARRAY && j < v->v.arr.n && j < 64; j++) {
                gguf_arr_str(g, v, j, &s); gguf_arr_f32(v, j, &f); gguf_arr_i64(v, j, &x);
            }
        }
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].nbytes) sink ^= ((const uint8_t *)g->tensors[i].data)[g->tensors[i].nbytes - 1];
        (void)sink;
        gguf_close(&g);
    }
    free(copy);
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    static craft_buf c;
    if (!c.b) c = craft_valid();
    if (max < 1) return 0;
    seeds[0] = c.b; sizes[0] = c.n;
    return 1;
}
