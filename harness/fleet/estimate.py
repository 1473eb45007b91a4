"""How long an entry takes, read from the records of past runs (never guessed when a record knows).

A record's **duration** is the sum of its phase wall times as the gate measured them: every
``*_wall_s`` timing except the ``oracle_*`` ones (those are copied from the goldens' manifest, i.e.
when the goldens were recorded, not this run), plus ``compare_s``, ``goldens_s`` and
``oracle_record_s`` (goldens recorded in this run). For a parity gate that is candidate + compare +
reading goldens; for the KV round trip the round trip + the refusal probe; for an A/B both arms.
Interpreter start-up and imports are not in it (paid once per pytest worker).

An entry's **estimate** is the median duration of the newest records (at most 5) that match it,
tried from the closest match to the loosest; the first level with a record wins and is named:

1. ``records``  same kind, model, suite, candidate (KV: connector; A/B: arm B) and device kind;
2. ``engine``   same kind, suite and device kind, same engine (the spec up to ``:`` / ``@``);
3. ``suite``    same kind, suite and device kind;
4. ``default``  the matrix file's ``[defaults] estimate_s``.

Only records git tracks are read when the workspace is a git checkout, so every runner at one
commit computes the same estimates, hence the same shards. Standard library only.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.fleet.spec import HARNESS_STORE, Entry

NEWEST = 5


def device_kind_of_record(rec: Mapping[str, Any]) -> str:
    """``cpu`` or ``cuda``: where a record's candidate ran.

    The device fingerprint (``harness.device``) writes a device class into every record; until it
    does, a record says so only through its candidate's settings (``hf:device=cuda``).
    """
    platform = rec.get("platform") or {}
    for key in ("device_class", "device"):
        v = platform.get(key) if isinstance(platform, Mapping) else None
        if isinstance(v, Mapping):
            v = v.get("class") or v.get("kind")
        if isinstance(v, str) and v:
            return "cuda" if v.lower().startswith(("cuda", "gpu", "nvidia")) else "cpu"
    settings = (rec.get("candidate") or {}).get("settings") or {}
    return "cuda" if str(settings.get("device", "cpu")).startswith("cuda") else "cpu"


def duration_s(rec: Mapping[str, Any]) -> float | None:
    """The record's measured duration (see the module docstring), None when it states none."""
    t = rec.get("timings") or {}
    parts = [float(v) for k, v in t.items() if isinstance(v, int | float) and v == v and (
        (k.endswith("_wall_s") and not k.startswith("oracle_"))
        or k in ("compare_s", "goldens_s", "oracle_record_s"))]
    return sum(parts) if parts else None


def engine_of(spec: str) -> str:
    return spec.split(":", 1)[0].split("@", 1)[0]


@dataclass(frozen=True, slots=True)
class Timed:
    """The facts of one record that estimates need."""

    kind: str
    model: str
    suite: str
    candidate: str
    device: str
    created: str
    seconds: float


def timed_records(paths: Iterable[Path]) -> list[Timed]:
    out = []
    for p in paths:
        try:
            rec = json.loads(p.read_text())
            cand = rec["candidate"]["name"]
            t = Timed(str(rec["kind"]), str(rec["model"]["name"]), str(rec["suite"]["name"]),
                      str(cand), device_kind_of_record(rec), str(rec["created"]), duration_s(rec) or -1)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # an unreadable record is the page generator's to report, not the planner's
        if t.seconds >= 0:
            out.append(t)
    return out


def record_paths(root: Path) -> list[Path]:
    """The records git tracks under ``root`` (every record outside git)."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "reports/records"],
                           capture_output=True, timeout=20)
        if r.returncode == 0:
            return sorted(root / p for p in r.stdout.decode().split("\0") if p.endswith(".json"))
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(p for p in (root / "reports" / "records").rglob("*.json") if not p.name.startswith("."))


def _candidate_matches(e: Entry, name: str) -> bool:
    if e.kind == "kv":
        want = e.connector or HARNESS_STORE
        return name == want or name.endswith(("." + want, ":" + want))
    return name == e.candidate


@dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    source: str
    """``records`` / ``engine`` / ``suite`` / ``default``, with how many records."""


def estimate(e: Entry, timed: Sequence[Timed], default_s: float) -> Estimate:
    kind = {"gate": "gate", "kv": "kv", "ab": "ab"}[e.kind]
    same = [t for t in timed if t.kind == kind and t.suite == e.suite and t.device == e.device]
    levels = (
        ("records", [t for t in same if t.model == e.model and _candidate_matches(e, t.candidate)]),
        ("engine", [t for t in same if engine_of(t.candidate) == engine_of(e.candidate or "vllm")]),
        ("suite", same),
    )
    for name, found in levels:
        if found:
            newest = sorted(found, key=lambda t: t.created, reverse=True)[:NEWEST]
            secs = statistics.median(t.seconds for t in newest)
            return Estimate(round(secs, 1), f"{name}: median of {len(newest)}")
    return Estimate(default_s, "default")
