"""The matrix file (``fleet.toml``): models × suites × candidates × vLLM releases, with each entry's needs.

Schema (every error names the file and the key, :mod:`harness.tomlcheck`)::

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
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from harness.registry import unknown
from harness.tomlcheck import (
    InvalidTOML,
    Where,
    check_keys,
    check_table,
    load_toml,
    need_choice,
    need_int,
    need_list,
    need_number,
    need_str,
    need_table,
    need_tables,
)

SCHEMA = 1
MATRIX_FILE = "fleet.toml"
DEVICES = ("cpu", "cuda")
KINDS = ("gate", "kv", "ab")
EXPECT = ("pass", "fail", "refused")
HARNESS_STORE = "harness-store"
"""The KV round trip through the harness's own store (no vendor connector)."""

Device = Literal["cpu", "cuda"]
Kind = Literal["gate", "kv", "ab"]


class MatrixError(InvalidTOML):
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


RELEASE = re.compile(r"\d+\.\d+\.\d+([.+-]\w+)?")
GROUP_KEYS = {"name", "kind", "device", "models", "suites", "candidates", "releases", "connectors",
              "pairs", "gpus", "gpu_memory_gib", "expect", "because"}


def _group(g: Mapping[str, Any], where: Where) -> list[Entry]:
    check_keys(g, where, GROUP_KEYS)
    name = need_str(g, "name", where, where.key)
    kind = need_choice(g, "kind", where, KINDS, "gate")
    device = need_choice(g, "device", where, DEVICES, "cpu")
    models, suites = need_list(g, "models", where, unique=True), need_list(g, "suites", where, unique=True)
    gpus = need_int(g, "gpus", where, 1 if device == "cuda" else 0, lo=0)
    if device == "cpu" and gpus:
        raise (where / "gpus").fail(f"a cpu group needs no GPU (gpus = {gpus}); use device = \"cuda\"")
    if device == "cuda" and not gpus:
        raise (where / "gpus").fail("a cuda group needs gpus >= 1")
    mem = need_number(g, "gpu_memory_gib", where, 0, lo=0)
    if device == "cpu" and mem:
        raise (where / "gpu_memory_gib").fail("needs device = \"cuda\"")
    expect = need_choice(g, "expect", where, EXPECT, "pass")
    because = need_str(g, "because", where, "", nonempty=False)
    if expect != "pass" and not because.strip():
        raise (where / "because").fail(f"expect = {expect!r} needs a 'because' (the finding, in words)")
    releases = need_list(g, "releases", where, [], unique=True)
    for r in releases:
        if not RELEASE.fullmatch(r):
            raise (where / "releases").fail(f"release {r!r} is not a full version such as 0.31.0")
    base = dict(group=name, kind=kind, device=device, gpus=gpus, gpu_memory_gib=mem, expect=expect,
                because=because.strip())
    own = {"gate": "candidates", "kv": "connectors", "ab": "pairs"}[kind]
    for other in ("candidates", "connectors", "pairs"):
        if other != own and other in g:
            raise (where / other).fail(f"does not apply to kind = {kind!r} (it takes {own!r})")
    if kind == "gate":
        cands = need_list(g, "candidates", where, unique=True)
        if releases and not any("{release}" in c for c in cands):
            raise (where / "releases").fail("given but no candidate names {release}")
        specs = [c.replace("{release}", r) for c in cands for r in (releases if "{release}" in c else [""])]
        if any("{release}" in c for c in cands) and not releases:
            raise (where / "releases").fail("a candidate names {release} but 'releases' is empty")
        whats = [dict(candidate=s) for s in specs]
    elif kind == "kv":
        if releases:
            raise (where / "releases").fail("the KV round trip drives the pinned vLLM: no 'releases'")
        whats = [dict(connector=None if c == HARNESS_STORE else c)
                 for c in need_list(g, "connectors", where, unique=True)]
    else:
        pairs = g.get("pairs")
        if (not isinstance(pairs, list) or not pairs or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x for x in p)
                for p in pairs)):
            raise (where / "pairs").fail(f"expected a list of [A, B] spec pairs, got {pairs!r}")
        whats = [dict(a=a, candidate=b) for a, b in pairs]
    out = []
    for model, suite, what in itertools.product(models, suites, whats):
        e = Entry(id="", model=model, suite=suite, **base, **what)  # type: ignore[arg-type]
        out.append(replace(e, id=f"{device}/{model}/{suite}/{e.what}"))
    return out


def _devices(raw: Mapping[str, Any], top: Where) -> dict[str, DeviceConfig]:
    out = {}
    for dev, d in need_table(raw, "devices", top, {}).items():
        where = top / "devices" / dev
        if dev not in DEVICES:
            raise where.fail(str(unknown("device kind", dev, DEVICES)))
        d = check_table(d, where)
        check_keys(d, where, ("runs-on", "shards", "workers"))
        workers = str(d.get("workers", "auto"))
        if workers != "auto" and not workers.isdigit():
            raise (where / "workers").fail(f"expected \"auto\" or a number, got {workers!r}")
        runs_on = need_list(d, "runs-on", where, [])
        out[dev] = DeviceConfig(tuple(runs_on), need_int(d, "shards", where, 1, lo=1), workers)
    return out


def load_matrix(path: Path) -> Matrix:
    """Parse and expand a matrix file. Raises :class:`MatrixError` naming the file and the key."""
    raw = load_toml(path, MatrixError, "no matrix file (see docs/fleet.md)")
    top = Where(path, error=MatrixError)
    check_keys(raw, top, ("schema", "defaults", "devices", "group"))
    if raw.get("schema", SCHEMA) != SCHEMA:
        raise (top / "schema").fail(f"is {raw.get('schema')!r}; this harness reads schema {SCHEMA}")
    defaults = need_table(raw, "defaults", top, {})
    check_keys(defaults, top / "defaults", ("estimate_s",))
    estimate = need_number(defaults, "estimate_s", top / "defaults", 300, lo=0)
    entries: list[Entry] = []
    first: dict[str, str] = {}
    for where, g in need_tables(raw, "group", top):
        for e in _group(g, where):
            if e.id in first:
                raise MatrixError(f"{path}: entry {e.id} appears in group {first[e.id]!r} and in "
                                  f"group {e.group!r}")
            first[e.id] = e.group
            entries.append(e)
    devices = _devices(raw, top)
    for e in entries:
        if devices and e.device not in devices:
            raise MatrixError(f"{path}: entry {e.id} runs on {e.device} but [devices.{e.device}] is missing")
    return Matrix(path, tuple(entries), devices, estimate)
