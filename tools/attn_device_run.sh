#!/usr/bin/env bash
# tools/attn_device_run.sh: builds and runs the attention/sampling checks and benchmarks on a GPU machine
# without make (no libzmq needed): nvcc on cuda/attention.cu, cuda/sample.cu and their tests only.
# usage: bash tools/attn_device_run.sh OUTDIR [tests|bench|all] [extra zllm-attentionbench args]
#   ZLLM_ATTN_VARIANTS="HB:BPS:CMIN[:STAGES] ...": also benchmark builds with -DZLLM_ATTN_HEADS_PER_BLOCK=HB
#     -DZLLM_ATTN_BLOCKS_PER_SM=BPS -DZLLM_ATTN_CHUNK_MIN=CMIN -DZLLM_ATTN_STAGES=STAGES (default 4)
#   ZLLM_ATTN_ENV_VARIANTS="PDL=0,L2PF=2 CHUNK_MIN=512 ...": also run the default build with each set of
#     run-time knobs (KEY=VAL sets ZLLM_ATTN_KEY; see cuda/attention.cu)
#   variants run on ZLLM_ATTN_VARIANT_SHAPES (-s list; default: the large shapes of docs/perf.md)
#   ZLLM_ATTN_SKIP_SAMPLE=1 skips gpu_test_sample; ZLLM_ATTN_SKIP_TORCH=1 skips the PyTorch table.
set -u
out=${1:-/tmp/attn-out}; what=${2:-all}; shift 2 || true
mkdir -p "$out" /tmp/attnb
export PATH=/usr/local/cuda/bin:$PATH
F="-O3 -lineinfo -std=c++17 -Icommon -Icuda -Itests -gencode arch=compute_90,code=sm_90"
shapes=${ZLLM_ATTN_VARIANT_SHAPES:-1:65536,1:131072,16:4096,16:8192,64:1024,64:2048,64:4096}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv,noheader
t0=$SECONDS
for v in ${ZLLM_ATTN_VARIANTS:-}; do
    IFS=: read -r hb bps cm stg <<<"$v"
    nvcc $F -DZLLM_ATTN_HEADS_PER_BLOCK=$hb -DZLLM_ATTN_BLOCKS_PER_SM=$bps -DZLLM_ATTN_CHUNK_MIN=$cm \
        -DZLLM_ATTN_STAGES=${stg:-4} -o /tmp/attnb/bench_${v//:/-} cuda/bench_attention.cu cuda/attention.cu \
        cuda/attn_prefill_tc.cu cuda/attn_decode_tc.cu &
done
# the attention module: attention.cu and the tensor-core kernels it dispatches to
ATT="/tmp/attnb/attention.o /tmp/attnb/attn_prefill_tc.o /tmp/attnb/attn_decode_tc.o"
for m in attention attn_prefill_tc attn_decode_tc sample; do nvcc $F -c cuda/$m.cu -o /tmp/attnb/$m.o & done; wait
nvcc $F -o /tmp/attnb/gpu_test_attention cuda/test_attention.cu $ATT &
nvcc $F -o /tmp/attnb/gpu_test_sample cuda/test_sample.cu /tmp/attnb/sample.o engine/sampler.c &
nvcc $F -o /tmp/attnb/zllm-attentionbench cuda/bench_attention.cu $ATT &
wait
echo "build: $((SECONDS - t0))s"
rc=0
if [ "$what" != bench ]; then
    timeout 120 /tmp/attnb/gpu_test_attention >"$out/test_attention.log" 2>&1 || rc=1
    tail -n 1 "$out/test_attention.log"; grep FAIL "$out/test_attention.log" | head -20
    if [ -z "${ZLLM_ATTN_SKIP_SAMPLE:-}" ]; then
        timeout 120 /tmp/attnb/gpu_test_sample >"$out/test_sample.log" 2>&1 || rc=1
        grep -E "draws|FAIL|passed" "$out/test_sample.log" | head -30
    fi
    echo "tests: $((SECONDS - t0))s"
fi
if [ "$what" != tests ]; then
    timeout 200 /tmp/attnb/zllm-attentionbench "$@" >"$out/bench.log" 2>&1; grep -v "^read kernel" "$out/bench.log"
    echo "bench: $((SECONDS - t0))s"
    i=0
    for ev in ${ZLLM_ATTN_ENV_VARIANTS:-}; do
        i=$((i + 1))
        echo "== run-time variant $ev"
        envs=()
        IFS=, read -ra kv <<<"$ev"
        for a in "${kv[@]}"; do envs+=("ZLLM_ATTN_$a"); done
        env "${envs[@]}" timeout 60 /tmp/attnb/zllm-attentionbench -n 15 -s "$shapes" >"$out/benchenv_$i.log" 2>&1
        grep -v "^read kernel\|^device\|^read-only\|^batch" "$out/benchenv_$i.log"
    done
    for v in ${ZLLM_ATTN_VARIANTS:-}; do
        echo "== build variant heads/block:blocks/SM:chunk min:stages $v"
        timeout 60 /tmp/attnb/bench_${v//:/-} -n 15 -s "$shapes" >"$out/bench_${v//:/-}.log" 2>&1
        grep -v "^read kernel\|^device\|^read-only\|^batch" "$out/bench_${v//:/-}.log"
    done
    echo "variants: $((SECONDS - t0))s"
    if [ -z "${ZLLM_ATTN_SKIP_TORCH:-}" ]; then
        PYTHONUNBUFFERED=1 timeout ${ZLLM_ATTN_TORCH_TIMEOUT:-150} python3 tools/attn_bench_torch.py "$@" >"$out/torch.log" 2>&1
        cat "$out/torch.log"
        echo "torch: $((SECONDS - t0))s"
    fi
fi
exit $rc
