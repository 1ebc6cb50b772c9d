# zllm: one flat Makefile. Conventions (so adding a file rarely means editing this):
#   Each directory below is a layer with its own archive $(BUILD)/lib/libzllm_DIR.a, built from DIR/*.c (and
#   cuda/*.cu), except files named main_NAME.c, which each become the binary $(BUILD)/bin/NAME. A directory
#   compiles with its own include path and those of the layers below it (INC_DIR), so that a layer cannot
#   include a layer above it:
#       common   what every process shares: wire protocol, GGUF reader, tokenizer, chat templates, key files
#       engine   the model runtime: engine interface, CPU engine, model, quantization, sampler  (over common)
#       cuda     the CUDA back-end, which registers itself with the engine layer                (over engine)
#       worker   batcher, pipeline stages, shared-memory rings, zllm-worker                  (over engine, cuda)
#       broker   zllm-broker                                                                   (over common)
#       clients  C library and the zllm CLI                                                    (over common)
#       deploy   zllm-deploy (links neither CUDA nor ZeroMQ: only shmring of worker/)    (over worker, common)
#       tools    benchmarks and model tools                                           (over worker and below)
#       http     zllm-http, the OpenAI-compatible HTTP gateway: built only where pkg-config finds libmicrohttpd
#                and jansson                                                          (over clients, common)
#   A binary links the archives of its layer and of those below, each once, top down; libzllm_cuda.a is
#   linked whole (cuda/cuda_register.cu registers the engine before main).
#   tests/test_*.c -> $(BUILD)/tests/test_* (run by tests/run.sh); tests/fuzz_*.c -> libFuzzer targets under
#       $(BUILD)/fuzz (make fuzz) and replay drivers under $(BUILD)/tests (run in CI).
#   tests/test_asan_*.c and the fuzz replay drivers link an AddressSanitizer+UBSan build of the library
#       ($(BUILD)/asan, C only): everything that parses files or network bytes is tested under ASan in CI.
#   cuda/test_*.cu -> $(BUILD)/tests/gpu_test_* (make test-gpu).
#   cuda/lab/ (measurement-only kernels, benchmarks, their checks) -> built by make bench only.
# Knobs: BUILD, CC, NVCC, OPT, SAN (address|undefined|... -> -fsanitize=), ZLLM_CUDA, CUDA_ARCHS, JOBS.

BUILD      ?= build
CC         ?= gcc
OPT        ?= -O2
SAN        ?=
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
PYTHON     ?= python3
# parallel jobs for the builds that `make run` and `make test` start (unless make already runs with -j)
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

# CUDA is built when nvcc exists and a GPU answers (nvidia-smi), or when asked for with ZLLM_CUDA=1; a machine
# with the toolkit but no GPU builds the CPU engine only (CUDA kernels take minutes to compile per architecture).
ifeq ($(origin ZLLM_CUDA),undefined)
GPU_CAP    := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
ZLLM_CUDA  := $(if $(and $(wildcard $(NVCC)),$(GPU_CAP)),1,0)
endif
# the GPU's own architecture when one answers; otherwise Ampere, Ada and Hopper.
# 90 is built as sm_90a (Hopper's wgmma: cuda/wtc.cu's large-batch forms).
ifeq ($(origin CUDA_ARCHS),undefined)
GPU_CAP    ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
CUDA_ARCHS := $(if $(GPU_CAP),$(GPU_CAP),80 89 90)
endif

CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -fno-omit-frame-pointer
LDLIBS   += -lzmq -lmsgpackc -lpcre2-8 -lutf8proc -lm -lpthread
ifneq ($(SAN),)
CFLAGS   += -fsanitize=$(SAN) $(if $(findstring undefined,$(SAN)),-fno-sanitize-recover=undefined)
LDFLAGS  += -fsanitize=$(SAN)
endif

NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 --threads=0 -Xcompiler -Wall,-Wextra,-fPIC \
             $(foreach a,$(patsubst 90,90a,$(CUDA_ARCHS)),-gencode arch=compute_$(a),code=sm_$(a))
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
ifeq ($(ZLLM_CUDA),1)
CFLAGS   += -DZLLM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
endif

