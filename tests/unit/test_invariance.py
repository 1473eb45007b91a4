"""The invariance gate on synthetic engine results: the two tiers, the inverse control, the planted
faults, the trainer-vs-rollout statistics, the suite's tables, the plan of engine starts, and the
kind end to end through the pipeline (records, staleness, FEATURES.md cells). The same gate on a
real vLLM is tests/integration/test_invariance.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import Case, Output, Sampling, Verdict
from harness.compare import build, unit
from harness.compare.bit_exact import BitExact
from harness.compare.near_tie import NearTie
from harness.compare.rl_logprobs import RUN, RLLogprobs, rl_stats
from harness.engines.launch.procs import Exited
from harness.engines.launch.worker_lines import Lines
from harness.features.catalog import load_catalog
from harness.features.cells import judge_record
from harness.kinds.controls import run_controls
from harness.kinds.invariance.kind import Ran
from harness.kinds.invariance.plan import (
    ALONE,
    BASE,
    INVERSE,
    PC_COLD,
    PC_DONORS,
    PC_SHARED,
    PC_WARM,
    ROLLOUT,
    TOGETHER,
    Plan,
    make_plan,
    shared_groups,
)
from harness.kinds.invariance.run import GroupResult, TrainerResult, output_from_line, parse_result
from harness.kinds.invariance.settings import InvarianceError, parse, verdict_name, verdict_names
from harness.kinds.invariance.tiers import FAULTS, Pair, Tiers, fault_controls, inverse_control, judge_pairs
from harness.kinds.invariance.trainer import mode_logprobs
from harness.kinds.kv.config import store_settings
from harness.kinds.registered import staleness
from harness.pipeline import run_gate_by_name
from harness.records import guard, load_record, vacuous_reasons
from harness.staleness import Current
from harness.suites import SuiteError, load_suite
from harness.workspace import REPO_ROOT, Workspace
from tests.conftest import make_case, make_output
from tests.pins import EARLIER, PIN
from tests.unit.features_kit import commit, make_git_workspace

TIERS = Tiers(BitExact(), NearTie(threshold_nats=0.5))


def with_chosen(o: Output, chosen: np.ndarray) -> Output:
    return Output(o.case_id, o.token_ids, o.text, o.top_ids, o.top_logprobs, chosen.astype(np.float32),
                  o.finish_reason)


def ulp_lower(o: Output, t: int) -> Output:
    """``o`` with the chosen token's logprob one float32 ulp lower at position ``t`` (and in its top-k row)."""
    c = np.array(o.chosen_logprobs, np.float32, copy=True)
    top = np.array(o.top_logprobs, np.float32, copy=True)
    hit = (np.asarray(o.top_ids)[t] == o.token_ids[t]) & (top[t] == c[t])
    c[t] = np.nextafter(c[t], np.float32(-np.inf))
    top[t][hit] = c[t]
    return Output(o.case_id, o.token_ids, o.text, o.top_ids, top, c, o.finish_reason)


# --- bit-exact ---------------------------------------------------------------------------------


def test_bit_exact_passes_only_the_same_tokens_and_the_same_bits() -> None:
    ref = make_output("c01", list(range(10, 42)))
    case = make_case()
    assert BitExact().compare(ref, ref, case).status == "pass"
    v = BitExact().compare(ref, ulp_lower(ref, 7), case)
    assert v.status == "fail" and v.evidence["first_logprob_difference"] == 7
    assert v.evidence["first_divergence"] is None and "tokens equal, logprobs differ" in v.summary
    assert "1 ulp" in v.detail and "token 7/32" in v.detail
    flipped = ref.with_tokens([*ref.token_ids[:5], 499, *ref.token_ids[6:]])
    v = BitExact().compare(ref, flipped, case)
    assert v.status == "fail" and v.evidence["first_divergence"] == 5
    # strict would pass the one-ulp output: only the bit-exact tier sees it
    assert build("strict", {}).compare(ref, ulp_lower(ref, 7), case).status == "pass"
    signed = with_chosen(ref, np.where(np.arange(32) == 3, -0.0, ref.chosen_logprobs))
    zero = with_chosen(ref, np.where(np.arange(32) == 3, 0.0, ref.chosen_logprobs))
    assert BitExact().compare(zero, signed, case).status == "fail"  # -0.0 and 0.0 differ in bits


def test_bit_exact_needs_logprobs_on_both_sides() -> None:
    ref = make_output("c01", [1, 2, 3])
    bare = Output("c01", (1, 2, 3))
    assert BitExact().compare(ref, bare, make_case()).status == "error"


# --- tiers, evidence, faults, inverse ------------------------------------------------------------


