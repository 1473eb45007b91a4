"""The ``harness`` command: parses the command line and dispatches to :mod:`harness.commands`, where
every subcommand lives. The Makefile calls it; every subcommand is documented in docs/.

Exit codes: 0 pass, 1 the gate failed (fail/error/refused/vacuous), 2 bad input (unknown model,
suite or candidate; malformed suite; missing or stale goldens).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from harness.api import EngineRefused
from harness.commands import SUBCOMMANDS
from harness.console import error
from harness.console import stderr as err
from harness.engines.launch.venvs import VenvError
from harness.goldens import GoldenError
from harness.models.built import ModelBuildError
from harness.records import RecordError
from harness.registry import Registry, UnknownName
from harness.signals import Terminated
from harness.steps import interrupted_steps
from harness.suites import SuiteError
from harness.workspace import Workspace

BAD_INPUT = (UnknownName, SuiteError, GoldenError, RecordError, FileNotFoundError, EngineRefused, VenvError,
             ModelBuildError)

Command = Callable[[argparse.Namespace, Workspace], int]
COMMANDS: Registry[Command] = Registry("command")
"""Subcommand -> function; ``meta`` adds its arguments to the parser."""

for _name, _help, _args, _fn in SUBCOMMANDS:
    COMMANDS.register(_name, help=_help, meta=_args)(_fn)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="harness", description="parity gates against a pinned vLLM")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for e in COMMANDS.entries():
        e.meta(sub.add_parser(e.name, help=e.help))
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    fn = COMMANDS.get(a.cmd)
    try:
        return fn(a, Workspace.default())
    except BAD_INPUT as e:
        error(e)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: the engines are stopped on the way out (finally blocks)
        if isinstance(e, Terminated):
            raise
        err.print(f"interrupted: {' › '.join(interrupted_steps()) or f'harness {a.cmd}'}, nothing written",
                  highlight=False, markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
