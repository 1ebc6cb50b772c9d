"""tests/test_broker_flow.py: the broker's request flow with fake workers over real sockets (ASan build):
streaming and non-streaming text against the prompt it echoes, stop strings, validation finals
(prompt_too_long, unknown_model), a full queue answering overloaded at once, cancel freeing a slot for a waiting
request at once, deadlines and status readiness (tests/test_broker_drain.py has the rest)."""
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


# ---- 1: no worker yet: status not ready, a bounded queue, overloaded at once; then a worker drains the queue
b = Broker(binary, extra=["--queue", "2", "--client-hwm", "50"])
c = Client(ctx, b.clients)
st = c.status()
ck.check(st is not None and st["ready"] is False and st["models"] == ["stories260K"], "not ready without workers: %r" % st)
c.generate("q1", prompt=PROMPT, max_tokens=8)
c.generate("q2", prompt=PROMPT, max_tokens=8)
t0 = time.time()
c.generate("q3", prompt=PROMPT, max_tokens=8)
toks, fin = c.wait_final("q3", 2)
ck.check(fin is not None and fin["finish"] == "overloaded" and fin.get("code") == "overloaded" and
         time.time() - t0 < 0.5, "full queue answers overloaded at once: %r" % (fin,))
b2 = Broker(binary, extra=["--queue-tokens", "30", "--drain-ms", "200"])
c2 = Client(ctx, b2.clients)
c2.generate("t1", prompt=PROMPT, max_tokens=5)       # ~20 prompt tokens: queued (no worker)
c2.generate("t2", prompt=PROMPT, max_tokens=5)       # would make ~40 > 30
toks, fin = c2.wait_final("t2", 2)
ck.check(fin is not None and fin["finish"] == "overloaded", "queued-token bound answers overloaded: %r" % (fin,))
ck.check(b2.stop() == 0, "token-bound broker exits 0 after its drain deadline")
toks, fin = c2.wait_final("t1", 2)
ck.check(fin is not None and fin.get("code") == "shutting_down", "the queued request got its final: %r" % (fin,))
c2.close()
c.generate("big", prompt=PROMPT, max_tokens=100000)
toks, fin = c.wait_final("big", 2)
ck.check(fin is not None and fin.get("code") == "prompt_too_long", "beyond the model's context: %r" % (fin,))
c.generate("um", prompt=PROMPT, model="no-such-model")
toks, fin = c.wait_final("um", 2)
ck.check(fin is not None and fin.get("code") == "unknown_model", "unknown model: %r" % (fin,))

w = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=128, step_ms=10)
ck.check(w.registered.wait(5), "worker registered")
for rid in ("q1", "q2"):
    toks, fin = c.wait_final(rid, 10)
    ck.check(fin is not None and fin["finish"] == "length", "queued %s completes once a worker registers: %r" % (rid, fin))
st = c.status()
ck.check(st is not None and st["ready"] is True and len(st["workers"]) == 1 and st["workers"][0]["n_ctx"] == 128,
         "ready with a worker: %r" % st)
c.generate("fit", prompt=PROMPT, max_tokens=120)
toks, fin = c.wait_final("fit", 2)
ck.check(fin is not None and fin.get("code") == "no_capacity", "beyond every worker's n_ctx (within the model's): no_capacity: %r" % (fin,))

# ---- 2: text: streamed == non-streamed == the prompt the fake worker echoes; stop strings
c.generate("probe", prompt=PROMPT, max_tokens=1)
toks, fin = c.wait_final("probe", 10)
n_prompt = fin["usage"]["prompt_tokens"] if fin else 17
c.generate("s", prompt=PROMPT, max_tokens=n_prompt)
toks, fin = c.wait_final("s", 10)
ck.check(fin is not None and text_of(toks, fin) == PROMPT,
         "streamed echo equals the prompt: %r / %r" % (text_of(toks, fin), fin))
ck.check(all(len(t["ids"]) == 1 for t in toks) and len(toks) == n_prompt, "one token message per token")
c.generate("ns", prompt=PROMPT, max_tokens=n_prompt, stream=False)
toks, fin = c.wait_final("ns", 10)
ck.check(fin is not None and not toks and fin["text"] == PROMPT and len(fin["ids"]) == n_prompt,
         "non-streamed: all text and ids in the final: %r" % (fin,))
c.generate("stop", prompt=PROMPT, max_tokens=40, stop=["little cat", "zzz"])
toks, fin = c.wait_final("stop", 10)
streamed = "".join(t["text"] for t in toks)
ck.check(fin is not None and fin["finish"] == "stop" and text_of(toks, fin) == "Once upon a time there was a "
         and "little" not in streamed, "stop string: %r %r" % (streamed, fin))
time.sleep(0.1)
ck.check(len(w.cancelled) >= 1, "a stop string cancels the sequence on the worker")

# ---- 3: cancel frees the slot: the waiting request is admitted at once
c.generate("long", prompt=PROMPT, max_tokens=100)
time.sleep(0.2)
c.generate("wait", prompt=PROMPT, max_tokens=5)
time.sleep(0.2)
ck.check(c.pending.get("wait") is None, "second request waits for the only slot")
t0 = time.time()
c.send({"type": "cancel", "id": "long"})
toks, fin = c.wait_final("long", 5)
ck.check(fin is not None and fin["finish"] == "cancelled", "cancel gives a cancelled final: %r" % (fin,))
toks, fin = c.wait_final("wait", 5)
first = None
ck.check(fin is not None and fin["finish"] == "length", "the waiting request completes: %r" % (fin,))
ck.check(time.time() - t0 < 0.5, "waiting request admitted at once after the cancel (%.3f s)" % (time.time() - t0))

# ---- 4: deadline: timeout final and a cancel to the worker
nc = len(w.cancelled)
c.generate("dl", prompt=PROMPT, max_tokens=100, deadline_ms=300)
t0 = time.time()
toks, fin = c.wait_final("dl", 5)
el = time.time() - t0
ck.check(fin is not None and fin["finish"] == "timeout" and 0.25 < el < 0.8, "deadline: %r after %.3f s" % (fin, el))
time.sleep(0.1)
ck.check(len(w.cancelled) > nc, "timeout cancels on the worker")
w.close()
c.close()
ck.check(b.stop() == 0, "broker 1 exits 0")

ctx.term()
sys.exit(ck.report())
