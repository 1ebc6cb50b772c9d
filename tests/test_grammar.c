/* tests/test_grammar.c: the grammar engine (common/grammar*.c): GBNF, regex and JSON schema compile to grammars
 * that accept what they should and refuse the rest; bad inputs are refused with a message; the token mask on a
 * small hand-made vocabulary (multi-byte characters split across tokens, end of generation only when the grammar
 * accepts); and random walks over a real tokenizer's vocabulary, where every token the mask allows keeps the
 * matcher alive until an end-of-generation id ends a whole match; the masks a grammar remembers equal a walk's,
 * bit for bit. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gguf.h"
#include "grammar.h"
#include "test.h"
#include "tokenizer.h"

static int s_match(int kind, const char *text, const char *input) {
    char err[256];
    zg_grammar *g = grammar_compile(kind, text, strlen(text), err, sizeof err);
    if (!g) {
        fprintf(stderr, "compile failed: %s\n", err);
        return -2;
    }
    zg_matcher *m = grammar_matcher_new(g, err, sizeof err);
    grammar_unref(&g);
    int ok = m && grammar_matcher_accept_bytes(m, input, strlen(input)) == 0 ? grammar_matcher_accepting(m) : -1;
    grammar_matcher_destroy(&m);
    return ok; /* 1 whole match, 0 a prefix, -1 refused */
}

static void s_refused(int kind, const char *text, const char *want) {
    char err[256] = "";
    zg_grammar *g = grammar_compile(kind, text, strlen(text), err, sizeof err);
    CHECK(!g, "%s compiled but should not: %s", grammar_kind_name(kind), text);
    CHECK(strstr(err, want) != NULL, "error for %s: '%s' lacks '%s'", text, err, want);
    grammar_unref(&g);
}

static void test_gbnf(void) {
    const char *g = "root ::= \"a\" [0-9]+ (\"x\" | \"y\")? tail\ntail ::= | \"!\" # comment\n";
    CHECK(s_match(ZG_GBNF, g, "a12x") == 1, "a12x");
    CHECK(s_match(ZG_GBNF, g, "a1!") == 1, "a1!");
    CHECK(s_match(ZG_GBNF, g, "a") == 0, "a is a prefix");
    CHECK(s_match(ZG_GBNF, g, "b") == -1, "b refused");
    CHECK(s_match(ZG_GBNF, g, "a1xy") == -1, "a1xy refused");
    const char *u = "root ::= [^a-c\\u00e9] \"\\u00e9\"{2,3} .\n";
    CHECK(s_match(ZG_GBNF, u, "d\xc3\xa9\xc3\xa9z") == 1, "utf-8 classes");
    CHECK(s_match(ZG_GBNF, u, "\xc3\xa9\xc3\xa9\xc3\xa9z") == -1, "negated class refuses e-acute");
    CHECK(s_match(ZG_GBNF, u, "d\xc3") == 0, "partial UTF-8 is a prefix");
    CHECK(s_match(ZG_GBNF, u, "d\xff") == -1, "invalid UTF-8 refused");
    const char *rec = "root ::= \"(\" root \")\" | \"x\"\n";
    CHECK(s_match(ZG_GBNF, rec, "(((x)))") == 1, "nesting");
    CHECK(s_match(ZG_GBNF, rec, "((x)") == 0, "unbalanced prefix");
    s_refused(ZG_GBNF, "root ::= foo\n", "not defined");
    s_refused(ZG_GBNF, "main ::= \"a\"\n", "no rule 'root'");
    s_refused(ZG_GBNF, "root ::= root \"a\" | \"b\"\n", "left recursion");
    s_refused(ZG_GBNF, "root ::= (\"a\"?)*\n", "left recursion");
    s_refused(ZG_GBNF, "root ::= \"a\" root\n", "unsatisfiable");
    s_refused(ZG_GBNF, "root ::= \"a\n", "unterminated");
    s_refused(ZG_GBNF, "root ::= [z-a]\n", "out of order");
    s_refused(ZG_GBNF, "root := \"a\"\n", "expected ::=");
    s_refused(ZG_GBNF, "root ::= \"a\"{3,2}\n", "bounds");
}

static void test_regex(void) {
    const char *re = "^[a-z]{2,3}-\\d+(\\.\\d{1,2})?$";
    CHECK(s_match(ZG_REGEX, re, "ab-12.5") == 1, "regex full");
    CHECK(s_match(ZG_REGEX, re, "ab-") == 0, "regex prefix");
    CHECK(s_match(ZG_REGEX, re, "abcd-1") == -1, "regex refuses 4 letters");
    CHECK(s_match(ZG_REGEX, "(cat|dog)s?|bird", "dogs") == 1, "alternation");
    CHECK(s_match(ZG_REGEX, "(cat|dog)s?|bird", "birds") == -1, "alternation refuses");
    CHECK(s_match(ZG_REGEX, "[^\\d\\s]+", "abc") == 1, "negated class with shorthands");
    CHECK(s_match(ZG_REGEX, "a.c", "a\nc") == -1, "dot refuses newline");
    s_refused(ZG_REGEX, "(a", "unbalanced");
    s_refused(ZG_REGEX, "a)", "unbalanced");
    s_refused(ZG_REGEX, "(?=a)", "unsupported group");
    s_refused(ZG_REGEX, "(a)\\1", "unsupported escape");
    s_refused(ZG_REGEX, "*a", "quantifier without");
    s_refused(ZG_REGEX, "a**", "nested quantifier");
}

