"""Engines installed from PyPI into their own venvs (:mod:`.venvs`), one runner for all of them
(:mod:`.runner`).

A PyPI engine is a pair, and nothing else names it: ``pip/<name>.py``, its declarative
:class:`~harness.engines.pip.runner.EngineSpec` (the venv, the options, what it returns) ending in
the one registration ``register_pip_engine(SPEC, help=...)``, and ``pip/workers/<name>_worker.py``,
the worker body (standard library, numpy and the engine: it runs in the engine's venv; see
``workers/worker_protocol.py``). Every worker found here brings its spec module in; a worker
without one is an error naming the file to add. docs/adding-an-engine.md walks through it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

WORKERS = Path(__file__).with_name("workers")
SUFFIX = "_worker.py"


def engine_names(workers: Path = WORKERS) -> list[str]:
    """The PyPI engines here: one per ``workers/<name>_worker.py``."""
    return sorted(p.name[: -len(SUFFIX)] for p in workers.glob(f"*{SUFFIX}"))


def _register_all() -> None:
    for name in engine_names():
        if not (WORKERS.parent / f"{name}.py").is_file():
            raise ImportError(f"harness/engines/pip/workers/{name}{SUFFIX} has no spec: add "
                              f"harness/engines/pip/{name}.py with its EngineSpec and "
                              f"register_pip_engine(SPEC, help=...)")
        importlib.import_module(f"{__name__}.{name}")


_register_all()
