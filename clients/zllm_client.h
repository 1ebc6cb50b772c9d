/* clients/zllm_client.h: the C client library of zllm: connect to a broker, submit requests, receive streamed
 * tokens and finals, cancel, ask for status, close. One DEALER socket; any number of requests in flight,
 * told apart by their request ids (docs/protocol.md). Not thread-safe: one client per thread. A generate with n > 1
 * gets one final per completion (final.index); it has ended with the final whose `left` is 0. A generate with
 * sampling.prompt_lp gets its prompt positions' logprobs first, in PROTO_PROMPT_LPS messages (m->plps: positions
 * [start, start + n_ids) in order, position 0 nil), before its first token and its final.
 *
 *     zllm_client *c = zllm_client_new("tcp://127.0.0.1:5555", err, sizeof err);
 *     proto_generate g; proto_generate_defaults(&g);
 *     g.id = proto_cstr("r1"); g.prompt_kind = PROTO_PROMPT_TEXT; g.prompt = proto_cstr("Hello");
 *     zllm_client_submit(c, &g, err, sizeof err);
 *     const proto_msg *m;
 *     while (zllm_client_recv(c, 1000, &m, err, sizeof err) == 1) { ... m->type == PROTO_TOKEN / PROTO_FINAL ... }
 *     zllm_client_destroy(&c);
 */
#ifndef ZLLM_CLIENT_H
#define ZLLM_CLIENT_H
#include <stddef.h>
#include "proto.h"

typedef struct zllm_client zllm_client;

/* Connects (asynchronously: the broker may come up later). Returns NULL with a message on a bad endpoint or out
 * of memory. */
zllm_client *zllm_client_new(const char *endpoint, char *err, size_t errlen);
/* Closes the socket (pending messages are dropped); idempotent; sets *c to NULL. */
void zllm_client_destroy(zllm_client **c);

/* Sends a generate (g->id must be set). Waits at most send_timeout_ms (default 5000) for a connection.
 * Returns 0, or -1 with a message (encoding failed, over PROTO_CLIENT_MAX_FRAME: "too_large: ...", broker
 * unreachable). */
int zllm_client_submit(zllm_client *c, const proto_generate *g, char *err, size_t errlen);
/* Sends a cancel for id. Returns 0 or -1 with a message. */
int zllm_client_cancel(zllm_client *c, const char *id, char *err, size_t errlen);
/* Sends a status request (id echoed in the reply; may be NULL). Returns 0 or -1. */
int zllm_client_status(zllm_client *c, const char *id, char *err, size_t errlen);

/* Waits up to timeout_ms (0: do not wait, -1: forever) for the next message from the broker and decodes it.
 * Returns 1 with *msg set (valid until the next zllm_client_recv or destroy), 0 on timeout, -1 on a socket
 * error or, while generates are in flight, when the connection dropped ("broker_unreachable: ...", within about
 * 3 s of the broker's death) or another broker instance answers ("broker_restarted: ..."): their finals will
 * never come. Undecodable messages are counted (zllm_client_bad_messages) and skipped. */
int zllm_client_recv(zllm_client *c, int timeout_ms, const proto_msg **msg, char *err, size_t errlen);
/* The broker instance id of the last reply ("" before any). */
const char *zllm_client_broker_instance(const zllm_client *c);
/* messages from the broker that were malformed and skipped */
unsigned long zllm_client_bad_messages(const zllm_client *c);
/* sets how long a submit may wait for the connection (ms) */
void zllm_client_set_send_timeout(zllm_client *c, int ms);
#endif
