#!/usr/bin/env python3
"""tests/oracle/emulate_bf16.py: the CUDA engine's BF16 arithmetic emulated in torch (CPU) on the BF16 twins of
tests/data/oracle, to tell rounding from a bug when the CUDA engine misses the 2e-2 bar on a twin.

Each twin's network is built the way tests/oracle/make_oracle.py builds it (its functions, imported), then run
in f32 with bf16 rounding inserted exactly where a BF16 CUDA engine rounds (cuda/cuda_forward.cu, cuda/ops.cu):
  gemm  every matrix product's input: the RMSNorm outputs (attention, FFN and final norm), the attention output
        (ops_cast_dual), the SwiGLU / GeGLU product; the products themselves are exact bf16 x bf16 terms summed in
        f32 (wtc, cuBLAS), i.e. an f32 product of the rounded inputs
  kv    K after its bias and RoPE (attention factor included: engine/rope.c scales the cos/sin table), and V: the
        bf16 KV cache (k_qkv_rope_append); every row reads its own key from the cache
and nowhere else: the residual stream, the products' outputs, q, the norms' arithmetic, the softmax and P.V stay
f32 (the CUDA-core attention kernels serve head sizes 8-32, every oracle twin's; the tensor-core kernels, which
also round q and P to 16 bits, serve head sizes 64 and 128 only), and the embedding rows are bf16 values already.

For each twin it prints the max rel err (tests/oracle_check.h: max|a-b| / max|ref| per row, worst row) against
the committed reference logits on the oracle prompts (what gpu_test_oracle_gpu measures), and against the
unrounded network on the rows of gpu_test_engine_gpu's test_logits (its token stream replayed: four slots, twelve
mixed steps at positions below 20, the reference's greedy tokens fed back), both as max rel err and as that
test's own measure, the L2 rel err sqrt(sum (a-b)^2 / sum ref^2).
  --round gemm,kv (default) | gemm | kv | none   which rounding points to apply ("none" must reproduce the
                                                  committed logits to f32 accuracy: a check of the build)
  --bug NAME    a deliberately wrong engine: no-attn-factor (the RoPE attention factor of YaRN / LongRoPE
                dropped), attn-factor-once (applied to q only, so once in the scores instead of twice),
                no-freq-scaling (the RoPE frequencies of the unscaled model: llama3 factors, linear,
                YaRN or LongRoPE scaling dropped), neox-half (phi3's NEOX pairs taken head_dim / 2 apart
                instead of rope_dim / 2)
  --no-engine-test   the oracle prompts only
Needs torch, transformers, gguf, numpy; runs from the repository root:
    python3 tests/oracle/emulate_bf16.py [TWIN ...]      (default: every -bf16 case)
"""
import argparse
import contextlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_oracle  # noqa: E402

ATTN_MODULES = ["llama", "qwen3", "phi3", "gemma3", "mistral"]


def bf16(t):
    import torch
    return t.to(torch.bfloat16).to(t.dtype)


def twin_model(name):
    """(model, vocab) of twin NAME (NAME ends in -bf16), as make_oracle.py builds it"""
    base = name[:-len("-bf16")]
    if base in make_oracle.CASES:
        _, _, model, _, _, _ = make_oracle.build(base, twin=True)
        return model, make_oracle.VOCAB
    _, build = make_oracle.SWA_CASES[name]
    _, model = build()
    make_oracle.round_bf16(model)
    return model, make_oracle.SWA_VOCAB


def read_case(name, root="tests/data/oracle"):
    """the prompts [(tokens, checks)] and reference rows [rows][vocab] of case NAME"""
    prompts, vocab, lines = [], 0, []
    with open(os.path.join(root, name + ".txt")) as f:
        lines = [ln.split() for ln in f if ln.strip() and not ln.startswith("#")]
    i = 0
    while i < len(lines):
        w = lines[i]
        if w[0] == "vocab":
            vocab = int(w[1])
        elif w[0] == "prompt":
            prompts.append(([int(x) for x in lines[i + 1]], [int(x) for x in lines[i + 2]]))
            i += 2
        i += 1
    ref = np.fromfile(os.path.join(root, name + ".logits.f32"), dtype="<f4").reshape(-1, vocab)
    return prompts, ref


def max_rel(a, ref):
    return float(np.abs(a.astype(np.float64) - ref).max() / np.abs(ref).max())


def l2_rel(a, ref):
    d = a.astype(np.float64) - ref
    return float(np.sqrt((d * d).sum() / (ref.astype(np.float64) ** 2).sum()))


@contextlib.contextmanager
def engine_rounding(model, points):
    """bf16 rounding at the CUDA engine's points (module docstring) while inside"""
    import importlib
    import torch
    hooks, saved = [], []
    if "gemm" in points:
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                hooks.append(mod.register_forward_pre_hook(lambda m, args: (bf16(args[0]),) + tuple(args[1:])))
    if "kv" in points:
        for arch in ATTN_MODULES:
            mm = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
            orig = mm.eager_attention_forward

            def rounded(module, query, key, value, *a, _orig=orig, **kw):
                return _orig(module, query, bf16(key), bf16(value), *a, **kw)
            saved.append((mm, orig))
            mm.eager_attention_forward = rounded
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for mm, orig in saved:
            mm.eager_attention_forward = orig


