/* http/gw_session.c: the requests at the broker (see gw_internal.h): model resolution against the broker's
 * status, the gateway-made request ids ("g<slot>.<generation>"), submission, and the broker's token, final and
 * error messages turned into SSE events or complete responses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "gw_internal.h"
#include "tokenizer.h"

const proto_status *gw_session_status(const gw_server *s) { return s->has_status ? &s->st_msg.status : NULL; }

int gw_session_broker_up(const gw_server *s) {
    return s->has_status && !s->link_down && gw_now() - s->t_status_recv < BROKER_DOWN_MS / 1e3;
}

/* "the broker is unreachable" and, when the connection's monitor knows, why (a refused CURVE key ...) */
void gw_session_unreachable(const gw_server *s, gw_error *e) {
    const char *why = gw_broker_problem(s->broker);
    gw_error_set(e, 503, "service_unavailable", NULL, "broker_unreachable", "the broker at %.200s is unreachable%s%s",
                 s->cfg.broker, why[0] ? ": " : "", why);
}

static int s_broker_has_model(const gw_server *s, const char *name) {
    const proto_status *st = gw_session_status(s);
    for (uint32_t i = 0; st && i < st->n_models; i++)
        if (proto_str_eq(st->models[i], name)) return 1;
    return 0;
}

int gw_session_alive_workers(const gw_server *s, const char *model) {
    const proto_status *st = gw_session_status(s);
    int n = 0;
    for (uint32_t i = 0; st && i < st->n_workers; i++)
        if (st->workers[i].alive && proto_str_eq(st->workers[i].model, model)) n++;
    return n;
}

/* the broker model behind the client's name, into out; 0, or -1 with e (404) */
static int s_resolve_model(const gw_server *s, const char *name, char *out, size_t cap, gw_error *e) {
    const proto_status *st = gw_session_status(s);
    if (s->cfg.n_alias > 0) {
        for (int i = 0; i < s->cfg.n_alias; i++) {
            if (name[0] && strcmp(s->cfg.alias[i], name)) continue;
            const char *t = s->cfg.target[i];
            if (!t[0] && st && st->n_models >= 1) {
                proto_str_copy(st->models[0], out, cap);
                return 0;
            }
            snprintf(out, cap, "%s", t);
            return 0;
        }
    } else if (!name[0]) {
        if (st && st->n_models >= 1) proto_str_copy(st->models[0], out, cap);
        else out[0] = 0;
        return 0;
    } else if (!st || s_broker_has_model(s, name)) {
        snprintf(out, cap, "%s", name);
        return 0;
    }
    return gw_error_set(e, 404, "not_found_error", "model", "model_not_found", "The model '%.128s' does not exist",
                        name);
}

static int s_slot_take(gw_server *s, gw_conn *c) {
    if (s->n_free == 0) {
        int n = s->n_slots ? s->n_slots * 2 : 1024;
        gw_conn **sl = realloc(s->slots, (size_t)n * sizeof *sl);
        if (!sl) return -1;
        s->slots = sl;
        uint32_t *g = realloc(s->gens, (size_t)n * sizeof *g);
        if (!g) return -1;
        s->gens = g;
        int *f = realloc(s->free_slots, (size_t)n * sizeof *f);
        if (!f) return -1;
        s->free_slots = f;
        for (int i = n - 1; i >= s->n_slots; i--) {
            s->slots[i] = NULL;
            s->gens[i] = 0;
            s->free_slots[s->n_free++] = i;
        }
        s->n_slots = n;
    }
    int i = s->free_slots[--s->n_free];
    s->slots[i] = c;
    s->gens[i]++;
    c->slot = i;
    snprintf(c->bid, sizeof c->bid, "g%d.%u", i, s->gens[i]);
    return 0;
}

static void s_slot_give(gw_server *s, gw_conn *c) {
    if (c->slot < 0) return;
    c->deferred = 0; /* a connection whose slot is given back is resumed by whoever gives it back */
    s->slots[c->slot] = NULL;
    s->free_slots[s->n_free++] = c->slot;
    c->slot = -1;
}

