#!/usr/bin/env bash
# tests/test_bench_cli.sh: zllm-bench on the CPU engine (stories260K), contiguous and paged KV.
#  - both print a decode row for M = 1, 2 and 4 and the prefill row; --kv-block 16 names its pool, and every
#    sequence's scattered table stays within it (the engine refuses a step whose table names a block past the pool)
#  - --mix 8 adds the table of the same decode steps with an 8-token prompt chunk (M = 1, 2 and 4, each step slower
#    than its decode step), contiguous and paged
#  - a block size the engine refuses and a negative one fail with a message, a --mix outside 0..1048576 with the usage
# Test data: $ZLLM_FIXTURES, else the folder tests/fetch-fixtures.sh prints; a missing file fails the whole test.
# Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=${ZLLM_BUILD:-build}
bench=$build/bin/zllm-bench
fx=${ZLLM_FIXTURES:-$(bash tests/fetch-fixtures.sh)}
model=$fx/stories260K/stories260K.gguf
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$bench" ]; then echo "FAIL: $bench not built"; echo "0 passed, 1 failed"; exit 1; fi
[ -s "$model" ] || { echo "FAIL: missing fixture $model"; echo "0 passed, 1 failed"; exit 1; }

# the rows a run must print: M = 1, 2, 4 with positive tokens/s, and the prefill line
rows_ok() {
    local f=$1 m
    for m in 1 2 4; do
        awk -v m="$m" '$1 == m && $2 > 0 { found = 1 } END { exit !found }' "$f" || return 1
    done
    grep -q '^prefill of 32 tokens: ' "$f"
}
args=(--model "$model" --device cpu --ctx 100 --max-m 4 --steps 3 --prefill 32 --threads 1)

"$bench" "${args[@]}" >"$tmp/flat" 2>"$tmp/err"; rc=$?
check "contiguous run exits 0 (rc $rc: $(cat "$tmp/err"))" [ "$rc" -eq 0 ]
check "contiguous rows" rows_ok "$tmp/flat"
check "contiguous run names no pool" bash -c "! grep -q '^KV: paged' '$tmp/flat'"

for b in 16 1 64; do
    "$bench" "${args[@]}" --kv-block "$b" >"$tmp/paged$b" 2>"$tmp/err"; rc=$?
    check "paged run, blocks of $b, exits 0 (rc $rc: $(cat "$tmp/err"))" [ "$rc" -eq 0 ]
    check "paged rows, blocks of $b" rows_ok "$tmp/paged$b"
    check "paged run names its blocks of $b" grep -q "^KV: paged, blocks of $b rows, tables scattered over a pool of" \
        "$tmp/paged$b"
done

# --mix: the second table, after the decode rows, its steps slower than the decode steps they hold
mix_ok() {
    local f=$1 m
    grep -q '^decode at context 100 with a 8-token prompt chunk (positions 0 to 7) in every step$' "$f" || return 1
    for m in 1 2 4; do
        awk -v m="$m" '/prompt chunk/ { t = 1 } t && $1 == m && NF == 5 && $2 > 0 && $3 > $4 { found = 1 }
                       END { exit !found }' "$f" || return 1
    done
}
for kb in 0 16; do
    "$bench" "${args[@]}" --kv-block "$kb" --mix 8 >"$tmp/mix$kb" 2>"$tmp/err"; rc=$?
    check "--mix 8 (blocks $kb) exits 0 (rc $rc: $(cat "$tmp/err"))" [ "$rc" -eq 0 ]
    check "--mix 8 (blocks $kb): decode rows" rows_ok "$tmp/mix$kb"
    check "--mix 8 (blocks $kb): the mixed steps' table" mix_ok "$tmp/mix$kb"
done
"$bench" "${args[@]}" --mix -1 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--mix -1 is a usage error (rc $rc)" [ "$rc" -eq 2 ]
check "--mix -1 prints the usage" grep -q "^usage: zllm-bench" "$tmp/err"
"$bench" "${args[@]}" --mix 1048577 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--mix 1048577 is a usage error (rc $rc)" [ "$rc" -eq 2 ]

# refusals: a size the CPU engine does not take (1..256), and a negative one (usage)
"$bench" "${args[@]}" --kv-block 1000 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--kv-block 1000 fails (rc $rc)" [ "$rc" -eq 1 ]
check "--kv-block 1000 says why" grep -q "KV blocks of 1000 rows" "$tmp/err"
"$bench" "${args[@]}" --kv-block -1 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--kv-block -1 is a usage error (rc $rc)" [ "$rc" -eq 2 ]
check "--kv-block -1 prints the usage" grep -q "^usage: zllm-bench" "$tmp/err"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
