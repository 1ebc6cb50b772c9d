/* common/jinja_value.c: the Jinja interpreter's values: the arena they live in, constructors, truth, equality,
 * and their text forms as Python writes them (str, repr, json.dumps(ensure_ascii=False)). */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->oom) return NULL;
    if (a->cap && a->used + n > a->cap) {
        a->oom = a->over = 1;
        return NULL;
    }
    struct jchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) {
            a->oom = 1;
            return NULL;
        }
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(jarena *a) {
    struct jchunk *c = a->head;
    while (c) {
        struct jchunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used = 0;
    a->oom = a->over = 0;
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->over) return;
    if ((b->max && b->n + n > b->max)) {
        b->over = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->over = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) jb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

int jerr_set(jerr *e, int code, int line, const char *fmt, ...) {
    if (e->code) return e->code;
    e->code = code;
    e->line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

jv jv_undef(const char *name) {
    jv v = {.t = JV_UNDEF};
    v.u.uname = name;
    return v;
}
jv jv_none(void) {
    jv v = {.t = JV_NONE};
    return v;
}
jv jv_bool(int b) {
    jv v = {.t = JV_BOOL};
    v.u.i = b != 0;
    return v;
}
jv jv_int(int64_t i) {
    jv v = {.t = JV_INT};
    v.u.i = i;
    return v;
}
jv jv_float(double f) {
    jv v = {.t = JV_FLOAT};
    v.u.f = f;
    return v;
}

jv jv_string(jinja_env *e, const char *s, size_t n) {
    jv_str *p = ja_alloc(&e->arena, sizeof *p + n + 1);
    if (!p) return jv_undef(NULL);
    p->n = n;
    if (n) memcpy(p->s, s, n);
    p->s[n] = 0;
    jv v = {.t = JV_STR};
    v.u.s = p;
    return v;
}
jv jv_str_of(jinja_env *e, const char *s) { return jv_string(e, s, strlen(s)); }

int jerr_oom(jinja_env *e, int line) {
    if (e->deep) return jerr_set(&e->err, JINJA_LIMIT, line, "a value is nested too deeply to print");
    if (e->arena.over)
        return jerr_set(&e->err, JINJA_LIMIT, line, "template used more than %zu bytes of memory or output",
                        e->lim.max_memory);
    return jerr_set(&e->err, JINJA_NOMEM, line, "out of memory");
}

jv jv_from_buf(jinja_env *e, jbuf *b) {
    int bad = b->over || b->deep;
    jv v = bad ? jv_undef(NULL) : jv_string(e, b->p ? b->p : "", b->n);
    if (b->deep) e->deep = 1;
    else if (b->over) e->arena.oom = e->arena.over = 1;
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    return v;
}

jv jv_list_new(jinja_env *e) {
    jv_list *l = ja_alloc(&e->arena, sizeof *l);
    if (!l) return jv_undef(NULL);
    jv v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}
jv jv_tuple_new(jinja_env *e) {
    jv v = jv_list_new(e);
    if (v.t == JV_LIST) v.u.l->tuple = 1;
    return v;
}

jv jv_dict_new(jinja_env *e) {
    jv_dict *d = ja_alloc(&e->arena, sizeof *d);
    if (!d) return jv_undef(NULL);
    jv v = {.t = JV_DICT};
    v.u.d = d;
    return v;
}

int jv_list_push(jinja_env *e, jv list, jv v) {
    if (list.t != JV_LIST) return -1;
    jv_list *l = list.u.l;
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(&e->arena, c * sizeof *nv);
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = c;
    }
    l->v[l->n++] = v;
    return 0;
}

int jv_dict_set(jinja_env *e, jv dict, jv key, jv v) {
    if (dict.t != JV_DICT) return -1;
    jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(&e->arena, c * sizeof *nk), *nv = ja_alloc(&e->arena, c * sizeof *nv);
        if (!nk || !nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = c;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
    return 0;
}

int jv_dict_get(jv d, const char *key, size_t n, jv *out) {
    if (d.t != JV_DICT) return 0;
    for (size_t i = 0; i < d.u.d->n; i++) {
        jv k = d.u.d->k[i];
        if (k.t == JV_STR && k.u.s->n == n && memcmp(k.u.s->s, key, n) == 0) {
            *out = d.u.d->v[i];
            return 1;
        }
    }
    return 0;
}

int jv_dict_find(jv d, jv key, jv *out) {
    if (d.t != JV_DICT) return 0;
    for (size_t i = 0; i < d.u.d->n; i++)
        if (jv_equal(d.u.d->k[i], key)) {
            if (out) *out = d.u.d->v[i];
            return 1;
        }
    return 0;
}

int jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL:
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->kind == LK_GEN || v.u.l->n != 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n != 0;
    case JV_FUNC: return 1;
    }
    return 0;
}

