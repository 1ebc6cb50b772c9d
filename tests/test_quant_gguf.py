#!/usr/bin/env python3
"""tests/test_quant_gguf.py: engine/quant.c against the GGUF reference (gguf-py's numpy quants module).

For every weight type zllm reads: random blocks (random bytes with finite fp16 scales) and blocks from our own
quantizer, dequantized by our C code (through build/bin/zllm-dequant) and by gguf.quants.dequantize; the
results must be bit-identical. Also: fp16/bf16 conversion of every 16-bit pattern and of random/edge f32
values against numpy, our simple quantizers against gguf-py's reference quantizers (Q8_0 .. Q5_1, BF16), and
quant_dot_row against a float64 dot of the oracle's dequantization.
Prints "N passed, N failed"; exits non-zero on failure."""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("ZLLM_BUILD", "build")
TOOL = os.path.join(ROOT, BUILD, "bin", "zllm-dequant")

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL", msg, file=sys.stderr)


TMP = tempfile.mkdtemp(prefix="zllm-quant-")


def run_tool(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"zllm-dequant {' '.join(args)}: rc {r.returncode}: {r.stderr.strip()}")


def c_dequant(name, raw):
    i, o = os.path.join(TMP, "in"), os.path.join(TMP, "out")
    raw.tofile(i)
    run_tool(name, i, o)
    return np.fromfile(o, dtype=np.float32)


def c_quant(name, f):
    i, o = os.path.join(TMP, "in"), os.path.join(TMP, "out")
    f.astype(np.float32).tofile(i)
    run_tool("-q", name, i, o)
    return np.fromfile(o, dtype=np.uint8)


def c_dot(name, raw, x):
    r, xi, o = os.path.join(TMP, "row"), os.path.join(TMP, "x"), os.path.join(TMP, "out")
    raw.tofile(r)
    x.astype(np.float32).tofile(xi)
    run_tool("--dot", name, r, xi, o)
    return float(np.fromfile(o, dtype=np.float32)[0])


def same_bits(a, b):
    """bit-identical f32 arrays, except that any NaN equals any NaN"""
    if a.shape != b.shape:
        return False, f"shape {a.shape} vs {b.shape}"
    a32, b32 = a.view(np.uint32), b.view(np.uint32)
    nan = np.isnan(a) & np.isnan(b)
    bad = (a32 != b32) & ~nan
    if bad.any():
        i = int(np.argmax(bad))
        return False, f"{int(bad.sum())} differ, first at {i}: {a[i]!r} vs {b[i]!r}"
    return True, ""


def finite_f16(rng, n, lo=-2.0, hi=2.0):
    """n fp16 values as raw uint8 pairs: random finite scales, incl. some subnormals, zeros and negatives"""
    v = rng.uniform(lo, hi, n).astype(np.float16)
    k = rng.integers(0, 10, n)
    v[k == 0] = np.float16(0)
    v[k == 1] = (rng.integers(1, 1024, (k == 1).sum()).astype(np.uint16)).view(np.float16)   # subnormals
    v[k == 2] = rng.uniform(-60000, 60000, (k == 2).sum()).astype(np.float16)
    return v.view(np.uint8).reshape(n, 2)


