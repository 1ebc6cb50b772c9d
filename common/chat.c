/* common/chat.c: chat templates. The model's tokenizer.chat_template is rendered by the Jinja interpreter
 * (common/jinja*.c) as transformers renders it, with messages (role, content; tool_call_id on tool results and
 * tool_calls on assistant turns where the caller gave them, zl_chat_msg), bos_token, eos_token,
 * add_generation_prompt, tools = documents = None, raise_exception and strftime_now. When the template uses a
 * construct the interpreter does not implement, the hand-written family below renders it instead (the note says
 * which construct and which family), or on request (CHAT_BUILTIN; chat_set_mode for chat_apply).
 *
 * The hand-written families, recognised by characteristic substrings (as llama.cpp does):
 *   - ChatML (Qwen, SmolLM): "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, "<|im_start|>assistant\n" as the
 *     generation prompt. A template that inserts a default system message when the first message is not a system
 *     one (SmolLM2, Qwen2) carries it as a string literal "<|im_start|>system\n...<|im_end|>\n": we take it from
 *     the template text itself.
 *   - Llama 3: [bos] "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(CONTENT) + "<|eot_id|>", generation
 *     prompt "<|start_header_id|>assistant<|end_header_id|>\n\n". (The Llama 3.1+ templates with the "Cutting
 *     Knowledge Date" system block are refused.)
 *   - Llama 2 (<<SYS>> in the first user turn, BOS before each [INST], stripped contents) and Mistral v0.1-style
 *     ("[INST] U [/INST]A</s>", BOS once, no system role). These templates have no generation prompt.
 *   - Gemma: BOS, then "<start_of_turn>ROLE\n" + trim(CONTENT) + "<end_of_turn>\n" with ROLE "model" for the
 *     assistant, a system message's text + "\n\n" at the start of the first turn, roles alternating from the user,
 *     generation prompt "<start_of_turn>model\n". It also stands in for a file with no template whose vocabulary
 *     has Gemma's <start_of_turn> and <end_of_turn> control tokens (Gemma 3 base models; chat_apply says so).
 * Anything else is refused with "... send a raw prompt": a wrong prompt is worse than none. */
#include "chat.h"
#include "grammar_int.h" /* zj_parse: the common layer's JSON reader (grammar_json.c) */
#include "jinja.h"
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {                 /* growing output string */
    char *p;                     /* NUL-terminated bytes */
    size_t n, cap;               /* length, capacity */
    int oom;                     /* set on allocation failure */
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = 1; return; }
        b->p = q; b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void s_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* length of the Python str.isspace() character at s (0 when not whitespace); s is NUL-terminated */
