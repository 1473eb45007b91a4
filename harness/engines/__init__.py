"""Engines: one module per engine, one :class:`~harness.api.Runner` contract, one registry.

A candidate spec is ``NAME``, ``NAME:OPTIONS`` or ``NAME:ARGUMENT``:

* ``hf`` / ``hf:device=cuda,dtype=bfloat16``  transformers
* ``vllm`` / ``vllm:dtype=bfloat16``           the pinned vLLM (the oracle's own engine)
* ``vllm@0.31.0`` / ``vllm@0.31.0:dtype=...``  another vLLM release, in its own venv (.venvs/)
* ``openai:http://127.0.0.1:8000,c=8``         any OpenAI-compatible server (harness.engines.openai)
* ``cmd:python my_engine.py {model}``          any program speaking JSON lines (harness.engines.cmd)
* ``vllm-server`` / ``vllm-server@0.31.0``     a vLLM OpenAI server the harness starts and stops
* ``llamacpp`` / ``llamacpp:gguf=q4_1``         llama.cpp's server (llama-cpp-python), built on first
                                               use, started and stopped by the harness

A new engine registers a factory in :data:`RUNNERS`; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api import EngineRefused, Runner
from harness.models import ModelRef
from harness.registry import unknown


@dataclass(frozen=True, slots=True)
class RunnerContext:
    """What a factory may need beyond the spec: where the run may write scratch files."""

    run_dir: Path | None = None
    concurrency: int | None = None
    """Requests in flight (``harness gate --concurrency``); None: the engine's default."""


Factory = Callable[[str, str | None, ModelRef, RunnerContext], Runner]


def parse_options(arg: str | None, spec: str) -> dict[str, str]:
    """``a=1,b=x`` -> {"a": "1", "b": "x"}; anything else is a clear error naming the spec."""
    if not arg:
        return {}
    out = {}
    for part in arg.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise EngineRefused(f"candidate {spec!r}: option {part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _hf(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.hf import HFRunner

    return HFRunner(model, parse_options(arg, spec), name=spec)


def _vllm(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.vllm import VLLMRunner

    return VLLMRunner(model, parse_options(arg, spec), name=spec, run_dir=ctx.run_dir,
                      concurrency=ctx.concurrency)


def _vllm_release(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.vllm_release import VLLMReleaseRunner

    version = split_spec(spec)[0].partition("@")[2]
    return VLLMReleaseRunner(model, version, parse_options(arg, spec), name=spec, run_dir=ctx.run_dir,
                             concurrency=ctx.concurrency)


def _openai(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.openai import OpenAIRunner, parse_openai_spec

    return OpenAIRunner(parse_openai_spec(spec, arg, ctx.concurrency or 1), name=spec, model=model)


def _cmd(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.cmd import CmdRunner

    return CmdRunner(arg or "", model, name=spec, run_dir=ctx.run_dir)


def _vllm_server(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.vllm_release import release_python
    from harness.engines.vllm_server import VLLMServerRunner

    version = split_spec(spec)[0].partition("@")[2]
    python = (lambda: str(release_python(version).python)) if version else None
    return VLLMServerRunner(model, parse_options(arg, spec), name=spec, python=python,
                            run_dir=ctx.run_dir, concurrency=ctx.concurrency or 1)


def _llamacpp(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner:
    from harness.engines.llamacpp import LlamaCppRunner

    return LlamaCppRunner(model, parse_options(arg, spec), name=spec, run_dir=ctx.run_dir,
                          concurrency=ctx.concurrency or 1)


RUNNERS: dict[str, Factory] = {"hf": _hf, "vllm": _vllm, "vllm@": _vllm_release, "openai": _openai,
                               "cmd": _cmd, "vllm-server": _vllm_server, "vllm-server@": _vllm_server,
                               "llamacpp": _llamacpp}
"""Engine name -> factory(spec, argument, model, context)."""

DESCRIPTIONS: dict[str, str] = {
    "hf": "Hugging Face transformers (hf:device=cuda,dtype=bfloat16)",
    "vllm": "the pinned vLLM as a candidate (vllm:dtype=bfloat16)",
    "vllm@": "another vLLM release in its own venv, installed on first use (vllm@0.31.0)",
    "openai": "an OpenAI-compatible server (openai:http://127.0.0.1:8000,c=8,key_env=MY_KEY)",
    "cmd": "a program reading workload JSONL, writing one JSON line per case (cmd:'./engine {model}')",
    "vllm-server": "a vLLM server the harness starts and stops (vllm-server:c=8, vllm-server@0.31.0)",
    "llamacpp": "llama.cpp's server on the model's weights, built on first use (llamacpp:gguf=f32|f16|q4_1)",
}


def split_spec(spec: str) -> tuple[str, str | None]:
    name, sep, arg = spec.partition(":")
    return name, (arg if sep else None)


def make_runner(spec: str, model: ModelRef, ctx: RunnerContext | None = None) -> Runner:
    """The runner for a candidate spec; an unknown name lists the valid ones."""
    name, arg = split_spec(spec)
    key = name.split("@", 1)[0] + ("@" if "@" in name else "")
    factory = RUNNERS.get(name) or RUNNERS.get(key)
    if factory is None:
        raise unknown("candidate", name, RUNNERS)
    return factory(spec, arg, model, ctx or RunnerContext())


def describe() -> Mapping[str, Any]:
    return dict(DESCRIPTIONS)
