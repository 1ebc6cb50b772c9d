"""tests/http_gateway.py: helpers for the zllm-http tests (tests/test_http_*.py): one zllm-http process on
127.0.0.1 (any free port) with plain-HTTP request helpers, and the OpenAI error-shape check. Not a test itself."""
import http.client
import json
import os
import subprocess
import tempfile
import time

from e2e_cluster import BIN


class Gateway:
    """one zllm-http process on 127.0.0.1, any free port"""

    def __init__(self, broker_ep, *extra):
        self.log = tempfile.NamedTemporaryFile(prefix="zllm-http-", suffix=".log", delete=False)
        self.p = subprocess.Popen([os.path.join(BIN, "zllm-http"), "--broker", broker_ep, "--listen",
                                   "127.0.0.1:0"] + list(extra), stdout=subprocess.PIPE, stderr=self.log,
                                  text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening http://"):
            raise RuntimeError("zllm-http did not start: %r" % line)
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.base = "http://127.0.0.1:%d" % self.port

    def wait_up(self, timeout=10.0):
        """waits until the gateway has heard the broker (zllm_broker_up 1)"""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st, _, data = self.request("GET", "/metrics")
            if b"\nzllm_broker_up 1\n" in data:
                return True
            time.sleep(0.05)
        return False

    def request(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def json(self, method, path, body=None, headers=None, timeout=30):
        st, h, data = self.request(method, path, body, headers, timeout)
        try:
            return st, h, json.loads(data)
        except ValueError:
            return st, h, None

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        os.unlink(self.log.name)


def error_ok(ck, what, st, body, status, param=None):
    """the OpenAI error shape with the expected status (and the field named)"""
    e = body.get("error") if isinstance(body, dict) else None
    ok = ck.ok(st == status and isinstance(e, dict) and isinstance(e.get("message"), str) and e.get("message") and
               "type" in e and "code" in e and "param" in e, "%s: status %s (want %d), body %r" % (what, st, status,
                                                                                                  body))
    if ok and param is not None:
        ck.ok(e.get("param") == param, "%s: names %r: %r" % (what, param, e))
