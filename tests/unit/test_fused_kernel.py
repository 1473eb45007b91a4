"""The fused comparator kernel agrees with the per-token loop and the numpy kernels at every position,
and a planted fault moves exactly the verdicts it should."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.kernels.fused import judge_run

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("compare_throughput", ROOT / "benchmarks" / "compare_throughput.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()


def _run(d, **kw):  # noqa: ANN001, ANN003, ANN202
    return judge_run(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids, d.c_lp, **kw)


def _loop(d, threshold: float = 0.5):  # noqa: ANN001, ANN202
    return BENCH.same_work_loop(d.o_tok.tolist(), d.c_tok.tolist(), BENCH.as_dicts(d.o_ids, d.o_lp),
                                BENCH.as_dicts(d.c_ids, d.c_lp), d.o_chosen.tolist(), threshold)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(1, 60), st.integers(1, 8), st.floats(0.0, 3.0), st.integers(0, 2**31),
       st.floats(0.0, 2.0), st.booleans())
def test_fused_equals_the_per_token_loop_at_every_position(s: int, length: int, k: int, noise: float, seed: int,
                                                           threshold: float, minus_inf: bool) -> None:
    d = BENCH.synthetic(s * length, k, seq_len=length, noise=noise, seed=seed, vocab=max(k, 40))
    if minus_inf and k > 1:  # a token the engine gave no mass at all
        d.o_lp[..., -1] = -np.inf
        d.c_lp[..., -1] = -np.inf
    f = _run(d, threshold=threshold)
    firsts, strict, tie, mutual, kl = _loop(d, threshold)
    assert f.first_divergence.tolist() == firsts and f.strict.tolist() == strict
    assert f.near_tie.tolist() == tie
    assert np.array_equal(f.mutual_topk, np.asarray(mutual, bool))
    np.testing.assert_allclose(f.kl, np.asarray(kl), rtol=0, atol=1e-9)
    g = _run(d, threshold=threshold, compiled=False)  # the numpy kernels give the same answers
    assert BENCH.disagreement(f, g) is None


def test_planted_faults_move_exactly_their_verdicts() -> None:
    d = BENCH.synthetic(20 * 50, 5, seq_len=50, noise=0.0, seed=1)
    base = _run(d)
    assert base.strict.all() and base.kl.max() < 1e-12  # identical sides: exact, zero KL
    # a flipped token in sequence 3 at position 17, to an id outside the oracle's top-k
    c_tok = d.c_tok.copy()
    c_tok[3, 17] = 10**6
    flipped = judge_run(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, c_tok, d.c_ids, d.c_lp)
    assert flipped.strict.tolist() == [i != 3 for i in range(20)] and flipped.first_divergence[3] == 17
    assert not flipped.near_tie[3] and not flipped.mutual_topk[3, 17]
    assert flipped.mutual_topk.sum() == flipped.mutual_topk.size - 1
    # a perturbed candidate distribution at one position changes KL there and nowhere else
    c_lp = d.c_lp.copy()
    c_lp[5, 30, 0] -= 2.0
    moved = judge_run(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids, c_lp)
    changed = np.argwhere(moved.kl > 1e-9)
    assert changed.tolist() == [[5, 30]] and moved.kl[5, 30] > 0.1


def test_a_near_tie_inside_and_outside_the_bar() -> None:
    d = BENCH.synthetic(4 * 10, 3, seq_len=10, noise=0.0, seed=2)
    c_tok = d.c_tok.copy()
    c_tok[0, 4] = d.o_ids[0, 4, 1]  # the runner-up
    gap = float(d.o_chosen[0, 4]) - float(d.o_lp[0, 4, 1])
    inside = judge_run(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, c_tok, d.c_ids, d.c_lp, threshold=gap + 1e-6)
    outside = judge_run(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, c_tok, d.c_ids, d.c_lp, threshold=gap - 1e-6)
    assert inside.near_tie[0] and not outside.near_tie[0] and not inside.strict[0]
