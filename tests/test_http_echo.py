#!/usr/bin/env python3
"""tests/test_http_echo.py: prompt logprobs through zllm-http with the official `openai` package, in front of a real
broker and CPU worker (stories260K, whose vocabulary the gateway loads for the token texts):

- /v1/completions `echo: true, logprobs: 3, max_tokens: 0` (scoring a text): the text is the prompt, logprobs.tokens
  has one entry per prompt token (usage.prompt_tokens), the first with token_logprobs and top_logprobs null, the
  others the zllm protocol's prompt_logprobs for the same prompt (Python client) with 3 alternatives, text_offset
  counting the token texts from 0;
- echo with generation: the text is the prompt then the plain request's text, the logprobs the prompt's then the
  plain request's; streamed, the chunks carry the same text and token_logprobs;
- echo without logprobs returns the prompt and the completion, with logprobs null;
- the prompt_logprobs extension (vLLM's) on chat and completions: a top-level `prompt_logprobs` list, null for
  position 0, then {id: {logprob, rank, decoded_token}} holding the prompt token and the top 2;
- bad values answer 400 naming the field: max_tokens 0 without echo, echo not a boolean, prompt_logprobs 21, echo
  on chat completions.
Needs `pip install openai`. Prints "N passed, N failed"."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, STORIES, Checks, Cluster, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402

TEXT = "Once upon a time, there was a little girl"
CHAT_TMPL = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= 1e-6


def scoring(ck, oc, c):
    r = oc.completions.create(model="stories", prompt=TEXT, max_tokens=0, echo=True, logprobs=3)
    ref = c.generate(prompt=TEXT, max_tokens=0, prompt_logprobs=3)
    ch = r.choices[0]
    lp = ch.logprobs
    n = r.usage.prompt_tokens
    ck.ok(ch.text == TEXT, "echo, max_tokens 0: the text is the prompt (%r)" % ch.text)
    ck.ok(r.usage.completion_tokens == 0 and ch.finish_reason == "length", "max_tokens 0: nothing generated, length")
    ck.ok(lp is not None and len(lp.tokens) == n == len(ref.prompt_token_ids) and n > 5,
          "echo logprobs: one entry per prompt token (%s of %d)" % (lp and len(lp.tokens), n))
    if lp is None or len(lp.tokens) != n:
        return
    ck.ok(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "the first prompt token: logprob null")
    ck.ok(all(close(a, b["logprob"]) for a, b in zip(lp.token_logprobs[1:], ref.prompt_logprobs[1:])),
          "prompt token_logprobs as the protocol's prompt_logprobs")
    ck.ok(all(len(t) == 3 for t in lp.top_logprobs[1:]), "3 top_logprobs per prompt token")
    ck.ok(all(close(max(t.values()), b["top"][0][1]) for t, b in zip(lp.top_logprobs[1:], ref.prompt_logprobs[1:])),
          "the best alternative as the protocol's")
    offs = [0]
    for t in lp.tokens[:-1]:
        offs.append(offs[-1] + len(t.encode()))
    ck.ok(lp.text_offset == offs, "text_offset counts the token texts from 0 (%s)" % lp.text_offset[:6])
    # the mean logprob of the text (what scoring is for) is finite and negative
    vals = lp.token_logprobs[1:]
    ck.ok(all(v < 0 for v in vals), "prompt logprobs are negative")


def generation(ck, oc):
    plain = oc.completions.create(model="stories", prompt=TEXT, max_tokens=6, temperature=0, logprobs=2)
    r = oc.completions.create(model="stories", prompt=TEXT, max_tokens=6, temperature=0, logprobs=2, echo=True)
    ch, pc = r.choices[0], plain.choices[0]
    ck.ok(ch.text.startswith(TEXT) and ch.text[len(TEXT):].strip() == pc.text.strip() and
          len(ch.text) - len(TEXT) - len(pc.text) in (0, 1),
          "echo: the prompt then the plain request's text (%r, %r)" % (ch.text, pc.text))
    n = r.usage.prompt_tokens
    lp, pl = ch.logprobs, pc.logprobs
    ck.ok(len(lp.tokens) == n + len(pl.tokens), "echo logprobs: the prompt's tokens then the completion's")
    ck.ok(lp.token_logprobs[n:] == pl.token_logprobs, "the completion's token_logprobs as without echo")
    ck.ok(len(lp.text_offset) > n and lp.text_offset == sorted(lp.text_offset) and
          lp.text_offset[n] == sum(len(t.encode()) for t in lp.tokens[:n]),
          "text_offset goes on from the prompt's")
    st = oc.completions.create(model="stories", prompt=TEXT, max_tokens=6, temperature=0, logprobs=2, echo=True,
                               stream=True)
    text, lps = "", []
    for x in st:
        for y in x.choices:
            text += y.text or ""
            if y.logprobs is not None:
                lps += y.logprobs.token_logprobs
    ck.ok(text == ch.text, "streamed echo: the same text (%r)" % text)
    ck.ok(lps == lp.token_logprobs, "streamed echo: the same token_logprobs")
    st = oc.completions.create(model="stories", prompt=TEXT, max_tokens=0, echo=True, stream=True)
    text = "".join(y.text or "" for x in st for y in x.choices)
    ck.ok(text == TEXT, "streamed echo, max_tokens 0: the prompt (%r)" % text)
    r = oc.completions.create(model="stories", prompt=TEXT, max_tokens=6, temperature=0, echo=True)
    ck.ok(r.choices[0].text == ch.text and r.choices[0].logprobs is None, "echo without logprobs: text, no logprobs")


def extension(ck, gw):
    for path, body in (("/v1/completions", {"model": "stories", "prompt": TEXT}),
                       ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": TEXT}]})):
        body = dict(body, max_tokens=2, temperature=0, prompt_logprobs=2)
        st, _, b = gw.json("POST", path, body, {"Content-Type": "application/json"})
        plp = b.get("prompt_logprobs") if isinstance(b, dict) else None
        n = b["usage"]["prompt_tokens"] if isinstance(b, dict) and "usage" in b else -1
        ck.ok(st == 200 and isinstance(plp, list) and len(plp) == n and n > 5,
              "%s prompt_logprobs: one entry per prompt token (%s)" % (path, str(b)[:200]))
        if not isinstance(plp, list) or len(plp) < 2:
            continue
        ok = plp[0] is None and all(isinstance(e, dict) and 2 <= len(e) <= 3 and all(
            isinstance(v.get("logprob"), float) and "rank" in v and isinstance(v.get("decoded_token"), str)
            for v in e.values()) for e in plp[1:])
        ck.ok(ok, "%s prompt_logprobs: null, then {id: {logprob, rank, decoded_token}} (%s)" % (path, plp[1]))
        ranks = all(sorted(v["rank"] for v in e.values() if v["rank"] is not None)[:2] == [1, 2] for e in plp[1:])
        ck.ok(ranks, "%s prompt_logprobs: the top 2 ranked 1 and 2" % path)


def bad(ck, gw):
    for what, extra, param in (("max_tokens 0 without echo", {"max_tokens": 0}, "max_tokens"),
                               ("echo 1", {"echo": 1}, "echo"),
                               ("prompt_logprobs 21", {"prompt_logprobs": 21}, "prompt_logprobs")):
        body = dict({"model": "stories", "prompt": "a", "max_tokens": 2}, **extra)
        st, h, b = gw.json("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        error_ok(ck, what, st, b, 400, param)
    body = {"model": "chat", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2, "echo": True}
    st, h, b = gw.json("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    error_ok(ck, "echo on chat completions", st, b, 400, "echo")


def main():
    watchdog(120)
    ck = Checks("http_echo")
    try:
        import openai
    except ImportError as e:
        ck.ok(False, "the openai package: %s" % e)
        return ck.report()
    if not ck.ok(os.path.exists(os.path.join(BIN, "zllm-http")), "%s/zllm-http exists" % BIN):
        return ck.report()
    cl = Cluster()
    chat_model = os.path.join(cl.dir, "chat.gguf")
    q = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template", CHAT_TMPL,
                        STORIES, chat_model, "--force"], capture_output=True, text=True)
    ck.ok(q.returncode == 0, "a chat copy of stories260K (%s)" % q.stderr[-300:])
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
        oc = openai.OpenAI(base_url=gw.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        with cl.client() as c:
            scoring(ck, oc, c)
        generation(ck, oc)
        extension(ck, gw)
        bad(ck, gw)
    finally:
        if gw:
            gw.close()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
