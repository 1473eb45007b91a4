"""The REAL vllm.cpp, built from its source by the harness, gated on tiny-llama.

Opt-in (``HARNESS_VLLMCPP_TEST=1``, with ``HARNESS_VLLMCPP_SRC`` naming a vllm.cpp checkout or
archive; the project's own test input is ``../shared/engines/vllm.cpp-d85906ae.tar.gz``). The first
run builds vllm.cpp into the build cache (``HARNESS_VLLMCPP_CACHE``, default ``.cache/vllmcpp``:
4.5 minutes on 2 cores here, up to ~15 under load); after that each gate takes seconds. The
committed records (reports/records/*/smoke*/…vllmcpp…) are what FEATURES.md's vllm.cpp column cites.
What must hold:

* the BF16 copy of the oracle's weights keeps near-tie parity with the float32 goldens, and the
  engine's tokenization of every prompt equals the oracle's;
* its float32 safetensors are refused in the engine's own words (its dense loader takes BF16 only);
* its OpenAI server, asked a token-id prompt, dies, and the record names the request;
* every process the harness started is gone when the gate returns.
"""

from __future__ import annotations

import os

import pytest

from harness.engines import RunnerContext, make_runner
from harness.engines.launch.procs import group_alive
from harness.engines.vllmcpp.server import VllmCppServerRunner
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.environ.get("HARNESS_VLLMCPP_TEST") != "1" or
                                 not os.environ.get("HARNESS_VLLMCPP_SRC"),
                                 reason="builds vllm.cpp from source on first use (minutes); set "
                                        "HARNESS_VLLMCPP_TEST=1 and HARNESS_VLLMCPP_SRC=<checkout or .tar.gz>")]


def test_vllmcpp_bf16_keeps_near_tie_parity_and_its_own_tokenizer_agrees(workspace: Workspace) -> None:
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllmcpp", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "tokenizer")
    assert "no logprobs" in rec.extra["capabilities"]["reasons"]["top_logprobs"]
    build = rec.candidate.environment["build"]
    assert build["source_digest"] and build["compiler"] and "build_s" in build


def test_vllmcpp_refuses_float32_weights_in_its_own_words(workspace: Workspace) -> None:
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllmcpp:dtype=float32", auto_record=False).record
    assert rec.outcome == "refused" and "expected BF16" in rec.summary


def test_vllmcpp_server_dies_on_a_token_id_prompt_and_the_record_says_which(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    workspace.runs.mkdir(parents=True, exist_ok=True)
    runner = make_runner("vllmcpp-server:prompts=auto", model, RunnerContext(run_dir=workspace.runs))
    assert isinstance(runner, VllmCppServerRunner)
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllmcpp-server:prompts=auto", runner=runner,
                           auto_record=False).record
    assert rec.outcome == "error" and "died on a token-id prompt" in rec.summary + str(rec.verdicts[0].detail)
    assert runner.server is not None and runner.server.pid is not None
    assert not group_alive(runner.server.pid), "the harness left the vllm.cpp server running"
