/* fuzz target: the structured-output compilers (JSON schema, regex, GBNF: common/grammar*.c) and the matcher.
 * Input: one byte choosing the kind (low 2 bits) and how the tail is split, then the text; after a NUL, bytes fed
 * to the matcher. Must never crash, leak, read out of bounds or run unbounded; a refusal carries a message. A
 * compiled grammar is driven over a small fixed vocabulary: masks, then the fed bytes as tokens, checking that
 * every token the mask allows is accepted and leaves the matcher alive or complete. The walk runs twice (the
 * second finds the grammar's remembered masks), every remembered mask compared bit for bit with a walk's: in the
 * first pass with that of a matcher of the same text compiled without the mask cache, which from the first
 * remembered mask on follows along (taking the tokens so far first) and walks where the first matcher's mask came
 * from the cache; in the second with the first pass's mask of the same step (each a walk's, or checked against
 * one), the tokens and so the parse states being the same. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz_main.h"
#include "grammar.h"

static void s_fail(const char *what) {
    fprintf(stderr, "fuzz_grammar: %s\n", what);
    abort();
}

/* a vocabulary of every single byte, a few multi-byte pieces (split UTF-8 included) and one end-of-generation id */
#define S_NV 272
static zg_vocab *s_vocab(void) {
    static zg_vocab *v;
    if (v) return v;
    static char one[256];
    const char *bytes[S_NV];
    size_t lens[S_NV];
    uint8_t eog[S_NV] = {0};
    static const char *multi[] = {"{\"",      "\":",  "\", \"", "true", "null", "12",    "\xc3\xa9",
                                  "\xe4\xb8", "\xad", " [",     "]}",   "ab",   "\\u00", "-0.5e"};
    for (int i = 0; i < 256; i++) {
        one[i] = (char)i;
        bytes[i] = one + i;
        lens[i] = 1;
    }
    for (int i = 256; i < S_NV; i++) {
        const char *m = i - 256 < (int)(sizeof multi / sizeof *multi) ? multi[i - 256] : "";
        bytes[i] = m;
        lens[i] = strlen(m);
    }
    eog[S_NV - 1] = 1;
    char err[128];
    v = grammar_vocab_new(S_NV, bytes, lens, eog, err, sizeof err);
    if (!v) s_fail(err);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const int kinds[] = {ZG_JSON_SCHEMA, ZG_REGEX, ZG_GBNF, ZG_JSON_OBJECT};
    int kind = kinds[data[0] & 3];
    const char *text = (const char *)data + 1;
    size_t n = size - 1, tn = strnlen(text, n);
    char err[256];
    err[0] = 0;
    zg_grammar *g = grammar_compile(kind, text, tn, err, sizeof err);
    if (!g) {
        if (!err[0]) s_fail("a refusal without a message");
        return 0;
    }
    zg_vocab *v = s_vocab();
    zg_grammar *ref = grammar_compile(kind, text, tn, err, sizeof err);
    if (!ref) s_fail("the same text compiled twice: refused the second time");
    grammar_mask_cache_limit(ref, 0);
    const uint8_t *feed = tn < n ? data + 1 + tn + 1 : NULL;
    size_t nf = tn < n ? n - tn - 1 : 0;
    /* the first pass's masks by step, each a walk's or checked against one (a walk gives what a walk gives:
     * walking again where the mask came from a walk would only repeat it) */
    uint32_t rec[64][(S_NV + 31) / 32];
    int rec_allowed[64], ids[64];
    size_t n_rec = 0;
    for (int pass = 0; pass < 2; pass++) {
        zg_matcher *m = grammar_matcher_new(g, err, sizeof err), *mr = NULL;
        if (!m) break;
        uint32_t mask[(S_NV + 31) / 32], mref[(S_NV + 31) / 32];
        for (size_t k = 0; k < 64; k++) {
            uint64_t hits0, hits1;
            grammar_mask_cache_stats(g, &hits0, NULL, NULL);
            int allowed = grammar_matcher_mask(m, v, mask);
            grammar_mask_cache_stats(g, &hits1, NULL, NULL);
            if (pass == 0 && hits1 != hits0 && !mr) {
                /* the first remembered mask: the reference matcher takes the tokens so far, then follows along */
                mr = grammar_matcher_new(ref, err, sizeof err);
                for (size_t j = 0; mr && j < k; j++)
                    if (grammar_matcher_accept_token(mr, v, ids[j]) != 0) s_fail("an allowed token refused");
            }
            if (pass == 0) {
                if (hits1 != hits0 && mr &&
                    (grammar_matcher_mask(mr, v, mref) != allowed || memcmp(mask, mref, sizeof mask) != 0))
                    s_fail("a remembered mask differs from a walk's");
                memcpy(rec[k], mask, sizeof mask);
                rec_allowed[k] = allowed;
                n_rec = k + 1;
            } else if (k >= n_rec || rec_allowed[k] != allowed || memcmp(mask, rec[k], sizeof mask) != 0)
                s_fail("a remembered mask differs from a walk's");
            if (allowed == 0) {
                /* only a walk over the work bound leaves a matcher that took a token with nothing to allow, and a
                 * spent matcher refuses every token */
                if (k > 0 && !grammar_matcher_spent(m)) s_fail("empty mask after an accepted token");
                if (grammar_matcher_spent(m) && grammar_matcher_accept_bytes(m, "a", 1) == 0)
                    s_fail("a spent matcher took a byte");
                break;
            }
            /* the next token: the fed byte's choice among the allowed ids, or the first allowed */
            int pick = feed && k < nf ? feed[k] % allowed : 0, id = -1;
            for (int i = 0; i < S_NV && id < 0; i++)
                if (mask[i >> 5] >> (i & 31) & 1 && pick-- == 0) id = i;
            if (grammar_matcher_accept_token(m, v, id) != 0 || (mr && grammar_matcher_accept_token(mr, v, id) != 0))
                s_fail("an allowed token refused");
            ids[k] = id;
            if (!grammar_matcher_can_continue(m)) break;
        }
        /* raw bytes straight in: refused or accepted, never a crash */
        if (feed && pass == 1) grammar_matcher_accept_bytes(m, (const char *)feed, nf);
        grammar_matcher_destroy(&m);
        grammar_matcher_destroy(&mr);
    }
    grammar_unref(&g);
    grammar_unref(&ref);
    return 0;
}

