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
source tests/mutants.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
    mut_copy "$2" "$f" "${3:-}" || return 3
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

if run base worker/kv_blocks.c; then mut_ok; else mut_bad "the unmutated worker fails:"; tail -20 "$tmp/out_base.log" >&2; fi
mutants=("common/kv_hash.c|hash_ignores_prev||s/msg\[i\] = (uint8_t)(prev >> (8 \* i));/msg[i] = 0;/"
         "worker/kv_blocks.c|freed_while_shared||s/if (--p->ref\[id\] > 0) return 0;/p->ref[id] = 0;/")
# the batcher mutants (tests/mutants.sh); decoded rows published are found only through a pool of 96 blocks
if [ "$cuda" = cuda ]; then
    for m in "${MUT_BATCHER_SPLIT[@]}"; do
        pool=; [ "${m%%|*}" = decoded_rows_published ] && pool=96
        mutants+=("worker/batcher.c|${m%%|*}|$pool|${m#*|}")
    done
fi
for m in "${mutants[@]}"; do
    IFS='|' read -r src label pool expr <<<"$m"   # expr last: it may hold '|'
    run "$label" "$src" "$expr" "$pool"
    rc=$?
    if [ $rc -eq 3 ]; then continue; fi
    # caught: a request's tokens, finish or logprobs differ from the reference (not a counter or a timeout)
    if [ $rc -ne 0 ] && [ $rc -ne 2 ] &&
        grep -qE '^FAIL kv_exact: (request |cancelled |[0-9]+ requests )' "$tmp/out_$label.log"; then
        mut_ok; echo "mutant $label caught: $(grep -m1 '^FAIL' "$tmp/out_$label.log" | cut -c1-160)"
    else mut_bad "mutant $label was not caught (rc $rc): $(grep -m1 '^FAIL' "$tmp/out_$label.log" | cut -c1-160)"; fi
done
mut_done