static int s_space_len(const unsigned char *s) {
    unsigned c = s[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    if (c == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (c == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3;                          /* U+1680 */
    if (c == 0xE2 && s[1] == 0x80 && ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3;                                                                      /* U+2000-200A, 2028, 2029, 202F */
    if (c == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3;                           /* U+205F */
    if (c == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3;                           /* U+3000 */
    return 0;
}

/* appends s with leading and trailing whitespace removed, as Jinja's trim / Python's str.strip() do */
static void sb_put_stripped(sbuf *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    int k;
    while ((k = s_space_len(p)) > 0) p += k;
    const unsigned char *end = p, *q = p;
    while (*q) {
        k = s_space_len(q);
        if (k) q += k;
        else {
            /* one UTF-8 character that is not whitespace */
            q++;
            while ((*q & 0xC0) == 0x80) q++;
            end = q;
        }
    }
    sb_putn(b, (const char *)p, (size_t)(end - p));
}

/* The default system block of a ChatML template: a string literal (inside {{ }} or {% %}) that, unescaped, starts
 * with "<|im_start|>system\n" and ends with "<|im_end|>\n". Returns a malloc'd copy or NULL when there is none. */
static char *s_chatml_default_system(const char *tmpl) {
    const char *p = tmpl;
    while ((p = strchr(p, '{')) != NULL) {
        if (p[1] != '{' && p[1] != '%') { p++; continue; }
        const char *close = p[1] == '{' ? "}}" : "%}";
        p += 2;
        while (*p && strncmp(p, close, 2) != 0) {
            if (*p != '\'' && *p != '"') { p++; continue; }
            char q = *p++;
            sbuf lit = {0};
            while (*p && *p != q) {
                if (*p == '\\' && p[1]) {
                    p++;
                    char c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
                    sb_putn(&lit, &c, 1);
                    p++;
                } else sb_putn(&lit, p++, 1);
            }
            if (*p) p++;
            if (lit.p && !lit.oom && strncmp(lit.p, "<|im_start|>system\n", 19) == 0 && lit.n >= 19 + 11 &&
                strcmp(lit.p + lit.n - 11, "<|im_end|>\n") == 0)
                return lit.p;
            free(lit.p);
        }
    }
    return NULL;
}

static int s_role_ok(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") || !strcmp(r, "tool"));
}

static char *s_builtin(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n, int add_gen,
                       const char **family, char *err, size_t errlen) {
    sbuf b = {0};
    char *defsys = NULL;
    for (int i = 0; i < n; i++) /* tool turns only through the model's own template */
        if (!strcmp(msgs[i].role, "tool") || msgs[i].tool_calls) {
            s_err(err, errlen, "chat: message %d: the built-in templates do not render tool turns", i);
            return NULL;
        }
    if (strstr(tmpl, "<|im_start|>")) {
        *family = "ChatML";
        if (strstr(tmpl, "messages[0]['role'] != 'system'") || strstr(tmpl, "messages[0].role != 'system'") ||
            strstr(tmpl, "messages[0]['role'] == 'system'") || strstr(tmpl, "messages[0].role == 'system'"))
            defsys = s_chatml_default_system(tmpl);
        if (defsys && n > 0 && strcmp(msgs[0].role, "system") != 0) sb_puts(&b, defsys);
        for (int i = 0; i < n; i++) {
            sb_puts(&b, "<|im_start|>"); sb_puts(&b, msgs[i].role); sb_puts(&b, "\n");
            sb_puts(&b, msgs[i].content); sb_puts(&b, "<|im_end|>\n");
        }
        if (add_gen) sb_puts(&b, "<|im_start|>assistant\n");
    } else if (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "<|end_header_id|>")) {
        *family = "Llama 3";
        if (strstr(tmpl, "Cutting Knowledge Date") || strstr(tmpl, "tools")) {
            s_err(err, errlen, "chat template: Llama 3.1+ (tools / knowledge-date system block) is not supported: send a raw prompt");
            goto fail;
        }
        int trim = strstr(tmpl, "| trim") != NULL || strstr(tmpl, "|trim") != NULL;
        int use_bos = strstr(tmpl, "bos_token") != NULL;
        for (int i = 0; i < n; i++) {
            if (i == 0 && use_bos) sb_puts(&b, bos);
            sb_puts(&b, "<|start_header_id|>"); sb_puts(&b, msgs[i].role); sb_puts(&b, "<|end_header_id|>\n\n");
            if (trim) sb_put_stripped(&b, msgs[i].content);
            else sb_puts(&b, msgs[i].content);
            sb_puts(&b, "<|eot_id|>");
        }
        if (add_gen) sb_puts(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (strstr(tmpl, "[INST]")) {
        int llama2 = strstr(tmpl, "<<SYS>>") && strstr(tmpl, "bos_token + '[INST] '") && strstr(tmpl, ".strip()");
        int mistral = !strstr(tmpl, "<<SYS>>") && strstr(tmpl, "'[INST] ' + message['content'] + ' [/INST]'") &&
                      strstr(tmpl, "message['content'] + eos_token");
        if (!llama2 && !mistral) {
            s_err(err, errlen, "chat template: unrecognised [INST] variant: send a raw prompt");
            goto fail;
        }
        *family = llama2 ? "Llama 2" : "Mistral";
        int first = 0;
        const char *sys = NULL;
        if (llama2 && n > 0 && !strcmp(msgs[0].role, "system")) { sys = msgs[0].content; first = 1; }
        if (mistral) sb_puts(&b, bos);
        int eos_space = strstr(tmpl, "eos_token + ' '") != NULL;
        for (int i = first; i < n; i++) {
            int k = i - first;
            int is_user = !strcmp(msgs[i].role, "user");
            if (is_user != (k % 2 == 0)) {
                s_err(err, errlen, "chat: conversation roles must alternate user/assistant/user/assistant/...");
                goto fail;
            }
            if (llama2) {
                sbuf c = {0};
                if (k == 0 && sys) { sb_puts(&c, "<<SYS>>\n"); sb_puts(&c, sys); sb_puts(&c, "\n<</SYS>>\n\n"); }
                sb_puts(&c, msgs[i].content);
                if (c.oom) { free(c.p); b.oom = 1; break; }
                if (is_user) { sb_puts(&b, bos); sb_puts(&b, "[INST] "); sb_put_stripped(&b, c.p ? c.p : ""); sb_puts(&b, " [/INST]"); }
                else { sb_puts(&b, " "); sb_put_stripped(&b, c.p ? c.p : ""); sb_puts(&b, " "); sb_puts(&b, eos); }
                free(c.p);
            } else {
                if (is_user) { sb_puts(&b, "[INST] "); sb_puts(&b, msgs[i].content); sb_puts(&b, " [/INST]"); }
                else if (!strcmp(msgs[i].role, "assistant")) {
                    sb_puts(&b, msgs[i].content); sb_puts(&b, eos);
                    if (eos_space) sb_puts(&b, " ");
                } else {
                    s_err(err, errlen, "chat: only user and assistant roles are supported by this template");
                    goto fail;
                }
            }
        }
    } else if (strstr(tmpl, "<start_of_turn>") && strstr(tmpl, "<end_of_turn>")) {
        *family = "Gemma";
        if (n == 0) { /* Gemma's template reads messages[0] */
            s_err(err, errlen, "chat: no messages");
            goto fail;
        }
        sb_puts(&b, bos);
        int first = n > 0 && !strcmp(msgs[0].role, "system");
        for (int i = first; i < n; i++) {
            int k = i - first, is_user = !strcmp(msgs[i].role, "user");
            if (is_user != (k % 2 == 0)) {
                s_err(err, errlen, "chat: conversation roles must alternate user/assistant/user/assistant/...");
                goto fail;
            }
            sb_puts(&b, "<start_of_turn>");
            sb_puts(&b, strcmp(msgs[i].role, "assistant") ? msgs[i].role : "model");
            sb_puts(&b, "\n");
            if (k == 0 && first) {
                sb_puts(&b, msgs[0].content);
                sb_puts(&b, "\n\n");
            }
            sb_put_stripped(&b, msgs[i].content);
            sb_puts(&b, "<end_of_turn>\n");
        }
        if (add_gen) sb_puts(&b, "<start_of_turn>model\n");
    } else {
        s_err(err, errlen,
              "chat template not recognised (ChatML, Llama 3, Llama 2 / Mistral [INST], Gemma): send a raw prompt");
        goto fail;
    }
    if (b.oom) { s_err(err, errlen, "chat: out of memory"); goto fail; }
    free(defsys);
    if (!b.p) { b.p = malloc(1); if (b.p) b.p[0] = 0; else s_err(err, errlen, "chat: out of memory"); }
    return b.p;
fail:
    free(defsys);
    free(b.p);
    return NULL;
}

/* a JSON value as the Jinja value json.loads gives transformers: objects as dicts (members in order), arrays as
 * lists, integers as ints, other numbers as floats. args: inside a tool call's "function", whose "arguments" string
 * is replaced by the value it holds (kept as a string when it is not JSON). 0, or -1 out of memory */
static int s_jv_of_json(jinja_env *e, const zj_value *v, int args, jv *out) {
    switch (v->type) {
    case ZJ_NULL: *out = jv_none(); return 0;
    case ZJ_FALSE: *out = jv_bool(0); return 0;
    case ZJ_TRUE: *out = jv_bool(1); return 0;
    case ZJ_STRING: *out = jv_string(e, v->str, v->slen); return out->t == JV_STR ? 0 : -1;
    case ZJ_NUMBER: {
        const char *t = v->str;
        if (!strpbrk(t, ".eE") && strlen(t) < 19) *out = jv_int(strtoll(t, NULL, 10));
        else *out = jv_float(v->num);
        return 0;
    }
    case ZJ_ARRAY: {
        *out = jv_list_new(e);
        if (out->t != JV_LIST) return -1;
        for (int i = 0; i < v->n; i++) {
            jv x;
            if (s_jv_of_json(e, v->items[i], args, &x) || jv_list_push(e, *out, x)) return -1;
        }
        return 0;
    }
    case ZJ_OBJECT: {
        *out = jv_dict_new(e);
        if (out->t != JV_DICT) return -1;
        for (int i = 0; i < v->n; i++) {
            const zj_value *x = v->items[i];
            jv k = jv_string(e, v->keys[i], strlen(v->keys[i])), xv;
            zj_value *parsed = NULL;
            if (args == 2 && !strcmp(v->keys[i], "arguments") && x->type == ZJ_STRING) {
                char ignore[64];
                parsed = zj_parse(x->str, x->slen, ignore, sizeof ignore);
                if (parsed) x = parsed;
            }
            const int rc = s_jv_of_json(e, x, args == 1 && !strcmp(v->keys[i], "function") ? 2 : 0, &xv);
            zj_free(parsed);
            if (rc || jv_dict_set(e, *out, k, xv)) return -1;
        }
        return 0;
    }
    }
    return -1;
}

/* a message's tool_calls text as the list the template sees (each item's function arguments parsed); a text that
 * is not a JSON array stays a string (the gateway sends arrays only). 0, or -1 out of memory */
static int s_tool_calls(jinja_env *e, const char *text, jv *out) {
    char ignore[64];
    zj_value *v = zj_parse(text, strlen(text), ignore, sizeof ignore);
    if (!v || v->type != ZJ_ARRAY) {
        zj_free(v);
        *out = jv_string(e, text, strlen(text));
        return out->t == JV_STR ? 0 : -1;
    }
    *out = jv_list_new(e);
    int rc = out->t == JV_LIST ? 0 : -1;
    for (int i = 0; !rc && i < v->n; i++) {
        jv x;
        rc = s_jv_of_json(e, v->items[i], 1, &x) || jv_list_push(e, *out, x);
    }
    zj_free(v);
    return rc;
}

/* the context transformers passes: messages, bos_token, eos_token, add_generation_prompt, tools, documents */
static int s_context(jinja_env *e, const char *bos, const char *eos, const zl_chat_msg *msgs, int n, int add_gen) {
    jv list = jv_list_new(e);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        jv m = jv_dict_new(e);
        rc |= jv_dict_set(e, m, jv_string(e, "role", 4), jv_string(e, msgs[i].role, strlen(msgs[i].role)));
        rc |= jv_dict_set(e, m, jv_string(e, "content", 7), jv_string(e, msgs[i].content, strlen(msgs[i].content)));
        if (msgs[i].tool_calls) {
            jv tc;
            rc |= s_tool_calls(e, msgs[i].tool_calls, &tc);
            if (!rc) rc |= jv_dict_set(e, m, jv_string(e, "tool_calls", 10), tc);
        }
        if (msgs[i].tool_call_id)
            rc |= jv_dict_set(e, m, jv_string(e, "tool_call_id", 12),
                              jv_string(e, msgs[i].tool_call_id, strlen(msgs[i].tool_call_id)));
        rc |= jv_list_push(e, list, m);
    }
    rc |= jinja_env_set(e, "messages", list);
    rc |= jinja_env_set(e, "bos_token", jv_string(e, bos, strlen(bos)));
    rc |= jinja_env_set(e, "eos_token", jv_string(e, eos, strlen(eos)));
    rc |= jinja_env_set(e, "add_generation_prompt", jv_bool(add_gen));
    rc |= jinja_env_set(e, "tools", jv_none());
    rc |= jinja_env_set(e, "documents", jv_none());
    return rc ? -1 : 0;
}

static int s_jinja(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n, int add_gen,
                   char **out, char *err, size_t errlen) {
    jinja_limits lim = jinja_limits_default();
    size_t in = 0;
    for (int i = 0; i < n; i++) {
        in += strlen(msgs[i].content) + strlen(msgs[i].role);
        if (msgs[i].tool_calls) in += strlen(msgs[i].tool_calls);
    }
    /* room for templates that repeat the conversation a few times */
    if (lim.max_output < 8 * in) lim.max_output = 8 * in;
    if (lim.max_memory < 64 * in) lim.max_memory = 64 * in;
    int code = 0;
    char msg[CHAT_ERR_MAX] = "";
    jinja_tmpl *t = jinja_parse(tmpl, strlen(tmpl), &lim, &code, msg, sizeof msg);
    jinja_env *e = NULL;
    if (!t) goto fail;
    e = jinja_env_new(&lim);
    if (!e || s_context(e, bos, eos, msgs, n, add_gen)) {
        code = JINJA_NOMEM;
        snprintf(msg, sizeof msg, "out of memory");
        goto fail;
    }
    size_t len;
    code = jinja_render(e, t, out, &len, msg, sizeof msg);
    if (code == JINJA_OK && strlen(*out) != len) {
        free(*out);
        *out = NULL;
        code = JINJA_RUNTIME;
        snprintf(msg, sizeof msg, "the rendered prompt contains a NUL byte");
    }
    if (code) goto fail;
    jinja_env_destroy(&e);
    jinja_tmpl_destroy(&t);
    return 0;
fail:
    jinja_env_destroy(&e);
    jinja_tmpl_destroy(&t);
    if (code == JINJA_RAISED) s_err(err, errlen, "chat template raised an exception: %s", msg);
    else if (code == JINJA_UNSUPPORTED)
        s_err(err, errlen, "chat template uses something the Jinja interpreter does not support (%s)", msg);
    else if (code == JINJA_LIMIT) s_err(err, errlen, "chat template exceeds a limit (%s)", msg);
    else s_err(err, errlen, "chat template error (%s)", msg);
    return code ? code : JINJA_RUNTIME;
}

char *chat_render(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n, int add_gen,
                  int mode, int *code, char *note, size_t notelen, char *err, size_t errlen) {
    int dummy;
    if (!code) code = &dummy;
    *code = CHAT_FAILED;
    if (note && notelen) note[0] = 0;
    if (err && errlen) err[0] = 0;
    if (!bos) bos = "";
    if (!eos) eos = "";
    if (!tmpl || !*tmpl) {
        s_err(err, errlen, "the model has no chat template: send a raw prompt");
        return NULL;
    }
    if (n < 0 || (n > 0 && !msgs)) {
        s_err(err, errlen, "chat: bad message list");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!s_role_ok(msgs[i].role) || !msgs[i].content) {
            s_err(err, errlen, "chat: message %d: role must be system, user, assistant or tool, with content", i);
            return NULL;
        }
    const char *family = "none";
    if (mode == CHAT_BUILTIN) {
        char *p = s_builtin(tmpl, bos, eos, msgs, n, add_gen, &family, err, errlen);
        if (p) {
            *code = CHAT_OK_BUILTIN;
            s_err(note, notelen, "rendered by the built-in %s template (on request)", family);
        }
        return p;
    }
    char *out = NULL;
    char jerrmsg[CHAT_ERR_MAX] = "";
    int jc = s_jinja(tmpl, bos, eos, msgs, n, add_gen, &out, jerrmsg, sizeof jerrmsg);
    if (!jc) {
        *code = CHAT_OK_JINJA;
        return out;
    }
    if (jc == JINJA_RAISED) *code = CHAT_RAISED;
    if (jc != JINJA_UNSUPPORTED || mode == CHAT_JINJA) {
        s_err(err, errlen, "%s", jerrmsg);
        return NULL;
    }
    char berr[CHAT_ERR_MAX] = "";
    out = s_builtin(tmpl, bos, eos, msgs, n, add_gen, &family, berr, sizeof berr);
    if (!out) {
        s_err(err, errlen, "%s; the built-in templates: %s", jerrmsg, berr);
        return NULL;
    }
    *code = CHAT_OK_BUILTIN;
    s_err(note, notelen, "%s: rendered by the built-in %s template instead", jerrmsg, family);
    return out;
}

static int s_mode = CHAT_AUTO; /* chat_set_mode */

void chat_set_mode(int mode) { s_mode = mode == CHAT_JINJA || mode == CHAT_BUILTIN ? mode : CHAT_AUTO; }

int chat_mode_parse(const char *s) {
    return !s                      ? -1
           : !strcmp(s, "auto")    ? CHAT_AUTO
           : !strcmp(s, "jinja")   ? CHAT_JINJA
           : !strcmp(s, "builtin") ? CHAT_BUILTIN
                                   : -1;
}

char *chat_apply_template(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n,
                          int add_gen, char *err, size_t errlen) {
    char note[CHAT_ERR_MAX];
    char *p = chat_render(tmpl, bos, eos, msgs, n, add_gen, s_mode, NULL, note, sizeof note, err, errlen);
    if (p) s_err(err, errlen, "%s", note);
    return p;
}

/* 1 when text is one special token of t's vocabulary */
static int s_has_control(const zl_tokenizer *t, const char *text) {
    int32_t id[2];
    size_t n = strlen(text), len;
    if (tokenizer_encode(t, text, n, 0, 1, id, 2) != 1) return 0;
    const char *s = tokenizer_token_text(t, id[0], &len);
    return s && len == n && !memcmp(s, text, n);
}

char *chat_apply(const zl_tokenizer *t, const zl_chat_msg *msgs, int n, int add_gen, char *err, size_t errlen) {
    if (!t) { s_err(err, errlen, "chat: no tokenizer"); return NULL; }
    char bos[256] = "", eos[256] = "";
    size_t len;
    const char *s;
    if (tokenizer_bos(t) >= 0 && (s = tokenizer_token_text(t, tokenizer_bos(t), &len)) && len < sizeof bos) {
        memcpy(bos, s, len); bos[len] = 0;
    }
    if (tokenizer_eos(t) >= 0 && (s = tokenizer_token_text(t, tokenizer_eos(t), &len)) && len < sizeof eos) {
        memcpy(eos, s, len); eos[len] = 0;
    }
    const char *tmpl = tokenizer_chat_template(t);
    if ((!tmpl || !*tmpl) && s_mode != CHAT_JINJA && s_has_control(t, "<start_of_turn>") &&
        s_has_control(t, "<end_of_turn>")) {
        char note[CHAT_ERR_MAX];
        char *p = chat_render("<start_of_turn><end_of_turn>", bos, eos, msgs, n, add_gen, CHAT_BUILTIN, NULL, note,
                              sizeof note, err, errlen);
        if (p)
            s_err(err, errlen,
                  "the model has no chat template: rendered by the built-in Gemma template (its "
                  "vocabulary has <start_of_turn> and <end_of_turn>)");
        return p;
    }
    return chat_apply_template(tmpl, bos, eos, msgs, n, add_gen, err, errlen);
}
