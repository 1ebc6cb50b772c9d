/* zllm-bench: decode and prefill speed of a model on one GPU, as a fraction of the roofline measured in the same
 * run, or on the CPU engines (--device cpu or cpu-ref: tokens/s only).
 *   zllm-bench --model F.gguf [--device cuda[:N]|cpu|cpu-ref] [--ctx 1024] [--prefill P] [--max-m 256]
 *              [--min-m 1] [--steps 20] [--threads N] [--kv-block B] [--mix P] [--no-graphs] [--skip-caps] [--sync]
 * First it measures the GPU's device-to-device copy and read-only bandwidth and its BF16 matrix rate
 * (cuda/gpu_caps.cu). Then, for M = 1, 2, 4, ... up to --max-m (and the engine's max batch; rows below --min-m
 * are skipped, e.g. to profile one batch size), it times decode
 * steps of M sequences each at position --ctx (so each reads ctx tokens of KV), and one prefill of P tokens
 * (default min(ctx, 2048)). Roofline time of a step = max(bytes / read bandwidth, flops / BF16 rate):
 *   decode bytes = matrix weights as stored in the file (GGUF row bytes: what qgemv reads for quantized and
 *   16-bit matrices; the embedding gather is not counted) + M * ctx * layers * 2 * kv_dim * kv element size,
 *   decode flops = 2 * M * matrix parameters + 4 * M * ctx * n_heads * head_dim * layers,
 *   prefill bytes = the weights, flops = 2 * P * parameters + 2 * P^2 * n_heads * head_dim * layers (causal).
 * Decode steps run as a server runs them: each step is queued (engine_launch) behind the one in flight,
 * its tokens fed on the device from that step's samples (zl_seq.feed), before the host waits for the older
 * step, so the GPU does not wait for the host between steps; --sync times one engine_step at a time instead
 * (the host's round trip then lies between every two steps). The table prints tokens/s, ms per step (host
 * clock: from one step's results to the next one's, or around engine_step with --sync), the GPU's own time per
 * step (events around the step's device work) and the idle gap (host minus GPU: time the GPU waited for the
 * host), the roofline time and the ratio. The KV contents are whatever the
 * slots hold (zeros at start): the speed of attention does not depend on the values.
 * --kv-block B runs the engine with paged KV (blocks of B rows, as zllm-worker does by default on CUDA) instead of
 * contiguous slots: each sequence's block table is a slice of one permutation of the pool drawn from a fixed seed
 * (s_paged_tables), so the blocks lie scattered as a long-running server's free list leaves them.
 * --mix P adds a second table: steps of the same M decodes plus one prompt chunk of P tokens (positions 0 to
 * P - 1 of a slot of its own, not sampled), as a serving worker runs them while prompts arrive beside running
 * streams (zllm-worker --step-budget). Each row gives the mixed step's time, the decode-only step's of the first
 * table, and the difference per prompt token: what a prompt token costs a step it rides in.
 * On a CPU device there are no ceilings nor GPU times: the table gives tokens/s and ms per step (medians), each
 * step synchronous (the CPU engine runs a step as it is launched), --threads sets the engine's threads (0: all
 * cores), and the prefill row times one step of P prompt tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "version.h"
#ifdef ZLLM_HAVE_CUDA
#include "engine_cuda.h"
#include "gpu_caps.h"
#endif

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_usage(FILE *f) {
    fprintf(f, "usage: zllm-bench --model F.gguf [options]\n"
               "       zllm-bench --help | --version\n"
               "Decode and prefill speed of a model against the roofline measured in the same run (CUDA), or of the\n"
               "CPU engines.\n"
               "  --model F.gguf    the model (required)\n"
               "  --device DEV      cuda, cuda:N, cpu or cpu-ref (default cuda)\n"
               "  --ctx N           KV tokens each decode step reads, >= 1 (default 1024)\n"
               "  --prefill P       prompt tokens of the prefill row (default min(ctx, 2048))\n"
               "  --max-m M         largest batch timed, >= 1 (default 256)\n"
               "  --min-m M         smallest batch timed, >= 1 (default 1)\n"
               "  --steps N         decode steps timed per row, >= 1 (default 20)\n"
               "  --threads N       CPU engines: threads, 0: all cores (default 0)\n"
               "  --kv-block B      paged KV in blocks of B rows, tables scattered over the pool (default 0:\n"
               "                    contiguous slots; CUDA takes 16, 32, 64, 128 or 256)\n"
               "  --mix P           also time each M's decodes with a P-token prompt chunk in every step,\n"
               "                    0..1048576 (default 0: no such table)\n"
               "  --no-graphs       no CUDA graphs (default: graphs)\n"
               "  --skip-caps       do not measure the bandwidth and matrix rate (default: measure)\n"
               "  --sync            one engine_step at a time (default: steps queued ahead)\n"
               "  -h, --help        this text;  --version  print the version\n"
               "Environment: ZLLM_CUDA_* (docs/cuda.md): CUDA kernel paths off, for comparisons;\n"
               "ZLLM_CPU_ISA, ZLLM_CPU_EXACT (docs/perf.md): the CPU engine's kernel path.\n");
}

#define S_MIX_MAX (1 << 20) /* --mix's largest chunk: the engine's step then holds max_m + P rows */

