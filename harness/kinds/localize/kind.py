"""``localize``: where a parity gate's candidate parts from the oracle — which layer, attention or MLP.

For each case of a parity record whose generation diverged (strictly: the near-tie rule may have
forgiven it), both engines run the same sequence, teacher-forced: the prompt and the oracle's
tokens up to and including the first divergent one. Each taps the residual stream after every
layer's attention and MLP (or MoE) sub-block, the final norm and the logits
(:mod:`harness.engines.launch.layer_taps`); :mod:`harness.kinds.localize.profile` finds the first tensor over
the floor (where they part) and the first over the bar. The oracle's tensors come from the pinned
vLLM (cached: :mod:`harness.kinds.localize.oracle`), the candidate's from its
:class:`~harness.abilities.TensorSource`; an engine that cannot expose tensors makes the diagnosis
``refused`` with its reason.

A verdict ``pass`` says the diagnosis was made (its summary names the culprit); the record's
controls check the localizer itself on the oracle's own tensors (identical: parts nowhere; planted
at a middle tensor: parts exactly there). The record files under suite ``localize`` and names the
diagnosed record, suite and goldens in ``extra["diagnosed"]``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.abilities import TensorSource
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Verdict, failure_verdicts
from harness.engines import RunnerContext, make_runner
from harness.goldens import Golden
from harness.kinds.base import GateRequest, Judgement, engine_info, register_kind
from harness.kinds.localize.oracle import OracleTensors, golden_sequence, oracle_tensors
from harness.kinds.localize.profile import Profile, controls_of, order_by, profile, sci, settings
from harness.oracle import load_or_record
from harness.records import Control, Record
from harness.staleness import Current, oracle_reasons
from harness.suites import SuiteError
from harness.tomlcheck import Where
from harness.workspace import Workspace

KEY = "localize"
LOCALIZE_VERSION = 1
"""The version of the method (what is tapped, how NMSE is taken): the ``version`` of the
``localize`` suite entry of every record."""


def divergences(record: Record) -> dict[str, int]:
    """Case id -> the first divergent token index, from the record's verdicts (strict's, else any
    verdict that names one)."""
    out: dict[str, int] = {}
    for comp in ("strict", None):
        for v in record.verdicts:
            if (comp is None or v.comparator == comp) and v.case_id not in out:
                pos = v.evidence.get("first_divergence")
                if isinstance(pos, int) and not isinstance(pos, bool):
                    out[v.case_id] = pos
    return out


def gate_wall_s(record: Record) -> float:
    """The diagnosed gate's own wall time: goldens, candidate, judging."""
    t = record.timings
    return float(sum(float(t.get(k, 0.0)) for k in ("goldens_s", "candidate_wall_s", "compare_s")))


@dataclass(frozen=True, slots=True, eq=False)
class Target:
    """One case to localize: the rows to compare and the sequence the candidate is fed."""

    case: Case
    sequence: tuple[int, ...]
    """Prompt + the oracle's tokens up to and including the first divergent one (the whole golden
    sequence for a case that did not diverge and was asked for)."""
    divergence: int | None
    row: int
    """The row that predicts the divergent token (the last oracle token for a whole sequence)."""


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    source: Record
    source_path: str
    golden: Golden
    targets: tuple[Target, ...]
    bar: float
    floor: float
    t0: float


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    info: EngineInfo
    ability: str = ""
    oracle: OracleTensors | None = None
    candidate: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    failure: tuple[str, str, str] | None = None
    """(``refused``|``error``, reason, engine log tail)."""
    timings: Mapping[str, float] = field(default_factory=dict)


def targets_of(golden: Golden, diverged: Mapping[str, int], cases: str | Sequence[str] | None
               ) -> list[Target]:
    """The diverged cases (``cases`` None), every case (``"all"``), or the named ones."""
    wanted = ([c.id for c in golden.cases if c.id in diverged] if cases is None else
              [c.id for c in golden.cases] if cases == "all" else list(cases))
    known = {c.id: c for c in golden.cases}
    out = []
    for cid in wanted:
        if cid not in known:
            raise SuiteError(f"localize: no case {cid!r} in the goldens (cases: {', '.join(known)})")
        case, whole = known[cid], golden_sequence(golden, cid)
        p, n = len(case.prompt_ids), len(golden.outputs[cid].token_ids)
        d = diverged.get(cid)
        if d is None or d >= n:  # no divergence, or the candidate only stopped early/late
            out.append(Target(case, tuple(whole), None, len(whole) - 2))
        else:
            out.append(Target(case, tuple(whole[: p + d + 1]), d, p + d - 1))
    return out


