#!/usr/bin/env python3
"""tests/test_mkmodel.py: what zllm-mkmodel writes, read by the gguf Python package (gguf.GGUFReader) and by
our own reader (build/bin/zllm-gguf, common/gguf.c): metadata keys and values, tensor names, shapes and types
for every --type, llama.cpp's Q4_K_M layer mix, tied / untied heads, qwen2 biases, --vocab-from, determinism
across thread counts, sane value ranges (dequantized with gguf-py), and bad arguments.
Tiny shapes only. Prints "N passed, N failed"; exits non-zero on failure."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("ZLLM_BUILD", "build")
MK = os.path.join(ROOT, BUILD, "bin", "zllm-mkmodel")
RD = os.path.join(ROOT, BUILD, "bin", "zllm-gguf")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import fixtures  # noqa: E402
FIX = fixtures.root()

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL", msg, file=sys.stderr)


TMP = tempfile.mkdtemp(prefix="zllm-mkmodel-")
# small custom shapes whose row lengths (256, 512) fit the 256-element K blocks
SHAPE = ["--layers", "8", "--dim", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--ffn", "512",
         "--vocab", "300", "--ctx", "128"]
TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
         "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K, "q4_k_m": QT.Q4_K}
FTYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q4_k": 14,
         "q5_k": 16, "q6_k": 18, "q4_k_m": 15}


def mk(out, *args):
    r = subprocess.run([MK, "-o", out, *args], capture_output=True, text=True)
    return r.returncode, r.stderr


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_tensors(arch, layers, dim, heads, kv, hd, ffn, vocab, tied):
    """name -> (shape [ne0, ne1...], kind)"""
    t = {"token_embd.weight": ([dim, vocab], "m"), "output_norm.weight": ([dim], "n")}
    if not tied:
        t["output.weight"] = ([dim, vocab], "m")
    for i in range(layers):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = ([dim], "n")
        t[p + "ffn_norm.weight"] = ([dim], "n")
        t[p + "attn_q.weight"] = ([dim, heads * hd], "m")
        t[p + "attn_k.weight"] = ([dim, kv * hd], "m")
        t[p + "attn_v.weight"] = ([dim, kv * hd], "m")
        t[p + "attn_output.weight"] = ([heads * hd, dim], "m")
        t[p + "ffn_gate.weight"] = ([dim, ffn], "m")
        t[p + "ffn_up.weight"] = ([dim, ffn], "m")
        t[p + "ffn_down.weight"] = ([ffn, dim], "m")
        if arch == "qwen2":
            t[p + "attn_q.bias"] = ([heads * hd], "b")
            t[p + "attn_k.bias"] = ([kv * hd], "b")
            t[p + "attn_v.bias"] = ([kv * hd], "b")
    return t


def our_reader_ok(path):
    """our reader validates the file and lists the same tensor count"""
    if not os.access(RD, os.X_OK):
        return None
    r = subprocess.run([RD, path], capture_output=True, text=True)
    return r


def test_types():
    for name, qt in TYPES.items():
        arch = "qwen2" if name in ("q8_0", "q5_k", "f16") else "llama"
        tied = name in ("q4_k_m", "q4_0")
        out = os.path.join(TMP, f"m-{name}.gguf")
        rc, err = mk(out, *SHAPE, "--arch", arch, "--type", name, *(["--tied"] if tied else ["--untied"]))
        check(rc == 0, f"{name}: mkmodel rc {rc}: {err}")
        if rc != 0:
            continue
        r = gguf.GGUFReader(out)
        check(field(r, "general.architecture") == arch, f"{name}: architecture")
        check(field(r, "general.file_type") == FTYPE[name], f"{name}: file_type {field(r, 'general.file_type')}")
        want_kv = {"block_count": 8, "embedding_length": 256, "feed_forward_length": 512,
                   "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 64,
                   "attention.value_length": 64, "context_length": 128, "rope.dimension_count": 64}
        for k, v in want_kv.items():
            check(field(r, f"{arch}.{k}") == v, f"{name}: {arch}.{k} = {field(r, f'{arch}.{k}')} != {v}")
        base = field(r, f"{arch}.rope.freq_base")
        eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon")
        check(base is not None and base > 0, f"{name}: rope.freq_base")
        check(eps is not None and 0 < eps < 1e-3, f"{name}: rms eps")
        toks = field(r, "tokenizer.ggml.tokens")
        check(toks is not None and len(toks) == 300, f"{name}: 300 tokens")
        exp = expected_tensors(arch, 8, 256, 4, 2, 64, 512, 300, tied)
        got = {t.name: t for t in r.tensors}
        check(set(got) == set(exp), f"{name}: tensor names differ: {sorted(set(got) ^ set(exp))[:6]}")
        for tn, (shape, kind) in exp.items():
            t = got.get(tn)
            if t is None:
                continue
            check(list(t.shape) == shape, f"{name}: {tn} shape {list(t.shape)} != {shape}")
            if kind != "m":
                want = QT.F32
            elif name == "q4_k_m":
                layer = int(tn.split(".")[1]) if tn.startswith("blk.") else -1
                six = tn == "output.weight" or (tn == "token_embd.weight" and tied) or \
                    ((tn.endswith("attn_v.weight") or tn.endswith("ffn_down.weight")) and more_bits(layer, 8))
                want = QT.Q6_K if six else QT.Q4_K
            else:
                want = qt
            check(t.tensor_type == want, f"{name}: {tn} type {t.tensor_type.name} != {want.name}")
            # values: dequantized by gguf-py
            v = quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            if kind == "n":
                check(np.all(np.abs(v - 1.0) <= 0.1 + 1e-6), f"{name}: {tn} norm values outside 1 +- 0.1")
            elif kind == "b":
                check(np.all(np.abs(v) <= 0.02 + 1e-6) and np.any(v != 0), f"{name}: {tn} bias values")
            else:
                std, want_std = float(v.std()), 1.0 / np.sqrt(shape[0])
                check(np.isfinite(v).all() and abs(std / want_std - 1) < 0.15 and abs(float(v.mean())) < 0.1 * want_std,
                      f"{name}: {tn} std {std:.4g}, mean {float(v.mean()):.3g}, want std {want_std:.4g}")
        rr = our_reader_ok(out)
        if rr is not None:
            check(rr.returncode == 0 and f"{len(exp)} tensors" in rr.stdout,
                  f"{name}: our reader: rc {rr.returncode} {rr.stderr.strip()}")
            for tn in ("token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"):
                check(tn in rr.stdout, f"{name}: our reader lists {tn}")


def test_presets_and_options():
    # presets (tiny ones fully; the big ones only for their metadata: the file would be too large here)
    out = os.path.join(TMP, "tl.gguf")
    rc, err = mk(out, "--preset", "tiny-llama")
    check(rc == 0, f"tiny-llama: {err}")
    r = gguf.GGUFReader(out)
    check(field(r, "llama.block_count") == 3 and field(r, "llama.embedding_length") == 64, "tiny-llama dims")
    check("output.weight" in [t.name for t in r.tensors], "tiny-llama untied")
    out = os.path.join(TMP, "tq.gguf")
    rc, err = mk(out, "--preset", "tiny-qwen2", "--type", "q8_0")
    check(rc == 0, f"tiny-qwen2: {err}")
    r = gguf.GGUFReader(out)
    names = [t.name for t in r.tensors]
    check(field(r, "general.architecture") == "qwen2" and "blk.2.attn_k.bias" in names, "tiny-qwen2 biases")
    check("output.weight" not in names, "tiny-qwen2 tied")
    # qwen3 (per-head Q/K norms) and phi3 (fused attn_qkv and gate/up) as llama.cpp names them, RoPE factors
    out = os.path.join(TMP, "tq3.gguf")
    rc, err = mk(out, "--preset", "tiny-qwen3", "--rope-freqs")
    check(rc == 0, f"tiny-qwen3: {err}")
    r = gguf.GGUFReader(out)
    t = {x.name: x for x in r.tensors}
    check(field(r, "general.architecture") == "qwen3" and "blk.2.attn_q_norm.weight" in t and
          "blk.2.attn_k_norm.weight" in t and "blk.0.attn_q.bias" not in t, "tiny-qwen3 q/k norms, no biases")
    check([int(x) for x in t["blk.0.attn_k_norm.weight"].shape] == [16], "tiny-qwen3 norm of head_dim")
    f = np.array(t["rope_freqs.weight"].data, dtype=np.float32)
    check(f.shape == (8,) and bool(np.all(f > 0)), "rope_freqs: head_dim / 2 positive factors")
    out = os.path.join(TMP, "tp3.gguf")
    rc, err = mk(out, "--preset", "tiny-phi3", "--longrope", "--type", "q8_0")
    check(rc == 0, f"tiny-phi3: {err}")
    r = gguf.GGUFReader(out)
    t = {x.name: x for x in r.tensors}
    check(field(r, "general.architecture") == "phi3" and "blk.0.ffn_gate.weight" not in t and
          "blk.0.attn_q.weight" not in t, "tiny-phi3: no separate q or gate")
    check([int(x) for x in t["blk.0.attn_qkv.weight"].shape] == [64, 8 * 16 + 2 * 2 * 16], "phi3 attn_qkv rows")
    check([int(x) for x in t["blk.0.ffn_up.weight"].shape] == [64, 2 * 160], "phi3 ffn_up holds gate and up")
    check("rope_factors_long.weight" in t and "rope_factors_short.weight" in t and
          field(r, "phi3.rope.scaling.original_context_length") == 128 and
          abs(field(r, "phi3.rope.scaling.attn_factor") - (1 + np.log(4) / np.log(128)) ** 0.5) < 1e-6,
          "phi3 LongRoPE factors, original context, attention factor")
    rc, err = mk(os.path.join(TMP, "bad.gguf"), "--rope-freqs", "--longrope")
    check(rc != 0 and "exclude" in err, f"--rope-freqs with --longrope refused: {err}")
    # K types on rows that do not fit 256 fall back like llama.cpp
    out = os.path.join(TMP, "tlk.gguf")
    rc, err = mk(out, "--preset", "tiny-llama", "--type", "q4_k")
    r = gguf.GGUFReader(out) if rc == 0 else None
    check(r is not None and all(t.tensor_type in (QT.Q5_0, QT.F32) for t in r.tensors), f"q4_k fallback: {err}")

    # determinism: the thread count does not change the file; the seed does
    a, b, c = (os.path.join(TMP, x) for x in ("d1.gguf", "d2.gguf", "d3.gguf"))
    mk(a, *SHAPE, "--type", "q4_k", "--threads", "1", "--seed", "9")
    mk(b, *SHAPE, "--type", "q4_k", "--threads", "3", "--seed", "9")
    mk(c, *SHAPE, "--type", "q4_k", "--threads", "2", "--seed", "10")
    da, db, dc = (open(x, "rb").read() for x in (a, b, c))
    check(da == db, "threads 1 and 3 give identical files")
    check(len(da) == len(dc) and da != dc, "another seed gives other weights")

    # --vocab-from copies every tokenizer.* key and takes the vocabulary size
    src = os.path.join(FIX, "stories260K", "stories260K.gguf")
    if os.path.exists(src):
        out = os.path.join(TMP, "vf.gguf")
        rc, err = mk(out, "--preset", "tiny-llama", "--vocab-from", src)
        check(rc == 0, f"--vocab-from: {err}")
        if rc == 0:
            s, r = gguf.GGUFReader(src), gguf.GGUFReader(out)
            skeys = [k for k in s.fields if k.startswith("tokenizer.")]
            check(len(skeys) > 3, "source has tokenizer keys")
            for k in skeys:
                same = k in r.fields and s.fields[k].types == r.fields[k].types and \
                    str(s.fields[k].contents()) == str(r.fields[k].contents())
                check(same, f"--vocab-from: {k} copied")
            n = len(s.fields["tokenizer.ggml.tokens"].contents())
            emb = [t for t in r.tensors if t.name == "token_embd.weight"][0]
            check(list(emb.shape) == [64, n], f"--vocab-from: token_embd {list(emb.shape)} rows = {n}")
            check(field(r, "llama.vocab_size") == n, "--vocab-from: vocab_size")
    else:
        check(False, f"fixture {src} missing")

    # bad arguments fail with status 2 and write no file
    for args in (["--type", "q3_k"], ["--preset", "gpt-5"], ["--arch", "mamba"], ["--layers", "x"],
                 ["--heads", "5", "--kv-heads", "2"], ["--bogus"]):
        out = os.path.join(TMP, "bad.gguf")
        rc, err = mk(out, *args)
        check(rc == 2 and not os.path.exists(out) and err.strip(), f"bad args {args}: rc {rc}")
    rc, err = mk(os.path.join(TMP, "no", "such", "dir.gguf"))
    check(rc != 0 and "dir.gguf" in err, f"unwritable path fails with a message: {err.strip()}")
    rc, err = mk(os.path.join(TMP, "x.gguf"), "--vocab-from", os.path.join(TMP, "missing.gguf"))
    check(rc != 0 and "missing.gguf" in err, "--vocab-from a missing file fails")


def main():
    if not os.access(MK, os.X_OK):
        check(False, f"missing {MK}")
    else:
        test_types()
        test_presets_and_options()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        import shutil
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(rc)
