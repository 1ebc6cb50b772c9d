/* common/tokenizer.c: text <-> token ids from the GGUF's tokenizer.ggml.* metadata.
 *
 * Two models, as llama.cpp implements them (its test vectors are our oracle):
 *  - "llama" (SentencePiece-style, SPM): the text (with a leading space when add_space_prefix, spaces escaped as
 *    U+2581) starts as one symbol per UTF-8 character; adjacent pairs whose concatenation is a vocabulary piece are
 *    merged, highest score first (ties: leftmost first); a final symbol that is not a piece becomes its bytes as
 *    <0xNN> byte tokens (or UNK when the vocabulary has none). Gemma's files (general.architecture gemma*) are
 *    read as transformers reads them: merge order is file order, and the pieces of 2+ spaces are ordinary pieces
 *    of U+2581 (s_gemma_spaces).
 *  - "gpt2" (byte-level BPE): the pre-tokenizer regexes named by tokenizer.ggml.pre (PCRE2, UTF + UCP, JIT)
 *    split the text into words (unmatched stretches are words too); each word starts as one symbol per byte (the
 *    GPT-2 byte-to-unicode token of that byte) and pairs are merged by rank from tokenizer.ggml.merges, lowest rank
 *    first (ties: leftmost). Llama 3 ("ignore_merges") first looks the whole word up in the vocabulary.
 *    Invalid UTF-8 never matches a regex, so it forms words of its own and is encoded byte-wise: decode(encode(x))
 *    gives back x for any bytes.
 * Special tokens (control, user-defined, unknown) written in the text are cut out first, scanning left to right
 * and taking the longest at each position; control/unknown ones only when parse_special is set (user-defined ones
 * always, as llama.cpp does).
 *
 * Deliberate differences and known exceptions:
 *  - SPM: U+2581 written in the input is the escaped space, so it decodes as ' ' (llama.cpp and SentencePiece
 *    do the same); everything else round-trips, invalid UTF-8 included (an invalid byte is a symbol of its own and
 *    falls back to its <0xNN> token; llama.cpp lets an invalid lead byte swallow the next bytes, which can only
 *    differ on invalid UTF-8).
 *  - Special tokens are found leftmost-longest; llama.cpp cuts them longest-token-first over the whole text. The
 *    two differ only when two special tokens overlap in the text.
 *  - EOS is appended (when the file's add_eos flag is set) only together with a requested BOS ("add special").
 *  - Decoding never applies clean_up_tokenization_spaces, so decode(encode(x)) == x.
 *
 * Speed: token texts live in one arena; piece -> id and (left id, right id) -> (rank, merged id) are open-addressing
 * hash maps built once; encoding reuses one scratch area (symbols, heap, regex match data, a word -> ids cache)
 * guarded by a mutex, so the hot path does no allocation once warmed up. */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* token types, as numbered by llama.cpp / GGUF */
enum { TT_UNDEF = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };
enum { MODEL_SPM = 1, MODEL_BPE = 2 };
#define MAX_RE 4
#define CACHE_SLOTS (1u << 15)          /* word cache slots (power of two) */
#define CACHE_ARENA (4u << 20)          /* word cache bytes before it is cleared */
#define CACHE_MAX_WORD 64               /* longest word (bytes) that is cached */

typedef struct {                 /* one slot of the piece -> id map (16 bytes: one cache miss per probe) */
    uint32_t hash;               /* low 32 bits of the key hash */
    int32_t id;                  /* token id, -1 = empty slot */
    uint32_t off, len;           /* the key's bytes in the arena (copies of key_off/key_len[id]) */
} vslot;

typedef struct {                 /* one slot of the merge map */
    uint64_t key;                /* (left id << 32) | right id, UINT64_MAX = empty */
    int32_t rank;                /* line number in tokenizer.ggml.merges (lower merges first) */
    int32_t id;                  /* id of the merged piece */
} mslot;

typedef struct {                 /* one symbol while merging */
    int32_t start;               /* byte offset in the word */
    int32_t len;                 /* bytes, 0 once merged into its left neighbour */
    int32_t id;                  /* BPE: token id of the symbol */
    int32_t prev, next;          /* neighbours, -1 at the ends */
} sym;

typedef struct {                 /* one candidate merge in the heap */
    float key;                   /* SPM: score (higher first); BPE: rank (lower first, stored negated) */
    int32_t left, right;         /* symbol indices */
    int32_t len;                 /* bytes of the merged text (validity check) */
    int32_t id;                  /* merged token id */
} bigram;

typedef struct {   /* one edge of the special-token trie */
    uint64_t key;  /* (parent node << 8 | byte) + 1, 0 = empty */
    int32_t child; /* the node it leads to */
} tslot;

typedef struct {                 /* one word cache slot */
    uint64_t hash;               /* key hash, 0 = empty */
    uint32_t off;                /* arena offset: key bytes, then ids (int32, aligned) */
    uint16_t klen;               /* key bytes */
    uint16_t nids;               /* ids */
} cslot;

typedef struct {                 /* piece of text being pre-tokenized */
    uint32_t off, len;           /* bytes in the fragment */
} span;

typedef struct scratch {         /* per-encode working memory, reused between calls */
    sym *syms; size_t syms_cap;              /* [syms_cap] */
    bigram *heap; size_t heap_n, heap_cap;   /* binary heap */
    span *sp[2]; size_t sp_cap[2];           /* ping-pong span lists for multi-regex splitting */
    char *buf; size_t buf_cap;               /* SPM escaped text */
    int32_t *ids; size_t ids_cap;            /* ids of one word */
    pcre2_match_data *md;                    /* regex match data */
    pcre2_match_context *mctx;               /* match context carrying the JIT stack */
    pcre2_jit_stack *jstack;                 /* JIT stack (1 MiB max) */
    cslot *cache;                            /* [CACHE_SLOTS] word -> ids, BPE only */
    unsigned char *carena; uint32_t cused;   /* [CACHE_ARENA] cache storage, bytes used */
} scratch;

