/* common/grammar.h: structured output. Compiles a JSON schema, a regular expression or a GBNF grammar
 * (llama.cpp's notation) into one context-free grammar over Unicode code points, and matches token byte strings
 * against it: the allowed-token mask of each decoding step (docs/structured-output.md).
 *
 * Where it runs: the broker compiles a request's grammar once to refuse a bad one before anything is queued; the
 * worker compiles it again (both through a cache keyed by a hash of kind and text, so a repeated schema costs a
 * lookup), keeps one matcher per sequence, computes each sampling step's mask on the CPU and hands it to the
 * engine (zl_seq.mask), which applies it to the logits before sampling. End-of-generation ids are allowed
 * exactly when the grammar accepts what came so far.
 *
 * Everything here treats its input as hostile: bounded sizes and depths, errors as messages, no asserts. */
#ifndef ZLLM_GRAMMAR_H
#define ZLLM_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>

/* kinds of constraint (the protocol's response_format types) */
enum {
    ZG_NONE = 0,
    ZG_JSON_SCHEMA = 1, /* a JSON schema (OpenAI's strict subset, docs/structured-output.md) */
    ZG_JSON_OBJECT = 2, /* any JSON object (text ignored) */
    ZG_REGEX = 3,       /* a regular expression the whole output must match */
    ZG_GBNF = 4,        /* a GBNF grammar whose rule `root` the whole output must match */
};

#define ZG_MAX_TEXT (64 * 1024) /* longest schema, regex or grammar text accepted (PROTO_FORMAT_MAX_LEN) */

typedef struct zg_grammar zg_grammar; /* compiled, immutable, reference counted */
typedef struct zg_vocab zg_vocab;     /* a tokenizer's token byte strings as a trie */
typedef struct zg_matcher zg_matcher; /* one sequence's position in a grammar */
typedef struct zg_cache zg_cache;     /* compiled grammars by hash of kind and text */

/* the kind named by a protocol string ("json_schema", "json_object", "regex", "grammar"), or -1 */
int grammar_kind_parse(const char *name);
const char *grammar_kind_name(int kind);

/* Compiles text[len] of kind. Returns a grammar holding one reference, or NULL with a message in err: a syntax
 * error (with its offset), an undefined rule, left recursion, an unsupported schema keyword, a grammar that
 * derives no finite string (unsatisfiable), or input beyond the limits. */
zg_grammar *grammar_compile(int kind, const char *text, size_t len, char *err, size_t errlen);
/* the GBNF text a JSON schema or regex is translated into before compiling (kind ZG_GBNF: a copy), for
 * debugging and tests; malloc'd, or NULL with err */
char *grammar_to_gbnf(int kind, const char *text, size_t len, char *err, size_t errlen);
zg_grammar *grammar_ref(zg_grammar *g); /* one more reference (atomic: any thread); returns g */
void grammar_unref(zg_grammar **g);     /* drops one reference, frees on the last; sets *g to NULL */
int grammar_kind(const zg_grammar *g);
int grammar_rules(const zg_grammar *g); /* rules after translation (tests, the benchmark) */

/* A vocabulary: bytes[i][lens[i]] is what token i adds to the text (empty for control tokens, which a grammar
 * never allows); eog[i] != 0 marks the end-of-generation ids. Copies what it needs. NULL with err. */
zg_vocab *grammar_vocab_new(int n_vocab, const char *const *bytes, const size_t *lens, const uint8_t *eog, char *err,
                            size_t errlen);
struct zl_tokenizer;
/* the vocabulary of a tokenizer (common/grammar_tok.c) */
zg_vocab *grammar_vocab_from_tokenizer(const struct zl_tokenizer *t, char *err, size_t errlen);
void grammar_vocab_destroy(zg_vocab **v);
int grammar_vocab_size(const zg_vocab *v);

