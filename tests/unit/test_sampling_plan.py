"""The planner's control sites: every setting's planted faults are judged where they move the
distribution, chosen among every position of every case (not only the least decided block-aligned
ones), with draws for ``control_power`` against the weakest; a row no position can power says so;
and the correct sampler's false-positive rate stays at most alpha with the sites in the family."""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import Case
from harness.kinds.sampling import doubles, faults, judge
from harness.kinds.sampling.doubles import Double, false_positive_rate, stated_power
from harness.kinds.sampling.draws import OracleRows
from harness.kinds.sampling.plan import Plan, make_plan, positions, ranked
from harness.kinds.sampling.settings import GateSettings, Setting
from tests.unit import sampling_kit as kit

WRONG_SIGN = next(f for f in faults.FAULTS if "presence_penalty" in f.params)


def _hidden_repeat(t_star: int, tokens: int = 64, vocab: int = 300) -> list[OracleRows]:
    """Logits where the token drawn at t is likely again at t + 1 only at ``t_star`` (not
    block-aligned): everywhere else the repeated token is far down, so a presence penalty with the
    wrong sign moves almost nothing — what the least decided positions of a real model gave."""
    rng = np.random.default_rng(7)
    prompt = tuple(int(x) for x in rng.integers(50, vocab, 9))
    greedy = tuple(10 + (t % 30) for t in range(tokens))  # no token repeats within 30 steps
    rows = {}
    for t in range(tokens):
        x = rng.standard_normal(vocab) * 0.5
        x[greedy[t]] += 6.0  # one likely token, a flat tail (high entropy: the aligned positions win)
        x[200:260] += 2.5
        x[greedy[t - 1] if t else 0] -= 8.0  # the token just drawn: out of the running ...
        if t == t_star + 1:
            x[greedy[t_star]] = x[greedy[t]]  # ... except here, where it is as likely as the next one
        rows[t] = x.astype(np.float32)
    return [OracleRows(Case("h0", prompt), greedy, rows)]


def _settings(*settings: Setting, **kw: float) -> GateSettings:
    return GateSettings(settings, **{"target_tv": 0.2, "control_repetitions": 0, "max_draws": 3000, **kw})


PRES = Setting("pres10", "presence_penalty", kit.S(presence_penalty=1.0), 1)


def _statuses(p: Plan, d: Double) -> set[str]:
    vs, _o, _r = judge.verdicts(p, d.sample(p.passes()), kit.traits(p.chain.name))
    return {v.status for v in vs if v.comparator == "sampling.presence_penalty"}


def test_a_fault_the_least_decided_positions_miss_is_planned_where_it_bites() -> None:
    """The issue's case: at the block-aligned least decided positions a wrong-sign presence penalty
    moves nothing (power ~0); the planner finds the one position where it bites and the planted
    sampler fails there, while the correct one passes."""
    t_star = 40
    rows = _hidden_repeat(t_star)
    gs = _settings(PRES)
    p = make_plan(rows, gs, "vllm")
    aligned = positions(rows[0], gs)
    assert t_star not in aligned
    on_aligned = [t for t in p.tests if not t.control]
    assert {t.position for t in on_aligned} == set(aligned)
    (site,) = p.sites
    assert site.test == f"h0@{t_star}/pres10" and site.powered and site.power >= gs.control_power
    assert dict(site.moved)[WRONG_SIGN.name] >= gs.target_tv  # the visible TV the fault moves there
    (ctl,) = [t for t in p.tests if t.control]
    assert ctl.position == t_star and ctl.draws == site.draws <= gs.max_draws
    for t in on_aligned:  # where the old plan looked, the fault was invisible
        assert doubles.test_power(p, t, WRONG_SIGN) < 0.05
    assert stated_power(p, WRONG_SIGN)["presence_penalty"] >= gs.control_power
    assert _statuses(p, Double(p, kit.traits(), WRONG_SIGN)) >= {"fail"}
    assert _statuses(p, Double(p, kit.traits())) == {"pass"}


def test_the_site_is_sized_for_the_weakest_fault_not_for_the_target_tv() -> None:
    """A fault moving a small TV needs more draws than the target: the site's test gets them, and
    the power against it is what the plan states."""
    rows = kit.oracle(2)
    gs = kit.settings(["p08", "t07"])
    p = make_plan(rows, gs, "vllm")
    by = {s.setting: s for s in p.sites}
    for s in gs.settings:
        site = by[s.id]
        (t,) = [t for t in p.tests if t.id == site.test]
        assert t.control and site.powered
        fault = faults.of(s.param)[0]
        assert doubles.test_power(p, t, fault) >= gs.control_power
        assert abs(doubles.test_power(p, t, fault) - site.power) < 0.02  # the same sum at the final level


@pytest.mark.parametrize("chain", ["vllm", "transformers", "llama.cpp"])
def test_every_setting_of_the_kit_is_powered_on_every_chain(chain: str) -> None:
    unsupported = {"presence_penalty": "-", "frequency_penalty": "-"} if chain == "transformers" else None
    p = make_plan(kit.oracle(2), kit.settings(), chain, unsupported)
    sites = {s.setting: s for s in p.sites}
    for s in p.gs.settings:
        if chain == "transformers" and s.param in ("presence_penalty", "frequency_penalty"):
            assert s.id not in sites  # refused: no control to plan
            continue
        assert sites[s.id].powered, sites[s.id]
    for f in faults.FAULTS:
        assert all(v >= p.gs.control_power for v in stated_power(p, f).values()), (f.name, stated_power(p, f))


