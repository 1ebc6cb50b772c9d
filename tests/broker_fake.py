"""tests/broker_fake.py: helpers for the broker tests (tests/test_broker_*.py): start a zllm-broker, a fake
worker that speaks the worker protocol (docs/protocol.md) from Python, and a small client.

The fake worker "generates" by echoing its prompt: output token i is prompt[i % len(prompt)], so the text a
client receives can be checked against the prompt text itself (through the broker's own tokenizer)."""
import collections
import os
import signal
import struct
import subprocess
import tempfile
import threading
import time

import msgpack
import zmq

import fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_counter = [0]
_brokers = {}   # endpoint -> Broker: the waits below end early once that broker's process has exited


def _broker_gone(endpoint):
    b = _brokers.get(endpoint)
    return b is not None and b.p.poll() is not None


class _Registered(threading.Event):
    """FakeWorker.registered: wait(timeout) also returns (False) as soon as the broker's process has exited."""

    def __init__(self, endpoint):
        super().__init__()
        self.endpoint = endpoint

    def wait(self, timeout=None):
        end = None if timeout is None else time.time() + timeout
        while end is None or time.time() < end:
            step = 0.1 if end is None else max(0.0, min(0.1, end - time.time()))
            if super().wait(step):
                return True
            if _broker_gone(self.endpoint):
                print("FakeWorker: the broker at %s has exited" % self.endpoint, flush=True)
                return super().wait(0)
        return self.is_set()


def model_path():
    return fixtures.path("stories260K", "stories260K.gguf")


def ipc(tag):
    _counter[0] += 1
    return "ipc:///tmp/zllm-test-%d-%d-%s" % (os.getpid(), _counter[0], tag)


def asan_broker(build):
    """Builds (if needed) a zllm-broker linked against the ASan+UBSan library under BUILD/asan-bin and returns
    its path; falls back to BUILD/bin/zllm-broker when the sanitizer build is not possible."""
    out = os.path.join(build, "asan-bin", "zllm-broker")
    src = os.path.join(ROOT, "broker", "main_zllm-broker.c")
    libs = [os.path.join(build, "asan", "lib", "libzllm_%s.a" % d) for d in ("broker", "common")]
    lib = libs[0]
    r = subprocess.run(["make", "--no-print-directory", "-s", "BUILD=" + build, "asan-libs"], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode == 0 and os.path.exists(lib):
        newest = max([os.path.getmtime(x) for x in libs] + [os.path.getmtime(src)])
        if not os.path.exists(out) or os.path.getmtime(out) < newest:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            cmd = ["cc", "-std=c11", "-O1", "-g", "-D_GNU_SOURCE", "-pthread", "-fno-omit-frame-pointer",
                   "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                   "-Icommon", "-Ibroker", "-o", out, src] + libs + [
                   "-lzmq", "-lmsgpackc", "-lpcre2-8", "-lutf8proc", "-lm", "-lpthread"]
            r = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE)
            if r.returncode != 0:
                print("asan broker build failed:", r.stderr.decode()[-2000:])
                return None
        return out
    print("asan-libs failed:", r.stderr.decode()[-2000:])
    return None


class Broker:
    def __init__(self, binary, models=None, extra=(), clients=None, workers=None, env=None):
        self.clients = clients or ipc("c")
        self.workers = workers or ipc("w")
        models = models or [model_path()]
        args = [binary, "--clients", self.clients, "--workers", self.workers, "-v"]
        for m in models:
            args += ["--model", m]
        args += list(extra)
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        if env:
            e.update(env)
        self.log = tempfile.TemporaryFile(mode="w+")   # deleted when closed; read by logtext()
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, env=e, cwd=ROOT)
        lines = [self.p.stdout.readline().decode().split() for _ in range(2)]
        if not lines[0]:   # end of file: the broker exited before it printed its endpoints
            try:
                rc = self.p.wait(5)
            except subprocess.TimeoutExpired:
                rc = None
            raise RuntimeError("zllm-broker exited (rc %s) before it printed its endpoints:\n%s" % (
                rc, self.logtext()[-3000:]))
        if len(lines[0]) == 2:
            self.clients = lines[0][1]
            self.workers = lines[1][1]
        _brokers[self.clients] = _brokers[self.workers] = self

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        for ep in (self.clients, self.workers):
            if ep.startswith("ipc://"):
                try:
                    os.unlink(ep[len("ipc://"):])
                except OSError:
                    pass
        return rc

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()


def pack(d):
    d = dict(d)
    d.setdefault("zllm", 1)
    return msgpack.packb(d, use_bin_type=True)


