"""Goodness of fit of drawn tokens to a reference distribution, with its power stated.

A test of ``n`` draws against a reference ``q`` (tokens outside its support are the support
check's business, not this module's):

* **cells** (:func:`cells_for`): every token with ``n * q >= min_expected`` is a cell of its own
  (at most ``max_cells - 1`` of them, most likely first); the rest of the support is pooled into one
  cell, itself merged into the smallest kept cell when its expected count is below
  ``min_expected``. Three or more cells: **Pearson's chi-square**. Its p-value is the chi-square
  approximation's when that is at least :data:`MC_BELOW`, else a **Monte Carlo exact** one
  (``(1 + #{X^2_null >= X^2}) / (M + 1)`` over ``M`` multinomial draws from the reference cells,
  seeded by the cells): at Holm's levels (1e-4 and below) the approximation's tail is too light —
  measured 1.3x to 33x too many rejections for cells of expected count 5 to 50 — so it never
  decides a rejection.
  Fewer (a nearly deterministic position, or ``n`` too small for three cells of ``min_expected``):
  the **exact binomial test** of the most likely cell against the rest (two-sided, the outcomes no
  more likely than the observed one). One token in the support: nothing to fit.
* **Holm** (:func:`holm`) over every test of a gate controls the family-wise error rate at ``alpha``.
* **Detectable TV** (:func:`detectable_tv`): the smallest total-variation distance *between the
  cell distributions* at which every alternative is rejected with probability ``power`` at the
  Bonferroni level ``alpha / m`` (Holm's first step, so a lower bound on Holm's power).
  Chi-square: by the noncentral chi-square, ``lambda = n * chi2(q_alt || q)``, and
  ``chi2(q_alt || q) >= 4 TV^2`` for every alternative (Cauchy-Schwarz; equality when the shift is
  proportional to ``q`` on a half of the mass), so ``TV* = sqrt(lambda* / 4n)`` where
  ``P(chi2_{k-1}(lambda*) > crit) = power``, with ``crit`` the *exact* (Monte Carlo) critical
  value of the test when it exceeds the asymptotic one; checked by simulation in the tests.
  Binomial: exact, from the rejection region.
* **Power against a given alternative** (:func:`power_against`): simulated (:data:`POWER_DRAWS`
  multinomial draws of the alternative's cell masses against the exact critical value; the
  noncentral chi-square overstates it for a far alternative) or the exact binomial sum; with mass
  outside the support, at least the probability that one draw of ``n`` lands there (the support
  check fails on it).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import optimize, stats

from harness.kinds.sampling.settings import MAX_CELLS, MIN_EXPECTED

Method = Literal["chi2", "binomial", "none"]

POWER_DRAWS = 4000
"""Multinomial draws from a given alternative that its stated power is counted over."""
MC_BELOW = 0.05
"""An asymptotic p-value below this is replaced by the Monte Carlo one (above it, no Holm threshold
of a family at alpha <= 0.01 is anywhere near)."""


@dataclass(frozen=True, slots=True, eq=False)
class Cells:
    """A partition of a reference's support for a test of ``n`` draws."""

    members: tuple[np.ndarray, ...]
    """Token ids of each cell (the last one may be the pooled rest)."""
    probs: np.ndarray
    """[k] float64: the reference mass of each cell (sums to 1)."""
    method: Method
    n: int

    @property
    def k(self) -> int:
        return len(self.members)

    def observed(self, counts: np.ndarray) -> np.ndarray:
        """[k] draws per cell, from per-token ``counts`` (a [V] array)."""
        return np.array([counts[m].sum() for m in self.members], np.float64)


def cells_for(
    q: np.ndarray,
    n: int,
    min_expected: float = MIN_EXPECTED,
    max_cells: int = MAX_CELLS,
    ranked: np.ndarray | None = None,
) -> Cells:
    """The cells a test of ``n`` draws against ``q`` uses (see the module doc); ``ranked``: the
    support of ``q``, most likely first, when the caller has it."""
    q = np.asarray(q, np.float64)
    if ranked is None:
        support = np.flatnonzero(q > 0)
        support = support[np.argsort(-q[support], kind="stable")]
    else:
        support = np.asarray(ranked)
    if support.size <= 1 or n <= 0:
        return Cells((support,), np.array([1.0]), "none", n)
    big = int(np.sum(n * q[support] >= min_expected))
    big = min(big, max(max_cells - 1, 1))
    members = [support[i : i + 1] for i in range(big)]
    rest = support[big:]
    if rest.size:
        if n * q[rest].sum() >= min_expected or not members:
            members.append(rest)
        else:
            members[-1] = np.concatenate([members[-1], rest])
    if len(members) < 3:  # too few cells for chi-square: the most likely token against the rest
        members = [support[:1], support[1:]]
        method: Method = "binomial"
    else:
        method = "chi2"
    probs = np.array([q[m].sum() for m in members])
    return Cells(tuple(members), probs / probs.sum(), method, n)


