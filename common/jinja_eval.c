/* common/jinja_eval.c: runs a parsed template. Scopes follow Jinja: a for loop's body gets a fresh scope each
 * iteration (a set inside it is not seen after the loop or in the next iteration), if blocks share their
 * enclosing scope, a macro runs in a scope under the one it was defined in; names not found anywhere are
 * undefined (printed as "", false, iterable as empty; using one in arithmetic or taking an attribute of one is an
 * error). Values are Python's: str/repr forms, truth, int/float arithmetic, slicing by code point. */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jscope {
    jscope *parent;
    jv vars;
};

enum { X_OK = 0, X_BREAK = 1, X_CONTINUE = 2 };

static int s_exec(jinja_env *e, jscope *sc, const jnode *n);

static int s_oom(jinja_env *e, int line) { return jerr_oom(e, line); }

static int s_lookup(jinja_env *e, jscope *sc, const char *name, jv *out) {
    size_t n = strlen(name);
    for (; sc; sc = sc->parent)
        if (jv_dict_get(sc->vars, name, n, out)) return 1;
    return jv_dict_get(e->globals, name, n, out);
}

static int s_assign(jinja_env *e, jscope *sc, const char *name, jv v, int line) {
    jv k = jv_str_of(e, name);
    if (k.t != JV_STR || jv_dict_set(e, sc->vars, k, v)) return s_oom(e, line);
    return 0;
}

static int s_undef_err(jinja_env *e, jv v, int line) {
    if (v.u.uname) return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' is undefined", v.u.uname);
    return jerr_set(&e->err, JINJA_RUNTIME, line, "use of an undefined value");
}

jv jeval_getattr(jinja_env *e, jv obj, const char *name, size_t n) {
    jv out;
    if (obj.t == JV_DICT && !obj.u.d->ns && jbi_has_method(obj, name)) goto method;
    if (obj.t == JV_DICT) return jv_dict_get(obj, name, n, &out) ? out : jv_undef(NULL);
    if (obj.t == JV_STR && jbi_has_method(obj, name)) goto method;
    return jv_undef(NULL);
method : {
    jv_func *f = ja_alloc(&e->arena, sizeof *f);
    if (!f) return jv_undef(NULL);
    f->kind = FN_METHOD;
    f->name = name;
    f->self = obj;
    jv v = {.t = JV_FUNC};
    v.u.fn = f;
    return v;
}
}

static int s_index(jv key, int64_t *i) {
    if (key.t != JV_INT && key.t != JV_BOOL) return 0;
    *i = key.u.i;
    return 1;
}

jv jeval_getitem(jinja_env *e, jv obj, jv key) {
    int64_t i;
    jv out;
    if (obj.t == JV_DICT) {
        if (!obj.u.d->ns && jv_dict_find(obj, key, &out)) return out;
        if (key.t == JV_STR && !obj.u.d->ns && jbi_has_method(obj, key.u.s->s))
            return jeval_getattr(e, obj, key.u.s->s, key.u.s->n);
        return jv_undef(NULL);
    }
    if (obj.t == JV_LIST && obj.u.l->kind) return jv_undef(NULL); /* generators and dict views */
    if (obj.t == JV_LIST && s_index(key, &i)) {
        int64_t n = (int64_t)obj.u.l->n;
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj.u.l->v[i] : jv_undef(NULL);
    }
    if (obj.t == JV_STR && s_index(key, &i)) {
        int64_t n = (int64_t)ju_cplen(obj.u.s->s, obj.u.s->n);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return jv_undef(NULL);
        size_t a = ju_cp_offset(obj.u.s->s, obj.u.s->n, (size_t)i);
        size_t b = ju_cp_offset(obj.u.s->s + a, obj.u.s->n - a, 1);
        return jv_string(e, obj.u.s->s + a, b);
    }
    if (key.t == JV_STR) return jeval_getattr(e, obj, key.u.s->s, key.u.s->n);
    return jv_undef(NULL);
}

/* Python's slice.indices() */
static int s_slice_indices(jinja_env *e, int64_t len, jv *sv, int64_t *start, int64_t *stop, int64_t *step, int line) {
    for (int k = 0; k < 3; k++)
        if (sv[k].t != JV_NONE && sv[k].t != JV_UNDEF && sv[k].t != JV_INT && sv[k].t != JV_BOOL)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "slice indices must be integers or None");
    *step = sv[2].t == JV_INT || sv[2].t == JV_BOOL ? sv[2].u.i : 1;
    if (*step == 0) return jerr_set(&e->err, JINJA_RUNTIME, line, "slice step cannot be zero");
    int has[2] = {sv[0].t == JV_INT || sv[0].t == JV_BOOL, sv[1].t == JV_INT || sv[1].t == JV_BOOL};
    int64_t v[2];
    for (int k = 0; k < 2; k++) {
        if (!has[k]) {
            v[k] = k == 0 ? (*step > 0 ? 0 : len - 1) : (*step > 0 ? len : -1);
            continue;
        }
        int64_t x = sv[k].u.i;
        if (x < 0) {
            x += len;
            if (x < 0) x = *step > 0 ? 0 : -1;
        } else if (x >= len) x = *step > 0 ? len : len - 1;
        v[k] = x;
    }
    *start = v[0];
    *stop = v[1];
    return 0;
}

