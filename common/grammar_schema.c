/* common/grammar_schema.c: a JSON schema as GBNF text (docs/structured-output.md has the supported subset).
 *
 * The output is JSON that the schema validates: objects carry their properties in the schema's order, required
 * ones always, optional ones when the model chooses, and never others (additionalProperties false is what strict
 * mode demands; with additionalProperties absent or true, leaving extras out still validates). Whitespace between
 * tokens is nothing, one space, or one newline and up to 20 spaces or tabs (bounded, so a model cannot pad
 * forever). Numbers have at most 16 integer and 15 fraction digits. A keyword that constrains values in a way the
 * grammar cannot guarantee (minimum, maximum, multipleOf, uniqueItems, not, if/then/else, patternProperties,
 * min/maxProperties, ...) is refused with its name rather than ignored; annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

#define S_MAX_REFS 1024

typedef struct {
    const zj_value *root;
    zg_buf *out;
    char *err;
    size_t errlen;
    int failed;
    int n_rules;
    char *ref_path[S_MAX_REFS]; /* $ref targets seen, each given rule def-i */
    int n_refs, n_done;
    unsigned used; /* S_* base rules used */
} s_ctx;

enum { S_WS = 1, S_STRING = 2, S_NUMBER = 4, S_INTEGER = 8, S_BOOL = 16, S_NULL = 32, S_VALUE = 64, S_CHAR = 128 };

static void s_fail(s_ctx *c, const char *fmt, const char *arg) {
    if (c->failed) return;
    c->failed = 1;
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    snprintf(c->err, c->errlen, "json_schema: %s", msg);
}

static void s_rule_name(s_ctx *c, char *name, size_t cap) { snprintf(name, cap, "r%d", c->n_rules++); }

static void s_gen(s_ctx *c, const zj_value *s, char *name, size_t cap, int depth);

static const char *const s_annotations[] = {
    "title",    "description", "default", "examples",    "$schema",  "$id",  "$comment", "deprecated",
    "readOnly", "writeOnly",   "$defs",   "definitions", "nullable", "name", "strict",   NULL};
static const char *const s_supported[] = {"type",      "properties",  "required",    "additionalProperties",
                                          "items",     "prefixItems", "minItems",    "maxItems",
                                          "enum",      "const",       "anyOf",       "oneOf",
                                          "allOf",     "$ref",        "format",      "pattern",
                                          "minLength", "maxLength",   "uniqueItems", "minimum",
                                          NULL};

static int s_in(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}

/* a non-negative integer keyword, or -1 when absent; -2 on a bad value */
static long s_count(s_ctx *c, const zj_value *s, const char *key) {
    const zj_value *v = zj_get(s, key);
    if (!v) return -1;
    if (v->type != ZJ_NUMBER || v->num < 0 || v->num != (double)(long)v->num || v->num > ZG_MAX_REPEAT) {
        s_fail(c, "%s must be an integer from 0 to 1000", key);
        return -2;
    }
    return (long)v->num;
}

/* the rule of a JSON literal (const and enum members) */
static void s_literal(s_ctx *c, const zj_value *v) {
    zg_buf t = {0};
    zj_write(v, &t);
    zg_buf_str(c->out, "\"");
    for (size_t i = 0; i < t.n;) {
        int32_t cp = zg_utf8_next(t.p, t.n, &i);
        if (cp < 0) break;
        zg_buf_cp(c->out, (uint32_t)cp);
    }
    zg_buf_str(c->out, "\"");
    if (t.oom) c->out->oom = 1;
    free(t.p);
}

static const char *s_base(s_ctx *c, unsigned which) {
    c->used |= which | S_WS;
    switch (which) {
    case S_WS: return "ws";
    case S_STRING: c->used |= S_CHAR; return "string";
    case S_NUMBER: return "number";
    case S_INTEGER: return "integer";
    case S_BOOL: return "boolean";
    case S_NULL: return "null";
    default: c->used |= S_STRING | S_CHAR | S_NUMBER | S_BOOL | S_NULL; return "value";
    }
}

