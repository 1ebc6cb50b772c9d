/* clients/main_zllm.c: the `zllm` command, a client of the broker.
 *
 *   zllm generate --broker EP (-p TEXT | --tokens ID,ID,...) [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
 *                 [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--stop STR]... [--stop-ids ID,...]
 *                 [--ignore-eos] [--special] [--bos | --no-bos] [--no-stream] [--deadline-ms MS] [--priority P]
 *                 [--model NAME]
 *                 [--ids] [--chat] [--system TEXT]
 *                 [--json-schema JSON|@FILE | --json-object | --regex RE | --grammar GBNF|@FILE]
 *                 [--presence-penalty P] [--frequency-penalty P] [--logit-bias ID=B]... [--logprobs K] [--prompt-logprobs K] [--choices N]
 *   zllm chat     --broker EP [--system TEXT] [sampling options]     (interactive; conversation kept)
 *   zllm status   --broker EP
 *   zllm bench    --broker EP [-N REQUESTS] [-c CONCURRENCY] [--prompt-len DIST] [--out-len DIST] [--vocab V]
 *                 [--long-prompt-len L [--long-every MS] [--long-out-len N]] [--bench-seed S] [--ramp-ms MS]
 *                 [--prefixes K [--prefix-len L] [--prefix-seed S]] [--turns T]
 *                 [--hi-every MS [--hi-priority P] [--hi-prompt-len N] [--hi-out-len N]]
 *                 DIST: N (fixed) or A:B (uniform in [A, B])
 *   zllm --help | --version       (also after any subcommand)
 *
 * Every option value is checked here, against the ranges of docs/protocol.md, before anything is sent: a value
 * out of range is a usage error naming the option and the accepted range, never a silent default.
 * Every wait is bounded: a request whose final does not come within its deadline plus a grace period is
 * cancelled and reported as a client timeout (exit 1), so a vanished broker never hangs the command. A request
 * without a first token after S_WAIT_NOTICE_S seconds makes the command ask the broker's status, and say on
 * stderr when no live worker serves the model (the request keeps waiting: a worker may still come).
 * Exit status: 0 when every request ended with stop or length (status: when the broker is ready), 1 otherwise,
 * 2 on a usage error, 130 when SIGINT cancelled the request.
 *
 * Include map:
 *   zllm_client.h - zllm_client_new/submit/recv/cancel/status/destroy
 *   proto.h       - proto_generate and the decoded messages, the protocol's limits
 *   version.h     - ZLLM_VERSION */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "benchload.h"
#include "proto.h"
#include "version.h"
#include "zllm_client.h"

#define S_GRACE_MS 5000            /* client-side wait beyond a request's deadline */
#define S_CANCEL_WAIT_S 2.0        /* after SIGINT: wait this long for the cancelled final, then leave */
#define S_WAIT_NOTICE_S 2.0        /* no first token this long: check the broker has a worker for the model */
#define S_MAX_TOKENS_ARG 4096      /* --tokens entries */
#define S_LINE_MAX 65536           /* chat input line */
#define S_EXIT_INTERRUPTED 130     /* 128 + SIGINT, as shells report it */

/* the subcommands, as a mask of the ones an option applies to */
enum { C_GEN = 1, C_CHAT = 2, C_STATUS = 4, C_BENCH = 8, C_SAMPLE = C_GEN | C_CHAT | C_BENCH, C_ALL = 15 };

/* s_num flags */
enum { N_INT = 1, N_LO_OPEN = 2, N_HI_OPEN = 4 };

typedef struct {
    int cmd;                       /* C_GEN, C_CHAT, C_STATUS or C_BENCH */
    const char *cmd_name;          /* argv[1] */
    const char *broker;            /* endpoint */
    const char *prompt;            /* -p */
    const char *system;            /* --system */
    const char *model;             /* --model */
    const char *stop[PROTO_MAX_STOP]; /* --stop, in the order given */
    int n_stop;
    int32_t stop_ids[PROTO_MAX_STOP_IDS]; /* --stop-ids, all given */
    int n_stop_ids;
    int32_t tokens[S_MAX_TOKENS_ARG]; /* --tokens */
    int n_tokens;                  /* -1 when not given */
    int max_tokens;                /* -n; -1 = broker default */
    double temp;                   /* --temp; NAN = broker default */
    long long top_k;               /* --top-k; -1 = default */
    double top_p;                  /* --top-p; NAN = default */
    double min_p;                  /* --min-p; NAN = default */
    double repeat_penalty;         /* --repeat-penalty; NAN = default */
    long long repeat_last_n;       /* --repeat-last-n; -1 = default */
    uint64_t seed;                 /* --seed, when has_seed */
    int has_seed;                  /* 0 = the broker's choice */
    int ids;                       /* --ids: print ids */
    int chat;                      /* --chat: prompt as a user message */
    int ignore_eos;                /* --ignore-eos */
    int special;                   /* --special */
    int add_bos;                   /* --bos 1 / --no-bos 0; -1 = the vocabulary's flag */
    int no_stream;                 /* --no-stream */
    unsigned deadline_ms;          /* --deadline-ms; 0 = default */
    int format_kind;               /* --json-schema / --json-object / --regex / --grammar: PROTO_FORMAT_* */
    char *format_text;             /* its text (read from @FILE or copied; kept for the process's life) */
    double presence_penalty;       /* --presence-penalty; NAN = default */
    double frequency_penalty;      /* --frequency-penalty; NAN = default */
    proto_bias bias[PROTO_MAX_LOGIT_BIAS]; /* --logit-bias, all given */
    int n_bias;
    long long logprobs; /* --logprobs K: each token's logprob and K alternatives on stderr; -1 = off */
    long long prompt_logprobs; /* --prompt-logprobs K: each prompt position's logprob and K alternatives; -1 = off */
    int choices;        /* --choices N: completions (the protocol's n); 0 = 1 */
    int priority;       /* --priority; 0 = default */
    /* bench */
    int n_requests;                /* -N */
    int concurrency;               /* -c */
    int plen_lo, plen_hi;          /* --prompt-len */
    int olen_lo, olen_hi;          /* --out-len */
    int vocab;                     /* --vocab: ids drawn from [3, vocab) */
    int long_len;                  /* --long-prompt-len: background prompts of this many tokens; 0 = none */
    int long_every_ms;             /* --long-every: one background prompt submitted every this many ms */
    int long_out;                  /* --long-out-len: their output tokens */
    unsigned long long bench_seed; /* --bench-seed */
    double ramp_ms;                /* --ramp-ms: stream k's first request starts k * ramp_ms / c after the start */
    int n_prefixes;                /* --prefixes: shared prompt prefixes (benchload_prefix); 0 = none */
    int prefix_len;                /* --prefix-len: their tokens */
    unsigned long long prefix_seed; /* --prefix-seed */
    int turns;                      /* --turns: turns per chat (1: independent requests) */
    int hi_every_ms;                /* --hi-every: one high-priority probe every this many ms; 0 = none */
    int hi_priority;                /* --hi-priority */
    int hi_plen, hi_out;            /* --hi-prompt-len, --hi-out-len */
} s_args;

static volatile sig_atomic_t s_interrupted;
static void s_on_sigint(int sig) {
    (void)sig;
    s_interrupted = 1;
}

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the structured-output option: one of them, its text given or read from @FILE (at most PROTO_FORMAT_MAX_LEN
 * bytes); the broker checks the text itself. Returns 0, or 1 (usage error) with a message */
static int s_set_format(s_args *a, int kind, const char *v) {
    if (a->format_kind) {
        fprintf(stderr, "zllm: --json-schema, --json-object, --regex and --grammar exclude each other\n");
        return 1;
    }
    char *text = NULL;
    size_t n = 0;
    if (kind != PROTO_FORMAT_REGEX && v[0] == '@') {
        FILE *f = fopen(v + 1, "rb");
        if (!f) {
            fprintf(stderr, "zllm: cannot open %s\n", v + 1);
            return 1;
        }
        text = malloc(PROTO_FORMAT_MAX_LEN + 2);
        n = text ? fread(text, 1, PROTO_FORMAT_MAX_LEN + 1, f) : 0;
        fclose(f);
    } else {
        n = strlen(v);
        text = malloc(n + 1);
        if (text) memcpy(text, v, n);
    }
    if (!text) {
        fprintf(stderr, "zllm: out of memory\n");
        return 1;
    }
    text[n < PROTO_FORMAT_MAX_LEN + 1 ? n : PROTO_FORMAT_MAX_LEN + 1] = 0;
    if (n > PROTO_FORMAT_MAX_LEN) {
        fprintf(stderr, "zllm: structured-output text over %u bytes\n", PROTO_FORMAT_MAX_LEN);
        free(text);
        return 1;
    }
    a->format_kind = kind;
    a->format_text = text;
    return 0;
}

