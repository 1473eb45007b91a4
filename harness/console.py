"""The harness's consoles: one place decides how wide and how wrapped its output is.

In a terminal, rich measures the terminal. Anywhere else -- a CI log, a pipe, a file -- there is no
terminal to measure, and rich's fallback of 80 columns cut column heads ("bit_exac") and verdicts
mid-word. There tables are laid out to ``$COLUMNS`` when set, else :data:`LOG_WIDTH`, and plain
lines are never broken (a log keeps an error, a record path or a verdict on one line, for grep).
Every console of the harness comes from :func:`make_console`; ``stdout``/``stderr`` are the two the
command line prints through.

Markup is off on every one of them: what the harness prints is the user's own text (suite names,
``[sampling_gate]`` tables, engine logs), and rich would read ``[name]`` as a style and drop it.
Style comes from :class:`rich.text.Text` or ``style=`` instead: :func:`error`, :func:`warning` and
:func:`note` for the lines every command prints, :func:`print_table` for tables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

LOG_WIDTH = 120
"""Columns of output that goes to no terminal (``$COLUMNS`` overrides it)."""


def log_width(environ: Mapping[str, str] = os.environ) -> int:
    """The width of output that goes to no terminal: ``$COLUMNS`` when it is a positive number."""
    columns = environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def make_console(*, stderr: bool = False, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> Console:
    """A rich console for stdout (or stderr) that is readable where it ends up.

    The stream is looked up when the console prints (so pytest's capture and rich's live display
    still reach it); whether it is a terminal is decided here, once. ``kwargs`` go to
    :class:`rich.console.Console` (an explicit ``width`` or ``file`` wins).
    """
    stream = kwargs.get("file") or (sys.stderr if stderr else sys.stdout)
    if "width" not in kwargs and not _isatty(stream):
        kwargs["width"] = log_width(environ)
        kwargs.setdefault("soft_wrap", True)
    kwargs.setdefault("markup", False)
    kwargs.setdefault("_environ", environ)  # rich reads $COLUMNS too: the same environment decides
    return Console(stderr=stderr, **kwargs)


stdout = make_console()
"""What the ``harness`` command prints: tables, verdicts, outcomes."""
stderr = make_console(stderr=True)
"""Errors, warnings and the progress of long steps (:mod:`harness.steps`)."""


def error(message: object, console: Console | None = None, label: str = "error") -> None:
    """``error: <message>`` on stderr, the message as written (brackets and all)."""
    (console or stderr).print(Text.assemble((f"{label}:", "bold red"), " ", str(message)), highlight=False)


def warning(message: object, console: Console | None = None) -> None:
    """``warning: <message>`` on stderr, the message as written."""
    (console or stderr).print(Text.assemble(("warning:", "yellow"), " ", str(message)), highlight=False)


def note(message: object, console: Console | None = None) -> None:
    """A dim line (progress, what was skipped) on stdout, the message as written."""
    (console or stdout).print(Text(str(message), style="dim"), highlight=False)
