"""Planted samplers: doubles beside the real engines, drawing from a transform of the oracle's
distribution with one thing wrong — the sampling gate's controls.

* the **correct double** draws from the reference itself: the gate must pass it, and its measured
  false-positive rate over ``control_repetitions`` seeded repetitions is stated with its exact 95 %
  interval; the control fails when it is significantly above alpha (one-sided binomial, 1 %): Holm
  over exactly calibrated fits has a family-wise rate of alpha at most, so a rate measured over a
  few hundred repetitions lands on either side of alpha by chance;
* each **planted fault** (:data:`FAULTS`) must fail the verdicts of the parameters it breaks, and
  the record states the power the gate had against it (:func:`stated_power`): per test, the larger
  of the fit's power (noncentral chi-square / exact binomial on the faulty distribution) and the
  support check's (one draw of the faulty mass outside the support), at the Bonferroni level;
  over a parameter's tests, ``1 - prod(1 - power_i)`` (independent draws).

A double is a runner with the :class:`~harness.abilities.Sampler` ability (inverse-CDF draws from a seeded
numpy generator per request, so the same seed gives the same tokens) and reports logprobs in the
engine's mode. Faults are the reference transform's own code with one step replaced
(:func:`harness.sampling.transforms.transform`'s ``steps`` / ``order``), never a second copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from harness.abilities import SamplePass, SamplerTraits, Samples
from harness.api import Case, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.kinds.sampling import gof
from harness.kinds.sampling.faults import FAULTS, Fault, power_against_fault, references
from harness.kinds.sampling.judge import LOGPROBS, SEED, comparator, failed, statistics, verdicts
from harness.kinds.sampling.plan import Plan, Test
from harness.kinds.sampling.sites import ControlSite
from harness.records import Control
from harness.sampling.transforms import Reference, log_softmax

CORRECT = "correct sampler (draws from the reference)"
SEED_FAULT = "seed ignored (a fresh generator on every call)"
LOGPROB_FAULT = "logprobs of the other mode"


def faulty_references(plan: Plan, t: Test, fault: Fault | None) -> tuple[Reference, ...]:
    """The distributions a double with ``fault`` draws each step of ``t`` from."""
    if fault is None:
        return t.references
    return references(t.raw, t.setting.sampling, t.prefix, t.path, plan.chain, plan.gs.boundary_tol, fault)


class Double:
    """A planted sampler over ``plan``'s tests: a :class:`~harness.api.Runner` with the
    :class:`~harness.abilities.Sampler` ability and no engine (it draws; it does not generate)."""

    def __init__(
        self,
        plan: Plan,
        traits: SamplerTraits,
        fault: Fault | None = None,
        *,
        seed_offset: int = 0,
        ignore_seed: bool = False,
        other_mode: bool = False,
    ) -> None:
        self.plan, self._traits, self.fault = plan, traits, fault
        self.seed_offset, self.ignore_seed, self.other_mode = seed_offset, ignore_seed, other_mode
        self.name = f"double:{fault.name if fault else 'correct'}"
        self._calls = 0
        by = {t.id: t for t in plan.tests}
        self._tests = {**by, **{f"{t.id}#det": t for t in plan.det}}
        self._cdf = {
            t.id: [np.cumsum(r.probs) for r in faulty_references(plan, t, fault)]
            for t in self._tests.values()
            if t.runs
        }

    def sampler_traits(self) -> SamplerTraits:
        return self._traits

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.name, "double", "planted", settings={"fault": self.fault.name if self.fault else None}
        )

    def start(self) -> None:
        """Nothing to load: the oracle's logits are the double's model."""

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        raise EngineRefused(f"{self.name}: a planted sampler draws samples; it does not generate")

    def facts(self) -> RunFacts:
        return RunFacts()

    def close(self) -> None:
        """Nothing to free."""

    def draw(self, t: Test, n: int, seed: int) -> Samples:
        rng = np.random.default_rng([seed + self.seed_offset, self._calls if self.ignore_seed else 0])
        u = rng.random((n, t.setting.step + 1))
        cdfs = self._cdf[t.id]
        tokens = np.full((n, t.setting.step + 1), -1, np.int32)
        rows = np.ones(n, bool)
        for j, cdf in enumerate(cdfs):
            tokens[rows, j] = np.minimum(
                np.searchsorted(cdf, u[rows, j] * cdf[-1], side="right"), cdf.size - 1
            )
            if j < len(cdfs) - 1:
                rows &= tokens[:, j] == t.path[j]
        return Samples(t.id, tokens, self._logprobs(t, tokens))

    def _logprobs(self, t: Test, tokens: np.ndarray) -> np.ndarray | None:
        mode = self._traits.logprobs_mode
        if mode not in ("raw_logprobs", "processed_logprobs"):
            return None
        raw = mode == "raw_logprobs"
        if self.other_mode:
            raw = not raw
        out = np.full(tokens.shape, np.nan, np.float32)
        refs = faulty_references(self.plan, t, self.fault) if not raw else ()
        for j in range(tokens.shape[1]):
            ok = tokens[:, j] >= 0
            table = log_softmax(t.raw[j]) if raw else np.log(np.maximum(refs[j].probs, 1e-300))
            out[ok, j] = table[tokens[ok, j]]
        return out

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        out: dict[str, dict[str, Samples]] = {}
        for p in passes:
            self._calls += 1
            got = {}
            for r in p.requests:
                s = self.draw(self._tests[r.key], r.n, r.sampling.seed)
                got[r.key] = Samples(r.key, s.tokens, s.logprobs)
            out[p.name] = got
        return out


def stated_power(plan: Plan, fault: Fault) -> dict[str, float]:
    """Per parameter ``fault`` breaks: the probability that the gate fails it (see module doc)."""
    miss: dict[str, float] = {}
    for t in plan.tests:
        if t.runs and t.setting.param in fault.params:
            p_test = test_power(plan, t, fault)
            miss[t.setting.param] = miss.get(t.setting.param, 1.0) * (1.0 - p_test)
    return {p: 1.0 - m for p, m in miss.items()}


def test_power(plan: Plan, t: Test, fault: Fault) -> float:
    """The probability that test ``t`` fails a sampler with ``fault`` (at the Bonferroni level)."""
    alt = faulty_references(plan, t, fault)
    return power_against_fault(
        t.references, alt, t.path, t.judged, t.draws, plan.level, plan.gs.min_expected, plan.gs.max_cells,
        t.planned,
    )


def site_note(site: ControlSite, fault: Fault) -> str:
    """One line on where ``fault`` was planned against a setting, and what it moves there."""
    if site.test is None or not site.powered:
        return f"{site.setting}: {site.note}"
    tv = dict(site.moved).get(fault.name)
    return (
        f"{site.test}: moves TV {tv:.3f}, power {site.power:.4f} at {site.draws} draws"
        if tv is not None
        else f"{site.test}: power {site.power:.4f} at {site.draws} draws"
    )


def _worst(statuses: Sequence[str]) -> str:
    for s in ("fail", "error", "refused", "pass", "skip"):
        if s in statuses:
            return s
    return "skip"


def controls(plan: Plan, traits: SamplerTraits, decode: Any = None) -> tuple[list[Control], dict[str, Any]]:
    """Every planted double through the gate's own judge: (controls, the record's facts)."""
    params = sorted({t.setting.param for t in plan.tests if t.runs})
    passes = plan.passes(("repeat", "alone") if traits.seed_scope == "request" else ("repeat",))
    facts: dict[str, Any] = {}
    out: list[Control] = []

    def run(d: Double) -> dict[str, str]:
        vs, _o, _r = verdicts(plan, d.sample(passes), traits, decode)
        by: dict[str, list[str]] = {}
        for v in vs:
            by.setdefault(v.comparator, []).append(v.status)
        return {k: _worst(v) for k, v in by.items()}

    correct = run(Double(plan, traits))
    for p in params:
        name = f"sampling.{p}"
        out.append(Control(name, CORRECT, "pass", correct.get(name, "skip"), correct.get(name) == "pass"))
    for fault in FAULTS:
        hit = [p for p in fault.params if p in params]
        if not hit:
            continue
        power = stated_power(plan, fault)
        got = run(Double(plan, traits, fault))
        label = fault.label(plan.chain)
        sites = {p: [x for x in plan.sites if x.param == p] for p in hit}
        facts[label] = {
            "stated_power": power,
            "got": {p: got.get(f"sampling.{p}", "skip") for p in hit},
            "sites": {p: [x.to_json() for x in sites[p]] for p in hit},
        }
        for p in hit:
            g = got.get(f"sampling.{p}", "skip")
            out.append(
                Control(
                    f"sampling.{p}",
                    label,
                    "fail",
                    g,
                    g == "fail",
                    f"stated power {power.get(p, 0.0):.4f} at level {plan.level:.3g}"
                    + "".join(f"; {site_note(x, fault)}" for x in sites[p]),
                )
            )
    seed_got = run(Double(plan, traits, ignore_seed=True)).get(SEED, "skip")
    out += [
        Control(SEED, CORRECT, "pass", correct.get(SEED, "skip"), correct.get(SEED) == "pass"),
        Control(SEED, SEED_FAULT, "fail", seed_got, seed_got == "fail"),
    ]
    if traits.logprobs_mode in ("raw_logprobs", "processed_logprobs"):
        lp_got = run(Double(plan, traits, other_mode=True)).get(LOGPROBS, "skip")
        out += [
            Control(
                LOGPROBS, CORRECT, "pass", correct.get(LOGPROBS, "skip"), correct.get(LOGPROBS) == "pass"
            ),
            Control(LOGPROBS, LOGPROB_FAULT, "fail", lp_got, lp_got == "fail"),
        ]
    fp = false_positive_rate(plan, traits, plan.gs.control_repetitions)
    facts["false_positive"] = fp
    if fp["repetitions"]:
        ok = fp["consistent_with_alpha"]
        for p in params:
            out.append(
                Control(
                    f"sampling.{p}",
                    f"correct sampler, {fp['repetitions']} seeded repetitions",
                    "pass",
                    "pass" if ok else "fail",
                    ok,
                    f"false-positive rate {fp['failures']}/{fp['repetitions']} = {fp['rate']:.4f} "
                    f"(95% CI {fp['ci95'][0]:.4f}-{fp['ci95'][1]:.4f}), alpha {plan.gs.alpha:g}"
                    + ("" if fp["rate"] <= plan.gs.alpha else ": above alpha, not significantly"),
                )
            )
    return out, facts


def false_positive_rate(
    plan: Plan, traits: SamplerTraits, repetitions: int, first_seed: int = 10_000
) -> dict[str, Any]:
    """How often the gate fails the correct double: ``repetitions`` seeded runs of every test."""
    if repetitions <= 0:
        return {"repetitions": 0}
    d = Double(plan, traits)
    main = SamplePass("main", tuple(t.request() for t in plan.tests if t.runs))
    failures, which = 0, {}
    for rep in range(repetitions):
        d.seed_offset = (first_seed + rep) * 7919
        outs, rejected, _adj = statistics(plan, d.sample([main])["main"], power=None)
        bad = failed(outs, rejected)
        failures += bool(bad)
        for i in bad:
            which[outs[i].test.setting.param] = which.get(outs[i].test.setting.param, 0) + 1
    lo, hi = gof.clopper_pearson(failures, repetitions)
    above = float(stats.binom.sf(failures - 1, repetitions, plan.gs.alpha))
    return {
        "repetitions": repetitions,
        "failures": failures,
        "rate": failures / repetitions,
        "ci95": [lo, hi],
        "alpha": plan.gs.alpha,
        "at_most_alpha": failures / repetitions <= plan.gs.alpha,
        "p_above_alpha": above,
        "consistent_with_alpha": above >= 0.01,
        "failed_tests_by_parameter": which,
        "seeds": f"{first_seed}..{first_seed + repetitions - 1} (x 7919 offsets)",
    }


__all__ = [
    "CORRECT",
    "FAULTS",
    "Double",
    "Fault",
    "comparator",
    "controls",
    "false_positive_rate",
    "stated_power",
]
