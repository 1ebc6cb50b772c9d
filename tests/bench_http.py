#!/usr/bin/env python3
"""tests/bench_http.py: the cost of zllm-http on loopback, against a real zllm-broker and a fast fake worker
(tests/broker_fake.py: it echoes the prompt, one token per sequence per step, so the broker, the gateway and
the clients are all that is measured). Not a test (run.sh does not run it; tests/test_http_bench.py runs it small):

    python3 tests/bench_http.py [--streams 1000] [--requests 3000] [--out-len M|LO:HI] [--step-ms 5] [--conc LIST]

1. zllm-httpbench with STREAMS streamed /v1/completions requests in flight: the gateway's CPU time (user +
   system, from /proc) divided by the tokens it streamed;
2. for each concurrency of LIST (default STREAMS,16,1), the same load through `zllm bench` (ZeroMQ) and through
   zllm-httpbench one after the other in the same run: p50 and p99 time to first token of both, and what the
   gateway adds at p99. zllm-httpbench opens its connections before the clock starts and sends each request on
   an open one (keep-alive), as `zllm bench` connects its socket before it sends.

The broker runs with a large --client-hwm: one gateway carries every stream over one connection, and the
default (10,000 messages) lets a client that falls 10 steps behind at 1,000 streams lose them all."""
import argparse
import os
import re
import subprocess
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, FakeWorker, model_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def run(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        print("FAILED (%d): %s\n%s" % (p.returncode, " ".join(cmd), out[-2000:]))
    return out, time.monotonic() - t0


def p99(out):
    m = re.search(r"ttft ms: p50 ([\d.]+) p90 ([\d.]+) p99 ([\d.]+)", out)
    return (float(m.group(1)), float(m.group(3))) if m else (float("nan"), float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("ZLLM_BUILD", "build"))
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--out-len", default="64", help="output tokens: M, or LO:HI drawn per request")
    ap.add_argument("--step-ms", type=float, default=5)
    ap.add_argument("--conc", default=None, help="concurrencies compared, comma-separated (default STREAMS,16,1)")
    a = ap.parse_args()
    concs = [int(x) for x in a.conc.split(",")] if a.conc else [a.streams, 16, 1]
    b = os.path.join(ROOT, a.build, "bin")
    ctx = zmq.Context()
    broker = Broker(os.path.join(b, "zllm-broker"), models=["stories260K=" + model_path()],
                    extra=["--queue", "100000", "--client-hwm", "4000000"])
    w = FakeWorker(ctx, broker.workers, n_slots=max(a.streams, 16) + 16, n_ctx=4096, step_ms=a.step_ms, hb_ms=200)
    w.registered.wait(10)
    gw = subprocess.Popen([os.path.join(b, "zllm-http"), "--broker", broker.clients, "--listen", "127.0.0.1:0"],
                          stdout=subprocess.PIPE, text=True)
    port = int(gw.stdout.readline().strip().rsplit(":", 1)[1])
    time.sleep(1.0)
    url = "127.0.0.1:%d" % port
    common = ["--prompt-len", "16", "--out-len", str(a.out_len), "--vocab", "512"]
    try:
        print("load: %d requests, %d streams, 16-token prompts, %s output tokens, fake worker step %.0f ms" % (
            a.requests, a.streams, a.out_len, a.step_ms))
        c0 = cpu_s(gw.pid)
        out, wall = run([os.path.join(b, "zllm-httpbench"), "--url", url, "-N", str(a.requests), "-c",
                         str(a.streams)] + common)
        c1 = cpu_s(gw.pid)
        print(out.strip())
        toks = int(re.search(r"(\d+) tokens$", out.splitlines()[1]).group(1))
        print("gateway CPU: %.2f s for %d streamed tokens = %.2f us per token (%.0f%% of one core over %.1f s)" % (
            c1 - c0, toks, (c1 - c0) / max(toks, 1) * 1e6, (c1 - c0) / wall * 100, wall))
        for conc in concs:
            n = a.requests if conc >= a.streams else min(a.requests, max(30, 10 * conc))
            zout, _ = run([os.path.join(b, "zllm"), "bench", "--broker", broker.clients, "-N", str(n), "-c",
                           str(conc)] + common)
            hout, _ = run([os.path.join(b, "zllm-httpbench"), "--url", url, "-N", str(n), "-c", str(conc)] + common)
            zp, hp = p99(zout), p99(hout)
            print("  zllm bench:     " + " | ".join(zout.strip().splitlines()[:3]))
            print("  zllm-httpbench: " + " | ".join(hout.strip().splitlines()[:3]))
            print("concurrency %d, %d requests: ttft p50/p99 ms: ZeroMQ %.2f / %.2f, HTTP %.2f / %.2f: the gateway "
                  "adds %.2f ms at p99" % (conc, n, zp[0], zp[1], hp[0], hp[1], hp[1] - zp[1]))
    finally:
        gw.terminate()
        gw.wait(10)
        w.close()
        broker.stop()
        ctx.term()


if __name__ == "__main__":
    main()
