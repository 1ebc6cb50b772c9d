"""tests/test_broker_curve.py: CURVE on the broker's TCP client endpoint with a ZAP allow-list.
Keys come from `zllm-broker --keygen`; a client whose public key is in the allow-list directory is served, one
with an unknown key and one without CURVE get nothing (the handshake is refused), and the refusals are counted."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, Checker, Client, FakeWorker, asan_broker, model_path  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
ck = Checker()
binary = asan_broker(build) or os.path.join(build, "bin", "zllm-broker")
tmp = tempfile.mkdtemp(prefix="zllm-curve-")
allow = os.path.join(tmp, "allow")
os.makedirs(allow)


def keygen(prefix):
    r = subprocess.run([binary, "--keygen", prefix], capture_output=True)
    ck.check(r.returncode == 0, "keygen %s: %s" % (prefix, r.stderr.decode()))
    pub = open(prefix + ".pub").read().strip()
    sec = open(prefix + ".key").read().strip()
    ck.check(len(pub) == 40 and len(sec) == 40, "Z85 keys of 40 characters")
    ck.check(oct(os.stat(prefix + ".key").st_mode & 0o777) == "0o600", "secret key file is private")
    return pub.encode(), sec.encode()


if not zmq.has("curve"):
    print("libzmq without CURVE: skipped")
    print("0 passed, 0 failed")
    sys.exit(0)

spub, ssec = keygen(os.path.join(tmp, "server"))
cpub, csec = keygen(os.path.join(tmp, "client"))
opub, osec = keygen(os.path.join(tmp, "other"))
shutil.copy(os.path.join(tmp, "client.pub"), os.path.join(allow, "client.pub"))

ctx = zmq.Context()
b = Broker(binary, clients="tcp://127.0.0.1:0",
           extra=["--curve-secret", os.path.join(tmp, "server.key"), "--curve-allow", allow])
ck.check(b.clients.startswith("tcp://127.0.0.1:"), "bound a loopback tcp port: %s" % b.clients)
w = FakeWorker(ctx, b.workers)
ck.check(w.registered.wait(5), "worker registered")

good = Client(ctx, b.clients, curve=(cpub, csec, spub))
good.generate("g", prompt="Once upon a time", max_tokens=5)
toks, fin = good.wait_final("g", 5)
ck.check(fin is not None and fin["finish"] == "length", "allowed key is served: %r" % (fin,))

bad = Client(ctx, b.clients, curve=(opub, osec, spub))
bad.generate("b", prompt="Once upon a time", max_tokens=5)
ck.check(bad.recv(1.5) is None, "unknown key gets nothing")
bad.close()

plain = Client(ctx, b.clients)
plain.generate("p", prompt="Once upon a time", max_tokens=5)
ck.check(plain.recv(1.0) is None, "a client without CURVE gets nothing")
plain.close()

st = good.status()
ck.check(st is not None and st["counters"]["zap_refused"] >= 1, "refusals counted: %r" % ((st and st["counters"]),))
ck.check(st is not None and st["counters"]["accepted"] == 1, "only the allowed client's request was accepted")

# an empty allow-list fails closed at startup
empty = os.path.join(tmp, "empty")
os.makedirs(empty)
r = subprocess.run([binary, "--clients", "tcp://127.0.0.1:0", "--workers", "ipc://%s/w" % tmp, "--model",
                    model_path(), "--curve-secret", os.path.join(tmp, "server.key"), "--curve-allow", empty],
                   capture_output=True, timeout=10)
ck.check(r.returncode != 0 and b"no *.pub" in r.stderr, "an empty allow-list refuses to start: %r" % r.stderr)

good.close()
w.close()
ck.check(b.stop() == 0, "broker exits 0")
log = b.logtext()
ck.check("AddressSanitizer" not in log and "runtime error" not in log, "no sanitizer report")
ctx.term()
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(ck.report())