static int s_is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }

static int s_equal(jv a, jv b, int depth);
int jv_equal(jv a, jv b) { return s_equal(a, b, 0); }

/* == as Python compares; containers nested deeper than REPR_DEPTH compare unequal (Python: RecursionError) */
static int s_equal(jv a, jv b, int depth) {
    if (depth > 200) return 0;
    if (s_is_num(a) && s_is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT)
            return (a.t == JV_FLOAT ? a.u.f : (double)a.u.i) == (b.t == JV_FLOAT ? b.u.f : (double)b.u.i);
        return a.u.i == b.u.i;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s->n == b.u.s->n && memcmp(a.u.s->s, b.u.s->s, a.u.s->n) == 0;
    case JV_LIST:
        if (a.u.l->kind || b.u.l->kind) return a.u.l == b.u.l;
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!s_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->ns || b.u.d->ns) return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jv_dict_find(b, a.u.d->k[i], &o) || !s_equal(a.u.d->v[i], o, depth + 1)) return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

const char *jv_type_name(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
    if (v.t == JV_LIST && v.u.l->tuple) return "tuple";
    if (v.t == JV_LIST && v.u.l->kind) {
        static const char *kinds[] = {"list", "generator", "dict_items", "dict_keys", "dict_values"};
        return kinds[v.u.l->kind];
    }
    if (v.t == JV_DICT && v.u.d->ns) return "Namespace";
    return names[v.t];
}

/* Python's repr(float): the shortest text that reads back as f; fixed notation for exponents -4..15 */
static void s_float(jbuf *b, double f) {
    if (isnan(f)) {
        jb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char t[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f) break;
    }
    /* t is [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) jb_put(b, "-", 1);
    if (ex >= 16 || ex < -4) {
        jb_put(b, digits, 1);
        if (nd > 1) {
            jb_put(b, ".", 1);
            jb_put(b, digits + 1, (size_t)nd - 1);
        }
        jb_printf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex < 0) {
        jb_puts(b, "0.");
        for (int i = 0; i < -ex - 1; i++) jb_put(b, "0", 1);
        jb_put(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i <= ex; i++) jb_put(b, i < nd ? &digits[i] : "0", 1);
        jb_put(b, ".", 1);
        if (nd > ex + 1) jb_put(b, digits + ex + 1, (size_t)(nd - ex - 1));
        else jb_put(b, "0", 1);
    }
}

/* Python's str.isprintable() for one code point: not a control, format, surrogate, private-use, unassigned or
 * separator character (the ASCII space excepted) */
static int s_printable(int32_t cp) {
    if (cp == ' ') return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
             c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
             c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
}

static void s_repr_str(jbuf *b, const char *s, size_t n) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jb_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            if (c == (unsigned char)q || c == '\\') {
                jb_put(b, "\\", 1);
                jb_put(b, s + i, 1);
            } else if (c == '\n') jb_puts(b, "\\n");
            else if (c == '\r') jb_puts(b, "\\r");
            else if (c == '\t') jb_puts(b, "\\t");
            else if (c < 0x20 || c == 0x7f) jb_printf(b, "\\x%02x", c);
            else jb_put(b, s + i, 1);
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) {
            jb_printf(b, "\\udc%02x", c);
            i++;
            continue;
        } /* surrogateescape, as Python decodes it */
        if (s_printable(cp)) jb_put(b, s + i, (size_t)k);
        else if (cp < 0x100) jb_printf(b, "\\x%02x", cp);
        else if (cp < 0x10000) jb_printf(b, "\\u%04x", cp);
        else jb_printf(b, "\\U%08x", cp);
        i += (size_t)k;
    }
    jb_put(b, &q, 1);
}

#define REPR_DEPTH 200 /* Python would raise RecursionError; we report the value as too deep */

/* repr with the containers being printed on a stack: a namespace met again prints as {...}, as Python's dict
 * repr does for its own recursion */
