#!/usr/bin/env python3
"""tests/test_http_restart.py: zllm-http when its broker restarts.

1. A real zllm-broker (a fake worker behind it, 20 ms a step) is killed with SIGKILL while a streamed and a
   non-streamed completion are in flight: the stream ends at once with an error event and `data: [DONE]`, the
   other request with a 503, both in OpenAI's error shape; a broker started again on the same endpoints serves
   new requests through the same gateway.
2. The restart seen only by the instance id `inst` that every broker reply carries (docs/protocol.md), with no
   dropped connection: a broker played by this test (a ROUTER socket answering with a real broker's status)
   changes its `inst` while requests are in flight; they end at once with `broker_restarted` (an error event and
   [DONE] when streamed, a 503 otherwise), and the broker's counters, which stay as they were, play no part."""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, FakeWorker, ipc, pack  # noqa: E402
from e2e_cluster import BIN, Checks, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402

LONG = {"prompt": [1, 2, 3], "max_tokens": 2000, "ignore_eos": True}


def open_stream(gw, body):
    """a streamed request whose first event has come: (connection, response, first bytes)"""
    hc = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=20)
    hc.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)))
    resp = hc.getresponse()
    return hc, resp, resp.read1(65536)


def open_plain(gw, body):
    """a non-streamed request sent on a raw socket (answered later)"""
    sk = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
    b = json.dumps(body).encode()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
    return sk


def read_rest(resp, limit_s):
    """the stream's bytes until [DONE] or limit_s; (bytes, seconds)"""
    t0 = time.monotonic()
    rest = b""
    try:
        while b"[DONE]" not in rest and time.monotonic() - t0 < limit_s:
            b = resp.read1(65536)
            if not b:
                break
            rest += b
    except Exception as e:   # noqa: BLE001: a closed connection is reported by the checks below
        print("stream read: %s" % e)
    return rest, time.monotonic() - t0


def read_plain(sk, limit_s):
    """the status and JSON body of the raw request's response; (status, body, seconds)"""
    t0 = time.monotonic()
    data = b""
    sk.settimeout(limit_s)
    try:
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0] if b"Content-Length: " in data else 0):
            b = sk.recv(65536)
            if not b:
                break
            data += b
    except Exception as e:   # noqa: BLE001
        print("plain read: %s" % e)
    dt = time.monotonic() - t0
    sk.close()
    if b"\r\n\r\n" not in data:
        return None, None, dt
    head, body = data.split(b"\r\n\r\n", 1)
    try:
        return int(head.split()[1]), json.loads(body), dt
    except ValueError:
        return int(head.split()[1]), None, dt


def stream_error(rest):
    """the error object of the stream's error event, or None"""
    for line in rest.split(b"\n"):
        if line.startswith(b"data: {") and b'"error"' in line:
            return json.loads(line[6:]).get("error")
    return None


