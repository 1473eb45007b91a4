"""Goldens recorded once, however many shards want them at the same moment.

Two entries of one model + suite, in two pytest-xdist workers or two gates sharing a workspace, may
both find the goldens missing. :func:`with_goldens` lets exactly one of them record, under an
exclusive lock on ``reports/tmp/locks/goldens--<model>--<suite>.lock`` (``flock``; released by the
kernel if the holder dies), and makes every other one wait and then **verify** what the first wrote
(:func:`harness.goldens.read_golden`: every checksum in the manifest) before it runs on them.
``write_golden`` itself renames a finished folder into place, so a reader that finds a manifest
finds a complete set; the lock is what keeps a second oracle run from replacing the first.

Shards on different machines do not share a workspace: each runner reads the goldens committed at
its commit, and records carry the golden checksums, so the merge and the pages' staleness rules
catch a runner that judged against anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from harness.goldens import MANIFEST_FILE, read_golden, recording
from harness.goldens import lock_path as golden_lock_path
from harness.workspace import Workspace

T = TypeVar("T")


def lock_path(ws: Workspace, slug: str, suite: str) -> Path:
    return golden_lock_path(ws.root, slug, suite)


exclusive = recording
"""The goldens' recording lock (:func:`harness.goldens.recording`), which every gate also takes."""


@dataclass(frozen=True, slots=True)
class Goldens:
    """How an entry came by its goldens."""

    how: str
    """``committed`` (there before the run), ``recorded`` (this process recorded them) or
    ``verified`` (another process recorded them while this one waited; checksums verified)."""


def with_goldens(ws: Workspace, model: str, slug: str, suite: str, run: Callable[[bool], T], *,
                 may_record: bool) -> tuple[T, Goldens]:
    """Call ``run(auto_record)`` so that at most one process records ``model``/``suite``'s goldens.

    ``run(True)`` may record missing goldens (it runs under the lock); ``run(False)`` must not.
    """
    folder = ws.goldens / slug / suite
    if (folder / MANIFEST_FILE).exists():
        return run(False), Goldens("committed")
    if not may_record:
        return run(False), Goldens("committed")  # the gate refuses the missing goldens, naming the fix
    with exclusive(lock_path(ws, slug, suite)):
        if not (folder / MANIFEST_FILE).exists():
            return run(True), Goldens("recorded")
        read_golden(folder, model_name=model, suite_name=suite)  # raises GoldenError naming the file
    return run(False), Goldens("verified")
