"""The vacuous-gate guard: planted mutations must bite, and a comparator that cannot fail is VACUOUS."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness import compare
from harness.api import Case, EngineInfo, Output, RunFacts, Sampling, Verdict
from harness.compare.kernels.planting import plant_decisive_flip
from harness.compare.kl import KL
from harness.compare.near_tie import NearTie
from harness.compare.nmse import NMSE
from harness.compare.strict import Strict
from harness.compare.unit import TOKENS, ControlSet, Mutation, Unit
from harness.features import generate
from harness.goldens import read_golden
from harness.kinds.controls import run_controls
from harness.pipeline import run_gate_by_name
from harness.records import GOLDEN_CHECK, UNGUARDED, failed_positive, guard, vacuous_reasons
from harness.workspace import REPO_ROOT
from tests.unit.features_kit import commit, make_git_workspace


def golden():  # noqa: ANN201
    return read_golden(REPO_ROOT / "goldens" / "tiny-llama" / "smoke", model_name="tiny-llama",
                       suite_name="smoke")


def by(controls, mutation):  # noqa: ANN001, ANN201
    return next(c for c in controls if c.mutation == mutation)


def own(comp, cases, outputs, unit: str | None = None):  # noqa: ANN001, ANN201
    """``comp`` judged under the controls its registered unit (or unit ``unit``) declares."""
    return run_controls(comp, compare.unit(unit or comp.key).controls, cases, outputs)


@dataclass(frozen=True, slots=True)
class AlwaysPass:
    """A comparator that cannot fail: the bug the guard exists for."""

    key = "always_pass"
    needs_scores = False
    threshold_nats: float = 0.5

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return Verdict(case.id, self.key, "pass", "looks fine")


@dataclass(frozen=True, slots=True)
class TopKOnly(NearTie):
    """A near-tie that forgets the gap: any top-k token passes (the all-zero-array bug, in code)."""

    key = "near_tie"

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return NearTie(threshold_nats=1e9).compare(oracle, candidate, case)


@dataclass(frozen=True, slots=True)
class SecretlyStrict(NearTie):
    """A near-tie that forgives nothing: the positive control catches it."""

    key = "near_tie"

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        v = Strict().compare(oracle, candidate, case)
        return Verdict(v.case_id, self.key, v.status, v.summary)


ALWAYS_PASS = Unit(AlwaysPass, "a comparator that cannot fail", needs=TOKENS, across_devices="bits",
                   controls=ControlSet((Mutation("flip decisive token", "fail", plant_decisive_flip),)))


@pytest.fixture
def always_pass_registered() -> Iterator[None]:
    with compare.COMPARATORS.patched("always_pass", ALWAYS_PASS.check()):
        yield


def test_real_strict_and_near_tie_bite_on_the_committed_goldens() -> None:
    g = golden()
    for comp in (Strict(), NearTie(threshold_nats=0.5)):
        controls = own(comp, g.cases, g.outputs)
        assert controls and all(c.ok for c in controls), controls
        assert vacuous_reasons(controls, [comp.key]) == []
    nt = own(NearTie(threshold_nats=0.5), g.cases, g.outputs)
    assert by(nt, "swap beyond bar").got == "fail 8/8"
    assert by(nt, "swap within bar").got == "pass 8/8"


def test_a_comparator_that_always_passes_is_vacuous(always_pass_registered: None) -> None:
    g = golden()
    controls = own(AlwaysPass(), g.cases, g.outputs)
    flip = by(controls, "flip decisive token")
    assert flip.expect == "fail" and flip.got.startswith("pass 8/8") and not flip.ok
    outcome, why = guard("pass", controls, ["always_pass"])
    assert outcome == "vacuous"
    assert why and why[0].startswith("always_pass: flip decisive token expected fail, got pass")
    # reported-only comparators do not make the gate vacuous; a failing gate stays failed
    assert guard("pass", controls, ["near_tie"])[0] == "pass"
    assert guard("fail", controls, ["always_pass"])[0] == "fail"


def test_near_tie_that_ignores_the_gap_is_vacuous() -> None:
    g = golden()
    controls = own(TopKOnly(threshold_nats=0.5), g.cases, g.outputs)
    beyond = by(controls, "swap beyond bar")
    assert not beyond.ok and beyond.got.startswith("pass")
    assert guard("pass", controls, ["near_tie"])[0] == "vacuous"


def test_near_tie_bar_above_every_gap_cannot_fail_and_is_vacuous() -> None:
    g = golden()
    controls = own(NearTie(threshold_nats=50.0), g.cases, g.outputs)
    beyond = by(controls, "swap beyond bar")
    assert beyond.got == "unplantable" and "no top-k alternative is more than 50" in beyond.note
    assert guard("pass", controls, ["near_tie"])[0] == "vacuous"


def test_a_near_tie_that_forgives_nothing_fails_its_positive_control() -> None:
    g = golden()
    controls = own(SecretlyStrict(threshold_nats=0.5), g.cases, g.outputs)
    within = by(controls, "swap within bar")
    assert within.expect == "pass" and not within.ok
    assert guard("pass", controls, ["near_tie"])[0] == "pass"  # it can still fail: not vacuous
    assert failed_positive(controls, ["near_tie"])


def test_a_gated_comparator_that_ran_no_controls_is_unguarded_and_vacuous() -> None:
    from harness.kinds.base import Judgement
    from harness.pipeline import unguarded

    g = golden()
    j = Judgement("x", EngineInfo("x", "x", "1"), (Verdict("c01", "always_pass", "pass", "fine"),),
                  ("always_pass",), (), "summary")
    controls = unguarded(j)
    assert [c.mutation for c in controls] == [UNGUARDED] and g.cases
    assert guard("pass", controls, ["always_pass"])[0] == "vacuous"


def out(cid: str, tokens: Sequence[int], lp: np.ndarray | None, ids: np.ndarray | None = None) -> Output:
    if lp is None:
        return Output(cid, tuple(tokens))
    ids = ids if ids is not None else np.tile(np.arange(lp.shape[1], dtype=np.int32), (len(tokens), 1))
    return Output(cid, tuple(tokens), "", ids, lp.astype(np.float32), lp[:, 0].astype(np.float32))


def cases(n: int) -> list[Case]:
    return [Case(f"c{i}", (1, 2)) for i in range(n)]


@pytest.mark.parametrize("what, outputs, needle", [
    ("all-zero logprob array", [out(f"c{i}", [0, 0, 1], np.zeros((3, 5))) for i in range(2)],
     "not a distribution"),
    ("missing logprobs", [out(f"c{i}", [0, 1, 2], None) for i in range(2)], "no case has logprobs"),
    ("k too small", [out(f"c{i}", [0, 1, 2], np.full((3, 1), -0.1)) for i in range(2)], "needs k >= 2"),
    ("all-zero gaps", [out(f"c{i}", [0, 1, 2], np.full((3, 5), np.log(0.2))) for i in range(2)],
     "gap is zero"),
])
def test_degenerate_goldens_make_near_tie_vacuous(what: str, outputs: list[Output], needle: str) -> None:
    controls = own(NearTie(threshold_nats=0.5), cases(2), {o.case_id: o for o in outputs})
    check = by(controls, GOLDEN_CHECK + " logprobs")
    assert not check.ok and needle in check.note, (what, check)
    assert guard("pass", controls, ["near_tie"])[0] == "vacuous", what


@pytest.mark.parametrize("tokens, needle", [
    ([[], []], "every generation is empty"),
    ([[7, 7, 7], [7, 7, 7, 7]], "every generation repeats one token"),
    ([[1, 2, 3], [1, 2, 3]], "every case generated the same tokens"),
])
def test_degenerate_generations_make_strict_vacuous(tokens: list[list[int]], needle: str) -> None:
    outputs = {f"c{i}": Output(f"c{i}", tuple(t)) for i, t in enumerate(tokens)}
    controls = own(Strict(), cases(2), outputs)
    check = by(controls, GOLDEN_CHECK + " generations")
    assert not check.ok and needle in check.note
    assert guard("pass", controls, ["strict"])[0] == "vacuous"


def test_one_constant_case_is_flagged_not_fatal() -> None:
    outputs = {"c0": Output("c0", (7, 7, 7)), "c1": Output("c1", (1, 2, 3))}
    check = by(own(Strict(), cases(2), outputs), GOLDEN_CHECK + " generations")
    assert check.ok and "constant in c0" in check.note


def test_kl_controls_bite_and_a_kl_without_a_bar_is_vacuous() -> None:
    g = golden()
    good = own(KL(max_mean=1e-3), g.cases, g.outputs)
    assert all(c.ok for c in good), good
    bad = own(KL(max_mean=float("inf")), g.cases, g.outputs)
    assert not by(bad, "perturb above bar").ok
    assert guard("pass", bad, ["kl"])[0] == "vacuous"


def full_vocab_output(cid: str, n: int = 6, v: int = 16, seed: int = 0) -> Output:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, v)) * 2
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    order = np.argsort(-lp, axis=1)
    ids = order.astype(np.int32)
    lps = np.take_along_axis(lp, order, axis=1).astype(np.float32)
    return Output(cid, tuple(int(i) for i in ids[:, 0]), "", ids, lps, lps[:, 0].copy())


def test_nmse_controls_need_full_vocab() -> None:
    full = {f"c{i}": full_vocab_output(f"c{i}", seed=i) for i in range(2)}
    good = own(NMSE(max_nmse=5e-4), cases(2), full)
    assert all(c.ok for c in good), good
    assert not by(own(NMSE(max_nmse=1e9), cases(2), full), "perturb above bar").ok
    g = golden()  # top-5 goldens: an NMSE gate on them can only skip
    topk = own(NMSE(max_nmse=5e-4), g.cases, g.outputs)
    assert "full-vocab" in by(topk, GOLDEN_CHECK + " logprobs").note
    assert guard("pass", topk, ["nmse"])[0] == "vacuous"


def test_every_registered_comparator_is_a_whole_unit() -> None:
    for e in compare.COMPARATORS.entries():
        u = e.value
        assert u.check() is u and u.controls.must_fail and u.needs, e.name
    assert {"strict", "near_tie", "kl", "nmse", "drift", "bit_exact", "rl_logprobs", "byte_equal",
            "kv_hits"} <= set(compare.COMPARATORS)


def test_a_second_unit_for_one_name_is_refused_unless_patched_in() -> None:
    real = compare.unit("strict")
    with pytest.raises(ValueError, match="registered twice"):
        compare.add(real)
    fake = Unit(AlwaysPass, "x", needs=TOKENS, across_devices="bits",
                controls=ControlSet((Mutation("x", "fail", plant_decisive_flip),)))
    with compare.COMPARATORS.patched("strict", fake):
        assert compare.unit("strict") is fake
    assert compare.unit("strict") is real


# --- end to end: a gate whose comparator cannot fail writes a VACUOUS record and table cell ------


class EchoRunner:
    """A candidate that replays the goldens: every comparator passes it."""

    name = "echo"

    def __init__(self, outputs: dict[str, Output]) -> None:
        self.outputs = outputs

    def info(self) -> EngineInfo:
        return EngineInfo("echo", "echo", "1.0")

    def start(self) -> None:
        pass

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return [self.outputs[c.id] for c in cases]

    def facts(self) -> RunFacts:
        return RunFacts()

    def close(self) -> None:
        pass


VACUOUS_CATALOG = """
[[columns]]
key = "echo"
candidate = "echo"

