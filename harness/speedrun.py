"""``harness speed`` / ``make speed``: a candidate's output tok/s and TTFT at c1/c4/c8 beside the
pinned oracle's, one engine start per side, the ratios measured in one run.

An engine with the :class:`~harness.abilities.SpeedLevels` ability (vLLM offline, vLLM's server, any
OpenAI-compatible server) replays the workload at every level in one start; one without it
(transformers, a CLI) is timed once, at its own concurrency, and the table says so. The result is
written atomically under ``reports/speed/<model>/``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.abilities import SpeedLevels
from harness.api import Case, Runner, Sampling
from harness.engines import RunnerContext, make_runner
from harness.models import resolve_model
from harness.oracle import load_or_record
from harness.pin import oracle_pin
from harness.provenance import device_facts, git_dirty, git_sha, now_utc
from harness.records import new_record_id
from harness.speed import Speed, candidate_speed, speed_report
from harness.suites import find_suite
from harness.workspace import Workspace

LEVELS = (1, 4, 8)


@dataclass(frozen=True, slots=True)
class SpeedRun:
    path: Path
    data: dict[str, Any]


def levels_of(runner: Runner, cases: Sequence[Case], sampling: Sampling,
              levels: Sequence[int]) -> tuple[dict[int, Speed], str]:
    """(concurrency -> Speed, how) for one started runner."""
    if isinstance(runner, SpeedLevels):
        return runner.measure_speeds(cases, sampling, levels), "every level in one engine start"
    runner.run(cases, sampling)
    speed = candidate_speed(runner.facts(), len(cases), None)
    if speed is None:
        return {}, "the engine reported no timings"
    return {speed.concurrency: speed}, f"timed once at its own concurrency (c{speed.concurrency})"


def _side(spec: str, model: Any, cases: Sequence[Case], sampling: Sampling, levels: Sequence[int],
          run_dir: Path, name: str | None = None) -> tuple[dict[int, Speed], str, dict[str, Any]]:
    runner = make_runner(spec, model, RunnerContext(run_dir=run_dir, name=name))
    try:
        runner.start()
        speeds, how = levels_of(runner, cases, sampling, levels)
    finally:
        runner.close()
    return speeds, how, runner.info().to_json()


def run_speed(ws: Workspace, model_name: str, suite_name: str, candidate: str,
              levels: Sequence[int] = LEVELS) -> SpeedRun:
    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    golden, _ = load_or_record(ws, model, suite, auto_record=True)
    ws.runs.mkdir(parents=True, exist_ok=True)
    cand, cand_how, cand_info = _side(candidate, model, golden.cases, golden.sampling, levels, ws.runs)
    pin = oracle_pin()
    oracle, oracle_how, _ = _side(pin.engine, model, golden.cases, golden.sampling, levels, ws.runs,
                                  name="oracle-speed")
    rows = []
    for c in sorted(set(cand) | set(oracle)):
        rep = speed_report(cand.get(c), oracle.get(c), f"the oracle was not timed at c{c}")
        rows.append({"concurrency": c, **rep})
    created = now_utc()
    sha = git_sha(ws.root)
    data = {"id": new_record_id(created, sha, f"speed-{candidate}"), "kind": "speed", "created": created,
            "model": {"name": model.name, "digest": model.digest},
            "suite": {"name": suite.name, "version": suite.version}, "candidate": cand_info,
            "oracle": {"pin": pin.spec}, "harness": {"sha": sha, "dirty": git_dirty(ws.root)},
            "device": device_facts(), "levels": list(levels),
            "how": {"candidate": cand_how, "oracle": oracle_how}, "rows": rows}
    folder = ws.root / "reports" / "speed" / model.slug
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data['id']}.json"
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return SpeedRun(path, data)