static const char *const s_seed_text[] = {
    "\x00{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},\"b\":{\"enum\":[1,\"x\","
    "null]}},"
    "\"required\":[\"a\"],\"additionalProperties\":false}",
    "\x00{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
    "\"maxItems\":2}]}},\"$ref\":\"#/$defs/n\"}",
    "\x00{\"type\":\"string\",\"pattern\":\"^[a-z\\\"]+\\\\d{2}$\"}",
    "\x00{\"type\":[\"number\",\"boolean\"],\"format\":\"date\"}",
    "\x01^[a-c]{1,3}(\\.\\d+|x)*$\0\x05\x01\x02\x03",
    "\x01(?:ab|[^\\s\\d])+?\\u00e9{2}",
    "\x02root ::= \"(\" root \")\" | [a-z\\u00e0-\\u00ff]+ # c\nx ::= root{2,3}\n\0\x10\x20\x30",
    "\x02root ::= a | b\na ::= \"x\" a?\nb ::= .*\n",
    "\x03\0\x07\x01\x00\x03",
};

/* seeds holding NULs in their feed, as {text, length} */
#define S_BIN(lit)                                                                                                     \
    { lit, sizeof lit - 1 }
static const struct {
    const char *s;
    size_t n;
} s_seed_bin[] = {
    /* a grammar whose parses multiply past the matcher's stack bound (recursion through a repetition) and a feed
     * that drives it there: the bound drops parses, and every token allowed still leaves something to follow */
    S_BIN("\x02root ::= \"(ro  ot\"\")\" | [a(0ff]+  root{2,3}\n\x00\x10 0-\\u00ff]+ 3}(\n\x00\x10 \x98"
          "\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\xf8"
          "\x98\x98"
          "1\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98"
          "\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98"
          "\x98\x98\x98\x98\x98\x98\x98root{2,\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98"
          "\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98\x98"
          "0"),
    /* a negated class whose ranges cover U+0080-00BF together, and a feed that picks the lead byte 0xC2 */
    S_BIN("\x02root ::= \"a\" [^\\x80-\\x9f\\xa0-\\xbf]\n\0\x01\x80"),
    /* a class reaching into the surrogates, and a feed that picks the lead byte 0xED */
    S_BIN("\x02root ::= \"a\" [\\ud900-\\ue000]\n\0\x01\x00"),
    /* a nullable rule repeated inside itself: each stack is expanded once per step, not along every path */
    S_BIN("\x02root ::= \"\" | [a(0ff].  root{2,3}\n\0\x10 0-]. \x98\x03\x98"),
    /* a nullable alternative inside nested counted repetitions: a walk goes over the work bound (the matcher is
     * spent); and one whose repetitions make an alternative of 260,000 elements, which an expansion steps over
     * at no cost (alt_end), so that the walk reaches the bound in milliseconds */
    S_BIN("\x02root ::= \"\" | [$(0ff].  root{1,3}{817}\n\0\x10 \xff\xff\xff\xff"),
    S_BIN("\x02root ::= \"\" | [$.root0ff].  root{323}{806}\n\0\x10 \xff\xff\xff\xff\x01\x01"),
    /* a chain of 127,000 nullable references after a class: the mask finds the class's own continuation and allows
     * 'r'; accepting it expands the chain, whose stacks past the expansion depth bound are dropped alike (no
     * refusal, no deep recursion) */
    S_BIN("\x02root ::= \"\" | [!$.r]+  root{158}{806}\n\0\x03\":"),
};

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    int n = 0;
    for (size_t i = 0; i < sizeof s_seed_bin / sizeof *s_seed_bin && n < max; i++) {
        seeds[n] = (const uint8_t *)s_seed_bin[i].s;
        sizes[n++] = s_seed_bin[i].n;
    }
    for (size_t i = 0; i < sizeof s_seed_text / sizeof *s_seed_text && n < max; i++) {
        const char *s = s_seed_text[i];
        size_t len = 1 + strlen(s + 1);
        /* seeds with a feed: the bytes after the text's NUL (they hold no NUL of their own, but \x00 ends one) */
        if (i == 4) len += 1 + 4;
        if (i == 6) len += 1 + 3;
        if (i == 8) len = 1 + 1 + 4;
        seeds[n] = (const uint8_t *)s;
        sizes[n++] = len;
    }
    return n;
}
