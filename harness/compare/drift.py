"""drift: does the candidate's error grow with the number of decoded tokens?

A KV-cache quantisation can show a small mean KL that hides an error accumulating over a long
decode. This comparator splits the per-position KL (and the same-top share) into position buckets
(0-63, 64-255, 256-1023, 1024-4095, ...) and fits a straight line to KL against position. The gate
fails on the slope even when the mean KL passes. The slope is in nats per 1000 positions; its
standard error takes positions as independent, so read it as a floor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.kernels.planting import lower_top1_until, plant_identity, top_rows
from harness.compare.kl import KL, MODE_HELP, MODES, RUN, KLRows, ModeWish, json_number
from harness.compare.unit import LOGPROBS, ControlSet, Mutation, Needs, Planted, Unit, param

DEFAULT_EDGES = (0, 64, 256, 1024, 4096, 16384)


@dataclass(frozen=True, slots=True)
class Bucket:
    start: int
    end: int
    """Exclusive."""
    observations: int
    """(case, position) pairs that fell in the bucket."""
    mean_kl: float
    same_top: float

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "observations": self.observations,
                "mean_kl": json_number(self.mean_kl), "same_top": json_number(self.same_top)}


@dataclass(frozen=True, slots=True, eq=False)
class DriftProfile:
    buckets: tuple[Bucket, ...]
    slope_per_1k: float
    """Least-squares slope of KL against position, nats per 1000 positions."""
    slope_se_per_1k: float
    intercept: float
    positions: int
    """Distinct positions (the longest case's aligned length)."""
    observations: int
    curve: np.ndarray
    """[positions] mean KL at each position over the cases that reach it (for the picture)."""
    same_top_curve: np.ndarray

    @property
    def growth(self) -> float:
        """Mean KL of the last non-empty bucket over the first's (inf when the first is 0)."""
        full = [b for b in self.buckets if b.observations]
        if len(full) < 2:
            return float("nan")
        first, last = full[0].mean_kl, full[-1].mean_kl
        return last / first if first > 0 else (float("inf") if last > 0 else 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"buckets": [b.to_json() for b in self.buckets],
                "slope_per_1k": json_number(self.slope_per_1k),
                "slope_se_per_1k": json_number(self.slope_se_per_1k),
                "intercept": json_number(self.intercept), "positions": self.positions,
                "observations": self.observations, "growth_last_over_first": json_number(self.growth)}

    def lines(self) -> list[str]:
        out = [f"drift over {self.positions} positions ({self.observations} observations): slope "
               f"{self.slope_per_1k:.3g} ± {self.slope_se_per_1k:.2g} nats / 1k tokens"]
        for b in self.buckets:
            if b.observations:
                out.append(f"  {b.start:>5}-{b.end - 1:<5}: mean KLD {b.mean_kl:.4g}  same top "
                           f"{100 * b.same_top:6.2f} %  (n {b.observations})")
        return out


def ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, standard error of the slope, intercept) of y ~ a + b x."""
    n = x.size
    if n < 3 or np.ptp(x) == 0:
        return float("nan"), float("nan"), float(y.mean()) if n else float("nan")
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum() / sxx)
    a = float(ym - b * xm)
    resid = y - (a + b * x)
    se = float(np.sqrt((resid**2).sum() / (n - 2) / sxx))
    return b, se, a


def drift_profile(kl: Sequence[np.ndarray], same_top: Sequence[np.ndarray],
                  edges: Sequence[int] = DEFAULT_EDGES) -> DriftProfile:
    """Bucket and fit the per-position KL of several cases (arrays indexed by position)."""
    pos = np.concatenate([np.arange(len(k)) for k in kl]) if kl else np.empty(0, np.int64)
    y = np.concatenate(list(kl)).astype(np.float64) if kl else np.empty(0)
    st = np.concatenate(list(same_top)).astype(np.float64) if same_top else np.empty(0)
    n_pos = int(pos.max()) + 1 if pos.size else 0
    counts = np.bincount(pos, minlength=n_pos)
    with np.errstate(invalid="ignore", divide="ignore"):
        curve = np.bincount(pos, y, minlength=n_pos) / counts
        st_curve = np.bincount(pos, st, minlength=n_pos) / counts
    edges = sorted(set(int(e) for e in edges))
    if not edges or edges[-1] < n_pos:
        edges = [*edges, n_pos]
    buckets = []
    which = np.searchsorted(np.asarray(edges), pos, side="right") - 1
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        if lo >= n_pos:
            break  # no run reaches this far
        sel = which == i
        m = int(sel.sum())
        buckets.append(Bucket(lo, hi, m, float(y[sel].mean()) if m else float("nan"),
                              float(st[sel].mean()) if m else float("nan")))
    slope, se, icpt = ols(pos.astype(np.float64), y)
    return DriftProfile(tuple(buckets), slope * 1000, se * 1000, icpt, n_pos, int(y.size), curve,
                        st_curve)


@dataclass(frozen=True, slots=True)
class Drift:
    """Fails when KL grows faster than ``max_slope_per_1k`` nats per 1000 positions.

    Needs at least ``min_positions`` aligned positions to judge (fewer: ``skip``).
    """

    key = "drift"
    needs_scores = True
    max_slope_per_1k: float = param(1e-3, "number", "bar on the KL slope (nats per 1000 positions)")
    max_growth: float | None = param(None, "number", "bar on last-bucket / first-bucket mean KL")
    buckets: tuple[int, ...] = param(list(DEFAULT_EDGES), "edges", "position bucket edges")
    min_positions: int = param(64, "int", "fewer aligned positions: not judged")
    mode: ModeWish = param("auto", "choice", MODE_HELP, MODES)
    decode: Callable[[Sequence[int]], str] | None = None

    def _kl(self) -> KL:
        return KL(mode=self.mode, decode=self.decode)

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        m = self._kl().measure(oracle, candidate, case)
        if isinstance(m, Verdict):
            return Verdict(case.id, self.key, m.status, m.summary, m.detail, m.evidence)
        a, rows = m
        return self.judge(case.id, [rows], note=a.alignment)

    def compare_run(self, oracles: Sequence[Output], candidates: Sequence[Output],
                    cases: Sequence[Case]) -> Verdict:
        kl = self._kl()
        measured = [kl.measure(o, c, case) for o, c, case in zip(oracles, candidates, cases, strict=True)]
        ok = [m for m in measured if not isinstance(m, Verdict)]
        if not ok:
            return Verdict(RUN, self.key, "error", "no case could be measured")
        aligns = sorted({a.alignment for a, _ in ok})
        return self.judge(RUN, [r for _, r in ok], note=aligns[0] if len(aligns) == 1 else "mixed")

    def profile(self, rows: Sequence[KLRows]) -> DriftProfile:
        return drift_profile([r.kl for r in rows], [r.same_top for r in rows], self.buckets)

    def judge(self, case_id: str, rows: Sequence[KLRows], note: str = "") -> Verdict:
        p = self.profile(rows)
        ev: dict[str, Any] = {**p.to_json(), "alignment": note, "mode": rows[0].mode if rows else "",
                              "bars": {"max_slope_per_1k": self.max_slope_per_1k,
                                       "max_growth": self.max_growth}}
        if p.positions < self.min_positions:
            return Verdict(case_id, self.key, "skip",
                           f"only {p.positions} positions (< {self.min_positions}): no slope to judge",
                           evidence=ev)
        head = f"slope {p.slope_per_1k:.3g} ± {p.slope_se_per_1k:.1g} nats/1k over {p.positions} pos"
        breaches = []
        if not p.slope_per_1k <= self.max_slope_per_1k:
            breaches.append(f"slope {p.slope_per_1k:.3g} > {self.max_slope_per_1k:.3g} nats/1k")
        if self.max_growth is not None and not p.growth <= self.max_growth:
            breaches.append(f"growth last/first bucket {p.growth:.3g} > {self.max_growth:.3g}")
        if not breaches:
            return Verdict(case_id, self.key, "pass", f"drift pass: {head}", evidence=ev)
        detail = "\n".join([f"{case_id}: drift FAIL — {'; '.join(breaches)}", *("  " + x for x in p.lines()),
                            "  the error grows with the decoded length: the mean KL alone would hide it"])
        return Verdict(case_id, self.key, "fail", f"drift FAIL: {'; '.join(breaches)}", detail=detail,
                       evidence=ev)


def plant_drift_ramp(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Lower the top-1 logprob by a ramp, 0 at the first position to d at the last: KL grows."""
    r = top_rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    n = min(len(oracle.token_ids), len(r[1]))
    if n < int(comp.min_positions):
        return f"{n} positions, fewer than the {comp.min_positions} drift needs"

    def slope(kl: np.ndarray) -> float:
        return float(np.polyfit(np.arange(n), kl, 1)[0]) * 1000

    return lower_top1_until(oracle, np.arange(n) / (n - 1), slope, max(float(comp.max_slope_per_1k), 0.0),
                            "slope (nats/1k)")


UNIT = Unit(Drift, "growth of KL with position (slope per 1000 tokens)", needs=LOGPROBS, across_devices="bar",
            controls=ControlSet(needs=Needs(logprobs=True, min_k=2), mutations=(
                Mutation("KL ramp above slope bar", "fail", plant_drift_ramp),
                Mutation("unperturbed copy", "pass", plant_identity),
            )))
