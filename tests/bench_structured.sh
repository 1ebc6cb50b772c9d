#!/usr/bin/env bash
# tests/bench_structured.sh BUILD [DEVICE] [MODEL]: structured output's cost on the whole stack
# (docs/structured-output.md). A broker and one worker on DEVICE (default cuda) serving MODEL (default SmolLM2-135M,
# deploy/fetch-model.sh); `zllm bench` at concurrency 64 (64 requests in flight, 512 in all, 128 output tokens
# each) without a constraint, then with a JSON schema on every request, then again without, then with two more
# schemas; prints each constrained run's throughput over the unconstrained one's (the target is >= 0.90 on CUDA),
# over the whole run and over zllm bench's steady window, then the worker's host time per step by phase for each
# run (zllm-worker --phase-times 1, its lines taken with SIGUSR1 after each run: the steps with grammars and those
# without; docs/structured-output.md "Where a step's host time goes"). The three schemas: an array of strings of
# at most 12 characters (a model completes it early: requests end before max_tokens and the steps that admit the
# next ones carry prompt tokens, which on CUDA run eagerly, not as graphs); strings of any length (seldom
# completed: the masks' cost with little churn); at least 200 strings (never completed within 128 tokens: every
# request runs to max_tokens as the unconstrained ones do, so the two runs differ only by the constraint). Each
# run also shows its output tokens per request and finishes. Run by hand (a GPU machine): not part of make test
# or make test-gpu. ZLLM_BENCH_N, _C and _OUT change the requests, the concurrency and the output tokens (a quick
# CPU try: 16, 8, 32); ZLLM_BENCH_WORKER_ARGS adds worker options; ZLLM_BENCH_SCHEMA=FILE replaces the first
# schema.
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
cat >"$tmp/schema-long.json" <<'JSON'
{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
 "required": ["items"], "additionalProperties": false}
JSON
# at least 200 items: no request can complete the schema within its output tokens, so every one runs to
# max_tokens as the unconstrained ones do, and the two runs differ only by the constraint
cat >"$tmp/schema-full.json" <<'JSON'
{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 200}},
 "required": ["items"], "additionalProperties": false}
JSON
run() {   # label, extra args -> output tokens/s
    local out
    out=$("$build/bin/zllm" bench --broker "ipc://$tmp/c" -N "${ZLLM_BENCH_N:-512}" -c "${ZLLM_BENCH_C:-64}" \
        --prompt-len 32 --out-len "${ZLLM_BENCH_OUT:-128}" "${@:2}")
    local line
    line=$(echo "$out" | grep 'output tokens/s')
    echo "$1: $line, $(echo "$out" | python3 -c "import re, sys; t = sys.stdin.read(); \
ok = int(re.search(r'requests: [0-9]+ \(([0-9]+) ok', t).group(1)); w = float(re.search(r'wall ([0-9.]+) s', t).group(1)); \
o = float(re.search(r'([0-9.]+) output tokens/s', t).group(1)); \
f = re.search(r'requests: [0-9]+ \([0-9]+ ok([^)]*)\)', t).group(1); \
print('%.1f output tokens per request (finish%s)' % (o * w / ok if ok else 0, f))")" >&2
    # "WALL STEADY": output tokens/s over the whole run and over its steady window (zllm bench's steady: line)
    echo "$(echo "$out" | grep '^wall ' | sed -n 's/.* \([0-9.]*\) output tokens\/s.*/\1/p')" \
        "$(echo "$out" | sed -n 's/^steady: \([0-9.]*\) output tokens\/s.*/\1/p')"
    # the worker's phase lines of this run (SIGUSR1 logs them and starts afresh)
    local n
    n=$(grep -c 'phase times, steps without' "$tmp/worker.log" || true)
    kill -USR1 "$worker"
    for _ in $(seq 100); do
        [ "$(grep -c 'phase times, steps without' "$tmp/worker.log" || true)" -gt "$n" ] && break
        sleep 0.1
    done
    grep 'phase times' "$tmp/worker.log" | tail -n 2 | sed "s/^.*zllm-worker w1: /$1: /" >>"$tmp/phases.txt"
}
run "warm-up" >/dev/null
a=$(run "unconstrained")
b=$(run "json_schema on every request" --json-schema "@$tmp/schema.json")
c=$(run "unconstrained again")
d=$(run "json_schema of unbounded strings on every request" --json-schema "@$tmp/schema-long.json")
e=$(run "json_schema of at least 200 strings on every request" --json-schema "@$tmp/schema-full.json")
python3 -c "import sys; a, b, c, d, e = [list(map(float, x.split())) for x in sys.argv[1:]]; \
ok = lambda k: all(len(x) > k for x in (a, b, c, d, e)); \
[print('%s/unconstrained throughput, %s: %.3f (%.1f vs %.1f tokens/s)' % \
       (n, w, x[k] / ((a[k] + c[k]) / 2), x[k], (a[k] + c[k]) / 2)) \
 for n, x in (('structured', b), ('unbounded strings', d), ('at least 200 strings', e)) for k, w in ((0, 'whole run'), (1, 'steady window')) \
 if ok(k)]" "$a" "$b" "$c" "$d" "$e"
echo "the worker's host time per step, by run (docs/structured-output.md, \"Where a step's host time goes\"):"
grep -v -e '^warm-up: ' -e ': 0 steps (' "$tmp/phases.txt"
