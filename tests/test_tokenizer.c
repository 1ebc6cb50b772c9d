/* tests/test_tokenizer.c: the tokenizer against llama.cpp's own test vectors (ggml-vocab-*.gguf with .inp/.out in
 * $ZLLM_FIXTURES/vocab: every string, encoded without BOS, must give exactly the ids llama.cpp gives, and decode
 * back to itself) and against the vectors of tests/oracle (tests/data/tokenizer, copied into the same folder by
 * tests/fetch-fixtures.sh: Gemma 3's SentencePiece as transformers loads it from the GGUF, encoded with special
 * tokens parsed; Mistral NeMo's tekken by mistral-common, gpt-4o's split by tiktoken, Mistral v0.3's SentencePiece
 * by sentencepiece), round trips of random Unicode text and random bytes, streaming decode (held-back UTF-8,
 * byte tokens, the SentencePiece leading space), special-token parsing, BOS/EOG ids and error paths. */
#include "gguf.h"
#include "tokenizer.h"
#include "gguf_craft.h"
#include "test.h"

#include <string.h>
#include <time.h>

static char *s_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[sz] = 0; *n = (size_t)sz; }
    return b;
}

static zl_tokenizer *s_load(const char *name) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", test_fixtures(), name);
    gguf *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return NULL;
    zl_tokenizer *t = tokenizer_new(g, err, sizeof err);
    CHECK(t != NULL, "tokenizer_new %s: %s", path, err);
    gguf_close(&g);
    return t;
}

/* encodes without BOS into a malloc'd array; *n gets the count */
static int32_t *s_enc(const zl_tokenizer *t, const char *s, size_t len, int add_bos, int special, int *n) {
    int c = tokenizer_encode(t, s, len, add_bos, special, NULL, 0);
    *n = c;
    if (c < 0) return NULL;
    int32_t *ids = malloc((size_t)(c ? c : 1) * sizeof *ids);
    if (!ids) return NULL;
    int c2 = tokenizer_encode(t, s, len, add_bos, special, ids, c);
    if (c2 != c) CHECK(0, "second encode gave %d, first %d", c2, c);
    return ids;
}

/* decodes ids one at a time with the streaming decoder, then flushes; returns a malloc'd string */
static char *s_stream(const zl_tokenizer *t, const int32_t *ids, int n, int special, size_t *len) {
    zl_detok st;
    memset(&st, 0, sizeof st);
    size_t cap = 64, w = 0;
    char *out = malloc(cap);
    char piece[4096];
    for (int i = 0; i <= n && out; i++) {
        int k = i < n ? tokenizer_decode_stream(t, &st, ids[i], special, piece, sizeof piece)
                      : tokenizer_decode_flush(t, &st, piece, sizeof piece);
        if (k < 0) { CHECK(0, "decode_stream of id %d failed", i < n ? ids[i] : -1); break; }
        if (piece[k] != 0) CHECK(0, "stream piece not NUL-terminated");
        while (w + (size_t)k + 1 > cap) { cap *= 2; out = realloc(out, cap); if (!out) return NULL; }
        memcpy(out + w, piece, (size_t)k);
        w += (size_t)k;
    }
    if (out) out[w] = 0;
    *len = w;
    return out;
}

/* vectors in llama.cpp's layout, $ZLLM_FIXTURES/vocab/VEC.inp and .out, for the vocabulary ggml-vocab-NAME.gguf:
 * .inp strings separated by "\n__ggml_vocab_test__\n" (the file also ends with one, so the piece after the last
 * separator is empty and not a test), .out has one line of ids per string. Encoded without BOS, special-token text
 * parsed when `special`; each string must decode back to itself (streamed too), except for SentencePiece where
 * the string holds U+2581 or, when rt_special is 0, special tokens are parsed (the space prefix comes back after
 * each). */
