/* cuda/cuda_register.cu: registers the CUDA engine with the engine layer (engine_register) before main runs.
 * Binaries that serve CUDA link libzllm_cuda.a whole (the Makefile's --whole-archive), so this object is always in
 * them; binaries without it answer "built without CUDA" for cuda devices. */
extern "C" {
#include "engine.h"
}
#include "engine_cuda.h"

__attribute__((constructor)) static void s_register(void) { engine_register("cuda", engine_cuda_new); }
