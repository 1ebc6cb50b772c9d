/* tests/test_asan_proto.c: the wire codec (common/proto.c) and the broker's stop-string matcher, under ASan.
 * Round trips of every message type; msgpack-c as an independent oracle for the bytes we write; hostile
 * frames (truncated at every length, deep nesting, huge declared lengths, trailing bytes, wrong types and
 * ranges) must be refused without crashing. */
#include "test.h"
#include "proto.h"
#include "bk_stop.h"

#include <math.h>
#include <msgpack.h>
#include <string.h>

static proto_msg s_m;
static char s_err[256];

static int dec(const void *buf, size_t len) { return proto_decode(buf, len, &s_m, s_err, sizeof s_err); }

static int streq(proto_str s, const char *c) { return proto_str_eq(s, c); }

/* msgpack-c oracle: buf is exactly one object, a map with n_keys entries */
static int oracle_map(const proto_buf *b, uint32_t n_keys) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int ok = msgpack_unpack_next(&u, (const char *)b->data, b->len, &off) == MSGPACK_UNPACK_SUCCESS &&
             off == b->len && u.data.type == MSGPACK_OBJECT_MAP && u.data.via.map.size == n_keys;
    msgpack_unpacked_destroy(&u);
    return ok;
}

/* msgpack-c writes a frame for the hostile tests */
typedef struct { msgpack_sbuffer sb; msgpack_packer pk; } mp;
static void mp_init(mp *m) { msgpack_sbuffer_init(&m->sb); msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write); }
static void mp_str(mp *m, const char *s) { msgpack_pack_str(&m->pk, strlen(s)); msgpack_pack_str_body(&m->pk, s, strlen(s)); }
static void mp_head(mp *m, uint32_t n_extra, const char *type) {
    msgpack_pack_map(&m->pk, n_extra + 2);
    mp_str(m, "zllm"); msgpack_pack_uint32(&m->pk, 1);
    mp_str(m, "type"); mp_str(m, type);
}
static int mp_dec(mp *m) { int r = dec(m->sb.data, m->sb.size); msgpack_sbuffer_destroy(&m->sb); return r; }

