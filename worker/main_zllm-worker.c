/* worker/main_zllm-worker.c: zllm-worker, one model on one device, serving a broker (docs/protocol.md).
 *
 *   zllm-worker --broker ENDPOINT -m MODEL.gguf [--name NAME] [--model-name NAME] [--device cpu|cuda[:N]]
 *               [--max-batch M] [--ctx N] [--step-tokens T] [--step-budget T] [--threads N] [--heartbeat-ms MS]
 *               [--curve-server-key BROKER.pub --curve-key WORKER.key]
 *
 * One thread, one DEALER socket, one loop (after the zguide's Paranoid Pirate worker): read every message the
 * broker sent, run one engine step through the continuous batcher, send one `out` for the step, and send `hb`
 * from this same loop, so that a loop stuck in a step stops the heartbeats and the broker notices.
 * With lanes (a pipeline leader: 2; --lanes N), each turn collects one lane's step in flight and submits its
 * next one: a turn waits for at most one step, and cancels and heartbeats are handled between turns while the
 * other lane's step is in flight (a cancelled sequence's slot is reused only after its step is collected).
 * With one lane over an engine whose steps run asynchronously (CUDA; --ahead 0 / 1 forces it off / on),
 * each turn queues the next step, its tokens fed on the device, before it waits for the step in flight: the GPU
 * goes from step to step without waiting for this loop (worker/batcher.h).
 * A broker silent for 3 of its heartbeat intervals is presumed gone: the worker drops its sequences, opens a new
 * socket and registers again (ZeroMQ's reconnect alone does not re-register). An engine error is fatal: the
 * worker logs the step and the rids it held and exits 3, because a device in an unknown state must not keep
 * serving (a supervisor restarts it; the broker fails or requeues its requests).
 *
 * Include map:
 *   batcher.h   - batcher_new/add/cancel/step: continuous batching over the engine, checks broker input
 *   engine.h    - engine_new/engine_destroy: the backend (cpu, cuda)
 *   model.h     - model_load: the GGUF model
 *   tokenizer.h - tokenizer_new/tokenizer_is_eog: end-of-generation ids from the model's vocabulary
 *   grammar.h   - structured output: response_format grammars (cached) and the vocabulary their masks cover
 *   proto.h     - proto_decode/proto_encode_*: the wire protocol
 *   phase_times.h - --phase-times: the host time of each step's phases, logged at exit */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "batcher.h"
#include "kv_hash.h"
#include "zkey.h"
#include "stage.h"
#include "engine.h"
#include "model.h"
#include "proto.h"
#include "tokenizer.h"
#include "grammar.h"
#include "phase_times.h"
#include "version.h"
#ifdef ZLLM_HAVE_CUDA
#include "engine_cuda.h"
#endif

#define S_REGISTER_RETRY_MS 250    /* resend `register` until `registered` comes back (a send fails while the
                                    * connection is not up: ZMQ_IMMEDIATE) */
#define S_SILENCE_BEATS     3      /* broker heartbeats missed before it is presumed gone (protocol) */
#define S_IDLE_POLL_MS      100    /* longest poll when idle: bounds the reaction time to SIGTERM */
/* Steps are kept to about half a heartbeat interval by adapting the cap on prompt tokens per step: a long prompt
 * on a slow or busy CPU would otherwise run one multi-second step, during which no heartbeat leaves the loop and
 * the broker rightly declares the worker dead. The cap shrinks in proportion when a step overruns the target
 * and doubles after a fast step that the cap limited (so a GPU reaches its full chunk after a few prompts). */
#define S_STEP_TARGET_FRACTION 0.5
#define S_STEP_BUDGET_CUDA 128 /* --step-budget's default on CUDA (docs/perf.md, "The step budget") */

typedef struct {
    const char *broker;            /* endpoint to connect */
    const char *model_path;        /* GGUF file */
    char name[PROTO_NAME_MAX + 1]; /* worker name, unique per broker */
    char model_name[PROTO_NAME_MAX + 1]; /* model name it registers */
    const char *device;            /* "cpu", "cuda", "cuda:N" */
    int max_batch;                 /* sequences per step (also the slot count) */
    int n_ctx;                     /* tokens per slot; 0 = engine default */
    int step_tokens;               /* most tokens per step; 0 = device default */
    int step_budget;               /* tokens per step while sequences decode; -1 = device default, 0 = off */
    int threads;                   /* CPU threads; 0 = all */
    int heartbeat_ms;              /* heartbeat interval */
    int step_delay_ms;             /* fault injection / test pacing: sleep after each step (0: off) */
    int fail_at_step;              /* fault injection: step N reports an engine error (0: off) */
    int kv_split;                  /* --debug-kv-split: the engine is taken as one with kv_split_kernels (tests run
                                    * the CUDA engine's batcher paths on the CPU engines) */
    int stage, n_stages;           /* pipeline stage I of N (worker/stage.h); n_stages 0: no pipeline */
    const char *group;             /* pipeline shm group name (--group) */
    int lanes;                     /* --lanes: steps in flight (batcher.h); 0: what the engine asks for */
    int ahead;                     /* --ahead: 1 / 0 queue steps ahead on / off; -1: as the engine says */
    int mask_threads;              /* --mask-threads: threads computing structured output's masks; 0: default */
    int phase_times;               /* --phase-times: 1 logs each phase's host time per step at exit */
    int kv_block;                  /* --kv-block: tokens per KV block of the block accounting; 0: off */
    int kv_blocks;                 /* --kv-blocks: paged KV of that many blocks where the engine offers it; 0: off;
                                    * -1 (default): a pool of the slots' size where it can run (s_paged) */
    int prefix_cache;              /* --prefix-cache: 1 (default) cached prompt prefixes are reused; 0: never */
    const char *curve_server_key;  /* --curve-server-key: file with the broker's Z85 public key, or NULL */
    const char *curve_key;         /* --curve-key: file with this worker's Z85 secret key, or NULL */
    char curve_srv[41], curve_pub[41], curve_sec[41]; /* the keys in Z85 (read at startup; pub derived) */
} s_opts;

