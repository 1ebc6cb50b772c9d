/* http/gw_vocab.c: the gateway's vocabularies for /tokenize and /detokenize (see gw_vocab.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gguf.h"
#include "gw_vocab.h"
#include "tokenizer.h"

#define MAX_VOCABS 16

struct gw_vocab {
    char *names[MAX_VOCABS];
    zl_tokenizer *toks[MAX_VOCABS];
    int n;
};

gw_vocab *gw_vocab_new(void) { return calloc(1, sizeof(gw_vocab)); }

void gw_vocab_destroy(gw_vocab **pv) {
    if (!pv || !*pv) return;
    gw_vocab *v = *pv;
    for (int i = 0; i < v->n; i++) {
        free(v->names[i]);
        tokenizer_destroy(&v->toks[i]);
    }
    free(v);
    *pv = NULL;
}

int gw_vocab_add(gw_vocab *v, const char *name, const char *path, char *err, size_t errlen) {
    if (v->n == MAX_VOCABS) {
        snprintf(err, errlen, "at most %d models", MAX_VOCABS);
        return -1;
    }
    char gerr[256];
    gguf *g = gguf_open(path, gerr, sizeof gerr);
    if (!g) {
        snprintf(err, errlen, "%s: %s", path, gerr);
        return -1;
    }
    zl_tokenizer *t = tokenizer_new(g, gerr, sizeof gerr);
    gguf_close(&g);
    if (!t) {
        snprintf(err, errlen, "%s: %s", path, gerr);
        return -1;
    }
    v->names[v->n] = strdup(name);
    if (!v->names[v->n]) {
        tokenizer_destroy(&t);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    v->toks[v->n++] = t;
    return 0;
}

void *gw_vocab_get(const gw_vocab *v, const char *name) {
    if (!v || v->n == 0) return NULL;
    if (!name || !name[0]) return v->toks[0];
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->names[i], name)) return v->toks[i];
    return NULL;
}
