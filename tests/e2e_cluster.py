"""tests/e2e_cluster.py: helpers for the end-to-end tests (tests/test_e2e_*.py): start a real zllm-broker and
zllm-workers on ipc:// endpoints in a private temporary folder, wait for readiness, kill/stop/continue
processes, and count checks. Every wait is bounded; every process started here is killed at exit (by its pid).
Not a test itself (run.sh only runs tests/test_*)."""
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import zllm  # noqa: E402
import fixtures  # noqa: E402

BUILD = os.environ.get("ZLLM_BUILD", "build")
BIN = os.path.join(ROOT, BUILD, "bin") if not os.path.isabs(BUILD) else os.path.join(BUILD, "bin")
FIXTURES = fixtures.root()
STORIES = os.path.join(FIXTURES, "stories260K", "stories260K.gguf")   # Cluster checks its model is there
# the workers' device: cpu in CI; ZLLM_E2E_DEVICE=cuda runs the same tests against the CUDA engine
DEVICE = os.environ.get("ZLLM_E2E_DEVICE", "cpu")
WORKER_ARGS = os.environ.get("ZLLM_E2E_WORKER_ARGS", "").split()  # added to every start_worker (diagnosis)


def golden_ids():
    """llama2.c's 200 greedy ids from BOS; raises unless the file holds exactly 200"""
    p = fixtures.path("stories260K", "golden_greedy_ids.txt")
    with open(p) as f:
        ids = [int(x) for x in f.read().split()]
    if len(ids) != 200:
        raise ValueError("%s: %d ids, expected 200" % (p, len(ids)))
    return ids


def golden_req(gold, k, mt):
    """a greedy request whose prompt is BOS + the first k golden ids: its output must be gold[k:k + mt]"""
    return {"tokens": [1] + gold[:k], "max_tokens": mt, "ignore_eos": True, "temperature": 0}


def check_fault_finals(ck, t, ids, gold, stride, mt, t_fault, detect_s, what):
    """After one of two workers was faulted (killed or stopped) at t_fault while request i (prompt = the first
    stride*i golden ids, mt tokens) streamed: every request has exactly one final and nothing after it; those of
    the faulted worker end `worker_failed` within detect_s of the fault, the others complete with golden ids.
    Returns (errors, completed)."""
    errors = ok = 0
    for i, rid in enumerate(ids):
        r = t.r[rid]
        if not ck.ok(len(r["finals"]) == 1 and r["after"] == 0, "%s: exactly one final (%d, %d after)" % (
                rid, len(r["finals"]), r["after"])):
            continue
        f = r["finals"][0]
        if f.get("finish") == "error":
            errors += 1
            ck.ok(f.get("code") == "worker_failed", "%s: error code %s" % (rid, f.get("code")))
            ck.ok(r["t_final"] - t_fault <= detect_s, "%s: error final %.2f s after the %s" % (
                rid, r["t_final"] - t_fault, what))
        else:
            ok += 1
            ck.ok(f.get("finish") == "length", "%s: finish %s" % (rid, f.get("finish")))
            ck.ok(r["ids"] == gold[stride * i:stride * i + mt],
                  "%s: golden output despite the other worker's %s" % (rid, what))
    return errors, ok


