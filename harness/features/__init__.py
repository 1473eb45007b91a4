"""Records -> FEATURES.md and SUPPORTED_MODELS.md: tables that are generated, never hand-kept.

Inputs are the catalog (``features.toml``, :mod:`.catalog`) and the records under
``reports/records/`` (:mod:`.sources`); nothing else is read except what staleness needs (the oracle
pin, suites, committed goldens, models, git; see :mod:`harness.staleness`). :mod:`.cells` decides
what each cell shows; :mod:`.render` writes FEATURES.md, :mod:`.supported` SUPPORTED_MODELS.md;
:mod:`.history` answers ``harness history``; :mod:`.trend` ``harness trend`` (one metric of a row
across commits).

Every cell cites its record (a reference-style link, :mod:`.refs`); a cell that is not a plain ✅
has a numbered note naming the reason, the failing cases, the SHA and the device class; the
generator refuses to write a table that cites a record that does not exist. A malformed or truncated
record is reported by path in a warning note and the warnings section; it never stops the generator.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.features.catalog import CATALOG, Catalog, CatalogError, load_catalog
from harness.features.cells import SYMBOL, Judge, Table
from harness.features.history import history, history_table
from harness.features.refs import DEFINITION
from harness.features.render import FEATURES_MD, SUPPORTED_MD, render_features
from harness.features.sources import load_records, slug_matches, spec_matches, tracked_records
from harness.features.supported import render_supported
from harness.workspace import Workspace

__all__ = ["CATALOG", "FEATURES_MD", "SUPPORTED_MD", "CatalogError", "CitationError", "Generated", "Judge",
           "check_citations", "generate", "history", "history_table", "load_catalog", "load_records",
           "slug_matches", "spec_matches", "tracked_records", "write_pages"]


class CitationError(RuntimeError):
    """A generated table cites a record that does not exist (a generator bug: nothing is written)."""


LINK = re.compile(r"\]\(([^)\s]+)\)")


def check_citations(ws: Workspace, *pages: str) -> list[str]:
    """Every link target in ``pages`` that does not exist under the root (empty: none is dead)."""
    dead = []
    for page in pages:
        for target in [*LINK.findall(page), *DEFINITION.findall(page)]:
            if "://" in target or target.startswith("#"):
                continue
            if not (ws.root / target).is_file():
                dead.append(target)
    return sorted(set(dead))


@dataclass(frozen=True, slots=True)
class Generated:
    features: str
    supported: str
    table: Table

    def figures(self) -> dict[str, int]:
        counts = Counter(c.state for c in self.table.cells.values())
        return {"records": len(self.table.records), "unreadable": len(self.table.broken),
                "cited": len(self.table.cited), "cells": len(self.table.cells),
                **{s: counts[s] for s in SYMBOL}}


def generate(ws: Workspace, catalog: Catalog | None = None, paths: Iterable[Path] | None = None
             ) -> Generated:
    """Both pages from the catalog and the records (all on disk, or only ``paths``)."""
    catalog = catalog or load_catalog(ws.root / CATALOG, ws)
    records, broken = load_records(ws, paths)
    judge = Judge(ws, catalog, records, broken)
    table = judge.table()
    features = render_features(table)
    supported, _ = render_supported(ws, table, judge)
    dead = check_citations(ws, features, supported)
    if dead:
        raise CitationError("the generated tables cite records that do not exist: " + ", ".join(dead))
    return Generated(features, supported, table)


def write_pages(ws: Workspace, g: Generated) -> list[Path]:
    """Write FEATURES.md and SUPPORTED_MODELS.md; returns the files whose content changed."""
    changed = []
    for name, text in ((FEATURES_MD, g.features), (SUPPORTED_MD, g.supported)):
        p = ws.root / name
        if not p.exists() or p.read_text() != text:
            tmp = p.with_name(f".{name}.tmp")
            tmp.write_text(text)
            tmp.replace(p)
            changed.append(p)
    return changed
