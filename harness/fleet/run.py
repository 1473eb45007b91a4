"""One matrix entry, run through the gate's public entry points, and the line it leaves for the merge.

Every entry writes its record the usual way (``reports/records/…``) and one JSON line to
``reports/fleet/results-<worker>.jsonl`` (one file per pytest-xdist worker, so workers never share
a file): which entry ran, where, with which outcome and record. The merge reads these lines to tell
an entry that ran from one that never did.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.fleet.machine import device_class
from harness.fleet.recording import Goldens, with_goldens
from harness.fleet.spec import Entry
from harness.models import resolve_model
from harness.pipeline import run_ab, run_gate
from harness.records import Record
from harness.suites import find_suite
from harness.workspace import Workspace

RESULTS_DIR = ("reports", "fleet")


@dataclass(frozen=True, slots=True)
class EntryResult:
    entry: Entry
    record: Record
    path: Path
    wall_s: float
    goldens: str
    worker: str

    def line(self, root: Path) -> dict[str, Any]:
        rel = self.path.relative_to(root).as_posix() if self.path.is_relative_to(root) else str(self.path)
        return {"id": self.entry.id, "device": self.entry.device, "expect": self.entry.expect,
                "outcome": self.record.outcome, "summary": self.record.summary, "record": rel,
                "record_id": self.record.id, "wall_s": round(self.wall_s, 2), "goldens": self.goldens,
                "worker": self.worker, "host": platform.node(), "device_class": device_class()}


def worker_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def results_file(ws: Workspace) -> Path:
    return ws.root.joinpath(*RESULTS_DIR) / f"results-{worker_name()}.jsonl"


def run_entry(ws: Workspace, entry: Entry, *, auto_record: bool = True) -> EntryResult:
    """Run ``entry``, write its record and its results line."""
    t0 = time.perf_counter()
    if entry.kind == "ab":
        res = run_ab(ws, entry.model, entry.suite, entry.a, entry.candidate)
        record, path, how = res.record, res.path, Goldens("none (A/B: no goldens)")
    else:
        model, suite = resolve_model(entry.model, ws), find_suite(ws.suites, entry.suite)
        candidate = entry.candidate or "vllm"  # a KV round trip drives the pinned vLLM

        def gate(auto: bool):  # noqa: ANN202 - harness.pipeline.GateResult
            return run_gate(ws, model, suite, candidate, auto_record=auto, connector=entry.connector)

        res, how = with_goldens(ws, entry.model, model.slug, entry.suite, gate, may_record=auto_record)
        record, path = res.record, res.path
    out = EntryResult(entry, record, path, time.perf_counter() - t0, how.how, worker_name())
    f = results_file(ws)
    f.parent.mkdir(parents=True, exist_ok=True)
    with f.open("a") as fh:
        fh.write(json.dumps(out.line(ws.root), sort_keys=True) + "\n")
    return out
