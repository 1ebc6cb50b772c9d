/* common/jinja_parse.c: Jinja's grammar, from tokens to an AST (struct jnode, in the template's arena).
 * Statements: if/elif/else, for (tuple targets, "if" filter, else), set (names, tuples, namespace attributes,
 * block set), macro, break/continue, generation (transformers' no-op tag); others are refused by name.
 * Expressions, loosest first: a if b else c, or, and, not, comparisons (chained; in, not in), + -, ~, * / // %,
 * **, unary - +, then primaries with postfix . [] [a:b:c] () and the filters (|) and tests (is) that bind to them.
 * Children: IF a=cond b=then c=else; FOR kids=targets a=iterable b=body c=else d=filter; SET a=target b=value;
 * SETBLOCK a=target b=body; MACRO name kids=params (a=default) b=body; ATTR a.name; ITEM a[b]; SLICE a[b:c:d];
 * CALL a(kids), FILTER a|name(kids), TEST a is [not: op=1] name(kids), keyword arguments as KWARG name=a;
 * CMP a then kids (each op, a); COND a if b else c; LIST/TUPLE kids; DICT kids = key, value, key, value, ... */
#include "jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    jtok *t;
    int n, pos;
    jarena *A;
    jerr *e;
    int depth, max_depth;
} parser;

typedef struct {
    jnode **v;
    int n, cap;
} nvec;

static int s_vpush(parser *P, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int c = v->cap ? v->cap * 2 : 8;
        jnode **nv = realloc(v->v, (size_t)c * sizeof *nv);
        if (!nv) return jerr_set(P->e, JINJA_NOMEM, 0, "out of memory");
        v->v = nv;
        v->cap = c;
    }
    v->v[v->n++] = x;
    return 0;
}

/* moves v's items into the node (arena) and frees v */
static int s_vfinish(parser *P, nvec *v, jnode *n) {
    if (v->n) {
        n->kids = ja_alloc(P->A, (size_t)v->n * sizeof *n->kids);
        if (!n->kids) {
            free(v->v);
            return jerr_set(P->e, JINJA_NOMEM, n->line, "out of memory");
        }
        memcpy(n->kids, v->v, (size_t)v->n * sizeof *n->kids);
    }
    n->nkids = v->n;
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
    return 0;
}

