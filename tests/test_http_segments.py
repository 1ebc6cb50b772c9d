#!/usr/bin/env python3
"""tests/test_http_segments.py: zllm-http sends a stream's headers with its first chunk, and its last chunk with
the closing zero-length chunk, as one TCP segment each (docs/http.md: each segment on loopback is a delivery in
the gateway's system call and a wake-up of the client).

A real zllm-broker with a fake worker at 60 ms a step, so that each token arrives in a turn of its own: a streamed
completion of 3 tokens on a kept-alive raw socket arrives in 3 data segments (headers and the first token, the
second token, the last token with the finish, the usage, [DONE] and the closing chunk; 4 when the last token and
the final reach the gateway in different turns), counted by the client socket's TCP_INFO (tcpi_data_segs_in),
where each write on its own would take 5 or 6; a non-streamed reply takes one.

The write rate (--stream-write-rate, docs/http.md): a fake worker at 20 ms a step streams 12 tokens. With a rate of
4 writes a second (one request in flight: a write every 250 ms) the first token still leaves at once, and the other
eleven leave in at most three writes, every token in order; with no limit each token is a segment of its own."""
import json
import os
import socket
import struct
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, FakeWorker  # noqa: E402
from e2e_cluster import BIN, Checks, watchdog  # noqa: E402
from http_gateway import Gateway  # noqa: E402

DATA_SEGS_IN = 152  # offset of tcpi_data_segs_in in struct tcp_info (Linux 4.6 and later)


def data_segs_in(sk):
    info = sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, DATA_SEGS_IN)[0] if len(info) >= DATA_SEGS_IN + 4 else None


def one(sk, body):
    """sends one request on sk and reads its whole response; (data segments it took, response bytes)"""
    b = json.dumps(body).encode()
    before = data_segs_in(sk)
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
    data, end = b"", (b"\r\n0\r\n\r\n" if body.get("stream") else b"}")
    t0 = time.monotonic()
    while not data.endswith(end) and time.monotonic() - t0 < 10:
        x = sk.recv(65536)
        if not x:
            break
        data += x
    return data_segs_in(sk) - before, data


def paced(ck, b, rate):
    """a 12-token stream through a gateway with --stream-write-rate RATE: (data segments, seconds to the first
    byte, the token events' texts)"""
    gw = Gateway(b.clients, "--stream-write-rate", str(rate))
    try:
        ck.ok(gw.wait_up(), "the gateway (rate %d) hears the broker" % rate)
        sk = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        one(sk, {"prompt": [5], "max_tokens": 1, "stream": True})  # the connection's first stream (see main)
        body = json.dumps({"prompt": list(range(5, 17)), "max_tokens": 12, "ignore_eos": True, "stream": True})
        before = data_segs_in(sk)
        t0 = time.monotonic()
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
        data, t_first = b"", None
        while not data.endswith(b"\r\n0\r\n\r\n") and time.monotonic() - t0 < 10:
            x = sk.recv(65536)
            if not x:
                break
            if t_first is None:
                t_first = time.monotonic() - t0
            data += x
        n = data_segs_in(sk) - before
        sk.close()
        texts = []
        for line in data.split(b"\n"):
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                if ev.get("choices") and ev["choices"][0].get("text") is not None:
                    texts.append(ev["choices"][0]["text"])
        return n, t_first, texts
    finally:
        gw.close()


def main():
    watchdog(90)
    ck = Checks("http_segments")
    ctx = zmq.Context()
    b = Broker(os.path.join(BIN, "zllm-broker"))
    w = FakeWorker(ctx, b.workers, n_slots=4, n_ctx=4096, step_ms=60, hb_ms=100)
    gw = None
    try:
        ck.ok(w.registered.wait(5), "fake worker registered")
        gw = Gateway(b.clients)
        ck.ok(gw.wait_up(), "the gateway hears the broker")
        sk = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        ck.ok(data_segs_in(sk) is not None, "TCP_INFO has tcpi_data_segs_in")
        stream = {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
        # the first stream on a connection takes one segment more: libmicrohttpd sets TCP_NODELAY on the
        # socket once, after the headers, and that pushes what the cork held
        for i in range(4):
            n, data = one(sk, stream)
            events = data.count(b"data: ")
            print("stream %d: %d data segments, %d events, %d bytes" % (i + 1, n, events, len(data)))
            ck.ok(data.startswith(b"HTTP/1.1 200") and data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"),
                  "stream %d complete: %r" % (i + 1, data[-80:]))
            ck.ok(events == 6, "stream %d: 3 token events, the finish, usage and [DONE] (%d)" % (i + 1, events))
            # headers + token 1, token 2, token 3 + the finish + usage + [DONE] + the closing chunk; token 3 is
            # a segment of its own when the final reaches the gateway a turn after it (uncorked: 5 or 6)
            if i > 0:
                ck.ok(2 <= n <= 4, "stream %d: 3 data segments, or 4 (%d)" % (i + 1, n))
        n, data = one(sk, {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True})
        print("non-streamed: %d data segments, %d bytes" % (n, len(data)))
        ck.ok(data.startswith(b"HTTP/1.1 200") and n == 1, "a non-streamed reply in one segment (%d)" % n)
        sk.close()
        gw.close()
        gw = None
        w.step_ms = 20
        n0, f0, t0 = paced(ck, b, 0)
        n4, f4, t4 = paced(ck, b, 4)
        print("12 tokens at 20 ms a step: %d data segments without a limit, %d at 4 writes/s; first byte after %.0f "
              "and %.0f ms" % (n0, n4, f0 * 1e3, f4 * 1e3))
        ck.ok(len(t0) >= 12 and t4 == t0, "the same token events in the same order either way (%d, %d)" %
              (len(t0), len(t4)))
        ck.ok(n0 >= 10, "without a limit each token is a segment of its own (%d)" % n0)
        ck.ok(n4 <= 4, "at 4 writes a second: the first token, then at most three writes (%d)" % n4)
        ck.ok(f4 < 0.2, "the first token is never held (%.0f ms)" % (f4 * 1e3))
    finally:
        if gw:
            gw.close()
        w.close()
        b.stop()
        ctx.term()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