static void s_usage(FILE *f) {
    fprintf(f,
            "usage: zllm generate [options] (-p TEXT | --tokens ID,ID,...)   one request, streamed to stdout\n"
            "       zllm chat     [options]     interactive chat on stdin (the conversation is kept; /quit ends)\n"
            "       zllm status   [--broker EP] the broker's workers, queue and counters\n"
            "       zllm bench    [options]     closed-loop load: requests of random token ids, latency percentiles\n"
            "       zllm --help | --version     (also after a subcommand)\n"
            "\n"
            "every subcommand:\n"
            "  --broker EP          broker client endpoint (default $ZLLM_BROKER, else tcp://127.0.0.1:5555)\n"
            "generate, chat, bench (request fields, docs/protocol.md; default: the broker's):\n"
            "  --model NAME         model name (default: the broker's first model)\n"
            "  -n, --max-tokens N   most tokens to generate, 1..%d, 0 with --prompt-logprobs (default 128)\n"
            "  --temp T             temperature, 0..100, 0 = greedy (default 1.0; bench: 0)\n"
            "  --top-k K            0..%d, 0 = off (default 0)\n"
            "  --top-p P            (0, 1], 1 = off (default 1)\n"
            "  --min-p P            [0, 1), 0 = off (default 0)\n"
            "  --repeat-penalty R   (0, 100], 1 = off (default 1)\n"
            "  --repeat-last-n N    tokens the penalty looks back, 0..%d (default 64)\n"
            "  --seed S             0..18446744073709551615 (default: chosen by the broker)\n"
            "  --stop STR           stop string, 1..%d bytes; repeat for more, at most %d (default none)\n"
            "  --stop-ids ID,...    token ids that end generation, 0..%d; repeatable, at most %d (default none)\n"
            "  --ignore-eos         keep generating past end-of-generation tokens (default off; bench: on)\n"
            "  --deadline-ms MS     time budget, 1..86400000 (default 600000; bench 60000)\n"
            "  --presence-penalty P [-2, 2], OpenAI's, over the generated tokens (default 0)\n"
            "  --frequency-penalty P [-2, 2], OpenAI's, over the generated tokens (default 0)\n"
            "  --logit-bias ID=B    add B in [-100, 100] to token ID's logit; repeatable, at most 300 (default none)\n"
            "  --priority P         -100..100, higher is admitted first (default 0; docs/kv-cache.md)\n"
            "generate and chat:\n"
            "  --system TEXT        a system message (generate: the prompt becomes a chat)\n"
            "  --special            special-token text in the prompt becomes single tokens (default off)\n"
            "  --bos, --no-bos      prepend BOS to a text prompt or not (default: the vocabulary's flag)\n"
            "  --no-stream          one final with all the text instead of tokens as they come (default: stream)\n"
            "  --json-schema S      structured output: JSON matching schema S (JSON text, or @FILE to read it)\n"
            "  --json-object        structured output: any JSON object\n"
            "  --regex RE           structured output: text matching the regular expression RE whole\n"
            "  --grammar G          structured output: text matching GBNF grammar G (rule root; or @FILE)\n"
            "generate:\n"
            "  -p, --prompt TEXT    the prompt text (or --tokens; not both)\n"
            "  --tokens ID,ID,...   the prompt as token ids, 0..%d, at most %d (no BOS added)\n"
            "  --chat               send the prompt as a user message (the model's chat template)\n"
            "  --ids                print token ids instead of text\n"
            "  --logprobs K         each generated token's logprob and its K (0..20) most likely alternatives, one\n"
            "                       line a token on stderr: `logprob ID LP [ALT_ID:LP ...]`\n"
            "  --prompt-logprobs K  each prompt token's logprob (the model's raw distribution) and its K (0..20)\n"
            "                       alternatives, first, a line a position on stderr: `prompt_logprob POS ID LP\n"
            "                       [ALT_ID:LP ...]` (LP `-` at position 0); -n 0 then scores the prompt only\n"
            "  --choices N          N completions of the prompt (1..16, seeds S + i), each printed whole after a\n"
            "                       `--- completion I` line\n"
            "bench:\n"
            "  -N REQUESTS          requests in all, 1..1000000 (default 64)\n"
            "  -c CONCURRENCY       requests in flight, 1..65536 (default 8)\n"
            "  --prompt-len A[:B]   prompt tokens, fixed or uniform in [A, B], 1..1000000 (default 32)\n"
            "  --out-len A[:B]      output tokens, likewise (default 32)\n"
            "  --vocab V            prompt ids drawn from [3, V), 4..%d (default 256)\n"
            "  --bench-seed S       the prompts' and output lengths' seed, 0..18446744073709551615 (default 1);\n"
            "                       request i's output length depends on S and i only, as in zllm-httpbench\n"
            "  --ramp-ms MS         start the c streams spread over MS ms (stream k at k*MS/c), 0..3600000\n"
            "                       (default 0: all at once)\n"
            "  --long-prompt-len L  background load: prompts of L tokens, 1..1000000, submitted beside the\n"
            "                       measured requests (not counted in -c) until those end; reported on their\n"
            "                       own `long:` line, left out of every other figure (default none)\n"
            "  --long-every MS      one background prompt every MS ms, 1..3600000 (default 1000)\n"
            "  --long-out-len N     output tokens of each background prompt, 1..1000000 (default 1)\n"
            "  --prefixes K         request i's prompt starts with shared prefix i mod K (with --turns: chat i's\n"
            "                       system prompt), then its own --prompt-len ids; 1..65536 (default none)\n"
            "  --prefix-len L       the prefixes' tokens, 1..1000000 (default 256; alone: --prefixes 1)\n"
            "  --prefix-seed S      the prefixes' seed, independent of --bench-seed: runs with other bench seeds\n"
            "                       share their prefixes (default 1)\n"
            "  --turns T            -c chats at once, each of T turns sent one after another, 1..1000 (default 1):\n"
            "                       turn t's prompt is turn t-1's, the ids turn t-1 produced, then --prompt-len\n"
            "                       new ids; -N counts turns in all (N/T chats: N a multiple of T)\n"
            "  --hi-every MS        while the load runs, a probe request every MS ms, 1..3600000, at\n"
            "                       --hi-priority P (-100..100, default 10; the load runs at --priority), of\n"
            "                       --hi-prompt-len ids (default 32) and --hi-out-len tokens (default 4); they are\n"
            "                       waited for at the end and reported on their own `hi:` line (default none)\n"
            "  bench prints the output tokens/s over the whole run and over its steady window (every stream of\n"
            "  the first wave running, up to the last submission), TTFT and inter-token latency percentiles, then\n"
            "  `cache:` the prompt tokens the workers found in their prefix caches over the run (status counters,\n"
            "  per worker) and `outputs:` a digest of every request's output ids (equal digests: equal outputs)\n"
            "\n"
            "environment:\n"
            "  ZLLM_BROKER          the default for --broker\n"
            "  ZLLM_VERBOSE         when set (any value), each final's usage and timings go to stderr\n"
            "exit status: 0 when every request ended with stop or length (status: the broker is ready), 1 otherwise,\n"
            "2 on a usage error, 130 when Ctrl-C (SIGINT) cancelled the request.\n",
            PROTO_MAX_GEN, PROTO_TOKEN_ID_MAX, PROTO_MAX_TOKENS, PROTO_STOP_MAX_LEN, PROTO_MAX_STOP, PROTO_TOKEN_ID_MAX,
            PROTO_MAX_STOP_IDS, PROTO_TOKEN_ID_MAX, S_MAX_TOKENS_ARG, PROTO_TOKEN_ID_MAX);
}

/* One numeric option value. The whole of v must be a decimal integer (N_INT) or a finite real number; reals
 * are rounded to 32-bit float first, as the broker checks them. It must lie in [lo, hi], an end excluded
 * where N_LO_OPEN / N_HI_OPEN say. Integers are parsed as unsigned 64-bit (every integer option here is >= 0),
 * so *u gets them exactly and *x as a double; u may be NULL. Returns 0, or -1 after a message naming the
 * option and the accepted range. */
static int s_num(const char *opt, const char *v, double lo, double hi, int flags, double *x, uint64_t *u) {
    char *end = NULL;
    double d = 0;
    uint64_t w = 0;
    int ok = 0;
    errno = 0;
    if (flags & N_INT) {
        /* strtoull takes "-5" as 2^64-5 and skips spaces: only digits may come (after a '-' where lo < 0) */
        int neg = v[0] == '-' && lo < 0;
        if (v[neg] >= '0' && v[neg] <= '9') {
            w = strtoull(v + neg, &end, 10);
            d = neg ? -(double)w : (double)w;
            ok = !errno && !*end && d >= lo && d <= hi;
        }
    } else if (*v && !(v[0] == ' ' || v[0] == '\t')) {
        d = strtod(v, &end);
        if (!errno && !*end && isfinite(d)) {
            d = (double)(float)d;
            ok = isfinite(d) && ((flags & N_LO_OPEN) ? d > lo : d >= lo) && ((flags & N_HI_OPEN) ? d < hi : d <= hi);
        }
    }
    if (!ok) {
        if ((flags & N_INT) && hi >= 18446744073709551615.0) /* 2^64 - 1 has no double: the text */
            fprintf(stderr, "zllm: %s: expected a whole number in %.0f..18446744073709551615, got '%s'\n", opt, lo, v);
        else if (flags & N_INT)
            fprintf(stderr, "zllm: %s: expected a whole number in %.0f..%.0f, got '%s'\n", opt, lo, hi, v);
        else
            fprintf(stderr, "zllm: %s: expected a number in %c%g, %g%c, got '%s'\n", opt,
                    (flags & N_LO_OPEN) ? '(' : '[', lo, hi, (flags & N_HI_OPEN) ? ')' : ']', v);
        return -1;
    }
    *x = d;
    if (u) *u = w;
    return 0;
}

/* a comma (or space) separated list of token ids 0..PROTO_TOKEN_ID_MAX appended to ids[*n], at most max in
 * all; returns 0 or -1 after a message */
static int s_ids(const char *opt, const char *v, int32_t *ids, int *n, int max) {
    const char *p = v;
    int got = 0;
    while (*p == ',' || *p == ' ') p++;
    while (*p) {
        char *end;
        errno = 0;
        long long t = (*p >= '0' && *p <= '9') ? strtoll(p, &end, 10) : -1;
        if (t < 0 || errno || t > PROTO_TOKEN_ID_MAX || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "zllm: %s: expected token ids 0..%d separated by commas, got '%s'\n", opt,
                    PROTO_TOKEN_ID_MAX, v);
            return -1;
        }
        if (*n >= max) {
            fprintf(stderr, "zllm: %s: at most %d ids\n", opt, max);
            return -1;
        }
        ids[(*n)++] = (int32_t)t;
        got++;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (!got) {
        fprintf(stderr, "zllm: %s: expected at least one token id, got '%s'\n", opt, v);
        return -1;
    }
    return 0;
}

