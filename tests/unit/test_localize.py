"""The localize kind without vLLM: the profile's rules, the kind end to end on a failing gate of a
planted copy (the oracle's cached tensors made by transformers: a stand-in for the pinned vLLM,
whose own tensors the integration test uses), the console line after ``harness gate``, a refusal
that names why, and the staleness rule."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.commands.localize import localize
from harness.engines import make_runner
from harness.goldens import golden_dir, read_golden
from harness.kinds.localize.kind import Localize, divergences, targets_of
from harness.kinds.localize.oracle import cache_path, cache_root, golden_sequence, read_cached, write_cached
from harness.kinds.localize.plant import plant
from harness.kinds.localize.profile import (
    DEFAULT_BAR,
    DEFAULT_FLOOR,
    controls_of,
    planted,
    profile,
    sci,
    settings,
)
from harness.models import resolve_model
from harness.pipeline import GateResult, run_gate_by_name
from harness.records import iter_record_paths, load_record
from harness.staleness import Current
from harness.suites import SuiteError
from harness.tomlcheck import Where
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN
from tests.unit.features_kit import make_git_workspace


def _tensors(seed: int = 0, rows: int = 12) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    names = ["layer.0.attn", "layer.0.mlp", "layer.1.attn", "layer.1.mlp", "final_norm", "logits"]
    return {n: rng.standard_normal((rows, 8)).astype(np.float32) for n in names}


def test_the_profile_names_the_first_tensor_over_the_floor_and_says_if_it_is_under_the_bar() -> None:
    o = _tensors()
    under = profile("c03", o, planted(o, "layer.1.attn", 3e-5), 12, 10)
    assert under.parts_at is not None and under.parts_at.name == "layer.1.attn" and under.over_bar is None
    assert under.line() == "c03: parts at layer 1 attn (NMSE 3e-5, under the 5e-4 bar; everything before ≤ 0)"
    over = profile("c03", o, planted(o, "layer.0.mlp", 3.1e-2), 12, 10)
    assert over.line() == "c03: parts at layer 0 mlp (NMSE 3.1e-2; everything before ≤ 0)"
    first = profile("c01", o, planted(o, "layer.0.attn", 1e-3), 12, 10)
    assert first.line().endswith("(NMSE 1e-3; the first tapped sub-block)")
    none = profile("c02", o, {k: v + np.float32(1e-6) * v for k, v in o.items()}, 12, 10)
    assert none.parts_at is None and "no sub-block parts (largest NMSE" in none.line()
    assert [s.growth is None for s in over.steps] == [True, True, False, False, False, False]  # 0 before
    assert over.to_json()["parts_at"] == "layer.0.mlp" and over.to_json()["over_bar"] == "layer.0.mlp"
    with pytest.raises(ValueError, match="oracle rows"):
        profile("c01", o, {**o, "logits": o["logits"][:5]}, 12, 10)
    assert profile("c01", o, {k: v for k, v in o.items() if k != "logits"}, 12, 10).missing == ("logits",)
    assert sci(3.14e-2) == "3.1e-2" and sci(0.0) == "0" and sci(2.0) == "2e0" and sci(-1e-3) == "-1e-3"


def test_the_localizers_controls_bite(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.kinds.localize.profile import Profile

    o = _tensors()
    ctl = controls_of(o, 12, 10, DEFAULT_BAR, DEFAULT_FLOOR)
    assert [c[0] for c in ctl] == ["identical tensors", "planted at layer.1.attn, NMSE 1e-5",
                                   "planted at layer.1.attn, NMSE 5e-3"]
    assert all(got == want for _, _, got, want in ctl), ctl
    # planted faults in the localizer: naming the last tensor over the floor, or never parting
    last = property(lambda p: next((s for s in reversed(p.steps) if s.nmse > p.floor), None))
    for broken in (last, property(lambda p: None)):
        monkeypatch.setattr(Profile, "parts_at", broken)
        got = controls_of(o, 12, 10, DEFAULT_BAR, DEFAULT_FLOOR)
        assert [g == w for _, _, g, w in got] == [True, False, False], got


def test_the_suite_can_set_the_bar_and_the_floor() -> None:
    top = Where("s.toml", error=SuiteError)
    assert settings({}, top) == (DEFAULT_BAR, DEFAULT_FLOOR)
    table = {"nmse_bar": 1e-3, "nmse_floor": 1e-9, "auto": False}
    assert settings({"localize": table}, top) == (1e-3, 1e-9)
    for table, err in (({"nmse_bars": 1}, r"s.toml: \[localize\].nmse_bars: unknown key 'nmse_bars'"),
                       ({"nmse_bar": -1}, r"\[localize\].nmse_bar: expected a number > 0, got -1"),
                       ({"nmse_floor": 1e-2}, "must be below nmse_bar"),
                       ({"auto": "no"}, r"\[localize\].auto: expected true or false")):
        with pytest.raises(SuiteError, match=err):
            settings({"localize": table}, top)


def seed_oracle_cache(ws: Workspace, model_name: str, suite: str) -> None:
    """The stand-in oracle: transformers' tensors of the unperturbed model on every golden sequence,
    written where the pinned vLLM's would be cached."""
    model = resolve_model(model_name, ws)
    golden = read_golden(golden_dir(ws.goldens, model, suite), model_name=model_name, suite_name=suite)
    runner = make_runner("hf", model)
    runner.start()
    seqs = {c.id: golden_sequence(golden, c.id) for c in golden.cases}
    for cid, t in runner.capture_layers(seqs).items():  # type: ignore[attr-defined]
        write_cached(cache_path(ws, model, seqs[cid]), t, {"engine": "transformers (test stand-in)"})
    runner.close()


