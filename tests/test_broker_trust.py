"""tests/test_broker_trust.py: what a broker accepts from workers. A tcp:// worker endpoint without CURVE is
refused at start unless --insecure-tcp-workers names the risk; the ipc:// worker socket is 0600 in a directory
created 0700; a worker that sends a token id outside the vocabulary, a rid twice in one `out`, a rid not
assigned to it, or prompt logprobs its request did not ask for (or naming an id outside the vocabulary) is forgotten and nothing of that message reaches a client (its request is served by an honest
worker); 300 registrations that never serve do not lock out a worker that does; status says why a model has no
capacity (no_worker), and a request beyond every worker's context gets no_capacity, not prompt_too_long."""
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, Checker, Client, FakeWorker, model_path, pack  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
binary = os.path.join(build, "bin", "zllm-broker")
ck = Checker()
if not ck.check(os.path.exists(model_path()), "fixture model present: %s" % model_path()):
    sys.exit(ck.report())
ctx = zmq.Context()
PROMPT = "Once upon a time there was a little cat."
BAD_TOKEN = 2147483647

# ---- 1: fail closed on tcp:// without CURVE
tmp = tempfile.mkdtemp(prefix="zllm-trust-")
p = subprocess.Popen([binary, "--clients", "ipc://%s/c" % tmp, "--workers", "tcp://127.0.0.1:0", "--model",
                      model_path()], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
try:
    err = p.communicate(timeout=15)[1]
except subprocess.TimeoutExpired:
    p.kill()
    err = p.communicate()[1]
ck.check(p.returncode not in (0, -9) and b"--insecure-tcp-workers" in err and b"CURVE" in err,
         "tcp:// workers without CURVE: refused at start: rc=%d %r" % (p.returncode, err[-300:]))
b = Broker(binary, clients="ipc://%s/c2" % tmp, workers="tcp://127.0.0.1:0", extra=["--insecure-tcp-workers"])
ck.check(b.alive() and b.workers.startswith("tcp://127.0.0.1:"), "--insecure-tcp-workers starts: %s" % b.workers)
w = FakeWorker(ctx, b.workers, n_slots=2, n_ctx=256)
ck.check(w.registered.wait(5), "a worker registers over the insecure tcp endpoint")
w.close()
rc = b.stop()
ck.check(rc == 0, "broker exits 0: %r %s" % (rc, b.logtext()[-1500:]))

# ---- 2: ipc:// worker socket: directory created 0700, socket file 0600
wdir = os.path.join(tmp, "private")
b = Broker(binary, clients="ipc://%s/c3" % tmp, workers="ipc://%s/w" % wdir)
c = Client(ctx, b.clients)
ck.check(c.status() is not None, "the ipc broker answers status")   # and runs its loop (signal handlers set)
c.close()
st_dir = os.stat(wdir)
st_sock = os.stat(os.path.join(wdir, "w"))
ck.check(stat.S_IMODE(st_dir.st_mode) == 0o700, "worker socket directory created 0700: %o" % stat.S_IMODE(st_dir.st_mode))
ck.check(stat.S_ISSOCK(st_sock.st_mode) and stat.S_IMODE(st_sock.st_mode) & 0o077 == 0,
         "worker socket file not open to others: %o" % stat.S_IMODE(st_sock.st_mode))
rc = b.stop()
ck.check(rc == 0, "broker exits 0: %r %s" % (rc, b.logtext()[-1500:]))
odir = os.path.join(tmp, "open")
os.mkdir(odir)
os.chmod(odir, 0o777)
r = subprocess.run([binary, "--clients", "ipc://%s/c4" % tmp, "--workers", "ipc://%s/w" % odir, "--model",
                    model_path()], capture_output=True, timeout=20)
ck.check(r.returncode == 1 and b"writable by other users" in r.stderr,
         "a worker socket directory others may write to is refused: %r" % r.stderr[-200:])


# ---- 3: lying workers
class Liar:
    """A worker socket driven by hand: registers, answers its first assign with `lie(rid)` (an out map)."""

    def __init__(self, endpoint, name, lie):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(endpoint)
        self.lie = lie
        self.got_assign = threading.Event()
        self.reregistered = threading.Event()
        self.stop = False
        self.s.send(pack({"type": "register", "name": name, "model": "stories260K", "device": "liar",
                          "max_batch": 4, "n_slots": 4, "n_ctx": 256, "kv_tokens": 1024, "vocab_size": 512,
                          "heartbeat_ms": 100}))
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        step = 0
        while not self.stop:
            if self.s.poll(50):
                m = msgpack.unpackb(self.s.recv(), raw=False)
                if m.get("type") == "assign" and not self.got_assign.is_set():
                    self.got_assign.set()
                    step += 1
                    out = self.lie(m["seqs"][0]["rid"])
                    out.update({"type": "out", "step": step})
                    self.s.send(pack(out))
                elif m.get("type") == "reregister":
                    self.reregistered.set()
            step += 1
            self.s.send(pack({"type": "hb", "step": step, "free_slots": 4, "running": 0}))

    def close(self):
        self.stop = True
        self.t.join(2)
        self.s.close(0)


def lying_case(label, lie, honest_rid_of=None):
    b = Broker(binary)
    c = Client(ctx, b.clients)
    liar = Liar(b.workers, "liar", lie)
    time.sleep(0.3)
    c.generate("r1", prompt=PROMPT, max_tokens=8)
    ck.check(liar.got_assign.wait(5), "%s: the liar got the request" % label)
    time.sleep(0.3)
    honest = FakeWorker(ctx, b.workers, n_slots=2, n_ctx=256)
    ck.check(honest.registered.wait(5), "%s: an honest worker registers" % label)
    toks, fin = c.wait_final("r1", 10)
    ids = [i for t in toks for i in t.get("ids", [])]
    ck.check(fin is not None and fin.get("finish") == "length" and BAD_TOKEN not in ids and len(ids) == 8 and
             all(0 <= i < 512 for i in ids),
             "%s: the request completes on the honest worker, no forged id reaches the client: ids=%r fin=%r" %
             (label, ids, fin))
    ck.check(liar.reregistered.wait(3), "%s: the liar was forgotten (its next message got reregister)" % label)
    st = c.status()
    cnt = (st or {}).get("counters", {})
    ck.check(cnt.get("lying_workers") == 1 and cnt.get("requeued", 0) >= 1,
             "%s: counted (lying_workers 1, requeued): %r" % (label, cnt))
    ck.check("forgotten" in b.logtext(), "%s: logged" % label)
    liar.close()
    honest.close()
    c.close()
    rc = b.stop()
    ck.check(rc == 0, "%s: broker exits 0: %r %s" % (label, rc, b.logtext()[-1500:]))


lying_case("out-of-vocabulary id", lambda rid: {"rids": [rid], "toks": [BAD_TOKEN], "fin": [0]})
lying_case("negative id", lambda rid: {"rids": [rid], "toks": [-7], "fin": [0]})
lying_case("rid repeated", lambda rid: {"rids": [rid] * 3000, "toks": [5] * 3000, "fin": [0] * 3000})
lying_case("rid never assigned", lambda rid: {"rids": [rid, rid + 1000], "toks": [5, 6], "fin": [0, 0]})
lying_case("prompt logprobs not asked for",
           lambda rid: {"rids": [rid], "toks": [-1], "fin": [0], "plp": [[1, [[-0.5, [], []]]]]})
lying_case("prompt logprob id outside the vocabulary",
           lambda rid: {"rids": [rid], "toks": [-1], "fin": [0], "plp": [[1, [[-0.5, [BAD_TOKEN], [-1.0]]]]]})

# a rid that belongs to another worker's request
b = Broker(binary)
c = Client(ctx, b.clients)
victim = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=256, step_ms=200)
ck.check(victim.registered.wait(5), "victim worker registered")
c.generate("v1", prompt=PROMPT, max_tokens=6)
time.sleep(0.5)
with victim.lock:
    vrid = victim.assigned[0] if victim.assigned else 1