static void test_roundtrips(void) {
    proto_buf b = {0};
    /* generate */
    proto_generate g;
    proto_generate_defaults(&g);
    int32_t stop_ids[2] = { 7, 9 };
    g.id = proto_cstr("req-1");
    g.model = proto_cstr("m");
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("Hello, w\xc3\xb6rld");
    g.max_tokens = 33;
    g.sampling.temperature = 0.5f;
    g.sampling.top_k = 40;
    g.sampling.top_p = 0.9f;
    g.sampling.seed = 12345678901ull;
    g.sampling.has_seed = 1;
    g.stop[0] = proto_cstr("\n\n");
    g.stop[1] = proto_cstr("END");
    g.n_stop = 2;
    g.stop_ids = stop_ids;
    g.n_stop_ids = 2;
    g.stream = 0;
    g.deadline_ms = 1500;
    CHECK(proto_encode_generate(&b, &g) == 0, "encode generate");
    CHECK(oracle_map(&b, 19), "msgpack-c reads our generate as a map of 19");
    CHECK(dec(b.data, b.len) == 0, "decode generate: %s", s_err);
    CHECK(s_m.type == PROTO_GENERATE && streq(s_m.generate.id, "req-1") && streq(s_m.generate.model, "m"), "ids");
    CHECK(s_m.generate.prompt_kind == PROTO_PROMPT_TEXT && streq(s_m.generate.prompt, "Hello, w\xc3\xb6rld"), "prompt");
    CHECK(s_m.generate.max_tokens == 33 && s_m.generate.sampling.top_k == 40 && s_m.generate.sampling.seed == 12345678901ull
          && s_m.generate.sampling.has_seed, "numbers");
    CHECK(fabsf(s_m.generate.sampling.temperature - 0.5f) < 1e-6f && fabsf(s_m.generate.sampling.top_p - 0.9f) < 1e-6f, "floats");
    CHECK(s_m.generate.n_stop == 2 && streq(s_m.generate.stop[1], "END"), "stop");
    CHECK(s_m.generate.n_stop_ids == 2 && s_m.generate.stop_ids[1] == 9, "stop_ids");
    CHECK(s_m.generate.stream == 0 && s_m.generate.deadline_ms == 1500 && s_m.generate.add_bos == -1, "flags");

    /* generate with tokens and with messages */
    int32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = i * 1000;
    proto_generate_defaults(&g);
    g.id = proto_cstr("t");
    g.prompt_kind = PROTO_PROMPT_TOKENS;
    g.tokens = toks;
    g.n_tokens = 300;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0, "tokens generate: %s", s_err);
    CHECK(s_m.generate.n_tokens == 300 && s_m.generate.tokens[299] == 299000 && s_m.generate.max_tokens == 128 &&
          s_m.generate.stream == 1, "tokens content and defaults");
    proto_chat chat[2] = {{.role = proto_cstr("system"), .content = proto_cstr("Be brief.")},
                          {.role = proto_cstr("user"), .content = proto_cstr("Hi")}};
    proto_generate_defaults(&g);
    g.id = proto_cstr("c");
    g.prompt_kind = PROTO_PROMPT_MESSAGES;
    g.messages = chat;
    g.n_messages = 2;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0, "messages generate: %s", s_err);
    CHECK(s_m.generate.n_messages == 2 && streq(s_m.generate.messages[1].content, "Hi") &&
          streq(s_m.generate.messages[0].role, "system"), "messages content");

    /* cancel both forms */
    CHECK(proto_encode_cancel(&b, proto_cstr("x")) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_CANCEL &&
          streq(s_m.cancel.id, "x") && s_m.cancel.n_rids == 0, "client cancel");
    uint64_t rids[3] = { 1, 1ull << 40, 3 };
    CHECK(proto_encode_cancel_rids(&b, rids, 3) == 0 && dec(b.data, b.len) == 0 && s_m.cancel.n_rids == 3 &&
          s_m.cancel.rids[1] == 1ull << 40 && s_m.cancel.id.p == NULL, "worker cancel");

    /* status request and reply */
    CHECK(proto_encode_status_request(&b, proto_cstr("s1")) == 0 && dec(b.data, b.len) == 0 &&
          s_m.type == PROTO_STATUS && streq(s_m.status.id, "s1"), "status request");
    proto_worker_info wi = {
        proto_cstr("w1"), proto_cstr("m"), proto_cstr("cpu"), 8, 8, 512, 3, 5, 99, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    proto_str models[1] = { proto_cstr("m") };
    proto_counter ct[2] = { { proto_cstr("bad_messages"), 4 }, { proto_cstr("requeued"), 1 } };
    proto_status st = {proto_cstr("s1"), 1, 2, 3, models, 1, &wi, 1, ct, 2, NULL, 0};
    CHECK(proto_encode_status(&b, &st) == 0 && oracle_map(&b, 9), "status reply encodes");
    proto_model_info mi = {proto_cstr("m"), 1, 3, 0, 2, proto_cstr("")};
    st.capacity = &mi;
    st.n_capacity = 1;
    CHECK(proto_encode_status(&b, &st) == 0 && oracle_map(&b, 10), "status reply with capacity encodes (10 keys)");
    CHECK(dec(b.data, b.len) == 0 && s_m.status.n_capacity == 1 && streq(s_m.status.capacity[0].model, "m") &&
              s_m.status.capacity[0].free_slots == 3 && s_m.status.capacity[0].refused == 2 &&
              s_m.status.capacity[0].reason.n == 0,
          "capacity decodes: %s", s_err);
    CHECK(dec(b.data, b.len) == 0 && s_m.status.ready == 1 && s_m.status.queue == 2 && s_m.status.active == 3 &&
          s_m.status.n_workers == 1 && s_m.status.workers[0].n_ctx == 512 && s_m.status.workers[0].step == 99 &&
          s_m.status.workers[0].alive == 1 && s_m.status.n_counters == 2 && s_m.status.counters[0].value == 4 &&
          streq(s_m.status.models[0], "m"), "status reply decodes: %s", s_err);

    /* token, final, error */
    int32_t ids[2] = { 5, 6 };
    CHECK(proto_encode_token(&b, proto_cstr("r"), ids, 2, proto_cstr("ab")) == 0 && dec(b.data, b.len) == 0 &&
          s_m.type == PROTO_TOKEN && s_m.token.n_ids == 2 && s_m.token.ids[1] == 6 && streq(s_m.token.text, "ab"),
          "token");
    proto_final f;
    memset(&f, 0, sizeof f);
    f.id = proto_cstr("r");
    f.finish = PROTO_FINISH_ERROR;
    f.code = PROTO_CODE_WORKER_FAILED;
    f.message = proto_cstr("gone");
    f.text = proto_cstr("tail");
    f.ids = ids; f.n_ids = 2; f.has_ids = 1;
    f.prompt_tokens = 10; f.completion_tokens = 2;
    f.queue_ms = 1.5; f.ttft_ms = 2.5; f.total_ms = 3.5;
    CHECK(proto_encode_final(&b, &f) == 0 && oracle_map(&b, 10), "final encodes");
    CHECK(dec(b.data, b.len) == 0 && s_m.final.finish == PROTO_FINISH_ERROR && s_m.final.code == PROTO_CODE_WORKER_FAILED &&
          streq(s_m.final.message, "gone") && streq(s_m.final.text, "tail") && s_m.final.has_ids && s_m.final.n_ids == 2 &&
          s_m.final.prompt_tokens == 10 && s_m.final.completion_tokens == 2 && s_m.final.total_ms == 3.5, "final decodes");
    CHECK(proto_encode_error(&b, PROTO_CODE_BAD_MESSAGE, proto_cstr("bad")) == 0 && dec(b.data, b.len) == 0 &&
          s_m.type == PROTO_ERROR && s_m.error.code == PROTO_CODE_BAD_MESSAGE, "error");

    /* worker side */
    proto_register r = {
        proto_cstr("host:1"), proto_cstr("m"), proto_cstr("cuda:0"), 16, 32, 2048, 65536, 32000, 250, 0, 0};
    CHECK(proto_encode_register(&b, &r) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_REGISTER &&
          s_m.reg.n_slots == 32 && s_m.reg.n_ctx == 2048 && s_m.reg.heartbeat_ms == 250 && streq(s_m.reg.device, "cuda:0"),
          "register");
    CHECK(proto_encode_registered(&b, 500) == 0 && dec(b.data, b.len) == 0 && s_m.registered.heartbeat_ms == 500, "registered");
    CHECK(proto_encode_hb_worker(&b, 1ull << 35, 3, 4, 0) == 0 && dec(b.data, b.len) == 0 && s_m.hb.has_step &&
              s_m.hb.step == 1ull << 35 && s_m.hb.free_slots == 3 && s_m.hb.running == 4,
          "worker hb");
    CHECK(proto_encode_hb_broker(&b) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_HB && !s_m.hb.has_step, "broker hb");
    CHECK(proto_encode_reregister(&b) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_REREGISTER, "reregister");
    proto_seq seqs[2];
    memset(seqs, 0, sizeof seqs);
    for (int i = 0; i < 2; i++) {
        seqs[i].rid = 100 + (uint64_t)i;
        seqs[i].tokens = toks;
        seqs[i].n_tokens = 10 + (uint32_t)i;
        seqs[i].max_tokens = 7;
        proto_sampling_defaults(&seqs[i].sampling);
        seqs[i].sampling.seed = 42;
        seqs[i].stop_ids = stop_ids;
        seqs[i].n_stop_ids = 2;
    }
    seqs[1].sampling.ignore_eos = 1;
    CHECK(proto_encode_assign(&b, seqs, 2) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_ASSIGN &&
          s_m.assign.n_seqs == 2 && s_m.assign.seqs[1].rid == 101 && s_m.assign.seqs[1].n_tokens == 11 &&
          s_m.assign.seqs[1].tokens[10] == 10000 && s_m.assign.seqs[1].sampling.ignore_eos == 1 &&
          s_m.assign.seqs[0].sampling.seed == 42 && s_m.assign.seqs[0].n_stop_ids == 2, "assign: %s", s_err);
    int32_t otoks[3] = { 5, -1, 7 };
    uint8_t fin[3] = { 0, 4, 2 };
    CHECK(proto_encode_out(&b, 77, rids, otoks, fin, 3) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_OUT &&
          s_m.out.n == 3 && s_m.out.step == 77 && s_m.out.toks[1] == -1 && s_m.out.fin[2] == 2 &&
          s_m.out.rids[1] == 1ull << 40, "out: %s", s_err);
    /* decoding the same message twice reuses the arena */
    CHECK(dec(b.data, b.len) == 0 && s_m.out.n == 3, "second decode");
    proto_buf_free(&b);
    proto_buf_free(&b);   /* idempotent */
}

