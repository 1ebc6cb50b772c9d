"""tests/test_model_refuse.py: a GGUF file carrying a tensor or a metadata key that changes the model's function
and that zllm does not compute is refused at load with an error naming it, never run without it.

Each variant is stories260K (a real tiny Llama) rewritten by the `gguf` package's writer with one item added:
malformed RoPE factor tensors (rope_freqs.weight of the wrong length or with a zero factor, LongRoPE's long
factors without the short ones), an unknown RoPE scaling type, per-head Q/K norms on llama, a stray tensor in a
block, block tensors whose layer number is not written as the loader writes it, and each refused metadata key;
and the random gemma3 model of tests/data/oracle with softcapping, a scaling type it does not compute or a stray
tensor. The unchanged copy, the RoPE variants zllm computes (llama3 factors, linear scaling, also under the older
key rope.scale_linear), and copies with neutral values or an (integer) sliding window must load and generate, so a
loader that refuses everything fails this test too."""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import ROOT, model_path  # noqa: E402

import gguf  # noqa: E402

passed = failed = 0
NO_VOCAB = "no tokenizer.ggml.model"  # the model loaded; the file has no vocabulary for zllm-run


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def rewrite(src, dst, extra_tensors=(), extra_keys=()):
    """copies src to dst with the gguf package, adding (name, f32 array) tensors and (key, type, value) keys"""
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            et = f.types[1]
            if et == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]) for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_array(name, vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8"))
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], t)
    for key, vtype, val in extra_keys:
        w.add_key_value(key, val, vtype)
    for t in r.tensors:
        shape = list(reversed([int(x) for x in t.shape]))
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, arr in extra_tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(path):
    exe = os.path.join(ROOT, os.environ.get("ZLLM_BUILD", "build"), "bin", "zllm-run")
    p = subprocess.run([exe, "-m", path, "-n", "4", "--temp", "0", "--ids"], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    src = model_path()
    if not os.path.exists(src):
        print("FAIL: missing fixture", src)
        print("0 passed, 1 failed")
        return 1
    f32 = gguf.GGUFValueType.FLOAT32
    u32 = gguf.GGUFValueType.UINT32
    variants = [
        ("plain", [], [], None),
        # RoPE variants zllm computes load (llama3 factors, linear scaling); malformed or unknown ones are refused
        ("rope_freqs", [("rope_freqs.weight", np.full(4, 2.0, dtype=np.float32))], [], None),
        ("linear", [], [("llama.rope.scaling.type", gguf.GGUFValueType.STRING, "linear"),
                        ("llama.rope.scaling.factor", f32, 8.0)], None),
        ("scale_linear", [], [("llama.rope.scale_linear", f32, 2.0)], None),
        ("rope_freqs_len", [("rope_freqs.weight", np.ones(3, dtype=np.float32))], [], "rope_freqs.weight"),
        ("rope_freqs_zero", [("rope_freqs.weight", np.array([1, 0, 1, 1], dtype=np.float32))], [],
         "rope_freqs.weight"),
        ("longrope_half", [("rope_factors_long.weight", np.ones(4, dtype=np.float32))], [],
         "rope_factors_short.weight"),
        ("scaling_type", [], [("llama.rope.scaling.type", gguf.GGUFValueType.STRING, "dynamic")],
         "llama.rope.scaling.type"),
        ("yarn_log_mul", [], [("llama.rope.scaling.yarn_log_multiplier", f32, 0.1)],
         "llama.rope.scaling.yarn_log_multiplier"),
        ("q_norm", [("blk.0.attn_q_norm.weight", np.ones(8, dtype=np.float32))], [], "blk.0.attn_q_norm.weight"),
        ("stray", [("blk.4.ffn_gate_up.weight", np.ones(8, dtype=np.float32))], [], "blk.4.ffn_gate_up.weight"),
        ("beyond", [("blk.5.attn_norm.weight", np.ones(64, dtype=np.float32))], [], "blk.5.attn_norm.weight"),
        # names no lookup asks for, whatever a lenient number parser makes of them (2^32 wraps to layer 0)
        ("wrapped", [("blk.4294967296.attn_norm.weight", np.ones(64, dtype=np.float32))], [],
         "blk.4294967296.attn_norm.weight"),
        ("padded", [("blk.00.attn_norm.weight", np.ones(64, dtype=np.float32))], [], "blk.00.attn_norm.weight"),
        ("signed", [("blk.+1.attn_norm.weight", np.ones(64, dtype=np.float32))], [], "blk.+1.attn_norm.weight"),
        # a per-layer window array is not computed (an integer window is: tests/test_oracle.c)
        ("swa_array", [], [("llama.attention.sliding_window", gguf.GGUFValueType.ARRAY, [4096, 0, 4096, 0, 4096])],
         "llama.attention.sliding_window"),
        ("swa", [], [("llama.attention.sliding_window", u32, 4096)], None),
        ("attn_scale", [], [("llama.attention.scale", f32, 0.5)], "llama.attention.scale"),
        ("softcap", [], [("llama.final_logit_softcapping", f32, 30.0)], "llama.final_logit_softcapping"),
        ("experts", [], [("llama.expert_count", u32, 8)], "llama.expert_count"),
        ("neutral", [], [("llama.rope.scaling.factor", f32, 1.0), ("llama.expert_count", u32, 0)], None),
    ]
    # gemma3 (the random oracle model of tests/data/oracle): what it computes loads, what it does not is refused
    g3 = os.path.join(ROOT, "tests", "data", "oracle", "gemma3-swa.gguf")
    strs = gguf.GGUFValueType.STRING
    arr = gguf.GGUFValueType.ARRAY
    variants += [
        ("gemma3", [], [], None, g3),
        ("gemma3_linear", [], [("gemma3.rope.scaling.type", strs, "linear"), ("gemma3.rope.scaling.factor", f32, 4.0)],
         None, g3),
        ("gemma3_softcap", [], [("gemma3.final_logit_softcapping", f32, 30.0)], "gemma3.final_logit_softcapping", g3),
        ("gemma3_attn_softcap", [], [("gemma3.attn_logit_softcapping", f32, 50.0)], "gemma3.attn_logit_softcapping",
         g3),
        ("gemma3_yarn", [], [("gemma3.rope.scaling.type", strs, "yarn"), ("gemma3.rope.scaling.factor", f32, 4.0)],
         "gemma3.rope.scaling.type", g3),
        ("gemma3_stray", [("blk.0.attn_sinks.weight", np.ones(4, dtype=np.float32))], [], "blk.0.attn_sinks.weight", g3),
        ("gemma3_pattern6", [], [("gemma3.attention.sliding_window_pattern", u32, 6)], None, g3),
        ("gemma3_pattern_flags", [], [("gemma3.attention.sliding_window_pattern", arr,
                                       [True, True, True, True, True, False])], None, g3),
        ("gemma3_pattern4", [], [("gemma3.attention.sliding_window_pattern", u32, 4)],
         "gemma3.attention.sliding_window_pattern", g3),
        ("gemma3_pattern_other", [], [("gemma3.attention.sliding_window_pattern", arr,
                                       [True, False, True, False, True, False])],
         "gemma3.attention.sliding_window_pattern", g3),
        # phi3 slides on every layer as llama does (the model loads; this oracle file has no vocabulary, so zllm-run
        # stops at the tokenizer after it), qwen3 (some layers only) is refused
        ("phi3_swa", [], [("phi3.attention.sliding_window", u32, 2047)], NO_VOCAB,
         os.path.join(ROOT, "tests", "data", "oracle", "phi3.gguf")),
        ("qwen3_swa", [], [("qwen3.attention.sliding_window", u32, 4096)], "qwen3.attention.sliding_window",
         os.path.join(ROOT, "tests", "data", "oracle", "qwen3.gguf")),
        ("llama_pattern", [], [("llama.attention.sliding_window", u32, 16),
                               ("llama.attention.sliding_window_pattern", u32, 2)],
         "llama.attention.sliding_window_pattern"),
    ]
    with tempfile.TemporaryDirectory() as d:
        for v in variants:
            tag, tensors, keys, refused = v[:4]
            path = os.path.join(d, tag + ".gguf")
            rewrite(v[4] if len(v) > 4 else src, path, tensors, keys)
            rc, out = run(path)
            if refused is NO_VOCAB:
                check(rc != 0 and NO_VOCAB in out and "sliding_window" not in out,
                      "%s: the model loads, the tokenizer is missing (rc %d): %s" % (tag, rc, out[-300:]))
            elif refused is None:
                check(rc == 0 and out.strip() != "", "%s: loads and generates (rc %d): %s" % (tag, rc, out[-300:]))
            else:
                check(rc != 0, "%s: refused (rc %d)" % (tag, rc))
                check(refused in out, "%s: the error names %s: %s" % (tag, refused, out[-300:]))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
