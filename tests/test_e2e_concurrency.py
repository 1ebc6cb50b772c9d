"""tests/test_e2e_concurrency.py: 64 concurrent requests through one real broker to 2 real CPU workers
(stories260K, greedy, mixed prompt and output lengths, prompts as token ids and as text) all complete, and each
output equals the same request run alone. Token-id prompts are BOS + the first k ids of llama2.c's golden greedy
continuation, so their outputs must also equal the golden ids k, k+1, ... (an oracle outside zllm)."""
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Cluster, Checks, collect, golden_ids, watchdog, fixtures  # noqa: E402


def main():
    watchdog(90)
    ck = Checks("e2e_concurrency")
    gold = golden_ids()
    with open(fixtures.path("stories260K", "golden_greedy_text.txt")) as f:
        words = f.read().split()
    rng = random.Random(1234)
    reqs = []
    for i in range(64):
        mt = rng.choice([1, 3, 8, 17, 30, 45])
        if i % 2 == 0:
            k = rng.randrange(0, 150 - mt)
            reqs.append({"tokens": [1] + gold[:k], "max_tokens": mt, "ignore_eos": True, "_k": k})
        else:
            a = rng.randrange(0, len(words) - 40)
            reqs.append({"prompt": " ".join(words[a:a + rng.randrange(1, 40)]), "max_tokens": mt})
    cl = Cluster()
    try:
        cl.start_broker()
        cl.start_worker("w1", "--step-tokens", "16", max_batch=8)
        cl.start_worker("w2", "--step-tokens", "16", max_batch=8)
        st = cl.wait_workers(["w1", "w2"], timeout=15)
        if not ck.ok(st is not None, "2 workers registered"):
            cl.dump_logs()
            return ck.report()
        c = cl.client()
        ids = []
        t0 = time.monotonic()
        for i, r in enumerate(reqs):
            kw = {k: v for k, v in r.items() if not k.startswith("_")}
            ids.append(c.submit(id="c%d" % i, temperature=0, deadline_ms=30000, **kw))
        res = collect(c, ids, timeout=40)
        t_all = time.monotonic() - t0
        done = sum(1 for i in ids if res[i]["finals"])
        ck.ok(done == 64, "%d of 64 requests got a final" % done)
        workers_used = set()
        for i, rid in enumerate(ids):
            r = res[rid]
            if not r["finals"]:
                continue
            f = r["finals"][0]
            ck.ok(len(r["finals"]) == 1 and r["after"] == 0, "c%d: exactly one final, nothing after it" % i)
            ck.ok(f.get("finish") in ("stop", "length"), "c%d: finish %s (%s %s)" % (
                i, f.get("finish"), f.get("code"), f.get("message")))
            ck.ok(f.get("usage", {}).get("completion_tokens") == len(r["ids"]),
                  "c%d: usage.completion_tokens %s == %d streamed ids" % (
                      i, f.get("usage", {}).get("completion_tokens"), len(r["ids"])))
            if "_k" in reqs[i]:
                k, mt = reqs[i]["_k"], reqs[i]["max_tokens"]
                ck.ok(r["ids"] == gold[k:k + mt], "c%d: golden continuation from %d: got %s want %s" % (
                    i, k, r["ids"][:8], gold[k:k + 8]))
                ck.ok(f.get("finish") == "length", "c%d: length finish" % i)
        st = cl.status()
        for w in st.get("workers", []):
            if w.get("step", 0) > 0:
                workers_used.add(w["name"])
        ck.ok(workers_used == {"w1", "w2"}, "both workers ran steps: %s" % sorted(workers_used))
        # each request alone, one at a time
        same = 0
        for i, r in enumerate(reqs):
            kw = {k: v for k, v in r.items() if not k.startswith("_")}
            alone = c.generate(temperature=0, deadline_ms=20000, timeout=25, **kw)
            rb = res[ids[i]]
            eq = alone.token_ids == rb["ids"] and alone.text == rb["text"]
            same += eq
            ck.ok(eq, "c%d: concurrent output %s/%r differs from alone %s/%r" % (
                i, rb["ids"][:10], rb["text"][:40], alone.token_ids[:10], alone.text[:40]))
        print("64 concurrent requests in %.2f s; %d of 64 equal to the request run alone" % (t_all, same))
        # seeded sampling: the same seed gives the same tokens, whichever worker and batch it lands in
        samp = dict(tokens=[1], max_tokens=40, temperature=0.9, top_k=40, top_p=0.95, ignore_eos=True)
        sids = [c.submit(id="s%d" % i, seed=7 if i < 6 else 8, deadline_ms=20000, **samp) for i in range(8)]
        sres = collect(c, sids, timeout=20)
        runs = [sres[i]["ids"] for i in sids]
        ck.ok(all(len(r) == 40 for r in runs) and all(r == runs[0] for r in runs[:6]),
              "seed 7 six times at once: identical samples")
        ck.ok(runs[6] == runs[7] and runs[6] != runs[0], "seed 8: identical to itself, different from seed 7")
        ck.ok(runs[0] != gold[:40], "temperature 0.9 does not give the greedy ids")
        # the C command: `zllm generate --ids` from BOS prints llama2.c's golden ids
        p = subprocess.run([os.path.join(BIN, "zllm"), "generate", "--broker", cl.clients_ep, "--tokens", "1",
                            "-n", "50", "--temp", "0", "--ignore-eos", "--ids"], capture_output=True, text=True,
                           timeout=30)
        ck.ok(p.returncode == 0 and [int(x) for x in p.stdout.split()] == gold[:50],
              "zllm generate --ids: golden ids (rc %d, %r)" % (p.returncode, p.stdout[:60]))
        p = subprocess.run([os.path.join(BIN, "zllm"), "generate", "--broker", cl.clients_ep, "--tokens", "1",
                            "-n", "50", "--temp", "0", "--ignore-eos"], capture_output=True, text=True, timeout=30)
        ck.ok(p.returncode == 0 and p.stdout.strip() == c.generate(tokens=[1], max_tokens=50, temperature=0,
                                                                   ignore_eos=True).text.strip(),
              "zllm generate prints the Python client's text")
        p = subprocess.run([os.path.join(BIN, "zllm"), "bench", "--broker", cl.clients_ep, "-N", "32", "-c", "8",
                            "--prompt-len", "4:40", "--out-len", "8:32", "--vocab", "512"], capture_output=True,
                           text=True, timeout=60)
        print(p.stdout.strip())
        ck.ok(p.returncode == 0 and "requests: 32 (32 ok" in p.stdout and "ttft ms: p50" in p.stdout,
              "zllm bench: 32 of 32 ok (rc %d)" % p.returncode)
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
