#!/usr/bin/env python3
"""tests/test_http_hostile.py: zllm-http built with AddressSanitizer and UBSan (build/tests/zllm-http-asan) in
front of a real broker and CPU worker, facing hostile HTTP: oversized headers and bodies (with and without
Content-Length), slow clients that never finish a request (slowloris), invalid UTF-8, JSON nested 10^5 deep,
max_tokens of 2^63, garbage that is not HTTP, 10,000 concurrent connections. Each gets a clear 4xx or a closed
connection; meanwhile every other client is served (a completion answers within a second), the gateway's memory
stays bounded, and ASan/UBSan report nothing."""
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BUILD, ROOT, Checks, Cluster, watchdog  # noqa: E402

ASAN_BIN = os.path.join(ROOT, BUILD, "tests", "zllm-http-asan") if not os.path.isabs(BUILD) else \
    os.path.join(BUILD, "tests", "zllm-http-asan")


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1


def raw(port, data, timeout=5.0, shut=False):
    """sends data, reads until the server closes or timeout; returns (status or None, bytes)"""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = b""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out and not shut:
                head, _, rest = out.partition(b"\r\n\r\n")
                cl = [x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
        st = None
        if out.startswith(b"HTTP/1."):
            try:
                st = int(out.split(b" ", 2)[1])
            except ValueError:
                pass
        return st, out
    finally:
        s.close()


def main():
    watchdog(240)
    ck = Checks("http_hostile")
    if not ck.ok(os.path.exists(ASAN_BIN), "%s exists (make, where libmicrohttpd and jansson are installed)" % ASAN_BIN):
        return ck.report()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n_conns = min(10000, hard - 200)
    ck.ok(n_conns == 10000, "file descriptor limit allows 10,000 connections (hard limit %d)" % hard)
    cl = Cluster()
    cl.start_broker()
    cl.start_worker("w1", max_batch=4)
    log = open(os.path.join(cl.dir, "http.log"), "w")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=66",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    gw = subprocess.Popen([ASAN_BIN, "--broker", cl.clients_ep, "--listen", "127.0.0.1:0", "--idle-timeout", "2",
                           "--max-body", "1048576", "--max-connections", "12000",
                           "--max-stream-buffer", "16384"], stdout=subprocess.PIPE,
                          stderr=log, text=True, env=env)
    try:
        line = gw.stdout.readline()
        if not ck.ok(line.startswith("listening http://"), "zllm-http started: %r" % line):
            return ck.report()
        port = int(line.strip().rsplit(":", 1)[1])
        if not ck.ok(cl.wait_workers(["w1"], timeout=30) is not None, "worker registered"):
            return ck.report()

        def serve_ok(what):
            """a normal completion is answered, fast"""
            t0 = time.monotonic()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 8,
                                                                 "temperature": 0}))
                r = c.getresponse()
                body = json.loads(r.read())
                c.close()
                dt = time.monotonic() - t0
                return ck.ok(r.status == 200 and body["usage"]["completion_tokens"] == 8 and dt < 1.5,
                             "%s: a completion is served (%d, %.2f s)" % (what, r.status, dt))
            except Exception as e:
                return ck.ok(False, "%s: a completion is served: %s" % (what, e))

        end = time.monotonic() + 10
        while time.monotonic() < end:
            st, _ = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            if st == 200:
                break
            time.sleep(0.1)
        serve_ok("at rest")

        body = lambda d: json.dumps(d).encode()
        def post(b, extra=b""):
            return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
                    b"Content-Length: %d\r\n\r\n" % len(b) + b)
        cases = [
            ("invalid UTF-8", post(b'{"prompt":"\xff\xfe\xc3\x28"}'), (400,)),
            ("JSON nested 10^5 deep", post(b'{"prompt":' + b"[" * 100000 + b"]" * 100000 + b"}"), (400,)),
            ("max_tokens 2^63", post(b'{"prompt":"a","max_tokens":9223372036854775808}'), (400,)),
            ("max_tokens 2^63-1", post(b'{"prompt":"a","max_tokens":9223372036854775807}'), (400,)),
            ("a 2^20-digit number", post(b'{"prompt":"a","temperature":' + b"9" * 1000000 + b"}"), (400,)),
            ("NUL in a prompt", post(b'{"prompt":"a\\u0000b"}'), (400,)),
            ("huge Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
             b"99999999999999999999\r\n\r\n{}", (400, 413, None)),
            ("body over --max-body", post(b" " * 1100000), (413,)),
            ("header of 1 MB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 1000000 + b"\r\n\r\n",
             (413, 431, None)),
            ("10,000 headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 10000 + b"\r\n",
             (413, 431, None)),
            ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(300), (400, None)),
            ("request line of garbage", b"\x00\x01\x02 / HTTP/1.1\r\n\r\n", (400, None)),
            ("Content-Length and chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", (400, None)),
            ("negative Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
             (400, None)),
            ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"zz\r\nab\r\n0\r\n\r\n", (400, None)),
            ("path of 100 KB", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (404, 414, 431, None)),
        ]
        for what, data, ok in cases:
            st, out = raw(port, data)
            good = ck.ok(st in ok, "%s: status %s (want one of %s)" % (what, st, ok))
            if good and st is not None and st < 500 and b"application/json" in out.split(b"\r\n\r\n")[0]:
                payload = json.loads(out.split(b"\r\n\r\n", 1)[1] or b"{}")
                ck.ok("error" in payload and payload["error"].get("message"), "%s: OpenAI error body" % what)
        # chunked body beyond the limit: a 413 or a closed connection, never the whole body held
        big = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + \
            (b"10000\r\n" + b"a" * 0x10000 + b"\r\n") * 40
        st, out = raw(port, big)
        ck.ok(st in (413, None), "chunked body over --max-body: %s" % st)
        serve_ok("after the malformed requests")

        # a client that asks for a long stream and never reads it: cancelled once 16 KiB wait for it (after the
        # socket buffers fill), its connection closed, the worker slot freed; without the cut the 2,000 tokens
        # would end with [DONE]
        sk = socket.socket()
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sk.connect(("127.0.0.1", port))
        b = json.dumps({"prompt": [1], "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
        time.sleep(3.0)
        sk.settimeout(5)
        got = b""
        try:
            while True:
                x = sk.recv(65536)
                if not x:
                    break
                got += x
        except OSError:
            pass
        sk.close()
        # what came before the cut may be lost to the reset of a connection closed with data in flight
        ck.ok(b"[DONE]" not in got and (not got or got.startswith(b"HTTP/1.1 200")),
              "a stream never read is cut short (%d bytes came)" % len(got))
        st, out = raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        ck.ok(b'status="499"} 1' in out, "... and counted as the client's going (499)")
        w = cl.wait_workers(["w1"])["workers"][0]
        ck.ok(w["free_slots"] == w["n_slots"], "... and its worker slot is free: %r" % w)
        serve_ok("after the client that never read")

        # slowloris: 300 clients that send part of a request and then a byte now and then, never finishing
        slow = []
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
            slow.append(s)
        slow2 = []
        for i in range(100):   # and some that never end their headers
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow2.append(s)
        serve_ok("with 400 slow clients connected")
        time.sleep(3.5)   # --idle-timeout 2: the server closes them
        closed = 0
        for s in slow + slow2:
            s.settimeout(1.0)
            try:
                b = s.recv(4096)
                closed += 1 if (b == b"" or b.startswith(b"HTTP/1.1 4")) else 0
            except (socket.timeout, ConnectionResetError):
                closed += 0 if isinstance(sys.exc_info()[1], socket.timeout) else 1
            s.close()
        ck.ok(closed == 400, "the idle timeout closed %d of the 400 slow clients" % closed)

        # 10,000 concurrent connections, each with half a request
        rss0 = rss_mb(gw.pid)
        socks = []
        t0 = time.monotonic()
        try:
            for i in range(n_conns):
                s = socket.socket()
                s.setblocking(True)
                s.connect(("127.0.0.1", port))
                s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
        except OSError as e:
            print("connect %d: %s" % (len(socks), e))
        ck.ok(len(socks) == n_conns, "%d of %d connections open (%.1f s)" % (len(socks), n_conns,
                                                                            time.monotonic() - t0))
        time.sleep(0.5)
        serve_ok("with 10,000 connections open")
        st, out = raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        conns = [ln for ln in out.split(b"\n") if ln.startswith(b"zllm_http_connections ")]
        ck.ok(conns and int(conns[0].split()[1]) >= n_conns, "zllm_http_connections counts them: %r" % conns)
        rss1 = rss_mb(gw.pid)
        print("gateway RSS: %.0f MB at rest, %.0f MB with %d connections (ASan build)" % (rss0, rss1, len(socks)))
        ck.ok(rss1 - rss0 < 400, "memory stays bounded: +%.0f MB for %d connections" % (rss1 - rss0, len(socks)))
        for s in socks:
            s.close()
        socks = []
        time.sleep(1.0)
        serve_ok("after the 10,000 connections closed")
        ck.ok(gw.poll() is None, "the gateway is alive")
    finally:
        if gw.poll() is None:
            gw.terminate()
            try:
                gw.wait(timeout=20)
            except subprocess.TimeoutExpired:
                gw.kill()
                gw.wait()
        log.close()
        with open(os.path.join(cl.dir, "http.log"), errors="replace") as f:
            err = f.read()
        ck.ok("ERROR: AddressSanitizer" not in err and "runtime error" not in err and "LeakSanitizer" not in err,
              "no ASan/UBSan/LSan report:\n%s" % err[-3000:])
        ck.ok(gw.returncode == 0, "zllm-http exits 0 on SIGTERM (rc %s)" % gw.returncode)
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
