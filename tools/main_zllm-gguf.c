/* zllm-gguf FILE...: validates GGUF files and prints their metadata and tensors.
 * Exit status 0 when every file is valid, 1 otherwise (with the reader's one-line message on stderr). */
#include <stdio.h>
#include <string.h>
#include "gguf.h"
#include "version.h"

static void s_print_value(const gguf *g, const gguf_value *v) {
    switch (v->type) {
    case GGUF_T_STRING: {
        uint64_t n = v->v.str.len > 80 ? 80 : v->v.str.len;
        printf("\"%.*s\"%s", (int)n, v->v.str.ptr, v->v.str.len > 80 ? "..." : "");
        break;
    }
    case GGUF_T_ARRAY: {
        printf("[%llu x type %d]", (unsigned long long)v->v.arr.n, (int)v->v.arr.elem);
        gguf_str s;
        if (v->v.arr.elem == GGUF_T_STRING && gguf_arr_str(g, v, 0, &s) == 0)
            printf(" first \"%.*s\"", (int)(s.len > 40 ? 40 : s.len), s.ptr);
        break;
    }
    case GGUF_T_FLOAT32: case GGUF_T_FLOAT64: printf("%g", v->v.f64); break;
    case GGUF_T_INT8: case GGUF_T_INT16: case GGUF_T_INT32: case GGUF_T_INT64: printf("%lld", (long long)v->v.i64); break;
    default: printf("%llu", (unsigned long long)v->v.u64); break;
    }
}

int main(int argc, char **argv) {
    static const char usage[] = "usage: zllm-gguf FILE.gguf...\n"
                                "       zllm-gguf --help | --version\n"
                                "Validates each GGUF file and prints its metadata and tensors; exit 0 when every\n"
                                "file is valid, 1 otherwise. No options. Environment: none read.\n";
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("zllm-gguf %s\n", ZLLM_VERSION);
        return 0;
    }
    int bad = 0;
    for (int a = 1; a < argc; a++) {
        char err[512];
        gguf *g = gguf_open(argv[a], err, sizeof err);
        if (!g) { fprintf(stderr, "%s\n", err); bad = 1; continue; }
        printf("%s: GGUF v%u, %llu metadata, %llu tensors, alignment %llu\n", argv[a], g->version,
               (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)g->alignment);
        for (uint64_t i = 0; i < g->n_kv; i++) {
            printf("  %.*s = ", (int)g->kv[i].key.len, g->kv[i].key.ptr);
            s_print_value(g, &g->kv[i].val);
            printf("\n");
        }
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const gguf_tensor *t = &g->tensors[i];
            printf("  %-32s %-5s [%lld", t->name, ggml_type_name(t->type), (long long)t->ne[0]);
            for (uint32_t d = 1; d < t->n_dims; d++) printf(", %lld", (long long)t->ne[d]);
            printf("] %llu bytes\n", (unsigned long long)t->nbytes);
        }
        gguf_close(&g);
    }
    return bad;
}
