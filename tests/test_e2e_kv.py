"""tests/test_e2e_kv.py: KV block accounting and cache-aware routing with real processes (docs/kv-cache.md): a
broker and two CPU workers (stories260K, --kv-block 4). The same greedy prompt sent three times, one after the
other, gives llama2.c's golden ids each time; the second and third go to the worker that ran the first (routing
by the block hashes it reported), which finds all but the last prompt block in its prefix cache (kv_hit_tokens);
the other worker saw nothing. A priority is accepted end to end. The workers' KV counters reach status and
`zllm status`. A paged pool too small for one context is refused at the worker's start."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Checks, Cluster, golden_ids, golden_req, watchdog  # noqa: E402

K, MT, BS = 40, 8, 4


def main():
    watchdog(80)
    ck = Checks("e2e_kv")
    gold = golden_ids()
    cl = Cluster()
    try:
        cl.start_broker()
        cl.start_worker("k1", "--kv-block", str(BS), max_batch=2)
        cl.start_worker("k2", "--kv-block", str(BS), max_batch=2)
        st = cl.wait_workers(["k1", "k2"], timeout=20)
        if not ck.ok(st is not None, "workers registered"):
            return ck.report()
        per_slot = (2048 + BS - 1) // BS
        ck.ok(all(w["kv_block"] == BS and w["kv_free"] in (0, 2 * per_slot) for w in st["workers"]),
              "registered with kv_block %d, a pool of 2 slots' blocks: %r" % (BS, st["workers"]))
        with cl.client() as c:
            for i in range(3):
                r = c.generate(stream=False, priority=7 if i == 2 else 0, **golden_req(gold, K, MT))
                ck.ok(list(r.token_ids) == gold[K:K + MT], "run %d: golden ids" % i)
                time.sleep(0.3)
        prompt = K + 1
        end = time.monotonic() + 5
        while True:   # the heartbeats (every 500 ms) report the third run's counters
            st = cl.status()
            if sum(w["kv_prompt_tokens"] for w in st["workers"]) >= 3 * prompt or time.monotonic() > end:
                break
            time.sleep(0.1)
        ws = {w["name"]: w for w in st["workers"]}
        full = (prompt - 1) // BS * BS   # tokens of the full blocks before the last prompt token
        hits = sorted(w["kv_hit_tokens"] for w in ws.values())
        prompts = sorted(w["kv_prompt_tokens"] for w in ws.values())
        ck.ok(prompts == [0, 3 * prompt], "one worker ran all three (prompt tokens %r)" % prompts)
        ck.ok(hits == [0, 2 * full], "runs 2 and 3 found %d cached tokens each (hits %r)" % (full, hits))
        ck.ok(st["counters"].get("cache_routed", 0) >= 2, "cache_routed: %r" % st["counters"])
        out = subprocess.run([os.path.join(BIN, "zllm"), "status", "--broker", cl.clients_ep], capture_output=True,
                             text=True, timeout=10).stdout
        ck.ok("kv block %d: used 0" % BS in out and ("%d found cached" % (2 * full)) in out,
              "zllm status prints the KV counters: %s" % out)
        busy = [w for w in ws.values() if w["kv_prompt_tokens"]]
        ck.ok(busy and busy[0]["kv_used"] == 0 and busy[0]["kv_cached"] >= (prompt + MT - 1) // BS and
              busy[0]["kv_summary"] >= busy[0]["kv_cached"], "its blocks are cached and reported: %r" % busy)
        # a paged pool smaller than one whole context: refused at start, with the reason
        p = subprocess.run([os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m", cl.model, "--ctx", "64",
                            "--kv-block", "4", "--kv-blocks", "16", "--threads", "1"], capture_output=True, text=True,
                           timeout=20)
        ck.ok(p.returncode != 0 and "at least 17 blocks" in p.stdout + p.stderr,
              "--kv-blocks 16 for a context of 64 in blocks of 4: refused (rc %d): %s" % (p.returncode, p.stderr))
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
