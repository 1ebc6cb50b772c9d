/* deploy/deploy_layout.c: parse and validate a zllm-deploy layout (deploy/deploy_layout.h, docs/deploy.md). */
#include "deploy_layout.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_WORDS 64 /* words of one layout line */
#define S_MAX_ARGS 64  /* words of one args="..." value */
#define S_MAX_MODELS 16
#define S_MAX_LINE 4096

typedef struct {
    char name[DL_NAME_MAX + 1]; /* model name (broker --model NAME=, worker --model-name) */
    char path[DL_PATH_MAX];     /* absolute GGUF path */
} s_model;

/* parser state: everything gathered before the units are expanded */
typedef struct {
    const char *file;      /* layout path (for messages) */
    char dir[DL_PATH_MAX]; /* its directory (relative paths) */
    int line;              /* current line (1-based) */
    char *err;             /* message buffer */
    size_t errlen;
    s_model models[S_MAX_MODELS]; /* [n_models] */
    int n_models;
    int have_broker, have_connect; /* directives seen */
    int broker_line;
    char clients[DL_PATH_MAX], workers[DL_PATH_MAX];          /* broker endpoints */
    char curve_secret[DL_PATH_MAX], curve_allow[DL_PATH_MAX]; /* "" when not given */
    char curve_allow_workers[DL_PATH_MAX]; /* the workers' own allow-list directory, "" when not given */
    int curve_workers;                     /* 1: broker --curve-workers */
    char broker_args[S_MAX_LINE];          /* extra broker words */
    char connect[DL_PATH_MAX];             /* endpoint local workers connect to */
    char server_key[DL_PATH_MAX], worker_key[DL_PATH_MAX]; /* CURVE files for the workers, "" when not given */
    int seen_rundir, seen_bin, seen_restart, seen_stop;
} s_parser;

static void s_err(s_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_err(s_parser *p, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->line > 0) snprintf(p->err, p->errlen, "%s:%d: %s", p->file, p->line, msg);
    else snprintf(p->err, p->errlen, "%s: %s", p->file, msg);
}

/* splits s in place into words: blanks separate, "..." groups (quotes removed, also inside a word as in
 * key="a b"), '#' outside quotes starts a comment. Returns the word count, -1 for an unterminated quote, -2 for
 * too many words. */
static int s_split(char *s, char **words, int max) {
    int n = 0;
    char *r = s;
    for (;;) {
        while (*r == ' ' || *r == '\t' || *r == '\r' || *r == '\n') r++;
        if (!*r || *r == '#') return n;
        if (n == max) return -2;
        char *w = r, *start = r;
        int quoted = 0;
        while (*r && (quoted || (*r != ' ' && *r != '\t' && *r != '\r' && *r != '\n' && *r != '#'))) {
            if (*r == '"') {
                quoted = !quoted;
                r++;
                continue;
            }
            *w++ = *r++;
        }
        if (quoted) return -1;
        int end = !*r || *r == '#';
        if (*r && *r != '#') r++;
        *w = 0;
        words[n++] = start;
        if (end) return n;
    }
}

/* replaces every "{rundir}" in src by rundir into dst; -1 when it does not fit */
static int s_subst(const char *src, const char *rundir, char *dst, size_t dstlen) {
    size_t o = 0, rl = strlen(rundir);
    while (*src) {
        if (!strncmp(src, "{rundir}", 8)) {
            if (o + rl >= dstlen) return -1;
            memcpy(dst + o, rundir, rl);
            o += rl;
            src += 8;
        } else {
            if (o + 1 >= dstlen) return -1;
            dst[o++] = *src++;
        }
    }
    dst[o] = 0;
    return 0;
}

/* an absolute path: relative ones are taken from the layout's directory */
static int s_abspath(s_parser *p, const char *v, char *out, size_t outlen, const char *what) {
    int n = v[0] == '/' ? snprintf(out, outlen, "%s", v) : snprintf(out, outlen, "%s/%s", p->dir, v);
    if (n < 0 || (size_t)n >= outlen) {
        s_err(p, "%s: path too long", what);
        return -1;
    }
    return 0;
}

static int s_name_ok(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') return 0;
    return 1;
}

