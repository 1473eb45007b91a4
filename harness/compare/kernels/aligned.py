"""Line two outputs up position by position, for the distribution comparators (KL, NMSE, drift).

Position ``t`` of both sides is comparable only when both distributions were computed after the
same prefix (prompt + oracle tokens ``< t``):

* **teacher-forced**: the candidate scored the oracle's own sequence (see :mod:`harness.teacher`),
  so every position lines up, even where its free-running greedy choice would have differed;
* **until first divergence**: a candidate that could only generate on its own is comparable up to
  and including its first divergent position ``d`` (both sides predicted token ``d`` from the same
  prefix); past ``d`` the prefixes differ and nothing is judged.

A candidate whose tokens equal the oracle's everywhere is the first case whichever way it ran.

Two capture modes, said in every report:

* ``full-vocab``: both sides hold the whole distribution at every position, as ``[n, V]`` arrays
  (:attr:`harness.api.Output.full_logprobs`, or top-k rows that hold every id of the vocabulary);
* ``top-k+rest``: each side holds its top k; the vocabulary is split into the ids both sides hold
  plus one "rest" cell, and every statistic is computed over that partition. By the data
  processing inequality a KL over a partition never exceeds the full-vocabulary KL, so a top-k KL
  is a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from harness.api import Output
from harness.compare.kernels.full import RowFacts, at, cached_row_facts, dense_from_topk
from harness.compare.strict import first_divergence

Alignment = Literal["teacher-forced", "until-first-divergence"]
Mode = Literal["full-vocab", "top-k+rest"]

FULL_MASS_TOL = 1e-4
"""A row is a whole distribution when its probabilities sum to 1 within this (float32 logprobs of
a 512-token vocabulary sum to 1 within ~1e-6)."""
LOG_FLOOR = -69.0
"""log(1e-30): -inf logprobs are clamped here so 0 * log 0 stays finite."""
CHOSEN_TOL = 1e-4
"""A full row must give the engine's own chosen-token logprob back within this (nats): a row
written at the wrong position or for the wrong request, or never written (zeros), cannot pass."""


class AlignError(ValueError):
    """The two outputs cannot be lined up (missing logprobs, ragged rows); names the case and side."""


@dataclass(frozen=True, slots=True, eq=False)
class Aligned:
    """``n`` comparable positions of one case; arrays are float64 logprobs / int64 ids, ``[n, k]``."""

    case_id: str
    positions: int
    """How many positions line up (``n``)."""
    tokens: int
    """The oracle's generated length."""
    alignment: Alignment
    o_ids: np.ndarray
    o_lp: np.ndarray
    c_ids: np.ndarray
    c_lp: np.ndarray
    o_chosen: np.ndarray
    """[n] the oracle's logprob of its own token."""
    c_chosen: np.ndarray
    """[n] the candidate's logprob of the oracle's token (NaN where the candidate did not keep it)."""
    o_full: np.ndarray | None = None
    """[>= n, V] the oracle's whole distributions (column = id; rows ``[:positions]`` line up), when
    it has them; else None. The engine's own array, not a copy (:func:`facts` remembers by it)."""
    c_full: np.ndarray | None = None

    @property
    def k(self) -> tuple[int, int]:
        return int(self.o_ids.shape[1]), int(self.c_ids.shape[1])

    @property
    def full(self) -> bool:
        """Both sides hold whole distributions over the same vocabulary."""
        return (self.o_full is not None and self.c_full is not None
                and self.o_full.shape[1] == self.c_full.shape[1])

    def facts(self) -> RowFacts:
        """KL, NMSE parts and top tokens of the full rows at every aligned position (one pass)."""
        if not self.full:
            raise AlignError(f"{self.case_id}: full-vocab facts asked, but the sides hold "
                             f"{self.describe_k()}")
        assert self.o_full is not None and self.c_full is not None
        return cached_row_facts(self.o_full, self.c_full, self.positions)

    def describe_k(self) -> str:
        """``top-5 / full-49152``: what each side holds."""
        def side(full: np.ndarray | None, k: int) -> str:
            return f"full-{full.shape[1]}" if full is not None else f"top-{k}"
        return f"{side(self.o_full, self.k[0])} / {side(self.c_full, self.k[1])}"


def _rows(out: Output, side: str, case_id: str) -> tuple[np.ndarray, np.ndarray]:
    if out.top_ids is None or out.top_logprobs is None:
        raise AlignError(f"{case_id}: the {side} has no logprobs (record them with logprobs >= 1)")
    ids, lp = np.asarray(out.top_ids), np.asarray(out.top_logprobs)
    if ids.ndim != 2 or ids.shape != lp.shape:
        raise AlignError(f"{case_id}: the {side}'s top_ids {ids.shape} and top_logprobs {lp.shape} "
                         "must both be [positions, k]")
    if ids.shape[0] < len(out.token_ids):
        raise AlignError(f"{case_id}: the {side} has {ids.shape[0]} logprob rows for "
                         f"{len(out.token_ids)} tokens")
    return ids.astype(np.int64), np.maximum(lp.astype(np.float64), LOG_FLOOR)


