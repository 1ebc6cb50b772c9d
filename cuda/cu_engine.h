/* cuda/cu_engine.h: the CUDA engine's object, shared by its four files (private to cuda/):
 *   cuda/cuda_weights.cu  weight upload, packing and joins; each matrix's path (cu_path) decided once;
 *   cuda/cuda_forward.cu  the forward pass of one step (the layer loop), what graph capture records;
 *   cuda/cuda_step.cu     a step's input staging, its flight (results on their way back) and the CUDA graphs;
 *   cuda/engine_cuda.cu   the object's life (new, destroy), the ops table and the engine_cuda_* entry points.
 * docs/cuda.md describes the kernels each path takes. */
#ifndef ZLLM_CUDA_CU_ENGINE_H
#define ZLLM_CUDA_CU_ENGINE_H
extern "C" {
#include "engine.h"
#include "model.h"
}
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "attention.h"
#include "ops.h"

enum { CU_HIST = 256,        /* history tokens per row staged for the repetition penalty (repeat_last_n capped) */
       CU_MAX_BUCKETS = 64 };
/* distinct generated ids per row staged for the presence/frequency penalties: a sequence that has generated more
 * distinct ids is penalised for its first CU_GEN */
enum { CU_GEN = 1024 };

/* how a matrix's products run, decided once at load (cuda/cuda_weights.cu) and fixed for every step size */
typedef enum {
    CU_PATH_NONE = 0,          /* an empty matrix: joined into another one, or unused */
    CU_PATH_QTC,               /* qtc (cuda/qtc.h) on the packed GGUF tiles in w (F16 engines) */
    CU_PATH_WTC,               /* wtc (cuda/wtc.h) on the dense 16-bit copy in w */
    CU_PATH_CUBLAS             /* cuBLAS (ops_gemm) on the dense copy in w: F32 engines, shapes wtc does not serve,
                                * and ZLLM_CUDA_WTC=0 */
} cu_path;

/* one weight matrix [n_out][n_in] on the device */
typedef struct {
    int n_in, n_out;           /* elements per row, rows */
    cu_path path;              /* the kernel family of its products */
    void *w;                   /* CU_PATH_QTC: qtc_pack's tiles of the GGUF rows (type qt); otherwise [n_out][n_in] of
                                * the engine's wt */
    ggml_type qt;              /* CU_PATH_QTC: the GGUF type of the packed rows */
    int owns;                  /* 1 when this matrix frees w (a tied 16-bit LM head reads tok_embd's) */
    int glu8;                  /* 1: a gate/up join whose rows interleave the two in blocks of 8 (the SwiGLU
                                * epilogue's layout, wtc_params.glu / qtc_params.glu): the product's columns are in
                                * that order too */
} cu_mat;

/* the Q/K/V products of a layer, decided at load */
typedef enum {
    CU_QKV_SEPARATE = 0,       /* wq, wk, wv: three products into the column slices of E->qkv */
    CU_QKV_JOINED,             /* wqkv: one product */
    CU_QKV_QK_V,               /* wqk and wv (two qtc types): two products, or one pair launch (qkv_pair) */
} cu_layer_qkv;

/* the gate/up products of a layer, decided at load */
typedef enum {
    CU_FFN_SEPARATE = 0,       /* wg, wu: two products into the halves of E->gu's rows, then the SwiGLU kernel */
    CU_FFN_JOINED,             /* wgu in order: one product, then the SwiGLU kernel */
    CU_FFN_GLU8,               /* wgu interleaved by 8: the product's SwiGLU epilogue where the step's form has one
                                * (the down product then reads E->gu's memory), else the product and the
                                * interleaved SwiGLU kernel (the same bits) */
} cu_layer_ffn;

