"""A comparator is one unit: this file adds one (class, parameters, controls, needs, device policy)
and sees it judge a gate, guarded by its own controls; the registry refuses a unit that lacks a part."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from harness import compare
from harness.api import Case, EngineInfo, Output, RunFacts, Sampling, Verdict
from harness.compare.unit import TOKENS, ControlSet, Mutation, Planted, Unit, UnitError, param
from harness.goldens import read_golden
from harness.pipeline import run_gate_by_name
from harness.suites import SuiteError
from harness.workspace import REPO_ROOT, Workspace

# --- the whole comparator: one class and one unit --------------------------------------------


@dataclass(frozen=True, slots=True)
class Length:
    """The candidate generated as many tokens as the oracle, give or take ``max_short``."""

    key: ClassVar[str] = "length"
    needs_scores: ClassVar[bool] = False
    max_short: int = param(0, "int", "tokens the candidate may stop short of the oracle")

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        short = len(oracle.token_ids) - len(candidate.token_ids)
        ok = short <= self.max_short
        return Verdict(case.id, self.key, "pass" if ok else "fail",
                       f"length {'pass' if ok else 'FAIL'}: {len(candidate.token_ids)}/{len(oracle.token_ids)}",
                       evidence={"short": short})


def plant_cut(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if len(oracle.token_ids) <= comp.max_short:
        return "the golden is too short to cut past the bar"
    return Planted(oracle, oracle.with_tokens(oracle.token_ids[: len(oracle.token_ids) - comp.max_short - 1]))


def plant_same(comp: Any, case: Case, oracle: Output) -> Planted | str:
    return Planted(oracle, oracle)


UNIT = Unit(Length, "as many tokens as the oracle", needs=TOKENS, across_devices="bits",
            controls=ControlSet((Mutation("cut past the bar", "fail", plant_cut),
                                 Mutation("the golden itself", "pass", plant_same))))

# --- (in harness/compare/__init__.py the one registry line would be: add(length.UNIT)) -------


@pytest.fixture
def registered() -> Iterator[None]:
    with compare.COMPARATORS.patched("length", UNIT.check(), help=UNIT.help):
        yield


class Replay:
    """A candidate that replays the goldens, optionally cut short."""

    name = "replay"

    def __init__(self, outputs: dict[str, Output], cut: int = 0) -> None:
        self.outputs, self.cut = outputs, cut

    def info(self) -> EngineInfo:
        return EngineInfo("replay", "replay", "1")

    def start(self) -> None:
        pass

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        outs = [self.outputs[c.id] for c in cases]
        return [o.with_tokens(o.token_ids[: len(o.token_ids) - self.cut]) if self.cut else o for o in outs]

    def facts(self) -> RunFacts:
        return RunFacts()

    def close(self) -> None:
        pass


def gate_suite(ws: Workspace, table: str) -> None:
    """The committed smoke suite with ``table`` added to its comparators."""
    original = (REPO_ROOT / "suites" / "smoke.toml").read_text()
    (ws.suites / "smoke.toml").write_text(original.replace("[compare.strict]", f"{table}\n\n[compare.strict]", 1))


def goldens(ws: Workspace) -> dict[str, Output]:
    return dict(read_golden(ws.goldens / "tiny-llama" / "smoke", model_name="tiny-llama",
                            suite_name="smoke").outputs)


def test_a_new_comparator_judges_a_gate_under_its_own_controls(workspace: Workspace, registered: None) -> None:
    gate_suite(workspace, "[compare.length]\nmax_short = 2")
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", "replay", auto_record=False, write=False,
                   runner=Replay(goldens(workspace), cut=1))
    mine = [v for v in res.record.verdicts if v.comparator == "length"]
    assert len(mine) == 8 and all(v.status == "pass" for v in mine), mine  # 1 short, bar 2
    controls = {c.mutation: c for c in res.record.controls if c.comparator == "length"}
    assert controls["cut past the bar"].got == "fail 8/8" and controls["cut past the bar"].ok
    assert controls["the golden itself"].ok
    assert "length" in res.record.gates
    # cut past the suite's bar: the new comparator fails the gate (strict fails too: it is cut)
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", "replay", auto_record=False, write=False,
                   runner=Replay(goldens(workspace), cut=3))
    assert {v.status for v in res.record.verdicts if v.comparator == "length"} == {"fail"}
    assert res.record.outcome == "fail"


def test_its_parameters_are_checked_when_the_suite_loads(workspace: Workspace, registered: None) -> None:
    from harness.suites import find_suite

    gate_suite(workspace, "[compare.length]\nmax_shrt = 2")
    with pytest.raises(SuiteError, match=r"\[compare.length\].*max_shrt.*Did you mean 'max_short'"):
        find_suite(workspace.suites, "smoke")
    gate_suite(workspace, "[compare.length]\nmax_short = -1")
    with pytest.raises(SuiteError, match=r"\[compare.length\].max_short: expected an int >= 0"):
        find_suite(workspace.suites, "smoke")


def test_a_comparator_whose_controls_cannot_bite_makes_the_gate_vacuous(workspace: Workspace) -> None:
    @dataclass(frozen=True, slots=True)
    class Lenient(Length):
        def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
            return Verdict(case.id, self.key, "pass", "always")

    with compare.COMPARATORS.patched("length", replace(UNIT, cls=Lenient).check()):
        gate_suite(workspace, "[compare.length]")
        res = run_gate_by_name(workspace, "tiny-llama", "smoke", "replay", auto_record=False, write=False,
                       runner=Replay(goldens(workspace)))
    assert res.record.outcome == "vacuous" and "length: cut past the bar expected fail" in res.record.summary


@pytest.mark.parametrize("change, needle", [
    ({"controls": ControlSet((Mutation("the golden itself", "pass", plant_same),))}, "no mutation that must fail"),
    ({"needs": frozenset()}, "needs must name"),
    ({"needs": frozenset({"full_vocab"})}, "needs must name"),
    ({"across_devices": "sometimes"}, "across_devices must be one of bits, bar, any"),
    ({"help": " "}, "no help line"),
])
def test_the_registry_refuses_a_unit_that_lacks_a_part(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(UnitError, match=needle):
        compare.add(replace(UNIT, **change))
    assert "length" not in compare.COMPARATORS


def test_a_unit_of_scores_without_a_run_verdict_or_with_a_bad_default_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class Scores(Length):
        needs_scores: ClassVar[bool] = True

    with pytest.raises(UnitError, match="no compare_run"):
        replace(UNIT, cls=Scores).check()

    @dataclass(frozen=True, slots=True)
    class BadDefault(Length):
        max_short: int = param(-3, "int", "a default its own schema refuses")

    with pytest.raises(Exception, match="default of 'max_short'"):
        replace(UNIT, cls=BadDefault).check()


def test_defaults_are_stated_once_in_the_fields() -> None:
    for e in compare.COMPARATORS.entries():
        built = e.value.build({})
        for name, p in e.value.params().items():
            assert getattr(built, name) == p.convert(p.default), (e.name, name)
