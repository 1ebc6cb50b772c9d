/* tests/fuzz_tokenizer.c: fuzz target for the tokenizer and chat templates.
 *
 * The vocab GGUFs of $ZLLM_FIXTURES/vocab (default: the folder tests/fetch-fixtures.sh prints) are loaded once:
 * llama-spm, llama-bpe, qwen2 and, for inputs of even length, gemma3 (Gemma's SentencePiece), tekken, gpt-4o.
 * The first input byte picks what to do with the rest:
 *   mode 0: encode with one of the six vocabularies (parse_special / add_bos from bits), decode, and require
 *           decode(encode(x)) == x for the BPE ones (any bytes: invalid UTF-8 is encoded byte-wise) and for SPM
 *           without special parsing when x has no U+2581 (SentencePiece's escaped space, which decodes as ' ');
 *           the streaming decoder must emit valid UTF-8 only.
 *   mode 1: the bytes as token ids (16-bit little-endian, modulo the vocabulary) through the streaming decoder
 *           with tiny and normal buffers.
 *   mode 2: the bytes as a chat template (rendered with a fixed conversation): recognised or refused, no crash.
 *   mode 3: a synthetic GGUF vocabulary built from the bytes (tokens split at '\n', types and scores from the
 *           bytes, merges from token pairs, model, pre-tokenizer and a gemma3 or llama architecture from bits):
 *           tokenizer_new accepts or refuses,
 *           and an accepted one encodes and decodes its own token texts without crashing.
 * A violated property aborts (a crash for libFuzzer, a failure for the replay driver). */
#include "gguf.h"
#include "tokenizer.h"
#include "fuzz_main.h"

#include <string.h>

#define N_VOCAB 6
static zl_tokenizer *s_tok[N_VOCAB]; /* llama-spm, llama-bpe, qwen2, gemma3, tekken, gpt-4o */
static const int s_spm[N_VOCAB] = {1, 0, 0, 1, 0, 0};

/* the vocabulary an input of n bytes with these flags uses */
static int s_pick(uint8_t flags, size_t n) { return flags % 3 + (n % 2 ? 0 : 3); }
static int s_loaded;

static void s_load(void) {
    if (s_loaded) return;
    s_loaded = 1;
    const char *fx = getenv("ZLLM_FIXTURES");
    char dir[1024] = "";
    if (!fx || !*fx) { /* the folder tests/fetch-fixtures.sh assembles (run from the repository root) */
        FILE *p = popen("bash tests/fetch-fixtures.sh", "r");
        if (p) {
            if (!fgets(dir, sizeof dir, p)) dir[0] = 0;
            pclose(p);
        }
        dir[strcspn(dir, "\n")] = 0;
        fx = dir;
    }
    static const char *names[N_VOCAB] = {"llama-spm", "llama-bpe", "qwen2", "gemma3", "tekken", "gpt-4o"};
    for (int i = 0; i < N_VOCAB; i++) {
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", fx, names[i]);
        gguf *g = gguf_open(path, err, sizeof err);
        if (!g) { fprintf(stderr, "fuzz_tokenizer: %s\n", err); abort(); }
        s_tok[i] = tokenizer_new(g, err, sizeof err);
        gguf_close(&g);
        if (!s_tok[i]) { fprintf(stderr, "fuzz_tokenizer: %s\n", err); abort(); }
    }
}

static void s_fail(const char *what, const uint8_t *d, size_t n) {
    fprintf(stderr, "fuzz_tokenizer: %s (input %zu bytes:", what, n);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %02x", d[i]);
    fprintf(stderr, ")\n");
    abort();
}

static int s_valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int L = c < 0x80 ? 1 : (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3 : (c >= 0xF0 && c < 0xF5) ? 4 : 0;
        if (!L || i + (size_t)L > n) return 0;
        for (int j = 1; j < L; j++) if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        i += (size_t)L;
    }
    return 1;
}

