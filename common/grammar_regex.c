/* common/grammar_regex.c: a regular expression as one GBNF rule. The whole output must match (as Python's
 * re.fullmatch); a leading ^ and a trailing $ are accepted and mean nothing more.
 *
 * Supported: literals and escapes (\n \r \t \f \v \0 \xHH \uHHHH, escaped punctuation), `.` (any code point but
 * newline), classes [...] and [^...] with ranges and \d \w \s inside, the shorthands \d \D \w \W \s \S, groups
 * (...) and (?:...), alternation |, the quantifiers * + ? {m} {m,} {m,n} (a lazy or possessive suffix ? or + is
 * accepted and changes nothing: the constraint is on the language, not on a match). Refused with a message:
 * back-references, lookaround, named groups and other (? forms, anchors inside the expression, \b \B. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

typedef struct {
    const char *s, *end, *beg;
    zg_buf *out;
    char *err;
    size_t errlen;
    int failed, depth;
    int json; /* inside a JSON string: only characters a JSON string holds unescaped, and escapes for " \\ */
} s_re;

#define S_JSON_BAD "\\x00-\\x1F\\x22\\x5C\\x7F" /* what a JSON string never holds raw */

/* a literal code point: in a JSON string, " \\ and control characters as their escapes */
static void s_lit_out(s_re *r, uint32_t cp) {
    zg_buf *o = r->out;
    if (r->json && (cp < 0x20 || cp == '"' || cp == '\\' || cp == 0x7F)) {
        const char *e = cp == '"'    ? "\"\\x5C\\x22\""
                        : cp == '\\' ? "\"\\x5C\\x5C\""
                        : cp == '\n' ? "\"\\x5Cn\""
                        : cp == '\t' ? "\"\\x5Ct\""
                        : cp == '\r' ? "\"\\x5Cr\""
                                     : NULL;
        if (e) zg_buf_str(o, e);
        else zg_buf_fmt(o, "\"\\x5Cu00%02x\"", cp);
        return;
    }
    zg_buf_str(o, "\"");
    zg_buf_cp(o, cp);
    zg_buf_str(o, "\"");
}

/* a class range; in a JSON string without the characters a string never holds raw (a class cannot hold the
 * two-character escapes, so they are left out: the output stays within the pattern) */
static int s_range_out(s_re *r, uint32_t lo, uint32_t hi) {
    static const uint32_t bad[][2] = {{0, 0x1F}, {0x22, 0x22}, {0x5C, 0x5C}, {0x7F, 0x7F}};
    int n = 0, nb = r->json ? 4 : 0;
    uint32_t a = lo;
    for (int k = 0; k <= nb && a <= hi; k++) {
        uint32_t h0 = k < nb ? bad[k][0] : 0x110000, h1 = k < nb ? bad[k][1] : 0x110000;
        if (h1 < a) continue;
        if (h0 > a) { /* [a, min(h0 - 1, hi)] lies before the hole */
            uint32_t end = h0 - 1 < hi ? h0 - 1 : hi;
            zg_buf_cp(r->out, a);
            if (end > a) {
                zg_buf_str(r->out, "-");
                zg_buf_cp(r->out, end);
            }
            n++;
        }
        a = h1 + 1;
    }
    return n;
}

static void s_fail(s_re *r, const char *at, const char *msg) {
    if (r->failed) return;
    r->failed = 1;
    snprintf(r->err, r->errlen, "regex: %s at offset %ld", msg, (long)(at - r->beg));
}

static int s_hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* the class body (between the brackets, no ^) of a shorthand, or NULL */
static const char *s_shorthand(char c, int *neg) {
    *neg = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd':
    case 'D': return "0-9";
    case 'w':
    case 'W': return "a-zA-Z0-9_";
    case 's':
    case 'S': return " \\t\\n\\r\\x0B\\x0C";
    default: return NULL;
    }
}

/* an escape after the backslash at r->s; a code point into *cp (returns 1), a shorthand (returns 2, with
 * *body and *neg), or 0 on failure */