typedef struct {
    cu_layer_qkv qkv;          /* how the Q/K/V products run */
    cu_layer_ffn ffn;          /* how the gate/up products run */
    cu_mat wqkv;               /* CU_QKV_JOINED: [q_dim + 2 kv_dim][dim], the rows of wq, then wk, then wv: one dense
                                * matrix or one packed qtc matrix, one product into E->qkv; wq, wk, wv are empty */
    cu_mat wqk;                /* CU_QKV_QK_V: [q_dim + kv_dim][dim], wq rows then wk rows packed as one qtc matrix
                                * when both are of one qtc type but wv is not (Q4_K_M's Q6_K layers); else empty */
    int qkv_pair;              /* CU_QKV_QK_V with both qtc: steps of <= 8 rows run wqk and wv in one launch
                                * (qtc_launch_pair: the same bits as two); ZLLM_CUDA_QTC_PAIR=0 turns it off */
    cu_mat wq, wk, wv, wo;     /* attention matrices (empty when wqkv or wqk holds them) */
    cu_mat wgu;                /* CU_FFN_JOINED / CU_FFN_GLU8: [2 ffn_dim][dim], wg rows then wu rows (into E->gu),
                                * or interleaved in blocks of 8 (glu8); dense or packed qtc; else empty */
    cu_mat wg, wu, wd;         /* FFN matrices (wg, wu empty when wgu holds them) */
    float *attn_norm, *ffn_norm; /* [dim] f32 */
    float *bq, *bk, *bv;       /* biases f32 [rows], NULL when absent */
    float *q_norm, *k_norm;    /* per-head Q/K norms f32 [head_dim] (qwen3, gemma3), NULL when absent */
    float *post_attn_norm;     /* f32 [dim]: norm of the attention output before its residual add (gemma3), or NULL */
    float *post_ffn_norm;      /* f32 [dim]: norm of the FFN output before its residual add (gemma3), or NULL */
    void *kc, *vc;             /* this layer's caches [n_slots + 1][n_ctx][kv_dim] of wt; paged KV: the pool
                                * [kv_blocks + 1][kv_block][kv_dim] (block kv_blocks is the padded rows' sentinel) */
    int window;                /* keys a row attends to at most (model_attn_window for the engine's n_ctx): > 0 runs
                                * the window kernel, 0 the causal decode/prefill kernels */
} cu_layer;

/* offsets (bytes) of the per-step input block, identical in the pinned host copy and on the device */
typedef struct {
    size_t rng;                /* uint64 [max_batch] generator state per sampling row (advanced on the GPU) */
    size_t out_tok;            /* int32 [max_batch] sampled ids (written by the GPU; copied back with rng) */
    size_t tokens, pos, slot;  /* int32 [max_tok] per row: token id, position, KV slot */
    size_t kv_len;             /* int32 [max_batch] decode rows: attend to [0, kv_len) */
    size_t seq_row0, seq_rows, seq_slot, seq_pos0; /* int32 [max_batch] prefill entries */
    size_t last_row;           /* int32 [max_batch] per sampling row (= ordered entry): its last token's row */
    size_t eslot;              /* int32 [max_batch] per sampling row: its KV slot (n_slots for a padded row), the
                                * index of the sampler's carry (sample_params.carry_idx) */
    size_t hist_len;           /* int32 [max_batch] staged history tokens per sampling row */
    size_t params;             /* zl_sampling [max_batch] */
    size_t perm;               /* int32 [max_tok] pipeline stage: engine row -> caller's row (-1: padded row) */
    size_t hptr;               /* uint64 [2] pipeline stage: device addresses of h_in [T][dim], h_out [T][dim] */
    size_t mask_on;            /* int32 [max_batch] per sampling row: 1 when mask holds its allowed ids */
    size_t mask_late_on;       /* int32 [max_batch] per sampling row: 1 when its mask comes late (zl_seq.mask_late),
                                * in its flight's lmask once the host has set the flight's lflag */
    size_t lwant;              /* uint32: the lflag value that says this step's late masks are written */
    size_t pslot;              /* int32 [max_tok] paged KV, per row: the offset in tab of its entry's block table
                                * (what the append, decode and window kernels take as the row's slot) */
    size_t pseq;               /* int32 [max_batch] paged KV, per prefill entry: the offset in tab of its table */
    size_t hist;               /* int32 [max_batch][CU_HIST] history tail per sampling row */
    size_t mask;               /* uint32 [max_batch][mask_words] structured output: allowed ids per sampling row */
    size_t core_end;           /* end of everything but hist, mask and extras: the copy length when no row needs them */
    size_t hist_end;           /* end of hist: the copy length when a row needs the repetition penalty only */
    size_t mask_end;           /* end of mask (a step with a mask and no extras copies up to its last sampling
                                * row's mask) */
    size_t bias_n;             /* int32 [max_batch] logit bias entries per sampling row (cuda/bias_penalty.h) */
    size_t bias_id;            /* int32 [max_batch][ZL_MAX_LOGIT_BIAS] */
    size_t bias_v;             /* f32 [max_batch][ZL_MAX_LOGIT_BIAS] */
    size_t gen_n;              /* int32 [max_batch] distinct generated ids per sampling row */
    size_t gen_id;             /* int32 [max_batch][CU_GEN] */
    size_t gen_cnt;            /* int32 [max_batch][CU_GEN] their counts */
    size_t total;              /* whole block (the allocation), the prompt logprob area included */
    size_t plp_row;            /* int32 [max_tok] prompt logprobs (zl_seq.plp_rows): each such row's index in x, in
                                * ordered-entry order; copied only by steps that have such rows */
    size_t plp_next;           /* int32 [max_tok] the id each of those rows scores */
    size_t plp_k;              /* int32 [max_tok] its alternatives */
    size_t plp_end;            /* end of the prompt logprob area */
    size_t tab;                /* int32 [max_batch * max_blocks + 1] paged KV: the step's block tables, packed in
                                * ordered-entry order (entry k's ceil((pos + n_tokens) / kv_block) ids), then one
                                * sentinel table {kv_blocks} for padded rows; copied up to its last id */
    int mask_words;            /* sample_mask_words(vocab) */
} cu_inputs;