[[sections]]
title = "Gates"

[[sections.rows]]
id = "guarded"
title = "near-tie (real)"
model = "tiny-llama"
suite = "smoke"
prove = ["near_tie"]

[[sections.rows]]
id = "vacuous"
title = "a comparator that cannot fail"
model = "tiny-llama"
suite = "smoke"
prove = ["always_pass"]
"""


def test_deliberately_vacuous_comparator_comes_out_vacuous_in_record_and_table(
        tmp_path: Path, always_pass_registered: None) -> None:
    ws = make_git_workspace(tmp_path / "ws", VACUOUS_CATALOG)
    suite = ws.suites / "smoke.toml"
    suite.write_text(suite.read_text().replace(
        "[compare.strict]", "[compare.always_pass]\ngate = true\n\n[compare.strict]", 1))
    commit(ws.root, "gate on a comparator that cannot fail")

    res = run_gate_by_name(ws, "tiny-llama", "smoke", "echo", auto_record=False,
                   runner=EchoRunner(dict(golden().outputs)))
    rec = res.record
    assert all(v.status == "pass" for v in rec.verdicts)  # every verdict passes ...
    assert rec.outcome == "vacuous"                        # ... and the gate does not count
    assert "VACUOUS: always_pass: flip decisive token expected fail, got pass" in rec.summary
    assert any(c.comparator == "near_tie" and c.ok for c in rec.controls)

    g = generate(ws)
    assert g.table.cell("vacuous", "echo").state == "vacuous"
    assert g.table.cell("guarded", "echo").state == "pass"
    assert "[VACUOUS 8/8][r" in g.features  # the short cell: a count of passes that prove nothing ...
    assert "1. VACUOUS always_pass: flip decisive token" in g.features  # ... and its note says why
    assert "VACUOUS" in g.supported  # listed as not verified, with the reason
    assert "## Verified models" in g.supported and "| tiny-llama | LlamaForCausalLM" not in g.supported


def test_a_gate_with_real_comparators_records_its_controls(tmp_path: Path) -> None:
    ws = make_git_workspace(tmp_path / "ws", VACUOUS_CATALOG.split("[[sections.rows]]\nid = \"vacuous\"")[0])
    res = run_gate_by_name(ws, "tiny-llama", "smoke", "echo", auto_record=False,
                   runner=EchoRunner(dict(golden().outputs)))
    assert res.record.outcome == "pass"
    assert {c.comparator for c in res.record.controls} == {"strict", "near_tie", "greedy"}  # greedy: the self-check
    assert all(c.ok for c in res.record.controls)
    assert res.record.model["architecture"] == "LlamaForCausalLM"
    assert res.record.oracle["settings"]["block_size"] == 32


@dataclass(frozen=True, slots=True)
class TextOnlyStrict:
    """strict judged on text (a candidate without token ids): same key, other evidence."""

    key = "strict"
    needs_scores = False

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return Verdict(case.id, self.key, "pass" if oracle.text == candidate.text else "fail", "text")


def test_token_mutations_change_the_text_too_so_text_only_strict_is_guarded() -> None:
    g = golden()
    controls = own(TextOnlyStrict(), g.cases, g.outputs)
    assert by(controls, "flip decisive token").got == "fail 8/8"
    assert by(controls, "drop last token").got == "fail 8/8"
    assert guard("pass", controls, ["strict"])[0] == "pass"


def evidence(n: int = 4, size: int = 64, pages: list[bytes] | None = None):  # noqa: ANN201
    """One case's KV evidence: ``n`` pages written (and restored as written), chunk 32."""
    from harness.kv_pages.digest import digest_bytes
    from harness.kv_pages.evidence import CaseEvidence, MemoryPage
    from harness.kv_pages.identity import PageRef

    rng = np.random.default_rng(0)
    data = pages if pages is not None else [rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                                            for _ in range(n)]
    refs = [PageRef(f"k{i}", "layer0", 0, 32 * i, 32 * (i + 1)) for i in range(len(data))]
    written = {r.id: MemoryPage(r, digest_bytes(d), d) for r, d in zip(refs, data, strict=True)}
    hit = 32 * len(data)
    return CaseEvidence("tiny", "c0", "clean", hit + 1, 32, hit, tuple(refs), written,
                        tuple(written.values()), engine_cached=hit, connector_external=hit)


