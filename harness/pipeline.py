"""The pipeline: every gate, whatever its kind, is prepare -> run -> judge -> one record.

``harness gate`` / ``make gate`` (and ``harness ab``, ``make matrix``, the pytest plugin) call
:func:`run_gate` with a resolved model and suite (:func:`run_gate_by_name` takes names). The
suite's ``kind`` picks the gate kind (:mod:`harness.kinds`); the kind judges; :func:`build_record`
— the only place a record is assembled — adds provenance (harness SHA, dirty tree, model facts,
device, the oracle's or reference's provenance), applies the vacuous-gate guard to the outcome, and
the record is written with its pictures beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api import Runner
from harness.device import UNKNOWN, recorded_class
from harness.device_policy import DevicePolicy, policy
from harness.goldens import Golden
from harness.kinds.base import Transform
from harness.kinds.distribution import FIGURES
from harness.kinds.registered import KINDS, GateKind, GateRequest, Judgement
from harness.models import ModelRef, resolve_model
from harness.models.arch import model_facts
from harness.provenance import device_facts, git_dirty, git_sha, now_utc, platform_facts
from harness.records import (
    RECORDED_ORACLE,
    UNGUARDED,
    Control,
    Record,
    guard,
    new_record_id,
    outcome_of,
    record_path,
    write_record,
)
from harness.registry import UnknownName
from harness.speed import Speed
from harness.steps import step
from harness.suites import Suite, SuiteError, find_suite
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True, eq=False)
class GateResult:
    record: Record
    path: Path
    """Where the record was written (``Path()`` when ``write=False``)."""
    judgement: Judgement

    @property
    def golden(self) -> Golden | None:
        return self.judgement.golden


def kind_of(suite: Suite, name: str | None = None) -> GateKind:
    """The suite's gate kind, or the kind ``name`` (a kind that works on another kind's suite, such
    as a diagnosis of a parity gate; its ``prepare`` checks the suite); an unknown kind or a table
    the kind does not read is bad input."""
    try:
        kind = KINDS.get(name or suite.kind)
    except UnknownName as e:
        raise SuiteError(f"{suite.path}: field 'kind': {e}") from None
    stray = sorted(set(suite.extra) - set(kind.tables))
    if stray:
        tables = ", ".join(f"[{t}]" for t in stray)
        owners = sorted(k.name for k in (KINDS.get(n) for n in KINDS) if set(stray) & set(k.tables))
        hint = f" (read by kind {', '.join(repr(o) for o in owners)})" if owners else ""
        raise SuiteError(f"{suite.path}: table {tables} is not read by kind {kind.name!r}{hint}")
    return kind


def golden_provenance(golden: Golden) -> dict[str, Any]:
    """The record's ``oracle`` entry for a gate judged against goldens."""
    m = golden.manifest
    return {"engine": golden.oracle.engine, "version": golden.oracle.version,
            "pin": m["oracle"].get("pin"), "golden_files": dict(golden.checksums),
            "golden_created": m.get("created"), "settings": dict(golden.oracle.settings),
            "device": dict(m.get("device") or {})}


def model_entry(model: ModelRef) -> dict[str, Any]:
    """A record's ``model``: name, digest and the facts read from its checkpoint."""
    return {"name": model.name, "digest": model.digest, **model_facts(model.path)}


def suite_entry(suite: Suite, kind: str) -> dict[str, Any]:
    """A record's ``suite``: name, version, digest and the kind that ran it."""
    return {"name": suite.name, "version": suite.version, "digest": suite.digest, "kind": kind}


def unguarded(j: Judgement) -> tuple[Control, ...]:
    """A gated comparator that judged something but ran no control cannot count as passed: one
    ``unguarded`` control per such comparator (the guard then makes the outcome vacuous)."""
    guarded = {c.comparator for c in j.controls}
    judged = {v.comparator for v in j.verdicts if v.status != "skip"}
    return tuple(Control(g, UNGUARDED, "fail", "unguarded", False,
                         f"the {j.label} gate ran no controls for it")
                 for g in j.gates if g in judged and g not in guarded)


def cross_device(j: Judgement) -> DevicePolicy:
    """What may be expected between the goldens' device class and the candidate's, as the engine
    reported it (``unknown`` for one that does not say: a remote server, a CLI)."""
    assert j.golden is not None
    candidate = str(j.candidate.environment.get("device_class") or UNKNOWN)
    dtype = str(j.candidate.settings.get("dtype") or j.golden.oracle.settings.get("dtype") or "float32")
    return policy(recorded_class(j.golden.manifest), candidate, dtype=dtype)