static void test_schema(void) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},"
                    "\"maxItems\":2},\"ok\":{\"type\":[\"boolean\",\"null\"]}},\"required\":[\"name\",\"ok\"],"
                    "\"additionalProperties\":false}";
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"bob\",\"ok\":true}") == 1, "required only");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{ \"name\": \"bob\", \"age\": -12, \"tags\": [\"a\", \"b\"], \"ok\": null }") ==
              1,
          "all with spaces");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"bob\"}") == -1, "missing required refused");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"age\":1,\"name\":\"x\",\"ok\":true}") == -1, "order is the schema's");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"bobbyx\",\"ok\":true}") == -1, "maxLength");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"b\",\"tags\":[\"a\",\"a\",\"a\"],\"ok\":true}") == -1, "maxItems");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"b\",\"ok\":true,\"x\":1}") == -1, "no extra properties");
    CHECK(s_match(ZG_JSON_SCHEMA, s, "{\"name\":\"a\\\"\\u00e9\",\"ok\":false}") == 1, "escapes in strings");
    const char *ref = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},"
                      "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
                      "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    CHECK(s_match(ZG_JSON_SCHEMA, ref, "{\"v\":1,\"next\":{\"v\":1,\"next\":null}}") == 1, "recursive $ref");
    CHECK(s_match(ZG_JSON_SCHEMA, ref, "{\"v\":2,\"next\":null}") == -1, "const");
    const char *pat = "{\"type\":\"string\",\"pattern\":\"^[A-Z]\\\"?[0-9]{2}$\"}";
    CHECK(s_match(ZG_JSON_SCHEMA, pat, "\"A\\\"12\"") == 1, "pattern with an escaped quote");
    CHECK(s_match(ZG_JSON_SCHEMA, pat, "\"A\"12\"") == -1, "raw quote refused");
    CHECK(s_match(ZG_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"") == 1, "date");
    CHECK(s_match(ZG_JSON_OBJECT, "", "{\"a\": [1, 2.5e3, {\"b\": null}], \"c\": \"d\"}") == 1, "json_object");
    CHECK(s_match(ZG_JSON_OBJECT, "", "[1]") == -1, "json_object refuses an array");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":3}", "minimum");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":\"object\",\"patternProperties\":{}}",
              "unsupported keyword 'patternProperties'");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":\"objekt\"}", "unknown type");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{}, \"required\":[\"a\"]}", "not in properties");
    s_refused(ZG_JSON_SCHEMA, "{\"enum\":[]}", "unsatisfiable");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "unsatisfiable");
    s_refused(ZG_JSON_SCHEMA, "{\"$ref\":\"#/$defs/nope\"}", "does not resolve");
    s_refused(ZG_JSON_SCHEMA, "{\"type\":", "invalid JSON");
    s_refused(ZG_JSON_SCHEMA, "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "unsatisfiable");
}

