"""Files the harness has to trust: a file's sha256, and an exclusive lock across processes.

Downloads, built models, GGUFs, venvs and goldens are checked by sha256 and built under a lock
(``flock``: released by the kernel if the holder dies), so two gates that want the same thing at
once build it once and the second finds it complete.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``), so
    that a process killed at any moment leaves one of the two complete folders under ``b``. False
    where the kernel, the C library or the file system cannot (then nothing was changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


class LockTimeout(TimeoutError):
    """Another process held the lock for longer than the caller would wait; the message names it."""


_HELD = threading.local()


@contextmanager
def locked(path: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created) for the ``with`` block. ``timeout_s`` None waits
    for ever; otherwise :class:`LockTimeout` names the holder's pid after that long. A thread that
    already holds the lock enters again at once (``flock`` would wait for itself)."""
    held: set[tuple[int, str]] = _HELD.__dict__.setdefault("paths", set())
    key = (os.getpid(), str(path.resolve()))  # a forked child holds nothing of its parent's
    if key in held:
        yield
        return
    held.add(key)
    try:
        with _flocked(path, timeout_s):
            yield
    finally:
        held.discard(key)


@contextmanager
def _flocked(path: Path, timeout_s: float | None) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        if timeout_s is None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        fh.seek(0)
                        holder = fh.read().strip() or "unknown"
                        raise LockTimeout(f"{path}: still locked after {timeout_s:.0f} s by "
                                          f"{holder}") from None
                    time.sleep(0.2)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}\n")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
