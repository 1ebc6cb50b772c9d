#!/usr/bin/env bash
# tests/test_worker_golden.sh [DEVICE]: a broker and a worker on DEVICE (default cpu; make test-gpu runs it on cuda)
# serve stories260K over ipc sockets: 4 concurrent greedy requests from BOS each give llama2.c's 200 golden ids, and
# two concurrent sampled requests with one seed give the same 64 ids. Three times: with steps queued ahead
# (zllm-worker --ahead 1), without (--ahead 0), and as the device's default (on for cuda, off for cpu); the worker's start
# line must say which. Then twice more with paged KV of 80 blocks of 16 tokens (--kv-blocks 80), queued ahead and
# not: the start line must say "paged KV".
# ZLLM_BUILD names the build folder (default build); test data comes from $ZLLM_FIXTURES, else the folder
# tests/fetch-fixtures.sh prints, and a missing file fails the test. Waiting for the worker to register stops as
# soon as the broker or the worker has exited, with their log tails. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=${ZLLM_BUILD:-build}
dev=${1:-cpu}
st=${ZLLM_FIXTURES:-$(bash tests/fetch-fixtures.sh)}/stories260K
wk=$build/bin/zllm-worker; bk=$build/bin/zllm-broker; cl=$build/bin/zllm
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for x in "$wk" "$bk" "$cl"; do
    [ -x "$x" ] || { echo "FAIL: $x not built"; echo "0 passed, 1 failed"; exit 1; }
done
for f in stories260K.gguf golden_greedy_ids.txt; do
    [ -s "$st/$f" ] || { echo "FAIL: missing fixture $st/$f"; echo "0 passed, 1 failed"; exit 1; }
done
[ "$(wc -w <"$st/golden_greedy_ids.txt")" -eq 200 ] ||
    { echo "FAIL: $st/golden_greedy_ids.txt does not hold 200 ids"; echo "0 passed, 1 failed"; exit 1; }
worker_golden() {   # DEVICE, 1/0: steps queued ahead expected, extra worker options; prints counts
    local dv=$1 want=$2; shift 2
    local d=$tmp/e2e.$RANDOM pass=0 fail=0 pids=()
    mkdir -p "$d"
    "$bk" --clients "ipc://$d/c" --workers "ipc://$d/w" --model "s=$st/stories260K.gguf" >"$d/broker.log" 2>&1 &
    local bpid=$!
    "$wk" --broker "ipc://$d/w" -m "$st/stories260K.gguf" --model-name s --device "$dv" --max-batch 8 \
        --ctx 256 "$@" >"$d/worker.log" 2>&1 &
    local wpid=$!
    tr -s ' \n' '  ' <"$st/golden_greedy_ids.txt" | sed 's/ *$//' >"$d/gold"
    local ok=0 i
    for i in $(seq 100); do
        kill -0 "$bpid" 2>/dev/null && kill -0 "$wpid" 2>/dev/null || break
        timeout 5 "$cl" status --broker "ipc://$d/c" 2>/dev/null | grep -q "device $dv" && { ok=1; break; }
        sleep 0.2
    done
    if [ $ok -ne 1 ]; then
        kill "$wpid" "$bpid" 2>/dev/null; wait "$wpid" "$bpid" 2>/dev/null
        echo "worker not ready after $i polls; broker log:"; tail -n 10 "$d/broker.log"
        echo "worker log:"; tail -n 10 "$d/worker.log"
        echo "0 passed, 1 failed"
        return 1
    fi
    local have=0; grep -q "steps queued ahead" "$d/worker.log" && have=1
    if [ $have -eq $want ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "worker: steps queued ahead $have, wanted $want"; fi
    case " $* " in *" --kv-blocks "*)
        if grep -q "paged KV" "$d/worker.log"; then pass=$((pass + 1)); else
            fail=$((fail + 1)); echo "worker: no paged KV in its start line"; fi ;;
    esac
    for i in 1 2 3 4; do
        "$cl" generate --broker "ipc://$d/c" --model s --tokens 1 --ids -n 200 --temp 0 --ignore-eos >"$d/ids$i" &
        pids+=($!)
    done
    for i in 1 2; do
        "$cl" generate --broker "ipc://$d/c" --model s --tokens 1 --ids -n 64 --temp 0.8 --top-k 40 --seed 5 \
            --ignore-eos >"$d/smp$i" &
        pids+=($!)
    done
    wait "${pids[@]}"
    for i in 1 2 3 4; do
        tr -s ' \n' '  ' <"$d/ids$i" | sed 's/ *$//' >"$d/got$i"
        if [ -s "$d/got$i" ] && cmp -s "$d/got$i" "$d/gold"; then pass=$((pass + 1)); else
            fail=$((fail + 1)); echo "request $i: not the golden ids:"; head -c 300 "$d/got$i"; echo; fi
    done
    local n1 n2
    n1=$(tr -s ' \n' '\n\n' <"$d/smp1" | grep -c '[0-9]'); n2=$(tr -s ' \n' '\n\n' <"$d/smp2" | grep -c '[0-9]')
    if [ "$n1" -eq 64 ] && cmp -s "$d/smp1" "$d/smp2"; then pass=$((pass + 1)); else
        fail=$((fail + 1)); echo "seeded requests: $n1 and $n2 ids, equal: $(cmp -s "$d/smp1" "$d/smp2" && echo yes || echo no)"; fi
    kill "$wpid" "$bpid" 2>/dev/null; wait "$wpid" "$bpid" 2>/dev/null
    echo "$pass passed, $fail failed"
    [ $fail -eq 0 ]
}
tp=0; tf=0
def=0; [ "$dev" = cpu ] || def=1   # queued ahead by default where steps run asynchronously (CUDA)
for run in "1 --ahead 1" "0 --ahead 0" "$def" "1 --ahead 1 --kv-block 16 --kv-blocks 80" \
           "0 --ahead 0 --kv-block 16 --kv-blocks 80"; do
    set -- $run
    out=$(worker_golden "$dev" "$@")
    echo "$out" | grep -v " passed, " | sed "s/^/[$run] /"
    line=$(echo "$out" | grep -E "^[0-9]+ passed, [0-9]+ failed" | tail -1)
    tp=$((tp + ${line%% passed*})); f=${line#*passed, }; tf=$((tf + ${f%% failed*}))
done
echo "$tp passed, $tf failed"
[ "$tf" -eq 0 ]
