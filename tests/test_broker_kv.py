"""tests/test_broker_kv.py: priorities and cache-aware routing in the broker (docs/kv-cache.md), with fake workers
over real sockets (ASan build where there is one).
1. the Python copy of the chained block hash (tests/broker_fake.py) gives the bits common/kv_hash.c gives (the
   same fixed vector tests/test_kv_blocks.c checks);
2. priority: out of range is a bad_request; a queued high-priority request is assigned before low-priority ones
   queued earlier, FIFO within one priority, and the worker receives the priority; a request requeued after its
   worker died goes first among its priority;
3. routing: 2 replicas whose prefix caches hold about 9 of 16 distinct 1536-token system prompts, 512 requests
   (a random system prompt + a distinct user turn each): cache-aware routing reaches a hit rate of at least 90%
   of prompt tokens (as the fake workers count and report them) with the requests per replica within 20%, where
   routing by free slots alone (--route load) stays far below (about half);
4. hostile KV reports: 4097 hashes, a hash that is not an unsigned integer, or kv_block 257 make the message
   malformed (the worker is forgotten or never registered); a report of any 4096 values is only ever a summary."""
import os
import random
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import (Broker, Checker, Client, FakeWorker, asan_broker, kv_block_hashes,  # noqa: E402
                         kv_model_key, pack)

build = os.environ.get("ZLLM_BUILD", "build")
ck = Checker()
binary = asan_broker(build) or os.path.join(build, "bin", "zllm-broker")
ctx = zmq.Context()

# ---- 1: the hash both sides compute
ck.check(kv_block_hashes(kv_model_key("stories260K"), [1, 2, 3, 4], 4) == [0x632426691270953d],
         "the Python block hash matches common/kv_hash.c's fixed vector")

# ---- 2: priorities
b = Broker(binary)
c = Client(ctx, b.clients)
w = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=512, step_ms=20)
ck.check(w.registered.wait(5), "worker registered")
c.generate("bad", tokens=[5, 6, 7], max_tokens=2, priority=101)
toks, fin = c.wait_final("bad", 5)
ck.check(fin is not None and fin.get("code") == "bad_request" and "priority" in fin.get("message", ""),
         "priority 101 is a bad_request: %r" % (fin,))
c.generate("blocker", tokens=[5, 6, 7], max_tokens=25)       # holds the only slot for ~0.5 s
time.sleep(0.1)
order = [("low1", -5), ("mid1", 0), ("low2", -5), ("mid2", 0), ("high", 50)]
for name, pr in order:
    c.generate(name, tokens=[5, 6, 7], max_tokens=1, priority=pr)
finals = {}
for name in ["blocker"] + [n for n, _ in order]:
    toks, fin = c.wait_final(name, 10)
    finals[name] = fin
ck.check(all(f is not None and f["finish"] == "length" for f in finals.values()), "all complete: %r" % finals)
with w.lock:
    assigned = list(w.assigned)
    prio = dict(w.priorities)
# rids follow acceptance: bad was rejected at validation, so blocker=1, low1=2, mid1=3, low2=4, mid2=5, high=6
ck.check(assigned == [1, 6, 3, 5, 2, 4], "assigned by priority, FIFO within one: %r" % assigned)
ck.check(prio.get(6) == 50 and prio.get(2) == -5 and prio.get(1) == 0, "the worker receives the priority: %r" % prio)
w.close()
c.close()
ck.check(b.stop() == 0, "broker exits 0")
# a request requeued after its worker died goes first among its priority, after the higher ones
b = Broker(binary, extra=["--dead-ms", "300", "--hang-ms", "300"])
c = Client(ctx, b.clients)
w1 = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=512, step_ms=20, hb_ms=50)
ck.check(w1.registered.wait(5), "worker 1 registered")
w1.hang_on_assign = True
c.generate("X", tokens=[5, 6, 7], max_tokens=2)
time.sleep(0.1)
for name, pr in (("Y", 5), ("Z", 0), ("W", 5)):
    c.generate(name, tokens=[5, 6, 7], max_tokens=2, priority=pr)
time.sleep(0.8)   # worker 1 is found dead, X (no token sent) goes back to the queue
w2 = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=512, step_ms=20)
ck.check(w2.registered.wait(5), "worker 2 registered")
for name in ("X", "Y", "Z", "W"):
    toks, fin = c.wait_final(name, 10)
    ck.check(fin is not None and fin["finish"] == "length", "%s completes: %r" % (name, fin))
with w2.lock:
    assigned = list(w2.assigned)
# X=1, Y=2, Z=3, W=4: the requeued X goes after the priority-5 ones, before Z
ck.check(assigned == [2, 4, 1, 3], "requeue keeps priority order, first within its priority: %r" % assigned)
w1.close()
w2.close()
c.close()
ck.check(b.stop() == 0, "broker exits 0")

