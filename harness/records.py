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
from harness.record_paths import portable
from harness.workspace import REPO_ROOT

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


GOLDEN_CHECK = "golden:"
"""Prefix of the ``mutation`` of a golden check (a control that plants nothing)."""
UNGUARDED = "no controls registered"
"""The ``mutation`` of the control a gated comparator gets when it ran none."""


@dataclass(frozen=True, slots=True)
class Control:
    """One in-memory mutation control run beside a comparator (the vacuous-gate guard,
    :mod:`harness.kinds.controls`)."""

    comparator: str
    mutation: str
    expect: Literal["fail", "pass"]
    got: str
    ok: bool
    note: str = ""

    @property
    def vacuates(self) -> bool:
        """Whether this control shows its comparator could not have failed: a must-fail mutation
        that did not fail, a fatal golden check, or no controls at all. (A positive control that
        fails does not: the comparator can still fail.)"""
        return not self.ok and (self.expect == "fail" or self.mutation.startswith(GOLDEN_CHECK)
                                or self.mutation == UNGUARDED)

    def to_json(self) -> dict[str, Any]:
        return {"comparator": self.comparator, "mutation": self.mutation, "expect": self.expect,
                "got": self.got, "ok": self.ok, "note": self.note}


def vacuous_reasons(controls: Sequence[Control], comparators: Sequence[str]) -> list[str]:
    """One line per control that makes one of ``comparators`` vacuous (empty: none does)."""
    return [f"{c.comparator}: {c.mutation} expected {c.expect}, got {c.got}"
            + (f" ({c.note})" if c.note else "")
            for c in controls if c.comparator in comparators and c.vacuates]


def failed_positive(controls: Sequence[Control], comparators: Sequence[str]) -> list[str]:
    """One line per positive control (must pass) of ``comparators`` that failed."""
    return [f"{c.comparator}: positive control {c.mutation!r} got {c.got}"
            for c in controls if c.comparator in comparators and not c.ok and not c.vacuates]


def guard(outcome: Outcome, controls: Sequence[Control], gates: Sequence[str]) -> tuple[Outcome, list[str]]:
    """(outcome, reasons): a passing outcome becomes ``vacuous`` when a gated comparator's control
    shows it could not have failed. A failing gate stays failed: it did bite."""
    why = vacuous_reasons(controls, gates)
    return ("vacuous" if why and outcome == "pass" else outcome), why


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


