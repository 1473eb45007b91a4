"""Judging one variant: two tiers per pair, the inverse control, the planted faults.

A variant yields :class:`Pair` s (the reference configuration's output and the variant's, for one
case). Each pair gets two verdicts, named by variant and tier (``inv_batch.bit_exact``,
``inv_batch.near_tie``): **bit-exact** (the same tokens and the same logprobs, bit for bit) and
**near-tie** (the harness's rule: a divergence only where the reference was nearly undecided). A
pair that is not evidence (a "warm" pass that hit no cached token, an engine that never preempted)
is judged but answers ``skip``, saying why.

Two kinds of controls prove the tiers can fail, per variant:

* **planted faults** (:data:`FAULTS`, registered like :mod:`harness.kinds.controls`): the variant's
  reference perturbed at one position must fail bit-exact, and pass or fail near-tie as its gap
  says (one logprob one ulp lower: near-tie passes; the runner-up within the bar: passes; beyond
  the bar or outside the top-k: fails), and an unperturbed copy must pass both;
* **the inverse control**: the same reference against a real engine run under a setting the engine
  promises no invariance for (``dtype=bfloat16``). Differences must appear there, or the bit-exact
  claim has no demonstrated sensitivity: the control fails and a gated bit-exact tier is vacuous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.bit_exact import BitExact, plant_one_ulp
from harness.compare.kernels.planting import plant_identity
from harness.compare.near_tie import NearTie, plant_beyond_bar, plant_outside_topk, plant_within_bar
from harness.compare.strict import first_divergence
from harness.compare.unit import ControlSet, Mutation, Needs, Plant
from harness.excerpt import clip
from harness.kinds.controls import run_controls
from harness.kinds.invariance.settings import TIERS, verdict_name
from harness.records import Control
from harness.registry import Registry


@dataclass(frozen=True, slots=True, eq=False)
class Pair:
    case: Case
    """The case (its id may carry a suffix: ``c01@c4``, ``c03+shared``)."""
    reference: Output
    candidate: Output
    facts: Mapping[str, Any] = field(default_factory=dict)
    """What makes it evidence (cached tokens, prompt length, counters ...), kept in both verdicts."""
    not_evidence: str | None = None
    """Why this pair proves nothing about the variant (then both verdicts are ``skip``)."""


@dataclass(frozen=True, slots=True)
class Tiers:
    exact: BitExact
    tie: NearTie

    def compare(self, tier: str, ref: Output, cand: Output, case: Case) -> Verdict:
        return (self.exact if tier == "bit_exact" else self.tie).compare(ref, cand, case)


def judge_pairs(variant: str, pairs: Sequence[Pair], tiers: Tiers) -> list[Verdict]:
    """Both tiers over every pair, named ``inv_<variant>.<tier>``."""
    out = []
    for p in pairs:
        for tier in TIERS:
            v = tiers.compare(tier, p.reference, p.candidate, p.case)
            ev = {**v.evidence, **p.facts}
            if p.not_evidence is not None and v.status in ("pass", "fail"):
                v = replace(v, status="skip", summary=f"not evidence: {p.not_evidence} (judged: {v.summary})",
                            evidence={**ev, "not_evidence": p.not_evidence, "judged": v.status})
            else:
                v = replace(v, evidence=ev)
            out.append(replace(v, comparator=verdict_name(variant, tier)))
    return out


def first_difference(verdicts: Sequence[Verdict], variant: str) -> dict[str, Any] | None:
    """Where a variant first differed from its reference: the case, token and logprob positions."""
    for v in verdicts:
        judged = v.evidence.get("judged", v.status)
        if v.comparator == verdict_name(variant, "bit_exact") and judged == "fail":
            ev = v.evidence
            return {"case": v.case_id, "token": ev.get("first_divergence"),
                    "logprob": ev.get("first_logprob_difference"),
                    "max_abs_chosen_logprob": ev.get("max_abs_chosen_logprob"), "summary": v.summary}
    return None


# ---------------------------------------------------------------------------------------------
# the inverse control


@dataclass(frozen=True, slots=True)
class Inverse:
    """One variant's reference against the inverse engine's run of the same prompts."""

    setting: str
    """e.g. ``dtype=bfloat16``."""
    cases: int
    bit_exact_failed: int
    near_tie_failed: int
    first: Mapping[str, Any] | None
    status: str = "ran"
    """``ran``, or why it could not (the inverse engine refused or failed)."""

    @property
    def sensitive(self) -> bool:
        return self.bit_exact_failed > 0

    def to_json(self) -> dict[str, Any]:
        note = ("differences appeared: the bit-exact tier can see this workload change" if self.sensitive else
                "no differences appeared: the bit-exact claim has no demonstrated sensitivity"
                if self.status == "ran" else f"not run: {self.status}")
        return {"setting": self.setting, "status": self.status, "cases": self.cases,
                "bit_exact_failed": self.bit_exact_failed, "near_tie_failed": self.near_tie_failed,
                "differences_appeared": self.sensitive, "first": dict(self.first or {}) or None, "note": note}


def inverse_control(variant: str, pairs: Sequence[Pair], tiers: Tiers, setting: str,
                    why_not: str | None = None) -> tuple[Inverse, Control]:
    """The inverse control of one variant (pairs: its reference vs the inverse engine's output)."""
    name = verdict_name(variant, "bit_exact")
    mutation = f"inverse control: {setting} on one side (a real run; no invariance promised)"
    if why_not is not None or not pairs:
        why = why_not or "no pair to compare"
        return (Inverse(setting, 0, 0, 0, None, why),
                Control(name, mutation, "fail", "not run", False, clip(why)))
    exact = [tiers.compare("bit_exact", p.reference, p.candidate, p.case) for p in pairs]
    tie = [tiers.compare("near_tie", p.reference, p.candidate, p.case) for p in pairs]
    failed = [v for v in exact if v.status == "fail"]
    first = None
    if failed:
        ev = failed[0].evidence
        first = {"case": failed[0].case_id, "token": ev.get("first_divergence"),
                 "logprob": ev.get("first_logprob_difference")}
    inv = Inverse(setting, len(pairs), len(failed), sum(v.status == "fail" for v in tie), first)
    passed = sum(v.status == "pass" for v in exact)
    got = f"fail {len(failed)}/{len(pairs)}" if failed else f"pass {passed}/{len(pairs)}"
    note = (f"near-tie under it: {len(pairs) - inv.near_tie_failed}/{len(pairs)} pass" if failed else
            "no differences appeared: the bit-exact claim has no demonstrated sensitivity")
    return inv, Control(name, mutation, "fail", got, bool(failed), note)


# ---------------------------------------------------------------------------------------------
# planted faults


@dataclass(frozen=True, slots=True)
class Fault:
    """A perturbation of a reference output, and what each tier must answer for it."""

    name: str
    plant: Plant
    """(the near-tie comparator, case, reference) -> Planted, or why nothing could be planted."""
    expect: Mapping[str, str]
    """tier -> ``fail`` | ``pass``."""


FAULTS: Registry[Fault] = Registry("invariance fault")
"""Planted faults every variant's tiers are checked against."""


def register_fault(f: Fault) -> Fault:
    return FAULTS.register(f.name)(f)


register_fault(Fault("unperturbed copy", plant_identity, {"bit_exact": "pass", "near_tie": "pass"}))
register_fault(Fault("one logprob one ulp lower at one position", plant_one_ulp,
                     {"bit_exact": "fail", "near_tie": "pass"}))
register_fault(Fault("runner-up token at one position, gap within the near-tie bar", plant_within_bar,
                     {"bit_exact": "fail", "near_tie": "pass"}))
register_fault(Fault("runner-up token at one position, gap beyond the near-tie bar", plant_beyond_bar,
                     {"bit_exact": "fail", "near_tie": "fail"}))
register_fault(Fault("token outside the top-k at one position", plant_outside_topk,
                     {"bit_exact": "fail", "near_tie": "fail"}))


def fault_controls(variant: str, refs: Sequence[tuple[Case, Output]], tiers: Tiers) -> list[Control]:
    """Golden checks of the references and every registered fault, per tier (each fault is planted
    with the near-tie comparator's bar and judged by both tiers, each expecting its own answer)."""
    usable = {c.id: o for c, o in refs if o.error is None}
    cases = [c for c, _ in refs]
    out: list[Control] = []
    for tier in TIERS:
        needs = Needs(logprobs=True) if tier == "bit_exact" else Needs(logprobs=True, min_k=2, gaps=True)
        faults = tuple(Mutation(f"planted: {f.name}", f.expect[tier],  # type: ignore[arg-type]
                                lambda _comp, case, ref, plant=f.plant: plant(tiers.tie, case, ref))
                       for f in (e.value for e in FAULTS.entries()))
        comp = tiers.exact if tier == "bit_exact" else tiers.tie
        out += run_controls(comp, ControlSet(faults, needs), cases, usable, key=verdict_name(variant, tier))
    return out


# ---------------------------------------------------------------------------------------------
# decode vs prefill


def prefill_choice(score: Output, case_id: str) -> Output:
    """What a prefill scoring "would have generated" at every position: its top-1 token, with its
    top-k rows (the candidate side of ``decode_prefill``). Teacher-forced, so positions never
    drift apart: the rows are comparable after a divergence too."""
    if score.top_ids is None or score.top_logprobs is None or not len(score.top_ids):
        return Output(case_id, (), error=score.error or "the prefill score has no logprobs")
    return Output(case_id, tuple(int(t) for t in score.top_ids[:, 0]), "", score.top_ids, score.top_logprobs,
                  np.asarray(score.top_logprobs[:, 0], np.float32), "scored")


def all_positions(decode: Output, score: Output) -> dict[str, Any]:
    """Teacher-forced facts over every position (not just up to the first divergence): how many
    positions the prefill's top-1 differs from the decoded token, and the largest |Δ| of the
    decoded token's logprob."""
    if decode.chosen_logprobs is None or score.chosen_logprobs is None or score.top_ids is None:
        return {}
    n = min(len(decode.token_ids), len(score.token_ids))
    d = np.abs(np.asarray(decode.chosen_logprobs[:n], np.float64)
               - np.asarray(score.chosen_logprobs[:n], np.float64))
    argmax_differs = int((score.top_ids[:n, 0] != np.asarray(decode.token_ids[:n])).sum())
    return {"positions": n, "prefill_top1_differs": argmax_differs,
            "max_abs_decoded_token_logprob_all_positions": float(d.max()) if n else 0.0,
            "first_token_divergence": first_divergence(decode.token_ids[:n], score.top_ids[:n, 0].tolist())}
