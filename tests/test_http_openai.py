#!/usr/bin/env python3
"""tests/test_http_openai.py: zllm-http (http/) against the official `openai` Python package and plain HTTP, in
front of a real zllm-broker and CPU workers on loopback: chat (a tiny random qwen2 model made by zllm-mkmodel
with the Qwen2 vocabulary and its chat template) and completions (stories260K), streamed and not; `stop`; `seed` reproducibility; `usage` equal to the
tokenizer's counts; the 200 stories260K golden ids through /v1/completions with the prompt as token ids at
temperature 0; every error status (400, 401, 404, 405, 413, 429 with Retry-After, 503 for a model without a worker
and for an unreachable broker) with its OpenAI error body; a client that hangs up mid-stream (and one that hangs up
while waiting for a non-streamed answer) frees its worker slot at once; /health, /v1/models, /tokenize,
/detokenize; and /metrics parsed by prometheus_client, its request counters equal to what this test sent.
Needs `pip install openai prometheus_client` (deploy/deps.sh installs them): without them the test fails."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, FIXTURES, ROOT, STORIES, Checks, Cluster, golden_ids, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402

QWEN_VOCAB = os.path.join(FIXTURES, "vocab", "ggml-vocab-qwen2.gguf")


def worker_slots(cl, name):
    st = cl.status()
    for w in st.get("workers", []):
        if w["name"] == name:
            return w
    return None


def wait_free(cl, name, timeout):
    """seconds until the worker's slots are all free again, or None"""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        w = worker_slots(cl, name)
        if w and w["free_slots"] == w["n_slots"] and w["running"] == 0:
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def main():
    watchdog(240)
    ck = Checks("http_openai")
    try:
        import openai
        import prometheus_client.parser as promparse
    except ImportError as e:
        ck.ok(False, "%s: install with `pip install openai prometheus_client` (or `make deps`)" % e)
        return ck.report()
    if not ck.ok(os.path.exists(os.path.join(BIN, "zllm-http")), "%s/zllm-http exists (built where libmicrohttpd "
                 "and jansson are installed: `make deps`)" % BIN):
        return ck.report()
    for f in (STORIES, QWEN_VOCAB):
        if not ck.ok(os.path.exists(f), "fixture %s" % f):
            return ck.report()
    gold = golden_ids()
    cl = Cluster()
    QWEN = os.path.join(cl.dir, "qwen.gguf")
    p = subprocess.run([os.path.join(BIN, "zllm-mkmodel"), "-o", QWEN, "--preset", "tiny-qwen2", "--vocab-from",
                        QWEN_VOCAB], capture_output=True, text=True)
    if not ck.ok(p.returncode == 0, "zllm-mkmodel: %s" % p.stderr[-300:]):
        return ck.report()
    # a third model with no worker: /health 503 and its requests 503
    cl.start_broker("--model", "qwen=%s" % QWEN, "--model", "idle=%s" % STORIES, "--model", "slow=%s" % STORIES,
                    "--queue", "1")
    cl.start_worker("ws", max_batch=4)
    # a slowed-down worker (20 ms a step) for the overload and hang-up checks
    cl.workers["wslow"] = cl._spawn("wslow", [os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m",
                                              STORIES, "--model-name", "slow", "--name", "wslow", "--device", "cpu",
                                              "--max-batch", "2", "--threads", "1", "--debug-step-delay-ms", "20"])
    cl.workers["wq"] = cl._spawn("wq", [os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m", QWEN,
                                        "--model-name", "qwen", "--name", "wq", "--device", "cpu", "--max-batch",
                                        "4", "--threads", "1"])
    gws = []
    sent = {}   # (model, endpoint, status) -> count, as /metrics must show it

    def count(model, endpoint, status, n=1):
        sent[(model, endpoint, str(status))] = sent.get((model, endpoint, str(status)), 0) + n

    try:
        if not ck.ok(cl.wait_workers(["ws", "wq", "wslow"], timeout=30) is not None, "workers registered"):
            return ck.report()
        gw = Gateway(cl.clients_ep, "--model", "stories=%s" % STORIES, "--max-body", "65536")
        gws.append(gw)
        ck.ok(gw.wait_up(), "the gateway hears the broker")
        oc = openai.OpenAI(base_url=gw.base + "/v1", api_key="unused", max_retries=0, timeout=60)

        # /health is 503 while the model "idle" has no worker
        st, _, body = gw.json("GET", "/health")
        ck.ok(st == 503 and body.get("status") == "unavailable", "/health 503 with a model unserved: %s %r" % (st, body))
        count("", "health", 503)
        # /v1/models lists every model the broker serves
        models = sorted(m.id for m in oc.models.list().data)
        ck.ok(models == ["idle", "qwen", "slow", "stories"], "/v1/models: %r" % models)
        count("", "models", 200)

        # completions, not streamed
        r = oc.completions.create(model="stories", prompt="Once upon a time", max_tokens=24, temperature=0)
        count("stories", "completions", 200)
        ck.ok(r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.choices[0].text,
              "completion: %r" % r)
        st, _, tk = gw.json("POST", "/tokenize", {"content": "Once upon a time", "add_special": True})
        count("", "tokenize", 200)
        ck.ok(st == 200 and r.usage.prompt_tokens == len(tk["tokens"]) and r.usage.completion_tokens == 24 and
              r.usage.total_tokens == r.usage.prompt_tokens + 24, "usage %r equals the tokenizer's %r" % (r.usage, tk))
        ck.ok(tk["tokens"][0] == 1, "tokenize add_special adds BOS: %r" % tk)
        # completions, streamed: the deltas add up to the same text, usage in the last chunk
        chunks = list(oc.completions.create(model="stories", prompt="Once upon a time", max_tokens=24,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
        count("stories", "completions", 200)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        ck.ok(text == r.choices[0].text, "streamed text equals the non-streamed one: %r vs %r" % (text,
                                                                                                  r.choices[0].text))
        ck.ok(fins == ["length"], "one finish_reason length: %r" % fins)
        ck.ok(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24 and
              chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens, "stream usage: %r" % chunks[-1].usage)

        # the golden ids: prompt = BOS as a token id, greedy, 200 tokens
        r = oc.completions.create(model="stories", prompt=[1], max_tokens=200, temperature=0,
                                  extra_body={"ignore_eos": True})
        count("stories", "completions", 200)
        st, _, dt = gw.json("POST", "/detokenize", {"tokens": gold})
        count("", "detokenize", 200)
        with open(os.path.join(FIXTURES, "stories260K", "golden_greedy_text.txt")) as f:
            gtext = f.read()
        ck.ok(st == 200 and r.choices[0].text == dt["content"], "200 golden ids through /v1/completions: text "
              "equals detokenize(golden) (%r...)" % r.choices[0].text[:60])
        ck.ok(gtext.startswith(r.choices[0].text) or r.choices[0].text.startswith(gtext.rstrip("\n")),
              "... and the golden text file")
        ck.ok(r.usage.prompt_tokens == 1 and r.usage.completion_tokens == 200, "golden usage %r" % r.usage)
        st, _, tk = gw.json("POST", "/tokenize", {"content": dt["content"]})
        count("", "tokenize", 200)
        ck.ok(st == 200 and tk["tokens"][:20] == gold[:20], "tokenize(detokenize(golden)) starts as golden")

        # stop: the text ends before the stop string, finish stop
        full = oc.completions.create(model="stories", prompt="Once upon a time", max_tokens=30, temperature=0)
        count("stories", "completions", 200)
        t = full.choices[0].text
        word = " Lily" if " Lily" in t else t.split()[3]
        r = oc.completions.create(model="stories", prompt="Once upon a time", max_tokens=30, temperature=0,
                                  stop=[word, "zzzz"])
        count("stories", "completions", 200)
        ck.ok(r.choices[0].finish_reason == "stop" and r.choices[0].text == t[:t.index(word)],
              "stop %r: %r (%s)" % (word, r.choices[0].text, r.choices[0].finish_reason))
        # seed: the same seed gives the same text, sampled at temperature 1
        outs = [oc.completions.create(model="stories", prompt="Once", max_tokens=20, temperature=1.0, seed=s)
                .choices[0].text for s in (7, 7, 8)]
        count("stories", "completions", 200, 3)
        ck.ok(outs[0] == outs[1], "seed 7 twice gives the same text: %r" % outs[:2])
        ck.ok(outs[0] != outs[2], "seed 8 differs: %r" % outs)

        # chat, not streamed and streamed (the broker applies tiny-qwen2's ChatML template)
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]}]
        c = oc.chat.completions.create(model="qwen", messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True, "top_k": 40, "min_p": 0.0,
                                                   "repetition_penalty": 1.0}, user="tester")
        count("qwen", "chat", 200)
        ck.ok(c.object == "chat.completion" and c.choices[0].message.role == "assistant" and
              c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 8 and c.usage.prompt_tokens > 5,
              "chat: %r" % c)
        s = list(oc.chat.completions.create(model="qwen", messages=msgs, max_completion_tokens=8, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
        count("qwen", "chat", 200)
        ck.ok(s[0].choices[0].delta.role == "assistant", "first chunk has the role")
        ck.ok("".join(x.choices[0].delta.content or "" for x in s if x.choices) == c.choices[0].message.content,
              "streamed chat equals non-streamed")
        ck.ok(s[-1].choices[0].finish_reason == "length" and all(x.object == "chat.completion.chunk" for x in s),
              "chunks and finish_reason")

        # errors, with the official client's exception types
        def expect(exc, what, fn, model, endpoint, status):
            try:
                fn()
                ck.ok(False, "%s: no error" % what)
            except exc as e:
                ck.ok(getattr(e, "status_code", None) == status, "%s: status %s" % (what, getattr(e, "status_code",
                                                                                                 None)))
            count(model, endpoint, status)
        expect(openai.NotFoundError, "unknown model", lambda: oc.completions.create(model="nope", prompt="a"),
               "", "completions", 404)
        expect(openai.BadRequestError, "n=17", lambda: oc.completions.create(model="stories", prompt="a", n=17),
               "", "completions", 400)
        expect(openai.BadRequestError, "chat without a template",
               lambda: oc.chat.completions.create(model="stories", messages=[{"role": "user", "content": "x"}]),
               "stories", "chat", 400)
        expect(openai.APIStatusError, "model without a worker",
               lambda: oc.completions.create(model="idle", prompt="a"), "idle", "completions", 503)
        # raw HTTP: bodies and fields
        for what, body, status, param in [
                ("bad JSON", "{\"prompt\": ", 400, None),
                ("not an object", "[1]", 400, None),
                ("invalid UTF-8", b"{\"model\":\"stories\",\"prompt\":\"\xff\"}", 400, None),
                ("JSON nested 100000 deep", "{\"prompt\":" + "[" * 100000 + "]" * 100000 + "}", 413, None),
                ("max_tokens 2^63", "{\"model\":\"stories\",\"prompt\":\"a\",\"max_tokens\":9223372036854775808}",
                 400, None),
                ("max_tokens 2^40", {"model": "stories", "prompt": "a", "max_tokens": 2 ** 40}, 400, "max_tokens"),
                ("temperature -1", {"model": "stories", "prompt": "a", "temperature": -1}, 400, "temperature"),
                ("top_p 0", {"model": "stories", "prompt": "a", "top_p": 0}, 400, "top_p"),
                ("stop not a string", {"model": "stories", "prompt": "a", "stop": 5}, 400, "stop"),
                ("logprobs 21", {"model": "stories", "prompt": "a", "logprobs": 21}, 400, "logprobs"),
                ("echo not a boolean", {"model": "stories", "prompt": "a", "echo": "yes"}, 400, "echo"),
                ("max_tokens 0 without echo", {"model": "stories", "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
                ("prompt token out of range", {"model": "stories", "prompt": [-1]}, 400, "prompt"),
                ("prompt too long", {"model": "stories", "prompt": "a", "max_tokens": 1000000}, 400, None)]:
            st, h, b = gw.json("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            error_ok(ck, what, st, b, status, param)
            count("stories" if what == "prompt too long" else "", "completions", status)
        for what, body, param in [
                ("tools", {"model": "qwen", "messages": [{"role": "user", "content": "a"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                ("response_format", {"model": "qwen", "messages": [{"role": "user", "content": "a"}],
                                     "response_format": {"type": "xml"}}, "response_format"),
                ("response_format and grammar", {"model": "qwen", "messages": [{"role": "user", "content": "a"}],
                                                 "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""},
                 "response_format"),
                ("json_schema without a schema", {"model": "qwen", "messages": [{"role": "user", "content": "a"}],
                                                  "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                 "response_format"),
                ("role tool", {"model": "qwen", "messages": [{"role": "tool", "content": "a"}]}, "messages[0]"),
                ("no messages", {"model": "qwen"}, "messages")]:
            st, h, b = gw.json("POST", "/v1/chat/completions", body)
            error_ok(ck, what, st, b, 400, param)
            count("", "chat", 400)
        st, h, b = gw.json("POST", "/v1/completions", "x" * 70000)
        error_ok(ck, "body over --max-body", st, b, 413)
        count("", "completions", 413)
        st, h, b = gw.json("GET", "/v1/nothing")
        error_ok(ck, "unknown path", st, b, 404)
        count("", "other", 404)
        st, h, b = gw.json("GET", "/v1/completions")
        error_ok(ck, "GET on a POST route", st, b, 405)
        count("", "completions", 405)
        st, h, b = gw.request("GET", "/v1/models", headers={"X-Huge": "a" * 100000})
        ck.ok(st in (413, 431), "oversized headers: %d" % st)

        # 429: the broker's queue holds 1 and the slow worker 2 sequences: the fourth request overflows
        long_req = {"model": "slow", "prompt": [1], "max_tokens": 1000, "ignore_eos": True}
        conns = []
        for i in range(3):
            hc = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
            hc.request("POST", "/v1/completions", json.dumps(dict(long_req, stream=True)))
            conns.append(hc)
            time.sleep(0.1)
        st, h, b = gw.json("POST", "/v1/completions", long_req)
        error_ok(ck, "broker overloaded", st, b, 429)
        ck.ok(h.get("Retry-After") == "1", "429 has Retry-After: %r" % h)
        count("slow", "completions", 429)
        # hanging up mid-stream cancels at once: the worker's slots free within a step or two
        resp = conns[0].getresponse()
        ck.ok(resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream", "stream started")
        ck.ok(resp.read1(64).startswith(b"data: {"), "an SSE event came")
        step0 = worker_slots(cl, "wslow")["step"]
        for hc in conns:
            hc.sock.shutdown(socket.SHUT_RDWR)
            hc.close()
        count("slow", "completions", 499, 3)
        t = wait_free(cl, "wslow", 5.0)
        steps = worker_slots(cl, "wslow")["step"] - step0
        print("three hung-up streams: slots free after %s s, %d steps" % (t, steps))
        ck.ok(t is not None and steps <= 3, "three hung-up streams free the worker's slots in %s s, %d steps "
              "(20 ms each)" % (t, steps))
        # ... also while waiting for a non-streamed answer (the connection is suspended)
        sk = socket.create_connection(("127.0.0.1", gw.port))
        body = json.dumps(long_req).encode()
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
        w = worker_slots(cl, "wslow")
        ck.ok(w and w["free_slots"] == w["n_slots"] - 1, "the non-streamed request runs: %r" % w)
        step0 = w["step"]
        sk.close()
        count("slow", "completions", 499)
        t = wait_free(cl, "wslow", 5.0)
        steps = worker_slots(cl, "wslow")["step"] - step0
        print("a hung-up non-streamed request: slot free after %s s, %d steps" % (t, steps))
        ck.ok(t is not None and steps <= 3, "a hung-up non-streamed request frees its slot in %s s, %d steps" % (
            t, steps))

        # /metrics: parsed by prometheus_client; the request counters equal what this test sent
        time.sleep(0.6)   # the gateway's copy of the broker's status is at most 500 ms old
        st, h, data = gw.request("GET", "/metrics")
        ck.ok(st == 200 and h.get("Content-Type", "").startswith("text/plain"), "metrics content type")
        fams = {f.name: f for f in promparse.text_string_to_metric_families(data.decode())}
        got = {}
        for smp in fams["zllm_http_requests"].samples:
            if smp.name == "zllm_http_requests_total" and smp.labels["endpoint"] != "metrics":
                got[(smp.labels["model"], smp.labels["endpoint"], smp.labels["status"])] = int(smp.value)
        ck.ok(got == sent, "request counters equal what was sent:\n got  %r\n sent %r" % (
            sorted(got.items()), sorted(sent.items())))
        ttft = [s for s in fams["zllm_http_time_to_first_token_seconds"].samples
                if s.name.endswith("_count") and s.labels["model"] == "stories"]
        ck.ok(ttft and ttft[0].value >= 8, "ttft histogram counts the stories requests: %r" % ttft)
        for name in ("zllm_broker_queue_depth", "zllm_worker_kv_slots", "zllm_worker_running_sequences",
                     "zllm_workers", "zllm_broker_completed", "zllm_http_connections", "zllm_broker_cancelled",
                     "zllm_http_inter_token_latency_seconds", "zllm_http_e2e_request_latency_seconds"):
            ck.ok(name in fams, "metric %s exported" % name)
        canc = [s.value for s in fams["zllm_broker_cancelled"].samples if s.name.endswith("_total")]
        ck.ok(canc and canc[0] >= 4, "the broker counted the hang-ups as cancelled: %r" % canc)
        wk = {(s.labels["model"], s.labels["state"]): s.value for s in fams["zllm_workers"].samples}
        ck.ok(wk.get(("stories", "alive")) == 1 and wk.get(("slow", "alive")) == 1 and wk.get(("idle", "alive")) == 0, "workers per model: %r" % wk)

        # 401: a gateway with an API key
        with tempfile.NamedTemporaryFile("w", delete=False) as kf:
            kf.write("sekrit-key\n")
        try:
            gk = Gateway(cl.clients_ep, "--api-key-file", kf.name)
            gws.append(gk)
            gk.wait_up()
            for key in (None, "Bearer wrong", "Bearer sekrit-ke"):
                st, h, b = gk.json("GET", "/v1/models", headers={"Authorization": key} if key else {})
                error_ok(ck, "API key %r" % key, st, b, 401)
            ok = openai.OpenAI(base_url=gk.base + "/v1", api_key="sekrit-key", max_retries=0)
            ck.ok(len(ok.models.list().data) == 4, "the right key is accepted")
            st, _, _ = gk.request("GET", "/health")
            ck.ok(st == 503, "/health needs no key")
        finally:
            os.unlink(kf.name)
        # --served-model-name: the names clients use
        ga = Gateway(cl.clients_ep, "--served-model-name", "gpt-zllm=stories")
        gws.append(ga)
        oa = openai.OpenAI(base_url=ga.base + "/v1", api_key="unused", max_retries=0)
        ck.ok([m.id for m in oa.models.list().data] == ["gpt-zllm"], "aliases listed")
        r = oa.completions.create(model="gpt-zllm", prompt=[1], max_tokens=5, temperature=0)
        ck.ok(r.model == "gpt-zllm" and r.usage.completion_tokens == 5, "an alias serves its model: %r" % r)
        expect(openai.NotFoundError, "a name not served", lambda: oa.completions.create(model="stories", prompt="a"),
               "", "completions", 404)
        # a broker restart: a stream in flight ends with an error event and [DONE]; new requests work again
        hc = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        hc.request("POST", "/v1/completions", json.dumps(dict(long_req, stream=True)))
        resp = hc.getresponse()
        first = resp.read1(64)
        cl.kill("broker")
        cl.start_broker("--model", "qwen=%s" % QWEN, "--model", "idle=%s" % STORIES, "--model",
                        "slow=%s" % STORIES, "--queue", "1")
        t0 = time.monotonic()
        rest = b""
        try:
            while b"[DONE]" not in rest and time.monotonic() - t0 < 15:
                b = resp.read1(65536)
                if not b:
                    break
                rest += b
        except Exception as e:
            print("stream after the restart: %s" % e)
        ck.ok(first.startswith(b"data: {") and b'"error"' in rest and rest.rstrip().endswith(b"data: [DONE]"),
              "a stream cut by a broker restart ends with an error event and [DONE] (%.1f s): %r" % (
                  time.monotonic() - t0, rest[-300:]))
        hc.close()
        ck.ok(cl.wait_workers(["ws", "wslow"], timeout=20) is not None, "workers back after the restart")
        time.sleep(0.6)
        r = oc.completions.create(model="stories", prompt=[1], max_tokens=5, temperature=0)
        ck.ok(r.usage.completion_tokens == 5, "served again after the broker restart")
        # 503: a broker that does not answer
        gd = Gateway("ipc:///tmp/zllm-http-no-broker-%d" % os.getpid())
        gws.append(gd)
        time.sleep(0.2)
        st, h, b = gd.json("POST", "/v1/completions", {"model": "stories", "prompt": "a"})
        error_ok(ck, "broker unreachable", st, b, 503)
        st, h, b = gd.json("GET", "/health")
        ck.ok(st == 503, "/health without a broker: 503")
        ck.ok(gw.p.poll() is None, "the gateway survived everything")
    finally:
        for g in gws:
            g.close()
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
