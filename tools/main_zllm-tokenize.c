/* tools/main_zllm-tokenize.c: the model's tokenizer from the command line.
 *
 *   zllm-tokenize -m MODEL.gguf [--no-bos] [--special]      stdin (all of it, one text) -> ids separated by spaces
 *   zllm-tokenize -m MODEL.gguf --decode [--special]         stdin ids (whitespace separated) -> text
 *   zllm-tokenize -m MODEL.gguf --chat [--template FILE] [--no-gen]
 *        stdin: NUL-separated role, content, role, content, ... -> the rendered chat prompt (raw bytes)
 *
 * --no-bos: do not prepend BOS even if the vocabulary asks for it; --special: parse special-token text such as
 * <|im_start|> into single tokens when encoding, print control tokens when decoding. Exit status 1 on any error. */
#include "chat.h"
#include "gguf.h"
#include "slurp.h"
#include "tokenizer.h"
#include "version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_usage(FILE *f) {
    fprintf(f,
            "usage: zllm-tokenize -m MODEL.gguf [--no-bos] [--special] [--decode] "
            "[--chat [--template FILE] [--no-gen]] < input\n"
            "       zllm-tokenize --help | --version\n"
            "  -m MODEL.gguf     the model whose tokenizer is used (required)\n"
            "  (default)         stdin text -> ids separated by spaces\n"
            "  --decode          stdin ids -> text\n"
            "  --chat            stdin NUL-separated role, content, ... -> the rendered chat prompt\n"
            "  --template FILE   with --chat: this Jinja template (default: the model's)\n"
            "  --no-gen          with --chat: no generation prompt (default: appended)\n"
            "  --no-bos          no BOS even if the vocabulary asks for it (default: the vocabulary's flag)\n"
            "  --special         special-token text becomes single tokens / control tokens are printed\n"
            "                    (default off)\n"
            "  --chat-render M   with --chat: auto (default: the Jinja interpreter, the hand-written template where\n"
            "                    it lacks a construct), jinja (the interpreter only) or builtin (hand-written only)\n"
            "Environment: none read.\n"
            "Exit status 1 on any error, 2 on a usage error.\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *tmpl_path = NULL;
    int no_bos = 0, special = 0, decode = 0, chat = 0, gen = 1, rc = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("zllm-tokenize %s\n", ZLLM_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--no-bos")) no_bos = 1;
        else if (!strcmp(argv[i], "--special")) special = 1;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--chat")) chat = 1;
        else if (!strcmp(argv[i], "--no-gen")) gen = 0;
        else if (!strcmp(argv[i], "--template") && i + 1 < argc) tmpl_path = argv[++i];
        else if (!strcmp(argv[i], "--chat-render") && i + 1 < argc && chat_mode_parse(argv[i + 1]) >= 0)
            chat_set_mode(chat_mode_parse(argv[++i]));
        else {
            s_usage(stderr);
            return 2;
        }
    }
    if (!model) {
        s_usage(stderr);
        return 2;
    }
    char err[512] = "";
    gguf *g = gguf_open(model, err, sizeof err);
    zl_tokenizer *t = NULL;
    char *in = NULL, *tmpl = NULL, *txt = NULL;
    int32_t *ids = NULL;
    zl_chat_msg *msgs = NULL;
    if (!g) { fprintf(stderr, "zllm-tokenize: %s\n", err); goto fail; }
    t = tokenizer_new(g, err, sizeof err);
    gguf_close(&g);
    if (!t) { fprintf(stderr, "zllm-tokenize: %s\n", err); goto fail; }
    size_t n = 0;
    in = slurp_stream(stdin, &n);
    if (!in) { fprintf(stderr, "zllm-tokenize: out of memory\n"); goto fail; }

    if (chat) {
        int nm = 0, cap = 16;
        msgs = malloc((size_t)cap * sizeof *msgs);
        if (!msgs) goto fail;
        size_t p = 0;
        while (p < n) {   /* role \0 content \0 ... (the last content may lack its \0) */
            const char *role = in + p;
            p += strlen(role) + 1;
            if (p > n) { fprintf(stderr, "zllm-tokenize: --chat input: role without content\n"); goto fail; }
            const char *content = in + p;
            p += strlen(content) + 1;
            if (nm == cap) {
                zl_chat_msg *nmsgs = realloc(msgs, (size_t)(cap *= 2) * sizeof *msgs);
                if (!nmsgs) goto fail;
                msgs = nmsgs;
            }
            msgs[nm++] = (zl_chat_msg){.role = role, .content = content};
        }
        if (tmpl_path) {
            FILE *f = fopen(tmpl_path, "rb");
            if (!f) { fprintf(stderr, "zllm-tokenize: cannot open %s\n", tmpl_path); goto fail; }
            size_t tn;
            tmpl = slurp_stream(f, &tn);
            fclose(f);
            if (!tmpl) goto fail;
            size_t bl = 0, el = 0;
            const char *b = tokenizer_bos(t) >= 0 ? tokenizer_token_text(t, tokenizer_bos(t), &bl) : NULL;
            const char *e = tokenizer_eos(t) >= 0 ? tokenizer_token_text(t, tokenizer_eos(t), &el) : NULL;
            char bos[256] = "", eos[256] = "";
            if (b && bl < sizeof bos) memcpy(bos, b, bl), bos[bl] = 0;
            if (e && el < sizeof eos) memcpy(eos, e, el), eos[el] = 0;
            txt = chat_apply_template(tmpl, bos, eos, msgs, nm, gen, err, sizeof err);
        } else {
            txt = chat_apply(t, msgs, nm, gen, err, sizeof err);
        }
        if (!txt) { fprintf(stderr, "zllm-tokenize: %s\n", err); goto fail; }
        if (err[0]) fprintf(stderr, "zllm-tokenize: %s\n", err); /* why the built-in template rendered it */
        fwrite(txt, 1, strlen(txt), stdout);
    } else if (decode) {
        size_t cap = 1024, k = 0;
        ids = malloc(cap * sizeof *ids);
        if (!ids) goto fail;
        char *p = in, *end;
        for (;;) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
            if (!*p) break;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= tokenizer_n_vocab(t)) { fprintf(stderr, "zllm-tokenize: bad token id near '%.20s'\n", p); goto fail; }
            if (k == cap) {
                int32_t *ni = realloc(ids, (cap *= 2) * sizeof *ids);
                if (!ni) goto fail;
                ids = ni;
            }
            ids[k++] = (int32_t)v;
            p = end;
        }
        size_t tl = 0;
        txt = tokenizer_decode_len(t, ids, (int)k, special, &tl);
        if (!txt) { fprintf(stderr, "zllm-tokenize: decode failed\n"); goto fail; }
        fwrite(txt, 1, tl, stdout);
    } else {
        int add_bos = no_bos ? 0 : tokenizer_add_bos(t);
        int cnt = tokenizer_encode(t, in, n, add_bos, special, NULL, 0);
        if (cnt < 0) { fprintf(stderr, "zllm-tokenize: encode failed\n"); goto fail; }
        ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
        if (!ids) goto fail;
        if (tokenizer_encode(t, in, n, add_bos, special, ids, cnt) != cnt) goto fail;
        for (int i = 0; i < cnt; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    rc = 0;
fail:
    free(in); free(tmpl); free(txt); free(ids); free(msgs);
    tokenizer_destroy(&t);
    gguf_close(&g);
    return rc;
}