/* the request a broker id names, or NULL (finished, or not ours) */
static gw_conn *s_slot_find(gw_server *s, proto_str id) {
    char tmp[32];
    if (id.n < 2 || id.n >= sizeof tmp || id.p[0] != 'g') return NULL;
    proto_str_copy(id, tmp, sizeof tmp);
    char *end;
    long i = strtol(tmp + 1, &end, 10);
    if (*end != '.' || i < 0 || i >= s->n_slots) return NULL;
    unsigned long g = strtoul(end + 1, &end, 10);
    if (*end || !s->slots[i] || s->gens[i] != g) return NULL;
    return s->slots[i];
}

/* the request leaves the broker (final received, or cancelled by us) */
static void s_leave_broker(gw_conn *c) {
    if (!c->at_broker) return;
    c->at_broker = 0;
    gw_metrics_inflight(c->srv->metrics, -1);
}

static void s_final_error(const proto_final *f, gw_error *e) {
    char msg[256];
    proto_str_copy(f->message, msg, sizeof msg);
    const char *code = proto_code_name(f->code);
    int status = 500;
    const char *type = "server_error";
    switch (f->code) {
    case PROTO_CODE_BAD_REQUEST:
    case PROTO_CODE_PROMPT_TOO_LONG:
    case PROTO_CODE_TEMPLATE_ERROR:
    case PROTO_CODE_NO_CAPACITY: status = 400, type = "invalid_request_error"; break;
    case PROTO_CODE_TOO_LARGE: status = 413, type = "invalid_request_error"; break;
    case PROTO_CODE_UNKNOWN_MODEL: status = 404, type = "not_found_error", code = "model_not_found"; break;
    case PROTO_CODE_OVERLOADED: status = 429, type = "rate_limit_error"; break;
    case PROTO_CODE_TIMEOUT: status = 504, type = "timeout_error"; break;
    case PROTO_CODE_WORKER_FAILED:
    case PROTO_CODE_SHUTTING_DOWN:
    case PROTO_CODE_BROKER_RESTARTED:
    case PROTO_CODE_BROKER_UNREACHABLE: status = 503, type = "service_unavailable"; break;
    default:
        if (f->finish == PROTO_FINISH_OVERLOADED) status = 429, type = "rate_limit_error", code = "overloaded";
        else if (f->finish == PROTO_FINISH_TIMEOUT) status = 504, type = "timeout_error", code = "timeout";
        else if (f->finish == PROTO_FINISH_CANCELLED) status = 503, type = "service_unavailable", code = "cancelled";
        break;
    }
    gw_error_set(e, status, type, NULL, code[0] ? code : NULL, "%s", msg[0] ? msg : (code[0] ? code : "error"));
}

/* the SSE stream starts: a 200 is queued when libmicrohttpd next calls the handler */
static void s_start_stream(gw_conn *c) {
    if (c->started) return;
    c->started = 1;
    c->state = S_STREAM;
    double t = gw_now();
    gw_metrics_ttft(c->srv->metrics, c->model, t - c->t0);
    c->t_last = t;
}

/* a client that does not read its stream: the request is cancelled and the connection closed, so that the
 * gateway's memory stays bounded (the kernel's send buffer is bounded too, see s_accept) */
static void s_slow_reader(gw_conn *c) {
    gw_server *s = c->srv;
    gw_broker_cancel(s->broker, c->bid);
    s_leave_broker(c);
    gw_conn_count(c, 499);
    gw_conn_unwatch(c);
    c->gone = 1;
    s_slot_give(s, c);
    gw_buf_free(&c->out);
    c->out_off = 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) shutdown(ci->connect_fd, SHUT_RDWR); /* libmicrohttpd sees the error and closes it */
    gw_conn_resume(c);
}

