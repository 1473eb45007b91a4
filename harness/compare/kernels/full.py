"""Full-vocabulary rows as arrays: KL, NMSE, top token and mass of two ``[n, V]`` logprob arrays.

A full distribution is a ``[positions, vocabulary]`` float32 array whose column is the token id
(:attr:`harness.api.Output.full_logprobs`; often a read-only memory map of a ``.npy`` file). For a
real vocabulary (49k-256k ids) that is 0.2-1 MB per position, so nothing here builds a dict per
position or a float64 copy of a whole case: one pass over the values gives every per-row fact the
comparators need (:func:`row_facts`; compiled, :mod:`harness.compare.kernels.compiled`, or numpy over slices
of about :data:`CHUNK_ELEMENTS` values):

* ``lse``: ``log sum exp(row)``, 0 for a distribution (a row that is not one is refused upstream);
* ``kl``: ``KL(o' || c')`` of the renormalised rows ``o' = o - lse_o`` and ``c' = c - lse_c``;
* ``sq_err`` / ``sq_ref``: ``sum (c' - o')^2`` and ``sum o'^2``, whose ratio is the NMSE;
* ``top``: the most likely id of each side (the lowest id on exact ties, as in top-k mode).

Renormalising removes float32 rounding of the total mass, as the top-k path does. With
``p = exp(o)``, ``S = sum p``, ``a = log S``, ``b = lse_c`` and ``D = sum p (o - c)``::

    KL(o' || c') = D / S - (a - b)
    sum (c' - o')^2 = sum d^2 - 2 (b - a) sum d + V (b - a)^2,     d = c - o
    sum o'^2        = sum o^2 - 2 a sum o + V a^2

all accumulated in float64, so a KL of 1e-9 nats is not lost in float32 rounding.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from harness.compare.kernels import compiled as kernels

LOG_FLOOR = -69.0
"""log(1e-30): -inf logprobs are clamped here so 0 * log 0 stays finite (as in top-k mode)."""
FULL_MASS_TOL = 1e-4
"""A row is a whole distribution when its probabilities sum to 1 within this (float32 logprobs of a
49k-id vocabulary sum to 1 within ~1e-6)."""
CHUNK_ELEMENTS = 1 << 18
"""Values per slice (rows x vocabulary): float64 temporaries of 2 MiB stay in cache."""


@dataclass(frozen=True, slots=True, eq=False)
class RowFacts:
    """Per-row facts of an oracle array ``o`` and a candidate array ``c`` (``[n]`` each)."""

    kl: np.ndarray
    sq_err: np.ndarray
    sq_ref: np.ndarray
    o_top: np.ndarray
    c_top: np.ndarray
    o_lse: np.ndarray
    c_lse: np.ndarray

    @property
    def positions(self) -> int:
        return int(self.kl.size)


def _f64(rows: np.ndarray) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    return np.maximum(x, LOG_FLOOR, out=x if x is not rows else None)


def row_facts(o: np.ndarray, c: np.ndarray, chunk_elements: int = CHUNK_ELEMENTS,
              compiled: bool = True) -> RowFacts:
    """Every per-row fact of two ``[n, V]`` logprob arrays in one pass over their values.

    float32 rows (what engines return) go through the compiled kernel
    (:func:`harness.compare.kernels.compiled.full_rows`: one read of each value, a vectorised ``exp``, rows
    over the cores); other dtypes, ``compiled=False``, a host without numba, and any row whose facts
    come out non-finite (NaN or +inf values) go through the numpy slices below. Both give the same
    facts within float64 rounding; the tests hold both to a naive float64 computation."""
    if o.ndim != 2 or o.shape != c.shape:
        raise ValueError(f"full rows: shapes differ or are not [positions, vocabulary]: oracle {o.shape}, "
                         f"candidate {c.shape}")
    if not (compiled and o.dtype == np.float32 and c.dtype == np.float32 and kernels.available()):
        return _row_facts_numpy(o, c, chunk_elements)
    n, v = o.shape
    sums, top = kernels.full_rows(o, c)
    a, b = sums[:, 0], sums[:, 1]
    delta = b - a
    facts = RowFacts(kl=np.maximum(-sums[:, 2] - (a - b), 0.0),
                     sq_err=np.maximum(sums[:, 4] - 2 * delta * sums[:, 3] + v * delta**2, 0.0),
                     sq_ref=np.maximum(sums[:, 6] - 2 * a * sums[:, 5] + v * a**2, 0.0),
                     o_top=top[:, 0].copy(), c_top=top[:, 1].copy(), o_lse=a.copy(), c_lse=b.copy())
    bad = np.flatnonzero(~np.isfinite(sums).all(axis=1))
    if bad.size:  # NaN or +inf values: numpy's own semantics for those rows
        redo = _row_facts_numpy(o[bad], c[bad], chunk_elements)
        for name in ("kl", "sq_err", "sq_ref", "o_top", "c_top", "o_lse", "c_lse"):
            getattr(facts, name)[bad] = getattr(redo, name)
    return facts


def _row_facts_numpy(o: np.ndarray, c: np.ndarray, chunk_elements: int = CHUNK_ELEMENTS) -> RowFacts:
    """:func:`row_facts` with numpy, over slices of about ``chunk_elements`` values."""
    n, v = o.shape
    out = {k: np.empty(n) for k in ("kl", "sq_err", "sq_ref", "o_lse", "c_lse")}
    o_top, c_top = np.empty(n, np.int64), np.empty(n, np.int64)
    step = max(1, chunk_elements // max(v, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        oo, cc = _f64(o[lo:hi]), _f64(c[lo:hi])
        o_top[lo:hi] = oo.argmax(axis=1)
        c_top[lo:hi] = cc.argmax(axis=1)
        d = cc - oo  # c - o
        sum_d = d.sum(axis=1)
        sum_d2 = np.einsum("ij,ij->i", d, d)
        sum_o = oo.sum(axis=1)
        sum_o2 = np.einsum("ij,ij->i", oo, oo)
        p = np.exp(oo)
        s = p.sum(axis=1)
        dd = -np.einsum("ij,ij->i", p, d)  # sum p (o - c)
        np.exp(cc, out=cc)
        a, b = np.log(s), np.log(cc.sum(axis=1))
        delta = b - a
        out["kl"][lo:hi] = np.maximum(dd / s - (a - b), 0.0)
        out["sq_err"][lo:hi] = np.maximum(sum_d2 - 2 * delta * sum_d + v * delta**2, 0.0)
        out["sq_ref"][lo:hi] = np.maximum(sum_o2 - 2 * a * sum_o + v * a**2, 0.0)
        out["o_lse"][lo:hi], out["c_lse"][lo:hi] = a, b
    return RowFacts(out["kl"], out["sq_err"], out["sq_ref"], o_top, c_top, out["o_lse"], out["c_lse"])


_MEMO: dict[tuple[int, int, int], tuple[weakref.ref, weakref.ref, RowFacts]] = {}
_MEMO_SIZE = 64


def cached_row_facts(o: np.ndarray, c: np.ndarray, n: int) -> RowFacts:
    """:func:`row_facts` of ``o[:n]`` and ``c[:n]``, remembered for as long as both arrays live.

    A gate asks for the same pair several times (KL, drift and NMSE per case and pooled, the
    distribution table, the controls' positive copies); one pass per pair is enough."""
    key = (id(o), id(c), n)
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is o and hit[1]() is c:
        return hit[2]
    facts = row_facts(o[:n], c[:n])
    try:
        refs = (weakref.ref(o), weakref.ref(c))
    except TypeError:  # an array type without weak references: compute every time
        return facts
    if len(_MEMO) >= _MEMO_SIZE:
        for k in [k for k, v in _MEMO.items() if v[0]() is None or v[1]() is None] or list(_MEMO)[:1]:
            _MEMO.pop(k, None)
    _MEMO[key] = (*refs, facts)
    return facts


def row_lse(x: np.ndarray, chunk_elements: int = CHUNK_ELEMENTS) -> np.ndarray:
    """``log sum exp`` of every row of ``[n, V]`` logprobs (0 for distributions), in slices."""
    n, v = x.shape
    out = np.empty(n)
    step = max(1, chunk_elements // max(v, 1))
    for lo in range(0, n, step):
        out[lo:lo + step] = np.log(np.exp(_f64(x[lo:lo + step])).sum(axis=1))
    return out


def at(x: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``x[t, tokens[t]]`` for every row (float64)."""
    return np.asarray(x[np.arange(len(tokens)), np.asarray(tokens, np.int64)], np.float64)


def topk(x: np.ndarray, k: int, chunk_elements: int = CHUNK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` (ids int32, logprobs float32) of every row, best first (lowest id on ties)."""
    n, v = x.shape
    k = min(k, v)
    ids, lps = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
    step = max(1, chunk_elements // max(v, 1))
    for lo in range(0, n, step):
        rows = np.asarray(x[lo:lo + step], np.float32)
        part = (np.argpartition(-rows, k - 1, axis=1)[:, :k] if k < v
                else np.tile(np.arange(v), (len(rows), 1)))
        vals = np.take_along_axis(rows, part, axis=1)
        order = np.lexsort((part, -vals), axis=1)
        ids[lo:lo + step] = np.take_along_axis(part, order, axis=1)
        lps[lo:lo + step] = np.take_along_axis(vals, order, axis=1)
    return ids, lps


def dense_from_topk(ids: np.ndarray, lp: np.ndarray) -> np.ndarray | None:
    """Top-k rows that hold the whole vocabulary (k = V, every id once per row, mass 1 within
    ``FULL_MASS_TOL``; goldens recorded with ``logprobs`` = the vocabulary size) as ``[n, V]`` rows
    ordered by id; None otherwise."""
    n, k = ids.shape
    if n == 0 or k < 2:
        return None
    srt = np.sort(ids, axis=1)
    if srt[:, 0].min() != 0 or srt[:, -1].max() != k - 1 or not np.array_equal(srt, np.broadcast_to(
            np.arange(k), srt.shape)):
        return None
    if not np.all(np.abs(np.exp(np.asarray(lp, np.float64)).sum(axis=1) - 1) < FULL_MASS_TOL):
        return None
    dense = np.empty((n, k), lp.dtype)
    np.put_along_axis(dense, ids.astype(np.int64), lp, axis=1)
    return dense
