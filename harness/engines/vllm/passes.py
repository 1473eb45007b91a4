"""Passes of requests in one start of the pinned vLLM: :mod:`harness.engines.vllm.phase` in a child
process group (killed, whatever happens, when it ends), its result lines read back. The invariance
kind runs its groups through it (:mod:`harness.kinds.invariance.run`), and the pinned vLLM's sampler its
draws (:mod:`harness.engines.vllm.sampler`). A configuration the engine refuses comes back as a
``refused`` result with vLLM's own reason, a crash as ``error`` with the log's tail — never as an
exception.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.api import Output, Sampling
from harness.engines.launch import ledger
from harness.engines.launch.procs import Exited, engine_env, run_engine
from harness.engines.launch.worker_lines import Lines, WorkerFailed, check_lines, read_lines
from harness.engines.launch.worker_run import output_from_fields
from harness.engines.vllm.runner import root_cause
from harness.models import ModelRef
from harness.teacher import scored_output


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a pass: its prompt, and what it asks beyond the greedy defaults."""

    key: str
    prompt_ids: tuple[int, ...]
    skip_reading: bool = True
    sampling: Mapping[str, Any] | None = None
    """Overrides of the greedy defaults (``temperature``, ``top_p``, ``top_k``, ``seed``, ``max_tokens``)."""
    harness_kv: Mapping[str, Any] | None = None
    """The KV connector's tags (case, lane, capture, passive)."""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "prompt_ids": list(self.prompt_ids),
                             "skip_reading": self.skip_reading}
        if self.sampling:
            d["sampling"] = dict(self.sampling)
        if self.harness_kv is not None:
            d["harness_kv"] = dict(self.harness_kv)
        return d


@dataclass(frozen=True, slots=True)
class Pass:
    name: str
    requests: tuple[Request, ...]
    mode: str = "together"
    """``together``: one generate call; ``alone``: one call per request."""
    reset_prefix_cache: bool = False
    score_own: bool = False
    """Rescore every generation of the pass by prefill."""
    score_from: tuple[str, str] | None = None
    """(group, pass) whose generations this pass rescores by prefill (filled in when they exist)."""

    def to_json(self, score: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "reset_prefix_cache": self.reset_prefix_cache,
                "score_own": self.score_own, "requests": [r.to_json() for r in self.requests],
                **({"score": list(score)} if score else {})}


@dataclass(frozen=True, slots=True)
class Group:
    """One engine start."""

    key: str
    settings: Mapping[str, Any]
    """``vllm.LLM`` kwargs (for the server: its command-line arguments' names)."""
    passes: tuple[Pass, ...] = ()
    serves: tuple[str, ...] = ()
    """The variants (and ``rl``) this engine produces outputs for."""
    levels: tuple[int, ...] = ()
    """The server's concurrencies, in order."""


Status = Literal["ok", "refused", "error", "not run"]


@dataclass(frozen=True, slots=True, eq=False)
class GroupResult:
    """What one engine start produced."""

    key: str
    settings: Mapping[str, Any]
    status: Status
    reason: str = ""
    log_tail: str = ""
    version: str = ""
    timings: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, Mapping[str, Output]] = field(default_factory=dict)
    """pass -> request key -> generation."""
    cached: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    """pass -> request key -> ``num_cached_tokens`` (prefix-cache or connector hits)."""
    scores: Mapping[str, Mapping[str, Output]] = field(default_factory=dict)
    """pass -> request key -> prefill score of a sequence."""
    counters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """pass -> the change of vLLM's counters over it (preemptions, speculative drafts ...)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def output(self, pass_name: str, key: str) -> Output:
        got = self.outputs.get(pass_name, {}).get(key)
        return got if got is not None else Output(key, (), error=f"{self.key} engine: no result for "
                                                            f"{key} in pass {pass_name}")


def output_from_line(d: Mapping[str, Any]) -> Output:
    """A worker's ``case`` line as an :class:`Output`."""
    return output_from_fields(str(d.get("key", d.get("id", ""))), d)


def parse_result(key: str, settings: Mapping[str, Any], got: Lines, exited: Exited, log: str,
                 doing: str = "it ran its passes") -> GroupResult:
    """A phase's RESULT.jsonl (+ how its process ended, and its log) as a :class:`GroupResult`."""
    try:
        done = check_lines(got, f"the {key} engine", exited, doing=doing, log=log, diagnose=root_cause)
    except WorkerFailed as e:
        status: Status = "error" if e.status == "error" else "refused"
        return GroupResult(key, settings, status, e.reason, log[-4000:])
    outputs: dict[str, dict[str, Output]] = {}
    cached: dict[str, dict[str, int | None]] = {}
    scores: dict[str, dict[str, Output]] = {}
    counters: dict[str, dict[str, Any]] = {}
    head = done.meta
    for d in done.body:
        kind, p = d.get("kind"), str(d.get("pass", ""))
        if kind == "case":
            outputs.setdefault(p, {})[d["key"]] = output_from_line(d)
            cached.setdefault(p, {})[d["key"]] = d.get("num_cached_tokens")
        elif kind == "score":
            scores.setdefault(p, {})[d["key"]] = scored_output(d["key"], d["token_ids"], d["top_ids"],
                                                               d["top_logprobs"], d["chosen_logprobs"])
        elif kind == "counters":
            counters[p] = {k: v for k, v in d.items() if k not in ("kind", "pass")}
    return GroupResult(key, settings, "ok", "", "", str(head.get("version", "")),
                       dict(head.get("timings", {})), dict(head), outputs, cached, scores, counters)


def _score_list(p: Pass, done: Mapping[str, GroupResult]) -> list[dict[str, Any]]:
    if p.score_from is None:
        return []
    src = done.get(p.score_from[0])
    if src is None or not src.ok:
        return []
    prompts = {r.key: r.prompt_ids for r in p.requests}
    return [{"key": k, "prompt_ids": list(prompts[k]), "continuation_ids": list(o.token_ids)}
            for k, o in src.outputs.get(p.score_from[1], {}).items() if k in prompts and o.error is None]


def run_vllm_group(g: Group, model: ModelRef, sampling: Sampling, folder: Path,
                   done: Mapping[str, GroupResult], timeout_s: float) -> GroupResult:
    """One engine start running every pass of ``g`` (:mod:`harness.engines.vllm.phase`)."""
    folder.mkdir(parents=True, exist_ok=True)
    req, res, log = (folder / f"{g.key}.{x}" for x in ("request.json", "result.jsonl", "log"))
    req.write_text(json.dumps({"model": model.path, "engine": dict(g.settings),
                               "sampling": sampling.to_json(),
                               "passes": [p.to_json(_score_list(p, done)) for p in g.passes]}, indent=1))
    t0 = time.perf_counter()
    exited = run_engine([sys.executable, "-m", "harness.engines.vllm.phase", str(req), str(res)], log,
                        timeout_s, engine_env(repo_on_path=True), cwd=folder,
                        label=f"vLLM engine {g.key} ({model.name}): {', '.join(g.serves)}")
    r = parse_result(g.key, g.settings, read_lines(res), exited, log.read_text(errors="replace"),
                     f"running the passes {', '.join(p.name for p in g.passes)}")
    ledger.record("invariance-group", model.name, r.timings.get("engine_start_s") if r.ok else None,
                  ok=r.ok, group=g.key, wall_s=time.perf_counter() - t0)
    return r


