#!/usr/bin/env bash
# tests/test_kv_exact_mutants.sh: tests/test_kv_exact.py must catch a broken prefix cache in a real worker. It links
# zllm-worker (from the objects and libraries of $ZLLM_BUILD, default build) with one source replaced by a mutated
# copy, and runs that test (2000 requests) against it; each mutant must fail it: a block hash that ignores the
# preceding block (common/kv_hash.c), a release that frees a block still shared (worker/kv_blocks.c). The unmutated
# worker, linked the same way, must pass.
# With ZLLM_E2E_DEVICE=cuda (tests/run_gpu.sh, on a CUDA build: the worker links libzllm_cuda.a; the test's model and
# pool come from its ZLLM_KV_EXACT_* variables) the mutants also include batchers that break the rule of engines whose
# decode and prefill kernels differ (docs/kv-cache.md), which only CUDA's bits show: decoded rows published,
# generated tokens recomputed as a prefill chunk after a preemption, 1-token prompt chunks sent as decode entries.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
build=${ZLLM_BUILD:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }
cuda=${ZLLM_E2E_DEVICE:-cpu}
need="obj/worker/main_zllm-worker.o lib/libzllm_worker.a lib/libzllm_engine.a lib/libzllm_common.a bin/zllm-broker"
cuda_link=()
if [ "$cuda" = cuda ]; then
    need="$need lib/libzllm_cuda.a"
    ch=${CUDA_HOME:-/usr/local/cuda}
    cuda_link=(-Wl,--whole-archive "$build/lib/libzllm_cuda.a" -Wl,--no-whole-archive -L"$ch/lib64" -Wl,-rpath,"$ch/lib64"
               -lcublasLt -lcublas -lcudart -lstdc++)
fi
for f in $need; do
    [ -f "$build/$f" ] || { echo "FAIL missing $build/$f (build it first)"; echo "0 passed, 1 failed"; exit 1; }
done
mkdir -p "$tmp/bin"
ln -s "$build/bin/zllm-broker" "$tmp/bin/zllm-broker"

# run LABEL SRC [SED [POOL]]: links the worker with SRC (mutated by SED when given) and runs the exactness test
# (with a pool of POOL blocks when given: decoded rows published matter only when a continuation finds them, which
# a pool that holds recent answers' blocks lets it do)
run() {
    local f="$tmp/$1.c"
    cp "$2" "$f"
    if [ -n "${3:-}" ]; then
        sed -i "$3" "$f"
        if cmp -s "$f" "$2"; then bad "mutation $1 did not apply (the source changed?)"; return 3; fi
    fi
    rm -f "$tmp/bin/zllm-worker"
    if ! $CC -std=c11 -O2 -w -D_GNU_SOURCE -pthread -Iworker -Iengine -Icommon -c -o "$tmp/$1.o" "$f" 2>"$tmp/cc.log" ||
        ! $CC -o "$tmp/bin/zllm-worker" "$build/obj/worker/main_zllm-worker.o" "$tmp/$1.o" "$build/lib/libzllm_worker.a" \
            "${cuda_link[@]}" "$build/lib/libzllm_engine.a" "$build/lib/libzllm_common.a" -lzmq -lmsgpackc -lpcre2-8 \
            -lutf8proc -lm -lpthread 2>>"$tmp/cc.log"; then
        echo "build failed ($1):" >&2; cat "$tmp/cc.log" >&2; return 2
    fi
    env ZLLM_BUILD="$tmp" ZLLM_KV_EXACT_N=${ZLLM_KV_MUTANT_N:-2000} ZLLM_KV_EXACT_ALONE=0 ${4:+ZLLM_KV_EXACT_BLOCKS=$4} \
        timeout "${ZLLM_KV_EXACT_TIMEOUT:-170}" python3 tests/test_kv_exact.py >"$tmp/out_$1.log" 2>&1
}

if run base worker/kv_blocks.c; then ok; else bad "the unmutated worker fails:"; tail -20 "$tmp/out_base.log" >&2; fi
mutants=("common/kv_hash.c|hash_ignores_prev||s/msg\[i\] = (uint8_t)(prev >> (8 \* i));/msg[i] = 0;/"
         "worker/kv_blocks.c|freed_while_shared||s/if (--p->ref\[id\] > 0) return 0;/p->ref[id] = 0;/")
[ "$cuda" = cuda ] && mutants+=(
    "worker/batcher.c|decoded_rows_published|96|s/return s_split(b) \&\& r->n_past > r->n_prompt ? r->n_prompt : r->n_past;/return r->n_past;/"
    "worker/batcher.c|replay_as_prefill_chunk||s/|| (s_split(b) \&\& at >= s->n_prompt \&\& at < s->len)//;s/if (s_split(b) \&\& at >= s->n_prompt) chunk = 1;//"
    "worker/batcher.c|prompt_token_as_decode||s/q->prompt = at < s->n_prompt;/q->prompt = 0;/")
for m in "${mutants[@]}"; do
    IFS='|' read -r src label pool expr <<<"$m"   # expr last: it may hold '|'
    run "$label" "$src" "$expr" "$pool"
    rc=$?
    if [ $rc -eq 3 ]; then continue; fi
    # caught: a request's tokens, finish or logprobs differ from the reference (not a counter or a timeout)
    if [ $rc -ne 0 ] && [ $rc -ne 2 ] &&
        grep -qE '^FAIL kv_exact: (request |cancelled |[0-9]+ requests )' "$tmp/out_$label.log"; then
        ok; echo "mutant $label caught: $(grep -m1 '^FAIL' "$tmp/out_$label.log" | cut -c1-160)"
    else bad "mutant $label was not caught (rc $rc): $(grep -m1 '^FAIL' "$tmp/out_$label.log" | cut -c1-160)"; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
