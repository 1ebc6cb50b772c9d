#!/usr/bin/env bash
# tests/test_run.sh: zllm-run end to end on the CPU.
#  - stories260K greedy from BOS: exactly the 200 ids and the text (byte for byte) that llama2.c's run.c produced
#  - a prompt that is the golden run's own first 4 tokens continues exactly as the golden run (prefill path)
#  - thread count and sampling seed: same seed => same tokens, other seed => other tokens
#  - the committed mkmodel llama / qwen2 models generate; bad arguments and files fail cleanly
#  - SmolLM2-135M-Instruct Q4_1 (deploy/fetch-model.sh) answers a factual prompt, raw and through its chat template
# Test data: $ZLLM_FIXTURES, else the folder tests/fetch-fixtures.sh prints; a missing file fails the whole test.
# Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=${ZLLM_BUILD:-build}
run=$build/bin/zllm-run
fx=${ZLLM_FIXTURES:-$(bash tests/fetch-fixtures.sh)}
st=$fx/stories260K
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
same() { [ -s "$1" ] && cmp -s "$1" "$2"; }   # equal and not empty
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$run" ]; then echo "FAIL: $run not built"; echo "0 passed, 1 failed"; exit 1; fi
for f in stories260K.gguf golden_greedy_ids.txt golden_greedy_text.txt; do
    [ -s "$st/$f" ] || { echo "FAIL: missing fixture $st/$f"; echo "0 passed, 1 failed"; exit 1; }
done
[ "$(wc -w <"$st/golden_greedy_ids.txt")" -eq 200 ] ||
    { echo "FAIL: $st/golden_greedy_ids.txt does not hold 200 ids"; echo "0 passed, 1 failed"; exit 1; }

# golden ids and text
"$run" -m "$st/stories260K.gguf" -n 200 --temp 0 --ids >"$tmp/ids" 2>"$tmp/err"
check "golden ids (stderr: $(cat "$tmp/err"))" same "$tmp/ids" "$st/golden_greedy_ids.txt"
"$run" -m "$st/stories260K.gguf" -n 200 --temp 0 >"$tmp/text" 2>"$tmp/err"
check "golden text" same "$tmp/text" "$st/golden_greedy_text.txt"
"$run" -m "$st/stories260K.gguf" -n 200 --temp 0 --ids --threads 1 >"$tmp/ids1" 2>/dev/null
check "golden ids with one thread" same "$tmp/ids1" "$st/golden_greedy_ids.txt"

# prompt = the golden run's first 4 tokens ("Once upon a time"): the continuation is the golden one
"$run" -m "$st/stories260K.gguf" -p "Once upon a time" -n 196 --temp 0 --ids >"$tmp/pids" 2>/dev/null
want=$(cut -d' ' -f5- "$st/golden_greedy_ids.txt")
check "prompt continuation = golden ids[4:]" [ -s "$tmp/pids" -a "$(cat "$tmp/pids")" = "$want" ]

# the golden text begins "Once upon a time, there": 4 tokens after the prompt "Once upon"
"$run" -m "$st/stories260K.gguf" -p "Once upon" -n 4 --temp 0 >"$tmp/cont" 2>/dev/null
check "a continuation keeps its leading space: '$(cat "$tmp/cont")'" [ "$(cat "$tmp/cont")" = " a time, there" ]

# -n limits; sampling determinism
"$run" -m "$st/stories260K.gguf" -n 7 --temp 0 --ids >"$tmp/n7" 2>/dev/null
check "-n 7 gives 7 ids" [ "$(wc -w <"$tmp/n7")" -eq 7 ]
samp() { "$run" -m "$st/stories260K.gguf" -n 60 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed "$1" --ids 2>/dev/null; }
samp 42 >"$tmp/s42.1"; samp 42 >"$tmp/s42.2"; samp 43 >"$tmp/s43.3"
check "same seed, same tokens" same "$tmp/s42.1" "$tmp/s42.2"
check "other seed, other tokens" bash -c "[ -s '$tmp/s43.3' ] && ! cmp -s '$tmp/s42.1' '$tmp/s43.3'"
cut -d' ' -f1-60 "$st/golden_greedy_ids.txt" >"$tmp/g60"
check "sampled run differs from greedy" bash -c "[ -s '$tmp/s42.1' ] && ! cmp -s '$tmp/g60' '$tmp/s42.1'"
"$run" -m "$st/stories260K.gguf" -n 60 --temp 0.7 --top-k 20 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.3 \
    --seed 7 --threads 1 >"$tmp/a" 2>/dev/null
"$run" -m "$st/stories260K.gguf" -n 60 --temp 0.7 --top-k 20 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.3 \
    --seed 7 --threads 2 >"$tmp/b" 2>/dev/null
check "all samplers, seeded: threads 1 = threads 2" same "$tmp/a" "$tmp/b"
check "sampled text is not empty" [ "$(wc -c <"$tmp/a")" -gt 20 ]

# committed synthetic models (tiny llama / qwen2 from zllm-mkmodel)
for m in tiny-llama tiny-qwen2; do
    "$run" -m "tests/ref/$m.gguf" -n 20 --temp 0 --ids >"$tmp/$m" 2>"$tmp/err"
    check "$m generates ($(cat "$tmp/err"))" grep -Eq '^[0-9]+( [0-9]+)*$' "$tmp/$m"
done

# failures: exit code and a message naming the problem
"$run" -m "$tmp/none.gguf" >/dev/null 2>"$tmp/err"; rc=$?
check "missing model fails" [ $rc -ne 0 ]
check "missing model message" grep -q "none.gguf" "$tmp/err"
"$run" -m "$st/stories260K.gguf" --bogus >/dev/null 2>&1; rc=$?
check "unknown option exits 2" [ $rc -eq 2 ]
"$run" -m "$st/stories260K.gguf" --temp abc >/dev/null 2>&1; rc=$?
check "bad number exits 2" [ $rc -eq 2 ]
"$run" -m "$st/stories260K.gguf" --device tpu >/dev/null 2>"$tmp/err"; rc=$?
check "unknown device fails with a message" bash -c "[ $rc -ne 0 ] && grep -q tpu '$tmp/err'"
"$run" -m "$st/stories260K.gguf" --chat -p hi >/dev/null 2>"$tmp/err"; rc=$?
check "--chat without a template fails with a message" bash -c "[ $rc -ne 0 ] && grep -q template '$tmp/err'"
head -c 1000 "$st/stories260K.gguf" >"$tmp/trunc.gguf"
"$run" -m "$tmp/trunc.gguf" >/dev/null 2>"$tmp/err"; rc=$?
check "truncated model fails" bash -c "[ $rc -ne 0 ] && [ -s '$tmp/err' ]"

# the real chat model (Q4_1): a factual answer, raw and through the chat template
if smol=$(bash deploy/fetch-model.sh 2>"$tmp/err") && [ -s "$smol" ]; then
    "$run" -m "$smol" -p "The capital of France is" -n 6 --temp 0 >"$tmp/smol" 2>"$tmp/err"
    check "SmolLM2 raw prompt says Paris: $(cat "$tmp/smol")" grep -q "Paris" "$tmp/smol"
    "$run" -m "$smol" --chat -p "What is the capital of France? Answer in one word." -n 12 --temp 0 >"$tmp/chat" 2>"$tmp/err"
    check "SmolLM2 --chat says Paris: $(cat "$tmp/chat") $(cat "$tmp/err")" grep -q "Paris" "$tmp/chat"
else
    bad "deploy/fetch-model.sh failed: $(cat "$tmp/err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
