"""tests/test_e2e_hang.py: SIGSTOP of a real worker holding work. The broker finds it hung within about 3 s and
ends its streams with exactly one error final each (worker_failed), while the other worker's streams complete
with llama2.c's golden ids. After SIGCONT the frozen worker learns it was forgotten (reregister or broker
silence), drops its stale sequences, registers again and takes new work."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import Checks, Cluster, Tracker, check_fault_finals, golden_ids, golden_req, watchdog  # noqa: E402

DETECT_S = 3.0 + 1.0   # the broker's detection bound plus scheduling slack


def main():
    watchdog(80)
    ck = Checks("e2e_hang")
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
        ids = [t.submit("h%d" % i, deadline_ms=30000, **golden_req(gold, 4 * i, 150)) for i in range(8)]
        ck.ok(t.pump(10, lambda tr: tr.all_streaming(ids, 3)), "all 8 requests streaming before SIGSTOP")
        t_stop = time.monotonic()
        cl.send_signal("w2", signal.SIGSTOP)
        t.pump(25, lambda tr: tr.all_final(ids))
        errors, ok = check_fault_finals(ck, t, ids, gold, 4, 150, t_stop, DETECT_S, "SIGSTOP")
        ck.ok(errors >= 1 and ok >= 1, "hung worker's streams failed (%d), the others completed (%d)" % (errors, ok))
        st = cl.status()
        alive = {w["name"]: w.get("alive") for w in st.get("workers", [])}
        ck.ok(not alive.get("w2") and alive.get("w1"), "status: w2 not alive, w1 alive: %s" % alive)
        # resume it: it must come back as a fresh registration and serve again
        cl.send_signal("w2", signal.SIGCONT)
        st = cl.wait_workers(["w1", "w2"], timeout=10)
        ck.ok(st is not None, "w2 registered again after SIGCONT")
        step0 = max([w.get("step", 0) for w in (st or {}).get("workers", []) if w["name"] == "w2"] or [0])
        t2 = Tracker(c)
        ids2 = [t2.submit("a%d" % i, deadline_ms=20000, **golden_req(gold, 3 * i, 30)) for i in range(8)]
        t2.pump(20, lambda tr: tr.all_final(ids2))
        good = sum(1 for i, rid in enumerate(ids2) if len(t2.r[rid]["finals"]) == 1 and
                   t2.r[rid]["finals"][0].get("finish") == "length" and t2.r[rid]["ids"] == gold[3 * i:3 * i + 30])
        ck.ok(good == 8, "%d of 8 requests after SIGCONT completed with golden ids" % good)
        st = cl.status()
        running = {w["name"]: w.get("step", 0) for w in st.get("workers", []) if w.get("alive")}
        ck.ok(running.get("w2", 0) > step0, "w2 takes work again: steps %s, %d before" % (running, step0))
        rc = cl.kill("w2", signal.SIGTERM)
        ck.ok(rc == 0, "w2 exits 0 on SIGTERM (rc %s)" % rc)
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