static int s_slice(jinja_env *e, jv obj, jv *sv, int line, jv *out) {
    int64_t start, stop, step;
    if (obj.t == JV_LIST && !obj.u.l->kind) {
        if (s_slice_indices(e, (int64_t)obj.u.l->n, sv, &start, &stop, &step, line)) return -1;
        jv l = obj.u.l->tuple ? jv_tuple_new(e) : jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, line);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (jv_list_push(e, l, obj.u.l->v[i])) return s_oom(e, line);
        *out = l;
        return 0;
    }
    if (obj.t == JV_STR) {
        const char *s = obj.u.s->s;
        size_t n = obj.u.s->n;
        int64_t len = (int64_t)ju_cplen(s, n);
        if (s_slice_indices(e, len, sv, &start, &stop, &step, line)) return -1;
        jbuf b = {0};
        if (step == 1) {
            if (stop > start) {
                size_t a = ju_cp_offset(s, n, (size_t)start), z = ju_cp_offset(s, n, (size_t)stop);
                jb_put(&b, s + a, z - a);
            }
        } else {
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                size_t a = ju_cp_offset(s, n, (size_t)i), z = ju_cp_offset(s + a, n - a, 1);
                jb_put(&b, s + a, z);
            }
        }
        *out = jv_from_buf(e, &b);
        if (out->t != JV_STR) return s_oom(e, line);
        return 0;
    }
    if (obj.t == JV_UNDEF) return s_undef_err(e, obj, line);
    if (obj.t == JV_DICT && !obj.u.d->ns) return jerr_set(&e->err, JINJA_RUNTIME, line, "unhashable type: 'slice'");
    *out = jv_undef(NULL); /* jinja2's getitem: what cannot be subscripted gives undefined */
    return 0;
}

static int s_is_num(jv v) { return v.t == JV_INT || v.t == JV_BOOL || v.t == JV_FLOAT; }
static double s_num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

static int s_typeerr(jinja_env *e, int line, const char *op, jv a, jv b) {
    if (a.t == JV_UNDEF) return s_undef_err(e, a, line);
    if (b.t == JV_UNDEF) return s_undef_err(e, b, line);
    return jerr_set(&e->err, JINJA_RUNTIME, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                    jv_type_name(a), jv_type_name(b));
}

static int s_overflow(jinja_env *e, int line) {
    return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: integer result outside 64 bits");
}

static int s_repeat(jinja_env *e, jv seq, int64_t k, int line, jv *out) {
    if (k < 0) k = 0;
    if (seq.t == JV_STR) {
        if (k && seq.u.s->n && (uint64_t)k > e->lim.max_output / seq.u.s->n)
            return jerr_set(&e->err, JINJA_LIMIT, line, "string repetition exceeds the output limit");
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++) jb_put(&b, seq.u.s->s, seq.u.s->n);
        *out = jv_from_buf(e, &b);
        return out->t == JV_STR ? 0 : s_oom(e, line);
    }
    if (k && seq.u.l->n && (uint64_t)k > (uint64_t)e->lim.max_iters / seq.u.l->n)
        return jerr_set(&e->err, JINJA_LIMIT, line, "list repetition exceeds the iteration limit");
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    l.u.l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++)
            if (jv_list_push(e, l, seq.u.l->v[j])) return s_oom(e, line);
    *out = l;
    return 0;
}

