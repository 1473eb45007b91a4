"""The REAL llama.cpp server (llama-cpp-python), started and stopped by the harness, on tiny-llama.

Opt-in (``HARNESS_LLAMACPP_TEST=1``): the first run builds llama.cpp from source into
``.venvs/llama-cpp-python-<version>`` (about 8 minutes on 2 cores; ``HARNESS_VENVS`` shares it
between checkouts); after that each gate is a few seconds. What must hold:

* the F32 GGUF the harness writes tokenizes every smoke prompt into the oracle's ids (tokenizer
  verdicts pass), and llama.cpp decodes greedily with the harness's request (greedy verdicts pass);
* on the same weights, llama.cpp's tokens equal vLLM's up to the first token whose text several ids
  share (tiny-llama's byte tokens): strict never *fails*, it passes or stops at an unmapped token;
* left to its defaults (``body.repeat_penalty=`` sends none), the server does not decode greedily,
  and the greedy verdict names ``repeat_penalty`` and its default 1.1;
* the server's process group is gone when the gate returns.
"""

from __future__ import annotations

import os

import pytest

from harness.engines import RunnerContext, make_runner
from harness.engines.launch.procs import group_alive
from harness.engines.llamacpp.runner import LlamaCppRunner
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.environ.get("HARNESS_LLAMACPP_TEST") != "1",
                                 reason="builds llama.cpp from source on first use (minutes); set "
                                        "HARNESS_LLAMACPP_TEST=1 to run the real llama.cpp server")]


def gate(ws: Workspace, spec: str) -> tuple[LlamaCppRunner, object]:
    model = resolve_model("tiny-llama", ws)
    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = make_runner(spec, model, RunnerContext(run_dir=ws.runs))
    assert isinstance(runner, LlamaCppRunner)
    rec = run_gate_by_name(ws, "tiny-llama", "smoke", spec, runner=runner, auto_record=False).record
    assert runner.server is not None and runner.server.pid is not None
    assert not group_alive(runner.server.pid), "the harness left the llama.cpp server running"
    return runner, rec


def test_llamacpp_on_the_oracles_weights_checks_its_tokenizer_and_decodes_greedily(workspace: Workspace) -> None:
    runner, rec = gate(workspace, "llamacpp")
    by = {(v.comparator, v.case_id): v for v in rec.verdicts}  # type: ignore[attr-defined]
    cases = sorted({cid for _, cid in by})
    assert all(by[("tokenizer", c)].status == "pass" for c in cases), rec.summary  # type: ignore[attr-defined]
    assert all(by[("greedy", c)].status == "pass" for c in cases)
    for c in cases:
        v = by[("strict", c)]
        assert v.status == "pass" or v.evidence.get("kind") == "unmapped", v.detail
    caps = rec.extra["capabilities"]  # type: ignore[attr-defined]
    assert caps["prompts"] == "text" and caps["tokenized_by"] == "POST /extras/tokenize"
    assert caps["request"]["repeat_penalty"] == 1.0
    env = rec.candidate.environment  # type: ignore[attr-defined]
    assert env["gguf"]["kind"] == "f32" and env["venv"]["install_s"] > 0
    assert rec.candidate.settings["gguf"] == "f32"  # type: ignore[attr-defined]
    assert runner.timings["server_start_s"] > 0


def test_left_to_its_defaults_the_server_does_not_decode_greedily(workspace: Workspace) -> None:
    _, rec = gate(workspace, "llamacpp:body.repeat_penalty=")
    greedy = [v for v in rec.verdicts if v.comparator == "greedy"]  # type: ignore[attr-defined]
    bad = [v for v in greedy if v.status == "fail"]
    assert bad, "a repetition penalty of 1.1 must move some greedy choice of tiny-llama's smoke cases"
    assert "repeat_penalty (server default 1.1)" in bad[0].detail
    assert rec.outcome == "fail"  # type: ignore[attr-defined]
