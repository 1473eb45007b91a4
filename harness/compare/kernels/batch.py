"""Whole-run array kernels: strict, near-tie and vLLM's logprob rule over [sequences, positions] at once.

The per-case comparators judge one case at a time; these kernels judge a run of equal-length
sequences in a handful of numpy operations (the micro-benchmark in ``benchmarks/`` times them
against a per-token Python loop). KL is :func:`harness.compare.kl.kl_topk_rest` on the flattened
rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class BatchVerdicts:
    first_divergence: np.ndarray
    """[S] first position where the tokens differ; L when they never do."""
    strict: np.ndarray
    """[S] bool."""
    near_tie: np.ndarray
    """[S] bool: exact, or at the first divergence the candidate token is in the oracle's top-k
    within ``threshold`` nats of the oracle's chosen token."""
    mutual_topk: np.ndarray
    """[S, L] bool: vLLM's ``check_logprobs_close`` rule at every position — each side's token is in
    the other side's top-k."""


def first_divergence(o_tok: np.ndarray, c_tok: np.ndarray) -> np.ndarray:
    """[S] index of the first differing position of each row; L where the rows are equal."""
    diff = o_tok != c_tok
    return np.where(diff.any(axis=1), diff.argmax(axis=1), o_tok.shape[1])


def judge_batch(o_tok: np.ndarray, o_ids: np.ndarray, o_lp: np.ndarray, o_chosen: np.ndarray,
                c_tok: np.ndarray, c_ids: np.ndarray, threshold: float = 0.5) -> BatchVerdicts:
    """Arrays are [S, L] (tokens, chosen logprobs) and [S, L, k] (top ids and logprobs).

    Sequences go through in slices of about 32k positions, whose temporaries stay in cache."""
    step = max(1, 32768 // max(1, o_tok.shape[1]))
    if o_tok.shape[0] <= step:
        return _judge(o_tok, o_ids, o_lp, o_chosen, c_tok, c_ids, threshold)
    parts = [_judge(o_tok[i:i + step], o_ids[i:i + step], o_lp[i:i + step], o_chosen[i:i + step],
                    c_tok[i:i + step], c_ids[i:i + step], threshold) for i in range(0, len(o_tok), step)]
    return BatchVerdicts(*(np.concatenate([getattr(p, f) for p in parts])
                           for f in ("first_divergence", "strict", "near_tie", "mutual_topk")))


def _judge(o_tok: np.ndarray, o_ids: np.ndarray, o_lp: np.ndarray, o_chosen: np.ndarray,
           c_tok: np.ndarray, c_ids: np.ndarray, threshold: float) -> BatchVerdicts:
    s, n = o_tok.shape
    first = first_divergence(o_tok, c_tok)
    in_o = o_ids == c_tok[..., None]  # [S, L, k]
    in_c = c_ids == o_tok[..., None]
    mutual = in_o.any(axis=2) & in_c.any(axis=2)
    at = np.minimum(first, n - 1)
    rows = np.arange(s)
    hit = in_o[rows, at]  # [S, k]
    cand_lp = np.where(hit, o_lp[rows, at], -np.inf).max(axis=1)
    gap = o_chosen[rows, at] - cand_lp
    exact = first == n
    return BatchVerdicts(first, exact, exact | (hit.any(axis=1) & (gap <= threshold)), mutual)


def check_logprobs_close_loop(o_tok: Sequence[Sequence[int]], c_tok: Sequence[Sequence[int]],
                              o_lp: Sequence[Sequence[dict[int, float]]],
                              c_lp: Sequence[Sequence[dict[int, float]]]) -> list[list[bool]]:
    """The per-token Python form of vLLM's ``check_logprobs_close`` rule, applied at every position
    (as with ``always_check_logprobs``, without stopping): is each side's token in the other side's
    top-k dict? The baseline the micro-benchmark times the kernels against."""
    out = []
    for ot, ct, ol, cl in zip(o_tok, c_tok, o_lp, c_lp, strict=True):
        row = []
        for a, b, da, db in zip(ot, ct, ol, cl, strict=True):
            row.append(a in db and b in da)
        out.append(row)
    return out