@dataclass(frozen=True, slots=True)
class Fit:
    """One goodness-of-fit test."""

    method: Method
    n: int
    cells: int
    p: float
    stat: float | None
    df: int | None
    observed_tv: float
    """TV between the observed cell frequencies and the reference cell masses (sampling noise
    included: about ``sqrt(k / (2 pi n))`` under the null)."""
    calibration: str = ""
    """``asymptotic``, ``monte carlo (M draws)`` or ``exact``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "n": self.n,
            "cells": self.cells,
            "p": self.p,
            "stat": self.stat,
            "df": self.df,
            "observed_tv": self.observed_tv,
            "calibration": self.calibration,
        }


def pearson(obs: np.ndarray, n: int, probs: np.ndarray) -> np.ndarray:
    """X^2 of each row of ``obs`` (cell counts) against ``n * probs``."""
    exp = n * probs
    return (((obs - exp) ** 2) / exp).sum(axis=-1)


_NULLS: dict[tuple[int, bytes, int], np.ndarray] = {}


def null_draws(level: float) -> int:
    """Monte Carlo draws for a test judged at ``level``: 20 or more beyond the critical value."""
    return max(20_000, math.ceil(20.0 / max(level, 1e-7)))


def null_sample(cells: Cells, m: int) -> np.ndarray:
    """[m] sorted X^2 of multinomial draws from the cells (seeded by the cells: deterministic);
    kept for the process, so every repetition of a test reuses it."""
    key = (cells.n, np.round(cells.probs, 12).tobytes(), m)
    got = _NULLS.get(key)
    if got is None:
        seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        parts = []
        for lo in range(0, m, 50_000):
            obs = rng.multinomial(cells.n, cells.probs, size=min(50_000, m - lo))
            parts.append(pearson(obs, cells.n, cells.probs).astype(np.float32))
        got = np.sort(np.concatenate(parts))
        if len(_NULLS) > 512:
            _NULLS.pop(next(iter(_NULLS)))
        _NULLS[key] = got
    return got


def exact_critical(cells: Cells, level: float) -> float:
    """The Monte Carlo critical value of the chi-square test at ``level`` (the larger of it and the
    asymptotic one)."""
    null = null_sample(cells, null_draws(level))
    i = min(len(null) - 1, math.ceil((1.0 - level) * (len(null) + 1)) - 1)
    return max(float(null[i]), float(stats.chi2.isf(level, cells.k - 1)))


def fit(cells: Cells, counts: np.ndarray, level: float = 1e-4) -> Fit:
    """Test per-token ``counts`` (their total must be ``cells.n``) against ``cells``; ``level``: the
    smallest level the p-value may be compared at (sizes the Monte Carlo)."""
    obs = cells.observed(counts)
    n = int(obs.sum())
    if n != cells.n:
        raise ValueError(f"the cells were made for {cells.n} draws, the counts hold {n}")
    tv = 0.5 * float(np.abs(obs / max(n, 1) - cells.probs).sum())
    if cells.method == "none" or n == 0:
        return Fit("none", n, cells.k, 1.0, None, None, tv, "exact")
    if cells.method == "binomial":
        p = float(binomial_pvalues(n, float(cells.probs[0]))[int(obs[0])])
        return Fit("binomial", n, 2, p, float(obs[0]), None, tv, "exact")
    x2 = float(pearson(obs, n, cells.probs))
    df = cells.k - 1
    p = float(stats.chi2.sf(x2, df))
    if p >= MC_BELOW:
        return Fit("chi2", n, cells.k, p, x2, df, tv, "asymptotic")
    null = null_sample(cells, null_draws(level))
    beyond = len(null) - int(np.searchsorted(null, np.float32(x2) * np.float32(1 - 1e-6), side="left"))
    return Fit(
        "chi2", n, cells.k, (1 + beyond) / (len(null) + 1), x2, df, tv, f"monte carlo ({len(null)} draws)"
    )


def holm(pvalues: Sequence[float], alpha: float) -> tuple[list[bool], list[float]]:
    """(rejected, adjusted p) by Holm's step-down procedure at family-wise level ``alpha``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return [a <= alpha for a in adjusted], adjusted


# ---------------------------------------------------------------------------------------------
# power


@lru_cache(maxsize=4096)
def noncentrality(df: int, crit: float, power: float) -> float:
    """lambda* with ``P(chi2_df(lambda*) > crit) = power``."""
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 1e-9, 1e6))


@lru_cache(maxsize=4096)
def _binomial_region(n: int, p0: float, level: float) -> np.ndarray:
    return np.flatnonzero(binomial_pvalues(n, p0) <= level)


def binomial_pvalues(n: int, p0: float) -> np.ndarray:
    """[n + 1] two-sided exact p-values of every outcome (scipy's ``binomtest`` rule: the outcomes
    no more likely than the observed one, with a relative slack of 1e-7)."""
    pmf = stats.binom.pmf(np.arange(n + 1), n, p0)
    order = np.sort(pmf)
    cum = np.cumsum(order)
    idx = np.searchsorted(order, pmf * (1 + 1e-7), side="right") - 1
    return np.minimum(1.0, cum[np.maximum(idx, 0)])


