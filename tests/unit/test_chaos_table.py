"""The fault table's outputs (harness/chaos/table.py): the JSON under reports/chaos/ and the table
between the markers of docs/chaos.md, which names the rows a partial run left out."""

from __future__ import annotations

import json
from pathlib import Path

from harness.chaos import SCENARIOS
from harness.chaos.table import BEGIN, END, Row, write_outputs

FACTS = {"created": "2026-12-02T05:00:00Z", "sha": "0123456789abcdef", "dirty": False,
         "machine": "2 CPU cores (x86_64), shared with other work"}


def _row(name: str, ok: bool) -> Row:
    return Row(name, "a planted fault", "exit 2: error: named", "nothing" if ok else "a record", 0, 3, 1.5,
               "s until no process was left", ok)


def test_a_partial_run_names_the_rows_it_left_out_and_keeps_the_page_around_the_table(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "chaos.md"
    page.write_text(f"# Faults\n\nbefore\n\n{BEGIN}\n(old table)\n{END}\n\nafter\n")
    first, second = SCENARIOS.names()[:2]
    json_path, doc = write_outputs(tmp_path, [(first, _row(first, True)), (second, _row(second, False))], FACTS)
    text = page.read_text()
    assert doc == page and "(old table)" not in text
    assert text.startswith("# Faults\n\nbefore\n") and text.endswith("after\n")
    assert "1/2 rows: nothing lost, no process left." in text
    left_out = [n for n in SCENARIOS.names() if n not in (first, second)]
    assert f"Not run this time ({len(left_out)} of {len(SCENARIOS.names())} rows)" in text
    assert all(f"`{n}`" in text.split(END)[0] for n in left_out)
    assert "a record ❌" in text  # a row that lost something is marked
    saved = json.loads(json_path.read_text())
    assert set(saved["rows"]) == {first, second} and saved["sha"] == FACTS["sha"]
    assert not list(json_path.parent.glob(".*"))  # written atomically: no temporary file left


def test_a_full_run_says_nothing_was_left_out(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "chaos.md").write_text(f"{BEGIN}\n{END}\n")
    rows = [(n, _row(n, True)) for n in SCENARIOS.names()]
    write_outputs(tmp_path, rows, FACTS)
    text = (tmp_path / "docs" / "chaos.md").read_text()
    assert f"{len(rows)}/{len(rows)} rows" in text and "Not run" not in text