# include paths per layer: its own headers and those below it
INC_common  := -Icommon
INC_engine  := -Iengine $(INC_common)
INC_cuda    := -Icuda $(INC_engine)
INC_worker  := -Iworker $(INC_cuda)
INC_broker  := -Ibroker $(INC_common)
INC_clients := -Iclients $(INC_common)
INC_deploy  := -Ideploy -Iworker $(INC_common)
INC_tools   := -Itools -Iworker $(INC_cuda)
INC_tests   := -Itests -Itools -Ideploy -Ibroker -Iclients $(INC_worker)
INC_http    := -Ihttp -Iclients $(INC_common)
# the HTTP gateway's libraries (absent on the GPU machines: the layer is then left out)
HTTP_OK     := $(shell pkg-config --exists libmicrohttpd jansson 2>/dev/null && echo 1)
HTTP_LIBS   := $(if $(HTTP_OK),$(shell pkg-config --libs libmicrohttpd jansson))
HTTP_ASAN   := $(if $(HTTP_OK),$(BUILD)/tests/zllm-http-asan)

# archives each layer links, top down (libzllm_cuda.a whole, where CUDA is built)
LIB_DIRS    := common engine worker broker clients deploy tools $(if $(HTTP_OK),http)
ARCH        = $(BUILD)/lib/libzllm_$(1).a
CUDA_LIB    := $(if $(filter 1,$(ZLLM_CUDA)),$(call ARCH,cuda))
comma       := ,
CUDA_LINK   := $(if $(CUDA_LIB),-Wl$(comma)--whole-archive $(CUDA_LIB) -Wl$(comma)--no-whole-archive)
LINK_common  = $(call ARCH,common)
LINK_engine  = $(call ARCH,engine) $(LINK_common)
LINK_cudaeng = $(CUDA_LINK) $(LINK_engine)
LINK_worker  = $(call ARCH,worker) $(LINK_cudaeng)
LINK_broker  = $(call ARCH,broker) $(LINK_common)
LINK_clients = $(call ARCH,clients) $(LINK_common)
LINK_deploy  = $(call ARCH,deploy) $(call ARCH,worker) $(LINK_common)
LINK_http    = $(call ARCH,http) $(LINK_clients)
LINK_tools   = $(call ARCH,tools) $(call ARCH,worker) $(LINK_cudaeng)
LINK_tests   = $(call ARCH,tools) $(call ARCH,deploy) $(call ARCH,worker) $(call ARCH,broker) $(call ARCH,clients) \
               $(LINK_cudaeng)
# the archive files a link line names (its prerequisites)
libs_of      = $(filter %.a,$(1))
# extra libraries a layer's binaries need beyond LDLIBS
XLIBS_worker = $(if $(CUDA_LIB),$(CUDA_LDLIBS))
XLIBS_tools  = $(XLIBS_worker)
XLIBS_tests  = $(XLIBS_worker)

