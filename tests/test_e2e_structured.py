"""tests/test_e2e_structured.py: structured output end to end (docs/structured-output.md) on the default model
(SmolLM2-135M-Instruct Q4_1) served by a real broker and CPU worker, through the Python client.

- 200 JSON schemas (180 from a seeded generator: nested objects, arrays with bounds, enums, consts, optional
  fields, anyOf, type unions, formats; 20 written by hand, $defs/$ref among them), all in flight at once: every
  output parses and validates with jsonschema and ends with finish "stop".
- regular expressions: every output matches with re.fullmatch; GBNF grammars: every output is checked by a
  Python recognizer of the same language; json_object: a JSON object.
- a max_tokens cut ends with finish "length" and an incomplete document.
- invalid or unsatisfiable schemas, regexes and grammars are refused by the broker with bad_request and the
  reason, before anything runs.
Greedy decoding, a two-token prompt and bounded schemas keep it to about a minute on two idle cores."""
import json
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, ROOT, Cluster, Checks, watchdog  # noqa: E402

try:
    import jsonschema
except ImportError:  # a missing checker fails the test (deploy/deps.sh installs it)
    jsonschema = None

PROMPT = "JSON:"  # a raw prompt of two tokens: the constraint shapes the output, and 200 prefills stay cheap
MSGS = [{"role": "user", "content": "Write a small JSON example."}]  # the HTTP checks (chat completions)


def leaf(rng):
    k = rng.randrange(9)
    if k == 0:
        s = {"type": "string", "maxLength": rng.randint(1, 8)}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, s["maxLength"])
        return s
    if k == 1:
        return {"type": "integer"}
    if k == 2:
        return {"type": "number"}
    if k == 3:
        return {"type": "boolean"}
    if k == 4:
        return {"enum": rng.sample(["red", "green", "blue", "x y", "\u00e9t\u00e9", 1, 2.5, None, True], rng.randint(1, 4))}
    if k == 5:
        return {"const": rng.choice(["fixed", 7, False, "a\"b"])}
    if k == 6:
        return {"type": ["string", "null"], "maxLength": rng.randint(1, 6)}
    if k == 7:
        return {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]}
    return {"type": "string", "format": rng.choice(["date", "uuid", "time"])}


def gen(rng, depth=0):
    r = rng.random()
    if depth >= 2 or r < 0.3:
        return leaf(rng)
    if r < 0.75:
        n = rng.randint(1, 4)
        names = rng.sample(["id", "name", "tags", "size", "ok", "kind", "note", "x", "value", "meta"], n)
        props = {k: gen(rng, depth + 1) for k in names}
        req = [k for k in names if rng.random() < 0.6]
        s = {"type": "object", "properties": props, "additionalProperties": False}
        if req:
            s["required"] = req
        return s
    s = {"type": "array", "items": gen(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    if rng.random() < 0.5:
        s["minItems"] = rng.randint(0, s["maxItems"])
    return s


HAND = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "pop": {"type": "integer"}},
     "required": ["city"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"definitions": {"tag": {"type": "string", "maxLength": 5}}, "type": "array",
     "items": {"$ref": "#/definitions/tag"}, "maxItems": 3},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "number"}]}}, "required": ["v"],
     "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}, "required": ["when"],
     "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "ok": {"type": "boolean"}},
     "required": ["id", "ok"], "additionalProperties": False},
    {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(yes|no)$"}}, "required": ["code"],
     "additionalProperties": False},
    {"enum": ["alpha", "beta", 3, None]},
    {"const": {"k": [1, 2, {"z": None}]}},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
        "n": {"type": "string", "maxLength": 6}, "q": {"type": "integer"}}, "required": ["n", "q"],
        "additionalProperties": False}, "minItems": 1, "maxItems": 2}}, "required": ["items"],
     "additionalProperties": False},
    {"type": "object", "properties": {"p": {"type": "integer", "minimum": 0}, "s": {"type": "number", "minimum": 0}},
     "required": ["p", "s"], "additionalProperties": False},
    {"type": "object", "properties": {"opt1": {"type": "boolean"}, "opt2": {"type": "null"}},
     "additionalProperties": False},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer"}], "items": False},
    {"type": ["integer", "boolean"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"],
     "additionalProperties": False},
]