static int s_cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --kv-block: *tab = n_seq block tables covering `rows` rows each (*nb entries, sequence i's at
 * *tab + i * *nb), the consecutive slices of one permutation of the pool [0, e->kv_blocks) (Fisher-Yates over the
 * sampler's generator from a fixed seed: the same tables every run); NULL when kv_block is 0 (contiguous slots).
 * Returns 0, or -1 after printing why (the engine granted another block size, the pool holds fewer blocks than
 * the tables need, memory is short) */
static int s_paged_tables(const zl_engine *e, int kv_block, int n_seq, int rows, int32_t **tab, int *nb) {
    *tab = NULL;
    *nb = 0;
    if (kv_block == 0) return 0;
    if (e->kv_block != kv_block) {
        fprintf(stderr, "zllm-bench: the engine gave blocks of %d rows for --kv-block %d\n", e->kv_block, kv_block);
        return -1;
    }
    *nb = (rows + e->kv_block - 1) / e->kv_block;
    if ((long)n_seq * *nb > e->kv_blocks) {
        fprintf(stderr, "zllm-bench: the pool of %d blocks of %d rows holds fewer than %d sequences x %d blocks\n",
                e->kv_blocks, e->kv_block, n_seq, *nb);
        return -1;
    }
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)e->kv_blocks);
    if (!perm) {
        fprintf(stderr, "zllm-bench: out of memory\n");
        return -1;
    }
    for (int i = 0; i < e->kv_blocks; i++) perm[i] = i;
    uint64_t rng = sampler_rng_init(7);
    for (int i = e->kv_blocks - 1; i > 0; i--) { /* u < 1, so j <= i */
        const int j = (int)((double)sampler_rng_uniform(&rng) * (i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    *tab = perm;
    return 0;
}

/* the prefill row's entry: slot 0 from position 0, `prefill` tokens (written into ptoks), sampling its last row,
 * through tab (sequence 0's block table, or NULL for contiguous slots) */
static zl_seq s_prefill_entry(int32_t *ptoks, int prefill, int vocab, const int32_t *tab) {
    for (int i = 0; i < prefill; i++) ptoks[i] = (int32_t)(1 + (i * 104729) % (vocab - 1));
    zl_seq p;
    memset(&p, 0, sizeof p);
    p.n_tokens = prefill;
    p.tokens = ptoks;
    p.sample = 1;
    p.blocks = tab;
    return p;
}

/* q[0 .. M): M decode entries in slots 0 .. M - 1 at position ctx (sequence i's block table at tab + i * nb) */
static void s_decode_entries(zl_seq *q, int M, int ctx, const int32_t *toks, const int32_t *tab, int nb) {
    for (int i = 0; i < M; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].slot = i;
        q[i].pos = ctx;
        q[i].n_tokens = 1;
        q[i].tokens = &toks[i];
        q[i].sample = 1;
        q[i].blocks = tab ? tab + (size_t)i * nb : NULL;
    }
}

/* the CPU engines: decode tokens/s for M = 1, 2, 4 ... max_m sequences at position ctx (each step synchronous),
 * with mix > 0 the same steps with a mix-token prompt chunk beside the decodes, then one prefill step of `prefill`
 * tokens; medians of `steps` (decode) and 5 (prefill) timed steps */
static int s_bench_cpu(const char *path, const char *device, int threads, int ctx, int prefill, int max_m, int min_m,
                       int steps, int kv_block, int mix) {
    char err[512];
    zl_model *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "zllm-bench: %s\n", err);
        return 1;
    }
    const zl_config *c = &m->cfg;
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = device;
    o.max_batch = max_m + (mix > 0); /* --mix: the prompt chunk's entry beside max_m decodes */
    o.n_slots = o.max_batch;
    o.n_ctx = ctx + steps + 16 > prefill ? ctx + steps + 16 : prefill;
    if (o.n_ctx < mix) o.n_ctx = mix;
    o.max_step_tokens = prefill > max_m + mix ? prefill : max_m + mix;
    o.threads = threads;
    o.kv_block = kv_block;
    double t0 = s_now();
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "zllm-bench: %s\n", err);
        model_destroy(&m);
        return 1;
    }
    int32_t *tab = NULL; /* --kv-block: the sequences' block tables, nb entries each */
    int nb = 0;
    printf("model: %s: %d layers, dim %d, heads %d/%d x %d, ffn %d, vocab %d, %s; engine %s, %d threads "
           "(0: all cores), start %.2f s\n",
           path, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size,
           ggml_type_name(m->layers[0].wq.type), e->device, threads, s_now() - t0);
    int rc = 0, np = prefill > mix ? prefill : mix > 0 ? mix : 1;
    const int top = e->max_batch - (mix > 0); /* the largest decode batch */
    double dec_ms[32] = {0};                  /* [lg M]: the decode step's median ms */
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)e->max_batch),
            *out = malloc(sizeof(int32_t) * (size_t)e->max_batch);
    int32_t *ptoks = malloc(sizeof(int32_t) * (size_t)np);
    zl_seq *q = calloc((size_t)e->max_batch, sizeof *q);
    double *times = malloc(sizeof(double) * (size_t)(steps > 5 ? steps : 5));
    if (!toks || !out || !ptoks || !q || !times) {
        fprintf(stderr, "zllm-bench: out of memory\n");
        rc = 1;
        goto done;
    }
    if (top < 1) {
        fprintf(stderr, "zllm-bench: the engine's max batch of %d leaves no decode row beside --mix\n", e->max_batch);
        rc = 1;
        goto done;
    }
    if (s_paged_tables(e, kv_block, e->max_batch, ctx + 1 > np ? ctx + 1 : np, &tab, &nb) != 0) {
        rc = 1;
        goto done;
    }
    if (tab)
        printf("KV: paged, blocks of %d rows, tables scattered over a pool of %d blocks\n", e->kv_block, e->kv_blocks);
    printf("decode at context %d, %d timed steps each (medians)\n%6s %12s %10s\n", ctx, steps, "M", "tokens/s",
           "ms/step");
    for (int i = 0; i < e->max_batch; i++) toks[i] = (int32_t)(1 + (i * 7919) % (c->vocab_size - 1));
    /* pass 0 the decode steps, pass 1 the same with the prompt chunk (slot top) as entry M */
    zl_seq chunk = s_prefill_entry(ptoks, mix > 0 ? mix : 1, c->vocab_size, tab ? tab + (size_t)top * nb : NULL);
    chunk.slot = top;
    chunk.sample = 0;
    chunk.prompt = 1;
    for (int pass = 0; pass < (mix > 0 ? 2 : 1); pass++) {
        if (pass == 1)
            printf("\ndecode at context %d with a %d-token prompt chunk (positions 0 to %d) in every step\n"
                   "%6s %12s %10s %10s %14s\n",
                   ctx, mix, mix - 1, "M", "tokens/s", "ms/step", "decode ms", "us/prompt tok");
        for (int M = 1, lg = 0; M <= top; M = M * 2 > top && M < top ? top : M * 2, lg++) {
            if (M >= min_m || M == top) {
                s_decode_entries(q, M, ctx, toks, tab, nb);
                if (pass == 1) q[M] = chunk;
                for (int s = -2; s < steps; s++) {
                    const double a = s_now();
                    if (engine_step(e, q, M + pass, out, NULL) != 0) {
                        fprintf(stderr, "zllm-bench: %s\n", e->err);
                        rc = 1;
                        goto done;
                    }
                    if (s >= 0) times[s] = s_now() - a;
                }
                qsort(times, (size_t)steps, sizeof *times, s_cmp_d);
                const double t = times[steps / 2] * 1e3;
                if (pass == 0) {
                    dec_ms[lg] = t;
                    printf("%6d %12.1f %10.3f\n", M, M / (t * 1e-3), t);
                } else {
                    printf("%6d %12.1f %10.3f %10.3f %14.2f\n", M, M / (t * 1e-3), t, dec_ms[lg],
                           (t - dec_ms[lg]) * 1e3 / mix);
                }
                fflush(stdout);
            }
            if (M == top) break;
        }
    }
    if (prefill > 0) {
        zl_seq p = s_prefill_entry(ptoks, prefill, c->vocab_size, tab);
        for (int s = -1; s < 5; s++) {
            const double a = s_now();
            if (engine_step(e, &p, 1, out, NULL) != 0) {
                fprintf(stderr, "zllm-bench: %s\n", e->err);
                rc = 1;
                goto done;
            }
            if (s >= 0) times[s] = s_now() - a;
        }
        qsort(times, 5, sizeof *times, s_cmp_d);
        printf("\nprefill of %d tokens: %.1f ms, %.0f tokens/s (median of 5)\n", prefill, times[2] * 1e3,
               prefill / times[2]);
    }
