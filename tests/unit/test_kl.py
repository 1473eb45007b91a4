"""KL comparator: known answers, hypothesis properties, alignment, and planted mutations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from harness.api import Case, Output
from harness.compare import build
from harness.compare.kernels.aligned import align
from harness.compare.kl import KL, RUN, kl_full, kl_rows, kl_stats, kl_topk_rest
from tests.unit.synthetic import drifting_pair, log_softmax, output_from_logits

CASE = Case("c01", (1, 2, 3))

logit_rows = arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(2, 24)),
                    elements=st.floats(-8, 8, allow_nan=False, width=32))


def full(logits: np.ndarray, case: str = "c01", tokens=None, rng=None) -> Output:
    return output_from_logits(case, logits, None, tokens, rng)


def test_two_point_known_answer() -> None:
    p, q = np.log([[0.5, 0.5]]), np.log([[0.9, 0.1]])
    o, c = full(p, tokens=[0]), full(q, tokens=[0])
    want = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    rows = kl_rows(align(o, c, "c01"))
    assert rows.mode == "full-vocab"
    assert rows.kl[0] == pytest.approx(want, rel=1e-6)
    assert rows.dp[0] == pytest.approx(0.9 - 0.5, rel=1e-6)


def test_topk_rest_known_answer() -> None:
    # oracle keeps {0: .6, 1: .3} (rest .1); candidate keeps {0: .5, 2: .3} (rest .2, holding id 1)
    ids_o, lp_o = np.array([[0, 1]]), np.log([[0.6, 0.3]])
    ids_c, lp_c = np.array([[0, 2]]), np.log([[0.5, 0.3]])
    # partition {0} + rest: P = (.6, .4), Q = (.5, .5)
    want = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)
    assert kl_topk_rest(ids_o, lp_o, ids_c, lp_c)[0] == pytest.approx(want, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(logit_rows)
def test_kl_of_a_distribution_with_itself_is_zero(logits: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    o = full(logits)
    c = full(logits, tokens=o.token_ids, rng=rng)  # same distribution, rows listed in another order
    rows = kl_rows(align(o, c, "c01"))
    assert rows.mode == "full-vocab"
    assert np.all(rows.kl < 1e-9)
    assert rows.same_top.all()
    k = min(3, logits.shape[1])
    ot, ct = output_from_logits("c", logits, k), output_from_logits("c", logits, k)
    assert np.all(kl_rows(align(ot, ct, "c")).kl < 1e-9)


@settings(max_examples=80, deadline=None)
@given(logit_rows, logit_rows, st.integers(1, 6))
def test_kl_is_non_negative_and_topk_is_a_lower_bound(a: np.ndarray, b: np.ndarray, k: int) -> None:
    t, v = min(len(a), len(b)), min(a.shape[1], b.shape[1])
    a, b = a[:t, :v], b[:t, :v]
    k = min(k, v)
    lp_a, lp_b = log_softmax(a), log_softmax(b)
    exact = (np.exp(lp_a) * (lp_a - lp_b)).sum(axis=1)
    o, c = full(a), full(b, tokens=full(a).token_ids)
    kl = kl_rows(align(o, c, "c01")).kl
    assert np.all(kl >= 0)
    np.testing.assert_allclose(kl, np.maximum(exact, 0), rtol=1e-4, atol=1e-6)
    ot, ct = output_from_logits("c", a, k), output_from_logits("c", b, k, tokens=o.token_ids)
    lower = kl_rows(align(ot, ct, "c"), "topk").kl
    assert np.all(lower >= 0)
    # data processing inequality: a partition never adds KL (up to the float32 rounding of the
    # logprob rows, the same relative 1e-4 the full-vocab value is held to above). The rest
    # bucket's candidate mass is 1 - (the shared ids' mass): where it is tiny, the rows' float32
    # rounding (~1e-6 of each mass) is a large part of it, and its log term moves by about
    # p_rest * 1e-6 / q_rest, allowed for row by row (a=[0,0,0,0], b=[3,0,3,-8], k=3 needs it).
    top_a = np.argsort(-lp_a, axis=1, kind="stable")[:, :k]
    top_b = np.argsort(-lp_b, axis=1, kind="stable")[:, :k]
    slack = np.empty(t)
    for r in range(t):
        shared = np.intersect1d(top_a[r], top_b[r])
        p_rest = max(1.0 - np.exp(lp_a[r, shared]).sum(), 0.0)
        q_rest = max(1.0 - np.exp(lp_b[r, shared]).sum(), 1e-12)
        slack[r] = p_rest * 2e-6 / q_rest
    assert np.all(lower <= kl * (1 + 1e-4) + 1e-5 + slack)


def test_full_and_topk_agree_when_k_is_the_vocabulary() -> None:
    rng = np.random.default_rng(1)
    o, c = drifting_pair(rng, 50, 16, noise=0.3)
    a = align(o, c, "c")
    # float32 logprobs leave ~1e-6 of mass in the "rest" cell: the noise full-vocab mode renormalises away
    np.testing.assert_allclose(kl_topk_rest(a.o_ids, a.o_lp, a.c_ids, a.c_lp),
                               kl_full(a.o_ids, a.o_lp, a.c_ids, a.c_lp), rtol=1e-4, atol=1e-5)


def test_lookup_paths_agree_for_small_and_large_k() -> None:
    rng = np.random.default_rng(2)
    o, c = drifting_pair(rng, 20, 200, noise=0.5, k=100)  # 100*100 > 4096: scatter path
    a = align(o, c, "c")
    big = kl_topk_rest(a.o_ids, a.o_lp, a.c_ids, a.c_lp)
    # the same rows, checked position by position with plain dicts
    for r in range(5):
        cd = dict(zip(a.c_ids[r].tolist(), a.c_lp[r].tolist(), strict=True))
        shared = [(p, cd[i]) for i, p in zip(a.o_ids[r].tolist(), a.o_lp[r].tolist(), strict=True) if i in cd]
        ps, qs = sum(math.exp(p) for p, _ in shared), sum(math.exp(q) for _, q in shared)
        want = sum(math.exp(p) * (p - q) for p, q in shared)
        want += (1 - ps) * math.log((1 - ps) / (1 - qs)) if ps < 1 else 0.0
        assert big[r] == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_free_running_candidate_is_judged_until_its_first_divergence() -> None:
    rng = np.random.default_rng(3)
    o, c = drifting_pair(rng, 32, 16, noise=0.01)
    toks = list(o.token_ids)
    toks[5] = (toks[5] + 1) % 16
    c = c.with_tokens(toks)
    a = align(o, c, "c01")
    assert (a.positions, a.alignment) == (6, "until-first-divergence")
    v = KL(max_mean=10.0).compare(o, c, CASE)
    assert v.status == "pass"
    assert "until-first-divergence" in v.summary and v.evidence["positions"] == 6


def test_stats_known_values() -> None:
    o = full(np.log([[0.5, 0.5], [0.5, 0.5], [0.9, 0.1], [0.9, 0.1]]), tokens=[0, 0, 0, 0])
    c = full(np.log([[0.5, 0.5], [0.9, 0.1], [0.9, 0.1], [0.1, 0.9]]), tokens=[0, 0, 0, 0])
    a = align(o, c, "c")
    s = kl_stats([kl_rows(a)], [a.alignment])
    assert s.positions == 4 and s.mode == "full-vocab" and s.alignment == "teacher-forced"
    assert s.same_top == pytest.approx(0.75)  # row 3 flips; exact ties go to the lowest id on both sides
    dp = np.array([0, 0.4, 0, -0.8])
    assert s.rms_dp == pytest.approx(float(np.sqrt((dp**2).mean())), rel=1e-5)
    assert s.max == pytest.approx(0.8 * math.log(9), rel=1e-5)
    assert s.median == pytest.approx(float(np.median(kl_rows(a).kl)))


def test_planted_mutation_fails_the_gate_and_identity_passes() -> None:
    rng = np.random.default_rng(4)
    o, c = drifting_pair(rng, 64, 32, noise=1e-4)
    kl = build("kl", {"max_mean": 1e-3, "min_same_top": 0.99})
    assert kl.compare(o, c, CASE).status == "pass"
    o2, bad = drifting_pair(np.random.default_rng(4), 64, 32, noise=1.0)  # same oracle, loud candidate
    v = kl.compare(o2, bad, CASE)
    assert v.status == "fail"
    assert "mean KLD" in v.summary and "worst" in v.detail and "candidate" in v.detail


def test_run_verdict_pools_cases_and_reports_mode() -> None:
    rng = np.random.default_rng(5)
    pairs = [drifting_pair(rng, 40, 16, noise=0.05, k=5, case_id=f"c{i}") for i in range(3)]
    cases = [Case(f"c{i}", (1,)) for i in range(3)]
    kl = KL(max_mean=1.0)
    v = kl.compare_run([p[0] for p in pairs], [p[1] for p in pairs], cases)
    assert v.case_id == RUN and v.status == "pass"
    assert v.evidence["positions"] == 120 and v.evidence["mode"] == "top-k+rest"
    per = [kl.compare(o, c, case).evidence["mean"] for (o, c), case in zip(pairs, cases, strict=True)]
    assert v.evidence["mean"] == pytest.approx(float(np.mean(per)))


def test_full_mode_on_topk_rows_is_an_error_naming_the_case() -> None:
    o, c = drifting_pair(np.random.default_rng(6), 8, 16, noise=0.1, k=5)
    v = KL(mode="full").compare(o, c, CASE)
    assert v.status == "error" and "c01" in v.detail and "top-5" in v.detail


def test_missing_logprobs_and_engine_errors_are_verdicts() -> None:
    o, _ = drifting_pair(np.random.default_rng(7), 8, 16, noise=0.1)
    assert KL().compare(o, Output("c01", o.token_ids), CASE).status == "error"
    assert KL().compare(o, Output("c01", (), error="boom"), CASE).status == "error"


def test_an_id_the_tokenizer_cannot_decode_is_named_not_raised() -> None:
    """A llama.cpp long_horizon run crashed while explaining its KL failure: the worst position's
    top entries held an id the tokenizer's decode refused (OverflowError for a negative id)."""
    def decode(ids):
        if any(i < 0 for i in ids):
            raise OverflowError("number too small to fit in target type")
        return f"<{ids[0]}>"

    comp = KL(decode=decode)
    assert comp._tok(7) == "7 '<7>'"
    assert comp._tok(-1) == "-1 (not a token id of this tokenizer)"
