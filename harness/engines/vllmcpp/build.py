"""vllm.cpp built from the user's source, once, into a cache keyed by what made it.

vllm.cpp (a C++20 port of vLLM's V1 engine) is on no package registry: the user points the harness
at a checkout or a source archive (``vllmcpp:src=PATH`` or ``$HARNESS_VLLMCPP_SRC``). The harness
copies that source into the build cache (never building in the user's tree), builds the engine's
static library and its OpenAI server with CMake and Ninja, and compiles the harness's own worker
(``vllmcpp_worker.cpp``, beside it) against that library as one more target of the same build.

The cache folder is named by a key over the source digest (the sha256 of every file of the tree, the
same for a checkout and for an archive of it), the compiler and the CMake flags. A folder is ready
when its stamp (``build.json``, written last) is there; a folder without one is a build that stopped
half-way and is built again from scratch. The worker is not part of the key: when its source
changed, only its target is rebuilt in the cached build (seconds), and the stamp says so. When the
build fails, the tail of its log is the error. The stamp is the record's ``build`` facts: the source
digest, the git commit when the source is a checkout, the compiler, the flags, the patches applied
to the copy, and the build time.

The one patch: upstream builds with ``-Werror`` (cmake/CompilerWarnings.cmake), and g++ 12 warns
where g++ 13 does not (``-Wvolatile``); the copy drops ``-Werror``, since warnings are not what this
harness judges. The stamp names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.launch.venvs import VenvError, compiler, run_logged
from harness.files import locked
from harness.provenance import now_utc

SRC_ENV = "HARNESS_VLLMCPP_SRC"
CACHE_ENV = "HARNESS_VLLMCPP_CACHE"
STAMP = "build.json"
WORKER_SOURCE = Path(__file__).with_name("vllmcpp_worker.cpp")
WORKER_TARGET = "harness_vllmcpp_worker"
CMAKE_ARGS: tuple[str, ...] = (
    "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DVLLM_CPP_CUDA=OFF", "-DVLLM_CPP_METAL=OFF",
    "-DVLLM_CPP_BUILD_TESTS=OFF", "-DVLLM_CPP_BUILD_EXAMPLES=ON", "-DVLLM_CPP_SERVER=ON",
)
TARGETS: tuple[str, ...] = ("server", WORKER_TARGET)
SKIP_DIRS = frozenset({".git", "build", ".cache", "__pycache__"})
BUILD_TIMEOUT_S = float(os.environ.get("HARNESS_VLLMCPP_BUILD_TIMEOUT_S", "7200"))
"""Each build step's limit (the venvs' 2400 s is too short: ~15 min on two idle cores, over
40 min on two shared ones)."""


class BuildError(RuntimeError):
    """The source could not be found or read, or the build failed; the message says which and why
    (for a failed build, the tail of its log and where the whole log is)."""


@dataclass(frozen=True, slots=True)
class Source:
    """The user's vllm.cpp source: a checkout folder or an archive of one."""

    path: Path
    digest: str
    """sha256 over every file of the tree (relative path and bytes), ``.git`` and build folders left
    out: the same for a checkout and for an archive of the same files."""
    commit: str | None
    """The checkout's git commit (None for an archive or a folder that is not a git checkout)."""
    files: int


@dataclass(frozen=True, slots=True)
class Build:
    """A finished build in the cache."""

    folder: Path
    facts: Mapping[str, Any]
    cached: bool

    @property
    def server(self) -> Path:
        return self.folder / "build" / "examples" / "server"

    @property
    def worker(self) -> Path:
        return self.folder / "build" / "harness_worker" / WORKER_TARGET


def cache_root(repo_root: Path) -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).resolve() if env else repo_root / ".cache" / "vllmcpp"


