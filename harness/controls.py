"""The vacuous-gate guard: planted mutations that prove a comparator can fail.

A gate that passes says little unless it *could* have failed. Beside every comparator of a suite the
gate plants mutations in memory, against the very goldens it judged, and checks the comparator's
answer:

* a **must-fail** mutation (a flipped decisive token, a swap beyond the near-tie bar, a distribution
  perturbed above the KL/NMSE bar, a flipped byte of a KV page) must be judged ``fail``;
* a **positive control** (a swap within the near-tie bar, an unperturbed copy) must be judged ``pass``;
* a **golden check** looks for degenerate goldens a comparator cannot bite on: empty or constant
  generations, missing logprobs, top-k logprobs that are not a distribution (an all-zero array),
  all-zero top-1/top-2 gaps, a k smaller than the comparator needs.

A must-fail mutation that passes, one that cannot be planted at all (nothing in the goldens to plant
it on), or a fatal golden check makes a *gated* comparator **vacuous**: the record's outcome is
``vacuous`` and the gate does not count as passed. A positive control that fails does not make the
gate vacuous (it can still fail) but FEATURES.md shows the row as partial.

Extension point: one :class:`ControlSet` per comparator key, in :data:`CONTROLS`. A new comparator
registers its mutations with :func:`register`; a *gated* comparator with no registered set is
``unguarded`` and therefore vacuous, so a new gate cannot pass silently without its controls::

    register(ControlSet("my_cmp", needs=Needs(logprobs=True, min_k=2),
                        mutations=(Mutation("shift logprobs", "fail", plant_shift),)))

A mutation's ``plant(comparator, case, oracle)`` returns a :class:`Planted` pair to judge, or a
string saying why nothing could be planted in that case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.api import Case, Output, Verdict
from harness.records import Control, Outcome
from harness.registry import Registry

GOLDEN_CHECK = "golden:"
"""Prefix of the ``mutation`` of a golden check (a control that plants nothing)."""
UNGUARDED = "no controls registered"
MARGIN_NATS = 1e-3
"""A planted gap must clear the near-tie bar by this much, so float rounding cannot decide it."""
OVER_BAR = 10.0
"""Planted KL/NMSE perturbations are at least this many times the comparator's bar."""


@dataclass(frozen=True, slots=True, eq=False)
class Planted:
    """What a mutation made of one case: the pair the comparator is asked to judge."""

    oracle: Output
    """Usually the golden itself; a synthetic positive control may edit a copy."""
    candidate: Output
    note: str = ""


Plant = Callable[[Any, Case, Output], "Planted | str"]


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    expect: Literal["fail", "pass"]
    plant: Plant
    """(comparator, case, oracle output) -> Planted, or why nothing could be planted in this case."""


@dataclass(frozen=True, slots=True)
class Needs:
    """What a comparator needs from the goldens to be able to fail."""

    logprobs: bool = False
    min_k: int = 0
    full_vocab: bool = False
    gaps: bool = False
    """Needs top-1/top-2 logprob gaps that are not all zero (near-tie bars, KL)."""


@dataclass(frozen=True, slots=True)
class ControlSet:
    key: str
    """The comparator key (``Comparator.key``) these controls guard."""
    mutations: tuple[Mutation, ...]
    needs: Needs = field(default_factory=Needs)


CONTROLS: Registry[ControlSet] = Registry("control set")
"""Comparator key -> its controls. Filled by :func:`register` below and by other modules."""


def register(cs: ControlSet) -> ControlSet:
    return CONTROLS.register(cs.key)(cs)


def vacuates(c: Control) -> bool:
    """Whether control ``c`` shows its comparator could not have failed."""
    return not c.ok and (c.expect == "fail" or c.mutation.startswith(GOLDEN_CHECK)
                         or c.mutation == UNGUARDED)


def vacuous_reasons(controls: Sequence[Control], comparators: Sequence[str]) -> list[str]:
    """One line per control that makes one of ``comparators`` vacuous (empty: none does)."""
    return [f"{c.comparator}: {c.mutation} expected {c.expect}, got {c.got}"
            + (f" ({c.note})" if c.note else "")
            for c in controls if c.comparator in comparators and vacuates(c)]


