"""``harness history FEATURE``: every record behind one row, newest first, judged as of now."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.features.catalog import Catalog, Row
from harness.features.cells import SYMBOL, Cell, Judge, device_class, judge_record
from harness.features.sources import Loaded, load_records, spec_matches
from harness.provenance import tree_label
from harness.registry import unknown
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    lr: Loaded
    cell: Cell
    current: bool
    """Whether this is the record the table shows now (the newest current, not superseded)."""
    superseded_by: str | None


def history(ws: Workspace, catalog: Catalog, row_id: str, column: str | None = None,
            paths: Iterable[Path] | None = None, model: str | None = None) -> list[HistoryEntry]:
    """Every record behind one row (optionally one column, one model), newest first, each judged as
    of now; ``current`` marks the records the table shows."""
    row = catalog.row(row_id)
    cols = list(catalog.columns)
    if column is not None:
        cols = [c for c in cols if c.key == column]
        if not cols:
            raise unknown("column", column, [c.key for c in catalog.columns])
    models = list(row.models)
    if model is not None:
        if model not in models:
            raise unknown(f"model of row {row_id}", model, models)
        models = [model]
    records, broken = load_records(ws, paths)
    judge = Judge(ws, catalog, records, broken)
    specs = {row.spec(c) for c in cols}
    out = []
    for m in models:
        shown = {lr.record.id for s in specs if (lr := judge.shown(row, m, s)[0]) is not None}
        newer: dict[str, str] = {}
        for lr in judge.matching(row, m, None):
            rec = lr.record
            if column is not None and not any(spec_matches(rec.candidate.name, s) for s in specs):
                continue
            state, text = judge_record(rec, row.prove)
            why = judge.stale(lr)
            if why:
                text, state = f"{'; '.join(why)} (was {SYMBOL[state]} {text})", "stale"
            sup = judge.sup.get(rec.id) or newer.get(rec.candidate.name)
            out.append(HistoryEntry(lr, Cell(state, text, lr.path, rec.harness.get("sha"), rec.candidate.sha,
                                             device=device_class(rec)),
                                    rec.id in shown, sup if rec.id not in shown else None))
            if not why:  # only a current record supersedes the older ones
                newer.setdefault(rec.candidate.name, rec.id)
    return out


def history_table(row: Row, entries: Sequence[HistoryEntry]) -> Any:
    from rich.table import Table as RichTable
    from rich.text import Text

    style = {"pass": "green", "partial": "yellow", "stale": "dim", "vacuous": "bold magenta",
             "fail": "bold red", "refused": "yellow", "todo": "dim", "na": "dim"}
    t = RichTable(title=f"{row.id}: {row.title} — {', '.join(row.models)} / {row.suite} · "
                        f"{', '.join(row.prove)} (newest first)")
    for col in ("created", "model", "candidate", "state", "why / gap", "harness", "device", "record"):
        t.add_column(col, overflow="fold")
    for e in entries:
        rec = e.lr.record
        state = Text(f"{e.cell.symbol} {e.cell.state}", style=style.get(e.cell.state, ""))
        if e.current:
            state.append(" (shown)", style="bold")
        elif e.superseded_by:
            state.append(f" (superseded by {e.superseded_by[:24]})", style="dim")
        t.add_row(rec.created, str(rec.model.get("name")), rec.candidate.name, state, e.cell.text,
                  tree_label(rec.harness.get("sha"), bool(rec.harness.get("dirty"))),
                  e.cell.device or "—", e.lr.path)
    return t