struct zl_tokenizer {
    int model;                   /* MODEL_SPM / MODEL_BPE */
    int n_vocab;                 /* token count */
    char *arena;                 /* all key and decode texts */
    uint32_t *key_off, *key_len; /* [n_vocab] text used to look pieces up (BPE: raw bytes; SPM: as written) */
    uint32_t *dec_off, *dec_len; /* [n_vocab] bytes a token decodes to (SPM: U+2581 -> space, <0xNN> -> byte) */
    uint32_t dec_max;            /* the longest dec_len (tokenizer_stream_cap) */
    float *scores;               /* [n_vocab] SPM scores (0 when absent) */
    uint8_t *ttype;              /* [n_vocab] token type (TT_*) */
    uint8_t *eog;                /* [n_vocab] 1 = ends generation */
    vslot *vmap; uint32_t vmask; /* piece -> id map, mask = slots - 1 */
    mslot *mmap; uint32_t mmask; /* merge map (BPE), mask = slots - 1 */
    int32_t byte_id[256];        /* token of a raw byte (BPE byte char / SPM <0xNN>), -1 when none */
    int32_t *spec;               /* ids of special tokens, by first byte then length descending */
    int n_spec;                  /* count of spec */
    int32_t spec_first[257];     /* spec[spec_first[b] .. spec_first[b+1]) start with byte b */
    int n_user;                  /* user-defined specials (matched even without parse_special) */
    /* the specials' texts as a byte trie (node 0 the root), so that the longest special at a position costs one
     * probe per byte it matches rather than a comparison with every special sharing its first byte */
    tslot *stab;
    uint32_t stmask;             /* edges, open addressing, mask = slots - 1 */
    int32_t *st_any, *st_user;   /* [nodes] the lowest id of a special (of a user-defined one) ending there, or -1 */
    pcre2_code *re[MAX_RE];      /* pre-tokenizer regexes, applied in order */
    int re_jit[MAX_RE];          /* 1 when re[i] was JIT-compiled (then pcre2_jit_match, which skips checks) */
    int n_re;                    /* count of re */
    int ignore_merges;           /* Llama 3: a word that is a whole token is taken as is */
    int add_space_prefix;        /* SPM: prepend a space to text after start/special */
    int bos, eos, eot, eom, pad, unk; /* special ids, -1 when none */
    int add_bos, add_eos;        /* flags from the file (defaults by model) */
    char *chat_template;         /* tokenizer.chat_template, or NULL */
    char *pre;                   /* tokenizer.ggml.pre, or "default" */
    pthread_mutex_t lock;        /* guards sc */
    scratch sc;                  /* scratch of the thread holding lock */
};

/* ------------------------------------------------------------------------------------------------ helpers */

static void s_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static inline uint64_t s_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w; memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull; h ^= h >> 31;
        s += 8; n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ w) * 0x94d049bb133111ebull; h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 32;
    return h ? h : 1;
}

static inline uint64_t s_hash64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static inline const char *s_key(const zl_tokenizer *t, int id) { return t->arena + t->key_off[id]; }

/* id of the piece text[n], or -1 */
static int32_t s_lookup(const zl_tokenizer *t, const char *text, size_t n) {
    uint64_t h = s_hash(text, n);
    uint32_t h32 = (uint32_t)h;
    for (uint32_t i = (uint32_t)(h >> 32) & t->vmask;; i = (i + 1) & t->vmask) {
        const vslot *s = &t->vmap[i];
        if (s->id < 0) return -1;
        if (s->hash == h32 && s->len == n && memcmp(t->arena + s->off, text, n) == 0) return s->id;
    }
}

/* rank and merged id of the pair (a, b); returns 0 when there is no such merge */
static inline int s_merge_find(const zl_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = (uint32_t)s_hash64(key) & t->mmask;; i = (i + 1) & t->mmask) {
        const mslot *s = &t->mmap[i];
        if (s->key == UINT64_MAX) return 0;
        if (s->key == key) { *rank = s->rank; *id = s->id; return 1; }
    }
}

/* bytes of the UTF-8 character starting with byte c (1 for stray continuation / invalid bytes) */
static inline int s_utf8_len(unsigned char c) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}

static int s_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q; *cap = n;
    return 0;
}

/* GPT-2 byte <-> unicode mapping: printable bytes map to themselves, the others to U+0100 + k in byte order */
static void s_byte_unicode(int cp_of_byte[256], int byte_of_cp[324]) {
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp_of_byte[b] = printable ? b : 256 + k++;
        byte_of_cp[cp_of_byte[b]] = b;
    }
}

/* decodes one UTF-8 character at s[n]; returns its length (>= 1) and the code point in *cp, -1 when invalid */
static int s_utf8_dec(const unsigned char *s, size_t n, int32_t *cp) {
    unsigned char c = s[0];
    int L = s_utf8_len(c);
    if (c < 0x80) { *cp = c; return 1; }
    if (L == 1 || (size_t)L > n || c >= 0xF8) { *cp = -1; return 1; }
    int32_t v = c & (0x7F >> L);
    for (int i = 1; i < L; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = -1; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const int32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < minv[L] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = -1; return 1; }
    *cp = v;
    return L;
}

/* ------------------------------------------------------------------------------------------------ loading */

typedef struct { const char *name; const char *re[MAX_RE]; int ignore_merges; int add_bos; } pre_def;

/* pre-tokenizer regexes for each tokenizer.ggml.pre: llama.cpp's list (llama-vocab.cpp), with tekken's and
 * gpt-4o's as their tokenizer.json / tiktoken write them (PCRE2 has the \p{Lu}... classes that llama.cpp's own
 * regex engine lacks and rewrites). The flags follow llama.cpp's: ignore_merges (a word that is a whole token is
 * taken as is) and the add-BOS default for files without tokenizer.ggml.add_bos_token. */
#define RE_LLAMA3                                                                                                      \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"                         \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define RE_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
static const pre_def s_pres[] = {
    {"llama-bpe", {RE_LLAMA3}, 1, 1},
    {"dbrx", {RE_LLAMA3}, 0, 0}, /* Phi-4 (cl100k), DBRX, Smaug: Llama 3's split without its flags */
    {"qwen2",
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0,
     0},
    {"smollm", {"\\p{N}", RE_GPT2}, 0, 0},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*|"
      "\\p{N}" RE_TAIL},
     1,
     1},
    {"gpt-4o",
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTR "|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER
      "*" RE_CONTR "|\\p{N}{1,3}" RE_TAIL},
     0,
     0},
    {"gpt-2", {RE_GPT2}, 0, 0},
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0},
};

/* the names s_pres knows, for the error naming an unknown one */
#define PRE_NAMES                                                                                                      \
    "llama-bpe (llama3, llama-v3, pixtral, falcon3), dbrx (smaug-bpe), qwen2 (deepseek-r1-qwen), "                     \
    "smollm (starcoder, refact), tekken, gpt-4o (llama4), gpt-2 (phi-2, mpt, olmo), default"

static const pre_def *s_pre_find(const char *name) {
    static const struct {
        const char *alias, *name;
    } alias[] = {
        {"llama3", "llama-bpe"}, {"llama-v3", "llama-bpe"}, {"pixtral", "llama-bpe"}, {"falcon3", "llama-bpe"},
        {"smaug-bpe", "dbrx"},   {"starcoder", "smollm"},   {"refact", "smollm"},     {"gpt2", "gpt-2"},
        {"phi-2", "gpt-2"},      {"mpt", "gpt-2"},          {"olmo", "gpt-2"},        {"deepseek-r1-qwen", "qwen2"},
        {"llama4", "gpt-4o"},
    };
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcmp(name, alias[i].alias) == 0) name = alias[i].name;
    for (size_t i = 0; i < sizeof s_pres / sizeof s_pres[0]; i++)
        if (strcmp(name, s_pres[i].name) == 0) return &s_pres[i];
    return NULL;
}

