"""Facts about where a run happened: git SHA of a tree, platform, time. Records carry them."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def git_sha(path: Path) -> str | None:
    """HEAD of the git work tree holding ``path``, or None outside git.

    A copy of a clean checkout shipped without its ``.git`` (e.g. to a GPU runner) may name the
    commit it was copied from in ``HARNESS_GIT_SHA``; git's own answer always wins.
    """
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip() or None
    except (subprocess.SubprocessError, FileNotFoundError):
        return os.environ.get("HARNESS_GIT_SHA") or None


def git_dirty(path: Path) -> bool:
    """Whether tracked files differ from HEAD. Outside git this cannot be known, so it is True
    unless ``HARNESS_GIT_DIRTY=0`` vouches for a clean copy (see :func:`git_sha`)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
    except (subprocess.SubprocessError, FileNotFoundError):
        return os.environ.get("HARNESS_GIT_DIRTY", "1") != "0"
    return bool(out.strip())


def tree_label(sha: str | None, dirty: bool) -> str:
    """How output names the harness tree a record or golden came from: ``1a2b3c4d5e``,
    ``1a2b3c4d5e+dirty``, or ``not a git checkout`` when it had no SHA (git could not say, and no
    ``HARNESS_GIT_SHA`` vouched for the copy)."""
    if not sha:
        return "not a git checkout"
    return f"{sha[:10]}{'+dirty' if dirty else ''}"


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def platform_facts() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "system": platform.system(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def device_facts() -> dict[str, Any]:
    """``{"class", "fingerprint"}`` of the device this process computes on (:mod:`harness.device`;
    an engine that runs in a process of its own reports its own: ``RunFacts.device``)."""
    from harness.device import device_block

    return device_block()
