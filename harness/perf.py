"""Performance is a record too: figures, each beside the limit it is read against, one JSON per run.

``make bench`` measures the harness's own hot paths on this machine and writes
``reports/bench/<sha12>-<UTC time>.json`` (atomic: a temp file, then ``link``, which never replaces
an existing record). A figure is never a bare number: it names the limit it is read against,
measured in the same run on the same bytes (memcpy, a device-to-device copy, the per-token loop, the
engine's own wall time) or a stated goal, and the ratio between them. Schema (``SCHEMA``)::

    {"schema": "harness.bench/1", "kind": "bench", "id": "<sha12>-<time>", "created": "<UTC>",
     "harness": {"sha": "...", "dirty": false},
     "device": {"class": "...", "fingerprint": "...", "facts": {...}, "source": "..."},
     "figures": [{"name": "compare.fused", "value": 2.3e7, "unit": "positions/s",
                  "better": "higher", "limit": {"name": "per-token loop, same work",
                  "value": 2.6e5, "unit": "positions/s"}, "ratio": 88.5,
                  "goal": {"value": 2e7, "met": true}, "params": {...}}, ...],
     "runs": {"<part>": {raw measurements}}, "errors": {"<part>": "..."}}

``ratio`` is ``value / limit.value`` (for seconds: the wall over its floor). ``goal`` is optional.
One row per (record, figure) is what a dataset of records needs to plot figures across commits.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.record_paths import portable
from harness.workspace import REPO_ROOT

SCHEMA = "harness.bench/1"


@dataclass(frozen=True, slots=True)
class Limit:
    name: str
    """What the figure is read against, e.g. ``memcpy of the same bytes``."""
    value: float
    unit: str


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    """Dotted, stable across commits: ``compare.fused``, ``kv.digest_host``, ``gate.wall``."""
    value: float
    unit: str
    limit: Limit | None = None
    better: Literal["higher", "lower"] = "higher"
    goal: float | None = None
    """A stated target in ``unit`` (met when on the ``better`` side of it)."""
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.value / self.limit.value if self.limit and self.limit.value else None

    @property
    def goal_met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.value >= self.goal if self.better == "higher" else self.value <= self.goal

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "value": self.value, "unit": self.unit, "better": self.better,
                             "limit": None, "ratio": self.ratio, "params": dict(self.params)}
        if self.limit is not None:
            d["limit"] = {"name": self.limit.name, "value": self.limit.value, "unit": self.limit.unit}
        if self.goal is not None:
            d["goal"] = {"value": self.goal, "met": self.goal_met}
        return d

    def line(self) -> str:
        def num(v: float, unit: str) -> str:
            if unit.endswith("B/s"):
                return f"{v / 1e9:9.2f} GB/s"
            if unit == "positions/s":
                return f"{v / 1e6:9.2f} M pos/s"
            return f"{v:9.3g} {unit}"
        out = f"{self.name:28s} {num(self.value, self.unit)}"
        if self.limit is not None:
            lim = num(self.limit.value, self.limit.unit).strip()
            out += f"   vs {self.limit.name} {lim}: {self.ratio:.3g}x"
        if self.goal is not None:
            out += f"   goal {num(self.goal, self.unit).strip()}: {'met' if self.goal_met else 'MISSED'}"
        return out


def rate(nbytes: float, work: Callable[[], Any], min_s: float = 0.3, rounds: int = 1) -> float:
    """Bytes per second of ``work`` (which moves ``nbytes``): one warm-up call (first-touch
    allocations, caches), then as many calls as fit in ``min_s``. ``rounds`` > 1 splits ``min_s``
    into that many rounds and keeps the fastest: on a shared host the least disturbed round is the
    one that measured the work rather than its neighbours."""
    work()
    best = 0.0
    for _ in range(max(1, rounds)):
        reps, t0 = 0, time.perf_counter()
        while True:
            work()
            reps += 1
            dt = time.perf_counter() - t0
            if dt >= min_s / max(1, rounds):
                best = max(best, nbytes * reps / dt)
                break
    return best


def device_facts() -> dict[str, Any]:
    """Which machine measured: its class (comparable across runs), a fingerprint, and facts.

    Seam: ``harness.device`` (``fingerprint()`` / ``device_class()``) answers when it exists; until
    then the facts come from :func:`harness.provenance.platform_facts` plus the core count, CPU
    model and load average (a shared machine's figures are read with its load)."""
    from harness.provenance import platform_facts

    facts: dict[str, Any] = {**platform_facts(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            facts["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                                None)
        facts["load_avg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    try:
        from harness import device  # type: ignore[attr-defined]

        return {"class": device.device_class(), "fingerprint": device.fingerprint(), "facts": facts,
                "source": "harness.device"}
    except (ImportError, AttributeError):
        cls = f"cpu:{facts.get('cpu') or platform.machine()}:{facts['cores']}c"
        return {"class": cls, "fingerprint": None, "facts": facts,
                "source": "harness.provenance.platform_facts (harness.device not present)"}


def bench_record(figures: Sequence[Figure], runs: Mapping[str, Any], errors: Mapping[str, str],
                 root: Path, device: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from harness.provenance import git_dirty, git_sha, now_utc

    created = now_utc()
    sha = git_sha(root)
    return {"schema": SCHEMA, "kind": "bench",
            "id": f"{(sha or 'nosha')[:12]}-{created.replace('-', '').replace(':', '')}",
            "created": created, "harness": {"sha": sha, "dirty": git_dirty(root)},
            "device": dict(device) if device is not None else device_facts(),
            "figures": [f.to_json() for f in figures], "runs": dict(runs), "errors": dict(errors)}


def write_bench(folder: Path, record: Mapping[str, Any]) -> Path:
    """``folder/<id>.json``, atomically; an existing file of that name is never replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record['id']}.json"
    fd, tmp = tempfile.mkstemp(prefix=".bench-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(portable(record, (folder.parent.parent, REPO_ROOT)), f, indent=1, sort_keys=True,
                      default=float)
            f.write("\n")
        n = 1
        while True:
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                n += 1
                path = folder / f"{record['id']}-{n}.json"
    finally:
        os.unlink(tmp)


def read_bench(path: Path) -> dict[str, Any]:
    """One bench record, checked for the fields a dataset relies on (names the file on error)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable bench record ({e})") from None
    if d.get("schema") != SCHEMA or not isinstance(d.get("figures"), list):
        raise ValueError(f"{path}: not a {SCHEMA} record (schema {d.get('schema')!r})")
    for i, f in enumerate(d["figures"]):
        if not isinstance(f, dict) or not {"name", "value", "unit"} <= set(f):
            raise ValueError(f"{path}: figures[{i}] lacks name/value/unit")
    return d


def frame(folder: Path) -> Any:
    """Every bench record under ``folder`` as one pandas DataFrame, one row per figure, oldest
    first (what ``harness trend``-style plots of performance across commits read)."""
    import pandas as pd

    out = [r for p in sorted(Path(folder).glob("*.json")) for r in rows(read_bench(p))]
    df = pd.DataFrame(out, columns=list(out[0]) if out else ["id", "created", "figure", "value"])
    return df.sort_values(["created", "figure"], kind="stable").reset_index(drop=True)


def rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One flat row per figure (what a records dataset / ``pandas.DataFrame`` takes)."""
    out = []
    for f in record["figures"]:
        lim = f.get("limit") or {}
        out.append({"id": record["id"], "created": record["created"], "sha": record["harness"]["sha"],
                    "dirty": record["harness"]["dirty"], "device_class": record["device"].get("class"),
                    "figure": f["name"], "value": f["value"], "unit": f["unit"], "better": f.get("better"),
                    "limit_name": lim.get("name"), "limit": lim.get("value"), "ratio": f.get("ratio"),
                    "goal": (f.get("goal") or {}).get("value"), "goal_met": (f.get("goal") or {}).get("met")})
    return out
