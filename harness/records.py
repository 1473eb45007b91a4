"""Records: one JSON file per gate run, append-only, written atomically.

A record is only true of the tree it ran on, so it names the harness SHA, the candidate engine +
version + SHA, the oracle pin, the model digest, the suite version and the golden checksums.
Records are never rewritten: a correction is a new record. Two gates writing at once cannot
corrupt or overwrite each other (unique name + write to a temp file + ``os.link``, which refuses
to replace an existing file).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.api import EngineInfo, Verdict

SCHEMA = 2
"""2: ``EngineInfo.environment`` holds where and how an engine ran, apart from its settings; and
record kinds are gate kind names. Schema-1 records are read as schema 2 (:func:`upgrade`)."""
KIND_ALIASES = {"gate": "parity", "kv": "kv_roundtrip"}
"""Record kinds written before gate kinds had the suite kinds' names."""
RECORDED_ORACLE = "recorded_oracle_"
"""Prefix of the timings copied from the goldens' manifest: the oracle's engine start and generate
times *when the goldens were recorded*, not in this run."""

Outcome = Literal["pass", "fail", "error", "refused", "skip", "vacuous"]
"""A gate's overall result. ``vacuous``: the comparators passed, but a planted mutation passed too,
so the gate could not have failed and does not count."""


class RecordError(ValueError):
    """A malformed or truncated record; the message names the file."""


@dataclass(frozen=True, slots=True)
class Control:
    """One in-memory mutation control run beside a comparator (the vacuous-gate guard)."""

    comparator: str
    mutation: str
    expect: Literal["fail", "pass"]
    got: str
    ok: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"comparator": self.comparator, "mutation": self.mutation, "expect": self.expect,
                "got": self.got, "ok": self.ok, "note": self.note}


@dataclass(frozen=True, slots=True)
class Record:
    """Everything one gate run established, and exactly what it was established on."""

    id: str
    kind: str
    """The gate kind that made it (``parity``, ``kv_roundtrip``, ``ab``, ...; :mod:`harness.kinds`).
    Records written before kinds existed say ``gate`` and ``kv``: read as ``parity`` and
    ``kv_roundtrip``."""
    created: str
    model: Mapping[str, str]
    """name, digest."""
    suite: Mapping[str, Any]
    """name, version, digest."""
    oracle: Mapping[str, Any]
    """engine, version, pin, golden_files (checksums), golden_created."""
    candidate: EngineInfo
    harness: Mapping[str, Any]
    """sha, dirty."""
    outcome: Outcome
    summary: str
    verdicts: tuple[Verdict, ...]
    gates: tuple[str, ...]
    """The comparators whose failure fails the run (the others are reported only)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    controls: tuple[Control, ...] = ()
    platform: Mapping[str, Any] = field(default_factory=dict)
    device: Mapping[str, Any] = field(default_factory=dict)
    """The fingerprint and class of the device the harness ran on (:mod:`harness.device`)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Gate-specific facts (KL statistics, KV page counts, throughput ...)."""
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if self.kind in KIND_ALIASES:
            object.__setattr__(self, "kind", KIND_ALIASES[self.kind])

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "id": self.id, "kind": self.kind, "created": self.created,
            "model": dict(self.model), "suite": dict(self.suite), "oracle": dict(self.oracle),
            "candidate": self.candidate.to_json(), "harness": dict(self.harness),
            "outcome": self.outcome, "summary": self.summary, "gates": list(self.gates),
            "verdicts": [v.to_json() for v in self.verdicts],
            "controls": [c.to_json() for c in self.controls],
            "timings": dict(self.timings), "platform": dict(self.platform), "device": dict(self.device),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Record:
        d = upgrade(d)
        return cls(
            id=d["id"], kind=d["kind"], created=d["created"],
            model=d["model"], suite=d["suite"],
            oracle=d["oracle"], candidate=EngineInfo.from_json(d["candidate"]),
            harness=d["harness"], outcome=d["outcome"], summary=d["summary"],
            verdicts=tuple(Verdict.from_json(v) for v in d["verdicts"]),
            gates=tuple(d.get("gates", ())),
            timings=d.get("timings", {}),
            controls=tuple(Control(**c) for c in d.get("controls", ())),
            platform=d.get("platform", {}), device=d.get("device", {}), extra=d.get("extra", {}),
            schema=d.get("schema", SCHEMA),
        )


ENVIRONMENT_KEYS_V1 = frozenset({
    "base_url", "api_key_env", "api_key_set", "timeout_s", "request_timeout_s", "retries", "breaker",
    "system_fingerprint", "protocol", "server_args", "venv", "returncode", "problems"})
"""Keys schema-1 records kept among a candidate's settings that describe where and how it ran
(loopback URLs, timeouts, venv install facts), none of which can change an output."""


def upgrade(d: Mapping[str, Any]) -> dict[str, Any]:
    """A record as the current schema reads it (the file itself is never rewritten)."""
    d = dict(d)
    if d.get("schema", 1) < 2 and isinstance(d.get("candidate"), Mapping):
        cand = dict(d["candidate"])
        settings = dict(cand.get("settings") or {})
        env = {k: settings.pop(k) for k in sorted(ENVIRONMENT_KEYS_V1 & set(settings))}
        cand.update(settings=settings, environment={**env, **dict(cand.get("environment") or {})})
        d["candidate"] = cand
    return d


def outcome_of(verdicts: Sequence[Verdict], gates: Sequence[str]) -> Outcome:
    """fail if any gated verdict failed, else error, else refused, else pass; nothing judged: skip."""
    gated = [v.status for v in verdicts if v.comparator in gates]
    for status in ("fail", "error", "refused"):
        if status in gated:
            return status  # type: ignore[return-value]
    return "pass" if "pass" in gated else "skip"


def new_record_id(created: str, harness_sha: str | None, candidate: str) -> str:
    stamp = created.replace("-", "").replace(":", "")
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", candidate).strip("-")[:40] or "candidate"
    return f"{stamp}_{(harness_sha or 'nogit')[:10]}_{slug}_{secrets.token_hex(3)}"


def record_path(records_root: Path, rec: Record) -> Path:
    model = rec.model["name"].strip("/").replace("/", "--")
    return records_root / model / rec.suite["name"] / f"{rec.id}.json"


def write_record(records_root: Path, rec: Record) -> Path:
    """Write ``rec`` atomically and never over an existing record. Returns its path."""
    path = record_path(records_root, rec)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec.to_json(), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # FileExistsError rather than replacing: records are append-only
    finally:
        os.unlink(tmp)
    return path


def load_record(path: Path) -> Record:
    try:
        return Record.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: malformed or truncated record ({type(e).__name__}: {e})") from None


def iter_record_paths(records_root: Path) -> Iterator[Path]:
    yield from sorted(p for p in records_root.rglob("*.json") if not p.name.startswith("."))
