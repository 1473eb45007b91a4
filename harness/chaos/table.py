"""The fault table: one registered scenario per row, each run on its own and judged by one rule:
nothing lost, no process left.

A scenario is a function ``(tmp folder) -> Row`` registered with :func:`scenario` (one registry
style: :class:`harness.registry.Registry`). ``make chaos`` runs them all, prints the table, writes
it as JSON under ``reports/chaos/`` and as Markdown between the markers in ``docs/chaos.md``; the
opt-in tests (``pytest -m chaos``) run one row each.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.record_paths import portable
from harness.registry import Registry
from harness.workspace import REPO_ROOT


@dataclass(frozen=True, slots=True)
class Row:
    fault: str
    injected: str
    did: str
    """What the harness did: its exit, the error it gave, the record it wrote."""
    lost: str
    """Half-written or missing records, goldens, store files: ``nothing`` is the goal."""
    left: int
    """Processes of the run still alive after it ended (and a settling time): 0 is the goal."""
    seen: int
    """Processes the run started (the process tree watched while it ran)."""
    seconds: float
    figure: str
    """What ``seconds`` measures."""
    ok: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Scenario = Callable[[Path], Row]
SCENARIOS: Registry[Scenario] = Registry("fault")
"""Row name -> scenario; ``meta`` is the number of vLLM engine starts it needs."""


def scenario(name: str, engines: int = 0) -> Callable[[Scenario], Scenario]:
    return SCENARIOS.register(name, meta=engines)


def run_row(name: str, tmp: Path | None = None) -> Row:
    """One row, in a fresh temporary folder (kept when it fails, for the logs)."""
    fn = SCENARIOS.get(name)
    folder = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-", dir=tmp))
    try:
        row = fn(folder)
    except Exception as e:  # noqa: BLE001 - a scenario that breaks is a row that says so
        row = Row(name, "?", f"the scenario itself failed: {type(e).__name__}: {e}", "unknown", -1, 0, 0.0,
                  "", False)
    if row.ok and not os.environ.get("HARNESS_CHAOS_KEEP"):
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    else:
        row = Row(**{**asdict(row), "detail": (row.detail + f"\nfiles: {folder}").strip()})
    return row


BEGIN, END = "<!-- chaos-table:begin -->", "<!-- chaos-table:end -->"


def markdown(rows: Sequence[tuple[str, Row]], header: str) -> str:
    out = [header, "", "| # | fault | injected | what the harness did | lost | processes left | figure |",
           "|---|---|---|---|---|---|---|"]
    for i, (name, r) in enumerate(rows, 1):
        mark = "" if r.ok else " ❌"
        did = r.did.replace("|", "\\|")
        out.append(f"| {i} | {r.fault} (`{name}`) | {r.injected} | {did} | {r.lost}{mark} | "
                   f"{r.left} of {r.seen} | {r.seconds:.1f} {r.figure} |")
    return "\n".join(out) + "\n"


def write_outputs(root: Path, rows: Sequence[tuple[str, Row]],
                  facts: dict[str, Any]) -> tuple[Path, Path | None]:
    """The table as JSON under reports/chaos/ (atomically) and in docs/chaos.md between the markers."""
    out_dir = root / "reports" / "chaos"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = facts["created"].replace(":", "").replace("-", "")
    path = out_dir / f"{stamp}_{(facts.get('sha') or 'nogit')[:10]}.json"
    tmp = path.with_name("." + path.name + ".tmp")
    table = portable({**facts, "rows": {n: r.to_json() for n, r in rows}}, (root, REPO_ROOT))
    tmp.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    doc = root / "docs" / "chaos.md"
    if not doc.exists() or BEGIN not in doc.read_text():
        return path, None
    text = doc.read_text()
    ran = {n for n, _ in rows}
    unrun = [n for n in SCENARIOS.names() if n not in ran]
    head = (f"Measured at {facts['created']} on harness {(facts.get('sha') or 'no git')[:10]}"
            f"{' (dirty tree)' if facts.get('dirty') else ''}, {facts['machine']}; "
            f"{sum(r.ok for _, r in rows)}/{len(rows)} rows: nothing lost, no process left."
            + (f" Not run this time ({len(unrun)} of {len(ran) + len(unrun)} rows): "
               f"{', '.join(f'`{n}`' for n in unrun)}." if unrun else ""))
    new = text[: text.index(BEGIN) + len(BEGIN)] + "\n" + markdown(rows, head) + text[text.index(END):]
    tmp = doc.with_name(".chaos.md.tmp")
    tmp.write_text(new)
    os.replace(tmp, doc)
    return path, doc
