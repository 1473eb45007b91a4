"""Shallow clones: "not an ancestor" and "history not available here" are different answers.

Real clones of a throwaway repository (`git clone --depth 1 file://…` and a complete clone), never
a simulated git.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.features import generate, tracked_records, write_pages
from harness.staleness import NoAnswer, history_missing, is_ancestor, is_shallow
from harness.workspace import REPO_ROOT, Workspace
from tests.unit.child_pytest import NO_HYPOTHESIS
from tests.unit.features_kit import commit, git, make_git_workspace, make_record


@pytest.fixture
def origin(tmp_path: Path) -> dict[str, str]:
    """main: W (workspace) -> R (a record made on W, committed) -> P (pages generated, committed),
    and a side branch S off W that main never merged."""
    ws = make_git_workspace(tmp_path / "origin")
    w = git(ws.root, "rev-parse", "HEAD")
    git(ws.root, "checkout", "-q", "-b", "side")
    s = commit(ws.root, "S on a side branch", touch="side.txt")
    git(ws.root, "checkout", "-q", "main")
    make_record(ws, harness_sha=w)
    r = commit(ws.root, "R: a record")
    write_pages(ws, generate(ws, paths=tracked_records(ws)))
    p = commit(ws.root, "P: pages")
    return {"root": str(ws.root), "w": w, "s": s, "r": r, "p": p}


def clone(origin: dict[str, str], dest: Path, *depth: str) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-local", *depth, f"file://{origin['root']}", str(dest)],
                   check=True, capture_output=True)
    return dest


def test_a_shallow_clone_says_it_cannot_check_rather_than_no(origin: dict[str, str],
                                                             tmp_path: Path) -> None:
    shallow = clone(origin, tmp_path / "shallow", "--depth", "1")
    full = clone(origin, tmp_path / "full")
    assert is_shallow(shallow) is True and is_shallow(full) is False
    assert "shallow clone" in (history_missing(shallow) or "") and history_missing(full) is None

    # HEAD itself is always answerable
    assert is_ancestor(shallow, origin["p"]) is True
    # W is an ancestor of HEAD, but its commit is beyond the shallow boundary
    no = is_ancestor(shallow, origin["w"])
    assert isinstance(no, NoAnswer), no
    assert "shallow clone" in str(no) and "git fetch --unshallow" in str(no)
    # the complete clone answers both ways
    assert is_ancestor(full, origin["w"]) is True
    assert is_ancestor(full, origin["s"]) is False      # fetched (origin/side) but never merged
    assert is_ancestor(full, "0" * 40) is False          # not there at all: not in the history
    # a side-branch commit in a shallow clone is no answer either, not a false "no"
    assert isinstance(is_ancestor(shallow, origin["s"]), NoAnswer)

    git(shallow, "fetch", "-q", "--unshallow")
    assert is_shallow(shallow) is False
    assert is_ancestor(shallow, origin["w"]) is True


def test_the_cell_is_honest_in_a_shallow_clone(origin: dict[str, str], tmp_path: Path) -> None:
    shallow = Workspace(clone(origin, tmp_path / "shallow", "--depth", "1"))
    full = Workspace(clone(origin, tmp_path / "full"))
    cell = generate(full, paths=tracked_records(full)).table.cell("near-tie", "hf")
    assert cell.state == "pass", cell.text
    cell = generate(shallow, paths=tracked_records(shallow)).table.cell("near-tie", "hf")
    assert cell.state == "stale", "an unchecked result must never show as ✅"
    assert "cannot be checked: shallow clone" in cell.text
    assert "git fetch --unshallow" in cell.text
    assert "not an ancestor" not in cell.text


def _committed_pages_test(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run tests/unit/test_features_committed.py of this tree against the checkout at ``root``."""
    e = {k: v for k, v in os.environ.items() if k != "HARNESS_REQUIRE_HISTORY"}
    e.update(HARNESS_ROOT=str(root), PYTHONPATH=str(REPO_ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *NO_HYPOTHESIS,
                           str(REPO_ROOT / "tests/unit/test_features_committed.py")],
                          cwd=REPO_ROOT, env=e, capture_output=True, text=True, timeout=300)


def test_committed_pages_check_skips_with_the_reason_in_a_shallow_clone(
        origin: dict[str, str], tmp_path: Path) -> None:
    shallow = clone(origin, tmp_path / "shallow", "--depth", "1")
    full = clone(origin, tmp_path / "full")

    r = _committed_pages_test(full)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout[-2000:]

    r = _committed_pages_test(shallow)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "1 passed, 2 skipped" in r.stdout, r.stdout[-2000:]
    assert "shallow clone" in r.stdout and "git fetch --unshallow" in r.stdout

    r = _committed_pages_test(shallow, HARNESS_REQUIRE_HISTORY="1")
    assert r.returncode == 1 and "2 failed, 1 passed" in r.stdout, r.stdout[-2000:]

    # planted: a hand edit in a complete clone still fails (the skip is for shallow clones only)
    page = full / "FEATURES.md"
    page.write_text(page.read_text().replace("✅", "❌", 1))
    commit(full, "a hand edit")
    r = _committed_pages_test(full)
    assert r.returncode == 1 and "1 failed, 2 passed" in r.stdout, r.stdout[-2000:]