/* what comes back besides the token: logit_bias, penalties, logprobs, n in generate and assign; lps in out, token
 * and final; index/left; share; prefills_shared; and their limits */
static void test_extras(void) {
    proto_buf b = {0};
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("x");
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("hi");
    proto_bias bias[3] = {{5, -100.0f}, {7, 2.5f}, {5, 1.0f}};
    g.sampling.bias = bias;
    g.sampling.n_bias = 3;
    g.sampling.presence_penalty = 1.5f;
    g.sampling.frequency_penalty = -0.25f;
    g.sampling.logprobs = 1;
    g.sampling.top_logprobs = 20;
    g.n = 16;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 && s_m.type == PROTO_GENERATE, "generate");
    const proto_sampling *ps = &s_m.generate.sampling;
    CHECK(ps->n_bias == 3 && ps->bias[0].id == 5 && ps->bias[0].bias == -100.0f && ps->bias[1].bias == 2.5f &&
              ps->bias[2].id == 5 && ps->presence_penalty == 1.5f && ps->frequency_penalty == -0.25f &&
              ps->logprobs == 1 && ps->top_logprobs == 20 && s_m.generate.n == 16,
          "generate extras round trip");
    g.n = 17;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0, "n 17 refused");
    g.n = 1;
    g.sampling.top_logprobs = 21;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0, "top_logprobs 21 refused");
    g.sampling.top_logprobs = 2;
    g.sampling.presence_penalty = 2.5f;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0, "presence_penalty 2.5 refused");
    g.sampling.presence_penalty = 0;
    bias[1].bias = 100.5f;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0, "bias 100.5 refused");
    bias[1].bias = 1;
    proto_bias many[301];
    for (int i = 0; i < 301; i++) many[i] = (proto_bias){i, 1.0f};
    g.sampling.bias = many;
    g.sampling.n_bias = 301; /* the encoder writes 300 at most: a hand-made frame carries 301 */
    mp m;
    mp_init(&m);
    mp_head(&m, 3, "generate");
    mp_str(&m, "id");
    mp_str(&m, "x");
    mp_str(&m, "prompt");
    mp_str(&m, "hi");
    mp_str(&m, "logit_bias");
    msgpack_pack_array(&m.pk, 301);
    for (int i = 0; i < 301; i++) {
        msgpack_pack_array(&m.pk, 2);
        msgpack_pack_uint32(&m.pk, (uint32_t)i);
        msgpack_pack_double(&m.pk, 1.0);
    }
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "logit_bias"), "301 bias entries refused: %s", s_err);
    /* assign: the sampling extras and share */
    proto_seq q;
    memset(&q, 0, sizeof q);
    int32_t toks[2] = {1, 2};
    q.rid = 9;
    q.tokens = toks;
    q.n_tokens = 2;
    q.max_tokens = 3;
    proto_sampling_defaults(&q.sampling);
    q.sampling.bias = bias;
    q.sampling.n_bias = 2;
    q.sampling.logprobs = 1;
    q.sampling.top_logprobs = 3;
    q.share = 8;
    CHECK(proto_encode_assign(&b, &q, 1) == 0 && dec(b.data, b.len) == 0 && s_m.assign.n_seqs == 1 &&
              s_m.assign.seqs[0].share == 8 && s_m.assign.seqs[0].sampling.n_bias == 2 &&
              s_m.assign.seqs[0].sampling.top_logprobs == 3,
          "assign extras round trip");
    /* out with lps: entries present and nil */
    uint64_t rids[2] = {1, 2};
    int32_t ot[2] = {4, -1};
    uint8_t fin[2] = {0, 3};
    int32_t tid[2] = {4, 6};
    float tlp[2] = {-0.5f, -1.25f};
    proto_logprob lps[2] = {{1, -0.5f, 2, tid, tlp}, {0}};
    CHECK(proto_encode_out_lp(&b, 3, rids, ot, fin, lps, 2) == 0 && dec(b.data, b.len) == 0 && s_m.out.lps &&
              s_m.out.lps[0].present && s_m.out.lps[0].logprob == -0.5f && s_m.out.lps[0].n_top == 2 &&
              s_m.out.lps[0].top_id[1] == 6 && s_m.out.lps[0].top_logprob[1] == -1.25f && !s_m.out.lps[1].present,
          "out lps round trip");
    lps[0].logprob = -INFINITY;
    CHECK(proto_encode_out_lp(&b, 3, rids, ot, fin, lps, 2) == 0 && dec(b.data, b.len) == 0 &&
              s_m.out.lps[0].logprob == -INFINITY,
          "a -inf logprob travels");
    lps[0].logprob = 0.5f;
    CHECK(proto_encode_out_lp(&b, 3, rids, ot, fin, lps, 2) == 0 && dec(b.data, b.len) != 0, "a logprob > 0 refused");
    lps[0].logprob = -0.5f;
    CHECK(proto_encode_out_lp(&b, 3, rids, ot, fin, lps, 1) == 0 && dec(b.data, b.len) == 0, "out of one entry");
    mp_init(&m);
    mp_head(&m, 4, "out");
    mp_str(&m, "rids");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 1);
    mp_str(&m, "toks");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int32(&m.pk, 1);
    mp_str(&m, "fin");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint32(&m.pk, 0);
    mp_str(&m, "lps");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    CHECK(mp_dec(&m) != 0, "out: lps longer than rids refused");
    /* token and final */
    CHECK(proto_encode_token_ex(&b, proto_cstr("t"), tid, 2, proto_cstr("ab"), lps, 5) == 0 &&
              dec(b.data, b.len) == 0 && s_m.token.index == 5 && s_m.token.lps && s_m.token.lps[0].n_top == 2 &&
              !s_m.token.lps[1].present,
          "token logprobs and index");
    proto_final f;
    memset(&f, 0, sizeof f);
    f.id = proto_cstr("t");
    f.finish = PROTO_FINISH_STOP;
    f.text = proto_cstr("ab");
    f.ids = tid;
    f.n_ids = 2;
    f.has_ids = 1;
    f.lps = lps;
    f.index = 3;
    f.left = 2;
    CHECK(proto_encode_final(&b, &f) == 0 && dec(b.data, b.len) == 0 && s_m.final.index == 3 && s_m.final.left == 2 &&
              s_m.final.lps && s_m.final.lps[0].logprob == -0.5f,
          "final logprobs, index, left");
    CHECK(proto_encode_hb_worker(&b, 4, 1, 1, 77) == 0 && dec(b.data, b.len) == 0 && s_m.hb.prefills_shared == 77,
          "hb prefills_shared");
    proto_buf_free(&b);
}

