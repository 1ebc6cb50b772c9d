/* cuda/qtc_layout.h: the GGUF types qtc packs and the bytes of one packed tile block (16 rows x 256 elements), shared
 * by the packing (cuda/qtc_pack.cu) and the kernels (cuda/qtc.cu). The layout itself: cuda/qtc.cu's file comment. */
#ifndef ZLLM_CUDA_QTC_LAYOUT_H
#define ZLLM_CUDA_QTC_LAYOUT_H
#include "qtc.h"

enum { QT_Q4K = 0, QT_Q6K = 1, QT_Q8_0 = 2 };

/* the packed type of a GGUF type (QT_*), -1 for a type qtc does not pack */
static inline int qt_ty(ggml_type t) {
    return t == GGML_Q4_K ? QT_Q4K : t == GGML_Q6_K ? QT_Q6K : t == GGML_Q8_0 ? QT_Q8_0 : -1;
}
/* bytes of one tile block of packed type ty (16 x 144, 16 x 210, 16 x 8 x 34), 0 for none */
static inline int qt_tb(int ty) { return ty == QT_Q4K ? 2304 : ty == QT_Q6K ? 3360 : ty == QT_Q8_0 ? 4352 : 0; }
#endif
