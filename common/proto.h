/* common/proto.h: the zllm wire protocol (docs/protocol.md, version 1): typed messages, an encoder into a
 * growable buffer, and a decoder that treats every byte as hostile.
 *
 * Decoding is two passes over the frame: a validating walk of the msgpack (nesting depth <= PROTO_MAX_DEPTH,
 * every declared length/count checked against the bytes remaining before anything is allocated, no trailing
 * bytes), then a schema pass that reads known keys with type and range checks. Strings are zero-copy: a
 * proto_str points INTO the decoded frame, so the frame must outlive the use of the decoded message; arrays are
 * copied into an arena owned by the proto_msg, which is reused from one decode to the next (the hot path, `out`
 * and `token`, allocates nothing once warm).
 *
 * Usage:
 *     proto_msg m = {0};  char err[128];
 *     if (proto_decode(frame, len, &m, err, sizeof err) == 0 && m.type == PROTO_OUT) { ... m.out.rids[i] ... }
 *     proto_msg_free(&m);
 *
 *     proto_buf b = {0};
 *     proto_encode_cancel(&b, proto_cstr("req-1"));   ... send b.data, b.len ...
 *     proto_buf_free(&b);
 */
#ifndef ZLLM_PROTO_H
#define ZLLM_PROTO_H
#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION          1
#define PROTO_CLIENT_MAX_FRAME (1u << 20)   /* bytes: ZMQ_MAXMSGSIZE of the broker's client socket */
#define PROTO_WORKER_MAX_FRAME (16u << 20)  /* bytes: ZMQ_MAXMSGSIZE of the broker's worker socket */
#define PROTO_MAX_FRAME        PROTO_WORKER_MAX_FRAME /* proto_decode refuses anything longer */
#define PROTO_MAX_DEPTH        8            /* msgpack nesting levels (the top map is level 1) */
#define PROTO_ID_MAX           64           /* bytes of a client request id (1..64) */
#define PROTO_NAME_MAX         128          /* bytes of a model / worker / device name (1..128) */
#define PROTO_MAX_STOP         8            /* stop strings per request */
#define PROTO_STOP_MAX_LEN     256          /* bytes per stop string (1..256) */
#define PROTO_MAX_STOP_IDS     64           /* stop token ids per request */
#define PROTO_MAX_MESSAGES     1024         /* chat messages per request */
#define PROTO_MAX_TOKENS       (1 << 20)    /* prompt tokens per request / per assigned sequence */
#define PROTO_MAX_GEN          (1 << 20)    /* max_tokens upper bound */
#define PROTO_MAX_SEQS         4096         /* sequences per `assign` / entries per `out` */
#define PROTO_MAX_WORKERS      1024         /* workers listed in a `status` */
#define PROTO_MAX_COUNTERS     64           /* counters in a `status` */
#define PROTO_TOKEN_ID_MAX     0x7fffffff   /* token ids are 0..2^31-1 */
#define PROTO_FORMAT_MAX_LEN (64u * 1024)   /* bytes of a response_format text (schema, regex, grammar) */
#define PROTO_MAX_LOGIT_BIAS 300            /* logit_bias entries per request */
#define PROTO_MAX_TOP_LOGPROBS 20           /* top_logprobs per token */
#define PROTO_PLP_CHUNK 256                 /* prompt positions per broker -> client `prompt_logprobs` message */
#define PROTO_MAX_N 16                      /* completions (`n`) per generate */
#define PROTO_PRIORITY_MIN (-100)           /* generate/assign `priority`: higher is admitted first, default 0 */
#define PROTO_PRIORITY_MAX 100
#define PROTO_MAX_KV_HASHES 4096 /* block hashes in one worker `hb` (`kv_hashes`) */
#define PROTO_MAX_KV_BLOCK 256   /* register `kv_block`: tokens per KV block, 0 = no block accounting */

