"""The RL weight-sync gate on the real pinned vLLM, at test scale (suite rl_small on tiny-llama): one
engine start for the clean run, one for a planted fault. The full suite, every control and the other
models are committed records (make rl MODEL=… CONTROL=all). Opt-in (-m rl_sync): two engine starts
take minutes on a 2-core host."""

from __future__ import annotations

import shutil

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import REPO_ROOT, Workspace

pytestmark = [pytest.mark.integration, pytest.mark.rl_sync]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("rl")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


def test_clean_run_passes_through_vllms_own_update_path(ws: Workspace) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "rl_small", "vllm").record
    assert rec.outcome == "pass", rec.summary
    rl = rec.extra["rl"]
    assert rl["backend"] == "harness_files" and rec.candidate.settings["weight_transfer_backend"] == "harness_files"
    steps = rl["steps"]
    assert [s["weight_version"] for s in steps] == [str(i) for i in range(len(steps))]
    # every update went through the backend, whole, and the cache was reset after it
    assert all(s["received"] and s["received"][0]["names"] > 0 for s in steps[1:])
    assert all(s["reset_prefix_cache"] for s in steps)
    # vLLM's checksum hashes nothing for the packed linear layers on a CPU; the tap read them
    assert "vacuous" in set(steps[0]["checksums"].values())
    weights = [v for v in rec.verdicts if v.comparator == "rl_weights"]
    assert weights and all(v.evidence["read"]["kernel"] > 0 for v in weights)
    assert all(c.ok for c in rec.controls)


def test_a_dropped_tensor_is_named(ws: Workspace) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "rl_small", "vllm", options={"control": "drop_tensor"}).record
    assert rec.outcome == "fail" and rec.candidate.name == "vllm+drop_tensor"
    caught = [v for v in rec.verdicts if v.comparator == "rl_control"]
    assert caught and caught[0].status == "pass", caught
    assert "lm_head.weight" in caught[0].summary
