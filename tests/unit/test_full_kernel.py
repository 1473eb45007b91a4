"""The compiled full-vocabulary kernel (harness/compare/kernels/compiled.py) gives the numpy path's facts and the
naive float64 answer, on any shape, any block boundary, and the values engines really produce
(-inf, raw logits, NaN); its exp is within 2 ulp of numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.kernels import compiled as kernels
from harness.compare.kernels.full import row_facts

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed")

FIELDS = ("kl", "sq_err", "sq_ref", "o_top", "c_top", "o_lse", "c_lse")


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def naive_kl(o: np.ndarray, c: np.ndarray) -> np.ndarray:
    o2, c2 = log_softmax64(np.maximum(o, -69.0)), log_softmax64(np.maximum(c, -69.0))
    return np.maximum((np.exp(o2) * (o2 - c2)).sum(axis=1), 0.0)


def pair(n: int, v: int, seed: int, noise: float, scale: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    o = log_softmax64(rng.standard_normal((n, v)) * scale).astype(np.float32)
    c = log_softmax64(o + rng.standard_normal((n, v)) * noise).astype(np.float32)
    return o, c


def assert_same_facts(a, b, o: np.ndarray, c: np.ndarray, rtol: float = 1e-9) -> None:  # noqa: ANN001
    """Equal within float64 rounding. ``sq_err`` and ``sq_ref`` come from sums whose terms cancel
    (``sum d^2 - 2 delta sum d + V delta^2``): their rounding is relative to those terms' size."""
    o64, c64 = np.maximum(np.asarray(o, np.float64), -69.0), np.maximum(np.asarray(c, np.float64), -69.0)
    v = o.shape[1]
    terms = {"sq_err": ((c64 - o64) ** 2).sum(axis=1) + v * (b.c_lse - b.o_lse) ** 2,
             "sq_ref": (o64**2).sum(axis=1) + v * b.o_lse**2}
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if name.endswith("_top"):
            assert np.array_equal(x, y), name
        else:
            atol = 1e-13 * terms[name] + 1e-12 if name in terms else 1e-12
            assert np.all(np.abs(x - y) <= atol + rtol * np.abs(y)), (name, x, y)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.sampled_from([1, 7, 8, 511, 512, 513, 1031, 3000]), st.integers(0, 10**6),
       st.floats(0.0, 1.0), st.floats(-3.0, 3.0))
def test_kernel_equals_the_numpy_path_and_the_naive_answer(n: int, v: int, seed: int, noise: float,
                                                           shift: float) -> None:
    o, c = pair(n, v, seed, noise)
    c = (c + np.float32(shift)).astype(np.float32)
    fast, slow = row_facts(o, c), row_facts(o, c, compiled=False)
    assert_same_facts(fast, slow, o, c)
    np.testing.assert_allclose(fast.kl, naive_kl(o, c), rtol=1e-7, atol=1e-12)


def test_a_tiny_kl_survives() -> None:
    """1e-9 nats between two 49k-id rows: float64 accumulation keeps it (float32 would lose it)."""
    o, _ = pair(4, 49152, 1, 0.0)
    rng = np.random.default_rng(2)
    c = log_softmax64(o.astype(np.float64) + rng.standard_normal(o.shape) * 4e-5).astype(np.float32)
    f = row_facts(o, c)
    want = naive_kl(o, c)
    assert 1e-10 < want.min() and want.max() < 1e-7
    np.testing.assert_allclose(f.kl, want, rtol=1e-5)


def test_identical_rows_give_exactly_zero() -> None:
    o, _ = pair(8, 5000, 3, 0.0)
    f = row_facts(o, o.copy())
    assert f.kl.max() == 0.0 and f.sq_err.max() == 0.0


def test_minus_inf_raw_logits_and_nan_rows() -> None:
    o, c = pair(6, 2000, 4, 0.3)
    o[0, :100] = -np.inf  # tokens the engine gave no mass (clamped at log 1e-30)
    c[0, 50:60] = -np.inf
    o[1] = np.float32(40.0) + o[1]  # raw logits: far from a distribution, renormalised
    c[2] = np.float32(800.0) + c[2]  # exp would overflow without the shift
    o[3, 1000] = np.nan  # NaN: numpy's answer (NaN facts), not a made-up number
    fast = row_facts(o, c)
    with np.errstate(over="ignore", invalid="ignore"):  # numpy's exp overflows on row 2
        slow = row_facts(o, c, compiled=False)
    good = [0, 1, 4, 5]
    for name in FIELDS:
        np.testing.assert_allclose(getattr(fast, name)[good], getattr(slow, name)[good], rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    assert np.isfinite(fast.kl[2]) and fast.c_lse[2] == pytest.approx(800.0, abs=1e-3)
    assert np.isnan(fast.kl[3]) and np.isnan(slow.kl[3])


def test_ties_go_to_the_lowest_id_across_blocks() -> None:
    o = np.full((2, 3 * kernels.BLOCK), -20.0, np.float32)
    o[0, [700, 5, 1500]] = -0.5  # the same top value in three blocks
    o[1, [1100, 1101]] = -0.25
    f = row_facts(o, o.copy())
    assert f.o_top.tolist() == [5, 1100] == f.c_top.tolist()


def test_other_dtypes_memmaps_and_strided_rows(tmp_path) -> None:  # noqa: ANN001
    o, c = pair(5, 1500, 5, 0.2)
    want = row_facts(o, c, compiled=False)
    np.save(tmp_path / "o.npy", o)
    mm = np.load(tmp_path / "o.npy", mmap_mode="r")  # read-only memory map, as engines hand them over
    assert_same_facts(row_facts(mm, c), want, o, c)
    assert_same_facts(row_facts(o.astype(np.float64), c.astype(np.float64)), want, o, c)
    wide = np.zeros((5, 3000), np.float32)
    wide[:, ::2] = o
    assert_same_facts(row_facts(wide[:, ::2], c), want, o, c)
    empty = row_facts(np.zeros((0, 7), np.float32), np.zeros((0, 7), np.float32))
    assert empty.kl.shape == (0,)


def test_the_vectorised_exp_is_within_two_ulp_of_numpys() -> None:
    x = np.concatenate([np.linspace(-708.0, 64.0, 200_001), np.random.default_rng(6).uniform(-69, 0, 100_000)])
    tags = np.empty_like(x)
    p = np.empty_like(x)
    kernels.compiled()
    kernels._exp_block(x.astype(np.float32), 0.0, np.empty_like(x), p, tags)
    kernels._exp_scale(p.view(np.int64), tags.view(np.int64))
    want = np.exp(np.maximum(x.astype(np.float32).astype(np.float64), -69.0))
    ulp = np.abs(p - want) / np.spacing(want)
    assert ulp.max() <= 2.0, f"max {ulp.max():.2f} ulp at x = {x[ulp.argmax()]}"
