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
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Case, EngineInfo, Output, Sampling, Verdict
from harness.compare.byte_equal import ByteEqual, summary_line
from harness.compare.kv_hits import KVHits
from harness.compare.strict import Strict, first_divergence
from harness.engines import ledger
from harness.engines.procs import engine_env, kill_group, track
from harness.kv.capture import Capture, CaptureError, read_capture
from harness.kv.config import (
    STORE_CLASS,
    STORE_MODULE,
    TAP_CLASS,
    TAP_MODULE,
    UNREPORTED,
    ConnectorSpec,
)
from harness.kv.evidence import CaseEvidence, MemoryPage, Page, Problem
from harness.kv.faults import read_planted
from harness.kv.pages import PageRef, expected_hit_tokens, prefix_keys
from harness.kv.plan import first_block_in_window
from harness.models import ModelRef
from harness.records import Control
from harness.suites import Suite, SuiteError

PHASE_TIMEOUT_S = float(os.environ.get("HARNESS_KV_TIMEOUT_S", "900"))
FLIP = {"kind": "flip", "layer": 1, "page": 0, "offset": 4097}
DROP = {"kind": "drop", "layer": 0, "page": 1}


@dataclass(frozen=True, slots=True)
class KVSettings:
    """The suite's ``[kv]`` table."""

    chunk_size: int = 64
    block_size: int = 32
    refuse_chunk_size: int | None = None
    load_failure_policy: str = "recompute"
    controls_case: str | None = None
    timing_reps: int = 3
    timing_copies: int = 4
    """Shifted copies of the workload in each timing pass: longer passes, less relative noise."""
    engine: Mapping[str, Any] = field(default_factory=dict)
    tap_chunk_size: int | None = None
    tap_role: str = "kv_both"
    tap_extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_suite(cls, suite: Suite) -> KVSettings:
        where = f"{suite.path} [kv]"
        kv = suite.extra.get("kv")
        if not isinstance(kv, Mapping):
            raise SuiteError(f"{where}: the KV round trip needs a [kv] table")

        def num(key: str, default: int | None, lo: int = 1) -> int | None:
            v = kv.get(key, default)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise SuiteError(f"{where}: field {key!r} must be an int >= {lo}, got {v!r}")
            return v

        tap = kv.get("tap", {})
        if not isinstance(tap, Mapping):
            raise SuiteError(f"{where}: field 'tap' must be a table")
        policy = kv.get("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise SuiteError(f"{where}: field 'load_failure_policy' must be 'recompute' or 'fail'")
        chunk, block = num("chunk_size", 64), num("block_size", 32)
        assert chunk is not None and block is not None
        if chunk % block:
            raise SuiteError(f"{where}: chunk_size {chunk} must be a multiple of block_size {block} "
                             f"(the non-multiple belongs in refuse_chunk_size)")
        refuse = num("refuse_chunk_size", None)
        if refuse is not None and refuse % block == 0:
            raise SuiteError(f"{where}: refuse_chunk_size {refuse} is a multiple of block_size {block}: "
                             f"the connector would accept it")
        controls = kv.get("controls_case")
        if controls is not None and controls not in {c.id for c in suite.cases}:
            raise SuiteError(f"{where}: controls_case {controls!r} is not a case of the suite")
        engine = kv.get("engine", {})
        extra = tap.get("extra_config", {})
        if not isinstance(engine, Mapping) or not isinstance(extra, Mapping):
            raise SuiteError(f"{where}: 'engine' and 'tap.extra_config' must be tables")
        tap_chunk = tap.get("chunk_size", block)
        if not isinstance(tap_chunk, int) or tap_chunk < 1:
            raise SuiteError(f"{where}: field 'tap.chunk_size' must be an int >= 1")
        return cls(chunk, block, refuse, policy, controls, num("timing_reps", 3) or 3,
                   num("timing_copies", 4) or 4, dict(engine), tap_chunk, str(tap.get("role", "kv_both")),
                   dict(extra))


# ---------------------------------------------------------------------------------------------
# one engine process


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    ok: bool
    reason: str
    version: str
    timings: Mapping[str, float]
    rows: tuple[Mapping[str, Any], ...]
    capture: Capture | None
    log: Path
    compat: Mapping[str, Any] = field(default_factory=dict)
    """What :mod:`harness.kv.compat` adapted to the release this phase ran on."""
    skipped: bool = False
    """The release lacks a hook the gate needs (``reason`` names it): a skip, not an error."""

    def row(self, pass_name: str, case: str, lane: str) -> Mapping[str, Any] | None:
        return next((r for r in self.rows if r["pass"] == pass_name and r["case"] == case
                     and r["lane"] == lane), None)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def run_phase(folder: Path, name: str, model: ModelRef, engine: Mapping[str, Any], sampling: Sampling,
              passes: Sequence[Mapping[str, Any]], capture_dir: Path,
              timeout_s: float = PHASE_TIMEOUT_S, python: str | None = None) -> Phase:
    """Start one engine in a child process group (under ``python``: a vLLM release's venv, else this
    interpreter), run ``passes``, read its capture back."""
    folder.mkdir(parents=True, exist_ok=True)
    req, res = folder / f"{name}.request.json", folder / f"{name}.result.jsonl"
    log = folder / f"{name}.engine.log"
    req.write_text(json.dumps({"model": model.path, "engine": dict(engine), "sampling": sampling.to_json(),
                               "passes": list(passes)}, indent=1))
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = engine_env({"PYTHONPATH": path})
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([python or sys.executable, "-m", "harness.kv.phase", str(req), str(res)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=folder,
                                start_new_session=True)
        track(proc)
        try:
            rc = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = -9, True
        finally:
            kill_group(proc)  # vLLM's engine-core and worker processes live in that group too
    lines = [json.loads(x) for x in res.read_text().splitlines() if x.strip()] if res.exists() else []
    head = lines[0] if lines else {}
    ledger.record("kv-phase", model.name, (head.get("timings") or {}).get("engine_start_s"),
                  ok=head.get("kind") == "meta", phase=name, wall_s=time.perf_counter() - t0)
    capture = None
    if capture_dir.is_dir():
        try:
            capture = read_capture(capture_dir)
        except CaptureError:
            capture = None
    if timed_out:
        return Phase(name, False, f"the {name} engine did not finish within {timeout_s:.0f} s", "", {}, (),
                     capture, log)
    complete = bool(lines) and lines[-1].get("kind") == "end"
    compat = dict(head.get("compat") or {})
    if head.get("kind") != "meta" or (rc != 0 and not complete):
        reason = head.get("reason") or f"the {name} engine exited with {rc}"
        return Phase(name, False, reason, str(compat.get("vllm", "")), {}, (), capture, log, compat,
                     skipped=head.get("kind") == "skip")
    return Phase(name, True, "", str(head.get("version", "")), dict(head.get("timings", {})),
                 tuple(x for x in lines[1:] if x.get("kind") == "case"), capture, log, compat)


# ---------------------------------------------------------------------------------------------
# the round trip


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


def _shift(ids: Sequence[int], by: int, vocab: int) -> list[int]:
    """A same-length, same-shape copy of a prompt with other tokens (no shared prefix with it)."""
    return [2 + (int(t) - 2 + by * 37) % (vocab - 2) for t in ids]


def _vocab(model: ModelRef) -> int:
    cfg = Path(model.path) / "config.json"
    try:
        return int(json.loads(cfg.read_text()).get("vocab_size", 32000))
    except (OSError, ValueError):
        return 32000


def _req(case: str, ids: Sequence[int], lane: str = "clean", **kw: Any) -> dict[str, Any]:
    return {"case": case, "lane": lane, "prompt_ids": list(ids), **kw}


def producer_passes(cases: Sequence[Case], reps: int, vocab: int, copies: int = 1) -> list[dict[str, Any]]:
    """Warm-up, then ``reps`` x (record-off, record-on) on shifted copies, then the real write.

    Every timing request is a distinct shift of a case (off passes even shifts, on passes odd), so
    each pass computes and stores as much as the real write, ``copies`` times over."""
    shifted = lambda by, capture: [  # noqa: E731
        _req(c.id, _shift(c.prompt_ids, by + 10 * k, vocab), "scratch", capture=capture)
        for k in range(copies) for c in cases]
    passes = [{"name": "warm", "requests": [_req(cases[0].id, _shift(cases[0].prompt_ids, 1, vocab),
                                                 "scratch", capture=False)]}]
    for r in range(reps):
        passes.append({"name": f"off{r}", "requests": shifted(2 + 2 * r, False)})
        passes.append({"name": f"on{r}", "requests": shifted(3 + 2 * r, True)})
    passes.append({"name": "write", "requests": [_req(c.id, c.prompt_ids) for c in cases]})
    return passes


def consumer_passes(cases: Sequence[Case], control: Case | None,
                    lanes: Sequence[str]) -> list[dict[str, Any]]:
    reqs = [_req(c.id, c.prompt_ids) for c in cases]
    reqs += [_req(c.id, c.prompt_ids, "ref", passive=True, skip_reading=True, capture=False) for c in cases]
    if control is not None:
        reqs += [_req(control.id, control.prompt_ids, lane) for lane in lanes]
    return [{"name": "restore", "requests": reqs}]


def engine_settings(model: ModelRef, kv: KVSettings, transfer: Mapping[str, Any]) -> dict[str, Any]:
    from harness.engines.vllm import default_engine_settings

    return {**default_engine_settings(model), "block_size": kv.block_size, **kv.engine,
            "enable_prefix_caching": False,  # every cached token must come through the connector
            "kv_transfer_config": dict(transfer)}


def _transfer(connector: str, module: str, role: str, harness: Mapping[str, Any],
              policy: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"kv_connector": connector, "kv_connector_module_path": module, "kv_role": role,
            "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {**(extra or {}), "harness": dict(harness)}}


def _fill(v: Any, store: Path) -> Any:
    if isinstance(v, str):
        return v.replace("{store}", str(store))
    if isinstance(v, Mapping):
        return {k: _fill(x, store) for k, x in v.items()}
    return v


def run_roundtrip(model: ModelRef, suite: Suite, cases: Sequence[Case], golden: Mapping[str, Output],
                  run_dir: Path, connector: ConnectorSpec | None = None,
                  decode: Any = None, python: str | None = None) -> RoundTrip:
    """The round trip on the vLLM that ``python`` imports (a release's venv; default: the pin's)."""
    kv = KVSettings.from_suite(suite)
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab = _vocab(model)
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
        t_prod = _transfer(STORE_CLASS, STORE_MODULE, "kv_producer", {
            "capture_dir": str(cap / "producer"), "chunk_size": chunk, "lanes": lanes_p}, policy)
        t_cons = _transfer(STORE_CLASS, STORE_MODULE, "kv_consumer", {
            "capture_dir": str(cap / "consumer"), "chunk_size": chunk, "lanes": lanes_c}, policy)
        name = "harness-store"
    else:
        chunk = kv.tap_chunk_size or kv.block_size
        store = run_dir / "connector-store"
        store.mkdir(parents=True, exist_ok=True)
        extra = _fill(kv.tap_extra, store)
        tap_cls = TAP_CLASS  # the phase names the HMA tap when the release and the connector have it
        tap = {"module": connector.module, "class": connector.cls}
        control_lanes = ["flip"]
        t_prod = _transfer(tap_cls, TAP_MODULE, kv.tap_role, {
            "capture_dir": str(cap / "producer"), "tap": tap}, kv.load_failure_policy, extra)
        t_cons = _transfer(tap_cls, TAP_MODULE, kv.tap_role, {
            "capture_dir": str(cap / "consumer"), "tap": tap, "tap_faults": {"flip": FLIP}},
            kv.load_failure_policy, extra)
        name = connector.text

    eng_p = engine_settings(model, kv, t_prod)
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
        t_ref = _transfer(STORE_CLASS, STORE_MODULE, "kv_producer", {
            "capture_dir": str(cap / "refusal"), "chunk_size": kv.refuse_chunk_size,
            "lanes": {"clean": {"root": str(run_dir / "store-refusal")}}}, kv.load_failure_policy)
        t0 = time.perf_counter()
        refusal = run_phase(run_dir, "refusal", model, engine_settings(model, kv, t_ref), suite.sampling,
                            [{"name": "probe", "requests": [_req(cases[0].id, cases[0].prompt_ids)]}],
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
    if failed is not None or cons is None:
        assert failed is not None
        first = failed.reason.splitlines()[0][:140] if failed.reason else "failed"
        detail = f"{failed.reason}\n--- {failed.name} engine log tail ---\n{failed.tail()}"
        status = "skip" if failed.skipped else "error"
        verdicts += [Verdict(c.id, s.name, status, f"{failed.name} engine: {first}", detail=detail,
                             evidence={"phase": failed.name}) for s in suite.comparators for c in cases]
        extra["engine_skip" if failed.skipped else "engine_error"] = failed.reason
    else:
        assert prod.capture is not None and cons.capture is not None
        evs = {c.id: judge.evidence(c, "clean", prod, cons) for c in cases}
        for spec in suite.comparators:
            for c in cases:
                verdicts.append(judge.verdict(spec.name, c, evs[c.id], golden.get(c.id), cons))
        lane_controls, lanes = judge.lane_controls(control, control_lanes, prod, cons)
        controls += lane_controls
        extra["control_lanes"] = lanes
        controls += judge.memory_controls(evs, golden, cases, spec_names={s.name for s in suite.comparators})
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


def merge_compat(phases: Sequence[Phase]) -> dict[str, Any]:
    """The phases' :mod:`harness.kv.compat` findings as one block: the release, every difference it
    absorbed (once), the hooks it lacked, and the probes' answers."""
    found = [ph.compat for ph in phases if ph.compat]
    if not found:
        return {}
    return {"vllm": found[0].get("vllm", ""),
            "notes": list(dict.fromkeys(n for c in found for n in c.get("notes", ()))),
            "missing": list(dict.fromkeys(m for c in found for m in c.get("missing", ()))),
            "offers": {k: v for c in found for k, v in c.get("offers", {}).items()}}


def refusal_controls(ph: Phase, kv: KVSettings) -> list[Control]:
    """``kv_refusal``'s controls: an engine that starts with the off-grid chunk size, and a refusal
    that does not name the KV-cache group, must both fail it."""
    planted = [("the engine starts with the off-grid chunk size", replace(ph, ok=True, reason=""))]
    if ph.capture is not None and ph.capture.refusal:
        vague = re.sub(r"\bgroup \d+", "a group", ph.capture.refusal)
        planted.append(("the refusal does not name the group",
                        replace(ph, ok=False, capture=replace(ph.capture, refusal=vague))))
    out = []
    for name, phase in planted:
        got = next(v.status for v in refusal_verdicts(phase, kv) if v.comparator == "kv_refusal")
        out.append(Control("kv_refusal", name, "fail", got, got == "fail"))
    return out


def refusal_verdicts(ph: Phase, kv: KVSettings) -> list[Verdict]:
    """``kv_config``: the engine's answer, as a verdict (``refused`` when it refused).
    ``kv_refusal`` (gated): it had to refuse, and the refusal must name the group and both sizes."""
    cid = f"chunk_size={kv.refuse_chunk_size}"
    reason = (ph.capture.refusal if ph.capture is not None else None) or ""
    need = [f"group {0}", f"chunk_size {kv.refuse_chunk_size}", f"block size {kv.block_size}"]
    if ph.ok:
        return [Verdict(cid, "kv_config", "pass", "the engine started", evidence={"started": True}),
                Verdict(cid, "kv_refusal", "fail",
                        f"kv_refusal FAIL: chunk_size {kv.refuse_chunk_size} was accepted",
                        detail=f"{cid}: the connector started with a chunk size that is not a multiple "
                               f"of the block size {kv.block_size}; it must refuse at start")]
    if ph.skipped:
        return [Verdict(cid, c, "skip", f"skip: {ph.reason.splitlines()[0][:140]}", detail=ph.reason)
                for c in ("kv_config", "kv_refusal")]
    if not reason:
        return [Verdict(cid, "kv_config", "error", f"error: {ph.reason.splitlines()[0][:140]}",
                        detail=f"{ph.reason}\n--- engine log tail ---\n{ph.tail()}"),
                Verdict(cid, "kv_refusal", "fail", "kv_refusal FAIL: the engine failed without a refusal",
                        detail=f"{cid}: expected a refusal naming the KV-cache group and both sizes; "
                               f"the engine failed otherwise:\n{ph.reason}")]
    missing = [n for n in need if n not in reason]
    first = reason.splitlines()[0]
    verdicts = [Verdict(cid, "kv_config", "refused", f"refused: {first[:160]}", detail=reason,
                        evidence={"reason": reason})]
    if missing:
        verdicts.append(Verdict(cid, "kv_refusal", "fail",
                                f"kv_refusal FAIL: refusal does not name {missing}",
                                detail=f"{cid}: refused, but the reason must name {need}:\n  {reason}",
                                evidence={"reason": reason, "missing": missing}))
    else:
        verdicts.append(Verdict(cid, "kv_refusal", "pass",
                                f"kv_refusal pass: refused at start: {first[:140]}",
                                evidence={"reason": reason}))
    return verdicts


# ---------------------------------------------------------------------------------------------
# turning captures into evidence and verdicts


@dataclass
class Judge:
    model: str
    suite: str
    chunk: int
    decode: Any = None
    _written: dict[tuple[str, str, int], Page] | None = None
    notes: list[str] = field(default_factory=list)

    def written(self, prod: Phase) -> dict[tuple[str, str, int], Page]:
        """First written page of every id in the real write pass (scratch lanes are timing only)."""
        if self._written is None:
            assert prod.capture is not None
            out: dict[tuple[str, str, int], Page] = {}
            for p in prod.capture.side("written"):
                if p.tag.lane != "clean":
                    continue
                first = out.get(p.ref.id)
                if first is None and p.offset is not None:
                    out[p.ref.id] = p
                elif first is not None and first.digest != p.digest:
                    self.notes.append(f"producer nondeterminism: {p.ref.describe()} written twice with "
                                      f"different bytes ({first.digest} vs {p.digest})")
            self._written = out
        return self._written

    def evidence(self, case: Case, lane: str, prod: Phase, cons: Phase) -> CaseEvidence:
        assert cons.capture is not None and prod.capture is not None
        setup = cons.capture.setup or prod.capture.setup
        n = len(case.prompt_ids)
        want = expected_hit_tokens(n, self.chunk)
        expected = []
        for g in setup.get("groups", []):
            if not g.get("paged"):
                continue
            bs = int(g["block_size"])
            keys = prefix_keys(case.prompt_ids, bs, want)
            first = first_block_in_window(want, g.get("window"), bs)
            for layer in g["layers"]:
                for shard in range(int(setup.get("tp", 1))):
                    expected += [PageRef(k, layer, int(g["index"]), j * bs, (j + 1) * bs, shard)
                                 for j, k in enumerate(keys) if j >= first]
        mine = lambda tag: tag.case == case.id and tag.lane == lane  # noqa: E731
        restored = tuple(p for p in cons.capture.side("restored") if mine(p.tag))
        problems = tuple(Problem(p.ref, p.kind, p.reason) for p in cons.capture.problems if mine(p.tag))
        for s in cons.capture.store_problems:
            if s.get("case") == case.id and s.get("lane") == lane:
                problems += tuple(Problem(r, str(s["kind"]), str(s["reason"])) for r in expected)
        facts = [r for r in cons.capture.requests if r.case == case.id and r.lane == lane]
        row = cons.row("restore", case.id, lane)
        stored: dict[str, int] = {}
        if prod.capture.stored:
            for key in prefix_keys(case.prompt_ids, self.chunk):
                stored[key] = sum(1 for s in prod.capture.stored if s["key"] == key and not s["dedup"])
            stored = {k: v for k, v in stored.items() if v}
        notes = tuple(self.notes) + (f"captures: {prod.capture.folder.parent.parent.name}/capture/"
                                     f"{{producer,consumer}}",)
        return CaseEvidence(
            model=self.model, case_id=case.id, lane=lane, prompt_len=n, chunk_size=self.chunk,
            expected_hit=want, expected=tuple(expected), written=self.written(prod), restored=restored,
            problems=problems, engine_cached=row.get("num_cached_tokens") if row else None,
            connector_matched=facts[-1].matched if facts else None,
            connector_external=facts[-1].external if facts else None, stored_times=stored,
            finish_reason=str(row.get("finish_reason", "")) if row else "",
            error=None if row else "the consumer engine returned no result for this request",
            notes=notes)

    def output(self, row: Mapping[str, Any] | None, case_id: str) -> Output:
        from harness.engines.vllm import output_from_fields

        if row is None:
            return Output(case_id, (), error="the consumer engine returned no result for this case")
        return output_from_fields(case_id, row)

    def verdict(self, comparator: str, case: Case, ev: CaseEvidence, golden: Output | None,
                cons: Phase) -> Verdict:
        if comparator == "byte_equal":
            return ByteEqual(self.suite).judge_kv(case, ev)
        if comparator == "kv_hits":
            return KVHits(self.suite).judge_kv(case, ev)
        from harness import compare

        cand = self.output(cons.row("restore", case.id, "clean"), case.id)
        ref = self.output(cons.row("restore", case.id, "ref"), case.id)
        if golden is None:
            return Verdict(case.id, comparator, "error", "no golden output for this case")
        comp = compare.build(comparator, {}, self.decode) if comparator != "strict" else Strict(self.decode)
        v = comp.compare(golden, cand, case)
        pos = first_divergence(ref.token_ids, cand.token_ids)
        return replace(v, evidence={**v.evidence, "vs_in_engine_reference": "equal" if pos is None
                                    else f"differs at token {pos}"})

    def lane_controls(self, control: Case | None, lanes: Sequence[str], prod: Phase,
                      cons: Phase) -> tuple[list[Control], dict[str, Any]]:
        """The planted-fault lanes: the gate must fail them, naming the planted page.

        Returns the controls and, per lane, what was planted and the verdicts it got."""
        if control is None:
            return [], {}
        assert cons.capture is not None
        planted = read_planted(cons.capture.folder)
        out = []
        info: dict[str, Any] = {}
        for lane in lanes:
            ev = self.evidence(control, lane, prod, cons)
            v = ByteEqual(self.suite).judge_kv(control, ev)
            fact = planted.get(lane)
            info[lane] = {"case": control.id, "planted": fact, "byte_equal": v.to_json(),
                          "kv_hits": KVHits(self.suite).judge_kv(control, ev).to_json()}
            if fact is None:
                out.append(Control("byte_equal", f"engine lane {lane}: nothing planted", "fail",
                                   "unplantable", False, "the faulty store never served the chosen layer"))
                continue
            named = _names_planted(v, fact)
            who = "store" if "chunk" in fact else "tap, in the paged buffer after the load,"
            what = (f"{who} flips byte {fact.get('offset')} of layer {fact['layer']} tokens "
                    f"[{fact['start']}, {fact['end']})" if fact["kind"] == "flip" else
                    f"{who} drops layer {fact['layer']} tokens [{fact['start']}, {fact['end']})")
            out.append(Control("byte_equal", f"in-engine: {what}", "fail", v.status,
                               v.status == "fail" and named,
                               v.summary if named else
                               f"{v.summary}; the verdict does not name the planted page"))
            if fact["kind"] == "drop" and (cons.capture.setup or {}).get("failed_loads") == UNREPORTED:
                info[lane]["recompute"] = (
                    "not planted: vLLM cannot recompute a failed synchronous load with several KV-cache "
                    "groups (block-level failures make its scheduler raise), so the connector records "
                    "the page missing and reports nothing; kv_hits stays guarded by the in-memory controls")
            elif fact["kind"] == "drop":
                h = KVHits(self.suite).judge_kv(control, ev)
                out.append(Control("kv_hits", f"in-engine: {what} (engine recomputes it)", "fail",
                                   h.status, h.status == "fail", h.summary))
        return out, info

    def memory_controls(self, evs: Mapping[str, CaseEvidence], golden: Mapping[str, Output],
                        cases: Sequence[Case], spec_names: set[str]) -> list[Control]:
        """In-memory controls over the real captured pages (harness.controls) and hit counts."""
        from harness.compare.byte_equal import judge_pages
        from harness.controls import page_controls, run_controls
        from harness.kv.digest import digest_bytes

        out: list[Control] = []
        written: dict[Any, bytes] = {}
        for ev in evs.values():
            for ref in ev.expected:
                w = ev.written.get(ref.id)
                if w is not None and ref.id not in written:
                    try:
                        written[ref.id] = w.read()
                    except CaptureError:
                        continue
        refs = {ref.id: ref for ev in evs.values() for ref in ev.expected}

        def judge(w: Mapping[Any, bytes], r: Mapping[Any, bytes]) -> str:
            wp = {k: MemoryPage(refs[k], digest_bytes(v), v) for k, v in w.items()}
            rp = [MemoryPage(refs[k], digest_bytes(v), v) for k, v in r.items()]
            res = judge_pages([refs[k] for k in w], wp, rp, {})
            return "pass" if all(j.kind == "equal" for j in res) else "fail"

        if "byte_equal" in spec_names:
            out += page_controls("byte_equal", judge, written)
        if "kv_hits" in spec_names:
            best = max(evs.values(), key=lambda e: e.expected_hit, default=None)
            if best is not None and best.expected_hit:
                case = next(c for c in cases if c.id == best.case_id)
                v = KVHits(self.suite).judge_kv(case, replace(best, engine_cached=0))
                out.append(Control("kv_hits", "engine reports 0 cached tokens (silent recompute)", "fail",
                                   v.status, v.status == "fail", v.summary))
                half = best.restored[: len(best.restored) // 2]
                v = KVHits(self.suite).judge_kv(case, replace(best, restored=half))
                out.append(Control("kv_hits", "half the claimed pages never restored", "fail",
                                   v.status, v.status == "fail", v.summary))
        for name in spec_names - {"byte_equal", "kv_hits"}:
            from harness import compare

            comp = compare.build(name, {}, self.decode) if name != "strict" else Strict(self.decode)
            out += run_controls(comp, cases, golden)
        return out


def _names_planted(v: Verdict, fact: Mapping[str, Any]) -> bool:
    """Whether a verdict's evidence names the planted page (layer + token range, + byte for a flip)."""
    kind = "differ" if fact["kind"] == "flip" else "missing"
    for d in v.evidence.get(kind, ()):
        if d["layer"] == fact["layer"] and d["start"] == fact["start"] and d["end"] == fact["end"]:
            return fact["kind"] != "flip" or d.get("offset") == fact.get("offset")
    return False


def figures(prod: Phase, cons: Phase, judge: Judge, evs: Mapping[str, CaseEvidence],
            cases: Sequence[Case], kv_copies: int = 1) -> dict[str, Any]:
    """Pages compared, capture overhead, compare throughput vs memcpy, engine start times."""
    from harness.kv.bench import throughput

    t = prod.timings
    offs = [v for k, v in t.items() if k.startswith("pass_off")]
    ons = [v for k, v in t.items() if k.startswith("pass_on")]
    fig: dict[str, Any] = {
        "producer_engine_start_s": t.get("engine_start_s"),
        "consumer_engine_start_s": cons.timings.get("engine_start_s"),
        "pass_times_s": {k: round(v, 4) for k, v in t.items() if k.startswith("pass_")},
        "pages_compared": sum(len(e.expected) for e in evs.values()),
    }
    if offs and ons:
        off, on = float(np.median(offs)), float(np.median(ons))
        fig.update(record_off_s=off, record_on_s=on, capture_overhead_pct=(on / off - 1.0) * 100.0)
    if prod.capture is not None:
        # the connector's own clock over everything it captured, scaled to one record-on pass (the
        # write pass captures 1/copies of one): the low-noise view of the same overhead
        copies = max(1, int(kv_copies))
        per_pass = prod.capture.capture_seconds / (len(ons) + 1 / copies) if ons else 0.0
        fig["capture_seconds_in_connector"] = prod.capture.capture_seconds
        fig["capture_seconds_per_pass"] = per_pass
        fig["captured_bytes_producer"] = prod.capture.captured_bytes
        if offs:
            fig["capture_connector_pct"] = per_pass / float(np.median(offs)) * 100.0
    pairs: list[tuple[bytes, bytes]] = []
    for ev in evs.values():
        for r in ev.restored:
            w = ev.written.get(r.ref.id)
            if w is not None:
                try:
                    pairs.append((w.read(), r.read()))
                except CaptureError:
                    continue
    if pairs:
        by_case = {c.id: c for c in cases}
        bench = throughput(lambda: [ByteEqual().judge_kv(by_case[cid], ev) for cid, ev in evs.items()], pairs)
        fig["throughput"] = bench
        if bench.get("memcpy_Bps"):
            fig["compare_vs_memcpy"] = bench["compare_Bps"] / bench["memcpy_Bps"]
    return fig
