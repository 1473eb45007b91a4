"""The host side of an RL weight-sync session on the pinned vLLM: one engine start, every step's
update, rollouts and evidence (:mod:`harness.engines.vllm.rl_worker`, the child process)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.api import EngineFailed, EngineRefused
from harness.engines.launch import ledger
from harness.engines.launch.procs import engine_env, run_engine
from harness.engines.launch.worker_lines import WorkerFailed, check_result
from harness.engines.vllm.preload import PreloadMissing, preload_env
from harness.engines.vllm.rl_backend import BACKEND
from harness.excerpt import file_tail

WORKER = Path(__file__).with_name("rl_worker.py")
RL_ENGINE_SETTINGS = {"enforce_eager": True, "enable_prefix_caching": True}
"""Eager (the taps on the routers are module hooks, which a compiled graph never calls) and a prefix
cache (what a stale cache after an update would serve)."""


@dataclass(frozen=True, slots=True)
class Session:
    """What the engine did, step by step."""

    meta: Mapping[str, Any]
    steps: tuple[Mapping[str, Any], ...]
    cases: Mapping[int, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    """step index -> the rollouts' result lines."""
    log: str = ""


def run_session(
    model: str,
    model_name: str,
    engine: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    sampling: Mapping[str, Any],
    work: Path,
    routes: Mapping[str, int] | None,
    timeout_s: float,
    python: str | None = None,
    repack: bool = False,
) -> Session:
    """Start the engine once and run ``steps`` (the worker's request format); raises
    :class:`EngineRefused` / :class:`EngineFailed` with the engine's own reason when it did not."""
    python = python or sys.executable
    work.mkdir(parents=True, exist_ok=True)
    req, res, log = work / "request.json", work / "result.jsonl", work / "engine.log"
    req.write_text(
        json.dumps(
            {
                "model": model,
                "engine": {**engine, **RL_ENGINE_SETTINGS, "weight_transfer_config": {"backend": BACKEND}},
                "init_info": {"folder": str(work), "repack": repack},
                "tap_dir": str(work / "taps"),
                "routes": routes,
                "sampling": dict(sampling),
                "steps": list(steps),
            }
        )
    )
    try:
        env = preload_env(python, engine_env())
    except PreloadMissing as e:
        raise EngineRefused(str(e)) from None
    exited = run_engine(
        [python, str(WORKER), str(req), str(res)],
        log,
        timeout_s,
        env,
        label=f"vLLM RL session ({model_name}, {len(steps)} steps)",
    )
    try:
        done = check_result(
            res,
            "engine vllm (RL session)",
            exited,
            log=file_tail(log, 200_000),
            doing=f"running {len(steps)} RL steps of {model_name}",
        )
    except WorkerFailed as e:
        ledger.record("vllm", model_name, None, ok=False, python=python)
        raise e.engine_error(file_tail(log)) from None
    ledger.record(
        "vllm", model_name, (done.meta.get("timings") or {}).get("engine_start_s"), ok=True, python=python
    )
    steps_out = tuple(d for d in done.body if d.get("kind") == "step")
    cases: dict[int, list[Mapping[str, Any]]] = {}
    for d in done.body:
        if d.get("kind") == "case":
            cases.setdefault(int(d["step"]), []).append(d)
    if len(steps_out) != len(steps):
        raise EngineFailed(f"the RL session reported {len(steps_out)} of {len(steps)} steps", file_tail(log))
    return Session(done.meta, steps_out, {k: tuple(v) for k, v in cases.items()}, file_tail(log, 20_000))


__all__ = ["RL_ENGINE_SETTINGS", "Session", "run_session", "EngineFailed", "EngineRefused"]
