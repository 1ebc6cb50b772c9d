#!/usr/bin/env bash
# tests/test_kv_mutants.sh: tests/test_kv_blocks.c must catch broken KV caches. It builds that test from the
# sources (common/kv_hash.c, worker/kv_blocks.c, worker/kv_table.c) with a small KV_REF_MAX (so the refcount
# overflow check runs), first as they are (it must pass), then once per mutation applied to a copy (it must
# fail): a hash that ignores the preceding block, a release that frees a block still shared, no overflow check,
# no underflow check, a lookup that trusts the hash without comparing tokens, a cached prefix that covers the
# last prompt token.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
source tests/mutants.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

build_run() { # $1: label; the sources are under $tmp/src
    local exe="$tmp/t_$1"
    if ! $CC -std=c11 -O1 -w -DKV_REF_MAX=5 -I"$tmp/src/common" -I"$tmp/src/worker" -Itests -o "$exe" \
        tests/test_kv_blocks.c "$tmp/src/common/kv_hash.c" "$tmp/src/worker/kv_blocks.c" \
        "$tmp/src/worker/kv_table.c" 2>"$tmp/cc_$1.log"; then
        echo "compile failed ($1):" >&2; cat "$tmp/cc_$1.log" >&2; return 2
    fi
    timeout 20 "$exe" >"$tmp/out_$1.log" 2>&1
}

fresh() {
    rm -rf "$tmp/src" && mkdir -p "$tmp/src/common" "$tmp/src/worker"
    cp common/kv_hash.[ch] "$tmp/src/common/" && cp worker/kv_blocks.[ch] worker/kv_table.[ch] "$tmp/src/worker/"
}

# mutant FILE LABEL SED-EXPRESSION: the sed must change the file, and the test must then fail
mutant() {
    fresh
    mut_copy "$1" "$tmp/src/$1" "$3" || return
    build_run "$2"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then mut_ok; else mut_bad "mutant $2 was not caught (rc $rc)"; fi
}

fresh
if build_run base; then mut_ok; else mut_bad "the unmutated test fails:"; cat "$tmp/out_base.log" >&2; fi
mutant common/kv_hash.c hash_ignores_prev 's/msg\[i\] = (uint8_t)(prev >> (8 \* i));/msg[i] = 0;/'
mutant worker/kv_blocks.c freed_while_shared 's/if (--p->ref\[id\] > 0) return 0;/p->ref[id] = 0;/'
mutant worker/kv_blocks.c no_overflow_check 's/ || p->ref\[id\] >= KV_REF_MAX) return -1;/) return -1;/'
mutant worker/kv_blocks.c no_underflow_check 's/if (bad_id(p, id) || p->ref\[id\] <= 0) return -1;/if (bad_id(p, id)) return -1;/'
mutant worker/kv_blocks.c hash_trusted 's/if (p->hash\[id\] == h \&\& memcmp(/if (p->hash[id] == h || memcmp(/'
mutant worker/kv_table.c last_token_cached 's/int k_max = n >= 1 ? (n - 1) \/ bs : 0/int k_max = n \/ bs/'
mut_done
