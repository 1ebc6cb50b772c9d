/* http/main_zllm-http.c: zllm-http, the OpenAI-compatible HTTP front end of a zllm broker.
 *
 *   zllm-http --broker EP [--listen HOST:PORT] [--api-key-file F] [--served-model-name NAME[=MODEL]]...
 *             [--model NAME=PATH]... [--max-body BYTES] [--max-connections N] [--idle-timeout S]
 *             [--max-stream-buffer B] [--stream-write-rate W] [--curve-server-key BROKER.pub --curve-key KEY] [-v]
 *
 * Prints `listening http://HOST:PORT` (port 0 resolved) on stdout once bound and the broker has answered (or
 * after 3 s without an answer); SIGTERM or SIGINT stops it
 * (requests in flight are cancelled at the broker). */
#include "version.h"
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zmq.h>
#include "gw_server.h"
#include "zkey.h"

static volatile sig_atomic_t s_stop;
static void s_on_signal(int sig) {
    (void)sig;
    s_stop = 1;
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-http --broker EP [--listen HOST:PORT] [--api-key-file F]\n"
               "                 [--served-model-name NAME[=MODEL]]... [--model NAME=PATH]...\n"
               "                 [--max-body BYTES] [--max-connections N] [--idle-timeout S] [--max-stream-buffer B]\n"
               "                 [--stream-write-rate W] [--curve-server-key BROKER.pub --curve-key KEY] [-v]\n"
               "  --broker EP             the broker's client endpoint (tcp://HOST:5555, ipc://PATH)\n"
               "  --listen HOST:PORT      HTTP address (default 127.0.0.1:8000; [::]:PORT for IPv6; port 0: any)\n"
               "  --api-key-file F        require `Authorization: Bearer KEY` (the file's first line) on /v1/*\n"
               "  --served-model-name N[=M]  the name clients use for broker model M (default: the only one);\n"
               "                          repeatable; /v1/models lists these names\n"
               "  --model NAME=PATH       load the GGUF's vocabulary for /tokenize and /detokenize\n"
               "  --max-body BYTES        request body limit (default 4194304; 413 beyond)\n"
               "  --max-connections N     open connections (default 16384)\n"
               "  --idle-timeout S        close a connection silent for S seconds (default 30)\n"
               "  --max-stream-buffer B   SSE bytes held for a client that does not read before its request is\n"
               "                          cancelled (default 1048576)\n"
               "  --stream-write-rate W   writes of streams' later tokens a second, all streams together, at most\n"
               "                          (default 100000; 0: no limit): with R requests in flight a stream writes\n"
               "                          at most every R/W s, tokens that come faster leave in one write; first\n"
               "                          tokens and the end of a stream are never held\n"
               "  --curve-server-key F    CURVE: the broker's public key (zllm-broker --keygen PREFIX: PREFIX.pub)\n"
               "  --curve-key F           CURVE: this gateway's secret key (PREFIX.key; its PREFIX.pub must be in the\n"
               "                          broker's --curve-allow directory); both or neither\n"
               "  -v                      log each request to stderr\n"
               "  -h, --help              this text;  --version  print the version\n"
               "Environment: none read.\n"
               "Exit status: 0 after SIGINT/SIGTERM, 2 on a usage error, 1 on any other error.\n");
}

/* a whole decimal number in [lo, hi]; 0, or -1 with a message naming the option */
static int s_num(const char *opt, const char *v, unsigned long long lo, unsigned long long hi,
                 unsigned long long *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = (v && *v >= '0' && *v <= '9') ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "zllm-http: %s: expected a whole number in %llu..%llu, got '%s'\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static char *s_read_key(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open", path);
        return NULL;
    }
    char line[512];
    char *k = fgets(line, sizeof line, f) ? line : NULL;
    int whole = k && (strchr(k, '\n') || fgetc(f) == EOF); /* the first line fits the buffer */
    fclose(f);
    if (k && !whole) {
        snprintf(err, errlen, "%s: the key's line is longer than %zu bytes", path, sizeof line - 2);
        return NULL;
    }
    if (k) k[strcspn(k, "\r\n")] = 0;
    if (!k || !k[0]) {
        snprintf(err, errlen, "%s: no key on the first line", path);
        return NULL;
    }
    return strdup(k);
}