static int s_vmap_build(zl_tokenizer *t, char *err, size_t errlen) {
    uint32_t cap = 1024;
    while (cap < (uint32_t)t->n_vocab * 2u) cap <<= 1;
    t->vmap = malloc(cap * sizeof *t->vmap);
    if (!t->vmap) { s_err(err, errlen, "tokenizer: out of memory"); return -1; }
    for (uint32_t i = 0; i < cap; i++) t->vmap[i].id = -1;
    t->vmask = cap - 1;
    for (int id = 0; id < t->n_vocab; id++) {
        uint64_t h = s_hash(s_key(t, id), t->key_len[id]);
        uint32_t i = (uint32_t)(h >> 32) & t->vmask;
        for (;; i = (i + 1) & t->vmask) {
            vslot *s = &t->vmap[i];
            if (s->id < 0) { *s = (vslot){(uint32_t)h, id, t->key_off[id], t->key_len[id]}; break; }
            /* a duplicate piece: the later id wins, as in llama.cpp's map */
            if (s->hash == (uint32_t)h && s->len == t->key_len[id] &&
                memcmp(t->arena + s->off, s_key(t, id), t->key_len[id]) == 0) { s->id = id; break; }
        }
    }
    return 0;
}

static int s_merges_build(zl_tokenizer *t, const gguf *g, const gguf_value *mv, const int cp_of_byte[256],
                          const int byte_of_cp[324], char *err, size_t errlen) {
    (void)cp_of_byte;
    uint64_t n = mv->v.arr.n;
    uint32_t cap = 1024;
    while (cap < n * 2) cap <<= 1;
    t->mmap = malloc((size_t)cap * sizeof *t->mmap);
    char *tmp = malloc(4096);
    if (!t->mmap || !tmp) { free(tmp); s_err(err, errlen, "tokenizer: out of memory"); return -1; }
    for (uint32_t i = 0; i < cap; i++) t->mmap[i].key = UINT64_MAX;
    t->mmask = cap - 1;
    for (uint64_t r = 0; r < n; r++) {
        gguf_str s;
        if (gguf_arr_str(g, mv, r, &s) != 0) { free(tmp); s_err(err, errlen, "tokenizer: bad merge %llu", (unsigned long long)r); return -1; }
        /* split at the first space after the first byte; both halves are byte-encoded: decode to raw bytes */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) continue;
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1, n2 = 0;
        if (la + lb > 2048) continue;
        int32_t ids[2] = {-1, -1};
        for (int half = 0; half < 2; half++) {
            const unsigned char *p = (const unsigned char *)(half ? sp + 1 : s.ptr);
            size_t len = half ? lb : la, start = n2;
            for (size_t i = 0; i < len;) {
                int32_t cp; int L = s_utf8_dec(p + i, len - i, &cp);
                if (cp >= 0 && cp < 324 && byte_of_cp[cp] >= 0) tmp[n2++] = (char)byte_of_cp[cp];
                else { memcpy(tmp + n2, p + i, (size_t)L); n2 += (size_t)L; }
                i += (size_t)L;
            }
            ids[half] = s_lookup(t, tmp + start, n2 - start);
        }
        int32_t mid = s_lookup(t, tmp, n2);
        if (ids[0] < 0 || ids[1] < 0 || mid < 0) continue;   /* a merge into a non-token: never useful */
        uint64_t key = ((uint64_t)(uint32_t)ids[0] << 32) | (uint32_t)ids[1];
        for (uint32_t i = (uint32_t)s_hash64(key) & t->mmask;; i = (i + 1) & t->mmask) {
            mslot *m = &t->mmap[i];
            if (m->key == key) break;                       /* first (lowest) rank wins */
            if (m->key == UINT64_MAX) { m->key = key; m->rank = (int32_t)r; m->id = mid; break; }
        }
    }
    free(tmp);
    return 0;
}

static const zl_tokenizer *s_sort_t;
static int s_spec_cmp(const void *a, const void *b) {
    int x = *(const int32_t *)a, y = *(const int32_t *)b;
    unsigned char cx = (unsigned char)s_sort_t->arena[s_sort_t->key_off[x]];
    unsigned char cy = (unsigned char)s_sort_t->arena[s_sort_t->key_off[y]];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (s_sort_t->key_len[x] != s_sort_t->key_len[y]) return s_sort_t->key_len[x] > s_sort_t->key_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int s_specials_build(zl_tokenizer *t) {
    static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
    int n = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        int ty = t->ttype[id];
        if ((ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) && t->key_len[id] > 0) n++;
    }
    t->spec = malloc((size_t)(n ? n : 1) * sizeof *t->spec);
    if (!t->spec) return -1;
    n = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        int ty = t->ttype[id];
        if ((ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) && t->key_len[id] > 0) {
            t->spec[n++] = id;
            if (ty == TT_USER) t->n_user++;
        }
    }
    t->n_spec = n;
    pthread_mutex_lock(&sort_lock);
    s_sort_t = t;
    qsort(t->spec, (size_t)n, sizeof *t->spec, s_spec_cmp);
    s_sort_t = NULL;
    pthread_mutex_unlock(&sort_lock);
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < n && (unsigned char)t->arena[t->key_off[t->spec[j]]] < b) j++;
        t->spec_first[b] = j;
    }
    /* the trie: at most one node per byte of the specials' texts, plus the root */
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += t->key_len[t->spec[k]];
    if (bytes >= (size_t)INT32_MAX / 4) return -1;
    uint32_t slots = 16;
    while (slots < 2 * bytes + 2) slots *= 2;
    t->stab = calloc(slots, sizeof *t->stab);
    t->st_any = malloc((bytes + 1) * sizeof *t->st_any);
    t->st_user = malloc((bytes + 1) * sizeof *t->st_user);
    if (!t->stab || !t->st_any || !t->st_user) return -1;
    t->stmask = slots - 1;
    t->st_any[0] = t->st_user[0] = -1;
    int32_t nodes = 1;
    for (int k = 0; k < n; k++) {
        int32_t id = t->spec[k], node = 0;
        const unsigned char *p = (const unsigned char *)s_key(t, id);
        for (uint32_t b = 0; b < t->key_len[id]; b++) {
            uint64_t key = ((uint64_t)(uint32_t)node << 8 | p[b]) + 1;
            uint32_t i = (uint32_t)s_hash64(key) & t->stmask;
            while (t->stab[i].key && t->stab[i].key != key) i = (i + 1) & t->stmask;
            if (!t->stab[i].key) {
                t->stab[i] = (tslot){key, nodes};
                t->st_any[nodes] = t->st_user[nodes] = -1;
                nodes++;
            }
            node = t->stab[i].child;
        }
        if (t->st_any[node] < 0 || id < t->st_any[node]) t->st_any[node] = id;
        if (t->ttype[id] == TT_USER && (t->st_user[node] < 0 || id < t->st_user[node])) t->st_user[node] = id;
    }
    return 0;
}

