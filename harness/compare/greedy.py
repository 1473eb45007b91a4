"""greedy: under greedy sampling, every token a candidate chose must be its own top-1.

A check of the candidate against itself, not against the oracle: when an engine returns logprobs
for a greedy request, the chosen token's logprob must equal the best logprob of its own top-k at
that position (two tokens tied for the top are both fine). A chosen token below its own top-1 means
the engine did not decode greedily as the request was sent — a repetition penalty, top-p/min-p or
a temperature the server applies by default — and every comparison with the oracle's greedy
output would blame the model for what the sampler did.

The verdict names the first such position, the gap in nats, both tokens, and the sampling fields
the request left to the server's defaults (with the defaults, when the server publishes them), so
the fix can be sent as ``openai:URL,body.<field>=<value>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.unit import ControlSet, Mutation, Needs, Planted
from harness.excerpt import INLINE, first_line, tail

TIE_NATS = 1e-4
"""A chosen token this close to the top-1 counts as tied with it (engines compute both numbers
from one array, so a greedy choice is off by exactly 0; the bar only absorbs float printing)."""

KEY = "greedy"


def _tok(decode: Callable[[Sequence[int]], str] | None, tid: int) -> str:
    if tid < 0:
        return "(text not mapped to an id)"
    return f"{tid} {decode([tid])!r}" if decode else str(tid)


NEUTRAL: Mapping[str, Any] = {
    "repeat_penalty": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "min_p": 0.0, "top_p": 1.0, "typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0, "mirostat": 0,
    "dynatemp_range": 0.0, "xtc_probability": 0.0, "dry_multiplier": 0.0}
"""Values of sampling fields that leave a greedy choice alone, most likely culprits first."""


def knobs_line(left: Mapping[str, Any], sent: Mapping[str, Any]) -> list[str]:
    """How the request was sent, and what it left to the server: fields whose published default is
    not neutral first (the likely culprits), with the neutral value to send."""
    out = [f"request    : {', '.join(f'{k}={v!r}' for k, v in sorted(sent.items())) or '(nothing)'}"]
    if not left:
        return out
    order = list(NEUTRAL)
    culprits = [k for k in order if k in left and left[k] is not None and left[k] != NEUTRAL[k]]
    rest = sorted(k for k in left if k not in culprits)

    def show(k: str) -> str:
        return k + (f" (server default {left[k]!r})" if left[k] is not None else "")

    if culprits:
        out.append(f"left to the server's defaults, not neutral: {', '.join(show(k) for k in culprits)}")
    if rest:
        out.append(f"left to the server's defaults: {', '.join(show(k) for k in rest)}")
    fix = culprits[0] if culprits else next((k for k in order if k in left), None)
    if fix is not None:
        out.append(f"send it explicitly: openai:URL,body.{fix}={NEUTRAL[fix]!r} "
                   f"(llamacpp:body.{fix}=... for the managed server)")
    return out


@dataclass(frozen=True, slots=True)
class Greedy:
    """Greedy self-consistency of one candidate output. ``left``: sampling fields the request did
    not send -> the server's default (None when unknown); ``sent``: the sampling fields it did."""

    key = KEY
    tie_nats: float = TIE_NATS
    decode: Callable[[Sequence[int]], str] | None = None
    left: Mapping[str, Any] = field(default_factory=dict)
    sent: Mapping[str, Any] = field(default_factory=dict)

    def compare(self, oracle: Output | None, candidate: Output, case: Case) -> Verdict:
        if candidate.error is not None:  # the comparators report the error itself
            first = first_line(candidate.error)
            return Verdict(case.id, self.key, "skip", f"not checked: candidate error: {first}",
                           evidence={"kind": "candidate-error"})
        rows = None if candidate.top_logprobs is None else np.asarray(candidate.top_logprobs)
        if rows is None or candidate.chosen_logprobs is None or rows.ndim != 2 or rows.shape[1] == 0:
            return Verdict(case.id, self.key, "skip", "no logprobs: greedy self-consistency not checked",
                           evidence={"kind": "no-logprobs"})
        top = np.asarray(candidate.top_logprobs, np.float64)
        chosen = np.asarray(candidate.chosen_logprobs, np.float64)
        n = min(len(candidate.token_ids), len(chosen), len(top))
        best = top[:n].max(axis=1) if n else np.empty(0)
        gap = best - chosen[:n]
        checked = np.isfinite(gap)
        bad = np.nonzero(checked & (gap > self.tie_nats))[0]
        # positions where two entries of the engine's own top-k tie for the top (either is greedy)
        ties = int(np.sum(checked & (np.sum(top[:n] >= best[:, None] - self.tie_nats, axis=1) > 1)))
        ev: dict[str, Any] = {"positions": int(checked.sum()), "tokens": n, "ties": ties,
                              "tie_nats": self.tie_nats}
        if bad.size == 0:
            return Verdict(case.id, self.key, "pass",
                           f"greedy: {int(checked.sum())}/{n} chosen tokens are the engine's own top-1",
                           evidence=ev)
        p = int(bad[0])
        tid = int(candidate.token_ids[p])
        j = int(np.argmax(top[p]))
        top_id = int(candidate.top_ids[p][j]) if candidate.top_ids is not None else -1
        mn = round(float(gap[p]) * 1000, 1)
        ev.update({"first": p, "gap_mnats": mn, "not_greedy": int(bad.size), "max_gap_mnats":
                   round(float(gap[bad].max()) * 1000, 1), "left_to_server": dict(self.left),
                   "request": dict(self.sent)})
        # ids a text-keyed server left unknown (negative) have no text of their own to show
        known = [t for t in candidate.token_ids[:p] if t >= 0]
        prefix = tail(self.decode(known), INLINE) if self.decode else ""
        detail = "\n".join([
            f"{case.id}: greedy FAIL at token {p}/{n}: the engine did not decode greedily",
            f"  prefix     : {prefix!r}",
            f"  chose      : {_tok(self.decode, tid)} at {float(chosen[p]):.2f}",
            f"  own top-1  : {_tok(self.decode, top_id)} at {float(best[p]):.2f}"
            f"  (gap {mn:.0f} mnats; {bad.size} of {n} positions not greedy, worst "
            f"{ev['max_gap_mnats']:.0f} mnats)",
            *[f"  {line}" for line in knobs_line(self.left, self.sent)],
        ])
        return Verdict(case.id, self.key, "fail",
                       f"greedy FAIL at token {p}/{n}: chose a token {mn:.0f} mnats below its own top-1",
                       detail=detail, evidence=ev)