typedef enum {
    PROTO_NONE = 0,
    /* client <-> broker */
    PROTO_GENERATE, /* client -> broker */
    PROTO_CANCEL,   /* client -> broker (`id`) and broker -> worker (`rids`): same type string */
    PROTO_STATUS,   /* client -> broker (request: only `id`) and broker -> client (the reply) */
    PROTO_TOKEN,    /* broker -> client */
    PROTO_FINAL,    /* broker -> client */
    PROTO_ERROR,    /* broker -> client */
    /* worker <-> broker */
    PROTO_REGISTER,   /* worker -> broker */
    PROTO_REGISTERED, /* broker -> worker */
    PROTO_HB,         /* both ways */
    PROTO_REREGISTER, /* broker -> worker */
    PROTO_ASSIGN,     /* broker -> worker */
    PROTO_OUT,        /* worker -> broker */
    PROTO_PROMPT_LPS, /* broker -> client: `prompt_logprobs` */
    PROTO_TYPE_COUNT
} proto_type;

typedef enum {
    PROTO_FINISH_NONE = 0, PROTO_FINISH_STOP, PROTO_FINISH_LENGTH, PROTO_FINISH_CANCELLED, PROTO_FINISH_ERROR,
    PROTO_FINISH_TIMEOUT, PROTO_FINISH_OVERLOADED, PROTO_FINISH_COUNT
} proto_finish;

typedef enum {
    PROTO_CODE_NONE = 0,
    PROTO_CODE_BAD_REQUEST,
    PROTO_CODE_UNKNOWN_MODEL,
    PROTO_CODE_PROMPT_TOO_LONG,
    PROTO_CODE_TEMPLATE_ERROR,
    PROTO_CODE_OVERLOADED,
    PROTO_CODE_WORKER_FAILED,
    PROTO_CODE_TIMEOUT,
    PROTO_CODE_SHUTTING_DOWN,
    PROTO_CODE_DUPLICATE_ID,
    PROTO_CODE_INTERNAL,
    PROTO_CODE_BAD_MESSAGE,
    PROTO_CODE_TOO_LARGE,          /* a client frame over PROTO_CLIENT_MAX_FRAME */
    PROTO_CODE_NO_CAPACITY,        /* the model has workers but none whose context fits the request */
    PROTO_CODE_BROKER_RESTARTED,   /* client side: replies come from another broker instance */
    PROTO_CODE_BROKER_UNREACHABLE, /* client side: the connection to the broker dropped */
    PROTO_CODE_OTHER,              /* decoded: a code string this build does not know (still in final.code_str) */
    PROTO_CODE_COUNT
} proto_code;

/* `fin` values of an `out` entry */
enum { PROTO_FIN_RUNNING = 0, PROTO_FIN_STOP = 1, PROTO_FIN_LENGTH = 2, PROTO_FIN_CANCELLED = 3,
       PROTO_FIN_ERROR = 4 };

/* which prompt form a generate carries */
enum { PROTO_PROMPT_TEXT = 1, PROTO_PROMPT_TOKENS = 2, PROTO_PROMPT_MESSAGES = 3 };

/* A byte string. Decoded: points into the frame (not NUL-terminated, may contain NUL). Encoding: any bytes. */
typedef struct {
    const char *p;              /* bytes, or NULL when absent */
    uint32_t n;                 /* byte count */
} proto_str;

typedef struct {
    proto_str role;             /* "system", "user", "assistant" (any string of 1..64 bytes) */
    proto_str content;          /* UTF-8 text */
    proto_str tool_call_id;     /* optional (NULL p when absent): the call a "tool" message answers */
    proto_str tool_calls;       /* optional: an assistant's calls as OpenAI's JSON array text (zl_chat_msg) */
} proto_chat;

