"""tests/test_e2e_admission.py: admission with real workers.
 - A full queue answers `overloaded` finals at once (one paced worker with 2 slots, a broker queue of 4).
 - A cancel frees capacity: with one slot busy on a long stream, a waiting request starts streaming within a
   second of the cancel, and the cancelled one ends with finish `cancelled`.
 - A client that never reads its streams does not slow a reading client: the reader's requests finish in about
   the time they take alone and carry llama2.c's golden ids."""
import os
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import Checks, Cluster, Tracker, golden_ids, golden_req, watchdog  # noqa: E402


def test_overload_and_cancel(ck, gold):
    cl = Cluster()
    try:
        cl.start_broker("--queue", "4")
        cl.start_worker("w1", "--debug-step-delay-ms", "20", max_batch=2)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "worker registered"):
            return
        c = cl.client()
        t = Tracker(c)
        ids = [t.submit("o%d" % i, deadline_ms=30000, **golden_req(gold, i, 400)) for i in range(12)]
        t.pump(1.0)
        over = [i for i in ids if t.r[i]["finals"] and t.r[i]["finals"][0].get("finish") == "overloaded"]
        ck.ok(len(over) >= 5, "%d of 12 requests answered overloaded (2 slots + queue of 4)" % len(over))
        fast = [i for i in over if t.r[i]["t_final"] - t.r[i]["t_submit"] < 0.5]
        ck.ok(len(fast) == len(over), "overloaded finals came at once (%d of %d within 0.5 s)" % (len(fast), len(over)))
        ck.ok(all(t.r[i]["finals"][0].get("code") == "overloaded" for i in over), "code overloaded")
        running = [i for i in ids if t.r[i]["ids"] and not t.r[i]["finals"]]
        waiting = [i for i in ids if not t.r[i]["ids"] and not t.r[i]["finals"]]
        ck.ok(len(running) == 2 and len(waiting) >= 1, "2 streaming, %d waiting" % len(waiting))
        # cancel one running stream: the oldest waiting request must start at once
        if running and waiting:
            c.cancel(running[0])
            t_cancel = time.monotonic()
            t.pump(3.0, lambda tr: tr.r[running[0]]["finals"] and any(tr.r[w]["ids"] for w in waiting))
            f = t.r[running[0]]["finals"]
            ck.ok(f and f[0].get("finish") == "cancelled", "cancelled stream ends with finish cancelled: %s" % (
                f[0].get("finish") if f else None))
            started = [w for w in waiting if t.r[w]["t_first"] is not None]
            ck.ok(started and min(t.r[w]["t_first"] for w in started) - t_cancel < 1.0,
                  "a waiting request started within 1 s of the cancel")
        for i in ids:   # let nothing linger
            if not t.r[i]["finals"]:
                c.cancel(i)
        t.pump(5.0, lambda tr: tr.all_final())
        ck.ok(t.all_final(), "every request got its final after the cancels")
        ck.ok(all(len(t.r[i]["finals"]) == 1 and t.r[i]["after"] == 0 for i in ids), "exactly one final each")
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()


def timed_batch(cl, gold, tag):
    c = cl.client()
    t = Tracker(c)
    t0 = time.monotonic()
    ids = [t.submit("%s%d" % (tag, i), deadline_ms=30000, **golden_req(gold, 2 * i, 60)) for i in range(6)]
    t.pump(30, lambda tr: tr.all_final(ids))
    dt = time.monotonic() - t0
    good = sum(1 for i, rid in enumerate(ids) if t.r[rid]["finals"] and t.r[rid]["ids"] == gold[2 * i:2 * i + 60])
    c.close()
    return dt, good


def test_slow_client(ck, gold):
    cl = Cluster()
    try:
        cl.start_broker()
        cl.start_worker("w1", "--debug-step-delay-ms", "5", max_batch=16)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "worker registered"):
            return
        base, good = timed_batch(cl, gold, "base")
        ck.ok(good == 6, "baseline: %d of 6 golden" % good)
        # a client that submits long streams and never reads
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.connect(cl.clients_ep)
        for i in range(8):
            m = {"zllm": 1, "type": "generate", "id": "slow%d" % i, "tokens": [1], "max_tokens": 1500,
                 "ignore_eos": True, "temperature": 0.0, "deadline_ms": 60000}
            s.send(msgpack.packb(m))
        time.sleep(0.5)
        loaded, good = timed_batch(cl, gold, "fast")
        ck.ok(good == 6, "with a non-reading client: %d of 6 golden" % good)
        print("6 requests: %.2f s alone, %.2f s beside a client that never reads" % (base, loaded))
        ck.ok(loaded < 3 * base + 2.0, "the reader was not held up: %.2f s vs %.2f s alone" % (loaded, base))
        st = cl.status()
        ck.ok(st.get("ready") is True, "broker still ready")
        s.close(0)
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()


def main():
    watchdog(80)
    ck = Checks("e2e_admission")
    gold = golden_ids()
    test_overload_and_cancel(ck, gold)
    test_slow_client(ck, gold)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
