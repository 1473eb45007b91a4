"""Engines installed from PyPI into their own venv, on a model converted from the oracle's weights.

One runner for all of them (CTranslate2, ONNX Runtime GenAI, OpenVINO GenAI, mistral.rs): an
:class:`EngineSpec` says which venv (:mod:`harness.engines.pip.venvs`), which worker file
(:mod:`harness.engines.pip.workers`) and what the engine can return. ``start`` installs the venv on
first use and converts the model on first use (:mod:`harness.engines.launch.converted`); ``run`` writes the
workload to a request file, runs the worker in the engine's venv and reads its result lines, as the
vLLM runner does with ``vllm/worker.py``. Every gate on these engines feeds the oracle's **token
ids** (no tokenizer of the engine's is involved) unless the spec says the engine takes text.

Options (``ct2:threads=1``): the ones the spec lists, passed to the worker; anything else is refused
with the valid names.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.capabilities import Capabilities
from harness.device import device_block
from harness.engines.base import ENGINES, NoTensors, RunnerContext, parse_options
from harness.engines.launch.converted import Converted, ensure_converted
from harness.engines.launch.venvs import STAMP, VenvError, VenvInfo
from harness.engines.launch.worker_run import (
    case_lines,
    full_rows,
    output_from_fields,
    run_worker,
    score_from_line,
)
from harness.engines.pip.venvs import PipEngine, ensure_pip_venv, pip_venv_dir
from harness.models import ModelRef
from harness.workspace import REPO_ROOT, Workspace

WORKERS = Path(__file__).with_name("workers")
TIMEOUT_S = float(os.environ.get("HARNESS_PIP_ENGINE_TIMEOUT_S", "3600"))


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the harness knows about one PyPI engine."""

    key: str
    """The candidate name (``ct2``)."""
    title: str
    """The engine family in records (``CTranslate2``)."""
    venv: PipEngine
    worker: str
    """The worker file in ``harness/engines/pip/workers/``."""
    conversion: str | None
    """One line: which converter makes the engine's format from the model's folder (None: the
    engine loads the model's folder as it is)."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Option name -> what it does (passed to the worker)."""
    convert_options: tuple[str, ...] = ()
    """The options that change the converted model (part of its cache key)."""
    scores: bool = True
    """The worker can score given sequences (teacher forcing)."""
    full_vocab: bool = True
    """Its rows are the whole vocabulary (so top-k to any k, and ``logprobs = "full"``)."""
    greedy_request: Mapping[str, Any] = field(default_factory=dict)
    """The generation settings the worker sets (for the record's ``request``)."""
    left_to_engine: Mapping[str, Any] = field(default_factory=dict)
    """Settings the worker leaves to the engine's defaults -> that default."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment of the worker process (thread pools: no effect on the numbers, only on time)."""
    prompts: Literal["ids", "text"] = "ids"
    """``text``: the engine takes text only; the worker sends the ids' text and reports the ids the
    engine made of it (``served_prompt_ids``), judged by the tokenizer verdict."""
    tokenized_by: str = ""
    """With text prompts: how the worker reads the engine's tokenization."""
    top_logprobs: str = ""
    """Why the engine returns no top-k logprobs (empty: it does)."""