typedef struct {
    s_opts o;                      /* options */
    zl_model *model;               /* loaded model */
    zl_engine *engine;             /* backend */
    wk_batcher *batcher;           /* continuous batching state */
    zg_vocab *gvocab;              /* the vocabulary as token bytes, for structured output's masks (NULL: none) */
    zg_cache *grammars;            /* compiled response_format grammars, by hash of their text */
    void *zctx;                    /* ZeroMQ context */
    void *sock;                    /* DEALER to the broker, NULL between sessions */
    int registered;                /* 1 after `registered` for the current registration */
    uint32_t broker_hb_ms;         /* the broker's heartbeat interval (from `registered`) */
    int64_t last_heard;            /* ms: last message from the broker */
    int64_t last_hb;               /* ms: last `hb` sent */
    int64_t last_register;         /* ms: last `register` sent */
    wk_event *ev;                  /* [ev_cap] events of one step */
    int ev_cap;                    /* batcher_event_cap */
    uint64_t *out_rids;            /* [ev_cap] out columns */
    int32_t *out_toks;             /* [ev_cap] */
    uint8_t *out_fin;              /* [ev_cap] */
    proto_logprob *out_lps;        /* [ev_cap] (pointing into ev's logprobs) */
    proto_plp *out_plp;            /* [ev_cap] prompt logprobs per event (pointing into plp_rows) */
    proto_logprob *plp_rows;       /* [max_step_tokens] their entries (pointing into the batcher's rows) */
    proto_buf buf;                 /* encode buffer */
    proto_msg msg;                 /* decode state */
    uint64_t bad_messages;         /* undecodable or unexpected messages from the broker */
    uint64_t send_drops;           /* sends that failed (broker unreachable) */
    uint64_t *kv_hashes;           /* [PROTO_MAX_KV_HASHES] hb scratch: the cached blocks' hashes */
    wk_phase_times *times;         /* --phase-times 1: per-step phase timings, else NULL */
    double t_step[4];              /* with times: the last s_step's start, end of batcher_step, end of its out, end of
                                    * the masks' flush */
} s_worker;

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_dump; /* SIGUSR1: log the phase times so far and start afresh (--phase-times) */

static void s_on_signal(int sig) {
    (void)sig;
    s_stop = 1;
}

static void s_on_usr1(int sig) {
    (void)sig;
    s_dump = 1;
}

static int64_t s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void s_log(const s_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_log(const s_worker *w, const char *fmt, ...) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%02d:%02d:%02d.%03ld zllm-worker %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, w->o.name, msg);
}

static void s_usage(FILE *f) {
    fprintf(f,
            "usage: zllm-worker --broker ENDPOINT -m MODEL.gguf [options]\n"
            "       zllm-worker --help | --version\n"
            "  --broker EP          the broker's worker endpoint (required, except for pipeline stages 1..N-1)\n"
            "  -m, --model FILE     the GGUF model (required)\n"
            "  --name NAME          worker name (default host:pid)\n"
            "  --model-name NAME    model name to register (default: the file name without .gguf)\n"
            "  --device DEV         cpu, cpu-ref, cuda or cuda:N (default cpu: the fast engine; cpu-ref: the f32 "
            "reference)\n"
            "  --max-batch M        sequences per step and slots, 1..4096 (default 16)\n"
            "  --ctx N              tokens per sequence slot, 2..1048576 (default: the model's, at most 4096)\n"
            "  --step-tokens T      most tokens per step, 1..1048576 (default 256 on cpu, 2048 on cuda;\n"
            "                       prompt chunks shrink further to keep steps near half a heartbeat)\n"
            "  --step-budget T      tokens per step while sequences decode, 0..1048576, 0 off (default 128 on\n"
            "                       cuda, 0 on cpu): decodes first, prompt chunks get the rest (at least T/4),\n"
            "                       so a long prompt is spread over steps instead of stalling the streams;\n"
            "                       a prompt alone still takes --step-tokens at once (docs/perf.md)\n"
            "  --threads N          CPU threads, 0..1024 (default 0: all cores)\n"
            "  --heartbeat-ms MS    heartbeat interval, 10..60000 (default 500)\n"
            "  --debug-step-delay-ms MS  sleep after every step, 0..10000 (default 0; tests: slows streams down)\n"
            "  --debug-fail-at-step N    step N fails as a device error would (default never; tests: the fatal path)\n"
            "  --debug-kv-split 1   treat the engine as one whose decode and prefill kernels differ (as CUDA's):\n"
            "                       only prompt rows are published, a resumed sequence replays its generated\n"
            "                       tokens as decode entries (tests of those paths on the CPU engines)\n"
            "  --stage I/N          pipeline stage I of N (docs/pipeline.md; all cpu, or all cuda[:K]): stage 0\n"
            "                       talks to the broker,\n"
            "                       stages 1..N-1 need no --broker and serve stage 0 through shared memory\n"
            "  --group NAME         the pipeline's shared-memory group (the same for all its stages; required with "
            "--stage)\n"
            "  --lanes N            independent groups of sequences with a step in flight each (default: the\n"
            "                       engine's, 2 for a pipeline leader so that every stage stays busy; 1 disables)\n"
            "  --ahead 0|1          queue each step before waiting for the one in flight: off / on (default: on\n"
            "                       where the engine's steps run asynchronously, i.e. CUDA; one lane only)\n"
            "  --mask-threads N     threads computing structured output's token masks, 1..256 (default: the\n"
            "                       cores, at most 8)\n"
            "  --phase-times 0|1    measure the host time of each step's phases (waiting for the device, grammar\n"
            "                       accepts, masks, building, launching, out messages, socket work) and log their\n"
            "                       mean and p99 per step at exit, for steps with and without grammars (default 0);\n"
            "                       SIGUSR1 logs them at once and starts counting afresh\n"
            "  --kv-block N         tokens per KV block of the block accounting and prefix cache, 0..256, 0 off\n"
            "                       (default 16; docs/kv-cache.md): its counters and cached-block hashes go\n"
            "                       to the broker in every heartbeat, for cache-aware routing\n"
            "  --kv-blocks N        paged KV of N blocks of --kv-block tokens on an engine that offers it (the CPU\n"
            "                       engines; CUDA with --kv-block 16..256, a power of two; one lane): a cached\n"
            "                       prompt prefix is not\n"
            "                       prefilled again, and a sequence short of blocks preempts the lowest priority,\n"
            "                       newest one; at least ceil(ctx / kv-block) + 1; 0: contiguous slots; default:\n"
            "                       as many blocks as the slots hold, where paged KV can run (no --lanes N > 1\n"
            "                       nor --stage; on CUDA a --kv-block of 16..256, a power of two), else\n"
            "                       contiguous slots\n"
            "  --prefix-cache 0|1   reuse cached prompt prefixes (1, default) or never (0: no block is published\n"
            "                       nor taken from the cache; blocks and preemption work as with 1, the tokens\n"
            "                       are the same): the baseline that measures what caching buys; off on an\n"
            "                       engine whose prefill is not chunk invariant (CUDA with F32 matrices)\n"
            "  --curve-server-key FILE  CURVE: the broker's public key (zllm-broker --keygen PREFIX: PREFIX.pub)\n"
            "  --curve-key FILE     CURVE: this worker's secret key (PREFIX.key; its PREFIX.pub must be in the\n"
            "                       broker's --curve-allow directory; the broker runs with --curve-workers)\n"
            "  -h, --help           this text;  --version  print the version\n"
            "Environment: ZLLM_CUDA_* switches turn single paths of the CUDA engine off, for comparisons\n"
            "  (docs/cuda.md lists them; none is needed for correct results).\n"
            "Exit status: 0 after SIGINT/SIGTERM, 2 on a usage error, 3 on an engine error, 1 on any other error.\n");
}

