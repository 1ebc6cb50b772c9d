"""tests/test_worker_phase_times.py: zllm-worker --phase-times 1 (docs/structured-output.md, "Where a step's host
time goes") on a real broker and CPU worker serving stories260K: requests with a regex and without one, then
SIGTERM; the worker's log ends with one line for the steps with grammars and one for those without, each counting
its steps and giving every phase the steps had (mean/p99 microseconds), the grammar line with its accepts and
masks, the other without them. SIGUSR1 logs the lines at once and starts afresh: after it, a plain request, and at
the exit no step with grammars and the plain request's. A worker without the option logs no such line."""
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Cluster, Checks, watchdog  # noqa: E402

LINE = re.compile(r"phase times, steps (with|without) grammars: (\d+) steps \(([0-9.]+) tokens, ([0-9.]+) prompt "
                  r"tokens per step, ([0-9.]+)% with prompt tokens\); mean/p99 us:(.*)$")


def phases(rest):
    """{'device': (mean, p99), ...} from the end of a phase line"""
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r" ([a-z]+) ([0-9.]+)/([0-9.]+)", rest)}


def generate(cl, extra):
    p = subprocess.run([os.path.join(BIN, "zllm"), "generate", "--broker", cl.clients_ep, "-p", "Once upon a time",
                        "-n", "12", "--temp", "0"] + extra, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout


def main():
    watchdog(120)
    ck = Checks("worker_phase_times")
    cl = Cluster()
    try:
        cl.start_broker()
        # w1 with the option serves everything, then w2 without it (one worker at a time)
        for name, extra in (("w1", ["--phase-times", "1"]), ("w2", [])):
            cl.start_worker(name, *extra)
            if not ck.ok(cl.wait_workers([name], timeout=30) is not None, "%s registered" % name):
                return ck.report()
            for k in range(3):
                rc, out = generate(cl, ["--regex", "[a-z ]{1,30}"])
                ck.ok(rc == 0 and re.fullmatch(r"[a-z ]{1,30}\n?", out) is not None,
                      "%s: regex request %d: %r" % (name, k, out))
                rc, out = generate(cl, [])
                ck.ok(rc == 0 and out.strip() != "", "%s: plain request %d: %r" % (name, k, out))
            if name == "w1":  # the lines so far at SIGUSR1, then afresh: one plain request only
                log = cl.logs[-1]
                cl.send_signal(name, signal.SIGUSR1)
                end = time.monotonic() + 10
                while time.monotonic() < end and "phase times, steps without" not in open(log).read():
                    time.sleep(0.05)
                rc, out = generate(cl, [])
                ck.ok(rc == 0 and out.strip() != "", "w1: plain request after SIGUSR1: %r" % out)
            ck.ok(cl.kill(name, signal.SIGTERM, wait=10) == 0, "%s exits 0 on SIGTERM" % name)
        logs = {}
        for log in cl.logs:
            name = os.path.basename(log).split(".")[0]
            with open(log, encoding="utf-8", errors="replace") as f:
                logs[name] = f.read()
        got, late = {}, {}
        for line in logs.get("w1", "").splitlines():
            m = LINE.search(line)
            if m:
                (late if m.group(1) in got else got)[m.group(1)] = m  # SIGUSR1's lines first, then the exit's
        ck.ok(set(got) == {"with", "without"}, "w1 logs both lines: %s" % sorted(got))
        for m in got.values():
            print(m.group(0))
        if "with" in got:
            m = got["with"]
            ph = phases(m.group(6))
            ck.ok(int(m.group(2)) >= 3, "steps with grammars: %s" % m.group(2))
            ck.ok(float(m.group(3)) >= 1, "tokens per step with grammars: %s" % m.group(3))
            ck.ok({"device", "accept", "masks", "apply", "build", "out", "io", "loop"} <= set(ph),
                  "phases of the grammar steps: %s" % sorted(ph))
            ck.ok(all(0 <= mean <= p99 + 1 for mean, p99 in ph.values()), "means within their p99: %s" % ph)
            ck.ok(ph.get("loop", (0, 0))[0] >= ph.get("device", (0, 0))[0], "a turn lasts at least its device time")
        if "without" in got:
            m = got["without"]
            ph = phases(m.group(6))
            ck.ok(int(m.group(2)) >= 3, "steps without grammars: %s" % m.group(2))
            ck.ok("masks" not in ph and {"device", "loop"} <= set(ph), "phases without grammars: %s" % sorted(ph))
        ck.ok(set(late) == {"with", "without"}, "w1 logs both lines again at exit: %s" % sorted(late))
        if set(late) == {"with", "without"}:
            ck.ok(int(late["with"].group(2)) == 0 and 1 <= int(late["without"].group(2)) < int(got["without"].group(2)),
                  "after SIGUSR1 only the plain request's steps: %s / %s" % (late["with"].group(2),
                                                                          late["without"].group(2)))
        ck.ok("phase times" not in logs.get("w2", "x"), "no phase line without --phase-times")
        if ck.failed:
            cl.dump_logs()
    finally:
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
