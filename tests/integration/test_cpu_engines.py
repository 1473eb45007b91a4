"""The REAL PyPI engines (CTranslate2, ONNX Runtime GenAI, OpenVINO GenAI, mistral.rs), each in its
own venv, on tiny-llama converted from the oracle's weights.

Opt-in: ``pytest -m cpu_engines`` (deselected by default). The first run installs each engine's
venv (2-14 minutes each on a loaded 2-core machine, 0.2-1.5 GB; ``HARNESS_VENVS`` shares them
between checkouts) and converts tiny-llama once per engine (1-3 minutes); after that each gate takes
seconds. What must hold, per engine:

* on the same float32 weights the engine's greedy tokens equal vLLM's on every smoke case (strict
  8/8), every planted mutation bites, and where the engine returns logprobs its every choice is its
  own top-1 (greedy 8/8);
* token-id prompts where the engine takes them; mistral.rs (text only) tokenizes every prompt into
  the oracle's ids (tokenizer 8/8);
* what the engine cannot return is declared, not faked: OpenVINO GenAI has no top-k logprobs;
* a family the converter does not know is refused with the converter's words, not a crash;
* the conversion is cached by model digest: a second gate converts nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.engines import RunnerContext, make_runner
from harness.engines.pip.runner import PipEngineRunner
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engines]


def gate(ws: Workspace, model: str, spec: str) -> tuple[PipEngineRunner, Any]:
    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = make_runner(spec, resolve_model(model, ws), RunnerContext(run_dir=ws.runs))
    assert isinstance(runner, PipEngineRunner)
    rec = run_gate_by_name(ws, model, "smoke", spec, runner=runner, auto_record=False).record
    return runner, rec


def statuses(rec: Any, comparator: str) -> list[str]:
    return [v.status for v in rec.verdicts if v.comparator == comparator]


@pytest.mark.parametrize("spec", ["ct2", "ortgenai", "openvino", "mistralrs"])
def test_the_engine_on_the_oracles_weights_decodes_vllms_tokens(workspace: Workspace, spec: str) -> None:
    runner, rec = gate(workspace, "tiny-llama", spec)
    assert rec.outcome == "pass", rec.summary
    assert statuses(rec, "strict") == ["pass"] * 8, rec.summary
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
    caps = rec.extra["capabilities"]
    if spec == "openvino":
        assert not caps["top_logprobs"] and "single top logprob" in caps["reasons"]["top_logprobs"]
        assert statuses(rec, "greedy") == []
    else:
        assert statuses(rec, "greedy") == ["pass"] * 8
    if spec == "mistralrs":
        assert caps["prompts"] == "text" and statuses(rec, "tokenizer") == ["pass"] * 8
    else:
        assert caps["prompts"] == "ids" and statuses(rec, "tokenizer") == []
    env = rec.candidate.environment
    assert env["venv"]["install_s"] > 0
    if spec != "mistralrs":
        assert env["converted"]["model_digest"] == resolve_model("tiny-llama", workspace).digest
        again, _ = gate(workspace, "tiny-llama", spec)
        assert again.converted is not None and again.converted.cached


@pytest.mark.parametrize("spec, model, words", [("ct2", "tiny-qwen3-moe", "no loader for Qwen3MoeConfig"),
                                                ("ortgenai", "tiny-gpt2", "not currently supported")])
def test_a_family_the_converter_does_not_know_is_refused_in_its_words(
        workspace: Workspace, spec: str, model: str, words: str) -> None:
    _, rec = gate(workspace, model, spec)
    assert rec.outcome == "refused", rec.summary
    assert words in rec.extra["engine_refused"]
