"""drift: buckets, the fitted slope, and a planted drift that the mean alone would miss."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.api import Case
from harness.compare import build
from harness.compare.drift import Drift, drift_profile, ols
from harness.compare.kl import KL, RUN
from tests.unit.synthetic import drifting_pair


def test_ols_recovers_a_line() -> None:
    x = np.arange(100.0)
    slope, se, icpt = ols(x, 2.0 + 0.5 * x)
    assert slope == pytest.approx(0.5) and icpt == pytest.approx(2.0) and se == pytest.approx(0.0, abs=1e-9)


def test_buckets_split_positions_and_average_cases() -> None:
    kl = [np.r_[np.zeros(64), np.ones(192)], np.r_[np.zeros(64), 3 * np.ones(36)]]
    st_ = [np.ones(256, bool), np.zeros(100, bool)]
    p = drift_profile(kl, st_, edges=(0, 64, 256))
    b0, b1 = p.buckets
    assert (b0.start, b0.end, b0.observations, b0.mean_kl) == (0, 64, 128, 0.0)
    assert b1.observations == 192 + 36 and b1.mean_kl == pytest.approx((192 + 3 * 36) / 228)
    assert b0.same_top == pytest.approx(0.5)
    assert p.positions == 256 and p.curve[70] == pytest.approx(2.0) and p.curve[200] == pytest.approx(1.0)


# Logit noise 0.5 at every position, or growing linearly from 0 with the same mean square: both
# give a mean KL of ~0.075 nats, so a mean bar cannot tell them apart; the slope can.
FLAT = 0.5
GROWTH = FLAT * np.sqrt(3) / 1024


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31))
def test_a_planted_drift_is_caught_by_the_slope_while_the_mean_passes(seed: int) -> None:
    case = Case("c", (1,))
    flat = drifting_pair(np.random.default_rng(seed), 1024, 32, noise=FLAT)
    grow = drifting_pair(np.random.default_rng(seed), 1024, 32, noise=0.0, growth=GROWTH)
    kl, drift = KL(max_mean=0.1), Drift(max_slope_per_1k=0.05)
    assert kl.compare(*flat, case).status == "pass"
    assert kl.compare(*grow, case).status == "pass"  # the mean cannot see it ...
    assert drift.compare(*flat, case).status == "pass"
    v = drift.compare(*grow, case)
    assert v.status == "fail", v.summary  # ... the slope can
    assert "slope" in v.summary and "mean KL alone" in v.detail
    assert v.evidence["buckets"][-1]["mean_kl"] > 3 * v.evidence["buckets"][0]["mean_kl"]


def test_too_short_runs_are_skipped_and_run_verdicts_pool_cases() -> None:
    rng = np.random.default_rng(3)
    pairs = [drifting_pair(rng, 300, 16, noise=0.0, growth=1e-3, case_id=f"c{i}") for i in range(2)]
    cases = [Case(f"c{i}", (1,)) for i in range(2)]
    short = drifting_pair(rng, 10, 16, noise=0.1)
    assert Drift().compare(*short, Case("c", (1,))).status == "skip"
    d = build("drift", {"max_slope_per_1k": 1e-3, "buckets": [0, 64, 256]})
    v = d.compare_run([p[0] for p in pairs], [p[1] for p in pairs], cases)
    assert v.case_id == RUN and v.status == "fail" and v.evidence["observations"] == 600
    assert [b["start"] for b in v.evidence["buckets"]] == [0, 64, 256]


def test_bad_parameters_name_the_table() -> None:
    with pytest.raises(ValueError, match="compare.drift"):
        build("drift", {"max_slop": 1})
    with pytest.raises(ValueError, match="buckets"):
        build("drift", {"buckets": "0,64"})