done:
    free(toks);
    free(out);
    free(ptoks);
    free(q);
    free(times);
    free(tab);
    engine_destroy(&e);
    model_destroy(&m);
    return rc;
}

#ifdef ZLLM_HAVE_CUDA
/* times `steps` steps of the n entries q (its first n_dec decode entries, the rest as given) after three untimed
 * ones: r[0] the median ms a step on the host clock, r[1] the GPU's own, r[2] the idle gap. pipe: each step queued
 * behind the one in flight, the decode entries fed on the device (as a serving worker runs them); else one
 * engine_step at a time. out holds 2 x max_batch ids; times, gpu, gap `steps` doubles each (scratch). Returns 0,
 * or -1 after printing the engine's error */
static int s_time_steps(zl_engine *e, zl_seq *q, int n, int n_dec, int steps, int pipe, int32_t *out, double *times,
                        double *gpu, double *gap, double r[3]) {
    for (int w = 0; w < 3; w++)
        if (engine_step(e, q, n, out, NULL) != 0) goto fail;
    if (pipe) {
        /* one step in flight, then each turn queues the next (fed from the one before) and waits for the older: a
         * turn lasts one step of the GPU's steady state. Two untimed turns first. The positions stay put (the same
         * KV length every step); only the decode tokens come from the device. */
        for (int i = 0; i < n_dec; i++) q[i].feed = 1;
        zl_step st[2]; /* the same entries each turn; st[k & 1] is turn k's step */
        for (int k = 0; k < 2; k++) {
            memset(&st[k], 0, sizeof st[k]);
            st[k].seqs = q;
            st[k].n = n;
            st[k].out_tokens = out + (size_t)k * e->max_batch;
        }
        if (engine_launch(e, &st[0]) != 0) goto fail;
        for (int s = -2; s < steps; s++) {
            const double a = s_now();
            const int k = (s + 3) & 1; /* turn s launches st[k] and waits for the other */
            if (engine_launch(e, &st[k]) != 0 || engine_wait(e, &st[k ^ 1]) != 0) goto fail;
            if (s < 0) continue;
            times[s] = s_now() - a;
            gpu[s] = engine_cuda_last_step_gpu_ms(e) * 1e-3;
            gap[s] = times[s] - gpu[s];
        }
        if (engine_wait(e, &st[(steps + 2) & 1]) != 0) goto fail;
        for (int i = 0; i < n_dec; i++) q[i].feed = 0;
    } else {
        for (int s = 0; s < steps; s++) {
            const double a = s_now();
            if (engine_step(e, q, n, out, NULL) != 0) goto fail;
            times[s] = s_now() - a;
            gpu[s] = engine_cuda_last_step_gpu_ms(e) * 1e-3;
            gap[s] = times[s] - gpu[s];
        }
    }
    qsort(times, (size_t)steps, sizeof *times, s_cmp_d);
    qsort(gpu, (size_t)steps, sizeof *gpu, s_cmp_d);
    qsort(gap, (size_t)steps, sizeof *gap, s_cmp_d);
    r[0] = times[steps / 2] * 1e3;
    r[1] = gpu[steps / 2] * 1e3;
    r[2] = gap[steps / 2] * 1e3;
    return 0;
fail:
    fprintf(stderr, "zllm-bench: %s\n", e->err);
    return -1;
}
#endif