static int s_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int s_endpoint_ok(const char *ep) {
    return !strncmp(ep, "tcp://", 6) || !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

/* key=value attributes of one directive: looks each key up in allowed (NULL-terminated); values[] gets the
 * value of allowed[i] or NULL. Unknown and repeated keys are errors. */
static int s_attrs(s_parser *p, const char *directive, char **words, int n, const char *const *allowed,
                   const char **values) {
    int n_allowed = 0;
    while (allowed[n_allowed]) values[n_allowed++] = NULL;
    for (int i = 0; i < n; i++) {
        char *eq = strchr(words[i], '=');
        if (!eq || eq == words[i]) {
            s_err(p, "%s: expected key=value, got '%s'", directive, words[i]);
            return -1;
        }
        *eq = 0;
        int k = 0;
        while (k < n_allowed && strcmp(allowed[k], words[i]) != 0) k++;
        if (k == n_allowed) {
            char list[256] = "";
            for (int j = 0; j < n_allowed; j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "", allowed[j]);
            s_err(p, "%s: unknown attribute '%s' (expected: %s)", directive, words[i], list);
            return -1;
        }
        if (values[k]) {
            s_err(p, "%s: '%s' given twice", directive, words[i]);
            return -1;
        }
        values[k] = eq + 1;
    }
    return 0;
}

static int s_readable(s_parser *p, const char *path, const char *what) {
    if (access(path, R_OK) != 0) {
        s_err(p, "%s %s: %s", what, path, strerror(errno));
        return -1;
    }
    return 0;
}

/* a NULL-terminated argv on the heap from a fixed list of words plus extra blank-separated words */
typedef struct {
    char **v; /* [n + 1] */
    int n, cap;
    int failed; /* an allocation failed */
} s_vec;

static void s_push(s_vec *a, const char *s) {
    if (a->failed) return;
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->failed = 1;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n] = strdup(s);
    if (!a->v[a->n]) {
        a->failed = 1;
        return;
    }
    a->n++;
    a->v[a->n] = NULL;
}

static void s_vec_free(char ***pv) {
    if (!*pv) return;
    for (char **q = *pv; *q; q++) free(*q);
    free(*pv);
    *pv = NULL;
}

/* pushes the blank-separated words of s (already unquoted) */
static int s_push_words(s_parser *p, s_vec *a, const char *s) {
    char buf[S_MAX_LINE], *w[S_MAX_ARGS];
    snprintf(buf, sizeof buf, "%s", s);
    int n = s_split(buf, w, S_MAX_ARGS);
    if (n < 0) {
        s_err(p, "args: too many words");
        return -1;
    }
    for (int i = 0; i < n; i++) s_push(a, w[i]);
    return 0;
}

/* expands a device list (cpu, cuda, cuda:N, cuda:A..B, comma-separated) into devs; returns the count or -1 */
static int s_devices(s_parser *p, const char *list, char devs[][32], int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int a, b;
        char *dots = strstr(item, "..");
        if (!strcmp(item, "cpu") || !strcmp(item, "cuda")) {
            if (n == max) goto many;
            snprintf(devs[n++], 32, "%s", item);
        } else if (!strncmp(item, "cuda:", 5) && dots) {
            *dots = 0;
            if (s_int(item + 5, 0, 1023, &a) || s_int(dots + 2, 0, 1023, &b) || b < a) {
                s_err(p, "devices: bad range '%s..%s' (expected cuda:A..B with A <= B)", item, dots + 2);
                return -1;
            }
            for (int d = a; d <= b; d++) {
                if (n == max) goto many;
                snprintf(devs[n++], 32, "cuda:%d", d);
            }
        } else if (!strncmp(item, "cuda:", 5) && !s_int(item + 5, 0, 1023, &a)) {
            if (n == max) goto many;
            snprintf(devs[n++], 32, "cuda:%d", a);
        } else {
            s_err(p, "devices: unknown device '%s' (expected cpu, cuda, cuda:N or cuda:A..B)", item);
            return -1;
        }
    }
    if (n == 0) {
        s_err(p, "devices: empty list");
        return -1;
    }
    return n;
many:
    s_err(p, "devices: more than %d", max);
    return -1;
}

static const s_model *s_find_model(const s_parser *p, const char *name) {
    for (int i = 0; i < p->n_models; i++)
        if (!strcmp(p->models[i].name, name)) return &p->models[i];
    return NULL;
}

static int s_unit_name_taken(const dl_plan *pl, const char *name) {
    for (int i = 0; i < pl->n_units; i++)
        if (!strcmp(pl->units[i].name, name)) return 1;
    return 0;
}

/* the worker words common to every process of a replica line (all but stage/group/name/device) */
static void s_worker_base(s_vec *a, const dl_plan *pl, const s_model *m) {
    char bin[DL_PATH_MAX + 16];
    snprintf(bin, sizeof bin, "%s/zllm-worker", pl->bindir);
    s_push(a, bin);
    s_push(a, "-m");
    s_push(a, m->path);
    s_push(a, "--model-name");
    s_push(a, m->name);
}