# ---- the chained KV block hashes of common/kv_hash.h, for fake workers that report a prefix cache
_M64 = (1 << 64) - 1
KV_HASH_K1 = 0x7a6c6c6d2d6b7631


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash24(k0, k1, data):
    """SipHash-2-4 of bytes under the key (k0, k1), as common/kv_hash.c computes it."""
    v = [0x736f6d6570736575 ^ k0, 0x646f72616e646f6d ^ k1, 0x6c7967656e657261 ^ k0, 0x7465646279746573 ^ k1]

    def rnd():
        v[0] = (v[0] + v[1]) & _M64; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & _M64; v[3] = _rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & _M64; v[3] = _rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & _M64; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)

    n = len(data)
    full = n & ~7
    for i in range(0, full, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v[3] ^= m
        rnd(); rnd()
        v[0] ^= m
    b = ((n << 56) & _M64) | int.from_bytes(data[full:], "little")
    v[3] ^= b
    rnd(); rnd()
    v[0] ^= b
    v[2] ^= 0xff
    rnd(); rnd(); rnd(); rnd()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def kv_model_key(name):
    return siphash24(0, KV_HASH_K1, name.encode())


_block_memo = {}


def kv_block_hashes(model_key, tokens, bs):
    """the chained hashes of the full blocks of tokens (common/kv_hash.h), memoized per (key, prev, block)"""
    out, h = [], 0
    for i in range(len(tokens) // bs):
        blk = tuple(tokens[i * bs:(i + 1) * bs])
        k = (model_key, h, blk)
        nh = _block_memo.get(k)
        if nh is None:
            nh = siphash24(model_key, KV_HASH_K1, struct.pack("<Q", h) + struct.pack("<%dI" % bs, *blk))
            if len(_block_memo) < 200000:
                _block_memo[k] = nh
        h = nh
        out.append(h)
    return out


class FakeWorker:
    """A worker in a thread. step_ms: time per step; n_slots/n_ctx: capacity. Set .hang = True to stop the
    step loop entirely (no heartbeats, no output: a SIGSTOPped worker); .stall = True keeps heartbeating
    but stops stepping (a hung step counter). kv_block > 0: it registers KV blocks of that many tokens and keeps
    an LRU prefix cache of kv_cache blocks (whole prompt blocks, the last prompt token never counted as cached, as
    the real worker does), reporting its counters and block hashes in every hb (docs/kv-cache.md)."""

    def __init__(self, ctx, endpoint, model="stories260K", n_slots=4, n_ctx=256, step_ms=5, hb_ms=100,
                 name=None, vocab_size=512, kv_block=0, kv_cache=0):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(endpoint)
        self.model, self.n_slots, self.n_ctx, self.step_ms, self.hb_ms = model, n_slots, n_ctx, step_ms, hb_ms
        self.name = name or "fake-%d" % id(self)
        self.vocab_size = vocab_size
        self.kv_block, self.kv_cache = kv_block, kv_cache
        self.kv_key = kv_model_key(model)
        self.kv_lru = collections.OrderedDict()   # block hash -> None, least recently used first
        self.kv_hit_tokens = 0
        self.kv_prompt_tokens = 0
        self.priorities = {}      # rid -> priority as assigned
        self.seqs = {}            # rid -> dict(tokens, max, n)
        self.step = 0
        self.hang = False
        self.stall = False
        self.hang_on_assign = False   # set: the first assign makes it hang before producing anything
        self.stop_flag = False
        self.assigned = []        # every rid assigned
        self.cancelled = []       # every rid cancelled
        self.reregisters = 0
        self.registered = _Registered(endpoint)
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def send(self, d):
        self.s.send(pack(d))

    def register(self):
        self.send({"type": "register", "name": self.name, "model": self.model, "device": "fake",
                   "max_batch": self.n_slots, "n_slots": self.n_slots, "n_ctx": self.n_ctx,
                   "kv_tokens": self.n_slots * self.n_ctx, "vocab_size": self.vocab_size,
                   "heartbeat_ms": self.hb_ms,
                   **({"kv_block": self.kv_block, "kv_blocks": self.kv_cache} if self.kv_block else {})})

    def _kv_admit(self, tokens):
        bs = self.kv_block
        hs = kv_block_hashes(self.kv_key, tokens, bs)
        k = 0
        while k < (len(tokens) - 1) // bs and hs[k] in self.kv_lru:
            k += 1
        self.kv_hit_tokens += k * bs
        self.kv_prompt_tokens += len(tokens)
        for h in reversed(hs):   # the head ends most recent: the LRU drops a prefix's tail first
            self.kv_lru[h] = None
            self.kv_lru.move_to_end(h)
        while len(self.kv_lru) > self.kv_cache:
            self.kv_lru.popitem(last=False)

    def run(self):
        self.register()
        last_hb = 0
        while not self.stop_flag:
            if self.hang:
                time.sleep(0.01)
                continue
            while self.s.poll(0):
                m = msgpack.unpackb(self.s.recv(), raw=False)
                t = m.get("type")
                with self.lock:
                    if t == "registered":
                        self.registered.set()
                    elif t == "assign":
                        if self.hang_on_assign:
                            self.hang = True
                        for q in m["seqs"]:
                            self.assigned.append(q["rid"])
                            self.priorities[q["rid"]] = q.get("priority")
                            if self.kv_block:
                                self._kv_admit(q["tokens"])
                            self.seqs[q["rid"]] = {"tokens": q["tokens"], "max": q["max_tokens"], "n": 0}
                    elif t == "cancel":
                        for r in m["rids"]:
                            self.cancelled.append(r)
                            self.seqs.pop(r, None)
                    elif t == "reregister":
                        self.reregisters += 1
                        self.seqs.clear()
                        self.register()
            if self.hang:
                continue
            now = time.time()
            if not self.stall:
                with self.lock:
                    rids, toks, fins = [], [], []
                    for rid, q in list(self.seqs.items()):
                        tok = q["tokens"][q["n"] % len(q["tokens"])]
                        q["n"] += 1
                        fin = 2 if q["n"] >= q["max"] else 0
                        rids.append(rid); toks.append(tok); fins.append(fin)
                        if fin:
                            del self.seqs[rid]
                    self.step += 1
                    if rids:
                        self.send({"type": "out", "step": self.step, "rids": rids, "toks": toks, "fin": fins})
            if now - last_hb >= self.hb_ms / 1000.0:
                last_hb = now
                with self.lock:
                    hb = {"type": "hb", "step": self.step, "free_slots": self.n_slots - len(self.seqs),
                          "running": len(self.seqs)}
                    if self.kv_block:
                        hb.update(kv_used=0, kv_free=0, kv_cached=len(self.kv_lru),
                                  kv_hit_tokens=self.kv_hit_tokens, kv_prompt_tokens=self.kv_prompt_tokens,
                                  kv_hashes=list(self.kv_lru.keys())[-4096:])
                    self.send(hb)
            time.sleep(self.step_ms / 1000.0)

    def close(self):
        self.stop_flag = True
        self.t.join(2)
        self.s.close(0)


class Client:
    def __init__(self, ctx, endpoint, rcvhwm=None, curve=None):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self.s.setsockopt(zmq.RCVHWM, rcvhwm)
        if curve:
            pub, sec, server = curve
            self.s.curve_publickey = pub
            self.s.curve_secretkey = sec
            self.s.curve_serverkey = server
        self.s.connect(endpoint)
        self.endpoint = endpoint
        self.pending = {}   # id -> list of messages

    def send(self, d):
        self.s.send(pack(d))

    def raw(self, b):
        self.s.send(b)

    def generate(self, rid, **kw):
        d = {"type": "generate", "id": rid}
        d.update(kw)
        self.send(d)

    def recv(self, timeout=5.0):
        """the next message, or None after timeout seconds, or sooner once the broker's process has exited and
        nothing more arrives within 0.2 s"""
        end = time.time() + timeout
        while True:
            left = end - time.time()
            if self.s.poll(max(0, int(min(left, 0.1) * 1000))):
                return msgpack.unpackb(self.s.recv(), raw=False)
            if left <= 0:
                return None
            if _broker_gone(self.endpoint):
                if not self.s.poll(int(min(max(left, 0), 0.2) * 1000)):
                    return None
                return msgpack.unpackb(self.s.recv(), raw=False)

    def wait_final(self, rid, timeout=10.0):
        """Messages until the final of rid (others are kept). Returns (tokens_msgs, final or None)."""
        end = time.time() + timeout
        while True:
            msgs = self.pending.setdefault(rid, [])
            if msgs and msgs[-1].get("type") == "final":
                self.pending.pop(rid)
                return msgs[:-1], msgs[-1]
            left = end - time.time()
            if left <= 0:
                return msgs, None
            m = self.recv(left)
            if m is None:
                return msgs, None
            self.pending.setdefault(m.get("id", "?"), []).append(m)

    def status(self, timeout=5.0):
        self.send({"type": "status", "id": "st"})
        end = time.time() + timeout
        while time.time() < end:
            m = self.recv(end - time.time())
            if m is None:
                return None
            if m.get("type") == "status":
                return m
            self.pending.setdefault(m.get("id", "?"), []).append(m)
        return None

    def close(self):
        self.s.close(0)


class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL:", msg, flush=True)
        return cond

    def report(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0
