#!/usr/bin/env python3
"""tests/test_http_segments.py: zllm-http sends a stream's headers with its first chunk, and its last chunk with
the closing zero-length chunk, as one TCP segment each (docs/http.md: each segment on loopback is a delivery in
the gateway's system call and a wake-up of the client).

A real zllm-broker with a fake worker at 60 ms a step, so that each token arrives in a turn of its own: a streamed
completion of 3 tokens on a kept-alive raw socket arrives in 3 data segments (headers and the first token, the
second token, the last token with the finish, the usage, [DONE] and the closing chunk; 4 when the last token and
the final reach the gateway in different turns), counted by the client socket's TCP_INFO (tcpi_data_segs_in),
where each write on its own would take 5 or 6; a non-streamed reply takes one."""
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


def main():
    watchdog(60)
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
    finally:
        if gw:
            gw.close()
        w.close()
        b.stop()
        ctx.term()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
