"""The speculative-decoding gate's judge on planted synthetic distributions: it bites on a lossy
acceptance and a wrong bonus, does not false-alarm on the reference itself, certifies near-ties
and names the position; the schedule replay assigns draft, bonus and plain roles."""

from __future__ import annotations

import numpy as np
import pytest

from harness.kinds.spec import judge as J
from harness.kinds.spec.drafts import Slot, counts, schedule


def _lookup(ctx):
    """A stand-in drafter: the 2 tokens that followed the last token's previous occurrence."""
    last = ctx[-1]
    for i in range(len(ctx) - 2, -1, -1):
        if ctx[i] == last:
            return list(ctx[i + 1 : i + 3])
    return []


DRAFT0 = Slot("draft", 0)


def _test(q, slot=DRAFT0, position=1, tid="c@1/t1/c1"):
    return J.Test(tid, "c", position, 1.0, 1, (7,) * position, np.asarray(q, float), slot)


def test_greedy_exact_near_tie_and_fail_name_the_position():
    ref = J.Side((1, 2, 3), ((1, 9), (2, 9), (3, 9)), ((-0.1, -0.3),) * 3)
    assert J.greedy_verdict("c", ref, J.Side((1, 2, 3)), 0.5).status == "pass"
    top = ((1, 9), (2, 9), (3, 9))
    tie = J.greedy_verdict("c", J.Side((1, 2, 3), top, ((-0.1, -0.3),) * 3), J.Side((1, 9, 4)), 0.5)
    assert tie.status == "pass" and tie.evidence["position"] == 1 and not tie.evidence["exact"]
    far = J.greedy_verdict("c", J.Side((1, 2, 3), top, ((-0.1, -3.0),) * 3), J.Side((1, 9, 4)), 0.5)
    assert far.status == "fail" and "token 1/3" in far.summary and far.evidence["spec_token"] == 9
    out = J.greedy_verdict("c", ref, J.Side((1, 5, 3)), 0.5)
    assert out.status == "fail" and "outside the reference's top-k" in out.summary


def _run(alt, q, n, seed, tests=6):
    ts = [_test(q, tid=f"c@1/t1/c{i}") for i in range(tests)]
    draws = J.planted_draws(ts, [n] * tests, [np.asarray(alt, float)] * tests, seed)
    return J.sampled_verdicts(ts, draws, 0.01, 0.9)


def test_sampled_bites_on_lossy_acceptance_and_not_on_the_reference():
    q = [0.6, 0.3, 0.1]
    lossy = J.lossy(_test(q))
    assert lossy[0] == 1.0
    assert all(v.status == "fail" for v in _run(lossy, q, 400, 1))
    # the reference itself: over 40 seeded repetitions Holm at 0.01 must not reject more than once
    alarms = sum(any(v.status == "fail" for v in _run(q, q, 2000, s)) for s in range(40))
    assert alarms <= 2


def test_sampled_bites_on_a_shift_of_the_target_tv_with_the_planned_draws():
    q = np.array([0.5, 0.3, 0.2])
    shifted = np.array([0.55, 0.25, 0.2])  # TV 0.05
    fails = sum(any(v.status == "fail" for v in _run(shifted, q, 12000, s, tests=1)) for s in range(10))
    assert fails >= 8
    v = _run(q, q, 12000, 3, tests=1)[0]
    assert v.evidence["detectable_tv"] < 0.05


def test_roles_count_accepted_and_rejected_draws():
    t = _test([0.6, 0.4], Slot("draft", 0))
    v = J.sampled_verdicts([t], [np.array([0, 0, 1, 0])], 0.01, 0.9)[0]
    assert v.evidence["roles"] == {"accepted": 3, "rejected": 1}
    assert J.accepted_draws([v]) == 3
    bonus = J.sampled_verdicts([_test([0.6, 0.4], Slot("bonus"))], [np.array([0, 1])], 0.01, 0.9)[0]
    assert bonus.evidence["roles"] == {"bonus": 2} and J.accepted_draws([bonus]) == 0


