"""tests/test_broker_hostile.py: hostile input against a zllm-broker built with AddressSanitizer+UBSan.
Malformed, truncated, deeply nested, oversized and multi-frame messages, huge declared lengths, unknown types,
bad field types and ranges, unknown and duplicate request ids, bytes from a stranger on the worker socket, and
a few hundred random mutations: every one gets an error reply (or is dropped and counted), the broker keeps
serving a well-behaved client correctly, and it exits 0 on SIGTERM with no sanitizer report."""
import os
import random
import struct
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, Checker, Client, FakeWorker, asan_broker, pack  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
ck = Checker()
binary = asan_broker(build) or os.path.join(build, "bin", "zllm-broker")
ctx = zmq.Context()
b = Broker(binary)
w = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=256, step_ms=5)
ck.check(w.registered.wait(5), "worker registered")
c = Client(ctx, b.clients)
PROMPT = "Once upon a time there was a little cat."


def expect_error(label, payload, want_type="error", raw=True):
    if raw:
        c.raw(payload)
    else:
        c.send(payload)
    m = c.recv(3)
    ok = m is not None and m.get("type") == want_type
    if ok and want_type == "error":
        ok = m.get("code") == "bad_message" and isinstance(m.get("message"), str)
    if ok and want_type == "final":
        ok = m.get("finish") == "error" and m.get("code") == "bad_request"
    ck.check(ok, "%s: expected %s, got %r" % (label, want_type, m))


def good_request(rid):
    c.generate(rid, prompt=PROMPT, max_tokens=12, stream=True)
    toks, fin = c.wait_final(rid, 10)
    text = "".join(t["text"] for t in toks) + (fin or {}).get("text", "")
    return fin, text


# a baseline answer to compare with after the abuse
fin0, text0 = good_request("base")
ck.check(fin0 is not None and fin0["finish"] == "length" and fin0["usage"]["completion_tokens"] == 12,
         "baseline request completes: %r" % (fin0,))
ck.check(text0 == PROMPT, "baseline text echoes the prompt: %r" % text0)

