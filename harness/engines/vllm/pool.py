"""An engine pool: one live vLLM engine per (interpreter, model content, engine settings, environment).

Without a pool, every :class:`~harness.engines.vllm.runner.VLLMRunner` workload starts an engine in a child
process and stops it (how a ``make gate`` runs: one engine, one workload). Inside :func:`pooled`
(the test suite's session: ``tests/conftest.py``), workloads go to a long-lived engine instead
(``vllm/serve.py``: the same worker code, started once, fed one request after another), kept per
:func:`key`; a workload whose engine is already up costs no start at all. Between workloads the
engine's prefix cache is reset, so every workload starts from the state a fresh engine has: the
same requests in the same batches give the same bits (tests/integration/test_engine_pool.py
holds a reused engine to a fresh one, bit for bit).

At most ``max_live`` engines stay up (least recently used first out): an idle tiny-model engine
holds about 2 GiB. A configuration vLLM refuses at start is remembered with its answer: asking
again gives the same refusal, not another minute-long start. An engine that dies or times out
leaves the pool; the next workload for its key starts a new one.

What a pool does not serve: engines configured per run (a KV connector's store, the invariance
groups, servers); those start their own engine as before (and say so in the ledger,
:mod:`harness.engines.launch.ledger`).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.launch.procs import kill_group, spawn
from harness.engines.launch.worker_lines import read_lines

SERVE = Path(__file__).with_name("serve.py")
ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "HARNESS_CPU_ISA", "LD_PRELOAD", "CUDA_", "TORCH")
"""Environment variables that can change what an engine computes: part of the key."""


def key(python: str, model: str, engine: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """What makes two workloads able to share an engine, as a short digest (and its parts). ``model``
    is the content digest of the checkpoint the engine loads (the ``weights=`` one when given), not
    its folder: copies of one model in several workspaces share an engine, other weights never do."""
    parts = {"python": python, "model": model, "engine": dict(engine),
             "env": {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}}
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def default_max_live(meminfo: str = "/proc/meminfo") -> int:
    """``$HARNESS_ENGINE_POOL_SIZE``, else this process's share of what the host's free memory holds
    (3 GiB an engine, 6 GiB kept free, shared with the other pytest-xdist workers), between 1 and 3."""
    if os.environ.get("HARNESS_ENGINE_POOL_SIZE", "").isdigit():
        return max(1, int(os.environ["HARNESS_ENGINE_POOL_SIZE"]))
    try:
        with open(meminfo) as f:
            avail = next(int(x.split()[1]) for x in f if x.startswith("MemAvailable:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return 1
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    share = (avail - 6) / max(1, int(workers) if workers.isdigit() else 1)
    return int(max(1, min(3, share // 3)))


@dataclass(frozen=True, slots=True)
class Served:
    """How the pool served one workload."""

    started: bool
    """This workload started the engine (False: a live engine, or a remembered refusal, served it)."""
    completed: bool
    """The engine answered (its result file is complete or holds its refusal); False: it died."""
    uses: int
    """Workloads this engine has run, this one included."""
    start_s: float | None
    """The engine's start, from the first workload's meta line (None: it never started)."""


class PooledEngine:
    """One ``serve.py`` process group: requests on its stdin, one acknowledgement line per
    workload on a pipe of its own, everything it logs in one file."""

    def __init__(self, python: str, log_path: Path, env: Mapping[str, str]) -> None:
        self.log_path = log_path
        self.uses = 0
        self.first_end = 0
        """Bytes of the log up to the end of the first workload: the engine's start."""
        read_fd, write_fd = os.pipe()
        with log_path.open("wb") as log:
            try:
                self.proc = spawn([python, str(SERVE), str(write_fd)], stdout=log, stdin=subprocess.PIPE,
                                  env=env, pass_fds=(write_fd,))
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
        self.ack = os.fdopen(read_fd, "r")

    def run(self, request: Path, result: Path, timeout_s: float) -> bool:
        """Run one workload; True when the engine acknowledged it (its result file is written)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{request}\t{result}\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        ready, _, _ = select.select([self.ack], [], [], timeout_s)
        line = self.ack.readline() if ready else ""
        self.uses += 1
        if self.uses == 1:
            self.first_end = self.log_path.stat().st_size
        return line.startswith("done")

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        kill_group(self.proc)
        self.ack.close()


class EnginePool:
    """Live engines by :func:`key`, least recently used first out."""

    def __init__(self, max_live: int | None = None, folder: Path | None = None) -> None:
        self.max_live = max_live or default_max_live()
        self.folder = Path(folder or tempfile.mkdtemp(prefix="harness-engine-pool-"))
        self.engines: OrderedDict[str, PooledEngine] = OrderedDict()
        self.refused: dict[str, tuple[str, str]] = {}
        """key -> (the result file's text, the engine log) of a start vLLM refused or failed."""
        self.start_s: dict[str, float | None] = {}

    def run(self, k: str, python: str, env: Mapping[str, str], request: Path, result: Path, log: Path,
            timeout_s: float) -> Served:
        """Run the workload ``request`` (a worker request file) on the engine for key ``k``: its
        result lines go to ``result``, what the engine logged for it (its start first) to ``log``."""
        if k in self.refused:
            text, log_text = self.refused[k]
            result.write_text(text)
            log.write_text(f"(engine pool: this configuration was refused at start before)\n{log_text}")
            return Served(False, True, 0, None)
        eng = self.engines.get(k)
        started = eng is None
        if eng is None:
            while len(self.engines) >= self.max_live:
                _, old = self.engines.popitem(last=False)
                old.stop()
            eng = PooledEngine(python, self.folder / f"engine-{k}-{int(time.time())}.log", env)
            self.engines[k] = eng
        self.engines.move_to_end(k)
        before = eng.log_path.stat().st_size
        ok = eng.run(request, result, timeout_s)
        data = eng.log_path.read_bytes()
        head = data[: eng.first_end] if eng.uses > 1 else b""
        note = (f"(engine pool: workload {eng.uses} of this engine; its start first)\n".encode()
                if eng.uses > 1 else b"")
        log.write_bytes(note + head + data[before:])
        first = next(iter(read_lines(result).lines), {})
        if started:
            meta = first.get("kind") == "meta"
            self.start_s[k] = (first.get("timings") or {}).get("engine_start_s") if meta else None
        if not ok or first.get("kind") in ("refused", "error"):
            self.engines.pop(k, None)
            eng.stop()
            if ok and first.get("kind") == "refused":
                self.refused[k] = (result.read_text(), data.decode(errors="replace"))
        return Served(started, ok, eng.uses, self.start_s.get(k))

    def close(self) -> None:
        while self.engines:
            _, eng = self.engines.popitem()
            eng.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


_ACTIVE: EnginePool | None = None


def active() -> EnginePool | None:
    """The pool workloads go to, or None (each workload starts its own engine)."""
    return _ACTIVE


@contextmanager
def pooled(max_live: int | None = None) -> Iterator[EnginePool]:
    """Share engines between the vLLM workloads of this process until the block ends; then stop them."""
    global _ACTIVE
    outer = _ACTIVE
    pool = EnginePool(max_live)
    _ACTIVE = pool
    try:
        yield pool
    finally:
        _ACTIVE = outer
        pool.close()


@contextmanager
def unpooled() -> Iterator[None]:
    """Workloads inside this block start their own engines (a test about a fresh engine)."""
    global _ACTIVE
    outer = _ACTIVE
    _ACTIVE = None
    try:
        yield
    finally:
        _ACTIVE = outer