/* a vocabulary of a few tokens: "{", "}", "\"", "a", "ab", "\"a", "\xc3" and "\xa9" (e-acute split), " ", eos */
static void test_mask(void) {
    const char *toks[] = {"{", "}", "\"", "a", "ab", "\"a", "\xc3", "\xa9", " ", ""};
    size_t lens[10];
    uint8_t eog[10] = {0};
    eog[9] = 1;
    for (int i = 0; i < 10; i++) lens[i] = strlen(toks[i]);
    char err[256];
    zg_vocab *v = grammar_vocab_new(10, toks, lens, eog, err, sizeof err);
    CHECK(v != NULL, "vocab: %s", err);
    const char *g = "root ::= \"{\" str \"}\"\nstr ::= \"\\\"\" [a\\u00e9]* \"\\\"\"\n";
    zg_grammar *gr = grammar_compile(ZG_GBNF, g, strlen(g), err, sizeof err);
    zg_matcher *m = gr ? grammar_matcher_new(gr, err, sizeof err) : NULL;
    grammar_unref(&gr);
    CHECK(m != NULL, "matcher: %s", err);
    if (!v || !m) return;
    uint32_t mask[1];
    int n = grammar_matcher_mask(m, v, mask);
    CHECK(n == 1 && mask[0] == 1u << 0, "start: only '{' (%d, %x)", n, mask[0]);
    CHECK(grammar_matcher_accept_token(m, v, 0) == 0, "accept {");
    n = grammar_matcher_mask(m, v, mask);
    CHECK(n == 2 && mask[0] == (1u << 2 | 1u << 5), "after {: \" and \"a (%x)", mask[0]);
    CHECK(grammar_matcher_accept_token(m, v, 5) == 0, "accept \"a");
    n = grammar_matcher_mask(m, v, mask);
    CHECK(mask[0] == (1u << 2 | 1u << 3 | 1u << 6), "in the string: \" a and the lead byte (%x)", mask[0]);
    CHECK(grammar_matcher_accept_token(m, v, 4) == -1, "ab refused");
    CHECK(grammar_matcher_accept_token(m, v, 6) == 0, "accept lead byte");
    n = grammar_matcher_mask(m, v, mask);
    CHECK(n == 1 && mask[0] == 1u << 7, "only the continuation byte (%x)", mask[0]);
    CHECK(grammar_matcher_accept_token(m, v, 7) == 0 && grammar_matcher_accept_token(m, v, 2) == 0, "e-acute \"");
    CHECK(!grammar_matcher_accepting(m), "not yet accepting");
    grammar_matcher_mask(m, v, mask);
    CHECK(!(mask[0] >> 9 & 1), "eos not allowed before the end");
    CHECK(grammar_matcher_accept_token(m, v, 9) == -1, "eos refused before the end");
    CHECK(grammar_matcher_accept_token(m, v, 1) == 0 && grammar_matcher_accepting(m), "} completes");
    n = grammar_matcher_mask(m, v, mask);
    CHECK(n == 1 && mask[0] == 1u << 9, "then only eos (%x)", mask[0]);
    CHECK(!grammar_matcher_can_continue(m), "nothing can follow");
    grammar_matcher_destroy(&m);
    grammar_vocab_destroy(&v);
}

/* a vocabulary of every single byte (ids 0-255) and end of generation (256) */
static zg_vocab *s_byte_vocab(void) {
    static char one[256];
    const char *toks[257];
    size_t lens[257];
    uint8_t eog[257] = {0};
    for (int i = 0; i < 256; i++) {
        one[i] = (char)i;
        toks[i] = one + i;
        lens[i] = 1;
    }
    toks[256] = "";
    lens[256] = 0;
    eog[256] = 1;
    char err[256];
    zg_vocab *v = grammar_vocab_new(257, toks, lens, eog, err, sizeof err);
    CHECK(v != NULL, "byte vocab: %s", err);
    return v;
}

/* the allowed bytes after prefix as a string of hex pairs ("" when the prefix is refused) */
static void s_allowed_after(const zg_vocab *v, const char *text, const char *prefix, char *out, size_t cap) {
    char err[256];
    out[0] = 0;
    zg_grammar *g = grammar_compile(ZG_GBNF, text, strlen(text), err, sizeof err);
    zg_matcher *m = g ? grammar_matcher_new(g, err, sizeof err) : NULL;
    grammar_unref(&g);
    uint32_t mask[9];
    if (m && grammar_matcher_accept_bytes(m, prefix, strlen(prefix)) == 0 && grammar_matcher_mask(m, v, mask) > 0)
        for (int b = 0; b < 257; b++)
            if (mask[b >> 5] >> (b & 31) & 1 && strlen(out) + 5 < cap)
                snprintf(out + strlen(out), cap - strlen(out), "%02x ", b);
    grammar_matcher_destroy(&m);
}

/* characters no text holds: surrogates in a string or a class of them only, or a negated class that covers every
 * character, are refused at compile time; a token that ends inside a character is allowed only when some
 * character of the class can complete it (negated classes whose ranges cover the block together, the block of
 * 0xED that holds the surrogates) */
static void test_dead_ends(void) {
    s_refused(ZG_GBNF, "root ::= \"a\" \"\\ud800\" | \"b\"", "surrogate");
    s_refused(ZG_GBNF, "root ::= \"a\" [\\ud800-\\udfff]", "empty character class");
    s_refused(ZG_GBNF, "root ::= \"a\" [^\\x00-\\U0010ffff]", "empty character class");
    s_refused(ZG_GBNF, "root ::= \"a\" [^\\x00-\\ud7ff\\ue000-\\U0010ffff]", "empty character class");
    CHECK(s_match(ZG_GBNF, "root ::= [^\\x00-\\ud7ff\\ue001-\\U0010ffff]", "\xee\x80\x80") == 1, "U+E000 alone");
    zg_vocab *v = s_byte_vocab();
    if (!v) return;
    char got[1024];
    s_allowed_after(v, "root ::= \"a\" [^\\x00-\\x7f\\x80-\\x9f\\xa0-\\xbf]", "a", got, sizeof got);
    CHECK(strncmp(got, "c3 c4 ", 6) == 0, "U+0080-00BF excluded by two ranges: no 0xC2 (%.12s)", got);
    s_allowed_after(v, "root ::= \"a\" [\\ud900-\\ue000]", "a", got, sizeof got);
    CHECK(strcmp(got, "ee ") == 0, "a class reaching into the surrogates: only 0xEE leads (%s)", got);
    s_allowed_after(v, "root ::= \"a\" [\\ud7ff-\\ue000]", "a\xed", got, sizeof got);
    CHECK(strcmp(got, "9f ") == 0, "after 0xED only 0x9F (U+D7C0-D7FF) (%s)", got);
    grammar_vocab_destroy(&v);
}

