#!/usr/bin/env python3
"""tests/test_jinja.py: the C Jinja interpreter (common/jinja*.c, through build/bin/zllm-template) against Python's
jinja2 set up as transformers' apply_chat_template does: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with the loopcontrols extension, raise_exception, strftime_now and a tojson that is
json.dumps(ensure_ascii=False), rendering messages, bos_token, eos_token, add_generation_prompt and tools =
documents = None. Byte equality is required, and the same outcome when jinja2 fails (raise_exception with the same
message, or an error).

  - every family of tests/chat_templates.py and the templates in the SmolLM2 and Qwen2 GGUFs, on 60 generated
    conversations each (with or without a system message, multi-turn, empty contents, unicode, whitespace,
    <think> blocks, Jinja-looking text, some with roles out of order), with and without the generation prompt;
  - small templates that exercise one construct each (filters, tests, methods, slicing, loops, macros, scoping,
    whitespace control) on the same conversations, and 400 random templates of expressions, filters, tests,
    methods, slices, loops and conditions;
  - errors: unsupported constructs are named (and fall back to the built-in family where one matches), hostile
    templates stop at a limit, raise_exception's message is passed on.
Prints "N passed, N failed"."""
import json
import os
import random
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("ZLLM_BUILD", "build")
FIX = os.environ.get("ZLLM_FIXTURES") or os.path.join(ROOT, "..", "shared", "fixtures")
TOOL = os.path.join(ROOT, BUILD, "bin", "zllm-template")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL " + msg, file=sys.stderr)


def py_env():
    import jinja2
    import jinja2.ext
    from datetime import datetime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = None


def render_py(tmpl, msgs, bos, eos, gen):
    """("jinja", text) or ("raised", message) or ("error", description)"""
    import jinja2
    try:
        t = ENV.from_string(tmpl)
        return "jinja", t.render(messages=[{"role": r, "content": c} for r, c in msgs], bos_token=bos,
                                 eos_token=eos, add_generation_prompt=gen, tools=None, documents=None)
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return "raised", str(e)
        return "error", "%s: %s" % (type(e).__name__, e)
    except Exception as e:  # TypeError, ZeroDivisionError, ... raised while rendering
        return "error", "%s: %s" % (type(e).__name__, e)


def render_c(tmpl, cases, mode=None):
    """cases: [(msgs, bos, eos, gen)] -> [(status, text)], stderr"""
    with tempfile.NamedTemporaryFile("wb", suffix=".jinja", delete=False) as tf:
        tf.write(tmpl.encode("utf-8"))
    data = bytearray()
    for msgs, bos, eos, gen in cases:
        fields = [b"1" if gen else b"0", bos.encode(), eos.encode(), str(len(msgs)).encode()]
        for r, c in msgs:
            fields += [r.encode(), c.encode()]
        for f in fields:
            data += f + b"\0"
    args = [TOOL] + ([mode] if mode else []) + [tf.name]
    try:
        p = subprocess.run(args, input=bytes(data), capture_output=True, timeout=300)
    finally:
        os.unlink(tf.name)
    out, res, pos = p.stdout, [], 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        st, ln = out[pos:nl].decode().split(" ")
        ln = int(ln)
        res.append((st, out[nl + 1:nl + 1 + ln].decode("utf-8", "replace")))
        pos = nl + 1 + ln + 1
    return res, p.stderr.decode("utf-8", "replace"), p.returncode


CONTENTS = [
    "Hello!", "", " ", "  padded both sides  ", "\n\nleading newlines", "trailing newlines\n\n",
    "Bonjour, ça va ? 🦙", "日本語のテキスト", "Grüße aus Köln — „Zitat“", "\u00a0nbsp and em\u2003space\u3000",
    "<b>x</b> & 'single' \"double\"", "{{ not a tag }} {% neither %} {# nor this #}", "back\\slash \\n literal",
    "tab\there", "line one\nline two\r\nline three", "<think>\nI should greet.\n</think>\n\nHi there.",
    "<think>short</think>answer", "before</think>after", "<tool_response>\n42\n</tool_response>",
    "[INST] fake [/INST]", "<|im_start|>user\nspoof<|im_end|>", "emoji 👩‍💻 zwj", "x" * 300,
    "A multi-paragraph answer.\n\n- item one\n- item two\n\nDone.", "ends with eos </s>", "ü", "  \t\n ",
]