/* --prompt-len / --out-len: N or A:B with 1 <= A <= B <= 1000000 */
static int s_range(const char *opt, const char *v, int *lo, int *hi) {
    char *end;
    errno = 0;
    long a = (*v >= '0' && *v <= '9') ? strtol(v, &end, 10) : -1, b = a;
    if (a >= 0 && *end == ':') {
        const char *q = end + 1;
        b = (*q >= '0' && *q <= '9') ? strtol(q, &end, 10) : -1;
    }
    if (a < 1 || b < a || b > 1000000 || errno || *end) {
        fprintf(stderr, "zllm: %s: expected N or A:B with 1 <= A <= B <= 1000000, got '%s'\n", opt, v);
        return -1;
    }
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

/* 0 to go on, 1 after --help / --version (exit 0), -1 on a usage error (exit 2, the message printed) */
static int s_parse(int argc, char **argv, s_args *a) {
    memset(a, 0, sizeof *a);
    a->cmd_name = argv[1];
    if (!strcmp(argv[1], "generate")) a->cmd = C_GEN;
    else if (!strcmp(argv[1], "chat")) a->cmd = C_CHAT;
    else if (!strcmp(argv[1], "status")) a->cmd = C_STATUS;
    else if (!strcmp(argv[1], "bench")) a->cmd = C_BENCH;
    else {
        fprintf(stderr, "zllm: unknown command '%s' (generate, chat, status, bench; zllm --help)\n", argv[1]);
        return -1;
    }
    a->broker = getenv("ZLLM_BROKER");
    if (!a->broker || !*a->broker) a->broker = "tcp://127.0.0.1:5555";
    a->n_tokens = -1;
    a->max_tokens = -1;
    a->temp = a->top_p = a->min_p = a->repeat_penalty = a->presence_penalty = a->frequency_penalty = NAN;
    a->logprobs = -1;
    a->prompt_logprobs = -1;
    a->top_k = a->repeat_last_n = -1;
    a->add_bos = -1;
    a->n_requests = 64;
    a->concurrency = 8;
    a->plen_lo = a->plen_hi = 32;
    a->olen_lo = a->olen_hi = 32;
    a->vocab = 256;
    a->bench_seed = 1;
    a->long_every_ms = 1000;
    a->long_out = 1;
    a->prefix_len = 256;
    a->prefix_seed = 1;
    a->turns = 1;
    a->hi_priority = 10;
    a->hi_plen = 32;
    a->hi_out = 4;
    int prefix_len_given = 0;
    /* --help and --version win wherever they are, so that a bad value elsewhere does not hide the usage */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("zllm %s\n", ZLLM_VERSION);
            return 1;
        }
    }
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i];
        double x;
        uint64_t u;
        int mask = 0; /* the commands the option applies to (0: unknown) */
#define FLAG(name, m, stmt)                                                                                            \
    if (!strcmp(k, name)) {                                                                                            \
        mask = (m);                                                                                                    \
        if (mask & a->cmd) { stmt; }                                                                                   \
    }
        FLAG("--ids", C_GEN, a->ids = 1)
        else FLAG("--chat", C_GEN, a->chat = 1) else FLAG("--ignore-eos", C_SAMPLE, a->ignore_eos = 1) else FLAG(
            "--special", C_GEN | C_CHAT,
            a->special =
                1) else FLAG("--bos", C_GEN | C_CHAT,
                             a->add_bos =
                                 1) else FLAG("--json-object", C_GEN | C_CHAT | C_BENCH,
                                              if (s_set_format(
                                                      a, PROTO_FORMAT_JSON_OBJECT,
                                                      "")) return -1) else FLAG("--no-bos", C_GEN | C_CHAT,
                                                                                a->add_bos =
                                                                                    0) else FLAG("--no-stream",
                                                                                                 C_GEN | C_CHAT,
                                                                                                 a->no_stream = 1)
