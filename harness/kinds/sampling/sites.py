"""Control-site budgeting: where each setting's planted faults (:mod:`.faults`) are judged, and how
many draws give the weakest of them ``control_power`` there.

The plan (:mod:`.plan`) adds each setting's site to its tests (or marks a test there as the
control) and records a :class:`ControlSite` per setting, powered or with the reason none is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.kinds.sampling import faults
from harness.kinds.sampling.draws import MIN_JUDGED, OracleRows, cover, judged_draws
from harness.kinds.sampling.settings import GateSettings, Setting
from harness.sampling.transforms import Chain, Reference


@dataclass(frozen=True, slots=True)
class ControlSite:
    """Where a setting's planted faults are judged: the position of any case where every fault of
    the setting moves the distribution the most, and the draws that give the weakest of them
    ``control_power``."""

    setting: str
    param: str
    test: str | None
    """The test (``<case>@<t>/<setting>``) sized for them; None: the setting has no runnable test."""
    moved: tuple[tuple[str, float], ...]
    """(fault, the visible TV it moves at that position) for every fault of the setting."""
    power: float
    """The power against the weakest fault at that test alone, at the Bonferroni level."""
    draws: int
    powered: bool
    """``power`` reaches ``control_power`` within ``max_draws``."""
    searched: int
    """Positions (of every case) the site was chosen among."""
    note: str = ""
    """Why no position powers it, when none does."""

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "param": self.param,
            "test": self.test,
            "moved_tv": dict(self.moved),
            "power": self.power,
            "draws": self.draws,
            "powered": self.powered,
            "positions_searched": self.searched,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True, eq=False)
class Site:
    o: OracleRows
    t: int
    alts: tuple[tuple[Reference, ...], ...]
    """Per fault of the setting: its distributions at every step."""
    moved: tuple[tuple[str, float], ...]
    searched: int
    power_at_cap: float


SITE_TRIALS = 6
"""Positions, the most moved first, whose power is computed when choosing a setting's site."""


def control_site(
    oracle: Sequence[OracleRows], s: Setting, gs: GateSettings, chain: Chain, level: float
) -> Site | str:
    """The position (of any case, any t whose path lies inside the greedy continuation) where the
    setting's planted faults are judged: among the :data:`SITE_TRIALS` positions where the fault
    that moves the visible distribution least moves it most, the one needing the fewest draws for
    ``control_power`` against every fault (block-aligned first on a tie); where none reaches it
    within ``max_draws``, the one with the most power. A string: why no position can be one (every
    path too unlikely under the setting, or the faults move nothing anywhere)."""
    fs = faults.of(s.param)
    scored = []
    for o in oracle:
        for t in range(len(o.greedy) - s.step):
            if any(t + j not in o.rows for j in range(s.step + 1)):
                continue
            prefix = tuple(o.case.prompt_ids) + tuple(o.greedy[:t])
            path = tuple(o.greedy[t : t + s.step])
            rows = [o.rows[t + j] for j in range(s.step + 1)]
            refs = faults.references(rows, s.sampling, prefix, path, chain, gs.boundary_tol)
            p_path = faults.path_probability(refs, path)
            if gs.max_draws * p_path < 2 * MIN_JUDGED:
                continue
            alts = tuple(
                faults.references(rows, s.sampling, prefix, path, chain, gs.boundary_tol, f) for f in fs
            )
            moved = tuple((f.name, faults.visible_tv(refs[-1], a[-1])) for f, a in zip(fs, alts, strict=True))
            aligned = gs.align <= 1 or len(prefix) % gs.align == 1
            scored.append((min(m for _, m in moved), aligned, o, t, refs, alts, path, p_path, moved))
    n = sum(max(0, len(o.greedy) - s.step) for o in oracle)
    if not scored:
        return (
            f"no position of any case powers it: on all {n} positions the oracle's path of {s.step} "
            f"tokens is too unlikely under the setting for {gs.max_draws} draws to judge {2 * MIN_JUDGED}"
        )
    scored.sort(key=lambda x: (-x[0], not x[1]))
    if scored[0][0] <= 0:
        sees = (
            f"; the {chain.name} chain's penalties see only the tokens the engine drew, and the "
            f"setting draws {s.step} before the judged one"
            if s.step == 0
            and (chain.repetition_sees if s.param == "repetition_penalty" else chain.counts_see) == "output"
            and s.param.endswith("penalty")
            else ""
        )
        return f"no position of any case powers it: the fault moves nothing at any of {n} positions{sees}"
    best: tuple[tuple[int, int, float], Site] | None = None
    for tv, aligned, o, t, refs, alts, path, p_path, moved in scored[:SITE_TRIALS]:
        if tv <= 0 and best is not None:
            break
        n0 = judged_draws(refs[-1], p_path, level, gs)[0]
        _j, draws, power = control_draws(refs, alts, path, p_path, n0, level, gs)
        site = Site(o, t, alts, moved, len(scored), power)
        key = (0 if power >= gs.control_power else 1, draws if power >= gs.control_power else 0, -power)
        key = (key[0], key[1] + (0 if aligned else 1), key[2])
        if best is None or key < best[0]:
            best = (key, site)
    assert best is not None
    return best[1]


def control_draws(
    refs: Sequence[Reference],
    alts: Sequence[Sequence[Reference]],
    path: Sequence[int],
    p_path: float,
    n0: int,
    level: float,
    gs: GateSettings,
) -> tuple[int, int, float]:
    """(judged, requested, power): the fewest judged draws, ``n0`` at least, whose test fails every
    fault in ``alts`` with probability ``control_power`` (the weakest decides); the cap when none
    does, with the power it has there."""

    def power(n: int) -> tuple[float, int, int]:
        judged, draws = cover(n, p_path, gs)
        pw = min(
            faults.power_against_fault(refs, a, path, judged, draws, level, gs.min_expected, gs.max_cells)
            for a in alts
        )
        return pw, judged, draws

    cap = cover(gs.max_draws * 10, p_path, gs)[0]  # the judged draws max_draws requests give
    n = max(1, min(n0, cap))
    pw, judged, draws = power(n)
    if pw >= gs.control_power:
        return judged, draws, pw
    lo, hi = n, n
    while hi < cap:
        hi = min(cap, hi * 2)
        pw, judged, draws = power(hi)
        if pw >= gs.control_power:
            break
        lo = hi
    if pw < gs.control_power:
        return judged, draws, pw
    best = (judged, draws, pw)
    while hi - lo > max(1, hi // 20):
        mid = (lo + hi) // 2
        pw, judged, draws = power(mid)
        if pw >= gs.control_power:
            hi, best = mid, (judged, draws, pw)
        else:
            lo = mid
    return best


def site_record(
    s: Setting, test: str, site: Site, power: float, draws: int, gs: GateSettings
) -> ControlSite:
    powered = power >= gs.control_power
    note = "" if powered else (
        f"no position of any case powers it: the most moved of {site.searched} positions "
        f"({test}) gives power {power:.3g} at {draws} draws (max_draws {gs.max_draws})"
    )
    return ControlSite(s.id, s.param, test, site.moved, power, draws, powered, site.searched, note)