/* the broker-facing words of a worker that talks to the broker (single worker or stage 0) */
static void s_worker_connect(s_vec *a, const s_parser *p) {
    s_push(a, "--broker");
    s_push(a, p->connect);
    if (p->worker_key[0]) {
        s_push(a, "--curve-server-key");
        s_push(a, p->server_key);
        s_push(a, "--curve-key");
        s_push(a, p->worker_key);
    }
}

static int s_replica(s_parser *p, dl_plan *pl, char **w, int n) {
    static const char *const allowed[] = {"model", "replicas", "stages", "devices", "name", "args", NULL};
    const char *v[7];
    if (s_attrs(p, "replica", w, n, allowed, v)) return -1;
    if (!v[0]) {
        s_err(p, "replica: model=NAME is required");
        return -1;
    }
    const s_model *m = s_find_model(p, v[0]);
    if (!m) {
        s_err(p, "replica: model '%s' is not defined (add a 'model %s=PATH' line above)", v[0], v[0]);
        return -1;
    }
    int replicas = 1, stages = 1;
    if (v[1] && s_int(v[1], 1, DL_MAX_UNITS, &replicas)) {
        s_err(p, "replica: bad replicas=%s (1..%d)", v[1], DL_MAX_UNITS);
        return -1;
    }
    if (v[2] && s_int(v[2], 1, DL_MAX_STAGES, &stages)) {
        s_err(p, "replica: bad stages=%s (1..%d)", v[2], DL_MAX_STAGES);
        return -1;
    }
    char devs[DL_MAX_UNITS][32];
    int n_dev = 1;
    snprintf(devs[0], 32, "cpu");
    if (v[3] && (n_dev = s_devices(p, v[3], devs, DL_MAX_UNITS)) < 0) return -1;
    int need = replicas * stages;
    if (n_dev != 1 && n_dev != need) {
        s_err(p, "replica: %d devices for %d replica(s) x %d stage(s): give 1 device (shared) or %d (one each)", n_dev,
              replicas, stages, need);
        return -1;
    }
    const char *prefix = v[4] ? v[4] : m->name;
    if (!s_name_ok(prefix, DL_NAME_MAX - 4)) {
        s_err(p, "replica: name '%s': 1..%d letters, digits, '_', '-', '.'", prefix, DL_NAME_MAX - 4);
        return -1;
    }
    for (int r = 0; r < replicas; r++) {
        if (pl->n_units == DL_MAX_UNITS) {
            s_err(p, "more than %d units", DL_MAX_UNITS);
            return -1;
        }
        dl_unit *u = &pl->units[pl->n_units];
        memset(u, 0, sizeof *u);
        for (int k = 0; k < 100000; k++) /* prefix-0, prefix-1, ...: the first name not taken */
            if (snprintf(u->name, sizeof u->name, "%s-%d", prefix, k) < (int)sizeof u->name &&
                !s_unit_name_taken(pl, u->name))
                break;
        u->kind = stages > 1 ? DL_GROUP : DL_WORKER;
        u->line = p->line;
        u->n_procs = stages;
        pl->n_units++; /* counted now, so dl_destroy frees its argvs whatever happens below */
        for (int s = 0; s < stages; s++) {
            const char *dev = devs[n_dev == 1 ? 0 : r * stages + s];
            snprintf(u->device[s], sizeof u->device[s], "%.31s", dev);
            s_vec a = {0};
            s_worker_base(&a, pl, m);
            if (s == 0) s_worker_connect(&a, p);
            char buf[64];
            if (stages > 1) {
                snprintf(buf, sizeof buf, "%d/%d", s, stages);
                s_push(&a, "--stage");
                s_push(&a, buf);
                s_push(&a, "--group");
                s_push(&a, u->name);
                if (s > 0) snprintf(buf, sizeof buf, "%s.s%d", u->name, s);
                else snprintf(buf, sizeof buf, "%s", u->name); /* the broker sees the group as this worker */
            } else {
                snprintf(buf, sizeof buf, "%s", u->name);
            }
            s_push(&a, "--name");
            s_push(&a, buf);
            s_push(&a, "--device");
            s_push(&a, dev);
            int bad = v[5] ? s_push_words(p, &a, v[5]) : 0;
            u->argv[s] = a.v;
            if (bad) return -1;
            if (a.failed) {
                s_err(p, "out of memory");
                return -1;
            }
        }
    }
    return 0;
}

/* http listen=HOST:PORT [broker=EP] [name=NAME] [api-key-file=FILE] [server-key=BROKER.pub key=GW.key]
 * [args="..."]: one zllm-http gateway in front of the broker (default: this layout's broker, its wildcard host
 * made the loopback), with every model's vocabulary for /tokenize, and CURVE keys for a broker that needs them */
