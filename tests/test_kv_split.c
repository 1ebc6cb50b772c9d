/* tests/test_kv_split.c: the batcher's rule for engines whose decode and prefill kernels differ
 * (zl_engine.kv_split_kernels, the CUDA engine; docs/kv-cache.md), run on the CPU engine (stories260K), whose
 * bits do not show it: a wrapper engine says kv_split_kernels and records, for every KV row of its pool, which kind
 * of entry wrote it: a decode entry (one token, zl_seq.prompt 0, or fed) or prompt rows. A cold run computes a
 * sequence's prompt positions as prompt rows and its generated positions as decode entries, so every entry must
 *  - write each position by that kind (a 1-token prompt chunk flagged as a prompt entry; a preempted sequence's
 *    generated tokens replayed as decode entries, one a step, never recomputed as a prefill chunk), and
 *  - read only rows written by the kind its own cold run would have used (no published block of decoded rows
 *    ever reused by a later prompt, no cached block standing for a resumed sequence's generated positions).
 * A randomized workload over a small paged pool (shared prefixes, continuations of earlier answers, priorities,
 * cancels, preemptions, evictions), with steps synchronous and queued ahead; each request's tokens must equal
 * those of the same request alone. The same workload with the flag off (the CPU engines' rules: decoded blocks
 * published, recomputation in chunks) must break the rule: the checker sees what it is meant to catch.
 * tests/test_kv_split_mutants.sh rebuilds this test against broken batchers, which must fail it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batcher.h"
#include "engine.h"
#include "model.h"
#include "test.h"

enum { K_NONE = 0, K_PROMPT = 1, K_DECODE = 2 };
enum { CTX = 96, BS = 4, BLOCKS = 40, SLOTS = 8, NREQ = 300, MAXP = 64 };

typedef struct {
    zl_engine base;   /* must stay first */
    zl_engine *inner; /* the paged CPU engine */
    uint8_t *kind;    /* [kv_blocks * BS] who wrote each pool row */
    int *slot_np;     /* [n_slots] prompt length of the sequence on each slot (from its non-fed entries) */
    uint64_t wrong_write, wrong_read, dec, dec_replay, prompt1, prompt_n;
} t_kind;

static int tk_fail(t_kind *a) {
    snprintf(a->base.err, sizeof a->base.err, "%s", a->inner->err);
    return -1;
}

static int tk_launch(zl_engine *e, const zl_step *st) {
    t_kind *a = (t_kind *)e;
    for (int i = 0; i < st->n; i++) {
        const zl_seq *q = &st->seqs[i];
        if (!q->feed) a->slot_np[q->slot] = q->history_prompt;
        const int np = a->slot_np[q->slot];
        const int k = q->n_tokens == 1 && (!q->prompt || q->feed) ? K_DECODE : K_PROMPT;
        if (k == K_DECODE) {
            a->dec++;
            a->dec_replay += !q->sample;
        } else {
            a->prompt1 += q->n_tokens == 1;
            a->prompt_n += q->n_tokens > 1;
        }
        for (int p = 0; p < q->pos; p++) { /* rows read: written by the kind this sequence's cold run uses */
            const uint8_t got = a->kind[q->blocks[p / BS] * BS + p % BS];
            a->wrong_read += got != (p < np ? K_PROMPT : K_DECODE);
        }
        for (int p = q->pos; p < q->pos + q->n_tokens; p++) {
            a->wrong_write += k != (p < np ? K_PROMPT : K_DECODE);
            a->kind[q->blocks[p / BS] * BS + p % BS] = (uint8_t)k;
        }
    }
    return engine_launch(a->inner, st) != 0 ? tk_fail(a) : 0;
}

static int tk_wait(zl_engine *e, const zl_step *st) {
    t_kind *a = (t_kind *)e;
    return engine_wait(a->inner, st) != 0 ? tk_fail(a) : 0;
}

static int tk_copy_block(zl_engine *e, int src, int dst, int n_rows) {
    t_kind *a = (t_kind *)e;
    if (a->inner->copy_block(a->inner, src, dst, n_rows) != 0) return tk_fail(a);
    memcpy(a->kind + (size_t)dst * BS, a->kind + (size_t)src * BS, (size_t)n_rows);
    return 0;
}

static void tk_destroy(zl_engine *e) {
    t_kind *a = (t_kind *)e;
    engine_destroy(&a->inner);
    free(a->kind);
    free(a->slot_np);
    free(a);
}

static const zl_engine_ops tk_ops = {tk_launch, tk_wait, tk_destroy, NULL};

