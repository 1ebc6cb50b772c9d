"""tests/test_broker_limits.py: limits that answer instead of dropping. A 2 MiB generate gets a too_large final
and the same client's three other requests finish; the Python client refuses to send over 1 MiB (the C client:
tests/test_client_limits.c); a request
id that is not valid UTF-8 is refused with an error that does not echo it (every reply stays decodable); a
client with a 255-byte routing identity (libzmq's maximum) gets its replies; every reply carries the broker's
instance id."""
import os
import sys

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))
from broker_fake import Broker, Checker, Client, FakeWorker, model_path, pack  # noqa: E402
import zllm  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
binary = os.path.join(build, "bin", "zllm-broker")
ck = Checker()
if not ck.check(os.path.exists(model_path()), "fixture model present: %s" % model_path()):
    sys.exit(ck.report())
ctx = zmq.Context()
PROMPT = "Once upon a time there was a little cat."

b = Broker(binary)
w = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=256, step_ms=20)
ck.check(w.registered.wait(5), "worker registered")
c = Client(ctx, b.clients)

# ---- a 2 MiB prompt among three running requests
for i in range(3):
    c.generate("ok%d" % i, prompt=PROMPT, max_tokens=30)
c.generate("big", prompt="a" * (2 << 20), max_tokens=4)
toks, fin = c.wait_final("big", 5)
ck.check(fin is not None and fin.get("finish") == "error" and fin.get("code") == "too_large",
         "a 2 MiB generate gets a too_large final: %r" % ({k: v for k, v in (fin or {}).items() if k != "text"},))
for i in range(3):
    toks, fin = c.wait_final("ok%d" % i, 10)
    ck.check(fin is not None and fin.get("finish") == "length" and fin["usage"]["completion_tokens"] == 30 and
             len(toks) == 30, "the same client's request ok%d finishes: %r" % (i, fin))
st = c.status()
ck.check(st is not None and st["counters"].get("too_large") == 1 and st["counters"].get("clients_lost") == 0,
         "counted too_large, no client lost: %r" % ((st or {}).get("counters"),))
ck.check(isinstance((st or {}).get("inst"), str) and len(st["inst"]) == 16, "status carries inst: %r" % (st or {}).get("inst"))

# ---- clients refuse before sending
pc = zllm.Client(b.clients)
try:
    pc.generate("a" * (1 << 20), max_tokens=2)
    ck.check(False, "the Python client sent a 1 MiB prompt")
except zllm.ZllmError as e:
    ck.check(e.code == "too_large" and "1048576" in str(e), "Python client: too_large before sending: %s" % e)
r = pc.generate(PROMPT, max_tokens=3)
ck.check(r.finish_reason == "length", "the Python client still works: %r" % r)
pc.close()

# ---- request ids must be valid UTF-8
bad_id = b"\xa2\xff\xfe"   # a msgpack str of 2 bytes that are not UTF-8
raw = b"\x85" + msgpack.packb("zllm") + b"\x01" + msgpack.packb("type") + msgpack.packb("generate") + \
    msgpack.packb("id") + bad_id + msgpack.packb("prompt") + msgpack.packb("hi") + msgpack.packb("max_tokens") + b"\x02"
c.raw(raw)
frame = c.s.recv() if c.s.poll(3000) else None
try:
    m = msgpack.unpackb(frame, raw=False) if frame is not None else None
except Exception as e:   # an echoed invalid id makes the reply undecodable
    m = {"undecodable": repr(e)}
ck.check(m is not None and m.get("type") == "error" and m.get("code") == "bad_message" and "id" not in m and
         "UTF-8" in m.get("message", ""), "a non-UTF-8 request id is refused without echoing it: %r" % (m,))
c.raw(raw[:-1] + b"\xa1")   # and a malformed one with that id
m2 = c.recv(3)
ck.check(m2 is not None and m2.get("type") == "error" and "id" not in m2, "malformed, with that id: error without it: %r" % (m2,))
r = zllm.Client(b.clients).generate(PROMPT, max_tokens=2)
ck.check(r.finish_reason == "length", "the broker still serves: %r" % r)

# ---- a 255-byte routing identity
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.ROUTING_ID, b"R" * 255)
s.connect(b.clients)
s.send(pack({"type": "generate", "id": "long-ident", "prompt": PROMPT, "max_tokens": 3}))
msgs = []
while s.poll(5000):
    msgs.append(msgpack.unpackb(s.recv(), raw=False))
    if msgs[-1].get("type") == "final":
        break
ck.check(msgs and msgs[-1].get("type") == "final" and msgs[-1].get("finish") == "length",
         "a 255-byte routing identity gets its stream and final: %r" % (msgs[-1:] if msgs else None,))
ck.check(all(isinstance(x.get("inst"), str) and x.get("inst") == st.get("inst") for x in msgs),
         "every message carries the same inst")
s.close(0)

w.close()
c.close()
rc = b.stop()
ck.check(rc == 0, "broker exits 0: %r" % rc)
sys.exit(ck.report())
