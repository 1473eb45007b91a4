"""A record as GitHub-flavoured Markdown (``harness show --markdown RECORD``), for a CI job summary
(``>> "$GITHUB_STEP_SUMMARY"``): the same sections the console prints (:func:`harness.report.sections`),
the outcome first."""

from __future__ import annotations

from itertools import groupby

from rich.table import Table
from rich.text import Text

from harness.records import Record
from harness.report import Section, sections

ICON = {"pass": "✅", "fail": "❌", "error": "❌", "refused": "⛔", "skip": "☐", "vacuous": "⚠️"}


def cell(value: object) -> str:
    """One table cell: plain text, pipes escaped, line breaks as ``<br>``."""
    text = value.plain if isinstance(value, Text) else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>").strip()


def table_markdown(t: Table) -> list[str]:
    """A rich table as a Markdown table (its title in bold above it)."""
    cols = t.columns
    rows = [[cell(c) for c in col.cells] for col in cols]
    out = [f"**{cell(t.title)}**", ""] if t.title else []
    out += ["| " + " | ".join(cell(c.header) or " " for c in cols) + " |",
            "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r[i] for r in rows) + " |" for i in range(t.row_count)]
    return [*out, ""]


def fenced(lines: list[str]) -> list[str]:
    fence = "````" if any("```" in line for line in lines) else "```"
    return [fence + "text", *lines, fence, ""]


def record_markdown(rec: Record, path: str = "") -> str:
    """The report of ``rec`` as Markdown: a heading with the outcome, the summary, the tables,
    the failing gated verdicts' explanations folded under ``<details>``, and the provenance."""
    parts = list(sections(rec, path))
    out = [f"### {ICON.get(rec.outcome, '')} {rec.outcome}: {rec.model['name']} / {rec.suite['name']} "
           f"v{rec.suite['version']} · {rec.candidate.name} ({rec.candidate.engine} {rec.candidate.version})",
           "", cell(rec.summary), ""]
    for kind, group in groupby(parts, key=lambda s: s.kind):
        items = list(group)
        if kind == "pre":
            out += fenced([_plain(s) for s in items])
        elif kind == "note":
            out += [*(f"- {cell(_plain(s))}" for s in items), ""]
        elif kind == "provenance":
            out += [f"<sub>{cell(_plain(s))}</sub>" for s in items]
        for s in items:
            if kind == "table" and isinstance(s.body, Table):
                out += table_markdown(s.body)
            elif kind == "detail":
                text = _plain(s).splitlines() or [""]
                out += [f"<details><summary>{cell(text[0])}</summary>", "", *fenced(text), "</details>", ""]
        # "outcome" is the heading and summary above
    return "\n".join(out).rstrip("\n") + "\n"


def _plain(s: Section) -> str:
    return s.body.plain if isinstance(s.body, Text) else str(s.body)
