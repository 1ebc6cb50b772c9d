/* engine/cpu_extra.c: see cpu_extra.h. */
#include "cpu_extra.h"

#include <stdio.h>
#include <stdlib.h>
#include "quant.h"

float *cpu_extra_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

int cpu_extra_vec(const zl_weight *w, float *dst, char *err, size_t errlen) {
    if (quant_dequant_row(w->type, w->data, dst, w->n_in) != 0) {
        snprintf(err, errlen, "cannot dequantize %s", w->name ? w->name : "?");
        return -1;
    }
    return 0;
}

int cpu_extra_load(cpu_extra *x, const zl_model *m, int n_ctx, size_t T, char *err, size_t errlen) {
    const zl_config *c = &m->cfg;
    const size_t L = (size_t)c->n_layers, dim = (size_t)c->dim, hd = (size_t)c->head_dim;
    if (rope_init(&x->rope, m, n_ctx, 0, err, errlen)) return -1;
    if (model_rope_two_kinds(c)) {
        if (!(x->rope_cs_swa = cpu_extra_floats(T * (size_t)c->rope_dim))) goto oom;
        if (rope_init(&x->rope_swa, m, n_ctx, 1, err, errlen)) return -1;
    }
    if (c->has_qk_norm) {
        if (!(x->q_norm = cpu_extra_floats(L * hd)) || !(x->k_norm = cpu_extra_floats(L * hd))) goto oom;
        for (size_t l = 0; l < L; l++)
            if (cpu_extra_vec(&m->layers[l].attn_q_norm, x->q_norm + l * hd, err, errlen) ||
                cpu_extra_vec(&m->layers[l].attn_k_norm, x->k_norm + l * hd, err, errlen))
                return -1;
    }
    if (c->has_post_norms) {
        if (!(x->post_attn = cpu_extra_floats(L * dim)) || !(x->post_ffn = cpu_extra_floats(L * dim))) goto oom;
        for (size_t l = 0; l < L; l++)
            if (cpu_extra_vec(&m->layers[l].post_attn_norm, x->post_attn + l * dim, err, errlen) ||
                cpu_extra_vec(&m->layers[l].post_ffn_norm, x->post_ffn + l * dim, err, errlen))
                return -1;
    }
    return 0;
oom:
    snprintf(err, errlen, "cpu engine: out of memory");
    return -1;
}

void cpu_extra_free(cpu_extra *x) {
    rope_free(&x->rope);
    rope_free(&x->rope_swa);
    free(x->rope_cs_swa);
    free(x->q_norm);
    free(x->k_norm);
    free(x->post_attn);
    free(x->post_ffn);
    x->rope_cs_swa = x->q_norm = x->k_norm = x->post_attn = x->post_ffn = NULL;
}
