"""The wire schema and the logprob values, judged through a proxy of this test's own — real HTTP on
127.0.0.1, written here rather than taken from the gate's fault table — in front of the replay double
of the pinned vLLM server (tests/unit/api_replay.py), as a user would put a faulty server in front of
it. Each fault fails its own row and no other; the re-spellings a client must not care about pass."""

from __future__ import annotations

import copy
import http.client
import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.abilities import Endpoint
from harness.engines.openai.transport import Exchange
from harness.kinds.api.facets import comparator
from harness.kinds.api.observe import observe
from harness.kinds.api.proxy import QuietServer, reversed_keys
from harness.kinds.api.surface import base_probes, judge, ordinary_text, plan, with_base
from harness.kinds.api.wire import deviations
from tests.unit.api_kit import context
from tests.unit.api_replay import load, serve

MODEL = "tiny-qwen3"
Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


@contextmanager
def faulty(upstream: str, rewrite: Rewrite) -> Iterator[str]:
    """A server that answers every JSON reply rewritten by ``rewrite`` (streams pass as they are)."""
    parts = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's names
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=60)
            conn.request("POST", self.path, body=raw, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body, ctype = resp.read(), resp.getheader("Content-Type") or "application/json"
            conn.close()
            if resp.status == 200 and "json" in ctype:
                body = json.dumps(rewrite(json.loads(body))).encode()
            self.send_response(resp.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def calls(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        tc["function"]
        for ch in reply.get("choices") or []
        for tc in (ch.get("message") or {}).get("tool_calls") or []
    ]


def arguments_as_object(reply: dict[str, Any]) -> dict[str, Any]:
    for fn in calls(reply):
        fn["arguments"] = json.loads(fn["arguments"])
    return reply


def chat_renormalized(reply: dict[str, Any]) -> dict[str, Any]:
    for ch in reply.get("choices") or []:
        for pos in ((ch.get("logprobs") or {}).get("content") or []) if "message" in ch else []:
            tops = [t["logprob"] for t in pos["top_logprobs"]]
            if tops:
                mass = math.log(sum(math.exp(x) for x in tops))
                pos["logprob"] -= mass
                for t in pos["top_logprobs"]:
                    t["logprob"] -= mass
    return reply


def respaced(reply: dict[str, Any]) -> dict[str, Any]:
    for fn in calls(reply):
        fn["arguments"] = json.dumps(json.loads(fn["arguments"]), separators=(" ,", ":   "))
    return reply


def extra_field(reply: dict[str, Any]) -> dict[str, Any]:
    for ch in reply.get("choices") or []:
        ch["x_vendor"] = {"cached": True}
        (ch.get("message") or {})["x_vendor"] = 1
    return {**reply, "x_vendor": [1, 2]}


@pytest.fixture(scope="module")
def replay():  # type: ignore[no-untyped-def]
    with serve(load(MODEL)) as url:
        ep = Endpoint(url, MODEL, managed=True)
        ctx = context(MODEL)
        ctx = with_base(ctx, observe(ep, base_probes(ctx.texts, ctx.settings.max_tokens), ordinary_text(ctx)))
        probes = plan(ctx)
        yield ctx, probes, observe(ep, probes, ordinary_text(ctx)), ep


def failing_rows(replay, rewrite: Rewrite) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, ep = replay
    with faulty(ep.base_url, rewrite) as url:
        got = observe(replace(ep, base_url=url), probes, ordinary_text(ctx))
    out: dict[str, list[str]] = {}
    for v in judge(ctx, probes, oracle, got):
        if v.status not in ("pass", "skip"):
            out.setdefault(v.comparator, []).append(f"{v.case_id}: {v.summary}")
    return out


def test_tool_call_arguments_as_an_object_fail_the_schema_row_only(replay) -> None:  # type: ignore[no-untyped-def]
    rows = failing_rows(replay, arguments_as_object)
    assert set(rows) == {comparator("schema")}, rows
    assert any("tool_calls[0].function.arguments: expected a string" in s for s in rows["api.schema"]), rows
    assert all(s.startswith("tools/") for s in rows["api.schema"]), rows


def test_chat_top_logprobs_renormalized_fail_the_logprob_values_row_only(replay) -> None:  # type: ignore[no-untyped-def]
    rows = failing_rows(replay, chat_renormalized)
    assert set(rows) == {comparator("logprob_values")}, rows
    failed = rows["api.logprob_values"]
    assert any(s.startswith("logprob_values/chat/greedy") and "the oracle" in s for s in failed), failed
    assert any(s.startswith("logprob_values/chat/sampled-top-k") and "oracle's raw" in s for s in failed), (
        failed
    )
    assert not any("/completions/" in s for s in failed), failed


@pytest.mark.parametrize("rewrite", [reversed_keys, respaced, extra_field], ids=lambda f: f.__name__)
def test_what_a_client_must_not_care_about_passes_every_row(replay, rewrite: Rewrite) -> None:  # type: ignore[no-untyped-def]
    assert failing_rows(replay, rewrite) == {}


def tool_reply() -> dict[str, Any]:
    raw = next(
        v["body"] for k, v in load(MODEL).items() if '"tool_choice": "required"' in k and v["status"] == 200
    )
    return dict(json.loads(raw))


def test_a_deviation_names_the_path_and_the_type() -> None:
    reply = tool_reply()
    assert deviations("/chat/completions", Exchange(200, reply)) == []
    bad = arguments_as_object(copy.deepcopy(reply))
    (d,) = deviations("/chat/completions", Exchange(200, bad))
    assert (d.type_name, d.path, d.expected) == (
        "ChatCompletion",
        "choices[0].message.tool_calls[0].function.arguments",
        "a string",
    )
    assert d.got.startswith("object {")
    bad = copy.deepcopy(reply)
    calls(bad)[0]["arguments"] = "{'city': 'Oslo'"
    (d,) = deviations("/chat/completions", Exchange(200, bad))
    assert d.expected == "a string holding JSON"
    bad = copy.deepcopy(reply)
    del bad["created"]
    bad["usage"]["prompt_tokens"] = "539"
    got = {(x.path, x.expected) for x in deviations("/chat/completions", Exchange(200, bad))}
    assert got == {("created", "a required field"), ("usage.prompt_tokens", "an integer")}


def test_a_completions_stream_may_leave_finish_reason_null_until_its_end() -> None:
    ev = [
        {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
        },
        {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "bogus"}],
        },
    ]
    (d,) = deviations("/completions", Exchange(200, events=tuple(ev), done=True))
    assert d.path == "events[1].choices[0].finish_reason" and "'stop'" in d.expected


def test_the_oracle_s_own_error_code_is_a_finding_not_a_failure(replay) -> None:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, _ep = replay
    schema = [v for v in judge(ctx, probes, oracle, oracle) if v.comparator == "api.schema"]
    assert schema and all(v.status in ("pass", "skip") for v in schema)
    shared = [v for v in schema if v.evidence.get("oracle_too")]
    assert shared and all("error.code: a string" in " ".join(v.evidence["oracle_too"]) for v in shared)
    assert all(v.case_id.startswith("robustness/") for v in shared)