static void s_vectors_of(const char *name, const char *vec, int is_spm, int special, int rt_special) {
    zl_tokenizer *t = s_load(name);
    if (!t) return;
    char path[1024];
    size_t ni = 0, no = 0;
    snprintf(path, sizeof path, "%s/vocab/%s.inp", test_fixtures(), vec);
    char *inp = s_slurp(path, &ni);
    snprintf(path, sizeof path, "%s/vocab/%s.out", test_fixtures(), vec);
    char *out = s_slurp(path, &no);
    CHECK(inp && out, "read %s vectors", name);
    if (!inp || !out) goto done;
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep);
    char *p = inp, *line = out;
    int count = 0, exact = 0, round = 0, stream_ok = 0;
    for (;;) {
        char *e = memmem(p, ni - (size_t)(p - inp), sep, seplen);
        if (!e) break;
        size_t len = (size_t)(e - p);
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL, "%s: .out has fewer lines than .inp strings", name);
        if (!nl) break;
        *nl = 0;
        int32_t want[4096];
        int nw = 0;
        for (char *q = line, *end; nw < 4096; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
        }
        int n;
        int32_t *ids = s_enc(t, p, len, 0, special, &n);
        int same = ids && n == nw && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;
        CHECK(same, "%s vector %d (\"%.*s\"): got %d ids, want %d", name, count, (int)(len > 40 ? 40 : len), p, n, nw);
        exact += same;
        /* SentencePiece: U+2581 in the text is the escaped space and decodes as ' ', and with special tokens parsed,
         * the space prefix starts the text after each one again (the known exceptions) */
        if (ids && is_spm && (memmem(p, len, "\xe2\x96\x81", 3) || (special && !rt_special))) {
            char *d = tokenizer_decode_len(t, ids, n, special, NULL);
            CHECK(d != NULL, "%s vector %d: decode failed", name, count);
            free(d);
            round++;
            stream_ok++;
        } else if (ids) {
            size_t dl;
            char *d = tokenizer_decode_len(t, ids, n, special, &dl);
            int rt = d && dl == len && memcmp(d, p, len) == 0;
            CHECK(rt, "%s vector %d: decode(encode(x)) != x: \"%s\"", name, count, d ? d : "(null)");
            round += rt;
            free(d);
            char *s = s_stream(t, ids, n, special, &dl);
            int so = s && dl == len && memcmp(s, p, len) == 0;   /* all vectors are valid UTF-8 */
            CHECK(so, "%s vector %d: streaming decode differs", name, count);
            stream_ok += so;
            free(s);
        }
        free(ids);
        count++;
        p = e + seplen;
        line = nl + 1;
    }
    CHECK(count >= 40, "%s: only %d vectors parsed", name, count);
    printf("%s (%s): %d vectors, %d exact, %d round trips, %d streamed (%s)\n", name, vec, count, exact, round,
           stream_ok, is_spm ? "SPM" : "BPE");
done:
    free(inp); free(out);
    tokenizer_destroy(&t);
}

/* the vectors that come with the vocabulary (ggml-vocab-NAME.gguf.inp/.out) */
static void s_vectors(const char *name, int is_spm, int special) {
    char vec[256];
    snprintf(vec, sizeof vec, "ggml-vocab-%s.gguf", name);
    s_vectors_of(name, vec, is_spm, special, 1);
}

static uint64_t s_rng = 0x2545F4914F6CDD1Dull;
static uint32_t s_rand(void) {
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 11);
}

