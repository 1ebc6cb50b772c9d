#!/usr/bin/env python3
"""tests/test_prompt_logprobs.py: prompt logprobs (`prompt_logprobs` K, docs/protocol.md) end to end: Python client,
real broker, CPU workers of both engines on stories260K: `cpu` (model "stories") and `cpu-ref` ("ref"), and each
again with steps of at most 3 tokens, so that prompts are prefilled in chunks of 3 ("chunk", "refchunk").
ZLLM_E2E_DEVICE=cuda (tests/run_gpu.sh) puts the CUDA engine in place of `cpu` ("stories" and "chunk"); there the
bit-identity checks of the CUDA pair run on the BF16 model ZLLM_E2E_BITWISE_MODEL names (stories260K is F32, whose
products go through cuBLAS, not batch invariant in its bits: docs/cuda.md):

- reference: each prompt position's logprob and its 20 alternatives equal the float64 log-softmax of the logits that
  zllm-logits (cpu-ref) prints for the prefix before it, within 1e-4, alternatives ordered by logprob then id;
  position 0 is None; the prompt ids come back; both engines;
- the raw distribution: a logit bias, penalties and a temperature change the generated tokens' logprobs, never the
  prompt's;
- order: the prompt_logprobs messages come before the first token, in order, in messages of at most 256 positions
  (a prompt of 600 tokens: 3 messages);
- batch invariance: a prompt's logprobs alone, inside a batch of 24 other requests (some with prompt logprobs too),
  and prefilled in chunks of 3 tokens are bit-identical, on each engine; its generated tokens are those of the
  request without prompt logprobs;
- max_tokens 0 (scoring): no token, finish length; a one-token prompt gets its one nil entry;
- n = 2: each completion carries the same prompt logprobs (each prefills its prompt: no KV copy);
- the asyncio client: the same prompt logprobs;
- the `zllm` CLI: --prompt-logprobs 2 -n 0 prints one line per position with the protocol's values; -n 0 alone is a
  usage error;
- bounds: prompt_logprobs 21, max_tokens 0 without prompt_logprobs: bad_request, nothing queued; a prompt beyond the
  context: prompt_too_long.
Prints "N passed, N failed"."""
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, DEVICE, STORIES, Checks, Cluster, watchdog, zllm  # noqa: E402

PROMPT = [1, 327, 260, 299, 472, 17, 375, 408, 39, 508, 48, 186, 60, 61, 62, 300, 301, 17, 260, 299]
MODELS = ("stories", "ref", "chunk", "refchunk")


def ref_logits(ids):
    out = subprocess.run([os.path.join(BIN, "zllm-logits"), "-m", STORIES, "--device", "cpu-ref"] +
                         [str(i) for i in ids], stdout=subprocess.PIPE, check=True, timeout=60)
    return [float(x) for x in out.stdout.split()]


def log_softmax(lg):
    mx = max(lg)
    lse = mx + math.log(sum(math.exp(x - mx) for x in lg))
    return [x - lse for x in lg]


def check_reference(ck, c):
    refs = [None] + [log_softmax(ref_logits(PROMPT[:p])) for p in range(1, len(PROMPT))]
    for model in ("stories", "ref"):
        r = c.generate(tokens=PROMPT, model=model, max_tokens=0, prompt_logprobs=20, stream=False)
        ck.ok(r.ok and r.finish_reason == "length" and r.token_ids == [], "%s: max_tokens 0 ends with length" % model)
        ck.ok(r.prompt_token_ids == PROMPT and len(r.prompt_logprobs) == len(PROMPT) and r.prompt_logprobs[0] is None,
              "%s: the prompt's ids, one entry per position, None first" % model)
        if len(r.prompt_logprobs) != len(PROMPT):
            continue
        worst, order, tops = 0.0, True, True
        for p in range(1, len(PROMPT)):
            lp, lsm = r.prompt_logprobs[p], refs[p]
            worst = max([worst, abs(lp["logprob"] - lsm[PROMPT[p]])] + [abs(v - lsm[i]) for i, v in lp["top"]])
            t = lp["top"]
            order &= len(t) == 20 and all((t[i][1], -t[i][0]) > (t[i + 1][1], -t[i + 1][0]) for i in range(19))
            want = sorted(range(len(lsm)), key=lambda i: (-lsm[i], i))[:20]
            tops &= [i for i, _ in t] == want or all(abs(lsm[a] - lsm[b]) <= 1e-4 for (a, _), b in zip(t, want))
        ck.ok(worst <= 1e-4, "%s: prompt logprobs and alternatives within 1e-4 of float64 (max err %g)" % (model, worst))
        ck.ok(order, "%s: 20 alternatives per position, by logprob then id" % model)
        ck.ok(tops, "%s: the alternatives are the reference's top 20" % model)


