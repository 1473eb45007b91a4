"""A replay double of the pinned vLLM server for the API gate's unit tests: a real HTTP server on
127.0.0.1 answering every request the API gate sends with what the real server answered when the
transcript was recorded (``tests/unit/data/api_replay_tiny-qwen3.json``). A request it never saw gets
HTTP 404 naming it, so a test cannot pass on an answer nobody recorded.

Re-record (one vLLM server start, the requests of suite api_smoke, the controls' included):

    python -m tests.unit.api_replay record tiny-qwen3
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.kinds.api.proxy import QuietServer

DATA = Path(__file__).parent / "data"
SUITE = "api_smoke"


def transcript_path(model: str) -> Path:
    return DATA / f"api_replay_{model}.json"


def key(path: str, raw: bytes) -> str:
    """A request's identity: its path and body, ``model`` and key order left out."""
    try:
        body = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return f"{path} RAW {raw.decode(errors='replace')}"
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k != "model"}
    return f"{path} {json.dumps(body, sort_keys=True, ensure_ascii=False)}"


def _server(handle: Any) -> Any:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            status, ctype, body = handle(
                "POST", self.path, self.rfile.read(n) if n else b"", dict(self.headers)
            )
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            status, ctype, body = handle("GET", self.path, b"", dict(self.headers))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return H


@contextmanager
def serve(answers: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """Replay ``answers`` (key -> status, content type, body text); yields the base URL (``/v1``)."""
    seen: list[str] = []

    def handle(method: str, path: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        k = key(path, raw)
        seen.append(k)
        got = answers.get(k)
        if got is None:
            return (
                404,
                "application/json",
                json.dumps({"error": {"message": f"not recorded: {k[:200]}"}}).encode(),
            )
        return int(got["status"]), str(got["type"]), str(got["body"]).encode()

    server = QuietServer(("127.0.0.1", 0), _server(handle))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def recorder(upstream: str, into: dict[str, dict[str, Any]]) -> Iterator[str]:
    parts = urlsplit(upstream)

    def handle(method: str, path: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=300)
        conn.request(method, path, body=raw or None, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body, ctype = resp.read(), resp.getheader("Content-Type") or "application/json"
        conn.close()
        into[key(path, raw)] = {"status": resp.status, "type": ctype, "body": body.decode()}
        return resp.status, ctype, body

    server = QuietServer(("127.0.0.1", 0), _server(handle))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def record(model_name: str) -> Path:
    """Start the pinned vLLM server, send it everything one API gate sends (through the controls'
    proxy too), keep every answer."""
    from harness.engines import RunnerContext, make_runner
    from harness.kinds.api.kind import PINNED, configure
    from harness.kinds.api.observe import observe
    from harness.kinds.api.proxy import FAULTS
    from harness.kinds.api.surface import base_probes, control, ordinary_text, plan, with_base
    from harness.models import resolve_model
    from harness.workspace import Workspace
    from tests.unit.api_kit import context

    ws = Workspace.default()
    model = resolve_model(model_name, ws)
    ctx = context(model_name)
    runner = configure(make_runner(PINNED, model, RunnerContext(name="oracle")), ctx.settings)
    answers: dict[str, dict[str, Any]] = {}
    runner.start()
    try:
        ep = runner.endpoint()  # type: ignore[attr-defined]
        with recorder(ep.base_url, answers) as url:
            rec = replace(ep, base_url=url)
            ctx = with_base(
                ctx, observe(rec, base_probes(ctx.texts, ctx.settings.max_tokens), ordinary_text(ctx))
            )
            probes = plan(ctx)
            oracle = observe(rec, probes, ordinary_text(ctx))
            for f in FAULTS:
                print(control(ctx, probes, oracle, rec, f))
    finally:
        runner.close()
    path = transcript_path(model_name)
    path.write_text(json.dumps(dict(sorted(answers.items())), indent=0, ensure_ascii=False) + "\n")
    return path


def load(model_name: str) -> dict[str, dict[str, Any]]:
    return dict(json.loads(transcript_path(model_name).read_text()))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "record":
        raise SystemExit("usage: python -m tests.unit.api_replay record MODEL")
    print(record(sys.argv[2]))
