/* tools/main_zllm-tokbench.c: tokenizer encoding speed on one core.
 *
 *   zllm-tokbench -m MODEL.gguf [-f TEXT] [--mb N] [--chunk BYTES] [--ids OUT] [--text OUT]
 *
 * The text is TEXT, or by default the English license texts under /usr/share/common-licenses concatenated and
 * repeated up to N MB (default 8). It is encoded in chunks of about BYTES (default 4096, cut after a newline when
 * there is one, as prompts are; 0 = the whole text in one call), without BOS and without special-token parsing.
 * Prints MB/s for the first copy of the text (the word cache is cold, every word new) and for the whole run.
 * --ids writes the ids (one line, spaces), --text the text, so another tokenizer can be compared on the same input. */
#include "gguf.h"
#include "tokenizer.h"
#include "version.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double s_cpu(void) {   /* this process's CPU time: less disturbed than wall time on a busy machine */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_append_file(const char *path, char **buf, size_t *n, size_t *cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (*n + r + 1 > *cap) {
            size_t c = *cap ? *cap * 2 : 1 << 20;
            while (c < *n + r + 1) c *= 2;
            char *nb = realloc(*buf, c);
            if (!nb) { fclose(f); return -1; }
            *buf = nb; *cap = c;
        }
        memcpy(*buf + *n, tmp, r);
        *n += r;
    }
    fclose(f);
    return 0;
}

static int s_cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-tokbench -m MODEL.gguf [-f TEXT] [--mb N] [--chunk BYTES] [--ids OUT] [--text OUT]\n"
               "       zllm-tokbench --help | --version\n"
               "  -m MODEL.gguf     the model whose tokenizer is timed (required)\n"
               "  -f TEXT           the text (default: /usr/share/common-licenses, repeated)\n"
               "  --mb N            megabytes encoded, > 0 (default 8)\n"
               "  --chunk BYTES     bytes per encode call, >= 0 (default 4096; 0 = the whole text at once)\n"
               "  --ids OUT         write the ids (default: not written)\n"
               "  --text OUT        write the text (default: not written)\n"
               "Environment: none read.\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *ids_out = NULL, *text_out = NULL;
    double mb = 8;
    long chunk = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("zllm-tokbench %s\n", ZLLM_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atol(argv[++i]);
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_out = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text_out = argv[++i];
        else {
            s_usage(stderr);
            return 2;
        }
    }
    if (!model || mb <= 0 || chunk < 0) { fprintf(stderr, "zllm-tokbench: -m MODEL.gguf is required\n"); return 2; }
    char err[512] = "";
    int rc = 1;
    char *base = NULL, *text = NULL;
    int32_t *ids = NULL;
    zl_tokenizer *t = NULL;
    size_t nb = 0, capb = 0;
    gguf *g = gguf_open(model, err, sizeof err);
    if (!g) { fprintf(stderr, "zllm-tokbench: %s\n", err); goto fail; }
    double t0 = s_now();
    t = tokenizer_new(g, err, sizeof err);
    double t_load = s_now() - t0;
    gguf_close(&g);
    if (!t) { fprintf(stderr, "zllm-tokbench: %s\n", err); goto fail; }

    if (file) {
        if (s_append_file(file, &base, &nb, &capb) != 0) { fprintf(stderr, "zllm-tokbench: cannot read %s\n", file); goto fail; }
    } else {
        const char *dir = "/usr/share/common-licenses";
        DIR *d = opendir(dir);
        if (!d) { fprintf(stderr, "zllm-tokbench: no %s: give -f TEXT\n", dir); goto fail; }
        char *names[256];
        int nn = 0;
        struct dirent *e;
        while ((e = readdir(d)) && nn < 256)
            if (e->d_name[0] != '.') names[nn++] = strdup(e->d_name);
        closedir(d);
        qsort(names, (size_t)nn, sizeof *names, s_cmp_str);
        for (int i = 0; i < nn; i++) {
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, names[i]);
            if (names[i]) s_append_file(p, &base, &nb, &capb);   /* symlinks to the same text are fine */
            free(names[i]);
        }
    }
    if (nb == 0) { fprintf(stderr, "zllm-tokbench: empty text\n"); goto fail; }
    size_t target = file ? nb : (size_t)(mb * 1e6);
    if (target < nb) target = nb;
    size_t n = 0;
    text = malloc(target + 1);
    if (!text) goto fail;
    while (n < target) {
        size_t k = nb < target - n ? nb : target - n;
        memcpy(text + n, base, k);
        n += k;
    }
    text[n] = 0;

    size_t cap_ids = n / 2 + 1024, nids = 0;
    ids = malloc(cap_ids * sizeof *ids);
    if (!ids) goto fail;
    double first_s = 0, t_start = s_now(), c_start = s_cpu();
    size_t first_ids = 0;
    int first_done = 0;
    for (size_t off = 0; off < n;) {
        size_t len = chunk == 0 ? n - off : (size_t)chunk;
        if (len > n - off) len = n - off;
        if (chunk && off + len < n) {   /* end the chunk after a newline (else a space) when one is near the end */
            size_t cut = len;
            while (cut > len / 2 && text[off + cut - 1] != '\n') cut--;
            if (cut == len / 2) { cut = len; while (cut > len / 2 && text[off + cut - 1] != ' ') cut--; }
            if (cut > len / 2) len = cut;
        }
        if (!first_done && off + len > nb) {   /* the first copy ends inside this chunk: stop the cold clock here */
            first_done = 1;
            first_s = s_now() - t_start;
            first_ids = nids;
        }
        int c = tokenizer_encode(t, text + off, len, 0, 0, ids + nids, (int)(cap_ids - nids));
        if (c < 0) { fprintf(stderr, "zllm-tokbench: encode failed at %zu\n", off); goto fail; }
        if ((size_t)c > cap_ids - nids) { fprintf(stderr, "zllm-tokbench: id buffer too small\n"); goto fail; }
        nids += (size_t)c;
        off += len;
    }
    double secs = s_now() - t_start, cpu = s_cpu() - c_start;
    if (!first_done) { first_s = secs; first_ids = nids; }
    printf("model: %s (pre %s, %d tokens), vocabulary load %.3f s\n", model, tokenizer_pre(t), tokenizer_n_vocab(t), t_load);
    printf("text: %s, %.2f MB (%.3f MB unique), chunk %ld bytes\n", file ? file : "/usr/share/common-licenses/* repeated",
           n / 1e6, nb / 1e6, chunk);
    if (chunk > 0 && nb < n)
        printf("first copy (cold cache): %.3f MB in %.3f s = %.1f MB/s (%zu tokens)\n", nb / 1e6, first_s,
               nb / 1e6 / (first_s > 0 ? first_s : 1e-9), first_ids);
    printf("zllm encode: %.2f MB in %.3f s = %.1f MB/s, %zu tokens, %.2f M tokens/s, %.2f bytes/token\n", n / 1e6,
           secs, n / 1e6 / secs, nids, nids / 1e6 / secs, (double)n / (double)(nids ? nids : 1));
    printf("zllm encode (CPU time): %.2f MB in %.3f s = %.1f MB/s\n", n / 1e6, cpu, n / 1e6 / cpu);
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) goto fail;
        for (size_t i = 0; i < nids; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
        fputc('\n', f);
        fclose(f);
    }
    if (text_out) {
        FILE *f = fopen(text_out, "wb");
        if (!f) goto fail;
        fwrite(text, 1, n, f);
        fclose(f);
    }
    rc = 0;
fail:
    free(base); free(text); free(ids);
    tokenizer_destroy(&t);
    gguf_close(&g);
    return rc;
}
