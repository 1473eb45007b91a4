"""Runs one engine process and stops its whole process group when the harness goes away.

    python -I -S guard.py FD [--keep=N ...] -- ARGV...

:func:`harness.engines.launch.procs.spawn` starts this file (by path, under the harness's own interpreter:
standard library only, whatever the engine's interpreter) as the leader of a new process group,
with ``FD`` the read end of a pipe whose write end only the harness holds. The guard starts ARGV in
the same group and waits for it; file descriptors named by ``--keep`` are passed on to ARGV (a
pipe the engine answers on). The group is stopped (SIGTERM, then SIGKILL after
:data:`GRACE_S`) when

* the pipe reaches end-of-file: the harness has exited, however (``kill -9`` included);
* the guard gets SIGTERM, SIGINT or SIGHUP (the harness stopping the group, the kernel's
  parent-death signal);
* ARGV exits: what it leaves behind in the group (vLLM's engine-core and worker processes, which
  outlive a frontend that dies or leaves without tearing down) is stopped before the guard exits
  with ARGV's status.

Without it, the parent-death signal reaches only the direct child: vLLM's engine-core process
does not watch its parent, so a killed harness left it (and its worker) running, re-parented to init.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when the guard stops the group."""


def pid_state(pid: int) -> str | None:
    """The process's state letter from ``/proc/<pid>/stat`` (``Z``: a zombie), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return None


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


def stop_group(child: subprocess.Popen[bytes] | None, grace_s: float = GRACE_S) -> None:
    """SIGTERM every other process of this guard's group, SIGKILL what is left after ``grace_s``."""
    me, pgid = os.getpid(), os.getpgid(0)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait_s
        while True:
            if child is not None:
                child.poll()  # reap it, or it lingers as a zombie member
            others = [p for p in group_members(pgid) if p != me]
            if not others:
                return
            for pid in others:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    sep = argv.index("--") if "--" in argv else -1
    keep = argv[2:sep] if sep > 1 else []
    if sep < 2 or sep == len(argv) - 1 or not all(k.startswith("--keep=") and k[7:].isdigit() for k in keep):
        print("usage: guard.py FD [--keep=N ...] -- ARGV...", file=sys.stderr)
        return 2
    fd, command, pass_fds = int(argv[1]), argv[sep + 1:], tuple(int(k[7:]) for k in keep)
    why: list[str] = []
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        why.append(signal.Signals(signum).name)
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass  # nothing is ever written: read returns b"" once the harness is gone
        except OSError:
            pass
        why.append("the harness exited")
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        child = subprocess.Popen(command, pass_fds=pass_fds)
    except OSError as e:
        print(f"guard: cannot start {command[0]!r}: {e}", file=sys.stderr)
        return 127
    while child.poll() is None:
        if stop.wait(0.2):
            print(f"guard: {why[0]}: stopping the engine's process group", file=sys.stderr, flush=True)
            stop_group(child)
            return 128 + signal.SIGTERM
    stop_group(child)  # what the engine left behind
    rc = child.returncode
    if rc < 0:  # died of a signal: so does the guard, and its parent sees the same status
        print(f"guard: the engine (pid {child.pid}) was killed by {signal.Signals(-rc).name}",
              file=sys.stderr, flush=True)
        if -rc != signal.SIGKILL:  # SIGKILL's action cannot be set (EINVAL), and is the default anyway
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
