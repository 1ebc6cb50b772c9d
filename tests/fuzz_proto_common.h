/* tests/fuzz_proto_common.h: shared body of the wire-codec fuzz targets (tests/fuzz_proto*.c). Every input goes
 * through proto_decode; what decodes is re-encoded, decoded again and re-encoded once more, and the two
 * encodings must be byte-identical (a decoder/encoder disagreement aborts, which the replay driver and
 * libFuzzer both report). */
#ifndef ZLLM_FUZZ_PROTO_COMMON_H
#define ZLLM_FUZZ_PROTO_COMMON_H
#include "proto.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int fuzz_reencode(const proto_msg *m, proto_buf *b) {
    switch (m->type) {
    case PROTO_GENERATE: return proto_encode_generate(b, &m->generate);
    case PROTO_CANCEL:
        return m->cancel.id.p ? proto_encode_cancel(b, m->cancel.id)
                              : proto_encode_cancel_rids(b, m->cancel.rids, m->cancel.n_rids);
    case PROTO_STATUS: return proto_encode_status(b, &m->status);
    case PROTO_TOKEN:
        return proto_encode_token_ex(b, m->token.id, m->token.ids, m->token.n_ids, m->token.text, m->token.lps,
                                     m->token.index);
    case PROTO_FINAL: return proto_encode_final(b, &m->final);
    case PROTO_ERROR: return proto_encode_error_id(b, m->error.code, m->error.id, m->error.message);
    case PROTO_REGISTER: return proto_encode_register(b, &m->reg);
    case PROTO_REGISTERED: return proto_encode_registered(b, m->registered.heartbeat_ms);
    case PROTO_HB:
        return m->hb.has_step ? proto_encode_hb_kv(b, m->hb.step, m->hb.free_slots, m->hb.running,
                                                   m->hb.prefills_shared, &m->hb.kv)
                              : proto_encode_hb_broker(b);
    case PROTO_REREGISTER: return proto_encode_reregister(b);
    case PROTO_ASSIGN: return proto_encode_assign(b, m->assign.seqs, m->assign.n_seqs);
    case PROTO_OUT:
        return proto_encode_out_lp(b, m->out.step, m->out.rids, m->out.toks, m->out.fin, m->out.lps, m->out.n);
    default: return -1;
    }
}

static void fuzz_proto_one(const uint8_t *data, size_t size) {
    static proto_msg m1, m2;
    static proto_buf b1, b2;
    char err[256];
    if (proto_decode(data, size, &m1, err, sizeof err) != 0) return;
    if (fuzz_reencode(&m1, &b1) != 0) abort();
    /* b1 must decode (the encoder writes only what the decoder accepts) */
    if (proto_decode(b1.data, b1.len, &m2, err, sizeof err) != 0) abort();
    if (m2.type != m1.type) abort();
    if (fuzz_reencode(&m2, &b2) != 0) abort();
    if (b1.len != b2.len || memcmp(b1.data, b2.data, b1.len) != 0) abort();
}

