#!/usr/bin/env python3
"""tools/bench_torch_peer.py: the PyTorch + transformers peer of zllm-bench, on the same model shape.

  python3 tools/bench_torch_peer.py --preset llama-3.1-8b --ctx 1024 --m 1,64 [--prefill 2048]
                                    [--zllm zllm-bench-output.txt]

Builds the preset's architecture (Llama or Qwen2, the shapes of tools/main_zllm-mkmodel.c) in BF16 with random
weights on the GPU, a transformers StaticCache of ctx + 16 positions, and times greedy decode steps of M
sequences at position ctx (logits + argmax; CUDA-graph replay of the step when capture works, eager otherwise,
said in the output) and one prefill. With --zllm, reads the zllm-bench output of the same model shape from the same
device call and prints zllm's speed over the peer's (tokens/s ratio) for each M both measured, and the prefill
ratio when both prefilled the same number of tokens.
"""
import argparse
import re
import sys
import time

PRESETS = {  # arch, layers, dim, heads, kv heads, head dim, ffn, vocab, rope theta, rms eps, tied
    "llama-3.1-8b": ("llama", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, 1e-5, False),
    "llama-3.2-1b": ("llama", 16, 2048, 32, 8, 64, 8192, 128256, 500000.0, 1e-5, True),
    "qwen2.5-1.5b": ("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 1000000.0, 1e-6, True),
}


def build(preset, max_pos):
    import torch
    import transformers
    arch, nl, dim, nh, nkv, hd, ff, vocab, theta, eps, tied = PRESETS[preset]
    common = dict(vocab_size=vocab, hidden_size=dim, intermediate_size=ff, num_hidden_layers=nl,
                  num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=max_pos,
                  rms_norm_eps=eps, tie_word_embeddings=tied)
    if arch == "llama":
        cfg = transformers.LlamaConfig(head_dim=hd, rope_theta=theta, **common)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen2Config(rope_theta=theta, **common)
        cls = transformers.Qwen2ForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    return model, cfg


def make_cache(cfg, batch, max_len):
    import torch
    from transformers import StaticCache
    try:
        return StaticCache(config=cfg, max_batch_size=batch, max_cache_len=max_len, device="cuda",
                           dtype=torch.bfloat16)
    except TypeError:
        return StaticCache(config=cfg, max_cache_len=max_len)


def time_fn(fn, reps):
    import torch
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def decode(model, cfg, m, ctx, steps):
    import torch
    cache = make_cache(cfg, m, ctx + 16)
    ids = torch.randint(1, cfg.vocab_size - 1, (m, 1), device="cuda")
    pos = torch.full((m, 1), ctx, device="cuda", dtype=torch.long)
    cpos = torch.tensor([ctx], device="cuda", dtype=torch.long)
    out = {}

    def step():
        lg = model(input_ids=ids, position_ids=pos, cache_position=cpos, past_key_values=cache,
                   use_cache=True).logits
        out["tok"] = lg[:, -1, :].argmax(-1)

    with torch.no_grad():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        mode = "eager"
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            g.replay()
            torch.cuda.synchronize()
            fn, mode = g.replay, "cuda graph"
        except Exception as e:  # capture not supported by this transformers version: time it eagerly
            print(f"  (graph capture failed: {type(e).__name__}: {str(e)[:120]}; eager)")
            torch.cuda.synchronize()
            fn = step
        ms = time_fn(fn, steps)
    del cache
    return ms, mode


def prefill(model, cfg, n, reps):
    import torch
    cache = make_cache(cfg, 1, n + 16)
    ids = torch.randint(1, cfg.vocab_size - 1, (1, n), device="cuda")
    cpos = torch.arange(n, device="cuda")

    def run():
        cache.reset()
        model(input_ids=ids, cache_position=cpos, past_key_values=cache, use_cache=True,
              logits_to_keep=1)

    with torch.no_grad():
        run()
        torch.cuda.synchronize()
        return time_fn(run, reps)


def zllm_table(path):
    """zllm-bench's decode rows {M: tokens/s} and its prefill line {"prefill": (tokens, ms)} from its output"""
    rows = {}
    if not path:
        return rows
    try:
        txt = open(path).read()
    except OSError:
        return rows
    for line in txt.splitlines():
        f = line.split()
        if len(f) >= 8 and re.fullmatch(r"\d+", f[0]) and f[-1].endswith("%"):
            rows[int(f[0])] = float(f[1])
        pm = re.match(r"prefill of (\d+) tokens: ([0-9.]+) ms", line.strip())
        if pm:
            rows["prefill"] = (int(pm.group(1)), float(pm.group(2)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--m", default="1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--zllm", default="")
    a = ap.parse_args()
    import torch
    import transformers
    t0 = time.time()
    model, cfg = build(a.preset, max(a.ctx + 16, a.prefill + 16))
    print(f"torch peer: {a.preset} bf16, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}, built in {time.time() - t0:.1f} s")
    z = zllm_table(a.zllm)
    print(f"{'M':>6} {'peer tok/s':>12} {'peer ms':>10} {'mode':>11} {'zllm tok/s':>12} {'zllm/peer':>10}")
    for m in [int(x) for x in a.m.split(",") if x]:
        try:
            ms, mode = decode(model, cfg, m, a.ctx, a.steps)
        except Exception as e:
            print(f"{m:>6} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        tps = m / ms * 1e3
        zt = z.get(m)
        ratio = f"{zt / tps:.2f}x" if zt else "-"
        print(f"{m:>6} {tps:>12.1f} {ms:>10.3f} {mode:>11} {zt if zt else '-':>12} {ratio:>10}", flush=True)
    if a.prefill > 0:
        try:
            ms = prefill(model, cfg, a.prefill, 5)
            zp = z.get("prefill")
            same = zp and zp[0] == a.prefill
            ratio = f"; zllm {zp[1]:.1f} ms, zllm/peer {ms / zp[1]:.2f}x" if same else ""
            print(f"peer prefill of {a.prefill} tokens: {ms:.1f} ms, {a.prefill / ms * 1e3:.0f} tokens/s{ratio}")
        except Exception as e:
            print(f"peer prefill failed: {type(e).__name__}: {str(e)[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