def candidate_slug(spec: str) -> str:
    """The candidate part of a record's file name."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")[:40] or "candidate"


def new_record_id(created: str, harness_sha: str | None, candidate: str) -> str:
    stamp = created.replace("-", "").replace(":", "")
    return f"{stamp}_{(harness_sha or 'nogit')[:10]}_{candidate_slug(candidate)}_{secrets.token_hex(3)}"


def record_path(records_root: Path, rec: Record) -> Path:
    model = rec.model["name"].strip("/").replace("/", "--")
    return records_root / model / rec.suite["name"] / f"{rec.id}.json"


def portable_record(rec: Record, workspace: Path) -> Record:
    """``rec`` as :func:`write_record` writes it: no path in it names this machine
    (:mod:`harness.record_paths`). The run itself keeps the record it built, whose paths (a
    ``weights=`` folder, a command) still resolve from wherever it runs."""
    return Record.from_json(portable(rec.to_json(), (workspace, REPO_ROOT)))


def write_record(records_root: Path, rec: Record) -> Path:
    """Write ``rec`` atomically and never over an existing record. Returns its path. Paths of the
    machine that ran it are written portably (:mod:`harness.record_paths`): relative to the
    workspace (``records_root``'s ``reports/records`` parent) or to their package."""
    path = record_path(records_root, rec)
    workspace = records_root.parent.parent if records_root.parent.name == "reports" else records_root
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(portable_record(rec, workspace).to_json(), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # FileExistsError rather than replacing: records are append-only
    except FileExistsError:
        raise
    except OSError as e:  # a full or read-only disk: say so; nothing half-written is left
        raise RecordError(f"{path}: the record could not be written: {e.strerror or e}. Nothing was "
                          f"written in its place and the earlier records are untouched; free space "
                          f"and run the gate again") from None
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return path


def load_record(path: Path) -> Record:
    try:
        return Record.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: malformed or truncated record ({type(e).__name__}: {e})") from None


def iter_record_paths(records_root: Path) -> Iterator[Path]:
    yield from sorted(p for p in records_root.rglob("*.json") if not p.name.startswith("."))


def newest_record(folder: Path) -> Path:
    """The newest record under ``folder`` (a record's name starts with its UTC time)."""
    paths = list(iter_record_paths(folder))
    if not paths:
        raise RecordError(f"{folder}: no record (*.json) in this folder")
    return max(paths, key=lambda p: p.name)


# ---------------------------------------------------------------------------------------------
# records as a dataset


def commit_order(repo: Path) -> dict[str, int]:
    """SHA -> its position in HEAD's history, oldest first (``git rev-list --topo-order``). A SHA
    that is not in the history here (an unmerged branch, a shallow clone) is absent."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-list", "--topo-order", "--reverse", "HEAD"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    return {sha: i for i, sha in enumerate(out.stdout.split())} if out.returncode == 0 else {}


def _numbers(prefix: str, d: Mapping[str, Any], out: dict[str, float], depth: int = 0) -> None:
    """Flatten the scalar numbers of a JSON mapping into ``prefix.key[.key...]`` columns."""
    for k, v in d.items():
        key = f"{prefix}.{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out[key] = float(v)
        elif isinstance(v, Mapping) and depth < 2:
            _numbers(key, v, out, depth + 1)


def frame(records_root: Path, repo: Path | None = None, paths: Iterator[Path] | None = None) -> Any:
    """Every record as a pandas DataFrame: one row per verdict.

    Columns: ``record``, ``path``, ``created``, ``kind``, ``model``, ``suite``, ``suite_version``,
    ``candidate``, ``engine``, ``engine_version``, ``device_class``, ``sha``, ``dirty``,
    ``commit_order`` (position of ``sha`` in HEAD's history, NaN when it is not in it),
    ``outcome``, ``case``, ``comparator``, ``status``, ``gated``, and the figures: every scalar
    number of the verdict's evidence as ``<comparator>.<key>`` (``kl.mean``, ``kl.p99``,
    ``drift.slope_per_1k``, ``near_tie.gap_mnats`` ...) and the record's speed ratios
    (``speed.output_tok_s``, ``speed.ttft_p50``). Unreadable records are skipped.
    """
    import pandas as pd

    order = commit_order(repo) if repo is not None else {}
    rows = []
    for p in paths if paths is not None else iter_record_paths(records_root):
        try:
            rec = load_record(p)
        except RecordError:
            continue
        sha = str(rec.harness.get("sha") or "")
        ratio = (rec.extra.get("speed") or {}).get("ratio") or {}
        base = {"record": rec.id, "path": str(p), "created": rec.created, "kind": rec.kind,
                "model": rec.model.get("name"), "suite": rec.suite.get("name"),
                "suite_version": rec.suite.get("version"), "candidate": rec.candidate.name,
                "engine": rec.candidate.engine, "engine_version": rec.candidate.version,
                "device_class": rec.candidate.environment.get("device_class") or rec.device.get("class"),
                "sha": sha, "dirty": bool(rec.harness.get("dirty")), "commit_order": order.get(sha),
                "outcome": rec.outcome}
        speed = {f"speed.{k}": float(v) for k, v in ratio.items() if isinstance(v, int | float)}
        for v in rec.verdicts:
            figures: dict[str, float] = {}
            _numbers(v.comparator, v.evidence, figures)
            rows.append({**base, "case": v.case_id, "comparator": v.comparator, "status": v.status,
                         "gated": v.comparator in rec.gates, **figures, **speed})
    df = pd.DataFrame(rows)
    if not df.empty:
        df["created"] = pd.to_datetime(df["created"], utc=True)
        df["commit_order"] = pd.to_numeric(df["commit_order"], errors="coerce")
    return df