static int s_binop(jinja_env *e, int op, jv a, jv b, int line, jv *out) {
    static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == OP_CONCAT) {
        jbuf buf = {0};
        jv_to_str(&buf, a);
        jv_to_str(&buf, b);
        *out = jv_from_buf(e, &buf);
        return out->t == JV_STR ? 0 : s_oom(e, line);
    }
    int ints = (a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL);
    if (s_is_num(a) && s_is_num(b)) {
        int64_t x = a.u.i, y = b.u.i, r;
        double fx = s_num(a), fy = s_num(b);
        switch (op) {
        case OP_ADD:
            if (!ints) {
                *out = jv_float(fx + fy);
                return 0;
            }
            if (__builtin_add_overflow(x, y, &r)) return s_overflow(e, line);
            *out = jv_int(r);
            return 0;
        case OP_SUB:
            if (!ints) {
                *out = jv_float(fx - fy);
                return 0;
            }
            if (__builtin_sub_overflow(x, y, &r)) return s_overflow(e, line);
            *out = jv_int(r);
            return 0;
        case OP_MUL:
            if (!ints) {
                *out = jv_float(fx * fy);
                return 0;
            }
            if (__builtin_mul_overflow(x, y, &r)) return s_overflow(e, line);
            *out = jv_int(r);
            return 0;
        case OP_DIV:
            if (fy == 0) return jerr_set(&e->err, JINJA_RUNTIME, line, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints ? y == 0 : fy == 0)
                return jerr_set(&e->err, JINJA_RUNTIME, line, "integer division or modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) return s_overflow(e, line);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == OP_MOD ? m : q);
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(op == OP_MOD ? m : floor(fx / fy));
            }
            return 0;
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t k = 0; k < y; k++) {
                    if (__builtin_mul_overflow(acc, x, &acc)) return s_overflow(e, line);
                    if (acc == 0 || acc == 1) break;
                }
                *out = jv_int(acc);
                return 0;
            }
            if (fx == 0 && fy < 0)
                return jerr_set(&e->err, JINJA_RUNTIME, line, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(fx, fy));
            return 0;
        }
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        jbuf buf = {0};
        jb_put(&buf, a.u.s->s, a.u.s->n);
        jb_put(&buf, b.u.s->s, b.u.s->n);
        *out = jv_from_buf(e, &buf);
        return out->t == JV_STR ? 0 : s_oom(e, line);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->kind &&
        !b.u.l->kind) {
        jv l = a.u.l->tuple ? jv_tuple_new(e) : jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, line);
        for (size_t i = 0; i < a.u.l->n; i++)
            if (jv_list_push(e, l, a.u.l->v[i])) return s_oom(e, line);
        for (size_t i = 0; i < b.u.l->n; i++)
            if (jv_list_push(e, l, b.u.l->v[i])) return s_oom(e, line);
        *out = l;
        return 0;
    }
    if (op == OP_MUL && (a.t == JV_STR || (a.t == JV_LIST && !a.u.l->kind)) && (b.t == JV_INT || b.t == JV_BOOL))
        return s_repeat(e, a, b.u.i, line, out);
    if (op == OP_MUL && (b.t == JV_STR || (b.t == JV_LIST && !b.u.l->kind)) && (a.t == JV_INT || a.t == JV_BOOL))
        return s_repeat(e, b, a.u.i, line, out);
    if (op == OP_MOD && a.t == JV_STR)
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: %% string formatting");
    return s_typeerr(e, line, names[op], a, b);
}

