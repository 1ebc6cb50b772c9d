"""tests/test_broker_curve_workers.py: CURVE on the broker's worker socket (zllm-broker --curve-workers, zllm-worker
--curve-server-key/--curve-key) over tcp://127.0.0.1 with real processes, and the same through zllm-deploy.

A worker whose public key is in the allow-list registers and serves golden ids; a worker with an unknown key and
one without CURVE are never admitted (the broker lists only the good worker, counts the refusals, keeps serving,
and neither process crashes). --curve-workers without keys refuses to start; a worker with half the key options
or a malformed key file exits 2. zllm-deploy with `curve-workers=yes` and a `connect ... server-key= key=` line
starts a CURVE broker and worker that serve, and stops with exit 0. With --curve-allow-workers DIR the worker
socket has its own allow-list: a client key cannot register a worker, a worker key cannot act as a client."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, Client  # noqa: E402
from e2e_cluster import BIN, STORIES, Checks, golden_ids, golden_req, watchdog  # noqa: E402

ck = Checks("curve-workers")
watchdog(90)
if not zmq.has("curve"):
    print("libzmq without CURVE: skipped")
    print("0 passed, 0 failed")
    sys.exit(0)

BROKER = os.path.join(BIN, "zllm-broker")
WORKER = os.path.join(BIN, "zllm-worker")
DEPLOY = os.path.join(BIN, "zllm-deploy")
tmp = tempfile.mkdtemp(prefix="zllm-curvew-", dir="/tmp")
allow = os.path.join(tmp, "allow")
os.makedirs(allow)
procs = []
gold = golden_ids()


def keygen(name):
    prefix = os.path.join(tmp, name)
    r = subprocess.run([BROKER, "--keygen", prefix], capture_output=True, timeout=10)
    ck.ok(r.returncode == 0, "keygen %s: %r" % (name, r.stderr))
    with open(prefix + ".pub") as f:
        pub = f.read().strip().encode()
    with open(prefix + ".key") as f:
        sec = f.read().strip().encode()
    return prefix, pub, sec


spre, spub, ssec = keygen("server")
cpre, cpub, csec = keygen("client")
gpre, gpub, gsec = keygen("wgood")
bpre, bpub, bsec = keygen("wbad")
shutil.copy(cpre + ".pub", allow)
shutil.copy(gpre + ".pub", allow)


def worker(name, endpoint, *keys):
    log = open(os.path.join(tmp, name + ".log"), "wb")
    p = subprocess.Popen([WORKER, "--broker", endpoint, "-m", STORIES, "--model-name", "stories", "--name", name,
                          "--max-batch", "2", "--threads", "1", "--heartbeat-ms", "200"] + list(keys),
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    procs.append(p)
    return p


def log_of(name):
    try:
        with open(os.path.join(tmp, name + ".log"), "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def wait_workers(c, names, timeout, watch=()):
    """until the broker lists every name alive; gives up at once, printing the process's log tail, when a process
    of watch ((name, Popen, function returning its log)) has exited"""
    end = time.monotonic() + timeout
    st = None
    while time.monotonic() < end:
        for n, p, log in watch:
            if p.poll() is not None:
                print("wait_workers: %s exited (rc %s):\n%s" % (n, p.returncode, log()[-2000:]), flush=True)
                return None
        st = c.status(1.0)
        if st and all(any(w["name"] == n and w.get("alive") for w in st.get("workers", [])) for n in names):
            return st
        time.sleep(0.1)
    return st


def serve(c, rid, k=5, mt=12):
    c.generate(rid, **golden_req(gold, k, mt))
    toks, fin = c.wait_final(rid, 15)
    ids = []
    for m in toks:
        ids += list(m.get("ids") or [])
    if fin is not None and fin.get("ids") is not None:
        ids = list(fin["ids"])
    return fin, ids


# ---- a CURVE broker, workers over tcp://127.0.0.1
ctx = zmq.Context()
b = Broker(BROKER, models=["stories=" + STORIES], clients="tcp://127.0.0.1:0", workers="tcp://127.0.0.1:0",
           extra=["--curve-secret", spre + ".key", "--curve-allow", allow, "--curve-workers", "--heartbeat-ms", "200"])
ck.ok(b.alive() and b.workers.startswith("tcp://127.0.0.1:"), "broker bound a loopback worker port: %s" % b.workers)
good = worker("good", b.workers, "--curve-server-key", spre + ".pub", "--curve-key", gpre + ".key")
bad = worker("bad", b.workers, "--curve-server-key", spre + ".pub", "--curve-key", bpre + ".key")
plain = worker("plain", b.workers)
c = Client(ctx, b.clients, curve=(cpub, csec, spub))
st = wait_workers(c, ["good"], 15, [("broker", b.p, b.logtext), ("good", good, lambda: log_of("good"))])
ck.ok(st is not None and any(w["name"] == "good" and w.get("alive") for w in st.get("workers", [])),
      "the worker with an allowed key registered: %r" % (st and st.get("workers")))
fin, ids = serve(c, "g1")
ck.ok(fin is not None and fin.get("finish") == "length" and ids == gold[5:17],
      "it serves golden ids over CURVE: %r %r" % (fin, ids))
time.sleep(1.5)   # the bad workers have been retrying their handshakes all along
st = c.status(2.0)
names = sorted(w["name"] for w in (st or {}).get("workers", []))
ck.ok(names == ["good"], "only the good worker is admitted: %r" % names)
ref = (st or {}).get("counters", {}).get("zap_refused", 0)
ck.ok(ref >= 1, "the unknown key's handshake is refused and counted: zap_refused=%d" % ref)
ck.ok(bad.poll() is None and plain.poll() is None, "the refused workers did not crash (they keep retrying)")
ck.ok(b.alive(), "the broker is alive")
fin, ids = serve(c, "g2", 9, 10)
ck.ok(fin is not None and fin.get("finish") == "length" and ids == gold[9:19], "the broker keeps serving: %r" % (fin,))
with open(os.path.join(tmp, "bad.log"), "rb") as f:
    ck.ok(b"registered (" not in f.read(), "the unknown-key worker never got `registered`")
c.close()
for p in (good, bad, plain):
    p.send_signal(signal.SIGTERM)
for p in (good, bad, plain):
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
ck.ok(good.returncode == 0 and bad.returncode == 0 and plain.returncode == 0,
      "workers exit 0 on SIGTERM: %r" % [good.returncode, bad.returncode, plain.returncode])
ck.ok(b.stop() == 0, "broker exits 0")

# ---- a separate allow-list for workers (--curve-allow-workers): a client key cannot register a worker, and a
# worker key cannot be used as a client
wallow = os.path.join(tmp, "wallow")
os.makedirs(wallow)
shutil.copy(gpre + ".pub", wallow)
os.unlink(os.path.join(allow, "wgood.pub"))
b = Broker(BROKER, models=["stories=" + STORIES], clients="tcp://127.0.0.1:0", workers="tcp://127.0.0.1:0",
           extra=["--curve-secret", spre + ".key", "--curve-allow", allow, "--curve-workers",
                  "--curve-allow-workers", wallow, "--heartbeat-ms", "200"])
good = worker("good2", b.workers, "--curve-server-key", spre + ".pub", "--curve-key", gpre + ".key")
ckey = worker("clientkey", b.workers, "--curve-server-key", spre + ".pub", "--curve-key", cpre + ".key")
c = Client(ctx, b.clients, curve=(cpub, csec, spub))
st = wait_workers(c, ["good2"], 15, [("broker", b.p, b.logtext), ("good2", good, lambda: log_of("good2"))])
ck.ok(st is not None and any(w["name"] == "good2" for w in st.get("workers", [])),
      "separate lists: the worker key registers")
fin, ids = serve(c, "s1")
ck.ok(fin is not None and ids == gold[5:17], "separate lists: served: %r" % (fin,))
wc = Client(ctx, b.clients, curve=(gpub, gsec, spub))
wc.generate("w1", **golden_req(gold, 5, 4))
ck.ok(wc.recv(1.0) is None, "separate lists: the worker key is refused on the client socket")
wc.close()
st = c.status(2.0)
names = sorted(w["name"] for w in (st or {}).get("workers", []))
ck.ok(names == ["good2"], "separate lists: the client key cannot register a worker: %r" % names)
ck.ok(ckey.poll() is None and b.alive(), "separate lists: no crash")
c.close()
for p in (good, ckey):
    p.kill()
    p.wait()
ck.ok(b.stop() == 0, "broker exits 0")

# ---- failing closed on configuration
r = subprocess.run([BROKER, "--clients", "ipc://%s/c" % tmp, "--workers", "tcp://127.0.0.1:0", "--model", STORIES,
                    "--curve-workers"], capture_output=True, timeout=10)
ck.ok(r.returncode != 0 and b"--curve-workers needs --curve-secret" in r.stderr,
      "--curve-workers without keys refuses to start: %r" % r.stderr)
r = subprocess.run([WORKER, "--broker", "tcp://127.0.0.1:1", "-m", STORIES, "--curve-key", gpre + ".key"],
                   capture_output=True, timeout=10)
ck.ok(r.returncode == 2 and b"go together" in r.stderr, "a worker with only --curve-key exits 2: %r" % r.stderr)
with open(os.path.join(tmp, "junk.key"), "w") as f:
    f.write("not a key\n")
r = subprocess.run([WORKER, "--broker", "tcp://127.0.0.1:1", "-m", STORIES, "--curve-server-key", spre + ".pub",
                    "--curve-key", os.path.join(tmp, "junk.key")], capture_output=True, timeout=10)
ck.ok(r.returncode == 2 and b"Z85" in r.stderr, "a malformed key file: exit 2: %r" % r.stderr)


# ---- through zllm-deploy: a CURVE layout
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


cport, wport = free_port(), free_port()
layout = os.path.join(tmp, "curve.layout")
rundir = os.path.join(tmp, "run")
with open(layout, "w") as f:
    f.write("""# CURVE on both broker sockets, workers with their own allow-list; the local worker authenticates with wgood.key
