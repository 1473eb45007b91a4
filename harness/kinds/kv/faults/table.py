"""The storage-fault table (connector x fault x release) from the ``kv_faults`` records alone: the
newest record per (model, connector, release), one cell per fault with its outcome symbol and words.
docs/kv-faults.md carries it between markers; a unit test holds the page to the committed records."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.kinds.kv.faults.inject import FAULTS
from harness.records import Record, iter_record_paths, load_record

SUITE = "kv_faults"
BEGIN = "<!-- kv-faults table: generated from reports/records/*/kv_faults (harness.kinds.kv.faults.table) -->"
END = "<!-- end of the kv-faults table -->"


def _release_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))


def connector_of(rec: Record) -> str:
    name = rec.candidate.name
    if name.startswith("vllm@"):
        name = name.partition("/")[2]
    return name.rpartition(":")[2] or name


def newest(records: Iterable[Record]) -> dict[tuple[str, str, str], Record]:
    """(model, connector, release) -> the newest record."""
    out: dict[tuple[str, str, str], Record] = {}
    for rec in sorted(records, key=lambda r: r.created):
        if rec.suite.get("name") != SUITE or rec.extra.get("mode") != "faults":
            continue
        out[(str(rec.model["name"]), connector_of(rec), rec.candidate.version)] = rec
    return out


def render(records: Iterable[Record]) -> str:
    """The Markdown table, one line per (model, connector, release)."""
    table = newest(records)
    names = [f.name for f in FAULTS]
    lines = ["| model | connector | vLLM | " + " | ".join(f"`{n}`" for n in names) + " | record |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for (model, conn, release), rec in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                              _release_key(kv[0][2]))):
        by = {v.case_id: v for v in rec.verdicts}
        cells = []
        for n in names:
            v = by.get(n)
            if v is None:
                cells.append("☐")
                continue
            outcome = str(v.evidence.get("outcome", ""))
            word = {"wrong": "served wrong bytes", "engine_error": "engine error", "recomputed": "recomputed",
                    "refused": "refused", "intact": "byte-equal", "vacuous": "VACUOUS"}.get(outcome, outcome)
            cells.append(f"{v.evidence.get('symbol', '?')} {word}")
        lines.append(f"| {model} | {conn} | {release} | " + " | ".join(cells)
                     + f" | `{rec.id[:15]}…` @ `{(rec.harness.get('sha') or '')[:10]}` |")
    return "\n".join(lines)


def committed(records_root: Path) -> list[Record]:
    return [load_record(p) for p in iter_record_paths(records_root) if f"/{SUITE}/" in p.as_posix()]


def block(records_root: Path) -> str:
    return f"{BEGIN}\n{render(committed(records_root))}\n{END}"


def write_docs(page: Path, records_root: Path) -> bool:
    """Replace the table between the markers of ``page``; whether it changed."""
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page}: no kv-faults table markers ({BEGIN!r} ... {END!r})")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = head + block(records_root) + tail
    page.write_text(new)
    return new != text


if __name__ == "__main__":
    from harness.workspace import REPO_ROOT

    changed = write_docs(REPO_ROOT / "docs" / "kv-faults.md", REPO_ROOT / "reports" / "records")
    print("docs/kv-faults.md: table " + ("rewritten" if changed else "unchanged"))
