/* common/jinja.h: a small Jinja interpreter for chat templates (the subset that Hugging Face chat templates use),
 * rendering as transformers does: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
 * loopcontrols extension, default Undefined, and transformers' tojson (json.dumps with ensure_ascii=False).
 *
 * Use: jinja_parse() the template once; for each render make a jinja_env (an arena that owns every value), build
 * the context with the value constructors, jinja_env_set() the globals, jinja_render(), jinja_env_destroy().
 * Every failure returns a code and a message; JINJA_UNSUPPORTED names the construct we do not implement (the
 * caller may fall back to other code), JINJA_RAISED carries raise_exception()'s message. Hostile templates are
 * bounded by jinja_limits (template size, nesting depth, loop iterations, output size, memory, macro recursion). */
#ifndef ZLLM_JINJA_H
#define ZLLM_JINJA_H
#include <stddef.h>
#include <stdint.h>

enum {
    JINJA_OK = 0,
    JINJA_SYNTAX = -1,      /* the template is not valid Jinja */
    JINJA_UNSUPPORTED = -2, /* valid Jinja that this interpreter does not implement */
    JINJA_RUNTIME = -3,     /* a type error, an undefined value used, ... (jinja2 raises too) */
    JINJA_RAISED = -4,      /* raise_exception(message) */
    JINJA_LIMIT = -5,       /* a bound of jinja_limits was exceeded */
    JINJA_NOMEM = -6,
};

typedef struct {
    size_t max_template; /* template bytes */
    int max_depth;       /* nesting of blocks and expressions */
    long max_iters;      /* loop iterations, over the whole render */
    size_t max_output;   /* rendered bytes */
    size_t max_memory;   /* bytes of values made in one env over its life: the globals and every render */
    int max_calls;       /* macro call nesting */
} jinja_limits;

/* the defaults: 256 KiB template, depth 100, 100000 iterations, 16 MiB output, 256 MiB memory, 20 nested calls */
jinja_limits jinja_limits_default(void);

typedef struct jinja_tmpl jinja_tmpl;
typedef struct jinja_env jinja_env;
typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_str jv_str;
typedef struct jv_func jv_func;

typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC } jv_type;

typedef struct { /* a value; strings, lists and dicts live in the env's arena */
    jv_type t;
    union {
        int64_t i;         /* JV_BOOL, JV_INT */
        double f;          /* JV_FLOAT */
        jv_str *s;         /* JV_STR */
        jv_list *l;        /* JV_LIST (also tuples) */
        jv_dict *d;        /* JV_DICT (also namespaces) */
        jv_func *fn;       /* JV_FUNC */
        const char *uname; /* JV_UNDEF: the name looked up, for messages (may be NULL) */
    } u;
} jv;

/* Parses src (len bytes). Returns NULL with a message in err (and *code set when code is not NULL). */
jinja_tmpl *jinja_parse(const char *src, size_t len, const jinja_limits *lim, int *code, char *err, size_t errlen);
void jinja_tmpl_destroy(jinja_tmpl **t);

jinja_env *jinja_env_new(const jinja_limits *lim);
void jinja_env_destroy(jinja_env **e);
/* value constructors (on allocation failure they return undefined and the render reports JINJA_NOMEM) */
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_string(jinja_env *e, const char *s, size_t n);
jv jv_list_new(jinja_env *e);
jv jv_dict_new(jinja_env *e);
int jv_list_push(jinja_env *e, jv list, jv v);
int jv_dict_set(jinja_env *e, jv dict, jv key, jv v);
/* defines a global name (the render context) */
int jinja_env_set(jinja_env *e, const char *name, jv v);

/* Renders t with e's globals into a malloc'd NUL-terminated string (*out, length *outlen). Returns JINJA_OK or
 * an error code with a message in err. The values a render makes stay in e until jinja_env_destroy(), so a
 * further render of e has what is left of max_memory (chat_render uses one env per render). */
int jinja_render(jinja_env *e, const jinja_tmpl *t, char **out, size_t *outlen, char *err, size_t errlen);
#endif
