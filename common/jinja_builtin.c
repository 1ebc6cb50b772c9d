/* common/jinja_builtin.c: the filters, tests, string and dict methods and global functions the interpreter
 * knows, each as jinja2 (and transformers, for tojson, raise_exception and strftime_now) defines it. A filter or
 * test not listed here is refused when the template is parsed, a method when it is called (JINJA_UNSUPPORTED). */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

static const char *const s_filters[] = {
    "trim",       "length", "count",  "upper",  "lower",   "capitalize", "tojson", "first",  "last",
    "default",    "d",      "join",   "string", "int",     "float",      "list",   "items",  "selectattr",
    "rejectattr", "select", "reject", "map",    "reverse", "replace",    "safe",   "escape", "e",
    "abs",        "unique", "indent", "title",  "round",   "sort",       NULL};
static const char *const s_tests[] = {
    "defined", "undefined",   "none",     "string",   "number",      "integer",  "float", "boolean",
    "true",    "false",       "mapping",  "iterable", "sequence",    "callable", "eq",    "equalto",
    "ne",      "lt",          "lessthan", "gt",       "greaterthan", "le",       "ge",    "even",
    "odd",     "divisibleby", "in",       "lower",    "upper",       "sameas",   NULL};
static const char *const s_str_methods[] = {"strip",   "lstrip",  "rstrip",     "startswith", "endswith",   "split",
                                            "rsplit",  "replace", "upper",      "lower",      "capitalize", "title",
                                            "find",    "rfind",   "count",      "join",       "isdigit",    "isspace",
                                            "isalpha", "isalnum", "splitlines", NULL};
static const char *const s_dict_methods[] = {"items", "keys", "values", "get", NULL};

static int s_in(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}
int jbi_known_filter(const char *name) { return s_in(s_filters, name); }
int jbi_known_test(const char *name) { return s_in(s_tests, name); }
int jbi_has_method(jv self, const char *name) {
    if (self.t == JV_STR) return s_in(s_str_methods, name);
    if (self.t == JV_DICT && !self.u.d->ns) return s_in(s_dict_methods, name);
    return 0;
}

static int s_oom(jinja_env *e, int line) { return jerr_oom(e, line); }

static int s_kw(const char **kwn, jv *kwv, int nkw, const char *name, jv *out) {
    for (int i = 0; i < nkw; i++)
        if (!strcmp(kwn[i], name)) {
            *out = kwv[i];
            return 1;
        }
    return 0;
}

/* argument k: positional k, else keyword name, else dflt */
static jv s_arg(jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int k, const char *name, jv dflt) {
    jv v;
    if (k < nargs) return args[k];
    if (name && s_kw(kwn, kwv, nkw, name, &v)) return v;
    return dflt;
}

static int s_str_of(jinja_env *e, jv v, int line, jv *out) {
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    jbuf b = {0};
    jv_to_str(&b, v);
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

/* upper, lower, capitalize, title over code points (utf8proc's simple case mappings) */
enum { CASE_UPPER, CASE_LOWER, CASE_CAP, CASE_TITLE };
static int s_case(jinja_env *e, jv s, int mode, int line, jv *out) {
    jbuf b = {0};
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s.u.s->s;
    utf8proc_ssize_t left = (utf8proc_ssize_t)s.u.s->n;
    int first = 1, prev_cased = 0;
    while (left > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, left, &cp);
        if (k <= 0) {
            jb_put(&b, (const char *)p, 1);
            p++;
            left--;
            first = 0;
            continue;
        }
        /* the full (one to several code points) mappings of Python's SpecialCasing that text is likely to hold */
        const char *full = NULL;
        int up = mode == CASE_UPPER || (mode == CASE_CAP && first);
        int ttl = mode == CASE_TITLE || (mode == CASE_CAP && first);
        if (mode == CASE_TITLE) {
            utf8proc_category_t c = utf8proc_category(cp);
            int cased = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
            ttl = cased && !prev_cased;
        }
        if (cp == 0xDF) full = up && !ttl ? "SS" : ttl ? "Ss" : NULL;
        else if (cp >= 0xFB00 && cp <= 0xFB06 && (up || ttl)) {
            static const char *const lig[7][2] = {{"FF", "Ff"},   {"FI", "Fi"}, {"FL", "Fl"}, {"FFI", "Ffi"},
                                                  {"FFL", "Ffl"}, {"ST", "St"}, {"ST", "St"}};
            full = lig[cp - 0xFB00][ttl ? 1 : 0];
        } else if (cp == 0x130 &&
                   (mode == CASE_LOWER || (mode == CASE_CAP && !first) || (mode == CASE_TITLE && !ttl && prev_cased)))
            full = "i\xCC\x87";
        if (full) {
            jb_puts(&b, full);
            if (mode == CASE_TITLE) prev_cased = 1;
            p += k;
            left -= k;
            first = 0;
            continue;
        }
        utf8proc_int32_t m = cp;
        switch (mode) {
        case CASE_UPPER: m = utf8proc_toupper(cp); break;
        case CASE_LOWER: m = utf8proc_tolower(cp); break;
        case CASE_CAP: m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        default: {
            utf8proc_category_t c = utf8proc_category(cp);
            int cased = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
            m = cased ? (prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp)) : cp;
            prev_cased = cased;
        }
        }
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t w = utf8proc_encode_char(m, enc);
        jb_put(&b, (const char *)enc, (size_t)w);
        p += k;
        left -= k;
        first = 0;
    }
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

