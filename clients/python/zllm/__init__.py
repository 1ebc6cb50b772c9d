"""zllm: Python client for the zllm broker (docs/protocol.md, version 1), over ZeroMQ and msgpack.

    import zllm
    c = zllm.Client("tcp://127.0.0.1:5555")
    r = c.generate("Once upon a time", max_tokens=32, temperature=0)
    print(r.text, r.token_ids, r.finish_reason)
    for d in c.stream(messages=[{"role": "user", "content": "Hi"}], max_tokens=64):
        print(d.text, end="", flush=True)
    r = c.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])

Errors are exceptions by default: a request that does not end with "stop" or "length" raises a ZllmError
subclass (ZllmRequestError, ZllmUnavailable, ZllmServerError, ZllmTimeout, ZllmCancelled) whose .code is the
protocol's stable code ("bad_request", "overloaded", "worker_failed", "timeout", ...) and whose .result holds what
arrived. With raise_on_error=False the same outcomes come back as a Result instead (result.ok is False,
result.code and result.message say why), including a broker that cannot be reached ("unreachable") and a final
that never comes ("client_timeout").

Every call is bounded in time: a request whose final does not arrive within its deadline plus `grace` seconds is
cancelled and reported as "client_timeout", so a vanished or restarted broker gives an error, never a hang. Sooner
than that: when the connection to the broker drops (it died or restarted; ZMTP heartbeats catch a silent one
within 3 s) every request in flight ends with finish "error", code "broker_unreachable", and a reply from another
broker instance (its `inst`) ends the older ones with "broker_restarted". A message over the broker's 1 MiB
limit is refused before sending (code "too_large").
Several requests may be in flight on one Client (submit / next_message); messages are routed by request id.
`AsyncClient` is the same over zmq.asyncio.
"""
import collections
import itertools
import json
import os
import time

import msgpack
import zmq

__all__ = ["Client", "AsyncClient", "Result", "Delta", "ZllmError", "ZllmRequestError", "ZllmUnavailable",
           "ZllmServerError", "ZllmTimeout", "ZllmCancelled", "error_for", "PROTOCOL_VERSION", "__version__"]

__version__ = "0.9.0"  # ZLLM_VERSION in common/version.h
PROTOCOL_VERSION = 1
_MAX_FRAME = 16 << 20  # bytes: the largest reply we accept (the broker's worker-side limit; replies are smaller)
_CLIENT_MAX_FRAME = 1 << 20  # bytes: the largest message the broker accepts from a client
_HEARTBEAT_IVL_MS, _HEARTBEAT_TIMEOUT_MS = 1000, 3000


class ZllmError(Exception):
    """A request could not be served. .code is the protocol's stable code ("bad_request", "timeout", ...), or
    the client's own ("unreachable", "client_timeout", "cancelled"); .result is the Result so far, or None."""

    def __init__(self, message, code="error", result=None):
        super().__init__(message)
        self.code = code
        self.result = result


class ZllmRequestError(ZllmError):
    """The request itself was refused: bad_request, unknown_model, prompt_too_long, template_error,
    duplicate_id, bad_message. Sending it again will not help."""


class ZllmUnavailable(ZllmError):
    """The service cannot take the request now: overloaded, shutting_down, or unreachable (no broker
    connection). Trying again later may help."""


class ZllmServerError(ZllmError):
    """The request failed on the way: worker_failed, internal (or a code this client does not know)."""


class ZllmTimeout(ZllmError):
    """Time ran out: the broker's deadline passed (code "timeout") or no final arrived in time (code
    "client_timeout": the broker may be gone or restarted)."""

    def __init__(self, message, code="client_timeout", result=None):
        super().__init__(message, code, result)


class ZllmCancelled(ZllmError):
    """The request was cancelled (Client.cancel) before it ended."""


_CLASS_OF_CODE = {
    "bad_request": ZllmRequestError, "unknown_model": ZllmRequestError, "prompt_too_long": ZllmRequestError,
    "template_error": ZllmRequestError, "duplicate_id": ZllmRequestError, "bad_message": ZllmRequestError,
    "too_large": ZllmRequestError,
    "overloaded": ZllmUnavailable, "shutting_down": ZllmUnavailable, "unreachable": ZllmUnavailable,
    "no_capacity": ZllmUnavailable, "broker_unreachable": ZllmUnavailable, "broker_restarted": ZllmUnavailable,
    "worker_failed": ZllmServerError, "internal": ZllmServerError,
    "timeout": ZllmTimeout, "client_timeout": ZllmTimeout, "cancelled": ZllmCancelled,
}


