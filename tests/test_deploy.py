"""tests/test_deploy.py: zllm-deploy (deploy/main_zllm-deploy.c, docs/deploy.md) end to end on the CPU.

A layout of one broker, 2 replicas and one 2-stage pipeline group (stories260K, 1 thread each) is started by
zllm-deploy: concurrent requests all get exactly one final with llama2.c's golden ids and both replicas get
load (the broker's per-worker step counters); kill -9 of a replica -> zllm-deploy restarts it and it serves
again; kill -9 of stage 1 of the group -> the whole group is restarted (the surviving leader is stopped, both
stages start again) and serves again; SIGTERM to zllm-deploy -> exit 0, every child gone, the group's
/dev/shm segment removed. Malformed layouts -> exit 2 with a line-numbered message, nothing started."""
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, STORIES, Checks, Tracker, golden_ids, golden_req, watchdog  # noqa: E402
import zllm  # noqa: E402

DEPLOY = os.path.join(BIN, "zllm-deploy")
ck = Checks("deploy")
watchdog(120)
tmp = tempfile.mkdtemp(prefix="zllm-deploy-test-", dir="/tmp")
tag = "t%d" % os.getpid()   # unit names are unique per test run: the shm group is /dev/shm/zllm-<tag>p-0.UID.*
procs = []


def run_check(text, name):
    """zllm-deploy on a layout text; returns (rc, stdout, stderr, rundir)"""
    path = os.path.join(tmp, name + ".layout")
    rundir = os.path.join(tmp, name + ".run")
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run([DEPLOY, "--run-dir", rundir, path], capture_output=True, timeout=10)
    return r.returncode, r.stdout.decode(), r.stderr.decode(), rundir


# ---- malformed layouts: exit 2, PATH:LINE: message, nothing started or created
good_head = "broker clients=ipc://%s/c workers=ipc://%s/w\nmodel stories=%s\n" % (tmp, tmp, STORIES)
bad = [
    ("unknown directive", good_head + "replca model=stories\n", 3, "unknown directive 'replca'"),
    ("unknown attribute", good_head + "replica model=stories gpus=2\n", 3, "unknown attribute 'gpus'"),
    ("undefined model", good_head + "replica model=llama\n", 3, "model 'llama' is not defined"),
    ("device count", good_head + "replica model=stories replicas=2 stages=2 devices=cuda:0..2\n", 3,
     "3 devices for 2 replica(s) x 2 stage(s)"),
    ("bad range", good_head + "replica model=stories devices=cuda:3..1\n", 3, "bad range"),
    ("unterminated quote", good_head + "\nreplica model=stories args=\"--threads 1\n", 4, "unterminated quote"),
    ("missing model file", "broker clients=ipc://%s/c workers=ipc://%s/w\n# c\nmodel m=/nonexistent/x.gguf\n"
     % (tmp, tmp), 3, "/nonexistent/x.gguf"),
    ("bad endpoint", "broker clients=http://x workers=ipc://%s/w\n" % tmp, 1, "not a tcp://"),
    ("two brokers", good_head + good_head, 3, "a second 'broker' line"),
    ("curve-workers without keys", "model stories=%s\nbroker clients=ipc://%s/c workers=tcp://127.0.0.1:1 "
     "curve-workers=yes\n" % (STORIES, tmp), 2, "curve-workers=yes needs curve-secret"),
    ("replicas=0", good_head + "replica model=stories replicas=0\n", 3, "bad replicas=0"),
]
for i, (what, text, line, msg) in enumerate(bad):
    rc, out, err, rundir = run_check(text, "bad%d" % i)
    ck.ok(rc == 2, "%s: exit 2 (got %d, %r)" % (what, rc, err))
    ck.ok(":%d: " % line in err and msg in err, "%s: message names line %d and says %r: %r" % (what, line, msg, err))
    ck.ok(not os.path.exists(rundir) and out == "", "%s: nothing started (no run directory, no output)" % what)

