#!/usr/bin/env python3
"""tests/oracle/tok_tiktoken.py: vectors for the byte-level BPE pre-tokenizers of tiktoken-made vocabularies
(Mistral NeMo's "tekken", and "gpt-4o" of Phi-4-mini and Llama 4), from implementations we did not write.

Input: Mistral NeMo's tokenizer, tekken_240718.json, as the PyPI package mistral-common ships it
(mistral_common/data/). Writes into OUT:
  - ggml-vocab-tekken.gguf: that vocabulary as llama.cpp's converter lays a tekken GGUF out (model gpt2, pre
    "tekken"; ids 0..999 the control tokens, then the ranks in order, each token written in GPT-2's byte-to-unicode
    alphabet; the merges that rebuild each token from the ranks below its own, in rank order);
    .inp/.out: the strings of tests/oracle/corpus.py and the ids of mistral-common's Tekkenizer.encode(s, bos=False,
    eos=False) (tiktoken underneath): special-token text is plain text, so the test encodes without parse_special;
  - ggml-vocab-gpt-4o.gguf: the first 24000 tokens of Llama 3's vocabulary (llama.cpp's ggml-vocab-llama-bpe.gguf,
    in the fixtures: Llama 3's tokens are tiktoken ranks, id = rank; they hold 3-digit numbers and contractions,
    where gpt-4o's split differs from tekken's) with pre "gpt-4o" (no control tokens);
    .inp/.out: the ids tiktoken gives with those ranks and o200k_base's split pattern (tiktoken's own source).
The vocabulary of gpt-4o itself is not on PyPI; the split pattern is what "gpt-4o" names, and these ranks test it.

Needs mistral-common, tiktoken, gguf. As run to make the committed files:
    python3 tests/oracle/tok_tiktoken.py --tekken .../mistral_common/data/tekken_240718.json \
        --llama-bpe $ZLLM_FIXTURES/vocab/ggml-vocab-llama-bpe.gguf --out tests/data/tokenizer
"""
import argparse
import base64
import inspect
import json
import os
import re
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

EXTRA = ["[INST] Hello [/INST]", "'ſ 'K I'ſ", "123456789 12 1234", "you'RE we'Ve", "<s>[INST]x[/INST]</s>", "CamelCaseHTTPServer XMLHttpRequest iPhone",
         "ǅungla ǈa Ǆ ǆ", "ᾈᾉ ﬀ", "path/to/file/", "a/\n/b", "'S 'T 'RE 'Ve I'M YOU'LL he'D", "don'T"]


def byte_encoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def split_token(ranks, token):
    """the two parts that tiktoken's BPE joins last to make token (merging only ranks below token's own)"""
    max_rank = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    return parts


def write_vocab(path, pre, specials, ranked):
    """specials: control token texts (ids 0..), ranked: token bytes in rank order"""
    enc = byte_encoder()
    ranks = {t: r for r, t in enumerate(ranked)}
    tokens = list(specials) + ["".join(enc[b] for b in t) for t in ranked]
    types = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * len(ranked)
    merges = []
    for t in ranked:
        if len(t) < 2:
            continue
        parts = split_token(ranks, t)
        if len(parts) != 2:
            raise SystemExit("token %r: no merge rebuilds it" % t)
        merges.append(" ".join("".join(enc[b] for b in p) for p in parts))
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if specials:
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama3_ranks(path, n):
    """the first n tokens of a Llama 3 vocabulary (tiktoken ranks: id = rank) as bytes"""
    dec = {c: b for b, c in byte_encoder().items()}
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    return [bytes(dec[c] for c in bytes(f.parts[i]).decode("utf-8")) for i in f.data[:n]]


def o200k_pattern():
    import tiktoken_ext.openai_public as op
    src = inspect.getsource(op.o200k_base)
    parts = re.findall(r'r"""(.*?)"""', src)
    if len(parts) != 7:
        raise SystemExit("o200k_base's pattern not found in tiktoken's source")
    return "|".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tekken", required=True)
    ap.add_argument("--llama-bpe", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import tiktoken
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    with open(a.tekken, encoding="utf-8") as f:
        j = json.load(f)
    tk = Tekkenizer.from_file(a.tekken)
    n_special = tk.num_special_tokens
    ranked = [base64.b64decode(v["token_bytes"]) for v in j["vocab"]][: tk.n_words - n_special]
    specials = [tk.id_to_piece(i) for i in range(n_special)]
    strings = corpus.texts(EXTRA)

    base = os.path.join(a.out, "ggml-vocab-tekken.gguf")
    write_vocab(base, "tekken", specials, ranked)
    corpus.write_inp(base + ".inp", strings)
    corpus.write_out(base + ".out", [tk.encode(s, bos=False, eos=False) for s in strings])

    small = llama3_ranks(a.llama_bpe, 24000)
    base = os.path.join(a.out, "ggml-vocab-gpt-4o.gguf")
    write_vocab(base, "gpt-4o", [], small)
    enc = tiktoken.Encoding("gpt-4o-test", pat_str=o200k_pattern(), mergeable_ranks={t: r for r, t in enumerate(small)},
                            special_tokens={})
    corpus.write_inp(base + ".inp", strings)
    corpus.write_out(base + ".out", [enc.encode_ordinary(s) for s in strings])
    print("%d strings; tiktoken %s" % (len(strings), tiktoken.__version__))


if __name__ == "__main__":
    main()
