"""The ``bisect`` record: what a bisect found, and every step's own record.

It lives beside the steps' records (``reports/records/<model>/<suite>/``), written atomically like
any record, and is of its own kind: it judges no engine, so FEATURES.md and SUPPORTED_MODELS.md never
show it (:mod:`harness.kinds.summary`). Its ``oracle`` is the goldens every step was judged
against, so it goes stale exactly when they would (its summary kind's rule: the pin
moved, the goldens were re-recorded, the suite or the model changed), besides the harness SHA rule
every record has.

``extra.bisect``: ``over`` (releases | history), the ends asked for and the ones compared,
``points`` (every point in the range), ``steps`` (each with its state, record, reason, wall time,
verdict table), ``result`` (kind, last old, first new, candidates, statement), ``diff`` (the verdicts
that differ between the last old and the first new point), ``cost`` (steps, total seconds, venvs
installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.api import EngineInfo
from harness.bisect.search import Result
from harness.bisect.verdicts import diff, direction
from harness.goldens import Golden
from harness.models import ModelRef
from harness.pipeline import golden_provenance, model_entry, suite_entry
from harness.provenance import device_facts, git_dirty, git_sha, now_utc, platform_facts
from harness.records import Record, new_record_id
from harness.suites import Suite
from harness.workspace import Workspace


def _short(point: str | None) -> str:
    """A commit SHA is shown by its first 10 characters; a release as it is."""
    p = point or "?"
    return p[:10] if len(p) == 40 else p


def behaviour(table: Mapping[str, str]) -> str:
    """A verdict table in a few words: what is not passing, or that everything passes."""
    bad = [f"{k} {s}" for k, s in table.items() if s != "pass"]
    if not bad:
        return f"all {len(table)} verdicts pass"
    return ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")


def statement(r: Result, noun: str = "release") -> str:
    """The finding in one sentence."""
    moved = f" ({'; '.join(r.moved)})" if r.moved else ""
    if r.kind == "inconclusive":
        return f"inconclusive: neither end can be run{moved}"
    ref = r.step(r.reference)
    assert ref is not None
    if r.kind == "no_change":
        return (f"no change: {_short(r.end)} has the verdicts of {_short(r.reference)} "
                f"({behaviour(ref.obs.table)}); every {noun} tested between them agrees{moved}")
    old, new = r.step(r.last_old), r.step(r.first_new)
    assert old is not None and new is not None
    n = len(diff(old.obs, new.obs))
    if r.kind == "ambiguous":
        skipped = [_short(c) for c in r.candidates[:-1]]
        return (f"the first {noun} whose verdicts differ from {_short(r.reference)}'s is one of "
                f"{', '.join(_short(c) for c in r.candidates)}: {', '.join(skipped)} cannot be run; "
                f"{_short(r.last_old)} is the last like {_short(r.reference)}{moved}")
    return (f"first {noun} whose verdicts differ from {_short(r.reference)}'s: {_short(r.first_new)} "
            f"({direction(old.obs, new.obs)}: {n} verdict{'s' if n != 1 else ''} differ from "
            f"{_short(r.last_old)}, the last like it; now {behaviour(new.obs.table)}){moved}")


def cost(r: Result) -> dict[str, Any]:
    installs = [s.obs.facts.get("venv", {}) for s in r.steps]
    new = [v for v in installs if v.get("installed_now")]
    return {"steps": len(r.steps), "skipped": len(r.skipped), "steps_s": round(r.wall_s, 1),
            "venvs_installed": len(new),
            "install_s": round(sum(float(v.get("install_s") or 0) for v in new), 1),
            "venvs_reused": sum(1 for v in installs if v and not v.get("installed_now")),
            "build_s": round(sum(float(s.obs.facts.get("build_s") or 0) for s in r.steps), 1),
            "records_reused": sum(1 for s in r.steps if s.obs.facts.get("reused")),
            "not_installed": sum(1 for s in r.steps if s.obs.facts.get("not_installed"))}


def bisect_record(ws: Workspace, *, model: ModelRef, suite: Suite, golden: Golden, over: str, label: str,
                  result: Result, asked: Mapping[str, Any], environment: Mapping[str, Any],
                  total_s: float, created: str | None = None) -> Record:
    """The record of a finished bisect (see the module doc)."""
    created = created or now_utc()
    sha = git_sha(ws.root)
    noun = "release" if over == "releases" else "commit"
    old, new = result.step(result.last_old), result.step(result.first_new)
    found = result.kind in ("found", "no_change")
    return Record(
        id=new_record_id(created, sha, f"bisect-{label}"), kind="bisect", created=created,
        model=model_entry(model), suite=suite_entry(suite, suite.kind),
        oracle=golden_provenance(golden),
        candidate=EngineInfo(f"bisect:{label}", "bisect", _short(result.first_new or result.end),
                             settings=dict(asked), environment=dict(environment)),
        harness={"sha": sha, "dirty": git_dirty(ws.root)},
        outcome="pass" if found else "skip", summary=statement(result, noun), verdicts=(), gates=(),
        timings={"bisect_wall_s": total_s, "steps_s": result.wall_s},
        platform=platform_facts(), device=device_facts(),
        extra={"bisect": {
            "over": over, "points": list(result.points), "reference": result.reference, "end": result.end,
            "moved": list(result.moved), "steps": [s.to_json() for s in result.steps],
            "result": {"kind": result.kind, "last_old": result.last_old, "first_new": result.first_new,
                       "candidates": list(result.candidates), "statement": statement(result, noun),
                       "direction": direction(old.obs, new.obs) if old and new else None},
            "diff": diff(old.obs, new.obs) if old and new else [],
            "cost": {**cost(result), "total_s": round(total_s, 1)}}})
