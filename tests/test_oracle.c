/* tests/test_oracle.c: both CPU engines against transformers on the random gemma3 and Mistral-style models of
 * tests/data/oracle (sliding windows crossed by every prompt; gemma3 with its local and global layers, and with
 * linear RoPE scaling on the global ones; gemma3 with BF16 matrices against transformers on the same rounded weights). cpu-ref (f32) within 1e-4 relative; cpu (quantized activations where the
 * weights are quantized: these are F32, so f32 products in another summation order and a vectorized exp) within
 * 1e-4 too. Each also runs all prompts batched in chunks and must give bitwise the rows of each alone
 * (tests/oracle_check.h); and gemma3 split into two pipeline stages gives the whole engine's logits bitwise. The
 * data: tests/oracle/make_oracle.py. */
#include "oracle_check.h"

/* pipeline stages: layers [0, 4) and [4, 6) of gemma3-swa (the embedding scale in the first, the global layer 5 in
 * the second; each layer keeps its own window and RoPE table) chained through hidden states give bitwise the whole
 * engine's logits over oracle prompt 0: its prefill, then decode steps past the window */
static void chain_check(const char *device) {
    oracle_ref o;
    char err[512];
    zl_engine *whole = NULL, *part[2] = {NULL, NULL};
    float *lw = NULL, *lp = NULL, *h = NULL;
    zl_model *m = NULL;
    if (oracle_read("gemma3-swa", &o)) goto done;
    m = model_load("tests/data/oracle/gemma3-swa.gguf", err, sizeof err);
    CHECK(m != NULL, "model_load: %s", err);
    if (!m) goto done;
    zl_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.device = device;
    eo.n_slots = 1;
    eo.max_batch = 1;
    eo.n_ctx = ORACLE_MAX_TOKENS;
    eo.threads = 2;
    whole = engine_new(m, &eo, err, sizeof err);
    for (int i = 0; i < 2; i++) {
        zl_engine_opts po = eo;
        po.layer_begin = i ? 4 : 0;
        po.layer_end = i ? 6 : 4;
        part[i] = engine_new(m, &po, err, sizeof err);
    }
    CHECK(whole && part[0] && part[1], "%s: engines: %s", device, err);
    if (!whole || !part[0] || !part[1]) goto done;
    const int V = o.vocab, D = m->cfg.dim;
    lw = (float *)malloc(sizeof(float) * V);
    lp = (float *)malloc(sizeof(float) * V);
    h = (float *)malloc(sizeof(float) * (size_t)o.n_prefill[0] * D);
    if (!lw || !lp || !h) goto done;
    int same = 1, steps = 0;
    for (int pos = 0; pos < o.n[0]; steps++) {
        const int nt = pos == 0 ? o.n_prefill[0] : 1;
        zl_seq s;
        memset(&s, 0, sizeof s);
        s.slot = 0;
        s.pos = pos;
        s.n_tokens = nt;
        s.tokens = o.tok[0] + pos;
        s.sample = 1;
        int32_t tw, tp;
        zl_step st;
        memset(&st, 0, sizeof st);
        st.seqs = &s;
        st.n = 1;
        st.sync = 1;
        st.h_out = h;
        int rc = engine_step(whole, &s, 1, &tw, lw) || engine_run(part[0], &st);
        memset(&st, 0, sizeof st);
        st.seqs = &s;
        st.n = 1;
        st.sync = 1;
        st.h_in = h;
        st.out_tokens = &tp;
        st.out_logits = lp;
        rc = rc || engine_run(part[1], &st);
        CHECK(rc == 0, "%s: chain step at %d: %s / %s / %s", device, pos, whole->err, part[0]->err, part[1]->err);
        if (rc) break;
        same &= memcmp(lw, lp, sizeof(float) * V) == 0 && tw == tp;
        pos += nt;
    }
    CHECK(same, "%s: 2 stages of gemma3-swa differ from the whole engine", device);
    printf("gemma3-swa on %s: 2 stages %s the whole engine's logits over %d steps\n", device,
           same ? "give bitwise" : "DIFFER from", steps);
done:
    free(lw);
    free(lp);
    free(h);
    engine_destroy(&whole);
    for (int i = 0; i < 2; i++) engine_destroy(&part[i]);
    model_destroy(&m);
    free(o.ref);
}

int main(void) {
    static const char *const models[] = {"gemma3-swa", "gemma3-linear", "mistral-swa", "gemma3-swa-bf16"};
    static const char *const devices[] = {"cpu-ref", "cpu"};
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 2; d++) oracle_check(models[i], devices[d], 1e-4, 1);
    for (int d = 0; d < 2; d++) chain_check(devices[d]);
    return test_report();
}