liar = Liar(b.workers, "thief", lambda rid: {})
time.sleep(0.3)
liar.s.send(pack({"type": "out", "step": 99, "rids": [vrid], "toks": [BAD_TOKEN], "fin": [1]}))
toks, fin = c.wait_final("v1", 10)
ids = [i for t in toks for i in t.get("ids", [])]
ck.check(fin is not None and fin.get("finish") == "length" and BAD_TOKEN not in ids and len(ids) == 6,
         "another worker's rid: ignored, the victim's request completes untouched: %r %r" % (ids, fin))
ck.check(liar.reregistered.wait(3), "the thief was forgotten")
liar.close()
victim.close()
c.close()
rc = b.stop()
ck.check(rc == 0, "broker exits 0: %r %s" % (rc, b.logtext()[-1500:]))

# ---- 4: 300 registrations that never serve (n_ctx 2) do not lock out a real worker
b = Broker(binary, extra=["--dead-ms", "60000", "--hang-ms", "60000"])
c = Client(ctx, b.clients)
st = c.status()
cap = {m["model"]: m for m in (st or {}).get("capacity", [])}
ck.check(cap.get("stories260K", {}).get("reason") == "no_worker", "no worker: status says no_worker: %r" % (cap,))
r = subprocess.run([os.path.join(build, "bin", "zllm"), "status", "--broker", b.clients], capture_output=True,
                   timeout=20)
