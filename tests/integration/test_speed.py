"""harness speed: c1/c4 beside the pinned oracle, one engine start per side (two vLLM starts; none
when the session's engine pool has tiny-llama's engine up: both sides are that configuration)."""

from __future__ import annotations

import json

import pytest

from harness.speedrun import run_speed
from harness.workspace import Workspace

pytestmark = pytest.mark.integration


def test_speed_levels_are_measured_on_both_sides_in_one_start_each(workspace: Workspace) -> None:
    run = run_speed(workspace, "tiny-llama", "smoke", "vllm", levels=(1, 4))
    data = json.loads(run.path.read_text())
    assert data == run.data and data["kind"] == "speed" and data["levels"] == [1, 4]
    assert data["how"] == {"candidate": "every level in one engine start",
                           "oracle": "every level in one engine start"}
    assert [r["concurrency"] for r in data["rows"]] == [1, 4]
    for r in data["rows"]:
        assert r["candidate"]["concurrency"] == r["oracle"]["concurrency"] == r["concurrency"]
        assert r["candidate"]["output_tokens"] == r["oracle"]["output_tokens"] > 0
        assert r["statement"].startswith("candidate/oracle = ") and f"at c{r['concurrency']}" in r["statement"]
        assert r["ratio"]["output_tok_s"] > 0 and r["candidate"]["ttft_ms"]["p50"] > 0
