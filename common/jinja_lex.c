/* common/jinja_lex.c: Jinja's lexer with the settings transformers uses: newlines normalised to "\n", one
 * trailing newline dropped (keep_trailing_newline=False), trim_blocks (the first newline after a block or
 * comment tag is removed), lstrip_blocks (whitespace between the start of a line and a block or comment tag is
 * removed), and the "-" / "+" markers ({%- -%} {{- -}} {#- -#}, {%+ +%}). Tag contents become names,
 * strings (unescaped as Python's unicode-escape does), integers, floats and operators. */
#include "jinja_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    jtok *t;
    int n, cap;
    jerr *e;
} lexer;

static int s_push(lexer *L, jtok tk) {
    if (L->n == L->cap) {
        int c = L->cap ? L->cap * 2 : 64;
        jtok *nt = realloc(L->t, (size_t)c * sizeof *nt);
        if (!nt) return jerr_set(L->e, JINJA_NOMEM, tk.line, "out of memory");
        L->t = nt;
        L->cap = c;
    }
    L->t[L->n++] = tk;
    return 0;
}

static int s_lines(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static int s_hex(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void s_utf8(char **o, unsigned cp) {
    char *p = *o;
    if (cp < 0x80) *p++ = (char)cp;
    else if (cp < 0x800) {
        *p++ = (char)(0xC0 | cp >> 6);
        *p++ = (char)(0x80 | (cp & 63));
    } else if (cp < 0x10000) {
        *p++ = (char)(0xE0 | cp >> 12);
        *p++ = (char)(0x80 | (cp >> 6 & 63));
        *p++ = (char)(0x80 | (cp & 63));
    } else {
        *p++ = (char)(0xF0 | cp >> 18);
        *p++ = (char)(0x80 | (cp >> 12 & 63));
        *p++ = (char)(0x80 | (cp >> 6 & 63));
        *p++ = (char)(0x80 | (cp & 63));
    }
    *o = p;
}

/* the body of a string literal (between its quotes) unescaped into a malloc'd buffer */
static int s_unescape(lexer *L, const char *s, size_t n, int line, jtok *tk) {
    char *o = malloc(n + 1), *w = o;
    if (!o) return jerr_set(L->e, JINJA_NOMEM, line, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            *w++ = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case '\n': break;
        case '\\': *w++ = '\\'; break;
        case '\'': *w++ = '\''; break;
        case '"': *w++ = '"'; break;
        case 'a': *w++ = '\a'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'v': *w++ = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            unsigned cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i + 1 + (size_t)k < n ? s_hex((unsigned char)s[i + 1 + k]) : -1;
                if (h < 0) {
                    free(o);
                    return jerr_set(L->e, JINJA_SYNTAX, line, "bad \\%c escape in a string", c);
                }
                cp = cp * 16 + (unsigned)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                free(o);
                return jerr_set(L->e, JINJA_UNSUPPORTED, line, "unsupported: escape of U+%X in a string", cp);
            }
            i += (size_t)nd;
            s_utf8(&w, cp);
            break;
        }
        case 'N': free(o); return jerr_set(L->e, JINJA_UNSUPPORTED, line, "unsupported: \\N{...} escape in a string");
        default:
            if (c >= '0' && c <= '7') {
                unsigned cp = 0;
                int k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') {
                    cp = cp * 8 + (unsigned)(s[i] - '0');
                    i++;
                    k++;
                }
                i--;
                s_utf8(&w, cp);
            } else {
                *w++ = '\\';
                *w++ = c;
            }
        }
    }
    *w = 0;
    tk->s = o;
    tk->n = (size_t)(w - o);
    return 0;
}