def test_support_violation_fails_and_untouched_test_skips():
    t = _test([0.5, 0.5, 0.0])
    v = J.sampled_verdicts(
        [t, _test([0.5, 0.5], tid="x")], [np.array([0, 1, 2] * 10), np.zeros(0, np.int64)], 0.01, 0.9
    )
    assert v[0].status == "fail" and "outside the reference's support" in v[0].summary
    assert v[1].status == "skip"


def test_judged_keeps_only_draws_on_the_path():
    t = J.Test("c@2", "c", 2, 1.0, 1, (5, 6), np.ones(10) / 10, None)
    draws = np.array([[5, 6, 1], [5, 7, 2], [5, 6, 3], [4, 6, 4]])
    assert J.judged(t, draws).tolist() == [1, 3]


@pytest.mark.parametrize(
    "tokens, roles",
    [
        ([1, 2, 3, 4], ["plain", "draft", "draft", "bonus"]),
        ([1, 9, 3, 4], ["plain", "draft", "plain", "draft"]),
    ],
)
def test_schedule_replays_draft_and_bonus(tokens, roles):
    prompt = [1, 2, 3, 4, 5]  # after 1: the drafter proposes 2, 3
    got = schedule(prompt, tokens, _lookup)
    assert [s.role for s in got] == roles
    assert got[1].draft == 2


def test_counts_match_the_schedule():
    c = counts([1, 2, 3, 4, 5], [1, 2, 3, 4], _lookup)
    assert c == {"drafts": 1, "draft_tokens": 2, "accepted_tokens": 2, "emitted": 4}


SUITE = """name = "specx"
version = 1
kind = "spec"
[sampling]
max_tokens = 8
logprobs = 5
[spec]
{table}
[[cases]]
id = "a"
ids = [4, 5, 6]
"""


@pytest.mark.parametrize(("table", "says"), [
    ('near_tie_nats = 0.5', "[spec].speculative_config"),
    ('speculative_config = { num_speculative_tokens = 3 }', "[spec.speculative_config].method"),
    ('speculative_config = { method = "ngram" }\ntemperatures = [0.7, 0]', "[spec].temperatures"),
    ('speculative_config = { method = "ngram" }\nconcurency = [4]', "concurency"),
    ('speculative_config = { method = "ngram" }\npositions = [0, 1]', "[spec].positions"),
])
def test_a_bad_spec_table_is_refused_naming_file_and_key(tmp_path, table, says):
    from harness.kinds.spec.settings import parse
    from harness.suites import SuiteError, load_suite

    path = tmp_path / "specx.toml"
    path.write_text(SUITE.format(table=table))
    with pytest.raises(SuiteError) as e:
        parse(load_suite(path))
    assert str(path) in str(e.value) and says in str(e.value)


def test_the_committed_spec_suites_parse():
    from harness.kinds.spec.settings import parse
    from harness.pipeline import kind_of
    from harness.suites import load_suite
    from harness.workspace import Workspace

    for name in ("spec", "spec_small", "spec_draft", "spec_loops"):
        suite = load_suite(Workspace.default().suites / f"{name}.toml")
        assert kind_of(suite).name == "spec"
        s = parse(suite)
        assert s.k == 3 and sum("sampled" in c.tags for c in suite.cases) >= s.sampled_cases


def test_a_draw_cap_lowers_max_draws_and_refuses_anything_else(tmp_path):
    from harness.kinds.spec.kind import with_draw_cap
    from harness.kinds.spec.settings import parse
    from harness.suites import SuiteError, load_suite

    path = tmp_path / "specx.toml"
    path.write_text(SUITE.format(table='speculative_config = { method = "ngram" }\nmax_draws = 1200'))
    s = parse(load_suite(path))
    assert with_draw_cap(s, None) is s
    assert with_draw_cap(s, 150).max_draws == 150 and with_draw_cap(s, 150).to_json()["max_draws"] == 150
    for bad, says in ((0, ">= 1"), (True, ">= 1"), ("150", ">= 1"), (5000, "never raises")):
        with pytest.raises(SuiteError, match=says):
            with_draw_cap(s, bad)


