#!/usr/bin/env bash
# tests/bench_structured.sh BUILD [DEVICE] [MODEL]: structured output's cost on the whole stack
# (docs/structured-output.md). A broker and one worker on DEVICE (default cuda) serving MODEL (default SmolLM2-135M,
# deploy/fetch-model.sh); `zllm bench` at concurrency 64 (64 requests in flight, 512 in all, 128 output tokens
# each) without a constraint, then with a JSON schema on every request (an array of short strings: long enough
# that sequences run to max_tokens), then again without; prints both throughputs and their ratio (the target is
# >= 0.90 on CUDA), then the worker's host time per step by phase (zllm-worker --phase-times 1), for the steps
# with grammars and those without (docs/structured-output.md "Where a step's host time goes"). Run by hand (a GPU
# machine): not part of make test or make test-gpu. ZLLM_BENCH_N, _C and _OUT change the requests, the
# concurrency and the output tokens (a quick CPU try: 16, 8, 32); ZLLM_BENCH_WORKER_ARGS adds worker options;
# ZLLM_BENCH_SCHEMA=FILE replaces the schema. Each run also shows its output tokens per request: a schema whose
# document the model completes before max_tokens ends requests early, and the steps that admit the next ones carry
# prompt tokens (the phase report's "with prompt tokens"; on CUDA such a step runs eagerly, not as a graph).
set -euo pipefail
build=${1:-build}
dev=${2:-cuda}
cd "$(dirname "$0")/.."
model=${3:-$(bash deploy/fetch-model.sh)}
tmp=$(mktemp -d /tmp/zllm-bench-structured.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
"$build/bin/zllm-broker" --clients "ipc://$tmp/c" --workers "ipc://$tmp/w" --model "m=$model" >"$tmp/broker.log" 2>&1 &
"$build/bin/zllm-worker" --broker "ipc://$tmp/w" -m "$model" --model-name m --name w1 --device "$dev" \
    --max-batch "${ZLLM_BENCH_C:-64}" --phase-times 1 ${ZLLM_BENCH_WORKER_ARGS:-} >"$tmp/worker.log" 2>&1 &
worker=$!
for _ in $(seq 120); do
    "$build/bin/zllm" status --broker "ipc://$tmp/c" 2>/dev/null | grep -q "w1" && break
    sleep 1
done
if [ -n "${ZLLM_BENCH_SCHEMA:-}" ]; then
    cp "$ZLLM_BENCH_SCHEMA" "$tmp/schema.json"
else
    cat >"$tmp/schema.json" <<'JSON'
{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 12}}},
 "required": ["items"], "additionalProperties": false}
JSON
fi
run() {   # label, extra args -> output tokens/s
    local out
    out=$("$build/bin/zllm" bench --broker "ipc://$tmp/c" -N "${ZLLM_BENCH_N:-512}" -c "${ZLLM_BENCH_C:-64}" \
        --prompt-len 32 --out-len "${ZLLM_BENCH_OUT:-128}" "${@:2}")
    local line
    line=$(echo "$out" | grep 'output tokens/s')
    echo "$1: $line, $(echo "$line" | python3 -c "import re, sys; t = sys.stdin.read(); \
r = float(re.search(r'([0-9.]+) requests/s', t).group(1)); o = float(re.search(r'([0-9.]+) output tokens/s', t).group(1)); \
print('%.1f output tokens per request' % (o / r if r else 0))")" >&2
    echo "$out" | sed -n 's/.* \([0-9.]*\) output tokens\/s.*/\1/p'
}
run "warm-up" >/dev/null
a=$(run "unconstrained")
b=$(run "json_schema on every request" --json-schema "@$tmp/schema.json")
c=$(run "unconstrained again")
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); base = (a + c) / 2; \
print('structured/unconstrained throughput: %.3f (%.1f vs %.1f tokens/s)' % (b / base, b, base))" "$a" "$b" "$c"
kill -TERM "$worker"
wait "$worker" || true
sed -n 's/.*zllm-worker w1: \(phase times.*\)/\1/p' "$tmp/worker.log"