static size_t s_put_cp(char *o, uint32_t c) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) { o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 63)); o[2] = (char)(0x80 | (c & 63)); return 3; }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 63)); o[2] = (char)(0x80 | (c >> 6 & 63)); o[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* random text: ASCII words and punctuation, whitespace runs, digits, Latin-1, Cyrillic, CJK, combining marks,
 * emoji, and any valid code point; no_spm_space leaves out U+2581 (which SentencePiece maps to a space) */
static size_t s_rand_text(char *o, size_t max_cp, int no_spm_space) {
    static const uint32_t pick[] = {' ', ' ', '\n', '\t', '\r', 'a', 'e', 'T', '\'', '.', ',', '!', '0', '7', '<', '|'};
    size_t n = 0, k = 1 + s_rand() % max_cp;
    for (size_t i = 0; i < k; i++) {
        uint32_t c, r = s_rand() % 10;
        if (r < 3) c = pick[s_rand() % 16];
        else if (r < 5) c = 'a' + s_rand() % 26;
        else if (r == 5) c = 0xA0 + s_rand() % 0x160;
        else if (r == 6) c = 0x400 + s_rand() % 0x100;
        else if (r == 7) c = 0x4E00 + s_rand() % 0x5000;
        else if (r == 8) c = (s_rand() & 1) ? 0x1F300 + s_rand() % 0x300 : 0x300 + s_rand() % 0x70;
        else c = 1 + s_rand() % 0x10FFFF;
        if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
        if (no_spm_space && c == 0x2581) c = 'y';
        n += s_put_cp(o + n, c);
    }
    return n;
}

static void s_roundtrips(const char *name, int is_spm, int iters) {
    zl_tokenizer *t = s_load(name);
    if (!t) return;
    char buf[4 * 200 + 16];
    int bad_text = 0, bad_bytes = 0, bad_stream = 0;
    for (int it = 0; it < iters; it++) {
        size_t n = s_rand_text(buf, 200, is_spm);
        int k;
        int32_t *ids = s_enc(t, buf, n, 0, 0, &k);
        size_t dl = 0;
        char *d = ids ? tokenizer_decode_len(t, ids, k, 0, &dl) : NULL;
        if (!d || dl != n || memcmp(d, buf, n) != 0) {
            if (bad_text++ < 3) CHECK(0, "%s: random text round trip failed (%zu bytes)", name, n);
        }
        char *s = ids ? s_stream(t, ids, k, 0, &dl) : NULL;   /* valid UTF-8: streaming gives the same bytes */
        if (!s || dl != n || memcmp(s, buf, n) != 0) {
            if (bad_stream++ < 3) CHECK(0, "%s: random text streaming decode differs", name);
        }
        free(ids); free(d); free(s);
        /* random bytes (invalid UTF-8 included, NULs too) */
        n = s_rand() % 300;
        for (size_t i = 0; i < n; i++) buf[i] = (char)s_rand();
        ids = s_enc(t, buf, n, 0, 0, &k);
        CHECK(ids != NULL && k >= 0, "%s: random bytes encode failed", name);
        d = ids ? tokenizer_decode_len(t, ids, k, 0, &dl) : NULL;
        /* exact for BPE (invalid bytes form words of their own, encoded byte-wise) and for SPM (byte fallback;
         * the prefix space the encoder adds is the one the decoder drops) */
        if (!d || dl != n || memcmp(d, buf, n) != 0) {
            if (bad_bytes++ < 3) CHECK(0, "%s: random bytes round trip failed (%zu bytes)", name, n);
        }
        /* the streaming decoder never emits invalid UTF-8 */
        s = ids ? s_stream(t, ids, k, 0, &dl) : NULL;
        if (s) {
            size_t i = 0;
            int valid = 1;
            while (i < dl) {
                unsigned char c = (unsigned char)s[i];
                int L = c < 0x80 ? 1 : c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
                if (!L || i + (size_t)L > dl) { valid = 0; break; }
                for (int j = 1; j < L; j++) if (((unsigned char)s[i + j] & 0xC0) != 0x80) valid = 0;
                i += (size_t)L;
            }
            if (!valid && bad_stream++ < 3) CHECK(0, "%s: streaming decode emitted invalid UTF-8", name);
        }
        free(ids); free(d); free(s);
    }
    CHECK(bad_text == 0, "%s: %d random texts failed to round trip", name, bad_text);
    CHECK(bad_bytes == 0, "%s: %d random byte strings failed to round trip", name, bad_bytes);
    CHECK(bad_stream == 0, "%s: %d streaming decodes wrong", name, bad_stream);
    printf("%s: %d random texts and %d random byte strings round-tripped\n", name, iters - bad_text, iters - bad_bytes);
    tokenizer_destroy(&t);
}

static int s_contains(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++) if (ids[i] == id) return 1;
    return 0;
}

