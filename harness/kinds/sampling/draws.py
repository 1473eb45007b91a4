"""The draw budget of the sampling gate's tests, and the oracle's rows it is computed from.

A test judges the draws that follow the oracle's path (its first ``step`` tokens); a path of chance
``p_path`` needs more requests than judged draws (:func:`cover`). :func:`judged_draws` sizes a fit
of the setting's reference to detect ``target_tv``; the plan (:mod:`.plan`) and the control sites
(:mod:`.sites`) both size their draws with these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harness.api import Case
from harness.kinds.sampling import gof
from harness.kinds.sampling.settings import GateSettings
from harness.sampling.transforms import Reference


@dataclass(frozen=True, slots=True)
class OracleRows:
    """What the oracle established for one case: its greedy continuation and its raw logits."""

    case: Case
    greedy: tuple[int, ...]
    rows: Mapping[int, np.ndarray]
    """Position t -> [V] float32 raw logits predicting greedy[t] from prompt + greedy[:t]."""


MIN_JUDGED = 20
"""A test whose capped draws would follow the oracle's path fewer times than this is not drawn."""
PLAN_MARGIN = 1.1
"""Draws are planned by the asymptotic critical value, then 10 % more, then checked by the exact
(Monte Carlo) one and grown until it meets the target too. The judge states the exact detectable TV
of every test it judged."""


def judged_draws(ref: Reference, p_path: float, level: float, gs: GateSettings) -> tuple[int, int]:
    """(draws judged, draws requested) for a fit of ``ref`` to detect ``target_tv``; the requests
    cover the path's chance with 3.1 standard deviations to spare (the cap wins)."""
    n = gof.draws_for(
        ref.probs,
        gs.target_tv,
        level,
        gs.power,
        cap=gs.max_draws,
        min_expected=gs.min_expected,
        max_cells=gs.max_cells,
    )
    if int(np.count_nonzero(ref.probs > 0)) > 1:
        n = min(gs.max_draws, math.ceil(n * PLAN_MARGIN))
    for _ in range(4):  # the exact critical value may still want more: TV shrinks as 1/sqrt(n)
        cells = gof.cells_for(ref.probs, n, gs.min_expected, gs.max_cells, ref.ranked)
        if cells.method != "chi2" or n >= gs.max_draws:
            break
        d = gof.detectable_tv(cells, level, gs.power)
        if d <= gs.target_tv:
            break
        n = min(gs.max_draws, math.ceil(n * (d / gs.target_tv) ** 2 * 1.02))
    return cover(n, p_path, gs)


def cover(n: int, p_path: float, gs: GateSettings) -> tuple[int, int]:
    """(judged, requested): enough requests for ``n`` of them to follow a path of chance
    ``p_path`` (3.1 standard deviations to spare), or ``max_draws`` and what they judge."""
    n = min(n, gs.max_draws)
    if p_path >= 1.0:
        return n, n
    if p_path <= 0.0:
        return 0, gs.max_draws
    draws = math.ceil((n + 3.1 * math.sqrt(n * (1 - p_path))) / p_path)
    if draws > gs.max_draws:
        sd = math.sqrt(gs.max_draws * p_path * (1 - p_path))
        return max(1, int(gs.max_draws * p_path - 3.1 * sd)), gs.max_draws
    return n, draws