zg_matcher *grammar_matcher_new(zg_grammar *g, char *err, size_t errlen); /* takes a reference of g */
void grammar_matcher_destroy(zg_matcher **m);
/* Advances by bytes[n]. 0, or -1 when the grammar refuses them (the matcher is then unchanged). */
int grammar_matcher_accept_bytes(zg_matcher *m, const char *bytes, size_t n);
/* Advances by token id's bytes. An end-of-generation id is accepted when the grammar accepts (the matcher is then
 * finished). 0, or -1 when refused (unchanged). */
int grammar_matcher_accept_token(zg_matcher *m, const zg_vocab *v, int32_t id);
int grammar_matcher_accepting(const zg_matcher *m);    /* 1: what came so far is a whole match */
int grammar_matcher_can_continue(const zg_matcher *m); /* 1: some continuation by more text is possible */
/* Writes the allowed ids of the next token (matchers may mask on several threads at once, one thread per
 * matcher: what they share is locked) as bits (bit i of mask[i / 32]) over (vocab + 31) / 32 words: the
 * tokens whose bytes the grammar accepts next, and the end-of-generation ids when it accepts now. Returns the
 * number of allowed ids (0 only for a matcher that cannot go on and does not accept: never after a successful
 * accept, since every allowed token leaves an accepting or continuable state). */
int grammar_matcher_mask(zg_matcher *m, const zg_vocab *v, uint32_t *mask);
/* A mask walk's work is bounded. Its units are a stack expanded or a stack stepped by a code point; a walk may
 * spend ZG_MASK_WORK_BASE units plus ZG_MASK_WORK_NODE per vocabulary trie node it entered (a prefix the grammar
 * takes), and never more than ZG_MASK_WORK. A walk that would go past its bound stops, its mask allows nothing
 * (count 0) and the matcher is spent: it refuses every token from then on, so its sequence ends with an error, as
 * with a mask that nothing can satisfy. The work depends only on the parse state, the grammar and the vocabulary,
 * so the same request is spent at the same token on every run, in any batch. Grammars of real use spend a few
 * units per node entered (JSON schemas at most about 30, over SmolLM2's and Gemma 3's vocabularies) and at most a
 * few hundred thousand in all; a highly ambiguous grammar, such as a nullable alternative inside nested counted
 * repetitions, spends thousands per node, and is spent within about ZG_MASK_WORK_BASE units (about 10 ms) instead
 * of costing up to a second per mask. */
#define ZG_MASK_WORK_BASE ((uint64_t)1 << 16)
#define ZG_MASK_WORK_NODE 64
#define ZG_MASK_WORK ((uint64_t)1 << 22)
uint64_t grammar_matcher_work(const zg_matcher *m); /* the last mask walk's work units (0 for a remembered mask) */
int grammar_matcher_spent(const zg_matcher *m);     /* 1: a walk went over ZG_MASK_WORK */

/* The masks a grammar remembers by parse state, shared by all its matchers: a state seen before costs a copy of
 * its mask (bit for bit what a walk gives). Bounded by bytes: ZG_MASK_CACHE_BYTES per grammar by default (0: no
 * cache), ZG_MASK_CACHE_TOTAL over every grammar of the process; the least recently used masks go first. */
#define ZG_MASK_CACHE_BYTES ((size_t)32 << 20)
#define ZG_MASK_CACHE_TOTAL ((size_t)256 << 20)
void grammar_mask_cache_limit(zg_grammar *g, size_t bytes);
/* lookups that found a mask, lookups that walked, bytes held now (any pointer may be NULL) */
void grammar_mask_cache_stats(zg_grammar *g, uint64_t *hits, uint64_t *misses, size_t *bytes);

/* a cache of compiled grammars: up to cap entries, least recently used dropped first */
zg_cache *grammar_cache_new(int cap);
void grammar_cache_destroy(zg_cache **c);
/* the compiled grammar of (kind, text), compiled on a miss; a new reference (grammar_unref it), or NULL with
 * err (failures are not cached) */
zg_grammar *grammar_cache_get(zg_cache *c, int kind, const char *text, size_t len, char *err, size_t errlen);
uint64_t grammar_cache_hits(const zg_cache *c);
#endif
