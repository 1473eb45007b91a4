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
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if curves:
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
