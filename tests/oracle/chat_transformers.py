#!/usr/bin/env python3
"""tests/oracle/chat_transformers.py: checks that tests/test_jinja.py's jinja2 set-up (py_env, render_py) renders
every family's template exactly as transformers itself does, so that the C interpreter, compared there with jinja2,
is compared with transformers. For each family of test_jinja (tests/chat_templates.py, the templates of the
SmolLM2 and Qwen2 GGUFs, the model cards' files in $ZLLM_FIXTURES/templates) and each of its conversations, with
and without the generation prompt, renders with transformers.utils.chat_template_utils.render_jinja_template (the
function apply_chat_template calls, given bos_token and eos_token as the tokenizer passes them) and with render_py;
outcomes must be equal: the same text, or both raising with the same message. Needs transformers (no torch);
CI does not run it. Prints "N passed, N failed". As run:
    ZLLM_FIXTURES=~/.cache/zllm/fixtures python3 tests/oracle/chat_transformers.py
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import chat_templates  # noqa: E402
import test_jinja  # noqa: E402
from test_chat import vocab_info  # noqa: E402


def render_tf(tmpl, msgs, bos, eos, gen):
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template
    try:
        out, _ = render_jinja_template([[{"role": r, "content": c} for r, c in msgs]], chat_template=tmpl,
                                       add_generation_prompt=gen, bos_token=bos, eos_token=eos)
        return "jinja", out[0]
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return "raised", str(e)
        return "error", type(e).__name__
    except Exception as e:
        return "error", type(e).__name__


def main():
    import transformers
    test_jinja.ENV = test_jinja.py_env()
    families = dict(chat_templates.FAMILIES)
    smol = subprocess.run(["bash", os.path.join(test_jinja.ROOT, "deploy", "fetch-model.sh")], capture_output=True,
                          text=True).stdout.strip()
    bos, eos, tmpl = vocab_info(smol)
    families["smollm2 (gguf)"] = (tmpl, bos, eos)
    bos, eos, tmpl = vocab_info(os.path.join(test_jinja.FIX, "vocab", "ggml-vocab-qwen2.gguf"))
    families["qwen2 (gguf)"] = (tmpl, bos, eos)
    families.update(test_jinja.real_templates())
    passed = failed = 0
    for name, (tmpl, bos, eos) in families.items():
        if not tmpl:
            print("FAIL %s: no template" % name)
            failed += 1
            continue
        same = total = 0
        for msgs in test_jinja.family_convs(name):
            for gen in (True, False):
                a = render_tf(tmpl, msgs, bos, eos, gen)
                b = test_jinja.render_py(tmpl, msgs, bos, eos, gen)
                total += 1
                if a == b or (a[0] == b[0] == "error"):
                    same += 1
                elif same == total - 1:
                    print("  %s %r gen=%d\n    transformers %r\n    render_py    %r" % (name, msgs, gen, a, b))
        ok = same == total
        passed += ok
        failed += not ok
        print("%s %s: %d of %d renders equal transformers'" % ("ok" if ok else "FAIL", name, same, total))
    print("transformers %s" % transformers.__version__)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
