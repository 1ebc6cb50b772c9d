#!/usr/bin/env bash
# tests/bench.sh BUILD: what `make bench` runs. zllm-bench on a zllm-mkmodel Llama-3.2-1B-shaped BF16 model
# (made here, once, under $ZLLM_BENCH_DIR, default BUILD/bench) at a 1k context, M = 1 .. 256; then the
# Llama-3.1-8B shape when ZLLM_BENCH_8B=1, the quantized shapes when ZLLM_BENCH_QUANT=1. After each BF16 shape the
# PyTorch + transformers peer runs on the same shape and prints zllm/peer for decode (M = 1, 64, 256) and prefill.
# Extra arguments go to the first two zllm-bench runs.
# ZLLM_BENCH_ATTN=1 adds the decode attention kernels alone (zllm-attentionbench, every shape
# after a 1 s idle) beside PyTorch's scaled_dot_product_attention on the same shapes.
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
# the PyTorch + transformers peer on the same shape right after zllm-bench, with zllm/peer ratios read from
# zllm-bench's output (needs torch and transformers; skipped without them). zllm-bench prefills ctx tokens here.
peer() {   # preset zllm-output
    if python3 -c 'import torch, transformers' 2>/dev/null; then
        python3 tools/bench_torch_peer.py --preset "$1" --ctx 1024 --m 1,64,256 --prefill 1024 --zllm "$2"
    else echo "(PyTorch + transformers not installed: no peer)"; fi
}
m1=$(mk llama-3.2-1b bf16)
"$build/bin/zllm-bench" --model "$m1" --ctx 1024 --max-m 256 "$@" | tee "$dir/zllm-1b.txt"
peer llama-3.2-1b "$dir/zllm-1b.txt"
if [ "${ZLLM_BENCH_8B:-0}" = 1 ]; then
    m8=$(mk llama-3.1-8b bf16)
    "$build/bin/zllm-bench" --model "$m8" --ctx 1024 --max-m 256 "$@" | tee "$dir/zllm-8b.txt"
    peer llama-3.1-8b "$dir/zllm-8b.txt"
fi
# ZLLM_BENCH_QUANT=1: the 8B shape in Q4_K_M and Q8_0, and Qwen2.5-1.5B Q4_K_M (docs/perf.md's quantized rows)
if [ "${ZLLM_BENCH_QUANT:-0}" = 1 ]; then
    for spec in "llama-3.1-8b q4_k_m 64" "llama-3.1-8b q8_0 16" "qwen2.5-1.5b q4_k_m 16"; do
        set -- $spec
        "$build/bin/zllm-bench" --model "$(mk "$1" "$2")" --ctx 1024 --max-m "$3" --prefill 0
    done
fi
# ZLLM_BENCH_ATTN=1: decode attention alone, 32/8 heads x 128, BF16, batch 1/16/64 x 1k..128k, beside SDPA
if [ "${ZLLM_BENCH_ATTN:-0}" = 1 ]; then
    "$build/bin/zllm-attentionbench" -n 20 --settle 1000
    if python3 -c 'import torch' 2>/dev/null; then python3 tools/attn_bench_torch.py -n 20
    else echo "(PyTorch not installed: no SDPA table)"; fi
fi