def failed_positive(controls: Sequence[Control], comparators: Sequence[str]) -> list[str]:
    return [f"{c.comparator}: positive control {c.mutation!r} got {c.got}"
            for c in controls if c.comparator in comparators and not c.ok and not vacuates(c)]


# ---------------------------------------------------------------------------------------------
# running them


def run_controls(comparator: Any, cases: Sequence[Case], oracles: Mapping[str, Output]) -> list[Control]:
    """Every golden check and planted mutation registered for ``comparator.key``, over ``cases``."""
    key = str(comparator.key)
    cs = CONTROLS.find(key)
    if cs is None:
        return [Control(key, UNGUARDED, "fail", "unguarded", False,
                        f"register a ControlSet for {key!r} in harness.controls")]
    outs = [(c, oracles[c.id]) for c in cases if c.id in oracles]
    controls = golden_checks(key, cs.needs, [o for _, o in outs])
    for m in cs.mutations:
        controls.append(_run_mutation(comparator, key, m, outs))
    return controls


def _short(ids: Sequence[str], n: int = 4) -> str:
    return ", ".join(ids[:n]) + (f" +{len(ids) - n}" if len(ids) > n else "")


def _run_mutation(comparator: Any, key: str, m: Mutation,
                  outs: Sequence[tuple[Case, Output]]) -> Control:
    got: dict[str, str] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    for case, oracle in outs:
        p = m.plant(comparator, case, oracle)
        if isinstance(p, str):
            skipped[case.id] = p
            continue
        v: Verdict = comparator.compare(p.oracle, p.candidate, case)
        got[case.id] = v.status
        if p.note and p.note not in notes:
            notes.append(p.note)
    if not got:
        why = sorted(set(skipped.values()))
        return Control(key, m.name, m.expect, "unplantable", False,
                       "nothing to plant it on: " + "; ".join(why)[:300])
    wrong = [cid for cid, s in got.items() if s != m.expect]
    counts = Counter(got.values())
    if wrong:
        text = f"{got[wrong[0]]} {len(wrong)}/{len(got)} ({_short(wrong)})"
    else:
        text = f"{m.expect} {counts[m.expect]}/{len(got)}"
    note = []
    if skipped:
        note.append(f"not plantable in {_short(sorted(skipped))}: {sorted(set(skipped.values()))[0]}")
    note += notes[:2]
    return Control(key, m.name, m.expect, text, not wrong, "; ".join(note)[:400])


# ---------------------------------------------------------------------------------------------
# golden checks


def _rows(o: Output) -> tuple[np.ndarray, np.ndarray] | None:
    if o.top_ids is None or o.top_logprobs is None:
        return None
    ids, lp = np.asarray(o.top_ids), np.asarray(o.top_logprobs, np.float64)
    if ids.ndim != 2 or ids.shape != lp.shape:
        return None
    return ids, lp