static void s_specials(void) {
    zl_tokenizer *t = s_load("llama-bpe");
    if (t) {
        CHECK(tokenizer_bos(t) == 128000 && tokenizer_eos(t) == 128001, "llama-bpe bos/eos %d %d", tokenizer_bos(t), tokenizer_eos(t));
        CHECK(tokenizer_add_bos(t) == 1, "llama-bpe add_bos default");
        CHECK(tokenizer_is_eog(t, 128009) && tokenizer_is_eog(t, 128001) && !tokenizer_is_eog(t, 128000) && !tokenizer_is_eog(t, 9906),
              "llama-bpe end-of-generation set");
        const char *s = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>";
        int n, m;
        int32_t *a = s_enc(t, s, strlen(s), 0, 1, &n);
        CHECK(a && n >= 6 && a[0] == 128000 && a[1] == 128006 && a[3] == 128007 && a[n - 1] == 128009,
              "parse_special: special tokens become single tokens");
        int32_t *b = s_enc(t, s, strlen(s), 0, 0, &m);
        CHECK(b && !s_contains(b, m, 128000) && !s_contains(b, m, 128009), "no parse_special: special text stays text");
        size_t dl;
        char *d = b ? tokenizer_decode_len(t, b, m, 0, &dl) : NULL;
        CHECK(d && dl == strlen(s) && memcmp(d, s, dl) == 0, "special text as plain text round trips");
        free(d);
        d = a ? tokenizer_decode_len(t, a, n, 1, &dl) : NULL;
        CHECK(d && strcmp(d, s) == 0, "decode with special=1 prints control tokens");
        free(d);
        d = a ? tokenizer_decode_len(t, a, n, 0, &dl) : NULL;
        CHECK(d && strcmp(d, "user\n\nHello") == 0, "decode with special=0 hides control tokens: \"%s\"", d ? d : "");
        free(d);
        free(a); free(b);
        /* add_bos, and the count when the buffer is too small */
        int32_t few[2];
        int c = tokenizer_encode(t, "Hello world, again", 18, 1, 0, few, 2);
        CHECK(c == 5 && few[0] == 128000, "encode returns the full count (%d) with a short buffer", c);
        CHECK(tokenizer_encode(t, "", 0, 1, 0, few, 2) == 1 && few[0] == 128000, "empty text with BOS");
        CHECK(tokenizer_encode(t, "", 0, 0, 0, few, 2) == 0, "empty text without BOS");
        /* streaming: an emoji split over byte-level tokens is held back until complete */
        const char *emo = "\xF0\x9F\xA6\x99\xF0\x9F\xA6\x99";
        int32_t *e = s_enc(t, emo, strlen(emo), 0, 0, &n);
        CHECK(e && n >= 2, "emoji encodes to several tokens (%d)", n);
        if (e && n >= 2) {
            zl_detok st; memset(&st, 0, sizeof st);
            char out[64];
            int w0 = tokenizer_decode_stream(t, &st, e[0], 0, out, sizeof out);
            CHECK(w0 == 0 && st.n_pend > 0, "first piece of a split emoji is held back (%d bytes out)", w0);
            zl_detok st2 = st;
            int wsmall = 0;
            for (int i = 1; i < n && wsmall == 0; i++) wsmall = tokenizer_decode_stream(t, &st2, e[i], 0, out, 3);
            CHECK(wsmall == -1, "a completed emoji does not fit 3 bytes: -1 (%d)", wsmall);
            int wbig = 0;
            for (int i = 1; i < n; i++) wbig += tokenizer_decode_stream(t, &st, e[i], 0, out + wbig, sizeof out - (size_t)wbig);
            CHECK(wbig == 8 && memcmp(out, emo, 8) == 0 && st.n_pend == 0, "whole emojis released (%d bytes)", wbig);
        }
        free(e);
        zl_detok st; memset(&st, 0, sizeof st);
        char out[64];
        CHECK(tokenizer_decode_stream(t, &st, 128256, 0, out, sizeof out) == -1, "out-of-range id refused");
        CHECK(tokenizer_decode_stream(t, &st, -1, 0, out, sizeof out) == -1, "negative id refused");
        tokenizer_destroy(&t);
        CHECK(t == NULL, "destroy NULLs the pointer");
        tokenizer_destroy(&t);
    }
    t = s_load("qwen2");
    if (t) {
        const char *s = "<|im_start|>user\nhi<|im_end|>\n";
        int n;
        int32_t *a = s_enc(t, s, strlen(s), 0, 1, &n);
        CHECK(a && n >= 4 && a[0] == 151644 && s_contains(a, n, 151645), "qwen2 ChatML specials");
        free(a);
        CHECK(tokenizer_is_eog(t, 151645) && tokenizer_is_eog(t, 151643), "qwen2 EOG: <|im_end|>, <|endoftext|>");
        CHECK(tokenizer_add_bos(t) == 0, "qwen2 adds no BOS");
        /* user-defined tokens ([PAD151646]) are matched even without parse_special, as in llama.cpp */
        a = s_enc(t, "x[PAD151646]y", 13, 0, 0, &n);
        CHECK(a && s_contains(a, n, 151646), "user-defined token matched as a whole");
        free(a);
        tokenizer_destroy(&t);
    }
    t = s_load("llama-spm");
    if (t) {
        CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2 && tokenizer_add_bos(t) == 1, "spm bos/eos/add_bos");
        int n;
        int32_t *a = s_enc(t, "Hello", 5, 1, 0, &n);
        CHECK(a && n == 2 && a[0] == 1 && a[1] == 15043, "spm BOS + ▁Hello");
        /* streaming: BOS prints nothing, the first piece loses its space prefix once */
        if (a && n == 2) {
            zl_detok st; memset(&st, 0, sizeof st);
            char out[64];
            CHECK(tokenizer_decode_stream(t, &st, a[0], 0, out, sizeof out) == 0, "BOS decodes to nothing");
            int w = tokenizer_decode_stream(t, &st, a[1], 0, out, sizeof out);
            CHECK(w == 5 && strcmp(out, "Hello") == 0, "leading space dropped at start: \"%s\"", out);
            w = tokenizer_decode_stream(t, &st, a[1], 0, out, sizeof out);
            CHECK(w == 6 && strcmp(out, " Hello") == 0, "later pieces keep their space: \"%s\"", out);
            w = tokenizer_decode_stream(t, &st, a[0], 1, out, sizeof out);
            CHECK(w == 3 && strcmp(out, "<s>") == 0, "special=1 prints <s>");
        }
        free(a);
        /* byte fallback: a character missing from the vocabulary becomes <0xNN> byte tokens, held back while
         * streaming until the character is complete; a lone invalid byte streams as U+FFFD */
        const char *rare = "\xF0\x9F\xA6\x99";   /* U+1F999 */
        a = s_enc(t, rare, 4, 0, 0, &n);
        CHECK(a && n == 5 && a[0] == 29871 && a[1] == 3 + 0xF0 && a[4] == 3 + 0x99, "byte fallback <0xF0>..<0x99> (%d ids)", n);
        if (a && n == 5) {
            zl_detok st; memset(&st, 0, sizeof st);
            char out[64];
            int w = 0;
            for (int i = 0; i < 4; i++) w += tokenizer_decode_stream(t, &st, a[i], 0, out, sizeof out);
            CHECK(w == 0 && st.n_pend == 3, "3 bytes held back (%d out, %d pending)", w, st.n_pend);
            w = tokenizer_decode_stream(t, &st, a[4], 0, out, sizeof out);
            CHECK(w == 4 && memcmp(out, rare, 4) == 0, "completed character released");
            tokenizer_decode_stream(t, &st, 3 + 0xF0, 0, out, sizeof out);
            w = tokenizer_decode_stream(t, &st, 3 + 'A', 0, out, sizeof out);
            CHECK(w == 4 && memcmp(out, "\xEF\xBF\xBD" "A", 4) == 0, "broken sequence -> U+FFFD then the byte");
            tokenizer_decode_stream(t, &st, 3 + 0xE2, 0, out, sizeof out);
            w = tokenizer_decode_flush(t, &st, out, sizeof out);
            CHECK(w == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0 && st.n_pend == 0, "flush turns leftovers into U+FFFD");
        }
        free(a);
        tokenizer_destroy(&t);
    }
}

