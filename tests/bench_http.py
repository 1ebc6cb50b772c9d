#!/usr/bin/env python3
"""tests/bench_http.py: the cost of zllm-http on loopback, against a real zllm-broker and a fast fake worker
(tests/broker_fake.py: it echoes the prompt, one token per sequence per step, so the broker, the gateway and
the clients are all that is measured). Not a test (run.sh does not run it; tests/test_http_bench.py runs it small):

    python3 tests/bench_http.py [--streams 1000] [--requests 3000] [--out-len M|LO:HI] [--step-ms 5] [--conc LIST]
                                [--load steady|wave] [--ramp-ms MS] [--seed S]

The load (the same for both tools: common/benchload.h): --load steady (the default) draws each request's output
length uniformly from [M/2, 3M/2] (seeded: the same sequence for both tools) and starts the streams spread over
one mean stream lifetime (M * step ms), so that requests end and new ones arrive spread over time, as a serving
deployment sees them; --load wave gives every request M tokens and starts every stream at once, so that all the
streams of a closed loop end on the same worker step and send their next requests together. --out-len LO:HI and
--ramp-ms override either.

1. zllm-httpbench with STREAMS streamed /v1/completions requests in flight: the gateway's CPU time (user +
   system, from /proc) divided by the tokens it streamed;
2. for each concurrency of LIST (default STREAMS,16,1), the same load through `zllm bench` (ZeroMQ) and through
   zllm-httpbench one after the other in the same run: p50 and p99 time to first token of both, and what the
   gateway adds at p99. zllm-httpbench opens its connections before the clock starts and sends each request on
   an open one (keep-alive), as `zllm bench` connects its socket before it sends.

The broker runs with a large --client-hwm: one gateway carries every stream over one connection, and the
default (10,000 messages) lets a client that falls 10 steps behind at 1,000 streams lose them all. Each line of
results also gives the CPU time each process took during that run: the broker, the gateway (HTTP runs), the
load tool, and this script, which runs the fake worker; the time the gateway's threads were ready to run but
waited for a CPU; and the CPU time the rest of the machine took (others: what shares the cores, /proc/stat)."""
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


def runq_s(pid):
    """seconds the process's threads spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat)"""
    t = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                t += int(f.read().split()[1])
        except OSError:
            pass
    return t / 1e9


def machine_busy_s():
    """CPU seconds the whole machine spent busy (all CPUs, every process: /proc/stat)"""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds of the broker, the gateway, a load tool (its rusage) and this process over one run, and the
    time the gateway's threads waited for a CPU while runnable"""

    def __init__(self, broker, gw):
        self.pids = {"broker": broker, "gateway": gw, "fake worker": os.getpid()}
        self.t0 = {k: cpu_s(v) for k, v in self.pids.items()}
        self.gw, self.q0, self.m0 = gw, runq_s(gw), machine_busy_s()

    def end(self, client_ru):
        d = {k: cpu_s(v) - self.t0[k] for k, v in self.pids.items()}
        d["client"] = client_ru.ru_utime + client_ru.ru_stime
        d["gateway run queue"] = runq_s(self.gw) - self.q0
        d["others"] = max(0.0, machine_busy_s() - self.m0 - sum(d[k] for k in ("client", "broker", "gateway",
                                                                                "fake worker")))
        return d


def cpu_line(d, wall, skip=()):
    return ", ".join("%s %.2f s" % (k, d[k]) for k in ("client", "gateway", "broker", "fake worker",
                                                       "gateway run queue", "others") if k not in skip) + " over %.2f s" % wall


def run(cmd):
    """runs a load tool: its output, wall time and rusage"""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        print("FAILED (%d): %s\n%s" % (p.returncode, " ".join(cmd), out[-2000:]))
    return out, time.monotonic() - t0, ru