def check_raw(ck, c):
    base = c.generate(tokens=PROMPT, max_tokens=4, temperature=0, logprobs=True, prompt_logprobs=5)
    bent = c.generate(tokens=PROMPT, max_tokens=4, temperature=0.7, seed=3, logprobs=True, prompt_logprobs=5,
                      presence_penalty=1.0, frequency_penalty=0.5, logit_bias={base.token_ids[0]: -5, 77: 2})
    ck.ok(bent.prompt_logprobs == base.prompt_logprobs, "bias, penalties and temperature leave prompt logprobs alone")
    ck.ok(bent.logprobs[0] != base.logprobs[0], "... and change the generated token's (the sampler's distribution)")
    plain = c.generate(tokens=PROMPT, max_tokens=4, temperature=0, logprobs=True)
    if not ck.ok(plain.token_ids == base.token_ids and plain.logprobs == base.logprobs and plain.prompt_logprobs == [],
                 "prompt logprobs change nothing of the generation; none unless asked for"):
        print("  with prompt logprobs: %r %r\n  without: %r %r %r" % (
            base.token_ids, base.logprobs, plain.token_ids, plain.logprobs, plain.prompt_logprobs), flush=True)


def check_order(ck, c):
    long = [1] + [(37 * i) % 500 + 3 for i in range(599)]
    id = c.submit(tokens=long, max_tokens=3, temperature=0, prompt_logprobs=1)
    kinds, starts, sizes = [], [], []
    while True:
        m = c.next_message(id, timeout=30)
        if m is None:
            break
        kinds.append(m["type"])
        if m["type"] == "prompt_logprobs":
            starts.append(m["start"])
            sizes.append(len(m["ids"]))
        if m["type"] == "final":
            break
    first_tok = kinds.index("token") if "token" in kinds else len(kinds)
    ck.ok(kinds and all(k == "prompt_logprobs" for k in kinds[:first_tok]) and
          "prompt_logprobs" not in kinds[first_tok:], "prompt_logprobs messages come before the first token")
    ck.ok(sizes and max(sizes) <= 256 and sum(sizes) == 600 and len(sizes) >= 3,
          "600 positions in %d messages of at most 256 (%s)" % (len(sizes), sizes))
    ck.ok(starts == [sum(sizes[:i]) for i in range(len(sizes))], "in order, from position 0 (%s)" % starts)
    one = c.generate(tokens=[1], max_tokens=0, prompt_logprobs=3)
    ck.ok(one.ok and one.prompt_token_ids == [1] and one.prompt_logprobs == [None], "a one-token prompt: one nil entry")


