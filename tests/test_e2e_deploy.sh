#!/usr/bin/env bash
# tests/test_e2e_deploy.sh: deploy/run-local.sh starts one broker and 2 CPU workers (stories260K) with logs,
# `zllm status` lists both, `zllm generate` prints llama2.c's golden ids, and `stop` ends every process it
# started (SIGTERM: the broker drains) and removes the pid files. Also: `zllm` with no broker fails (exit 1)
# in bounded time instead of hanging. Test data: $ZLLM_FIXTURES, else the folder tests/fetch-fixtures.sh prints.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ZLLM_BUILD:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
fx=${ZLLM_FIXTURES:-$(bash "$root/tests/fetch-fixtures.sh")}
model=$fx/stories260K/stories260K.gguf
for f in "$model" "$fx/stories260K/golden_greedy_ids.txt"; do
    [ -s "$f" ] || { echo "FAIL: missing fixture $f"; echo "0 passed, 1 failed"; exit 1; }
done
dir=$(mktemp -d /tmp/zllm-deploy.XXXXXX)
pass=0; fail=0
check() { if [ "$1" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2"; fi; }
cleanup() { bash "$root/deploy/run-local.sh" stop --dir "$dir" --build "$build" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT

# no broker at all: bounded failure
t0=$SECONDS
timeout 20 "$build/bin/zllm" generate --broker "ipc://$dir/nobody" --tokens 1 -n 5 >/dev/null 2>&1
rc=$?
check $([ $rc = 1 ] && echo 0 || echo 1) "zllm generate without a broker: exit 1 (got $rc)"
check $([ $((SECONDS - t0)) -le 10 ] && echo 0 || echo 1) "zllm generate without a broker gave up within 10 s"

timeout 60 bash "$root/deploy/run-local.sh" start --dir "$dir" --build "$build" -m "$model" -n 2 --max-batch 4 \
    --threads 1 --device "${ZLLM_E2E_DEVICE:-cpu}"
check $? "run-local.sh start"
pids=$(cat "$dir"/*.pid 2>/dev/null)
check $([ $(echo $pids | wc -w) = 3 ] && echo 0 || echo 1) "3 pid files (broker + 2 workers): $pids"
st=$(timeout 10 "$build/bin/zllm" status --broker "ipc://$dir/clients")
check $? "zllm status exit 0 (ready)"
check $([ "$(echo "$st" | grep -c ' alive$')" = 2 ] && echo 0 || echo 1) "status lists 2 alive workers"
gold=$(head -c 2000 "$fx/stories260K/golden_greedy_ids.txt" | tr -s ' \n' ' ' | cut -d' ' -f1-30)
out=$(timeout 20 "$build/bin/zllm" generate --broker "ipc://$dir/clients" --tokens 1 -n 30 --temp 0 --ignore-eos --ids)
check $? "zllm generate exit 0"
check $([ -n "$gold" ] && [ "$(echo $out)" = "$(echo $gold)" ] && echo 0 || echo 1) \
    "golden ids through the deployment: $out"
for f in "$dir"/broker.log "$dir"/worker-1.log "$dir"/worker-2.log; do
    check $([ -s "$f" ] && echo 0 || echo 1) "log $f written"
done
timeout 30 bash "$root/deploy/run-local.sh" stop --dir "$dir" --build "$build"
check $? "run-local.sh stop"
alive=0
for p in $pids; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
check $([ $alive = 0 ] && echo 0 || echo 1) "no process left after stop ($alive alive)"
check $([ -z "$(ls "$dir"/*.pid 2>/dev/null)" ] && echo 0 || echo 1) "pid files removed"
grep -q "stopping" "$dir/worker-1.log"
check $? "worker-1 stopped cleanly on SIGTERM (log says stopping)"
[ $fail -gt 0 ] && for f in "$dir"/*.log; do echo "---- $f"; tail -n 15 "$f"; done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