REGEXES = [r"[a-z]{3,6}", r"(yes|no|maybe)", r"\d{3}-\d{4}", r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?",
           r"0x[0-9a-f]{2,4}", r"(ab|cd){1,3}!"]

GBNF = [
    # arithmetic over small numbers (a regular language: checked with a Python regex)
    ("root ::= num (op num){0,3}\nop ::= \" + \" | \" * \"\nnum ::= [1-9] [0-9]?\n",
     lambda t: re.fullmatch(r"[1-9][0-9]?(( \+ | \* )[1-9][0-9]?){0,3}", t) is not None),
    # balanced brackets with letters, nesting bounded: a recursive recognizer
    ("root ::= item\nitem ::= \"[\" (item | [a-c]){0,3} \"]\"\n", None),
    ("root ::= (\"cat\" | \"dog\") \" says \" (\"hi\" | \"bye\") \".\"\n",
     lambda t: re.fullmatch(r"(cat|dog) says (hi|bye)\.", t) is not None),
]


def brackets_ok(t):
    def item(i, depth):
        if i >= len(t) or t[i] != "[" or depth > 50:
            return -1
        i += 1
        n = 0
        while i < len(t) and t[i] != "]":
            if t[i] in "abc":
                i += 1
            else:
                i = item(i, depth + 1)
                if i < 0:
                    return -1
            n += 1
        return i + 1 if i < len(t) and n <= 3 else -1
    return item(0, 0) == len(t)


GBNF[1] = (GBNF[1][0], brackets_ok)

HOSTILE = "root ::= \"\" | [$(0ff] . root{1,3}{817}\n"  # a nullable alternative in nested counted repetitions

BAD = [
    ({"type": "json_schema", "schema": {"type": "integer", "maximum": 3}}, "maximum"),
    ({"type": "json_schema", "schema": {"enum": []}}, "unsatisfiable"),
    ({"type": "json_schema", "schema": {"type": "object", "not": {}}}, "unsupported keyword 'not'"),
    ({"type": "json_schema", "text": "{\"type\": "}, "invalid JSON"),
    ({"type": "regex", "regex": "(a|b"}, "unbalanced"),
    ({"type": "regex", "regex": "(?<=x)a"}, "unsupported group"),
    ({"type": "grammar", "grammar": "root ::= undefined-rule\n"}, "not defined"),
    ({"type": "grammar", "grammar": "root ::= \"x\" root\n"}, "unsatisfiable"),
    ({"type": "grammar", "grammar": "root ::= root \"x\" | \"y\"\n"}, "left recursion"),
]


def run_all(c, jobs, max_tokens, timeout):
    """submits every (key, response_format) at once; returns {key: final message}"""
    ids = {}
    for key, rf in jobs:
        ids[c.submit(prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=False, response_format=rf)] = key
    out, end = {}, time.monotonic() + timeout
    while len(out) < len(ids) and time.monotonic() < end:
        m = c.next_message(None, timeout=1.0)
        if m and m.get("type") == "final" and m.get("id") in ids:
            out[ids[m["id"]]] = m
    return out