ALL_C     := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
MAIN_C    := $(foreach f,$(ALL_C),$(if $(findstring main_,$(notdir $(f))),$(f)))
LIB_C     := $(filter-out $(MAIN_C),$(ALL_C))
BINS      := $(foreach f,$(MAIN_C),$(BUILD)/bin/$(patsubst main_%.c,%,$(notdir $(f))))
TEST_C    := $(wildcard tests/test_*.c)
TESTS     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_C))
FUZZ_C    := $(filter-out $(if $(HTTP_OK),,tests/fuzz_http_%),$(wildcard tests/fuzz_*.c))
FUZZ_REPLAY := $(patsubst tests/%.c,$(BUILD)/tests/%,$(FUZZ_C))
CU_ALL    := $(wildcard cuda/*.cu)
CU_TEST   := $(wildcard cuda/test_*.cu)
CU_LIB    := $(filter-out $(CU_TEST),$(CU_ALL))
GPU_TESTS := $(patsubst cuda/test_%.cu,$(BUILD)/tests/gpu_test_%,$(CU_TEST))
LIBS      := $(foreach d,$(LIB_DIRS),$(call ARCH,$(d))) $(CUDA_LIB)
# cuda/lab/: measurement-only kernels, benchmarks and their GPU checks, built by make bench (never linked into the
# binaries or libzllm_cuda.a); a layer over cuda/
INC_lab   := -Icuda/lab $(INC_cuda)
LAB_CU    := $(filter-out cuda/lab/test_% cuda/lab/bench_%,$(wildcard cuda/lab/*.cu))
LAB_LIB   := $(BUILD)/lib/libzllm_lab.a
LAB_BINS  := $(patsubst cuda/lab/bench_%.cu,$(BUILD)/bin/zllm-%bench,$(wildcard cuda/lab/bench_*.cu)) $(BUILD)/bin/zllm-qbench
LAB_TESTS := $(patsubst cuda/lab/test_%.cu,$(BUILD)/lab/gpu_test_%,$(wildcard cuda/lab/test_*.cu))
LINK_lab   = $(LAB_LIB) $(LINK_cudaeng)
# objects depend on a stamp named after the flags, so changing CFLAGS/SAN/ZLLM_CUDA/CUDA_ARCHS rebuilds them
FLAGS_STAMP := $(BUILD)/obj/.flags-$(shell echo '$(CC) $(CFLAGS) $(NVCCFLAGS)' | md5sum | cut -c1-12)
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_LIBS := $(foreach d,$(LIB_DIRS),$(BUILD)/asan/lib/libzllm_$(d).a)
# the ASan build's link line for tests: the same layers as LINK_tests, without CUDA
ASAN_LINK := $(foreach d,tools deploy worker broker clients engine common,$(BUILD)/asan/lib/libzllm_$(d).a)
# the binaries `make run` starts (deploy/run-default.sh, deploy/run-local.sh)
RUN_BINS  := $(BUILD)/bin/zllm-broker $(BUILD)/bin/zllm-worker $(BUILD)/bin/zllm
# -jJOBS for the builds started by run and test, unless make already runs in parallel
PAR       = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(JOBS))
ARCHS_SAY := $(if $(filter 1,$(ZLLM_CUDA)),CUDA for sm_$(CUDA_ARCHS): several minutes a first time,CPU only: about a minute on 2 cores a first time)

.PHONY: all libs asan-libs deps test test-gpu bench fuzz run clean trace build-run build-test FORCE fuzz-long
all: $(BINS) $(TESTS) $(FUZZ_REPLAY) $(HTTP_ASAN)
	@echo "built: $(notdir $(BINS)) (CUDA=$(ZLLM_CUDA) archs=$(if $(filter 1,$(ZLLM_CUDA)),$(CUDA_ARCHS),none))"
libs: $(LIBS)

# deps: installs what is missing (as root), otherwise prints the command.
deps:
	@bash deploy/deps.sh

$(FLAGS_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/obj/.flags-* && touch $@

# objects: DIR/x.c -> $(BUILD)/obj/DIR/x.o with DIR's include path
define LAYER_RULES
$(BUILD)/obj/$(1)/%.o: $(1)/%.c $$(FLAGS_STAMP)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(INC_$(1)) -MMD -MP -c $$< -o $$@
$(call ARCH,$(1)): $$(patsubst %.c,$$(BUILD)/obj/%.o,$$(filter $(1)/%,$$(LIB_C)))
	@mkdir -p $$(dir $$@)
	rm -f $$@ && ar rcs $$@ $$^
endef
$(foreach d,$(LIB_DIRS),$(eval $(call LAYER_RULES,$(d))))

$(BUILD)/obj/cuda/%.o: cuda/%.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(INC_cuda) -MMD -MP -c $< -o $@

$(call ARCH,cuda): $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_LIB))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# binaries: main_NAME.c in DIR links DIR's archive and those below it (LINK_DIR); zllm-deploy forks the GPU
# workers and links neither CUDA nor ZeroMQ, so no device runtime is ever initialized in the supervisor and every
# forked worker starts clean (deploy/main_zllm-deploy.c)
LDLIBS_deploy := -lm -lpthread
LDLIBS_http    = $(LDLIBS) $(HTTP_LIBS)
define MAIN_RULE
$(BUILD)/bin/$(patsubst main_%.c,%,$(notdir $(1))): $(BUILD)/obj/$(2)/$(basename $(notdir $(1))).o $$(call libs_of,$$(LINK_$(2)))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) -o $$@ $$< $$(LINK_$(2)) $$(or $$(LDLIBS_$(2)),$$(LDLIBS)) $$(XLIBS_$(2))
endef
$(foreach f,$(MAIN_C),$(eval $(call MAIN_RULE,$(f),$(patsubst %/,%,$(dir $(f))))))

$(BUILD)/tests/test_%: tests/test_%.c tests/test.h $(call libs_of,$(LINK_tests))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_tests) $(LDFLAGS) -o $@ $< $(LINK_tests) $(LDLIBS) $(XLIBS_tests)
# test headers beyond test.h (the tests build without dependency files)
$(BUILD)/tests/test_oracle: tests/oracle_check.h

# the sanitizer build of the library (no CUDA), made by a sub-make that checks its own dependencies: tests
# relink only when an archive changed
$(ASAN_LIBS) &: FORCE
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=address,undefined ZLLM_CUDA=0 libs
FORCE:
asan-libs: $(ASAN_LIBS)

$(BUILD)/tests/test_asan_%: tests/test_asan_%.c tests/test.h $(ASAN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(INC_tests) $(ASAN_FLAGS) -o $@ $< $(ASAN_LINK) $(LDLIBS)

# fuzz targets: replay driver (reads files/dirs given on the command line, or a built-in corpus) for CI, under ASan
$(BUILD)/tests/fuzz_%: tests/fuzz_%.c tests/fuzz_main.h $(ASAN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(INC_tests) $(ASAN_FLAGS) -DFUZZ_REPLAY_MAIN -o $@ $< \
	    $(ASAN_LINK) $(LDLIBS)

# the gateway's fuzz targets also link its layer and libraries
$(BUILD)/tests/fuzz_http_%: tests/fuzz_http_%.c tests/fuzz_main.h $(ASAN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(INC_tests) $(INC_http) $(ASAN_FLAGS) -DFUZZ_REPLAY_MAIN -o $@ $< \
	    $(BUILD)/asan/lib/libzllm_http.a $(ASAN_LINK) $(LDLIBS) $(HTTP_LIBS)

# zllm-http under ASan+UBSan, for tests/test_http_hostile.py (the HTTP and JSON layers facing hostile clients)
$(BUILD)/tests/zllm-http-asan: http/main_zllm-http.c $(ASAN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DZLLM_HAVE_CUDA=1,$(CFLAGS)) $(INC_http) $(ASAN_FLAGS) -o $@ $< \
	    $(foreach d,http clients common,$(BUILD)/asan/lib/libzllm_$(d).a) $(LDLIBS) $(HTTP_LIBS)

# libFuzzer builds (clang): make fuzz, then $(BUILD)/fuzz/fuzz_NAME corpus_dir
fuzz:
	$(MAKE) BUILD=$(BUILD)/fuzzlib CC=clang SAN=address,fuzzer-no-link ZLLM_CUDA=0 libs
	@mkdir -p $(BUILD)/fuzz
	for f in $(FUZZ_C); do n=$$(basename $$f .c); \
	  clang -std=c11 -g -O1 -D_GNU_SOURCE -fsanitize=address,fuzzer $(INC_tests) $(INC_http) -o $(BUILD)/fuzz/$$n $$f \
	    $(foreach d,$(if $(HTTP_OK),http) tools deploy worker broker clients engine common,$(BUILD)/fuzzlib/lib/libzllm_$(d).a) \
	    $(LDLIBS) $(HTTP_LIBS) || exit 1; \
	  mkdir -p $(BUILD)/fuzz/corpus/$$n && ZLLM_FUZZ_SEED_DIR=$(BUILD)/fuzz/corpus/$$n $(BUILD)/fuzz/$$n || exit 1; done

# every libFuzzer target in turn for FUZZ_SECONDS each on its corpus (docs/fuzzing.md); crashes land in $(BUILD)/fuzz
FUZZ_SECONDS ?= 600
fuzz-long: fuzz
	for f in $(FUZZ_C); do n=$$(basename $$f .c); \
	  $(BUILD)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$n- \
	    $(BUILD)/fuzz/corpus/$$n || exit 1; done

# compiled by nvcc, linked by $(CC) (nvcc does not take -Wl,-rpath)
$(BUILD)/tests/gpu_test_%: cuda/test_%.cu $(call libs_of,$(LINK_tests))
	@mkdir -p $(dir $@) $(BUILD)/obj/cuda
	$(NVCC) $(NVCCFLAGS) $(INC_tests) -c $< -o $(BUILD)/obj/cuda/test_$*.o
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/obj/cuda/test_$*.o $(LINK_tests) $(LDLIBS) $(CUDA_LDLIBS)

build-test: deps
	@echo "zllm: building binaries and tests ($(ARCHS_SAY))"
	@$(MAKE) --no-print-directory $(PAR) all
test: build-test
	@bash tests/run.sh $(BUILD)

# the lab (cuda/lab/): cuda/lab/bench_NAME.cu -> $(BUILD)/bin/zllm-NAMEbench, zllm-qbench, and the lab kernels'
# GPU checks $(BUILD)/lab/gpu_test_* (run by hand: they are not part of make test-gpu)
$(BUILD)/obj/cuda/lab/%.o: cuda/lab/%.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(INC_lab) -MMD -MP -c $< -o $@
$(BUILD)/obj/cuda/lab/%.o: cuda/lab/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_lab) -MMD -MP -c $< -o $@
$(LAB_LIB): $(patsubst %.cu,$(BUILD)/obj/%.o,$(LAB_CU))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/zllm-%bench: cuda/lab/bench_%.cu $(LAB_LIB) $(CUDA_LIB) $(call libs_of,$(LINK_engine))
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(INC_lab) -o $@ $< $(LAB_LIB) $(CUDA_LIB) $(LINK_engine) $(LDLIBS) -lcublasLt -lcublas -lcudart

$(BUILD)/bin/zllm-qbench: $(BUILD)/obj/cuda/lab/qbench.o $(call libs_of,$(LINK_lab))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LINK_lab) $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/lab/gpu_test_%: cuda/lab/test_%.cu $(call libs_of,$(LINK_lab))
	@mkdir -p $(dir $@) $(BUILD)/obj/cuda/lab
	$(NVCC) $(NVCCFLAGS) $(INC_lab) -Itests -c $< -o $(BUILD)/obj/cuda/lab/test_$*.o
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/obj/cuda/lab/test_$*.o $(LINK_lab) $(LDLIBS) $(CUDA_LDLIBS)

# a CUPTI injection library for kernel timelines (cuda/lab/cupti_trace.c, tools/trace_step.py): a measurement tool
trace: $(BUILD)/lib/libzllm_trace.so
$(BUILD)/lib/libzllm_trace.so: cuda/lab/cupti_trace.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 \
	    -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti

test-gpu: all $(GPU_TESTS) $(LAB_TESTS)
	@bash tests/run_gpu.sh $(BUILD)

bench: all $(if $(filter 1,$(ZLLM_CUDA)),$(LAB_BINS) $(LAB_TESTS))
	@bash tests/bench.sh $(BUILD)

# run builds only the three binaries it starts
build-run: deps
	@echo "zllm: building zllm-broker, zllm-worker and zllm ($(ARCHS_SAY))"
	@$(MAKE) --no-print-directory $(PAR) $(RUN_BINS)
run: build-run
	@bash deploy/run-default.sh $(BUILD)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
