#!/usr/bin/env python3
"""tests/oracle/make_oracle.py: oracle logits for the architectures, RoPE variants and sliding windows zllm
computes, from models built by transformers (not by zllm) and written to GGUF with the gguf package's GGUFWriter
(not zllm's writer) the way llama.cpp's convert_hf_to_gguf.py writes that architecture.

RoPE variants and architectures (tiny random models; each also as NAME-bf16, its BF16 twin: the same network with
Q/K weights (phi3: the fused QKV) at the other matrices' scale instead of 2.5 times it (below), its matrices
rounded to and stored as BF16, norms and factors F32, transformers' logits on the rounded weights):
  llama3, linear, yarn   LlamaConfig with rope_type llama3 (rope_freqs.weight) / linear / yarn
  qwen3, qwen3-yarn      Qwen3Config without and with yarn
  phi3                   Phi3Config with LongRoPE (rope_factors_long/short and the attention factor key) and
                         partial rotary (fused attn_qkv / ffn_up)
  phi3-hd96              Phi-3 mini's head size: dim 192 = 2 heads x 96 (1 KV head), full rotary LongRoPE, its
                         declared window 2047 (wider than the engine contexts of the prompts)
Their prompts cross the scaling's frequency bands (positions beyond the original context: 2k+ for llama3).

gemma3 and sliding windows (F32, eager attention, fixed seeds; vocab 320, window 16, three prompts of 64 to 96
tokens prefilled in part and decoded one token per step, every one longer than the window):
  gemma3-swa         Gemma3ForCausalLM: dim 64, 6 layers (5 sliding + 1 global, llama.cpp's fixed pattern of 6),
                     4 heads / 2 KV heads of 16, FFN 128, RoPE bases 10000 (sliding) and 1000000 (global)
  gemma3-linear      the same shape with linear RoPE scaling (factor 8) on the global layer, as Gemma 3 4B+ has
  gemma3-swa-bf16    gemma3-swa's network with every matrix (token_embd included) stored as BF16 (norms F32)
  mistral-swa        MistralForCausalLM written as a llama GGUF: dim 64, 3 layers, sliding window on every layer
These mirror the converter's gemma3 conventions: norm weights stored as (1 + w) (Gemma3RMSNorm multiplies by
1 + w), token_embd tied (no output.weight), Q/K not permuted (NEOX rope); tensor names from the gguf package's
tensor map. Each file also carries a small SentencePiece-style vocabulary (byte tokens and a few word pieces) so
that zllm-run and the broker can run it; the prompts are token ids.

Why the twins' Q/K scale (TWIN_QK_GAIN) is smaller than the F32 cases' (QK_GAIN): a BF16 engine rounds every
matrix product's input and its K/V cache to bf16 (8 significant bits). At QK_GAIN, whose attention is peaked,
those roundings alone move llama3's, yarn's and phi3's logits by 2.9e-2 to 4.9e-2 relative to the unrounded
network (tests/oracle/emulate_bf16.py emulates the CUDA engine's rounding points, and the CUDA engine's errors
agree), beyond the twins' 2e-2 bound, so the bound cannot tell rounding from a bug there. At TWIN_QK_GAIN the
emulated engine stays below 7e-3 on these twins while RoPE still decides the logits: dropping the frequency
scaling or the attention factor moves the oracle rows by 7e-2 to 0.3 (emulate_bf16.py --bug).

Converter conventions for all: tensor names and metadata keys, llama's Q/K row permutation (halves -> adjacent
pairs per head).

Outputs in OUT per case NAME: NAME.gguf, NAME.logits.f32 (transformers' f32 logits at the check positions,
[rows][vocab] little-endian f32, prompt after prompt) and NAME.txt, which describes them:

    vocab V
    window W                            (the sliding window, only where the model has one)
    greedy N IDS...                     (sliding-window cases: transformers' greedy continuation of prompt 0,
                                         N_GREEDY tokens past the window, for tests/test_e2e_gemma3.sh; a near
                                         tie in it stops the script)
    prompt N_TOKENS N_CTX N_CHECKS      (N_CTX: the context the engine must be made with; LongRoPE depends on it)
    TOKENS...
    CHECK POSITIONS...                  (ascending; the logits rows, in this order, prompt after prompt)

tests/oracle_check.h reads them for tests/test_oracle.c and cuda/test_oracle_gpu.cu (no torch needed there).

Command that made the committed files (from the repository root; needs torch, transformers, gguf, numpy):
    python3 tests/oracle/make_oracle.py --out tests/data/oracle
(one case or a few: name them after the options; NAME-bf16 makes the twin alone).
"""
import argparse
import math
import os
import sys

