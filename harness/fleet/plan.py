"""The plan: matrix entries with their needs and estimates, split into shards, as JSON for CI.

``harness plan [--device cpu|cuda] [--shard i/n]`` prints the entries (all of them, one device's,
or one shard's); ``harness plan --device cuda --shards [N]`` prints the shards themselves. Both
print a JSON object holding only ``include``, so a workflow passes it straight to a job matrix::

    strategy:
      matrix: ${{ fromJSON(needs.plan.outputs.cuda) }}

Entries (``--shard`` or none)::

    {"include": [{"id": "cpu/tiny-llama/smoke/hf", "group": "transformers", "kind": "gate",
                  "device": "cpu", "model": "tiny-llama", "suite": "smoke", "candidate": "hf",
                  "connector": null, "a": "", "gpus": 0, "gpu_memory_gib": 0.0,
                  "expect": "pass", "because": "",
                  "estimate_s": 3.6, "estimate_from": "records: median of 5", "shard": "1/2"}]}

Shards (``--shards``)::

    {"include": [{"shard": "1/2", "index": 1, "of": 2, "device": "cpu", "entries": 3,
                  "estimate_s": 120.4, "gpus": 0, "gpu_memory_gib": 0.0, "workers": "auto",
                  "runs_on": ["ubuntu-latest"], "ids": ["cpu/tiny-llama/smoke/hf", "…"]}]}

Standard library only: ``python -m harness.fleet plan …`` runs before anything is installed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.fleet.estimate import Estimate, estimate, record_paths, timed_records
from harness.fleet.shard import ShardError, lpt, parse_shard
from harness.fleet.spec import DEVICES, Entry, Matrix, load_matrix


@dataclass(frozen=True, slots=True)
class Planned:
    entry: Entry
    estimate: Estimate
    shard: tuple[int, int]
    """(i, n): the shard of its device that runs it."""

    def to_json(self) -> dict[str, Any]:
        return {**self.entry.to_json(), "estimate_s": self.estimate.seconds,
                "estimate_from": self.estimate.source, "shard": f"{self.shard[0]}/{self.shard[1]}"}


@dataclass(frozen=True, slots=True)
class Plan:
    matrix: Matrix
    planned: tuple[Planned, ...]
    shards: dict[str, int]
    """Device -> number of shards its entries were split into."""

    def entries(self, device: str | None = None, shard: str | None = None) -> list[Planned]:
        """All entries, one device's, or one shard's (``shard`` needs ``device``)."""
        out = [p for p in self.planned if device in (None, "all") or p.entry.device == device]
        if shard is None:
            return out
        if device in (None, "all"):
            raise ShardError(f"shard {shard}: name the device too (--device cpu|cuda): "
                             "each device's entries are sharded on their own")
        i, n = parse_shard(shard)
        have = self.shards.get(device, 0)
        if n != have:
            raise ShardError(f"shard {shard}: the plan splits the {len(out)} {device} entries of "
                             f"{self.matrix.path.name} into {have} shard(s), not {n}"
                             + (f": ask for i/{have}" if have else ""))
        return [p for p in out if p.shard == (i, n)]

    def shard_rows(self, device: str) -> list[dict[str, Any]]:
        cfg = self.matrix.devices.get(device)
        n = self.shards.get(device, 0)
        rows = []
        for i in range(1, n + 1):
            mine = [p for p in self.planned if p.entry.device == device and p.shard == (i, n)]
            rows.append({"shard": f"{i}/{n}", "index": i, "of": n, "device": device,
                         "entries": len(mine), "estimate_s": round(sum(p.estimate.seconds for p in mine), 1),
                         "gpus": max((p.entry.gpus for p in mine), default=0),
                         "gpu_memory_gib": max((p.entry.gpu_memory_gib for p in mine), default=0.0),
                         "workers": cfg.workers if cfg else ("auto" if device == "cpu" else "0"),
                         "runs_on": list(cfg.runs_on) if cfg else [],
                         "ids": [p.entry.id for p in mine]})
        return rows


def make_plan(matrix: Matrix | Path, root: Path, shards: dict[str, int] | None = None) -> Plan:
    """Estimate every entry from ``root``'s records and split each device's entries into shards
    (``shards``: device -> count; default: the matrix file's ``[devices.<kind>] shards``, capped at the
    number of entries, so no shard is empty)."""
    m = matrix if isinstance(matrix, Matrix) else load_matrix(matrix)
    timed = timed_records(record_paths(root))
    est = {e.id: estimate(e, timed, m.default_estimate_s) for e in m.entries}
    counts: dict[str, int] = {}
    where: dict[str, tuple[int, int]] = {}
    for dev in DEVICES:
        mine = [e for e in m.entries if e.device == dev]
        if not mine:
            continue
        want = (shards or {}).get(dev) or (m.devices[dev].shards if dev in m.devices else 1)
        n = max(1, min(want, len(mine)))
        counts[dev] = n
        for k, ids in enumerate(lpt([(e.id, est[e.id].seconds) for e in mine], n), 1):
            for i in ids:
                where[i] = (k, n)
    return Plan(m, tuple(Planned(e, est[e.id], where[e.id]) for e in m.entries), counts)


def include(rows: Sequence[dict[str, Any]]) -> str:
    """The JSON a CI job matrix reads: ``{"include": [...]}`` and nothing else (any other top-level
    key would become a matrix dimension)."""
    return json.dumps({"include": list(rows)}, sort_keys=True)


def describe(plan: Plan, device: str | None, chosen: Sequence[Planned]) -> str:
    """One human line (printed to stderr beside the JSON)."""
    tot = sum(p.estimate.seconds for p in chosen)
    parts = [f"{len(chosen)} of {len(plan.planned)} entries of {plan.matrix.path.name}"]
    if device not in (None, "all"):
        parts.append(f"{device}, {plan.shards.get(device, 0)} shard(s)")
    parts.append(f"estimated {tot:.0f} s")
    return "; ".join(parts)