static int s_escape(s_re *r, uint32_t *cp, const char **body, int *neg) {
    const char *at = r->s - 1;
    if (r->s >= r->end) {
        s_fail(r, at, "trailing backslash");
        return 0;
    }
    char c = *r->s++;
    if ((*body = s_shorthand(c, neg))) return 2;
    switch (c) {
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case '0': *cp = 0; return 1;
    case 'x':
    case 'u': {
        int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < n; i++) {
            int d = r->s < r->end ? s_hexval(*r->s) : -1;
            if (d < 0) {
                s_fail(r, at, "bad hex escape");
                return 0;
            }
            v = v << 4 | (uint32_t)d;
            r->s++;
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            s_fail(r, at, "surrogate escape");
            return 0;
        }
        *cp = v;
        return 1;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            s_fail(r, at,
                   "unsupported escape (back-references, \\b and letter escapes other than "
                   "\\d\\w\\s\\n\\r\\t\\f\\v\\x\\u)");
            return 0;
        }
        *cp = (uint32_t)(unsigned char)c;
        if ((unsigned char)c >= 0x80) { /* an escaped multi-byte character: take it whole */
            size_t i = 0;
            int32_t v = zg_utf8_next(r->s - 1, (size_t)(r->end - r->s + 1), &i);
            if (v < 0) {
                s_fail(r, at, "invalid UTF-8");
                return 0;
            }
            r->s += i - 1;
            *cp = (uint32_t)v;
        }
        return 1;
    }
}

/* one literal code point at r->s */
static int s_literal(s_re *r, uint32_t *cp) {
    size_t i = 0;
    int32_t v = zg_utf8_next(r->s, (size_t)(r->end - r->s), &i);
    if (v < 0) {
        s_fail(r, r->s, "invalid UTF-8");
        return -1;
    }
    r->s += i;
    *cp = (uint32_t)v;
    return 0;
}

static void s_class(s_re *r) {
    const char *at = r->s - 1;
    int neg = 0;
    if (r->s < r->end && *r->s == '^') neg = 1, r->s++;
    zg_buf *o = r->out;
    zg_buf_str(o, neg ? "[^" : "[");
    if (neg && r->json) zg_buf_str(o, S_JSON_BAD);
    int first = 1, items = 0;
    while (!r->failed) {
        if (r->s >= r->end) {
            s_fail(r, at, "unterminated class");
            return;
        }
        if (*r->s == ']' && !first) break;
        first = 0;
        uint32_t lo;
        if (*r->s == '\\') {
            r->s++;
            const char *body;
            int sneg;
            int k = s_escape(r, &lo, &body, &sneg);
            if (k == 0) return;
            if (k == 2) {
                if (sneg) {
                    s_fail(r, r->s - 2, "negated shorthand inside a class");
                    return;
                }
                zg_buf_str(o, r->json && body[0] == ' ' ? " " : body);
                items++;
                continue;
            }
        } else if (s_literal(r, &lo) != 0) return;
        uint32_t hi = lo;
        if (r->s + 1 < r->end && *r->s == '-' && r->s[1] != ']') {
            r->s++;
            if (*r->s == '\\') {
                r->s++;
                const char *body;
                int sneg;
                int k = s_escape(r, &hi, &body, &sneg);
                if (k != 1) {
                    if (k == 2) s_fail(r, r->s - 2, "shorthand as a range end");
                    return;
                }
            } else if (s_literal(r, &hi) != 0) return;
            if (hi < lo) {
                s_fail(r, at, "range out of order");
                return;
            }
        }
        if (neg) {
            zg_buf_cp(o, lo);
            if (hi > lo) {
                zg_buf_str(o, "-");
                zg_buf_cp(o, hi);
            }
            items++;
        } else items += s_range_out(r, lo, hi);
    }
    r->s++; /* ] */
    if (!items) s_fail(r, at, r->json ? "class empty within a JSON string" : "empty class");
    zg_buf_str(o, "]");
}

static void s_alt(s_re *r);

