"""The sampling kind end to end through the pipeline, with a synthetic oracle and planted samplers
as the candidate engine (the real engines: tests/integration/test_sampling.py and the records)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.features.cells import judge_record
from harness.kinds.registered import KINDS
from harness.kinds.sampling.doubles import FAULTS, Double
from harness.kinds.sampling.plan import make_plan
from harness.kinds.sampling.settings import gate_settings
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.suites import SuiteError, find_suite, load_suite
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN
from tests.unit import sampling_kit as kit

PROVENANCE = {
    "spec": "vllm",
    "engine": "vllm",
    "version": PIN.version,
    "pin": PIN.spec,
    "rows": "synthetic (unit test)",
}


def _suite(ws: Workspace) -> None:
    """sampling_small, sized for the synthetic logits: both aligned positions, a nucleus whose first
    excluded token carries enough mass for "one token too many" to be seen; 60 repetitions of the
    correct double (the records run 200)."""
    p = ws.suites / "sampling_small.toml"
    p.write_text(
        p.read_text()
        .replace("positions_per_case = 1", "positions_per_case = 2")
        .replace("control_repetitions = 200", "control_repetitions = 60")
        .replace('id = "p08"\nparam = "top_p"\ntop_p = 0.8', 'id = "p08"\nparam = "top_p"\ntop_p = 0.5')
    )


def _run(ws: Workspace, traits=None, fault=None, **kw):
    _suite(ws)
    rows = kit.oracle(2, vocab=512, spread=0.7)
    traits = traits or kit.traits()
    plan = make_plan(
        rows, gate_settings(find_suite(ws.suites, "sampling_small")), traits.chain, traits.unsupported
    )
    runner = Double(plan, traits, fault, **kw)
    return run_gate_by_name(
        ws, "tiny-llama", "sampling_small", "vllm", runner=runner, options={"oracle": (rows, PROVENANCE)}
    )


def test_a_correct_sampler_passes_with_every_control_biting(workspace: Workspace) -> None:
    res = _run(workspace)
    rec = load_record(res.path)
    assert rec.kind == "sampling" and rec.outcome == "pass", rec.summary
    names = {v.comparator for v in rec.verdicts}
    assert {
        "sampling.temperature",
        "sampling.top_p",
        "sampling.order",
        "sampling.presence_penalty",
        "sampling.seed",
        "sampling.logprobs",
    } <= names
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
    fails = {c.comparator for c in rec.controls if c.expect == "fail"}
    assert set(rec.gates) <= fails  # every gated verdict has a must-fail control
    s = rec.extra["sampling"]
    assert s["chain"]["name"] == "vllm" and s["budget"]["draws"] > 0
    assert s["false_positive"]["repetitions"] == 60 and s["planted"]
    assert rec.oracle["rows"] == "synthetic (unit test)"
    assert KINDS.get("sampling").stale is not None
    assert judge_record(rec, ["sampling.top_p"])[0] == "pass"


def test_a_planted_fault_fails_the_record(workspace: Workspace) -> None:
    top_p = next(f for f in FAULTS if "top-p" in f.name)
    rec = load_record(_run(workspace, fault=top_p).path)
    assert rec.outcome == "fail" and "top_p" in rec.summary.partition("FAIL ")[2].split(";")[0]
    state, text = judge_record(rec, ["sampling.top_p"])
    # a parameter some of whose tests reject is a gated failure of the record; its FEATURES cell is
    # partial (the generic cell rule) when other tests of the same parameter passed, and names them
    assert state in ("fail", "partial") and "sampling.top_p" in text, (state, text)


def test_a_parameter_the_engine_lacks_is_refused_and_not_gated(workspace: Workspace) -> None:
    hf = kit.traits("transformers", "processed_logprobs", "call")
    hf = replace(hf, unsupported={"presence_penalty": "transformers' generate has no presence penalty"})
    rec = load_record(_run(workspace, hf).path)
    assert rec.outcome == "pass", rec.summary
    pres = [v for v in rec.verdicts if v.comparator == "sampling.presence_penalty"]
    assert pres and all(v.status == "refused" for v in pres)
    assert "sampling.presence_penalty" not in rec.gates
    assert judge_record(rec, ["sampling.presence_penalty"])[0] == "refused"
    alone = next(v for v in rec.verdicts if v.comparator == "sampling.seed" and v.case_id == "alone")
    assert alone.status == "skip" and "not promised" in alone.summary
    # a lane the engine never promised is no gap in its FEATURES cell: the repeat lane decides it
    assert judge_record(rec, ["sampling.seed"]) == ("pass", "sampling.seed 1/1")


def test_the_sampling_table_is_checked_naming_file_table_and_key(tmp_path: Path) -> None:
    src = (REPO_ROOT / "suites" / "sampling_small.toml").read_text()
    for bad, want in (
        (
            "top_p = 0.8\n",
            "top_pp = 0.8\n",
        ),
        ("max_draws = 1500", "max_draws = 5"),
        ('param = "top_k"', 'param = "top_kk"'),
        ("alpha = 0.01", "alpha = 0.7"),
    ):
        p = tmp_path / "sampling_small.toml"
        p.write_text(src.replace(bad, want, 1))
        with pytest.raises(SuiteError) as e:
            gate_settings(load_suite(p))
        assert str(p) in str(e.value), e.value
    p.write_text(src.replace("top_p = 0.8\n", "top_pp = 0.8\n", 1))
    with pytest.raises(
        SuiteError, match=r"\[sampling_gate\.settings\[2\]\]\.top_pp: unknown key 'top_pp'\. Did you mean 'top_p'"
    ):
        gate_settings(load_suite(p))
    p.write_text(src.replace('id = "k5"\nparam = "top_k"\ntop_k = 5', 'id = "k5"\nparam = "top_k"'))
    with pytest.raises(SuiteError, match="leaves top_k at its default"):
        gate_settings(load_suite(p))