class PipEngineRunner(NoTensors):
    """A PyPI engine in its venv, on the converted model (see module doc)."""

    tensors_why_not = ("a compiled runtime whose Python API returns tokens and logprobs, never its "
                       "per-layer hidden states")

    def __init__(self, spec: EngineSpec, model: ModelRef, options: Mapping[str, str], name: str,
                 run_dir: Path | None = None, repo_root: Path = REPO_ROOT) -> None:
        self.spec = spec
        self.name = name
        self.model = model
        unknown = sorted(set(options) - set(spec.options))
        if unknown:
            valid = ", ".join(f"{k} ({v})" for k, v in spec.options.items()) or "none"
            raise EngineRefused(f"candidate {name!r}: unknown option(s) {', '.join(unknown)}; valid: {valid}")
        self.options = dict(options)
        self.run_dir = run_dir
        self.repo_root = repo_root
        try:
            pip_venv_dir(repo_root, spec.venv)
        except VenvError as e:
            raise EngineRefused(f"candidate {name!r}: {e}") from None
        self.venv: VenvInfo | None = None
        self.converted: Converted | None = None
        self.timings: dict[str, float] = {}
        self.meta: dict[str, Any] = {}
        self.log_path: Path | None = None
        self.k_served: int | None = None
        self.k_asked: int | None = None
        self.served: dict[str, tuple[int, ...]] = {}
        self.asked: list[str] = []
        self.tokenize_errors: dict[str, str] = {}

    def info(self) -> EngineInfo:
        weights = ("float32, converted from the model's safetensors" if self.spec.conversion
                   else "the model's safetensors, loaded as they are")
        settings: dict[str, Any] = {"options": dict(self.options), "prompts": self.spec.prompts,
                                    "weights": weights, "request": dict(self.spec.greedy_request)}
        env: dict[str, Any] = {"conversion_step": self.spec.conversion, "worker_env": dict(self.spec.env)}
        if self.converted is not None:
            env["converted"] = self.converted.to_json()
        if self.venv is not None:
            env["venv"] = {k: v for k, v in self.venv.to_json().items() if k != "path"}
        if self.meta.get("notes"):
            env["notes"] = list(self.meta["notes"])
        version = self.meta.get("engine_version") or self.spec.venv.version
        return EngineInfo(self.name, self.spec.title, f"{self.spec.venv.package} {version}",
                          settings=settings, environment=env)

    def start(self) -> None:
        t0 = time.perf_counter()
        folder = pip_venv_dir(self.repo_root, self.spec.venv)
        if not (folder / STAMP).exists():
            print(f"{self.name}: installing {self.spec.venv.package}=={self.spec.venv.version} into {folder} "
                  f"(minutes, once; log: {folder.name}.install.log beside it)", file=sys.stderr)
        try:
            self.venv = ensure_pip_venv(self.repo_root, self.spec.venv)
        except VenvError as e:
            raise EngineFailed(f"{self.name}: cannot install {self.spec.venv.package}=="
                               f"{self.spec.venv.version}: {e}") from None
        self.timings["venv_ready_s"] = time.perf_counter() - t0
        if self.spec.conversion is None:
            return
        t0 = time.perf_counter()
        conv_opts = {k: v for k, v in self.options.items() if k in self.spec.convert_options}
        self.converted = ensure_converted(Workspace.default().model_cache, self.spec.venv.folder_name,
                                          self.venv.python, WORKERS / self.spec.worker, self.model,
                                          conv_opts, f"{self.name} ({self.spec.conversion})")
        self.timings["converted_ready_s"] = time.perf_counter() - t0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return self._work(cases, sampling, None)[0]

    def _work(self, cases: Sequence[Case], sampling: Sampling, score: dict[str, Any] | None
              ) -> tuple[list[Output], list[Output]]:
        assert self.venv is not None, "start() first"
        folder = self.converted.path if self.converted is not None else Path(self.model.path)
        work = Path(tempfile.mkdtemp(prefix=f"{self.spec.key}-", dir=self.run_dir))
        self.log_path = work / "engine.log"
        request = {
            "model": str(folder), "source": self.model.path, "options": self.options,
            "sampling": sampling.to_json(),
            "cases": [{"id": c.id, "prompt_ids": list(c.prompt_ids)} for c in cases],
            **({"score": score} if score else {}),
            **({"full": {"dir": str(work / "full")}} if sampling.full_vocab and self.spec.full_vocab else {}),
        }
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **self.spec.env}
        done = run_worker([str(self.venv.python), str(WORKERS / self.spec.worker), "run"], request, work,
                          timeout_s=TIMEOUT_S, env=env,
                          label=f"{self.spec.title} {self.name} ({self.model.name}, {len(cases)} cases)",
                          who=f"the {self.spec.title} worker of {self.name}",
                          doing=f"running {len(cases)} cases of {self.model.name}", name=self.name,
                          places=self._places())
        head = self.meta = done.meta
        took = {k: float(v) for k, v in head["timings"].items()}
        if cases:
            self.timings.update(took)
            self.timings["output_tokens"] = float(head["output_tokens"])
        else:  # a scoring-only pass after a generation: its start is not the engine's
            self.timings["score_s"] = took.get("score_s", 0.0)
        outs, scores = self._outputs(cases, done.body, sampling)
        return outs, scores

    def _outputs(self, cases: Sequence[Case], lines: list[dict[str, Any]], sampling: Sampling
                 ) -> tuple[list[Output], list[Output]]:
        outs = []
        for c, d, failed in case_lines(cases, lines, self.spec.title, self.served):
            if d.get("tokenize_error"):
                self.tokenize_errors[c.id] = str(d["tokenize_error"])
            if failed is not None:
                outs.append(failed)
                continue
            full, why = full_rows(d)
            o = output_from_fields(c.id, d, error=why, full=full)
            if not o.text:
                o = Output(o.case_id, o.token_ids, self.model.decode(o.token_ids), o.top_ids, o.top_logprobs,
                           o.chosen_logprobs, o.finish_reason, o.error, o.full_logprobs)
            if o.top_ids is not None:
                self.k_served = int(o.top_ids.shape[1])
            outs.append(o)
        self.k_asked = sampling.logprobs
        self.asked = [c.id for c in cases]
        scores = [score_from_line(d, f"{self.spec.title}: ") for d in lines if d.get("kind") == "score"]
        return outs, scores

    def _places(self) -> dict[str, str]:
        """This machine's folders, as a failure's text names them (see :func:`without_paths`)."""
        places = {str(WORKERS): "harness/engines/pip/workers", self.model.path: self.model.name}
        if self.venv is not None:
            places[str(self.venv.path.parent)] = ".venvs"
        if self.converted is not None:
            places[str(self.converted.path.parent)] = "converted"
        if self.run_dir is not None:
            places[str(self.run_dir)] = "<run folder>"
        return places

    def facts(self) -> RunFacts:
        notes = tuple(self.meta.get("notes", ()))
        text = self.spec.prompts == "text"
        missing = {"top_logprobs": self.spec.top_logprobs} if self.spec.top_logprobs else {}
        lost = {c: self.tokenize_errors.get(c, "the engine returned no tokenization")
                for c in self.asked if c not in self.served}
        caps = Capabilities(prompts=self.spec.prompts, logprobs_served=self.k_served,
                            logprobs_asked=self.k_asked, top_logprobs=not missing, reasons=missing,
                            notes=notes, request=dict(self.spec.greedy_request),
                            left_to_server=dict(self.spec.left_to_engine),
                            tokenized_by=self.spec.tokenized_by if text else None,
                            served_prompt_ids=dict(self.served) if text else {},
                            tokenize_errors=lost if text else {})
        return RunFacts(timings=dict(self.timings), capabilities=caps,
                        device=device_block("cpu") if self.meta else {})

    def close(self) -> None:
        """The worker has exited by the time ``run`` returns."""