def golden_checks(key: str, needs: Needs, oracles: Sequence[Output]) -> list[Control]:
    """Degenerate goldens ``key`` cannot bite on. ``ok`` is False only when it is fatal for the gate."""
    out = []
    n = len(oracles)
    empty = [o.case_id for o in oracles if len(o.token_ids) == 0]
    const = [o.case_id for o in oracles if len(o.token_ids) > 1 and len(set(o.token_ids)) == 1]
    seqs = {o.token_ids for o in oracles}
    fatal = []
    if n == 0:
        fatal.append("no golden outputs")
    if n and len(empty) == n:
        fatal.append("every generation is empty")
    if n > 1 and len(const) == n:
        fatal.append("every generation repeats one token")
    if n > 1 and len(seqs) == 1:
        fatal.append("every case generated the same tokens")
    flags = []
    if empty and len(empty) < n:
        flags.append(f"empty in {_short(empty)}")
    if const and len(const) < n:
        flags.append(f"constant in {_short(const)}")
    out.append(Control(key, GOLDEN_CHECK + " generations", "pass",
                       "degenerate" if fatal else "ok", not fatal, "; ".join(fatal + flags)))

    if not (needs.logprobs or needs.min_k or needs.full_vocab or needs.gaps):
        return out
    rows = {o.case_id: _rows(o) for o in oracles}
    missing = [cid for cid, r in rows.items() if r is None]
    have = {cid: r for cid, r in rows.items() if r is not None}
    fatal, flags = [], []
    if missing and not have:
        fatal.append("no case has logprobs")
    elif missing:
        flags.append(f"no logprobs in {_short(missing)}")
    ks = sorted({r[0].shape[1] for r in have.values()})
    if have and needs.min_k and ks[0] < needs.min_k:
        fatal.append(f"k={ks[0]}, {key} needs k >= {needs.min_k}")
    if have:
        mass = np.concatenate([np.exp(r[1]).sum(axis=1) for r in have.values()])
        full = [o for o in oracles if o.full_logprobs is not None]
        if mass.size and float(mass.max()) > 1.0 + 1e-3:
            fatal.append(f"top-{ks[-1]} probabilities sum to {float(mass.max()):.3g} > 1: "
                         "not a distribution (an all-zero logprob array?)")
        elif full:
            from harness.compare.full import FULL_MASS_TOL, row_lse

            lse = np.concatenate([row_lse(o.full_logprobs[: len(o.token_ids)]) for o in full])
            lacking = [o.case_id for o in oracles if o.full_logprobs is None and o.case_id in have]
            if lse.size and not float(np.abs(np.expm1(lse)).max()) <= FULL_MASS_TOL:
                fatal.append(f"full-vocab rows are not distributions: mass {float(np.exp(lse.min())):.6g}"
                             f"..{float(np.exp(lse.max())):.6g} (rows never written?)")
            elif needs.full_vocab and lacking:
                fatal.append(f"{key} needs full-vocab logprobs; {_short(lacking)} hold top-{ks[-1]} only")
            else:
                flags.append(f"full-vocab rows: {full[0].full_logprobs.shape[1]} ids")
        elif needs.full_vocab and mass.size and float(np.abs(mass - 1).max()) > 1e-4:
            fatal.append(f"{key} needs full-vocab logprobs; the goldens hold top-{ks[-1]} "
                         f"(mass {float(mass.min()):.3g}..{float(mass.max()):.3g})")
    if have and needs.gaps and ks[-1] >= 2:
        gaps = np.concatenate([np.sort(r[1], axis=1)[:, -1] - np.sort(r[1], axis=1)[:, -2]
                               for r in have.values() if r[1].shape[1] >= 2 and len(r[1])])
        if gaps.size and not np.any(np.abs(gaps) > 0):
            fatal.append("every top-1/top-2 logprob gap is zero")
        elif gaps.size:
            flags.append(f"gaps {float(gaps.min()):.3g}..{float(gaps.max()):.3g} nats")
    out.append(Control(key, GOLDEN_CHECK + " logprobs", "pass", "degenerate" if fatal else "ok",
                       not fatal, "; ".join(fatal + flags)))
    return out


# ---------------------------------------------------------------------------------------------
# token mutations (strict, near-tie)


def _copy(o: Output, **kw: Any) -> Output:
    d = dict(case_id=o.case_id, token_ids=o.token_ids, text=o.text, top_ids=o.top_ids,
             top_logprobs=o.top_logprobs, chosen_logprobs=o.chosen_logprobs,
             finish_reason=o.finish_reason, error=o.error, full_logprobs=o.full_logprobs)
    d.update(kw)
    return Output(**d)


def _outside(row: np.ndarray | None, avoid: int) -> int:
    """The smallest token id that is neither ``avoid`` nor in ``row`` (so: not in the oracle's top-k)."""
    taken = {int(avoid)} | (set(int(x) for x in row) if row is not None else set())
    t = 0
    while t in taken:
        t += 1
    return t


