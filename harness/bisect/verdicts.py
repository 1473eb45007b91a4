"""What "the same verdicts" means for a bisect: a step's record as a table of (case, comparator) ->
status, optionally narrowed to the verdicts a user asks about (``--only``), and the diff of two.

Only statuses are compared (``pass``/``fail``/``error``/``refused``/``skip``), never summaries or
figures, which carry timings and floats that move from run to run. A step whose record judged
nothing — its outcome ``skip`` (a release lacks a hook the gate needs: named by
:mod:`harness.kinds.kv.compat`), ``vacuous`` (a planted mutation passed: its verdicts prove nothing), or
only ``error`` verdicts (the engine never produced anything) — is not a point of the search: it is
skipped, with the record's own reason, and never counted as like or unlike the reference.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bisect import BisectError
from harness.excerpt import LINE, clip
from harness.records import Record

JUDGED = ("pass", "fail", "refused")
"""Statuses that say something about the engine (an ``error`` alone says the harness could not run it)."""


def key(case: str, comparator: str) -> str:
    return f"{case}/{comparator}"


@dataclass(frozen=True, slots=True)
class Focus:
    """Which verdicts a bisect compares: ``CASE`` (every comparator of it), ``CASE/COMPARATOR``, with
    ``*`` globs (``*/kv_hits``). Empty: every verdict."""

    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | Sequence[str] | None, cases: Iterable[str] = ()) -> Focus:
        items = (text.replace(",", " ").split() if isinstance(text, str) else list(text or ()))
        pats = tuple(p if "/" in p else f"{p}/*" for p in items)
        known = sorted(set(cases))
        for p in pats:
            case = p.partition("/")[0]
            if known and not any(fnmatch.fnmatchcase(c, case) for c in known):
                raise BisectError(f"--only {p.partition('/')[0]!r} names no case of the suite "
                                  f"(its cases: {', '.join(known)})")
        return cls(pats)

    def __contains__(self, k: str) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(k, p) for p in self.patterns)

    def to_json(self) -> list[str]:
        return list(self.patterns)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one step established."""

    point: str
    """The release or the commit SHA."""
    runnable: bool
    """The record judged something (else the step is skipped: ``reason`` says why)."""
    reason: str = ""
    table: Mapping[str, str] = field(default_factory=dict)
    """``case/comparator`` -> status, the verdicts in focus."""
    summaries: Mapping[str, str] = field(default_factory=dict)
    outcome: str = ""
    """The record's outcome; empty when the step wrote no record (an install or build failed)."""
    record: str | None = None
    """The record's path, relative to the workspace root."""
    record_id: str | None = None
    wall_s: float = 0.0
    facts: Mapping[str, Any] = field(default_factory=dict)
    """What the step cost besides the gate: a venv installed now, a build."""
    outside: int = 0
    """How many verdicts of the record lie outside the focus."""

    def to_json(self) -> dict[str, Any]:
        return {"point": self.point, "runnable": self.runnable, "reason": self.reason,
                "outcome": self.outcome, "record": self.record, "record_id": self.record_id,
                "wall_s": round(self.wall_s, 1), "facts": dict(self.facts), "table": dict(self.table),
                "outside_focus": self.outside}


def not_judged(rec: Record) -> str | None:
    """Why ``rec`` judged nothing (None: it judged something)."""
    if rec.outcome == "skip":
        first = next((v for v in rec.verdicts if v.status == "skip"), None)
        why = rec.extra.get("engine_skip") or (first.summary if first else rec.summary)
        return f"skip: {str(why).splitlines()[0]}"
    if rec.outcome == "vacuous":
        return "vacuous: " + clip("; ".join(map(str, rec.extra.get("vacuous") or [rec.summary])))
    if not any(v.status in JUDGED for v in rec.verdicts):
        first = next((v for v in rec.verdicts if v.status == "error"), None)
        why = str(rec.extra.get("engine_error") or (first.summary if first else rec.summary)).splitlines()[0]
        cause = root_cause(first.detail if first else "")
        return (f"nothing judged ({rec.outcome}): {clip(why, LINE)}"
                + (f"; root cause: {cause}" if cause else ""))
    return None


ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")
WRAPPERS = ("Engine core initialization failed",)
"""Errors that only say that another one happened first (vLLM's engine core)."""


def root_cause(log: str) -> str | None:
    """The last ``SomeError: message`` of an engine log that is not a wrapper of another error."""
    found = [f"{m.group(1)}: {m.group(2).strip()}" for line in log.splitlines()
             if (m := ERROR_LINE.search(line)) and not any(w in line for w in WRAPPERS)]
    return clip(found[-1]) if found else None


def observe(point: str, rec: Record, path: str, focus: Focus, wall_s: float,
            facts: Mapping[str, Any] | None = None) -> Observation:
    table = {key(v.case_id, v.comparator): v.status for v in rec.verdicts}
    summaries = {key(v.case_id, v.comparator): v.summary for v in rec.verdicts}
    inside = {k: s for k, s in table.items() if k in focus}
    why = not_judged(rec)
    return Observation(point, why is None, why or "", dict(sorted(inside.items())),
                       {k: summaries[k] for k in sorted(inside)}, rec.outcome, path, rec.id, wall_s,
                       dict(facts or {}), len(table) - len(inside))


def rel_path(root: Path, path: Path) -> str:
    """A record's path as cells cite it: relative to the workspace root, forward slashes."""
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


def unrun(point: str, reason: str, wall_s: float, facts: Mapping[str, Any] | None = None) -> Observation:
    """A step that wrote no record: the release could not be installed, the commit not built."""
    return Observation(point, False, reason, wall_s=wall_s, facts=dict(facts or {}))


def same(a: Observation, b: Observation) -> bool:
    return dict(a.table) == dict(b.table)


def diff(a: Observation, b: Observation) -> list[dict[str, Any]]:
    """Every verdict whose status differs between ``a`` and ``b`` (``absent``: not in that record)."""
    out = []
    for k in sorted(set(a.table) | set(b.table)):
        x, y = a.table.get(k, "absent"), b.table.get(k, "absent")
        if x != y:
            case, _, comp = k.partition("/")
            out.append({"case": case, "comparator": comp, "before": x, "after": y,
                        "before_summary": a.summaries.get(k, ""), "after_summary": b.summaries.get(k, "")})
    return out


def direction(a: Observation, b: Observation) -> str:
    """``broke`` (all passing -> something failing), ``fixed`` (the reverse), else ``changed``."""
    ok_a = all(s == "pass" for s in a.table.values())
    ok_b = all(s == "pass" for s in b.table.values())
    return "broke" if ok_a and not ok_b else "fixed" if ok_b and not ok_a else "changed"