def gen_convs(rng, n):
    convs = []
    for k in range(n):
        msgs = []
        if rng.random() < 0.45:
            msgs.append(("system", rng.choice(CONTENTS)))
        turns = rng.randint(1, 7)
        for i in range(turns):
            role = "user" if i % 2 == 0 else "assistant"
            msgs.append((role, rng.choice(CONTENTS)))
        r = rng.random()
        if r < 0.06:        # two users in a row
            msgs.insert(len(msgs) - 1 if len(msgs) > 1 else 0, ("user", "again"))
        elif r < 0.09:      # a late system message
            msgs.append(("system", "late system"))
        elif r < 0.11:      # assistant first
            msgs.insert(0, ("assistant", "I start"))
        convs.append(msgs)
    convs.append([])                                              # no messages at all
    convs.append([("system", "only a system message")])
    return convs


def family_convs(name):
    """the 62 conversations a family's template is rendered on (the same for a name on every run)"""
    return gen_convs(random.Random(zlib.crc32(name.encode())), 60)


# chat templates as the model cards publish them, in $ZLLM_FIXTURES/templates (llama.cpp's models/templates, see
# tests/fetch-fixtures.sh): file -> (bos_token, eos_token) as the model's tokenizer sets them. Llama 3.3's file is
# byte for byte Llama 3.1's.
REAL_TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("<s>", "</s>"),
    "unsloth-mistral-Devstral-Small-2507": ("<s>", "</s>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
}


# what a caller passes beside the messages (transformers' apply_chat_template(..., tools=..., enable_thinking=...)),
# and assistant tool calls with tool results, given to the template by a leading {% set %}: jinja2 then sees the
# same values as when they are passed in, and the families' tool and thinking branches are rendered too
TOOLS = ('{%- set tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", '
         '"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Où ?"}}, '
         '"required": ["city"]}}}] %}')
TOOL_CALLS = ('{%- set messages = messages + [{"role": "assistant", "content": "", "tool_calls": [{"id": "abc123def", '
              '"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, '
              '{"role": "tool", "tool_call_id": "abc123def", "content": "21 °C"}, '
              '{"role": "tool", "tool_call_id": "abc123def", "content": "sunny"}] %}')
PRELUDES = {
    "Qwen-Qwen3-0.6B": {"enable_thinking=false": "{%- set enable_thinking = false %}", "tools": TOOLS,
                        "tool calls": TOOL_CALLS, "tools and calls": TOOLS + TOOL_CALLS},
    "meta-llama-Llama-3.1-8B-Instruct": {"tools": TOOLS, "tools and calls": TOOLS + TOOL_CALLS},
    "mistralai-Mistral-Nemo-Instruct-2407": {"tools": TOOLS},
}


def real_templates():
    """name -> (template text or None when the file is missing, bos, eos)"""
    out = {}
    for name, (bos, eos) in REAL_TEMPLATES.items():
        path = os.path.join(FIX, "templates", name + ".jinja")
        tmpl = None
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                tmpl = f.read()
        out[name + " (file)"] = (tmpl, bos, eos)
        for what, prelude in PRELUDES.get(name, {}).items():
            out["%s (file, %s)" % (name, what)] = (prelude + tmpl if tmpl is not None else None, bos, eos)
    return out


def compare(name, tmpl, bos, eos, convs, mode=None):
    cases = [(m, bos, eos, gen) for m in convs for gen in (True, False)]
    got, err, rc = render_c(tmpl, cases, mode)
    if rc != 0 or len(got) != len(cases):
        check(False, "%s: zllm-template rc=%d, %d results for %d cases: %s" % (name, rc, len(got), len(cases), err[-500:]))
        return 0
    ok = 0
    for (msgs, b, e, gen), (st, text) in zip(cases, got):
        want_st, want = render_py(tmpl, msgs, b, e, gen)
        if want_st == "jinja":
            good = st == "jinja" and text == want
        elif want_st == "raised":
            good = st == "raised" and text.endswith(want)
        else:
            good = st == "error"
        if good:
            ok += 1
        else:
            print("  %s gen=%d msgs=%r\n    jinja2: %s %r\n    C:      %s %r" % (name, gen, msgs, want_st, want[:400],
                                                                                st, text[:400]), file=sys.stderr)
    check(ok == len(cases), "%s: %d of %d renders equal jinja2's" % (name, ok, len(cases)))
    return ok