#undef FLAG
            if (mask) {
            if (!(mask & a->cmd)) goto not_here;
            continue;
        }
        static const struct {
            const char *name, *alias;
            int mask;
        } opts[] = {
            {"--broker", NULL, C_ALL},
            {"--prompt", "-p", C_GEN},
            {"--system", NULL, C_GEN | C_CHAT},
            {"--model", NULL, C_SAMPLE},
            {"--stop", NULL, C_SAMPLE},
            {"--stop-ids", NULL, C_SAMPLE},
            {"--tokens", NULL, C_GEN},
            {"--max-tokens", "-n", C_SAMPLE},
            {"--temp", NULL, C_SAMPLE},
            {"--top-k", NULL, C_SAMPLE},
            {"--top-p", NULL, C_SAMPLE},
            {"--min-p", NULL, C_SAMPLE},
            {"--repeat-penalty", NULL, C_SAMPLE},
            {"--repeat-last-n", NULL, C_SAMPLE},
            {"--seed", NULL, C_SAMPLE},
            {"--deadline-ms", NULL, C_SAMPLE},
            {"--json-schema", NULL, C_GEN | C_CHAT | C_BENCH},
            {"--regex", NULL, C_GEN | C_CHAT | C_BENCH},
            {"--grammar", NULL, C_GEN | C_CHAT | C_BENCH},
            {"--presence-penalty", NULL, C_SAMPLE},
            {"--frequency-penalty", NULL, C_SAMPLE},
            {"--logit-bias", NULL, C_SAMPLE},
            {"--logprobs", NULL, C_GEN},
            {"--prompt-logprobs", NULL, C_GEN},
            {"--choices", NULL, C_GEN},
            {"--priority", NULL, C_SAMPLE},
            {"-N", NULL, C_BENCH},
            {"-c", NULL, C_BENCH},
            {"--vocab", NULL, C_BENCH},
            {"--bench-seed", NULL, C_BENCH},
            {"--ramp-ms", NULL, C_BENCH},
            {"--prompt-len", NULL, C_BENCH},
            {"--out-len", NULL, C_BENCH},
            {"--long-prompt-len", NULL, C_BENCH},
            {"--long-every", NULL, C_BENCH},
            {"--long-out-len", NULL, C_BENCH},
            {"--prefixes", NULL, C_BENCH},
            {"--prefix-len", NULL, C_BENCH},
            {"--prefix-seed", NULL, C_BENCH},
            {"--turns", NULL, C_BENCH},
            {"--hi-every", NULL, C_BENCH},
            {"--hi-priority", NULL, C_BENCH},
            {"--hi-prompt-len", NULL, C_BENCH},
            {"--hi-out-len", NULL, C_BENCH},
        };
        const char *o = NULL; /* the option's long name */
        for (size_t j = 0; j < sizeof opts / sizeof opts[0] && !o; j++)
            if (!strcmp(k, opts[j].name) || (opts[j].alias && !strcmp(k, opts[j].alias))) {
                o = opts[j].name;
                mask = opts[j].mask;
            }
        if (!o) {
            fprintf(stderr, "zllm: unknown option %s (zllm --help)\n", k);
            return -1;
        }
        if (!(mask & a->cmd)) goto not_here;
        if (i + 1 >= argc) {
            fprintf(stderr, "zllm: %s needs a value (zllm --help)\n", k);
            return -1;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(o, "--broker")) a->broker = v;
        else if (!strcmp(o, "--prompt")) a->prompt = v;
        else if (!strcmp(o, "--system")) a->system = v;
        else if (!strcmp(o, "--model")) a->model = v;
        else if (!strcmp(o, "--stop")) {
            size_t n = strlen(v);
            if (n < 1 || n > PROTO_STOP_MAX_LEN) {
                fprintf(stderr, "zllm: --stop: a stop string has 1..%d bytes, got %zu\n", PROTO_STOP_MAX_LEN, n);
                return -1;
            }
            if (a->n_stop >= PROTO_MAX_STOP) {
                fprintf(stderr, "zllm: --stop: at most %d stop strings\n", PROTO_MAX_STOP);
                return -1;
            }
            a->stop[a->n_stop++] = v;
        } else if (!strcmp(o, "--stop-ids")) bad = s_ids(k, v, a->stop_ids, &a->n_stop_ids, PROTO_MAX_STOP_IDS);
        else if (!strcmp(o, "--tokens")) {
            if (a->n_tokens < 0) a->n_tokens = 0;
            bad = s_ids(k, v, a->tokens, &a->n_tokens, S_MAX_TOKENS_ARG);
        } else if (!strcmp(o, "--max-tokens")) {
            if (!(bad = s_num(k, v, 0, PROTO_MAX_GEN, N_INT, &x, NULL))) a->max_tokens = (int)x; /* 0: below */
        } else if (!strcmp(o, "--temp")) bad = s_num(k, v, 0, 100, 0, &a->temp, NULL);
        else if (!strcmp(o, "--top-k")) {
            if (!(bad = s_num(k, v, 0, PROTO_TOKEN_ID_MAX, N_INT, &x, NULL))) a->top_k = (long long)x;
        } else if (!strcmp(o, "--top-p")) bad = s_num(k, v, 0, 1, N_LO_OPEN, &a->top_p, NULL);
        else if (!strcmp(o, "--min-p")) bad = s_num(k, v, 0, 1, N_HI_OPEN, &a->min_p, NULL);
        else if (!strcmp(o, "--repeat-penalty")) bad = s_num(k, v, 0, 100, N_LO_OPEN, &a->repeat_penalty, NULL);
        else if (!strcmp(o, "--repeat-last-n")) {
            if (!(bad = s_num(k, v, 0, PROTO_MAX_TOKENS, N_INT, &x, NULL))) a->repeat_last_n = (long long)x;
        } else if (!strcmp(o, "--seed")) {
            if (!(bad = s_num(k, v, 0, 18446744073709551615.0, N_INT, &x, &u))) {
                a->seed = u;
                a->has_seed = 1;
            }
        } else if (!strcmp(o, "--presence-penalty")) bad = s_num(k, v, -2, 2, 0, &a->presence_penalty, NULL);
        else if (!strcmp(o, "--frequency-penalty")) bad = s_num(k, v, -2, 2, 0, &a->frequency_penalty, NULL);
        else if (!strcmp(o, "--logit-bias")) {
            const char *eq = strchr(v, '=');
            char idbuf[16];
            double b;
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof idbuf) {
                fprintf(stderr, "zllm: --logit-bias: expected ID=BIAS, got '%s'\n", v);
                return -1;
            }
            memcpy(idbuf, v, (size_t)(eq - v));
            idbuf[eq - v] = 0;
            if (a->n_bias >= PROTO_MAX_LOGIT_BIAS) {
                fprintf(stderr, "zllm: --logit-bias: at most %d entries\n", PROTO_MAX_LOGIT_BIAS);
                return -1;
            }
            if (!(bad = s_num(k, idbuf, 0, PROTO_TOKEN_ID_MAX, N_INT, &x, NULL)) &&
                !(bad = s_num(k, eq + 1, -100, 100, 0, &b, NULL))) {
                a->bias[a->n_bias].id = (int32_t)x;
                a->bias[a->n_bias++].bias = (float)b;
            }
        } else if (!strcmp(o, "--prompt-logprobs")) {
            if (!(bad = s_num(k, v, 0, PROTO_MAX_TOP_LOGPROBS, N_INT, &x, NULL))) a->prompt_logprobs = (long long)x;
        } else if (!strcmp(o, "--logprobs")) {
            if (!(bad = s_num(k, v, 0, PROTO_MAX_TOP_LOGPROBS, N_INT, &x, NULL))) a->logprobs = (long long)x;
        } else if (!strcmp(o, "--choices")) {
            if (!(bad = s_num(k, v, 1, PROTO_MAX_N, N_INT, &x, NULL))) a->choices = (int)x;
        } else if (!strcmp(o, "--deadline-ms")) {
            if (!(bad = s_num(k, v, 1, 86400000, N_INT, &x, NULL))) a->deadline_ms = (unsigned)x;
        } else if (!strcmp(o, "--priority")) {
            if (!(bad = s_num(k, v, PROTO_PRIORITY_MIN, PROTO_PRIORITY_MAX, N_INT, &x, NULL))) a->priority = (int)x;
        } else if (!strcmp(o, "-N")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->n_requests = (int)x;
        } else if (!strcmp(o, "-c")) {
            if (!(bad = s_num(k, v, 1, 65536, N_INT, &x, NULL))) a->concurrency = (int)x;
        } else if (!strcmp(o, "--vocab")) {
            if (!(bad = s_num(k, v, 4, PROTO_TOKEN_ID_MAX, N_INT, &x, NULL))) a->vocab = (int)x;
        } else if (!strcmp(o, "--long-prompt-len")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->long_len = (int)x;
        } else if (!strcmp(o, "--long-every")) {
            if (!(bad = s_num(k, v, 1, 3600000, N_INT, &x, NULL))) a->long_every_ms = (int)x;
        } else if (!strcmp(o, "--long-out-len")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->long_out = (int)x;
        } else if (!strcmp(o, "--prefixes")) {
            if (!(bad = s_num(k, v, 1, 65536, N_INT, &x, NULL))) a->n_prefixes = (int)x;
        } else if (!strcmp(o, "--prefix-len")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->prefix_len = (int)x, prefix_len_given = 1;
        } else if (!strcmp(o, "--prefix-seed")) {
            if (!(bad = s_num(k, v, 0, 18446744073709551615.0, N_INT, &x, &u))) a->prefix_seed = u;
        } else if (!strcmp(o, "--turns")) {
            if (!(bad = s_num(k, v, 1, 1000, N_INT, &x, NULL))) a->turns = (int)x;
        } else if (!strcmp(o, "--hi-every")) {
            if (!(bad = s_num(k, v, 1, 3600000, N_INT, &x, NULL))) a->hi_every_ms = (int)x;
        } else if (!strcmp(o, "--hi-priority")) {
            if (!(bad = s_num(k, v, PROTO_PRIORITY_MIN, PROTO_PRIORITY_MAX, N_INT, &x, NULL))) a->hi_priority = (int)x;
        } else if (!strcmp(o, "--hi-prompt-len")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->hi_plen = (int)x;
        } else if (!strcmp(o, "--hi-out-len")) {
            if (!(bad = s_num(k, v, 1, 1000000, N_INT, &x, NULL))) a->hi_out = (int)x;
        } else if (!strcmp(o, "--bench-seed")) {
            if (!(bad = s_num(k, v, 0, 18446744073709551615.0, N_INT, &x, &u))) a->bench_seed = u;
        } else if (!strcmp(o, "--ramp-ms")) {
            if (!(bad = s_num(k, v, 0, 3600000, 0, &x, NULL))) a->ramp_ms = x;
        } else if (!strcmp(o, "--json-schema")) bad = s_set_format(a, PROTO_FORMAT_JSON_SCHEMA, v);
        else if (!strcmp(o, "--regex")) bad = s_set_format(a, PROTO_FORMAT_REGEX, v);
        else if (!strcmp(o, "--grammar")) bad = s_set_format(a, PROTO_FORMAT_GRAMMAR, v);
        else if (!strcmp(o, "--prompt-len")) bad = s_range(k, v, &a->plen_lo, &a->plen_hi);
        else if (!strcmp(o, "--out-len")) bad = s_range(k, v, &a->olen_lo, &a->olen_hi);
        if (bad) return -1;
        continue;
    not_here:
        fprintf(stderr, "zllm %s: %s does not apply to this command (zllm --help)\n", a->cmd_name, k);
        return -1;
    }
    if (a->max_tokens == 0 && a->prompt_logprobs < 0) {
        fprintf(stderr, "zllm %s: -n/--max-tokens 0: expected 1..%d, or 0 with --prompt-logprobs K (scoring)\n",
                a->cmd_name, PROTO_MAX_GEN);
        return -1;
    }
    if (prefix_len_given && !a->n_prefixes) a->n_prefixes = 1;
    if (!a->n_prefixes) a->prefix_len = 0;
    if (a->cmd == C_BENCH && a->n_requests % a->turns) {
        fprintf(stderr, "zllm bench: -N %d is not a multiple of --turns %d (-N counts turns in all)\n", a->n_requests,
                a->turns);
        return -1;
    }
    if (a->cmd == C_GEN) {
        if (a->prompt && a->n_tokens >= 0) {
            fprintf(stderr, "zllm generate: -p and --tokens both give the prompt: use one\n");
            return -1;
        }
        if (a->n_tokens >= 0 && (a->chat || a->system || a->special || a->add_bos >= 0)) {
            fprintf(stderr, "zllm generate: --tokens is the prompt as ids: --chat, --system, --special, --bos and "
                            "--no-bos apply to text\n");
            return -1;
        }
        if (!a->prompt && a->n_tokens < 0) {
            fprintf(stderr, "zllm generate: -p TEXT or --tokens ID,ID,... is required\n");
            return -1;
        }
    }
    return 0;
}

/* fills g from the arguments' sampling options (the prompt is set by the caller) */
static void s_fill(const s_args *a, proto_generate *g, const char *id) {
    proto_generate_defaults(g);
    g->id = proto_cstr(id);
    if (a->model) g->model = proto_cstr(a->model);
    if (a->max_tokens >= 0) g->max_tokens = (uint32_t)a->max_tokens;
    if (!isnan(a->temp)) g->sampling.temperature = (float)a->temp;
    if (a->top_k >= 0) g->sampling.top_k = (int32_t)a->top_k;
    if (!isnan(a->top_p)) g->sampling.top_p = (float)a->top_p;
    if (!isnan(a->min_p)) g->sampling.min_p = (float)a->min_p;
    if (!isnan(a->repeat_penalty)) g->sampling.repeat_penalty = (float)a->repeat_penalty;
    if (a->repeat_last_n >= 0) g->sampling.repeat_last_n = (uint32_t)a->repeat_last_n;
    if (a->has_seed) {
        g->sampling.seed = a->seed;
        g->sampling.has_seed = 1;
    }
    g->sampling.ignore_eos = a->ignore_eos;
    if (a->deadline_ms) g->deadline_ms = a->deadline_ms;
    g->priority = a->priority;
    for (int i = 0; i < a->n_stop; i++) g->stop[i] = proto_cstr(a->stop[i]);
    g->n_stop = (uint32_t)a->n_stop;
    if (a->n_stop_ids) {
        g->stop_ids = a->stop_ids;
        g->n_stop_ids = (uint32_t)a->n_stop_ids;
    }
    g->special = a->special;
    g->add_bos = a->add_bos;
    g->stream = !a->no_stream;
    if (a->format_kind) {
        g->format.kind = a->format_kind;
        g->format.text = proto_cstr(a->format_text);
    }
    if (!isnan(a->presence_penalty)) g->sampling.presence_penalty = (float)a->presence_penalty;
    if (!isnan(a->frequency_penalty)) g->sampling.frequency_penalty = (float)a->frequency_penalty;
    if (a->n_bias) {
        g->sampling.bias = a->bias;
        g->sampling.n_bias = (uint32_t)a->n_bias;
    }
    if (a->logprobs >= 0) {
        g->sampling.logprobs = 1;
        g->sampling.top_logprobs = (uint32_t)a->logprobs;
    }
    if (a->prompt_logprobs >= 0) {
        g->sampling.prompt_lp = 1;
        g->sampling.prompt_top = (uint32_t)a->prompt_logprobs;
    }
    if (a->choices > 1) {
        g->n = (uint32_t)a->choices;
        g->stream = 0; /* each completion is printed whole, in the order they end */
    }
}

/* --logprobs: one line on stderr per token */
static void s_print_logprobs(const int32_t *ids, const proto_logprob *lps, uint32_t n) {
    for (uint32_t i = 0; lps && i < n; i++) {
        if (!lps[i].present) continue;
        fprintf(stderr, "logprob %d %.6f", (int)ids[i], (double)lps[i].logprob);
        for (uint32_t k = 0; k < lps[i].n_top; k++)
            fprintf(stderr, " %d:%.6f", (int)lps[i].top_id[k], (double)lps[i].top_logprob[k]);
        fputc('\n', stderr);
    }
}

