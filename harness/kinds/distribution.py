"""The distribution half of a gate: scores in; run-level KL / drift / NMSE verdicts, the KL table,
the drift profile and the pictures out.

The gate (and the A/B gate) call this once per run. Per-case verdicts come from the comparators'
``compare``; the run-level ones (case ``(run)``, all positions of all cases pooled) from their
``compare_run``. Every table line says the capture mode (full-vocab / top-k+rest) and how the
positions were aligned (teacher-forced / until first divergence).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Case, Comparator, Output, Verdict
from harness.compare.drift import DEFAULT_EDGES, Drift, DriftProfile, drift_profile
from harness.compare.kernels.aligned import align
from harness.compare.kl import KL, KLRows, KLStats, ModeWish, kl_rows, kl_stats

FIGURES = {"kl_vs_position": "KL against position (drift)", "kld_histogram": "per-position KL histogram"}
"""Figure key -> what it shows; files are ``<record id>.<key>.png`` beside the record."""


@dataclass(frozen=True, slots=True, eq=False)
class ArmFacts:
    """The distribution facts of one arm against its reference."""

    label: str
    stats: KLStats
    drift: DriftProfile
    values: np.ndarray
    """Every per-position KL of every case (for the histogram)."""
    unmeasured: tuple[str, ...] = ()
    """Cases that could not be lined up (missing logprobs, engine error)."""

    def to_json(self) -> dict[str, Any]:
        return {"kl": self.stats.to_json(), "drift": self.drift.to_json(),
                "unmeasured": list(self.unmeasured)}

    def lines(self) -> list[str]:
        head = [f"[{self.label}]"] + self.stats.lines() + self.drift.lines()
        if self.unmeasured:
            head.append(f"  not measured: {', '.join(self.unmeasured)}")
        return head


def measure_arm(label: str, oracles: Mapping[str, Output], others: Mapping[str, Output],
                cases: Sequence[Case], mode: ModeWish = "auto",
                edges: Sequence[int] = DEFAULT_EDGES) -> ArmFacts:
    """KL statistics and drift profile of ``others`` against ``oracles`` over ``cases``."""
    rows: list[KLRows] = []
    aligns: list[str] = []
    bad: list[str] = []
    for case in cases:
        o, c = oracles.get(case.id), others.get(case.id)
        if o is None or c is None or o.error or c.error:
            bad.append(case.id)
            continue
        try:
            a = align(o, c, case.id)
            rows.append(kl_rows(a, mode))
            aligns.append(a.alignment)
        except ValueError:
            bad.append(case.id)
    prof = drift_profile([r.kl for r in rows], [r.same_top for r in rows], edges)
    values = np.concatenate([r.kl for r in rows]) if rows else np.empty(0)
    return ArmFacts(label, kl_stats(rows, aligns), prof, values, tuple(bad))


@dataclass(frozen=True, slots=True, eq=False)
class Distribution:
    verdicts: tuple[Verdict, ...]
    """Run-level verdicts (case ``(run)``) of the suite's distribution comparators."""
    arms: tuple[ArmFacts, ...]
    how: str
    edges: tuple[int, ...] = DEFAULT_EDGES
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"how": self.how, "arms": {a.label: a.to_json() for a in self.arms},
                "lines": self.lines(), **dict(self.extra)}

    def lines(self) -> list[str]:
        out = [f"positions aligned: {self.how}"]
        for a in self.arms:
            out += a.lines()
        return out

    def summary(self) -> str:
        if not self.arms:
            return ""
        a = self.arms[0]
        return (f"KL mean {a.stats.mean:.3g} p99 {a.stats.p99:.3g} ({a.stats.mode}), drift "
                f"{a.drift.slope_per_1k:.3g} nats/1k")

    def write_figures(self, folder: Path, stem: str, title: str) -> list[Path]:
        """The PNGs beside the record: ``<stem>.kl_vs_position.png`` and ``<stem>.kld_histogram.png``."""
        from harness.plots import kl_vs_position, kld_histogram

        curves = {a.label: a.drift.curve for a in self.arms}
        slopes = {a.label: a.drift.slope_per_1k for a in self.arms}
        modes = ", ".join(sorted({a.stats.mode for a in self.arms}))
        full = f"{title}\n{modes}, {self.how}"
        return [kl_vs_position(curves, folder / f"{stem}.kl_vs_position.png", full, self.edges, slopes),
                kld_histogram({a.label: a.values for a in self.arms},
                              folder / f"{stem}.kld_histogram.png", full)]


def wants_scores(comparators: Iterable[Comparator]) -> bool:
    """True when some comparator judges the candidate's scores of the oracle's sequences."""
    return any(c.needs_scores for c in comparators)


def judge_run(comparators: Sequence[Comparator], cases: Sequence[Case], oracles: Mapping[str, Output],
              scores: Mapping[str, Output], how: str, label: str = "candidate") -> Distribution | None:
    """Run-level verdicts and facts for the distribution comparators among ``comparators``."""
    dist: list[Any] = [c for c in comparators if c.needs_scores]
    if not dist:
        return None
    present = [c for c in cases if c.id in oracles]
    missing = Output("", (), error="candidate returned no score")
    o = [oracles[c.id] for c in present]
    s = [scores.get(c.id) or missing for c in present]
    verdicts = tuple(comp.compare_run(o, s, present) for comp in dist)
    mode = next((c.mode for c in dist if isinstance(c, KL)),
                next((c.mode for c in dist if isinstance(c, Drift)), "auto"))
    edges = next((tuple(c.buckets) for c in dist if isinstance(c, Drift)), DEFAULT_EDGES)
    arm = measure_arm(label, oracles, scores, present, mode, edges)
    return Distribution(verdicts, (arm,), how, edges)