def error_for(code, message, result=None):
    """The ZllmError subclass instance for a protocol or client code."""
    cls = _CLASS_OF_CODE.get(code, ZllmServerError)
    if cls is ZllmTimeout:
        return ZllmTimeout(message, code, result)
    return cls(message, code, result)


def _result_error(result):
    """The exception for a Result that did not end with stop or length."""
    code = result.code or ("cancelled" if result.finish_reason == "cancelled" else result.finish_reason or "error")
    msg = "%s: %s" % (code, result.message) if result.message else "request %s ended: %s" % (result.id, code)
    return error_for(code, msg, result)


def _failed_result(id, e):
    """A Result standing for an exception (the raise_on_error=False form)."""
    r = Result(id)
    r.finish_reason = "timeout" if isinstance(e, ZllmTimeout) else "error"
    r.code = e.code
    r.message = str(e)
    if e.result is not None:
        r.text, r.token_ids = e.result.text, e.result.token_ids
    return r


def _chat_messages(messages):
    """messages as the protocol's list of {role, content}: dicts or (role, content) pairs, strings only."""
    out = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError("chat messages need string role and content, got %r" % (m,))
        out.append({"role": role, "content": content})
    if not out:
        raise ValueError("chat needs at least one message")
    return out


class Result:
    """The outcome of one request.

    text: the generated text; token_ids: the generated ids; finish_reason: "stop", "length", "cancelled",
    "error", "timeout" or "overloaded"; code / message: error details (None otherwise); usage, timings: dicts.
    logprobs: with logprobs=True, one entry per token id: {"logprob": float, "top": [(id, logprob), ...]} (None
    where the worker sent none); index: the completion (0..n-1) of a request with n > 1.
    prompt_token_ids, prompt_logprobs: with prompt_logprobs=K, the prompt's ids and, per position, the same kind
    of entry under the model's raw distribution (None for position 0, which nothing precedes).
    """

    def __init__(self, id, index=0):
        self.id = id
        self.index = index
        self.text = ""
        self.token_ids = []
        self.logprobs = []
        self.prompt_token_ids = []
        self.prompt_logprobs = []
        self.finish_reason = None
        self.code = None
        self.message = None
        self.usage = {}
        self.timings = {}

    @property
    def ok(self):
        return self.finish_reason in ("stop", "length")

    def __repr__(self):
        return "Result(id=%r, finish_reason=%r, code=%r, tokens=%d, text=%r)" % (
            self.id, self.finish_reason, self.code, len(self.token_ids), self.text[:60])


class Delta:
    """A piece of a streamed answer: new text and ids. The last delta of a stream has finish_reason set and
    .result holding the whole Result."""

    def __init__(self, id, text="", token_ids=None, finish_reason=None, result=None, index=0, logprobs=None):
        self.id = id
        self.text = text
        self.token_ids = token_ids or []
        self.finish_reason = finish_reason
        self.result = result
        self.index = index                # the completion (n > 1)
        self.logprobs = logprobs or []    # as Result.logprobs, for token_ids

    def __repr__(self):
        return "Delta(id=%r, text=%r, ids=%r, finish=%r)" % (self.id, self.text, self.token_ids, self.finish_reason)


_ids = itertools.count(1)


def _new_id():
    return "py-%d-%d-%d" % (os.getpid(), int(time.time() * 1000) % 1000000, next(_ids))