static int s_strip(jinja_env *e, jv s, jv chars, int left, int right, int line, jv *out) {
    const char *p = s.u.s->s;
    size_t n = s.u.s->n;
    if (chars.t == JV_STR) ju_strip(&p, &n, chars.u.s->s, chars.u.s->n, left, right);
    else if (chars.t == JV_NONE || chars.t == JV_UNDEF) ju_strip(&p, &n, NULL, 0, left, right);
    else return jerr_set(&e->err, JINJA_RUNTIME, line, "strip arg must be None or str");
    *out = jv_string(e, p, n);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

static int s_push_str(jinja_env *e, jv l, const char *s, size_t n, int line) {
    jv v = jv_string(e, s, n);
    if (v.t != JV_STR || jv_list_push(e, l, v)) return s_oom(e, line);
    return 0;
}

/* str.split / str.rsplit (rsplit differs only with a maxsplit) */
static int s_split(jinja_env *e, jv s, jv sep, int64_t maxsplit, int rev, int line, jv *out) {
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    const char *p = s.u.s->s, *end = p + s.u.s->n;
    if (sep.t == JV_STR) {
        size_t k = sep.u.s->n;
        if (!k) return jerr_set(&e->err, JINJA_RUNTIME, line, "empty separator");
        if (rev && maxsplit >= 0) {
            /* split from the right (the pieces pushed last first), then reverse the list */
            const char *q = end; /* the unsplit text is [p, q) */
            for (const char *r = q; maxsplit > 0 && r >= p + k;) {
                r--;
                if (memcmp(r + 1 - k, sep.u.s->s, k)) continue;
                if (s_push_str(e, l, r + 1, (size_t)(q - (r + 1)), line)) return -1;
                q = r + 1 - k;
                r = q;
                maxsplit--;
            }
            if (s_push_str(e, l, p, (size_t)(q - p), line)) return -1;
            jv *v = l.u.l->v;
            for (size_t i = 0, j = l.u.l->n - 1; i < j; i++, j--) {
                jv t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
            *out = l;
            return 0;
        }
        for (;;) {
            const char *f = maxsplit != 0 ? memmem(p, (size_t)(end - p), sep.u.s->s, k) : NULL;
            if (!f) break;
            if (s_push_str(e, l, p, (size_t)(f - p), line)) return -1;
            p = f + k;
            if (maxsplit > 0) maxsplit--;
        }
        if (s_push_str(e, l, p, (size_t)(end - p), line)) return -1;
        *out = l;
        return 0;
    }
    if (sep.t != JV_NONE && sep.t != JV_UNDEF)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "must be str or None, not %s", jv_type_name(sep));
    if (rev && maxsplit >= 0)
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: rsplit() on whitespace with maxsplit");
    for (;;) {
        int w;
        while (p < end && (w = ju_space_len(p, end)) > 0) p += w;
        if (p >= end) break;
        if (maxsplit == 0) {
            const char *q = p;
            size_t n = (size_t)(end - p);
            ju_strip(&q, &n, NULL, 0, 0, 1);
            if (s_push_str(e, l, q, n, line)) return -1;
            break;
        }
        const char *q = p;
        while (q < end && ju_space_len(q, end) == 0) q++;
        if (s_push_str(e, l, p, (size_t)(q - p), line)) return -1;
        p = q;
        if (maxsplit > 0) maxsplit--;
    }
    *out = l;
    return 0;
}

static int s_replace(jinja_env *e, jv s, jv old, jv new_, int64_t count, int line, jv *out) {
    if (old.t != JV_STR || new_.t != JV_STR)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "replace() arguments must be str");
    jbuf b = {0};
    const char *p = s.u.s->s, *end = p + s.u.s->n;
    size_t k = old.u.s->n;
    if (!k) { /* Python inserts new before every character and at the end */
        while (count != 0 && p <= end) {
            jb_put(&b, new_.u.s->s, new_.u.s->n);
            if (count > 0) count--;
            if (p == end) {
                p++;
                break;
            }
            size_t c = ju_cp_offset(p, (size_t)(end - p), 1);
            jb_put(&b, p, c);
            p += c;
        }
        if (p < end) jb_put(&b, p, (size_t)(end - p));
    } else {
        while (count != 0) {
            const char *f = memmem(p, (size_t)(end - p), old.u.s->s, k);
            if (!f) break;
            jb_put(&b, p, (size_t)(f - p));
            jb_put(&b, new_.u.s->s, new_.u.s->n);
            p = f + k;
            if (count > 0) count--;
        }
        jb_put(&b, p, (size_t)(end - p));
    }
    if (b.over || (e->lim.max_output && b.n > e->lim.max_output)) {
        free(b.p);
        return jerr_set(&e->err, JINJA_LIMIT, line, "replace() result too large");
    }
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

static int s_affix(jinja_env *e, jv s, jv pre, int end_, int line, int *r) {
    if (pre.t == JV_LIST && pre.u.l->tuple) {
        *r = 0;
        for (size_t i = 0; i < pre.u.l->n && !*r; i++)
            if (s_affix(e, s, pre.u.l->v[i], end_, line, r)) return -1;
        return 0;
    }
    if (pre.t != JV_STR)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "%s first arg must be str or a tuple of str, not %s",
                        end_ ? "endswith" : "startswith", jv_type_name(pre));
    size_t k = pre.u.s->n, n = s.u.s->n;
    *r = k <= n && !memcmp(s.u.s->s + (end_ ? n - k : 0), pre.u.s->s, k);
    return 0;
}

static int s_int_arg(jinja_env *e, jv v, int64_t dflt, int line, int64_t *out) {
    if (v.t == JV_UNDEF || v.t == JV_NONE) {
        *out = dflt;
        return 0;
    }
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *out = v.u.i;
        return 0;
    }
    return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
}

static int s_join(jinja_env *e, jv items, jv sep, int line, jv *out) {
    jbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (i && sep.t == JV_STR) jb_put(&b, sep.u.s->s, sep.u.s->n);
        jv_to_str(&b, items.u.l->v[i]);
    }
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

/* a list of what iterating v yields (list items, dict keys, characters; undefined: nothing) */
static int s_list_of(jinja_env *e, jv v, int line, jv *out) {
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    if (v.t == JV_LIST) {
        for (size_t i = 0; i < v.u.l->n; i++)
            if (jv_list_push(e, l, v.u.l->v[i])) return s_oom(e, line);
    } else if (v.t == JV_DICT && !v.u.d->ns) {
        for (size_t i = 0; i < v.u.d->n; i++)
            if (jv_list_push(e, l, v.u.d->k[i])) return s_oom(e, line);
    } else if (v.t == JV_STR) {
        for (size_t i = 0; i < v.u.s->n;) {
            size_t k = ju_cp_offset(v.u.s->s + i, v.u.s->n - i, 1);
            if (s_push_str(e, l, v.u.s->s + i, k, line)) return -1;
            i += k;
        }
    } else if (v.t != JV_UNDEF)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' object is not iterable", jv_type_name(v));
    *out = l;
    return 0;
}

static int s_splitlines(jinja_env *e, const char *s, size_t n, int line, jv *out);

