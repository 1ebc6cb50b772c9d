#!/usr/bin/env python3
"""tests/test_http_tools.py: tool turns through the whole chat path. zllm-http parses OpenAI messages with
assistant tool_calls and role "tool" results, the protocol carries them, the broker renders them with a model's
chat template (Qwen3's own file from $ZLLM_FIXTURES/templates, set into a copy of llama.cpp's Qwen2 vocabulary
GGUF); the prompt token ids the (fake, tests/broker_fake.py) worker receives must equal the tokens of Python
jinja2's render of the same conversation (tests/test_jinja_tools.py's oracle: each call's arguments string parsed
into its JSON value), tokenized by the gateway's /tokenize with the same vocabulary. Also the 400s: a tool
message without tool_call_id, tool_calls on a user message or not an array, a call without a function name.
Prints "N passed, N failed"."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmq  # noqa: E402
from broker_fake import Broker, FakeWorker  # noqa: E402
from e2e_cluster import BIN, FIXTURES, Checks, watchdog  # noqa: E402
from http_gateway import Gateway, error_ok  # noqa: E402
from test_e2e_chat_templates import set_template  # noqa: E402
from test_jinja import py_env  # noqa: E402
from test_jinja_tools import CONVS, py_messages  # noqa: E402

QWEN_VOCAB = os.path.join(FIXTURES, "vocab", "ggml-vocab-qwen2.gguf")
QWEN3_TMPL = os.path.join(FIXTURES, "templates", "Qwen-Qwen3-0.6B.jinja")


class Recorder(dict):
    """the fake worker's sequence table, remembering the prompt ids of every assigned sequence in order"""

    def __init__(self):
        super().__init__()
        self.prompts = []

    def __setitem__(self, k, v):
        self.prompts.append(list(v["tokens"]))
        super().__setitem__(k, v)


def main():
    watchdog(120)
    ck = Checks("http_tools")
    for f in (QWEN_VOCAB, QWEN3_TMPL, os.path.join(BIN, "zllm-http")):
        if not ck.ok(os.path.exists(f), "%s exists" % f):
            return ck.report()
    with open(QWEN3_TMPL, encoding="utf-8") as f:
        tmpl = f.read()
    tmp = tempfile.mkdtemp(prefix="zllm-http-tools-")
    model = os.path.join(tmp, "qwen3-tmpl.gguf")
    set_template(QWEN_VOCAB, model, tmpl)
    env = py_env()
    ctx = zmq.Context()
    b = Broker(os.path.join(BIN, "zllm-broker"), models=["tools=" + model])
    w = FakeWorker(ctx, b.workers, model="tools", n_slots=2, n_ctx=4096, vocab_size=200000)
    rec = Recorder()
    w.seqs = rec
    gw = Gateway(b.clients, "--model", "tools=" + model)
    try:
        ck.ok(w.registered.wait(10), "fake worker registered")
        gw.wait_up()
        for what, msgs in CONVS.items():
            want_text = env.from_string(tmpl).render(messages=py_messages(msgs), bos_token="", eos_token="<|im_end|>",
                                                     add_generation_prompt=True, tools=None, documents=None)
            st, _, tk = gw.json("POST", "/tokenize", {"model": "tools", "content": want_text, "add_special": False,
                                                      "parse_special": True})
            if not ck.ok(st == 200 and tk and tk.get("tokens"), "%s: /tokenize: %s %r" % (what, st, tk)):
                continue
            # OpenAI's shape: content null on a call without text
            sent = [dict(m, content=None) if m.get("tool_calls") and not m["content"] else m for m in msgs]
            n0 = len(rec.prompts)
            st, _, body = gw.json("POST", "/v1/chat/completions", {"model": "tools", "messages": sent,
                                                                   "max_tokens": 1, "temperature": 0})
            ck.ok(st == 200 and body and body.get("object") == "chat.completion", "%s: %s %r" % (what, st, body))
            got = rec.prompts[n0] if len(rec.prompts) > n0 else None
            ck.ok(got == tk["tokens"], "%s: the worker's prompt (%d ids) differs from jinja2's render (%d ids):\n"
                  "  %r" % (what, len(got or []), len(tk["tokens"]), want_text[-300:]))
            ck.ok(body is not None and body.get("usage", {}).get("prompt_tokens") == len(tk["tokens"]),
                  "%s: usage.prompt_tokens %r" % (what, body and body.get("usage")))
        u = {"role": "user", "content": "hi"}
        call = {"id": "abc123def", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for what, msgs, param in [
                ("tool without tool_call_id", [u, {"role": "tool", "content": "x"}], "messages[1]"),
                ("tool_call_id not a string", [u, {"role": "tool", "content": "x", "tool_call_id": 7}], "messages[1]"),
                ("tool_calls on a user message", [dict(u, tool_calls=[call])], "messages[0].tool_calls"),
                ("tool_calls not an array", [u, {"role": "assistant", "content": None, "tool_calls": call}],
                 "messages[1].tool_calls"),
                ("a call without a name", [u, {"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]}],
                 "messages[1].tool_calls")]:
            st, _, body = gw.json("POST", "/v1/chat/completions", {"model": "tools", "messages": msgs})
            error_ok(ck, what, st, body, 400, param)
    finally:
        gw.close()
        w.close()
        b.stop()
        ctx.term()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