/* $ref: "#" or "#/a/b" within the document; the rule def-i is generated once, after the root */
static void s_ref(s_ctx *c, const char *ref, char *name, size_t cap) {
    if (ref[0] != '#' || (ref[1] != 0 && ref[1] != '/')) {
        s_fail(c, "$ref '%s': only references within the schema (#/...) are supported", ref);
        return;
    }
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->ref_path[i], ref) == 0) {
            snprintf(name, cap, "def-%d", i);
            return;
        }
    if (c->n_refs >= S_MAX_REFS) {
        s_fail(c, "too many $ref targets%s", NULL);
        return;
    }
    c->ref_path[c->n_refs] = strdup(ref);
    if (!c->ref_path[c->n_refs]) {
        s_fail(c, "out of memory%s", NULL);
        return;
    }
    snprintf(name, cap, "def-%d", c->n_refs++);
}

/* resolves a JSON pointer (with ~0 ~1 escapes) from the root */
static const zj_value *s_resolve(s_ctx *c, const char *ref) {
    const zj_value *v = c->root;
    const char *p = ref + 1;
    while (*p == '/' && v) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (v->type == ZJ_OBJECT) v = zj_get(v, tok);
        else if (v->type == ZJ_ARRAY) {
            char *e;
            long i = strtol(tok, &e, 10);
            v = *e == 0 && i >= 0 && i < v->n ? v->items[i] : NULL;
        } else v = NULL;
    }
    if (!v || *p) s_fail(c, "$ref '%s' does not resolve", ref);
    return v;
}

static void s_string(s_ctx *c, const zj_value *s, char *name, size_t cap) {
    const zj_value *fmt = zj_get(s, "format"), *pat = zj_get(s, "pattern");
    long mn = s_count(c, s, "minLength"), mx = s_count(c, s, "maxLength");
    if (c->failed) return;
    if (pat) {
        if (pat->type != ZJ_STRING) {
            s_fail(c, "pattern must be a string%s", NULL);
            return;
        }
        if (mn >= 0 || mx >= 0) {
            s_fail(c, "pattern together with minLength/maxLength is not supported%s", NULL);
            return;
        }
        s_rule_name(c, name, cap);
        char sub[32];
        snprintf(sub, sizeof sub, "%s-re", name);
        zg_buf_fmt(c->out, "%s ::= \"\\\"\" %s \"\\\"\"\n", name, sub);
        if (zg_regex_to_gbnf(pat->str, pat->slen, sub, 1, c->out, c->err, c->errlen) != 0) c->failed = 1;
        return;
    }
    const char *body = NULL;
    if (fmt && fmt->type == ZJ_STRING) {
        static const char date[] =
            "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])";
        static const char time[] = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                                   "(\"Z\" | [+\\x2D] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        static char dt[512];
        snprintf(dt, sizeof dt, "%s \"T\" %s", date, time);
        if (strcmp(fmt->str, "date") == 0) body = date;
        else if (strcmp(fmt->str, "time") == 0) body = time;
        else if (strcmp(fmt->str, "date-time") == 0) body = dt;
        else if (strcmp(fmt->str, "uuid") == 0)
            body = "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
        else if (strcmp(fmt->str, "email") == 0)
            body = "[a-zA-Z0-9_.+\\x2D]{1,32} \"@\" [a-zA-Z0-9\\x2D]{1,32} (\".\" [a-zA-Z0-9\\x2D]{1,16}){1,3}";
        /* other formats are annotations by default (JSON Schema 2020-12): a plain string */
    }
    if (body) {
        if (mn >= 0 || mx >= 0) {
            s_fail(c, "format together with minLength/maxLength is not supported%s", NULL);
            return;
        }
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= \"\\\"\" %s \"\\\"\"\n", name, body);
        return;
    }
    if (mn < 0 && mx < 0) {
        snprintf(name, cap, "%s", s_base(c, S_STRING));
        return;
    }
    if (mn < 0) mn = 0;
    if (mx >= 0 && mx < mn) {
        s_fail(c, "unsatisfiable: maxLength below minLength%s", NULL);
        return;
    }
    c->used |= S_CHAR;
    s_rule_name(c, name, cap);
    if (mx < 0) zg_buf_fmt(c->out, "%s ::= \"\\\"\" char{%ld,} \"\\\"\"\n", name, mn);
    else zg_buf_fmt(c->out, "%s ::= \"\\\"\" char{%ld,%ld} \"\\\"\"\n", name, mn, mx);
}