def http_checks(ck, cl):
    import http.client
    gw = subprocess.Popen([os.path.join(BIN, "zllm-http"), "--broker", cl.clients_ep, "--listen", "127.0.0.1:0"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = gw.stdout.readline()
        if not ck.ok(line.startswith("listening http://"), "zllm-http started: %r" % line):
            return
        port = int(line.strip().rsplit(":", 1)[1])

        def post(body):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            c.close()
            try:
                return r.status, json.loads(data)
            except ValueError:
                return r.status, None
        schema = HAND[0]
        base = {"model": "smollm2", "messages": MSGS, "max_tokens": 64, "temperature": 0}
        st, b = post(dict(base, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": schema, "strict": True}}))
        try:
            text = b["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(text), schema)
            ok = st == 200
        except Exception as e:
            ok, text = False, "%s: %s" % (e, b)
        ck.ok(ok, "HTTP response_format json_schema: %d %r" % (st, text))
        st, b = post(dict(base, grammar="root ::= (\"yes\" | \"no\") \".\"\n"))
        text = (b or {}).get("choices", [{}])[0].get("message", {}).get("content") if st == 200 else b
        ck.ok(st == 200 and text in ("yes.", "no."), "HTTP grammar field: %d %r" % (st, text))
        st, b = post(dict(base, response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "string", "minLength": 5, "maxLength": 2}}}))
        msg = ((b or {}).get("error") or {}).get("message", "")
        ck.ok(st == 400 and "maxLength" in msg, "HTTP unsatisfiable schema: %d %r" % (st, msg))
    finally:
        gw.terminate()
        gw.wait(timeout=10)


def main():
    watchdog(900)
    ck = Checks("e2e_structured")
    if not ck.ok(jsonschema is not None, "python jsonschema installed (deploy/deps.sh)"):
        return ck.report()
    try:
        model = subprocess.run(["bash", os.path.join(ROOT, "deploy", "fetch-model.sh")], check=True,
                               capture_output=True, text=True, timeout=300).stdout.strip()
    except Exception as e:
        ck.ok(False, "fetch-model.sh: %s" % e)
        return ck.report()
    rng = random.Random(20241127)
    schemas = [gen(rng) for _ in range(180)] + HAND
    assert len(schemas) == 200
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)
    cl = Cluster(model=model, model_name="smollm2")
    try:
        cl.start_broker()
        cl.start_worker("w1", "--threads", "2", max_batch=32)
        if not ck.ok(cl.wait_workers(["w1"], timeout=30) is not None, "worker registered"):
            return ck.report()
        c = cl.client()
        # refusals first: each comes back at once, with the reason
        t0 = time.monotonic()
        res = run_all(c, [(i, rf) for i, (rf, _) in enumerate(BAD)], 16, 30)
        for i, (rf, want) in enumerate(BAD):
            m = res.get(i, {})
            ck.ok(m.get("code") == "bad_request" and want in m.get("message", ""),
                  "refused %s: %s / %r (want %r)" % (rf["type"], m.get("code"), m.get("message"), want))
        print("refusals in %.2f s" % (time.monotonic() - t0))
        # 200 schemas in flight at once
        t0 = time.monotonic()
        res = run_all(c, [(i, {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": s, "strict": True}})
                          for i, s in enumerate(schemas)], 400, 600)
        dt = time.monotonic() - t0
        good, toks = 0, 0
        for i, s in enumerate(schemas):
            m = res.get(i)
            if m is None:
                ck.ok(False, "schema %d: no final" % i)
                continue
            text = m.get("text", "")
            toks += (m.get("usage") or {}).get("completion_tokens", 0)
            try:
                jsonschema.validate(json.loads(text), s)
                valid = True
                why = ""
            except Exception as e:
                valid, why = False, str(e)[:200]
            if valid and m.get("finish") == "stop":
                good += 1
            else:
                ck.ok(False, "schema %d %s: finish %s, %r: %s" % (i, json.dumps(s)[:200], m.get("finish"), text[:300], why))
        print("%d of %d schema outputs parse, validate and stop (%d tokens in %.1f s)" % (good, len(schemas), toks, dt))
        ck.ok(good == len(schemas), "every schema output parses, validates and stops")
        for i in (0, 1, 180, 184, 189):
            print("schema %d -> %r" % (i, res.get(i, {}).get("text")))
        # regexes, grammars, json_object
        jobs = [("re%d" % i, {"type": "regex", "regex": r}) for i, r in enumerate(REGEXES)]
        jobs += [("g%d" % i, {"type": "grammar", "grammar": g}) for i, (g, _) in enumerate(GBNF)]
        jobs += [("obj", {"type": "json_object"})]
        # a grammar whose masks go over the work bound (common/grammar.h): its request ends with an error at its
        # first mask, and every other request of the batch ends as it would alone
        jobs += [("hostile", {"type": "grammar", "grammar": HOSTILE})]
        res = run_all(c, jobs, 120, 120)
        m = res.get("hostile", {})
        ck.ok(m.get("finish") == "error" and m.get("code") == "worker_failed" and m.get("text", "") == "",
              "a grammar over the mask work bound -> %r (%s %s)" % (m.get("text"), m.get("finish"), m.get("code")))
        for i, r in enumerate(REGEXES):
            m = res.get("re%d" % i, {})
            ck.ok(m.get("finish") == "stop" and re.fullmatch(r, m.get("text", "")) is not None,
                  "regex %s -> %r (%s)" % (r, m.get("text"), m.get("finish")))
        for i, (g, check) in enumerate(GBNF):
            m = res.get("g%d" % i, {})
            ck.ok(m.get("finish") == "stop" and check(m.get("text", "")),
                  "grammar %d -> %r (%s)" % (i, m.get("text"), m.get("finish")))
        m = res.get("obj", {})
        try:  # any object: unbounded, so a max_tokens cut (finish length) is allowed, with an object's start
            obj_ok = isinstance(json.loads(m.get("text", "")), dict)
        except ValueError:
            obj_ok = m.get("finish") == "length" and m.get("text", "").startswith("{")
        ck.ok(obj_ok, "json_object -> %r (%s)" % (m.get("text", "")[:200], m.get("finish")))
        # the CLI: zllm generate --regex and --json-schema @FILE
        zllm_bin = os.path.join(BIN, "zllm")
        p = subprocess.run([zllm_bin, "generate", "--broker", cl.clients_ep, "--chat", "-p", "Say a color.", "-n", "16",
                            "--temp", "0", "--regex", "(red|green|blue)!"], capture_output=True, text=True, timeout=60)
        ck.ok(p.returncode == 0 and re.fullmatch(r"(red|green|blue)!", p.stdout.strip()) is not None,
              "zllm generate --regex: rc %d %r %s" % (p.returncode, p.stdout, p.stderr[-200:]))
        sf = os.path.join(cl.dir, "schema.json")
        with open(sf, "w") as f:
            json.dump(HAND[1], f)
        p = subprocess.run([zllm_bin, "generate", "--broker", cl.clients_ep, "--chat", "-p", "A city.", "-n", "64",
                            "--temp", "0", "--json-schema", "@" + sf], capture_output=True, text=True, timeout=60)
        try:
            jsonschema.validate(json.loads(p.stdout), HAND[1])
            cli_ok = p.returncode == 0
        except Exception:
            cli_ok = False
        ck.ok(cli_ok, "zllm generate --json-schema @FILE: rc %d %r %s" % (p.returncode, p.stdout, p.stderr[-200:]))
        p = subprocess.run([zllm_bin, "generate", "--broker", cl.clients_ep, "-p", "x", "--grammar", "root ::= r\n"],
                           capture_output=True, text=True, timeout=60)
        ck.ok(p.returncode == 1 and "not defined" in p.stderr, "zllm generate with a bad grammar: rc %d %s" % (
            p.returncode, p.stderr.strip()[-200:]))
        # the HTTP gateway: OpenAI's response_format and llama-server's grammar field
        if os.path.exists(os.path.join(BIN, "zllm-http")):
            http_checks(ck, cl)
        else:
            print("no zllm-http here (libmicrohttpd or jansson missing): gateway checks skipped")
        # a max_tokens cut: finish length, the document left incomplete
        long = {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 5, "maxItems": 5}
        res = run_all(c, [("cut", {"type": "json_schema", "schema": long})], 4, 60)
        m = res.get("cut", {})
        try:
            json.loads(m.get("text", ""))
            parsed = True
        except ValueError:
            parsed = False
        ck.ok(m.get("finish") == "length" and not parsed and m.get("text", "").startswith("["),
              "max_tokens cut: finish %s, %r" % (m.get("finish"), m.get("text")))
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
