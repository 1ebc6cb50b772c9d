#!/usr/bin/env bash
# tools/check_format.sh [BASE]: checks that every C, CUDA and header line changed since BASE (default HEAD~1; the
# working tree's uncommitted changes count too) is formatted as .clang-format says. Only changed lines are
# checked, so existing code keeps its layout until someone edits it.
# Exit: 0 formatted (or nothing to check), 1 some changed line is not formatted (the diff that would fix it is
# printed: apply it with `git clang-format BASE`), 2 the check could not run (no git-clang-format, bad BASE).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

base_given=${1:+1}
base=${1:-HEAD~1}
exts=c,h,cu,cuh

gcf=
for c in git-clang-format git-clang-format-14; do
    if command -v "$c" >/dev/null 2>&1; then gcf=$c; break; fi
done
cf=
for c in clang-format clang-format-14; do
    if command -v "$c" >/dev/null 2>&1; then cf=$c; break; fi
done
if [ -z "$gcf" ] || [ -z "$cf" ]; then
    echo "check_format: git-clang-format and clang-format are needed (Debian: apt-get install clang-format)" >&2
    exit 2
fi

if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
    if [ -z "$base_given" ]; then
        # a repository of one commit, or a shallow clone: there is no parent to compare with
        echo "check_format: $base does not exist here; nothing to compare, nothing checked"
        exit 0
    fi
    echo "check_format: $base is not a commit" >&2
    exit 2
fi

out=$("$gcf" --binary "$cf" --style file --extensions "$exts" --diff -q "$base" 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
    printf '%s\n' "$out" >&2
    echo "check_format: git-clang-format failed (exit $rc)" >&2
    exit 2
fi
# older git-clang-format versions exit 0 even when they print a diff: the output decides
if [ -n "$out" ] && printf '%s\n' "$out" | grep -q '^diff --git'; then
    printf '%s\n' "$out"
    echo "check_format: lines changed since $base are not formatted as .clang-format says (the diff above);" \
        "run: git clang-format $base" >&2
    exit 1
fi
echo "check_format: every C/CUDA line changed since $base is formatted"
exit 0