def p99(out):
    m = re.search(r"ttft ms: p50 ([\d.]+) p90 ([\d.]+) p99 ([\d.]+)", out)
    return (float(m.group(1)), float(m.group(3))) if m else (float("nan"), float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("ZLLM_BUILD", "build"))
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--out-len", default="64", help="output tokens: M (steady: drawn from [M/2, 3M/2]), or LO:HI")
    ap.add_argument("--step-ms", type=float, default=5)
    ap.add_argument("--load", choices=("steady", "wave"), default="steady")
    ap.add_argument("--ramp-ms", type=float, default=None, help="streams start spread over MS ms (default: steady: "
                    "M * step ms, wave: 0)")
    ap.add_argument("--seed", type=int, default=1, help="the output lengths' seed (both tools)")
    ap.add_argument("--conc", default=None, help="concurrencies compared, comma-separated (default STREAMS,16,1)")
    a = ap.parse_args()
    concs = [int(x) for x in a.conc.split(",")] if a.conc else [a.streams, 16, 1]
    if ":" in a.out_len:
        lo, hi = (int(x) for x in a.out_len.split(":"))
    else:
        m = int(a.out_len)
        lo, hi = (max(1, m // 2), m + m // 2) if a.load == "steady" else (m, m)
    ramp = a.ramp_ms if a.ramp_ms is not None else ((lo + hi) / 2 * a.step_ms if a.load == "steady" else 0)
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
    common = ["--prompt-len", "16", "--out-len", "%d:%d" % (lo, hi), "--vocab", "512", "--bench-seed", str(a.seed),
              "--ramp-ms", "%d" % round(ramp)]
    try:
        print("load %s: %d requests, %d streams, 16-token prompts, %d..%d output tokens, streams started over %d ms, "
              "fake worker step %.0f ms; load average %s" % (a.load, a.requests, a.streams, lo, hi, round(ramp),
                                                              a.step_ms, open("/proc/loadavg").read().split()[0]))
        cpu = Cpu(broker.p.pid, gw.pid)
        out, wall, ru = run([os.path.join(b, "zllm-httpbench"), "--url", url, "-N", str(a.requests), "-c",
                             str(a.streams)] + common)
        d = cpu.end(ru)
        print(out.strip())
        toks = int(re.search(r"(\d+) tokens$", out.splitlines()[1]).group(1))
        print("gateway CPU: %.2f s for %d streamed tokens = %.2f us per token (%.0f%% of one core over %.1f s)" % (
            d["gateway"], toks, d["gateway"] / max(toks, 1) * 1e6, d["gateway"] / wall * 100, wall))
        print("CPU: " + cpu_line(d, wall))
        for conc in concs:
            n = a.requests if conc >= a.streams else min(a.requests, max(30, 10 * conc))
            cpu = Cpu(broker.p.pid, gw.pid)
            zout, zwall, ru = run([os.path.join(b, "zllm"), "bench", "--broker", broker.clients, "-N", str(n), "-c",
                                   str(conc)] + common)
            zcpu = cpu.end(ru)
            cpu = Cpu(broker.p.pid, gw.pid)
            hout, hwall, ru = run([os.path.join(b, "zllm-httpbench"), "--url", url, "-N", str(n), "-c", str(conc)] +
                                  common)
            hcpu = cpu.end(ru)
            zp, hp = p99(zout), p99(hout)
            burst = r"sends in a request's millisecond: (p50 \d+ p99 \d+ max \d+)"
            print("  zllm bench:     " + " | ".join(zout.strip().splitlines()[:3]) + " | sends in a ms: " +
                  (re.search(burst, zout) or [None, "?"])[1] + " | CPU: " + cpu_line(zcpu, zwall, ("gateway", "gateway run queue")))
            print("  zllm-httpbench: " + " | ".join(hout.strip().splitlines()[:3]) + " | sends in a ms: " +
                  (re.search(burst, hout) or [None, "?"])[1] + " | CPU: " + cpu_line(hcpu, hwall))
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
