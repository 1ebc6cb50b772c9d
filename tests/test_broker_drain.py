"""tests/test_broker_drain.py: more of the broker's request flow with fake workers over real sockets (ASan
build): a client that never reads does not slow the others and loses its streams, a client that vanishes has its
sequence cancelled at once, the SIGTERM drain (in-flight work finishes, new work is refused, exit 0; past the
drain deadline every request gets a shutting_down final), and routing by model name (a configured model without
workers waits until the deadline)."""
import os
import signal
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


# ---- 5: a client that never reads does not slow the others; its streams are cancelled
b = Broker(binary, extra=["--client-hwm", "50"])
w = FakeWorker(ctx, b.workers, n_slots=8, n_ctx=4096, step_ms=1)
ck.check(w.registered.wait(5), "worker registered (5)")
slow = Client(ctx, b.clients, rcvhwm=1)
slow.s.setsockopt(zmq.RCVBUF, 4096)
for i in range(4):
    slow.generate("slow%d" % i, prompt=PROMPT, max_tokens=2000)
fast = Client(ctx, b.clients)
time.sleep(0.3)
t0 = time.time()
fast.generate("f", prompt=PROMPT, max_tokens=200)
toks, fin = fast.wait_final("f", 10)
el = time.time() - t0
ck.check(fin is not None and fin["finish"] == "length" and text_of(toks, fin).startswith(PROMPT),
         "fast client served while another never reads: %r" % (fin,))
t0 = time.time()
while time.time() - t0 < 5:
    st = fast.status()
    if st is not None and st["counters"]["clients_lost"] >= 1 and st["active"] == 0:
        break
    time.sleep(0.1)
ck.check(st is not None and st["counters"]["clients_lost"] >= 1 and st["active"] == 0,
         "the non-reading client's streams were cancelled: %r" % ((st and (st["counters"], st["active"])),))
# a client that goes away mid-stream (EHOSTUNREACH on the next send): its sequence is cancelled at once
gone = Client(ctx, b.clients)
gone.generate("g", prompt=PROMPT, max_tokens=1500)
m = gone.recv(3)
ck.check(m is not None and m.get("type") == "token", "streaming started for the client that will vanish")
nc = len(w.cancelled)
lost0 = st["counters"]["clients_lost"] if st else 0
gone.close()
t0 = time.time()
while len(w.cancelled) == nc and time.time() - t0 < 2:
    time.sleep(0.01)
ck.check(len(w.cancelled) > nc and time.time() - t0 < 0.5,
         "a vanished client's sequence is cancelled on the worker within %.3f s" % (time.time() - t0))
st = fast.status()
ck.check(st is not None and st["counters"]["clients_lost"] > lost0 and st["active"] == 0, "vanished client counted")
fast.close()
slow.close()
w.close()
ck.check(b.stop() == 0, "broker 2 exits 0")

# ---- 6: SIGTERM drain: in-flight requests finish, new ones are refused, exit 0
b = Broker(binary, extra=["--drain-ms", "5000"])
w = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=256, step_ms=20)
ck.check(w.registered.wait(5), "worker registered (6)")
c = Client(ctx, b.clients)
for i in range(3):
    c.generate("d%d" % i, prompt=PROMPT, max_tokens=25)
time.sleep(0.2)
b.p.send_signal(signal.SIGTERM)
time.sleep(0.1)
c.generate("late", prompt=PROMPT, max_tokens=5)
toks, fin = c.wait_final("late", 3)
ck.check(fin is not None and fin.get("code") == "shutting_down", "new work refused while draining: %r" % (fin,))
for i in range(3):
    toks, fin = c.wait_final("d%d" % i, 5)
    ck.check(fin is not None and fin["finish"] == "length" and fin["usage"]["completion_tokens"] == 25,
             "in-flight d%d finishes during the drain: %r" % (i, fin))
rc = b.p.wait(5)
ck.check(rc == 0, "drained broker exits 0 (rc=%s)" % rc)
w.close()

# ---- 7: drain deadline: unfinished work ends with shutting_down finals, exit 0 quickly
b = Broker(binary, extra=["--drain-ms", "300"])
w = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=4096, step_ms=20)
ck.check(w.registered.wait(5), "worker registered (7)")
c2 = Client(ctx, b.clients)
for i in range(3):
    c2.generate("e%d" % i, prompt=PROMPT, max_tokens=2000)
c2.generate("eq", prompt=PROMPT, max_tokens=2000)   # may queue or run
time.sleep(0.2)
t0 = time.time()
b.p.send_signal(signal.SIGTERM)
got = 0
for rid in ("e0", "e1", "e2", "eq"):
    toks, fin = c2.wait_final(rid, 3)
    if fin is not None and fin.get("code") == "shutting_down":
        got += 1
ck.check(got == 4, "every unfinished request gets a shutting_down final (%d of 4)" % got)
rc = b.p.wait(5)
ck.check(rc == 0 and time.time() - t0 < 2.0, "exit 0 soon after the drain deadline (rc=%s, %.2f s)" % (rc, time.time() - t0))
log = b.logtext()
ck.check("AddressSanitizer" not in log and "runtime error" not in log, "no sanitizer report")
w.close()

# ---- 8: routing by model name; a configured model without workers waits until the deadline
from broker_fake import model_path  # noqa: E402
b = Broker(binary, models=["alpha=" + model_path(), "beta=" + model_path()])
w = FakeWorker(ctx, b.workers, model="beta")
ck.check(w.registered.wait(5), "worker for beta registered")
c3 = Client(ctx, b.clients)
c3.generate("to-alpha", prompt=PROMPT, max_tokens=5, model="alpha", deadline_ms=600)
c3.generate("to-beta", prompt=PROMPT, max_tokens=5, model="beta")
c3.generate("default", prompt=PROMPT, max_tokens=5)   # the first --model: alpha, no worker either
toks, fin = c3.wait_final("to-beta", 5)
ck.check(fin is not None and fin["finish"] == "length", "beta request served by beta's worker: %r" % (fin,))
toks, fin = c3.wait_final("to-alpha", 5)
ck.check(fin is not None and fin["finish"] == "timeout" and not toks, "alpha waits for a worker until its deadline: %r"
         % (fin,))
st = c3.status()
ck.check(st is not None and st["models"] == ["alpha", "beta"] and st["queue"] == 1, "status lists both models, 1 queued")
c3.send({"type": "cancel", "id": "default"})
toks, fin = c3.wait_final("default", 3)
ck.check(fin is not None and fin["finish"] == "cancelled", "a queued request can be cancelled: %r" % (fin,))
c3.close()
w.close()
ck.check(b.stop() == 0, "broker 8 exits 0")
c.close()
c2.close()
ctx.term()
sys.exit(ck.report())