/* llama2.c's run.c printed golden_greedy_text.txt (plus a final newline) for the 200 ids of golden_greedy_ids.txt
 * generated from BOS with stories260K's 512-token SentencePiece vocabulary: our decoders must print the same */
static void s_stories_golden(void) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/stories260K/stories260K.gguf", test_fixtures());
    gguf *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return;
    zl_tokenizer *t = tokenizer_new(g, err, sizeof err);
    gguf_close(&g);
    CHECK(t != NULL, "stories260K tokenizer: %s", err);
    size_t ni = 0, nt = 0;
    snprintf(path, sizeof path, "%s/stories260K/golden_greedy_ids.txt", test_fixtures());
    char *ids_txt = s_slurp(path, &ni);
    snprintf(path, sizeof path, "%s/stories260K/golden_greedy_text.txt", test_fixtures());
    char *want = s_slurp(path, &nt);
    CHECK(t && ids_txt && want, "stories260K golden files");
    if (t && ids_txt && want) {
        int32_t ids[1024];
        int n = 0;
        for (char *q = ids_txt, *end; n < 1024; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            ids[n++] = (int32_t)v;
        }
        if (nt > 0 && want[nt - 1] == '\n') want[--nt] = 0;   /* run.c's closing newline */
        size_t dl;
        char *d = tokenizer_decode_len(t, ids, n, 0, &dl);
        CHECK(n == 200 && d && dl == nt && memcmp(d, want, nt) == 0, "stories260K: decode of the 200 golden ids");
        free(d);
        d = s_stream(t, ids, n, 0, &dl);
        CHECK(d && dl == nt && memcmp(d, want, nt) == 0, "stories260K: streaming decode of the golden ids");
        free(d);
    }
    free(ids_txt); free(want);
    tokenizer_destroy(&t);
}

