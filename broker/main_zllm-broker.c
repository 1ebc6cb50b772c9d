/* broker/main_zllm-broker.c: the zllm-broker command (see broker/broker.h and docs/protocol.md).
 *   zllm-broker --clients EP --workers EP --model [NAME=]PATH.gguf [--model ...] [--queue N] [--queue-tokens N]
 *               [--client-hwm N] [--drain-ms MS] [--heartbeat-ms MS] [--dead-ms MS] [--hang-ms MS]
 *               [--curve-secret FILE --curve-allow DIR [--curve-workers [--curve-allow-workers DIR]]]
 *               [--insecure-tcp-workers] [--max-workers-per-model N] [--chat-render MODE] [-v]
 *   zllm-broker --keygen PREFIX        writes PREFIX.key (Z85 secret) and PREFIX.pub (Z85 public)
 *   zllm-broker --help | --version     the full usage (every option, its range and default) / `zllm-broker VERSION` */
#include "broker.h"
#include "bk_zap.h"
#include "chat.h"
#include "version.h"
#include "zkey.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the full usage: every option with its default; f is stdout for --help, stderr after a usage error */
static void usage(FILE *f) {
    fprintf(
        f,
        "usage: zllm-broker --clients ENDPOINT --workers ENDPOINT --model [NAME=]PATH.gguf [--model ...] [options]\n"
        "       zllm-broker --keygen PREFIX\n"
        "       zllm-broker --help | --version\n"
        "\n"
        "Routes clients' requests to workers (docs/protocol.md). Prints `clients EP` and `workers EP` once bound.\n"
        "  --clients EP            ZeroMQ endpoint clients connect to (required), e.g. tcp://127.0.0.1:5555\n"
        "  --workers EP            ZeroMQ endpoint workers connect to (required), e.g. tcp://127.0.0.1:5556\n"
        "  -m, --model [NAME=]PATH a model served (vocabulary and context length read from the GGUF); NAME\n"
        "                          defaults to the file's base name without .gguf; repeat for more (at most %d);\n"
        "                          the first is the default model\n"
        "  --queue N               requests waiting, all models together, 1..16777216 (default 1024)\n"
        "  --queue-tokens N        prompt tokens waiting, all models together, >= 1 (default 4194304)\n"
        "  --client-hwm N          messages queued to one client before its requests are cancelled,\n"
        "                          1..16777216 (default 10000)\n"
        "  --drain-ms MS           SIGTERM drain deadline, 0..86400000 (default 10000)\n"
        "  --heartbeat-ms MS       broker -> worker heartbeat interval, 10..60000 (default 500)\n"
        "  --dead-ms MS            a worker silent this long is dead, 50..600000 (default 2500)\n"
        "  --hang-ms MS            a worker holding work whose step does not move this long is hung,\n"
        "                          50..600000 (default 2500)\n"
        "  --curve-secret FILE     Z85 secret key: the client socket becomes a CURVE server (default off)\n"
        "  --curve-allow DIR       allowed client public keys, DIR/*.pub (required with --curve-secret)\n"
        "  --curve-workers         the worker socket requires CURVE too (default off)\n"
        "  --curve-allow-workers DIR  allowed worker public keys (default: the --curve-allow list)\n"
        "  --insecure-tcp-workers  accept a tcp:// --workers endpoint without --curve-workers: any process that\n"
        "                          reaches the port can register as a worker and read every prompt (loopback\n"
        "                          test setups only; default: refused)\n"
        "  --max-workers-per-model N  workers registered per model, 1..1024 (default 64); past it a worker\n"
        "                          that has never served gives way to a new one\n"
        "  --keygen PREFIX         write PREFIX.key (secret, mode 0600) and PREFIX.pub, then exit\n"
        "  --chat-render MODE      chat templates: auto (default: the file's Jinja template, the hand-written\n"
        "                          family where it uses a construct the interpreter lacks, logged with -v),\n"
        "                          jinja (the interpreter only) or builtin (the hand-written families only)\n"
        "  --route MODE            cache (default): a request goes to the worker holding the longest prefix of\n"
        "                          its prompt (block hashes the workers report, docs/kv-cache.md); load: to the\n"
        "                          worker with the most free slots\n"
        "  --route-slack N|auto    cache routing gives way to load when the longest prefix's worker holds more\n"
        "                          than N sequences beyond the least loaded worker, 0..1048576; auto (default):\n"
        "                          a quarter of the largest worker's slots, at least 1\n"
        "  -v, --verbose           log events to stderr (default off)\n"
        "  -h, --help              this text;  --version  print the version\n"
        "Environment: none read.\n"
        "Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 on a runtime error, 2 on a usage error.\n",
        BK_MAX_MODELS);
}

