"""Synthetic outputs with known distributions, for the comparators' tests.

Everything is drawn from a seeded numpy Generator, so a failing example replays exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.api import Output


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def output_from_logits(case_id: str, logits: np.ndarray, k: int | None = None,
                       tokens: Sequence[int] | None = None, rng: np.random.Generator | None = None
                       ) -> Output:
    """An output whose rows are the (top-``k``, or full when None) logprobs of ``logits`` [T, V].

    ``tokens`` defaults to the greedy choice. Rows are shuffled when ``rng`` is given (a comparator
    must not depend on the order an engine lists its logprobs in, except best-first for top-k).
    """
    lp = log_softmax(logits)
    t, v = lp.shape
    order = np.argsort(-lp, axis=1, kind="stable")
    if k is not None:
        order = order[:, :k]
    elif rng is not None:
        order = rng.permuted(order, axis=1)
    top_lp = np.take_along_axis(lp, order, axis=1)
    toks = np.asarray(tokens if tokens is not None else lp.argmax(axis=1), np.int64)
    chosen = lp[np.arange(t), toks]
    return Output(case_id, tuple(int(x) for x in toks), top_ids=order.astype(np.int32),
                  top_logprobs=top_lp.astype(np.float32), chosen_logprobs=chosen.astype(np.float32),
                  finish_reason="length")


def drifting_pair(rng: np.random.Generator, positions: int, vocab: int, noise: float,
                  growth: float = 0.0, k: int | None = None, case_id: str = "c") -> tuple[Output, Output]:
    """(oracle, teacher-forced candidate) whose logit noise is ``noise + growth * position``."""
    logits = rng.standard_normal((positions, vocab)) * 3.0
    scale = noise + growth * np.arange(positions)[:, None]
    cand = logits + rng.standard_normal((positions, vocab)) * scale
    oracle = output_from_logits(case_id, logits, k)
    return oracle, output_from_logits(case_id, cand, k, tokens=oracle.token_ids)
