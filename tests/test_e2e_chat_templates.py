#!/usr/bin/env python3
"""tests/test_e2e_chat_templates.py: `zllm chat` through a real broker and CPU worker on models whose GGUF carries
a Gemma 3 or a Qwen3 chat template (copies of stories260K with tokenizer.chat_template set by the gguf package).
The broker renders each turn with the C Jinja interpreter; the oracle renders the same conversation with Python's
jinja2 (as transformers does) and sends it as a raw prompt (--special --no-bos) with `zllm generate`. Greedy
decoding, so both answers must be the same text, turn after turn (the second turn's prompt holds the first
answer as the assistant message). The broker must not have fallen back to a hand-written template.
Prints "N passed, N failed"."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, STORIES, Checks, Cluster, watchdog  # noqa: E402
import chat_templates  # noqa: E402
from test_jinja import py_env  # noqa: E402

SYSTEM = "You tell short stories."
TURNS = ["Once upon a time", "Tell me more about the cat"]
GEN = ["-n", "12", "--temp", "0", "--ignore-eos", "--no-stream"]


def zllm(cl, args, stdin=None):
    p = subprocess.run([os.path.join(BIN, "zllm"), args[0], "--broker", cl.clients_ep] + args[1:], input=stdin,
                       capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def one_family(ck, tmp, name, tmpl):
    model = os.path.join(tmp, "stories-%s.gguf" % name)
    p = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template", tmpl, STORIES,
                        model], capture_output=True, text=True, timeout=60)
    if not ck.ok(p.returncode == 0 and os.path.exists(model), "%s: a templated copy of stories260K: %s" %
                 (name, p.stderr[-300:])):
        return
    env = py_env()
    t = env.from_string(tmpl)
    cl = Cluster(model=model, model_name=name)
    try:
        cl.start_broker()
        cl.start_worker("w1", max_batch=2)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "%s: worker registered" % name):
            cl.dump_logs()
            return
        rc, out, err = zllm(cl, ["chat", "--system", SYSTEM] + GEN, stdin=("\n".join(TURNS) + "\n/quit\n").encode())
        ck.ok(rc == 0 and out, "%s: zllm chat ran (rc %d): %s" % (name, rc, err[-300:]))
        # the oracle: each turn rendered by jinja2, sent as a raw prompt
        msgs = [{"role": "system", "content": SYSTEM}]
        want = ""
        for turn in TURNS:
            msgs.append({"role": "user", "content": turn})
            prompt = t.render(messages=msgs, bos_token="<s>", eos_token="</s>", add_generation_prompt=True,
                              tools=None, documents=None)
            rc2, ans, err2 = zllm(cl, ["generate", "-p", prompt, "--special", "--no-bos"] + GEN)
            if not ck.ok(rc2 == 0 and ans.endswith("\n"), "%s: zllm generate of the jinja2 prompt: %s" % (name, err2)):
                return
            want += ans
            msgs.append({"role": "assistant", "content": ans[:-1]})
        ck.ok(out == want, "%s: zllm chat's answers equal those to the jinja2-rendered prompts\n  chat %r\n  want %r"
              % (name, out, want))
        logs = ""
        for lg in cl.logs:
            with open(lg, "rb") as f:
                logs += f.read().decode("utf-8", "replace")
        ck.ok("built-in" not in logs, "%s: the broker rendered with the Jinja interpreter (no fallback)" % name)
    finally:
        cl.close()


def main():
    watchdog(240)
    ck = Checks("e2e_chat_templates")
    for b in ("zllm", "zllm-broker", "zllm-worker"):
        if not ck.ok(os.access(os.path.join(BIN, b), os.X_OK), "%s built" % b):
            return ck.report()
    with tempfile.TemporaryDirectory(prefix="zllm-chattmpl-") as tmp:
        one_family(ck, tmp, "gemma3", chat_templates.GEMMA3)
        one_family(ck, tmp, "qwen3", chat_templates.QWEN3)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
