"""The matrix file (``fleet.toml``): models × suites × candidates × vLLM releases, with each entry's needs.

Schema (every error names the file and the field)::

    schema = 1

    [defaults]
    estimate_s = 300          # an entry no record has timed yet

    [devices.cpu]             # one table per device kind the matrix uses
    runs-on = ["ubuntu-latest"]                 # runner labels (the workflow states them too)
    shards = 2                # how many runners share this device's entries
    workers = "auto"          # pytest-xdist workers per runner ("auto", "0" = none, or a number)

    [[group]]                 # one group expands to the product of its lists
    name = "transformers"
    device = "cpu"            # cpu | cuda
    models = ["tiny-llama"]
    suites = ["smoke", "long_horizon"]
    candidates = ["hf", "vllm@{release}"]     # {release} expands over `releases`
    releases = ["0.31.0"]
    gpus = 0                  # cuda groups: GPUs per entry (default 1)
    gpu_memory_gib = 0        # cuda groups: memory per GPU the entry needs (0: any)
    expect = "pass"           # pass | fail | refused: a known finding is `fail` with `because`
    because = ""

    [[group]]                 # a KV round trip: `connectors` instead of `candidates`
    kind = "kv"
    connectors = ["harness-store", "ExampleConnector"]

    [[group]]                 # an A/B gate: `pairs` of [A, B] instead of `candidates`
    kind = "ab"
    pairs = [["vllm", "vllm:dtype=bfloat16"]]

Standard library only (see :mod:`harness.fleet`).
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

SCHEMA = 1
MATRIX_FILE = "fleet.toml"
DEVICES = ("cpu", "cuda")
KINDS = ("gate", "kv", "ab")
EXPECT = ("pass", "fail", "refused")
HARNESS_STORE = "harness-store"
"""The KV round trip through the harness's own store (no vendor connector)."""

Device = Literal["cpu", "cuda"]
Kind = Literal["gate", "kv", "ab"]


class MatrixError(ValueError):
    """A malformed matrix file; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One unit of the fleet: one gate run, one record, one pytest item, one JUnit case."""

    id: str
    """``<device>/<model>/<suite>/<what>``: unique in the matrix, stable across runs."""
    group: str
    kind: Kind
    device: Device
    model: str
    suite: str
    candidate: str = ""
    """``gate``: the candidate spec. ``kv``: empty. ``ab``: arm B."""
    connector: str | None = None
    """``kv``: the vendor connector (None: the harness store)."""
    a: str = ""
    """``ab``: arm A, the reference configuration."""
    gpus: int = 0
    gpu_memory_gib: float = 0.0
    expect: Literal["pass", "fail", "refused"] = "pass"
    because: str = ""

    @property
    def what(self) -> str:
        if self.kind == "kv":
            return f"kv:{self.connector or HARNESS_STORE}"
        if self.kind == "ab":
            return f"ab:{self.a}..{self.candidate}"
        return self.candidate

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "group": self.group, "kind": self.kind, "device": self.device,
                "model": self.model, "suite": self.suite, "candidate": self.candidate,
                "connector": self.connector, "a": self.a, "gpus": self.gpus,
                "gpu_memory_gib": self.gpu_memory_gib,
                "expect": self.expect, "because": self.because}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Entry:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    runs_on: tuple[str, ...]
    shards: int
    workers: str
    """pytest-xdist ``-n``: ``auto``, or a number (``0``: entries one after another)."""


@dataclass(frozen=True, slots=True)
class Matrix:
    path: Path
    entries: tuple[Entry, ...]
    devices: Mapping[str, DeviceConfig] = field(default_factory=dict)
    default_estimate_s: float = 300.0

    def for_device(self, device: str | None) -> list[Entry]:
        return [e for e in self.entries if device in (None, "all") or e.device == device]

    def entry(self, entry_id: str) -> Entry:
        for e in self.entries:
            if e.id == entry_id:
                return e
        raise MatrixError(f"{self.path}: no entry {entry_id!r}")


