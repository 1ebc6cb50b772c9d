#!/usr/bin/env python3
"""tests/test_jinja_tools.py: tool turns of a chat (assistant messages with tool_calls, role "tool" results with
their tool_call_id) rendered by the C chat path (common/chat.c through build/bin/zllm-template --tools, the fields
zl_chat_msg carries from the broker) against Python's jinja2 set up as transformers' apply_chat_template does
(tests/test_jinja.py's py_env). The caller's side is OpenAI's: each call's function "arguments" is a JSON string;
the template sees it parsed into its value (as vLLM hands tool calls to transformers' templates), a string that
is not JSON stays a string. Byte equality is required, and the same outcome when the template raises.

Templates: the model cards' files in $ZLLM_FIXTURES/templates (tests/fetch-fixtures.sh) that render tool turns
(Qwen3, Llama 3.1 and 3.2, Mistral Nemo, Mistral Small 3.2, Devstral) and Phi-3.5 mini's (which prints a tool
turn as any other role), on conversations with one and several calls, several results, nested, numeric, boolean,
null and non-ASCII arguments, arguments that are not JSON, a call without content and one with content, with and
without the generation prompt. Prints "N passed, N failed"."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_jinja import FIX, TOOL, py_env  # noqa: E402

passed = failed = 0

TEMPLATES = {   # fixture name -> (bos, eos)
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "unsloth-mistral-Devstral-Small-2507": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
}


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL " + msg, file=sys.stderr)


def call(cid, name, args):
    """an OpenAI tool call; args: a dict (sent as its JSON text) or a str (sent as is)"""
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


def assistant_calls(calls, content=""):
    return {"role": "assistant", "content": content, "tool_calls": calls}


def tool(cid, content):
    return {"role": "tool", "tool_call_id": cid, "content": content}


U = {"role": "user", "content": "What is the weather in Paris and in Zürich?"}
S = {"role": "system", "content": "You are a helpful assistant."}
CONVS = {
    "one call": [U, assistant_calls([call("abc123def", "get_weather", {"city": "Paris"})]),
                 tool("abc123def", "21 °C")],
    "one call, system": [S, U, assistant_calls([call("abc123def", "get_weather", {"city": "Paris"})]),
                         tool("abc123def", "21 °C"), {"role": "assistant", "content": "It is 21 °C in Paris."},
                         {"role": "user", "content": "Thanks"}],
    "two calls, two results": [U, assistant_calls([call("call00001", "get_weather", {"city": "Paris", "days": 3}),
                                                  call("call00002", "get_weather", {"city": "Zürich", "days": 1})]),
                               tool("call00001", "21 °C"), tool("call00002", "{\"t\": 12.5}")],
    "nested arguments": [U, assistant_calls([call("Xy7Zw9Q1a", "search", {
        "q": "weather \"now\"", "filters": {"lang": ["fr", "de"], "max": 10, "ratio": 0.25, "exact": True,
                                            "since": None}, "empty": {}, "list": []})]),
                         tool("Xy7Zw9Q1a", "[]")],
    "arguments not JSON": [U, assistant_calls([call("abc123def", "get_weather", "city=Paris")]),
                           tool("abc123def", "21 °C")],
    "call with content": [U, assistant_calls([call("abc123def", "get_weather", {"city": "Paris"})],
                                             content="Let me look that up."),
                          tool("abc123def", "sunny")],
}


def py_messages(msgs):
    """the messages transformers' template gets: arguments strings parsed where they hold JSON"""
    out = []
    for m in msgs:
        m = json.loads(json.dumps(m))
        for c in m.get("tool_calls", []):
            try:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            except ValueError:
                pass
        out.append(m)
    return out


def render_py(env, tmpl, msgs, bos, eos, gen):
    import jinja2
    try:
        return "jinja", env.from_string(tmpl).render(messages=py_messages(msgs), bos_token=bos, eos_token=eos,
                                                     add_generation_prompt=gen, tools=None, documents=None)
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return "raised", str(e)
        return "error", "%s: %s" % (type(e).__name__, e)
    except Exception as e:
        return "error", "%s: %s" % (type(e).__name__, e)


def render_c(tmpl, cases):
    """cases: [(msgs, bos, eos, gen)] through zllm-template --jinja --tools -> [(status, text)]"""
    with tempfile.NamedTemporaryFile("wb", suffix=".jinja", delete=False) as tf:
        tf.write(tmpl.encode("utf-8"))
    data = bytearray()
    for msgs, bos, eos, gen in cases:
        fields = [b"1" if gen else b"0", bos.encode(), eos.encode(), str(len(msgs)).encode()]
        for m in msgs:
            calls = json.dumps(m["tool_calls"], ensure_ascii=False) if "tool_calls" in m else ""
            fields += [m["role"].encode(), m["content"].encode(), m.get("tool_call_id", "").encode(),
                       calls.encode()]
        for f in fields:
            data += f + b"\0"
    try:
        p = subprocess.run([TOOL, "--jinja", "--tools", tf.name], input=bytes(data), capture_output=True, timeout=120)
    finally:
        os.unlink(tf.name)
    out, res, pos = p.stdout, [], 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        st, ln = out[pos:nl].decode().split(" ")
        ln = int(ln)
        res.append((st, out[nl + 1:nl + 1 + ln].decode("utf-8", "replace")))
        pos = nl + 1 + ln + 1
    return res, p.stderr.decode("utf-8", "replace")


def main():
    env = py_env()
    for name, (bos, eos) in TEMPLATES.items():
        path = os.path.join(FIX, "templates", name + ".jinja")
        check(os.path.isfile(path), "%s: template fixture missing (tests/fetch-fixtures.sh)" % path)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            tmpl = f.read()
        cases = [(msgs, bos, eos, gen) for msgs in CONVS.values() for gen in (True, False)]
        labels = ["%s, %s" % (what, "gen" if gen else "no gen") for what in CONVS for gen in (True, False)]
        got, err = render_c(tmpl, cases)
        check(len(got) == len(cases), "%s: %d results for %d cases: %s" % (name, len(got), len(cases), err[-300:]))
        rendered = 0
        for label, case, g in zip(labels, cases, got):
            want = render_py(env, tmpl, *case)
            if want[0] == "error":   # jinja2 itself cannot render it: the C side must not render it either
                check(g[0] != "jinja", "%s (%s): jinja2 fails (%s) but C rendered" % (name, label, want[1]))
                continue
            rendered += want[0] == "jinja"
            if want[0] == "raised":   # the C message names the template line before raise_exception's text
                check(g[0] == "raised" and g[1].endswith(want[1]), "%s (%s): C %s %r, jinja2 raised %r" % (
                    name, label, g[0], g[1][-400:], want[1]))
                continue
            check(g == want, "%s (%s): C %s %r\n  jinja2 %s %r" % (name, label, g[0], g[1][-400:], want[0],
                                                                  want[1][-400:]))
        # the tool turns reach the template: a render holds the result text or the call's name
        check(rendered > 0, "%s: jinja2 rendered none of the tool conversations" % name)
        print("%s: %d tool conversations x 2, %d rendered by jinja2" % (name, len(CONVS), rendered))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
