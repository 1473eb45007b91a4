"""Short cells for the generated pages: reference-style record links and numbered notes.

A table cell that carries a 90-character record path, a SHA, a device class and the failing cases
makes a table wider than any screen. Here a cell carries a label (``[✅ 8/8][r3]``) and at most a note
number; the paths go into link definitions under the table (``[r3]: reports/records/…``), which
Markdown renders invisibly, and the words go into numbered notes under the table.
"""

from __future__ import annotations

import re

DEFINITION = re.compile(r"^\[[^\]]+\]:\s*(\S+)", re.M)
"""A reference-style link definition (``[r3]: path``): its target."""


class Refs:
    """Record paths -> short labels, one label per path for the whole page (``r1``, ``r2``, …)."""

    def __init__(self, prefix: str = "r") -> None:
        self.prefix = prefix
        self.labels: dict[str, str] = {}
        self._pending: list[str] = []

    def label(self, path: str) -> str:
        if path not in self.labels:
            self.labels[path] = f"{self.prefix}{len(self.labels) + 1}"
            self._pending.append(path)
        return self.labels[path]

    def link(self, text: str, path: str) -> str:
        return f"[{text}][{self.label(path)}]"

    def definitions(self) -> list[str]:
        """The definitions of the labels handed out since the last call (one block under a table)."""
        out = [f"[{self.labels[p]}]: {p}" for p in self._pending]
        self._pending = []
        return out


class Notes:
    """Numbered notes under one table; the same words get the same number."""

    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def number(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts) + 1)

    def mark(self, text: str) -> str:
        return f"<sup>{self.number(text)}</sup>"

    def lines(self) -> list[str]:
        return [f"{n}. {text}" for text, n in self.texts.items()]


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces as hyphens)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