# templates that exercise one construct each (rendered on the same conversations)
FEATURES = [
    "{{ messages | length }} {{ messages | tojson }}",
    "{{ messages | tojson(indent=2) }}|{{ messages[:1] | tojson(indent=4, sort_keys=true) }}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.first }} {{ loop.last }} {{ loop.revindex0 }}"
    "{{ loop.previtem.role if loop.previtem is defined }} {{ loop.nextitem['role'] | default('-') }};{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index0 }}:{{ m.role|upper }}:{{ m.content|trim|lower }}|"
    "{% else %}empty{% endfor %}",
    "{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}{% if m.role == 'assistant' %}{% continue %}"
    "{% endif %}[{{ m.content }}]{% endfor %}",
    "{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %} {{ messages[1:3] | map(attribute='role') | join(',') }}"
    " {{ messages[-1:] | length }} {{ (messages | last).role if messages }}",
    "{% for m in messages %}{{ m.content[:5] }}|{{ m.content[-3:] }}|{{ m.content[::2] }}|{{ m.content[1:-1:3] }}|"
    "{{ m.content[2] if m.content | length > 2 }}{% endfor %}",
    "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.lstrip('\\n') }}|{{ m.content.rstrip(' \\n') }}|"
    "{{ m.content.split() }}|{{ m.content.split('\\n') }}|{{ m.content.split('</think>')[-1] }}{% endfor %}",
    "{% for m in messages %}{{ m.content.startswith('<think>') }}{{ m.content.endswith('.') }}"
    "{{ m.content.replace('a', 'AA') }}{{ m.content.replace('', '-', 2) }}{{ m.content.upper() }}"
    "{{ m.content.title() }}{{ m.content.capitalize() }}{{ m.content.find('e') }}{{ m.content.count('e') }}{% endfor %}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
    "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | map('trim') | join('|') }} "
    "{{ messages | map(attribute='role') | unique | list }} {{ messages | map(attribute='nope', default='d') | first }}",
    "{% set ns = namespace(n=0, seen=[]) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}"
    "{% endfor %}{{ ns.n }} {{ ns.n // 7 }} {{ ns.n % 7 }} {{ ns.n / 4 }} {{ -ns.n }} {{ ns.n ** 2 }} {{ 2 ** -1 }}",
    "{% set x = 1 %}{% for m in messages %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}{{ x }}"
    "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% macro turn(m, sep='\\n') %}<{{ m.role }}>{{ m.content | trim }}{{ sep }}{% endmacro %}"
    "{% for m in messages %}{{ turn(m) }}{{ turn(m, sep='|') }}{% endfor %}",
    "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ [1, 'b'] ~ {'k': (1, 2)} }} {{ 10 / 4 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }}"
    " {{ 3 * 'ab' }} {{ [1] * 3 }} {{ (1,) }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 2 ** 10 }}",
    "{{ messages[0] is defined }} {{ nothing is defined }} {{ nothing is undefined }} {{ none is none }}"
    " {{ 'x' is string }} {{ 3 is number }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }}"
    " {{ messages is iterable }} {{ messages[0] is mapping if messages }} {{ 4 is even }} {{ 3 is odd }}"
    " {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 'b' in ['a', 'b'] }} {{ 'z' not in 'abc' }}"
    " {{ 1 < 2 < 3 }} {{ 'abc' < 'abd' }} {{ 2 >= 2.0 }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }}",
    "{{ nothing | default('dflt') }} {{ '' | default('empty', true) }} {{ none | string }} {{ '42' | int + 1 }}"
    " {{ '3.5' | float }} {{ 'x' | int(7) }} {{ [3, 1, 2] | first }} {{ 'hello' | last }} {{ 'abc' | reverse }}"
    " {{ [1, 2, 3] | reverse | list }} {{ {'a': 1, 'b': 2} | items | list }} {{ 'ab' | list }} {{ -3 | abs }}"
    " {{ 'a<b>&\"c\\'' | e }} {{ 'Hello World' | lower | capitalize }} {{ 'x,y' | replace(',', ';') }}",
    "{% set d = {'b': 1, 'a': [1, 2.5, none, true, 'é\"\\n'], 'c': {'x': {}}} %}{{ d | tojson }} {{ d.keys() | list }}"
    " {{ d.values() | list | length }} {{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d['c']['x'] }} {{ d.b }}"
    " {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d | tojson(indent=1) }} {{ d | length }}",
    "{%- for m in messages -%}\n  {{- m.role -}}  \n  {% if m.content %}\n    {{ m.content|length }}\n  {% endif %}\n"
    "{#- comment -#}\n   {# plain comment #}\n  {%+ if true %}plus{% endif +%}\n{% endfor %}\n   tail  \n",
    "  {% if messages %}\n  yes\n  {% else %}\n  no\n  {% endif %}\n\t{{ 'var' }}\n  {%- set z = 1 %}\nend\n\n",
    "{% set content %}{% for m in messages %}{{ m.role }},{% endfor %}{% endset %}[{{ content }}]{{ content | length }}",
    "{{ 'abc'[1:] }}{{ 'abc'[:-1] }}{{ 'abc'[5:] }}{{ [1, 2, 3][-2:] }}{{ [1, 2, 3][::-2] }}{{ 'héllo wörld'[::-1] }}"
    "{{ 'a b  c'.split(' ') }}{{ 'a b c'.split(None, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ', '.join(['x', 'y']) }}",
    "{{ 'aaa'.rsplit('aa', 1) }}{{ ','.rsplit(',', 1) }}{{ 'a,b,,c'.rsplit(',', 2) }}{{ 'x'.rsplit(',', 3) }}"
    "{% set s = ',' * 1500 %}{{ s.rsplit(',', 1200) | length }}{{ s.rsplit(',', 1200)[0] | length }}",
    "{{ raise_exception('custom: ' ~ messages | length) if messages | length > 4 }}ok",
    "{{ messages[0].content + 1 if messages }}",
    "{{ messages[0].nope.deeper if messages }}",
    "{{ (messages | length) / 0 }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}"
    "{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{% for i in range(3) %}{{ i }}{% endfor %}"
    "{% for i in range(10, 0, -3) %}{{ i }}{% endfor %}{{ range(4) | list }}",
    "{{ \"dq'\" }} {{ 'sq\"' }} {{ 'a' 'b' }} {{ '\\x41\\u00e9\\U0001F999\\t|' }} {{ ['it\\'s', \"q\\\"\"] }}"
    " {{ {'k': 'v\\n'} }} {{ 1_000 }} {{ 2.5e3 }} {{ True }} {{ None }} {{ false or 'f' }} {{ 0 and 'x' }}",
    "{% if messages|length > 2 %}a{% elif messages|length > 1 %}b{% elif messages %}c{% else %}d{% endif %}"
    "{{ 'yes' if messages else 'no' }}{{ 'T' if not messages }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 'x') %}{{ t[1] }}{{ t | length }}",
    "{% set ns = namespace(a=1) %}{% set ns.x = ns %}{{ ns }}|{{ [ns] }}|{{ ns.x.x.a }}"
    "{{ cycler is defined }}{{ lipsum is defined }}{{ joiner is defined }}",
    "{% for m in messages %}{{ m.content | indent }}|{{ m.content | indent(2, true) }}|{{ m.content | indent('> ', "
    "blank=true) }}|{{ m.content | title }}|{{ m.content.splitlines() }}{% endfor %}",
    "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 2.675 | round(2) }} {{ 1.2345 | round(2, 'ceil') }}"
    " {{ -1.5 | round(0, 'floor') }} {{ 7 | round(1, 'ceil') }} {{ 1e300 | round(3) }}",
    "{{ messages | map(attribute='content') | sort | list }} {{ messages | sort(attribute='role') | map(attribute="
    "'role') | list }} {{ messages | sort(attribute='content', reverse=true, case_sensitive=true) | map(attribute="
    "'content') | map('length') | list }} {{ [3, 1.5, 2, true] | sort }} {{ ['b', 'A', 'a', 'B'] | sort }}",
    "{{ messages | selectattr('content') | list | length }} {{ messages | select | list | length }}"
    " {{ [0, 1, '', 'a', none] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }}"
    " {{ [1, 2, 3] | select('gt', 1) | list }}",
]


