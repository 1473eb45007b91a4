"""The KV round-trip gate: goldens -> producer -> fresh consumer -> verdicts + controls -> one record.

``harness gate --suite kv_roundtrip [--connector module:Class]`` (``make gate SUITE=kv_roundtrip
[CONNECTOR=...]``) lands here for any suite with a ``[kv]`` table. The no-connector goldens are the
oracle's, recorded by ``make record`` like any suite's; the engine under test is the pinned vLLM
with the harness store, or with the harness tap around ``connector``.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from harness.provenance import git_dirty, git_sha, now_utc, platform_facts
from harness.records import Record, new_record_id, write_record
from harness.workspace import Workspace


def is_kv_suite(suite: object) -> bool:
    return "kv" in getattr(suite, "extra", {})


def run_kv_gate(ws: Workspace, model_name: str, suite_name: str, connector: str | None = None, *,
                auto_record: bool = True, write: bool = True):  # noqa: ANN201 - harness.gate.GateResult
    from harness.controls import guard
    from harness.gate import GateResult, load_or_record, outcome_of
    from harness.kv.config import load_connector_class, parse_connector
    from harness.kv.roundtrip import KVSettings, run_roundtrip
    from harness.models import resolve_model
    from harness.pin import oracle_pin
    from harness.suites import find_suite

    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    KVSettings.from_suite(suite)  # a malformed [kv] table is bad input, before any engine starts
    spec = parse_connector(connector) if connector else None
    if spec is not None:
        load_connector_class(spec)  # an unknown module or class is named now, not inside vLLM
    pin = oracle_pin()
    t0 = time.perf_counter()
    golden, recorded = load_or_record(ws, model, suite, auto_record=auto_record, pin=pin)
    timings = {"goldens_s": time.perf_counter() - t0}
    if recorded:
        timings["oracle_record_s"] = golden.manifest["timings"]["record_wall_s"]
    created = now_utc()
    run_dir = ws.runs / (f"kv-{created.replace(':', '').replace('-', '')}-{suite.name}-{model.slug}-"
                         f"{secrets.token_hex(3)}")
    t1 = time.perf_counter()
    rt = run_roundtrip(model, suite, golden.cases, golden.outputs, run_dir, spec, model.decode)
    timings["roundtrip_wall_s"] = time.perf_counter() - t1
    timings.update(rt.timings)
    outcome, vacuous = guard(outcome_of(rt.verdicts, rt.gates), rt.controls, rt.gates)
    extra = dict(rt.extra)
    if vacuous:
        extra["vacuous"] = vacuous
    sha = git_sha(ws.root)
    record = Record(
        id=new_record_id(created, sha, f"kv-{rt.engine.name}"), kind="kv", created=created,
        model={"name": model.name, "digest": model.digest},
        suite={"name": suite.name, "version": suite.version, "digest": suite.digest},
        oracle={"engine": golden.oracle.engine, "version": golden.oracle.version,
                "pin": golden.manifest["oracle"].get("pin"), "golden_files": dict(golden.checksums),
                "golden_created": golden.manifest.get("created")},
        candidate=rt.engine, harness={"sha": sha, "dirty": git_dirty(ws.root)},
        outcome=outcome, summary=rt.summary, verdicts=rt.verdicts, gates=rt.gates, timings=timings,
        controls=rt.controls, platform=platform_facts(), extra=extra)
    path = write_record(ws.records, record) if write else Path()
    return GateResult(record, path, golden)