/* one launched step's results on their way back (cu_engine.fl) */
typedef struct {
    const zl_seq *seqs;        /* the caller's entries (theirs until the wait: rng written back there) */
    int n;                     /* entries */
    int *order;                /* [max_batch] ordered entry k -> caller index */
    uint8_t *h_out;            /* pinned [in.tokens - in.rng]: the step's rng and out_tok areas of the input block
                                * (a later step rewrites h_in before this one is waited for); mapped, and written
                                * by the sampler itself, with two input blocks (cu_engine.n_inb) */
    uint8_t *d_out;            /* h_out's device address (mapped host memory) */
    float *logits;             /* caller's [n][vocab] logits buffer (synchronous steps only), or NULL */
    zl_logprobs *lps;          /* caller's [n] logprobs (zl_step.out_logprobs), or NULL */
    zl_logprobs *h_lp;         /* pinned mapped [max_batch]: the logprobs kernel's results per ordered entry (whole
                                * model engines; NULL otherwise) */
    zl_logprobs *d_lp;         /* h_lp's device address */
    zl_logprobs *h_plp;        /* pinned mapped [max_tok]: the prompt rows' logprobs (zl_seq.plp_out) in ordered-entry
                                * order (whole-model engines; NULL otherwise) */
    zl_logprobs *d_plp;        /* h_plp's device address */
    cudaEvent_t ev0, ev1;      /* around the step's device work (input copy .. output copy) */
    uint32_t *h_lmask;         /* mapped pinned [max_batch][mask_words]: the late masks of its sampling rows */
    uint32_t *d_lmask;         /* h_lmask's device address */
    volatile uint32_t *h_lflag; /* mapped pinned: the host sets it to lseq once h_lmask is written */
    uint32_t *d_lflag;          /* h_lflag's device address (the sampling of a step with late masks waits on it) */
    uint32_t lseq;              /* the value of its latest step with late masks (it wraps: the wait compares the
                                 * signed difference, sample_mask.h) */
    int late;                   /* 1: the step in this flight has late masks, 0 none */
    int late_ready;             /* 1: they were announced (engine_masks_ready) and the flag set */
} cu_flight;

