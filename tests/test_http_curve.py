#!/usr/bin/env python3
"""tests/test_http_curve.py: zllm-http in front of a broker whose client endpoint requires CURVE
(`--curve-secret`, `--curve-allow`; keys from `zllm-broker --keygen`): with `--curve-server-key BROKER.pub
--curve-key GW.key` (GW.pub in the allow-list) it serves completions, streamed and not; a gateway whose key the
broker refuses, one with a wrong broker key, and one without CURVE answer 503 at once (not a hang) with a message
saying what is wrong, on /v1/completions and /health; a key file that is missing or malformed stops it at
startup (exit 2)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, FakeWorker  # noqa: E402
from e2e_cluster import BIN, Checks, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402


def main():
    watchdog(90)
    ck = Checks("http_curve")
    if not zmq.has("curve"):
        ck.ok(False, "libzmq without CURVE")
        return ck.report()
    tmp = tempfile.mkdtemp(prefix="zllm-http-curve-")
    allow = os.path.join(tmp, "allow")
    os.makedirs(allow)
    for k in ("server", "gw", "other"):
        r = subprocess.run([os.path.join(BIN, "zllm-broker"), "--keygen", os.path.join(tmp, k)], capture_output=True)
        if not ck.ok(r.returncode == 0, "keygen %s: %s" % (k, r.stderr.decode())):
            return ck.report()
    shutil.copy(os.path.join(tmp, "gw.pub"), os.path.join(allow, "gw.pub"))
    key = lambda k: os.path.join(tmp, k)  # noqa: E731
    ctx = zmq.Context()
    b = Broker(os.path.join(BIN, "zllm-broker"), clients="tcp://127.0.0.1:0",
               extra=["--curve-secret", key("server.key"), "--curve-allow", allow])
    w = FakeWorker(ctx, b.workers)
    gws = []
    try:
        ck.ok(w.registered.wait(5), "fake worker registered")
        good = Gateway(b.clients, "--curve-server-key", key("server.pub"), "--curve-key", key("gw.key"))
        gws.append(good)
        ck.ok(good.wait_up(), "a gateway with an allowed key hears the CURVE broker")
        st, _, r = good.json("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5})
        ck.ok(st == 200 and r["usage"]["completion_tokens"] == 5 and r["choices"][0]["text"],
              "completion through CURVE: %s %r" % (st, r))
        st, h, data = good.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4,
                                                                "stream": True})
        ck.ok(st == 200 and data.rstrip().endswith(b"data: [DONE]") and data.count(b"data: {") >= 4,
              "streamed completion through CURVE: %s %r" % (st, data[-200:]))
        st, _, hb = good.json("GET", "/health")
        ck.ok(st == 200, "/health through CURVE: %s %r" % (st, hb))

        cases = [("a key not in the broker's allow-list", ["--curve-server-key", key("server.pub"), "--curve-key",
                                                           key("other.key")], "--curve-allow"),
                 ("a wrong broker public key", ["--curve-server-key", key("other.pub"), "--curve-key",
                                                key("gw.key")], "--curve-server-key"),
                 ("no CURVE keys", [], "requires CURVE")]
        for what, args, needle in cases:
            t0 = time.monotonic()
            g = Gateway(b.clients, *args)
            gws.append(g)
            t_start = time.monotonic() - t0
            time.sleep(0.3)
            t0 = time.monotonic()
            st, _, body = g.json("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 4}, timeout=10)
            dt = time.monotonic() - t0
            error_ok(ck, what, st, body, 503)
            msg = body["error"]["message"] if isinstance(body, dict) and "error" in body else ""
            print("%s: %d %s" % (what, st, msg))
            ck.ok(needle in msg and dt < 1.0, "%s: 503 in %.2f s (started in %.1f s) saying %r: %r" % (
                what, dt, t_start, needle, msg))
            st, _, hb = g.json("GET", "/health")
            ck.ok(st == 503 and needle in (hb or {}).get("reason", ""), "%s: /health 503 with the reason: %r" % (
                what, hb))
        st, _, r = good.json("POST", "/v1/completions", {"prompt": [1], "max_tokens": 3})
        ck.ok(st == 200, "the allowed gateway still served: %s" % st)
        # key files are read at startup
        for args, what in ((["--curve-server-key", key("server.pub")], "one CURVE option alone"),
                           (["--curve-server-key", key("nope.pub"), "--curve-key", key("gw.key")], "a missing file"),
                           (["--curve-server-key", key("server.pub"), "--curve-key", os.path.join(allow)],
                            "a directory as the key")):
            p = subprocess.run([os.path.join(BIN, "zllm-http"), "--broker", b.clients, "--listen", "127.0.0.1:0"] +
                               args, capture_output=True, text=True, timeout=10)
            ck.ok(p.returncode == 2 and p.stderr.strip(), "%s: exit 2: %r" % (what, p.stderr.strip()))
    finally:
        for g in gws:
            g.close()
        w.close()
        b.stop()
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
