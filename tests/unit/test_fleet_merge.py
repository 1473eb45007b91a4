"""The merge job: shards run in their own clones, their outputs merged into a third; a shard that never
arrives, an entry that ran twice, a vacuous record and an outcome the matrix did not expect each fail
the fleet by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fleet.merge import MergeError, merge
from harness.workspace import REPO_ROOT, Workspace
from tests.unit.fleet_kit import fleet_workspace, pytest_matrix

GROUPS = """
[[group]]
name = "good"
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{good}"]

[[group]]
name = "known-finding"
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{bad}"]
expect = "fail"
because = "planted: c03 leaves the oracle's top-k"
"""


def clone(origin: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", f"file://{origin}", str(dest)], check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two shards, each run by pytest in its own clone, as two runners would."""
    root = tmp_path_factory.mktemp("fleet")
    origin = fleet_workspace(root / "origin", GROUPS).root
    out = {"origin": origin}
    for i in (1, 2):
        c = clone(origin, root / f"shard{i}")
        r = pytest_matrix(c, "--harness-device", "cpu", "--harness-shard", f"{i}/2")
        assert r.returncode == 0, r.stdout[-3000:]
        out[f"shard{i}"] = c / "reports"
    return out


def fresh(shards: dict[str, Path], tmp_path: Path) -> Workspace:
    return Workspace(clone(shards["origin"], tmp_path / "merge"))


def test_merging_every_shard_passes_and_writes_the_verdict(shards: dict[str, Path], tmp_path: Path) -> None:
    ws = fresh(shards, tmp_path)
    summary = tmp_path / "summary.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.update(HARNESS_ROOT=str(ws.root), PYTHONPATH=str(REPO_ROOT))
    r = subprocess.run([sys.executable, "-m", "harness.cli", "merge", "--matrix", "fleet.toml", "--summary",
                        str(summary), str(shards["shard1"]), str(shards["shard2"])], cwd=ws.root, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fleet PASS: 2 entries, 2 new records, 0 problem(s)" in r.stdout
    text = summary.read_text()
    assert text.startswith("## Fleet verdict: PASS")
    assert "expected fail: planted: c03 leaves" in text
    assert "## Decode" in text and "near-tie parity" in text  # the regenerated verdict table
    page = (ws.root / "FEATURES.md").read_text()
    assert "reports/records/tiny-llama/smoke/" in page


def test_a_missing_shard_fails_the_fleet_naming_its_entry(shards: dict[str, Path], tmp_path: Path) -> None:
    m = merge(fresh(shards, tmp_path), Path("fleet.toml"), [shards["shard1"]], write=False)
    assert not m.ok
    assert any("no result — its shard did not run it" in p for p in m.problems), m.problems


def test_an_entry_merged_twice_is_named(shards: dict[str, Path], tmp_path: Path) -> None:
    ws = fresh(shards, tmp_path)
    m = merge(ws, ws.root / "fleet.toml", [shards["shard1"], shards["shard1"], shards["shard2"]], write=False)
    assert any("ran 2 times" in p and "shards must be disjoint" in p for p in m.problems), m.problems


def _plant(shards: dict[str, Path], tmp_path: Path, edit) -> Path:  # noqa: ANN001
    """A copy of shard 1's artifact with its record edited by ``edit`` (a planted fault)."""
    art = tmp_path / "artifact"
    shutil.copytree(shards["shard1"], art)
    line = json.loads(next((art / "fleet").glob("results-*.jsonl")).read_text().splitlines()[0])
    p = art / Path(line["record"]).relative_to("reports")
    d = json.loads(p.read_text())
    edit(d)
    p.write_text(json.dumps(d))
    return art


def test_a_vacuous_record_fails_the_fleet_and_its_gated_row(shards: dict[str, Path], tmp_path: Path) -> None:
    def vacuous(d: dict) -> None:
        d["outcome"], d["created"] = "vacuous", "2099-01-01T00:00:00Z"  # the newest: the cell cites it
        for c in d["controls"]:
            if c["expect"] == "fail":
                c["ok"], c["got"] = False, "pass"

    art = _plant(shards, tmp_path, vacuous)
    ws = fresh(shards, tmp_path)
    m = merge(ws, ws.root / "fleet.toml", [art, shards["shard2"]], write=False)
    assert any("VACUOUS: the gate could not have failed" in p for p in m.problems), m.problems
    assert m.generated.table.cell("near-tie", "replay").state == "vacuous"
    assert any("FEATURES.md row near-tie, column replay: VACUOUS" in p for p in m.problems), m.problems


def test_an_outcome_the_matrix_did_not_expect_fails_the_fleet(shards: dict[str, Path], tmp_path: Path) -> None:
    def flip(d: dict) -> None:
        d["outcome"] = "pass" if d["outcome"] == "fail" else "fail"

    ws = fresh(shards, tmp_path)
    m = merge(ws, ws.root / "fleet.toml", [_plant(shards, tmp_path, flip), shards["shard2"]], write=False)
    assert any("expected" in p and "got" in p for p in m.problems), m.problems


def test_a_record_name_that_arrives_with_other_bytes_is_refused(shards: dict[str, Path],
                                                                tmp_path: Path) -> None:
    ws = fresh(shards, tmp_path)
    merge(ws, ws.root / "fleet.toml", [shards["shard1"]], write=False)
    art = _plant(shards, tmp_path, lambda d: d.update(summary="rewritten"))
    with pytest.raises(MergeError, match="already exists with other bytes"):
        merge(ws, ws.root / "fleet.toml", [art], write=False)
