/* http/gw_error.h: an OpenAI-style error as the gateway reports it: the HTTP status and the fields of the
 * body {"error": {"message", "type", "param", "code"}} (http/gw_encode.c writes it). */
#ifndef ZLLM_GW_ERROR_H
#define ZLLM_GW_ERROR_H

typedef struct {
    int status;        /* HTTP status: 400, 401, 404, 413, 429, 500, 503 ... (0: no error) */
    char type[40];     /* "invalid_request_error", "authentication_error", "not_found_error", ... */
    char param[64];    /* the request field concerned, "" when none */
    char code[40];     /* a stable code ("model_not_found", "unsupported_field", ...), "" when none */
    char message[512]; /* human-readable text */
} gw_error;

/* Fills e (status, type, param or NULL, code or NULL, printf-style message). Returns -1, so that a parser can
 * `return gw_error_set(...)`. */
int gw_error_set(gw_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#endif
