"""Sampling drivers: each engine's own sampler, drawing seeded samples for the sampling gate.

A driver implements :class:`~harness.api.Sampler` for an engine spec, reusing that engine's runner
for everything but the draws (options, model loading, builds, provenance):

* ``vllm`` / ``vllm:<options>``     the pinned vLLM offline: every draw one seeded request, all in
  one engine start through the invariance kind's passes (:mod:`.vllm`)
* ``hf`` / ``hf:<options>``         transformers ``generate(do_sample=True)`` (:mod:`.hf`)
* ``llamacpp`` / ``llamacpp:...``   llama-cpp-python's ``Llama.generate`` — the loop its
  ``create_completion`` and server run — in the engine's own venv (:mod:`.llamacpp`)
* ``openai:<url>``                  any OpenAI-compatible server taking token-id prompts (:mod:`.openai`)

A new driver is one module registering a factory in :data:`~.base.SAMPLERS` and one import below.
"""

from __future__ import annotations

from harness.api import EngineRefused, Sampler
from harness.engines import RunnerContext, split_spec
from harness.engines.base import engine_key
from harness.models import ModelRef
from harness.sampling.engines import hf, llamacpp, openai, vllm  # noqa: F401 - they register
from harness.sampling.engines.base import SAMPLERS


def make_sampler(spec: str, model: ModelRef, ctx: RunnerContext | None = None) -> Sampler:
    """The driver for ``spec``; an engine without one is refused, naming the ones there are."""
    name = engine_key(split_spec(spec)[0])
    factory = SAMPLERS.find(name)
    if factory is None:
        raise EngineRefused(
            f"{spec}: no sampling driver for engine {name!r} (there are: {', '.join(SAMPLERS)})"
        )
    return factory(spec, model, ctx or RunnerContext())


__all__ = ["SAMPLERS", "make_sampler"]
