"""The documentation: the mkdocs site builds in strict mode (no broken link or anchor between pages,
no page left out of the nav), the links from the root pages (README.md, which is not part of the
site, and the generated FEATURES.md / SUPPORTED_MODELS.md) into docs/ resolve, the README stays
short, and every Makefile target is documented. Planted faults show each check bites.

One strict build (~5 s) serves the checks; the planted-fault build is one more."""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

from harness.workspace import REPO_ROOT

DOCS = REPO_ROOT / "docs"
ROOT_PAGES = ("README.md", "FEATURES.md", "SUPPORTED_MODELS.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
DEFINITION = re.compile(r"^\[[^\]]+\]:\s*(\S+)", re.M)
"""A reference-style link's target (``[r3]: reports/records/…``: the generated pages cite records so)."""


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs / mkdocs-material are not installed: they are dev dependencies "
                    "(pip install -e '.[dev]', which make venv does)", pytrace=False)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = mkdocs_build(REPO_ROOT, out)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}{r.stderr}"
    return out


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(v for k, v in attrs if k == "id" and v)


@cache
def anchors(built: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(built.read_text())
    return frozenset(parser.ids)


def built_page(site: Path, page: str) -> Path:
    """docs/<page>.md -> its HTML in the site (directory URLs: parity.md -> parity/index.html)."""
    stem = page.removesuffix(".md")
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def link_problems(markdown: str, source: str, site: Path) -> list[str]:
    """Relative links of a page at the repository root that do not resolve: a docs/ page that does
    not exist or lacks the anchor, or a file of the repository that is not there."""
    problems = []
    for target in [*LINK.findall(markdown), *DEFINITION.findall(markdown)]:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the page itself
        path, _, anchor = target.partition("#")
        if path.startswith("docs/") and path.endswith(".md"):
            page = path.removeprefix("docs/")
            if not (DOCS / page).is_file():
                problems.append(f"{source}: {target}: no page docs/{page}")
            elif anchor and anchor not in anchors(built_page(site, page)):
                problems.append(f"{source}: {target}: docs/{page} has no anchor #{anchor}")
        elif not (REPO_ROOT / path).exists():
            problems.append(f"{source}: {target}: no file {path}")
    return problems


def make_targets() -> list[str]:
    phony = re.search(r"^\.PHONY:(.*)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    assert phony, "Makefile has no .PHONY line"
    return [t for t in phony.group(1).split() if t != "help"]


def undocumented(targets: Iterable[str], texts: Iterable[str]) -> list[str]:
    text = "\n".join(texts)
    return [t for t in targets if not re.search(rf"\bmake {re.escape(t)}\b", text)]


def docs_texts() -> list[str]:
    return [(REPO_ROOT / "README.md").read_text(), *(p.read_text() for p in sorted(DOCS.glob("*.md")))]


def test_the_site_builds_in_strict_mode_with_every_page(site: Path) -> None:
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert {"index.md", "parity.md", "kv-roundtrip.md", "ab.md", "invariance.md", "troubleshooting.md"} <= set(pages)
    for page in pages:
        assert built_page(site, page).is_file(), f"docs/{page} was not built"


def test_a_broken_link_a_missing_anchor_or_a_page_outside_the_nav_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    parity = tmp_path / "docs" / "parity.md"
    parity.write_text(parity.read_text() + "\nSee [nowhere](no-such-page.md) and "
                      "[a heading](records.md#no-such-heading).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    r = mkdocs_build(tmp_path, tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "no-such-page.md" in out and "#no-such-heading" in out and "orphan.md" in out, out


def test_root_pages_link_into_docs_and_the_tree_only_where_it_resolves(site: Path) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "](docs/index.md)" in readme, "the README must say where to read next"
    for name in ROOT_PAGES:
        assert link_problems((REPO_ROOT / name).read_text(), name, site) == []


def test_a_broken_link_from_the_readme_is_caught(site: Path) -> None:
    planted = ("[ok](docs/parity.md#comparators-and-verdicts) [gone](docs/no-such-page.md) "
               "[anchor](docs/parity.md#no-such-anchor) [file](harness/no_such_module.py) [ref][r1]\n"
               "\n[r1]: reports/records/no-such-record.json\n")
    assert link_problems(planted, "README.md", site) == [
        "README.md: docs/no-such-page.md: no page docs/no-such-page.md",
        "README.md: docs/parity.md#no-such-anchor: docs/parity.md has no anchor #no-such-anchor",
        "README.md: harness/no_such_module.py: no file harness/no_such_module.py",
        "README.md: reports/records/no-such-record.json: no file reports/records/no-such-record.json"]


def test_the_readme_is_short_and_gives_the_two_commands() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    assert "make gate MODEL=tiny-llama" in readme and re.search(r"^make test\b", readme, re.M)


def test_every_makefile_target_is_documented() -> None:
    targets = make_targets()
    assert {"gate", "test", "docs", "features", "bench"} <= set(targets)
    assert undocumented(targets, docs_texts()) == []
    assert undocumented([*targets, "frobnicate"], docs_texts()) == ["frobnicate"]


def nav_pages(config: Path) -> list[str]:
    """Every page the mkdocs nav lists, in order (sections flattened)."""
    import yaml

    def walk(entry: object) -> Iterable[str]:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, list):
            for item in entry:
                yield from walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from walk(value)

    return list(walk(yaml.safe_load(config.read_text())["nav"]))


def unmapped(pages: Iterable[str], index: str) -> list[str]:
    """The nav's pages that the map in docs/index.md does not link to (index.md itself aside)."""
    mapped = {target.partition("#")[0] for target in LINK.findall(index)}
    return [page for page in pages if page != "index.md" and page not in mapped]


def test_every_page_in_the_nav_is_on_the_map_of_the_docs() -> None:
    pages = nav_pages(REPO_ROOT / "mkdocs.yml")
    assert {"parity.md", "chaos.md", "sampling.md", "localize.md"} <= set(pages)
    index = (DOCS / "index.md").read_text()
    assert unmapped(pages, index) == [], "docs/index.md's map lacks these pages of the nav"
    # a page dropped from the map is caught, by name
    planted = "\n".join(line for line in index.splitlines() if "(sampling.md)" not in line)
    assert unmapped(pages, planted) == ["sampling.md"]


