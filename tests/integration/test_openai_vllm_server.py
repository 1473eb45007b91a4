"""A REAL vLLM OpenAI server on loopback, gated on smoke: same verdicts as the offline engine.

Two engine starts (≈1.5 min each on 2 cores): the offline pinned vLLM at c4 (the ``vllm``
candidate, whose timing is also the oracle's speed for this test module; the session's engine pool
serves it when its engine is up), then ONE server that the harness starts itself (``vllm-server``),
gates over HTTP at c4, and must leave stopped.
"""

from __future__ import annotations

import pytest

from harness.engines import RunnerContext, make_runner
from harness.engines.launch.procs import group_alive
from harness.engines.vllm.runner import VLLMRunner
from harness.engines.vllm.server import VLLMServerRunner
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.workspace import Workspace
from tests.pins import PIN

pytestmark = pytest.mark.integration


def test_a_real_vllm_server_gives_the_offline_verdicts_and_is_stopped(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    workspace.runs.mkdir(parents=True, exist_ok=True)

    offline_runner = make_runner("vllm", model, RunnerContext(run_dir=workspace.runs, concurrency=4))
    assert isinstance(offline_runner, VLLMRunner)
    offline = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllm", runner=offline_runner, concurrency=4,
                       auto_record=False).record
    assert offline.outcome == "pass", offline.summary
    assert offline_runner.speed is not None and offline_runner.speed.concurrency == 4

    runner = make_runner("vllm-server", model, RunnerContext(run_dir=workspace.runs, concurrency=4))
    assert isinstance(runner, VLLMServerRunner)
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllm-server", runner=runner, concurrency=4,
                   speed=offline_runner.facts().speed, auto_record=False)
    assert runner.server is not None and runner.server.pid is not None
    assert not group_alive(runner.server.pid), "the harness left the vLLM server running"

    rec = load_record(res.path)
    statuses = {(v.comparator, v.case_id): v.status for v in rec.verdicts}
    assert statuses == {(v.comparator, v.case_id): v.status for v in offline.verdicts}, rec.summary
    assert rec.outcome == "pass"
    assert rec.candidate.engine == "vllm" and rec.candidate.version == PIN.version
    assert "127.0.0.1" in rec.candidate.environment["base_url"]
    caps = rec.extra["capabilities"]
    assert caps["token_ids"] and caps["top_logprobs"] and caps["logprobs_served"] == 5
    assert rec.candidate.environment["protocol"]["ids_from"] == "token_ids"

    speed = rec.extra["speed"]
    assert speed["candidate"]["method"] == "http-stream" and speed["oracle"]["method"] == "vllm-offline"
    assert speed["candidate"]["concurrency"] == speed["oracle"]["concurrency"] == 4
    assert speed["statement"].startswith("candidate/oracle = ")
    assert "x output tok/s at c4" in speed["statement"]
    assert speed["candidate"]["ttft_ms"]["p50"] > 0
    assert rec.timings["candidate_server_start_s"] > 0