def source_path(given: str | None) -> Path:
    """The source the user named (``src=``), else ``$HARNESS_VLLMCPP_SRC``; a clear error when
    neither names an existing checkout or archive."""
    raw = given or os.environ.get(SRC_ENV, "")
    if not raw:
        raise BuildError(f"vllmcpp: no source: pass vllmcpp:src=PATH (a vllm.cpp checkout or a "
                         f".tar.gz of one) or set {SRC_ENV}")
    path = Path(raw).expanduser()
    if not path.exists():
        raise BuildError(f"vllmcpp: source {raw!r} does not exist")
    return path.resolve()


def _unpacked(archive: Path, dest: Path) -> Path:
    """The checkout folder inside ``archive``, unpacked under ``dest`` (one top folder holding
    CMakeLists.txt, or the archive's root)."""
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise BuildError(f"vllmcpp: cannot unpack {archive.name}: {e}") from None
    tops = [p for p in dest.iterdir() if p.is_dir()]
    root = tops[0] if len(tops) == 1 and not (dest / "CMakeLists.txt").exists() else dest
    if not (root / "CMakeLists.txt").is_file():
        raise BuildError(f"vllmcpp: {archive.name} holds no CMakeLists.txt at its top: not a vllm.cpp "
                         f"source archive")
    return root


def _tree_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out += [Path(dirpath) / f for f in sorted(filenames)]
    return out


def tree_digest(root: Path) -> tuple[str, int]:
    """sha256 over the tree's files (relative path, NUL, bytes, NUL) and how many there were;
    symbolic links count by their target text."""
    h = hashlib.sha256()
    files = _tree_files(root)
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        if p.is_symlink():
            h.update(b"->" + os.readlink(p).encode())
        else:
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\0")
    return h.hexdigest(), len(files)


