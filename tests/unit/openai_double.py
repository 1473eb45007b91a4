"""A small OpenAI-compatible server on loopback with planted faults, for the openai runner's tests.

It answers ``/v1/completions`` the way vLLM's server does (same field names, ``token_id:N`` keys,
streamed server-sent events), from a table of known outputs keyed by prompt ids: the committed
goldens, so a healthy case passes the gate exactly. Per case, a fault can be planted:

=================  ==========================================================================
``5xx``            HTTP 503 every time
``5xx-once``       HTTP 503 on the first attempt, then a healthy answer (retries must absorb it)
``hang``           accepts the request and never answers
``malformed``      a body / stream event that is not JSON
``wrong-logprobs`` one position carries 2 top logprobs instead of k
``die``            the connection closes mid-stream, after 3 tokens
=================  ==========================================================================

Server-wide quirks: ``max_logprobs`` (a 400 like vLLM's above it), ``text_only`` (ignores
``return_token_ids`` / ``return_tokens_as_token_ids`` and keys logprobs by text), ``api_key``
(401 without ``Authorization: Bearer <key>``).

Like llama-cpp-python: ``ids_refused`` (HTTP 422 for a token-id prompt; text prompts are turned into
ids with ``encode``), ``render`` (logprobs keyed by each token's text as ``render(id)`` shows it, no
token ids), ``tokenize`` (``extras``: ``POST /extras/tokenize``; ``tokenize``: ``POST /tokenize``;
None: neither, so the client must echo), ``defaults`` (sampling defaults published in
``/openapi.json``). Planted per case: ``tokenize_plant`` (case -> (position, id): the server's
tokenization differs there, in the tokenize endpoint, the echo and the prompt it completes) and
``non_greedy`` (case -> position: the runner-up is chosen there, its own top-1 left in the row).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from harness.api import Output


@dataclass
class Double:
    answers: Mapping[tuple[int, ...], tuple[str, Output]]
    """prompt ids -> (case id, output to answer with)."""
    faults: dict[str, str] = field(default_factory=dict)
    max_logprobs: int = 20
    text_only: bool = False
    api_key: str | None = None
    ids_refused: bool = False
    ids_error: str | None = None
    """``kills``: a token-id prompt stops the engine, and every later completion answers HTTP 500
    (vllm.cpp at d85906ae); ``500``: a token-id prompt answers HTTP 500 and the server stays up."""
    dead: bool = False
    encode: Callable[[str], Sequence[int]] | None = None
    render: Callable[[int], str] | None = None
    tokenize: str | None = None
    defaults: dict[str, Any] | None = None
    tokenize_plant: dict[str, tuple[int, int]] = field(default_factory=dict)
    non_greedy: dict[str, int] = field(default_factory=dict)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    delay_s: float = 0.0
    """Each (non-probe) request takes this long: lets concurrency show."""
    attempts: Counter[str] = field(default_factory=Counter)
    auth_seen: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def served_ids(self, text: str) -> list[int]:
        """What this server's tokenizer makes of ``text`` (with the planted difference)."""
        assert self.encode is not None
        ids = list(self.encode(text))
        for cid, (pos, tid) in self.tokenize_plant.items():
            case_ids = next(k for k, v in self.answers.items() if v[0] == cid)
            if tuple(ids) == case_ids or (len(ids) > pos and tuple(ids) == case_ids[:len(ids)]):
                ids[pos] = tid
        return ids

    def completion(self, body: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        """(case id, non-streamed body, per-token choices for streaming)."""
        prompt = tuple(body["prompt"]) if not isinstance(body["prompt"], str) else tuple(self.served_ids(
            body["prompt"]))
        # The runner's probe sends a prefix of the first case.
        cid, out = self.answers.get(prompt) or next(
            (v for key, v in self.answers.items() if key[:len(prompt)] == prompt),
            self._nearest(prompt))
        if cid in self.non_greedy:
            out = _runner_up(out, self.non_greedy[cid])
        n = min(int(body.get("max_tokens", 16)), len(out.token_ids))
        k = body.get("logprobs")
        as_ids = bool(body.get("return_tokens_as_token_ids")) and not self.text_only and self.render is None
        render = self.render
        key = (lambda t: f"token_id:{t}") if as_ids else (render or (lambda t: f"tok{t}"))
        steps = []
        for p in range(n):
            tid = int(out.token_ids[p])
            # All text on the first token: the double cannot split the golden text by token.
            ch: dict[str, Any] = {"index": 0, "text": out.text if p == 0 else "", "finish_reason": None}
            if body.get("return_token_ids") and not self.text_only and self.render is None:
                ch["token_ids"] = [tid]
            if k:
                assert out.top_ids is not None and out.top_logprobs is not None
                # like llama-cpp-python: ascending, so a colliding text keeps the lower logprob
                pairs = list(zip(out.top_ids[p][:k], out.top_logprobs[p][:k], strict=True))
                row = {key(int(t)): float(v) for t, v in (pairs[::-1] if render else pairs)}
                chosen = (float(out.chosen_logprobs[p]) if out.chosen_logprobs is not None
                          else float(out.top_logprobs[p][0]))
                row[key(tid)] = chosen  # OpenAI's rule: the chosen token is always in the row
                if self.faults.get(cid) == "wrong-logprobs" and p == 3:
                    row = dict(list(row.items())[:2])
                ch["logprobs"] = {"tokens": [key(tid)], "token_logprobs": [chosen],
                                  "top_logprobs": [row], "text_offset": [p]}
            steps.append(ch)
        if steps:
            steps[-1]["finish_reason"] = "length" if n == body.get("max_tokens") else "stop"
        merged: dict[str, Any] = {"index": 0, "text": "".join(s["text"] for s in steps),
                                  "finish_reason": steps[-1]["finish_reason"] if steps else "length"}
        if body.get("return_token_ids") and not self.text_only and self.render is None:
            merged["token_ids"] = [t for s in steps for t in s["token_ids"]]
        if k:
            merged["logprobs"] = {f: [x for s in steps for x in s["logprobs"][f]]
                                  for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        if body.get("echo") and render is not None and k:
            # the prompt's tokens, as texts, ahead of the generated ones (no logprobs for them here)
            lp = merged["logprobs"]
            lp["tokens"] = [render(t) for t in prompt] + lp["tokens"]
            for f in ("token_logprobs", "top_logprobs"):
                lp[f] = [None] * len(prompt) + lp[f]
            lp["text_offset"] = list(range(len(prompt))) + lp["text_offset"]
        return cid, {"id": "cmpl-1", "object": "text_completion", "choices": [merged],
                     "system_fingerprint": "double-1"}, steps

    def _nearest(self, prompt: tuple[int, ...]) -> tuple[str, Output]:
        """A prompt tokenized with a planted difference: the case whose ids differ least."""
        def score(key: tuple[int, ...]) -> int:
            return sum(a != b for a, b in zip(key, prompt, strict=False)) + abs(len(key) - len(prompt))
        return self.answers[min(self.answers, key=score)]


def _runner_up(out: Output, p: int) -> Output:
    """``out`` with the runner-up chosen at position ``p`` (its top-k row left as it was)."""
    assert out.top_ids is not None and out.top_logprobs is not None
    toks = list(out.token_ids)
    toks[p] = int(out.top_ids[p][1])
    chosen = np.array(out.chosen_logprobs if out.chosen_logprobs is not None else out.top_logprobs[:, 0],
                      np.float32, copy=True)
    chosen[p] = out.top_logprobs[p][1]
    return Output(out.case_id, tuple(toks), out.text, out.top_ids, out.top_logprobs, chosen,
                  out.finish_reason)


def _handler(d: Double) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            got = self.headers.get("Authorization", "")
            d.auth_seen.append(got)
            if d.api_key and got != f"Bearer {d.api_key}":
                self._send(401, b'{"error": {"message": "bad key", "code": 401}}')
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "tiny", "owned_by": "double"}]}).encode())
            elif self.path == "/version":
                self._send(200, b'{"version": "9.9.9"}')
            elif self.path == "/openapi.json" and d.defaults is not None:
                schema = {"properties": {k: {"default": v} for k, v in d.defaults.items()}}
                doc = {"paths": {"/v1/completions": {"post": {"requestBody": {"content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Req"}}}}}}},
                    "components": {"schemas": {"Req": schema}}}
                self._send(200, json.dumps(doc).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorized():
                return
            if self.path in ("/extras/tokenize", "/tokenize"):
                if d.tokenize is None or self.path != {"extras": "/extras/tokenize",
                                                       "tokenize": "/tokenize"}[d.tokenize]:
                    self._send(404, b'{"detail": "Not Found"}')
                    return
                text = body.get("input") if self.path == "/extras/tokenize" else body.get("content")
                self._send(200, json.dumps({"tokens": d.served_ids(str(text))}).encode())
                return
            with d.lock:
                d.bodies.append(body)
            if d.dead:
                msg = "request submitted to a stopped AsyncLLM"
                self._send(500, json.dumps({"error": {"message": msg, "code": 500}}).encode())
                return
            if isinstance(body.get("prompt"), list) and d.ids_error is not None:
                d.dead = d.ids_error == "kills"
                msg = "num_new_tokens must be greater than 0 when there are no external computed tokens"
                self._send(500, json.dumps({"error": {"message": msg, "code": 500}}).encode())
                return
            if isinstance(body.get("prompt"), list) and d.ids_refused:
                msg = "prompt: Input should be a valid string"
                self._send(422, json.dumps({"error": {"message": msg, "code": 422}}).encode())
                return
            if isinstance(body.get("prompt"), str) and d.encode is None:
                self._send(422, b'{"error": {"message": "prompt: token ids only", "code": 422}}')
                return
            k = body.get("logprobs") or 0
            if k > d.max_logprobs:
                msg = (f"Requested sample logprobs of {k}, which is greater than max allowed: "
                       f"{d.max_logprobs}")
                self._send(400, json.dumps({"error": {"message": msg, "code": 400}}).encode())
                return
            cid, whole, steps = d.completion(body)
            probe = body.get("max_tokens") == 2
            with d.lock:
                d.attempts[cid] += 0 if probe else 1
                attempt = d.attempts[cid]
                d.in_flight += 1
                d.max_in_flight = max(d.max_in_flight, d.in_flight)
            try:
                if not probe and d.delay_s:
                    time.sleep(d.delay_s)
            finally:
                # out of flight before the answer is written: a client that reads the whole answer
                # and sends its next request must not find this thread still counting this one
                with d.lock:
                    d.in_flight -= 1
            fault = None if probe else d.faults.get(cid)
            self._answer(fault, attempt, body, whole, steps)

        def _answer(self, fault: str | None, attempt: int, body: Mapping[str, Any],
                    whole: dict[str, Any], steps: list[dict[str, Any]]) -> None:
            if fault == "5xx" or (fault == "5xx-once" and attempt == 1):
                self._send(503, b'{"error": {"message": "overloaded: try later", "code": 503}}')
                return
            if fault == "hang":
                d.stop.wait(60)
                return
            if fault == "malformed":
                if body.get("stream"):
                    self._stream([b'data: {"choices": [{"text": "oops", \n\n'])
                else:
                    self._send(200, b'{"choices": [{"text": "oops", ')
                return
            if not body.get("stream"):
                self._send(200, json.dumps(whole).encode())
                return
            events = [f"data: {json.dumps({'choices': [s], 'system_fingerprint': 'double-1'})}\n\n".encode()
                      for s in steps]
            if fault == "die":
                self._stream(events[:3], finish=False)
                return
            usage = {"choices": [], "usage": {"completion_tokens": len(steps)}}
            self._stream([*events, f"data: {json.dumps(usage)}\n\n".encode(), b"data: [DONE]\n\n"])

        def _stream(self, events: list[bytes], finish: bool = True) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for e in events:
                self.wfile.write(f"{len(e):x}\r\n".encode() + e + b"\r\n")
                self.wfile.flush()
            if finish:
                self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

    return H


@contextmanager
def serve(d: Double) -> Iterator[str]:
    """Run the double on 127.0.0.1 and a free port; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(d))
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        d.stop.set()
        server.shutdown()
        server.server_close()