static void s_number(s_ctx *c, const zj_value *s, int integer, char *name, size_t cap) {
    const zj_value *mn = zj_get(s, "minimum");
    if (mn) {
        if (mn->type != ZJ_NUMBER || (mn->num != 0 && !(integer && mn->num == 1))) {
            s_fail(c, "minimum other than 0 (or 1 for integers) is not supported%s", NULL);
            return;
        }
        s_rule_name(c, name, cap);
        if (integer && mn->num == 1) zg_buf_fmt(c->out, "%s ::= [1-9] [0-9]{0,15}\n", name);
        else if (integer) zg_buf_fmt(c->out, "%s ::= \"0\" | [1-9] [0-9]{0,15}\n", name);
        else
            zg_buf_fmt(c->out, "%s ::= (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,15})? ([eE] [+\\x2D]? [0-9]{1,3})?\n",
                       name);
        return;
    }
    snprintf(name, cap, "%s", s_base(c, integer ? S_INTEGER : S_NUMBER));
}

/* properties in order; F(i): none emitted yet, R(i): some emitted (each next one needs a comma) */
static void s_object(s_ctx *c, const zj_value *s, char *name, size_t cap, int depth) {
    const zj_value *props = zj_get(s, "properties"), *req = zj_get(s, "required"),
                   *add = zj_get(s, "additionalProperties");
    if (props && props->type != ZJ_OBJECT) {
        s_fail(c, "properties must be an object%s", NULL);
        return;
    }
    if (req && req->type != ZJ_ARRAY) {
        s_fail(c, "required must be an array%s", NULL);
        return;
    }
    int np = props ? props->n : 0;
    if (req)
        for (int i = 0; i < req->n; i++) {
            if (req->items[i]->type != ZJ_STRING) {
                s_fail(c, "required must hold strings%s", NULL);
                return;
            }
            if (!zj_get(props, req->items[i]->str)) {
                s_fail(c, "required property '%s' is not in properties", req->items[i]->str);
                return;
            }
        }
    const char *ws = s_base(c, S_WS);
    (void)ws;
    if (np == 0) {
        /* no properties: any object, or a map whose values follow additionalProperties */
        char val[64];
        if (add && add->type == ZJ_OBJECT) s_gen(c, add, val, sizeof val, depth + 1);
        else if (add && add->type == ZJ_FALSE) {
            s_rule_name(c, name, cap);
            zg_buf_fmt(c->out, "%s ::= \"{\" ws \"}\"\n", name);
            return;
        } else snprintf(val, sizeof val, "%s", s_base(c, S_VALUE));
        if (c->failed) return;
        s_base(c, S_STRING);
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out,
                   "%s ::= \"{\" ws (string ws \":\" ws %s ws (\",\" ws string ws \":\" ws %s ws){0,15})? \"}\"\n",
                   name, val, val);
        return;
    }
    if (add && add->type != ZJ_TRUE && add->type != ZJ_FALSE && add->type != ZJ_OBJECT) {
        s_fail(c, "additionalProperties must be a boolean or a schema%s", NULL);
        return;
    }
    char(*kv)[64] = calloc((size_t)np, sizeof *kv);
    int *required = calloc((size_t)np, sizeof *required);
    if (!kv || !required) {
        free(kv);
        free(required);
        s_fail(c, "out of memory%s", NULL);
        return;
    }
    for (int i = 0; i < np; i++) {
        if (req)
            for (int j = 0; j < req->n; j++) required[i] |= strcmp(req->items[j]->str, props->keys[i]) == 0;
        char val[64];
        s_gen(c, props->items[i], val, sizeof val, depth + 1);
        if (c->failed) break;
        s_rule_name(c, kv[i], sizeof kv[i]);
        zj_value key = {.type = ZJ_STRING, .str = props->keys[i], .slen = strlen(props->keys[i])};
        zg_buf_fmt(c->out, "%s ::= ", kv[i]);
        s_literal(c, &key);
        zg_buf_fmt(c->out, " ws \":\" ws %s ws\n", val);
    }
    if (!c->failed) {
        int base = c->n_rules;
        c->n_rules += 2 * (np + 1);
        /* rule F(i) is r<base+2i>, R(i) is r<base+2i+1>; F(np) and R(np) are empty */
        for (int i = np; i >= 0; i--) {
            int F = base + 2 * i, R = F + 1;
            if (i == np) {
                zg_buf_fmt(c->out, "r%d ::= \"\"\nr%d ::= \"\"\n", F, R);
                continue;
            }
            if (required[i]) {
                zg_buf_fmt(c->out, "r%d ::= %s r%d\n", F, kv[i], R + 2);
                zg_buf_fmt(c->out, "r%d ::= \",\" ws %s r%d\n", R, kv[i], R + 2);
            } else {
                zg_buf_fmt(c->out, "r%d ::= %s r%d | r%d\n", F, kv[i], R + 2, F + 2);
                zg_buf_fmt(c->out, "r%d ::= (\",\" ws %s)? r%d\n", R, kv[i], R + 2);
            }
        }
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= \"{\" ws r%d \"}\"\n", name, base);
    }
    free(kv);
    free(required);
}

