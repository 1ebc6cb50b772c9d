/* http/gw_metrics.c: Prometheus metrics of the gateway (see gw_metrics.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gw_metrics.h"

static const double s_ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                  0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double s_itl_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                 0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0};
static const double s_e2e_b[] = {0.1,  0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,  10.0,
                                 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
#define NB 19

typedef struct {
    uint64_t count[NB + 1]; /* per bucket (not cumulative); [NB] = +Inf only */
    uint64_t n;
    double sum;
} hist;

#define MAX_ENDPOINTS 8
#define MAX_STATUS 16
static const char *s_endpoints[MAX_ENDPOINTS] = {"chat",     "completions", "models",  "health",
                                                 "tokenize", "detokenize",  "metrics", "other"};

typedef struct {
    char name[PROTO_NAME_MAX + 1];
    uint64_t req[MAX_ENDPOINTS][MAX_STATUS];
    int status_code[MAX_STATUS]; /* the statuses seen, shared by the endpoints of this model */
    int n_status;
    uint64_t prompt_tokens, gen_tokens;
    hist ttft, itl, e2e;
} model_m;

struct gw_metrics {
    model_m models[GW_METRICS_MAX_MODELS + 1]; /* [GW_METRICS_MAX_MODELS] = "other" */
    int n_models;
    long connections, inflight;
};

gw_metrics *gw_metrics_new(void) {
    gw_metrics *m = calloc(1, sizeof *m);
    if (m) snprintf(m->models[GW_METRICS_MAX_MODELS].name, sizeof m->models[0].name, "other");
    return m;
}

void gw_metrics_destroy(gw_metrics **m) {
    if (!m || !*m) return;
    free(*m);
    *m = NULL;
}

static model_m *s_model(gw_metrics *m, const char *name) {
    for (int i = 0; i < m->n_models; i++)
        if (!strcmp(m->models[i].name, name)) return &m->models[i];
    if (m->n_models == GW_METRICS_MAX_MODELS || strlen(name) > PROTO_NAME_MAX) return &m->models[GW_METRICS_MAX_MODELS];
    model_m *x = &m->models[m->n_models++];
    snprintf(x->name, sizeof x->name, "%s", name);
    return x;
}

void gw_metrics_request(gw_metrics *m, const char *model, const char *endpoint, int status) {
    model_m *x = s_model(m, model);
    int e = MAX_ENDPOINTS - 1;
    for (int i = 0; i < MAX_ENDPOINTS; i++)
        if (!strcmp(s_endpoints[i], endpoint)) e = i;
    int s = -1;
    for (int i = 0; i < x->n_status; i++)
        if (x->status_code[i] == status) s = i;
    if (s < 0) {
        if (x->n_status == MAX_STATUS) return; /* more distinct statuses than the gateway sends */
        s = x->n_status++;
        x->status_code[s] = status;
    }
    x->req[e][s]++;
}

void gw_metrics_tokens(gw_metrics *m, const char *model, uint32_t prompt_tokens, uint32_t generated_tokens) {
    model_m *x = s_model(m, model);
    x->prompt_tokens += prompt_tokens;
    x->gen_tokens += generated_tokens;
}

static void s_observe(hist *h, const double *b, double v) {
    int i = 0;
    while (i < NB && v > b[i]) i++;
    h->count[i]++;
    h->n++;
    h->sum += v;
}

void gw_metrics_ttft(gw_metrics *m, const char *model, double s) { s_observe(&s_model(m, model)->ttft, s_ttft_b, s); }
void gw_metrics_itl(gw_metrics *m, const char *model, double s) { s_observe(&s_model(m, model)->itl, s_itl_b, s); }
void gw_metrics_e2e(gw_metrics *m, const char *model, double s) { s_observe(&s_model(m, model)->e2e, s_e2e_b, s); }
void gw_metrics_connections(gw_metrics *m, int delta) { m->connections += delta; }
void gw_metrics_inflight(gw_metrics *m, int delta) { m->inflight += delta; }

static void s_printf(gw_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_printf(gw_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) gw_buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* a label value with \, " and newline escaped (exposition format), NUL-terminated into dst */
static const char *s_label(const char *s, size_t n, char *dst, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 < cap; i++) {
        char c = s[i];
        if (c == '\\' || c == '"') dst[o++] = '\\', dst[o++] = c;
        else if (c == '\n') dst[o++] = '\\', dst[o++] = 'n';
        else dst[o++] = c;
    }
    dst[o] = 0;
    return dst;
}

