"""The fit's statistics: cells, exact binomial p-values, Holm, the null calibration at Holm's
levels (where the chi-square approximation is too light-tailed and the Monte Carlo p-value must
take over) and the stated power (simulated at the detectable TV, least favourable direction)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from harness.kinds.sampling import gof


def _q(seed: int = 0, v: int = 300, scale: float = 2.0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(v) * scale
    q = np.exp(x - x.max())
    return q / q.sum()


def test_binomial_pvalues_are_scipys() -> None:
    for n, p0 in ((20, 0.3), (100, 0.9), (57, 0.5), (400, 0.02)):
        ours = gof.binomial_pvalues(n, p0)
        theirs = np.array([stats.binomtest(k, n, p0).pvalue for k in range(n + 1)])
        assert np.allclose(ours, theirs, rtol=1e-9, atol=1e-15)


def test_cells_pool_the_rare_tokens() -> None:
    q = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])
    c = gof.cells_for(q, 100)  # expected 50, 30, 10, 5, 3, 2: four cells of their own, the rest 5
    assert c.method == "chi2" and [list(m) for m in c.members] == [[0], [1], [2], [3], [4, 5]]
    c = gof.cells_for(q, 60)  # 30, 18, 6, 3, 1.8, 1.2: the rest (6) stays a cell
    assert [list(m) for m in c.members] == [[0], [1], [2], [3, 4, 5]]
    c = gof.cells_for(q, 40)  # 20, 12, 4 ...: the rest (8) pooled; 3 cells
    assert [list(m) for m in c.members] == [[0], [1], [2, 3, 4, 5]]
    c = gof.cells_for(q, 12)  # 6, 3.6 ...: too few for chi-square: top token against the rest
    assert c.method == "binomial" and c.k == 2
    assert gof.cells_for(np.array([0.0, 1.0, 0.0]), 100).method == "none"
    assert gof.cells_for(_q(), 5000).k == gof.MAX_CELLS


def test_holm_by_hand() -> None:
    rej, adj = gof.holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rej == [True, False, False, True]


@pytest.mark.parametrize("n", [150, 1500])
def test_the_null_is_calibrated_at_holms_levels(n: int) -> None:
    """Draws from the reference itself: P(p <= a) <= a, within the simulation's error, at 0.05,
    0.01 and 1e-3, where Pearson's chi-square alone rejects up to several times too often (the
    Monte Carlo p-value decides below 0.05)."""
    q = _q(1)
    cells = gof.cells_for(q, n)
    rng = np.random.default_rng(2)
    reps = 4000
    ps, asym = np.empty(reps), np.empty(reps)
    for i in range(reps):
        counts = np.bincount(rng.choice(q.size, n, p=q), minlength=q.size)
        f = gof.fit(cells, counts, level=1e-3)
        ps[i] = f.p
        asym[i] = stats.chi2.sf(f.stat, f.df) if f.stat is not None else 1.0
    for a in (0.05, 0.01, 1e-3):
        hi = stats.binom.ppf(0.999, reps, a) / reps  # the rate a calibrated test stays under
        assert (ps <= a).mean() <= hi, f"n={n}: {(ps <= a).mean():.4f} of p-values <= {a}"


def test_the_monte_carlo_tail_is_heavier_than_the_chi_square() -> None:
    """Why the Monte Carlo p-value: the exact critical value at 1e-4 exceeds chi-square's."""
    cells = gof.cells_for(_q(3), 150)
    assert cells.method == "chi2"
    assert gof.exact_critical(cells, 1e-4) > stats.chi2.isf(1e-4, cells.k - 1)


def _least_favourable(cells: gof.Cells, tv: float) -> np.ndarray:
    """The alternative at ``tv`` with the smallest chi-square divergence: mass shifted in proportion
    to q from one half of the cells to the other (the Cauchy-Schwarz equality case, as near as the
    cells allow)."""
    c = cells.probs
    order = np.argsort(-c)
    half, acc = np.zeros(c.size, bool), 0.0
    for i in order:
        if acc + c[i] <= 0.5 + 1e-12 or not half.any():
            half[i] = True
            acc += c[i]
    a = c.copy()
    a[half] *= 1 + tv / c[half].sum()
    a[~half] *= 1 - tv / c[~half].sum()
    return a


@pytest.mark.parametrize("n", [300, 1200])
def test_the_detectable_tv_is_detected_with_the_stated_power(n: int) -> None:
    """Simulated: the least favourable alternative at the stated detectable TV is rejected at the
    level at least 90 % of the time (less 3 standard errors of the simulation)."""
    level, power = 0.01 / 40, 0.9
    cells = gof.cells_for(_q(4), n)
    tv = gof.detectable_tv(cells, level, power)
    alt = _least_favourable(cells, tv)
    rng = np.random.default_rng(5)
    reps = 400
    hits = 0
    for _ in range(reps):
        counts = np.zeros(300, np.int64)  # each cell's draws on its first token: the fit sums cells
        counts[[int(m[0]) for m in cells.members]] = rng.multinomial(n, alt)
        hits += gof.fit(cells, counts, level).p <= level
    se = np.sqrt(power * (1 - power) / reps)
    assert hits / reps >= power - 3 * se, f"n={n}: TV {tv:.3f} detected {hits}/{reps}"


def test_binomial_detectable_tv_is_exact() -> None:
    cells = gof.cells_for(np.array([0.9, 0.06, 0.04]), 60)
    assert cells.method == "binomial"
    level = 1e-3
    tv = gof.detectable_tv(cells, level, 0.9)
    p0 = float(cells.probs[0])
    powers = [gof.binomial_power(60, p0, p1, level) for p1 in (p0 - tv, p0 + tv) if 0 <= p1 <= 1]
    assert min(powers) >= 0.9 or tv >= 1 - p0  # the side above p0 may have no room to reach it
    assert gof.binomial_power(60, p0, p0 - 0.9 * tv, level) < 0.9


def test_power_against_counts_the_support_check() -> None:
    q = np.array([0.6, 0.4, 0.0])
    alt = np.array([0.59, 0.4, 0.01])  # 1 % outside the support
    cells = gof.cells_for(q, 500)
    assert gof.power_against(cells, q, alt, 1e-3) >= 1 - 0.99**500 - 1e-12


def test_draws_for_meets_the_target() -> None:
    q = _q(6)
    level = 0.01 / 50
    n = gof.draws_for(q, 0.1, level, 0.9, cap=50_000)
    assert gof.detectable_tv(gof.cells_for(q, n), level, 0.9, exact=False) <= 0.1
    assert gof.detectable_tv(gof.cells_for(q, int(n * 0.9)), level, 0.9, exact=False) > 0.1
    assert gof.draws_for(q, 0.001, level, 0.9, cap=3000) == 3000