static void s_array(s_ctx *c, const zj_value *s, char *name, size_t cap, int depth) {
    const zj_value *items = zj_get(s, "items"), *prefix = zj_get(s, "prefixItems"), *uniq = zj_get(s, "uniqueItems");
    long mn = s_count(c, s, "minItems"), mx = s_count(c, s, "maxItems");
    if (c->failed) return;
    if (uniq && uniq->type != ZJ_FALSE) {
        s_fail(c, "uniqueItems is not supported%s", NULL);
        return;
    }
    s_base(c, S_WS);
    if (prefix) {
        if (prefix->type != ZJ_ARRAY || prefix->n == 0 || (items && items->type != ZJ_FALSE) || mn >= 0 || mx >= 0) {
            s_fail(c, "prefixItems is supported as a fixed tuple only (items false, no minItems/maxItems)%s", NULL);
            return;
        }
        zg_buf t = {0};
        for (int i = 0; i < prefix->n && !c->failed; i++) {
            char it[64];
            s_gen(c, prefix->items[i], it, sizeof it, depth + 1);
            zg_buf_fmt(&t, "%s%s ws", i ? " \",\" ws " : "", it);
        }
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= \"[\" ws %s \"]\"\n", name, t.p ? t.p : "");
        free(t.p);
        return;
    }
    char it[64];
    if (items && items->type == ZJ_FALSE) {
        if (mn > 0) {
            s_fail(c, "unsatisfiable: items false with minItems above 0%s", NULL);
            return;
        }
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= \"[\" ws \"]\"\n", name);
        return;
    }
    if (items) s_gen(c, items, it, sizeof it, depth + 1);
    else snprintf(it, sizeof it, "%s", s_base(c, S_VALUE));
    if (c->failed) return;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mx < mn) {
        s_fail(c, "unsatisfiable: maxItems below minItems%s", NULL);
        return;
    }
    s_rule_name(c, name, cap);
    if (mx == 0) {
        zg_buf_fmt(c->out, "%s ::= \"[\" ws \"]\"\n", name);
        return;
    }
    long lo = mn > 0 ? mn - 1 : 0;
    char rep[48];
    if (mx < 0) snprintf(rep, sizeof rep, "{%ld,}", lo);
    else snprintf(rep, sizeof rep, "{%ld,%ld}", lo, mx - 1);
    zg_buf_fmt(c->out, "%s ::= \"[\" ws %s%s ws (\",\" ws %s ws)%s%s \"]\"\n", name, mn > 0 ? "" : "(", it, it, rep,
               mn > 0 ? "" : ")?");
}