# byte offsets of the fp16 fields in each block (the rest is free-form quant data)
F16_FIELDS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
}
TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def random_blocks(rng, qt, n_blocks):
    blk, tsz = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n_blocks, tsz), dtype=np.uint8)
    if qt == QT.F32:
        f = rng.standard_normal(n_blocks).astype(np.float32) * 10
        f[::7] = 0
        return f.view(np.uint8).reshape(n_blocks, 4)
    if qt in (QT.F16, QT.BF16):
        return raw   # every bit pattern, NaN and Inf included: plain conversions
    for off in F16_FIELDS[qt]:
        raw[:, off:off + 2] = finite_f16(rng, n_blocks)
    return raw


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"missing {TOOL}: build it with make BUILD={BUILD}", file=sys.stderr)
        check(False, "tool present")
        print(f"{passed} passed, {failed} failed")
        return 1
    rng = np.random.default_rng(20260322)

    # 1. dequantization of random blocks and of our quantizer's blocks: bit-identical to the oracle
    for qt in TYPES:
        blk, tsz = GGML_QUANT_SIZES[qt]
        raw = random_blocks(rng, qt, 512 if blk == 32 else 128).reshape(-1)
        ours = c_dequant(qt.name, raw)
        ref = quants.dequantize(raw, qt).reshape(-1).astype(np.float32)
        ok, why = same_bits(ours, ref)
        check(ok, f"{qt.name} random blocks: {why}")

        n = blk * (64 if blk == 32 else 16) if blk > 1 else 4096
        x = rng.standard_normal(n).astype(np.float32) * rng.uniform(0.01, 3.0)
        x[: n // 8] *= 0   # some all-zero blocks
        x[n // 8: n // 4] = np.abs(x[n // 8: n // 4])   # some all-positive blocks
        q = c_quant(qt.name, x)
        check(q.size == n // blk * tsz, f"{qt.name} quantized size {q.size}")
        ours = c_dequant(qt.name, q)
        ref = quants.dequantize(q, qt).reshape(-1).astype(np.float32)
        ok, why = same_bits(ours, ref)
        check(ok, f"{qt.name} our quantizer's blocks: {why}")
        # sanity of our quantizer: error well under the signal
        err = float(np.sqrt(np.mean((ours.astype(np.float64) - x) ** 2)))
        rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
        check(err <= 0.12 * rms, f"{qt.name} round trip rms error {err:.4g} vs signal {rms:.4g}")

        # dot product (the CPU engine's kernel) against float64 over the oracle's dequantization
        xs = rng.standard_normal(n).astype(np.float32)
        d_ours = c_dot(qt.name, q, xs)
        d_ref = float(np.dot(ref.astype(np.float64), xs.astype(np.float64)))
        scale = float(np.dot(np.abs(ref.astype(np.float64)), np.abs(xs.astype(np.float64))))
        check(abs(d_ours - d_ref) <= 1e-5 * scale + 1e-30, f"{qt.name} dot {d_ours} vs {d_ref}")

    # 2. our reference quantizers equal gguf-py's (which reproduce ggml's reference quantizers) where it has one
    for qt in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.BF16):
        x = (rng.standard_normal(32 * 256) * rng.uniform(0.001, 10)).astype(np.float32)
        ours = c_quant(qt.name, x)
        ref = quants.quantize(x.reshape(1, -1), qt).reshape(-1).view(np.uint8)
        nb = int(np.count_nonzero(ours != ref))
        check(nb == 0, f"{qt.name} quantizer: {nb} bytes differ from gguf-py")

    # 3. fp16 / bf16: every 16-bit pattern up (via dequant above) and f32 -> half rounding against numpy
    all16 = np.arange(65536, dtype=np.uint16)
    ok, why = same_bits(c_dequant("F16", all16.view(np.uint8)), all16.view(np.float16).astype(np.float32))
    check(ok, f"fp16 -> f32 all patterns: {why}")
    ok, why = same_bits(c_dequant("BF16", all16.view(np.uint8)),
                        (all16.astype(np.uint32) << 16).view(np.float32))
    check(ok, f"bf16 -> f32 all patterns: {why}")
    edge = np.array([0.0, -0.0, 65504, 65519.99, 65520, -65520, 1e9, np.inf, -np.inf, 2 ** -24, 2 ** -25,
                     2 ** -25 * 1.0000001, 3 * 2 ** -26, 2 ** -14, 2 ** -14 - 2 ** -25, 1 + 2 ** -11,
                     1 + 3 * 2 ** -11, 1e-40, -1e-30, 0.1, 1 / 3], dtype=np.float32)
    # random bit patterns over the whole finite/inf/nan range plus halfway cases
    rnd = rng.integers(0, 2 ** 32, 200000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = (rng.integers(0, 65536, 20000).astype(np.uint32) << 13 | 0x1000).view(np.float32)
    f = np.concatenate([edge, rnd, halves, edge * -1]).astype(np.float32)
    ours = c_quant("F16", f).view(np.uint16)
    with np.errstate(over="ignore"):
        ref = f.astype(np.float16).view(np.uint16)
    nan = np.isnan(f)
    check(bool(np.all(ours[~nan] == ref[~nan])),
          f"f32 -> fp16 rounding: {int(np.count_nonzero(ours[~nan] != ref[~nan]))} differ")
    check(bool(np.all(np.isnan(ours[nan].view(np.float16)))), "f32 NaN -> fp16 NaN")
    ours = c_quant("BF16", f).view(np.uint16)
    ref = quants.quantize(f.reshape(1, -1), QT.BF16).reshape(-1).view(np.uint16)
    check(bool(np.all(ours == ref)), f"f32 -> bf16: {int(np.count_nonzero(ours != ref))} differ")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        import shutil
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(rc)