class Checks:
    """CHECK-style counting: ok(cond, msg) prints FAIL lines; report() prints 'N passed, N failed'."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def ok(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s: %s" % (self.name, msg), flush=True)
        return bool(cond)

    def report(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


class Cluster:
    """One broker and any number of workers in a private folder. model: the GGUF file both load."""

    def __init__(self, model=STORIES, model_name="stories"):
        if not os.path.isfile(model) or os.path.getsize(model) == 0:
            raise FileNotFoundError("missing model %s (tests/fetch-fixtures.sh assembles the fixtures)" % model)
        self.dir = tempfile.mkdtemp(prefix="zllm-e2e-", dir="/tmp")
        self.model = model
        self.model_name = model_name
        self.clients_ep = "ipc://%s/clients" % self.dir
        self.workers_ep = "ipc://%s/workers" % self.dir
        self.broker = None
        self.workers = {}
        self.logs = []
        self._n_logs = 0
        atexit.register(self.close)

    def _spawn(self, name, argv):
        self._n_logs += 1
        log = os.path.join(self.dir, "%s.%d.log" % (name, self._n_logs))
        self.logs.append(log)
        f = open(log, "wb")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
        return p

    def start_broker(self, *extra):
        if not os.path.exists(os.path.join(BIN, "zllm-broker")):
            raise RuntimeError("no %s/zllm-broker: build first" % BIN)
        self.broker = self._spawn("broker", [os.path.join(BIN, "zllm-broker"), "--clients", self.clients_ep,
                                             "--workers", self.workers_ep, "--model",
                                             "%s=%s" % (self.model_name, self.model), "-v"] + list(extra))
        return self.broker

    def start_worker(self, name, *extra, max_batch=8, device=None):
        device = device or DEVICE
        p = self._spawn(name, [os.path.join(BIN, "zllm-worker"), "--broker", self.workers_ep, "-m", self.model,
                               "--model-name", self.model_name, "--name", name, "--device", device,
                               "--max-batch", str(max_batch), "--threads", "1"] + list(extra) + WORKER_ARGS)
        self.workers[name] = p
        return p

    def client(self, **kw):
        return zllm.Client(self.clients_ep, **kw)

    def status(self, timeout=2.0):
        with self.client(send_timeout=timeout) as c:   # bounded also while the endpoint does not exist yet
            return c.status(timeout=timeout)

    def exited(self, names=()):
        """The processes among the broker and the workers in names that have exited, as 'name (rc N)' strings."""
        procs = [("broker", self.broker)] + [(n, self.workers.get(n)) for n in names]
        return ["%s (rc %s)" % (n, p.returncode) for n, p in procs if p is not None and p.poll() is not None]

    def wait_workers(self, names, timeout=10.0, need_alive=True):
        """Waits until the broker lists every worker in names as alive; returns the status or None. Gives up at
        once, printing the log tails, when the broker or one of those workers has exited."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            gone = self.exited(names)
            if gone:
                print("wait_workers: exited: %s" % ", ".join(gone), flush=True)
                self.dump_logs()
                return None
            try:
                st = self.status(timeout=1.0)
                have = {w["name"]: w for w in st.get("workers", [])}
                if all(n in have and (have[n].get("alive") or not need_alive) for n in names):
                    return st
            except zllm.ZllmError:
                pass
            time.sleep(0.1)
        return None

    def send_signal(self, name, sig):
        p = self.workers[name] if name != "broker" else self.broker
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)

    def kill(self, name, sig=signal.SIGKILL, wait=5.0):
        p = self.workers.get(name) if name != "broker" else self.broker
        if p is None:
            return None
        if p.poll() is None:
            os.kill(p.pid, sig)
            if sig == signal.SIGSTOP:
                return None
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        return p.returncode

    def dump_logs(self, lines=25):
        for log in self.logs:
            try:
                with open(log, "rb") as f:
                    tail = f.read().decode("utf-8", "replace").splitlines()[-lines:]
            except OSError:
                continue
            print("---- %s" % log)
            for line in tail:
                print("    " + line)

    def close(self):
        procs = list(self.workers.values()) + ([self.broker] if self.broker else [])
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=5)
            except Exception:
                pass
        self.workers = {}
        self.broker = None
        if self.dir and os.path.isdir(self.dir) and not os.environ.get("ZLLM_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)


def watchdog(seconds):
    """Kills the test (and, through atexit, its processes) if it runs longer than seconds."""
    def on_alarm(sig, frame):
        print("FAIL watchdog: test exceeded %d s" % seconds, flush=True)
        raise SystemExit(1)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)


def collect(client, ids, timeout):
    """Reads messages for the given in-flight request ids until each has a final or timeout seconds pass.
    Returns {id: {"ids": [...], "text": str, "finals": [final maps], "tokens_after_final": n, "t_final": s,
    "t_first": s}} (times relative to the call)."""
    t0 = time.monotonic()
    out = {i: {"ids": [], "text": "", "finals": [], "after": 0, "t_final": None, "t_first": None} for i in ids}
    pending = set(ids)
    while pending and time.monotonic() - t0 < timeout:
        m = client.next_message(None, timeout=0.2)
        if m is None or m.get("id") not in out:
            continue
        r = out[m["id"]]
        if r["finals"]:
            r["after"] += 1
        if m["type"] == "token":
            if r["t_first"] is None:
                r["t_first"] = time.monotonic() - t0
            r["ids"] += list(m.get("ids") or [])
            r["text"] += m.get("text") or ""
        elif m["type"] == "final":
            r["finals"].append(m)
            r["text"] += m.get("text") or ""
            if m.get("ids") is not None:
                r["ids"] = list(m["ids"])
            r["t_final"] = time.monotonic() - t0
            pending.discard(m["id"])
    # a little longer, to catch duplicate finals or tokens after a final
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        m = client.next_message(None, timeout=0.1)
        if m is not None and m.get("id") in out:
            out[m["id"]]["after"] += 1
            if m["type"] == "final":
                out[m["id"]]["finals"].append(m)
    return out


class Tracker:
    """Follows many in-flight requests on one Client: submit(), pump(seconds), and per-id state:
    ids, text, finals (list), after (messages after the first final), t_first / t_final (monotonic)."""

    def __init__(self, client):
        self.c = client
        self.r = {}

    def submit(self, id, **kw):
        self.c.submit(id=id, **kw)
        self.r[id] = {"ids": [], "text": "", "finals": [], "after": 0, "t_first": None, "t_final": None,
                      "t_submit": time.monotonic()}
        return id

    def pump(self, seconds, until=None):
        """Reads messages for up to seconds, or until until(self) is true."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if until is not None and until(self):
                return True
            m = self.c.next_message(None, timeout=0.05)
            if m is None or m.get("id") not in self.r:
                continue
            r = self.r[m["id"]]
            now = time.monotonic()
            if r["finals"]:
                r["after"] += 1
            if m["type"] == "token":
                if r["t_first"] is None:
                    r["t_first"] = now
                r["ids"] += list(m.get("ids") or [])
                r["text"] += m.get("text") or ""
            elif m["type"] == "final":
                if not r["finals"]:
                    r["t_final"] = now
                r["finals"].append(m)
                r["text"] += m.get("text") or ""
        return until is not None and until(self)

    def all_final(self, ids=None):
        return all(self.r[i]["finals"] for i in (ids or self.r))

    def all_streaming(self, ids, n=1):
        return all(len(self.r[i]["ids"]) >= n or self.r[i]["finals"] for i in ids)