/* structured output (`response_format`, docs/structured-output.md): the kinds match common/grammar.h's ZG_* */
enum {
    PROTO_FORMAT_NONE = 0,
    PROTO_FORMAT_JSON_SCHEMA = 1,
    PROTO_FORMAT_JSON_OBJECT = 2,
    PROTO_FORMAT_REGEX = 3,
    PROTO_FORMAT_GRAMMAR = 4
};
typedef struct {
    int kind;       /* PROTO_FORMAT_*; NONE when absent */
    proto_str text; /* the JSON schema, regex or GBNF text (empty for json_object), UTF-8 */
} proto_format;
/* one logit bias entry (`logit_bias`: [[id, bias], ...]) */
typedef struct {
    int32_t id; /* token id (the broker checks it against the vocabulary) */
    float bias; /* [-100, 100], added to the id's logit */
} proto_bias;

/* one generated token's logprobs (`lps` in `out`, `logprobs` in `token` and `final`): on the wire nil (none) or
 * [logprob, [top ids], [top logprobs]] */
typedef struct {
    int present;              /* 0: nil (the entry carries no logprobs) */
    float logprob;            /* the token's log probability, <= 0, -inf allowed */
    uint32_t n_top;           /* 0..PROTO_MAX_TOP_LOGPROBS */
    const int32_t *top_id;    /* [n_top] most likely ids, logprob descending, then id ascending */
    const float *top_logprob; /* [n_top] their log probabilities */
} proto_logprob;

/* sampling parameters shared by `generate` and `assign` (docs/protocol.md for ranges) */
typedef struct {
    float temperature;          /* >= 0, finite; 0 = greedy. default 1.0 */
    int32_t top_k;              /* >= 0; 0 = off */
    float top_p;                /* (0,1]; 1 = off */
    float min_p;                /* [0,1); 0 = off */
    float repeat_penalty;       /* > 0; 1 = off */
    uint32_t repeat_last_n;     /* tokens the penalty looks back, default 64 */
    uint64_t seed;              /* RNG seed */
    int has_seed;               /* 1 when seed was given (generate); assign always has it */
    int ignore_eos;             /* 0/1 */
    float presence_penalty;     /* [-2, 2]; 0 = off */
    float frequency_penalty;    /* [-2, 2]; 0 = off */
    const proto_bias *bias;     /* [n_bias] `logit_bias` (decoded: in the arena) */
    uint32_t n_bias;            /* 0..PROTO_MAX_LOGIT_BIAS */
    int logprobs;               /* 0/1: return each generated token's logprob */
    uint32_t top_logprobs;      /* 0..PROTO_MAX_TOP_LOGPROBS alternatives per token (with logprobs) */
    int prompt_lp;              /* 0/1: `prompt_logprobs` given: return the prompt positions' logprobs */
    uint32_t prompt_top;        /* its value: 0..PROTO_MAX_TOP_LOGPROBS alternatives per prompt position */
} proto_sampling;

typedef struct {
    proto_str id;               /* 1..64 bytes */
    proto_str model;            /* 0 bytes (p NULL) = the broker's default model */
    int prompt_kind;            /* PROTO_PROMPT_TEXT / _TOKENS / _MESSAGES */
    proto_str prompt;           /* PROTO_PROMPT_TEXT: <= 1 MiB */
    const int32_t *tokens;      /* PROTO_PROMPT_TOKENS: [n_tokens] ids (no BOS added) */
    uint32_t n_tokens;
    const proto_chat *messages; /* PROTO_PROMPT_MESSAGES: [n_messages] */
    uint32_t n_messages;
    uint32_t max_tokens; /* 1..PROTO_MAX_GEN, default 128; 0 only with sampling.prompt_lp (scoring) */
    proto_sampling sampling;
    proto_str stop[PROTO_MAX_STOP]; /* [n_stop] stop strings, 1..256 bytes each */
    uint32_t n_stop;
    const int32_t *stop_ids;    /* [n_stop_ids] <= 64 */
    uint32_t n_stop_ids;
    int stream;                 /* default 1 */
    uint32_t deadline_ms;       /* default 600000 */
    int special;                /* default 0 */
    int add_bos;                /* -1 = the vocabulary's flag (default), else 0/1 */
    proto_format format;        /* structured output; kind NONE when absent */
    uint32_t n;                 /* completions, 1..PROTO_MAX_N, default 1 (0 is read as 1 when encoding) */
    int32_t priority;           /* PROTO_PRIORITY_MIN..MAX, default 0: higher is admitted first */
} proto_generate;

