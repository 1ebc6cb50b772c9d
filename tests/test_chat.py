#!/usr/bin/env python3
"""tests/test_chat.py: our C chat-template rendering (zllm-tokenize --chat) against an oracle we did not write:
the Jinja template itself rendered by Python jinja2, the way Hugging Face's apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, raise_exception), with add_generation_prompt and the
vocabulary's own bos_token / eos_token texts. Byte equality is required.

Templates: the GGUF's own tokenizer.chat_template for SmolLM2-135M-Instruct (deploy/fetch-model.sh) and the Qwen2
vocab. The Llama 3 (llama-bpe) and Llama 2 (llama-spm) vocab GGUFs carry no template, so the well-known templates of
those families (as published in Meta's tokenizer_config.json files) are given below as Python strings, together
with Mistral-7B-Instruct's [INST] template. A template the Jinja interpreter supports renders whatever its family;
one that uses an unsupported construct and matches no hand-written family is refused with "send a raw prompt".
Prints "N passed, N failed"."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("ZLLM_BUILD", "build")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import fixtures  # noqa: E402
TOOL = os.path.join(ROOT, BUILD, "bin", "zllm-tokenize")

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL " + msg, file=sys.stderr)


# Meta-Llama-3-8B-Instruct
LLAMA3 = (r"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          r"'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          r"'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          r"{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          r"{% endif %}")
# Llama-2-7b-chat-hf
LLAMA2 = (r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          r"messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          r"{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          r"{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + "
          r"'\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          r"{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          r"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          r"{% endfor %}")
# Mistral-7B-Instruct-v0.1 (two published revisions: with and without a space after eos_token)
MISTRAL = (r"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           r"{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           r"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
           r"{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MISTRAL_NOSPACE = MISTRAL.replace("eos_token + ' '", "eos_token")

CONVS = {
    "sys": [("system", "You are a terse assistant."), ("user", "Hello! How are you?"),
            ("assistant", "I am fine, thanks."), ("user", "Write a haiku about\nthe sea.")],
    "nosys": [("user", "  Bonjour, ça va ? 🦙 "), ("assistant", "Oui !\n"), ("user", "<b>x</b> & 'quotes' \"too\"")],
    "one": [("user", "Hi")],
    "alt": [("system", "S"), ("assistant", "out of turn")],
}


def render_jinja(tmpl, msgs, bos, eos, add_gen):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(m):
        raise jinja2.exceptions.TemplateError(m)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(tmpl).render(messages=[{"role": r, "content": c} for r, c in msgs],
                                            add_generation_prompt=add_gen, bos_token=bos, eos_token=eos)
    except jinja2.exceptions.TemplateError:
        return None


def render_c(model, msgs, add_gen, tmpl=None, mode=None):
    args = [TOOL, "-m", model, "--chat"] + (["--chat-render", mode] if mode else [])
    if not add_gen:
        args.append("--no-gen")
    tf = None
    if tmpl is not None:
        tf = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False, encoding="utf-8")
        tf.write(tmpl)
        tf.close()
        args += ["--template", tf.name]
    data = b"".join(r.encode() + b"\0" + c.encode() + b"\0" for r, c in msgs)
    try:
        p = subprocess.run(args, input=data, capture_output=True, timeout=60)
    finally:
        if tf:
            os.unlink(tf.name)
    return (p.stdout.decode("utf-8") if p.returncode == 0 else None), p.stderr.decode("utf-8", "replace")


def vocab_info(path):
    """(bos text, eos text, chat template or None) from the GGUF's metadata. A small reader of the GGUF layout:
    the gguf package's GGUFReader takes ~20 s on a 280K-merge vocabulary, too slow for a test."""
    import mmap
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        assert m[:4] == b"GGUF", path
        _, _, n_kv = struct.unpack_from("<IQQ", m, 4)
        pos = 24
        kv = {}
        tokens = None

        def rstr(p):
            (n,) = struct.unpack_from("<Q", m, p)
            return m[p + 8:p + 8 + n], p + 8 + n

        def skip(t, p):
            if t in sizes:
                return p + sizes[t]
            if t == 8:
                return rstr(p)[1]
            et, n = struct.unpack_from("<IQ", m, p)
            p += 12
            if et in sizes:
                return p + n * sizes[et]
            for _ in range(n):
                p = skip(et, p)
            return p

        for _ in range(n_kv):
            key, pos = rstr(pos)
            key = key.decode()
            (t,) = struct.unpack_from("<I", m, pos)
            pos += 4
            if key == "tokenizer.ggml.tokens":
                et, n = struct.unpack_from("<IQ", m, pos)
                p = pos + 12
                tokens = []
                for _ in range(n):
                    (ln,) = struct.unpack_from("<Q", m, p)
                    tokens.append((p + 8, ln))
                    p += 8 + ln
                pos = p
            elif t == 8:
                v, pos = rstr(pos)
                kv[key] = v.decode("utf-8")
            elif t in (4, 5, 10, 11) and key.endswith("_token_id"):
                kv[key] = struct.unpack_from("<" + {4: "I", 5: "i", 10: "Q", 11: "q"}[t], m, pos)[0]
                pos += sizes[t]
            else:
                pos = skip(t, pos)

        def tok(i):
            if i is None:
                return ""
            o, ln = tokens[i]
            return m[o:o + ln].decode("utf-8")

        return (tok(kv.get("tokenizer.ggml.bos_token_id")), tok(kv.get("tokenizer.ggml.eos_token_id")),
                kv.get("tokenizer.chat_template"))
    finally:
        m.close()


