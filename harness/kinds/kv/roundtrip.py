"""The KV round trip: write -> fresh-engine restore -> compare, for a suite with a ``[kv]`` table.

Three engine processes, each started once with every request batched into it:

1. **producer** (``kv_producer``): timing passes (record-off / record-on on shifted copies of the
   workload, into a scratch lane), then the real workload, whose pages are stored and captured;
2. **consumer** (``kv_consumer``, a fresh process): the workload again in the ``clean`` lane,
   served from the store, plus a ``ref`` lane that reads no cache (the in-engine no-connector
   generation) and the planted-fault lanes (one byte flipped, one page dropped) on one case;
3. **refusal probe**: the connector with a chunk size that is not a multiple of the block size
   must refuse to start, naming the KV-cache group and both sizes.

With ``connector`` (a third-party class) the producer and consumer run the harness tap around it
instead of the harness store; the refusal probe and the drop lane are store features and are not
run then (the flip lane is planted by the tap in the consumer's buffer).

Everything is written under ``run_dir``: request/result files, engine logs, stores, captures.

This module wires the phases together; the jobs live beside it: :mod:`harness.kinds.kv.settings` (the
suite's ``[kv]`` table, engine settings), :mod:`harness.kinds.kv.passes` (one engine process per phase),
:mod:`harness.kinds.kv.judge` (captures -> evidence, verdicts, controls, figures) and
:mod:`harness.kinds.kv.refusal` (the refusal probe's verdicts).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.api import Case, EngineInfo, Output, Verdict, failure_verdicts
from harness.compare.byte_equal import summary_line
from harness.kinds.kv.config import STORE_CLASS, STORE_MODULE, TAP_CLASS, TAP_MODULE, ConnectorSpec
from harness.kinds.kv.cuda_only import cuda_only
from harness.kinds.kv.judge import Judge, figures
from harness.kinds.kv.passes import (
    Phase,
    consumer_passes,
    merge_compat,
    producer_passes,
    request,
    run_phase,
    vocab_size,
)
from harness.kinds.kv.refusal import refusal_controls, refusal_verdicts
from harness.kinds.kv.settings import KVSettings, engine_settings, fill_store, transfer
from harness.models import ModelRef
from harness.records import Control
from harness.suites import Suite

FLIP = {"kind": "flip", "layer": 1, "page": 0, "offset": 4097}
DROP = {"kind": "drop", "layer": 0, "page": 1}


@dataclass(frozen=True, slots=True)
class RoundTrip:
    verdicts: tuple[Verdict, ...]
    controls: tuple[Control, ...]
    gates: tuple[str, ...]
    summary: str
    engine: EngineInfo
    timings: Mapping[str, float]
    extra: Mapping[str, Any]
    run_dir: Path


def run_roundtrip(model: ModelRef, suite: Suite, cases: Sequence[Case], golden: Mapping[str, Output],
                  run_dir: Path, connector: ConnectorSpec | None = None,
                  decode: Any = None, python: str | None = None,
                  lacks: Mapping[str, Any] | None = None) -> RoundTrip:
    """The round trip on the vLLM that ``python`` imports (a release's venv; default: the pin's).
    ``lacks``: the release is known not to run the gate here (a compat block with its ``reason``, read
    from its wheel before installing it): no engine starts, every verdict is a named skip."""
    kv = KVSettings.from_suite(suite)
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab = vocab_size(model)
    cap = run_dir / "capture"
    control = next((c for c in cases if c.id == kv.controls_case), None) if kv.controls_case else None
    timings: dict[str, float] = {}
    if connector is None:
        chunk = kv.chunk_size
        store = run_dir / "store"
        lanes_p = {"clean": {"root": str(store)}, "scratch": {"root": str(run_dir / "store-scratch")}}
        lanes_c = {"clean": {"root": str(store)}, "flip": {"root": str(store), "fault": FLIP},
                   "drop": {"root": str(store), "fault": DROP}}
        control_lanes = ["flip", "drop"]
        policy = kv.load_failure_policy
        t_prod = transfer(STORE_CLASS, STORE_MODULE, "kv_producer", {
            "capture_dir": str(cap / "producer"), "chunk_size": chunk, "lanes": lanes_p}, policy)
        t_cons = transfer(STORE_CLASS, STORE_MODULE, "kv_consumer", {
            "capture_dir": str(cap / "consumer"), "chunk_size": chunk, "lanes": lanes_c}, policy)
        name = "harness-store"
    else:
        chunk = kv.tap_chunk_size or kv.block_size
        store = run_dir / "connector-store"
        store.mkdir(parents=True, exist_ok=True)
        extra = fill_store(kv.tap_extra, store)
        tap_cls = TAP_CLASS  # the phase names the HMA tap when the release and the connector have it
        tap = {"module": connector.module, "class": connector.cls}
        control_lanes = ["flip"]
        t_prod = transfer(tap_cls, TAP_MODULE, kv.tap_role, {
            "capture_dir": str(cap / "producer"), "tap": tap}, kv.load_failure_policy, extra)
        t_cons = transfer(tap_cls, TAP_MODULE, kv.tap_role, {
            "capture_dir": str(cap / "consumer"), "tap": tap, "tap_faults": {"flip": FLIP}},
            kv.load_failure_policy, extra)
        name = connector.text

    eng_p = engine_settings(model, kv, t_prod)
    if lacks is not None:
        prod = Phase("producer", False, str(lacks["reason"]), str(lacks.get("vllm", "")), {}, (), None,
                     run_dir / "producer.engine.log", dict(lacks), skipped=True)
    else:
        prod = run_phase(run_dir, "producer", model, eng_p, suite.sampling,
                         producer_passes(cases, kv.timing_reps, vocab, kv.timing_copies), cap / "producer",
                         python=python)
    timings["producer_engine_start_s"] = prod.timings.get("engine_start_s", float("nan"))
    cons = None
    if prod.ok:
        eng_c = engine_settings(model, kv, t_cons)
        cons = run_phase(run_dir, "consumer", model, eng_c, suite.sampling,
                         consumer_passes(cases, control, control_lanes), cap / "consumer", python=python)
        timings["consumer_engine_start_s"] = cons.timings.get("engine_start_s", float("nan"))
    refusal = None
    if connector is None and kv.refuse_chunk_size is not None and prod.skipped:
        refusal = replace(prod, name="refusal")  # the release lacks a hook: skipped for the same reason
    elif connector is None and kv.refuse_chunk_size is not None:
        t_ref = transfer(STORE_CLASS, STORE_MODULE, "kv_producer", {
            "capture_dir": str(cap / "refusal"), "chunk_size": kv.refuse_chunk_size,
            "lanes": {"clean": {"root": str(run_dir / "store-refusal")}}}, kv.load_failure_policy)
        t0 = time.perf_counter()
        refusal = run_phase(run_dir, "refusal", model, engine_settings(model, kv, t_ref), suite.sampling,
                            [{"name": "probe", "requests": [request(cases[0].id, cases[0].prompt_ids)]}],
                            cap / "refusal", python=python)
        timings["refusal_probe_wall_s"] = time.perf_counter() - t0

    version = prod.version or (cons.version if cons else "")
    info = EngineInfo(name, "vllm", version or "unknown", settings={
        "connector": name, "chunk_size": chunk, "block_size": kv.block_size,
        "load_failure_policy": kv.load_failure_policy,
        **{k: v for k, v in eng_p.items() if k != "kv_transfer_config"}})
    judge = Judge(model.name, suite.name, chunk, decode)
    verdicts: list[Verdict] = []
    controls: list[Control] = []
    extra: dict[str, Any] = {"run_dir": run_dir.name, "mode": "store" if connector is None else "tap",
                             "connector": name, "chunk_size": chunk}
    gates = [s.name for s in suite.comparators if s.gate]
    if compat := merge_compat([ph for ph in (prod, cons, refusal) if ph is not None]):
        extra["compat"] = compat

    failed = prod if not prod.ok else (cons if cons is not None and not cons.ok else None)
    if failed is not None and not failed.skipped and connector is not None and failed.log.exists():
        if (why := cuda_only(failed.log.read_text(errors="replace"), connector.cls)) is not None:
            failed = replace(failed, skipped=True, reason=why)  # the connector cannot run on this host
    if failed is not None or cons is None:
        assert failed is not None
        verdicts += failure_verdicts([s.name for s in suite.comparators], [c.id for c in cases],
                                     "skip" if failed.skipped else "error", failed.reason or "failed",
                                     failed.tail(), f"{failed.name} engine", {"phase": failed.name})
        extra["engine_skip" if failed.skipped else "engine_error"] = failed.reason
    else:
        assert prod.capture is not None and cons.capture is not None
        evs = {c.id: judge.evidence(c, "clean", prod, cons) for c in cases}
        for spec in suite.comparators:
            comp = judge.comparator(spec.name, spec.params)
            for c in cases:
                verdicts.append(judge.verdict(comp, c, evs[c.id], golden.get(c.id), cons))
        lane_controls, lanes = judge.lane_controls(control, control_lanes, prod, cons)
        controls += lane_controls
        extra["control_lanes"] = lanes
        controls += judge.memory_controls(evs, golden, cases, suite.comparators)
        extra["figures"] = figures(prod, cons, judge, evs, cases, kv.timing_copies)
        extra["cases"] = {cid: ev.to_json() for cid, ev in evs.items()}
        setup = cons.capture.setup or prod.capture.setup or {}
        if setup.get("groups"):  # how the engine laid the KV cache out (SUPPORTED_MODELS.md shows it)
            extra["kv_cache_groups"] = [{"index": g.get("index"), "kind": g.get("kind"),
                                         "block_size": g.get("block_size"), "window": g.get("window"),
                                         "layers": len(g.get("layers") or ())} for g in setup["groups"]]
        if setup.get("failed_loads"):
            extra["failed_loads"] = setup["failed_loads"]
        malformed = prod.capture.malformed + cons.capture.malformed
        if malformed:
            extra["capture_malformed"] = list(malformed[:20])
    if refusal is not None:
        verdicts += refusal_verdicts(refusal, kv)
        controls += refusal_controls(refusal, kv)
        gates.append("kv_refusal")
    summary = summary_line(verdicts)
    hits = [v for v in verdicts if v.comparator == "kv_hits"]
    strict = [v for v in verdicts if v.comparator == "strict"]
    if hits:
        summary += f"; hits {sum(v.status == 'pass' for v in hits)}/{len(hits)} as expected"
    if strict:
        summary += f"; tokens {sum(v.status == 'pass' for v in strict)}/{len(strict)} strict"
    fig = extra.get("figures", {})
    if "capture_overhead_pct" in fig:
        summary += f"; capture overhead {fig['capture_overhead_pct']:+.1f}%"
    return RoundTrip(tuple(verdicts), tuple(controls), tuple(gates), summary, info, timings, extra, run_dir)
