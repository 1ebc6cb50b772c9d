#!/usr/bin/env bash
# tests/bench_kv.sh BUILD DEVICE MODEL: what prefix caching and priorities buy, on the whole stack
# (docs/kv-cache.md, "Measuring what caching and priorities buy"). Each scenario starts its own broker and one
# worker (zllm-worker --device DEVICE, ZLLM_KV_WORKER_ARGS added), drives it with `zllm bench` (token-id prompts:
# no tokenizer needed) and prints one line with the measured ratio, or `NAME FAILED: why`:
#   1. ttft_cached_ratio: median time to first token of single requests of LONG tokens whose first 90% is a prefix
#      sent before (warm) over that of single requests of LONG fresh tokens (cold); the bar is <= 0.15.
#   2. multiturn_speedup: CHATS concurrent chats of TURNS turns each (zllm bench --turns), all starting with one
#      shared system prompt of SYS tokens, NEW new ids and OUT output tokens a turn; output tokens/s with the
#      worker at --prefix-cache 1 over the same load at --prefix-cache 0; the bar is >= 2. The outputs' digests of
#      the two runs are compared (greedy: the tokens must be the same with caching on and off).
#   3. priority_ttft_ratio: p99 time to first token of probes (HI_LEN-token prompts, HI_OUT tokens, priority 10)
#      sent every HI_EVERY ms while LOAD_C low-priority streams (priority -1, LOAD_N requests of LOAD_PROMPT ids and
#      LOAD_OUT tokens) keep the batch full, over their p99 on the idle worker (the same probes one at a time); the
#      bar is <= 1.2. The worker has LOAD_C + HI_SLOTS slots, so that a probe finds a slot and the batcher's
#      priority order is what is measured (HI_SLOTS 0: a probe also waits at the broker for a slot to free).
# The bars are printed beside the ratios ("met" / "not met"); the exit status is 1 only when a scenario failed to
# measure (an error, a failed request, its time limit), not for a bar. Sizes come from the environment,
# ZLLM_KV_<NAME> (defaults: a few seconds in all with stories260K on the CPU); ZLLM_KV_PRESET=gpu sets the sizes
# for an 8B model on one GPU (each still overridable): LONG 8192, CHATS 64, TURNS 8, SYS 2048, NEW 48, OUT 64
# (the 8th turn's context is 2048 + 8 x (48 + 64) = 2944 tokens, within a context of 4096), LOAD_C 64, LOAD_N 1024,
# LOAD_PROMPT 128, LOAD_OUT 64:192, HI_EVERY 200. Others: REPS (requests per median, default 5), VOCAB (ids drawn
# from [3, VOCAB), default 256), LIMIT_S (each scenario's time limit, default 120; gpu 240), START_S (the wait for
# a worker to register, default 60; gpu 180), ONLY (a list of scenario numbers, e.g. "1 3"), KEEP (a folder that
# keeps the logs and every bench's output). Run by hand; tests/test_bench_kv.py runs it on stories260K in CI.
set -uo pipefail
build=${1:?usage: bench_kv.sh BUILD DEVICE MODEL}
dev=${2:?usage: bench_kv.sh BUILD DEVICE MODEL}
model=${3:?usage: bench_kv.sh BUILD DEVICE MODEL}
cd "$(dirname "$0")/.." || exit 1
[ -f "$model" ] || { echo "bench_kv.sh: no model file $model" >&2; exit 1; }

gpu=0
[ "${ZLLM_KV_PRESET:-}" = gpu ] && gpu=1
pick() { # NAME CPU_DEFAULT GPU_DEFAULT: $ZLLM_KV_NAME, else the preset's default
    local v="ZLLM_KV_$1"
    if [ -n "${!v:-}" ]; then echo "${!v}"; elif [ $gpu = 1 ]; then echo "$3"; else echo "$2"; fi
}
LONG=$(pick LONG 512 8192)
REPS=$(pick REPS 5 5)
CHATS=$(pick CHATS 8 64)
TURNS=$(pick TURNS 4 8)
SYS=$(pick SYS 256 2048)
NEW=$(pick NEW 16 48)
OUT=$(pick OUT 16 64)
LOAD_C=$(pick LOAD_C 8 64)
LOAD_N=$(pick LOAD_N 256 1024)
LOAD_PROMPT=$(pick LOAD_PROMPT 32 128)
LOAD_OUT=$(pick LOAD_OUT 16:48 64:192)
HI_EVERY=$(pick HI_EVERY 20 200)
HI_LEN=$(pick HI_LEN 32 32)
HI_OUT=$(pick HI_OUT 4 4)
HI_SLOTS=$(pick HI_SLOTS 4 4)
VOCAB=$(pick VOCAB 256 256)
LIMIT_S=$(pick LIMIT_S 120 240)
START_S=$(pick START_S 60 180)
ONLY=${ZLLM_KV_ONLY:-1 2 3}