static void s_type(s_ctx *c, const zj_value *s, const char *t, char *name, size_t cap, int depth) {
    if (strcmp(t, "string") == 0) s_string(c, s, name, cap);
    else if (strcmp(t, "number") == 0) s_number(c, s, 0, name, cap);
    else if (strcmp(t, "integer") == 0) s_number(c, s, 1, name, cap);
    else if (strcmp(t, "boolean") == 0) snprintf(name, cap, "%s", s_base(c, S_BOOL));
    else if (strcmp(t, "null") == 0) snprintf(name, cap, "%s", s_base(c, S_NULL));
    else if (strcmp(t, "object") == 0) s_object(c, s, name, cap, depth);
    else if (strcmp(t, "array") == 0) s_array(c, s, name, cap, depth);
    else s_fail(c, "unknown type '%s'", t);
}

/* alternatives of sub-schemas (anyOf, oneOf: oneOf is generated as anyOf, see the docs) */
static void s_alts(s_ctx *c, const zj_value *list, const char *key, char *name, size_t cap, int depth) {
    if (list->type != ZJ_ARRAY || list->n == 0) {
        s_fail(c, "%s must be a non-empty array", key);
        return;
    }
    zg_buf t = {0};
    for (int i = 0; i < list->n && !c->failed; i++) {
        char sub[64];
        s_gen(c, list->items[i], sub, sizeof sub, depth + 1);
        zg_buf_fmt(&t, "%s%s", i ? " | " : "", sub);
    }
    if (!c->failed) {
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= %s\n", name, t.p);
    }
    free(t.p);
}

static void s_gen(s_ctx *c, const zj_value *s, char *name, size_t cap, int depth) {
    snprintf(name, cap, "value");
    if (c->failed) return;
    if (depth > ZG_MAX_DEPTH) {
        s_fail(c, "schema nested too deep%s", NULL);
        return;
    }
    if (s->type == ZJ_TRUE) {
        snprintf(name, cap, "%s", s_base(c, S_VALUE));
        return;
    }
    if (s->type == ZJ_FALSE) {
        s_fail(c, "unsatisfiable: schema false%s", NULL);
        return;
    }
    if (s->type != ZJ_OBJECT) {
        s_fail(c, "a schema must be an object or a boolean%s", NULL);
        return;
    }
    for (int i = 0; i < s->n; i++)
        if (!s_in(s->keys[i], s_supported) && !s_in(s->keys[i], s_annotations)) {
            s_fail(c, "unsupported keyword '%s'", s->keys[i]);
            return;
        }
    const zj_value *v;
    if ((v = zj_get(s, "$ref"))) {
        if (v->type != ZJ_STRING) s_fail(c, "$ref must be a string%s", NULL);
        else if (s->n > 1 && (zj_get(s, "type") || zj_get(s, "properties")))
            s_fail(c, "$ref beside other constraints is not supported%s", NULL);
        else s_ref(c, v->str, name, cap);
        return;
    }
    if ((v = zj_get(s, "const"))) {
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= ", name);
        s_literal(c, v);
        zg_buf_str(c->out, "\n");
        return;
    }
    if ((v = zj_get(s, "enum"))) {
        if (v->type != ZJ_ARRAY || v->n == 0) {
            s_fail(c, "unsatisfiable: enum must be a non-empty array%s", NULL);
            return;
        }
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= ", name);
        for (int i = 0; i < v->n; i++) {
            if (i) zg_buf_str(c->out, " | ");
            s_literal(c, v->items[i]);
        }
        zg_buf_str(c->out, "\n");
        return;
    }
    if ((v = zj_get(s, "anyOf")) || (v = zj_get(s, "oneOf"))) {
        s_alts(c, v, zj_get(s, "anyOf") ? "anyOf" : "oneOf", name, cap, depth);
        return;
    }
    if ((v = zj_get(s, "allOf"))) {
        if (v->type != ZJ_ARRAY || v->n != 1) s_fail(c, "allOf is supported with one member only%s", NULL);
        else s_gen(c, v->items[0], name, cap, depth + 1);
        return;
    }
    const zj_value *t = zj_get(s, "type");
    if (!t) {
        if (zj_get(s, "properties") || zj_get(s, "additionalProperties")) s_object(c, s, name, cap, depth);
        else if (zj_get(s, "items") || zj_get(s, "prefixItems")) s_array(c, s, name, cap, depth);
        else if (zj_get(s, "pattern") || zj_get(s, "format") || zj_get(s, "minLength") || zj_get(s, "maxLength"))
            s_string(c, s, name, cap);
        else snprintf(name, cap, "%s", s_base(c, S_VALUE));
        return;
    }
    if (t->type == ZJ_STRING) {
        s_type(c, s, t->str, name, cap, depth);
        return;
    }
    if (t->type != ZJ_ARRAY || t->n == 0) {
        s_fail(c, "type must be a string or a non-empty array%s", NULL);
        return;
    }
    zg_buf alt = {0};
    for (int i = 0; i < t->n && !c->failed; i++) {
        if (t->items[i]->type != ZJ_STRING) {
            s_fail(c, "type must hold strings%s", NULL);
            break;
        }
        char sub[64];
        s_type(c, s, t->items[i]->str, sub, sizeof sub, depth);
        zg_buf_fmt(&alt, "%s%s", i ? " | " : "", sub);
    }
    if (!c->failed) {
        s_rule_name(c, name, cap);
        zg_buf_fmt(c->out, "%s ::= %s\n", name, alt.p);
    }
    free(alt.p);
}

