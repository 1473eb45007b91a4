"""The harness's consoles: one place decides how wide and how wrapped its output is.

In a terminal, rich measures the terminal. Anywhere else -- a CI log, a pipe, a file -- there is no
terminal to measure, and rich's fallback of 80 columns cut column heads ("bit_exac") and verdicts
mid-word. There tables are laid out to ``$COLUMNS`` when set, else :data:`LOG_WIDTH`, and plain
lines are never broken (a log keeps an error, a record path or a verdict on one line, for grep).
A table with more columns than fit is printed one block per row (:func:`whole`): a head or a verdict
is never cut.
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

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
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


def _cell(value: RenderableType, console: Console) -> Text:
    if isinstance(value, Text):
        return value
    if isinstance(value, str):
        return console.render_str(value, highlight=False)
    return Text(str(value))


def fits(table: Table, console: Console) -> bool:
    """Whether ``table`` fits the console's width with no head or word cut: the sum of its columns'
    narrowest widths (each its longest word), borders and padding included."""
    widest = console.options.update_width(1 << 16)
    return Measurement.get(console, widest, table).minimum <= console.width


def whole(table: Table, console: Console) -> RenderableType:
    """``table`` itself when it fits (rich wraps its cells at word boundaries); else one block per
    row -- the first cell, then a ``head: value`` line for each other column -- which a terminal wraps
    at words and a log keeps on one line each. The title stays on top."""
    if fits(table, console):
        return table
    heads = [_cell(c.header, console) for c in table.columns]
    cells = [list(c.cells) for c in table.columns]
    out: list[RenderableType] = []
    if table.title:
        out.append(_cell(table.title, console))
    for i in range(table.row_count):
        row = [_cell(col[i], console) if i < len(col) else Text("") for col in cells]
        out.append(Text.assemble(heads[0], ": ", row[0], style="bold"))
        for head, value in zip(heads[1:], row[1:], strict=True):
            if value.plain:
                out.append(Text.assemble("  ", head, ": ", value))
    return Group(*out)


def print_table(table: Table, console: Console | None = None) -> None:
    """Print ``table`` whole (:func:`whole`) on ``console`` (default: :data:`stdout`)."""
    con = console or stdout
    con.print(whole(table, con), highlight=False)