def build_record(ws: Workspace, req: GateRequest, kind: GateKind, j: Judgement,
                 created: str | None = None) -> Record:
    """The one record builder: provenance, guard, timings, figures' names."""
    created = created or now_utc()
    sha = git_sha(ws.root)
    controls = j.controls + unguarded(j)
    outcome, vacuous = guard(outcome_of(j.verdicts, j.gates), controls, j.gates)
    summary = j.summary + (" — VACUOUS: " + "; ".join(vacuous) if outcome == "vacuous" else "")
    timings = dict(j.timings)
    extra: dict[str, Any] = dict(j.extra)
    host = device_facts()
    if j.golden is not None:
        oracle = golden_provenance(j.golden)
        timings.update({f"{RECORDED_ORACLE}{k}": float(v)
                        for k, v in (j.golden.manifest.get("timings") or {}).items()})
        cross = cross_device(j)
        extra["cross_device"] = cross.to_json()
        if not cross.same_class and cross.candidate_class != UNKNOWN:
            summary += f" — {cross.statement}"  # the verdict text names both classes
    else:
        oracle = dict(j.reference)
    if vacuous:
        extra["vacuous"] = vacuous
    rid = new_record_id(created, sha, j.label)
    if j.distribution is not None:
        extra["distribution"] = {**j.distribution.to_json(),
                                 "figures": {k: f"{rid}.{k}.png" for k in FIGURES}}
    if j.picture_names:
        extra["figures"] = {k: f"{rid}.{k}.png" for k in j.picture_names}
    suite = dict(j.suite) if j.suite is not None else suite_entry(req.suite, kind.name)
    return Record(
        id=rid, kind=kind.name, created=created,
        model=model_entry(req.model), suite={**suite, "kind": kind.name},
        oracle=oracle, candidate=j.candidate, harness={"sha": sha, "dirty": git_dirty(ws.root)},
        outcome=outcome, summary=summary, verdicts=j.verdicts, gates=j.gates, timings=timings,
        controls=controls, platform=platform_facts(), device=host, extra=extra)


def write_with_figures(ws: Workspace, record: Record, j: Judgement) -> Path:
    """The record, and its pictures beside it."""
    path = write_record(ws.records, record)
    if j.distribution is not None:
        j.distribution.write_figures(record_path(ws.records, record).parent, record.id, j.figure_title)
    if j.pictures is not None:
        j.pictures(record_path(ws.records, record).parent, record.id)
    return path


def run_gate(ws: Workspace, model: ModelRef, suite: Suite, candidate: str | None, *,
             reference: str | None = None, connector: str | None = None,
             concurrency: int | None = None, speed: bool | Speed | str = False,
             auto_record: bool = True, transform: Transform | None = None,
             runner: Runner | None = None, write: bool = True,
             options: Mapping[str, Any] | None = None, kind: str | None = None) -> GateResult:
    """Run one gate of the suite's kind on ``model`` and write its record.

    ``model`` and ``suite`` come resolved (:func:`~harness.models.resolve_model` hashes every weight
    file): a caller that gates one model many times (a bisect, a matrix, several candidates)
    resolves it once; :func:`run_gate_by_name` is the entry that takes names.
    ``candidate``: the engine spec under test (None: the kind's default, ``hf`` for parity suites).
    ``reference``: arm A of an A/B suite. ``connector``: a KV connector for KV suites.
    ``concurrency``: requests in flight (None: the engine's default). ``speed``: also time the
    pinned oracle on the same workload after the candidate has stopped (True), reuse a
    :class:`Speed` measured earlier in the same run, or say why not (a string).
    ``transform`` rewrites the candidate's outputs (an A/B's: B's scores) before judging — planted
    mutations in tests; ``runner`` replaces the one the spec would make. ``kind``: a kind other than
    the suite's that works on it (``localize``: where a parity gate's candidate parts from the
    oracle, ``options["source"]`` being that gate's record).
    """
    gate_kind = kind_of(suite, kind)
    candidate = candidate or gate_kind.default_candidate
    if connector and "kv" not in gate_kind.tables:
        raise SuiteError(f"{suite.path}: a KV connector ({connector}) needs a KV suite (kind "
                         f"'kv_roundtrip', e.g. suite kv_roundtrip); {suite.name} is {suite.kind!r}")
    req = GateRequest(model, suite, candidate, reference, connector, concurrency, speed, auto_record,
                      transform, runner, dict(options or {}))
    prepared = gate_kind.prepare(ws, req)
    with step(f"{gate_kind.name} run: {candidate} on {model.name}/{suite.name}"):
        ran = gate_kind.run(ws, req, prepared)
    j = gate_kind.judge(ws, req, prepared, ran)
    record = build_record(ws, req, gate_kind, j)
    return GateResult(record, write_with_figures(ws, record, j) if write else Path(), j)


def run_gate_by_name(ws: Workspace, model_name: str, suite_name: str, candidate: str | None,
                     **kw: Any) -> GateResult:
    """:func:`run_gate` for names, as the command line and the pytest plugin give them: the model
    resolved (its files hashed) and the suite found, once."""
    return run_gate(ws, resolve_model(model_name, ws), find_suite(ws.suites, suite_name), candidate, **kw)


def run_ab(ws: Workspace, model_name: str, suite_name: str, a_spec: str, b_spec: str, *,
           arms: tuple[Any, Any] | None = None, transform_b: Transform | None = None,
           **kw: Any) -> GateResult:
    """An A/B gate: ``b_spec`` judged against the reference configuration ``a_spec``.

    ``arms``: (A, B) :class:`~harness.kinds.ab.kind.Arm` s that already ran (one A serves several Bs);
    ``transform_b`` rewrites B's scores before judging (planted mutations in tests)."""
    return run_gate_by_name(ws, model_name, suite_name, b_spec, reference=a_spec, transform=transform_b,
                            options={"arms": arms} if arms is not None else None, **kw)