/* the KV and priority fields (docs/kv-cache.md): round trips, defaults and ranges */
static void test_kv_fields(void) {
    proto_buf b = {0};
    int32_t toks[4] = {1, 2, 3, 4};
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("p");
    g.prompt_kind = PROTO_PROMPT_TOKENS;
    g.tokens = toks;
    g.n_tokens = 4;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 && s_m.generate.priority == 0,
          "priority defaults to 0");
    g.priority = PROTO_PRIORITY_MIN;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 && s_m.generate.priority == -100,
          "priority -100 round trip: %s", s_err);
    g.priority = PROTO_PRIORITY_MAX + 1;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0 && strstr(s_err, "priority"),
          "priority 101 refused (%s)", s_err);
    mp m;
    mp_init(&m);
    mp_head(&m, 3, "generate");
    mp_str(&m, "id");
    mp_str(&m, "a");
    mp_str(&m, "prompt");
    mp_str(&m, "x");
    mp_str(&m, "priority");
    mp_str(&m, "high");
    CHECK(mp_dec(&m) != 0, "a string priority refused");
    proto_register r = {proto_cstr("h"), proto_cstr("m"), proto_cstr("cpu"), 1, 2, 64, 128, 0, 100, 16, 9};
    CHECK(proto_encode_register(&b, &r) == 0 && oracle_map(&b, 13) && dec(b.data, b.len) == 0 &&
              s_m.reg.kv_block == 16 && s_m.reg.kv_blocks == 9,
          "register with kv_block/kv_blocks: %s", s_err);
    r.kv_block = PROTO_MAX_KV_BLOCK + 1;
    CHECK(proto_encode_register(&b, &r) == 0 && dec(b.data, b.len) != 0, "kv_block 257 refused");
    uint64_t h[3] = {5, 1ull << 63, 0};
    proto_kv kv = {1, 1, 2, 3, 400, 800, 1, h, 3, 7, 8};
    CHECK(proto_encode_hb_kv(&b, 9, 1, 1, 0, &kv) == 0 && dec(b.data, b.len) == 0 && s_m.hb.kv.has_kv &&
              s_m.hb.kv.cached == 3 && s_m.hb.kv.hit_tokens == 400 && s_m.hb.kv.prompt_tokens == 800 &&
              s_m.hb.kv.has_hashes && s_m.hb.kv.n_hashes == 3 && s_m.hb.kv.hashes[1] == 1ull << 63 &&
              s_m.hb.kv.preemptions == 7 && s_m.hb.kv.evictions == 8,
          "hb with a KV report: %s", s_err);
    kv.has_hashes = 0;
    CHECK(proto_encode_hb_kv(&b, 9, 1, 1, 0, &kv) == 0 && dec(b.data, b.len) == 0 && !s_m.hb.kv.has_hashes,
          "hb without kv_hashes leaves the summary alone");
    CHECK(proto_encode_hb_worker(&b, 9, 1, 1, 0) == 0 && dec(b.data, b.len) == 0 && !s_m.hb.kv.has_kv, "plain hb");
    mp_init(&m);
    mp_head(&m, 1, "hb");
    mp_str(&m, "kv_hashes");
    msgpack_pack_array(&m.pk, PROTO_MAX_KV_HASHES + 1);
    for (int i = 0; i <= PROTO_MAX_KV_HASHES; i++) msgpack_pack_uint64(&m.pk, (uint64_t)i);
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "kv_hashes"), "4097 hashes refused (%s)", s_err);
    mp_init(&m);
    mp_head(&m, 1, "hb");
    mp_str(&m, "kv_hashes");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_uint64(&m.pk, 1);
    msgpack_pack_int64(&m.pk, -1);
    CHECK(mp_dec(&m) != 0, "a negative hash refused");
    mp_init(&m);
    mp_head(&m, 1, "hb");
    mp_str(&m, "kv_hashes");
    mp_str(&m, "x");
    CHECK(mp_dec(&m) != 0, "kv_hashes not an array refused");
    proto_seq q;
    memset(&q, 0, sizeof q);
    q.rid = 1;
    q.tokens = toks;
    q.n_tokens = 4;
    q.max_tokens = 2;
    proto_sampling_defaults(&q.sampling);
    q.priority = 42;
    CHECK(proto_encode_assign(&b, &q, 1) == 0 && dec(b.data, b.len) == 0 && s_m.assign.seqs[0].priority == 42,
          "assign carries priority");
    proto_worker_info wi = {proto_cstr("w"),
                            proto_cstr("m"),
                            proto_cstr("cpu"),
                            1,
                            1,
                            64,
                            1,
                            0,
                            5,
                            1,
                            16,
                            4,
                            5,
                            6,
                            1ull << 40,
                            1ull << 41,
                            77,
                            12,
                            13};
    proto_status st = {proto_cstr("s"), 1, 0, 0, NULL, 0, &wi, 1, NULL, 0, NULL, 0};
    CHECK(proto_encode_status(&b, &st) == 0 && dec(b.data, b.len) == 0 && s_m.status.workers[0].kv_block == 16 &&
              s_m.status.workers[0].kv_cached == 6 && s_m.status.workers[0].kv_hit_tokens == 1ull << 40 &&
              s_m.status.workers[0].kv_prompt_tokens == 1ull << 41 && s_m.status.workers[0].kv_summary == 77 &&
              s_m.status.workers[0].kv_preemptions == 12 && s_m.status.workers[0].kv_evictions == 13,
          "status carries the workers' KV counters: %s", s_err);
    proto_buf_free(&b);
}