def _list(d: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> list[str]:
    v = d.get(key)
    if v is None and not required:
        return []
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
        raise MatrixError(f"{where}: field {key!r} must be a non-empty list of strings, got {v!r}")
    if len(set(v)) != len(v):
        raise MatrixError(f"{where}: field {key!r} lists {sorted(x for x in v if v.count(x) > 1)[0]!r} twice")
    return list(v)


def _number(d: Mapping[str, Any], key: str, where: str, default: float, *, minimum: float = 0) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or v < minimum:
        raise MatrixError(f"{where}: field {key!r} must be a number >= {minimum}, got {v!r}")
    return float(v)


def _choice(d: Mapping[str, Any], key: str, where: str, choices: Sequence[str], default: str) -> str:
    v = d.get(key, default)
    if v not in choices:
        raise MatrixError(f"{where}: field {key!r} must be one of {', '.join(choices)}, got {v!r}")
    return str(v)


RELEASE = re.compile(r"\d+\.\d+\.\d+([.+-]\w+)?")
GROUP_KEYS = {"name", "kind", "device", "models", "suites", "candidates", "releases", "connectors",
              "pairs", "gpus", "gpu_memory_gib", "expect", "because"}


def _group(g: Mapping[str, Any], where: str) -> list[Entry]:
    extra = sorted(set(g) - GROUP_KEYS)
    if extra:
        raise MatrixError(f"{where}: unknown field {extra[0]!r} (fields: {', '.join(sorted(GROUP_KEYS))})")
    name = g.get("name", where.rsplit(" ", 1)[-1])
    if not isinstance(name, str) or not name:
        raise MatrixError(f"{where}: field 'name' must be a non-empty string")
    where = f"{where} ({name})"
    kind = _choice(g, "kind", where, KINDS, "gate")
    device = _choice(g, "device", where, DEVICES, "cpu")
    models, suites = _list(g, "models", where), _list(g, "suites", where)
    gpus = _number(g, "gpus", where, 1 if device == "cuda" else 0)
    if gpus != int(gpus):
        raise MatrixError(f"{where}: field 'gpus' must be a whole number, got {gpus}")
    if device == "cpu" and gpus:
        raise MatrixError(f"{where}: a cpu group needs no GPU (gpus = {int(gpus)}); use device = \"cuda\"")
    if device == "cuda" and not gpus:
        raise MatrixError(f"{where}: a cuda group needs gpus >= 1")
    mem = _number(g, "gpu_memory_gib", where, 0)
    if device == "cpu" and mem:
        raise MatrixError(f"{where}: field 'gpu_memory_gib' needs device = \"cuda\"")
    expect = _choice(g, "expect", where, EXPECT, "pass")
    because = g.get("because", "")
    if not isinstance(because, str) or (expect != "pass" and not because.strip()):
        raise MatrixError(f"{where}: expect = {expect!r} needs a 'because' (the finding, in words)")
    releases = _list(g, "releases", where, required=False)
    for r in releases:
        if not RELEASE.fullmatch(r):
            raise MatrixError(f"{where}: release {r!r} is not a full version such as 0.31.0")
    base = dict(group=name, kind=kind, device=device, gpus=int(gpus), gpu_memory_gib=mem, expect=expect,
                because=because.strip())
    own = {"gate": "candidates", "kv": "connectors", "ab": "pairs"}[kind]
    for other in ("candidates", "connectors", "pairs"):
        if other != own and other in g:
            raise MatrixError(f"{where}: field {other!r} does not apply to kind = {kind!r} "
                              f"(it takes {own!r})")
    if kind == "gate":
        cands = _list(g, "candidates", where)
        if releases and not any("{release}" in c for c in cands):
            raise MatrixError(f"{where}: 'releases' given but no candidate names {{release}}")
        specs = [c.replace("{release}", r) for c in cands for r in (releases if "{release}" in c else [""])]
        if any("{release}" in c for c in cands) and not releases:
            raise MatrixError(f"{where}: a candidate names {{release}} but 'releases' is empty")
        whats = [dict(candidate=s) for s in specs]
    elif kind == "kv":
        if releases:
            raise MatrixError(f"{where}: the KV round trip drives the pinned vLLM: no 'releases'")
        whats = [dict(connector=None if c == HARNESS_STORE else c) for c in _list(g, "connectors", where)]
    else:
        pairs = g.get("pairs")
        if (not isinstance(pairs, list) or not pairs or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x for x in p)
                for p in pairs)):
            raise MatrixError(f"{where}: field 'pairs' must be a list of [A, B] spec pairs, got {pairs!r}")
        whats = [dict(a=a, candidate=b) for a, b in pairs]
    out = []
    for model, suite, what in itertools.product(models, suites, whats):
        e = Entry(id="", model=model, suite=suite, **base, **what)  # type: ignore[arg-type]
        out.append(replace(e, id=f"{device}/{model}/{suite}/{e.what}"))
    return out


def _devices(raw: Any, path: Path) -> dict[str, DeviceConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MatrixError(f"{path}: [devices] must be a table of device kinds")
    out = {}
    for dev, d in raw.items():
        where = f"{path} devices.{dev}"
        if dev not in DEVICES:
            raise MatrixError(f"{where}: unknown device kind (one of {', '.join(DEVICES)})")
        if not isinstance(d, dict):
            raise MatrixError(f"{where}: must be a table")
        shards = _number(d, "shards", where, 1, minimum=1)
        if shards != int(shards):
            raise MatrixError(f"{where}: field 'shards' must be a whole number")
        workers = str(d.get("workers", "auto"))
        if workers != "auto" and not workers.isdigit():
            raise MatrixError(f"{where}: field 'workers' must be \"auto\" or a number, got {workers!r}")
        runs_on = _list(d, "runs-on", where, required=False)
        out[dev] = DeviceConfig(tuple(runs_on), int(shards), workers)
    return out


def load_matrix(path: Path) -> Matrix:
    """Parse and expand a matrix file. Raises :class:`MatrixError` naming the file and the field."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise MatrixError(f"{path}: no matrix file (see docs/fleet.md)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise MatrixError(f"{path}: not valid TOML: {e}") from None
    if raw.get("schema", SCHEMA) != SCHEMA:
        raise MatrixError(f"{path}: schema {raw.get('schema')!r}; this harness reads schema {SCHEMA}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise MatrixError(f"{path}: [defaults] must be a table")
    estimate = _number(defaults, "estimate_s", f"{path} defaults", 300, minimum=0)
    groups = raw.get("group")
    if not isinstance(groups, list) or not groups:
        raise MatrixError(f"{path}: [[group]] must hold at least one group")
    entries: list[Entry] = []
    first: dict[str, str] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise MatrixError(f"{path} group[{i}]: must be a table")
        for e in _group(g, f"{path} group[{i}]"):
            if e.id in first:
                raise MatrixError(f"{path}: entry {e.id} appears in group {first[e.id]!r} and in "
                                  f"group {e.group!r}")
            first[e.id] = e.group
            entries.append(e)
    devices = _devices(raw.get("devices"), path)
    for e in entries:
        if devices and e.device not in devices:
            raise MatrixError(f"{path}: entry {e.id} runs on {e.device} but [devices.{e.device}] is missing")
    return Matrix(path, tuple(entries), devices, estimate)