static void s_hist(gw_buf *b, const char *name, const char *help, const gw_metrics *m, size_t off,
                   const double *bounds) {
    s_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i <= GW_METRICS_MAX_MODELS; i++) {
        const model_m *x = &m->models[i];
        if (i >= m->n_models && i != GW_METRICS_MAX_MODELS) continue;
        const hist *h = (const hist *)((const char *)x + off);
        if (i == GW_METRICS_MAX_MODELS && h->n == 0) continue;
        char lab[2 * PROTO_NAME_MAX + 8];
        s_label(x->name, strlen(x->name), lab, sizeof lab);
        uint64_t cum = 0;
        for (int k = 0; k < NB; k++) {
            cum += h->count[k];
            s_printf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, lab, bounds[k], (unsigned long long)cum);
        }
        s_printf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, lab, (unsigned long long)h->n);
        s_printf(b, "%s_sum{model=\"%s\"} %.9g\n%s_count{model=\"%s\"} %llu\n", name, lab, h->sum, name, lab,
                 (unsigned long long)h->n);
    }
}

int gw_metrics_render(const gw_metrics *m, const proto_status *st, int broker_up, gw_buf *b) {
    char lab[2 * PROTO_NAME_MAX + 8], lab2[2 * PROTO_NAME_MAX + 8], lab3[2 * PROTO_NAME_MAX + 8];
    s_printf(b, "# HELP zllm_http_requests_total HTTP requests answered, by model, endpoint and status "
                "(499: the client closed the connection first).\n# TYPE zllm_http_requests_total counter\n");
    for (int i = 0; i <= GW_METRICS_MAX_MODELS; i++) {
        if (i >= m->n_models && i != GW_METRICS_MAX_MODELS) continue;
        const model_m *x = &m->models[i];
        s_label(x->name, strlen(x->name), lab, sizeof lab);
        for (int e = 0; e < MAX_ENDPOINTS; e++)
            for (int s = 0; s < x->n_status; s++)
                if (x->req[e][s])
                    s_printf(b, "zllm_http_requests_total{model=\"%s\",endpoint=\"%s\",status=\"%d\"} %llu\n", lab,
                             s_endpoints[e], x->status_code[s], (unsigned long long)x->req[e][s]);
    }
    s_printf(b, "# HELP zllm_http_prompt_tokens_total Prompt tokens of finished generate requests.\n"
                "# TYPE zllm_http_prompt_tokens_total counter\n");
    for (int i = 0; i < m->n_models; i++)
        s_printf(b, "zllm_http_prompt_tokens_total{model=\"%s\"} %llu\n",
                 s_label(m->models[i].name, strlen(m->models[i].name), lab, sizeof lab),
                 (unsigned long long)m->models[i].prompt_tokens);
    s_printf(b, "# HELP zllm_http_generation_tokens_total Tokens generated for finished requests.\n"
                "# TYPE zllm_http_generation_tokens_total counter\n");
    for (int i = 0; i < m->n_models; i++)
        s_printf(b, "zllm_http_generation_tokens_total{model=\"%s\"} %llu\n",
                 s_label(m->models[i].name, strlen(m->models[i].name), lab, sizeof lab),
                 (unsigned long long)m->models[i].gen_tokens);
    s_hist(b, "zllm_http_time_to_first_token_seconds", "Time from the request to its first token.", m,
           offsetof(model_m, ttft), s_ttft_b);
    s_hist(b, "zllm_http_inter_token_latency_seconds", "Time between two streamed token messages.", m,
           offsetof(model_m, itl), s_itl_b);
    s_hist(b, "zllm_http_e2e_request_latency_seconds", "Time from the request to its last byte.", m,
           offsetof(model_m, e2e), s_e2e_b);
    s_printf(b,
             "# HELP zllm_http_connections Open HTTP connections.\n# TYPE zllm_http_connections gauge\n"
             "zllm_http_connections %ld\n",
             m->connections);
    s_printf(b,
             "# HELP zllm_http_requests_in_flight Generate requests at the broker.\n"
             "# TYPE zllm_http_requests_in_flight gauge\nzllm_http_requests_in_flight %ld\n",
             m->inflight);
    s_printf(b,
             "# HELP zllm_broker_up 1 when the broker answered a status request recently.\n"
             "# TYPE zllm_broker_up gauge\nzllm_broker_up %d\n",
             broker_up);
    if (st) {
        s_printf(b,
                 "# HELP zllm_broker_ready 1 when a worker is ready.\n# TYPE zllm_broker_ready gauge\n"
                 "zllm_broker_ready %d\n",
                 st->ready);
        s_printf(b,
                 "# HELP zllm_broker_queue_depth Requests waiting for a worker.\n"
                 "# TYPE zllm_broker_queue_depth gauge\nzllm_broker_queue_depth %u\n",
                 st->queue);
        s_printf(b,
                 "# HELP zllm_broker_requests_active Requests admitted to workers.\n"
                 "# TYPE zllm_broker_requests_active gauge\nzllm_broker_requests_active %u\n",
                 st->active);
        s_printf(b, "# HELP zllm_workers Workers per model and state.\n# TYPE zllm_workers gauge\n");
        for (uint32_t i = 0; i < st->n_models; i++) {
            uint32_t alive = 0, dead = 0;
            for (uint32_t w = 0; w < st->n_workers; w++)
                if (st->workers[w].model.n == st->models[i].n &&
                    !memcmp(st->workers[w].model.p, st->models[i].p, st->models[i].n))
                    st->workers[w].alive ? alive++ : dead++;
            s_label(st->models[i].p, st->models[i].n, lab, sizeof lab);
            s_printf(b, "zllm_workers{model=\"%s\",state=\"alive\"} %u\nzllm_workers{model=\"%s\",state=\"dead\"} %u\n",
                     lab, alive, lab, dead);
        }
        static const struct {
            const char *name, *help;
            size_t off;
        } wf[] = {
            {"zllm_worker_running_sequences", "Sequences in the worker's batch.", offsetof(proto_worker_info, running)},
            {"zllm_worker_kv_slots", "Sequence slots (KV cache) of the worker.", offsetof(proto_worker_info, n_slots)},
            {"zllm_worker_kv_slots_free", "Free sequence slots of the worker.",
             offsetof(proto_worker_info, free_slots)},
            {"zllm_worker_max_batch", "Sequences the worker batches per step.", offsetof(proto_worker_info, max_batch)},
            {"zllm_worker_context_tokens", "Tokens per sequence slot.", offsetof(proto_worker_info, n_ctx)},
        };
        for (size_t f = 0; f < sizeof wf / sizeof *wf; f++) {
            s_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", wf[f].name, wf[f].help, wf[f].name);
            for (uint32_t w = 0; w < st->n_workers; w++) {
                const proto_worker_info *wi = &st->workers[w];
                s_printf(b, "%s{model=\"%s\",worker=\"%s\",device=\"%s\"} %u\n", wf[f].name,
                         s_label(wi->model.p, wi->model.n, lab, sizeof lab),
                         s_label(wi->name.p, wi->name.n, lab2, sizeof lab2),
                         s_label(wi->device.p, wi->device.n, lab3, sizeof lab3),
                         *(const uint32_t *)((const char *)wi + wf[f].off));
            }
        }
        s_printf(b, "# HELP zllm_worker_up 1 while the broker counts the worker alive.\n# TYPE zllm_worker_up gauge\n");
        for (uint32_t w = 0; w < st->n_workers; w++) {
            const proto_worker_info *wi = &st->workers[w];
            s_printf(b, "zllm_worker_up{model=\"%s\",worker=\"%s\",device=\"%s\"} %d\n",
                     s_label(wi->model.p, wi->model.n, lab, sizeof lab),
                     s_label(wi->name.p, wi->name.n, lab2, sizeof lab2),
                     s_label(wi->device.p, wi->device.n, lab3, sizeof lab3), wi->alive);
        }
        for (uint32_t i = 0; i < st->n_counters; i++) {
            char name[96];
            size_t o = 0;
            for (uint32_t k = 0; k < st->counters[i].name.n && o < 64; k++) {
                char c = st->counters[i].name.p[k];
                name[o++] = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ? c : '_';
            }
            name[o] = 0;
            s_printf(b,
                     "# HELP zllm_broker_%s_total The broker's `%s` status counter.\n"
                     "# TYPE zllm_broker_%s_total counter\nzllm_broker_%s_total %llu\n",
                     name, name, name, name, (unsigned long long)st->counters[i].value);
        }
    }
    return b->failed ? -1 : 0;
}