/* 1 / 0 for a comparison, -1 on error */
static int s_compare(jinja_env *e, int op, jv a, jv b, int line) {
    if (op == OP_EQ) return jv_equal(a, b);
    if (op == OP_NE) return !jv_equal(a, b);
    if (op == OP_IN || op == OP_NOTIN) {
        int r;
        if (b.t == JV_STR) {
            if (a.t != JV_STR) {
                if (a.t == JV_UNDEF) return s_undef_err(e, a, line), -1;
                return jerr_set(&e->err, JINJA_RUNTIME, line, "'in <string>' requires string as left operand, not %s",
                                jv_type_name(a)),
                       -1;
            }
            r = a.u.s->n == 0 || memmem(b.u.s->s, b.u.s->n, a.u.s->s, a.u.s->n) != NULL;
        } else if (b.t == JV_LIST) {
            r = 0;
            for (size_t i = 0; i < b.u.l->n && !r; i++) r = jv_equal(a, b.u.l->v[i]);
        } else if (b.t == JV_DICT && !b.u.d->ns) {
            if ((a.t == JV_LIST && !a.u.l->tuple) || (a.t == JV_DICT && !a.u.d->ns))
                return jerr_set(&e->err, JINJA_RUNTIME, line, "unhashable type: '%s'", jv_type_name(a)), -1;
            r = jv_dict_find(b, a, NULL);
        } else if (b.t == JV_UNDEF) r = 0;
        else
            return jerr_set(&e->err, JINJA_RUNTIME, line, "argument of type '%s' is not iterable", jv_type_name(b)), -1;
        return op == OP_IN ? r : !r;
    }
    int c;
    if (s_is_num(a) && s_is_num(b)) {
        double x = s_num(a), y = s_num(b);
        if ((a.t != JV_FLOAT) && (b.t != JV_FLOAT)) c = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else if (isnan(x) || isnan(y)) return 0;
        else c = (x > y) - (x < y);
    } else if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        c = memcmp(a.u.s->s, b.u.s->s, n);
        if (!c) c = (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    } else {
        static const char *names[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
        if (a.t == JV_UNDEF) return s_undef_err(e, a, line), -1;
        if (b.t == JV_UNDEF) return s_undef_err(e, b, line), -1;
        if ((a.t == JV_LIST && b.t == JV_LIST))
            return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: ordering comparison of sequences"), -1;
        return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' not supported between instances of '%s' and '%s'",
                        names[op], jv_type_name(a), jv_type_name(b)),
               -1;
    }
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

typedef struct {
    jv pos[16];
    int npos;
    const char *kwn[16];
    jv kwv[16];
    int nkw;
} jargs;

static int s_eval_args(jinja_env *e, jscope *sc, const jnode *n, jargs *A) {
    A->npos = A->nkw = 0;
    for (int i = 0; i < n->nkids; i++) {
        const jnode *k = n->kids[i];
        if (A->npos >= 16 || A->nkw >= 16)
            return jerr_set(&e->err, JINJA_UNSUPPORTED, n->line, "unsupported: more than 16 arguments");
        if (k->kind == JN_KWARG) {
            A->kwn[A->nkw] = k->name;
            if (jeval_expr(e, sc, k->a, &A->kwv[A->nkw++])) return -1;
        } else if (jeval_expr(e, sc, k, &A->pos[A->npos++])) return -1;
    }
    return 0;
}

static int s_call_macro(jinja_env *e, jv fn, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line,
                        jv *out) {
    const jnode *m = fn.u.fn->macro;
    if (nargs > m->nkids)
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line,
                        "unsupported: macro '%s' called with extra positional arguments", m->name);
    if (e->calls >= e->lim.max_calls)
        return jerr_set(&e->err, JINJA_LIMIT, line, "macro calls nested deeper than %d", e->lim.max_calls);
    jscope ms = {.parent = fn.u.fn->closure, .vars = jv_dict_new(e)};
    if (ms.vars.t != JV_DICT) return s_oom(e, line);
    for (int i = 0; i < m->nkids; i++) {
        const jnode *p = m->kids[i];
        jv v = jv_undef(p->name);
        int found = 0;
        if (i < nargs) {
            v = args[i];
            found = 1;
        }
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], p->name)) {
                v = kwv[k];
                found = 1;
            }
        if (!found && p->a && jeval_expr(e, &ms, p->a, &v)) return -1;
        if (s_assign(e, &ms, p->name, v, line)) return -1;
    }
    for (int k = 0; k < nkw; k++) {
        int ok = 0;
        for (int i = 0; i < m->nkids; i++) ok |= !strcmp(kwn[k], m->kids[i]->name);
        if (!ok)
            return jerr_set(&e->err, JINJA_UNSUPPORTED, line,
                            "unsupported: macro '%s' called with unknown keyword argument '%s'", m->name, kwn[k]);
    }
    jbuf saved = e->out;
    e->out = (jbuf){.max = e->lim.max_output};
    e->calls++;
    int rc = s_exec(e, &ms, m->b);
    e->calls--;
    jbuf mine = e->out;
    e->out = saved;
    if (rc < 0) {
        free(mine.p);
        return -1;
    }
    if (mine.over) {
        free(mine.p);
        return jerr_set(&e->err, JINJA_LIMIT, line, "output exceeds %zu bytes", e->lim.max_output);
    }
    *out = jv_from_buf(e, &mine);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

int jeval_call_value(jinja_env *e, jscope *sc, jv fn, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line,
                     jv *out) {
    (void)sc;
    if (fn.t == JV_UNDEF) return s_undef_err(e, fn, line);
    if (fn.t != JV_FUNC) return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' object is not callable", jv_type_name(fn));
    switch (fn.u.fn->kind) {
    case FN_MACRO: return s_call_macro(e, fn, args, nargs, kwn, kwv, nkw, line, out);
    case FN_METHOD: return jbi_method(e, fn.u.fn->self, fn.u.fn->name, args, nargs, kwn, kwv, nkw, line, out);
    default: return jbi_call(e, fn.u.fn->name, args, nargs, kwn, kwv, nkw, line, out);
    }
}

