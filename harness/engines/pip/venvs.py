"""Virtualenvs for engines that install from PyPI wheels (CTranslate2, ONNX Runtime GenAI, OpenVINO
GenAI, mistral.rs): one venv per engine release, ``.venvs/<package>-<version>/``, created on first use.

Recipe (:func:`ensure_pip_venv`), the one every venv of the project follows
(:func:`harness.engines.launch.venvs.new_venv`: uv with pip's configuration, pip where uv cannot):

1. ``python -m venv``;
2. install the engine's pinned requirements (:class:`PipEngine`): the engine, and what its
   model converter needs. Where a converter needs torch it gets **the oracle's own torch build**
   (the version string of the project's venv, e.g. ``2.13.0+cpu``), so the venv does not pull a
   CUDA build of torch and its files are hard-linked with the project's (:func:`share_files`);
3. run the engine's import check, which prints the engine's version (it must be the one pinned);
4. write ``.harness-venv.json`` last (:func:`harness.engines.launch.venvs.ensure_venv`): a folder without it
   is half-built and rebuilt. Concurrent gates wait on a lock.

The stamp keeps the installer (``uv 0.13.9``), the install time, the venv's size and the versions of
every package named in ``facts``: the records of every gate on the engine cite them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.launch.venvs import (
    VERSION_RE,
    VenvError,
    VenvInfo,
    ensure_venv,
    installed_versions,
    new_venv,
    read_venv,
    remove_venv,
    run_logged,
    share_files,
    venvs_root,
)


def oracle(name: str) -> str:
    """A requirement pinned to what the project's venv (the oracle's) has: ``oracle("torch")`` is
    replaced by ``torch==2.13.0+cpu`` when the venv is built."""
    return f"{{oracle:{name}}}"


ORACLE_PIN = re.compile(r"\{oracle:([A-Za-z0-9_.-]+)\}")


@dataclass(frozen=True, slots=True)
class PipEngine:
    """One engine release and what its venv holds."""

    package: str
    """The engine's PyPI distribution (``ctranslate2``)."""
    version: str
    requirements: tuple[str, ...]
    """Everything else pinned, besides ``package==version``; :func:`oracle` for the oracle's own."""
    check: str
    """Python run in the venv after installing: imports the engine and prints its version last."""
    facts: tuple[str, ...] = ()
    """Distributions whose installed versions the stamp records (the engine is always one)."""
    no_deps: tuple[str, ...] = ()
    """Requirements installed with ``--no-deps`` in a second step (a converter whose declared
    dependencies would replace the pinned torch or transformers); listed in the stamp."""

    @property
    def folder_name(self) -> str:
        return f"{self.package}-{self.version}"


def oracle_pin(name: str) -> str:
    """``name==<the project venv's version>``; the project's venv is the oracle's."""
    import importlib.metadata as md

    try:
        return f"{name}=={md.version(name)}"
    except md.PackageNotFoundError:
        raise VenvError(f"the project's venv has no {name} to pin the engine venv to") from None


def pip_venv_dir(repo_root: Path, engine: PipEngine) -> Path:
    if not VERSION_RE.match(engine.version):
        raise VenvError(f"{engine.package} {engine.version!r}: not a full release number")
    return venvs_root(repo_root) / engine.folder_name


def resolved(requirements: tuple[str, ...]) -> list[str]:
    """The requirements with every :func:`oracle` placeholder pinned."""
    return [oracle_pin(m.group(1)) if (m := ORACLE_PIN.fullmatch(r)) else r for r in requirements]


def ensure_pip_venv(repo_root: Path, engine: PipEngine, log: Path | None = None) -> VenvInfo:
    """The engine's venv, installed first if missing (see module doc). A venv whose stamp names
    other requirements than the engine's now (the recipe changed) is rebuilt."""
    facts = (engine.package, *engine.facts)
    folder = pip_venv_dir(repo_root, engine)
    ready = read_venv(folder)
    if ready is not None and stale_recipe(ready, engine):
        remove_venv(folder.parent, folder.name)
    return ensure_venv(folder, engine.version, lambda where, version, lg: _install(where, engine, lg),
                       facts, log)


def stale_recipe(venv: VenvInfo, engine: PipEngine) -> bool:
    """Whether ``venv`` was installed from other requirements than ``engine`` names now."""
    wanted = [f"{engine.package}=={engine.version}", *resolved(engine.requirements)]
    return (list(venv.build.get("requirements", [])) != wanted
            or list(venv.build.get("no_deps", [])) != resolved(engine.no_deps))


def _install(folder: Path, engine: PipEngine, log: Path) -> dict[str, Any]:
    inst = new_venv(folder, log, f"{engine.package}=={engine.version}")
    reqs = [f"{engine.package}=={engine.version}", *resolved(engine.requirements)]
    inst.install(reqs, f"installing {' '.join(reqs)}")
    if engine.no_deps:
        inst.install(["--no-deps", *resolved(engine.no_deps)],
                     f"installing {' '.join(engine.no_deps)} without their dependencies")
    out = run_logged([str(inst.python), "-c", engine.check], log,
                     f"importing {engine.package}").strip().splitlines()
    reported = out[-1].strip() if out else ""
    if reported != engine.version:
        raise VenvError(f"{folder.name}: the import check reports {reported!r}, not {engine.version}")
    project = (Path(sys.prefix),) if sys.prefix != sys.base_prefix else ()
    return {"requirements": reqs, **({"no_deps": list(resolved(engine.no_deps))} if engine.no_deps else {}),
            **share_files(folder, folder.parent, also=project), **inst.stamp()}


def venv_packages(python: Path | str, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the venv of ``python`` (absent ones left out)."""
    return installed_versions(python, names)
