"""The speculative-decoding gate's two engine starts and its draw plan.

1. the **reference**: the pinned vLLM without speculation (and ``max_logprobs=-1``): every case
   greedy (the greedy reference), and for each case tagged ``sampled_tag`` the whole next-token
   distribution at each position of its greedy path (``rows``);
2. the **candidate**: the same settings with the suite's ``speculative_config`` (and a planted
   control, when one is asked for): every case greedy, then per (temperature, concurrency) the
   planned draws, ``concurrency`` per ``generate`` call.

Between them the host plans: the ``sampled_cases`` cases whose judged positions are most often
drafted with the greedy token (positions where drafts are accepted), and per case the draws that
make each test detect ``target_tv`` at Holm's first level with ``power`` (capped at ``max_draws``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Case, EngineFailed, EngineRefused
from harness.engines.launch.procs import Exited, engine_env, run_engine
from harness.engines.launch.worker_lines import WorkerFailed, check_lines, read_lines
from harness.engines.vllm.runner import root_cause
from harness.kinds.sampling import gof
from harness.kinds.spec.drafts import Drafter, schedule
from harness.kinds.spec.judge import MAX_CELLS, MIN_EXPECTED, Test, reference
from harness.kinds.spec.settings import SpecSettings
from harness.models import ModelRef

TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True, eq=False)
class Started:
    """What one engine start produced (or why it did not)."""

    status: str
    reason: str = ""
    log_tail: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    body: tuple[dict[str, Any], ...] = ()

    def lines(self, kind: str, pass_name: str | None = None) -> list[dict[str, Any]]:
        return [
            d
            for d in self.body
            if d.get("kind") == kind and (pass_name is None or d.get("pass") == pass_name)
        ]

    def counters(self, pass_name: str) -> dict[str, Any]:
        got = self.lines("counters", pass_name)
        return {k: v for k, v in got[0].items() if k not in ("kind", "pass")} if got else {}


WORKERS = {"vllm": "harness.engines.vllm.spec_phase", "hf": "harness.engines.hf.spec_worker"}
"""The engine child of each family the gate drives (all speak the same passes and lines); llama.cpp's
runs in its own venv: :func:`command`."""


def command(family: str, model: ModelRef, folder: Path) -> tuple[list[str], dict[str, Any]]:
    """(argv before REQUEST RESULT, what the request adds): llama.cpp's worker runs with the
    llama-cpp-python venv's python on an F32 GGUF of the model (the reference's weights bit for
    bit), both made on first use."""
    if family != "llamacpp":
        return [sys.executable, "-m", WORKERS[family]], {}
    from harness.engines.llamacpp.runner import LlamaCppRunner

    venv, gguf = LlamaCppRunner(model, {}, run_dir=folder).prepare()
    worker = Path(__file__).parents[2] / "engines" / "llamacpp" / "spec_worker.py"
    adds = {"gguf": str(gguf.path), "n_ctx": 512, "n_threads": 1}  # a tiny model waits on a second thread
    return [str(venv.python), str(worker)], adds


def start(
    key: str,
    model: ModelRef,
    engine: Mapping[str, Any],
    passes: Sequence[Mapping[str, Any]],
    folder: Path,
    control: str | None = None,
    family: str = "vllm",
    speculative: Mapping[str, Any] | None = None,
    repair: str | None = None,
) -> Started:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    req, res, log = (folder / f"{key}.{x}" for x in ("request.json", "result.jsonl", "log"))
    try:
        argv, adds = command(family, model, folder)
    except (EngineRefused, EngineFailed) as e:
        return Started("refused" if isinstance(e, EngineRefused) else "error", str(e))
    req.write_text(
        json.dumps(
            {
                **adds,
                "model": model.path,
                "engine": dict(engine),
                "control": control,
                "repair": repair,
                "speculative": dict(speculative) if speculative else None,
                "passes": list(passes),
            }
        )
    )
    exited: Exited = run_engine(
        [*argv, str(req), str(res)],
        log,
        TIMEOUT_S,
        engine_env(repo_on_path=True),
        cwd=folder,
        label=f"{family} {key} ({model.name})",
    )
    text = log.read_text(errors="replace")
    try:
        done = check_lines(
            read_lines(res),
            f"the {key} engine",
            exited,
            doing="it ran its passes",
            log=text,
            diagnose=root_cause,
        )
    except WorkerFailed as e:
        return Started("refused" if e.status != "error" else "error", e.reason, text[-4000:])
    return Started("ok", meta=dict(done.meta), body=tuple(done.body))


def reference_passes(
    cases: Sequence[Case], sampled: Sequence[Case], s: SpecSettings, max_tokens: int, logprobs: int
) -> list[dict[str, Any]]:
    greedy = {
        "name": "greedy",
        "kind": "greedy",
        "max_tokens": max_tokens,
        "logprobs": logprobs,
        "requests": [{"key": c.id, "prompt_ids": list(c.prompt_ids)} for c in cases],
    }
    rows = {
        "name": "rows",
        "kind": "rows",
        "max_tokens": max(s.positions) + 1,
        "requests": [{"key": c.id, "prompt_ids": list(c.prompt_ids)} for c in sampled],
    }
    return [greedy, rows] if sampled else [greedy]


def load_rows(ref: Started) -> dict[str, tuple[tuple[int, ...], np.ndarray]]:
    """case -> (greedy path, [steps, V] raw logprobs along it)."""
    return {d["key"]: (tuple(d["token_ids"]), np.load(d["path"])) for d in ref.lines("rows", "rows")}


def choose(
    sampled: Sequence[Case],
    rows: Mapping[str, tuple[tuple[int, ...], np.ndarray]],
    s: SpecSettings,
    propose: Drafter | None,
) -> list[Case]:
    """The ``sampled_cases`` cases whose judged positions are most often drafted with the greedy
    token (ties: the suite's order); without a replayed drafter (a draft model, transformers'
    lookup), those whose draws most often follow the greedy path to the last judged position (at
    the lowest temperature), so that their tests judge draws at all."""

    def hits(c: Case) -> float:
        if c.id not in rows:
            return 0
        if propose is None:
            path, lp = rows[c.id]
            return path_probability(lp, path[: max(s.positions)], min(s.temperatures))
        path = rows[c.id][0]
        slots = schedule(c.prompt_ids, path, propose)
        return sum(
            1
            for j in s.positions
            if j < len(slots) and slots[j].role == "draft" and slots[j].draft == path[j]
        )

    ranked = sorted(sampled, key=lambda c: -hits(c))
    return [c for c in ranked if c.id in rows][: s.sampled_cases]


def tests_for(
    cases: Sequence[Case],
    rows: Mapping[str, tuple[tuple[int, ...], np.ndarray]],
    s: SpecSettings,
    propose: Drafter | None,
) -> list[Test]:
    out = []
    for c in cases:
        path, lp = rows[c.id]
        slots = schedule(c.prompt_ids, path, propose) if propose is not None else None
        for temp in s.temperatures:
            for conc in s.concurrency:
                for j in s.positions:
                    if j >= len(path):
                        continue
                    out.append(
                        Test(
                            f"{c.id}@{j}/t{temp:g}/c{conc}",
                            c.id,
                            j,
                            temp,
                            conc,
                            tuple(path[:j]),
                            reference(lp[j], temp),
                            slots[j] if slots is not None else None,
                        )
                    )
    return out


def path_probability(rows: np.ndarray, path: Sequence[int], temperature: float) -> float:
    return float(np.prod([reference(rows[i], temperature)[t] for i, t in enumerate(path)])) if path else 1.0


def plan_draws(
    tests: Sequence[Test], rows: Mapping[str, tuple[tuple[int, ...], np.ndarray]], s: SpecSettings
) -> dict[tuple[str, float, int], int]:
    """(case, temperature, concurrency) -> draws: enough for every test of the case there to judge
    the draws :func:`~harness.kinds.sampling.gof.draws_for` asks (a 10 % margin over the path's
    chance), ``max_draws`` at most."""
    level = s.alpha / max(1, len(tests))
    out: dict[tuple[str, float, int], int] = {}
    for t in tests:
        need = gof.draws_for(
            t.q,
            s.target_tv,
            level,
            s.power,
            cap=10 * s.max_draws,
            min_expected=MIN_EXPECTED,
            max_cells=MAX_CELLS,
        )
        p = max(path_probability(rows[t.case_id][1], t.path, t.temperature), 1e-9)
        n = min(s.max_draws, math.ceil(1.1 * need / p))
        key = (t.case_id, t.temperature, t.concurrency)
        out[key] = max(out.get(key, 0), n)
    return out


def draw_passes(
    cases: Sequence[Case], plan: Mapping[tuple[str, float, int], int], s: SpecSettings
) -> list[dict[str, Any]]:
    out = []
    for ti, temp in enumerate(s.temperatures):
        for ci, conc in enumerate(s.concurrency):
            reqs = [
                {
                    "key": c.id,
                    "prompt_ids": list(c.prompt_ids),
                    "n": plan[(c.id, temp, conc)],
                    "seed": s.seed + 1_000_003 * (ti * len(s.concurrency) + ci) + 10_007 * k,
                }
                for k, c in enumerate(cases)
                if (c.id, temp, conc) in plan
            ]
            out.append(
                {
                    "name": f"t{temp:g}/c{conc}",
                    "kind": "draws",
                    "concurrency": conc,
                    "temperature": temp,
                    "max_tokens": max(s.positions) + 1,
                    "requests": reqs,
                }
            )
    return out


def draws_of(cand: Started) -> dict[tuple[str, str], np.ndarray]:
    """(pass, case) -> [n, width] drawn tokens (-1 past a draw that stopped early)."""
    out = {}
    for d in cand.lines("draws"):
        toks = d["tokens"]
        width = max((len(x) for x in toks), default=0)
        arr = np.full((len(toks), width), -1, np.int64)
        for i, x in enumerate(toks):
            arr[i, : len(x)] = x
        out[(d["pass"], d["key"])] = arr
    return out


def wall(t0: float) -> float:
    return time.perf_counter() - t0