@dataclass(frozen=True, slots=True)
class FirstPageLengthOnly:
    """A page comparator that compares one page's length: it cannot see a flipped byte."""

    key = "byte_equal"
    needs_scores = False

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return Verdict(case.id, self.key, "skip", "pages")

    def judge_kv(self, case: Case, ev) -> Verdict:  # noqa: ANN001
        first = ev.expected[0].id if ev.expected else None
        w, r = ev.written.get(first), next((p for p in ev.restored if p.ref.id == first), None)
        ok = first is None or (r is not None and w is not None and r.nbytes == w.nbytes)
        return Verdict(case.id, self.key, "pass" if ok else "fail", "length of the first page")


def test_page_controls_bite_on_the_real_byte_comparison() -> None:
    ev = evidence()
    for name in ("byte_equal", "kv_hits"):
        controls = own(compare.build(name), [Case("c0", (1,))], {"c0": ev})
        assert all(c.ok for c in controls), controls
        assert guard("pass", controls, [name])[0] == "pass"
    flip = by(own(compare.build("byte_equal"), [Case("c0", (1,))], {"c0": ev}), "flip one byte of one page")
    assert flip.got == "fail 1/1" and "byte 32 of layer layer0" in flip.note


def test_a_page_comparator_that_misses_a_flipped_byte_is_vacuous() -> None:
    controls = own(FirstPageLengthOnly(), [Case("c0", (1,))], {"c0": evidence()}, unit="byte_equal")
    assert by(controls, "flip one byte of one page").got.startswith("pass")
    assert guard("pass", controls, ["byte_equal"])[0] == "vacuous"


