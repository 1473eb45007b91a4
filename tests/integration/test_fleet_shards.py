"""The fleet on one machine: the plan split into 4 shards, run as 4 independent processes, each in its
own clone (as 4 runners would), and merged, gives the same FEATURES.md as one sequential run of the
same entries — and as one `pytest -n 2` run. Real transformers on the committed tiny-llama smoke
goldens (fleet_small.toml: 4 entries of a few seconds each, no vLLM start).

Records differ run to run only in their names (time, random suffix); the pages are compared with
each record link reduced to its model, suite and candidate, so every verdict, count, gap and SHA
must be the same.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.fleet.plan import make_plan
from harness.workspace import REPO_ROOT
from tests.unit.features_kit import commit, make_git_workspace

pytestmark = pytest.mark.integration

SMALL = Path(__file__).with_name("fleet_small.toml")
SPECS = ("hf", "hf:dtype=bfloat16", "hf:decode=step", "hf:dtype=bfloat16,decode=step")
CATALOG = 'title = "Features"\nintro = "the fleet proof"\n' + "".join(
    f'\n[[columns]]\nkey = "c{i}"\ntitle = "{s}"\ncandidate = "{s}"\n' for i, s in enumerate(SPECS)) + """
[[sections]]
title = "Greedy decode parity"

[[sections.rows]]
id = "greedy-near-tie"
title = "near-tie parity"
model = "tiny-llama"
suite = "smoke"
prove = ["near_tie"]

[[sections.rows]]
id = "greedy-token-exact"
title = "token-exact"
model = "tiny-llama"
suite = "smoke"
prove = ["strict"]
"""
LINK = re.compile(r"reports/records/([^/)]+)/([^/)]+)/\d{8}T\d{6}Z_[0-9a-f]{10}_(.+?)_[0-9a-f]{6}\.json")


CELL = re.compile(r"(?<!\\)\|")
REF_DEF = re.compile(r"^\[(r\d+)\]: (\S+)$", re.M)
REF_USE = re.compile(r"\]\[(r\d+)\]")


def normalized(page: str) -> str:
    """Record links reduced to model/suite/<candidate>; the oracle column (the last) cites whichever
    record of the row is newest, which depends on the order the entries happened to finish in."""
    refs = dict(REF_DEF.findall(page))  # a cell cites its record by reference: put the target back in
    page = REF_USE.sub(lambda m: f"]({refs[m.group(1)]})" if m.group(1) in refs else m.group(0), page)
    page = REF_DEF.sub("", page)
    out = []
    for line in LINK.sub(r"reports/records/\1/\2/<\3>", page).splitlines():
        cells = CELL.split(line)
        if line.startswith("| ") and len(cells) > 3:
            cells[-2] = re.sub(r"<[^>]+>", "<newest>", cells[-2])
            line = "|".join(cells)
        out.append(line)
    return "\n".join(out)


def env_for(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env.update(HARNESS_ROOT=str(root), PYTHONPATH=str(REPO_ROOT))
    return env


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--harness-matrix", "fleet.toml",
            "--harness-device", "cpu", "--parity-no-record", *args]


def harness(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=root, env=env_for(root),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet") / "origin"
    make_git_workspace(root, catalog=CATALOG)
    shutil.copy(SMALL, root / "fleet.toml")
    commit(root, "the small matrix")
    return root


def clone(origin: Path, name: str) -> Path:
    dest = origin.parent / name
    subprocess.run(["git", "clone", "-q", f"file://{origin}", str(dest)], check=True, capture_output=True)
    return dest


def run_alone(origin: Path, name: str, *args: str) -> tuple[Path, float]:
    root = clone(origin, name)
    t0 = time.perf_counter()
    r = subprocess.run(pytest_cmd(*args), cwd=root, env=env_for(root), capture_output=True, text=True,
                       timeout=900)
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return root, wall


def test_four_shards_merged_equal_one_sequential_run(origin: Path, tmp_path: Path) -> None:
    plan = make_plan(origin / "fleet.toml", origin)
    assert plan.shards == {"cpu": 4}
    ids = [{p.entry.id for p in plan.entries("cpu", f"{i}/4")} for i in range(1, 5)]
    assert all(ids) and sum(map(len, ids)) == 4 == len(set().union(*ids))

    # 4 runners: 4 clones, 4 processes at once
    shards = [clone(origin, f"shard{i}") for i in range(1, 5)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(pytest_cmd("--harness-shard", f"{i}/4", f"--junitxml={root / 'junit.xml'}"),
                              cwd=root, env=env_for(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i, root in enumerate(shards, 1)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    sharded_wall = time.perf_counter() - t0
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    for i, root in enumerate(shards):
        names = {c.get("name") for c in ET.parse(root / "junit.xml").getroot().iter("testcase")}
        assert names == ids[i], f"shard {i + 1}/4 ran {names}, the plan says {ids[i]}"

    merged = clone(origin, "merged")
    r = harness(merged, "merge", "--matrix", "fleet.toml", "--summary", str(tmp_path / "summary.md"),
                *(str(s / "reports") for s in shards))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fleet PASS: 4 entries, 4 new records" in r.stdout

    seq, seq_wall = run_alone(origin, "sequential")
    xd, xd_wall = run_alone(origin, "xdist", "-n", "2", f"--junitxml={origin.parent / 'xdist.xml'}")
    assert len(list(ET.parse(origin.parent / "xdist.xml").getroot().iter("testcase"))) == 4
    for root in (seq, xd):
        r = harness(root, "features")
        assert r.returncode == 0, r.stdout + r.stderr

    want = normalized((seq / "FEATURES.md").read_text())
    assert normalized((merged / "FEATURES.md").read_text()) == want
    assert normalized((xd / "FEATURES.md").read_text()) == want
    # not vacuously equal: every column of the gated row (and the oracle's) is a pass citing a record
    row = next(line for line in want.splitlines() if line.startswith("| `greedy-near-tie` |"))
    assert row.count("✅") == len(SPECS) + 1 and row.count("<hf") == len(SPECS), row
    print(f"\nsmall matrix (4 entries): sequential {seq_wall:.1f} s, -n 2 {xd_wall:.1f} s, "
          f"4 shard processes at once {sharded_wall:.1f} s")
