#!/usr/bin/env python3
"""tests/test_http_deploy.py: zllm-deploy's `http` layout line (deploy/deploy_layout.c) starts zllm-http in front
of the layout's broker: --check shows its command line (the broker's clients endpoint, every model's vocabulary,
the API key file), malformed `http` lines exit 2 with a line-numbered message, and a deployment of a broker, one
CPU worker and one gateway answers a completion over HTTP with the key, refuses it without, and stops cleanly on
SIGTERM."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, STORIES, Checks, watchdog  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    watchdog(90)
    ck = Checks("http_deploy")
    deploy = os.path.join(BIN, "zllm-deploy")
    for b in ("zllm-deploy", "zllm-http", "zllm-broker", "zllm-worker"):
        if not ck.ok(os.path.exists(os.path.join(BIN, b)), "%s built" % b):
            return ck.report()
    tmp = tempfile.mkdtemp(prefix="zllm-http-deploy-")
    key = os.path.join(tmp, "api.key")
    with open(key, "w") as f:
        f.write("k123\n")
    port = free_port()
    base = ["rundir %s/run" % tmp, "bin %s" % BIN,
            "broker clients=ipc://{rundir}/clients workers=ipc://{rundir}/workers",
            "model stories=%s" % STORIES]

    def layout(lines, name):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    # malformed http lines: exit 2, PATH:LINE
    for line, what in [("http", "listen=HOST:PORT is required"), ("http listen=x:1 broker=bogus", "not a tcp://"),
                       ("http listen=x:1 name=a/b", "name"), ("http listen=x:1 api-key-file=/nonexistent", "")]:
        p = subprocess.run([deploy, "--check", layout(base + [line], "bad")], capture_output=True, text=True,
                           timeout=10)
        ck.ok(p.returncode == 2 and ":5:" in p.stderr and what in p.stderr, "%r: rc %d, %r" % (line, p.returncode,
                                                                                             p.stderr.strip()))
    # CURVE keys for the broker: passed as --curve-server-key / --curve-key, both or neither
    p = subprocess.run([deploy, "--check", layout(base + ["http listen=127.0.0.1:1 server-key=%s key=%s" % (key, key)],
                                                  "curve")], capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 0 and "--curve-server-key %s --curve-key %s" % (key, key) in p.stdout,
          "http server-key= key=: %r" % p.stdout[-300:])
    p = subprocess.run([deploy, "--check", layout(base + ["http listen=127.0.0.1:1 server-key=%s" % key], "curve1")],
                       capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 2 and "go together" in p.stderr, "server-key without key: %r" % p.stderr.strip())
    p = subprocess.run([deploy, "--check", layout(["bin %s" % BIN, "http listen=127.0.0.1:1"], "nobroker")],
                       capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 2 and "broker=ENDPOINT" in p.stderr, "http without a broker: %r" % p.stderr.strip())
    good = layout(base + ["replica model=stories devices=cpu args=\"--threads 1 --max-batch 2\"",
                          "http listen=127.0.0.1:%d api-key-file=%s" % (port, key)], "layout")
    p = subprocess.run([deploy, "--check", good], capture_output=True, text=True, timeout=10)
    line = [x for x in p.stdout.splitlines() if x.startswith("http-0 ")]
    ck.ok(p.returncode == 0 and line and "zllm-http --broker ipc://%s/run/clients --listen 127.0.0.1:%d "
          "--api-key-file %s --model stories=%s" % (tmp, port, key, STORIES) in line[0], "--check: %r" % p.stdout)

    sup = subprocess.Popen([deploy, good], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = json.dumps({"model": "stories", "prompt": [1], "max_tokens": 6, "temperature": 0}).encode()
        got = None
        end = time.monotonic() + 30
        while time.monotonic() < end and got is None:
            req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                         headers={"Authorization": "Bearer k123", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    got = json.loads(r.read())
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        ck.ok(got is not None and got["usage"]["completion_tokens"] == 6, "a completion through the deployed "
              "gateway: %r" % got)
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body)
        try:
            urllib.request.urlopen(req, timeout=5)
            ck.ok(False, "no key: refused")
        except urllib.error.HTTPError as e:
            ck.ok(e.code == 401, "no key: 401 (%d)" % e.code)
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            out, _ = sup.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            sup.kill()
            out, _ = sup.communicate()
    ck.ok(sup.returncode == 0 and "exit http-0" in out, "zllm-deploy stops the gateway and exits 0 (rc %s)" %
          sup.returncode)
    if ck.failed:
        print(out[-3000:])
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
