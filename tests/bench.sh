#!/usr/bin/env bash
# tests/bench.sh BUILD: what `make bench` runs. zllm-bench on a zllm-mkmodel Llama-3.2-1B-shaped BF16 model
# (made here, once, under $ZLLM_BENCH_DIR, default BUILD/bench) at a 1k context, M = 1 .. 256; then the
# Llama-3.1-8B shape when ZLLM_BENCH_8B=1. Extra arguments go to zllm-bench.
set -euo pipefail
build=${1:-build}; shift || true
cd "$(dirname "$0")/.."
dir=${ZLLM_BENCH_DIR:-$build/bench}
mkdir -p "$dir"
mk() {   # preset type -> path
    local f=$dir/$1-$2.gguf
    [ -s "$f" ] || "$build/bin/zllm-mkmodel" -o "$f" --preset "$1" --type "$2" --threads "$(nproc)" >&2
    echo "$f"
}
m1=$(mk llama-3.2-1b bf16)
"$build/bin/zllm-bench" --model "$m1" --ctx 1024 --max-m 256 "$@"
if [ "${ZLLM_BENCH_8B:-0}" = 1 ]; then
    m8=$(mk llama-3.1-8b bf16)
    "$build/bin/zllm-bench" --model "$m8" --ctx 1024 --max-m 256 "$@"
fi
