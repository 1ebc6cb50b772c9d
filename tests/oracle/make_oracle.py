#!/usr/bin/env python3
"""tests/oracle/make_oracle.py: small random models built by transformers, written to GGUF the way llama.cpp's
converter (convert_hf_to_gguf.py) writes them, and transformers' logits for a few prompts beside them.

Models (F32, eager attention, fixed seeds):
  gemma3-swa         Gemma3ForCausalLM: dim 64, 6 layers (5 sliding + 1 global, llama.cpp's fixed pattern of 6),
                     4 heads / 2 KV heads of 16, FFN 128, vocab 320, sliding window 16, RoPE bases 10000 (sliding)
                     and 1000000 (global)
  gemma3-linear      the same shape with linear RoPE scaling (factor 8) on the global layer, as Gemma 3 4B+ has
  gemma3-swa-bf16    gemma3-swa's network with every matrix (token_embd included) stored as BF16 (norms F32, as the
                     converter keeps 1-D tensors); the reference is transformers on those rounded weights in f32
  mistral-swa        MistralForCausalLM written as a llama GGUF: dim 64, 3 layers, 4 heads / 2 KV heads of 16,
                     FFN 128, vocab 320, sliding window 16 on every layer

Converter conventions mirrored here (not zllm's writer): gemma3 norm weights are stored as (1 + w) (Gemma3RMSNorm
multiplies by 1 + w), token_embd is tied (no output.weight), Q/K are not permuted (NEOX rope); llama Q/K rows are
permuted per head so that RoPE rotates adjacent pairs (LlamaModel.permute); tensor names come from the gguf
package's tensor map for the architecture. Each file also carries a small SentencePiece-style vocabulary (byte
tokens and a few word pieces) so that zllm-run and the broker can run it; the prompts are token ids.

Outputs in OUT (default tests/data/oracle), per model NAME: NAME.gguf, NAME.json (prompts: tokens and n_prefill;
rows per prompt; vocab; prompt 0's greedy continuation of N_GREEDY tokens, no near tie in it; producer versions) and NAME.logits.f32 (little-endian float32: for each prompt in order,
the logits rows of positions n_prefill-1 .. len-1, each [vocab]). Every prompt is longer than the window, so the
decode rows and the prefill both cross it.

Usage (from the repository root; needs torch, transformers, gguf, numpy), as run to make the committed files:
    python3 tests/oracle/make_oracle.py --out tests/data/oracle
"""
import argparse
import json
import os

import numpy as np

VOCAB = 320
WINDOW = 16
PROMPTS = [(80, 40), (96, 9), (64, 20)]   # (length, n_prefill): the rest is decoded one token per step
N_GREEDY = 40                              # greedy tokens after prompt 0 (positions 80..119)


def gemma3_model(linear):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    full = {"rope_type": "default", "rope_theta": 1000000.0}
    if linear:
        full = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                           sliding_window=WINDOW, max_position_embeddings=512, rms_norm_eps=1e-6,
                           rope_parameters={"full_attention": full,
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                           tie_word_embeddings=True, initializer_range=0.15, attn_implementation="eager")
    torch.manual_seed(35 + linear)
    m = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():   # norms away from their zero init, so that (1 + w) is tested
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) * 0.3)
    return cfg, m


def mistral_model():
    import torch
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                        tie_word_embeddings=False, initializer_range=0.15, attn_implementation="eager")
    torch.manual_seed(37)
    m = MistralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.3)
    return cfg, m


def llama_permute(w, n_head, n_head_kv):
    """LlamaModel.permute of llama.cpp's converter: per head, halves -> interleaved pairs"""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_vocab(w):
    """a small SentencePiece-style ("llama") vocabulary of VOCAB tokens, so that zllm-run and the broker can run the
    file: <pad>, <eos>, <bos>, <unk>, the 256 byte tokens, then word pieces (with Gemma's ids for the specials)"""
    import gguf
    pieces = ["\u2581"] + [chr(c) for c in range(97, 123)] + ["\u2581" + chr(c) for c in range(97, 123)]
    pieces += ["\u2581the", "\u2581and", "th", "he", "in", "er", "an"]
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    assert len(toks) == VOCAB
    T = gguf.TokenType
    types = [T.CONTROL, T.CONTROL, T.CONTROL, T.UNKNOWN] + [T.BYTE] * 256 + [T.NORMAL] * len(pieces)
    scores = [0.0] * 260 + [-float(i) for i in range(len(pieces))]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)