/* --prompt-logprobs: one line on stderr per prompt position (completion 0's only: the others are the same) */
static void s_print_prompt_logprobs(const proto_plps *p) {
    for (uint32_t i = 0; p->index == 0 && i < p->n_ids; i++) {
        const proto_logprob *lp = &p->lps[i];
        if (!lp->present) {
            fprintf(stderr, "prompt_logprob %u %d -\n", p->start + i, (int)p->ids[i]);
            continue;
        }
        fprintf(stderr, "prompt_logprob %u %d %.6f", p->start + i, (int)p->ids[i], (double)lp->logprob);
        for (uint32_t k = 0; k < lp->n_top; k++)
            fprintf(stderr, " %d:%.6f", (int)lp->top_id[k], (double)lp->top_logprob[k]);
        fputc('\n', stderr);
    }
}

/* on a status reply while a request waits for its first token: 1 when no live worker serves the model the
 * request names (or, without one, the broker's first model), with that model's name in name[] */
static int s_no_worker(const proto_status *s, const s_args *a, char *name, size_t cap) {
    proto_str want = a->model ? proto_cstr(a->model) : (s->n_models ? s->models[0] : (proto_str){0});
    proto_str_copy(want, name, cap);
    for (uint32_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].alive && s->workers[i].model.n == want.n &&
            (!want.n || !memcmp(s->workers[i].model.p, want.p, want.n)))
            return 0;
    return 1;
}

/* runs one request, printing text (or ids) as it comes; returns 0 on stop/length, S_EXIT_INTERRUPTED after
 * SIGINT cancelled it, 1 otherwise. reply, when not NULL, gets the whole answer (malloc'd) for the chat history. */
static int s_run_one(zllm_client *c, const s_args *a, proto_generate *g, char **reply) {
    char err[256], id[PROTO_ID_MAX + 1];
    proto_str_copy(g->id, id, sizeof id);
    size_t cap = 0, len = 0;
    char *acc = NULL;
    if (zllm_client_submit(c, g, err, sizeof err) != 0) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    double t0 = s_now(), t_end = t0 + (g->deadline_ms + S_GRACE_MS) / 1000.0;
    int cancelled = 0, rc = 1, got_first = 0, asked = 0;
    unsigned long n_tokens = 0; /* ids received so far */
    for (;;) {
        if (s_interrupted && !cancelled) {
            zllm_client_cancel(c, id, err, sizeof err);
            cancelled = 1;
            if (t_end > s_now() + S_CANCEL_WAIT_S) t_end = s_now() + S_CANCEL_WAIT_S;
        }
        double left = t_end - s_now();
        if (left <= 0) {
            zllm_client_cancel(c, id, err, sizeof err);
            if (cancelled) {
                fprintf(stderr,
                        "\nzllm: interrupted: request cancelled after %lu tokens (the broker did not "
                        "confirm within %.0f s)\n",
                        n_tokens, S_CANCEL_WAIT_S);
                rc = S_EXIT_INTERRUPTED;
            } else {
                fprintf(stderr, "\nzllm: no final for %s within %u ms: giving up (broker gone?)\n", id,
                        g->deadline_ms + S_GRACE_MS);
            }
            break;
        }
        if (!got_first && !asked && !cancelled && s_now() - t0 >= S_WAIT_NOTICE_S) {
            asked = 1; /* one question: the answer is said once */
            zllm_client_status(c, "zllm-wait", err, sizeof err);
        }
        const proto_msg *m;
        int r = zllm_client_recv(c, left > 0.2 ? 200 : (int)(left * 1000) + 1, &m, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "zllm: %s\n", err);
            break;
        }
        if (r == 0) continue;
        if (m->type == PROTO_ERROR) {
            fprintf(stderr, "zllm: broker error %.*s: %.*s\n", (int)m->error.code_str.n,
                    m->error.code_str.p ? m->error.code_str.p : "", (int)m->error.message.n,
                    m->error.message.p ? m->error.message.p : "");
            break;   /* this client has only this request in flight: the broker could not read it */
        }
        if (m->type == PROTO_STATUS) {
            char name[PROTO_NAME_MAX + 1];
            if (!got_first && !cancelled && s_no_worker(&m->status, a, name, sizeof name))
                fprintf(stderr, "zllm: waiting for a worker for model %s\n", name[0] ? name : "(none)");
            continue;
        }
        if (m->type == PROTO_PROMPT_LPS) {
            if (proto_str_eq(m->plps.id, id)) s_print_prompt_logprobs(&m->plps);
            continue;
        }
        proto_str text = {0};
        const int32_t *ids = NULL;
        uint32_t n_ids = 0;
        if (m->type == PROTO_TOKEN && proto_str_eq(m->token.id, id)) {
            text = m->token.text;
            ids = m->token.ids;
            n_ids = m->token.n_ids;
        } else if (m->type == PROTO_FINAL && proto_str_eq(m->final.id, id)) {
            text = m->final.text;
            if (m->final.has_ids) {
                ids = m->final.ids;
                n_ids = m->final.n_ids;
            }
        } else {
            continue;
        }
        got_first = 1;
        if (m->type == PROTO_TOKEN) n_tokens += n_ids;
        s_print_logprobs(ids, m->type == PROTO_TOKEN ? m->token.lps : m->final.lps, n_ids);
        if (m->type == PROTO_FINAL && g->n > 1) printf("--- completion %u\n", m->final.index);
        if (a->ids) {
            for (uint32_t i = 0; i < n_ids; i++) printf("%d ", (int)ids[i]);
        } else if (text.n) {
            fwrite(text.p, 1, text.n, stdout);
        }
        if (reply && text.n) {
            if (len + text.n + 1 > cap) {
                size_t nc = (len + text.n + 1) * 2;
                char *p = realloc(acc, nc);
                if (p) {
                    acc = p;
                    cap = nc;
                }
            }
            if (len + text.n + 1 <= cap) {
                memcpy(acc + len, text.p, text.n);
                len += text.n;
                acc[len] = 0;
            }
        }
        fflush(stdout);
        if (m->type == PROTO_FINAL) {
            const proto_final *f = &m->final;
            printf("\n");
            fflush(stdout);
            if (f->left && (f->finish == PROTO_FINISH_STOP || f->finish == PROTO_FINISH_LENGTH)) continue;
            if (f->finish == PROTO_FINISH_STOP || f->finish == PROTO_FINISH_LENGTH) {
                rc = 0;
            } else if (f->finish == PROTO_FINISH_CANCELLED && cancelled) {
                fprintf(stderr, "zllm: interrupted: request cancelled after %u tokens\n", f->completion_tokens);
                rc = S_EXIT_INTERRUPTED;
            } else if (f->code_str.n || f->message.n) {
                fprintf(stderr, "zllm: %s: %.*s%s%.*s\n", proto_finish_name(f->finish), (int)f->code_str.n,
                        f->code_str.p ? f->code_str.p : "", f->code_str.n && f->message.n ? ": " : "",
                        (int)f->message.n, f->message.p ? f->message.p : "");
            } else {
                fprintf(stderr, "zllm: request ended with finish %s\n", proto_finish_name(f->finish));
            }
            if (getenv("ZLLM_VERBOSE"))
                fprintf(stderr, "[%s: %u prompt + %u completion tokens, queue %.1f ms, ttft %.1f ms, total %.1f ms]\n",
                        proto_finish_name(f->finish), f->prompt_tokens, f->completion_tokens, f->queue_ms,
                        f->ttft_ms, f->total_ms);
            break;
        }
    }
    if (reply) *reply = acc ? acc : strdup("");
    else free(acc);
    return rc;
}

static int s_generate(zllm_client *c, const s_args *a) {
    char id[64];
    snprintf(id, sizeof id, "zllm-%d", (int)getpid());
    proto_generate g;
    s_fill(a, &g, id);
    proto_chat msgs[2];
    if (a->n_tokens >= 0) {
        g.prompt_kind = PROTO_PROMPT_TOKENS;
        g.tokens = a->tokens;
        g.n_tokens = (uint32_t)a->n_tokens;
    } else if (a->chat || a->system) {
        int n = 0;
        if (a->system) msgs[n++] = (proto_chat){.role = proto_cstr("system"), .content = proto_cstr(a->system)};
        msgs[n++] = (proto_chat){.role = proto_cstr("user"), .content = proto_cstr(a->prompt)};
        g.prompt_kind = PROTO_PROMPT_MESSAGES;
        g.messages = msgs;
        g.n_messages = (uint32_t)n;
    } else {
        g.prompt_kind = PROTO_PROMPT_TEXT;
        g.prompt = proto_cstr(a->prompt);
    }
    return s_run_one(c, a, &g, NULL);
}

static int s_chat(zllm_client *c, const s_args *a) {
    enum { MAXM = 256 };   /* messages kept; the oldest exchanges are dropped beyond it */
    char *role[MAXM], *content[MAXM];
    int n = 0, rc = 0, turn = 0;
    if (a->system) {
        role[n] = strdup("system");
        content[n++] = strdup(a->system);
    }
    int interactive = isatty(0);
    char *line = malloc(S_LINE_MAX);
    if (!line) return 1;
    for (;;) {
        if (interactive) {
            fprintf(stderr, "> ");
            fflush(stderr);
        }
        if (!fgets(line, S_LINE_MAX, stdin)) break;
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (n + 2 > MAXM) {   /* drop the oldest user/assistant pair after the system message */
            int first = a->system ? 1 : 0;
            for (int k = first; k < first + 2; k++) {
                free(role[k]);
                free(content[k]);
            }
            memmove(role + first, role + first + 2, (size_t)(n - first - 2) * sizeof *role);
            memmove(content + first, content + first + 2, (size_t)(n - first - 2) * sizeof *content);
            n -= 2;
        }
        role[n] = strdup("user");
        content[n++] = strdup(line);
        proto_chat msgs[MAXM];
        for (int k = 0; k < n; k++)
            msgs[k] = (proto_chat){.role = proto_cstr(role[k]), .content = proto_cstr(content[k])};
        char id[64];
        snprintf(id, sizeof id, "chat-%d-%d", (int)getpid(), turn++);
        proto_generate g;
        s_fill(a, &g, id);
        g.prompt_kind = PROTO_PROMPT_MESSAGES;
        g.messages = msgs;
        g.n_messages = (uint32_t)n;
        char *reply = NULL;
        s_interrupted = 0;
        rc = s_run_one(c, a, &g, &reply);
        role[n] = strdup("assistant");
        content[n++] = reply;
    }
    for (int k = 0; k < n; k++) {
        free(role[k]);
        free(content[k]);
    }
    free(line);
    return rc;
}

