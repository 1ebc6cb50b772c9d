/* cuda/test_sample.cu: the GPU sampler against engine/sampler.c on fresh random logits (seed printed; set
 * ZLLM_TEST_SEED to repeat a run).
 *  - greedy: the id equals sampler_sample()'s exactly, with planted ties, NaN and -inf, with and without the
 *    repetition penalty, vocab sizes 1..151936;
 *  - top-k / top-p / min-p / temperature / penalty: thousands of draws never leave the CPU's candidate set
 *    (computed the way engine/sampler.c does, with the cut thresholds relaxed by 1e-4 for rounding), and the
 *    empirical frequencies are close to the CPU's probabilities (total variation);
 *  - determinism: the same seeds give the same ids, each non-greedy draw advances the state exactly as one
 *    sampler_rng_uniform() call, greedy rows leave it alone; a captured CUDA graph replays the same way. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>
#include "sample.h"
#include "sampler.h"
#include "test.h"
#include "test_util.cuh"

static float rnd_f(void) { return rnd_unit(); } /* [0,1) */

template <typename X> struct dev_arr {
    X *p = nullptr;
    size_t n;
    explicit dev_arr(size_t n_) : n(n_) { CUDA_OK(cudaMalloc(&p, (n ? n : 1) * sizeof(X))); }
    ~dev_arr() { cudaFree(p); }
    void put(const X *h) { CUDA_OK(cudaMemcpy(p, h, n * sizeof(X), cudaMemcpyHostToDevice)); }
    void get(X *h) const { CUDA_OK(cudaMemcpy(h, p, n * sizeof(X), cudaMemcpyDeviceToHost)); }
};

/* the CPU penalty rule (llama.cpp's: each distinct id among the last n once), as engine/sampler.c */
static void penalize(float *l, int vocab, const int32_t *hist, int n_hist, const zl_sampling &s) {
    if (s.repeat_penalty == 1.0f || s.repeat_last_n <= 0 || n_hist <= 0 || !(s.repeat_penalty > 0.0f)) return;
    const int n = std::min(n_hist, s.repeat_last_n);
    const int32_t *h = hist + (n_hist - n);
    std::vector<char> seen(vocab, 0);
    for (int i = 0; i < n; i++) {
        const int id = h[i];
        if (id < 0 || id >= vocab || seen[id]) continue;
        seen[id] = 1;
        l[id] = l[id] > 0.0f ? l[id] / s.repeat_penalty : l[id] * s.repeat_penalty;
    }
}

/* candidate probabilities after top-k, temperature, min-p and top-p as engine/sampler.c computes them
 * (prob[i] = 0 outside the set); min_p_scale/top_p_add loosen the cuts for a rounding margin */
static void cpu_probs(const float *l, int vocab, const zl_sampling &s, double min_p_scale, double top_p_add,
                      std::vector<double> *prob) {
    struct cand { float l; int id; };
    std::vector<cand> c;
    for (int i = 0; i < vocab; i++)
        if (!std::isnan(l[i]) && l[i] != -INFINITY) c.push_back({l[i], i});
    std::sort(c.begin(), c.end(),
              [](const cand &a, const cand &b) { return a.l > b.l || (a.l == b.l && a.id < b.id); });
    size_t n = c.size();
    if (s.top_k > 0 && (size_t)s.top_k < n) n = s.top_k;
    std::vector<double> p(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        p[i] = exp(((double)c[i].l - (double)c[0].l) / (double)s.temperature);
        sum += p[i];
    }
    for (size_t i = 0; i < n; i++) p[i] /= sum;
    if (s.min_p > 0.0f) {
        const double thr = s.min_p * min_p_scale * p[0];
        size_t k = 1;
        while (k < n && p[k] >= thr) k++;
        n = k;
    }
    if (s.top_p < 1.0f) {
        double tot = 0.0, acc = 0.0;
        for (size_t i = 0; i < n; i++) tot += p[i];
        size_t k = 0;
        while (k < n) {
            acc += p[k++];
            if (acc >= ((double)s.top_p + top_p_add) * tot) break;
        }
        n = k;
    }
    prob->assign(vocab, 0.0);
    double tot = 0.0;
    for (size_t i = 0; i < n; i++) tot += p[i];
    for (size_t i = 0; i < n; i++) (*prob)[c[i].id] = p[i] / tot;
}