class Localize:
    name = KEY
    default_candidate = "hf"
    tables: tuple[str, ...] = ("localize",)

    @staticmethod
    def stale(rec: Record, cur: Current) -> list[str]:
        """The rules of the parity gate it diagnosed (that suite's version, its goldens, the pin,
        the model), read from the record's ``suite.diagnoses``."""
        diagnosed = rec.suite.get("diagnoses")
        if not isinstance(diagnosed, Mapping) or not diagnosed.get("name"):
            return ["the record names no diagnosed suite (suite.diagnoses)"]
        return oracle_reasons(replace(rec, suite=dict(diagnosed)), cur)

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        t0 = time.perf_counter()
        source = req.options.get("source")
        if not isinstance(source, Record):
            raise SuiteError("localize: give the parity record to diagnose (harness localize RECORD)")
        where = str(req.options.get("source_path") or source.id)
        if source.kind != "parity" or req.suite.kind != "parity":
            raise SuiteError(f"{where}: localize diagnoses parity records; this one is kind {source.kind!r}")
        if source.model.get("digest") != req.model.digest:
            raise SuiteError(f"{where}: recorded on {req.model.name} {str(source.model.get('digest'))[:12]}, "
                             f"the model is now {req.model.digest[:12]}: gate it again first")
        golden, _ = load_or_record(ws, req.model, req.suite, auto_record=False)
        if dict(source.oracle.get("golden_files") or {}) != dict(golden.checksums):
            raise SuiteError(f"{where}: judged against goldens that were re-recorded since: gate it "
                             "again first")
        bar, floor = settings(req.suite.extra, Where(req.suite.path, error=SuiteError))
        targets = targets_of(golden, divergences(source), req.options.get("cases"))
        return Prepared(source, where, golden, tuple(targets), bar, floor, t0)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Ran:
        ws.runs.mkdir(parents=True, exist_ok=True)
        runner = req.runner or make_runner(req.candidate, req.model, RunnerContext(run_dir=ws.runs))
        ability = runner.tensor_ability() if isinstance(runner, TensorSource) else None
        if ability is None or not ability.layers:  # said before anything starts, diverged or not
            why = ability.reason("layers") if ability else f"{type(runner).__name__} declares no TensorSource"
            return Ran(engine_info(runner, req.candidate), failure=("refused", f"{req.candidate}: {why}", ""))
        if not prepared.targets:
            return Ran(engine_info(runner, req.candidate), ability.note)
        seqs = {t.case.id: t.sequence for t in prepared.targets}
        t0 = time.perf_counter()
        try:
            runner.start()
            captured = runner.capture_layers(seqs)  # type: ignore[union-attr]
            t1 = time.perf_counter()
            oracle = oracle_tensors(ws, req.model, prepared.golden, list(seqs))
        except (EngineRefused, EngineFailed) as e:
            status = "refused" if isinstance(e, EngineRefused) else "error"
            return Ran(engine_info(runner, req.candidate), ability.note,
                       failure=(status, str(e), e.log_tail if isinstance(e, EngineFailed) else ""))
        finally:
            runner.close()
        timings = {"candidate_tensors_s": t1 - t0, "oracle_tensors_s": oracle.seconds}
        return Ran(engine_info(runner, req.candidate), ability.note, oracle, captured, timings=timings)

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Ran) -> Judgement:
        src, targets = prepared.source, prepared.targets
        verdicts: list[Verdict] = []
        controls: list[Control] = []
        profiles: list[Profile] = []
        if ran.failure is not None:
            status, reason, tail = ran.failure
            ids = [t.case.id for t in targets] or [c.id for c in prepared.golden.cases]
            verdicts = failure_verdicts([KEY], ids, status, reason, tail)  # type: ignore[arg-type]
        elif ran.oracle is not None:
            for t in targets:
                o = ran.oracle.tensors[t.case.id]
                c = order_by(list(o), ran.candidate.get(t.case.id, {}))
                try:
                    p = profile(t.case.id, o, c, len(t.sequence), t.row, prepared.bar, prepared.floor,
                                t.divergence is not None)
                except ValueError as e:
                    verdicts.append(Verdict(t.case.id, KEY, "error", f"error: {e}",
                                            evidence={"reason": str(e)}))
                    continue
                profiles.append(p)
                verdicts.append(Verdict(t.case.id, KEY, "pass", p.line(), detail=table(p, t),
                                        evidence={**p.to_json(), "divergence": t.divergence,
                                                  "oracle_from": ran.oracle.source[t.case.id]}))
            if targets:
                t = targets[0]
                o = {k: v[: len(t.sequence)] for k, v in ran.oracle.tensors[t.case.id].items()}
                for mutation, expect, got, wanted in controls_of(o, len(t.sequence), t.row, prepared.bar,
                                                                 prepared.floor):
                    want = f"parts at {wanted}" if wanted else "parts nowhere"
                    controls.append(Control(KEY, f"{t.case.id}: {mutation}", expect,  # type: ignore[arg-type]
                                            f"parts at {got}" if got else "parts nowhere", got == wanted,
                                            f"expected: {want}"))
        wall = time.perf_counter() - prepared.t0
        gate = gate_wall_s(src)
        extra: dict[str, Any] = {
            "diagnosed": {"record": src.id, "path": prepared.source_path, "outcome": src.outcome,
                          "summary": src.summary,
                          "suite": {"name": req.suite.name, "version": req.suite.version,
                                    "digest": req.suite.digest}},
            "localize": {"bar": prepared.bar, "floor": prepared.floor, "candidate_capture": ran.ability,
                         "oracle_capture": dict(ran.oracle.meta) if ran.oracle else {},
                         "cases": {p.case_id: p.to_json() for p in profiles}},
            "wall": {"localize_s": wall, "gate_s": gate, "ratio": wall / gate if gate > 0 else None},
        }
        if ran.failure is not None:
            extra["engine_" + ran.failure[0]] = ran.failure[1]
        title = f"{req.model.name} / {req.suite.name}: {req.candidate}\nvs the oracle, NMSE per sub-block"
        return Judgement(
            label=req.candidate, candidate=ran.info, verdicts=tuple(verdicts), gates=(KEY,),
            controls=tuple(controls), summary=summary(profiles, verdicts, wall, gate),
            timings={**ran.timings, "localize_wall_s": wall}, extra=extra, golden=prepared.golden,
            figure_title=title, suite={"name": KEY, "version": LOCALIZE_VERSION, "digest": req.suite.digest,
                                       "diagnoses": {"name": req.suite.name, "version": req.suite.version}},
            pictures=(lambda folder, rid: write_profile(folder, rid, title, profiles)) if profiles else None,
            picture_names=("profile",) if profiles else ())