static int parse_u32(const char *s, uint32_t *out, uint32_t lo, uint32_t hi) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (uint32_t)v;
    return 0;
}

int main(int argc, char **argv) {
    bk_config c;
    char err[512];
    broker_config_defaults(&c);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--keygen") && v) {
            if (zkey_generate(v, err, sizeof err) != 0) {
                fprintf(stderr, "zllm-broker: %s\n", err);
                return 1;
            }
            printf("%s.key %s.pub\n", v, v);
            return 0;
        } else if (!strcmp(a, "--clients") && v) { c.clients_ep = v; i++; }
        else if (!strcmp(a, "--workers") && v) { c.workers_ep = v; i++; }
        else if ((!strcmp(a, "--model") || !strcmp(a, "-m")) && v) {
            if (c.n_models >= BK_MAX_MODELS) { fprintf(stderr, "zllm-broker: too many models\n"); return 2; }
            const char *eq = strchr(v, '=');
            if (eq) {
                size_t n = (size_t)(eq - v);
                char *name = malloc(n + 1);
                if (!name) return 1;
                memcpy(name, v, n);
                name[n] = 0;
                c.model_names[c.n_models] = name;
                c.model_paths[c.n_models++] = eq + 1;
            } else {
                c.model_paths[c.n_models++] = v;
            }
            i++;
        }
        else if (!strcmp(a, "--queue") && v) { bad = parse_u32(v, &c.queue_max, 1, 1u << 24); i++; }
        else if (!strcmp(a, "--queue-tokens") && v) {
            uint32_t qt;
            bad = parse_u32(v, &qt, 1, UINT32_MAX);
            c.queue_tokens = qt;
            i++;
        }
        else if (!strcmp(a, "--client-hwm") && v) { bad = parse_u32(v, &c.client_hwm, 1, 1u << 24); i++; }
        else if (!strcmp(a, "--drain-ms") && v) { bad = parse_u32(v, &c.drain_ms, 0, 86400000u); i++; }
        else if (!strcmp(a, "--heartbeat-ms") && v) { bad = parse_u32(v, &c.heartbeat_ms, 10, 60000); i++; }
        else if (!strcmp(a, "--dead-ms") && v) { bad = parse_u32(v, &c.dead_ms, 50, 600000); i++; }
        else if (!strcmp(a, "--hang-ms") && v) { bad = parse_u32(v, &c.hang_ms, 50, 600000); i++; }
        else if (!strcmp(a, "--curve-secret") && v) { c.curve_secret = v; i++; }
        else if (!strcmp(a, "--curve-allow") && v) { c.curve_allow = v; i++; }
        else if (!strcmp(a, "--curve-workers")) c.curve_workers = 1;
        else if (!strcmp(a, "--curve-allow-workers") && v) {
            c.curve_allow_workers = v;
            i++;
        } else if (!strcmp(a, "--chat-render") && v) {
            int mode = chat_mode_parse(v);
            bad = mode < 0;
            if (!bad) chat_set_mode(mode);
            i++;
        } else if (!strcmp(a, "--insecure-tcp-workers")) c.insecure_tcp_workers = 1;
        else if (!strcmp(a, "--max-workers-per-model") && v) {
            bad = parse_u32(v, &c.max_workers, 1, 1024);
            i++;
        } else if (!strcmp(a, "--route") && v) {
            bad = strcmp(v, "cache") && strcmp(v, "load");
            c.route_cache = !strcmp(v, "cache");
            i++;
        } else if (!strcmp(a, "--route-slack") && v) {
            uint32_t slack = 0;
            bad = strcmp(v, "auto") && parse_u32(v, &slack, 0, 1u << 20);
            c.route_slack = strcmp(v, "auto") ? (int32_t)slack : -1;
            i++;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) c.verbose = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("zllm-broker %s\n", ZLLM_VERSION);
            return 0;
        } else bad = 1;
        if (bad) {
            fprintf(stderr, "zllm-broker: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!c.clients_ep || !c.workers_ep || c.n_models == 0) {
        usage(stderr);
        return 2;
    }
    broker *b = broker_new(&c, err, sizeof err);
    if (!b) { fprintf(stderr, "zllm-broker: %s\n", err); return 1; }
    /* the bound endpoints (tcp port 0 resolved) on stdout, for scripts and tests */
    printf("clients %s\nworkers %s\n", broker_clients_endpoint(b), broker_workers_endpoint(b));
    fflush(stdout);
    int rc = broker_run(b, err, sizeof err);
    if (rc != 0) fprintf(stderr, "zllm-broker: %s\n", err);
    broker_destroy(&b);
    for (int i = 0; i < c.n_models; i++) free((void *)c.model_names[i]);
    return rc == 0 ? 0 : 1;
}
