"""The A/B configuration gate: one engine, two configurations, the same workload.

A is the reference configuration (``vllm``, ``hf``), B the configuration under test
(``vllm:dtype=bfloat16``, ``vllm:kv_cache_dtype=fp8``, ``hf:kv=quanto-int4``). No goldens: both
arms run now, A first, then B, each in one engine start.

* A generates greedily and scores its own sequences (the control: how far the scoring path is from
  the generating path, the floor under every KL below).
* B generates greedily (strict / near-tie agreement with A, throughput) and scores A's sequences
  (teacher forcing: KL, drift and NMSE at every position, judged by the suite's bars).
* B's own generation is also compared with A's until their first divergence, on the decode path of
  both (vLLM scores through one prefill, where a KV-cache change can hide inside the chunk).
* Throughput B/A (output tokens per second of generation) and KV capacity B/A read from the engine
  (vLLM: blocks x block size; transformers: bytes its cache tensors hold per cached token).

A B configuration the engine refuses (vLLM's fp8 KV cache on a CPU without AVX-512) gives a
``refused`` record with the engine's reason, not a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.abilities import Scorer, TensorSource
from harness.api import (
    Case,
    EngineFailed,
    EngineInfo,
    EngineRefused,
    Output,
    Sampling,
    Verdict,
    failure_verdicts,
)
from harness.compare import build
from harness.compare.explain import engine_error
from harness.compare.kl import KL
from harness.compare.nmse import tensor_verdict
from harness.engines import RunnerContext, make_runner, parse_options, split_spec
from harness.kinds.ab.stats import AccuracyTest, StatsError
from harness.kinds.base import GateRequest, Judgement, engine_info, register_kind
from harness.kinds.controls import suite_controls
from harness.kinds.distribution import Distribution, judge_run, measure_arm
from harness.models import ModelRef
from harness.staleness import reference_reasons
from harness.suites import Suite, SuiteError
from harness.tomlcheck import Where, check_keys, need_int, need_number, need_table
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True, eq=False)
class Arm:
    """What one configuration produced."""

    spec: str
    info: EngineInfo
    outputs: dict[str, Output] = field(default_factory=dict)
    scores: dict[str, Output] = field(default_factory=dict)
    """A: its own sequences rescored (control). B: A's sequences scored (teacher forcing)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    capacity: Mapping[str, Any] = field(default_factory=dict)
    refused: str | None = None
    error: str | None = None
    log_tail: str = ""
    tensors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """case -> logits / ``hidden.<layer>`` on the scored sequences, when the engine exposes them."""

    @property
    def ran(self) -> bool:
        return self.refused is None and self.error is None

    @property
    def tokens_per_s(self) -> float | None:
        n, s = self.timings.get("output_tokens"), self.timings.get("generate_s")
        return float(n) / float(s) if n and s else None


@dataclass(frozen=True, slots=True)
class ArmGolden:
    """An arm's outputs in the shape the vacuous-gate guard reads goldens in."""

    cases: tuple[Case, ...]
    outputs: Mapping[str, Output]


def capacity_ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """KV capacity of B over A: more tokens, or fewer bytes per token, is more capacity."""
    if a.get("tokens") and b.get("tokens"):
        return float(b["tokens"]) / float(a["tokens"])
    if a.get("bytes_per_token") and b.get("bytes_per_token"):
        return float(a["bytes_per_token"]) / float(b["bytes_per_token"])
    return None


def run_arm(spec: str, model: ModelRef, cases: Sequence[Case], sampling: Sampling, k: int,
            continuations: Mapping[str, Sequence[int]] | None, run_dir: Path) -> Arm:
    """Generate and score with one configuration; a refusal or crash is kept, not raised."""
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = make_runner(spec, model, RunnerContext(run_dir=run_dir))
    try:
        runner.start()
        if isinstance(runner, Scorer):
            outs, scores = runner.run_and_score(cases, sampling, continuations, k)
        else:  # cannot score: its own outputs stand in, judged until the first divergence
            outs = runner.run(cases, sampling)
            scores = outs
        tensors = {}
        if isinstance(runner, TensorSource) and runner.tensor_ability().continuation:  # transformers
            seqs = continuations if continuations is not None else {
                o.case_id: o.token_ids for o in outs if o.error is None}
            tensors = runner.capture_tensors(cases, seqs)
        facts = runner.facts()
        return Arm(spec, runner.info(), {o.case_id: o for o in outs}, {s.case_id: s for s in scores},
                   dict(facts.timings), dict(facts.kv_capacity), tensors=tensors)
    except EngineRefused as e:
        return Arm(spec, engine_info(runner, spec), refused=str(e))
    except EngineFailed as e:
        return Arm(spec, engine_info(runner, spec), error=str(e), log_tail=e.log_tail)
    finally:
        runner.close()



