"""llama.cpp's venv: ``llama-cpp-python[server]`` built from source into
``.venvs/llama-cpp-python-<version>/`` on first use (the recipe every venv follows:
:func:`harness.engines.launch.venvs.ensure_venv`), its build facts in the stamp."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from harness.engines.launch.venvs import (
    VERSION_RE,
    VenvError,
    VenvInfo,
    compiler,
    ensure_venv,
    new_venv,
    run_logged,
    venvs_root,
)
from harness.excerpt import clip

LLAMACPP = "llama-cpp-python"


def llamacpp_dir(repo_root: Path, version: str) -> Path:
    if not VERSION_RE.match(version):
        raise VenvError(f"llama-cpp-python {version!r}: not a full release number (e.g. 0.3.36)")
    return venvs_root(repo_root) / f"{LLAMACPP}-{version}"


def ensure_llamacpp_venv(repo_root: Path, version: str, log: Path | None = None) -> VenvInfo:
    """The venv of ``llama-cpp-python[server]==version``, built from source first if missing."""
    return ensure_venv(llamacpp_dir(repo_root, version), version, _install_llamacpp,
                       (LLAMACPP, "fastapi", "uvicorn", "numpy"), log)


_SYSTEM_INFO = "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__); " \
    "print(llama_cpp.llama_print_system_info().decode())"


def _install_llamacpp(folder: Path, version: str, log: Path) -> dict[str, Any]:
    inst = new_venv(folder, log, f"{LLAMACPP}[server]=={version}")
    cmake_args = os.environ.get("HARNESS_LLAMACPP_CMAKE_ARGS", "")
    env = {"CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1), "CMAKE_ARGS": cmake_args}
    t0 = time.perf_counter()
    inst.install([f"{LLAMACPP}[server]=={version}"],
                 f"building {LLAMACPP}=={version} (llama.cpp from source)", env, fresh=True)
    built_s = time.perf_counter() - t0
    got = run_logged([str(inst.python), "-c", _SYSTEM_INFO], log,
                     f"importing llama_cpp {version}").strip().splitlines()
    start = next((i for i, line in enumerate(got) if line.split("+")[0] == version), None)
    if start is None:
        raise VenvError(f"{folder.name}: `import llama_cpp` does not report {version} ({got[-1:]!r})")
    return {"pip_install_s": round(built_s, 1), "cmake_args": cmake_args,
            "build_parallel": env["CMAKE_BUILD_PARALLEL_LEVEL"], "compiler": compiler(),
            "system_info": clip(" ".join(got[start + 1:])), **inst.stamp()}