# ---------------------------------------------------------------------------------------------
# controls




def plant_below_top1(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Choose the runner-up where the top-1 was decisive (the largest gap in the case)."""
    if oracle.top_ids is None or oracle.top_logprobs is None:
        return "no logprobs"
    ids, lp = np.asarray(oracle.top_ids), np.asarray(oracle.top_logprobs, np.float64)
    if ids.ndim != 2 or ids.shape[1] < 2 or len(ids) == 0:
        return "k < 2: no runner-up to choose"
    gaps = lp[:, 0] - lp[:, 1]
    t = int(np.argmax(gaps))
    if not gaps[t] > comp.tie_nats:
        return "every top-1 is tied with the runner-up"
    toks = list(oracle.token_ids)
    toks[t] = int(ids[t, 1])
    chosen = np.array(oracle.chosen_logprobs if oracle.chosen_logprobs is not None else lp[:, 0],
                      np.float32, copy=True)
    chosen[t] = np.float32(lp[t, 1])
    return Planted(oracle, replace(oracle, token_ids=tuple(toks), chosen_logprobs=chosen),
                   f"runner-up chosen {gaps[t]:.3g} nats below the top-1")


def plant_oracle_as_is(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.top_logprobs is None:
        return "no logprobs"
    return Planted(oracle, oracle)


CONTROLS = ControlSet(needs=Needs(logprobs=True, min_k=2, gaps=True), mutations=(
    Mutation("choose the runner-up where the top-1 is decisive", "fail", plant_below_top1),
    Mutation("the oracle's own greedy outputs", "pass", plant_oracle_as_is),
))
"""greedy is a check of the candidate against itself, not a suite's comparator: its controls are
declared here and run by :func:`harness.kinds.parity.checks.check_controls`."""