int jbi_method(jinja_env *e, jv self, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw,
               int line, jv *out) {
    jv none = jv_none();
    if (self.t == JV_DICT) {
        if (!strcmp(name, "get")) {
            jv d = s_arg(args, nargs, kwn, kwv, nkw, 1, NULL, none);
            if (nargs < 1) return jerr_set(&e->err, JINJA_RUNTIME, line, "get expected at least 1 argument");
            if (!jv_dict_find(self, args[0], out)) *out = d;
            return 0;
        }
        jv l = jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, line);
        for (size_t i = 0; i < self.u.d->n; i++) {
            jv x;
            if (!strcmp(name, "keys")) x = self.u.d->k[i];
            else if (!strcmp(name, "values")) x = self.u.d->v[i];
            else {
                x = jv_tuple_new(e);
                if (x.t != JV_LIST || jv_list_push(e, x, self.u.d->k[i]) || jv_list_push(e, x, self.u.d->v[i]))
                    return s_oom(e, line);
            }
            if (jv_list_push(e, l, x)) return s_oom(e, line);
        }
        l.u.l->kind = !strcmp(name, "keys") ? LK_KEYS : !strcmp(name, "values") ? LK_VALUES : LK_ITEMS;
        *out = l;
        return 0;
    }
    if (self.t != JV_STR) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported method '%s'", name);
    jv a0 = s_arg(args, nargs, kwn, kwv, nkw, 0, NULL, none);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip"))
        return s_strip(e, self, a0, name[0] != 'r', name[0] != 'l', line, out);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        int r;
        if (nargs != 1) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: %s() with start/end", name);
        if (s_affix(e, self, a0, name[0] == 'e', line, &r)) return -1;
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        int64_t m = -1;
        jv sep = s_arg(args, nargs, kwn, kwv, nkw, 0, "sep", none);
        if (s_int_arg(e, s_arg(args, nargs, kwn, kwv, nkw, 1, "maxsplit", none), -1, line, &m)) return -1;
        return s_split(e, self, sep, m, name[0] == 'r', line, out);
    }
    if (!strcmp(name, "splitlines")) {
        if (nargs) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: splitlines(keepends)");
        return s_splitlines(e, self.u.s->s, self.u.s->n, line, out);
    }
    if (!strcmp(name, "replace")) {
        int64_t c = -1;
        if (nargs < 2) return jerr_set(&e->err, JINJA_RUNTIME, line, "replace expected at least 2 arguments");
        if (s_int_arg(e, s_arg(args, nargs, kwn, kwv, nkw, 2, "count", none), -1, line, &c)) return -1;
        return s_replace(e, self, args[0], args[1], c, line, out);
    }
    if (!strcmp(name, "upper")) return s_case(e, self, CASE_UPPER, line, out);
    if (!strcmp(name, "lower")) return s_case(e, self, CASE_LOWER, line, out);
    if (!strcmp(name, "capitalize")) return s_case(e, self, CASE_CAP, line, out);
    if (!strcmp(name, "title")) return s_case(e, self, CASE_TITLE, line, out);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count")) {
        if (nargs != 1 || a0.t != JV_STR)
            return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: %s() other than with one string", name);
        const char *s = self.u.s->s;
        size_t n = self.u.s->n, k = a0.u.s->n;
        int64_t found = -1, cnt = 0;
        if (!strcmp(name, "count") && !k) {
            *out = jv_int((int64_t)ju_cplen(s, n) + 1);
            return 0;
        }
        for (size_t i = 0; i + k <= n; i++)
            if (!memcmp(s + i, a0.u.s->s, k)) {
                if (found < 0 || name[0] == 'r') found = (int64_t)ju_cplen(s, i);
                cnt++;
                if (name[0] == 'f') break;
                if (name[0] == 'c' && k) i += k - 1;
            }
        *out = jv_int(name[0] == 'c' ? cnt : found);
        return 0;
    }
    if (!strcmp(name, "join")) {
        jv items;
        if (nargs != 1 || s_list_of(e, a0, line, &items))
            return nargs != 1 ? jerr_set(&e->err, JINJA_RUNTIME, line, "join() takes one argument") : -1;
        for (size_t i = 0; i < items.u.l->n; i++)
            if (items.u.l->v[i].t != JV_STR)
                return jerr_set(&e->err, JINJA_RUNTIME, line, "sequence item %zu: expected str instance, %s found", i,
                                jv_type_name(items.u.l->v[i]));
        return s_join(e, items, self, line, out);
    }
    /* isdigit, isspace, isalpha, isalnum */
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)self.u.s->s;
    utf8proc_ssize_t left = (utf8proc_ssize_t)self.u.s->n;
    int r = left > 0;
    while (left > 0 && r) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, left, &cp);
        if (k <= 0) {
            r = 0;
            break;
        }
        utf8proc_category_t c = utf8proc_category(cp);
        int letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        if (!strcmp(name, "isspace")) r = ju_space_len((const char *)p, (const char *)p + left) > 0;
        else if (!strcmp(name, "isdigit")) r = digit;
        else if (!strcmp(name, "isalpha")) r = letter;
        else r = letter || digit;
        p += k;
        left -= k;
    }
    *out = jv_bool(r);
    return 0;
}