struct sampler_run {
    int M, vocab;
    std::vector<float> logits;            /* [M][vocab] */
    std::vector<zl_sampling> params;      /* [M] */
    std::vector<int32_t> hist;            /* [M][hstride] */
    std::vector<int32_t> hlen;            /* [M] */
    int hstride;
    std::vector<uint64_t> rng;            /* [M] */
    std::vector<int32_t> out;             /* [M] */
};

/* runs the GPU sampler once on r (rng advanced in place); graph: capture and replay instead */
static cudaError_t gpu_sample(sampler_run *r, int with_history, int graph) {
    dev_arr<float> dl(r->logits.size());
    dev_arr<zl_sampling> dp(r->M);
    dev_arr<int32_t> dh(r->hist.size()), dhl(r->M), dout(r->M);
    dev_arr<uint64_t> drng(r->M);
    dl.put(r->logits.data());
    dp.put(r->params.data());
    if (with_history) {
        dh.put(r->hist.data());
        dhl.put(r->hlen.data());
    }
    drng.put(r->rng.data());
    CUDA_OK(cudaMemset(dout.p, 0xff, r->M * sizeof(int32_t)));
    const size_t wsb = sample_workspace_bytes(r->M, r->vocab);
    void *ws = nullptr;
    CUDA_OK(cudaMalloc(&ws, wsb));
    sample_params p;
    memset(&p, 0, sizeof p);
    p.logits = dl.p;
    p.n_rows = r->M;
    p.vocab = r->vocab;
    p.params = dp.p;
    if (with_history) {
        p.history = dh.p;
        p.history_stride = r->hstride;
        p.history_len = dhl.p;
    }
    p.rng_state = drng.p;
    p.out = dout.p;
    p.workspace = ws;
    p.workspace_bytes = wsb;
    cudaError_t e;
    if (graph) {
        cudaStream_t st;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        e = sample_launch(&p, st);
        CUDA_OK(cudaStreamEndCapture(st, &g));
        CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        CUDA_OK(cudaGraphLaunch(ge, st));
        CUDA_OK(cudaStreamSynchronize(st));
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(st);
    } else {
        e = sample_launch(&p, 0);
    }
    CUDA_OK(cudaDeviceSynchronize());
    r->out.resize(r->M);
    dout.get(r->out.data());
    drng.get(r->rng.data());
    cudaFree(ws);
    return e;
}

static void fill_row(float *l, int vocab, int kind) {
    for (int i = 0; i < vocab; i++) l[i] = (rnd_f() * 2.f - 1.f) * 8.f;
    if (kind == 1 && vocab > 4) {   /* planted ties at the maximum, lowest planted id must win */
        float mx = -INFINITY;
        for (int i = 0; i < vocab; i++) mx = std::max(mx, l[i]);
        for (int t = 0; t < 3; t++) l[rnd_i(vocab)] = mx + 1.0f;
    }
    if (kind == 2 && vocab > 4) {   /* NaN and -inf sprinkled, NaN at id 0 sometimes */
        for (int t = 0; t < vocab / 10 + 1; t++) l[rnd_i(vocab)] = NAN;
        for (int t = 0; t < vocab / 10 + 1; t++) l[rnd_i(vocab)] = -INFINITY;
        if (rnd_i(2)) l[0] = NAN;
    }
    if (kind == 3) for (int i = 0; i < vocab; i++) l[i] = -INFINITY;
}

