"""tests/test_python_client.py: the Python client (clients/python) against a real broker and CPU worker.

- Exceptions by default: an unknown model raises ZllmRequestError (code unknown_model), a cancelled request
  ZllmCancelled, no broker ZllmUnavailable (unreachable), a broker without workers ZllmTimeout (client_timeout,
  and timeout when the request's deadline passes on the broker), each carrying its code and the Result so far;
  the same in stream() and in the AsyncClient.
- The result form (raise_on_error=False): the same outcomes as Results (ok False, code and message set).
- chat(messages) sends the protocol's chat request: on a copy of stories260K given a Llama 2 chat template its
  answer equals a raw-prompt request of the template rendered by zllm-tokenize --chat; on the model without a
  template it raises ZllmRequestError template_error.
- `pip install ./clients/python` (into a --target folder) installs an importable package of the version in
  common/version.h and leaves `git status` of the tree as it was (no build/, no *.egg-info).
Prints "N passed, N failed"."""
import asyncio
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, ROOT, STORIES, Checks, Cluster, golden_ids, watchdog, zllm  # noqa: E402

# Llama-2-7b-chat-hf's template (tests/test_chat.py checks our rendering of it against jinja2)
LLAMA2 = (r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          r"messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          r"{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          r"{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + "
          r"'\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          r"{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          r"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          r"{% endfor %}")


def expect_raise(ck, what, cls, code, fn):
    """fn() must raise cls with .code == code; returns the exception or None"""
    try:
        r = fn()
    except zllm.ZllmError as e:
        ck.ok(isinstance(e, cls) and e.code == code, "%s: %s code %s (want %s %s)" % (
            what, type(e).__name__, e.code, cls.__name__, code))
        return e
    ck.ok(False, "%s: no exception (returned %r)" % (what, r))
    return None


def check_errors(ck, cl, idle):
    gold = golden_ids()
    with cl.client() as c:
        r = c.generate(tokens=[1], max_tokens=20, temperature=0, ignore_eos=True)
        ck.ok(r.ok and r.token_ids == gold[:20], "a good request: golden ids, no exception")
        e = expect_raise(ck, "unknown model", zllm.ZllmRequestError, "unknown_model",
                         lambda: c.generate("Once", model="nope", max_tokens=3))
        ck.ok(e is not None and e.result is not None and e.result.finish_reason == "error" and "nope" in str(e),
              "unknown model: the exception carries the Result and the broker's message (%s)" % e)
        r = c.generate("Once", model="nope", max_tokens=3, raise_on_error=False)
        ck.ok(isinstance(r, zllm.Result) and not r.ok and r.finish_reason == "error" and r.code == "unknown_model"
              and r.message, "result form: unknown_model as a Result (%r)" % r)
        # stream(): the error at the end of the stream, or as the last delta
        got = []

        def drain():
            for d in c.stream("Once", model="nope"):
                got.append(d)
        expect_raise(ck, "stream unknown model", zllm.ZllmRequestError, "unknown_model", drain)
        ds = list(c.stream("Once", model="nope", raise_on_error=False))
        ck.ok(ds and ds[-1].result is not None and ds[-1].result.code == "unknown_model",
              "stream result form: the last delta's result says unknown_model")
        # a cancelled request
        it = c.stream(tokens=[1], max_tokens=300, temperature=0, ignore_eos=True)
        first = next(it)
        c.cancel(first.id)

        def rest():
            for _ in it:
                pass
        e = expect_raise(ck, "cancelled", zllm.ZllmCancelled, "cancelled", rest)
        ck.ok(e is not None and e.result is not None and e.result.finish_reason == "cancelled" and
              0 < len(e.result.token_ids) < 300, "cancelled: the Result so far rides on the exception")
        # chat() on a model without a template: the chat request reached the broker's renderer
        expect_raise(ck, "chat without a template", zllm.ZllmRequestError, "template_error",
                     lambda: c.chat([{"role": "user", "content": "Hi"}], max_tokens=3))
        r = c.chat([("user", "Hi")], max_tokens=3, raise_on_error=False)
        ck.ok(r.code == "template_error" and not r.ok, "chat result form: template_error (%r)" % r)
        try:
            c.chat([{"role": "user", "content": 5}])
            ck.ok(False, "chat with a non-string content: no TypeError")
        except TypeError:
            ck.ok(True, "")
    # no broker at all
    nobody = zllm.Client("ipc:///tmp/zllm-test-pyclient-nobody-%d" % os.getpid(), send_timeout=0.5)
    expect_raise(ck, "no broker", zllm.ZllmUnavailable, "unreachable", lambda: nobody.generate("x"))
    r = nobody.generate("x", raise_on_error=False)
    ck.ok(not r.ok and r.code == "unreachable" and r.finish_reason == "error", "no broker, result form: %r" % r)
    nobody.close()
    # a broker without workers: the client's own timeout, and the broker's deadline
    with zllm.Client(idle.clients_ep, grace=0.5) as c:
        expect_raise(ck, "no worker, client timeout", zllm.ZllmTimeout, "client_timeout",
                     lambda: c.generate("Once", max_tokens=3, timeout=1.0))
        r = c.generate("Once", max_tokens=3, timeout=1.0, raise_on_error=False)
        ck.ok(not r.ok and r.code == "client_timeout" and r.finish_reason == "timeout", "client timeout: %r" % r)
        expect_raise(ck, "no worker, deadline", zllm.ZllmTimeout, "timeout",
                     lambda: c.generate("Once", max_tokens=3, deadline_ms=500))
        r = c.generate("Once", max_tokens=3, deadline_ms=500, raise_on_error=False)
        ck.ok(not r.ok and r.code == "timeout" and r.finish_reason == "timeout", "broker deadline: %r" % r)

    async def run_async():
        ac = zllm.AsyncClient(cl.clients_ep)
        try:
            ok = await ac.generate(tokens=[1], max_tokens=10, temperature=0, ignore_eos=True)
            try:
                await ac.generate("Once", model="nope")
                err = None
            except zllm.ZllmError as e:
                err = e
            res = await ac.chat([{"role": "user", "content": "Hi"}], raise_on_error=False)
            return ok, err, res
        finally:
            ac.close()
    ok, err, res = asyncio.run(run_async())
    ck.ok(ok.token_ids == gold[:10], "AsyncClient: golden ids")
    ck.ok(isinstance(err, zllm.ZllmRequestError) and err.code == "unknown_model", "AsyncClient raises: %r" % err)
    ck.ok(res.code == "template_error", "AsyncClient chat result form: %r" % res)


def check_chat(ck, tmp):
    """chat() against the same conversation rendered by zllm-tokenize and sent as a raw prompt"""
    model = os.path.join(tmp, "stories-chat.gguf")
    p = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template", LLAMA2, STORIES,
                        model], capture_output=True, text=True, timeout=60)
    if not ck.ok(p.returncode == 0 and os.path.exists(model), "a templated copy of stories260K: %s" % p.stderr[-300:]):
        return
    msgs = [{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": "Once upon"}]
    inp = b"".join(x.encode() + b"\0" for m in msgs for x in (m["role"], m["content"]))
    p = subprocess.run([os.path.join(BIN, "zllm-tokenize"), "-m", model, "--chat"], input=inp, capture_output=True,
                       timeout=30)
    rendered = p.stdout.decode()
    if not ck.ok(p.returncode == 0 and "[INST]" in rendered, "zllm-tokenize --chat renders: %r" % rendered):
        return
    cl = Cluster(model=model, model_name="chat")
    try:
        cl.start_broker()
        cl.start_worker("w1", max_batch=2)
        if not ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "chat worker registered"):
            cl.dump_logs()
            return
        with cl.client() as c:
            a = c.chat(msgs, max_tokens=24, temperature=0, ignore_eos=True)
            b = c.generate(rendered, special=True, add_bos=False, max_tokens=24, temperature=0, ignore_eos=True)
            ck.ok(a.ok and len(a.token_ids) == 24 and a.token_ids == b.token_ids and a.text == b.text,
                  "chat(): the same answer as the rendered prompt (%r vs %r)" % (a.text[:40], b.text[:40]))
            ck.ok(a.usage.get("prompt_tokens") == b.usage.get("prompt_tokens"),
                  "chat(): the same prompt length (%s)" % a.usage)
    finally:
        cl.close()


def check_install(ck, tmp):
    """pip install ./clients/python leaves the tree as it was"""
    def tree_state():
        p = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--",
                            "clients/python"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return p.returncode, sorted(x for x in p.stdout.splitlines() if "__pycache__" not in x)
    before = tree_state()
    target = os.path.join(tmp, "site")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", target,
           os.path.join(ROOT, "clients", "python")]
    try:
        import flit_core  # noqa: F401  the backend is here: build offline
        cmd.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ck.ok(p.returncode == 0, "pip install ./clients/python: exit %d %s" % (p.returncode, p.stderr[-400:]))
    after = tree_state()
    ck.ok(before[0] == 0 and after == before, "the tree is as before the install: %s -> %s" % (before, after))
    ck.ok(not os.path.exists(os.path.join(ROOT, "clients", "python", "build")) and
          not [f for f in os.listdir(os.path.join(ROOT, "clients", "python")) if f.endswith(".egg-info")],
          "no build/ and no *.egg-info under clients/python")
    with open(os.path.join(ROOT, "common", "version.h")) as f:
        ver = re.search(r'#define ZLLM_VERSION "([^"]+)"', f.read()).group(1)
    p = subprocess.run([sys.executable, "-c", "import zllm, sys; print(zllm.__file__); print(zllm.__version__); "
                        "print(issubclass(zllm.ZllmTimeout, zllm.ZllmError), hasattr(zllm.Client, 'chat'))"],
                       env=dict(os.environ, PYTHONPATH=target), cwd=tmp, capture_output=True, text=True, timeout=30)
    lines = p.stdout.split("\n")
    ck.ok(p.returncode == 0 and lines[0].startswith(target) and lines[1] == ver and lines[2] == "True True",
          "the installed package imports from the target, version %s: %r %s" % (ver, p.stdout, p.stderr[-200:]))


def main():
    watchdog(240)
    ck = Checks("python_client")
    with tempfile.TemporaryDirectory(prefix="zllm-pyclient-") as tmp:
        check_install(ck, tmp)
        cl, idle = Cluster(model_name="stories"), Cluster(model_name="stories")
        try:
            cl.start_broker()
            cl.start_worker("w1", "--debug-step-delay-ms", "10", max_batch=4)
            idle.start_broker()
            if ck.ok(cl.wait_workers(["w1"], timeout=15) is not None, "worker registered"):
                check_errors(ck, cl, idle)
            else:
                cl.dump_logs()
        finally:
            cl.close()
            idle.close()
        check_chat(ck, tmp)
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