/* a grammar whose parses multiply (recursion through a repetition, each character may end one parse and start
 * another) past the matcher's bound on live stacks: every token the mask allows is accepted and leaves a
 * non-empty mask, the mask agrees with accepting each byte on a replayed matcher, and a match can still end */
static void test_ambiguous(void) {
    char err[256];
    zg_vocab *v = s_byte_vocab();
    const char *text = "root ::= \"(ro  ot\" \")\" | [a(0f]+ root{2,3}\n";
    zg_grammar *g = grammar_compile(ZG_GBNF, text, strlen(text), err, sizeof err);
    CHECK(v != NULL && g != NULL, "vocab and grammar: %s", err);
    if (!v || !g) goto done;
    /* a path that fills the stack bound, ending where some next tokens would overflow it again */
    const char *path = "(a((a0(faa0f(00(((0(a(a(a(a(a(a(a(a(a(a(a(a(ro  ot)(a(a(0f";
    zg_matcher *m = grammar_matcher_new(g, err, sizeof err);
    uint32_t mask[9];
    int empty = 0, refused = 0, steps = 0, disagree = 0, ended = 0;
    size_t np = strlen(path);
    for (size_t k = 0; m && k < np + 200; k++, steps++) {
        int n = grammar_matcher_mask(m, v, mask);
        if (n == 0) {
            empty++;
            break;
        }
        /* the path, then the last allowed byte (the class's, so the parses keep multiplying) */
        int id = k < np ? (unsigned char)path[k] : -1;
        for (int i = 255; id < 0 && i >= 0; i--)
            if (mask[i >> 5] >> (i & 31) & 1) id = i;
        if (id < 0 || !(mask[id >> 5] >> (id & 31) & 1) || grammar_matcher_accept_token(m, v, id) != 0) {
            refused++;
            break;
        }
    }
    CHECK(empty == 0 && refused == 0 && steps == (int)np + 200, "%d steps: %d empty masks, %d refusals", steps, empty,
          refused);
    /* the mask at the end against accepting each byte on a matcher that replays the path */
    if (m && grammar_matcher_mask(m, v, mask) > 0) {
        for (int b = 0; b < 256; b++) {
            zg_matcher *r = grammar_matcher_new(g, err, sizeof err);
            int ok = r && grammar_matcher_accept_bytes(r, path, np) == 0;
            int acc = ok && grammar_matcher_accept_token(r, v, b) == 0;
            if (ok && acc != (int)(mask[b >> 5] >> (b & 31) & 1)) disagree++;
            grammar_matcher_destroy(&r);
        }
    }
    CHECK(disagree == 0, "the mask disagrees with accepting %d bytes", disagree);
    grammar_matcher_destroy(&m);
    /* from deep in the ambiguity a whole match is still reachable: close with the literal alternative */
    m = grammar_matcher_new(g, err, sizeof err);
    for (int i = 0; m && i < 40 && !ended; i++) {
        if (grammar_matcher_accept_bytes(m, "a(a", 3) != 0) break;
        for (int j = 0; j < 8 && !ended; j++) {
            if (grammar_matcher_accept_bytes(m, "(ro  ot)", 8) != 0) break;
            ended = grammar_matcher_accepting(m);
        }
    }
    CHECK(ended, "no whole match after the ambiguous prefix");
    grammar_matcher_destroy(&m);
done:
    grammar_unref(&g);
    grammar_vocab_destroy(&v);
}

/* the mask of a state at the stack bound (1024 parses), walked every time (no mask cache): a token ending at a trie
 * leaf (here every byte) needs only one parse that takes its last character, and a character no parse's top takes
 * is refused without stepping the parses. Counted in the walk's work units (grammar_matcher_work): stepping every
 * parse for every byte would take 1024 per byte, about 260,000; the walk takes a few thousand */
