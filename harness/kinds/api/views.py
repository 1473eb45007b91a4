"""A reply of ``/v1/completions`` or ``/v1/chat/completions`` — one JSON body or a stream of events —
read into one :class:`View`, the shape every facet compares."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.engines.openai.transport import Exchange
from harness.excerpt import clip

TopLogprobs = tuple[tuple[str, float], ...]
"""(token, logprob) as the server listed them, its order kept (ties are judged by it)."""


@dataclass(frozen=True, slots=True)
class Position:
    token: str
    """The token as the server names it (``token_id:N`` where it was asked to)."""
    logprob: float | None
    top: TopLogprobs


@dataclass(frozen=True, slots=True)
class View:
    """What one reply said, whatever the route and whether it was streamed."""

    status: int
    error: str = ""
    """Why there is no reply: no answer, an HTTP error's message, a stream cut short."""
    text: str | None = None
    """The completion text, or the chat message's content."""
    token_ids: tuple[int, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    finish: str | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    """``{"name": ..., "arguments": <the JSON text the server sent>}`` each."""
    logprobs: tuple[Position, ...] = ()
    deltas: tuple[str, ...] = ()
    """A stream's text pieces, in order (empty when not streamed)."""
    choices: int = 0
    streamed: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "text": self.text,
            "token_ids": list(self.token_ids) if self.token_ids is not None else None,
            "finish": self.finish,
            "usage": dict(self.usage),
            "tool_calls": [dict(t) for t in self.tool_calls],
            "choices": self.choices,
        }


def error_text(ex: Exchange) -> str:
    """The server's own words for a failure (its ``error.message``), else an excerpt."""
    if ex.error:
        return ex.error
    body = ex.body
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        return clip(str(body["error"].get("message") or json.dumps(body["error"])), 240)
    if isinstance(body, Mapping) and isinstance(body.get("detail"), (str, list)):
        return clip(json.dumps(body["detail"]), 240)  # FastAPI validation errors
    return clip(ex.raw or json.dumps(body), 240)


def _ids(v: Any) -> tuple[int, ...] | None:
    return tuple(int(t) for t in v) if isinstance(v, list) and all(isinstance(t, int) for t in v) else None


def _positions(lp: Any) -> list[Position]:
    if not isinstance(lp, Mapping):
        return []
    if isinstance(lp.get("content"), list):  # chat
        out = []
        for p in lp["content"]:
            top = tuple((str(t.get("token")), float(t.get("logprob"))) for t in p.get("top_logprobs") or [])
            out.append(Position(str(p.get("token")), p.get("logprob"), top))
        return out
    toks = lp.get("tokens") or []
    chosen = lp.get("token_logprobs") or [None] * len(toks)
    tops = lp.get("top_logprobs") or [None] * len(toks)
    return [
        Position(str(t), c, tuple((str(k), float(v)) for k, v in (top or {}).items()))
        for t, c, top in zip(toks, chosen, tops, strict=False)
    ]


def _tool_calls(msg: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, Mapping) else None
        if isinstance(fn, Mapping):
            out.append({"name": fn.get("name"), "arguments": fn.get("arguments")})
    return out


def view(ex: Exchange) -> View:
    """Read one exchange; a stream's deltas are joined as a client joins them."""
    if ex.status != 200 or (ex.error and not ex.events):
        return View(ex.status, error_text(ex) or f"HTTP {ex.status}")
    if ex.events or ex.done:
        return _stream(ex)
    body = ex.body
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) or not body["choices"]:
        return View(ex.status, error=f"no choices in the answer: {clip(ex.raw or json.dumps(body), 200)}")
    ch = body["choices"][0]
    msg = ch.get("message") if isinstance(ch.get("message"), Mapping) else None
    text = msg.get("content") if msg is not None else ch.get("text")
    prompt = _ids(body.get("prompt_token_ids")) or _ids(ch.get("prompt_token_ids"))
    return View(
        ex.status,
        text=text,
        token_ids=_ids(ch.get("token_ids")),
        prompt_ids=prompt,
        finish=ch.get("finish_reason"),
        usage=dict(body.get("usage") or {}),
        tool_calls=tuple(_tool_calls(msg or {})),
        logprobs=tuple(_positions(ch.get("logprobs"))),
        choices=len(body["choices"]),
    )


def _stream(ex: Exchange) -> View:
    deltas: list[str] = []
    ids: list[int] | None = None
    prompt: tuple[int, ...] | None = None
    finish = None
    usage: dict[str, Any] = {}
    positions: list[Position] = []
    calls: dict[int, dict[str, Any]] = {}
    indices: set[int] = set()
    for ev in ex.events:
        if not isinstance(ev, Mapping):
            continue
        if isinstance(ev.get("usage"), Mapping):
            usage = dict(ev["usage"])
        prompt = prompt or _ids(ev.get("prompt_token_ids"))
        for ch in ev.get("choices") or []:
            indices.add(int(ch.get("index", 0)))
            if ch.get("index", 0) != 0:
                continue
            prompt = prompt or _ids(ch.get("prompt_token_ids"))
            delta = ch.get("delta") if isinstance(ch.get("delta"), Mapping) else None
            piece = delta.get("content") if delta is not None else ch.get("text")
            if isinstance(piece, str):
                deltas.append(piece)
            for tc in (delta or {}).get("tool_calls") or []:
                slot = calls.setdefault(int(tc.get("index", 0)), {"name": None, "arguments": ""})
                fn = tc.get("function") or {}
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            if (got := _ids(ch.get("token_ids"))) is not None:
                ids = (ids or []) + list(got)
            positions += _positions(ch.get("logprobs"))
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    error = ex.error or ("" if ex.done else "the stream ended without data: [DONE]")
    return View(
        ex.status,
        error=error,
        text="".join(deltas),
        token_ids=tuple(ids) if ids is not None else None,
        prompt_ids=prompt,
        finish=finish,
        usage=usage,
        tool_calls=tuple(calls[i] for i in sorted(calls)),
        logprobs=tuple(positions),
        deltas=tuple(deltas),
        choices=len(indices),
        streamed=True,
    )


def token_id(token: str) -> int | None:
    """``token_id:N`` -> N (vLLM's ``return_tokens_as_token_ids``); None for a token text."""
    head, _, tail = token.partition(":")
    return int(tail) if head == "token_id" and tail.lstrip("-").isdigit() else None


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where two sequences differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
