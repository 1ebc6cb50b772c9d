/* http/gw_format.c: structured output in an OpenAI or llama-server request body, mapped onto the protocol's
 * response_format (docs/structured-output.md, docs/http.md):
 *   response_format {"type": "text"}                                       nothing
 *   response_format {"type": "json_object"}                                any JSON object
 *   response_format {"type": "json_object", "schema": {...}}               the schema (llama-server's form)
 *   response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
 *   response_format {"type": "json_schema", "schema": {...}}               the schema
 *   "json_schema": {...}                                                   the schema (llama-server)
 *   "grammar": "GBNF text"                                                 the grammar (llama-server)
 * At most one of them. The schema or grammar itself is checked by the broker, whose bad_request carries the
 * reason back as a 400. */
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "gw_request.h"

static int s_bad(gw_error *e, const char *param, const char *msg) {
    return gw_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
}

/* the schema value as compact JSON text, owned by r */
static int s_schema(gw_request *r, json_t *schema, const char *param, gw_error *e) {
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return s_bad(e, param, "the JSON schema must be an object");
    r->format_text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!r->format_text) return gw_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (strlen(r->format_text) > PROTO_FORMAT_MAX_LEN) return s_bad(e, param, "the JSON schema is too long");
    r->gen.format.kind = PROTO_FORMAT_JSON_SCHEMA;
    r->gen.format.text = proto_cstr(r->format_text);
    return 0;
}

int gw_format_parse(gw_request *r, void *root, gw_error *e) {
    json_t *o = root, *rf = json_object_get(o, "response_format"), *js = json_object_get(o, "json_schema"),
           *gr = json_object_get(o, "grammar");
    if (rf && json_is_null(rf)) rf = NULL;
    if (js && json_is_null(js)) js = NULL;
    if (gr && json_is_null(gr)) gr = NULL;
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t))
            return s_bad(e, "response_format", "'response_format' must be an object with a string 'type'");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "text")) rf = NULL;
        else if (strcmp(ty, "json_object") && strcmp(ty, "json_schema"))
            return gw_error_set(e, 400, "invalid_request_error", "response_format", "unsupported_field",
                                "'response_format' type '%s' is not supported by zllm (text, json_object, json_schema)",
                                ty);
    }
    if (!!rf + !!js + !!gr > 1)
        return s_bad(e, "response_format", "give one of 'response_format', 'json_schema' and 'grammar'");
    if (js) return s_schema(r, js, "json_schema", e);
    if (gr) {
        if (!json_is_string(gr) || json_string_length(gr) == 0 || json_string_length(gr) > PROTO_FORMAT_MAX_LEN)
            return s_bad(e, "grammar", "'grammar' must be a non-empty GBNF string of at most 64 KiB");
        r->gen.format.kind = PROTO_FORMAT_GRAMMAR;
        r->gen.format.text = (proto_str){json_string_value(gr), (uint32_t)json_string_length(gr)};
        return 0;
    }
    if (!rf) return 0;
    const char *ty = json_string_value(json_object_get(rf, "type"));
    json_t *schema = json_object_get(rf, "schema");
    if (!strcmp(ty, "json_object")) {
        if (schema) return s_schema(r, schema, "response_format", e);
        r->gen.format.kind = PROTO_FORMAT_JSON_OBJECT;
        r->gen.format.text = proto_cstr("");
        return 0;
    }
    json_t *inner = json_object_get(rf, "json_schema");
    if (json_is_object(inner) && json_object_get(inner, "schema")) schema = json_object_get(inner, "schema");
    if (!schema) return s_bad(e, "response_format", "'response_format' json_schema needs 'json_schema.schema'");
    return s_schema(r, schema, "response_format", e);
}
