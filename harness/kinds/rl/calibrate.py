"""Bars calibrated on a model's own floor: from independent step-0 measurements (the draws of a
calibration run, ``[rl_sync] draws``), each bar is ``MARGIN`` times the worst draw's distance from a
perfect pair, rounded up to two significant digits.

The distance of a figure from a perfect pair is the figure itself for the errors and differences,
``token_mult_prob_error - 1`` for that ratio and ``1 - r`` for the Pearson correlation. Step 0 is
the checkpoint, before any update: what it measures is the pair's rounding (the bfloat16 floor), not
a fault of the update path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.kinds.rl.settings import BAR_KEYS

MARGIN = 3.0
"""Over the worst step-0 draw: the clean bfloat16 run on tiny-llama wandered up to 1.84x its step-0
figure over the later steps with no fault; 3x sits past that and under the growth bar (4x)."""
MIN_DRAWS = 3
PERFECT = {"token_mult_prob_error": 1.0, "probs_pearson": 1.0}
"""A figure's value for a perfect pair where it is not 0."""


def distance(key: str, value: float) -> float:
    return abs(float(value) - PERFECT.get(key, 0.0))


def figure(draw: Mapping[str, float], key: str) -> float:
    """One figure of a draw; ``frac_masked`` from its counts where the draw predates the figure."""
    if key == "frac_masked" and key not in draw:
        bad = float(draw.get("support_mismatch", 0))
        return bad / (float(draw.get("tokens", 0)) + bad) if bad else 0.0
    return float(draw[key])


def _ceil2(x: float) -> float:
    """``x`` rounded up to two significant digits (0 stays 0)."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(round(x / 10**e, 9)) * 10**e:.3g}")


def draw_figures(
    rollout: Sequence[np.ndarray], trainer: Sequence[np.ndarray], draws: int
) -> list[dict[str, float]]:
    """The figures of each draw: the sequences, in case order, cut into ``draws`` equal parts."""
    from harness.kinds.rl.judge import metrics

    n = len(rollout)
    if draws < 1 or n % draws:
        raise ValueError(f"{n} sequences do not split into {draws} draws of equal size")
    size = n // draws
    return [metrics(rollout[i : i + size], trainer[i : i + size]) for i in range(0, n, size)]


def calibrated_bars(draws: Sequence[Mapping[str, float]], margin: float = MARGIN) -> dict[str, float]:
    """Each bar: ``margin`` x the largest distance over the draws, rounded up (see the module)."""
    if len(draws) < MIN_DRAWS:
        raise ValueError(f"{len(draws)} step-0 draws; the rule needs at least {MIN_DRAWS}")
    out = {}
    for key in BAR_KEYS:
        worst = max(distance(key, figure(d, key)) for d in draws)
        d = _ceil2(margin * worst)
        out[key] = 1.0 - d if key == "probs_pearson" else PERFECT.get(key, 0.0) + d
    return out


def bars_from_record(record: Mapping[str, Any], margin: float = MARGIN) -> tuple[str, dict[str, float], list]:
    """(model, bars, the draws' figures) from a calibration run's record (``extra.rl.calibration``)."""
    cal = (record.get("extra") or {}).get("rl", {}).get("calibration")
    if not cal:
        raise ValueError(
            "the record holds no step-0 draws (extra.rl.calibration): run a suite with [rl_sync] draws"
        )
    if "error" in cal:
        raise ValueError(f"the record's step-0 draws could not be measured: {cal['error']}")
    broken = [
        v.get("summary", "")
        for v in record.get("verdicts") or ()
        if v.get("comparator") == "rl_sync" and v.get("case_id") == "step0" and v.get("status") != "pass"
    ]
    if broken:
        raise ValueError(f"step 0 of the calibration run failed its sanity bars: {broken[0]}")
    draws = cal["draws"]
    return str(record["model"]["name"]), calibrated_bars(draws, margin), draws


def toml_table(
    model: str,
    bars: Mapping[str, float],
    draws: Sequence[Mapping[str, float]],
    source: str,
    margin: float = MARGIN,
) -> str:
    """The ``[rl_sync.model_bars."<model>"]`` table, each bar with the draws it came from."""
    head = f"{margin:g} x the worst of {len(draws)} step-0 draws, {source}"
    lines = [f'[rl_sync.model_bars."{model}"]    # {head}']
    for key, bar in bars.items():
        seen = ", ".join(f"{figure(d, key):.4g}" for d in draws)
        lines.append(f"{key} = {bar:.6g}    # draws: {seen}")
    return "\n".join(lines)