/* seeds: one encoded example of each message type selected by `mask` (bit = proto_type) */
static int fuzz_proto_seeds(const uint8_t **seeds, size_t *sizes, int max, unsigned mask) {
    static proto_buf bufs[32];
    static int32_t toks[8] = { 1, 2, 3, 400, 5, 6, 7, 8 };
    static uint64_t rids[3] = { 1, 2, 1ull << 33 };
    static int32_t otoks[3] = { 9, -1, 10 };
    static uint8_t fin[3] = { 0, 4, 2 };
    int n = 0;
#define SEED(t, expr) do { if ((mask >> (t) & 1) && n < max && n < 32) { \
        proto_buf *b = &bufs[n]; if ((expr) == 0) { seeds[n] = b->data; sizes[n] = b->len; n++; } } } while (0)
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("r1"); g.prompt_kind = PROTO_PROMPT_TEXT; g.prompt = proto_cstr("Once upon a time");
    g.stop[0] = proto_cstr("\n"); g.n_stop = 1; g.stop_ids = toks; g.n_stop_ids = 2; g.sampling.has_seed = 1;
    SEED(PROTO_GENERATE, proto_encode_generate(b, &g));
    proto_generate_defaults(&g);
    g.id = proto_cstr("r2"); g.prompt_kind = PROTO_PROMPT_TOKENS; g.tokens = toks; g.n_tokens = 8; g.model = proto_cstr("m");
    g.priority = -7;
    SEED(PROTO_GENERATE, proto_encode_generate(b, &g));
    static proto_chat chat[2];
    chat[0].role = proto_cstr("system"); chat[0].content = proto_cstr("Be brief.");
    chat[1].role = proto_cstr("user"); chat[1].content = proto_cstr("Hi");
    proto_generate_defaults(&g);
    g.id = proto_cstr("r3"); g.prompt_kind = PROTO_PROMPT_MESSAGES; g.messages = chat; g.n_messages = 2; g.add_bos = 0;
    SEED(PROTO_GENERATE, proto_encode_generate(b, &g));
    SEED(PROTO_CANCEL, proto_encode_cancel(b, proto_cstr("r1")));
    SEED(PROTO_CANCEL, proto_encode_cancel_rids(b, rids, 3));
    SEED(PROTO_STATUS, proto_encode_status_request(b, proto_cstr("s")));
    static proto_worker_info wi[1];
    wi[0].name = proto_cstr("w"); wi[0].model = proto_cstr("m"); wi[0].device = proto_cstr("cpu"); wi[0].n_ctx = 512;
    wi[0].kv_block = 16;
    wi[0].kv_used = 3;
    wi[0].kv_cached = 9;
    wi[0].kv_hit_tokens = 1ull << 40;
    wi[0].kv_summary = 7;
    static proto_str models[1];
    models[0] = proto_cstr("m");
    static proto_counter ct[1];
    ct[0].name = proto_cstr("bad_messages"); ct[0].value = 3;
    static proto_model_info cap[1];
    cap[0].model = proto_cstr("m");
    cap[0].workers = 1;
    cap[0].reason = proto_cstr("no_capacity");
    proto_status st = {proto_cstr("s"), 1, 1, 2, models, 1, wi, 1, ct, 1, cap, 1};
    SEED(PROTO_STATUS, proto_encode_status(b, &st));
    SEED(PROTO_TOKEN, proto_encode_token(b, proto_cstr("r1"), toks, 2, proto_cstr(" the")));
    SEED(PROTO_TOKEN, proto_encode_token(b, proto_cstr("r2"), toks, 1, proto_cstr("a")) ||
                          proto_buf_add_str(b, "inst", proto_cstr("0123456789abcdef")));
    proto_final f;
    memset(&f, 0, sizeof f);
    f.id = proto_cstr("r1"); f.finish = PROTO_FINISH_LENGTH; f.text = proto_cstr("end"); f.ids = toks; f.n_ids = 3;
    f.has_ids = 1; f.total_ms = 12.5;
    SEED(PROTO_FINAL, proto_encode_final(b, &f));
    f.finish = PROTO_FINISH_ERROR; f.code = PROTO_CODE_WORKER_FAILED; f.message = proto_cstr("x"); f.has_ids = 0; f.ids = NULL;
    SEED(PROTO_FINAL, proto_encode_final(b, &f));
    SEED(PROTO_ERROR, proto_encode_error(b, PROTO_CODE_BAD_MESSAGE, proto_cstr("bad")));
    proto_register r = {proto_cstr("h:1"), proto_cstr("m"), proto_cstr("cpu"), 4, 4, 512, 2048, 512, 100, 0, 0};
    SEED(PROTO_REGISTER, proto_encode_register(b, &r));
    r.kv_block = 16;
    r.kv_blocks = 128;
    SEED(PROTO_REGISTER, proto_encode_register(b, &r));
    SEED(PROTO_REGISTERED, proto_encode_registered(b, 500));
    SEED(PROTO_HB, proto_encode_hb_worker(b, 77, 3, 1, 5));
    static uint64_t kvh[3] = {0x632426691270953dull, 1, ~0ull};
    proto_kv kv = {1, 10, 20, 30, 640, 1280, 1, kvh, 3, 4, 5};
    SEED(PROTO_HB, proto_encode_hb_kv(b, 78, 2, 2, 0, &kv));
    SEED(PROTO_HB, proto_encode_hb_broker(b));
    SEED(PROTO_REREGISTER, proto_encode_reregister(b));
    static proto_seq seqs[2];
    for (int i = 0; i < 2; i++) {
        memset(&seqs[i], 0, sizeof seqs[i]);
        seqs[i].rid = 5 + (uint64_t)i; seqs[i].tokens = toks; seqs[i].n_tokens = 4 + (uint32_t)i; seqs[i].max_tokens = 9;
        proto_sampling_defaults(&seqs[i].sampling);
        seqs[i].stop_ids = toks; seqs[i].n_stop_ids = 1;
        seqs[i].priority = i ? PROTO_PRIORITY_MIN : PROTO_PRIORITY_MAX;
    }
    SEED(PROTO_ASSIGN, proto_encode_assign(b, seqs, 2));
    static const proto_bias bias[2] = {{3, -100.0f}, {7, 2.5f}};
    seqs[1].sampling.bias = bias;
    seqs[1].sampling.n_bias = 2;
    seqs[1].sampling.logprobs = 1;
    seqs[1].sampling.top_logprobs = 3;
    seqs[1].sampling.presence_penalty = 0.5f;
    seqs[1].sampling.frequency_penalty = -1.0f;
    seqs[1].share = 5;
    SEED(PROTO_ASSIGN, proto_encode_assign(b, seqs, 2));
    SEED(PROTO_OUT, proto_encode_out(b, 12, rids, otoks, fin, 3));
    static const int32_t top_id[3] = {4, 1, 9};
    static const float top_lp[3] = {-0.25f, -1.5f, -1.5f};
    static proto_logprob lps[3];
    lps[0] = (proto_logprob){1, -0.25f, 3, top_id, top_lp};
    lps[2] = (proto_logprob){1, -INFINITY, 0, top_id, top_lp};
    SEED(PROTO_OUT, proto_encode_out_lp(b, 13, rids, otoks, fin, lps, 3));
    SEED(PROTO_TOKEN, proto_encode_token_ex(b, proto_cstr("r3"), toks, 2, proto_cstr("ab"), lps, 3));
    f.id = proto_cstr("r4");
    f.finish = PROTO_FINISH_STOP;
    f.code = PROTO_CODE_NONE;
    f.message.p = NULL;
    f.ids = toks;
    f.n_ids = 3;
    f.has_ids = 1;
    f.lps = lps;
    f.index = 2;
    f.left = 3;
    SEED(PROTO_FINAL, proto_encode_final(b, &f));
#undef SEED
    return n;
}
#endif
