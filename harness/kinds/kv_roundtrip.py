"""``kv_roundtrip``: goldens -> producer -> fresh consumer -> every KV page compared byte for byte.

``make gate SUITE=kv_roundtrip [CONNECTOR=module:Class]``. The no-connector goldens are the
oracle's, recorded like any suite's; the engine under test is the pinned vLLM with the harness store,
or with the harness tap around ``connector`` (:mod:`harness.kv.roundtrip` runs the engines).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from harness.goldens import Golden
from harness.kinds.base import KINDS, GateRequest, Judgement
from harness.oracle import load_or_record
from harness.provenance import device_facts, now_utc
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class Prepared:
    golden: Golden
    connector: Any
    """The parsed ConnectorSpec, or None for the harness store."""
    timings: dict[str, float]


class KVRoundTrip:
    name = "kv_roundtrip"
    tables = ("kv",)

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        # torch + vLLM come in with the KV modules: only when a KV gate runs
        from harness.kv.config import load_connector_class, parse_connector
        from harness.kv.roundtrip import KVSettings

        KVSettings.from_suite(req.suite)  # a malformed [kv] table is bad input, before any engine starts
        spec = parse_connector(req.connector) if req.connector else None
        if spec is not None:
            load_connector_class(spec)  # an unknown module or class is named now, not inside vLLM
        t0 = time.perf_counter()
        golden, recorded = load_or_record(ws, req.model, req.suite, auto_record=req.auto_record)
        timings = {"goldens_s": time.perf_counter() - t0}
        if recorded:
            timings["oracle_record_s"] = golden.manifest["timings"]["record_wall_s"]
        return Prepared(golden, spec, timings)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Any:
        from harness.kv.roundtrip import run_roundtrip

        stamp = now_utc().replace(":", "").replace("-", "")
        run_dir = ws.runs / f"kv-{stamp}-{req.suite.name}-{req.model.slug}-{secrets.token_hex(3)}"
        t0 = time.perf_counter()
        rt = run_roundtrip(req.model, req.suite, prepared.golden.cases, prepared.golden.outputs, run_dir,
                           prepared.connector, req.model.decode)
        return rt, time.perf_counter() - t0

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Any) -> Judgement:
        rt, wall = ran
        engine = replace(rt.engine, environment={**rt.engine.environment,  # the phases ran on this host
                                                  "device_class": device_facts().get("class")})
        return Judgement(
            label=f"kv-{rt.engine.name}", candidate=engine, verdicts=tuple(rt.verdicts),
            gates=tuple(rt.gates), controls=tuple(rt.controls), summary=rt.summary,
            timings={**prepared.timings, "roundtrip_wall_s": wall, **rt.timings}, extra=dict(rt.extra),
            golden=prepared.golden)


KINDS.register("kv_roundtrip", help="write -> restore in a fresh engine -> every KV page byte-equal")(
    KVRoundTrip())