static void test_ambiguous_mask_cost(void) {
    char err[256];
    zg_vocab *v = s_byte_vocab();
    const char *text = "root ::= \"(ro  ot\" \")\" | [a(0f]+ root{2,3}\n";
    const char *path = "(a((a0(faa0f(00(((0(a(a(a(a(a(a(a(a(a(a(a(a(ro  ot)(a(a(0f";
    zg_grammar *g = grammar_compile(ZG_GBNF, text, strlen(text), err, sizeof err);
    zg_matcher *m = g ? grammar_matcher_new(g, err, sizeof err) : NULL;
    CHECK(v && m && grammar_matcher_accept_bytes(m, path, strlen(path)) == 0, "grammar and path: %s", err);
    if (!v || !m) goto done;
    grammar_mask_cache_limit(g, 0);
    uint32_t mask[9], first[9];
    int n0 = grammar_matcher_mask(m, v, first), same = 0;
    const uint64_t w0 = grammar_matcher_work(m);
    for (int i = 0; i < 100; i++)
        same += grammar_matcher_mask(m, v, mask) == n0 && !memcmp(mask, first, sizeof mask) &&
                grammar_matcher_work(m) == w0;
    CHECK(n0 > 0 && same == 100, "%d of 100 walks gave the first walk's mask (%d ids) and work", same, n0);
    CHECK(w0 > 0 && w0 < 20000, "a mask at the stack bound took %llu work units", (unsigned long long)w0);
    CHECK(!grammar_matcher_spent(m), "a grammar of bounded ambiguity is not spent");
done:
    grammar_matcher_destroy(&m);
    grammar_unref(&g);
    grammar_vocab_destroy(&v);
}

/* a nullable rule repeated inside itself: each step's expansion reaches the same stacks along exponentially many
 * paths unless each stack is expanded once; counted in work units, 64 tokens take a few thousand per mask */
static void test_nullable_nesting(void) {
    char err[256];
    zg_vocab *v = s_byte_vocab();
    const char *text = "root ::= \"\" | [a(0f] . root{2,3}\n";
    zg_grammar *g = grammar_compile(ZG_GBNF, text, strlen(text), err, sizeof err);
    zg_matcher *m = g ? grammar_matcher_new(g, err, sizeof err) : NULL;
    CHECK(v && m, "grammar: %s", err);
    int steps = 0;
    uint64_t worst = 0;
    uint32_t mask[9];
    for (; m && steps < 64; steps++) {
        if (grammar_matcher_mask(m, v, mask) == 0) break;
        worst = grammar_matcher_work(m) > worst ? grammar_matcher_work(m) : worst;
        int id = steps % 2 ? 'x' : 'a'; /* a class character, then any: each pair nests two or three more roots */
        if (!(mask[id >> 5] >> (id & 31) & 1) || grammar_matcher_accept_token(m, v, id) != 0) break;
    }
    CHECK(steps == 64, "stopped after %d tokens", steps);
    CHECK(worst > 0 && worst < 20000, "the worst of 64 masks took %llu work units", (unsigned long long)worst);
    grammar_matcher_destroy(&m);
    grammar_unref(&g);
    grammar_vocab_destroy(&v);
}

/* the work bound (grammar.h): a nullable alternative inside nested counted repetitions costs thousands of work
 * units per trie node the walk enters; its walk stops at the bound, allows nothing, and the matcher then refuses
 * every token. Two matchers of the grammar are spent at the same state with the same work (the bound is
 * deterministic), and a mask remembered by the grammar never stands for a walk that went over */
static void test_work_bound(void) {
    char err[256];
    zg_vocab *v = s_byte_vocab();
    const char *text = "root ::= \"\" | [$(0ff] . root{1,3}{817}\n";
    zg_grammar *g = grammar_compile(ZG_GBNF, text, strlen(text), err, sizeof err);
    zg_matcher *a = g ? grammar_matcher_new(g, err, sizeof err) : NULL;
    zg_matcher *b = g ? grammar_matcher_new(g, err, sizeof err) : NULL;
    CHECK(v && a && b, "grammar: %s", err);
    if (!v || !a || !b) goto done;
    uint32_t mask[9];
    /* the first mask is cheap (one character a token); after one character the walk goes over */
    CHECK(grammar_matcher_mask(a, v, mask) > 0 && grammar_matcher_accept_token(a, v, '$') == 0 &&
              grammar_matcher_mask(b, v, mask) > 0 && grammar_matcher_accept_token(b, v, '$') == 0,
          "the first character");
    int na = grammar_matcher_mask(a, v, mask);
    const uint64_t wa = grammar_matcher_work(a);
    int zero = 1;
    for (int i = 0; i < 9; i++) zero &= mask[i] == 0;
    CHECK(na == 0 && zero && grammar_matcher_spent(a), "over the bound: %d ids allowed, spent %d", na,
          grammar_matcher_spent(a));
    CHECK(wa > ZG_MASK_WORK_BASE && wa <= ZG_MASK_WORK_BASE + 64 * ZG_MASK_WORK_NODE + 1, "stopped at %llu work units",
          (unsigned long long)wa);
    CHECK(grammar_matcher_accept_token(a, v, '$') != 0 && grammar_matcher_accept_bytes(a, "$", 1) != 0,
          "a spent matcher refuses every token");
    int nb = grammar_matcher_mask(b, v, mask);
    CHECK(nb == 0 && grammar_matcher_spent(b) && grammar_matcher_work(b) == wa,
          "the second matcher: %d ids, spent %d, %llu units", nb, grammar_matcher_spent(b),
          (unsigned long long)grammar_matcher_work(b));
    uint64_t hits = 0, misses = 0;
    grammar_mask_cache_stats(g, &hits, &misses, NULL);
    CHECK(hits == 1, "a walk over the bound is not remembered (%llu hits: the first state's only)",
          (unsigned long long)hits);
done:
    grammar_matcher_destroy(&a);
    grammar_matcher_destroy(&b);
    grammar_unref(&g);
    grammar_vocab_destroy(&v);
}

