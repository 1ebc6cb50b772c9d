/* http/gw_metrics.c: the gateway's Prometheus metrics (text exposition format 0.0.4): requests by model,
 * endpoint and HTTP status, prompt and generated tokens, time to first token, inter-token latency and
 * end-to-end latency histograms, open connections and requests in flight; and the broker's `status` (queue
 * depth, running sequences, KV slots, workers per model and state, its counters) exported beside them.
 * Models are labelled by the names the gateway resolved (at most GW_METRICS_MAX_MODELS; others share "other"),
 * so a client cannot grow the label set. */
#ifndef ZLLM_GW_METRICS_H
#define ZLLM_GW_METRICS_H
#include <stdint.h>
#include "gw_encode.h"
#include "proto.h"

#define GW_METRICS_MAX_MODELS 32

typedef struct gw_metrics gw_metrics;

gw_metrics *gw_metrics_new(void);
void gw_metrics_destroy(gw_metrics **m);

/* one finished request: endpoint "chat", "completions", "models", ...; status: the HTTP status, or 499 when
 * the client went away first */
void gw_metrics_request(gw_metrics *m, const char *model, const char *endpoint, int status);
void gw_metrics_tokens(gw_metrics *m, const char *model, uint32_t prompt_tokens, uint32_t generated_tokens);
void gw_metrics_ttft(gw_metrics *m, const char *model, double seconds);
void gw_metrics_itl(gw_metrics *m, const char *model, double seconds);
void gw_metrics_e2e(gw_metrics *m, const char *model, double seconds);
void gw_metrics_connections(gw_metrics *m, int delta); /* open HTTP connections */
void gw_metrics_inflight(gw_metrics *m, int delta);    /* generate requests at the broker */

/* Appends the exposition to out. st: the broker's last status reply (NULL when none); broker_up: 1 when it
 * answered recently. Returns 0 or -1 (out of memory). */
int gw_metrics_render(const gw_metrics *m, const proto_status *st, int broker_up, gw_buf *out);
#endif
