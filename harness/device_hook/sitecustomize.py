"""Steers torch's CPU feature probes in every Python process of an emulated-ISA run.

The harness puts this folder first on ``PYTHONPATH`` when ``HARNESS_CPU_ISA`` is set (see
``harness.device``), so the interpreter imports it at start-up in the vLLM worker, in vLLM's
engine-core processes (spawned, they inherit the environment) and in any other child. It imports
nothing heavy: it waits for ``torch.cpu`` to be imported and then makes its ``_is_*_supported``
probes deny what lies above the emulated ISA. vLLM picks its kernel library by those probes
(``vllm/platforms/cpu.py``: ``_C`` with AVX-512 + BF16, ``_C_AVX512``, ``_C_AVX2``) and its
attention / GEMM paths by them too; ATen and oneDNN follow the environment variables the harness
sets beside this hook. Standard library only. Any other ``sitecustomize`` on the path still runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

# The probes each emulated ISA denies (torch.cpu attribute names).
_DENIED = {
    "avx2": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
             "_is_amx_tile_supported", "_is_amx_fp16_supported", "_init_amx"),
    "avx512": ("_is_avx512_bf16_supported", "_is_vnni_supported", "_is_amx_tile_supported",
               "_is_amx_fp16_supported", "_init_amx"),
    "avx512bf16": ("_is_amx_tile_supported", "_is_amx_fp16_supported", "_init_amx"),
}


def _no() -> bool:
    return False


def steer(module: object, isa: str) -> list[str]:
    """Make ``module`` (torch.cpu) deny the probes above ``isa``; returns the names replaced."""
    done = []
    for name in _DENIED.get(isa, ()):
        if hasattr(module, name):
            setattr(module, name, _no)
            done.append(name)
    module._harness_cpu_isa = isa  # type: ignore[attr-defined]
    return done


class _TorchCpuFinder:
    """A meta-path finder that only wraps the loader of ``torch.cpu`` to steer it once loaded."""

    def __init__(self, isa: str) -> None:
        self.isa = isa

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, isa = spec.loader, self.isa
        exec_module = loader.exec_module

        def exec_and_steer(module) -> None:
            exec_module(module)
            steer(module, isa)

        loader.exec_module = exec_and_steer  # type: ignore[method-assign]
        return spec


def install(isa: str) -> None:
    """Steer ``torch.cpu`` now if it is loaded, else as soon as it is."""
    if isa not in _DENIED:
        return
    loaded = sys.modules.get("torch.cpu")
    if loaded is not None:
        steer(loaded, isa)
    elif not any(isinstance(f, _TorchCpuFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchCpuFinder(isa))


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, which this module shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # at interpreter start-up; imported as a module it only defines
    install(os.environ.get("HARNESS_CPU_ISA", "").strip().lower())
    _chain()
