/* broker/bk_zap.h: CURVE keys (Z85 files) and a fail-closed ZAP handler with a client-key allow-list. */
#ifndef ZLLM_BK_ZAP_H
#define ZLLM_BK_ZAP_H
#include <stddef.h>
#include <stdint.h>

#define BK_ZAP_DOMAIN "zllm"
#define BK_ZAP_DOMAIN_WORKERS "zllm-workers"   /* the worker socket's domain when workers have their own list */

typedef struct bk_zap bk_zap;

/* Binds the ZAP REP socket (inproc://zeromq.zap.01) in ctx and loads every *.pub file of allow_dir.
 * Must be called before any CURVE socket binds. NULL with a message on failure (including an empty
 * allow-list: failing closed at startup is better than a server nobody can use by mistake). */
bk_zap *bk_zap_new(void *ctx, const char *allow_dir, char *err, size_t errlen);
/* Loads every *.pub of dir as a second allow-list that only the ZAP domain BK_ZAP_DOMAIN_WORKERS accepts (and
 * that domain accepts nothing else): the worker socket's keys, kept apart from the clients' so that a client key
 * cannot register a worker. 0, or -1 with a message (unreadable directory, no keys, bad key file). */
int bk_zap_add_workers(bk_zap *z, const char *dir, char *err, size_t errlen);
/* The REP socket, for zmq_poll. */
void *bk_zap_socket(bk_zap *z);
/* Answers every pending ZAP request (non-blocking): 200 only for mechanism CURVE, domain "zllm" and a key in
 * the allow-list (or domain "zllm-workers" and a key in the workers' list, when one was added); 400 for anything else, including malformed requests. Returns the number of requests handled. */
int bk_zap_handle(bk_zap *z);
/* counts of accepted / refused handshakes */
uint64_t bk_zap_accepted(const bk_zap *z);
uint64_t bk_zap_refused(const bk_zap *z);
void bk_zap_destroy(bk_zap **z);
#endif