static int s_builtin_name(const char *name) {
    static const char *names[] = {"range",  "namespace", "dict", "raise_exception", "strftime_now", "cycler",
                                  "joiner", "lipsum",    NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

/* calls, filters and tests, apart from jeval_expr so that its (recursive) frame stays small */
__attribute__((noinline)) static int s_eval_call(jinja_env *e, jscope *sc, const jnode *n, jv *out) {
    jargs A;
    jv a, b;
    if (n->a->kind == JN_ATTR) { /* obj.method(...) without making a bound method */
        if (jeval_expr(e, sc, n->a->a, &a)) return -1;
        if (a.t == JV_UNDEF) return s_undef_err(e, a, n->line);
        if ((a.t == JV_STR || (a.t == JV_DICT && !a.u.d->ns)) && jbi_has_method(a, n->a->name)) {
            if (s_eval_args(e, sc, n, &A)) return -1;
            return jbi_method(e, a, n->a->name, A.pos, A.npos, A.kwn, A.kwv, A.nkw, n->line, out);
        }
        b = jeval_getattr(e, a, n->a->name, strlen(n->a->name));
        if (b.t == JV_UNDEF) {
            if (a.t == JV_LIST || a.t == JV_DICT || a.t == JV_STR)
                return jerr_set(&e->err, JINJA_UNSUPPORTED, n->line, "unsupported method '%s' of %s", n->a->name,
                                jv_type_name(a));
            return jerr_set(&e->err, JINJA_RUNTIME, n->line, "'%s' object has no attribute '%s'", jv_type_name(a),
                            n->a->name);
        }
    } else if (jeval_expr(e, sc, n->a, &b)) return -1;
    if (s_eval_args(e, sc, n, &A)) return -1;
    return jeval_call_value(e, sc, b, A.pos, A.npos, A.kwn, A.kwv, A.nkw, n->line, out);
}

__attribute__((noinline)) static int s_eval_filter(jinja_env *e, jscope *sc, const jnode *n, jv *out) {
    jargs A;
    jv a;
    int r;
    if (jeval_expr(e, sc, n->a, &a) || s_eval_args(e, sc, n, &A)) return -1;
    if (n->kind == JN_FILTER) return jbi_filter(e, sc, n->name, a, A.pos, A.npos, A.kwn, A.kwv, A.nkw, n->line, out);
    if (jbi_test(e, sc, n->name, a, A.pos, A.npos, n->line, &r)) return -1;
    *out = jv_bool(n->op ? !r : r);
    return 0;
}

int jeval_expr(jinja_env *e, jscope *sc, const jnode *n, jv *out) {
    jv a, b;
    switch (n->kind) {
    case JN_LIT: *out = n->lit; return 0;
    case JN_NAME:
        if (s_lookup(e, sc, n->name, out)) return 0;
        if (s_builtin_name(n->name)) {
            jv_func *f = ja_alloc(&e->arena, sizeof *f);
            if (!f) return s_oom(e, n->line);
            f->kind = FN_BUILTIN;
            f->name = n->name;
            out->t = JV_FUNC;
            out->u.fn = f;
            return 0;
        }
        *out = jv_undef(n->name);
        return 0;
    case JN_LIST:
    case JN_TUPLE: {
        jv l = n->kind == JN_TUPLE ? jv_tuple_new(e) : jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, n->line);
        for (int i = 0; i < n->nkids; i++) {
            if (jeval_expr(e, sc, n->kids[i], &a)) return -1;
            if (jv_list_push(e, l, a)) return s_oom(e, n->line);
        }
        *out = l;
        return 0;
    }
    case JN_DICT: {
        jv d = jv_dict_new(e);
        if (d.t != JV_DICT) return s_oom(e, n->line);
        for (int i = 0; i + 1 < n->nkids; i += 2) {
            if (jeval_expr(e, sc, n->kids[i], &a) || jeval_expr(e, sc, n->kids[i + 1], &b)) return -1;
            if (a.t == JV_LIST && !a.u.l->tuple)
                return jerr_set(&e->err, JINJA_RUNTIME, n->line, "unhashable type: 'list'");
            if (a.t == JV_DICT) return jerr_set(&e->err, JINJA_RUNTIME, n->line, "unhashable type: 'dict'");
            if (jv_dict_set(e, d, a, b)) return s_oom(e, n->line);
        }
        *out = d;
        return 0;
    }
    case JN_ATTR:
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        if (a.t == JV_UNDEF) {
            if (a.u.uname) return jerr_set(&e->err, JINJA_RUNTIME, n->line, "'%s' is undefined", a.u.uname);
            return jerr_set(&e->err, JINJA_RUNTIME, n->line, "undefined value has no attribute '%s'", n->name);
        }
        *out = jeval_getattr(e, a, n->name, strlen(n->name));
        if (e->arena.oom) return s_oom(e, n->line);
        return 0;
    case JN_ITEM:
        if (jeval_expr(e, sc, n->a, &a) || jeval_expr(e, sc, n->b, &b)) return -1;
        if (a.t == JV_UNDEF) return s_undef_err(e, a, n->line);
        *out = jeval_getitem(e, a, b);
        if (e->arena.oom) return s_oom(e, n->line);
        return 0;
    case JN_SLICE: {
        jv sv[3] = {jv_none(), jv_none(), jv_none()};
        const jnode *parts[3] = {n->b, n->c, n->d};
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        for (int k = 0; k < 3; k++)
            if (parts[k] && jeval_expr(e, sc, parts[k], &sv[k])) return -1;
        return s_slice(e, a, sv, n->line, out);
    }
    case JN_CALL: return s_eval_call(e, sc, n, out);
    case JN_FILTER:
    case JN_TEST: return s_eval_filter(e, sc, n, out);
    case JN_NEG:
    case JN_POS:
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        if (a.t == JV_FLOAT) {
            *out = jv_float(n->kind == JN_NEG ? -a.u.f : a.u.f);
            return 0;
        }
        if (a.t == JV_INT || a.t == JV_BOOL) {
            if (n->kind == JN_NEG && a.u.i == INT64_MIN) return s_overflow(e, n->line);
            *out = jv_int(n->kind == JN_NEG ? -a.u.i : a.u.i);
            return 0;
        }
        if (a.t == JV_UNDEF) return s_undef_err(e, a, n->line);
        return jerr_set(&e->err, JINJA_RUNTIME, n->line, "bad operand type for unary %s: '%s'",
                        n->kind == JN_NEG ? "-" : "+", jv_type_name(a));
    case JN_NOT:
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case JN_AND:
    case JN_OR:
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        if ((n->kind == JN_AND) != jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return jeval_expr(e, sc, n->b, out);
    case JN_BIN:
        if (jeval_expr(e, sc, n->a, &a) || jeval_expr(e, sc, n->b, &b)) return -1;
        return s_binop(e, n->op, a, b, n->line, out);
    case JN_CMP:
        if (jeval_expr(e, sc, n->a, &a)) return -1;
        for (int i = 0; i < n->nkids; i++) {
            if (jeval_expr(e, sc, n->kids[i]->a, &b)) return -1;
            int r = s_compare(e, n->kids[i]->op, a, b, n->kids[i]->line);
            if (r < 0) return -1;
            if (!r) {
                *out = jv_bool(0);
                return 0;
            }
            a = b;
        }
        *out = jv_bool(1);
        return 0;
    case JN_COND:
        if (jeval_expr(e, sc, n->b, &a)) return -1;
        if (jv_truthy(a)) return jeval_expr(e, sc, n->a, out);
        if (n->c) return jeval_expr(e, sc, n->c, out);
        *out = jv_undef(NULL);
        return 0;
    default: return jerr_set(&e->err, JINJA_RUNTIME, n->line, "internal: node %d is not an expression", n->kind);
    }
}

/* the items a for loop walks: a list's items, a dict's keys, a string's characters; undefined walks nothing */
static int s_iterable(jinja_env *e, jv v, int line, jv *out) {
    if (v.t == JV_LIST) {
        *out = v;
        return 0;
    }
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    if (v.t == JV_DICT && !v.u.d->ns) {
        for (size_t i = 0; i < v.u.d->n; i++)
            if (jv_list_push(e, l, v.u.d->k[i])) return s_oom(e, line);
    } else if (v.t == JV_STR) {
        for (size_t i = 0; i < v.u.s->n;) {
            size_t k = ju_cp_offset(v.u.s->s + i, v.u.s->n - i, 1);
            if (jv_list_push(e, l, jv_string(e, v.u.s->s + i, k))) return s_oom(e, line);
            i += k;
        }
    } else if (v.t != JV_UNDEF)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' object is not iterable", jv_type_name(v));
    *out = l;
    return 0;
}

static int s_bind_target(jinja_env *e, jscope *sc, const jnode *const *names, int nnames, jv item, int line) {
    if (nnames == 1) return s_assign(e, sc, names[0]->name, item, line);
    if (item.t == JV_STR) {
        if (s_iterable(e, item, line, &item)) return -1;
    }
    if (item.t != JV_LIST)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "cannot unpack non-iterable %s object", jv_type_name(item));
    if ((int)item.u.l->n != nnames)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "%s values to unpack (expected %d, got %zu)",
                        (int)item.u.l->n > nnames ? "too many" : "not enough", nnames, item.u.l->n);
    for (int i = 0; i < nnames; i++)
        if (s_assign(e, sc, names[i]->name, item.u.l->v[i], line)) return -1;
    return 0;
}