ck.check(r.returncode == 1 and b"model stories260K: 0 workers" in r.stdout and b"no_worker" in r.stdout,
         "zllm status says why: %r" % r.stdout[-400:])
fakes = []
for i in range(300):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(b.workers)
    s.send(pack({"type": "register", "name": "fake-%d" % i, "model": "stories260K", "device": "fake",
                 "max_batch": 1, "n_slots": 1000, "n_ctx": 2, "kv_tokens": 2000, "vocab_size": 512,
                 "heartbeat_ms": 100}))
    fakes.append(s)
time.sleep(1.0)
c.generate("f1", prompt=PROMPT, max_tokens=8)
toks, fin = c.wait_final("f1", 5)
ck.check(fin is not None and fin.get("code") == "no_capacity" and "context" in fin.get("message", ""),
         "only fakes of context 2: no_capacity, not prompt_too_long: %r" % (fin,))
real = FakeWorker(ctx, b.workers, n_slots=2, n_ctx=256, name="real")
ck.check(real.registered.wait(5), "the real worker registers after 300 fakes")
c.generate("f2", prompt=PROMPT, max_tokens=8)
toks, fin = c.wait_final("f2", 10)
ck.check(fin is not None and fin.get("finish") == "length", "the real worker serves: %r" % (fin,))
# more fakes after it served: it stays
for i, s in enumerate(fakes[:100]):
    s.send(pack({"type": "register", "name": "again-%d" % i, "model": "stories260K", "device": "fake",
                 "max_batch": 1, "n_slots": 1, "n_ctx": 2, "kv_tokens": 2, "vocab_size": 512, "heartbeat_ms": 100}))
time.sleep(1.0)
c.generate("f3", prompt=PROMPT, max_tokens=8)
toks, fin = c.wait_final("f3", 10)
ck.check(fin is not None and fin.get("finish") == "length", "a worker that served survives more fakes: %r" % (fin,))
st = c.status()
cnt = (st or {}).get("counters", {})
names = [x["name"] for x in (st or {}).get("workers", [])]
ck.check("real" in names and len(names) <= 64 and cnt.get("evicted_workers", 0) >= 300 - 64,
         "status: real listed, table capped at 64, evictions counted: %d workers, %r" % (len(names), cnt.get("evicted_workers")))
for s in fakes:
    s.close(0)
real.close()
c.close()
rc = b.stop()
ck.check(rc == 0, "broker exits 0: %r %s" % (rc, b.logtext()[-1500:]))
sys.exit(ck.report())