def binomial_power(n: int, p0: float, p1: float, level: float) -> float:
    region = _binomial_region(n, round(p0, 12), level)
    return float(stats.binom.pmf(region, n, p1).sum()) if region.size else 0.0


def detectable_tv(cells: Cells, level: float, power: float, exact: bool = True) -> float:
    """The smallest TV (between cell distributions) beyond which every alternative is rejected
    with probability ``power`` at ``level``; 1.0 when none can be (a test with nothing to fit).
    ``exact`` False: with the asymptotic critical value (cheap; what planning searches with).
    Binomial: the larger side's, where a side none of whose alternatives is caught counts as its
    whole room (``p0`` below, ``1 - p0`` above)."""
    n = cells.n
    if cells.method == "none" or n <= 0:
        return 1.0
    if cells.method == "chi2":
        crit = exact_critical(cells, level) if exact else float(stats.chi2.isf(level, cells.k - 1))
        return min(1.0, math.sqrt(noncentrality(cells.k - 1, round(crit, 6), power) / (4.0 * n)))
    p0 = float(cells.probs[0])
    worst = 0.0
    for side, room in ((-1.0, p0), (1.0, 1.0 - p0)):
        if room <= 0:
            continue
        if binomial_power(n, p0, p0 + side * room, level) < power:
            worst = max(worst, room)  # even the farthest alternative on this side is missed
            continue
        lo, hi = 0.0, room
        for _ in range(30):  # power grows with the distance (up to the test's discreteness)
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if binomial_power(n, p0, p0 + side * mid, level) >= power else (mid, hi)
        worst = max(worst, hi)
    return worst


def power_against(
    cells: Cells, q: np.ndarray, alt: np.ndarray, level: float, outside: np.ndarray | None = None
) -> float:
    """The probability that a test of ``cells.n`` draws from ``alt`` fails at ``level``: the fit's
    (noncentral chi-square / exact binomial, on ``alt`` restricted to the support of ``q``), or the
    support check's ``1 - (1 - m)^n`` for ``alt``'s mass ``m`` on ``outside`` (default: where
    ``q`` is 0), whichever is larger."""
    alt = np.asarray(alt, np.float64)
    out_mask = (np.asarray(q) <= 0) if outside is None else outside
    m_out = float(alt[out_mask].sum())
    n = cells.n
    p_support = 1.0 - (1.0 - m_out) ** n if m_out > 0 else 0.0
    if cells.method == "none" or n <= 0 or m_out >= 1.0:
        return p_support
    a = np.array([alt[m].sum() for m in cells.members])
    a = a / a.sum() if a.sum() > 0 else a
    n_in = max(1, int(round(n * (1.0 - m_out))))
    if cells.method == "binomial":
        p_fit = binomial_power(n_in, float(cells.probs[0]), float(a[0]), level)
    else:
        # simulated, not the noncentral chi-square: a planted fault is no local alternative (a cell
        # whose mass quadruples has four times the variance the approximation assumes)
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(a.tobytes()).digest()[:8], "little"))
        crit = exact_critical(cells, level)
        p_fit = float((pearson(rng.multinomial(n_in, a, size=POWER_DRAWS), n_in, cells.probs) > crit).mean())
    return max(p_support, p_fit)


def draws_for(
    q: np.ndarray,
    target_tv: float,
    level: float,
    power: float,
    *,
    cap: int,
    min_expected: float = MIN_EXPECTED,
    max_cells: int = MAX_CELLS,
    floor: int = 20,
) -> int:
    """The fewest draws (``cap`` at most) whose test against ``q`` detects ``target_tv`` by the
    asymptotic critical value, with the tokens that make up half the mass in cells of their own."""
    support = int(np.count_nonzero(q > 0))
    if support <= 1:  # nothing to fit: enough draws for the support check to see a leak
        return min(cap, max(1, math.ceil(math.log(1 - power) / math.log(1 - target_tv))))
    # and enough for the fit to see the likely tokens one by one: cells of their own until they hold
    # half the mass (the TV a test detects is between its cells: a shift inside the pooled rest is
    # invisible to it)
    top = np.sort(q[q > 0])[::-1]
    j = min(int(np.searchsorted(np.cumsum(top), 0.5)) + 1, max_cells - 1, support - 1)
    floor = max(floor, min(cap, math.ceil(min_expected / top[j - 1])))

    def ok(n: int) -> bool:
        return detectable_tv(cells_for(q, n, min_expected, max_cells), level, power, exact=False) <= target_tv

    if ok(floor):
        return floor
    hi = floor
    while hi < cap and not ok(hi):
        hi = min(cap, hi * 2)
    if not ok(hi):
        return cap
    lo = hi // 2
    while hi - lo > max(1, hi // 50):  # within 2 %: the cells change with n, so not exactly monotone
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """The exact two-sided confidence interval of a rate ``k / n``."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf((1 - conf) / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - (1 - conf) / 2, k + 1, n - k))
    return lo, hi