@pytest.mark.parametrize("captured, needle", [
    ([], "no pages were captured"),
    ([bytes(64), bytes(64)], "zero bytes"),
    ([b"\x01" * 64, b"\x01" * 64], "the same bytes"),
])
def test_degenerate_page_captures_are_vacuous(captured, needle: str) -> None:  # noqa: ANN001
    controls = own(compare.build("byte_equal"), [Case("c0", (1,))], {"c0": evidence(pages=captured)})
    assert needle in by(controls, GOLDEN_CHECK + " pages").note
    assert guard("pass", controls, ["byte_equal"])[0] == "vacuous"


def test_suite_controls_follow_the_candidates_capabilities() -> None:
    from harness.capabilities import Capabilities
    from harness.kinds.controls import suite_controls
    from harness.suites import find_suite

    suite = find_suite(REPO_ROOT / "suites", "smoke")
    g = golden()
    full = suite_controls(suite, g)
    assert {c.comparator for c in full} == {"strict", "near_tie"}
    text_only = suite_controls(suite, g, capabilities=Capabilities(token_ids=False))
    # near_tie is impossible without ids (it judged nothing, so nothing to guard); strict judged
    # text, and its mutations bite on text too
    assert {c.comparator for c in text_only} == {"strict"}
    assert all(c.ok for c in text_only), text_only


