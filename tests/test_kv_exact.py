"""tests/test_kv_exact.py: exact prefix caching and preemption (docs/kv-cache.md), with real processes. Two
clusters (a broker and one CPU worker each, stories260K, a context of 256): the worker under test runs paged KV
with a small pool (--kv-block 4 --kv-blocks 72: a whole context and a little more, for 16 sequences of up to 40
blocks each), so that prefixes are found in its cache, cached blocks are evicted and running sequences are
preempted and resumed all the time; the reference worker runs contiguous slots without a prefix cache. ZLLM_KV_EXACT_N
requests (default 10000), in waves of randomized requests sent concurrently: prompts made of a few shared prefixes
cut at random lengths plus random tails, multi-turn continuations (an earlier request's prompt and answer plus a new
turn), greedy and sampled (seeded) requests, random priorities, logprobs with alternatives; some are cancelled at a
random moment (in the queue, mid-prefill or mid-decode). Every request that is not cancelled must give bitwise the
reference's ids, finish reason and logprobs (the final-step values of each token); a cancelled one's ids must be a
prefix of the reference's. The reference worker holds no cache and its steps are batch invariant (a sequence's
logits do not depend on the others in its step: tests/test_engine_cpu_fast.c), so its answers are those of each
request alone on an empty cache; a sample of ZLLM_KV_EXACT_ALONE requests (default 100) is also run one at a time
on it to check that. The worker's KV counters (hits, preemptions, evictions) are printed and must all be non-zero.

ZLLM_KV_EXACT_WORKER_ARGS adds arguments to the worker under test (tests/test_kv_mutants.sh runs this test against
broken workers). ZLLM_KV_EXACT_REPLAYS=1 also requires that the worker replayed generated tokens as decode entries
after preemptions (read from the counters it logs when it exits: a worker with --debug-kv-split 1, or on CUDA).
Other models and pools (tests/run_gpu.sh runs it on a CUDA worker): ZLLM_KV_EXACT_MODEL (a GGUF file, default
stories260K), ZLLM_KV_EXACT_VOCAB (the token ids drawn, default 512), ZLLM_KV_EXACT_BLOCK and ZLLM_KV_EXACT_BLOCKS
(the pool, default 4 and 72), ZLLM_KV_EXACT_TIMEOUT (seconds, default 170)."""
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import Checks, Cluster, collect, watchdog  # noqa: E402

N = int(os.environ.get("ZLLM_KV_EXACT_N", "10000"))
ALONE = int(os.environ.get("ZLLM_KV_EXACT_ALONE", "100"))
WAVE = 400
CTX, BATCH = 256, 16
BS = int(os.environ.get("ZLLM_KV_EXACT_BLOCK", "4"))
BLOCKS = int(os.environ.get("ZLLM_KV_EXACT_BLOCKS", "72"))
VOCAB = int(os.environ.get("ZLLM_KV_EXACT_VOCAB", "512"))
SEG = BS  # the shared prefixes' segments are whole blocks, and BOS plus their head one block


def make_requests(rng, n, prev):
    """n random request specs; prev: (prompt, answer ids) of earlier requests, for multi-turn continuations"""
    out = []
    for _ in range(n):
        kind = rng.random()
        if prev and kind < 0.25:   # a continuation: an earlier prompt and answer, then a new turn
            # half of them of the latest answers, whose blocks (decoded rows included) a pool may still hold
            p, a = rng.choice(prev[-64:] if rng.random() < 0.5 else prev)
            toks = p + a + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))]
        else:
            base = rng.choice(SHARED)
            cut = rng.randint(0, len(base))
            if BS > 4 and rng.random() < 0.3:
                # at a block boundary, then 0..2 tokens: the cache then holds all of the prompt but a token or
                # two, and its last chunk is a 1-token prompt chunk (the decode/prefill kernel rule's case)
                cut = max(0, cut - (cut + 1) % BS)
                tail = rng.randint(0, 2)
            else:
                tail = rng.randint(0, 10)
            toks = [1] + base[:cut] + [rng.randrange(3, VOCAB) for _ in range(tail)]
        cancel = rng.random() < 0.08   # to be cancelled at a random moment: longer answers
        # answers up to two blocks long: a continuation's prompt then holds whole blocks of decoded rows
        mt = rng.randint(8, 48) if cancel else rng.randint(1, 2 * BS)
        if len(toks) + mt > CTX - 1:
            toks = toks[:CTX - 1 - mt]
        spec = {"tokens": toks, "max_tokens": mt, "ignore_eos": rng.random() < 0.8,
                "priority": rng.choice((-5, 0, 0, 5)), "stream": False, "cancel": cancel}
        if rng.random() < 0.5:
            spec.update(temperature=0.9, seed=rng.randrange(1 << 30), top_k=rng.choice((0, 20)))
        else:
            spec.update(temperature=0)
        if rng.random() < 0.5:
            spec.update(logprobs=True, top_logprobs=2)
        out.append(spec)
    return out