def dist_output(cid: str, n: int = 24, seed: int = 0, k: int = 5, vocab: int = 64) -> Output:
    """A greedy output whose top-k rows are a real distribution's (some runner-ups within 0.5 nats,
    some far behind)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vocab)) * 2.5
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    order = np.argsort(-lp, axis=1)[:, :k]
    top = np.take_along_axis(lp, order, axis=1).astype(np.float32)
    return Output(cid, tuple(int(t) for t in order[:, 0]), "", order.astype(np.int32), top, top[:, 0].copy())


def pairs_of(n: int = 4, cand: Callable[[Output], Output] = lambda o: o) -> list[Pair]:
    out = []
    for i in range(n):
        ref = dist_output(f"c0{i}", seed=i)
        out.append(Pair(Case(f"c0{i}", (1, 2, 3)), ref, cand(ref)))
    return out


def test_each_pair_gets_both_tiers_named_by_variant() -> None:
    vs = judge_pairs("batch", pairs_of(2), TIERS)
    assert [v.comparator for v in vs] == ["inv_batch.bit_exact", "inv_batch.near_tie"] * 2
    assert all(v.status == "pass" for v in vs)


def test_a_pair_that_is_not_evidence_is_skipped_with_why_and_the_judgement_kept() -> None:
    p = pairs_of(1, lambda o: ulp_lower(o, 2))[0]
    vs = judge_pairs("prefix_cache", [replace(p, not_evidence="the warm pass hit no cached token",
                                               facts={"num_cached_tokens": 0})], TIERS)
    exact = vs[0]
    assert exact.status == "skip" and exact.summary.startswith("not evidence: the warm pass hit")
    assert exact.evidence["judged"] == "fail" and exact.evidence["num_cached_tokens"] == 0


def test_a_perturbed_position_fails_bit_exact_and_near_tie_follows_its_gap() -> None:
    """The brief's planted fault: the variant's output perturbed at one position."""
    ref = make_output("c01", list(range(10, 42)), gap=0.3)  # every runner-up 0.3 nats behind
    case = make_case()
    toks = list(ref.token_ids)
    toks[9] = int(ref.top_ids[9, 1])  # the runner-up: a gap of 0.3 < 0.5
    cand = ref.with_tokens(toks)
    assert TIERS.compare("bit_exact", ref, cand, case).status == "fail"
    assert TIERS.compare("near_tie", ref, cand, case).status == "pass"
    far = make_output("c01", list(range(10, 42)), gap=2.0)
    cand = far.with_tokens([*far.token_ids[:9], int(far.top_ids[9, 1]), *far.token_ids[10:]])
    assert TIERS.compare("bit_exact", far, cand, case).status == "fail"
    assert TIERS.compare("near_tie", far, cand, case).status == "fail"


def test_every_registered_fault_gets_the_answer_it_expects_per_tier() -> None:
    refs = [(p.case, p.reference) for p in pairs_of(4)]
    controls = fault_controls("batch", refs, TIERS)
    planted = [c for c in controls if c.mutation.startswith("planted: ")]
    assert len(planted) == 2 * len(FAULTS)
    assert all(c.ok for c in controls), [c for c in controls if not c.ok]
    assert {c.comparator for c in controls} == {"inv_batch.bit_exact", "inv_batch.near_tie"}
    by = {(c.comparator, c.mutation): c for c in planted}
    ulp = "planted: one logprob one ulp lower at one position"
    assert by[("inv_batch.bit_exact", ulp)].expect == "fail"
    assert by[("inv_batch.near_tie", ulp)].expect == "pass"


def test_a_tier_that_cannot_fail_is_caught_by_its_faults() -> None:
    """A bit-exact tier that only compared tokens (strict under another name) would pass the one-ulp
    fault: its control fails and a gate on it is vacuous."""

    class TokensOnly(BitExact):
        def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
            return build("strict", {}).compare(oracle, candidate, case)

    weak = Tiers(TokensOnly(), NearTie(0.5))
    controls = fault_controls("batch", [(p.case, p.reference) for p in pairs_of(3)], weak)
    bad = [c for c in controls if not c.ok]
    assert [c.mutation for c in bad] == ["planted: one logprob one ulp lower at one position"]
    assert guard("pass", controls, ["inv_batch.bit_exact"])[0] == "vacuous"
    assert guard("pass", controls, ["inv_batch.near_tie"])[0] == "pass"


def test_the_inverse_control_says_whether_differences_appeared() -> None:
    refs = pairs_of(3)
    shifted = [replace(p, candidate=ulp_lower(p.reference, 4)) for p in refs]
    inv, ctl = inverse_control("batch", shifted, TIERS, "dtype=bfloat16")
    assert inv.sensitive and inv.bit_exact_failed == 3 and inv.near_tie_failed == 0
    assert ctl.ok and ctl.comparator == "inv_batch.bit_exact" and ctl.got == "fail 3/3"
    assert inv.to_json()["note"].startswith("differences appeared")
    inv, ctl = inverse_control("batch", refs, TIERS, "dtype=bfloat16")  # the "inverse" changed nothing
    assert not inv.sensitive and not ctl.ok
    assert "no demonstrated sensitivity" in inv.to_json()["note"] and "no demonstrated sensitivity" in ctl.note
    assert guard("pass", [ctl], ["inv_batch.bit_exact"])[0] == "vacuous"
    inv, ctl = inverse_control("batch", [], TIERS, "dtype=bfloat16", "the inverse engine refused: x")
    assert inv.status.startswith("the inverse engine refused") and not ctl.ok and ctl.got == "not run"


# --- trainer vs rollout ---------------------------------------------------------------------------


def naive_stats(rollout: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]]) -> dict[str, float]:
    """The statistics written out one token at a time (the reference the vectorised code is held to)."""
    import math

    deltas, k1, k3, bad = [], [], [], 0
    for r_seq, t_seq in zip(rollout, trainer, strict=True):
        s1 = s3 = 0.0
        for r, t in zip(r_seq, t_seq, strict=True):
            if not (math.isfinite(r) and math.isfinite(t)):
                bad += 1
                continue
            d = t - r
            deltas.append(d)
            s1 += -d
            s3 += math.exp(d) - 1 - d
        k1.append(s1)
        k3.append(s3)
    ratios = [math.exp(d) for d in deltas]
    return {"mean_abs_delta": sum(abs(d) for d in deltas) / len(deltas),
            "max_abs_delta": max(abs(d) for d in deltas), "ratio_mean": sum(ratios) / len(ratios),
            "ratio_max": max(ratios), "ratio_outside": sum(1 for r in ratios if r < 0.8 or r > 1.25) / len(ratios),
            "seq_kl_k1": sum(k1) / len(k1), "seq_kl_k3": sum(k3) / len(k3), "support_mismatch": bad,
            "tokens": len(deltas)}


def test_rl_statistics_match_a_naive_computation() -> None:
    rng = np.random.default_rng(7)
    rollout = [rng.uniform(-6, -0.01, n) for n in (5, 17, 40)]
    trainer = [r + rng.normal(0, 0.15, r.shape) for r in rollout]
    trainer[1][3] = -np.inf  # a token the trainer's top-p mask dropped
    got = rl_stats(rollout, trainer)
    want = naive_stats([r.tolist() for r in rollout], [t.tolist() for t in trainer])
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    d = np.concatenate([t[np.isfinite(t)] - r[np.isfinite(t)] for r, t in zip(rollout, trainer, strict=True)])
    assert got["p99_abs_delta"] == pytest.approx(np.quantile(np.abs(d), 0.99))
    assert got["ratio_p99"] == pytest.approx(np.quantile(np.exp(d), 0.99))
    assert got["seq_kl_k3"] >= 0 and got["support_mismatch"] == 1


def test_rl_bars_judge_a_sequence_and_the_pooled_run() -> None:
    comp = RLLogprobs(max_mean_abs=1e-3, max_ratio_outside=0.0, max_seq_kl=1e-3)
    ro = dist_output("c01#s1", 20)
    close = with_chosen(ro, np.asarray(ro.chosen_logprobs) + 1e-6)
    case = Case("c01#s1", (1, 2))
    assert comp.compare(ro, close, case).status == "pass"
    far = with_chosen(ro, np.asarray(ro.chosen_logprobs) - 0.01)
    v = comp.compare(ro, far, case)
    assert v.status == "fail" and "mean_abs_delta" in v.summary
    assert comp.compare(ro, with_chosen(ro, np.where(np.arange(20) == 4, -np.inf, ro.chosen_logprobs)),
                        case).status == "fail"  # a support mismatch
    assert comp.compare(ro, ro.with_tokens([1, 2]), case).status == "error"
    pooled = comp.compare_run([ro, ro], [close, far], [case, case])
    assert pooled.case_id == RUN and pooled.status == "fail" and pooled.evidence["sequences"] == 2
    controls = run_controls(comp, unit("rl_logprobs").controls, [case], {case.id: ro})
    assert all(c.ok for c in controls) and any(c.expect == "fail" for c in controls)


def test_rl_bars_are_suite_parameters_with_typo_hints() -> None:
    assert build("rl_logprobs", {"max_mean_abs": 0.5}).max_mean_abs == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="Did you mean 'max_mean_abs'"):
        build("rl_logprobs", {"max_mean_ab": 0.5})


def test_the_trainer_computes_vllms_processed_logprobs() -> None:
    """The trainer's temperature + top-k/top-p rule against vLLM's own function (the pinned release's
    CPU path), bit for bit on the same machine."""
    pytest.importorskip("vllm")
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((12, 512)) * 3).astype(np.float32)
    for top_p, top_k in ((0.9, 0), (0.5, 0), (1.0, 20), (0.8, 40)):
        x = torch.from_numpy(logits.copy()).div_(torch.tensor([0.8], dtype=torch.float32).unsqueeze(1))
        p = torch.full((12,), top_p, dtype=torch.float32) if top_p < 1 else None
        k = torch.full((12,), top_k, dtype=torch.int32) if top_k else None
        want = apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True).log_softmax(-1, dtype=torch.float32)
        got = mode_logprobs(logits, "processed_logprobs", 0.8, top_p, top_k)
        assert np.array_equal(got, want.numpy()), (top_p, top_k)  # same machine: bits compare
        assert np.isinf(got).any()  # something was masked
    raw = mode_logprobs(logits, "raw_logprobs", 0.8, 0.9)
    assert np.array_equal(raw, torch.from_numpy(logits).log_softmax(-1).numpy())
    with pytest.raises(ValueError, match="raw_logprobs and processed_logprobs"):
        mode_logprobs(logits, "raw_logits")


# --- the suite's tables ---------------------------------------------------------------------------


def suite_with(tmp_path: Path, edit: Callable[[str], str], name: str = "invariance") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(edit((REPO_ROOT / "suites" / f"{name}.toml").read_text()))
    return p


@pytest.mark.parametrize(("old", "new", "message"), [
    ('variants = ["batch", "prefix_cache", "decode_prefill"]', 'variants = ["batch", "prefix_cach"]',
     r"\[invariance\].variants: unknown variant 'prefix_cach'. Did you mean 'prefix_cache'"),
    ("[invariance]\n", "[invariance]\nbatchh = 1\n", r"\[invariance\].batchh: unknown key 'batchh'. Did you mean 'batch'"),
    ("[invariance]\n", '[invariance.batch]\ngate = "exact"\n[invariance]\n',
     r"\[invariance.batch\].gate: expected one of bit_exact, near_tie, none, got 'exact'"),
    ('logprobs_mode = "raw_logprobs"', 'logprobs_mode = "raw_logits"', r"\[rl\].logprobs_mode: expected one of raw_logprobs, processed_logprobs"),
    ("temperature = 0.8", "temperature = 0", r"\[rl\].temperature: expected a number > 0 \(rollouts sample\), got 0"),
    ('cases = ["c02", "p01"]', 'cases = ["c09"]', r"\[rl\].cases: expected a list of case ids of the suite"),
    ("[compare.bit_exact]\ngate = true\n", "", r"needs \[compare.bit_exact\]"),
])
def test_a_malformed_invariance_suite_names_the_file_and_the_field(tmp_path: Path, old: str, new: str,
                                                                 message: str) -> None:
    p = suite_with(tmp_path, lambda t: t.replace(old, new, 1), "invariance_small")
    with pytest.raises(SuiteError, match=message) as e:
        parse(load_suite(p))
    assert str(p) in str(e.value) or "variant" in str(e.value)


def test_rl_needs_its_bars_and_its_table(tmp_path: Path) -> None:
    p = suite_with(tmp_path, lambda t: t.split("[rl]")[0] + "[[cases]]" + t.split("[[cases]]", 1)[1],
                   "invariance_small")
    with pytest.raises(InvarianceError, match=r"\[compare.rl_logprobs\] needs an \[rl\] table"):
        parse(load_suite(p))


def test_parity_suites_stay_greedy_and_keep_their_sampling_form(tmp_path: Path) -> None:
    s = Sampling(32, 5)
    assert s.to_json() == {"max_tokens": 32, "logprobs": 5, "temperature": 0.0, "seed": 0} and s.greedy
    assert Sampling(32, 5, 0.8, 1, top_p=0.9).to_json()["top_p"] == 0.9
    p = tmp_path / "smoke.toml"
    p.write_text((REPO_ROOT / "suites" / "smoke.toml").read_text().replace("logprobs = 5", "logprobs = 5\ntop_p = 0.9"))
    with pytest.raises(SuiteError, match=r"\[sampling\].top_p: must be 1 \(parity gates are greedy"):
        load_suite(p)
    for name in ("smoke", "kv_roundtrip", "ab_smoke"):  # committed goldens still read their manifests
        assert load_suite(REPO_ROOT / "suites" / f"{name}.toml").sampling.greedy


# --- the plan ------------------------------------------------------------------------------------


def cases_of(suite: str) -> tuple[Case, ...]:
    from harness.models import resolve_model

    ws = Workspace(REPO_ROOT)
    return load_suite(REPO_ROOT / "suites" / f"{suite}.toml").build_cases(resolve_model("tiny-llama", ws).encode)


BASE_SETTINGS = {"dtype": "float32", "block_size": 32, "disable_log_stats": False}


def kv_store(base: Mapping[str, Any], chunk: int) -> dict[str, Any]:
    return store_settings(base, chunk, Path("/tmp/kv"))


def test_the_plan_starts_one_engine_per_configuration() -> None:
    s = parse(load_suite(REPO_ROOT / "suites" / "invariance.toml"))
    plan = make_plan(s, cases_of("invariance"), BASE_SETTINGS, kv_store)
    keys = [g.key for g in plan.groups]
    assert keys == ["base", "chunked_prefill", "spec_decode", "preemption", "kv_connector", "rl", "server",
                    "inverse"]
    base = plan.group(BASE)
    assert base is not None and [p.name for p in base.passes] == [ALONE, TOGETHER, PC_COLD, PC_WARM, PC_DONORS,
                                                                  PC_SHARED]
    assert all(r.skip_reading for p in base.passes if p.name in (ALONE, TOGETHER, PC_COLD) for r in p.requests)
    assert not any(r.skip_reading for p in base.passes if p.name in (PC_WARM, PC_SHARED) for r in p.requests)
    server = plan.group("server")
    assert server is not None and server.levels == (1, 4, 8) and server.settings["no_enable_prefix_caching"]
    assert "disable_log_stats" not in server.settings
    kv = plan.group("kv_connector")
    assert kv is not None and kv.settings["kv_transfer_config"]["kv_role"] == "kv_both"
    assert kv.settings["enable_prefix_caching"] is False
    assert plan.group("rl").settings["logprobs_mode"] == "processed_logprobs"  # type: ignore[union-attr]
    assert plan.shared == {"p02": "p01", "p03": "p01"}


def test_rollouts_in_vllms_default_mode_share_the_reference_engine() -> None:
    s = parse(load_suite(REPO_ROOT / "suites" / "invariance_small.toml"))
    plan = make_plan(s, cases_of("invariance_small"), BASE_SETTINGS, kv_store)
    assert [g.key for g in plan.groups] == [BASE, INVERSE]  # two engine starts
    assert ROLLOUT in [p.name for p in plan.group(BASE).passes]  # type: ignore[union-attr]
    assert sorted(plan.rollouts) == ["c02#s1", "c02#s2", "p01#s1", "p01#s2"]
    only = parse(load_suite(REPO_ROOT / "suites" / "invariance_small.toml"), ["batch"])
    assert [v.name for v in only.variants] == ["batch"] and only.rl is None


def test_shared_prefix_groups_warm_from_their_first_case() -> None:
    cs = [Case("a", (1,), tags=("prefix:x",)), Case("b", (1,)), Case("c", (1,), tags=("prefix:x",)),
          Case("d", (1,), tags=("prefix:x",))]
    assert shared_groups(cs) == {"c": "a", "d": "a"}


# --- the child's result lines ----------------------------------------------------------------------


def line(key: str, toks: Sequence[int], **kw: Any) -> dict[str, Any]:
    o = make_output(key, list(toks))
    return {"kind": "case", "pass": TOGETHER, "key": key, "token_ids": list(toks), "text": "",
            "top_ids": o.top_ids.tolist(), "top_logprobs": o.top_logprobs.tolist(),  # type: ignore[union-attr]
            "chosen_logprobs": o.chosen_logprobs.tolist(), "finish_reason": "length", **kw}  # type: ignore[union-attr]


def test_a_result_file_becomes_outputs_counters_or_the_engines_reason() -> None:
    lines = [{"kind": "meta", "version": PIN.version, "timings": {"engine_start_s": 50.0}, "logprobs_mode": "raw_logprobs"},
             line("c01", [5, 6, 7], num_cached_tokens=32),
             {"kind": "counters", "pass": TOGETHER, "vllm:num_preemptions": 3.0}, {"kind": "end"}]
    r = parse_result("preemption", {}, Lines(lines), Exited(0, False), "")
    assert r.ok and r.output(TOGETHER, "c01").token_ids == (5, 6, 7) and r.cached[TOGETHER]["c01"] == 32
    assert r.counters[TOGETHER]["vllm:num_preemptions"] == 3.0
    assert r.output(TOGETHER, "c09").error is not None
    refused = parse_result("spec_decode", {}, Lines([{"kind": "refused", "reason": "ValueError: not supported"}]),
                           Exited(3, False), "")
    assert refused.status == "refused" and "not supported" in refused.reason
    log = "(EngineCore) ERROR ...\nNotImplementedError: Speculative decoding does not support X on CPU\n"
    crashed = parse_result("spec_decode", {}, Lines(), Exited(1, False), log)
    assert crashed.status == "refused" and crashed.reason.startswith("NotImplementedError: Speculative")
    late = parse_result("x", {}, Lines(), Exited(-9, True, 42, 900.0), "")
    assert late.status == "error" and late.reason == "the x engine did not finish within 900 s and was stopped"
    killed = parse_result("x", {}, Lines(lines[:2], cut=True), Exited(-9, False, 42), log)
    assert killed.status == "error" and killed.reason == "the x engine (pid 42) was killed by SIGKILL while it ran its passes"
    assert output_from_line(line("k", [1, 2])).chosen_logprobs is not None


# --- the kind, end to end -----------------------------------------------------------------------------


@pytest.fixture
def inv_ws(tmp_path: Path) -> Workspace:
    ws = make_git_workspace(tmp_path / "ws")
    for name in ("invariance_small", "invariance"):
        shutil.copy(REPO_ROOT / "suites" / f"{name}.toml", ws.suites / f"{name}.toml")
    commit(ws.root, "invariance suites")
    return ws


def synthetic_ran(plan: Plan, *, inverse_shift: bool = True, warm_hits: int = 32,
                  base_status: str = "ok", trainer_noise: float = 1e-7) -> Ran:
    """What the two engines and the trainer of invariance_small would return if every variant held."""
    ref = {c.id: dist_output(c.id, 16, seed=i) for i, c in enumerate(plan.cases)}
    base = plan.group(BASE)
    assert base is not None
    outputs: dict[str, dict[str, Output]] = {}
    cached: dict[str, dict[str, int | None]] = {}
    for p in base.passes:
        outputs[p.name] = {}
        cached[p.name] = {}
        for r in p.requests:
            if p.name == ROLLOUT:
                outputs[p.name][r.key] = dist_output(r.key, 12, seed=100 + len(outputs[p.name]))
            else:
                outputs[p.name][r.key] = ref[r.key]
            cached[p.name][r.key] = warm_hits if p.name in (PC_WARM, PC_SHARED) else 0
    scores = {TOGETHER: {cid: Output(cid, o.token_ids, "", o.top_ids, o.top_logprobs, o.chosen_logprobs, "scored")
                         for cid, o in ref.items()}}
    results = {BASE: GroupResult(BASE, {}, base_status, "ValueError: not supported here" if base_status != "ok"
                                 else "", version=PIN.version, outputs=outputs, cached=cached, scores=scores,
                                 meta={"logprobs_mode": "raw_logprobs"})}
    inv = {cid: (ulp_lower(o, 3) if inverse_shift else o) for cid, o in ref.items()}
    results[INVERSE] = GroupResult(INVERSE, {"dtype": "bfloat16"}, "ok", version=PIN.version,
                                   outputs={TOGETHER: inv}, scores={TOGETHER: inv})
    roll = outputs.get(ROLLOUT, {})
    trainer = TrainerResult("hf", "ok", info={"name": "hf", "engine": "transformers"},
                            scores={k: with_chosen(o, np.asarray(o.chosen_logprobs) + trainer_noise)
                                    for k, o in roll.items()})
    return Ran(results, trainer, {"run_wall_s": 1.0})


def gate(ws: Workspace, ran_of: Callable[[Plan], Ran], **kw: Any):  # noqa: ANN201
    """run_gate with the engines' results given (the plan is the kind's own)."""
    from harness.kinds.base import GateRequest
    from harness.kinds.registered import KINDS
    from harness.models import resolve_model
    from harness.suites import find_suite

    suite = find_suite(ws.suites, kw.pop("suite", "invariance_small"))
    req = GateRequest(resolve_model("tiny-llama", ws), suite, "vllm", options=kw.get("options", {}))
    plan = KINDS.get("invariance").prepare(ws, req).plan
    opts = {**kw.pop("options", {}), "ran": ran_of(plan)}
    return run_gate_by_name(ws, "tiny-llama", suite.name, "vllm", options=opts, **kw)


def test_an_invariance_gate_writes_one_record_of_kind_invariance(inv_ws: Workspace) -> None:
    res = gate(inv_ws, synthetic_ran)
    rec = load_record(res.path)
    assert rec.kind == "invariance" and rec.outcome == "pass", rec.summary
    assert set(rec.gates) >= {"inv_batch.bit_exact", "inv_batch.near_tie", "rl_logprobs"}
    inv = rec.extra["invariance"]
    assert inv["engine_starts"] == 3 and inv["vllm_engine_starts"] == 2  # base, inverse, trainer
    assert inv["variants"]["batch"]["result"] == "bit_exact"
    assert inv["variants"]["batch"]["inverse"]["differences_appeared"] is True
    assert {v.case_id for v in rec.verdicts if v.comparator == "inv_prefix_cache.bit_exact"} == {
        "c01", "c02", "p01", "p02", "p02+shared"}
    assert "not_evidence" not in inv["variants"]["prefix_cache"]
    assert rec.extra["rl"]["returned_logprobs_mode"] == "raw_logprobs" and "raw_logprobs" in rec.extra["rl"]["mode"]
    assert any(v.case_id == RUN for v in rec.verdicts if v.comparator == "rl_logprobs")
    assert "engine starts" in rec.summary and rec.candidate.name == "vllm"
    assert staleness(rec, Current.of(inv_ws)) == []


def test_a_planted_one_position_fault_fails_the_gated_bit_exact_tier(inv_ws: Workspace) -> None:
    def perturb(outs: Sequence[Output]) -> list[Output]:
        return [ulp_lower(o, 5) if o.case_id == "c02" and o.chosen_logprobs is not None
                and len(o.token_ids) > 5 else o for o in outs]

    rec = gate(inv_ws, synthetic_ran, transform=perturb, write=False).record
    assert rec.outcome == "fail"
    failed = {(v.comparator, v.case_id) for v in rec.verdicts if v.status == "fail"}
    assert ("inv_batch.bit_exact", "c02") in failed and ("inv_batch.near_tie", "c02") not in failed
    assert rec.extra["invariance"]["variants"]["batch"]["result"] == "near_tie"
    assert rec.extra["invariance"]["variants"]["batch"]["first_difference"]["logprob"] == 5


def test_an_inverse_run_without_differences_makes_a_gated_bit_exact_claim_vacuous(inv_ws: Workspace) -> None:
    rec = gate(inv_ws, lambda p: synthetic_ran(p, inverse_shift=False), write=False).record
    assert rec.outcome == "vacuous"
    assert any("no demonstrated sensitivity" in r for r in rec.extra["vacuous"])
    note = rec.extra["invariance"]["variants"]["batch"]["inverse"]["note"]
    assert note == "no differences appeared: the bit-exact claim has no demonstrated sensitivity"


def test_a_prompt_the_warm_pass_did_not_hit_is_listed_not_judged(inv_ws: Workspace) -> None:
    def ran(plan: Plan) -> Ran:
        r = synthetic_ran(plan)
        base = r.results[BASE]
        cached = {p: dict(c) for p, c in base.cached.items()}
        cached[PC_WARM]["c01"] = 0  # "Hello": shorter than one cached block
        return Ran({**r.results, BASE: replace(base, cached=cached)}, r.trainer, r.timings)

    rec = gate(inv_ws, ran, write=False).record
    pc = {v.case_id for v in rec.verdicts if v.comparator == "inv_prefix_cache.bit_exact"}
    assert "c01" not in pc and "c02" in pc
    listed = rec.extra["invariance"]["variants"]["prefix_cache"]["not_evidence"]
    assert listed["c01"]["bit_exact"] == "pass" and "hit no cached token" in listed["c01"]["why"]
    assert judge_record(rec, ["inv_prefix_cache.bit_exact", "inv_prefix_cache.near_tie"])[0] == "pass"


def test_a_warm_pass_that_hit_nothing_is_not_evidence(inv_ws: Workspace) -> None:
    rec = gate(inv_ws, lambda p: synthetic_ran(p, warm_hits=0), write=False).record
    pc = [v for v in rec.verdicts if v.comparator.startswith("inv_prefix_cache.")]
    assert pc and all(v.status == "skip" for v in pc)
    assert rec.extra["invariance"]["variants"]["prefix_cache"]["result"] == "not evidence"
    assert rec.outcome == "pass"  # the other variants still ran and passed


def test_a_refused_reference_engine_is_refused_with_the_engines_reason(inv_ws: Workspace) -> None:
    rec = gate(inv_ws, lambda p: synthetic_ran(p, base_status="refused"), write=False).record
    assert rec.outcome == "refused"
    batch = [v for v in rec.verdicts if v.comparator == "inv_batch.bit_exact"]
    assert all(v.status == "refused" and "not supported here" in v.summary for v in batch)
    assert judge_record(rec, ["inv_batch.bit_exact", "inv_batch.near_tie"]) == (
        "refused", "ValueError: not supported here")


def test_a_refused_variant_does_not_fail_the_others(inv_ws: Workspace) -> None:
    """The full suite, with the speculative-decoding engine refusing and every other one fine."""
    def ran(plan: Plan) -> Ran:
        small = synthetic_ran(plan)
        results = dict(small.results)
        base = results[BASE]
        for key in ("chunked_prefill", "preemption"):
            results[key] = GroupResult(key, {}, "ok", version=PIN.version, outputs={TOGETHER: base.outputs[TOGETHER]},
                                       counters={TOGETHER: {"vllm:num_preemptions": 4.0}})
        results["spec_decode"] = GroupResult("spec_decode", {}, "refused",
                                             "NotImplementedError: ngram is not supported on this platform")
        return Ran(results, small.trainer, small.timings)

    rec = gate(inv_ws, ran, suite="invariance", options={"variants": ["batch", "chunked_prefill", "spec_decode",
                                                                    "preemption"]}, write=False).record
    assert rec.outcome == "pass", rec.summary
    assert "inv_spec_decode.near_tie" not in rec.gates
    assert "spec_decode REFUSED (NotImplementedError: ngram is not supported" in rec.summary
    assert judge_record(rec, ["inv_spec_decode.bit_exact", "inv_spec_decode.near_tie"])[0] == "refused"
    assert judge_record(rec, ["inv_batch.bit_exact", "inv_batch.near_tie"])[0] == "pass"
    assert rec.extra["invariance"]["variants"]["preemption"]["evidence"]["num_preemptions"] == 4.0


def test_features_rows_can_prove_an_invariance_variant(inv_ws: Workspace) -> None:
    catalog = """
