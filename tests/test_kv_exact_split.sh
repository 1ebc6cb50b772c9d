#!/usr/bin/env bash
# tests/test_kv_exact_split.sh: tests/test_kv_exact.py (2000 requests) against a paged CPU worker that follows the
# rule of engines whose decode and prefill kernels differ (zllm-worker --debug-kv-split 1, the CUDA engine's
# batcher paths: only prompt rows published, a resumed sequence's generated tokens replayed as decode entries),
# with steps queued ahead (the CUDA worker's way); it must replay. ZLLM_BUILD as for that test.
set -u
cd "$(dirname "$0")/.."
ZLLM_KV_EXACT_N=${ZLLM_KV_EXACT_N:-2000} ZLLM_KV_EXACT_ALONE=${ZLLM_KV_EXACT_ALONE:-20} ZLLM_KV_EXACT_REPLAYS=1 \
    ZLLM_KV_EXACT_WORKER_ARGS="--debug-kv-split 1 --ahead 1 ${ZLLM_KV_EXACT_WORKER_ARGS:-}" \
    exec python3 tests/test_kv_exact.py
