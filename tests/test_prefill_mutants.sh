#!/usr/bin/env bash
# tests/test_prefill_mutants.sh: tests/test_prefill_chunks.c must catch an engine whose prefill depends on its
# chunking. It links that test against the engine library of $ZLLM_BUILD (default build) with one engine source
# replaced by a copy, first unchanged (it must pass), then once per mutation (it must fail): RoPE angles from the
# row's index in its chunk instead of its position (fast and reference engine), attention over at most as many
# keys as the step has rows (fast engine).
set -u
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
build=${ZLLM_BUILD:-build}
export ZLLM_BUILD=$build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }
for f in "$build/lib/libzllm_engine.a" "$build/lib/libzllm_common.a" "$build/bin/zllm-mkmodel"; do
    [ -f "$f" ] || { echo "FAIL missing $f (build it first)"; echo "0 passed, 1 failed"; exit 1; }
done

# run LABEL FILE: builds the test with FILE (a copy of an engine source under $tmp) linked before the library
run() {
    local exe="$tmp/t_$1"
    if ! $CC -std=c11 -O2 -w -D_GNU_SOURCE -pthread -Iengine -Icommon -Itests -o "$exe" tests/test_prefill_chunks.c \
        "$2" "$build/lib/libzllm_engine.a" "$build/lib/libzllm_common.a" -lm -lpthread 2>"$tmp/cc_$1.log"; then
        echo "compile failed ($1):" >&2; cat "$tmp/cc_$1.log" >&2; return 2
    fi
    timeout 120 "$exe" >"$tmp/out_$1.log" 2>&1
}

# mutant SRC LABEL SED: the sed must change the file, and the test must then fail
mutant() {
    local f="$tmp/$2.c"
    cp "$1" "$f"
    sed -i "$3" "$f"
    if cmp -s "$f" "$1"; then bad "mutation $2 did not apply (the source changed?)"; return; fi
    run "$2" "$f"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then ok; else bad "mutant $2 was not caught (rc $rc)"; fi
}

cp engine/cpu_fast.c "$tmp/base.c"
if run base "$tmp/base.c"; then ok; else bad "the unmutated test fails:"; tail -20 "$tmp/out_base.log" >&2; fi
mutant engine/cpu_fast.c fast_rope_chunk_index 's/rope_cs_row(&e->ex.rope, s->pos + t,/rope_cs_row(\&e->ex.rope, t,/'
mutant engine/cpu_fast.c fast_keys_of_step 's/off, pos + 1 - p0,/off, (pos + 1 - p0 < j->T ? pos + 1 - p0 : j->T),/'
mutant engine/engine_cpu.c ref_rope_chunk_index 's/rope_cs_row(&e->ex.rope, s->pos + t,/rope_cs_row(\&e->ex.rope, t,/'
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