int zg_schema_to_gbnf(const char *text, size_t len, int any_object, zg_buf *out, char *err, size_t errlen) {
    s_ctx c;
    memset(&c, 0, sizeof c);
    c.out = out;
    c.err = err;
    c.errlen = errlen;
    zj_value *doc = NULL;
    char root[64];
    if (any_object) {
        doc = zj_parse("{\"type\":\"object\"}", 17, err, errlen);
    } else {
        doc = zj_parse(text, len, err, errlen);
    }
    if (!doc) return -1;
    c.root = doc;
    s_gen(&c, doc, root, sizeof root, 0);
    while (!c.failed && c.n_done < c.n_refs) {
        int i = c.n_done++;
        const zj_value *target = s_resolve(&c, c.ref_path[i]);
        if (!target) break;
        char sub[64];
        s_gen(&c, target, sub, sizeof sub, 1);
        zg_buf_fmt(out, "def-%d ::= %s\n", i, sub);
    }
    if (!c.failed) {
        zg_buf_fmt(out, "root ::= %s\n", root);
        if (c.used & S_WS) zg_buf_str(out, "ws ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n");
        if (c.used & S_CHAR)
            zg_buf_str(out, "char ::= [^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n");
        if (c.used & S_STRING) zg_buf_str(out, "string ::= \"\\\"\" char{0,} \"\\\"\"\n");
        if (c.used & S_INTEGER) zg_buf_str(out, "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n");
        if (c.used & S_NUMBER)
            zg_buf_str(out,
                       "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,3})?\n");
        if (c.used & S_BOOL) zg_buf_str(out, "boolean ::= \"true\" | \"false\"\n");
        if (c.used & S_NULL) zg_buf_str(out, "null ::= \"null\"\n");
        if (c.used & S_VALUE) {
            zg_buf_str(out, "value ::= object | array | string | number | boolean | null\n");
            zg_buf_str(
                out,
                "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? \"}\"\n");
            zg_buf_str(out, "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n");
        }
    }
    for (int i = 0; i < c.n_refs; i++) free(c.ref_path[i]);
    zj_free(doc);
    if (out->oom && !c.failed) {
        snprintf(err, errlen, "json_schema: out of memory");
        return -1;
    }
    return c.failed ? -1 : 0;
}
