"""tests/test_broker_failover.py: dead and hung workers (fake workers over real sockets, ASan broker).
- A worker that stops completely (no heartbeats, no output: what SIGSTOP looks like) while streaming: found
  within 3 s, its streamed requests end with error/worker_failed.
- A worker that hangs right after taking work (no token sent yet): its requests are requeued to the other
  worker and complete with the full answer.
- A worker that keeps heartbeating but whose step counter stalls while it holds work: found hung within 3 s.
- The stopped worker comes back: its hb gets `reregister`, it registers again and takes work."""
import os
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, Checker, Client, FakeWorker, asan_broker  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
ck = Checker()
binary = asan_broker(build) or os.path.join(build, "bin", "zllm-broker")
ctx = zmq.Context()
PROMPT = "Once upon a time there was a little cat. The cat liked to play."


def text_of(toks, fin):
    return "".join(t.get("text", "") for t in toks if t.get("type") == "token") + (fin or {}).get("text", "")


b = Broker(binary)
c = Client(ctx, b.clients)

# ---- 1: a streaming worker stops dead
w1 = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=2048, step_ms=20, hb_ms=100, name="w1")
ck.check(w1.registered.wait(5), "w1 registered")
for i in range(3):
    c.generate("a%d" % i, prompt=PROMPT, max_tokens=1000)
time.sleep(0.4)
w1.hang = True
t0 = time.time()
for i in range(3):
    toks, fin = c.wait_final("a%d" % i, 5)
    el = time.time() - t0
    ck.check(fin is not None and fin["finish"] == "error" and fin.get("code") == "worker_failed" and len(toks) > 0,
             "streamed request a%d ends worker_failed: %r" % (i, fin))
    ck.check(el <= 3.2, "dead worker found within 3 s (%.2f s)" % el)

# ---- 2: a worker hangs before sending any token: its requests are requeued to another worker
w2 = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=2048, step_ms=5, hb_ms=100, name="w2")
ck.check(w2.registered.wait(5), "w2 registered")
w2.hang_on_assign = True
# w2 is the only live worker: it takes the requests and hangs
c.generate("r0", prompt=PROMPT, max_tokens=20)
c.generate("r1", prompt=PROMPT, max_tokens=20, stream=False)
time.sleep(0.3)
w3 = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=2048, step_ms=5, hb_ms=100, name="w3")
ck.check(w3.registered.wait(5), "w3 registered")
t0 = time.time()
toks, fin = c.wait_final("r0", 6)
ck.check(fin is not None and fin["finish"] == "length" and text_of(toks, fin).startswith(PROMPT[:20]),
         "requeued streaming request completes on the other worker: %r" % (fin,))
toks, fin = c.wait_final("r1", 6)
ck.check(fin is not None and fin["finish"] == "length" and len(fin.get("ids", [])) == 20,
         "requeued non-streaming request completes: %r" % (fin,))
ck.check(time.time() - t0 < 3.5, "requeue within 3 s (%.2f s)" % (time.time() - t0))
st = c.status()
ck.check(st is not None and st["counters"]["requeued"] >= 2 and st["counters"]["worker_deaths"] >= 2,
         "requeues and deaths counted: %r" % ((st and st["counters"]),))

# ---- 3: heartbeats continue but the step counter stalls while holding work
st = c.status()
deaths0, requeued0 = st["counters"]["worker_deaths"], st["counters"]["requeued"]
w3.stall = True
c.generate("h0", prompt=PROMPT, max_tokens=50)
time.sleep(3.3)
st = c.status()
ck.check(st["counters"]["worker_deaths"] > deaths0 and st["counters"]["requeued"] > requeued0,
         "a worker whose step counter stalls while holding work is found within 3 s, its request requeued: %r" %
         (st["counters"],))
# (the stalled worker still heartbeats, so it is told to reregister and may take h0 again: stop it for good)
w3.close()
w1.hang = False
toks, fin = c.wait_final("h0", 10)
ck.check(fin is not None and fin["finish"] == "length" and w1.reregisters >= 1,
         "a stopped worker that resumes is told to reregister and takes work again: %r (rereg %d)" %
         (fin, w1.reregisters))

for w in (w1, w2, w3):
    w.close()
c.close()
rc = b.stop()
log = b.logtext()
ck.check(rc == 0, "broker exits 0")
ck.check("AddressSanitizer" not in log and "runtime error" not in log, "no sanitizer report")
ctx.term()
sys.exit(ck.report())
