/* engine/rope.c: RoPE frequencies and magnitude from a model's configuration (rope.h), following llama.cpp's
 * rotation: for pair i of a rope_dim-wide rotation,
 *     extrap_i = base^(-2i / rope_dim) / factor_i      (factor_i: rope_freqs.weight (llama3), LongRoPE's long or
 *                                                       short factors, else 1)
 *     interp_i = extrap_i / scale                      (scale: rope.scaling.factor, 1 when absent)
 *     inv_i    = interp_i (1 - mix_i) + extrap_i mix_i (mix_i = ext_factor * ramp_i, YaRN only; else 0)
 * where ramp_i falls from 1 to 0 between YaRN's correction dims (from beta_fast and beta_slow at the original
 * context). The magnitude is rope.scaling.attn_factor times, where YaRN mixes, 1 + 0.1 ln(scale) (scale > 1), and
 * otherwise rope.scaling.yarn_attn_factor (llama.cpp's context set-up and rope kernel together). base and scale are
 * rope.freq_base and the factor, or on sliding layers rope_base_swa and rope_scale_swa (model.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "quant.h"
#include "rope.h"

/* the dim (of rope_dim) at which a frequency turns n_rot times over the original context (YaRN) */
static double s_corr_dim(int rope_dim, int n_ctx_orig, double n_rot, double base) {
    return rope_dim * log(n_ctx_orig / (n_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

/* the factor set of this model and context (NULL: none) */
static const zl_weight *s_factors(const zl_model *m, int n_ctx, int *is_long) {
    *is_long = 0;
    if (m->rope_freqs.data) return &m->rope_freqs;
    if (m->rope_long.data && n_ctx > m->cfg.rope_orig_ctx) {
        *is_long = 1;
        return &m->rope_long;
    }
    return m->rope_short.data ? &m->rope_short : NULL;
}

int rope_init(zl_rope *r, const zl_model *m, int n_ctx, int sliding, char *err, size_t errlen) {
    const zl_config *c = &m->cfg;
    r->half = c->rope_dim / 2;
    r->inv_freq = calloc((size_t)r->half, sizeof(double));
    float *ff = calloc((size_t)r->half, sizeof(float));
    if (!r->inv_freq || !ff) {
        snprintf(err, errlen, "%s: out of memory", m->path);
        free(ff);
        rope_free(r);
        return -1;
    }
    const zl_weight *fw = s_factors(m, n_ctx, &r->long_factors);
    for (int i = 0; i < r->half; i++) ff[i] = 1.0f;
    if (fw && quant_dequant_row(fw->type, fw->data, ff, r->half) != 0) {
        snprintf(err, errlen, "%s: cannot read %s", m->path, fw->name ? fw->name : "RoPE factors");
        free(ff);
        rope_free(r);
        return -1;
    }
    const double base = sliding ? c->rope_base_swa : c->rope_base, scale = sliding ? c->rope_scale_swa : c->rope_scale;
    const double ext = c->rope_scaling == ZL_ROPE_SCALING_YARN ? c->rope_ext_factor : 0.0;
    double lo = 0, hi = 0;
    if (ext != 0.0) {
        lo = floor(s_corr_dim(c->rope_dim, c->rope_orig_ctx, c->rope_beta_fast, base));
        hi = ceil(s_corr_dim(c->rope_dim, c->rope_orig_ctx, c->rope_beta_slow, base));
        if (lo < 0) lo = 0;
        if (hi > c->rope_dim - 1) hi = c->rope_dim - 1;
    }
    for (int i = 0; i < r->half; i++) {
        const double extrap = pow(base, -2.0 * i / c->rope_dim) / ff[i], interp = extrap / scale;
        double mix = 0.0;
        if (ext != 0.0) {
            double y = (i - lo) / fmax(0.001, hi - lo);
            mix = (1.0 - fmin(1.0, fmax(0.0, y))) * ext;
        }
        r->inv_freq[i] = interp * (1.0 - mix) + extrap * mix;
    }
    /* llama.cpp: where YaRN mixes, its own magnitude 1 + 0.1 ln(factor) (1 for a factor <= 1) replaces
     * yarn_attn_factor; attn_factor multiplies either way */
    if (ext != 0.0) r->mscale = c->rope_attn_factor * (scale > 1.0 ? 1.0 + 0.1 * log(scale) : 1.0);
    else r->mscale = (double)c->rope_attn_factor * c->rope_yarn_attn;
    free(ff);
    return 0;
}

void rope_free(zl_rope *r) {
    if (!r) return;
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void rope_cs_row(const zl_rope *r, int pos, float *cs) {
    for (int i = 0; i < r->half; i++) {
        const double theta = (double)pos * r->inv_freq[i];
        cs[2 * i] = (float)(r->mscale * cos(theta));
        cs[2 * i + 1] = (float)(r->mscale * sin(theta));
    }
}
