"""NMSE: known answers, scale invariance, the comparator's full-vocab rule, planted mutations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from harness.api import Case
from harness.compare import build
from harness.compare.kl import RUN
from harness.compare.nmse import NMSE, compare_tensors, nmse, nmse_rows, tensor_verdict
from tests.unit.synthetic import drifting_pair

CASE = Case("c01", (1,))
tensors = arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 16)),
                 elements=st.floats(-100, 100, allow_nan=False))


def test_known_answer() -> None:
    ref = np.array([[3.0, 4.0]])  # |ref|^2 = 25
    assert nmse(ref, ref + np.array([[0.0, 0.5]])) == pytest.approx(0.25 / 25)
    assert nmse(np.zeros(3), np.zeros(3)) == 0.0 and nmse(np.zeros(3), np.ones(3)) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        nmse(np.zeros(3), np.zeros(4))


@settings(max_examples=80, deadline=None)
@given(tensors, tensors, st.floats(1e-3, 1e3), st.booleans())
def test_nmse_is_scale_invariant(ref: np.ndarray, noise: np.ndarray, c: float, negate: bool) -> None:
    noise = np.resize(noise, ref.shape)
    assume(float((ref**2).sum()) > 1e-6)
    c = -c if negate else c
    x = ref + 0.01 * noise
    base = nmse(ref, x)
    assume(base > 1e-12)  # below that, x - ref is lost in float64 rounding of x itself
    assert nmse(c * ref, c * x) == pytest.approx(base, rel=1e-6)
    assert nmse(ref, ref) == 0.0


@settings(max_examples=40, deadline=None)
@given(tensors)
def test_pooled_nmse_is_the_ratio_of_sums_and_rows_are_per_position(ref: np.ndarray) -> None:
    x = ref * 1.01 + 0.1
    total, per = nmse_rows(ref, x)
    assume(float((ref**2).sum()) > 0)
    assert total == pytest.approx(nmse(ref, x))
    assert per.shape == (len(ref),)


def test_tensors_report_the_worst_position() -> None:
    ref = np.ones((10, 4))
    x = ref.copy()
    x[7, 2] += 0.5
    (t,) = compare_tensors({"hidden.1": ref}, {"hidden.1": x}, max_nmse=5e-4)
    assert t.worst_position == 7 and t.nmse == pytest.approx(0.25 / 40) and not t.passed


def test_comparator_passes_float_noise_and_fails_a_planted_perturbation() -> None:
    o, c = drifting_pair(np.random.default_rng(0), 32, 64, noise=1e-4)
    comp = build("nmse", {"max_nmse": 5e-4})
    v = comp.compare(o, c, CASE)
    assert v.status == "pass" and v.evidence["mode"] == "full-vocab"
    o2, bad = drifting_pair(np.random.default_rng(0), 32, 64, noise=0.5)
    v = comp.compare(o2, bad, CASE)
    assert v.status == "fail" and "worst" in v.detail
    assert 0 <= v.evidence["worst_position"] < 32


def test_topk_rows_are_skipped_with_the_reason() -> None:
    o, c = drifting_pair(np.random.default_rng(1), 8, 64, noise=0.1, k=5)
    v = NMSE().compare(o, c, CASE)
    assert v.status == "skip" and "full-vocab" in v.summary


def test_run_verdict_names_the_worst_case() -> None:
    rng = np.random.default_rng(2)
    quiet = drifting_pair(rng, 16, 32, noise=1e-5, case_id="c0")
    loud = drifting_pair(rng, 16, 32, noise=1e-2, case_id="c1")
    v = NMSE().compare_run([quiet[0], loud[0]], [quiet[1], loud[1]], [Case("c0", (1,)), Case("c1", (1,))])
    assert v.case_id == RUN and v.evidence["worst_case"] == "c1" and v.evidence["positions"] == 32


def test_tensor_sets_name_the_worst_tensor_case_and_position() -> None:
    rng = np.random.default_rng(3)
    ref = {c: {"logits": rng.standard_normal((6, 8)), "hidden.1": rng.standard_normal((6, 4))}
           for c in ("c0", "c1")}
    same = tensor_verdict(ref, {c: dict(t) for c, t in ref.items()})
    assert same.status == "pass" and all(t["nmse"] == 0 for t in same.evidence["tensors"])
    bad = {c: {k: v.copy() for k, v in t.items()} for c, t in ref.items()}
    bad["c1"]["hidden.1"][4] += 1.0  # a planted error in one layer, one position
    v = tensor_verdict(ref, bad, max_nmse=5e-4)
    assert v.status == "fail"
    row = next(t for t in v.evidence["tensors"] if t["name"] == "hidden.1")
    assert (row["worst_case"], row["worst_position"], row["passed"]) == ("c1", 4, False)
    assert next(t for t in v.evidence["tensors"] if t["name"] == "logits")["passed"]
    assert "hidden.1" in v.detail
