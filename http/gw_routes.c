/* http/gw_routes.c: the endpoints answered at once (see gw_internal.h): /v1/models, /health, /tokenize,
 * /detokenize and /metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gw_internal.h"
#include "tokenizer.h"

enum MHD_Result gw_routes_models(gw_conn *c) {
    gw_server *s = c->srv;
    const proto_status *st = gw_session_status(s);
    json_t *data = json_array();
    long long created = (long long)time(NULL);
    if (s->cfg.n_alias > 0) {
        for (int i = 0; i < s->cfg.n_alias; i++)
            json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", s->cfg.alias[i], "object", "model",
                                                  "created", (json_int_t)created, "owned_by", "zllm"));
    } else if (st && gw_session_broker_up(s)) {
        for (uint32_t i = 0; i < st->n_models; i++)
            json_array_append_new(data,
                                  json_pack("{s:s%, s:s, s:I, s:s}", "id", st->models[i].p, (size_t)st->models[i].n,
                                            "object", "model", "created", (json_int_t)created, "owned_by", "zllm"));
    } else {
        json_decref(data);
        gw_error e;
        gw_session_unreachable(s, &e);
        return gw_reply_error(c, &e);
    }
    return gw_reply_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

enum MHD_Result gw_routes_health(gw_conn *c) {
    gw_server *s = c->srv;
    const proto_status *st = gw_session_status(s);
    if (!gw_session_broker_up(s)) {
        gw_error e;
        gw_session_unreachable(s, &e);
        return gw_reply_json(c, 503, json_pack("{s:s, s:s}", "status", "unavailable", "reason", e.message));
    }
    for (uint32_t i = 0; i < st->n_models; i++) {
        char name[PROTO_NAME_MAX + 1];
        proto_str_copy(st->models[i], name, sizeof name);
        if (gw_session_alive_workers(s, name) == 0)
            return gw_reply_json(c, 503,
                                 json_pack("{s:s, s:s, s:s}", "status", "unavailable", "reason",
                                           "no worker serves a model", "model", name));
    }
    if (st->n_models == 0)
        return gw_reply_json(c, 503, json_pack("{s:s, s:s}", "status", "unavailable", "reason", "no model"));
    return gw_reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
}

/* the vocabulary of the model a /tokenize or /detokenize body names: a --model NAME, or a --served-model-name
 * alias of one; the first --model when the body names none. NULL with e (501 without any vocabulary, 404 for a
 * name none has). */
static const zl_tokenizer *s_vocab_for(const gw_server *s, const char *name, gw_error *e) {
    const zl_tokenizer *t = gw_vocab_get(s->vocab, NULL);
    if (!t) {
        gw_error_set(e, 501, "not_implemented", NULL, "no_vocabulary",
                     "start zllm-http with --model NAME=PATH to tokenize and detokenize");
        return NULL;
    }
    if (!name[0]) return t;
    if ((t = gw_vocab_get(s->vocab, name))) return t;
    for (int i = 0; i < s->cfg.n_alias; i++)
        if (!strcmp(s->cfg.alias[i], name) && (t = gw_vocab_get(s->vocab, s->cfg.target[i]))) return t;
    gw_error_set(e, 404, "not_found_error", "model", "model_not_found",
                 "The model '%.128s' does not exist (no --model %.128s=PATH vocabulary)", name, name);
    return NULL;
}

enum MHD_Result gw_routes_tokenize(gw_conn *c) {
    gw_error e;
    char model[PROTO_NAME_MAX + 1];
    const zl_tokenizer *t;
    if (c->rt == R_DETOKENIZE) {
        int32_t *ids;
        size_t n;
        if (gw_detokenize_parse(c->body.p ? c->body.p : "", c->body.n, &ids, &n, model, sizeof model, &e) != 0)
            return gw_reply_error(c, &e);
        if (!(t = s_vocab_for(c->srv, model, &e))) {
            free(ids);
            return gw_reply_error(c, &e);
        }
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= tokenizer_n_vocab(t)) {
                free(ids);
                gw_error_set(&e, 400, "invalid_request_error", "tokens", NULL, "tokens[%zu] is outside the vocabulary",
                             i);
                return gw_reply_error(c, &e);
            }
        size_t len = 0;
        char *text = n ? tokenizer_decode_len(t, ids, (int)n, 0, &len) : strdup("");
        free(ids);
        json_t *o = text ? json_stringn(text, len) : NULL;
        if (text && !o) { /* not valid UTF-8 on its own (a partial character): replace as the stream does */
            gw_buf b = {0};
            gw_buf_json_str(&b, text, len);
            json_error_t je;
            o = b.failed ? NULL : json_loadb(b.p, b.n, JSON_DECODE_ANY, &je);
            gw_buf_free(&b);
        }
        free(text);
        return gw_reply_json(c, 200, o ? json_pack("{s:o}", "content", o) : NULL);
    }
    void *root;
    const char *content;
    size_t len;
    int add_special, parse_special;
    if (gw_tokenize_parse(c->body.p ? c->body.p : "", c->body.n, &root, &content, &len, &add_special, &parse_special,
                          model, sizeof model, &e) != 0)
        return gw_reply_error(c, &e);
    if (!(t = s_vocab_for(c->srv, model, &e))) {
        json_decref(root);
        return gw_reply_error(c, &e);
    }
    const int bos = add_special && tokenizer_add_bos(t);
    int n = tokenizer_encode(t, content, len, bos, parse_special, NULL, 0);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n > 0 && ids) n = tokenizer_encode(t, content, len, bos, parse_special, ids, n);
    json_decref(root);
    if (n < 0 || (n > 0 && !ids)) { /* a tokenizer error or no memory: never an empty list that looks right */
        free(ids);
        gw_error_set(&e, 500, "server_error", NULL, NULL, n < 0 ? "the tokenizer failed" : "out of memory");
        return gw_reply_error(c, &e);
    }
    json_t *arr = json_array();
    for (int i = 0; ids && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return gw_reply_json(c, 200, json_pack("{s:o}", "tokens", arr));
}

enum MHD_Result gw_routes_metrics(gw_conn *c) {
    gw_buf b = {0};
    gw_metrics_request(c->srv->metrics, "", "metrics", 200);
    c->http_status = 200;
    gw_metrics_render(c->srv->metrics, gw_session_broker_up(c->srv) ? gw_session_status(c->srv) : NULL,
                      gw_session_broker_up(c->srv), &b);
    enum MHD_Result rc =
        gw_reply(c->conn, b.failed ? 500 : 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", 0);
    gw_buf_free(&b);
    return rc;
}