@pytest.fixture(scope="module")
def oracle_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in oracle's cache of tiny-llama on smoke, made once for the module (a model load
    and a capture) in a workspace of its own; :func:`seeded` copies it into a test's workspace."""
    ws = Workspace(tmp_path_factory.mktemp("oracle"))
    for sub in ("models", "goldens"):
        (ws.root / sub).symlink_to(REPO_ROOT / sub)  # read only: the cache is written under .cache/
    seed_oracle_cache(ws, "tiny-llama", "smoke")
    return cache_root(ws)


@pytest.fixture
def seeded(workspace: Workspace, oracle_cache: Path) -> Workspace:
    """``workspace`` with the stand-in oracle's tensors cached where the pinned vLLM's would be."""
    shutil.copytree(oracle_cache, cache_root(workspace))
    return workspace


@pytest.fixture
def planted_ws(seeded: Workspace) -> tuple[Workspace, Path]:
    copy = plant(resolve_model("tiny-llama", seeded), seeded.root / "planted", layer=1, sub="mlp",
                 relative=1e-1).path
    return seeded, copy


def test_a_failing_gate_of_a_planted_copy_is_localized_to_the_planted_layer(
        planted_ws: tuple[Workspace, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ws, copy = planted_ws
    monkeypatch.setenv("HARNESS_ROOT", str(ws.root))
    assert main(["gate", "--model", "tiny-llama", "--candidate", f"hf:weights={copy}"]) == 1
    out = capsys.readouterr().out
    recs = {r.kind: r for r in (load_record(p) for p in iter_record_paths(ws.records))}
    gate, loc = recs["parity"], recs["localize"]
    assert gate.outcome == "fail" and loc.outcome == "pass", loc.summary
    assert loc.model["digest"] == gate.model["digest"] != loc.candidate.settings["weights"]["digest"]
    assert loc.suite["name"] == "localize" and loc.suite["diagnoses"] == {"name": "smoke", "version": 1}
    assert loc.extra["diagnosed"]["record"] == gate.id
    diverged = divergences(gate)
    assert {v.case_id for v in loc.verdicts} == set(diverged) and diverged
    for v in loc.verdicts:
        assert v.status == "pass" and v.evidence["parts_at"] == "layer.1.mlp", v.summary
        assert v.evidence["oracle_from"] == "cache" and v.evidence["before_max"] < 1e-10
        assert f"{v.case_id}: parts at layer 1 mlp (NMSE " in out  # the console's one line per case
    assert loc.controls and all(c.ok for c in loc.controls)
    assert (ws.records / "tiny-llama" / "localize" / loc.extra["figures"]["profile"]).stat().st_size > 1000
    assert loc.extra["wall"]["ratio"] > 0


def test_a_strict_divergence_the_near_tie_rule_forgives_is_localized_too(seeded: Workspace) -> None:
    workspace = seeded
    copy = plant(resolve_model("tiny-llama", workspace), workspace.root / "small", layer=0, sub="mlp",
                 relative=1e-2).path
    gate = run_gate_by_name(workspace, "tiny-llama", "smoke", f"hf:weights={copy}", auto_record=False)
    assert gate.record.outcome == "pass" and divergences(gate.record), gate.record.summary
    loc = localize(workspace, gate.record, str(gate.path)).record
    assert {v.evidence["parts_at"] for v in loc.verdicts} == {"layer.0.mlp"}
    assert all(v.evidence["over_bar"] is None for v in loc.verdicts)  # a 1e-2 change stays under 5e-4


@pytest.fixture(scope="module")
def unperturbed(tmp_path_factory: pytest.TempPathFactory, oracle_cache: Path) -> tuple[Workspace, GateResult]:
    """A gate of the unperturbed model (transformers) in a seeded workspace of the module's: the
    tests below read its record and never change it."""
    ws = Workspace(tmp_path_factory.mktemp("unperturbed"))
    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, ws.root / sub)
    shutil.copytree(oracle_cache, cache_root(ws))
    return ws, run_gate_by_name(ws, "tiny-llama", "smoke", "hf", auto_record=False)


def test_an_unperturbed_copy_localizes_nothing_and_every_case_can_be_profiled(
        unperturbed: tuple[Workspace, GateResult]) -> None:
    workspace, gate = unperturbed
    assert not divergences(gate.record)
    assert localize(workspace, gate.record, str(gate.path)).record.summary.startswith("localize: no case")
    loc = localize(workspace, gate.record, str(gate.path), cases="all").record
    assert len(loc.verdicts) == 8 and all(v.evidence["parts_at"] is None for v in loc.verdicts)
    assert all(v.evidence["divergence"] is None for v in loc.verdicts)
    assert all(v.summary.endswith("the case did not diverge either") for v in loc.verdicts)


def test_an_engine_without_tensors_is_refused_with_its_reason(unperturbed: tuple[Workspace, GateResult]) -> None:
    workspace, gate = unperturbed
    rec = replace(gate.record, candidate=replace(gate.record.candidate, name="vllm-server"))
    loc = localize(workspace, rec, "x.json").record
    assert loc.outcome == "refused" and len(loc.verdicts) == 8
    assert "a vLLM server answers tokens and logprobs over HTTP" in loc.verdicts[0].summary


def test_the_sequences_are_the_prompt_and_the_oracle_up_to_the_first_divergence(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    golden = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama",
                         suite_name="smoke")
    (t,) = targets_of(golden, {"c03": 4}, None)
    case = t.case
    assert t.sequence == (*case.prompt_ids, *golden.outputs["c03"].token_ids[:5]) and t.divergence == 4
    assert t.row == len(case.prompt_ids) + 3  # the row that predicts oracle token 4
    (w,) = targets_of(golden, {}, ["c01"])
    assert w.divergence is None and len(w.sequence) == len(golden_sequence(golden, "c01"))


def test_a_localize_record_is_stale_by_the_rules_of_the_gate_it_diagnosed(tmp_path: Path) -> None:
    ws = make_git_workspace(tmp_path / "ws")
    manifest = json.loads((ws.goldens / "tiny-llama" / "smoke" / "manifest.json").read_text())
    from harness.api import EngineInfo
    from tests.unit.record_kit import make_record

    rec = make_record(id="x", kind="localize", created="2026-12-01T00:00:00Z",
                 model={"name": "tiny-llama", "digest": manifest["model"]["digest"]},
                 suite={"name": "localize", "version": 1, "diagnoses": {"name": "smoke", "version": 1}},
                 oracle={"pin": PIN.spec, "golden_files": manifest["files"]},
                 candidate=EngineInfo("hf", "transformers", "x"), harness={}, outcome="pass", summary="",
                 verdicts=(), gates=("localize",))
    cur = Current.of(ws)
    assert Localize.stale(rec, cur) == []
    old = replace(rec, suite={**rec.suite, "diagnoses": {"name": "smoke", "version": 0}})
    assert Localize.stale(old, cur) == ["suite smoke is v1, recorded at v0"]
    assert "names no diagnosed suite" in Localize.stale(replace(rec, suite={"name": "localize"}), cur)[0]


def test_the_oracle_cache_round_trips_and_is_keyed_by_the_sequence(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    p1, p2 = cache_path(workspace, model, [1, 2, 3]), cache_path(workspace, model, [1, 2, 4])
    assert p1 != p2 and p1.parent == p2.parent
    write_cached(p1, {"logits": np.ones((3, 4), np.float32)}, {"engine": "x"})
    got = read_cached(p1)
    assert got is not None and got[1] == {"engine": "x"} and got[0]["logits"].shape == (3, 4)
    assert read_cached(p2) is None
