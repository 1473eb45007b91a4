"""What this machine offers the fleet: its device kind and its GPUs.

The device fingerprint (``harness.device``: ``fingerprint()``, ``device_class()``) describes a machine
for records and goldens. The fleet needs less: which device kind's entries this runner serves, and
whether it has the GPUs an entry needs. GPUs are counted with ``nvidia-smi`` (no torch import at
collection time). :func:`device_class` is the one seam to ``harness.device``: it answers from that
module once it exists, and from the device kind until then.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gib: float


@dataclass(frozen=True, slots=True)
class Machine:
    kind: str
    """``cuda`` when at least one GPU is visible, else ``cpu``."""
    gpus: tuple[GPU, ...] = ()

    def lacks(self, gpus: int, memory_gib: float) -> str | None:
        """Why this machine cannot run an entry needing ``gpus`` GPUs of ``memory_gib`` each (None: it
        can)."""
        if gpus == 0:
            return None
        fit = [g for g in self.gpus if g.memory_gib >= memory_gib]
        if len(fit) >= gpus:
            return None
        have = ", ".join(f"{g.name} {g.memory_gib:.0f} GiB" for g in self.gpus) or "no GPU"
        mem = f" with >= {memory_gib:g} GiB each" if memory_gib else ""
        return (f"needs {gpus} GPU(s){mem}; this runner has {have} "
                "(its runner labels promise more than it has)")


def visible_gpus() -> tuple[GPU, ...]:
    """The GPUs ``nvidia-smi`` lists, limited to ``CUDA_VISIBLE_DEVICES`` when it is set."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        r = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    if r.returncode != 0:
        return ()
    rows = [[x.strip() for x in line.split(",")] for line in r.stdout.splitlines() if line.count(",") >= 2]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    keep = None if visible is None else {v.strip() for v in visible.split(",") if v.strip()}
    out = []
    for idx, name, mib in rows:
        if keep is not None and idx not in keep:
            continue
        try:
            out.append(GPU(name, float(mib) / 1024))
        except ValueError:
            continue
    return tuple(out)


def this_machine() -> Machine:
    gpus = visible_gpus()
    return Machine("cuda" if gpus else "cpu", gpus)


def device_class() -> str:
    """This machine's device class, as records name it (``harness.device.device_class`` once present)."""
    try:
        mod = importlib.import_module("harness.device")
    except ModuleNotFoundError:
        return this_machine().kind
    return str(mod.device_class())