def round_bf16(model):
    """rounds every matrix of the model to bf16 (in place, kept in f32): the weights a BF16 file holds"""
    import torch
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch.bfloat16).float())


def write_gguf(path, arch_name, cfg, model, bf16=False):
    import gguf
    arch = {"gemma3": gguf.MODEL_ARCH.GEMMA3, "llama": gguf.MODEL_ARCH.LLAMA}[arch_name]
    tmap = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(path, arch_name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_sliding_window(cfg.sliding_window)
    if arch_name == "gemma3":
        full = cfg.rope_parameters["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    else:
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                             else cfg.rope_theta)
        w.add_rope_dimension_count(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    add_vocab(w)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = t.detach().float().numpy().copy()
        if arch_name == "gemma3" and name.endswith("norm.weight"):
            data = data + 1.0
        if arch_name == "llama" and name.endswith("q_proj.weight"):
            data = llama_permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        if arch_name == "llama" and name.endswith("k_proj.weight"):
            data = llama_permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"{name}: no GGUF name")
        data = np.ascontiguousarray(data, dtype=np.float32)
        if bf16 and data.ndim == 2:
            w.add_tensor(new, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(new, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    import torch
    import transformers
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/oracle")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cases = [("gemma3-swa", "gemma3", lambda: gemma3_model(0)), ("gemma3-linear", "gemma3", lambda: gemma3_model(1)),
             ("mistral-swa", "llama", mistral_model), ("gemma3-swa-bf16", "gemma3", lambda: gemma3_model(0))]
    rng = np.random.default_rng(2026)
    prompts = [[int(x) for x in rng.integers(1, VOCAB, size=n)] for n, _ in PROMPTS]
    for name, arch, make in cases:
        cfg, m = make()
        bf16 = name.endswith("-bf16")
        if bf16:
            round_bf16(m)
        write_gguf(os.path.join(a.out, name + ".gguf"), arch, cfg, m, bf16)
        rows = []
        with torch.no_grad():
            for toks, (n, n_prefill) in zip(prompts, PROMPTS):
                lg = m(torch.tensor([toks])).logits[0].float().numpy()
                rows.append(lg[n_prefill - 1:])
        greedy, gaps = [], []   # prompt 0 continued greedily (the broker test, tests/test_e2e_gemma3.sh)
        with torch.no_grad():
            x = list(prompts[0])
            for _ in range(N_GREEDY):
                lg = m(torch.tensor([x])).logits[0, -1].float()
                top = torch.topk(lg, 2)
                greedy.append(int(top.indices[0]))
                gaps.append(float(top.values[0] - top.values[1]))
                x.append(greedy[-1])
        if min(gaps) < 1e-3:
            raise SystemExit(f"{name}: a near tie in the greedy continuation (gap {min(gaps):.2g})")
        logits = np.concatenate(rows).astype("<f4")
        logits.tofile(os.path.join(a.out, name + ".logits.f32"))
        hdr = {"model": name + ".gguf", "vocab": VOCAB, "window": WINDOW, "n_prompts": len(prompts),
               "prompts": [{"n_prefill": p, "tokens": t} for t, (_, p) in zip(prompts, PROMPTS)],
               "rows": [n - p + 1 for n, p in PROMPTS], "greedy": greedy, "greedy_min_gap": round(min(gaps), 4),
               "transformers": transformers.__version__,
               "torch": torch.__version__}
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump(hdr, f, indent=1)
        print(f"{name}: {logits.shape[0]} rows x {VOCAB}, max |logit| {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