static void test_greedy(void) {
    const int vocabs[] = {1, 2, 7, 512, 32000, 151936};
    const int Ms[] = {1, 13, 64};
    for (int vocab : vocabs) {
        for (int M : Ms) {
            if ((size_t)M * vocab > 4000000) continue;
            for (int with_hist = 0; with_hist < 2; with_hist++) {
                sampler_run r;
                r.M = M;
                r.vocab = vocab;
                r.logits.resize((size_t)M * vocab);
                r.hstride = 300;
                r.hist.resize((size_t)M * r.hstride);
                r.hlen.resize(M);
                r.params.resize(M);
                r.rng.resize(M);
                for (int i = 0; i < M; i++) {
                    fill_row(&r.logits[(size_t)i * vocab], vocab, rnd_i(4));
                    zl_sampling s = sampler_defaults();
                    s.temperature = rnd_i(3) == 0 ? -1.0f : 0.0f;
                    s.repeat_penalty = with_hist ? 1.0f + rnd_f() : 1.0f;
                    s.repeat_last_n = 1 + rnd_i(300);
                    r.params[i] = s;
                    r.hlen[i] = rnd_i(r.hstride + 1);
                    for (int j = 0; j < r.hstride; j++) r.hist[(size_t)i * r.hstride + j] = rnd_i(vocab + 2) - 1;
                    r.rng[i] = sampler_rng_init(rnd_u64());
                }
                std::vector<uint64_t> rng0 = r.rng;
                sampler_run g = r;
                cudaError_t e = gpu_sample(&g, with_hist, 0);
                CHECK(e == cudaSuccess, "greedy launch: %s", cudaGetErrorString(e));
                int bad = 0, rng_moved = 0;
                for (int i = 0; i < M; i++) {
                    std::vector<float> l(r.logits.begin() + (size_t)i * vocab,
                                         r.logits.begin() + (size_t)(i + 1) * vocab);
                    uint64_t st = rng0[i];
                    const int32_t *hi = with_hist ? &r.hist[(size_t)i * r.hstride] : NULL;
                    const int want = sampler_sample(l.data(), vocab, &r.params[i], hi, with_hist ? r.hlen[i] : 0, &st);
                    if (g.out[i] != want && bad++ < 5)
                        fprintf(stderr, "greedy row %d vocab %d: gpu %d cpu %d\n", i, vocab, g.out[i], want);
                    rng_moved += g.rng[i] != rng0[i];
                }
                CHECK(bad == 0, "greedy: %d of %d rows differ from the CPU (vocab %d, history %d)", bad, M, vocab,
                      with_hist);
                CHECK(rng_moved == 0, "greedy rows must not advance the generator");
            }
        }
    }
    printf("greedy: done\n");
}

