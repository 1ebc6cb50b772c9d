/* common/jinja_int.h: the Jinja interpreter's internals, shared by jinja_value.c (arena, values, text forms),
 * jinja_lex.c (tokens), jinja_parse.c (AST), jinja_eval.c (statements, expressions) and jinja_builtin.c
 * (filters, tests, methods, global functions). Not for use outside common/jinja*.c. */
#ifndef ZLLM_JINJA_INT_H
#define ZLLM_JINJA_INT_H
#include "jinja.h"

#include <stdarg.h>
#include <stddef.h>

struct jv_str {
    size_t n;
    char s[];
}; /* NUL-terminated UTF-8, n bytes */
struct jv_list {
    size_t n, cap;
    jv *v;
    int tuple;
    int kind; /* LK_*: what Python object the items stand for (see jinja_value.c) */
};
/* a plain list; the generator that jinja2's select, reject, map, items and unique filters return (always true,
 * no len(), not subscriptable, not JSON); the views of dict.items(), .keys(), .values() (not subscriptable) */
enum { LK_LIST = 0, LK_GEN, LK_ITEMS, LK_KEYS, LK_VALUES };
struct jv_dict {
    size_t n, cap;
    jv *k, *v;
    int ns;
}; /* insertion-ordered; ns: a namespace() */

typedef struct jnode jnode;
enum { FN_BUILTIN, FN_METHOD, FN_MACRO };
struct jv_func {
    int kind;
    const char *name;       /* builtin or method name */
    jv self;                /* FN_METHOD: the bound object */
    const jnode *macro;     /* FN_MACRO: its definition */
    struct jscope *closure; /* FN_MACRO: the scope it was defined in */
};

/* ---- arena: every value of one render, freed at once; bounded by max_memory ---- */
typedef struct jarena {
    struct jchunk *head;
    size_t used, cap; /* bytes handed out, bound */
    int oom;          /* set when an allocation failed or went over the bound */
    int over;         /* set when it went over the bound */
} jarena;
void *ja_alloc(jarena *a, size_t n);
void ja_free_all(jarena *a);

/* ---- growing byte buffer ---- */
typedef struct {
    char *p;
    size_t n, cap, max;
    int over; /* malloc failed or passed max */
    int deep; /* a value was nested too deeply to print */
} jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_printf(jbuf *b, const char *fmt, ...);

/* ---- errors ---- */
typedef struct {
    int code;
    int line;
    char msg[256];
} jerr;
int jerr_set(jerr *e, int code, int line, const char *fmt, ...); /* returns code; keeps the first error */

/* ---- tokens ---- */
enum {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP
};
typedef struct {
    int type, line;
    const char *s; /* TK_DATA, TK_NAME, TK_OP: the text; TK_STRING: the unescaped value (each malloc'd) */
    size_t n;      /* its length */
    int64_t i;
    double f;
} jtok;
/* tokenizes src (newlines normalised, one trailing newline dropped, trim_blocks and lstrip_blocks applied);
 * *toks is malloc'd and ends with TK_EOF; jlex_free frees it and the tokens' texts. Returns 0 or the error code. */
int jlex(const char *src, size_t len, jtok **toks, int *ntok, jerr *e);
void jlex_free(jtok *toks, int ntok);

/* ---- AST ---- */
enum {
    /* statements */
    JN_TEXT,
    JN_OUTPUT,
    JN_BLOCK,
    JN_IF,
    JN_FOR,
    JN_SET,
    JN_SETBLOCK,
    JN_MACRO,
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_LIT,
    JN_NAME,
    JN_LIST,
    JN_TUPLE,
    JN_DICT,
    JN_ATTR,
    JN_ITEM,
    JN_SLICE,
    JN_CALL,
    JN_KWARG,
    JN_FILTER,
    JN_TEST,
    JN_NEG,
    JN_POS,
    JN_NOT,
    JN_AND,
    JN_OR,
    JN_BIN,
    JN_CMP,
    JN_COND,
};
enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN
};
struct jnode {
    int kind, line, op;   /* op: OP_* (JN_BIN, JN_CMP chain entries), negated (JN_TEST) */
    int h;                /* expression height (bounds the evaluator's recursion) */
    const char *name;     /* names, attributes, filters, tests, macros, kwargs */
    jv lit;               /* JN_LIT, JN_TEXT */
    jnode *a, *b, *c, *d; /* children (see jinja_parse.c) */
    jnode **kids;
    int nkids; /* bodies, arguments, items */
};

struct jinja_tmpl {
    jarena arena; /* nodes, names and literals */
    jnode *root;
    jinja_limits lim;
};

/* ---- values ---- */
struct jinja_env {
    jarena arena;
    jinja_limits lim;
    jv globals; /* a dict */
    jerr err;
    long iters; /* loop iterations so far */
    int deep;   /* a value nested too deeply to print was met */
    int calls;  /* macro call nesting */
    jbuf out;
};
jv jv_undef(const char *name);
jv jv_str_of(jinja_env *e, const char *s); /* NUL-terminated */
jv jv_tuple_new(jinja_env *e);
int jv_truthy(jv v);
int jv_equal(jv a, jv b);
int jv_dict_get(jv d, const char *key, size_t n, jv *out); /* 1 when found */
int jv_dict_find(jv d, jv key, jv *out);
const char *jv_type_name(jv v);
/* str(v) as Python prints it ({{ }}); repr(v) as in containers; json as json.dumps(ensure_ascii=False) */
void jv_to_str(jbuf *b, jv v);
void jv_repr(jbuf *b, jv v);
int jv_to_json(jbuf *b, jv v, int indent, int level, const char *item_sep, const char *key_sep, int sort_keys,
               int depth);
jv jv_from_buf(jinja_env *e, jbuf *b); /* a string value of b's bytes; frees b */
int jerr_oom(jinja_env *e, int line);  /* the error for a failed allocation: memory bound, nesting or malloc */

/* ---- UTF-8 and Python string helpers ---- */
int ju_space_len(const char *s, const char *end);       /* the str.isspace() character at s, or 0 */
size_t ju_cplen(const char *s, size_t n);               /* code points */
size_t ju_cp_offset(const char *s, size_t n, size_t k); /* byte offset of code point k (n when past the end) */
void ju_strip(const char **s, size_t *n, const char *chars, size_t nchars, int left, int right);

/* ---- evaluation (jinja_eval.c) and builtins (jinja_builtin.c) ---- */
typedef struct jscope jscope;
int jeval_expr(jinja_env *e, jscope *sc, const jnode *n, jv *out);
int jeval_call_value(jinja_env *e, jscope *sc, jv fn, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line,
                     jv *out);
jv jeval_getattr(jinja_env *e, jv obj, const char *name, size_t n);
jv jeval_getitem(jinja_env *e, jv obj, jv key);
int jbi_filter(jinja_env *e, jscope *sc, const char *name, jv v, jv *args, int nargs, const char **kwn, jv *kwv,
               int nkw, int line, jv *out);
int jbi_test(jinja_env *e, jscope *sc, const char *name, jv v, jv *args, int nargs, int line, int *out);
int jbi_call(jinja_env *e, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line,
             jv *out);
int jbi_method(jinja_env *e, jv self, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw,
               int line, jv *out);
int jbi_has_method(jv self, const char *name);
int jbi_known_filter(const char *name);
int jbi_known_test(const char *name);
#endif
