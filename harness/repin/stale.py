"""Every FEATURES.md cell a re-pin would turn ⌛, computed, not guessed.

The page generator judges the records twice: against the tree as it is, and against a what-if of it
— the pin is the new release and the re-recorded golden sets have the new goldens' checksums
(:class:`WhatIf`, a :class:`harness.staleness.Current` that answers those two questions otherwise).
A cell that is not ⌛ now and is ⌛ then is listed with the generator's own reason; the staleness
rules are the ones the pages use (:func:`harness.kinds.staleness`), so a record kind added
later is covered by its own rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.features import CATALOG, Judge, load_catalog, load_records
from harness.staleness import Current
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class WhatIf(Current):
    """The tree as it would be after the re-pin: another pin, and re-recorded goldens' manifests."""

    goldens: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    """(model, suite) -> the manifest its goldens would have."""

    def golden_manifest(self, model: str, suite: str) -> Mapping[str, Any] | None:
        return self.goldens.get((model, suite)) or Current.golden_manifest(self, model, suite)


@dataclass(frozen=True, slots=True)
class StaleCell:
    row: str
    model: str
    column: str
    suite: str
    before: str
    """The cell now: its symbol and text."""
    why: str
    """Why it would be ⌛, in the generator's words."""

    def to_json(self) -> dict[str, str]:
        return {"row": self.row, "model": self.model, "column": self.column, "suite": self.suite,
                "before": self.before, "why": self.why}


def would_go_stale(ws: Workspace, pin: str, goldens: Mapping[tuple[str, str], Mapping[str, Any]]
                   ) -> tuple[list[StaleCell], int]:
    """(the cells that would turn ⌛ with ``pin`` and ``goldens``, how many are ⌛ already)."""
    catalog = load_catalog(ws.root / CATALOG, ws)
    records, broken = load_records(ws)
    now = Judge(ws, catalog, records, broken).table()
    then = Judge(ws, catalog, records, broken, what_if=lambda cur: WhatIf(
        cur.ws, pin, cur.candidate_repos, {}, dict(goldens))).table()
    suites = {r.id: r.suite for r in catalog.rows}
    out, already = [], 0
    for key, cell in now.cells.items():
        after = then.cells[key]
        if cell.state == "stale":
            already += 1
        elif after.state == "stale":
            row, model, column = key
            out.append(StaleCell(row, model, column, suites[row], f"{cell.symbol} {cell.text}".strip(),
                                 after.text.split(" (was ")[0]))
    return out, already
