#!/usr/bin/env python3
"""tools/tokbench_hf.py: Hugging Face `tokenizers` (pip install tokenizers) on the same text and vocabulary as
zllm-tokbench, single-threaded, for the comparison in docs/perf.md. Also checks that both produce the same ids.

    build/bin/zllm-tokbench -m VOCAB.gguf [--chunk N] --text /tmp/tb.txt --ids /tmp/tb.ids
    python3 tools/tokbench_hf.py VOCAB.gguf /tmp/tb.txt /tmp/tb.ids [N]

N is the chunk size given to zllm-tokbench (default 4096; 0 = the whole text at once): the text is cut into the
same chunks (same rule) and encoded with encode_batch on one thread.

The tokenizers.Tokenizer is built from the GGUF's tokens and merges the way Llama 3's tokenizer.json is written:
BPE (ignore_merges for llama-bpe), a Split pre-tokenizer with the pre-tokenizer regex, then ByteLevel without its
own regex. Only llama-bpe and qwen2 vocabularies are handled."""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gguf  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

RE = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__)
        return 2
    path, text_path, ids_path = sys.argv[1:4]
    chunk = int(sys.argv[4]) if len(sys.argv) == 5 else 4096
    r = gguf.GGUFReader(path)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    t0 = time.perf_counter()
    tokens = strs("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama-bpe"))
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(RE[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    t_build = time.perf_counter() - t0
    data = open(text_path, "rb").read()
    chunks = []
    off, n = 0, len(data)
    while off < n:   # the cut rule of zllm-tokbench: after a newline in the second half, else after a space
        ln = n - off if chunk == 0 else min(chunk, n - off)
        if chunk and off + ln < n:
            cut = ln
            while cut > ln // 2 and data[off + cut - 1] != 10:
                cut -= 1
            if cut == ln // 2:
                cut = ln
                while cut > ln // 2 and data[off + cut - 1] != 32:
                    cut -= 1
            if cut > ln // 2:
                ln = cut
        chunks.append(data[off:off + ln].decode("utf-8"))
        off += ln
    nbytes = len(data)
    t0, c0 = time.perf_counter(), time.process_time()
    encs = tk.encode_batch(chunks, add_special_tokens=False)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    ids = [i for e in encs for i in e.ids]
    print("HF tokenizers %s (%s, built in %.2f s, one thread, %d chunks): %.2f MB in %.3f s = %.1f MB/s, %d tokens" %
          (__import__("tokenizers").__version__, pre, t_build, len(chunks), nbytes / 1e6, secs, nbytes / 1e6 / secs,
           len(ids)))
    print("HF tokenizers (CPU time): %.2f MB in %.3f s = %.1f MB/s" % (nbytes / 1e6, cpu, nbytes / 1e6 / cpu))
    ours = [int(x) for x in open(ids_path).read().split()]
    same = ours == ids
    if not same:
        k = next((i for i, (a, b) in enumerate(zip(ours, ids)) if a != b), min(len(ours), len(ids)))
        print("ids DIFFER from zllm at token %d (zllm %d tokens, HF %d)" % (k, len(ours), len(ids)))
    else:
        print("ids identical to zllm's (%d tokens)" % len(ids))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