static int s_http(s_parser *p, dl_plan *pl, char **w, int n) {
    static const char *const allowed[] = {"listen", "broker",     "name", "api-key-file",
                                          "args",   "server-key", "key",  NULL};
    const char *v[7];
    if (s_attrs(p, "http", w, n, allowed, v)) return -1;
    if (!v[0] || !strchr(v[0], ':')) {
        s_err(p, "http: listen=HOST:PORT is required");
        return -1;
    }
    char ep[DL_PATH_MAX];
    if (v[1]) {
        if (!s_endpoint_ok(v[1])) {
            s_err(p, "http: broker=%s is not a tcp://, ipc:// or inproc:// endpoint", v[1]);
            return -1;
        }
        snprintf(ep, sizeof ep, "%s", v[1]);
    } else if (p->have_broker) {
        const char *c = p->clients;
        if (!strncmp(c, "tcp://0.0.0.0:", 14)) snprintf(ep, sizeof ep, "tcp://127.0.0.1:%s", c + 14);
        else if (!strncmp(c, "tcp://*:", 8)) snprintf(ep, sizeof ep, "tcp://127.0.0.1:%s", c + 8);
        else snprintf(ep, sizeof ep, "%s", c);
    } else {
        s_err(p, "http: no 'broker' line in this layout: give broker=ENDPOINT");
        return -1;
    }
    const char *prefix = v[2] ? v[2] : "http";
    if (!s_name_ok(prefix, DL_NAME_MAX - 4)) {
        s_err(p, "http: name '%s': 1..%d letters, digits, '_', '-', '.'", prefix, DL_NAME_MAX - 4);
        return -1;
    }
    char key[DL_PATH_MAX] = "", skey[DL_PATH_MAX] = "", ckey[DL_PATH_MAX] = "";
    if (v[3] && (s_abspath(p, v[3], key, sizeof key, "api-key-file") || s_readable(p, key, "api-key-file"))) return -1;
    if (!v[5] != !v[6]) {
        s_err(p, "http: server-key=BROKER.pub and key=GW.key go together");
        return -1;
    }
    if (v[5] && (s_abspath(p, v[5], skey, sizeof skey, "server-key") || s_readable(p, skey, "server-key") ||
                 s_abspath(p, v[6], ckey, sizeof ckey, "key") || s_readable(p, ckey, "key")))
        return -1;
    if (pl->n_units == DL_MAX_UNITS) {
        s_err(p, "more than %d units", DL_MAX_UNITS);
        return -1;
    }
    dl_unit *u = &pl->units[pl->n_units];
    memset(u, 0, sizeof *u);
    for (int k = 0; k < 100000; k++)
        if (snprintf(u->name, sizeof u->name, "%s-%d", prefix, k) < (int)sizeof u->name &&
            !s_unit_name_taken(pl, u->name))
            break;
    u->kind = DL_HTTP;
    u->line = p->line;
    u->n_procs = 1;
    pl->n_units++;
    s_vec a = {0};
    char bin[DL_PATH_MAX + 16];
    snprintf(bin, sizeof bin, "%s/zllm-http", pl->bindir);
    s_push(&a, bin);
    s_push(&a, "--broker");
    s_push(&a, ep);
    s_push(&a, "--listen");
    s_push(&a, v[0]);
    if (key[0]) {
        s_push(&a, "--api-key-file");
        s_push(&a, key);
    }
    if (skey[0]) {
        s_push(&a, "--curve-server-key");
        s_push(&a, skey);
        s_push(&a, "--curve-key");
        s_push(&a, ckey);
    }
    for (int i = 0; i < p->n_models; i++) {
        char mv[DL_NAME_MAX + DL_PATH_MAX + 2];
        snprintf(mv, sizeof mv, "%s=%s", p->models[i].name, p->models[i].path);
        s_push(&a, "--model");
        s_push(&a, mv);
    }
    int bad = v[4] ? s_push_words(p, &a, v[4]) : 0;
    u->argv[0] = a.v;
    if (bad) return -1;
    if (a.failed) {
        s_err(p, "out of memory");
        return -1;
    }
    return 0;
}

