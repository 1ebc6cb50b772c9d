#!/usr/bin/env python3
"""tools/attn_bench_torch.py: PyTorch's scaled_dot_product_attention on the decode shapes of zllm-attentionbench
(32 query heads, 8 KV heads, head size 128, BF16, one query token per sequence), for docs/perf.md.

Same rules as the C++ bench: K/V sets rotated until they make at least 1 GiB (memory allowing) so the L2 does
not serve them, bytes = K + V read, time = median of CUDA event pairs around single calls, two ways: "queued"
(all calls enqueued back to back, an event pair around each, so host time is not counted while the GPU is busy)
and "sync" (the host waits after every call).
usage: attn_bench_torch.py [-b 1,16,64] [-c 1024,...] [-s B:L,B:L,...] [-n iters] [-m max_gib]
  -s: only these (batch, context) pairs instead of the -b x -c table (as zllm-attentionbench -s)
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F


def bench(B, L, iters, max_bytes):
    H, KVH, D = 32, 8, 128
    set_bytes = 2 * B * L * KVH * D * 2
    if set_bytes > max_bytes:
        return None
    R = int(min(64, max(1, math.ceil((1 << 30) / set_bytes))))
    while R > 1 and R * set_bytes > max_bytes:
        R -= 1
    try:
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        ks = [torch.rand(B, KVH, L, D, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(R)]
        vs = [torch.rand(B, KVH, L, D, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(R)]
        times = []
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        for it in range(iters + 5):
            k, v = ks[it % R], vs[it % R]
            a.record()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            b.record()
            b.synchronize()
            if it >= 5:
                times.append(a.elapsed_time(b))
        us_sync = statistics.median(times) * 1e3
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters + 5)]
        for it in range(iters + 5):
            k, v = ks[it % R], vs[it % R]
            ev[it][0].record()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            ev[it][1].record()
        torch.cuda.synchronize()
        us = statistics.median([ev[it][0].elapsed_time(ev[it][1]) for it in range(5, iters + 5)]) * 1e3
        return us, set_bytes / (us * 1e-6) / 1e9, us_sync
    except torch.OutOfMemoryError:
        return "OOM"
    finally:
        q = ks = vs = None
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="1,16,64")
    ap.add_argument("-c", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("-m", type=float, default=0.0)
    ap.add_argument("-s", default="")
    a, _ = ap.parse_known_args()   # the C++ bench's other options (-K, -f, --hm) may come along: ignored
    free, _ = torch.cuda.mem_get_info()
    max_bytes = a.m * (1 << 30) if a.m > 0 else 0.4 * free   # SDPA may materialize expanded K/V
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'batch':>5} {'ctx':>7} {'KV_MB':>10} {'sdpa_us':>10} {'GB/s':>8} {'sync_us':>10}")
    if a.s:
        pairs = [tuple(map(int, x.split(":"))) for x in a.s.split(",") if x]
    else:
        pairs = [(B, L) for B in map(int, a.b.split(",")) for L in map(int, a.c.split(","))]
    for B, L in pairs:
        mb = 2 * B * L * 8 * 128 * 2 / 1e6
        r = bench(B, L, a.n, max_bytes)
        if r is None or r == "OOM":
            print(f"{B:5d} {L:7d} {mb:10.1f} {'OOM' if r else 'skip':>10} {'-':>8} {'-':>10}", flush=True)
        else:
            print(f"{B:5d} {L:7d} {mb:10.1f} {r[0]:10.1f} {r[1]:8.0f} {r[2]:10.1f}", flush=True)


if __name__ == "__main__":
    main()
