"""The results site's builder, without a browser: the pages it writes from records, the links between
them, the plots beside records, nothing fetched from outside, and the what-changed data. The browser
checks are tests/unit/test_site_browser.py (opt-in)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.features import tracked_records
from harness.features.site import build_site
from harness.features.site.build import page_of, reproduce
from harness.workspace import Workspace
from tests.unit.features_kit import commit, make_git_workspace, make_record

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//|fetch\(|XMLHttpRequest""")


def external_references(site: Path) -> list[str]:
    """Pages, scripts and styles that would reach outside the folder (a CDN, a server)."""
    return sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.suffix in (".html", ".js", ".css")
                  and EXTERNAL.search(p.read_text()))


def test_the_site_links_every_cell_to_its_record_page(tmp_path: Path) -> None:
    ws = make_git_workspace(tmp_path / "ws")
    good, good_path = make_record(ws, created="2026-11-30T01:00:00Z")
    (good_path.parent / f"{good_path.stem}.kl_vs_position.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    commit(ws.root, "records")
    bad, _ = make_record(ws, created="2026-11-30T02:00:00Z", outcome="fail",
                         statuses={"near_tie": ["pass"] * 5 + ["fail"] * 3, "strict": ["pass"] * 8})
    built = build_site(ws, tmp_path / "out")
    site = built.out
    assert {p.name for p in site.iterdir()} >= {"index.html", "changes.html", "kv.html", "bisects.html",
                                                "records", "plots", "static"}
    index = (site / "index.html").read_text()
    # the near-tie cell shows the newest current record (◐ 5/8) and opens its page at the cell
    assert f'href="records/{page_of(bad.id)}#cell-near-tie--tiny-llama--hf">◐ 5/8</a>' in index
    page = (site / "records" / page_of(bad.id)).read_text()
    assert 'id="cell-near-tie--tiny-llama--hf"' in page and '<svg class="chart"' in page
    assert page.count("<circle") >= 2  # both records behind the cell are points of its trend
    assert "make gate MODEL=tiny-llama SUITE=smoke CANDIDATE=&#39;hf&#39;" in page
    old = (site / "records" / page_of(good.id)).read_text()
    assert f'src="../plots/{good.id}.kl_vs_position.png"' in old and (site / "plots").is_dir()
    assert json.loads((site / "records" / f"{bad.id}.json").read_text())["id"] == bad.id
    assert external_references(site) == []
    data = json.loads(re.search(r'id="changes-data">(.*?)</script>', (site / "changes.html").read_text(),
                                re.S).group(1))
    assert [c["key"] for c in data["cells"]] == ["near-tie--tiny-llama--hf", "exact--tiny-llama--hf"]
    assert built.records == 2 and built.plots == 1


def test_a_reference_to_the_outside_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text('<script src="https://cdn.example.com/x.js"></script>')
    (tmp_path / "b.css").write_text("body { background: url(//example.com/x.png) }")
    (tmp_path / "c.html").write_text('<a href="records/x.html">x</a> openai:http://127.0.0.1:8000')
    assert external_references(tmp_path) == ["a.html", "b.css"]


def test_a_failed_build_leaves_the_previous_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_git_workspace(tmp_path / "ws")
    make_record(ws)
    out = build_site(ws, tmp_path / "out").out
    before = (out / "index.html").read_text()
    import harness.features.site.build as b

    monkeypatch.setattr(b, "_record_view", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        build_site(ws, out)
    assert (out / "index.html").read_text() == before


def test_reproduce_names_the_make_target_of_each_kind() -> None:
    from tests.unit.features_kit import make_record as mk

    ws = Workspace.default()
    rec, _ = mk(ws, write=False)
    assert reproduce(rec, "p.json") == "make gate MODEL=tiny-llama SUITE=smoke CANDIDATE='hf'"
    from dataclasses import replace

    assert reproduce(replace(rec, kind="localize"), "p.json") == "make localize RECORD=p.json"
    assert reproduce(replace(rec, kind="sampling"), "p.json").startswith("make sampling MODEL=tiny-llama")


def test_the_committed_records_build_into_a_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ws = Workspace.default()
    paths = tracked_records(ws)
    if paths is None:
        pytest.skip("not a git checkout: the committed records cannot be listed")
    monkeypatch.chdir(tmp_path)
    assert main(["site", "--tracked", "--out", "site"]) == 0  # a relative folder: from here
    out = " ".join(capsys.readouterr().out.split())
    assert f"{len(paths)} records" in out and "open file://" in out
    site = tmp_path / "site"
    index = (site / "index.html").read_text()
    linked = set(re.findall(r'href="records/([^"#]+)', index))
    assert linked and all((site / "records" / name).is_file() for name in linked)
    assert len(list((site / "records").glob("*.html"))) == len(paths)
    assert external_references(site) == []


def test_a_failing_cell_names_the_first_bad_commit_its_bisect_found(tmp_path: Path) -> None:
    from dataclasses import replace

    from harness.records import write_record

    ws = make_git_workspace(tmp_path / "ws")
    bad, _ = make_record(ws, outcome="fail", statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    found = {"over": "history", "reference": "a" * 40, "end": "b" * 40,
             "result": {"kind": "found", "first_new": "c" * 40, "last_old": "d" * 40, "direction": "broke",
                        "statement": "first commit whose verdicts differ: cccccccccc"}}
    for candidate, result in (("bisect:hf@aaaa..bbbb", found),  # about this engine: shown
                              ("bisect:cpp@aaaa..bbbb", found),  # another engine: not shown
                              ("bisect:hf@eeee..ffff", {**found, "result": {"kind": "no_change"}})):
        rec, _ = make_record(ws, candidate=candidate, created="2026-11-30T05:00:00Z", write=False,
                             extra={"bisect": result})
        write_record(ws.records, replace(rec, kind="bisect"))
    site = build_site(ws, tmp_path / "out").out
    index = (site / "index.html").read_text()
    assert index.count("first bad:") == 2  # the hf column's two failing rows, once each
    row = re.search(r'data-col="hf" data-state="fail".*?</td>', index, re.S).group(0)
    assert "first bad: <a" in row and ">cccccccccc</a>" in row
    assert "cccccccccc" not in re.search(r'data-col="cpp".*?</td>', index, re.S).group(0)
    bisects = (site / "bisects.html").read_text()
    assert bisects.count("<tr><td><a") == 3 and "no_change" in bisects
    assert f"records/{page_of(bad.id)}" not in bisects  # the gate record is no bisect