static int s_broker(s_parser *p, char **w, int n) {
    static const char *const allowed[] = {"clients",       "workers", "curve-secret",        "curve-allow",
                                          "curve-workers", "args",    "curve-allow-workers", NULL};
    const char *v[7];
    if (p->have_broker) {
        s_err(p, "a second 'broker' line (the first is line %d)", p->broker_line);
        return -1;
    }
    if (s_attrs(p, "broker", w, n, allowed, v)) return -1;
    if (!v[0] || !v[1]) {
        s_err(p, "broker: clients=ENDPOINT and workers=ENDPOINT are required");
        return -1;
    }
    for (int i = 0; i < 2; i++)
        if (!s_endpoint_ok(v[i])) {
            s_err(p, "broker: %s=%s is not a tcp://, ipc:// or inproc:// endpoint", allowed[i], v[i]);
            return -1;
        }
    snprintf(p->clients, sizeof p->clients, "%s", v[0]);
    snprintf(p->workers, sizeof p->workers, "%s", v[1]);
    if (!v[2] != !v[3]) {
        s_err(p, "broker: curve-secret and curve-allow go together");
        return -1;
    }
    if (v[2]) {
        if (s_abspath(p, v[2], p->curve_secret, sizeof p->curve_secret, "curve-secret") ||
            s_readable(p, p->curve_secret, "curve-secret") ||
            s_abspath(p, v[3], p->curve_allow, sizeof p->curve_allow, "curve-allow") ||
            s_readable(p, p->curve_allow, "curve-allow"))
            return -1;
    }
    if (v[4]) {
        if (!strcmp(v[4], "yes")) p->curve_workers = 1;
        else if (strcmp(v[4], "no") != 0) {
            s_err(p, "broker: curve-workers=%s (expected yes or no)", v[4]);
            return -1;
        }
        if (p->curve_workers && !v[2]) {
            s_err(p, "broker: curve-workers=yes needs curve-secret and curve-allow");
            return -1;
        }
    }
    if (v[6]) {
        if (!p->curve_workers) {
            s_err(p, "broker: curve-allow-workers needs curve-workers=yes");
            return -1;
        }
        if (s_abspath(p, v[6], p->curve_allow_workers, sizeof p->curve_allow_workers, "curve-allow-workers") ||
            s_readable(p, p->curve_allow_workers, "curve-allow-workers"))
            return -1;
    }
    snprintf(p->broker_args, sizeof p->broker_args, "%s", v[5] ? v[5] : "");
    p->have_broker = 1;
    p->broker_line = p->line;
    return 0;
}

static int s_connect(s_parser *p, char **w, int n) {
    static const char *const allowed[] = {"server-key", "key", NULL};
    const char *v[2];
    if (p->have_connect) {
        s_err(p, "a second 'connect' line");
        return -1;
    }
    if (n < 1 || strchr(w[0], '=')) {
        s_err(p, "connect: expected 'connect ENDPOINT [server-key=FILE key=FILE]'");
        return -1;
    }
    if (!s_endpoint_ok(w[0])) {
        s_err(p, "connect: '%s' is not a tcp://, ipc:// or inproc:// endpoint", w[0]);
        return -1;
    }
    snprintf(p->connect, sizeof p->connect, "%s", w[0]);
    if (s_attrs(p, "connect", w + 1, n - 1, allowed, v)) return -1;
    if (!v[0] != !v[1]) {
        s_err(p, "connect: server-key and key go together");
        return -1;
    }
    if (v[0] && (s_abspath(p, v[0], p->server_key, sizeof p->server_key, "server-key") ||
                 s_readable(p, p->server_key, "server-key") ||
                 s_abspath(p, v[1], p->worker_key, sizeof p->worker_key, "key") || s_readable(p, p->worker_key, "key")))
        return -1;
    p->have_connect = 1;
    return 0;
}

static int s_model_line(s_parser *p, char **w, int n) {
    char *eq = n == 1 ? strchr(w[0], '=') : NULL;
    if (!eq) {
        s_err(p, "model: expected 'model NAME=PATH.gguf'");
        return -1;
    }
    *eq = 0;
    if (!s_name_ok(w[0], DL_NAME_MAX)) {
        s_err(p, "model: name '%s': 1..%d letters, digits, '_', '-', '.'", w[0], DL_NAME_MAX);
        return -1;
    }
    if (s_find_model(p, w[0])) {
        s_err(p, "model: '%s' defined twice", w[0]);
        return -1;
    }
    if (p->n_models == S_MAX_MODELS) {
        s_err(p, "model: more than %d models", S_MAX_MODELS);
        return -1;
    }
    s_model *m = &p->models[p->n_models];
    snprintf(m->name, sizeof m->name, "%s", w[0]);
    if (!eq[1]) {
        s_err(p, "model: '%s' has an empty path", w[0]);
        return -1;
    }
    if (s_abspath(p, eq + 1, m->path, sizeof m->path, "model") || s_readable(p, m->path, "model")) return -1;
    struct stat st;
    if (stat(m->path, &st) != 0 || !S_ISREG(st.st_mode)) {
        s_err(p, "model %s: not a regular file", m->path);
        return -1;
    }
    p->n_models++;
    return 0;
}

