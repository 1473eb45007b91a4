"""The speculative-decoding gate's verdicts, from plain arrays (no engine).

* ``spec.greedy`` per case: the speculative engine's greedy tokens against the reference's (the
  same engine without speculation): exact, or the first differing position certified as a near-tie
  (both tokens' logprobs in the reference's top-k there, within ``near_tie_nats``); else FAIL naming
  the position and both tokens.
* ``spec.sampled`` per test (case, position, temperature, concurrency): the tokens the speculative
  engine drew at the position, among its draws that followed the reference's greedy path before
  it, fitted to the reference's exact next-token distribution there (softmax of its raw logprobs
  over the temperature) by :func:`harness.kinds.sampling.gof.fit`, Holm over every test at
  ``alpha``; each test states the TV it can detect with ``power`` at the Bonferroni level, and how
  many of its draws were judged at an accepted draft, a rejected one, a bonus or a plain position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.api import Verdict
from harness.kinds.sampling import gof
from harness.kinds.spec.drafts import Slot
from harness.kinds.spec.settings import CONTROL, GREEDY, SAMPLED
from harness.sampling.transforms import softmax

MIN_EXPECTED = 5.0
MAX_CELLS = 32


@dataclass(frozen=True, slots=True)
class Side:
    """One greedy continuation with its top-k per position."""

    tokens: tuple[int, ...]
    top_ids: tuple[tuple[int, ...], ...] = ()
    top_logprobs: tuple[tuple[float, ...], ...] = ()


def greedy_verdict(case_id: str, ref: Side, spec: Side, near_tie_nats: float) -> Verdict:
    n = min(len(ref.tokens), len(spec.tokens))
    t = next((i for i in range(n) if ref.tokens[i] != spec.tokens[i]), None)
    if t is None:
        if len(ref.tokens) != len(spec.tokens):
            return Verdict(
                case_id,
                GREEDY,
                "fail",
                f"greedy FAIL: {len(spec.tokens)} tokens, the reference {len(ref.tokens)}",
                evidence={"position": n},
            )
        return Verdict(case_id, GREEDY, "pass", f"exact ({n} tokens)", evidence={"exact": True, "tokens": n})
    a, b = ref.tokens[t], spec.tokens[t]
    top = dict(zip(ref.top_ids[t], ref.top_logprobs[t], strict=False)) if t < len(ref.top_ids) else {}
    lp_a, lp_b = top.get(a), top.get(b)
    ev = {
        "position": t,
        "reference_token": a,
        "spec_token": b,
        "reference_logprob": lp_a,
        "spec_token_reference_logprob": lp_b,
        "matched": t,
    }
    if lp_a is not None and lp_b is not None and lp_a - lp_b <= near_tie_nats:
        return Verdict(
            case_id,
            GREEDY,
            "pass",
            f"near-tie at token {t}/{n}: reference {a} ({lp_a:.4f}) vs speculative {b} "
            f"({lp_b:.4f}), gap {lp_a - lp_b:.4f} <= {near_tie_nats} nats",
            evidence={**ev, "exact": False, "gap": lp_a - lp_b},
        )
    gap = "outside the reference's top-k" if lp_a is None or lp_b is None else f"gap {lp_a - lp_b:.4f} nats"
    return Verdict(
        case_id,
        GREEDY,
        "fail",
        f"greedy FAIL at token {t}/{n}: reference {a} vs speculative {b} "
        f"({gap}; near-tie bar {near_tie_nats})",
        detail=f"{case_id}: first differing position {t}\n  reference  : {a} logprob {lp_a}\n"
        f"  speculative: {b} (its reference logprob {lp_b})",
        evidence={**ev, "exact": False},
    )


@dataclass(frozen=True, slots=True, eq=False)
class Test:
    id: str
    """``<case>@<position>/t<temperature>/c<concurrency>``."""
    case_id: str
    position: int
    temperature: float
    concurrency: int
    path: tuple[int, ...]
    """The reference's greedy tokens before the position (a draw is judged when it emitted them)."""
    q: np.ndarray
    """[V] the reference's distribution at the position."""
    slot: Slot | None
    """The position's role on the path (None: the drafter cannot be replayed)."""


def reference(raw_logprobs: np.ndarray, temperature: float) -> np.ndarray:
    return softmax(np.asarray(raw_logprobs, np.float64) / temperature)


def judged(test: Test, draws: np.ndarray) -> np.ndarray:
    """The tokens at the position of the draws ([n, width]) that followed the path."""
    j = test.position
    if draws.size == 0 or draws.shape[1] <= j:
        return np.zeros(0, np.int64)
    on = (
        np.all(draws[:, :j] == np.asarray(test.path, draws.dtype), axis=1) if j else np.ones(len(draws), bool)
    )
    return draws[on, j].astype(np.int64)


def fit_test(test: Test, tokens: np.ndarray, level: float) -> tuple[gof.Fit, gof.Cells, float]:
    """(fit, cells, support violation mass) of the judged tokens."""
    q = test.q
    counts = np.bincount(tokens, minlength=q.size)[: q.size].astype(np.float64)
    outside = float(counts[q <= 0].sum())
    inside = counts.copy()
    inside[q <= 0] = 0
    cells = gof.cells_for(q, int(inside.sum()), MIN_EXPECTED, MAX_CELLS)
    return gof.fit(cells, inside, level), cells, outside


