"""What a vLLM release's wheel holds, read without installing it: its files, and whether its native
extensions can load on this machine (the libstdc++ symbol versions they need).

A release that cannot run here is named before minutes of installing (:mod:`harness.kinds.kv.kind`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from harness.engines.launch.venvs import INSTALL_TIMEOUT_S, PACKAGE, VenvError, check_version


def wheel_files(version: str, want: Callable[[str], bool], package: str = PACKAGE) -> dict[str, bytes]:
    """The files of the ``package==version`` wheel whose names ``want`` picks, read without installing
    it (the wheel alone is downloaded into a temporary folder, removed after)."""
    import tempfile
    import zipfile

    check_version(version)
    with tempfile.TemporaryDirectory(prefix="harness-wheel-") as tmp:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                              "--disable-pip-version-check", "-d", tmp, f"{package}=={version}"],
                             capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if res.returncode != 0 or not wheels:
            tail = " / ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            raise VenvError(f"cannot download {package}=={version} (exit {res.returncode}): {tail}")
        with zipfile.ZipFile(wheels[0]) as z:
            return {n: z.read(n) for n in z.namelist() if want(n)}


_SYMBOL_VERSION = re.compile(rb"(CXXABI_1\.3(?:\.\d+)*|GLIBCXX_3\.4(?:\.\d+)*)\x00")


def host_libstdcxx() -> Path | None:
    """The C++ runtime native extensions load here (``ldconfig``'s libstdc++.so.6), or None."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    import platform

    lines = [line for line in out.splitlines() if line.strip().startswith("libstdc++.so.6 ")]
    arch = "x86-64" if platform.machine() == "x86_64" else platform.machine()
    pick = next((line for line in lines if arch in line), lines[0] if lines else None)
    return Path(pick.rpartition("=>")[2].strip()) if pick else None


def unmet_native_needs(libs: dict[str, bytes], host: Path | None = None) -> list[str]:
    """Which of these native extensions cannot load here: each names the libstdc++ symbol versions it
    needs (CXXABI_1.3.15 is GCC 13's) that the machine's libstdc++ does not define. Empty when all
    can, or when the machine's libstdc++ cannot be found (then only loading them tells)."""
    host = host or host_libstdcxx()
    if host is None or not host.exists():
        return []
    have = {m.decode() for m in _SYMBOL_VERSION.findall(host.read_bytes())}
    out = []
    for name, data in sorted(libs.items()):
        need = sorted({m.decode() for m in _SYMBOL_VERSION.findall(data)} - have)
        if need:
            out.append(f"{name} needs {', '.join(need)}, which this machine's {host.name} ({host}) does not "
                       f"define")
    return out
