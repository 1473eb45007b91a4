"""Pictures written beside a record: KL against position (drift), and the histogram of per-position KL.

Headless (matplotlib's Agg backend): no display needed, same bytes-for-bytes inputs give the same
picture. KL spans many orders of magnitude (1e-12 between two fp32 engines, 1e-1 for a 2-bit KV
cache), so both axes of KL are logarithmic, with values below :data:`FLOOR` drawn at the floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

FLOOR = 1e-12
"""KL values below this (including exact zeros) are drawn at this value."""


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average that ignores NaNs (positions no case reached)."""
    if window <= 1 or y.size < window:
        return y
    ok = ~np.isnan(y)
    k = np.ones(window)
    num = np.convolve(np.where(ok, y, 0.0), k, mode="same")
    den = np.convolve(ok.astype(float), k, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def kl_vs_position(curves: Mapping[str, np.ndarray], path: Path, title: str,
                   edges: Sequence[int] = (), slopes: Mapping[str, float] | None = None) -> Path:
    """One line per arm: mean KL at each position (faint) and its moving average (bold)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    longest = max((len(c) for c in curves.values()), default=0)
    window = max(1, longest // 64)
    for i, (label, curve) in enumerate(curves.items()):
        y = np.maximum(np.asarray(curve, np.float64), FLOOR)
        x = np.arange(len(y))
        color = f"C{i}"
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.6)
        slope = (slopes or {}).get(label)
        name = label + (f"  (slope {slope:.3g} nats/1k)" if slope is not None else "")
        ax.plot(x, smooth(y, window), color=color, linewidth=1.8, label=name)
    for e in edges:
        if 0 < e < longest:
            ax.axvline(e, color="grey", linestyle=":", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("generated position")
    ax.set_ylabel(f"KL(reference || arm), nats  (floor {FLOOR:g})")
    return _finish(plt, fig, ax, path, title, legend=bool(curves))


def _finish(plt, fig, ax, path: Path, title: str, legend: bool) -> Path:  # type: ignore[no-untyped-def]
    """Title, grid and legend of a log-scale line plot, written to ``path``."""
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def kld_histogram(values: Mapping[str, np.ndarray], path: Path, title: str) -> Path:
    """Histogram of log10 of every per-position KL, one series per arm."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.4), dpi=110)
    logs = {k: np.log10(np.maximum(np.asarray(v, np.float64), FLOOR)) for k, v in values.items()}
    allv = np.concatenate(list(logs.values())) if logs else np.empty(0)
    lo, hi = (float(allv.min()), float(allv.max())) if allv.size else (-12.0, 0.0)
    bins = np.linspace(lo, hi + 1e-9 if hi > lo else lo + 1, 60)
    for i, (label, v) in enumerate(logs.items()):
        ax.hist(v, bins=bins, alpha=0.55, color=f"C{i}",
                label=f"{label}  (n {v.size}, median {10 ** np.median(v):.3g})" if v.size else label)
    ax.set_xlabel("log10 KL per position (nats)")
    ax.set_ylabel("positions")
    ax.set_title(title, fontsize=10)
    if values:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


NMSE_FLOOR = 1e-18
"""NMSE values below this (two engines agreeing bit for bit give 0) are drawn at this value."""


def nmse_profile(curves: Mapping[str, tuple[Sequence[str], Sequence[float]]], path: Path, title: str,
                 bars: Mapping[str, float], marks: Mapping[str, str | None] | None = None) -> Path:
    """NMSE of each tapped tensor in model order (log scale), one line per case; horizontal lines at
    ``bars`` (label -> value, e.g. the bar and the floor), a ring where each case parts (``marks``:
    case -> tensor name)."""
    plt = _pyplot()
    names: list[str] = []
    for ns, _ in curves.values():
        names += [n for n in ns if n not in names]
    fig, ax = plt.subplots(figsize=(max(7.0, min(18.0, 0.28 * len(names) + 3)), 4.8), dpi=110)
    x_of = {n: i for i, n in enumerate(names)}
    for i, (label, (ns, vs)) in enumerate(curves.items()):
        xs = [x_of[n] for n in ns]
        ys = np.maximum(np.asarray(vs, np.float64), NMSE_FLOOR)
        ax.plot(xs, ys, marker=".", color=f"C{i}", linewidth=1.4, label=label)
        at = (marks or {}).get(label)
        if at in x_of and at in ns:
            ax.plot([x_of[at]], [ys[list(ns).index(at)]], marker="o", markersize=11, fillstyle="none",
                    color=f"C{i}")
    for j, (label, v) in enumerate(bars.items()):
        ax.axhline(v, color="grey", linestyle="--" if j == 0 else ":", linewidth=0.9)
        ax.annotate(f"{label} {v:g}", (0, v), fontsize=7, color="grey", va="bottom")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=7 if len(names) < 40 else 5)
    ax.set_ylabel(f"NMSE vs oracle (floor {NMSE_FLOOR:g})")
    return _finish(plt, fig, ax, path, title, legend=bool(curves))