typedef struct {
    zl_engine base;            /* public part; must be first */
    int dev;                   /* CUDA device ordinal */
    int sm_count;              /* multiprocessors */
    int dead;                  /* 1 after a device error: further steps are refused */
    cu_dtype wt;               /* matrix / KV / GEMM-input type */
    int max_tok;               /* rows a step may hold (>= max_batch) */
    int x_rows;                /* rows of every matrix-product input (xb, att_w, gu as the down product's input):
                                * max_tok rounded up to 128, so that wtc's TMA form reads its last batch tile whole
                                * (wtc_params.x_rows); the rows past a step's hold stale values no output reads */
    cudaStream_t st;           /* the one stream everything runs on */
    cublasHandle_t cb;         /* bound to st, workspace cb_ws */
    void *cb_ws;               /* cuBLAS workspace (fixed so graph capture never allocates) */
    size_t cb_ws_bytes;
    cu_layer *L;               /* [n_layers] */
    void *tok_embd;            /* [vocab][dim] wt (the embedding gather; quantized tables are dequantized) */
    cu_mat out;                /* LM head [vocab][dim]; shares tok_embd's storage when tied and dense */
    int wtc_on;                /* 1: dense 16-bit matrices that wtc serves take CU_PATH_WTC (one arithmetic for every
                                * step size: batch invariance at every width); cu_settings.wtc, a 16-bit wt and
                                * wtc_available */
    double last_gpu_ms;        /* device time of the last step waited for, from its flight's ev0/ev1; -1 before */
    float *out_norm;           /* [dim] */
    float *rope_cs;            /* [n_ctx][rope_dim/2] (cos, sin) */
    float *rope_cs_swa;        /* the sliding layers' table where they rotate otherwise (model_rope_two_kinds), or
                                * NULL */
    void *kv;                  /* one allocation holding every layer's K and V */
    int paged;                 /* 1: paged KV (zl_engine.kv_block > 0): the caches are pools of blocks, every kernel
                                * reads a row's KV through its block table (cuda/kv_page.cuh) */
    int kv_lg;                 /* paged: log2(kv_block) */
    int max_blocks;            /* paged: blocks of one whole context, ceil(n_ctx / kv_block) */
    size_t kv_bytes;
    size_t weight_bytes;       /* bytes of weights on the device */
    /* activations, [max_tok] rows unless noted (the matrix-product inputs: [x_rows]) */
    float *x;                  /* residual [dim] */
    float *qkv;                /* Q/K/V products [q_dim + 2 kv_dim]: q at column 0, k at q_dim, v at q_dim + kv_dim
                                * (biases and RoPE not applied: ops_qkv_rope_append reads them from here) */
    float *q;                  /* [q_dim] biased, rotated q, what attention reads */
    float *att;                /* attention output [q_dim] f32 */
    void *att_w;               /* att cast to wt (== att for F32): the output projection's input */
    void *xb;                  /* matrix-product input, wt, [max(dim, ffn_dim, q_dim)] */
    float *gu;                 /* gate/up products [2 ffn_dim]: gate at column 0, up at ffn_dim (interleaved by 8
                                * for a glu8 join); or, after wtc's SwiGLU epilogue, the down product's wt input
                                * [ffn_dim]. The SAME allocation as qkv (sized for the wider of the two): qkv lives
                                * from the Q/K/V product to ops_qkv_rope_append, gu from the gate/up product to the
                                * SwiGLU (or the down product), in stream order */
    float *logits;             /* [max_batch][vocab] */
    void *attn_ws;             /* flash-decoding partials */
    size_t attn_ws_bytes;
    void *qtc_ws;              /* qtc's and wtc's split partials (and qtc's slot-order copy of x): the largest
                                * qtc_workspace_bytes / wtc_workspace_bytes of their matrices (NULL when none needs
                                * one); one stream, so one buffer serves all */
    size_t qtc_ws_bytes;
    unsigned *qtc_flags;       /* qtc_params.flags: qtc_flags_bytes() bytes, zeroed once (every launch leaves them
                                * zero); NULL where no qtc launch uses them */
    int n_splits;              /* fixed split count (batch invariance), from attn_decode_splits at n_ctx */
    void *samp_ws;             /* sampler scratch */
    size_t samp_ws_bytes;
    cu_inputs in;              /* input block layout */
    int step_late;             /* the forward pass's sampling waits for late masks (an eager step that has them, or
                                * the capture of graphs that hold the wait: graph_late) */
    int graph_late;            /* 1: the decode graphs hold the wait for late masks and their kernel (a whole model
                                * that takes them), so steps with late masks replay graphs too; a step without
                                * them stages lwant as the flag's current value and passes the wait at once */
    cu_flight *cur_fl;         /* the flight of the step being launched */
    uint8_t *h_in;             /* the pinned host input block of the step being staged (h_inb[cur_p]) */
    uint8_t *d_in;             /* its device input block (d_inb[cur_p]): what IN_PTR addresses */
    int n_inb;                 /* input blocks: 2 for a whole-model engine, 1 for a pipeline stage. With 2, step k
                                * uses block k & 1 (the flight index), its graphs are captured once per block, its
                                * input copy runs on cst while the step before still runs, and the sampler writes
                                * the ids straight into the flight's mapped h_out: no copy lies between two steps'
                                * kernels. A stage keeps one block, copied on st (its stream also waits on the
                                * other stages' events) */
    uint8_t *h_inb[2];         /* pinned host input blocks */
    uint8_t *d_inb[2];         /* device input blocks */
    int cur_p;                 /* the block (and flight) the step being staged, or the graph being captured, uses */
    cudaStream_t cst;          /* n_inb 2: the input copies' stream */
    cudaEvent_t ev_cp[2];      /* n_inb 2: recorded on cst after block p's copy; st waits on it before the step */
    float *h_logits;           /* pinned [max_batch][vocab] */
    int n_buckets;             /* CUDA graphs: batch sizes and executables (none when no_graphs) */
    int bucket[CU_MAX_BUCKETS];
    cudaGraphExec_t gexec[2][CU_MAX_BUCKETS];   /* [input block][bucket] */
    int *order;                /* the flight being built's order (cu_flight.order) */
    int *crow;                 /* host scratch [max_batch]: caller index -> its first row in caller order */
    float *hbuf;               /* pipeline stage: [max_tok][dim] device staging of a step's host h_in/h_out */
    cudaEvent_t ev_in;         /* recorded after each step's input copy (no timing) */
    int in_pending;            /* 1: a step returned without synchronising; wait ev_in before rewriting h_in */
    int abandoned;             /* 1: engine_cuda_abandon: destroy frees host memory only (stream may never end) */
    /* steps queued ahead (launch with depth 2): a step's results leave through its flight, so that the next
     * step can be staged and queued before this one's ids reach the host. The sampler writes each entry's id and
     * generator state into the slot's carry, and the next step's embedding gather reads them for fed rows: the
     * ids never make a host round trip between two steps of a sequence */
    cu_flight fl[2];           /* the launched steps' results, oldest at fl_head */
    int fl_head;               /* index of the oldest launched step not waited for */
    int fl_count;              /* launched steps not waited for, 0..2 (a synchronous step is one launch + wait) */
    int32_t *carry_tok;        /* device [n_slots + 1]: the id last sampled for each slot (+ the padded rows') */
    uint64_t *carry_rng;       /* device [n_slots + 1]: that entry's generator state after its draw */
    uint8_t *carry_ok;         /* host [n_slots]: 1 when the slot's latest launched step sampled it (may feed) */
    const zl_step *op_q[2];    /* launch/wait (engine_cuda.cu): the steps launched and not waited for, oldest at op_head */
    int op_head, op_count;     /* (index of the oldest, how many: 0..2) */
    int op_ran;                /* 1: the one step in op_q ran whole at its launch (synchronous, or a stage) */
    int32_t *h_gcount;         /* host [vocab] zeroed scratch: counts of a row's generated ids while staging */
    int32_t *h_gtouch;         /* host [CU_GEN] the ids it counted */
} cu_engine;