static int s_tick(jinja_env *e, int line) {
    if (++e->iters > e->lim.max_iters)
        return jerr_set(&e->err, JINJA_LIMIT, line, "more than %ld loop iterations", e->lim.max_iters);
    return 0;
}

static int s_loop_set(jinja_env *e, jv loop, const char *k, jv v) {
    jv key = jv_str_of(e, k);
    return key.t == JV_STR ? jv_dict_set(e, loop, key, v) : -1;
}

static int s_exec_for(jinja_env *e, jscope *sc, const jnode *n) {
    jv it, items;
    if (jeval_expr(e, sc, n->a, &it) || s_iterable(e, it, n->line, &items)) return -1;
    if (n->d) { /* for x in xs if cond: filter first, so loop.length counts what is kept */
        jv kept = jv_list_new(e);
        if (kept.t != JV_LIST) return s_oom(e, n->line);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jscope fs = {.parent = sc, .vars = jv_dict_new(e)};
            jv c;
            if (s_tick(e, n->line)) return -1;
            if (fs.vars.t != JV_DICT) return s_oom(e, n->line);
            if (s_bind_target(e, &fs, (const jnode *const *)n->kids, n->nkids, items.u.l->v[i], n->line)) return -1;
            if (jeval_expr(e, &fs, n->d, &c)) return -1;
            if (jv_truthy(c) && jv_list_push(e, kept, items.u.l->v[i])) return s_oom(e, n->line);
        }
        items = kept;
    }
    size_t len = items.u.l->n;
    if (!len) return n->c ? s_exec(e, sc, n->c) : 0;
    for (size_t i = 0; i < len; i++) {
        if (s_tick(e, n->line)) return -1;
        jscope is = {.parent = sc, .vars = jv_dict_new(e)};
        jv loop = jv_dict_new(e);
        if (is.vars.t != JV_DICT || loop.t != JV_DICT) return s_oom(e, n->line);
        if (s_loop_set(e, loop, "index0", jv_int((int64_t)i)) || s_loop_set(e, loop, "index", jv_int((int64_t)i + 1)) ||
            s_loop_set(e, loop, "revindex0", jv_int((int64_t)(len - i - 1))) ||
            s_loop_set(e, loop, "revindex", jv_int((int64_t)(len - i))) ||
            s_loop_set(e, loop, "first", jv_bool(i == 0)) || s_loop_set(e, loop, "last", jv_bool(i + 1 == len)) ||
            s_loop_set(e, loop, "length", jv_int((int64_t)len)) || s_loop_set(e, loop, "depth", jv_int(1)) ||
            s_loop_set(e, loop, "depth0", jv_int(0)) ||
            (i > 0 && s_loop_set(e, loop, "previtem", items.u.l->v[i - 1])) ||
            (i + 1 < len && s_loop_set(e, loop, "nextitem", items.u.l->v[i + 1])))
            return s_oom(e, n->line);
        if (s_assign(e, &is, "loop", loop, n->line)) return -1;
        if (s_bind_target(e, &is, (const jnode *const *)n->kids, n->nkids, items.u.l->v[i], n->line)) return -1;
        int rc = s_exec(e, &is, n->b);
        if (rc < 0) return rc;
        if (rc == X_BREAK) break;
    }
    return 0;
}