def git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build_key(digest: str, compiler: str, cmake_args: Sequence[str]) -> str:
    blob = json.dumps({"source": digest, "compiler": compiler, "cmake": list(cmake_args)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_build(folder: Path) -> Build | None:
    stamp = folder / STAMP
    if not stamp.is_file():
        return None
    return Build(folder, json.loads(stamp.read_text()), True)


def _patch_copy(src: Path) -> list[str]:
    """Make the copy buildable by this harness; returns one line per patch applied."""
    patches = []
    warnings = src / "cmake" / "CompilerWarnings.cmake"
    if warnings.is_file():
        text = warnings.read_text()
        if "-Werror" in text:
            warnings.write_text(text.replace(" -Werror>", ">").replace("-Werror=all-warnings", ""))
            patches.append("cmake/CompilerWarnings.cmake: -Werror dropped (g++ 12 warns on "
                           "-Wvolatile where upstream's g++ 13 does not; warnings are not judged)")
    worker_dir = src / "harness_worker"
    worker_dir.mkdir(exist_ok=True)
    _place_worker(src)
    (worker_dir / "CMakeLists.txt").write_text(
        f"add_executable({WORKER_TARGET} {WORKER_SOURCE.name})\n"
        f"target_link_libraries({WORKER_TARGET} PRIVATE vllm::vllm)\n"
        f"target_include_directories({WORKER_TARGET} PRIVATE ${{CMAKE_SOURCE_DIR}}/src)\n")
    top = src / "CMakeLists.txt"
    top.write_text(top.read_text() + "\n# added by the parity harness: its worker\n"
                   "add_subdirectory(harness_worker)\n")
    patches.append(f"harness_worker/: the harness's worker ({WORKER_SOURCE.name}) added as target "
                   f"{WORKER_TARGET}, linked against vllm::vllm")
    return patches


def _place_worker(src: Path) -> str:
    """Copy the worker's source into the build copy; returns its sha256."""
    data = WORKER_SOURCE.read_bytes()
    dest = src / "harness_worker" / WORKER_SOURCE.name
    if not dest.is_file() or dest.read_bytes() != data:
        dest.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _write_stamp(folder: Path, facts: Mapping[str, Any]) -> None:
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(dict(facts), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / STAMP)


def _fresh_worker(built: Build, jobs: int) -> Build:
    """``built`` with the worker compiled from the harness's current worker source: a worker built
    from another version of it is rebuilt (one target of the cached build, seconds to a minute)."""
    digest = hashlib.sha256(WORKER_SOURCE.read_bytes()).hexdigest()
    if built.facts.get("worker_digest") == digest and built.worker.is_file():
        return built
    log = build_log(built.folder)
    _place_worker(built.folder / "src")
    t0 = time.perf_counter()
    try:
        run_logged(["cmake", "--build", str(built.folder / "build"), "-j", str(jobs), "--target",
                    WORKER_TARGET], log, "vllm.cpp: the harness worker", timeout_s=BUILD_TIMEOUT_S)
    except VenvError as e:
        raise BuildError(str(e)) from None
    facts = {**built.facts, "worker_digest": digest, "worker_build_s": round(time.perf_counter() - t0, 1)}
    _write_stamp(built.folder, facts)
    return Build(built.folder, facts, built.cached)


def build_log(folder: Path) -> Path:
    """The build's log, beside its folder (so it outlives a failed build's folder)."""
    return folder.with_name(folder.name + ".build.log")


def ensure_build(repo_root: Path, given: str | None, log_to: Path | None = None,
                 jobs: int | None = None) -> Build:
    """The build of the named source (see module doc): from the cache, or built now."""
    path = source_path(given)
    with tempfile.TemporaryDirectory(prefix="vllmcpp-src-") as scratch:
        root = _unpacked(path, Path(scratch)) if path.is_file() else path
        if not (root / "CMakeLists.txt").is_file():
            raise BuildError(f"vllmcpp: {path} has no CMakeLists.txt: not a vllm.cpp checkout")
        digest, n_files = tree_digest(root)
        source = Source(path, digest, git_commit(root), n_files)
        compiler_line = compiler()
        jobs = jobs or os.cpu_count() or 1
        folder = cache_root(repo_root) / build_key(digest, compiler_line, CMAKE_ARGS)
        with locked(folder.with_name(folder.name + ".lock")):
            if (ready := read_build(folder)) is not None:
                return _fresh_worker(ready, jobs)
            if folder.exists():
                shutil.rmtree(folder)  # half-built: no stamp
            folder.mkdir(parents=True)
            return _build(root, folder, source, compiler_line, log_to or build_log(folder), jobs)


def _build(root: Path, folder: Path, source: Source, compiler: str, log: Path, jobs: int) -> Build:
    src = folder / "src"
    shutil.copytree(root, src, symlinks=True, ignore=shutil.ignore_patterns(*SKIP_DIRS))
    patches = _patch_copy(src)
    worker_digest = _place_worker(src)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# vllm.cpp build of source {source.digest[:16]} into {folder.name}, {now_utc()}\n")
    t0 = time.perf_counter()
    try:
        run_logged(["cmake", "-S", str(src), "-B", str(folder / "build"), *CMAKE_ARGS], log,
                   "vllm.cpp: cmake configure", timeout_s=BUILD_TIMEOUT_S)
        run_logged(["cmake", "--build", str(folder / "build"), "-j", str(jobs), "--target", *TARGETS],
                   log, "vllm.cpp: build", timeout_s=BUILD_TIMEOUT_S)
    except VenvError as e:
        raise BuildError(str(e)) from None
    build_s = time.perf_counter() - t0
    facts = {"source": str(source.path.name), "source_digest": source.digest,
             "source_files": source.files, "commit": source.commit, "compiler": compiler,
             "cmake_args": list(CMAKE_ARGS), "targets": list(TARGETS), "jobs": jobs,
             "patches": patches, "worker_digest": worker_digest, "build_s": round(build_s, 1),
             "built": now_utc()}
    built = Build(folder, facts, False)
    for binary in (built.server, built.worker):
        if not binary.is_file():
            raise BuildError(f"vllm.cpp: the build finished without {binary.name} (log: {log})")
    _write_stamp(folder, facts)
    return built