def case(name, model, tmpl_for_c, tmpl_jinja, bos, eos, convs, gens=(True, False)):
    for cname in convs:
        msgs = CONVS[cname]
        for gen in gens:
            want = render_jinja(tmpl_jinja, msgs, bos, eos, gen)
            got, err = render_c(model, msgs, gen, tmpl_for_c)
            if want is None:
                check(got is None, "%s/%s gen=%d: jinja raises, we rendered %r" % (name, cname, gen, got))
                continue
            check(got == want, "%s/%s gen=%d:\n  want %r\n  got  %r %s" % (name, cname, gen, want, got, err))


def main():
    try:
        import jinja2  # noqa: F401
    except ImportError as e:
        print("FAIL missing python module: %s (bash deploy/deps.sh)" % e, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    if not os.access(TOOL, os.X_OK):
        print("FAIL %s not built" % TOOL, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    for n in ("qwen2", "llama-bpe", "llama-spm"):
        fixtures.path("vocab", "ggml-vocab-%s.gguf" % n)   # raises, naming the file, when it is missing
    vocab = os.path.join(fixtures.root(), "vocab")
    smol = subprocess.run(["bash", os.path.join(ROOT, "deploy", "fetch-model.sh")], capture_output=True,
                          text=True).stdout.strip()
    check(os.path.isfile(smol), "SmolLM2 model from deploy/fetch-model.sh: %r" % smol)
    all_convs = ("sys", "nosys", "one")
    if os.path.isfile(smol):
        bos, eos, tmpl = vocab_info(smol)
        check(tmpl is not None and "<|im_start|>" in tmpl, "SmolLM2 GGUF has a ChatML template")
        case("smollm2", smol, None, tmpl, bos, eos, all_convs)
    q = os.path.join(vocab, "ggml-vocab-qwen2.gguf")
    bos, eos, tmpl = vocab_info(q)
    check(tmpl is not None, "qwen2 vocab has a template")
    case("qwen2", q, None, tmpl, bos, eos, all_convs)
    l3 = os.path.join(vocab, "ggml-vocab-llama-bpe.gguf")
    bos, eos, tmpl = vocab_info(l3)
    check(tmpl is None, "llama-bpe vocab has no template (so the well-known one is used)")
    case("llama3", l3, LLAMA3, LLAMA3, bos, eos, all_convs)
    l2 = os.path.join(vocab, "ggml-vocab-llama-spm.gguf")
    bos, eos, _ = vocab_info(l2)
    case("llama2", l2, LLAMA2, LLAMA2, bos, eos, all_convs)
    case("mistral", l2, MISTRAL, MISTRAL, bos, eos, all_convs)
    case("mistral-nospace", l2, MISTRAL_NOSPACE, MISTRAL_NOSPACE, bos, eos, all_convs)
    # no template in the file: a clear error
    got, err = render_c(l3, CONVS["one"], True)
    check(got is None and "raw prompt" in err, "llama-bpe without template refused: %r" % err)
    # ... except for a vocabulary with Gemma's turn tokens (Gemma 3 base models): the built-in Gemma template,
    # which renders as Gemma 3's own template does, and says so; the interpreter-only mode still refuses
    import chat_templates
    g3 = fixtures.path("vocab", "ggml-vocab-gemma3.gguf")
    bos, eos, tmpl = vocab_info(g3)
    check(tmpl is None and bos == "<bos>", "the Gemma 3 vocab has no template (%r) and BOS <bos> (%r)" % (tmpl, bos))
    case("gemma3 (built-in, no template)", g3, None, chat_templates.GEMMA3, bos, eos, all_convs + ("alt",))
    got, err = render_c(g3, CONVS["one"], True)
    check(got is not None and "built-in Gemma" in err, "the built-in Gemma template is named: %r" % err)
    got, err = render_c(g3, CONVS["one"], True, mode="jinja")
    check(got is None and "raw prompt" in err, "--chat-render jinja: no template, refused: %r" % err)
    # any template the Jinja interpreter supports renders as jinja2 renders it, family or not
    odd = "{{ messages }} <unknown format>"
    got, err = render_c(l3, CONVS["one"], True, odd)
    check(got is not None and got == render_jinja(odd, CONVS["one"], bos, eos, True), "plain Jinja rendered: %r %r" % (got, err))
    # a construct the interpreter does not support, in a template of no known family: refused, naming both
    got, err = render_c(l3, CONVS["one"], True, "{% include 'x' %} <unknown format>")
    check(got is None and "raw prompt" in err and "include" in err, "unsupported, no family, refused: %r" % err)
    # the rendered ChatML prompt encodes with specials as single tokens
    p = subprocess.run([TOOL, "-m", q, "--special", "--no-bos"], input="<|im_start|>user\nhi<|im_end|>\n".encode(),
                       capture_output=True)
    ids = p.stdout.decode().split()
    check(p.returncode == 0 and ids[:1] == ["151644"] and "151645" in ids, "ChatML prompt tokens: %r" % ids)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