static int s_exec_set(jinja_env *e, jscope *sc, const jnode *n) {
    jv v;
    if (jeval_expr(e, sc, n->b, &v)) return -1;
    const jnode *t = n->a;
    if (t->kind == JN_NAME) return s_assign(e, sc, t->name, v, n->line);
    if (t->kind == JN_TUPLE) return s_bind_target(e, sc, (const jnode *const *)t->kids, t->nkids, v, n->line);
    /* ns.attr = v */
    jv ns;
    if (!s_lookup(e, sc, t->a->name, &ns))
        return jerr_set(&e->err, JINJA_RUNTIME, n->line, "'%s' is undefined", t->a->name);
    if (ns.t != JV_DICT || !ns.u.d->ns)
        return jerr_set(&e->err, JINJA_RUNTIME, n->line, "cannot assign attribute on non-namespace object");
    jv k = jv_str_of(e, t->name);
    if (k.t != JV_STR || jv_dict_set(e, ns, k, v)) return s_oom(e, n->line);
    return 0;
}

static int s_exec(jinja_env *e, jscope *sc, const jnode *n) {
    jv v;
    switch (n->kind) {
    case JN_BLOCK:
        for (int i = 0; i < n->nkids; i++) {
            int rc = s_exec(e, sc, n->kids[i]);
            if (rc) return rc;
        }
        return 0;
    case JN_LIT: jb_put(&e->out, n->lit.u.s->s, n->lit.u.s->n); goto check_out;
    case JN_OUTPUT:
        if (jeval_expr(e, sc, n->a, &v)) return -1;
        jv_to_str(&e->out, v);
        if (e->out.deep) return jerr_set(&e->err, JINJA_LIMIT, n->line, "a value is nested too deeply to print");
    check_out:
        if (e->out.over) return jerr_set(&e->err, JINJA_LIMIT, n->line, "output exceeds %zu bytes", e->lim.max_output);
        return 0;
    case JN_IF:
        for (;;) {
            if (jeval_expr(e, sc, n->a, &v)) return -1;
            if (jv_truthy(v)) return s_exec(e, sc, n->b);
            if (!n->c) return 0;
            if (n->c->kind != JN_IF) return s_exec(e, sc, n->c);
            n = n->c;
        }
    case JN_FOR: return s_exec_for(e, sc, n);
    case JN_SET: return s_exec_set(e, sc, n);
    case JN_SETBLOCK: {
        jbuf saved = e->out;
        e->out = (jbuf){.max = e->lim.max_output};
        int rc = s_exec(e, sc, n->b);
        jbuf mine = e->out;
        e->out = saved;
        if (rc) {
            free(mine.p);
            return rc < 0 ? rc
                          : jerr_set(&e->err, JINJA_UNSUPPORTED, n->line,
                                     "unsupported: break/continue inside a block set");
        }
        v = jv_from_buf(e, &mine);
        if (v.t != JV_STR) return s_oom(e, n->line);
        return s_assign(e, sc, n->a->name, v, n->line);
    }
    case JN_MACRO: {
        jv_func *f = ja_alloc(&e->arena, sizeof *f);
        if (!f) return s_oom(e, n->line);
        f->kind = FN_MACRO;
        f->name = n->name;
        f->macro = n;
        f->closure = sc;
        v.t = JV_FUNC;
        v.u.fn = f;
        return s_assign(e, sc, n->name, v, n->line);
    }
    case JN_BREAK: return X_BREAK;
    case JN_CONTINUE: return X_CONTINUE;
    default: return jerr_set(&e->err, JINJA_RUNTIME, n->line, "internal: node %d is not a statement", n->kind);
    }
}