# ---- the deployment (the broker routes by free slots, --route load: the golden prompts share prefixes, and cache
# routing may keep all of them on the replicas that hold them, leaving the group without load to show)
rundir = os.path.join(tmp, "run")
layout = os.path.join(tmp, "layout")
with open(layout, "w") as f:
    f.write("""# 2 replicas and a 2-stage pipeline group behind one broker
rundir %s
broker clients=ipc://{rundir}/clients workers=ipc://{rundir}/workers args="-v --heartbeat-ms 200 --dead-ms 3000 --route load"
model stories=%s
replica model=stories replicas=2 name=%sr args="--max-batch 2 --threads 1 --heartbeat-ms 200"
replica model=stories stages=2 name=%sp args="--max-batch 2 --threads 1 --heartbeat-ms 200"
restart limit=3 window=60 backoff-ms=100..1000
stop timeout=5
""" % (rundir, STORIES, tag, tag))
r0, r1, grp = tag + "r-0", tag + "r-1", tag + "p-0"
shm = "/dev/shm/zllm-%s.%d.*" % (grp, os.geteuid())   # the group's segment, any generation (shmring.h)

rc = subprocess.run([DEPLOY, "--check", layout], capture_output=True, timeout=10)
chk = rc.stdout.decode()
ck.ok(rc.returncode == 0, "--check exit 0: %r" % rc.stderr)
ck.ok(("--stage 1/2 --group %s " % grp) in chk and ("--name %s " % r1) in chk and "--curve" not in chk,
      "--check prints the expanded command lines: %r" % chk)
ck.ok(not os.path.exists(rundir), "--check starts nothing")

sup_log = os.path.join(tmp, "supervisor.out")
sup = subprocess.Popen([DEPLOY, layout], stdout=open(sup_log, "w"), stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL)
procs.append(sup)


def sup_text():
    with open(sup_log) as f:
        return f.read()


def pids_of(name):
    """pids zllm-deploy reported starting for the process name, in order"""
    return [int(p) for p in re.findall(r"start %s pid (\d+)" % re.escape(name), sup_text())]


def all_pids():
    return [int(p) for p in re.findall(r" start \S+ pid (\d+)", sup_text())]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive: zllm-deploy reaps its children
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


clients = "ipc://%s/clients" % rundir


def status():
    try:
        with zllm.Client(clients) as c:
            return c.status(timeout=1.0)
    except zllm.ZllmError:
        return None


def sup_exited():
    """True (after printing its output's tail) when zllm-deploy has exited: nothing to wait for then"""
    if sup.poll() is None:
        return False
    print("zllm-deploy exited (rc %s):\n%s" % (sup.returncode, sup_text()[-3000:]), flush=True)
    return True


def wait_alive(names, timeout, newer_than=None):
    """until the broker lists every name alive (and, for newer_than {name: step}, re-registered: any entry)"""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not sup_exited():
        st = status()
        if st:
            have = {}
            for w in st.get("workers", []):
                if w.get("alive"):
                    have[w["name"]] = w
            if all(n in have for n in names):
                return st
        time.sleep(0.1)
    return None


def registrations(logname):
    try:
        with open(os.path.join(rundir, logname + ".log")) as f:
            return f.read().count("registered (broker heartbeat")
    except OSError:
        return 0


def wait_reregistered(name, logname, n, timeout):
    """until the process log shows its n-th registration and the broker lists one entry of that name, alive
    (the killed process's entry is gone: the broker declared it dead)"""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not sup_exited():
        st = status()
        if st and registrations(logname) >= n:
            entries = [w for w in st.get("workers", []) if w["name"] == name]
            if len(entries) == 1 and entries[0].get("alive"):
                return st
        time.sleep(0.1)
    return None


def steps(st):
    return {w["name"]: w.get("step", 0) for w in (st or {}).get("workers", []) if w.get("alive")}


gold = golden_ids()


