#!/usr/bin/env python3
"""tests/test_http_args.py: zllm-http refuses malformed options with exit 2 and a message naming them, before it
listens: a --listen port that is not a whole number in 0..65535, more --served-model-name or --model options than
it holds, an API key file whose first line is empty or too long to hold whole. A well-formed --listen with port 0
and a key of the longest length still start (the port it bound printed; that key, not a shorter one, accepted)
and stop on SIGTERM."""
import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

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
    tmp = tempfile.mkdtemp(prefix="zllm-http-args-")
    long_key, empty_key, ok_key = (os.path.join(tmp, n) for n in ("long.key", "empty.key", "ok.key"))
    with open(long_key, "w") as f:
        f.write("k" * 600 + "\n")  # the gateway would compare a truncated key: no client could match it
    with open(empty_key, "w") as f:
        f.write("\nsecond line\n")
    with open(ok_key, "w") as f:
        f.write("k" * 510)  # the longest key, without a newline
    refusals = [
        (["--listen", "127.0.0.1:abc"], "--listen's port"),
        (["--listen", "127.0.0.1:"], "--listen's port"),
        (["--listen", "127.0.0.1:65536"], "--listen's port"),
        (["--listen", "127.0.0.1:-1"], "--listen's port"),
        (["--listen", "[::1]:8x"], "--listen's port"),
        (["--listen", "localhost"], "--listen takes HOST:PORT"),
        (sum((["--served-model-name", "m%d" % i] for i in range(64)), []), "--served-model-name: at most"),
        (sum((["--model", "m%d=/nonexistent" % i] for i in range(17)), []), "--model: at most 16"),
        (["--api-key-file", long_key], "longer than 510 bytes"),
        (["--api-key-file", empty_key], "no key on the first line"),
    ]
    for args, what in refusals:
        rc, out, err = run([exe, "--broker", BROKER] + args)
        ck.ok(rc == 2 and what in err and "listening" not in out,
              "%s: exit %d, %r" % (" ".join(args)[:60], rc, err.strip()[:160]))
    # the limit itself is accepted: the 16th --model is loaded (and fails on its path, exit 1, not a usage error)
    rc, out, err = run([exe, "--broker", BROKER] + sum((["--model", "m%d=/nonexistent" % i] for i in range(16)), []))
    ck.ok(rc == 1 and "/nonexistent" in err, "16 --model: exit %d, %r" % (rc, err.strip()[:160]))
    # port 0: any free port, printed once bound (after the broker wait of at most 3 s)
    gw = subprocess.Popen([exe, "--broker", BROKER, "--listen", "127.0.0.1:0", "--api-key-file", ok_key],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        line = gw.stdout.readline()
        m = re.match(r"listening http://127\.0\.0\.1:(\d+)$", line.strip())
        ck.ok(m is not None and 0 < int(m.group(1)) < 65536, "--listen 127.0.0.1:0: %r" % line.strip())
        if m:  # the 510-byte key is the one required
            for key, want in (("k" * 510, 503), ("k" * 509, 401)):
                req = urllib.request.Request("http://127.0.0.1:%s/v1/models" % m.group(1),
                                             headers={"Authorization": "Bearer " + key})
                try:
                    st = urllib.request.urlopen(req, timeout=5).status
                except urllib.error.HTTPError as e:
                    st = e.code
                ck.ok(st == want, "a key of %d bytes: %d (want %d: no broker answers)" % (len(key), st, want))
        gw.send_signal(signal.SIGTERM)
        rc = gw.wait(timeout=10)
        ck.ok(rc == 0, "SIGTERM: exit %d" % rc)
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
