/* tools/main_zllm-template.c: renders chat templates without a model file, for tests and template work.
 *
 *   zllm-template [--jinja | --builtin] [--tools] TEMPLATE_FILE < cases
 *
 * stdin holds any number of cases, each a run of NUL-terminated fields:
 *   add_generation_prompt ("0"/"1"), bos_token, eos_token, message count N, then N times role, content
 *   (with --tools: role, content, tool_call_id, tool_calls, an empty field meaning absent; zl_chat_msg).
 * For each case stdout gets one header line "STATUS LENGTH" and then LENGTH bytes and a newline: STATUS is
 * jinja (rendered by the interpreter), builtin (by a hand-written family; the bytes are the prompt, the reason
 * goes to stderr), raised (the template's raise_exception; the bytes are the message) or error (the message).
 * --jinja: the interpreter only; --builtin: the hand-written families only. Exit status 1 when the input is
 * malformed, 2 on a usage error. */
#include "chat.h"
#include "slurp.h"
#include "version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-template [--jinja | --builtin] [--tools] TEMPLATE_FILE < cases\n"
               "       zllm-template --help | --version\n"
               "  cases      NUL-terminated fields: add_gen (0/1), bos, eos, N, then N x (role, content)\n"
               "  --jinja    the Jinja interpreter only (default: with the built-in fallback)\n"
               "  --builtin  the hand-written templates only\n"
               "  --tools    N x (role, content, tool_call_id, tool_calls): an empty field is absent; tool_calls\n"
               "             is OpenAI's JSON array of calls (their arguments strings parsed for the template)\n"
               "Output per case: \"jinja|builtin|raised|error LENGTH\\n\" then LENGTH bytes and \"\\n\".\n"
               "Environment: none read. Exit status 1 on malformed input, 2 on a usage error.\n");
}

/* the next NUL-terminated field at *p, or NULL at the end of the input */
static const char *s_field(const char *in, size_t n, size_t *p) {
    if (*p >= n) return NULL;
    const char *f = in + *p;
    size_t k = strnlen(f, n - *p);
    if (*p + k >= n) return NULL;
    *p += k + 1;
    return f;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int mode = CHAT_AUTO, rc = 1, tools = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("zllm-template %s\n", ZLLM_VERSION);
            return 0;
        }
        if (!strcmp(argv[i], "--jinja")) mode = CHAT_JINJA;
        else if (!strcmp(argv[i], "--builtin")) mode = CHAT_BUILTIN;
        else if (!strcmp(argv[i], "--tools")) tools = 1;
        else if (argv[i][0] == '-' || path) {
            s_usage(stderr);
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        s_usage(stderr);
        return 2;
    }
    size_t tn, n;
    char *tmpl = NULL, *in = NULL;
    zl_chat_msg *msgs = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "zllm-template: cannot open %s\n", path);
        return 1;
    }
    tmpl = slurp_stream(f, &tn);
    fclose(f);
    if (!tmpl || strlen(tmpl) != tn) {
        fprintf(stderr, "zllm-template: %s: unreadable or holds a NUL byte\n", path);
        goto fail;
    }
    in = slurp_stream(stdin, &n);
    if (!in) {
        fprintf(stderr, "zllm-template: out of memory\n");
        goto fail;
    }
    size_t p = 0;
    while (p < n) {
        const char *gen = s_field(in, n, &p), *bos = s_field(in, n, &p), *eos = s_field(in, n, &p);
        const char *cnt = s_field(in, n, &p);
        char *end = NULL;
        long nm = cnt && cnt[0] >= '0' && cnt[0] <= '9' ? strtol(cnt, &end, 10) : -1;
        if (!gen || !bos || !eos || nm < 0 || nm > 100000 || *end) {
            fprintf(stderr, "zllm-template: malformed case header\n");
            goto fail;
        }
        free(msgs);
        msgs = calloc((size_t)(nm ? nm : 1), sizeof *msgs);
        if (!msgs) goto fail;
        for (long i = 0; i < nm; i++) {
            msgs[i].role = s_field(in, n, &p);
            msgs[i].content = s_field(in, n, &p);
            if (tools) {
                const char *id = s_field(in, n, &p), *calls = s_field(in, n, &p);
                if (!id || !calls) {
                    fprintf(stderr, "zllm-template: case truncated\n");
                    goto fail;
                }
                msgs[i].tool_call_id = id[0] ? id : NULL;
                msgs[i].tool_calls = calls[0] ? calls : NULL;
            }
            if (!msgs[i].role || !msgs[i].content) {
                fprintf(stderr, "zllm-template: case truncated\n");
                goto fail;
            }
        }
        char note[CHAT_ERR_MAX], err[CHAT_ERR_MAX];
        int code;
        char *out =
            chat_render(tmpl, bos, eos, msgs, (int)nm, gen[0] == '1', mode, &code, note, sizeof note, err, sizeof err);
        const char *st = code == CHAT_OK_JINJA     ? "jinja"
                         : code == CHAT_OK_BUILTIN ? "builtin"
                         : code == CHAT_RAISED     ? "raised"
                                                   : "error";
        const char *body = out ? out : err;
        if (out && note[0]) fprintf(stderr, "zllm-template: %s\n", note);
        printf("%s %zu\n", st, strlen(body));
        fwrite(body, 1, strlen(body), stdout);
        printf("\n");
        free(out);
    }
    rc = 0;
fail:
    free(msgs);
    free(in);
    free(tmpl);
    return rc;
}
