"""``parity``: goldens (recorded by the pinned oracle if missing) -> candidate -> verdicts.

The everyday gate. The candidate replays the goldens' token ids; strict / near-tie judge what it
generated; KL / drift / NMSE judge its teacher-forced scores of the oracle's sequences (or its own
outputs until their first divergence, for an engine that cannot score).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.api import Case, EngineFailed, EngineRefused, Output, RunFacts, Status, Verdict, failure_verdicts
from harness.capabilities import Capabilities
from harness.compare.judgeable import capability_extra, comparator_for, impossible, impossible_verdict, needs
from harness.engines import RunnerContext, make_runner
from harness.goldens import Golden
from harness.kinds.base import GateRequest, Judgement, register_kind
from harness.kinds.controls import suite_controls
from harness.kinds.distribution import Distribution, judge_run, wants_scores
from harness.kinds.parity.checks import candidate_checks, check_controls, check_gates, checks_summary
from harness.oracle import load_or_record, measure_speed
from harness.speed import OracleSpeed, Speed, speed_extra
from harness.staleness import oracle_reasons
from harness.suites import Suite
from harness.teacher import run_and_score
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class Prepared:
    golden: Golden
    timings: Mapping[str, float]


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    info: Any
    """The candidate's EngineInfo."""
    facts: RunFacts | None
    """None when the engine refused or failed."""
    outputs: Mapping[str, Output] = field(default_factory=dict)
    scores: Mapping[str, Output] | None = None
    how: str = ""
    failure: tuple[Status, str, str] | None = None
    """(``refused``|``error``, reason, engine log tail)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    speed: Mapping[str, Any] = field(default_factory=dict)


def judge(golden: Golden, outputs: Mapping[str, Output], suite: Suite,
          decode: Callable[[Sequence[int]], str] | None,
          capabilities: Capabilities | None = None,
          scores: Mapping[str, Output] | None = None) -> list[Verdict]:
    """Every configured comparator over every case.

    ``capabilities`` (what the candidate could return): a comparator it makes impossible answers
    ``skip`` with the reason; ``strict`` judges text when there are no token ids.
    ``scores``: the candidate's teacher-forced scores, judged by the distribution comparators.
    """
    verdicts = []
    for spec in suite.comparators:
        comp = comparator_for(spec.name, spec.params, decode, capabilities)
        if isinstance(comp, str):
            verdicts += [impossible_verdict(case, spec.name, comp) for case in golden.cases]
            continue
        source = scores if scores is not None and comp.needs_scores else outputs
        for case in golden.cases:
            cand = source.get(case.id) or Output(case.id, (), error="candidate returned no output")
            verdicts.append(comp.compare(golden.outputs[case.id], cand, case))
    return verdicts


def summarize(suite: Suite, verdicts: Sequence[Verdict], cases: Sequence[Case]) -> str:
    """e.g. ``smoke: 5/8 strict, 3/8 near-tie, 0 fail — 92/128 tokens strictly exact, max gap 0.25 nats``."""
    n = len(cases)
    by = {(v.comparator, v.case_id): v for v in verdicts}
    statuses = Counter(v.status for v in verdicts)
    if statuses["refused"] or statuses["error"]:
        first = next(v for v in verdicts if v.status in ("refused", "error"))
        return f"{suite.name}: {statuses['refused']} refused, {statuses['error']} error — {first.summary}"
    strict = [by.get(("strict", c.id)) for c in cases]
    tie = [by.get(("near_tie", c.id)) for c in cases]
    n_strict = sum(1 for v in strict if v and v.status == "pass")
    n_tie = sum(1 for v in tie if v and v.status == "pass" and v.evidence.get("kind") == "tie")
    gated = {s.name for s in suite.comparators if s.gate}
    fails = sum(1 for c in cases if any(
        v.status == "fail" for (name, cid), v in by.items() if cid == c.id and name in gated))
    matched = sum(int(v.evidence.get("matched", 0)) for v in strict if v)
    total = sum(int(v.evidence.get("tokens", 0)) for v in strict if v)
    gaps = [float(v.evidence["gap_mnats"]) / 1000 for v in tie if v and "gap_mnats" in v.evidence]
    parts = [f"{n_strict}/{n} strict"]
    if any(tie):
        parts.append(f"{n_tie}/{n} near-tie")
    text = f"{suite.name}: {', '.join(parts)}, {fails} fail"
    if total:
        text += f" — {matched}/{total} tokens strictly exact"
    if gaps:
        text += f", max gap {max(gaps):.2f} nats"
    return text


def oracle_speed(ws: Workspace, req: GateRequest, golden: Golden) -> Speed | str | OracleSpeed | None:
    """What :func:`harness.speed.speed_extra` needs for the request's ``speed`` setting."""
    if req.speed is True:
        return lambda c: measure_speed(req.model, golden.cases, golden.sampling, c, ws.runs)
    if req.speed is False:
        return None
    return req.speed  # type: ignore[return-value]


