"""Task-accuracy thresholds: the arithmetic, and its error rates on synthetic scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.kinds.ab.stats import AccuracyTest, StatsError, accuracy_verdict, bernoulli_sigma, required_n, z


def test_threshold_and_mde_known_values() -> None:
    t = AccuracyTest(sigma=50.0, n=1000, alpha=0.05, beta=0.2)  # accuracy in percent points, p = 0.5
    assert t.scale == pytest.approx(math.sqrt(2 * 2500 / 1000))
    assert t.threshold == pytest.approx(1.6448536 * 2.2360680, rel=1e-6)
    assert t.mde == pytest.approx((1.6448536 + 0.8416212) * 2.2360680, rel=1e-6)
    assert t.passes(80.0, 80.0 - t.threshold + 1e-9) and not t.passes(80.0, 80.0 - t.threshold - 1e-9)


@given(st.floats(0.01, 50), st.floats(0.1, 20), st.sampled_from([0.01, 0.05, 0.1]),
       st.sampled_from([0.1, 0.2, 0.3]))
def test_required_n_reaches_the_asked_mde(sigma: float, mde: float, alpha: float, beta: float) -> None:
    n = required_n(sigma, mde, alpha, beta)
    assert AccuracyTest(sigma, n, alpha, beta).mde <= mde + 1e-9
    if n > 1:
        assert AccuracyTest(sigma, n - 1, alpha, beta).mde > mde


def _experiments(rng: np.random.Generator, p_a: float, p_b: float, n: int, runs: int) -> np.ndarray:
    """Mean exact-match accuracy (0/1 scores) of each arm over ``runs`` repeated experiments."""
    a = rng.binomial(n, p_a, size=runs) / n
    b = rng.binomial(n, p_b, size=runs) / n
    return np.stack([a, b])


def test_an_unchanged_arm_fails_about_alpha_of_the_time() -> None:
    rng = np.random.default_rng(0)
    t = AccuracyTest(sigma=bernoulli_sigma(0.7), n=400, alpha=0.05)
    a, b = _experiments(rng, 0.7, 0.7, t.n, 20000)
    false_alarms = float(np.mean(b < a - t.threshold))
    assert 0.035 < false_alarms < 0.065


def test_a_drop_of_one_mde_is_caught_about_one_minus_beta_of_the_time() -> None:
    rng = np.random.default_rng(1)
    t = AccuracyTest(sigma=bernoulli_sigma(0.7), n=400, alpha=0.05, beta=0.2)
    a, b = _experiments(rng, 0.7, 0.7 - t.mde, t.n, 20000)
    caught = float(np.mean(b < a - t.threshold))
    assert 0.76 < caught < 0.84
    a, b = _experiments(rng, 0.7, 0.7 - t.mde / 4, t.n, 20000)
    assert float(np.mean(b < a - t.threshold)) < 0.3  # well below the MDE: mostly missed


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31))
def test_verdicts_on_synthetic_scores(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = AccuracyTest(sigma=bernoulli_sigma(0.6), n=2000, alpha=0.01)
    a = rng.random(t.n) < 0.6
    same = accuracy_verdict(a.tolist(), a.tolist(), t)
    assert same.status == "pass" and same.evidence["delta"] == 0
    broken = accuracy_verdict(a.tolist(), (rng.random(t.n) < 0.3).tolist(), t)  # a planted regression
    assert broken.status == "fail" and "threshold" in broken.summary


def test_bad_parameters_name_the_field() -> None:
    with pytest.raises(StatsError, match="alpha"):
        AccuracyTest(1.0, 10, alpha=0.7)
    assert accuracy_verdict([1, 0], [1], AccuracyTest(1.0, 2)).status == "error"
    assert z(0.975) == pytest.approx(1.959964, rel=1e-6)


def test_the_accuracy_table_of_a_suite_names_the_file_and_the_key(tmp_path) -> None:  # noqa: ANN001
    from harness.kinds.ab.kind import _accuracy_plan
    from harness.suites import SuiteError, load_suite
    from harness.workspace import REPO_ROOT

    text = (REPO_ROOT / "suites" / "ab_smoke.toml").read_text()
    p = tmp_path / "ab_smoke.toml"
    assert _accuracy_plan(load_suite(REPO_ROOT / "suites" / "ab_smoke.toml"))["n"] == 1000
    for old, new, err in (("n = 1000\n", "", r"ab_smoke.toml: \[accuracy\].n: missing \(expected an integer >= 1\)"),
                          ("alpha = 0.05", "alpha = 0.7", r"ab_smoke.toml: accuracy: alpha must be in \(0, 0.5\], got 0.7"),
                          ("n = 1000", "nn = 1000", r"\[accuracy\].nn: unknown key 'nn'. Did you mean 'n'")):
        p.write_text(text.replace(old, new, 1))
        with pytest.raises(SuiteError, match=err):
            _accuracy_plan(load_suite(p))
