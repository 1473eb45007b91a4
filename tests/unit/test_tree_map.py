"""docs/how-it-works.md's source-tree map is held to the tree, both ways: every package and module it
names exists, and every package of harness/ (and every module at its top) is in it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.workspace import REPO_ROOT

DOC = REPO_ROOT / "docs" / "how-it-works.md"
ENTRY = re.compile(r"^( {2,8})(\S+)(.*)$")
"""An entry line of the map: its name two spaces deeper than its package's (descriptions that run on
stand at column 18)."""
MODULE = re.compile(r"(?<![\w./*])((?:\w+/)*\w+\.py)\b")
PACKAGE = re.compile(r"(?<![\w./])(\w+)/(?=[\s),;:]|$)")


@dataclass(frozen=True)
class Entry:
    path: str
    """Relative to the repository: harness/kinds/kv/ (a package) or harness/api.py (a module)."""
    text: str
    """The entry's description, its continuation lines joined."""
    line: int


def tree_map(text: str) -> list[Entry]:
    """The entries of the first code block that starts with ``harness/``."""
    lines = text.splitlines()
    start = lines.index("harness/")
    entries: list[Entry] = []
    stack: list[str] = ["harness/"]
    for n, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("```"):
            break
        m = ENTRY.match(line)
        if m is None or len(m.group(1)) >= 10:  # a description that runs on
            if entries and line.startswith(" " * 10):
                last = entries[-1]
                entries[-1] = Entry(last.path, f"{last.text} {line.strip()}", last.line)
            continue
        depth = len(m.group(1)) // 2
        del stack[depth:]
        path = "".join(stack) + m.group(2)
        entries.append(Entry(path, m.group(3).strip(), n))
        if path.endswith("/"):
            stack.append(m.group(2))
    return entries


def problems(root: Path, entries: list[Entry]) -> list[str]:
    """What the map says that the tree does not hold, and what the tree holds that the map omits."""
    out = []
    listed = {e.path for e in entries}
    named: set[str] = set()
    for e in entries:
        where = f"docs/how-it-works.md:{e.line}"
        if not (e.path.endswith(("/", ".py"))):
            continue
        if not (root / e.path).exists():
            out.append(f"{where}: the map lists {e.path}, which does not exist")
        pkg = e.path if e.path.endswith("/") else "harness/"
        bases = [pkg]
        while bases[-1] != "harness/":
            bases.append(bases[-1][: bases[-1].rstrip("/").rfind("/") + 1])
        for mod in MODULE.findall(e.text) + ([e.path.rpartition("/")[2]] if e.path.endswith(".py") else []):
            hits = [b + mod for b in bases if (root / b / mod).exists()]
            if not hits:
                out.append(f"{where}: {e.path} names {mod}, which is in no package from {pkg} up")
            named.update(hits)
        for sub in PACKAGE.findall(e.text) if e.path.endswith("/") else ():
            if (root / pkg / sub / "__init__.py").exists():
                named.add(f"{pkg}{sub}/")
    for init in sorted(root.glob("harness/**/__init__.py")):
        pkg = init.parent.relative_to(root).as_posix() + "/"
        if pkg != "harness/" and pkg not in listed and pkg not in named:
            out.append(f"{pkg} is a package the map of docs/how-it-works.md does not list")
    for mod in sorted(root.glob("harness/*.py")):
        path = mod.relative_to(root).as_posix()
        if mod.name != "__init__.py" and path not in listed and path not in named:
            out.append(f"{path} is a module the map of docs/how-it-works.md does not name")
    return out


def test_the_map_of_the_source_tree_matches_the_tree() -> None:
    found = problems(REPO_ROOT, tree_map(DOC.read_text()))
    assert found == [], "docs/how-it-works.md's source-tree map and the tree differ:\n" + "\n".join(found)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for f in ("harness/__init__.py", "harness/api.py", "harness/kinds/__init__.py",
              "harness/kinds/base.py", "harness/kinds/kv/__init__.py", "harness/kinds/kv/kind.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    return tmp_path


MAP = """harness/
  api.py          the contracts
  kinds/          the kinds; base.py the contract
    kv/           the KV gate: kind.py
```
"""


def test_the_check_holds_a_map_that_matches(tree: Path) -> None:
    assert problems(tree, tree_map(MAP)) == []


def test_a_listed_path_that_does_not_exist_is_named(tree: Path) -> None:
    text = MAP.replace("    kv/           the KV gate: kind.py\n",
                       "    kv/           the KV gate: kind.py, judge.py\n    spec/         speculative\n")
    assert problems(tree, tree_map(text)) == [
        "docs/how-it-works.md:4: harness/kinds/kv/ names judge.py, which is in no package from "
        "harness/kinds/kv/ up",
        "docs/how-it-works.md:5: the map lists harness/kinds/spec/, which does not exist"]


def test_a_package_or_top_module_the_map_omits_is_named(tree: Path) -> None:
    (tree / "harness/kinds/sampling").mkdir()
    (tree / "harness/kinds/sampling/__init__.py").write_text("")
    (tree / "harness/oracle.py").write_text("")
    assert problems(tree, tree_map(MAP)) == [
        "harness/kinds/sampling/ is a package the map of docs/how-it-works.md does not list",
        "harness/oracle.py is a module the map of docs/how-it-works.md does not name"]