static int s_status(zllm_client *c, const char *ep) {
    char err[256];
    if (zllm_client_status(c, "status", err, sizeof err) != 0) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    double end = s_now() + 5.0;
    while (s_now() < end) {
        const proto_msg *m;
        int r = zllm_client_recv(c, 200, &m, err, sizeof err);
        if (r < 0) break;
        if (r == 0 || m->type != PROTO_STATUS) continue;
        const proto_status *s = &m->status;
        printf("ready %s, queue %u, active %u\n", s->ready ? "yes" : "no", s->queue, s->active);
        printf("models:");
        for (uint32_t i = 0; i < s->n_models; i++) printf(" %.*s", (int)s->models[i].n, s->models[i].p);
        printf("\nworkers: %u\n", s->n_workers);
        for (uint32_t i = 0; i < s->n_workers; i++) {
            const proto_worker_info *w = &s->workers[i];
            printf("  %.*s model %.*s device %.*s batch %u slots %u (free %u, running %u) ctx %u step %llu %s\n",
                   (int)w->name.n, w->name.p ? w->name.p : "", (int)w->model.n, w->model.p ? w->model.p : "",
                   (int)w->device.n, w->device.p ? w->device.p : "", w->max_batch, w->n_slots, w->free_slots,
                   w->running, w->n_ctx, (unsigned long long)w->step, w->alive ? "alive" : "DEAD");
            if (w->kv_block) /* its KV blocks and prefix cache (docs/kv-cache.md) */
                printf("    kv block %u: used %u, free %u, cached %u; prompt tokens %llu, %llu found cached; "
                       "%llu preemptions, %llu evictions\n",
                       w->kv_block, w->kv_used, w->kv_free, w->kv_cached, (unsigned long long)w->kv_prompt_tokens,
                       (unsigned long long)w->kv_hit_tokens, (unsigned long long)w->kv_preemptions,
                       (unsigned long long)w->kv_evictions);
        }
        for (uint32_t i = 0; i < s->n_capacity; i++) { /* why a model cannot take work now */
            const proto_model_info *k = &s->capacity[i];
            printf("  model %.*s: %u workers, %u free slots, %u queued, %llu registrations refused%s%.*s\n",
                   (int)k->model.n, k->model.p ? k->model.p : "", k->workers, k->free_slots, k->queued,
                   (unsigned long long)k->refused, k->reason.n ? ": " : "", (int)k->reason.n,
                   k->reason.p ? k->reason.p : "");
        }
        printf("counters:");
        for (uint32_t i = 0; i < s->n_counters; i++)
            printf(" %.*s=%llu", (int)s->counters[i].name.n, s->counters[i].name.p ? s->counters[i].name.p : "",
                   (unsigned long long)s->counters[i].value);
        printf("\n");
        return s->ready ? 0 : 1;
    }
    fprintf(stderr, "zllm: no status from %s within 5 s\n", ep);
    return 1;
}

/* ------------------------------------------------------------------------------------------------------------
 * bench: a closed-loop load generator: c streams, each sending its next request when its last one ends; the
 * output lengths and the streams' start times are common/benchload.h's, as in zllm-httpbench */

typedef struct {
    double t_submit, t_first, t_last, t_end;  /* seconds */
    int n_out;                     /* tokens received */
    int sent;                      /* 1 once submitted */
    int done;                      /* 1 after the final (or a client timeout) */
    int ok;                        /* 1 for stop/length */
    proto_finish finish;           /* final's finish */
    int n_prompt;                  /* prompt tokens sent */
    int stream;                    /* --turns: the chat buffer its chat uses */
    int first_wave;                /* 1: among the first `concurrency` submissions */
    uint64_t digest;               /* benchload_digest of its output ids so far */
} s_breq;

