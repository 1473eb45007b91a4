"""The engines of an invariance run: each group of the plan in one engine start, in plan order.

vLLM groups run :mod:`harness.engines.vllm.phase` in one engine start each
(:mod:`harness.engines.vllm.passes`, which the pinned vLLM's sampler shares); the server group
starts one OpenAI server (:class:`VLLMServer`) and replays the prompts at each concurrency through
:class:`OpenAIRunner`; the trainer (``hf``) scores the rollouts' tokens through its
:class:`~harness.abilities.TensorSource` ability. A configuration the engine refuses comes back as a
``refused`` group with vLLM's own reason, a crash as ``error`` with the log's tail — never as an
exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.abilities import TensorSource
from harness.api import Case, EngineFailed, EngineRefused, Output, Sampling
from harness.engines.vllm.passes import GroupResult, Status
from harness.engines.vllm.passes import output_from_line as output_from_line
from harness.engines.vllm.passes import parse_result as parse_result
from harness.engines.vllm.passes import run_vllm_group as run_vllm_group
from harness.kinds.invariance.plan import Group, Plan
from harness.models import ModelRef
from harness.teacher import scored_output


def run_server_group(g: Group, model: ModelRef, cases: Sequence[Case], sampling: Sampling,
                     folder: Path) -> GroupResult:
    """One OpenAI server; the same prompts at each concurrency of ``g.levels``, in order."""
    from harness.engines.openai import OpenAIOptions, OpenAIRunner
    from harness.engines.vllm.server import VLLMServer, server_args

    folder.mkdir(parents=True, exist_ok=True)
    server = VLLMServer(model, g.settings, log_path=folder / "server.log")
    outputs: dict[str, dict[str, Output]] = {}
    timings: dict[str, float] = {}
    version = ""
    try:
        server.start()
        timings["engine_start_s"] = float(server.start_s or 0.0)
        for c in g.levels:
            client = OpenAIRunner(OpenAIOptions(server.base_url + "/v1", int(c)), name=f"c{c}",
                                  watch=server.exited)
            client.start()
            t0 = time.perf_counter()
            outs = client.run(cases, sampling)
            timings[f"pass_c{c}_s"] = time.perf_counter() - t0
            outputs[f"c{c}"] = {o.case_id: o for o in outs}
            version = client.info().version
    except (EngineFailed, EngineRefused) as e:
        from harness.engines.vllm.runner import root_cause

        log = server.log_tail(200_000)
        cause = root_cause(log)
        refused = isinstance(e, EngineRefused) or (cause is not None and cause[0] == "refused")
        status: Status = "refused" if refused else "error"
        return GroupResult(g.key, g.settings, status, cause[1] if cause else str(e), log[-4000:],
                           timings=timings)
    finally:
        server.stop()
    return GroupResult(g.key, g.settings, "ok", version=version, timings=timings, outputs=outputs,
                       meta={"server_args": server_args(g.settings)})  # the flags, not the model's path


BUSY_MEMORY = "less than desired CPU memory utilization"
"""vLLM on CPU refuses to start while other processes hold the memory its fraction asks for: a
busy machine, not a property of the configuration; the start is tried again after a pause."""
BUSY_RETRIES, BUSY_WAIT_S = 2, 60.0


def run_plan(plan: Plan, model: ModelRef, sampling: Sampling, folder: Path, timeout_s: float,
             progress: Callable[[str], None] | None = None) -> dict[str, GroupResult]:
    """Every group of the plan, in order; one engine start each (a start that met a busy machine
    is tried again, and its attempts are counted in its timings)."""
    done: dict[str, GroupResult] = {}
    for g in plan.groups:
        if progress:
            progress(f"engine {g.key}: {', '.join(g.serves)}")
        t0 = time.perf_counter()
        for attempt in range(1 + BUSY_RETRIES):
            if g.levels:
                r = run_server_group(g, model, plan.cases, sampling, folder / g.key)
            else:
                r = run_vllm_group(g, model, sampling, folder / g.key, done, timeout_s)
            if r.ok or BUSY_MEMORY not in r.reason or attempt == BUSY_RETRIES:
                break
            if progress:
                progress(f"engine {g.key}: the machine's memory is busy ({r.reason[:100]}); again in "
                         f"{BUSY_WAIT_S:.0f} s")
            time.sleep(BUSY_WAIT_S)
        done[g.key] = GroupResult(**{**_fields(r), "timings": {
            **r.timings, "wall_s": time.perf_counter() - t0, "attempts": float(attempt + 1)}})
    return done


def _fields(r: GroupResult) -> dict[str, Any]:
    return {f: getattr(r, f) for f in GroupResult.__dataclass_fields__}


@dataclass(frozen=True, slots=True, eq=False)
class TrainerResult:
    spec: str
    status: Status
    reason: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)
    scores: Mapping[str, Output] = field(default_factory=dict)
    """rollout key -> the trainer's logprobs of the rollout's tokens, in the rollout's mode."""
    timings: Mapping[str, float] = field(default_factory=dict)


def run_trainer(spec: str, model: ModelRef, rollouts: Mapping[str, tuple[Case, Output]],
                to_logprobs: Callable[[np.ndarray], np.ndarray], k: int, folder: Path) -> TrainerResult:
    """Teacher forcing: the trainer's logits at every sampled token (one forward pass over prompt +
    rollout), turned into logprobs by ``to_logprobs`` (the rollout engine's logprob mode)."""
    from harness.engines import RunnerContext, make_runner

    folder.mkdir(parents=True, exist_ok=True)
    runner = make_runner(spec, model, RunnerContext(run_dir=folder))
    if not isinstance(runner, TensorSource) or not runner.tensor_ability().continuation:
        why = (runner.tensor_ability().reason("continuation") if isinstance(runner, TensorSource)
               else "no TensorSource ability")
        return TrainerResult(spec, "refused", f"the trainer {spec!r} cannot return logits ({why}): it cannot "
                                              f"score in the rollout's logprob mode")
    t0 = time.perf_counter()
    try:
        runner.start()
        cases = [Case(key, case.prompt_ids) for key, (case, out) in rollouts.items() if out.error is None
                 and out.token_ids]
        conts = {key: rollouts[key][1].token_ids for key in (c.id for c in cases)}
        t1 = time.perf_counter()
        tensors = runner.capture_tensors(cases, conts)
        scores = {}
        for key, cont in conts.items():
            lp = to_logprobs(np.asarray(tensors[key]["logits"], np.float32))
            scores[key] = _score_of(key, cont, lp, k)
        info = runner.info().to_json()
    except (EngineRefused, EngineFailed) as e:
        return TrainerResult(spec, "refused" if isinstance(e, EngineRefused) else "error", str(e))
    finally:
        runner.close()
    return TrainerResult(spec, "ok", "", info, scores, {"trainer_score_s": time.perf_counter() - t1,
                                                      "trainer_wall_s": time.perf_counter() - t0})


def _score_of(key: str, cont: Sequence[int], lp: np.ndarray, k: int) -> Output:
    n = len(cont)
    lp = lp[:n]
    kk = lp.shape[1] if k <= 0 or k >= lp.shape[1] else k
    order = np.argsort(-lp, axis=1, kind="stable")[:, :kk]
    top = np.take_along_axis(lp, order, axis=1)
    chosen = lp[np.arange(n), np.asarray(cont, np.int64)]
    return scored_output(key, cont, order.astype(np.int32), top.astype(np.float32), chosen.astype(np.float32))