/* ---- tests ---- */
int jbi_test(jinja_env *e, jscope *sc, const char *name, jv v, jv *args, int nargs, int line, int *out) {
    (void)sc;
    jv a = nargs > 0 ? args[0] : jv_undef(NULL);
    if (!strcmp(name, "defined")) *out = v.t != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v.t == JV_UNDEF;
    else if (!strcmp(name, "none")) *out = v.t == JV_NONE;
    else if (!strcmp(name, "string")) *out = v.t == JV_STR;
    else if (!strcmp(name, "number")) *out = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    else if (!strcmp(name, "integer")) *out = v.t == JV_INT;
    else if (!strcmp(name, "float")) *out = v.t == JV_FLOAT;
    else if (!strcmp(name, "boolean")) *out = v.t == JV_BOOL;
    else if (!strcmp(name, "true")) *out = v.t == JV_BOOL && v.u.i;
    else if (!strcmp(name, "false")) *out = v.t == JV_BOOL && !v.u.i;
    else if (!strcmp(name, "mapping")) *out = v.t == JV_DICT && !v.u.d->ns;
    else if (!strcmp(name, "iterable"))
        *out = v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
    else if (!strcmp(name, "sequence"))
        *out = v.t == JV_STR || (v.t == JV_LIST && !v.u.l->kind) || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
    else if (!strcmp(name, "callable")) *out = v.t == JV_FUNC;
    else if (!strcmp(name, "eq") || !strcmp(name, "equalto")) *out = jv_equal(v, a);
    else if (!strcmp(name, "ne")) *out = !jv_equal(v, a);
    else if (!strcmp(name, "sameas")) {
        if (v.t == JV_NONE || v.t == JV_BOOL || v.t == JV_UNDEF)
            *out = v.t == a.t && (v.t != JV_BOOL || v.u.i == a.u.i);
        else if (v.t == JV_LIST || v.t == JV_DICT) *out = v.t == a.t && (void *)v.u.l == (void *)a.u.l;
        else return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: 'sameas' on %s", jv_type_name(v));
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (s_str_of(e, v, line, &v)) return -1; /* str(value).islower() */
        jv c;
        if (s_case(e, v, name[0] == 'l' ? CASE_LOWER : CASE_UPPER, line, &c)) return -1;
        /* str.islower(): cased characters exist and all are lower; approximated as "unchanged by lower()" */
        int any = 0;
        for (size_t i = 0; i < v.u.s->n; i++) {
            unsigned char ch = (unsigned char)v.u.s->s[i];
            if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80) any = 1;
        }
        *out = any && jv_equal(c, v);
    } else if (!strcmp(name, "in")) {
        if (a.t == JV_STR && v.t == JV_STR) *out = memmem(a.u.s->s, a.u.s->n, v.u.s->s, v.u.s->n) != NULL || !v.u.s->n;
        else if (a.t == JV_LIST) {
            *out = 0;
            for (size_t i = 0; i < a.u.l->n && !*out; i++) *out = jv_equal(v, a.u.l->v[i]);
        } else if (a.t == JV_DICT) *out = jv_dict_find(a, v, NULL);
        else
            return jerr_set(&e->err, JINJA_RUNTIME, line, "'in' test: unsupported operands %s, %s", jv_type_name(v),
                            jv_type_name(a));
    } else {
        /* numeric tests and ordering */
        int isnum = v.t == JV_INT || v.t == JV_BOOL || v.t == JV_FLOAT;
        if (!strcmp(name, "even") || !strcmp(name, "odd") || !strcmp(name, "divisibleby")) {
            int a_ok = name[0] != 'd' || a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT;
            if (v.t == JV_FLOAT || (a_ok && a.t == JV_FLOAT && name[0] == 'd' && isnum)) { /* Python's float % */
                double x = v.t == JV_FLOAT ? v.u.f : (double)v.u.i;
                double y = name[0] != 'd' ? 2.0 : a.t == JV_FLOAT ? a.u.f : (double)a.u.i;
                if (y == 0) return jerr_set(&e->err, JINJA_RUNTIME, line, "float modulo by zero");
                double r = fmod(x, y);
                if (r != 0 && (r < 0) != (y < 0)) r += y;
                *out = name[0] == 'o' ? r == 1 : r == 0; /* jinja2: value % 2 == 1 */
                return 0;
            }
            if ((v.t != JV_INT && v.t != JV_BOOL) || !a_ok) {
                if (v.t == JV_UNDEF) return jerr_set(&e->err, JINJA_RUNTIME, line, "use of an undefined value");
                return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' test: unsupported operand %s", name,
                                jv_type_name(v));
            }
            int64_t m = name[0] == 'e' || name[0] == 'o' ? 2 : (a.t == JV_FLOAT ? 0 : a.u.i);
            if (!m) return jerr_set(&e->err, JINJA_RUNTIME, line, "integer division or modulo by zero");
            int64_t r = v.u.i % m;
            *out = name[0] == 'o' ? r != 0 : r == 0;
            return 0;
        }
        int a_num = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT;
        int c;
        if (isnum && a_num) {
            double x = v.t == JV_FLOAT ? v.u.f : (double)v.u.i, y = a.t == JV_FLOAT ? a.u.f : (double)a.u.i;
            c = (x > y) - (x < y);
        } else if (v.t == JV_STR && a.t == JV_STR) {
            size_t n = v.u.s->n < a.u.s->n ? v.u.s->n : a.u.s->n;
            c = memcmp(v.u.s->s, a.u.s->s, n);
            if (!c) c = (v.u.s->n > a.u.s->n) - (v.u.s->n < a.u.s->n);
        } else
            return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' test: cannot compare %s and %s", name, jv_type_name(v),
                            jv_type_name(a));
        if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) *out = c < 0;
        else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) *out = c > 0;
        else if (!strcmp(name, "le")) *out = c <= 0;
        else *out = c >= 0;
    }
    return 0;
}

/* attribute path "a.b.c" of an item, as jinja2's make_attrgetter (digits index lists) */
static jv s_attr_path(jinja_env *e, jv item, const char *path) {
    const char *p = path;
    while (item.t != JV_UNDEF) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits) item = jeval_getitem(e, item, jv_int(strtoll(p, NULL, 10)));
        else item = jeval_getitem(e, item, jv_string(e, p, n));
        if (!dot) break;
        p = dot + 1;
    }
    return item;
}

static int s_select(jinja_env *e, jscope *sc, const char *fname, jv v, jv *args, int nargs, int line, jv *out) {
    int attr = fname[1] == 'e' && fname[6] == 'a'; /* selectattr / rejectattr */
    int reject = fname[0] == 'r';
    jv items;
    if (!jv_truthy(v)) v = jv_undef(NULL); /* jinja2 walks the value only "if value" */
    if (s_list_of(e, v, line, &items)) return -1;
    if (attr && (nargs < 1 || args[0].t != JV_STR))
        return jerr_set(&e->err, JINJA_RUNTIME, line, "%s needs an attribute name", fname);
    int t0 = attr ? 1 : 0;
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv x = attr ? s_attr_path(e, items.u.l->v[i], args[0].u.s->s) : items.u.l->v[i];
        int r;
        if (nargs > t0) {
            if (args[t0].t != JV_STR)
                return jerr_set(&e->err, JINJA_RUNTIME, line, "%s: test name must be a string", fname);
            const char *tn = args[t0].u.s->s;
            if (!strcmp(tn, "==")) tn = "eq";
            else if (!strcmp(tn, "!=")) tn = "ne";
            if (!jbi_known_test(tn)) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported test '%s'", tn);
            if (jbi_test(e, sc, tn, x, args + t0 + 1, nargs - t0 - 1, line, &r)) return -1;
        } else r = jv_truthy(x);
        if (r != reject && jv_list_push(e, l, items.u.l->v[i])) return s_oom(e, line);
    }
    l.u.l->kind = LK_GEN; /* a generator in jinja2 */
    *out = l;
    return 0;
}