/* client cancel (`id`) or broker->worker cancel (`rids`); a decoded cancel has at least one of them */
typedef struct {
    proto_str id;               /* client form; p NULL when absent */
    const uint64_t *rids;       /* worker form: [n_rids] */
    uint32_t n_rids;
} proto_cancel;

typedef struct {
    proto_str id;               /* request id */
    const int32_t *ids;         /* [n_ids] new token ids */
    uint32_t n_ids;
    proto_str text;             /* new text */
    const proto_logprob *lps;   /* [n_ids] when the request asked for logprobs, else NULL */
    uint32_t index;             /* the completion (0..n-1) of a generate with n > 1; 0 otherwise */
} proto_token;

typedef struct {
    proto_str id;               /* request id */
    proto_finish finish;        /* never PROTO_FINISH_NONE once decoded */
    proto_code code;            /* PROTO_CODE_NONE when absent */
    proto_str code_str;         /* decoded: the code string as sent (encode ignores it: uses code) */
    proto_str message;          /* human-readable error text, may be empty */
    proto_str text;             /* the rest of the text */
    const int32_t *ids;         /* [n_ids]: all generated ids (non-streaming), else NULL */
    uint32_t n_ids;
    int has_ids;                /* 1 when `ids` is present */
    uint32_t prompt_tokens;     /* usage */
    uint32_t completion_tokens;
    double queue_ms;            /* timings, milliseconds */
    double ttft_ms;
    double total_ms;
    const proto_logprob *lps; /* [n_ids] with ids when the request asked for logprobs, else NULL */
    uint32_t index;           /* the completion (0..n-1) of a generate with n > 1; 0 otherwise */
    uint32_t left;            /* finals still to come for this id (the other completions of a generate with n > 1
                                 * that have not ended): the request has ended when a final says 0 (absent) */
} proto_final;

typedef struct {
    proto_code code;            /* PROTO_CODE_BAD_MESSAGE, ... */
    proto_str code_str;         /* decoded: the code as sent */
    proto_str message;
    proto_str id;               /* the request id it concerns (duplicate_id), p NULL when absent */
} proto_error;

typedef struct {
    proto_str name, model, device;
    uint32_t max_batch, n_slots, n_ctx, free_slots, running;
    uint64_t step;
    int alive;                  /* 0/1 */
    /* KV blocks (docs/kv-cache.md): 0 when the worker reports none */
    uint32_t kv_block;                    /* tokens per block */
    uint32_t kv_used, kv_free, kv_cached; /* blocks, as last reported */
    uint64_t kv_hit_tokens;               /* prompt tokens found in its prefix cache, as it reported */
    uint64_t kv_prompt_tokens;            /* prompt tokens admitted, as it reported */
    uint32_t kv_summary;                  /* block hashes the broker holds for it (cache-aware routing) */
    uint64_t kv_preemptions;              /* sequences it preempted for KV blocks, as it reported */
    uint64_t kv_evictions;                /* cached blocks it reclaimed, as it reported */
} proto_worker_info;

typedef struct {
    proto_str name;             /* counter name */
    uint64_t value;
} proto_counter;

/* one model's capacity in a status reply (key `capacity`) */
typedef struct {
    proto_str model;
    uint32_t workers;    /* live workers registered for it */
    uint32_t free_slots; /* their free sequence slots */
    uint32_t queued;     /* its requests waiting */
    uint64_t refused;    /* registrations refused: its worker table was full of workers that served */
    proto_str reason;    /* "" when it can take work now, else "no_worker" or "no_capacity" */
} proto_model_info;