static void s_errors(void) {
    /* a valid GGUF v3 with no metadata at all: no tokenizer */
    unsigned char hdr[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    char err[256] = "";
    gguf *g = gguf_open_mem(hdr, sizeof hdr, "empty.gguf", err, sizeof err);
    CHECK(g != NULL, "empty gguf opens: %s", err);
    if (g) {
        err[0] = 0;
        zl_tokenizer *t = tokenizer_new(g, err, sizeof err);
        CHECK(t == NULL && strstr(err, "tokenizer.ggml.model") != NULL, "no tokenizer refused: \"%s\"", err);
        gguf_close(&g);
    }
    /* a BPE vocabulary (three tokens, one merge) under each tokenizer.ggml.pre: the known ones load, an unknown
     * one is refused with an error naming it */
    static const struct {
        const char *pre;
        int ok;
    } pres[] = {
        {"llama-bpe", 1}, {"qwen2", 1},       {"tekken", 1},  {"gpt-4o", 1}, {"dbrx", 1},
        {"smaug-bpe", 1}, {"llama4", 1},      {"pixtral", 1}, {"gpt-2", 1},  {"default", 1},
        {"qwen35", 0},    {"no-such-pre", 0}, {"", 0},
    };
    (void)craft_valid; /* gguf_craft.h's full file is not needed here */
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        craft_buf c = {0};
        craft_put(&c, "GGUF", 4);
        craft_u32(&c, 3);
        craft_u64(&c, 0);
        craft_u64(&c, 4);
        craft_str(&c, "tokenizer.ggml.model");
        craft_u32(&c, 8);
        craft_str(&c, "gpt2");
        craft_str(&c, "tokenizer.ggml.pre");
        craft_u32(&c, 8);
        craft_str(&c, pres[i].pre);
        craft_str(&c, "tokenizer.ggml.tokens");
        craft_u32(&c, 9);
        craft_u32(&c, 8);
        craft_u64(&c, 3);
        craft_str(&c, "a");
        craft_str(&c, "b");
        craft_str(&c, "ab");
        craft_str(&c, "tokenizer.ggml.merges");
        craft_u32(&c, 9);
        craft_u32(&c, 8);
        craft_u64(&c, 1);
        craft_str(&c, "a b");
        err[0] = 0;
        g = gguf_open_mem(c.b, c.n, "pre.gguf", err, sizeof err);
        CHECK(g != NULL, "crafted vocabulary opens: %s", err);
        zl_tokenizer *t = g ? tokenizer_new(g, err, sizeof err) : NULL;
        if (pres[i].ok) {
            int32_t ids[4];
            int n = t ? tokenizer_encode(t, "ab", 2, 0, 0, ids, 4) : -1;
            CHECK(t && n == 1 && ids[0] == 2, "pre '%s' loads and merges \"ab\" (%d ids): %s", pres[i].pre, n, err);
        } else {
            char want[64];
            snprintf(want, sizeof want, "tokenizer.ggml.pre = '%s'", pres[i].pre);
            CHECK(!t && strstr(err, want) && strstr(err, "unsupported"), "pre '%s' refused, naming it: \"%s\"",
                  pres[i].pre, err);
        }
        tokenizer_destroy(&t);
        gguf_close(&g);
        free(c.b);
    }
    /* add_space_prefix: as the file says, else by model: SentencePiece prefixes a space, a gemma* file does not */
    static const struct {
        const char *arch;
        int key;
        int want;
    } sp[] = {
        {"llama", -1, 2}, {"gemma3", -1, 1}, {"gemma3", 1, 2}, {"llama", 0, 1}, {"phi3", -1, 2},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        craft_buf c = {0};
        craft_put(&c, "GGUF", 4);
        craft_u32(&c, 3);
        craft_u64(&c, 0);
        craft_u64(&c, sp[i].key < 0 ? 3 : 4);
        craft_str(&c, "general.architecture");
        craft_u32(&c, 8);
        craft_str(&c, sp[i].arch);
        craft_str(&c, "tokenizer.ggml.model");
        craft_u32(&c, 8);
        craft_str(&c, "llama");
        craft_str(&c, "tokenizer.ggml.tokens");
        craft_u32(&c, 9);
        craft_u32(&c, 8);
        craft_u64(&c, 3);
        craft_str(&c, "<unk>");
        craft_str(&c, "\xe2\x96\x81");
        craft_str(&c, "a"); /* ids: <unk> 0, U+2581 1, a 2 */
        if (sp[i].key >= 0) {
            craft_str(&c, "tokenizer.ggml.add_space_prefix");
            craft_u32(&c, 7);
            craft_u8(&c, (uint8_t)sp[i].key);
        }
        err[0] = 0;
        g = gguf_open_mem(c.b, c.n, "spm.gguf", err, sizeof err);
        zl_tokenizer *t = g ? tokenizer_new(g, err, sizeof err) : NULL;
        int32_t ids[4];
        int n = t ? tokenizer_encode(t, "a", 1, 0, 0, ids, 4) : -1;
        CHECK(n == sp[i].want && ids[n - 1] == 2, "%s, add_space_prefix key %d: \"a\" gives %d ids, want %d: %s",
              sp[i].arch, sp[i].key, n, sp[i].want, err);
        tokenizer_destroy(&t);
        gguf_close(&g);
        free(c.b);
    }
    CHECK(tokenizer_new(NULL, err, sizeof err) == NULL, "NULL gguf refused");
    CHECK(tokenizer_encode(NULL, "x", 1, 0, 0, NULL, 0) == -1, "NULL tokenizer refused");
}

