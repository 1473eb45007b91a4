"""Planting primitives shared by the comparators' controls (:mod:`harness.compare.unit`).

Each comparator module declares its own mutations; what several of them plant — a copy of the
golden with one token flipped or dropped, a distribution with its top-1 lowered, the reference
figures written out independently of the comparators' own kernels — lives here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from harness.api import Case, Output
from harness.compare.kernels.full import at, topk
from harness.compare.unit import Planted

OVER_BAR = 10.0
"""Planted KL/NMSE/drift perturbations are at least this many times the comparator's bar."""


def top_rows(o: Output) -> tuple[np.ndarray, np.ndarray] | None:
    if o.top_ids is None or o.top_logprobs is None:
        return None
    ids, lp = np.asarray(o.top_ids), np.asarray(o.top_logprobs, np.float64)
    if ids.ndim != 2 or ids.shape != lp.shape:
        return None
    return ids, lp


def outside(row: np.ndarray | None, avoid: int) -> int:
    """The smallest token id that is neither ``avoid`` nor in ``row`` (so: not in the oracle's top-k)."""
    taken = {int(avoid)} | (set(int(x) for x in row) if row is not None else set())
    t = 0
    while t in taken:
        t += 1
    return t


def own_logprobs(o: Output, ids: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """The oracle's logprob of its own token at each position (from chosen_logprobs, else top-k)."""
    n = min(len(o.token_ids), len(ids))
    if o.chosen_logprobs is not None:
        return np.asarray(o.chosen_logprobs, np.float64)[:n]
    tok = np.asarray(o.token_ids[:n])[:, None]
    hit = ids[:n] == tok
    return np.where(hit.any(axis=1), np.where(hit, lp[:n], -np.inf).max(axis=1), np.nan)


def decisive(o: Output) -> int:
    """The position where the oracle was most sure of its token (largest top-1/top-2 gap)."""
    r = top_rows(o)
    n = len(o.token_ids)
    if r is None or r[1].shape[1] < 2 or len(r[1]) < n:
        return n // 2
    s = np.sort(r[1][:n], axis=1)
    return int(np.argmax(s[:, -1] - s[:, -2]))


def plant_decisive_flip(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    t = decisive(oracle)
    r = top_rows(oracle)
    alt = outside(r[0][t] if r is not None and t < len(r[0]) else None, oracle.token_ids[t])
    return Planted(oracle, swap(oracle, t, alt), f"flipped position {t} to id {alt}")


def _flip_text(text: str, t: int, n: int) -> str:
    """``text`` with one character changed near token ``t`` of ``n``: a text-only comparator (strict
    on text) sees the mutation too."""
    if not text:
        return text
    i = min(len(text) - 1, round(t / max(n, 1) * len(text)))
    return text[:i] + ("#" if text[i] != "#" else "$") + text[i + 1:]


def swap(oracle: Output, t: int, alt: int) -> Output:
    toks = list(oracle.token_ids)
    toks[t] = alt
    return replace(oracle.with_tokens(toks), text=_flip_text(oracle.text, t, len(toks)))


def plant_truncate(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    return Planted(oracle, replace(oracle.with_tokens(oracle.token_ids[:-1]), text=oracle.text[:-1]), "")


def plant_identity(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.top_ids is None:
        return "the golden has no logprobs"
    return Planted(oracle, replace(oracle), "")


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def reference_kl(o_lp: np.ndarray, c_lp: np.ndarray) -> np.ndarray:
    """KL(p || q) per row over {the k shared ids} + {rest}, written independently of compare.kl."""
    p, q = np.exp(o_lp), np.exp(c_lp)
    p_rest = np.clip(1 - p.sum(axis=1), 0, 1)
    q_rest = np.clip(1 - q.sum(axis=1), 1e-30, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = np.where(p_rest > 0, p_rest * np.log(np.maximum(p_rest, 1e-30) / q_rest), 0.0)
    return (p * (o_lp - c_lp)).sum(axis=1) + rest


def covers_vocab(lp: np.ndarray) -> bool:
    return bool(lp.size) and bool(np.all(np.abs(np.exp(lp).sum(axis=1) - 1) < 1e-4))


def with_logprobs(oracle: Output, lp: np.ndarray) -> Output:
    ids = np.asarray(oracle.top_ids)
    tok = np.asarray(oracle.token_ids[: len(ids)])[:, None]
    hit = ids[: len(tok)] == tok
    chosen = np.where(hit, lp[: len(tok)], -np.inf).max(axis=1).astype(np.float32)
    return replace(oracle, top_logprobs=lp.astype(np.float32), chosen_logprobs=chosen)


def with_full(oracle: Output, c_full: np.ndarray) -> Output:
    """A copy of ``oracle`` whose whole distributions are ``c_full``: top-k rows and chosen logprobs
    recomputed from it, so the copy is self-consistent."""
    k = int(np.asarray(oracle.top_ids).shape[1]) if oracle.top_ids is not None else 5
    ids, lps = topk(c_full, k)
    tok = np.asarray(oracle.token_ids[: len(c_full)], np.int64)
    return replace(oracle, top_ids=ids, top_logprobs=lps, full_logprobs=c_full,
                 chosen_logprobs=at(c_full, tok).astype(np.float32))


def top1(full: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(argmax id, its probability) of rows ``[:n]``."""
    top = np.asarray(full[:n]).argmax(axis=1)
    return top, np.exp(np.asarray(full[np.arange(n), top], np.float64))


def lower_top1(full: np.ndarray, n: int, d: np.ndarray) -> np.ndarray:
    """Rows ``[:n]`` with the top-1 logprob lowered by ``d[t]`` nats and renormalised (float32).

    Lowering one entry by d and renormalising subtracts ``L = log(1 - p1 (1 - e^-d))`` from every
    entry and d more from the top one, so the reference KL is ``p1 d + L`` per row."""
    top, p1 = top1(full, n)
    shift = np.log1p(-p1 * -np.expm1(-d))
    c = np.array(full[:n], np.float32, copy=True)
    c -= shift.astype(np.float32)[:, None]
    c[np.arange(n), top] -= d.astype(np.float32)
    return c


def reference_kl_top1(full: np.ndarray, n: int, d: np.ndarray) -> np.ndarray:
    _, p1 = top1(full, n)
    return p1 * d + np.log1p(-p1 * -np.expm1(-d))


SHIFTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
"""Nats by which the planted top-1 is lowered, smallest first, until the figure clears the bar."""


def lower_top1_until(oracle: Output, profile: np.ndarray, figure: Callable[[np.ndarray], float],
                     bar: float, label: str) -> Planted | str:
    """A copy of ``oracle`` with the top-1 logprob of position t lowered by ``d * profile[t]``, for
    the smallest ``d`` in :data:`SHIFTS` whose ``figure`` of the per-position reference KL reaches
    :data:`OVER_BAR` times ``bar``; whole rows (full-vocab, or top-k rows holding all the mass) are
    renormalised. ``label`` names the figure in the note."""
    n = len(profile)
    full = oracle.full_logprobs
    if full is None:
        lp = top_rows(oracle)[1][:n]  # type: ignore[index]
        top, whole = lp.argmax(axis=1), covers_vocab(lp)
    for d in SHIFTS:
        if full is not None:
            value = figure(reference_kl_top1(full, n, d * profile))
        else:
            c = lp.copy()
            c[np.arange(n), top] -= d * profile
            c = log_softmax(c) if whole else c
            value = figure(reference_kl(lp, c))
        if value >= OVER_BAR * bar:
            if full is not None:
                planted = with_full(oracle, lower_top1(full, n, d * profile))
            else:
                rows = np.array(oracle.top_logprobs, np.float64, copy=True)
                rows[:n] = c
                planted = with_logprobs(oracle, rows)
            where = " in the full rows" if full is not None else ""
            return Planted(oracle, planted, f"top-1 lowered by {d:g} x {profile.max():g} nats{where}: "
                                            f"reference {label} {value:.3g} >= {OVER_BAR:g}x bar {bar:g}")
    return f"no shift of the top-1 reaches {OVER_BAR:g}x the {label} bar (the top token carries no mass?)"
