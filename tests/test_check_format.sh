#!/usr/bin/env bash
# tests/test_check_format.sh: tools/check_format.sh in a scratch git repository holding this tree's .clang-format:
# formatted changes pass, an unformatted changed line fails with the diff (committed, uncommitted, C and CUDA),
# unchanged unformatted lines and non-C files are not checked, a bad BASE is an error, one commit has nothing to
# compare. Needs git and git-clang-format (CI installs clang-format: .ci/run).
set -u
cd "$(dirname "$0")/.."
root=$PWD
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

for c in git git-clang-format clang-format; do
    command -v "$c" >/dev/null 2>&1 || { bad "$c is not installed (Debian: apt-get install clang-format)"; finish; }
done
[ -f .clang-format ] && [ -f tools/check_format.sh ] || { bad "no .clang-format or tools/check_format.sh"; finish; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
repo=$tmp/repo
mkdir -p "$repo/tools"
cp .clang-format "$repo/"
cp tools/check_format.sh "$repo/tools/"
g() { git -C "$repo" -c user.name=test -c user.email=test@localhost -c commit.gpgsign=false "$@"; }
g init -q
# one line that clang-format would change, present from the start: it must never be reported unless edited
cat >"$repo/a.c" <<'EOF'
#include <stdio.h>

static int  s_old(int x){return x;}

int a_sum(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}
EOF
printf 'x\n' >"$repo/notes.md"
g add -A && g commit -qm base

# check NAME EXPECTED_RC [BASE]: runs the script, compares its exit status; the output is in $tmp/out
check() {
    local name=$1 want=$2; shift 2
    bash "$repo/tools/check_format.sh" "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, expected $want"; sed 's/^/    /' "$tmp/out"; fi
}

check "one commit, default BASE" 0
grep -q "nothing checked" "$tmp/out" && ok || bad "one commit: no 'nothing checked' line"

# a formatted change beside the untouched unformatted line
sed -i 's/    return s;/    s += n;\n    return s;/' "$repo/a.c"
g commit -qam formatted
check "formatted change" 0
grep -q "is formatted" "$tmp/out" && ok || bad "formatted change: no confirmation line"

# non-C files are not checked
printf 'int  x ;{\n' >>"$repo/notes.md"
g commit -qam "markdown"
check "markdown change" 0

# an unformatted line, committed: exit 1, the diff names the file and the fix
printf 'int a_max(int a,int b){ return a>b?a:b; }\n' >>"$repo/a.c"
g commit -qam unformatted
check "unformatted committed line" 1
grep -q '^diff --git a/a.c' "$tmp/out" && ok || bad "unformatted: no diff for a.c"
grep -q '^+int a_max(int a, int b) { return a > b ? a : b; }' "$tmp/out" && ok || bad "unformatted: no fixed line"
grep -q 's_old' "$tmp/out" && bad "unformatted: the untouched old line was reported" || ok

# the same commit measured from a BASE after it: nothing changed since
check "explicit BASE = HEAD" 0 HEAD
# and from the base commit: the unformatted line is among the changes
check "explicit BASE = first commit" 1 "$(g rev-list --max-parents=0 HEAD)"

# back to the commit before the unformatted one: clean again
g reset -q --hard HEAD~1
check "reset before the unformatted commit" 0

# uncommitted changes count (CUDA file, checked against HEAD~1)
printf '__global__ void k(float *y){ y[threadIdx.x]=0; }\n' >"$repo/k.cu"
g add k.cu
check "uncommitted CUDA line" 1
grep -q '^diff --git a/k.cu' "$tmp/out" && ok || bad "uncommitted CUDA: no diff for k.cu"
g rm -qf --cached k.cu && rm -f "$repo/k.cu"

# a header
printf '#ifndef H\n#define H\nint  h(void);\n#endif\n' >"$repo/h.h"
g add h.h && g commit -qm header
check "unformatted header" 1

check "bad BASE" 2 no-such-commit

finish