def test_llama_cpp_prompt_lookup_takes_the_longest_tail_and_its_first_occurrence():
    from harness.kinds.spec.drafts import lookup_drafter

    propose = lookup_drafter({"num_speculative_tokens": 3, "prompt_lookup_max": 3})
    # the tail (7, 8) occurs first at 1 and again at 5: the first occurrence's continuation
    assert propose([6, 7, 8, 1, 2, 7, 8, 3, 7, 8]) == [1, 2, 7]
    # the 3-gram (1, 2, 3) beats the 1-gram (3); a continuation stops where the context does
    assert propose([3, 9, 1, 2, 3, 5, 1, 2, 3]) == [5, 1, 2]
    assert propose([4, 5, 4]) == [5, 4]
    assert propose([1, 2, 3]) == [] and propose([1]) == []


def test_a_lossy_double_without_roles_puts_all_mass_on_the_greedy_token():
    q = np.array([0.2, 0.5, 0.3])
    assert J.lossy(_test(q, None)).tolist() == [0.0, 1.0, 0.0]  # no roles: a drafter of the greedy token
    assert J.lossy(_test(q, Slot("draft", 2))).tolist() == [0.0, 0.0, 1.0]
    assert J.lossy(_test(q, Slot("bonus"))).tolist() == q.tolist()


def test_the_llama_cpp_worker_counts_proposals_as_the_replay_does():
    import importlib.util

    from harness.kinds.spec.drafts import counts, lookup_drafter
    from harness.workspace import REPO_ROOT

    path = REPO_ROOT / "harness" / "engines" / "llamacpp" / "spec_worker.py"
    spec = importlib.util.spec_from_file_location("spec_worker_under_test", path)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    propose = lookup_drafter({"num_speculative_tokens": 3, "prompt_lookup_max": 2})
    prompt, tokens = [5, 6, 7, 5, 6, 7, 5], [6, 7, 9, 5, 6, 8, 8, 8]
    seen = worker.Proposals(lambda ids: np.asarray(propose(list(ids)), np.intc))
    i = 1  # the engine asks the drafter after the prefill and after each verified window
    while i < len(tokens):
        proposal = list(seen(np.asarray(prompt + tokens[:i], np.intc)))
        kept = 0
        while kept < len(proposal) and i + kept < len(tokens) and tokens[i + kept] == proposal[kept]:
            kept += 1
        i += kept + 1  # the kept drafts, then the replacement or the bonus
    got = seen.count(prompt + tokens)
    want = counts(prompt, tokens, propose)
    assert (got[worker.DRAFTS], got[worker.DRAFTED], got[worker.ACCEPTED]) == (
        want["drafts"], want["draft_tokens"], want["accepted_tokens"])


def test_a_control_run_guards_its_own_verdict():
    from harness.kinds.spec.kind import _controls
    from harness.kinds.spec.settings import CONTROL, SpecSettings

    s = SpecSettings({"method": "ngram"})
    got = [c for c in _controls((), [], s, [], 0.0, "accept_all") if c.comparator == CONTROL]
    assert [(c.expect, c.got, c.ok) for c in got] == [("fail", "fail", True), ("pass", "pass", True)]
    assert not [c for c in _controls((), [], s, [], 0.0, None) if c.comparator == CONTROL]


def test_without_a_replayed_drafter_the_cases_most_likely_on_the_greedy_path_are_drawn():
    from harness.api import Case
    from harness.kinds.spec.run import choose
    from harness.kinds.spec.settings import SpecSettings

    s = SpecSettings({"method": "draft_model"}, positions=(1, 2), sampled_cases=1, temperatures=(0.7, 1.0))
    flat, sharp = np.log(np.full((3, 4), 0.25)), np.log(np.array([[0.97, 0.01, 0.01, 0.01]] * 3))
    cases = [Case(x, (1, 2), tags=("sampled",)) for x in ("flat", "sharp")]
    rows = {"flat": ((0, 0, 0), flat), "sharp": ((0, 0, 0), sharp)}
    assert [c.id for c in choose(cases, rows, s, None)] == ["sharp"]
