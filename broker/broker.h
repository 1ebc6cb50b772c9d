/* broker/broker.h: the zllm broker: a client ROUTER and a worker ROUTER in one single-threaded poll loop.
 * Tokenizes prompts, admits requests against workers' free sequence slots, streams detokenized text back,
 * enforces deadlines, detects dead/hung workers, drains on SIGTERM. docs/protocol.md is the contract.
 *
 * KV policy (STYLE-AND-RELIABILITY B.7.7): reservation at admission, no preemption. A worker advertises n_slots
 * sequence slots of n_ctx tokens each; a request takes one whole slot from assignment to its end, and is only
 * assigned to a worker whose n_ctx >= prompt + max_tokens. A request that fits no worker (and not the model's
 * context) is rejected at validation with prompt_too_long; otherwise it waits in its model's bounded queue,
 * by priority and FIFO within one, and goes to the worker holding the longest prefix of its prompt unless load
 * says otherwise (docs/kv-cache.md). Nothing is ever preempted, so a running sequence never loses its KV. */
#ifndef ZLLM_BROKER_H
#define ZLLM_BROKER_H
#include <stddef.h>
#include <stdint.h>

#define BK_MAX_MODELS 16

typedef struct {
    const char *clients_ep;       /* bind endpoint for clients, e.g. tcp://127.0.0.1:5555 */
    const char *workers_ep;       /* bind endpoint for workers */
    const char *model_names[BK_MAX_MODELS]; /* NULL = basename of the path without .gguf */
    const char *model_paths[BK_MAX_MODELS]; /* GGUF files (vocabulary + context length) */
    int n_models;
    uint32_t queue_max;           /* requests waiting, all models together (default 1024) */
    uint64_t queue_tokens;        /* prompt tokens waiting, all models together (default 4M) */
    uint32_t drain_ms;            /* SIGTERM drain deadline (default 10000) */
    uint32_t heartbeat_ms;        /* broker -> worker heartbeat interval (default 500) */
    uint32_t dead_ms;             /* worker silent this long = dead (default 2500) */
    uint32_t hang_ms;             /* step counter still this long while holding work = hung (default 2500) */
    uint32_t client_hwm;          /* messages queued to one client before it counts as not reading: its
                                     streams are cancelled (default 10000) */
    const char *curve_secret;     /* Z85 secret key file: enables CURVE on the client socket, or NULL */
    const char *curve_allow;      /* directory of allowed client *.pub files (required with curve_secret) */
    int curve_workers;            /* 1: the worker socket requires CURVE too (same allow-list) */
    const char *curve_allow_workers; /* with curve_workers: directory of allowed worker *.pub files, a list of
                                        their own (client keys then cannot register workers), or NULL */
    int insecure_tcp_workers;        /* 1: accept a tcp:// worker endpoint without CURVE (loopback tests only: any
                                     process that reaches the port can register as a worker, read every prompt's
                                     token ids and answer them); 0: broker_new refuses that configuration */
    uint32_t max_workers;            /* workers per model (default 64; at most 1024 over all models): see
                                     broker.c's worker_admit for who is evicted when a model's table is full */
    int route_cache;                 /* 1 (default): cache-aware routing (docs/kv-cache.md); 0: most free slots */
    int32_t route_slack;             /* cache-aware routing gives way to load when the longest prefix's worker holds
                                        more than this many sequences beyond the least loaded one; -1 (default):
                                        a quarter of the largest candidate worker's slots, at least 1 */
    int verbose;                  /* 1: log events to stderr */
} bk_config;

typedef struct broker broker;

/* Fills defaults (everything zero except the numeric defaults above). */
void broker_config_defaults(bk_config *c);
/* Loads the models' vocabularies, binds the sockets. NULL with a message on failure, which includes a tcp://
 * worker endpoint without CURVE unless insecure_tcp_workers is set. The ipc:// worker socket file is made 0600
 * (only the broker's user can connect); a missing parent directory is created 0700, an existing one that others
 * may write to (without the sticky bit) is refused. */
broker *broker_new(const bk_config *c, char *err, size_t errlen);
/* Runs until SIGTERM/SIGINT has drained (installs the handlers). Returns 0 on a clean drain, -1 on a fatal
 * socket error (message in err). */
int broker_run(broker *b, char *err, size_t errlen);
void broker_destroy(broker **b);
/* The endpoint the client socket actually bound (resolves tcp port 0), or "". */
const char *broker_clients_endpoint(const broker *b);
const char *broker_workers_endpoint(const broker *b);
#endif