static uint64_t s_rng = 88172645463325252ULL;
static uint32_t s_rand(void) {
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 16);
}

/* random walks: mask, accept an allowed id picked at random; every allowed id must be accepted and leave a
 * non-empty mask, some walks must reach the end of the grammar, and the mask must agree with accepting the token
 * after replaying the walk on a fresh matcher (sampled ids, allowed or not: the walk's memo and the grammar's
 * remembered masks against the plain path) */
static void s_walks(const zg_vocab *v, int kind, const char *text, int walks, int max_steps) {
    char err[256];
    zg_grammar *g = grammar_compile(kind, text, strlen(text), err, sizeof err);
    CHECK(g != NULL, "compile: %s", err);
    if (!g) return;
    int nv = grammar_vocab_size(v), words = (nv + 31) / 32, finished = 0, bad = 0, disagree = 0, probes = 0;
    uint32_t *mask = malloc((size_t)words * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed), hist[256];
    for (int w = 0; w < walks; w++) {
        zg_matcher *m = grammar_matcher_new(g, err, sizeof err);
        int nh = 0;
        for (int step = 0; step < max_steps && step < 256; step++) {
            int n = grammar_matcher_mask(m, v, mask), k = 0;
            if (n == 0) {
                bad++;
                break;
            }
            for (int i = 0; i < nv; i++)
                if (mask[i >> 5] >> (i & 31) & 1) allowed[k++] = i;
            for (int p = 0; p < 12; p++) { /* half among the allowed, half anywhere */
                int32_t c = p % 2 ? allowed[s_rand() % (uint32_t)k] : (int32_t)(s_rand() % (uint32_t)nv);
                zg_matcher *r = grammar_matcher_new(g, err, sizeof err);
                int ok = r != NULL;
                for (int i = 0; ok && i < nh; i++) ok = grammar_matcher_accept_token(r, v, hist[i]) == 0;
                if (ok) {
                    int acc = grammar_matcher_accept_token(r, v, c) == 0;
                    disagree += acc != (int)(mask[c >> 5] >> (c & 31) & 1);
                    probes++;
                }
                grammar_matcher_destroy(&r);
            }
            int32_t id = allowed[s_rand() % (uint32_t)k];
            if (grammar_matcher_accept_token(m, v, id) != 0) {
                bad++;
                break;
            }
            hist[nh++] = id;
            if (!grammar_matcher_can_continue(m)) {
                if (grammar_matcher_accepting(m)) finished++;
                break;
            }
        }
        grammar_matcher_destroy(&m);
    }
    CHECK(bad == 0, "%s: %d walks hit a refused allowed token or an empty mask", text, bad);
    CHECK(finished > 0, "%s: no walk finished (%d walks)", text, walks);
    CHECK(probes > 100 && disagree == 0, "%s: the mask disagrees with accepting the token %d times of %d", text,
          disagree, probes);
    free(mask);
    free(allowed);
    grammar_unref(&g);
}

static void test_vocab_walks(void) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-bpe.gguf", test_fixtures());
    gguf *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL, "open %s: %s", path, err);
    if (!f) return;
    zl_tokenizer *t = tokenizer_new(f, err, sizeof err);
    CHECK(t != NULL, "tokenizer: %s", err);
    zg_vocab *v = t ? grammar_vocab_from_tokenizer(t, err, sizeof err) : NULL;
    CHECK(v != NULL, "vocab: %s", err);
    if (v) {
        s_walks(v, ZG_REGEX, "[a-c]{1,3}(\\.[\\u00e0-\\u00ff\\u4e00-\\u4e0f]{1,4}){0,3}", 40, 64);
        s_walks(v, ZG_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"x y\",\"\\u00e9t\\u00e9\"]},\"n\":{\"type\":"
                "\"integer\"}},\"required\":[\"k\",\"n\"],\"additionalProperties\":false}",
                40, 64);
    }
    grammar_vocab_destroy(&v);
    tokenizer_destroy(&t);
    gguf_close(&f);
}

/* the grammar's remembered masks give bit for bit what a walk gives: matchers of a grammar with the cache and of
 * the same text compiled again without it advance in lockstep along random walks (several walks per grammar, so
 * states repeat and hit), every mask and count compared; then again with a bound of a few masks (evictions) */
