/* common/grammar_tok.c: a tokenizer's vocabulary as the grammar matcher sees it: each token's bytes as they
 * extend the text (byte-fallback pieces as their byte, SentencePiece's word-start marker as a space, control
 * tokens empty), the end-of-generation ids marked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar.h"
#include "tokenizer.h"

zg_vocab *grammar_vocab_from_tokenizer(const zl_tokenizer *t, char *err, size_t errlen) {
    int n = tokenizer_n_vocab(t);
    zg_vocab *v = NULL;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *eog = calloc((size_t)n, 1);
    if (!bytes || !lens || !eog) {
        snprintf(err, errlen, "grammar: out of memory");
        goto done;
    }
    const int spm = tokenizer_is_spm(t);
    for (int32_t i = 0; i < n; i++) {
        eog[i] = tokenizer_is_eog(t, i) ? 1 : 0;
        size_t len = 0;
        char *s = tokenizer_decode_len(t, &i, 1, 0, &len);
        if (!s) continue;
        size_t tl = 0;
        const char *raw = tokenizer_token_text(t, i, &tl);
        /* a lone SentencePiece piece loses the space its marker stands for (the decoder drops it at the start
         * of a text); inside generated text the space is there */
        if (spm && raw && tl >= 3 && memcmp(raw, "\xE2\x96\x81", 3) == 0 && (len == 0 || s[0] != ' ')) {
            char *w = malloc(len + 2);
            if (!w) {
                free(s);
                continue;
            }
            w[0] = ' ';
            memcpy(w + 1, s, len);
            free(s);
            s = w;
            len++;
        }
        bytes[i] = s;
        lens[i] = len;
    }
    v = grammar_vocab_new(n, (const char *const *)bytes, lens, eog, err, errlen);
done:
    if (bytes)
        for (int i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(eog);
    return v;
}
