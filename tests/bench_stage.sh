#!/usr/bin/env bash
# tests/bench_stage.sh BUILD [PRESET TYPE]: decode tokens/s of one GPU against a 2-stage pipeline (GPU transport,
# worker/stage_cuda.c), for the 2-GPU rows of docs/perf.md. Makes a zllm-mkmodel model (default the
# Llama-3.1-8B shape in BF16, as tests/bench.sh with ZLLM_BENCH_8B=1) once under $ZLLM_BENCH_DIR (default
# BUILD/bench), then runs gpu_test_stage_gpu --bench: 64 sequences decoding at context 1024 (each step reads
# 1024 tokens of KV per sequence, as zllm-bench), first on cuda:0 alone, then as stage 0 on cuda:0 + stage 1 on
# cuda:1 (cuda:0 again when only one GPU is visible). Knobs (environment): BATCH (64), CTX (1024), STEPS (32),
# MICRO (micro-batches per step, 2). Needs: make BUILD=... ZLLM_CUDA=1 all build/tests/gpu_test_stage_gpu.
set -euo pipefail
build=${1:-build}
preset=${2:-llama-3.1-8b}
type=${3:-bf16}
cd "$(dirname "$0")/.."
dir=${ZLLM_BENCH_DIR:-$build/bench}
mkdir -p "$dir"
model=$dir/$preset-$type.gguf
[ -s "$model" ] || "$build/bin/zllm-mkmodel" -o "$model" --preset "$preset" --type "$type" --threads "$(nproc)" >&2
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
"$build/tests/gpu_test_stage_gpu" --bench "$model" --batch "${BATCH:-64}" --ctx "${CTX:-1024}" \
    --steps "${STEPS:-32}" --micro "${MICRO:-2}"
