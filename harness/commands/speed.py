"""``harness speed``: a candidate's tok/s and TTFT at several concurrencies beside the pinned oracle's.

Kept light at import (:mod:`harness.cli` registers :data:`SUBCOMMANDS`).
"""

from __future__ import annotations

import argparse

from harness.commands.gate import model_suite_args
from harness.console import error, print_table
from harness.console import stdout as console
from harness.workspace import Workspace


def _speed_args(p: argparse.ArgumentParser) -> None:
    model_suite_args(p)
    p.add_argument("--candidate", default="vllm-server", help="engine spec (default vllm-server)")
    p.add_argument("--levels", default="1,4,8", help="concurrencies, e.g. 1,4,8")


def cmd_speed(a: argparse.Namespace, ws: Workspace) -> int:
    from rich.table import Table

    from harness.speedrun import run_speed

    try:
        levels = [int(x) for x in a.levels.replace(" ", "").split(",") if x]
    except ValueError:
        error(f"--levels {a.levels!r}: give concurrencies like 1,4,8")
        return 2
    if not levels or min(levels) < 1:
        error(f"--levels {a.levels!r}: give concurrencies >= 1")
        return 2
    run = run_speed(ws, a.model, a.suite, a.candidate, levels)
    t = Table(title=f"{a.model} / {a.suite}: {a.candidate} beside the oracle ({run.data['oracle']['pin']})")
    for col in ("c", "candidate tok/s", "oracle tok/s", "TTFT p50 cand / oracle (ms)", "statement"):
        t.add_column(col)
    for r in run.data["rows"]:
        cand, orc = r.get("candidate") or {}, r.get("oracle") or {}
        ttft = f"{(cand.get('ttft_ms') or {}).get('p50', '—')} / {(orc.get('ttft_ms') or {}).get('p50', '—')}"
        t.add_row(str(r["concurrency"]), str(cand.get("output_tok_s", "—")),
                  str(orc.get("output_tok_s", "—")), ttft, r["statement"])
    print_table(t, console)
    console.print(f"candidate: {run.data['how']['candidate']}; oracle: {run.data['how']['oracle']}")
    shown = run.path.relative_to(ws.root) if run.path.is_relative_to(ws.root) else run.path
    console.print(f"written: {shown}")
    return 0


SUBCOMMANDS = (
    ("speed", "a candidate's tok/s and TTFT at c1/c4/c8 beside the pinned oracle's (one start each)",
     _speed_args, cmd_speed),
)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
