"""tests/test_cli.py: the `zllm` command refuses nonsense, and every binary answers --help and --version.

- Refusals: each bad value of each numeric option (range ends, signs, junk, NaN), -p with --tokens, a ninth
  --stop, bad token lists, options of another subcommand: exit 2, nothing sent, a message naming the option.
- --help and --version of every binary built from */main_*.c (full usage on stdout with every option the parser
  compares against, exit 0; `NAME VERSION` with the version of common/version.h), also after each subcommand.
- The wire: a Python ROUTER socket stands in for the broker and reads the `generate` the command sends: every
  sampling field, both --stop strings as a list in order, --stop-ids accumulated.
- A real broker and CPU worker (stories260K): two --stop strings in either order end the text before the
  earlier one; SIGINT to a streaming `zllm generate` cancels it with `zllm: interrupted: request cancelled after
  N tokens` and exit 130; a broker with no worker makes the command say `zllm: waiting for a worker for model X`.
Prints "N passed, N failed"."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, ROOT, Checks, Cluster, golden_ids, watchdog  # noqa: E402

import msgpack  # noqa: E402
import zmq  # noqa: E402

ZLLM = os.path.join(BIN, "zllm")


def version():
    with open(os.path.join(ROOT, "common", "version.h")) as f:
        return re.search(r'#define ZLLM_VERSION "([^"]+)"', f.read()).group(1)


def run(args, timeout=20, **kw):
    """runs zllm; a run past timeout counts as exit -1 (a check then fails; the test goes on)"""
    try:
        return subprocess.run([ZLLM] + args, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, e.stdout or "", e.stderr or "")


# (subcommand, option, bad values); every option's value must be refused with exit 2 before anything is sent
BAD = [
    ("generate", "-n", ["0", "-5", "1048577", "5x", "", "1.5", " 5", "+5"]),
    ("generate", "--max-tokens", ["0", "-1"]),
    ("generate", "--temp", ["-0.1", "101", "nan", "inf", "abc", ""]),
    ("generate", "--top-k", ["-3", "2147483648", "1.5", "x"]),
    ("generate", "--top-p", ["0", "-0.1", "1.01", "nan"]),
    ("generate", "--min-p", ["-0.1", "1", "0.99999999", "x"]),
    ("generate", "--repeat-penalty", ["0", "-1", "100.5", "inf"]),
    ("generate", "--repeat-last-n", ["-1", "1048577", "x"]),
    ("generate", "--seed", ["-1", "18446744073709551616", "1e3", "x"]),
    ("generate", "--deadline-ms", ["0", "86400001", "-1"]),
    ("generate", "--priority", ["101", "-101", "1.5", "x", ""]),
    ("generate", "--stop-ids", ["x", "-1", "2147483648", ""]),
    ("chat", "-n", ["0", "-5"]),
    ("chat", "--top-k", ["-3"]),
    ("bench", "-N", ["0", "-1", "1000001", "x"]),
    ("bench", "-c", ["0", "65537"]),
    ("bench", "--vocab", ["3", "-1"]),
    ("bench", "--bench-seed", ["-1", "x"]),
    ("bench", "--ramp-ms", ["-1", "x", "3600001"]),
    ("bench", "--prompt-len", ["0", "5:2", "a", "3:", "1:1000001"]),
    ("bench", "--out-len", ["0:3", "-1"]),
    ("bench", "--temp", ["-1"]),
]


def check_refusals(ck):
    ep = "ipc:///tmp/zllm-test-cli-nobody-%d" % os.getpid()
    for cmd, opt, values in BAD:
        for v in values:
            args = [cmd, "--broker", ep, opt, v] + (["-p", "x"] if cmd == "generate" else [])
            p = run(args, timeout=8)
            ck.ok(p.returncode == 2 and opt in p.stderr and ("expected" in p.stderr) and p.stdout == "",
                  "zllm %s %s %r: exit %d, %r" % (cmd, opt, v, p.returncode, p.stderr.strip()))
    many = ",".join(["1"] * 4097)
    other = [
        (["generate", "-p", "x", "--tokens", "1,2"], "--tokens"),
        (["generate", "--tokens", "1,2", "-p", "x"], "--tokens"),
        (["generate", "--tokens", "1,a"], "--tokens"),
        (["generate", "--tokens", ""], "--tokens"),
        (["generate", "--tokens", "-1"], "--tokens"),
        (["generate", "--tokens", many], "--tokens"),
        (["generate", "--tokens", "1", "--chat"], "--chat"),
        (["generate", "-p", "x"] + sum([["--stop", "s%d" % i] for i in range(9)], []), "--stop"),
        (["generate", "-p", "x", "--stop", ""], "--stop"),
        (["generate", "-p", "x", "--stop", "y" * 257], "--stop"),
        (["generate", "-p", "x"] + sum([["--stop-ids", ",".join(["5"] * 33)] for _ in range(2)], []), "--stop-ids"),
        (["generate"], "-p"),
        (["generate", "-p"], "-p"),
        (["generate", "-p", "x", "--frob", "1"], "--frob"),
        (["status", "-n", "3"], "-n"),
        (["status", "--stop", "x"], "--stop"),
        (["chat", "--tokens", "1"], "--tokens"),
        (["bench", "-p", "x"], "-p"),
        (["frob"], "frob"),
    ]
    for args, what in other:
        p = run(args[:1] + ["--broker", ep] + args[1:], timeout=8)
        ck.ok(p.returncode == 2 and what in p.stderr and p.stdout == "",
              "zllm %s: exit %d, %r" % (" ".join(args)[:80], p.returncode, p.stderr.strip()[:200]))
    p = subprocess.run([ZLLM], capture_output=True, text=True, timeout=5)
    ck.ok(p.returncode == 2 and "usage:" in p.stderr, "zllm alone: usage on stderr, exit 2")


def parser_options(src):
    """the option strings a main compares its arguments against"""
    with open(src) as f:
        text = f.read()
    opts = set(re.findall(r'strcmp\(\s*\w+(?:\[\w+\])?\s*,\s*"(-{1,2}[A-Za-z][\w-]*)"\s*\)', text))
    opts |= set(re.findall(r'FLAG\("(-{1,2}[A-Za-z][\w-]*)"', text))
    for name, alias in re.findall(r'\{"(-{1,2}[A-Za-z][\w-]*)",\s*(?:"(-{1,2}[A-Za-z][\w-]*)"|NULL)', text):
        opts.add(name)
        if alias:
            opts.add(alias)
    return opts


def check_help_version(ck):
    ver = version()
    mains = []
    for d in sorted(os.listdir(ROOT)):
        full = os.path.join(ROOT, d)
        if os.path.isdir(full) and not d.startswith((".", "build")):
            mains += [os.path.join(full, f) for f in sorted(os.listdir(full)) if re.match(r"main_.*\.c$", f)]
    ck.ok(len(mains) >= 13, "%d binaries found (zllm, broker, worker and the tools)" % len(mains))
    for src in mains:
        name = os.path.basename(src)[5:-2]
        exe = os.path.join(BIN, name)
        if not ck.ok(os.path.exists(exe), "%s is built" % exe):
            continue
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        ck.ok(p.returncode == 0 and p.stdout == "%s %s\n" % (name, ver),
              "%s --version: exit %d, %r" % (name, p.returncode, p.stdout))
        for h in ("--help", "-h"):
            p = subprocess.run([exe, h], capture_output=True, text=True, timeout=10)
            ck.ok(p.returncode == 0 and p.stdout.startswith("usage: ") and "--version" in p.stdout and
                  re.search(r"environment", p.stdout, re.I),
                  "%s %s: usage on stdout with --version and the environment, exit %d" % (name, h, p.returncode))
        missing = sorted(o for o in parser_options(src) if o not in p.stdout)
        ck.ok(not missing, "%s --help names every option it parses (missing %s)" % (name, missing))
    for cmd in ("generate", "chat", "status", "bench"):
        for h in ("--help", "-h"):
            p = run([cmd, h], timeout=5)
            ck.ok(p.returncode == 0 and "--min-p" in p.stdout and "--repeat-penalty" in p.stdout and
                  "ZLLM_VERBOSE" in p.stdout and "ZLLM_BROKER" in p.stdout and "needs a value" not in p.stderr,
                  "zllm %s %s: the full usage, exit %d, %r" % (cmd, h, p.returncode, p.stderr[:100]))
        p = run([cmd, "-n", "0", "--help"], timeout=5)
        ck.ok(p.returncode == 0 and "usage:" in p.stdout, "zllm %s --help wins over a bad value before it" % cmd)
        p = run([cmd, "--version"], timeout=5)
        ck.ok(p.returncode == 0 and p.stdout == "zllm %s\n" % ver, "zllm %s --version: %r" % (cmd, p.stdout))


def check_wire(ck):
    """a ROUTER socket in place of the broker: the generate map the command sends"""
    ctx = zmq.Context.instance()
    ep = "ipc:///tmp/zllm-test-cli-wire-%d" % os.getpid()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(ep)
    try:
        cases = [
            (["generate", "-p", "hello", "-n", "7", "--temp", "0.5", "--top-k", "3", "--top-p", "0.9", "--min-p",
              "0.05", "--repeat-penalty", "1.3", "--repeat-last-n", "32", "--seed", "18446744073709551615",
              "--stop", "first", "--stop", "second stop", "--stop-ids", "5,6", "--stop-ids", "7", "--deadline-ms",
              "9000", "--model", "stories", "--special", "--no-bos", "--ignore-eos", "--priority", "-7"],
             {"prompt": "hello", "max_tokens": 7, "top_k": 3, "repeat_last_n": 32, "seed": 18446744073709551615,
              "stop": ["first", "second stop"], "stop_ids": [5, 6, 7], "deadline_ms": 9000, "model": "stories",
              "special": True, "add_bos": False, "ignore_eos": True, "stream": True, "priority": -7},
             {"temperature": 0.5, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.3}),
            (["generate", "--tokens", "1,2,3", "--stop", "b", "--stop", "a", "--no-stream"],
             {"tokens": [1, 2, 3], "stop": ["b", "a"], "stream": False}, {}),
            (["chat", "--bos", "--system", "be brief", "-n", "3"], {"add_bos": True, "max_tokens": 3,
              "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}, {}),
            (["generate", "-p", "x"] + sum([["--stop", "s%d" % i] for i in range(8)], []),
             {"stop": ["s%d" % i for i in range(8)]}, {}),
            (["generate", "-p", "x"], {"max_tokens": 128}, {}),
        ]
        for args, want, approx in cases:
            p = subprocess.Popen([ZLLM] + args[:1] + ["--broker", ep] + args[1:], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
            if args[0] == "chat":
                p.stdin.write("hi\n")
            p.stdin.close()
            p.stdin = None   # communicate() below must not touch it
            got = None
            if sock.poll(5000):
                frames = sock.recv_multipart()
                got = msgpack.unpackb(frames[1], raw=False)
                reply = {"zllm": 1, "type": "final", "id": got.get("id"), "finish": "stop", "text": "ok",
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
                sock.send_multipart([frames[0], msgpack.packb(reply, use_bin_type=True)])
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            if not ck.ok(got is not None and got.get("type") == "generate", "%s: a generate arrived" % args[:4]):
                continue
            bad = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
            bad.update({k: got.get(k) for k, v in approx.items() if abs((got.get(k) or -9) - v) > 1e-6})
            ck.ok(not bad, "%s: fields as given (differ: %s)" % (" ".join(args)[:60], bad))
            ck.ok(p.returncode == 0 and out == "ok\n", "%s: the final's text, exit %d %r" % (args[:3], p.returncode, err))
        # absent options: the protocol's defaults, and no field where the broker chooses
        defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
                    "repeat_last_n": 64, "stream": True, "deadline_ms": 600000}
        ck.ok(all(got.get(k) == v for k, v in defaults.items()) and
              all(k not in got for k in ("seed", "stop", "stop_ids", "add_bos", "model")),
              "no option: the protocol's defaults (%s)" % got)
    finally:
        sock.close(0)


def text_of(args, cl):
    p = run(["generate", "--broker", cl.clients_ep] + args, timeout=30)
    return p


def check_live(ck):
    gold = golden_ids()
    cl = Cluster(model_name="stories")
    try:
        cl.start_broker()
        cl.start_worker("w1", "--debug-step-delay-ms", "20", max_batch=4)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "worker registered"):
            cl.dump_logs()
            return
        base = ["--tokens", "1", "-n", "80", "--temp", "0", "--ignore-eos"]
        p = text_of(base, cl)
        full = p.stdout.rstrip("\n")
        ck.ok(p.returncode == 0 and len(full) > 100 and "waiting for a worker" not in p.stderr,
              "plain run: exit %d, %d chars, no waiting notice" % (p.returncode, len(full)))
        words = full.split()
        early, late = words[3], words[-4]
        cut = full.index(early)
        ck.ok(cut < full.index(late), "the stop words appear in order (%r before %r)" % (early, late))
        for order in ((early, late), (late, early)):
            p = text_of(base + ["--stop", order[0], "--stop", order[1]], cl)
            ck.ok(p.returncode == 0 and p.stdout.rstrip("\n") == full[:cut],
                  "--stop %r --stop %r: the text ends before %r (exit %d, %r)" % (
                      order[0], order[1], early, p.returncode, p.stdout[-40:]))
        p = run(["generate", "--broker", cl.clients_ep, "--tokens", "1", "-n", "20", "--temp", "0", "--ignore-eos",
                 "--ids", "--min-p", "0.0", "--repeat-penalty", "1", "--top-k", "0"], timeout=30)
        ck.ok(p.returncode == 0 and [int(x) for x in p.stdout.split()] == gold[:20],
              "off values of the new options keep the golden greedy ids (exit %d)" % p.returncode)
        # Ctrl-C: SIGINT once some text streamed
        proc = subprocess.Popen([ZLLM, "generate", "--broker", cl.clients_ep, "--tokens", "1", "-n", "400",
                                 "--temp", "0", "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.read(20)
        t_int = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err = err.decode("utf-8", "replace")
        m = re.search(r"zllm: interrupted: request cancelled after (\d+) tokens", err)
        ck.ok(len(first) == 20 and m is not None and 0 < int(m.group(1)) < 400,
              "SIGINT: %r" % err.strip())
        ck.ok(proc.returncode == 130 and time.monotonic() - t_int < 5,
              "SIGINT: exit %s within %.1f s" % (proc.returncode, time.monotonic() - t_int))
        ck.ok("cancelled : " not in err, "SIGINT: no empty code/message")
    finally:
        cl.close()
    # a broker with no worker: the waiting notice, then the deadline
    cl = Cluster(model_name="stories")
    try:
        cl.start_broker()
        t0 = time.monotonic()
        p = run(["generate", "--broker", cl.clients_ep, "-p", "Once", "--deadline-ms", "4000"], timeout=30)
        lines = [x for x in p.stderr.splitlines() if "waiting for a worker" in x]
        ck.ok(lines == ["zllm: waiting for a worker for model stories"],
              "no worker: the waiting notice once (%r)" % p.stderr.strip())
        ck.ok(p.returncode == 1 and time.monotonic() - t0 < 15, "no worker: exit %d at the deadline" % p.returncode)
        p = run(["generate", "--broker", cl.clients_ep, "-p", "Once", "--model", "stories", "--deadline-ms", "2500"],
                timeout=30)
        ck.ok("zllm: waiting for a worker for model stories" in p.stderr, "--model stories: the notice names it")
        p = run(["generate", "--broker", cl.clients_ep, "-p", "Once", "--deadline-ms", "1000"], timeout=30)
        ck.ok("waiting for a worker" not in p.stderr, "a request that ends before the notice is due: no notice")
    finally:
        cl.close()


def main():
    watchdog(240)
    ck = Checks("cli")
    if not ck.ok(os.path.exists(ZLLM), "%s is built" % ZLLM):
        return ck.report()
    check_refusals(ck)
    check_help_version(ck)
    check_wire(ck)
    check_live(ck)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