/* tokenizer_stream_cap: every piece of Gemma 3's 262k streams into a buffer of that size, and asking costs nothing
 * (it is found once, not by a walk of the vocabulary per call: a caller may ask per request) */
static void s_stream_cap(void) {
    zl_tokenizer *t = s_load("gemma3");
    CHECK(t != NULL, "gemma3 loads");
    if (!t) return;
    size_t cap = tokenizer_stream_cap(t);
    char *out = malloc(cap);
    int bad = 0, n = tokenizer_n_vocab(t);
    for (int32_t id = 0; out && id < n; id++) {
        zl_detok st;
        memset(&st, 0, sizeof st);
        if (tokenizer_decode_stream(t, &st, id, 1, out, cap) < 0 || tokenizer_decode_flush(t, &st, out, cap) < 0) bad++;
    }
    CHECK(out && bad == 0, "%d of %d pieces do not stream into tokenizer_stream_cap (%zu) bytes", bad, n, cap);
    clock_t c0 = clock();
    size_t same = 0;
    for (int i = 0; i < 100000; i++) same += tokenizer_stream_cap(t) == cap;
    double s = (double)(clock() - c0) / CLOCKS_PER_SEC;
    CHECK(same == 100000 && s < 0.5, "100,000 tokenizer_stream_cap calls: %zu the same, %.2f s CPU", same, s);
    free(out);
    tokenizer_destroy(&t);
}