def lookup(ids: np.ndarray, lp: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``lp`` of ``want[r, j]`` in row ``r`` of (ids, lp), NaN where row ``r`` does not hold it.

    Vectorised over all rows: k whole-array passes for small k, a scatter into [n, V] otherwise.
    """
    n, k = ids.shape
    kw = want.shape[1]
    if n == 0:
        return np.empty((0, kw))
    if k <= 64:
        got = np.full((n, kw), np.nan)
        for j in range(k):  # ids are unique within a row: at most one j matches
            np.copyto(got, lp[:, j:j + 1], where=want == ids[:, j:j + 1])
        return got
    vocab = int(max(ids.max(), want.max())) + 1
    dense = np.full((n, vocab), np.nan)
    rows = np.arange(n)[:, None]
    dense[rows, ids] = lp
    return dense[rows, want]


def align(oracle: Output, candidate: Output, case_id: str) -> Aligned:
    """The positions of ``oracle`` and ``candidate`` that were computed after the same prefix."""
    o_ids, o_lp = _rows(oracle, "oracle", case_id)
    c_ids, c_lp = _rows(candidate, "candidate", case_id)
    tokens = len(oracle.token_ids)
    d = first_divergence(oracle.token_ids, candidate.token_ids)
    if d is None:
        n, alignment = tokens, "teacher-forced"
    else:
        n, alignment = min(d + 1, tokens, len(candidate.token_ids)), "until-first-divergence"
    o_ids, o_lp, c_ids, c_lp = o_ids[:n], o_lp[:n], c_ids[:n], c_lp[:n]
    tok = np.asarray(oracle.token_ids[:n], np.int64)
    o_chosen = (np.asarray(oracle.chosen_logprobs[:n], np.float64) if oracle.chosen_logprobs is not None
                else lookup(o_ids, o_lp, tok[:, None])[:, 0])
    c_chosen = lookup(c_ids, c_lp, tok[:, None])[:, 0]
    if candidate.chosen_logprobs is not None:
        same = np.asarray(candidate.token_ids[:n], np.int64) == tok
        c_chosen = np.where(same, np.asarray(candidate.chosen_logprobs[:n], np.float64), c_chosen)
    o_full = _full_rows(oracle, "oracle", case_id, o_ids, o_lp, n)
    c_full = _full_rows(candidate, "candidate", case_id, c_ids, c_lp, n)
    if o_full is not None and c_full is not None and o_full.shape[1] != c_full.shape[1]:
        raise AlignError(f"{case_id}: the vocabularies differ: the oracle's rows hold {o_full.shape[1]} ids, "
                         f"the candidate's {c_full.shape[1]}")
    if c_full is not None:
        c_chosen = at(c_full[:n], tok)
    return Aligned(case_id, n, tokens, alignment, o_ids, o_lp, c_ids, c_lp,
                   np.maximum(o_chosen, LOG_FLOOR), np.maximum(c_chosen, LOG_FLOOR), o_full, c_full)


def _full_rows(out: Output, side: str, case_id: str, ids: np.ndarray, lp: np.ndarray, n: int
               ) -> np.ndarray | None:
    """The side's ``[n, V]`` whole distributions: its ``full_logprobs``, checked against its own
    chosen-token logprobs, or top-k rows that hold the whole vocabulary; None when it has neither."""
    full = out.full_logprobs
    if full is None:
        return dense_from_topk(ids, lp)
    if full.ndim != 2 or full.shape[0] < n:
        raise AlignError(f"{case_id}: the {side}'s full_logprobs {full.shape} must be [positions >= {n}, "
                         "vocabulary]")
    rows = full[:n]
    if out.chosen_logprobs is not None and n:  # cheap: one gather, no pass over the rows
        mine = np.asarray(out.token_ids[:n], np.int64)
        if mine.size and mine.max() >= full.shape[1]:
            raise AlignError(f"{case_id}: the {side} generated id {int(mine.max())}, outside its "
                             f"{full.shape[1]}-id full rows")
        want = np.asarray(out.chosen_logprobs[:n], np.float64)
        got = at(rows, mine[: len(want)])
        bad = np.flatnonzero(~(np.abs(got - want) <= CHOSEN_TOL) & np.isfinite(want))
        if bad.size:
            t = int(bad[0])
            raise AlignError(
                f"{case_id}: the {side}'s full row {t} gives token {int(mine[t])} logprob {got[t]:.6g}, "
                f"but the engine reported {want[t]:.6g} ({bad.size} rows disagree): the full rows are "
                "misplaced or were never written")
    return full


def by_id(ids: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """Rows of ``lp`` reordered by ascending token id (full-vocab rows then line up column by column)."""
    return np.take_along_axis(lp, np.argsort(ids, axis=1, kind="stable"), axis=1)


def renormalise(lp: np.ndarray) -> np.ndarray:
    """log-softmax of rows that already are logprobs: removes float32 rounding of the total mass."""
    m = lp.max(axis=1, keepdims=True)
    return lp - (m + np.log(np.exp(lp - m).sum(axis=1, keepdims=True)))