static void s_repr(jbuf *b, jv v, const void **stack, int depth) {
    if (depth >= REPR_DEPTH) {
        b->deep = 1;
        return;
    }
    switch (v.t) {
    case JV_UNDEF: jb_puts(b, "Undefined"); return;
    case JV_STR: s_repr_str(b, v.u.s->s, v.u.s->n); return;
    case JV_LIST:
        if (v.u.l->kind == LK_GEN) {
            jb_puts(b, "<generator object>");
            return;
        }
        if (v.u.l->kind)
            jb_puts(b, v.u.l->kind == LK_ITEMS  ? "dict_items("
                       : v.u.l->kind == LK_KEYS ? "dict_keys("
                                                : "dict_values(");
        jb_puts(b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n && !b->deep; i++) {
            if (i) jb_puts(b, ", ");
            s_repr(b, v.u.l->v[i], stack, depth + 1);
        }
        jb_puts(b, v.u.l->tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
        if (v.u.l->kind) jb_puts(b, ")");
        return;
    case JV_DICT:
        if (v.u.d->ns) jb_puts(b, "<Namespace ");
        for (int k = 0; k < depth; k++)
            if (stack[k] == v.u.d) {
                jb_puts(b, v.u.d->ns ? "{...}>" : "{...}");
                return;
            }
        stack[depth] = v.u.d;
        jb_puts(b, "{");
        for (size_t i = 0; i < v.u.d->n && !b->deep; i++) {
            if (i) jb_puts(b, ", ");
            s_repr(b, v.u.d->k[i], stack, depth + 1);
            jb_puts(b, ": ");
            s_repr(b, v.u.d->v[i], stack, depth + 1);
        }
        stack[depth] = NULL;
        jb_puts(b, v.u.d->ns ? "}>" : "}");
        return;
    default: jv_to_str(b, v);
    }
}

void jv_repr(jbuf *b, jv v) {
    const void *stack[REPR_DEPTH] = {0};
    s_repr(b, v, stack, 0);
}

void jv_to_str(jbuf *b, jv v) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.u.i ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: s_float(b, v.u.f); return;
    case JV_STR: jb_put(b, v.u.s->s, v.u.s->n); return;
    case JV_FUNC:
        if (v.u.fn->kind == FN_MACRO) jb_printf(b, "<Macro '%s'>", v.u.fn->name ? v.u.fn->name : "");
        else jb_printf(b, "<built-in function %s>", v.u.fn->name ? v.u.fn->name : "");
        return;
    default: jv_repr(b, v);
    }
}

static void s_json_str(jbuf *b, const char *s, size_t n) {
    jb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        }
        if (esc) {
            jb_put(b, s + i - run, run);
            run = 0;
            jb_puts(b, esc);
        } else run++;
    }
    jb_put(b, s + n - run, run);
    jb_put(b, "\"", 1);
}

static void s_json_nl(jbuf *b, int indent, int level) {
    jb_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++) jb_put(b, " ", 1);
}

static int s_strcmp_jv(const void *x, const void *y) {
    const jv *a = x, *c = y;
    size_t n = a->u.s->n < c->u.s->n ? a->u.s->n : c->u.s->n;
    int r = memcmp(a->u.s->s, c->u.s->s, n);
    return r ? r : (a->u.s->n > c->u.s->n) - (a->u.s->n < c->u.s->n);
}