def req(spec, **kw):
    """the client's arguments for a spec (without the test's own keys)"""
    return dict({k: v for k, v in spec.items() if k != "cancel"}, **kw)


def run_wave(cl, specs, cancel_rng=None):
    """submits every spec at once (a share of them cancelled after a random delay when cancel_rng is given);
    returns ({id: result}, set of cancelled ids, ordered ids)"""
    with cl.client() as c:
        ids = []
        cancels = []
        for s in specs:
            rid = c.submit(**req(s, stream=s["cancel"]))   # streamed: a cancelled request's ids come in tokens
            ids.append(rid)
            if s["cancel"] and cancel_rng is not None:   # in the queue, mid-prefill or mid-decode
                cancels.append((time.monotonic() + cancel_rng.random() * 0.4, rid))
        cancels.sort()
        for t, rid in cancels:
            d = t - time.monotonic()
            if d > 0:
                time.sleep(d)
            c.cancel(rid)
        res = collect(c, ids, 60.0)
    return res, {rid for _, rid in cancels}, ids


def main():
    watchdog(int(os.environ.get("ZLLM_KV_EXACT_TIMEOUT", "170")))
    ck = Checks("kv_exact")
    rng = random.Random(7919)
    global SHARED
    # shared prefixes made of a few segments of whole blocks in different orders: the same block contents follow
    # different prefixes (a block is identified by its whole prefix, never by its tokens alone)
    segs = [[rng.randrange(3, VOCAB) for _ in range(SEG * rng.randint(1, 3))] for _ in range(8)]
    head = [5, 6, 7] + list(range(8, 8 + BS - 4))   # BOS and the head fill block 0
    SHARED = [head + sum((rng.choice(segs) for _ in range(rng.randint(1, 10))), []) for _ in range(12)]
    extra = os.environ.get("ZLLM_KV_EXACT_WORKER_ARGS", "").split()
    model = os.environ.get("ZLLM_KV_EXACT_MODEL")
    test, ref = (Cluster(model=model), Cluster(model=model)) if model else (Cluster(), Cluster())
    try:
        test.start_broker()
        ref.start_broker()
        test.start_worker("paged", "--ctx", str(CTX), "--kv-block", str(BS), "--kv-blocks", str(BLOCKS), *extra,
                          max_batch=BATCH)
        ref.start_worker("ref", "--ctx", str(CTX), "--kv-block", "0", max_batch=BATCH)
        if not ck.ok(test.wait_workers(["paged"], timeout=20) is not None and
                     ref.wait_workers(["ref"], timeout=20) is not None, "workers registered"):
            return ck.report()
        prev = []
        done = bad = cancelled = cancelled_decoding = 0
        t0 = time.monotonic()
        alone_specs = []
        while done < N:
            specs = make_requests(rng, min(WAVE, N - done), prev)
            got, canc, gids = run_wave(test, specs, cancel_rng=rng)
            want, _, wids = run_wave(ref, [dict(s, cancel=False) for s in specs])
            for s, g, w in zip(specs, gids, wids):
                rg, rw = got[g], want[w]
                fw = rw["finals"][0] if rw["finals"] else {}
                if not fw or fw.get("finish") not in ("stop", "length"):
                    bad += not ck.ok(False, "reference: no final or an error for %r: %r" % (s, fw))
                    continue
                if len(prev) < 4000:
                    prev.append((s["tokens"], list(fw.get("ids") or rw["ids"])))
                fg = rg["finals"][0] if rg["finals"] else {}
                if g in canc and fg.get("finish") == "cancelled":
                    cancelled += 1
                    cancelled_decoding += len(rg["ids"]) > 0   # else queued or prefilling
                    if not ck.ok(rg["ids"] == fw["ids"][:len(rg["ids"])], "cancelled %s: its ids %r are a prefix of "
                                 "the reference's %r" % (g, rg["ids"], fw["ids"])):
                        bad += 1
                    continue
                # a streamed request (picked for a cancel that came after its end) has its logprobs in its tokens
                same = (fg.get("finish") == fw.get("finish") and rg["ids"] == fw["ids"] and
                        (g in canc or (fg.get("logprobs") or None) == (fw.get("logprobs") or None)))
                if not same:
                    bad += 1
                    if bad <= 5:
                        ck.ok(False, "request %r: paged %r %r %r, reference %r %r %r" % (
                            s, fg.get("finish"), rg["ids"], fg.get("logprobs"), fw.get("finish"), fw["ids"],
                            fw.get("logprobs")))
                if len(alone_specs) < ALONE and rng.random() < 0.05:
                    alone_specs.append((s, fw))
            done += len(specs)
        ck.ok(bad == 0, "%d requests (%d cancelled): every one equals the reference (%d differ)" % (
            done, cancelled, bad))
        print("%d requests in %.1f s; %d cancelled (%d after their first token)" % (
            done, time.monotonic() - t0, cancelled, cancelled_decoding), flush=True)
        # the reference against requests run one at a time on an empty cache
        diff = 0
        with ref.client() as c:
            for s, fw in alone_specs:
                r = c.generate(**req(s, stream=False), raise_on_error=False)
                lp = [[x["logprob"], [i for i, _ in x["top"]], [v for _, v in x["top"]]] if x else None
                      for x in r.logprobs] if s.get("logprobs") else None
                want = [[float(a), list(b), [float(v) for v in c_]] if a is not None else None
                        for a, b, c_ in (fw.get("logprobs") or [])] if s.get("logprobs") else None
                diff += list(r.token_ids) != list(fw["ids"]) or r.finish_reason != fw.get("finish") or (
                    lp is not None and lp != want)
        ck.ok(diff == 0, "the reference's answers equal %d requests run alone (%d differ)" % (len(alone_specs), diff))
        end = time.monotonic() + 3
        while True:   # the heartbeats report the last counters
            st = test.status()
            w = st["workers"][0]
            if time.monotonic() > end or (w["kv_used"] == 0 and w["kv_prompt_tokens"] > 0):
                break
            time.sleep(0.2)
        print("paged worker: hit %d of %d prompt tokens (%.1f%%), %d preemptions, %d evictions, %d cached blocks" % (
            w["kv_hit_tokens"], w["kv_prompt_tokens"], 100.0 * w["kv_hit_tokens"] / max(1, w["kv_prompt_tokens"]),
            w.get("kv_preemptions", 0), w.get("kv_evictions", 0), w["kv_cached"]), flush=True)
        ck.ok(w["kv_hit_tokens"] > 0 and w.get("kv_preemptions", 0) > 0 and w.get("kv_evictions", 0) > 0,
              "prefix hits, preemptions and evictions all happened: %r" % w)
        ck.ok(cancelled > 0, "some requests were cancelled while running (%d)" % cancelled)
        if os.environ.get("ZLLM_KV_EXACT_REPLAYS") == "1":   # the counters the worker logs when it exits
            p = test.workers["paged"]
            p.terminate()
            try:
                p.wait(timeout=10)
            except Exception:
                pass
            m = None
            for log in test.logs:
                if "/paged." in log:
                    with open(log, "rb") as f:
                        m = re.search(r"\((\d+) replayed as decode entries\)", f.read().decode("utf-8", "replace"))
            print("paged worker: %s generated tokens replayed as decode entries" % (m.group(1) if m else "no count of"),
                  flush=True)
            ck.ok(m is not None and int(m.group(1)) > 0, "resumed sequences replayed generated tokens as decodes")
    finally:
        if ck.failed:
            test.dump_logs()
            ref.dump_logs()
        test.close()
        ref.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
