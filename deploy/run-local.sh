#!/usr/bin/env bash
# deploy/run-local.sh: one broker and N workers on this machine, with logs, stopped cleanly.
#
#   deploy/run-local.sh start -m MODEL.gguf [-n WORKERS] [--device cpu|cuda|cuda:N|auto] [--build DIR]
#                             [--dir RUNDIR] [--clients EP] [--max-batch M] [--threads T] [--http HOST:PORT]
#                             [-- WORKER_ARGS...]
#   deploy/run-local.sh stop   [--dir RUNDIR]
#   deploy/run-local.sh status [--dir RUNDIR]
#   deploy/run-local.sh run    (same options as start: starts, waits until Ctrl-C or a process dies, stops)
#
# RUNDIR (default /tmp/zllm-local) holds broker.log, worker-K.log and the pids. The workers talk to the broker
# over ipc://RUNDIR/workers; clients use --clients (default ipc://RUNDIR/clients; for other machines give a
# tcp:// endpoint, e.g. tcp://0.0.0.0:5555). Device "auto" picks cuda when nvidia-smi works and the build has
# CUDA, else cpu; with several GPUs worker K gets cuda:(K mod GPUs). Stop sends SIGTERM (the broker drains
# in-flight requests), waits up to 15 s, then SIGKILLs what is left. Exit status: 0, or 1 when something
# failed to start (its log is printed). --http also starts zllm-http, the OpenAI-compatible HTTP gateway, on
# HOST:PORT (http.log), once the workers are ready.
set -u
cmd=${1:-}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/zllm-local
build=$root/build
model=""
workers=1
device=auto
clients=""
max_batch=16
threads=0
http=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -m|--model) model=$2; shift 2 ;;
        -n|--workers) workers=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --max-batch) max_batch=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --http) http=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "run-local.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$build" in /*) ;; *) build=$root/$build ;; esac
clients=${clients:-ipc://$dir/clients}

s_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

s_has_cuda() {   # the build links the CUDA runtime and a GPU answers
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || return 1
    ldd "$build/bin/zllm-worker" 2>/dev/null | grep -q cudart
}

s_stop() {
    [ -d "$dir" ] || return 0
    local pids=() p
    for f in "$dir"/http.pid "$dir"/worker-*.pid "$dir"/broker.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        if s_alive "$p"; then kill -TERM "$p" 2>/dev/null; pids+=("$p"); fi
    done
    local t=0
    while [ $t -lt 150 ]; do
        local left=0
        for p in "${pids[@]}"; do s_alive "$p" && left=1; done
        [ $left -eq 0 ] && break
        sleep 0.1; t=$((t + 1))
    done
    for p in "${pids[@]}"; do
        if s_alive "$p"; then echo "run-local.sh: pid $p did not stop in 15 s: SIGKILL" >&2; kill -KILL "$p" 2>/dev/null; fi
    done
    rm -f "$dir"/*.pid
}

s_status() {
    local any=0 f p
    for f in "$dir"/broker.pid "$dir"/worker-*.pid "$dir"/http.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f"); any=1
        if s_alive "$p"; then echo "$(basename "$f" .pid): pid $p running"; else echo "$(basename "$f" .pid): pid $p DEAD"; fi
    done
    [ $any -eq 1 ] || echo "nothing started in $dir"
    [ -x "$build/bin/zllm" ] && [ $any -eq 1 ] && "$build/bin/zllm" status --broker "$clients"
    return 0
}

s_start() {
    [ -n "$model" ] || { echo "run-local.sh: -m MODEL.gguf is required" >&2; return 2; }
    for b in zllm-broker zllm-worker; do
        [ -x "$build/bin/$b" ] || { echo "run-local.sh: $build/bin/$b missing: run make first" >&2; return 1; }
    done
    mkdir -p "$dir"
    s_stop
    rm -f "$dir"/clients "$dir"/workers
    local dev=$device ngpu=0
    if [ "$dev" = auto ]; then
        if s_has_cuda; then dev=cuda; else dev=cpu; fi
    fi
    if [ "$dev" = cuda ]; then ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); fi
    "$build/bin/zllm-broker" --clients "$clients" --workers "ipc://$dir/workers" --model "$model" -v \
        >"$dir/broker.log" 2>&1 &
    echo $! >"$dir/broker.pid"
    local k
    for k in $(seq 1 "$workers"); do
        local d=$dev
        [ "$dev" = cuda ] && [ "$ngpu" -gt 1 ] && d=cuda:$(((k - 1) % ngpu))
        "$build/bin/zllm-worker" --broker "ipc://$dir/workers" -m "$model" --name "worker-$k" --device "$d" \
            --max-batch "$max_batch" --threads "$threads" "${extra[@]}" >"$dir/worker-$k.log" 2>&1 &
        echo $! >"$dir/worker-$k.pid"
    done
    # ready when the broker lists every worker alive (bounded: model loading can take a while on a GPU)
    local t=0
    while [ $t -lt 600 ]; do
        local dead=""
        for f in "$dir"/broker.pid "$dir"/worker-*.pid; do s_alive "$(cat "$f")" || dead="$dead $(basename "$f" .pid)"; done
        if [ -n "$dead" ]; then
            echo "run-local.sh: failed to start:$dead" >&2
            for n in $dead; do echo "---- $dir/$n.log" >&2; tail -n 20 "$dir/$n.log" >&2; done
            s_stop
            return 1
        fi
        local alive
        alive=$("$build/bin/zllm" status --broker "$clients" 2>/dev/null | grep -c ' alive$' || true)
        if [ "${alive:-0}" -ge "$workers" ]; then
            echo "zllm: broker and $workers worker(s) on $dev ready; clients: $clients; logs: $dir" >&2
            echo "$dev" >"$dir/device"
            [ -z "$http" ] && return 0
            s_start_http
            return $?
        fi
        sleep 0.1; t=$((t + 1))
    done
    echo "run-local.sh: workers not ready after 60 s (logs in $dir)" >&2
    s_stop
    return 1
}

# zllm-http on $http in front of the broker; the broker names the model after its file (NAME.gguf -> NAME), and
# the gateway loads the same vocabulary for /tokenize and /detokenize
s_start_http() {
    [ -x "$build/bin/zllm-http" ] || { echo "run-local.sh: $build/bin/zllm-http missing (make deps, then make)" >&2; s_stop; return 1; }
    local name
    name=$(basename "$model" .gguf)
    "$build/bin/zllm-http" --broker "$clients" --listen "$http" --model "$name=$model" >"$dir/http.log" 2>&1 &
    echo $! >"$dir/http.pid"
    local t=0
    while [ $t -lt 50 ]; do
        if grep -q '^listening ' "$dir/http.log" 2>/dev/null; then
            echo "zllm: OpenAI-compatible API on $(sed -n 's/^listening //p' "$dir/http.log")/v1 (model $name)" >&2
            return 0
        fi
        s_alive "$(cat "$dir/http.pid")" || break
        sleep 0.1; t=$((t + 1))
    done
    echo "run-local.sh: zllm-http failed to start:" >&2
    tail -n 20 "$dir/http.log" >&2
    s_stop
    return 1
}

case "$cmd" in
    start) s_start ;;
    stop) s_stop ;;
    status) s_status ;;
    run)
        s_start || exit 1
        trap 's_stop; exit 0' INT TERM
        echo "running; Ctrl-C stops" >&2
        while :; do
            for f in "$dir"/broker.pid "$dir"/worker-*.pid "$dir"/http.pid; do
                [ -f "$f" ] || continue
                s_alive "$(cat "$f")" || { echo "run-local.sh: $(basename "$f" .pid) died (see $dir)" >&2; s_stop; exit 1; }
            done
            sleep 1
        done ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