/* the special-token scan: Gemma 3 has thousands of specials starting with '<', and a text of '<' asks at every
 * byte for the longest one there. 64 KiB of them encode in about 0.01 s of CPU (comparing with every special of
 * that first byte takes about 0.7 s); the bound leaves room for a slower host. The ids stay those of a special: a run of
 * <start_of_turn> is one id each with parse_special */
static void s_special_scan(void) {
    zl_tokenizer *t = s_load("gemma3");
    if (!t) return;
    const size_t n = 64 * 1024;
    char *text = malloc(n);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!text || !ids) goto done;
    memset(text, '<', n);
    clock_t c0 = clock();
    int a = tokenizer_encode(t, text, n, 0, 1, ids, (int)n);
    double s = (double)(clock() - c0) / CLOCKS_PER_SEC;
    CHECK(a > 0 && s < 0.3, "64 KiB of '<': %d ids in %.2f s CPU", a, s);
    const char *sot = "<start_of_turn>";
    size_t L = strlen(sot), k = n / L;
    for (size_t i = 0; i < k; i++) memcpy(text + i * L, sot, L);
    int c = tokenizer_encode(t, text, k * L, 0, 1, ids, (int)n), same = 0;
    for (int i = 0; i < c; i++) same += ids[i] == ids[0];
    CHECK(c == (int)k && same == c, "%zu <start_of_turn>: %d ids, %d of them the first", k, c, same);
done:
    free(text);
    free(ids);
    tokenizer_destroy(&t);
}

int main(void) {
    clock_t c0 = clock();
    s_vectors("llama-spm", 1, 0);
    s_vectors("llama-bpe", 0, 0);
    s_vectors("qwen2", 0, 0);
    s_vectors("phi-3", 1, 0);
    s_vectors("gpt-2", 0, 0);
    s_vectors("starcoder", 0, 0);
    s_vectors("refact", 0, 0);
    s_vectors("mpt", 0, 0);
    s_vectors("gemma3", 1, 1);
    s_vectors("tekken", 0, 0);
    s_vectors("gpt-4o", 0, 0);
    s_vectors("mistral-v3", 1, 0);
    s_vectors_of("llama-bpe", "tf-llama-bpe", 0, 1, 1);
    s_vectors_of("qwen2", "tf-qwen2", 0, 1, 1);
    s_vectors_of("phi-3", "tf-phi-3", 1, 1, 0); /* a space prefix: no round trip after special tokens */
    s_roundtrips("llama-bpe", 0, 300);
    s_roundtrips("qwen2", 0, 300);
    s_roundtrips("llama-spm", 1, 300);
    s_roundtrips("gemma3", 1, 300);
    s_specials();
    s_stream_cap();
    s_special_scan();
    s_stories_golden();
    s_errors();
    printf("cpu %.2f s\n", (double)(clock() - c0) / CLOCKS_PER_SEC);
    return test_report();
}
