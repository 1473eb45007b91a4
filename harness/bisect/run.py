"""A whole bisect: check the input, load the goldens, search, write the ``bisect`` record.

:func:`bisect_releases` steps over vLLM releases (:mod:`.releases`), :func:`bisect_history` over a
``cmd:`` engine's commits (:mod:`.history`). Both refuse bad input before any engine starts: an
unknown model or suite, a suite not judged against goldens, a release the package index does not
list, a commit the repository does not have, an ``--only`` that names no case.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bisect import BisectError
from harness.bisect.index import ReleaseIndex, release_index
from harness.bisect.record import bisect_record
from harness.bisect.releases import RunnerFor, release_probe
from harness.bisect.search import Probe, Result, bisect
from harness.bisect.verdicts import Focus
from harness.goldens import Golden
from harness.models import ModelRef, resolve_model
from harness.records import Record, write_record
from harness.suites import Suite, find_suite
from harness.workspace import REPO_ROOT, Workspace

GOLDEN_KINDS = ("parity", "kv_roundtrip")
"""Suite kinds judged against goldens: their verdicts mean the same thing on every point."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True, eq=False)
class Bisected:
    record: Record
    path: Path
    result: Result


def _prepare(ws: Workspace, model_name: str, suite_name: str, only: str | None
             ) -> tuple[ModelRef, Suite, Golden, Focus, bool]:
    from harness.oracle import load_or_record
    from harness.pipeline import kind_of

    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    kind = kind_of(suite)
    if kind.name not in GOLDEN_KINDS:
        raise BisectError(f"suite {suite.name} is of kind {kind.name!r}: a bisect compares verdicts judged "
                          f"against the same goldens at every step (kinds {', '.join(GOLDEN_KINDS)})")
    golden, _ = load_or_record(ws, model, suite, auto_record=True)
    focus = Focus.parse(only, [c.id for c in golden.cases])
    return model, suite, golden, focus, "kv" in kind.tables


def _finish(ws: Workspace, prepared: tuple[ModelRef, Suite, Golden, Focus, bool], points: list[str],
            probe: Probe, *, over: str, label: str, asked: dict[str, Any], environment: dict[str, Any],
            progress: Progress) -> Bisected:
    model, suite, golden, focus, _ = prepared
    t0 = time.perf_counter()
    result = bisect(points, probe, progress)
    rec = bisect_record(ws, model=model, suite=suite, golden=golden, over=over, label=label, result=result,
                        asked={**asked, "only": focus.to_json()}, environment=environment,
                        total_s=time.perf_counter() - t0)
    return Bisected(rec, write_record(ws.records, rec), result)


def bisect_releases(ws: Workspace, model_name: str, suite_name: str, good: str, bad: str, *,
                    connector: str | None = None, only: str | None = None, concurrency: int | None = None,
                    with_rebuilds: bool = False, refresh_index: bool = False, remove_venvs: bool = False,
                    reuse: bool = False, installed_only: bool = False,
                    index: ReleaseIndex | None = None, runner_for: RunnerFor | None = None,
                    progress: Progress = lambda s: None) -> Bisected:
    """The first vLLM release from ``good`` towards ``bad`` whose verdicts differ from ``good``'s."""
    prepared = _prepare(ws, model_name, suite_name, only)
    kv = prepared[4]
    if connector and not kv:
        raise BisectError(f"a KV connector ({connector}) needs a KV suite; {suite_name} is not one")
    tail = ""
    if connector:
        from harness.kinds.kv.config import load_connector_class, parse_connector

        spec = parse_connector(connector)
        load_connector_class(spec)  # an unknown module or class is named now, not at every step
        tail = f"/{spec.cls}"
    index = index or release_index(REPO_ROOT, refresh=refresh_index)
    points = index.between(good, bad, with_rebuilds)
    progress(f"{len(points)} {index.package} releases from {good} to {bad} ({index.said()})")
    probe = release_probe(ws, prepared[0], prepared[1], kv=kv, focus=prepared[3], connector=connector,
                          concurrency=concurrency, runner_for=runner_for, remove_venvs=remove_venvs,
                          reuse=reuse, installed_only=installed_only, progress=progress)
    return _finish(ws, prepared, points, probe, over="releases", label=f"vllm@{good}..{bad}{tail}",
                   asked={"over": "releases", "good": good, "bad": bad, "connector": connector,
                          "with_rebuilds": with_rebuilds, "reuse_records": reuse,
                          "installed_only": installed_only},
                   environment={"index": {k: v for k, v in index.to_json().items() if k != "listed"}},
                   progress=progress)


def bisect_history(ws: Workspace, model_name: str, suite_name: str, repo: Path, good: str, bad: str,
                   candidate: str, *, build: str | None = None, only: str | None = None,
                   progress: Progress = lambda s: None) -> Bisected:
    """The first commit from ``good`` towards ``bad`` whose verdicts differ from ``good``'s."""
    from harness.bisect.history import check_candidate, commits, git, history_probe
    from harness.provenance import now_utc

    check_candidate(candidate)
    points = commits(repo, good, bad)
    prepared = _prepare(ws, model_name, suite_name, only)
    progress(f"{len(points)} commits from {points[0][:10]} to {points[-1][:10]} (first-parent line of "
             f"{repo.resolve().name})")
    stamp = now_utc().replace(":", "").replace("-", "")
    work = ws.runs / f"bisect-{stamp}-{secrets.token_hex(3)}"
    probe = history_probe(ws, prepared[0], prepared[1], repo, candidate, focus=prepared[3], build_cmd=build,
                          work=work, progress=progress)
    return _finish(ws, prepared, points, probe, over="history",
                   label=f"{repo.resolve().name}@{points[0][:7]}..{points[-1][:7]}",
                   asked={"over": "history", "good": points[0], "bad": points[-1], "candidate": candidate,
                          "build": build},
                   environment={"repo": repo.resolve().name, "repo_head": git(repo, "rev-parse", "HEAD"),
                                "work": work.name}, progress=progress)
