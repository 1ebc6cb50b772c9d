#!/usr/bin/env python3
"""tests/test_e2e_chat_templates.py: `zllm chat` through a real broker and CPU worker on models whose GGUF carries
a Gemma 3 or a Qwen3 chat template (set into a copy of each model by set_template):
  - stories260K (its SentencePiece vocabulary);
  - Qwen3-style: a zllm-mkmodel qwen2 model with Qwen's vocabulary (llama.cpp's ggml-vocab-qwen2.gguf: <|im_start|>
    and <|im_end|> are control tokens, <|im_end|> ends generation) and Qwen3's own template (the model card's file
    in $ZLLM_FIXTURES/templates);
  - Gemma 3's vocabulary (tests/data/tokenizer's vocab-only GGUF from Gemma 3 270M: <start_of_turn> and
    <end_of_turn> control tokens) and template on a zllm-mkmodel llama model, and the same model without a template
    (as Gemma 3 base models come): the broker's built-in Gemma template must render as Gemma 3's own does;
  - the real Gemma 3 270M file, when ZLLM_GEMMA3_GGUF names it (and the gemma3 architecture loads); reported as
    skipped otherwise.
The broker renders each turn with the C Jinja interpreter; the oracle renders the same conversation with Python's
jinja2 (as transformers does) and sends it as a raw prompt (--special --no-bos) with `zllm generate`. Greedy
decoding, so both answers must be the same text, turn after turn (the second turn's prompt holds the first
answer as the assistant message). The broker must not have fallen back to a hand-written template.
Prints "N passed, N failed"."""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, FIXTURES, STORIES, Checks, Cluster, watchdog  # noqa: E402
import chat_templates  # noqa: E402
from test_jinja import py_env  # noqa: E402
from test_chat import vocab_info  # noqa: E402

SYSTEM = "You tell short stories."
TURNS = ["Once upon a time", "Tell me more about the cat"]
GEN = ["-n", "12", "--temp", "0", "--ignore-eos", "--no-stream"]


