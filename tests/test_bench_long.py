"""tests/test_bench_long.py: `zllm bench` with background long prompts against one real broker and one real CPU
worker (stories260K) running with a step budget (`zllm-worker --step-budget`): the measured requests all complete
and are counted alone, the background prompts are submitted on their clock, reported on their own `long:` line and
cancelled when the measured requests end; the inter-token latency line counts one gap per token message after
the first; the steady window's rate is printed when the run has one (-N above -c). Bad values of the new options are refused before anything is sent (exit 2), by `zllm` and by
`zllm-worker`."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Cluster, Checks, watchdog  # noqa: E402

N, C, OUT, LONG, LONG_OUT = 64, 4, 24, 200, 8


def main():
    watchdog(120)
    ck = Checks("bench_long")
    zllm = os.path.join(BIN, "zllm")
    for bad in (["--long-every", "0"], ["--long-prompt-len", "0"], ["--long-out-len", "0"],
                ["--long-prompt-len", "x"]):
        p = subprocess.run([zllm, "bench", "--broker", "ipc:///nonexistent"] + bad, capture_output=True, text=True,
                           timeout=10)
        ck.ok(p.returncode == 2 and bad[0] in p.stderr, "zllm bench %s refused (rc %d, %r)" % (
            " ".join(bad), p.returncode, p.stderr.strip()[:80]))
    p = subprocess.run([os.path.join(BIN, "zllm-worker"), "--broker", "ipc:///nonexistent", "-m", "x.gguf",
                        "--step-budget", "-1"], capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 2, "zllm-worker --step-budget -1 refused (rc %d)" % p.returncode)
    cl = Cluster()
    try:
        cl.start_broker()
        cl.start_worker("w1", "--step-tokens", "256", "--step-budget", "16", "--ctx", "512", max_batch=8)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "worker registered"):
            return ck.report()
        base = [zllm, "bench", "--broker", cl.clients_ep, "-N", str(N), "-c", str(C), "--prompt-len", "4:12",
                "--out-len", str(OUT), "--vocab", "512"]
        p = subprocess.run(base + ["--long-prompt-len", str(LONG), "--long-every", "25", "--long-out-len", str(LONG_OUT)],
                           capture_output=True, text=True, timeout=60)
        print(p.stdout.strip())
        ck.ok(p.returncode == 0 and "requests: %d (%d ok" % (N, N) in p.stdout,
              "all %d measured requests ok (rc %d, %s)" % (N, p.returncode, p.stderr.strip()[:200]))
        m = re.search(r"itl ms: +p50 ([\d.]+) p90 ([\d.]+) p99 ([\d.]+) \(p99/p50 ([\d.]+), (\d+) gaps\)", p.stdout)
        if ck.ok(m is not None, "an itl line with p99/p50 and the gaps"):
            gaps = int(m.group(5))
            # one gap per token message after a stream's first: at most OUT - 1 a request, at least half that
            # (a message may carry several ids); the background prompts' LONG_OUT tokens are not among them
            ck.ok(N * (OUT - 1) // 2 <= gaps <= N * (OUT - 1), "%d gaps for %d x %d tokens" % (gaps, N, OUT))
            ck.ok(float(m.group(1)) <= float(m.group(3)), "p50 <= p99")
        m = re.search(r"long: (\d+) prompts of %d tokens, one every 25 ms \((\d+) ok, (\d+) cancelled at the end\), "
                      r"ttft ms: p50 ([\d.]+) p99 ([\d.]+)" % LONG, p.stdout)
        if ck.ok(m is not None, "a long: line"):
            n, ok, open_ = int(m.group(1)), int(m.group(2)), int(m.group(3))
            ck.ok(n >= 3, "background prompts submitted on their clock during the run (%d)" % n)
            ck.ok(ok >= 1 and ok + open_ <= n, "background prompts served (%d ok, %d cancelled of %d)" % (ok, open_, n))
        p = subprocess.run(base, capture_output=True, text=True, timeout=60)
        ck.ok(p.returncode == 0 and "long:" not in p.stdout and "requests: %d (%d ok" % (N, N) in p.stdout,
              "without --long-prompt-len: no long: line (rc %d)" % p.returncode)
        m = re.search(r"steady: ([\d.]+) output tokens/s over ([\d.]+) s with %d streams" % C, p.stdout)
        w = re.search(r"wall ([\d.]+) s, [\d.]+ requests/s, ([\d.]+) output tokens/s", p.stdout)
        if ck.ok(m is not None and w is not None, "a steady line beside the wall line"):
            # the window lies inside the run and its rate is that of a real stream of tokens
            ck.ok(0 < float(m.group(2)) <= float(w.group(1)) + 0.01 and float(m.group(1)) > 0,
                  "steady window %s s of a %s s run, %s tokens/s" % (m.group(2), w.group(1), m.group(1)))
        p = subprocess.run(base[:base.index("-N")] + ["-N", str(C), "-c", str(C), "--out-len", "4"],
                           capture_output=True, text=True, timeout=60)
        ck.ok(p.returncode == 0 and "steady: none" in p.stdout, "-N equal to -c: no steady window (rc %d, %r)" % (
            p.returncode, p.stdout[-200:]))
        st = cl.status()
        w = [x for x in st.get("workers", []) if x.get("name") == "w1"]
        ck.ok(w and w[0].get("alive"), "the worker is alive after the runs")
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
