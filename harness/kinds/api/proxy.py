"""The planted controls: a proxy on loopback in front of the real server that plants one fault in
the replies of one facet (the request names its facet in a header) — or, for a server that dies,
stops answering anything. Each control must fail its own facet and no other; the positive control
(argument keys reordered) must pass."""

from __future__ import annotations

import http.client
import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

from harness.kinds.api.facets.base import FACET_HEADER

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    facet: str
    expect: Literal["fail", "pass"]
    request: Callable[[Json], Json] | None = None
    """Rewrites the request body before it goes upstream."""
    reply: Callable[[Json, Json], Json] | None = None
    """(request, reply body) -> the reply body sent back."""
    stream: Callable[[Json, list[str]], list[str]] | None = None
    """(request, the ``data:`` payloads) -> the payloads sent back."""
    dies_on: Callable[[Json], bool] | None = None
    """After a request this matches, the proxy answers nothing, ever (a dead server)."""
    on: str | None = None
    """The facet whose requests it alters (default: ``facet``, the row it must fail or pass); ``*``:
    every request (a tool call's arguments arrive in the tools facet's replies, the wire schema row
    judges them)."""
    says: str = ""
    """A failing control bites only where one of its row's failing verdicts says this (the check it
    plants for, not another check of the same row that its fault trips too)."""

    def alters(self, facet: str | None) -> bool:
        return self.on == "*" or facet == (self.on or self.facet)


def _choice0(reply: Json) -> Json:
    ch = reply.get("choices") or [{}]
    return ch[0] if isinstance(ch[0], dict) else {}


def _drop_last_delta(req: Json, payloads: list[str]) -> list[str]:
    for i in range(len(payloads) - 1, -1, -1):
        try:
            ev = json.loads(payloads[i])
        except json.JSONDecodeError:
            continue
        ch = (ev.get("choices") or [{}])[0] if ev.get("choices") else {}
        piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
        if piece:
            return payloads[:i] + payloads[i + 1 :]
    return payloads


def _stop_late(req: Json, reply: Json) -> Json:
    stop = req.get("stop")
    if stop and not req.get("include_stop_str_in_output") and reply.get("choices"):
        ch = _choice0(reply)
        if isinstance(ch.get("text"), str) and ch.get("finish_reason") == "stop":
            ch["text"] += (stop[0] if isinstance(stop, list) else stop)[0]
    return reply


def _short_text(req: Json, reply: Json) -> Json:
    ch = _choice0(reply)
    key = "text" if "text" in ch else None
    target = ch if key else (ch.get("message") or {})
    field = key or "content"
    if isinstance(target.get(field), str):
        target[field] = target[field][:-1] if target[field] else "x"
    return reply


def _change_argument(req: Json, reply: Json) -> Json:
    for tc in (_choice0(reply).get("message") or {}).get("tool_calls") or []:
        args = json.loads(tc["function"]["arguments"])
        key = next(iter(args))
        v = args[key]
        args[key] = v + 1 if isinstance(v, int) and not isinstance(v, bool) else f"{v}x"
        tc["function"]["arguments"] = json.dumps(args)
    return reply


def _reorder_keys(req: Json, reply: Json) -> Json:
    for tc in (_choice0(reply).get("message") or {}).get("tool_calls") or []:
        args = json.loads(tc["function"]["arguments"])
        tc["function"]["arguments"] = json.dumps(dict(reversed(list(args.items()))))
    return reply


def _drop_sampled(req: Json, reply: Json) -> Json:
    lp = _choice0(reply).get("logprobs") or {}
    if isinstance(lp.get("top_logprobs"), list):
        lp["top_logprobs"] = [
            {k: v for k, v in (top or {}).items() if k != tok}
            for tok, top in zip(lp.get("tokens") or [], lp["top_logprobs"], strict=False)
        ]
    for pos in lp.get("content") or []:
        pos["top_logprobs"] = [t for t in pos.get("top_logprobs") or [] if t.get("token") != pos.get("token")]
    return reply


def _forbidden_first_token(req: Json, reply: Json) -> Json:
    """A JSON-schema output whose first token id is replaced by its last (a closing brace or the stop
    token: neither may open the object), the text left as it was, so it still parses and validates."""
    if (req.get("response_format") or {}).get("type") != "json_schema":
        return reply
    ids = _choice0(reply).get("token_ids")
    if isinstance(ids, list) and len(ids) > 1:
        ids[0] = ids[-1]
    return reply


def _no_generation_prompt(req: Json) -> Json:
    return {**req, "add_generation_prompt": False}


def _as_assistant(req: Json, reply: Json) -> Json:
    """A server that forgets the generation prompt still answers as the assistant (vLLM itself answers
    ``add_generation_prompt: false`` with the last turn's role, a wire-schema deviation of its own)."""
    for ch in reply.get("choices") or []:
        if isinstance(ch, dict) and isinstance(ch.get("message"), dict):
            ch["message"]["role"] = "assistant"
    return reply


def _arguments_as_object(req: Json, reply: Json) -> Json:
    for tc in (_choice0(reply).get("message") or {}).get("tool_calls") or []:
        tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    return reply


def _renormalize_chat(req: Json, reply: Json) -> Json:
    """Chat logprobs shifted so that each position's ``top_logprobs`` sum to 1 (every logprob moved by
    the log of the mass the returned entries hold)."""
    if "messages" not in req:
        return reply
    for pos in (_choice0(reply).get("logprobs") or {}).get("content") or []:
        top = [t["logprob"] for t in pos.get("top_logprobs") or []]
        if not top:
            continue
        m = max(top)
        shift = m + math.log(sum(math.exp(x - m) for x in top))
        pos["logprob"] -= shift
        for t in pos["top_logprobs"]:
            t["logprob"] -= shift
    return reply


