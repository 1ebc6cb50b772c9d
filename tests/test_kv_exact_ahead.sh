#!/usr/bin/env bash
# tests/test_kv_exact_ahead.sh: tests/test_kv_exact.py (2000 requests) against a paged worker that queues its steps
# ahead (zllm-worker --ahead 1 on the CPU engine: fed entries through the block tables, blocks of sequences with a
# step in flight never preempted or released), the CUDA worker's way of running. ZLLM_BUILD as for that test.
set -u
cd "$(dirname "$0")/.."
ZLLM_KV_EXACT_N=${ZLLM_KV_EXACT_N:-2000} ZLLM_KV_EXACT_ALONE=${ZLLM_KV_EXACT_ALONE:-20} \
    ZLLM_KV_EXACT_WORKER_ARGS="--ahead 1 ${ZLLM_KV_EXACT_WORKER_ARGS:-}" exec python3 tests/test_kv_exact.py