static int s_restart_line(s_parser *p, dl_plan *pl, char **w, int n) {
    static const char *const allowed[] = {"limit", "window", "backoff-ms", NULL};
    const char *v[3];
    if (p->seen_restart++) {
        s_err(p, "a second 'restart' line");
        return -1;
    }
    if (s_attrs(p, "restart", w, n, allowed, v)) return -1;
    if (v[0] && s_int(v[0], 0, 1000000, &pl->restart_limit)) {
        s_err(p, "restart: bad limit=%s", v[0]);
        return -1;
    }
    if (v[1] && s_int(v[1], 1, 86400 * 7, &pl->restart_window_s)) {
        s_err(p, "restart: bad window=%s (seconds)", v[1]);
        return -1;
    }
    if (v[2]) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", v[2]);
        char *dots = strstr(buf, "..");
        if (!dots) {
            s_err(p, "restart: backoff-ms=%s (expected MIN..MAX)", v[2]);
            return -1;
        }
        *dots = 0;
        if (s_int(buf, 0, 3600000, &pl->backoff_min_ms) || s_int(dots + 2, 0, 3600000, &pl->backoff_max_ms) ||
            pl->backoff_max_ms < pl->backoff_min_ms) {
            s_err(p, "restart: backoff-ms=%s (expected MIN..MAX milliseconds, MIN <= MAX)", v[2]);
            return -1;
        }
    }
    return 0;
}

static int s_line(s_parser *p, dl_plan *pl, char *text, int pass) {
    char *w[S_MAX_WORDS];
    int n = s_split(text, w, S_MAX_WORDS);
    if (n == -1) {
        s_err(p, "unterminated quote");
        return -1;
    }
    if (n == -2) {
        s_err(p, "more than %d words", S_MAX_WORDS);
        return -1;
    }
    if (n == 0) return 0;
    /* pass 0 only looks for rundir (other values may refer to it as {rundir}) */
    if (pass == 0) {
        if (!strcmp(w[0], "rundir")) {
            if (n != 2) {
                s_err(p, "rundir: expected 'rundir DIR'");
                return -1;
            }
            if (!pl->rundir[0] && s_abspath(p, w[1], pl->rundir, sizeof pl->rundir, "rundir")) return -1;
        }
        return 0;
    }
    for (int i = 1; i < n; i++) { /* {rundir} substitution, in place into a line-lifetime buffer */
        static char subst[S_MAX_WORDS][S_MAX_LINE];
        if (s_subst(w[i], pl->rundir, subst[i], sizeof subst[i])) {
            s_err(p, "value too long after {rundir}");
            return -1;
        }
        w[i] = subst[i];
    }
    if (!strcmp(w[0], "broker")) return s_broker(p, w + 1, n - 1);
    if (!strcmp(w[0], "connect")) return s_connect(p, w + 1, n - 1);
    if (!strcmp(w[0], "model")) return s_model_line(p, w + 1, n - 1);
    if (!strcmp(w[0], "replica")) {
        /* the connect endpoint must be settled before a replica's command line is built */
        if (!p->have_connect && !p->have_broker) {
            s_err(p, "replica: no 'broker' or 'connect' line above says where workers connect");
            return -1;
        }
        return s_replica(p, pl, w + 1, n - 1);
    }
    if (!strcmp(w[0], "http")) return s_http(p, pl, w + 1, n - 1);
    if (!strcmp(w[0], "rundir")) {
        if (p->seen_rundir++) {
            s_err(p, "a second 'rundir' line");
            return -1;
        }
        return 0;
    }
    if (!strcmp(w[0], "bin")) {
        if (p->seen_bin++) {
            s_err(p, "a second 'bin' line");
            return -1;
        }
        if (n != 2) {
            s_err(p, "bin: expected 'bin DIR'");
            return -1;
        }
        if (!pl->bindir[0] && s_abspath(p, w[1], pl->bindir, sizeof pl->bindir, "bin")) return -1;
        return 0;
    }
    if (!strcmp(w[0], "restart")) return s_restart_line(p, pl, w + 1, n - 1);
    if (!strcmp(w[0], "stop")) {
        static const char *const allowed[] = {"timeout", NULL};
        const char *v[1];
        if (p->seen_stop++) {
            s_err(p, "a second 'stop' line");
            return -1;
        }
        if (s_attrs(p, "stop", w + 1, n - 1, allowed, v)) return -1;
        if (v[0] && s_int(v[0], 1, 3600, &pl->stop_timeout_s)) {
            s_err(p, "stop: bad timeout=%s (1..3600 s)", v[0]);
            return -1;
        }
        return 0;
    }
    s_err(p, "unknown directive '%s' (expected broker, connect, model, replica, http, rundir, bin, restart, stop)",
          w[0]);
    return -1;
}

