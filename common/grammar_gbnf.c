/* common/grammar_gbnf.c: GBNF (llama.cpp's grammar notation) to the element array of grammar_int.h, with the
 * checks that make matching safe: every referenced rule defined, a rule `root`, no left recursion (a rule that
 * reaches itself before consuming a character would expand forever), and a root that derives some finite string
 * (else the grammar is unsatisfiable).
 *
 * Notation: `name ::= alternatives` per rule; a rule ends at a newline outside parentheses; "literal" with
 * escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH; [a-z] classes, [^...] negated; `.` any code point; (groups);
 * `|`; postfix * + ? {m} {m,} {m,n}; # comments. Repetitions become generated right-recursive rules, as llama.cpp
 * does, so that a matcher's stacks do not grow with them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

void zg_buf_put(zg_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void zg_buf_str(zg_buf *b, const char *s) { zg_buf_put(b, s, strlen(s)); }

void zg_buf_fmt(zg_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        zg_buf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    zg_buf_put(b, big, (size_t)n);
    free(big);
}

void zg_buf_cp(zg_buf *b, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ' || cp == '_' ||
        cp == ',' || cp == ':' || cp == '{' || cp == '}' || cp == '.' || cp == '+') {
        char c = (char)cp;
        zg_buf_put(b, &c, 1);
    } else if (cp < 0x100) {
        zg_buf_fmt(b, "\\x%02X", cp);
    } else if (cp < 0x10000) {
        zg_buf_fmt(b, "\\u%04X", cp);
    } else {
        zg_buf_fmt(b, "\\U%08X", cp);
    }
}

int32_t zg_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    if (*i >= n) return -1;
    unsigned c = u[(*i)++];
    if (c < 0x80) return (int32_t)c;
    int more;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) more = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) more = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) more = 3, cp = c & 0x07, min = 0x10000;
    else return -1;
    while (more--) {
        if (*i >= n || (u[*i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (u[(*i)++] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    return (int32_t)cp;
}

/* ---- the parser ---- */

typedef struct {
    zg_elem *e;
    int n, cap;
} s_vec;

typedef struct {
    const char *src, *end;
    char **names; /* [n_rules] rule names (generated ones: base-N) */
    s_vec *rules; /* [n_rules] their elements; n == 0 until defined */
    int *defined; /* [n_rules] */
    int n_rules, cap_rules;
    int total; /* elements so far */
    int depth;
    char *err;
    size_t errlen;
    int failed;
} s_parser;

static void s_fail(s_parser *p, const char *at, const char *msg) {
    if (p->failed) return;
    p->failed = 1;
    if (at) snprintf(p->err, p->errlen, "grammar: %s at offset %ld", msg, (long)(at - p->src));
    else snprintf(p->err, p->errlen, "grammar: %s", msg);
}

static void s_push(s_parser *p, s_vec *v, uint32_t type, uint32_t val) {
    if (p->failed) return;
    if (++p->total > ZG_MAX_ELEMS) {
        s_fail(p, NULL, "too large (elements)");
        return;
    }
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 16;
        zg_elem *e = realloc(v->e, (size_t)cap * sizeof *e);
        if (!e) {
            s_fail(p, NULL, "out of memory");
            return;
        }
        v->e = e;
        v->cap = cap;
    }
    v->e[v->n++] = (zg_elem){type, val};
}

static int s_symbol(s_parser *p, const char *name, size_t len, int fresh) {
    if (!fresh)
        for (int i = 0; i < p->n_rules; i++)
            if (strlen(p->names[i]) == len && memcmp(p->names[i], name, len) == 0) return i;
    if (p->n_rules >= ZG_MAX_RULES) {
        s_fail(p, NULL, "too many rules");
        return -1;
    }
    if (p->n_rules == p->cap_rules) {
        int cap = p->cap_rules ? p->cap_rules * 2 : 32;
        char **nm = realloc(p->names, (size_t)cap * sizeof *nm);
        if (nm) p->names = nm;
        s_vec *rv = realloc(p->rules, (size_t)cap * sizeof *rv);
        if (rv) p->rules = rv;
        int *df = realloc(p->defined, (size_t)cap * sizeof *df);
        if (df) p->defined = df;
        if (!nm || !rv || !df) {
            s_fail(p, NULL, "out of memory");
            return -1;
        }
        p->cap_rules = cap;
    }
    char *copy = malloc(len + 16);
    if (!copy) {
        s_fail(p, NULL, "out of memory");
        return -1;
    }
    memcpy(copy, name, len);
    if (fresh) snprintf(copy + len, 16, "-%d", p->n_rules);
    else copy[len] = 0;
    int id = p->n_rules++;
    p->names[id] = copy;
    memset(&p->rules[id], 0, sizeof p->rules[id]);
    p->defined[id] = 0;
    return id;
}

