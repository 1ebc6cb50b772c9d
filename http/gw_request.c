/* http/gw_request.c: OpenAI request bodies -> proto_generate (see gw_request.h). jansson parses (it rejects
 * invalid UTF-8, nesting beyond JSON_PARSER_MAX_DEPTH and integers beyond 64 bits); this file checks types and
 * ranges, with the protocol's limits (docs/protocol.md), and names the offending field in every error. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "gw_request.h"

#define INVALID "invalid_request_error"

static int s_bad(gw_error *e, const char *param, const char *fmt, const char *detail) {
    return gw_error_set(e, 400, INVALID, param, NULL, fmt, detail);
}

static int s_unsupported(gw_error *e, const char *param, const char *what) {
    return gw_error_set(e, 400, INVALID, param, "unsupported_field", "'%s' %s is not supported by zllm", param, what);
}

static json_t *s_parse(const char *body, size_t len, gw_error *e) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        gw_error_set(e, 400, INVALID, NULL, "invalid_json", "invalid JSON body: %s (at byte %d)", je.text, je.position);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        gw_error_set(e, 400, INVALID, NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* present and not null */
static json_t *s_get(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* a number field into *out within [lo, hi] (lo_open/hi_open: exclusive); 0 absent, 1 set, -1 error */
static int s_num(json_t *o, const char *key, double lo, int lo_open, double hi, int hi_open, double *out, gw_error *e) {
    json_t *v = s_get(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return s_bad(e, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo) || (hi_open && x == hi))
        return gw_error_set(e, 400, INVALID, key, NULL, "'%s' = %g is out of range (%s%g, %g%s)", key, x,
                            lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
    *out = x;
    return 1;
}

static int s_int(json_t *o, const char *key, long long lo, long long hi, long long *out, gw_error *e) {
    json_t *v = s_get(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return s_bad(e, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return gw_error_set(e, 400, INVALID, key, NULL, "'%s' = %lld is out of range [%lld, %lld]", key, x, lo, hi);
    *out = x;
    return 1;
}

static int s_bool(json_t *o, const char *key, int *out, gw_error *e) {
    json_t *v = s_get(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return s_bad(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

/* fields zllm does not support: refused when given a value other than the neutral one */
static int s_refuse_unsupported(json_t *o, gw_endpoint ep, gw_error *e) {
    static const char *never[] = {"tools", "tool_choice", "functions", "function_call",
                                  "audio", "prediction",  "suffix",    "web_search_options"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        json_t *v = s_get(o, never[i]);
        if (!v) continue;
        if (!strcmp(never[i], "suffix") && json_is_string(v) && json_string_length(v) == 0) continue;
        if ((json_is_array(v) && json_array_size(v) == 0) ||
            (json_is_string(v) && !strcmp(never[i], "tool_choice") && !strcmp(json_string_value(v), "none")))
            continue;
        return s_unsupported(e, never[i], "");
    }
    json_t *v;
    (void)ep;
    if ((v = s_get(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return s_unsupported(e, "best_of", "other than 1");
    if ((v = s_get(o, "modalities"))) {
        if (!json_is_array(v)) return s_unsupported(e, "modalities", "");
        size_t i;
        json_t *m;
        json_array_foreach(v, i, m) if (!json_is_string(m) ||
                                        strcmp(json_string_value(m),
                                               "text")) return s_unsupported(e, "modalities", "other than [\"text\"]");
    }
    return 0;
}

/* logprobs (chat: bool with top_logprobs 0..20; completions: the number of alternatives 0..20), n, the
 * presence/frequency penalties and logit_bias ({"id": bias}, at most 300, each in [-100, 100]; ids beyond the
 * vocabulary are the broker's to refuse) */
static int s_extras(gw_request *r, json_t *o, gw_error *e) {
    proto_sampling *s = &r->gen.sampling;
    double x;
    long long k;
    int b, rc;
    if ((rc = s_num(o, "presence_penalty", -2, 0, 2, 0, &x, e)) < 0) return -1;
    if (rc) s->presence_penalty = (float)x;
    if ((rc = s_num(o, "frequency_penalty", -2, 0, 2, 0, &x, e)) < 0) return -1;
    if (rc) s->frequency_penalty = (float)x;
    if ((rc = s_int(o, "n", 1, PROTO_MAX_N, &k, e)) < 0) return -1;
    if (rc) r->gen.n = (uint32_t)k;
    if (r->ep == GW_EP_CHAT) {
        if ((rc = s_bool(o, "logprobs", &b, e)) < 0) return -1;
        if (rc) s->logprobs = b;
        if ((rc = s_int(o, "top_logprobs", 0, PROTO_MAX_TOP_LOGPROBS, &k, e)) < 0) return -1;
        if (rc && !s->logprobs) return s_bad(e, "top_logprobs", "'%s' needs 'logprobs': true", "top_logprobs");
        if (rc) s->top_logprobs = (uint32_t)k;
    } else {
        if ((rc = s_int(o, "logprobs", 0, PROTO_MAX_TOP_LOGPROBS, &k, e)) < 0) return -1;
        if (rc) {
            s->logprobs = 1;
            s->top_logprobs = (uint32_t)k;
        }
    }
    /* the prompt's logprobs: completions' echo (its prompt tokens' logprobs with `logprobs`) and vLLM's
     * prompt_logprobs extension on both endpoints; the broker computes them for the larger of the two k */
    r->echo_top = r->plp_ext = -1;
    json_t *ev = s_get(o, "echo");
    if (r->ep == GW_EP_CHAT && ev && !json_is_false(ev)) return s_unsupported(e, "echo", "on chat completions");
    if (r->ep == GW_EP_COMPLETIONS && (rc = s_bool(o, "echo", &r->echo, e)) < 0) return -1;
    if (r->echo && s->logprobs) r->echo_top = (int)s->top_logprobs;
    if ((rc = s_int(o, "prompt_logprobs", 0, PROTO_MAX_TOP_LOGPROBS, &k, e)) < 0) return -1;
    if (rc) r->plp_ext = (int)k;
    if (r->echo || r->plp_ext >= 0) {
        s->prompt_lp = 1;
        s->prompt_top = (uint32_t)(r->echo_top > r->plp_ext ? (r->echo_top > 0 ? r->echo_top : 0) : r->plp_ext);
    }
    if (r->has_max_tokens && r->gen.max_tokens == 0 && !s->prompt_lp)
        return gw_error_set(e, 400, INVALID, "max_tokens", NULL,
                            "'max_tokens' = 0 generates nothing: it needs 'echo' or 'prompt_logprobs'");
    json_t *lb = s_get(o, "logit_bias");
    if (lb) {
        if (!json_is_object(lb))
            return s_bad(e, "logit_bias", "'%s' must be an object of token id: bias", "logit_bias");
        size_t n = json_object_size(lb);
        if (n > PROTO_MAX_LOGIT_BIAS)
            return gw_error_set(e, 400, INVALID, "logit_bias", NULL, "'logit_bias' holds at most %d entries",
                                PROTO_MAX_LOGIT_BIAS);
        r->bias = malloc((n ? n : 1) * sizeof *r->bias);
        if (!r->bias) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        const char *key;
        json_t *val;
        size_t i = 0;
        json_object_foreach(lb, key, val) {
            char *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (errno || end == key || *end || id < 0 || id > PROTO_TOKEN_ID_MAX)
                return gw_error_set(e, 400, INVALID, "logit_bias", NULL, "'logit_bias' key '%.32s' is not a token id",
                                    key);
            if (!json_is_number(val) || !isfinite(json_number_value(val)) || json_number_value(val) < -100 ||
                json_number_value(val) > 100)
                return gw_error_set(e, 400, INVALID, "logit_bias", NULL,
                                    "'logit_bias' value for '%.32s' must be a number in [-100, 100]", key);
            r->bias[i].id = (int32_t)id;
            r->bias[i].bias = (float)json_number_value(val);
            i++;
        }
        s->bias = r->bias;
        s->n_bias = (uint32_t)i;
    }
    return 0;
}

/* a content value: a string, or an array of {"type": "text", "text": str} parts joined */
static int s_content(gw_request *r, json_t *c, const char *param, proto_str *out, gw_error *e) {
    if (json_is_string(c)) {
        *out = (proto_str){json_string_value(c), (uint32_t)json_string_length(c)};
        return 0;
    }
    if (!json_is_array(c)) return s_bad(e, param, "'%s' must be a string or an array of text parts", param);
    size_t i, total = 0;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        json_t *x = json_is_object(p) ? json_object_get(p, "text") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
            return gw_error_set(e, 400, INVALID, param, "unsupported_field",
                                "'%s' parts other than {\"type\": \"text\"} are not supported by zllm", param);
        if (!json_is_string(x)) return s_bad(e, param, "'%s' text parts need a string 'text'", param);
        total += json_string_length(x);
    }
    if (total > PROTO_CLIENT_MAX_FRAME) return s_bad(e, param, "'%s' is too long", param);
    char **np = realloc(r->pieces, (size_t)(r->n_pieces + 1) * sizeof *np);
    if (!np) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    r->pieces = np;
    char *s = malloc(total + 1);
    if (!s) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    r->pieces[r->n_pieces++] = s;
    size_t off = 0;
    json_array_foreach(c, i, p) {
        json_t *x = json_object_get(p, "text");
        memcpy(s + off, json_string_value(x), json_string_length(x));
        off += json_string_length(x);
    }
    s[off] = 0;
    *out = (proto_str){s, (uint32_t)off};
    return 0;
}

/* an assistant message's tool_calls (OpenAI's [{"id", "type", "function": {"name", "arguments"}}]) as compact JSON
 * text in out (owned by r); an empty array is no calls (out left absent) */
static int s_tool_calls(gw_request *r, json_t *tc, const char *param, proto_str *out, gw_error *e) {
    if (!json_is_array(tc)) return s_bad(e, param, "'%s' must be an array", param);
    if (json_array_size(tc) == 0) return 0;
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *name = json_is_object(f) ? json_object_get(f, "name") : NULL;
        json_t *args = json_is_object(f) ? json_object_get(f, "arguments") : NULL;
        json_t *id = json_is_object(c) ? json_object_get(c, "id") : NULL;
        if (!json_is_string(name) || (args && !json_is_string(args) && !json_is_object(args)) ||
            (id && !json_is_string(id)))
            return s_bad(e, param,
                         "'%s' entries must be {\"id\": str, \"type\": \"function\", \"function\": {\"name\": str, "
                         "\"arguments\": str}}",
                         param);
    }
    char *s = json_dumps(tc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    char **np = realloc(r->pieces, (size_t)(r->n_pieces + 1) * sizeof *np);
    if (!np) {
        free(s);
        return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->pieces = np;
    r->pieces[r->n_pieces++] = s;
    if (strlen(s) > PROTO_CLIENT_MAX_FRAME) return s_bad(e, param, "'%s' is too long", param);
    *out = (proto_str){s, (uint32_t)strlen(s)};
    return 0;
}

static int s_messages(gw_request *r, json_t *o, gw_error *e) {
    json_t *ms = s_get(o, "messages");
    if (!ms) return s_bad(e, "messages", "'%s' is required", "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0 || json_array_size(ms) > PROTO_MAX_MESSAGES)
        return gw_error_set(e, 400, INVALID, "messages", NULL, "'messages' must be an array of 1..%d messages",
                            PROTO_MAX_MESSAGES);
    size_t n = json_array_size(ms), i;
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *m;
    json_array_foreach(ms, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return s_bad(e, param, "'%s' must be an object", param);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return s_bad(e, param, "'%s' needs a string 'role'", param);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return gw_error_set(e, 400, INVALID, param, "unsupported_field",
                                "'%s' role '%.32s' is not supported by zllm (system, user, assistant, tool)", param,
                                rs);
        json_t *tc = s_get(m, "tool_calls");
        if (tc) {
            char tparam[64];
            snprintf(tparam, sizeof tparam, "messages[%zu].tool_calls", i);
            if (strcmp(rs, "assistant")) return s_bad(e, tparam, "'%s' is for assistant messages only", tparam);
            if (s_tool_calls(r, tc, tparam, &r->msgs[i].tool_calls, e) != 0) return -1;
        }
        if (!strcmp(rs, "tool")) { /* a tool's result: the id of the call it answers, as the templates read it */
            json_t *id = s_get(m, "tool_call_id");
            if (!json_is_string(id) || json_string_length(id) < 1 || json_string_length(id) > 256 ||
                memchr(json_string_value(id), 0, json_string_length(id)))
                return s_bad(e, param, "'%s' (role tool) needs a string 'tool_call_id' of 1..256 bytes", param);
            r->msgs[i].tool_call_id = (proto_str){json_string_value(id), (uint32_t)json_string_length(id)};
        }
        json_t *c = s_get(m, "content");
        if (!c) {
            if (strcmp(rs, "assistant")) return s_bad(e, param, "'%s' needs 'content'", param);
            r->msgs[i].content = (proto_str){"", 0};
        } else {
            snprintf(param, sizeof param, "messages[%zu].content", i);
            if (s_content(r, c, param, &r->msgs[i].content, e) != 0) return -1;
        }
        r->msgs[i].role = proto_cstr(rs);
        if (memchr(r->msgs[i].content.p, 0, r->msgs[i].content.n))
            return s_bad(e, param, "'%s' contains a NUL character", param);
    }
    r->gen.prompt_kind = PROTO_PROMPT_MESSAGES;
    r->gen.messages = r->msgs;
    r->gen.n_messages = (uint32_t)n;
    return 0;
}

static int s_token_array(json_t *a, const char *param, int32_t **out, size_t *n, gw_error *e) {
    size_t k = json_array_size(a), i;
    if (k == 0 || k > PROTO_MAX_TOKENS)
        return gw_error_set(e, 400, INVALID, param, NULL, "'%s' must hold 1..%d token ids", param, PROTO_MAX_TOKENS);
    int32_t *t = malloc(k * sizeof *t);
    if (!t) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > PROTO_TOKEN_ID_MAX) {
            free(t);
            return gw_error_set(e, 400, INVALID, param, NULL, "'%s[%zu]' must be a token id (0..%d)", param, i,
                                PROTO_TOKEN_ID_MAX);
        }
        t[i] = (int32_t)json_integer_value(v);
    }
    *out = t;
    *n = k;
    return 0;
}

static int s_prompt(gw_request *r, json_t *o, gw_error *e) {
    json_t *p = s_get(o, "prompt");
    if (!p) return s_bad(e, "prompt", "'%s' is required", "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* a batch of one prompt */
    else if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0)))
        return s_unsupported(e, "prompt", "as a batch of several prompts");
    if (json_is_string(p)) {
        if (json_string_length(p) > PROTO_CLIENT_MAX_FRAME) return s_bad(e, "prompt", "'%s' is too long", "prompt");
        if (memchr(json_string_value(p), 0, json_string_length(p)))
            return s_bad(e, "prompt", "'%s' contains a NUL character", "prompt");
        r->gen.prompt_kind = PROTO_PROMPT_TEXT;
        r->gen.prompt = (proto_str){json_string_value(p), (uint32_t)json_string_length(p)};
        return 0;
    }
    if (!json_is_array(p)) return s_bad(e, "prompt", "'%s' must be a string or an array of token ids", "prompt");
    size_t n;
    if (s_token_array(p, "prompt", &r->tokens, &n, e) != 0) return -1;
    r->gen.prompt_kind = PROTO_PROMPT_TOKENS;
    r->gen.tokens = r->tokens;
    r->gen.n_tokens = (uint32_t)n;
    return 0;
}

static int s_stop(gw_request *r, json_t *o, gw_error *e) {
    json_t *s = s_get(o, "stop");
    if (!s) return 0;
    json_t *one[1] = {s};
    json_t **list = one;
    size_t n = 1;
    if (json_is_array(s)) {
        n = json_array_size(s);
        if (n > PROTO_MAX_STOP)
            return gw_error_set(e, 400, INVALID, "stop", NULL, "'stop' holds at most %d strings", PROTO_MAX_STOP);
        list = NULL;
    } else if (!json_is_string(s)) {
        return s_bad(e, "stop", "'%s' must be a string or an array of strings", "stop");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = list ? list[i] : json_array_get(s, i);
        if (!json_is_string(x)) return s_bad(e, "stop", "'%s' must be a string or an array of strings", "stop");
        size_t len = json_string_length(x);
        if (len == 0) continue;
        if (len > PROTO_STOP_MAX_LEN)
            return gw_error_set(e, 400, INVALID, "stop", NULL, "stop strings are at most %d bytes", PROTO_STOP_MAX_LEN);
        if (memchr(json_string_value(x), 0, len)) return s_bad(e, "stop", "'%s' contains a NUL character", "stop");
        r->gen.stop[r->gen.n_stop++] = (proto_str){json_string_value(x), (uint32_t)len};
    }
    return 0;
}

static int s_sampling(gw_request *r, json_t *o, gw_error *e) {
    proto_sampling *s = &r->gen.sampling;
    double x;
    long long k;
    int b, rc;
    if ((rc = s_num(o, "temperature", 0, 0, 100, 0, &x, e)) < 0) return -1;
    if (rc) s->temperature = (float)x;
    if ((rc = s_num(o, "top_p", 0, 1, 1, 0, &x, e)) < 0) return -1;
    if (rc) s->top_p = (float)x;
    if ((rc = s_num(o, "min_p", 0, 0, 1, 1, &x, e)) < 0) return -1;
    if (rc) s->min_p = (float)x;
    if ((rc = s_num(o, "repetition_penalty", 0, 1, 100, 0, &x, e)) < 0) return -1;
    if (rc) s->repeat_penalty = (float)x;
    if ((rc = s_int(o, "top_k", -1, 0x7fffffff, &k, e)) < 0) return -1;
    if (rc) s->top_k = k < 0 ? 0 : (int32_t)k; /* -1: off, as in vLLM */
    json_t *seed = s_get(o, "seed");
    if (seed) {
        if (!json_is_integer(seed)) return s_bad(e, "seed", "'%s' must be an integer", "seed");
        s->seed = (uint64_t)json_integer_value(seed);
        s->has_seed = 1;
    }
    if ((rc = s_bool(o, "ignore_eos", &b, e)) < 0) return -1;
    if (rc) s->ignore_eos = b;
    /* vLLM's extension: lower is handled earlier; the protocol's priority admits higher first */
    if ((rc = s_int(o, "priority", -PROTO_PRIORITY_MAX, -PROTO_PRIORITY_MIN, &k, e)) < 0) return -1;
    if (rc) r->gen.priority = (int32_t)-k;
    /* max_completion_tokens wins over the older max_tokens when both are given */
    const char *mk = s_get(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = s_int(o, mk, 0, PROTO_MAX_GEN, &k, e)) < 0) return -1; /* 0: with echo or prompt_logprobs only */
    if (rc) {
        r->gen.max_tokens = (uint32_t)k;
        r->has_max_tokens = 1;
    } else if (r->ep == GW_EP_COMPLETIONS) {
        r->gen.max_tokens = GW_DEFAULT_MAX_TOKENS_COMPLETIONS;
    }
    return 0;
}

int gw_request_parse(gw_endpoint ep, const char *body, size_t len, gw_request *r, gw_error *e) {
    memset(r, 0, sizeof *r);
    r->ep = ep;
    proto_generate_defaults(&r->gen);
    json_t *o = s_parse(body, len, e);
    if (!o) return -1;
    r->root = o;
    json_t *m = s_get(o, "model");
    if (m && !json_is_string(m)) {
        s_bad(e, "model", "'%s' must be a string", "model");
        goto fail;
    }
    r->model = m ? json_string_value(m) : "";
    if (m && (json_string_length(m) > PROTO_NAME_MAX || memchr(r->model, 0, json_string_length(m)))) {
        gw_error_set(e, 404, "not_found_error", "model", "model_not_found", "the model does not exist");
        goto fail;
    }
    json_t *u = s_get(o, "user");
    if (u && !json_is_string(u)) {
        s_bad(e, "user", "'%s' must be a string", "user");
        goto fail;
    }
    if (s_refuse_unsupported(o, ep, e) != 0) goto fail;
    if ((ep == GW_EP_CHAT ? s_messages(r, o, e) : s_prompt(r, o, e)) != 0) goto fail;
    if (s_sampling(r, o, e) != 0 || s_extras(r, o, e) != 0 || s_stop(r, o, e) != 0 || gw_format_parse(r, o, e) != 0)
        goto fail;
    if (s_bool(o, "stream", &r->stream, e) < 0) goto fail;
    json_t *so = s_get(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            s_bad(e, "stream_options", "'%s' must be an object", "stream_options");
            goto fail;
        }
        if (s_bool(so, "include_usage", &r->include_usage, e) < 0) goto fail;
    }
    r->gen.stream = r->stream;
    return 0;
fail:
    gw_request_free(r);
    return -1;
}

void gw_request_free(gw_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_pieces; i++) free(r->pieces[i]);
    free(r->pieces);
    free(r->msgs);
    free(r->tokens);
    free(r->format_text);
    free(r->bias);
    if (r->root) json_decref((json_t *)r->root);
    memset(r, 0, sizeof *r);
}

/* the optional "model" of a /tokenize or /detokenize body into model[cap] ("" when absent); 0 or -1 with e */
static int s_vocab_model(json_t *o, char *model, size_t cap, gw_error *e) {
    json_t *m = s_get(o, "model");
    model[0] = 0;
    if (!m) return 0;
    if (!json_is_string(m)) return s_bad(e, "model", "'%s' must be a string", "model");
    size_t n = json_string_length(m);
    if (n >= cap || memchr(json_string_value(m), 0, n))
        return gw_error_set(e, 404, "not_found_error", "model", "model_not_found", "the model does not exist");
    memcpy(model, json_string_value(m), n + 1);
    return 0;
}

int gw_tokenize_parse(const char *body, size_t len, void **root, const char **content, size_t *content_len,
                      int *add_special, int *parse_special, char *model, size_t model_cap, gw_error *e) {
    json_t *o = s_parse(body, len, e);
    if (!o) return -1;
    if (s_vocab_model(o, model, model_cap, e) != 0) {
        json_decref(o);
        return -1;
    }
    json_t *c = s_get(o, "content");
    if (!json_is_string(c)) {
        json_decref(o);
        return s_bad(e, "content", "'%s' must be a string", "content");
    }
    *add_special = 0;
    *parse_special = 1;
    if (s_bool(o, "add_special", add_special, e) < 0 || s_bool(o, "parse_special", parse_special, e) < 0) {
        json_decref(o);
        return -1;
    }
    *content = json_string_value(c);
    *content_len = json_string_length(c);
    *root = o;
    return 0;
}

int gw_detokenize_parse(const char *body, size_t len, int32_t **tokens, size_t *n, char *model, size_t model_cap,
                        gw_error *e) {
    json_t *o = s_parse(body, len, e);
    if (!o) return -1;
    json_t *t = s_get(o, "tokens");
    int rc;
    *tokens = NULL;
    *n = 0;
    if (s_vocab_model(o, model, model_cap, e) != 0) rc = -1;
    else if (!json_is_array(t)) rc = s_bad(e, "tokens", "'%s' must be an array of token ids", "tokens");
    else if (json_array_size(t) == 0) rc = 0;
    else rc = s_token_array(t, "tokens", tokens, n, e);
    json_decref(o);
    return rc;
}
