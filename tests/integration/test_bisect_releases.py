"""Real vLLM releases, opt-in: a bisect across releases of the KV round trip through ExampleConnector
(its venvs installed on first use, a vLLM start per runnable step), and a re-pin what-if toward the
pin's predecessor. Minutes and gigabytes: ``HARNESS_BISECT_RELEASES_TEST=1 pytest -m bisect_releases``.

The full bisect (0.8.5 -> 0.26.0) is run by hand and its records are committed (docs/bisect.md).
Here a narrow range shows the same facts: the release before the connector hooks the gate needs is
skipped with its reason, the nearest release that can run becomes the reference and runs the
connector under its old name (SharedStorageConnector), and the lookup bug is there.
"""

from __future__ import annotations

import os
import shutil

import pytest

from harness.cli import main
from harness.records import iter_record_paths, load_record
from harness.workspace import REPO_ROOT, Workspace

pytestmark = [pytest.mark.integration, pytest.mark.bisect_releases,
              pytest.mark.skipif(os.environ.get("HARNESS_BISECT_RELEASES_TEST") != "1",
                                 reason="installs vLLM releases and starts engines in them; set "
                                        "HARNESS_BISECT_RELEASES_TEST=1 and select -m bisect_releases")]

GOOD, BAD = os.environ.get("HARNESS_BISECT_RANGE", "0.11.0 0.12.0").split()


def test_a_bisect_over_real_releases_skips_what_cannot_run_and_finds_the_bug_older(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    assert main(["bisect", "--model", "tiny-llama", "--suite", "kv_roundtrip", "--connector", "ExampleConnector",
                 "--good", GOOD, "--bad", BAD, "--only", "n_c_plus_1"]) == 0
    recs = [load_record(p) for p in iter_record_paths(workspace.records)]
    (bisect,) = [r for r in recs if r.kind == "bisect"]
    b = bisect.extra["bisect"]
    steps = {s["point"]: s for s in b["steps"]}
    assert steps[GOOD]["state"] == "skip"
    assert "lacks KVConnectorBase_V1.get_block_ids_with_load_errors" in steps[GOOD]["reason"]
    ref = steps[b["reference"]]
    assert ref["table"]["n_c_plus_1/kv_hits"] == "fail"  # stored, never found: the lookup bug
    step = load_record(workspace.root / ref["record"])
    assert any("SharedStorageConnector" in n for n in step.extra["compat"]["notes"])
    assert b["result"]["kind"] == "no_change"
    assert {r.id for r in recs} >= {s["record_id"] for s in b["steps"] if s["record_id"]}


def test_a_re_pin_what_if_changes_nothing(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    for f in ("requirements", "features.toml"):
        src = REPO_ROOT / f
        (shutil.copytree if src.is_dir() else shutil.copy)(src, workspace.root / f)
    before = {p: p.read_bytes() for p in workspace.goldens.rglob("*") if p.is_file()}
    pin = (workspace.root / "requirements" / "oracle.txt").read_text()
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    release = os.environ.get("HARNESS_REPIN_RELEASE", "0.31.0")
    assert main(["repin", "--vllm", release, "--model", "tiny-llama", "--suite", "smoke"]) == 0
    assert {p: p.read_bytes() for p in workspace.goldens.rglob("*") if p.is_file()} == before
    assert (workspace.root / "requirements" / "oracle.txt").read_text() == pin
    (rec,) = [load_record(p) for p in iter_record_paths(workspace.records)]
    assert rec.kind == "repin" and rec.extra["repin"]["what_if"] and rec.candidate.version == release
    assert {v.comparator for v in rec.verdicts} == {"strict", "near_tie", "kl"}
