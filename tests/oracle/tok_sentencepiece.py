#!/usr/bin/env python3
"""tests/oracle/tok_sentencepiece.py: SentencePiece vectors from the sentencepiece library itself, for Mistral's
SentencePiece vocabulary (Mistral 7B v0.3 / Mixtral: mistral_instruct_tokenizer_240323.model.v3, as the PyPI
package mistral-common ships it in mistral_common/data/).

Writes into OUT:
  - ggml-vocab-mistral-v3.gguf: the model's pieces as llama.cpp's converter writes a "llama" tokenizer (pieces,
    scores, token types: normal, unknown, control, user-defined, unused, byte; BOS 1, EOS 2, UNK 0;
    add_space_prefix, as the model's add_dummy_prefix, which the script checks), no tensors;
  - .inp/.out: the strings of tests/oracle/corpus.py and SentencePieceProcessor.encode(s) for each (no BOS;
    control-token text such as [INST] is plain text, so the test encodes without parse_special).

Needs sentencepiece, gguf. As run to make the committed files:
    python3 tests/oracle/tok_sentencepiece.py --model .../mistral_common/data/mistral_instruct_tokenizer_240323.model.v3 \\
        --out tests/data/tokenizer
"""
import argparse
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

EXTRA = ["[INST] Hello [/INST]", "<s>[INST]x[/INST]</s>", "[TOOL_CALLS] [AVAILABLE_TOOLS]", "<unk>", "▁▁x ▁",
         "3333 12345678", "x" * 70, " " * 20 + "y", "\t\t\n\n\r\n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=a.model)
    if sp.encode_as_pieces("a")[0] != "\u2581a":
        raise SystemExit("%s: not a model with add_dummy_prefix" % a.model)
    n = sp.vocab_size()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    base = os.path.join(a.out, "ggml-vocab-mistral-v3.gguf")
    w = gguf.GGUFWriter(base, arch="llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    strings = corpus.texts(EXTRA)
    corpus.write_inp(base + ".inp", strings)
    corpus.write_out(base + ".out", [sp.encode(s) for s in strings])
    print("%d strings; sentencepiece %s" % (len(strings), sentencepiece.__version__))


if __name__ == "__main__":
    main()