/* Gemma's files store its pieces of two or more spaces as real spaces, typed user-defined; SentencePiece (and
 * transformers, which loads these files by architecture) treats them as ordinary pieces of U+2581 that are
 * merged like any other, so "  " in the text is never cut out whole. Gemma's merge order is also the order of
 * the pieces in the file (its scores follow it for every ordinary piece; these runs carry -1000): for gemma*
 * architectures the score of a piece is minus its id. */
static int s_gemma_spaces(const unsigned char *p, size_t len) {
    if (len < 2) return 0;
    for (size_t i = 0; i < len; i++)
        if (p[i] != ' ') return 0;
    return 1;
}

static int s_get_id(const gguf *g, const char *key, int n_vocab) {
    int64_t v = gguf_get_int(g, key, -1);
    return (v >= 0 && v < n_vocab) ? (int)v : -1;
}

zl_tokenizer *tokenizer_new(const gguf *g, char *err, size_t errlen) {
    zl_tokenizer *t = NULL;
    char *model = NULL, *arch = NULL;
    if (!g) { s_err(err, errlen, "tokenizer: no gguf"); return NULL; }
    model = gguf_get_cstr(g, "tokenizer.ggml.model");
    if (!model) { s_err(err, errlen, "%s: no tokenizer.ggml.model", g->path ? g->path : "gguf"); return NULL; }
    t = calloc(1, sizeof *t);
    if (!t) { s_err(err, errlen, "tokenizer: out of memory"); goto fail; }
    pthread_mutex_init(&t->lock, NULL);
    arch = gguf_get_cstr(g, "general.architecture");
    if (strcmp(model, "llama") == 0) t->model = MODEL_SPM;
    else if (strcmp(model, "gpt2") == 0) t->model = MODEL_BPE;
    else { s_err(err, errlen, "%s: unsupported tokenizer model '%s' (llama, gpt2)", g->path ? g->path : "gguf", model); goto fail; }

    const gguf_value *tv = gguf_get(g, "tokenizer.ggml.tokens");
    if (!tv || tv->type != GGUF_T_ARRAY || tv->v.arr.elem != GGUF_T_STRING || tv->v.arr.n == 0 || tv->v.arr.n > (1u << 24)) {
        s_err(err, errlen, "%s: tokenizer.ggml.tokens missing or not an array of strings", g->path ? g->path : "gguf");
        goto fail;
    }
    int n = t->n_vocab = (int)tv->v.arr.n;
    /* Gemma's SentencePiece files (see s_gemma_spaces) */
    int gemma = t->model == MODEL_SPM && arch && strncmp(arch, "gemma", 5) == 0;
    const gguf_value *sv = gguf_get(g, "tokenizer.ggml.scores");
    const gguf_value *ttv = gguf_get(g, "tokenizer.ggml.token_type");
    if (sv && (sv->type != GGUF_T_ARRAY || sv->v.arr.n != (uint64_t)n)) sv = NULL;
    if (ttv && (ttv->type != GGUF_T_ARRAY || ttv->v.arr.n != (uint64_t)n)) ttv = NULL;

    t->key_off = malloc((size_t)n * sizeof(uint32_t)); t->key_len = malloc((size_t)n * sizeof(uint32_t));
    t->dec_off = malloc((size_t)n * sizeof(uint32_t)); t->dec_len = malloc((size_t)n * sizeof(uint32_t));
    t->scores = calloc((size_t)n, sizeof(float)); t->ttype = malloc((size_t)n); t->eog = calloc((size_t)n, 1);
    if (!t->key_off || !t->key_len || !t->dec_off || !t->dec_len || !t->scores || !t->ttype || !t->eog) {
        s_err(err, errlen, "tokenizer: out of memory"); goto fail;
    }
    /* arena: key text + decode text of each token; both at most the written length */
    uint64_t total = 0;
    for (int id = 0; id < n; id++) {
        gguf_str s;
        if (gguf_arr_str(g, tv, (uint64_t)id, &s) != 0) { s_err(err, errlen, "tokenizer: bad token %d", id); goto fail; }
        /* key and decode text, each at most the written length; a Gemma space run's key is U+2581 (3 bytes) per space */
        total += (gemma && s_gemma_spaces((const unsigned char *)s.ptr, s.len) ? 4 : 2) * s.len + 2;
    }
    if (total > UINT32_MAX) { s_err(err, errlen, "tokenizer: vocabulary text too large"); goto fail; }
    t->arena = malloc(total ? total : 1);
    if (!t->arena) { s_err(err, errlen, "tokenizer: out of memory"); goto fail; }
    int cp_of_byte[256], byte_of_cp[324];
    s_byte_unicode(cp_of_byte, byte_of_cp);
    uint32_t pos = 0;
    for (int id = 0; id < n; id++) {
        gguf_str s;
        gguf_arr_str(g, tv, (uint64_t)id, &s);
        int64_t ty = TT_NORMAL;
        if (ttv && gguf_arr_i64(ttv, (uint64_t)id, &ty) != 0) ty = TT_NORMAL;
        if (ty < 0 || ty > TT_BYTE) ty = TT_NORMAL;
        t->ttype[id] = (uint8_t)ty;
        float sc = 0;
        if (sv && gguf_arr_f32(sv, (uint64_t)id, &sc) == 0) t->scores[id] = sc;
        const unsigned char *p = (const unsigned char *)s.ptr;
        size_t len = s.len;
        char *key = t->arena + pos;
        size_t kl = 0;
        if (gemma) {
            t->scores[id] = -(float)id;
            if (ty == TT_USER && s_gemma_spaces(p, len)) ty = TT_NORMAL;
            t->ttype[id] = (uint8_t)ty;
        }
        if (gemma && ty == TT_NORMAL && s_gemma_spaces(p, len)) {
            for (size_t i = 0; i < len; i++) {
                memcpy(key + kl, "\xe2\x96\x81", 3);
                kl += 3;
            }
        } else if (t->model == MODEL_BPE && (ty == TT_NORMAL || ty == TT_BYTE)) {
            for (size_t i = 0; i < len;) {   /* byte-encoded text -> raw bytes */
                int32_t cp; int L = s_utf8_dec(p + i, len - i, &cp);
                if (cp >= 0 && cp < 324 && byte_of_cp[cp] >= 0) key[kl++] = (char)byte_of_cp[cp];
                else { memcpy(key + kl, p + i, (size_t)L); kl += (size_t)L; }
                i += (size_t)L;
            }
        } else {
            memcpy(key, p, len); kl = len;
        }
        t->key_off[id] = pos; t->key_len[id] = (uint32_t)kl;
        pos += (uint32_t)kl;
        char *dec = t->arena + pos;
        size_t dl = 0;
        if (t->model == MODEL_BPE) {
            memcpy(dec, key, kl); dl = kl;
        } else if (ty == TT_BYTE) {
            unsigned v;
            if (len == 6 && sscanf((const char *)p, "<0x%2x>", &v) == 1) dec[dl++] = (char)v;
            else { memcpy(dec, p, len); dl = len; }
        } else if (ty == TT_NORMAL && kl != len) { /* a Gemma space run: it decodes as written */
            memcpy(dec, p, len);
            dl = len;
        } else if (ty == TT_NORMAL) {
            for (size_t i = 0; i < len;) {   /* U+2581 -> space */
                if (i + 3 <= len && p[i] == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) { dec[dl++] = ' '; i += 3; }
                else dec[dl++] = (char)p[i++];
            }
        } else {
            memcpy(dec, p, len); dl = len;
        }
        t->dec_off[id] = pos; t->dec_len[id] = (uint32_t)dl;
        if (t->dec_len[id] > t->dec_max) t->dec_max = t->dec_len[id];
        pos += (uint32_t)dl;
    }
    if (s_vmap_build(t, err, errlen) != 0) goto fail;

    /* byte tokens */
    for (int b = 0; b < 256; b++) {
        if (t->model == MODEL_BPE) {
            char c = (char)b;
            t->byte_id[b] = s_lookup(t, &c, 1);
        } else {
            char buf[8];
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_id[b] = s_lookup(t, buf, 6);
            if (t->byte_id[b] < 0) { char c = (char)b; t->byte_id[b] = s_lookup(t, &c, 1); }
        }
    }

    /* special ids and flags */
    t->bos = s_get_id(g, "tokenizer.ggml.bos_token_id", n);
    t->eos = s_get_id(g, "tokenizer.ggml.eos_token_id", n);
    t->eot = s_get_id(g, "tokenizer.ggml.eot_token_id", n);
    t->eom = s_get_id(g, "tokenizer.ggml.eom_token_id", n);
    t->pad = s_get_id(g, "tokenizer.ggml.padding_token_id", n);
    t->unk = s_get_id(g, "tokenizer.ggml.unknown_token_id", n);
    char *pre = gguf_get_cstr(g, "tokenizer.ggml.pre");
    t->pre = pre ? pre : strdup("default");
    if (!t->pre) { s_err(err, errlen, "tokenizer: out of memory"); goto fail; }
    const pre_def *pd = NULL;
    if (t->model == MODEL_BPE) {
        pd = s_pre_find(t->pre);
        if (!pd) {
            s_err(err, errlen, "%s: unsupported pre-tokenizer tokenizer.ggml.pre = '%s' (supported: " PRE_NAMES ")",
                  g->path ? g->path : "gguf", t->pre);
            goto fail;
        }
        t->ignore_merges = pd->ignore_merges;
    }
    t->add_bos = (int)gguf_get_int(g, "tokenizer.ggml.add_bos_token", t->model == MODEL_SPM ? 1 : (pd ? pd->add_bos : 0));
    t->add_eos = (int)gguf_get_int(g, "tokenizer.ggml.add_eos_token", 0);
    /* SentencePiece prefixes a space unless the file says otherwise; Gemma's never does (its tokenizer has no
     * dummy prefix, and transformers ignores the key for gemma* files) */
    t->add_space_prefix = (int)gguf_get_int(g, "tokenizer.ggml.add_space_prefix", t->model == MODEL_SPM && !gemma);
    if (t->model == MODEL_SPM && t->unk < 0) t->unk = s_lookup(t, "<unk>", 5);
    t->chat_template = gguf_get_cstr(g, "tokenizer.chat_template");

    /* end-of-generation set: eos, eot, eom, and the well-known end-of-turn texts among special tokens */
    static const char *eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                      "<|end_of_text|>", "<|eom_id|>", "<EOT>", NULL};
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    for (int i = 0; eog_texts[i]; i++) {
        int32_t id = s_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && (t->ttype[id] == TT_CONTROL || t->ttype[id] == TT_USER)) t->eog[id] = 1;
    }
    if (t->eot < 0) {
        int32_t id = s_lookup(t, "<|eot_id|>", 10);
        if (id < 0) id = s_lookup(t, "<|im_end|>", 10);
        if (id >= 0 && t->ttype[id] == TT_CONTROL) t->eot = id;
    }

    if (s_specials_build(t) != 0) { s_err(err, errlen, "tokenizer: out of memory"); goto fail; }

    if (t->model == MODEL_BPE) {
        const gguf_value *mv = gguf_get(g, "tokenizer.ggml.merges");
        if (!mv || mv->type != GGUF_T_ARRAY || mv->v.arr.elem != GGUF_T_STRING) {
            s_err(err, errlen, "%s: BPE vocabulary without tokenizer.ggml.merges", g->path ? g->path : "gguf");
            goto fail;
        }
        if (s_merges_build(t, g, mv, cp_of_byte, byte_of_cp, err, errlen) != 0) goto fail;
        for (int i = 0; i < MAX_RE && pd->re[i]; i++) {
            int ec; PCRE2_SIZE eo;
            t->re[i] = pcre2_compile((PCRE2_SPTR)pd->re[i], PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
            if (!t->re[i]) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(ec, msg, sizeof msg);
                s_err(err, errlen, "tokenizer: pre-tokenizer regex %d: %s at %zu", i, (char *)msg, (size_t)eo);
                goto fail;
            }
            /* the interpreter is the fallback when JIT is unavailable */
            t->re_jit[i] = pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE) == 0;
            t->n_re = i + 1;
        }
    }
    free(model);
    free(arch);
    return t;