def long_output(cid: str, n: int = 256, k: int = 20, seed: int = 0) -> Output:
    """A top-k output (mass 0.8 in the top-k) long enough for drift to judge."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(512)[:k] for _ in range(n)]).astype(np.int32)
    lg = np.sort(rng.standard_normal((n, k)) * 2, axis=1)[:, ::-1]
    lp = (lg - np.log(np.exp(lg).sum(axis=1, keepdims=True) * 1.25)).astype(np.float32)
    return Output(cid, tuple(int(x) for x in ids[:, 0]), "", ids, lp, lp[:, 0].copy())


def test_drift_controls_bite_and_a_drift_without_a_bar_is_vacuous() -> None:
    from harness.compare.drift import Drift

    outs = {f"c{i}": long_output(f"c{i}", seed=i) for i in range(2)}
    good = own(Drift(max_slope_per_1k=1e-4), cases(2), outs)
    assert by(good, "KL ramp above slope bar").got == "fail 2/2"
    assert all(c.ok for c in good), good
    assert guard("pass", own(Drift(max_slope_per_1k=1e9), cases(2), outs), ["drift"])[0] \
        == "vacuous"
    g = golden()  # 32 positions: drift has no slope to judge, so a drift gate there cannot fail
    short = own(Drift(), g.cases, g.outputs)
    assert by(short, "KL ramp above slope bar").got == "unplantable"
    assert guard("pass", short, ["drift"])[0] == "vacuous"
