# zllm: one flat Makefile. Conventions (so adding a file rarely means editing this):
#   common/*.c broker/*.c worker/*.c clients/*.c tools/*.c  -> objects in $(BUILD)/lib/libzllm.a,
#       except files named main_NAME.c, which each become the binary $(BUILD)/bin/NAME.
#   cuda/*.cu -> $(BUILD)/lib/libzllm_cuda.a when ZLLM_CUDA=1 (default when nvcc exists).
#   tests/test_*.c -> $(BUILD)/tests/test_* (run by tests/run.sh); tests/fuzz_*.c -> libFuzzer
#       targets under $(BUILD)/fuzz (make fuzz) and replay drivers under $(BUILD)/tests (run in CI).
#   tests/test_asan_*.c and the fuzz replay drivers link an AddressSanitizer+UBSan build of the library
#       ($(BUILD)/asan, C only): everything that parses files or network bytes is tested under ASan in CI.
#   cuda/test_*.cu -> $(BUILD)/tests/gpu_test_* (make test-gpu).
# Knobs: BUILD, CC, NVCC, OPT, SAN (address|undefined|... -> -fsanitize=), ZLLM_CUDA, CUDA_ARCHS.

BUILD      ?= build
CC         ?= gcc
OPT        ?= -O2
SAN        ?=
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
ZLLM_CUDA  ?= $(if $(wildcard $(NVCC)),1,0)
# explicit targets (no autodetection): Ampere, Ada, Hopper.  Override with CUDA_ARCHS="90" on the GPU machine.
# 90 is built as sm_90a (Hopper's wgmma: cuda/wtc.cu's large-batch forms).
CUDA_ARCHS ?= 80 89 90
PYTHON     ?= python3

CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -fno-omit-frame-pointer -Icommon -Iworker -Ibroker -Iclients -Icuda
LDLIBS   += -lzmq -lmsgpackc -lpcre2-8 -lutf8proc -lm -lpthread
ifneq ($(SAN),)
CFLAGS   += -fsanitize=$(SAN) $(if $(findstring undefined,$(SAN)),-fno-sanitize-recover=undefined)
LDFLAGS  += -fsanitize=$(SAN)
endif

NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 --threads=0 -Xcompiler -Wall,-Wextra,-fPIC -Icommon -Iworker -Icuda \
             $(foreach a,$(patsubst 90,90a,$(CUDA_ARCHS)),-gencode arch=compute_$(a),code=sm_$(a))
ifeq ($(ZLLM_CUDA),1)
CFLAGS   += -DZLLM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIB := $(BUILD)/lib/libzllm_cuda.a
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
endif

