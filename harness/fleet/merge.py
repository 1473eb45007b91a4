"""Every shard's records into one workspace, the pages regenerated, and one verdict for the fleet.

``harness merge --matrix fleet.toml SHARD_DIR…`` (the merge job, after downloading every shard's
artifact):

1. **collect**: every record file under a ``records/`` folder of each source is copied into
   ``reports/records/<model>/<suite>/`` (temp file + ``link``, never over an existing file; a file
   already there with the same bytes — a committed record the shard uploaded too — is skipped, one
   with other bytes is an error naming both), and every ``results-*.jsonl`` line is read;
2. **regenerate** FEATURES.md and SUPPORTED_MODELS.md from the committed records plus the new ones
   (:func:`harness.features.generate` / :func:`~harness.features.write_pages`);
3. **judge** — the fleet fails when
   * an entry of the matrix has no result (its shard was cancelled, crashed or ran another plan),
     or ran twice, or its record did not arrive;
   * an entry's outcome is not what the matrix expects (``expect``, default ``pass``); a
     ``vacuous`` outcome always fails;
   * a **gated row** of FEATURES.md (one whose comparators are all gates of the record it cites)
     shows a new record as VACUOUS, ❌ or ◐ when its entry expects a pass, or as ⌛ at all (a record
     made by this very run cannot be stale unless the shards ran on another commit);
4. **report**: the entry table, the problems and the regenerated verdict tables as Markdown (for
   ``$GITHUB_STEP_SUMMARY``).
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.features import Generated, generate, tracked_records, write_pages
from harness.fleet.spec import Entry, load_matrix
from harness.records import RecordError, load_record
from harness.workspace import Workspace


class MergeError(ValueError):
    """Shard outputs that cannot be merged; the message names the file."""


@dataclass(frozen=True, slots=True)
class Collected:
    fresh: tuple[Path, ...]
    """Record files (JSON) this merge added to the workspace."""
    same: int
    """Files already present with the same bytes (committed records a shard uploaded too)."""
    results: tuple[dict[str, Any], ...]


def _place(src: Path, dest: Path) -> bool:
    """Copy ``src`` to ``dest`` atomically; False when an identical file is already there."""
    if dest.exists():
        if filecmp.cmp(src, dest, shallow=False):
            return False
        raise MergeError(f"{src}: {dest} already exists with other bytes (two runs wrote one record "
                         "name?); records are never overwritten")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.link(tmp, dest)
    finally:
        os.unlink(tmp)
    return True


def collect(ws: Workspace, sources: Sequence[Path]) -> Collected:
    fresh, same, results = [], 0, []
    for src in sources:
        if not src.is_dir():
            raise MergeError(f"{src}: not a folder (give each shard's downloaded artifact folder)")
        for f in sorted(p for p in src.rglob("*") if p.is_file()):
            parts = f.relative_to(src).parts
            if f.name.startswith("results-") and f.suffix == ".jsonl":
                for n, line in enumerate(f.read_text().splitlines(), 1):
                    if not line.strip():
                        continue
                    try:
                        d = json.loads(line)
                        d["id"], d["record"], d["outcome"]  # noqa: B018 - the fields the merge needs
                    except (ValueError, KeyError, TypeError) as e:
                        raise MergeError(f"{f}:{n}: not a results line ({type(e).__name__}: {e})") from None
                    results.append({**d, "source": str(f)})
                continue
            if "records" not in parts[:-1] or f.name.startswith("."):
                continue
            i = len(parts) - 1 - parts[::-1].index("records")
            rel = parts[i + 1:]
            if len(rel) != 3:  # <model>/<suite>/<file>
                continue
            if _place(f, ws.records.joinpath(*rel)):
                if f.suffix == ".json":
                    fresh.append(ws.records.joinpath(*rel))
            else:
                same += 1
    return Collected(tuple(fresh), same, tuple(results))


@dataclass(frozen=True, slots=True)
class EntryRow:
    entry: Entry
    outcome: str
    summary: str
    record: str
    ok: bool
    note: str


@dataclass(frozen=True, slots=True)
class Merged:
    rows: tuple[EntryRow, ...]
    problems: tuple[str, ...]
    generated: Generated
    collected: Collected
    written: tuple[Path, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems


def _judge_entries(ws: Workspace, entries: Sequence[Entry], results: Sequence[dict[str, Any]]
                   ) -> tuple[list[EntryRow], list[str], dict[str, Entry]]:
    """Rows per entry, problems, and record path -> the entry that wrote it."""
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_id[str(r["id"])].append(r)
    known = {e.id for e in entries}
    problems = [f"{i}: a result for an entry this matrix does not have ({by_id[i][0]['source']})"
                for i in sorted(set(by_id) - known)]
    rows, owner = [], {}
    for e in entries:
        got = by_id.get(e.id, [])
        if not got:
            problems.append(f"{e.id}: no result — its shard did not run it (cancelled, crashed, or "
                            "planned at another commit)")
            rows.append(EntryRow(e, "—", "no result", "", False, "did not run"))
            continue
        if len(got) > 1:
            problems.append(f"{e.id}: ran {len(got)} times ({', '.join(r['source'] for r in got)}): "
                            "shards must be disjoint")
        r = got[-1]
        path = ws.root / r["record"]
        owner[Path(r["record"]).as_posix()] = e
        if not path.is_file():
            problems.append(f"{e.id}: its record {r['record']} did not arrive with the shard's artifact")
            rows.append(EntryRow(e, r["outcome"], r.get("summary", ""), r["record"], False, "no record"))
            continue
        try:
            outcome = load_record(path).outcome
        except RecordError as err:
            problems.append(f"{e.id}: {err}")
            rows.append(EntryRow(e, "unreadable", "", r["record"], False, "unreadable record"))
            continue
        if outcome == "vacuous":
            ok, note = False, "VACUOUS: the gate could not have failed"
        elif outcome == e.expect:
            ok, note = True, "as expected" if e.expect == "pass" else f"expected {e.expect}: {e.because}"
        else:
            ok, note = False, f"expected {e.expect}, got {outcome}"
        if not ok:
            problems.append(f"{e.id}: {note} — {r.get('summary', '')} ({r['record']})")
        rows.append(EntryRow(e, outcome, r.get("summary", ""), r["record"], ok, note))
    return rows, problems, owner


def _judge_rows(g: Generated, owner: dict[str, Entry], fresh: set[str], ws: Workspace) -> list[str]:
    problems = []
    cat = g.table.catalog
    for (row_id, _model, col), cell in sorted(g.table.cells.items()):
        if cell.record not in fresh or col not in {c.key for c in cat.columns}:
            continue
        row = cat.row(row_id)
        rec = load_record(ws.root / cell.record)
        if not set(row.prove) <= set(rec.gates):
            continue  # reported, not gated (e.g. strict on smoke): the page shows it, the fleet does not fail
        e = owner.get(cell.record)
        expected_bad = e is not None and e.expect != "pass"
        where = f"FEATURES.md row {row_id}, column {col}"
        if cell.state == "vacuous":
            problems.append(f"{where}: VACUOUS — {cell.text} ({cell.record})")
        elif cell.state == "stale":
            problems.append(f"{where}: a record made by this run is already stale — {cell.text}")
        elif cell.state in ("fail", "partial") and not expected_bad:
            problems.append(f"{where}: {cell.symbol} {cell.text} ({cell.record})")
    return problems


def merge(ws: Workspace, matrix: Path, sources: Sequence[Path], *, device: str | None = None,
          write: bool = True) -> Merged:
    entries = load_matrix(matrix).for_device(device)
    got = collect(ws, sources)
    tracked = tracked_records(ws)
    paths = None if tracked is None else sorted(set(tracked) | set(got.fresh))
    g = generate(ws, paths=paths)
    written = tuple(write_pages(ws, g)) if write else ()
    rows, problems, owner = _judge_entries(ws, entries, got.results)
    fresh = {p.relative_to(ws.root).as_posix() for p in got.fresh}
    problems += _judge_rows(g, owner, fresh, ws)
    return Merged(tuple(rows), tuple(problems), g, got, written)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def summary_markdown(m: Merged) -> str:
    """The verdict for ``$GITHUB_STEP_SUMMARY``: entries, problems, the regenerated tables."""
    ran = sum(1 for r in m.rows if r.outcome != "—")
    head = "PASS" if m.ok else "FAIL"
    out = [f"## Fleet verdict: {head}", "",
           f"{len(m.rows)} entries planned, {ran} ran, {len(m.collected.fresh)} new records merged "
           f"({m.collected.same} already present); {len(m.problems)} problem(s).", "",
           "| entry | device | expected | outcome | verdict | summary | record |",
           "|---|---|---|---|---|---|---|"]
    for r in m.rows:
        mark = "✅" if r.ok else "❌"
        out.append(f"| `{_cell(r.entry.id)}` | {r.entry.device} | {r.entry.expect} | {r.outcome} | "
                   f"{mark} {_cell(r.note)} | {_cell(r.summary)} | {_cell(r.record) or '—'} |")
    if m.problems:
        out += ["", "### Problems", ""] + [f"- {_cell(p)}" for p in m.problems]
    page = m.generated.features
    first = page.find("\n## ")
    out += ["", "## FEATURES.md, regenerated from the committed and the new records", "",
            page[first + 1:] if first >= 0 else page]
    return "\n".join(out).rstrip() + "\n"