def serve(n, mt, what):
    """n concurrent golden requests; every one must get exactly one final with the golden ids"""
    with zllm.Client(clients) as c:
        t = Tracker(c)
        ids = [t.submit("%s-%d" % (what, i), **golden_req(gold, 3 * i, mt)) for i in range(n)]
        t.pump(25, until=lambda tr: tr.all_final(ids))
        t.pump(0.3)
        good = 0
        for i, rid in enumerate(ids):
            r = t.r[rid]
            if len(r["finals"]) == 1 and r["after"] == 0 and r["finals"][0].get("finish") == "length" and \
                    r["ids"] == gold[3 * i:3 * i + mt]:
                good += 1
        ck.ok(good == n, "%s: %d of %d requests got one final with the golden ids" % (what, good, n))


st = wait_alive([r0, r1, grp], 20)
ck.ok(st is not None, "broker lists both replicas and the group alive")
if st is None:
    print(sup_text())
serve(12, 24, "first")
st = status()
s = steps(st)
ck.ok(s.get(r0, 0) > 0 and s.get(r1, 0) > 0, "both replicas got load: steps %r" % s)
ck.ok(s.get(grp, 0) > 0, "the pipeline group got load: steps %r" % s)

# ---- kill -9 of a replica: restarted, serves again
old = pids_of(r0)
ck.ok(len(old) == 1, "one start of %s so far: %r" % (r0, old))
if old:
    os.kill(old[-1], signal.SIGKILL)
end = time.monotonic() + 15
while time.monotonic() < end and len(pids_of(r0)) < 2 and not sup_exited():
    time.sleep(0.1)
new = pids_of(r0)
ck.ok(len(new) == 2 and alive(new[-1]), "%s restarted: pids %r" % (r0, new))
ck.ok(re.search(r"exit %s pid \d+: killed by signal 9" % re.escape(r0), sup_text()) and
      re.search(r"restart %s in \d+ ms" % re.escape(r0), sup_text()), "supervisor logged the exit and restart")
# the new process registers under the same name; its step counter starts again at 0
st = wait_reregistered(r0, r0, 2, 15)
ck.ok(st is not None, "restarted replica registered, the killed one is gone from the broker")
before = steps(status())
serve(12, 24, "after-replica-kill")
after = steps(status())
ck.ok(after.get(r0, 0) > 0, "the restarted replica serves: steps before %r after %r" % (before, after))

# ---- kill -9 of stage 1 of the group: the whole group restarts
s0, s1 = pids_of(grp + ".s0"), pids_of(grp + ".s1")
ck.ok(len(s0) == 1 and len(s1) == 1, "one start of each stage so far: %r %r" % (s0, s1))
if s1:
    os.kill(s1[-1], signal.SIGKILL)
end = time.monotonic() + 15
while time.monotonic() < end and (len(pids_of(grp + ".s0")) < 2 or len(pids_of(grp + ".s1")) < 2) and \
        not sup_exited():
    time.sleep(0.1)
s0n, s1n = pids_of(grp + ".s0"), pids_of(grp + ".s1")
ck.ok(len(s0n) == 2 and len(s1n) == 2, "both stages started again: %r %r" % (s0n, s1n))
ck.ok(s0 and not alive(s0[0]), "the old leader was stopped")
ck.ok("group %s: stage 1 gone" % grp in sup_text(), "supervisor logged the group restart")
st = wait_reregistered(grp, grp + ".s0", 2, 20)
ck.ok(st is not None, "restarted group registered, the failed one is gone from the broker")
serve(12, 24, "after-stage-kill")
ck.ok(steps(status()).get(grp, 0) > 0, "the restarted group serves: %r" % steps(status()))
ck.ok(glob.glob(shm), "the group's shm segment exists while it runs: %s" % shm)

# ---- SIGTERM: everything stops, exit 0, no shm left
children = all_pids()
sup.send_signal(signal.SIGTERM)
try:
    rc = sup.wait(timeout=20)
except subprocess.TimeoutExpired:
    rc = None