def zllm(cl, args, stdin=None):
    p = subprocess.run([os.path.join(BIN, "zllm"), args[0], "--broker", cl.clients_ep] + args[1:], input=stdin,
                       capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def mkmodel(ck, tmp, name, vocab, arch):
    """a small random model of arch with vocab's tokenizer, or None"""
    out = os.path.join(tmp, "mk-%s.gguf" % name)
    p = subprocess.run([os.path.join(BIN, "zllm-mkmodel"), "-o", out, "--preset", "tiny-" + arch, "--tied",
                        "--type", "q8_0", "--threads", "2", "--vocab-from", vocab], capture_output=True, text=True,
                       timeout=120)
    return out if ck.ok(p.returncode == 0 and os.path.exists(out), "%s: zllm-mkmodel with %s: %s" %
                        (name, vocab, p.stderr[-300:])) else None


def set_template(src, dst, tmpl):
    """copies the GGUF src to dst with tokenizer.chat_template = tmpl: the key-value section is rewritten and the
    tensor infos and data are copied as they are (the gguf package's gguf_new_metadata parses every array and takes
    ~15 s on a 150K-merge vocabulary)"""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(src, "rb") as f:
        m = f.read()
    assert m[:4] == b"GGUF", src

    def skip(t, p):
        if t in sizes:
            return p + sizes[t]
        if t == 8:
            return p + 8 + struct.unpack_from("<Q", m, p)[0]
        et, n = struct.unpack_from("<IQ", m, p)
        p += 12
        if et in sizes:
            return p + n * sizes[et]
        for _ in range(n):
            p = skip(et, p)
        return p

    version, n_t, n_kv = struct.unpack_from("<IQQ", m, 4)
    pos, kvs, align = 24, [], 32
    for _ in range(n_kv):
        start = pos
        (kl,) = struct.unpack_from("<Q", m, pos)
        key = m[pos + 8:pos + 8 + kl]
        pos += 8 + kl
        (t,) = struct.unpack_from("<I", m, pos)
        if key == b"general.alignment":
            align = struct.unpack_from("<I", m, pos + 4)[0]
        pos = skip(t, pos + 4)
        if key != b"tokenizer.chat_template":
            kvs.append(m[start:pos])
    info = pos
    for _ in range(n_t):
        (nl,) = struct.unpack_from("<Q", m, pos)
        pos += 8 + nl
        (nd,) = struct.unpack_from("<I", m, pos)
        pos += 4 + 8 * nd + 4 + 8
    infos, data = m[info:pos], m[(pos + align - 1) // align * align:]
    k, v = b"tokenizer.chat_template", tmpl.encode("utf-8")
    kvs.append(struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v)
    out = m[:4] + struct.pack("<IQQ", version, n_t, len(kvs)) + b"".join(kvs) + infos
    out += b"\0" * (-len(out) % align) + data
    with open(dst, "wb") as f:
        f.write(out)


def one_family(ck, tmp, name, tmpl, base=STORIES, builtin=None):
    """base with tokenizer.chat_template = tmpl: `zllm chat` against jinja2's renders. builtin: base has no
    template and the broker's built-in family of that name renders as tmpl does"""
    model = base
    if builtin is None:
        model = os.path.join(tmp, "%s.gguf" % name)
        set_template(base, model, tmpl)
    if not ck.ok(vocab_info(model)[2] == (tmpl if builtin is None else None), "%s: %s %s" %
                 (name, model, "carries the template" if builtin is None else "has no template")):
        return
    bos, eos, _ = vocab_info(model)   # the texts the broker gives bos_token and eos_token
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
            prompt = t.render(messages=msgs, bos_token=bos, eos_token=eos, add_generation_prompt=True,
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
        if builtin is None:
            ck.ok("built-in" not in logs, "%s: the broker rendered with the Jinja interpreter (no fallback)" % name)
        else:
            ck.ok("built-in %s template" % builtin in logs, "%s: the broker says the built-in %s template rendered"
                  % (name, builtin))
    finally:
        cl.close()


def main():
    watchdog(240)
    ck = Checks("e2e_chat_templates")
    for b in ("zllm", "zllm-broker", "zllm-worker"):
        if not ck.ok(os.access(os.path.join(BIN, b), os.X_OK), "%s built" % b):
            return ck.report()
    for b in ("zllm-mkmodel",):
        if not ck.ok(os.access(os.path.join(BIN, b), os.X_OK), "%s built" % b):
            return ck.report()
    qwen_vocab = os.path.join(FIXTURES, "vocab", "ggml-vocab-qwen2.gguf")
    gemma_vocab = os.path.join(FIXTURES, "vocab", "ggml-vocab-gemma3.gguf")
    qwen3_file = os.path.join(FIXTURES, "templates", "Qwen-Qwen3-0.6B.jinja")
    for f in (qwen_vocab, gemma_vocab, qwen3_file):
        if not ck.ok(os.path.isfile(f), "%s is there (tests/fetch-fixtures.sh)" % f):
            return ck.report()
    with open(qwen3_file, encoding="utf-8") as f:
        qwen3 = f.read()
    with tempfile.TemporaryDirectory(prefix="zllm-chattmpl-") as tmp:
        one_family(ck, tmp, "stories-gemma3", chat_templates.GEMMA3)
        one_family(ck, tmp, "stories-qwen3", chat_templates.QWEN3)
        m = mkmodel(ck, tmp, "qwen3-style", qwen_vocab, "qwen2")
        if m:
            one_family(ck, tmp, "qwen3-style", qwen3, base=m)
        m = mkmodel(ck, tmp, "gemma3-vocab", gemma_vocab, "llama")
        if m:
            one_family(ck, tmp, "gemma3-vocab", chat_templates.GEMMA3, base=m)
            one_family(ck, tmp, "gemma3-vocab-no-template", chat_templates.GEMMA3, base=m, builtin="Gemma")
        real = os.environ.get("ZLLM_GEMMA3_GGUF")
        if real:
            one_family(ck, tmp, "gemma3-270m", chat_templates.GEMMA3, base=real)
            if vocab_info(real)[2] is None:   # the base model's file: the built-in Gemma template
                one_family(ck, tmp, "gemma3-270m-no-template", chat_templates.GEMMA3, base=real, builtin="Gemma")
        else:
            print("skipped: the real Gemma 3 270M file (set ZLLM_GEMMA3_GGUF to run it)")
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
