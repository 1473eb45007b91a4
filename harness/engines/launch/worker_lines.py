"""The one protocol between the harness and a worker process: a request file in, JSON lines out.

Every worker speaks it (``vllm/worker.py`` and ``vllm/serve.py``, the KV round trip's phases
(:mod:`harness.kinds.kv.phase`), the invariance run's (:mod:`harness.engines.vllm.phase`), the PyPI
engines' workers (``workers/worker_protocol.py``) and the llama.cpp sampler's), and every host
reads it here::

    python WORKER REQUEST.json RESULT.jsonl

RESULT.jsonl holds one JSON object a line, each flushed as it is written:

* the head: ``{"kind": "meta", ...}`` once the engine started (its version, timings, facts), or,
  when it did not, ``{"kind": "refused" | "skip" | "error", "reason", "traceback"?}`` and exit code
  :data:`NOT_STARTED` (``refused``: the engine cannot run this configuration; ``skip``: the release
  lacks a hook a gate needs; ``error``: it crashed);
* the body: the worker's own lines (``case``, ``score``, ``counters``, ``tensors``, ``draws``);
* ``{"kind": "end"}``: every result is written, and the exit code after it no longer matters.

A worker brings its body only: :func:`write_start_failure` or :func:`write_result` for the lines,
:func:`run_passes` for a request's ``passes`` in order. The host brings the way the process ended
(:class:`harness.engines.launch.procs.Exited`) to :func:`check_result`, which gives a :class:`Finished` or
raises :class:`WorkerFailed` naming the worker; :func:`read_lines` survives a last line cut short by
a kill.

Standard library only: the workers load this file by its path under an engine's own interpreter (a
vLLM release's venv, a PyPI engine's), where the harness is not installed.
"""

from __future__ import annotations

import json
import signal
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

NOT_STARTED = 3
"""A worker's exit code when its engine did not start (the head line says why)."""
END = {"kind": "end"}

# --- the worker's side ---------------------------------------------------------------------------


def write_line(fh: IO[str], obj: Mapping[str, Any]) -> None:
    fh.write(json.dumps(obj, sort_keys=True) + "\n")
    fh.flush()


def write_start_failure(fh: IO[str], kind: str, reason: str, exc: BaseException | None = None,
                        **facts: Any) -> int:
    """The head line of an engine that did not start (``kind``: refused, skip or error), with the
    traceback's tail when ``exc`` is being handled; returns :data:`NOT_STARTED`."""
    tb = {"traceback": traceback.format_exc()[-6000:]} if exc is not None else {}
    write_line(fh, {**facts, "kind": kind, "reason": reason, **tb})
    return NOT_STARTED


def write_result(fh: IO[str], meta: Mapping[str, Any], body: Iterable[Mapping[str, Any]],
                 end: bool = True) -> None:
    """The meta line, the body, the end line (``end`` False: the caller writes it, after a last
    step that must finish before the host may read the result)."""
    write_line(fh, {**meta, "kind": "meta"})
    for line in body:
        write_line(fh, line)
    if end:
        write_line(fh, END)


def run_passes(passes: Sequence[Mapping[str, Any]],
               run_pass: Callable[[Mapping[str, Any]], tuple[list[dict[str, Any]], float]]
               ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """A request's passes in order: ``run_pass(p)`` gives a pass's body lines and the seconds its
    work took; returns every line and the timings (``pass_<name>_s``)."""
    lines: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    for p in passes:
        got, seconds = run_pass(p)
        lines += got
        timings[f"pass_{p['name']}_s"] = seconds
    return lines, timings


# --- the host's side -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lines:
    """What a result file holds, read tolerantly."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False
    """The last line was cut short (the worker killed while writing it): left out."""
    garbage: str = ""
    """Where a line that is not a JSON object stands (the lines before it are kept)."""


def read_lines(path: str | Path) -> Lines:
    """The result file's lines; a missing file has none, an unfinished last line is left out."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return Lines()
    rows = text.split("\n")
    last = rows.pop()  # "" when the file ends with a newline: a last line without one was cut
    out: list[dict[str, Any]] = []
    for n, row in enumerate([*rows, last], 1):
        if not row.strip():
            continue
        try:
            d = json.loads(row)
        except ValueError:
            d = None
        if isinstance(d, dict):
            out.append(d)
        elif n > len(rows):
            return Lines(out, cut=True)
        else:
            return Lines(out, garbage=f"line {n} of {Path(path).name} is not a JSON object: {row[:120]!r}")
    return Lines(out)


@dataclass(frozen=True, slots=True)
class Finished:
    """A worker's whole result: its meta line and the lines between it and the end line."""

    meta: dict[str, Any]
    body: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.body if d.get("kind") == kind]


