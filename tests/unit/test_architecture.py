"""The tree's shape: no import cycles (a function-level import that hides one is still one), commands
at the top (the packages the pipeline uses never import it, its gate kinds or a command), and the
pipeline never probes an engine with getattr/hasattr."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from harness.workspace import REPO_ROOT


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:`` (types only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (explicit imports only)."""
    modules = {}
    for p in (root / package).rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = p
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative import
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_harness_has_no_import_cycles() -> None:
    found = cycles(module_graph(REPO_ROOT, "harness"))
    assert found == [], "import cycles (function-level imports count): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("x = 1\n\ndef f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert cycles(module_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]


PIPELINE = ("harness.pipeline", "harness.kinds")
TOP = ("harness.cli", "harness.commands", *PIPELINE)
"""The command line, the commands, the pipeline and its gate kinds."""


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def upward_imports(graph: Mapping[str, set[str]], users: tuple[str, ...], top: tuple[str, ...]) -> list[str]:
    """Imports into ``top`` from a package that ``users`` use: a feature package (one level below the
    root) that the pipeline reaches never imports the pipeline, a gate kind or a command. (Packages
    that only commands use, such as a bisect that runs gates, sit above the pipeline.)"""
    root = next(iter(graph)).split(".")[0]
    reached, todo = set(), [m for m in graph if _within(m, users)]
    while todo:
        for t in graph[todo.pop()]:
            if t not in reached and not _within(t, users):
                reached.add(t)
                todo.append(t)
    below = tuple(sorted({".".join(m.split(".")[:2]) for m in reached if m != root}))
    return sorted(f"{m} -> {t}" for m in graph if _within(m, below)
                  for t in graph[m] if _within(t, top))


def test_what_the_pipeline_uses_never_imports_it_or_a_command() -> None:
    found = upward_imports(module_graph(REPO_ROOT, "harness"), PIPELINE, TOP)
    assert found == [], ("feature packages import the pipeline, a gate kind or a command that sits above "
                         "them (move the code that needs it to harness/commands/): " + "; ".join(found))


def test_only_the_cli_imports_the_commands() -> None:
    graph = module_graph(REPO_ROOT, "harness")
    found = sorted(f"{m} -> {t}" for m, ts in graph.items() if not _within(m, ("harness.cli", "harness.commands"))
                   for t in ts if _within(t, ("harness.commands",)))
    assert found == []


def test_the_floor_check_finds_a_feature_package_importing_its_user(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "feature").mkdir(parents=True)
    for f in ("__init__.py", "feature/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "pipeline.py").write_text("from pkg.feature import logic\n")
    (pkg / "feature" / "logic.py").write_text("x = 1\n")
    (pkg / "feature" / "cli.py").write_text("def main():\n    from pkg.pipeline import run\n")
    (pkg / "unrelated.py").write_text("from pkg import pipeline\n")  # above the pipeline: allowed
    assert upward_imports(module_graph(tmp_path, "pkg"), ("pkg.pipeline",), ("pkg.pipeline",)) == [
        "pkg.feature.cli -> pkg.pipeline"]


def test_the_pipeline_declares_what_it_asks_of_engines() -> None:
    """Optional engine abilities are declared in harness/api.py (RunFacts, Scorer, TensorSource),
    never discovered with getattr/hasattr on a runner."""
    offenders = []
    for p in [REPO_ROOT / "harness" / "pipeline.py", REPO_ROOT / "harness" / "oracle.py",
              REPO_ROOT / "harness" / "speed.py", *(REPO_ROOT / "harness" / "kinds").glob("*.py"),
              *(REPO_ROOT / "harness" / "kinds").glob("*/kind.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")):
                offenders.append(f"{p.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == []


def imports_of(path: Path) -> list[str]:
    """The modules ``path`` imports (every import statement, at any depth)."""
    return sorted({a.name if isinstance(n, ast.Import) else n.module or "."
                   for n in _imports(ast.parse(path.read_text())) for a in n.names})


def test_the_packages_vllm_loads_connectors_from_import_nothing() -> None:
    """vLLM imports the KV connectors (harness.kinds.kv.connector, .tap) by module path inside its
    engine processes, in any release's venv: their packages' __init__ files must not pull in the
    gate kinds, the pipeline or anything else."""
    for init in ("harness/kinds/__init__.py", "harness/kinds/kv/__init__.py",
                 "harness/kinds/kv/faults/__init__.py", "harness/kv_pages/__init__.py"):
        assert imports_of(REPO_ROOT / init) == [], f"{init} imports something"
    assert imports_of(REPO_ROOT / "harness/kinds/registered.py") != []  # the check sees imports