# random templates (a fixed seed) for a differential run: literals, operators, filters, tests, methods, slicing,
# loops and conditions over the messages. Slices are taken of names and strings only: jinja2 folds constant
# subscripts of numbers at compile time, with results that differ from its runtime's.
R_STRS = ["''", "'a'", "'Hello World'", "' pad '", "'é ß ǅ'", "'x\\ny'", "'a,b,,c'", "\"q'\"", "'42'", "'3.5'",
          "'<think>r</think>a'", "'ǆemo ﬁ'"]
R_FILTERS = ["trim", "length", "upper", "lower", "first", "last", "default('d')", "join(',')", "string", "int", "float",
             "list", "reverse | list", "replace('a', 'b')", "tojson", "abs", "unique | list", "title", "capitalize",
             "round", "sort", "count", "indent(2)", "select | list", "map('upper') | list", "d(1, true)",
             "tojson(indent=1)"]
R_TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "odd", "even", "mapping",
           "iterable", "sequence", "boolean", "true", "false", "eq 1", "divisibleby 2", "in 'abc'", "lower", "upper"]
R_METHODS = ["strip()", "split()", "split(',')", "startswith('a')", "endswith('d')", "replace('l', 'L')", "upper()",
             "lower()", "title()", "find('o')", "count('l')", "lstrip('H')", "rstrip('d ')", "splitlines()",
             "capitalize()", "isdigit()"]
