#!/usr/bin/env bash
# deploy/run-default.sh [BUILD]: what `make run` does. Fetches the default model (SmolLM2-135M-Instruct Q4_1,
# deploy/fetch-model.sh), starts a broker and one worker (on the GPU when nvidia-smi works and the build has
# CUDA, on the CPU otherwise; a GPU worker that fails to start falls back to the CPU), streams a chat answer to
# a question ($ZLLM_QUESTION, default "What is the capital of France?"), and stops everything. $ZLLM_MODEL names
# another GGUF chat model to use instead of the default one.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
question=${ZLLM_QUESTION:-What is the capital of France?}
if [ -n "${ZLLM_MODEL:-}" ]; then
    model=$ZLLM_MODEL
else
    model=$(bash "$root/deploy/fetch-model.sh") || { echo "run-default.sh: could not fetch the model" >&2; exit 1; }
fi
dir=$(mktemp -d /tmp/zllm-run.XXXXXX)
local_sh="$root/deploy/run-local.sh"
trap 'bash "$local_sh" stop --dir "$dir" --build "$build"; rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
if ! bash "$local_sh" start --dir "$dir" --build "$build" -m "$model" -n 1 --max-batch 4 --device auto; then
    echo "run-default.sh: starting on the GPU failed or it is absent; trying the CPU" >&2
    bash "$local_sh" start --dir "$dir" --build "$build" -m "$model" -n 1 --max-batch 4 --device cpu || exit 1
fi
echo "device: $(cat "$dir/device")" >&2
echo "> $question"
"$build/bin/zllm" generate --broker "ipc://$dir/clients" --chat -p "$question" -n 256 --temp 0 --deadline-ms 120000
