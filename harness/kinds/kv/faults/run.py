"""The KV connector under storage faults (a suite whose ``[kv]`` table has a ``[kv.faults]`` lane).

The round trip's phases, one storage fault at a time (:mod:`harness.kinds.kv.faults.inject` says what
each fault is and how it is applied):

1. **producer** (clean): the bystander cases, then the target case, each in its own pass, through
   the connector (the harness store, or the tap around a vendor's connector); after each pass the
   files in the store are listed, so the target's own files are known whatever the connector's
   layout;
2. per **store-time fault** (``no_space``, ``read_only``): a producer of its own, the store folder a
   real small tmpfs or a read-only bind mount in a private mount namespace;
3. per fault, a **consumer** (a fresh engine) over a private copy of the store with the fault
   applied: every case (``restore`` pass), then every case again reading no cache, one request at
   a time (``ref``: the request run alone, the reference for its tokens);
4. **cycles** (``evict_cycles``): one consumer, prefix caching on and a KV pool of ``pool_blocks``,
   runs every case ``rounds`` times: the engine evicts the prefixes itself and the connector must
   onboard them again, byte-equal, every round.

The pages each consumer loaded are read back through the capture (the tap, or the harness store's
own), compared with what the clean producer wrote, and each row is judged by
:mod:`harness.kinds.kv.faults.verdict`. The connector doubles (:mod:`harness.kinds.kv.faults.controls`) go
through the same faults as the run's controls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import Case, EngineInfo, Output
from harness.compare.strict import first_divergence
from harness.kinds.kv.config import STORE_CLASS, STORE_MODULE, TAP_CLASS, TAP_MODULE, ConnectorSpec
from harness.kinds.kv.faults.controls import run_double_controls
from harness.kinds.kv.faults.inject import (
    BY_NAME,
    FAULTS,
    FaultError,
    build_shim,
    copy_store,
    damage,
    mount_wrap,
    opened,
    rebase,
    settle_kept,
    shim_env,
    shim_mode,
    store_difference,
)
from harness.kinds.kv.faults.verdict import (
    RowFacts,
    classify,
    comparator,
    planted_wrong_page,
    vacuity_controls,
    verdict,
)
from harness.kinds.kv.judge import Judge
from harness.kinds.kv.passes import Phase, merge_compat, request, run_phase
from harness.kinds.kv.roundtrip import RoundTrip
from harness.kinds.kv.settings import FaultSettings, KVSettings, engine_settings, fill_store, transfer
from harness.models import ModelRef
from harness.suites import Suite

PAGE = 4096


class Rig:
    """Starts the engines of one connector: producer and consumer settings, one folder per phase."""

    def __init__(self, model: ModelRef, suite: Suite, kv: KVSettings, connector: ConnectorSpec | None,
                 run_dir: Path, python: str | None) -> None:
        self.model, self.suite, self.kv, self.connector = model, suite, kv, connector
        self.run_dir, self.python = run_dir, python
        fs = kv.faults
        assert fs is not None
        self.fs: FaultSettings = fs
        self.chunk = kv.chunk_size if connector is None else (kv.tap_chunk_size or kv.block_size)

    def transfer(self, name: str, store: Path, consumer: bool,
                 lanes: Sequence[str] = ("clean",)) -> dict[str, Any]:
        cap = self.run_dir / "capture" / name
        if self.connector is None:
            return transfer(STORE_CLASS, STORE_MODULE, "kv_consumer" if consumer else "kv_producer", {
                "capture_dir": str(cap), "chunk_size": self.chunk,
                "lanes": {lane: {"root": str(store)} for lane in lanes}}, self.kv.load_failure_policy)
        return transfer(TAP_CLASS, TAP_MODULE, self.kv.tap_role, {
            "capture_dir": str(cap), "tap": {"module": self.connector.module, "class": self.connector.cls}},
            self.kv.load_failure_policy, fill_store(self.kv.tap_extra, store))

    def phase(self, name: str, engine: Mapping[str, Any], passes: Sequence[Mapping[str, Any]],
              wrap: Sequence[str] = (), env_with: Any = None) -> Phase:
        return run_phase(self.run_dir, name, self.model, engine, self.suite.sampling, passes,
                         self.run_dir / "capture" / name, timeout_s=self.fs.timeout_s, python=self.python,
                         wrap=wrap, env_with=env_with)

    def produce(self, name: str, store: Path, bystanders: Sequence[Case], target: Case,
                wrap: Sequence[str] = ()) -> Phase:
        store.mkdir(parents=True, exist_ok=True)
        eng = engine_settings(self.model, self.kv, self.transfer(name, store, consumer=False))
        listing = lambda p: {"root": str(store), "out": str(self.run_dir / f"{name}.files-{p}.json")}  # noqa: E731
        return self.phase(name, eng, [
            {"name": "write", "requests": [request(c.id, c.prompt_ids) for c in bystanders],
             "list_files": listing("write")},
            {"name": "target", "requests": [request(target.id, target.prompt_ids)],
             "list_files": listing("target")}],
            wrap=wrap)

    def files(self, name: str, pass_name: str) -> list[str]:
        p = self.run_dir / f"{name}.files-{pass_name}.json"
        return list(json.loads(p.read_text())) if p.exists() else []

    def consume(self, name: str, store: Path, cases: Sequence[Case], env_with: Any = None) -> Phase:
        eng = engine_settings(self.model, self.kv, self.transfer(name, store, consumer=True))
        return self.phase(name, eng, [
            {"name": "restore", "requests": [request(c.id, c.prompt_ids) for c in cases]}, ref_pass(cases)],
            env_with=env_with)

    def cycle(self, name: str, store: Path, cases: Sequence[Case]) -> Phase:
        lanes = [f"r{k}" for k in range(self.fs.rounds)]
        t = self.transfer(name, store, consumer=True, lanes=["clean", *lanes])
        eng = {**engine_settings(self.model, self.kv, t), "enable_prefix_caching": True,
               "num_gpu_blocks_override": self.fs.pool_blocks, "max_model_len": self.fs.max_model_len}
        passes = [{"name": f"round{k}", "requests": [request(c.id, c.prompt_ids, lane) for c in cases]}
                  for k, lane in enumerate(lanes)]
        return self.phase(name, eng, [*passes, ref_pass(cases)])


def ref_pass(cases: Sequence[Case]) -> dict[str, Any]:
    """Every case again, one at a time, reading no cache: the request run alone."""
    return {"name": "ref", "mode": "alone", "requests": [
        request(c.id, c.prompt_ids, "ref", passive=True, skip_reading=True, capture=False) for c in cases]}


def no_space_bytes(files_before: Sequence[str], files_target: Sequence[str], fraction: float) -> int:
    """A filesystem that holds the bystanders' files and ``fraction`` of the target's (tmpfs counts
    whole pages)."""
    size = lambda p: -(-Path(p).stat().st_size // PAGE) * PAGE  # noqa: E731
    before = set(files_before)
    mine = [p for p in files_target if p not in before]
    total = sum(size(p) for p in before) + int(sum(size(p) for p in mine) * fraction)
    return max(PAGE, total // PAGE * PAGE)


def served(judge: Judge, prod: Phase, cons: Phase, case: str, lane: str) -> tuple[int, int, int]:
    """Pages of ``case`` in ``lane`` the consumer loaded; of those, how many differ from what the
    producer wrote, and how many the producer never wrote (cannot be vouched for)."""
    if cons.capture is None or prod.capture is None:
        return 0, 0, 0
    written = judge.written(prod)
    pages = [p for p in cons.capture.side("restored") if p.tag.case == case and p.tag.lane == lane]
    unknown = [p for p in pages if p.ref.id not in written]
    wrong = [p for p in pages if p.ref.id in written and written[p.ref.id].digest != p.digest]
    return len(pages), len(wrong), len(unknown)


def tokens_wrong(cons: Phase, cases: Sequence[Case], pass_name: str, lane: str,
                 golden: Mapping[str, Output]) -> tuple[list[str], dict[str, str]]:
    """``case: why`` for each case whose tokens differ from the same request run alone (the ``ref``
    pass; the no-connector golden where the release has no cache-free reference); and, per case,
    how it stands against the golden (reported)."""
    bad, vs_golden = [], {}
    for c in cases:
        row = cons.row(pass_name, c.id, lane)
        if row is None:
            continue
        got = [int(t) for t in row.get("token_ids", ())]
        ref = cons.row("ref", c.id, "ref")
        want = [int(t) for t in ref["token_ids"]] if ref is not None else (
            list(golden[c.id].token_ids) if c.id in golden else None)
        g = golden.get(c.id)
        if g is not None:
            pos = first_divergence(list(g.token_ids), got)
            vs_golden[c.id] = "equal" if pos is None else f"differs at token {pos}"
        if want is not None and (pos := first_divergence(want, got)) is not None:
            bad.append(f"{c.id} ({lane}) differs from the request alone at token {pos}")
    return bad, vs_golden


def named_problems(cons: Phase, case: str) -> tuple[str, ...]:
    if cons.capture is None:
        return ()
    return tuple(dict.fromkeys(f"{p.kind}: {p.reason}" for p in cons.capture.problems if p.tag.case == case))


def refused(cons: Phase, case: str, pass_name: str, lane: str) -> str | None:
    row = cons.row(pass_name, case, lane)
    if row is not None and (row.get("error") or row.get("finish_reason") == "error"):
        return str(row.get("error") or "finish_reason error")
    return None


def run_faults(model: ModelRef, suite: Suite, cases: Sequence[Case], golden: Mapping[str, Output],
               run_dir: Path, kv: KVSettings, connector: ConnectorSpec | None = None, decode: Any = None,
               python: str | None = None) -> RoundTrip:
    """Every fault of ``[kv.faults]`` under ``connector`` (None: the harness store) on the vLLM that
    ``python`` imports (default: the pin's)."""
    fs = kv.faults
    assert fs is not None
    run_dir.mkdir(parents=True, exist_ok=True)
    rig = Rig(model, suite, kv, connector, run_dir, python)
    names = list(fs.faults or [f.name for f in FAULTS])
    target = next(c for c in cases if c.id == fs.target)
    bystanders = [c for c in cases if c.id != fs.target]
    judge = Judge(model.name, suite.name, rig.chunk, decode)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    shim = build_shim(run_dir / "shim")
    controls, double_info = run_double_controls(names, run_dir / "doubles", shim)
    timings["doubles_s"] = time.perf_counter() - t0

    clean = run_dir / "store-clean"
    prod = rig.produce("producer", clean, bystanders, target)
    timings["producer_engine_start_s"] = prod.timings.get("engine_start_s", float("nan"))
    phases: list[Phase] = [prod]
    rows: list[RowFacts] = []
    before, after = rig.files("producer", "write"), rig.files("producer", "target")
    target_files = [p for p in after if p not in set(before)]
    if not prod.ok:
        rows = [RowFacts(n, False, f"the clean producer failed: {prod.reason}",
                         engine_error=f"producer: {prod.reason}") for n in names]
    for name in names if prod.ok else ():
        f = BY_NAME[name]
        store = run_dir / f"store-{name}"
        t1 = time.perf_counter()
        fact: dict[str, Any] = {}
        try:
            if f.when == "cycle":
                copy_store(clean, store)
                cons = rig.cycle(f"consumer-{name}", store, cases)
                phases.append(cons)
                rows.append(cycle_row(judge, prod, cons, cases, fs.rounds, golden))
            elif f.when == "store":
                size = no_space_bytes(before, after, fs.no_space_fraction)
                keep = run_dir / f"store-{name}.kept"
                p2 = rig.produce(f"producer-{name}", store, bystanders, target,
                                 wrap=mount_wrap(name, store, keep, size))  # type: ignore[arg-type]
                settle_kept(store, keep)
                phases.append(p2)
                fact = {"small_fs_bytes": size} if name == "no_space" else {"mount": "read-only bind"}
                diff = store_difference(clean, store)
                cons = rig.consume(f"consumer-{name}", store, cases)
                phases.append(cons)
                rows.append(consumer_row(name, judge, prod, cons, cases, target, golden, diff is not None,
                                         diff or "the store under the fault equals the clean one", p2, fact))
            else:
                copy_store(clean, store)
                fact, mine = damage(name, rebase(target_files, clean, store))
                log = run_dir / f"consumer-{name}.opens.log"
                mode = shim_mode(name)
                cons = rig.consume(f"consumer-{name}", store, cases,
                                   env_with=lambda env, mine=mine, log=log, mode=mode:
                                   shim_env(shim, mode, mine, log, env))
                phases.append(cons)
                seen = opened(log)
                how = f"{fact}; {seen or 'the damaged files were never opened'}"
                rows.append(consumer_row(name, judge, prod, cons, cases, target, golden, seen is not None,
                                         how, None, fact))
        except FaultError as e:
            rows.append(RowFacts(name, False, f"not applied on this machine: {e}"))
        timings[f"{name}_wall_s"] = time.perf_counter() - t1

    verdicts = [verdict(r, BY_NAME[r.fault].how) for r in rows]
    controls += vacuity_controls(verdicts)
    controls += [planted_wrong_page(r) for r in rows if BY_NAME[r.fault].when == "cycle"]
    for ph in phases:
        timings[f"{ph.name}_engine_start_s"] = ph.timings.get("engine_start_s", float("nan"))
    name = "harness-store" if connector is None else connector.text
    version = next((ph.version for ph in phases if ph.version), "")
    info = EngineInfo(name, "vllm", version or "unknown", settings={
        "connector": name, "chunk_size": rig.chunk, "block_size": kv.block_size,
        "load_failure_policy": kv.load_failure_policy, "faults": fs.to_json()})
    extra: dict[str, Any] = {
        "run_dir": run_dir.name, "mode": "faults", "connector": name, "chunk_size": rig.chunk,
        "target": target.id, "target_files": [str(Path(p).relative_to(clean)) for p in target_files],
        "faults": {r.fault: {"how": BY_NAME[r.fault].how, "applied": r.applied, "applied_how": r.applied_how,
                             "outcome": classify(r), **dict(r.extra)} for r in rows},
        "doubles": double_info}
    if compat := merge_compat(phases):
        extra["compat"] = compat
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.evidence["outcome"]] = counts.get(v.evidence["outcome"], 0) + 1
    summary = (f"kv-faults ({name}): " + ", ".join(f"{v.case_id} {v.evidence['symbol']}" for v in verdicts)
               + f" — {counts.get('wrong', 0)} served wrong, {counts.get('engine_error', 0)} engine errors, "
               f"{counts.get('vacuous', 0)} vacuous")
    gates = tuple(comparator(n) for n in names)
    return RoundTrip(tuple(verdicts), tuple(controls), gates, summary, info, timings, extra, run_dir)


