"""near-tie: a divergence is forgiven only where the oracle itself was nearly undecided.

Nothing after the first divergence is judged: the prefixes differ from there. At the first divergent
position the case passes iff the candidate's token is in the oracle's top-k AND the oracle's logprob
gap (its chosen token minus the candidate's token) is at most ``threshold_nats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import explain_divergence, unmapped
from harness.compare.kernels.planting import decisive, outside, own_logprobs, swap, top_rows
from harness.compare.strict import divergence
from harness.compare.unit import TOKENS, ControlSet, Mutation, Needs, Planted, Unit, param


@dataclass(frozen=True, slots=True)
class NearTie:
    key = "near_tie"
    needs_scores = False
    threshold_nats: float = param(0.5, "number", "the largest forgiven gap, oracle token minus candidate "
                                                 "token (nats)")
    decode: Callable[[Sequence[int]], str] | None = None

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if isinstance(pos := divergence(self.key, oracle, candidate, case), Verdict):
            return pos
        n = len(oracle.token_ids)
        if pos is None:
            return Verdict(case.id, self.key, "pass", f"exact: {n}/{n} tokens",
                           evidence={"kind": "exact", "matched": n, "tokens": n})
        if (unknown := unmapped(self.key, oracle, candidate, case, pos, self.decode)) is not None:
            return unknown
        base = {"matched": pos, "tokens": n, "first_divergence": pos,
                "threshold_mnats": round(self.threshold_nats * 1000, 3)}
        if pos >= n or pos >= len(candidate.token_ids):
            short = "candidate" if pos >= len(candidate.token_ids) else "oracle"
            return Verdict(case.id, self.key, "fail", f"{short} output ended at token {pos}/{n}",
                           detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode),
                           evidence={**base, "kind": "length"})
        if oracle.top_ids is None or oracle.top_logprobs is None or oracle.chosen_logprobs is None:
            return Verdict(case.id, self.key, "error",
                           "oracle has no logprobs: near-tie cannot judge",
                           evidence={**base, "kind": "no-logprobs"})
        cand_tok = candidate.token_ids[pos]
        hits = np.nonzero(oracle.top_ids[pos] == cand_tok)[0]
        k = int(oracle.top_ids.shape[1])
        if hits.size == 0:
            extra = [f"gap        : candidate token not in oracle top{k} -> not a near-tie"]
            return Verdict(case.id, self.key, "fail", f"near-tie FAIL at token {pos}/{n}: not in top{k}",
                           detail=explain_divergence(self.key, oracle, candidate, case, pos,
                                                     self.decode, extra),
                           evidence={**base, "kind": "not-in-topk", "k": k})
        gap = float(oracle.chosen_logprobs[pos]) - float(oracle.top_logprobs[pos][hits[0]])
        mn = round(gap * 1000, 3)
        ev = {**base, "kind": "tie" if gap <= self.threshold_nats else "beyond", "gap_mnats": mn,
              "rank": int(hits[0])}
        bar = f"(near-tie bar {self.threshold_nats * 1000:.0f})"
        if gap <= self.threshold_nats:
            return Verdict(case.id, self.key, "pass", f"near-tie at token {pos}/{n}: gap {mn:.0f} mnats",
                           evidence=ev)
        extra = [f"gap        : {mn:.0f} mnats {bar} -> not a near-tie"]
        return Verdict(case.id, self.key, "fail", f"near-tie FAIL at token {pos}/{n}: gap {mn:.0f} mnats",
                       detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode, extra),
                       evidence=ev)


MARGIN_NATS = 1e-3
"""A planted gap must clear the near-tie bar by this much, so float rounding cannot decide it."""


def _swaps(comp: Any, oracle: Output) -> list[tuple[float, int, int]] | str:
    """(gap, position, alternative id) of every top-k alternative to the oracle's token."""
    if oracle.error is not None:
        return "the golden has an error"
    if not oracle.token_ids:
        return "the golden generation is empty"
    r = top_rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    ids, lp = r
    if ids.shape[1] < 2:
        return f"k={ids.shape[1]}: no alternative token in the top-k"
    chosen = own_logprobs(oracle, ids, lp)
    out = []
    for t in range(min(len(oracle.token_ids), len(ids), len(chosen))):
        for j in range(ids.shape[1]):
            alt = int(ids[t, j])
            if alt != oracle.token_ids[t] and np.isfinite(chosen[t]) and np.isfinite(lp[t, j]):
                out.append((float(chosen[t] - lp[t, j]), t, alt))
    return out


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
    return Planted(oracle, swap(oracle, t, alt), f"smallest planted gap {gap:.3g} nats > bar {bar:g}")


def plant_within_bar(comp: Any, case: Case, oracle: Output) -> Planted | str:
    bar = float(comp.threshold_nats)
    s = _swaps(comp, oracle)
    if isinstance(s, str):
        return s
    within = [x for x in s if 0.0 <= x[0] <= bar - MARGIN_NATS]
    if within:
        gap, t, alt = max(within)  # the one closest to the bar
        return Planted(oracle, swap(oracle, t, alt), "")
    # No natural near-tie: make one in a copy of the oracle (rank 1 at half the bar).
    ids, lp = top_rows(oracle)  # type: ignore[misc]
    t = 0
    chosen = own_logprobs(oracle, ids, lp)
    alt = int(ids[t, 1]) if int(ids[t, 1]) != oracle.token_ids[t] else int(ids[t, 0])
    lp2 = np.array(oracle.top_logprobs, dtype=np.float32, copy=True)
    j = int(np.nonzero(ids[t] == alt)[0][0])
    lp2[t, j] = np.float32(chosen[t] - bar / 2)
    synth = replace(oracle, top_logprobs=lp2)
    return Planted(synth, swap(synth, t, alt), "synthetic tie (no natural one within the bar)")


def plant_outside_topk(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if not oracle.token_ids:
        return "the golden generation is empty"
    r = top_rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    t = decisive(oracle)
    return Planted(oracle, swap(oracle, t, outside(r[0][t], oracle.token_ids[t])), "")


UNIT = Unit(NearTie, "a divergence only where the oracle was nearly undecided", needs=TOKENS,
            across_devices="bar", controls=ControlSet(
                needs=Needs(logprobs=True, min_k=2, gaps=True), mutations=(
                Mutation("swap beyond bar", "fail", plant_beyond_bar),
                Mutation("token outside top-k", "fail", plant_outside_topk),
                Mutation("swap within bar", "pass", plant_within_bar),
            )))