jinja_env *jinja_env_new(const jinja_limits *lim) {
    jinja_env *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->lim = lim ? *lim : jinja_limits_default();
    e->arena.cap = e->lim.max_memory;
    e->globals = jv_dict_new(e);
    if (e->globals.t != JV_DICT) {
        free(e);
        return NULL;
    }
    return e;
}

void jinja_env_destroy(jinja_env **ep) {
    if (!ep || !*ep) return;
    ja_free_all(&(*ep)->arena);
    free((*ep)->out.p);
    free(*ep);
    *ep = NULL;
}

int jinja_env_set(jinja_env *e, const char *name, jv v) {
    jv k = jv_str_of(e, name);
    return k.t == JV_STR ? jv_dict_set(e, e->globals, k, v) : -1;
}

int jinja_render(jinja_env *e, const jinja_tmpl *t, char **out, size_t *outlen, char *err, size_t errlen) {
    *out = NULL;
    if (outlen) *outlen = 0;
    e->err = (jerr){0};
    e->iters = 0;
    e->calls = 0;
    free(e->out.p);
    e->out = (jbuf){.max = e->lim.max_output};
    int rc = 0;
    /* an env whose memory ran out (building the context, or in an earlier render whose values it still holds)
     * fails every render: with JINJA_LIMIT when the bound max_memory was reached (jerr_oom) */
    if (e->arena.oom) rc = jerr_oom(e, 0);
    else {
        jscope top = {.parent = NULL, .vars = jv_dict_new(e)};
        if (top.vars.t != JV_DICT) rc = s_oom(e, 0);
        else rc = s_exec(e, &top, t->root);
        if (rc > 0) rc = jerr_set(&e->err, JINJA_SYNTAX, 0, "break or continue outside a loop");
        /* a value that could not be made fails the render even where the expression that made it was not checked:
         * output built from an undefined stand-in is never returned as a success */
        if (rc == 0 && !e->err.code && e->arena.oom) rc = jerr_oom(e, 0);
    }
    if (rc < 0 || e->err.code) {
        if (!e->err.code) jerr_set(&e->err, JINJA_RUNTIME, 0, "render failed");
        if (err && errlen) {
            if (e->err.line) snprintf(err, errlen, "line %d: %s", e->err.line, e->err.msg);
            else snprintf(err, errlen, "%s", e->err.msg);
        }
        return e->err.code;
    }
    if (!e->out.p) {
        e->out.p = malloc(1);
        if (!e->out.p) return JINJA_NOMEM;
        e->out.p[0] = 0;
    }
    *out = e->out.p;
    if (outlen) *outlen = e->out.n;
    e->out = (jbuf){0};
    return JINJA_OK;
}
