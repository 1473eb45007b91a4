"""strict and near-tie: properties (hypothesis) and the failure explanations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.api import Output
from harness.compare.near_tie import NearTie
from harness.compare.strict import Strict, first_divergence
from tests.conftest import make_case, make_output

tokens = st.lists(st.integers(min_value=0, max_value=499), min_size=1, max_size=40)


@given(tokens)
def test_strict_is_reflexive(toks: list[int]) -> None:
    out = make_output("c01", toks)
    assert Strict().compare(out, out, make_case()).status == "pass"


@given(tokens, st.data())
def test_any_single_token_flip_is_caught_by_strict(toks: list[int], data: st.DataObject) -> None:
    pos = data.draw(st.integers(0, len(toks) - 1))
    new = data.draw(st.integers(0, 499).filter(lambda t: t != toks[pos]))
    oracle = make_output("c01", toks)
    mutated = list(toks)
    mutated[pos] = new
    v = Strict().compare(oracle, oracle.with_tokens(mutated), make_case())
    assert v.status == "fail"
    assert v.evidence["first_divergence"] == pos
    assert f"at token {pos}/{len(toks)}" in v.summary


@given(tokens, st.integers(0, 39))
def test_truncation_is_a_divergence(toks: list[int], cut: int) -> None:
    cut = min(cut, len(toks) - 1)
    assert first_divergence(toks, toks[:cut]) == cut
    oracle = make_output("c01", toks)
    assert Strict().compare(oracle, oracle.with_tokens(toks[:cut]), make_case()).status == "fail"


def _swap_to_runner_up(oracle: Output, pos: int) -> Output:
    assert oracle.top_ids is not None
    toks = list(oracle.token_ids)
    toks[pos] = int(oracle.top_ids[pos, 1])
    toks[pos + 1:] = [7] * (len(toks) - pos - 1)  # everything after the divergence is junk
    return oracle.with_tokens(toks)


@settings(max_examples=50, deadline=None)
@given(tokens.filter(lambda t: len(t) >= 2), st.floats(0.01, 5.0), st.floats(0.01, 5.0), st.data())
def test_near_tie_passes_within_threshold_and_fails_beyond(
        toks: list[int], gap: float, threshold: float, data: st.DataObject) -> None:
    pos = data.draw(st.integers(0, len(toks) - 2))
    oracle = make_output("c01", toks, gap=gap)
    v = NearTie(threshold_nats=threshold).compare(oracle, _swap_to_runner_up(oracle, pos), make_case())
    # the gap is computed in float32 from the oracle's logprobs
    assert oracle.top_logprobs is not None
    exact_gap = float(oracle.top_logprobs[pos, 0]) - float(oracle.top_logprobs[pos, 1])
    assert v.status == ("pass" if exact_gap <= threshold else "fail")
    assert v.evidence["first_divergence"] == pos
    assert abs(v.evidence["gap_mnats"] - round(exact_gap * 1000, 3)) < 1e-6


def test_near_tie_fails_a_token_outside_the_oracle_top_k() -> None:
    oracle = make_output("c01", [10, 11, 12, 13], gap=0.01)
    assert oracle.top_ids is not None
    outside = next(t for t in range(500) if t not in oracle.top_ids[1])
    v = NearTie(threshold_nats=10.0).compare(oracle, oracle.with_tokens([10, outside, 12, 13]),
                                             make_case())
    assert v.status == "fail" and v.evidence["kind"] == "not-in-topk"
    assert "not in oracle top5" in v.detail


def test_near_tie_ignores_everything_after_the_first_divergence() -> None:
    oracle = make_output("c01", list(range(20, 40)), gap=0.1)
    cand = _swap_to_runner_up(oracle, 3)
    v = NearTie(threshold_nats=0.5).compare(oracle, cand, make_case())
    assert v.status == "pass" and v.evidence["kind"] == "tie"
    assert v.evidence["matched"] == 3


def test_near_tie_without_oracle_logprobs_is_an_error_not_a_pass() -> None:
    bare = Output("c01", (1, 2, 3))
    v = NearTie().compare(bare, bare.with_tokens([1, 9, 3]), make_case())
    assert v.status == "error"


def test_engine_errors_become_error_verdicts() -> None:
    oracle = make_output("c01", [1, 2, 3])
    broken = Output("c01", (), error="server returned HTTP 503")
    for comp in (Strict(), NearTie()):
        v = comp.compare(oracle, broken, make_case())
        assert v.status == "error" and "503" in v.summary


def test_failure_explains_itself() -> None:
    oracle = make_output("c01", [5, 6, 7, 8])
    decode = lambda ids: "".join(chr(97 + (i % 26)) for i in ids)  # noqa: E731
    v = NearTie(threshold_nats=0.5, decode=decode).compare(
        oracle, _swap_to_runner_up(oracle, 2), make_case())
    assert v.status == "fail"
    text = v.detail
    for needle in ("c01: near_tie FAIL at token 2/4", "prefix", "oracle", "candidate", "top5",
                   "mnats (near-tie bar 500)", "make record"):
        assert needle in text, needle
    assert np.isclose(v.evidence["gap_mnats"], 2000.0, atol=1)
