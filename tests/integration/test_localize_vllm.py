"""Localization with the REAL pinned vLLM as the oracle: one engine start (≈1 min on 2 free cores)
that taps its worker, on tiny-llama.

* the default test: a planted copy gated with transformers (cheap) fails and is localized to the
  planted layer against vLLM's own tensors; the unperturbed model's tensors agree with vLLM's to
  NMSE <= 1e-10 on every tensor of every case (the proof that both engines' definitions of the
  stream are the same), the oracle's side served from the cache the first localization filled.
* opt-in (``-m localize_sweep`` with ``HARNESS_LOCALIZE_SWEEP=1``): ``vllm:weights=`` (three more
  engine starts) and a planted layer deep in smollm2-135m. Their records are committed from runs by
  hand (docs/localize.md).
"""

from __future__ import annotations

import os

import pytest

from harness.cli import main
from harness.commands.localize import localize
from harness.kinds.localize.kind import divergences
from harness.kinds.localize.plant import plant
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import iter_record_paths, load_record
from harness.workspace import Workspace
from tests.pins import PIN

pytestmark = pytest.mark.integration

AGREE = 1e-10
"""transformers and the pinned vLLM on CPU, float32: measured ~1e-13 on every tensor of tiny-llama."""


def test_a_planted_layer_is_localized_against_vllms_own_tensors(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    copy = plant(resolve_model("tiny-llama", workspace), workspace.root / "planted", layer=1, sub="mlp",
                 relative=1e-1).path
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    assert main(["gate", "--model", "tiny-llama", "--candidate", f"hf:weights={copy}"]) == 1
    out = capsys.readouterr().out
    recs = {r.kind: r for r in (load_record(p) for p in iter_record_paths(workspace.records))}
    loc = recs["localize"]
    assert loc.outcome == "pass", loc.summary
    assert {v.case_id for v in loc.verdicts} == set(divergences(recs["parity"]))
    for v in loc.verdicts:
        assert v.evidence["parts_at"] == "layer.1.mlp" and v.evidence["before_max"] <= AGREE, v.detail
        assert f"{v.case_id}: parts at layer 1 mlp" in out
    assert {v.evidence["oracle_from"] for v in loc.verdicts} == {"engine"}
    assert loc.extra["localize"]["oracle_capture"]["version"] == PIN.version
    assert all(c.ok for c in loc.controls)

    # the unperturbed model, every case over its whole golden sequence: vLLM's cached tensors
    gate = run_gate_by_name(workspace, "tiny-llama", "smoke", "hf", auto_record=False)
    same = localize(workspace, gate.record, str(gate.path), cases="all").record
    assert len(same.verdicts) == 8 and same.outcome == "pass"
    for v in same.verdicts:
        worst = max(s["nmse"] for s in v.evidence["steps"])
        assert v.evidence["parts_at"] is None and worst <= AGREE, v.detail
        assert v.evidence["oracle_from"] == "cache"


@pytest.mark.localize_sweep
@pytest.mark.skipif(os.environ.get("HARNESS_LOCALIZE_SWEEP") != "1",
                    reason="starts vLLM three more times and builds smollm2-135m; set "
                           "HARNESS_LOCALIZE_SWEEP=1 and select -m localize_sweep")
def test_vllm_weights_and_a_deep_layer_of_smollm2_are_localized(workspace: Workspace) -> None:
    from harness.commands.localize_sweep import sweep

    points = sweep(workspace, "tiny-llama", ["vllm"], [0], ["mlp"], [1e-1])
    points += sweep(workspace, "smollm2-135m", ["hf"], [24], ["mlp"], [1e-1])
    assert all(p.ok for p in points), [p.line() for p in points]