/* a stream's later tokens: its connection is resumed after the first tokens, finals and errors of the same
 * turn have been written (gw_session_resume_deferred), so that a stream's first token does not wait behind the
 * writes of a thousand running streams, and no sooner than its share of the write rate allows (gw_config): each
 * write is a segment that the kernel delivers and a wake-up of the client, most of the gateway's CPU per write,
 * so tokens that come faster than a stream's share leave together in one */
static void s_defer(gw_conn *c) {
    gw_server *s = c->srv;
    if (!c->suspended || c->deferred) return;
    if (s->n_defer == s->cap_defer) {
        int n = s->cap_defer ? s->cap_defer * 2 : 1024;
        int *d = realloc(s->defer, (size_t)n * sizeof *d);
        if (!d) {
            gw_conn_resume(c);
            return;
        }
        s->defer = d;
        s->cap_defer = n;
    }
    c->deferred = 1;
    s->defer[s->n_defer++] = c->slot;
}

int gw_session_resume_deferred(gw_server *s, int max, double now) {
    /* a stream's share of the write rate: with R requests in flight, one write every R / rate seconds */
    const double gap = s->cfg.stream_write_rate > 0 ? (s->n_slots - s->n_free) / s->cfg.stream_write_rate : 0;
    int kept = 0, ready = 0, resumed = 0;
    s->t_defer_due = HUGE_VAL;
    for (int i = 0; i < s->n_defer; i++) {
        gw_conn *c = gw_session_slot(s, s->defer[i]);
        if (!c || !c->deferred) continue; /* ended since (its slot is free or taken by another request) */
        const double due = c->t_wrote + gap;
        if (due <= now && resumed < max) {
            c->deferred = 0;
            c->t_wrote = now;
            gw_conn_resume(c);
            resumed++;
            continue;
        }
        if (due <= now) ready++;
        else if (due < s->t_defer_due) s->t_defer_due = due;
        s->defer[kept++] = s->defer[i]; /* the rest keep their order, ahead of the streams deferred later */
    }
    s->n_defer = kept;
    return ready;
}

/* releases c's echo and prompt_logprobs state */
static void s_echo_free(gw_conn *c) {
    free(c->echo_text);
    c->echo_text = NULL;
    for (int i = 0; i < PROTO_MAX_N; i++) {
        json_decref(c->echo_lp[i]);
        c->echo_lp[i] = NULL;
    }
    json_decref(c->plp_list);
    c->plp_list = NULL;
}

/* a choice's first stream event with echo: the prompt's text and, with logprobs, its tokens' logprobs */
static void s_echo_delta(gw_conn *c, uint32_t ix) {
    json_t *lp = c->echo_lp[ix];
    c->echo_lp[ix] = NULL;
    gw_sse_delta(&c->out, &c->resp, ix, c->echo_text ? c->echo_text : "", c->echo_len, 1, lp);
    c->choice_started |= 1u << ix;
}

/* a `prompt_logprobs` message (before the choice's first token): the echo's logprobs of its prompt tokens, and the
 * extension's list (choice 0's: every choice has the same) */
static void s_on_plps(gw_conn *c, const proto_plps *p) {
    const uint32_t ix = p->index < c->n_choices ? p->index : 0;
    proto_logprob clip[PROTO_PLP_CHUNK];
    const uint32_t n = p->n_ids < PROTO_PLP_CHUNK ? p->n_ids : PROTO_PLP_CHUNK;
    if (c->echo && c->echo_top >= 0) {
        for (uint32_t i = 0; i < n; i++) {
            clip[i] = p->lps[i];
            if (clip[i].n_top > (uint32_t)c->echo_top) clip[i].n_top = (uint32_t)c->echo_top;
        }
        json_t *lp = gw_encode_logprobs(&c->resp, c->tok, p->ids, clip, n, &c->text_off[ix]);
        if (lp && !c->echo_lp[ix]) c->echo_lp[ix] = lp;
        else if (lp) {
            (void)gw_logprobs_concat(c->echo_lp[ix], lp);
            json_decref(lp);
        }
    }
    if (c->plp_ext >= 0 && ix == 0) {
        if (!c->plp_list) c->plp_list = json_array();
        if (c->plp_list) (void)gw_encode_prompt_logprobs(c->plp_list, c->tok, p->ids, p->lps, n, (uint32_t)c->plp_ext);
    }
}

