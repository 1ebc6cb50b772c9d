/* common/grammar_int.h: what the grammar modules share (not for other layers).
 *
 * A compiled grammar is one array of elements. Rule r's alternatives start at el[rule_start[r]], each a sequence
 * of elements ended by ZG_ALT (another alternative follows) or ZG_END (the rule's last). A character class is
 * ZG_CHAR or ZG_CHAR_NOT with the first range's low end, optionally ZG_RNG_UPPER with its high end, then
 * ZG_CHAR_ALT (+ ZG_RNG_UPPER) per further range; ZG_CHAR_ANY is any code point. This is llama.cpp's layout. */
#ifndef ZLLM_GRAMMAR_INT_H
#define ZLLM_GRAMMAR_INT_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "grammar.h"

enum { ZG_END = 0, ZG_ALT, ZG_REF, ZG_CHAR, ZG_CHAR_NOT, ZG_RNG_UPPER, ZG_CHAR_ALT, ZG_CHAR_ANY };

#define ZG_MAX_ELEMS (1 << 20) /* elements of one compiled grammar */
#define ZG_MAX_RULES (1 << 16) /* rules of one compiled grammar */
#define ZG_MAX_REPEAT 1000     /* largest bound of a {m,n} repetition */
#define ZG_MAX_DEPTH 64        /* nesting of schemas, JSON values, regex and grammar groups */

typedef struct {
    uint32_t type; /* ZG_* above */
    uint32_t val;  /* rule id (ZG_REF) or code point */
} zg_elem;

/* the masks a grammar remembers by parse state (grammar_mcache.c): a hash table and a least-recently-used list
 * bounded by bytes (limit per grammar, ZG_MASK_CACHE_TOTAL over all); lock guards every field (matchers of one
 * grammar mask on several threads at once). Valid for one vocabulary (vocab): another one empties it. */
typedef struct zg_mc_entry zg_mc_entry;
typedef struct {
    pthread_mutex_t lock;
    const void *vocab;
    zg_mc_entry **bucket; /* [nb] hash chains, NULL until the first entry */
    int nb, n;
    zg_mc_entry *newest, *oldest;
    size_t bytes, limit;
    uint64_t hits, misses;
} zg_mcache;
void zg_mcache_init(zg_mcache *c);
void zg_mcache_free(zg_mcache *c);
/* copies the mask of key[klen] (hash h) into mask[words] and returns its allowed count, or -1 on a miss */
int zg_mcache_get(zg_mcache *c, const void *vocab, uint64_t h, const int32_t *key, int klen, uint32_t *mask,
                  size_t words);
/* remembers mask[words] (count allowed ids) for key[klen], dropping the oldest entries past the bounds */
void zg_mcache_put(zg_mcache *c, const void *vocab, uint64_t h, const int32_t *key, int klen, const uint32_t *mask,
                   size_t words, int count);

struct zg_grammar {
    int refs;
    zg_mcache mc; /* masks by parse state, shared by every matcher of this grammar */
    int kind;
    zg_elem *el;
    int32_t *alt_end; /* [n_el]: the index of the ZG_ALT or ZG_END closing the alternative that holds element i, so
                       * that stepping to the next alternative costs nothing however long the alternative is */
    int n_el;
    int *rule_start; /* [n_rules] */
    int n_rules;
    int root;
};

/* a growable string */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} zg_buf;
void zg_buf_put(zg_buf *b, const char *s, size_t n);
void zg_buf_str(zg_buf *b, const char *s);
void zg_buf_fmt(zg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* appends code point cp as a GBNF character escape usable inside "..." and [...] */
void zg_buf_cp(zg_buf *b, uint32_t cp);

/* grammar_match.c: does the union of a character class's ranges (cls[0 .. n): the first element, ZG_RNG_UPPER
 * and ZG_CHAR_ALT ones, negation aside) cover every code point of [lo, hi] */
int zg_class_covers(const zg_elem *cls, int n, uint32_t lo, uint32_t hi);
/* grammar_gbnf.c: parses and checks GBNF text into a grammar (refs 1), or NULL with err */
zg_grammar *zg_gbnf_compile(const char *text, size_t len, char *err, size_t errlen);
/* grammar_schema.c: JSON schema (or, json_object, any object) to GBNF text in *out; 0 or -1 with err */
int zg_schema_to_gbnf(const char *text, size_t len, int any_object, zg_buf *out, char *err, size_t errlen);
/* grammar_regex.c: a regular expression as GBNF rule `name` appended to out; json: the match is the content of a
 * JSON string (its characters as a JSON string writes them); 0 or -1 with err */
int zg_regex_to_gbnf(const char *re, size_t len, const char *name, int json, zg_buf *out, char *err, size_t errlen);
/* grammar_json.c: a JSON value (the schema reader's input) */
enum { ZJ_NULL, ZJ_FALSE, ZJ_TRUE, ZJ_NUMBER, ZJ_STRING, ZJ_ARRAY, ZJ_OBJECT };
typedef struct zj_value {
    int type;
    char *str; /* ZJ_STRING: decoded UTF-8 (NUL-terminated; slen bytes, may hold NULs); ZJ_NUMBER: its text */
    size_t slen;
    double num;              /* ZJ_NUMBER */
    struct zj_value **items; /* ZJ_ARRAY items, ZJ_OBJECT values */
    char **keys;             /* ZJ_OBJECT keys (NUL-terminated) */
    int n;
} zj_value;
/* parses text[len] (one JSON value, strict RFC 8259, nesting up to ZG_MAX_DEPTH); NULL with err */
zj_value *zj_parse(const char *text, size_t len, char *err, size_t errlen);
void zj_free(zj_value *v);
zj_value *zj_get(const zj_value *obj, const char *key); /* an object's member, or NULL */
/* appends v as compact JSON text */
void zj_write(const zj_value *v, zg_buf *out);
/* decodes one UTF-8 code point from s[*i..n), advancing *i; -1 on invalid UTF-8 */
int32_t zg_utf8_next(const char *s, size_t n, size_t *i);
#endif
