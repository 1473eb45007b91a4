"""``harness site [--out DIR] [--tracked]`` (``make site``): the static results site from the records.

Kept light at import (``harness.cli`` imports it to register the command).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = ("the static results site (matrix with filters, a page per record, trends, what changed between "
        "two SHAs, bisects, KV per release) from features.toml + reports/records/; opens from file://")


def site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="the folder to write (default reports/site)")
    p.add_argument("--tracked", action="store_true",
                   help="only records git tracks (what a clean checkout holds)")


def cmd_site(a: argparse.Namespace, ws: Any) -> int:
    from harness.console import error
    from harness.console import stdout as console
    from harness.features import CatalogError, tracked_records
    from harness.features.site import build_site

    try:
        built = build_site(ws, a.out.resolve() if a.out else None,
                           paths=tracked_records(ws) if a.tracked else None)
    except CatalogError as e:
        error(e)
        return 2
    index = built.out / "index.html"
    console.print(f"{built.records} records, {built.cells} cells, {built.plots} plots -> {built.pages} pages "
                  f"in {built.seconds:.1f} s; open {index.as_uri()}", highlight=False, soft_wrap=True)
    return 0


SUBCOMMANDS = (("site", HELP, site_args, cmd_site),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
