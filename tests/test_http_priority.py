#!/usr/bin/env python3
"""tests/test_http_priority.py: zllm-http maps vLLM's `priority` extension (an integer, lower is handled earlier)
onto the protocol's `priority` (higher is admitted first, docs/protocol.md), so it reads p as -p.

A real zllm-broker with one fake worker of one slot: while a request holds the slot, three more queue with
priorities 7, none and -7; the worker is assigned them in the order -7, none, 7, and sees the protocol's
priorities -(-7) = 7, 0 and -7, and the requests end in that order. Out-of-range and non-integer priorities are 400s naming the field."""
import os
import sys
import threading
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_fake import Broker, FakeWorker  # noqa: E402
from e2e_cluster import BIN, Checks, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402


def main():
    watchdog(60)
    ck = Checks("http_priority")
    ctx = zmq.Context()
    b = Broker(os.path.join(BIN, "zllm-broker"))
    w = FakeWorker(ctx, b.workers, n_slots=1, n_ctx=4096, step_ms=20, hb_ms=100)
    gw = None
    try:
        ck.ok(w.registered.wait(5), "fake worker registered")
        gw = Gateway(b.clients)
        ck.ok(gw.wait_up(), "the gateway hears the broker")
        results, done = {}, []

        def send(name, prompt, max_tokens, prio):
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            if prio is not None:
                body["priority"] = prio
            results[name] = gw.json("POST", "/v1/completions", body)
            done.append(name)

        threads = [threading.Thread(target=send, args=("hold", [5, 6], 15, None))]
        threads[0].start()
        t0 = time.monotonic()
        while not w.assigned and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        ck.ok(len(w.assigned) == 1, "the first request holds the worker's only slot")
        # distinct prompts tell the assignments apart: the fake worker echoes them
        for name, prompt, prio in (("late", [7], 7), ("plain", [8], None), ("early", [9], -7)):
            t = threading.Thread(target=send, args=(name, prompt, 2, prio))
            t.start()
            threads.append(t)
            time.sleep(0.05)  # each reaches the broker's queue before the next
        for t in threads:
            t.join(20)
        for name in ("hold", "late", "plain", "early"):
            st = results.get(name, (None,))[0]
            ck.ok(st == 200, "request %s: status %s" % (name, st))
        order = [w.priorities.get(r) for r in w.assigned]
        print("assigned priorities in order: %r" % order)
        ck.ok(len(order) == 4 and order[1:] == [7, order[2], -7] and order[2] in (0, None),
              "queued requests run highest protocol priority first: %r" % order)
        print("finished in order: %r" % done)
        ck.ok(done == ["hold", "early", "plain", "late"], "vLLM's lowest priority runs first: %r" % done)
        for bad in (101, -101, 1.5, "1", True):
            st, _, body = gw.json("POST", "/v1/completions", {"prompt": [1], "max_tokens": 1, "priority": bad})
            error_ok(ck, "priority %r" % (bad,), st, body, 400)
            ck.ok(body and body["error"].get("param") == "priority", "priority %r: param %r" % (bad, body))
        for good in (100, -100, 0):
            st, _, body = gw.json("POST", "/v1/completions", {"prompt": [1], "max_tokens": 1, "priority": good})
            ck.ok(st == 200, "priority %d accepted: %s %r" % (good, st, body))
    finally:
        if gw:
            gw.close()
        w.close()
        b.stop()
        ctx.term()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