class WorkerFailed(Exception):
    """A worker that left no whole result. ``status``: ``refused`` or ``skip`` (the engine said it
    cannot run this), else ``error``; ``reason`` in words that name the worker, or the engine's own
    words (``own``); ``head``: its first line, if any."""

    def __init__(self, status: str, reason: str, head: Mapping[str, Any] | None = None,
                 detail: str = "", own: bool = False) -> None:
        super().__init__(reason)
        self.status, self.reason, self.detail, self.own = status, reason, detail, own
        self.head: dict[str, Any] = dict(head or {})

    def engine_error(self, tail: str = "", prefix: str = "") -> Exception:
        """As the harness's engine errors (:class:`~harness.api.EngineRefused` for a refusal)."""
        from harness.api import EngineFailed, EngineRefused

        text = f"{prefix}{self.reason}" if self.own else self.reason
        if self.status in ("refused", "skip"):
            return EngineRefused(text)
        return EngineFailed(text, self.detail or tail)


Diagnose = Callable[[str], "tuple[str, str] | None"]
"""An engine's log -> ("refused" | "error", its first real exception), or None."""
SENT_BY_SOMEONE = {"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}
"""Signals another process sends: the log's errors after them are consequences, not the cause."""


def check_result(path: str | Path, worker: str, exited: Any, *, doing: str = "it ran", log: str = "",
                 diagnose: Diagnose | None = None) -> Finished:
    """The worker's whole result from ``path``, or :class:`WorkerFailed` saying why there is none.
    ``exited``: how its process ended (``returncode``, ``timed_out``, ``pid``, ``timeout_s``: a
    :class:`~harness.engines.launch.procs.Exited`); ``doing``: what it was doing, for a kill; ``diagnose``
    finds the engine's reason in its ``log`` when it left none of its own."""
    return check_lines(read_lines(path), worker, exited, doing=doing, log=log, diagnose=diagnose)


def check_lines(got: Lines, worker: str, exited: Any, *, doing: str = "it ran", log: str = "",
                diagnose: Diagnose | None = None) -> Finished:
    """:func:`check_result` on lines already read."""
    lines = got.lines
    head = lines[0] if lines else {}
    kind = head.get("kind")
    if kind in ("refused", "skip"):
        raise WorkerFailed(kind, str(head.get("reason", "")), head, str(head.get("traceback", "")), own=True)
    if got.garbage:
        raise WorkerFailed("error", f"{worker} broke the result protocol: {got.garbage}", head)
    if getattr(exited, "timed_out", False):
        limit = getattr(exited, "timeout_s", None)
        within = f" within {limit:.0f} s" if limit else " in time"
        raise WorkerFailed("error", f"{worker} did not finish{within} and was stopped", head)
    if kind == "meta" and lines[-1].get("kind") == "end":
        return Finished(head, lines[1:-1])
    rc = int(exited.returncode) if exited is not None and exited.returncode is not None else None
    pid = getattr(exited, "pid", None)
    who = f"{worker} (pid {pid})" if pid else worker
    cause = diagnose(log) if diagnose is not None and log else None
    if rc is not None and rc < 0:
        sig = _signal_name(-rc)
        said = f"; the first error in its log: {cause[1]}" if cause and sig not in SENT_BY_SOMEONE else ""
        raise WorkerFailed("error", f"{who} was killed by {sig} while {doing}{said}", head)
    if cause is not None:
        raise WorkerFailed(cause[0], cause[1], head, own=True)
    if kind == "error":
        raise WorkerFailed("error", str(head.get("reason", "")), head, str(head.get("traceback", "")),
                           own=True)
    wrote = ("it wrote no result" if not lines else "its last line was cut short" if got.cut
             else f"it wrote {len(lines)} line(s) but no end line" if kind == "meta"
             else f"its first line is {kind or 'untyped'!r}, not the meta line")
    raise WorkerFailed("error", f"{who} exited with {rc} while {doing}: {wrote}", head)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"