LIB_DIRS  := common broker worker clients tools
ALL_C     := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
MAIN_C    := $(filter %.c,$(foreach f,$(ALL_C),$(if $(findstring main_,$(notdir $(f))),$(f))))
LIB_C     := $(filter-out $(MAIN_C),$(ALL_C))
LIB_O     := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_C))
BINS      := $(foreach f,$(MAIN_C),$(BUILD)/bin/$(patsubst main_%.c,%,$(notdir $(f))))
TEST_C    := $(wildcard tests/test_*.c)
TESTS     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_C))
FUZZ_C    := $(wildcard tests/fuzz_*.c)
FUZZ_REPLAY := $(patsubst tests/%.c,$(BUILD)/tests/%,$(FUZZ_C))
CU_ALL    := $(wildcard cuda/*.cu)
CU_TEST   := $(wildcard cuda/test_*.cu)
CU_BENCH  := $(wildcard cuda/bench_*.cu)
CU_LIB    := $(filter-out $(CU_TEST) $(CU_BENCH),$(CU_ALL))
CU_O      := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_LIB))
GPU_TESTS := $(patsubst cuda/test_%.cu,$(BUILD)/tests/gpu_test_%,$(CU_TEST))
LIB       := $(BUILD)/lib/libzllm.a
# objects depend on a stamp named after the flags, so changing CFLAGS/SAN/ZLLM_CUDA/CUDA_ARCHS rebuilds them
FLAGS_STAMP := $(BUILD)/obj/.flags-$(shell echo '$(CC) $(CFLAGS) $(NVCCFLAGS)' | md5sum | cut -c1-12)
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_LIB  := $(BUILD)/asan/lib/libzllm.a
TEST_C_PLAIN := $(filter-out tests/test_asan_%,$(TEST_C))

.PHONY: all deps test test-gpu bench fuzz fuzz-long run clean trace
all: $(BINS) $(TESTS) $(FUZZ_REPLAY)
	@echo "built: $(notdir $(BINS)) (CUDA=$(ZLLM_CUDA) archs=$(if $(filter 1,$(ZLLM_CUDA)),$(CUDA_ARCHS),none))"

# deps: installs what is missing (as root), otherwise prints the command.
deps:
	@bash deploy/deps.sh

$(FLAGS_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/obj/.flags-* && touch $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_O)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libzllm_cuda.a: $(CU_O)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# binaries: whole archive order is lib, then cuda lib (cuda code calls common code), then lib again.
$(BUILD)/bin/%: $(BUILD)/obj/main_%.o $(LIB) $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(CUDA_LIB) $(LIB) $(LDLIBS)

# zllm-deploy forks the GPU workers: it links no CUDA (nor ZeroMQ) library, so no device runtime is ever
# initialized in the supervisor and every forked worker starts clean (tools/main_zllm-deploy.c)
$(BUILD)/bin/zllm-deploy: $(BUILD)/obj/main_zllm-deploy.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB)

# main_NAME.c may live in any LIB_DIR: find its object
define MAIN_RULE
$(BUILD)/obj/main_$(patsubst main_%.c,%,$(notdir $(1))).o: $(1) $$(FLAGS_STAMP)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -MMD -MP -c $$< -o $$@
endef
$(foreach f,$(MAIN_C),$(eval $(call MAIN_RULE,$(f))))

$(BUILD)/tests/test_%: tests/test_%.c tests/test.h $(LIB) $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -Itests -o $@ $< $(LIB) $(CUDA_LIB) $(LIB) $(LDLIBS)

# the sanitizer build of the library (no CUDA): rebuilt by a sub-make, which checks its own dependencies
.PHONY: asan-lib
asan-lib:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=address,undefined ZLLM_CUDA=0 $(ASAN_LIB)
$(ASAN_LIB): | asan-lib

$(BUILD)/tests/test_asan_%: tests/test_asan_%.c tests/test.h asan-lib
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(ASAN_FLAGS) -Itests -o $@ $< $(ASAN_LIB) \
	    $(filter-out -lcublasLt -lcublas -lcudart -lstdc++,$(LDLIBS))

# fuzz targets: replay driver (reads files/dirs given on the command line, or a built-in corpus) for CI, under ASan
$(BUILD)/tests/fuzz_%: tests/fuzz_%.c tests/fuzz_main.h asan-lib
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(ASAN_FLAGS) -Itests -DFUZZ_REPLAY_MAIN -o $@ $< $(ASAN_LIB) \
	    $(filter-out -lcublasLt -lcublas -lcudart -lstdc++,$(LDLIBS))

# libFuzzer builds (clang): make fuzz, then $(BUILD)/fuzz/fuzz_NAME corpus_dir
fuzz:
	$(MAKE) BUILD=$(BUILD)/fuzzlib CC=clang SAN=address,fuzzer-no-link ZLLM_CUDA=0 $(BUILD)/fuzzlib/lib/libzllm.a
	@mkdir -p $(BUILD)/fuzz
	for f in $(FUZZ_C); do n=$$(basename $$f .c); \
	  clang -std=c11 -g -O1 -D_GNU_SOURCE -fsanitize=address,fuzzer -Icommon -Iworker -Ibroker -Iclients -Itests \
	    -o $(BUILD)/fuzz/$$n $$f $(BUILD)/fuzzlib/lib/libzllm.a $(LDLIBS) || exit 1; \
	  mkdir -p $(BUILD)/fuzz/corpus/$$n && ZLLM_FUZZ_SEED_DIR=$(BUILD)/fuzz/corpus/$$n $(BUILD)/fuzz/$$n || exit 1; done

# every libFuzzer target in turn for FUZZ_SECONDS each on its corpus (docs/fuzzing.md); crashes land in $(BUILD)/fuzz
FUZZ_SECONDS ?= 600
fuzz-long: fuzz
	for f in $(FUZZ_C); do n=$$(basename $$f .c); \
	  $(BUILD)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$n- \
	    $(BUILD)/fuzz/corpus/$$n || exit 1; done

# compiled by nvcc, linked by $(CC) (nvcc does not take -Wl,-rpath; LDLIBS already names cudart and stdc++)
$(BUILD)/tests/gpu_test_%: cuda/test_%.cu $(LIB) $(CUDA_LIB)
	@mkdir -p $(dir $@) $(BUILD)/obj/cuda
	$(NVCC) $(NVCCFLAGS) -Itests -c $< -o $(BUILD)/obj/cuda/test_$*.o
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/obj/cuda/test_$*.o $(LIB) $(CUDA_LIB) $(LIB) $(LDLIBS)

test: deps all
	@bash tests/run.sh $(BUILD)

# cuda/bench_NAME.cu -> $(BUILD)/bin/zllm-NAMEbench (GPU micro-benchmarks, e.g. zllm-attentionbench)
# zllm-qmmabench also times cuBLAS BF16 beside the qmma kernels: it links cuBLAS (and libzllm for qtc_pack)
$(BUILD)/bin/zllm-qmmabench: cuda/bench_qmma.cu $(CUDA_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LIB) $(LIB) -lcublas -lcudart

$(BUILD)/bin/zllm-%bench: cuda/bench_%.cu $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LIB) -lcudart

# zllm-prefillbench also times the engine's cuBLAS products (cuda/bench_prefill.cu)
$(BUILD)/bin/zllm-prefillbench: cuda/bench_prefill.cu $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LIB) -lcublas -lcudart

# a CUPTI injection library for kernel timelines (cuda/cupti_trace.c, tools/trace_step.py): a measurement tool
trace: $(BUILD)/lib/libzllm_trace.so
$(BUILD)/lib/libzllm_trace.so: cuda/cupti_trace.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 \
	    -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti

test-gpu: all $(GPU_TESTS)
	@bash tests/run_gpu.sh $(BUILD)

bench: all $(if $(filter 1,$(ZLLM_CUDA)),$(BUILD)/bin/zllm-attentionbench)
	@bash tests/bench.sh $(BUILD)

run: deps all
	@bash deploy/run-default.sh $(BUILD)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
