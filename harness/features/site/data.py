"""What the results site shows, computed once from the catalog and the records: the same cells as
FEATURES.md (:class:`~harness.features.cells.Judge`), every record behind each cell judged as of now
(its trend), the SHAs in HEAD's history, the bisect records, and the KV round trip per release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.features.catalog import Catalog, Row
from harness.features.cells import (
    ORACLE,
    SYMBOL,
    Cell,
    Judge,
    Table,
    device_class,
    judge_record,
    release_key,
    tally,
)
from harness.features.sources import Loaded, newest_first
from harness.records import Record, commit_order
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class Point:
    """One record behind a cell, judged as of now: one point of the cell's trend."""

    record: str
    """The record's id (its page is ``records/<id>.html``)."""
    sha: str
    order: int | None
    """Its SHA's position in HEAD's history (None: not in it)."""
    created: str
    state: str
    count: str
    text: str

    @property
    def rate(self) -> float | None:
        """Passed of judged, 0..1; None when nothing was counted."""
        if not self.count:
            return None
        a, _, b = self.count.partition("/")
        return int(a) / int(b) if b and int(b) else None


@dataclass(frozen=True, slots=True)
class SiteCell:
    key: str
    """``<row>--<model>--<column>``: the cell's anchor on a record page."""
    row: Row
    model: str
    column: str
    cell: Cell
    points: tuple[Point, ...]
    """Oldest first: records in HEAD's history by their SHA's position, then the rest by time."""
    shown: str | None
    """The id of the record the cell shows."""
    first_bad: tuple[Mapping[str, Any], ...] = ()
    """Bisect results that name where this failing cell's verdicts changed."""


@dataclass(slots=True)
class SiteData:
    catalog: Catalog
    table: Table
    cells: list[SiteCell]
    records: dict[str, Loaded]
    """Every readable record (gates and summaries), by id."""
    ids: dict[str, str]
    """Record path -> id."""
    order: dict[str, int]
    bisects: list[dict[str, Any]]
    kv: dict[str, Any] = field(default_factory=dict)
    by_record: dict[str, list[SiteCell]] = field(default_factory=dict)
    """Record id -> the cells it stands in (shows now, or is a point of their trend)."""

    def __post_init__(self) -> None:
        for sc in self.cells:
            for rid in dict.fromkeys([*(p.record for p in sc.points), *([sc.shown] if sc.shown else [])]):
                self.by_record.setdefault(rid, []).append(sc)


def cell_key(row: str, model: str, column: str) -> str:
    return f"{row}--{model}--{column}"


def _point(judge: Judge, lr: Loaded, prove: Sequence[str], order: Mapping[str, int]) -> Point:
    rec = lr.record
    state, text = judge_record(rec, prove)
    counted = state in ("pass", "partial", "fail", "vacuous") and rec.outcome != "error"
    count = tally(rec, prove) if counted else ""
    why = judge.stale(lr)
    if why:
        text, state = f"{'; '.join(why)} (was {SYMBOL[state]} {text})", "stale"
    sha = str(rec.harness.get("sha") or "")
    return Point(rec.id, sha, order.get(sha), rec.created, state, count, text)


def _sorted(points: list[Point]) -> tuple[Point, ...]:
    return tuple(sorted(points, key=lambda p: (p.order is None, p.order or 0, p.created)))


def bisect_result(rec: Record) -> dict[str, Any] | None:
    """A bisect record's finding: where the verdicts changed (or that they did not)."""
    b = rec.extra.get("bisect")
    if not isinstance(b, Mapping):
        return None
    res = b.get("result") if isinstance(b.get("result"), Mapping) else {}
    return {"id": rec.id, "model": rec.model.get("name"), "suite": rec.suite.get("name"),
            "candidate": rec.candidate.name, "over": b.get("over"), "kind": res.get("kind"),
            "first_new": res.get("first_new"), "last_old": res.get("last_old"),
            "direction": res.get("direction"), "statement": res.get("statement") or rec.summary,
            "reference": b.get("reference"), "end": b.get("end"), "created": rec.created}


def _engine_of(spec: str) -> str:
    return spec.split("@")[0].split(":")[0].split("/")[0].strip("*")


def _explains(b: Mapping[str, Any], row: Row, model: str, spec: str) -> bool:
    """Whether a bisect record is about this cell: same model and suite, and its candidate is the
    cell's engine (``bisect:vllm@0.32.0..0.8.5/…`` explains a ``vllm@*`` cell)."""
    if b["model"] != model or b["suite"] != row.suite or b["kind"] != "found":
        return False
    bisected = _engine_of(str(b["candidate"]).removeprefix("bisect:"))
    return bisected == _engine_of(spec) or bisected in spec


def kv_matrix(judge: Judge) -> dict[str, Any]:
    """The KV round trip: (model, connector) x vLLM release -> the newest current record's result."""
    from harness.features.supported import current_runs

    runs = [r for r in current_runs(judge) if r.lr.record.kind == "kv_roundtrip"
            and r.lr.record.suite.get("name") == "kv_roundtrip"]
    releases = sorted({r.lr.record.candidate.version for r in runs}, key=release_key)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        x = r.lr.record
        conn = str(x.candidate.settings.get("connector") or x.candidate.name).rsplit(":", 1)[-1]
        state = "stale" if r.stale else r.state
        vs = [v for v in x.verdicts if v.comparator == "byte_equal"]
        count = f"{sum(v.status == 'pass' for v in vs)}/{len(vs)}" if vs else ""
        rows.setdefault((str(x.model.get("name")), conn), {})[x.candidate.version] = {
            "state": state, "symbol": SYMBOL[state], "count": count, "record": x.id,
            "text": "; ".join(r.stale) if r.stale else r.text}
    return {"releases": releases,
            "rows": [{"model": m, "connector": c, "cells": cells} for (m, c), cells in sorted(rows.items())]}


def collect(ws: Workspace, judge: Judge, table: Table, every: Sequence[Loaded]) -> SiteData:
    """Everything the site shows (``every``: all readable records, summaries included)."""
    cat = table.catalog
    order = commit_order(ws.root)
    records = {lr.record.id: lr for lr in every}
    ids = {lr.path: lr.record.id for lr in every}
    bisects = [b for lr in newest_first(every) if (b := bisect_result(lr.record))]
    cells = []
    for row in cat.rows:
        for model in row.models:
            for col in [*cat.columns, None]:
                key = col.key if col else ORACLE
                c = table.cells[(row.id, model, key)]
                if c.state == "na":
                    continue
                spec = row.spec(col) if col else None
                behind = judge.matching(row, model, spec)
                if col is None:
                    behind = [lr for lr in behind if lr.record.oracle.get("pin")]
                pts = _sorted([_point(judge, lr, row.prove, order) for lr in behind]) if col else ()
                first_bad = tuple(b for b in bisects if c.state in ("fail", "partial") and spec
                                  and _explains(b, row, model, spec))
                cells.append(SiteCell(cell_key(row.id, model, key), row, model, key, c, pts,
                                      ids.get(c.record or ""), first_bad))
    return SiteData(cat, table, cells, records, ids, order, bisects, kv_matrix(judge))


def device_of(rec: Record) -> str:
    return device_class(rec) or "—"