def real_broker(ck, ctx):
    b = Broker(os.path.join(BIN, "zllm-broker"))
    w = FakeWorker(ctx, b.workers, n_slots=8, n_ctx=4096, step_ms=20, hb_ms=100)
    gw = None
    try:
        ck.ok(w.registered.wait(5), "fake worker registered")
        gw = Gateway(b.clients)
        ck.ok(gw.wait_up(), "the gateway hears the broker")
        hc, resp, first = open_stream(gw, LONG)
        sk = open_plain(gw, LONG)
        time.sleep(0.2)
        ck.ok(first.startswith(b"data: {") and len(w.seqs) == 2, "two requests in flight (%d)" % len(w.seqs))
        b.p.send_signal(signal.SIGKILL)
        b.p.wait()
        rest, dt = read_rest(resp, 10)
        err = stream_error(rest)
        print("killed broker: the stream ended in %.3f s: %r" % (dt, rest[-240:]))
        ck.ok(err is not None and rest.rstrip().endswith(b"data: [DONE]") and dt < 1.0,
              "the stream ends at once (%.3f s) with an error event and [DONE]: %r" % (dt, rest[-300:]))
        ck.ok(err is not None and err.get("code") == "broker_unreachable", "its code: %r" % err)
        hc.close()
        st, body, dt = read_plain(sk, 10)
        print("killed broker: the non-streamed request got %s in %.3f s: %r" % (st, dt, body))
        error_ok(ck, "the non-streamed request in flight", st, body, 503)
        ck.ok(dt < 1.0, "... at once (%.3f s)" % dt)
        st, _, body = gw.json("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
        error_ok(ck, "a request while the broker is down", st, body, 503)
        # the broker comes back on the same endpoints: the gateway serves again
        b2 = Broker(os.path.join(BIN, "zllm-broker"), clients=b.clients, workers=b.workers)
        try:
            t0, st = time.monotonic(), None
            while time.monotonic() - t0 < 15 and st != 200:
                st, _, body = gw.json("POST", "/v1/completions", {"prompt": [1], "max_tokens": 3})
                if st != 200:
                    time.sleep(0.1)
            ck.ok(st == 200 and body["usage"]["completion_tokens"] == 3, "served again after the restart (%.1f s): "
                  "%s %r" % (time.monotonic() - t0, st, body))
        finally:
            b2.stop()
        ck.ok(gw.p.poll() is None, "the gateway survived")
    finally:
        if gw:
            gw.close()
        w.close()
        b.stop()


class InstBroker:
    """a broker played over a ROUTER socket: status replies (a real broker's, with this object's inst), and for
    each generate one token message, then nothing (the request stays in flight)"""

    def __init__(self, ctx, status):
        self.s = ctx.socket(zmq.ROUTER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.ep = ipc("inst")
        self.s.bind(self.ep)
        self.status = status
        self.inst = "aaaaaaaaaaaaaaaa"
        self.generates = []
        self.cancels = []
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            if not self.s.poll(20):
                continue
            ident, frame = self.s.recv_multipart()
            m = msgpack.unpackb(frame, raw=False)
            t = m.get("type")
            if t == "status":
                self.s.send_multipart([ident, pack(dict(self.status, id=m.get("id", ""), inst=self.inst))])
            elif t == "generate":
                self.generates.append(m["id"])
                self.s.send_multipart([ident, pack({"type": "token", "id": m["id"], "ids": [5], "text": "a",
                                                    "inst": self.inst})])
            elif t == "cancel":
                self.cancels.append(m["id"])

    def close(self):
        self.stop = True
        self.t.join(2)
        self.s.close(0)


def inst_only(ck, ctx):
    # a real broker's status reply (one live worker) for the played broker to answer with
    b = Broker(os.path.join(BIN, "zllm-broker"))
    w = FakeWorker(ctx, b.workers, hb_ms=100)
    w.registered.wait(5)
    time.sleep(0.3)
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(b.clients)
    d.send(pack({"type": "status", "id": "x"}))
    status = msgpack.unpackb(d.recv(), raw=False) if d.poll(5000) else {}
    d.close(0)
    w.close()
    b.stop()
    if not ck.ok(status.get("type") == "status" and status.get("workers"), "a real status: %r" % status):
        return
    fb = InstBroker(ctx, status)
    gw = None
    try:
        gw = Gateway(fb.ep)
        ck.ok(gw.wait_up(), "the gateway hears the played broker")
        hc, resp, first = open_stream(gw, LONG)
        sk = open_plain(gw, LONG)
        time.sleep(0.3)
        ck.ok(first.startswith(b"data: {") and len(fb.generates) == 2, "two requests at the played broker: %r" %
              fb.generates)
        fb.inst = "bbbbbbbbbbbbbbbb"   # the next status reply (within 0.5 s) comes from "another instance"
        rest, dt = read_rest(resp, 5)
        err = stream_error(rest)
        print("new inst: the stream ended in %.3f s: %r" % (dt, rest[-200:]))
        ck.ok(err is not None and err.get("code") == "broker_restarted" and rest.rstrip().endswith(b"data: [DONE]")
              and dt < 1.5, "a new inst ends the stream with broker_restarted and [DONE] (%.3f s): %r" % (dt, rest))
        hc.close()
        st, body, dt = read_plain(sk, 5)
        error_ok(ck, "a new inst: the non-streamed request", st, body, 503)
        ck.ok(isinstance(body, dict) and body["error"].get("code") == "broker_restarted", "code: %r" % body)
        # the same instance again: requests stay in flight
        n = len(fb.generates)
        hc, resp, first = open_stream(gw, LONG)
        time.sleep(1.2)
        ck.ok(first.startswith(b"data: {") and len(fb.generates) == n + 1, "a new request at the same instance")
        hc.sock.settimeout(0.2)
        try:
            more = resp.read1(65536)
        except (socket.timeout, TimeoutError):
            more = b""
        ck.ok(b"error" not in more, "... is not ended by status replies of the same instance: %r" % more)
        hc.close()
    finally:
        if gw:
            gw.close()
        fb.close()


def main():
    watchdog(120)
    ck = Checks("http_restart")
    ctx = zmq.Context()
    try:
        real_broker(ck, ctx)
        inst_only(ck, ctx)
    finally:
        ctx.term()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