/* returns 0, or -1 for a value json.dumps refuses (Undefined, functions, non-string keys of other kinds) */
int jv_to_json(jbuf *b, jv v, int indent, int level, const char *item_sep, const char *key_sep, int sort_keys,
               int depth) {
    if (depth > 100) return -1;
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v.u.i ? "true" : "false"); return 0;
    case JV_INT: jv_to_str(b, v); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f)) jb_puts(b, "NaN");
        else if (isinf(v.u.f)) jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else s_float(b, v.u.f);
        return 0;
    case JV_STR: s_json_str(b, v.u.s->s, v.u.s->n); return 0;
    case JV_LIST:
        if (v.u.l->kind) return -1;
        if (!v.u.l->n) {
            jb_puts(b, "[]");
            return 0;
        }
        jb_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(b, item_sep);
            if (indent >= 0) s_json_nl(b, indent, level + 1);
            if (jv_to_json(b, v.u.l->v[i], indent, level + 1, item_sep, key_sep, sort_keys, depth + 1)) return -1;
        }
        if (indent >= 0) s_json_nl(b, indent, level);
        jb_puts(b, "]");
        return 0;
    case JV_DICT: {
        if (v.u.d->ns) return -1;
        if (!v.u.d->n) {
            jb_puts(b, "{}");
            return 0;
        }
        size_t n = v.u.d->n;
        size_t *order = malloc(n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (sort_keys) {
            for (size_t i = 0; i < n; i++)
                if (v.u.d->k[i].t != JV_STR) {
                    free(order);
                    return -1;
                }
            for (size_t i = 1; i < n; i++) /* insertion sort: dicts in templates are small */
                for (size_t j = i; j > 0 && s_strcmp_jv(&v.u.d->k[order[j - 1]], &v.u.d->k[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        }
        jb_puts(b, "{");
        for (size_t x = 0; x < n; x++) {
            size_t i = order[x];
            jv k = v.u.d->k[i];
            if (x) jb_puts(b, item_sep);
            if (indent >= 0) s_json_nl(b, indent, level + 1);
            if (k.t == JV_STR) s_json_str(b, k.u.s->s, k.u.s->n);
            else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                jbuf t = {0};
                if (jv_to_json(&t, k, -1, 0, ", ", ": ", 0, depth + 1)) {
                    free(t.p);
                    free(order);
                    return -1;
                }
                jb_puts(b, "\"");
                jb_put(b, t.p ? t.p : "", t.n);
                jb_puts(b, "\"");
                free(t.p);
            } else {
                free(order);
                return -1;
            }
            jb_puts(b, key_sep);
            if (jv_to_json(b, v.u.d->v[i], indent, level + 1, item_sep, key_sep, sort_keys, depth + 1)) {
                free(order);
                return -1;
            }
        }
        free(order);
        if (indent >= 0) s_json_nl(b, indent, level);
        jb_puts(b, "}");
        return 0;
    }
    default: return -1;
    }
}

/* ---- UTF-8 ---- */
int ju_space_len(const char *s, const char *end) {
    const unsigned char *p = (const unsigned char *)s;
    size_t left = (size_t)(end - s);
    if (!left) return 0;
    unsigned c = p[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    if (left >= 2 && c == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0)) return 2;
    if (left < 3) return 0;
    if (c == 0xE1 && p[1] == 0x9A && p[2] == 0x80) return 3; /* U+1680 */
    if (c == 0xE2 && p[1] == 0x80 && ((p[2] >= 0x80 && p[2] <= 0x8A) || p[2] == 0xA8 || p[2] == 0xA9 || p[2] == 0xAF))
        return 3;                                            /* U+2000-200A, 2028/9, 202F */
    if (c == 0xE2 && p[1] == 0x81 && p[2] == 0x9F) return 3; /* U+205F */
    if (c == 0xE3 && p[1] == 0x80 && p[2] == 0x80) return 3; /* U+3000 */
    return 0;
}

static size_t s_cp_bytes(const char *s, size_t left) {
    size_t k = 1;
    while (k < left && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
    return k;
}

size_t ju_cplen(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t ju_cp_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k && i < n) {
        i += s_cp_bytes(s + i, n - i);
        k--;
    }
    return i;
}

/* str.strip/lstrip/rstrip: whitespace when chars is NULL, else any code point of chars */
static int s_in_chars(const char *s, size_t len, const char *chars, size_t nchars) {
    for (size_t i = 0; i < nchars;) {
        size_t k = s_cp_bytes(chars + i, nchars - i);
        if (k == len && memcmp(chars + i, s, k) == 0) return 1;
        i += k;
    }
    return 0;
}

void ju_strip(const char **s, size_t *n, const char *chars, size_t nchars, int left, int right) {
    const char *p = *s, *end = *s + *n;
    if (left)
        while (p < end) {
            size_t k = chars ? s_cp_bytes(p, (size_t)(end - p)) : (size_t)ju_space_len(p, end);
            if (!k || (chars && !s_in_chars(p, k, chars, nchars))) break;
            p += k;
        }
    if (right) {
        const char *keep = p, *q = p;
        while (q < end) {
            size_t k = s_cp_bytes(q, (size_t)(end - q));
            int strip = chars ? s_in_chars(q, k, chars, nchars) : ju_space_len(q, end) > 0;
            if (!chars && strip) k = (size_t)ju_space_len(q, end);
            q += k;
            if (!strip) keep = q;
        }
        end = keep;
    }
    *s = p;
    *n = (size_t)(end - p);
}