title = "Features"
[[columns]]
key = "vllm"
title = "vLLM"
candidate = "vllm"
[[sections]]
title = "Invariances"
[[sections.rows]]
id = "inv-batch"
title = "batch"
model = "tiny-llama"
suite = "invariance_small"
prove = ["inv_batch.bit_exact", "inv_batch.near_tie"]
"""
    (inv_ws.root / "features.toml").write_text(catalog)
    cat = load_catalog(inv_ws.root / "features.toml", inv_ws)
    assert cat.row("inv-batch").prove == ("inv_batch.bit_exact", "inv_batch.near_tie")
    (inv_ws.root / "features.toml").write_text(catalog.replace("inv_batch.near_tie", "inv_bach.near_tie"))
    with pytest.raises(ValueError, match="has no comparator 'inv_bach.near_tie'"):
        load_catalog(inv_ws.root / "features.toml", inv_ws)
    raw = {"kind": "invariance", "compare": {"bit_exact": {}, "near_tie": {}, "rl_logprobs": {}},
           "invariance": {"variants": ["batch"]}}
    assert verdict_names(raw) == ["inv_batch.bit_exact", "inv_batch.near_tie", "rl_logprobs"]
    assert verdict_name("kv_connector", "near_tie") == "inv_kv_connector.near_tie"


def test_the_records_reference_is_the_pinned_release(inv_ws: Workspace) -> None:
    rec = gate(inv_ws, synthetic_ran, write=False).record
    assert not any("pin" in w for w in staleness(rec, Current.of(inv_ws)))
    old = replace(rec, candidate=replace(rec.candidate, version=EARLIER))
    assert f"ran vLLM {EARLIER}, the pin is now {PIN.spec}" in staleness(old, Current.of(inv_ws))
    assert json.loads(json.dumps(rec.to_json()))["kind"] == "invariance"
    assert vacuous_reasons(rec.controls, rec.gates) == []


def test_no_machine_path_reaches_the_record(inv_ws: Workspace) -> None:
    rec = gate(inv_ws, synthetic_ran, write=False).record
    text = json.dumps(rec.to_json())
    assert str(inv_ws.root) not in text and "/tmp/" not in text


def test_only_the_pinned_vllm_is_driven(inv_ws: Workspace) -> None:
    with pytest.raises(SuiteError, match="drives the pinned vLLM"):
        run_gate_by_name(inv_ws, "tiny-llama", "invariance_small", "hf", options={"ran": None}, write=False)


def test_an_invariance_record_prints_one_line_per_variant(inv_ws: Workspace) -> None:
    from rich.console import Console

    from harness.report import print_record

    rec = gate(inv_ws, synthetic_ran, write=False).record
    con = Console(record=True, width=220)
    print_record(rec, "", con)
    text = con.export_text()
    for name in ("batch", "prefix_cache", "decode_prefill", "rl"):
        assert f"│ {name} " in text, name
    assert "controls answered as planted (all)" in text and "dtype=bfloat16: bit-exact failed" in text
    assert "rollout logprobs: raw_logprobs" in text and f"reference vllm (vllm {PIN.version})" in text


def test_a_variant_engine_too_short_for_a_case_is_bad_input(inv_ws: Workspace) -> None:
    p = inv_ws.suites / "invariance.toml"
    p.write_text(p.read_text().replace("max_model_len = 224", "max_model_len = 96"))
    with pytest.raises(SuiteError, match=r"\[invariance.preemption\]: engine max_model_len 96 is shorter than "
                                         r"case 'c03'"):
        run_gate_by_name(inv_ws, "tiny-llama", "invariance", "vllm", options={"ran": None}, write=False)


def test_a_start_that_meets_a_busy_machine_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.kinds.invariance import run as run_mod
    from harness.kinds.invariance.plan import Group, Pass

    busy = ("ValueError: Available memory on node 0 (6.6/23.54 GiB) on startup is less than desired CPU "
            "memory utilization (0.3, 7.06 GiB).")
    answers = [GroupResult("base", {}, "error", busy), GroupResult("base", {}, "ok", version=PIN.version)]
    monkeypatch.setattr(run_mod, "run_vllm_group", lambda *a, **k: answers.pop(0))
    monkeypatch.setattr(run_mod, "BUSY_WAIT_S", 0.0)
    plan = Plan((), (Group(BASE, {}, (Pass(TOGETHER, ()),)),))
    got = run_mod.run_plan(plan, None, Sampling(4), Path("/nonexistent"), 10.0)  # type: ignore[arg-type]
    assert got[BASE].ok and got[BASE].timings["attempts"] == 2.0 and not answers
    refused = [GroupResult("base", {}, "refused", "NotImplementedError: not supported")]
    monkeypatch.setattr(run_mod, "run_vllm_group", lambda *a, **k: refused.pop(0))
    got = run_mod.run_plan(plan, None, Sampling(4), Path("/nonexistent"), 10.0)  # type: ignore[arg-type]
    assert got[BASE].status == "refused" and got[BASE].timings["attempts"] == 1.0  # a refusal is final
