/* cuda/gpu_caps.h: the ceilings zllm-bench measures on the GPU it runs on (C interface). */
#ifndef ZLLM_CUDA_GPU_CAPS_H
#define ZLLM_CUDA_GPU_CAPS_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[256];            /* device name */
    int sm_count;              /* multiprocessors */
    double copy_gbs;           /* device-to-device copy, GB/s counting bytes read + written */
    double read_gbs;           /* read-only kernel (16-byte loads, one sum per block), GB/s */
    double bf16_tflops;        /* 8192^3 BF16 product through cuBLAS (f32 accumulate), TFLOP/s */
} gpu_caps;

/* Measures on device dev (median of several timed runs after a warm-up, random data, buffers far larger than
 * the L2 cache). Returns 0, or -1 with a message in err (no device, out of memory, a CUDA/cuBLAS error). */
int gpu_caps_measure(int dev, gpu_caps *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