/* the paged CPU engine of `blocks` blocks, wrapped; split: the kv_split_kernels it reports */
static t_kind *tk_new(const zl_model *m, int split, int blocks) {
    char err[256];
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.n_slots = o.max_batch = SLOTS;
    o.n_ctx = CTX;
    o.threads = 1;
    o.max_step_tokens = 64;
    o.kv_block = BS;
    o.kv_blocks = blocks;
    zl_engine *in = engine_new(m, &o, err, sizeof err);
    CHECK(in && in->kv_block == BS && in->copy_block, "paged CPU engine: %s", in ? "no copy_block" : err);
    t_kind *a = in ? calloc(1, sizeof *a) : NULL;
    if (a) {
        a->kind = calloc((size_t)in->kv_blocks * BS, 1);
        a->slot_np = calloc((size_t)in->n_slots, sizeof *a->slot_np);
    }
    if (!a || !a->kind || !a->slot_np) {
        if (a) {
            free(a->kind);
            free(a->slot_np);
        }
        free(a);
        engine_destroy(&in);
        return NULL;
    }
    a->inner = in;
    a->base = *in;
    a->base.ops = &tk_ops;
    a->base.copy_block = tk_copy_block;
    a->base.masks_ready = NULL;
    a->base.masks_late = 0;
    a->base.kv_split_kernels = split;
    return a;
}

typedef struct {
    int32_t toks[CTX];
    int n, max_tokens, priority, cancel_at; /* cancel_at: step after which it is cancelled (-1: never) */
    float temp;
    uint64_t seed;
    int got[CTX], n_got, fin;
} s_job;

static uint64_t s_rs = 88172645463325252ull;
static int s_rand(int n) {
    s_rs ^= s_rs << 13;
    s_rs ^= s_rs >> 7;
    s_rs ^= s_rs << 17;
    return (int)(s_rs % (uint64_t)n);
}