def roles(test: Test, tokens: np.ndarray) -> dict[str, int]:
    """How many judged draws landed at an accepted or rejected draft, a bonus or a plain position."""
    if test.slot is None:
        return {"unattributed": int(tokens.size)}
    if test.slot.role == "draft":
        acc = int((tokens == test.slot.draft).sum())
        return {"accepted": acc, "rejected": int(tokens.size) - acc}
    return {test.slot.role: int(tokens.size)}


def sampled_verdicts(
    tests: Sequence[Test], tokens: Sequence[np.ndarray], alpha: float, power: float
) -> list[Verdict]:
    """One verdict per test, Holm over all of them; a test with no judged draw is ``skip``."""
    live = [i for i, t in enumerate(tokens) if t.size > 0]
    level = alpha / max(1, len(live))
    fits = {i: fit_test(tests[i], tokens[i], level) for i in live}
    pvals = [0.0 if fits[i][2] > 0 else fits[i][0].p for i in live]
    rejected, adjusted = gof.holm(pvals, alpha)
    out = []
    for i, t in enumerate(tests):
        if i not in fits:
            out.append(
                Verdict(
                    t.id,
                    SAMPLED,
                    "skip",
                    "no draw followed the reference's path",
                    evidence={"judged": 0, "roles": {}},
                )
            )
            continue
        k = live.index(i)
        f, cells, outside = fits[i]
        tv = gof.detectable_tv(cells, level, power, exact=False)
        ev = {
            "judged": int(tokens[i].size),
            "roles": roles(t, tokens[i]),
            "p": f.p,
            "p_holm": adjusted[k],
            "method": f.method,
            "cells": cells.k,
            "observed_tv": f.observed_tv,
            "detectable_tv": tv,
            "outside_support": outside,
            "position": t.position,
            "temperature": t.temperature,
            "concurrency": t.concurrency,
            "slot": None if t.slot is None else t.slot.role,
        }
        where = f"position {t.position} ({ev['slot']}), T={t.temperature:g}, concurrency {t.concurrency}"
        if rejected[k]:
            why = (
                f"{outside:g} draws outside the reference's support"
                if outside
                else f"{f.method} p={f.p:.3g} (Holm {adjusted[k]:.3g} <= {alpha:g}), "
                f"observed TV {f.observed_tv:.3f}"
            )
            out.append(
                Verdict(
                    t.id,
                    SAMPLED,
                    "fail",
                    f"sampled FAIL at {where}: {why}",
                    detail=f"{t.id}: {tokens[i].size} draws judged, roles {ev['roles']}",
                    evidence=ev,
                )
            )
        else:
            out.append(
                Verdict(
                    t.id,
                    SAMPLED,
                    "pass",
                    f"{where}: p={f.p:.3g}, {tokens[i].size} draws, detects TV >= {tv:.3f}",
                    evidence=ev,
                )
            )
    return out


def accepted_draws(verdicts: Sequence[Verdict]) -> int:
    return sum(
        int(v.evidence.get("roles", {}).get("accepted", 0)) for v in verdicts if v.comparator == SAMPLED
    )


def lossy(test: Test) -> np.ndarray:
    """The distribution a lossy acceptance (every drafted token accepted) gives the position: all
    mass on the draft at a drafted position, the reference elsewhere; where the roles are not known
    (a draft model's, transformers'), a drafter proposing the reference's greedy token: all mass
    on that token."""
    if test.slot is None:
        alt = np.zeros_like(test.q)
        alt[int(np.argmax(test.q))] = 1.0
        return alt
    if test.slot.role != "draft" or test.slot.draft is None:
        return test.q
    alt = np.zeros_like(test.q)
    alt[test.slot.draft] = 1.0
    return alt


def planted_draws(
    tests: Sequence[Test], counts: Sequence[int], alt: Sequence[np.ndarray], seed: int
) -> list[np.ndarray]:
    """``counts[i]`` tokens drawn from ``alt[i]`` per test (a double beside the engine)."""
    rng = np.random.default_rng(seed)
    return [
        rng.choice(a.size, size=n, p=a / a.sum()) if n else np.zeros(0, np.int64)
        for a, n in zip(alt, counts, strict=True)
    ]


def control_verdict(control: str, verdicts: Sequence[Verdict], stock: str | None = None) -> Verdict:
    """A planted control's run: ``pass`` when a greedy or sampled test failed, naming the first of
    each. ``stock``: the candidate without the fault — a catch proves the gate bites only at tests
    that candidate passes on its own (the pages compare the two records' failing tests)."""
    fails = [v for v in verdicts if v.comparator in (GREEDY, SAMPLED) and v.status == "fail"]
    if not fails:
        return Verdict(
            control,
            CONTROL,
            "fail",
            f"planted {control} NOT caught: every test passed",
            evidence={"stock": stock} if stock else {},
        )
    first = {c: next((v for v in fails if v.comparator == c), None) for c in (GREEDY, SAMPLED)}
    named = "; ".join(
        f"{v.comparator} {v.case_id} at position {v.evidence.get('position')}"
        for v in first.values()
        if v is not None
    )
    return Verdict(
        control,
        CONTROL,
        "pass",
        f"planted {control} caught: {len(fails)} failing tests, first {named}",
        evidence={
            "failing": len(fails),
            "greedy_failing": sum(v.comparator == GREEDY for v in fails),
            "sampled_failing": sum(v.comparator == SAMPLED for v in fails),
            **({"stock": stock} if stock else {}),
        },
    )