/* status request (only id/has_id) and status reply (everything) */
typedef struct {
    proto_str id;               /* echoed request id; p NULL when absent */
    int ready;                  /* 0/1 */
    uint32_t queue, active;     /* requests waiting / admitted */
    const proto_str *models;    /* [n_models] */
    uint32_t n_models;
    const proto_worker_info *workers; /* [n_workers] */
    uint32_t n_workers;
    const proto_counter *counters;    /* [n_counters] */
    uint32_t n_counters;
    const proto_model_info *capacity; /* [n_capacity], encoded only when n_capacity > 0; decoded when present */
    uint32_t n_capacity;
} proto_status;

typedef struct {
    proto_str name;             /* unique worker name, 1..128 bytes */
    proto_str model;            /* model name, 1..128 bytes */
    proto_str device;           /* "cpu", "cuda:0", ... 1..128 bytes */
    uint32_t max_batch;         /* >= 1 */
    uint32_t n_slots;           /* >= 1 sequences it can hold */
    uint32_t n_ctx;             /* >= 2 tokens per slot */
    uint64_t kv_tokens;         /* n_slots * n_ctx */
    uint32_t vocab_size;        /* 0 = not given */
    uint32_t heartbeat_ms;      /* 1..60000 */
    uint32_t kv_block;          /* tokens per KV block, 0..PROTO_MAX_KV_BLOCK (0: no block accounting, absent) */
    uint32_t kv_blocks;         /* blocks in its pool */
} proto_register;

typedef struct {
    uint32_t heartbeat_ms;      /* the broker's heartbeat interval */
} proto_registered;

/* a worker's KV block report, carried by its `hb` (docs/kv-cache.md) */
typedef struct {
    int has_kv;                  /* 1 when the kv_* counters are present */
    uint32_t used, free, cached; /* blocks */
    uint64_t hit_tokens;         /* prompt tokens found in the prefix cache since start */
    uint64_t prompt_tokens;      /* prompt tokens admitted since start */
    int has_hashes;              /* 1 when `kv_hashes` is present: it replaces the broker's summary */
    const uint64_t *hashes;      /* [n_hashes] chain hashes of cached blocks (common/kv_hash.h) */
    uint32_t n_hashes;           /* <= PROTO_MAX_KV_HASHES */
    uint64_t preemptions;        /* sequences preempted for KV blocks since start */
    uint64_t evictions;          /* cached blocks reclaimed since start */
} proto_kv;

typedef struct {
    int has_step;               /* 0 for a broker->worker hb (no fields) */
    uint64_t step;              /* steps run so far */
    uint32_t free_slots;
    uint32_t running;
    uint64_t prefills_shared; /* sequences so far whose prompt KV the worker copied from a sibling (`share`)
                                 * instead of prefilling it (omitted when 0) */
    proto_kv kv;              /* worker: its KV report (has_kv 0 when absent) */
} proto_hb;

typedef struct {
    uint64_t rid;               /* broker sequence id */
    const int32_t *tokens;      /* [n_tokens] the whole prompt, >= 1 */
    uint32_t n_tokens;
    uint32_t max_tokens; /* >= 1; 0 only with sampling.prompt_lp */
    proto_sampling sampling;
    const int32_t *stop_ids;    /* [n_stop_ids] */
    uint32_t n_stop_ids;
    proto_format format; /* structured output; kind NONE when absent */
    uint64_t share;      /* rid of an earlier sequence of the same assign with the same prompt, whose prompt
                                 * KV the worker may copy instead of prefilling (a sibling of `n`); 0: none */
    int32_t priority;    /* PROTO_PRIORITY_MIN..MAX (default 0) */
} proto_seq;

typedef struct {
    const proto_seq *seqs;      /* [n_seqs], 1..PROTO_MAX_SEQS */
    uint32_t n_seqs;
} proto_assign;

/* one `out` entry's prompt logprobs (`plp`): on the wire nil (none) or [start, [entries]] */
typedef struct {
    uint32_t start;           /* the prompt position of lps[0] (>= 1): entry j scores the token at start + j given
                                 * the tokens before it */
    uint32_t n;               /* entries; 0: none (nil) */
    const proto_logprob *lps; /* [n] each present */
} proto_plp;

