#!/usr/bin/env python3
"""tests/data/make_penalty_ref.py: writes tests/data/penalty_ref.bin, the Python reference of OpenAI's logit bias
and presence/frequency penalties (and of the logprobs zllm reports) on random logits, read by
tests/test_penalty_ref.c (engine/penalty.c, engine/logprobs.c) and cuda/test_logprobs.cu (the GPU kernels).

    python3 tests/data/make_penalty_ref.py tests/data/penalty_ref.bin

Definitions (https://platform.openai.com/docs/advanced-usage, "frequency and presence penalties"):
    mu[j] -> mu[j] + bias[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence
with c[j] the count of j among the generated tokens. Evaluated in float32 in zllm's documented order (each bias entry
added in turn, then per distinct generated id: logit - (float(c) * frequency + presence)), so the C and CUDA results
must match bit for bit. Logprobs: float64 log-softmax of the penalized row (NaN and -inf are no candidates), the top
k ordered by logprob descending, then id ascending.

File (little-endian): "ZLPR", u32 version 1, u32 cases; per case: u32 V, n_gen, n_bias, k, sampled; f32 presence,
frequency; f32 logits[V]; i32 gen[n_gen]; (i32 id, f32 bias)[n_bias]; f32 penalized[V]; f64 logprob of sampled;
u32 n_top; i32 top_id[n_top]; f64 top_logprob[n_top]."""
import math
import struct
import sys

import numpy as np


def reference(logits, gen, bias, presence, frequency):
    out = logits.astype(np.float32).copy()
    for i, b in bias:
        out[i] = np.float32(out[i] + np.float32(b))
    if presence != 0 or frequency != 0:
        ids, counts = np.unique(np.asarray(gen, dtype=np.int64), return_counts=True)
        for i, c in zip(ids, counts):
            pen = np.float32(np.float32(np.float32(c) * np.float32(frequency)) + np.float32(presence))
            out[i] = np.float32(out[i] - pen)
    return out


def logprobs(row, sampled, k):
    cand = [i for i in range(len(row)) if not math.isnan(row[i]) and row[i] != -math.inf]
    mx = max(float(row[i]) for i in cand)
    lse = mx + math.log(sum(math.exp(float(row[i]) - mx) for i in cand))
    lp = (float(row[sampled]) - lse) if sampled in cand else -math.inf
    top = sorted(cand, key=lambda i: (-float(row[i]), i))[:k]
    return lp, top, [float(row[i]) - lse for i in top]


def main():
    rng = np.random.default_rng(20261127)
    cases = []
    for V, n_gen, n_bias, k, ties, masks in [(7, 5, 2, 3, False, False), (1000, 40, 10, 20, True, False),
                                             (1000, 200, 300, 5, False, True), (3000, 0, 0, 20, True, True),
                                             (6000, 64, 50, 20, False, False), (50, 50, 3, 20, True, False),
                                             (3, 1, 1, 20, False, False), (2000, 100, 0, 1, True, True)]:
        for presence, frequency in [(0.0, 0.0), (1.5, 0.0), (-0.7, 1.3), (2.0, -2.0)]:
            logits = rng.normal(0, 3, V).astype(np.float32)
            if ties:
                logits = (np.round(logits * 4) / 4).astype(np.float32)
            if masks:
                logits[rng.choice(V, V // 10, replace=False)] = -np.inf
            gen = [int(x) for x in rng.integers(0, min(V, 60), n_gen)]
            bias = [(int(rng.integers(0, V)), float(np.float32(rng.uniform(-100, 100)))) for _ in range(n_bias)]
            pen = reference(logits, gen, bias, presence, frequency)
            finite = [i for i in range(V) if np.isfinite(pen[i])]
            sampled = int(rng.choice(finite))
            lp, top, tlp = logprobs(pen, sampled, k)
            cases.append((V, gen, bias, k, sampled, presence, frequency, logits, pen, lp, top, tlp))
    with open(sys.argv[1], "wb") as f:
        f.write(b"ZLPR" + struct.pack("<II", 1, len(cases)))
        for V, gen, bias, k, sampled, presence, frequency, logits, pen, lp, top, tlp in cases:
            f.write(struct.pack("<IIIIIff", V, len(gen), len(bias), k, sampled, presence, frequency))
            f.write(logits.astype("<f4").tobytes())
            f.write(np.asarray(gen, dtype="<i4").tobytes())
            for i, b in bias:
                f.write(struct.pack("<if", i, b))
            f.write(pen.astype("<f4").tobytes())
            f.write(struct.pack("<dI", lp, len(top)))
            f.write(np.asarray(top, dtype="<i4").tobytes())
            f.write(np.asarray(tlp, dtype="<f8").tobytes())


if __name__ == "__main__":
    main()
