#!/usr/bin/env python3
"""tests/oracle/tok_transformers.py: transformers' ids for llama.cpp's own vocabulary files, over the corpus of
tests/oracle/corpus.py (far more strings than llama.cpp's 46): Llama 3 (ggml-vocab-llama-bpe.gguf), Qwen2/Qwen3
(ggml-vocab-qwen2.gguf) and Phi-3 (ggml-vocab-phi-3.gguf), each loaded by transformers from the GGUF itself
(AutoTokenizer.from_pretrained(dir, gguf_file=...)) and encoded with add_special_tokens=False (special-token text
is parsed: the test encodes with parse_special on, without BOS). Llama 3's BPE model gets ignore_merges as its
tokenizer.json has it (see below).

Writes OUT/tf-NAME.inp and OUT/tf-NAME.out in llama.cpp's layout; the vocabulary files themselves come with the
fixtures (tests/fetch-fixtures.sh). Needs transformers, tokenizers (no torch). As run to make the committed files:
    python3 tests/oracle/tok_transformers.py --vocab $ZLLM_FIXTURES/vocab --out tests/data/tokenizer
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

EXTRA = {
    "llama-bpe": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<|eot_id|>",
                  "<|start_header_id|>", "x<|eom_id|>y", "<|python_tag|>f()", "<|reserved_special_token_5|>",
                  "<|eot_id", "<<|eot_id|>>"],
    "qwen2": ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>", "<|endoftext|>",
              "<think>\nhmm\n</think>\n\nok", "<tool_call>\n{}\n</tool_call>", "<|im_start", "<<|im_end|>>"],
    "phi-3": ["<|user|>\nHi<|end|>\n<|assistant|>\n", "<|end|>", "<|system|>", "<s>x</s>", "<|endoftext|>",
              "<|user", " <|end|> "],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from transformers import AutoTokenizer
    import tokenizers
    import transformers

    for name, extra in EXTRA.items():
        tok = AutoTokenizer.from_pretrained(a.vocab, gguf_file="ggml-vocab-%s.gguf" % name)
        if name == "llama-bpe":
            # Llama 3's tokenizer.json sets "ignore_merges": true (a word that is a token is taken whole), which a
            # GGUF cannot say and transformers' GGUF loader leaves off; llama.cpp sets it for this pre-tokenizer
            tok.backend_tokenizer.model.ignore_merges = True
        strings = corpus.texts(extra)
        base = os.path.join(a.out, "tf-%s" % name)
        corpus.write_inp(base + ".inp", strings)
        corpus.write_out(base + ".out", [tok.encode(s, add_special_tokens=False) for s in strings])
        print("%s: %d strings" % (name, len(strings)))
    print("transformers %s, tokenizers %s" % (transformers.__version__, tokenizers.__version__))


if __name__ == "__main__":
    main()