class ScoringPipEngineRunner(PipEngineRunner):
    """A PyPI engine whose worker also scores given sequences (the :class:`~harness.abilities.Scorer`
    ability), in the same engine start."""

    def run_and_score(self, cases: Sequence[Case], sampling: Sampling,
                      continuations: Mapping[str, Sequence[int]] | None, k: int
                      ) -> tuple[list[Output], list[Output]]:
        if continuations is None:  # its own generations: generate first, then score them
            outs = self.run(cases, sampling)
            continuations = {o.case_id: o.token_ids for o in outs if o.error is None}
            _, scores = self._work([], sampling, self._score_req(cases, continuations, k))
            return outs, scores
        return self._work(cases, sampling, self._score_req(cases, continuations, k))

    @staticmethod
    def _score_req(cases: Sequence[Case], continuations: Mapping[str, Sequence[int]], k: int
                   ) -> dict[str, Any]:
        return {"logprobs": k, "sequences": [
            {"id": c.id, "prompt_ids": list(c.prompt_ids), "continuation_ids": list(continuations[c.id])}
            for c in cases if c.id in continuations and continuations[c.id]]}


def register_pip_engine(spec: EngineSpec, help: str) -> None:  # noqa: A002 - the registry's word
    """The one registration of a PyPI engine: candidate ``spec.key`` (options as ``spec.options``
    lists them), with ``help`` for ``harness engines``."""

    def factory(name: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> PipEngineRunner:
        return make_pip_runner(spec, model, parse_options(arg, name), ctx.name or name, ctx.run_dir)

    ENGINES.register(spec.key, help=help)(factory)


def make_pip_runner(spec: EngineSpec, model: ModelRef, options: Mapping[str, str], name: str,
                    run_dir: Path | None) -> PipEngineRunner:
    cls = ScoringPipEngineRunner if spec.scores else PipEngineRunner
    return cls(spec, model, options, name, run_dir=run_dir)