int main(int argc, char **argv) {
    gw_config cfg;
    gw_config_defaults(&cfg);
    char err[512] = "";
    char *listen = NULL, *key = NULL;
    const char *curve_server = NULL, *curve_key = NULL;
    gw_curve curve;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--version")) {
            printf("zllm-http %s\n", ZLLM_VERSION);
            return 0;
        }
        int takes = strcmp(a, "-v") && strcmp(a, "-h") && strcmp(a, "--help");
        if (takes && !v) {
            fprintf(stderr, "zllm-http: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--broker")) cfg.broker = v;
        else if (!strcmp(a, "--listen")) listen = strdup(v);
        else if (!strcmp(a, "--curve-server-key")) curve_server = v;
        else if (!strcmp(a, "--curve-key")) curve_key = v;
        else if (!strcmp(a, "--api-key-file")) {
            if (!(key = s_read_key(v, err, sizeof err))) {
                fprintf(stderr, "zllm-http: %s\n", err);
                return 2;
            }
        } else if (!strcmp(a, "--served-model-name")) {
            if (cfg.n_alias == GW_MAX_ALIASES) {
                fprintf(stderr, "zllm-http: --served-model-name: at most %d names\n", GW_MAX_ALIASES);
                return 2;
            }
            char *d = strdup(v), *eq = strchr(d, '=');
            if (eq) *eq = 0;
            cfg.alias[cfg.n_alias] = d;
            cfg.target[cfg.n_alias++] = eq ? eq + 1 : "";
        } else if (!strcmp(a, "--model")) {
            if (cfg.n_vocab == (int)(sizeof cfg.vocab_name / sizeof *cfg.vocab_name)) {
                fprintf(stderr, "zllm-http: --model: at most %d vocabularies\n",
                        (int)(sizeof cfg.vocab_name / sizeof *cfg.vocab_name));
                return 2;
            }
            char *d = strdup(v), *eq = strchr(d, '=');
            if (!eq) {
                fprintf(stderr, "zllm-http: --model takes NAME=PATH\n");
                return 2;
            }
            *eq = 0;
            cfg.vocab_name[cfg.n_vocab] = d;
            cfg.vocab_path[cfg.n_vocab++] = eq + 1;
        } else if (!strcmp(a, "--max-body") || !strcmp(a, "--max-connections") || !strcmp(a, "--idle-timeout") ||
                   !strcmp(a, "--max-stream-buffer") || !strcmp(a, "--stream-write-rate")) {
            unsigned long long x;
            int body = !strcmp(a, "--max-body"), conns = !strcmp(a, "--max-connections");
            int idle = !strcmp(a, "--idle-timeout"), rate = !strcmp(a, "--stream-write-rate");
            if (s_num(a, v, rate ? 0 : 1, body ? 1ull << 30 : conns ? 1000000 : idle ? 86400 : 1ull << 32, &x))
                return 2;
            if (body) cfg.max_body = x;
            else if (conns) cfg.max_connections = (unsigned)x;
            else if (idle) cfg.idle_timeout_s = (unsigned)x;
            else if (rate) cfg.stream_write_rate = (double)x;
            else cfg.max_stream_buffer = x;
        } else if (!strcmp(a, "-v")) cfg.verbose = 1, i--;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "zllm-http: unknown option %s\n", a);
            s_usage(stderr);
            return 2;
        }
        i++;
    }
    if (!cfg.broker) {
        s_usage(stderr);
        return 2;
    }
    if (listen) {
        char *colon = strrchr(listen, ':');
        if (!colon) {
            fprintf(stderr, "zllm-http: --listen takes HOST:PORT\n");
            return 2;
        }
        *colon = 0;
        unsigned long long port;
        if (s_num("--listen's port", colon + 1, 0, 65535, &port)) return 2;
        cfg.port = (int)port;
        char *h = listen;
        if (h[0] == '[') {
            h++;
            h[strcspn(h, "]")] = 0;
        }
        cfg.host = h[0] ? h : "0.0.0.0";
    }
    cfg.api_key = key;
    if (!curve_server != !curve_key) {
        fprintf(stderr, "zllm-http: --curve-server-key and --curve-key go together\n");
        return 2;
    }
    if (curve_key) { /* read once: a missing or malformed key file fails at startup */
        if (zkey_read(curve_server, curve.server_pub, err, sizeof err) != 0 ||
            zkey_read(curve_key, curve.sec, err, sizeof err) != 0) {
            fprintf(stderr, "zllm-http: %s\n", err);
            return 2;
        }
        if (zmq_curve_public(curve.pub, curve.sec) != 0) {
            fprintf(stderr, "zllm-http: %s: %s\n", curve_key, zmq_strerror(zmq_errno()));
            return 2;
        }
        cfg.curve = &curve;
    }
    /* one descriptor per connection: allow as many as the hard limit */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    gw_server *s = gw_server_new(&cfg, err, sizeof err);
    if (!s) {
        fprintf(stderr, "zllm-http: %s\n", err);
        return 1;
    }
    if (gw_server_wait_broker(s, 3000) != 0) {
        const char *why = gw_server_broker_problem(s);
        fprintf(stderr, "zllm-http: no answer from the broker at %s yet%s%s: requests get 503 until it answers\n",
                cfg.broker, why[0] ? ": " : "", why);
    }
    int v6 = strchr(cfg.host, ':') != NULL;
    printf("listening http://%s%s%s:%d\n", v6 ? "[" : "", cfg.host, v6 ? "]" : "", gw_server_port(s));
    fflush(stdout);
    int rc = gw_server_run(s, &s_stop, err, sizeof err);
    if (rc != 0) fprintf(stderr, "zllm-http: %s\n", err);
    gw_server_destroy(&s);
    free(listen);
    free(key);
    return rc ? 1 : 0;
}
