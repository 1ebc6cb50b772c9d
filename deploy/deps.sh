#!/usr/bin/env bash
# deploy/deps.sh: installs what zllm needs and is missing. As root it installs; otherwise it prints the commands.
# Debian packages: build tools, ZeroMQ, msgpack-c, PCRE2, utf8proc, and libmicrohttpd and jansson for zllm-http.
# Python: the packages the tests and clients use (openai and prometheus_client: the HTTP gateway's test).
# It names each package before installing it, and waits (up to 10 minutes) for the package manager's lock when
# another apt or dpkg holds it instead of failing.
set -u
pkgs=(build-essential pkg-config libzmq3-dev libmsgpack-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      libjansson-dev python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# python3 may come from elsewhere (pyenv): accept a working python3 + pip instead of Debian's
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
    missing=("${missing[@]/python3-pip}"); missing=("${missing[@]/python3}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
pymods=(numpy gguf zmq msgpack jinja2 flit_core openai prometheus_client jsonschema)
pypkgs=(numpy gguf pyzmq msgpack jinja2 flit_core openai prometheus_client jsonschema)
pymissing=()
for i in "${!pymods[@]}"; do
    python3 -c "import ${pymods[$i]}" >/dev/null 2>&1 || pymissing+=("${pypkgs[$i]}")
done
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    [ ${#missing[@]} -gt 0 ] && echo "zllm needs: sudo apt-get install -y ${missing[*]}"
    [ ${#pymissing[@]} -gt 0 ] && echo "zllm needs: python3 -m pip install ${pymissing[*]}"
    [ ${#missing[@]} -eq 0 ] && [ ${#pymissing[@]} -eq 0 ] && exit 0
    exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing Debian packages: ${missing[*]} (apt-get update, then apt-get install)"
    export DEBIAN_FRONTEND=noninteractive
    lock=(-o DPkg::Lock::Timeout=600)
    apt-get "${lock[@]}" update -qq >/dev/null && apt-get "${lock[@]}" install -y -qq "${missing[@]}" >/dev/null ||
        { echo "deps: apt-get failed" >&2; exit 1; }
fi
if [ ${#pymissing[@]} -gt 0 ]; then
    echo "deps: installing Python packages: ${pymissing[*]} (pip install)"
    # Debian 12's own python3 refuses plain pip installs (PEP 668, "externally managed"): retry with the flag
    # that allows them, which only affects this machine's python3 site-packages.
    if ! python3 -m pip install -q "${pymissing[@]}" >/tmp/zllm-deps-pip.log 2>&1; then
        if grep -q externally-managed /tmp/zllm-deps-pip.log; then
            python3 -m pip install -q --break-system-packages "${pymissing[@]}" >/tmp/zllm-deps-pip.log 2>&1
        fi
    fi
    grep -i error /tmp/zllm-deps-pip.log >&2 || true
    for m in "${pymods[@]}"; do python3 -c "import $m" || { echo "deps: python module $m still missing" >&2; exit 1; }; done
fi
exit 0
