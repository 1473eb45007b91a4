"""The records the pages are generated from: every record under ``reports/records/`` (or the ones
git tracks), readable or not. A malformed record never stops the generator: it becomes a
:class:`Broken` entry, shown as a warning.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.excerpt import clip
from harness.records import Record, RecordError, candidate_slug, iter_record_paths, load_record
from harness.workspace import Workspace

OUTCOMES = ("pass", "fail", "error", "refused", "skip", "vacuous")
STATUSES = ("pass", "fail", "error", "refused", "skip")


@dataclass(frozen=True, slots=True)
class Loaded:
    path: str
    """Relative to the workspace root, with forward slashes: what a cell links to."""
    record: Record


@dataclass(frozen=True, slots=True)
class Broken:
    path: str
    error: str
    model: str
    """The model/suite folders it sits in, and the candidate slug of its file name (may be '')."""
    suite: str
    slug: str


RELEASE_GLOB = "@*"
"""In a spec, ``@*`` stands for one release (``vllm@0.31.0``), never for a release and options: the
plain ``vllm@*`` column must not show a ``vllm@0.31.0:dtype=bfloat16`` record, whose row spells
``vllm@*:dtype=bfloat16``."""


def spec_matches(name: str, spec: str) -> bool:
    """A record's candidate ``name`` against a catalog spec: exact, or a glob (``vllm-server*``);
    ``@*`` matches a version alone (:data:`RELEASE_GLOB`), the rest of the spec the rest of the name."""
    if not any(ch in spec for ch in "*?["):
        return name == spec
    if RELEASE_GLOB in spec:
        head, _, tail = spec.partition(RELEASE_GLOB)
        m = re.fullmatch(r"(.*?)@([^:/@]+)(.*)", name, flags=re.DOTALL)
        return bool(m) and fnmatch.fnmatchcase(m.group(1), head) and fnmatch.fnmatchcase(m.group(3), tail)
    return fnmatch.fnmatchcase(name, spec)


def slug_matches(slug: str, spec: str) -> bool:
    """A record file name's candidate slug against a catalog spec (for unreadable records)."""
    if not any(ch in spec for ch in "*?["):
        return slug == candidate_slug(spec)
    return fnmatch.fnmatchcase(slug, re.sub(r"[^A-Za-z0-9.*?]+", "-", spec).strip("-"))


def _check(rec: Record) -> None:
    """Reject records that parse but cannot be judged (wrong types, unknown outcome or status)."""
    if rec.outcome not in OUTCOMES:
        raise TypeError(f"outcome {rec.outcome!r} is not one of {', '.join(OUTCOMES)}")
    for name, v in (("created", rec.created), ("model.name", rec.model.get("name")),
                    ("suite.name", rec.suite.get("name")), ("candidate.name", rec.candidate.name)):
        if not isinstance(v, str) or not v:
            raise TypeError(f"field {name} must be a non-empty string, got {v!r}")
    for v in rec.verdicts:
        if v.status not in STATUSES:
            raise TypeError(f"verdict {v.case_id}/{v.comparator}: status {v.status!r}")
    if not isinstance(rec.oracle, Mapping) or not isinstance(rec.harness, Mapping):
        raise TypeError("fields oracle and harness must be tables")


def tracked_records(ws: Workspace) -> list[Path] | None:
    """The record files git tracks (the index), or None outside git."""
    try:
        r = subprocess.run(["git", "-C", str(ws.root), "ls-files", "-z", "--", "reports/records"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return sorted(ws.root / p for p in r.stdout.decode().split("\0") if p.endswith(".json"))


def load_records(ws: Workspace, paths: Iterable[Path] | None = None
                 ) -> tuple[list[Loaded], list[Broken]]:
    """Every record under reports/records/ (or ``paths``): the readable ones and the broken ones."""
    ok: list[Loaded] = []
    bad: list[Broken] = []
    for p in sorted(paths) if paths is not None else iter_record_paths(ws.records):
        rel = p.relative_to(ws.root).as_posix() if p.is_relative_to(ws.root) else p.as_posix()
        try:
            rec = load_record(p)
            _check(rec)
        except (RecordError, TypeError, AttributeError, ValueError, OSError) as e:
            msg = str(e).replace(str(p), "").strip(": ") or type(e).__name__
            parts = p.stem.split("_")
            bad.append(Broken(rel, clip(msg), p.parent.parent.name, p.parent.name,
                              "_".join(parts[2:-1]) if len(parts) >= 4 else ""))
            continue
        ok.append(Loaded(rel, rec))
    return ok, bad


def superseded(records: Sequence[Loaded]) -> dict[str, str]:
    """Record id -> the id of the record that names it in ``extra["supersedes"]``."""
    out = {}
    for lr in records:
        sup = lr.record.extra.get("supersedes", ())
        for rid in [sup] if isinstance(sup, str) else (sup if isinstance(sup, list) else ()):
            out[str(rid)] = lr.record.id
    return out


def newest_first(records: Iterable[Loaded]) -> list[Loaded]:
    return sorted(records, key=lambda lr: (lr.record.created, lr.record.id), reverse=True)
