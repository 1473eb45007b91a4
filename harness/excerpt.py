"""How much of a long text a message keeps: each width named once.

Verdict summaries are one line; reasons quoted inside other lines are shorter; notes and errors kept
in records are longer; engine logs are kept by their end. Every cut is marked with ``…``.
"""

from __future__ import annotations

from pathlib import Path

LINE = 160
"""A verdict summary, or the first line of a reason standing in one."""
INLINE = 80
"""A reason quoted inside another line: a table cell, one part of a summary, a prompt prefix."""
NOTE = 400
"""A control's note, an error or a server reply kept in a record."""
LOG = 4000
"""The end of an engine's log kept in a record."""
MARK = "…"


def clip(text: str, limit: int = NOTE) -> str:
    """``text`` cut to at most ``limit`` characters, the cut marked."""
    return text if len(text) <= limit else text[: max(0, limit - len(MARK))] + MARK


def first_line(text: str, limit: int = LINE) -> str:
    """The first line of ``text``, cut to ``limit`` characters (empty for an empty text)."""
    lines = text.strip().splitlines()
    return clip(lines[0], limit) if lines else ""


def tail(text: str, limit: int = LOG) -> str:
    """The last ``limit`` characters of ``text`` (a log is read from its end), the cut marked."""
    return text if len(text) <= limit else MARK + text[len(text) - limit + len(MARK):]


def file_tail(path: Path | None, n: int = 4000) -> str:
    """The last ``n`` characters of a log file; empty when there is none (the engine never wrote)."""
    if path is None or not path.exists():
        return ""
    return path.read_text(errors="replace")[-n:]
