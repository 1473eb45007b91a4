"""The cmd: runner: a good engine passes; every kind of bad output becomes an ``error`` verdict
naming the case and the stdout line, never a crash; a hung engine and its children are killed.

The engines here replay the committed goldens (tests/unit/cmd_replay_engine.py) so they run in a
blink; the real transformers example (examples/cmd_engine.py) is in tests/integration.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from harness.api import EngineRefused
from harness.engines.cmd.runner import CmdRunner
from harness.engines.launch.procs import pid_running
from harness.goldens import Golden, golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import Record, load_record, portable_record
from harness.workspace import Workspace

ENGINE = Path(__file__).with_name("cmd_replay_engine.py")


def golden(ws: Workspace) -> Golden:
    return read_golden(golden_dir(ws.goldens, resolve_model("tiny-llama", ws), "smoke"),
                       model_name="tiny-llama", suite_name="smoke")


@pytest.fixture
def answers(workspace: Workspace, tmp_path: Path) -> Path:
    g = golden(workspace)
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({cid: {
        "token_ids": list(o.token_ids), "text": o.text, "finish_reason": o.finish_reason,
        "top_ids": o.top_ids.tolist(), "top_logprobs": o.top_logprobs.tolist(),  # type: ignore[union-attr]
        "chosen_logprobs": o.chosen_logprobs.tolist()}  # type: ignore[union-attr]
        for cid, o in g.outputs.items()}))
    return path


def spec(answers: Path, fault: str, extra: str = "") -> str:
    return f"cmd:{sys.executable} {ENGINE} {answers} {fault}{extra}"


def gate(ws: Workspace, candidate: str) -> Record:
    res = run_gate_by_name(ws, "tiny-llama", "smoke", candidate, auto_record=False)
    assert load_record(res.path) == portable_record(res.record, ws.root)  # always written, portably
    return res.record


def near_tie(rec: Record) -> dict[str, object]:
    return {v.case_id: v for v in rec.verdicts if v.comparator == "near_tie"}


@pytest.mark.parametrize("extra", ["", " {workload}"])
def test_a_correct_engine_passes_through_stdin_or_a_workload_file(workspace: Workspace, answers: Path,
                                                                  extra: str) -> None:
    rec = gate(workspace, spec(answers, "ok", extra))
    assert rec.outcome == "pass", rec.summary
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "strict")
    assert rec.candidate.engine == "cmd" and rec.candidate.environment["returncode"] == 0
    assert rec.extra["speed"]["candidate"]["output_tokens"] == 256


@pytest.mark.parametrize("fault, case, needle", [
    ("not-json", "c03", "no stdout line for case c03; stdout line 3 is not JSON: 'garbage <not json>'"),
    ("missing", "c05", "no stdout line for case c05"),
    ("short", "c02", "stdout line 2 (case c02): wrong length: 31 top_ids rows and 32 top_logprobs rows "
                     "for 32 token_ids"),
    ("twice", "c04", "case c04 answered twice (again on stdout line 5)"),
    ("no-ids", "c06", "stdout line 6 (case c06): missing field 'token_ids'"),
    ("reported", "c07", "the engine reported: CUDA out of memory (planted)"),
])
def test_bad_output_is_an_error_naming_the_case_and_the_line(workspace: Workspace, answers: Path,
                                                             fault: str, case: str, needle: str) -> None:
    rec = gate(workspace, spec(answers, fault))
    v = near_tie(rec)
    assert v[case].status == "error", v[case].summary  # type: ignore[attr-defined]
    assert needle in v[case].detail, v[case].detail  # type: ignore[attr-defined]
    others = {c for c, x in v.items() if c != case}
    assert all(v[c].status == "pass" for c in others), rec.summary  # type: ignore[attr-defined]
    assert rec.outcome == "error"


def test_a_crashing_engine_keeps_its_answers_and_names_the_exit_and_stderr(workspace: Workspace,
                                                                           answers: Path) -> None:
    rec = gate(workspace, spec(answers, "crash"))
    v = near_tie(rec)
    assert [c for c, x in v.items() if x.status == "pass"] == ["c01", "c02", "c03", "c04"]  # type: ignore[attr-defined]
    detail = v["c05"].detail  # type: ignore[attr-defined]
    assert "no stdout line for case c05 (the command exited with 1" in detail
    assert "out of cheese" in detail


def test_an_engine_without_logprobs_is_judged_on_ids(workspace: Workspace, answers: Path) -> None:
    rec = gate(workspace, spec(answers, "no-logprobs"))
    assert rec.outcome == "pass"
    assert not rec.extra["capabilities"]["top_logprobs"]
    assert rec.extra["impossible"] == {}  # smoke's strict and near_tie only need ids


def test_a_hung_engine_and_its_children_are_killed(workspace: Workspace, answers: Path) -> None:
    g = golden(workspace)
    runner = CmdRunner(f"{sys.executable} {ENGINE} {answers} hang", resolve_model("tiny-llama", workspace),
                       run_dir=workspace.runs, timeout_s=3)
    workspace.runs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    outs = runner.run(g.cases, g.sampling)
    assert time.perf_counter() - t0 < 20
    assert [o.error is None for o in outs] == [True, True] + [False] * 6
    assert "did not finish within 3 s and was killed" in (outs[2].error or "")
    assert runner.log_path is not None
    child = int(re.search(r"child (\d+)", runner.log_path.read_text()).group(1))  # type: ignore[union-attr]
    assert not pid_running(child)


def test_an_empty_or_missing_command_is_refused_or_an_error(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    with pytest.raises(EngineRefused, match="give a command"):
        CmdRunner("", model)
    rec = gate(workspace, "cmd:/nonexistent/engine --flag")
    assert rec.outcome == "error"
    assert "cannot start '/nonexistent/engine'" in rec.verdicts[0].detail