import numpy as np

VOCAB = 512
QK_GAIN = 2.5       # the F32 cases' Q/K weight scale (init_weights)
TWIN_QK_GAIN = 1.0  # the BF16 twins' (docstring: why smaller)


def init_weights(model, seed, qk_gain=2.5):
    """random weights large enough that attention is peaked (so RoPE matters to the logits); qk_gain: the scale of
    the Q and K (phi3: fused QKV) matrices over that of the others"""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = qk_gain if any(k in name for k in ("q_proj", "k_proj", "qkv_proj")) else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permutation of llama Q/K rows: halves -> adjacent pairs per head"""
    out_dim = w.shape[0]
    return w.reshape(n_head, 2, out_dim // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_factors(base, dim, factor, low, high, old_ctx):
    """rope_freqs.weight as convert_hf_to_gguf computes it for rope_type llama3"""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    lo_wl, hi_wl = old_ctx / low, old_ctx / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            s = (old_ctx / wl - low) / (high - low)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def np32(t):
    return t.detach().float().numpy().astype(np.float32)


def write_gguf(path, arch, kv, tensors, bf16=False):
    """bf16: matrices (2-D tensors) stored as BF16, vectors (norms, RoPE factors) F32, as the converter does"""
    import gguf
    w = gguf.GGUFWriter(path, arch)
    for k, (kind, v) in kv.items():
        key = k.format(arch=arch)
        if kind == "u32":
            w.add_uint32(key, v)
        elif kind == "f32":
            w.add_float32(key, v)
        elif kind == "str":
            w.add_string(key, v)
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if bf16 and arr.ndim == 2:
            qt = gguf.GGMLQuantizationType.BF16
            w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def common_kv(cfg, head_dim, rope_dim, n_ctx):
    return {
        "{arch}.context_length": ("u32", n_ctx),
        "{arch}.embedding_length": ("u32", cfg.hidden_size),
        "{arch}.feed_forward_length": ("u32", cfg.intermediate_size),
        "{arch}.block_count": ("u32", cfg.num_hidden_layers),
        "{arch}.attention.head_count": ("u32", cfg.num_attention_heads),
        "{arch}.attention.head_count_kv": ("u32", cfg.num_key_value_heads),
        "{arch}.attention.key_length": ("u32", head_dim),
        "{arch}.attention.value_length": ("u32", head_dim),
        "{arch}.rope.dimension_count": ("u32", rope_dim),
        "{arch}.rope.freq_base": ("f32", float(cfg.rope_parameters["rope_theta"])),
        "{arch}.attention.layer_norm_rms_epsilon": ("f32", float(cfg.rms_norm_eps)),
    }


def llama_like_tensors(model, cfg, permute_qk, qk_norm):
    sd = model.state_dict()
    t = [("token_embd.weight", np32(sd["model.embed_tokens.weight"])),
         ("output_norm.weight", np32(sd["model.norm.weight"]))]
    if not cfg.tie_word_embeddings:
        t.append(("output.weight", np32(sd["lm_head.weight"])))
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        wq, wk = np32(sd[p + "self_attn.q_proj.weight"]), np32(sd[p + "self_attn.k_proj.weight"])
        if permute_qk:
            wq, wk = permute(wq, cfg.num_attention_heads), permute(wk, cfg.num_key_value_heads)
        t += [(b + "attn_norm.weight", np32(sd[p + "input_layernorm.weight"])),
              (b + "attn_q.weight", wq), (b + "attn_k.weight", wk),
              (b + "attn_v.weight", np32(sd[p + "self_attn.v_proj.weight"])),
              (b + "attn_output.weight", np32(sd[p + "self_attn.o_proj.weight"])),
              (b + "ffn_norm.weight", np32(sd[p + "post_attention_layernorm.weight"])),
              (b + "ffn_gate.weight", np32(sd[p + "mlp.gate_proj.weight"])),
              (b + "ffn_up.weight", np32(sd[p + "mlp.up_proj.weight"])),
              (b + "ffn_down.weight", np32(sd[p + "mlp.down_proj.weight"]))]
        if qk_norm:
            t += [(b + "attn_q_norm.weight", np32(sd[p + "self_attn.q_norm.weight"])),
                  (b + "attn_k_norm.weight", np32(sd[p + "self_attn.k_norm.weight"]))]
    return t


def phi3_tensors(model, cfg):
    sd = model.state_dict()
    t = [("token_embd.weight", np32(sd["model.embed_tokens.weight"])),
         ("output_norm.weight", np32(sd["model.norm.weight"])),
         ("output.weight", np32(sd["lm_head.weight"]))]
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t += [(b + "attn_norm.weight", np32(sd[p + "input_layernorm.weight"])),
              (b + "attn_qkv.weight", np32(sd[p + "self_attn.qkv_proj.weight"])),
              (b + "attn_output.weight", np32(sd[p + "self_attn.o_proj.weight"])),
              (b + "ffn_norm.weight", np32(sd[p + "post_attention_layernorm.weight"])),
              (b + "ffn_up.weight", np32(sd[p + "mlp.gate_up_proj.weight"])),
              (b + "ffn_down.weight", np32(sd[p + "mlp.down_proj.weight"]))]
    rp = cfg.rope_parameters
    t += [("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32)),
          ("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))]
    return t


BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            hidden_act="silu", attention_dropout=0.0)


def case_llama3():
    import transformers
    rp = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    cfg = transformers.LlamaConfig(**BASE, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                                   rms_norm_eps=1e-5, rope_parameters=rp, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    kv = common_kv(cfg, 16, 16, 4096)  # no rope.scaling.* keys: llama.cpp's converter writes rope_freqs only
    t = llama_like_tensors
    ff = llama3_factors(10000.0, 16, 8.0, 1.0, 4.0, 256)
    prompts = [(2100, 2304, [5, 63, 255, 700, 1500, 2047, 2097, 2098, 2099]), (40, 64, [39])]
    return "llama", cfg, model, kv, lambda m: t(m, cfg, True, False) + [("rope_freqs.weight", ff)], prompts


def case_linear():
    import transformers
    rp = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    cfg = transformers.LlamaConfig(**BASE, num_key_value_heads=4, head_dim=16, max_position_embeddings=2048,
                                   rms_norm_eps=1e-5, rope_parameters=rp, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    kv = common_kv(cfg, 16, 16, 2048)
    kv["{arch}.rope.scaling.type"] = ("str", "linear")
    kv["{arch}.rope.scaling.factor"] = ("f32", 4.0)
    prompts = [(700, 1024, [9, 300, 697, 698, 699])]
    return "llama", cfg, model, kv, lambda m: llama_like_tensors(m, cfg, True, False), prompts


def case_yarn():
    import transformers
    rp = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
    cfg = transformers.LlamaConfig(**BASE, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                                   rms_norm_eps=1e-5, rope_parameters=rp, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    kv = common_kv(cfg, 16, 16, 1024)
    kv["{arch}.rope.scaling.type"] = ("str", "yarn")
    kv["{arch}.rope.scaling.factor"] = ("f32", 4.0)
    kv["{arch}.rope.scaling.original_context_length"] = ("u32", 256)
    prompts = [(900, 1024, [17, 255, 600, 897, 898, 899])]
    return "llama", cfg, model, kv, lambda m: llama_like_tensors(m, cfg, True, False), prompts


def case_qwen3():
    import transformers
    rp = {"rope_type": "default", "rope_theta": 1000000.0}
    cfg = transformers.Qwen3Config(**BASE, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                                   rms_norm_eps=1e-6, rope_parameters=rp, tie_word_embeddings=True,
                                   attention_bias=False, use_sliding_window=False)
    model = transformers.Qwen3ForCausalLM(cfg)
    kv = common_kv(cfg, 32, 32, 2048)
    prompts = [(300, 512, [3, 100, 297, 298, 299]), (25, 64, [24])]
    return "qwen3", cfg, model, kv, lambda m: llama_like_tensors(m, cfg, False, True), prompts


def case_qwen3_yarn():
    """Qwen3 with YaRN, as Qwen publishes its long-context setting (neox layout, tied head)"""
    import transformers
    rp = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    cfg = transformers.Qwen3Config(**BASE, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                                   rms_norm_eps=1e-6, rope_parameters=rp, tie_word_embeddings=True,
                                   attention_bias=False, use_sliding_window=False)
    model = transformers.Qwen3ForCausalLM(cfg)
    kv = common_kv(cfg, 16, 16, 512)
    kv["{arch}.rope.scaling.type"] = ("str", "yarn")
    kv["{arch}.rope.scaling.factor"] = ("f32", 4.0)
    kv["{arch}.rope.scaling.original_context_length"] = ("u32", 128)
    prompts = [(500, 512, [11, 127, 400, 497, 498, 499])]
    return "qwen3", cfg, model, kv, lambda m: llama_like_tensors(m, cfg, False, True), prompts


def case_phi3():
    import transformers
    orig, max_pos, rot = 256, 2048, 12  # partial rotary: 12 of 16 dims (factor 0.75)
    rng = np.random.RandomState(3)
    long_f = [round(float(x), 4) for x in 1.0 + 7.0 * np.sort(rng.rand(rot // 2))]
    short_f = [round(float(x), 4) for x in 1.0 + 0.5 * np.sort(rng.rand(rot // 2))]
    rp = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": long_f, "short_factor": short_f,
          "partial_rotary_factor": 0.75, "original_max_position_embeddings": orig}
    cfg = transformers.Phi3Config(**BASE, num_key_value_heads=2, max_position_embeddings=max_pos,
                                  original_max_position_embeddings=orig, rms_norm_eps=1e-5, rope_parameters=rp,
                                  tie_word_embeddings=False, sliding_window=None, pad_token_id=0, eos_token_id=2)
    model = transformers.Phi3ForCausalLM(cfg)
    kv = common_kv(cfg, 16, rot, max_pos)
    kv["{arch}.rope.scaling.original_context_length"] = ("u32", orig)
    scale = max_pos / orig
    kv["{arch}.rope.scaling.attn_factor"] = ("f32", math.sqrt(1 + math.log(scale) / math.log(orig)))
    # long factors: a prompt beyond the original context with an engine context above it; short: within it
    prompts = [(600, 1024, [7, 200, 597, 598, 599]), (200, 256, [30, 197, 198, 199])]
    return "phi3", cfg, model, kv, lambda m: phi3_tensors(m, cfg), prompts


def case_phi3_hd96():
    """Phi-3 mini's head size (96) and full rotary, with its declared window (2047) above every engine context the
    prompts need, as Phi-3 mini files carry it"""
    import transformers
    orig, max_pos, hd = 256, 2048, 96
    rng = np.random.RandomState(5)
    long_f = [round(float(x), 4) for x in 1.0 + 7.0 * np.sort(rng.rand(hd // 2))]
    short_f = [round(float(x), 4) for x in 1.0 + 0.5 * np.sort(rng.rand(hd // 2))]
    rp = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": long_f, "short_factor": short_f,
          "original_max_position_embeddings": orig}
    base = dict(BASE, hidden_size=2 * hd, num_attention_heads=2)
    cfg = transformers.Phi3Config(**base, num_key_value_heads=1, max_position_embeddings=max_pos,
                                  original_max_position_embeddings=orig, rms_norm_eps=1e-5, rope_parameters=rp,
                                  tie_word_embeddings=False, sliding_window=2047, pad_token_id=0, eos_token_id=2)
    model = transformers.Phi3ForCausalLM(cfg)
    kv = common_kv(cfg, hd, hd, max_pos)
    kv["{arch}.rope.scaling.original_context_length"] = ("u32", orig)
    kv["{arch}.rope.scaling.attn_factor"] = ("f32", math.sqrt(1 + math.log(max_pos / orig) / math.log(orig)))
    kv["{arch}.attention.sliding_window"] = ("u32", 2047)
    prompts = [(600, 1024, [7, 200, 597, 598, 599]), (200, 256, [30, 197, 198, 199])]
    return "phi3", cfg, model, kv, lambda m: phi3_tensors(m, cfg), prompts


CASES = {"llama3": case_llama3, "linear": case_linear, "yarn": case_yarn, "qwen3": case_qwen3,
         "qwen3-yarn": case_qwen3_yarn, "phi3": case_phi3, "phi3-hd96": case_phi3_hd96}


def build(name, twin=False):
    """case NAME's transformers model (f32, eval, eager attention) and its description: (arch, cfg, model, kv,
    tensors, prompts). twin: the BF16 twin's network, its matrices rounded to bf16 (kept in f32, so the model's
    own f32 logits are the oracle)"""
    import torch
    torch.manual_seed(0)
    arch, cfg, model, kv, tensors, prompts = CASES[name]()
    model.config._attn_implementation = "eager"
    init_weights(model, seed=sum(map(ord, name)), qk_gain=TWIN_QK_GAIN if twin else QK_GAIN)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.float().eval()
    if twin:
        round_bf16(model)
    return arch, cfg, model, kv, tensors, prompts


def make(name, outdir, twin_only=False):
    if not twin_only:
        arch, cfg, model, kv, tensors, prompts = build(name)
        write_gguf(os.path.join(outdir, name + ".gguf"), arch, kv, tensors(model))
        window = kv.get("{arch}.attention.sliding_window", (None, 0))[1]
        save_logits(name, outdir, arch, cfg, model, prompts, window=window)
    arch, cfg, model, kv, tensors, prompts = build(name, twin=True)
    window = kv.get("{arch}.attention.sliding_window", (None, 0))[1]
    write_gguf(os.path.join(outdir, name + "-bf16.gguf"), arch, kv, tensors(model), bf16=True)
    save_logits(name + "-bf16", outdir, arch, cfg, model, prompts, seed_name=name, window=window)


def save_logits(name, outdir, arch, cfg, model, prompts, seed_name=None, window=0):
    import torch
    import transformers
    rng = np.random.RandomState(sum(map(ord, seed_name or name)) + 7)
    lines = [f"# {name}: {arch}, rope {cfg.rope_parameters}; transformers {transformers.__version__}, "
             f"torch {torch.__version__}, eager f32", f"vocab {VOCAB}"]
    if window:
        lines.append(f"window {window}")
    rows = []
    for n_tok, n_ctx, checks in prompts:
        toks = rng.randint(0, VOCAB, size=n_tok).tolist()
        with torch.no_grad():
            lg = model(torch.tensor([toks])).logits[0].numpy()
        for p in checks:
            rows.append(lg[p].astype("<f4"))
        lines += [f"prompt {n_tok} {n_ctx} {len(checks)}", " ".join(map(str, toks)), " ".join(map(str, checks))]
    with open(os.path.join(outdir, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    np.stack(rows).astype("<f4").tofile(os.path.join(outdir, name + ".logits.f32"))
    print(f"{name}: {arch}, {len(rows)} rows of {VOCAB} logits")


SWA_VOCAB = 320
SWA_WINDOW = 16
SWA_PROMPTS = [(80, 40), (96, 9), (64, 20)]  # (length, n_prefill): the rest is decoded one token per step
SWA_N_CTX = 128
N_GREEDY = 40  # greedy tokens after prompt 0 (positions 80..119)


def gemma3_model(linear):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    full = {"rope_type": "default", "rope_theta": 1000000.0}
    if linear:
        full = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    cfg = Gemma3TextConfig(vocab_size=SWA_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                           sliding_window=SWA_WINDOW, max_position_embeddings=512, rms_norm_eps=1e-6,
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
    cfg = MistralConfig(vocab_size=SWA_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=SWA_WINDOW,
                        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                        tie_word_embeddings=False, initializer_range=0.15, attn_implementation="eager")
    torch.manual_seed(37)
    m = MistralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.3)
    return cfg, m


def add_vocab(w):
    """a small SentencePiece-style ("llama") vocabulary of SWA_VOCAB tokens, so that zllm-run and the broker can run the
    file: <pad>, <eos>, <bos>, <unk>, the 256 byte tokens, then word pieces (with Gemma's ids for the specials)"""
    import gguf
    pieces = ["\u2581"] + [chr(c) for c in range(97, 123)] + ["\u2581" + chr(c) for c in range(97, 123)]
    pieces += ["\u2581the", "\u2581and", "th", "he", "in", "er", "an"]
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    assert len(toks) == SWA_VOCAB
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


def write_gguf_mapped(path, arch_name, cfg, model, bf16=False):
    """a transformers model written through the gguf package's tensor map (the gemma3 and Mistral cases)"""
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
            data = permute(data, cfg.num_attention_heads)
        if arch_name == "llama" and name.endswith("k_proj.weight"):
            data = permute(data, cfg.num_key_value_heads)
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


SWA_CASES = {"gemma3-swa": ("gemma3", lambda: gemma3_model(0)), "gemma3-linear": ("gemma3", lambda: gemma3_model(1)),
             "mistral-swa": ("llama", mistral_model), "gemma3-swa-bf16": ("gemma3", lambda: gemma3_model(0))}


def make_swa(name, outdir):
    import torch
    import transformers
    arch, build = SWA_CASES[name]
    rng = np.random.default_rng(2026)  # the same prompts for every case
    prompts = [[int(x) for x in rng.integers(1, SWA_VOCAB, size=n)] for n, _ in SWA_PROMPTS]
    cfg, m = build()
    bf16 = name.endswith("-bf16")
    if bf16:
        round_bf16(m)
    write_gguf_mapped(os.path.join(outdir, name + ".gguf"), arch, cfg, m, bf16)
    rows = []
    lines = [f"# {name}: {arch}, sliding window {SWA_WINDOW}; transformers {transformers.__version__}, "
             f"torch {torch.__version__}, eager f32", f"vocab {SWA_VOCAB}", f"window {SWA_WINDOW}"]
    greedy, gaps = [], []  # prompt 0 continued greedily (the broker test, tests/test_e2e_gemma3.sh)
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
    lines.append(f"greedy {len(greedy)} " + " ".join(map(str, greedy)))
    with torch.no_grad():
        for toks, (n, n_prefill) in zip(prompts, SWA_PROMPTS):
            lg = m(torch.tensor([toks])).logits[0].float().numpy()
            rows.append(lg[n_prefill - 1:])
            checks = list(range(n_prefill - 1, n))
            lines += [f"prompt {n} {SWA_N_CTX} {len(checks)}", " ".join(map(str, toks)), " ".join(map(str, checks))]
    logits = np.concatenate(rows).astype("<f4")
    logits.tofile(os.path.join(outdir, name + ".logits.f32"))
    with open(os.path.join(outdir, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: {logits.shape[0]} rows x {SWA_VOCAB}, max |logit| {np.abs(logits).max():.3f}, greedy gap "
          f"{min(gaps):.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/oracle")
    ap.add_argument("cases", nargs="*", default=list(CASES) + list(SWA_CASES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for c in a.cases:
        if c in SWA_CASES:
            make_swa(c, a.out)
        elif c.endswith("-bf16") and c[:-len("-bf16")] in CASES:
            make(c[:-len("-bf16")], a.out, twin_only=True)
        elif c in CASES:
            make(c, a.out)
        else:
            raise SystemExit(f"{c}: no such case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