def check_invariance(ck, c, pairs=(("stories", "chunk"), ("ref", "refchunk"))):
    kw = dict(tokens=PROMPT, max_tokens=6, temperature=0.8, seed=11, ignore_eos=True, logprobs=True,
              prompt_logprobs=20)
    for model, chunked in pairs:
        alone = c.generate(model=model, **kw)
        ids = []
        for i in range(24):
            ids.append(c.submit(model=model, tokens=[1] + [(11 * i + 7 * j) % 500 + 2 for j in range(5 + i)],
                                max_tokens=4 + i % 3, temperature=1.0, seed=i, ignore_eos=True,
                                prompt_logprobs=(i % 4) if i % 2 else None))
        target = c.submit(model=model, **kw)
        res = zllm.Result(target)
        pending, end = set(ids + [target]), time.monotonic() + 60
        while pending and time.monotonic() < end:
            m = c.next_message(None, timeout=1.0)
            if m is None:
                continue
            if m["id"] == target:
                zllm._apply(res, m)
            if m["type"] == "final":
                pending.discard(m["id"])
        ck.ok(not pending, "%s: 25 requests finished" % model)
        ck.ok(res.prompt_logprobs == alone.prompt_logprobs and len(alone.prompt_logprobs) == len(PROMPT),
              "%s: prompt logprobs alone and inside a batch of 25 bit-identical" % model)
        ck.ok(res.token_ids == alone.token_ids and res.logprobs == alone.logprobs, "%s: the same tokens" % model)
        ch = c.generate(model=chunked, **kw)
        ck.ok(ch.prompt_logprobs == alone.prompt_logprobs, "%s: prefilled in chunks of 3, bit-identical" % model)
        ck.ok(ch.token_ids == alone.token_ids and ch.logprobs == alone.logprobs, "%s: chunks of 3, same tokens" % model)


def close(a, b, tol):
    """a == b, floats within tol"""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    return a == b


def check_n(ck, c, cl, tol=0.0):
    """tol: 0 where the products are batch invariant in their bits; the F32 model on CUDA (cuBLAS) gets 1e-4"""
    before = cl.status()["counters"].get("prefills_shared", 0)
    rs = c.generate(tokens=PROMPT, n=2, seed=5, max_tokens=3, temperature=1.0, prompt_logprobs=2)
    one = c.generate(tokens=PROMPT, max_tokens=0, prompt_logprobs=2)
    ck.ok(isinstance(rs, list) and len(rs) == 2 and all(close(r.prompt_logprobs, one.prompt_logprobs, tol)
                                                        for r in rs),
          "n=2: each completion carries the prompt logprobs")
    time.sleep(0.6)
    ck.ok(cl.status()["counters"].get("prefills_shared", 0) == before, "n=2 with prompt logprobs: no KV copied")


def check_async(ck, c, cl):
    import asyncio
    want = c.generate(tokens=PROMPT, max_tokens=0, prompt_logprobs=4)

    async def go():
        ac = zllm.AsyncClient(cl.clients_ep)
        try:
            return await ac.generate(tokens=PROMPT, max_tokens=0, prompt_logprobs=4)
        finally:
            ac.close()
    r = asyncio.run(go())
    ck.ok(r.prompt_token_ids == PROMPT and r.prompt_logprobs == want.prompt_logprobs and len(want.prompt_logprobs) ==
          len(PROMPT), "AsyncClient: the same prompt logprobs")


def check_cli(ck, c, cl):
    zl = os.path.join(BIN, "zllm")
    ref = c.generate(tokens=PROMPT, max_tokens=0, prompt_logprobs=2)
    toks = ",".join(str(t) for t in PROMPT)
    p = subprocess.run([zl, "generate", "--broker", cl.clients_ep, "--tokens", toks, "-n", "0", "--prompt-logprobs",
                        "2", "--ids"], capture_output=True, text=True, timeout=30)
    lines = [x.split() for x in p.stderr.splitlines() if x.startswith("prompt_logprob ")]
    ck.ok(p.returncode == 0 and len(lines) == len(PROMPT), "cli --prompt-logprobs 2 -n 0: %d lines (%r)" % (
        len(lines), p.stderr[-200:]))
    ok = len(lines) == len(PROMPT) and lines[0] == ["prompt_logprob", "0", str(PROMPT[0]), "-"] and all(
        int(ln[1]) == i and int(ln[2]) == PROMPT[i] and abs(float(ln[3]) - ref.prompt_logprobs[i]["logprob"]) < 1e-5
        and [int(x.split(":")[0]) for x in ln[4:]] == [t for t, _ in ref.prompt_logprobs[i]["top"]]
        for i, ln in enumerate(lines) if i > 0)
    ck.ok(ok, "cli --prompt-logprobs: the protocol's positions, ids, logprobs and alternatives")
    p = subprocess.run([zl, "generate", "--broker", cl.clients_ep, "--tokens", toks, "-n", "0"], capture_output=True,
                       text=True, timeout=30)
    ck.ok(p.returncode == 2 and "--prompt-logprobs" in p.stderr, "cli -n 0 without --prompt-logprobs: usage error")