static void s_on_token(gw_conn *c, const proto_token *t) {
    if (!c->stream) return;
    if (c->out.n - c->out_off > c->srv->cfg.max_stream_buffer) {
        s_slow_reader(c);
        return;
    }
    const uint32_t ix = t->index < c->n_choices ? t->index : 0;
    int first = !(c->choice_started >> ix & 1);
    if (c->started) {
        double now = gw_now();
        gw_metrics_itl(c->srv->metrics, c->model, now - c->t_last);
        c->t_last = now;
    }
    s_start_stream(c);
    int space = 0; /* an echo: the space SentencePiece's first completion token had, between prompt and text */
    if (first && c->echo) {
        s_echo_delta(c, ix);
        first = 0;
        space = t->n_ids && gw_token_space(c->tok, t->ids[0]) && !(t->text.n && t->text.p[0] == ' ');
    }
    json_t *lp =
        c->logprobs && t->lps ? gw_encode_logprobs(&c->resp, c->tok, t->ids, t->lps, t->n_ids, &c->text_off[ix]) : NULL;
    if (space) gw_sse_delta(&c->out, &c->resp, ix, " ", 1, 0, NULL);
    if (first || t->text.n || lp) {
        gw_sse_delta(&c->out, &c->resp, ix, t->text.p ? t->text.p : "", t->text.n, first, lp);
        c->choice_started |= 1u << ix;
    }
    if (first) {
        gw_conn_cork(c); /* the headers and the first chunk */
        c->t_wrote = gw_now();
        gw_conn_resume(c);
    } else {
        s_defer(c);
    }
}