int main(int argc, char **argv) {
    const char *path = NULL, *device = "cuda";
    int ctx = 1024, prefill = -1, max_m = 256, min_m = 1, steps = 20, no_graphs = 0, skip_caps = 0, sync = 0;
    int threads = 0, kv_block = 0, mix = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "--model") && has) path = argv[++i];
        else if (!strcmp(a, "--device") && has) device = argv[++i];
        else if (!strcmp(a, "--ctx") && has) ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--prefill") && has) prefill = atoi(argv[++i]);
        else if (!strcmp(a, "--max-m") && has) max_m = atoi(argv[++i]);
        else if (!strcmp(a, "--min-m") && has) min_m = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && has) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--kv-block") && has) kv_block = atoi(argv[++i]);
        else if (!strcmp(a, "--mix") && has) mix = atoi(argv[++i]);
        else if (!strcmp(a, "--no-graphs")) no_graphs = 1;
        else if (!strcmp(a, "--skip-caps")) skip_caps = 1;
        else if (!strcmp(a, "--sync")) sync = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("zllm-bench %s\n", ZLLM_VERSION);
            return 0;
        } else {
            s_usage(stderr);
            return 2;
        }
    }
    if (!path || ctx < 1 || max_m < 1 || min_m < 1 || steps < 1 || threads < 0 || kv_block < 0 || mix < 0 ||
        mix > S_MIX_MAX) {
        s_usage(stderr);
        return 2;
    }
    if (prefill < 0) prefill = ctx < 2048 ? ctx : 2048;
    if (!strncmp(device, "cpu", 3))
        return s_bench_cpu(path, device, threads, ctx, prefill, max_m, min_m, steps, kv_block, mix);