static jtok *s_cur(parser *P) { return &P->t[P->pos]; }
static jtok *s_peek(parser *P, int k) { return P->pos + k < P->n ? &P->t[P->pos + k] : &P->t[P->n - 1]; }
static int s_is_op(jtok *t, const char *op) {
    return t->type == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int s_is_name(jtok *t, const char *nm) {
    return t->type == TK_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}

static jnode *s_node(parser *P, int kind, int line) {
    jnode *n = ja_alloc(P->A, sizeof *n);
    if (!n) {
        jerr_set(P->e, JINJA_NOMEM, line, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

static const char *s_dup(parser *P, const char *s, size_t n) {
    char *d = ja_alloc(P->A, n + 1);
    if (!d) {
        jerr_set(P->e, JINJA_NOMEM, 0, "out of memory");
        return NULL;
    }
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static const char *s_tokdesc(jtok *t) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_END: return "end of statement block";
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_DATA: return "template data";
    default: return t->s ? t->s : "?";
    }
}

static int s_expect_op(parser *P, const char *op) {
    if (!s_is_op(s_cur(P), op))
        return jerr_set(P->e, JINJA_SYNTAX, s_cur(P)->line, "expected '%s', got '%s'", op, s_tokdesc(s_cur(P)));
    P->pos++;
    return 0;
}

static int s_enter(parser *P) {
    if (++P->depth > P->max_depth)
        return jerr_set(P->e, JINJA_LIMIT, s_cur(P)->line, "template nested deeper than %d", P->max_depth);
    return 0;
}

/* sets x's height from its children; chains built by loops (a + b + c ..., a.b.c ..., x|f|g ...) are bounded
 * here, since they do not recurse in the parser but do in the evaluator */
static jnode *s_height(parser *P, jnode *x) {
    if (!x) return NULL;
    int h = 0;
    jnode *ch[4] = {x->a, x->b, x->c, x->d};
    for (int i = 0; i < 4; i++)
        if (ch[i] && ch[i]->h > h) h = ch[i]->h;
    for (int i = 0; i < x->nkids; i++)
        if (x->kids[i] && x->kids[i]->h > h) h = x->kids[i]->h;
    x->h = h + 1;
    if (x->h > 4 * P->max_depth) {
        jerr_set(P->e, JINJA_LIMIT, x->line, "expression nested deeper than %d", 4 * P->max_depth);
        return NULL;
    }
    return x;
}

static jnode *s_expr(parser *P, int condexpr);
static jnode *s_unary(parser *P, int with_filter);

static jnode *s_literal_str(parser *P, int line, const char *s, size_t n) {
    jnode *x = s_node(P, JN_LIT, line);
    if (!x) return NULL;
    jv_str *str = ja_alloc(P->A, sizeof *str + n + 1);
    if (!str) {
        jerr_set(P->e, JINJA_NOMEM, line, "out of memory");
        return NULL;
    }
    str->n = n;
    memcpy(str->s, s, n);
    str->s[n] = 0;
    x->lit.t = JV_STR;
    x->lit.u.s = str;
    return x;
}

/* call arguments after '(' up to ')' into v (keyword arguments as JN_KWARG) */
static int s_args(parser *P, nvec *v) {
    while (!s_is_op(s_cur(P), ")")) {
        if (v->n && s_expect_op(P, ",")) return -1;
        if (s_is_op(s_cur(P), ")")) break;
        jtok *t = s_cur(P);
        if (s_is_op(t, "*") || s_is_op(t, "**"))
            return jerr_set(P->e, JINJA_UNSUPPORTED, t->line, "unsupported: *args / **kwargs in a call");
        if (t->type == TK_NAME && s_is_op(s_peek(P, 1), "=")) {
            jnode *k = s_node(P, JN_KWARG, t->line);
            if (!k || !(k->name = s_dup(P, t->s, t->n))) return -1;
            P->pos += 2;
            if (!(k->a = s_expr(P, 1)) || !s_height(P, k) || s_vpush(P, v, k)) return -1;
        } else {
            jnode *x = s_expr(P, 1);
            if (!x || s_vpush(P, v, x)) return -1;
        }
    }
    P->pos++;
    return 0;
}

static jnode *s_tuple(parser *P, int condexpr);

static jnode *s_primary(parser *P) {
    jtok *t = s_cur(P);
    jnode *x = NULL;
    if (t->type == TK_NAME) {
        static const char *consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (s_is_name(t, consts[k])) {
                if (!(x = s_node(P, JN_LIT, t->line))) return NULL;
                x->lit = k < 2 ? jv_bool(1) : k < 4 ? jv_bool(0) : jv_none();
                P->pos++;
                return x;
            }
        if (!(x = s_node(P, JN_NAME, t->line)) || !(x->name = s_dup(P, t->s, t->n))) return NULL;
        P->pos++;
        return x;
    }
    if (t->type == TK_STRING) {
        /* adjacent string literals concatenate */
        jbuf b = {0};
        int line = t->line;
        while (s_cur(P)->type == TK_STRING) {
            jb_put(&b, s_cur(P)->s, s_cur(P)->n);
            P->pos++;
        }
        if (b.over) {
            free(b.p);
            jerr_set(P->e, JINJA_NOMEM, line, "out of memory");
            return NULL;
        }
        x = s_literal_str(P, line, b.p ? b.p : "", b.n);
        free(b.p);
        return x;
    }
    if (t->type == TK_INT || t->type == TK_FLOAT) {
        if (!(x = s_node(P, JN_LIT, t->line))) return NULL;
        x->lit = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
        P->pos++;
        return x;
    }
    if (s_is_op(t, "(")) {
        P->pos++;
        if (s_is_op(s_cur(P), ")")) {
            P->pos++;
            return s_node(P, JN_TUPLE, t->line);
        }
        x = s_tuple(P, 1);
        if (!x || s_expect_op(P, ")")) return NULL;
        return x;
    }
    if (s_is_op(t, "[")) {
        P->pos++;
        jnode *l = s_node(P, JN_LIST, t->line);
        nvec v = {0};
        if (!l) return NULL;
        while (!s_is_op(s_cur(P), "]")) {
            if (v.n && s_expect_op(P, ",")) goto vfail;
            if (s_is_op(s_cur(P), "]")) break;
            jnode *it = s_expr(P, 1);
            if (!it || s_vpush(P, &v, it)) goto vfail;
        }
        P->pos++;
        if (s_vfinish(P, &v, l)) return NULL;
        return s_height(P, l);
    vfail:
        free(v.v);
        return NULL;
    }
    if (s_is_op(t, "{")) {
        P->pos++;
        jnode *d = s_node(P, JN_DICT, t->line);
        nvec v = {0};
        if (!d) return NULL;
        while (!s_is_op(s_cur(P), "}")) {
            if (v.n && s_expect_op(P, ",")) goto dfail;
            if (s_is_op(s_cur(P), "}")) break;
            jnode *k = s_expr(P, 1);
            if (!k || s_expect_op(P, ":")) goto dfail;
            jnode *val = s_expr(P, 1);
            if (!val || s_vpush(P, &v, k) || s_vpush(P, &v, val)) goto dfail;
        }
        P->pos++;
        if (s_vfinish(P, &v, d)) return NULL;
        return s_height(P, d);
    dfail:
        free(v.v);
        return NULL;
    }
    jerr_set(P->e, JINJA_SYNTAX, t->line, "unexpected '%s'", s_tokdesc(t));
    return NULL;
}

static jnode *s_subscript(parser *P, jnode *obj) {
    int line = s_cur(P)->line;
    P->pos++; /* [ */
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        jtok *t = s_cur(P);
        if (s_is_op(t, "]")) break;
        if (s_is_op(t, ":")) {
            if (++colons > 2) {
                jerr_set(P->e, JINJA_SYNTAX, t->line, "bad slice");
                return NULL;
            }
            P->pos++;
            continue;
        }
        if (parts[colons]) {
            jerr_set(P->e, JINJA_SYNTAX, t->line, "expected ']' in a subscript");
            return NULL;
        }
        if (!(parts[colons] = s_expr(P, 1))) return NULL;
        if (s_is_op(s_cur(P), ",")) {
            jerr_set(P->e, JINJA_UNSUPPORTED, line, "unsupported: tuple subscript");
            return NULL;
        }
    }
    P->pos++;
    jnode *x;
    if (colons) {
        if (!(x = s_node(P, JN_SLICE, line))) return NULL;
        x->a = obj;
        x->b = parts[0];
        x->c = parts[1];
        x->d = parts[2];
    } else {
        if (!parts[0]) {
            jerr_set(P->e, JINJA_SYNTAX, line, "empty subscript");
            return NULL;
        }
        if (!(x = s_node(P, JN_ITEM, line))) return NULL;
        x->a = obj;
        x->b = parts[0];
    }
    return s_height(P, x);
}

static jnode *s_postfix(parser *P, jnode *x) {
    while (x) {
        jtok *t = s_cur(P);
        if (s_is_op(t, ".")) {
            jtok *nm = s_peek(P, 1);
            if (nm->type == TK_NAME) {
                jnode *a = s_node(P, JN_ATTR, t->line);
                if (!a || !(a->name = s_dup(P, nm->s, nm->n))) return NULL;
                a->a = x;
                x = s_height(P, a);
            } else if (nm->type == TK_INT) {
                jnode *a = s_node(P, JN_ITEM, t->line), *k = s_node(P, JN_LIT, t->line);
                if (!a || !k) return NULL;
                k->lit = jv_int(nm->i);
                a->a = x;
                a->b = k;
                x = s_height(P, a);
            } else {
                jerr_set(P->e, JINJA_SYNTAX, t->line, "expected a name after '.'");
                return NULL;
            }
            P->pos += 2;
        } else if (s_is_op(t, "[")) {
            x = s_subscript(P, x);
        } else if (s_is_op(t, "(")) {
            jnode *c = s_node(P, JN_CALL, t->line);
            nvec v = {0};
            if (!c) return NULL;
            P->pos++;
            if (s_args(P, &v)) {
                free(v.v);
                return NULL;
            }
            if (s_vfinish(P, &v, c)) return NULL;
            c->a = x;
            x = s_height(P, c);
        } else break;
    }
    return x;
}

static const char *s_dotted_name(parser *P) {
    jtok *t = s_cur(P);
    if (t->type != TK_NAME) {
        jerr_set(P->e, JINJA_SYNTAX, t->line, "expected a filter or test name");
        return NULL;
    }
    if (s_is_op(s_peek(P, 1), ".") && s_peek(P, 2)->type == TK_NAME) {
        jerr_set(P->e, JINJA_UNSUPPORTED, t->line, "unsupported: dotted filter or test name");
        return NULL;
    }
    P->pos++;
    return s_dup(P, t->s, t->n);
}

static jnode *s_filters(parser *P, jnode *x) {
    while (x) {
        jtok *t = s_cur(P);
        if (s_is_op(t, "|")) {
            P->pos++;
            jnode *f = s_node(P, JN_FILTER, t->line);
            if (!f || !(f->name = s_dotted_name(P))) return NULL;
            if (!jbi_known_filter(f->name)) {
                jerr_set(P->e, JINJA_UNSUPPORTED, t->line, "unsupported filter '%s'", f->name);
                return NULL;
            }
            f->a = x;
            if (s_is_op(s_cur(P), "(")) {
                nvec v = {0};
                P->pos++;
                if (s_args(P, &v)) {
                    free(v.v);
                    return NULL;
                }
                if (s_vfinish(P, &v, f)) return NULL;
            }
            x = s_height(P, f);
        } else if (s_is_name(t, "is")) {
            P->pos++;
            jnode *f = s_node(P, JN_TEST, t->line);
            if (!f) return NULL;
            if (s_is_name(s_cur(P), "not")) {
                f->op = 1;
                P->pos++;
            }
            if (!(f->name = s_dotted_name(P))) return NULL;
            if (!jbi_known_test(f->name)) {
                jerr_set(P->e, JINJA_UNSUPPORTED, t->line, "unsupported test '%s'", f->name);
                return NULL;
            }
            f->a = x;
            jtok *n = s_cur(P);
            if (s_is_op(n, "(")) {
                nvec v = {0};
                P->pos++;
                if (s_args(P, &v)) {
                    free(v.v);
                    return NULL;
                }
                if (s_vfinish(P, &v, f)) return NULL;
            } else if ((n->type == TK_NAME && !s_is_name(n, "else") && !s_is_name(n, "or") && !s_is_name(n, "and")) ||
                       n->type == TK_STRING || n->type == TK_INT || n->type == TK_FLOAT || s_is_op(n, "[") ||
                       s_is_op(n, "{")) {
                /* one argument without parentheses: "is divisibleby 3", "is sameas none" */
                jnode *arg = s_postfix(P, s_primary(P));
                if (!arg) return NULL;
                f->kids = ja_alloc(P->A, sizeof *f->kids);
                if (!f->kids) {
                    jerr_set(P->e, JINJA_NOMEM, t->line, "out of memory");
                    return NULL;
                }
                f->kids[0] = arg;
                f->nkids = 1;
            }
            x = s_height(P, f);
        } else if (s_is_op(t, "(")) {
            x = s_postfix(P, x);
        } else break;
    }
    return x;
}

static jnode *s_unary(parser *P, int with_filter) {
    if (s_enter(P)) return NULL;
    jtok *t = s_cur(P);
    jnode *x;
    if (s_is_op(t, "-") || s_is_op(t, "+")) {
        P->pos++;
        if (!(x = s_node(P, s_is_op(t, "-") ? JN_NEG : JN_POS, t->line))) return NULL;
        if (!(x->a = s_unary(P, 0)) || !s_height(P, x)) return NULL;
    } else x = s_primary(P);
    x = s_postfix(P, x);
    if (with_filter) x = s_filters(P, x);
    P->depth--;
    return x;
}

static jnode *s_bin(parser *P, int op, int line, jnode *a, jnode *b) {
    if (!a || !b) return NULL;
    jnode *x = s_node(P, JN_BIN, line);
    if (!x) return NULL;
    x->op = op;
    x->a = a;
    x->b = b;
    return s_height(P, x);
}

static jnode *s_pow(parser *P) {
    jnode *x = s_unary(P, 1);
    while (x && s_is_op(s_cur(P), "**")) {
        int line = s_cur(P)->line;
        P->pos++;
        x = s_bin(P, OP_POW, line, x, s_unary(P, 1));
    }
    return x;
}

static jnode *s_math2(parser *P) {
    jnode *x = s_pow(P);
    for (;;) {
        jtok *t = s_cur(P);
        int op = s_is_op(t, "*")    ? OP_MUL
                 : s_is_op(t, "/")  ? OP_DIV
                 : s_is_op(t, "//") ? OP_FLOORDIV
                 : s_is_op(t, "%")  ? OP_MOD
                                    : 0;
        if (!x || !op) return x;
        P->pos++;
        x = s_bin(P, op, t->line, x, s_pow(P));
    }
}

static jnode *s_concat(parser *P) {
    jnode *x = s_math2(P);
    while (x && s_is_op(s_cur(P), "~")) {
        int line = s_cur(P)->line;
        P->pos++;
        x = s_bin(P, OP_CONCAT, line, x, s_math2(P));
    }
    return x;
}

static jnode *s_math1(parser *P) {
    jnode *x = s_concat(P);
    for (;;) {
        jtok *t = s_cur(P);
        int op = s_is_op(t, "+") ? OP_ADD : s_is_op(t, "-") ? OP_SUB : 0;
        if (!x || !op) return x;
        P->pos++;
        x = s_bin(P, op, t->line, x, s_concat(P));
    }
}

static jnode *s_compare(parser *P) {
    jnode *x = s_math1(P);
    if (!x) return NULL;
    nvec v = {0};
    int line = s_cur(P)->line;
    for (;;) {
        jtok *t = s_cur(P);
        int op = s_is_op(t, "==")                                         ? OP_EQ
                 : s_is_op(t, "!=")                                       ? OP_NE
                 : s_is_op(t, "<")                                        ? OP_LT
                 : s_is_op(t, "<=")                                       ? OP_LE
                 : s_is_op(t, ">")                                        ? OP_GT
                 : s_is_op(t, ">=")                                       ? OP_GE
                 : s_is_name(t, "in")                                     ? OP_IN
                 : (s_is_name(t, "not") && s_is_name(s_peek(P, 1), "in")) ? OP_NOTIN
                                                                          : 0;
        if (!op) break;
        P->pos += op == OP_NOTIN ? 2 : 1;
        jnode *c = s_node(P, JN_CMP, t->line);
        if (!c || !(c->a = s_math1(P)) || s_vpush(P, &v, c)) {
            free(v.v);
            return NULL;
        }
        c->op = op;
    }
    if (!v.n) return x;
    jnode *c = s_node(P, JN_CMP, line);
    if (!c) {
        free(v.v);
        return NULL;
    }
    c->a = x;
    if (s_vfinish(P, &v, c)) return NULL;
    for (int i = 0; i < c->nkids; i++) c->kids[i]->h = c->kids[i]->a->h;
    return s_height(P, c);
}

static jnode *s_not(parser *P) {
    jtok *t = s_cur(P);
    if (s_is_name(t, "not")) {
        if (s_enter(P)) return NULL;
        P->pos++;
        jnode *x = s_node(P, JN_NOT, t->line);
        if (!x || !(x->a = s_not(P))) return NULL;
        P->depth--;
        return s_height(P, x);
    }
    return s_compare(P);
}

static jnode *s_and(parser *P) {
    jnode *x = s_not(P);
    while (x && s_is_name(s_cur(P), "and")) {
        jnode *y = s_node(P, JN_AND, s_cur(P)->line);
        P->pos++;
        if (!y || !(y->b = s_not(P))) return NULL;
        y->a = x;
        x = s_height(P, y);
    }
    return x;
}

static jnode *s_or(parser *P) {
    jnode *x = s_and(P);
    while (x && s_is_name(s_cur(P), "or")) {
        jnode *y = s_node(P, JN_OR, s_cur(P)->line);
        P->pos++;
        if (!y || !(y->b = s_and(P))) return NULL;
        y->a = x;
        x = s_height(P, y);
    }
    return x;
}

static jnode *s_expr(parser *P, int condexpr) {
    if (s_enter(P)) return NULL;
    jnode *x = s_or(P);
    while (condexpr && x && s_is_name(s_cur(P), "if")) {
        jnode *c = s_node(P, JN_COND, s_cur(P)->line);
        P->pos++;
        if (!c || !(c->b = s_or(P))) return NULL;
        if (s_is_name(s_cur(P), "else")) {
            P->pos++;
            if (!(c->c = s_expr(P, 1))) return NULL;
        }
        c->a = x;
        x = s_height(P, c);
    }
    P->depth--;
    return x;
}

/* an expression, or several separated by commas as a tuple */
static jnode *s_tuple(parser *P, int condexpr) {
    int line = s_cur(P)->line;
    jnode *x = s_expr(P, condexpr);
    if (!x || !s_is_op(s_cur(P), ",")) return x;
    nvec v = {0};
    if (s_vpush(P, &v, x)) return NULL;
    while (s_is_op(s_cur(P), ",")) {
        P->pos++;
        jtok *t = s_cur(P);
        if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || s_is_op(t, ")") || s_is_name(t, "if")) break;
        jnode *y = s_expr(P, condexpr);
        if (!y || s_vpush(P, &v, y)) {
            free(v.v);
            return NULL;
        }
    }
    jnode *tu = s_node(P, JN_TUPLE, line);
    if (!tu) {
        free(v.v);
        return NULL;
    }
    if (s_vfinish(P, &v, tu)) return NULL;
    return s_height(P, tu);
}

static int s_block_end(parser *P) {
    if (s_cur(P)->type != TK_BLOCK_END)
        return jerr_set(P->e, JINJA_SYNTAX, s_cur(P)->line, "expected end of statement block, got '%s'",
                        s_tokdesc(s_cur(P)));
    P->pos++;
    return 0;
}

/* statements until a block tag whose name is one of ends (not consumed: P->pos is at its name) */
static jnode *s_body(parser *P, const char *const *ends);

static int s_at_end(parser *P, const char *const *ends) {
    if (s_cur(P)->type != TK_BLOCK_BEGIN) return 0;
    jtok *nm = s_peek(P, 1);
    for (int i = 0; ends && ends[i]; i++)
        if (s_is_name(nm, ends[i])) return 1;
    return 0;
}

/* an assignment target: a name, a namespace attribute (name.attr) or names separated by commas */
static jnode *s_target(parser *P, int allow_attr) {
    jtok *t = s_cur(P);
    int paren = s_is_op(t, "(");
    if (paren) P->pos++;
    nvec v = {0};
    int line = s_cur(P)->line;
    for (;;) {
        jtok *n = s_cur(P);
        if (n->type != TK_NAME) {
            free(v.v);
            jerr_set(P->e, JINJA_SYNTAX, n->line, "expected a name to assign to");
            return NULL;
        }
        jnode *x = s_node(P, JN_NAME, n->line);
        if (!x || !(x->name = s_dup(P, n->s, n->n))) {
            free(v.v);
            return NULL;
        }
        P->pos++;
        if (allow_attr && !v.n && s_is_op(s_cur(P), ".") && s_peek(P, 1)->type == TK_NAME) {
            jnode *a = s_node(P, JN_ATTR, n->line);
            if (!a || !(a->name = s_dup(P, s_peek(P, 1)->s, s_peek(P, 1)->n))) return NULL;
            a->a = x;
            P->pos += 2;
            return a;
        }
        if (s_vpush(P, &v, x)) return NULL;
        if (!s_is_op(s_cur(P), ",")) break;
        P->pos++;
    }
    if (paren && s_expect_op(P, ")")) {
        free(v.v);
        return NULL;
    }
    if (v.n == 1 && !paren) {
        jnode *x = v.v[0];
        free(v.v);
        return x;
    }
    jnode *tu = s_node(P, JN_TUPLE, line);
    if (!tu) {
        free(v.v);
        return NULL;
    }
    if (s_vfinish(P, &v, tu)) return NULL;
    return tu;
}

static jnode *s_stmt_if(parser *P, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jnode *x = s_node(P, JN_IF, line);
    /* as in jinja2, the condition takes no inline "a if b else c" (it would read the tag's own if) */
    if (!x || !(x->a = s_tuple(P, 0)) || s_block_end(P) || !(x->b = s_body(P, ends))) return NULL;
    jtok *nm = s_peek(P, 1);
    P->pos += 2;
    if (s_is_name(nm, "elif")) { /* an elif chain nests in the parser: it counts against the depth */
        if (s_enter(P) || !(x->c = s_stmt_if(P, nm->line))) return NULL;
        P->depth--;
        return x;
    }
    if (s_is_name(nm, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (s_block_end(P) || !(x->c = s_body(P, ends2))) return NULL;
        P->pos += 2;
    }
    if (s_block_end(P)) return NULL;
    return x;
}

static jnode *s_stmt_for(parser *P, int line) {
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    jnode *x = s_node(P, JN_FOR, line);
    if (!x) return NULL;
    jnode *tg = s_target(P, 0);
    if (!tg) return NULL;
    if (tg->kind == JN_TUPLE) {
        x->kids = tg->kids;
        x->nkids = tg->nkids;
    } else {
        if (!(x->kids = ja_alloc(P->A, sizeof *x->kids))) {
            jerr_set(P->e, JINJA_NOMEM, line, "out of memory");
            return NULL;
        }
        x->kids[0] = tg;
        x->nkids = 1;
    }
    if (!s_is_name(s_cur(P), "in")) {
        jerr_set(P->e, JINJA_SYNTAX, line, "expected 'in' in a for loop");
        return NULL;
    }
    P->pos++;
    if (!(x->a = s_tuple(P, 0))) return NULL;
    if (s_is_name(s_cur(P), "if")) {
        P->pos++;
        if (!(x->d = s_expr(P, 1))) return NULL;
    }
    if (s_is_name(s_cur(P), "recursive")) {
        jerr_set(P->e, JINJA_UNSUPPORTED, line, "unsupported: recursive for loop");
        return NULL;
    }
    if (s_block_end(P) || !(x->b = s_body(P, ends))) return NULL;
    jtok *nm = s_peek(P, 1);
    P->pos += 2;
    if (s_is_name(nm, "else")) {
        if (s_block_end(P) || !(x->c = s_body(P, ends2))) return NULL;
        P->pos += 2;
    }
    if (s_block_end(P)) return NULL;
    return x;
}

static jnode *s_stmt_set(parser *P, int line) {
    jnode *tg = s_target(P, 1);
    if (!tg) return NULL;
    if (s_cur(P)->type == TK_BLOCK_END) {
        static const char *const ends[] = {"endset", NULL};
        if (tg->kind != JN_NAME) {
            jerr_set(P->e, JINJA_SYNTAX, line, "a block set assigns one name");
            return NULL;
        }
        jnode *x = s_node(P, JN_SETBLOCK, line);
        P->pos++;
        if (!x || !(x->b = s_body(P, ends))) return NULL;
        P->pos += 2;
        if (s_block_end(P)) return NULL;
        x->a = tg;
        return x;
    }
    if (s_is_op(s_cur(P), "|")) {
        jerr_set(P->e, JINJA_UNSUPPORTED, line, "unsupported: filtered block set");
        return NULL;
    }
    if (s_expect_op(P, "=")) return NULL;
    jnode *x = s_node(P, JN_SET, line);
    if (!x || !(x->b = s_tuple(P, 1)) || s_block_end(P)) return NULL;
    x->a = tg;
    return x;
}

static jnode *s_stmt_macro(parser *P, int line) {
    static const char *const ends[] = {"endmacro", NULL};
    jtok *t = s_cur(P);
    jnode *x = s_node(P, JN_MACRO, line);
    if (!x) return NULL;
    if (t->type != TK_NAME) {
        jerr_set(P->e, JINJA_SYNTAX, line, "expected a macro name");
        return NULL;
    }
    if (!(x->name = s_dup(P, t->s, t->n))) return NULL;
    P->pos++;
    if (s_expect_op(P, "(")) return NULL;
    nvec v = {0};
    while (!s_is_op(s_cur(P), ")")) {
        if (v.n && s_expect_op(P, ",")) goto fail;
        jtok *n = s_cur(P);
        if (n->type != TK_NAME) {
            jerr_set(P->e, JINJA_SYNTAX, n->line, "expected a parameter name");
            goto fail;
        }
        jnode *p = s_node(P, JN_NAME, n->line);
        if (!p || !(p->name = s_dup(P, n->s, n->n))) goto fail;
        P->pos++;
        if (s_is_op(s_cur(P), "=")) {
            P->pos++;
            if (!(p->a = s_expr(P, 1))) goto fail;
        }
        if (s_vpush(P, &v, p)) goto fail;
    }
    P->pos++;
    if (s_vfinish(P, &v, x)) return NULL;
    if (s_block_end(P) || !(x->b = s_body(P, ends))) return NULL;
    P->pos += 2;
    if (s_cur(P)->type == TK_NAME) P->pos++; /* {% endmacro name %} */
    if (s_block_end(P)) return NULL;
    return x;
fail:
    free(v.v);
    return NULL;
}

static jnode *s_stmt(parser *P) {
    jtok *t = s_cur(P);
    if (t->type == TK_DATA) {
        P->pos++;
        return s_literal_str(P, t->line, t->s, t->n);
    }
    if (t->type == TK_VAR_BEGIN) {
        P->pos++;
        jnode *x = s_node(P, JN_OUTPUT, t->line);
        if (!x || !(x->a = s_tuple(P, 1))) return NULL;
        if (s_cur(P)->type != TK_VAR_END) {
            jerr_set(P->e, JINJA_SYNTAX, s_cur(P)->line, "expected end of print statement, got '%s'",
                     s_tokdesc(s_cur(P)));
            return NULL;
        }
        P->pos++;
        return x;
    }
    if (t->type != TK_BLOCK_BEGIN) {
        jerr_set(P->e, JINJA_SYNTAX, t->line, "unexpected '%s'", s_tokdesc(t));
        return NULL;
    }
    jtok *nm = s_peek(P, 1);
    int line = nm->line;
    if (nm->type != TK_NAME) {
        jerr_set(P->e, JINJA_SYNTAX, line, "tag name expected");
        return NULL;
    }
    P->pos += 2;
    if (s_is_name(nm, "if")) return s_stmt_if(P, line);
    if (s_is_name(nm, "for")) return s_stmt_for(P, line);
    if (s_is_name(nm, "set")) return s_stmt_set(P, line);
    if (s_is_name(nm, "macro")) return s_stmt_macro(P, line);
    if (s_is_name(nm, "break") || s_is_name(nm, "continue")) {
        jnode *x = s_node(P, s_is_name(nm, "break") ? JN_BREAK : JN_CONTINUE, line);
        if (!x || s_block_end(P)) return NULL;
        return x;
    }
    if (s_is_name(nm, "generation")) { /* transformers' AssistantTracker: marks text, renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        jnode *x;
        if (s_block_end(P) || !(x = s_body(P, ends))) return NULL;
        P->pos += 2;
        if (s_block_end(P)) return NULL;
        return x;
    }
    static const char *const unsup[] = {"call",  "filter", "include",    "import", "from",  "extends",
                                        "block", "with",   "autoescape", "do",     "trans", NULL};
    for (int i = 0; unsup[i]; i++)
        if (s_is_name(nm, unsup[i])) {
            jerr_set(P->e, JINJA_UNSUPPORTED, line, "unsupported tag '%s'", unsup[i]);
            return NULL;
        }
    jerr_set(P->e, JINJA_SYNTAX, line, "unknown tag '%s'", nm->s);
    return NULL;
}

static jnode *s_body(parser *P, const char *const *ends) {
    if (s_enter(P)) return NULL;
    jnode *b = s_node(P, JN_BLOCK, s_cur(P)->line);
    nvec v = {0};
    if (!b) return NULL;
    while (!s_at_end(P, ends)) {
        if (s_cur(P)->type == TK_EOF) {
            if (ends) {
                jerr_set(P->e, JINJA_SYNTAX, s_cur(P)->line, "unexpected end of template: missing '%s'", ends[0]);
                goto fail;
            }
            break;
        }
        if (s_cur(P)->type == TK_BLOCK_BEGIN && s_peek(P, 1)->type == TK_NAME) {
            jtok *nm = s_peek(P, 1);
            static const char *const closers[] = {"endif", "endfor", "endset",        "endmacro",
                                                  "else",  "elif",   "endgeneration", NULL};
            for (int i = 0; closers[i]; i++)
                if (s_is_name(nm, closers[i])) {
                    jerr_set(P->e, JINJA_SYNTAX, nm->line, "unexpected '%s'", closers[i]);
                    goto fail;
                }
        }
        jnode *s = s_stmt(P);
        if (!s || s_vpush(P, &v, s)) goto fail;
    }
    if (s_vfinish(P, &v, b)) return NULL;
    P->depth--;
    return b;
fail:
    free(v.v);
    return NULL;
}

jinja_limits jinja_limits_default(void) {
    jinja_limits l = {.max_template = 256 << 10,
                      .max_depth = 100,
                      .max_iters = 100000,
                      .max_output = 16 << 20,
                      .max_memory = 256 << 20,
                      .max_calls = 20};
    return l;
}

jinja_tmpl *jinja_parse(const char *src, size_t len, const jinja_limits *lim, int *code, char *err, size_t errlen) {
    jerr e = {0};
    jtok *toks = NULL;
    int ntok = 0;
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        jerr_set(&e, JINJA_NOMEM, 0, "out of memory");
        goto fail;
    }
    t->lim = lim ? *lim : jinja_limits_default();
    if (len > t->lim.max_template) {
        jerr_set(&e, JINJA_LIMIT, 0, "template of %zu bytes exceeds the limit of %zu", len, t->lim.max_template);
        goto fail;
    }
    if (jlex(src, len, &toks, &ntok, &e)) goto fail;
    parser P = {.t = toks, .n = ntok, .A = &t->arena, .e = &e, .max_depth = t->lim.max_depth};
    t->root = s_body(&P, NULL);
    if (!t->root) goto fail;
    jlex_free(toks, ntok);
    return t;
fail:
    if (toks) jlex_free(toks, ntok);
    jinja_tmpl_destroy(&t);
    if (code) *code = e.code ? e.code : JINJA_SYNTAX;
    if (err && errlen) {
        if (e.line) snprintf(err, errlen, "line %d: %s", e.line, e.msg);
        else snprintf(err, errlen, "%s", e.msg);
    }
    return NULL;
}

void jinja_tmpl_destroy(jinja_tmpl **tp) {
    if (!tp || !*tp) return;
    ja_free_all(&(*tp)->arena);
    free(*tp);
    *tp = NULL;
}