tmp=$(mktemp -d /tmp/zllm-bench-kv.XXXXXX)
bpid=
wpid=
stop() {
    [ -n "$wpid" ] && kill "$wpid" 2>/dev/null
    [ -n "$bpid" ] && kill "$bpid" 2>/dev/null
    [ -n "$wpid" ] && wait "$wpid" 2>/dev/null
    [ -n "$bpid" ] && wait "$bpid" 2>/dev/null
    wpid=
    bpid=
}
finish() {
    stop
    if [ -n "${ZLLM_KV_KEEP:-}" ]; then mkdir -p "$ZLLM_KV_KEEP" && cp "$tmp"/* "$ZLLM_KV_KEEP"/ 2>/dev/null; fi
    rm -rf "$tmp"
}
trap finish EXIT
trap 'exit 130' INT TERM

deadline=0
left() { echo $((deadline - $(date +%s))); }

# start TAG WORKER_ARGS...: a broker and worker w1 (killed first if running); 0 once w1 is registered
start() {
    stop
    rm -f "$tmp/c" "$tmp/w"
    "$build/bin/zllm-broker" --clients "ipc://$tmp/c" --workers "ipc://$tmp/w" --model "m=$model" \
        >"$tmp/broker-$1.log" 2>&1 &
    bpid=$!
    # shellcheck disable=SC2086 # ZLLM_KV_WORKER_ARGS is a list of options
    "$build/bin/zllm-worker" --broker "ipc://$tmp/w" -m "$model" --model-name m --name w1 --device "$dev" \
        ${ZLLM_KV_WORKER_ARGS:-} "${@:2}" >"$tmp/worker-$1.log" 2>&1 &
    wpid=$!
    local t_end=$(($(date +%s) + START_S))
    while [ "$(date +%s)" -lt "$t_end" ] && [ "$(left)" -gt 0 ]; do
        kill -0 "$wpid" 2>/dev/null || { why="the worker exited: $(tail -n 1 "$tmp/worker-$1.log")"; return 1; }
        "$build/bin/zllm" status --broker "ipc://$tmp/c" 2>/dev/null | grep -q " w1 .* alive" && return 0
        sleep 0.5
    done
    why="the worker did not register within ${START_S} s"
    return 1
}

# bench OUT ARGS...: zllm bench into $tmp/OUT within the scenario's time left; 0 when every request ended ok
bench() {
    local t
    t=$(left)
    [ "$t" -gt 0 ] || { why="time limit (${LIMIT_S} s) reached"; return 1; }
    timeout "$t" "$build/bin/zllm" bench --broker "ipc://$tmp/c" --vocab "$VOCAB" "${@:2}" >"$tmp/$1" 2>&1
    local rc=$?
    [ $rc = 0 ] && return 0
    if [ $rc = 124 ]; then why="time limit (${LIMIT_S} s) reached in $1"
    else why="zllm bench $1 exited $rc: $(grep -m 1 -v '^\(requests\|wall\|steady\|ttft\|itl\|sends\|cache\|outputs\|hi\):' "$tmp/$1" | head -c 200)$(grep -m 1 '^requests:' "$tmp/$1")"; fi
    return 1
}
# figures from a bench's output
ttft_p() { sed -n "s/^ttft ms: .*p$1 \([0-9.]*\).*/\1/p" "$tmp/$2" | head -n 1; }
hi_p99() { sed -n 's/^hi: .*p99 \([0-9.]*\).*/\1/p' "$tmp/$1" | head -n 1; }
tps() { sed -n 's/^wall .*, \([0-9.]*\) output tokens\/s.*/\1/p' "$tmp/$1" | head -n 1; }
hit() { sed -n 's/^cache: hit [0-9]* of [0-9]* prompt tokens (\([0-9.]*\)%).*/\1/p' "$tmp/$1" | head -n 1; }
digest() { sed -n 's/^outputs: digest \([0-9a-f]*\) .*/\1/p' "$tmp/$1" | head -n 1; }
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('%.3f' % (a / b) if b > 0 else 'inf')" "$1" "$2"; }
bar() { # VALUE OP LIMIT -> met / not met
    python3 -c "import sys; v, l = float(sys.argv[1]), float(sys.argv[3]); ok = v <= l if sys.argv[2] == '<=' else v >= l; \
print('met' if ok else 'not met')" "$1" "$2" "$3"
}
failed=0
fail() { # NAME: the scenario's failure line
    echo "$1 FAILED: $why"
    failed=1
}

scenario_cached_ttft() {
    local pre=$((LONG * 9 / 10)) warm=
    start s1 --max-batch 2 --ctx $(((LONG + 64 + 255) / 256 * 256)) || return 1
    # a warm-up (the first steps of a fresh worker), then cold prompts: LONG fresh ids each, nothing cached
    bench s1-warmup.txt -N 2 -c 1 --prompt-len 16 --out-len 2 --bench-seed 100 || return 1
    bench s1-cold.txt -N "$REPS" -c 1 --prompt-len "$LONG" --out-len 1 --bench-seed 101 || return 1
    # the shared prefix sent once, then requests whose first 90% is that prefix and the rest their own
    bench s1-seed.txt -N 1 -c 1 --prefixes 1 --prefix-len "$pre" --prompt-len $((LONG - pre)) --out-len 1 \
        --prefix-seed 7 --bench-seed 102 || return 1
    bench s1-warm.txt -N "$REPS" -c 1 --prefixes 1 --prefix-len "$pre" --prompt-len $((LONG - pre)) --out-len 1 \
        --prefix-seed 7 --bench-seed 103 || return 1
    local cold warm r
    cold=$(ttft_p 50 s1-cold.txt)
    warm=$(ttft_p 50 s1-warm.txt)
    [ -n "$cold" ] && [ -n "$warm" ] || { why="no ttft line"; return 1; }
    r=$(ratio "$warm" "$cold")
    echo "ttft_cached_ratio $r (warm p50 $warm ms, cold p50 $cold ms; $LONG-token prompts, first $pre sent" \
        "before; warm hit $(hit s1-warm.txt)%, cold hit $(hit s1-cold.txt)%; bar <= 0.15: $(bar "$r" '<=' 0.15))"
}

scenario_multiturn() {
    local n=$((CHATS * TURNS)) ctx=$(((SYS + TURNS * (NEW + OUT) + 16 + 255) / 256 * 256)) pc
    for pc in 1 0; do
        start "s2-cache$pc" --max-batch "$CHATS" --ctx "$ctx" --prefix-cache $pc || return 1
        bench "s2-warmup$pc.txt" -N 2 -c 1 --prompt-len 16 --out-len 2 --bench-seed 200 || return 1
        bench "s2-cache$pc.txt" -N "$n" -c "$CHATS" --turns "$TURNS" --prefixes 1 --prefix-len "$SYS" \
            --prompt-len "$NEW" --out-len "$OUT" --prefix-seed 9 --bench-seed 201 || return 1
    done
    local on off r same=same
    on=$(tps s2-cache1.txt)
    off=$(tps s2-cache0.txt)
    [ -n "$on" ] && [ -n "$off" ] || { why="no wall line"; return 1; }
    [ "$(digest s2-cache1.txt)" = "$(digest s2-cache0.txt)" ] || same=DIFFER
    r=$(ratio "$on" "$off")
    echo "multiturn_speedup $r (cache on $on output tokens/s, off $off; hit on $(hit s2-cache1.txt)%, off" \
        "$(hit s2-cache0.txt)%; outputs $same; $CHATS chats x $TURNS turns, system prompt $SYS, $NEW new and" \
        "$OUT output tokens a turn; bar >= 2: $(bar "$r" '>=' 2))"
}

scenario_priority() {
    start s3 --max-batch $((LOAD_C + HI_SLOTS)) || return 1
    bench s3-warmup.txt -N 2 -c 1 --prompt-len 16 --out-len 2 --bench-seed 300 || return 1
    # idle: the probes alone, one at a time (as many as the loaded run is likely to send, at least 20)
    bench s3-idle.txt -N 20 -c 1 --priority 10 --prompt-len "$HI_LEN" --out-len "$HI_OUT" --bench-seed 301 || return 1
    bench s3-loaded.txt -N "$LOAD_N" -c "$LOAD_C" --priority -1 --prompt-len "$LOAD_PROMPT" --out-len "$LOAD_OUT" \
        --ramp-ms 100 --hi-every "$HI_EVERY" --hi-priority 10 --hi-prompt-len "$HI_LEN" --hi-out-len "$HI_OUT" \
        --bench-seed 302 || return 1
    local idle loaded r n
    idle=$(ttft_p 99 s3-idle.txt)
    loaded=$(hi_p99 s3-loaded.txt)
    n=$(sed -n 's/^hi: \([0-9]*\) probes.*/\1/p' "$tmp/s3-loaded.txt")
    [ -n "$idle" ] && [ -n "$loaded" ] && [ "${n:-0}" -gt 0 ] || { why="no probe measured"; return 1; }
    r=$(ratio "$loaded" "$idle")
    echo "priority_ttft_ratio $r (probe p99 under load $loaded ms over $n probes, idle $idle ms; load: $LOAD_C" \
        "streams at priority -1 of $LOAD_OUT tokens; bar <= 1.2: $(bar "$r" '<=' 1.2))"
}

for s in $ONLY; do
    why=
    deadline=$(($(date +%s) + LIMIT_S))
    case $s in
    1) scenario_cached_ttft || fail ttft_cached_ratio ;;
    2) scenario_multiturn || fail multiturn_speedup ;;
    3) scenario_priority || fail priority_ttft_ratio ;;
    *) why="unknown scenario $s (1, 2 or 3)"; fail scenario ;;
    esac
    stop
done
exit $failed
