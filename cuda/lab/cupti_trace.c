/* cuda/lab/cupti_trace.c: libzllm_trace.so, a CUPTI injection library that writes one CSV line per kernel execution
 * (graph-launched kernels included), for timelines of a decode step on the GPU machine:
 *
 *   CUDA_INJECTION64_PATH=$PWD/build/lib/libzllm_trace.so ZLLM_TRACE_OUT=trace.csv zllm-bench ...
 *   python3 tools/trace_step.py trace.csv
 *
 * Columns: start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,graph_node,name (mangled). Kernels are traced with
 * CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which does not serialise them. Build: make trace (ZLLM_CUDA=1). Not part
 * of zllm itself: a measurement tool. On a CUPTI error it prints one line and traces nothing. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *s_out;

static void CUPTIAPI s_buf_req(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = (size_t)8 << 20;
    *buf = (uint8_t *)aligned_alloc(64, *size);
    *max_records = 0;
}

static void CUPTIAPI s_buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *r = NULL;
    while (s_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        fprintf(s_out, "%llu,%llu,%u,%d,%d,%d,%d,%llu,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX,
                (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
    }
    free(buf);
}

static void s_flush(void)
{
    cuptiActivityFlushAll(1);
    if (s_out) fclose(s_out);
    s_out = NULL;
}

int InitializeInjection(void)
{
    const char *path = getenv("ZLLM_TRACE_OUT");
    s_out = fopen(path && *path ? path : "trace.csv", "w");
    if (!s_out) { perror("zllm trace: output"); return 1; }
    if (cuptiActivityRegisterCallbacks(s_buf_req, s_buf_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "zllm trace: CUPTI refused kernel activity tracing\n");
        fclose(s_out);
        s_out = NULL;
        return 1;
    }
    atexit(s_flush);
    return 1;
}