fail:
    free(model);
    free(arch);
    tokenizer_destroy(&t);
    return NULL;
}

static void s_scratch_free(scratch *s) {
    free(s->syms); free(s->heap); free(s->sp[0]); free(s->sp[1]); free(s->buf); free(s->ids);
    if (s->md) pcre2_match_data_free(s->md);
    if (s->mctx) pcre2_match_context_free(s->mctx);
    if (s->jstack) pcre2_jit_stack_free(s->jstack);
    free(s->cache); free(s->carena);
    memset(s, 0, sizeof *s);
}

void tokenizer_destroy(zl_tokenizer **tp) {
    if (!tp || !*tp) return;
    zl_tokenizer *t = *tp;
    free(t->arena); free(t->key_off); free(t->key_len); free(t->dec_off); free(t->dec_len);
    free(t->scores); free(t->ttype); free(t->eog); free(t->vmap); free(t->mmap); free(t->spec);
    free(t->stab);
    free(t->st_any);
    free(t->st_user);
    for (int i = 0; i < MAX_RE; i++) if (t->re[i]) pcre2_code_free(t->re[i]);
    free(t->chat_template); free(t->pre);
    s_scratch_free(&t->sc);
    pthread_mutex_destroy(&t->lock);
    free(t);
    *tp = NULL;
}

