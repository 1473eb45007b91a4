"""The cmd: example engine of docs/engines.md (examples/cmd_engine.py, transformers) passes the smoke gate."""

from __future__ import annotations

import sys

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration


def test_the_example_cmd_engine_passes_smoke(workspace: Workspace) -> None:
    engine = REPO_ROOT / "examples" / "cmd_engine.py"
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", f"cmd:{sys.executable} {engine} {{model}}",
                   auto_record=False)
    rec = res.record
    assert rec.outcome == "pass", rec.summary
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "near_tie")
    assert rec.extra["capabilities"]["top_logprobs"] and rec.extra["capabilities"]["logprobs_served"] == 5
    assert rec.extra["speed"]["candidate"]["method"].startswith("subprocess")
    assert rec.candidate.environment["returncode"] == 0