static int s_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static const char *s_space(s_parser *p, const char *s, int newline_ok) {
    while (s < p->end) {
        if (*s == ' ' || *s == '\t' || (newline_ok && (*s == '\r' || *s == '\n'))) s++;
        else if (*s == '#') {
            while (s < p->end && *s != '\n' && *s != '\r') s++;
        } else break;
    }
    return s;
}

static int s_hex(const char *s, const char *end, int n, uint32_t *out) {
    uint32_t v = 0;
    if (end - s < n) return -1;
    for (int i = 0; i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* does the class cls[0 .. n) take some character (a code point outside the surrogates): a class of surrogates
 * only, or a negated one covering every character, would leave the matcher waiting for what no text holds */
static int s_class_admits(const zg_elem *cls, int n) {
    if (cls[0].type == ZG_CHAR_NOT)
        return !zg_class_covers(cls, n, 0, 0xD7FF) || !zg_class_covers(cls, n, 0xE000, 0x10FFFF);
    for (int i = 0; i < n; i++) {
        uint32_t a = cls[i].val, b = a;
        if (i + 1 < n && cls[i + 1].type == ZG_RNG_UPPER) b = cls[++i].val;
        if (a < 0xD800 || b > 0xDFFF) return 1;
    }
    return 0;
}

/* one character of a literal or class, escapes decoded; returns the position after it, or NULL */
static const char *s_char(s_parser *p, const char *s, uint32_t *cp) {
    if (s >= p->end) {
        s_fail(p, s, "unexpected end of input");
        return NULL;
    }
    if (*s == '\\') {
        s++;
        if (s >= p->end) {
            s_fail(p, s, "unexpected end of input after \\");
            return NULL;
        }
        char c = *s++;
        int n = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (n) {
            if (s_hex(s, p->end, n, cp) != 0 || *cp > 0x10FFFF) {
                s_fail(p, s, "bad hex escape");
                return NULL;
            }
            return s + n;
        }
        switch (c) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '\'':
        case '^':
        case '.':
        case '/': *cp = (uint32_t)c; break;
        default: s_fail(p, s - 1, "unknown escape"); return NULL;
        }
        return s;
    }
    size_t i = 0;
    int32_t c = zg_utf8_next(s, (size_t)(p->end - s), &i);
    if (c < 0) {
        s_fail(p, s, "invalid UTF-8");
        return NULL;
    }
    *cp = (uint32_t)c;
    return s + i;
}

static const char *s_alternates(s_parser *p, const char *s, const char *base, size_t blen, int rule, int nested);

/* x{min,max} on the symbol out[start..n) (max < 0: unbounded), as llama.cpp rewrites it */
static void s_repeat(s_parser *p, s_vec *out, int start, const char *base, size_t blen, int min, int max,
                     const char *at) {
    if (start == out->n) {
        s_fail(p, at, "repetition without a preceding item");
        return;
    }
    if (min > ZG_MAX_REPEAT || max > ZG_MAX_REPEAT || (max >= 0 && max < min)) {
        s_fail(p, at, "bad repetition bounds");
        return;
    }
    int len = out->n - start;
    zg_elem *prev = malloc((size_t)len * sizeof *prev);
    if (!prev) {
        s_fail(p, NULL, "out of memory");
        return;
    }
    memcpy(prev, out->e + start, (size_t)len * sizeof *prev);
    if (min == 0) {
        p->total -= len;
        out->n = start;
    } else {
        for (int i = 1; i < min; i++)
            for (int j = 0; j < len; j++) s_push(p, out, prev[j].type, prev[j].val);
    }
    int last = -1, n_opt = max < 0 ? 1 : max - min;
    for (int i = 0; i < n_opt && !p->failed; i++) {
        int id = s_symbol(p, base, blen, 1);
        if (id < 0) break;
        s_vec rv = {0};
        for (int j = 0; j < len; j++) s_push(p, &rv, prev[j].type, prev[j].val);
        if (i > 0 || max < 0) s_push(p, &rv, ZG_REF, (uint32_t)(max < 0 ? id : last));
        s_push(p, &rv, ZG_ALT, 0);
        s_push(p, &rv, ZG_END, 0);
        p->rules[id] = rv;
        p->defined[id] = 1;
        last = id;
    }
    if (n_opt > 0 && last >= 0) s_push(p, out, ZG_REF, (uint32_t)last);
    free(prev);
}

static const char *s_sequence(s_parser *p, const char *s, const char *base, size_t blen, s_vec *out, int nested) {
    int start = out->n;
    while (s < p->end && !p->failed) {
        const char *at = s;
        if (*s == '"') {
            s++;
            start = out->n;
            while (s < p->end && *s != '"' && !p->failed) {
                uint32_t cp;
                s = s_char(p, s, &cp);
                if (!s) return NULL;
                if (cp >= 0xD800 && cp <= 0xDFFF) { /* no text holds it: the matcher would wait forever */
                    s_fail(p, at, "surrogate code point in a string");
                    return NULL;
                }
                s_push(p, out, ZG_CHAR, cp);
            }
            if (s >= p->end) {
                s_fail(p, at, "unterminated string");
                return NULL;
            }
            s = s_space(p, s + 1, nested);
        } else if (*s == '[') {
            s++;
            start = out->n;
            uint32_t first = ZG_CHAR;
            if (s < p->end && *s == '^') s++, first = ZG_CHAR_NOT;
            while (s < p->end && *s != ']' && !p->failed) {
                uint32_t cp, hi;
                s = s_char(p, s, &cp);
                if (!s) return NULL;
                s_push(p, out, out->n == start ? first : ZG_CHAR_ALT, cp);
                if (s + 1 < p->end && *s == '-' && s[1] != ']') {
                    s = s_char(p, s + 1, &hi);
                    if (!s) return NULL;
                    if (hi < cp) {
                        s_fail(p, at, "character range out of order");
                        return NULL;
                    }
                    s_push(p, out, ZG_RNG_UPPER, hi);
                }
            }
            if (s >= p->end) {
                s_fail(p, at, "unterminated character class");
                return NULL;
            }
            if (out->n == start || !s_class_admits(out->e + start, out->n - start)) {
                s_fail(p, at, "empty character class");
                return NULL;
            }
            s = s_space(p, s + 1, nested);
        } else if (s_word(*s)) {
            const char *b = s;
            while (s < p->end && s_word(*s)) s++;
            /* a name followed by ::= starts the next rule: only possible at the top level after a newline,
             * which ends the sequence before we get here */
            start = out->n;
            int id = s_symbol(p, b, (size_t)(s - b), 0);
            if (id < 0) return NULL;
            s_push(p, out, ZG_REF, (uint32_t)id);
            s = s_space(p, s, nested);
        } else if (*s == '(') {
            if (++p->depth > ZG_MAX_DEPTH) {
                s_fail(p, s, "groups nested too deep");
                return NULL;
            }
            start = out->n;
            int id = s_symbol(p, base, blen, 1);
            if (id < 0) return NULL;
            s = s_alternates(p, s_space(p, s + 1, 1), base, blen, id, 1);
            if (!s) return NULL;
            if (s >= p->end || *s != ')') {
                s_fail(p, at, "expected ')'");
                return NULL;
            }
            p->depth--;
            s_push(p, out, ZG_REF, (uint32_t)id);
            s = s_space(p, s + 1, nested);
        } else if (*s == '.') {
            start = out->n;
            s_push(p, out, ZG_CHAR_ANY, 0);
            s = s_space(p, s + 1, nested);
        } else if (*s == '*' || *s == '+' || *s == '?') {
            s_repeat(p, out, start, base, blen, *s == '+' ? 1 : 0, *s == '?' ? 1 : -1, s);
            s = s_space(p, s + 1, nested);
        } else if (*s == '{') {
            s = s_space(p, s + 1, nested);
            long min = 0, max = -1;
            if (s >= p->end || *s < '0' || *s > '9') {
                s_fail(p, at, "expected a number after {");
                return NULL;
            }
            while (s < p->end && *s >= '0' && *s <= '9' && min <= ZG_MAX_REPEAT) min = min * 10 + (*s++ - '0');
            s = s_space(p, s, nested);
            if (s < p->end && *s == ',') {
                s = s_space(p, s + 1, nested);
                if (s < p->end && *s >= '0' && *s <= '9') {
                    max = 0;
                    while (s < p->end && *s >= '0' && *s <= '9' && max <= ZG_MAX_REPEAT) max = max * 10 + (*s++ - '0');
                    s = s_space(p, s, nested);
                }
            } else max = min;
            if (s >= p->end || *s != '}') {
                s_fail(p, at, "expected }");
                return NULL;
            }
            s_repeat(p, out, start, base, blen, (int)min, (int)max, at);
            s = s_space(p, s + 1, nested);
        } else break;
    }
    return p->failed ? NULL : s;
}

static const char *s_alternates(s_parser *p, const char *s, const char *base, size_t blen, int rule, int nested) {
    s_vec rv = {0};
    s = s_sequence(p, s, base, blen, &rv, nested);
    while (s && s < p->end && *s == '|') {
        s_push(p, &rv, ZG_ALT, 0);
        s = s_sequence(p, s_space(p, s + 1, 1), base, blen, &rv, nested);
    }
    s_push(p, &rv, ZG_END, 0);
    if (!s || p->failed) {
        free(rv.e);
        return NULL;
    }
    free(p->rules[rule].e);
    p->rules[rule] = rv;
    p->defined[rule] = 1;
    return s;
}

static void s_parse(s_parser *p) {
    const char *s = s_space(p, p->src, 1);
    while (s && s < p->end && !p->failed) {
        const char *b = s;
        while (s < p->end && s_word(*s)) s++;
        if (s == b) {
            s_fail(p, s, "expected a rule name");
            return;
        }
        size_t blen = (size_t)(s - b);
        s = s_space(p, s, 0);
        if (p->end - s < 3 || memcmp(s, "::=", 3) != 0) {
            s_fail(p, s, "expected ::=");
            return;
        }
        int id = s_symbol(p, b, blen, 0);
        if (id < 0) return;
        if (p->defined[id]) {
            s_fail(p, b, "rule defined twice");
            return;
        }
        s = s_alternates(p, s_space(p, s + 3, 1), b, blen, id, 0);
        if (!s) return;
        if (s < p->end && *s != '\n' && *s != '\r') {
            s_fail(p, s, "expected a newline or end of input");
            return;
        }
        s = s_space(p, s, 1);
    }
}

/* ---- checks and layout ---- */

static int s_is_end(uint32_t t) { return t == ZG_END || t == ZG_ALT; }

/* one pass of a fixpoint over the rules: nullable (derives the empty string) or productive (derives some finite
 * string); returns whether anything changed */
static int s_fix(const s_parser *p, int *flag, int productive) {
    int changed = 0;
    for (int r = 0; r < p->n_rules; r++) {
        if (flag[r]) continue;
        const s_vec *v = &p->rules[r];
        int ok = 1;
        for (int i = 0; i < v->n; i++) {
            const zg_elem *e = &v->e[i];
            if (s_is_end(e->type)) {
                if (ok) {
                    flag[r] = 1;
                    changed = 1;
                    break;
                }
                ok = 1;
                continue;
            }
            if (e->type == ZG_REF) ok &= flag[e->val];
            else if (e->type == ZG_CHAR || e->type == ZG_CHAR_NOT || e->type == ZG_CHAR_ANY) ok &= productive;
        }
    }
    return changed;
}

/* left recursion: rule r reaches itself through leftmost references to nullable prefixes; colour: 0 unseen,
 * 1 on the current path, 2 done */
static int s_left_cycle(const s_parser *p, const int *nullable, int r, int *colour, int depth) {
    if (colour[r] == 1) return r;
    if (colour[r] == 2 || depth > ZG_MAX_RULES) return -1;
    colour[r] = 1;
    const s_vec *v = &p->rules[r];
    int at_start = 1;
    for (int i = 0; i < v->n; i++) {
        const zg_elem *e = &v->e[i];
        if (s_is_end(e->type)) {
            at_start = 1;
            continue;
        }
        if (!at_start) continue;
        if (e->type == ZG_REF) {
            int c = s_left_cycle(p, nullable, (int)e->val, colour, depth + 1);
            if (c >= 0) return c;
            if (!nullable[e->val]) at_start = 0;
        } else if (e->type != ZG_RNG_UPPER && e->type != ZG_CHAR_ALT) at_start = 0;
    }
    colour[r] = 2;
    return -1;
}

static zg_grammar *s_finish(s_parser *p) {
    int root = -1;
    for (int i = 0; i < p->n_rules; i++) {
        if (!p->defined[i]) {
            snprintf(p->err, p->errlen, "grammar: rule '%s' is used but not defined", p->names[i]);
            return NULL;
        }
        if (strcmp(p->names[i], "root") == 0) root = i;
    }
    if (root < 0) {
        snprintf(p->err, p->errlen, "grammar: no rule 'root'");
        return NULL;
    }
    zg_grammar *g = NULL;
    int *nullable = calloc((size_t)p->n_rules, sizeof *nullable);
    int *prod = calloc((size_t)p->n_rules, sizeof *prod);
    int *colour = calloc((size_t)p->n_rules, sizeof *colour);
    if (!nullable || !prod || !colour) goto oom;
    while (s_fix(p, nullable, 0)) {}
    while (s_fix(p, prod, 1)) {}
    if (!prod[root]) {
        snprintf(p->err, p->errlen, "grammar: unsatisfiable: rule 'root' derives no finite string");
        goto done;
    }
    /* a recursive walk bounded by the rule count (ZG_MAX_RULES deep at most: the C stack copes with a few
     * hundred bytes a frame) */
    for (int r = 0; r < p->n_rules; r++) {
        int c = s_left_cycle(p, nullable, r, colour, 0);
        if (c >= 0) {
            snprintf(p->err, p->errlen,
                     "grammar: left recursion through rule '%s' (a rule, or a repetition of something that may be "
                     "empty, reaches itself without consuming a character)",
                     p->names[c]);
            goto done;
        }
    }
    g = calloc(1, sizeof *g);
    if (!g) goto oom;
    g->refs = 1;
    g->kind = ZG_GBNF;
    zg_mcache_init(&g->mc);
    g->n_rules = p->n_rules;
    g->root = root;
    g->rule_start = malloc((size_t)p->n_rules * sizeof *g->rule_start);
    g->el = malloc(((size_t)p->total + 1) * sizeof *g->el);
    g->alt_end = malloc(((size_t)p->total + 1) * sizeof *g->alt_end);
    if (!g->rule_start || !g->el || !g->alt_end) goto oom;
    for (int r = 0; r < p->n_rules; r++) {
        g->rule_start[r] = g->n_el;
        memcpy(g->el + g->n_el, p->rules[r].e, (size_t)p->rules[r].n * sizeof *g->el);
        g->n_el += p->rules[r].n;
    }
    /* every rule ends with ZG_END, so a scan from the last element back finds each element's closing one */
    for (int i = g->n_el - 1, end = g->n_el - 1; i >= 0; i--) {
        if (g->el[i].type == ZG_END || g->el[i].type == ZG_ALT) end = i;
        g->alt_end[i] = end;
    }
    goto done;
oom:
    snprintf(p->err, p->errlen, "grammar: out of memory");
    if (g) {
        zg_mcache_free(&g->mc);
        free(g->rule_start);
        free(g->el);
        free(g->alt_end);
        free(g);
        g = NULL;
    }
done:
    free(nullable);
    free(prod);
    free(colour);
    return g;
}

zg_grammar *zg_gbnf_compile(const char *text, size_t len, char *err, size_t errlen) {
    s_parser p;
    memset(&p, 0, sizeof p);
    p.src = text;
    p.end = text + len;
    p.err = err;
    p.errlen = errlen;
    zg_grammar *g = NULL;
    if (len > ZG_MAX_TEXT * 16) s_fail(&p, NULL, "too large");
    else if (memchr(text, 0, len)) s_fail(&p, NULL, "NUL byte in the grammar text");
    else s_parse(&p);
    if (!p.failed) g = s_finish(&p);
    for (int i = 0; i < p.n_rules; i++) {
        free(p.names[i]);
        free(p.rules[i].e);
    }
    free(p.names);
    free(p.rules);
    free(p.defined);
    return g;
}