static void test_hostile(void) {
    uint8_t buf[64];
    proto_buf b = {0};
    CHECK(dec("", 0) != 0, "empty frame refused");
    CHECK(dec("\xc1", 1) != 0, "reserved byte refused");
    CHECK(dec("\x93\x01\x02\x03", 4) != 0, "array top-level refused");
    /* trailing byte */
    proto_encode_cancel(&b, proto_cstr("x"));
    memcpy(buf, b.data, b.len);
    buf[b.len] = 0;
    CHECK(dec(buf, b.len + 1) != 0 && strstr(s_err, "trailing"), "trailing byte refused (%s)", s_err);
    /* every truncation of a big valid message fails cleanly */
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("trunc");
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("some prompt text that is long enough to need a str8 header, really");
    g.stop[0] = proto_cstr("x");
    g.n_stop = 1;
    proto_encode_generate(&b, &g);
    int all_fail = 1;
    for (size_t n = 0; n < b.len; n++) {
        uint8_t *copy = malloc(n ? n : 1);   /* exact-size copy: ASan catches any overread */
        memcpy(copy, b.data, n);
        if (dec(copy, n) == 0) all_fail = 0;
        free(copy);
    }
    CHECK(all_fail, "every truncation refused");
    /* huge declared lengths: array32 / map32 / str32 with nothing behind them */
    uint8_t huge_arr[] = { 0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff };
    uint8_t huge_map[] = { 0xdf, 0xff, 0xff, 0xff, 0xff, 0x01 };
    uint8_t huge_str[] = { 0x81, 0xa1, 'a', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x' };
    uint8_t huge_bin[] = { 0x81, 0xa1, 'a', 0xc6, 0xff, 0xff, 0xff, 0xf0 };
    uint8_t huge_ext[] = { 0x81, 0xa1, 'a', 0xc9, 0xff, 0xff, 0xff, 0xf0, 0x01 };
    CHECK(dec(huge_arr, sizeof huge_arr) != 0, "array32 of 4G refused");
    CHECK(dec(huge_map, sizeof huge_map) != 0, "map32 of 4G refused");
    CHECK(dec(huge_str, sizeof huge_str) != 0, "str32 of 2G refused");
    CHECK(dec(huge_bin, sizeof huge_bin) != 0, "bin32 refused");
    CHECK(dec(huge_ext, sizeof huge_ext) != 0, "ext32 refused");
    /* nesting: 8 levels pass validation, 9 do not */
    uint8_t deep[32];
    size_t n = 0;
    for (int i = 0; i < 8; i++) deep[n++] = 0x91;
    deep[n++] = 0x01;
    CHECK(proto_msgpack_validate(deep, n, PROTO_MAX_DEPTH, s_err, sizeof s_err) == 0, "depth 8 valid");
    n = 0;
    for (int i = 0; i < 9; i++) deep[n++] = 0x91;
    deep[n++] = 0x01;
    CHECK(proto_msgpack_validate(deep, n, PROTO_MAX_DEPTH, s_err, sizeof s_err) != 0, "depth 9 refused");
    /* a very deep message (100000 levels) fails without recursing deeply */
    size_t dn = 100001;
    uint8_t *dbuf = malloc(dn);
    memset(dbuf, 0x91, dn - 1);
    dbuf[dn - 1] = 0x01;
    CHECK(dec(dbuf, dn) != 0, "100000 levels refused");
    free(dbuf);

    mp m;
    mp_init(&m); mp_head(&m, 0, "nonsense"); CHECK(mp_dec(&m) != 0 && strstr(s_err, "unknown type"), "unknown type");
    mp_init(&m); msgpack_pack_map(&m.pk, 1); mp_str(&m, "type"); mp_str(&m, "status");
    CHECK(mp_dec(&m) != 0, "missing version refused");
    mp_init(&m); msgpack_pack_map(&m.pk, 2); mp_str(&m, "zllm"); msgpack_pack_uint32(&m.pk, 2); mp_str(&m, "type"); mp_str(&m, "status");
    CHECK(mp_dec(&m) != 0, "version 2 refused");
    mp_init(&m); mp_head(&m, 1, "generate"); mp_str(&m, "prompt"); mp_str(&m, "x");
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "id"), "generate without id (%s)", s_err);
    char id65[66];
    memset(id65, 'a', 65); id65[65] = 0;
    mp_init(&m); mp_head(&m, 2, "generate"); mp_str(&m, "id"); mp_str(&m, id65); mp_str(&m, "prompt"); mp_str(&m, "x");
    CHECK(mp_dec(&m) != 0, "65-byte id refused");
    mp_init(&m); mp_head(&m, 2, "generate"); mp_str(&m, "id"); mp_str(&m, ""); mp_str(&m, "prompt"); mp_str(&m, "x");
    CHECK(mp_dec(&m) != 0, "empty id refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "temperature"); msgpack_pack_double(&m.pk, NAN);
    CHECK(mp_dec(&m) != 0, "NaN temperature refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "top_p"); msgpack_pack_double(&m.pk, 0.0);
    CHECK(mp_dec(&m) != 0, "top_p 0 refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "max_tokens"); msgpack_pack_int(&m.pk, -5);
    CHECK(mp_dec(&m) != 0, "negative max_tokens refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "max_tokens"); mp_str(&m, "12");
    CHECK(mp_dec(&m) != 0, "string max_tokens refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "tokens"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 3);
    CHECK(mp_dec(&m) != 0, "prompt and tokens together refused");
    mp_init(&m); mp_head(&m, 2, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt");
    msgpack_pack_str(&m.pk, 2); msgpack_pack_str_body(&m.pk, "\xc3\x28", 2);
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "UTF-8"), "invalid UTF-8 prompt refused");
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "stop"); msgpack_pack_array(&m.pk, 9); for (int i = 0; i < 9; i++) mp_str(&m, "s");
    CHECK(mp_dec(&m) != 0, "9 stop strings refused");
    /* accepted variants: ints for floats, nil as absent, unknown keys, keys in any order */
    mp_init(&m); msgpack_pack_map(&m.pk, 7); mp_str(&m, "prompt"); mp_str(&m, "x"); mp_str(&m, "id"); mp_str(&m, "a");
    mp_str(&m, "temperature"); msgpack_pack_int(&m.pk, 0); mp_str(&m, "seed"); msgpack_pack_nil(&m.pk);
    mp_str(&m, "future_field"); msgpack_pack_map(&m.pk, 1); mp_str(&m, "k"); msgpack_pack_array(&m.pk, 0);
    mp_str(&m, "type"); mp_str(&m, "generate"); mp_str(&m, "zllm"); msgpack_pack_uint32(&m.pk, 1);
    CHECK(mp_dec(&m) == 0 && s_m.generate.sampling.temperature == 0.0f && !s_m.generate.sampling.has_seed,
          "ints for floats, nil, unknown keys accepted (%s)", s_err);
    mp_init(&m); mp_head(&m, 3, "generate"); mp_str(&m, "id"); mp_str(&m, "a"); mp_str(&m, "prompt"); mp_str(&m, "x");
    mp_str(&m, "temperature"); msgpack_pack_float(&m.pk, 0.25f);
    CHECK(mp_dec(&m) == 0 && s_m.generate.sampling.temperature == 0.25f, "float32 accepted");
    /* out: unequal lengths, bad fin, bad toks */
    mp_init(&m); mp_head(&m, 3, "out"); mp_str(&m, "rids"); msgpack_pack_array(&m.pk, 2); msgpack_pack_int(&m.pk, 1); msgpack_pack_int(&m.pk, 2);
    mp_str(&m, "toks"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "fin"); msgpack_pack_array(&m.pk, 2); msgpack_pack_int(&m.pk, 0); msgpack_pack_int(&m.pk, 0);
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "lengths"), "out with unequal arrays refused (%s)", s_err);
    mp_init(&m); mp_head(&m, 3, "out"); mp_str(&m, "rids"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "toks"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, -2);
    mp_str(&m, "fin"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 0);
    CHECK(mp_dec(&m) != 0, "token -2 refused");
    mp_init(&m); mp_head(&m, 3, "out"); mp_str(&m, "rids"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "toks"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 3);
    mp_str(&m, "fin"); msgpack_pack_array(&m.pk, 1); msgpack_pack_int(&m.pk, 5);
    CHECK(mp_dec(&m) != 0, "fin 5 refused");
    mp_init(&m); mp_head(&m, 2, "out"); mp_str(&m, "rids"); msgpack_pack_array(&m.pk, 0);
    mp_str(&m, "toks"); msgpack_pack_array(&m.pk, 0);
    CHECK(mp_dec(&m) != 0, "out without fin refused");
    mp_init(&m); mp_head(&m, 0, "register");
    CHECK(mp_dec(&m) != 0, "empty register refused");
    mp_init(&m); mp_head(&m, 1, "cancel"); mp_str(&m, "x"); msgpack_pack_int(&m.pk, 1);
    CHECK(mp_dec(&m) != 0, "cancel without id/rids refused");
    /* a key that is not a string */
    mp_init(&m); msgpack_pack_map(&m.pk, 3); mp_str(&m, "zllm"); msgpack_pack_uint32(&m.pk, 1); mp_str(&m, "type");
    mp_str(&m, "status"); msgpack_pack_int(&m.pk, 5); msgpack_pack_int(&m.pk, 5);
    CHECK(mp_dec(&m) != 0, "non-string key refused");
    /* after all of that, a good message still decodes */
    proto_encode_cancel(&b, proto_cstr("ok"));
    CHECK(dec(b.data, b.len) == 0 && streq(s_m.cancel.id, "ok"), "good message after hostile ones");
    proto_buf_free(&b);
}