/* the attention kernels' cache type for the engine's wt */
static inline attn_kv_type cu_kv_type(cu_dtype t) {
    return t == CU_F32 ? ATTN_KV_F32 : t == CU_F16 ? ATTN_KV_F16 : ATTN_KV_BF16;
}

/* the rows of one step, as the forward pass sees them (after the decode-first reordering) */
typedef struct {
    int n_rows;                /* rows: n_dec decode rows first, then the prefill entries' runs */
    int n_dec;                 /* decode rows (one token each) */
    int n_pre;                 /* prefill entries */
    int max_rows;              /* most rows of one prefill entry (1 when none) */
    int n_samp;                /* sampling rows: one per entry but the prompt chunks that do not sample (unless the
                                * caller wants every entry's logits), padded up to a graph bucket */
    int extras;                /* 1: an entry asks for logprobs, a logit bias or presence/frequency penalties: the
                                * step runs eagerly, the penalized rows go to the sampler's workspace (bias_penalty.h)
                                * which the sampler and the logprobs (logprob_top.h) read */
    int masks;                 /* 1: the mask kernel runs (a sampling row has a mask, or a graph is captured: its
                                * replays serve masked and unmasked steps alike); 0: the logits go to the sampler
                                * as the LM head wrote them, with no kernel between */
    int n_plp;                 /* prompt logprob rows (zl_seq.plp_rows; never in a graph): before the sampling, the
                                * final norm, the LM head and the logprobs kernel run over them max_batch at a time
                                * through the sampling rows' buffers */
} cu_batch;