/* parses a decimal int in [lo, hi]; returns 0 or -1 */
static int s_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int s_parse(int argc, char **argv, s_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_batch = 16;
    o->heartbeat_ms = 500;
    o->kv_block = 16;
    o->kv_blocks = -1;
    o->prefix_cache = 1;
    o->ahead = -1;
    o->step_budget = -1;
    const char *name = NULL, *model_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf("zllm-worker %s\n", ZLLM_VERSION);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zllm-worker: %s needs a value (or is unknown)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--broker")) o->broker = v;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_path = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--model-name")) model_name = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--max-batch")) bad = s_int(v, 1, 4096, &o->max_batch);
        else if (!strcmp(a, "--ctx")) bad = s_int(v, 2, 1 << 20, &o->n_ctx);
        else if (!strcmp(a, "--step-tokens")) bad = s_int(v, 1, 1 << 20, &o->step_tokens);
        else if (!strcmp(a, "--step-budget")) bad = s_int(v, 0, 1 << 20, &o->step_budget);
        else if (!strcmp(a, "--threads")) bad = s_int(v, 0, 1024, &o->threads);
        else if (!strcmp(a, "--heartbeat-ms")) bad = s_int(v, 10, 60000, &o->heartbeat_ms);
        else if (!strcmp(a, "--debug-step-delay-ms")) bad = s_int(v, 0, 10000, &o->step_delay_ms);
        else if (!strcmp(a, "--debug-fail-at-step")) bad = s_int(v, 0, INT_MAX, &o->fail_at_step);
        else if (!strcmp(a, "--debug-kv-split")) bad = s_int(v, 0, 1, &o->kv_split);
        else if (!strcmp(a, "--stage")) bad = stage_parse(v, &o->stage, &o->n_stages);
        else if (!strcmp(a, "--group")) o->group = v;
        else if (!strcmp(a, "--lanes")) bad = s_int(v, 1, WK_MAX_LANES, &o->lanes);
        else if (!strcmp(a, "--ahead")) bad = s_int(v, 0, 1, &o->ahead);
        else if (!strcmp(a, "--mask-threads")) bad = s_int(v, 1, 256, &o->mask_threads);
        else if (!strcmp(a, "--phase-times")) bad = s_int(v, 0, 1, &o->phase_times);
        else if (!strcmp(a, "--kv-block")) bad = s_int(v, 0, KV_BLOCK_MAX, &o->kv_block);
        else if (!strcmp(a, "--kv-blocks")) bad = s_int(v, 0, 1 << 24, &o->kv_blocks);
        else if (!strcmp(a, "--prefix-cache")) bad = s_int(v, 0, 1, &o->prefix_cache);
        else if (!strcmp(a, "--curve-server-key")) o->curve_server_key = v;
        else if (!strcmp(a, "--curve-key")) o->curve_key = v;
        else {
            fprintf(stderr, "zllm-worker: unknown option %s\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "zllm-worker: bad value for %s: %s\n", a, v);
            return -1;
        }
    }
    if ((!o->broker && o->stage == 0) || !o->model_path) {
        s_usage(stderr);
        return -1;
    }
    if (o->n_stages && !o->group) {
        fprintf(stderr, "zllm-worker: --stage needs --group NAME\n");
        return -1;
    }
    if (name) {
        snprintf(o->name, sizeof o->name, "%s", name);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(o->name, sizeof o->name, "%s:%d", host, (int)getpid());
    }
    if (model_name) {
        snprintf(o->model_name, sizeof o->model_name, "%s", model_name);
    } else {
        const char *base = strrchr(o->model_path, '/');
        base = base ? base + 1 : o->model_path;
        snprintf(o->model_name, sizeof o->model_name, "%s", base);
        size_t n = strlen(o->model_name);
        if (n > 5 && !strcmp(o->model_name + n - 5, ".gguf")) o->model_name[n - 5] = 0;
    }
    if (!o->name[0] || !o->model_name[0]) {
        fprintf(stderr, "zllm-worker: empty --name or --model-name\n");
        return -1;
    }
    if (!o->curve_server_key != !o->curve_key) {
        fprintf(stderr, "zllm-worker: --curve-server-key and --curve-key go together\n");
        return -1;
    }
    if (o->curve_key) {   /* read once: a missing or malformed key file fails at startup, not per connection */
        char kerr[256];
        if (zkey_read(o->curve_server_key, o->curve_srv, kerr, sizeof kerr) != 0 ||
            zkey_read(o->curve_key, o->curve_sec, kerr, sizeof kerr) != 0) {
            fprintf(stderr, "zllm-worker: %s\n", kerr);
            return -1;
        }
        if (zmq_curve_public(o->curve_pub, o->curve_sec) != 0) {
            fprintf(stderr, "zllm-worker: %s: %s\n", o->curve_key, zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    if (!o->step_tokens) o->step_tokens = strncmp(o->device, "cpu", 3) == 0 ? 256 : 2048;
    /* CUDA: the 16-bit products take batch tiles of 128 rows above 64, so a step of 64 decodes with 64 prompt
     * tokens (a budget of 128) costs about 1.2x a decode-only one on an H200, and one of 129 to 256 rows 1.7 to
     * 1.8x: 128 gives the serving mix its best throughput and keeps the inter-token latency's p99 within 1.3x of
     * its p50 while 2,048-token prompts arrive (docs/perf.md, "The step budget") */
    if (o->step_budget < 0) o->step_budget = strncmp(o->device, "cpu", 3) == 0 ? 0 : S_STEP_BUDGET_CUDA;
    return 0;
}

/* end-of-generation bitmap [vocab] from the model's vocabulary; falls back to the eos/eot metadata ids */
static uint8_t *s_eog_map(s_worker *w) {
    int vocab = w->model->cfg.vocab_size;
    uint8_t *eog = calloc((size_t)vocab, 1);
    if (!eog) return NULL;
    char err[256];
    zl_tokenizer *t = tokenizer_new(w->model->gguf, err, sizeof err);
    int n = 0;
    if (t) {
        for (int i = 0; i < vocab; i++) n += eog[i] = tokenizer_is_eog(t, i) ? 1 : 0;
        if (tokenizer_n_vocab(t) == vocab) w->gvocab = grammar_vocab_from_tokenizer(t, err, sizeof err);
        if (!w->gvocab)
            s_log(w, "no structured output: %s", tokenizer_n_vocab(t) == vocab ? err : "vocabulary size differs");
        tokenizer_destroy(&t);
    } else {
        s_log(w, "no tokenizer (%s): end-of-generation ids from metadata only", err);
        const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                              "tokenizer.ggml.eom_token_id"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            int64_t id = gguf_get_int(w->model->gguf, keys[k], -1);
            if (id >= 0 && id < vocab) n += eog[id] = 1;
        }
    }
    s_log(w, "%d end-of-generation ids", n);
    return eog;
}

/* sends the encoded buffer without blocking; a failure (no broker connection) is counted, never waited on */
static int s_send(s_worker *w) {
    if (!w->sock || w->buf.failed) return -1;
    if (zmq_send(w->sock, w->buf.data, w->buf.len, ZMQ_DONTWAIT) < 0) {
        w->send_drops++;
        return -1;
    }
    return 0;
}

static void s_send_register(s_worker *w) {
    proto_register r = {
        .name = proto_cstr(w->o.name),
        .model = proto_cstr(w->o.model_name),
        .device = proto_cstr(w->engine->device),
        .max_batch = (uint32_t)w->engine->max_batch,
        .n_slots = (uint32_t)w->engine->n_slots,
        .n_ctx = (uint32_t)w->engine->n_ctx,
        .kv_tokens = (uint64_t)w->engine->n_slots * (uint64_t)w->engine->n_ctx,
        .vocab_size = (uint32_t)w->model->cfg.vocab_size,
        .heartbeat_ms = (uint32_t)w->o.heartbeat_ms,
    };
    wk_kv_stats kv;
    if (batcher_kv(w->batcher, &kv)) {
        r.kv_block = (uint32_t)kv.block_size;
        r.kv_blocks = (uint32_t)kv.blocks;
    }
    w->last_register = s_now_ms();
    if (proto_encode_register(&w->buf, &r) == 0) s_send(w);
}

/* the heartbeat carries the KV report: block counters and the hashes of the most recently used cached blocks
 * (docs/kv-cache.md), every time (the broker replaces its summary with each report) */
static void s_send_hb(s_worker *w) {
    w->last_hb = s_now_ms();
    wk_kv_stats st;
    proto_kv kv;
    memset(&kv, 0, sizeof kv);
    if (batcher_kv(w->batcher, &st)) {
        kv.has_kv = 1;
        kv.used = (uint32_t)st.used;
        kv.free = (uint32_t)st.free;
        kv.cached = (uint32_t)st.cached;
        kv.hit_tokens = st.hit_tokens;
        kv.prompt_tokens = st.prompt_tokens;
        kv.preemptions = st.preemptions;
        kv.evictions = st.evictions;
        if (w->kv_hashes) {
            kv.has_hashes = 1;
            kv.hashes = w->kv_hashes;
            kv.n_hashes = (uint32_t)batcher_kv_hashes(w->batcher, w->kv_hashes, PROTO_MAX_KV_HASHES);
        }
    }
    if (proto_encode_hb_kv(&w->buf, batcher_steps(w->batcher), (uint32_t)batcher_free_slots(w->batcher),
                           (uint32_t)batcher_running(w->batcher), batcher_prefills_shared(w->batcher), &kv) == 0)
        s_send(w);
}

static void s_close_socket(s_worker *w) {
    if (w->sock) zmq_close(w->sock);
    w->sock = NULL;
    w->registered = 0;
}

/* a fresh DEALER (a new identity: the broker forgets the old one) and a first `register` */
static int s_open_socket(s_worker *w) {
    s_close_socket(w);
    w->sock = zmq_socket(w->zctx, ZMQ_DEALER);
    if (!w->sock) return -1;
    int zero = 0, one = 1, hwm = 10000, rivl = 100, rmax = 1000;
    int64_t maxmsg = PROTO_WORKER_MAX_FRAME;
    zmq_setsockopt(w->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(w->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(w->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(w->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(w->sock, ZMQ_RECONNECT_IVL, &rivl, sizeof rivl);
    zmq_setsockopt(w->sock, ZMQ_RECONNECT_IVL_MAX, &rmax, sizeof rmax);
    zmq_setsockopt(w->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    /* CURVE client: a broker with --curve-workers admits only keys in its allow-list (the handshake fails
     * otherwise, so nothing is ever sent: the worker keeps retrying `register` and never serves) */
    if (w->o.curve_key && (zmq_setsockopt(w->sock, ZMQ_CURVE_SERVERKEY, w->o.curve_srv, 40) != 0 ||
                           zmq_setsockopt(w->sock, ZMQ_CURVE_PUBLICKEY, w->o.curve_pub, 40) != 0 ||
                           zmq_setsockopt(w->sock, ZMQ_CURVE_SECRETKEY, w->o.curve_sec, 40) != 0)) {
        s_log(w, "CURVE setup: %s", zmq_strerror(zmq_errno()));
        s_close_socket(w);
        return -1;
    }
    if (zmq_connect(w->sock, w->o.broker) != 0) {
        s_log(w, "connect %s: %s", w->o.broker, zmq_strerror(zmq_errno()));
        s_close_socket(w);
        return -1;
    }
    w->last_heard = s_now_ms();
    w->last_register = 0;   /* register at the first loop turn (the connection may not be up yet) */
    return 0;
}

static void s_handle_assign(s_worker *w, const proto_assign *a) {
    char err[256];
    for (uint32_t i = 0; i < a->n_seqs; i++) {
        const proto_seq *q = &a->seqs[i];
        const proto_sampling *ps = &q->sampling;
        wk_request r;
        memset(&r, 0, sizeof r);
        r.rid = q->rid;
        r.tokens = q->tokens;
        /* the decoder bounds these by PROTO_MAX_TOKENS / PROTO_MAX_GEN / PROTO_MAX_STOP_IDS, all < INT_MAX */
        r.n_tokens = q->n_tokens > INT_MAX ? INT_MAX : (int)q->n_tokens;
        r.max_tokens = q->max_tokens > INT_MAX ? INT_MAX : (int)q->max_tokens;
        r.samp.temperature = ps->temperature;
        r.samp.top_k = ps->top_k;
        r.samp.top_p = ps->top_p;
        r.samp.min_p = ps->min_p;
        r.samp.repeat_penalty = ps->repeat_penalty;
        r.samp.repeat_last_n = ps->repeat_last_n > (uint32_t)w->engine->n_ctx ? w->engine->n_ctx
                                                                               : (int)ps->repeat_last_n;
        r.samp.seed = ps->seed;
        r.samp.presence_penalty = ps->presence_penalty;
        r.samp.frequency_penalty = ps->frequency_penalty;
        r.samp.logprobs = ps->logprobs != 0;
        r.samp.top_logprobs = ps->top_logprobs > ZL_MAX_TOP_LOGPROBS ? ZL_MAX_TOP_LOGPROBS : (int)ps->top_logprobs;
        zl_bias bias[ZL_MAX_LOGIT_BIAS];
        r.n_bias = ps->n_bias > ZL_MAX_LOGIT_BIAS ? ZL_MAX_LOGIT_BIAS + 1 : (int)ps->n_bias; /* too many: refused */
        for (int k = 0; k < r.n_bias && k < ZL_MAX_LOGIT_BIAS; k++) {
            bias[k].id = ps->bias[k].id;
            bias[k].bias = ps->bias[k].bias;
        }
        r.bias = bias;
        r.share = q->share;
        r.stop_ids = q->stop_ids;
        r.n_stop_ids = (int)q->n_stop_ids;
        r.ignore_eos = ps->ignore_eos;
        r.prompt_lp = ps->prompt_lp != 0;
        r.prompt_top = ps->prompt_top > ZL_MAX_TOP_LOGPROBS ? ZL_MAX_TOP_LOGPROBS + 1 : (int)ps->prompt_top;
        if (q->format.kind != PROTO_FORMAT_NONE) {
            r.grammar = w->grammars ? grammar_cache_get(w->grammars, q->format.kind, q->format.text.p, q->format.text.n,
                                                        err, sizeof err)
                                    : NULL;
            if (!r.grammar) {
                s_log(w, "assign refused: rid %llu: response_format: %s", (unsigned long long)q->rid,
                      w->grammars ? err : "out of memory");
                batcher_refuse(w->batcher, q->rid);
                continue;
            }
        }
        r.priority = q->priority;
        if (batcher_add(w->batcher, &r, err, sizeof err) != 0) s_log(w, "assign refused: %s", err);
        grammar_unref(&r.grammar);
    }
}

/* handles one frame from the broker */
static void s_handle(s_worker *w, const void *data, size_t len) {
    char err[256];
    if (proto_decode(data, len, &w->msg, err, sizeof err) != 0) {
        w->bad_messages++;
        s_log(w, "bad message from the broker (%zu bytes): %s", len, err);
        return;
    }
    w->last_heard = s_now_ms();
    switch (w->msg.type) {
    case PROTO_REGISTERED:
        if (!w->registered) s_log(w, "registered (broker heartbeat %u ms)", w->msg.registered.heartbeat_ms);
        w->registered = 1;
        /* bounded: a broker announcing 1 ms would otherwise make every step look like silence */
        w->broker_hb_ms = w->msg.registered.heartbeat_ms;
        if (w->broker_hb_ms < 100) w->broker_hb_ms = 100;
        if (w->broker_hb_ms > 60000) w->broker_hb_ms = 60000;
        break;
    case PROTO_HB:
        break;
    case PROTO_REREGISTER:
        /* the broker answers every hb/out it cannot place with a reregister: after the first, a register is
         * already on its way, and answering the rest would make the broker churn through registrations */
        if (!w->registered) break;
        s_log(w, "broker asks to register again: dropping %d sequences", batcher_running(w->batcher));
        batcher_clear(w->batcher);
        w->registered = 0;
        s_send_register(w);
        break;
    case PROTO_ASSIGN:
        s_handle_assign(w, &w->msg.assign);
        break;
    case PROTO_CANCEL:
        for (uint32_t i = 0; i < w->msg.cancel.n_rids; i++) batcher_cancel(w->batcher, w->msg.cancel.rids[i]);
        break;
    default:
        w->bad_messages++;
        s_log(w, "unexpected '%s' from the broker: ignored", proto_type_name(w->msg.type));
        break;
    }
}

/* reads everything queued, without blocking; multi-frame messages are malformed and dropped whole */
static void s_drain(s_worker *w) {
    for (int k = 0; k < 10000 && w->sock; k++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        int more = zmq_msg_more(&m);
        if (more) {
            w->bad_messages++;
            while (more) {
                zmq_msg_close(&m);
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, w->sock, ZMQ_DONTWAIT) < 0) break;
                more = zmq_msg_more(&m);
            }
        } else {
            s_handle(w, zmq_msg_data(&m), zmq_msg_size(&m));
        }
        zmq_msg_close(&m);
    }
}

/* an engine error: logs the step and the rids it held, and exits 3 (the device state is unknown) */
static void s_fatal(s_worker *w, const uint64_t *rids, int n_rids, const char *err) {
    char list[64 * 21 + 1] = "";
    size_t off = 0;
    for (int i = 0; i < n_rids && off < sizeof list - 22; i++)
        off += (size_t)snprintf(list + off, sizeof list - off, " %llu", (unsigned long long)rids[i]);
    s_log(w, "FATAL engine error at step %llu (device %s), rids%s: %s",
          (unsigned long long)batcher_steps(w->batcher) + 1, w->engine->device, list, err);
    fflush(stderr);
    _exit(3);
}

static void s_send_out(s_worker *w, int n_ev);

/* one engine step (with lanes: one lane's collect and next submit), its `out`, and the announcement of the late
 * masks computed meanwhile; returns batcher_step's 0 or 1 (exits the process on an engine error) */
static int s_step(s_worker *w) {
    char err[256];
    int n_ev = 0;
    uint64_t rids[64];
    int n_rids = batcher_rids(w->batcher, rids, 64);
    int64_t t0 = s_now_ms();
    if (w->times) w->t_step[0] = phase_times_now_us();
    int rc;
    if (w->o.fail_at_step > 0 && n_rids > 0 && batcher_steps(w->batcher) + 1 == (uint64_t)w->o.fail_at_step) {
        snprintf(err, sizeof err, "injected fault (--debug-fail-at-step %d)", w->o.fail_at_step);
        rc = -1;
    } else {
        rc = batcher_step(w->batcher, w->ev, w->ev_cap, &n_ev, err, sizeof err);
    }
    if (w->times) w->t_step[1] = phase_times_now_us();
    if (rc == 1) {
        double dt = (double)(s_now_ms() - t0), target = S_STEP_TARGET_FRACTION * w->o.heartbeat_ms;
        int cap = batcher_prefill_cap(w->batcher);
        if (dt > target) batcher_set_prefill_cap(w->batcher, (int)(cap * target / dt));
        else if (dt < target / 2 && batcher_last_prefill_tokens(w->batcher) >= cap)
            batcher_set_prefill_cap(w->batcher, 2 * cap);
    }
    if (rc < 0) s_fatal(w, rids, n_rids, err);
    if (rc == 1 && w->o.step_delay_ms > 0) {
        struct timespec d = {w->o.step_delay_ms / 1000, (long)(w->o.step_delay_ms % 1000) * 1000000L};
        nanosleep(&d, NULL);
    }
    if (n_ev > 0) s_send_out(w, n_ev);
    if (w->times) w->t_step[2] = phase_times_now_us();
    /* the late masks the mask threads computed meanwhile, announced before the broker's messages are read */
    if (batcher_masks_flush(w->batcher, err, sizeof err) != 0) s_fatal(w, rids, n_rids, err);
    if (w->times) w->t_step[3] = phase_times_now_us();
    return rc;
}

/* the step's events as one `out` message, sent */
static void s_send_out(s_worker *w, int n_ev) {
    int any_lp = 0, any_plp = 0, rows = 0;
    for (int i = 0; i < n_ev; i++) {
        const wk_event *v = &w->ev[i];
        proto_plp *pp = &w->out_plp[i];
        memset(pp, 0, sizeof *pp);
        if (v->n_plp > 0 && rows + v->n_plp <= w->engine->max_step_tokens) { /* a step's rows: always within */
            pp->start = (uint32_t)v->plp_start;
            pp->n = (uint32_t)v->n_plp;
            pp->lps = w->plp_rows + rows;
            for (int j = 0; j < v->n_plp; j++, rows++)
                w->plp_rows[rows] = (proto_logprob){1, v->plp[j].logprob, (uint32_t)v->plp[j].n_top, v->plp[j].top_id,
                                                    v->plp[j].top_logprob};
            any_plp = 1;
        }
        w->out_rids[i] = v->rid;
        w->out_toks[i] = v->tok;
        w->out_fin[i] = (uint8_t)v->fin;
        proto_logprob *lp = &w->out_lps[i];
        memset(lp, 0, sizeof *lp);
        if (v->has_lp && v->tok >= 0) {
            lp->present = 1;
            lp->logprob = v->lp.logprob;
            lp->n_top = (uint32_t)v->lp.n_top;
            lp->top_id = v->lp.top_id;
            lp->top_logprob = v->lp.top_logprob;
            any_lp = 1;
        }
    }
    if (proto_encode_out_plp(&w->buf, batcher_steps(w->batcher), w->out_rids, w->out_toks, w->out_fin,
                             any_lp ? w->out_lps : NULL, any_plp ? w->out_plp : NULL, (uint32_t)n_ev) == 0)
        s_send(w);
}

/* with --phase-times: the phases of the turn that started at t_turn and ran a step (the batcher's, then the
 * loop's own: out, io the rest, loop the whole turn, gpu the device's time of the step collected) */
static void s_times_add(s_worker *w, double t_turn) {
    double ph[WK_PH_N];
    const int g = batcher_phases(w->batcher, ph);
    const double loop = phase_times_now_us() - t_turn;
    ph[WK_PH_OUT] = w->t_step[2] - w->t_step[1];
    ph[WK_PH_IO] = loop - (w->t_step[3] - w->t_step[0]); /* the flush counts as masks (the batcher's) */
    ph[WK_PH_LOOP] = loop;
    ph[WK_PH_GPU] = -1;
#ifdef ZLLM_HAVE_CUDA
    if (ph[WK_PH_DEVICE] >= 0) ph[WK_PH_GPU] = engine_cuda_last_step_gpu_ms(w->engine) * 1e3; /* -1 ms: not CUDA */
#endif
    for (int p = 0; p < WK_PH_N; p++) phase_times_add(w->times, g, p, ph[p]);
    phase_times_step(w->times, g, batcher_last_step_tokens(w->batcher), batcher_last_prefill_tokens(w->batcher));
}

/* with --phase-times: one line for the steps with grammars, one for those without */
static void s_times_log(const s_worker *w) {
    for (int g = 1; w->times && g >= 0; g--) {
        char line[1024];
        phase_times_format(w->times, g, line, sizeof line);
        s_log(w, "%s", line);
    }
}

static int s_run(s_worker *w) {
    if (s_open_socket(w) != 0) return -1;
    while (!s_stop) {
        if (s_dump) {
            s_dump = 0;
            s_times_log(w);
            phase_times_reset(w->times);
        }
        const double t_turn = w->times ? phase_times_now_us() : 0;
        int64_t now = s_now_ms();
        if (!w->registered && now - w->last_register >= S_REGISTER_RETRY_MS) s_send_register(w);
        /* a step in flight must be collected even when its sequences were all cancelled or dropped */
        int busy = (w->registered && batcher_running(w->batcher) > 0) || batcher_in_flight(w->batcher) > 0;
        long timeout = 0;
        if (!busy) {
            int64_t due = w->registered ? w->last_hb + w->o.heartbeat_ms : w->last_register + S_REGISTER_RETRY_MS;
            timeout = (long)(due - now);
            if (timeout < 0) timeout = 0;
            if (timeout > S_IDLE_POLL_MS) timeout = S_IDLE_POLL_MS;
        }
        zmq_pollitem_t it = {w->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, timeout) < 0 && zmq_errno() != EINTR) {
            s_log(w, "poll: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        s_drain(w);
        /* silence is judged only right after reading everything queued: a long step is not broker silence */
        now = s_now_ms();
        if (w->registered && now - w->last_heard > (int64_t)S_SILENCE_BEATS * w->broker_hb_ms) {
            s_log(w, "broker silent for %lld ms: dropping %d sequences, reconnecting", (long long)(now - w->last_heard),
                  batcher_running(w->batcher));
            batcher_clear(w->batcher);
            if (s_open_socket(w) != 0) return -1;
            continue;
        }
        if (w->registered && now - w->last_hb >= w->o.heartbeat_ms) s_send_hb(w);
        /* acknowledgements (cancels, refusals) go out even when no sequence runs */
        const int ran = s_step(w);
        now = s_now_ms();
        if (w->registered && now - w->last_hb >= w->o.heartbeat_ms) s_send_hb(w);
        if (w->times && ran == 1 && timeout == 0) s_times_add(w, t_turn);
    }
    s_log(w, "stopping (%llu steps, %llu bad messages, %llu failed sends)",
          (unsigned long long)batcher_steps(w->batcher), (unsigned long long)w->bad_messages,
          (unsigned long long)w->send_drops);
    s_times_log(w);
    return 0;
}

int main(int argc, char **argv) {
    s_worker w;
    memset(&w, 0, sizeof w);
    if (s_parse(argc, argv, &w.o) != 0) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = s_on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    char err[512];
    uint8_t *eog = NULL;
    w.model = model_load(w.o.model_path, err, sizeof err);
    if (!w.model) {
        s_log(&w, "%s", err);
        goto fail;
    }
    zl_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.device = w.o.device;
    eo.max_batch = w.o.max_batch;
    eo.n_slots = w.o.max_batch;
    eo.n_ctx = w.o.n_ctx;
    eo.max_step_tokens = w.o.step_tokens;
    eo.threads = w.o.threads;
    /* paged KV where asked for, or by default where it can run (one lane, no stages; steps queued ahead or not).
     * It is exact on every engine: where decode and prefill kernels differ (CUDA: zl_engine.kv_split_kernels) the
     * batcher computes each position by the kind of entry a cold run uses (docs/kv-cache.md). The engine grants
     * it or not (zl_engine.kv_block), and batcher_set_kv checks what was granted */
    const int cuda = w.o.device && strncmp(w.o.device, "cuda", 4) == 0, bs = w.o.kv_block;
    const int paged_ok = w.o.lanes <= 1 && !w.o.n_stages && (!cuda || (bs >= 16 && bs <= 256 && !(bs & (bs - 1))));
    if (w.o.kv_block && (w.o.kv_blocks > 0 || (w.o.kv_blocks < 0 && paged_ok))) {
        eo.kv_block = w.o.kv_block;
        eo.kv_blocks = w.o.kv_blocks > 0 ? w.o.kv_blocks : 0;
    }
    stage_opts so;
    memset(&so, 0, sizeof so);
    so.group = w.o.group;
    so.stage = w.o.stage;
    so.n_stages = w.o.n_stages;
    so.threads = w.o.threads;
    so.device = w.o.device;   /* a follower's engine device; CUDA stages use the GPU transport */
    so.term_on_failure = 1;   /* a dead stage while idle: leave the broker at once */
    if (w.o.n_stages && w.o.stage > 0) {   /* a follower stage: no broker, no batcher */
        s_log(&w, "pipeline stage %d/%d of group %s", w.o.stage, w.o.n_stages, w.o.group);
        rc = stage_run_follower(w.model, &so, &s_stop, err, sizeof err) == 0 ? 0 : 1;
        if (rc) s_log(&w, "pipeline stage %d/%d: %s", w.o.stage, w.o.n_stages, err);
        goto done;
    }
    if (w.o.n_stages) s_log(&w, "pipeline stage 0/%d of group %s: waiting for the other stages", w.o.n_stages,
                            w.o.group);
    w.engine = w.o.n_stages ? stage_leader_new(w.model, &eo, &so, err, sizeof err)
                            : engine_new(w.model, &eo, err, sizeof err);
    if (!w.engine) {
        s_log(&w, "engine: %s", err);
        goto fail;
    }
    if (w.o.kv_split) w.engine->kv_split_kernels = 1;
    eog = s_eog_map(&w);
    if (!eog) goto oom;
    w.batcher = batcher_new(w.engine, eog, w.model->cfg.vocab_size, err, sizeof err);
    if (!w.batcher) {
        s_log(&w, "%s", err);
        goto fail;
    }
    w.grammars = grammar_cache_new(64);
    if (!w.grammars) goto oom;
    batcher_set_vocab(w.batcher, w.gvocab);
    if (w.gvocab) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int mt = w.o.mask_threads ? w.o.mask_threads : cores > 8 ? 8 : cores > 1 ? (int)cores : 1;
        if (batcher_set_mask_threads(w.batcher, mt, err, sizeof err) != 0) s_log(&w, "mask threads: %s", err);
    }
    batcher_set_prefill_cap(w.batcher, 16);   /* until the first steps have measured the device's speed */
    batcher_set_step_budget(w.batcher, w.o.step_budget);
    if (batcher_set_kv(w.batcher, w.o.kv_block, w.o.model_name, err, sizeof err) != 0) {
        s_log(&w, "%s", err);
        goto fail;
    }
    if (w.o.prefix_cache && w.engine->chunk_variant) { /* a hit would not give a cold run's bits */
        s_log(&w, "prefix cache off: this engine's prefill is not chunk invariant (matrices through cuBLAS), so a "
                  "cached prefix would change the tokens; for the same reason paged KV admits a sequence only with "
                  "blocks for its whole run, and never preempts");
        w.o.prefix_cache = 0;
    }
    batcher_set_prefix_cache(w.batcher, w.o.prefix_cache);
    if (w.o.kv_blocks > 0 && !w.engine->kv_block)
        s_log(&w, "--kv-blocks %d: the %s engine keeps contiguous slots (no paged KV)", w.o.kv_blocks,
              w.engine->device);
    if (w.o.kv_block && !(w.kv_hashes = malloc(PROTO_MAX_KV_HASHES * sizeof *w.kv_hashes))) goto oom;
    if (w.o.phase_times) {
        if (!(w.times = phase_times_new())) goto oom;
        batcher_set_timing(w.batcher, 1);
    }
    if (w.o.lanes && batcher_set_lanes(w.batcher, w.o.lanes) != w.o.lanes)
        s_log(&w, "--lanes %d: the %s engine keeps at most %d steps in flight: %d lanes", w.o.lanes, w.engine->device,
              engine_lanes(w.engine), batcher_lanes(w.batcher));
    if (w.o.ahead >= 0 && batcher_set_ahead(w.batcher, w.o.ahead) != w.o.ahead)
        s_log(&w, "--ahead 1: the %s engine with %d lane%s does not queue steps ahead", w.engine->device,
              batcher_lanes(w.batcher), batcher_lanes(w.batcher) > 1 ? "s" : "");
    w.ev_cap = batcher_event_cap(w.batcher);
    w.ev = calloc((size_t)w.ev_cap, sizeof *w.ev);
    w.out_rids = calloc((size_t)w.ev_cap, sizeof *w.out_rids);
    w.out_toks = calloc((size_t)w.ev_cap, sizeof *w.out_toks);
    w.out_fin = calloc((size_t)w.ev_cap, sizeof *w.out_fin);
    w.out_lps = calloc((size_t)w.ev_cap, sizeof *w.out_lps);
    w.out_plp = calloc((size_t)w.ev_cap, sizeof *w.out_plp);
    w.plp_rows = calloc((size_t)w.engine->max_step_tokens, sizeof *w.plp_rows);
    if (!w.ev || !w.out_rids || !w.out_toks || !w.out_fin || !w.out_lps || !w.out_plp || !w.plp_rows) goto oom;
    w.zctx = zmq_ctx_new();
    if (!w.zctx) goto oom;
    char paged[64] = "";
    if (w.engine->kv_block > 0)
        snprintf(paged, sizeof paged, ", paged KV of %d blocks of %d%s", w.engine->kv_blocks, w.engine->kv_block,
                 w.o.prefix_cache ? "" : ", prefix cache off");
    s_log(
        &w,
        "model %s (%s) on %s: %d slots of %d tokens, batch %d, %d tokens per step (%d while decoding), %d lane%s%s%s, "
        "broker %s",
        w.o.model_name, w.o.model_path, w.engine->device, w.engine->n_slots, w.engine->n_ctx, w.engine->max_batch,
        w.engine->max_step_tokens,
        w.o.step_budget > 0 && w.o.step_budget < w.engine->max_step_tokens ? w.o.step_budget
                                                                           : w.engine->max_step_tokens,
        batcher_lanes(w.batcher), batcher_lanes(w.batcher) > 1 ? "s" : "",
        batcher_ahead(w.batcher) ? ", steps queued ahead" : "", paged, w.o.broker);
    rc = s_run(&w) == 0 ? 0 : 1;
    wk_kv_stats kvs;
    if (batcher_kv(w.batcher, &kvs) && kvs.paged)
        s_log(&w,
              "kv: %llu of %llu prompt tokens hit, %llu preemptions, %llu tokens computed again (%llu replayed "
              "as decode entries)",
              (unsigned long long)kvs.hit_tokens, (unsigned long long)kvs.prompt_tokens,
              (unsigned long long)kvs.preemptions, (unsigned long long)kvs.resumed_tokens,
              (unsigned long long)kvs.replayed_tokens);
    if (stage_leader_failed(w.engine)) {
        s_log(&w, "pipeline group %s failed", w.o.group);
        rc = 1;
    }
    goto done;
oom:
    s_log(&w, "out of memory");
fail:
    rc = 1;
done:
    s_close_socket(&w);
    if (w.zctx) zmq_ctx_term(w.zctx);
    proto_buf_free(&w.buf);
    proto_msg_free(&w.msg);
    free(w.ev);
    free(w.out_rids);
    free(w.out_toks);
    free(w.out_fin);
    free(w.out_lps);
    free(w.out_plp);
    free(w.plp_rows);
    free(w.kv_hashes);
    phase_times_destroy(&w.times);
    free(eog);
    batcher_destroy(&w.batcher);
    grammar_vocab_destroy(&w.gvocab);
    grammar_cache_destroy(&w.grammars);
    engine_destroy(&w.engine);
    model_destroy(&w.model);
    return rc;
}
