"""The planted samplers: each fault fails the verdicts of the parameter it breaks, as often as the
power the gate states against it; the correct double passes, and its measured false-positive rate
over seeded repetitions stays at or below alpha; the engines' orders differ and the gate sees it."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from scipy import stats

from harness.abilities import SamplePass
from harness.kinds.sampling import doubles, judge
from harness.kinds.sampling.doubles import FAULTS, Double, false_positive_rate, stated_power
from harness.kinds.sampling.plan import Plan, make_plan
from tests.unit import sampling_kit as kit


@cache
def plan(chain: str = "vllm", cases: int = 1) -> Plan:
    return make_plan(kit.oracle(cases), kit.settings(), chain)


def _statuses(p: Plan, d: Double) -> dict[str, list[str]]:
    vs, _o, _r = judge.verdicts(p, d.sample(p.passes()), kit.traits(p.chain.name))
    out: dict[str, list[str]] = {}
    for v in vs:
        out.setdefault(v.comparator, []).append(v.status)
    return out


def test_the_plan_draws_enough_for_the_target() -> None:
    p = plan()
    fits = [t for t in p.tests if not t.control or t.position in (26, 58)]
    assert len(fits) == 2 * len(kit.SETTINGS)
    moved = {x.split(":")[0].split("/")[1] for x in p.passed_over}  # settings a path sent elsewhere
    for t in p.tests:
        if t in fits and t.setting.id not in moved:  # block-aligned: all but one token from a cache
            assert (len(t.prefix) - 1) % 32 == 0 and t.position in (26, 58)
        assert t.judged <= t.draws and t.planned.n == t.judged
        if t.draws < p.gs.max_draws:  # not capped: the target is met, by the exact critical value
            assert (
                t.planned.method != "chi2" or judge.gof.detectable_tv(t.planned, p.level, 0.9) <= 0.15 + 1e-9
            )


def test_the_correct_double_passes_every_verdict() -> None:
    got = _statuses(plan(), Double(plan(), kit.traits()))
    assert all(s in ("pass", "skip") for ss in got.values() for s in ss), got


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_each_planted_fault_fails_with_the_stated_power(fault: doubles.Fault) -> None:
    """Stated power >= 0.9 against every fault here (two cases, four positions), and over 12 seeded
    runs the fault's verdicts fail about that often (fewer failures than a binomial of 12 runs at
    the stated power makes 0.1 % likely would mean the power is overstated)."""
    p = plan(cases=2)
    power = stated_power(p, fault)
    assert power and min(power.values()) >= 0.9, power
    runs, failed = 12, {k: 0 for k in power}
    for rep in range(runs):
        got = _statuses(p, Double(p, kit.traits(), fault, seed_offset=rep * 101))
        for param in power:
            failed[param] += "fail" in got[f"sampling.{param}"]
    for param, pw in power.items():  # fewer failures than the stated power makes improbable: wrong
        assert stats.binom.cdf(failed[param], runs, pw) >= 1e-3, (param, failed, power)


def test_the_correct_doubles_false_positive_rate_is_alpha_at_most() -> None:
    """400 seeded repetitions of every test: Holm over exactly calibrated tests makes the
    family-wise rate alpha at most (0.0099 for 16 independent fits), so the measured rate must not
    be significantly above alpha (one-sided binomial, 0.1 %) — a rate measured at exactly alpha
    would exceed it about half the time; the records state their own measured figure."""
    fp = false_positive_rate(plan(), kit.traits(), 400)
    assert stats.binom.sf(fp["failures"] - 1, 400, plan().gs.alpha) >= 1e-3, fp
    assert fp["ci95"][0] <= fp["rate"] <= fp["ci95"][1] and fp["ci95"][0] <= plan().gs.alpha


def test_the_order_matters_and_the_gate_sees_it() -> None:
    """A sampler that tempers after top-p (llama.cpp's order) drawn against vLLM's reference fails
    the order verdicts; drawn against llama.cpp's own reference it passes — and the other way round."""
    move = next(f for f in FAULTS if f.order is not None)
    vllm_p, llama_p = plan("vllm"), plan("llama.cpp")
    assert move.order(vllm_p.chain) == ("penalties", "min_p", "top_k", "top_p", "temperature")
    assert move.order(llama_p.chain)[:2] == ("penalties", "temperature")
    assert "fail" in _statuses(vllm_p, Double(vllm_p, kit.traits(), move))["sampling.order"]
    assert "fail" in _statuses(llama_p, Double(llama_p, kit.traits("llama.cpp"), move))["sampling.order"]
    for t_v, t_l in zip(vllm_p.tests, llama_p.tests, strict=True):
        if t_v.setting.param == "order":
            ref = t_l.reference.probs
            moved = doubles.faulty_references(vllm_p, t_v, move)[-1].probs
            assert np.allclose(moved, ref)  # tempering after top-p *is* llama.cpp's reference


def test_seed_and_logprob_faults_fail_their_verdicts() -> None:
    p = plan()
    assert "fail" in _statuses(p, Double(p, kit.traits(), ignore_seed=True))["sampling.seed"]
    assert set(_statuses(p, Double(p, kit.traits(), other_mode=True))["sampling.logprobs"]) == {"fail"}
    processed = kit.traits(mode="processed_logprobs")
    vs, _o, _r = judge.verdicts(p, Double(p, processed).sample(p.passes()), processed)
    assert {v.status for v in vs if v.comparator == judge.LOGPROBS} == {"pass"}


def test_a_support_violation_names_the_token_and_its_rank() -> None:
    p = plan()
    t = next(t for t in p.tests if t.setting.id == "k5")
    d = Double(p, kit.traits())
    s = d.draw(t, t.draws, t.seed)
    outside = int(np.flatnonzero(t.reference.probs == 0)[0])
    s.tokens[3, 0] = outside
    o = judge.outcome(t, s, p.level, None, 5, 16)
    v = judge.test_verdict(o, False, 1.0, None)
    rank = 1 + int((t.raw[0] > t.raw[0][outside]).sum())
    assert (
        v.status == "fail" and f"token {outside} (rank {rank} in the oracle's raw distribution)" in v.summary
    )
    assert v.evidence["violations"] == [{"step": 0, "token": outside, "rank": rank, "count": 1}]


def test_controls_report_every_parameter_and_the_false_positive_rate() -> None:
    p = make_plan(kit.oracle(2), kit.settings(["t07", "p08", "pres10"], control_repetitions=50), "vllm")
    ctl, facts = doubles.controls(p, kit.traits())
    by = {(c.comparator, c.mutation): c for c in ctl}
    assert by[("sampling.top_p", "top-p keeps one token too many")].ok
    assert by[("sampling.presence_penalty", "penalty with the wrong sign")].ok
    assert by[("sampling.temperature", "temperature not applied")].ok
    assert (
        by[("sampling.seed", doubles.SEED_FAULT)].ok and by[("sampling.logprobs", doubles.LOGPROB_FAULT)].ok
    )
    assert all(c.ok for c in ctl if c.expect == "pass"), [c for c in ctl if not c.ok]
    assert facts["false_positive"]["repetitions"] == 50
    assert facts["top-p keeps one token too many"]["stated_power"]["top_p"] >= 0.9


def test_a_fault_the_suite_cannot_see_is_left_out() -> None:
    p = make_plan(kit.oracle(1), kit.settings(["t07"]), "vllm")
    ctl, _ = doubles.controls(p, kit.traits())
    assert not any(c.comparator == "sampling.top_p" for c in ctl)
    assert p.passes()[0].requests[-1].key.endswith("#det") and [q.name for q in p.passes()] == [
        "main",
        "repeat",
        "alone",
    ]
    assert isinstance(p.passes()[2], SamplePass) and p.passes()[2].alone
