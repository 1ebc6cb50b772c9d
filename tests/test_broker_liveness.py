"""tests/test_broker_liveness.py: kill -9 of the broker with streams in flight (default 600 s deadlines), then a
new broker on the same endpoints. The Python Client, the AsyncClient and the `zllm` command (the C client) end
their requests with broker_unreachable within 5 s, not at their deadline; the fake worker registers again with
the new broker and new requests are served, with another instance id."""
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))
from broker_fake import Broker, Checker, FakeWorker, model_path  # noqa: E402
import zllm  # noqa: E402

build = os.environ.get("ZLLM_BUILD", "build")
binary = os.path.join(build, "bin", "zllm-broker")
ck = Checker()
if not ck.check(os.path.exists(model_path()), "fixture model present: %s" % model_path()):
    sys.exit(ck.report())
ctx = zmq.Context()
PROMPT = "Once upon a time there was a little cat."
tmp = tempfile.mkdtemp(prefix="zllm-live-")
cep, wep = "ipc://%s/c" % tmp, "ipc://%s/w" % tmp

b = Broker(binary, clients=cep, workers=wep)
w = FakeWorker(ctx, wep, n_slots=4, n_ctx=512, step_ms=100)
ck.check(w.registered.wait(5), "worker registered")

# Python Client (blocking, in a thread)
py = {}


def py_stream():
    c = zllm.Client(cep)
    n = 0
    try:
        for d in c.stream(PROMPT, max_tokens=400):
            n += len(d.token_ids)
            py["tokens"] = n
            if d.finish_reason is not None:
                py["final"] = (d.finish_reason, d.result.code, d.result.message, time.monotonic())
    except zllm.ZllmError as e:
        py["final"] = ("raised", e.code, str(e), time.monotonic())
    c.close()


# AsyncClient
ap = {}


def async_stream():
    async def run():
        c = zllm.AsyncClient(cep)
        n = 0
        async for d in c.stream(PROMPT, max_tokens=400):
            n += len(d.token_ids)
            ap["tokens"] = n
            if d.finish_reason is not None:
                ap["final"] = (d.finish_reason, d.result.code, d.result.message, time.monotonic())
        c.close()
    try:
        asyncio.run(run())
    except Exception as e:
        ap["final"] = ("raised", getattr(e, "code", None), repr(e), time.monotonic())


threads = [threading.Thread(target=py_stream, daemon=True), threading.Thread(target=async_stream, daemon=True)]
for t in threads:
    t.start()
cli = subprocess.Popen([os.path.join(build, "bin", "zllm"), "generate", "--broker", cep, "-p", PROMPT, "-n", "400"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
end = time.monotonic() + 10
while time.monotonic() < end and not (py.get("tokens", 0) >= 3 and ap.get("tokens", 0) >= 3):
    time.sleep(0.05)
ck.check(py.get("tokens", 0) >= 3 and ap.get("tokens", 0) >= 3, "both Python streams are running: %r %r" % (py, ap))
time.sleep(0.3)
t_kill = time.monotonic()
b.p.send_signal(signal.SIGKILL)
b.p.wait()
b2 = Broker(binary, clients=cep, workers=wep)
ck.check(b2.alive(), "a new broker on the same endpoints")
try:
    cli_out, cli_err = cli.communicate(timeout=15)
except subprocess.TimeoutExpired:
    cli.kill()
    cli_out, cli_err = cli.communicate()
t_cli = time.monotonic() - t_kill
for t in threads:
    t.join(15)
ck.check(cli.returncode == 1 and b"broker_unreachable" in cli_err and t_cli < 5,
         "zllm CLI fails with broker_unreachable after %.2f s: rc=%r %r" % (t_cli, cli.returncode, cli_err[-300:]))
for label, r in (("Python Client", py), ("AsyncClient", ap)):
    f = r.get("final")
    dt = f[3] - t_kill if f else None
    ck.check(f is not None and f[0] in ("error", "raised") and f[1] == "broker_unreachable" and dt < 5,
             "%s: broker_unreachable (raised, the default, or a final error) %s s after the kill: %r" % (label, dt, f))

# the worker comes back to the new broker, which serves new requests under another instance id
end = time.monotonic() + 10
r = None
c = zllm.Client(cep)
while time.monotonic() < end:
    r = c.generate(PROMPT, max_tokens=3, deadline_ms=2000)
    if r.ok:
        break
ck.check(r is not None and r.ok, "the new broker serves: %r" % r)
ck.check(c._inst is not None, "the reply carried an instance id")
c.close()
w.close()
rc = b2.stop()
ck.check(rc == 0, "broker exits 0: %r" % rc)
sys.exit(ck.report())