typedef struct {
    uint64_t step;
    const uint64_t *rids;       /* [n] */
    const int32_t *toks;        /* [n] token or -1 */
    const uint8_t *fin;         /* [n] PROTO_FIN_* */
    uint32_t n;                 /* 0..PROTO_MAX_SEQS; rids are unique within a message */
    const proto_logprob *lps;   /* [n] (`lps`, optional): each entry's token's logprobs, or NULL when absent */
    const proto_plp *plp;       /* [n] (`plp`, optional): each entry's prompt logprobs, or NULL when absent */
} proto_out;

/* broker -> client `prompt_logprobs`: the logprobs of prompt positions [start, start + n_ids), sent in order,
 * before the request's first `token` (and its `final`), in messages of at most PROTO_PLP_CHUNK positions */
typedef struct {
    proto_str id;             /* request id */
    uint32_t start;           /* position of ids[0] in the prompt */
    const int32_t *ids;       /* [n_ids] the prompt's token ids at those positions */
    uint32_t n_ids;           /* 1..PROTO_PLP_CHUNK */
    const proto_logprob *lps; /* [n_ids]: nil (present 0) for position 0, which nothing precedes */
    uint32_t index;           /* the completion (0..n-1) of a generate with n > 1; 0 otherwise */
} proto_plps;

struct proto_arena;             /* internal: chunked bump allocator */

/* A decoded message. Zero-initialise before the first decode; proto_msg_free releases the arena. */
typedef struct {
    proto_type type;
    proto_str inst;             /* the broker instance id on a broker -> client message; p NULL when absent */
    uint32_t version;           /* `zllm` value */
    union {
        proto_generate generate;
        proto_cancel cancel;
        proto_status status;
        proto_token token;
        proto_final final;
        proto_error error;
        proto_register reg;
        proto_registered registered;
        proto_hb hb;
        proto_assign assign;
        proto_out out;
        proto_plps plps;
    };
    struct proto_arena *arena;  /* owned: arrays of the last decode */
} proto_msg;

/* Growable output buffer. Zero-initialise; every proto_encode_X replaces its contents with one message. */
typedef struct {
    uint8_t *data;              /* [len] encoded bytes */
    size_t len, cap;
    int failed;                 /* set when an allocation failed: the content is incomplete */
} proto_buf;

/* Decodes one frame. Returns 0 with *out filled, or -1 with a message in err (never crashes, never reads
 * outside buf[0..len)). out's previous arrays are released/reused: pointers from an earlier decode into
 * out's arena become invalid. Strings point into buf. */
int proto_decode(const void *buf, size_t len, proto_msg *out, char *err, size_t errlen);
/* Releases the arena; the message is zeroed and may be reused. Idempotent. */
void proto_msg_free(proto_msg *m);

/* Validates buf as exactly one msgpack object with nesting <= max_depth and consistent lengths, no trailing
 * bytes. Returns 0, or -1 with a message. (proto_decode calls it; exported for tests and fuzzing.) */
int proto_msgpack_validate(const void *buf, size_t len, int max_depth, char *err, size_t errlen);

/* For a frame that failed proto_decode: when it is nevertheless a msgpack map (within the limits) holding a
 * string `type` and a string `id` of 1..PROTO_ID_MAX bytes, sets them (pointing into buf) and returns 0, so the
 * broker can answer with a final for that id; -1 otherwise. */
int proto_peek_id(const void *buf, size_t len, proto_str *type, proto_str *id);

/* Encoders: each one resets b and writes one complete map; returns 0, or -1 on allocation failure (b->failed).
 * Strings with p == NULL are omitted where the field is optional. */
