#!/usr/bin/env bash
# tests/run.sh BUILD: runs every test program and test script, adds up their closing
# "N passed, N failed" lines, and prints the grand total as the last line.
# ZLLM_TEST_FILTER=regex runs only the matching tests. A test still running after ZLLM_TEST_TIMEOUT seconds
# (default 900) is stopped and counts as failed.
# Test data comes from $ZLLM_FIXTURES when set, else from the folder tests/fetch-fixtures.sh assembles in the cache
# (fetching what it lacks once); the default model comes from deploy/fetch-model.sh (cached likewise). Both fetch
# here, before any test runs, with their progress on the terminal; a fetch that fails counts as one failure and the
# tests still run, so each one that misses a file fails and names it.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
export ZLLM_BUILD=$build
filter=${ZLLM_TEST_FILTER:-.}
tp=0; tf=0; bad=()
if [ -z "${ZLLM_FIXTURES:-}" ]; then
    ZLLM_FIXTURES=$(bash tests/fetch-fixtures.sh)
    if [ $? -ne 0 ]; then tf=$((tf + 1)); bad+=(fetch-fixtures.sh); echo "FAIL tests/fetch-fixtures.sh"; fi
fi
export ZLLM_FIXTURES
echo "fixtures: $ZLLM_FIXTURES"
if model=$(bash deploy/fetch-model.sh); then echo "default model: $model"; else
    tf=$((tf + 1)); bad+=(fetch-model.sh); echo "FAIL deploy/fetch-model.sh"; fi
run_one() {   # name, command...
    local name=$1; shift
    local log; log=$(mktemp)
    local t0=$SECONDS
    timeout -k 10 "${ZLLM_TEST_TIMEOUT:-900}" "$@" >"$log" 2>&1; local rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "timed out after ${ZLLM_TEST_TIMEOUT:-900} s" >>"$log"
    local line; line=$(grep -E '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    local p=0 f=0
    if [ -n "$line" ]; then
        p=$(echo "$line" | sed -E 's/^([A-Za-z]+: )?([0-9]+) passed.*/\2/')
        f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ -z "$line" ] && [ $rc -eq 0 ]; then p=1; fi
    tp=$((tp + p)); tf=$((tf + f))
    if [ "$f" -ne 0 ]; then
        bad+=("$name"); echo "FAIL $name (rc=$rc, $p passed, $f failed, $((SECONDS - t0))s)"; tail -n 30 "$log" | sed 's/^/    /'
    else
        echo "ok   $name ($p passed, $((SECONDS - t0))s)"
    fi
    rm -f "$log"
}
for t in "$build"/tests/test_* "$build"/tests/fuzz_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t"); [[ $n =~ $filter ]] || continue
    run_one "$n" "$t"
done
for s in tests/test_*.sh tests/test_*.py; do
    [ -f "$s" ] || continue
    n=$(basename "$s"); [[ $n =~ $filter ]] || continue
    case "$s" in *.sh) run_one "$n" bash "$s" ;; *.py) run_one "$n" python3 "$s" ;; esac
done
[ ${#bad[@]} -gt 0 ] && echo "failed: ${bad[*]}"
echo "$tp passed, $tf failed"
[ "$tf" -eq 0 ]