#ifndef ZLLM_HAVE_CUDA
    (void)no_graphs;
    (void)skip_caps;
    (void)sync;
    fprintf(stderr, "zllm-bench: this zllm was built without CUDA (--device cpu runs the CPU engine)\n");
    return 1;
#else
    char err[512];
    int dev = 0;
    if (!strncmp(device, "cuda:", 5)) dev = atoi(device + 5);
    gpu_caps caps;
    memset(&caps, 0, sizeof caps);
    if (!skip_caps) {
        if (gpu_caps_measure(dev, &caps, err, sizeof err) != 0) { fprintf(stderr, "zllm-bench: %s\n", err); return 1; }
        printf("device: %s, %d SMs\n", caps.name, caps.sm_count);
        printf("measured: copy %.0f GB/s (read+write), read-only %.0f GB/s, BF16 GEMM %.0f TFLOP/s\n", caps.copy_gbs,
               caps.read_gbs, caps.bf16_tflops);
    } else {
        caps.read_gbs = 3000; caps.bf16_tflops = 700;
        printf("ceilings not measured (--skip-caps): assuming read 3000 GB/s, BF16 700 TFLOP/s\n");
    }
    zl_model *m = model_load(path, err, sizeof err);
    if (!m) { fprintf(stderr, "zllm-bench: %s\n", err); return 1; }
    const zl_config *c = &m->cfg;
    zl_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = device;
    o.max_batch = max_m + (mix > 0); /* --mix: the prompt chunk's entry beside max_m decodes */
    o.n_slots = o.max_batch;
    o.n_ctx = ctx + 16 > prefill ? ctx + 16 : prefill;
    if (o.n_ctx < mix) o.n_ctx = mix;
    o.max_step_tokens = prefill > max_m + mix ? prefill : max_m + mix;
    o.no_graphs = no_graphs;
    o.kv_block = kv_block;
    double t0 = s_now();
    zl_engine *e = engine_new(m, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "zllm-bench: %s\n", err); model_destroy(&m); return 1; }
    int32_t *tab = NULL; /* --kv-block: the sequences' block tables, nb entries each */
    int nb = 0;
    printf("model: %s: %d layers, dim %d, heads %d/%d x %d, ffn %d, vocab %d; engine start %.1f s, max batch %d\n",
           path, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size,
           s_now() - t0, e->max_batch);
    const double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    const double params = c->n_layers * (c->dim * (qd + 2 * kvd) + qd * c->dim + 3.0 * c->dim * c->ffn_dim) +
                          (double)c->vocab_size * c->dim;
    const double es = m->layers[0].wq.type == 0 /* GGML_F32 */ ? 4 : 2;   /* the KV cache's element size */
    double wbytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const zl_layer_weights *lw = &m->layers[l];
        const zl_weight *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++) wbytes += (double)mats[i]->row_bytes * (double)mats[i]->n_out;
    }
    {
        const zl_weight *head = m->output.data ? &m->output : &m->tok_embd;
        wbytes += (double)head->row_bytes * (double)head->n_out;
    }
    const double bw = caps.read_gbs * 1e9, fl = caps.bf16_tflops * 1e12;
    printf("matrix parameters %.3g (%.2f GB of matrix rows read per step; q/ffn_down/head types %s/%s/%s)\n\n",
           params, wbytes / 1e9, ggml_type_name(m->layers[0].wq.type), ggml_type_name(m->layers[0].w_down.type),
           ggml_type_name(m->output.data ? m->output.type : m->tok_embd.type));
    const int pipe = !sync && engine_depth(e) >= 2;
    if (e->kv_block > 0)
        printf("KV: paged, blocks of %d rows, tables scattered over a pool of %d blocks\n", e->kv_block, e->kv_blocks);
    printf("decode at context %d, %d timed steps each%s, %s\n", ctx, steps, no_graphs ? " (no graphs)" : " (CUDA graphs)",
           pipe ? "each queued behind the one in flight (tokens fed on the device)" : "one synchronous step at a time");
    printf("%6s %12s %10s %10s %10s %12s %10s %8s\n", "M", "tokens/s", "ms/step", "gpu ms", "idle ms", "roofline ms",
           "bound", "ratio");
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)e->max_batch);
    int32_t *out = malloc(sizeof(int32_t) * 2 * (size_t)e->max_batch); /* [2][max_batch]: two steps in flight */
    zl_seq *q = calloc((size_t)e->max_batch, sizeof *q);
    const int np = prefill > mix ? prefill : mix;
    int32_t *ptoks = malloc(sizeof(int32_t) * (size_t)(np > 0 ? np : 1));
    double *times = malloc(sizeof(double) * (size_t)steps), *gpu = malloc(sizeof(double) * (size_t)steps);
    double *gap = malloc(sizeof(double) * (size_t)steps);
    /* the largest decode batch: the engine's max batch less the --mix entry; dec_ms[lg M]: its decode step */
    const int top = e->max_batch - (mix > 0);
    double dec_ms[32] = {0};
    int rc = 0;
    if (!toks || !out || !q || !ptoks || !times || !gpu || !gap) { fprintf(stderr, "zllm-bench: out of memory\n"); rc = 1; goto done; }
    if (top < 1) {
        fprintf(stderr, "zllm-bench: the engine's max batch of %d leaves no decode row beside --mix\n", e->max_batch);
        rc = 1;
        goto done;
    }
    if (s_paged_tables(e, kv_block, e->max_batch, ctx + 1 > np ? ctx + 1 : np, &tab, &nb) != 0) {
        rc = 1;
        goto done;
    }
    for (int i = 0; i < e->max_batch; i++) toks[i] = (int32_t)(1 + (i * 7919) % (c->vocab_size - 1));
    for (int M = 1, lg = 0; M <= top; M = M * 2 > top && M < top ? top : M * 2, lg++) {
        if (M < min_m && M < top) continue;
        s_decode_entries(q, M, ctx, toks, tab, nb);
        double r[3];
        if (s_time_steps(e, q, M, M, steps, pipe, out, times, gpu, gap, r) != 0) {
            rc = 1;
            goto done;
        }
        dec_ms[lg] = r[0];
        const double t = r[0] * 1e-3;
        const double bytes = wbytes + (double)M * ctx * c->n_layers * 2 * kvd * es;
        const double flops = 2.0 * M * params + 4.0 * M * ctx * qd * c->n_layers;
        const double tb = bytes / bw, tf = flops / fl, roof = tb > tf ? tb : tf;
        printf("%6d %12.1f %10.3f %10.3f %10.3f %12.3f %10s %7.1f%%\n", M, M / t, r[0], r[1], r[2], roof * 1e3,
               tb > tf ? "memory" : "compute", 100.0 * roof / t);
        fflush(stdout);
        if (M == top) break;
    }
    if (mix > 0) {
        printf("\ndecode at context %d with a %d-token prompt chunk (positions 0 to %d) in every step, %s\n", ctx, mix,
               mix - 1, no_graphs ? "no graphs" : "no graphs for such steps");
        printf("%6s %12s %10s %10s %10s %12s %14s\n", "M", "tokens/s", "ms/step", "gpu ms", "idle ms", "decode ms",
               "us/prompt tok");
        zl_seq p = s_prefill_entry(ptoks, mix, c->vocab_size, tab ? tab + (size_t)top * nb : NULL);
        p.slot = top;
        p.sample = 0;
        p.prompt = 1;
        for (int M = 1, lg = 0; M <= top; M = M * 2 > top && M < top ? top : M * 2, lg++) {
            if (M < min_m && M < top) continue;
            s_decode_entries(q, M, ctx, toks, tab, nb);
            q[M] = p;
            double r[3];
            if (s_time_steps(e, q, M + 1, M, steps, pipe, out, times, gpu, gap, r) != 0) {
                rc = 1;
                goto done;
            }
            printf("%6d %12.1f %10.3f %10.3f %10.3f %12.3f %14.2f\n", M, M / (r[0] * 1e-3), r[0], r[1], r[2],
                   dec_ms[lg], (r[0] - dec_ms[lg]) * 1e3 / mix);
            fflush(stdout);
            if (M == top) break;
        }
    }
    if (prefill > 0) {
        zl_seq p = s_prefill_entry(ptoks, prefill, c->vocab_size, tab);
        const int reps = 5;
        for (int s = -1; s < reps; s++) {
            const double a = s_now();
            if (engine_step(e, &p, 1, out, NULL) != 0) { fprintf(stderr, "zllm-bench: %s\n", e->err); rc = 1; goto done; }
            if (s >= 0) times[s < steps ? s : 0] = s_now() - a;
        }
        const int nr = reps < steps ? reps : steps;
        qsort(times, (size_t)nr, sizeof *times, s_cmp_d);
        const double t = times[nr / 2];
        const double flops = 2.0 * prefill * params + 2.0 * prefill * (double)prefill * qd * c->n_layers;
        const double tb = wbytes / bw, tf = flops / fl, roof = tb > tf ? tb : tf;
        printf("\nprefill of %d tokens: %.1f ms, %.0f tokens/s, %.1f TFLOP/s; roofline %.2f ms (%s): %.1f%%\n", prefill,
               t * 1e3, prefill / t, flops / t / 1e12, roof * 1e3, tb > tf ? "memory" : "compute", 100.0 * roof / t);
    }
done:
    free(toks);
    free(out);
    free(q);
    free(ptoks);
    free(times);
    free(gpu);
    free(gap);
    free(tab);
    engine_destroy(&e);
    model_destroy(&m);
    return rc;
#endif
}
