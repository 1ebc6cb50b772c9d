#!/usr/bin/env python3
"""tests/ref/make_refs.py: reference logits from an implementation we did not write (PyTorch + transformers).

For each GGUF model given, builds the same network as LlamaForCausalLM / Qwen2ForCausalLM (config from the GGUF
metadata, weights read with the `gguf` Python package, f32, eager attention) and records the logits of a fixed
token sequence: a prefill of N_PREFILL tokens then N_DECODE single-token decode steps, i.e. the logits rows at
positions N_PREFILL-1 .. N_PREFILL+N_DECODE-1. The decode tokens are fixed in advance (not sampled), so the
reference does not depend on argmax ties.

Layout note: llama.cpp's converter permutes the rows of attn_q / attn_k of llama models so that RoPE rotates
adjacent pairs (x[2i], x[2i+1]); HF Llama rotates halves (x[i], x[i+d/2]). We undo that permutation per head
before loading into transformers, so both compute the same function. qwen2 GGUFs are not permuted.

Outputs, per model NAME (the .gguf basename): OUT/NAME.json (header: model file, sha256 of the model file,
tokens, n_prefill, rows, vocab, dtype, producer versions) and OUT/NAME.logits.f32 (raw little-endian float32,
[rows][vocab]).

Before anything else the script checks itself: greedy generation with transformers from BOS on stories260K must
reproduce the 200 golden ids of llama2.c's run.c (--fixtures DIR, default $ZLLM_FIXTURES or tests/data).

A real quantized model (--hf-gguf, e.g. SmolLM2-135M-Instruct Q4_1 from deploy/fetch-model.sh) is loaded by
transformers' own GGUF loader instead (needs accelerate too) and only a subset of each logits row is stored
(OUT/NAME.idx.i32 holds the ids, [rows][subset] int32), see make_ref_hf_gguf().

Usage (from the repository root; needs torch, transformers, accelerate, gguf, numpy), as run to make the
committed files:
    python3 tests/ref/make_refs.py --out tests/ref tests/data/stories260K/stories260K.gguf \
        tests/ref/tiny-llama.gguf tests/ref/tiny-qwen2.gguf --hf-gguf $(bash deploy/fetch-model.sh)
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

N_PREFILL = 7
N_DECODE = 5


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def load_gguf(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise SystemExit(f"{path}: unsupported architecture {arch}")
    t = {x.name: x for x in r.tensors}

    def g(k, d=None):
        return field(r, f"{arch}.{k}", d)

    emb = t["token_embd.weight"]
    dim = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    cfg = dict(
        arch=arch,
        n_layers=int(g("block_count")),
        dim=dim,
        ffn=int(g("feed_forward_length")),
        heads=heads,
        kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=int(g("attention.key_length", dim // heads)),
        n_ctx=int(g("context_length", 2048)),
        rope_base=float(g("rope.freq_base", 10000.0)),
        eps=float(g("attention.layer_norm_rms_epsilon", 1e-6 if arch == "qwen2" else 1e-5)),
        vocab=int(emb.shape[1]),
        tied="output.weight" not in t,
    )
    rope_dim = int(g("rope.dimension_count", cfg["head_dim"]))
    if rope_dim != cfg["head_dim"]:
        raise SystemExit(f"{path}: partial RoPE is not modelled by this script")

    def w(name):
        x = t[name]
        if x.tensor_type.name != "F32":
            raise SystemExit(f"{path}: {name} is {x.tensor_type.name}; reference models must be F32")
        # GGUF ne = [n_in, n_out]; the reader gives numpy shape (n_out, n_in), which is torch Linear's layout
        return np.array(x.data, dtype=np.float32).reshape([int(v) for v in reversed(x.shape)])

    return cfg, w, t


def unpermute(wt, n_head):
    """inverse of llama.cpp's permute(): rows per head from (pairs) to (halves) order"""
    out_dim, in_dim = wt.shape
    hd = out_dim // n_head
    return wt.reshape(n_head, hd // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def build_hf(cfg, w, t):
    import torch
    import transformers
    common = dict(
        vocab_size=cfg["vocab"], hidden_size=cfg["dim"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["n_ctx"], rms_norm_eps=cfg["eps"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_base"]},
        tie_word_embeddings=cfg["tied"], hidden_act="silu",
    )
    if cfg["arch"] == "llama":
        hc = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        model = transformers.LlamaForCausalLM(hc)
    else:
        hc = transformers.Qwen2Config(use_sliding_window=False, **common)
        model = transformers.Qwen2ForCausalLM(hc)
    model.config._attn_implementation = "eager"
    sd = {"model.embed_tokens.weight": w("token_embd.weight"), "model.norm.weight": w("output_norm.weight")}
    if not cfg["tied"]:
        sd["lm_head.weight"] = w("output.weight")
    llama = cfg["arch"] == "llama"
    for i in range(cfg["n_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        wq, wk = w(b + "attn_q.weight"), w(b + "attn_k.weight")
        if llama:
            wq, wk = unpermute(wq, cfg["heads"]), unpermute(wk, cfg["kv_heads"])
        sd[p + "self_attn.q_proj.weight"] = wq
        sd[p + "self_attn.k_proj.weight"] = wk
        sd[p + "self_attn.v_proj.weight"] = w(b + "attn_v.weight")
        sd[p + "self_attn.o_proj.weight"] = w(b + "attn_output.weight")
        if not llama:
            sd[p + "self_attn.q_proj.bias"] = w(b + "attn_q.bias").reshape(-1)
            sd[p + "self_attn.k_proj.bias"] = w(b + "attn_k.bias").reshape(-1)
            sd[p + "self_attn.v_proj.bias"] = w(b + "attn_v.bias").reshape(-1)
        sd[p + "input_layernorm.weight"] = w(b + "attn_norm.weight").reshape(-1)
        sd[p + "post_attention_layernorm.weight"] = w(b + "ffn_norm.weight").reshape(-1)
        sd[p + "mlp.gate_proj.weight"] = w(b + "ffn_gate.weight")
        sd[p + "mlp.up_proj.weight"] = w(b + "ffn_up.weight")
        sd[p + "mlp.down_proj.weight"] = w(b + "ffn_down.weight")
    sd["model.norm.weight"] = sd["model.norm.weight"].reshape(-1)
    tsd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(tsd, strict=False)
    missing = [k for k in missing if not (cfg["tied"] and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    if cfg["tied"]:
        model.tie_weights()
    model = model.float().eval()
    return model


def check_golden(fixtures):
    import torch
    d = os.path.join(fixtures, "stories260K")
    cfg, w, t = load_gguf(os.path.join(d, "stories260K.gguf"))
    model = build_hf(cfg, w, t)
    gold = [int(x) for x in open(os.path.join(d, "golden_greedy_ids.txt")).read().split()]
    ids = torch.tensor([[1]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=len(gold), do_sample=False, min_new_tokens=len(gold),
                             pad_token_id=0, eos_token_id=None)
    got = out[0, 1:].tolist()
    if got != gold:
        n = next((i for i, (a, b) in enumerate(zip(got, gold)) if a != b), len(gold))
        raise SystemExit(f"transformers does not reproduce the golden ids (first difference at {n}): the "
                         f"model mapping in this script is wrong")
    print(f"golden check: transformers reproduces the {len(gold)} golden greedy ids of stories260K")


def make_ref(path, outdir):
    import torch
    import transformers
    cfg, w, t = load_gguf(path)
    model = build_hf(cfg, w, t)
    name = os.path.basename(path)[:-len(".gguf")]
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    rng = np.random.RandomState(seed)
    toks = rng.randint(0, cfg["vocab"], size=N_PREFILL + N_DECODE).tolist()
    toks[0] = 1 if cfg["vocab"] > 1 else 0
    rows = []
    with torch.no_grad():
        # prefill then decode through the KV cache, as the engine does
        out = model(torch.tensor([toks[:N_PREFILL]]), use_cache=True)
        rows.append(out.logits[0, -1].numpy().astype(np.float32))
        past = out.past_key_values
        for i in range(N_PREFILL, N_PREFILL + N_DECODE):
            out = model(torch.tensor([[toks[i]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].numpy().astype(np.float32))
        # the same rows from one full forward pass must agree (sanity of the cache path)
        full = model(torch.tensor([toks])).logits[0, N_PREFILL - 1:].numpy()
    lg = np.stack(rows).astype("<f4")
    err = np.max(np.abs(full - lg)) / np.max(np.abs(lg))
    if err > 1e-5:
        raise SystemExit(f"{path}: cached and uncached transformers logits differ ({err})")
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    hdr = dict(model=os.path.basename(path), model_sha256=sha, arch=cfg["arch"], tokens=toks,
               n_prefill=N_PREFILL, n_decode=N_DECODE, rows=len(rows), vocab=cfg["vocab"],
               positions=list(range(N_PREFILL - 1, N_PREFILL + N_DECODE)), dtype="float32-le",
               logits_file=name + ".logits.f32",
               producer=f"transformers {transformers.__version__}, torch {torch.__version__}, eager f32")
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(hdr, f, indent=1)
        f.write("\n")
    lg.tofile(os.path.join(outdir, name + ".logits.f32"))
    print(f"{name}: {len(rows)} rows x {cfg['vocab']} logits, tokens {toks}")


def make_ref_hf_gguf(path, outdir, text, k_top=256, k_rand=256):
    """A real quantized model loaded by transformers' own GGUF support (its dequantization and its llama q/k
    un-permutation, not ours). The vocabulary is large, so only a subset of each logits row is stored: the
    k_top highest reference logits plus k_rand other ids drawn with a fixed seed, and each full row's max|logit|
    (the denominator of the relative error)."""
    import torch
    import transformers
    d, f = os.path.split(os.path.abspath(path))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    toks = tok(text).input_ids[:N_PREFILL + N_DECODE]
    if len(toks) != N_PREFILL + N_DECODE:
        raise SystemExit(f"{path}: the text gives {len(toks)} tokens, need {N_PREFILL + N_DECODE}")
    rows = []
    with torch.no_grad():
        out = model(torch.tensor([toks[:N_PREFILL]]), use_cache=True)
        rows.append(out.logits[0, -1].numpy().astype(np.float32))
        past = out.past_key_values
        for i in range(N_PREFILL, N_PREFILL + N_DECODE):
            out = model(torch.tensor([[toks[i]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].numpy().astype(np.float32))
    vocab = rows[0].shape[0]
    rng = np.random.RandomState(1234)
    idx, val, absmax = [], [], []
    for r in rows:
        top = np.argsort(-r, kind="stable")[:k_top]
        rest = np.setdiff1d(np.arange(vocab), top)
        pick = np.sort(np.concatenate([top, rng.choice(rest, size=k_rand, replace=False)])).astype(np.int32)
        idx.append(pick)
        val.append(r[pick])
        absmax.append(float(np.max(np.abs(r))))
    name = os.path.basename(path)[:-len(".gguf")]
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    hdr = dict(model=os.path.basename(path), model_sha256=sha, text=text, tokens=toks, n_prefill=N_PREFILL,
               n_decode=N_DECODE, rows=len(rows), vocab=vocab, subset=k_top + k_rand, row_absmax=absmax,
               positions=list(range(N_PREFILL - 1, N_PREFILL + N_DECODE)), dtype="float32-le",
               logits_file=name + ".logits.f32", index_file=name + ".idx.i32",
               producer=f"transformers {transformers.__version__} (GGUF loader), torch {torch.__version__}, eager f32")
    with open(os.path.join(outdir, name + ".json"), "w") as fo:
        json.dump(hdr, fo, indent=1)
        fo.write("\n")
    np.stack(val).astype("<f4").tofile(os.path.join(outdir, name + ".logits.f32"))
    np.stack(idx).astype("<i4").tofile(os.path.join(outdir, name + ".idx.i32"))
    greedy = [int(np.argmax(r)) for r in rows]
    print(f"{name}: {len(rows)} rows, subset {k_top + k_rand} of {vocab} logits, tokens {toks}, argmax {greedy}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/ref")
    ap.add_argument("--fixtures", default=os.environ.get("ZLLM_FIXTURES") or "tests/data")
    ap.add_argument("--skip-golden", action="store_true")
    ap.add_argument("--hf-gguf", action="append", default=[],
                    help="a real (quantized) model to load with transformers' GGUF loader; subset refs")
    ap.add_argument("--text", default="The capital of France is Paris, and the capital of Germany is Berlin.")
    ap.add_argument("models", nargs="*")
    a = ap.parse_args()
    if not a.skip_golden:
        check_golden(a.fixtures)
    for p in a.models:
        make_ref(p, a.out)
    for p in a.hf_gguf:
        make_ref_hf_gguf(p, a.out, a.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
