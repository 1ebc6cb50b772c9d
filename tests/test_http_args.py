#!/usr/bin/env python3
"""tests/test_http_args.py: zllm-http refuses malformed options with exit 2 and a message naming them, before it
listens: a --listen port that is not a whole number in 0..65535, more --served-model-name or --model options than
it holds. A well-formed --listen with port 0 still starts (the port it bound printed) and stops on SIGTERM."""
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Checks, watchdog  # noqa: E402

BROKER = "tcp://127.0.0.1:9"  # nothing answers: the options are checked before the broker is asked


def run(args):
    """(exit status, stdout, stderr); a gateway still running after 6 s (it accepted the options) gives -1"""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=6)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, out, "still running after 6 s"


def main():
    watchdog(60)
    ck = Checks("http_args")
    exe = os.path.join(BIN, "zllm-http")
    if not ck.ok(os.path.exists(exe), "%s is built" % exe):
        return ck.report()
    refusals = [
        (["--listen", "127.0.0.1:abc"], "--listen's port"),
        (["--listen", "127.0.0.1:"], "--listen's port"),
        (["--listen", "127.0.0.1:65536"], "--listen's port"),
        (["--listen", "127.0.0.1:-1"], "--listen's port"),
        (["--listen", "[::1]:8x"], "--listen's port"),
        (["--listen", "localhost"], "--listen takes HOST:PORT"),
        (sum((["--served-model-name", "m%d" % i] for i in range(64)), []), "--served-model-name: at most"),
        (sum((["--model", "m%d=/nonexistent" % i] for i in range(17)), []), "--model: at most 16"),
    ]
    for args, what in refusals:
        rc, out, err = run([exe, "--broker", BROKER] + args)
        ck.ok(rc == 2 and what in err and "listening" not in out,
              "%s: exit %d, %r" % (" ".join(args)[:60], rc, err.strip()[:160]))
    # the limit itself is accepted: the 16th --model is loaded (and fails on its path, exit 1, not a usage error)
    rc, out, err = run([exe, "--broker", BROKER] + sum((["--model", "m%d=/nonexistent" % i] for i in range(16)), []))
    ck.ok(rc == 1 and "/nonexistent" in err, "16 --model: exit %d, %r" % (rc, err.strip()[:160]))
    # port 0: any free port, printed once bound (after the broker wait of at most 3 s)
    gw = subprocess.Popen([exe, "--broker", BROKER, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        line = gw.stdout.readline()
        m = re.match(r"listening http://127\.0\.0\.1:(\d+)$", line.strip())
        ck.ok(m is not None and 0 < int(m.group(1)) < 65536, "--listen 127.0.0.1:0: %r" % line.strip())
        gw.send_signal(signal.SIGTERM)
        rc = gw.wait(timeout=10)
        ck.ok(rc == 0, "SIGTERM: exit %d" % rc)
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
