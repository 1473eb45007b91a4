"""Processes the harness starts, and how it makes sure none outlives it.

Every engine process (a server, a CLI engine) is started as the leader of its own process group, so
that stopping it stops whatever it forked too (vLLM's engine-core and worker processes). A
process registered with :func:`track` is also stopped at interpreter exit (``atexit``), and it gets
SIGTERM from the kernel if the harness itself dies (``PR_SET_PDEATHSIG``, Linux).
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

_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL what is left after ``grace_s``; reap."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        proc.poll()
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or the group never looks empty
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    untrack(proc)


def group_alive(pgid: int) -> bool:
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
    with _LOCK:
        _LIVE[proc.pid] = proc


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