static void test_stop(void) {
    bk_stops st = { { "END", "\n\n" }, { 3, 2 }, 2, 3 };
    const char *t = "hello EN";
    CHECK(bk_stop_find(&st, t, strlen(t), 0) == -1, "no stop yet");
    CHECK(bk_stop_releasable(&st, t, strlen(t)) == 6, "holds back 'EN' (got %zu)", bk_stop_releasable(&st, t, strlen(t)));
    t = "hello ENDING";
    CHECK(bk_stop_find(&st, t, strlen(t), 0) == 6, "finds END");
    CHECK(bk_stop_find(&st, t, strlen(t), 7) == -1, "search starts at from");
    t = "a\n\nb END";
    CHECK(bk_stop_find(&st, t, strlen(t), 0) == 1, "earliest stop wins");
    t = "plain";
    CHECK(bk_stop_releasable(&st, t, 5) == 5, "nothing held back");
    t = "x\n";
    CHECK(bk_stop_releasable(&st, t, 2) == 1, "holds back a newline");
    /* a stop string starting with a multi-byte character: the release point stays on a boundary */
    bk_stops s2 = { { "\xc3\xa9t\xc3\xa9" }, { 5 }, 1, 5 };
    t = "caf\xc3\xa9t";
    CHECK(bk_stop_releasable(&s2, t, strlen(t)) == 3, "holds back from the start of the character");
    bk_stops none = { { 0 }, { 0 }, 0, 0 };
    CHECK(bk_stop_releasable(&none, "abc", 3) == 3 && bk_stop_find(&none, "abc", 3, 0) == -1, "no stops");
}