def _chosen(o: Output, ids: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """The oracle's logprob of its own token at each position (from chosen_logprobs, else top-k)."""
    n = min(len(o.token_ids), len(ids))
    if o.chosen_logprobs is not None:
        return np.asarray(o.chosen_logprobs, np.float64)[:n]
    tok = np.asarray(o.token_ids[:n])[:, None]
    hit = ids[:n] == tok
    return np.where(hit.any(axis=1), np.where(hit, lp[:n], -np.inf).max(axis=1), np.nan)


def _decisive(o: Output) -> int:
    """The position where the oracle was most sure of its token (largest top-1/top-2 gap)."""
    r = _rows(o)
    n = len(o.token_ids)
    if r is None or r[1].shape[1] < 2 or len(r[1]) < n:
        return n // 2
    s = np.sort(r[1][:n], axis=1)
    return int(np.argmax(s[:, -1] - s[:, -2]))


def plant_decisive_flip(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    t = _decisive(oracle)
    r = _rows(oracle)
    alt = _outside(r[0][t] if r is not None and t < len(r[0]) else None, oracle.token_ids[t])
    return Planted(oracle, _swap(oracle, t, alt), f"flipped position {t} to id {alt}")


def _swaps(comp: Any, oracle: Output) -> list[tuple[float, int, int]] | str:
    """(gap, position, alternative id) of every top-k alternative to the oracle's token."""
    if oracle.error is not None:
        return "the golden has an error"
    if not oracle.token_ids:
        return "the golden generation is empty"
    r = _rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    ids, lp = r
    if ids.shape[1] < 2:
        return f"k={ids.shape[1]}: no alternative token in the top-k"
    chosen = _chosen(oracle, ids, lp)
    out = []
    for t in range(min(len(oracle.token_ids), len(ids), len(chosen))):
        for j in range(ids.shape[1]):
            alt = int(ids[t, j])
            if alt != oracle.token_ids[t] and np.isfinite(chosen[t]) and np.isfinite(lp[t, j]):
                out.append((float(chosen[t] - lp[t, j]), t, alt))
    return out


def _flip_text(text: str, t: int, n: int) -> str:
    """``text`` with one character changed near token ``t`` of ``n``: a text-only comparator (strict
    on text) sees the mutation too."""
    if not text:
        return text
    i = min(len(text) - 1, round(t / max(n, 1) * len(text)))
    return text[:i] + ("#" if text[i] != "#" else "$") + text[i + 1:]


def _swap(oracle: Output, t: int, alt: int) -> Output:
    toks = list(oracle.token_ids)
    toks[t] = alt
    return _copy(oracle.with_tokens(toks), text=_flip_text(oracle.text, t, len(toks)))


def plant_beyond_bar(comp: Any, case: Case, oracle: Output) -> Planted | str:
    bar = float(comp.threshold_nats)
    s = _swaps(comp, oracle)
    if isinstance(s, str):
        return s
    beyond = [x for x in s if x[0] > bar + MARGIN_NATS]
    if not beyond:
        top = max((x[0] for x in s), default=float("nan"))
        return (f"no top-k alternative is more than {bar:g} nats below the oracle's token "
                f"(largest gap {top:.3g}: all-zero gaps?)")
    gap, t, alt = min(beyond)  # the one closest to the bar tests the bar itself
    return Planted(oracle, _swap(oracle, t, alt), f"smallest planted gap {gap:.3g} nats > bar {bar:g}")


def plant_within_bar(comp: Any, case: Case, oracle: Output) -> Planted | str:
    bar = float(comp.threshold_nats)
    s = _swaps(comp, oracle)
    if isinstance(s, str):
        return s
    within = [x for x in s if 0.0 <= x[0] <= bar - MARGIN_NATS]
    if within:
        gap, t, alt = max(within)  # the one closest to the bar
        return Planted(oracle, _swap(oracle, t, alt), "")
    # No natural near-tie: make one in a copy of the oracle (rank 1 at half the bar).
    ids, lp = _rows(oracle)  # type: ignore[misc]
    t = 0
    chosen = _chosen(oracle, ids, lp)
    alt = int(ids[t, 1]) if int(ids[t, 1]) != oracle.token_ids[t] else int(ids[t, 0])
    lp2 = np.array(oracle.top_logprobs, dtype=np.float32, copy=True)
    j = int(np.nonzero(ids[t] == alt)[0][0])
    lp2[t, j] = np.float32(chosen[t] - bar / 2)
    synth = _copy(oracle, top_logprobs=lp2)
    return Planted(synth, _swap(synth, t, alt), "synthetic tie (no natural one within the bar)")


def plant_outside_topk(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    r = _rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    t = _decisive(oracle)
    return Planted(oracle, _swap(oracle, t, _outside(r[0][t], oracle.token_ids[t])), "")


def plant_truncate(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    return Planted(oracle, _copy(oracle.with_tokens(oracle.token_ids[:-1]), text=oracle.text[:-1]), "")


# ---------------------------------------------------------------------------------------------
# distribution mutations (kl, nmse)


def _log_softmax(x: np.ndarray) -> np.ndarray:
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


def _full_vocab(lp: np.ndarray) -> bool:
    return bool(lp.size) and bool(np.all(np.abs(np.exp(lp).sum(axis=1) - 1) < 1e-4))


def _with_logprobs(oracle: Output, lp: np.ndarray) -> Output:
    ids = np.asarray(oracle.top_ids)
    tok = np.asarray(oracle.token_ids[: len(ids)])[:, None]
    hit = ids[: len(tok)] == tok
    chosen = np.where(hit, lp[: len(tok)], -np.inf).max(axis=1).astype(np.float32)
    return _copy(oracle, top_logprobs=lp.astype(np.float32), chosen_logprobs=chosen)


# Whole distributions ([T, V] full_logprobs): the same mutations, planted in slices of rows so that
# a 49k-256k vocabulary never needs a float64 copy of a case, with the reference figures written
# out in closed form (not through harness.compare.full).


def _with_full(oracle: Output, c_full: np.ndarray) -> Output:
    """A copy of ``oracle`` whose whole distributions are ``c_full``: top-k rows and chosen logprobs
    recomputed from it, so the copy is self-consistent."""
    from harness.compare.full import at, topk

    k = int(np.asarray(oracle.top_ids).shape[1]) if oracle.top_ids is not None else 5
    ids, lps = topk(c_full, k)
    tok = np.asarray(oracle.token_ids[: len(c_full)], np.int64)
    return _copy(oracle, top_ids=ids, top_logprobs=lps, full_logprobs=c_full,
                 chosen_logprobs=at(c_full, tok).astype(np.float32))


def _top1(full: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(argmax id, its probability) of rows ``[:n]``."""
    top = np.asarray(full[:n]).argmax(axis=1)
    return top, np.exp(np.asarray(full[np.arange(n), top], np.float64))


def _lower_top1(full: np.ndarray, n: int, d: np.ndarray) -> np.ndarray:
    """Rows ``[:n]`` with the top-1 logprob lowered by ``d[t]`` nats and renormalised (float32).

    Lowering one entry by d and renormalising subtracts ``L = log(1 - p1 (1 - e^-d))`` from every
    entry and d more from the top one, so the reference KL is ``p1 d + L`` per row."""
    top, p1 = _top1(full, n)
    shift = np.log1p(-p1 * -np.expm1(-d))
    c = np.array(full[:n], np.float32, copy=True)
    c -= shift.astype(np.float32)[:, None]
    c[np.arange(n), top] -= d.astype(np.float32)
    return c


def _reference_kl_top1(full: np.ndarray, n: int, d: np.ndarray) -> np.ndarray:
    _, p1 = _top1(full, n)
    return p1 * d + np.log1p(-p1 * -np.expm1(-d))


def _plant_full_kl(comp: Any, oracle: Output) -> Planted | str:
    full = oracle.full_logprobs
    assert full is not None
    n = min(len(oracle.token_ids), len(full))
    if n == 0:
        return "the golden generation is empty"
    bar = float(comp.max_mean)
    for d in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        kl = float(_reference_kl_top1(full, n, np.full(n, d)).mean())
        if kl >= OVER_BAR * bar:
            return Planted(oracle, _with_full(oracle, _lower_top1(full, n, np.full(n, d))),
                           f"top-1 lowered by {d:g} nats in the full rows: reference mean KL {kl:.3g} >= "
                           f"{OVER_BAR:g}x bar {bar:g}")
    return f"no shift of the top-1 reaches {OVER_BAR:g}x the KL bar (the top token carries no mass?)"


def _noisy_full(full: np.ndarray, n: int, s: float, seed: int = 0) -> tuple[np.ndarray, float]:
    """Rows ``[:n]`` plus ``s`` x standard normal noise, renormalised, and their reference NMSE
    against the rows (both in float64 slices of about 2^18 values)."""
    out = np.empty((n, full.shape[1]), np.float32)
    num = den = 0.0
    rng = np.random.default_rng(seed)
    step = max(1, (1 << 18) // full.shape[1])
    for lo in range(0, n, step):
        ref = np.asarray(full[lo:min(n, lo + step)], np.float64)
        x = _log_softmax(ref + s * rng.standard_normal(ref.shape))
        out[lo:lo + len(ref)] = x
        num += float(((x - ref) ** 2).sum())
        den += float((ref**2).sum())
    return out, (num / den if den else float("inf"))


def _plant_full_nmse(comp: Any, oracle: Output) -> Planted | str:
    full = oracle.full_logprobs
    assert full is not None
    n = min(len(oracle.token_ids), len(full))
    if n == 0:
        return "the golden generation is empty"
    bar = float(comp.max_nmse)
    for s in (1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0):
        c, v = _noisy_full(full, n, s)
        if v >= OVER_BAR * bar:
            return Planted(oracle, _with_full(oracle, c),
                           f"noise {s:g} on the full rows: reference NMSE {v:.3g} >= {OVER_BAR:g}x "
                           f"bar {bar:g}")
    return f"no perturbation reaches {OVER_BAR:g}x the NMSE bar"


def _plant_full_ramp(comp: Any, oracle: Output, n: int) -> Planted | str:
    full = oracle.full_logprobs
    assert full is not None
    bar = float(comp.max_slope_per_1k)
    ramp = np.arange(n) / (n - 1)
    for d in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        slope = float(np.polyfit(np.arange(n), _reference_kl_top1(full, n, d * ramp), 1)[0]) * 1000
        if slope >= OVER_BAR * max(bar, 0.0):
            return Planted(oracle, _with_full(oracle, _lower_top1(full, n, d * ramp)),
                           f"top-1 lowered by a 0..{d:g} nats ramp in the full rows: reference slope "
                           f"{slope:.3g} nats/1k >= {OVER_BAR:g}x bar {bar:g}")
    return f"no ramp reaches {OVER_BAR:g}x the slope bar"


def plant_kl_shift(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Lower the top-1 logprob at every position by d nats (renormalised when full-vocab)."""
    if oracle.full_logprobs is not None:
        return _plant_full_kl(comp, oracle)
    r = _rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    if not oracle.token_ids or not len(r[1]):
        return "the golden generation is empty"
    ids, lp = r
    n = min(len(oracle.token_ids), len(lp))
    lp = lp[:n]
    bar = float(comp.max_mean)
    full = _full_vocab(lp)
    top = lp.argmax(axis=1)
    for d in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        c = lp.copy()
        c[np.arange(n), top] -= d
        if full:
            c = _log_softmax(c)
        kl = float(reference_kl(lp, c).mean())
        if kl >= OVER_BAR * bar:
            full_c = np.array(oracle.top_logprobs, np.float64, copy=True)
            full_c[:n] = c
            return Planted(oracle, _with_logprobs(oracle, full_c),
                           f"top-1 lowered by {d:g} nats: reference mean KL {kl:.3g} >= "
                           f"{OVER_BAR:g}x bar {bar:g}")
    return f"no shift of the top-1 reaches {OVER_BAR:g}x the KL bar (the top token carries no mass?)"


def reference_nmse(ref: np.ndarray, x: np.ndarray) -> float:
    den = float((ref**2).sum())
    return float(((x - ref) ** 2).sum()) / den if den else float("inf")


def plant_nmse_noise(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.full_logprobs is not None:
        return _plant_full_nmse(comp, oracle)
    r = _rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    ids, lp = r
    if not _full_vocab(lp):
        return f"NMSE needs full-vocab logprobs; the goldens hold top-{ids.shape[1]}"
    bar = float(comp.max_nmse)
    noise = np.random.default_rng(0).standard_normal(lp.shape)
    for s in (1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0):
        c = _log_softmax(lp + s * noise)
        v = reference_nmse(lp, c)
        if v >= OVER_BAR * bar:
            return Planted(oracle, _with_logprobs(oracle, c),
                           f"noise {s:g}: reference NMSE {v:.3g} >= {OVER_BAR:g}x bar {bar:g}")
    return f"no perturbation reaches {OVER_BAR:g}x the NMSE bar"


def plant_identity(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.top_ids is None:
        return "the golden has no logprobs"
    return Planted(oracle, _copy(oracle), "")


register(ControlSet("strict", needs=Needs(), mutations=(
    Mutation("flip decisive token", "fail", plant_decisive_flip),
    Mutation("drop last token", "fail", plant_truncate),
)))
register(ControlSet("near_tie", needs=Needs(logprobs=True, min_k=2, gaps=True), mutations=(
    Mutation("swap beyond bar", "fail", plant_beyond_bar),
    Mutation("token outside top-k", "fail", plant_outside_topk),
    Mutation("swap within bar", "pass", plant_within_bar),
)))
register(ControlSet("kl", needs=Needs(logprobs=True, min_k=2), mutations=(
    Mutation("perturb above bar", "fail", plant_kl_shift),
    Mutation("unperturbed copy", "pass", plant_identity),
)))
register(ControlSet("nmse", needs=Needs(logprobs=True, full_vocab=True), mutations=(
    Mutation("perturb above bar", "fail", plant_nmse_noise),
    Mutation("unperturbed copy", "pass", plant_identity),
)))


def plant_drift_ramp(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Lower the top-1 logprob by a ramp, 0 at the first position to d at the last: KL grows."""
    r = _rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    ids, lp = r
    n = min(len(oracle.token_ids), len(lp))
    if n < int(comp.min_positions):
        return f"{n} positions, fewer than the {comp.min_positions} drift needs"
    if oracle.full_logprobs is not None:
        return _plant_full_ramp(comp, oracle, n)
    lp = lp[:n]
    bar = float(comp.max_slope_per_1k)
    full = _full_vocab(lp)
    top = lp.argmax(axis=1)
    ramp = np.arange(n) / (n - 1)
    for d in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        c = lp.copy()
        c[np.arange(n), top] -= d * ramp
        if full:
            c = _log_softmax(c)
        slope = float(np.polyfit(np.arange(n), reference_kl(lp, c), 1)[0]) * 1000
        if slope >= OVER_BAR * max(bar, 0.0):
            full_c = np.array(oracle.top_logprobs, np.float64, copy=True)
            full_c[:n] = c
            return Planted(oracle, _with_logprobs(oracle, full_c),
                           f"top-1 lowered by a 0..{d:g} nats ramp: reference slope {slope:.3g} nats/1k "
                           f">= {OVER_BAR:g}x bar {bar:g}")
    return f"no ramp reaches {OVER_BAR:g}x the slope bar"


register(ControlSet("drift", needs=Needs(logprobs=True, min_k=2), mutations=(
    Mutation("KL ramp above slope bar", "fail", plant_drift_ramp),
    Mutation("unperturbed copy", "pass", plant_identity),
)))


def plant_one_ulp(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """The same tokens; the chosen logprob (and its top-k entry) one float32 ulp lower at the
    decisive position: only a comparator of logprob bits can see it."""
    r = _rows(oracle)
    if r is None or oracle.chosen_logprobs is None:
        return "the golden has no logprobs"
    if not oracle.token_ids:
        return "the golden generation is empty"
    t = min(_decisive(oracle), len(oracle.chosen_logprobs) - 1)
    chosen = np.array(oracle.chosen_logprobs, np.float32, copy=True)
    old = chosen[t]
    chosen[t] = np.nextafter(old, np.float32(-np.inf))
    lp = np.array(oracle.top_logprobs, np.float32, copy=True)
    lp[t][(r[0][t] == oracle.token_ids[t]) & (lp[t] == old)] = chosen[t]
    return Planted(oracle, _copy(oracle, chosen_logprobs=chosen, top_logprobs=lp),
                   f"position {t}: {float(old)!r} -> {float(chosen[t])!r}")


register(ControlSet("bit_exact", needs=Needs(logprobs=True), mutations=(
    Mutation("flip decisive token", "fail", plant_decisive_flip),
    Mutation("one logprob one ulp lower", "fail", plant_one_ulp),
    Mutation("unperturbed copy", "pass", plant_identity),
)))


def plant_rl_shift(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """The trainer's logprob of every sampled token lowered by 10x the mean-|Δ| bar."""
    if oracle.chosen_logprobs is None:
        return "the rollout has no logprobs"
    if not oracle.token_ids:
        return "the rollout is empty"
    d = OVER_BAR * float(comp.max_mean_abs)
    chosen = np.asarray(oracle.chosen_logprobs, np.float64) - d
    return Planted(oracle, _copy(oracle, chosen_logprobs=chosen.astype(np.float32)),
                   f"every token -{d:g} nats ({OVER_BAR:g}x the mean bar)")


def plant_scored_copy(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.chosen_logprobs is None:
        return "the rollout has no logprobs"
    return Planted(oracle, _copy(oracle), "")


register(ControlSet("rl_logprobs", needs=Needs(logprobs=True), mutations=(
    Mutation("trainer logprobs shifted above the bar", "fail", plant_rl_shift),
    Mutation("trainer equals rollout", "pass", plant_scored_copy),
)))


# ---------------------------------------------------------------------------------------------
# the gate's entry points


def suite_controls(suite: Any, golden: Any, decode: Callable[[Sequence[int]], str] | None = None,
                   capabilities: Any = None) -> list[Control]:
    """The controls of every comparator of ``suite`` (a :class:`~harness.suites.Suite`) against
    ``golden`` (a :class:`~harness.goldens.Golden`).

    ``capabilities`` (the candidate's, see :mod:`harness.capabilities`): guard the comparator the
    gate actually judged with (``strict`` on text for a candidate without ids); a comparator the
    candidate makes impossible judged nothing and gets no controls.
    """
    from harness import compare

    out: list[Control] = []
    for spec in suite.comparators:
        if capabilities is not None:
            from harness.capabilities import comparator_for

            comp = comparator_for(spec.name, spec.params, decode, capabilities)
            if isinstance(comp, str):
                continue
        else:
            comp = compare.build(spec.name, spec.params, decode)
        out += run_controls(comp, golden.cases, golden.outputs)
    return out


def guard(outcome: Outcome, controls: Sequence[Control], gates: Sequence[str]
          ) -> tuple[Outcome, list[str]]:
    """(outcome, reasons): a passing outcome becomes ``vacuous`` when a gated comparator's control
    shows it could not have failed. A failing gate stays failed: it did bite."""
    why = vacuous_reasons(controls, gates)
    return ("vacuous" if why and outcome == "pass" else outcome), why


# ---------------------------------------------------------------------------------------------
# KV pages (byte-equal): a different subject than Outputs, so a helper the KV gate calls directly

PageJudge = Callable[[Mapping[Any, bytes], Mapping[Any, bytes]], str]
"""(written pages, restored pages) -> the comparator's status for the pair (``pass``/``fail``/...)."""


def page_controls(key: str, judge: PageJudge, written: Mapping[Any, bytes]) -> list[Control]:
    """Controls of a page comparator: against the pages the engine wrote, flipping one byte of one
    page and dropping one page must fail, an identical copy must pass, and a capture that is empty,
    all zero bytes or one page repeated is flagged as degenerate."""
    pages = {k: bytes(v) for k, v in written.items()}
    fatal, flags = [], []
    if not pages:
        fatal.append("no pages were captured")
    elif all(not any(v) for v in pages.values()):
        fatal.append(f"all {len(pages)} captured pages are zero bytes (an unused buffer?)")
    elif len(pages) > 1 and len(set(pages.values())) == 1:
        fatal.append(f"all {len(pages)} captured pages hold the same bytes")
    elif any(not v for v in pages.values()):
        flags.append("some pages are empty")
    out = [Control(key, GOLDEN_CHECK + " pages", "pass", "degenerate" if fatal else "ok", not fatal,
                   "; ".join(fatal + flags))]
    if not pages:
        return out + [Control(key, "flip one byte of one page", "fail", "unplantable", False,
                              "nothing to plant it on: no pages")]
    keys = list(pages)
    victim = next((k for k in keys[len(keys) // 2:] + keys if pages[k]), None)
    if victim is None:
        out.append(Control(key, "flip one byte of one page", "fail", "unplantable", False,
                           "nothing to plant it on: every page is empty"))
    else:
        b = bytearray(pages[victim])
        at = len(b) // 2
        b[at] ^= 0x01
        got = judge(pages, {**pages, victim: bytes(b)})
        out.append(Control(key, "flip one byte of one page", "fail", got, got == "fail",
                           f"byte {at} of page {str(victim)[:40]}"))
    dropped = {k: v for k, v in pages.items() if k != keys[-1]}
    got = judge(pages, dropped)
    out.append(Control(key, "drop one page", "fail", got, got == "fail", f"page {str(keys[-1])[:40]}"))
    got = judge(pages, dict(pages))
    out.append(Control(key, "identical copy", "pass", got, got == "pass"))
    return out
