#!/usr/bin/env python3
"""tests/test_http_logprobs.py: logprobs, top_logprobs, n, presence/frequency penalties and logit_bias through
zllm-http with the official `openai` package, in front of a real broker and CPU worker (stories260K, whose
vocabulary the gateway loads for the token texts):

- completions: `logprobs: 5` gives OpenAI's shape (tokens, token_logprobs, top_logprobs with 5 entries each,
  text_offset counting up), the same numbers as the zllm protocol returns for the same request (Python client), in
  a non-streamed answer and in the streamed chunks;
- chat (a copy of stories260K given a chat template): `logprobs: true, top_logprobs: 3` gives choices[0].logprobs.
  content with token, logprob, bytes (the token text's UTF-8) and 3 top_logprobs per token, streamed and not;
- `n: 4` with a seed gives 4 choices (index 0..3), each equal to the request with seed + i, streamed (chunks of
  every index, one finish_reason each) and not; usage counts the prompt once and every choice's tokens;
- presence_penalty, frequency_penalty and logit_bias reach the sampler: a logit_bias of -100 on the greedy
  answer's first token changes it, and each request equals the zllm protocol's answer with the same fields;
- bad values answer 400 naming the field: top_logprobs 21, top_logprobs without logprobs, n 0, n 17,
  presence_penalty 3, logit_bias with a non-numeric key or a value of 101 or 301 entries, and a bias id outside
  the vocabulary (refused by the broker).
Needs `pip install openai` (deploy/deps.sh installs it). Prints "N passed, N failed"."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, STORIES, Checks, Cluster, watchdog  # noqa: E402
from test_http_openai import Gateway, error_ok  # noqa: E402

PROMPT = [1, 327, 260, 299, 472, 17, 375]
CHAT_TMPL = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def completions(ck, oc, c):
    r = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    ref = c.generate(tokens=PROMPT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    ck.ok(lp is not None and len(lp.tokens) == len(ref.token_ids) == 8, "completions: 8 tokens with logprobs")
    if lp is None:
        return
    ck.ok(lp.token_logprobs == [x["logprob"] for x in ref.logprobs] or all(
        abs(a - b["logprob"]) < 1e-6 for a, b in zip(lp.token_logprobs, ref.logprobs)),
        "completions: token_logprobs as the protocol's")
    ck.ok(all(len(t) == 5 for t in lp.top_logprobs), "completions: 5 top_logprobs per token")
    ck.ok("".join(lp.tokens) == r.choices[0].text, "completions: the tokens' texts make the text (%r)" %
          r.choices[0].text)
    ck.ok(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, "completions: text_offset grows")
    best = [max(t.values()) for t in lp.top_logprobs]
    ck.ok(all(abs(a - b) < 1e-6 for a, b in zip(best, lp.token_logprobs)), "completions: greedy token is the top one")
    st = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5, stream=True)
    got = []
    for ch in st:
        for x in ch.choices:
            if x.logprobs is not None:
                got += x.logprobs.token_logprobs
    ck.ok(got == lp.token_logprobs, "completions streamed: the same token_logprobs")


def chat(ck, oc):
    msgs = [{"role": "user", "content": "Once upon a time"}]
    r = oc.chat.completions.create(model="chat", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                   top_logprobs=3)
    ct = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    ck.ok(ct is not None and len(ct) == 6, "chat: 6 logprobs entries")
    if not ct:
        return
    ck.ok(all(len(t.top_logprobs) == 3 for t in ct), "chat: 3 top_logprobs each")
    ck.ok(all(bytes(t.bytes) == t.token.encode() for t in ct), "chat: bytes are the token's UTF-8")
    ck.ok(all(t.logprob <= 0 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6 for t in ct),
          "chat: greedy token's logprob is its top alternative's")
    ck.ok("".join(t.token for t in ct) == r.choices[0].message.content, "chat: tokens make the content")
    st = oc.chat.completions.create(model="chat", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                    top_logprobs=3, stream=True)
    got = []
    for ch in st:
        for x in ch.choices:
            if x.logprobs is not None and x.logprobs.content:
                got += [t.logprob for t in x.logprobs.content]
    ck.ok(got == [t.logprob for t in ct], "chat streamed: the same logprobs")
    off = oc.chat.completions.create(model="chat", messages=msgs, max_tokens=3, temperature=0)
    ck.ok(off.choices[0].logprobs is None, "chat: no logprobs unless asked for")


def n_choices(ck, oc):
    r = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=500, n=4)
    ck.ok(len(r.choices) == 4 and [x.index for x in r.choices] == [0, 1, 2, 3], "n=4: choices 0..3")
    ck.ok(len({x.text for x in r.choices}) > 1, "n=4: different completions")
    ck.ok(r.usage.prompt_tokens == 7 and r.usage.completion_tokens == 24, "n=4: usage 7 + 4 x 6 (%s)" % r.usage)
    for i in range(4):
        one = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=500 + i)
        ck.ok(one.choices[0].text == r.choices[i].text, "n=4: choice %d equals seed %d" % (i, 500 + i))
    st = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=500, n=4,
                               stream=True)
    texts, fins = {}, {}
    for ch in st:
        for x in ch.choices:
            texts[x.index] = texts.get(x.index, "") + (x.text or "")
            if x.finish_reason:
                fins[x.index] = fins.get(x.index, 0) + 1
    ck.ok([texts.get(i) for i in range(4)] == [x.text for x in r.choices], "n=4 streamed: the same texts")
    ck.ok(fins == {0: 1, 1: 1, 2: 1, 3: 1}, "n=4 streamed: one finish_reason per choice (%s)" % fins)
    cr = oc.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Tim"}], max_tokens=4,
                                    temperature=1.0, seed=9, n=3)
    ck.ok(len(cr.choices) == 3 and all(x.message.role == "assistant" for x in cr.choices), "chat n=3: 3 choices")


def penalties(ck, oc, c):
    base = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=40, temperature=0)
    first = c.generate(tokens=PROMPT, max_tokens=1, temperature=0).token_ids[0]
    for name, kw in [("presence", dict(presence_penalty=1.5)), ("frequency", dict(frequency_penalty=0.9)),
                     ("bias", dict(logit_bias={str(first): -100}))]:
        r = oc.completions.create(model="stories", prompt=PROMPT, max_tokens=40, temperature=0, **kw)
        pk = {k: ({int(a): b for a, b in v.items()} if k == "logit_bias" else v) for k, v in kw.items()}
        ref = c.generate(tokens=PROMPT, max_tokens=40, temperature=0, **pk)
        ck.ok(r.choices[0].text == ref.text, "%s: the protocol's answer" % name)
        ck.ok(r.choices[0].text != base.choices[0].text, "%s: changes the greedy answer" % name)


def bad(ck, gw):
    cases = [("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
             ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
             ("/v1/completions", {"n": 0}, "n"),
             ("/v1/completions", {"n": 17}, "n"),
             ("/v1/completions", {"presence_penalty": 3}, "presence_penalty"),
             ("/v1/completions", {"frequency_penalty": -2.5}, "frequency_penalty"),
             ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
             ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
             ("/v1/completions", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
             ("/v1/completions", {"logit_bias": {"512": 1}}, None)]
    for path, extra, param in cases:
        body = {"model": "chat" if "chat" in path else "stories", "max_tokens": 2}
        body.update({"messages": [{"role": "user", "content": "a"}]} if "chat" in path else {"prompt": "a"})
        body.update(extra)
        st, h, b = gw.json("POST", path, body, {"Content-Type": "application/json"})
        error_ok(ck, "%s %s" % (path, json.dumps(extra)[:40]), st, b, 400, param)


def main():
    watchdog(180)
    ck = Checks("http_logprobs")
    try:
        import openai
    except ImportError as e:
        ck.ok(False, "%s: install with `pip install openai`" % e)
        return ck.report()
    if not ck.ok(os.path.exists(os.path.join(BIN, "zllm-http")), "%s/zllm-http exists" % BIN):
        return ck.report()
    cl = Cluster()
    chat_model = os.path.join(cl.dir, "chat.gguf")
    q = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template", CHAT_TMPL,
                        STORIES, chat_model, "--force"], capture_output=True, text=True)
    tmpl_ok = q.returncode == 0
    if not tmpl_ok:
        print(q.stderr[-800:])
    ck.ok(tmpl_ok, "a chat copy of stories260K")
    cl.start_broker("--model", "chat=%s" % chat_model)
    cl.start_worker("ws", max_batch=8)
    cl.workers["wc"] = cl._spawn("wc", [os.path.join(BIN, "zllm-worker"), "--broker", cl.workers_ep, "-m", chat_model,
                                        "--model-name", "chat", "--name", "wc", "--device", "cpu", "--max-batch", "8",
                                        "--threads", "1"])
    gw = None
    try:
        if not ck.ok(cl.wait_workers(["ws", "wc"], timeout=30) is not None, "workers registered"):
            cl.dump_logs()
            return ck.report()
        gw = Gateway(cl.clients_ep, "--model", "stories=%s" % STORIES, "--model", "chat=%s" % chat_model)
        ck.ok(gw.wait_up(), "the gateway hears the broker")
        oc = openai.OpenAI(base_url=gw.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        with cl.client() as c:
            completions(ck, oc, c)
            chat(ck, oc)
            n_choices(ck, oc)
            penalties(ck, oc, c)
        bad(ck, gw)
    finally:
        if gw:
            gw.close()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
