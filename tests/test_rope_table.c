/* tests/test_rope_table.c: the RoPE cos/sin rows that engine/rope.h builds (the CUDA engine's position table is
 * these rows, uploaded once) against the table the CUDA engine built before RoPE scaling existed
 * (cuda/ops.cu ops_rope_table_host: inv = base^(-2i / rope_dim), angle = p * inv in double, cos/sin rounded to
 * float), for files without scaling (llama, qwen2, qwen3, Mistral-style): bit for bit, so that those models keep
 * their results. Also gemma3's sliding layers (base 10000, unscaled) against the same formula. Host only.
 * Without engine/rope.h in the tree (the RoPE scaling work not merged yet) there is nothing to check. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

#if __has_include("rope.h")
#include "model.h"
#include "rope.h"

/* the earlier table, as cuda/ops.cu built it: [n_pos][rope_dim / 2] (cos, sin) */
static void s_old_table(float *cs, int n_pos, int rope_dim, double base) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const double inv = pow(base, -2.0 * i / (double)rope_dim);
        for (int p = 0; p < n_pos; p++) {
            const double a = (double)p * inv;
            cs[((size_t)p * half + i) * 2] = (float)cos(a);
            cs[((size_t)p * half + i) * 2 + 1] = (float)sin(a);
        }
    }
}

/* one configuration: rope_init's rows (global layers, and the sliding kind where asked) against the old table */
static void s_check(const char *what, float base, int rope_dim, int n_ctx, zl_rope_scaling scaling, int sliding) {
    zl_model m;
    memset(&m, 0, sizeof m);
    m.path = "test";
    zl_config *c = &m.cfg;
    c->rope_base = base;
    c->rope_dim = rope_dim;
    c->head_dim = rope_dim;
    c->rope_scaling = scaling;
    c->rope_scale = 1.0f;
    c->rope_attn_factor = 1.0f;
    c->rope_yarn_attn = 1.0f;
    c->rope_ext_factor = 0.0f;
    c->rope_base_swa = sliding ? 10000.0f : base;
    c->rope_scale_swa = 1.0f;
    float *a = malloc((size_t)n_ctx * rope_dim * sizeof *a), *b = malloc((size_t)n_ctx * rope_dim * sizeof *b);
    CHECK(a && b, "out of memory");
    if (!a || !b) goto done;
    s_old_table(a, n_ctx, rope_dim, sliding ? 10000.0 : base);
    zl_rope r;
    char err[256];
    const int ok = rope_init(&r, &m, n_ctx, sliding, err, sizeof err) == 0;
    CHECK(ok, "%s: rope_init: %s", what, err);
    if (!ok) goto done;
    for (int p = 0; p < n_ctx; p++) rope_cs_row(&r, p, b + (size_t)p * rope_dim);
    rope_free(&r);
    size_t first = 0;
    while (first < (size_t)n_ctx * rope_dim && memcmp(&a[first], &b[first], sizeof *a) == 0) first++;
    CHECK(first == (size_t)n_ctx * rope_dim, "%s: rows differ from the earlier table first at position %zu pair %zu",
          what, first / rope_dim, first % rope_dim / 2);
done:
    free(a);
    free(b);
}

int main(void) {
    s_check("llama, base 10000, dim 64", 10000.0f, 64, 4096, ZL_ROPE_SCALING_LINEAR, 0);
    s_check("llama, base 500000, dim 128", 500000.0f, 128, 16384, ZL_ROPE_SCALING_LINEAR, 0);
    s_check("qwen2, base 1e6, dim 128", 1000000.0f, 128, 32768, ZL_ROPE_SCALING_LINEAR, 0);
    s_check("qwen2, base 1e6, dim 64, scaling none", 1000000.0f, 64, 32768, ZL_ROPE_SCALING_NONE, 0);
    s_check("partial rotation, dim 48", 10000.0f, 48, 2048, ZL_ROPE_SCALING_LINEAR, 0);
    s_check("base 100000, dim 96", 100000.0f, 96, 4096, ZL_ROPE_SCALING_LINEAR, 0);
    s_check("gemma3 sliding layers, dim 256", 1000000.0f, 256, 8192, ZL_ROPE_SCALING_LINEAR, 1);
    return test_report();
}
#else
int main(void) {
    printf("engine/rope.h is not in this tree: nothing to check\n");
    return test_report();
}
#endif
