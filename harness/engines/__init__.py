"""Engines: one package per engine family, one :class:`~harness.api.Runner` contract, one registry.

* ``hf`` / ``hf:device=cuda,dtype=bfloat16``  transformers (:mod:`harness.engines.hf`)
* ``vllm`` / ``vllm:dtype=bfloat16``           the pinned vLLM, the oracle's own engine
* ``vllm@0.31.0`` / ``vllm@0.31.0:dtype=...``  another vLLM release, in its own venv (.venvs/)
* ``openai:http://127.0.0.1:8000,c=8``         any OpenAI-compatible server
* ``cmd:python my_engine.py {model}``          any program speaking JSON lines
* ``vllm-server`` / ``vllm-server@0.31.0``     a vLLM OpenAI server the harness starts and stops
* ``llamacpp`` / ``llamacpp:gguf=q4_1``         llama.cpp's server (llama-cpp-python), built on first
                                               use, started and stopped by the harness
* ``ct2`` / ``ortgenai`` / ``openvino`` / ``mistralrs``  engines from PyPI in their own venvs, on the
                                               model converted on first use (docs/engines-cpu.md)

Each family is a package beside the machinery they share (:mod:`harness.engines.launch`); a new
engine is a family package that registers a factory in :data:`ENGINES` (see
:mod:`harness.engines.base`) and one import below — a PyPI engine is a spec module and a worker body
in :mod:`harness.engines.pip`, no import at all. Every registered engine runs the conformance kit
(:mod:`harness.engines.conformance`). docs/adding-an-engine.md walks through both.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.api import Runner
from harness.engines import (  # noqa: F401 - they register
    cmd,
    hf,
    llamacpp,
    openai,
    pip,
    vllm,
    vllmcpp,
)
from harness.engines.base import ENGINES, RunnerContext, engine_key, parse_options, split_spec
from harness.models import ModelRef

__all__ = ["ENGINES", "RunnerContext", "describe", "make_runner", "parse_options", "split_spec"]


def make_runner(spec: str, model: ModelRef, ctx: RunnerContext | None = None) -> Runner:
    """The runner for a candidate spec; an unknown name lists the valid ones."""
    name, arg = split_spec(spec)
    factory = ENGINES.find(name) or ENGINES.get(engine_key(name))
    return factory(spec, arg, model, ctx or RunnerContext())


def describe() -> Mapping[str, str]:
    return {e.name: e.help for e in ENGINES.entries()}