static void s_atom(s_re *r) {
    zg_buf *o = r->out;
    const char *at = r->s;
    char c = *r->s++;
    if (c == '(') {
        if (++r->depth > ZG_MAX_DEPTH) {
            s_fail(r, at, "groups nested too deep");
            return;
        }
        if (r->s < r->end && *r->s == '?') {
            if (r->s + 1 < r->end && r->s[1] == ':') r->s += 2;
            else {
                s_fail(r, at, "unsupported group (lookaround, named or flag groups)");
                return;
            }
        }
        zg_buf_str(o, "(");
        s_alt(r);
        if (r->failed) return;
        if (r->s >= r->end || *r->s != ')') {
            s_fail(r, at, "unbalanced (");
            return;
        }
        r->s++;
        r->depth--;
        zg_buf_str(o, ")");
    } else if (c == '[') {
        s_class(r);
    } else if (c == '.') {
        zg_buf_str(o, r->json ? "[^" S_JSON_BAD "]" : "[^\\x0A]");
    } else if (c == '\\') {
        uint32_t cp;
        const char *body;
        int neg;
        int k = s_escape(r, &cp, &body, &neg);
        if (k == 2 && r->json && neg) zg_buf_fmt(o, "[^%s" S_JSON_BAD "]", body);
        else if (k == 2) zg_buf_fmt(o, "[%s%s]", neg ? "^" : "", r->json && body[0] == ' ' ? " " : body);
        else if (k == 1) s_lit_out(r, cp);
    } else if (c == '^' || c == '$') {
        s_fail(r, at, "anchor inside the expression (the whole output is matched)");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        s_fail(r, at, "quantifier without an item");
    } else if (c == ')') {
        s_fail(r, at, "unbalanced )");
    } else {
        r->s--;
        uint32_t cp;
        if (s_literal(r, &cp) != 0) return;
        s_lit_out(r, cp);
    }
}

static void s_quant(s_re *r) {
    zg_buf *o = r->out;
    if (r->s >= r->end) return;
    char c = *r->s;
    if (c == '*' || c == '+' || c == '?') {
        char q[2] = {c, 0};
        zg_buf_str(o, q);
        r->s++;
    } else if (c == '{') {
        const char *at = r->s++;
        long m = 0, n = -1;
        int digits = 0;
        while (r->s < r->end && *r->s >= '0' && *r->s <= '9' && m <= ZG_MAX_REPEAT)
            m = m * 10 + (*r->s++ - '0'), digits++;
        if (!digits) {
            s_fail(r, at, "bad {m,n}");
            return;
        }
        if (r->s < r->end && *r->s == ',') {
            r->s++;
            if (r->s < r->end && *r->s >= '0' && *r->s <= '9') {
                n = 0;
                while (r->s < r->end && *r->s >= '0' && *r->s <= '9' && n <= ZG_MAX_REPEAT)
                    n = n * 10 + (*r->s++ - '0');
            }
        } else n = m;
        if (r->s >= r->end || *r->s != '}') {
            s_fail(r, at, "bad {m,n}");
            return;
        }
        r->s++;
        if (m > ZG_MAX_REPEAT || n > ZG_MAX_REPEAT || (n >= 0 && n < m)) {
            s_fail(r, at, "bad repetition bounds");
            return;
        }
        if (n < 0) zg_buf_fmt(o, "{%ld,}", m);
        else zg_buf_fmt(o, "{%ld,%ld}", m, n);
    } else return;
    if (r->s < r->end && (*r->s == '?' || *r->s == '+')) r->s++; /* lazy / possessive: same language */
    if (r->s < r->end && (*r->s == '*' || *r->s == '+' || *r->s == '?' || *r->s == '{'))
        s_fail(r, r->s, "nested quantifier");
}

static void s_alt(s_re *r) {
    for (;;) {
        zg_buf_str(r->out, "(");
        while (r->s < r->end && *r->s != '|' && *r->s != ')' && !r->failed) {
            if (*r->s == '$' && r->s + 1 == r->end && r->depth == 0) {
                r->s++;
                break;
            }
            s_atom(r);
            if (r->failed) return;
            s_quant(r);
            zg_buf_str(r->out, " ");
        }
        zg_buf_str(r->out, ")");
        if (r->failed || r->s >= r->end || *r->s != '|') return;
        r->s++;
        zg_buf_str(r->out, " | ");
    }
}

int zg_regex_to_gbnf(const char *re, size_t len, const char *name, int json, zg_buf *out, char *err, size_t errlen) {
    s_re r = {re, re + len, re, out, err, errlen, 0, 0, json};
    if (r.s < r.end && *r.s == '^') r.s++;
    zg_buf_fmt(out, "%s ::= ", name);
    s_alt(&r);
    if (!r.failed && r.s < r.end) s_fail(&r, r.s, *r.s == ')' ? "unbalanced )" : "unexpected character");
    zg_buf_str(out, "\n");
    return r.failed ? -1 : 0;
}