/* one call of the step body (cuda_step_run): the entries and where their hidden states and results go */
typedef struct {
    const zl_seq *seqs;        /* the caller's entries */
    int n;                     /* entries */
    const float *h_in;         /* [T][dim] hidden states entering layer_begin (layer_begin > 0), caller's row order */
    float *h_out;              /* [T][dim] residual stream after layer_end - 1 (layer_end < n_layers) */
    int dev;                   /* 1: h_in / h_out are device memory; 0: host memory, staged through hbuf */
    void *const *waits;        /* n_waits (<= 4) events the stream waits for after the input copy */
    int n_waits;
    void *const *recs;         /* n_recs (<= 4) events recorded after the step's kernels */
    int n_recs;
    int32_t *out_tokens;       /* [n] sampled ids (synchronous steps), or NULL */
    float *out_logits;         /* [n][vocab] logits (synchronous steps), or NULL */
    int launch;                /* 1: queue the step and return (launch); cuda_step_collect hands over its results */
    zl_logprobs *out_logprobs; /* [n] (zl_step.out_logprobs), or NULL */
} cu_step_req;

/* cuda/cuda_weights.cu */
/* The engine's matrix type for model m: F32 when every matrix is F32, else BF16 when any is, else F16. */
cu_dtype cuda_weights_type(const zl_model *m);
/* Uploads layers [layer_begin, layer_end) (and the embedding, final norm and LM head the range needs) into E,
 * packing, joining and choosing each matrix's path; needs E->wt, E->wtc_on, E->st. Returns 0, or -1 with err. */
int cuda_weights_upload(cu_engine *E, char *err, size_t errlen);
/* Bytes of qtc/wtc workspace the largest of E's products needs (steps of up to max_step_tokens rows). */
size_t cuda_weights_workspace_bytes(const cu_engine *E);
/* Frees every matrix of E (cudaFree; the device must be current). */
void cuda_weights_free(cu_engine *E);

/* cuda/cuda_forward.cu */
/* Enqueues the forward pass and the sampling of batch b on E->st, reading the step's inputs from E->d_in. No
 * host synchronisation, allocation or copy: the body graph capture records. Returns 0, or -1 with err. */
int cuda_forward(cu_engine *E, const cu_batch *b, char *err, size_t errlen);

/* cuda/cuda_step.cu */
/* Lays out the input block for max_tok rows and max_batch sampling rows; max_tab: ids of the paged KV tables
 * area (0 without paged KV). */
void cuda_step_layout(cu_inputs *in, int max_tok, int max_batch, int vocab, size_t max_tab);
/* Validates, stages and enqueues one step (r), then waits for it unless r->launch. Returns 0, or -1 with
 * E->base.err (a device error also marks E dead). */
int cuda_step_run(cu_engine *E, const cu_step_req *r);
/* Waits for the oldest launched step and hands its ids (and logits, generator states) to the caller. */
int cuda_step_collect(cu_engine *E, int32_t *out_tokens);
/* Captures one CUDA graph per decode bucket and input block. Returns 0, or -1 with err. */
int cuda_step_capture_graphs(cu_engine *E, char *err, size_t errlen);
#endif
