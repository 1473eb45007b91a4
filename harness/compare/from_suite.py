"""Suite tables -> the distribution comparators (kl, drift, nmse), with their parameters checked.

These comparators need the candidate's *score* of the oracle's sequence (``needs_scores``), and
besides the per-case ``compare`` they judge a whole run with ``compare_run`` (all positions pooled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.compare.drift import DEFAULT_EDGES, Drift
from harness.compare.kl import KL
from harness.compare.nmse import DEFAULT_MAX_NMSE, NMSE
from harness.registry import unknown

Decode = Callable[[Sequence[int]], str] | None

KL_PARAMS = ("max_mean", "max_p99", "max_max", "min_same_top", "mode")
DRIFT_PARAMS = ("max_slope_per_1k", "max_growth", "buckets", "min_positions", "mode")
NMSE_PARAMS = ("max_nmse",)
MODES = ("auto", "full", "topk")


def _check(name: str, p: Mapping[str, Any], allowed: Sequence[str]) -> None:
    for key in p:
        if key not in allowed:
            raise unknown(f"parameter of [compare.{name}]", key, allowed)
    mode = p.get("mode", "auto")
    if mode not in MODES:
        raise unknown(f"[compare.{name}] mode", str(mode), MODES)


def _opt(p: Mapping[str, Any], key: str) -> float | None:
    return None if p.get(key) is None else float(p[key])


def kl(p: Mapping[str, Any], decode: Decode) -> KL:
    _check("kl", p, KL_PARAMS)
    return KL(max_mean=float(p.get("max_mean", 1e-3)), max_p99=_opt(p, "max_p99"),
              max_max=_opt(p, "max_max"), min_same_top=_opt(p, "min_same_top"),
              mode=p.get("mode", "auto"), decode=decode)


def drift(p: Mapping[str, Any], decode: Decode) -> Drift:
    _check("drift", p, DRIFT_PARAMS)
    edges = p.get("buckets", DEFAULT_EDGES)
    if not (isinstance(edges, (list, tuple)) and edges and all(isinstance(e, int) and e >= 0 for e in edges)):
        raise ValueError(f"[compare.drift] buckets must be a list of position edges (ints >= 0), "
                         f"got {edges!r}")
    return Drift(max_slope_per_1k=float(p.get("max_slope_per_1k", 1e-3)),
                 max_growth=_opt(p, "max_growth"), edges=tuple(edges),
                 min_positions=int(p.get("min_positions", 64)), mode=p.get("mode", "auto"), decode=decode)


def nmse(p: Mapping[str, Any], decode: Decode) -> NMSE:
    _check("nmse", p, NMSE_PARAMS)
    return NMSE(max_nmse=float(p.get("max_nmse", DEFAULT_MAX_NMSE)), decode=decode)


def needs_scores(comparator: object) -> bool:
    """True for comparators that judge the candidate's score of the oracle's sequence."""
    return bool(getattr(comparator, "needs_scores", False))