static int s_tojson(jinja_env *e, jv v, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line, jv *out) {
    jv none = jv_none();
    jv ea = s_arg(args, nargs, kwn, kwv, nkw, 0, "ensure_ascii", jv_bool(0));
    jv ind = s_arg(args, nargs, kwn, kwv, nkw, 1, "indent", none);
    jv seps = s_arg(args, nargs, kwn, kwv, nkw, 2, "separators", none);
    jv sk = s_arg(args, nargs, kwn, kwv, nkw, 3, "sort_keys", jv_bool(0));
    if (jv_truthy(ea)) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: tojson(ensure_ascii=true)");
    if (ind.t != JV_NONE && ind.t != JV_INT)
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: tojson indent that is not an integer");
    int indent = ind.t == JV_INT ? (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i) : -1;
    char isep[16], ksep[16];
    snprintf(isep, sizeof isep, "%s", indent >= 0 ? "," : ", ");
    snprintf(ksep, sizeof ksep, ": ");
    if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR && seps.u.l->v[1].t == JV_STR &&
        seps.u.l->v[0].u.s->n < sizeof isep && seps.u.l->v[1].u.s->n < sizeof ksep) {
        snprintf(isep, sizeof isep, "%s", seps.u.l->v[0].u.s->s);
        snprintf(ksep, sizeof ksep, "%s", seps.u.l->v[1].u.s->s);
    } else if (seps.t != JV_NONE) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: tojson separators");
    jbuf b = {.max = e->lim.max_output};
    if (jv_to_json(&b, v, indent, 0, isep, ksep, jv_truthy(sk), 0)) {
        free(b.p);
        if (v.t == JV_UNDEF)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "Object of type Undefined is not JSON serializable");
        return jerr_set(&e->err, JINJA_RUNTIME, line, "tojson: value is not JSON serializable");
    }
    if (b.over) {
        free(b.p);
        return jerr_set(&e->err, JINJA_LIMIT, line, "tojson output too large");
    }
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

/* the line break at p as Python's str.splitlines() sees one: its length, 0 when none */
static int s_linebreak(const char *p, const char *end) {
    unsigned char c = (unsigned char)*p;
    if (c == '\r') return p + 1 < end && p[1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) return 1;
    if (c == 0xC2 && p + 1 < end && (unsigned char)p[1] == 0x85) return 2;
    if (c == 0xE2 && p + 2 < end && (unsigned char)p[1] == 0x80 &&
        ((unsigned char)p[2] == 0xA8 || (unsigned char)p[2] == 0xA9))
        return 3;
    return 0;
}

static int s_splitlines(jinja_env *e, const char *s, size_t n, int line, jv *out) {
    jv l = jv_list_new(e);
    if (l.t != JV_LIST) return s_oom(e, line);
    const char *p = s, *start = s, *end = s + n;
    while (p < end) {
        int k = s_linebreak(p, end);
        if (!k) {
            p++;
            continue;
        }
        if (s_push_str(e, l, start, (size_t)(p - start), line)) return -1;
        p += k;
        start = p;
    }
    if (start < end && s_push_str(e, l, start, (size_t)(end - start), line)) return -1;
    *out = l;
    return 0;
}

/* jinja2's indent filter: s + "\n" split into lines, every line but the first (and blank ones unless blank)
 * prefixed */
static int s_indent(jinja_env *e, jv v, jv width, int first, int blank, int line, jv *out) {
    jv s, lines;
    jbuf ind = {0}, b = {.max = e->lim.max_output};
    if (width.t == JV_STR) jb_put(&ind, width.u.s->s, width.u.s->n);
    else if (width.t == JV_INT && width.u.i >= 0 && width.u.i <= 1024)
        for (int64_t i = 0; i < width.u.i; i++) jb_put(&ind, " ", 1);
    else if (width.t != JV_INT)
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: indent width of %s", jv_type_name(width));
    if (v.t != JV_STR) { /* jinja2 appends "\n" to the value itself */
        free(ind.p);
        if (v.t == JV_UNDEF && v.u.uname) return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' is undefined", v.u.uname);
        return jerr_set(&e->err, JINJA_RUNTIME, line, "indent: expected a string, got %s", jv_type_name(v));
    }
    s = v;
    jbuf t = {0};
    jb_put(&t, s.u.s->s, s.u.s->n);
    jb_put(&t, "\n", 1);
    int rc = t.over ? s_oom(e, line) : s_splitlines(e, t.p, t.n, line, &lines);
    free(t.p);
    if (rc) {
        free(ind.p);
        return -1;
    }
    const char *ip = ind.p ? ind.p : "";
    if (first) jb_put(&b, ip, ind.n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jv_str *ln = lines.u.l->v[i].u.s;
        if (i) jb_put(&b, "\n", 1);
        if (i && (blank || ln->n)) jb_put(&b, ip, ind.n);
        jb_put(&b, ln->s, ln->n);
    }
    free(ind.p);
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

/* jinja2's title filter: words begin after runs of -, whitespace, (, {, [, <; their first character is upper-cased,
 * the rest lower-cased */
static int s_title_filter(jinja_env *e, jv s, int line, jv *out) {
    jbuf b = {0};
    const char *p = s.u.s->s, *end = p + s.u.s->n;
    int start = 1;
    while (p < end) {
        size_t k = ju_cp_offset(p, (size_t)(end - p), 1);
        int sep = ju_space_len(p, end) > 0 || *p == '-' || *p == '(' || *p == '{' || *p == '[' || *p == '<';
        if (sep) jb_put(&b, p, k);
        else {
            jv c;
            if (s_case(e, jv_string(e, p, k), start ? CASE_UPPER : CASE_LOWER, line, &c)) {
                free(b.p);
                return -1;
            }
            jb_put(&b, c.u.s->s, c.u.s->n);
        }
        start = sep;
        p += k;
    }
    *out = jv_from_buf(e, &b);
    return out->t == JV_STR ? 0 : s_oom(e, line);
}

static int s_round(jinja_env *e, jv v, jv prec, jv method, int line, jv *out) {
    int64_t p = prec.t == JV_INT || prec.t == JV_BOOL ? prec.u.i : 0;
    const char *m = method.t == JV_STR ? method.u.s->s : "common";
    int common = !strcmp(m, "common"), ceil_ = !strcmp(m, "ceil"), floor_ = !strcmp(m, "floor");
    if (!common && !ceil_ && !floor_)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "method must be common, ceil or floor");
    if (p < 0 || p > 15 || (prec.t != JV_INT && prec.t != JV_BOOL && prec.t != JV_UNDEF))
        return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: round precision outside 0..15");
    if (v.t != JV_INT && v.t != JV_BOOL && v.t != JV_FLOAT)
        return jerr_set(&e->err, JINJA_RUNTIME, line, "round: expected a number, got %s", jv_type_name(v));
    if (common && v.t != JV_FLOAT) {
        *out = jv_int(v.u.i);
        return 0;
    }
    double x = v.t == JV_FLOAT ? v.u.f : (double)v.u.i, scale = pow(10, (double)p);
    if (!common) {
        *out = jv_float((ceil_ ? ceil(x * scale) : floor(x * scale)) / scale);
        return 0;
    }
    if (!isfinite(x)) {
        *out = v;
        return 0;
    }
    if (p == 0) {
        *out = jv_float(nearbyint(x));
        return 0;
    }
    char t[400]; /* printf rounds the exact binary value half-even, as Python's round does */
    snprintf(t, sizeof t, "%.*f", (int)p, x);
    *out = jv_float(strtod(t, NULL));
    return 0;
}

