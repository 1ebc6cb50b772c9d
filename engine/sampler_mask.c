/* engine/sampler_mask.c: the allowed-token mask on the CPU (sampler_mask.h). */
#include <math.h>
#include "sampler_mask.h"

void sampler_mask_apply(float *logits, int vocab, const uint32_t *mask) {
    for (int w = 0; w * 32 < vocab; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        int end = vocab - w * 32 < 32 ? vocab - w * 32 : 32;
        for (int j = 0; j < end; j++)
            if (!(bits >> j & 1)) logits[w * 32 + j] = -INFINITY;
    }
}