def agreement(a: Arm, b: Arm, cases: Sequence[Case], tie_params: Mapping[str, Any],
              decode: Callable[[Sequence[int]], str] | None) -> tuple[list[Verdict], dict[str, Any]]:
    """strict and near-tie (configured by ``tie_params``) of B's own generation against A's, per
    case, and the counts."""
    strict, tie = build("strict", {}, decode), build("near_tie", tie_params, decode)
    out = []
    for case in cases:
        o = a.outputs.get(case.id) or Output(case.id, (), error="arm A returned no output")
        c = b.outputs.get(case.id) or Output(case.id, (), error="arm B returned no output")
        out += [strict.compare(o, c, case), tie.compare(o, c, case)]
    s = [v for v in out if v.comparator == "strict"]
    t = [v for v in out if v.comparator == "near_tie"]
    matched = sum(int(v.evidence.get("matched", 0)) for v in s)
    total = sum(int(v.evidence.get("tokens", 0)) for v in s)
    return out, {"cases": len(cases), "strict": sum(v.status == "pass" for v in s),
                 "near_tie": sum(v.status == "pass" for v in t), "tokens_matched": matched,
                 "tokens": total, "near_tie_threshold_nats": tie.threshold_nats}  # type: ignore[attr-defined]


def _accuracy_plan(suite: Suite) -> dict[str, Any] | None:
    """The suite's ``[accuracy]`` table (sigma, n, alpha, beta) as the test it plans."""
    if "accuracy" not in suite.extra:
        return None
    top = Where(suite.path, error=SuiteError)
    table, where = need_table(suite.extra, "accuracy", top), top / "accuracy"
    check_keys(table, where, ("sigma", "n", "alpha", "beta"))
    try:
        t = AccuracyTest(need_number(table, "sigma", where, lo=0), need_int(table, "n", where, lo=1),
                         need_number(table, "alpha", where, 0.05), need_number(table, "beta", where, 0.2))
    except StatsError as e:
        raise where.fail(str(e)) from None
    return {**t.to_json(), "note": "planning numbers: B passes when B >= A - threshold; drops smaller "
                                   "than the MDE can slip through. No task set is scored here."}


def _refusal_verdicts(suite: Suite, cases: Sequence[Case], arm: Arm, role: str) -> list[Verdict]:
    return failure_verdicts(["strict", "near_tie", *(s.name for s in suite.comparators)],
                            [c.id for c in cases], "refused" if arm.refused else "error",
                            arm.refused or arm.error or "", arm.log_tail, f"arm {role} ({arm.spec})",
                            {"arm": role})


def same_decode_path(a_spec: str, b_spec: str) -> str:
    """A's spec, made to decode like B when both are transformers and B steps one token at a time
    (a quantized KV cache): otherwise the throughput ratio would compare two code paths."""
    (na, oa), (nb, ob) = split_spec(a_spec), split_spec(b_spec)
    if na != "hf" or nb != "hf":
        return a_spec
    a_opts, b_opts = parse_options(oa, a_spec), parse_options(ob, b_spec)
    b_steps = b_opts.get("decode", "generate" if b_opts.get("kv", "plain") == "plain" else "step") == "step"
    if b_steps and "decode" not in a_opts and a_opts.get("kv", "plain") == "plain":
        return f"{a_spec}{',' if oa else ':'}decode=step"
    return a_spec


def run_arms(ws: Workspace, model: ModelRef, suite: Suite, a_spec: str, b_spec: str,
             a: Arm | None = None) -> tuple[Arm, Arm, dict[str, float]]:
    """Run arm A (unless given: one A serves several Bs), then arm B on A's sequences."""
    a_spec = same_decode_path(a_spec, b_spec)
    cases = suite.build_cases(model.encode)
    k = suite.sampling.logprobs
    ws.runs.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    if a is None:
        t0 = time.perf_counter()
        a = run_arm(a_spec, model, cases, suite.sampling, k, None, ws.runs)
        timings["a_wall_s"] = time.perf_counter() - t0
    if not a.ran:
        return a, Arm(b_spec, EngineInfo(b_spec, split_spec(b_spec)[0], "not run"),
                      error="not run: arm A could not run"), timings
    t0 = time.perf_counter()
    conts = {cid: o.token_ids for cid, o in a.outputs.items() if o.error is None}
    b = run_arm(b_spec, model, cases, suite.sampling, k, conts, ws.runs)
    timings["b_wall_s"] = time.perf_counter() - t0
    return a, b, timings


@dataclass(frozen=True, slots=True)
class Prepared:
    cases: tuple[Case, ...]
    a_spec: str
    b_spec: str
    plan: Mapping[str, Any] | None


