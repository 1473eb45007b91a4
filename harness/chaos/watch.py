"""What a fault left behind: the processes a harness started (watched while it runs, so that
orphans re-parented to init are still found afterwards) and the files it was writing (records,
goldens, KV store chunks: complete, or absent, never half-written)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.engines.launch.procs import pid_running
from harness.excerpt import NOTE, clip, first_line

POLL_S = 0.1
GUARD = "engines/launch/guard.py"


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live process, None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[19]))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below ``root`` (by parent links in /proc)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[1]
    out, todo = {}, [root]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


@dataclass
class TreeWatch:
    """Polls the process tree below ``root`` until :meth:`stop`; remembers every process it saw."""

    root: int
    seen: dict[tuple[int, int], str] = field(default_factory=dict)
    """(pid, start time) -> command line."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(POLL_S)

    def poll(self) -> None:
        """Note every process below the root, with its command line as it is now (a process may
        rename itself after it starts: vLLM's engine core becomes ``VLLM::EngineCore``)."""
        for pid, start in descendants(self.root).items():
            cmd = cmdline(pid)
            with self._lock:
                if cmd or (pid, start) not in self.seen:
                    self.seen[(pid, start)] = cmd

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def matching(self, *needles: str) -> list[int]:
        """Live pids seen whose command line holds every needle (never a guard, whose command line
        holds its engine's: :mod:`harness.engines.launch.guard`)."""
        with self._lock:
            items = list(self.seen.items())
        return [pid for (pid, start), cmd in items
                if all(n in cmd for n in needles) and GUARD not in cmd and _alive(pid, start)]

    def left(self) -> list[tuple[int, str]]:
        """Processes seen that still run (the same pid with the same start time: not a reused pid)."""
        with self._lock:
            items = list(self.seen.items())
        return [(pid, cmd) for (pid, start), cmd in items if _alive(pid, start)]

    def wait_gone(self, timeout_s: float) -> tuple[float, list[tuple[int, str]]]:
        """Seconds until nothing seen still runs (or ``timeout_s``), and what is left then."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if not self.left():
                return time.monotonic() - t0, []
            time.sleep(POLL_S)
        return time.monotonic() - t0, self.left()


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start and pid_running(pid)


# ---------------------------------------------------------------------------------------------
# files: complete or absent


def broken_records(records: Path) -> list[str]:
    """Record files that do not load (a half-written record), and leftover temporary files."""
    from harness.records import RecordError, load_record

    out = []
    for p in sorted(records.rglob("*.json")) if records.is_dir() else ():
        if p.name.startswith(".tmp-"):
            out.append(f"{p.relative_to(records)}: a temporary file left behind")
            continue
        try:
            load_record(p)
        except RecordError as e:
            out.append(clip(str(e), NOTE))
    return out


def broken_goldens(goldens: Path, pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Golden sets (model, suite) that do not verify (every checksum in the manifest)."""
    from harness.goldens import GoldenError, read_golden

    out = []
    for model, suite in pairs:
        try:
            read_golden(goldens / model / suite, model_name=model, suite_name=suite)
        except GoldenError as e:
            out.append(first_line(str(e), NOTE))
    leftovers = [p.name for p in goldens.glob("*/.*") if not p.name.endswith(".lock")]
    return out + [f"a partial golden folder left behind: {n}" for n in leftovers]


def broken_store(root: Path) -> list[str]:
    """KV store chunks whose index (``.json``, written last) does not describe a complete ``.kv``."""
    out = []
    for meta in sorted(root.rglob("*.json")) if root.is_dir() else ():
        try:
            info = json.loads(meta.read_text())
            want = int(info["pages"]) * int(info["page_nbytes"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            out.append(f"{meta.relative_to(root)}: unreadable index ({type(e).__name__})")
            continue
        data = meta.with_suffix(".kv")
        size = data.stat().st_size if data.exists() else -1
        if size != want:
            out.append(f"{data.relative_to(root)}: {size} bytes, its index says {want}")
    return out