/* stable merge sort of idx[0..n) by keys (numbers or strings); -1 on keys that do not compare */
static int s_key_cmp(jv a, jv b, int *bad) {
    int an = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT,
        bn = b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT;
    if (an && bn) {
        double x = a.t == JV_FLOAT ? a.u.f : (double)a.u.i, y = b.t == JV_FLOAT ? b.u.f : (double)b.u.i;
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        return c ? c : (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    }
    *bad = 1;
    return 0;
}

static void s_msort(size_t *idx, size_t *tmp, size_t n, const jv *keys, int rev, int *bad) {
    if (n < 2) return;
    size_t h = n / 2;
    s_msort(idx, tmp, h, keys, rev, bad);
    s_msort(idx + h, tmp, n - h, keys, rev, bad);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = s_key_cmp(keys[idx[j]], keys[idx[i]], bad);
        if (rev ? c > 0 : c < 0) tmp[k++] = idx[j++]; /* take the right one only when strictly before: stable */
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static int s_sort(jinja_env *e, jv v, int rev, int case_sensitive, jv attr, int line, jv *out) {
    jv items;
    if (s_list_of(e, v, line, &items)) return -1;
    size_t n = items.u.l->n;
    jv *keys = ja_alloc(&e->arena, (n ? n : 1) * sizeof *keys);
    size_t *idx = malloc((n ? n : 1) * sizeof *idx), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!keys || !idx || !tmp) {
        free(idx);
        free(tmp);
        return s_oom(e, line);
    }
    for (size_t i = 0; i < n; i++) {
        jv k = attr.t == JV_STR ? s_attr_path(e, items.u.l->v[i], attr.u.s->s) : items.u.l->v[i];
        if (k.t == JV_STR && !case_sensitive && s_case(e, k, CASE_LOWER, line, &k)) {
            free(idx);
            free(tmp);
            return -1;
        }
        keys[i] = k;
        idx[i] = i;
    }
    int bad = 0;
    s_msort(idx, tmp, n, keys, rev, &bad);
    jv l = jv_list_new(e);
    for (size_t i = 0; i < n && !bad; i++)
        if (jv_list_push(e, l, items.u.l->v[idx[i]])) {
            free(idx);
            free(tmp);
            return s_oom(e, line);
        }
    free(idx);
    free(tmp);
    if (bad) return jerr_set(&e->err, JINJA_RUNTIME, line, "sort: values that do not compare ('<' between types)");
    if (l.t != JV_LIST) return s_oom(e, line);
    *out = l;
    return 0;
}

int jbi_filter(jinja_env *e, jscope *sc, const char *name, jv v, jv *args, int nargs, const char **kwn, jv *kwv,
               int nkw, int line, jv *out) {
    jv none = jv_none(), s;
    if (!strcmp(name, "trim")) {
        if (s_str_of(e, v, line, &s)) return -1;
        return s_strip(e, s, s_arg(args, nargs, kwn, kwv, nkw, 0, "chars", none), 1, 1, line, out);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.t == JV_STR) *out = jv_int((int64_t)ju_cplen(v.u.s->s, v.u.s->n));
        else if (v.t == JV_LIST && v.u.l->kind == LK_GEN)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "object of type 'generator' has no len()");
        else if (v.t == JV_LIST) *out = jv_int((int64_t)v.u.l->n);
        else if (v.t == JV_DICT && !v.u.d->ns) *out = jv_int((int64_t)v.u.d->n);
        else if (v.t == JV_UNDEF) *out = jv_int(0);
        else return jerr_set(&e->err, JINJA_RUNTIME, line, "object of type '%s' has no len()", jv_type_name(v));
        return 0;
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize")) {
        if (s_str_of(e, v, line, &s)) return -1;
        return s_case(e, s, name[0] == 'u' ? CASE_UPPER : name[0] == 'l' ? CASE_LOWER : CASE_CAP, line, out);
    }
    if (!strcmp(name, "tojson")) return s_tojson(e, v, args, nargs, kwn, kwv, nkw, line, out);
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv items;
        if (name[0] == 'l' && v.t == JV_LIST && v.u.l->kind == LK_GEN)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "'generator' object is not reversible");
        if (s_list_of(e, v, line, &items)) return -1;
        *out = !items.u.l->n ? jv_undef(NULL) : items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1];
        return 0;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv dflt = s_arg(args, nargs, kwn, kwv, nkw, 0, "default_value", jv_undef(NULL));
        if (dflt.t == JV_UNDEF && nargs == 0) {
            dflt = jv_string(e, "", 0);
            if (dflt.t != JV_STR) return s_oom(e, line);
        }
        int boolean = jv_truthy(s_arg(args, nargs, kwn, kwv, nkw, 1, "boolean", jv_bool(0)));
        *out = v.t == JV_UNDEF || (boolean && !jv_truthy(v)) ? dflt : v;
        return 0;
    }
    if (!strcmp(name, "join")) {
        jv items, sep = s_arg(args, nargs, kwn, kwv, nkw, 0, "d", jv_undef(NULL));
        jv attr = s_arg(args, nargs, kwn, kwv, nkw, 1, "attribute", none);
        if (s_list_of(e, v, line, &items)) return -1;
        if (sep.t != JV_UNDEF && s_str_of(e, sep, line, &sep)) return -1;
        if (attr.t == JV_STR) {
            jv l = jv_list_new(e);
            if (l.t != JV_LIST) return s_oom(e, line);
            for (size_t i = 0; i < items.u.l->n; i++)
                if (jv_list_push(e, l, s_attr_path(e, items.u.l->v[i], attr.u.s->s))) return s_oom(e, line);
            items = l;
        }
        return s_join(e, items, sep, line, out);
    }
    if (!strcmp(name, "string") || !strcmp(name, "safe"))
        return name[1] == 'a' && v.t == JV_STR ? (*out = v, 0) : s_str_of(e, v, line, out);
    if (!strcmp(name, "escape") || !strcmp(name, "e")) {
        if (s_str_of(e, v, line, &s)) return -1;
        jbuf b = {0};
        for (size_t i = 0; i < s.u.s->n; i++) {
            char c = s.u.s->s[i];
            if (c == '&') jb_puts(&b, "&amp;");
            else if (c == '<') jb_puts(&b, "&lt;");
            else if (c == '>') jb_puts(&b, "&gt;");
            else if (c == '"') jb_puts(&b, "&#34;");
            else if (c == '\'') jb_puts(&b, "&#39;");
            else jb_put(&b, &c, 1);
        }
        *out = jv_from_buf(e, &b);
        return out->t == JV_STR ? 0 : s_oom(e, line);
    }
    if (!strcmp(name, "int")) {
        if (v.t == JV_UNDEF) /* int(Undefined) raises in jinja2 */
            return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' is undefined", v.u.uname ? v.u.uname : "value");
        jv dflt = s_arg(args, nargs, kwn, kwv, nkw, 0, "default", jv_int(0));
        if (v.t == JV_INT || v.t == JV_BOOL) *out = jv_int(v.u.i);
        else if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9e18) *out = jv_int((int64_t)v.u.f);
        else if (v.t == JV_STR) {
            char *end;
            const char *p = v.u.s->s;
            size_t n = v.u.s->n;
            ju_strip(&p, &n, NULL, 0, 1, 1);
            long long x = strtoll(p, &end, 10);
            if (n && end == p + n && !memchr(p, '_', n)) *out = jv_int(x);
            else {
                double f = strtod(p, &end);
                *out = n && end == p + n && isfinite(f) && fabs(f) < 9e18 ? jv_int((int64_t)f) : dflt;
            }
        } else *out = dflt;
        return 0;
    }
    if (!strcmp(name, "float")) {
        if (v.t == JV_UNDEF) /* float(Undefined) raises in jinja2 */
            return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' is undefined", v.u.uname ? v.u.uname : "value");
        jv dflt = s_arg(args, nargs, kwn, kwv, nkw, 0, "default", jv_float(0));
        if (v.t == JV_INT || v.t == JV_BOOL) *out = jv_float((double)v.u.i);
        else if (v.t == JV_FLOAT) *out = v;
        else if (v.t == JV_STR) {
            char *end;
            const char *p = v.u.s->s;
            size_t n = v.u.s->n;
            ju_strip(&p, &n, NULL, 0, 1, 1);
            double f = strtod(p, &end);
            *out = n && end == p + n ? jv_float(f) : dflt;
        } else *out = dflt;
        return 0;
    }
    if (!strcmp(name, "list")) return s_list_of(e, v, line, out);
    if (!strcmp(name, "items")) {
        if (v.t == JV_UNDEF) {
            *out = jv_list_new(e);
            return out->t == JV_LIST ? 0 : s_oom(e, line);
        }
        if (v.t != JV_DICT || v.u.d->ns)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "can only get item pairs from a mapping");
        if (jbi_method(e, v, "items", NULL, 0, NULL, NULL, 0, line, out)) return -1;
        out->u.l->kind = LK_GEN; /* the filter is a generator, the method a view */
        return 0;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
        !strcmp(name, "reject"))
        return s_select(e, sc, name, v, args, nargs, line, out);
    if (!strcmp(name, "map")) {
        jv items, attr = jv_undef(NULL);
        if (s_list_of(e, jv_truthy(v) ? v : jv_undef(NULL), line, &items)) return -1; /* as select */
        jv l = jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, line);
        int by_attr = s_kw(kwn, kwv, nkw, "attribute", &attr);
        jv dflt = jv_undef(NULL);
        s_kw(kwn, kwv, nkw, "default", &dflt);
        if (!by_attr && (nargs < 1 || args[0].t != JV_STR))
            return jerr_set(&e->err, JINJA_RUNTIME, line, "map: a filter name or attribute= is needed");
        if (!by_attr && !jbi_known_filter(args[0].u.s->s))
            return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported filter '%s'", args[0].u.s->s);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv x;
            if (by_attr) {
                if (attr.t != JV_STR)
                    return jerr_set(&e->err, JINJA_UNSUPPORTED, line,
                                    "unsupported: map attribute that is not a string");
                x = s_attr_path(e, items.u.l->v[i], attr.u.s->s);
                if (x.t == JV_UNDEF) x = dflt;
            } else if (jbi_filter(e, sc, args[0].u.s->s, items.u.l->v[i], args + 1, nargs - 1, NULL, NULL, 0, line, &x))
                return -1;
            if (jv_list_push(e, l, x)) return s_oom(e, line);
        }
        l.u.l->kind = LK_GEN;
        *out = l;
        return 0;
    }
    if (!strcmp(name, "reverse")) {
        if (v.t == JV_STR) {
            jbuf b = {0};
            size_t n = v.u.s->n;
            while (n) {
                size_t k = n - 1;
                while (k && ((unsigned char)v.u.s->s[k] & 0xC0) == 0x80) k--;
                jb_put(&b, v.u.s->s + k, n - k);
                n = k;
            }
            *out = jv_from_buf(e, &b);
            return out->t == JV_STR ? 0 : s_oom(e, line);
        }
        jv items;
        if (s_list_of(e, v, line, &items)) return -1;
        for (size_t i = 0; i < items.u.l->n / 2; i++) {
            jv t = items.u.l->v[i];
            items.u.l->v[i] = items.u.l->v[items.u.l->n - 1 - i];
            items.u.l->v[items.u.l->n - 1 - i] = t;
        }
        items.u.l->kind = LK_GEN; /* reversed(): an iterator */
        *out = items;
        return 0;
    }
    if (!strcmp(name, "replace")) {
        int64_t c = -1;
        if (s_str_of(e, v, line, &s)) return -1;
        if (nargs < 2) return jerr_set(&e->err, JINJA_RUNTIME, line, "replace needs two arguments");
        jv o, n2;
        if (s_str_of(e, args[0], line, &o) || s_str_of(e, args[1], line, &n2)) return -1;
        if (s_int_arg(e, s_arg(args, nargs, kwn, kwv, nkw, 2, "count", none), -1, line, &c)) return -1;
        return s_replace(e, s, o, n2, c, line, out);
    }
    if (!strcmp(name, "abs")) {
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (v.u.i == INT64_MIN)
                return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: integer result outside 64 bits");
            *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        } else if (v.t == JV_FLOAT) *out = jv_float(fabs(v.u.f));
        else return jerr_set(&e->err, JINJA_RUNTIME, line, "bad operand type for abs(): '%s'", jv_type_name(v));
        return 0;
    }
    if (!strcmp(name, "indent"))
        return s_indent(e, v, s_arg(args, nargs, kwn, kwv, nkw, 0, "width", jv_int(4)),
                        jv_truthy(s_arg(args, nargs, kwn, kwv, nkw, 1, "first", jv_bool(0))),
                        jv_truthy(s_arg(args, nargs, kwn, kwv, nkw, 2, "blank", jv_bool(0))), line, out);
    if (!strcmp(name, "title")) {
        if (s_str_of(e, v, line, &s)) return -1;
        return s_title_filter(e, s, line, out);
    }
    if (!strcmp(name, "round"))
        return s_round(e, v, s_arg(args, nargs, kwn, kwv, nkw, 0, "precision", jv_int(0)),
                       s_arg(args, nargs, kwn, kwv, nkw, 1, "method", none), line, out);
    if (!strcmp(name, "sort"))
        return s_sort(e, v, jv_truthy(s_arg(args, nargs, kwn, kwv, nkw, 0, "reverse", jv_bool(0))),
                      jv_truthy(s_arg(args, nargs, kwn, kwv, nkw, 1, "case_sensitive", jv_bool(0))),
                      s_arg(args, nargs, kwn, kwv, nkw, 2, "attribute", none), line, out);
    if (!strcmp(name, "unique")) {
        jv items;
        if (nargs || nkw) return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: unique with arguments");
        if (s_list_of(e, v, line, &items)) return -1;
        jv l = jv_list_new(e);
        if (l.t != JV_LIST) return s_oom(e, line);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv x = items.u.l->v[i];
            if ((x.t == JV_LIST && !x.u.l->tuple) || (x.t == JV_DICT && !x.u.d->ns))
                return jerr_set(&e->err, JINJA_RUNTIME, line, "unhashable type: '%s'", jv_type_name(x));
            int seen = 0;
            for (size_t j = 0; j < l.u.l->n && !seen; j++) seen = jv_equal(l.u.l->v[j], items.u.l->v[i]);
            if (!seen && jv_list_push(e, l, items.u.l->v[i])) return s_oom(e, line);
        }
        l.u.l->kind = LK_GEN;
        *out = l;
        return 0;
    }
    return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported filter '%s'", name);
}