R_OPS = ["+", "-", "*", "/", "//", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
R_NAMES = ["messages", "messages[0]", "messages[-1]", "messages[0].content", "messages[1]['role']", "nothing",
           "messages|length", "bos_token"]


def r_lit(rng, d):
    r = rng.random()
    if r < 0.25:
        return rng.choice(R_STRS)
    if r < 0.4:
        return str(rng.choice([0, 1, 2, 3, -1, 7, 10, 100]))
    if r < 0.5:
        return rng.choice(["0.5", "1.0", "2.25", "-3.5", "1e3", "0.1"])
    if r < 0.58:
        return rng.choice(["none", "true", "false"])
    if r < 0.7 and d > 0:
        return "[" + ", ".join(r_expr(rng, d - 1) for _ in range(rng.randint(0, 3))) + "]"
    if r < 0.78 and d > 0:
        return "{" + ", ".join("%s: %s" % (rng.choice(R_STRS), r_expr(rng, d - 1)) for _ in range(rng.randint(0, 2))) + "}"
    if r < 0.9:
        return rng.choice(R_NAMES)
    return "(" + r_expr(rng, d - 1) + ")" if d > 0 else "1"


def r_expr(rng, d):
    if d <= 0:
        return r_lit(rng, 0)
    r = rng.random()
    if r < 0.3:
        return r_lit(rng, d)
    if r < 0.5:
        return "%s %s %s" % (r_expr(rng, d - 1), rng.choice(R_OPS), r_expr(rng, d - 1))
    if r < 0.62:
        return "%s | %s" % (r_lit(rng, d - 1), rng.choice(R_FILTERS))
    if r < 0.7:
        return "%s is %s%s" % (r_lit(rng, d - 1), rng.choice(["", "not "]), rng.choice(R_TESTS))
    if r < 0.8:
        return "%s.%s" % (rng.choice(R_STRS + ["messages[0].content"]), rng.choice(R_METHODS))
    if r < 0.86:
        return "%s[%s:%s%s]" % (rng.choice(R_STRS + R_NAMES[:4]), rng.choice(["", "1", "-2"]),
                                rng.choice(["", "3", "-1"]), rng.choice(["", ":2", ":-1"]))
    if r < 0.92:
        return "not " + r_expr(rng, d - 1)
    if r < 0.96:
        return "-" + r_lit(rng, d - 1)
    return "%s if %s else %s" % (r_expr(rng, d - 1), r_expr(rng, d - 1), r_expr(rng, d - 1))


def r_template(rng):
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.6:
            parts.append("{{ %s }}|" % r_expr(rng, 3))
        elif r < 0.8:
            parts.append("{%% for x in %s %%}{{ loop.index }}:{{ x }},{%% endfor %%}|" % r_lit(rng, 2))
        else:
            parts.append("{%% if %s %%}T{%% else %%}F{%% endif %%}|" % r_expr(rng, 2))
    return "".join(parts)


def random_templates(n, seed):
    rng = random.Random(seed)
    convs = [[("system", "Sys"), ("user", "Hello there"), ("assistant", "a1")], [("user", "é")]]
    same = total = 0
    for _ in range(n):
        t = r_template(rng)
        cases = [(m, "<s>", "</s>", True) for m in convs]
        got, err, rc = render_c(t, cases, "--jinja")
        if rc != 0 or len(got) != len(cases):
            check(False, "random template %r: zllm-template rc=%d: %s" % (t, rc, err[-300:]))
            continue
        for (msgs, b, e, gen), (st, text) in zip(cases, got):
            ws, w = render_py(t, msgs, b, e, gen)
            total += 1
            if (ws == "jinja" and st == "jinja" and text == w) or (ws != "jinja" and st == ws):
                same += 1
            else:
                print("  random %r\n    jinja2: %s %r\n    C:      %s %r" % (t, ws, w[:200], st, text[:200]),
                      file=sys.stderr)
    check(same == total, "random templates: %d of %d renders as jinja2's" % (same, total))


def main():
    global ENV
    try:
        import jinja2  # noqa: F401
        ENV = py_env()
    except ImportError as e:
        print("FAIL missing python module: %s (bash deploy/deps.sh)" % e, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    if not os.access(TOOL, os.X_OK):
        print("FAIL %s not built" % TOOL, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    import chat_templates
    from test_chat import vocab_info
    rng = random.Random(1234)
    families = dict(chat_templates.FAMILIES)
    smol = subprocess.run(["bash", os.path.join(ROOT, "deploy", "fetch-model.sh")], capture_output=True,
                          text=True).stdout.strip()
    check(os.path.isfile(smol), "SmolLM2 model from deploy/fetch-model.sh: %r" % smol)
    if os.path.isfile(smol):
        bos, eos, tmpl = vocab_info(smol)
        check(bool(tmpl), "SmolLM2 GGUF carries a template")
        families["smollm2 (gguf)"] = (tmpl or "", bos, eos)
    bos, eos, tmpl = vocab_info(os.path.join(FIX, "vocab", "ggml-vocab-qwen2.gguf"))
    check(bool(tmpl), "qwen2 vocab carries a template")
    families["qwen2 (gguf)"] = (tmpl or "", bos, eos)
    for name, (tmpl, bos, eos) in real_templates().items():
        check(tmpl is not None, "%s: the template file is in %s/templates (tests/fetch-fixtures.sh)" % (name, FIX))
        if tmpl is not None:
            families[name] = (tmpl, bos, eos)

    total = 0
    for name, (tmpl, bos, eos) in families.items():
        total += compare(name, tmpl, bos, eos, family_convs(name), mode="--jinja")
    feat_convs = gen_convs(random.Random(99), 8)
    for i, tmpl in enumerate(FEATURES):
        total += compare("feature %d" % i, tmpl, "<s>", "</s>", feat_convs, mode="--jinja")
    print("%d renders compared with jinja2" % total, file=sys.stderr)
    random_templates(400, 7)

    one = [([("user", "hi")], "<s>", "</s>", True)]
    # an unsupported construct is named; with a recognisable family the built-in template renders instead
    for tmpl, what in [("{% include 'x.jinja' %}", "include"), ("{{ 'x' | wordwrap(3) }}", "wordwrap"),
                       ("{% raw %}{{ x }}{% endraw %}", "raw"), ("{{ '%s' % 'x' }}", "string formatting"),
                       ("{{ 'x'.format() }}", "format"), ("{% for x in y recursive %}{% endfor %}", "recursive")]:
        (st, text), = render_c(tmpl, one, "--jinja")[0]
        check(st == "error" and "not support" in text and what in text, "unsupported %r: %s %r" % (tmpl, st, text))
    chatml_unsup = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | wordwrap(80) + "
                    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                    "{% endif %}")
    res, err, _ = render_c(chatml_unsup, one)
    check(res and res[0] == ("builtin", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") and
          "wordwrap" in err and "ChatML" in err, "fallback to the built-in ChatML: %r %r" % (res, err))
    res, err, _ = render_c("{% include 'a' %}", one)
    check(res and res[0][0] == "error" and "include" in res[0][1] and "raw prompt" in res[0][1],
          "no fallback family: %r" % (res,))
    res, err, _ = render_c(chat_templates.LLAMA3, one, "--builtin")
    check(res and res[0][0] == "builtin", "--builtin renders with the hand-written template: %r" % (res,))
    # the hand-written Gemma template renders as Gemma 3's own, and refuses where it raises
    cases = [(m, "<bos>", "<eos>", g) for m in family_convs("gemma3 builtin") for g in (True, False)]
    res, err, _ = render_c(chat_templates.GEMMA3, cases, "--builtin")
    same = 0
    for (m, b, e, g), (st, text) in zip(cases, res):
        ws, w = render_py(chat_templates.GEMMA3, m, b, e, g)
        same += (ws == "jinja" and st == "builtin" and text == w) or (ws != "jinja" and st == "error")
    check(len(res) == len(cases) and same == len(cases), "built-in Gemma: %d of %d as jinja2 renders Gemma 3's "
          "template: %s" % (same, len(cases), err[-300:]))
    # syntax errors and raise_exception
    for tmpl in ["{% if %}", "{{ 1 + }}", "{% for x in %}{% endfor %}", "{% endif %}", "{{ x", "{% if x %}",
                 "{{ (1 }}", "{% set %}", "{% macro %}{% endmacro %}", "{{ 'unterminated }}", "{% foo %}"]:
        (st, text), = render_c(tmpl, one, "--jinja")[0]
        check(st == "error" and "line" in text, "syntax error %r: %s %r" % (tmpl, st, text))
    (st, text), = render_c("{{ raise_exception('Roles must alternate') }}", one)[0]
    check(st == "raised" and text.endswith("Roles must alternate"), "raise_exception: %s %r" % (st, text))
    # hostile templates stop at a limit with a clear message
    hostile = [
        ("{{ 'x' }}" * 40000, "limit"),                                              # template size
        ("{{ " + "(" * 500 + "1" + ")" * 500 + " }}", "nested"),                     # depth
        ("{% if true %}" * 300 + "{% endif %}" * 300, "nested"),
        ("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "iterations"),
        ("{% for i in range(100000000) %}{% endfor %}", "limit"),
        ("{{ 'x' * 100000000 }}", "limit"),
        ("{% set ns = namespace(s='x' * 1000) %}{% for i in range(90000) %}{% set ns.s = ns.s ~ 'y' %}{% endfor %}", "memory"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", "limit"),
    ]
    hostile += [
        ("{{ " + "1 + " * 60000 + "1 }}", "nested"),                                   # loop-built chains
        ("{{ x" + ".a" * 5000 + " }}", "nested"),
        ("{{ 'a'" + " | trim" * 5000 + " }}", "nested"),
        ("{{ " + "not " * 5000 + "1 }}", "nested"),
        ("{% if 0 %}" + "{% elif 0 %}" * 20000 + "{% endif %}", "nested"),
        ("{% set ns = namespace(x=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
         "too deeply"),
        ("{% set ns = namespace(x=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% endfor %}"
         "{{ ns.x ~ 'a' }}", "too deeply"),
    ]
    for tmpl, what in hostile:
        (st, text), = render_c(tmpl, one, "--jinja")[0]
        check(st == "error" and what in text, "hostile %r...: %s %r" % (tmpl[:50], st, text[:200]))
    # no crash on deep values that jinja2 itself cannot compare (RecursionError there)
    deep = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}" \
           "{% endfor %}{{ ns.x == ns.y }}{{ ns.x | length }}"
    res, err, rc = render_c(deep, one, "--jinja")
    check(rc == 0 and len(res) == 1, "deep values compared without a crash: rc %d %r" % (rc, res))
    # malformed case headers: exit 1, nothing rendered
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as tf:
        tf.write("{{ messages | length }}")
    for data in (b"0\0\0\0abc\0", b"0\0\0\0\0", b"0\0\0\0-1\0", b"0\0\0\0001x\0user\0hi\0", b"0\0\0\0002\0user\0hi\0"):
        p = subprocess.run([TOOL, "--jinja", tf.name], input=data, capture_output=True, timeout=30)
        check(p.returncode == 1 and p.stdout == b"" and b"zllm-template: " in p.stderr,
              "malformed case %r: exit %d, %r" % (data, p.returncode, p.stderr[:100]))
    p = subprocess.run([TOOL, "--jinja", tf.name], input=b"0\0\0\0001\0user\0hi\0", capture_output=True,
                       timeout=30)
    check(p.returncode == 0 and p.stdout == b"jinja 1\n1\n",
          "a well-formed case: exit %d, %r" % (p.returncode, p.stdout))
    os.unlink(tf.name)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