def table(p: Profile, t: Target) -> str:
    """The multi-line table a verdict prints: every tensor's NMSE, at the divergence row, growth."""
    head = (f"{p.case_id}: teacher-forced on {p.positions} tokens (prompt {len(t.case.prompt_ids)} + "
            + (f"oracle tokens 0..{t.divergence}, the first divergent one last" if t.divergence is not None
               else "every oracle token: no divergence") + f"); bar {sci(p.bar)}, floor {sci(p.floor)}")
    rows = [head, f"  {'tensor':<18} {'NMSE':>9} {'at row ' + str(p.row):>12} {'growth':>9}"]
    for s in p.steps:
        mark = " <- parts here" if p.parts_at is s else (" <- first over the bar" if p.over_bar is s else "")
        rows.append(f"  {s.name:<18} {sci(s.nmse):>9} {sci(s.nmse_row):>12} "
                    f"{(sci(s.growth) + 'x') if s.growth is not None else '—':>9}{mark}")
    if p.top1:
        rows.append(f"  top-1 at row {p.row}: oracle {p.top1['oracle']}, candidate {p.top1['candidate']}"
                    + ("" if p.top1["oracle"] != p.top1["candidate"] else
                       " (the same: the teacher-forced pass does not reproduce the divergence)"))
    if p.missing:
        rows.append(f"  not given by the candidate: {', '.join(p.missing)}")
    return "\n".join(rows)


def summary(profiles: Sequence[Profile], verdicts: Sequence[Verdict], wall: float, gate: float) -> str:
    if not verdicts:
        return "localize: no case diverged: nothing to localize"
    bad = [v for v in verdicts if v.status != "pass"]
    if bad:
        return f"localize: {bad[0].summary}"
    where: dict[str, list[str]] = {}
    for p in profiles:
        where.setdefault(p.parts_at.name if p.parts_at else "nowhere", []).append(p.case_id)
    parts = "; ".join(f"parts at {name} in {len(ids)}/{len(profiles)} ({', '.join(ids[:4])}"
                      f"{' ...' if len(ids) > 4 else ''})" for name, ids in where.items())
    ratio = f", {wall / gate:.1f}x the gate's wall time" if gate > 0 else ""
    return f"localize: {parts} ({wall:.0f} s{ratio})"


def write_profile(folder: Path, rid: str, title: str, profiles: Sequence[Profile]) -> Path:
    from harness.plots import nmse_profile

    curves = {p.case_id: ([s.name for s in p.steps], [s.nmse for s in p.steps]) for p in profiles}
    marks = {p.case_id: p.parts_at.name if p.parts_at else None for p in profiles}
    bar, floor = profiles[0].bar, profiles[0].floor
    return nmse_profile(curves, folder / f"{rid}.profile.png", title, {"bar": bar, "floor": floor}, marks)


register_kind(Localize(), help="where a parity gate's candidate parts from the oracle: NMSE per layer "
                                "and sub-block, teacher-forced")