/* ---- global functions ---- */
int jbi_call(jinja_env *e, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line,
             jv *out) {
    if (!strcmp(name, "raise_exception")) {
        jbuf b = {0};
        if (nargs > 0) jv_to_str(&b, args[0]);
        jerr_set(&e->err, JINJA_RAISED, line, "%s", b.p ? b.p : "");
        free(b.p);
        return JINJA_RAISED;
    }
    if (!strcmp(name, "range")) {
        int64_t a = 0, b = 0, st = 1;
        for (int i = 0; i < nargs; i++)
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                return jerr_set(&e->err, JINJA_RUNTIME, line, "'%s' object cannot be interpreted as an integer",
                                jv_type_name(args[i]));
        if (nargs == 1) b = args[0].u.i;
        else if (nargs == 2 || nargs == 3) {
            a = args[0].u.i;
            b = args[1].u.i;
            if (nargs == 3) st = args[2].u.i;
        } else return jerr_set(&e->err, JINJA_RUNTIME, line, "range expected 1 to 3 arguments, got %d", nargs);
        if (!st) return jerr_set(&e->err, JINJA_RUNTIME, line, "range() arg 3 must not be zero");
        double count =
            st > 0 ? ceil(((double)b - (double)a) / (double)st) : ceil(((double)a - (double)b) / (double)-st);
        if (count > (double)e->lim.max_iters)
            return jerr_set(&e->err, JINJA_LIMIT, line, "range of %.0f items exceeds the iteration limit", count);
        jv l = jv_list_new(e);
        if (l.t != JV_LIST) return jerr_set(&e->err, JINJA_NOMEM, line, "out of memory");
        for (int64_t x = a; st > 0 ? x < b : x > b; x += st) {
            if (jv_list_push(e, l, jv_int(x))) return s_oom(e, line);
            if (__builtin_add_overflow(x, st, &(int64_t){0})) break;
        }
        *out = l;
        return 0;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv d = jv_dict_new(e);
        if (d.t != JV_DICT) return s_oom(e, line);
        d.u.d->ns = name[0] == 'n';
        if (nargs > 1) return jerr_set(&e->err, JINJA_RUNTIME, line, "%s expected at most 1 positional argument", name);
        if (nargs == 1) {
            if (args[0].t != JV_DICT || args[0].u.d->ns)
                return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported: %s() from a %s", name,
                                jv_type_name(args[0]));
            for (size_t i = 0; i < args[0].u.d->n; i++)
                if (jv_dict_set(e, d, args[0].u.d->k[i], args[0].u.d->v[i])) return s_oom(e, line);
        }
        for (int i = 0; i < nkw; i++) {
            jv k = jv_str_of(e, kwn[i]);
            if (k.t != JV_STR || jv_dict_set(e, d, k, kwv[i])) return s_oom(e, line);
        }
        *out = d;
        return 0;
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs != 1 || args[0].t != JV_STR)
            return jerr_set(&e->err, JINJA_RUNTIME, line, "strftime_now takes one format string");
        if (args[0].u.s->n > 200) return jerr_set(&e->err, JINJA_LIMIT, line, "strftime_now format too long");
        time_t now = time(NULL);
        struct tm tm;
        char buf[1024];
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, args[0].u.s->s, &tm);
        *out = jv_string(e, buf, n);
        return out->t == JV_STR ? 0 : s_oom(e, line);
    }
    return jerr_set(&e->err, JINJA_UNSUPPORTED, line, "unsupported function '%s'", name);
}