static int s_isname0(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int s_isdig(int c) { return c >= '0' && c <= '9'; }

/* tag contents from p; stops at the end marker of kind (TK_BLOCK_END / TK_VAR_END) when brackets balance.
 * Returns the position after the end marker (with the trailing whitespace or newline it removes). */
static int s_tag(lexer *L, const char *src, size_t len, size_t *pp, int *line, int kind, int *line_start) {
    size_t p = *pp;
    char stack[64];
    int depth = 0;
    for (;;) {
        if (p >= len) return jerr_set(L->e, JINJA_SYNTAX, *line, "unexpected end of template inside a tag");
        char c = src[p];
        if (depth == 0) {
            size_t q = p;
            int minus = 0, plus = 0;
            if (src[q] == '-') {
                minus = 1;
                q++;
            } else if (src[q] == '+' && kind == TK_BLOCK_END) {
                plus = 1;
                q++;
            }
            if (q + 2 <= len && ((kind == TK_BLOCK_END && src[q] == '%' && src[q + 1] == '}') ||
                                 (kind == TK_VAR_END && src[q] == '}' && src[q + 1] == '}'))) {
                q += 2;
                size_t end = q;
                if (minus) {
                    int k;
                    while ((k = ju_space_len(src + end, src + len)) > 0) end += (size_t)k;
                } else if (!plus && kind == TK_BLOCK_END && end < len && src[end] == '\n') end++;
                jtok tk = {.type = kind, .line = *line};
                if (s_push(L, tk)) return -1;
                *line_start = end > q && src[end - 1] == '\n';
                *line += s_lines(src + q, end - q);
                *pp = end;
                return 0;
            }
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            if (c == '\n') (*line)++;
            p++;
            continue;
        }
        jtok tk = {.line = *line};
        if (s_isdig((unsigned char)c)) {
            size_t q = p;
            while (q < len && (s_isdig((unsigned char)src[q]) ||
                               (src[q] == '_' && q + 1 < len && s_isdig((unsigned char)src[q + 1]))))
                q++;
            int isf = 0;
            if (q + 1 < len && src[q] == '.' && s_isdig((unsigned char)src[q + 1])) {
                isf = 1;
                q++;
                while (q < len && (s_isdig((unsigned char)src[q]) ||
                                   (src[q] == '_' && q + 1 < len && s_isdig((unsigned char)src[q + 1]))))
                    q++;
            }
            if (q < len && (src[q] == 'e' || src[q] == 'E')) {
                size_t r = q + 1;
                if (r < len && (src[r] == '+' || src[r] == '-')) r++;
                if (r < len && s_isdig((unsigned char)src[r])) {
                    isf = 1;
                    q = r;
                    while (q < len && s_isdig((unsigned char)src[q])) q++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t i = p; i < q && k < sizeof num - 1; i++)
                if (src[i] != '_') num[k++] = src[i];
            num[k] = 0;
            if (q - p >= sizeof num - 1)
                return jerr_set(L->e, JINJA_UNSUPPORTED, *line, "unsupported: number literal too long");
            if (isf) {
                tk.type = TK_FLOAT;
                tk.f = strtod(num, NULL);
            } else {
                tk.type = TK_INT;
                errno = 0;
                unsigned long long u = strtoull(num, NULL, 10);
                if (errno || u > (unsigned long long)INT64_MAX)
                    return jerr_set(L->e, JINJA_UNSUPPORTED, *line, "unsupported: integer literal out of 64-bit range");
                tk.i = (int64_t)u;
            }
            p = q;
        } else if (s_isname0((unsigned char)c)) {
            size_t q = p;
            while (q < len && (s_isname0((unsigned char)src[q]) || s_isdig((unsigned char)src[q]))) q++;
            tk.type = TK_NAME;
            tk.s = src + p;
            tk.n = q - p;
            p = q;
        } else if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < len && src[q] != c) {
                if (src[q] == '\\') q++;
                q++;
            }
            if (q >= len) return jerr_set(L->e, JINJA_SYNTAX, *line, "unterminated string");
            tk.type = TK_STRING;
            if (s_unescape(L, src + p + 1, q - p - 1, *line, &tk)) return -1;
            *line += s_lines(src + p, q - p);
            p = q + 1;
        } else {
            static const char *ops2[] = {"**", "//", "==", "!=", ">=", "<=", NULL};
            static const char ops1[] = "+-/*%~[](){}><=.:|,;";
            tk.type = TK_OP;
            tk.s = src + p;
            tk.n = 0;
            for (int k = 0; ops2[k]; k++)
                if (p + 1 < len && src[p] == ops2[k][0] && src[p + 1] == ops2[k][1]) tk.n = 2;
            if (!tk.n && strchr(ops1, c) && c) tk.n = 1;
            if (!tk.n) return jerr_set(L->e, JINJA_SYNTAX, *line, "unexpected character '%c' in a tag", c);
            if (tk.n == 1 && (c == '(' || c == '[' || c == '{')) {
                if (depth >= (int)sizeof stack) return jerr_set(L->e, JINJA_LIMIT, *line, "brackets nested too deeply");
                stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (tk.n == 1 && (c == ')' || c == ']' || c == '}')) {
                if (!depth || stack[depth - 1] != c) return jerr_set(L->e, JINJA_SYNTAX, *line, "unexpected '%c'", c);
                depth--;
            }
            p += tk.n;
        }
        if (s_push(L, tk)) {
            if (tk.type == TK_STRING) free((char *)tk.s);
            return -1;
        }
    }
}

int jlex(const char *in, size_t inlen, jtok **toks, int *ntok, jerr *e) {
    lexer L = {.e = e};
    /* newlines to "\n", one trailing newline dropped */
    char *src = malloc(inlen + 1);
    if (!src) return jerr_set(e, JINJA_NOMEM, 0, "out of memory");
    size_t len = 0;
    for (size_t i = 0; i < inlen; i++) {
        if (in[i] == '\r') {
            src[len++] = '\n';
            if (i + 1 < inlen && in[i + 1] == '\n') i++;
        } else src[len++] = in[i];
    }
    if (len && src[len - 1] == '\n') len--;
    src[len] = 0;
    size_t p = 0;
    int line = 1, line_start = 1;
    while (p < len) {
        /* the next tag opener */
        size_t q = p;
        int kind = 0;
        while (q + 1 < len) {
            if (src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#')) {
                kind = src[q + 1];
                break;
            }
            q++;
        }
        if (!kind) q = len;
        const char *text = src + p;
        size_t tn = q - p;
        char sign = kind && q + 2 < len ? src[q + 2] : 0;
        if (kind && sign == '-') {
            const char *t0 = text;
            size_t n0 = tn;
            ju_strip(&t0, &n0, NULL, 0, 0, 1);
            tn = n0;
        } else if (kind && sign != '+' && kind != '{') {
            size_t lpos = tn;
            while (lpos > 0 && text[lpos - 1] != '\n') lpos--;
            if ((lpos > 0 || line_start) && lpos < tn) {
                size_t k = lpos;
                int w;
                while (k < tn && (w = ju_space_len(text + k, text + tn)) > 0) k += (size_t)w;
                if (k == tn) tn = lpos;
            }
        }
        if (tn) {
            char *d = malloc(tn + 1);
            if (!d) {
                jerr_set(e, JINJA_NOMEM, line, "out of memory");
                goto fail;
            }
            memcpy(d, text, tn);
            d[tn] = 0;
            jtok tk = {.type = TK_DATA, .line = line, .s = d, .n = tn};
            if (s_push(&L, tk)) {
                free(d);
                goto fail;
            }
        }
        line += s_lines(src + p, q - p);
        line_start = 0;
        if (!kind) {
            p = len;
            break;
        }
        p = q + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            const char *c = strstr(src + p, "#}");
            if (!c) {
                jerr_set(e, JINJA_SYNTAX, line, "missing end of comment tag");
                goto fail;
            }
            size_t r = (size_t)(c - src), end = r + 2;
            if (r > p && src[r - 1] == '-') {
                int k;
                while ((k = ju_space_len(src + end, src + len)) > 0) end += (size_t)k;
            } else if (!(r > p && src[r - 1] == '+') && end < len && src[end] == '\n') end++;
            line += s_lines(src + p, end - p);
            line_start = src[end - 1] == '\n';
            p = end;
            continue;
        }
        if (kind == '%') {
            size_t r = p;
            while (r < len && (src[r] == ' ' || src[r] == '\t' || src[r] == '\n')) r++;
            if (len - r >= 3 && !strncmp(src + r, "raw", 3) &&
                (r + 3 >= len || !s_isname0((unsigned char)src[r + 3]))) {
                jerr_set(e, JINJA_UNSUPPORTED, line, "unsupported: {%% raw %%}");
                goto fail;
            }
        }
        jtok tk = {.type = kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, .line = line};
        if (s_push(&L, tk)) goto fail;
        if (s_tag(&L, src, len, &p, &line, kind == '{' ? TK_VAR_END : TK_BLOCK_END, &line_start)) goto fail;
    }
    jtok eof = {.type = TK_EOF, .line = line};
    if (s_push(&L, eof)) goto fail;
    /* TK_NAME and TK_OP point into src: copy them out so that src can go */
    for (int i = 0; i < L.n; i++)
        if (L.t[i].type == TK_NAME || L.t[i].type == TK_OP) {
            char *d = malloc(L.t[i].n + 1);
            if (!d) {
                for (int j = i; j < L.n; j++)
                    if (L.t[j].type == TK_NAME || L.t[j].type == TK_OP) L.t[j].s = NULL;
                jerr_set(e, JINJA_NOMEM, 0, "out of memory");
                goto fail;
            }
            memcpy(d, L.t[i].s, L.t[i].n);
            d[L.t[i].n] = 0;
            L.t[i].s = d;
        }
    free(src);
    *toks = L.t;
    *ntok = L.n;
    return 0;
fail:
    for (int i = 0; i < L.n; i++)
        if (L.t[i].type == TK_DATA || L.t[i].type == TK_STRING) {
            free((char *)L.t[i].s);
            L.t[i].s = NULL;
        }
    for (int i = 0; i < L.n; i++)
        if (L.t[i].type == TK_NAME || L.t[i].type == TK_OP) L.t[i].s = NULL;
    free(L.t);
    free(src);
    return e->code ? e->code : JINJA_SYNTAX;
}

void jlex_free(jtok *toks, int ntok) {
    for (int i = 0; i < ntok; i++)
        if (toks[i].type == TK_DATA || toks[i].type == TK_STRING || toks[i].type == TK_NAME || toks[i].type == TK_OP)
            free((char *)toks[i].s);
    free(toks);
}
