/* http/gw_broker.c: the gateway's one session with its broker: a DEALER socket that never blocks, so the
 * gateway's event loop can wait on it (gw_broker_fd) beside the HTTP connections. Requests are told apart by the
 * gateway's own ids (docs/protocol.md: any 1..64 bytes unique among the client's requests in flight). */
#ifndef ZLLM_GW_BROKER_H
#define ZLLM_GW_BROKER_H
#include <stddef.h>
#include "proto.h"

typedef struct gw_broker gw_broker;

/* Connects to endpoint (asynchronously); NULL with a message on a bad endpoint. */
gw_broker *gw_broker_new(const char *endpoint, char *err, size_t errlen);
void gw_broker_destroy(gw_broker **b);
/* ZeroMQ's notification descriptor (edge-triggered: drain gw_broker_recv to 0 before waiting again) */
int gw_broker_fd(gw_broker *b);
/* Send without waiting: 0, or -1 when the broker is not connected or the send queue is full; submit returns
 * -2 when the encoded request exceeds the broker's client frame limit (PROTO_CLIENT_MAX_FRAME). */
int gw_broker_submit(gw_broker *b, const proto_generate *g);
int gw_broker_cancel(gw_broker *b, const char *id);
int gw_broker_status(gw_broker *b);
/* Next message without waiting: 1 with *m (valid until the next recv), 0 when none, -1 on a socket error.
 * Malformed messages are skipped. */
int gw_broker_recv(gw_broker *b, const proto_msg **m);
/* the raw bytes of the message *m of the last gw_broker_recv (for keeping a copy) */
const void *gw_broker_frame(gw_broker *b, size_t *len);
#endif