def check_bad(ck, c, cl):
    accepted = cl.status()["counters"].get("accepted")
    for name, kw in (("prompt_logprobs 21", dict(max_tokens=2, prompt_logprobs=21)),
                     ("max_tokens 0 without prompt_logprobs", dict(max_tokens=0))):
        r = c.generate(tokens=PROMPT, raise_on_error=False, **kw)
        ck.ok(r.code == "bad_request" and "prompt_logprobs" in (r.message or ""), "%s: bad_request (%s)" % (
            name, r.message))
    ck.ok(cl.status()["counters"].get("accepted") == accepted, "bad input queued nothing")
    r = c.generate(tokens=[1] * 5000, max_tokens=0, prompt_logprobs=1, raise_on_error=False)
    ck.ok(r.code == "prompt_too_long", "a prompt beyond the context: prompt_too_long (%s)" % r.message)


def main():
    watchdog(300)
    ck = Checks("prompt_logprobs")
    if not ck.ok(os.path.exists(os.path.join(BIN, "zllm-logits")), "%s/zllm-logits exists" % BIN):
        return ck.report()
    bitwise_model = os.environ.get("ZLLM_E2E_BITWISE_MODEL", "") if DEVICE == "cuda" else None
    if bitwise_model is not None and not ck.ok(os.path.isfile(bitwise_model),
                                               "ZLLM_E2E_BITWISE_MODEL names a file (%r)" % bitwise_model):
        return ck.report()
    cl = Cluster()
    cl.start_broker(*[a for m in MODELS[1:] for a in ("--model", "%s=%s" % (m, STORIES))])
    cl.start_worker("stories", max_batch=32)
    for name, dev, extra in (("ref", "cpu-ref", []), ("chunk", DEVICE, ["--step-tokens", "3"]),
                             ("refchunk", "cpu-ref", ["--step-tokens", "3"])):
        cl.workers[name] = cl._spawn(name, [os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m", STORIES,
                                            "--model-name", name, "--name", name, "--device", dev, "--max-batch", "32",
                                            "--threads", "1"] + extra)
    try:
        if ck.ok(cl.wait_workers(list(MODELS), timeout=30) is not None, "workers registered"):
            with cl.client() as c:
                check_reference(ck, c)
                check_raw(ck, c)
                check_order(ck, c)
                check_invariance(ck, c, (("ref", "refchunk"),) if bitwise_model else
                                 (("stories", "chunk"), ("ref", "refchunk")))
                check_n(ck, c, cl, 1e-4 if bitwise_model else 0.0)
                check_async(ck, c, cl)
                check_cli(ck, c, cl)
                check_bad(ck, c, cl)
        else:
            cl.dump_logs()
    finally:
        cl.close()
    if bitwise_model:   # the CUDA pair's bit-identity on the BF16 model: whole prompts and chunks of 3
        cl = Cluster(model=bitwise_model, model_name="stories")
        cl.start_broker("--model", "chunk=%s" % bitwise_model)
        cl.start_worker("stories", max_batch=32)
        cl.workers["chunk"] = cl._spawn("chunk", [os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m",
                                                  bitwise_model, "--model-name", "chunk", "--name", "chunk", "--device",
                                                  DEVICE, "--max-batch", "32", "--step-tokens", "3"])
        try:
            if ck.ok(cl.wait_workers(["stories", "chunk"], timeout=60) is not None, "workers registered (BF16)"):
                with cl.client() as c:
                    check_invariance(ck, c, (("stories", "chunk"),))
                    check_n(ck, c, cl)
            else:
                cl.dump_logs()
        finally:
            cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