/* streams ids through the decoder with buffers of cap bytes (retrying with a big one on -1) */
static void s_stream(const zl_tokenizer *t, const int32_t *ids, int n, int special, size_t cap, const uint8_t *d, size_t dn) {
    zl_detok st;
    memset(&st, 0, sizeof st);
    /* small first (it may run short: -1, nothing changed), then tokenizer_stream_cap bytes, which never may */
    const size_t bigcap = tokenizer_stream_cap(t);
    char small[16], *big = malloc(bigcap);
    if (!big) abort();
    for (int i = 0; i <= n; i++) {
        char *o = cap < sizeof small ? small : big;
        size_t c = cap < sizeof small ? cap : (cap < bigcap ? cap : bigcap);
        int w = i < n ? tokenizer_decode_stream(t, &st, ids[i], special, o, c) : tokenizer_decode_flush(t, &st, o, c);
        if (w < 0) {
            o = big;
            w = i < n ? tokenizer_decode_stream(t, &st, ids[i], special, big, bigcap)
                      : tokenizer_decode_flush(t, &st, big, bigcap);
        }
        if (w < 0) s_fail("stream decode failed with a tokenizer_stream_cap buffer", d, dn);
        if (o[w] != 0 || !s_valid_utf8(o, (size_t)w)) s_fail("stream decode emitted invalid UTF-8", d, dn);
        if (st.n_pend < 0 || st.n_pend > 3) s_fail("stream decode holds more than 3 bytes", d, dn);
    }
    free(big);
}

static void s_mode_encode(const uint8_t *d, size_t n, uint8_t flags) {
    int v = s_pick(flags, n), parse_special = (flags >> 2) & 1, add_bos = (flags >> 3) & 1;
    const zl_tokenizer *t = s_tok[v];
    int32_t small[8];
    int cnt = tokenizer_encode(t, (const char *)d, n, add_bos, parse_special, small, 8);
    if (cnt < 0) s_fail("encode failed", d, n);
    int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
    if (!ids) abort();
    if (tokenizer_encode(t, (const char *)d, n, add_bos, parse_special, ids, cnt) != cnt) s_fail("encode count changed", d, n);
    if (memcmp(ids, small, (size_t)(cnt < 8 ? cnt : 8) * sizeof *ids) != 0) s_fail("short buffer got other ids", d, n);
    for (int i = 0; i < cnt; i++) if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) s_fail("id out of range", d, n);
    int skip = add_bos && tokenizer_bos(t) >= 0 ? 1 : 0;
    size_t dl;
    char *txt = tokenizer_decode_len(t, ids + skip, cnt - skip, parse_special, &dl);
    if (!txt) s_fail("decode failed", d, n);
    int check = !s_spm[v] || (!parse_special && !memmem(d, n, "\xE2\x96\x81", 3));
    if (check && (dl != n || memcmp(txt, d, n) != 0)) s_fail("decode(encode(x)) != x", d, n);
    free(txt);
    s_stream(t, ids, cnt, parse_special, (flags >> 4) & 1 ? 3 : 4096, d, n);
    free(ids);
}

static void s_mode_ids(const uint8_t *d, size_t n, uint8_t flags) {
    const zl_tokenizer *t = s_tok[s_pick(flags, n)];
    int k = (int)(n / 2);
    int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids);
    if (!ids) abort();
    for (int i = 0; i < k; i++) ids[i] = (int32_t)((d[2 * i] | d[2 * i + 1] << 8) * 7 % tokenizer_n_vocab(t));
    s_stream(t, ids, k, (flags >> 2) & 1, (flags >> 3) & 1 ? 2 : 4096, d, n);
    size_t dl;
    char *txt = tokenizer_decode_len(t, ids, k, (flags >> 2) & 1, &dl);
    if (!txt) s_fail("decode of valid ids failed", d, n);
    free(txt);
    free(ids);
}

static void s_mode_chat(const uint8_t *d, size_t n, uint8_t flags) {
    char *tmpl = malloc(n + 1);
    if (!tmpl) abort();
    memcpy(tmpl, d, n);
    tmpl[n] = 0;
    zl_chat_msg msgs[4] = {{.role = "system", .content = "S"},
                           {.role = "user", .content = " u1 "},
                           {.role = "assistant", .content = "a1"},
                           {.role = "user", .content = "u2\n"}};
    char err[256];
    int first = (flags >> 2) & 1;
    char *p = chat_apply_template(tmpl, "<s>", "</s>", msgs + first, 4 - first, (flags >> 3) & 1, err, sizeof err);
    if (!p && !err[0]) s_fail("chat refused without a message", d, n);
    free(p);
    free(tmpl);
}