def build_generate(id, prompt=None, tokens=None, messages=None, max_tokens=128, temperature=None, top_k=None,
                   top_p=None, min_p=None, repeat_penalty=None, repeat_last_n=None, seed=None, stop=None,
                   stop_ids=None, ignore_eos=None, stream=True, deadline_ms=None, special=None, add_bos=None,
                   model=None, response_format=None, presence_penalty=None, frequency_penalty=None, logit_bias=None,
                   logprobs=None, top_logprobs=None, n=None, priority=None, prompt_logprobs=None):
    """The `generate` map for a request (exactly one of prompt, tokens, messages). response_format: structured
    output (see response_format_map). logit_bias: {id: bias} or [(id, bias), ...]; logprobs: True for each token's
    logprob, top_logprobs: that many alternatives too (needs logprobs); n: completions of the prompt, seeds
    seed + i (docs/protocol.md); priority: -100..100, higher is admitted first; prompt_logprobs: K (0..20) for
    each prompt position's logprob and K alternatives (Result.prompt_logprobs; max_tokens may then be 0)."""
    given = sum(x is not None for x in (prompt, tokens, messages))
    if given != 1:
        raise ValueError("exactly one of prompt, tokens, messages is required")
    m = {"zllm": PROTOCOL_VERSION, "type": "generate", "id": id, "max_tokens": int(max_tokens),
         "stream": bool(stream)}
    if prompt is not None:
        m["prompt"] = str(prompt)
    if tokens is not None:
        m["tokens"] = [int(t) for t in tokens]
    if messages is not None:
        m["messages"] = [{"role": str(x["role"]), "content": str(x["content"])} for x in messages]
    for k, v, f in (("temperature", temperature, float), ("top_k", top_k, int), ("top_p", top_p, float),
                    ("min_p", min_p, float), ("repeat_penalty", repeat_penalty, float),
                    ("repeat_last_n", repeat_last_n, int), ("seed", seed, int), ("deadline_ms", deadline_ms, int),
                    ("ignore_eos", ignore_eos, bool), ("special", special, bool), ("add_bos", add_bos, bool),
                    ("model", model, str), ("presence_penalty", presence_penalty, float),
                    ("frequency_penalty", frequency_penalty, float), ("logprobs", logprobs, bool),
                    ("top_logprobs", top_logprobs, int), ("n", n, int), ("prompt_logprobs", prompt_logprobs, int),
                    ("priority", priority, int)):
        if v is not None:
            m[k] = f(v)
    if stop is not None:
        m["stop"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if stop_ids is not None:
        m["stop_ids"] = [int(t) for t in stop_ids]
    if response_format is not None:
        m["response_format"] = response_format_map(response_format)
    if logit_bias is not None:
        pairs = logit_bias.items() if isinstance(logit_bias, dict) else logit_bias
        m["logit_bias"] = [[int(k), float(v)] for k, v in pairs]
    return m


def response_format_map(rf):
    """The protocol's response_format map {type, text} (docs/structured-output.md) from any of:
    {"type": "json_schema", "json_schema": {"schema": {...}, "strict": True}} (OpenAI's form),
    {"type": "json_schema", "schema": {...} or "<schema JSON>"}, {"type": "json_object"},
    {"type": "regex", "regex": "..."}, {"type": "grammar", "grammar": "<GBNF>"}, or {"type": ..., "text": "..."}."""
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ValueError("response_format must be a dict with a string 'type'")
    t = rf["type"]
    if "text" in rf:
        text = rf["text"]
    elif t == "json_schema":
        js = rf.get("json_schema", rf)
        schema = js.get("schema") if isinstance(js, dict) else None
        if schema is None:
            raise ValueError("response_format json_schema needs a schema")
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
    elif t == "json_object":
        text = ""
    elif t == "regex":
        text = rf.get("regex", rf.get("pattern"))
    elif t == "grammar":
        text = rf.get("grammar")
    else:
        raise ValueError("response_format type must be json_schema, json_object, regex or grammar")
    if not isinstance(text, str):
        raise ValueError("response_format %s needs its text" % t)
    return {"type": t, "text": text}


def _logprob(x):
    """A wire logprobs entry ([logprob, [ids], [logprobs]] or nil) as a dict, or None."""
    if not isinstance(x, (list, tuple)) or len(x) != 3:
        return None
    return {"logprob": float(x[0]), "top": [(int(i), float(v)) for i, v in zip(x[1] or [], x[2] or [])]}


def _decode(frames):
    """One broker message -> dict, or None when malformed (wrong frame count, not a map, wrong version)."""
    if len(frames) != 1 or len(frames[0]) > _MAX_FRAME:
        return None
    try:
        m = msgpack.unpackb(frames[0], raw=False, strict_map_key=False, max_bin_len=_MAX_FRAME,
                            max_str_len=_MAX_FRAME, max_array_len=1 << 20, max_map_len=1 << 16)
    except Exception:
        return None
    if not isinstance(m, dict) or m.get("zllm") != PROTOCOL_VERSION or not isinstance(m.get("type"), str):
        return None
    return m


def _apply(result, m):
    """Folds a token, final or prompt_logprobs message into result; returns a Delta (None for prompt_logprobs,
    which only fill result.prompt_logprobs)."""
    if m["type"] == "prompt_logprobs":
        start, ids = m.get("start", 0), list(m.get("ids", []) or [])
        if start == len(result.prompt_token_ids):   # in order by the protocol
            result.prompt_token_ids += ids
            result.prompt_logprobs += [_logprob(x) for x in (m.get("logprobs") or [])]
        return None
    if m["type"] == "token":
        text, ids = m.get("text", "") or "", list(m.get("ids", []) or [])
        lps = [_logprob(x) for x in m["logprobs"]] if m.get("logprobs") is not None else []
        result.text += text
        result.token_ids += ids
        result.logprobs += lps
        return Delta(result.id, text, ids, index=result.index, logprobs=lps)
    # final
    text = m.get("text", "") or ""
    result.text += text
    if m.get("ids") is not None:
        result.token_ids = list(m["ids"])
    if m.get("logprobs") is not None:
        result.logprobs = [_logprob(x) for x in m["logprobs"]]
    result.finish_reason = m.get("finish")
    result.code = m.get("code")
    result.message = m.get("message")
    result.usage = m.get("usage", {}) or {}
    result.timings = m.get("timings", {}) or {}
    return Delta(result.id, text, [], result.finish_reason, result, index=result.index)


def _last_final(m):
    """True for the final that ends its request (the last of a request with n > 1: `left` 0)."""
    return m.get("type") == "final" and not m.get("left")


def _index(m, n):
    i = m.get("index", 0)
    return i if isinstance(i, int) and 0 <= i < n else 0


def _results(results, n):
    """generate()'s answer: the one Result, or the list of n (n > 1) in index order; a request refused before it
    started (one final for all) gives that Result at every index."""
    n = int(n or 1)
    if n <= 1:
        return results.get(0)
    return [results.get(i, results.get(0) if len(results) == 1 else None) for i in range(n)]


def _socket(ctx, endpoint, cls=None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IMMEDIATE, 1)
    s.setsockopt(zmq.RCVHWM, 100000)
    s.setsockopt(zmq.MAXMSGSIZE, _MAX_FRAME)
    s.setsockopt(zmq.RECONNECT_IVL, 100)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    s.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    s.connect(endpoint)
    return s


def _pack_checked(m):
    """The encoded message, or ZllmError("too_large") when it exceeds what the broker accepts."""
    data = msgpack.packb(m, use_bin_type=True)
    if len(data) > _CLIENT_MAX_FRAME:
        raise ZllmError("the message is %d bytes; the broker accepts at most %d" % (len(data), _CLIENT_MAX_FRAME),
                        "too_large")
    return data


def _lost_final(id, code, message):
    """The final a request gets from the client itself when its broker is gone or was replaced."""
    return {"zllm": PROTOCOL_VERSION, "type": "final", "id": id, "finish": "error", "code": code,
            "message": message, "text": ""}


def _is_disconnect(mon):
    """Reads one event from a monitor socket: True for a disconnect."""
    from zmq.utils.monitor import recv_monitor_message
    try:
        ev = recv_monitor_message(mon, zmq.NOBLOCK)
    except zmq.Again:
        return False
    return ev.get("event") == zmq.EVENT_DISCONNECTED


class Client:
    """A blocking client. endpoint: the broker's client endpoint (tcp://host:port or ipc://path).
    grace: seconds added to a request's deadline before the client gives up on its final.
    send_timeout: seconds to wait for a connection to the broker before a submit fails."""

    def __init__(self, endpoint, grace=5.0, send_timeout=5.0, context=None):
        self.endpoint = endpoint
        self.grace = float(grace)
        self._ctx = context or zmq.Context.instance()
        self._send_timeout_ms = int(send_timeout * 1000)
        self._sock = self._mon = None
        self._open()
        self._queues = collections.defaultdict(collections.deque)  # id -> messages not yet taken
        self._status = collections.deque()
        self._inflight = {}        # generate id whose final has not come -> the broker instance known at submit
        self._inst = None          # the broker instance that answered last
        self._reopen = False       # after a drop the next send opens a fresh socket

    def _open(self):
        self._sock = _socket(self._ctx, self.endpoint)
        self._sock.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms)
        self._mon = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def close(self):
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._mon.close(0)
            self._sock.close(0)
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, m):
        data = _pack_checked(m)
        if self._reopen:    # the dropped connection's pipe can still take a message for a moment and lose it
            self.close()
            self._open()
            self._reopen = False
        try:
            self._sock.send(data)
        except zmq.Again:
            raise ZllmUnavailable("broker %s unreachable" % self.endpoint, "unreachable")

    def _fail_inflight(self, code, message, lost):
        """Ends the requests in flight for which lost(instance at submit) holds with a final of the client's own:
        their broker is gone."""
        for id, sent in list(self._inflight.items()):
            if lost(sent):
                self._queues[id].append(_lost_final(id, code, message))
                del self._inflight[id]

    def _check_drop(self):
        """Reads pending disconnect events; a drop loses every request in flight."""
        dropped = False
        while _is_disconnect(self._mon):
            dropped = True
        if dropped:
            self._reopen = True
            self._inst = None   # whoever answers next is a new broker: not a second loss
            self._fail_inflight("broker_unreachable", "the connection to the broker %s dropped (it died or "
                                "restarted); the request is lost" % self.endpoint, lambda sent: True)

    def _recv_one(self, timeout):
        """Receives and files one message (or a connection drop); returns False on timeout."""
        p = zmq.Poller()
        p.register(self._sock, zmq.POLLIN)
        p.register(self._mon, zmq.POLLIN)
        ready = dict(p.poll(max(0, int(timeout * 1000))))
        if not ready:
            return False
        if self._sock not in ready:   # replies already received go first
            self._check_drop()
            return True
        m = _decode(self._sock.recv_multipart())
        if m is None:
            return True
        t = m["type"]
        inst = m.get("inst")
        if isinstance(inst, str) and inst != self._inst:
            self._fail_inflight("broker_restarted", "broker instance %s replaced %s; the request is lost" %
                                (inst, self._inst), lambda sent: sent is not None and sent != inst)
            self._inst = inst
        if _last_final(m) or (t == "error" and m.get("code") == "duplicate_id"):
            self._inflight.pop(m.get("id"), None)
        if t in ("token", "final", "prompt_logprobs") and isinstance(m.get("id"), str):
            self._queues[m["id"]].append(m)
        elif t == "status":
            self._status.append(m)
        elif t == "error":
            self._queues[None].append(m)
        return True

    def submit(self, prompt=None, *, id=None, **kw):
        """Sends a generate without waiting; returns its request id. Messages come from next_message(id)."""
        id = id or _new_id()
        self._check_drop()   # a drop before this request concerns only the older ones
        self._send(build_generate(id, prompt, **kw))
        self._inflight[id] = self._inst
        return id

    def next_message(self, id=None, timeout=1.0):
        """The next token/final/prompt_logprobs message dict for id (any id when None), or None after timeout seconds."""
        end = time.monotonic() + timeout
        while True:
            if id is None:
                for k, q in list(self._queues.items()):
                    if k is not None and q:
                        return q.popleft()
            elif self._queues.get(id):
                return self._queues[id].popleft()
            left = end - time.monotonic()
            if left <= 0 or not self._recv_one(left):
                if id is None or not self._queues.get(id):
                    return None

    def cancel(self, id):
        """Asks the broker to cancel request id (its final then says "cancelled" unless it ended before)."""
        self._send({"zllm": PROTOCOL_VERSION, "type": "cancel", "id": id})

    def status(self, timeout=5.0):
        """The broker's status map; raises ZllmTimeout when it does not answer in time."""
        sid = _new_id()
        self._send({"zllm": PROTOCOL_VERSION, "type": "status", "id": sid})
        end = time.monotonic() + timeout
        while True:
            while self._status:
                m = self._status.popleft()
                if m.get("id") in (sid, None):
                    return m
            left = end - time.monotonic()
            if left <= 0:
                raise ZllmTimeout("no status from %s within %.1f s" % (self.endpoint, timeout))
            self._recv_one(left)

    def stream(self, prompt=None, *, id=None, timeout=None, raise_on_error=True, **kw):
        """Yields Delta objects as tokens arrive; the last one has finish_reason and .result.
        timeout: seconds to wait for the final (default: deadline_ms + grace, or 600 + grace).
        raise_on_error (default): a request that does not end with stop or length raises its ZllmError instead
        of yielding its last delta; False: the last delta's result says what happened (result.ok, .code).
        n > 1: the deltas of all completions, each with its .index; every completion ends with a delta whose
        finish_reason is set, the stream with the last of them."""
        kw["stream"] = True
        id = id or _new_id()
        if timeout is None:
            timeout = (kw.get("deadline_ms") or 600000) / 1000.0 + self.grace
        n = int(kw.get("n") or 1)
        results = [Result(id, i) for i in range(n)]
        result = results[0]
        try:
            try:
                self.submit(prompt, id=id, **kw)
            except ZllmError as e:
                if raise_on_error:
                    raise
                r = _failed_result(id, e)
                yield Delta(id, "", [], r.finish_reason, r)
                return
            end = time.monotonic() + timeout
            while True:
                left = end - time.monotonic()
                m = self.next_message(id, timeout=max(0.0, left)) if left > 0 else None
                if m is None:
                    self.cancel(id)
                    e = ZllmTimeout("no final for %s within %.1f s" % (id, timeout), "client_timeout", result)
                    if raise_on_error:
                        raise e
                    r = _failed_result(id, e)
                    yield Delta(id, "", [], r.finish_reason, r)
                    return
                result = results[_index(m, n)]
                d = _apply(result, m)
                if d is None:
                    continue
                if d.finish_reason is not None and raise_on_error and not result.ok:
                    raise _result_error(result)
                yield d
                if _last_final(m):
                    return
        finally:
            self._queues.pop(id, None)
            self._inflight.pop(id, None)

    def generate(self, prompt=None, *, raise_on_error=True, **kw):
        """Runs one request to its end and returns a Result (token_ids, text, finish_reason, usage, timings).
        A request that does not end with stop or length raises a ZllmError subclass carrying the code;
        raise_on_error=False returns its Result instead (result.ok False, result.code says why).
        With n > 1: the list of the n Results, in index order."""
        results = {}
        for d in self.stream(prompt, raise_on_error=raise_on_error, **kw):
            if d.result is not None:
                results[d.index] = d.result
        return _results(results, kw.get("n"))

    def chat(self, messages, *, raise_on_error=True, **kw):
        """One chat turn: messages ([{"role": ..., "content": ...}] or (role, content) pairs) go as the
        protocol's `messages` (rendered with the model's chat template and the generation prompt); returns the
        Result whose .text is the assistant's answer. Other keywords as generate()."""
        return self.generate(messages=_chat_messages(messages), raise_on_error=raise_on_error, **kw)


