"""``harness trend FEATURE [--metric kl.mean]``: one metric of one FEATURES.md row across the commits
of the history, so a maintainer sees when a regression entered.

The points come from the records dataset (:func:`harness.records.frame`): for each record of the
row's suite, models and candidate columns, the metric's value — from the run-level verdict
(``kl.mean``, ``drift.slope_per_1k``) when the comparator has one, else the mean over cases, or
``<comparator>.pass_rate`` (share of cases passing) — plotted against the record's position in
HEAD's history. Records whose SHA is not in the history here (an unmerged branch, a shallow clone)
or that ran on uncommitted changes are listed, not plotted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.features import Judge, load_catalog, load_records
from harness.features.catalog import CATALOG, Row
from harness.features.sources import spec_matches
from harness.plots import _pyplot
from harness.records import frame
from harness.registry import unknown
from harness.workspace import Workspace

RUN = "(run)"
DEFAULT_METRIC = {"kl": "kl.mean", "drift": "drift.slope_per_1k", "nmse": "nmse.nmse"}


def default_metric(row: Row) -> str:
    first = row.prove[0]
    return DEFAULT_METRIC.get(first, f"{first}.pass_rate")


@dataclass(frozen=True, slots=True)
class Point:
    series: str
    """``model · column title``."""
    commit_order: int | None
    sha: str
    created: str
    value: float
    record: str


@dataclass(frozen=True, slots=True)
class Trend:
    feature: str
    metric: str
    points: tuple[Point, ...]
    """In the history, oldest first."""
    outside: tuple[tuple[Point, str], ...]
    """Records not plotted, with why: a SHA not in HEAD's history here, or uncommitted changes."""
    png: Path | None


def _value(rows: Any, metric: str) -> float | None:
    comp, _, key = metric.partition(".")
    mine = rows[rows["comparator"] == comp]
    if mine.empty:
        return None
    if key == "pass_rate":
        cases = mine[mine["case"] != RUN]
        return float((cases["status"] == "pass").mean()) if len(cases) else None
    if metric not in rows.columns:
        return None
    run = mine[mine["case"] == RUN][metric].dropna()
    vals = run if len(run) else mine[metric].dropna()
    return float(vals.mean()) if len(vals) else None


def trend(ws: Workspace, feature: str, metric: str | None = None, column: str | None = None,
          out: Path | None = None) -> Trend:
    """The points of ``metric`` for the row ``feature``, and a PNG of them (``out``, default
    ``reports/trends/<feature>.<metric>.png``)."""
    cat = load_catalog(ws.root / CATALOG, ws)
    row = cat.row(feature)
    metric = metric or default_metric(row)
    cols = list(cat.columns)
    if column is not None:
        cols = [c for c in cols if c.key == column]
        if not cols:
            raise unknown("column", column, [c.key for c in cat.columns])
    records, broken = load_records(ws)
    judge = Judge(ws, cat, records, broken)
    paths = {lr.record.id: ws.root / lr.path for m in row.models for lr in judge.matching(row, m, None)}
    df = frame(ws.records, ws.root, iter(paths.values()))
    known = sorted({c for c in df.columns if "." in c} | {f"{c}.pass_rate" for c in row.prove})
    if df.empty or not ({metric} & set(known)):
        raise unknown(f"metric of {feature}", metric, known or [f"{c}.pass_rate" for c in row.prove])
    found = []
    for rid, rows in df.groupby("record", sort=False):
        first = rows.iloc[0]
        col = next((c for c in cols if spec_matches(str(first["candidate"]), row.spec(c))), None)
        value = _value(rows, metric)
        if col is None or value is None:
            continue
        order = first["commit_order"]
        found.append((Point(f"{first['model']} · {col.title}", None if order != order else int(order),
                            str(first["sha"]), str(first["created"]), value, str(rid)), bool(first["dirty"])))
    return _trend(ws, feature, metric, found, out, f"{feature}.{_safe(metric)}.png",
                  f"{feature}: {metric} across commits ({row.suite}, {', '.join(row.models)})")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _trend(ws: Workspace, feature: str, metric: str, found: Sequence[tuple[Point, bool]],
           out: Path | None, name: str, title: str) -> Trend:
    """Points on HEAD's history from clean trees, in commit order, plotted; the rest set aside
    with why."""
    points, outside = [], []
    for p, dirty in found:
        if p.commit_order is None:
            outside.append((p, "its SHA is not in HEAD's history here"))
        elif dirty:
            outside.append((p, "it ran on uncommitted changes"))
        else:
            points.append(p)
    points.sort(key=lambda p: (p.commit_order, p.created))
    png = plot(points, out or ws.root / "reports" / "trends" / name, title, metric) if points else None
    return Trend(feature, metric, tuple(points), tuple(outside), png)


def plot(points: Sequence[Point], path: Path, title: str, metric: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    orders = sorted({p.commit_order for p in points if p.commit_order is not None})
    for series in sorted({p.series for p in points}):
        mine = [p for p in points if p.series == series]
        ax.plot([p.commit_order for p in mine], [p.value for p in mine], marker="o", label=series)
    ax.set_xticks(orders)
    ax.set_xticklabels([next(p.sha[:7] for p in points if p.commit_order == o) for o in orders],
                       rotation=45, ha="right", fontsize=8)
    values = [p.value for p in points]
    if metric.startswith(("kl.", "nmse.")) and min(values) > 0 and max(values) / min(values) > 100:
        ax.set_yscale("log")
    ax.set_xlabel("commit (oldest left; position in HEAD's history)")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


BENCH = "bench:"
"""``harness trend bench:<figure>``: a performance figure of ``make bench`` across commits."""


def trend_bench(ws: Workspace, figure: str, metric: str | None = None, out: Path | None = None) -> Trend:
    """One figure of the bench records (``reports/bench/``) across the commits of the history:
    its ``ratio`` to its limit (default; what stays comparable between machines of one class) or its
    ``value``. One series per device class."""
    from harness import perf
    from harness.records import commit_order

    metric = metric or "ratio"
    if metric not in ("ratio", "value"):
        raise unknown(f"metric of bench figure {figure}", metric, ["ratio", "value"])
    df = perf.frame(ws.root / "reports" / "bench")
    names = sorted(set(df["figure"])) if len(df) else []
    if figure not in names:
        raise unknown("bench figure", figure, names or ["(no bench records: make bench)"])
    order = commit_order(ws.root)
    found = []
    for _, r in df[df["figure"] == figure].iterrows():
        value = r[metric]
        if value is None or value != value:
            continue
        found.append((Point(f"{r['device_class'] or 'unknown device'}", order.get(str(r["sha"])),
                            str(r["sha"]), str(r["created"]), float(value), str(r["id"])), bool(r["dirty"])))
    return _trend(ws, BENCH + figure, metric, found, out, f"bench.{_safe(figure)}.{metric}.png",
                  f"{figure}: {metric} across commits")
