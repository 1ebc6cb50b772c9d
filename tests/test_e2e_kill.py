"""tests/test_e2e_kill.py: kill -9 of a real worker mid-stream. Every request still gets exactly one final within
its deadline (the dead worker's streams end with error worker_failed within about 3 s of the kill); the other
worker keeps serving (its streams finish with llama2.c's golden ids); a restarted worker registers again and
takes work. An injected engine fault (--debug-fail-at-step) makes a worker log the step and rids and exit 3, with
the same outcome for its requests. Workers are paced with --debug-step-delay-ms so that streams last a few seconds."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import Checks, Cluster, Tracker, check_fault_finals, golden_ids, golden_req, watchdog  # noqa: E402

DETECT_S = 3.0 + 1.0   # the broker's detection bound plus scheduling slack on a loaded CI machine


def main():
    watchdog(80)
    ck = Checks("e2e_kill")
    gold = golden_ids()
    cl = Cluster()
    pace = ["--debug-step-delay-ms", "25"]
    try:
        cl.start_broker()
        cl.start_worker("w1", *pace, max_batch=4)
        cl.start_worker("w2", *pace, max_batch=4)
        if not ck.ok(cl.wait_workers(["w1", "w2"], timeout=15) is not None, "2 workers registered"):
            return ck.report()
        c = cl.client()
        t = Tracker(c)
        ids = [t.submit("k%d" % i, deadline_ms=30000, **golden_req(gold, 5 * i, 150)) for i in range(8)]
        ck.ok(t.pump(10, lambda tr: tr.all_streaming(ids, 3)), "all 8 requests streaming before the kill")
        t_kill = time.monotonic()
        cl.kill("w1", signal.SIGKILL)
        t.pump(25, lambda tr: tr.all_final(ids))
        errors, ok = check_fault_finals(ck, t, ids, gold, 5, 150, t_kill, DETECT_S, "kill")
        ck.ok(errors >= 1 and ok >= 1, "the killed worker's streams failed (%d), the others completed (%d)" % (
            errors, ok))
        st = cl.status()
        alive = {w["name"]: w.get("alive") for w in st.get("workers", [])}
        ck.ok(alive.get("w2") and not alive.get("w1"), "status: w1 dead or gone, w2 alive: %s" % alive)
        ck.ok(st.get("ready") is True, "broker still ready")
        # the survivor keeps serving
        t2 = Tracker(c)
        ids2 = [t2.submit("s%d" % i, deadline_ms=20000, **golden_req(gold, 3 * i, 20)) for i in range(4)]
        t2.pump(15, lambda tr: tr.all_final(ids2))
        for i, rid in enumerate(ids2):
            r = t2.r[rid]
            ck.ok(r["finals"] and r["finals"][0].get("finish") == "length" and r["ids"] == gold[3 * i:3 * i + 20],
                  "%s: served by the surviving worker" % rid)
        # a restarted worker registers again and takes work
        cl.start_worker("w1", *pace, max_batch=4)
        ck.ok(cl.wait_workers(["w1", "w2"], timeout=10) is not None, "restarted w1 registered again")
        t3 = Tracker(c)
        ids3 = [t3.submit("r%d" % i, deadline_ms=20000, **golden_req(gold, 2 * i, 30)) for i in range(8)]
        t3.pump(20, lambda tr: tr.all_final(ids3))
        good = sum(1 for i, rid in enumerate(ids3) if t3.r[rid]["finals"] and
                   t3.r[rid]["finals"][0].get("finish") == "length" and t3.r[rid]["ids"] == gold[2 * i:2 * i + 30])
        ck.ok(good == 8, "%d of 8 requests after the restart completed with golden ids" % good)
        st = cl.status()
        w1 = [w for w in st.get("workers", []) if w["name"] == "w1" and w.get("alive")]
        ck.ok(w1 and w1[0].get("step", 0) > 0, "the restarted w1 ran steps: %s" % w1)
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    test_engine_fault(ck, gold)
    return ck.report()


def test_engine_fault(ck, gold):
    """An engine (device) error: the worker logs the step and its rids, exits 3, and the broker ends or requeues
    its requests like any other worker death; the healthy worker keeps serving."""
    cl = Cluster()
    try:
        cl.start_broker()
        wf = cl.start_worker("wf", "--debug-step-delay-ms", "25", "--debug-fail-at-step", "20", max_batch=4)
        cl.start_worker("wh", "--debug-step-delay-ms", "25", max_batch=4)
        if not ck.ok(cl.wait_workers(["wf", "wh"], timeout=15) is not None, "2 workers registered"):
            return
        c = cl.client()
        t = Tracker(c)
        ids = [t.submit("f%d" % i, deadline_ms=30000, **golden_req(gold, 3 * i, 80)) for i in range(8)]
        t.pump(25, lambda tr: tr.all_final(ids))
        try:
            rc = wf.wait(timeout=5)
        except Exception:
            rc = None
        ck.ok(rc == 3, "worker with an engine fault exits 3 (rc %s)" % rc)
        with open([x for x in cl.logs if "/wf." in x][0], "rb") as f:
            log = f.read().decode(errors="replace")
        ck.ok("FATAL engine error at step 20" in log and "rids" in log, "fault logged with its step and rids")
        errors = ok = 0
        for i, rid in enumerate(ids):
            r = t.r[rid]
            if not ck.ok(len(r["finals"]) == 1 and r["after"] == 0, "%s: exactly one final" % rid):
                continue
            f = r["finals"][0]
            if f.get("finish") == "error":
                errors += 1
                ck.ok(f.get("code") == "worker_failed", "%s: code %s" % (rid, f.get("code")))
            else:
                ok += 1
                ck.ok(f.get("finish") == "length" and r["ids"] == gold[3 * i:3 * i + 80], "%s: golden ids" % rid)
        ck.ok(errors >= 1 and ok >= 1, "faulty worker's streams failed (%d), the others completed (%d)" % (errors, ok))
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()


if __name__ == "__main__":
    sys.exit(main())