/* proto_buf_add_str: fixmap growth, the fixmap-15 -> map16 step, map16 growth; ids must be UTF-8 */
static void test_add_str(void) {
    proto_buf b = {0};
    int32_t tok = 3;
    CHECK(proto_encode_token(&b, proto_cstr("t"), &tok, 1, proto_cstr("x")) == 0, "encode token");
    CHECK(proto_buf_add_str(&b, "inst", proto_cstr("0123456789abcdef")) == 0 && oracle_map(&b, 6),
          "token + inst: 6 keys");
    CHECK(dec(b.data, b.len) == 0 && streq(s_m.inst, "0123456789abcdef") && s_m.token.ids[0] == 3, "decoded inst: %s",
          s_err);
    char key[8];
    for (int i = 0; i < 12; i++) { /* 6 -> 18 keys crosses the fixmap limit */
        snprintf(key, sizeof key, "k%d", i);
        CHECK(proto_buf_add_str(&b, key, proto_cstr("v")) == 0, "add %s", key);
    }
    CHECK(b.data[0] == 0xde && oracle_map(&b, 18), "map16 of 18 keys");
    CHECK(dec(b.data, b.len) == 0 && streq(s_m.inst, "0123456789abcdef") && streq(s_m.token.id, "t"),
          "still decodes: %s", s_err);
    b.len = 0;
    CHECK(proto_buf_add_str(&b, "inst", proto_cstr("x")) == -1, "no map: refused");
    proto_buf_free(&b);
    mp m;
    mp_init(&m);
    mp_head(&m, 2, "cancel");
    mp_str(&m, "id");
    msgpack_pack_str(&m.pk, 2);
    msgpack_pack_str_body(&m.pk, "\xff\xfe", 2);
    mp_str(&m, "inst");
    mp_str(&m, "ignored");
    CHECK(mp_dec(&m) == -1 && strstr(s_err, "UTF-8"), "a non-UTF-8 id is refused: %s", s_err);
    CHECK(proto_code_parse(proto_cstr("too_large")) == PROTO_CODE_TOO_LARGE &&
              !strcmp(proto_code_name(PROTO_CODE_BROKER_UNREACHABLE), "broker_unreachable"),
          "new code names");
}

/* structured output: response_format in generate and assign, both ways; bad ones refused */
static void test_format(void) {
    proto_buf b = {0};
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("f1");
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("hi");
    g.format.kind = PROTO_FORMAT_REGEX;
    g.format.text = proto_cstr("[a-z]+");
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 &&
              s_m.generate.format.kind == PROTO_FORMAT_REGEX && proto_str_eq(s_m.generate.format.text, "[a-z]+"),
          "generate with response_format: %s", s_err);
    g.format.kind = PROTO_FORMAT_JSON_OBJECT;
    g.format.text = proto_cstr(NULL);
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 &&
              s_m.generate.format.kind == PROTO_FORMAT_JSON_OBJECT && s_m.generate.format.text.n == 0,
          "json_object without text: %s", s_err);
    int32_t toks[2] = {1, 2};
    proto_seq q;
    memset(&q, 0, sizeof q);
    q.rid = 9;
    q.tokens = toks;
    q.n_tokens = 2;
    q.max_tokens = 4;
    proto_sampling_defaults(&q.sampling);
    q.format.kind = PROTO_FORMAT_GRAMMAR;
    q.format.text = proto_cstr("root ::= \"a\"");
    CHECK(proto_encode_assign(&b, &q, 1) == 0 && dec(b.data, b.len) == 0 &&
              s_m.assign.seqs[0].format.kind == PROTO_FORMAT_GRAMMAR &&
              proto_str_eq(s_m.assign.seqs[0].format.text, "root ::= \"a\""),
          "assign with response_format: %s", s_err);
    static const char *const bad[][2] = {{"xml", "x"}, {"regex", NULL}, {NULL, "x"}};
    for (int i = 0; i < 3; i++) {
        mp m;
        mp_init(&m);
        mp_head(&m, 3, "generate");
        mp_str(&m, "id");
        mp_str(&m, "b");
        mp_str(&m, "prompt");
        mp_str(&m, "p");
        mp_str(&m, "response_format");
        msgpack_pack_map(&m.pk, (bad[i][0] != NULL) + (bad[i][1] != NULL));
        if (bad[i][0]) mp_str(&m, "type"), mp_str(&m, bad[i][0]);
        if (bad[i][1]) mp_str(&m, "text"), mp_str(&m, bad[i][1]);
        CHECK(mp_dec(&m) != 0 && strstr(s_err, "response_format"), "bad response_format %d refused: %s", i, s_err);
    }
    CHECK(!strcmp(proto_format_name(PROTO_FORMAT_JSON_SCHEMA), "json_schema") && !strcmp(proto_format_name(0), ""),
          "format names");
    proto_buf_free(&b);
}

/* prompt logprobs: the generate/assign field, max_tokens 0 only with it, the out's `plp` column and the
 * broker -> client prompt_logprobs message, and their hostile forms */
