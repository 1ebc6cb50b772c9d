/* http/gw_broker.c: the gateway's one session with its broker: a DEALER socket that never blocks, so the
 * gateway's event loop can wait on it (gw_broker_fd) beside the HTTP connections. Requests are told apart by the
 * gateway's own ids (docs/protocol.md: any 1..64 bytes unique among the client's requests in flight).
 *
 * A socket monitor reports what happens to the connection (gw_broker_events): a dropped connection (every
 * request in flight at the broker is lost with it: a restarted broker, or one whose connection broke, knows
 * nothing of them) and a refused or failed handshake (CURVE), with a sentence saying why. */
#ifndef ZLLM_GW_BROKER_H
#define ZLLM_GW_BROKER_H
#include <stddef.h>
#include "proto.h"

typedef struct gw_broker gw_broker;

/* CURVE client keys (Z85, 40 characters each; docs/protocol.md): the broker's public key and this gateway's key
 * pair. */
typedef struct {
    char server_pub[41], pub[41], sec[41];
} gw_curve;

/* Connects to endpoint (asynchronously), with CURVE when curve is not NULL; NULL with a message on a bad
 * endpoint or key. */
gw_broker *gw_broker_new(const char *endpoint, const gw_curve *curve, char *err, size_t errlen);
void gw_broker_destroy(gw_broker **b);
/* ZeroMQ's notification descriptors of the socket and of its monitor (edge-triggered: drain gw_broker_events
 * and gw_broker_recv to 0 before waiting again) */
int gw_broker_fd(gw_broker *b);
int gw_broker_monitor_fd(gw_broker *b);
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

#define GW_BROKER_DROPPED 1 /* the connection dropped: what was in flight is lost */
#define GW_BROKER_REFUSED 2 /* a handshake failed or was refused: gw_broker_problem says why */
/* Reads the monitor's pending events without waiting: a mask of GW_BROKER_* seen since the last call. */
int gw_broker_events(gw_broker *b);
/* Why the connection does not come up, for error messages ("" when nothing is known to be wrong; cleared
 * once a handshake succeeds). */
const char *gw_broker_problem(const gw_broker *b);
#endif
