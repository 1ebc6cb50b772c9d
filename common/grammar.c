/* common/grammar.c: compiling by kind (a JSON schema or a regex is translated into GBNF text first, so that one
 * compiler and one matcher serve all kinds), references, and the cache of compiled grammars keyed by an FNV-1a
 * hash of kind and text (the text is compared too, so a collision cannot hand out the wrong grammar). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

static const char *const s_kinds[] = {"", "json_schema", "json_object", "regex", "grammar"};

int grammar_kind_parse(const char *name) {
    if (!name) return -1;
    for (int k = 1; k < (int)(sizeof s_kinds / sizeof *s_kinds); k++)
        if (strcmp(name, s_kinds[k]) == 0) return k;
    return -1;
}

const char *grammar_kind_name(int kind) {
    return kind > 0 && kind < (int)(sizeof s_kinds / sizeof *s_kinds) ? s_kinds[kind] : "none";
}

char *grammar_to_gbnf(int kind, const char *text, size_t len, char *err, size_t errlen) {
    zg_buf b = {0};
    if (len > ZG_MAX_TEXT) {
        snprintf(err, errlen, "%s: text of %zu bytes exceeds %d", grammar_kind_name(kind), len, ZG_MAX_TEXT);
        return NULL;
    }
    if (kind != ZG_JSON_OBJECT && !text) {
        snprintf(err, errlen, "%s: no text", grammar_kind_name(kind));
        return NULL;
    }
    switch (kind) {
    case ZG_GBNF: zg_buf_put(&b, text, len); break;
    case ZG_JSON_SCHEMA:
    case ZG_JSON_OBJECT:
        if (zg_schema_to_gbnf(text, len, kind == ZG_JSON_OBJECT, &b, err, errlen) != 0) goto fail;
        break;
    case ZG_REGEX:
        if (zg_regex_to_gbnf(text, len, "root", 0, &b, err, errlen) != 0) goto fail;
        break;
    default: snprintf(err, errlen, "grammar: unknown kind %d", kind); goto fail;
    }
    if (b.oom) {
        snprintf(err, errlen, "grammar: out of memory");
        goto fail;
    }
    if (!b.p) zg_buf_put(&b, "", 0);
    return b.p;
fail:
    free(b.p);
    return NULL;
}

zg_grammar *grammar_compile(int kind, const char *text, size_t len, char *err, size_t errlen) {
    char *gbnf = grammar_to_gbnf(kind, text, len, err, errlen);
    if (!gbnf) return NULL;
    zg_grammar *g = zg_gbnf_compile(gbnf, strlen(gbnf), err, errlen);
    if (!g && kind != ZG_GBNF) {
        /* a translation that does not compile: name the kind, keep the compiler's reason */
        char why[200];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "%s: %s", grammar_kind_name(kind), why);
    }
    free(gbnf);
    if (g) g->kind = kind;
    return g;
}

zg_grammar *grammar_ref(zg_grammar *g) {
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED); /* matchers may come and go on several threads */
    return g;
}

void grammar_unref(zg_grammar **pg) {
    if (!pg || !*pg) return;
    zg_grammar *g = *pg;
    *pg = NULL;
    if (__atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    zg_mcache_free(&g->mc);
    free(g->el);
    free(g->alt_end);
    free(g->rule_start);
    free(g);
}

int grammar_kind(const zg_grammar *g) { return g->kind; }
int grammar_rules(const zg_grammar *g) { return g->n_rules; }

/* ---- cache ---- */

typedef struct {
    uint64_t hash;
    int kind;
    char *text;
    size_t len;
    zg_grammar *g;
    uint64_t used;
} s_entry;

struct zg_cache {
    s_entry *e;
    int cap, n;
    uint64_t tick, hits;
};

static uint64_t s_fnv(int kind, const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

zg_cache *grammar_cache_new(int cap) {
    zg_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cap = cap > 0 ? cap : 1;
    c->e = calloc((size_t)c->cap, sizeof *c->e);
    if (!c->e) {
        free(c);
        return NULL;
    }
    return c;
}

void grammar_cache_destroy(zg_cache **pc) {
    if (!pc || !*pc) return;
    zg_cache *c = *pc;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].text);
        grammar_unref(&c->e[i].g);
    }
    free(c->e);
    free(c);
    *pc = NULL;
}

uint64_t grammar_cache_hits(const zg_cache *c) { return c->hits; }

zg_grammar *grammar_cache_get(zg_cache *c, int kind, const char *text, size_t len, char *err, size_t errlen) {
    if (!text) text = "", len = 0;
    uint64_t h = s_fnv(kind, text, len);
    for (int i = 0; i < c->n; i++) {
        s_entry *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && memcmp(e->text, text, len) == 0) {
            e->used = ++c->tick;
            c->hits++;
            return grammar_ref(e->g);
        }
    }
    zg_grammar *g = grammar_compile(kind, text, len, err, errlen);
    if (!g) return NULL;
    char *copy = malloc(len + 1);
    if (!copy) return g; /* served, not cached */
    memcpy(copy, text, len);
    copy[len] = 0;
    int slot = c->n;
    if (c->n == c->cap) {
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
        free(c->e[slot].text);
        grammar_unref(&c->e[slot].g);
    } else c->n++;
    c->e[slot] = (s_entry){h, kind, copy, len, grammar_ref(g), ++c->tick};
    return g;
}
