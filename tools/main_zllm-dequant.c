/* tools/main_zllm-dequant.c: exposes engine/quant.c to scripts (tests/test_quant_gguf.py checks it against
 * gguf-py's numpy implementation).
 *   zllm-dequant TYPE IN OUT            raw blocks of TYPE -> little-endian f32
 *   zllm-dequant -q TYPE IN OUT         f32 -> raw blocks (quant_quantize_row)
 *   zllm-dequant --dot TYPE ROW X OUT   one row of TYPE dotted with f32 X -> one f32 (quant_dot_row)
 * TYPE is a ggml type name as ggml_type_name() prints it (F32 F16 BF16 Q8_0 Q4_0 ... Q6_K, any case). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf.h"
#include "quant.h"
#include "version.h"

static unsigned char *s_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    long len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) goto fail;
    fclose(f);
    *n = (size_t)len;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

static int s_spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-dequant TYPE IN OUT            raw blocks of TYPE -> little-endian f32\n"
               "       zllm-dequant -q TYPE IN OUT         f32 -> raw blocks of TYPE\n"
               "       zllm-dequant --dot TYPE ROW X OUT   one row of TYPE dotted with f32 X -> one f32\n"
               "       zllm-dequant --help | --version\n"
               "TYPE is a ggml type name (F32 F16 BF16 Q8_0 Q4_0 ... Q6_K, any case); no option has a default.\n"
               "Environment: none read.\n");
}

int main(int argc, char **argv) {
    int mode = 0, a = 1;   /* 0 dequant, 1 quantize, 2 dot */
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        s_usage(stdout);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("zllm-dequant %s\n", ZLLM_VERSION);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "-q") == 0) mode = 1, a = 2;
    else if (argc > 1 && strcmp(argv[1], "--dot") == 0) mode = 2, a = 2;
    if (argc - a != (mode == 2 ? 4 : 3)) {
        s_usage(stderr);
        return 2;
    }
    int t = -1;
    for (int i = 0; i < GGML_TYPE_COUNT; i++) {
        const char *nm = ggml_type_name((ggml_type)i);
        if (nm && strcasecmp(nm, argv[a]) == 0 && quant_supported((ggml_type)i)) t = i;
    }
    if (t < 0) {
        fprintf(stderr, "zllm-dequant: unsupported type %s\n", argv[a]);
        return 2;
    }
    int blk = ggml_type_block((ggml_type)t);
    size_t bb = ggml_type_block_bytes((ggml_type)t), n = 0, nx = 0;
    unsigned char *in = s_slurp(argv[a + 1], &n), *x = NULL;
    void *out = NULL;
    int rc = 1;
    if (!in) {
        fprintf(stderr, "zllm-dequant: cannot read %s\n", argv[a + 1]);
        goto out;
    }
    if (mode == 0) {
        if (n % bb) goto bad;
        int64_t ne = (int64_t)(n / bb) * blk;
        out = malloc((size_t)ne * 4 + 1);
        if (!out || quant_dequant_row((ggml_type)t, in, out, ne) != 0) goto bad;
        rc = s_spit(argv[a + 2], out, (size_t)ne * 4) == 0 ? 0 : 1;
    } else if (mode == 1) {
        if (n % 4 || (n / 4) % (size_t)blk) goto bad;
        int64_t ne = (int64_t)(n / 4);
        size_t ob = ggml_row_bytes((ggml_type)t, ne);
        out = malloc(ob + 1);
        if (!out || quant_quantize_row((ggml_type)t, (const float *)in, out, ne) != 0) goto bad;
        rc = s_spit(argv[a + 2], out, ob) == 0 ? 0 : 1;
    } else {
        x = s_slurp(argv[a + 2], &nx);
        if (!x || n % bb || nx != (n / bb) * (size_t)blk * 4) goto bad;
        float d = quant_dot_row((ggml_type)t, in, (const float *)x, (int64_t)(nx / 4));
        rc = s_spit(argv[a + 3], &d, 4) == 0 ? 0 : 1;
    }
    goto out;
bad:
    fprintf(stderr, "zllm-dequant: bad input size or type\n");
out:
    free(in);
    free(x);
    free(out);
    return rc;
}