def test_a_row_no_position_can_power_stays_vacuous_and_says_why() -> None:
    """llama-cpp-python's penalties see only the tokens the sampler drew: a repetition penalty
    judged on the first token drawn (step 0) moves nothing at any position of any case. The site
    says so, no draws are spent on it, and the control still runs: its row is vacuous."""
    rep0 = Setting("rep13", "repetition_penalty", kit.S(repetition_penalty=1.3), 0)
    rows = kit.oracle(2)
    p = make_plan(rows, _settings(rep0), "llama.cpp")
    (site,) = p.sites
    assert not site.powered and site.test is None and site.draws == 0
    assert "no position of any case powers it" in site.note
    assert "see only the tokens the engine drew" in site.note and f"{2 * 64} positions" in site.note
    assert not any(t.control for t in p.tests)
    ctl, facts = doubles.controls(p, kit.traits("llama.cpp"))
    (wrong,) = [c for c in ctl if c.mutation == "penalty with the wrong sign"]
    assert not wrong.ok and wrong.vacuates and site.note in wrong.note
    assert facts["penalty with the wrong sign"]["sites"]["repetition_penalty"][0]["powered"] is False
    # the same setting one token later is powered: what the suites do for llama.cpp
    p1 = make_plan(rows, _settings(Setting("rep13s1", "repetition_penalty", rep0.sampling, 1)), "llama.cpp")
    assert p1.sites[0].powered


def test_the_correct_doubles_false_positive_rate_with_the_sites_is_alpha_at_most() -> None:
    """200 seeded repetitions of every test, the control sites included, on two chains that order
    differently. Holm over exactly calibrated fits keeps the family-wise rate at alpha at most; a
    rate measured over 200 repetitions lands on either side of a true rate near alpha by chance
    (1500 repetitions of the vLLM plan: 12 failures, 0.008), so each must not be significantly above
    alpha (one-sided binomial, 1 %) — the criterion the records' own control applies."""
    for chain in ("vllm", "llama.cpp"):
        p = make_plan(kit.oracle(2), kit.settings(), chain)
        assert sum(t.control for t in p.tests) >= 6
        fp = false_positive_rate(p, kit.traits(chain), 200)
        assert fp["repetitions"] == 200 and fp["consistent_with_alpha"], (chain, fp)
        assert fp["ci95"][0] <= p.gs.alpha, (chain, fp)


def test_the_record_states_each_controls_site_power_and_tv() -> None:
    p = make_plan(kit.oracle(1), kit.settings(["pres10", "k5"], control_repetitions=0), "vllm")
    ctl, facts = doubles.controls(p, kit.traits())
    (k5,) = [c for c in ctl if c.mutation == "top-k keeps one token too many"]
    site = next(s for s in p.sites if s.setting == "k5")
    assert k5.ok and f"{site.test}: moves TV " in k5.note and f"at {site.draws} draws" in k5.note
    got = facts["top-k keeps one token too many"]["sites"]["top_k"][0]
    assert got["test"] == site.test and got["power"] >= 0.999 and got["moved_tv"]


def test_a_step_setting_moves_past_a_position_whose_path_it_cannot_follow() -> None:
    """A penalty drawn one token after the prefix is judged only where the first token followed the
    oracle's. Where the oracle's greedy token is nearly excluded under the setting (smollm2-135m's
    least decided position under a repetition penalty: chance 0.0014), that test would be skipped;
    the planner takes the next least decided position instead and says which it passed over."""
    rows = kit.oracle(1)
    gs = _settings(Setting("rep13s1", "repetition_penalty", kit.S(repetition_penalty=1.3), 1),
                   control_repetitions=0, align=8)
    (o,) = rows
    first = positions(o, gs)[0]
    # bury the greedy token after `first` under the rest: the path is nearly impossible there
    x = o.rows[first].copy()
    x[o.greedy[first]] = float(x.min()) - 30.0
    buried = [OracleRows(o.case, o.greedy, {**o.rows, first: x})]
    p = make_plan(buried, gs, "vllm")
    on = sorted(t.position for t in p.tests if not t.control)
    order = ranked(o, gs)
    assert first not in on and len(on) == gs.positions_per_case
    assert all(t.runs for t in p.tests)
    over = {x.split(":")[0] for x in p.passed_over}
    assert f"{o.case.id}@{first}/rep13s1" in over
    # nothing judgeable was passed over: every position ranked above the last one taken was either
    # taken or passed over with its reason
    last = max(order.index(t) for t in on)
    assert {f"{o.case.id}@{t}/rep13s1" for t in order[:last] if t not in on} == over
    assert all("probability" in x for x in p.passed_over)
    # untouched, the same plan tests the least decided positions and passes nothing over
    plain = make_plan(rows, gs, "vllm")
    assert sorted(t.position for t in plain.tests if not t.control) == positions(o, gs)
    assert plain.passed_over == ()
    # every aligned position taken, the next is off the block boundary
    every = _settings(gs.settings[0], control_repetitions=0, align=8, positions_per_case=len(order))
    pe = make_plan(buried, every, "vllm")
    off = sorted(t.position for t in pe.tests if not t.control)
    assert first not in off and len(off) == len(order) and all(t.runs for t in pe.tests)
    unaligned = set(off) - set(order)
    assert unaligned and len(unaligned) == len(set(order) - set(off))
    assert all((len(o.case.prompt_ids) + t) % 8 != 1 for t in unaligned)
    # where the path is unlikely everywhere, the least decided positions stay, as skips saying why
    nowhere = {t: r.copy() for t, r in o.rows.items()}
    for t in range(len(o.greedy)):
        nowhere[t][o.greedy[t]] = float(nowhere[t].min()) - 30.0
    kept = [t for t in make_plan([OracleRows(o.case, o.greedy, nowhere)], gs, "vllm").tests if not t.control]
    assert sorted(t.position for t in kept) == positions(o, gs)
    assert all(not t.runs and "probability" in (t.skip or "") for t in kept)