expect_error("garbage", b"\xc1\xc1\xc1garbage")
expect_error("empty frame", b"")
expect_error("not a map", msgpack.packb([1, 2, 3]))
good = pack({"type": "generate", "id": "t1", "prompt": "hello", "max_tokens": 3})
expect_error("truncated", good[:len(good) // 2])
expect_error("trailing bytes", good + b"\x00")
expect_error("nested 64 deep", b"\x81\xa1a" + b"\x91" * 64 + b"\x01")
expect_error("array32 of 4G", b"\x81\xa1a\xdd\xff\xff\xff\xff")
expect_error("str32 of 2G", b"\x81\xa1a\xdb\x7f\xff\xff\xff" + b"x" * 10)
expect_error("map32 of 4G", b"\xdf\xff\xff\xff\xff")
expect_error("unknown type", pack({"type": "launch_missiles", "id": "x"}), raw=True)
expect_error("no version", msgpack.packb({"type": "status"}))
expect_error("worker message from a client", pack({"type": "out", "step": 1, "rids": [1], "toks": [1], "fin": [0]}))
expect_error("generate without id", pack({"type": "generate", "prompt": "x"}))
expect_error("id too long", pack({"type": "generate", "id": "x" * 65, "prompt": "x"}))
# bad fields with a usable id: a final with bad_request for that id
expect_error("NaN temperature", pack({"type": "generate", "id": "nan", "prompt": "x", "temperature": float("nan")}),
             want_type="final")
expect_error("negative max_tokens", pack({"type": "generate", "id": "neg", "prompt": "x", "max_tokens": -1}),
             want_type="final")
expect_error("string max_tokens", pack({"type": "generate", "id": "str", "prompt": "x", "max_tokens": "9"}),
             want_type="final")
expect_error("prompt and tokens", pack({"type": "generate", "id": "two", "prompt": "x", "tokens": [1]}),
             want_type="final")
c.raw(msgpack.packb({"zllm": 1, "type": "generate", "id": "utf8", "prompt": b"\xff\xfe"}, use_bin_type=False))
m = c.recv(3)
ck.check(m is not None and m.get("type") == "final" and m.get("code") == "bad_request", "invalid UTF-8 prompt: %r" % m)
expect_error("out-of-vocabulary tokens", pack({"type": "generate", "id": "oov", "tokens": [1, 999999]}),
             want_type="final")
# two frames in one message
c.s.send_multipart([pack({"type": "status"}), b"extra"])
m = c.recv(3)
ck.check(m is not None and m.get("type") == "error", "two frames: %r" % m)
# unknown request id: counted and ignored (no reply)
c.send({"type": "cancel", "id": "never-sent"})
ck.check(c.recv(0.3) is None, "cancel of an unknown id gets no reply")

# duplicate id while the first is in flight: an error for the duplicate, the first completes normally
c.generate("dup", prompt=PROMPT, max_tokens=40, stream=True)
c.generate("dup", prompt=PROMPT, max_tokens=40, stream=True)
toks, fin = c.wait_final("dup", 10)
msgs = toks
dup_err = [x for x in msgs if x.get("type") == "error"]
ck.check(len(dup_err) == 1 and dup_err[0].get("code") == "duplicate_id", "duplicate id error: %r" % dup_err)
ck.check(fin is not None and fin["finish"] == "length" and fin["usage"]["completion_tokens"] == 40,
         "the original of a duplicate completes: %r" % (fin,))

# an oversized frame (> 1 MiB) from another socket gets a too_large final; one over the socket's own limit
# (8 MiB) has its connection dropped, and nothing else happens
big = ctx.socket(zmq.DEALER)
big.setsockopt(zmq.LINGER, 0)
big.connect(b.clients)
big.send(pack({"type": "generate", "id": "big", "prompt": "a" * (2 << 20)}))
m = msgpack.unpackb(big.recv(), raw=False) if big.poll(3000) else None
ck.check(m is not None and m.get("type") == "final" and m.get("id") == "big" and m.get("code") == "too_large",
         "a 2 MiB generate gets a too_large final: %r" % ({k: v for k, v in (m or {}).items() if k != "text"},))
big.send(pack({"type": "status", "pad": "a" * (2 << 20)}))
m = msgpack.unpackb(big.recv(), raw=False) if big.poll(3000) else None
ck.check(m is not None and m.get("type") == "error" and m.get("code") == "too_large" and "id" not in m,
         "a 2 MiB message without a generate id gets a too_large error: %r" % (m,))
big.send(pack({"type": "generate", "id": "huge", "prompt": "a" * (9 << 20)}))
ck.check(not big.poll(500), "a frame over the socket limit gets no reply (connection dropped)")
big.close(0)

# a stranger on the worker socket: garbage is dropped; hb/out from an unknown identity get reregister
stranger = ctx.socket(zmq.DEALER)
stranger.setsockopt(zmq.LINGER, 0)
stranger.connect(b.workers)
stranger.send(b"\x00\x01garbage")
stranger.send(pack({"type": "out", "step": 5, "rids": [1, 2, 3], "toks": [1, 2, 3], "fin": [0, 0, 0]}))
ok = stranger.poll(2000) and msgpack.unpackb(stranger.recv()).get("type") == "reregister"
ck.check(ok, "unknown worker's out gets reregister")
stranger.send(pack({"type": "hb", "step": 1, "free_slots": 1, "running": 0}))
ok = stranger.poll(2000) and msgpack.unpackb(stranger.recv()).get("type") == "reregister"
ck.check(ok, "unknown worker's hb gets reregister")
stranger.close(0)

# random mutations of valid messages: the broker must survive them all
rng = random.Random(1234)
seeds = [good, pack({"type": "cancel", "id": "x"}), pack({"type": "status", "id": "s"}),
         pack({"type": "generate", "id": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "bb"]}),
         pack({"type": "generate", "id": "k", "tokens": [1, 2, 3], "stop_ids": [5], "seed": 7, "top_p": 0.5})]
fz = ctx.socket(zmq.DEALER)
fz.setsockopt(zmq.LINGER, 0)
fz.connect(b.clients)
for i in range(400):
    s = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 6)):
        s[rng.randrange(len(s))] = rng.randrange(256)
    if rng.random() < 0.3:
        s = s[:rng.randrange(len(s) + 1)]
    if rng.random() < 0.2:
        s += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    fz.send(bytes(s))
time.sleep(0.5)
fz.close(0)

# still serving, and the answer has not changed
fin1, text1 = good_request("after")
ck.check(fin1 is not None and fin1["finish"] == "length" and text1 == text0,
         "after the abuse the same request gives the same answer: %r %r" % (fin1, text1))
st = c.status()
ck.check(st is not None and st["counters"]["bad_messages"] >= 20, "bad messages counted: %r" % (st and st["counters"]))
ck.check(st is not None and st["counters"]["unknown_ids"] >= 1 and st["counters"]["duplicate_ids"] >= 1,
         "unknown and duplicate ids counted")
ck.check(b.alive(), "broker alive")

c.close()
w.close()
rc = b.stop()
log = b.logtext()
ck.check(rc == 0, "broker exits 0 on SIGTERM (rc=%s)" % rc)
ck.check("AddressSanitizer" not in log and "runtime error" not in log and "LeakSanitizer" not in log,
         "no sanitizer report:\n" + log[-3000:])
ctx.term()
sys.exit(ck.report())
