#!/usr/bin/env python3
"""tests/test_http_tokenize.py: zllm-http's /tokenize and /detokenize with several vocabularies (`--model
NAME=PATH`, two different llama.cpp vocabulary files from the fixtures): each request uses the vocabulary of the
model its `model` field names (or of a --served-model-name alias of it), checked against llama.cpp's own token ids
for its test strings (.inp/.out); without `model` the first one is used (llama-server's shape); an unknown model
is a 404 in OpenAI's error shape, a `model` that is not a string a 400. Needs a broker only so that the gateway
starts at once; no worker."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import FIXTURES, Checks, Cluster, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402

VOCABS = {"qwen": "qwen2", "gpt2": "gpt-2"}   # model name -> the fixture's vocabulary (both byte-level BPE)
SEP = "\n__ggml_vocab_test__\n"


def vectors(name, limit=24):
    """llama.cpp's (text, ids) pairs for the vocabulary (the .inp strings and the .out lines)"""
    base = os.path.join(FIXTURES, "vocab", "ggml-vocab-%s.gguf" % name)
    with open(base + ".inp", encoding="utf-8") as f:
        texts = f.read().split(SEP)[:-1]
    with open(base + ".out") as f:
        outs = [[int(x) for x in line.split()] for line in f.read().split("\n")]
    return list(zip(texts, outs))[:limit]


def main():
    watchdog(60)
    ck = Checks("http_tokenize")
    paths = {m: os.path.join(FIXTURES, "vocab", "ggml-vocab-%s.gguf" % v) for m, v in VOCABS.items()}
    for p in paths.values():
        if not ck.ok(os.path.exists(p) and os.path.exists(p + ".inp"), "fixture %s (+ .inp/.out)" % p):
            return ck.report()
    cl = Cluster()
    cl.start_broker()
    gw = None
    try:
        gw = Gateway(cl.clients_ep, "--model", "qwen=%s" % paths["qwen"], "--model", "gpt2=%s" % paths["gpt2"],
                     "--served-model-name", "chat=qwen", "--served-model-name", "gpt-2=gpt2")
        vecs = {m: vectors(v) for m, v in VOCABS.items()}
        for m, vs in vecs.items():
            good = 0
            for text, want in vs:
                st, _, b = gw.json("POST", "/tokenize", {"model": m, "content": text, "parse_special": False})
                good += st == 200 and b.get("tokens") == want
            ck.ok(good == len(vs) and len(vs) >= 20, "/tokenize model %s: %d of %d of llama.cpp's vectors" % (
                m, good, len(vs)))
        # the two vocabularies really differ on these strings (else the checks above prove nothing)
        differ = sum(a[1] != b[1] for a, b in zip(vecs["qwen"], vecs["gpt2"]))
        ck.ok(differ >= 5, "the vocabularies tokenize %d of the strings differently" % differ)
        text = "Hello world, this is zllm!"
        ids = {}
        for m in ("qwen", "gpt2"):
            st, _, b = gw.json("POST", "/tokenize", {"model": m, "content": text})
            ids[m] = b.get("tokens") if st == 200 else None
            st, _, d = gw.json("POST", "/detokenize", {"model": m, "tokens": ids[m]})
            ck.ok(st == 200 and d.get("content") == text, "/detokenize model %s round-trips: %s %r" % (m, st, d))
        ck.ok(ids["qwen"] and ids["gpt2"] and ids["qwen"] != ids["gpt2"], "different ids per model: %r" % ids)
        st, _, d = gw.json("POST", "/detokenize", {"model": "gpt2", "tokens": ids["qwen"]})
        ck.ok(st == 200 and d.get("content") != text, "qwen's ids read with gpt2's vocabulary differ: %r" % d)
        # no model: the first --model (llama-server's shape)
        st, _, b = gw.json("POST", "/tokenize", {"content": text})
        ck.ok(st == 200 and b.get("tokens") == ids["qwen"], "no model: the first vocabulary: %r" % b)
        st, _, d = gw.json("POST", "/detokenize", {"tokens": ids["qwen"]})
        ck.ok(st == 200 and d.get("content") == text, "detokenize without model: %r" % d)
        # a --served-model-name alias stands for its model
        st, _, b = gw.json("POST", "/tokenize", {"model": "gpt-2", "content": text})
        ck.ok(st == 200 and b.get("tokens") == ids["gpt2"], "alias gpt-2 uses gpt2's vocabulary: %r" % b)
        st, _, b = gw.json("POST", "/tokenize", {"model": "chat", "content": text})
        ck.ok(st == 200 and b.get("tokens") == ids["qwen"], "alias chat uses qwen's vocabulary: %r" % b)
        # errors
        for path, body in (("/tokenize", {"model": "nope", "content": text}),
                           ("/detokenize", {"model": "nope", "tokens": [1, 2]}),
                           ("/tokenize", {"model": "x" * 300, "content": text})):
            st, _, b = gw.json("POST", path, body)
            error_ok(ck, "%s unknown model %.10s" % (path, body["model"]), st, b, 404, "model")
            ck.ok(isinstance(b, dict) and b["error"].get("code") == "model_not_found", "code model_not_found: %r" % b)
        for path, body in (("/tokenize", {"model": 5, "content": text}),
                           ("/detokenize", {"model": ["qwen"], "tokens": [1]})):
            st, _, b = gw.json("POST", path, body)
            error_ok(ck, "%s model not a string" % path, st, b, 400, "model")
        st, _, b = gw.json("POST", "/detokenize", {"model": "gpt2", "tokens": [10 ** 6]})
        error_ok(ck, "a token outside gpt2's vocabulary", st, b, 400, "tokens")
        ck.ok(gw.p.poll() is None, "the gateway is still running")
    finally:
        if gw:
            gw.close()
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
