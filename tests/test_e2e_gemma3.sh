#!/usr/bin/env bash
# tests/test_e2e_gemma3.sh [DEVICE]: a broker and a worker on DEVICE (default cpu; make test-gpu runs it on cuda) serve
# the random gemma3 and Mistral-style models of tests/data/oracle (sliding window 16) over ipc sockets: 4 concurrent
# greedy requests of oracle prompt 0 (80 token ids) each give transformers' 40-token greedy continuation recorded in
# the case's .txt (its greedy line; tests/oracle/make_oracle.py; no near tie in it), past the window. ZLLM_BUILD names the build
# folder (default build). A missing file fails. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=${ZLLM_BUILD:-build}
dev=${1:-cpu}
wk=$build/bin/zllm-worker; bk=$build/bin/zllm-broker; cl=$build/bin/zllm
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
for x in "$wk" "$bk" "$cl"; do
    [ -x "$x" ] || { echo "FAIL: $x not built"; echo "0 passed, 1 failed"; exit 1; }
done
for name in gemma3-swa mistral-swa; do
    mdl=tests/data/oracle/$name.gguf js=tests/data/oracle/$name.txt d=$tmp/$name
    mkdir -p "$d"
    if [ ! -s "$mdl" ] || [ ! -s "$js" ]; then echo "FAIL: missing $mdl or $js"; fail=$((fail + 1)); continue; fi
    # the .txt (tests/oracle_check.h): "greedy N ids...", then "prompt N_TOKENS N_CTX N_CHECKS" with its tokens on
    # the next line
    python3 - "$js" "$d/prompt" "$d/gold" <<'PY'
import sys
lines = [x.split() for x in open(sys.argv[1]) if not x.startswith("#")]
greedy = next(x[2:] for x in lines if x and x[0] == "greedy")
p0 = next(i for i, x in enumerate(lines) if x and x[0] == "prompt")
assert len(lines[p0 + 1]) == int(lines[p0][1]) and len(greedy) == int(next(x[1] for x in lines if x[0] == "greedy"))
open(sys.argv[2], "w").write(",".join(lines[p0 + 1]))
open(sys.argv[3], "w").write(" ".join(greedy))
PY
    "$bk" --clients "ipc://$d/c" --workers "ipc://$d/w" --model "g=$mdl" >"$d/broker.log" 2>&1 &
    bpid=$!
    "$wk" --broker "ipc://$d/w" -m "$mdl" --model-name g --device "$dev" --max-batch 8 --ctx 256 >"$d/worker.log" 2>&1 &
    wpid=$!
    ok=0
    for i in $(seq 100); do
        kill -0 "$bpid" 2>/dev/null && kill -0 "$wpid" 2>/dev/null || break
        timeout 5 "$cl" status --broker "ipc://$d/c" 2>/dev/null | grep -q "device $dev" && { ok=1; break; }
        sleep 0.2
    done
    if [ $ok -ne 1 ]; then
        echo "FAIL $name: worker not ready; broker log:"; tail -n 10 "$d/broker.log"
        echo "worker log:"; tail -n 10 "$d/worker.log"
        fail=$((fail + 1))
    else
        pids=()
        for i in 1 2 3 4; do
            "$cl" generate --broker "ipc://$d/c" --model g --tokens "$(cat "$d/prompt")" --ids -n 40 --temp 0 \
                --ignore-eos >"$d/ids$i" 2>"$d/err$i" &
            pids+=($!)
        done
        wait "${pids[@]}"
        for i in 1 2 3 4; do
            tr -s ' \n' '  ' <"$d/ids$i" | sed 's/^ *//; s/ *$//' >"$d/got$i"
            if [ -s "$d/got$i" ] && [ "$(cat "$d/got$i")" = "$(cat "$d/gold")" ]; then pass=$((pass + 1)); else
                fail=$((fail + 1)); echo "FAIL $name request $i: not transformers' ids:"; head -c 300 "$d/got$i"
                echo; head -c 300 "$d/err$i"; fi
        done
    fi
    kill "$wpid" "$bpid" 2>/dev/null; wait "$wpid" "$bpid" 2>/dev/null
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