int proto_encode_generate(proto_buf *b, const proto_generate *g);
int proto_encode_cancel(proto_buf *b, proto_str id);                              /* client -> broker */
int proto_encode_cancel_rids(proto_buf *b, const uint64_t *rids, uint32_t n);     /* broker -> worker */
int proto_encode_status_request(proto_buf *b, proto_str id);                      /* client -> broker */
int proto_encode_status(proto_buf *b, const proto_status *s);                     /* broker -> client */
int proto_encode_token(proto_buf *b, proto_str id, const int32_t *ids, uint32_t n_ids, proto_str text);
/* a token message with logprobs (lps [n_ids] or NULL) and an index (omitted when 0) */
int proto_encode_token_ex(proto_buf *b, proto_str id, const int32_t *ids, uint32_t n_ids, proto_str text,
                          const proto_logprob *lps, uint32_t index);
int proto_encode_final(proto_buf *b, const proto_final *f);
int proto_encode_error(proto_buf *b, proto_code code, proto_str message);
int proto_encode_error_id(proto_buf *b, proto_code code, proto_str id, proto_str message); /* id omitted if p NULL */
int proto_encode_register(proto_buf *b, const proto_register *r);
int proto_encode_registered(proto_buf *b, uint32_t heartbeat_ms);
int proto_encode_hb_worker(proto_buf *b, uint64_t step, uint32_t free_slots, uint32_t running,
                           uint64_t prefills_shared); /* worker */
/* a worker hb with its KV report (kv NULL: as proto_encode_hb_worker; kv->has_hashes: with `kv_hashes`) */
int proto_encode_hb_kv(proto_buf *b, uint64_t step, uint32_t free_slots, uint32_t running, uint64_t prefills_shared,
                       const proto_kv *kv);
int proto_encode_hb_broker(proto_buf *b);                                          /* broker -> worker */
int proto_encode_reregister(proto_buf *b);
int proto_encode_assign(proto_buf *b, const proto_seq *seqs, uint32_t n_seqs);
int proto_encode_out(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks,
                     const uint8_t *fin, uint32_t n);
/* an out with logprobs (lps [n] or NULL: no `lps` key) */
int proto_encode_out_lp(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks, const uint8_t *fin,
                        const proto_logprob *lps, uint32_t n);
/* an out with logprobs and prompt logprobs (plp [n] or NULL: no `plp` key; entries with n 0 are nil) */
int proto_encode_out_plp(proto_buf *b, uint64_t step, const uint64_t *rids, const int32_t *toks, const uint8_t *fin,
                         const proto_logprob *lps, const proto_plp *plp, uint32_t n);
/* broker -> client prompt_logprobs (index omitted when 0) */
int proto_encode_plps(proto_buf *b, const proto_plps *p);
void proto_buf_free(proto_buf *b);   /* idempotent */
/* Adds key: v to the top-level map of an encoded message (the broker's instance id on every client-bound
 * message). Returns 0, or -1 when b holds no map or the allocation failed. */
int proto_buf_add_str(proto_buf *b, const char *key, proto_str v);

/* Defaults for a generate (sampling defaults, max_tokens 128, stream 1, deadline 600000, add_bos -1). */
void proto_generate_defaults(proto_generate *g);
void proto_sampling_defaults(proto_sampling *s);

/* helpers */
proto_str proto_cstr(const char *s);                 /* {s, strlen(s)}; {NULL,0} for NULL */
int proto_str_eq(proto_str a, const char *s);        /* 1 when a equals the C string s */
/* copies s into dst[cap] NUL-terminated (truncating), returns dst */
char *proto_str_copy(proto_str s, char *dst, size_t cap);
const char *proto_type_name(proto_type t);           /* "generate", ... ; "?" when out of range */
const char *proto_format_name(int kind);             /* "json_schema", ... ; "" for NONE */
const char *proto_finish_name(proto_finish f);       /* "stop", ... ; "" for NONE */
const char *proto_code_name(proto_code c);           /* "bad_request", ... ; "" for NONE */
proto_code proto_code_parse(proto_str s);            /* NONE for "", PROTO_CODE_OTHER when unknown */
#endif
