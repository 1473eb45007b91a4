"""The API gate on the real pinned vLLM server, opt-in (``HARNESS_API_TEST=1``; one server start and
about 300 requests, 2-3 minutes on 2 CPU cores): the pinned server judged against itself passes every
facet and every planted control bites. The unit tier covers the same judgement on a replay of this
server's answers (tests/unit/test_api_gate.py) and checks the committed record."""

from __future__ import annotations

import os

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("HARNESS_API_TEST") != "1",
        reason="opt-in: HARNESS_API_TEST=1 (one vLLM server start, 2-3 min)",
    )
]


def test_the_pinned_server_against_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ws = Workspace.default()
    got = run_gate_by_name(ws, "tiny-qwen3", "api_smoke", None, write=False)
    rec = got.record
    assert rec.outcome == "pass", rec.summary
    assert rec.controls and all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
    assert {v.comparator for v in rec.verdicts} == {
        f"api.{f}" for f in rec.extra["api"]["settings"]["facets"]
    }