/* runs jobs[0..n) through b, at most `wave` at once; 0 or -1 on a batcher error */
static int s_run(wk_batcher *b, s_job *jobs, int n, int wave, uint64_t rid0) {
    char err[256];
    wk_event ev[256];
    int next = 0, live = 0, step = 0;
    int *start = calloc((size_t)n, sizeof *start);
    if (!start) return -1;
    while ((next < n || live > 0) && step < 200000) {
        while (next < n && live < wave && batcher_free_slots(b) > 0) {
            s_job *j = &jobs[next];
            wk_request r;
            memset(&r, 0, sizeof r);
            r.rid = rid0 + (uint64_t)next;
            r.tokens = j->toks;
            r.n_tokens = j->n;
            r.max_tokens = j->max_tokens;
            r.samp = sampler_defaults();
            r.samp.temperature = j->temp;
            r.samp.seed = j->seed;
            r.ignore_eos = 1;
            r.priority = j->priority;
            if (batcher_add(b, &r, err, sizeof err) != 0) break;
            start[next++] = step;
            live++;
        }
        for (int i = 0; i < next; i++) /* cancels */
            if (!jobs[i].fin && jobs[i].cancel_at >= 0 && step - start[i] == jobs[i].cancel_at &&
                batcher_cancel(b, rid0 + (uint64_t)i)) {
                jobs[i].fin = WK_FIN_CANCELLED;
                live--;
            }
        int n_ev = 0;
        if (batcher_step(b, ev, 256, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            free(start);
            return -1;
        }
        step++;
        for (int k = 0; k < n_ev; k++) {
            if (ev[k].rid < rid0 || ev[k].rid >= rid0 + (uint64_t)n) continue;
            s_job *j = &jobs[ev[k].rid - rid0];
            if (j->fin) continue;
            if (ev[k].tok >= 0 && j->n_got < CTX) j->got[j->n_got++] = ev[k].tok;
            if (ev[k].fin) {
                j->fin = ev[k].fin;
                live--;
            }
        }
    }
    free(start);
    return 0;
}

/* the randomized workload, into jobs[0..NREQ) */
static void s_jobs(s_job *jobs, int vocab) {
    int32_t shared[4][MAXP];
    for (int s = 0; s < 4; s++) {
        shared[s][0] = 1;
        for (int t = 1; t < MAXP; t++) shared[s][t] = 3 + s_rand(vocab - 3);
    }
    for (int i = 0; i < NREQ; i++) {
        s_job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->max_tokens = 2 + s_rand(14);
        j->cancel_at = s_rand(10) == 0 ? s_rand(30) : -1;
        j->priority = s_rand(4) == 0 ? 5 : s_rand(3) == 0 ? -5 : 0;
        j->temp = s_rand(2) ? 0.9f : 0.f;
        j->seed = (uint64_t)s_rand(1 << 30);
        /* a continuation (an earlier prompt and its answer as a later prompt's head) is filled in by the caller
         * after the earlier one ran (s_continue); here a prompt: a shared prefix cut anywhere plus a random tail */
        const int s = s_rand(4), cut = 1 + s_rand(MAXP - 1), tail = s_rand(6);
        memcpy(j->toks, shared[s], (size_t)cut * sizeof(int32_t));
        j->n = cut;
        for (int t = 0; t < tail; t++) j->toks[j->n++] = 3 + s_rand(vocab - 3);
    }
}

/* the second half of the jobs: continuations of earlier ones that finished (prompt + answer + a new turn), and
 * exact repeats of earlier ones (while a repeat decodes, a continuation's published prompt blocks may hold the very
 * tokens it generates: a resumed repeat must not take them) */
static void s_continue(s_job *jobs, int from, int to, int vocab) {
    for (int i = from; i < to; i++) {
        const s_job *p = &jobs[s_rand(from)];
        s_job *j = &jobs[i];
        if (p->fin != WK_FIN_LENGTH) continue;
        if (s_rand(3) == 0) {
            *j = *p;
            j->n_got = j->fin = 0;
            j->cancel_at = -1;
            continue;
        }
        if (p->n + p->n_got + 6 + j->max_tokens >= CTX) continue;
        memcpy(j->toks, p->toks, (size_t)p->n * sizeof(int32_t));
        memcpy(j->toks + p->n, p->got, (size_t)p->n_got * sizeof(int32_t));
        j->n = p->n + p->n_got;
        for (int t = 1 + s_rand(5); t > 0; t--) j->toks[j->n++] = 3 + s_rand(vocab - 3);
    }
}

/* one workload into jobs through a wrapped engine (split: its kv_split_kernels; variant: its chunk_variant; ahead:
 * steps queued ahead), the batcher's KV counters into *st; the engine (for its counts), or NULL */
static t_kind *s_workload(const zl_model *m, int split, int variant, int ahead, s_job *jobs, uint8_t *eog,
                          wk_kv_stats *st) {
    char err[256];
    t_kind *a = tk_new(m, split, BLOCKS);
    if (!a) return NULL;
    a->base.chunk_variant = variant;
    wk_batcher *b = batcher_new(&a->base, eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_kv(b, BS, "stories260K", err, sizeof err) == 0, "batcher: %s", err);
    if (b) batcher_set_ahead(b, ahead);
    if (b) {
        s_rs = 88172645463325252ull;
        s_jobs(jobs, m->cfg.vocab_size);
        s_run(b, jobs, NREQ / 2, SLOTS, 1000);
        s_continue(jobs, NREQ / 2, NREQ, m->cfg.vocab_size);
        s_run(b, jobs + NREQ / 2, NREQ - NREQ / 2, SLOTS, 1000 + NREQ / 2);
        batcher_kv(b, st);
    }
    batcher_destroy(&b);
    return a;
}

/* a directed case: A runs alone; A again (A2) is preempted after 8 tokens by a higher priority H whose prompt is A's
 * prompt and answer and a long new turn; once H ends, its prompt blocks (which hold A's answer as prompt rows) are
 * cached, and A2 resumes: it may take the blocks of its prompt only, and gives A's tokens */
static void test_resume_within(const zl_model *m, uint8_t *eog) {
    enum { NP = 9, MT = 12 };
    char err[256];
    wk_event ev[256];
    s_job A, H;
    memset(&A, 0, sizeof A);
    memset(&H, 0, sizeof H);
    A.toks[0] = 1;
    for (int t = 1; t < NP; t++) A.toks[t] = 10 + 7 * t;
    A.n = NP;
    A.max_tokens = MT;
    A.cancel_at = -1;
    s_job A2 = A;
    /* the smallest pool a context allows (a context and the headroom): H alone needs nearly all of it */
    t_kind *k = tk_new(m, 1, (CTX + BS - 1) / BS + 1);
    if (!k) return;
    wk_batcher *b = batcher_new(&k->base, eog, m->cfg.vocab_size, err, sizeof err);
    CHECK(b && batcher_set_kv(b, BS, "stories260K", err, sizeof err) == 0, "batcher: %s", err);
    if (!b) goto out;
    s_run(b, &A, 1, 1, 1);
    CHECK(A.fin == WK_FIN_LENGTH && A.n_got == MT, "A alone: %d tokens", A.n_got);
    memcpy(H.toks, A.toks, (size_t)NP * sizeof(int32_t));
    memcpy(H.toks + NP, A.got, (size_t)MT * sizeof(int32_t));
    H.n = NP + MT;
    for (; H.n < CTX - 8; H.n++) H.toks[H.n] = 3 + (H.n * 13) % (m->cfg.vocab_size - 3);
    wk_request r;
    memset(&r, 0, sizeof r);
    r.rid = 2;
    r.tokens = A2.toks;
    r.n_tokens = A2.n;
    r.max_tokens = MT;
    r.samp = sampler_defaults();
    r.ignore_eos = 1;
    CHECK(batcher_add(b, &r, err, sizeof err) == 0, "add A2: %s", err);
    wk_kv_stats st;
    uint64_t pre0 = 0;
    int added = 0;
    for (int step = 0; step < 2000 && (!A2.fin || !H.fin); step++) {
        if (!added && A2.n_got >= 8) {
            batcher_kv(b, &st);
            pre0 = st.preemptions;
            wk_request h = r;
            h.rid = 3;
            h.tokens = H.toks;
            h.n_tokens = H.n;
            h.max_tokens = 4;
            h.priority = 5;
            CHECK(batcher_add(b, &h, err, sizeof err) == 0, "add H: %s", err);
            added = 1;
        }
        int n_ev = 0;
        if (batcher_step(b, ev, 256, &n_ev, err, sizeof err) < 0) {
            CHECK(0, "step: %s", err);
            break;
        }
        for (int j = 0; j < n_ev; j++) {
            s_job *J = ev[j].rid == 2 ? &A2 : ev[j].rid == 3 ? &H : NULL;
            if (!J) continue;
            if (ev[j].tok >= 0 && J->n_got < CTX) J->got[J->n_got++] = ev[j].tok;
            if (ev[j].fin) J->fin = ev[j].fin;
        }
    }
    batcher_kv(b, &st);
    CHECK(added && st.preemptions > pre0, "H preempted A2 (%llu preemptions)",
          (unsigned long long)(st.preemptions - pre0));
    CHECK(A2.fin == WK_FIN_LENGTH && A2.n_got == MT && !memcmp(A2.got, A.got, sizeof(int) * MT),
          "A2 gives A's tokens (%d)", A2.n_got);
    CHECK(k->wrong_read == 0 && k->wrong_write == 0,
          "the resumed A2 read only rows of its cold run's kinds (%llu, %llu)", (unsigned long long)k->wrong_read,
          (unsigned long long)k->wrong_write);
out:
    batcher_destroy(&b);
    zl_engine *e = &k->base;
    engine_destroy(&e);
}

/* about one in eight of the requests of jobs that ran to their length, each run again alone (into alone[i]) on a
 * fresh paged engine: the count whose tokens differ from those of jobs (the CPU engine: they must not); *checked
 * the count run */
static int s_alone_diff(const zl_model *m, uint8_t *eog, const s_job *jobs, s_job *alone, int *checked) {
    char err[256];
    int diff = 0;
    *checked = 0;
    for (int i = 0; i < NREQ; i++) {
        if (jobs[i].fin != WK_FIN_LENGTH || s_rand(8)) continue;
        t_kind *one = tk_new(m, 1, BLOCKS);
        wk_batcher *b = one ? batcher_new(&one->base, eog, m->cfg.vocab_size, err, sizeof err) : NULL;
        if (b && batcher_set_kv(b, BS, "stories260K", err, sizeof err) == 0) {
            alone[i] = jobs[i];
            alone[i].n_got = alone[i].fin = 0;
            alone[i].cancel_at = -1;
            s_run(b, &alone[i], 1, 1, 1);
            diff += alone[i].n_got != jobs[i].n_got ||
                    memcmp(alone[i].got, jobs[i].got, (size_t)jobs[i].n_got * sizeof(int)) != 0;
            (*checked)++;
        }
        batcher_destroy(&b);
        zl_engine *eo = one ? &one->base : NULL;
        engine_destroy(&eo);
    }
    return diff;
}

int main(void) {
    char p[1100], err[256];
    snprintf(p, sizeof p, "%s/stories260K/stories260K.gguf", test_fixtures());
    zl_model *m = model_load(p, err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m) return test_report();
    uint8_t *eog = calloc((size_t)m->cfg.vocab_size, 1);
    s_job *jobs = calloc(NREQ, sizeof *jobs), *alone = calloc(NREQ, sizeof *alone);
    if (!eog || !jobs || !alone) {
        CHECK(0, "out of memory");
        goto out;
    }
    test_resume_within(m, eog);
    for (int ahead = 0; ahead < 2; ahead++) {
        wk_kv_stats st;
        memset(&st, 0, sizeof st);
        t_kind *a = s_workload(m, 1, 0, ahead, jobs, eog, &st);
        if (!a) break;
        printf("split, ahead %d: %llu decode entries (%llu replayed), %llu 1-token prompt entries, %llu longer; hit "
               "%llu of %llu prompt tokens, %llu preemptions, %llu replayed tokens, %llu evictions\n",
               ahead, (unsigned long long)a->dec, (unsigned long long)a->dec_replay, (unsigned long long)a->prompt1,
               (unsigned long long)a->prompt_n, (unsigned long long)st.hit_tokens, (unsigned long long)st.prompt_tokens,
               (unsigned long long)st.preemptions, (unsigned long long)st.replayed_tokens,
               (unsigned long long)st.evictions);
        CHECK(a->wrong_write == 0, "ahead %d: every position written by its cold run's kind (%llu not)", ahead,
              (unsigned long long)a->wrong_write);
        CHECK(a->wrong_read == 0, "ahead %d: every row read was written by the reader's cold run's kind (%llu not)",
              ahead, (unsigned long long)a->wrong_read);
        CHECK(st.preemptions > 0 && st.hit_tokens > 0 && st.evictions > 0 && a->dec_replay > 0 && a->prompt1 > 0,
              "ahead %d: preemptions, hits, evictions, replayed decodes and 1-token prompt entries all happen", ahead);
        CHECK(st.replayed_tokens == a->dec_replay,
              "ahead %d: the batcher counts the replays the engine saw (%llu, %llu)", ahead,
              (unsigned long long)st.replayed_tokens, (unsigned long long)a->dec_replay);
        /* every finished request's tokens equal those of the same request alone (the CPU engine: same bits) */
        int checked = 0, diff = s_alone_diff(m, eog, jobs, alone, &checked);
        CHECK(checked > 0 && diff == 0, "ahead %d: %d requests equal their runs alone (%d differ)", ahead, checked,
              diff);
        zl_engine *ea = &a->base;
        engine_destroy(&ea);
    }
    { /* the checker catches the CPU engines' own rules (decoded blocks published, recomputation in chunks) */
        wk_kv_stats st;
        t_kind *a = s_workload(m, 0, 0, 0, jobs, eog, &st);
        if (a) {
            printf("without the split rule: %llu wrong writes, %llu wrong reads\n", (unsigned long long)a->wrong_write,
                   (unsigned long long)a->wrong_read);
            CHECK(a->wrong_write > 0 && a->wrong_read > 0,
                  "without kv_split_kernels the batcher breaks the rule, and the checker sees it");
            zl_engine *ea = &a->base;
            engine_destroy(&ea);
        }
    }
    /* an engine whose prefill is not chunk invariant (zl_engine.chunk_variant): the same workload, which preempts
     * above, runs without a preemption (admission reserves each sequence's whole run), every request finishes, and
     * the finished ones' tokens equal their runs alone */
    for (int ahead = 0; ahead < 2; ahead++) {
        wk_kv_stats st;
        memset(&st, 0, sizeof st);
        t_kind *a = s_workload(m, 1, 1, ahead, jobs, eog, &st);
        if (!a) break;
        int open = 0, done = 0;
        for (int i = 0; i < NREQ; i++) {
            open += !jobs[i].fin;
            done += jobs[i].fin == WK_FIN_LENGTH;
        }
        printf("chunk_variant, ahead %d: %llu preemptions, %d of %d requests ran to their length, %d never ended\n",
               ahead, (unsigned long long)st.preemptions, done, NREQ, open);
        CHECK(st.preemptions == 0 && open == 0 && done > 0,
              "ahead %d: chunk_variant: no preemption (%llu), every request ends (%d open)", ahead,
              (unsigned long long)st.preemptions, open);
        int checked = 0, diff = s_alone_diff(m, eog, jobs, alone, &checked);
        CHECK(checked > 0 && diff == 0, "ahead %d: chunk_variant: %d requests equal their runs alone (%d differ)",
              ahead, checked, diff);
        zl_engine *ea = &a->base;
        engine_destroy(&ea);
    }
out:
    free(jobs);
    free(alone);
    free(eog);
    model_destroy(&m);
    return test_report();
}