static void test_prompt_lp(void) {
    proto_buf b = {0};
    proto_generate g;
    proto_generate_defaults(&g);
    g.id = proto_cstr("p");
    g.prompt_kind = PROTO_PROMPT_TEXT;
    g.prompt = proto_cstr("hi");
    g.max_tokens = 0;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) != 0 && strstr(s_err, "prompt_logprobs"),
          "max_tokens 0 without prompt_logprobs refused (%s)", s_err);
    g.sampling.prompt_lp = 1;
    g.sampling.prompt_top = 0;
    CHECK(proto_encode_generate(&b, &g) == 0 && oracle_map(&b, 16) && dec(b.data, b.len) == 0 &&
              s_m.generate.max_tokens == 0 && s_m.generate.sampling.prompt_lp == 1 &&
              s_m.generate.sampling.prompt_top == 0,
          "generate prompt_logprobs 0, max_tokens 0 round trip");
    g.sampling.prompt_top = 20;
    CHECK(proto_encode_generate(&b, &g) == 0 && dec(b.data, b.len) == 0 && s_m.generate.sampling.prompt_top == 20,
          "prompt_logprobs 20");
    g.sampling.prompt_top = 21; /* the encoder clamps: a hand-made frame carries 21 */
    mp m;
    mp_init(&m);
    mp_head(&m, 3, "generate");
    mp_str(&m, "id");
    mp_str(&m, "x");
    mp_str(&m, "prompt");
    mp_str(&m, "hi");
    mp_str(&m, "prompt_logprobs");
    msgpack_pack_uint32(&m.pk, 21);
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "prompt_logprobs"), "prompt_logprobs 21 refused: %s", s_err);
    proto_seq q;
    memset(&q, 0, sizeof q);
    int32_t toks[3] = {1, 2, 3};
    q.rid = 4;
    q.tokens = toks;
    q.n_tokens = 3;
    proto_sampling_defaults(&q.sampling);
    CHECK(proto_encode_assign(&b, &q, 1) == 0 && dec(b.data, b.len) != 0, "assign max_tokens 0 without it refused");
    q.sampling.prompt_lp = 1;
    q.sampling.prompt_top = 5;
    CHECK(proto_encode_assign(&b, &q, 1) == 0 && dec(b.data, b.len) == 0 && s_m.assign.seqs[0].max_tokens == 0 &&
              s_m.assign.seqs[0].sampling.prompt_lp && s_m.assign.seqs[0].sampling.prompt_top == 5,
          "assign prompt_logprobs round trip");
    /* out with plp: entry 0 two rows from position 1, entry 1 none */
    const int32_t tid[2] = {7, 9};
    const float tlp[2] = {-0.5f, -1.5f};
    const proto_logprob rows[2] = {{1, -2.0f, 2, tid, tlp}, {1, -INFINITY, 0, NULL, NULL}};
    const proto_plp plp[2] = {{1, 2, rows}, {0, 0, NULL}};
    const uint64_t rids[2] = {4, 5};
    const int32_t otok[2] = {-1, 11};
    const uint8_t fin[2] = {0, 0};
    CHECK(proto_encode_out_plp(&b, 3, rids, otok, fin, NULL, plp, 2) == 0 && oracle_map(&b, 7) &&
              dec(b.data, b.len) == 0 && s_m.out.plp && s_m.out.plp[0].start == 1 && s_m.out.plp[0].n == 2 &&
              s_m.out.plp[0].lps[0].logprob == -2.0f && s_m.out.plp[0].lps[0].n_top == 2 &&
              s_m.out.plp[0].lps[0].top_id[1] == 9 && s_m.out.plp[0].lps[1].logprob == -INFINITY &&
              s_m.out.plp[1].n == 0,
          "out plp round trip");
    const proto_logprob holes[2] = {{1, -2.0f, 0, NULL, NULL}, {0, 0, 0, NULL, NULL}};
    const proto_plp bad_plp[2] = {{1, 2, holes}, {0, 0, NULL}};
    CHECK(proto_encode_out_plp(&b, 3, rids, otok, fin, NULL, bad_plp, 2) == 0 && dec(b.data, b.len) != 0,
          "a nil row inside plp refused");
    const proto_plp zero[2] = {{0, 2, rows}, {0, 0, NULL}};
    CHECK(proto_encode_out_plp(&b, 3, rids, otok, fin, NULL, zero, 2) == 0 && dec(b.data, b.len) != 0,
          "plp start 0 refused (position 0 has none)");
    mp_init(&m);
    mp_head(&m, 4, "out");
    mp_str(&m, "rids");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 4);
    mp_str(&m, "toks");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int32(&m.pk, -1);
    mp_str(&m, "fin");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint32(&m.pk, 0);
    mp_str(&m, "plp");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    CHECK(mp_dec(&m) != 0 && strstr(s_err, "plp"), "plp longer than rids refused: %s", s_err);
    /* broker -> client */
    const int32_t pids[3] = {1, 2, 3};
    const proto_logprob plps[3] = {{0, 0, 0, NULL, NULL}, rows[0], rows[1]};
    proto_plps pm = {proto_cstr("p"), 0, pids, 3, plps, 2};
    CHECK(proto_encode_plps(&b, &pm) == 0 && oracle_map(&b, 7) && dec(b.data, b.len) == 0 &&
              s_m.type == PROTO_PROMPT_LPS && streq(s_m.plps.id, "p") && s_m.plps.start == 0 && s_m.plps.n_ids == 3 &&
              s_m.plps.ids[2] == 3 && !s_m.plps.lps[0].present && s_m.plps.lps[1].top_id[0] == 7 && s_m.plps.index == 2,
          "prompt_logprobs round trip");
    mp_init(&m);
    mp_head(&m, 4, "prompt_logprobs");
    mp_str(&m, "id");
    mp_str(&m, "p");
    mp_str(&m, "start");
    msgpack_pack_uint32(&m.pk, 0);
    mp_str(&m, "ids");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_uint32(&m.pk, 1);
    msgpack_pack_uint32(&m.pk, 2);
    mp_str(&m, "logprobs");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_nil(&m.pk);
    CHECK(mp_dec(&m) != 0, "prompt_logprobs with ids and logprobs of different lengths refused");
    proto_buf_free(&b);
}

int main(void) {
    test_roundtrips();
    test_prompt_lp();
    test_format();
    test_kv_fields();
    test_add_str();
    test_hostile();
    test_extras();
    test_stop();
    proto_msg_free(&s_m);
    proto_msg_free(&s_m);
    CHECK(proto_code_parse(proto_cstr("worker_failed")) == PROTO_CODE_WORKER_FAILED &&
          proto_code_parse(proto_cstr("zzz")) == PROTO_CODE_OTHER, "code names");
    CHECK(!strcmp(proto_finish_name(PROTO_FINISH_OVERLOADED), "overloaded") && !strcmp(proto_type_name(PROTO_OUT), "out"),
          "finish/type names");
    return test_report();
}
