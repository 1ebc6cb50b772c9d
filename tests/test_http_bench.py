#!/usr/bin/env python3
"""tests/test_http_bench.py: tests/bench_http.py and zllm-httpbench, small: 20 streams and 1 against a real
broker, the fake worker and zllm-http. Every request of both load tools completes, the token counts add up, the
gateway's CPU per token and both sides' time to first token come out as numbers; without a gateway
zllm-httpbench fails instead of reporting nothing. The load is the same for both tools: --load wave sends every
stream's requests at once, the steady load draws the same output lengths in both (the same total of tokens) and
spreads the streams' starts (fewer sends in the same millisecond than the wave)."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, ROOT, Checks, watchdog  # noqa: E402


def main():
    watchdog(120)
    ck = Checks("http_bench")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench_http.py"), "--streams", "20", "--requests",
                        "60", "--out-len", "8", "--step-ms", "2", "--conc", "20,1", "--load", "wave"], capture_output=True, text=True,
                       timeout=110)
    out = p.stdout + p.stderr
    print(out)
    ck.ok(p.returncode == 0 and "FAILED" not in out, "bench_http.py ran: rc %d" % p.returncode)
    ck.ok("requests: 60 (60 ok, 0 failed)" in out and "480 tokens" in out, "zllm-httpbench: 60 requests of 8 tokens")
    m = re.search(r"gateway CPU: [\d.]+ s for (\d+) streamed tokens = ([\d.]+) us per token", out)
    ck.ok(m and int(m.group(1)) == 480 and float(m.group(2)) >= 0, "the gateway's CPU per token (clock ticks: 0 in a short run): %r" % (
        m and m.group(0)))
    for conc, n in ((20, 60), (1, 30)):
        m = re.search(r"concurrency %d, %d requests: ttft p50/p99 ms: ZeroMQ ([\d.]+) / ([\d.]+), HTTP ([\d.]+) / "
                      r"([\d.]+)" % (conc, n), out)
        ck.ok(m is not None, "concurrency %d: both sides' time to first token" % conc)
    ck.ok(out.count("(60 ok, 0 failed)") == 2 and "requests: 60 (60 ok, 60 length" in out,
          "at 20 streams every request of both tools completed")
    m = re.search(r"concurrency 20, prompt 16, output 8..8 tokens.*sends in a ms: p50 (\d+) p99 (\d+) max (\d+)", out)
    ck.ok(m and int(m.group(3)) >= 10, "wave: the 20 streams' first requests leave together: %r" % (m and m.group(0)))
    # output lengths drawn per request (LO:HI), by both tools
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench_http.py"), "--streams", "20", "--requests",
                        "60", "--out-len", "4:12", "--step-ms", "2", "--conc", "20", "--ramp-ms", "100"],
                       capture_output=True, text=True, timeout=110)
    out = p.stdout + p.stderr
    print(out)
    m = re.search(r"requests: 60 \(60 ok, 0 failed\), concurrency 20, prompt 16, output 4..12 tokens\n.* (\d+) tokens\n",
                  out)
    ck.ok(p.returncode == 0 and m and 240 < int(m.group(1)) < 720,
          "--out-len 4:12: lengths drawn per request: %r" % (m and m.group(0)))
    ck.ok(out.count("output 4..12 tokens") == 3, "both tools were given the range")
    z = re.search(r"zllm bench: .*output 4..12 tokens \| .*, (\d+) tokens \|.*sends in a ms: p50 \d+ p99 \d+ max (\d+)",
                  out)
    h = re.search(r"zllm-httpbench: .*output 4..12 tokens \| .*, (\d+) tokens \|.*sends in a ms: p50 \d+ p99 \d+ max (\d+)",
                  out)
    ck.ok(z and h and m and z.group(1) == h.group(1) == m.group(1),
          "the same output lengths through both tools: %s tokens (ZeroMQ) and %s (HTTP), %s before" % (
              z and z.group(1), h and h.group(1), m and m.group(1)))
    ck.ok(z and h and int(z.group(2)) <= 10 and int(h.group(2)) <= 10,
          "streams started over 100 ms: at most half the streams send in the same millisecond (the wave: all 20): "
          "%s (ZeroMQ), %s (HTTP)" % (
              z and z.group(2), h and h.group(2)))
    # more streams than the gateway writes in one loop turn (RESUME_BATCH, http/gw_server.c): every stream's later
    # tokens still go out a step apart (not held until its final: then most gaps between tokens would be 0)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench_http.py"), "--streams", "300", "--requests",
                        "600", "--out-len", "40", "--step-ms", "10", "--conc", "300", "--load", "wave"],
                       capture_output=True, text=True, timeout=110)
    out = p.stdout + p.stderr
    ck.ok(p.returncode == 0 and out.count("requests: 600 (600 ok, 0 failed)") == 2 and out.count("24000 tokens") == 3,
          "300 streams: every request of both tools completed with its 40 tokens: %r" % out[-600:])
    m = re.search(r"itl ms:  p50 ([\d.]+)", out)
    ck.ok(m and float(m.group(1)) >= 2.0, "300 streams: tokens a worker step (10 ms) apart, p50 %s ms" % (
        m and m.group(1)))
    q = subprocess.run([os.path.join(BIN, "zllm-httpbench"), "--url", "127.0.0.1:1", "-N", "1", "-c", "1"],
                       capture_output=True, text=True, timeout=20)
    ck.ok(q.returncode != 0 and "connection" in q.stderr, "no gateway: zllm-httpbench fails: %r" % q.stderr[-200:])
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