class AB:
    """``ab``: no goldens; arm A (``reference``) and arm B (``candidate``) run now, A first."""

    name = "ab"
    default_candidate = "vllm"
    stale = staticmethod(reference_reasons)
    """Records no goldens: the suite version, the model digest, and an arm of the pinned vLLM ran the pin."""
    tables = ("accuracy",)

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        if not req.reference:
            raise SuiteError(f"{req.suite.path}: an A/B suite needs a reference configuration "
                             f"(harness ab --a SPEC --b SPEC, make ab A=... B=...)")
        cases = req.suite.build_cases(req.model.encode, req.model.limits)
        return Prepared(cases, same_decode_path(req.reference, req.candidate), req.candidate,
                        _accuracy_plan(req.suite))

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> tuple[Arm, Arm, dict[str, float]]:
        arms = req.options.get("arms")
        if arms is not None:  # arms that already ran (one A serves several Bs; tests)
            return arms[0], arms[1], {}
        return run_arms(ws, req.model, req.suite, prepared.a_spec, prepared.b_spec)

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared,
              ran: tuple[Arm, Arm, dict[str, float]]) -> Judgement:
        a, b, timings = ran
        suite, model, cases = req.suite, req.model, prepared.cases
        a_spec, b_spec = a.spec, b.spec
        timings = dict(timings)
        for role, arm in (("a", a), ("b", b)):
            timings.update({f"{role}_{key}": float(v) for key, v in arm.timings.items()})
        gates = tuple(s.name for s in suite.comparators if s.gate)
        facts: dict[str, Any] = {
            role: {"spec": arm.spec, "capacity": dict(arm.capacity), "tokens_per_s": arm.tokens_per_s}
            for role, arm in (("a", a), ("b", b))}
        if prepared.plan is not None:
            facts["accuracy"] = prepared.plan
        dist: Distribution | None = None
        controls: list = []
        if not a.ran or not b.ran:
            bad, role = (a, "A") if not a.ran else (b, "B")
            verdicts = _refusal_verdicts(suite, cases, bad, role)
            facts["refused" if bad.refused else "error"] = {"arm": role, "spec": bad.spec,
                                                            "reason": bad.refused or bad.error}
            summary = f"{suite.name}: B ({b_spec}) vs A ({a_spec}): {verdicts[0].summary}"
        else:
            if req.transform is not None:
                b = replace(b, scores={o.case_id: o for o in req.transform(list(b.scores.values()))})
            agree, facts["agreement"] = agreement(a, b, cases, suite.params("near_tie"), model.decode)
            comps = [build(s.name, s.params, model.decode) for s in suite.comparators]
            verdicts = [v for v in agree if v.comparator in {s.name for s in suite.comparators}]
            for comp in comps:
                if comp.needs_scores:
                    for case in cases:
                        o = a.outputs[case.id]
                        c = b.scores.get(case.id) or Output(case.id, (), error="arm B returned no score")
                        verdicts.append(engine_error(comp.key, o, c, case) or comp.compare(o, c, case))
            how = "teacher-forced" if all(s.token_ids == a.outputs[cid].token_ids
                                          for cid, s in b.scores.items() if cid in a.outputs) \
                else "until-first-divergence"
            dist = judge_run(comps, cases, a.outputs, b.scores, how, label="B on A's tokens")
            if dist is None:
                dist = Distribution((), (measure_arm("B on A's tokens", a.outputs, b.scores, cases),), how)
            mode = next((c.mode for c in comps if isinstance(c, KL)), "auto")
            dist = Distribution(dist.verdicts, (
                dist.arms[0],
                measure_arm("B free-running, until first divergence", a.outputs, b.outputs, cases, mode,
                            dist.edges),
                measure_arm("A rescored (control)", a.outputs, a.scores, cases, mode, dist.edges),
            ), how, dist.edges)
            verdicts += list(dist.verdicts)
            if a.tensors and b.tensors:  # NMSE of logits and every layer's hidden states (reported)
                nmse = build("nmse", suite.params("nmse"))
                verdicts.append(tensor_verdict(a.tensors, b.tensors, nmse.max_nmse))  # type: ignore[attr-defined]
            controls = suite_controls(suite, ArmGolden(tuple(cases), a.outputs), model.decode)
            facts["throughput_ratio_b_over_a"] = (b.tokens_per_s / a.tokens_per_s
                                                  if a.tokens_per_s and b.tokens_per_s else None)
            facts["kv_capacity_ratio_b_over_a"] = capacity_ratio(a.capacity, b.capacity)
            ag = facts["agreement"]
            summary = (f"{suite.name}: B ({b_spec}) vs A ({a_spec}): {ag['strict']}/{ag['cases']} strict, "
                       f"{ag['near_tie']}/{ag['cases']} near-tie — {dist.summary()}"
                       + _ratio_text(facts))
        return Judgement(
            label=f"ab-{b_spec}", candidate=b.info, verdicts=tuple(verdicts), gates=gates,
            controls=tuple(controls), summary=summary, timings=timings, extra={"ab": facts},
            reference={"role": "A (reference configuration)", "spec": a_spec, **a.info.to_json()},
            distribution=dist, figure_title=f"{model.name} / {suite.name}: B {b_spec} vs A {a_spec}")


register_kind(AB(), help="one engine, two configurations: KL, drift, NMSE, agreement, throughput and "
                          "KV capacity B/A")


def _ratio_text(facts: Mapping[str, Any]) -> str:
    parts = []
    if (t := facts.get("throughput_ratio_b_over_a")) is not None:
        parts.append(f"throughput B/A {t:.2f}")
    if (c := facts.get("kv_capacity_ratio_b_over_a")) is not None:
        parts.append(f"KV capacity B/A {c:.2f}")
    return (" — " + ", ".join(parts)) if parts else ""