def reversed_keys(v: Any) -> Any:
    """Every object's keys in reverse order (JSON objects are unordered), but for the completions
    route's ``top_logprobs`` maps, whose listing order the logprob contract records."""
    if isinstance(v, dict):
        return {k: v[k] if k == "top_logprobs" else reversed_keys(v[k]) for k in reversed(list(v))}
    if isinstance(v, list):
        return [reversed_keys(x) for x in v]
    return v


def respaced_arguments(req: Json, reply: Json) -> Json:
    """Tool-call arguments re-serialized with other whitespace (the same JSON value)."""
    for tc in (_choice0(reply).get("message") or {}).get("tool_calls") or []:
        tc["function"]["arguments"] = json.dumps(json.loads(tc["function"]["arguments"]), indent=1)
    return reply


def extra_field(reply: Json) -> Json:
    """A field beyond the published types on the body, each choice and each message or delta."""
    out = {**reply, "x_server_extra": {"note": "beyond the spec"}}
    for ch in out.get("choices") or []:
        if isinstance(ch, dict):
            ch["x_server_extra"] = 1
            for k in ("message", "delta"):
                if isinstance(ch.get(k), dict):
                    ch[k]["x_server_extra"] = True
    return out


def _respelled(req: Json, reply: Json) -> Json:
    return reversed_keys(extra_field(respaced_arguments(req, reply)))


def _respelled_stream(req: Json, payloads: list[str]) -> list[str]:
    out = []
    for p in payloads:
        try:
            ev = json.loads(p)
        except json.JSONDecodeError:
            out.append(p)
            continue
        out.append(json.dumps(reversed_keys(extra_field(ev)) if isinstance(ev, dict) else ev))
    return out


FAULTS: tuple[Fault, ...] = (
    Fault(
        "template rendered without the generation prompt",
        "template",
        "fail",
        request=_no_generation_prompt,
        reply=_as_assistant,
    ),
    Fault("a stream missing its last delta", "streaming", "fail", stream=_drop_last_delta),
    Fault("a stop string cut one character late", "stop", "fail", reply=_stop_late),
    Fault("a text one character short of its ids' decode", "detokenization", "fail", reply=_short_text),
    Fault("a constrained output one character short", "structured", "fail", reply=_short_text),
    Fault(
        "a constrained token the grammar forbids, the text still valid",
        "structured",
        "fail",
        reply=_forbidden_first_token,
        says="grammar broken at step 0",
    ),
    Fault("a tool call with an argument changed", "tools", "fail", reply=_change_argument),
    Fault("a tool call with its argument keys reordered", "tools", "pass", reply=_reorder_keys),
    Fault("top_logprobs without the sampled token", "logprobs", "fail", reply=_drop_sampled),
    Fault(
        "chat logprobs renormalized over the returned top_logprobs",
        "logprob_values",
        "fail",
        reply=_renormalize_chat,
    ),
    Fault(
        "tool-call arguments sent as a JSON object, not a string",
        "schema",
        "fail",
        reply=_arguments_as_object,
        on="tools",
    ),
    Fault(
        "every reply re-spelled: keys reversed, arguments re-spaced, a field beyond the spec",
        "schema",
        "pass",
        reply=_respelled,
        stream=_respelled_stream,
        on="*",
    ),
    Fault(
        "a server that dies on an empty prompt",
        "robustness",
        "fail",
        dies_on=lambda req: req.get("prompt") == "",
    ),
)


class QuietServer(ThreadingHTTPServer):
    """A loopback server that does not print a client leaving mid-answer (the disconnect probe)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _State:
    def __init__(self) -> None:
        self.dead = False
        self.lock = threading.Lock()


@contextmanager
def proxy(upstream: str, fault: Fault) -> Iterator[str]:
    """Serve on 127.0.0.1; yields the proxy's base URL (``.../v1`` like ``upstream``)."""
    parts = urlsplit(upstream)
    state = _State()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self, method: str) -> None:
            if state.dead:
                self.close_connection = True
                self.connection.close()
                return
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            ours = fault.alters(self.headers.get(FACET_HEADER))
            try:
                req = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                req = None
            if ours and isinstance(req, dict) and fault.dies_on is not None and fault.dies_on(req):
                state.dead = True
                self.close_connection = True
                self.connection.close()
                return
            if ours and isinstance(req, dict) and fault.request is not None:
                raw = json.dumps(fault.request(req)).encode()
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=300)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "host")}
            conn.request(method, self.path, body=raw if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            ctype = resp.getheader("Content-Type") or "application/json"
            conn.close()
            if ours and isinstance(req, dict) and resp.status == 200:
                body = self._plant(req, body, ctype)
            self.send_response(resp.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _plant(self, req: Json, body: bytes, ctype: str) -> bytes:
            if "text/event-stream" in ctype:
                payloads = [ln[5:].strip() for ln in body.decode().splitlines() if ln.startswith("data:")]
                if fault.stream is not None:
                    payloads = fault.stream(req, payloads)
                return "".join(f"data: {p}\n\n" for p in payloads).encode()
            if fault.reply is not None:
                try:
                    reply = json.loads(body)
                except json.JSONDecodeError:
                    return body
                return json.dumps(fault.reply(req, reply)).encode()
            return body

        def do_POST(self) -> None:  # noqa: N802 - http.server's names
            self._forward("POST")

        def do_GET(self) -> None:  # noqa: N802
            self._forward("GET")

    server = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{parts.path}"
    finally:
        server.shutdown()
        server.server_close()


def by_name() -> Mapping[str, Fault]:
    return {f.name: f for f in FAULTS}