static void s_cache_exact(const zg_vocab *v, int kind, const char *text, int walks, int max_steps) {
    char err[256];
    zg_grammar *g = grammar_compile(kind, text, strlen(text), err, sizeof err);
    zg_grammar *ref = grammar_compile(kind, text, strlen(text), err, sizeof err);
    CHECK(g && ref, "compile: %s", err);
    if (!g || !ref) goto done;
    grammar_mask_cache_limit(ref, 0);
    int nv = grammar_vocab_size(v), words = (nv + 31) / 32, differ = 0, masks = 0;
    uint32_t *a = malloc((size_t)words * 4), *b = malloc((size_t)words * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    for (int round = 0; round < 2; round++) {
        if (round == 1) grammar_mask_cache_limit(g, (size_t)words * 4 * 3);
        for (int w = 0; w < walks; w++) {
            zg_matcher *ma = grammar_matcher_new(g, err, sizeof err), *mb = grammar_matcher_new(ref, err, sizeof err);
            for (int step = 0; ma && mb && step < max_steps; step++) {
                int na = grammar_matcher_mask(ma, v, a), nb = grammar_matcher_mask(mb, v, b), k = 0;
                masks++;
                if (na != nb || memcmp(a, b, (size_t)words * 4) != 0) {
                    differ++;
                    break;
                }
                for (int i = 0; i < nv; i++)
                    if (b[i >> 5] >> (i & 31) & 1) allowed[k++] = i;
                if (k == 0) break;
                int32_t id = allowed[s_rand() % (uint32_t)k];
                if (grammar_matcher_accept_token(ma, v, id) != 0 || grammar_matcher_accept_token(mb, v, id) != 0 ||
                    !grammar_matcher_can_continue(mb))
                    break;
            }
            grammar_matcher_destroy(&ma);
            grammar_matcher_destroy(&mb);
        }
    }
    uint64_t hits = 0, misses = 0, rhits = 0;
    size_t bytes = 0;
    grammar_mask_cache_stats(g, &hits, &misses, &bytes);
    grammar_mask_cache_stats(ref, &rhits, NULL, NULL);
    CHECK(differ == 0, "%s: %d of %d remembered masks differ from a walk's", text, differ, masks);
    CHECK(hits > (uint64_t)masks / 4 && rhits == 0, "%s: %llu hits, %llu misses over %d masks (%llu without cache)",
          text, (unsigned long long)hits, (unsigned long long)misses, masks, (unsigned long long)rhits);
    CHECK(bytes <= (size_t)words * 4 * 3, "%s: %zu bytes past the bound", text, bytes);
    free(a);
    free(b);
    free(allowed);
done:
    grammar_unref(&g);
    grammar_unref(&ref);
}

/* matchers of one grammar masking on several threads at once (as the worker's mask threads do): each thread
 * walks its own matchers, every mask compared with a cache-less twin's */
typedef struct {
    const zg_vocab *v;
    zg_grammar *g, *ref;
    uint64_t seed;
    int walks, steps, masks, differ;
} s_mt_job;

static void *s_mt_run(void *arg) {
    s_mt_job *j = arg;
    char err[256];
    int nv = grammar_vocab_size(j->v), words = (nv + 31) / 32;
    uint32_t *a = malloc((size_t)words * 4), *b = malloc((size_t)words * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    uint64_t x = j->seed;
    for (int w = 0; a && b && allowed && w < j->walks; w++) {
        zg_matcher *ma = grammar_matcher_new(j->g, err, sizeof err), *mb = grammar_matcher_new(j->ref, err, sizeof err);
        for (int step = 0; ma && mb && step < j->steps; step++) {
            int na = grammar_matcher_mask(ma, j->v, a), nb = grammar_matcher_mask(mb, j->v, b), k = 0;
            j->masks++;
            if (na != nb || memcmp(a, b, (size_t)words * 4) != 0) {
                j->differ++;
                break;
            }
            for (int i = 0; i < nv; i++)
                if (b[i >> 5] >> (i & 31) & 1) allowed[k++] = i;
            if (k == 0) break;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int32_t id = allowed[(x >> 16) % (uint64_t)k];
            if (grammar_matcher_accept_token(ma, j->v, id) != 0 || grammar_matcher_accept_token(mb, j->v, id) != 0 ||
                !grammar_matcher_can_continue(mb))
                break;
        }
        grammar_matcher_destroy(&ma);
        grammar_matcher_destroy(&mb);
    }
    free(a);
    free(b);
    free(allowed);
    return NULL;
}

static void s_cache_threads(const zg_vocab *v, int kind, const char *text) {
    char err[256];
    zg_grammar *g = grammar_compile(kind, text, strlen(text), err, sizeof err);
    zg_grammar *ref = grammar_compile(kind, text, strlen(text), err, sizeof err);
    CHECK(g && ref, "compile: %s", err);
    if (g && ref) {
        grammar_mask_cache_limit(ref, 0);
        grammar_mask_cache_limit(g, (size_t)((grammar_vocab_size(v) + 31) / 32) * 4 * 40); /* evictions too */
        s_mt_job jobs[4];
        pthread_t th[4];
        int started = 0, masks = 0, differ = 0;
        for (int i = 0; i < 4; i++) {
            jobs[i] = (s_mt_job){v, g, ref, 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1), 40, 16, 0, 0};
            if (pthread_create(&th[i], NULL, s_mt_run, &jobs[i]) == 0) started++;
        }
        for (int i = 0; i < started; i++) {
            pthread_join(th[i], NULL);
            masks += jobs[i].masks;
            differ += jobs[i].differ;
        }
        uint64_t hits = 0;
        grammar_mask_cache_stats(g, &hits, NULL, NULL);
        CHECK(started == 4 && differ == 0 && masks > 100 && hits > 0,
              "%s: 4 threads: %d of %d masks differ from a walk's (%llu hits)", text, differ, masks,
              (unsigned long long)hits);
    }
    grammar_unref(&g);
    grammar_unref(&ref);
}

static void test_mask_cache(void) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-bpe.gguf", test_fixtures());
    gguf *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL, "open %s: %s", path, err);
    if (!f) return;
    zl_tokenizer *t = tokenizer_new(f, err, sizeof err);
    zg_vocab *v = t ? grammar_vocab_from_tokenizer(t, err, sizeof err) : NULL;
    CHECK(v != NULL, "vocab: %s", err);
    zg_vocab *bytes = s_byte_vocab(); /* every character split into bytes: the pending bits decide what follows */
    if (bytes)
        s_cache_exact(bytes, ZG_GBNF,
                      "root ::= ([a-c] | [\\u00e0-\\u00ef] | [\\u4e00-\\u9fff] | [\\U0001F600-\\U0001F64F])+ \".\"\n",
                      200, 16);
    if (bytes)
        s_cache_threads(
            bytes, ZG_GBNF,
            "root ::= ([a-c] | [\\u00e0-\\u00ef] | [\\u4e00-\\u9fff] | [\\U0001F600-\\U0001F64F])+ \".\"\n");
    grammar_vocab_destroy(&bytes);
    if (v) {
        s_cache_exact(v, ZG_REGEX, "[a-c]{1,3}(\\.[\\u00e0-\\u00ff\\u4e00-\\u4e0f]{1,4}){0,3}", 12, 24);
        s_cache_exact(v, ZG_GBNF,
                      "root ::= ([a-z ] | [\\u00e0-\\u00ef] | [\\u4e00-\\u9fff] | [\\U0001F600-\\U0001F64F])+ \".\"\n",
                      12, 24);
        s_cache_exact(
            v, ZG_JSON_SCHEMA,
            "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
            "\"maxLength\":12}}},\"required\":[\"items\"],\"additionalProperties\":false}",
            12, 48);
        s_cache_exact(v, ZG_JSON_OBJECT, "", 8, 48);
    }
    grammar_vocab_destroy(&v);
    tokenizer_destroy(&t);
    gguf_close(&f);
}

