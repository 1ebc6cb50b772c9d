/* tests/fuzz_main.h: every tests/fuzz_*.c defines LLVMFuzzerTestOneInput(data, size) and includes this.
 * Built by `make fuzz` with clang -fsanitize=fuzzer it is a libFuzzer target; built by the plain build
 * (FUZZ_REPLAY_MAIN) it is a replay driver: it runs every file named on the command line (directories are
 * walked one level), then the target's own seed corpus from fuzz_seeds(), then N pseudo-random mutations of
 * the seeds (N = $ZLLM_FUZZ_ITERS, default 2000), so CI exercises the decoder under AddressSanitizer.
 * The libFuzzer build exports the same seeds as files when ZLLM_FUZZ_SEED_DIR is set (LLVMFuzzerInitialize). */
#ifndef ZLLM_FUZZ_MAIN_H
#define ZLLM_FUZZ_MAIN_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* the target provides seeds: fills seeds[] and sizes[] with up to max entries, returns the count */
static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max);

#ifdef FUZZ_REPLAY_MAIN
static void s_fuzz_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    uint8_t *buf = NULL; size_t n = 0, cap = 0; int c;
    while ((c = fgetc(f)) != EOF) {
        if (n == cap) { cap = cap ? cap * 2 : 4096; buf = realloc(buf, cap); if (!buf) exit(2); }
        buf[n++] = (uint8_t)c;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf ? buf : (const uint8_t *)"", n);
    free(buf);
}
static uint64_t s_fuzz_rng = 0x9E3779B97F4A7C15ull;
static uint64_t s_fuzz_next(void) {
    s_fuzz_rng ^= s_fuzz_rng << 13; s_fuzz_rng ^= s_fuzz_rng >> 7; s_fuzz_rng ^= s_fuzz_rng << 17;
    return s_fuzz_rng;
}
int main(int argc, char **argv) {
    int runs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]); struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                char p[4096]; snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
                s_fuzz_file(p); runs++;
            }
            if (d) closedir(d);
        } else { s_fuzz_file(argv[i]); runs++; }
    }
    const uint8_t *seeds[64]; size_t sizes[64];
    int ns = fuzz_seeds(seeds, sizes, 64);
    for (int i = 0; i < ns; i++) { LLVMFuzzerTestOneInput(seeds[i], sizes[i]); runs++; }
    const char *it = getenv("ZLLM_FUZZ_ITERS");
    long iters = it ? atol(it) : 2000;
    for (long k = 0; k < iters && ns > 0; k++) {
        int s = (int)(s_fuzz_next() % (uint64_t)ns);
        size_t n = sizes[s] + (s_fuzz_next() % 3 == 0 ? s_fuzz_next() % 64 : 0);
        uint8_t *b = malloc(n ? n : 1);
        if (!b) return 2;
        memcpy(b, seeds[s], sizes[s]);
        for (size_t j = sizes[s]; j < n; j++) b[j] = (uint8_t)s_fuzz_next();
        int flips = 1 + (int)(s_fuzz_next() % 8);
        for (int j = 0; j < flips && n; j++) b[s_fuzz_next() % n] = (uint8_t)s_fuzz_next();
        if (s_fuzz_next() % 4 == 0 && n) n = s_fuzz_next() % n; /* truncate */
        LLVMFuzzerTestOneInput(b, n);
        free(b); runs++;
    }
    printf("%d passed, 0 failed\n", runs);
    return 0;
}
#else
/* libFuzzer build: with ZLLM_FUZZ_SEED_DIR set, the target writes its built-in seeds there as seed-N files and
 * exits (make fuzz exports them into $(BUILD)/fuzz/corpus/NAME, the corpus that make fuzz-long grows). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("ZLLM_FUZZ_SEED_DIR");
    if (!dir || !*dir) return 0;
    const uint8_t *seeds[64];
    size_t sizes[64];
    int ns = fuzz_seeds(seeds, sizes, 64);
    for (int i = 0; i < ns; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/seed-%d", dir, i);
        FILE *f = fopen(p, "wb");
        if (!f || fwrite(seeds[i], 1, sizes[i], f) != sizes[i]) {
            fprintf(stderr, "cannot write %s\n", p);
            if (f) fclose(f);
            exit(1);
        }
        fclose(f);
    }
    printf("%d seeds -> %s\n", ns, dir);
    exit(0);
}
#endif
#endif
