"""The results site in a real browser: Debian's Chromium, driven by Playwright for Python through its
bring-your-own-browser launch (no browser download). Opt-in (`-m browser`, `make site-test`): it
skips, naming what is missing, without Chromium or Playwright (`pip install -e '.[site]'`,
`apt-get install chromium`).

The site is built from this checkout's committed records and opened from file://: every filter
changes the rows shown, a cell's link opens its record's page with the cell's trend drawn, the
what-changed view lists flipped cells, and no page logs a console error."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.features import tracked_records
from harness.features.site import build_site
from harness.workspace import Workspace

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("HARNESS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set HARNESS_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[site]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = Workspace.default()
    return build_site(ws, tmp_path_factory.mktemp("site") / "site", paths=tracked_records(ws)).out


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("request", lambda r: errors.append(f"fetched {r.url}") if not r.url.startswith(("file:", "data:"))
          else None)
    yield pg
    pg.close()
    assert errors == [], f"console errors or network requests: {errors}"


def shown(pg: Any) -> int:
    return pg.locator("#matrix tr.frow:not([hidden])").count()


def test_every_filter_changes_the_rows_shown(page: Any, site: Path) -> None:
    page.goto((site / "index.html").as_uri())
    everything = shown(page)
    assert everything > 50 and page.locator("#shown").inner_text() == f"{everything} rows shown"
    picks = {"engine": "releases", "model": "tiny-gpt2", "section": "Sampling", "status": "fail"}
    devices = page.locator("select[name=device] option").all_inner_texts()
    picks["device"] = next(d for d in devices if d.startswith("cuda"))
    for name, value in picks.items():
        page.select_option(f"select[name={name}]", value)
        n = shown(page)
        assert 0 < n < everything, f"filter {name}={value}: {n} of {everything} rows"
        page.select_option(f"select[name={name}]", "")
        assert shown(page) == everything
    page.fill("input[name=q]", "kv-fault")
    n = shown(page)
    assert 0 < n < everything and all("kv-fault" in t for t in
                                      page.locator("#matrix tr.frow:not([hidden]) th.feat").all_inner_texts())
    page.fill("input[name=q]", "")
    # the engine filter hides the other columns too
    page.select_option("select[name=engine]", "vllm")
    assert page.locator("#matrix thead th[data-col]:visible").all_inner_texts() == ["vllm"]
    if os.environ.get("HARNESS_SITE_SCREENSHOT"):  # the picture in docs/: one model, from the filters on
        page.select_option("select[name=engine]", "")
        page.select_option("select[name=model]", "tiny-llama")
        page.locator("#matrix").evaluate("t => window.scrollTo(0, t.offsetTop - 120)")
        page.screenshot(path=os.environ["HARNESS_SITE_SCREENSHOT"],
                        clip={"x": 0, "y": 0, "width": 1280, "height": 720})


def test_a_cell_opens_its_record_page_with_the_trend(page: Any, site: Path) -> None:
    page.goto((site / "index.html").as_uri())
    row = page.locator('#matrix tr.frow[data-search^="greedy-near-tie"]').first
    cell = row.locator('td.cell[data-col="hf"] a')
    assert row.locator('td.cell[data-col="hf"] svg.spark circle').count() >= 1  # the sparkline
    href = cell.get_attribute("href")
    cell.click()
    page.wait_for_load_state()
    assert page.url.endswith(href.split("/", 1)[1]) and "/records/" in page.url
    box = page.locator(f"section#{href.split('#')[1]}")
    assert box.is_visible() and box.locator("svg.chart circle").count() >= 1
    assert page.locator("table.verdicts tbody tr").count() >= 8
    assert "make gate MODEL=tiny-llama SUITE=smoke" in page.locator("code.cmd").inner_text()


def test_a_record_page_shows_its_plots(page: Any, site: Path) -> None:
    plotted = sorted((site / "plots").glob("*.kl_vs_position.png"))
    assert plotted, "no plot was copied into the site"
    rec = plotted[0].name.split(".kl_vs_position")[0]
    page.goto((site / "records" / f"{rec}.html").as_uri())
    img = page.locator(".plots img").first
    assert img.evaluate("i => i.complete && i.naturalWidth > 0")


def test_what_changed_lists_flipped_cells_with_both_records(page: Any, site: Path) -> None:
    page.goto((site / "changes.html").as_uri())
    n = int(page.locator("#flipped").inner_text().split()[0])
    assert n == page.locator("#changes tbody tr").count() and n > 0
    first = page.locator("#changes tbody tr").first
    assert first.locator("a").count() == 2  # flipped: a record on both sides
    # from the oldest SHA: cells made since count only when asked for
    page.select_option("select[name=a]", index=0)
    flipped = int(page.locator("#flipped").inner_text().split()[0])
    page.uncheck("input[name=both]")
    assert int(page.locator("#flipped").inner_text().split()[0]) > flipped
    # the same SHA on both sides: nothing changed
    page.select_option("select[name=b]", page.locator("select[name=a]").input_value())
    assert page.locator("#flipped").inner_text() == "0 cells changed"


def test_the_kv_and_table_views_render(page: Any, site: Path) -> None:
    for name in ("kv.html", "sampling.html", "api.html", "bisects.html"):
        page.goto((site / name).as_uri())
        assert page.locator("main table").count() >= 1, name
    page.goto((site / "kv.html").as_uri())
    assert page.locator("#kv tbody tr").count() >= 3 and page.locator("#kv thead th").count() > 8


def test_a_dead_script_is_caught_by_these_checks(browser: Any, site: Path, tmp_path: Path) -> None:
    """Planted: the site's script throws. The console check sees it, and a filter no longer changes
    the rows shown (what test_every_filter_changes_the_rows_shown asserts)."""
    planted = tmp_path / "planted"
    shutil.copytree(site, planted)
    (planted / "static" / "site.js").write_text('throw new Error("planted");\n')
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto((planted / "index.html").as_uri())
    everything = shown(pg)
    pg.select_option("select[name=model]", "tiny-gpt2")
    assert shown(pg) == everything and any("planted" in e for e in errors)
    pg.close()
