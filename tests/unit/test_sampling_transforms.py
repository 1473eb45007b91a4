"""The reference transforms against hand-computed cases, their properties, and the engines'
orders (vLLM tempers before truncating, llama.cpp after: the same parameters, other nuclei)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.api import Sampling
from harness.sampling.transforms import (
    CHAINS,
    LLAMA_CPP,
    TRANSFORMERS,
    VLLM,
    Chain,
    History,
    softmax,
    transform,
)

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
"""probabilities 0.5, 0.2, 0.15, 0.1, 0.05: the mass before each token is 0, .5, .7, .85, .95"""
NONE = History(())


def S(**kw: float) -> Sampling:  # noqa: N802
    return Sampling(1, 1, **{"temperature": 1.0, **kw})  # type: ignore[arg-type]


def probs(s: Sampling, chain=VLLM, history: History = NONE, logits=LOGITS) -> np.ndarray:
    return transform(logits, s, history, chain).probs


def test_temperature_by_hand() -> None:
    got = probs(S(temperature=0.5))
    want = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert np.allclose(got, want / want.sum())


def test_top_k_keeps_the_k_most_likely_by_hand() -> None:
    assert np.allclose(probs(S(top_k=2)), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    assert np.allclose(probs(S(top_k=0)), np.exp(LOGITS))  # 0: off


def test_top_p_keeps_a_token_while_the_mass_before_it_is_below_p() -> None:
    """Mass before the tokens: 0, .5, .7, .85, .95. p = 0.8 keeps three (.7 < .8 <= .85)."""
    assert np.allclose(probs(S(top_p=0.8)), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])
    assert np.allclose(probs(S(top_p=0.4)), [1, 0, 0, 0, 0])  # at least one
    assert np.allclose(probs(S(top_p=0.71)), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])


def test_min_p_is_relative_to_the_most_likely_token() -> None:
    """min_p 0.25: p >= 0.125 is kept (0.5, 0.2, 0.15)."""
    assert np.allclose(probs(S(min_p=0.25)), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])


def test_repetition_divides_positive_and_multiplies_negative_logits() -> None:
    x = np.array([2.0, -1.0, 0.5, 0.0])
    got = transform(x, S(repetition_penalty=2.0), History((0, 1, 1)), VLLM)
    assert np.allclose(got.probs, softmax(np.array([1.0, -2.0, 0.5, 0.0])))


def test_presence_and_frequency_count_what_the_chain_says() -> None:
    x = np.zeros(4)
    h = History((3, 2, 2), output=(2, 2))  # the prompt holds 3, the engine drew 2 twice
    vllm = transform(x, S(presence_penalty=1.0, frequency_penalty=0.5), h, VLLM).probs
    assert np.allclose(vllm, softmax(np.array([0, 0, -1 - 2 * 0.5, 0])))  # output only: token 3 untouched
    ctx = transform(x, S(presence_penalty=1.0), h, Chain("ctx", VLLM.order, "context", "context")).probs
    assert np.allclose(ctx, softmax(np.array([0, 0, -1, -1])))


def test_llama_cpp_penalises_only_the_last_64_tokens_it_drew() -> None:
    x = np.zeros(4)
    drawn = (1,) + (2,) * 64
    got = transform(x, S(presence_penalty=1.0), History((0, 0) + drawn, drawn), LLAMA_CPP).probs
    assert np.allclose(got, softmax(np.array([0, 0, -1, 0])))  # token 1 fell out of the window
    prompt_only = transform(x, S(repetition_penalty=2.0), History((0, 1, 2, 3), ()), LLAMA_CPP).probs
    assert np.allclose(prompt_only, 0.25)  # the prompt is never seen by llama-cpp-python's penalties


def test_the_order_changes_the_nucleus_by_hand() -> None:
    """T = 0.5 squares the odds: 0.769, 0.123, 0.069, 0.031, 0.008 (mass before: 0, .769, .892).
    vLLM (temperature, then top-p 0.8) keeps 2 tokens; llama.cpp (top-p 0.8 on the raw distribution,
    mass before 0, .5, .7, .85: 3 tokens, then temperature) keeps 3."""
    s = S(temperature=0.5, top_p=0.8)
    vllm, llama = probs(s, VLLM), probs(s, LLAMA_CPP)
    assert (vllm > 0).sum() == 2 and (llama > 0).sum() == 3
    p2 = np.array([0.5, 0.2, 0.15]) ** 2
    assert np.allclose(vllm[:2], p2[:2] / p2[:2].sum())
    assert np.allclose(llama[:3], p2 / p2.sum())
    tv = 0.5 * np.abs(vllm - llama).sum()
    assert tv == pytest.approx(p2[2] / p2.sum(), rel=1e-9)  # 0.072: what the order test must see


def test_min_p_before_or_after_temperature() -> None:
    """min_p 0.15 on the raw distribution keeps p >= 0.075 (4 tokens, llama.cpp); after T = 0.5 the
    ratios to the top square (0.16, 0.09, 0.04, 0.01): 2 tokens reach 0.15 (vLLM, transformers)."""
    s = S(temperature=0.5, min_p=0.15)
    assert (probs(s, LLAMA_CPP) > 0).sum() == 4
    assert (probs(s, VLLM) > 0).sum() == 2 and (probs(s, TRANSFORMERS) > 0).sum() == 2


def test_borderline_decisions_are_reported() -> None:
    near = np.log(np.array([0.5, 0.3, 0.2]))
    r = transform(near, S(top_p=0.8000001), NONE, VLLM)  # mass before token 2 is 0.8: on the cut
    assert 2 in r.borderline
    k = transform(np.array([3.0, 2.0, 1.9995, 0.0]), S(top_k=2), NONE, VLLM)
    assert set(k.borderline) == {1, 2}
    assert not transform(LOGITS, S(top_k=2), NONE, VLLM).borderline


def test_every_chain_names_its_source_and_steps() -> None:
    for name in CHAINS:
        c = CHAINS.get(name)
        assert c.source and set(c.order) == {"penalties", "temperature", "top_k", "top_p", "min_p"}
    assert VLLM.order.index("temperature") < VLLM.order.index("top_p")
    assert LLAMA_CPP.order.index("temperature") > LLAMA_CPP.order.index("top_p")
    assert TRANSFORMERS.unsupported.keys() == {"presence_penalty", "frequency_penalty"}


logit_rows = st.lists(st.floats(-8, 8, allow_nan=False), min_size=3, max_size=40).map(np.array)


@settings(max_examples=150, deadline=None)
@given(
    x=logit_rows,
    t=st.floats(0.2, 3.0),
    k=st.integers(0, 10),
    p=st.floats(0.05, 1.0),
    m=st.floats(0.0, 0.9),
    chain=st.sampled_from(["vllm", "llama.cpp", "transformers"]),
)
def test_properties(x: np.ndarray, t: float, k: int, p: float, m: float, chain: str) -> None:
    c = CHAINS.get(chain)
    r = transform(x, S(temperature=t, top_k=k, top_p=p, min_p=m), NONE, c)
    assert math.isclose(r.probs.sum(), 1.0, rel_tol=1e-9) and (r.probs >= 0).all()
    plain = softmax(x / t)
    assert np.isclose(plain[r.probs > 0].max(), plain.max())  # the most likely token (or a tie) survives
    kept = r.probs > 0
    if 0 < k < x.size:
        assert kept.sum() <= max(k, int((x >= np.sort(x)[::-1][k - 1]).sum()))  # ties at the cut stay
    # survivors keep their relative odds under the chain's temperature
    i, j = np.flatnonzero(kept)[:2] if kept.sum() > 1 else (0, 0)
    if i != j:
        assert math.isclose(r.probs[i] / r.probs[j], plain[i] / plain[j], rel_tol=1e-6)
    assert set(r.ranked) == set(np.flatnonzero(kept))