/* ---- synthetic GGUF ---- */
typedef struct { uint8_t *p; size_t n, cap; } wbuf;
static void w_put(wbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 1024;
        while (c < b->n + n) c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p) abort();
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void w_u32(wbuf *b, uint32_t v) { w_put(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_put(b, &v, 8); }
static void w_str(wbuf *b, const void *s, size_t n) { w_u64(b, n); w_put(b, s, n); }
static void w_key(wbuf *b, const char *k, uint32_t type) { w_str(b, k, strlen(k)); w_u32(b, type); }

static void s_mode_vocab(const uint8_t *d, size_t n, uint8_t flags) {
    /* tokens: the input split at '\n' (at most 300) */
    const uint8_t *tok[300];
    size_t len[300];
    int nt = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n && nt < 300; i++)
        if (i == n || d[i] == '\n') { tok[nt] = d + start; len[nt] = i - start; nt++; start = i + 1; }
    static const char *pres[8] = {"llama-bpe", "qwen2",       "smollm", "gpt-2",
                                  "default",   "unknown-pre", "tekken", "gpt-4o"};
    int bpe = flags & 4;
    wbuf b = {0};
    w_put(&b, "GGUF", 4); w_u32(&b, 3); w_u64(&b, 0);
    w_u64(&b, 7);
    w_key(&b, "general.architecture", GGUF_T_STRING);
    w_str(&b, flags & 2 ? "gemma3" : "llama", flags & 2 ? 6 : 5);
    w_key(&b, "tokenizer.ggml.model", GGUF_T_STRING);
    w_str(&b, bpe ? "gpt2" : "llama", bpe ? 4 : 5);
    w_key(&b, "tokenizer.ggml.pre", GGUF_T_STRING);
    const char *pre = pres[((flags >> 3) & 3) | ((flags >> 5) & 4)]; /* flag bits 3, 4 and 7 */
    w_str(&b, pre, strlen(pre));
    w_key(&b, "tokenizer.ggml.tokens", GGUF_T_ARRAY); w_u32(&b, GGUF_T_STRING); w_u64(&b, (uint64_t)nt);
    for (int i = 0; i < nt; i++) w_str(&b, tok[i], len[i]);
    w_key(&b, "tokenizer.ggml.token_type", GGUF_T_ARRAY); w_u32(&b, GGUF_T_INT32); w_u64(&b, (uint64_t)nt);
    for (int i = 0; i < nt; i++) { int32_t ty = len[i] ? tok[i][0] % 8 : 1; w_put(&b, &ty, 4); }
    w_key(&b, "tokenizer.ggml.scores", GGUF_T_ARRAY); w_u32(&b, GGUF_T_FLOAT32); w_u64(&b, (uint64_t)nt);
    for (int i = 0; i < nt; i++) { float sc = len[i] ? -(float)tok[i][len[i] - 1] : 0; w_put(&b, &sc, 4); }
    w_key(&b, "tokenizer.ggml.merges", GGUF_T_ARRAY); w_u32(&b, GGUF_T_STRING); w_u64(&b, (uint64_t)(nt > 1 ? nt - 1 : 0));
    for (int i = 0; i + 1 < nt; i++) {
        uint64_t ml = len[i] + 1 + len[i + 1];
        w_u64(&b, ml); w_put(&b, tok[i], len[i]); w_put(&b, " ", 1); w_put(&b, tok[i + 1], len[i + 1]);
    }
    while (b.n % 32) w_put(&b, "", 1);
    char err[256];
    gguf *g = gguf_open_mem(b.p, b.n, "synthetic.gguf", err, sizeof err);
    if (g) {
        zl_tokenizer *t = tokenizer_new(g, err, sizeof err);
        gguf_close(&g);
        if (t) {
            int32_t ids[512];
            int c = tokenizer_encode(t, (const char *)d, n, 1, flags & 1, ids, 512);
            if (c < 0) s_fail("synthetic vocab: encode failed", d, n);
            if (c > 512) c = 512;
            for (int i = 0; i < c; i++) if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) s_fail("synthetic vocab: id out of range", d, n);
            char *txt = tokenizer_decode(t, ids, c, 1);
            if (!txt) s_fail("synthetic vocab: decode failed", d, n);
            free(txt);
            s_stream(t, ids, c, 1, 4096, d, n);
            tokenizer_destroy(&t);
        } else if (!err[0]) s_fail("synthetic vocab refused without a message", d, n);
    }
    free(b.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    s_load();
    if (size == 0) return 0;
    if (size > 1 << 14) size = 1 << 14;   /* keep each run fast */
    uint8_t flags = data[0];
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch ((flags >> 5) & 3) {
    case 0: s_mode_encode(d, n, flags); break;
    case 1: s_mode_ids(d, n, flags); break;
    case 2: s_mode_chat(d, n, flags); break;
    default: s_mode_vocab(d, n, flags); break;
    }
    if (flags >> 7) s_mode_encode(d, n, (uint8_t)(flags ^ 0x5)); /* a second pass on another vocabulary */
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
#define SEED(x) {x, sizeof(x) - 1}
    static const struct {
        const char *p;
        size_t n;
    } s[] = {
        SEED("\x00Hello world! How's it going? 123456 \xF0\x9F\xA6\x99 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD"),
        SEED("\x01 \xE2\x96\x81 \t\n\r\n  spaces   and\ttabs\n\n\n"),
        SEED("\x05<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"),
        SEED("\x06<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n[PAD151700]"),
        SEED("\x04<s>[INST] hello [/INST] hi </s>"),
        SEED("\x02\xff\xfe\xc0\x80\xed\xa0\x80\xf4\x90\x80\x80 invalid \xe2\x82 utf8 \xf0\x9f\xa6"),
        SEED("\x20\x01\x00\x02\x00\x03\x00\xa0\x01\xff\xff\x10\x27\x99\x00"),
        SEED("\x21\xe3\x00\xe4\x00\xe5\x00\x77\x01"),
        SEED("\x40{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>' + '\\n'}}{% endfor %}"),
        SEED("\x44{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nDefault<|im_end|>\\n' }}{% endif "
             "%}<|im_start|>"),
        SEED("\x48<|start_header_id|><|end_header_id|> bos_token | trim"),
        SEED("\x40[INST] <<SYS>> bos_token + '[INST] ' .strip()"),
        SEED("\x60"
             "a\nb\nab\n \n a\n<0x41>\n<s>\nc\n\xE2\x96\x81\nabc"),
        SEED("\x64h\ne\nl\no\nhe\nll\nhell\nhello\n\xc4\xa0\n\xc4\xa0h"),
        SEED("\x6c\n\n\n"),
        SEED("\x00"),
        /* even lengths: Gemma 3 (3), tekken (4), gpt-4o (5) */
        SEED("\x0f<start_of_turn>user\nHi   there\t\t\n\n\n<end_of_turn>\n<start_of_turn>model\n<table>x"),
        SEED("\x00 \xe2\x96\x81\xe2\x96\x81 <unused7>       <bos><0x41> <start_of_image>"),
        SEED("\x04[INST] CamelCaseHTTPServer don't 12345 \xc7\x85ungla [/INST]</s>"),
        SEED("\x05I'M you'RE 'S 1234567 ____ \xc5\xbf path/to/\n\n"),
        SEED("\x21\x00\x10\x69\x00\x6a\x00\xff\xff\x00\x01"),
        SEED("\x62  \n   \n    \n\xe2\x96\x81\n\xe2\x96\x81\xe2\x96\x81\na\n b \n"),
        SEED("\xf4h\ne\nhe\nH\nHe\n1\n12\n'\n's\nHello"),
        SEED("\xfch\ne\nhe\nH\nHe\n1\n12\n'\n's\nI's"),
    };
    int n = (int)(sizeof s / sizeof s[0]);
    if (n > max) n = max;
    for (int i = 0; i < n; i++) {
        seeds[i] = (const uint8_t *)s[i].p;
        sizes[i] = s[i].n;
    }
    /* a synthetic vocabulary of one user-defined token (its first byte % 8 == 4) of 3,000 bytes of invalid UTF-8,
     * which the encode matches whole: its streamed text is 9,000 bytes of U+FFFD, more than any fixed buffer the
     * decode's callers used to pass (tokenizer_stream_cap sizes it) */
    static uint8_t long_token[3001];
    long_token[0] = 0x60;
    memset(long_token + 1, 0x8c, sizeof long_token - 1);
    if (n < max) {
        seeds[n] = long_token;
        sizes[n] = sizeof long_token;
        n++;
    }
    return n;
}