ck.ok(rc == 0, "zllm-deploy exits 0 on SIGTERM (got %r)" % rc)
left = [p for p in children if alive(p)]
ck.ok(len(children) >= 7 and not left, "every child gone (%d started, alive: %r)" % (len(children), left))
ck.ok(not glob.glob(shm), "no %s left" % shm)
ck.ok(re.search(r"stopped \(exit 0\)", sup_text()), "supervisor logged the stop")
for n in (r0, r1, grp + ".s0"):
    try:
        with open(os.path.join(rundir, n + ".log")) as f:
            log = f.read()
    except OSError:
        log = ""
    ck.ok("---- zllm-deploy: starting" in log and "stopping" in log, "%s.log has the start header and a clean stop" % n)

if ck.failed:
    print(sup_text())

# ---- the supervisor links no CUDA library (forked workers start with a clean process)
ldd = subprocess.run(["ldd", DEPLOY], capture_output=True).stdout.decode()
ck.ok(ldd and not re.search(r"cuda|cublas", ldd), "zllm-deploy links no CUDA library: %r" % ldd)

# ---- a worker that keeps failing: restarted with backoff up to the limit, then everything stops, exit 1
junk = os.path.join(tmp, "junk.gguf")
with open(junk, "w") as f:
    f.write("not a gguf file\n")
rc, out, err, _ = run_check("connect ipc://%s/nobody\nmodel junk=%s\nreplica model=junk\n"
                            "restart limit=2 window=60 backoff-ms=50..80\n" % (tmp, junk), "limit")
ck.ok(rc == 1, "restart limit exceeded: exit 1 (got %d)" % rc)
ck.ok(len(re.findall(r"start junk-0 pid", out)) == 3 and "restart junk-0 in 50 ms" in out and
      "restart junk-0 in 80 ms" in out and "giving up" in out, "3 starts, backoff 50 then 80 ms, gives up: %r" % out)

# ---- a worker with bad arguments (exit 2): not restarted, exit 1
rc, out, err, _ = run_check("connect ipc://%s/nobody\nmodel stories=%s\nreplica model=stories args=\"--bogus 1\"\n"
                            % (tmp, STORIES), "usage")
ck.ok(rc == 1 and len(re.findall(r"start stories-0 pid", out)) == 1 and "not restarting" in out,
      "exit status 2 of a worker: no restart, exit 1: rc %d %r" % (rc, out))

# ---- kill -9 of zllm-deploy: its children follow (PR_SET_PDEATHSIG); a second one on the same run dir is refused
lay2 = os.path.join(tmp, "small.layout")
run2 = os.path.join(tmp, "run2")
with open(lay2, "w") as f:
    f.write("broker clients=ipc://{rundir}/c workers=ipc://{rundir}/w\nmodel stories=%s\n"
            "replica model=stories args=\"--max-batch 1 --threads 1\"\n" % STORIES)
log2 = os.path.join(tmp, "small.out")
sup2 = subprocess.Popen([DEPLOY, "--run-dir", run2, lay2], stdout=open(log2, "w"), stderr=subprocess.STDOUT)
procs.append(sup2)
end = time.monotonic() + 10
kids = []
while time.monotonic() < end and len(kids) < 2 and sup2.poll() is None:
    with open(log2) as f:
        kids = [int(p) for p in re.findall(r" start \S+ pid (\d+)", f.read())]
    time.sleep(0.05)
r = subprocess.run([DEPLOY, "--run-dir", run2, lay2], capture_output=True, timeout=10)
ck.ok(r.returncode == 1 and b"another zllm-deploy runs here" in r.stderr, "a second supervisor on the same run "
      "directory is refused: %r" % r.stderr)
sup2.kill()
sup2.wait()
end = time.monotonic() + 5
while time.monotonic() < end and any(alive(p) for p in kids):
    time.sleep(0.05)
ck.ok(len(kids) == 2 and not any(os.path.exists("/proc/%d" % p) and alive(p) for p in kids),
      "children of a SIGKILLed zllm-deploy exit: %r" % kids)
for p in kids:   # not ours to reap (reparented): make sure they are gone
    try:
        os.kill(p, signal.SIGKILL)
    except ProcessLookupError:
        pass

for p in procs:
    if p.poll() is None:
        p.kill()
        p.wait()
subprocess.run(["rm", "-rf", tmp])
sys.exit(ck.report())