static void s_on_final(gw_conn *c, const proto_final *f) {
    gw_server *s = c->srv;
    int ok = f->finish == PROTO_FINISH_STOP || f->finish == PROTO_FINISH_LENGTH;
    const int last = !ok || f->left == 0; /* an error ends the whole request (its other choices are cancelled) */
    const uint32_t ix = f->index < c->n_choices ? f->index : 0;
    if (last) {
        if (f->left) gw_broker_cancel(s->broker, c->bid);
        s_leave_broker(c);
        gw_conn_unwatch(c);
    }
    const char *finish = f->finish == PROTO_FINISH_LENGTH ? "length" : "stop";
    if (ok) gw_metrics_tokens(s->metrics, c->model, c->usage_completion ? 0 : f->prompt_tokens, f->completion_tokens);
    if (ok) c->usage_completion += f->completion_tokens;
    if (!ok) {
        gw_error e;
        s_final_error(f, &e);
        if (c->started) { /* after the first event: an error event, then [DONE] */
            gw_sse_error(&c->out, &e);
            gw_sse_done(&c->out);
            c->eof = 1;
            gw_conn_count(c, e.status);
        } else {
            c->reply_status = e.status;
            c->reply_body = gw_encode_error(&e);
            c->reply_type = "application/json";
            c->retry_after = e.status == 429 ? 1 : 0;
            c->state = S_REPLY;
        }
    } else if (c->stream) {
        int first = !(c->choice_started >> ix & 1);
        s_start_stream(c);
        if (first && c->echo) {
            s_echo_delta(c, ix);
            first = 0;
        }
        if (first || f->text.n) gw_sse_delta(&c->out, &c->resp, ix, f->text.p ? f->text.p : "", f->text.n, first, NULL);
        c->choice_started |= 1u << ix;
        gw_sse_finish(&c->out, &c->resp, ix, finish);
        if (last) {
            if (c->include_usage) gw_sse_usage(&c->out, &c->resp, f->prompt_tokens, c->usage_completion);
            gw_sse_done(&c->out);
            c->eof = 1;
            gw_conn_count(c, 200);
        }
    } else {
        json_t *lp = c->logprobs && f->lps
                         ? gw_encode_logprobs(&c->resp, c->tok, f->ids, f->lps, f->n_ids, &c->text_off[ix])
                         : NULL;
        if (c->echo && c->echo_top >= 0) { /* the prompt's tokens, then the completion's */
            json_t *all = c->echo_lp[ix];
            c->echo_lp[ix] = NULL;
            if (all && lp) (void)gw_logprobs_concat(all, lp);
            json_decref(lp);
            lp = all;
        }
        gw_buf echoed = {0};
        if (c->echo) {
            gw_buf_add(&echoed, c->echo_text ? c->echo_text : "", c->echo_len);
            if (f->n_ids && gw_token_space(c->tok, f->ids[0]) && !(f->text.n && f->text.p[0] == ' '))
                gw_buf_add(&echoed, " ", 1);
            gw_buf_add(&echoed, f->text.p ? f->text.p : "", f->text.n);
        }
        if (!c->choices) c->choices = json_array();
        json_t *ch = c->echo ? gw_encode_choice(&c->resp, ix, echoed.p ? echoed.p : "", echoed.n, finish, lp)
                             : gw_encode_choice(&c->resp, ix, f->text.p ? f->text.p : "", f->text.n, finish, lp);
        gw_buf_free(&echoed);
        if (c->choices && ch) json_array_append_new(c->choices, ch);
        if (last) {
            gw_metrics_ttft(s->metrics, c->model, gw_now() - c->t0);
            json_t *chs = c->choices;
            c->choices = NULL;
            /* in index order, whatever order the choices ended in */
            json_t *sorted = json_array();
            for (uint32_t k = 0; chs && sorted && k < c->n_choices; k++) {
                size_t i;
                json_t *v;
                json_array_foreach(chs, i, v) if (json_integer_value(json_object_get(v, "index")) == (json_int_t)k)
                    json_array_append(sorted, v);
            }
            json_decref(chs);
            c->reply_status = 200;
            json_t *plp = c->plp_list;
            c->plp_list = NULL;
            if (c->plp_ext >= 0 && !plp) plp = json_array();
            c->reply_body =
                sorted ? gw_encode_full(&c->resp, sorted, f->prompt_tokens, c->usage_completion, plp) : NULL;
            if (!sorted) json_decref(plp);
            c->reply_type = "application/json";
            c->state = S_REPLY;
        }
    }
    if (!last) return;
    json_decref(c->choices);
    c->choices = NULL;
    s_echo_free(c);
    if (c->eof || c->state == S_REPLY) gw_metrics_e2e(s->metrics, c->model, gw_now() - c->t0);
    s_slot_give(s, c);
    if (c->suspended && c->state == S_STREAM) gw_conn_cork(c); /* the last chunks and the closing one */
    gw_conn_resume(c);
}

/* every request in flight ends with e (the broker went away) */
void gw_session_fail_all(gw_server *s, int code, const char *msg) {
    proto_final f = {0};
    f.finish = PROTO_FINISH_ERROR;
    f.code = code;
    f.message = proto_cstr(msg);
    for (int i = 0; i < s->n_slots; i++) {
        gw_conn *c = s->slots[i];
        if (c && c->at_broker) {
            gw_broker_cancel(s->broker, c->bid);
            s_on_final(c, &f);
        }
    }
}

/* the connection's events first: a dropped connection loses what was in flight (a request sent into the dead
 * connection included), and new requests wait for a status reply over the new one */
