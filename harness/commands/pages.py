"""``harness features``, ``harness history``, ``harness trend``: the generated pages and what stands
behind one of their rows over time.

Kept light at import (:mod:`harness.cli` registers :data:`SUBCOMMANDS`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.console import error, note, print_table, warning
from harness.console import stderr as err
from harness.console import stdout as console
from harness.workspace import Workspace


def _features_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when FEATURES.md / SUPPORTED_MODELS.md differ")
    p.add_argument("--tracked", action="store_true",
                   help="only records git tracks (what a clean checkout holds)")


def cmd_features(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.features import CatalogError, CitationError, generate, tracked_records, write_pages

    try:
        g = generate(ws, paths=tracked_records(ws) if a.tracked else None)
    except (CatalogError, CitationError) as e:
        error(e)
        return 2
    for b in g.table.broken:
        warning(f"unreadable record {b.path}: {b.error}")
    f = g.figures()
    tally = ", ".join(f"{k} {v}" for k, v in f.items() if v and k not in ("records", "cells"))
    if a.check:
        stale = [n for n, text in (("FEATURES.md", g.features), ("SUPPORTED_MODELS.md", g.supported))
                 if not (ws.root / n).exists() or (ws.root / n).read_text() != text]
        for n in stale:
            err.print(f"{n} is not what the generator writes from the records: run `make features`")
        return 1 if stale else 0
    changed = write_pages(ws, g)
    console.print(f"{f['records']} records -> {f['cells']} cells ({tally}); "
                  + (f"wrote {', '.join(p.name for p in changed)}" if changed else "unchanged"))
    return 0


def _history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("feature", help="a row id of features.toml")
    p.add_argument("--column", default=None, help="one column key (default: every candidate)")


def cmd_history(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.features import CATALOG, CatalogError, history, history_table, load_catalog

    try:
        cat = load_catalog(ws.root / CATALOG, ws)
    except CatalogError as e:
        error(e)
        return 2
    entries = history(ws, cat, a.feature, a.column)
    print_table(history_table(cat.row(a.feature), entries), console)
    if not entries:
        console.print("no records yet for this row")
    return 0


def _trend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("feature", help="a row id of features.toml, or bench:<figure> for a make bench figure")
    p.add_argument("--metric", default=None, help="e.g. kl.mean, drift.slope_per_1k, near_tie.pass_rate "
                                                 "(default: the row's first comparator's); for bench: "
                                                 "ratio (default) or value")
    p.add_argument("--column", default=None, help="one column key (default: every candidate)")
    p.add_argument("--out", type=Path, default=None,
                   help="the PNG (default reports/trends/<feature>.<metric>.png)")


def cmd_trend(a: argparse.Namespace, ws: Workspace) -> int:
    from rich.table import Table

    from harness.features import CatalogError
    from harness.features.trend import BENCH, trend, trend_bench

    try:
        t = (trend_bench(ws, a.feature[len(BENCH):], a.metric, a.out) if a.feature.startswith(BENCH)
             else trend(ws, a.feature, a.metric, a.column, a.out))
    except CatalogError as e:
        error(e)
        return 2
    table = Table(title=f"{t.feature}: {t.metric} across commits (oldest first)")
    for col in ("commit", "sha", "series", t.metric, "record"):
        table.add_column(col)
    for p in t.points:
        table.add_row(str(p.commit_order), p.sha[:10], p.series, f"{p.value:.6g}", p.record)
    print_table(table, console)
    for p, why in t.outside:
        note(f"not plotted: {p.record} ({p.sha[:10]}): {why}")
    console.print(f"PNG: {t.png}" if t.png else "no record of this row is in HEAD's history: nothing plotted")
    return 0


SUBCOMMANDS = (
    ("features", "write FEATURES.md and SUPPORTED_MODELS.md from features.toml + records",
     _features_args, cmd_features),
    ("history", "the records behind one FEATURES.md row over time, newest first", _history_args, cmd_history),
    ("trend", "one metric of a FEATURES.md row across the commits of the history (table + PNG)",
     _trend_args, cmd_trend),
)
"""(name, help, arguments, function) of each subcommand, registered by :mod:`harness.cli`."""
