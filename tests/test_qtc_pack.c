/* tests/test_qtc_pack.c: the host side of cuda/qtc.cu, which needs no GPU. qtc_pack_threads writes the same
 * bytes whatever its thread count (tiles are independent), for Q4_K, Q6_K and Q8_0, shapes whose last tile is
 * partial, and thread counts that do and do not divide the tiles; bad arguments are refused. The packed layout's
 * meaning is checked against the quant_dequant_row oracle on a GPU (cuda/test_qtc.cu). Without CUDA in the
 * build there is nothing to test here: one skip line. */
#include <stdint.h>
#include <string.h>
#include "test.h"
#include "gguf.h"
#ifdef ZLLM_HAVE_CUDA
#include "qtc.h"

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;
static uint8_t s_byte(void) {
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    return (uint8_t)(s_rng >> 24);
}

static void s_case(ggml_type t, int n_in, int n_out) {
    const size_t rb = ggml_row_bytes(t, n_in), pb = qtc_packed_bytes(t, n_in, n_out);
    uint8_t *rows = malloc(rb * (size_t)n_out), *ref = malloc(pb), *got = malloc(pb);
    if (!rows || !ref || !got) { CHECK(0, "out of memory"); free(rows); free(ref); free(got); return; }
    for (size_t i = 0; i < rb * (size_t)n_out; i++) rows[i] = s_byte();   /* packing is a byte shuffle */
    CHECK(qtc_pack_threads(t, rows, rb, n_in, n_out, ref, 1) == 0, "%s %dx%d: 1 thread", ggml_type_name(t), n_out,
          n_in);
    const int counts[] = {0, 2, 3, 7, 16};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        memset(got, 0xA5, pb);
        const int rc = qtc_pack_threads(t, rows, rb, n_in, n_out, got, counts[k]);
        CHECK(rc == 0 && memcmp(ref, got, pb) == 0, "%s %dx%d: %d threads differ from 1 (rc %d)",
              ggml_type_name(t), n_out, n_in, counts[k], rc);
    }
    memset(got, 0xA5, pb);
    CHECK(qtc_pack(t, rows, rb, n_in, n_out, got) == 0 && memcmp(ref, got, pb) == 0, "%s: qtc_pack differs",
          ggml_type_name(t));
    CHECK(qtc_pack_threads(t, rows, rb, n_in, n_out, got, -1) == -1, "negative thread count accepted");
    CHECK(qtc_pack_threads(t, rows, rb + 1, n_in, n_out, got, 2) == -1, "wrong row_bytes accepted");
    free(rows); free(ref); free(got);
}

int main(void) {
    const ggml_type types[] = {GGML_Q4_K, GGML_Q6_K, GGML_Q8_0};
    for (int i = 0; i < 3; i++) {
        s_case(types[i], 256, 5);          /* one partial tile: one thread whatever is asked */
        s_case(types[i], 512, 3205);       /* 201 tiles, the last partial: up to 3 threads */
        s_case(types[i], 256, 16 * 1100);  /* 1100 tiles: up to 16 threads, uneven ranges */
    }
    CHECK(qtc_pack_threads(GGML_Q4_K, NULL, 144, 256, 16, NULL, 1) == -1, "NULL rows accepted");
    CHECK(qtc_pack_threads(GGML_F16, "", 512, 256, 16, (void *)"", 1) == -1, "F16 accepted");
    return test_report();
}
#else
int main(void) {
    printf("test_qtc_pack: built without CUDA, skipped\n");
    CHECK(1, "skip");
    return test_report();
}
#endif
