"""HTTP to one OpenAI-compatible server: one connection per request, JSON bodies and server-sent
event streams read into a :class:`Reply`, every failure a :class:`Fault` that says whether a retry
may help (a timeout, a dropped connection, HTTP 5xx) and carries a redacted excerpt of the answer."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harness.engines.openai.options import OpenAIOptions
from harness.excerpt import clip


class Fault(Exception):
    """One failed exchange with the server. ``retryable``: a timeout, dropped connection or 5xx."""

    def __init__(self, what: str, excerpt: str = "", retryable: bool = False, status: int = 0,
                 transport: bool = False) -> None:
        super().__init__(what)
        self.what = what
        self.excerpt = excerpt
        self.retryable = retryable
        self.status = status
        self.transport = transport
        """The server could not be reached or went silent (counts towards the breaker)."""

    def describe(self) -> str:
        return self.what + (f"; response: {self.excerpt!r}" if self.excerpt else "")


@dataclass(slots=True)
class Reply:
    """One completion, accumulated over stream chunks (or from one JSON body)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    lp_tokens: list[str] = field(default_factory=list)
    lp_chosen: list[float | None] = field(default_factory=list)
    lp_top: list[dict[str, float] | None] = field(default_factory=list)
    has_logprobs: bool = False
    finish_reason: str | None = None
    usage_tokens: int | None = None
    ttft_s: float | None = None

    def feed(self, chunk: Mapping[str, Any], t_sent: float) -> None:
        if isinstance(chunk.get("usage"), Mapping):
            self.usage_tokens = chunk["usage"].get("completion_tokens", self.usage_tokens)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise Fault("response has no 'choices' list", excerpt=clip(json.dumps(chunk)))
        for ch in choices:
            if not isinstance(ch, Mapping) or ch.get("index", 0) != 0:
                continue
            got_token = False
            if isinstance(ch.get("text"), str):
                self.text.append(ch["text"])
                got_token |= bool(ch["text"])
            if isinstance(ch.get("token_ids"), list):
                self.token_ids = (self.token_ids or []) + [int(t) for t in ch["token_ids"]]
                got_token |= bool(ch["token_ids"])
            lp = ch.get("logprobs")
            if isinstance(lp, Mapping):
                self.has_logprobs = True
                toks = lp.get("tokens") or []
                self.lp_tokens += [str(t) for t in toks]
                self.lp_chosen += list(lp.get("token_logprobs") or [])
                self.lp_top += list(lp.get("top_logprobs") or [])
                got_token |= bool(toks)
            if ch.get("finish_reason"):
                self.finish_reason = str(ch["finish_reason"])
            if got_token and self.ttft_s is None:
                self.ttft_s = time.perf_counter() - t_sent


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request and what came back, whatever it was (the API gate judges failures too): never a
    :class:`Fault`."""

    status: int
    """HTTP status; 0 when no answer came (refused, dropped, timed out: ``error`` says which)."""
    body: Any = None
    """The parsed JSON body of an answer that was not streamed (None: not JSON; ``raw`` has it)."""
    events: tuple[Any, ...] = ()
    """The parsed ``data:`` events of a stream, ``[DONE]`` left out."""
    done: bool = False
    """The stream ended with ``data: [DONE]``."""
    raw: str = ""
    """An excerpt of an answer that was not JSON."""
    error: str = ""
    """Why no (whole) answer came."""
    seconds: float = 0.0

    @property
    def answered(self) -> bool:
        return self.status > 0 and not self.error


class Transport:
    """Requests to ``options.base_url``; the API key (``key_env``) is sent, never shown."""

    def __init__(self, options: OpenAIOptions) -> None:
        self.options = options
        self.fingerprint: str | None = None
        """The last ``system_fingerprint`` the server sent."""
        parts = urlsplit(options.base_url)
        self._https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self._https else 80)
        self.prefix = parts.path.rstrip("/")

    def root(self) -> str:
        """The server's root path (the base URL without ``/v1``)."""
        return self.prefix[: -len("/v1")] if self.prefix.endswith("/v1") else self.prefix

    def with_retries(self, fn: Callable[[], Reply]) -> Reply:
        for attempt in range(self.options.retries + 1):
            try:
                return fn()
            except Fault as f:
                if not f.retryable or attempt == self.options.retries:
                    raise
                time.sleep(min(0.25 * 2**attempt, 4.0))
        raise AssertionError("unreachable")

    def post_json(self, path: str, body: Mapping[str, Any], prefix: str | None = None) -> Any:
        return self._json("POST", path, body, prefix)

    def get_json(self, path: str, prefix: str | None = None) -> Any:
        return self._json("GET", path, None, prefix)

    def complete(self, body: Mapping[str, Any], stream: bool) -> Reply:
        """``POST /completions``: the whole reply, streamed or in one JSON body."""
        t_sent = time.perf_counter()
        deadline = time.monotonic() + self.options.request_timeout_s
        conn, resp = self._open("POST", "/completions", body)
        reply = Reply()
        try:
            if not stream:
                raw = self._read(resp)
                try:
                    data = json.loads(raw)
                except json.JSONDecodeError:
                    raise Fault("malformed JSON", excerpt=self.excerpt(raw)) from None
                if not isinstance(data, Mapping):
                    raise Fault("response is not a JSON object", excerpt=self.excerpt(raw))
                self._check_error(data)
                self._feed(reply, data, t_sent, raw)
                if reply.ttft_s is not None:
                    reply.ttft_s = None  # not streamed: the first token's time is unknown
                return reply
            done = False
            for payload in self._events(resp, deadline):
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                except json.JSONDecodeError:
                    raise Fault("malformed JSON in the stream", excerpt=self.excerpt(payload)) from None
                if not isinstance(chunk, Mapping):
                    raise Fault("stream event is not a JSON object", excerpt=self.excerpt(payload))
                self._check_error(chunk)
                self._feed(reply, chunk, t_sent, payload)
            if not done and reply.finish_reason is None:
                n = len(reply.token_ids or reply.lp_tokens)
                raise Fault(f"the stream ended after {n} tokens without finishing (server died?)",
                            retryable=True, transport=True)
            return reply
        finally:
            conn.close()

    def exchange(self, path: str, body: Mapping[str, Any] | bytes | None, *, stream: bool = False,
                 headers: Mapping[str, str] | None = None, drop_after: int | None = None,
                 method: str = "POST") -> Exchange:
        """One request as given (``body`` bytes: sent as they are, e.g. malformed JSON) and all that
        came back: an HTTP error is an :class:`Exchange` with its status, not a :class:`Fault`.
        ``drop_after``: close the connection after that many stream events (a client that leaves)."""
        t0 = time.perf_counter()
        conn = self._connect()
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        try:
            conn.request(method, self.prefix + path, body=data,
                         headers={**self._headers(), **(headers or {})})
            resp = conn.getresponse()
            if not stream or resp.status >= 400:
                raw = resp.read().decode(errors="replace")
                try:
                    parsed = json.loads(raw)
                    return Exchange(resp.status, parsed, seconds=time.perf_counter() - t0)
                except json.JSONDecodeError:
                    return Exchange(resp.status, raw=self.excerpt(raw), seconds=time.perf_counter() - t0)
            events: list[Any] = []
            deadline = time.monotonic() + self.options.request_timeout_s
            for payload in self._events(resp, deadline):
                if payload == "[DONE]":
                    return Exchange(resp.status, events=tuple(events), done=True,
                                    seconds=time.perf_counter() - t0)
                try:
                    events.append(json.loads(payload))
                except json.JSONDecodeError:
                    return Exchange(resp.status, events=tuple(events), raw=self.excerpt(payload),
                                    error="malformed JSON in the stream", seconds=time.perf_counter() - t0)
                if drop_after is not None and len(events) >= drop_after:
                    return Exchange(resp.status, events=tuple(events), error="dropped by the client",
                                    seconds=time.perf_counter() - t0)
            return Exchange(resp.status, events=tuple(events), seconds=time.perf_counter() - t0)
        except Fault as f:
            return Exchange(0, error=self.redact(f.describe()), seconds=time.perf_counter() - t0)
        except TimeoutError:
            return Exchange(0, error=f"no answer within {self.options.timeout_s:g} s",
                            seconds=time.perf_counter() - t0)
        except (OSError, http.client.HTTPException) as e:
            return Exchange(0, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
        finally:
            conn.close()

    def excerpt(self, text: str) -> str:
        return self.redact(clip(text.strip()))

    def redact(self, text: str) -> str:
        key = os.environ.get(self.options.key_env)
        return text.replace(key, "***") if key else text

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.options.timeout_s)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if key := os.environ.get(self.options.key_env):
            h["Authorization"] = f"Bearer {key}"
        return h

    def _open(self, method: str, path: str, body: Mapping[str, Any] | None,
              prefix: str | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connect()
        url = (self.prefix if prefix is None else prefix) + path
        try:
            conn.request(method, url, body=json.dumps(body) if body is not None else None,
                         headers=self._headers())
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise Fault(f"no answer within {self.options.timeout_s:g} s (server hung?)", retryable=True,
                        transport=True) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise Fault(f"cannot reach {self.host}:{self.port}: {type(e).__name__}: {e}", retryable=True,
                        transport=True) from None
        if resp.status >= 400:
            try:
                text = resp.read(4096).decode(errors="replace")
            except (OSError, http.client.HTTPException):
                text = ""
            conn.close()
            raise Fault(f"HTTP {resp.status}", excerpt=self.excerpt(text),
                        retryable=resp.status >= 500 or resp.status in (408, 429), status=resp.status)
        return conn, resp

    def _json(self, method: str, path: str, body: Mapping[str, Any] | None, prefix: str | None) -> Any:
        conn, resp = self._open(method, path, body, prefix)
        try:
            raw = self._read(resp)
        finally:
            conn.close()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise Fault(f"{method} {path}: malformed JSON", excerpt=self.excerpt(raw)) from None

    def _read(self, resp: http.client.HTTPResponse) -> str:
        try:
            return resp.read().decode(errors="replace")
        except TimeoutError:
            raise Fault(f"response stalled for {self.options.timeout_s:g} s (server hung?)",
                        retryable=True, transport=True) from None
        except (OSError, http.client.HTTPException) as e:
            raise Fault(f"connection dropped mid-response: {type(e).__name__}", retryable=True,
                        transport=True) from None

    def _events(self, resp: http.client.HTTPResponse, deadline: float) -> Iterator[str]:
        """The ``data:`` payloads of a server-sent-events stream."""
        while True:
            if time.monotonic() > deadline:
                raise Fault(f"request took longer than {self.options.request_timeout_s:g} s",
                            retryable=True, transport=True)
            try:
                line = resp.readline()
            except TimeoutError:
                raise Fault(f"stream stalled for {self.options.timeout_s:g} s (server hung?)",
                            retryable=True, transport=True) from None
            except (OSError, http.client.HTTPException) as e:
                raise Fault(f"connection dropped mid-stream: {type(e).__name__}", retryable=True,
                            transport=True) from None
            if not line:
                return
            text = line.decode(errors="replace").strip()
            if text.startswith("data:"):
                yield text[5:].strip()
            elif text and not text.startswith(":") and not text.startswith(("event:", "id:", "retry:")):
                raise Fault("malformed stream line (not server-sent events)", excerpt=self.excerpt(text))

    def _feed(self, reply: Reply, obj: Mapping[str, Any], t_sent: float, raw: str) -> None:
        try:
            reply.feed(obj, t_sent)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise Fault(f"unexpected response shape ({type(e).__name__}: {e})",
                        excerpt=self.excerpt(raw)) from None

    def _check_error(self, obj: Mapping[str, Any]) -> None:
        err = obj.get("error")
        if err:
            code = err.get("code") if isinstance(err, Mapping) else None
            status = code if isinstance(code, int) else 0
            raise Fault(f"server error{f' {status}' if status else ''}",
                        excerpt=self.excerpt(json.dumps(err)), retryable=status >= 500, status=status)
        if isinstance(obj.get("system_fingerprint"), str):
            self.fingerprint = obj["system_fingerprint"]
