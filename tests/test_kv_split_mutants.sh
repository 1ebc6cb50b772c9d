#!/usr/bin/env bash
# tests/test_kv_split_mutants.sh: tests/test_kv_split.c must catch a batcher that breaks the rule of engines whose
# decode and prefill kernels differ (docs/kv-cache.md). It links that test against the objects and libraries of
# $ZLLM_BUILD (default build) with worker/batcher.c replaced by a mutated copy; the unmutated copy must pass and
# each mutant fail: decoded rows published, generated tokens recomputed as a prefill chunk after a preemption,
# 1-token prompt chunks sent as decode entries, a resumed sequence taking cached blocks past its prompt.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
build=${ZLLM_BUILD:-build}
source tests/mutants.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in lib/libzllm_worker.a lib/libzllm_engine.a lib/libzllm_common.a; do
    [ -f "$build/$f" ] || { echo "FAIL missing $build/$f (build it first)"; echo "0 passed, 1 failed"; exit 1; }
done

# run LABEL [SED]: the test linked with batcher.c (mutated by SED when given)
run() {
    local f="$tmp/$1.c"
    mut_copy worker/batcher.c "$f" "${2:-}" || return 3
    if ! $CC -std=c11 -O1 -w -D_GNU_SOURCE -pthread -Iworker -Iengine -Icommon -Itests -o "$tmp/t_$1" \
        tests/test_kv_split.c "$f" "$build/lib/libzllm_worker.a" "$build/lib/libzllm_engine.a" \
        "$build/lib/libzllm_common.a" -lpcre2-8 -lutf8proc -lm -lpthread 2>"$tmp/cc.log"; then
        echo "build failed ($1):" >&2; cat "$tmp/cc.log" >&2; return 2
    fi
    timeout 60 "$tmp/t_$1" >"$tmp/out_$1.log" 2>&1
}

if run base; then mut_ok; else mut_bad "the unmutated batcher fails:"; tail -20 "$tmp/out_base.log" >&2; fi
for m in "${MUT_BATCHER_SPLIT[@]}" \
         "resume_reuses_past_prompt|s/s_split(b) ? r->n_prompt : r->len;/r->len;/"; do
    IFS='|' read -r label expr <<<"$m"
    run "$label" "$expr"
    rc=$?
    if [ $rc -eq 3 ]; then continue; fi
    if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then
        mut_ok; echo "mutant $label caught: $(grep -m1 '^FAIL' "$tmp/out_$label.log" | cut -c1-160)"
    else mut_bad "mutant $label was not caught (rc $rc)"; fi
done
mut_done
