#!/usr/bin/env python3
"""tests/oracle/make_gemma3_270m.py: transformers' greedy tokens for Gemma 3 270M Q4_K_M (deploy/fetch-gemma3.sh),
the expected ids of tests/test_gemma3_270m.c.

transformers loads the GGUF itself (its gemma3 GGUF support dequantizes every tensor to f32 and undoes the
converter's (1 + w) norms), the prompts are tokenized by the tokenizer it reads from the same file, and each prompt
is continued greedily for 32 tokens (argmax of f32 logits, end-of-generation tokens not special: the loop never
stops early). One prompt is longer than the model's 512-token sliding window, so its local layers drop keys while
the global ones keep them. For each step the gap between the best and the second-best logit is recorded too
(a near tie is where two correct implementations may part).

Output: tests/data/oracle/gemma3-270m.json (model sha256, per prompt its text, its ids, the 32 expected ids and the
gaps). Usage (from the repository root; needs torch, transformers, accelerate, gguf; a few minutes on a CPU):
    python3 tests/oracle/make_gemma3_270m.py $(bash deploy/fetch-gemma3.sh) tests/data/oracle/gemma3-270m.json
"""
import hashlib
import json
import os
import sys

N_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Question: What is 12 times 12?\nAnswer:",
    "<start_of_turn>user\nWrite a haiku about autumn.<end_of_turn>\n<start_of_turn>model\n",
    "Counting: " + ", ".join(str(i) for i in range(1, 161)) + ",",
]


def main():
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, out = sys.argv[1], sys.argv[2]
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager").eval()
    res = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok(text).input_ids
            x = torch.tensor([ids])
            past, new, gaps = None, [], []
            for _ in range(N_NEW):
                o = m(x, past_key_values=past, use_cache=True)
                past = o.past_key_values
                lg = o.logits[0, -1].float()
                top = torch.topk(lg, 2)
                nxt = int(top.indices[0])
                new.append(nxt)
                gaps.append(round(float(top.values[0] - top.values[1]), 4))
                x = torch.tensor([[nxt]])
            res.append({"text": text, "ids": ids, "expect": new, "gaps": gaps})
            print(len(ids), "prompt tokens:", repr(tok.decode(new)), "min gap %.4f" % min(gaps))
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    with open(out, "w") as fo:
        json.dump({"model": f, "sha256": h, "n_new": N_NEW, "n_prompts": len(res), "prompts": res,
                   "transformers": transformers.__version__, "torch": torch.__version__}, fo, indent=1)


if __name__ == "__main__":
    main()