static uint64_t s_rand(uint64_t *x) {   /* xorshift64* */
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, int n, double p) {
    if (n == 0) return NAN;
    int i = (int)ceil(p / 100.0 * n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

/* submits request `id` of the pl ids of toks, ol output tokens, at priority prio; returns 0 or -1 (err) */
static int s_bench_submit(zllm_client *c, const s_args *a, const char *id, const int32_t *toks, int pl, int ol,
                          int prio, char *err, size_t errlen) {
    proto_generate g;
    s_fill(a, &g, id);
    if (isnan(a->temp)) g.sampling.temperature = 0;
    g.sampling.ignore_eos = 1;
    g.prompt_kind = PROTO_PROMPT_TOKENS;
    g.tokens = (int32_t *)toks;
    g.n_tokens = (uint32_t)pl;
    g.max_tokens = (uint32_t)ol;
    g.priority = prio;
    g.deadline_ms = a->deadline_ms ? a->deadline_ms : 60000;
    return zllm_client_submit(c, &g, err, errlen);
}

/* pl random ids (drawn from [3, vocab)) from the bench's generator */
static void s_bench_fill(const s_args *a, int32_t *toks, int pl, uint64_t *rng) {
    for (int i = 0; i < pl; i++) toks[i] = 3 + (int32_t)(s_rand(rng) % (uint64_t)(a->vocab - 3));
}

/* the prefix-cache counters of the broker's workers (status), for the `cache:` line */
enum { S_KV_WORKERS = 64 };
typedef struct {
    char name[PROTO_NAME_MAX + 1];
    uint64_t hit, prompt; /* kv_hit_tokens, kv_prompt_tokens */
} s_wkv;

/* asks the broker's status and copies its workers' counters into w (at most S_KV_WORKERS); returns their number,
 * or -1 when no status came within 2 s. Other messages that come meanwhile are dropped (none is in flight) */
static int s_kv_read(zllm_client *c, s_wkv *w) {
    char err[256];
    if (zllm_client_status(c, "bench-kv", err, sizeof err) != 0) return -1;
    double end = s_now() + 2.0;
    while (s_now() < end) {
        const proto_msg *m;
        int r = zllm_client_recv(c, 100, &m, err, sizeof err);
        if (r < 0) return -1;
        if (r == 0 || m->type != PROTO_STATUS) continue;
        int n = 0;
        for (uint32_t i = 0; i < m->status.n_workers && n < S_KV_WORKERS; i++, n++) {
            proto_str_copy(m->status.workers[i].name, w[n].name, sizeof w[n].name);
            w[n].hit = m->status.workers[i].kv_hit_tokens;
            w[n].prompt = m->status.workers[i].kv_prompt_tokens;
        }
        return n;
    }
    return -1;
}

/* worker name's counters in before[n_before] (zero when it was not there) into *h0, *p0 */
static void s_kv_before(const s_wkv *before, int n_before, const char *name, uint64_t *h0, uint64_t *p0) {
    *h0 = *p0 = 0;
    for (int j = 0; j < n_before; j++)
        if (!strcmp(before[j].name, name)) *h0 = before[j].hit, *p0 = before[j].prompt;
}

/* the `cache:` line: per worker, the prompt tokens found cached over the run (after - before). Workers report
 * their counters in heartbeats, so the status is asked again (up to 3 s) until the workers' prompt tokens have
 * grown by at least `expect` (the prompt tokens of the requests that got a first token: each was admitted) */
static void s_kv_report(zllm_client *c, const s_wkv *before, int n_before, uint64_t expect) {
    s_wkv after[S_KV_WORKERS];
    int n = -1;
    uint64_t hit = 0, prompt = 0;
    double end = s_now() + 3.0;
    do {
        if (n >= 0) usleep(100000);
        int got = s_kv_read(c, after);
        if (got < 0) continue;
        n = got;
        hit = prompt = 0;
        for (int i = 0; i < n; i++) {
            uint64_t h0, p0;
            s_kv_before(before, n_before, after[i].name, &h0, &p0);
            hit += after[i].hit - h0;
            prompt += after[i].prompt - p0;
        }
    } while (prompt < expect && s_now() < end);
    if (n < 0) {
        printf("cache: unknown (no status from the broker)\n");
        return;
    }
    printf("cache: hit %llu of %llu prompt tokens (%.1f%%) over the run;", (unsigned long long)hit,
           (unsigned long long)prompt, prompt ? 100.0 * (double)hit / (double)prompt : 0.0);
    for (int i = 0; i < n; i++) {
        uint64_t h0, p0;
        s_kv_before(before, n_before, after[i].name, &h0, &p0);
        printf(" %s %llu/%llu", after[i].name, (unsigned long long)(after[i].hit - h0),
               (unsigned long long)(after[i].prompt - p0));
    }
    printf("\n");
}

/* Closed-loop load: N requests, `concurrency` of them in flight, each a new random prompt (after shared prefix
 * i mod K with --prefixes). With --turns T, the N requests are N/T chats of T turns each, `concurrency` chats at
 * once: turn t of a chat is sent when turn t-1 ends, its prompt turn t-1's prompt, the ids turn t-1 produced and
 * new ids (drawn from the seed and the request's index, so that prompts do not depend on the order requests end
 * in); a stream that ends a chat starts the next one. Inter-token latency is the gap between two token messages
 * of one stream (divided by the ids the later one carries). With --long-prompt-len, background requests (ids
 * "l<k>") of long prompts are submitted on a clock beside them until the measured ones end, then cancelled; they
 * are reported on their own line and left out of every other figure, so that the measured streams' ITL shows what
 * a long prompt arriving does to them. With --hi-every, probes (ids "h<k>") at --hi-priority are submitted on a
 * clock while the measured ones run, waited for, and reported on their own `hi:` line. */
static int s_bench(zllm_client *c, const s_args *a) {
    const int N = a->n_requests, T = a->turns, chats = N / T;
    const int n_long_cap = 1 << 16, n_hi_cap = 1 << 16;
    const int turn_mode = T > 1, plain = !turn_mode && !a->n_prefixes; /* plain: the prompts of the generator */
    /* a chat's context: its prefix and every turn's new ids and output */
    const long chat_cap = turn_mode ? (long)a->prefix_len + (long)T * (a->plen_hi + a->olen_hi) : 0;
    s_breq *r = calloc((size_t)N, sizeof *r);
    s_breq *lr = a->long_len ? calloc((size_t)n_long_cap, sizeof *lr) : NULL;
    s_breq *hr = a->hi_every_ms ? calloc((size_t)n_hi_cap, sizeof *hr) : NULL;
    double *ttft = calloc((size_t)N + (a->long_len ? (size_t)n_long_cap : 0) + (a->hi_every_ms ? (size_t)n_hi_cap : 0),
                          sizeof *ttft);
    size_t itl_cap = 1 << 16, n_itl = 0;
    double *itl = malloc(itl_cap * sizeof *itl);
    long tok_cap = a->prefix_len + a->plen_hi;
    if (tok_cap < a->long_len) tok_cap = a->long_len;
    if (tok_cap < a->hi_plen) tok_cap = a->hi_plen;
    int32_t *toks = malloc((size_t)tok_cap * sizeof *toks);
    int32_t *ctx = turn_mode ? malloc((size_t)a->concurrency * (size_t)chat_cap * sizeof *ctx) : NULL;
    int *ctx_len = turn_mode ? calloc((size_t)a->concurrency, sizeof *ctx_len) : NULL;
    int *free_streams = turn_mode ? malloc((size_t)a->concurrency * sizeof *free_streams) : NULL;
    int *ready = turn_mode ? malloc((size_t)N * sizeof *ready) : NULL; /* turns whose previous turn ended */
    int n_free = 0, rq_head = 0, rq_tail = 0;
    int rc = 0;
    double *sent = calloc((size_t)N, sizeof *sent);
    if (!r || !ttft || !sent || !itl || !toks || (a->long_len && !lr) || (a->hi_every_ms && !hr) ||
        (turn_mode && (!ctx || !ctx_len || !free_streams || !ready))) {
        fprintf(stderr, "zllm bench: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int s = a->concurrency - 1; turn_mode && s >= 0; s--) free_streams[n_free++] = s;
    s_wkv kv_before[S_KV_WORKERS];
    int n_kv_before = s_kv_read(c, kv_before);
    if (n_kv_before < 0) n_kv_before = 0;
    uint64_t rng = a->bench_seed * 0x9E3779B97F4A7C15ull + 1, lrng = rng ^ 0x5851F42D4C957F2Dull;
    unsigned deadline = a->deadline_ms ? a->deadline_ms : 60000;
    int n_sent = 0, next_chat = 0, in_flight = 0, finished = 0, n_long = 0, n_up = 0; /* n_up: streams started */
    int n_hi = 0, hi_open = 0;
    long long out_tokens = 0;
    /* the steady window: from the first token of the last of the first `concurrency` requests (every stream of the
     * first wave runs) to the last submission (after it fewer streams run): its tokens over its time */
    long long streamed = 0, st_tok0 = -1, st_tok1 = -1;
    double st_t0 = 0, st_t1 = 0;
    const int first_wave = a->concurrency < N ? a->concurrency : N;
    int first_wave_started = 0;
    char err[256], id[64];
    int fin_count[PROTO_FINISH_COUNT] = {0};
    double t0 = s_now(), t_main_end = 0, t_scan = t0, t_long = t0 + a->long_every_ms / 1000.0,
           t_hi = t0 + a->hi_every_ms / 1000.0;
/* a measured request k has ended (final or client timeout): its chat's next turn is ready, or its stream free */
#define S_ENDED(k)                                                                                                     \
    do {                                                                                                               \
        in_flight--;                                                                                                   \
        if (++finished == N) t_main_end = s_now();                                                                     \
        if (turn_mode) {                                                                                               \
            if ((k) % T < T - 1) ready[rq_tail++] = (k) + 1;                                                           \
            else free_streams[n_free++] = r[k].stream;                                                                 \
        }                                                                                                              \
    } while (0)
    while ((finished < N || hi_open > 0) && !s_interrupted) {
        int wait_ms = 100;
        for (; n_up < a->concurrency; n_up++) { /* the streams whose start time has come */
            double due = t0 + benchload_start(n_up, a->concurrency, a->ramp_ms) - s_now();
            if (due > 0) {
                wait_ms = (int)ceil(due * 1e3);
                break;
            }
        }
        while (in_flight < n_up) {
            int k; /* the request to send: the next turn of a running chat, else the first of the next chat */
            if (rq_head < rq_tail) k = ready[rq_head++];
            else if (next_chat < chats) k = next_chat++ * T;
            else break;
            const int32_t *p = toks;
            int pl;
            int ol = benchload_out_len(a->bench_seed, k, a->olen_lo, a->olen_hi);
            if (plain) {
                pl = a->plen_lo + (int)(s_rand(&rng) % (uint64_t)(a->plen_hi - a->plen_lo + 1));
                s_bench_fill(a, toks, pl, &rng);
            } else if (!turn_mode) {
                int own = a->plen_lo + (int)(s_rand(&rng) % (uint64_t)(a->plen_hi - a->plen_lo + 1));
                benchload_prefix(a->prefix_seed, benchload_prefix_of(k, a->n_prefixes), toks, a->prefix_len, a->vocab);
                s_bench_fill(a, toks + a->prefix_len, own, &rng);
                pl = a->prefix_len + own;
            } else {
                if (k % T == 0) { /* a new chat: a free buffer, its system prompt */
                    r[k].stream = free_streams[--n_free];
                    ctx_len[r[k].stream] = a->prefix_len;
                    benchload_prefix(a->prefix_seed, benchload_prefix_of(k / T, a->n_prefixes),
                                     ctx + (size_t)r[k].stream * (size_t)chat_cap, a->prefix_len, a->vocab);
                } else {
                    r[k].stream = r[k - 1].stream;
                }
                int32_t *cx = ctx + (size_t)r[k].stream * (size_t)chat_cap;
                int own = benchload_prompt_len(a->bench_seed, k, a->plen_lo, a->plen_hi);
                benchload_ids(a->bench_seed, k, cx + ctx_len[r[k].stream], own, a->vocab);
                ctx_len[r[k].stream] += own;
                p = cx;
                pl = ctx_len[r[k].stream];
            }
            snprintf(id, sizeof id, "b%d", k);
            r[k].t_submit = s_now();
            r[k].sent = 1;
            r[k].first_wave = n_sent < first_wave;
            r[k].n_prompt = pl;
            r[k].digest = benchload_digest_start(k);
            sent[n_sent] = r[k].t_submit - t0;
            in_flight++;
            if (s_bench_submit(c, a, id, p, pl, ol, a->priority, err, sizeof err) != 0) {
                fprintf(stderr, "zllm bench: %s\n", err);
                r[k].done = 1;
                S_ENDED(k);
            }
            n_sent++;
            if (n_sent == N && N > a->concurrency) {
                st_tok1 = streamed;
                st_t1 = s_now();
            }
        }
        if (a->long_len && finished < N && n_long < n_long_cap && s_now() >= t_long) {
            snprintf(id, sizeof id, "l%d", n_long);
            lr[n_long].t_submit = s_now();
            lr[n_long].n_prompt = a->long_len;
            s_bench_fill(a, toks, a->long_len, &lrng);
            if (s_bench_submit(c, a, id, toks, a->long_len, a->long_out, a->priority, err, sizeof err) != 0) {
                fprintf(stderr, "zllm bench: %s\n", err);
                lr[n_long].done = 1;
            }
            n_long++;
            t_long += a->long_every_ms / 1000.0;
        }
        if (a->hi_every_ms && finished < N && n_hi < n_hi_cap && s_now() >= t_hi) {
            snprintf(id, sizeof id, "h%d", n_hi);
            hr[n_hi].t_submit = s_now();
            hr[n_hi].n_prompt = a->hi_plen;
            benchload_ids(a->bench_seed ^ 0x4849ull, n_hi, toks, a->hi_plen, a->vocab);
            if (s_bench_submit(c, a, id, toks, a->hi_plen, a->hi_out, a->hi_priority, err, sizeof err) != 0) {
                fprintf(stderr, "zllm bench: %s\n", err);
                hr[n_hi].done = 1;
            } else {
                hi_open++;
            }
            n_hi++;
            t_hi += a->hi_every_ms / 1000.0;
        }
        const proto_msg *m;
        if (a->long_len && finished < N) {
            double to_long = (t_long - s_now()) * 1e3;
            if (to_long < wait_ms) wait_ms = to_long < 0 ? 0 : (int)to_long;
        }
        if (a->hi_every_ms && finished < N) {
            double to_hi = (t_hi - s_now()) * 1e3;
            if (to_hi < wait_ms) wait_ms = to_hi < 0 ? 0 : (int)to_hi;
        }
        int got = zllm_client_recv(c, wait_ms < 100 ? wait_ms : 100, &m, err, sizeof err);
        double now = s_now();
        if (got < 0) {
            fprintf(stderr, "zllm bench: %s\n", err);
            rc = 1;
            break;
        }
        if (got == 1 && (m->type == PROTO_TOKEN || m->type == PROTO_FINAL)) {
            proto_str pid = m->type == PROTO_TOKEN ? m->token.id : m->final.id;
            char sid[PROTO_ID_MAX + 1];
            proto_str_copy(pid, sid, sizeof sid);
            const int is_long = sid[0] == 'l', is_hi = sid[0] == 'h', is_main = sid[0] == 'b';
            int k = is_main || is_long || is_hi ? atoi(sid + 1) : -1;
            s_breq *q = k < 0                ? NULL
                        : is_long            ? (k < n_long ? &lr[k] : NULL)
                        : is_hi              ? (k < n_hi ? &hr[k] : NULL)
                        : k < N && r[k].sent ? &r[k]
                                             : NULL;
            if (q && !q->done) {
                int n = m->type == PROTO_TOKEN ? (int)m->token.n_ids : 0;
                if (n > 0) {
                    if (q->n_out == 0) {
                        q->t_first = now;
                        if (is_main && q->first_wave && ++first_wave_started == first_wave) {
                            st_tok0 = streamed;
                            st_t0 = now;
                        }
                    } else if (is_main) {
                        if (n_itl == itl_cap) {
                            double *t = realloc(itl, 2 * itl_cap * sizeof *itl);
                            if (t) itl = t, itl_cap *= 2;
                        }
                        if (n_itl < itl_cap) itl[n_itl++] = (now - q->t_last) / n;
                    }
                    q->t_last = now;
                    q->n_out += n;
                    if (is_main) {
                        streamed += n;
                        q->digest = benchload_digest_add(q->digest, m->token.ids, n);
                        if (turn_mode) { /* the chat's context grows by the ids its turn produces */
                            int *len = &ctx_len[q->stream];
                            int take = n < chat_cap - *len ? n : (int)(chat_cap - *len);
                            memcpy(ctx + (size_t)q->stream * (size_t)chat_cap + *len, m->token.ids,
                                   (size_t)take * sizeof *ctx);
                            *len += take;
                        }
                    }
                }
                if (m->type == PROTO_FINAL) {
                    q->done = 1;
                    q->t_end = now;
                    q->finish = m->final.finish;
                    q->ok = q->finish == PROTO_FINISH_STOP || q->finish == PROTO_FINISH_LENGTH;
                    if (is_hi) hi_open--;
                    if (is_main) {
                        fin_count[q->finish]++;
                        out_tokens += q->n_out;
                        S_ENDED(k);
                    }
                }
            }
        }
        /* client-side timeouts, looked for every 100 ms (a scan per message would cost O(N) each: at 1,000
         * streams the bench would fall behind the broker and lose messages to its send limit) */
        if (now - t_scan >= 0.1) t_scan = now;
        for (int k = 0; t_scan == now && k < N; k++)
            if (r[k].sent && !r[k].done && now - r[k].t_submit > (deadline + S_GRACE_MS) / 1000.0) {
                snprintf(id, sizeof id, "b%d", k);
                zllm_client_cancel(c, id, err, sizeof err);
                r[k].done = 1;
                S_ENDED(k);
            }
        for (int k = 0; t_scan == now && k < n_long; k++)
            if (!lr[k].done && now - lr[k].t_submit > (deadline + S_GRACE_MS) / 1000.0) {
                snprintf(id, sizeof id, "l%d", k);
                zllm_client_cancel(c, id, err, sizeof err);
                lr[k].done = 1;
            }
        for (int k = 0; t_scan == now && k < n_hi; k++)
            if (!hr[k].done && now - hr[k].t_submit > (deadline + S_GRACE_MS) / 1000.0) {
                snprintf(id, sizeof id, "h%d", k);
                zllm_client_cancel(c, id, err, sizeof err);
                hr[k].done = 1;
                hi_open--;
            }
    }
#undef S_ENDED
    double wall = (t_main_end > 0 ? t_main_end : s_now()) - t0;
    int n_long_open = 0;
    for (int k = 0; k < n_long; k++) /* background requests still running: not waited for */
        if (!lr[k].done) {
            snprintf(id, sizeof id, "l%d", k);
            zllm_client_cancel(c, id, err, sizeof err);
            n_long_open++;
        }
    for (int k = 0; k < n_hi; k++) /* probes still running after an interrupt */
        if (!hr[k].done) {
            snprintf(id, sizeof id, "h%d", k);
            zllm_client_cancel(c, id, err, sizeof err);
        }
    int n_ttft = 0, n_ok = 0;
    uint64_t expect = 0, digest = 0;
    for (int k = 0; k < N; k++) {
        if (r[k].ok) n_ok++;
        if (r[k].n_out > 0) ttft[n_ttft++] = r[k].t_first - r[k].t_submit, expect += (uint64_t)r[k].n_prompt;
        digest += r[k].digest;
    }
    for (int k = 0; k < n_long; k++) expect += lr[k].n_out > 0 ? (uint64_t)lr[k].n_prompt : 0;
    for (int k = 0; k < n_hi; k++) expect += hr[k].n_out > 0 ? (uint64_t)hr[k].n_prompt : 0;
    qsort(ttft, (size_t)n_ttft, sizeof *ttft, s_cmp);
    qsort(itl, n_itl, sizeof *itl, s_cmp);
    printf("requests: %d (%d ok", N, n_ok);
    for (int f = 1; f < PROTO_FINISH_COUNT; f++)
        if (fin_count[f]) printf(", %d %s", fin_count[f], proto_finish_name((proto_finish)f));
    int n_final = 0;
    for (int f = 1; f < PROTO_FINISH_COUNT; f++) n_final += fin_count[f];
    printf(", %d without final), concurrency %d, prompt %d..%d, output %d..%d tokens\n", N - n_final,
           a->concurrency, a->plen_lo, a->plen_hi, a->olen_lo, a->olen_hi);
    printf("wall %.2f s, %.1f requests/s, %.1f output tokens/s, %lld tokens\n", wall, n_ok / wall, out_tokens / wall,
           out_tokens);
    if (st_tok0 >= 0 && st_tok1 > st_tok0 && st_t1 > st_t0)
        printf("steady: %.1f output tokens/s over %.2f s with %d streams (from the first token of every first stream "
               "to the last submission)\n",
               (double)(st_tok1 - st_tok0) / (st_t1 - st_t0), st_t1 - st_t0, a->concurrency);
    else printf("steady: none (the run has no window with every stream running: -N must exceed -c)\n");
    printf("ttft ms: p50 %.2f p90 %.2f p99 %.2f\n", s_pct(ttft, n_ttft, 50) * 1e3, s_pct(ttft, n_ttft, 90) * 1e3,
           s_pct(ttft, n_ttft, 99) * 1e3);
    const double i50 = s_pct(itl, (int)n_itl, 50), i99 = s_pct(itl, (int)n_itl, 99);
    printf("itl ms:  p50 %.2f p90 %.2f p99 %.2f (p99/p50 %.2f, %zu gaps)\n", i50 * 1e3,
           s_pct(itl, (int)n_itl, 90) * 1e3, i99 * 1e3, i99 / i50, n_itl);
    if (a->long_len) {
        int n_lok = 0, n_lt = 0;
        for (int k = 0; k < n_long; k++) {
            n_lok += lr[k].ok;
            if (lr[k].n_out > 0) ttft[n_lt++] = lr[k].t_first - lr[k].t_submit;
        }
        qsort(ttft, (size_t)n_lt, sizeof *ttft, s_cmp);
        printf("long: %d prompts of %d tokens, one every %d ms (%d ok, %d cancelled at the end), ttft ms: p50 %.1f "
               "p99 %.1f\n",
               n_long, a->long_len, a->long_every_ms, n_lok, n_long_open, s_pct(ttft, n_lt, 50) * 1e3,
               s_pct(ttft, n_lt, 99) * 1e3);
    }
    if (a->hi_every_ms) {
        int n_hok = 0, n_ht = 0;
        for (int k = 0; k < n_hi; k++) {
            n_hok += hr[k].ok;
            if (hr[k].n_out > 0) ttft[n_ht++] = hr[k].t_first - hr[k].t_submit;
        }
        qsort(ttft, (size_t)n_ht, sizeof *ttft, s_cmp);
        printf("hi: %d probes of %d tokens at priority %d, one every %d ms (%d ok), ttft ms: p50 %.2f p90 %.2f p99 "
               "%.2f\n",
               n_hi, a->hi_plen, a->hi_priority, a->hi_every_ms, n_hok, s_pct(ttft, n_ht, 50) * 1e3,
               s_pct(ttft, n_ht, 90) * 1e3, s_pct(ttft, n_ht, 99) * 1e3);
        if (n_hok != n_hi) rc = 1;
    }
    double b50, b99, bmax;
    benchload_burst(sent, n_sent, &b50, &b99, &bmax);
    printf("sends in a request's millisecond: p50 %.0f p99 %.0f max %.0f\n", b50, b99, bmax);
    s_kv_report(c, kv_before, n_kv_before, expect);
    printf("outputs: digest %016llx of the %d requests' output ids (equal digests: equal outputs)\n",
           (unsigned long long)digest, N);
    if (n_ok != N) rc = 1;
done:
    free(r);
    free(lr);
    free(hr);
    free(ttft);
    free(sent);
    free(itl);
    free(toks);
    free(ctx);
    free(ctx_len);
    free(free_streams);
    free(ready);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        s_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("zllm %s\n", ZLLM_VERSION);
        return 0;
    }
    s_args a;
    int pr = s_parse(argc, argv, &a);
    if (pr != 0) return pr > 0 ? 0 : 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_sigint;
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    zllm_client *c = zllm_client_new(a.broker, err, sizeof err);
    if (!c) {
        fprintf(stderr, "zllm: %s\n", err);
        return 1;
    }
    int rc = 2;
    if (a.cmd == C_GEN) rc = s_generate(c, &a);
    else if (a.cmd == C_CHAT) rc = s_chat(c, &a);
    else if (a.cmd == C_STATUS) rc = s_status(c, a.broker);
    else if (a.cmd == C_BENCH) rc = s_bench(c, &a);
    zllm_client_destroy(&c);
    return rc;
}