class AsyncClient:
    """The asyncio variant (zmq.asyncio): `await c.generate(...)`, `async for d in c.stream(...)`, many
    requests concurrently on one socket; a reader task routes messages by request id."""

    def __init__(self, endpoint, grace=5.0, context=None):
        import asyncio
        import zmq.asyncio
        self._asyncio = asyncio
        self.endpoint = endpoint
        self.grace = float(grace)
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock = _socket(self._ctx, endpoint)
        self._queues = {}
        self._status = {}
        self._reader = None
        self._watcher = None
        self._inst = None
        self._sent = {}            # request id in flight -> the broker instance known when it was sent
        self._mon = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def _fail_inflight(self, code, message, lost):
        for id, q in list(self._queues.items()):
            if id in self._sent and lost(self._sent[id]):
                del self._sent[id]
                q.put_nowait(_lost_final(id, code, message))

    async def _watch(self):
        """Connection drops end every request in flight (broker_unreachable)."""
        from zmq.utils.monitor import parse_monitor_message
        while True:
            ev = parse_monitor_message(await self._mon.recv_multipart())
            if ev.get("event") == zmq.EVENT_DISCONNECTED:
                self._inst = None
                self._fail_inflight("broker_unreachable", "the connection to the broker %s dropped (it died or "
                                    "restarted); the request is lost" % self.endpoint, lambda sent: True)

    async def _read(self):
        while True:
            frames = await self._sock.recv_multipart()
            m = _decode(frames)
            if m is None:
                continue
            inst = m.get("inst")
            if isinstance(inst, str) and inst != self._inst:
                self._fail_inflight("broker_restarted", "broker instance %s replaced %s; the request is lost" %
                                    (inst, self._inst), lambda sent, inst=inst: sent is not None and sent != inst)
                self._inst = inst
            if m["type"] in ("token", "final", "prompt_logprobs"):
                q = self._queues.get(m.get("id"))
                if q is not None:
                    q.put_nowait(m)
            elif m["type"] == "status":
                f = self._status.pop(m.get("id"), None)
                if f is not None and not f.done():
                    f.set_result(m)

    def _ensure_reader(self):
        if self._reader is None or self._reader.done():
            self._reader = self._asyncio.ensure_future(self._read())
        if self._watcher is None or self._watcher.done():
            self._watcher = self._asyncio.ensure_future(self._watch())

    async def _send(self, m):
        data = _pack_checked(m)
        try:
            await self._asyncio.wait_for(self._sock.send(data), 5.0)
        except self._asyncio.TimeoutError:
            raise ZllmUnavailable("broker %s unreachable" % self.endpoint, "unreachable")

    async def cancel(self, id):
        await self._send({"zllm": PROTOCOL_VERSION, "type": "cancel", "id": id})

    async def status(self, timeout=5.0):
        self._ensure_reader()
        sid = _new_id()
        f = self._asyncio.get_running_loop().create_future()
        self._status[sid] = f
        await self._send({"zllm": PROTOCOL_VERSION, "type": "status", "id": sid})
        try:
            return await self._asyncio.wait_for(f, timeout)
        except self._asyncio.TimeoutError:
            raise ZllmTimeout("no status from %s within %.1f s" % (self.endpoint, timeout))
        finally:
            self._status.pop(sid, None)

    async def stream(self, prompt=None, *, id=None, timeout=None, raise_on_error=True, **kw):
        """As Client.stream."""
        self._ensure_reader()
        id = id or _new_id()
        kw["stream"] = True
        q = self._asyncio.Queue()
        self._queues[id] = q
        if timeout is None:
            timeout = (kw.get("deadline_ms") or 600000) / 1000.0 + self.grace
        loop = self._asyncio.get_running_loop()
        end = loop.time() + timeout
        n = int(kw.get("n") or 1)
        results = [Result(id, i) for i in range(n)]
        result = results[0]
        try:
            try:
                await self._send(build_generate(id, prompt, **kw))
                self._sent[id] = self._inst
            except ZllmError as e:
                if raise_on_error:
                    raise
                r = _failed_result(id, e)
                yield Delta(id, "", [], r.finish_reason, r)
                return
            while True:
                try:
                    m = await self._asyncio.wait_for(q.get(), max(0.0, end - loop.time()))
                except self._asyncio.TimeoutError:
                    await self.cancel(id)
                    e = ZllmTimeout("no final for %s within %.1f s" % (id, timeout), "client_timeout", result)
                    if raise_on_error:
                        raise e
                    r = _failed_result(id, e)
                    yield Delta(id, "", [], r.finish_reason, r)
                    return
                result = results[_index(m, n)]
                d = _apply(result, m)
                if d is None:
                    continue
                if d.finish_reason is not None and raise_on_error and not result.ok:
                    raise _result_error(result)
                yield d
                if _last_final(m):
                    return
        finally:
            self._queues.pop(id, None)
            self._sent.pop(id, None)

    async def generate(self, prompt=None, *, raise_on_error=True, **kw):
        """As Client.generate."""
        results = {}
        async for d in self.stream(prompt, raise_on_error=raise_on_error, **kw):
            if d.result is not None:
                results[d.index] = d.result
        return _results(results, kw.get("n"))

    async def chat(self, messages, *, raise_on_error=True, **kw):
        """As Client.chat."""
        return await self.generate(messages=_chat_messages(messages), raise_on_error=raise_on_error, **kw)

    def close(self):
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._mon.close(0)
            self._sock.close(0)
            self._sock = None