@contextlib.contextmanager
def engine_bug(model, bug):
    """a deliberately wrong engine while inside (module docstring: --bug)"""
    import importlib
    import torch
    if not bug:
        yield
        return
    rot = model.model.rotary_emb
    orig_fwd, restore = rot.forward, []
    if bug in ("no-attn-factor", "no-freq-scaling"):
        def fwd(x, position_ids, *a, **kw):
            cos, sin = orig_fwd(x, position_ids, *a, **kw)
            s = float(rot.attention_scaling)
            if bug == "no-attn-factor":
                return cos / s, sin / s
            dim = cos.shape[-1]
            base = model.config.rope_parameters["rope_theta"]
            inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            fr = position_ids[..., None].float() * inv
            emb = torch.cat((fr, fr), dim=-1)
            return (emb.cos() * s).to(cos.dtype), (emb.sin() * s).to(sin.dtype)
        rot.forward = fwd
        restore.append(lambda: setattr(rot, "forward", orig_fwd))
    elif bug == "attn-factor-once":
        for arch in ("llama", "qwen3", "phi3"):
            mm = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")

            def once(q, k, cos, sin, *a, _orig=mm.apply_rotary_pos_emb, **kw):
                """q with the attention factor, k without it: the factor once in the scores instead of twice"""
                s = float(rot.attention_scaling)
                return _orig(q, k, cos, sin, *a, **kw)[0], _orig(q, k, cos / s, sin / s, *a, **kw)[1]
            restore.append(lambda mm=mm, o=mm.apply_rotary_pos_emb: setattr(mm, "apply_rotary_pos_emb", o))
            mm.apply_rotary_pos_emb = once
    elif bug == "neox-half":
        mm = importlib.import_module("transformers.models.phi3.modeling_phi3")
        orig = mm.apply_rotary_pos_emb

        def wrong(q, k, cos, sin, *a, **kw):
            """pairs (j, j + head_dim / 2) for j < rope_dim / 2, the rest left alone"""
            hd, half = q.shape[-1], cos.shape[-1] // 2
            c, s = cos[..., :half].unsqueeze(1), sin[..., :half].unsqueeze(1)

            def rope(x):
                x0, x1 = x[..., :half], x[..., hd // 2:hd // 2 + half]
                y = x.clone()
                y[..., :half] = x0 * c - x1 * s
                y[..., hd // 2:hd // 2 + half] = x0 * s + x1 * c
                return y
            return rope(q), rope(k)
        mm.apply_rotary_pos_emb = wrong
        restore.append(lambda: setattr(mm, "apply_rotary_pos_emb", orig))
    else:
        raise SystemExit(f"unknown bug {bug}")
    try:
        yield
    finally:
        for r in restore:
            r()


def logits(model, toks):
    import torch
    with torch.no_grad():
        return model(torch.tensor([toks])).logits[0].float().numpy()


def engine_test_rows(model, vocab):
    """gpu_test_engine_gpu's test_logits token stream (its LCG from 12345, the reference's greedy ids fed back):
    [(tokens of the slot, check position)]"""
    rng = 12345
    toks = []
    for _ in range(4):
        row = []
        for _ in range(64):
            rng = (rng * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            row.append(2 + (rng >> 33) % (vocab - 2))
        toks.append(row)
    pos, rows = [0] * 4, []
    for step in range(12):
        for s in range(4):
            if step == 0:
                nt = [7, 3, 1, 0][s]
            elif step == 1:
                nt = [1, 5, 1, 9][s]
            else:
                nt = 1
            if nt == 0:
                continue
            end = pos[s] + nt
            lg = logits(model, toks[s][:end])[end - 1]
            rows.append((s, end - 1))
            pos[s] = end
            if end < 64:
                toks[s][end] = int(np.argmax(lg))
    return [(toks[s][:p + 1], p) for s, p in rows]


def run(name, points, bug, engine_test):
    model, vocab = twin_model(name)
    prompts, ref = read_case(name)
    out = {}
    with engine_bug(model, bug), engine_rounding(model, points):
        rows = []
        for toks, checks in prompts:
            lg = logits(model, toks)
            rows += [lg[p] for p in checks]
    out["oracle"] = max(max_rel(r, ref[i]) for i, r in enumerate(rows))
    if engine_test:
        et = engine_test_rows(model, vocab)
        m = l2 = 0.0
        for toks, p in et:
            exact = logits(model, toks)[p]
            with engine_bug(model, bug), engine_rounding(model, points):
                em = logits(model, toks)[p]
            m, l2 = max(m, max_rel(em, exact)), max(l2, l2_rel(em, exact))
        out["engine_max"], out["engine_l2"] = m, l2
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("twins", nargs="*")
    ap.add_argument("--round", default="gemm,kv")
    ap.add_argument("--bug", default="")
    ap.add_argument("--no-engine-test", action="store_true")
    a = ap.parse_args()
    twins = a.twins or [c + "-bf16" for c in make_oracle.CASES] + [c for c in make_oracle.SWA_CASES
                                                                    if c.endswith("-bf16")]
    points = set(a.round.split(",")) - {"none", ""}
    print(f"# rounding at: {','.join(sorted(points)) or 'none'}; bug: {a.bug or 'none'}")
    print(f"{'twin':<18} {'oracle max-rel':>14} {'engine-test max-rel':>20} {'engine-test L2-rel':>19}")
    for t in twins:
        r = run(t, points, a.bug, not a.no_engine_test)
        print(f"{t:<18} {r['oracle']:>14.4g} {r.get('engine_max', float('nan')):>20.4g} "
              f"{r.get('engine_l2', float('nan')):>19.4g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