class Parity:
    name = "parity"
    default_candidate = "hf"
    stale = staticmethod(oracle_reasons)
    """Records judged against goldens: the pin, the suite version, the golden checksums, the model
    digest."""
    tables: tuple[str, ...] = ("localize",)
    """``[localize]``: the diagnosis of this suite's failures (``nmse_bar``, ``nmse_floor``, ``auto``;
    :mod:`harness.kinds.localize.kind`)."""

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        t0 = time.perf_counter()
        golden, recorded = load_or_record(ws, req.model, req.suite, auto_record=req.auto_record)
        timings = {"goldens_s": time.perf_counter() - t0}
        if recorded:
            timings["oracle_record_s"] = golden.manifest["timings"]["record_wall_s"]
        return Prepared(golden, timings)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Ran:
        golden = prepared.golden
        ws.runs.mkdir(parents=True, exist_ok=True)
        runner = req.runner or make_runner(req.candidate, req.model,
                                           RunnerContext(run_dir=ws.runs, concurrency=req.concurrency))
        comps = [c for s in req.suite.comparators
                 if not isinstance(c := comparator_for(s.name, s.params, req.model.decode, None), str)]
        t0 = time.perf_counter()
        try:
            runner.start()
            how, scores = "", None
            if wants_scores(comps):  # the candidate also scores the oracle's sequences
                scored = run_and_score(runner, golden.cases, golden.sampling, golden.outputs)
                produced, how = scored.outputs, scored.how
                scores = {o.case_id: o for o in scored.scores}
            else:
                produced = runner.run(golden.cases, golden.sampling)
            if req.transform is not None:
                produced = req.transform(produced)
            outputs = {o.case_id: o for o in produced}
            if how == "until-first-divergence":
                scores = outputs  # the engine cannot score: its own (transformed) outputs stand in
            facts: RunFacts | None = runner.facts()
            failure = None
        except (EngineRefused, EngineFailed) as e:
            outputs, scores, how, facts = {}, None, "", None
            status: Status = "refused" if isinstance(e, EngineRefused) else "error"
            failure = (status, str(e), e.log_tail if isinstance(e, EngineFailed) else "")
        finally:
            runner.close()
        timings = {"candidate_wall_s": time.perf_counter() - t0}
        speed = speed_extra(facts, len(golden.cases), req.concurrency, oracle_speed(ws, req, golden))
        return Ran(runner.info(), facts, outputs, scores, how, failure, timings, speed)

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Ran) -> Judgement:
        golden, suite, model = prepared.golden, req.suite, req.model
        caps = ran.facts.capabilities if ran.facts is not None else None
        extra: dict[str, Any] = {}
        dist: Distribution | None = None
        t0 = time.perf_counter()
        if ran.failure is not None:
            status, reason, tail = ran.failure
            verdicts = failure_verdicts([s.name for s in suite.comparators], [c.id for c in golden.cases],
                                        status, reason, tail)
            extra["engine_" + status] = reason
        else:
            # the candidate's self-checks (tokenizer parity, greedy self-consistency) come first
            verdicts = (candidate_checks(golden.cases, ran.outputs, caps, model.decode)
                        + judge(golden, ran.outputs, suite, model.decode, caps, ran.scores))
            if ran.scores is not None:
                comps = [c for s in suite.comparators
                         if not isinstance(c := comparator_for(s.name, s.params, model.decode, caps), str)]
                dist = judge_run(comps, golden.cases, golden.outputs, ran.scores, ran.how)
                verdicts += list(dist.verdicts) if dist else []
        timings = {**prepared.timings, **ran.timings, "compare_s": time.perf_counter() - t0}
        if ran.facts is not None:
            timings.update({f"candidate_{k}": float(v) for k, v in ran.facts.timings.items()})
        extra.update(capability_extra(caps, (s.name for s in suite.comparators)))
        extra.update(ran.speed)
        # The vacuous-gate guard: planted mutations against these goldens must fail (see controls.py).
        controls = suite_controls(suite, golden, model.decode, caps)
        controls += check_controls(verdicts, golden.cases, golden.outputs, caps, model.decode)
        summary = summarize(suite, verdicts, golden.cases) + checks_summary(verdicts)
        if dist is not None:
            summary = f"{summary} — {dist.summary()}"
        info = ran.info
        if ran.facts is not None and ran.facts.device.get("class"):
            info = replace(info, environment={**info.environment, "device_class": ran.facts.device["class"]})
        gates = suite_gates(suite, caps, extra)
        if "gates_instead" in extra:
            summary += f" — gated by {', '.join(gates)} ({extra['gates_instead']})"
        if caps is not None and gates and all(g in impossible(caps, gates) for g in gates):
            # nothing the suite gates on can be judged: the self-checks alone cannot pass the run
            summary += " — no gate can judge this candidate"
        else:
            gates += check_gates(verdicts)
        return Judgement(
            label=req.candidate, candidate=info, verdicts=tuple(verdicts),
            gates=gates,
            controls=tuple(controls),
            summary=summary, timings=timings, extra=extra, golden=golden, distribution=dist,
            figure_title=f"{model.name} / {suite.name}: {req.candidate} vs oracle")


def suite_gates(suite: Suite, caps: Capabilities | None, extra: dict[str, Any]) -> tuple[str, ...]:
    """The suite's gates; when every one of them is impossible on this candidate only for want of
    token ids (near-tie on a server that returns text only) and ``strict`` can judge it on text,
    ``strict`` gates instead — the one judgement of the model's output left — and
    ``extra["gates_instead"]`` says why. Otherwise (a gate that needs logprobs) the
    impossible gates stay and judge nothing, and the self-checks do not gate: the run is a skip."""
    named = tuple(s.name for s in suite.comparators if s.gate)
    if caps is None or not named:
        return named
    lost = impossible(caps, [s.name for s in suite.comparators])
    missing = caps.missing()
    only_ids = all(g in lost and [m for m in sorted(needs(g)) if m in missing] == ["token_ids"]
                   for g in named)  # strict on text stands in for what needs ids, not logprobs
    if only_ids and any(s.name == "strict" for s in suite.comparators) and "strict" not in lost:
        extra["gates_instead"] = "; ".join(f"{g} is impossible: {lost[g]}" for g in named)
        return ("strict",)
    return named


register_kind(Parity(), help="goldens -> candidate -> strict / near-tie / KL / drift / NMSE")