def consumer_row(name: str, judge: Judge, prod: Phase, cons: Phase, cases: Sequence[Case], target: Case,
                 golden: Mapping[str, Output], applied: bool, how: str, store_phase: Phase | None,
                 fact: Mapping[str, Any]) -> RowFacts:
    n, wrong, unknown = served(judge, prod, cons, target.id, "clean")
    bad, vs_golden = tokens_wrong(cons, cases, "restore", "clean", golden)
    errors = []
    if store_phase is not None and not store_phase.ok:
        errors.append(f"producer: {store_phase.reason}")
    if not cons.ok:
        errors.append(f"consumer: {cons.reason}")
    named = named_problems(cons, target.id)
    if store_phase is not None and store_phase.capture is not None:
        named += tuple(dict.fromkeys(f"{p.kind}: {p.reason}" for p in store_phase.capture.problems))
    return RowFacts(name, applied, how, n, wrong, tuple(bad), "; ".join(errors) or None,
                    refused(cons, target.id, "restore", "clean"), named,
                    {"fact": dict(fact), "pages_unverified": unknown, "tokens_vs_golden": vs_golden,
                     "cached_tokens": {c.id: (cons.row("restore", c.id, "clean") or {}).get(
                         "num_cached_tokens") for c in cases}})


def cycle_row(judge: Judge, prod: Phase, cons: Phase, cases: Sequence[Case], rounds: int,
              golden: Mapping[str, Output]) -> RowFacts:
    n = wrong = unknown = 0
    bad: list[str] = []
    onboard: dict[str, int] = {}
    for k in range(rounds):
        lane = f"r{k}"
        for c in cases:
            a, b, u = served(judge, prod, cons, c.id, lane)
            n, wrong, unknown = n + a, wrong + b, unknown + u
        bad += tokens_wrong(cons, cases, f"round{k}", lane, golden)[0]
        if cons.capture is not None:
            onboard[lane] = sum(r.external for r in cons.capture.requests if r.lane == lane)
    later = {lane: v for lane, v in onboard.items() if lane != "r0" and v > 0}
    applied = bool(later)
    how = (f"tokens onboarded from the connector per round {onboard} (rounds after the first: the engine "
           f"had evicted them)" if applied else
           f"no tokens onboarded after the first round ({onboard or 'no capture'}): nothing was evicted")
    return RowFacts("evict_cycles", applied, how, n, wrong, tuple(bad),
                    None if cons.ok else f"consumer: {cons.reason}", None, (),
                    {"rounds": rounds, "onboarded_tokens": onboard, "pages_unverified": unknown})

