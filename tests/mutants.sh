# tests/mutants.sh: sourced by the mutation tests (tests/test_kv_mutants.sh, test_kv_split_mutants.sh,
# test_kv_exact_mutants.sh). A mutation test builds the code under test once as it is (it must pass) and once per
# mutant, a sed expression applied to a copy of one source file (each must fail). This file holds what they share:
# the tally, the copy that checks a mutation applied, and the batcher mutants that break the rule of engines whose
# decode and prefill kernels differ (docs/kv-cache.md), which both the unit test and the worker test must catch.

mut_pass=0 mut_fail=0
mut_ok() { mut_pass=$((mut_pass + 1)); }
mut_bad() { mut_fail=$((mut_fail + 1)); echo "FAIL $*" >&2; }

# mut_copy SRC DST [SED]: writes SRC to DST, mutated by SED when given. Returns 3 (and counts a failure) when SED
# leaves the file unchanged: the source changed under the mutant, which would otherwise pass as "caught".
mut_copy() {
    cp "$1" "$2"
    [ -n "${3:-}" ] || return 0
    sed -i "$3" "$2"
    if cmp -s "$1" "$2"; then mut_bad "mutation of $1 did not apply (the source changed?): $3"; return 3; fi
}

# the closing tally line that tests/run.sh adds up; the exit status says whether every check passed
mut_done() {
    echo "$mut_pass passed, $mut_fail failed"
    [ "$mut_fail" -eq 0 ]
}

# LABEL|SED on worker/batcher.c: decoded rows published, generated tokens recomputed as a prefill chunk after a
# preemption, 1-token prompt chunks sent as decode entries (the SED last: it may hold '|')
MUT_BATCHER_SPLIT=(
    "decoded_rows_published|s/return s_split(b) \&\& r->n_past > r->n_prompt ? r->n_prompt : r->n_past;/return r->n_past;/"
    "replay_as_prefill_chunk|s/|| (s_split(b) \&\& at >= s->n_prompt \&\& at < s->len)//;s/if (s_split(b) \&\& at >= s->n_prompt) chunk = 1;//"
    "prompt_token_as_decode|s/q->prompt = at < s->n_prompt;/q->prompt = 0;/"
)
