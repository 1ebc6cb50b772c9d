"""tests/test_e2e_broker_restart.py: kill -9 of the broker with streams in flight, then a new broker on the same
endpoints. Clients (Python Client and the `zllm` command) get an error or a client timeout within their deadline
plus grace, never a hang; both real workers register again with the new broker within a few seconds (reregister
or broker silence), drop the sequences nobody waits for, and serve new requests with llama2.c's golden ids."""
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, Checks, Cluster, Tracker, golden_ids, golden_req, watchdog, zllm  # noqa: E402


def main():
    watchdog(80)
    ck = Checks("e2e_broker_restart")
    gold = golden_ids()
    cl = Cluster()
    pace = ["--debug-step-delay-ms", "25"]
    try:
        # before any broker exists: the Python client fails fast instead of waiting
        t0 = time.monotonic()
        try:
            zllm.Client(cl.clients_ep, send_timeout=1.0).generate("hello", max_tokens=3)
            ck.ok(False, "generate without a broker raised nothing")
        except zllm.ZllmError as e:
            ck.ok(e.code == "unreachable" and time.monotonic() - t0 < 3, "no broker: %s after %.2f s" % (
                e.code, time.monotonic() - t0))
        cl.start_broker()
        cl.start_worker("w1", *pace, max_batch=4)
        cl.start_worker("w2", *pace, max_batch=4)
        if not ck.ok(cl.wait_workers(["w1", "w2"], timeout=15) is not None, "2 workers registered"):
            return ck.report()
        # blocking Python clients in threads: each must return or raise within deadline + grace
        deadline_ms, grace = 4000, 2.0
        outcomes = {}

        def one(i):
            t0 = time.monotonic()
            c = cl.client(grace=grace)
            try:
                r = c.generate(deadline_ms=deadline_ms, **golden_req(gold, i, 300))
                outcomes[i] = ("final", r.finish_reason, time.monotonic() - t0)
            except zllm.ZllmError as e:
                outcomes[i] = ("error", e.code, time.monotonic() - t0)
            finally:
                c.close()

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(6)]
        for th in threads:
            th.start()
        # the `zllm` command too
        cmd = subprocess.Popen([os.path.join(BIN, "zllm"), "generate", "--broker", cl.clients_ep, "--tokens", "1",
                                "-n", "300", "--temp", "0", "--ignore-eos", "--deadline-ms", str(deadline_ms)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        c = cl.client()
        t = Tracker(c)
        probe = t.submit("p0", deadline_ms=deadline_ms, **golden_req(gold, 0, 300))
        ck.ok(t.pump(10, lambda tr: tr.all_streaming([probe], 3)), "streams running before the broker dies")
        cl.kill("broker", signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(0.5)
        cl.start_broker()
        st = cl.wait_workers(["w1", "w2"], timeout=8)
        ck.ok(st is not None, "both workers registered with the new broker")
        back = time.monotonic() - t_kill
        print("workers registered again %.2f s after the broker was killed" % back)
        ck.ok(back < 5.0, "re-registration within 5 s (%.2f s)" % back)
        for th in threads:
            th.join(timeout=deadline_ms / 1000.0 + grace + 5)
        hung = [th for th in threads if th.is_alive()]
        ck.ok(not hung, "%d Python clients still blocked after deadline + grace" % len(hung))
        for i in range(6):
            o = outcomes.get(i)
            ck.ok(o is not None and o[2] <= deadline_ms / 1000.0 + grace + 2.0,
                  "client %d ended in bounded time: %s" % (i, o))
        try:
            _, err = cmd.communicate(timeout=deadline_ms / 1000.0 + 10)
            ck.ok(cmd.returncode == 1, "zllm generate exits 1 after the broker restart (rc %s: %s)" % (
                cmd.returncode, err.decode(errors="replace").strip()[-200:]))
        except subprocess.TimeoutExpired:
            cmd.kill()
            ck.ok(False, "zllm generate hung after the broker restart")
        t2 = Tracker(c)
        ids = [t2.submit("n%d" % i, deadline_ms=20000, **golden_req(gold, 7 * i, 25)) for i in range(8)]
        t2.pump(20, lambda tr: tr.all_final(ids))
        good = sum(1 for i, rid in enumerate(ids) if len(t2.r[rid]["finals"]) == 1 and
                   t2.r[rid]["finals"][0].get("finish") == "length" and t2.r[rid]["ids"] == gold[7 * i:7 * i + 25])
        ck.ok(good == 8, "%d of 8 requests served by the new broker with golden ids" % good)
        # `running` is as of each worker's last heartbeat: give it a few beats to settle
        end = time.monotonic() + 3
        while True:
            st = cl.status()
            if all(w.get("running", 0) == 0 for w in st.get("workers", [])) or time.monotonic() > end:
                break
            time.sleep(0.2)
        ck.ok(all(w.get("running", 0) == 0 for w in st.get("workers", [])),
              "workers dropped the sequences of the old broker: %s" % [
                  (w["name"], w.get("running")) for w in st.get("workers", [])])
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