static void s_link_events(gw_server *s) {
    if (!s->monitor_ready) return;
    s->monitor_ready = 0;
    int ev = gw_broker_events(s->broker);
    if ((ev & GW_BROKER_REFUSED) && s->cfg.verbose) fprintf(stderr, "zllm-http: %s\n", gw_broker_problem(s->broker));
    if (!(ev & GW_BROKER_DROPPED)) return;
    s->link_down = 1;
    gw_session_fail_all(s, PROTO_CODE_BROKER_UNREACHABLE,
                        "the connection to the broker dropped (it restarted or went away); the request is lost");
}

/* the broker's instance id on every reply: another instance than before is a restarted broker, which knows
 * nothing of the requests sent to the old one */
static void s_check_instance(gw_server *s, proto_str inst) {
    if (!inst.p || (inst.n == strlen(s->broker_inst) && !memcmp(inst.p, s->broker_inst, inst.n))) return;
    int had = s->broker_inst[0] != 0;
    proto_str_copy(inst, s->broker_inst, sizeof s->broker_inst);
    if (had) {
        s->broker_restarts++;
        gw_session_fail_all(s, PROTO_CODE_BROKER_RESTARTED,
                            "the broker restarted (another instance answers); the request is lost");
    }
}

void gw_session_drain(gw_server *s) {
    const proto_msg *m;
    s_link_events(s);
    while (gw_broker_recv(s->broker, &m) == 1) {
        gw_conn *c;
        s_check_instance(s, m->inst);
        switch (m->type) {
        case PROTO_TOKEN:
            if ((c = s_slot_find(s, m->token.id))) s_on_token(c, &m->token);
            break;
        case PROTO_PROMPT_LPS:
            if ((c = s_slot_find(s, m->plps.id)) && c->at_broker) s_on_plps(c, &m->plps);
            break;
        case PROTO_FINAL:
            if ((c = s_slot_find(s, m->final.id)) && c->at_broker) s_on_final(c, &m->final);
            break;
        case PROTO_ERROR:
            if (m->error.id.p && (c = s_slot_find(s, m->error.id)) && c->at_broker) {
                proto_final f = {0};
                f.finish = PROTO_FINISH_ERROR;
                f.code = PROTO_CODE_INTERNAL;
                f.message = m->error.message;
                s_on_final(c, &f);
            }
            break;
        case PROTO_STATUS: {
            size_t n;
            const void *fr = gw_broker_frame(s->broker, &n);
            uint8_t *copy = malloc(n ? n : 1);
            if (!copy) break;
            memcpy(copy, fr, n);
            char derr[64];
            proto_msg_free(&s->st_msg);
            if (proto_decode(copy, n, &s->st_msg, derr, sizeof derr) == 0) {
                free(s->st_frame);
                s->st_frame = copy;
                s->st_len = n;
                s->has_status = 1;
                s->link_down = 0;
                s->t_status_recv = gw_now();
            } else {
                free(copy);
                s->has_status = 0;
            }
            break;
        }
        default: break;
        }
    }
}

/* ---- SSE body ---- */

ssize_t gw_session_sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gw_conn *c = cls;
    if (c->gone || c->out.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t have = c->out.n - c->out_off;
    if (have) {
        size_t n = have < max ? have : max;
        memcpy(buf, c->out.p + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out.n) c->out_off = c->out.n = 0;
        return (ssize_t)n;
    }
    if (c->eof) return MHD_CONTENT_READER_END_OF_STREAM;
    gw_conn_uncork(c);               /* what was written leaves now */
    MHD_suspend_connection(c->conn); /* resumed by s_on_token / s_on_final / a hang-up */
    c->suspended = 1;
    return 0;
}

/* the text an echo starts with (malloc'd, *n bytes): a text prompt as given, a token-id prompt decoded by tok */
static char *s_echo_text(const gw_request *r, const void *tok, size_t *n) {
    if (r->gen.prompt_kind == PROTO_PROMPT_TOKENS)
        return tok ? tokenizer_decode_len(tok, r->gen.tokens, (int)r->gen.n_tokens, 0, n) : NULL;
    char *t = malloc(r->gen.prompt.n + 1);
    if (!t) return NULL;
    if (r->gen.prompt.n) memcpy(t, r->gen.prompt.p, r->gen.prompt.n);
    t[r->gen.prompt.n] = 0;
    *n = r->gen.prompt.n;
    return t;
}