broker clients=tcp://127.0.0.1:%d workers=tcp://0.0.0.0:%d curve-secret=server.key curve-allow=allow curve-workers=yes curve-allow-workers=wallow args="--heartbeat-ms 200"
connect tcp://127.0.0.1:%d server-key=server.pub key=wgood.key
model stories=%s
replica model=stories name=cw args="--max-batch 2 --threads 1 --heartbeat-ms 200"
stop timeout=5
""" % (cport, wport, wport, STORIES))
r = subprocess.run([DEPLOY, "--check", "--run-dir", rundir, layout], capture_output=True, timeout=10)
out = r.stdout.decode()
ck.ok(r.returncode == 0 and "--curve-workers --curve-allow-workers %s " % wallow in out and ("--curve-key %s.key" % gpre) in out and
      ("--curve-server-key %s.pub" % spre) in out, "--check: broker and worker get their CURVE options: %r %r" % (
          out, r.stderr))
sup_log = os.path.join(tmp, "deploy.out")
sup = subprocess.Popen([DEPLOY, "--run-dir", rundir, layout], stdout=open(sup_log, "w"), stderr=subprocess.STDOUT)
procs.append(sup)
c = Client(ctx, "tcp://127.0.0.1:%d" % cport, curve=(cpub, csec, spub))
st = wait_workers(c, ["cw-0"], 15, [("zllm-deploy", sup, lambda: open(sup_log, errors="replace").read())])
ck.ok(st is not None and any(w["name"] == "cw-0" and w.get("alive") for w in st.get("workers", [])),
      "zllm-deploy: the CURVE worker registered over tcp")
fin, ids = serve(c, "d1")
ck.ok(fin is not None and ids == gold[5:17], "zllm-deploy: served over CURVE: %r" % (fin,))
c.close()
sup.send_signal(signal.SIGTERM)
try:
    rc = sup.wait(15)
except subprocess.TimeoutExpired:
    rc = None
ck.ok(rc == 0, "zllm-deploy exits 0 on SIGTERM: %r" % rc)
with open(sup_log) as f:
    text = f.read()
pids = [int(p) for p in re.findall(r" start \S+ pid (\d+)", text)]
left = [p for p in pids if os.path.exists("/proc/%d" % p)]
ck.ok(len(pids) == 2 and not left, "its broker and worker are gone: %r alive of %r" % (left, pids))
if ck.failed:
    print(text)
    for n in ("good", "bad", "plain"):
        with open(os.path.join(tmp, n + ".log"), errors="replace") as f:
            print("----", n, f.read()[-1500:])

for p in procs:
    if p.poll() is None:
        p.kill()
        p.wait()
ctx.term()
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(ck.report())
