"""The gate, end to end: goldens (recorded by the pinned oracle if missing) -> candidate -> verdicts
-> one record. ``harness gate`` and ``make gate`` call :func:`run_gate`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, Runner, Verdict
from harness.capabilities import Capabilities, capability_extra, comparator_for, impossible_verdict
from harness.checks import candidate_checks, check_controls, check_gates, checks_summary
from harness.controls import guard, suite_controls
from harness.distribution import FIGURES, Distribution, judge_run, wants_scores
from harness.engines import RunnerContext, make_runner
from harness.goldens import (
    Golden,
    GoldenError,
    golden_dir,
    read_golden,
    record_command,
    staleness,
    write_golden,
)
from harness.models import ModelRef, resolve_model
from harness.models.arch import model_facts
from harness.pin import OraclePin, oracle_pin
from harness.provenance import git_dirty, git_sha, now_utc, platform_facts
from harness.records import Record, new_record_id, outcome_of, record_path, write_record
from harness.speed import Speed, speed_extra
from harness.suites import Suite, SuiteError, find_suite
from harness.teacher import run_and_score
from harness.workspace import Workspace

Transform = Callable[[Sequence[Output]], list[Output]]


@dataclass(frozen=True, slots=True)
class GateResult:
    record: Record
    path: Path
    golden: Golden


def oracle_available() -> str | None:
    """None when the pinned vLLM is importable here, else why not."""
    import importlib.util

    return None if importlib.util.find_spec("vllm") else "vLLM is not installed in this environment"


def record_goldens(ws: Workspace, model: ModelRef, suite: Suite, pin: OraclePin | None = None) -> Golden:
    """Run the pinned oracle once over the whole suite and write goldens/<model>/<suite>/."""
    from harness.engines.vllm import VLLMRunner

    pin = pin or oracle_pin()
    if (why := oracle_available()) is not None:
        raise GoldenError(f"cannot record goldens for {model.name}/{suite.name}: {why}. "
                          "Install the oracle with `make venv`, then "
                          + record_command(model.name, suite.name))
    cases = suite.build_cases(model.encode)
    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = VLLMRunner(model, {}, name="oracle", run_dir=ws.runs)
    t0 = time.perf_counter()
    try:
        outputs = runner.run(cases, suite.sampling)
    except (EngineRefused, EngineFailed) as e:
        tail = getattr(e, "log_tail", "")
        raise GoldenError(f"the oracle ({pin.spec}) could not run {model.name}/{suite.name}: {e}"
                          + (f"\n--- engine log tail ---\n{tail}" if tail else "")) from None
    info = runner.info()
    if info.version != pin.version:
        raise GoldenError(f"the installed vLLM is {info.version} but the oracle pin is {pin.spec}: "
                          f"run `make venv` to install the pin before recording")
    sha = git_sha(ws.root)
    folder = write_golden(
        golden_dir(ws.goldens, model, suite.name), model=model, suite=suite, cases=cases,
        outputs=outputs, oracle=EngineInfo("oracle", "vllm", info.version, settings=info.settings),
        pin=pin, provenance={
            "harness_sha": sha, "harness_dirty": git_dirty(ws.root), "platform": platform_facts(),
            "created": now_utc(),
            "timings": {**runner.timings, "record_wall_s": time.perf_counter() - t0}})
    return read_golden(folder, model_name=model.name, suite_name=suite.name)


def load_or_record(ws: Workspace, model: ModelRef, suite: Suite, *, auto_record: bool,
                   pin: OraclePin | None = None) -> tuple[Golden, bool]:
    """The verified goldens for model+suite; records them first when missing and allowed.

    Returns (golden, recorded_now). Stale goldens are refused, never silently re-recorded.
    """
    pin = pin or oracle_pin()
    folder = golden_dir(ws.goldens, model, suite.name)
    if not (folder / "manifest.json").exists():
        if not auto_record:
            raise GoldenError(f"no goldens for {model.name}/{suite.name}; "
                              f"record them with: {record_command(model.name, suite.name)}")
        return record_goldens(ws, model, suite, pin), True
    golden = read_golden(folder, model_name=model.name, suite_name=suite.name)
    why = staleness(golden, model=model, suite=suite, pin=pin, cases=suite.build_cases(model.encode))
    if why:
        raise GoldenError(f"stale goldens in {folder}:\n  - " + "\n  - ".join(why)
                          + f"\nre-record them with: {record_command(model.name, suite.name)}")
    return golden, False


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
        source = scores if scores is not None and getattr(comp, "needs_scores", False) else outputs
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
    fails = sum(1 for c in cases if any(
        v.status == "fail" for (name, cid), v in by.items() if cid == c.id and name in
        {s.name for s in suite.comparators if s.gate}))
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


def run_gate(ws: Workspace, model_name: str, suite_name: str, candidate: str, *,
             auto_record: bool = True, transform: Transform | None = None,
             runner: Runner | None = None, write: bool = True, concurrency: int | None = None,
             oracle_speed: bool | Speed | str = False, connector: str | None = None) -> GateResult:
    """Run one gate and write its record.

    ``transform`` rewrites the candidate's outputs before judging (planted mutations in tests);
    ``runner`` replaces the one the spec would make (an already-configured engine).
    ``concurrency``: requests in flight (None: the runner's default). ``oracle_speed``: also replay
    the cases on the pinned vLLM at the same concurrency, after the candidate has stopped, so the
    record can state a candidate/oracle speed ratio (one more engine start); a :class:`Speed`
    measured earlier in the same run (``make matrix``) is used as is; a string says why not.
    """
    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    if "kv" in suite.extra:  # KV round trip: vLLM + a KV connector, judged page by page (harness.kv)
        from harness.kv.gate import run_kv_gate

        return run_kv_gate(ws, model_name, suite_name, connector, auto_record=auto_record, write=write)
    if connector:
        raise SuiteError(f"{suite.path}: a KV connector ({connector}) needs a KV suite (one with a [kv] "
                         f"table, e.g. kv_roundtrip); {suite.name} has none")
    pin = oracle_pin()
    t0 = time.perf_counter()
    golden, recorded = load_or_record(ws, model, suite, auto_record=auto_record, pin=pin)
    timings: dict[str, float] = {"goldens_s": time.perf_counter() - t0}
    if recorded:
        timings["oracle_record_s"] = golden.manifest["timings"]["record_wall_s"]

    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = runner or make_runner(candidate, model, RunnerContext(run_dir=ws.runs, concurrency=concurrency))
    outputs: dict[str, Output] = {}
    extra: dict[str, Any] = {}
    dist: Distribution | None = None
    caps = getattr(runner, "capabilities", None)
    comps = [c for s in suite.comparators
             if not isinstance(c := comparator_for(s.name, s.params, model.decode, caps), str)]
    t1 = time.perf_counter()
    try:
        runner.start()
        how, scores = "", None
        if wants_scores(comps):  # KL / drift / NMSE: the candidate also scores the oracle's sequences
            scored = run_and_score(runner, golden.cases, golden.sampling, golden.outputs)
            produced, how = scored.outputs, scored.how
            scores = {o.case_id: o for o in scored.scores}
        else:
            produced = runner.run(golden.cases, golden.sampling)
        if transform is not None:
            produced = transform(produced)
        outputs = {o.case_id: o for o in produced}
        if how == "until-first-divergence":
            scores = outputs  # the engine cannot score: its own (transformed) outputs stand in
        t2 = time.perf_counter()
        caps = getattr(runner, "capabilities", None) or caps  # servers detect theirs while running
        comps = [c for s in suite.comparators
                 if not isinstance(c := comparator_for(s.name, s.params, model.decode, caps), str)]
        # the candidate's self-checks (tokenizer parity, greedy self-consistency) come first
        verdicts = (candidate_checks(golden.cases, outputs, caps, model.decode)
                    + judge(golden, outputs, suite, model.decode, caps, scores))
        if scores is not None:
            dist = judge_run(comps, golden.cases, golden.outputs, scores, how)
            verdicts += list(dist.verdicts) if dist else []
        timings["compare_s"] = time.perf_counter() - t2
    except (EngineRefused, EngineFailed) as e:
        status = "refused" if isinstance(e, EngineRefused) else "error"
        tail = getattr(e, "log_tail", "")
        verdicts = [Verdict(c.id, s.name, status, f"{status}: {str(e).splitlines()[0][:160]}",
                            detail=str(e) + (f"\n--- engine log tail ---\n{tail}" if tail else ""),
                            evidence={"reason": str(e)})
                    for s in suite.comparators for c in golden.cases]
        extra["engine_" + status] = str(e)
    finally:
        runner.close()
    timings["candidate_wall_s"] = time.perf_counter() - t1
    ran = not extra  # no engine_error / engine_refused
    extra.update(capability_extra(getattr(runner, "capabilities", None), (s.name for s in suite.comparators)))
    extra.update(speed_extra(runner, golden.cases, golden.sampling, model, ws.runs, concurrency,
                             oracle_speed, candidate_ran=ran))
    timings.update({f"candidate_{k}": float(v) for k, v in getattr(runner, "timings", {}).items()})
    oracle_t = golden.manifest.get("timings", {})
    timings.update({f"oracle_{k}": float(v) for k, v in oracle_t.items()})
    gates = tuple(s.name for s in suite.comparators if s.gate) + check_gates(verdicts)

    # The vacuous-gate guard: planted mutations against these goldens must fail (see controls.py).
    controls = suite_controls(suite, golden, model.decode, getattr(runner, "capabilities", None))
    controls += check_controls(verdicts, golden.cases, golden.outputs, getattr(runner, "capabilities", None),
                               model.decode)
    outcome, vacuous = guard(outcome_of(verdicts, gates), controls, gates)
    summary = summarize(suite, verdicts, golden.cases) + checks_summary(verdicts)
    if outcome == "vacuous":
        summary += " — VACUOUS: " + "; ".join(vacuous)

    sha = git_sha(ws.root)
    created = now_utc()
    record = Record(
        id=new_record_id(created, sha, candidate), kind="gate", created=created,
        model={"name": model.name, "digest": model.digest, **model_facts(model.path)},
        suite={"name": suite.name, "version": suite.version, "digest": suite.digest},
        oracle={"engine": golden.oracle.engine, "version": golden.oracle.version,
                "pin": golden.manifest["oracle"].get("pin"), "golden_files": dict(golden.checksums),
                "golden_created": golden.manifest.get("created"),
                "settings": dict(golden.oracle.settings)},
        candidate=runner.info(), harness={"sha": sha, "dirty": git_dirty(ws.root)},
        outcome=outcome, summary=summary,
        verdicts=tuple(verdicts), gates=gates, timings=timings, controls=tuple(controls),
        platform=platform_facts(),
        extra=extra)
    if dist is not None:
        record = replace(record, summary=f"{record.summary} — {dist.summary()}", extra={
            **record.extra, "distribution": {**dist.to_json(), "figures": {
                k: f"{record.id}.{k}.png" for k in FIGURES}}})
        if write:  # the pictures go beside the record
            dist.write_figures(record_path(ws.records, record).parent, record.id,
                               f"{model.name} / {suite.name}: {runner.name} vs oracle")
    path = write_record(ws.records, record) if write else Path()
    return GateResult(record, path, golden)