enum MHD_Result gw_session_generate(gw_conn *c) {
    gw_server *s = c->srv;
    gw_request r;
    gw_error e;
    if (gw_request_parse(c->rt == R_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS, c->body.p ? c->body.p : "", c->body.n, &r,
                         &e) != 0)
        return gw_reply_error(c, &e);
    char bmodel[PROTO_NAME_MAX + 1];
    if (s_resolve_model(s, r.model, bmodel, sizeof bmodel, &e) != 0) goto fail;
    snprintf(c->model, sizeof c->model, "%s", r.model[0] ? r.model : bmodel);
    if (!gw_session_broker_up(s)) {
        gw_session_unreachable(s, &e);
        goto fail;
    }
    if (bmodel[0] && gw_session_alive_workers(s, bmodel) == 0) {
        gw_error_set(&e, 503, "service_unavailable", NULL, "no_worker", "no worker serves the model '%s' now", bmodel);
        goto fail;
    }
    const void *tok = gw_vocab_get(s->vocab, bmodel[0] ? bmodel : NULL);
    if (!tok) tok = gw_vocab_get(s->vocab, c->model);
    if (r.echo && r.gen.prompt_kind == PROTO_PROMPT_TOKENS && !tok) {
        gw_error_set(&e, 400, "invalid_request_error", "echo", NULL,
                     "'echo' of a token-id prompt needs the model's vocabulary (zllm-http --model NAME=PATH)");
        goto fail;
    }
    char uid[40];
    snprintf(uid, sizeof uid, "%s%llx", s->instance, (unsigned long long)++s->next_uid);
    if (s_slot_take(s, c) != 0 || gw_resp_init(&c->resp, r.ep, uid, c->model) != 0) {
        gw_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    r.gen.id = proto_cstr(c->bid);
    r.gen.model = bmodel[0] ? proto_cstr(bmodel) : (proto_str){0};
    int rc = gw_broker_submit(s->broker, &r.gen);
    if (rc != 0) {
        s_slot_give(s, c);
        if (rc == -2)
            gw_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "the request exceeds the broker's %u-byte message limit", PROTO_CLIENT_MAX_FRAME);
        else gw_session_unreachable(s, &e);
        goto fail;
    }
    c->stream = r.stream;
    c->include_usage = r.include_usage;
    c->n_choices = r.gen.n ? r.gen.n : 1;
    c->choice_started = 0;
    c->logprobs = r.gen.sampling.logprobs;
    c->tok = tok;
    memset(c->text_off, 0, sizeof c->text_off);
    s_echo_free(c);
    c->echo = r.echo;
    c->echo_top = r.echo_top;
    c->plp_ext = r.plp_ext;
    c->echo_len = 0;
    if (c->echo) c->echo_text = s_echo_text(&r, c->tok, &c->echo_len);
    c->usage_completion = 0;
    c->at_broker = 1;
    gw_metrics_inflight(s->metrics, 1);
    gw_request_free(&r);
    c->state = S_WAIT;
    gw_conn_watch(c);
    MHD_suspend_connection(c->conn);
    c->suspended = 1;
    return MHD_YES;
fail:
    gw_request_free(&r);
    return gw_reply_error(c, &e);
}

void gw_session_cancel(gw_conn *c, int status) {
    if (!c->at_broker) return;
    gw_broker_cancel(c->srv->broker, c->bid);
    s_leave_broker(c);
    gw_conn_count(c, status);
}

void gw_session_release(gw_conn *c) {
    s_slot_give(c->srv, c);
    s_echo_free(c);
}

gw_conn *gw_session_slot(gw_server *s, int slot) { return slot >= 0 && slot < s->n_slots ? s->slots[slot] : NULL; }