# ---- 3: cache-aware routing vs routing by load
BS, SYS, N_SYS, N_REQ = 16, 1536, 16, 512
rng = random.Random(7)
systems = [[rng.randrange(512) for _ in range(SYS)] for _ in range(N_SYS)]
reqs = [(rng.randrange(N_SYS), [rng.randrange(512) for _ in range(16)]) for _ in range(N_REQ)]
CACHE = 9 * (SYS // BS) + 16   # blocks: about 9 of the 16 system prompts


def run(route):
    b = Broker(binary, extra=["--route", route])
    c = Client(ctx, b.clients)
    ws = [FakeWorker(ctx, b.workers, n_slots=8, n_ctx=2048, step_ms=5, hb_ms=100, kv_block=BS, kv_cache=CACHE,
                     name="kv%d" % i) for i in range(2)]
    ok = all(w.registered.wait(5) for w in ws)
    t0 = time.time()
    for i, (s, user) in enumerate(reqs):
        c.generate("r%d" % i, tokens=systems[s] + user, max_tokens=4, stream=False)
    done = 0
    for i in range(N_REQ):
        toks, fin = c.wait_final("r%d" % i, 60)
        done += fin is not None and fin["finish"] == "length"
    el = time.time() - t0
    time.sleep(0.3)    # a heartbeat with the final counters
    st = c.status()
    hit = sum(x["kv_hit_tokens"] for x in st["workers"]) if st else 0
    tot = sum(x["kv_prompt_tokens"] for x in st["workers"]) if st else 1
    per = [len(w.assigned) for w in ws]
    summ = [x["kv_summary"] for x in st["workers"]] if st else []
    counters = st["counters"] if st else {}
    for w in ws:
        w.close()
    c.close()
    rc = b.stop()
    print("route %s: %d/%d done in %.1f s, hit rate %.3f, per replica %r, summaries %r, cache_routed %s, "
          "cache_balanced %s" % (route, done, N_REQ, el, hit / max(tot, 1), per, summ,
                                 counters.get("cache_routed"), counters.get("cache_balanced")), flush=True)
    return ok, done, hit / max(tot, 1), per, counters, rc, tot


ok, done, rate, per, counters, rc, tot = run("cache")
ck.check(ok and done == N_REQ and rc == 0, "cache routing: all %d requests complete (%d)" % (N_REQ, done))
ck.check(tot == sum(SYS + 16 for _ in reqs), "the workers counted every prompt token (%d)" % tot)
ck.check(rate >= 0.90, "cache routing: hit rate %.3f >= 0.90" % rate)
ck.check(abs(per[0] - per[1]) <= 0.2 * (sum(per) / 2), "cache routing: load within 20%%: %r" % per)
ck.check(counters.get("cache_routed", 0) >= N_REQ * 0.9, "cache_routed counts the routed requests: %r" % counters)
ok, done, rate_load, per_load, counters, rc, tot = run("load")
ck.check(ok and done == N_REQ and rc == 0, "load routing: all complete (%d)" % done)
ck.check(rate_load < 0.75 and rate - rate_load > 0.2,
         "routing by load alone hits far less (%.3f vs %.3f)" % (rate_load, rate))

# ---- 4: hostile KV reports


def raw_worker(b, name, **extra):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(b.workers)
    reg = {"type": "register", "name": name, "model": "stories260K", "device": "fake", "max_batch": 2,
           "n_slots": 2, "n_ctx": 512, "kv_tokens": 1024, "vocab_size": 512, "heartbeat_ms": 100}
    reg.update(extra)
    s.send(pack(reg))
    ok = s.poll(2000) and msgpack.unpackb(s.recv(), raw=False).get("type") == "registered"
    return s, ok


b = Broker(binary)
c = Client(ctx, b.clients)
s, ok = raw_worker(b, "big", kv_block=257, kv_blocks=4)
ck.check(not ok, "kv_block 257: not registered")
s.close(0)
for name, hashes in (("toomany", list(range(4097))), ("strhash", [1, "x"]), ("neghash", [1, -2])):
    s, ok = raw_worker(b, name, kv_block=16, kv_blocks=64)
    ck.check(ok, "%s registers" % name)
    s.send(pack({"type": "hb", "step": 1, "free_slots": 2, "running": 0, "kv_used": 0, "kv_hashes": hashes}))
    time.sleep(0.2)
    st = c.status()
    names = [w["name"] for w in st["workers"]] if st else ["?"]
    ck.check(name not in names, "%s: the worker is forgotten: %r" % (name, names))
    s.close(0)
s, ok = raw_worker(b, "fine", kv_block=16, kv_blocks=64)
s.send(pack({"type": "hb", "step": 1, "free_slots": 2, "running": 0, "kv_used": 1, "kv_free": 2, "kv_cached": 3,
             "kv_hit_tokens": 7, "kv_prompt_tokens": 9, "kv_hashes": [(1 << 64) - 1 - i for i in range(4096)]}))
time.sleep(0.2)
st = c.status()
wk = [w for w in st["workers"] if w["name"] == "fine"] if st else []
ck.check(len(wk) == 1 and wk[0]["kv_summary"] == 4096 and wk[0]["kv_cached"] == 3 and wk[0]["kv_hit_tokens"] == 7 and
         wk[0]["kv_block"] == 16, "4096 hashes of any value: a summary of 4096, counters as reported: %r" % (wk,))
ck.check(st is not None and st["counters"].get("lying_workers") == 3, "three forgotten: %r" % (st and st["counters"]))
s.close(0)
c.close()
ck.check(b.stop() == 0, "broker exits 0")

ctx.term()
sys.exit(ck.report())