/* many draws with one parameter set: all inside the CPU set, frequencies close to the CPU's probabilities */
static void test_draws(int vocab, zl_sampling s, int with_hist, const char *name) {
    const int M = vocab > 50000 ? 64 : 256, reps = vocab > 50000 ? 4 : 24;
    sampler_run r;
    r.M = M;
    r.vocab = vocab;
    r.logits.resize((size_t)M * vocab);
    std::vector<float> base(vocab);
    for (int i = 0; i < vocab; i++) base[i] = (rnd_f() * 2.f - 1.f) * 4.f;
    for (int i = 0; i < M; i++) memcpy(&r.logits[(size_t)i * vocab], base.data(), vocab * sizeof(float));
    r.hstride = 64;
    r.hist.resize((size_t)M * r.hstride);
    r.hlen.assign(M, with_hist ? r.hstride : 0);
    std::vector<int32_t> h(r.hstride);
    for (int j = 0; j < r.hstride; j++) h[j] = rnd_i(std::min(vocab, 40));   /* likely candidates, with repeats */
    for (int i = 0; i < M; i++) memcpy(&r.hist[(size_t)i * r.hstride], h.data(), h.size() * sizeof(int32_t));
    r.params.assign(M, s);
    r.rng.resize(M);
    for (int i = 0; i < M; i++) r.rng[i] = sampler_rng_init(rnd_u64());

    std::vector<float> pen = base;
    if (with_hist) penalize(pen.data(), vocab, h.data(), (int)h.size(), s);
    std::vector<double> prob, loose;
    cpu_probs(pen.data(), vocab, s, 1.0, 0.0, &prob);
    cpu_probs(pen.data(), vocab, s, 1.0 - 1e-4, 1e-4, &loose);
    std::vector<double> freq(vocab, 0.0);
    int outside = 0, total = 0, agree = 0;
    std::vector<uint64_t> start = r.rng;
    std::vector<int32_t> first_ids;
    for (int rep = 0; rep < reps; rep++) {
        std::vector<uint64_t> before = r.rng;
        cudaError_t e = gpu_sample(&r, with_hist, rep == 1);
        CHECK(e == cudaSuccess, "%s: launch %s", name, cudaGetErrorString(e));
        if (rep == 0) first_ids = r.out;
        for (int i = 0; i < M; i++) {
            const int id = r.out[i];
            total++;
            if (id < 0 || id >= vocab || loose[id] == 0.0) {
                if (outside++ < 5) fprintf(stderr, "%s: drew %d outside the candidate set\n", name, id);
                continue;
            }
            freq[id] += 1.0;
            /* the state moved by exactly one draw */
            uint64_t st = before[i];
            sampler_rng_uniform(&st);
            if (st != r.rng[i]) outside++;
            /* the CPU sampler with the same state, for the agreement rate (not required) */
            if (vocab > 40000 || rep > 3) continue;
            std::vector<float> l = base;
            uint64_t st2 = before[i];
            agree += sampler_sample(l.data(), vocab, &s, with_hist ? h.data() : NULL, with_hist ? (int)h.size() : 0,
                                    &st2) == id;
        }
    }
    double tv = 0.0;
    for (int i = 0; i < vocab; i++) tv += fabs(freq[i] / total - prob[i]);
    tv *= 0.5;
    int kept = 0;
    for (int i = 0; i < vocab; i++) kept += prob[i] > 0.0;
    /* expected TV of an exact sampler is about 0.4 * sqrt(kept / draws); allow a wide margin */
    const double tv_max = 0.02 + 1.5 * sqrt((double)kept / total);
    printf("draws %-28s vocab=%-6d kept=%-5d draws=%d tv=%.4f (max %.4f) same-as-cpu=%d\n", name, vocab, kept, total,
           tv, tv_max, agree);
    CHECK(outside == 0, "%s: %d draws outside the candidate set or with a wrong generator step", name, outside);
    CHECK(tv <= tv_max, "%s: total variation %.4f > %.4f", name, tv, tv_max);
    /* determinism: the same starting states give the same ids */
    r.rng = start;
    gpu_sample(&r, with_hist, 0);
    CHECK(r.out == first_ids, "%s: the same seeds must give the same ids", name);
}

int main(void) {
    if (test_cuda_start() != 0) return test_report();
    sample_params bad;
    memset(&bad, 0, sizeof bad);
    CHECK(sample_launch(&bad, 0) == cudaErrorInvalidValue, "empty parameters must be rejected");
    test_greedy();
    zl_sampling s = sampler_defaults();
    s.temperature = 1.0f;
    test_draws(64, s, 0, "temp 1");
    s.temperature = 0.7f;
    s.top_k = 10;
    test_draws(1000, s, 0, "top-k 10, temp 0.7");
    s.top_k = 0;
    s.top_p = 0.8f;
    test_draws(200, s, 0, "top-p 0.8");
    s.top_p = 1.0f;
    s.min_p = 0.2f;
    test_draws(300, s, 0, "min-p 0.2");
    s.temperature = 1.3f;
    s.top_k = 40;
    s.top_p = 0.9f;
    s.min_p = 0.05f;
    test_draws(32000, s, 0, "top-k 40, top-p 0.9, min-p 0.05");
    s.repeat_penalty = 1.5f;
    s.repeat_last_n = 64;
    test_draws(500, s, 1, "same + penalty 1.5");
    s = sampler_defaults();
    s.temperature = 0.8f;
    s.top_p = 0.95f;
    test_draws(151936, s, 0, "top-p 0.95, vocab 151936");
    s.top_k = 1;
    s.top_p = 1.0f;
    test_draws(5000, s, 0, "top-k 1");
    s.top_k = 0;
    s.top_p = 0.0f;
    test_draws(5000, s, 0, "top-p 0");
    return test_report();
}