static void test_cache(void) {
    zg_cache *c = grammar_cache_new(2);
    char err[256];
    const char *a = "root ::= \"a\"\n", *b = "root ::= \"b\"\n";
    zg_grammar *g1 = grammar_cache_get(c, ZG_GBNF, a, strlen(a), err, sizeof err);
    zg_grammar *g2 = grammar_cache_get(c, ZG_GBNF, a, strlen(a), err, sizeof err);
    CHECK(g1 && g1 == g2 && grammar_cache_hits(c) == 1, "second get is a hit on the same grammar");
    zg_grammar *g3 = grammar_cache_get(c, ZG_REGEX, a, strlen(a), err, sizeof err);
    CHECK(g3 != g1, "the kind is part of the key");
    zg_grammar *g4 = grammar_cache_get(c, ZG_GBNF, b, strlen(b), err, sizeof err);
    CHECK(g4 && grammar_cache_hits(c) == 1, "a miss compiles");
    CHECK(!grammar_cache_get(c, ZG_GBNF, "x", 1, err, sizeof err), "failures are not cached: %s", err);
    grammar_unref(&g1);
    grammar_unref(&g2);
    grammar_unref(&g3);
    grammar_unref(&g4);
    grammar_cache_destroy(&c);
}

int main(void) {
    test_gbnf();
    test_regex();
    test_schema();
    test_mask();
    test_ambiguous();
    test_ambiguous_mask_cost();
    test_dead_ends();
    test_nullable_nesting();
    test_work_bound();
    test_vocab_walks();
    test_mask_cache();
    test_cache();
    return test_report();
}