int tokenizer_n_vocab(const zl_tokenizer *t) { return t ? t->n_vocab : 0; }
int tokenizer_bos(const zl_tokenizer *t) { return t ? t->bos : -1; }
int tokenizer_eos(const zl_tokenizer *t) { return t ? t->eos : -1; }
int tokenizer_add_bos(const zl_tokenizer *t) { return t ? t->add_bos : 0; }
int tokenizer_is_eog(const zl_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

/* ------------------------------------------------------------------------------------------------ encoding */

typedef struct {                 /* output cursor of one encode call */
    int32_t *out;                /* caller's buffer */
    int max;                     /* its capacity */
    int n;                       /* ids produced so far (may exceed max) */
    int oom;                     /* set when scratch growth failed */
} emitter;

static inline void s_emit(emitter *e, int32_t id) {
    if (e->n < e->max) e->out[e->n] = id;
    e->n++;
}

/* heap ordered by (key descending, left ascending) */
static inline int s_heap_better(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static int s_heap_push(scratch *s, bigram b) {
    if (s_grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap) != 0) return -1;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_heap_better(&b, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
    return 0;
}

static bigram s_heap_pop(scratch *s) {
    bigram top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s_heap_better(&s->heap[c + 1], &s->heap[c])) c++;
        if (!s_heap_better(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* SPM: pushes the bigram (l, r) when their concatenation is a piece */
static int s_spm_try(const zl_tokenizer *t, scratch *s, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    int32_t len = s->syms[l].len + s->syms[r].len;
    int32_t id = s_lookup(t, text + s->syms[l].start, (size_t)len);
    if (id < 0) return 0;
    bigram b = {t->scores[id], l, r, len, id};
    return s_heap_push(s, b);
}

/* SPM encoding of text[n] (already escaped) */
static void s_spm_encode(const zl_tokenizer *t, scratch *s, const char *text, size_t n, emitter *e) {
    if (n == 0) return;
    if (s_grow((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms) != 0) { e->oom = 1; return; }
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        /* one symbol per UTF-8 character; an invalid byte is a symbol of its own (llama.cpp lets an invalid lead
         * byte swallow the next bytes, which can only differ on invalid UTF-8, and there it would turn a following
         * escaped space into raw bytes: ours round-trips) */
        int32_t cp;
        int L = s_utf8_dec((const unsigned char *)text + i, n - i, &cp);
        s->syms[ns] = (sym){(int32_t)i, L, -1, ns - 1, -1};
        if (ns > 0) s->syms[ns - 1].next = ns;
        ns++;
        i += (size_t)L;
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (s_spm_try(t, s, text, i - 1, i) != 0) { e->oom = 1; return; }
    while (s->heap_n) {
        bigram b = s_heap_pop(s);
        sym *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.len) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        if (s_spm_try(t, s, text, l->prev, b.left) != 0 || s_spm_try(t, s, text, b.left, l->next) != 0) { e->oom = 1; return; }
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        int32_t id = s_lookup(t, text + y->start, (size_t)y->len);
        if (id >= 0) { s_emit(e, id); continue; }
        for (int32_t k = 0; k < y->len; k++) {   /* byte fallback */
            int32_t bid = t->byte_id[(unsigned char)text[y->start + k]];
            if (bid < 0) bid = t->unk;
            if (bid >= 0) s_emit(e, bid);
        }
    }
}

/* BPE merging of one word w[n] (raw bytes) into s->ids; returns the count or -1 */
static int s_bpe_word(const zl_tokenizer *t, scratch *s, const unsigned char *w, size_t n) {
    if (s_grow((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms) != 0) return -1;
    if (s_grow((void **)&s->ids, &s->ids_cap, n, sizeof *s->ids) != 0) return -1;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) continue;   /* a vocabulary without this byte: llama.cpp drops it too */
        s->syms[ns] = (sym){(int32_t)i, 1, id, ns - 1, -1};
        if (ns > 0) s->syms[ns - 1].next = ns;
        ns++;
    }
    if (ns == 0) return 0;
    s->heap_n = 0;
    int32_t rank, mid;
    for (int32_t i = 1; i < ns; i++)
        if (s_merge_find(t, s->syms[i - 1].id, s->syms[i].id, &rank, &mid)) {
            bigram b = {-(float)rank, i - 1, i, 2, mid};
            if (s_heap_push(s, b) != 0) return -1;
        }
    while (s->heap_n) {
        bigram b = s_heap_pop(s);
        sym *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (l->len == 0 || r->len == 0 || l->next != b.right || l->len + r->len != b.len) continue;
        l->len += r->len;
        l->id = b.id;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        if (l->prev >= 0) {
            sym *p = &s->syms[l->prev];
            if (s_merge_find(t, p->id, l->id, &rank, &mid)) {
                bigram nb = {-(float)rank, l->prev, b.left, p->len + l->len, mid};
                if (s_heap_push(s, nb) != 0) return -1;
            }
        }
        if (l->next >= 0) {
            sym *q = &s->syms[l->next];
            if (s_merge_find(t, l->id, q->id, &rank, &mid)) {
                bigram nb = {-(float)rank, b.left, l->next, l->len + q->len, mid};
                if (s_heap_push(s, nb) != 0) return -1;
            }
        }
    }
    int k = 0;
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) s->ids[k++] = s->syms[i].id;
    return k;
}

static int s_cache_init(scratch *s) {
    if (s->cache) return 0;
    s->cache = calloc(CACHE_SLOTS, sizeof *s->cache);
    s->carena = malloc(CACHE_ARENA);
    if (!s->cache || !s->carena) { free(s->cache); free(s->carena); s->cache = NULL; s->carena = NULL; return -1; }
    s->cused = 0;
    return 0;
}

/* encodes one pre-tokenized word */
static void s_bpe_emit_word(const zl_tokenizer *t, scratch *s, const unsigned char *w, size_t n, emitter *e) {
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id = s_lookup(t, (const char *)w, n);
        if (id >= 0) { s_emit(e, id); return; }
    }
    uint64_t h = 0;
    cslot *slot = NULL;
    if (n <= CACHE_MAX_WORD && s->cache) {
        h = s_hash(w, n);
        uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
        for (int probe = 0; probe < 8; probe++, i = (i + 1) & (CACHE_SLOTS - 1)) {
            cslot *c = &s->cache[i];
            if (c->hash == 0) { slot = c; break; }
            if (c->hash == h && c->klen == n && memcmp(s->carena + c->off, w, n) == 0) {
                const unsigned char *ip = s->carena + c->off + ((n + 3) & ~(size_t)3);
                for (int k = 0; k < c->nids; k++) { int32_t id; memcpy(&id, ip + 4 * (size_t)k, 4); s_emit(e, id); }
                return;
            }
        }
    }
    int k = s_bpe_word(t, s, w, n);
    if (k < 0) { e->oom = 1; return; }
    for (int i = 0; i < k; i++) s_emit(e, s->ids[i]);
    if (slot) {
        size_t need = ((n + 3) & ~(size_t)3) + 4 * (size_t)k;
        if (s->cused + need > CACHE_ARENA) {   /* full: start over */
            memset(s->cache, 0, CACHE_SLOTS * sizeof *s->cache);
            s->cused = 0;
            return;
        }
        memcpy(s->carena + s->cused, w, n);
        memcpy(s->carena + s->cused + ((n + 3) & ~(size_t)3), s->ids, 4 * (size_t)k);
        *slot = (cslot){h, s->cused, (uint16_t)n, (uint16_t)k};
        s->cused += (uint32_t)need;
    }
}

/* splits text[off, off+len) with regex re: appends matches and the stretches between them to out */
/* one match of re (index k) in sub[n] from pos */
static inline int s_match(const zl_tokenizer *t, scratch *s, int k, const unsigned char *sub, size_t n, size_t pos) {
    if (t->re_jit[k]) return pcre2_jit_match(t->re[k], sub, n, pos, 0, s->md, s->mctx);
    return pcre2_match(t->re[k], sub, n, pos, 0, s->md, s->mctx);
}

static int s_split(const zl_tokenizer *t, scratch *s, int k, const unsigned char *text, span in, span **out, size_t *cap, size_t *n) {
    const unsigned char *sub = text + in.off;
    PCRE2_SIZE pos = 0, last = 0;
    while (pos < in.len) {
        int rc = s_match(t, s, k, sub, in.len, pos);
        if (rc < 0) break;   /* no more matches (or a matcher limit): the rest is one piece */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        PCRE2_SIZE a = ov[0], b = ov[1];
        if (b <= a) {        /* empty match: not produced by our regexes, but never loop */
            pos = a + 1;
            continue;
        }
        if (s_grow((void **)out, cap, *n + 2, sizeof **out) != 0) return -1;
        if (a > last) (*out)[(*n)++] = (span){in.off + (uint32_t)last, (uint32_t)(a - last)};
        (*out)[(*n)++] = (span){in.off + (uint32_t)a, (uint32_t)(b - a)};
        pos = last = b;
    }
    if (last < in.len) {
        if (s_grow((void **)out, cap, *n + 1, sizeof **out) != 0) return -1;
        (*out)[(*n)++] = (span){in.off + (uint32_t)last, (uint32_t)(in.len - last)};
    }
    return 0;
}

static int s_regex_init(scratch *s) {
    if (s->md) return 0;
    s->md = pcre2_match_data_create(4, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jstack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
    if (!s->md || !s->mctx) return -1;
    if (s->jstack) pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
    return 0;
}

static void s_bpe_encode(const zl_tokenizer *t, scratch *s, const unsigned char *text, size_t n, emitter *e) {
    if (n == 0) return;
    if (n > UINT32_MAX) { e->oom = 1; return; }
    if (s_regex_init(s) != 0) { e->oom = 1; return; }
    s_cache_init(s);   /* without a cache it is only slower */
    if (t->n_re == 1) {   /* common case: stream the words */
        const unsigned char *sub = text;
        PCRE2_SIZE pos = 0, last = 0;
        while (pos < n) {
            int rc = s_match(t, s, 0, sub, n, pos);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            PCRE2_SIZE a = ov[0], b = ov[1];
            if (b <= a) { pos = a + 1; continue; }
            if (a > last) s_bpe_emit_word(t, s, text + last, a - last, e);
            s_bpe_emit_word(t, s, text + a, b - a, e);
            pos = last = b;
        }
        if (last < n) s_bpe_emit_word(t, s, text + last, n - last, e);
        return;
    }
    size_t cnt[2] = {0, 0};
    if (s_grow((void **)&s->sp[0], &s->sp_cap[0], 1, sizeof(span)) != 0) { e->oom = 1; return; }
    s->sp[0][0] = (span){0, (uint32_t)n};
    cnt[0] = 1;
    int cur = 0;
    for (int r = 0; r < t->n_re; r++) {
        int nx = cur ^ 1;
        cnt[nx] = 0;
        for (size_t i = 0; i < cnt[cur]; i++)
            if (s_split(t, s, r, text, s->sp[cur][i], &s->sp[nx], &s->sp_cap[nx], &cnt[nx]) != 0) { e->oom = 1; return; }
        cur = nx;
    }
    for (size_t i = 0; i < cnt[cur]; i++) s_bpe_emit_word(t, s, text + s->sp[cur][i].off, s->sp[cur][i].len, e);
}

/* encodes one raw-text fragment (no special tokens inside) */
static void s_encode_fragment(const zl_tokenizer *t, scratch *s, const char *text, size_t n, int prev_special, emitter *e) {
    if (t->model == MODEL_BPE) { s_bpe_encode(t, s, (const unsigned char *)text, n, e); return; }
    size_t need = 3 * (n + 1);
    if (s_grow((void **)&s->buf, &s->buf_cap, need, 1) != 0) { e->oom = 1; return; }
    size_t m = 0;
    if (t->add_space_prefix && prev_special) { memcpy(s->buf, "\xe2\x96\x81", 3); m = 3; }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') { memcpy(s->buf + m, "\xe2\x96\x81", 3); m += 3; }
        else s->buf[m++] = text[i];
    }
    s_spm_encode(t, s, s->buf, m, e);
}

/* the longest special token at text[i..n) (user-defined ones only without parse_special; of equal texts the lowest
 * id), or -1: a walk down the specials' trie */
static int32_t s_special_at(const zl_tokenizer *t, const char *text, size_t n, size_t i, int parse_special) {
    const int32_t *ends = parse_special ? t->st_any : t->st_user;
    int32_t node = 0, best = -1;
    for (size_t k = i; k < n; k++) {
        uint64_t key = ((uint64_t)(uint32_t)node << 8 | (unsigned char)text[k]) + 1;
        uint32_t j = (uint32_t)s_hash64(key) & t->stmask;
        while (t->stab[j].key && t->stab[j].key != key) j = (j + 1) & t->stmask;
        if (!t->stab[j].key) break;
        node = t->stab[j].child;
        if (ends[node] >= 0) best = ends[node];
    }
    return best;
}

int tokenizer_encode(const zl_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t *out, int max_out) {
    if (!t || (!text && len) || max_out < 0 || (!out && max_out > 0)) return -1;
    zl_tokenizer *tm = (zl_tokenizer *)t;   /* the object is heap-allocated, only the scratch is written */
    scratch local, *s;
    int locked = pthread_mutex_trylock(&tm->lock) == 0;
    if (locked) s = &tm->sc;
    else { memset(&local, 0, sizeof local); s = &local; }
    emitter e = {out, max_out, 0, 0};
    if (add_bos && t->bos >= 0) s_emit(&e, t->bos);
    int check = t->n_spec > 0 && (parse_special || t->n_user > 0);
    size_t frag = 0;
    int prev_special = 1;
    if (check) {
        for (size_t i = 0; i < len && !e.oom;) {
            unsigned char c = (unsigned char)text[i];
            if (t->spec_first[c] == t->spec_first[c + 1]) { i++; continue; }
            int32_t id = s_special_at(t, text, len, i, parse_special);
            if (id < 0) { i++; continue; }
            if (i > frag) { s_encode_fragment(t, s, text + frag, i - frag, prev_special, &e); }
            s_emit(&e, id);
            prev_special = 1;
            i += t->key_len[id];
            frag = i;
            /* the fragment after a special token starts fresh (SPM: space prefix again) */
            continue;
        }
    }
    if (len > frag && !e.oom) {
        s_encode_fragment(t, s, text + frag, len - frag, prev_special, &e);
    }
    if (add_bos && t->add_eos && t->eos >= 0) s_emit(&e, t->eos);
    if (locked) pthread_mutex_unlock(&tm->lock);
    else s_scratch_free(&local);
    return e.oom ? -1 : e.n;
}

/* ------------------------------------------------------------------------------------------------ decoding */

/* bytes of id's text as decoded output, honouring `special`; NULL length 0 for suppressed tokens */
static const char *s_piece(const zl_tokenizer *t, int32_t id, int special, size_t *n) {
    int ty = t->ttype[id];
    if (ty == TT_UNUSED || ((ty == TT_CONTROL || ty == TT_UNKNOWN) && !special)) { *n = 0; return ""; }
    *n = t->dec_len[id];
    return t->arena + t->dec_off[id];
}

/* writes the complete UTF-8 characters of in[n] to out (invalid bytes as U+FFFD) and returns the count written,
 * or -1 when cap is too small; the trailing incomplete character (if any) is left in *tail / *ntail */
static int s_utf8_emit(const unsigned char *in, size_t n, char *out, size_t cap, size_t *tail_off) {
    size_t w = 0, i = 0;
    while (i < n) {
        unsigned char c = in[i];
        if (c < 0x80) {
            if (w + 1 > cap) return -1;
            out[w++] = (char)c; i++; continue;
        }
        int L = s_utf8_len(c);
        if (L > 1 && c < 0xF8 && i + (size_t)L > n) {   /* maybe incomplete: are the bytes so far plausible? */
            size_t k = i + 1;
            while (k < n && (in[k] & 0xC0) == 0x80) k++;
            if (k == n) break;   /* hold back */
        }
        int32_t cp;
        int m = s_utf8_dec(in + i, n - i, &cp);
        if (cp < 0) {
            if (w + 3 > cap) return -1;
            memcpy(out + w, "\xEF\xBF\xBD", 3); w += 3; i++;
        } else {
            if (w + (size_t)m > cap) return -1;
            memcpy(out + w, in + i, (size_t)m); w += (size_t)m; i += (size_t)m;
        }
    }
    *tail_off = i;
    return (int)w;
}

int tokenizer_decode_stream(const zl_tokenizer *t, zl_detok *st, int32_t id, int special, char *out, size_t cap) {
    if (!t || !st || !out || cap == 0 || id < 0 || id >= t->n_vocab) return -1;
    if (st->n_pend < 0 || st->n_pend > 4) st->n_pend = 0;
    size_t pn;
    const char *p = s_piece(t, id, special, &pn);
    int started = st->started;
    if (pn > 0 && !started) {
        if (t->model == MODEL_SPM && t->add_space_prefix && p[0] == ' ') { p++; pn--; }
        started = 1;
    }
    unsigned char small[512];
    unsigned char *buf = small;
    size_t n = (size_t)st->n_pend + pn;
    if (n > sizeof small) { buf = malloc(n); if (!buf) return -1; }
    memcpy(buf, st->pend, (size_t)st->n_pend);
    memcpy(buf + st->n_pend, p, pn);
    size_t tail = 0;
    int w = s_utf8_emit(buf, n, out, cap - 1, &tail);
    if (w >= 0 && n - tail <= sizeof st->pend) {
        out[w] = 0;
        memcpy(st->pend, buf + tail, n - tail);
        st->n_pend = (int)(n - tail);
        st->started = started;
    } else w = -1;
    if (buf != small) free(buf);
    return w;
}

size_t tokenizer_stream_cap(const zl_tokenizer *t) {
    size_t longest = t ? t->dec_max : 0; /* found by tokenizer_new: a call costs nothing */
    return 3 * (longest + sizeof((zl_detok *)0)->pend) + 1;
}

int tokenizer_decode_flush(const zl_tokenizer *t, zl_detok *st, char *out, size_t cap) {
    (void)t;
    if (!st || !out || cap == 0) return -1;
    if (st->n_pend < 0 || st->n_pend > 4) st->n_pend = 0;
    size_t need = 3 * (size_t)st->n_pend;
    if (need + 1 > cap) return -1;
    int w = 0;
    for (int i = 0; i < st->n_pend; i++) { memcpy(out + w, "\xEF\xBF\xBD", 3); w += 3; }   /* leftovers are incomplete */
    out[w] = 0;
    st->n_pend = 0;
    return w;
}

char *tokenizer_decode(const zl_tokenizer *t, const int32_t *ids, int n, int special) {
    return tokenizer_decode_len(t, ids, n, special, NULL);
}

char *tokenizer_decode_len(const zl_tokenizer *t, const int32_t *ids, int n, int special, size_t *len) {
    if (len) *len = 0;
    if (!t || n < 0 || (!ids && n)) return NULL;
    size_t total = 1;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return NULL;
        size_t pn; s_piece(t, ids[i], special, &pn);
        total += pn;
    }
    char *r = malloc(total), *w = r;
    if (!r) return NULL;
    int started = 0;
    for (int i = 0; i < n; i++) {
        size_t pn;
        const char *p = s_piece(t, ids[i], special, &pn);
        if (pn > 0 && !started) {
            if (t->model == MODEL_SPM && t->add_space_prefix && p[0] == ' ') { p++; pn--; }
            started = 1;
        }
        memcpy(w, p, pn); w += pn;
    }
    *w = 0;
    if (len) *len = (size_t)(w - r);
    return r;
}

/* ------------------------------------------------------------------------------------------------ internals for chat.c / tools */

const char *tokenizer_chat_template(const zl_tokenizer *t) { return t ? t->chat_template : NULL; }

const char *tokenizer_token_text(const zl_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) { if (len) *len = 0; return NULL; }
    if (len) *len = t->key_len[id];
    return s_key(t, id);
}

const char *tokenizer_pre(const zl_tokenizer *t) { return t ? t->pre : NULL; }
int tokenizer_is_spm(const zl_tokenizer *t) { return t && t->model == MODEL_SPM; }