/* the default connect endpoint from the broker's bind endpoint: a wildcard host becomes the loopback */
static void s_default_connect(s_parser *p) {
    const char *ep = p->workers;
    if (!strncmp(ep, "tcp://0.0.0.0:", 14)) snprintf(p->connect, sizeof p->connect, "tcp://127.0.0.1:%s", ep + 14);
    else if (!strncmp(ep, "tcp://*:", 8)) snprintf(p->connect, sizeof p->connect, "tcp://127.0.0.1:%s", ep + 8);
    else snprintf(p->connect, sizeof p->connect, "%s", ep);
}

static int s_read_lines(s_parser *p, dl_plan *pl, FILE *f, int pass) {
    char text[S_MAX_LINE];
    rewind(f);
    p->line = 0;
    while (fgets(text, sizeof text, f)) {
        p->line++;
        size_t len = strlen(text);
        if (len == sizeof text - 1 && text[len - 1] != '\n') {
            s_err(p, "line longer than %d bytes", S_MAX_LINE - 2);
            return -1;
        }
        if (s_line(p, pl, text, pass)) return -1;
    }
    if (ferror(f)) {
        p->line = 0;
        s_err(p, "read error");
        return -1;
    }
    return 0;
}

dl_plan *dl_load(const char *path, const char *rundir, const char *bindir, const char *bindir_default, char *err,
                 size_t errlen) {
    dl_plan *pl = calloc(1, sizeof *pl);
    s_parser *p = calloc(1, sizeof *p);
    FILE *f = NULL;
    if (!pl || !p) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    p->file = path;
    p->err = err;
    p->errlen = errlen;
    pl->restart_limit = 5;
    pl->restart_window_s = 60;
    pl->backoff_min_ms = 500;
    pl->backoff_max_ms = 10000;
    pl->stop_timeout_s = 15;
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(p->dir, sizeof p->dir, ".");
    else if (slash == path) snprintf(p->dir, sizeof p->dir, "/");
    else snprintf(p->dir, sizeof p->dir, "%.*s", (int)(slash - path), path);
    if (p->dir[0] != '/') { /* children may run elsewhere: make it absolute */
        char cwd[DL_PATH_MAX / 2];
        if (!getcwd(cwd, sizeof cwd)) {
            s_err(p, "getcwd: %s", strerror(errno));
            goto fail;
        }
        char tmp[DL_PATH_MAX];
        if (snprintf(tmp, sizeof tmp, "%s/%s", cwd, p->dir) >= (int)sizeof tmp) {
            s_err(p, "path too long");
            goto fail;
        }
        snprintf(p->dir, sizeof p->dir, "%s", tmp);
    }
    f = fopen(path, "r");
    if (!f) {
        s_err(p, "%s", strerror(errno));
        goto fail;
    }
    if (rundir && s_abspath(p, rundir, pl->rundir, sizeof pl->rundir, "--run-dir")) goto fail;
    if (bindir && s_abspath(p, bindir, pl->bindir, sizeof pl->bindir, "--bin")) goto fail;
    if (s_read_lines(p, pl, f, 0)) goto fail;
    if (!pl->rundir[0]) snprintf(pl->rundir, sizeof pl->rundir, "/tmp/zllm-deploy");
    /* the binary directory is needed while the replica lines are expanded: find a 'bin' line first */
    if (!pl->bindir[0]) {
        char text[S_MAX_LINE], *w[S_MAX_WORDS];
        rewind(f);
        while (fgets(text, sizeof text, f)) {
            int n = s_split(text, w, S_MAX_WORDS);
            if (n == 2 && !strcmp(w[0], "bin")) {
                char tmp[DL_PATH_MAX];
                if (s_subst(w[1], pl->rundir, tmp, sizeof tmp) == 0 &&
                    s_abspath(p, tmp, pl->bindir, sizeof pl->bindir, "bin"))
                    goto fail;
                break;
            }
        }
    }
    if (!pl->bindir[0]) snprintf(pl->bindir, sizeof pl->bindir, "%s", bindir_default ? bindir_default : ".");
    /* units[0] is the broker; its command line is built once the whole file is read (models may follow it) */
    pl->n_units = 1;
    /* the broker line must come before replicas for the default connect endpoint: read it in a first sweep */
    {
        char text[S_MAX_LINE], *w[S_MAX_WORDS];
        rewind(f);
        p->line = 0;
        while (fgets(text, sizeof text, f)) {
            p->line++;
            char copy[S_MAX_LINE];
            snprintf(copy, sizeof copy, "%s", text);
            int n = s_split(copy, w, S_MAX_WORDS);
            if (n > 0 && (!strcmp(w[0], "broker") || !strcmp(w[0], "connect")))
                if (s_line(p, pl, text, 1)) goto fail;
        }
        if (p->have_broker && !p->have_connect) s_default_connect(p);
        if (p->have_broker && p->curve_workers && !p->worker_key[0]) {
            p->line = p->broker_line;
            s_err(p, "broker: curve-workers=yes: add 'connect ENDPOINT server-key=BROKER.pub key=WORKER.key' for the "
                     "workers started here");
            goto fail;
        }
        if (p->have_broker && !p->curve_workers && p->worker_key[0]) {
            p->line = p->broker_line;
            s_err(p, "broker: the connect line gives CURVE keys but the broker has no curve-workers=yes");
            goto fail;
        }
    }
    /* then everything else, in order */
    {
        char text[S_MAX_LINE], *w[S_MAX_WORDS];
        rewind(f);
        p->line = 0;
        while (fgets(text, sizeof text, f)) {
            p->line++;
            size_t len = strlen(text);
            if (len == sizeof text - 1 && text[len - 1] != '\n') {
                s_err(p, "line longer than %d bytes", S_MAX_LINE - 2);
                goto fail;
            }
            char copy[S_MAX_LINE];
            snprintf(copy, sizeof copy, "%s", text);
            int n = s_split(copy, w, S_MAX_WORDS);
            if (n > 0 && (!strcmp(w[0], "broker") || !strcmp(w[0], "connect"))) continue;
            if (s_line(p, pl, text, 1)) goto fail;
        }
    }
    p->line = 0;
    if (p->have_broker) {
        if (p->n_models == 0) {
            s_err(p, "the broker needs at least one 'model NAME=PATH' line");
            goto fail;
        }
        dl_unit *u = &pl->units[0];
        snprintf(u->name, sizeof u->name, "broker");
        u->kind = DL_BROKER;
        u->line = p->broker_line;
        u->n_procs = 1;
        s_vec a = {0};
        char bin[DL_PATH_MAX + 16];
        snprintf(bin, sizeof bin, "%s/zllm-broker", pl->bindir);
        s_push(&a, bin);
        s_push(&a, "--clients");
        s_push(&a, p->clients);
        s_push(&a, "--workers");
        s_push(&a, p->workers);
        for (int i = 0; i < p->n_models; i++) {
            char mv[DL_NAME_MAX + DL_PATH_MAX + 2];
            snprintf(mv, sizeof mv, "%s=%s", p->models[i].name, p->models[i].path);
            s_push(&a, "--model");
            s_push(&a, mv);
        }
        if (p->curve_secret[0]) {
            s_push(&a, "--curve-secret");
            s_push(&a, p->curve_secret);
            s_push(&a, "--curve-allow");
            s_push(&a, p->curve_allow);
            if (p->curve_workers) s_push(&a, "--curve-workers");
            if (p->curve_allow_workers[0]) {
                s_push(&a, "--curve-allow-workers");
                s_push(&a, p->curve_allow_workers);
            }
        }
        int bad = s_push_words(p, &a, p->broker_args);
        u->argv[0] = a.v;
        if (bad) goto fail;
        if (a.failed) {
            s_err(p, "out of memory");
            goto fail;
        }
        const char *eps[2] = {p->clients, p->workers};
        for (int i = 0; i < 2; i++) {
            if (strncmp(eps[i], "ipc://", 6) != 0) continue;
            const char *sl = strrchr(eps[i] + 6, '/');
            if (sl && sl > eps[i] + 6 && pl->n_ipc_dirs < 4)
                snprintf(pl->ipc_dirs[pl->n_ipc_dirs++], DL_PATH_MAX, "%.*s", (int)(sl - (eps[i] + 6)), eps[i] + 6);
        }
    } else {
        /* no broker here: drop the reserved slot */
        memmove(&pl->units[0], &pl->units[1], (size_t)(pl->n_units - 1) * sizeof pl->units[0]);
        pl->n_units--;
    }
    if (pl->n_units == 0) {
        s_err(p, "nothing to run: no 'broker' and no 'replica' line");
        goto fail;
    }
    /* the binaries must exist and be executable: fail here rather than in a restart loop */
    for (int i = 0; i < pl->n_units; i++) {
        const char *b = pl->units[i].argv[0][0];
        if (access(b, X_OK) != 0) {
            s_err(p, "%s: %s (build it, or give --bin DIR / a 'bin DIR' line)", b, strerror(errno));
            goto fail;
        }
    }
    fclose(f);
    free(p);
    return pl;
fail:
    if (f) fclose(f);
    free(p);
    dl_destroy(&pl);
    return NULL;
}

void dl_destroy(dl_plan **pp) {
    if (!pp || !*pp) return;
    dl_plan *pl = *pp;
    for (int i = 0; i < pl->n_units && i < DL_MAX_UNITS; i++)
        for (int s = 0; s < DL_MAX_STAGES; s++) s_vec_free(&pl->units[i].argv[s]);
    free(pl);
    *pp = NULL;
}
